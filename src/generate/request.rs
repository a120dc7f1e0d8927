//! One request's side of generation, whatever schedules its steps (alone, or as a row of a
//! continuous batch): what each new token does to its reply (stop conditions, stop strings,
//! the reasoning budget, streaming each token once with its kind) and the reply at the end.
use super::constraint::ToolCallTrigger;
use super::engine::{Event, GenerateJob};
use super::generator::{Flow, LoopStats, TokenStep};
use super::options::{FinishReason, GenerateOptions, GenerateReply, GeneratedToken, TokenKind, TopLogprob, Usage};
use super::text::TextStream;
use crate::chat::{OutputClassifier, Segment, SpanKind};
use crate::error::Result;
use crate::tokenizer::Tokenizer;
use std::sync::atomic::Ordering;

/// A request's reply as it is being generated.
pub struct Reply {
    /// Every sampled token in order (the decode loop feeds each one back before handing it over,
    /// so the caches end up holding the prompt and a prefix of these).
    pub sampled: Vec<u32>,
    text: TextStream,
    out: OutputStream,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    /// With `top_logprobs`: each token's most likely alternatives.
    top_logprobs: Option<TopLogprobs>,
    pub finish: FinishReason,
    /// A completed stop string drops what is held back; every other ending flushes it.
    stop_string_hit: bool,
    eos: Vec<u32>,
    ignore_eos: bool,
    /// `tool_choice` auto: a call the model opens is held to the tools from then on.
    calls: Option<ToolCallTrigger>,
    /// Calls opened so far that were looked at (held, or let go).
    calls_seen: usize,
}

impl Reply {
    pub fn new(tokenizer: Option<&Tokenizer>, eos: &[u32], prompt: &[u32], opts: &GenerateOptions) -> Result<Self> {
        Ok(Reply {
            sampled: vec![],
            text: TextStream::new(tokenizer, &opts.stop),
            out: OutputStream::new(tokenizer, prompt, opts)?,
            tokens: vec![],
            logprobs: vec![],
            top_logprobs: opts.top_logprobs.filter(|&n| n > 0).map(|_| TopLogprobs {
                all: vec![],
                tokenizer: tokenizer.cloned(),
                texts: Default::default(),
            }),
            finish: FinishReason::Length,
            stop_string_hit: false,
            eos: eos.to_vec(),
            // A constrained reply ends at EOS once its grammar is complete (only EOS is allowed then).
            ignore_eos: opts.ignore_eos && opts.response_format.as_ref().is_none_or(|f| f.trigger().is_some()),
            calls: opts.response_format.as_ref().and_then(|f| f.trigger()).cloned(),
            calls_seen: 0,
        })
    }

    /// Takes the next token of `job`'s reply; says whether to go on.
    pub fn on_token(&mut self, job: &GenerateJob, step: TokenStep) -> Result<Flow> {
        let out = &mut self.out;
        self.sampled.push(step.id);
        if job.abort.load(Ordering::Relaxed) {
            self.finish = FinishReason::Abort;
            return Ok(Flow::Stop);
        }
        if !step.forced && !self.ignore_eos && self.eos.contains(&step.id) {
            self.finish = FinishReason::Stop;
            return Ok(Flow::Stop);
        }
        // Budget 0 and the prompt opened the reasoning: close it before its first token.
        if !step.forced && out.budget_spent() {
            out.forced = true;
            out.forced_kind = TokenKind::Reasoning;
            return Ok(Flow::Replace(out.forced_close.clone()));
        }
        let was_reasoning = out.classifier.in_reasoning();
        self.tokens.push(step.id);
        self.logprobs.push(step.logprob);
        let top = match &mut self.top_logprobs {
            Some(t) => t.push(&step.top)?,
            None => vec![],
        };
        let delta = self.text.push(step.id)?;
        let text_pending = self.text.has_pending() && !delta.stopped;
        let ready = out.accept(&step, top, &delta.text, text_pending);
        let mut sent = true;
        for t in ready {
            sent = sent && job.events.send(Event::Token(t));
        }
        if !sent {
            self.finish = FinishReason::Abort;
            return Ok(Flow::Stop);
        }
        if delta.stopped {
            self.stop_string_hit = true;
            self.finish = FinishReason::Stop;
            return Ok(Flow::Stop);
        }
        if out.classifier.stop_requested() {
            self.finish = FinishReason::Stop;
            return Ok(Flow::Stop);
        }
        // The model opened a tool call (and all of its text so far is in): hold the rest of it
        // to the tools. The token already sampled after this one was sampled free: the loop
        // drops it and feeds what the call's grammar forces instead.
        if let (Some(calls), false, false) = (&self.calls, step.forced, text_pending) {
            let opened = out.classifier.calls_opened();
            if opened > self.calls_seen {
                self.calls_seen = opened;
                if let Some((opener, written)) = out.classifier.open_call() {
                    match calls.arm(opener, &written) {
                        Some(forced) if !forced.is_empty() => {
                            out.forced_kind = TokenKind::ToolCall;
                            return Ok(Flow::Force(forced));
                        }
                        // Nothing forced next: the call is held from the token after the next.
                        _ => {}
                    }
                }
            }
        }
        if !step.forced {
            if was_reasoning {
                out.reasoning_tokens += 1;
            }
            if out.budget_spent() {
                out.forced = true;
                out.forced_kind = TokenKind::Reasoning;
                return Ok(Flow::Force(out.forced_close.clone()));
            }
        }
        Ok(Flow::Continue)
    }

