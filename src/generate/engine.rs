//! The engine thread: it alone touches MLX (MLX is not thread-safe and its GPU streams are
//! thread-local). It loads the model, then serves generation jobs (together, as a continuous
//! batch, where the model allows: `generate::batch`; else one at a time, FIFO), writing
//! each job's events into the job's own sink (the mistral.rs pattern): a channel for the Rust
//! API, straight into a Node stream's queue for the addon, with no relay thread in between.
use super::batch::Batch;
use super::constraint::{reasoning_gate, Constraint, Grammars};
use super::generator::{self, TokenStep};
use super::options::{GenerateOptions, GenerateReply, GeneratedToken};
use super::prompt_cache::{PromptCacheConfig, PromptCachePool};
use super::prompt_disk::{self, DiskCache};
use super::request::{self, Reply};
use super::speculative::{self, DraftModel, Drafts};
use crate::chat::{ChatMessage, Tool};
use crate::models::vision_lm::is_media_token;
use crate::error::{Error, Result};
use crate::loader::{ModelConfig, Vb, WeightStore};
use crate::mlx::{self, Device, Dtype};
use crate::models::{build_model, CausalLm};
use crate::nn::LayerCaches;
use crate::tokenizer::Tokenizer;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};

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
    /// Ends the engine once the requests queued before it finish. `free_memory: false` is for a
    /// process about to exit (`Session::end_for_exit`): queued prompt-cache writes still reach
    /// the disk, but the model and its caches are left to the OS rather than freed one buffer at
    /// a time.
    Shutdown { free_memory: bool },
}

/// Everything the engine needs to load a model.
pub struct EngineSpec {
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub device: Device,
    pub dtype: Option<Dtype>,
    /// The tokenizer and the EOS ids, sent by the session once it has loaded them (on its own
    /// thread, while this one maps and builds the weights); the sender dropped unsent means the
    /// tokenizer failed to load (the session reports why).
    pub tokenizer: Receiver<(Option<Arc<Tokenizer>>, Vec<u32>)>,
    /// Random weights (seeded) instead of the directory's safetensors: benchmarks of real shapes.
    pub synthetic_seed: Option<u64>,
    /// The automatic prompt cache's settings (the pool lives on the engine thread).
    pub prompt_cache: PromptCacheConfig,
    /// The most requests decoding together (continuous batching); more wait their turn.
    pub max_batch: usize,
    /// Cache bytes the requests in flight may set aside together (None: from MLX's memory limit).
    pub kv_budget: Option<usize>,
    /// A draft model for speculative decoding, loaded with the model (`generate::speculative`).
    pub draft_model: Option<String>,
    /// The most tokens a sequence may hold, prompt and reply (None: no limit).
    pub context_length: Option<usize>,
    /// 8-bit activations in the CPU's quantized products (LoadOptions::int8_activations).
    pub int8_activations: bool,
}

/// Facts about the loaded model reported back to the session.
#[derive(Debug, Clone)]
pub struct LoadedFacts {
    pub dtype: Dtype,
    pub device: Device,
    pub weights_bytes: usize,
    /// The model has a vision tower (image parts are taken).
    pub images: bool,
    /// Its vision tower takes video (as frames).
    pub videos: bool,
    /// The model has an audio tower (audio parts are taken).
    pub audio: bool,
}

pub(super) struct Engine {
    pub(super) model: Box<dyn CausalLm>,
    pub(super) tokenizer: Option<Arc<Tokenizer>>,
    pub(super) eos: Vec<u32>,
    /// The grammar compiler over this model's vocabulary, built by the first constrained request.
    grammars: std::cell::OnceCell<std::result::Result<Grammars, String>>,
    /// Draft models for speculative decoding.
    drafts: Drafts,
    /// The most tokens a sequence may hold ([`EngineSpec::context_length`]).
    context_length: Option<usize>,
    /// Cache bytes one more token takes (None: a model whose caches cannot batch).
    kv_per_token: Option<usize>,
}

