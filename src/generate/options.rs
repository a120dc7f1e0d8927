//! What a caller asks of one generation, and what comes back.
//!
//! [`GenerateOptions`] is the one schema of a generation's options: every surface reads them
//! through [`GenerateOptions::from_json`] (the Node API with camelCase names, the CLI's flags in
//! kebab-case, JSON bodies in snake_case), so the names, the defaults ([`Default`]) and the checks
//! ([`GenerateOptions::validate`]) are stated once, here.
use super::constraint::ResponseFormat;
use crate::chat::{ToolCall, ToolCallFormat, ToolChoice};
pub use crate::schema::Naming;
use crate::schema::Fields;
use serde::Serialize;
use serde_json::Value;

/// How the next token is chosen. The defaults are greedy decoding with no penalties.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingConfig {
    /// 0 = greedy (argmax); otherwise logits are divided by it before sampling.
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches `top_p` (1 = off).
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens (0 = off).
    pub top_k: u32,
    /// Drop tokens less likely than `min_p` × the top token's probability (0 = off).
    pub min_p: f32,
    /// Divide positive / multiply negative logits of recently seen tokens (1 = off).
    pub repetition_penalty: f32,
    /// How many recent tokens the repetition penalty looks at.
    pub repetition_context_size: usize,
    /// Same seed, same prompt, same options ⇒ same tokens. None draws a fresh seed.
    pub seed: Option<u64>,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        SamplingConfig {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            repetition_context_size: 20,
            seed: None,
        }
    }
}

impl SamplingConfig {
    /// Rejects values no sampler could honour, naming the option.
    pub fn validate(&self) -> Result<(), String> {
        let finite = |name: &str, v: f32| if v.is_finite() { Ok(()) } else { Err(format!("{name} must be a finite number, got {v}")) };
        finite("temperature", self.temperature)?;
        finite("top_p", self.top_p)?;
        finite("min_p", self.min_p)?;
        finite("repetition_penalty", self.repetition_penalty)?;
        if self.temperature < 0.0 {
            return Err(format!("temperature must be >= 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if self.repetition_penalty <= 0.0 {
            return Err(format!("repetition_penalty must be > 0, got {}", self.repetition_penalty));
        }
        Ok(())
    }
}

/// Options of one generation call.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    pub sampling: SamplingConfig,
    /// Generation stops before any of these strings; they never appear in the output.
    pub stop: Vec<String>,
    /// Passed to the chat template as `enable_thinking` (None keeps the template's default).
    pub enable_thinking: Option<bool>,
    /// Most tokens of reasoning before the reasoning span is closed (None = unlimited).
    pub reasoning_budget_tokens: Option<usize>,
    /// Whether to use the session's prompt cache for this call (None = the session's setting).
    pub prompt_cache: Option<bool>,
    /// How the model writes tool calls. None: chosen from the chat template when tools are
    /// passed ([`crate::Session::generate_cached`]); tool calls are parsed only when tools were
    /// passed or a format is set here.
    pub tool_call_format: Option<ToolCallFormat>,
    /// Keep going past end-of-sequence tokens (benchmarks, conformance runs).
    pub ignore_eos: bool,
    /// Prompt tokens processed per forward pass during prefill.
    pub prefill_step_size: usize,
    /// Hold the reply to a JSON Schema, a regex or a Lark grammar (constrained decoding; a
    /// reasoning span the prompt opens stays free). None: free text.
    pub response_format: Option<ResponseFormat>,
    /// Whether the model may (auto, the default), must (required, or one tool by name) or must
    /// not (none: the tools are not shown) call the tools offered. A call it must make is held
    /// to the tools' parameter schemas in its call format.
    pub tool_choice: Option<ToolChoice>,
    /// For each sampled token, this many of the most likely tokens with their log
    /// probabilities (0 to [`MAX_TOP_LOGPROBS`]; None or 0: none). They are of the same
    /// distribution as the token's own `logprob`: the log-softmax of the model's logits after
    /// the repetition penalty and an output constraint's mask, before temperature, top-p,
    /// top-k and min-p (mlx-lm's and OpenAI's convention). Computed on the device in the step
    /// that samples the token; when not asked for, nothing is computed or read.
    pub top_logprobs: Option<usize>,
    /// Speculative decoding with this draft model (a directory or repo id; same tokenizer as
    /// the session's model), loaded on first use and kept. None: the session's draft model
    /// ([`crate::LoadOptions::draft_model`]), if any.
    pub draft_model: Option<String>,
    /// Tokens drafted per step (default 3; 0 turns speculation off for this request).
    pub num_draft_tokens: Option<usize>,
    /// Speculative decoding with drafts looked up in the context (prompt lookup: no second
    /// model; it takes precedence over a draft model). See `generate::speculative`.
    pub prompt_lookup: Option<super::speculative::PromptLookup>,
    /// mlx-lm's KV cache options: a bounded cache (`max_kv_size`) or a quantized one (`kv_bits`,
    /// `kv_group_size`, `quantized_kv_start`). See `generate::kv_options`.
    pub kv_cache: super::kv_options::KvCacheOptions,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 512,
            sampling: SamplingConfig::default(),
            stop: vec![],
            enable_thinking: None,
            reasoning_budget_tokens: None,
            prompt_cache: None,
            tool_call_format: None,
            ignore_eos: false,
            prefill_step_size: 512,
            response_format: None,
            tool_choice: None,
            top_logprobs: None,
            draft_model: None,
            num_draft_tokens: None,
            prompt_lookup: None,
            kv_cache: Default::default(),
        }
    }
}