    /// Streams what is held back and builds the reply.
    pub fn finish(mut self, job: &GenerateJob, usage: Usage) -> Result<GenerateReply> {
        let tail = if self.stop_string_hit { String::new() } else { self.text.finish()?.text };
        for t in self.out.finish(&tail) {
            job.events.send(Event::Token(t));
        }
        let output = self.out.classifier.into_output(job.tools.as_deref());
        let mut finish = self.finish;
        if !output.tool_calls.is_empty() && finish == FinishReason::Stop {
            finish = FinishReason::ToolCalls;
        }
        Ok(GenerateReply {
            text: output.text,
            reasoning: output.reasoning,
            tool_calls: output.tool_calls,
            tokens: self.tokens,
            logprobs: self.logprobs,
            top_logprobs: self.top_logprobs.map(|t| t.all).unwrap_or_default(),
            finish_reason: finish,
            usage,
            tool_call_format: job.options.tool_call_format.filter(|_| job.tools.is_some()),
        })
    }

    pub fn completion_tokens(&self) -> usize {
        self.tokens.len()
    }
}

/// A reply's top logprobs, each alternative named by its text.
struct TopLogprobs {
    /// One list per token.
    all: Vec<Vec<TopLogprob>>,
    tokenizer: Option<Tokenizer>,
    /// Each token decoded alone, once (the same alternatives come back step after step).
    texts: std::collections::HashMap<u32, String>,
}

impl TopLogprobs {
    /// Adds a step's list (`(id, logprob)`, most likely first); returns it with texts.
    fn push(&mut self, top: &[(u32, f32)]) -> Result<Vec<TopLogprob>> {
        let mut out = Vec::with_capacity(top.len());
        for &(id, logprob) in top {
            let text = match (self.texts.get(&id), &self.tokenizer) {
                (Some(t), _) => t.clone(),
                (None, Some(tok)) => self.texts.entry(id).or_insert(tok.decode(&[id], false)?).clone(),
                (None, None) => String::new(),
            };
            out.push(TopLogprob { id, text, logprob });
        }
        self.all.push(out.clone());
        Ok(out)
    }
}

/// The reasoning format whose span `prompt` leaves open (its generation prompt began the
/// reasoning), if any: the reply starts inside it.
pub fn prompt_opens_reasoning(tokenizer: Option<&Tokenizer>, prompt: &[u32]) -> Result<Option<crate::chat::ReasoningFormat>> {
    let (Some(t), Some(f)) = (tokenizer, tokenizer.and_then(|t| t.reasoning_format())) else { return Ok(None) };
    // (ids standing for image tokens have no text)
    let tail: Vec<u32> = prompt[prompt.len().saturating_sub(16)..]
        .iter()
        .copied()
        .filter(|&id| !crate::models::vision_lm::is_media_token(id))
        .collect();
    let tail = t.decode(&tail, false)?;
    Ok(f.prompt_opens_reasoning(&tail).then_some(f))
}

