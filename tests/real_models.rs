//! Real checkpoints, discovered under `MLEX_MODELS_DIR` (default `./models`): one case per model
//! directory (a `config.json` with safetensors beside it). Each is loaded by mlex and by mlx-lm
//! (the oracle venv), both in float32 on the CPU, and continues the same prompt greedily; the
//! tokens must be the same (a different token is allowed only where mlx-lm's own top-2 margin is
//! a near-tie, as in tests/conformance.rs), and the text is printed for a human to judge.
//!
//! GGUF files directly under `MLEX_MODELS_DIR`, and those fetched into the mlex cache
//! (`~/.cache/mlex/models/*.gguf`, by `scripts/fetch-smollm2.sh` and `scripts/fetch-gemma3-270m.sh`,
//! which CI runs), are converted by our importer into `<target>/real-models/` and become cases
//! too, so CI checks real weights without a models folder.
//!
//! Skips cleanly when there are no models, and skips a model whose weights (×3: the float32 copy
//! of each side, plus headroom) do not fit the machine's available memory, saying so.
mod common;

use common::{in_ci, oracle_python, repo_root, target_dir};
use mlex::{Dtype, GenerateOptions, LoadOptions, SamplingConfig, Session};
use std::path::{Path, PathBuf};
use std::process::Command;

const PROMPT: &str = "The capital of France is";
const MAX_TOKENS: usize = 12;
const NEAR_TIE: f32 = 1e-3;

fn models_dir() -> PathBuf {
    match std::env::var_os("MLEX_MODELS_DIR").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => repo_root().join("models"),
    }
}

/// Model directories directly under `root` (sorted).
fn discover(root: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(root) else { return vec![] };
    let mut dirs: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("config.json").is_file() && weights_bytes(p) > 0)
        .collect();
    dirs.sort();
    dirs
}

/// The GGUF files in the mlex cache and directly under `models_root`, each converted (once) with
/// the default options into `<target>/real-models/<file stem>`; a conversion failure is a
/// failing case.
fn converted_ggufs(models_root: &Path, failures: &mut Vec<String>) -> Vec<PathBuf> {
    let cache = std::env::var_os("MLEX_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/mlex")));
    let mut ggufs: Vec<PathBuf> = cache
        .map(|c| c.join("models"))
        .into_iter()
        .chain([models_root.to_path_buf()])
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    // One case per file stem (a copy in both places is converted once).
    ggufs.sort_by(|a, b| a.file_stem().cmp(&b.file_stem()).then(a.cmp(b)));
    ggufs.dedup_by(|a, b| a.file_stem() == b.file_stem());
    let mut out = vec![];
    for g in ggufs {
        let dir = target_dir().join("real-models").join(g.file_stem().unwrap());
        if !dir.join("config.json").is_file() {
            let _ = std::fs::remove_dir_all(&dir);
            let opts = mlex::convert::ConvertOptions::default();
            if let Err(e) = mlex::convert::convert_gguf(&g, &dir, &opts, &mut |_| {}) {
                failures.push(format!("{}: convert: {e}", g.display()));
                continue;
            }
        }
        out.push(dir);
    }
    out
}

fn weights_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// `MemAvailable` of /proc/meminfo, in bytes (None where there is no such file).
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

struct Outcome {
    name: String,
    result: Result<String, String>,
}

