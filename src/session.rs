//! [`Session`]: the Rust API. A session owns one engine thread holding one model; every method
//! can be called from any thread, and concurrent generations are served in order (FIFO).
use crate::chat::tool_choice::{call_grammar, lazy_call_grammars, CallSyntax};
use crate::chat::{generic, ChatMessage, Tool, ToolCallFormat, ToolChoice};
use crate::error::{Error, Result};
use crate::generate::engine::{self, Command, EngineSpec, Event, GenerateJob, JobPrompt, LoadedFacts, Sink};
use crate::generate::constraint::ToolCallTrigger;
use crate::generate::{GenerateOptions, GenerateReply, GeneratedToken, PromptCacheConfig, ResponseFormat};
use crate::loader::{resolve_model_path, ModelConfig};
use crate::mlx::{self, Device, Dtype};
use crate::schema::{Fields, Naming};
use crate::tokenizer::{TemplateOptions, Tokenizer};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Where to run (default: the GPU when this MLX build has one, else the CPU).
    pub device: Option<Device>,
    /// Compute dtype for float weights (default: float32 on CPU, where it is several times faster
    /// than bfloat16 for quantized matmuls; the checkpoint's own dtype on GPU).
    pub dtype: Option<Dtype>,
    pub prompt_cache: PromptCacheConfig,
    /// The most requests that decode together in one batch (default [`DEFAULT_MAX_BATCH`]);
    /// more wait in the session's queue. Models whose caches cannot batch run one at a time.
    pub max_batch: Option<usize>,
    /// Cache bytes the requests decoding together may set aside (each its prompt and
    /// `max_tokens` new tokens): a request that does not fit waits; one that can never fit is
    /// refused with `OUT_OF_MEMORY` before it starts. Default: 90 % of what MLX may still
    /// allocate after loading (its memory limit less the weights).
    pub kv_budget_bytes: Option<usize>,
    /// A draft model (directory or repo id, same tokenizer) loaded with the model: every request
    /// then decodes speculatively (outside the continuous batch) unless it sets
    /// `num_draft_tokens: 0`. A vocabulary that differs from the model's is INVALID_ARGUMENT.
    pub draft_model: Option<String>,
    /// The most tokens a sequence may hold, prompt and reply together: a generation that reaches
    /// it ends with finish reason `length`, a prompt that leaves no room is INVALID_ARGUMENT.
    /// Default: config.json's `max_position_embeddings` (none with dynamic NTK rope scaling, which
    /// adapts to any length). A request with `max_kv_size` at most this long is not limited.
    pub context_length: Option<usize>,
    /// On the CPU, round each 32-value block of a decode step's activations to 8 bits and
    /// multiply them with the 4- and 8-bit weights in integer dot products, as llama.cpp does:
    /// faster decode on x86-64 CPUs with AVX-512 VNNI (elsewhere, and on the GPU, nothing
    /// changes). Off by default: it moves logprobs away from mlx-lm's (BENCHMARKS.md gives by
    /// how much). Prompt chunks of 33 tokens or more keep float32 activations.
    pub int8_activations: bool,
}

/// How many requests decode together unless [`LoadOptions::max_batch`] says otherwise.
pub const DEFAULT_MAX_BATCH: usize = 16;

