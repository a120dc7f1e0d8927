//! A table of bad inputs through the Rust API's parsers and a loaded session (issue 16 item 4):
//! options, messages, tool schemas and requests, each with the exact error code
//! ([`mlex::Error::code`]) and a message excerpt that names the cause. Broken checkpoints are
//! tests/bad_input.rs; the Node side is __test__/bad-inputs.test.mjs (docs/bad-inputs.md).
mod common;

use mlex::chat::{parse_messages_json, parse_tools_json};
use mlex::generate::Naming;
use mlex::{Error, GenerateOptions, LoadOptions, Request, Session};
use serde_json::{json, Value};

/// What every front end (Node, CLI, server) makes of an options parser's message.
fn options_err(r: Result<GenerateOptions, String>) -> Error {
    match r {
        Ok(_) => Error::InvalidArgument("(accepted)".into()),
        Err(m) => Error::InvalidArgument(m),
    }
}

fn load_options_err(r: Result<LoadOptions, String>) -> Error {
    match r {
        Ok(_) => Error::InvalidArgument("(accepted)".into()),
        Err(m) => Error::InvalidArgument(m),
    }
}

fn gen(v: Value) -> Result<GenerateOptions, String> {
    GenerateOptions::from_json(&v, Naming::Snake)
}

fn msgs(v: Value) -> Result<(), Error> {
    parse_messages_json(&v.to_string()).map(|_| ())
}

fn tools(v: Value) -> Result<(), Error> {
    parse_tools_json(&v.to_string()).map(|_| ())
}

fn expect_err(label: &str, r: Result<(), Error>, code: &str, excerpt: &str, failures: &mut Vec<String>) {
    match r {
        Ok(()) => failures.push(format!("{label}: accepted")),
        Err(e) if e.code() != code => failures.push(format!("{label}: code {} (want {code}): {e}", e.code())),
        Err(e) if !e.to_string().contains(excerpt) => failures.push(format!("{label}: message {e:?} lacks {excerpt:?}")),
        Err(_) => {}
    }
}

const ARG: &str = "INVALID_ARGUMENT";

#[test]
fn bad_options_messages_and_tools_through_the_parsers() {
    let user = json!({"role": "user", "content": "hi"});
    let call = json!({"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}});
    let cases: Vec<(&str, Result<(), Error>, &str)> = vec![
        // generate options (snake_case, as the server and the CLI's --json read them)
        ("max_tokens -1", Err(options_err(gen(json!({"max_tokens": -1})))), "max_tokens must be a non-negative integer, got -1"),
        ("temperature -1", Err(options_err(gen(json!({"temperature": -1})))), "temperature must be >= 0, got -1"),
        ("top_p 0", Err(options_err(gen(json!({"top_p": 0})))), "top_p must be in (0, 1], got 0"),
        ("min_p 2", Err(options_err(gen(json!({"min_p": 2})))), "min_p must be in [0, 1], got 2"),
        ("unknown option", Err(options_err(gen(json!({"max_tokenz": 5})))), "unknown option \"max_tokenz\""),
        ("stop a number", Err(options_err(gen(json!({"stop": 5})))), "stop must be an array of strings"),
        ("tool_call_format yaml", Err(options_err(gen(json!({"tool_call_format": "yaml"})))), "unknown tool call format \"yaml\""),
        ("top_logprobs 100", Err(options_err(gen(json!({"top_logprobs": 100})))), "top_logprobs must be in [0, 20], got 100"),
        ("response_format xml", Err(options_err(gen(json!({"response_format": {"type": "xml"}})))), "\"xml\""),
        ("options not an object", Err(options_err(gen(json!([1, 2])))), "options"),
        // load options
        ("load: device tpu", Err(load_options_err(LoadOptions::from_json(&json!({"device": "tpu"}), Naming::Snake))), "device must be 'gpu' or 'cpu', got \"tpu\""),
        ("load: max_batch 0", Err(load_options_err(LoadOptions::from_json(&json!({"max_batch": 0}), Naming::Snake))), "max_batch must be at least 1"),
        ("load: prompt_cache.max_bytes -1", Err(load_options_err(LoadOptions::from_json(&json!({"prompt_cache": {"max_bytes": -1}}), Naming::Snake))), "max_bytes must be a non-negative integer"),
        ("load: unknown option", Err(load_options_err(LoadOptions::from_json(&json!({"devise": "cpu"}), Naming::Snake))), "unknown option \"devise\""),
        // messages
        ("messages not JSON", parse_messages_json("[{").map(|_| ()), "messages are not valid JSON"),
        ("messages a number", msgs(json!(3)), "expected a JSON array of messages"),
        ("unknown role", msgs(json!([{"role": "wizard", "content": "x"}])), "message 0: unknown message role \"wizard\""),
        ("no role", msgs(json!([{"content": "x"}])), "message 0: missing \"role\""),
        ("content a number", msgs(json!([{"role": "user", "content": 4}])), "message 0: \"content\" must be a string"),
        ("content part video without frames", msgs(json!([{"role": "user", "content": [{"type": "video"}]}])), "message 0: content part 0 (video): a video part needs \"video\": its frames"),
        ("content part video file", msgs(json!([{"role": "user", "content": [{"type": "video", "video": "clip.mp4"}]}])), "message 0: content part 0 (video): this is a MP4 video file, and mlex decodes no video codecs"),
        ("tool call without a name", msgs(json!([user, {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"arguments": "{}"}}]}])), "message 1: tool_calls[0]: missing function \"name\""),
        ("tool result for no call", msgs(json!([user, {"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "tool_call_id": "zz", "content": "r"}])), "message 2: tool_call_id \"zz\" matches no earlier tool call (ids: c1)"),
        // tool schemas
        ("tools not JSON", parse_tools_json("[{").map(|_| ()), "tools are not valid JSON"),
        ("tools an object", tools(json!({"name": "f"})), "expected a JSON array of tools"),
        ("tool without a name", tools(json!([{"type": "function", "function": {"parameters": {}}}])), "tool 0: invalid function definition: missing field `name`"),
        ("tool with an empty name", tools(json!([{"type": "function", "function": {"name": " "}}])), "tool 0: function \"name\" is empty"),
        ("tool of type retrieval", tools(json!([{"type": "retrieval", "function": {"name": "f"}}])), "tool 0: unsupported tool type \"retrieval\""),
        ("parameters an array", tools(json!([{"type": "function", "function": {"name": "f", "parameters": [1]}}])), "tool 0: function \"f\": \"parameters\" must be a JSON Schema object, got [1]"),
        ("two tools named f", tools(json!([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}])), "tool 1: duplicate tool name \"f\" (tool 0 has it too)"),
    ];
    let mut failures = vec![];
    let n = cases.len();
    for (label, r, excerpt) in cases {
        expect_err(label, r, ARG, excerpt, &mut failures);
    }
    assert!(failures.is_empty(), "{} of {n} cases wrong:\n{}", failures.len(), failures.join("\n"));
    // What stays accepted: tool results without an id (matched by position), a conversation whose
    // calls were cut off, parameters absent or null.
    msgs(json!([user, {"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": "r"}])).unwrap();
    msgs(json!([user, {"role": "tool", "tool_call_id": "c0", "content": "r"}])).unwrap();
    tools(json!([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "g", "parameters": null}}])).unwrap();
}