fn run_one(dir: &Path, python: Option<&Path>) -> Outcome {
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let fail = |m: String| Outcome { name: name.clone(), result: Err(m) };
    let session = match Session::load_with_options(dir, LoadOptions { dtype: Some(Dtype::Float32), ..Default::default() }) {
        Ok(s) => s,
        Err(e) => return fail(format!("mlex load: {e}")),
    };
    let tok = match session.tokenizer() {
        Ok(t) => t,
        Err(e) => return fail(format!("tokenizer: {e}")),
    };
    let mut ids = match tok.encode(PROMPT, true) {
        Ok(ids) => ids,
        Err(e) => return fail(format!("encode: {e}")),
    };
    if ids.is_empty() {
        ids = tok.encode(PROMPT, false).unwrap_or_default();
    }
    let opts = GenerateOptions {
        max_tokens: MAX_TOKENS,
        sampling: SamplingConfig { temperature: 0.0, ..Default::default() },
        ignore_eos: true,
        ..Default::default()
    };
    let ours = match session.generate_tokens(&ids, opts, |_| true) {
        Ok(r) => r,
        Err(e) => return fail(format!("mlex generate: {e}")),
    };
    let text = tok.decode(&ours.tokens, true).unwrap_or_default();
    let Some(python) = python else {
        return Outcome { name, result: Ok(format!("{PROMPT}{text}  (no oracle venv: tokens not compared)")) };
    };
    let list = ids.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(",");
    let out = Command::new(python)
        .arg(repo_root().join("tests/oracle/real_model.py"))
        .arg(dir)
        .args(["--tokens", &list, "--max-tokens", &MAX_TOKENS.to_string(), "--dtype", "float32"])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => return fail(format!("mlx-lm failed: {}", String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or(""))),
        Err(e) => return fail(format!("running the oracle: {e}")),
    };
    let v: serde_json::Value = match serde_json::from_slice(&out.stdout) {
        Ok(v) => v,
        Err(e) => return fail(format!("oracle output: {e}")),
    };
    let theirs: Vec<u32> = v["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
    let margins: Vec<f32> = v["margins"].as_array().unwrap().iter().map(|t| t.as_f64().unwrap() as f32).collect();
    let lps: Vec<f32> = v["logprobs"].as_array().unwrap().iter().map(|t| t.as_f64().unwrap() as f32).collect();
    let mut max_d = 0f32;
    for (i, (&a, &b)) in ours.tokens.iter().zip(&theirs).enumerate() {
        if a != b {
            if margins[i] <= NEAR_TIE {
                return Outcome { name, result: Ok(format!("{PROMPT}{text}  (same for {i} tokens, then a near-tie)")) };
            }
            return fail(format!(
                "step {i}: token {a} (mlex) != {b} (mlx-lm), margin {:.4}; mlex: {:?} mlx-lm: {:?}",
                margins[i], ours.tokens, theirs
            ));
        }
        max_d = max_d.max((ours.logprobs[i] - lps[i]).abs());
    }
    if ours.tokens.len() != theirs.len() {
        return fail(format!("{} tokens (mlex) vs {} (mlx-lm)", ours.tokens.len(), theirs.len()));
    }
    Outcome { name, result: Ok(format!("{PROMPT}{text}  (identical {} tokens, max |Δlogprob| {max_d:.1e})", theirs.len())) }
}

#[test]
fn real_models_match_mlx_lm() {
    let root = models_dir();
    let mut failures = vec![];
    let mut dirs = discover(&root);
    dirs.extend(converted_ggufs(&root, &mut failures));
    if dirs.is_empty() && failures.is_empty() {
        common::skip(
            "real_models_match_mlx_lm",
            &format!("no model directories under {} and no GGUF in the mlex cache", root.display()),
        );
        return;
    }
    let python = oracle_python();
    if python.is_none() && in_ci() {
        panic!("real_models_match_mlx_lm: no oracle venv in CI");
    }
    let avail = available_memory();
    for dir in &dirs {
        let need = weights_bytes(dir).saturating_mul(3);
        if let Some(a) = avail {
            if need > a {
                println!(
                    "skipping {}: {:.1} GiB of weights need ~{:.1} GiB, {:.1} GiB available",
                    dir.display(),
                    weights_bytes(dir) as f64 / (1u64 << 30) as f64,
                    need as f64 / (1u64 << 30) as f64,
                    a as f64 / (1u64 << 30) as f64
                );
                continue;
            }
        }
        let o = run_one(dir, python.as_deref());
        match &o.result {
            Ok(m) => println!("{}: {m}", o.name),
            Err(m) => {
                println!("{}: FAIL {m}", o.name);
                failures.push(format!("{}: {m}", o.name));
            }
        }
    }
    assert!(failures.is_empty(), "real models differ from mlx-lm:\n  {}", failures.join("\n  "));
}