impl LoadOptions {
    /// Every option, by its snake_case name (`prompt_cache` is an object of [`PROMPT_CACHE_FIELDS`]).
    pub const FIELDS: &'static [&'static str] = &["device", "dtype", "prompt_cache", "max_batch", "kv_budget_bytes", "draft_model", "context_length", "int8_activations"];

    /// Load options from a JSON object, named as `naming` spells them (see [`crate::schema`]):
    /// `device` `"gpu"`/`"cpu"`, `dtype` `"float32"`/`"bfloat16"`/`"float16"`, `prompt_cache`
    /// `{max_entries, ttl_ms, min_cacheable_tokens, max_bytes, dir, disk_max_bytes}`. Absent or
    /// null: the defaults.
    pub fn from_json(v: &serde_json::Value, naming: Naming) -> std::result::Result<LoadOptions, String> {
        let f = Fields::new(v, naming, Self::FIELDS)?;
        let device = match f.string("device")? {
            None => None,
            Some("gpu") => Some(Device::Gpu),
            Some("cpu") => Some(Device::Cpu),
            Some(other) => return Err(format!("{} must be 'gpu' or 'cpu', got {other:?}", f.name("device"))),
        };
        let dtype = match f.string("dtype")? {
            None => None,
            Some(name) => Some(Dtype::parse_float(name).ok_or_else(|| {
                format!("{} must be 'float32', 'bfloat16' or 'float16', got {name:?}", f.name("dtype"))
            })?),
        };
        let pc = f.nested("prompt_cache", PROMPT_CACHE_FIELDS)?;
        let mut prompt_cache = PromptCacheConfig::default();
        if let Some(n) = pc.count("max_entries")? {
            prompt_cache.max_entries = n;
        }
        if let Some(ms) = pc.count("ttl_ms")? {
            prompt_cache.ttl = std::time::Duration::from_millis(ms as u64);
        }
        if let Some(n) = pc.count("min_cacheable_tokens")? {
            prompt_cache.min_cacheable_tokens = n;
        }
        prompt_cache.max_bytes = pc.count("max_bytes")?;
        match pc.string("dir")? {
            Some("") => return Err(format!("{} must name a directory, got an empty string", pc.name("dir"))),
            Some(d) => prompt_cache.dir = Some(PathBuf::from(d)),
            None => {}
        }
        if let Some(n) = pc.count("disk_max_bytes")? {
            prompt_cache.disk_max_bytes = n as u64;
        }
        let max_batch = f.count("max_batch")?;
        if max_batch == Some(0) {
            return Err(format!("{} must be at least 1", f.name("max_batch")));
        }
        let kv_budget_bytes = f.count("kv_budget_bytes")?;
        let draft_model = f.string("draft_model")?.map(str::to_string);
        let context_length = f.count("context_length")?;
        if context_length == Some(0) {
            return Err(format!("{} must be at least 1", f.name("context_length")));
        }
        let int8_activations = f.boolean("int8_activations")?.unwrap_or(false);
        Ok(LoadOptions { device, dtype, prompt_cache, max_batch, kv_budget_bytes, draft_model, context_length, int8_activations })
    }
}

/// The context length a checkpoint declares: `max_position_embeddings`, except with dynamic NTK
/// rope scaling, whose base grows with the sequence so that it has no fixed limit.
fn default_context_length(config: &ModelConfig) -> Option<usize> {
    let rope = |key: &str| config.raw.get(key).filter(|v| v.is_object());
    let dynamic = rope("rope_scaling").or_else(|| rope("rope_parameters")).is_some_and(|r| {
        ["type", "rope_type"].iter().any(|k| r.get(*k).and_then(|t| t.as_str()) == Some("dynamic"))
    });
    if dynamic {
        None
    } else {
        config.context_length()
    }
}

/// The fields of [`LoadOptions`]' `prompt_cache` object.
pub const PROMPT_CACHE_FIELDS: &[&str] = &["max_entries", "ttl_ms", "min_cacheable_tokens", "max_bytes", "dir", "disk_max_bytes"];

/// What a loaded model is.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub path: PathBuf,
    pub model_type: String,
    pub num_layers: usize,
    pub vocab_size: usize,
    /// The context length generation keeps to ([`LoadOptions::context_length`]); None: unlimited.
    pub context_length: Option<usize>,
    /// e.g. "affine 4-bit g64", None for float checkpoints.
    pub quantization: Option<String>,
    /// The compute dtype ("float32", "bfloat16", …).
    pub dtype: String,
    /// "cpu" or "gpu".
    pub device: String,
    pub weights_bytes: usize,
    pub supports_images: bool,
    pub supports_audio: bool,
    /// Whether messages may carry video parts (as frames): checkpoints whose vision tower takes
    /// video (Gemma 4).
    pub supports_video: bool,
    /// Whether the CPU's decode products use 8-bit activations: [`LoadOptions::int8_activations`]
    /// asked for them, the model runs on the CPU, and the CPU has AVX-512 VNNI.
    pub int8_activations: bool,
}

