//! Chat templates rendered with minijinja, made to behave like transformers' `apply_chat_template`
//! (Python Jinja2 sandbox with `trim_blocks`, `lstrip_blocks`, loop controls, and transformers'
//! own `tojson`, `raise_exception` and `strftime_now`). Models are trained on the exact text
//! transformers renders, so every difference here is a silent quality loss.
use std::collections::HashMap;
use std::fmt::Write as _;

use minijinja::machinery::{self, Vm};
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, ErrorKind, Output, State, UndefinedBehavior};
use serde_json::{Map, Value as Json};

use super::pyjson::{self, DumpOptions};
use super::pyrepr;
use super::special::SpecialTokens;
use super::template_budget::{self, BudgetScope};
use super::{template_consts, template_depth};
use crate::chat::{ChatMessage, Tool};
use crate::error::{Error, Result};

/// How to render a conversation.
#[derive(Debug, Clone)]
pub struct TemplateOptions<'a> {
    /// Append the header that opens the assistant's reply (true by default: we render to generate).
    pub add_generation_prompt: bool,
    /// Tools the model may call; `None` renders `tools` as `none`, as transformers does.
    pub tools: Option<&'a [Tool]>,
    /// `None`: leave `enable_thinking` undefined so the template's own default applies.
    pub enable_thinking: Option<bool>,
    /// More template variables (e.g. `documents`, `date_string`, `reasoning_effort`); they
    /// override the special-token strings, as transformers' keyword arguments do.
    pub extra: Map<String, Json>,
}

impl Default for TemplateOptions<'_> {
    fn default() -> Self {
        TemplateOptions { add_generation_prompt: true, tools: None, enable_thinking: None, extra: Map::new() }
    }
}

/// Where a model's template(s) came from: one template, or named ones (tokenizer_config.json may
/// hold a list of `{name, template}`; transformers picks "tool_use" when tools are given).
#[derive(Debug, Clone)]
pub enum TemplateSource {
    Single(String),
    Named(Vec<(String, String)>),
}

/// What one render may spend: minijinja instructions ("fuel"), bytes of values built and output
/// bytes. A template that loops without end (nested `range` loops, a macro that recurses in a
/// loop), builds ever larger strings or lists, or prints without end stops with an error instead
/// of hanging the caller or exhausting memory.
///
/// Real templates take 75 to 900 instructions per message at 50 turns; those that look back over
/// the conversation grow with its length (google-gemma-4: 7,200 per message at 2,000 messages),
/// hence the quadratic term. At about 25 ns an instruction the default bound is 20 M
/// instructions (half a second) for a short conversation.
///
/// The value budget counts every string, list and map the template makes (template_budget.rs),
/// not what is alive at once, so it too grows with the conversation: templates copy each
/// message's content a few times, and some look back over the whole conversation per message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateLimits {
    pub fuel: u64,
    /// More fuel per message and per tool.
    pub fuel_per_item: u64,
    /// More fuel per pair of items (templates quadratic in the conversation's length).
    pub fuel_per_item_pair: u64,
    /// The most bytes one render may produce (a prompt this long is far past any context).
    pub max_output: usize,
    /// Bytes of values one render may build (strings, lists, maps, printed text)...
    pub value_bytes: u64,
    /// ... and more per byte of the conversation and tools it is given ...
    pub value_bytes_per_input_byte: u64,
    /// ... and per item (message or tool) times those bytes (templates quadratic in length).
    pub value_bytes_per_item_input_byte: u64,
}

impl Default for TemplateLimits {
    fn default() -> Self {
        TemplateLimits {
            fuel: 20_000_000,
            fuel_per_item: 50_000,
            fuel_per_item_pair: 10,
            max_output: 64 << 20,
            value_bytes: 256 << 20,
            value_bytes_per_input_byte: 64,
            value_bytes_per_item_input_byte: 4,
        }
    }
}

impl TemplateLimits {
    fn fuel_for(&self, items: u64) -> u64 {
        self.fuel
            .saturating_add(self.fuel_per_item.saturating_mul(items))
            .saturating_add(self.fuel_per_item_pair.saturating_mul(items.saturating_mul(items)))
    }

