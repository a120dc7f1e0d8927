//! The engine thread: it alone touches MLX (MLX is not thread-safe and its GPU streams are
//! thread-local). It loads the model, then serves generation jobs one at a time, FIFO, writing
//! each job's events into the job's own sink (the mistral.rs pattern): a channel for the Rust
//! API, straight into a Node stream's queue for the addon, with no relay thread in between.
use super::generator::{self, Flow, TokenStep};
use super::options::{FinishReason, GenerateOptions, GenerateReply, GeneratedToken, TokenKind, Usage};
use super::prompt_cache::{PromptCacheConfig, PromptCachePool};
use super::text::TextStream;
use crate::chat::{ChatMessage, OutputClassifier, Segment, SpanKind, Tool};
use crate::error::{Error, Result};
use crate::loader::{ModelConfig, Vb, WeightStore};
use crate::mlx::{self, Device, Dtype};
use crate::models::{build_model, CausalLm};
use crate::tokenizer::Tokenizer;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};

use std::sync::Arc;
use std::time::Instant;

/// What the engine streams back for one job.
pub enum Event {
    Token(GeneratedToken),
    Done(Result<GenerateReply>),
}

/// Where the engine writes one job's events, from the engine thread. `send` returns false once
/// nobody listens any more (the engine then stops that job as if aborted); `Done` always comes last.
pub struct Sink(std::sync::Mutex<Box<dyn FnMut(Event) -> bool + Send>>);

impl Sink {
    pub fn new(f: impl FnMut(Event) -> bool + Send + 'static) -> Self {
        Sink(std::sync::Mutex::new(Box::new(f)))
    }

    /// A sink feeding a channel, and the channel's receiving end.
    pub fn channel() -> (Sink, std::sync::mpsc::Receiver<Event>) {
        let (tx, rx) = std::sync::mpsc::channel();
        (Sink::new(move |e| tx.send(e).is_ok()), rx)
    }

    /// Hands `e` to the sink. A sink that panics counts as gone (the engine thread, serving
    /// every other request, must not go down with it).
    pub fn send(&self, e: Event) -> bool {
        match self.0.lock() {
            Ok(mut f) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(e))).unwrap_or(false),
            Err(_) => false,
        }
    }
}

/// A prompt as the caller gave it: token ids, or a chat transcript the engine renders through
/// the chat template and encodes (on the engine thread, not the caller's).
pub enum JobPrompt {
    Tokens(Vec<u32>),
    Chat { messages: Vec<ChatMessage>, enable_thinking: Option<bool> },
}

pub struct GenerateJob {
    pub prompt: JobPrompt,
    pub options: GenerateOptions,
    /// The tools offered (rendered into a chat prompt; their schemas type parsed tool-call arguments).
    pub tools: Option<Vec<Tool>>,
    pub abort: Arc<AtomicBool>,
    pub events: Sink,
    /// When the caller queued it (`Usage::queue_ms`).
    pub queued_at: Instant,
}

pub enum Command {
    Generate(GenerateJob),
    /// The MLX operations one decode step builds, by primitive (`mlex bench --graph`).
    Census(Sender<Result<Vec<(String, usize)>>>),
    Shutdown,
}

/// Everything the engine needs to load a model.
pub struct EngineSpec {
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub device: Device,
    pub dtype: Option<Dtype>,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub eos: Vec<u32>,
    /// Random weights (seeded) instead of the directory's safetensors: benchmarks of real shapes.
    pub synthetic_seed: Option<u64>,
    /// The automatic prompt cache's settings (the pool lives on the engine thread).
    pub prompt_cache: PromptCacheConfig,
}

/// Facts about the loaded model reported back to the session.
#[derive(Debug, Clone)]
pub struct LoadedFacts {
    pub dtype: Dtype,
    pub device: Device,
    pub weights_bytes: usize,
}

struct Engine {
    model: Box<dyn CausalLm>,
    tokenizer: Option<Arc<Tokenizer>>,
    eos: Vec<u32>,
}

