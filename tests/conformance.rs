//! Conformance against mlx-lm (the oracle).
//!
//! `tests/oracle/make_fixtures.py` builds tiny random models with mlx-lm itself (llama, qwen2,
//! qwen3 × f32, bf16 and affine quantizations incl. per-layer mixes, plus rope-scaling, tied,
//! mistral cases), saves them in MLX format and records mlx-lm's greedy tokens and logprobs.
//! Here each checkpoint is loaded with our engine and decoded greedily from the same prompt.
//!
//! Rule, per case: walk the steps; while the tokens agree, |Δ logprob| must stay within the
//! case's tolerance (1e-3 for float32 models, 2e-2 for bfloat16 ones; a quantized model counts
//! as the float dtype its scales and activations use). At the first token that differs, the case
//! passes only when mlx-lm's top-2 margin at that step is ≤ 1e-3 (a near-tie either side may
//! break), and comparison stops there.
//!
//! For bfloat16 models mlx-lm takes the log-softmax in bf16, whose logsumexp is rounded to a
//! bf16 step at the magnitude of the largest logit (~0.03 with these fixtures): an engine that
//! upcasts the logits first is as right, so `logprobs_f32_head` (the same logits, log-softmax in
//! f32) is accepted as the reference too.
//!
//! Run: `MLEX_ORACLE_VENV=/path/to/venv cargo test --test conformance -- --nocapture`
//! (without a venv the tests print "skipping" and pass, except when `$CI` is set).
//! The table goes to stdout and to `<target>/conformance.md`.
mod common;

use common::{family_fixtures_dir, oracle_cases, require_oracle, target_dir, OracleCase};
use mlex::{Dtype, GenerateOptions, LoadOptions, SamplingConfig, Session};
use std::fmt::Write as _;
use std::sync::Mutex;

/// |Δ logprob| allowed while tokens agree.
const TOL_F32: f32 = 1e-3;
const TOL_BF16: f32 = 2e-2;
/// mlx-lm's top-2 margin at or below which a different token is a legitimate tie-break.
const NEAR_TIE: f32 = 1e-3;

#[derive(Debug, Clone)]
struct Row {
    case: String,
    dtype: String,
    quantized: bool,
    steps_compared: usize,
    total_steps: usize,
    max_delta: f32,
    /// Step index of the max |Δ|.
    max_delta_step: usize,
    result: Outcome,
}

#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    /// Every step agreed within tolerance.
    Pass,
    /// Agreed until a near-tie, where the tokens parted (allowed).
    PassNearTie { step: usize, margin: f32 },
    Fail(String),
}

impl Outcome {
    fn label(&self) -> String {
        match self {
            Outcome::Pass => "pass".into(),
            Outcome::PassNearTie { step, margin } => format!("pass (near-tie at step {step}, margin {margin:.1e})"),
            Outcome::Fail(m) => format!("FAIL: {m}"),
        }
    }
}

fn tolerance(case: &OracleCase) -> f32 {
    if case.dtype == "float32" {
        TOL_F32
    } else {
        TOL_BF16
    }
}

