//! Constrained decoding: a request's output held to a JSON Schema, a regular expression or a Lark
//! grammar by llguidance over the model's own tokenizer. Before each sampled token the request's
//! matcher says which tokens may come next; the others get -inf logits (so logprobs are those of
//! the constrained distribution). When the grammar is complete only EOS remains, and the reply
//! ends there. A reasoning span the prompt opens stays free text: the constraint starts after
//! its closer.
//!
//! `tool_choice` auto holds tool calls lazily ([`ResponseFormat::ToolCalls`]): the model
//! writes freely, with no mask and no wait between steps, until the reply's output classifier
//! sees it open a call (`request::Reply`); from then until the call's closing marker the call
//! is held to a valid call of one of the tools ([`ToolCallTrigger`]), then the model is free
//! again.
//!
//! One [`Grammars`] per session (built on first use: the token trie of the vocabulary); one
//! [`Constraint`] per request, owned by its sampling state (`generator::Stepper`).
use crate::chat::tool_choice::LazyCallGrammar;
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{InferenceCapabilities, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// What a reply must be (`GenerateOptions::response_format`).
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// JSON valid against this schema (OpenAI's `json_schema`, `strict` schemas included).
    JsonSchema(Value),
    /// A whole match of this regular expression.
    Regex(String),
    /// A string of this Lark grammar (llguidance's Lark dialect).
    Grammar(String),
    /// Free text, but a tool call the model opens is held to a valid call (`tool_choice` auto;
    /// set by the session, never read from a request).
    ToolCalls(ToolCallTrigger),
}

impl ResponseFormat {
    /// `{type: "json_schema", schema} | {type: "json_schema", json_schema: {schema, …}}` (OpenAI),
    /// `{type: "json_object"}`, `{type: "regex", pattern}`, `{type: "grammar", lark}`,
    /// `{type: "text"}` (None: unconstrained). `name` is how the caller spells the option.
    pub fn from_json(v: &Value, name: &str) -> std::result::Result<Option<Self>, String> {
        let obj = v.as_object().ok_or_else(|| format!("{name} must be an object with a 'type', got {v}"))?;
        let field = |k: &str| obj.get(k).filter(|x| !x.is_null());
        let string = |k: &str| -> std::result::Result<String, String> {
            match field(k) {
                Some(Value::String(s)) => Ok(s.clone()),
                Some(other) => Err(format!("{name}.{k} must be a string, got {other}")),
                None => Err(format!("{name}.{k} is required for type '{}'", obj["type"].as_str().unwrap_or(""))),
            }
        };
        match obj.get("type").and_then(Value::as_str) {
            Some("text") => Ok(None),
            Some("json_object") => Ok(Some(ResponseFormat::JsonObject)),
            Some("json_schema") => {
                let schema = field("schema")
                    .or_else(|| field("json_schema").and_then(|j| j.get("schema")))
                    .ok_or_else(|| format!("{name}.schema is required for type 'json_schema'"))?;
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(format!("{name}.schema must be a JSON Schema object, got {schema}"));
                }
                Ok(Some(ResponseFormat::JsonSchema(schema.clone())))
            }
            Some("regex") => Ok(Some(ResponseFormat::Regex(string("pattern")?))),
            Some("grammar") => Ok(Some(ResponseFormat::Grammar(string("lark")?))),
            Some(other) => Err(format!(
                "{name}.type must be 'json_schema', 'json_object', 'regex', 'grammar' or 'text', got {other:?}"
            )),
            None => Err(format!("{name}.type is required")),
        }
    }

    /// The lazy tool-call trigger, when this is one.
    pub fn trigger(&self) -> Option<&ToolCallTrigger> {
        match self {
            ResponseFormat::ToolCalls(t) => Some(t),
            _ => None,
        }
    }

    fn grammar(&self) -> TopLevelGrammar {
        match self {
            ResponseFormat::JsonObject => TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"}))),
            ResponseFormat::JsonSchema(s) => TopLevelGrammar::from_json_schema(compact(s.clone())),
            ResponseFormat::Regex(r) => TopLevelGrammar::from_regex(r),
            ResponseFormat::Grammar(l) => TopLevelGrammar::from_lark(l.clone()),
            ResponseFormat::ToolCalls(_) => unreachable!("tool calls compile their grammars when a call opens"),
        }
    }
}

