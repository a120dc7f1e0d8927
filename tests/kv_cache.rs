//! The KV cache options (`max_kv_size`, `kv_bits`, `kv_group_size`, `quantized_kv_start`) and the
//! context-length limit, on tiny checkpoints written by the test. Token-for-token agreement with
//! mlx-lm's caches is the conformance suite's (`conformance_kv_cache`); here: what the options
//! change and do not change, how such requests run (alone, without the prompt cache), and the
//! errors (INVALID_ARGUMENT naming the option or the lengths).
mod common;
use common::{edit_json, TinyLlama};
use mlex::{Error, FinishReason, GenerateOptions, GenerateReply, KvCacheOptions, LoadOptions, Request, SamplingConfig, Session};

/// A tiny llama whose head dimension (32) a quantization group can divide; context 128.
fn model() -> (tempfile::TempDir, Session) {
    let dir = tempfile::tempdir().unwrap();
    TinyLlama { head_dim: 32, ..Default::default() }.write(dir.path());
    let s = Session::load(dir.path()).unwrap();
    (dir, s)
}

fn prompt(len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| 1 + (i * 37 + 5) % 250).collect()
}

fn opts(max_tokens: usize, kv: KvCacheOptions) -> GenerateOptions {
    GenerateOptions { max_tokens, ignore_eos: true, kv_cache: kv, ..Default::default() }
}

fn run(s: &Session, p: &[u32], o: GenerateOptions) -> mlex::Result<GenerateReply> {
    s.generate_tokens(p, o, |_| true)
}

fn bounded(n: usize) -> KvCacheOptions {
    KvCacheOptions { max_kv_size: Some(n), ..Default::default() }
}

fn quantized(bits: u32, group: u32, start: usize) -> KvCacheOptions {
    KvCacheOptions { kv_bits: Some(bits), kv_group_size: Some(group), quantized_kv_start: Some(start), ..Default::default() }
}

fn assert_invalid(r: mlex::Result<GenerateReply>, needles: &[&str]) {
    let e = r.expect_err("should be refused");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    for n in needles {
        assert!(e.to_string().contains(n), "{e} (wanted {n:?})");
    }
}

fn assert_same(a: &GenerateReply, b: &GenerateReply, what: &str) {
    assert_eq!(a.tokens, b.tokens, "{what}");
    for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
        assert!((x - y).abs() < 1e-4, "{what}: logprob {x} vs {y}");
    }
}

#[test]
fn caches_that_hold_everything_change_nothing() {
    let (_d, s) = model();
    let p = prompt(20);
    let plain = run(&s, &p, opts(30, Default::default())).unwrap();
    // A window larger than prompt + reply never drops a token; a cache that would switch to
    // quantized only after the reply never does.
    assert_same(&run(&s, &p, opts(30, bounded(64))).unwrap(), &plain, "max_kv_size 64");
    assert_same(&run(&s, &p, opts(30, quantized(4, 32, 60))).unwrap(), &plain, "quantized_kv_start 60");
    // Prefill in chunks that stay within the window too.
    let chunked = GenerateOptions { prefill_step_size: 7, ..opts(30, bounded(64)) };
    assert_same(&run(&s, &p, chunked).unwrap(), &plain, "max_kv_size 64, chunks of 7");
}

#[test]
fn caches_that_drop_or_quantize_change_the_output_and_stay_deterministic() {
    let (_d, s) = model();
    let p = prompt(40);
    let plain = run(&s, &p, opts(40, Default::default())).unwrap();
    for (kv, what) in [(bounded(12), "max_kv_size 12"), (quantized(4, 32, 0), "4-bit from the start"), (quantized(8, 32, 16), "8-bit after 16")] {
        let a = run(&s, &p, opts(40, kv)).unwrap();
        let b = run(&s, &p, opts(40, kv)).unwrap();
        assert_same(&a, &b, what);
        assert_eq!(a.tokens.len(), 40, "{what}");
        assert_ne!(a.logprobs, plain.logprobs, "{what}: the option had no effect");
        // Nothing is far off: the same tiny model, another cache.
        assert!(a.logprobs.iter().all(|l| l.is_finite()), "{what}");
    }
}

