//! The `mlex` command line: generate, chat, template, convert, bench.
//! Exit status: 0 success, 2 usage error (clap), 1 any other error (one line on stderr).
use clap::{Args, Parser, Subcommand};
use mlex::chat::{parse_messages_json, parse_tools_json};
use mlex::generate::Naming;
use mlex::{ChatMessage, GenerateOptions, LoadOptions, Session, TokenKind};
use serde_json::json;
use std::io::{BufRead, Write};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "mlex", version, about = "Run local LLMs on Apple's MLX")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a reply to a prompt, streaming it to stdout.
    Generate(GenerateArgs),
    /// Interactive chat that keeps the conversation history.
    Chat(ChatArgs),
    /// Print a chat transcript rendered through the model's chat template.
    Template(TemplateArgs),
    /// Convert a GGUF file into an MLX checkpoint directory.
    ///
    /// Architectures: llama, qwen2, qwen3, qwen3moe, gemma3. By default each weight gets the MLX
    /// affine quantization nearest to its own GGUF type, and the GGUF's per-tensor mix is recorded
    /// per module in config.json: Q4_0/Q4_1/Q4_K → 4 bits, Q5_0/Q5_1/Q5_K → 5, Q8_0 → 8 (lossless
    /// repacks, group 32); Q6_K → 6, Q3_K and Q2_K → 3 (re-quantized, group 32); float weights stay
    /// float. --q-bits makes it uniform, --float writes floats.
    Convert(ConvertArgs),
    /// Measure load, prefill, time to first token, decode speed and peak memory.
    Bench(BenchArgs),
    /// Serve models over HTTP in OpenAI's and Anthropic's formats (/v1/chat/completions,
    /// /v1/completions, /v1/responses, /v1/messages, /v1/models, /health, /metrics); concurrent
    /// requests to a model are batched.
    #[cfg(feature = "serve")]
    Serve(ServeArgs),
}

#[cfg(feature = "serve")]
#[derive(Args)]
struct ServeArgs {
    /// A model to serve (repeatable): DIR, or ID=DIR to choose the id clients send as `model`
    /// (default: the directory's name).
    #[arg(long, required = true)]
    model: Vec<String>,
    /// Address to bind (default 127.0.0.1: this machine only).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require this key of every request (Authorization: Bearer KEY, or x-api-key: KEY).
    #[arg(long, env = "MLEX_API_KEY")]
    api_key: Option<String>,
    /// Largest request body accepted.
    #[arg(long, default_value_t = 16 << 20)]
    max_body_bytes: usize,
    /// Let browsers on this origin call the server (repeatable or comma-separated; * for any).
    /// Without it no CORS headers are sent.
    #[arg(long, value_name = "ORIGIN", value_delimiter = ',')]
    cors: Vec<String>,
    /// Stop a request that runs longer than this many seconds (whole replies get 504, streams
    /// an error event); 0: no limit.
    #[arg(long, value_name = "SECS", default_value_t = 0.0)]
    request_timeout: f64,
    /// Requests a model may hold waiting beyond its batch (--max-batch); more get 429 with
    /// Retry-After.
    #[arg(long, value_name = "N", default_value_t = mlex::serve::DEFAULT_MAX_QUEUE)]
    max_queue: usize,
    /// cpu or gpu (default: gpu when available).
    #[arg(long)]
    device: Option<String>,
    /// Compute dtype: float32, bfloat16 or float16.
    #[arg(long)]
    dtype: Option<String>,
    /// On the CPU: 8-bit activations in integer dot products, as llama.cpp computes (faster
    /// decode with AVX-512 VNNI; logprobs move away from mlx-lm's).
    #[arg(long)]
    int8_activations: bool,
    #[command(flatten)]
    batch: BatchArgs,
    #[command(flatten)]
    prompt_cache: PromptCacheArgs,
}

#[cfg(feature = "serve")]
fn serve(a: ServeArgs) -> mlex::Result<()> {
    let mut models = vec![];
    for m in &a.model {
        let (id, path) = match m.split_once('=') {
            Some((id, path)) if !id.is_empty() && !id.contains('/') => (id.to_string(), path.to_string()),
            _ => {
                let id = std::path::Path::new(m.trim_end_matches('/')).file_name().map_or(m.clone(), |n| n.to_string_lossy().into_owned());
                (id, m.clone())
            }
        };
        if models.iter().any(|(other, _)| *other == id) {
            return Err(mlex::Error::InvalidArgument(format!("two models share the id {id:?}: name them with ID=DIR")));
        }
        eprintln!("loading {id} from {path}");
        let session = Session::load_with_options(&path, a.prompt_cache.apply(load_options(a.device.as_deref(), a.dtype.as_deref(), a.int8_activations, &a.batch)?))?;
        models.push((id, session));
    }
    mlex::serve::run(mlex::serve::ServeConfig {
        models,
        host: a.host,
        port: a.port,
        api_key: a.api_key,
        max_body_bytes: a.max_body_bytes,
        cors: a.cors.iter().map(|o| o.trim().to_string()).filter(|o| !o.is_empty()).collect(),
        request_timeout: request_timeout(a.request_timeout)?,
        max_queue: a.max_queue,
    })
}

