//! Constrained decoding: a request's output held to a JSON Schema, a regular expression or a Lark
//! grammar by llguidance over the model's own tokenizer. Before each sampled token the request's
//! matcher says which tokens may come next; the others get -inf logits (so logprobs are those of
//! the constrained distribution). When the grammar is complete only EOS remains, and the reply
//! ends there. A reasoning span the prompt opens stays free text: the constraint starts after
//! its closer.
//!
//! One [`Grammars`] per session (built on first use: the token trie of the vocabulary); one
//! [`Constraint`] per request, owned by its sampling state (`generator::Stepper`).
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{InferenceCapabilities, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use std::sync::Arc;

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

    fn grammar(&self) -> TopLevelGrammar {
        match self {
            ResponseFormat::JsonObject => TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"}))),
            ResponseFormat::JsonSchema(s) => TopLevelGrammar::from_json_schema(compact(s.clone())),
            ResponseFormat::Regex(r) => TopLevelGrammar::from_regex(r),
            ResponseFormat::Grammar(l) => TopLevelGrammar::from_lark(l.clone()),
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
    factory: ParserFactory,
    vocab: usize,
    tokenizer: Tokenizer,
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
        Ok(Grammars { factory, vocab, tokenizer: tokenizer.clone() })
    }

    /// A request's matcher for `format`; an invalid schema, regex or grammar is an
    /// `INVALID_ARGUMENT` naming what is wrong. `gate`: the token ids that close a reasoning span
    /// the prompt opened (the constraint starts after them).
    pub fn constraint(&self, format: &ResponseFormat, gate: Option<Vec<u32>>) -> Result<Constraint> {
        let parser = self
            .factory
            .create_parser(format.grammar())
            .map_err(|e| Error::InvalidArgument(format!("response_format: {e}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(Error::InvalidArgument(format!("response_format: {e}")));
        }
        Ok(Constraint { matcher, vocab: self.vocab, gate, seen: vec![], blank_after_gate: false, tokenizer: self.tokenizer.clone() })
    }
}

/// One request's constraint.
pub struct Constraint {
    matcher: Matcher,
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

impl Constraint {
    /// Takes generated tokens (fed back to the model) in order.
    pub fn feed(&mut self, ids: &[u32]) -> Result<()> {
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
            if self.matcher.is_stopped() {
                break;
            }
            self.matcher.consume_token(id).map_err(|e| Error::InvalidArgument(format!("response_format: {e}")))?;
        }
        Ok(())
    }

    /// Whether the next token is constrained (not inside the prompt's reasoning span).
    pub fn active(&self) -> bool {
        self.gate.is_none()
    }

    /// The additive mask of the next token (0 allowed, -inf not), `vocab` long; only EOS once
    /// the grammar is complete.
    pub fn mask(&mut self) -> Result<Vec<f32>> {
        let allowed =
            self.matcher.compute_mask_or_eos().map_err(|e| Error::InvalidArgument(format!("response_format: {e}")))?;
        let mut m = vec![f32::NEG_INFINITY; self.vocab];
        allowed.iter_set_entries(|i| {
            if i < m.len() {
                m[i] = 0.0;
            }
        });
        Ok(m)
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
