//! qwen3_next (Qwen3-Next-80B-A3B), qwen3_5 and qwen3_5_moe (Qwen3.5). Follows mlx-lm
//! `models/qwen3_next.py`, `models/qwen3_5.py`, `models/qwen3_5_moe.py` and
//! `models/gated_delta.py` (the recurrence itself is `nn::gated_delta`: our CPU / CUDA kernel).
//!
//! Hybrid layers: every `full_attention_interval`-th layer is full attention (q_proj also yields a
//! per-head output gate, `o_proj(attn · sigmoid(gate))`; q/k RMSNorm; rotary over the first
//! `head_dim · partial_rotary_factor` dims), the others are gated delta-net linear attention: the
//! projected q/k/v go through a short causal depthwise conv1d (its last `kernel - 1` inputs kept
//! as state), SiLU, L2-normalised q/k, then the recurrence per token
//! `S = S·g; S += k ⊗ ((v − S·k)·β); y = S·q` with `g = exp(−exp(A_log)·softplus(a + dt_bias))`,
//! `β = sigmoid(b)`, and an RMSNorm gated by SiLU(z) on the output. The feed-forward part is a
//! dense SwiGLU MLP or a mixture of experts with a sigmoid-gated shared expert.
//!
//! Checkpoint layouts: qwen3_next fuses q/k/v/z (`in_proj_qkvz`, grouped per key head) and b/a
//! (`in_proj_ba`); qwen3_5 keeps `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`, nests its
//! text model in `text_config` (weights under `language_model.` / `model.language_model.`); its
//! vision tower, when config.json has a `vision_config`, is `qwen_vision.rs` (the full-attention
//! layers then take mlx-vlm's 3-D interleaved rope positions: `forward_embeddings_at`,
//! `mrope.rs`). As mlx-lm's sanitize does for Hugging Face checkpoints (qwen3_next:
//! per-expert tensors present; qwen3_5: conv1d weights stored `[C, 1, K]`): conv1d weights are
//! moved to `[C, K, 1]`, the decoder's RMSNorm weights become `1 + w`, experts are stacked
//! (qwen3_5_moe splits its fused `experts.gate_up_proj`) and `mtp.*` weights are dropped.
use super::mrope::{rotate_grid, MropeStyle, RopePositions};
use super::qwen3_moe::validate_experts;
use super::stack::{FeedForwardPart, Layer, Mixer, PreNormBlock};
use super::transformer::validate_heads;
use super::{run_layers, ArchConfig, Architecture, CausalLm, LmHead, Loadable};
use crate::error::{Error, Result};
use crate::loader::{check_size, ModelConfig, RopeConfig, RopeFields, Vb};
use crate::mlx::{fast, Array, Dtype};
use crate::nn::gated_delta::gated_delta_update;
use crate::nn::moe::stack_experts;
use crate::nn::{
    Cache, Embedding, ExpertActivation, GateActivation, GatedMlp, KvCache, LayerCaches, Linear, Params, Projections,
    RmsNorm, Rope, Routing, SparseMoe, StateCache, SwitchGlu,
};
use serde::Deserialize;

// ---- config -------------------------------------------------------------------------------

/// config.json (the merged `text_config` for qwen3_5). Fields mlx-lm's qwen3_next requires are
/// options here: [`Config::validate`] names a missing one; qwen3_5 gives them its defaults.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    pub model_type: String,
    #[serde(default)]
    pub outer_model_type: Option<String>,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub vocab_size: usize,
    #[serde(default)]
    pub intermediate_size: Option<usize>,
    #[serde(default)]
    pub num_attention_heads: Option<usize>,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default)]
    pub rms_norm_eps: Option<f32>,
    #[serde(default)]
    pub linear_num_value_heads: Option<usize>,
    #[serde(default)]
    pub linear_num_key_heads: Option<usize>,
    #[serde(default)]
    pub linear_key_head_dim: Option<usize>,
    #[serde(default)]
    pub linear_value_head_dim: Option<usize>,
    #[serde(default)]
    pub linear_conv_kernel_dim: Option<usize>,
    #[serde(default)]
    pub full_attention_interval: Option<usize>,
    #[serde(default)]
    pub num_experts: Option<usize>,
    #[serde(default)]
    pub num_experts_per_tok: Option<usize>,
    #[serde(default)]
    pub decoder_sparse_step: Option<usize>,
    #[serde(default)]
    pub shared_expert_intermediate_size: Option<usize>,
    #[serde(default)]
    pub moe_intermediate_size: Option<usize>,
    #[serde(default)]
    pub mlp_only_layers: Option<Vec<usize>>,
    #[serde(default)]
    pub norm_topk_prob: Option<bool>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub partial_rotary_factor: Option<f32>,
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    #[serde(flatten)]
    pub rope: RopeFields,
}