#[cfg(feature = "serve")]
fn request_timeout(secs: f64) -> mlex::Result<Option<std::time::Duration>> {
    if !secs.is_finite() || secs < 0.0 {
        return Err(mlex::Error::InvalidArgument(format!("--request-timeout must be a number of seconds >= 0, got {secs}")));
    }
    Ok((secs > 0.0).then(|| std::time::Duration::from_secs_f64(secs)))
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["model", "shape", "matvec"])))]
struct BenchArgs {
    /// A checkpoint (directory, HF cache entry or repo id).
    #[arg(long)]
    model: Option<String>,
    /// Random weights of a real shape: qwen3-0.6b, llama-3.2-3b, qwen2.5-7b, smollm2-135m, qwen3-30b-a3b,
    /// gemma3-1b, qwen3.5-0.8b, qwen3.5-2b, qwen3.5-moe-small.
    #[arg(long)]
    shape: Option<String>,
    /// Quantize the random weights to this many bits (affine; 0 = keep floats).
    #[arg(long, default_value_t = 0)]
    bits: u32,
    #[arg(long, default_value_t = 64)]
    group_size: u32,
    /// Compute dtype (float32, bfloat16; default: float32 on CPU; on GPU config.json's torch_dtype if half, else bfloat16 for --shape).
    #[arg(long)]
    dtype: Option<String>,
    #[arg(long)]
    device: Option<String>,
    #[arg(long, default_value_t = 512)]
    prompt_len: usize,
    #[arg(long, default_value_t = 256)]
    gen: usize,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Measure the prompt cache instead: time to first token of a second turn (the first turn of
    /// --prompt-len tokens, its --gen-token reply and 64 new tokens), cached vs cold.
    #[arg(long)]
    prompt_cache: bool,
    /// Print the MLX operations one decode step of --shape (or of the checkpoint --model) builds
    /// (by primitive) instead of timing (the step requests decode with: a continuous batch of one
    /// where the model batches).
    #[arg(long)]
    graph: bool,
    /// Run this many requests at once on one session (each its own prompt): aggregate and
    /// per-stream tok/s, time to first token p50/p95.
    #[arg(long)]
    concurrency: Option<usize>,
    /// With --concurrency: once every stream decodes, time the first token of one more request
    /// of the same prompt length (`late_ttft_ms`; its prefill is inside the run's wall time).
    #[arg(long)]
    late_request: bool,
    /// With --concurrency, --max-batch up to --concurrency batches all streams (default 16).
    #[command(flatten)]
    batch: BatchArgs,
    /// Every measured generation with these KV cache options (peak memory with and without).
    #[command(flatten)]
    kv: KvCacheArgs,
    /// Prompt tokens per prefill forward pass (default 512).
    #[arg(long)]
    prefill_step_size: Option<usize>,
    /// Each measured run's prompt one token longer than the last (--prompt-len + 1, + 2, …): a
    /// length the process has not seen, as a server's requests mostly are (on CUDA a new
    /// attention shape may compile a cuDNN graph; the warm-up is --prompt-len).
    #[arg(long)]
    new_lengths: bool,
    /// Time one quantized projection per shape (OUTxIN, comma-separated) instead: mlex's kernel
    /// against MLX's, µs per product and GB/s of weights (--bits, --group-size, --dtype; default
    /// 4-bit, bfloat16 on a GPU, float32 on the CPU). With --rows over 32, MLX's quantized matmul
    /// against dequantize + GEMM.
    #[arg(long)]
    matvec: Option<String>,
    /// With --matvec: rows of x (1: a lone request's decode step).
    #[arg(long, default_value_t = 1)]
    rows: i32,
    /// JSON lines only (default also prints a summary line per run to stderr).
    #[arg(long)]
    json: bool,
    /// On the CPU: 8-bit activations in integer dot products (LoadOptions::int8_activations).
    #[arg(long)]
    int8_activations: bool,
}

#[derive(Args)]
struct ModelArgs {
    /// Model directory, Hugging Face cache entry, or repo id (looked up under MLEX_MODELS_DIR and the HF cache).
    #[arg(long)]
    model: String,
    /// cpu or gpu (default: gpu when available).
    #[arg(long)]
    device: Option<String>,
    /// Compute dtype: float32, bfloat16 or float16 (default: float32 on CPU; on GPU config.json's torch_dtype if half, else the checkpoint's).
    #[arg(long)]
    dtype: Option<String>,
    /// On the CPU: 8-bit activations in integer dot products, as llama.cpp computes (faster
    /// decode with AVX-512 VNNI; logprobs move away from mlx-lm's).
    #[arg(long)]
    int8_activations: bool,
    #[command(flatten)]
    prompt_cache: PromptCacheArgs,
}

/// The prompt cache on disk (LoadOptions.prompt_cache.dir / disk_max_bytes).
#[derive(Args, Default)]
struct PromptCacheArgs {
    /// Also keep prompt cache entries (KV states of prompts) in this directory, so that later
    /// runs sharing a prompt prefix (a long system prompt) start from it.
    #[arg(long, value_name = "DIR")]
    prompt_cache_dir: Option<std::path::PathBuf>,
    /// Upper bound on the bytes of entries in --prompt-cache-dir, least recently used deleted
    /// first (default 4 GiB).
    #[arg(long, value_name = "BYTES")]
    prompt_cache_disk_max_bytes: Option<u64>,
}

impl PromptCacheArgs {
    fn apply(&self, mut o: LoadOptions) -> LoadOptions {
        if let Some(d) = &self.prompt_cache_dir {
            o.prompt_cache.dir = Some(d.clone());
        }
        if let Some(n) = self.prompt_cache_disk_max_bytes {
            o.prompt_cache.disk_max_bytes = n;
        }
        o
    }
}

/// A generation's options as flags: each is an option of the core schema (`GenerateOptions`,
/// spelled in kebab-case) and is read through it, so its default and its checks are the schema's.
#[derive(Args)]
struct SamplingArgs {
    /// Most tokens to generate (default 512).
    #[arg(long)]
    max_tokens: Option<usize>,
    /// 0 (the default) = greedy.
    #[arg(long, allow_negative_numbers = true)]
    temperature: Option<f32>,
    /// Nucleus sampling (default 1 = off).
    #[arg(long, allow_negative_numbers = true)]
    top_p: Option<f32>,
    /// Keep the k most likely tokens (default 0 = off).
    #[arg(long)]
    top_k: Option<u32>,
    /// Drop tokens less likely than min-p × the top one's probability (default 0 = off).
    #[arg(long, allow_negative_numbers = true)]
    min_p: Option<f32>,
    /// Penalty on recently generated tokens (default 1 = off).
    #[arg(long, allow_negative_numbers = true)]
    repetition_penalty: Option<f32>,
    /// Recent tokens the repetition penalty looks at (default 20).
    #[arg(long)]
    repetition_context_size: Option<usize>,
    #[arg(long)]
    seed: Option<u64>,
    /// Stop before this string (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Prompt tokens per forward pass during prefill (default 512).
    #[arg(long)]
    prefill_step_size: Option<usize>,
    /// For each generated token, the N (0-20) most likely tokens with their log probabilities
    /// (shown by --json as top_logprobs).
    #[arg(long, value_name = "N")]
    top_logprobs: Option<usize>,
    /// Speculative decoding with this draft model (same tokenizer as --model).
    #[arg(long, value_name = "DIR")]
    draft_model: Option<String>,
    /// Tokens drafted per step, by --draft-model or --prompt-lookup (default 3).
    #[arg(long, value_name = "N")]
    num_draft_tokens: Option<usize>,
    /// Speculative decoding with drafts looked up in the context (no second model).
    #[arg(long)]
    prompt_lookup: bool,
    #[command(flatten)]
    kv: KvCacheArgs,
}

/// mlx-lm's KV cache options (`GenerateOptions::kv_cache`), as `mlx_lm.generate` spells them.
#[derive(Args, Default)]
struct KvCacheArgs {
    /// Hold at most N tokens of keys/values per layer: the first 4 and the most recent (memory
    /// stays bounded; generation may go past the context length).
    #[arg(long, value_name = "N")]
    max_kv_size: Option<usize>,
    /// Quantize the keys/values to this many bits (2, 3, 4, 5, 6 or 8).
    #[arg(long, value_name = "BITS")]
    kv_bits: Option<u32>,
    /// Group size of --kv-bits (32, 64, 128; default 64).
    #[arg(long, value_name = "N")]
    kv_group_size: Option<u32>,
    /// Tokens kept in full precision before --kv-bits applies (default 5000).
    #[arg(long, value_name = "N")]
    quantized_kv_start: Option<usize>,
}

impl KvCacheArgs {
    /// The flags, by option name (snake_case), for the core schema to read.
    fn values(&self) -> [(&'static str, serde_json::Value); 4] {
        [
            ("max_kv_size", json!(self.max_kv_size)),
            ("kv_bits", json!(self.kv_bits)),
            ("kv_group_size", json!(self.kv_group_size)),
            ("quantized_kv_start", json!(self.quantized_kv_start)),
        ]
    }
}

#[derive(Args)]
struct ThinkArgs {
    /// Ask the template for thinking (enable_thinking = true).
    #[arg(long, conflicts_with = "no_think")]
    think: bool,
    /// Ask the template for no thinking (enable_thinking = false).
    #[arg(long)]
    no_think: bool,
}

impl ThinkArgs {
    fn enable_thinking(&self) -> Option<bool> {
        if self.think {
            Some(true)
        } else if self.no_think {
            Some(false)
        } else {
            None
        }
    }
}

#[derive(Args)]
struct ChatFeatureArgs {
    #[command(flatten)]
    think: ThinkArgs,
    /// Most reasoning tokens before the reasoning span is closed and the answer begins.
    #[arg(long, visible_alias = "reasoning-budget")]
    reasoning_budget_tokens: Option<usize>,
    /// How the model writes tool calls: hermes, qwen3_coder, gemma4, gemma_tool_code,
    /// llama3_json, mistral (default: from the chat template).
    #[arg(long, visible_alias = "tool-format")]
    tool_call_format: Option<String>,
    /// auto (default), none (the tools are not shown), required (a call, held to the tools'
    /// schemas), or a tool's name (a call of that tool).
    #[arg(long)]
    tool_choice: Option<String>,
    /// Hold the answer to the JSON Schema in this file (constrained decoding).
    #[arg(long, group = "format")]
    json_schema: Option<PathBuf>,
    /// Hold the answer to any JSON object.
    #[arg(long, group = "format")]
    json_object: bool,
    /// Hold the answer to a whole match of this regular expression.
    #[arg(long, group = "format")]
    regex: Option<String>,
    /// Hold the answer to the Lark grammar in this file.
    #[arg(long, group = "format")]
    grammar: Option<PathBuf>,
}

impl ChatFeatureArgs {
    /// The response_format object of the format flag given (files read here; null: none).
    fn response_format(&self) -> mlex::Result<serde_json::Value> {
        let read = |p: &PathBuf| std::fs::read_to_string(p).map_err(|e| mlex::Error::io(format!("reading {}", p.display()), e));
        Ok(if let Some(p) = &self.json_schema {
            let schema: serde_json::Value = serde_json::from_str(&read(p)?)
                .map_err(|e| mlex::Error::InvalidArgument(format!("--json-schema {}: not JSON: {e}", p.display())))?;
            json!({"type": "json_schema", "schema": schema})
        } else if self.json_object {
            json!({"type": "json_object"})
        } else if let Some(r) = &self.regex {
            json!({"type": "regex", "pattern": r})
        } else if let Some(p) = &self.grammar {
            json!({"type": "grammar", "lark": read(p)?})
        } else {
            serde_json::Value::Null
        })
    }
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "messages", "prompt_tokens"])))]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// A user message (through the chat template when the model has one, unless --raw).
    #[arg(long)]
    prompt: Option<String>,
    /// A JSON file with OpenAI-style messages.
    #[arg(long)]
    messages: Option<PathBuf>,
    /// Comma-separated token ids fed as they are.
    #[arg(long, value_delimiter = ',')]
    prompt_tokens: Option<Vec<u32>>,
    /// Use --prompt as raw text, without the chat template.
    #[arg(long)]
    raw: bool,
    /// An image file (PNG, JPEG, WebP, GIF) shown with --prompt, before its text; repeatable.
    /// Needs a model with a vision tower (a gemma3 or gemma4 checkpoint with its vision_config).
    #[arg(long, requires = "prompt")]
    image: Vec<PathBuf>,
    /// A video shown with --prompt, after the images, as its frames: image files, comma-separated,
    /// in order (--video takes an animated GIF, WebP or PNG instead). Needs a model that takes
    /// video (gemma4 with a video_token_id, qwen3_5 or qwen2_5_vl with its vision tower).
    #[arg(long, value_delimiter = ',', requires = "prompt", conflicts_with = "video")]
    video_frames: Vec<PathBuf>,
    /// A video shown with --prompt, after the images: an animated GIF, WebP or PNG (APNG),
    /// decoded into its frames with their times (a still image is a one-frame video). Video
    /// files (MP4, WebM, MOV, MKV, AVI) are refused: mlex decodes no video codecs; pass their
    /// frames with --video-frames.
    #[arg(long, requires = "prompt")]
    video: Option<PathBuf>,
    /// An audio file (WAV, FLAC, MP3; at most 30 s) heard with --prompt, after the images and
    /// video, before its text; repeatable. Needs a model with an audio tower (a gemma4 checkpoint
    /// with its audio_config).
    #[arg(long, requires = "prompt")]
    audio: Vec<PathBuf>,
    /// A JSON file with OpenAI-style tool definitions.
    #[arg(long)]
    tools: Option<PathBuf>,
    /// Print exactly one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    chat: ChatFeatureArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
}

