//! Generation behaviour on a tiny checkpoint written by the test itself: sampling options,
//! seeds, stop strings, limits, aborts, concurrency, streamed text.
mod common;
use common::tiny_llama_dir;
use mlex::{ChatMessage, FinishReason, GenerateOptions, SamplingConfig, Session};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn opts(max_tokens: usize, sampling: SamplingConfig) -> GenerateOptions {
    GenerateOptions { max_tokens, sampling, ignore_eos: true, ..Default::default() }
}

fn sampled(temperature: f32, seed: u64) -> SamplingConfig {
    SamplingConfig { temperature, seed: Some(seed), ..Default::default() }
}

const PROMPT: &[u32] = &[3, 17, 42, 7, 99, 5];

#[test]
fn same_seed_same_tokens_other_seed_other_tokens() {
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    let a = s.generate_tokens(PROMPT, opts(24, sampled(1.5, 7)), |_| true).unwrap();
    let b = s.generate_tokens(PROMPT, opts(24, sampled(1.5, 7)), |_| true).unwrap();
    let c = s.generate_tokens(PROMPT, opts(24, sampled(1.5, 8)), |_| true).unwrap();
    assert_eq!(a.tokens, b.tokens);
    assert_ne!(a.tokens, c.tokens, "a different seed should sample differently at temperature 1.5");
}

#[test]
fn top_k_1_and_tiny_top_p_and_min_p_1_are_greedy() {
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    let greedy = s.generate_tokens(PROMPT, opts(16, SamplingConfig::default()), |_| true).unwrap();
    for cfg in [
        SamplingConfig { top_k: 1, ..sampled(2.0, 1) },
        SamplingConfig { top_p: 1e-6, ..sampled(2.0, 2) },
        SamplingConfig { min_p: 1.0, ..sampled(2.0, 3) },
    ] {
        let r = s.generate_tokens(PROMPT, opts(16, cfg.clone()), |_| true).unwrap();
        assert_eq!(r.tokens, greedy.tokens, "{cfg:?}");
    }
}

#[test]
fn repetition_penalty_changes_a_repetitive_greedy_run() {
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    let plain = s.generate_tokens(PROMPT, opts(32, SamplingConfig::default()), |_| true).unwrap();
    let pen = SamplingConfig { repetition_penalty: 5.0, ..Default::default() };
    let r = s.generate_tokens(PROMPT, opts(32, pen), |_| true).unwrap();
    let distinct = |t: &[u32]| t.iter().collect::<std::collections::HashSet<_>>().len();
    assert!(distinct(&r.tokens) >= distinct(&plain.tokens), "{:?} vs {:?}", r.tokens, plain.tokens);
    assert_ne!(r.tokens, plain.tokens);
}

#[test]
fn max_tokens_gives_length_and_logprobs_are_valid() {
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    let r = s.generate_tokens(PROMPT, opts(5, SamplingConfig::default()), |_| true).unwrap();
    assert_eq!(r.tokens.len(), 5);
    assert_eq!(r.logprobs.len(), 5);
    assert_eq!(r.finish_reason, FinishReason::Length);
    assert!(r.logprobs.iter().all(|l| l.is_finite() && *l <= 0.0));
    assert_eq!(r.usage.prompt_tokens, PROMPT.len());
    assert_eq!(r.usage.completion_tokens, 5);
    assert!(r.usage.ttft_ms > 0.0 && r.usage.peak_memory_bytes > 0);
    // Four decode steps were built and scheduled after the first token.
    assert!(r.usage.schedule_ms_per_step > 0.0, "{:?}", r.usage);
}

#[test]
fn callback_false_and_abort_flag_stop_with_abort() {
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    let mut seen = 0;
    let r = s
        .generate_tokens(PROMPT, opts(50, SamplingConfig::default()), |_| {
            seen += 1;
            seen < 3
        })
        .unwrap();
    assert_eq!(r.finish_reason, FinishReason::Abort);
    assert!(r.tokens.len() >= 3 && r.tokens.len() < 50, "{}", r.tokens.len());
    let flag = Arc::new(AtomicBool::new(true));
    let e = s.generate_tokens_with_abort(PROMPT, opts(50, SamplingConfig::default()), flag.clone(), |_| true).unwrap_err();
    assert_eq!(e.code(), "ABORTED");
    flag.store(false, Ordering::Relaxed);
}

