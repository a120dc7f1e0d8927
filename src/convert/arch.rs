//! Architectures: GGUF metadata → HF/mlx-lm config, GGUF tensor names → HF/mlx-lm names.
use serde_json::{json, Map, Value as Json};

use crate::error::Result;
use crate::gguf::GgufFile;

/// Architectures this converter knows (`general.architecture`).
pub const SUPPORTED_ARCHS: &[&str] = &["llama", "qwen2", "qwen3", "qwen3moe", "gemma3"];

/// Mixture-of-experts hyper-parameters (qwen3moe).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeParams {
    pub n_experts: u64,
    pub n_experts_used: u64,
    /// Rows of each expert's gate/up projection (`expert_feed_forward_length`).
    pub expert_ff: u64,
    /// Renormalise the top-k routing weights (`expert_weights_norm`; llama.cpp's qwen3moe always does).
    pub norm_topk_prob: bool,
}

/// Gemma 3 hyper-parameters that llama.cpp partly hard-codes rather than stores.
#[derive(Debug, Clone, PartialEq)]
pub struct GemmaParams {
    /// 0: no sliding-window layers.
    pub sliding_window: u64,
    /// Layer i is global when `i % pattern == pattern - 1`; 1: every layer global.
    pub sliding_window_pattern: u64,
    /// Rope base of the sliding-window layers (`rope.freq_base_swa`, llama.cpp's default 10000).
    pub rope_local_base: f64,
    pub query_pre_attn_scalar: f64,
    pub final_logit_softcapping: Option<f64>,
}

/// Hyper-parameters read from the GGUF metadata.
#[derive(Debug, Clone)]
pub struct Hparams {
    pub arch: String,
    pub hidden_size: u64,
    pub n_layers: u64,
    pub intermediate_size: u64,
    pub n_heads: u64,
    pub n_kv_heads: u64,
    pub head_dim: u64,
    pub head_dim_explicit: bool,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub context_length: u64,
    pub vocab_size: u64,
    pub rope_scaling: Option<Json>,
    pub moe: Option<MoeParams>,
    pub gemma: Option<GemmaParams>,
}

