//! Streaming classification of model output: a state machine fed text deltas as tokens arrive,
//! labelling each piece text, reasoning or tool call from the markers of the model's formats.
//!
//! Rules (they make the streamed pieces and the final reply agree):
//! - markers of reasoning spans never reach the output; tool-call markup is the tool call's
//!   own text (kind `ToolCall`) and never reaches text;
//! - a possible marker prefix at the end of the input (`<thi`) is held back until it resolves;
//! - whitespace next to a marker is dropped (`</think>\n\n` → the answer starts at its first
//!   character); trailing whitespace of text and reasoning is held back until something follows.
use super::reasoning::ReasoningFormat;
use super::tools::{new_call_id, parse_call_body, ToolCallFormat};
use super::{Tool, ToolCall};

/// What a piece of output is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpanKind {
    Text,
    Reasoning,
    ToolCall,
}

/// A classified piece of output. Empty `text` marks a marker that produced no visible text
/// (it still says which kind the token carrying it belongs to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub kind: SpanKind,
    pub text: String,
}

/// The output so far, span by span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Text(String),
    Reasoning(String),
    ToolCall { open: String, body: String, close: Option<String> },
}

/// A finished reply, split.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClassifiedOutput {
    pub text: String,
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ToolCall>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Text,
    Reasoning,
    Tool { close: Option<&'static str> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    OpenReasoning,
    CloseReasoning,
    /// A closer with no open span (the opener was in the prompt and went unnoticed): dropped.
    StrayClose,
    OpenTool { close: Option<&'static str> },
    CloseTool,
    /// The model's cue that it waits for tool results (Gemma 4's `<|tool_response>`).
    Stop,
}

/// The streaming classifier. Feed [`push`](Self::push) with each new piece of decoded text,
/// then [`finish`](Self::finish); [`into_output`](Self::into_output) gives the split reply.
#[derive(Debug, Clone)]
pub struct OutputClassifier {
    reasoning: Option<ReasoningFormat>,
    tools: Option<ToolCallFormat>,
    state: State,
    pending: String,
    swallow_ws: bool,
    /// Text with something other than whitespace was emitted (Llama 3's bare-JSON calls only
    /// count at the start of the reply).
    text_started: bool,
    parts: Vec<Part>,
    stop: bool,
    /// Tool calls opened so far.
    calls_opened: usize,
}

impl OutputClassifier {
    /// `reasoning`/`tools`: the formats to recognise (None: that kind of span is not parsed).
    /// `starts_in_reasoning`: the prompt ended inside an open reasoning span.
    pub fn new(reasoning: Option<ReasoningFormat>, tools: Option<ToolCallFormat>, starts_in_reasoning: bool) -> Self {
        let inside = starts_in_reasoning && reasoning.is_some();
        OutputClassifier {
            reasoning,
            tools,
            state: if inside { State::Reasoning } else { State::Text },
            pending: String::new(),
            swallow_ws: inside,
            text_started: false,
            parts: if inside { vec![Part::Reasoning(String::new())] } else { vec![] },
            stop: false,
            calls_opened: 0,
        }
    }

    /// Inside an open reasoning span now.
    pub fn in_reasoning(&self) -> bool {
        self.state == State::Reasoning
    }

    /// The kind text would get if it came now.
    pub fn current_kind(&self) -> SpanKind {
        match self.state {
            State::Text => SpanKind::Text,
            State::Reasoning => SpanKind::Reasoning,
            State::Tool { .. } => SpanKind::ToolCall,
        }
    }

    /// Text is held back (a possible marker, trailing whitespace).
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The model signalled that it waits for tool results.
    pub fn stop_requested(&self) -> bool {
        self.stop
    }

    /// Whether a complete tool call span was seen (it may still fail to parse).
    pub fn saw_tool_call(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::ToolCall { .. }))
    }

    /// How many tool calls the output opened so far.
    pub fn calls_opened(&self) -> usize {
        self.calls_opened
    }

    /// The tool call being written: the marker that opened it and everything after it so far
    /// (what is held back included).
    pub fn open_call(&self) -> Option<(&str, String)> {
        match (self.state, self.parts.last()) {
            (State::Tool { .. }, Some(Part::ToolCall { open, body, .. })) => Some((open.as_str(), format!("{body}{}", self.pending))),
            _ => None,
        }
    }

    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// Classifies the next piece of output; returns what can be released now.
    pub fn push(&mut self, delta: &str) -> Vec<Segment> {
        let mut out = Vec::new();
        self.pending.push_str(delta);
        loop {
            match self.find_trigger() {
                Some((pos, len, action)) => {
                    let before = self.pending[..pos].to_string();
                    let marker = self.pending[pos..pos + len].to_string();
                    self.emit_content(&before, true, &mut out);
                    self.apply(action, &marker, &mut out);
                    self.pending.drain(..pos + len);
                }
                None => {
                    let cut = self.releasable();
                    let now = self.pending[..cut].to_string();
                    self.emit_content(&now, false, &mut out);
                    self.pending.drain(..cut);
                    return out;
                }
            }
        }
    }

    /// Releases what is held back at the end of the output.
    pub fn finish(&mut self) -> Vec<Segment> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.pending);
        // Reasoning cut off at the end loses its trailing whitespace; text keeps it.
        let trim_end = self.state == State::Reasoning;
        self.emit_content(&rest, trim_end, &mut out);
        out
    }

    /// The reply: text, reasoning and parsed tool calls. A tool call that does not parse, or
    /// whose closing marker never came, goes back into the text as it was written.
    /// `tools` (optional) types parameter values of formats that write them untyped.
    pub fn into_output(self, tools: Option<&[Tool]>) -> ClassifiedOutput {
        let mut out = ClassifiedOutput::default();
        let mut reasoning: Vec<String> = Vec::new();
        for part in self.parts {
            match part {
                Part::Text(t) => out.text.push_str(&t),
                Part::Reasoning(r) => {
                    if !r.is_empty() {
                        reasoning.push(r)
                    }
                }
                Part::ToolCall { open, body, close } => {
                    let format = self.tools.unwrap_or(ToolCallFormat::Hermes);
                    let complete = close.is_some() || format.closer_for(&open).is_none();
                    let parsed = if complete { parse_call_body(format, &open, &body, tools).ok() } else { None };
                    match parsed {
                        Some(calls) if !calls.is_empty() => {
                            for (name, arguments) in calls {
                                out.tool_calls.push(ToolCall { id: new_call_id(), name, arguments });
                            }
                        }
                        _ => {
                            out.text.push_str(&open);
                            out.text.push_str(&body);
                            out.text.push_str(close.as_deref().unwrap_or(""));
                        }
                    }
                }
            }
        }
        if !reasoning.is_empty() {
            out.reasoning = Some(reasoning.join("\n\n"));
        }
        out
    }

    fn triggers(&self) -> Vec<(&'static str, Action)> {
        let mut t = Vec::new();
        match self.state {
            State::Text => {
                if let Some(r) = self.reasoning {
                    t.push((r.open(), Action::OpenReasoning));
                    t.push((r.close(), Action::StrayClose));
                }
                if let Some(f) = self.tools {
                    for &(open, close) in f.openers() {
                        t.push((open, Action::OpenTool { close }));
                    }
                    for &m in f.stop_markers() {
                        t.push((m, Action::Stop));
                    }
                }
            }
            State::Reasoning => {
                if let Some(r) = self.reasoning {
                    t.push((r.close(), Action::CloseReasoning));
                }
            }
            State::Tool { close: Some(c) } => t.push((c, Action::CloseTool)),
            State::Tool { close: None } => {}
        }
        t
    }

    /// The earliest marker in `pending`: (position, length, action).
    fn find_trigger(&self) -> Option<(usize, usize, Action)> {
        let mut best: Option<(usize, usize, Action)> = None;
        for (m, action) in self.triggers() {
            if let Some(pos) = self.pending.find(m) {
                if best.is_none_or(|(p, l, _)| pos < p || (pos == p && m.len() > l)) {
                    best = Some((pos, m.len(), action));
                }
            }
        }
        // Llama 3 writes calls as bare JSON at the start of its reply.
        // (Not while what follows could still become a marker, e.g. `[` of Mistral's `[THINK]`.)
        if self.bare_json_calls() {
            let ws = self.pending.len() - self.pending.trim_start().len();
            let rest = &self.pending[ws..];
            let undecided = self.triggers().iter().any(|(m, _)| m.starts_with(rest));
            if rest.starts_with(['{', '[']) && !undecided && best.is_none_or(|(p, _, _)| ws < p) {
                best = Some((ws, 0, Action::OpenTool { close: None }));
            }
        }
        best
    }

    fn bare_json_calls(&self) -> bool {
        self.state == State::Text && !self.text_started && self.tools == Some(ToolCallFormat::Llama3Json)
    }

    /// How much of `pending` can be released: all but a possible marker prefix at its end and,
    /// outside tool calls, the whitespace before that.
    fn releasable(&self) -> usize {
        let p = &self.pending;
        let triggers = self.triggers();
        if triggers.is_empty() {
            // No marker can come: nothing to wait for (whitespace is only dropped next to one).
            return p.len();
        }
        let mut hold = 0;
        for (m, _) in triggers {
            for k in (1..m.len().min(p.len() + 1)).rev() {
                if k > hold && m.is_char_boundary(k) && p.ends_with(&m[..k]) {
                    hold = k;
                    break;
                }
            }
        }
        let cut = p.len() - hold;
        match self.state {
            State::Text | State::Reasoning => p[..cut].trim_end().len(),
            State::Tool { .. } => cut,
        }
    }

    fn emit_content(&mut self, s: &str, before_marker: bool, out: &mut Vec<Segment>) {
        let kind = self.current_kind();
        let mut s = s;
        if matches!(self.state, State::Text | State::Reasoning) {
            if self.swallow_ws {
                s = s.trim_start();
            }
            if before_marker {
                s = s.trim_end();
            }
        }
        if s.is_empty() {
            return;
        }
        match self.state {
            State::Text => {
                self.swallow_ws = false;
                if !s.trim().is_empty() {
                    self.text_started = true;
                }
                match self.parts.last_mut() {
                    Some(Part::Text(t)) => t.push_str(s),
                    _ => self.parts.push(Part::Text(s.to_string())),
                }
            }
            State::Reasoning => {
                self.swallow_ws = false;
                match self.parts.last_mut() {
                    Some(Part::Reasoning(t)) => t.push_str(s),
                    _ => self.parts.push(Part::Reasoning(s.to_string())),
                }
            }
            State::Tool { .. } => {
                if let Some(Part::ToolCall { body, .. }) = self.parts.last_mut() {
                    body.push_str(s);
                }
            }
        }
        push_segment(out, kind, s);
    }

    fn apply(&mut self, action: Action, marker: &str, out: &mut Vec<Segment>) {
        match action {
            Action::OpenReasoning => {
                self.state = State::Reasoning;
                self.parts.push(Part::Reasoning(String::new()));
                self.swallow_ws = true;
                push_segment(out, SpanKind::Reasoning, "");
            }
            Action::CloseReasoning | Action::StrayClose => {
                self.state = State::Text;
                self.swallow_ws = true;
                push_segment(out, SpanKind::Reasoning, "");
            }
            Action::OpenTool { close } => {
                self.state = State::Tool { close };
                self.calls_opened += 1;
                self.parts.push(Part::ToolCall { open: marker.to_string(), body: String::new(), close: None });
                push_segment(out, SpanKind::ToolCall, marker);
            }
            Action::CloseTool => {
                if let Some(Part::ToolCall { close, .. }) = self.parts.last_mut() {
                    *close = Some(marker.to_string());
                }
                self.state = State::Text;
                self.swallow_ws = true;
                push_segment(out, SpanKind::ToolCall, marker);
            }
            Action::Stop => {
                self.stop = true;
                self.swallow_ws = true;
                push_segment(out, SpanKind::ToolCall, "");
            }
        }
    }
}