/// Compares our tokens/logprobs with the oracle's, by the rule in the module docs.
fn compare(case: &OracleCase, tokens: &[u32], logprobs: &[f32]) -> Row {
    let tol = tolerance(case);
    let mut row = Row {
        case: case.name.clone(),
        dtype: case.dtype.clone(),
        quantized: case.quantized,
        steps_compared: 0,
        total_steps: case.tokens.len(),
        max_delta: 0.0,
        max_delta_step: 0,
        result: Outcome::Pass,
    };
    if tokens.len() != logprobs.len() {
        row.result = Outcome::Fail(format!("{} tokens but {} logprobs", tokens.len(), logprobs.len()));
        return row;
    }
    for (step, &theirs) in case.tokens.iter().enumerate() {
        let Some(&ours) = tokens.get(step) else {
            row.result = Outcome::Fail(format!(
                "step {step}: our generation ended after {} tokens (oracle made {})",
                tokens.len(),
                case.tokens.len()
            ));
            return row;
        };
        if ours != theirs {
            let margin = case.margins[step];
            row.result = if margin <= NEAR_TIE {
                Outcome::PassNearTie { step, margin }
            } else {
                Outcome::Fail(format!(
                    "step {step}: token {ours} (ours) != {theirs} (mlx-lm), oracle's top-2 margin {margin:.4} > {NEAR_TIE:e}"
                ))
            };
            return row;
        }
        let lp = logprobs[step];
        // Distance to the nearer of the two equally valid references (identical for f32 cases).
        let delta = (lp - case.logprobs[step]).abs().min((lp - case.logprobs_f32_head[step]).abs());
        row.steps_compared = step + 1;
        if delta.is_nan() || delta > row.max_delta {
            row.max_delta = delta;
            row.max_delta_step = step;
        }
        if delta.is_nan() || delta > tol {
            row.result = Outcome::Fail(format!(
                "step {step} (token {ours}): logprob {lp:.6} (ours) vs {:.6} (mlx-lm{}), |Δ| = {delta:.2e} > {tol:e}",
                case.logprobs[step],
                if case.dtype == "float32" { String::new() } else { format!(", f32-head {:.6}", case.logprobs_f32_head[step]) },
            ));
            return row;
        }
    }
    row
}

/// One case through a session. `pooled: false` asks for no prompt cache, which lets the last
/// prefill chunk take the prompt's last token (float32, plain caches: `generator::final_chunk`)
/// where mlx-lm steps it alone; with the prompt cache on (the default) it is stepped alone too.
fn run_case(case: &OracleCase, pooled: bool) -> Row {
    let dtype = match case.dtype.as_str() {
        "float32" => Dtype::Float32,
        "bfloat16" => Dtype::Bfloat16,
        other => panic!("{}: unexpected dtype '{other}' in expected.json", case.name),
    };
    let name = if pooled { case.name.clone() } else { format!("{} (prompt cache off)", case.name) };
    let fail = |msg: String| Row {
        case: name.clone(),
        dtype: case.dtype.clone(),
        quantized: case.quantized,
        steps_compared: 0,
        total_steps: case.tokens.len(),
        max_delta: 0.0,
        max_delta_step: 0,
        result: Outcome::Fail(msg),
    };
    let session = match Session::load_with_options(&case.dir, LoadOptions { dtype: Some(dtype), ..Default::default() }) {
        Ok(s) => s,
        Err(e) => return fail(format!("load: {e}")),
    };
    let mut options = GenerateOptions {
        max_tokens: case.tokens.len(),
        sampling: SamplingConfig { temperature: 0.0, ..Default::default() },
        ignore_eos: true,
        ..Default::default()
    };
    if let Some(n) = case.prefill_step_size {
        options.prefill_step_size = n;
    }
    // The generate_step options the oracle ran with (the KV cache options), by mlx-lm's names.
    match generate_options(case) {
        Ok(kv) => options.kv_cache = kv,
        Err(e) => return fail(format!("generate_options: {e}")),
    }
    if !pooled {
        options.prompt_cache = Some(false);
    }
    match session.generate_tokens(&case.prompt, options, |_tok| true) {
        Ok(reply) => Row { case: name.clone(), ..compare(case, &reply.tokens, &reply.logprobs) },
        Err(e) => fail(format!("generate: {e}")),
    }
}

/// The KV cache options of `expected.json`'s `generate_options` (mlx-lm's keyword arguments of
/// `generate_step`, which are mlex's option names in snake_case); default when absent.
fn generate_options(case: &OracleCase) -> Result<mlex::KvCacheOptions, String> {
    let file = case.dir.join("expected.json");
    let e: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    match e.get("generate_options").filter(|v| v.as_object().is_some_and(|o| !o.is_empty())) {
        Some(v) => Ok(GenerateOptions::from_json(v, mlex::generate::Naming::Snake)?.kv_cache),
        None => Ok(Default::default()),
    }
}