struct Inner {
    commands: Mutex<mpsc::Sender<Command>>,
    /// The engine's job on a pooled thread ([`mlx::threads`]: no MLX stream thread is left behind).
    thread: Mutex<Option<mlx::threads::JobHandle>>,
}

impl Inner {
    /// Stops the engine (the requests queued before finish) and waits for its thread.
    fn shut_down(&self, free_memory: bool) {
        if let Ok(tx) = self.commands.lock() {
            let _ = tx.send(Command::Shutdown { free_memory });
        }
        if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            t.join();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shut_down(true);
    }
}

/// A loaded model, ready to generate. Cheap to clone (clones share the engine).
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
    tokenizer: Option<Arc<Tokenizer>>,
    info: Arc<ModelInfo>,
    cache_config: PromptCacheConfig,
    max_batch: usize,
}


impl Session {
    /// Loads a model from a directory, a Hugging Face cache entry or a repo id found under
    /// `MLEX_MODELS_DIR` / the HF cache.
    pub fn load(model: impl AsRef<Path>) -> Result<Session> {
        Self::load_with_options(model, LoadOptions::default())
    }

    /// [`Session::load`] with prompt-cache settings.
    pub fn load_with_cache_config(model: impl AsRef<Path>, cache: PromptCacheConfig) -> Result<Session> {
        Self::load_with_options(model, LoadOptions { prompt_cache: cache, ..Default::default() })
    }

    pub fn load_with_options(model: impl AsRef<Path>, options: LoadOptions) -> Result<Session> {
        let dir = resolve_model_path(&model.as_ref().to_string_lossy())?;
        crate::startup_trace::mark("load start");
        let config = ModelConfig::from_dir(&dir)?;
        crate::startup_trace::mark("config read");
        let tokenizer_dir = dir.clone();
        let tokenizer = move || -> Result<Option<Arc<Tokenizer>>> {
            let t = if tokenizer_dir.join("tokenizer.json").is_file() { Some(Arc::new(Tokenizer::from_dir(&tokenizer_dir)?)) } else { None };
            crate::startup_trace::mark("tokenizer loaded");
            Ok(t)
        };
        Self::spawn_engine(dir, config, tokenizer, options, None)
    }

    /// A model of the architecture and shape `config_json` (a config.json document) with seeded
    /// random weights and no tokenizer: for benchmarks of real shapes without their checkpoints.
    pub fn load_random(config_json: &str, seed: u64, options: LoadOptions) -> Result<Session> {
        let dir = PathBuf::from("<random weights>");
        let config = ModelConfig::from_json(config_json, &dir.join("config.json"))?;
        Self::spawn_engine(dir, config, || Ok(None), options, Some(seed))
    }