/// Entry point of the engine thread: load, report, serve until Shutdown or all senders drop.
pub fn run(spec: EngineSpec, ready: Sender<Result<LoadedFacts>>, commands: Receiver<Command>) {
    // Benchmark ablations reach the kernels before the model is built.
    crate::ablation::get();
    let engine = match load(&spec) {
        Ok((engine, facts)) => {
            let _ = ready.send(Ok(facts));
            engine
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut pool = PromptCachePool::new(spec.prompt_cache.clone());
    loop {
        // While idle, wake up when a pooled entry outlives its TTL, so its memory comes back
        // without waiting for the next call.
        let cmd = match pool.next_expiry() {
            Some(at) => match commands.recv_timeout(at.saturating_duration_since(Instant::now())) {
                Ok(cmd) => cmd,
                Err(RecvTimeoutError::Timeout) => {
                    if pool.expire(Instant::now()) > 0 {
                        mlx::clear_cache();
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            },
            None => match commands.recv() {
                Ok(cmd) => cmd,
                Err(_) => break,
            },
        };
        match cmd {
            Command::Generate(job) => {
                // A panic inside one job must not take the engine (or the host process) down (the
                // pool is only read by copy and written after success: a panic leaves it intact).
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.generate(&job, &mut pool)));
                let done = match res {
                    Ok(r) => r,
                    Err(p) => Err(Error::Mlx(format!("internal error: {}", panic_message(&p)))),
                };
                job.events.send(Event::Done(done));
            }
            Command::Census(reply) => {
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.decode_step_census()));
                let _ = reply.send(res.unwrap_or_else(|p| Err(Error::Mlx(format!("internal error: {}", panic_message(&p))))));
            }
            Command::Shutdown => break,
        }
    }
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default()
}

fn load(spec: &EngineSpec) -> Result<(Engine, LoadedFacts)> {
    mlx::set_default_device(spec.device)?;
    let mut weights = match spec.synthetic_seed {
        Some(seed) => WeightStore::synthetic(spec.config.quantization.clone(), spec.dtype.unwrap_or(Dtype::Bfloat16), seed)?,
        None => WeightStore::open(&spec.dir)?,
    };
    weights.compute_dtype = spec.dtype;
    let weights = std::cell::RefCell::new(weights);
    let model = build_model(&spec.config, &Vb::new(&weights, spec.config.quantization.as_ref()))?;
    weights.into_inner().finish()?;
    let params = model.parameters();
    mlx::eval(&params)?;
    // Let the device finish and release what loading consumed (the unfused q/k/v and gate/up
    // parts, the pre-cast tensors) before the first generation measures its peak: on the GPU the
    // inputs of finished kernels are released by completion handlers, not by eval itself.
    mlx::synchronize()?;
    mlx::clear_cache();
    let weights_bytes = params.iter().map(|a| a.nbytes()).sum();
    let dtype = model.dtype();
    drop(params);
    let facts = LoadedFacts { dtype, device: spec.device, weights_bytes };
    Ok((Engine { model, tokenizer: spec.tokenizer.clone(), eos: spec.eos.clone() }, facts))
}

impl Engine {
    /// The operations of one decode step after an 8-token prompt, counted by primitive, most
    /// frequent first (what per-operation overhead scales with on a GPU).
    fn decode_step_census(&self) -> Result<Vec<(String, usize)>> {
        let mut caches = self.model.make_caches();
        let prompt = mlx::Array::from_slice(&[1u32, 2, 3, 4, 5, 6, 7, 8], &[1, 8])?;
        self.model.forward(&prompt, &mut caches)?;
        mlx::eval(&caches.state())?;
        let logits = self.model.forward(&mlx::Array::from_slice(&[9u32], &[1, 1])?, &mut caches)?;
        let state: Vec<&mlx::Array> = std::iter::once(&logits).chain(caches.state()).collect();
        mlx::graph_census(&state)
    }

