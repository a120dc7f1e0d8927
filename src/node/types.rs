//! The JS-facing object shapes. Their `///` docs become the JSDoc of `index.d.ts`.
//!
//! Input objects (options, messages) arrive from the JS wrapper as JSON text and are read here
//! with serde, so every field is checked with an error that names it; the `#[napi(object)]`
//! attribute on them only describes their TypeScript shape. Output objects are built here and
//! converted by napi.
// Input types here only describe TypeScript shapes (the data arrives as JSON): unused in Rust.
#![allow(dead_code)]
use napi_derive::napi;
use serde::Deserialize;
use serde_json::Value;

/// Prompt-cache settings of a session.
#[napi(object, object_to_js = false)]
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptCacheOptions {
    /// Most cached prompt prefixes kept (default 16).
    pub max_entries: Option<f64>,
    /// An entry unused for this many milliseconds is dropped (default 300000).
    pub ttl_ms: Option<f64>,
    /// Prompts shorter than this many tokens are not cached (default 8).
    pub min_cacheable_tokens: Option<f64>,
    /// Upper bound on the bytes of cached KV state (default: a quarter of what MLX may still allocate after the weights load, at least 64 MiB).
    pub max_bytes: Option<f64>,
    /// Also keep entries on disk in this directory (created if missing), so that another
    /// session or process (a restarted server, the next script run) sharing a prompt prefix,
    /// such as a long system prompt, starts from it. One safetensors file per entry, written in
    /// the background after the reply (`close()` the session before the process exits so that
    /// its last entries get there; an interrupted write leaves no partial entry); only the same
    /// model (same files, dtype and device) reads them. A directory that cannot be created
    /// rejects the load.
    pub dir: Option<String>,
    /// Upper bound on the bytes of entries in `dir` (all models' together), least recently used
    /// deleted first (default 4 GiB).
    pub disk_max_bytes: Option<f64>,
}

/// Progress of `Session.load`.
#[napi(object)]
#[derive(Debug, Clone)]
pub struct LoadProgress {
    /// What is happening: `'load'` (reading weights and building the model), `'ready'`.
    pub stage: String,
    /// Units done in this stage.
    pub done: f64,
    /// Units in this stage.
    pub total: f64,
}

/// Options of `Session.load`.
#[napi(object, object_to_js = false)]
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadOptions {
    /// Where to run: `'gpu'` (Metal on macOS, CUDA on Linux) or `'cpu'`. Default: the GPU when
    /// this build of MLX has one, else the CPU.
    #[napi(ts_type = "'gpu' | 'cpu'")]
    pub device: Option<String>,
    /// Compute dtype of float weights: `'float32'`, `'bfloat16'` or `'float16'`. Default:
    /// float32 on the CPU; on the GPU the half type config.json declares (`torch_dtype`),
    /// else the checkpoint's stored dtypes.
    #[napi(ts_type = "'float32' | 'bfloat16' | 'float16'")]
    pub dtype: Option<String>,
    /// Settings of the automatic prompt cache.
    pub prompt_cache: Option<PromptCacheOptions>,
    /// The most requests that decode together in one batch (default 16); more wait their turn.
    /// Concurrent `generate()`/`stream()` calls on one session are batched with no change to
    /// your code (models with sliding-window or recurrent caches run them one at a time).
    pub max_batch: Option<u32>,
    /// Bytes of cache the requests decoding together may set aside (each its prompt and
    /// `maxTokens`): one that does not fit waits, one that never can is rejected with
    /// `OUT_OF_MEMORY`. Default: 90 % of what MLX may still allocate after loading.
    pub kv_budget_bytes: Option<f64>,
    /// A draft model (directory or repo id with the same tokenizer) loaded with the model: every
    /// call then decodes speculatively (alone, outside the batch) unless it sets
    /// `numDraftTokens: 0`. A different vocabulary rejects with `INVALID_ARGUMENT`.
    pub draft_model: Option<String>,
    /// The most tokens a sequence may hold, prompt and reply together: a generation that
    /// reaches it ends with `finishReason: 'length'`; a prompt that leaves no room rejects with
    /// `INVALID_ARGUMENT`. Default: config.json's `max_position_embeddings` (none with dynamic
    /// rope scaling). Calls with a `maxKvSize` at most this long are not limited.
    pub context_length: Option<f64>,
    /// On the CPU: round each 32-value block of a decode step's activations to 8 bits and
    /// multiply them with 4- and 8-bit weights in integer dot products, as llama.cpp does
    /// (faster decode on x86-64 CPUs with AVX-512 VNNI; elsewhere nothing changes). Default
    /// false: it moves logprobs away from mlx-lm's.
    pub int8_activations: Option<bool>,
    /// Called as loading advances (on the JS thread).
    #[napi(ts_type = "(progress: LoadProgress) => void")]
    #[serde(skip)]
    pub on_progress: Option<Value>,
    /// Aborts the load: the promise rejects with code `'ABORTED'`.
    #[napi(ts_type = "AbortSignal")]
    #[serde(skip)]
    pub signal: Option<Value>,
}

