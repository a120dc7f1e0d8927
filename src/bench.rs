//! `mlex bench`: load time, prefill, time to first token, decode speed and peak memory of one
//! model, one JSON line per run, with the same keys as mlx-lm's side (`scripts/mlxlm_bench.py`)
//! so a script can print both side by side.
use crate::error::{Error, Result};
use crate::{GenerateOptions, LoadOptions, Session};
use serde_json::{json, Value};
use std::time::Instant;

/// Real model shapes (random weights), the same configs as the mlx-lm side uses.
pub fn shape_config(name: &str) -> Result<Value> {
    Ok(match name {
        "qwen3-0.6b" => json!({"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 28, "intermediate_size": 3072,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
            "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1e6, "tie_word_embeddings": true}),
        "llama-3.2-3b" => json!({"model_type": "llama", "hidden_size": 3072, "num_hidden_layers": 28, "intermediate_size": 8192,
            "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5,
            "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 5e5, "tie_word_embeddings": true}),
        "qwen2.5-7b" => json!({"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28, "intermediate_size": 18944,
            "num_attention_heads": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-6, "vocab_size": 152064,
            "max_position_embeddings": 32768, "rope_theta": 1e6, "tie_word_embeddings": false}),
        "smollm2-135m" => json!({"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "intermediate_size": 1536,
            "num_attention_heads": 9, "num_key_value_heads": 3, "rms_norm_eps": 1e-5, "vocab_size": 49152,
            "max_position_embeddings": 8192, "rope_theta": 1e5, "tie_word_embeddings": true}),
        other => {
            return Err(Error::InvalidArgument(format!(
                "unknown shape '{other}' (qwen3-0.6b, llama-3.2-3b, qwen2.5-7b, smollm2-135m)"
            )))
        }
    })
}

/// What to benchmark.
pub struct BenchSpec {
    pub model: Option<String>,
    pub shape: Option<String>,
    /// Quantize a random-weight shape to this many bits (0 = keep floats).
    pub bits: u32,
    pub group_size: u32,
    pub load: LoadOptions,
    pub prompt_len: usize,
    pub gen: usize,
    pub runs: usize,
}

/// Runs the benchmark, calling `report` with one JSON object per measured run.
pub fn run(spec: &BenchSpec, mut report: impl FnMut(Value)) -> Result<()> {
    let t0 = Instant::now();
    let (session, label) = match (&spec.model, &spec.shape) {
        (Some(m), None) => (Session::load_with_options(m, spec.load.clone())?, m.clone()),
        (None, Some(shape)) => {
            let mut cfg = shape_config(shape)?;
            if spec.bits > 0 {
                cfg["quantization"] = json!({"group_size": spec.group_size, "bits": spec.bits, "mode": "affine"});
            }
            (Session::load_random(&cfg.to_string(), 0, spec.load.clone())?, shape.clone())
        }
        _ => return Err(Error::InvalidArgument("give exactly one of --model and --shape".into())),
    };
    let load_s = t0.elapsed().as_secs_f64();
    let vocab = session.info().vocab_size as u64;
    // A fixed pseudo-random prompt (the content does not matter for speed, only its length).
    let mut s = 0x2545F4914F6CDD1Du64;
    let prompt: Vec<u32> = (0..spec.prompt_len.max(1))
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab) as u32
        })
        .collect();
    let opts = |n| GenerateOptions { max_tokens: n, ignore_eos: true, ..Default::default() };
    session.generate_tokens(&prompt, opts(4), |_| true)?; // warm-up at the measured shape
    for run in 0..spec.runs {
        let r = session.generate_tokens(&prompt, opts(spec.gen), |_| true)?;
        let u = &r.usage;
        let gib = |b: f64| (b / (1u64 << 30) as f64 * 1000.0).round() / 1000.0;
        report(json!({
            "engine": "mlex", "model": label, "bits": spec.bits, "run": run,
            "prompt_tokens": u.prompt_tokens, "gen_tokens": u.completion_tokens,
            "prefill_tok_s": (u.prefill_tokens_per_second * 10.0).round() / 10.0,
            "ttft_ms": (u.ttft_ms * 100.0).round() / 100.0,
            "decode_tok_s": (u.decode_tokens_per_second * 100.0).round() / 100.0,
            "weights_gib": gib(session.info().weights_bytes as f64),
            "peak_gib": gib(u.peak_memory_bytes as f64),
            "device": session.info().device, "dtype": session.info().dtype,
            "blas": crate::mlx::blas_backend(),
            "load_s": (load_s * 1000.0).round() / 1000.0,
        }));
    }
    Ok(())
}