#[test]
fn kv_requests_run_alone_and_bypass_the_prompt_cache() {
    let (_d, s) = model();
    let p = prompt(30);
    // Two plain calls: the second reuses the first's prompt (sanity).
    let first = run(&s, &p, opts(4, Default::default())).unwrap();
    assert!(first.usage.batched);
    assert!(run(&s, &p, opts(4, Default::default())).unwrap().usage.cached_tokens > 0);
    for kv in [bounded(16), quantized(8, 32, 0)] {
        let r = run(&s, &p, opts(4, kv)).unwrap();
        assert!(!r.usage.batched, "{kv:?} runs alone");
        assert_eq!(r.usage.cached_tokens, 0, "{kv:?} reads nothing from the prompt cache");
    }
    // ...and writes nothing to it: a new prompt seen only by a kv request is not reused later.
    let q = prompt(31).into_iter().rev().collect::<Vec<_>>();
    run(&s, &q, opts(4, quantized(8, 32, 0))).unwrap();
    assert_eq!(run(&s, &q, opts(4, Default::default())).unwrap().usage.cached_tokens, 0);
}

#[test]
fn a_kv_request_among_batched_ones() {
    let (_d, s) = model();
    let reqs: Vec<(Vec<u32>, GenerateOptions)> = vec![
        (prompt(9), opts(20, Default::default())),
        (prompt(17), opts(20, bounded(8))),
        (prompt(13), opts(20, Default::default())),
        (prompt(11), opts(20, quantized(4, 32, 0))),
    ];
    let streams: Vec<_> = reqs.iter().map(|(p, o)| s.stream(Request::Tokens(p.clone()), o.clone()).unwrap()).collect();
    let replies: Vec<GenerateReply> = streams.into_iter().map(|g| g.finish().unwrap()).collect();
    for ((p, o), r) in reqs.iter().zip(&replies) {
        assert_eq!(r.usage.batched, !o.kv_cache.runs_alone());
        // Each equals the same request run on its own.
        assert_same(r, &run(&s, p, o.clone()).unwrap(), &format!("{:?}", o.kv_cache));
    }
}

#[test]
fn generation_ends_with_length_at_the_context_length() {
    let (_d, s) = model();
    assert_eq!(s.info().context_length, Some(128));
    let p = prompt(100);
    // Batched (plain) and alone (a quantized cache) alike.
    for kv in [KvCacheOptions::default(), quantized(8, 32, 5000)] {
        let r = run(&s, &p, opts(1000, kv)).unwrap();
        assert_eq!(r.tokens.len(), 28, "{kv:?}: 100 + 28 = 128");
        assert_eq!(r.finish_reason, FinishReason::Length);
        assert_eq!(r.usage.completion_tokens, 28);
    }
    // max_tokens below the limit is unchanged.
    assert_eq!(run(&s, &p, opts(5, Default::default())).unwrap().tokens.len(), 5);
    // One token of room.
    assert_eq!(run(&s, &prompt(127), opts(10, Default::default())).unwrap().tokens.len(), 1);
}

#[test]
fn a_prompt_that_fills_the_context_is_refused_unless_max_kv_size_bounds_the_cache() {
    let (_d, s) = model();
    for len in [128, 200] {
        assert_invalid(run(&s, &prompt(len), opts(4, Default::default())), &[&format!("{len} tokens"), "context length is 128"]);
    }
    // A window within the context: the sequence may run past it (positions go on, as in mlx-lm).
    let r = run(&s, &prompt(200), opts(40, bounded(32))).unwrap();
    assert_eq!((r.tokens.len(), r.finish_reason), (40, FinishReason::Length));
    assert!(!r.usage.batched);
    // A window beyond the context does not lift the limit.
    assert_invalid(run(&s, &prompt(200), opts(4, bounded(256))), &["200 tokens", "128"]);
    assert_eq!(run(&s, &prompt(120), opts(40, bounded(256))).unwrap().tokens.len(), 8);
}

