//! Chat features through the whole engine on a tiny checkpoint written by the test: typed
//! streaming, the reasoning split and the reasoning budget (the forced closer), tool-call
//! plumbing. A random tiny model never writes a tool call on its own; the parsers and the
//! classifier are tested on synthetic streams in src/chat and src/generate/engine.rs.
mod common;
use common::{edit_json, TinyLlama, TINY_VOCAB};
use mlex::chat::{parse_tools_json, ToolCallFormat};
use mlex::{ChatMessage, FinishReason, GenerateOptions, GeneratedToken, Session, TokenKind};

const THINK: u32 = TINY_VOCAB as u32;
const END_THINK: u32 = TINY_VOCAB as u32 + 1;
/// "\n</think>\n\n" in the tiny byte-level vocabulary.
const CLOSER: [u32; 4] = [10, END_THINK, 10, 10];

/// ChatML whose generation prompt opens the reasoning (as Qwen3-Thinking's and DeepSeek-R1's do)
/// unless enable_thinking is false, where it writes an empty span (as Qwen3's does).
const THINK_TEMPLATE: &str = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% else %}{{ '<think>\\n' }}{% endif %}{% endif %}";

/// The tiny llama with `<think>` and `</think>` added to its vocabulary and a thinking template.
fn thinking_model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    // A context long enough for tool prompts (generation stops at the context length).
    TinyLlama { vocab: TINY_VOCAB + 2, max_position_embeddings: 4096, ..Default::default() }.write(dir.path());
    edit_json(&dir.path().join("tokenizer.json"), |t| {
        for (id, content) in [(THINK, "<think>"), (END_THINK, "</think>")] {
            t["model"]["vocab"][content] = id.into();
            t["added_tokens"].as_array_mut().unwrap().push(serde_json::json!({
                "id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": false}));
        }
    });
    edit_json(&dir.path().join("tokenizer_config.json"), |c| c["chat_template"] = THINK_TEMPLATE.into());
    dir
}

fn opts(max_tokens: usize, budget: Option<usize>) -> GenerateOptions {
    GenerateOptions { max_tokens, reasoning_budget_tokens: budget, ignore_eos: true, ..Default::default() }
}

fn run(s: &Session, msgs: &[ChatMessage], o: GenerateOptions) -> (Vec<GeneratedToken>, mlex::GenerateReply) {
    let mut streamed = Vec::new();
    let reply = s
        .generate_cached(msgs, None, o, |t| {
            streamed.push(t.clone());
            true
        })
        .unwrap();
    (streamed, reply)
}

fn of(tokens: &[GeneratedToken], kind: TokenKind) -> String {
    tokens.iter().filter(|t| t.kind == kind).map(|t| t.text.as_str()).collect()
}

#[test]
fn tokenizer_sees_the_thinking_format() {
    let dir = thinking_model();
    let s = Session::load(dir.path()).unwrap();
    let tok = s.tokenizer().unwrap();
    assert_eq!(tok.reasoning_format(), Some(mlex::chat::ReasoningFormat::Think));
    assert_eq!(tok.encode("\n</think>\n\n", false).unwrap(), CLOSER);
}

#[test]
fn budget_forces_the_closer_after_n_reasoning_tokens() {
    let dir = thinking_model();
    let s = Session::load(dir.path()).unwrap();
    let msgs = [ChatMessage::user("Think about it.")];
    let free = run(&s, &msgs, opts(12, None)).1;
    for n in [3usize, 5] {
        assert!(!free.tokens[..n].contains(&END_THINK), "the model closed the span itself: {:?}", free.tokens);
        let (streamed, reply) = run(&s, &msgs, opts(24, Some(n)));
        // Greedy: the first n tokens are the model's own, then the closer, then the answer.
        assert_eq!(reply.tokens[..n], free.tokens[..n], "budget {n}");
        assert_eq!(reply.tokens[n..n + 4], CLOSER, "budget {n}: {:?}", reply.tokens);
        assert_eq!(reply.tokens.len(), 24, "generation goes on to the answer");
        assert_eq!(reply.usage.completion_tokens, 24);
        assert_eq!(reply.logprobs[n..n + 4], [0.0; 4]);
        // Every token streamed once, in order; the reasoning ones (closer included) typed so.
        assert_eq!(streamed.iter().map(|t| t.id).collect::<Vec<_>>(), reply.tokens);
        assert!(streamed[..n + 4].iter().all(|t| t.kind == TokenKind::Reasoning), "{streamed:?}");
        assert!(streamed[n + 4..].iter().all(|t| t.kind != TokenKind::Reasoning));
        assert!(!reply.text.contains("think>"));
        assert_eq!(of(&streamed, TokenKind::Text), reply.text);
        assert_eq!(of(&streamed, TokenKind::Reasoning), reply.reasoning.clone().unwrap_or_default());
        // The answer after the closer is what the model says given that transcript.
        let mut prompt = s.encode_messages(&msgs, None, None).unwrap();
        prompt.extend_from_slice(&reply.tokens[..n + 4]);
        let cont = s.generate_tokens(&prompt, opts(24 - n - 4, None), |_| true).unwrap();
        assert_eq!(cont.tokens, reply.tokens[n + 4..], "budget {n}");
    }
}

