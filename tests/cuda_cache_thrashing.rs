//! A long-running process must not start failing because it has seen many prompt lengths. MLX's
//! CUDA backend caches CUDA graphs (keyed on topology) and cuDNN attention graphs (keyed on the
//! shapes), and by default each cache throws "Cache thrashing is happening" on every miss once
//! its lifetime misses pass twice its capacity. mlex turns that check off when it is loaded
//! (`src/mlx/shim.cpp`, `MLX_ENABLE_CACHE_THRASHING_CHECK=0` unless the user set it).
//!
//! Each "process" is this test binary run again on `child_sees_many_shapes`, with both caches
//! shrunk to one entry so that a handful of shapes is enough: with mlex's default every
//! operation and every request succeeds; with the check forced back on, the same child fails
//! with MLX's message (so the test can fail). CUDA only: elsewhere MLX has no such caches (the
//! test says it skipped).
mod common;

use common::{pseudo_random_prompt, TinyLlama};
use mlex::mlx::fast::{scaled_dot_product_attention, AttentionMask};
use mlex::mlx::{Array, Dtype};
use mlex::{GenerateOptions, LoadOptions, Session};
use std::process::Command;

const CHILD: &str = "MLEX_TEST_THRASHING_CHILD";

fn cuda() -> bool {
    mlex::mlx::gpu_available() && !cfg!(target_os = "macos")
}

/// Ops of many shapes and topologies, then requests of many prompt lengths through a bfloat16
/// model; prints one line per success and the first error (then stops).
#[test]
fn child_sees_many_shapes() {
    let Some(dir) = std::env::var_os(CHILD) else { return };
    mlex::mlx::set_default_device(mlex::mlx::Device::Gpu).unwrap();
    println!(); // (libtest's "test … " line is still open)
    let report = |what: String, r: mlex::Result<()>| match r {
        Ok(()) => println!("OK {what}"),
        Err(e) => {
            println!("ERROR {what}: {e}");
            std::process::exit(0);
        }
    };
    // CUDA graphs of different topologies: chains of 1..=12 adds.
    for n in 1..=12 {
        report(format!("chain of {n} adds"), (|| {
            let a = Array::from_slice(&[1.0f32; 16], &[4, 4])?;
            let mut b = a.clone();
            for _ in 0..n {
                b = b.add(&a)?;
            }
            mlex::mlx::eval(&[&b])
        })());
    }
    // cuDNN attention graphs: 24..=35 queries over as many keys, bfloat16.
    for l in 24..=35 {
        report(format!("attention over {l} rows"), (|| {
            let x = Array::from_slice(&vec![0.01f32; 2 * l * 64], &[1, 2, l as i32, 64])?.astype(Dtype::Bfloat16)?;
            let y = scaled_dot_product_attention(&x, &x, &x, 0.125, AttentionMask::Causal)?;
            mlex::mlx::eval(&[&y])
        })());
    }
    // A session: prompts of 20..=31 tokens (prefill attention past the short-pass kernels).
    let session = Session::load_with_options(&dir, LoadOptions { dtype: Some(Dtype::Bfloat16), ..Default::default() }).unwrap();
    // (Each line gives the request's time: run alone with the caches at their defaults, a first
    // request of a new length pays for its graphs, a second of the same length does not.)
    for (pass, len) in (20..=31).map(|l| (0, l)).chain((20..=31).map(|l| (1, l))) {
        // (Another prompt in the second pass: the prompt cache holds the first's.)
        let prompt = pseudo_random_prompt(len as u64 + 1000 * pass, len);
        let opts = GenerateOptions { max_tokens: 2, ..Default::default() };
        let t = std::time::Instant::now();
        let r = session.generate_tokens(&prompt, opts, |_| true).map(|_| ());
        report(format!("request of {len} tokens ({:.1} ms)", t.elapsed().as_secs_f64() * 1e3), r);
    }
}

/// The child's lines (OK … / ERROR …) with `check` as MLX_ENABLE_CACHE_THRASHING_CHECK (None:
/// unset, mlex's default) and MLX's two caches of `capacity` entries (None: MLX's defaults).
fn child(check: Option<&str>, capacity: Option<&str>) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    TinyLlama { head_dim: 64, hidden: 256, max_position_embeddings: 256, ..Default::default() }.write(dir.path());
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_sees_many_shapes", "--nocapture", "--test-threads=1"])
        .env(CHILD, dir.path())
        .env_remove("MLX_ENABLE_CACHE_THRASHING_CHECK");
    for var in ["MLX_CUDA_GRAPH_CACHE_SIZE", "MLX_CUDA_SDPA_CACHE_SIZE"] {
        match capacity {
            Some(n) => cmd.env(var, n),
            None => cmd.env_remove(var),
        };
    }
    if let Some(v) = check {
        cmd.env("MLX_ENABLE_CACHE_THRASHING_CHECK", v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed: {}\n{}", stdout, String::from_utf8_lossy(&out.stderr));
    stdout.lines().filter(|l| l.starts_with("OK ") || l.starts_with("ERROR ")).map(str::to_string).collect()
}

#[test]
fn many_shapes_never_fail_a_request() {
    if !cuda() {
        eprintln!("skipped: MLX's CUDA caches only exist on CUDA");
        return;
    }
    let lines = child(None, Some("1"));
    assert!(lines.iter().all(|l| l.starts_with("OK ")), "{lines:#?}");
    assert_eq!(lines.len(), 48, "{lines:#?}");

    // MLX's check, exported by the user, is still theirs to have; and it does fire here.
    let lines = child(Some("1"), Some("1"));
    let last = lines.last().unwrap();
    assert!(last.starts_with("ERROR ") && last.contains("Cache thrashing"), "{lines:#?}");

    // At MLX's own capacities (what a request of a new length costs: `--nocapture` shows it).
    let lines = child(None, None);
    assert!(lines.iter().all(|l| l.starts_with("OK ")), "{lines:#?}");
    eprintln!("{}", lines.join("\n"));
}
