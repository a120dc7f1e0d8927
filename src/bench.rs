//! `mlex bench`: load time, prefill, time to first token, decode speed and peak memory of one
//! model, one JSON line per run, with the same keys as mlx-lm's side (`scripts/mlxlm_bench.py`)
//! so a script can print both side by side.
use crate::error::{Error, Result};
use crate::{GenerateOptions, LoadOptions, Session};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub mod matvec;

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
        // Qwen3-30B-A3B: 128 experts, 8 per token, every layer sparse.
        "qwen3-30b-a3b" => json!({"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
            "intermediate_size": 6144, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
            "rms_norm_eps": 1e-6, "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1e6,
            "tie_word_embeddings": false, "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "moe_intermediate_size": 768, "norm_topk_prob": true}),
        // Gemma 3 1B: 5 sliding-window layers (512) per global one.
        "gemma3-1b" => json!({"model_type": "gemma3_text", "hidden_size": 1152, "num_hidden_layers": 26,
            "intermediate_size": 6912, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
            "rms_norm_eps": 1e-6, "vocab_size": 262144, "max_position_embeddings": 32768, "rope_theta": 1e6,
            "rope_local_base_freq": 10000.0, "sliding_window": 512, "sliding_window_pattern": 6,
            "query_pre_attn_scalar": 256, "rope_scaling": null}),
        // Qwen3.5-0.8B as published (24 layers, hidden 1024, 8 / 2 heads of 256, gated delta-net
        // layers with every 4th full attention); the linear-attention head counts and sizes are
        // assumed (16 heads of 128 for keys and values), not read off the real checkpoint.
        "qwen3.5-0.8b" => json!({"model_type": "qwen3_5", "hidden_size": 1024, "num_hidden_layers": 24,
            "intermediate_size": 3584, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
            "rms_norm_eps": 1e-6, "vocab_size": 248320, "max_position_embeddings": 262144,
            "linear_num_value_heads": 16, "linear_num_key_heads": 16, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
            "tie_word_embeddings": true,
            "rope_parameters": {"type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25}}),
        // A Qwen3.5 ~2B shape: hidden 2048, 24 layers, every 4th full attention (8 / 2 heads of
        // 256); the gated delta-net sizes (16 heads of 128) are assumed, as for 0.8b.
        "qwen3.5-2b" => json!({"model_type": "qwen3_5", "hidden_size": 2048, "num_hidden_layers": 24,
            "intermediate_size": 6144, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
            "rms_norm_eps": 1e-6, "vocab_size": 248320, "max_position_embeddings": 262144,
            "linear_num_value_heads": 16, "linear_num_key_heads": 16, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
            "tie_word_embeddings": true,
            "rope_parameters": {"type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25}}),
        // Qwen3.5-35B-A3B scaled down: its layer (hidden 2048, 16 / 2 attention heads of 256, 16 key
        // and 32 value heads of 128, 8 routed experts of 512 plus a shared one) with 16 layers of 40
        // and 64 experts of 256.
        "qwen3.5-moe-small" => json!({"model_type": "qwen3_5_moe", "hidden_size": 2048, "num_hidden_layers": 16,
            "intermediate_size": 6144, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
            "rms_norm_eps": 1e-6, "vocab_size": 248320, "max_position_embeddings": 262144,
            "linear_num_value_heads": 32, "linear_num_key_heads": 16, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
            "tie_word_embeddings": false, "num_experts": 64, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
            "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "norm_topk_prob": true,
            "rope_parameters": {"type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25}}),
        other => {
            return Err(Error::InvalidArgument(format!(
                "unknown shape '{other}' (qwen3-0.6b, llama-3.2-3b, qwen2.5-7b, smollm2-135m, qwen3-30b-a3b, gemma3-1b, qwen3.5-0.8b, qwen3.5-2b, qwen3.5-moe-small)"
            )))
        }
    })
}

/// What to benchmark.
#[derive(Clone)]
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
    /// KV cache options of every measured generation (`max_kv_size`, `kv_bits`, …).
    pub kv: crate::generate::KvCacheOptions,
    /// Prompt tokens per prefill forward pass (None: the default).
    pub prefill_step_size: Option<usize>,
    /// Run r's prompt is `prompt_len + 1 + r` tokens long: a length the process has not seen
    /// (the warm-up is `prompt_len`), as a server's requests mostly are.
    pub new_lengths: bool,
}

/// Runs the benchmark, calling `report` with one JSON object per measured run.
pub fn run(spec: &BenchSpec, mut report: impl FnMut(Value)) -> Result<()> {
    let t0 = Instant::now();
    let (session, label) = load(spec)?;
    let load_s = t0.elapsed().as_secs_f64();
    let prompt = random_prompt(session.info().vocab_size as u64, spec.prompt_len, 0);
    // Every run recomputes the prompt: the prompt cache would otherwise serve it.
    let opts = |n| {
        let mut o = GenerateOptions { max_tokens: n, ignore_eos: true, prompt_cache: Some(false), kv_cache: spec.kv, ..Default::default() };
        o.prefill_step_size = spec.prefill_step_size.unwrap_or(o.prefill_step_size);
        o
    };
    session.generate_tokens(&prompt, opts(4), |_| true)?; // warm-up at the measured shape
    for run in 0..spec.runs {
        let prompt = if spec.new_lengths {
            random_prompt(session.info().vocab_size as u64, spec.prompt_len + 1 + run, 1 + run as u64)
        } else {
            prompt.clone()
        };
        let r = session.generate_tokens(&prompt, opts(spec.gen), |_| true)?;
        let u = &r.usage;
        let gib = |b: f64| (b / (1u64 << 30) as f64 * 1000.0).round() / 1000.0;
        report(json!({
            "engine": "mlex", "model": label, "bits": spec.bits, "run": run,
            "prompt_tokens": u.prompt_tokens, "gen_tokens": u.completion_tokens,
            "max_kv_size": spec.kv.max_kv_size, "kv_bits": spec.kv.kv_bits,
            "prefill_tok_s": (u.prefill_tokens_per_second * 10.0).round() / 10.0,
            "ttft_ms": (u.ttft_ms * 100.0).round() / 100.0,
            "decode_tok_s": (u.decode_tokens_per_second * 100.0).round() / 100.0,
            "schedule_ms_per_step": (u.schedule_ms_per_step * 1000.0).round() / 1000.0,
            "submit_ms_per_step": (u.submit_ms_per_step * 1000.0).round() / 1000.0,
            "wait_ms_per_step": (u.wait_ms_per_step * 1000.0).round() / 1000.0,
            "weights_gib": gib(session.info().weights_bytes as f64),
            "peak_gib": gib(u.peak_memory_bytes as f64),
            "device": session.info().device, "dtype": session.info().dtype,
            "blas": crate::mlx::blas_backend(),
            "load_s": (load_s * 1000.0).round() / 1000.0,
            // Greedy tokens, for comparing builds and ablations.
            "first_tokens": &r.tokens[..r.tokens.len().min(16)],
        }));
    }
    Ok(())
}

/// The MLX operations one decode step of `spec`'s model (a checkpoint, or a random-weight shape
/// quantized to `bits`) builds (model forward only; greedy sampling adds a handful), counted by
/// primitive, most frequent first, on the default device in the load options' dtype (for a shape
/// without one, the device's default compute dtype; on the CPU, mlex's own kernels replace MLX's
/// `fast` ops, which MLX's CPU backend would expand into several each).
/// Per-operation overhead is what a small model's decode step costs on a GPU, so this is the
/// number that fused projections and view-free decode paths reduce (BENCHMARKS.md).
pub fn decode_step_census(spec: &BenchSpec) -> Result<Vec<(String, usize)>> {
    let mut spec = spec.clone();
    if spec.shape.is_some() && spec.load.dtype.is_none() {
        // Each device's default compute dtype (float32 on the CPU), since which kernels apply depends on it.
        spec.load.dtype = Some(if crate::mlx::gpu_available() { crate::Dtype::Bfloat16 } else { crate::Dtype::Float32 });
    }
    load(&spec)?.0.decode_step_census()
}

/// `concurrency` requests at once on one session (each its own random prompt of `prompt_len`
/// tokens and `gen` new ones, from its own thread, started together), per run: the aggregate
/// generated tok/s over the wall time of all of them, each stream's decode tok/s (median), and
/// the time to first token each caller saw (queueing included), p50 and p95, and the time to
/// first token of one more request arriving while all of them decode (`late`: `late_ttft_ms`;
/// its two tokens are not in the aggregate, but its prefill delays the streams and the wall time).
pub fn run_concurrent(spec: &BenchSpec, concurrency: usize, late: bool, mut report: impl FnMut(Value)) -> Result<()> {
    if concurrency == 0 {
        return Err(Error::InvalidArgument("--concurrency must be at least 1".into()));
    }
    let (session, label) = load(spec)?;
    let vocab = session.info().vocab_size as u64;
    let opts = |n| GenerateOptions { max_tokens: n, ignore_eos: true, prompt_cache: Some(false), ..Default::default() };
    session.generate_tokens(&random_prompt(vocab, spec.prompt_len, 0), opts(4), |_| true)?; // warm-up
    let r1 = |x: f64| (x * 10.0).round() / 10.0;
    for run in 0..spec.runs {
        let t0 = Instant::now();
        let started = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..concurrency)
            .map(|i| {
                let s = session.clone();
                let prompt = random_prompt(vocab, spec.prompt_len, 1 + (run * concurrency + i) as u64);
                let gen = spec.gen;
                let started = started.clone();
                std::thread::spawn(move || {
                    let mut first = true;
                    s.generate_tokens(&prompt, opts(gen), |_| {
                        if std::mem::take(&mut first) {
                            started.fetch_add(1, Ordering::SeqCst);
                        }
                        true
                    })
                })
            })
            .collect();
        // Once every stream is decoding, one more request of the same prompt length arrives:
        // its time to first token while the others stream (continuous batching lets it in at
        // the next step boundary instead of behind them).
        let mut late_ttft_ms = None;
        if late {
            while started.load(Ordering::SeqCst) < concurrency && handles.iter().any(|h| !h.is_finished()) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let r = session.generate_tokens(&random_prompt(vocab, spec.prompt_len, 7_777 + run as u64), opts(2), |_| true)?;
            late_ttft_ms = Some(r1(r.usage.queue_ms + r.usage.ttft_ms));
        }
        let mut replies = vec![];
        for h in handles {
            replies.push(h.join().map_err(|_| Error::Mlx("a benchmark stream panicked".into()))??);
        }
        let wall = t0.elapsed().as_secs_f64();
        let generated: usize = replies.iter().map(|r| r.usage.completion_tokens).sum();
        let mut ttft: Vec<f64> = replies.iter().map(|r| r.usage.queue_ms + r.usage.ttft_ms).collect();
        ttft.sort_by(f64::total_cmp);
        let mut per_stream: Vec<f64> = replies.iter().map(|r| r.usage.decode_tokens_per_second).collect();
        per_stream.sort_by(f64::total_cmp);
        let pct = |v: &[f64], p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        // Where a decode step's time goes (each stream's mean; the median stream): building the
        // step's graph, MLX encoding it, and waiting for the device.
        let step_ms = |f: fn(&crate::Usage) -> f64| {
            let mut v: Vec<f64> = replies.iter().map(|r| f(&r.usage)).collect();
            v.sort_by(f64::total_cmp);
            (pct(&v, 0.5) * 1000.0).round() / 1000.0
        };
        report(json!({
            "engine": "mlex", "model": label, "bits": spec.bits, "run": run, "concurrency": concurrency,
            "prompt_tokens": spec.prompt_len, "gen_tokens": spec.gen,
            "aggregate_tok_s": r1(generated as f64 / wall), "per_stream_decode_tok_s": r1(pct(&per_stream, 0.5)),
            "ttft_p50_ms": r1(pct(&ttft, 0.5)), "ttft_p95_ms": r1(pct(&ttft, 0.95)), "wall_s": r1(wall),
            "late_ttft_ms": late_ttft_ms,
            "schedule_ms_per_step": step_ms(|u| u.schedule_ms_per_step),
            "submit_ms_per_step": step_ms(|u| u.submit_ms_per_step),
            "wait_ms_per_step": step_ms(|u| u.wait_ms_per_step),
            "batch_size": replies.iter().map(|r| r.usage.batch_size).max().unwrap_or(1),
            "batched": replies.iter().all(|r| r.usage.batched),
            "device": session.info().device, "dtype": session.info().dtype,
        }));
    }
    Ok(())
}

/// New tokens of the second turn (a user message) after the first turn and its reply.
pub const SECOND_TURN_NEW_TOKENS: usize = 64;

/// The prompt cache's effect on a conversation: per round, a first turn of `prompt_len` tokens
/// generating `gen` tokens, then a second turn (first turn + reply + [`SECOND_TURN_NEW_TOKENS`]
/// new tokens) timed twice to its first token: from the pool (cached) and with
/// `prompt_cache: Some(false)` (cold), alternating which goes first. Each round uses a fresh first
/// turn so rounds do not share a prefix. Reports one JSON object per round.
pub fn run_prompt_cache(spec: &BenchSpec, mut report: impl FnMut(Value)) -> Result<()> {
    let mut spec_long_ttl = BenchSpec { load: spec.load.clone(), model: spec.model.clone(), shape: spec.shape.clone(), ..*spec };
    // A cold turn can take minutes on a slow CPU: measure the cache, not its idle expiry.
    spec_long_ttl.load.prompt_cache.ttl = spec.load.prompt_cache.ttl.max(std::time::Duration::from_secs(24 * 3600));
    let spec = &spec_long_ttl;
    let (session, label) = load(spec)?;
    let vocab = session.info().vocab_size as u64;
    let opts = |n, cache: bool| GenerateOptions {
        max_tokens: n,
        ignore_eos: true,
        prompt_cache: Some(cache),
        ..Default::default()
    };
    // Warm-up, off the pool.
    session.generate_tokens(&random_prompt(vocab, 64, 999), opts(2, false), |_| true)?;
    // Time to the first streamed token as the caller sees it (lookup and channel included), and
    // the engine's own figure.
    let ttft = |prompt: &[u32], cache: bool| -> Result<(f64, f64, usize)> {
        let t = Instant::now();
        let mut first = None;
        let r = session.generate_tokens(prompt, opts(1, cache), |_| {
            first.get_or_insert_with(|| t.elapsed().as_secs_f64());
            true
        })?;
        let wall = first.unwrap_or_else(|| t.elapsed().as_secs_f64());
        Ok((wall * 1e3, r.usage.ttft_ms, r.usage.cached_tokens))
    };
    let round2 = |x: f64| (x * 100.0).round() / 100.0;
    for run in 0..spec.runs {
        let first = random_prompt(vocab, spec.prompt_len.max(1), run as u64 + 1);
        let t = Instant::now();
        let r1 = session.generate_tokens(&first, opts(spec.gen, true), |_| true)?;
        let first_turn_ms = t.elapsed().as_secs_f64() * 1e3;
        let mut second = first.clone();
        second.extend_from_slice(&r1.tokens);
        second.extend_from_slice(&random_prompt(vocab, SECOND_TURN_NEW_TOKENS, 1000 + run as u64));
        // Cold does not touch the pool, so the order does not change what the cached call finds;
        // alternate anyway so that drift (heat, other load) hits both alike.
        let (cold, cached) = if run % 2 == 0 {
            let c = ttft(&second, false)?;
            (c, ttft(&second, true)?)
        } else {
            let h = ttft(&second, true)?;
            (ttft(&second, false)?, h)
        };
        if cached.2 == 0 {
            return Err(Error::Mlx("the second turn found nothing in the prompt cache".into()));
        }
        report(json!({
            "engine": "mlex", "model": label, "bits": spec.bits, "run": run,
            "first_turn_tokens": first.len(), "first_turn_gen": r1.tokens.len(),
            "first_turn_ms": round2(first_turn_ms),
            "second_turn_tokens": second.len(),
            "cached_tokens": cached.2,
            "cold_ttft_ms": round2(cold.0), "cached_ttft_ms": round2(cached.0),
            "cold_engine_ttft_ms": round2(cold.1), "cached_engine_ttft_ms": round2(cached.1),
            "speedup": round2(cold.0 / cached.0),
            "device": session.info().device, "dtype": session.info().dtype,
        }));
    }
    Ok(())
}

fn load(spec: &BenchSpec) -> Result<(Session, String)> {
    Ok(match (&spec.model, &spec.shape) {
        (Some(m), None) => (Session::load_with_options(m, spec.load.clone())?, m.clone()),
        (None, Some(shape)) => {
            let mut cfg = shape_config(shape)?;
            if spec.bits > 0 {
                cfg["quantization"] = json!({"group_size": spec.group_size, "bits": spec.bits, "mode": "affine"});
            }
            (Session::load_random(&cfg.to_string(), 0, spec.load.clone())?, shape.clone())
        }
        _ => return Err(Error::InvalidArgument("give exactly one of --model and --shape".into())),
    })
}

/// A fixed pseudo-random prompt (the content does not matter for speed, only its length).
fn random_prompt(vocab: u64, len: usize, stream: u64) -> Vec<u32> {
    let mut s = 0x2545F4914F6CDD1Du64 ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..len.max(1))
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab) as u32
        })
        .collect()
}