/// The resolved shape of the model, mlx-lm's defaults applied.
#[derive(Debug, Clone)]
struct Dims {
    next: bool,
    hidden: usize,
    layers: usize,
    vocab: usize,
    inter: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    eps: f32,
    nv: usize,
    nk: usize,
    dk: usize,
    dv: usize,
    conv_k: usize,
    interval: usize,
    experts: usize,
    top_k: usize,
    sparse_step: usize,
    shared_inter: usize,
    moe_inter: usize,
    mlp_only: Vec<usize>,
    norm_topk: bool,
    rotary_dims: usize,
    rope: RopeConfig,
    max_pos: Option<usize>,
    /// qwen3_5's `rope_parameters.mrope_section` (the multimodal rope's frequencies per axis).
    mrope_section: Option<[usize; 3]>,
}

impl Config {
    /// `rope_parameters.mrope_section` (qwen3_5 with a vision tower): three sizes.
    fn mrope_section(&self) -> std::result::Result<Option<[usize; 3]>, String> {
        super::mrope::mrope_section(self.rope.rope_parameters.as_ref(), "rope_parameters")
    }

    /// qwen3_next (as opposed to qwen3_5 / qwen3_5_moe, whose fields have defaults).
    fn is_next(&self) -> bool {
        self.outer_model_type.is_none() && self.model_type == "qwen3_next"
    }

    fn dims(&self) -> std::result::Result<Dims, String> {
        let next = self.is_next();
        let req = |name: &str, v: Option<usize>, default: usize| -> std::result::Result<usize, String> {
            match v {
                Some(v) => Ok(v),
                None if !next => Ok(default),
                None => Err(format!("missing field '{name}'")),
            }
        };
        let heads = req("num_attention_heads", self.num_attention_heads, 32)?;
        check_size("num_attention_heads", heads)?;
        let head_dim = match self.head_dim {
            Some(d) => d,
            None if next => return Err("missing field 'head_dim'".into()),
            None => self.hidden_size / heads,
        };
        let (rope, partial) = if next {
            let theta = self.rope.rope_theta.ok_or("missing field 'rope_theta'")?;
            let partial = self.partial_rotary_factor.ok_or("missing field 'partial_rotary_factor'")?;
            (self.rope.parse(theta)?, partial)
        } else {
            // qwen3_5: `rope_parameters` (default {rope_theta 100000, partial_rotary_factor 0.25})
            // overrides the top-level fields and is the scaling config.
            let default_params = serde_json::json!({"type": "default", "rope_theta": 100000.0, "partial_rotary_factor": 0.25});
            let params = match &self.rope.rope_parameters {
                Some(p) if p.is_null() => None,
                Some(p) => Some(p.clone()),
                None => Some(default_params),
            };
            match params {
                Some(p) => {
                    let theta = p.get("rope_theta").and_then(|v| v.as_f64()).unwrap_or(100000.0) as f32;
                    let partial = p.get("partial_rotary_factor").and_then(|v| v.as_f64()).unwrap_or(0.25) as f32;
                    let fields = RopeFields {
                        rope_theta: Some(theta),
                        rope_traditional: false,
                        rope_scaling: Some(p),
                        rope_parameters: None,
                    };
                    (fields.parse(theta)?, partial)
                }
                None => {
                    let theta = self.rope.rope_theta.unwrap_or(100000.0);
                    let fields = RopeFields { rope_theta: Some(theta), rope_traditional: false, rope_scaling: None, rope_parameters: None };
                    (fields.parse(theta)?, self.partial_rotary_factor.unwrap_or(0.25))
                }
            }
        };
        let mut rope = rope;
        rope.traditional = false;
        if partial.is_nan() || partial <= 0.0 || partial > 1.0 {
            return Err(format!("field 'partial_rotary_factor' = {partial} must be in (0, 1]"));
        }
        let d = Dims {
            next,
            hidden: self.hidden_size,
            layers: self.num_hidden_layers,
            vocab: self.vocab_size,
            inter: req("intermediate_size", self.intermediate_size, 14336)?,
            heads,
            kv_heads: req("num_key_value_heads", self.num_key_value_heads, 8)?,
            head_dim,
            eps: match self.rms_norm_eps {
                Some(e) => e,
                None if next => return Err("missing field 'rms_norm_eps'".into()),
                None => 1e-6,
            },
            nv: req("linear_num_value_heads", self.linear_num_value_heads, 64)?,
            nk: req("linear_num_key_heads", self.linear_num_key_heads, 16)?,
            dk: req("linear_key_head_dim", self.linear_key_head_dim, 192)?,
            dv: req("linear_value_head_dim", self.linear_value_head_dim, 128)?,
            conv_k: req("linear_conv_kernel_dim", self.linear_conv_kernel_dim, 4)?,
            interval: self.full_attention_interval.unwrap_or(4),
            experts: req("num_experts", self.num_experts, 0)?,
            top_k: req("num_experts_per_tok", self.num_experts_per_tok, 0)?,
            sparse_step: req("decoder_sparse_step", self.decoder_sparse_step, 1)?,
            shared_inter: req("shared_expert_intermediate_size", self.shared_expert_intermediate_size, 0)?,
            moe_inter: req("moe_intermediate_size", self.moe_intermediate_size, 0)?,
            mlp_only: match &self.mlp_only_layers {
                Some(v) => v.clone(),
                None if next => return Err("missing field 'mlp_only_layers'".into()),
                None => vec![],
            },
            norm_topk: self.norm_topk_prob.unwrap_or(!next),
            rotary_dims: (head_dim as f64 * partial as f64) as usize,
            rope,
            max_pos: self.max_position_embeddings,
            mrope_section: self.mrope_section()?,
        };
        Ok(d)
    }
}