/// Entry point of the engine thread: load, report, serve until Shutdown or all senders drop.
/// Models whose caches batch serve every request in flight together (`generate::batch`); the
/// others serve them one after another, each to its end.
pub fn run(spec: EngineSpec, ready: Sender<Result<LoadedFacts>>, commands: Receiver<Command>) {
    // Benchmark ablations reach the kernels before the model is built.
    crate::ablation::get();
    crate::startup_trace::mark("engine thread started");
    let (engine, facts) = match load(&spec) {
        Ok(loaded) => loaded,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut pool = PromptCachePool::new(spec.prompt_cache.clone());
    // A directory that cannot be used fails the load with an error naming it.
    match open_disk_cache(&spec, &engine, &facts, pool.enabled()) {
        Ok(Some(disk)) => pool.attach_disk(disk),
        Ok(None) => {}
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    }
    let _ = ready.send(Ok(facts));
    // By default the requests in flight may set aside for their caches 90 % of what MLX may
    // still allocate once the weights are in.
    crate::startup_trace::mark("engine ready");
    let facts_budget = mlx::memory_limit().saturating_sub(mlx::memory_stats().active) / 10 * 9;
    // Measured at load (None: a model that cannot batch; an error there cannot happen for a model
    // that loaded, and serving one at a time still works).
    let mut batch = engine.kv_per_token.map(|per_token| Batch::new(spec.max_batch, spec.kv_budget.unwrap_or(facts_budget), per_token));
    crate::startup_trace::mark("batch set up");
    let mut closing = false;
    let mut free_memory = true;
    loop {
        let busy = batch.as_ref().is_some_and(|b| b.busy());
        // While requests are in flight take only what has arrived; otherwise wait for work
        // (waking up when a pooled entry outlives its TTL, so its memory comes back without
        // waiting for the next call).
        let cmd = if closing {
            None
        } else if busy {
            match commands.try_recv() {
                Ok(cmd) => Some(cmd),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => {
                    closing = true;
                    None
                }
            }
        } else {
            match pool.next_expiry() {
                Some(at) => match commands.recv_timeout(at.saturating_duration_since(Instant::now())) {
                    Ok(cmd) => Some(cmd),
                    Err(RecvTimeoutError::Timeout) => {
                        if pool.expire(Instant::now()) > 0 {
                            mlx::clear_cache();
                        }
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                },
                None => match commands.recv() {
                    Ok(cmd) => Some(cmd),
                    Err(_) => break,
                },
            }
        };
        match cmd {
            Some(Command::Generate(job)) => match &mut batch {
                // Speculative requests run alone (see `generate::speculative`).
                // So do requests with caches of their own (`generate::kv_options`).
                Some(b) if !engine.drafts.requested(&job.options) && !job.options.kv_cache.runs_alone() => {
                    b.admit(job);
                    // Take up everything already queued before the next step, so requests
                    // sent together start together.
                    continue;
                }
                // Its entries go to disk below, once nothing is decoding.
                _ => serve_alone(&engine, job, &mut pool),
            },
            Some(Command::Census(reply)) => {
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.decode_step_census()));
                let _ = reply.send(res.unwrap_or_else(|p| Err(Error::Mlx(format!("internal error: {}", panic_message(&p))))));
            }
            // Requests queued before it still finish.
            Some(Command::Shutdown { free_memory: free }) => {
                closing = true;
                free_memory = free;
            }
            None => {}
        }
        match &mut batch {
            Some(b) if b.busy() => b.tick(&engine, &mut pool),
            _ if closing => break,
            _ => {}
        }
        // Entries of finished requests go to disk once no request is decoding (copying them off
        // MLX would hold up the others' next token), or once several wait (a server never idle).
        let decoding = batch.as_ref().is_some_and(|b| b.busy());
        if pool.pending() > 0 && (!decoding || pool.pending() >= MAX_PENDING_WRITES) {
            pool.persist();
        }
    }
    pool.persist();
    // The disk cache's writer finishes its queue when the pool goes.
    drop(pool);
    if !free_memory {
        std::mem::forget(batch);
        std::mem::forget(engine);
    }
}

/// Prompt cache entries that may wait for the disk while requests are decoding.
const MAX_PENDING_WRITES: usize = 4;