/// JSON written as a model usually writes it, `{"a": 1, "b": [2, 3]}`, with no other
/// whitespace between tokens (else a small model can pad with blanks until it runs out of
/// tokens). A schema's own `x-guidance` options win.
fn compact(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
        });
    }
    schema
}

/// The vocabulary as llguidance sees it: each token's bytes in a trie, and our tokenizer for
/// the strings a grammar names.
struct Env {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.tokenizer.encode(&String::from_utf8_lossy(s), false).unwrap_or_default()
    }
}

/// A session's grammar compiler over its model's vocabulary.
pub struct Grammars {
    factory: Arc<Compiler>,
    vocab: usize,
    tokenizer: Tokenizer,
}

/// Compiles grammars; keeps the tool-call grammars it compiled last (a conversation's requests
/// offer the same tools again and again).
struct Compiler {
    factory: ParserFactory,
    calls: Mutex<HashMap<String, Matcher>>,
}

/// Tool-call grammars kept compiled.
const KEEP_CALL_GRAMMARS: usize = 16;

impl Compiler {
    /// A fresh matcher of the Lark grammar `lark` (kept compiled for the next time).
    fn call_matcher(&self, lark: &str) -> Result<Matcher> {
        let mut cache = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = cache.get(lark) {
            return Ok(m.deep_clone());
        }
        let parser = self
            .factory
            .create_parser(TopLevelGrammar::from_lark(lark.to_string()))
            .map_err(|e| Error::InvalidArgument(format!("tool call grammar: {e}")))?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(Error::InvalidArgument(format!("tool call grammar: {e}")));
        }
        if cache.len() >= KEEP_CALL_GRAMMARS {
            cache.clear();
        }
        cache.insert(lark.to_string(), m.deep_clone());
        Ok(m)
    }
}