impl Hparams {
    pub fn read(g: &GgufFile) -> Result<Self> {
        let arch = g
            .get_str("general.architecture")?
            .ok_or_else(|| g.err("missing metadata key 'general.architecture'"))?
            .to_string();
        if !SUPPORTED_ARCHS.contains(&arch.as_str()) {
            return Err(g.err(format!(
                "unsupported architecture '{arch}' (general.architecture); the GGUF converter supports {}",
                SUPPORTED_ARCHS.join(", ")
            )));
        }
        let k = |s: &str| format!("{arch}.{s}");
        let req = |s: &str| -> Result<u64> {
            let key = k(s);
            let v = g.get_u64(&key)?.ok_or_else(|| g.err(format!("missing metadata key '{key}'")))?;
            if v == 0 || v > (1 << 40) {
                return Err(g.err(format!("metadata key '{key}' = {v} is out of range")));
            }
            Ok(v)
        };
        let hidden_size = req("embedding_length")?;
        let n_layers = req("block_count")?;
        // MoE models have no dense layer here: the dense size is only a config field.
        let intermediate_size = if arch == "qwen3moe" {
            g.get_u64(&k("feed_forward_length"))?.unwrap_or(0)
        } else {
            req("feed_forward_length")?
        };
        let n_heads = req("attention.head_count")?;
        let n_kv_heads = match g.get_u64(&k("attention.head_count_kv"))? {
            Some(0) | None => n_heads,
            Some(v) => v,
        };
        if n_heads % n_kv_heads != 0 {
            return Err(g.err(format!(
                "attention.head_count {n_heads} is not a multiple of attention.head_count_kv {n_kv_heads}"
            )));
        }
        let (head_dim, head_dim_explicit) = match g.get_u64(&k("attention.key_length"))? {
            Some(v) if v > 0 => (v, true),
            _ => {
                if hidden_size % n_heads != 0 {
                    return Err(g.err(format!(
                        "embedding_length {hidden_size} is not a multiple of attention.head_count {n_heads} and no attention.key_length is given"
                    )));
                }
                (hidden_size / n_heads, false)
            }
        };
        if head_dim % 2 != 0 {
            return Err(g.err(format!("head dimension {head_dim} is odd")));
        }
        let rms_norm_eps = g.get_f64(&k("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6);
        let default_theta = if arch == "llama" { 10_000.0 } else { 1_000_000.0 };
        let rope_theta = g.get_f64(&k("rope.freq_base"))?.unwrap_or(default_theta);
        let context_length = g.get_u64(&k("context_length"))?.unwrap_or(if arch == "llama" { 2048 } else { 32768 });
        let n_vocab_tokens = g.get_array("tokenizer.ggml.tokens")?.map(|t| t.len() as u64);
        let vocab_size = match g.get_u64(&k("vocab_size"))? {
            Some(v) => v,
            None => match g.tensor("token_embd.weight") {
                Some(t) if t.dims.len() == 2 => t.dims[1],
                _ => n_vocab_tokens.ok_or_else(|| g.err("cannot determine the vocabulary size"))?,
            },
        };

        let rope_scaling = match g.get_str(&k("rope.scaling.type"))? {
            None | Some("none") => None,
            Some(t) => {
                let factor = g.get_f64(&k("rope.scaling.factor"))?;
                let orig = g.get_u64(&k("rope.scaling.original_context_length"))?;
                match t {
                    "linear" => factor.map(|f| json!({"type": "linear", "rope_type": "linear", "factor": f})),
                    "yarn" => {
                        let mut m = Map::new();
                        m.insert("type".into(), "yarn".into());
                        m.insert("rope_type".into(), "yarn".into());
                        if let Some(f) = factor {
                            m.insert("factor".into(), json!(f));
                        }
                        if let Some(o) = orig {
                            m.insert("original_max_position_embeddings".into(), json!(o));
                        }
                        Some(Json::Object(m))
                    }
                    other => {
                        return Err(g.err(format!("unsupported rope scaling type '{other}' ({})", k("rope.scaling.type"))))
                    }
                }
            }
        };

        let moe = if arch == "qwen3moe" {
            let n_experts = req("expert_count")?;
            let n_experts_used = req("expert_used_count")?;
            if n_experts_used > n_experts {
                return Err(g.err(format!(
                    "{} = {n_experts_used} exceeds {} = {n_experts}",
                    k("expert_used_count"),
                    k("expert_count")
                )));
            }
            // llama.cpp's fallback when the expert size is not stored: n_ff / n_expert_used.
            let expert_ff = match g.get_u64(&k("expert_feed_forward_length"))? {
                Some(v) if v > 0 => v,
                _ if intermediate_size > 0 => intermediate_size / n_experts_used,
                _ => return Err(g.err(format!("missing metadata key '{}'", k("expert_feed_forward_length")))),
            };
            let norm_topk_prob = g.get_bool(&k("expert_weights_norm"))?.unwrap_or(true);
            Some(MoeParams { n_experts, n_experts_used, expert_ff, norm_topk_prob })
        } else {
            None
        };
        let intermediate_size = match &moe {
            Some(m) if intermediate_size == 0 => m.expert_ff,
            _ => intermediate_size,
        };

        let gemma = if arch == "gemma3" {
            // As llama.cpp's gemma3 loader: sliding window from the file (absent or 0: none), the
            // pattern stored as a number or per-layer flags (default 6), local rope base 10000.
            let sliding_window = g.get_u64(&k("attention.sliding_window"))?.unwrap_or(0);
            let pattern_key = k("attention.sliding_window_pattern");
            let sliding_window_pattern = if sliding_window == 0 {
                1
            } else if let Some(flags) = g.get(&pattern_key).and_then(|v| v.as_array()) {
                let flags: Vec<bool> = flags
                    .iter()
                    .map(|v| v.as_bool().or_else(|| v.as_int().map(|i| i != 0)))
                    .collect::<Option<_>>()
                    .ok_or_else(|| g.err(format!("metadata key '{pattern_key}' is not an array of booleans")))?;
                swa_period(&flags).ok_or_else(|| {
                    g.err(format!(
                        "metadata key '{pattern_key}': per-layer sliding-window flags {flags:?} are not a repeating \
                         'n-1 sliding, 1 global' pattern, which is all mlx-lm's gemma3_text can express"
                    ))
                })?
            } else {
                match g.get_u64(&pattern_key)? {
                    Some(0) => 1,
                    Some(v) => v,
                    None => 6,
                }
            };
            let rope_local_base = g.get_f64(&k("rope.freq_base_swa"))?.unwrap_or(10_000.0);
            // llama.cpp: the 27B (62 layers) scales by hidden/heads, the others by head_dim.
            let query_pre_attn_scalar = match g.get_f64(&k("attention.scale"))? {
                Some(s) if s > 0.0 => 1.0 / (s * s),
                _ if n_layers == 62 => (hidden_size / n_heads) as f64,
                _ => head_dim as f64,
            };
            let final_logit_softcapping = g.get_f64(&k("final_logit_softcapping"))?.filter(|v| *v > 0.0);
            Some(GemmaParams { sliding_window, sliding_window_pattern, rope_local_base, query_pre_attn_scalar, final_logit_softcapping })
        } else {
            None
        };

        Ok(Hparams {
            arch,
            hidden_size,
            n_layers,
            intermediate_size,
            n_heads,
            n_kv_heads,
            head_dim,
            head_dim_explicit,
            rms_norm_eps,
            rope_theta,
            context_length,
            vocab_size,
            rope_scaling,
            moe,
            gemma,
        })
    }

    /// llama.cpp permutes the rows of Q and K for llama-family architectures (its rope kernel
    /// pairs adjacent values, HF's pairs halves): its `LlamaModel.permute` runs in the llama
    /// converter only. qwen2, qwen3, qwen3moe and gemma3 are converted without it (their rope in
    /// llama.cpp is NEOX-style, halves like HF).
    pub fn qk_permuted(&self) -> bool {
        self.arch == "llama"
    }

    /// The model_type / architectures strings for config.json.
    pub fn model_type(&self) -> (&'static str, &'static str) {
        match self.arch.as_str() {
            "qwen2" => ("qwen2", "Qwen2ForCausalLM"),
            "qwen3" => ("qwen3", "Qwen3ForCausalLM"),
            "qwen3moe" => ("qwen3_moe", "Qwen3MoeForCausalLM"),
            "gemma3" => ("gemma3_text", "Gemma3ForCausalLM"),
            _ => ("llama", "LlamaForCausalLM"),
        }
    }

    /// Per-head RMSNorm on q and k (`attn_q_norm` / `attn_k_norm`).
    pub fn has_qk_norm(&self) -> bool {
        matches!(self.arch.as_str(), "qwen3" | "qwen3moe" | "gemma3")
    }

    /// The GGUF tensors every layer must have.
    pub fn required_layer_tensors(&self) -> Vec<&'static str> {
        let mut v = vec!["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm"];
        if self.has_qk_norm() {
            v.extend(["attn_q_norm", "attn_k_norm"]);
        }
        if self.arch == "gemma3" {
            v.extend(["post_attention_norm", "post_ffw_norm"]);
        }
        if self.moe.is_some() {
            v.extend(["ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]);
        } else {
            v.extend(["ffn_gate", "ffn_up", "ffn_down"]);
        }
        v
    }

    /// config.json without the quantization section.
    pub fn config_json(&self, tie: bool, attention_bias: bool, bos: Option<u64>, eos: Option<u64>, dtype: &str) -> Map<String, Json> {
        let (mt, archs) = self.model_type();
        let mut c = Map::new();
        c.insert("architectures".into(), json!([archs]));
        c.insert("model_type".into(), json!(mt));
        c.insert("hidden_size".into(), json!(self.hidden_size));
        c.insert("num_hidden_layers".into(), json!(self.n_layers));
        c.insert("intermediate_size".into(), json!(self.intermediate_size));
        c.insert("num_attention_heads".into(), json!(self.n_heads));
        c.insert("num_key_value_heads".into(), json!(self.n_kv_heads));
        c.insert("head_dim".into(), json!(self.head_dim));
        c.insert("rms_norm_eps".into(), json!(shortest_f32(self.rms_norm_eps)));
        c.insert("rope_theta".into(), json!(shortest_f32(self.rope_theta)));
        c.insert("max_position_embeddings".into(), json!(self.context_length));
        c.insert("vocab_size".into(), json!(self.vocab_size));
        c.insert("tie_word_embeddings".into(), json!(tie));
        if let Some(gm) = &self.gemma {
            c.insert("hidden_activation".into(), json!("gelu_pytorch_tanh"));
            c.insert("rope_local_base_freq".into(), json!(shortest_f32(gm.rope_local_base)));
            // An integer where it is one: transformers' Gemma3TextConfig insists on int there.
            let qpas = gm.query_pre_attn_scalar;
            let qpas = if qpas.fract() == 0.0 && qpas.abs() < 1e15 { json!(qpas as i64) } else { json!(qpas) };
            c.insert("query_pre_attn_scalar".into(), qpas);
            c.insert("sliding_window".into(), json!(gm.sliding_window.max(1)));
            c.insert("sliding_window_pattern".into(), json!(gm.sliding_window_pattern));
            if let Some(cap) = gm.final_logit_softcapping {
                c.insert("final_logit_softcapping".into(), json!(shortest_f32(cap)));
            }
        } else {
            c.insert("hidden_act".into(), json!("silu"));
        }
        if mt == "llama" {
            c.insert("attention_bias".into(), json!(attention_bias));
            c.insert("mlp_bias".into(), json!(false));
        }
        if mt == "qwen3" || mt == "qwen3_moe" {
            c.insert("attention_bias".into(), json!(false));
        }
        if let Some(m) = &self.moe {
            c.insert("num_experts".into(), json!(m.n_experts));
            c.insert("num_experts_per_tok".into(), json!(m.n_experts_used));
            c.insert("moe_intermediate_size".into(), json!(m.expert_ff));
            c.insert("norm_topk_prob".into(), json!(m.norm_topk_prob));
            // llama.cpp's qwen3moe makes every layer sparse.
            c.insert("decoder_sparse_step".into(), json!(1));
            c.insert("mlp_only_layers".into(), json!([]));
        }
        c.insert("rope_scaling".into(), self.rope_scaling.clone().unwrap_or(Json::Null));
        if let Some(b) = bos {
            c.insert("bos_token_id".into(), json!(b));
        }
        if let Some(e) = eos {
            c.insert("eos_token_id".into(), json!(e));
        }
        c.insert("torch_dtype".into(), json!(dtype));
        c
    }
}

/// GGUF stores these as f32: write the shortest decimal that reads back as the same f32
/// (1e-05, not 9.999999747378752e-06), as HF configs have them.
fn shortest_f32(v: f64) -> f64 {
    let f = v as f32;
    if f as f64 == v || (f as f64 - v).abs() <= f64::EPSILON * v.abs() {
        format!("{f}").parse().unwrap_or(v)
    } else {
        v
    }
}

/// The period n of per-layer sliding-window flags of the form (n−1 sliding, 1 global) repeated
/// (a trailing partial period allowed): the only layouts mlx-lm's gemma3_text expresses.
pub fn swa_period(flags: &[bool]) -> Option<u64> {
    if flags.iter().all(|&f| !f) {
        return Some(1);
    }
    let n = flags.iter().position(|&f| !f)? + 1;
    flags.iter().enumerate().all(|(i, &f)| f == (i % n != n - 1)).then_some(n as u64)
}

/// What a GGUF tensor becomes.
#[derive(Debug, Clone, PartialEq)]
pub struct Mapped {
    /// HF module path, e.g. `model.layers.3.self_attn.q_proj`.
    pub module: String,
    /// `weight` or `bias`.
    pub param: &'static str,
    /// A Linear or Embedding weight (quantizable).
    pub quantizable: bool,
    /// Q/K rows to un-permute: number of heads of this projection.
    pub unpermute_heads: Option<u64>,
    /// Added to every value (gemma3's norms: llama.cpp stores `1 + w`, MLX/HF add the 1 at run time).
    pub shift: f32,
}

/// Map a GGUF tensor name; `Ok(None)` for tensors that are deliberately dropped.
pub fn map_name(h: &Hparams, name: &str) -> std::result::Result<Option<Mapped>, String> {
    let (base, param) = if let Some(b) = name.strip_suffix(".weight") {
        (b, "weight")
    } else if let Some(b) = name.strip_suffix(".bias") {
        (b, "bias")
    } else {
        return Err(format!("unexpected tensor '{name}' (no .weight/.bias suffix)"));
    };
    let gemma = h.arch == "gemma3";
    let m = |module: String, quantizable: bool, heads: Option<u64>| {
        let is_norm = module.ends_with("norm") || module.ends_with("layernorm");
        Ok(Some(Mapped {
            module,
            param,
            quantizable: quantizable && param == "weight",
            unpermute_heads: if h.qk_permuted() { heads } else { None },
            shift: if gemma && is_norm && param == "weight" { -1.0 } else { 0.0 },
        }))
    };
    match base {
        "token_embd" => return m("model.embed_tokens".into(), true, None),
        "output_norm" => return m("model.norm".into(), false, None),
        "output" => return m("lm_head".into(), true, None),
        // llama3-style rope frequency factors: baked into rope_scaling by HF, not a weight.
        "rope_freqs" => return Ok(None),
        _ => {}
    }
    let unknown = || format!("unknown tensor '{name}' for architecture '{}'", h.arch);
    let rest = base.strip_prefix("blk.").ok_or_else(unknown)?;
    let (idx, part) = rest.split_once('.').ok_or_else(unknown)?;
    let layer: u64 = idx.parse().map_err(|_| unknown())?;
    if layer >= h.n_layers {
        return Err(format!("tensor '{name}': layer {layer} but block_count is {}", h.n_layers));
    }
    let p = format!("model.layers.{layer}");
    let moe = h.moe.is_some();
    match part {
        "attn_norm" => m(format!("{p}.input_layernorm"), false, None),
        // gemma3's ffn_norm is the norm before the MLP; the others' the one after attention.
        "ffn_norm" if gemma => m(format!("{p}.pre_feedforward_layernorm"), false, None),
        "ffn_norm" => m(format!("{p}.post_attention_layernorm"), false, None),
        "post_attention_norm" if gemma => m(format!("{p}.post_attention_layernorm"), false, None),
        "post_ffw_norm" if gemma => m(format!("{p}.post_feedforward_layernorm"), false, None),
        "attn_q_norm" if h.has_qk_norm() => m(format!("{p}.self_attn.q_norm"), false, None),
        "attn_k_norm" if h.has_qk_norm() => m(format!("{p}.self_attn.k_norm"), false, None),
        "attn_q" => m(format!("{p}.self_attn.q_proj"), true, Some(h.n_heads)),
        "attn_k" => m(format!("{p}.self_attn.k_proj"), true, Some(h.n_kv_heads)),
        "attn_v" => m(format!("{p}.self_attn.v_proj"), true, None),
        "attn_output" => m(format!("{p}.self_attn.o_proj"), true, None),
        "ffn_gate" if !moe => m(format!("{p}.mlp.gate_proj"), true, None),
        "ffn_up" if !moe => m(format!("{p}.mlp.up_proj"), true, None),
        "ffn_down" if !moe => m(format!("{p}.mlp.down_proj"), true, None),
        "ffn_gate_inp" if moe => m(format!("{p}.mlp.gate"), true, None),
        "ffn_gate_exps" if moe => m(format!("{p}.mlp.switch_mlp.gate_proj"), true, None),
        "ffn_up_exps" if moe => m(format!("{p}.mlp.switch_mlp.up_proj"), true, None),
        "ffn_down_exps" if moe => m(format!("{p}.mlp.switch_mlp.down_proj"), true, None),
        "attn_qkv" | "ffn_gate_up_exps" => Err(format!(
            "tensor '{name}': fused projections (llama.cpp's --fuse options) are not supported by the converter"
        )),
        "attn_rot_embd" => Ok(None),
        _ => Err(unknown()),
    }
}

/// Expected row-major shape of a mapped tensor (checked before anything is written).
pub fn expected_shape(h: &Hparams, mp: &Mapped) -> Option<Vec<u64>> {
    let hs = h.hidden_size;
    let q = h.n_heads * h.head_dim;
    let kv = h.n_kv_heads * h.head_dim;
    // The module path after `model.layers.N.` (or the whole path outside the layers).
    let local = match mp.module.strip_prefix("model.layers.") {
        Some(r) => r.split_once('.').map_or(r, |(_, rest)| rest),
        None => mp.module.as_str(),
    };
    Some(match (local, mp.param) {
        ("model.embed_tokens", _) | ("lm_head", _) => vec![h.vocab_size, hs],
        ("model.norm", _)
        | ("input_layernorm", _)
        | ("post_attention_layernorm", _)
        | ("pre_feedforward_layernorm", _)
        | ("post_feedforward_layernorm", _) => vec![hs],
        ("self_attn.q_norm", _) | ("self_attn.k_norm", _) => vec![h.head_dim],
        ("self_attn.q_proj", "weight") => vec![q, hs],
        ("self_attn.q_proj", "bias") => vec![q],
        ("self_attn.k_proj", "weight") | ("self_attn.v_proj", "weight") => vec![kv, hs],
        ("self_attn.k_proj", "bias") | ("self_attn.v_proj", "bias") => vec![kv],
        ("self_attn.o_proj", "weight") => vec![hs, q],
        ("mlp.gate_proj", "weight") | ("mlp.up_proj", "weight") => vec![h.intermediate_size, hs],
        ("mlp.down_proj", "weight") => vec![hs, h.intermediate_size],
        (l, "weight") if h.moe.is_some() => {
            let moe = h.moe.as_ref()?;
            let (e, ff) = (moe.n_experts, moe.expert_ff);
            match l {
                "mlp.gate" => vec![e, hs],
                "mlp.switch_mlp.gate_proj" | "mlp.switch_mlp.up_proj" => vec![e, ff, hs],
                "mlp.switch_mlp.down_proj" => vec![e, hs, ff],
                _ => return None,
            }
        }
        _ => return None,
    })
}

/// For output row `r` of an un-permuted Q/K matrix with `rows` rows and `heads` heads, the source
/// row in the GGUF (permuted) matrix. GGUF row `h*hd + 2i + t` holds HF row `h*hd + t*hd/2 + i`.
#[inline]
pub fn unpermute_src_row(r: u64, rows: u64, heads: u64) -> u64 {
    let hd = rows / heads;
    let half = hd / 2;
    let (h, within) = (r / hd, r % hd);
    let (t, i) = (within / half, within % half);
    h * hd + 2 * i + t
}

/// The llama3 rope factors for (factor, low_freq_factor, high_freq_factor, original context), one
/// per rotary frequency `theta^(-2i/head_dim)`, as HF's llama3 rope scaling defines them.
pub fn llama3_rope_factors(theta: f64, head_dim: u64, factor: f64, lo: f64, hi: f64, orig: f64) -> Vec<f64> {
    let (lo_wl, hi_wl) = (orig / lo, orig / hi);
    (0..head_dim / 2)
        .map(|i| {
            let freq = theta.powf(-(2.0 * i as f64) / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < hi_wl {
                1.0
            } else if wavelen > lo_wl {
                factor
            } else {
                let smooth = (orig / wavelen - lo) / (hi - lo);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect()
}

/// Recover HF's `rope_scaling` (llama3 type) from llama.cpp's `rope_freqs.weight` factors.
/// The smooth region is linear in 1/wavelength, which fixes low/high_freq_factor for a given
/// original context length; the result is accepted only if it reproduces every factor.
pub fn infer_llama3_rope_scaling(factors: &[f32], theta: f64, head_dim: u64, orig: Option<u64>) -> Option<Json> {
    if factors.len() as u64 != head_dim / 2 || factors.is_empty() {
        return None;
    }
    let factor = factors.iter().copied().fold(f32::MIN, f32::max) as f64;
    if !(factor > 1.0 + 1e-6) {
        return None;
    }
    let orig = orig.unwrap_or(8192) as f64;
    // Points of the smooth region: s(x) = a·x + b with x = 1/wavelength.
    let mut pts = Vec::new();
    for (i, &f) in factors.iter().enumerate() {
        let f = f as f64;
        if f > 1.0 + 1e-4 && f < factor * (1.0 - 1e-4) {
            let freq = theta.powf(-(2.0 * i as f64) / head_dim as f64);
            let x = freq / (2.0 * std::f64::consts::PI);
            let s = (1.0 / f - 1.0 / factor) / (1.0 - 1.0 / factor);
            pts.push((x, s));
        }
    }
    let (lo, hi) = if pts.len() >= 2 {
        let n = pts.len() as f64;
        let (mx, my) = (pts.iter().map(|p| p.0).sum::<f64>() / n, pts.iter().map(|p| p.1).sum::<f64>() / n);
        let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        let sxx: f64 = pts.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
        if sxx == 0.0 {
            return None;
        }
        let a = sxy / sxx;
        let b = my - a * mx;
        let lo = -b * orig / a;
        let hi = lo + orig / a;
        // Clean up values that are integers up to float noise (1.0, 4.0 in every llama3 release).
        let clean = |v: f64| if (v - v.round()).abs() < 1e-3 { v.round() } else { v };
        (clean(lo), clean(hi))
    } else {
        (1.0, 4.0)
    };
    let re = llama3_rope_factors(theta, head_dim, factor, lo, hi, orig);
    let ok = re.iter().zip(factors).all(|(a, &b)| ((a - b as f64) / (b as f64)).abs() < 1e-3);
    ok.then(|| {
        json!({
            "rope_type": "llama3",
            "factor": shortest_f32(factor),
            "low_freq_factor": lo,
            "high_freq_factor": hi,
            "original_max_position_embeddings": orig as u64,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_matches_reshape_swapaxes() {
        // rows = heads * hd; GGUF row h*hd + 2i + t holds HF row h*hd + t*hd/2 + i.
        let (rows, heads) = (12u64, 2u64);
        let src: Vec<u64> = (0..rows).map(|r| unpermute_src_row(r, rows, heads)).collect();
        assert_eq!(src, vec![0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11]);
    }

    #[test]
    fn swa_period_of_flags() {
        let f = |s: &str| s.chars().map(|c| c == 's').collect::<Vec<_>>();
        assert_eq!(swa_period(&f("sssssgsssssgsssssg")), Some(6));
        assert_eq!(swa_period(&f("sgsgs")), Some(2));
        assert_eq!(swa_period(&f("gggg")), Some(1));
        assert_eq!(swa_period(&f("ssgsgs")), None);
        assert_eq!(swa_period(&f("ssss")), None);
        assert_eq!(swa_period(&f("sssssgsssssgssss")), Some(6), "a trailing partial period");
    }

    #[test]
    fn llama3_rope_scaling_round_trip() {
        for (theta, hd, factor, lo, hi, orig) in
            [(500000.0, 64, 32.0, 1.0, 4.0, 8192.0), (500000.0, 128, 8.0, 1.0, 4.0, 8192.0), (10000.0, 64, 4.0, 2.0, 8.0, 4096.0)]
        {
            let f: Vec<f32> = llama3_rope_factors(theta, hd, factor, lo, hi, orig).iter().map(|&v| v as f32).collect();
            let j = infer_llama3_rope_scaling(&f, theta, hd, Some(orig as u64)).expect("inferred");
            assert_eq!(j["factor"], json!(factor));
            assert_eq!(j["low_freq_factor"], json!(lo), "{j}");
            assert_eq!(j["high_freq_factor"], json!(hi), "{j}");
        }
        assert!(infer_llama3_rope_scaling(&[1.0; 32], 10000.0, 64, None).is_none());
    }
}