/// The disk side of the prompt cache when `prompt_cache.dir` is set (and the pool is on): the
/// model's fingerprint from its directory (random-weight sessions have none: memory only).
fn open_disk_cache(spec: &EngineSpec, engine: &Engine, facts: &LoadedFacts, enabled: bool) -> Result<Option<DiskCache>> {
    let Some(dir) = &spec.prompt_cache.dir else { return Ok(None) };
    if spec.synthetic_seed.is_some() || !enabled {
        return Ok(None);
    }
    let fingerprint = prompt_disk::fingerprint(&spec.dir, facts.dtype, facts.device, spec.int8_activations)?;
    Ok(Some(DiskCache::open(dir, spec.prompt_cache.disk_max_bytes, fingerprint, engine.model.make_caches())?))
}

/// Serves one job start to end (a model whose caches cannot batch).
fn serve_alone(engine: &Engine, job: GenerateJob, pool: &mut PromptCachePool) {
    // A panic inside one job must not take the engine (or the host process) down (the pool is
    // only read by copy and written after success: a panic leaves it intact).
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.generate(&job, pool)));
    let done = match res {
        Ok(r) => r,
        Err(p) => Err(Error::Mlx(format!("internal error: {}", panic_message(&p)))),
    };
    job.events.send(Event::Done(done));
}

pub(super) fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default()
}

fn load(spec: &EngineSpec) -> Result<(Engine, LoadedFacts)> {
    // The tokenizer, taken as soon as the session has sent it; a tokenizer that failed to load
    // stops the load at the next check, before the weights' evaluation (the costly part).
    let mut tokenizer = None;
    let mut take_tokenizer = |wait: bool| -> Result<()> {
        if tokenizer.is_some() {
            return Ok(());
        }
        let got = match spec.tokenizer.try_recv() {
            Ok(t) => Some(t),
            Err(TryRecvError::Empty) if wait => spec.tokenizer.recv().ok(),
            Err(TryRecvError::Empty) => return Ok(()),
            Err(TryRecvError::Disconnected) => None,
        };
        tokenizer = Some(got.ok_or_else(|| Error::Tokenizer("the tokenizer failed to load".into()))?);
        Ok(())
    };
    mlx::set_default_device(spec.device)?;
    // Every graph of this session is built on this thread (the engine's).
    mlx::set_cpu_int8_activations(spec.int8_activations);
    let mut weights = match spec.synthetic_seed {
        Some(seed) => WeightStore::synthetic(spec.config.quantization.clone(), spec.dtype.unwrap_or(Dtype::Bfloat16), seed)?,
        None => WeightStore::open(&spec.dir)?,
    };
    crate::startup_trace::mark("weights mapped");
    weights.compute_dtype = spec.dtype;
    let weights = std::cell::RefCell::new(weights);
    let model = build_model(&spec.config, &Vb::new(&weights, spec.config.quantization.as_ref()))?;
    weights.into_inner().finish()?;
    crate::startup_trace::mark("model built");
    take_tokenizer(false)?;
    let params = model.parameters();
    mlx::eval(&params)?;
    crate::startup_trace::mark("weights evaluated");
    weights_to_device(&params)?;
    // Let the device finish and release what loading consumed (the unfused q/k/v and gate/up
    // parts, the pre-cast tensors) before the first generation measures its peak: on the GPU the
    // inputs of finished kernels are released by completion handlers, not by eval itself.
    mlx::synchronize()?;
    if !crate::ablation::get().load_clear_cache {
        mlx::clear_cache();
    }
    let weights_bytes = params.iter().map(|a| a.nbytes()).sum();
    let dtype = model.dtype();
    drop(params);
    let facts = LoadedFacts { dtype, device: spec.device, weights_bytes, images: model.image_prompt().is_some(),
        videos: model.image_prompt().is_some_and(|p| p.video.is_some()),
        audio: model.audio_prompt().is_some(),
    };
    // Measured here, while the session may still be loading the tokenizer on its thread.
    let kv_per_token = if model.batchable() { kv_bytes_per_token(model.as_ref()).ok() } else { None };
    crate::startup_trace::mark("kv bytes per token measured");
    take_tokenizer(true)?;
    let (tokenizer, eos) = tokenizer.expect("taken above");
    crate::startup_trace::mark("tokenizer received");
    let mut drafts = Drafts::default();
    if let Some(path) = &spec.draft_model {
        let d = DraftModel::load(path, model.dtype(), model.vocab_size(), tokenizer.as_deref())?;
        drafts.session = Some(std::rc::Rc::new(d));
    }
    let engine = Engine { model, tokenizer, eos, grammars: Default::default(), drafts, context_length: spec.context_length, kv_per_token };
    Ok((engine, facts))
}