/// A function the model may call (OpenAI shape).
#[napi(object, object_to_js = false)]
pub struct FunctionDefinition {
    /// The function's name.
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// JSON Schema of its arguments.
    #[napi(ts_type = "Record<string, unknown>")]
    pub parameters: Option<Value>,
}

/// A tool the model may call: `{ type: 'function', function: { name, description, parameters } }`.
#[napi(object, object_to_js = false)]
pub struct Tool {
    /// Always `'function'`.
    #[napi(js_name = "type", ts_type = "'function'")]
    pub kind: String,
    /// The function.
    pub function: FunctionDefinition,
}

/// The function part of a tool call.
#[napi(object)]
#[derive(Debug, Clone)]
pub struct ToolCallFunction {
    /// Name of the function called.
    pub name: String,
    /// Its arguments as JSON text (as OpenAI sends them); an object is accepted on input too.
    #[napi(ts_type = "string")]
    pub arguments: Value,
}

/// A tool call made by the assistant (OpenAI shape).
#[napi(object)]
#[derive(Debug, Clone)]
pub struct ToolCall {
    /// Call id; a `role: 'tool'` message answers it through `toolCallId`.
    pub id: String,
    /// Always `'function'`.
    #[napi(js_name = "type", ts_type = "'function'")]
    pub kind: String,
    /// Which function, with which arguments.
    pub function: ToolCallFunction,
}

/// One part of a multi-part message content: text, an image for models whose
/// `session.info.supportsImages` (PNG, JPEG, WebP or GIF bytes; remote URLs are not fetched), or
/// a video for models whose `session.info.supportsVideo` (its frames, or one animated GIF, WebP
/// or PNG; a video file such as MP4 or WebM is refused: mlex decodes no video codecs), or an audio clip (WAV, FLAC or MP3, at most 30 s) for models whose
/// `session.info.supportsAudio`.
#[napi(object, object_to_js = false)]
pub struct ContentPart {
    /// `'text'`, an image: `'image'` (with `image`) or `'image_url'` (with `image_url`),
    /// `'video'` (with `video`), or audio: `'audio'` (with `audio`) or `'input_audio'` (with
    /// `input_audio`).
    #[napi(js_name = "type", ts_type = "'text' | 'image' | 'image_url' | 'video' | 'audio' | 'input_audio' | (string & {})")]
    pub kind: String,
    /// The text of a `'text'` part.
    pub text: Option<String>,
    /// An `'image'` part's image: its bytes, a file path, or a `data:` / `file:` URL.
    #[napi(ts_type = "Uint8Array | string")]
    pub image: Option<Value>,
    /// `{ url }` of an `'image_url'` part: a `data:` URL (base64), a `file:` URL or a path.
    #[napi(ts_type = "{ url: string }")]
    pub image_url: Option<Value>,
    /// A `'video'` part's frames, in order, each an image as `image` takes it; or one animated
    /// GIF, WebP or PNG (APNG) as `image` takes an image (its bytes, a path, a `data:` / `file:`
    /// URL), decoded into its frames with their times (a still image: a one-frame video).
    #[napi(ts_type = "Array<Uint8Array | string> | Uint8Array | string")]
    pub video: Option<Value>,
    /// An `'audio'` part's clip (WAV, FLAC or MP3): its bytes, a file path, or a `data:` / `file:` URL.
    #[napi(ts_type = "Uint8Array | string")]
    pub audio: Option<Value>,
    /// `{ data, format }` of an `'input_audio'` part (OpenAI's shape): the clip in base64 and its
    /// format (`'wav'`, `'mp3'` or `'flac'`).
    #[napi(ts_type = "{ data: string; format?: string }")]
    pub input_audio: Option<Value>,
}

