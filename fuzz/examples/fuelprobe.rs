//! Measures how much minijinja fuel real chat templates take, behind the numbers of
//! `TemplateLimits` (src/tokenizer/template.rs): renders each template given over a conversation
//! of N rounds (user, tool call, tool result, answer with reasoning) and prints the smallest fuel
//! per message that renders it, and the render's time.
//!   cargo +nightly run --release --example fuelprobe -- 50 ~/.cache/mlex/test-assets/llama.cpp-templates/*.jinja
use mlex_fuzz::chat::{ChatMessage, Tool, ToolCall};
use mlex_fuzz::tokenizer::special::SpecialTokens;
use mlex_fuzz::tokenizer::template::{ChatTemplate, TemplateOptions, TemplateSource};
use serde_json::json;
fn main() {
    let n: usize = std::env::args().nth(1).unwrap().parse().unwrap();
    let mut messages = vec![ChatMessage::system("You are terse.")];
    for i in 0..n {
        messages.push(ChatMessage::user(format!("question {i}")));
        messages.push(ChatMessage::assistant_with_tool_calls("", vec![ToolCall::new(format!("call_{i}"), "get_weather", json!({"city": "Zürich"}))]));
        messages.push(ChatMessage::tool(format!("call_{i}"), "{\"temp\": 21}"));
        messages.push(ChatMessage::assistant_with_reasoning("It is 21 °C.", "The tool said 21."));
    }
    messages.push(ChatMessage::user("bye"));
    let tools = [Tool::function("get_weather", Some("w".into()), json!({"type": "object", "properties": {"city": {"type": "string"}}}))];
    let opts = TemplateOptions { tools: Some(&tools[..]), ..Default::default() };
    let special = SpecialTokens { bos: Some("<s>".into()), eos: Some("</s>".into()), ..Default::default() };
    let items = messages.len() as u64 + 1;
    for p in std::env::args().skip(2) {
        let src = std::fs::read_to_string(&p).unwrap();
        // smallest per-item fuel (base 0) that renders, by bisection
        let ok = |f: u64| ChatTemplate::new(TemplateSource::Single(src.clone())).with_limits(mlex_fuzz::tokenizer::template::TemplateLimits { fuel: 0, fuel_per_item: f, fuel_per_item_pair: 0, max_output: 1 << 30 }).render(&messages, &opts, &special);
        if let Err(e) = ok(1 << 40) { println!("{p}: fails anyway: {e}"); continue; }
        let (mut lo, mut hi) = (0u64, 1u64 << 20);
        while lo + 1 < hi { let m = (lo + hi) / 2; if ok(m).is_ok() { hi = m } else { lo = m } }
        let t = std::time::Instant::now(); let _ = ok(1 << 40);
        println!("{:>7} per item, {:>9} total, {:?}  {}", hi, hi * items, t.elapsed(), p.rsplit('/').next().unwrap());
    }
}