    /// The job's prompt as token ids (a chat transcript rendered and encoded here).
    fn prompt_ids(&self, job: &GenerateJob) -> Result<Vec<u32>> {
        let ids = match &job.prompt {
            JobPrompt::Tokens(ids) => ids.clone(),
            JobPrompt::Chat { messages, enable_thinking } => {
                let tok = self.tokenizer.as_deref().ok_or_else(|| {
                    Error::Tokenizer("this model has no tokenizer.json: only token-id prompts work".into())
                })?;
                tok.encode_chat(messages, job.tools.as_deref(), *enable_thinking)?
            }
        };
        if ids.is_empty() {
            return Err(Error::InvalidArgument("the prompt is empty: at least one token is needed".into()));
        }
        Ok(ids)
    }

    fn generate(&self, job: &GenerateJob, pool: &mut PromptCachePool) -> Result<GenerateReply> {
        let queue_ms = job.queued_at.elapsed().as_secs_f64() * 1e3;
        if job.abort.load(Ordering::Relaxed) {
            return Err(Error::Aborted);
        }
        let prompt = self.prompt_ids(job)?;
        let prompt = &prompt;
        let opts = &job.options;
        let use_pool = opts.prompt_cache != Some(false) && pool.cacheable(prompt);
        let reuse = if use_pool { pool.lookup(prompt, Instant::now()) } else { None };
        let mut caches = match reuse {
            Some(r) => r.caches,
            None => self.model.make_caches(),
        };
        // Every sampled token in order: the generator feeds each one back (pipelined) before
        // handing it over, so the caches end up holding the prompt and a prefix of these.
        let mut sampled: Vec<u32> = vec![];
        let mut text = TextStream::new(self.tokenizer.as_deref(), &opts.stop);
        let mut out = OutputStream::new(self.tokenizer.as_deref(), prompt, opts)?;
        let mut tokens = vec![];
        let mut logprobs = vec![];
        let mut finish = FinishReason::Length;
        let emit = |t: GeneratedToken| job.events.send(Event::Token(t));
        // A completed stop string drops what is held back; every other ending flushes it.
        let mut stop_string_hit = false;

        if job.abort.load(Ordering::Relaxed) {
            return Err(Error::Aborted);
        }
        // States that cannot be trimmed back are also kept where the prompt ends, so that a next
        // turn whose history re-renders this reply differently still resumes from the prompt.
        let mut snapshot = None;
        let snap = if use_pool { Some(&mut snapshot) } else { None };
        let run = generator::run(self.model.as_ref(), &mut caches, prompt, opts, snap, |step: TokenStep| {
            sampled.push(step.id);
            if job.abort.load(Ordering::Relaxed) {
                finish = FinishReason::Abort;
                return Ok(Flow::Stop);
            }
            if !step.forced && !opts.ignore_eos && self.eos.contains(&step.id) {
                finish = FinishReason::Stop;
                return Ok(Flow::Stop);
            }
            // Budget 0 and the prompt opened the reasoning: close it before its first token.
            if !step.forced && out.budget_spent() {
                out.forced = true;
                return Ok(Flow::Replace(out.forced_close.clone()));
            }
            let was_reasoning = out.classifier.in_reasoning();
            tokens.push(step.id);
            logprobs.push(step.logprob);
            let delta = text.push(step.id)?;
            let text_pending = text.has_pending() && !delta.stopped;
            let ready = out.accept(step, &delta.text, text_pending);
            let mut sent = true;
            for t in ready {
                sent = sent && emit(t);
            }
            if !sent {
                finish = FinishReason::Abort;
                return Ok(Flow::Stop);
            }
            if delta.stopped {
                stop_string_hit = true;
                finish = FinishReason::Stop;
                return Ok(Flow::Stop);
            }
            if out.classifier.stop_requested() {
                finish = FinishReason::Stop;
                return Ok(Flow::Stop);
            }
            if !step.forced {
                if was_reasoning {
                    out.reasoning_tokens += 1;
                }
                if out.budget_spent() {
                    out.forced = true;
                    return Ok(Flow::Force(out.forced_close.clone()));
                }
            }
            Ok(Flow::Continue)
        });
        // The pipelined step after the last token may still be running on MLX's stream thread:
        // wait for it on every path, so nothing of this job outlives it (the host may exit next).
        let _ = mlx::synchronize();
        let stats = run?;
        if let Some(snap) = snapshot {
            let _ = pool.store(prompt[..prompt.len() - 1].to_vec(), snap, Instant::now());
        }
        if use_pool {
            // Exactly the tokens whose keys/values the caches hold (an EOS fed by the pipelined
            // step included; a sampled token never fed excluded).
            let held = caches.offset();
            if held >= prompt.len() && held - prompt.len() <= sampled.len() {
                let mut seq = prompt.clone();
                seq.extend_from_slice(&sampled[..held - prompt.len()]);
                // A failure to keep the state only costs a later call its reuse.
                let _ = pool.store(seq, caches, Instant::now());
            }
        }
        let tail = if stop_string_hit { String::new() } else { text.finish()?.text };
        for t in out.finish(&tail) {
            emit(t);
        }
        let output = out.classifier.into_output(job.tools.as_deref());
        if !output.tool_calls.is_empty() && finish == FinishReason::Stop {
            finish = FinishReason::ToolCalls;
        }
        let per_step = |s: f64| if stats.steps_scheduled > 0 { s * 1e3 / stats.steps_scheduled as f64 } else { 0.0 };
        let usage = Usage {
            prompt_tokens: prompt.len(),
            cached_tokens: prompt.len() - stats.prefilled,
            completion_tokens: tokens.len(),
            queue_ms,
            ttft_ms: stats.ttft_s * 1e3,
            prefill_tokens_per_second: if stats.ttft_s > 0.0 { stats.prefilled as f64 / stats.ttft_s } else { 0.0 },
            decode_tokens_per_second: if stats.decode_s > 0.0 && stats.generated > 1 {
                (stats.generated - 1) as f64 / stats.decode_s
            } else {
                0.0
            },
            schedule_ms_per_step: per_step(stats.schedule_s),
            submit_ms_per_step: per_step(stats.submit_s),
            wait_ms_per_step: if stats.generated > 1 { stats.wait_s * 1e3 / (stats.generated - 1) as f64 } else { 0.0 },
            peak_memory_bytes: stats.peak_memory as u64,
        };
        Ok(GenerateReply {
            text: output.text,
            reasoning: output.reasoning,
            tool_calls: output.tool_calls,
            tokens,
            logprobs,
            finish_reason: finish,
            usage,
        })
    }
}

