//! Our CUDA kernels compile once per machine, not once per process (src/mlx/cuda_jit.cpp), and
//! are launched directly (src/mlx/cuda_launch.cpp) with the same bits as when MLX compiles and
//! launches them (`MLEX_CUDA_KERNEL_CACHE=0`): a
//! second process reads them from the disk cache and compiles nothing; a corrupt, truncated or
//! foreign entry is never loaded but compiled and written again; and the products are the same
//! bits whichever way the kernel came. Each "process" is this test binary run again on
//! `child_runs_the_kernels`, with its own `MLEX_KERNEL_CACHE_DIR`. CUDA only: elsewhere there is
//! nothing to compile (the test says it skipped).
mod common;

use mlex::mlx::quant::{self, Epilogue};
use mlex::mlx::{Array, Dtype, QuantMode};
use std::path::{Path, PathBuf};
use std::process::Command;

const CHILD: &str = "MLEX_TEST_KERNEL_CACHE_CHILD";

fn cuda() -> bool {
    mlex::mlx::gpu_available() && !cfg!(target_os = "macos")
}

fn rand_array(n: i32, k: i32, seed: u64, dtype: Dtype) -> Array {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let v: Vec<f32> = (0..n * k)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    Array::from_slice(&v, &[n, 1, k]).unwrap().astype(dtype).unwrap()
}

/// The child: runs the matvec kernel (plain, residual add, SwiGLU; one row and a batch's 8) and
/// prints one line per product with a hash of its output bits. Does nothing unless spawned.
#[test]
fn child_runs_the_kernels() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    mlex::mlx::set_default_device(mlex::mlx::Device::Gpu).unwrap();
    // Ours (src/mlx/cuda_launch.cpp) by default; MLX's own with MLEX_CUDA_KERNEL_CACHE=0.
    let primitive = if std::env::var("MLEX_CUDA_KERNEL_CACHE").as_deref() == Ok("0") { "CustomKernel" } else { "MlexCudaKernel" };
    let (n, k) = (256i32, 512i32);
    let w = rand_array(n, k, 7, Dtype::Bfloat16).reshape(&[n, k]).unwrap();
    let q = quant::quantize(&w, 64, 4, QuantMode::Affine).unwrap();
    let biases = q.biases.as_ref().unwrap();
    for m in [1i32, 8] {
        let x = rand_array(m, k, 8 + m as u64, Dtype::Bfloat16);
        let res = rand_array(m, n, 20 + m as u64, Dtype::Bfloat16);
        for (name, epi) in [("none", None), ("add", Some(Epilogue::AddResidual(&res))), ("swiglu", Some(Epilogue::SwiGlu))] {
            let y = match epi {
                None => quant::quantized_matmul(&x, &q.weight, &q.scales, Some(biases), true, 64, 4, QuantMode::Affine),
                Some(e) => quant::quantized_matmul_fused(&x, None, &q.weight, &q.scales, Some(biases), 64, 4, QuantMode::Affine, Some(e)),
            }
            .unwrap();
            let census = mlex::mlx::graph_census(&[&y]).unwrap();
            assert!(census.iter().any(|(p, _)| p == primitive), "{name} {m} rows: not {primitive}: {census:?}");
            let bits: Vec<u32> = y.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect();
            let h = bits.iter().fold(0xcbf29ce484222325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x100000001b3));
            println!("PRODUCT {name} {m} {h:016x}");
        }
    }
}

/// One child process on `cache`: its product lines and its stderr (the kernel trace).
fn child(cache: &Path) -> (Vec<String>, String) {
    child_with(cache, "1")
}

/// The same, with MLEX_CUDA_KERNEL_CACHE set to `cache_setting`.
fn child_with(cache: &Path, cache_setting: &str) -> (Vec<String>, String) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_runs_the_kernels", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("MLEX_CUDA_KERNEL_CACHE", cache_setting)
        .env("MLEX_KERNEL_CACHE_DIR", cache)
        .env("MLEX_TRACE_KERNELS", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    // libtest prints "test child_runs_the_kernels ... " ahead of the child's first line.
    let products: Vec<String> = stdout.lines().filter_map(|l| l.find("PRODUCT ").map(|at| l[at..].to_string())).collect();
    assert_eq!(products.len(), 6, "child printed {stdout}");
    assert!(!stderr.contains("unavailable"), "a kernel fell back to MLX's ops:\n{stderr}");
    (products, stderr)
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cubin"))
        .collect();
    v.sort();
    v
}

#[test]
fn kernels_compile_once_per_machine() {
    if !cuda() {
        common::skip("kernels_compile_once_per_machine", "no CUDA GPU: nothing is compiled here");
        return;
    }
    let cache = tempfile::tempdir().unwrap();

    // First process: every instantiation compiled and written.
    let (first, err) = child(cache.path());
    let compiled = count(&err, " compiled in ");
    assert!(compiled >= 3, "three epilogues at least, each its own kernel:\n{err}");
    assert_eq!(count(&err, " read from "), 0, "{err}");
    let files = entries(cache.path());
    assert_eq!(files.len(), compiled, "one entry per compiled kernel:\n{err}");
    let names: Vec<String> = std::fs::read_dir(cache.path()).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|n| n.ends_with(".cubin")), "no temporary file is left: {names:?}");

    // MLX compiling and launching the same kernel text itself (MLEX_CUDA_KERNEL_CACHE=0): the
    // same bits as our direct launches, and nothing written.
    let (by_mlx, err) = child_with(cache.path(), "0");
    assert_eq!(by_mlx, first, "MLX's launches of the same kernels give other bits:\n{err}");
    assert_eq!(entries(cache.path()).len(), compiled, "{err}");

    // Second process: nothing compiled, the same bits.
    let (second, err) = child(cache.path());
    assert_eq!(count(&err, " compiled in "), 0, "the second process compiled:\n{err}");
    assert_eq!(count(&err, " read from "), compiled, "{err}");
    assert_eq!(second, first, "a kernel from the disk cache gives other bits");

    // Damaged entries: a flipped byte of the binary, a truncated file, another entry's bytes
    // under this name. Each is compiled again, never loaded; the results do not change.
    assert!(files.len() >= 3);
    let mut flipped = std::fs::read(&files[0]).unwrap();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x5a;
    std::fs::write(&files[0], flipped).unwrap();
    let whole = std::fs::read(&files[1]).unwrap();
    std::fs::write(&files[1], &whole[..whole.len() / 2]).unwrap();
    std::fs::copy(&files[0], &files[2]).unwrap();
    let (third, err) = child(cache.path());
    assert_eq!(count(&err, " compiled in "), 3, "each damaged entry is compiled again:\n{err}");
    assert_eq!(count(&err, " read from "), compiled - 3, "{err}");
    assert_eq!(third, first);

    // And written again: a fourth process reads everything.
    let (fourth, err) = child(cache.path());
    assert_eq!(count(&err, " compiled in "), 0, "{err}");
    assert_eq!(fourth, first);
}
