//! Constrained decoding through the whole engine on a tiny random checkpoint written by the
//! test: whatever the random model prefers, every reply that completes validates against its
//! JSON Schema (a corpus of 24), matches its regex or its Lark grammar; one that runs out of
//! tokens says `length`; bad schemas are `INVALID_ARGUMENT`; constrained requests batch with
//! free ones; a reasoning span the prompt opens stays free text.
mod common;
use common::{edit_json, tiny_llama_dir, TinyLlama, TINY_VOCAB};
use mlex::generate::ResponseFormat;
use mlex::{ChatMessage, FinishReason, GenerateOptions, Request, SamplingConfig, Session};
use serde_json::{json, Value};

fn opts(format: ResponseFormat, max_tokens: usize) -> GenerateOptions {
    GenerateOptions { max_tokens, response_format: Some(format), ignore_eos: true, ..Default::default() }
}

fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}, "required": ["name"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["age"]}),
        json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"], "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 4}),
        json!({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3}}, "required": ["tags"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"p": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -5, "maximum": 5}, "y": {"type": "integer", "minimum": -5, "maximum": 5}}, "required": ["x", "y"], "additionalProperties": false}}, "required": ["p"], "additionalProperties": false}),
        json!({"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, {"type": "boolean"}]}),
        json!({"type": "object", "properties": {"v": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 5}]}}, "required": ["v"], "additionalProperties": false}),
        json!({"type": "string", "pattern": "^[a-c]{2,4}$"}),
        json!({"type": "string", "enum": ["yes", "no"]}),
        json!({"type": "number", "minimum": 0, "maximum": 1}),
        json!({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}, "required": ["code"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"a": {"const": "fixed"}, "b": {"type": "integer", "minimum": 1, "maximum": 3}}, "required": ["a", "b"], "additionalProperties": false}),
        json!({"type": "array", "prefixItems": [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 0, "maximum": 9}], "items": false, "minItems": 2}),
        json!({"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "legs": {"enum": [3, 4]}}, "required": ["kind", "legs"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["id"], "additionalProperties": false}, "maxItems": 2}}, "required": ["items"], "additionalProperties": false}),
        json!({"type": "boolean"}),
        json!({"type": "null"}),
        json!({"type": "integer", "minimum": 10, "maximum": 20}),
        json!({"type": "object", "properties": {"word": {"type": "string", "minLength": 2, "maxLength": 3}}, "required": ["word"], "additionalProperties": false}),
        json!({"$defs": {"d": {"type": "integer", "minimum": 0, "maximum": 5}}, "type": "object", "properties": {"n": {"$ref": "#/$defs/d"}}, "required": ["n"], "additionalProperties": false}),
        json!({"oneOf": [{"type": "object", "properties": {"t": {"const": "a"}}, "required": ["t"], "additionalProperties": false}, {"type": "object", "properties": {"t": {"const": "b"}, "n": {"type": "integer", "minimum": 0, "maximum": 3}}, "required": ["t", "n"], "additionalProperties": false}]}),
        json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "score": {"type": "number", "minimum": -1, "maximum": 1}, "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}}, "required": ["name", "score", "flags"], "additionalProperties": false}),
    ]
}

#[test]
fn every_completed_reply_validates_against_its_schema() {
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    let schemas = schemas();
    assert!(schemas.len() >= 20);
    // All in flight together (constrained rows batch), each twice: greedy and sampled.
    let mut streams = vec![];
    for (i, schema) in schemas.iter().enumerate() {
        for temperature in [0.0, 1.0] {
            let mut o = opts(ResponseFormat::JsonSchema(schema.clone()), 120);
            o.sampling = SamplingConfig { temperature, seed: Some(i as u64), ..Default::default() };
            let prompt: Vec<u32> = (0..6).map(|k| 1 + ((i * 31 + k * 7) % 200) as u32).collect();
            streams.push((schema, s.stream(Request::Tokens(prompt), o).unwrap()));
        }
    }
    let mut completed = 0;
    for (schema, g) in streams {
        let r = g.finish().unwrap();
        match r.finish_reason {
            FinishReason::Stop => {
                completed += 1;
                let v: Value = serde_json::from_str(&r.text)
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {:?} for {schema}", r.text));
                assert!(jsonschema::is_valid(schema, &v), "{v} does not validate against {schema}");
            }
            FinishReason::Length => assert_eq!(r.tokens.len(), 120, "length only when out of tokens"),
            other => panic!("unexpected finish {other:?}"),
        }
    }
    eprintln!("{completed} of 48 constrained replies completed (all valid), the rest ran out of tokens");
    assert!(completed >= 40, "most of the 48 bounded replies complete: {completed}");
}

