//! What a caller asks of one generation, and what comes back.
use crate::chat::{ToolCall, ToolCallFormat};
use serde::Serialize;

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
        }
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

/// One generated token as it streams.
#[derive(Debug, Clone, Serialize)]
pub struct GeneratedToken {
    pub id: u32,
    /// The text this token completes (may be empty while a multi-byte character is pending).
    pub text: String,
    /// Natural-log probability of this token under the model (before sampling filters).
    pub logprob: f32,
    pub kind: TokenKind,
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
    pub finish_reason: FinishReason,
    pub usage: Usage,
}