#[derive(Args)]
struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// A system prompt for the conversation.
    #[arg(long)]
    system: Option<String>,
    /// A JSON file with OpenAI-style tool definitions (calls are printed; no tool is run).
    #[arg(long)]
    tools: Option<PathBuf>,
    #[command(flatten)]
    chat: ChatFeatureArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
}

#[derive(Args)]
struct TemplateArgs {
    #[arg(long)]
    model: String,
    #[arg(long)]
    messages: PathBuf,
    #[arg(long)]
    tools: Option<PathBuf>,
    /// Leave out the assistant prompt at the end.
    #[arg(long)]
    no_generation_prompt: bool,
    #[command(flatten)]
    think: ThinkArgs,
}

#[derive(Args)]
struct ConvertArgs {
    /// The GGUF file to convert.
    #[arg(long)]
    gguf: PathBuf,
    /// Output directory (created).
    #[arg(long)]
    out: PathBuf,
    /// Quantize every weight except Q4_0/Q4_1/Q8_0 (kept lossless) to this many bits (2, 3, 4, 5,
    /// 6, 8) at --q-group-size, instead of each weight's nearest quantization.
    #[arg(long, conflicts_with = "float")]
    q_bits: Option<u8>,
    /// Group size for --q-bits (32, 64, 128).
    #[arg(long, default_value_t = 64)]
    q_group_size: u32,
    /// Write every weight except Q4_0/Q4_1/Q8_0 (kept lossless) as floats (--dtype), as older
    /// versions did by default: larger and slower, but no re-quantization.
    #[arg(long)]
    float: bool,
    /// Dtype of tensors written as floats: f16, bf16 or f32.
    #[arg(long, default_value = "f16")]
    dtype: String,
}