#[test]
fn regex_and_lark_grammars_hold_the_reply() {
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    let re = "[0-9]{3}-[a-z]{2}";
    let r = s.generate_tokens(&[5, 6, 7], opts(ResponseFormat::Regex(re.into()), 40), |_| true).unwrap();
    assert_eq!(r.finish_reason, FinishReason::Stop);
    let t = r.text.as_bytes();
    assert!(t.len() == 6 && t[..3].iter().all(u8::is_ascii_digit) && t[3] == b'-' && t[4..].iter().all(u8::is_ascii_lowercase), "{:?}", r.text);

    let lark = r#"start: "(" item (" " item)* ")"
item: NUMBER | "x"
NUMBER: /[1-9]/"#;
    let r = s.generate_tokens(&[9, 8], opts(ResponseFormat::Grammar(lark.into()), 60), |_| true).unwrap();
    if r.finish_reason == FinishReason::Stop {
        let inner = r.text.strip_prefix('(').and_then(|x| x.strip_suffix(')')).unwrap_or_else(|| panic!("{:?}", r.text));
        assert!(inner.split(' ').all(|i| i == "x" || (i.len() == 1 && i.as_bytes()[0].is_ascii_digit() && i != "0")), "{:?}", r.text);
    } else {
        assert_eq!(r.finish_reason, FinishReason::Length);
        assert!(r.text.starts_with('('), "{:?}", r.text);
    }
}

#[test]
fn options_read_response_format_and_bad_ones_name_the_problem() {
    let o = GenerateOptions::from_json(
        &json!({"responseFormat": {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {"type": "object"}}}}),
        mlex::generate::Naming::Camel,
    )
    .unwrap();
    assert_eq!(o.response_format, Some(ResponseFormat::JsonSchema(json!({"type": "object"}))));
    for (bad, says) in [
        (json!({"responseFormat": {"type": "xml"}}), "responseFormat.type"),
        (json!({"responseFormat": {"type": "regex"}}), "responseFormat.pattern"),
        (json!({"responseFormat": "json"}), "responseFormat"),
        (json!({"responseFormat": {"type": "json_schema", "schema": 3}}), "responseFormat.schema"),
    ] {
        let e = GenerateOptions::from_json(&bad, mlex::generate::Naming::Camel).unwrap_err();
        assert!(e.contains(says), "{e}");
    }
    // A schema or grammar llguidance rejects: INVALID_ARGUMENT before anything is generated;
    // the session goes on serving.
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    for f in [
        ResponseFormat::JsonSchema(json!({"type": "object", "properties": {"a": {"type": "no-such-type"}}})),
        ResponseFormat::Regex("([a-z".into()),
        ResponseFormat::Grammar("start: undefined_rule".into()),
    ] {
        let e = s.generate_tokens(&[1, 2], opts(f.clone(), 8), |_| true).unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGUMENT", "{f:?}: {e}");
        assert!(e.to_string().contains("response_format"), "{e}");
    }
    assert_eq!(s.generate_tokens(&[1, 2], GenerateOptions { max_tokens: 3, ..Default::default() }, |_| true).unwrap().tokens.len(), 3);
}

#[test]
fn constrained_and_free_requests_batch_and_each_equals_alone() {
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}}, "required": ["n"], "additionalProperties": false});
    let free = GenerateOptions { max_tokens: 20, ignore_eos: true, ..Default::default() };
    let reqs: Vec<(Vec<u32>, GenerateOptions)> = vec![
        (vec![3, 4, 5], free.clone()),
        (vec![3, 4, 5, 6, 7], opts(ResponseFormat::JsonSchema(schema.clone()), 30)),
        (vec![9], free.clone()),
        (vec![11, 12], opts(ResponseFormat::Regex("[a-z]+!".into()), 12)),
    ];
    let streams: Vec<_> = reqs.iter().map(|(p, o)| s.stream(Request::Tokens(p.clone()), o.clone()).unwrap()).collect();
    let batched: Vec<_> = streams.into_iter().map(|g| g.finish().unwrap()).collect();
    for ((p, o), b) in reqs.iter().zip(&batched) {
        let alone = s.generate_tokens(p, o.clone(), |_| true).unwrap();
        assert_eq!(b.tokens, alone.tokens, "{:?}", o.response_format);
        assert_eq!(b.finish_reason, alone.finish_reason);
    }
    assert!(batched.iter().map(|r| r.usage.batch_size).max().unwrap() > 1);
    if batched[1].finish_reason == FinishReason::Stop {
        let v: Value = serde_json::from_str(&batched[1].text).unwrap();
        assert!(jsonschema::is_valid(&schema, &v), "{v}");
    }
}