    fn value_bytes_for(&self, items: u64, input_bytes: u64) -> u64 {
        self.value_bytes
            .saturating_add(self.value_bytes_per_input_byte.saturating_mul(input_bytes))
            .saturating_add(self.value_bytes_per_item_input_byte.saturating_mul(items).saturating_mul(input_bytes))
    }
}

/// The widest `tojson(indent=n)` accepted (Python takes any; a huge n would allocate n bytes).
const MAX_TOJSON_INDENT: i64 = 1024;

/// A model's compiled chat template(s).
pub struct ChatTemplate {
    env: Environment<'static>,
    limits: TemplateLimits,
    names: Vec<String>,
    /// The sources, by name (what the model's output formats are detected from).
    sources: Vec<(String, String)>,
    /// Templates that failed to compile: kept so that a model with a template minijinja cannot
    /// parse still loads (raw prompts work), and the error surfaces when the template is used.
    broken: HashMap<String, String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("names", &self.names).field("broken", &self.broken).finish()
    }
}

const SINGLE: &str = "default";

impl ChatTemplate {
    pub fn new(source: TemplateSource) -> Self {
        let mut env = environment();
        let list = match source {
            TemplateSource::Single(s) => vec![(SINGLE.to_string(), s)],
            TemplateSource::Named(list) => list,
        };
        let mut names = Vec::new();
        let mut broken = HashMap::new();
        let sources = list.clone();
        for (name, src) in list {
            let src = strip_generation_tags(&src);
            if let Err(e) = template_depth::check(&src).and_then(|()| template_consts::check(&src)) {
                broken.insert(name.clone(), e);
            } else if let Err(e) = env.add_template_owned(name.clone(), src) {
                broken.insert(name.clone(), describe(&e));
            }
            names.push(name);
        }
        ChatTemplate { env, names, sources, broken, limits: TemplateLimits::default() }
    }

    /// Other bounds than [`TemplateLimits::default`] (tests and the fuzz target use small ones).
    pub fn with_limits(mut self, limits: TemplateLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The source of the template used with (or without) tools.
    pub fn source(&self, with_tools: bool) -> Option<&str> {
        let name = self.pick(with_tools).ok()?;
        self.sources.iter().find(|(n, _)| n == name).map(|(_, s)| s.as_str())
    }

    /// Every template's source.
    pub fn sources(&self) -> impl Iterator<Item = &str> {
        self.sources.iter().map(|(_, s)| s.as_str())
    }

    /// transformers' choice among named templates.
    fn pick(&self, with_tools: bool) -> Result<&str> {
        if with_tools && self.names.iter().any(|n| n == "tool_use") {
            return Ok("tool_use");
        }
        if self.names.iter().any(|n| n == SINGLE) {
            return Ok(SINGLE);
        }
        Err(Error::Tokenizer(format!(
            "the model has several chat templates ({}) and none is named \"default\"",
            self.names.join(", ")
        )))
    }

    pub fn render(
        &self,
        messages: &[ChatMessage],
        opts: &TemplateOptions<'_>,
        special: &SpecialTokens,
    ) -> Result<String> {
        if messages.is_empty() {
            return Err(Error::InvalidArgument(
                "cannot apply a chat template to an empty conversation".into(),
            ));
        }
        let name = self.pick(opts.tools.is_some())?;
        if let Some(e) = self.broken.get(name) {
            return Err(Error::Tokenizer(format!("chat template does not compile: {e}")));
        }
        let ctx = context(messages, opts, special)?;
        let items = messages.len() as u64 + opts.tools.map_or(0, |t| t.len() as u64);
        let fuel = self.limits.fuel_for(items);
        let input_bytes = json_len(&ctx);
        let budget = self.limits.value_bytes_for(items, input_bytes);
        // The fuel is the environment's, read when a render starts: a copy of it (templates are
        // compiled once, the copy shares them) carries this render's. The budget's rewrite adds
        // at most one instruction per instruction, hence twice the fuel.
        let mut env = self.env.clone();
        env.set_fuel(Some(fuel.saturating_mul(2)));
        let tmpl = env.get_template(name).map_err(|e| Error::Tokenizer(describe(&e)))?;
        let compiled = machinery::get_compiled_template(&tmpl);
        let refuse = |e: String| Error::Tokenizer(format!("chat template error: {e}"));
        let program = template_budget::bounded(&compiled.instructions).map_err(refuse)?;
        let blocks = compiled
            .blocks
            .iter()
            .map(|(name, block)| Ok((*name, template_budget::bounded(block)?)))
            .collect::<std::result::Result<_, String>>()
            .map_err(refuse)?;
        let scope = BudgetScope::enter(budget);
        let mut rendered = String::new();
        let result = Vm::new(&env)
            .eval(
                &program,
                Value::from_serialize(&ctx),
                &blocks,
                &mut machinery::make_string_output(&mut rendered),
                compiled.initial_auto_escape,
            )
            .map(drop);
        match result {
            Ok(()) if rendered.len() > self.limits.max_output => Err(Error::Tokenizer(format!(
                "chat template error: the rendered prompt exceeds {} bytes",
                self.limits.max_output
            ))),
            Ok(()) => Ok(rendered),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(Error::Tokenizer(format!(
                "chat template error: rendering ran more than {fuel} template instructions \
                 (the template loops without end?)"
            ))),
            Err(e) if scope.exceeded() => Err(Error::Tokenizer(format!(
                "chat template error: {} (the budget for {items} messages and tools of {input_bytes} bytes)",
                describe(&e)
            ))),
            Err(e) => Err(Error::Tokenizer(format!("chat template error: {}", describe(&e)))),
        }
    }
}

/// The bytes of `value` as JSON, counted without writing them.
fn json_len(value: &Map<String, Json>) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            self.0 += data.len() as u64;
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, value);
    c.0
}