fn main() {
    mlex::startup_trace::mark("main");
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(a) => generate(a),
        Command::Chat(a) => chat(a),
        Command::Template(a) => template(a),
        Command::Convert(a) => convert(a),
        Command::Bench(a) => bench(a),
        #[cfg(feature = "serve")]
        Command::Serve(a) => serve(a),
    };
    mlex::startup_trace::mark("done (the session dropped)");
    let code = match result {
        Ok(()) => 0,
        Err(e) => {
            let _ = std::io::stdout().flush();
            eprintln!("mlex: {e}");
            1
        }
    };
    exit_now(code)
}

/// Ends the process without running C++ static destructors. Every session is dropped by now
/// (its engine thread joined, queued prompt-cache writes finished), so what is left is MLX's
/// teardown of its buffer caches and streams, which the OS reclaims anyway: ~20 ms of a one-shot
/// `mlex generate` on the H200 (BENCHMARKS.md, eighth session; the ~100 ms the kernel then takes
/// to release the CUDA context remain).
fn exit_now(code: i32) -> ! {
    extern "C" {
        fn _exit(status: i32) -> !;
    }
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit only ends the process; stdout and stderr are flushed above.
    unsafe { _exit(code) }
}

fn load(m: &ModelArgs) -> mlex::Result<Session> {
    Session::load_with_options(&m.model, m.prompt_cache.apply(load_options(m.device.as_deref(), m.dtype.as_deref(), m.int8_activations, &BatchArgs::default())?))
}