    fn spawn_engine(
        dir: PathBuf,
        config: ModelConfig,
        load_tokenizer: impl FnOnce() -> Result<Option<Arc<Tokenizer>>>,
        options: LoadOptions,
        synthetic_seed: Option<u64>,
    ) -> Result<Session> {
        // An unknown architecture or a bad field fails here, before any thread or weight.
        crate::models::check_config(&config)?;
        let device = match options.device {
            Some(d) => d,
            None if mlx::gpu_available() => Device::Gpu,
            None => Device::Cpu,
        };
        if device == Device::Gpu && !mlx::gpu_available() {
            return Err(Error::InvalidArgument("device 'gpu' requested but this MLX build has no GPU".into()));
        }
        // Unless told: float32 on the CPU; on a GPU the half type config.json declares (else the
        // stored tensors' own dtypes).
        let dtype = options.dtype.or(if device == Device::Cpu { Some(Dtype::Float32) } else { config.declared_half_dtype() });
        if let Some(d) = dtype {
            if !d.is_float() {
                return Err(Error::InvalidArgument(format!("compute dtype must be a float type, got {}", d.name())));
            }
        }
        let (tokenizer_tx, tokenizer_rx) = mpsc::channel();
        let spec = EngineSpec {
            dir: dir.clone(),
            config: config.clone(),
            device,
            dtype,
            tokenizer: tokenizer_rx,
            synthetic_seed,
            prompt_cache: options.prompt_cache.clone(),
            max_batch: options.max_batch.unwrap_or(DEFAULT_MAX_BATCH).max(1),
            kv_budget: options.kv_budget_bytes,
            draft_model: options.draft_model.clone(),
            context_length: options.context_length.or_else(|| default_context_length(&config)),
            int8_activations: options.int8_activations,
        };
        let context_length = spec.context_length;
        let max_batch = spec.max_batch;
        let (cmd_tx, cmd_rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = mlx::threads::spawn("mlex-engine", move || engine::run(spec, ready_tx, cmd_rx))
            .map_err(|e| Error::io("spawning the engine thread", e))?;
        // The tokenizer loads here while the engine thread maps and builds the weights; the
        // engine waits for it only once its model is built.
        let tokenizer = match load_tokenizer() {
            Ok(t) => t,
            Err(e) => {
                drop(tokenizer_tx);
                let _ = ready_rx.recv();
                return Err(e);
            }
        };
        let mut eos: Vec<u32> = tokenizer.as_ref().map(|t| t.eos_token_ids().to_vec()).unwrap_or_default();
        if eos.is_empty() {
            eos = ids_of(config.eos_token_id.as_ref());
        }
        let _ = tokenizer_tx.send((tokenizer.clone(), eos));
        let facts: LoadedFacts = match ready_rx.recv() {
            Ok(r) => r?,
            Err(_) => return Err(Error::Mlx("the engine thread stopped while loading".into())),
        };
        let quantization = config.quantization.as_ref().and_then(|q| q.default).map(|s| {
            format!("{} {}-bit g{}", s.mode.as_str(), s.bits, s.group_size)
        });
        let info = ModelInfo {
            path: dir,
            model_type: config.model_type.clone(),
            num_layers: config.num_hidden_layers,
            vocab_size: config.vocab_size,
            context_length,
            quantization,
            dtype: facts.dtype.name().to_string(),
            device: facts.device.as_str().to_string(),
            weights_bytes: facts.weights_bytes,
            supports_images: facts.images,
            supports_audio: facts.audio,
            supports_video: facts.videos,
            int8_activations: options.int8_activations && facts.device == Device::Cpu && mlx::cpu_int8_activations_supported(),
        };
        Ok(Session {
            inner: Arc::new(Inner { commands: Mutex::new(cmd_tx), thread: Mutex::new(Some(thread)) }),
            tokenizer,
            info: Arc::new(info),
            cache_config: options.prompt_cache,
            max_batch,
        })
    }

    /// Ends this session in a process that is about to exit: as dropping it (requests already
    /// queued finish, queued prompt-cache writes reach the disk), except that the model and its
    /// caches are left for the OS to reclaim instead of being freed buffer by buffer (5–10 ms of
    /// a one-shot `mlex generate` on a small model). Other clones of the session keep it alive:
    /// then this only drops the clone. Not for a process that goes on running: the memory stays
    /// taken until it exits.
    pub fn end_for_exit(self) {
        if Arc::strong_count(&self.inner) == 1 {
            self.inner.shut_down(false);
        }
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    pub fn prompt_cache_config(&self) -> &PromptCacheConfig {
        &self.cache_config
    }

    /// The most requests this session decodes together ([`LoadOptions::max_batch`]); requests
    /// beyond it wait in its queue (`mlex serve` bounds that queue with `--max-queue`).
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// The model's tokenizer, when its directory has one.
    pub fn tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer.as_deref().ok_or_else(|| {
            Error::Tokenizer(format!("{} has no tokenizer.json: only token-id prompts work", self.info.path.display()))
        })
    }

    /// Renders `messages` through the model's chat template (with the generation prompt).
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[Tool]>,
        enable_thinking: Option<bool>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let opts = TemplateOptions { add_generation_prompt, tools, enable_thinking, extra: Default::default() };
        self.tokenizer()?.apply_chat_template(messages, &opts)
    }

