//! The engine thread: it alone touches MLX (MLX is not thread-safe and its GPU streams are
//! thread-local). It loads the model, then serves generation jobs one at a time, FIFO, streaming
//! events back over each job's channel (the mistral.rs pattern).
use super::generator::{self, Flow, TokenStep};
use super::options::{FinishReason, GenerateOptions, GenerateReply, GeneratedToken, TokenKind, Usage};
use super::prompt_cache::PromptCachePool;
use super::text::TextStream;
use crate::error::{Error, Result};
use crate::loader::{ModelConfig, WeightStore};
use crate::mlx::{self, Device, Dtype};
use crate::models::{build_model, DecoderModel};
use crate::session::PromptCacheConfig;
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

pub struct GenerateJob {
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    pub abort: Arc<AtomicBool>,
    pub events: Sender<Event>,
}

pub enum Command {
    Generate(GenerateJob),
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
    model: DecoderModel,
    tokenizer: Option<Arc<Tokenizer>>,
    eos: Vec<u32>,
}

/// Entry point of the engine thread: load, report, serve until Shutdown or all senders drop.
pub fn run(spec: EngineSpec, ready: Sender<Result<LoadedFacts>>, commands: Receiver<Command>) {
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
                let events = job.events.clone();
                // A panic inside one job must not take the engine (or the host process) down (the
                // pool is only read by copy and written after success: a panic leaves it intact).
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.generate(&job, &mut pool)));
                let done = match res {
                    Ok(r) => r,
                    Err(p) => Err(Error::Mlx(format!("internal error: {}", panic_message(&p)))),
                };
                let _ = events.send(Event::Done(done));
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
    let model = build_model(&spec.dir, spec.config.clone(), &mut weights)?;
    weights.finish()?;
    let params = model.parameters();
    mlx::eval(&params)?;
    let weights_bytes = params.iter().map(|a| a.nbytes()).sum();
    let dtype = model.norm.weight.dtype();
    drop(params);
    let facts = LoadedFacts { dtype, device: spec.device, weights_bytes };
    Ok((Engine { model, tokenizer: spec.tokenizer.clone(), eos: spec.eos.clone() }, facts))
}

impl Engine {
    fn generate(&self, job: &GenerateJob, pool: &mut PromptCachePool) -> Result<GenerateReply> {
        let opts = &job.options;
        let use_pool = opts.prompt_cache != Some(false) && pool.cacheable(&job.prompt);
        let reuse = if use_pool { pool.lookup(&job.prompt, Instant::now()) } else { None };
        let mut caches = match reuse {
            Some(r) => r.caches,
            None => self.model.new_caches(),
        };
        // Every sampled token in order: the generator feeds each one back (pipelined) before
        // handing it over, so the caches end up holding the prompt and a prefix of these.
        let mut sampled: Vec<u32> = vec![];
        let mut text = TextStream::new(self.tokenizer.as_deref(), &opts.stop);
        let mut tokens = vec![];
        let mut logprobs = vec![];
        let mut finish = FinishReason::Length;
        let emit = |t: GeneratedToken| job.events.send(Event::Token(t)).is_ok();
        // A token whose text is partly held back (incomplete character, possible stop string) is
        // itself held until the next one arrives, so that text flushed at the end can join it:
        // every token is streamed exactly once.
        let mut held: Option<GeneratedToken> = None;
        // A completed stop string drops what is held back; every other ending flushes it.
        let mut stop_string_hit = false;

        if job.abort.load(Ordering::Relaxed) {
            return Err(Error::Aborted);
        }
        let run = generator::run(&self.model, &mut caches, &job.prompt, opts, |step: TokenStep| {
            sampled.push(step.id);
            if job.abort.load(Ordering::Relaxed) {
                finish = FinishReason::Abort;
                return Ok(Flow::Stop);
            }
            if !opts.ignore_eos && self.eos.contains(&step.id) {
                finish = FinishReason::Stop;
                return Ok(Flow::Stop);
            }
            tokens.push(step.id);
            logprobs.push(step.logprob);
            let delta = text.push(step.id)?;
            let token = GeneratedToken { id: step.id, text: delta.text, logprob: step.logprob, kind: TokenKind::Text };
            let mut sent = held.take().is_none_or(&emit);
            if text.has_pending() && !delta.stopped {
                held = Some(token);
            } else {
                sent = sent && emit(token);
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
            Ok(Flow::Continue)
        });
        // The pipelined step after the last token may still be running on MLX's stream thread:
        // wait for it on every path, so nothing of this job outlives it (the host may exit next).
        let _ = mlx::synchronize();
        let stats = run?;
        if use_pool {
            // Exactly the tokens whose keys/values the caches hold (an EOS fed by the pipelined
            // step included; a sampled token never fed excluded).
            let held = caches.first().map_or(0, |c| c.offset);
            if held >= job.prompt.len() && held - job.prompt.len() <= sampled.len() {
                let mut seq = job.prompt.clone();
                seq.extend_from_slice(&sampled[..held - job.prompt.len()]);
                // A failure to keep the state only costs a later call its reuse.
                let _ = pool.store(seq, caches, Instant::now());
            }
        }
        let tail = if stop_string_hit { String::new() } else { text.finish()?.text };
        if let Some(mut last) = held {
            last.text.push_str(&tail);
            emit(last);
        }
        let usage = Usage {
            prompt_tokens: job.prompt.len(),
            cached_tokens: job.prompt.len() - stats.prefilled,
            completion_tokens: tokens.len(),
            ttft_ms: stats.ttft_s * 1e3,
            prefill_tokens_per_second: if stats.ttft_s > 0.0 { stats.prefilled as f64 / stats.ttft_s } else { 0.0 },
            decode_tokens_per_second: if stats.decode_s > 0.0 && stats.generated > 1 {
                (stats.generated - 1) as f64 / stats.decode_s
            } else {
                0.0
            },
            peak_memory_bytes: stats.peak_memory as u64,
        };
        Ok(GenerateReply {
            text: text.text,
            reasoning: None,
            tool_calls: vec![],
            tokens,
            logprobs,
            finish_reason: finish,
            usage,
        })
    }
}
