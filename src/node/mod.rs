//! The napi-rs surface of the `mlex` npm package (feature `node`).
//!
//! Native layer, kept small: the public `Session` class (AbortSignal, async iterator, argument
//! checks, `Symbol.asyncDispose`) lives in the hand-written `wrapper.js` over these classes.
//!
//! Threads: nothing here blocks the JS thread. Loading runs as an `AsyncTask`; a generation is a
//! job queued on the session's engine thread (FIFO), which renders its prompt and writes each token
//! straight into a tokio channel that `NativeGeneration.next()` awaits. Dropping a session
//! (close or garbage collection) happens on a helper thread, because the last drop joins the
//! engine thread; during process exit sessions are leaked instead, so no MLX work races the
//! process's own teardown.
//!
//! Errors: every error message starts with `[CODE] `, the stable code of [`crate::Error::code`];
//! the wrapper moves it into `err.code`.
mod types;

use crate::chat::{
    parse_messages_json, parse_tools_json, ChatMessage as CoreMessage, Tool as CoreTool, ToolCall as CoreToolCall,
    ToolCallFormat,
};
use crate::generate::{
    GenerateOptions as CoreGenerateOptions, GenerateReply as CoreReply, GeneratedToken as CoreToken, Naming, TokenKind,
    TopLogprob as CoreTopLogprob,
};
use crate::{
    Error as CoreError, Event, LoadOptions as CoreLoadOptions, Request, Session as CoreSession,
    Sink,
};
use napi::bindgen_prelude::*;
use napi_derive::napi;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, Weak};
use std::time::Duration;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

pub use types::*;

/// Set when the process is exiting (our `atexit` handler): sessions are leaked from then on.
static EXITING: AtomicBool = AtomicBool::new(false);
/// Jobs that may be running MLX on an engine thread right now: loads, generations, releases.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
/// Abort flags of every generation still running, in every session.
static RUNNING: Mutex<Vec<Weak<AtomicBool>>> = Mutex::new(Vec::new());
static EXIT_HANDLER: Once = Once::new();

extern "C" {
    fn atexit(cb: extern "C" fn()) -> std::os::raw::c_int;
}