#[test]
fn the_context_length_load_option() {
    let dir = tempfile::tempdir().unwrap();
    TinyLlama { head_dim: 32, ..Default::default() }.write(dir.path());
    let s = Session::load_with_options(dir.path(), LoadOptions { context_length: Some(24), ..Default::default() }).unwrap();
    assert_eq!(s.info().context_length, Some(24));
    let r = run(&s, &prompt(10), opts(100, Default::default())).unwrap();
    assert_eq!((r.tokens.len(), r.finish_reason), (14, FinishReason::Length));
    assert_invalid(run(&s, &prompt(30), opts(1, Default::default())), &["30 tokens", "context length is 24"]);
    // Through the JSON schema, named as each surface spells it.
    let err = |v: serde_json::Value, n| LoadOptions::from_json(&v, n).unwrap_err();
    assert_eq!(err(serde_json::json!({"contextLength": 0}), mlex::generate::Naming::Camel), "contextLength must be at least 1");
    assert!(err(serde_json::json!({"context_length": "long"}), mlex::generate::Naming::Snake).starts_with("context_length must be"));
    let o = LoadOptions::from_json(&serde_json::json!({"--context-length": 64}), mlex::generate::Naming::Kebab).unwrap();
    assert_eq!(o.context_length, Some(64));
}

#[test]
fn invalid_options_name_the_option() {
    let (_d, s) = model();
    let p = prompt(8);
    assert_invalid(run(&s, &p, opts(2, bounded(4))), &["max_kv_size", "greater than 4"]);
    assert_invalid(run(&s, &p, opts(2, quantized(7, 32, 0))), &["kv_bits", "7"]);
    assert_invalid(run(&s, &p, opts(2, quantized(4, 48, 0))), &["kv_group_size", "48"]);
    let both = KvCacheOptions { max_kv_size: Some(16), kv_bits: Some(4), ..Default::default() };
    assert_invalid(run(&s, &p, opts(2, both)), &["max_kv_size", "kv_bits", "cannot be combined"]);
    // A group larger than the head dimension (32) cannot quantize it.
    assert_invalid(run(&s, &p, opts(2, quantized(4, 64, 0))), &["kv_group_size 64", "head dimension 32"]);
    // The session survives every refusal.
    assert_eq!(run(&s, &p, opts(2, bounded(16))).unwrap().tokens.len(), 2);
}

#[test]
fn models_with_other_caches_refuse_the_options() {
    // Dynamic NTK rope scales with the sequence length: such a model neither batches nor takes
    // these caches, and has no fixed context length.
    let dir = tempfile::tempdir().unwrap();
    TinyLlama { head_dim: 32, ..Default::default() }.write(dir.path());
    edit_json(&dir.path().join("config.json"), |c| c["rope_scaling"] = serde_json::json!({"type": "dynamic", "factor": 2.0}));
    let s = Session::load(dir.path()).unwrap();
    assert_eq!(s.info().context_length, None);
    assert_eq!(run(&s, &prompt(140), opts(2, Default::default())).unwrap().tokens.len(), 2);
    assert_invalid(run(&s, &prompt(8), opts(2, bounded(16))), &["max_kv_size needs a model"]);
    assert_invalid(run(&s, &prompt(8), opts(2, quantized(8, 32, 0))), &["kv_bits needs a model"]);
}

#[test]
fn sampling_with_a_bounded_cache_past_the_window() {
    let (_d, s) = model();
    let o = GenerateOptions {
        sampling: SamplingConfig { temperature: 0.8, seed: Some(7), ..Default::default() },
        ..opts(60, bounded(10))
    };
    let a = run(&s, &prompt(30), o.clone()).unwrap();
    let b = run(&s, &prompt(30), o).unwrap();
    assert_eq!(a.tokens, b.tokens, "seeded sampling is reproducible with a rotating cache");
    assert_eq!(a.tokens.len(), 60);
}