impl Dims {
    fn is_linear(&self, layer: usize) -> bool {
        (layer + 1) % self.interval != 0
    }

    fn is_sparse(&self, layer: usize) -> bool {
        if self.next {
            !self.mlp_only.contains(&layer) && self.experts > 0 && (layer + 1) % self.sparse_step == 0
        } else {
            self.experts > 0
        }
    }

    fn validate(&self) -> std::result::Result<(), String> {
        check_size("hidden_size", self.hidden)?;
        check_size("num_hidden_layers", self.layers)?;
        check_size("vocab_size", self.vocab)?;
        validate_heads(self.heads, self.kv_heads, self.hidden, Some(self.head_dim))?;
        check_size("head_dim", self.head_dim)?;
        check_size("full_attention_interval", self.interval)?;
        check_size("linear_num_value_heads", self.nv)?;
        check_size("linear_num_key_heads", self.nk)?;
        check_size("linear_key_head_dim", self.dk)?;
        check_size("linear_value_head_dim", self.dv)?;
        check_size("linear_conv_kernel_dim", self.conv_k)?;
        if self.nv % self.nk != 0 {
            return Err(format!(
                "field 'linear_num_value_heads' = {} must be a multiple of linear_num_key_heads = {}",
                self.nv, self.nk
            ));
        }
        if self.eps.is_nan() || self.eps <= 0.0 {
            return Err("field 'rms_norm_eps' must be positive".into());
        }
        if self.rotary_dims == 0 || self.rotary_dims % 2 != 0 {
            return Err(format!("head_dim · partial_rotary_factor = {} must be a positive even number", self.rotary_dims));
        }
        let any_dense = (0..self.layers).any(|i| !self.is_sparse(i));
        if any_dense {
            check_size("intermediate_size", self.inter)?;
        }
        if self.experts > 0 {
            if self.next {
                check_size("decoder_sparse_step", self.sparse_step)?;
            }
            validate_experts(self.experts, self.top_k, "num_experts")?;
            check_size("moe_intermediate_size", self.moe_inter)?;
            check_size("shared_expert_intermediate_size", self.shared_inter)?;
        }
        Ok(())
    }
}

impl ArchConfig for Config {
    fn validate(&self) -> std::result::Result<(), String> {
        self.dims()?.validate()
    }
}

// ---- gated delta-net ----------------------------------------------------------------------

enum InProj {
    /// qwen3_next: `in_proj_qkvz`, `in_proj_ba` (grouped per key head), one matmul when they can.
    Fused(Projections),
    /// qwen3_5: `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`, likewise.
    Split(Projections),
}

pub struct GatedDeltaNet {
    in_proj: InProj,
    /// `[conv_dim, K, 1]` (depthwise).
    conv_weight: Array,
    dt_bias: Array,
    a_log: Array,
    /// RMSNorm weight of the gated output norm (`[dv]`).
    norm_weight: Array,
    out_proj: Linear,
    eps: f32,
    nv: usize,
    nk: usize,
    dk: usize,
    dv: usize,
    conv_k: usize,
}