#[test]
fn budget_zero_closes_before_the_first_token() {
    let dir = thinking_model();
    let s = Session::load(dir.path()).unwrap();
    let msgs = [ChatMessage::user("Quick.")];
    let (streamed, reply) = run(&s, &msgs, opts(10, Some(0)));
    assert_eq!(reply.tokens[..4], CLOSER, "{:?}", reply.tokens);
    assert_eq!(reply.tokens.len(), 10);
    assert_eq!(reply.reasoning, None);
    assert!(streamed[..4].iter().all(|t| t.kind == TokenKind::Reasoning));
    let mut prompt = s.encode_messages(&msgs, None, None).unwrap();
    prompt.extend_from_slice(&CLOSER);
    let cont = s.generate_tokens(&prompt, opts(6, None), |_| true).unwrap();
    assert_eq!(cont.tokens, reply.tokens[4..]);
}

#[test]
fn thinking_off_starts_in_text_and_budget_does_nothing() {
    let dir = thinking_model();
    let s = Session::load(dir.path()).unwrap();
    let msgs = [ChatMessage::user("No thinking.")];
    let o = GenerateOptions { enable_thinking: Some(false), ..opts(12, Some(2)) };
    let (streamed, reply) = run(&s, &msgs, o);
    assert!(!reply.tokens.contains(&END_THINK) || reply.tokens.contains(&THINK), "{:?}", reply.tokens);
    if !reply.tokens.contains(&THINK) {
        assert!(streamed.iter().all(|t| t.kind == TokenKind::Text), "{streamed:?}");
        assert_eq!(reply.reasoning, None);
    }
    assert_eq!(of(&streamed, TokenKind::Text), reply.text);
}

#[test]
fn stream_and_reply_agree_without_budget() {
    let dir = thinking_model();
    let s = Session::load(dir.path()).unwrap();
    for (i, temp) in [0.0f32, 1.5, 3.0].into_iter().enumerate() {
        let mut o = opts(40, None);
        o.sampling.temperature = temp;
        o.sampling.seed = Some(i as u64);
        let (streamed, reply) = run(&s, &[ChatMessage::user("Go.")], o);
        assert_eq!(streamed.iter().map(|t| t.id).collect::<Vec<_>>(), reply.tokens);
        assert_eq!(of(&streamed, TokenKind::Text), reply.text);
        assert!(!reply.text.contains("<think>") && !reply.text.contains("</think>"));
        // Reasoning spans are joined by a blank line in the reply; the stream has them back to back.
        assert_eq!(of(&streamed, TokenKind::Reasoning), reply.reasoning.clone().unwrap_or_default().replace("\n\n", ""), "{streamed:?}");
    }
}