/// The variables transformers passes: special-token strings, then extra keyword arguments,
/// then `messages`, `tools`, `documents`, `add_generation_prompt`.
fn context(messages: &[ChatMessage], opts: &TemplateOptions<'_>, special: &SpecialTokens) -> Result<Map<String, Json>> {
    let mut ctx = Map::new();
    for (key, tok) in special.named() {
        ctx.insert(key.to_string(), Json::String(tok.to_string()));
    }
    for reserved in ["messages", "tools", "add_generation_prompt"] {
        if opts.extra.contains_key(reserved) {
            return Err(Error::InvalidArgument(format!(
                "extra template variable {reserved:?} is set by mlex itself"
            )));
        }
    }
    ctx.insert("documents".into(), Json::Null);
    for (k, v) in &opts.extra {
        ctx.insert(k.clone(), v.clone());
    }
    if let Some(on) = opts.enable_thinking {
        ctx.insert("enable_thinking".into(), Json::Bool(on));
    }
    ctx.insert("messages".into(), Json::Array(messages.iter().map(message_value).collect()));
    let tools = match opts.tools {
        Some(tools) => serde_json::to_value(tools).map_err(|e| Error::InvalidArgument(e.to_string()))?,
        None => Json::Null,
    };
    ctx.insert("tools".into(), tools);
    ctx.insert("add_generation_prompt".into(), Json::Bool(opts.add_generation_prompt));
    Ok(ctx)
}

/// A message as transformers hands it to the template: absent fields are left out (templates
/// test `is defined` / `in message`), reasoning goes under `reasoning_content` and `thinking`
/// (gpt-oss reads the latter), and tool calls are OpenAI objects with parsed arguments.
fn message_value(m: &ChatMessage) -> Json {
    let mut v = Map::new();
    if let Some(r) = &m.reasoning {
        v.insert("thinking".into(), Json::String(r.clone()));
    }
    v.insert("role".into(), Json::String(m.role.as_str().into()));
    // With images, content is the list of parts Hugging Face templates iterate
    // (`{"type": "image"}` where each image sits, the model's processor expands it).
    if m.images.is_empty() {
        v.insert("content".into(), Json::String(m.content.clone()));
    } else {
        v.insert("content".into(), m.content_parts_json(false));
    }
    if let Some(r) = &m.reasoning {
        v.insert("reasoning_content".into(), Json::String(r.clone()));
    }
    if !m.tool_calls.is_empty() {
        v.insert("tool_calls".into(), Json::Array(m.tool_calls.iter().map(|c| c.to_template_value()).collect()));
    }
    if let Some(id) = &m.tool_call_id {
        v.insert("tool_call_id".into(), Json::String(id.clone()));
    }
    if let Some(n) = &m.name {
        v.insert("name".into(), Json::String(n.clone()));
    }
    Json::Object(v)
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    // Jinja2's default Undefined: printable and falsy, but attribute access on it fails.
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    // Python string/dict/list methods (.strip(), .startswith(), .items(), .get(), ...), and the
    // value budget's charge function and pre-checked filters.
    template_budget::install(&mut env);
    // Jinja prints lists and dicts as Python reprs, and `none` is not iterable in Python.
    env.set_formatter(python_formatter);
    env.add_filter("string", |v: Value| pyrepr::py_str(&v).map(Value::from));
    env.add_test("iterable", |v: Value| !v.is_none() && v.try_iter().is_ok());
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env
}

