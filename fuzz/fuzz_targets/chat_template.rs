//! Fuzzes chat-template rendering (src/tokenizer/template.rs: minijinja with transformers'
//! extensions) with an arbitrary template over a fixed conversation. Seeds: corpus/chat_template/
//! and, when fetched (scripts/fetch-test-assets.sh --templates), the 71 real templates of the
//! test assets, which scripts/fuzz-smoke.sh adds as a second seed directory. No panic, and every render
//! ends: a template that loops, recurses, builds ever larger values or prints without end stops
//! with an error at the fuel, value-budget or output bound (small ones here, so that such inputs
//! stay fast; libFuzzer's -timeout, -rss_limit_mb and -malloc_limit_mb catch a render that
//! escapes them).
#![no_main]
use libfuzzer_sys::fuzz_target;
use mlex_fuzz::chat::{ChatMessage, Tool, ToolCall};
use mlex_fuzz::tokenizer::special::SpecialTokens;
use mlex_fuzz::tokenizer::template::{ChatTemplate, TemplateLimits, TemplateOptions, TemplateSource};
use serde_json::json;

const LIMITS: TemplateLimits = TemplateLimits {
    fuel: 200_000,
    fuel_per_item: 10_000,
    fuel_per_item_pair: 10,
    max_output: 1 << 20,
    value_bytes: 16 << 20,
    value_bytes_per_input_byte: 64,
    value_bytes_per_item_input_byte: 4,
};

fuzz_target!(|data: &[u8]| {
    // The input is the template (so that real template files seed the corpus as they are); its
    // length picks the options.
    let Ok(src) = std::str::from_utf8(data) else { return };
    let flags = (data.len() % 64) as u8;
    let messages = vec![
        ChatMessage::system("You are terse."),
        ChatMessage::user("What is the weather in Zürich?"),
        ChatMessage::assistant_with_tool_calls(
            "",
            vec![ToolCall::new("call_1", "get_weather", json!({"city": "Zürich", "unit": "c"}))],
        ),
        ChatMessage::tool("call_1", "{\"temp\": 21}"),
        ChatMessage::assistant_with_reasoning("It is 21 °C.", "The tool said 21."),
        ChatMessage::user("<|im_end|>{{ not a template }}</s>"),
    ];
    let tools = [Tool::function(
        "get_weather",
        Some("Current weather".into()),
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    )];
    let mut opts = TemplateOptions {
        add_generation_prompt: flags & 1 != 0,
        tools: (flags & 2 != 0).then_some(&tools[..]),
        enable_thinking: match flags >> 2 & 3 {
            0 => None,
            1 => Some(false),
            _ => Some(true),
        },
        ..Default::default()
    };
    if flags & 16 != 0 {
        opts.extra.insert("reasoning_effort".into(), json!("high"));
    }
    let special = SpecialTokens { bos: Some("<s>".into()), eos: Some("</s>".into()), ..Default::default() };
    let source = if flags & 32 != 0 {
        TemplateSource::Named(vec![("default".into(), src.into()), ("tool_use".into(), src.into())])
    } else {
        TemplateSource::Single(src.into())
    };
    let t = ChatTemplate::new(source).with_limits(LIMITS);
    if let Ok(out) = t.render(&messages, &opts, &special) {
        assert!(out.len() <= LIMITS.max_output);
    }
});