fn push_segment(out: &mut Vec<Segment>, kind: SpanKind, text: &str) {
    match out.last_mut() {
        Some(last) if last.kind == kind => last.text.push_str(text),
        _ => out.push(Segment { kind, text: text.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Feeds `pieces` one by one; returns (text-kind stream, reasoning stream, tool stream, output).
    fn run(
        reasoning: Option<ReasoningFormat>,
        tools: Option<ToolCallFormat>,
        inside: bool,
        pieces: &[&str],
    ) -> (String, String, String, ClassifiedOutput) {
        let mut c = OutputClassifier::new(reasoning, tools, inside);
        let mut segs = Vec::new();
        for p in pieces {
            segs.extend(c.push(p));
        }
        segs.extend(c.finish());
        let cat = |k: SpanKind| segs.iter().filter(|s| s.kind == k).map(|s| s.text.as_str()).collect::<String>();
        let (t, r, tc) = (cat(SpanKind::Text), cat(SpanKind::Reasoning), cat(SpanKind::ToolCall));
        (t, r, tc, c.into_output(None))
    }

    fn chars(s: &str) -> Vec<String> {
        s.chars().map(|c| c.to_string()).collect()
    }

    #[test]
    fn think_markers_split_at_every_boundary() {
        let full = "<think>\nI should add.\n2+2=4\n</think>\n\nThe answer is 4.";
        // Every split point of the whole string, and char by char.
        for i in 0..=full.len() {
            let (t, r, _, out) = run(Some(ReasoningFormat::Think), None, false, &[&full[..i], &full[i..]]);
            assert_eq!(t, "The answer is 4.", "split at {i}");
            assert_eq!(r, "I should add.\n2+2=4", "split at {i}");
            assert_eq!(out.text, t);
            assert_eq!(out.reasoning.as_deref(), Some(r.as_str()));
        }
        let pieces = chars(full);
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let (t, r, _, _) = run(Some(ReasoningFormat::Think), None, false, &refs);
        assert_eq!((t.as_str(), r.as_str()), ("The answer is 4.", "I should add.\n2+2=4"));
    }

    #[test]
    fn starts_inside_reasoning() {
        let (t, r, _, out) = run(Some(ReasoningFormat::Think), None, true, &["Hmm", ".\n</", "think>\n\n", "Yes"]);
        assert_eq!((t.as_str(), r.as_str()), ("Yes", "Hmm."));
        assert_eq!(out.reasoning.as_deref(), Some("Hmm."));
    }

    #[test]
    fn near_markers_are_text() {
        let (t, _, _, out) = run(Some(ReasoningFormat::Think), Some(ToolCallFormat::Hermes), false, &["a <thin", "g> and <tool", "box>"]);
        assert_eq!(t, "a <thing> and <toolbox>");
        assert_eq!(out.text, t);
        assert!(out.tool_calls.is_empty());
    }

    #[test]
    fn gemma4_channel_and_calls() {
        let full = "<|channel>thought\nNeed weather.<channel|><|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:2}<tool_call|><|tool_response>";
        for i in 0..=full.len() {
            if !full.is_char_boundary(i) {
                continue;
            }
            let mut c = OutputClassifier::new(Some(ReasoningFormat::Gemma4Channel), Some(ToolCallFormat::Gemma4), false);
            let mut segs = c.push(&full[..i]);
            segs.extend(c.push(&full[i..]));
            segs.extend(c.finish());
            assert!(c.stop_requested());
            assert!(segs.iter().all(|s| s.kind != SpanKind::Text || s.text.is_empty()), "{segs:?}");
            let out = c.into_output(None);
            assert_eq!(out.text, "");
            assert_eq!(out.reasoning.as_deref(), Some("Need weather."));
            assert_eq!(out.tool_calls.len(), 1);
            assert_eq!(out.tool_calls[0].name, "get_weather");
            assert_eq!(out.tool_calls[0].arguments, json!({"city": "Paris", "days": 2}));
        }
    }

    #[test]
    fn hermes_call_streamed_as_tool_kind() {
        let (t, _, tc, out) = run(
            None,
            Some(ToolCallFormat::Hermes),
            false,
            &["Let me check.\n\n<tool", "_call>\n{\"name\": \"f\", ", "\"arguments\": {\"x\": 1}}\n</tool_call>"],
        );
        assert_eq!(t, "Let me check.");
        assert!(tc.starts_with("<tool_call>") && tc.ends_with("</tool_call>"), "{tc}");
        assert_eq!(out.text, "Let me check.");
        assert_eq!(out.tool_calls.len(), 1);
        assert_eq!(out.tool_calls[0].arguments, json!({"x": 1}));
    }

    #[test]
    fn unclosed_or_broken_calls_come_back_as_text() {
        let (_, _, _, out) = run(None, Some(ToolCallFormat::Hermes), false, &["<tool_call>{\"name\": \"f\""]);
        assert_eq!(out.text, "<tool_call>{\"name\": \"f\"");
        assert!(out.tool_calls.is_empty());
        let (_, _, _, out) = run(None, Some(ToolCallFormat::Hermes), false, &["A <tool_call>{broken</tool_call> B"]);
        assert_eq!(out.text, "A<tool_call>{broken</tool_call>B");
        assert!(out.tool_calls.is_empty());
    }

    #[test]
    fn llama3_bare_json_only_at_start() {
        let (t, _, tc, out) = run(None, Some(ToolCallFormat::Llama3Json), false, &["\n{\"name\": \"f\", \"parameters\": {\"a\": \"b\"}}"]);
        assert_eq!(t, "");
        assert!(tc.starts_with('{'));
        assert_eq!(out.tool_calls[0].name, "f");
        let (_, _, _, out) = run(None, Some(ToolCallFormat::Llama3Json), false, &["Here: {\"name\": \"f\", \"parameters\": {}}"]);
        assert!(out.tool_calls.is_empty());
        assert_eq!(out.text, "Here: {\"name\": \"f\", \"parameters\": {}}");
        // A JSON answer that is no call stays text.
        let (_, _, _, out) = run(None, Some(ToolCallFormat::Llama3Json), false, &["{\"answer\": 4}"]);
        assert_eq!(out.text, "{\"answer\": 4}");
    }

    #[test]
    fn bare_json_waits_for_a_marker_that_starts_alike() {
        // Found by the fuzzer: `[` could be Llama 3's JSON array or Mistral's `[THINK]`.
        for pieces in [&["[THINK]x[/THINK]ok"][..], &["[", "TH", "INK]x[/THI", "NK]ok"][..]] {
            let (t, r, _, _) = run(Some(ReasoningFormat::MistralThink), Some(ToolCallFormat::Llama3Json), false, pieces);
            assert_eq!((t.as_str(), r.as_str()), ("ok", "x"), "{pieces:?}");
        }
    }

    #[test]
    fn text_whitespace_kept_inside_released_at_end() {
        let (t, _, _, out) = run(None, None, false, &["a\n", "\nb ", " c\n"]);
        assert_eq!(t, "a\n\nb  c\n");
        assert_eq!(out.text, t);
    }
}