/// Prints a value as Python Jinja2 does, charging the bytes to the render's budget (raw template
/// text comes through here too: see template_budget.rs).
fn python_formatter(out: &mut Output, state: &State, value: &Value) -> std::result::Result<(), minijinja::Error> {
    match value.kind() {
        ValueKind::Seq | ValueKind::Map => {
            let text = pyrepr::py_str(value)?;
            template_budget::charge(text.len() as u64)?;
            out.write_str(&text).map_err(|e| minijinja::Error::new(ErrorKind::WriteFailure, e.to_string()))
        }
        ValueKind::String => {
            template_budget::charge(value.as_str().map_or(0, |s| s.len() as u64))?;
            minijinja::escape_formatter(out, state, value)
        }
        _ => {
            // a number, a bool, none: a few bytes
            template_budget::charge(24)?;
            minijinja::escape_formatter(out, state, value)
        }
    }
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: Value, ensure_ascii: Option<Value>, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let mut opts = DumpOptions::default();
    if let Some(v) = ensure_ascii.or(kwargs.get::<Option<Value>>("ensure_ascii")?) {
        opts.ensure_ascii = v.is_true();
    }
    if let Some(v) = kwargs.get::<Option<Value>>("indent")? {
        opts.indent = indent_unit(&v)?;
    }
    if let Some(v) = kwargs.get::<Option<Value>>("separators")? {
        if !v.is_none() {
            let parts: Vec<String> = v
                .try_iter()?
                .map(|p| p.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: separators must be strings"))?;
            let [item, key] = <[String; 2]>::try_from(parts).map_err(|_| {
                minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: separators must be a pair")
            })?;
            opts.separators = Some((item, key));
        }
    }
    if let Some(v) = kwargs.get::<Option<Value>>("sort_keys")? {
        opts.sort_keys = v.is_true();
    }
    kwargs.assert_all_used()?;
    // An indent repeats per level and line: the text stops at what the render's budget has left.
    opts.max_len = Some(template_budget::remaining());
    Ok(Value::from(pyjson::dumps(&value, &opts)?))
}

/// Python's `indent`: an int n means n spaces (n <= 0: newlines only), a string is used as is.
fn indent_unit(v: &Value) -> std::result::Result<Option<String>, minijinja::Error> {
    if v.is_none() || v.is_undefined() {
        return Ok(None);
    }
    if let Some(s) = v.as_str() {
        return Ok(Some(s.to_string()));
    }
    match v.as_i64() {
        Some(n) if n > MAX_TOJSON_INDENT => Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: indent {n} is too wide (at most {MAX_TOJSON_INDENT})"),
        )),
        Some(n) => Ok(Some(" ".repeat(n.max(0) as usize))),
        None => Err(minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: indent must be an int or a string")),
    }
}

fn raise_exception(message: Option<Value>) -> std::result::Result<Value, minijinja::Error> {
    let msg = message.map(|m| m.to_string()).unwrap_or_default();
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

fn strftime_now(format: String) -> std::result::Result<String, minijinja::Error> {
    let items: Vec<_> = chrono::format::StrftimeItems::new(&format).collect();
    if items.iter().any(|i| matches!(i, chrono::format::Item::Error)) {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format {format:?}"),
        ));
    }
    let mut out = String::new();
    let written = match fixed_now() {
        Some(t) => write!(out, "{}", t.format_with_items(items.into_iter())),
        None => write!(out, "{}", chrono::Local::now().format_with_items(items.into_iter())),
    };
    written.map_err(|_| minijinja::Error::new(ErrorKind::InvalidOperation, "strftime_now: cannot format"))?;
    Ok(out)
}