/// Moves a model's loaded weights into device memory when computing on a GPU (CUDA; see
/// [`mlx::prefetch_to_device`]), so that the first request does not migrate them page by page.
pub(crate) fn weights_to_device(params: &[&mlx::Array]) -> Result<()> {
    if mlx::default_device()? == Device::Gpu && !crate::ablation::get().gpu_prefetch {
        let bytes = mlx::prefetch_to_device(params)?;
        if bytes > 0 {
            crate::startup_trace::mark("weights moved to device memory");
        }
    }
    Ok(())
}

/// Cache bytes one more token takes in every layer, read from the shapes of the caches a
/// one-token step builds. The step is never evaluated (shapes are known when the graph is built):
/// evaluating it cost ~20 ms of a CPU cold start.
fn kv_bytes_per_token(model: &dyn CausalLm) -> Result<usize> {
    let mut caches = model.make_caches();
    model.forward(&mlx::Array::from_slice(&[0u32], &[1, 1])?, &mut caches)?;
    Ok(caches.nbytes().div_ceil(crate::nn::kv_cache::KV_STEP))
}

impl Engine {
    /// The operations of one decode step after an 8-token prompt, counted by primitive, most
    /// frequent first (what per-operation overhead scales with on a GPU). The step a request
    /// decodes with: for a model that batches, a continuous batch of one (`generate::batch`:
    /// every plain request decodes there, even alone, on caches with a position per row); else
    /// the request's own caches.
    fn decode_step_census(&self) -> Result<Vec<(String, usize)>> {
        let mut caches = self.model.make_caches();
        let prompt = mlx::Array::from_slice(&[1u32, 2, 3, 4, 5, 6, 7, 8], &[1, 8])?;
        self.model.forward(&prompt, &mut caches)?;
        mlx::eval(&caches.state())?;
        let token = mlx::Array::from_slice(&[9u32], &[1, 1])?;
        if self.kv_per_token.is_some() {
            // (Its first step grows the caches it joined with: the second is a typical one.)
            let mut batch = crate::nn::BatchCaches::new(&caches)?;
            self.model.forward(&token, batch.for_step()?)?;
            mlx::eval(&batch.state())?;
            let logits = self.model.forward(&token, batch.for_step()?)?;
            let state: Vec<&mlx::Array> = std::iter::once(&logits).chain(batch.state()).collect();
            return mlx::graph_census(&state);
        }
        let logits = self.model.forward(&token, &mut caches)?;
        let state: Vec<&mlx::Array> = std::iter::once(&logits).chain(caches.state()).collect();
        mlx::graph_census(&state)
    }

    /// The constraint of a request on `prompt` asking for `opts.response_format`, if any.
    pub(super) fn constraint(&self, prompt: &[u32], opts: &GenerateOptions) -> Result<Option<Constraint>> {
        let Some(format) = &opts.response_format else { return Ok(None) };
        let tok = self.tokenizer.as_deref().ok_or_else(|| {
            Error::InvalidArgument("response_format needs the model's tokenizer.json, which this model has none of".into())
        })?;
        let grammars = self.grammars.get_or_init(|| {
            let eos = self.eos.first().copied().or_else(|| tok.eos_token_ids().first().copied()).unwrap_or(0);
            Grammars::new(tok, self.model.vocab_size(), eos).map_err(|e| e.to_string())
        });
        let grammars = grammars.as_ref().map_err(|e| Error::Tokenizer(e.clone()))?;
        Ok(Some(grammars.constraint(format, reasoning_gate(Some(tok), prompt)?)?))
    }