/// Every row produced by any test in this binary, so the table file holds all of them.
static ROWS: Mutex<Vec<Row>> = Mutex::new(Vec::new());

fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    writeln!(s, "| case | dtype | quantized | steps compared | max \\|Δlogprob\\| (step) | tolerance | result |").unwrap();
    writeln!(s, "|---|---|---|---|---|---|---|").unwrap();
    for r in rows {
        let tol = if r.dtype == "float32" { TOL_F32 } else { TOL_BF16 };
        writeln!(
            s,
            "| {} | {} | {} | {}/{} | {:.2e} ({}) | {:e} | {} |",
            r.case,
            r.dtype,
            if r.quantized { "yes" } else { "no" },
            r.steps_compared,
            r.total_steps,
            r.max_delta,
            r.max_delta_step,
            tol,
            r.result.label()
        )
        .unwrap();
    }
    s
}

fn write_report() {
    let mut rows = ROWS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    rows.sort_by(|a, b| a.case.cmp(&b.case));
    let passed = rows.iter().filter(|r| !matches!(r.result, Outcome::Fail(_))).count();
    let md = format!(
        "# Conformance against mlx-lm\n\nGreedy decoding of tiny random checkpoints written by mlx-lm \
         (tests/oracle/make_fixtures.py); {passed}/{} cases pass.\n\n{}",
        rows.len(),
        table(&rows)
    );
    let path = target_dir().join("conformance.md");
    if let Err(e) = std::fs::write(&path, md) {
        eprintln!("could not write {}: {e}", path.display());
    }
}

/// Runs every case of `family` whose model_type is in `model_types` and fails naming each
/// failing case/step.
fn check(test: &str, family: &str, model_types: &[&str]) {
    if require_oracle(test).is_none() {
        return;
    }
    let fixtures = family_fixtures_dir(family);
    let cases: Vec<OracleCase> =
        oracle_cases(&fixtures).into_iter().filter(|c| model_types.contains(&c.model_type.as_str())).collect();
    assert!(!cases.is_empty(), "{test}: no fixture cases for {model_types:?} in {}", fixtures.display());
    let rows: Vec<Row> = cases.iter().flat_map(|c| [run_case(c, true), run_case(c, false)]).collect();
    println!("\nconformance ({test}):\n{}", table(&rows));
    ROWS.lock().unwrap_or_else(|e| e.into_inner()).extend(rows.iter().cloned());
    write_report();
    let failures: Vec<String> = rows
        .iter()
        .filter_map(|r| match &r.result {
            Outcome::Fail(m) => Some(format!("{}: {m}", r.case)),
            _ => None,
        })
        .collect();
    assert!(failures.is_empty(), "{} of {} cases differ from mlx-lm:\n  {}", failures.len(), rows.len(), failures.join("\n  "));
}

#[test]
fn conformance_llama() {
    // "mistral" checkpoints are llama-shaped; mlx-lm maps the type to its llama module.
    check("conformance_llama", "core", &["llama", "mistral"]);
}

#[test]
fn conformance_qwen2() {
    check("conformance_qwen2", "core", &["qwen2"]);
}

#[test]
fn conformance_qwen3() {
    check("conformance_qwen3", "core", &["qwen3"]);
}

#[test]
fn conformance_minicpm() {
    check("conformance_minicpm", "minicpm", &["minicpm"]);
}

#[test]
fn conformance_smollm3() {
    check("conformance_smollm3", "smollm3", &["smollm3"]);
}

#[test]
fn conformance_moe() {
    check("conformance_moe", "moe", &["qwen3_moe", "qwen2_moe", "mixtral"]);
}

#[test]
fn conformance_gpt_oss() {
    check("conformance_gpt_oss", "gpt_oss", &["gpt_oss"]);
}