/// How many requests decode together, and the cache bytes they may set aside (LoadOptions).
#[derive(Args, Default)]
struct BatchArgs {
    /// The most requests that decode together (default 16).
    #[arg(long)]
    max_batch: Option<usize>,
    /// Cache bytes the requests decoding together may set aside, each its prompt + max tokens
    /// (default: 90 % of what MLX may still allocate after loading).
    #[arg(long)]
    kv_budget_bytes: Option<usize>,
}

fn load_options(device: Option<&str>, dtype: Option<&str>, int8_activations: bool, batch: &BatchArgs) -> mlex::Result<LoadOptions> {
    let mut o = serde_json::Map::new();
    if int8_activations {
        o.insert(Naming::Kebab.spell("int8_activations"), json!(true));
    }
    for (name, v) in [("device", device), ("dtype", dtype)] {
        if let Some(v) = v {
            o.insert(Naming::Kebab.spell(name), json!(v));
        }
    }
    for (name, v) in [("max_batch", batch.max_batch), ("kv_budget_bytes", batch.kv_budget_bytes)] {
        if let Some(n) = v {
            o.insert(Naming::Kebab.spell(name), json!(n));
        }
    }
    LoadOptions::from_json(&serde_json::Value::Object(o), Naming::Kebab).map_err(mlex::Error::InvalidArgument)
}

