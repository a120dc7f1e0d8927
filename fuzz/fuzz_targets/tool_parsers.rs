//! Every tool-call format over arbitrary text: no panic; every parsed call has a name and object
//! arguments; ids are unique; text without any opener comes back unchanged.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mlex_fuzz::chat::{parse_tool_calls_with_tools, Tool, ToolCallFormat};
use serde_json::json;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest);
    let format = ToolCallFormat::ALL[sel as usize % ToolCallFormat::ALL.len()];
    let tools = vec![Tool::function(
        "f",
        None,
        json!({"type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "integer"}, "u": {"type": ["string", "null"]}}}),
    )];
    let with_schema = sel & 0x80 != 0;
    let r = parse_tool_calls_with_tools(&text, format, with_schema.then_some(&tools[..]));
    let mut ids = std::collections::HashSet::new();
    for c in &r.calls {
        assert!(!c.name.is_empty());
        assert!(c.arguments.is_object(), "{c:?}");
        assert!(ids.insert(c.id.clone()), "duplicate id");
    }
    let has_opener = text.contains("<tool_call>")
        || text.contains("<function=")
        || text.contains("<|tool_call>")
        || text.contains("```tool_code")
        || text.contains("<|python_tag|>")
        || text.contains("[TOOL_CALLS]")
        || text.contains("<|tool_response>")
        || (format == ToolCallFormat::Llama3Json && text.trim_start().starts_with(['{', '[']));
    if !has_opener {
        assert!(r.calls.is_empty());
        // Only whitespace may differ (none is dropped without a marker, except none at all).
        assert_eq!(r.text_without_calls, text, "{format}");
    }
});
