//! `top_logprobs` on a tiny checkpoint written by the test: each step's most likely tokens,
//! checked against the full log-softmax of the model's logits computed here (one forward pass
//! over the prompt and the generated tokens, outside the engine); the first is the greedy token
//! with its logprob; sampled, streamed, constrained and batched requests report the same lists
//! as the request alone; without the option nothing is reported.
mod common;
use common::{edit_json, tiny_llama_dir};
use mlex::generate::ResponseFormat;
use mlex::loader::{ModelConfig, Vb, WeightStore};
use mlex::mlx::Array;
use mlex::{Dtype, GenerateOptions, GenerateReply, Request, SamplingConfig, Session, TopLogprob};
use std::cell::RefCell;
use std::path::Path;

fn opts(max_tokens: usize, top: Option<usize>, sampling: SamplingConfig) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampling,
        ignore_eos: true,
        top_logprobs: top,
        ..Default::default()
    }
}

const PROMPT: &[u32] = &[3, 17, 42, 7, 99, 5];

/// The full log-softmax (float64 on the host) of the distribution of each generated token:
/// one forward pass over `prompt` and `tokens` but the last, teacher-forced.
fn reference(dir: &Path, prompt: &[u32], tokens: &[u32]) -> Vec<Vec<f64>> {
    let config = ModelConfig::from_dir(dir).unwrap();
    let mut weights = WeightStore::open(dir).unwrap();
    weights.compute_dtype = Some(Dtype::Float32);
    let weights = RefCell::new(weights);
    let model =
        mlex::models::build_model(&config, &Vb::new(&weights, config.quantization.as_ref()))
            .unwrap();
    weights.into_inner().finish().unwrap();
    let mut seq = prompt.to_vec();
    seq.extend_from_slice(&tokens[..tokens.len() - 1]);
    let mut caches = model.make_caches();
    let logits = model
        .forward(
            &Array::from_slice(&seq, &[1, seq.len() as i32]).unwrap(),
            &mut caches,
        )
        .unwrap();
    let v = logits.dim(-1) as usize;
    let all = logits
        .astype(Dtype::Float32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    (0..tokens.len())
        .map(|i| {
            let row = &all[(prompt.len() - 1 + i) * v..(prompt.len() + i) * v];
            let max = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
            let lse = max
                + row
                    .iter()
                    .map(|&x| (x as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            row.iter().map(|&x| x as f64 - lse).collect()
        })
        .collect()
}

/// Each step's list: `n` entries, most likely first, each the reference's logprob of its token,
/// and the reference's `n` most likely tokens (the same set: random weights leave no ties).
fn check_against_reference(r: &GenerateReply, reference: &[Vec<f64>], n: usize, tol: f64) {
    assert_eq!(r.top_logprobs.len(), r.tokens.len());
    for (step, (top, full)) in r.top_logprobs.iter().zip(reference).enumerate() {
        assert_eq!(top.len(), n, "step {step}");
        assert!(
            top.windows(2).all(|w| w[0].logprob >= w[1].logprob),
            "step {step}: not sorted: {top:?}"
        );
        for t in top {
            let want = full[t.id as usize];
            assert!(
                (t.logprob as f64 - want).abs() < tol,
                "step {step}: token {} logprob {} vs {want}",
                t.id,
                t.logprob
            );
        }
        let mut order: Vec<usize> = (0..full.len()).collect();
        order.sort_by(|&a, &b| full[b].total_cmp(&full[a]));
        let mut want: Vec<u32> = order[..n].iter().map(|&i| i as u32).collect();
        let mut got: Vec<u32> = top.iter().map(|t| t.id).collect();
        want.sort();
        got.sort();
        assert_eq!(got, want, "step {step}: not the {n} most likely tokens");
        // The sampled token's own logprob is of the same distribution.
        let tok = r.tokens[step] as usize;
        assert!(
            (r.logprobs[step] as f64 - full[tok]).abs() < tol,
            "step {step}: sampled logprob"
        );
    }
}

/// The tiny model, and one whose requests cannot batch (dynamic NTK rope): they then run alone
/// through the single-request loop, whose decode is pipelined the same way.
fn both_loops() -> Vec<tempfile::TempDir> {
    let unbatched = tiny_llama_dir();
    edit_json(&unbatched.path().join("config.json"), |c| {
        c["rope_scaling"] = serde_json::json!({"rope_type": "dynamic", "factor": 2.0});
    });
    vec![tiny_llama_dir(), unbatched]
}

fn tol(s: &Session) -> f64 {
    if s.info().device == "cpu" {
        1e-4
    } else {
        5e-3
    }
}

#[test]
fn greedy_top_logprobs_are_the_full_log_softmax_and_the_first_is_the_token() {
    for (dir, batched) in both_loops().iter().zip([true, false]) {
        greedy_case(dir, batched);
    }
}

fn greedy_case(dir: &tempfile::TempDir, batched: bool) {
    let s = Session::load(dir.path()).unwrap();
    let mut streamed: Vec<Vec<TopLogprob>> = vec![];
    let r = s
        .generate_tokens(PROMPT, opts(12, Some(5), SamplingConfig::default()), |t| {
            streamed.push(t.top_logprobs.clone());
            true
        })
        .unwrap();
    assert_eq!(r.tokens.len(), 12);
    assert_eq!(r.usage.batched, batched);
    for (i, top) in r.top_logprobs.iter().enumerate() {
        assert_eq!(
            top[0].id, r.tokens[i],
            "step {i}: the greedy token is the most likely"
        );
        assert_eq!(
            top[0].logprob, r.logprobs[i],
            "step {i}: with the token's own logprob"
        );
        assert!(
            !top[0].text.is_empty() || top[0].id >= 256,
            "step {i}: entries carry the token's text"
        );
    }
    check_against_reference(&r, &reference(dir.path(), PROMPT, &r.tokens), 5, tol(&s));
    assert_eq!(
        streamed, r.top_logprobs,
        "each streamed token carries its step's list"
    );
    // Every count from 1 to 20 gives that many, and the top-1 list is the top-5 list's head.
    for n in [1, 20] {
        let m = s
            .generate_tokens(PROMPT, opts(12, Some(n), SamplingConfig::default()), |_| {
                true
            })
            .unwrap();
        assert_eq!(m.tokens, r.tokens);
        assert!(m.top_logprobs.iter().all(|t| t.len() == n));
        assert!(m
            .top_logprobs
            .iter()
            .zip(&r.top_logprobs)
            .all(|(a, b)| a[0] == b[0]));
    }
}

#[test]
fn sampled_tokens_report_the_unfiltered_distribution() {
    for dir in both_loops() {
        let s = Session::load(dir.path()).unwrap();
        let cfg = SamplingConfig {
            temperature: 1.5,
            top_p: 0.5,
            top_k: 3,
            seed: Some(11),
            ..Default::default()
        };
        let r = s
            .generate_tokens(PROMPT, opts(16, Some(8), cfg.clone()), |_| true)
            .unwrap();
        // Before temperature, top-p and top-k: 8 entries although top_k keeps 3.
        check_against_reference(&r, &reference(dir.path(), PROMPT, &r.tokens), 8, tol(&s));
        // Asking for them changes nothing of the sampling.
        let plain = s
            .generate_tokens(PROMPT, opts(16, None, cfg), |_| true)
            .unwrap();
        assert_eq!(plain.tokens, r.tokens);
        assert_eq!(plain.logprobs, r.logprobs);
    }
}

#[test]
fn without_the_option_nothing_is_reported_and_bad_counts_are_refused() {
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    for top in [None, Some(0)] {
        let mut streamed = 0;
        let r = s
            .generate_tokens(PROMPT, opts(6, top, SamplingConfig::default()), |t| {
                streamed += t.top_logprobs.len();
                true
            })
            .unwrap();
        assert!(r.top_logprobs.is_empty(), "{top:?}");
        assert_eq!(streamed, 0);
        assert_eq!(r.logprobs.len(), 6);
    }
    let e = s
        .generate_tokens(PROMPT, opts(6, Some(21), SamplingConfig::default()), |_| {
            true
        })
        .unwrap_err();
    assert_eq!(e.code(), "INVALID_ARGUMENT");
    assert!(
        e.to_string()
            .contains("top_logprobs must be in [0, 20], got 21"),
        "{e}"
    );
}

#[test]
fn in_a_batch_each_row_gets_its_own_and_equals_it_alone() {
    let dir = tiny_llama_dir();
    let s = Session::load(dir.path()).unwrap();
    let prompt = |len: u32, salt: u32| -> Vec<u32> {
        (0..len).map(|i| 1 + (i * 37 + salt * 11) % 250).collect()
    };
    let seeded = SamplingConfig {
        temperature: 1.2,
        seed: Some(5),
        ..Default::default()
    };
    // An all-greedy batch (sampled together), then one with a sampled row (each row its own
    // sampler); rows asking for different counts, one asking for none; different lengths, so
    // rows leave while others go on.
    for reqs in [
        vec![
            (prompt(5, 1), opts(14, Some(3), SamplingConfig::default())),
            (prompt(9, 2), opts(9, None, SamplingConfig::default())),
            (prompt(2, 3), opts(20, Some(20), SamplingConfig::default())),
            (prompt(13, 4), opts(6, Some(1), SamplingConfig::default())),
        ],
        vec![
            (prompt(5, 1), opts(14, Some(3), SamplingConfig::default())),
            (prompt(7, 5), opts(12, Some(6), seeded.clone())),
            (prompt(9, 2), opts(9, None, seeded.clone())),
            (
                prompt(3, 6),
                opts(
                    16,
                    Some(2),
                    SamplingConfig {
                        repetition_penalty: 1.3,
                        ..Default::default()
                    },
                ),
            ),
        ],
    ] {
        let streams: Vec<_> = reqs
            .iter()
            .map(|(p, o)| s.stream(Request::Tokens(p.clone()), o.clone()).unwrap())
            .collect();
        let batched: Vec<GenerateReply> =
            streams.into_iter().map(|g| g.finish().unwrap()).collect();
        assert!(
            batched.iter().map(|r| r.usage.batch_size).max().unwrap() > 1,
            "they decoded together"
        );
        for (i, ((p, o), b)) in reqs.iter().zip(&batched).enumerate() {
            let a = s.generate_tokens(p, o.clone(), |_| true).unwrap();
            assert_eq!(b.tokens, a.tokens, "request {i}");
            assert_eq!(b.top_logprobs.len(), a.top_logprobs.len(), "request {i}");
            for (x, y) in b.top_logprobs.iter().zip(&a.top_logprobs) {
                assert_eq!(
                    x.iter().map(|t| t.id).collect::<Vec<_>>(),
                    y.iter().map(|t| t.id).collect::<Vec<_>>(),
                    "request {i}"
                );
                assert!(
                    x.iter()
                        .zip(y)
                        .all(|(x, y)| (x.logprob - y.logprob).abs() < tol(&s) as f32),
                    "request {i}"
                );
            }
            match o.top_logprobs {
                Some(n) => assert!(b.top_logprobs.iter().all(|t| t.len() == n), "request {i}"),
                None => assert!(b.top_logprobs.is_empty(), "request {i}"),
            }
            if let (Some(n), 1.0) = (o.top_logprobs, o.sampling.repetition_penalty) {
                check_against_reference(b, &reference(dir.path(), p, &b.tokens), n, tol(&s));
            }
        }
    }
}

#[test]
fn a_constraint_leaves_out_the_tokens_it_forbids() {
    for dir in both_loops() {
        let s = Session::load(dir.path()).unwrap();
        let o = GenerateOptions {
            response_format: Some(ResponseFormat::Regex("[ab]{4}".into())),
            ..opts(8, Some(5), SamplingConfig::default())
        };
        let r = s.generate_tokens(PROMPT, o, |_| true).unwrap();
        assert_eq!(r.text.len(), 4, "{:?}", r.text);
        for (i, top) in r.top_logprobs.iter().enumerate().take(4) {
            // Only 'a' and 'b' may come: the rest have logprob -inf and are left out.
            assert!(!top.is_empty() && top.len() <= 2, "step {i}: {top:?}");
            assert!(
                top.iter().all(|t| t.text == "a" || t.text == "b"),
                "step {i}: {top:?}"
            );
            assert_eq!(top[0].id, r.tokens[i]);
            let total: f32 = top.iter().map(|t| t.logprob.exp()).sum();
            assert!(
                (total - 1.0).abs() < 1e-4,
                "step {i}: the mask renormalizes: {total}"
            );
        }
    }
}

#[test]
fn the_cli_shows_them_in_json() {
    let dir = tiny_llama_dir();
    let run = |top: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_mlex"))
            .args(["generate", "--model", dir.path().to_str().unwrap(), "--prompt-tokens", "3,17,42,7", "--max-tokens", "5"])
            .args(["--ignore-eos", "--json", "--device", "cpu", "--top-logprobs", top])
            .output()
            .unwrap()
    };
    let out = run("3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tokens = v["tokens"].as_array().unwrap();
    let top = v["top_logprobs"].as_array().unwrap();
    assert_eq!((tokens.len(), top.len()), (5, 5));
    for (i, t) in top.iter().enumerate() {
        let t = t.as_array().unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t[0]["id"], tokens[i]);
        assert_eq!(t[0]["logprob"], v["logprobs"][i]);
        assert!(t[0]["text"].is_string());
    }
    let bad = run("21");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--top-logprobs must be in [0, 20], got 21"));
}