/// A request's first token goes out before its next step is built (that step's host time is not
/// in the time to the first token): a request that ends at its first token (end of sequence)
/// leaves no decode step built, with a model whose caches batch and with one whose caches cannot.
#[test]
fn the_first_token_is_handed_over_before_the_next_step_is_built() {
    for dynamic_rope in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        common::TinyLlama::default().write(dir.path());
        if dynamic_rope {
            // Dynamic NTK rope: its frequencies depend on each sequence's length, so it never batches.
            common::edit_json(&dir.path().join("config.json"), |c| {
                c["rope_scaling"] = serde_json::json!({"rope_type": "dynamic", "factor": 2.0});
            });
        }
        let whole = Session::load(dir.path()).unwrap().generate_tokens(PROMPT, opts(8, SamplingConfig::default()), |_| true).unwrap();
        assert!(whole.usage.schedule_ms_per_step > 0.0, "{:?}", whole.usage);
        // The greedy first token made the end of sequence: the request ends there.
        let first = whole.tokens[0];
        common::edit_json(&dir.path().join("config.json"), |c| c["eos_token_id"] = first.into());
        let s = Session::load(dir.path()).unwrap();
        let o = GenerateOptions { ignore_eos: false, ..opts(50, SamplingConfig::default()) };
        let r = s.generate_tokens(PROMPT, o, |_| true).unwrap();
        // (the end-of-sequence token is not part of the reply)
        assert_eq!((r.tokens.len(), r.finish_reason), (0, FinishReason::Stop), "dynamic rope: {dynamic_rope}");
        assert_eq!(r.usage.schedule_ms_per_step, 0.0, "no decode step was built: {:?}", r.usage);
        assert_eq!(r.usage.batched, !dynamic_rope);
    }
}

#[test]
fn concurrent_calls_equal_sequential_ones() {
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| vec![1 + i, 20 + i, 40 + i]).collect();
    let seq: Vec<Vec<u32>> =
        prompts.iter().map(|p| s.generate_tokens(p, opts(12, SamplingConfig::default()), |_| true).unwrap().tokens).collect();
    let handles: Vec<_> = prompts
        .iter()
        .cloned()
        .map(|p| {
            let s = s.clone();
            std::thread::spawn(move || s.generate_tokens(&p, opts(12, SamplingConfig::default()), |_| true).unwrap().tokens)
        })
        .collect();
    let par: Vec<Vec<u32>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(seq, par);
}

#[test]
fn streamed_text_equals_reply_text_and_stop_strings_end_it() {
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    let mut streamed = String::new();
    let mut ids = vec![];
    let msgs = [ChatMessage::user("hello there")];
    let r = s
        .generate_cached(&msgs, None, opts(24, SamplingConfig::default()), |t| {
            streamed.push_str(&t.text);
            ids.push(t.id);
            true
        })
        .unwrap();
    assert_eq!(streamed, r.text);
    assert_eq!(ids, r.tokens, "every token is streamed exactly once, in order");
    assert!(!r.text.is_empty(), "the tiny model should produce some text");
    // Stop at a piece of the greedy text: the reply is what came before it.
    let chars: Vec<char> = r.text.chars().collect();
    assert!(chars.len() >= 6, "need a longer greedy text to pick a stop string from: {:?}", r.text);
    {
        let stop: String = chars[3..5].iter().collect();
        let cut = r.text.find(&stop).unwrap();
        let o = GenerateOptions { stop: vec![stop.clone()], ..opts(24, SamplingConfig::default()) };
        let mut streamed = String::new();
        let r2 = s
            .generate_cached(&msgs, None, o, |t| {
                streamed.push_str(&t.text);
                true
            })
            .unwrap();
        assert_eq!(r2.text, r.text[..cut], "stop {stop:?}");
        assert_eq!(streamed, r2.text);
        assert_eq!(r2.finish_reason, FinishReason::Stop);
    }
}

