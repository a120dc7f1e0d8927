//! Lark grammars (llguidance's dialect) of tool calls in each call format, built from the
//! tools' JSON schemas, so that a constrained call always parses (with this module's sibling
//! parsers in `tools.rs`) into arguments that validate. JSON formats (Hermes, Llama 3, Mistral,
//! the generic format) hold the arguments with `%json`; the others write values in their own
//! syntax, compiled here from the schema: Qwen3-Coder's XML (bare text for strings, JSON for the
//! rest), Gemma 4's `{key:<|"|>text<|"|>,n:1}` and Gemma 3's Python calls `f(key="text", n=1)`.
//!
//! Covered schema keywords: type (also lists), properties, required, additionalProperties
//! (dropped: only declared properties are written), items, prefixItems, minItems, maxItems,
//! enum, const, anyOf, oneOf (as anyOf), allOf (properties merged), $ref into the tool's own
//! schema, and for strings minLength, maxLength, pattern. Numbers, booleans and null are
//! written alike in every format, so they go through `%json` with their bounds.
use super::Tool;
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// What a call grammar needs to know of the model beyond its format.
pub struct CallSyntax<'a> {
    /// The id of a marker that is a single token of the vocabulary (an added or special token):
    /// the grammar matches that token, so markers the tokenizer marks special work too.
    pub marker_id: Box<dyn Fn(&str) -> Option<u32> + 'a>,
    /// Mistral: `[TOOL_CALLS]name[ARGS]{…}` (the newer templates) rather than
    /// `[TOOL_CALLS][{"name": …, "arguments": {…}}]`.
    pub mistral_args: bool,
}

impl<'a> CallSyntax<'a> {
    /// The markers of `tokenizer`'s vocabulary; Mistral's variant from its chat template.
    pub fn for_tokenizer(tokenizer: &'a crate::tokenizer::Tokenizer) -> Self {
        let mistral_args = tokenizer.chat_template().and_then(|t| t.source(true)).is_some_and(|s| s.contains("[ARGS]"));
        CallSyntax { marker_id: Box::new(move |m| tokenizer.token_to_id(m)), mistral_args }
    }
}

impl CallSyntax<'static> {
    /// No marker is a token of its own (they are matched as text).
    pub fn plain() -> Self {
        CallSyntax { marker_id: Box::new(|_| None), mistral_args: false }
    }
}

/// How values are written inside a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Syntax {
    /// Gemma 4: strings between `<|"|>`, bare keys, `,` and `:` without spaces.
    Gemma,
    /// Python literals: `"text"` (escapes `\"`, `\\`, `\n`, `\t`), `True`, `None`, `{"k": v}`.
    Python,
}

pub(crate) const GEMMA_QUOTE: &str = "<|\"|>";
/// Deeper schemas (or recursive `$ref`s) take any value from here on.
const MAX_DEPTH: usize = 12;
/// Longer bounds than this are left unbounded (a counted repetition grows the automaton).
const MAX_COUNT: u64 = 512;

/// Builds one grammar: rules added as they are needed, each named once.
pub(crate) struct Builder<'s, 'a> {
    syntax: &'s CallSyntax<'a>,
    rules: Vec<String>,
    n: usize,
    any: HashMap<Syntax, String>,
}

impl<'s, 'a> Builder<'s, 'a> {
    pub(crate) fn new(syntax: &'s CallSyntax<'a>) -> Self {
        Builder { syntax, rules: vec![], n: 0, any: HashMap::new() }
    }

    /// The grammar: `start: <start>` and every rule it uses.
    pub(crate) fn finish(self, start: &str) -> String {
        let mut g = format!("start: {start}\n");
        for r in self.rules {
            g.push_str(&r);
            g.push('\n');
        }
        g
    }

    /// A new rule (lowercase: a grammar rule) or terminal (uppercase) named after `stem`.
    fn add(&mut self, stem: &str, body: String) -> String {
        self.n += 1;
        let name = format!("{stem}_{}", self.n);
        self.rules.push(format!("{name}: {body}"));
        name
    }