impl GatedDeltaNet {
    fn load(vb: &Vb, d: &Dims) -> Result<Self> {
        let (key_dim, value_dim) = (d.nk * d.dk, d.nv * d.dv);
        let conv_dim = 2 * key_dim + value_dim;
        let in_proj = if d.next {
            InProj::Fused(Projections::new(
                "qkv",
                vec![
                    Linear::load(&vb.pp("in_proj_qkvz"), d.hidden, 2 * key_dim + 2 * value_dim, false)?,
                    Linear::load(&vb.pp("in_proj_ba"), d.hidden, 2 * d.nv, false)?,
                ],
            )?)
        } else {
            InProj::Split(Projections::new(
                "qkv",
                vec![
                    Linear::load(&vb.pp("in_proj_qkv"), d.hidden, conv_dim, false)?,
                    Linear::load(&vb.pp("in_proj_z"), d.hidden, value_dim, false)?,
                    Linear::load(&vb.pp("in_proj_b"), d.hidden, d.nv, false)?,
                    Linear::load(&vb.pp("in_proj_a"), d.hidden, d.nv, false)?,
                ],
            )?)
        };
        Ok(GatedDeltaNet {
            in_proj,
            conv_weight: vb.pp("conv1d").get("weight", &[conv_dim, d.conv_k, 1])?,
            dt_bias: vb.get("dt_bias", &[d.nv])?,
            // mlx-lm keeps A_log in its stored dtype (qwen3_5's cast_predicate) and computes
            // with it in float32 anyway.
            a_log: vb.get_uncast("A_log", &[d.nv])?,
            norm_weight: vb.pp("norm").get("weight", &[d.dv])?,
            out_proj: Linear::load(&vb.pp("out_proj"), value_dim, d.hidden, false)?,
            eps: d.eps,
            nv: d.nv,
            nk: d.nk,
            dk: d.dk,
            dv: d.dv,
            conv_k: d.conv_k,
        })
    }

    /// (mixed q/k/v `[B, S, conv_dim]`, z `[B, S, nv, dv]`, b `[B, S, nv]`, a `[B, S, nv]`).
    fn project(&self, x: &Array, b: i32, s: i32) -> Result<(Array, Array, Array, Array)> {
        let (nv, nk, dk, dv) = (self.nv as i32, self.nk as i32, self.dk as i32, self.dv as i32);
        match &self.in_proj {
            InProj::Fused(p) => {
                let r = nv / nk;
                let mut out = p.forward(x)?;
                let (m, mba) = (out.remove(0).reshape(&[b, s, nk, -1])?, out.remove(0));
                let mut p = m.split_at(&[dk, 2 * dk, 2 * dk + r * dv], -1)?;
                let z = p.pop().unwrap().reshape(&[b, s, nv, dv])?;
                let v = p.pop().unwrap().reshape(&[b, s, -1])?;
                let k = p.pop().unwrap().reshape(&[b, s, -1])?;
                let q = p.pop().unwrap().reshape(&[b, s, -1])?;
                let mba = mba.reshape(&[b, s, nk, -1])?;
                let mut p = mba.split_at(&[r], -1)?;
                let a = p.pop().unwrap().reshape(&[b, s, nv])?;
                let bb = p.pop().unwrap().reshape(&[b, s, nv])?;
                Ok((Array::concatenate(&[&q, &k, &v], -1)?, z, bb, a))
            }
            InProj::Split(p) => {
                let mut out = p.forward(x)?.into_iter();
                let mut next = || out.next().unwrap();
                Ok((next(), next().reshape(&[b, s, nv, dv])?, next(), next()))
            }
        }
    }