#[test]
fn invalid_sampling_values_are_clean_errors() {
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    for cfg in [
        SamplingConfig { temperature: -1.0, ..Default::default() },
        SamplingConfig { top_p: 0.0, ..Default::default() },
        SamplingConfig { min_p: 2.0, ..Default::default() },
        SamplingConfig { repetition_penalty: f32::NAN, ..Default::default() },
    ] {
        let e = s.generate_tokens(PROMPT, opts(4, cfg), |_| true).unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGUMENT", "{e}");
    }
}

/// `Session::stream`: the tokens it yields are the reply's, in order (the blocking calls are
/// built on it); a `Generation` dropped half-way stops, and the session goes on serving; a
/// custom `Sink` gets every token then `Done` from the engine thread.
#[test]
fn stream_yields_the_reply_tokens_and_a_dropped_stream_stops() {
    use mlex::{Event, Request, Sink};
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    let want = s.generate_tokens(PROMPT, opts(10, SamplingConfig::default()), |_| true).unwrap();
    let mut g = s.stream(Request::Tokens(PROMPT.to_vec()), opts(10, SamplingConfig::default())).unwrap();
    let streamed: Vec<u32> = g.by_ref().map(|t| t.id).collect();
    let reply = g.finish().unwrap();
    assert_eq!((streamed, reply.tokens.clone()), (want.tokens.clone(), want.tokens.clone()));

    let mut g = s.stream(Request::Tokens(PROMPT.to_vec()), opts(100_000, SamplingConfig::default())).unwrap();
    assert!(g.next().is_some());
    drop(g); // aborts: the next call is served without waiting for 100k tokens
    let again = s.generate_tokens(PROMPT, opts(10, SamplingConfig::default()), |_| true).unwrap();
    assert_eq!(again.tokens, want.tokens);

    let (tx, rx) = std::sync::mpsc::channel();
    let sink = Sink::new(move |e| {
        let what = match e {
            Event::Token(t) => Ok(t.id),
            Event::Done(r) => Err(r.map(|r| r.tokens)),
        };
        tx.send(what).is_ok()
    });
    s.start(Request::Tokens(PROMPT.to_vec()), opts(10, SamplingConfig::default()), Arc::new(AtomicBool::new(false)), sink)
        .unwrap();
    let events: Vec<_> = rx.iter().collect();
    let ids: Vec<u32> = events.iter().filter_map(|e| e.as_ref().ok().copied()).collect();
    assert_eq!(ids, want.tokens);
    assert!(matches!(events.last(), Some(Err(Ok(t))) if *t == want.tokens));

    // A sink that panics (on a token, or on the reply) only ends its own request.
    for panic_on_done in [false, true] {
        let sink = Sink::new(move |e| match e {
            Event::Token(_) if !panic_on_done => panic!("a sink that fails"),
            Event::Done(_) if panic_on_done => panic!("a sink that fails at the end"),
            _ => true,
        });
        s.start(Request::Tokens(PROMPT.to_vec()), opts(10, SamplingConfig::default()), Arc::new(AtomicBool::new(false)), sink)
            .unwrap();
    }
    let after = s.generate_tokens(PROMPT, opts(10, SamplingConfig::default()), |_| true).unwrap();
    assert_eq!(after.tokens, want.tokens);

    // Bad arguments are refused before anything is queued.
    let e = s.stream(Request::Tokens(vec![]), opts(4, SamplingConfig::default())).err().unwrap();
    assert_eq!(e.code(), "INVALID_ARGUMENT");
    let e = s.stream(Request::Chat { messages: vec![], tools: None }, opts(4, SamplingConfig::default())).err().unwrap();
    assert_eq!(e.code(), "INVALID_ARGUMENT");
}