#[test]
fn tools_pick_the_template_format_and_random_output_stays_text() {
    let dir = thinking_model();
    let s = Session::load(dir.path()).unwrap();
    let tools = parse_tools_json(r#"[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]"#).unwrap();
    let (streamed, reply) = {
        let mut v = Vec::new();
        let r = s
            .generate_cached(&[ChatMessage::user("Call f.")], Some(&tools), opts(16, None), |t| {
                v.push(t.clone());
                true
            })
            .unwrap();
        (v, r)
    };
    assert_eq!(reply.finish_reason, FinishReason::Length);
    assert!(reply.tool_calls.is_empty());
    assert!(streamed.iter().all(|t| t.kind != TokenKind::ToolCall));
    assert_eq!(s.tokenizer().unwrap().tool_call_format(), ToolCallFormat::Hermes);
    // This template has no tool support: the tools went in mlex's generic prompt.
    assert_eq!(reply.tool_call_format, Some(ToolCallFormat::Generic));
}

/// The reasoning budget inside a continuous batch: the row whose budget is spent steps out, is
/// fed the closer alone, and joins again; every reply equals the same request run alone.
#[test]
fn budget_forcing_inside_a_batch_equals_alone() {
    let dir = thinking_model();
    let s = Session::load(dir.path()).unwrap();
    let chat = |u: &str| mlex::Request::Chat { messages: vec![ChatMessage::user(u)], tools: None };
    let reqs = [("Think about it.", opts(20, Some(3))), ("Quick.", opts(12, Some(0))), ("Free.", opts(16, None))];
    let streams: Vec<_> = reqs.iter().map(|(u, o)| s.stream(chat(u), o.clone()).unwrap()).collect();
    let batched: Vec<_> = streams.into_iter().map(|g| g.finish().unwrap()).collect();
    for ((u, o), b) in reqs.iter().zip(&batched) {
        let alone = run(&s, &[ChatMessage::user(*u)], o.clone()).1;
        assert_eq!(b.tokens, alone.tokens, "{u}");
        assert_eq!(b.text, alone.text, "{u}");
        assert_eq!(b.reasoning, alone.reasoning, "{u}");
    }
    assert!(batched[0].tokens[3..7] == CLOSER, "{:?}", batched[0].tokens);
    assert!(batched.iter().map(|r| r.usage.batch_size).max().unwrap() > 1);
}

/// `tool_choice`: a required or named call is held to the tools' schemas in the template's call
/// format, so even a random model produces calls that parse into `tool_calls` with valid
/// arguments (thinking first, free); `none` hides the tools; bad choices are refused.
#[test]
fn tool_choice_required_and_named_produce_valid_calls() {
    use mlex::chat::ToolChoice;
    let dir = thinking_model();
    let s = Session::load(dir.path()).unwrap();
    let tools = parse_tools_json(
        r#"[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":8}},"required":["city"],"additionalProperties":false}}},
            {"type":"function","function":{"name":"add","parameters":{"type":"object","properties":{"a":{"type":"integer","minimum":0,"maximum":99},"b":{"type":"integer","minimum":0,"maximum":99}},"required":["a","b"],"additionalProperties":false}}}]"#,
    )
    .unwrap();
    let msgs = [ChatMessage::user("Use a tool.")];
    let with = |choice: ToolChoice| GenerateOptions { tool_choice: Some(choice), ..opts(120, Some(3)) };
    let named = s.generate_cached(&msgs, Some(&tools), with(ToolChoice::Named("add".into())), |_| true).unwrap();
    assert_eq!(named.finish_reason, FinishReason::ToolCalls, "{named:?}");
    // The template has no tool support: the generic format, held the same way.
    assert_eq!(named.tool_call_format, Some(ToolCallFormat::Generic));
    assert_eq!(named.tool_calls.len(), 1);
    assert_eq!(named.tool_calls[0].name, "add");
    let args = &named.tool_calls[0].arguments;
    assert!(args["a"].as_i64().is_some_and(|a| (0..=99).contains(&a)) && args["b"].is_i64(), "{args}");
    // Required: one call or several (parallel calls); a random model may go on calling until
    // it runs out of tokens, but every call it completed parses and names a given tool.
    let required = s.generate_cached(&msgs, Some(&tools), with(ToolChoice::Required), |_| true).unwrap();
    assert!(matches!(required.finish_reason, FinishReason::ToolCalls | FinishReason::Length), "{required:?}");
    assert!(!required.tool_calls.is_empty(), "{required:?}");
    assert!(required.tool_calls.iter().all(|c| c.name == "add" || c.name == "get_weather"));
    // none: answered as text, nothing parsed as a call.
    let none = s.generate_cached(&msgs, Some(&tools), with(ToolChoice::None), |_| true).unwrap();
    assert!(none.tool_calls.is_empty());
    for (choice, tools_given, says) in [
        (ToolChoice::Named("nope".into()), true, "not among the tools"),
        (ToolChoice::Required, false, "no tools"),
    ] {
        let t = if tools_given { Some(&tools[..]) } else { None };
        let e = s.generate_cached(&msgs, t, with(choice), |_| true).unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGUMENT");
        assert!(e.to_string().contains(says), "{e}");
    }
    // A tool the format cannot write: refused, naming the tool and the format.
    let odd = parse_tools_json(r#"[{"type":"function","function":{"name":"two words","parameters":{"type":"object"}}}]"#).unwrap();
    let o = GenerateOptions { tool_call_format: Some(ToolCallFormat::Gemma4), ..with(ToolChoice::Required) };
    let e = s.generate_cached(&msgs, Some(&odd), o, |_| true).unwrap_err();
    assert_eq!(e.code(), "INVALID_ARGUMENT");
    assert!(e.to_string().contains("gemma4") && e.to_string().contains("two words"), "{e}");
}

/// The thinking model with `markers` added to its vocabulary as special tokens and `template`
/// (whose text decides Mistral's call variant).
fn model_with(template: &str, markers: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    TinyLlama { vocab: TINY_VOCAB + 2 + markers.len(), max_position_embeddings: 4096, ..Default::default() }.write(dir.path());
    edit_json(&dir.path().join("tokenizer.json"), |t| {
        let added = [("<think>", false), ("</think>", false)].into_iter().chain(markers.iter().map(|m| (*m, true)));
        for (k, (content, special)) in added.enumerate() {
            let id = TINY_VOCAB + k;
            t["model"]["vocab"][content] = id.into();
            t["added_tokens"].as_array_mut().unwrap().push(serde_json::json!({
                "id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special}));
        }
    });
    edit_json(&dir.path().join("tokenizer_config.json"), |c| c["chat_template"] = template.into());
    dir
}

/// Tools whose schemas use what call grammars compile: bounded strings and integers, enums,
/// optional parameters, arrays, nested objects, a string-or-null.
fn rich_tools() -> Vec<mlex::chat::Tool> {
    parse_tools_json(
        r#"[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
              "city":{"type":"string","maxLength":6},"unit":{"enum":["c","f"]},"days":{"type":"integer","minimum":1,"maximum":7}},
              "required":["city"],"additionalProperties":false}}},
            {"type":"function","function":{"name":"add","parameters":{"type":"object","properties":{
              "a":{"type":"integer","minimum":0,"maximum":99},"b":{"type":"number","minimum":-1,"maximum":1}},"required":["a","b"],"additionalProperties":false}}},
            {"type":"function","function":{"name":"plan","parameters":{"type":"object","properties":{
              "steps":{"type":"array","items":{"type":"string","maxLength":3},"minItems":1,"maxItems":2},
              "opts":{"type":"object","properties":{"deep":{"type":"boolean"}},"required":["deep"],"additionalProperties":false},
              "note":{"type":["string","null"],"maxLength":4}},
              "required":["steps"],"additionalProperties":false}}}]"#,
    )
    .unwrap()
}