fn kind_of(k: SpanKind) -> TokenKind {
    match k {
        SpanKind::Text => TokenKind::Text,
        SpanKind::Reasoning => TokenKind::Reasoning,
        SpanKind::ToolCall => TokenKind::ToolCall,
    }
}

/// Classifies streamed text into text / reasoning / tool-call pieces, one kind per token, and
/// keeps count of the reasoning budget.
struct OutputStream {
    classifier: OutputClassifier,
    /// A token whose text is partly held back (incomplete character, possible stop string,
    /// possible marker) is itself held until its text resolves, so that it takes the kind of
    /// what it turned out to be, and text flushed at the end can join it: every token is
    /// streamed exactly once.
    /// With each: whether its kind is settled (forced tokens are reasoning whatever follows).
    held: Vec<(GeneratedToken, bool)>,
    /// Pieces of a token's text that belong to a later kind than the token's: they ride on the
    /// next token.
    carry: Vec<Segment>,
    budget: Option<usize>,
    reasoning_tokens: usize,
    /// Token ids that close the reasoning span (empty: no reasoning format, or no budget).
    forced_close: Vec<u32>,
    /// The closer was forced already (once per reply).
    forced: bool,
}

impl OutputStream {
    fn new(tokenizer: Option<&crate::tokenizer::Tokenizer>, prompt: &[u32], opts: &GenerateOptions) -> Result<Self> {
        let reasoning = tokenizer.and_then(|t| t.reasoning_format());
        let starts_inside = match (reasoning, tokenizer) {
            (Some(f), Some(t)) => {
                let tail = t.decode(&prompt[prompt.len().saturating_sub(16)..], false)?;
                f.prompt_opens_reasoning(&tail)
            }
            _ => false,
        };
        let forced_close = match (reasoning, tokenizer, opts.reasoning_budget_tokens) {
            (Some(f), Some(t), Some(_)) => t.encode(f.forced_close(), false)?,
            _ => vec![],
        };
        Ok(Self::with_classifier(
            OutputClassifier::new(reasoning, opts.tool_call_format, starts_inside),
            opts.reasoning_budget_tokens,
            forced_close,
        ))
    }