/// A chat message (OpenAI shape; `toolCalls`/`toolCallId` may also be spelled `tool_calls`/`tool_call_id`).
#[napi(object, object_to_js = false)]
pub struct ChatMessage {
    /// Who wrote it. Any other role rejects with code `'INVALID_ARGUMENT'`.
    #[napi(ts_type = "'system' | 'developer' | 'user' | 'assistant' | 'tool'")]
    pub role: String,
    /// The text, or content parts (text parts are joined).
    #[napi(ts_type = "string | ContentPart[] | null")]
    pub content: Value,
    /// Tool calls of an assistant message.
    pub tool_calls: Option<Vec<ToolCall>>,
    /// For `role: 'tool'`: the id of the call this message answers.
    pub tool_call_id: Option<String>,
    /// The model's reasoning of an earlier assistant turn (re-rendered by templates that show it).
    pub reasoning: Option<String>,
    /// Optional author name.
    pub name: Option<String>,
}

/// Options of one generation (`generate` and `stream`). The TypeScript shape only: the values
/// are read, checked and defaulted by the core's schema (`GenerateOptions::from_json`), and a
/// test checks that these fields are its options.
#[napi(object, object_to_js = false)]
pub struct GenerateOptions {
    /// Most tokens to generate (default 512).
    pub max_tokens: Option<f64>,
    /// Sampling temperature; 0 (the default) is greedy decoding.
    pub temperature: Option<f64>,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches this (default 1 = off).
    pub top_p: Option<f64>,
    /// Keep only the `topK` most likely tokens (default 0 = off).
    pub top_k: Option<f64>,
    /// Drop tokens less likely than `minP` × the top token's probability (default 0 = off).
    pub min_p: Option<f64>,
    /// Penalty on recently generated tokens (default 1 = off).
    pub repetition_penalty: Option<f64>,
    /// How many recent tokens the repetition penalty looks at (default 20).
    pub repetition_context_size: Option<f64>,
    /// Same seed, prompt and options ⇒ same tokens. Default: a fresh seed per call.
    pub seed: Option<f64>,
    /// Generation stops before any of these strings; they never appear in the output.
    pub stop: Option<Vec<String>>,
    /// Tools the model may call (rendered by the chat template).
    #[napi(ts_type = "Tool[]")]
    pub tools: Option<Value>,
    /// Passed to the chat template as `enable_thinking` (models with a thinking switch).
    pub enable_thinking: Option<bool>,
    /// Most tokens of reasoning before the reasoning span is closed (its closing marker is fed
    /// to the model and the answer follows).
    pub reasoning_budget_tokens: Option<f64>,
    /// How the model writes tool calls (default: chosen from the chat template when `tools` are
    /// given; `'generic'` when the template has no tool support, see `GenerateReply.toolCallFormat`).
    /// Given explicitly, it is taken at its word: no prompt of mlex's own is added.
    #[napi(ts_type = "'hermes' | 'qwen3_coder' | 'gemma4' | 'gemma_tool_code' | 'llama3_json' | 'mistral' | 'generic'")]
    pub tool_call_format: Option<String>,
    /// Whether this call may use the session's prompt cache (default: the session's setting).
    pub prompt_cache: Option<bool>,
    /// Keep generating past end-of-sequence tokens (benchmarks).
    pub ignore_eos: Option<bool>,
    /// Prompt tokens processed per forward pass during prefill (default 512).
    pub prefill_step_size: Option<f64>,
    /// Hold the reply to a JSON Schema, any JSON object, a regular expression or a Lark grammar
    /// (constrained decoding; a reasoning span the prompt opens stays free text). A schema or
    /// grammar that cannot be compiled rejects with `INVALID_ARGUMENT`; a reply that runs out of
    /// `maxTokens` first ends with `finishReason: 'length'`.
    #[napi(
        ts_type = "{ type: 'json_schema'; schema: object } | { type: 'json_schema'; json_schema: { name?: string; strict?: boolean; schema: object } } | { type: 'json_object' } | { type: 'regex'; pattern: string } | { type: 'grammar'; lark: string } | { type: 'text' }"
    )]
    pub response_format: Option<Value>,
    /// Whether the model may (`'auto'`, the default), must (`'required'`, or one tool by name)
    /// or must not (`'none'`: the tools are not shown) call the tools given. A call it must make
    /// is held to the tools' parameter schemas in its own call format (every format); under
    /// `'auto'` a call the model opens is held the same way, from its opening marker on.
    #[napi(ts_type = "'auto' | 'none' | 'required' | { name: string } | { type: 'function'; function: { name: string } }")]
    pub tool_choice: Option<Value>,
    /// For each generated token, this many (0–20) of the most likely tokens at its step with
    /// their log probabilities (`GeneratedToken.topLogprobs`, `GenerateReply.topLogprobs`). Of
    /// the same distribution as `logprob`: the model's log-softmax after `repetitionPenalty` and
    /// a `responseFormat` mask, before `temperature`, `topP`, `topK` and `minP`. Default: none
    /// (nothing is computed).
    pub top_logprobs: Option<f64>,
    /// Speculative decoding with this draft model (a directory or repo id with the same
    /// tokenizer as the session's model; a different vocabulary rejects with
    /// `INVALID_ARGUMENT`), loaded on first use and kept. Default: the session's `draftModel`.
    /// Greedy output is the same as without it; sampled output keeps the model's distribution.
    pub draft_model: Option<String>,
    /// Tokens drafted per step (default 3; 0 turns speculation off for this call).
    pub num_draft_tokens: Option<u32>,
    /// Speculative decoding with drafts looked up in the context (the tokens that followed the
    /// latest earlier occurrence of its last n-gram, n from `maxNgram` (default 3) down to 1):
    /// no second model; fastest when the reply repeats the prompt (edits, quotes, code).
    /// Speculative calls run alone, outside the session's batch (`usage.batched` false).
    #[napi(ts_type = "boolean | { maxNgram?: number; numDraftTokens?: number }")]
    pub prompt_lookup: Option<Value>,
    /// Hold at most this many tokens of keys/values per layer: the first 4 and the most recent
    /// (mlx-lm's `max_kv_size`): memory stays bounded and generation may go past the context
    /// length. Greater than 4. Such calls run alone, without the prompt cache (`usage.batched`
    /// false). Models whose every layer is plain full attention only (llama, qwen2, qwen3, …).
    pub max_kv_size: Option<f64>,
    /// Quantize the keys/values to this many bits (2, 3, 4, 5, 6 or 8; mlx-lm's `kv_bits`), read
    /// by quantized attention. Not with `maxKvSize`. Runs alone, without the prompt cache.
    pub kv_bits: Option<f64>,
    /// Elements per quantization group of `kvBits` (32, 64 or 128; default 64); it must divide
    /// the model's head dimension.
    pub kv_group_size: Option<f64>,
    /// Tokens kept in full precision before the cache switches to `kvBits` (default 5000, as
    /// mlx-lm's `quantized_kv_start`; 0: from the first forward pass on).
    pub quantized_kv_start: Option<f64>,
    /// Aborts the generation. Before it starts: the promise rejects with code `'ABORTED'`;
    /// while it runs: it resolves with `finishReason: 'abort'` and the text so far.
    #[napi(ts_type = "AbortSignal")]
    pub signal: Option<Value>,
    /// Sees every token as it is produced (on the JS thread). Returning `false` stops the
    /// generation (`finishReason: 'abort'`); throwing stops it and rejects with the thrown error.
    #[napi(ts_type = "(token: GeneratedToken) => boolean | void")]
    pub on_token: Option<Value>,
}