    /// A format's marker: its token when it is one token, else its text.
    pub(crate) fn marker(&self, m: &str) -> String {
        match (self.syntax.marker_id)(m) {
            Some(id) => format!("<[{id}]>"),
            None => lit(m),
        }
    }

    /// One JSON value valid against `schema` (a tool's `$defs` come along), written compactly.
    pub(crate) fn json(&mut self, schema: &Value, root: &Value) -> String {
        let mut s = if schema.is_object() { schema.clone() } else { json!({}) };
        if let Some(o) = s.as_object_mut() {
            for k in ["$defs", "definitions"] {
                if let (Some(d), false) = (root.get(k), o.contains_key(k)) {
                    o.insert(k.into(), d.clone());
                }
            }
            o.entry("x-guidance")
                .or_insert_with(|| json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}));
        }
        format!("%json {s}")
    }

    /// Items in order, those not required may be left out, `sep` between those written.
    pub(crate) fn seq(&mut self, items: &[(String, bool)], sep: &str) -> String {
        if items.is_empty() {
            return "\"\"".into();
        }
        let sep = if sep.is_empty() { String::new() } else { format!("{} ", lit(sep)) };
        // tail_i: the items from i on, each after a separator; head_i: the same, the first
        // written without one.
        let (mut tail, mut head) = ("\"\"".to_string(), "\"\"".to_string());
        for (e, required) in items.iter().rev() {
            let new_tail = if *required { format!("{sep}{e} {tail}") } else { format!("({sep}{e})? {tail}") };
            let new_head = if *required { format!("{e} {tail}") } else { format!("{e} {tail} | {head}") };
            tail = self.add("tail", new_tail);
            head = self.add("head", new_head);
        }
        head
    }

    /// A value valid against `schema` in `syn`.
    pub(crate) fn value(&mut self, schema: &Value, root: &Value, syn: Syntax, depth: usize) -> Result<String, String> {
        let s = resolve(schema, root, 0)?;
        if depth > MAX_DEPTH {
            return Ok(self.any(syn));
        }
        let Some(o) = s.as_object() else {
            return match s {
                Value::Bool(false) => Err("a schema is `false`: no value is allowed".into()),
                _ => Ok(self.any(syn)),
            };
        };
        if let Some(c) = o.get("const") {
            return literal(c, syn, self).ok_or_else(|| format!("const {c} cannot be written in this call format"));
        }
        if let Some(Value::Array(e)) = o.get("enum") {
            let alts: Vec<String> = e.iter().filter_map(|v| literal(v, syn, self)).collect();
            if alts.is_empty() {
                return Err(format!("no value of enum {} can be written in this call format", Value::Array(e.clone())));
            }
            return Ok(format!("({})", alts.join(" | ")));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(branches)) = o.get(key) {
                let mut alts = vec![];
                for b in branches {
                    alts.push(self.value(&with_siblings(o, b, key), root, syn, depth + 1)?);
                }
                return Ok(format!("({})", alts.join(" | ")));
            }
        }
        if let Some(Value::Array(parts)) = o.get("allOf") {
            let merged = merge_all_of(o, parts, root)?;
            return self.value(&merged, root, syn, depth + 1);
        }
        match o.get("type") {
            Some(Value::Array(types)) => {
                let mut alts = vec![];
                for t in types {
                    let mut one = o.clone();
                    one.insert("type".into(), t.clone());
                    alts.push(self.value(&Value::Object(one), root, syn, depth + 1)?);
                }
                Ok(format!("({})", alts.join(" | ")))
            }
            Some(Value::String(t)) => match t.as_str() {
                "string" => Ok(self.string(o, syn)),
                "integer" | "number" | "boolean" | "null" => Ok(match (t.as_str(), syn) {
                    ("boolean", Syntax::Python) => "(\"True\" | \"False\")".into(),
                    ("null", Syntax::Python) => "\"None\"".into(),
                    _ => self.json(s, root),
                }),
                "object" => self.object(o, root, syn, depth),
                "array" => self.array(o, root, syn, depth),
                other => Err(format!("unknown type {other:?}")),
            },
            _ if o.contains_key("properties") => self.object(o, root, syn, depth),
            _ if o.contains_key("items") || o.contains_key("prefixItems") => self.array(o, root, syn, depth),
            _ => Ok(self.any(syn)),
        }
    }

    /// An object: its declared properties in order (the required ones always), or any keys
    /// (with values of `additionalProperties`) when it declares none.
    fn object(&mut self, o: &Map<String, Value>, root: &Value, syn: Syntax, depth: usize) -> Result<String, String> {
        let (kv_sep, sep, open, close) = match syn {
            Syntax::Gemma => (":", ",", "{", "}"),
            Syntax::Python => (": ", ", ", "{", "}"),
        };
        let props = properties(o);
        if props.is_empty() {
            let value = match o.get("additionalProperties") {
                Some(Value::Bool(false)) => return Ok(format!("{} {}", lit(open), lit(close))),
                Some(v @ Value::Object(_)) => self.value(v, root, syn, depth + 1)?,
                _ => self.any(syn),
            };
            let key = self.any_key(syn);
            let kv = self.add("kv", format!("{key} {} {value}", lit(kv_sep)));
            return Ok(format!("{} ({kv} ({} {kv})*)? {}", lit(open), lit(sep), lit(close)));
        }
        let mut items = vec![];
        for (name, schema, required) in props {
            let key = self.key(&name, syn);
            let v = self.value(&schema, root, syn, depth + 1)?;
            items.push((format!("{key} {} {v}", lit(kv_sep)), required));
        }
        let body = self.seq(&items, sep);
        Ok(format!("{} {body} {}", lit(open), lit(close)))
    }

    fn array(&mut self, o: &Map<String, Value>, root: &Value, syn: Syntax, depth: usize) -> Result<String, String> {
        let sep = match syn {
            Syntax::Gemma => ",",
            Syntax::Python => ", ",
        };
        let count = |k: &str| o.get(k).and_then(Value::as_u64);
        let min = count("minItems").unwrap_or(0);
        let max = count("maxItems").filter(|&m| m <= MAX_COUNT);
        let mut parts = vec![];
        if let Some(Value::Array(prefix)) = o.get("prefixItems") {
            for p in prefix {
                parts.push(self.value(p, root, syn, depth + 1)?);
            }
        }
        let n_prefix = parts.len() as u64;
        let more_allowed = !matches!(o.get("items"), Some(Value::Bool(false))) && (n_prefix == 0 || o.contains_key("items"));
        let item = match o.get("items") {
            Some(v @ Value::Object(_)) => Some(self.value(v, root, syn, depth + 1)?),
            _ if more_allowed => Some(self.any(syn)),
            _ => None,
        };
        let mut body: Vec<String> = vec![];
        for (i, p) in parts.iter().enumerate() {
            body.push(if i == 0 { p.clone() } else { format!("{} {p}", lit(sep)) });
        }
        if let (Some(item), true) = (item, more_allowed) {
            let lo = min.saturating_sub(n_prefix);
            let hi = max.map(|m| m.saturating_sub(n_prefix));
            if hi != Some(0) {
                if n_prefix == 0 {
                    // first item, then the rest after separators
                    let rest = repeat(&format!("({} {item})", lit(sep)), lo.saturating_sub(1), hi.map(|h| h - 1));
                    let first = format!("{item} {rest}");
                    body.push(if lo == 0 { format!("({first})?") } else { first });
                } else {
                    body.push(repeat(&format!("({} {item})", lit(sep)), lo, hi));
                }
            }
        }
        Ok(format!("{} {} {}", lit("["), body.join(" "), lit("]")))
    }

    /// A string valid against the string keywords of `o`.
    fn string(&mut self, o: &Map<String, Value>, syn: Syntax) -> String {
        match syn {
            Syntax::Gemma => {
                let q = self.marker(GEMMA_QUOTE);
                let mut conj = string_body(o);
                conj.push(format!("~{}", regex(&format!("(?s:.*){}(?s:.*)", escape_regex(GEMMA_QUOTE)))));
                let t = self.add("STR", conj.join(" & "));
                format!("{q} {t} {q}")
            }
            Syntax::Python => {
                let unit = r#"(?:[^"\\\n]|\\["\\nt])"#;
                let count = |k: &str| o.get(k).and_then(Value::as_u64);
                let min = count("minLength").unwrap_or(0);
                let (lo, hi) = match count("maxLength").filter(|&m| m <= MAX_COUNT) {
                    Some(max) => (min.min(MAX_COUNT), format!("{max}")),
                    None => (min.min(MAX_COUNT), String::new()),
                };
                let mut conj = vec![regex(&format!("\"{unit}{{{lo},{hi}}}\""))];
                if let Some(p) = o.get("pattern").and_then(Value::as_str) {
                    // A patterned string is written without escapes.
                    conj.push(regex(r#""[^"\\\n]*""#));
                    conj.push(regex(&format!("\"{}\"", pattern_regex(p))));
                }
                self.add("STR", conj.join(" & "))
            }
        }
    }

    /// An object key.
    fn key(&mut self, name: &str, syn: Syntax) -> String {
        match syn {
            Syntax::Gemma if !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '$')) => lit(name),
            Syntax::Gemma => format!("{q} {} {q}", lit(name), q = self.marker(GEMMA_QUOTE)),
            Syntax::Python => lit(&python_str(name)),
        }
    }

    fn any_key(&mut self, syn: Syntax) -> String {
        match syn {
            Syntax::Gemma => self.add("KEY", regex(r"[A-Za-z_$][A-Za-z0-9_\-.$]*")),
            Syntax::Python => self.string(&Map::new(), Syntax::Python),
        }
    }

    /// Any value (one rule per syntax, recursive).
    pub(crate) fn any(&mut self, syn: Syntax) -> String {
        if let Some(r) = self.any.get(&syn) {
            return r.clone();
        }
        self.n += 1;
        let name = format!("any_{}", self.n);
        self.any.insert(syn, name.clone());
        let s = self.string(&Map::new(), syn);
        let key = self.any_key(syn);
        let number = self.json(&json!({"type": "number"}), &Value::Null);
        let (kv, sep, t, f, nul) = match syn {
            Syntax::Gemma => (":", ",", "true", "false", "null"),
            Syntax::Python => (": ", ", ", "True", "False", "None"),
        };
        let body = format!(
            "{s} | {number} | {} | {} | {} | {} ({key} {} {name} ({} {key} {} {name})*)? {} | {} ({name} ({} {name})*)? {}",
            lit(t),
            lit(f),
            lit(nul),
            lit("{"),
            lit(kv),
            lit(sep),
            lit(kv),
            lit("}"),
            lit("["),
            lit(sep),
            lit("]")
        );
        self.rules.push(format!("{name}: {body}"));
        name
    }

    /// A Qwen3-Coder parameter value: bare text for a string-typed parameter (what the parser
    /// keeps as is), JSON for other types; a parameter that may be either takes text that does
    /// not read as JSON, or JSON of its other types.
    pub(crate) fn xml_value(&mut self, schema: &Value, root: &Value) -> Result<String, String> {
        let s = resolve(schema, root, 0)?;
        let Some(o) = s.as_object() else { return Ok(self.json(s, root)) };
        let closer = format!("~{}", regex(&format!("(?s:.*){}(?s:.*)", escape_regex("</parameter>"))));
        if string_only(o.get("type")) {
            if let Some(alts) = self.text_literals(o) {
                return alts;
            }
            let mut conj = string_body(o);
            conj.push(closer);
            return Ok(self.add("TEXT", conj.join(" & ")));
        }
        let mut alts = vec![];
        let mut others = vec![];
        for b in branches(s, root)? {
            let bo = b.as_object().cloned().unwrap_or_default();
            let is_text = bo.get("type").and_then(Value::as_str) == Some("string")
                || (!bo.contains_key("type")
                    && (bo.get("enum").and_then(Value::as_array).is_some_and(|e| e.iter().all(Value::is_string))
                        || bo.get("const").is_some_and(Value::is_string)));
            if !is_text {
                others.push(b);
                continue;
            }
            if let Some(l) = self.text_literals(&bo) {
                alts.push(l?);
                continue;
            }
            // Text the parser would read as JSON of another type is left out.
            let mut conj = string_body(&bo);
            conj.push(closer.clone());
            conj.push(format!("~{}", regex(r#"[\s\-0-9\[{"](?s:.*)"#)));
            conj.push(format!("~{}", regex(r"(true|false|null)\s*")));
            alts.push(self.add("TEXT", conj.join(" & ")));
        }
        if !others.is_empty() {
            let schema = if others.len() == 1 { others.remove(0) } else { json!({"anyOf": others}) };
            alts.push(self.json(&schema, root));
        }
        if alts.is_empty() {
            return Ok(self.json(s, root));
        }
        Ok(format!("({})", alts.join(" | ")))
    }

    /// enum / const of strings written as bare text (those the parser would not read as JSON
    /// or cut short); None when the schema has neither.
    fn text_literals(&mut self, o: &Map<String, Value>) -> Option<Result<String, String>> {
        let values: Vec<&Value> = match (o.get("const"), o.get("enum")) {
            (Some(c), _) => vec![c],
            (None, Some(Value::Array(e))) => e.iter().collect(),
            _ => return None,
        };
        let ok: Vec<String> = values
            .iter()
            .filter_map(|v| v.as_str())
            .filter(|s| !s.contains("</parameter>") && serde_json::from_str::<Value>(s.trim()).map_or(true, |v| v.is_string()))
            .map(lit)
            .collect();
        Some(if ok.is_empty() {
            Err(format!("no value of {} can be written as a qwen3_coder parameter", Value::Object(o.clone())))
        } else {
            Ok(format!("({})", ok.join(" | ")))
        })
    }
}

/// A Lark string literal.
pub(crate) fn lit(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialize")
}

/// A Lark regex literal.
fn regex(re: &str) -> String {
    let mut out = String::from("/");
    let mut escaped = false;
    for c in re.chars() {
        if c == '/' && !escaped {
            out.push('\\');
        }
        escaped = c == '\\' && !escaped;
        out.push(c);
    }
    out.push('/');
    out
}

fn escape_regex(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A JSON Schema `pattern` (a search) as a whole-match regex.
fn pattern_regex(p: &str) -> String {
    let (mut body, mut start, mut end) = (p, "(?s:.*)", "(?s:.*)");
    if let Some(b) = body.strip_prefix('^') {
        body = b;
        start = "";
    }
    if body.ends_with('$') && !body.ends_with("\\$") {
        body = &body[..body.len() - 1];
        end = "";
    }
    format!("{start}(?:{body}){end}")
}

/// Regexes a string's text must match (length and pattern), at least one.
fn string_body(o: &Map<String, Value>) -> Vec<String> {
    let count = |k: &str| o.get(k).and_then(Value::as_u64);
    let min = count("minLength").unwrap_or(0).min(MAX_COUNT);
    let max = count("maxLength").filter(|&m| m <= MAX_COUNT);
    let mut conj = vec![match max {
        Some(max) => regex(&format!("(?s:.{{{min},{max}}})")),
        None if min > 0 => regex(&format!("(?s:.{{{min},}})")),
        None => regex("(?s:.*)"),
    }];
    if let Some(p) = o.get("pattern").and_then(Value::as_str) {
        conj.push(regex(&pattern_regex(p)));
    }
    conj
}

/// `{m,n}` of `e` as Lark writes it (None: unbounded).
fn repeat(e: &str, min: u64, max: Option<u64>) -> String {
    let min = min.min(MAX_COUNT);
    match max {
        Some(0) => "\"\"".into(),
        Some(m) if m == min && m == 1 => e.to_string(),
        Some(m) => format!("{e}{{{min},{}}}", m.max(min)),
        None if min == 0 => format!("{e}*"),
        None if min == 1 => format!("{e}+"),
        None => format!("{e}{{{min},}}"),
    }
}

/// A Python string literal the tool-code parser reads back as `s`.
fn python_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `v` written in `syn` as a literal; None when it cannot be (a Gemma string holding the quote).
fn literal(v: &Value, syn: Syntax, b: &Builder<'_, '_>) -> Option<String> {
    Some(match (v, syn) {
        (Value::String(s), Syntax::Gemma) => {
            if s.contains(GEMMA_QUOTE) {
                return None;
            }
            let q = b.marker(GEMMA_QUOTE);
            format!("{q} {} {q}", lit(s))
        }
        (Value::String(s), Syntax::Python) => lit(&python_str(s)),
        (Value::Bool(x), Syntax::Python) => lit(if *x { "True" } else { "False" }),
        (Value::Null, Syntax::Python) => lit("None"),
        (Value::Array(items), _) => {
            let sep = if syn == Syntax::Gemma { "," } else { ", " };
            let parts: Option<Vec<String>> = items.iter().map(|i| literal(i, syn, b)).collect();
            let parts = parts?;
            if parts.is_empty() {
                format!("{} {}", lit("["), lit("]"))
            } else {
                format!("{} {} {}", lit("["), parts.join(&format!(" {} ", lit(sep))), lit("]"))
            }
        }
        (Value::Object(m), _) => {
            let (sep, kv) = if syn == Syntax::Gemma { (",", ":") } else { (", ", ": ") };
            let mut parts = vec![];
            for (k, val) in m {
                let key = match syn {
                    Syntax::Gemma if !k.is_empty() && k.chars().all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '$')) => lit(k),
                    Syntax::Gemma => {
                        if k.contains(GEMMA_QUOTE) {
                            return None;
                        }
                        format!("{q} {} {q}", lit(k), q = b.marker(GEMMA_QUOTE))
                    }
                    Syntax::Python => lit(&python_str(k)),
                };
                parts.push(format!("{key} {} {}", lit(kv), literal(val, syn, b)?));
            }
            if parts.is_empty() {
                format!("{} {}", lit("{"), lit("}"))
            } else {
                format!("{} {} {}", lit("{"), parts.join(&format!(" {} ", lit(sep))), lit("}"))
            }
        }
        (other, _) => lit(&other.to_string()),
    })
}

/// Follows `$ref`s into the tool's own schema (`#/…` pointers).
fn resolve<'v>(schema: &'v Value, root: &'v Value, hops: usize) -> Result<&'v Value, String> {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            if hops > 32 {
                return Err(format!("$ref {r:?} refers to itself"));
            }
            let target = r
                .strip_prefix('#')
                .and_then(|p| root.pointer(p))
                .ok_or_else(|| format!("$ref {r:?} does not point into the tool's schema"))?;
            resolve(target, root, hops + 1)
        }
        None => Ok(schema),
    }
}