/// A request's usage from its loop's figures.
pub fn usage(prompt_tokens: usize, completion_tokens: usize, queue_ms: f64, stats: &LoopStats) -> Usage {
    let per_step = |s: f64| if stats.steps_scheduled > 0 { s * 1e3 / stats.steps_scheduled as f64 } else { 0.0 };
    Usage {
        prompt_tokens,
        cached_tokens: prompt_tokens - stats.prefilled,
        completion_tokens,
        queue_ms,
        ttft_ms: stats.ttft_s * 1e3,
        prefill_tokens_per_second: if stats.ttft_s > 0.0 { stats.prefilled as f64 / stats.ttft_s } else { 0.0 },
        decode_tokens_per_second: if stats.decode_s > 0.0 && stats.generated > 1 {
            (stats.generated - 1) as f64 / stats.decode_s
        } else {
            0.0
        },
        schedule_ms_per_step: per_step(stats.schedule_s),
        submit_ms_per_step: per_step(stats.submit_s),
        wait_ms_per_step: if stats.generated > 1 { stats.wait_s * 1e3 / (stats.generated - 1) as f64 } else { 0.0 },
        peak_memory_bytes: stats.peak_memory as u64,
        batch_size: stats.batch_size.max(1),
        batched: stats.batched,
        draft_tokens: stats.drafted,
        accepted_draft_tokens: stats.accepted,
        acceptance_rate: if stats.drafted > 0 { stats.accepted as f64 / stats.drafted as f64 } else { 0.0 },
        tokens_per_step: if stats.verify_steps > 0 { stats.generated as f64 / stats.verify_steps as f64 } else { 1.0 },
        dropped_passes: stats.dropped_passes,
    }
}

fn kind_of(k: SpanKind) -> TokenKind {
    match k {
        SpanKind::Text => TokenKind::Text,
        SpanKind::Reasoning => TokenKind::Reasoning,
        SpanKind::ToolCall => TokenKind::ToolCall,
    }
}

/// Classifies streamed text into text / reasoning / tool-call pieces, one kind per token, and
/// keeps count of the reasoning budget.
struct OutputStream {
    classifier: OutputClassifier,
    /// A token whose text is partly held back (incomplete character, possible stop string,
    /// possible marker) is itself held until its text resolves, so that it takes the kind of
    /// what it turned out to be, and text flushed at the end can join it: every token is
    /// streamed exactly once.
    /// With each: whether its kind is settled (forced tokens are reasoning whatever follows).
    held: Vec<(GeneratedToken, bool)>,
    /// Pieces of a token's text that belong to a later kind than the token's: they ride on the
    /// next token.
    carry: Vec<Segment>,
    budget: Option<usize>,
    reasoning_tokens: usize,
    /// Token ids that close the reasoning span (empty: no reasoning format, or no budget).
    forced_close: Vec<u32>,
    /// The closer was forced already (once per reply).
    forced: bool,
    /// The kind of forced tokens: the reasoning's closer, or what a tool call's grammar forces.
    forced_kind: TokenKind,
}

impl OutputStream {
    fn new(tokenizer: Option<&Tokenizer>, prompt: &[u32], opts: &GenerateOptions) -> Result<Self> {
        let reasoning = tokenizer.and_then(|t| t.reasoning_format());
        let starts_inside = prompt_opens_reasoning(tokenizer, prompt)?.is_some();
        let forced_close = match (reasoning, tokenizer, opts.reasoning_budget_tokens) {
            (Some(f), Some(t), Some(_)) => t.encode(f.forced_close(), false)?,
            _ => vec![],
        };
        Ok(Self::with_classifier(
            OutputClassifier::new(reasoning, opts.tool_call_format, starts_inside),
            opts.reasoning_budget_tokens,
            forced_close,
        ))
    }