/// A prompt that opens a reasoning span: the reasoning stays free text (the random model would
/// never write '{' first), the constraint starts after the closer the budget forces.
#[test]
fn reasoning_stays_free_and_the_answer_is_constrained() {
    let dir = tempfile::tempdir().unwrap();
    TinyLlama { vocab: TINY_VOCAB + 2, ..Default::default() }.write(dir.path());
    let (think, end_think) = (TINY_VOCAB as u32, TINY_VOCAB as u32 + 1);
    edit_json(&dir.path().join("tokenizer.json"), |t| {
        for (id, content) in [(think, "<think>"), (end_think, "</think>")] {
            t["model"]["vocab"][content] = id.into();
            t["added_tokens"].as_array_mut().unwrap().push(json!({
                "id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": false}));
        }
    });
    let template = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}";
    edit_json(&dir.path().join("tokenizer_config.json"), |c| c["chat_template"] = template.into());
    let s = Session::load(dir.path()).unwrap();
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false});
    let o = GenerateOptions { reasoning_budget_tokens: Some(4), ..opts(ResponseFormat::JsonSchema(schema.clone()), 60) };
    let r = s.generate(&[ChatMessage::user("Answer in JSON.")], o).unwrap();
    // The model's own 4 reasoning tokens (free), the forced closer, then the constrained answer.
    let close = r.tokens.iter().position(|&t| t == end_think).unwrap_or_else(|| panic!("{r:?}"));
    assert!(close >= 4, "{r:?}");
    assert_eq!(r.finish_reason, FinishReason::Stop, "{:?}", r.text);
    let v: Value = serde_json::from_str(r.text.trim()).unwrap_or_else(|e| panic!("{e}: {:?}", r.text));
    assert!(jsonschema::is_valid(&schema, &v), "{v}");
}

/// `tool_choice` auto's lazy grammars: each format's grammar compiles over the model's
/// vocabulary; armed at the opener (with what the model wrote after it), it forces what the
/// call's syntax fixes next, refuses text that fits no call, and lets the model go once the
/// call's closer is in.
#[test]
fn lazy_call_grammars_force_what_follows_the_opener() {
    use mlex::chat::tool_choice::{lazy_call_grammars, CallSyntax};
    use mlex::chat::{parse_tools_json, ToolCallFormat};
    use mlex::generate::constraint::{Grammars, ToolCallTrigger};
    let dir = tiny_llama_dir();
    let tok = mlex::tokenizer::Tokenizer::from_dir(dir.path()).unwrap();
    let grammars = Grammars::new(&tok, TINY_VOCAB, common::TINY_EOS).unwrap();
    let tools = parse_tools_json(
        r#"[{"type":"function","function":{"name":"add","parameters":{"type":"object","properties":{"a":{"type":"integer","minimum":0,"maximum":9}},"required":["a"]}}},
            {"type":"function","function":{"name":"get","parameters":{"type":"object","properties":{"k":{"type":"string","maxLength":3}},"required":["k"]}}}]"#,
    )
    .unwrap();
    let decode = |ids: &[u32]| tok.decode(ids, false).unwrap();
    let expected = [
        (ToolCallFormat::Hermes, "<tool_call>", "\n{\"name\": \""),
        (ToolCallFormat::Qwen3Coder, "<tool_call>", "\n<function="),
        (ToolCallFormat::Qwen3Coder, "<function=", ""),
        (ToolCallFormat::Gemma4, "<|tool_call>", "call:"),
        (ToolCallFormat::GemmaToolCode, "```tool_code", "\n"),
        (ToolCallFormat::Llama3Json, "<|python_tag|>", "{\"name\": \""),
        (ToolCallFormat::Mistral, "[TOOL_CALLS]", "[{\"name\": \""),
    ];
    for (format, opener, forced) in expected {
        let trigger = ToolCallTrigger::new(lazy_call_grammars(&tools, format, &CallSyntax::plain()).unwrap());
        let mut c = grammars.constraint(&ResponseFormat::ToolCalls(trigger.clone()), None).unwrap();
        assert!(!c.engaged() && !c.active(), "{format}: free until a call opens");
        let ff = trigger.arm(opener, "").unwrap_or_else(|| panic!("{format} {opener}: no grammar"));
        assert_eq!(decode(&ff), forced, "{format} {opener}");
        assert!(c.engaged() && c.active());
        // The mask allows exactly what can follow: here, the start of a tool's name.
        c.feed(&ff).unwrap();
        let m = c.mask().unwrap();
        assert!(m.iter().filter(|&&x| x == 0.0).count() >= 1);
        assert_eq!(m[b'z' as usize], f32::NEG_INFINITY, "{format}: no tool name starts with z");
    }
    // What the model already wrote after the opener counts; a call closed lets the model go.
    let trigger = ToolCallTrigger::new(lazy_call_grammars(&tools, ToolCallFormat::Hermes, &CallSyntax::plain()).unwrap());
    let mut c = grammars.constraint(&ResponseFormat::ToolCalls(trigger.clone()), None).unwrap();
    let ff = trigger.arm("<tool_call>", "\n{\"name\": \"ad").unwrap();
    assert_eq!(decode(&ff), "d\", \"arguments\": {\"a\": ");
    c.feed(&ff).unwrap();
    c.feed(&tok.encode("7}}\n</tool_call", false).unwrap()).unwrap();
    assert!(c.engaged());
    c.feed(&tok.encode(">", false).unwrap()).unwrap();
    assert!(!c.engaged() && !c.active(), "free again after the closer");
    // Text that fits no call: the call is not held.
    assert_eq!(trigger.arm("<tool_call>", "\n{\"name\": \"zz"), None);
    assert!(!c.engaged());
    assert_eq!(trigger.arm("<nope>", ""), None);
}