    fn forward(&self, x: &Array, cache: &mut dyn Cache) -> Result<Array> {
        let sh = x.shape();
        let (b, s) = (sh[0], sh[1]);
        let (nv, nk, dk, dv) = (self.nv as i32, self.nk as i32, self.dk as i32, self.dv as i32);
        let key_dim = nk * dk;
        let conv_dim = 2 * key_dim + nv * dv;
        let (mixed, z, b_in, a) = self.project(x, b, s)?;
        let state = cache.as_state().ok_or_else(|| Error::Mlx("a gated delta-net layer needs a state cache".into()))?;

        // Short causal conv over [conv state; new inputs]; its last K-1 inputs are the new state.
        let n_keep = self.conv_k as i32 - 1;
        let conv_state = match state.get(0) {
            Some(c) => c.clone(),
            None => Array::zeros(&[b, n_keep, conv_dim], x.dtype())?,
        };
        let conv_input = Array::concatenate(&[&conv_state, &mixed], 1)?;
        let len = conv_input.dim(1);
        state.set(0, conv_input.slice_axis(1, len - n_keep, len)?.contiguous()?);
        let conv_out = conv_input.conv1d(&self.conv_weight, 1, 0, 1, conv_dim)?.silu()?;
        let mut p = conv_out.split_at(&[key_dim, 2 * key_dim], -1)?;
        let v = p.pop().unwrap().reshape(&[b, s, nv, dv])?;
        let k = p.pop().unwrap().reshape(&[b, s, nk, dk])?;
        let q = p.pop().unwrap().reshape(&[b, s, nk, dk])?;

        let st = match state.get(1) {
            Some(s) => s.clone(),
            None => Array::zeros(&[b, nv, dv, dk], Dtype::Float32)?,
        };
        let (y, st) = gated_delta_update(&q, &k, &v, &a, &b_in, &self.a_log, &self.dt_bias, &st)?;
        state.set(1, st);
        state.advance(s as usize);

        // RMSNormGated: silu(z) · rms_norm(y), in float32, back to y's dtype.
        let normed = fast::rms_norm(&y, Some(&self.norm_weight), self.eps)?;
        let out = fast::precise_swiglu(&y, &z, &normed)?;
        self.out_proj.forward(&out.reshape(&[b, s, -1])?)
    }
}

impl Params for GatedDeltaNet {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        match &self.in_proj {
            InProj::Fused(p) | InProj::Split(p) => p.params(out),
        }
        out.extend([&self.conv_weight, &self.dt_bias, &self.a_log, &self.norm_weight]);
        self.out_proj.params(out);
    }
}

// ---- gated full attention -----------------------------------------------------------------

pub struct GatedAttention {
    /// q_proj (queries and their gates), k_proj, v_proj: one matmul when they can.
    qkv: Projections,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    rope: Rope,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// (rotary dims, base, mrope section) for 3-D positions; None without plain default rope.
    mrope: Option<(usize, f32, [usize; 3])>,
}

impl GatedAttention {
    fn load(vb: &Vb, d: &Dims, plus_one: bool, bias: bool) -> Result<Self> {
        let (hq, hkv) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
        let norm = |name: &str| {
            if plus_one {
                RmsNorm::load_plus_one(&vb.pp(name), d.head_dim, d.eps)
            } else {
                RmsNorm::load(&vb.pp(name), d.head_dim, d.eps)
            }
        };
        Ok(GatedAttention {
            qkv: Projections::new(
                "qkv",
                vec![
                    Linear::load(&vb.pp("q_proj"), d.hidden, 2 * hq, bias)?,
                    Linear::load(&vb.pp("k_proj"), d.hidden, hkv, bias)?,
                    Linear::load(&vb.pp("v_proj"), d.hidden, hkv, bias)?,
                ],
            )?,
            o_proj: Linear::load(&vb.pp("o_proj"), hq, d.hidden, bias)?,
            q_norm: norm("q_norm")?,
            k_norm: norm("k_norm")?,
            rope: Rope::new(d.rotary_dims, &d.rope, d.max_pos)?,
            heads: d.heads,
            kv_heads: d.kv_heads,
            head_dim: d.head_dim,
            mrope: match d.rope.scaling {
                crate::loader::RopeScaling::Default => {
                    Some((d.rotary_dims, d.rope.theta, d.mrope_section.unwrap_or([11, 11, 10])))
                }
                _ => None,
            },
        })
    }

    fn forward(&self, x: &Array, cache: &mut dyn Cache) -> Result<Array> {
        let offset = cache.offset();
        self.forward_at(x, cache, &RopePositions::Start(offset))
    }