    fn with_classifier(classifier: OutputClassifier, budget: Option<usize>, forced_close: Vec<u32>) -> Self {
        OutputStream {
            classifier,
            held: Vec::new(),
            carry: Vec::new(),
            budget,
            reasoning_tokens: 0,
            forced_close,
            forced: false,
        }
    }

    /// Takes one token's decoded text (`text_pending`: the detokenizer / stop strings still hold
    /// some of it back); returns the tokens ready to stream, in order.
    fn accept(&mut self, step: TokenStep, delta: &str, text_pending: bool) -> Vec<GeneratedToken> {
        let (mut kind, piece) = self.push(delta);
        if step.forced {
            kind = TokenKind::Reasoning;
        }
        let token = GeneratedToken { id: step.id, text: piece, logprob: step.logprob, kind };
        if text_pending || self.classifier.has_pending() {
            self.held.push((token, step.forced));
            return Vec::new();
        }
        let kind = token.kind;
        let mut ready = self.settle(kind);
        ready.push(token);
        ready
    }

    /// The held tokens, those with no text of their own taking `kind`.
    fn settle(&mut self, kind: TokenKind) -> Vec<GeneratedToken> {
        self.held
            .drain(..)
            .map(|(mut h, settled)| {
                if h.text.is_empty() && !settled {
                    h.kind = kind;
                }
                h
            })
            .collect()
    }

    /// Inside the reasoning with its budget used up (and a way to close it).
    fn budget_spent(&self) -> bool {
        self.classifier.in_reasoning()
            && !self.forced
            && !self.forced_close.is_empty()
            && self.budget.is_some_and(|b| self.reasoning_tokens >= b)
    }

    /// Classifies a token's text: its kind and the text it carries.
    fn push(&mut self, delta: &str) -> (TokenKind, String) {
        let mut segs = std::mem::take(&mut self.carry);
        for s in self.classifier.push(delta) {
            match segs.last_mut() {
                Some(last) if last.kind == s.kind => last.text.push_str(&s.text),
                _ => segs.push(s),
            }
        }
        if segs.is_empty() {
            return (kind_of(self.classifier.current_kind()), String::new());
        }
        let first = segs.remove(0);
        self.carry = segs.into_iter().filter(|s| !s.text.is_empty()).collect();
        (kind_of(first.kind), first.text)
    }

    /// The rest of the output at its end (`tail`: what the detokenizer flushed): the held
    /// tokens, the last one carrying what was held back. A piece of a different kind than that
    /// token's (a token's text that spans two kinds, right at the end) is in the reply only.
    fn finish(&mut self, tail: &str) -> Vec<GeneratedToken> {
        let mut segs = std::mem::take(&mut self.carry);
        segs.extend(self.classifier.push(tail));
        segs.extend(self.classifier.finish());
        let mut rest: Vec<Segment> = Vec::new();
        for s in segs.into_iter().filter(|s| !s.text.is_empty()) {
            match rest.last_mut() {
                Some(last) if last.kind == s.kind => last.text.push_str(&s.text),
                _ => rest.push(s),
            }
        }
        let final_kind = rest.first().map_or(kind_of(self.classifier.current_kind()), |s| kind_of(s.kind));
        let mut held = self.settle(final_kind);
        if let (Some(last), Some(first)) = (held.last_mut(), rest.first()) {
            if kind_of(first.kind) == last.kind {
                last.text.push_str(&first.text);
            }
        }
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ReasoningFormat, ToolCallFormat};

    /// Streams `pieces` (one per token) through an OutputStream; returns the streamed tokens.
    fn stream(out: &mut OutputStream, pieces: &[&str]) -> Vec<GeneratedToken> {
        let mut got = Vec::new();
        for (i, p) in pieces.iter().enumerate() {
            got.extend(out.accept(TokenStep { id: i as u32, logprob: -0.5, forced: false }, p, false));
        }
        got.extend(out.finish(""));
        got
    }