/// Refuses values that would only ever exhaust memory.
pub const MAX_TOKENS_LIMIT: usize = 1 << 24;

/// The most alternatives `top_logprobs` may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

impl GenerateOptions {
    /// Every option, by its snake_case name (sampling options at the top level).
    pub const FIELDS: &'static [&'static str] = &[
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "repetition_context_size",
        "seed",
        "stop",
        "enable_thinking",
        "reasoning_budget_tokens",
        "prompt_cache",
        "tool_call_format",
        "ignore_eos",
        "prefill_step_size",
        "response_format",
        "tool_choice",
        "top_logprobs",
        "draft_model",
        "num_draft_tokens",
        "prompt_lookup",
        "max_kv_size",
        "kv_bits",
        "kv_group_size",
        "quantized_kv_start",
    ];

    /// Options from a JSON object whose keys are option names as `naming` spells them. Every
    /// option may be left out (or `null`): the [`Default`] value. Unknown names and values of the
    /// wrong type are refused, and the result is [validated](GenerateOptions::validate); every
    /// message names the option as `naming` spells it.
    pub fn from_json(v: &Value, naming: Naming) -> std::result::Result<GenerateOptions, String> {
        let f = Fields::new(v, naming, Self::FIELDS)?;
        let mut o = GenerateOptions::default();
        let s = &mut o.sampling;
        macro_rules! set {
            ($target:expr, $read:ident, $name:literal) => {
                if let Some(x) = f.$read($name)? {
                    $target = x;
                }
            };
        }
        set!(o.max_tokens, count, "max_tokens");
        set!(s.temperature, number, "temperature");
        set!(s.top_p, number, "top_p");
        if let Some(k) = f.count("top_k")? {
            s.top_k = u32::try_from(k).map_err(|_| format!("{} is too large: {k}", f.name("top_k")))?;
        }
        set!(s.min_p, number, "min_p");
        set!(s.repetition_penalty, number, "repetition_penalty");
        set!(s.repetition_context_size, count, "repetition_context_size");
        s.seed = f.count("seed")?.map(|n| n as u64);
        set!(o.stop, strings, "stop");
        o.enable_thinking = f.boolean("enable_thinking")?;
        o.reasoning_budget_tokens = f.count("reasoning_budget_tokens")?;
        o.prompt_cache = f.boolean("prompt_cache")?;
        if let Some(name) = f.string("tool_call_format")? {
            o.tool_call_format = Some(name.parse::<ToolCallFormat>().map_err(|e| format!("{}: {e}", f.name("tool_call_format")))?);
        }
        set!(o.ignore_eos, boolean, "ignore_eos");
        set!(o.prefill_step_size, count, "prefill_step_size");
        if let Some(v) = f.raw("response_format") {
            o.response_format = ResponseFormat::from_json(v, &f.name("response_format"))?;
        }
        if let Some(v) = f.raw("tool_choice") {
            o.tool_choice = Some(ToolChoice::from_json(v, &f.name("tool_choice"))?);
        }
        o.top_logprobs = f.count("top_logprobs")?;
        super::speculative::read_options(&f, &mut o)?;
        o.kv_cache = super::kv_options::KvCacheOptions::read(&f)?;
        o.validate().map_err(|m| naming.respell(&m, Self::FIELDS))?;
        Ok(o)
    }

    /// Rejects values no generation could honour, naming the option (snake_case).
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.max_tokens > MAX_TOKENS_LIMIT {
            return Err(format!("max_tokens = {} is beyond the limit of {MAX_TOKENS_LIMIT}", self.max_tokens));
        }
        if self.prefill_step_size == 0 {
            return Err("prefill_step_size must be at least 1".into());
        }
        if let Some(n) = self.top_logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
            return Err(format!("top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {n}"));
        }
        super::speculative::validate(self)?;
        self.kv_cache.validate()?;
        self.sampling.validate()
    }
}

