//! A long-running process must not fail, nor slow down, because it sees prompts of ever new
//! lengths. MLX's CUDA backend caches CUDA graphs (keyed on topology) and cuDNN attention graphs
//! (keyed on the shapes: ~50 ms to build one on an H100), and by default each cache throws "Cache
//! thrashing is happening" on every miss once its lifetime misses pass twice its capacity.
//! - mlex turns that check off when it is loaded (`src/mlx/shim.cpp`,
//!   `MLX_ENABLE_CACHE_THRASHING_CHECK=0` unless the user set it);
//! - a prompt chunk attends to whole key/value buffers with its queries padded to a bucket
//!   (`nn::kv_cache::bucket_rows`), so prompts of many lengths share a few cuDNN graphs.
//!
//! Each "process" is this test binary run again on `child_sees_many_shapes`, MLX's caches shrunk
//! to one entry so that a handful of shapes is enough. MLX's own check, turned back on, is what
//! tells here whether a cache missed more than twice: it fails the exact shapes (the ablation
//! `MLEX_ABLATE_CUDNN_BUCKETS`) and passes the buckets, without timing anything. CUDA only:
//! elsewhere MLX has no such caches (the test says it skipped).
mod common;

use common::{pseudo_random_prompt, TinyLlama};
use mlex::mlx::fast::{scaled_dot_product_attention, AttentionMask};
use mlex::mlx::{Array, Dtype};
use mlex::{GenerateOptions, LoadOptions, Session};
use std::process::Command;

const CHILD: &str = "MLEX_TEST_THRASHING_CHILD";
const GEMMA3: &str = r#"{"model_type": "gemma3_text", "hidden_size": 256, "num_hidden_layers": 2,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "vocab_size": 259, "sliding_window": 24, "sliding_window_pattern": 2}"#;
const PART: &str = "MLEX_TEST_THRASHING_PART";

fn cuda() -> bool {
    mlex::mlx::gpu_available() && !cfg!(target_os = "macos")
}

/// Part "ops": MLX ops of many topologies and attention shapes. Part "requests": requests of
/// 20..=31 prompt tokens through a bfloat16 llama ("gemma3": a Gemma 3 with a sliding window),
/// three times: new prompts, other new prompts of the same lengths (the prompt cache holds the
/// first's), then the first ones extended by 5 tokens. One line per success (with a request's
/// time and greedy tokens) and the first error, then it stops.
#[test]
fn child_sees_many_shapes() {
    let Some(dir) = std::env::var_os(CHILD) else { return };
    mlex::mlx::set_default_device(mlex::mlx::Device::Gpu).unwrap();
    println!(); // (libtest's "test … " line is still open)
    let report = |what: String, r: mlex::Result<String>| match r {
        Ok(s) => println!("OK {what}{s}"),
        Err(e) => {
            println!("ERROR {what}: {e}");
            std::process::exit(0);
        }
    };
    if std::env::var(PART).as_deref() == Ok("ops") {
        // CUDA graphs of different topologies: chains of 1..=12 adds.
        for n in 1..=12 {
            report(format!("chain of {n} adds"), (|| {
                let a = Array::from_slice(&[1.0f32; 16], &[4, 4])?;
                let mut b = a.clone();
                for _ in 0..n {
                    b = b.add(&a)?;
                }
                mlex::mlx::eval(&[&b]).map(|_| String::new())
            })());
        }
        // cuDNN attention graphs: 24..=35 queries over as many keys, bfloat16.
        for l in 24..=35 {
            report(format!("attention over {l} rows"), (|| {
                let x = Array::from_slice(&vec![0.01f32; 2 * l * 64], &[1, 2, l as i32, 64])?.astype(Dtype::Bfloat16)?;
                let y = scaled_dot_product_attention(&x, &x, &x, 0.125, AttentionMask::Causal)?;
                mlex::mlx::eval(&[&y]).map(|_| String::new())
            })());
        }
        return;
    }
    let options = LoadOptions { dtype: Some(Dtype::Bfloat16), ..Default::default() };
    let session = if std::env::var(PART).as_deref() == Ok("gemma3") {
        // Sliding-window layers (layer 0: a window of 24) and a global one.
        Session::load_random(GEMMA3, 7, options).unwrap()
    } else {
        Session::load_with_options(&dir, options).unwrap()
    };
    for (pass, len) in (0..3).flat_map(|pass| (20..=31).map(move |l| (pass, l))) {
        let prompt = match pass {
            // Pass 2: pass 0's prompt and 5 more tokens; the prompt cache holds the prefix, so
            // the new tokens are a short pass (sliding-window layers included).
            2 => [pseudo_random_prompt(len as u64, len), vec![1, 2, 3, 4, 5]].concat(),
            _ => pseudo_random_prompt(len as u64 + 1000 * pass as u64, len),
        };
        let opts = GenerateOptions { max_tokens: 4, ..Default::default() };
        let t = std::time::Instant::now();
        let r = session.generate_tokens(&prompt, opts, |_| true);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        report(format!("request {pass} of {len} tokens"), r.map(|r| format!(" ({ms:.1} ms) tokens {:?} logprobs {:?}", r.tokens, r.logprobs)));
    }
}