/// Every call parses, names one of `tools` and validates against its parameters.
fn assert_valid_calls(reply: &mlex::GenerateReply, tools: &[mlex::chat::Tool], what: &str) {
    for c in &reply.tool_calls {
        let t = tools.iter().find(|t| t.function.name == c.name).unwrap_or_else(|| panic!("{what}: unknown tool {c:?}"));
        assert!(jsonschema::is_valid(&t.function.parameters, &c.arguments), "{what}: {} does not validate against {}", c.arguments, t.function.parameters);
    }
}

/// `tool_choice` required / named in every call format: whatever the random model prefers,
/// the call it must make parses in that format's own parser (the reply's `tool_calls`) with
/// arguments that validate, after free thinking; markers that are special tokens are written
/// as those tokens.
#[test]
fn tool_choice_holds_every_call_format() {
    use mlex::chat::ToolChoice;
    let tools = rich_tools();
    let gemma = ["<|tool_call>", "<tool_call|>", "<|\"|>", "<|tool_response>"];
    let mistral = ["[TOOL_CALLS]", "[ARGS]"];
    let mistral_args_template = format!("{THINK_TEMPLATE}{{# [TOOL_CALLS]name[ARGS]{{}} #}}");
    let all = [ToolCallFormat::Hermes, ToolCallFormat::Qwen3Coder, ToolCallFormat::GemmaToolCode, ToolCallFormat::Llama3Json, ToolCallFormat::Mistral];
    let models: Vec<(tempfile::TempDir, &[&str], &[ToolCallFormat])> = vec![
        (thinking_model(), &[], &all),
        (model_with(THINK_TEMPLATE, &gemma), &gemma, &[ToolCallFormat::Gemma4]),
        // [TOOL_CALLS]name[ARGS]{…}, as the template shows.
        (model_with(&mistral_args_template, &mistral), &mistral, &[ToolCallFormat::Mistral]),
    ];
    let msgs = [ChatMessage::user("Use a tool.")];
    let (mut completed, mut total) = (0, 0);
    for (dir, markers, formats) in &models {
        let s = Session::load(dir.path()).unwrap();
        for &format in formats.iter() {
            let mut streams = vec![];
            let choices = [ToolChoice::Required, ToolChoice::Named("get_weather".into()), ToolChoice::Named("add".into()), ToolChoice::Named("plan".into())];
            for choice in choices {
                for (seed, temperature) in [(0u64, 0.0f32), (1, 1.0), (2, 1.0)] {
                    let mut o = GenerateOptions { tool_choice: Some(choice.clone()), tool_call_format: Some(format), ..opts(220, Some(3)) };
                    o.sampling.temperature = temperature;
                    o.sampling.seed = Some(seed);
                    let req = mlex::Request::Chat { messages: msgs.to_vec(), tools: Some(tools.clone()) };
                    streams.push((choice.clone(), s.stream(req, o).unwrap()));
                }
            }
            for (choice, g) in streams {
                let r = g.finish().unwrap();
                let what = format!("{format} {choice:?}: {:?} / {:?}", r.text, r.tool_calls);
                total += 1;
                assert!(r.reasoning.is_some(), "{what}: thinking comes first");
                assert_valid_calls(&r, &tools, &what);
                match r.finish_reason {
                    FinishReason::ToolCalls => {
                        completed += 1;
                        assert!(!r.tool_calls.is_empty(), "{what}");
                        assert!(r.text.trim().is_empty(), "{what}: no markup left in the text");
                        if let ToolChoice::Named(n) = &choice {
                            assert_eq!(r.tool_calls.len(), 1, "{what}");
                            assert_eq!(&r.tool_calls[0].name, n, "{what}");
                        }
                        if let Some(&opener) = markers.first() {
                            // The opener is written as the special token it is.
                            assert!(r.tokens.contains(&s.tokenizer().unwrap().token_to_id(opener).unwrap()), "{what}");
                        }
                    }
                    FinishReason::Length => assert_eq!(r.tokens.len(), 220, "{what}"),
                    other => panic!("{what}: finish {other:?}"),
                }
            }
        }
    }
    eprintln!("{completed} of {total} forced calls completed within 220 tokens (all valid)");
    assert!(completed * 10 >= total * 7, "most forced calls complete: {completed} of {total}");
}

