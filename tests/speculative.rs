//! Speculative decoding on tiny checkpoints written by the test: greedy replies equal plain
//! decoding (tokens, logprobs within 1e-4 on the CPU in float32) with prompt lookup and with a
//! draft model (the session's or the request's); stop strings, max_tokens and streaming behave
//! as in plain decoding; sampled replies repeat with a seed and keep the model's distribution;
//! a draft model of another vocabulary is INVALID_ARGUMENT. Greedy prompt lookup runs pipelined
//! (each pass built on a guess before the last is read): its guesses both hold and fail here.
mod common;
use common::{edit_json, TinyLlama};
use mlex::{Error, GenerateOptions, GenerateReply, LoadOptions, SamplingConfig, Session};
use mlex::generate::speculative::PromptLookup;

fn load(dir: &std::path::Path, draft: Option<&std::path::Path>) -> Session {
    let o = LoadOptions {
        dtype: Some(mlex::Dtype::Float32),
        draft_model: draft.map(|d| d.to_string_lossy().into_owned()),
        ..Default::default()
    };
    Session::load_with_options(dir, o).unwrap()
}

fn model(seed: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    TinyLlama { seed, ..Default::default() }.write(dir.path());
    dir
}

/// A prompt that repeats itself (prompt lookup finds drafts in it).
fn prompt() -> Vec<u32> {
    let line: Vec<u32> = b"fn add(a: i32, b: i32) -> i32 { a + b }\n".iter().map(|&b| b as u32).collect();
    line.iter().chain(&line).chain(&line[..12]).copied().collect()
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions { max_tokens, ignore_eos: true, top_logprobs: Some(2), ..Default::default() }
}

fn lookup() -> Option<PromptLookup> {
    Some(PromptLookup { max_ngram: 3, num_draft_tokens: Some(4) })
}

fn run(s: &Session, o: GenerateOptions) -> (GenerateReply, Vec<u32>) {
    let mut streamed = vec![];
    let r = s
        .generate_tokens(&prompt(), o, |t| {
            streamed.push(t.id);
            true
        })
        .unwrap();
    (r, streamed)
}

fn assert_same(plain: &GenerateReply, spec: &GenerateReply, what: &str) {
    assert_eq!(spec.tokens, plain.tokens, "{what}: tokens");
    assert_eq!(spec.text, plain.text, "{what}: text");
    assert_eq!(spec.finish_reason, plain.finish_reason, "{what}: finish");
    for (i, (a, b)) in plain.logprobs.iter().zip(&spec.logprobs).enumerate() {
        assert!((a - b).abs() < 1e-4, "{what}: logprob {i}: {a} vs {b}");
    }
    let ids = |r: &GenerateReply| r.top_logprobs.iter().map(|t| t.iter().map(|x| x.id).collect::<Vec<_>>()).collect::<Vec<_>>();
    assert_eq!(ids(spec), ids(plain), "{what}: top logprobs");
}

#[test]
fn greedy_speculation_equals_plain_decoding() {
    let target = model(0x6d6c_6578);
    let other = model(99);
    let s = load(target.path(), None);
    let (plain, _) = run(&s, greedy(40));
    assert_eq!(plain.usage.draft_tokens, 0);
    assert!(plain.usage.batched);

    let (pl, streamed) = run(&s, GenerateOptions { prompt_lookup: lookup(), ..greedy(40) });
    assert_same(&plain, &pl, "prompt lookup");
    assert_eq!(streamed, pl.tokens);
    let u = &pl.usage;
    assert!(u.draft_tokens > 0 && !u.batched, "{u:?}");
    assert!(u.tokens_per_step >= 1.0 && (u.acceptance_rate - u.accepted_draft_tokens as f64 / u.draft_tokens as f64).abs() < 1e-9);
    // Greedy lookup is pipelined: some passes were built on a guess that held, some dropped.
    let passes = (u.completion_tokens as f64 / u.tokens_per_step).round() as usize;
    assert!(u.dropped_passes > 0 && u.dropped_passes + 1 < passes, "{u:?}");

    // A draft model of other weights, named by the request.
    let draft = GenerateOptions { draft_model: Some(other.path().to_string_lossy().into()), num_draft_tokens: Some(3), ..greedy(40) };
    let (dm, streamed) = run(&s, draft);
    assert_same(&plain, &dm, "draft model");
    assert_eq!(streamed, dm.tokens);
    assert!(dm.usage.draft_tokens > 0);

    // The model as its own draft: every draft is accepted.
    let same = GenerateOptions { draft_model: Some(target.path().to_string_lossy().into()), ..greedy(40) };
    let (own, _) = run(&s, same);
    assert_same(&plain, &own, "own draft");
    assert!(own.usage.acceptance_rate > 0.9 && own.usage.tokens_per_step > 3.0, "{:?}", own.usage);

    // The session's draft model: every request speculates unless it drafts 0 tokens.
    let s2 = load(target.path(), Some(other.path()));
    let (sd, _) = run(&s2, greedy(40));
    assert_same(&plain, &sd, "session draft");
    assert!(sd.usage.draft_tokens > 0 && !sd.usage.batched);
    let (off, _) = run(&s2, GenerateOptions { num_draft_tokens: Some(0), ..greedy(40) });
    assert_same(&plain, &off, "drafting off");
    assert!(off.usage.draft_tokens == 0 && off.usage.batched);
}