/// The child's lines (OK … / ERROR …) for `part`, with `env` set and MLX's three variables
/// unset unless `env` sets them.
fn child(part: &str, env: &[(&str, &str)]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    TinyLlama { head_dim: 64, hidden: 256, max_position_embeddings: 256, ..Default::default() }.write(dir.path());
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_sees_many_shapes", "--nocapture", "--test-threads=1"]).env(CHILD, dir.path()).env(PART, part);
    for var in ["MLX_ENABLE_CACHE_THRASHING_CHECK", "MLX_CUDA_GRAPH_CACHE_SIZE", "MLX_CUDA_SDPA_CACHE_SIZE", "MLEX_ABLATE_CUDNN_BUCKETS"] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed: {}\n{}", stdout, String::from_utf8_lossy(&out.stderr));
    stdout.lines().filter(|l| l.starts_with("OK ") || l.starts_with("ERROR ")).map(str::to_string).collect()
}

fn all_ok(lines: &[String], n: usize) {
    assert!(lines.iter().all(|l| l.starts_with("OK ")), "{lines:#?}");
    assert_eq!(lines.len(), n, "{lines:#?}");
}

fn thrashed(lines: &[String], cache: &str) {
    let last = lines.last().unwrap();
    assert!(last.starts_with("ERROR ") && last.contains("Cache thrashing") && last.contains(cache), "{lines:#?}");
}

/// Greedy tokens and logprobs of each request line, without its time.
fn replies(lines: &[String]) -> Vec<(String, Vec<f32>)> {
    lines
        .iter()
        .map(|l| {
            let (head, rest) = l.split_once(" tokens [").unwrap();
            let (tokens, logprobs) = rest.split_once("] logprobs [").unwrap();
            let lp = logprobs.trim_end_matches(']').split(", ").map(|x| x.parse().unwrap()).collect();
            (format!("{} {tokens}", head.split(" (").next().unwrap()), lp)
        })
        .collect()
}

#[test]
fn many_shapes_never_fail_a_request() {
    if !cuda() {
        eprintln!("skipped: MLX's CUDA caches only exist on CUDA");
        return;
    }
    let tiny = [("MLX_CUDA_GRAPH_CACHE_SIZE", "1"), ("MLX_CUDA_SDPA_CACHE_SIZE", "1")];
    all_ok(&child("ops", &tiny), 24);
    all_ok(&child("requests", &tiny), 36);
    // MLX's check, exported by the user, is still theirs to have; and it does fire here.
    thrashed(&child("ops", &[tiny[0], tiny[1], ("MLX_ENABLE_CACHE_THRASHING_CHECK", "1")]), "MLX_CUDA_");
}

#[test]
fn prompts_of_many_lengths_share_a_few_cudnn_graphs() {
    if !cuda() {
        eprintln!("skipped: cuDNN's attention is used on CUDA only");
        return;
    }
    // Full attention (llama) and sliding windows with a global layer (Gemma 3).
    for part in ["requests", "gemma3"] {
        // With the check on and room for two cuDNN graphs, a fifth graph built fails the
        // request: prompts of 20..=31 tokens (chunks of 19..=30 queries: one bucket) build one,
        // the 5-token extensions (short passes over a 256-token buffer) at most one more.
        let check = [("MLX_ENABLE_CACHE_THRASHING_CHECK", "1"), ("MLX_CUDA_SDPA_CACHE_SIZE", "2")];
        all_ok(&child(part, &check), 36);
        // At their exact shapes each length builds its own: the fifth fails.
        thrashed(&child(part, &[check[0], check[1], ("MLEX_ABLATE_CUDNN_BUCKETS", "1")]), "MLX_CUDA_SDPA_CACHE_SIZE");

        // At MLX's own capacities: the same greedy tokens either way, logprobs within
        // bfloat16's rounding (`--nocapture` shows each request's time).
        let (bucketed, exact) = (child(part, &[]), child(part, &[("MLEX_ABLATE_CUDNN_BUCKETS", "1")]));
        all_ok(&bucketed, 36);
        all_ok(&exact, 36);
        eprintln!("{part}, buckets:\n{}\n{part}, exact shapes:\n{}", bucketed.join("\n"), exact.join("\n"));
        for ((a, la), (b, lb)) in replies(&bucketed).iter().zip(replies(&exact).iter()) {
            assert_eq!(a, b, "{part}");
            for (x, y) in la.iter().zip(lb) {
                assert!((x - y).abs() < 0.05, "{part}, {a}: logprob {x} vs {y}");
            }
        }
    }
}