/// The op census of a decode step is taken on the engine thread, like every use of the model.
#[test]
fn decode_step_census_runs_on_the_engine() {
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    let census = s.decode_step_census().unwrap();
    let total: usize = census.iter().map(|(_, n)| n).sum();
    assert!(total > 10 && census.windows(2).all(|w| w[0].1 >= w[1].1), "{census:?}");
    // And the session still generates afterwards.
    assert_eq!(s.generate_tokens(PROMPT, opts(3, SamplingConfig::default()), |_| true).unwrap().tokens.len(), 3);
}

/// 64 requests at once on one session, from 64 threads: random prompts and lengths, some aborted
/// part-way (by callback or flag), some invalid. Every one settles as it should: invalid ones are
/// refused before queueing, aborted ones end with `abort`, the rest equal the same request run
/// alone; `queue_ms` shows the waiting; the session serves normally afterwards.
#[test]
fn sixty_four_concurrent_requests_with_aborts_and_invalid_ones_all_settle() {
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    enum Kind {
        Plain,
        AbortByCallback(usize),
        AbortByFlag,
        Invalid,
    }
    let mut reqs = vec![];
    for i in 0..64 {
        let prompt: Vec<u32> = (0..1 + next(20)).map(|_| 1 + next(90) as u32).collect();
        let max_tokens = 1 + next(24) as usize;
        let kind = match i % 8 {
            3 => Kind::AbortByCallback(1 + next(3) as usize),
            5 => Kind::AbortByFlag,
            7 => Kind::Invalid,
            _ => Kind::Plain,
        };
        reqs.push((prompt, max_tokens, kind));
    }
    let handles: Vec<_> = reqs
        .iter()
        .enumerate()
        .map(|(i, (prompt, max_tokens, kind))| {
            let s = s.clone();
            let (prompt, max_tokens) = (prompt.clone(), *max_tokens);
            let (abort_after, flag_abort, invalid) = match kind {
                Kind::AbortByCallback(n) => (Some(*n), false, false),
                Kind::AbortByFlag => (None, true, false),
                Kind::Invalid => (None, false, true),
                Kind::Plain => (None, false, false),
            };
            std::thread::spawn(move || {
                let mut o = opts(max_tokens, SamplingConfig::default());
                let prompt = if invalid {
                    match i % 3 {
                        0 => vec![],
                        1 => {
                            o.sampling.top_p = 0.0;
                            prompt
                        }
                        _ => {
                            o.max_tokens = usize::MAX;
                            prompt
                        }
                    }
                } else {
                    prompt
                };
                if flag_abort || abort_after.is_some() {
                    o.max_tokens = 100_000; // they end by being aborted, not by length
                }
                let flag = Arc::new(AtomicBool::new(false));
                let setter = flag.clone();
                let mut seen = 0;
                s.generate_tokens_with_abort(&prompt, o, flag, |_| {
                    seen += 1;
                    if flag_abort && seen == 2 {
                        setter.store(true, Ordering::Relaxed);
                    }
                    abort_after.map_or(true, |n| seen < n)
                })
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let mut waited = 0.0f64;
    for ((prompt, max_tokens, kind), r) in reqs.iter().zip(results) {
        match kind {
            Kind::Invalid => assert_eq!(r.unwrap_err().code(), "INVALID_ARGUMENT"),
            Kind::AbortByCallback(_) | Kind::AbortByFlag => {
                let r = r.unwrap();
                assert_eq!(r.finish_reason, FinishReason::Abort, "{prompt:?}");
                waited = waited.max(r.usage.queue_ms);
            }
            Kind::Plain => {
                let r = r.unwrap();
                let alone = s.generate_tokens(prompt, opts(*max_tokens, SamplingConfig::default()), |_| true).unwrap();
                assert_eq!(r.tokens, alone.tokens, "{prompt:?}");
                assert_eq!(r.finish_reason, FinishReason::Length);
                waited = waited.max(r.usage.queue_ms);
            }
        }
    }
    assert!(waited > 0.0, "somebody queued behind somebody");
    assert_eq!(s.generate_tokens(PROMPT, opts(4, SamplingConfig::default()), |_| true).unwrap().tokens.len(), 4);
}