#[test]
fn a_speculative_reply_leaves_its_state_in_the_prompt_cache() {
    let target = model(0x6d6c_6578);
    let s = load(target.path(), None);
    let spec = |max| GenerateOptions { prompt_lookup: lookup(), ..greedy(max) };
    let first = s.generate_tokens(&prompt(), spec(20), |_| true).unwrap();
    // The next turn: the first prompt, its reply and more.
    let mut next = prompt();
    next.extend(&first.tokens);
    next.extend(b" again".iter().map(|&b| b as u32));
    let warm = s.generate_tokens(&next, spec(12), |_| true).unwrap();
    assert!(warm.usage.cached_tokens >= prompt().len() + first.tokens.len() - 1, "{:?}", warm.usage);
    let cold = s.generate_tokens(&next, GenerateOptions { prompt_cache: Some(false), ..greedy(12) }, |_| true).unwrap();
    assert_same(&cold, &warm, "resumed from the cache");
}

#[test]
fn stops_and_limits_behave_as_in_plain_decoding() {
    let target = model(0x6d6c_6578);
    let other = model(99);
    let s = load(target.path(), None);
    let drafters = [
        GenerateOptions { prompt_lookup: lookup(), ..Default::default() },
        GenerateOptions { draft_model: Some(other.path().to_string_lossy().into()), ..Default::default() },
        GenerateOptions { draft_model: Some(target.path().to_string_lossy().into()), num_draft_tokens: Some(5), ..Default::default() },
    ];
    let (whole, _) = run(&s, greedy(30));
    // A stop string from the middle of the reply (no token past it), each max_tokens.
    let stop = whole.text.chars().skip(9).take(3).collect::<String>();
    for d in &drafters {
        for max in [1, 2, 3, 5, 8, 13] {
            let o = GenerateOptions { draft_model: d.draft_model.clone(), prompt_lookup: d.prompt_lookup, num_draft_tokens: d.num_draft_tokens, ..greedy(max) };
            let (plain, _) = run(&s, greedy(max));
            let (spec, streamed) = run(&s, o);
            assert_eq!(spec.tokens.len(), max);
            assert_same(&plain, &spec, &format!("max_tokens {max}"));
            assert_eq!(streamed, spec.tokens);
        }
        let with_stop = |o: GenerateOptions| GenerateOptions { stop: vec![stop.clone()], ignore_eos: false, ..o };
        let (plain, _) = run(&s, with_stop(greedy(30)));
        let o = GenerateOptions { draft_model: d.draft_model.clone(), prompt_lookup: d.prompt_lookup, num_draft_tokens: d.num_draft_tokens, ..greedy(30) };
        let (spec, streamed) = run(&s, with_stop(o));
        assert_eq!(plain.finish_reason, mlex::FinishReason::Stop, "{stop:?} in {:?}", whole.text);
        assert_same(&plain, &spec, "stop string");
        assert_eq!(streamed, spec.tokens);
        // The callback stopping the reply: not one token more.
        let mut seen = 0;
        let o = GenerateOptions { draft_model: d.draft_model.clone(), prompt_lookup: d.prompt_lookup, ..greedy(30) };
        let r = s
            .generate_tokens(&prompt(), o, |_| {
                seen += 1;
                seen < 4
            })
            .unwrap();
        assert_eq!((seen, r.finish_reason), (4, mlex::FinishReason::Abort));
        assert_eq!(r.tokens[..], whole.tokens[..r.tokens.len()]);
    }
}