/// The thinking model with `<tool_call>` and `</tool_call>` added (not special, as Qwen's), and
/// the opener made about as likely as the token the model writes most in its answers (its
/// lm_head row a copy of that token's, scaled by `gain`): a random model that opens calls.
fn opener_model(gain: f32) -> (tempfile::TempDir, u32) {
    let dir = model_with(THINK_TEMPLATE, &[]);
    edit_json(&dir.path().join("tokenizer.json"), |t| {
        for (k, content) in ["<tool_call>", "</tool_call>"].into_iter().enumerate() {
            let id = TINY_VOCAB + 2 + k;
            t["model"]["vocab"][content] = id.into();
            t["added_tokens"].as_array_mut().unwrap().push(serde_json::json!({
                "id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": false}));
        }
    });
    edit_json(&dir.path().join("config.json"), |c| c["vocab_size"] = (TINY_VOCAB + 4).into());
    let opener = TINY_VOCAB as u32 + 2;
    let weights = dir.path().join("model.safetensors");
    let mut ts = common::read_tensors(&weights);
    for t in ts.iter_mut().filter(|t| t.name == "lm_head.weight" || t.name == "model.embed_tokens.weight") {
        // Two more rows (copies of row 0 for now).
        let row = t.shape[1] * 4;
        let first = t.data[..row].to_vec();
        while t.data.len() < (TINY_VOCAB + 4) * row {
            t.data.extend_from_slice(&first);
        }
        t.data.truncate((TINY_VOCAB + 4) * row);
        t.shape[0] = TINY_VOCAB + 4;
    }
    common::write_safetensors(&weights, &ts);
    // The token the model writes most in its answers.
    let s = Session::load(dir.path()).unwrap();
    let mut counts = std::collections::HashMap::<u32, usize>::new();
    for seed in 0..8u64 {
        let mut o = opts(60, Some(3));
        o.sampling.temperature = 1.0;
        o.sampling.seed = Some(seed);
        let r = s.generate(&[ChatMessage::user("Use a tool.")], o).unwrap();
        let answer = r.tokens.iter().position(|&t| t == END_THINK).map_or(&r.tokens[..0], |p| &r.tokens[p + 1..]);
        for &t in answer {
            *counts.entry(t).or_default() += 1;
        }
    }
    drop(s);
    let (&x, _) = counts.iter().max_by_key(|(&t, &n)| (n, std::cmp::Reverse(t))).unwrap();
    let lm = ts.iter_mut().find(|t| t.name == "lm_head.weight").unwrap();
    let row = lm.shape[1] * 4;
    let copied: Vec<u8> = lm.data[x as usize * row..(x as usize + 1) * row]
        .chunks(4)
        .flat_map(|b| (f32::from_le_bytes(b.try_into().unwrap()) * gain).to_le_bytes())
        .collect();
    lm.data[opener as usize * row..(opener as usize + 1) * row].copy_from_slice(&copied);
    common::write_safetensors(&weights, &ts);
    (dir, opener)
}