fn bench(a: BenchArgs) -> mlex::Result<()> {
    if let Some(shapes) = &a.matvec {
        let device = match a.device.as_deref() {
            Some("cpu") => mlex::mlx::Device::Cpu,
            Some("gpu") | None if mlex::mlx::gpu_available() => mlex::mlx::Device::Gpu,
            None => mlex::mlx::Device::Cpu,
            Some("gpu") => return Err(mlex::Error::InvalidArgument("--device gpu: this MLX build has no GPU".into())),
            Some(d) => return Err(mlex::Error::InvalidArgument(format!("--device {d}: gpu or cpu"))),
        };
        mlex::mlx::set_default_device(device)?;
        // Each device's compute dtype by default (mlex's CPU kernel takes float32 rows).
        let dtype = match a.dtype.as_deref() {
            None if device == mlex::mlx::Device::Cpu => mlex::Dtype::Float32,
            None | Some("bfloat16") => mlex::Dtype::Bfloat16,
            Some("float16") => mlex::Dtype::Float16,
            Some("float32") => mlex::Dtype::Float32,
            Some(d) => return Err(mlex::Error::InvalidArgument(format!("--matvec: --dtype {d}: float32, bfloat16 or float16"))),
        };
        let spec = mlex::bench::matvec::MatvecSpec {
            shapes: mlex::bench::matvec::parse_shapes(shapes)?,
            rows: a.rows.max(1),
            bits: if a.bits == 0 { 4 } else { a.bits as i32 },
            group_size: a.group_size as i32,
            dtype,
            iters: 200,
            rounds: a.runs.max(1),
        };
        return mlex::bench::matvec::run(&spec, |v| println!("{v}"));
    }
    let spec = mlex::bench::BenchSpec {
        model: a.model,
        shape: a.shape,
        bits: a.bits,
        group_size: a.group_size,
        load: load_options(a.device.as_deref(), a.dtype.as_deref(), a.int8_activations, &a.batch)?,
        prompt_len: a.prompt_len,
        gen: a.gen,
        runs: a.runs,
        kv: {
            let o = a.kv.values().into_iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (Naming::Kebab.spell(k), v)).collect();
            GenerateOptions::from_json(&serde_json::Value::Object(o), Naming::Kebab).map_err(mlex::Error::InvalidArgument)?.kv_cache
        },
        prefill_step_size: a.prefill_step_size,
        new_lengths: a.new_lengths,
    };
    let json = a.json;
    if a.graph {
        let census = mlex::bench::decode_step_census(&spec)?;
        let total: usize = census.iter().map(|(_, c)| c).sum();
        let model = spec.shape.as_deref().or(spec.model.as_deref()).unwrap_or_default();
        println!("{}", serde_json::json!({"engine": "mlex", "model": model, "bits": spec.bits, "ops": total, "by_primitive": census}));
        return Ok(());
    }
    if let Some(n) = a.concurrency {
        return mlex::bench::run_concurrent(&spec, n, a.late_request, |v| {
            println!("{v}");
            if !json {
                eprintln!(
                    "run {}: {} streams (batches of up to {}): {} tok/s in all, {} tok/s per stream, ttft p50 {} ms p95 {} ms, a request arriving while they stream: {} ms",
                    v["run"], v["concurrency"], v["batch_size"], v["aggregate_tok_s"], v["per_stream_decode_tok_s"], v["ttft_p50_ms"],
                    v["ttft_p95_ms"], v["late_ttft_ms"]
                );
            }
        });
    }
    if a.prompt_cache {
        return mlex::bench::run_prompt_cache(&spec, |v| {
            println!("{v}");
            if !json {
                eprintln!(
                    "run {}: second turn of {} tokens ({} cached): ttft cold {} ms, cached {} ms ({}x)",
                    v["run"], v["second_turn_tokens"], v["cached_tokens"], v["cold_ttft_ms"], v["cached_ttft_ms"], v["speedup"]
                );
            }
        });
    }
    mlex::bench::run(&spec, |v| {
        println!("{v}");
        if !json {
            eprintln!(
                "run {}: prefill {} tok/s, ttft {} ms, decode {} tok/s, peak {} GiB",
                v["run"], v["prefill_tok_s"], v["ttft_ms"], v["decode_tok_s"], v["peak_gib"]
            );
        }
    })
}

fn options(s: &SamplingArgs, c: &ChatFeatureArgs) -> mlex::Result<GenerateOptions> {
    // The flags given, by option name, read by the core schema (named back as flags in errors).
    let mut o = serde_json::Map::new();
    let mut set = |name: &str, v: serde_json::Value| {
        if !v.is_null() {
            o.insert(Naming::Kebab.spell(name), v);
        }
    };
    set("max_tokens", json!(s.max_tokens));
    set("temperature", json!(s.temperature));
    set("top_p", json!(s.top_p));
    set("top_k", json!(s.top_k));
    set("min_p", json!(s.min_p));
    set("repetition_penalty", json!(s.repetition_penalty));
    set("repetition_context_size", json!(s.repetition_context_size));
    set("seed", json!(s.seed));
    set("stop", if s.stop.is_empty() { json!(null) } else { json!(s.stop) });
    set("ignore_eos", if s.ignore_eos { json!(true) } else { json!(null) });
    set("prefill_step_size", json!(s.prefill_step_size));
    set("top_logprobs", json!(s.top_logprobs));
    set("draft_model", json!(s.draft_model));
    set("num_draft_tokens", json!(s.num_draft_tokens));
    set("prompt_lookup", if s.prompt_lookup { json!(true) } else { json!(null) });
    for (name, v) in s.kv.values() {
        set(name, v);
    }
    set("enable_thinking", json!(c.think.enable_thinking()));
    set("reasoning_budget_tokens", json!(c.reasoning_budget_tokens));
    set("tool_call_format", json!(c.tool_call_format));
    set("response_format", c.response_format()?);
    set(
        "tool_choice",
        match c.tool_choice.as_deref() {
            None => json!(null),
            Some(k @ ("auto" | "none" | "required")) => json!(k),
            Some(name) => json!({"name": name}),
        },
    );
    GenerateOptions::from_json(&serde_json::Value::Object(o), Naming::Kebab).map_err(mlex::Error::InvalidArgument)
}