    /// Token ids of a chat transcript, as the model will see it.
    pub fn encode_messages(&self, messages: &[ChatMessage], tools: Option<&[Tool]>, enable_thinking: Option<bool>) -> Result<Vec<u32>> {
        self.tokenizer()?.encode_chat(messages, tools, enable_thinking)
    }

    /// The MLX operations one decode step of this model builds, by primitive, most frequent
    /// first (run on the engine thread, like everything that touches the model).
    pub fn decode_step_census(&self) -> Result<Vec<(String, usize)>> {
        let (tx, rx) = mpsc::channel();
        self.inner.commands.lock().map_err(|_| Error::SessionClosed)?.send(Command::Census(tx)).map_err(|_| Error::SessionClosed)?;
        rx.recv().map_err(|_| Error::SessionClosed)?
    }

    /// Starts a generation and returns at once: the engine writes its tokens, then its reply,
    /// into `sink` from the engine thread (queued FIFO behind running generations). Arguments are
    /// validated here, once, before anything is queued; `abort` may be set from any thread.
    pub fn start(&self, request: Request, options: GenerateOptions, abort: Arc<AtomicBool>, sink: Sink) -> Result<()> {
        let mut options = options;
        options.validate().map_err(Error::InvalidArgument)?;
        let (prompt, tools) = match request {
            Request::Tokens(ids) => {
                if ids.is_empty() {
                    return Err(Error::InvalidArgument("the prompt is empty: at least one token is needed".into()));
                }
                if matches!(options.tool_choice, Some(ToolChoice::Required | ToolChoice::Named(_))) {
                    return Err(Error::InvalidArgument("tool_choice demands a tool call, but no tools were given".into()));
                }
                (JobPrompt::Tokens(ids), None)
            }
            Request::Chat { messages, tools } => {
                if messages.is_empty() {
                    return Err(Error::InvalidArgument("messages is empty".into()));
                }
                let mut tools = tools.filter(|t| !t.is_empty());
                if options.tool_choice == Some(ToolChoice::None) {
                    // Answer in text: the model is not shown the tools.
                    tools = None;
                }
                let mut messages = messages;
                if let (Some(t), None) = (tools.as_deref(), options.tool_call_format) {
                    // The template's own format; a template that drops the tools gets them
                    // described in a prompt of mlex's own (the generic format).
                    let tok = self.tokenizer()?;
                    options.tool_call_format = Some(match generic::prepare(tok, &messages, t, options.enable_thinking) {
                        Some(with_prompt) => {
                            messages = with_prompt;
                            ToolCallFormat::Generic
                        }
                        None => tok.tool_call_format(),
                    });
                }
                if let (Some(choice), Some(format)) = (&options.tool_choice, options.tool_call_format) {
                    let syntax = CallSyntax::for_tokenizer(self.tokenizer()?);
                    if let Some(lark) = call_grammar(choice, tools.as_deref().unwrap_or(&[]), format, &syntax).map_err(Error::InvalidArgument)? {
                        if options.response_format.is_some() {
                            return Err(Error::InvalidArgument(
                                "tool_choice demands a tool call and response_format a reply format: give one of them".into(),
                            ));
                        }
                        options.response_format = Some(ResponseFormat::Grammar(lark));
                    }
                } else if matches!(options.tool_choice, Some(ToolChoice::Required | ToolChoice::Named(_))) {
                    return Err(Error::InvalidArgument("tool_choice demands a tool call, but no tools were given".into()));
                }
                if let (Some(t), Some(format), None, None | Some(ToolChoice::Auto)) =
                    (tools.as_deref(), options.tool_call_format, &options.response_format, &options.tool_choice)
                {
                    // auto: a call the model opens is held to the tools (a tool the format cannot
                    // write leaves the calls free, as they were).
                    if let Ok(grammars) = lazy_call_grammars(t, format, &CallSyntax::for_tokenizer(self.tokenizer()?)) {
                        if !grammars.is_empty() {
                            options.response_format = Some(ResponseFormat::ToolCalls(ToolCallTrigger::new(grammars)));
                        }
                    }
                }
                (JobPrompt::Chat { messages, enable_thinking: options.enable_thinking }, tools)
            }
        };
        let job = GenerateJob { prompt, options, tools, abort, events: sink, queued_at: std::time::Instant::now() };
        self.inner
            .commands
            .lock()
            .map_err(|_| Error::SessionClosed)?
            .send(Command::Generate(job))
            .map_err(|_| Error::SessionClosed)
    }