/// `tool_choice` auto: the model writes freely (token for token what it writes when no call is
/// held) until it opens a call; from the opener to the closer the call is held to the tools, so
/// every call it closes parses and validates; after the closer it is free again.
#[test]
fn auto_holds_the_calls_the_model_opens() {
    use mlex::chat::ToolChoice;
    let (dir, opener) = opener_model(1.05);
    let closer = opener + 1;
    let s = Session::load(dir.path()).unwrap();
    let tools = rich_tools();
    let msgs = [ChatMessage::user("Use a tool.")];
    let (mut opened, mut closed_calls) = (0, 0);
    let with_seed = |seed: u64| {
        let mut o = GenerateOptions { tool_call_format: Some(ToolCallFormat::Hermes), ..opts(160, Some(3)) };
        o.sampling.temperature = 1.0;
        o.sampling.seed = Some(seed);
        o
    };
    let mut alone = vec![];
    for seed in 0..12u64 {
        let o = with_seed(seed);
        let mut streamed = vec![];
        let auto = s
            .generate_cached(&msgs, Some(&tools), o.clone(), |t| {
                streamed.push(t.clone());
                true
            })
            .unwrap();
        alone.push(auto.clone());
        assert_eq!(streamed.iter().map(|t| t.id).collect::<Vec<_>>(), auto.tokens);
        let free = s.generate_cached(&msgs, Some(&tools), GenerateOptions { tool_choice: Some(ToolChoice::None), ..o }, |_| true).unwrap();
        let what = format!("seed {seed}: {:?}", s.tokenizer().unwrap().decode(&auto.tokens, false).unwrap());
        assert_valid_calls(&auto, &tools, &what);
        let Some(first) = auto.tokens.iter().position(|&t| t == opener) else {
            assert_eq!(auto.tokens, free.tokens, "{what}: no call, no difference");
            continue;
        };
        // Free up to the opener: the same tokens as with no call held.
        assert_eq!(auto.tokens[..=first], free.tokens[..=first], "{what}");
        // Calls as the reply's classifier sees them: opened in text (not in reasoning), closed
        // by the first closer after.
        let (mut opens, mut closes, mut state) = (0, 0, 1); // 0 text, 1 reasoning (the prompt opened it), 2 call
        for (i, &t) in auto.tokens.iter().enumerate() {
            if state == 2 {
                assert_eq!(streamed[i].kind, TokenKind::ToolCall, "{what}: token {i} is in a call (forced ones too)");
            }
            state = match (state, t) {
                (0, t) if t == opener => {
                    opens += 1;
                    2
                }
                (0, THINK) => 1,
                (1, END_THINK) => 0,
                (2, t) if t == closer => {
                    closes += 1;
                    0
                }
                (st, _) => st,
            };
        }
        opened += opens;
        closed_calls += closes;
        // Every call closed parsed; an unclosed one is only the last, cut by max_tokens.
        assert_eq!(auto.tool_calls.len(), closes, "{what}");
        assert!(opens == closes || (opens == closes + 1 && state == 2 && auto.finish_reason == FinishReason::Length), "{what}");
    }
    eprintln!("{opened} calls opened, {closed_calls} closed (all valid)");
    // In a batch (rows stepping out to be fed what a call forces, and back), each reply equals
    // the same request alone.
    let chat = mlex::Request::Chat { messages: msgs.to_vec(), tools: Some(tools.clone()) };
    let streams: Vec<_> = (0..12u64).map(|seed| s.stream(chat.clone(), with_seed(seed)).unwrap()).collect();
    for (g, a) in streams.into_iter().zip(&alone) {
        let b = g.finish().unwrap();
        assert_eq!(b.tokens, a.tokens);
        assert_eq!(b.tool_calls.len(), a.tool_calls.len());
        assert!(b.usage.batch_size > 1);
    }
    assert!(closed_calls >= 3, "the random model opened and closed some calls: {opened} opened, {closed_calls} closed");
}