    fn of(tokens: &[GeneratedToken], kind: TokenKind) -> String {
        tokens.iter().filter(|t| t.kind == kind).map(|t| t.text.as_str()).collect()
    }

    #[test]
    fn every_token_once_with_kinds_from_markers() {
        let c = OutputClassifier::new(Some(ReasoningFormat::Think), Some(ToolCallFormat::Hermes), false);
        let mut out = OutputStream::with_classifier(c, None, vec![]);
        let pieces = [
            "<", "think", ">", "\n", "Need", " weather", ".\n", "</", "think>", "\n\n", "Checking", ".", "\n\n",
            "<tool_call>", "\n{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Paris\"}}", "\n", "</tool_call>",
        ];
        let tokens = stream(&mut out, &pieces);
        assert_eq!(tokens.iter().map(|t| t.id).collect::<Vec<_>>(), (0..pieces.len() as u32).collect::<Vec<_>>());
        let kinds: Vec<TokenKind> = tokens.iter().map(|t| t.kind).collect();
        use TokenKind::*;
        assert_eq!(
            kinds,
            [
                Reasoning, Reasoning, Reasoning, Reasoning, Reasoning, Reasoning, Reasoning, Reasoning, Reasoning,
                Text, Text, Text, ToolCall, ToolCall, ToolCall, ToolCall, ToolCall, ToolCall
            ]
        );
        assert_eq!(of(&tokens, Text), "Checking.");
        assert_eq!(of(&tokens, Reasoning), "Need weather.");
        assert!(of(&tokens, ToolCall).starts_with("<tool_call>"));
        let reply = out.classifier.into_output(None);
        assert_eq!(reply.text, "Checking.");
        assert_eq!(reply.reasoning.as_deref(), Some("Need weather."));
        assert_eq!(reply.tool_calls[0].name, "get_weather");
    }

    #[test]
    fn text_spanning_two_kinds_rides_on_the_next_token() {
        let c = OutputClassifier::new(Some(ReasoningFormat::Think), None, true);
        let mut out = OutputStream::with_classifier(c, None, vec![]);
        let tokens = stream(&mut out, &["abc</think>Hel", "lo", " world"]);
        assert_eq!(tokens.len(), 3);
        assert_eq!((tokens[0].kind, tokens[0].text.as_str()), (TokenKind::Reasoning, "abc"));
        assert_eq!((tokens[1].kind, tokens[1].text.as_str()), (TokenKind::Text, "Hello"));
        assert_eq!((tokens[2].kind, tokens[2].text.as_str()), (TokenKind::Text, " world"));
    }

    #[test]
    fn held_text_joins_the_last_token_at_the_end() {
        let c = OutputClassifier::new(Some(ReasoningFormat::Think), None, false);
        let mut out = OutputStream::with_classifier(c, None, vec![]);
        let tokens = stream(&mut out, &["Answer", "\n", "<th"]);
        assert_eq!(tokens.len(), 3);
        assert!(tokens.iter().all(|t| t.kind == TokenKind::Text));
        assert_eq!(of(&tokens, TokenKind::Text), "Answer\n<th");
        assert_eq!(out.classifier.into_output(None).text, "Answer\n<th");
    }

    #[test]
    fn budget_counts_tokens_inside_reasoning() {
        let c = OutputClassifier::new(Some(ReasoningFormat::Think), None, false);
        let mut out = OutputStream::with_classifier(c, Some(2), vec![7, 8]);
        let step = |id| TokenStep { id, logprob: 0.0, forced: false };
        out.accept(step(0), "<think>", false);
        assert!(!out.budget_spent());
        out.accept(step(1), "a", false);
        out.reasoning_tokens += 1;
        assert!(!out.budget_spent());
        out.accept(step(2), "b", false);
        out.reasoning_tokens += 1;
        assert!(out.budget_spent());
        out.forced = true;
        assert!(!out.budget_spent());
        let t = out.accept(TokenStep { id: 7, logprob: 0.0, forced: true }, "</think>", false);
        assert!(t.iter().all(|t| t.kind == TokenKind::Reasoning));
        assert!(!out.classifier.in_reasoning());
    }
}