impl Grammars {
    /// `vocab`: the model's output rows (at least the tokenizer's); `eos`: the token that ends a
    /// reply once its grammar is complete.
    pub fn new(tokenizer: &Tokenizer, vocab: usize, eos: u32) -> Result<Self> {
        let json = tokenizer.inner().to_string(false).map_err(|e| Error::Tokenizer(e.to_string()))?;
        let json: Value = serde_json::from_str(&json).map_err(|e| Error::Tokenizer(e.to_string()))?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| Error::Tokenizer(format!("reading the vocabulary for constrained decoding: {e}")))?;
        // Rows of the output beyond the tokenizer's vocabulary are never allowed (empty bytes).
        words.resize(vocab.max(words.len()), vec![]);
        let info = TokRxInfo::new(words.len() as u32, eos);
        let env: TokEnv = Arc::new(Env { trie: TokTrie::from(&info, &words), tokenizer: tokenizer.clone() });
        let caps = InferenceCapabilities { ff_tokens: false, backtrack: false, conditional_ff_tokens: false, fork: false };
        let mut factory = ParserFactory::new(&env, caps, &llguidance::earley::SlicedBiasComputer::general_slices())
            .map_err(|e| Error::Tokenizer(format!("constrained decoding: {e}")))?;
        factory.quiet();
        let factory = Arc::new(Compiler { factory, calls: Mutex::new(HashMap::new()) });
        Ok(Grammars { factory, vocab, tokenizer: tokenizer.clone() })
    }

    /// A request's matcher for `format`; an invalid schema, regex or grammar is an
    /// `INVALID_ARGUMENT` naming what is wrong. `gate`: the token ids that close a reasoning span
    /// the prompt opened (the constraint starts after them).
    pub fn constraint(&self, format: &ResponseFormat, gate: Option<Vec<u32>>) -> Result<Constraint> {
        if let ResponseFormat::ToolCalls(trigger) = format {
            trigger.bind(self.factory.clone(), self.tokenizer.clone());
            return Ok(Constraint {
                kind: Kind::Calls(trigger.clone()),
                vocab: self.vocab,
                gate: None,
                seen: vec![],
                blank_after_gate: false,
                tokenizer: self.tokenizer.clone(),
            });
        }
        let parser = self
            .factory
            .factory
            .create_parser(format.grammar())
            .map_err(|e| Error::InvalidArgument(format!("response_format: {e}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(Error::InvalidArgument(format!("response_format: {e}")));
        }
        Ok(Constraint { kind: Kind::Whole(matcher), vocab: self.vocab, gate, seen: vec![], blank_after_gate: false, tokenizer: self.tokenizer.clone() })
    }
}

/// One request's constraint.
pub struct Constraint {
    kind: Kind,
    vocab: usize,
    /// While Some: inside a reasoning span, waiting for these closing token ids.
    gate: Option<Vec<u32>>,
    /// Tokens seen while gated (to find the closer).
    seen: Vec<u32>,
    /// Right after the closer: whitespace tokens (a forced closer's "\n\n") are still part of
    /// the reasoning's end, not of the answer.
    blank_after_gate: bool,
    tokenizer: Tokenizer,
}

/// What a constraint holds.
enum Kind {
    /// The whole reply (after a reasoning span the prompt opens).
    Whole(Matcher),
    /// Only the tool calls the model opens.
    Calls(ToolCallTrigger),
}

impl Constraint {
    /// Takes generated tokens (fed back to the model) in order.
    pub fn feed(&mut self, ids: &[u32]) -> Result<()> {
        let matcher = match &mut self.kind {
            Kind::Whole(m) => m,
            Kind::Calls(t) => {
                t.feed(ids);
                return Ok(());
            }
        };
        for &id in ids {
            if let Some(close) = &self.gate {
                self.seen.push(id);
                if self.seen.ends_with(close) {
                    self.gate = None;
                    self.seen.clear();
                    self.blank_after_gate = true;
                }
                continue;
            }
            if self.blank_after_gate {
                if self.tokenizer.decode(&[id], false)?.trim().is_empty() {
                    continue;
                }
                self.blank_after_gate = false;
            }
            // After the grammar completed only EOS was allowed: the rest is the reply's end.
            if matcher.is_stopped() {
                break;
            }
            matcher.consume_token(id).map_err(|e| Error::InvalidArgument(format!("response_format: {e}")))?;
        }
        Ok(())
    }

    /// Whether the next token is constrained (not inside the prompt's reasoning span; inside a
    /// tool call the model opened).
    pub fn active(&self) -> bool {
        match &self.kind {
            Kind::Whole(_) => self.gate.is_none(),
            Kind::Calls(t) => t.engaged(),
        }
    }

    /// Whether it needs the generated tokens now (each step then waits for the token before
    /// it): always, but for tool calls only while one is being written.
    pub fn engaged(&self) -> bool {
        match &self.kind {
            Kind::Whole(_) => true,
            Kind::Calls(t) => t.engaged(),
        }
    }

    /// The additive mask of the next token (0 allowed, -inf not), `vocab` long; only EOS once
    /// the grammar is complete.
    pub fn mask(&mut self) -> Result<Vec<f32>> {
        match &mut self.kind {
            Kind::Whole(matcher) => {
                let allowed =
                    matcher.compute_mask_or_eos().map_err(|e| Error::InvalidArgument(format!("response_format: {e}")))?;
                Ok(additive(&allowed, self.vocab))
            }
            Kind::Calls(t) => Ok(t.mask(self.vocab)),
        }
    }
}

fn additive(allowed: &llguidance::toktrie::SimpleVob, vocab: usize) -> Vec<f32> {
    let mut m = vec![f32::NEG_INFINITY; vocab];
    allowed.iter_set_entries(|i| {
        if i < m.len() {
            m[i] = 0.0;
        }
    });
    m
}

/// `tool_choice` auto: the grammars of the calls the model may open, shared by the request's
/// reply (which sees a call open, in the text it streams) and its constraint (which holds the
/// call's tokens until it closes). Nothing is compiled, and no step waits, until a call opens.
#[derive(Clone)]
pub struct ToolCallTrigger(Arc<Mutex<Lazy>>);

struct Lazy {
    grammars: Vec<LazyCallGrammar>,
    /// The session's compiler and tokenizer (bound when the request starts).
    env: Option<(Arc<Compiler>, Tokenizer)>,
    /// The call being written: its matcher, and whether it ends at a closing marker.
    current: Option<(Matcher, bool)>,
}

impl std::fmt::Debug for ToolCallTrigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let openers: Vec<&str> = self.lock().grammars.iter().map(|g| g.opener).collect();
        f.debug_tuple("ToolCallTrigger").field(&openers).finish()
    }
}