/// A chat template without tool support (it renders the same prompt with or without `tools`,
/// as SmolLM2's does) no longer drops the tools silently: they are described in mlex's generic
/// system prompt (or in the first user message when the template refuses a system role; or
/// before the messages when there is no template), earlier calls and results are written into
/// the conversation, and the reply says `tool_call_format: generic`. A template that shows the
/// tools, or an explicit format, is left alone.
#[test]
fn generic_tool_prompt_for_templates_without_tools() {
    use mlex::chat::generic::with_tool_prompt;
    use mlex::chat::ToolCall;
    let tools = rich_tools();
    let call = ToolCall { id: "call_1".into(), name: "add".into(), arguments: serde_json::json!({"a": 1, "b": 0}) };
    let history = vec![
        ChatMessage::system("Be brief."),
        ChatMessage::user("Add 1 and 0."),
        ChatMessage::assistant_with_tool_calls("", vec![call]),
        ChatMessage::tool("call_1", "1"),
    ];
    let no_system = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}".to_string() + THINK_TEMPLATE;
    let shows_tools = "{% if tools %}{{ '<|im_start|>system\\n<tools>' + (tools | tojson) + '</tools><|im_end|>\\n' }}{% endif %}".to_string() + THINK_TEMPLATE;
    let plain = model_with(THINK_TEMPLATE, &[]);
    let refuses_system = model_with(&no_system, &[]);
    let renders_tools = model_with(&shows_tools, &[]);
    let no_template = model_with(THINK_TEMPLATE, &[]);
    edit_json(&no_template.path().join("tokenizer_config.json"), |c| {
        c.as_object_mut().unwrap().remove("chat_template");
    });
    let o = || opts(6, None);
    for (dir, as_system, generic) in [(&plain, true, true), (&refuses_system, false, true), (&renders_tools, true, false), (&no_template, true, true)] {
        let s = Session::load(dir.path()).unwrap();
        for msgs in [&history[1..2], &history[..]] {
            let msgs: Vec<ChatMessage> = msgs.iter().filter(|m| as_system || m.role != mlex::Role::System).cloned().collect();
            let msgs = &msgs[..];
            let r = s.generate_cached(msgs, Some(&tools), o(), |_| true).unwrap();
            let bare = s.generate_cached(msgs, None, o(), |_| true).unwrap();
            assert_eq!(bare.tool_call_format, None);
            if generic {
                assert_eq!(r.tool_call_format, Some(ToolCallFormat::Generic));
                // What the model saw: the messages with the tool prompt, through the template.
                let seen = with_tool_prompt(msgs, &tools, as_system);
                assert_eq!(r.usage.prompt_tokens, s.encode_messages(&seen, None, None).unwrap().len());
                assert!(r.usage.prompt_tokens > bare.usage.prompt_tokens + 100);
                let text = seen.iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join("\n");
                assert!(text.contains("get_weather") && text.contains("<tool_call>"), "{text}");
                if msgs.len() > 2 {
                    assert!(text.contains("{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":0}}") && text.contains("<tool_response>"), "{text}");
                }
            } else {
                assert_eq!(r.tool_call_format, Some(ToolCallFormat::Hermes));
                assert_eq!(r.usage.prompt_tokens, s.encode_messages(msgs, Some(&tools), None).unwrap().len());
            }
        }
        // A format given explicitly is taken at its word: no prompt of mlex's own.
        let explicit = GenerateOptions { tool_call_format: Some(ToolCallFormat::Hermes), ..o() };
        let r = s.generate_cached(&history[1..2], Some(&tools), explicit, |_| true).unwrap();
        assert_eq!(r.tool_call_format, Some(ToolCallFormat::Hermes));
        assert_eq!(r.usage.prompt_tokens, s.encode_messages(&history[1..2], Some(&tools), None).unwrap().len());
    }
}