/// Requests a loaded session refuses before generating (the engine thread is never touched), and
/// after which it still serves.
#[test]
fn bad_requests_to_a_loaded_session() {
    let dir = common::tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    let messages = parse_messages_json(&json!([{"role": "user", "content": "hi"}]).to_string()).unwrap();
    let f = parse_tools_json(&json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]).to_string()).unwrap();
    let chat = |tools: Option<Vec<mlex::Tool>>, options: Value| -> Result<(), Error> {
        let options = GenerateOptions::from_json(&options, Naming::Snake).map_err(Error::InvalidArgument)?;
        s.stream(Request::Chat { messages: messages.clone(), tools }, options)?.finish().map(|_| ())
    };
    let cases: Vec<(&str, Result<(), Error>, &str, &str)> = vec![
        ("no messages", s.stream(Request::Chat { messages: vec![], tools: None }, GenerateOptions::default()).and_then(|g| g.finish()).map(|_| ()), ARG, "messages"),
        ("no tokens", s.stream(Request::Tokens(vec![]), GenerateOptions::default()).and_then(|g| g.finish()).map(|_| ()), ARG, "empty"),
        ("token id past the vocabulary", s.stream(Request::Tokens(vec![1, 999_999]), GenerateOptions::default()).and_then(|g| g.finish()).map(|_| ()), ARG, "999999"),
        ("tool_choice names a tool not given", chat(Some(f.clone()), json!({"tool_choice": {"type": "function", "function": {"name": "g"}}})), ARG, "tool_choice names \"g\", which is not among the tools (f)"),
        ("tool_choice required without tools", chat(None, json!({"tool_choice": "required"})), ARG, "tool_choice demands a tool call, but no tools were given"),
        ("response_format schema of an unknown type", chat(None, json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such"}}}})), ARG, "no-such"),
    ];
    let mut failures = vec![];
    for (label, r, code, excerpt) in cases {
        expect_err(label, r, code, excerpt, &mut failures);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let reply = chat(None, json!({"max_tokens": 3, "ignore_eos": true}));
    assert!(reply.is_ok(), "{reply:?}");
}