/// What kind of output a streamed token belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum TokenKind {
    Text,
    Reasoning,
    ToolCall,
}

/// One of the most likely tokens at a step (`top_logprobs`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopLogprob {
    pub id: u32,
    /// The token alone, decoded with special tokens kept (a piece of a multi-byte character
    /// shows as U+FFFD).
    pub text: String,
    /// Natural-log probability, of the same distribution as the sampled token's `logprob`.
    pub logprob: f32,
}

/// One generated token as it streams.
#[derive(Debug, Clone, Serialize)]
pub struct GeneratedToken {
    pub id: u32,
    /// The text this token completes (may be empty while a multi-byte character is pending).
    pub text: String,
    /// Natural-log probability of this token under the model (before sampling filters).
    pub logprob: f32,
    pub kind: TokenKind,
    /// The `top_logprobs` most likely tokens at this step, most likely first (ties: lower id
    /// first, so with greedy decoding the first is this token). Empty when not asked for, and
    /// for tokens that were fed rather than sampled (a reasoning budget's closing marker).
    pub top_logprobs: Vec<TopLogprob>,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The caller stopped it.
    Abort,
    /// The model called tools.
    ToolCalls,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

/// Counts and speeds of one generation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV state came from the prompt cache.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// Time the request waited in the session's queue before the engine took it up (behind
    /// the generations before it).
    pub queue_ms: f64,
    /// Time from the request reaching the engine to the first generated token.
    pub ttft_ms: f64,
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
    /// Host time spent building and scheduling each decode step's graph (ms per step). When it
    /// is close to 1000 / decode tok/s, decoding is bound by the host, not by the device.
    pub schedule_ms_per_step: f64,
    /// The part of `schedule_ms_per_step` spent submitting the built graph (MLX encoding its
    /// kernels); the rest is building it.
    pub submit_ms_per_step: f64,
    /// Host time per decode step blocked on the device to read the token. Near zero while the
    /// host is the bottleneck.
    pub wait_ms_per_step: f64,
    pub peak_memory_bytes: u64,
    /// The most requests that decoded together in one step with this one (1: alone).
    pub batch_size: usize,
    /// Whether it ran in the session's continuous batch; false when the model's caches cannot
    /// batch yet (sliding windows, recurrent states, latent caches): requests then run one after
    /// another.
    pub batched: bool,
    /// Speculative decoding: tokens proposed by the draft (a draft model or prompt lookup).
    pub draft_tokens: usize,
    /// Of `draft_tokens`, those the model accepted.
    pub accepted_draft_tokens: usize,
    /// `accepted_draft_tokens / draft_tokens` (0 without drafts).
    pub acceptance_rate: f64,
    /// Tokens generated per forward pass of the model (1 without speculation).
    pub tokens_per_step: f64,
    /// Greedy prompt lookup builds each pass before the previous one is read, guessing that
    /// every draft is kept: the passes whose guess did not hold (device work thrown away).
    pub dropped_passes: usize,
}

/// The result of a generation.
#[derive(Debug, Clone, Serialize)]
pub struct GenerateReply {
    pub text: String,
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub tokens: Vec<u32>,
    /// Log probability of each token in `tokens`.
    pub logprobs: Vec<f32>,
    /// With `top_logprobs`: the most likely tokens at each step, one list per token in
    /// `tokens` (as [`GeneratedToken::top_logprobs`]); empty when not asked for.
    pub top_logprobs: Vec<Vec<TopLogprob>>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    /// With tools: the format tool calls were asked for and parsed in. `Generic` when the
    /// model's chat template has no tool support: mlex then described the tools in a system
    /// prompt of its own (`chat::generic`), which the model was not trained on.
    pub tool_call_format: Option<ToolCallFormat>,
}