/// Options of `Session.tokenize`.
#[napi(object, object_to_js = false)]
pub struct TokenizeOptions {
    /// Add the tokenizer's special tokens (e.g. BOS) as its post-processor says (default false).
    pub add_special_tokens: Option<bool>,
}

/// Options of `Session.applyChatTemplate`.
#[napi(object, object_to_js = false)]
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChatTemplateOptions {
    /// Tools to render into the prompt.
    #[napi(ts_type = "Tool[]")]
    pub tools: Option<Value>,
    /// Passed to the template as `enable_thinking`.
    pub enable_thinking: Option<bool>,
    /// End with the assistant turn's opening (default true).
    pub add_generation_prompt: Option<bool>,
}

/// One of the most likely tokens at a step (`topLogprobs`).
#[napi(object)]
#[derive(Debug, Clone)]
pub struct TopLogprob {
    /// Token id.
    pub id: u32,
    /// The token alone, decoded with special tokens kept (a piece of a multi-byte character
    /// shows as U+FFFD).
    pub text: String,
    /// Natural-log probability.
    pub logprob: f64,
}

/// One generated token, as it streams.
#[napi(object)]
#[derive(Debug, Clone)]
pub struct GeneratedToken {
    /// Token id.
    pub id: u32,
    /// The text this token completes (empty while a multi-byte character is still pending).
    pub text: String,
    /// Which part of the reply the token belongs to.
    #[napi(ts_type = "'text' | 'reasoning' | 'toolCall'")]
    pub kind: String,
    /// Natural-log probability of the token under the model.
    pub logprob: f64,
    /// With the `topLogprobs` option: the most likely tokens at this step, most likely first
    /// (with greedy decoding the first is this token). Empty otherwise, and for tokens fed
    /// rather than sampled (the closing marker a reasoning budget forces).
    pub top_logprobs: Vec<TopLogprob>,
}

