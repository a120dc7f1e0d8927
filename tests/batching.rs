//! Continuous batching on a tiny checkpoint written by the test: requests in flight together
//! decode in one batch (`usage.batch_size`), and each one's reply equals the same request run
//! alone — greedy, seeded sampling, penalties, stop strings, prompt-cache reuse — whatever else
//! is in the batch, whenever it joins or leaves.
mod common;
use common::{edit_json, tiny_llama_dir, TinyLlama};
use mlex::{ChatMessage, FinishReason, GenerateOptions, GenerateReply, LoadOptions, Request, SamplingConfig, Session};

fn opts(max_tokens: usize, sampling: SamplingConfig) -> GenerateOptions {
    GenerateOptions { max_tokens, sampling, ignore_eos: true, ..Default::default() }
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| 1 + (i * 37 + salt * 11) % 250).collect()
}

/// Starts every request before reading any reply (they are in flight together), then collects.
fn together(s: &Session, reqs: &[(Vec<u32>, GenerateOptions)]) -> Vec<GenerateReply> {
    let streams: Vec<_> =
        reqs.iter().map(|(p, o)| s.stream(Request::Tokens(p.clone()), o.clone()).unwrap()).collect();
    streams.into_iter().map(|g| g.finish().unwrap()).collect()
}

fn alone(s: &Session, reqs: &[(Vec<u32>, GenerateOptions)]) -> Vec<GenerateReply> {
    reqs.iter().map(|(p, o)| s.generate_tokens(p, o.clone(), |_| true).unwrap()).collect()
}

#[test]
fn greedy_requests_in_flight_together_decode_in_one_batch_and_equal_each_alone() {
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    // Different prompt lengths (left padding), lengths that end at different steps (rows leave
    // while others go on). The first request runs long enough (120 steps of a few hundred
    // microseconds) for the other four to be sent while it decodes, even on a loaded machine.
    let reqs: Vec<_> = [(1, 120), (5, 9), (13, 30), (40, 17), (7, 1)]
        .iter()
        .enumerate()
        .map(|(i, &(len, max))| (prompt(len, i as u32), opts(max, SamplingConfig::default())))
        .collect();
    let batched = together(&s, &reqs);
    let solo = alone(&s, &reqs);
    for (i, (b, a)) in batched.iter().zip(&solo).enumerate() {
        assert_eq!(b.tokens, a.tokens, "request {i}");
        // On the CPU a batch row is computed exactly as the request alone; on a GPU the batch's
        // matmuls may be other kernels than one row's (another summation order).
        let tol = if s.info().device == "cpu" { 1e-4 } else { 5e-3 };
        for (x, y) in b.logprobs.iter().zip(&a.logprobs) {
            assert!((x - y).abs() < tol, "request {i}: logprob {x} vs {y}");
        }
        assert_eq!(b.finish_reason, FinishReason::Length);
        assert!(b.usage.batched);
    }
    assert_eq!(batched.iter().map(|r| r.usage.batch_size).max(), Some(reqs.len()), "all five decoded together");
    assert!(solo.iter().all(|r| r.usage.batch_size == 1));
}

#[test]
fn seeded_sampling_penalties_and_stop_strings_in_a_batch_equal_each_alone() {
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    let sampled = |t: f32, seed| SamplingConfig { temperature: t, seed: Some(seed), ..Default::default() };
    let mut with_stop = opts(40, SamplingConfig::default());
    let free = s.generate_tokens(&prompt(9, 4), with_stop.clone(), |_| true).unwrap();
    // A stop string from the middle of the free run's text.
    let stop: String = free.text.chars().skip(6).take(2).collect();
    with_stop.stop = vec![stop];
    let reqs = vec![
        (prompt(6, 1), opts(20, SamplingConfig::default())),
        (prompt(6, 1), opts(20, sampled(1.5, 7))),
        (prompt(11, 2), opts(20, SamplingConfig { top_p: 0.9, top_k: 20, ..sampled(0.8, 3) })),
        (prompt(3, 3), opts(20, SamplingConfig { repetition_penalty: 1.3, ..Default::default() })),
        (prompt(9, 4), with_stop),
    ];
    let batched = together(&s, &reqs);
    let solo = alone(&s, &reqs);
    for (i, (b, a)) in batched.iter().zip(&solo).enumerate() {
        assert_eq!(b.tokens, a.tokens, "request {i}");
        assert_eq!(b.text, a.text, "request {i}");
        assert_eq!(b.finish_reason, a.finish_reason, "request {i}");
    }
    assert_eq!(batched[4].finish_reason, FinishReason::Stop);
    assert!(batched.iter().map(|r| r.usage.batch_size).max().unwrap() > 1);
}