#[cfg(test)]
mod schema_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_are_spelled_per_surface() {
        assert_eq!(Naming::Camel.spell("repetition_context_size"), "repetitionContextSize");
        assert_eq!(Naming::Kebab.spell("top_p"), "--top-p");
        assert_eq!(
            Naming::Camel.respell("top_p must be in (0, 1], got 0; stopped", GenerateOptions::FIELDS),
            "topP must be in (0, 1], got 0; stopped"
        );
    }

    #[test]
    fn every_option_reads_from_json_and_defaults_hold() {
        assert_eq!(format!("{:?}", GenerateOptions::from_json(&json!({}), Naming::Snake).unwrap()), format!("{:?}", GenerateOptions::default()));
        let o = GenerateOptions::from_json(
            &json!({"maxTokens": 7, "temperature": 0.5, "topP": 0.9, "topK": 4, "minP": 0.1, "repetitionPenalty": 1.1,
                    "repetitionContextSize": 8, "seed": 3, "stop": ["x"], "enableThinking": false,
                    "reasoningBudgetTokens": 5, "promptCache": false, "toolCallFormat": "hermes", "ignoreEos": true,
                    "prefillStepSize": 64, "responseFormat": {"type": "regex", "pattern": "a+"}, "toolChoice": "required",
                    "topLogprobs": 20, "draftModel": "d", "numDraftTokens": 2, "promptLookup": {"maxNgram": 2},
                    "kvBits": 4, "kvGroupSize": 32, "quantizedKvStart": 0}),
            Naming::Camel,
        )
        .unwrap();
        assert_eq!((o.max_tokens, o.sampling.top_k, o.sampling.seed, o.stop.clone()), (7, 4, Some(3), vec!["x".to_string()]));
        assert_eq!((o.enable_thinking, o.reasoning_budget_tokens, o.prompt_cache, o.ignore_eos, o.prefill_step_size), (Some(false), Some(5), Some(false), true, 64));
        assert_eq!(o.tool_call_format, Some(ToolCallFormat::Hermes));
        assert_eq!(o.response_format, Some(ResponseFormat::Regex("a+".into())));
        assert_eq!(o.tool_choice, Some(ToolChoice::Required));
        assert_eq!(o.top_logprobs, Some(20));
        assert_eq!((o.draft_model.as_deref(), o.num_draft_tokens), (Some("d"), Some(2)));
        assert_eq!(o.prompt_lookup.map(|p| (p.max_ngram, p.num_draft_tokens)), Some((2, None)));
        // Every field of FIELDS was set above (so each has a reader).
        // (max_kv_size, which kv_bits excludes, is read in kv_options' tests.)
        assert_eq!((o.kv_cache.kv_bits, o.kv_cache.kv_group_size, o.kv_cache.quantized_kv_start), (Some(4), Some(32), Some(0)));
        assert_eq!(GenerateOptions::FIELDS.len(), 25);
    }

    #[test]
    fn bad_options_are_refused_in_the_callers_spelling() {
        let err = |v: Value, n: Naming| match GenerateOptions::from_json(&v, n) {
            Ok(o) => panic!("{v} accepted: {o:?}"),
            Err(e) => e,
        };
        assert!(err(json!({"maxTokens": -1}), Naming::Camel).starts_with("maxTokens must be a non-negative integer"));
        assert!(err(json!({"max_tokens": 1.5}), Naming::Snake).starts_with("max_tokens must be a non-negative integer"));
        assert!(err(json!({"--top-p": 0}), Naming::Kebab).starts_with("--top-p must be in (0, 1]"));
        assert!(err(json!({"topP": 0}), Naming::Camel).starts_with("topP must be in (0, 1]"));
        assert!(err(json!({"stop": "x"}), Naming::Camel).starts_with("stop must be an array of strings"));
        assert!(err(json!({"maxToken": 3}), Naming::Camel).contains("unknown option \"maxToken\""));
        assert!(err(json!({"toolCallFormat": "nonsense"}), Naming::Camel).starts_with("toolCallFormat: "));
        assert!(err(json!({"max_tokens": 1u64 << 30}), Naming::Snake).contains("beyond the limit"));
        assert!(err(json!([1]), Naming::Snake).contains("must be an object"));
        assert_eq!(err(json!({"topLogprobs": 21}), Naming::Camel), "topLogprobs must be in [0, 20], got 21");
        assert_eq!(err(json!({"--top-logprobs": 21}), Naming::Kebab), "--top-logprobs must be in [0, 20], got 21");
        assert!(err(json!({"top_logprobs": -1}), Naming::Snake).starts_with("top_logprobs must be a non-negative integer"));
    }
}