#[test]
fn sampling_repeats_with_a_seed_and_keeps_the_models_distribution() {
    let target = model(0x6d6c_6578);
    let other = model(99);
    let s = load(target.path(), None);
    let sampled = |seed: u64, spec: u8| {
        let sampling = SamplingConfig { temperature: 1.0, top_k: 4, seed: Some(seed), ..Default::default() };
        let o = GenerateOptions { max_tokens: 2, ignore_eos: true, sampling, ..Default::default() };
        let o = match spec {
            0 => o,
            1 => GenerateOptions { prompt_lookup: lookup(), ..o },
            _ => GenerateOptions { draft_model: Some(other.path().to_string_lossy().into()), ..o },
        };
        s.generate_tokens(&prompt(), o, |_| true).unwrap()
    };
    for spec in [1, 2] {
        let (a, b) = (sampled(5, spec), sampled(5, spec));
        assert_eq!(a.tokens, b.tokens, "seeded replies repeat");
        assert!(a.usage.draft_tokens > 0);
    }
    // The distribution of the first token, which the first pass drafts and verifies (prompt
    // lookup finds a draft in the repeated prompt; the draft model always drafts), over many
    // seeds: the same as plain sampling's, within sampling noise (total variation; about 0.03
    // at this count). Accepting every draft, or resampling from p instead of the residual,
    // moves it far more.
    let n = 1000;
    let hist = |spec: u8| {
        let mut h = std::collections::HashMap::<u32, f64>::new();
        for seed in 0..n {
            *h.entry(sampled(1000 + seed, spec).tokens[0]).or_default() += 1.0 / n as f64;
        }
        h
    };
    let plain = hist(0);
    for spec in [1, 2] {
        let h = hist(spec);
        let keys: std::collections::HashSet<u32> = plain.keys().chain(h.keys()).copied().collect();
        let tv: f64 = keys.iter().map(|k| (plain.get(k).unwrap_or(&0.0) - h.get(k).unwrap_or(&0.0)).abs()).sum::<f64>() / 2.0;
        assert!(tv < 0.07, "drafter {spec}: total variation {tv} ({plain:?} vs {h:?})");
    }
}

#[test]
fn a_draft_model_of_another_vocabulary_is_invalid_argument() {
    let target = model(0x6d6c_6578);
    let s = load(target.path(), None);
    let renamed = model(7);
    edit_json(&renamed.path().join("tokenizer.json"), |v| {
        let vocab = v["model"]["vocab"].as_object_mut().unwrap();
        let (k, id) = vocab.iter().find(|(_, id)| id.as_u64() == Some(65)).map(|(k, v)| (k.clone(), v.clone())).unwrap();
        vocab.remove(&k);
        vocab.insert("Z!".into(), id);
    });
    let bigger = tempfile::tempdir().unwrap();
    TinyLlama { vocab: 300, ..Default::default() }.write(bigger.path());
    for bad in [&renamed, &bigger] {
        let o = GenerateOptions { draft_model: Some(bad.path().to_string_lossy().into()), max_tokens: 2, ..Default::default() };
        match s.generate_tokens(&prompt(), o, |_| true) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("draft model"), "{m}"),
            other => panic!("accepted a draft of another vocabulary: {:?}", other.map(|r| r.tokens)),
        }
        let o = LoadOptions { draft_model: Some(bad.path().to_string_lossy().into()), ..Default::default() };
        assert!(matches!(Session::load_with_options(target.path(), o), Err(Error::InvalidArgument(_))));
    }
    // The session still serves.
    assert_eq!(s.generate_tokens(&prompt(), greedy(2), |_| true).unwrap().tokens.len(), 2);
}

#[test]
fn speculative_options_are_read_and_checked() {
    use mlex::generate::Naming;
    use serde_json::json;
    let o = GenerateOptions::from_json(&json!({"promptLookup": true, "numDraftTokens": 5}), Naming::Camel).unwrap();
    assert_eq!((o.prompt_lookup, o.num_draft_tokens), (Some(PromptLookup::default()), Some(5)));
    let o = GenerateOptions::from_json(&json!({"prompt_lookup": {"max_ngram": 2, "num_draft_tokens": 6}}), Naming::Snake).unwrap();
    assert_eq!(o.prompt_lookup, Some(PromptLookup { max_ngram: 2, num_draft_tokens: Some(6) }));
    assert_eq!(GenerateOptions::from_json(&json!({"promptLookup": false}), Naming::Camel).unwrap().prompt_lookup, None);
    let err = |v| GenerateOptions::from_json(&v, Naming::Camel).unwrap_err();
    assert!(err(json!({"promptLookup": {"maxNgram": 0}})).starts_with("promptLookup.maxNgram must be in [1, 16]"));
    assert!(err(json!({"promptLookup": {"n": 2}})).contains("unknown option"));
    assert!(err(json!({"promptLookup": 3})).starts_with("promptLookup must be true, false or an object"));
    assert!(err(json!({"numDraftTokens": 65})).starts_with("numDraftTokens must be in [0, 64]"));
}
