//! The streaming classifier fed arbitrary text in arbitrary pieces: no panic; the result does not
//! depend on where the text was cut; reasoning markers and tool-call openers never reach a
//! text-kind piece; the reply's text equals the streamed text when every call parsed.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mlex_fuzz::chat::{OutputClassifier, ReasoningFormat, Segment, SpanKind, ToolCallFormat};

fn concat(segs: &[Segment], kind: SpanKind) -> String {
    segs.iter().filter(|s| s.kind == kind).map(|s| s.text.as_str()).collect()
}

fn classify(
    r: Option<ReasoningFormat>,
    t: Option<ToolCallFormat>,
    inside: bool,
    pieces: &[&str],
) -> (Vec<Segment>, OutputClassifier) {
    let mut c = OutputClassifier::new(r, t, inside);
    let mut segs = Vec::new();
    for p in pieces {
        segs.extend(c.push(p));
    }
    segs.extend(c.finish());
    (segs, c)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let (cfg, seed, rest) = (data[0], data[1], &data[2..]);
    let text = String::from_utf8_lossy(rest);
    let reasoning = match cfg % 4 {
        0 => None,
        n => Some(ReasoningFormat::ALL[n as usize - 1]),
    };
    let tools = match (cfg / 4) % 7 {
        0 => None,
        n => Some(ToolCallFormat::ALL[n as usize - 1]),
    };
    let inside = cfg & 0x80 != 0;

    // Cut at char boundaries, piece sizes driven by the seed.
    let mut pieces = Vec::new();
    let (mut start, mut i) = (0, 0usize);
    while start < text.len() {
        let mut end = (start + 1 + (seed as usize).wrapping_mul(i + 7) % 11).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        pieces.push(&text[start..end]);
        start = end;
        i += 1;
    }
    let (segs, c) = classify(reasoning, tools, inside, &pieces);
    let (whole, cw) = classify(reasoning, tools, inside, &[&text]);
    for kind in [SpanKind::Text, SpanKind::Reasoning, SpanKind::ToolCall] {
        assert_eq!(concat(&segs, kind), concat(&whole, kind), "{kind:?} depends on the cuts");
    }
    assert_eq!(c.parts(), cw.parts());
    // No text piece holds a marker. (Text on both sides of a removed marker may join into one
    // when concatenated — "</thi<think>…</think>nk>" — which is the model's text, not a marker.)
    for seg in segs.iter().filter(|s| s.kind == SpanKind::Text) {
        if let Some(r) = reasoning {
            assert!(!seg.text.contains(r.open()) && !seg.text.contains(r.close()), "{seg:?}");
        }
        if let Some(t) = tools {
            for (open, _) in t.openers() {
                assert!(!seg.text.contains(open), "{seg:?}");
            }
        }
    }
    let streamed_text = concat(&segs, SpanKind::Text);
    let out = c.into_output(None);
    if mlex_fuzz::every_call_parses(tools, cw.parts()) {
        assert_eq!(out.text, streamed_text);
    }
    let _ = cw.into_output(None);
});