impl PartialEq for ToolCallTrigger {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl ToolCallTrigger {
    /// Holds the calls opened with each grammar's marker to that grammar.
    pub fn new(grammars: Vec<LazyCallGrammar>) -> Self {
        ToolCallTrigger(Arc::new(Mutex::new(Lazy { grammars, env: None, current: None })))
    }

    fn lock(&self) -> MutexGuard<'_, Lazy> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bind(&self, compiler: Arc<Compiler>, tokenizer: Tokenizer) {
        self.lock().env = Some((compiler, tokenizer));
    }

    /// The model opened a call with `opener` and wrote `written` after it: holds the rest of
    /// the call to its grammar. Returns the tokens the grammar forces next (for the caller to
    /// feed in place of the token sampled before the call was seen: it was sampled free), or
    /// None when the call is not held (no grammar for this marker, or what was written
    /// already fits none).
    pub fn arm(&self, opener: &str, written: &str) -> Option<Vec<u32>> {
        let mut lazy = self.lock();
        lazy.current = None;
        let g = lazy.grammars.iter().find(|g| g.opener == opener)?.clone();
        let (compiler, tokenizer) = lazy.env.clone()?;
        let mut m = compiler.call_matcher(&g.lark).ok()?;
        if !written.is_empty() {
            let ids = tokenizer.encode(written, false).ok()?;
            m.consume_tokens(&ids).ok()?;
        }
        let forced = m.compute_ff_tokens();
        lazy.current = Some((m, g.closes));
        Some(forced)
    }

    /// Whether a call is being held.
    pub fn engaged(&self) -> bool {
        self.lock().current.is_some()
    }

    fn feed(&self, ids: &[u32]) {
        let mut lazy = self.lock();
        for &id in ids {
            let Some((m, closes)) = &mut lazy.current else { return };
            let closes = *closes;
            // A token the grammar refuses (sampled before the call was held) lets the call go.
            let done = m.consume_token(id).is_err()
                || m.is_stopped()
                || (closes && m.is_accepting().unwrap_or(false));
            if done {
                lazy.current = None;
            }
        }
    }

    fn mask(&self, vocab: usize) -> Vec<f32> {
        let mut lazy = self.lock();
        let Some((m, _)) = &mut lazy.current else { return vec![0.0; vocab] };
        match m.compute_mask_or_eos() {
            Ok(allowed) => additive(&allowed, vocab),
            Err(_) => {
                lazy.current = None;
                vec![0.0; vocab]
            }
        }
    }
}

/// The token ids that close the reasoning span `prompt` opens, if it opens one (the constraint
/// waits for them).
pub fn reasoning_gate(tokenizer: Option<&Tokenizer>, prompt: &[u32]) -> Result<Option<Vec<u32>>> {
    match (tokenizer, super::request::prompt_opens_reasoning(tokenizer, prompt)?) {
        (Some(t), Some(f)) => Ok(Some(t.encode(f.close(), false)?)),
        _ => Ok(None),
    }
}