    fn with_classifier(classifier: OutputClassifier, budget: Option<usize>, forced_close: Vec<u32>) -> Self {
        OutputStream {
            classifier,
            held: Vec::new(),
            carry: Vec::new(),
            budget,
            reasoning_tokens: 0,
            forced_close,
            forced: false,
            forced_kind: TokenKind::Reasoning,
        }
    }

    /// Takes one token's decoded text (`text_pending`: the detokenizer / stop strings still hold
    /// some of it back); returns the tokens ready to stream, in order.
    fn accept(&mut self, step: &TokenStep, top_logprobs: Vec<TopLogprob>, delta: &str, text_pending: bool) -> Vec<GeneratedToken> {
        let (mut kind, piece) = self.push(delta);
        if step.forced {
            kind = self.forced_kind;
        }
        let token = GeneratedToken { id: step.id, text: piece, logprob: step.logprob, kind, top_logprobs };
        if text_pending || self.classifier.has_pending() {
            self.held.push((token, step.forced));
            return Vec::new();
        }
        let kind = token.kind;
        let mut ready = self.settle(kind);
        ready.push(token);
        ready
    }

    /// The held tokens, those with no text of their own taking `kind`.
    fn settle(&mut self, kind: TokenKind) -> Vec<GeneratedToken> {
        self.held
            .drain(..)
            .map(|(mut h, settled)| {
                if h.text.is_empty() && !settled {
                    h.kind = kind;
                }
                h
            })
            .collect()
    }

    /// Inside the reasoning with its budget used up (and a way to close it).
    fn budget_spent(&self) -> bool {
        self.classifier.in_reasoning()
            && !self.forced
            && !self.forced_close.is_empty()
            && self.budget.is_some_and(|b| self.reasoning_tokens >= b)
    }

    /// Classifies a token's text: its kind and the text it carries.
    fn push(&mut self, delta: &str) -> (TokenKind, String) {
        let mut segs = std::mem::take(&mut self.carry);
        for s in self.classifier.push(delta) {
            match segs.last_mut() {
                Some(last) if last.kind == s.kind => last.text.push_str(&s.text),
                _ => segs.push(s),
            }
        }
        if segs.is_empty() {
            return (kind_of(self.classifier.current_kind()), String::new());
        }
        let first = segs.remove(0);
        self.carry = segs.into_iter().filter(|s| !s.text.is_empty()).collect();
        (kind_of(first.kind), first.text)
    }

    /// The rest of the output at its end (`tail`: what the detokenizer flushed): the held
    /// tokens, the last one carrying what was held back. A piece of a different kind than that
    /// token's (a token's text that spans two kinds, right at the end) is in the reply only.
    fn finish(&mut self, tail: &str) -> Vec<GeneratedToken> {
        let mut segs = std::mem::take(&mut self.carry);
        segs.extend(self.classifier.push(tail));
        segs.extend(self.classifier.finish());
        let mut rest: Vec<Segment> = Vec::new();
        for s in segs.into_iter().filter(|s| !s.text.is_empty()) {
            match rest.last_mut() {
                Some(last) if last.kind == s.kind => last.text.push_str(&s.text),
                _ => rest.push(s),
            }
        }
        let final_kind = rest.first().map_or(kind_of(self.classifier.current_kind()), |s| kind_of(s.kind));
        let mut held = self.settle(final_kind);
        if let (Some(last), Some(first)) = (held.last_mut(), rest.first()) {
            if kind_of(first.kind) == last.kind {
                last.text.push_str(&first.text);
            }
        }
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ReasoningFormat, ToolCallFormat};

    /// Streams `pieces` (one per token) through an OutputStream; returns the streamed tokens.
    fn stream(out: &mut OutputStream, pieces: &[&str]) -> Vec<GeneratedToken> {
        let mut got = Vec::new();
        for (i, p) in pieces.iter().enumerate() {
            got.extend(out.accept(&TokenStep { id: i as u32, logprob: -0.5, forced: false, top: vec![] }, vec![], p, false));
        }
        got.extend(out.finish(""));
        got
    }

    fn of(tokens: &[GeneratedToken], kind: TokenKind) -> String {
        tokens.iter().filter(|t| t.kind == kind).map(|t| t.text.as_str()).collect()
    }