#[test]
fn max_batch_bounds_the_batch_and_the_rest_wait() {
    let dir = tiny_llama_dir();
    let s = Session::load_with_options(dir.path(), LoadOptions { max_batch: Some(2), ..Default::default() }).unwrap();
    let reqs: Vec<_> = (0..5).map(|i| (prompt(3 + i, i as u32), opts(12, SamplingConfig::default()))).collect();
    let batched = together(&s, &reqs);
    let solo = alone(&s, &reqs);
    for (b, a) in batched.iter().zip(&solo) {
        assert_eq!(b.tokens, a.tokens);
        assert!(b.usage.batch_size <= 2, "batch of {}", b.usage.batch_size);
    }
    assert!(batched.iter().any(|r| r.usage.batch_size == 2));
    assert!(batched[4].usage.queue_ms > 0.0);
    let err = LoadOptions::from_json(&serde_json::json!({"maxBatch": 0}), mlex::generate::Naming::Camel).unwrap_err();
    assert!(err.contains("maxBatch"), "{err}");
}

#[test]
fn chat_turns_in_a_batch_reuse_the_prompt_cache_and_equal_cold_runs() {
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    let o = GenerateOptions { max_tokens: 8, ignore_eos: true, ..Default::default() };
    let users = ["Tell me about tea.", "And coffee?", "What is a wok?"];
    let first: Vec<Vec<ChatMessage>> = users.iter().map(|u| vec![ChatMessage::user(*u)]).collect();
    let chat = |msgs: &Vec<ChatMessage>| Request::Chat { messages: msgs.clone(), tools: None };
    let streams: Vec<_> = first.iter().map(|m| s.stream(chat(m), o.clone()).unwrap()).collect();
    let replies: Vec<_> = streams.into_iter().map(|g| g.finish().unwrap()).collect();
    let second: Vec<Vec<ChatMessage>> = first
        .iter()
        .zip(&replies)
        .map(|(m, r)| {
            let mut m = m.clone();
            m.push(ChatMessage::assistant(&r.text));
            m.push(ChatMessage::user("Go on."));
            m
        })
        .collect();
    let streams: Vec<_> = second.iter().map(|m| s.stream(chat(m), o.clone()).unwrap()).collect();
    let warm: Vec<_> = streams.into_iter().map(|g| g.finish().unwrap()).collect();
    let cold_opts = GenerateOptions { prompt_cache: Some(false), ..o.clone() };
    for (m, w) in second.iter().zip(&warm) {
        assert!(w.usage.cached_tokens > 0, "turn 2 resumes from turn 1");
        let cold = s.stream(chat(m), cold_opts.clone()).unwrap().finish().unwrap();
        assert_eq!(cold.usage.cached_tokens, 0);
        assert_eq!(w.tokens, cold.tokens);
    }
}

#[test]
fn a_model_whose_caches_cannot_batch_runs_requests_one_at_a_time_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    TinyLlama::default().write(dir.path());
    // Dynamic NTK rope: its frequencies depend on each sequence's length.
    edit_json(&dir.path().join("config.json"), |c| {
        c["rope_scaling"] = serde_json::json!({"rope_type": "dynamic", "factor": 2.0});
    });
    let s = Session::load(dir.path()).unwrap();
    let reqs: Vec<_> = (0..3).map(|i| (prompt(4 + i, i as u32), opts(6, SamplingConfig::default()))).collect();
    let batched = together(&s, &reqs);
    let solo = alone(&s, &reqs);
    for (b, a) in batched.iter().zip(&solo) {
        assert_eq!(b.tokens, a.tokens);
        assert!(!b.usage.batched);
        assert_eq!(b.usage.batch_size, 1);
    }
}