/// Runs at `exit()` (natural exit or `process.exit()`), before libmlx's static destructors (it is
/// registered after libmlx was loaded, and exit handlers run in reverse order): MLX must not be
/// torn down under an engine thread that is still computing. Aborts every generation and waits
/// (at most a few seconds) for the engine threads to go idle.
extern "C" fn on_process_exit() {
    EXITING.store(true, Ordering::SeqCst);
    if let Ok(running) = RUNNING.lock() {
        for flag in running.iter().filter_map(|w| w.upgrade()) {
            flag.store(true, Ordering::SeqCst);
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while ACTIVE.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Internal: called by the JS wrapper from `process.on('exit')`, which runs before any C-level exit
/// handler. That ordering matters: libmlx registers the destructors of its function-local statics
/// (the allocator among them) when they are first used, i.e. after our `atexit` handler, so at
/// `exit()` they run first and would pull memory from under a still-running engine thread.
#[napi(js_name = "shutdownForExit")]
pub fn shutdown_for_exit() {
    on_process_exit();
}

fn register_exit_handler() {
    EXIT_HANDLER.call_once(|| unsafe {
        atexit(on_process_exit);
    });
}

/// Counts a job in [`ACTIVE`] for as long as it lives.
struct ActiveJob;

impl ActiveJob {
    fn start() -> Self {
        ACTIVE.fetch_add(1, Ordering::SeqCst);
        ActiveJob
    }
}

impl Drop for ActiveJob {
    fn drop(&mut self) {
        ACTIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A JS error carrying the core error's stable code as a `[CODE] ` message prefix.
fn js_error(e: CoreError) -> napi::Error {
    napi::Error::new(Status::GenericFailure, format!("[{}] {}", e.code(), e))
}

fn invalid(msg: impl Into<String>) -> napi::Error {
    js_error(CoreError::InvalidArgument(msg.into()))
}

fn parse_json<T: serde::de::DeserializeOwned + Default>(json: &str, what: &str) -> Result<T> {
    if json.is_empty() {
        return Ok(T::default());
    }
    serde_json::from_str(json).map_err(|e| invalid(format!("{what}: {}", serde_error(&e))))
}

/// serde_json's message without the "at line 1 column N" of our own generated JSON text.
fn serde_error(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.find(" at line ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}


/// Load options from the wrapper's JSON, read by the core schema in camelCase.
fn load_options(json: &str) -> Result<CoreLoadOptions> {
    let v: Value = if json.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(json).map_err(|e| invalid(format!("options: {}", serde_error(&e))))?
    };
    CoreLoadOptions::from_json(&v, Naming::Camel).map_err(|m| invalid(format!("options: {m}")))
}

fn tools_of(v: Option<Value>) -> Result<Option<Vec<CoreTool>>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v @ Value::Array(_)) => parse_tools_json(&v.to_string()).map(Some).map_err(js_error),
        Some(_) => Err(invalid("tools must be an array")),
    }
}

/// A generation's options from the wrapper's JSON: `tools` taken out, the rest read by the core
/// schema in camelCase ([`CoreGenerateOptions::from_json`]: names, defaults and checks are its).
fn generate_options(json: &str) -> Result<(CoreGenerateOptions, Option<Vec<CoreTool>>)> {
    let mut v: Value = if json.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(json).map_err(|e| invalid(format!("options: {}", serde_error(&e))))?
    };
    let tools = match &mut v {
        Value::Object(o) => o.remove("tools"),
        _ => None,
    };
    let options = CoreGenerateOptions::from_json(&v, Naming::Camel).map_err(|m| invalid(format!("options: {m}")))?;
    Ok((options, tools_of(tools)?))
}

/// The option names of `generate`/`stream` (camelCase), from the core schema: the package's
/// tests check `index.d.ts` declares exactly these.
#[napi(js_name = "generateOptionNames")]
pub fn generate_option_names() -> Vec<String> {
    let mut names: Vec<String> = CoreGenerateOptions::FIELDS.iter().map(|f| Naming::Camel.spell(f)).collect();
    names.push("tools".into());
    names
}

/// Parses messages, accepting the camelCase spellings of the JS API (`toolCalls`, `toolCallId`).
fn messages_of(json: &str) -> Result<Vec<CoreMessage>> {
    let mut v: Value = serde_json::from_str(json).map_err(|e| invalid(format!("messages: {}", serde_error(&e))))?;
    let Value::Array(items) = &mut v else {
        return Err(invalid("messages must be an array of { role, content } objects"));
    };
    if items.is_empty() {
        return Err(invalid("messages is empty"));
    }
    for item in items.iter_mut() {
        if let Value::Object(obj) = item {
            for (camel, snake) in [("toolCalls", "tool_calls"), ("toolCallId", "tool_call_id")] {
                if let Some(x) = obj.remove(camel) {
                    obj.entry(snake.to_string()).or_insert(x);
                }
            }
        }
    }
    parse_messages_json(&v.to_string()).map_err(js_error)
}

fn token_js(t: &CoreToken) -> GeneratedToken {
    GeneratedToken {
        id: t.id,
        text: t.text.clone(),
        kind: match t.kind {
            TokenKind::Text => "text",
            TokenKind::Reasoning => "reasoning",
            TokenKind::ToolCall => "toolCall",
        }
        .to_string(),
        logprob: t.logprob as f64,
        top_logprobs: top_logprobs_js(&t.top_logprobs),
    }
}

fn top_logprobs_js(top: &[CoreTopLogprob]) -> Vec<TopLogprob> {
    top.iter().map(|t| TopLogprob { id: t.id, text: t.text.clone(), logprob: t.logprob as f64 }).collect()
}

fn tool_call_format(name: &str) -> Result<ToolCallFormat> {
    name.parse::<ToolCallFormat>().map_err(|e| invalid(format!("toolCallFormat: {e}")))
}

fn tool_call_js(c: &CoreToolCall) -> ToolCall {
    ToolCall {
        id: c.id.clone(),
        kind: "function".into(),
        function: ToolCallFunction {
            name: c.name.clone(),
            arguments: Value::String(match &c.arguments {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            }),
        },
    }
}

/// Parses the tool calls out of a model's reply text. `format`: how the model writes them
/// (`'hermes'`, `'qwen3_coder'`, `'gemma4'`, `'gemma_tool_code'`, `'llama3_json'`, `'mistral'`);
/// omitted, every format is tried and the first that finds calls wins. Malformed calls stay in
/// `text` as written; this never throws on model output.
#[napi(ts_return_type = "ParsedToolCalls")]
pub fn parse_tool_calls(text: String, #[napi(ts_arg_type = "'hermes' | 'qwen3_coder' | 'gemma4' | 'gemma_tool_code' | 'llama3_json' | 'mistral' | 'generic'")] format: Option<String>) -> Result<ParsedToolCalls> {
    let parsed = match format.as_deref() {
        Some(f) => crate::chat::parse_tool_calls(&text, tool_call_format(f)?),
        None => crate::chat::parse_tool_calls_any(&text),
    };
    Ok(ParsedToolCalls { text: parsed.text_without_calls, tool_calls: parsed.calls.iter().map(tool_call_js).collect() })
}

fn reply_js(r: CoreReply) -> GenerateReply {
    let u = &r.usage;
    GenerateReply {
        usage: Usage {
            prompt_tokens: u.prompt_tokens as u32,
            cached_tokens: u.cached_tokens as u32,
            completion_tokens: u.completion_tokens as u32,
            queue_ms: u.queue_ms,
            ttft_ms: u.ttft_ms,
            prefill_tokens_per_second: u.prefill_tokens_per_second,
            decode_tokens_per_second: u.decode_tokens_per_second,
            schedule_ms_per_step: u.schedule_ms_per_step,
            submit_ms_per_step: u.submit_ms_per_step,
            wait_ms_per_step: u.wait_ms_per_step,
            peak_memory_bytes: u.peak_memory_bytes as f64,
            batch_size: u.batch_size as u32,
            batched: u.batched,
            draft_tokens: u.draft_tokens as u32,
            accepted_draft_tokens: u.accepted_draft_tokens as u32,
            acceptance_rate: u.acceptance_rate,
            tokens_per_step: u.tokens_per_step,
            dropped_passes: u.dropped_passes as u32,
        },
        tool_calls: r.tool_calls.iter().map(tool_call_js).collect(),
        finish_reason: r.finish_reason.as_str().to_string(),
        tool_call_format: r.tool_call_format.map(|f| f.as_str().to_string()),
        logprobs: r.logprobs.iter().map(|&x| x as f64).collect(),
        top_logprobs: r.top_logprobs.iter().map(|t| top_logprobs_js(t)).collect(),
        text: r.text,
        reasoning: r.reasoning,
        tokens: r.tokens,
    }
}

/// Drops a session without blocking the calling (JS) thread: the last drop of a core session
/// joins its engine thread, which may be finishing a generation step. At process exit the
/// session is leaked instead (the OS reclaims it; no MLX teardown races the exit).
fn release(session: CoreSession) {
    if EXITING.load(Ordering::SeqCst) {
        std::mem::forget(session);
        return;
    }
    let job = ActiveJob::start();
    let spawned = std::thread::Builder::new().name("mlex-release".into()).spawn(move || {
        drop(session);
        drop(job);
    });
    if let Err(e) = spawned {
        // No thread to spare: leaking beats blocking the event loop.
        eprintln!("mlex: could not spawn a thread to release a session ({e}); leaking it");
    }
}

struct Shared {
    session: Mutex<Option<CoreSession>>,
    /// Abort flags of this session's generations still running (close() sets them).
    running: Mutex<Vec<Weak<AtomicBool>>>,
}

impl Shared {
    fn session(&self) -> Result<CoreSession> {
        self.session.lock().ok().and_then(|s| s.clone()).ok_or_else(|| js_error(CoreError::SessionClosed))
    }

    fn close(&self) {
        if let Ok(mut running) = self.running.lock() {
            for flag in running.drain(..).filter_map(|w| w.upgrade()) {
                flag.store(true, Ordering::SeqCst);
            }
        }
        let taken = self.session.lock().ok().and_then(|mut s| s.take());
        if let Some(s) = taken {
            release(s);
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.close();
    }
}

/// Internal: loads a model off the JS thread.
pub struct LoadTask {
    model: String,
    options: Option<Result<CoreLoadOptions>>,
}

impl Task for LoadTask {
    type Output = CoreSession;
    type JsValue = NativeSession;

    fn compute(&mut self) -> Result<CoreSession> {
        let options = self.options.take().unwrap_or_else(|| Ok(CoreLoadOptions::default()))?;
        register_exit_handler();
        let _job = ActiveJob::start();
        CoreSession::load_with_options(&self.model, options).map_err(js_error)
    }

    fn resolve(&mut self, _env: Env, session: CoreSession) -> Result<NativeSession> {
        let info = session.info();
        let info = ModelInfo {
            path: info.path.display().to_string(),
            model_type: info.model_type.clone(),
            num_layers: info.num_layers as u32,
            vocab_size: info.vocab_size as u32,
            context_length: info.context_length.map(|n| n as u32),
            quantization: info.quantization.clone(),
            dtype: info.dtype.clone(),
            device: info.device.clone(),
            weights_bytes: info.weights_bytes as f64,
            supports_images: info.supports_images,
            supports_audio: info.supports_audio,
            supports_video: info.supports_video,
            int8_activations: info.int8_activations,
        };
        Ok(NativeSession {
            shared: Arc::new(Shared { session: Mutex::new(Some(session)), running: Mutex::new(vec![]) }),
            info,
        })
    }
}

/// Internal (use `Session.load`): loads a model off the JS thread. `optionsJson` is
/// `LoadOptions` without `signal`/`onProgress`, as JSON text. Errors carry a `[CODE] ` prefix.
#[napi(ts_return_type = "Promise<NativeSession>")]
pub fn load_native_session(model: String, options_json: String) -> AsyncTask<LoadTask> {
    let options = load_options(&options_json);
    AsyncTask::new(LoadTask { model, options: Some(options) })
}

/// Internal: the native half of `Session` (see `wrapper.d.ts` for the public class).
#[napi]
pub struct NativeSession {
    shared: Arc<Shared>,
    info: ModelInfo,
}

#[napi]
impl NativeSession {
    /// What the loaded model is.
    #[napi(getter)]
    pub fn info(&self) -> ModelInfo {
        self.info.clone()
    }

    /// Whether `close()` has been called.
    #[napi(getter)]
    pub fn closed(&self) -> bool {
        self.shared.session.lock().map(|s| s.is_none()).unwrap_or(true)
    }

    /// Starts a generation on the engine thread (queued FIFO behind running ones).
    /// `messagesJson`: `ChatMessage[]` as JSON; `optionsJson`: `GenerateOptions` without
    /// `signal`/`onToken`, as JSON. Throws (`[CODE] ` prefix) on bad arguments or a closed session.
    #[napi]
    pub fn start(&self, messages_json: String, options_json: String) -> Result<NativeGeneration> {
        let session = self.shared.session()?;
        let messages = messages_of(&messages_json)?;
        let (options, tools) = generate_options(&options_json)?;
        let abort = Arc::new(AtomicBool::new(false));
        let (tx, rx) = unbounded_channel();
        {
            let mut running = self.shared.running.lock().map_err(|_| js_error(CoreError::SessionClosed))?;
            running.retain(|w| w.strong_count() > 0);
            running.push(Arc::downgrade(&abort));
        }
        if let Ok(mut all) = RUNNING.lock() {
            all.retain(|w| w.strong_count() > 0);
            all.push(Arc::downgrade(&abort));
        }
        // The engine thread writes this generation's events straight into the stream's queue (no
        // relay thread); the job stays counted in ACTIVE until the engine drops it after `Done`.
        let job = ActiveJob::start();
        let sink = Sink::new(move |e: Event| {
            let _ = &job;
            // A send fails once JS has dropped the generation: the engine stops it then.
            tx.send(e).is_ok()
        });
        let request = Request::Chat { messages, tools };
        session.start(request, options, abort.clone(), sink).map_err(js_error)?;
        Ok(NativeGeneration { rx: Arc::new(tokio::sync::Mutex::new(rx)), abort, finished: Arc::new(AtomicBool::new(false)) })
    }

    /// Token ids of `text`.
    #[napi]
    pub fn tokenize(&self, text: String, add_special_tokens: bool) -> Result<Vec<u32>> {
        let s = self.shared.session()?;
        s.tokenizer().and_then(|t| t.encode(&text, add_special_tokens)).map_err(js_error)
    }

    /// Text of token ids (special tokens kept).
    #[napi]
    pub fn detokenize(&self, ids: Vec<u32>) -> Result<String> {
        let s = self.shared.session()?;
        let vocab = s.info().vocab_size;
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab.max(s.tokenizer().map(|t| t.vocab_size()).unwrap_or(0))) {
            return Err(invalid(format!("token id {bad} is outside the vocabulary")));
        }
        s.tokenizer().and_then(|t| t.decode(&ids, false)).map_err(js_error)
    }

    /// The prompt text the chat template makes of `messagesJson` (`ChatMessage[]` as JSON);
    /// `optionsJson`: `ChatTemplateOptions` as JSON.
    #[napi]
    pub fn apply_chat_template(&self, messages_json: String, options_json: String) -> Result<String> {
        let s = self.shared.session()?;
        let messages = messages_of(&messages_json)?;
        let o: ChatTemplateOptions = parse_json(&options_json, "options")?;
        let tools = tools_of(o.tools)?;
        s.apply_chat_template(&messages, tools.as_deref(), o.enable_thinking, o.add_generation_prompt.unwrap_or(true))
            .map_err(js_error)
    }

    /// Closes the session: running generations are aborted, the model is freed once they end.
    /// Later calls throw `[SESSION_CLOSED]`. Never blocks.
    #[napi]
    pub fn close(&self) {
        self.shared.close();
    }
}

/// Internal: one running generation; `Session.generate`/`Session.stream` drive it.
#[napi]
pub struct NativeGeneration {
    rx: Arc<tokio::sync::Mutex<UnboundedReceiver<Event>>>,
    abort: Arc<AtomicBool>,
    finished: Arc<AtomicBool>,
}

/// Most tokens handed to JS per `next()`.
const MAX_BATCH: usize = 256;

#[napi]
impl NativeGeneration {
    /// Waits (off the JS thread) for the next tokens; resolves with `reply` set once generation
    /// has ended, and rejects (`[CODE] ` prefix) if it failed.
    #[napi(ts_return_type = "Promise<NativeBatch>")]
    pub fn next<'env>(&self, env: &'env Env) -> Result<PromiseRaw<'env, NativeBatch>> {
        let rx = self.rx.clone();
        let finished = self.finished.clone();
        env.spawn_future(async move {
            if finished.load(Ordering::SeqCst) {
                return Ok(NativeBatch { tokens: vec![], reply: None });
            }
            let mut rx = rx.lock().await;
            let mut tokens = Vec::new();
            let mut item = rx.recv().await;
            loop {
                match item {
                    Some(Event::Token(t)) => tokens.push(token_js(&t)),
                    Some(Event::Done(r)) => {
                        finished.store(true, Ordering::SeqCst);
                        return match r {
                            Ok(reply) => Ok(NativeBatch { tokens, reply: Some(reply_js(reply)) }),
                            // Tokens produced before a failure are dropped: the error is what counts.
                            Err(e) => Err(js_error(e)),
                        };
                    }
                    None => {
                        finished.store(true, Ordering::SeqCst);
                        return Err(js_error(CoreError::Mlx("the engine ended without a reply".into())));
                    }
                }
                if tokens.len() >= MAX_BATCH {
                    return Ok(NativeBatch { tokens, reply: None });
                }
                item = match rx.try_recv() {
                    Ok(i) => Some(i),
                    Err(_) => return Ok(NativeBatch { tokens, reply: None }),
                };
            }
        })
    }

    /// Asks the generation to stop; it ends with `finishReason: 'abort'` after the current step.
    #[napi]
    pub fn abort(&self) {
        self.abort.store(true, Ordering::SeqCst);
    }
}

impl Drop for NativeGeneration {
    fn drop(&mut self) {
        // Garbage-collected before the end (a stream dropped without being finished): stop it.
        self.abort.store(true, Ordering::SeqCst);
    }
}