/// Counts and speeds of one generation.
#[napi(object)]
#[derive(Debug, Clone)]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: u32,
    /// Prompt tokens whose state came from the prompt cache.
    pub cached_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// Milliseconds the request waited in the session's queue behind earlier generations.
    pub queue_ms: f64,
    /// Milliseconds from the request reaching the engine to the first token.
    pub ttft_ms: f64,
    /// Prompt processing speed.
    pub prefill_tokens_per_second: f64,
    /// Generation speed.
    pub decode_tokens_per_second: f64,
    /// Host milliseconds per decode step spent building and scheduling it. When it is close to
    /// 1000 / decodeTokensPerSecond, decoding is bound by the host, not by the device.
    pub schedule_ms_per_step: f64,
    /// The part of scheduleMsPerStep spent inside MLX submitting the step's kernels.
    pub submit_ms_per_step: f64,
    /// Host milliseconds per decode step blocked on the device to read the token (near zero
    /// when the host is the bottleneck).
    pub wait_ms_per_step: f64,
    /// Peak memory MLX used during the generation.
    pub peak_memory_bytes: f64,
    /// The most requests that decoded together in one step with this one (1: alone).
    pub batch_size: u32,
    /// Whether it ran in the session's continuous batch; false when the model's caches cannot
    /// batch yet (sliding windows, recurrent states, latent caches) and requests run one after
    /// another.
    pub batched: bool,
    /// Speculative decoding: tokens proposed by the draft (draft model or prompt lookup).
    pub draft_tokens: u32,
    /// Of `draftTokens`, those the model accepted.
    pub accepted_draft_tokens: u32,
    /// `acceptedDraftTokens / draftTokens` (0 without drafts).
    pub acceptance_rate: f64,
    /// Tokens generated per forward pass of the model (1 without speculation).
    pub tokens_per_step: f64,
    /// Greedy prompt lookup builds each pass before the previous one is read, guessing that
    /// every draft is kept: the passes whose guess did not hold (device work thrown away).
    pub dropped_passes: u32,
}