/// A request aborted in the middle of a batch leaves early; the others go on unharmed.
#[test]
fn an_abort_leaves_the_batch_at_once() {
    // A long context and a long doomed request: the engine may run ahead of this thread by many
    // steps on a loaded machine (tokens queue in the stream), so max_tokens is far away: the
    // abort, not the length, must end it (30 tokens flaked here under load).
    let dir = tempfile::tempdir().unwrap();
    TinyLlama { max_position_embeddings: 4096, ..Default::default() }.write(dir.path());
    let s = Session::load(dir.path()).unwrap();
    let doomed_max = 3000;
    let reqs: Vec<_> = (0..3)
        .map(|i| (prompt(5 + i, i as u32), opts(if i == 1 { doomed_max } else { 30 }, SamplingConfig::default())))
        .collect();
    let mut streams: Vec<_> =
        reqs.iter().map(|(p, o)| s.stream(Request::Tokens(p.clone()), o.clone()).unwrap()).collect();
    let mut doomed = streams.remove(1);
    let mut seen = 0;
    while doomed.next().is_some() {
        seen += 1;
        if seen == 3 {
            doomed.abort();
        }
    }
    let r = doomed.finish().unwrap();
    assert_eq!(r.finish_reason, FinishReason::Abort);
    assert!(r.tokens.len() < doomed_max / 2, "left early: {} of {doomed_max} tokens", r.tokens.len());
    let rest: Vec<_> = streams.into_iter().map(|g| g.finish().unwrap()).collect();
    let solo = alone(&s, &[reqs[0].clone(), reqs[2].clone()]);
    assert_eq!(rest[0].tokens, solo[0].tokens);
    assert_eq!(rest[1].tokens, solo[1].tokens);
}

/// The cache budget: requests in flight set aside their prompt and `max_tokens` of cache; one
/// that does not fit beside the others waits, one that can never fit is refused with
/// `OUT_OF_MEMORY` before it starts, and the others are unharmed.
#[test]
fn the_cache_budget_makes_requests_wait_or_refuses_one_that_never_fits() {
    let dir = tiny_llama_dir();
    // The tiny llama in float32: 2 layers × (keys + values) × 2 heads × 8 dims × 4 bytes a token.
    let per_token = 2 * 2 * 2 * 8 * 4;
    let budget = 60 * per_token;
    let s = Session::load_with_options(
        dir.path(),
        LoadOptions { kv_budget_bytes: Some(budget), dtype: Some(mlex::Dtype::Float32), ..Default::default() },
    )
    .unwrap();
    // 10 + 20 tokens each: two fit together, a third waits.
    let reqs: Vec<_> = (0..4).map(|i| (prompt(10, i as u32), opts(20, SamplingConfig::default()))).collect();
    let mut streams: Vec<_> =
        reqs.iter().map(|(p, o)| s.stream(Request::Tokens(p.clone()), o.clone()).unwrap()).collect();
    let too_big = s.stream(Request::Tokens(prompt(10, 9)), opts(60, SamplingConfig::default())).unwrap();
    let e = too_big.finish().unwrap_err();
    assert_eq!(e.code(), "OUT_OF_MEMORY", "{e}");
    assert!(e.to_string().contains("kv_budget_bytes"), "{e}");
    let replies: Vec<_> = streams.drain(..).map(|g| g.finish().unwrap()).collect();
    let solo = alone(&s, &reqs);
    for (b, a) in replies.iter().zip(&solo) {
        assert_eq!(b.tokens, a.tokens);
        assert!(b.usage.batch_size <= 2, "batch of {}", b.usage.batch_size);
    }
    assert!(replies.iter().any(|r| r.usage.batch_size == 2));
}