/// A branch of anyOf/oneOf with the keywords beside it (e.g. a `type` they share).
fn with_siblings(o: &Map<String, Value>, branch: &Value, skip: &str) -> Value {
    let mut merged: Map<String, Value> =
        o.iter().filter(|(k, _)| k.as_str() != skip && !matches!(k.as_str(), "anyOf" | "oneOf")).map(|(k, v)| (k.clone(), v.clone())).collect();
    match branch.as_object() {
        Some(b) => {
            for (k, v) in b {
                merged.insert(k.clone(), v.clone());
            }
            Value::Object(merged)
        }
        None if merged.is_empty() => branch.clone(),
        None => Value::Object(merged),
    }
}

/// allOf's parts merged (properties and required joined; other keywords, the last wins).
fn merge_all_of(o: &Map<String, Value>, parts: &[Value], root: &Value) -> Result<Value, String> {
    let mut out: Map<String, Value> = o.iter().filter(|(k, _)| k.as_str() != "allOf").map(|(k, v)| (k.clone(), v.clone())).collect();
    for p in parts {
        let p = resolve(p, root, 0)?;
        let Some(p) = p.as_object() else { continue };
        for (k, v) in p {
            match (k.as_str(), out.get_mut(k)) {
                ("properties", Some(Value::Object(props))) => {
                    if let Value::Object(more) = v {
                        for (pk, pv) in more {
                            props.insert(pk.clone(), pv.clone());
                        }
                    }
                }
                ("required", Some(Value::Array(req))) => {
                    if let Value::Array(more) = v {
                        req.extend(more.iter().cloned());
                    }
                }
                _ => {
                    out.insert(k.clone(), v.clone());
                }
            }
        }
    }
    Ok(Value::Object(out))
}