    /// [`Self::forward`] with the tokens at `pos` (multimodal rope: [`super::mrope`]).
    fn forward_at(&self, x: &Array, cache: &mut dyn Cache, pos: &RopePositions) -> Result<Array> {
        let sh = x.shape();
        let (b, l) = (sh[0], sh[1]);
        let (h, hkv, hd) = (self.heads as i32, self.kv_heads as i32, self.head_dim as i32);
        let mut qkv = self.qkv.forward(x)?.into_iter();
        let (qg, k, v) = (qkv.next().unwrap(), qkv.next().unwrap(), qkv.next().unwrap());
        let mut qg = qg.reshape(&[b, l, h, 2 * hd])?.split_at(&[hd], -1)?;
        let gate = qg.pop().unwrap().reshape(&[b, l, -1])?;
        let q = self.q_norm.forward(&qg.pop().unwrap())?.transpose(&[0, 2, 1, 3])?;
        let k = self.k_norm.forward(&k.reshape(&[b, l, hkv, hd])?)?.transpose(&[0, 2, 1, 3])?;
        let v = v.reshape(&[b, l, hkv, hd])?.transpose(&[0, 2, 1, 3])?;
        let (q, k) = match pos {
            RopePositions::Start(start) => (self.rope.forward(&q, *start)?, self.rope.forward(&k, *start)?),
            RopePositions::Grid(p) => {
                let Some((dims, base, section)) = self.mrope else {
                    return Err(Error::InvalidArgument("multimodal rope positions need the default rope (no scaling)".into()));
                };
                if p.iter().any(|a| a.len() != l as usize) {
                    return Err(Error::InvalidArgument(format!("{l} tokens with {} rope positions", p[0].len())));
                }
                (rotate_grid(&q, p, dims, base, section, MropeStyle::Interleaved)?, rotate_grid(&k, p, dims, base, section, MropeStyle::Interleaved)?)
            }
        };
        let (k, v, mask) = cache.update_and_fetch(&k, &v)?;
        let scale = (self.head_dim as f64).powf(-0.5) as f32;
        let o = fast::scaled_dot_product_attention(&q, &k, &v, scale, mask.as_attention()?)?;
        let o = o.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
        self.o_proj.forward(&o.multiply(&gate.sigmoid()?)?)
    }
}

impl Params for GatedAttention {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.qkv, self.o_proj, self.q_norm, self.k_norm);
    }
}

// ---- layers -------------------------------------------------------------------------------

pub enum HybridMixer {
    Linear(Box<GatedDeltaNet>),
    Full(Box<GatedAttention>),
}

impl Mixer for HybridMixer {
    fn forward(&self, x: &Array, cache: &mut dyn Cache) -> Result<Array> {
        match self {
            HybridMixer::Linear(m) => m.forward(x, cache),
            HybridMixer::Full(m) => m.forward(x, cache),
        }
    }
}

impl Params for HybridMixer {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        match self {
            HybridMixer::Linear(m) => m.params(out),
            HybridMixer::Full(m) => m.params(out),
        }
    }
}

pub enum Ffn {
    Dense(GatedMlp),
    Moe(Box<SparseMoe>),
}

impl FeedForwardPart for Ffn {
    fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Ffn::Dense(m) => m.forward(x),
            Ffn::Moe(m) => m.forward(x),
        }
    }
}

impl Params for Ffn {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        match self {
            Ffn::Dense(m) => m.params(out),
            Ffn::Moe(m) => m.params(out),
        }
    }
}

type Block = PreNormBlock<HybridMixer, Ffn>;

pub struct Qwen3Next {
    embed_tokens: Embedding,
    layers: Vec<Block>,
    linear: Vec<bool>,
    norm: RmsNorm,
    lm_head: LmHead,
    vocab_size: usize,
}

impl CausalLm for Qwen3Next {
    fn embed(&self, tokens: &Array) -> Result<Array> {
        self.embed_tokens.forward(tokens)
    }

    fn forward_embeddings(&self, h: Array, caches: &mut LayerCaches) -> Result<Array> {
        let h = run_layers(h, &self.layers, caches, |l, _, x, c| l.forward(x, c))?;
        self.lm_head.forward(&self.norm.forward(&h)?, &self.embed_tokens)
    }

    /// The full-attention layers rotate by `positions` (qwen3_5 behind its vision tower).
    fn forward_embeddings_at(&self, h: Array, positions: &RopePositions, caches: &mut LayerCaches) -> Result<Array> {
        let h = run_layers(h, &self.layers, caches, |l, _, x, c| match &l.self_attn {
            HybridMixer::Full(a) => {
                let h = x.add(&a.forward_at(&l.input_layernorm.forward(x)?, c, positions)?)?;
                l.mlp.forward_add(&l.post_attention_layernorm.forward(&h)?, &h)
            }
            HybridMixer::Linear(_) => l.forward(x, c),
        })?;
        self.lm_head.forward(&self.norm.forward(&h)?, &self.embed_tokens)
    }

    fn make_caches(&self) -> LayerCaches {
        LayerCaches(
            self.linear
                .iter()
                .map(|&lin| if lin { Box::new(StateCache::new(2)) as Box<dyn Cache> } else { Box::new(KvCache::new()) })
                .collect(),
        )
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn dtype(&self) -> Dtype {
        self.norm.weight.dtype()
    }
}

impl Params for Qwen3Next {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.embed_tokens, self.layers, self.norm, self.lm_head);
    }
}