/// `SOURCE_DATE_EPOCH` (the reproducible-builds convention) pins the date templates see, so
/// prompts, prompt caches and tests can be reproduced.
fn fixed_now() -> Option<chrono::DateTime<chrono::Utc>> {
    let secs: i64 = std::env::var("SOURCE_DATE_EPOCH").ok()?.trim().parse().ok()?;
    chrono::DateTime::from_timestamp(secs, 0)
}

/// The template's own message (for raise_exception: the text it raised) and where it happened.
fn describe(e: &minijinja::Error) -> String {
    let mut msg = match e.detail() {
        Some(d) => d.to_string(),
        None => e.kind().to_string(),
    };
    if let Some(line) = e.line() {
        let _ = write!(msg, " (template line {line})");
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let _ = write!(msg, ": {s}");
        source = s.source();
    }
    msg
}

/// transformers registers a `{% generation %}…{% endgeneration %}` tag (it marks assistant
/// tokens for training masks and renders its body unchanged). minijinja has no custom tags, so it
/// becomes `{% if true %}…{% endif %}`: same output, and the same whitespace control markers.
fn strip_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(pos) = rest.find("{%") {
        out.push_str(&rest[..pos]);
        let tag = &rest[pos..];
        // The closing `%}` comes after the opening `{%` (in `{%}` they overlap).
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            // Unclosed: the rest is kept as it is (once; what precedes it is already out).
            rest = tag;
            break;
        };
        let inner = &tag[2..end];
        let (lead, body) = split_marker_start(inner);
        let (body, trail) = split_marker_end(body);
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => {
                let _ = write!(out, "{{%{lead} {r} {trail}%}}");
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn split_marker_start(s: &str) -> (&str, &str) {
    match s.chars().next() {
        Some('-' | '+') => (&s[..1], &s[1..]),
        _ => ("", s),
    }
}

fn split_marker_end(s: &str) -> (&str, &str) {
    match s.chars().last() {
        Some('-' | '+') => (&s[..s.len() - 1], &s[s.len() - 1..]),
        _ => (s, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ToolCall;
    use serde_json::json;

    fn render(src: &str, messages: &[ChatMessage], opts: &TemplateOptions<'_>) -> Result<String> {
        let special = SpecialTokens { bos: Some("<s>".into()), eos: Some("</s>".into()), ..Default::default() };
        ChatTemplate::new(TemplateSource::Single(src.into())).render(messages, opts, &special)
    }

    fn user(s: &str) -> Vec<ChatMessage> {
        vec![ChatMessage::user(s)]
    }

    #[test]
    fn trim_and_lstrip_blocks() {
        let src = "{{ bos_token }}\n{% for m in messages %}\n  {% if true %}\n[{{ m.role }}]{{ m.content }}\n  {% endif %}\n{% endfor %}\n";
        let out = render(src, &user("hi"), &TemplateOptions::default()).unwrap();
        assert_eq!(out, "<s>\n[user]hi\n");
    }

    #[test]
    fn raise_exception_message_surfaces() {
        let src = "{% if messages[0].role != 'system' %}{{ raise_exception('System message required!') }}{% endif %}";
        let err = render(src, &user("x"), &TemplateOptions::default()).unwrap_err();
        assert!(matches!(err, Error::Tokenizer(_)));
        assert!(err.to_string().contains("System message required!"), "{err}");
    }

    #[test]
    fn empty_messages_rejected() {
        let err = render("x", &[], &TemplateOptions::default()).unwrap_err();
        assert!(err.to_string().contains("empty conversation"), "{err}");
    }

    #[test]
    fn tojson_like_transformers() {
        let src = "{{ messages[0].tool_calls[0].function.arguments | tojson }}|{{ {'a': [1, 2]} | tojson(indent=2) }}|{{ 'é<' | tojson }}|{{ {'b': 1, 'a': 2} | tojson(sort_keys=true, separators=[',', ':']) }}";
        let msgs = vec![ChatMessage::assistant_with_tool_calls(
            "",
            vec![ToolCall::new("c1", "f", json!({"city": "Zürich", "n": 1.5}))],
        )];
        let out = render(src, &msgs, &TemplateOptions::default()).unwrap();
        assert_eq!(out, "{\"city\": \"Zürich\", \"n\": 1.5}|{\n  \"a\": [\n    1,\n    2\n  ]\n}|\"é<\"|{\"a\":2,\"b\":1}");
    }

    #[test]
    fn python_methods_and_namespace() {
        let src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m.content.strip().upper() }}{{ m.content.startswith(' a') }}{% endfor %}{{ ns.n }}";
        let out = render(src, &user(" abc "), &TemplateOptions::default()).unwrap();
        assert_eq!(out, "ABCTrue1");
    }

    #[test]
    fn optional_variables() {
        let src = "{{ enable_thinking is defined }}{{ tools is none }}{{ documents is none }}{{ add_generation_prompt }}{{ date_string }}";
        let out = render(src, &user("x"), &TemplateOptions::default()).unwrap();
        assert_eq!(out, "FalseTrueTrueTrue");
        let mut opts = TemplateOptions { enable_thinking: Some(false), add_generation_prompt: false, ..Default::default() };
        opts.extra.insert("date_string".into(), json!("1 Jan"));
        let tools = [Tool::function("f", None, json!({}))];
        opts.tools = Some(&tools);
        let out = render(src, &user("x"), &opts).unwrap();
        assert_eq!(out, "TrueFalseTrueFalse1 Jan");
    }

    #[test]
    fn message_fields_absent_when_unset() {
        let src = "{% for m in messages %}{{ m.keys() | list | join(',') }};{% endfor %}";
        let msgs = vec![
            ChatMessage::user("u"),
            ChatMessage::assistant_with_reasoning("a", "r"),
            ChatMessage::tool("c1", "42"),
        ];
        let out = render(src, &msgs, &TemplateOptions::default()).unwrap();
        assert_eq!(out, "role,content;thinking,role,content,reasoning_content;role,content,tool_call_id;");
    }

    #[test]
    fn generation_tags_and_loop_controls() {
        let src = "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{%- generation -%} {{ m.content }} {%- endgeneration %}{% break %}{% endfor %}";
        let msgs = vec![ChatMessage::user("a"), ChatMessage::assistant("b"), ChatMessage::user("c")];
        assert_eq!(render(src, &msgs, &TemplateOptions::default()).unwrap(), "b");
    }

    #[test]
    fn strftime_now_formats() {
        let out = render("{{ strftime_now('%Y') }}", &user("x"), &TemplateOptions::default()).unwrap();
        assert_eq!(out.len(), 4);
        assert!(render("{{ strftime_now('%Q') }}", &user("x"), &TemplateOptions::default()).is_err());
    }

    #[test]
    fn compile_error_is_deferred() {
        let t = ChatTemplate::new(TemplateSource::Single("{% for %}".into()));
        let err = t.render(&user("x"), &TemplateOptions::default(), &SpecialTokens::default()).unwrap_err();
        assert!(err.to_string().contains("does not compile"), "{err}");
    }

    // Found by fuzz/fuzz_targets/chat_template.rs (corpus/chat_template/regress-overlapping-tag):
    // `{%}` made the generation-tag rewrite slice `[2..1]` and panic.
    #[test]
    fn overlapping_block_delimiters_do_not_panic() {
        assert_eq!(strip_generation_tags("a{%}b"), "a{%}b");
        assert_eq!(strip_generation_tags("{%}{% generation %}x{% endgeneration %}"), "{%}{% generation %}x{% endif %}");
        // An unclosed tag: the text before it once.
        assert_eq!(strip_generation_tags("ab{% x"), "ab{% x");
        assert!(render("{%}", &user("x"), &TemplateOptions::default()).is_err());
    }

    #[test]
    fn endless_loops_run_out_of_fuel() {
        let src = "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}";
        // (The default bound, 20 M instructions, takes seconds in a debug build: a smaller one.)
        let limits = TemplateLimits { fuel: 100_000, ..Default::default() };
        let t = ChatTemplate::new(TemplateSource::Single(src.into())).with_limits(limits);
        let err = t.render(&user("x"), &TemplateOptions::default(), &SpecialTokens::default()).unwrap_err();
        assert!(err.to_string().contains("more than 150010 template instructions"), "{err}");
    }

    #[test]
    fn long_conversations_fit_the_default_fuel() {
        // Each message looks back over all earlier ones (as google-gemma-4's template does).
        let src = "{% for m in messages %}{% set ns = namespace(n=0) %}{% for p in messages[:loop.index0] %}\
                   {% if p.role == m.role %}{% set ns.n = ns.n + 1 %}{% endif %}{% endfor %}{{ ns.n }}{% endfor %}";
        let msgs: Vec<ChatMessage> = (0..500).map(|i| ChatMessage::user(format!("m{i}"))).collect();
        let out = render(src, &msgs, &TemplateOptions::default()).unwrap();
        assert!(out.ends_with("499"), "{}", &out[out.len() - 10..]);
    }

    #[test]
    fn operator_chains_too_deep_to_compile_are_an_error_not_a_stack_overflow() {
        // 50,000 levels: compiling it, walking its constants or dropping its AST recursed once
        // per level. The check reads tokens only, so a small stack is enough.
        let src = format!("{{{{ 1{} }}}}", " + 1".repeat(50_000));
        let err = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || {
                let t = ChatTemplate::new(TemplateSource::Single(src));
                t.render(&[ChatMessage::user("hi")], &TemplateOptions::default(), &SpecialTokens::default()).unwrap_err()
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(err.to_string().contains("chains 50000 operators"), "{err}");
    }

    #[test]
    fn recursion_is_bounded() {
        let src = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
        let err = render(src, &user("x"), &TemplateOptions::default()).unwrap_err();
        assert!(err.to_string().contains("recursion"), "{err}");
    }

    #[test]
    fn output_is_bounded() {
        // 100 MB strings (minijinja's own cap on `*`), printed 100 times: the value budget stops it.
        let src = "{% for i in range(100) %}{{ 'x' * (messages|length * 100000000) }}{% endfor %}";
        let err = render(src, &user("x"), &TemplateOptions::default()).unwrap_err();
        assert!(err.to_string().contains("bytes of values"), "{err}");
        // 100 MB printed 1 MB at a time fits the budget, not the output cap.
        let src = "{% for i in range(100) %}{{ 'x' * 1000000 }}{% endfor %}";
        let err = render(src, &user("x"), &TemplateOptions::default()).unwrap_err();
        assert!(err.to_string().contains("exceeds 67108864 bytes"), "{err}");
        let limits = TemplateLimits { max_output: 8, ..Default::default() };
        let small = ChatTemplate::new(TemplateSource::Single("{{ 'ab' * 10 }}".into())).with_limits(limits);
        let err = small.render(&user("x"), &TemplateOptions::default(), &SpecialTokens::default()).unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
    }

    #[test]
    fn tojson_indent_is_bounded() {
        let err = render("{{ 1 | tojson(indent=100000000000) }}", &user("x"), &TemplateOptions::default()).unwrap_err();
        assert!(err.to_string().contains("too wide"), "{err}");
        assert_eq!(render("{{ [1] | tojson(indent=1) }}", &user("x"), &TemplateOptions::default()).unwrap(), "[\n 1\n]");
    }

    #[test]
    fn named_templates_pick_tool_use() {
        let t = ChatTemplate::new(TemplateSource::Named(vec![
            ("default".into(), "D".into()),
            ("tool_use".into(), "T".into()),
        ]));
        let special = SpecialTokens::default();
        let tools = [Tool::function("f", None, Json::Null)];
        let with = TemplateOptions { tools: Some(&tools), ..Default::default() };
        assert_eq!(t.render(&user("x"), &TemplateOptions::default(), &special).unwrap(), "D");
        assert_eq!(t.render(&user("x"), &with, &special).unwrap(), "T");
    }
}