    #[test]
    fn every_token_once_with_kinds_from_markers() {
        let c = OutputClassifier::new(Some(ReasoningFormat::Think), Some(ToolCallFormat::Hermes), false);
        let mut out = OutputStream::with_classifier(c, None, vec![]);
        let pieces = [
            "<", "think", ">", "\n", "Need", " weather", ".\n", "</", "think>", "\n\n", "Checking", ".", "\n\n",
            "<tool_call>", "\n{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Paris\"}}", "\n", "</tool_call>",
        ];
        let tokens = stream(&mut out, &pieces);
        assert_eq!(tokens.iter().map(|t| t.id).collect::<Vec<_>>(), (0..pieces.len() as u32).collect::<Vec<_>>());
        let kinds: Vec<TokenKind> = tokens.iter().map(|t| t.kind).collect();
        use TokenKind::*;
        assert_eq!(
            kinds,
            [
                Reasoning, Reasoning, Reasoning, Reasoning, Reasoning, Reasoning, Reasoning, Reasoning, Reasoning,
                Text, Text, Text, ToolCall, ToolCall, ToolCall, ToolCall, ToolCall, ToolCall
            ]
        );
        assert_eq!(of(&tokens, Text), "Checking.");
        assert_eq!(of(&tokens, Reasoning), "Need weather.");
        assert!(of(&tokens, ToolCall).starts_with("<tool_call>"));
        let reply = out.classifier.into_output(None);
        assert_eq!(reply.text, "Checking.");
        assert_eq!(reply.reasoning.as_deref(), Some("Need weather."));
        assert_eq!(reply.tool_calls[0].name, "get_weather");
    }

    #[test]
    fn text_spanning_two_kinds_rides_on_the_next_token() {
        let c = OutputClassifier::new(Some(ReasoningFormat::Think), None, true);
        let mut out = OutputStream::with_classifier(c, None, vec![]);
        let tokens = stream(&mut out, &["abc</think>Hel", "lo", " world"]);
        assert_eq!(tokens.len(), 3);
        assert_eq!((tokens[0].kind, tokens[0].text.as_str()), (TokenKind::Reasoning, "abc"));
        assert_eq!((tokens[1].kind, tokens[1].text.as_str()), (TokenKind::Text, "Hello"));
        assert_eq!((tokens[2].kind, tokens[2].text.as_str()), (TokenKind::Text, " world"));
    }

    #[test]
    fn held_text_joins_the_last_token_at_the_end() {
        let c = OutputClassifier::new(Some(ReasoningFormat::Think), None, false);
        let mut out = OutputStream::with_classifier(c, None, vec![]);
        let tokens = stream(&mut out, &["Answer", "\n", "<th"]);
        assert_eq!(tokens.len(), 3);
        assert!(tokens.iter().all(|t| t.kind == TokenKind::Text));
        assert_eq!(of(&tokens, TokenKind::Text), "Answer\n<th");
        assert_eq!(out.classifier.into_output(None).text, "Answer\n<th");
    }

    #[test]
    fn budget_counts_tokens_inside_reasoning() {
        let c = OutputClassifier::new(Some(ReasoningFormat::Think), None, false);
        let mut out = OutputStream::with_classifier(c, Some(2), vec![7, 8]);
        let step = |id| TokenStep { id, logprob: 0.0, forced: false, top: vec![] };
        out.accept(&step(0), vec![], "<think>", false);
        assert!(!out.budget_spent());
        out.accept(&step(1), vec![], "a", false);
        out.reasoning_tokens += 1;
        assert!(!out.budget_spent());
        out.accept(&step(2), vec![], "b", false);
        out.reasoning_tokens += 1;
        assert!(out.budget_spent());
        out.forced = true;
        assert!(!out.budget_spent());
        let t = out.accept(&TokenStep { id: 7, logprob: 0.0, forced: true, top: vec![] }, vec![], "</think>", false);
        assert!(t.iter().all(|t| t.kind == TokenKind::Reasoning));
        assert!(!out.classifier.in_reasoning());
    }
}