/// An object schema's properties in order: (name, schema, required); required names that are
/// not declared come last, with any value.
pub(crate) fn properties(o: &Map<String, Value>) -> Vec<(String, Value, bool)> {
    let required: Vec<&str> = o.get("required").and_then(Value::as_array).map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    let mut out: Vec<(String, Value, bool)> = vec![];
    if let Some(Value::Object(props)) = o.get("properties") {
        for (k, v) in props {
            out.push((k.clone(), v.clone(), required.contains(&k.as_str())));
        }
    }
    for r in required {
        if !out.iter().any(|(k, _, _)| k == r) {
            out.push((r.to_string(), json!({}), true));
        }
    }
    out
}

/// Whether the Qwen3-Coder parser keeps a value of this `type` as bare text.
pub(crate) fn string_only(t: Option<&Value>) -> bool {
    let is_string = |t: &Value| t.as_str().is_some_and(|s| matches!(s, "string" | "str" | "text" | "enum"));
    match t {
        Some(Value::Array(types)) => !types.is_empty() && types.iter().all(is_string),
        Some(t) => is_string(t),
        None => false,
    }
}

/// A schema split into the alternatives it allows (anyOf/oneOf branches, each type of a type
/// list, string and other enum values apart).
fn branches(s: &Value, root: &Value) -> Result<Vec<Value>, String> {
    let Some(o) = s.as_object() else { return Ok(vec![s.clone()]) };
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(bs)) = o.get(key) {
            let mut out = vec![];
            for b in bs {
                let b = resolve(b, root, 0)?;
                out.extend(branches(&with_siblings(o, b, key), root)?);
            }
            return Ok(out);
        }
    }
    if let Some(Value::Array(types)) = o.get("type") {
        return Ok(types
            .iter()
            .map(|t| {
                let mut one = o.clone();
                one.insert("type".into(), t.clone());
                Value::Object(one)
            })
            .collect());
    }
    if let (None, Some(Value::Array(e))) = (o.get("type"), o.get("enum")) {
        let (strs, rest): (Vec<Value>, Vec<Value>) = e.iter().cloned().partition(Value::is_string);
        let mut out = vec![];
        if !strs.is_empty() {
            out.push(json!({"enum": strs}));
        }
        if !rest.is_empty() {
            out.push(json!({"enum": rest}));
        }
        return Ok(out);
    }
    Ok(vec![s.clone()])
}

/// A tool's parameters schema (an empty object schema when it declares none).
pub(crate) fn parameters(t: &Tool) -> Value {
    if t.function.parameters.is_object() {
        t.function.parameters.clone()
    } else {
        json!({"type": "object"})
    }
}