    /// Starts a generation whose tokens arrive through the returned [`Generation`] (an iterator);
    /// [`Generation::finish`] gives the reply.
    pub fn stream(&self, request: Request, options: GenerateOptions) -> Result<Generation> {
        self.stream_with_abort(request, options, Arc::new(AtomicBool::new(false)))
    }

    /// [`Session::stream`] with an abort flag another thread may set at any time.
    pub fn stream_with_abort(&self, request: Request, options: GenerateOptions, abort: Arc<AtomicBool>) -> Result<Generation> {
        let (sink, events) = Sink::channel();
        self.start(request, options, abort.clone(), sink)?;
        Ok(Generation { events, abort, reply: None })
    }

    /// Generates a reply to a chat transcript. `on_token` sees every token as it is produced;
    /// returning `false` stops generation (finish reason `abort`).
    pub fn generate_cached(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[Tool]>,
        options: GenerateOptions,
        on_token: impl FnMut(&GeneratedToken) -> bool,
    ) -> Result<GenerateReply> {
        self.generate_chat_with_abort(messages, tools, options, Arc::new(AtomicBool::new(false)), on_token)
    }

    /// [`Session::generate_cached`] with an abort flag another thread may set at any time.
    /// With tools, tool calls are parsed out of the reply in `options.tool_call_format`, or the
    /// format the chat template teaches when that is None.
    pub fn generate_chat_with_abort(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[Tool]>,
        options: GenerateOptions,
        abort: Arc<AtomicBool>,
        on_token: impl FnMut(&GeneratedToken) -> bool,
    ) -> Result<GenerateReply> {
        let request = Request::Chat { messages: messages.to_vec(), tools: tools.map(<[Tool]>::to_vec) };
        self.stream_with_abort(request, options, abort)?.run(on_token)
    }

    /// [`Session::generate_cached`] without a streaming callback.
    pub fn generate(&self, messages: &[ChatMessage], options: GenerateOptions) -> Result<GenerateReply> {
        self.generate_cached(messages, None, options, |_| true)
    }

    /// Generates from raw text (no chat template); BOS is added as the tokenizer configures.
    pub fn generate_text(&self, prompt: &str, options: GenerateOptions, on_token: impl FnMut(&GeneratedToken) -> bool) -> Result<GenerateReply> {
        let ids = self.tokenizer()?.encode_prompt(prompt, false)?;
        self.generate_tokens(&ids, options, on_token)
    }

    /// Generates from token ids as they are.
    pub fn generate_tokens(
        &self,
        prompt: &[u32],
        options: GenerateOptions,
        on_token: impl FnMut(&GeneratedToken) -> bool,
    ) -> Result<GenerateReply> {
        self.generate_tokens_with_abort(prompt, options, Arc::new(AtomicBool::new(false)), on_token)
    }

    /// [`Session::generate_tokens`] with an abort flag another thread may set at any time.
    pub fn generate_tokens_with_abort(
        &self,
        prompt: &[u32],
        options: GenerateOptions,
        abort: Arc<AtomicBool>,
        on_token: impl FnMut(&GeneratedToken) -> bool,
    ) -> Result<GenerateReply> {
        self.stream_with_abort(Request::Tokens(prompt.to_vec()), options, abort)?.run(on_token)
    }
}

/// What to generate from.
#[derive(Debug, Clone)]
pub enum Request {
    /// Token ids as they are.
    Tokens(Vec<u32>),
    /// A chat transcript, rendered through the model's chat template (on the engine thread), with
    /// the tools offered (their tool calls are parsed out of the reply).
    Chat { messages: Vec<ChatMessage>, tools: Option<Vec<Tool>> },
}