    /// Fresh caches for a request: the model's own, or those its KV cache options ask for
    /// (`generate::kv_options`) in every full-attention layer.
    pub(super) fn make_caches(&self, opts: &GenerateOptions) -> Result<LayerCaches> {
        let caches = self.model.make_caches();
        let Some(kind) = opts.kv_cache.kind() else { return Ok(caches) };
        // The models whose layers all batch are those whose every layer is attention over a plain
        // key/value cache with standard masks: the caches these options replace.
        if !self.model.batchable() {
            return Err(Error::InvalidArgument(format!(
                "{} needs a model whose every layer is plain full attention over a key/value cache (llama, qwen2, qwen3, \
                 mistral, their MoE variants); this model's layers keep other state (sliding windows, recurrent states, \
                 latent attention, attention sinks or a length-dependent rope)",
                opts.kv_cache.option_name()
            )));
        }
        Ok(caches.with_kind(kind))
    }

    /// `opts.max_tokens` cut to what the context length leaves after a prompt of `prompt_len`
    /// tokens (the reply then ends there with finish reason `length`). A prompt that leaves no
    /// room is INVALID_ARGUMENT, unless `max_kv_size` keeps the cache within the context.
    pub(super) fn max_tokens_in_context(&self, prompt_len: usize, opts: &GenerateOptions) -> Result<usize> {
        let Some(ctx) = self.context_length else { return Ok(opts.max_tokens) };
        if opts.kv_cache.max_kv_size.is_some_and(|m| m <= ctx) {
            return Ok(opts.max_tokens);
        }
        if prompt_len >= ctx {
            return Err(Error::InvalidArgument(format!(
                "the prompt has {prompt_len} tokens but the context length is {ctx}: the prompt and the reply must fit in it \
                 (a max_kv_size of at most {ctx} bounds the cache instead)"
            )));
        }
        Ok(opts.max_tokens.min(ctx - prompt_len))
    }


    /// The job's prompt as token ids (a chat transcript rendered and encoded here).
    pub(super) fn prompt_ids(&self, job: &GenerateJob) -> Result<Vec<u32>> {
        let ids = match &job.prompt {
            JobPrompt::Tokens(ids) => ids.clone(),
            JobPrompt::Chat { messages, enable_thinking } => {
                let tok = self.tokenizer.as_deref().ok_or_else(|| {
                    Error::Tokenizer("this model has no tokenizer.json: only token-id prompts work".into())
                })?;
                let media: Vec<crate::chat::Media> = messages.iter().flat_map(|m| m.images.iter().map(|i| i.media())).collect();
                let video_at = messages.iter().position(|m| m.images.iter().any(|i| i.video.is_some()));
                if let (Some(i), None) = (video_at, self.model.image_prompt()) {
                    return Err(Error::InvalidArgument(format!(
                        "message {i} holds a video part, and this model takes no video (it has no vision tower)"
                    )));
                }
                let audio_at = messages.iter().position(|m| m.images.iter().any(|i| i.audio));
                if let (Some(i), None) = (audio_at, self.model.audio_prompt()) {
                    return Err(Error::InvalidArgument(format!(
                        "message {i} holds an audio part, and this model takes no audio (it has no audio tower)"
                    )));
                }
                let image_at = messages.iter().position(|m| m.images.iter().any(|i| !i.audio));
                if let (Some(i), None) = (image_at, self.model.image_prompt()) {
                    return Err(Error::InvalidArgument(format!(
                        "message {i} holds an image, and this model takes no images (it has no vision tower)"
                    )));
                }
                if let (Some(i), Some(p)) = (video_at, self.model.image_prompt()) {
                    if p.video.is_none() {
                        return Err(Error::InvalidArgument(format!(
                            "message {i} holds a video part, and this model takes no video (its vision tower takes images only)"
                        )));
                    }
                }
                let ids = tok.encode_chat_with_media(
                    messages,
                    job.tools.as_deref(),
                    *enable_thinking,
                    self.model.image_prompt(),
                    self.model.audio_prompt(),
                )?;
                if !media.is_empty() {
                    crate::startup_trace::mark("chat rendered and tokenized");
                }
                self.model.bind_media(ids, &media)?
            }
        };
        if ids.is_empty() {
            return Err(Error::InvalidArgument("the prompt is empty: at least one token is needed".into()));
        }
        crate::startup_trace::mark("prompt encoded");
        Ok(ids)
    }