#[test]
fn conformance_gemma3() {
    check("conformance_gemma3", "gemma3", &["gemma3_text", "gemma3"]);
}

#[test]
fn conformance_qwen3_next() {
    check("conformance_qwen3_next", "qwen3_next", &["qwen3_next", "qwen3_5", "qwen3_5_moe"]);
}

#[test]
fn conformance_gemma4() {
    check("conformance_gemma4", "gemma4", &["gemma4_text", "gemma4"]);
}

#[test]
fn conformance_deepseek() {
    check("conformance_deepseek", "deepseek", &["deepseek_v3", "deepseek_v2"]);
}

/// mlx-lm's `max_kv_size` (rotating cache keeping the first 4 tokens) and `kv_bits` /
/// `kv_group_size` / `quantized_kv_start` (quantized cache and attention): tests/oracle/archs/kv.py.
#[test]
fn conformance_kv_cache() {
    check("conformance_kv_cache", "kv", &["qwen3", "qwen2", "llama"]);
}

#[test]
fn conformance_nemotron_h() {
    check("conformance_nemotron_h", "nemotron_h", &["nemotron_h"]);
}

/// The comparison rule itself, on synthetic data (runs without the oracle).
#[test]
fn comparison_rule() {
    let case = OracleCase {
        name: "synthetic".into(),
        dir: Default::default(),
        prompt: vec![1, 2, 3],
        tokens: vec![5, 6, 7, 8],
        logprobs: vec![-0.5, -1.0, -1.5, -2.0],
        logprobs_f32_head: vec![-0.5, -1.0, -1.5, -2.0],
        margins: vec![0.5, 0.5, 0.0005, 0.5],
        dtype: "float32".into(),
        quantized: false,
        model_type: "llama".into(),
        prefill_step_size: None,
    };
    let ok = compare(&case, &[5, 6, 7, 8], &[-0.5, -1.0005, -1.5, -2.0]);
    assert_eq!(ok.result, Outcome::Pass);
    assert_eq!(ok.steps_compared, 4);
    assert!((ok.max_delta - 5e-4).abs() < 1e-5);

    let too_far = compare(&case, &[5, 6, 7, 8], &[-0.5, -1.01, -1.5, -2.0]);
    assert!(matches!(&too_far.result, Outcome::Fail(m) if m.contains("step 1")), "{:?}", too_far.result);

    let tie = compare(&case, &[5, 6, 9, 9], &[-0.5, -1.0, -1.6, -3.0]);
    assert_eq!(tie.result, Outcome::PassNearTie { step: 2, margin: 0.0005 });
    assert_eq!(tie.steps_compared, 2);

    let wrong = compare(&case, &[5, 9, 7, 8], &[-0.5, -1.0, -1.5, -2.0]);
    assert!(matches!(&wrong.result, Outcome::Fail(m) if m.contains("step 1")), "{:?}", wrong.result);

    let short = compare(&case, &[5, 6], &[-0.5, -1.0]);
    assert!(matches!(&short.result, Outcome::Fail(m) if m.contains("step 2")), "{:?}", short.result);

    let nan = compare(&case, &[5, 6, 7, 8], &[-0.5, f32::NAN, -1.5, -2.0]);
    assert!(matches!(&nan.result, Outcome::Fail(m) if m.contains("step 1")), "{:?}", nan.result);

    // bf16: either reference is accepted.
    let mut bf = case.clone();
    bf.dtype = "bfloat16".into();
    bf.logprobs_f32_head = vec![-0.53, -1.0, -1.5, -2.0];
    assert_eq!(compare(&bf, &[5, 6, 7, 8], &[-0.535, -1.01, -1.5, -2.0]).result, Outcome::Pass);
    assert!(matches!(compare(&bf, &[5, 6, 7, 8], &[-0.6, -1.0, -1.5, -2.0]).result, Outcome::Fail(_)));
}