/// One running generation ([`Session::stream`]): iterate for its tokens as they come, then
/// [`Generation::finish`] for the reply. Dropping it stops the generation.
pub struct Generation {
    events: mpsc::Receiver<Event>,
    abort: Arc<AtomicBool>,
    reply: Option<Result<GenerateReply>>,
}

impl Generation {
    /// Stops the generation at its next token (its reply then has finish reason `abort`).
    pub fn abort(&self) {
        self.abort.store(true, Ordering::Relaxed);
    }

    /// Waits for the end (consuming tokens not yet taken) and returns the reply.
    pub fn finish(mut self) -> Result<GenerateReply> {
        while self.next().is_some() {}
        self.reply.take().unwrap_or(Err(Error::SessionClosed))
    }

    /// Every token through `on_token` (returning false aborts), then the reply. A reply the
    /// callback stopped has finish reason `abort`, also when the engine, running ahead of the
    /// callback, had already ended it another way.
    pub fn run(mut self, mut on_token: impl FnMut(&GeneratedToken) -> bool) -> Result<GenerateReply> {
        let mut stopped = false;
        while let Some(t) = self.next() {
            if !stopped && !on_token(&t) {
                stopped = true;
                self.abort();
            }
        }
        let mut reply = self.finish();
        if let (true, Ok(r)) = (stopped, reply.as_mut()) {
            r.finish_reason = crate::FinishReason::Abort;
        }
        reply
    }
}

impl Iterator for Generation {
    type Item = GeneratedToken;

    fn next(&mut self) -> Option<GeneratedToken> {
        if self.reply.is_some() {
            return None;
        }
        match self.events.recv() {
            Ok(Event::Token(t)) => Some(t),
            Ok(Event::Done(r)) => {
                self.reply = Some(r);
                None
            }
            Err(_) => {
                self.reply = Some(Err(Error::SessionClosed));
                None
            }
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if self.reply.is_none() {
            self.abort();
        }
    }
}

fn ids_of(v: Option<&serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_u64().map(|x| x as u32)).collect(),
        _ => vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn load_options_read_through_the_schema_in_each_spelling() {
        let o = LoadOptions::from_json(&json!({"device": "cpu", "dtype": "bfloat16", "promptCache": {"maxEntries": 3, "ttlMs": 1500}}), Naming::Camel)
            .unwrap();
        assert_eq!((o.device, o.dtype), (Some(Device::Cpu), Some(Dtype::Bfloat16)));
        assert_eq!((o.prompt_cache.max_entries, o.prompt_cache.ttl), (3, std::time::Duration::from_millis(1500)));
        assert_eq!(o.prompt_cache.min_cacheable_tokens, PromptCacheConfig::default().min_cacheable_tokens);
        let err = |v: serde_json::Value, n: Naming| LoadOptions::from_json(&v, n).unwrap_err();
        assert!(err(json!({"promptCache": {"maxEntries": -1}}), Naming::Camel).starts_with("promptCache.maxEntries must be a non-negative integer"));
        assert!(err(json!({"prompt_cache": {"ttl": 3}}), Naming::Snake).contains("unknown option prompt_cache.\"ttl\""));
        assert!(err(json!({"--device": "tpu"}), Naming::Kebab).starts_with("--device must be 'gpu' or 'cpu'"));
        assert!(err(json!({"promptCache": 5}), Naming::Camel).contains("promptCache must be an object"));
        let o = LoadOptions::from_json(&json!({"promptCache": {"dir": "/tmp/pc", "diskMaxBytes": 1000}}), Naming::Camel).unwrap();
        assert_eq!((o.prompt_cache.dir.as_deref(), o.prompt_cache.disk_max_bytes), (Some(Path::new("/tmp/pc")), 1000));
        assert_eq!(LoadOptions::from_json(&json!({}), Naming::Camel).unwrap().prompt_cache.disk_max_bytes, 4 << 30);
        assert!(err(json!({"prompt_cache": {"dir": 3}}), Naming::Snake).starts_with("prompt_cache.dir must be a string"));
        assert!(err(json!({"promptCache": {"dir": ""}}), Naming::Camel).starts_with("promptCache.dir must name a directory"));
    }
}