    /// Serves `job` alone, start to end (models whose caches cannot batch).
    fn generate(&self, job: &GenerateJob, pool: &mut PromptCachePool) -> Result<GenerateReply> {
        let queue_ms = job.queued_at.elapsed().as_secs_f64() * 1e3;
        if job.abort.load(Ordering::Relaxed) {
            return Err(Error::Aborted);
        }
        let prompt = self.prompt_ids(job)?;
        let prompt = &prompt;
        let max_tokens = self.max_tokens_in_context(prompt.len(), &job.options)?;
        let fitted = (max_tokens != job.options.max_tokens).then(|| GenerateOptions { max_tokens, ..job.options.clone() });
        let opts = fitted.as_ref().unwrap_or(&job.options);
        let use_pool = opts.prompt_cache != Some(false) && !opts.kv_cache.runs_alone() && pool.cacheable(prompt);
        let reuse = if use_pool { pool.lookup(prompt, Instant::now()) } else { None };
        let mut caches = match reuse {
            Some(r) => r.caches,
            None => self.make_caches(opts)?,
        };
        let mut reply = Reply::new(self.tokenizer.as_deref(), &self.eos, prompt, opts)?;
        // States that cannot be trimmed back are also kept where the prompt ends, so that a next
        // turn whose history re-renders this reply differently still resumes from the prompt.
        let mut snapshot = None;
        let snap = if use_pool { Some(&mut snapshot) } else { None };
        let constraint = self.constraint(prompt, opts)?;
        let mut plan = self.drafts.plan(opts, self.model.as_ref(), self.tokenizer.as_deref(), constraint.is_some())?;
        // A draft model sees no images: an image prompt decodes without it (prompt lookup works).
        if matches!(plan, Some((speculative::Drafter::Model(_), _))) && prompt.iter().any(|&t| is_media_token(t)) {
            plan = None;
        }
        let speculated = plan.is_some();
        if speculated && opts.kv_cache.max_kv_size.is_some() {
            return Err(Error::InvalidArgument(
                "max_kv_size cannot be combined with speculative decoding (a bounded cache cannot take back rejected drafts): set num_draft_tokens to 0".into(),
            ));
        }
        let run = match plan {
            Some((drafter, k)) => speculative::run(self.model.as_ref(), &mut caches, &drafter, k, prompt, opts, |step: TokenStep| {
                reply.on_token(job, step)
            }),
            None => generator::run(self.model.as_ref(), &mut caches, prompt, opts, snap, constraint, |step: TokenStep| {
                reply.on_token(job, step)
            }),
        };
        // The pipelined step after the last token may still be running on MLX's stream thread:
        // wait for it on every path, so nothing of this job outlives it (the host may exit next).
        let _ = mlx::synchronize();
        let stats = run?;
        if let Some(snap) = snapshot {
            let _ = pool.store(prompt[..prompt.len() - 1].to_vec(), snap, Instant::now());
        }
        if use_pool {
            store_reply(pool, prompt, &reply.sampled, caches);
        }
        let usage = request::usage(prompt.len(), reply.completion_tokens(), queue_ms, &stats);
        reply.finish(job, usage)
    }
}

/// Keeps `caches` (holding `prompt` and a prefix of the `sampled` tokens) in the pool: exactly
/// the tokens whose keys/values they hold (an EOS fed by the pipelined step included; a sampled
/// token never fed excluded). A failure to keep them only costs a later call its reuse.
pub(crate) fn store_reply(pool: &mut PromptCachePool, prompt: &[u32], sampled: &[u32], caches: LayerCaches) {
    let held = caches.offset();
    if held >= prompt.len() && held - prompt.len() <= sampled.len() {
        let mut seq = prompt.to_vec();
        seq.extend_from_slice(&sampled[..held - prompt.len()]);
        let _ = pool.store(seq, caches, Instant::now());
    }
}