/// The result of a generation.
#[napi(object)]
#[derive(Debug, Clone)]
pub struct GenerateReply {
    /// The reply's text (without reasoning or tool-call markup).
    pub text: String,
    /// The model's reasoning, for reasoning models.
    pub reasoning: Option<String>,
    /// Tools the model called.
    pub tool_calls: Vec<ToolCall>,
    /// Generated token ids.
    pub tokens: Vec<u32>,
    /// Log probability of each generated token.
    pub logprobs: Vec<f64>,
    /// With the `topLogprobs` option: each token's `topLogprobs` (one list per entry of
    /// `tokens`); empty otherwise.
    pub top_logprobs: Vec<Vec<TopLogprob>>,
    /// Why generation ended: end of sequence or a stop string, `maxTokens`, aborted, or tool calls.
    #[napi(ts_type = "'stop' | 'length' | 'abort' | 'tool_calls'")]
    pub finish_reason: String,
    /// Counts and speeds.
    pub usage: Usage,
    /// With `tools`: the format the model was asked to write tool calls in, and its calls were
    /// parsed in. `'generic'` when the model's chat template has no tool support (it renders
    /// the same prompt with or without tools): mlex then described the tools in a system prompt
    /// of its own, asking for `<tool_call>{"name", "arguments"}</tool_call>` blocks, which the
    /// model was not trained on (expect weaker tool use than from a tool-trained model).
    #[napi(ts_type = "'hermes' | 'qwen3_coder' | 'gemma4' | 'gemma_tool_code' | 'llama3_json' | 'mistral' | 'generic'")]
    pub tool_call_format: Option<String>,
}

/// What a loaded model is.
#[napi(object)]
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The checkpoint directory.
    pub path: String,
    /// `model_type` of config.json (e.g. `'llama'`, `'qwen3'`).
    pub model_type: String,
    /// Transformer layers.
    pub num_layers: u32,
    /// Vocabulary size.
    pub vocab_size: u32,
    /// The context length generation keeps to (`LoadOptions.contextLength`, else the longest
    /// context config.json declares); none when unlimited.
    pub context_length: Option<u32>,
    /// Quantization, e.g. `'affine 4-bit g64'`; null for float checkpoints.
    pub quantization: Option<String>,
    /// Compute dtype, e.g. `'float32'`.
    pub dtype: String,
    /// Where it runs.
    #[napi(ts_type = "'gpu' | 'cpu'")]
    pub device: String,
    /// Bytes of weights in memory.
    pub weights_bytes: f64,
    /// Whether messages may carry images.
    pub supports_images: bool,
    /// Whether messages may carry audio.
    pub supports_audio: bool,
    /// Whether messages may carry video parts (`{ type: 'video', video: [frame, ...] }`).
    pub supports_video: bool,
    /// Whether decode steps use 8-bit activations (`LoadOptions.int8Activations` on a CPU with
    /// AVX-512 VNNI; false on the GPU or another CPU, where the option changes nothing).
    pub int8_activations: bool,
}

/// Internal: what `NativeGeneration.next` resolves with — the tokens produced since the last call,
/// and the reply once generation has ended.
#[napi(object)]
pub struct NativeBatch {
    /// Tokens produced since the previous call (at least one unless `reply` is set).
    pub tokens: Vec<GeneratedToken>,
    /// Set once, when generation has ended.
    pub reply: Option<GenerateReply>,
}

/// Text with its tool calls parsed out (`parseToolCalls`).
#[napi(object)]
#[derive(Debug, Clone)]
pub struct ParsedToolCalls {
    /// The text without the calls' markup; calls that did not parse stay in it as written.
    pub text: String,
    /// The calls, with fresh ids.
    pub tool_calls: Vec<ToolCall>,
}