/// Streams a token: text to stdout, reasoning to stderr; tool-call markup is shown parsed at the end.
fn print_token(out: &mut std::io::Stdout, t: &mlex::GeneratedToken) {
    match t.kind {
        TokenKind::Text => {
            let _ = out.write_all(t.text.as_bytes());
            let _ = out.flush();
        }
        TokenKind::Reasoning => eprint!("{}", t.text),
        TokenKind::ToolCall => {}
    }
}

fn print_tool_calls(reply: &mlex::GenerateReply) {
    for c in &reply.tool_calls {
        println!("\n[tool call {}] {}({})", c.id, c.name, c.arguments);
    }
}

fn read(path: &PathBuf) -> mlex::Result<String> {
    std::fs::read_to_string(path).map_err(|e| mlex::Error::io(format!("reading {}", path.display()), e))
}

fn generate(a: GenerateArgs) -> mlex::Result<()> {
    let mut opts = options(&a.sampling, &a.chat)?;
    // One request, then the process ends: a prompt-cache entry could only serve a later process,
    // through --prompt-cache-dir. Without it, the request's caches are not copied out for one.
    if a.model.prompt_cache.prompt_cache_dir.is_none() {
        opts.prompt_cache = Some(false);
    }
    let want_top = opts.top_logprobs.is_some_and(|n| n > 0);
    let session = load(&a.model)?;
    let tools = a.tools.as_ref().map(|p| read(p).and_then(|t| parse_tools_json(&t))).transpose()?;
    let json = a.json;
    let mut out = std::io::stdout();
    let mut first = true;
    let stream = |t: &mlex::GeneratedToken| {
        if std::mem::take(&mut first) {
            mlex::startup_trace::mark("first token");
        }
        if !json {
            print_token(&mut out, t);
        }
        true
    };
    let reply = if let Some(ids) = &a.prompt_tokens {
        session.generate_tokens(ids, opts, stream)?
    } else if let Some(path) = &a.messages {
        let messages = parse_messages_json(&read(path)?)?;
        session.generate_cached(&messages, tools.as_deref(), opts, stream)?
    } else {
        let prompt = a.prompt.as_deref().unwrap_or_default();
        let templated = !a.raw && session.tokenizer()?.has_chat_template();
        if (!a.image.is_empty() || !a.video_frames.is_empty() || a.video.is_some() || !a.audio.is_empty()) && !templated {
            return Err(mlex::Error::InvalidArgument(
                "--image, --video-frames, --video and --audio need the model's chat template (not --raw)".into(),
            )
            .into());
        }
        if templated {
            let mut parts = a
                .image
                .iter()
                .map(|p| mlex::chat::media::read_file(p).map(mlex::chat::ContentPart::Image))
                .collect::<mlex::Result<Vec<_>>>()?;
            if !a.video_frames.is_empty() {
                let frames = a.video_frames.iter().map(|p| mlex::chat::media::read_file(p)).collect::<mlex::Result<Vec<_>>>()?;
                parts.push(mlex::chat::ContentPart::Video(frames));
            }
            if let Some(path) = &a.video {
                let frames = mlex::chat::media::video_from_path(path).map_err(|e| match e {
                    mlex::Error::InvalidArgument(m) => mlex::Error::InvalidArgument(format!("--video {}: {m}", path.display())),
                    other => other,
                })?;
                parts.push(mlex::chat::ContentPart::Video(frames));
            }
            for p in &a.audio {
                parts.push(mlex::chat::ContentPart::Audio(mlex::chat::audio_part::read_audio_file(p)?));
            }
            parts.push(mlex::chat::ContentPart::Text(prompt.to_string()));
            session.generate_cached(&[ChatMessage::user_with_images(parts)], tools.as_deref(), opts, stream)?
        } else {
            session.generate_text(prompt, opts, stream)?
        }
    };
    mlex::startup_trace::mark("reply returned");
    if json {
        let mut v = serde_json::json!({
            "text": reply.text,
            "tokens": reply.tokens,
            "logprobs": reply.logprobs,
            "finish_reason": reply.finish_reason.as_str(),
            "reasoning": reply.reasoning,
            "tool_calls": reply.tool_calls,
            "tool_call_format": reply.tool_call_format,
            "cached_tokens": reply.usage.cached_tokens,
            "usage": reply.usage,
        });
        if want_top {
            // Per token: [{id, text, logprob}], most likely first.
            v["top_logprobs"] = json!(reply.top_logprobs);
        }
        println!("{v}");
    } else {
        print_tool_calls(&reply);
        println!();
        if reply.tool_call_format == Some(mlex::chat::ToolCallFormat::Generic) {
            eprintln!("[the chat template has no tool support: the tools were described in mlex's generic tool prompt]");
        }
        let u = &reply.usage;
        eprintln!(
            "[{} prompt tokens, {:.1} tok/s prefill; {} tokens, {:.1} tok/s decode; ttft {:.0} ms; peak {:.1} MB; {}]",
            u.prompt_tokens,
            u.prefill_tokens_per_second,
            u.completion_tokens,
            u.decode_tokens_per_second,
            u.ttft_ms,
            u.peak_memory_bytes as f64 / 1e6,
            reply.finish_reason.as_str()
        );
    }
    // One shot: the process ends next (`exit_now`), so the model's memory is left to the OS.
    session.end_for_exit();
    Ok(())
}