// ---- load ---------------------------------------------------------------------------------

/// (text model module, module holding `lm_head`) of a qwen3_5 checkpoint, the vision side
/// dropped: mlx-lm's layout `language_model.model.*`, Hugging Face's `model.language_model.*`,
/// or a bare text model `model.*`.
fn qwen3_5_roots<'a>(vb: &Vb<'a>) -> (Vb<'a>, Vb<'a>) {
    vb.pp("vision_tower").discard_all();
    vb.pp("model").pp("visual").discard_all();
    vb.pp("mtp").discard_all();
    let lm = vb.pp("language_model");
    lm.pp("mtp").discard_all();
    if lm.pp("model").pp("embed_tokens").contains("weight") || lm.pp("model").pp("embed_tokens").contains("scales") {
        (lm.pp("model"), lm)
    } else if vb.pp("model").pp("language_model").pp("embed_tokens").contains("weight")
        || vb.pp("model").pp("language_model").pp("embed_tokens").contains("scales")
    {
        (vb.pp("model").pp("language_model"), vb.clone())
    } else {
        (vb.pp("model"), vb.clone())
    }
}

/// Moves Hugging Face conv1d weights `[C, 1, K]` to MLX's `[C, K, 1]`; true when one was.
fn fix_conv(layer: &Vb) -> Result<bool> {
    let mut moved = false;
    layer.pp("linear_attn").pp("conv1d").remake("weight", |w| {
        let w = if w.dim(-1) != 1 {
            moved = true;
            w.swapaxes(1, 2)?.contiguous()?
        } else {
            w
        };
        Ok(vec![("weight".to_string(), w)])
    })?;
    Ok(moved)
}

impl Loadable for Qwen3Next {
    type Config = Config;

    fn load(c: Config, _: &ModelConfig, vb: &Vb) -> Result<Self> {
        let d = c.dims().map_err(Error::InvalidArgument)?;
        let (m, head_root) = if d.next {
            vb.pp("mtp").discard_all();
            (vb.pp("model"), vb.clone())
        } else {
            qwen3_5_roots(vb)
        };
        let layer_vb = |i: usize| m.pp("layers").pp(i);
        // Hugging Face layout (mlx-lm's sanitize conditions): norms stored as w in `1 + w`.
        let hf = if d.next {
            let hf = (0..d.layers).any(|i| layer_vb(i).pp("mlp").pp("experts").pp(0).pp("up_proj").contains("weight"));
            if hf {
                for i in 0..d.layers {
                    fix_conv(&layer_vb(i))?;
                }
            }
            hf
        } else {
            let mut hf = false;
            for i in 0..d.layers {
                hf |= fix_conv(&layer_vb(i))?;
            }
            hf
        };
        let norm = |v: &Vb, dim: usize| {
            if hf {
                RmsNorm::load_plus_one(v, dim, d.eps)
            } else {
                RmsNorm::load(v, dim, d.eps)
            }
        };
        let h = d.hidden;
        let mut layers = Vec::with_capacity(d.layers);
        let mut linear = Vec::with_capacity(d.layers);
        for i in 0..d.layers {
            let lv = layer_vb(i);
            let mixer = if d.is_linear(i) {
                HybridMixer::Linear(Box::new(GatedDeltaNet::load(&lv.pp("linear_attn"), &d)?))
            } else {
                HybridMixer::Full(Box::new(GatedAttention::load(&lv.pp("self_attn"), &d, hf, c.attention_bias)?))
            };
            let mlp = lv.pp("mlp");
            let ffn = if d.is_sparse(i) {
                let names = [("gate_proj", "gate_proj"), ("up_proj", "up_proj"), ("down_proj", "down_proj")];
                stack_experts(&mlp, d.experts, &names, "switch_mlp")?;
                // qwen3_5_moe: fused `experts.gate_up_proj` `[E, 2·I, H]` and `experts.down_proj`.
                mlp.remake("experts.gate_up_proj", |gu| {
                    let mid = gu.dim(-2) / 2;
                    let mut p = gu.split_at(&[mid], -2)?;
                    let up = p.pop().unwrap().contiguous()?;
                    let gate = p.pop().unwrap().contiguous()?;
                    Ok(vec![("switch_mlp.gate_proj.weight".into(), gate), ("switch_mlp.up_proj.weight".into(), up)])
                })?;
                mlp.remake("experts.down_proj", |w| Ok(vec![("switch_mlp.down_proj.weight".into(), w)]))?;
                Ffn::Moe(Box::new(SparseMoe {
                    gate: Linear::load(&mlp.pp("gate"), h, d.experts, false)?,
                    experts: SwitchGlu::load(&mlp.pp("switch_mlp"), d.experts, h, d.moe_inter, false, ExpertActivation::Swiglu)?,
                    k: d.top_k,
                    routing: Routing::SoftmaxTopK { largest_last: true, normalize: d.norm_topk },
                    shared: Some((
                        GatedMlp::load(&mlp.pp("shared_expert"), h, d.shared_inter, false, GateActivation::Silu)?,
                        Some(Linear::load(&mlp.pp("shared_expert_gate"), h, 1, false)?),
                    )),
                    cast_back: false,
                }))
            } else {
                Ffn::Dense(GatedMlp::load(&mlp, h, d.inter, false, GateActivation::Silu)?)
            };
            layers.push(PreNormBlock {
                input_layernorm: norm(&lv.pp("input_layernorm"), h)?,
                self_attn: mixer,
                post_attention_layernorm: norm(&lv.pp("post_attention_layernorm"), h)?,
                mlp: ffn,
            });
            linear.push(d.is_linear(i));
        }
        Ok(Qwen3Next {
            embed_tokens: Embedding::load(&m.pp("embed_tokens"), d.vocab, h)?,
            layers,
            linear,
            norm: norm(&m.pp("norm"), h)?,
            lm_head: LmHead::load(&head_root, c.tie_word_embeddings, h, d.vocab)?,
            vocab_size: d.vocab,
        })
    }
}

pub const ARCH: Architecture = Architecture::new::<Qwen3Next>("qwen3_next", &[]);
/// qwen3_5 and qwen3_5_moe: with a `vision_config`, behind their vision tower
/// ([`super::qwen_vision::load_with_vision`]).
pub const ARCH_QWEN3_5: Architecture = Architecture {
    model_type: "qwen3_5",
    aliases: &["qwen3_5_text"],
    check: super::check_as::<Qwen3Next>,
    load: super::qwen_vision::load_with_vision,
};
pub const ARCH_QWEN3_5_MOE: Architecture = Architecture {
    model_type: "qwen3_5_moe",
    aliases: &["qwen3_5_moe_text"],
    check: super::check_as::<Qwen3Next>,
    load: super::qwen_vision::load_with_vision,
};

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn next_config() -> Value {
        json!({
            "model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 320,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "rms_norm_eps": 1e-6, "linear_num_value_heads": 4, "linear_num_key_heads": 2,
            "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
            "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [1],
            "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64, "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25, "max_position_embeddings": 1024
        })
    }

    fn check(v: Value) -> std::result::Result<(), String> {
        let c: Config = serde_json::from_value(v).map_err(|e| e.to_string())?;
        c.validate()
    }

    #[test]
    fn qwen3_next_config_is_valid_and_names_bad_fields() {
        check(next_config()).unwrap();
        for field in ["linear_conv_kernel_dim", "partial_rotary_factor", "mlp_only_layers", "head_dim", "rope_theta"] {
            let mut v = next_config();
            v.as_object_mut().unwrap().remove(field);
            let e = check(v).unwrap_err();
            assert!(e.contains(field), "{field}: {e}");
        }
        for field in ["linear_num_key_heads", "linear_value_head_dim", "full_attention_interval", "moe_intermediate_size"] {
            let mut v = next_config();
            v[field] = json!(0);
            let e = check(v).unwrap_err();
            assert!(e.contains(field), "{field}: {e}");
        }
        let mut v = next_config();
        v["linear_num_value_heads"] = json!(3);
        assert!(check(v).unwrap_err().contains("linear_num_value_heads"));
    }

    #[test]
    fn qwen3_5_takes_mlx_lm_defaults() {
        let c: Config = serde_json::from_value(json!({
            "model_type": "qwen3_5_text", "outer_model_type": "qwen3_5", "hidden_size": 64,
            "num_hidden_layers": 4, "vocab_size": 320, "num_attention_heads": 4, "num_key_value_heads": 2
        }))
        .unwrap();
        c.validate().unwrap();
        let d = c.dims().unwrap();
        assert_eq!((d.head_dim, d.rotary_dims, d.conv_k, d.interval, d.experts), (16, 4, 4, 4, 0));
        assert_eq!(d.rope.theta, 100000.0);
        assert!(d.is_linear(0) && !d.is_linear(3) && !d.is_sparse(0));
    }
}