fn chat(a: ChatArgs) -> mlex::Result<()> {
    let opts = options(&a.sampling, &a.chat)?;
    let session = load(&a.model)?;
    let mut history: Vec<ChatMessage> = a.system.iter().map(ChatMessage::system).collect();
    let tools = a.tools.as_ref().map(|p| read(p).and_then(|t| parse_tools_json(&t))).transpose()?;
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    eprintln!("mlex chat — {} ({} layers). Empty line or Ctrl-D to quit.", session.info().model_type, session.info().num_layers);
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line).map_err(|e| mlex::Error::io("reading stdin", e))? == 0 {
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']);
        if line.is_empty() {
            break;
        }
        history.push(ChatMessage::user(line));
        let reply = session.generate_cached(&history, tools.as_deref(), opts.clone(), |t| {
            print_token(&mut out, t);
            true
        })?;
        print_tool_calls(&reply);
        println!();
        let mut msg = ChatMessage::assistant_with_tool_calls(reply.text, reply.tool_calls);
        msg.reasoning = reply.reasoning;
        history.push(msg);
    }
    Ok(())
}

fn template(a: TemplateArgs) -> mlex::Result<()> {
    let dir = mlex::loader::resolve_model_path(&a.model)?;
    let tok = mlex::tokenizer::Tokenizer::from_dir(&dir)?;
    let messages = parse_messages_json(&read(&a.messages)?)?;
    let tools = a.tools.as_ref().map(|p| read(p).and_then(|t| parse_tools_json(&t))).transpose()?;
    let opts = mlex::tokenizer::TemplateOptions {
        add_generation_prompt: !a.no_generation_prompt,
        tools: tools.as_deref(),
        enable_thinking: a.think.enable_thinking(),
        extra: Default::default(),
    };
    print!("{}", tok.apply_chat_template(&messages, &opts)?);
    Ok(())
}

fn convert(a: ConvertArgs) -> mlex::Result<()> {
    use mlex::convert::{convert_gguf, progress_bar_callback, ConvertOptions};
    let opts = ConvertOptions {
        q_bits: a.q_bits,
        q_group_size: a.q_group_size,
        float: a.float,
        float_dtype: a
            .dtype
            .parse()
            .map_err(|_| mlex::Error::InvalidArgument(format!("--dtype must be f16, bf16 or f32, got '{}'", a.dtype)))?,
    };
    let (bar, mut on_progress) = progress_bar_callback();
    let started = std::time::Instant::now();
    match convert_gguf(&a.gguf, &a.out, &opts, &mut on_progress) {
        Ok(s) => {
            bar.finish_and_clear();
            for w in &s.warnings {
                eprintln!("warning: {w}");
            }
            let mix: Vec<String> =
                s.quantized.iter().map(|((bits, group), n)| format!("{n}× {bits}-bit/g{group}")).collect();
            eprintln!(
                "converted {} ({} tensors: {} lossless, {} re-quantized, {} float{}{}) to {} ({:.1} MB) in {:.1}s",
                s.architecture,
                s.tensors,
                s.lossless,
                s.requantized,
                s.float_tensors,
                if mix.is_empty() { "" } else { "; " },
                mix.join(", "),
                a.out.display(),
                s.safetensors_bytes as f64 / 1e6,
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Err(e) => {
            bar.abandon();
            Err(e)
        }
    }
}
