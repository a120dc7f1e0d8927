//! deepseek_v3 (and its aliases kimi_k2, joyai_llm_flash) and deepseek_v2. Follows mlx-lm
//! `models/deepseek_v3.py` and `models/deepseek_v2.py` (with `mla.py`, `switch_layers.py`,
//! `rope_utils.py`).
//!
//! Multi-head latent attention (MLA): q from `q_proj`, or through the low rank `q_a_proj` →
//! `q_a_layernorm` → `q_b_proj` when `q_lora_rank` is set; `kv_a_proj_with_mqa` gives a
//! `kv_lora_rank` latent (normed by `kv_a_layernorm`) and one rotary key of `qk_rope_head_dim`
//! shared by every head; rotary (traditional layout) only on the `qk_rope_head_dim` parts.
//! - deepseek_v3 caches the latent (as keys) and the rotary key (as values). Its per-head
//!   up-projections are `embed_q` `[H, kv_lora_rank, qk_nope_head_dim]` and `unembed_out`
//!   `[H, v_head_dim, kv_lora_rank]` (mlx-lm's sanitize splits an HF `kv_b_proj` into them,
//!   re-quantizing a quantized one; done here at load the same way). The rotary part's scores
//!   (masked with the dtype's lowest value) are the additive mask of an attention over the
//!   latent: a prompt chunk expands the latent into keys (`latent @ embed_q`) and values
//!   (`latent @ unembed_outᵀ`); a decode step instead absorbs `embed_q` into the query and
//!   `unembed_out` into the output, attending over the latent itself.
//! - deepseek_v2 expands the latent through `kv_b_proj` into per-head `k_nope` / values every
//!   step and caches full keys (`[k_nope, k_pe]`, k_pe repeated over the heads); its rope is
//!   always yarn (`rope_scaling` is required).
//!
//! Softmax scale `(qk_nope_head_dim + qk_rope_head_dim)^-0.5`, times `mscale²` with `mscale =
//! 0.1·mscale_all_dim·ln(factor) + 1` when `rope_scaling` has a non-zero `mscale_all_dim` and
//! `factor > 1`; the yarn rope itself scales its input by `mscale(mscale) / mscale(mscale_all_dim)`.
//!
//! MLP: layer `i` is a mixture of experts when `n_routed_experts` is set, `i >=
//! first_k_dense_replace` and `i % moe_layer_freq == 0`, else a dense SwiGLU MLP. Experts are
//! `switch_mlp` (stacked; HF per-expert `experts.{e}` tensors are stacked at load) plus
//! `n_shared_experts × moe_intermediate_size` wide `shared_experts`. Routing:
//! - deepseek_v3 `noaux_tc` ([`group_expert_select`]): sigmoid of the float32 router logits;
//!   `e_score_correction_bias` (kept float32 when stored so, as mlx-lm's `cast_predicate` leaves
//!   it) added for the choice only; with `n_group > 1` every group scores the sum of its top two
//!   and the `n_group - topk_group` lowest groups are zeroed (zeroed, not removed: mlx-lm's
//!   rule); top `num_experts_per_tok`; their unbiased scores normalised (`norm_topk_prob`, k > 1)
//!   and times `routed_scaling_factor`; the weighted sum in float32, cast back.
//! - deepseek_v2: softmax scores in the activation dtype; `group_limited_greedy` zeroes the groups
//!   of lowest max score, any other `topk_method` is plain greedy; top-k scores times
//!   `routed_scaling_factor`, not normalised.
//!
//! Not supported (mlx-lm's sanitize converts them at load): HF FP8 checkpoints (float8 weights
//! with `weight_scale_inv`) and compressed-tensors int4 (`weight_packed`); convert them with
//! mlx-lm first (their tensors are rejected at load, naming them). mlx-lm's dropping of the
//! multi-token-prediction layer (`model.layers.61`) and of `rotary_emb.inv_freq` is kept.
use super::stack::{FeedForwardPart, Mixer, PreNormBlock, Stack};
use super::{ArchConfig, Architecture, Loadable};
use crate::error::{Error, Result};
use crate::loader::{check_size, ModelConfig, QuantSpec, RopeConfig, RopeFields, RopeScaling, TensorKind, Vb};
use crate::mlx::fast::{self, AttentionMask};
use crate::mlx::{quant, Array, Dtype};
use crate::nn::linear::QuantWeight;
use crate::nn::switch::combine;
use crate::nn::{
    Cache, ExpertActivation, GateActivation, GatedMlp, Linear, Params, RmsNorm, Rope,
    SwitchGlu,
};
use serde::Deserialize;
use serde_json::Value;

// ---- config -------------------------------------------------------------------------------

/// mlx-lm's `ModelArgs` of deepseek_v3 / deepseek_v2. The sizes are required (mlx-lm's
/// defaults are DeepSeek-V2's full-size shapes, never what a checkpoint lacking them holds); the
/// behaviour switches keep mlx-lm's defaults, which differ between the two where noted.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    #[serde(default)]
    pub moe_intermediate_size: Option<usize>,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub n_shared_experts: Option<usize>,
    #[serde(default)]
    pub n_routed_experts: Option<usize>,
    #[serde(default = "one_f32")]
    pub routed_scaling_factor: f32,
    pub kv_lora_rank: usize,
    /// Absent: 1536 (mlx-lm's default); `null`: one plain `q_proj`.
    #[serde(default = "default_q_lora_rank")]
    pub q_lora_rank: Option<usize>,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub qk_nope_head_dim: usize,
    /// deepseek_v3: "noaux_tc" (the only one it runs); deepseek_v2: "gready" (sic), i.e. greedy.
    #[serde(default)]
    pub topk_method: Option<String>,
    /// deepseek_v3 only.
    #[serde(default = "yes")]
    pub norm_topk_prob: bool,
    /// deepseek_v3 default 1; deepseek_v2 none (needed by `group_limited_greedy` only).
    #[serde(default)]
    pub n_group: Option<usize>,
    #[serde(default)]
    pub topk_group: Option<usize>,
    /// deepseek_v3 default 1; deepseek_v2 none (needed with experts).
    #[serde(default)]
    pub num_experts_per_tok: Option<usize>,
    #[serde(default = "one")]
    pub moe_layer_freq: usize,
    #[serde(default)]
    pub first_k_dense_replace: usize,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    #[serde(default = "default_theta")]
    pub rope_theta: f32,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub attention_bias: bool,
}

fn one() -> usize {
    1
}
fn one_f32() -> f32 {
    1.0
}
fn yes() -> bool {
    true
}
fn default_q_lora_rank() -> Option<usize> {
    Some(1536)
}
fn default_max_pos() -> usize {
    2048
}
fn default_eps() -> f32 {
    1e-6
}
fn default_theta() -> f32 {
    10000.0
}

/// Which of the two mlx-lm files a config runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    V2,
    V3,
}

/// How a MoE layer picks its experts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RoutingKind {
    /// deepseek_v3's `noaux_tc`.
    NoAuxTc { n_group: usize, topk_group: usize, norm_topk_prob: bool },
    /// deepseek_v2's greedy top-k of the softmax.
    Greedy,
    /// deepseek_v2's `group_limited_greedy`.
    GroupLimitedGreedy { n_group: usize, topk_group: usize },
}

impl Config {
    pub fn flavor(&self) -> Flavor {
        if self.model_type == "deepseek_v2" {
            Flavor::V2
        } else {
            Flavor::V3
        }
    }

    fn q_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Whether layer `i` is a mixture of experts (mlx-lm's DecoderLayer rule).
    pub fn is_moe_layer(&self, i: usize) -> bool {
        self.n_routed_experts.is_some() && i >= self.first_k_dense_replace && i % self.moe_layer_freq == 0
    }

    fn rope_scaling(&self) -> Option<&Value> {
        self.rope_scaling.as_ref().filter(|v| !v.is_null())
    }

    /// A number of `rope_scaling`.
    fn scaling_num(&self, key: &str) -> Option<f64> {
        self.rope_scaling().and_then(|s| s.get(key)).and_then(|v| v.as_f64())
    }

    /// The rotary embedding of the `qk_rope_head_dim` parts, always in the traditional layout.
    pub fn rope(&self) -> std::result::Result<RopeConfig, String> {
        match self.flavor() {
            // initialize_rope, where "deepseek_yarn" and "telechat3-yarn" are yarn too.
            Flavor::V3 => {
                let mut scaling = self.rope_scaling().cloned();
                if let Some(Value::Object(m)) = &mut scaling {
                    for key in ["type", "rope_type"] {
                        if matches!(m.get(key).and_then(|t| t.as_str()), Some("deepseek_yarn" | "telechat3-yarn")) {
                            m.insert(key.into(), Value::from("yarn"));
                        }
                    }
                }
                let fields =
                    RopeFields { rope_theta: Some(self.rope_theta), rope_traditional: true, rope_scaling: scaling, rope_parameters: None };
                fields.parse(self.rope_theta)
            }
            // DeepseekV2YarnRotaryEmbedding, whatever the scaling's type says.
            Flavor::V2 => {
                if self.rope_scaling().is_none() {
                    return Err("field 'rope_scaling' is required by deepseek_v2 (its rope is always yarn)".into());
                }
                let factor = self
                    .scaling_num("factor")
                    .ok_or("field 'rope_scaling.factor' is required by deepseek_v2 (its rope is always yarn)")?;
                let num = |k: &str, d: f64| self.scaling_num(k).unwrap_or(d) as f32;
                Ok(RopeConfig {
                    theta: self.rope_theta,
                    traditional: true,
                    scaling: RopeScaling::Yarn {
                        factor: factor as f32,
                        original_max_position_embeddings: num("original_max_position_embeddings", 4096.0),
                        beta_fast: num("beta_fast", 32.0),
                        beta_slow: num("beta_slow", 1.0),
                        mscale: num("mscale", 1.0),
                        mscale_all_dim: num("mscale_all_dim", 0.0),
                    },
                })
            }
        }
    }

    /// The softmax scale, in double precision as Python computes it.
    pub fn softmax_scale(&self) -> f32 {
        let mut scale = (self.q_head_dim() as f64).powf(-0.5);
        let m = self.scaling_num("mscale_all_dim").unwrap_or(0.0);
        if self.rope_scaling().is_some() && m != 0.0 {
            let factor = self.scaling_num("factor").unwrap_or(1.0);
            if factor > 1.0 {
                let s = 0.1 * m * factor.ln() + 1.0;
                scale = scale * s * s;
            }
        }
        scale as f32
    }

    pub fn top_k(&self) -> usize {
        self.num_experts_per_tok.unwrap_or(1)
    }

    pub fn routing(&self) -> RoutingKind {
        match self.flavor() {
            Flavor::V3 => RoutingKind::NoAuxTc {
                n_group: self.n_group.unwrap_or(1),
                topk_group: self.topk_group.unwrap_or(1),
                norm_topk_prob: self.norm_topk_prob,
            },
            Flavor::V2 if self.topk_method.as_deref() == Some("group_limited_greedy") => RoutingKind::GroupLimitedGreedy {
                n_group: self.n_group.unwrap_or(0),
                topk_group: self.topk_group.unwrap_or(0),
            },
            Flavor::V2 => RoutingKind::Greedy,
        }
    }

    fn validate_moe(&self, experts: usize) -> std::result::Result<(), String> {
        check_size("n_routed_experts", experts)?;
        check_size("moe_intermediate_size", self.moe_intermediate_size.ok_or("field 'moe_intermediate_size' is required with n_routed_experts")?)?;
        if let Some(n) = self.n_shared_experts {
            check_size("n_shared_experts", n)?;
        }
        let k = match (self.flavor(), self.num_experts_per_tok) {
            (_, Some(k)) => k,
            (Flavor::V3, None) => 1,
            (Flavor::V2, None) => return Err("field 'num_experts_per_tok' is required with n_routed_experts".into()),
        };
        check_size("num_experts_per_tok", k)?;
        if k > experts {
            return Err(format!("field 'num_experts_per_tok' = {k} exceeds n_routed_experts = {experts}"));
        }
        if !self.routed_scaling_factor.is_finite() {
            return Err("field 'routed_scaling_factor' must be finite".into());
        }
        let groups = |n_group: usize, topk_group: usize, top2: bool| -> std::result::Result<(), String> {
            check_size("n_group", n_group)?;
            check_size("topk_group", topk_group)?;
            if experts % n_group != 0 {
                return Err(format!("field 'n_group' = {n_group} must divide n_routed_experts = {experts}"));
            }
            if topk_group > n_group {
                return Err(format!("field 'topk_group' = {topk_group} exceeds n_group = {n_group}"));
            }
            if top2 && n_group > 1 && experts / n_group < 2 {
                return Err(format!("field 'n_group' = {n_group} leaves fewer than 2 experts per group (groups score their top 2)"));
            }
            Ok(())
        };
        match self.flavor() {
            Flavor::V3 => {
                let method = self.topk_method.as_deref().unwrap_or("noaux_tc");
                if method != "noaux_tc" {
                    return Err(format!("field 'topk_method' = '{method}' is not supported by deepseek_v3 (only 'noaux_tc')"));
                }
                groups(self.n_group.unwrap_or(1), self.topk_group.unwrap_or(1), true)
            }
            Flavor::V2 => match self.routing() {
                RoutingKind::GroupLimitedGreedy { .. } => {
                    let n = self.n_group.ok_or("field 'n_group' is required by topk_method 'group_limited_greedy'")?;
                    let t = self.topk_group.ok_or("field 'topk_group' is required by topk_method 'group_limited_greedy'")?;
                    groups(n, t, false)
                }
                _ => Ok(()),
            },
        }
    }
}

impl ArchConfig for Config {
    fn validate(&self) -> std::result::Result<(), String> {
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_rope_head_dim", self.qk_rope_head_dim),
            ("qk_nope_head_dim", self.qk_nope_head_dim),
            ("v_head_dim", self.v_head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
            ("moe_layer_freq", self.moe_layer_freq),
        ] {
            check_size(name, v)?;
        }
        if let Some(r) = self.q_lora_rank {
            check_size("q_lora_rank", r)?;
        }
        if self.qk_rope_head_dim % 2 != 0 {
            return Err(format!("field 'qk_rope_head_dim' = {} must be even for rotary embeddings", self.qk_rope_head_dim));
        }
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0) {
            return Err(format!("field 'rms_norm_eps' = {} is out of range", self.rms_norm_eps));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(format!("field 'rope_theta' = {} must be positive", self.rope_theta));
        }
        if let Some(e) = self.n_routed_experts {
            if (0..self.num_hidden_layers).any(|i| self.is_moe_layer(i)) {
                self.validate_moe(e)?;
            }
        }
        self.rope().map(|_| ())
    }
}

// ---- attention ----------------------------------------------------------------------------

/// mlx-lm's `MultiLinear` (`mla.py`): one `[out, in]` matrix per head, `weight` `[H, out, in]`,
/// dense or quantized along `in`.
pub enum MultiLinear {
    Dense { weight: Array },
    Quantized(QuantWeight),
}

impl MultiLinear {
    /// Module `vb`'s `weight` of `heads` × `[out, in]`.
    pub fn load(vb: &Vb, heads: usize, inp: usize, out: usize) -> Result<Self> {
        Ok(match vb.quant_spec(inp)? {
            Some(spec) => MultiLinear::Quantized(QuantWeight::load(vb, &[heads], out, inp, spec)?),
            None => MultiLinear::Dense { weight: vb.get("weight", &[heads, out, inp])? },
        })
    }

    /// `[H, out, in]` weights, quantized as `spec` says (mlx-lm's sanitize of `kv_b_proj`), float
    /// scales then cast to `compute` as stored ones would be.
    fn from_dense(weight: Array, spec: Option<QuantSpec>, compute: Option<Dtype>) -> Result<Self> {
        Ok(match spec {
            None => MultiLinear::Dense { weight },
            Some(spec) => {
                let q = quant::quantize(&weight, spec.group_size as i32, spec.bits as i32, spec.mode)?;
                let cast = |a: Array| -> Result<Array> {
                    match compute {
                        Some(d) if a.dtype().is_float() && a.dtype() != d => a.astype(d),
                        _ => Ok(a),
                    }
                };
                let biases = q.biases.map(cast).transpose()?;
                MultiLinear::Quantized(QuantWeight { weight: q.weight, scales: cast(q.scales)?, biases, spec, dequant_dtype: None })
            }
        })
    }

    /// `x @ Wᵀ` (`transpose`) or `x @ W`, per head (the head axis broadcasts against `x`'s).
    pub fn forward(&self, x: &Array, transpose: bool) -> Result<Array> {
        match self {
            MultiLinear::Dense { weight } if transpose => x.matmul(&weight.swapaxes(-1, -2)?),
            MultiLinear::Dense { weight } => x.matmul(weight),
            MultiLinear::Quantized(q) => quant::quantized_matmul(
                x,
                &q.weight,
                &q.scales,
                q.biases.as_ref(),
                transpose,
                q.spec.group_size as i32,
                q.spec.bits as i32,
                q.spec.mode,
            ),
        }
    }
}

impl Params for MultiLinear {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        match self {
            MultiLinear::Dense { weight } => out.push(weight),
            MultiLinear::Quantized(q) => q.params(out),
        }
    }
}

/// How the query is projected.
pub enum QProj {
    Full(Linear),
    LowRank { a: Linear, norm: RmsNorm, b: Linear },
}

/// How the latent becomes per-head keys and values.
pub enum KvUp {
    /// deepseek_v3: `embed_q` `[H, kv_lora_rank, qk_nope]`, `unembed_out` `[H, v_head, kv_lora_rank]`.
    Absorbed { embed_q: MultiLinear, unembed_out: MultiLinear },
    /// deepseek_v2: `kv_b_proj` (kv_lora_rank → H·(qk_nope + v_head)).
    Expanded(Linear),
}

pub struct MlaAttention {
    pub q: QProj,
    pub kv_a_proj_with_mqa: Linear,
    pub kv_a_layernorm: RmsNorm,
    pub kv_up: KvUp,
    pub o_proj: Linear,
    pub rope: Rope,
    pub n_heads: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub kv_lora_rank: usize,
    pub scale: f32,
}

/// `mx.finfo(dtype).min`, exactly (f32::MIN would round to -inf in bfloat16).
fn lowest(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::Bfloat16 => f32::from_bits(0xFF7F_0000),
        Dtype::Float16 => -65504.0,
        _ => f32::MIN,
    }
}

/// mlx-lm's `create_causal_mask(n, offset)`: `[n, offset + n]`, query `i` sees keys `<= offset + i`.
fn causal_mask(n: i32, offset: i32) -> Result<Array> {
    let rinds = Array::arange(0.0, (offset + n) as f64, 1.0, Dtype::Int32)?;
    let linds = if offset > 0 { Array::arange(offset as f64, (offset + n) as f64, 1.0, Dtype::Int32)? } else { rinds.clone() };
    linds.expand_dims(1)?.greater_equal(&rinds.expand_dims(0)?)
}

impl MlaAttention {
    /// Module `vb` (`model.layers.{i}.self_attn`).
    pub fn load(vb: &Vb, c: &Config) -> Result<Self> {
        let (hidden, h, r) = (c.hidden_size, c.num_attention_heads, c.kv_lora_rank);
        let (nope, rope_dim, v) = (c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim);
        let q_out = h * c.q_head_dim();
        // Precomputed rotary tables are recomputed (mlx-lm's sanitize drops them).
        vb.pp("rotary_emb").discard("inv_freq");
        let q = match c.q_lora_rank {
            None => QProj::Full(Linear::load(&vb.pp("q_proj"), hidden, q_out, false)?),
            Some(qr) => QProj::LowRank {
                a: Linear::load(&vb.pp("q_a_proj"), hidden, qr, c.attention_bias)?,
                norm: RmsNorm::load(&vb.pp("q_a_layernorm"), qr, 1e-6)?,
                b: Linear::load(&vb.pp("q_b_proj"), qr, q_out, false)?,
            },
        };
        let kv_up = match c.flavor() {
            Flavor::V2 => KvUp::Expanded(Linear::load(&vb.pp("kv_b_proj"), r, h * (nope + v), false)?),
            Flavor::V3 if vb.pp("kv_b_proj").contains("weight") => Self::split_kv_b(&vb.pp("kv_b_proj"), c)?,
            Flavor::V3 => KvUp::Absorbed {
                embed_q: MultiLinear::load(&vb.pp("embed_q"), h, nope, r)?,
                unembed_out: MultiLinear::load(&vb.pp("unembed_out"), h, r, v)?,
            },
        };
        let rope = c.rope().map_err(Error::InvalidArgument)?;
        Ok(MlaAttention {
            q,
            kv_a_proj_with_mqa: Linear::load(&vb.pp("kv_a_proj_with_mqa"), hidden, r + rope_dim, c.attention_bias)?,
            kv_a_layernorm: RmsNorm::load(&vb.pp("kv_a_layernorm"), r, 1e-6)?,
            kv_up,
            o_proj: Linear::load(&vb.pp("o_proj"), h * v, hidden, c.attention_bias)?,
            rope: Rope::new(rope_dim, &rope, Some(c.max_position_embeddings))?,
            n_heads: h,
            qk_nope_head_dim: nope,
            qk_rope_head_dim: rope_dim,
            kv_lora_rank: r,
            scale: c.softmax_scale(),
        })
    }

    /// mlx-lm deepseek_v3's sanitize of an HF `kv_b_proj` (`vb`): `[H·(nope + v), R]` viewed as
    /// `[H, nope + v, R]`; `embed_q` is the first `nope` rows of each head transposed, `unembed_out`
    /// the rest. A quantized one is dequantized, split and quantized again as it was, in the dtype
    /// of its stored scales (as mlx-lm computes it); the results then join the compute dtype.
    fn split_kv_b(vb: &Vb, c: &Config) -> Result<KvUp> {
        let (h, r, nope, v) = (c.num_attention_heads, c.kv_lora_rank, c.qk_nope_head_dim, c.v_head_dim);
        let rows = h * (nope + v);
        let spec = vb.quant_spec(r)?;
        let w = match spec {
            None => vb.get("weight", &[rows, r])?,
            Some(spec) => {
                let (gs, bits) = (spec.group_size as usize, spec.bits as usize);
                if r % gs != 0 || (r * bits) % 32 != 0 {
                    return Err(Error::checkpoint(
                        "config.json",
                        format!("'{}': input size {r} is not a multiple of the group size {gs}", vb.prefix()),
                    ));
                }
                let weight = vb.take("weight", &[rows, r * bits / 32], TensorKind::Packed)?;
                let scales = vb.take_uncast("scales", &[rows, r / gs], TensorKind::Scales)?;
                let biases =
                    if spec.mode.has_biases() { Some(vb.take_uncast("biases", &[rows, r / gs], TensorKind::Scales)?) } else { None };
                quant::dequantize(&weight, &scales, biases.as_ref(), gs as i32, bits as i32, spec.mode)?
            }
        };
        let w = w.reshape(&[h as i32, (nope + v) as i32, r as i32])?;
        let wk = w.slice_axis(1, 0, nope as i32)?.swapaxes(-1, -2)?.contiguous()?;
        let wv = w.slice_axis(1, nope as i32, (nope + v) as i32)?.contiguous()?;
        let compute = vb.dtype();
        Ok(KvUp::Absorbed {
            embed_q: MultiLinear::from_dense(wk, spec, compute)?,
            unembed_out: MultiLinear::from_dense(wv, spec, compute)?,
        })
    }

    /// `x`: `[B, L, hidden]` → `[B, L, hidden]`, extending `cache`.
    pub fn forward(&self, x: &Array, cache: &mut dyn Cache) -> Result<Array> {
        let (b, l) = (x.dim(0), x.dim(1));
        let h = self.n_heads as i32;
        let q = match &self.q {
            QProj::Full(p) => p.forward(x)?,
            QProj::LowRank { a, norm, b } => b.forward(&norm.forward(&a.forward(x)?)?)?,
        };
        let q = q.reshape(&[b, l, h, -1])?.transpose(&[0, 2, 1, 3])?;
        let mut qs = q.split_at(&[self.qk_nope_head_dim as i32], -1)?;
        let q_pe = qs.pop().expect("two parts");
        let q_nope = qs.pop().expect("two parts");
        let mut kv = self.kv_a_proj_with_mqa.forward(x)?.split_at(&[self.kv_lora_rank as i32], -1)?;
        let k_pe = kv.pop().expect("two parts");
        let compressed = kv.pop().expect("two parts");
        let k_pe = k_pe.reshape(&[b, l, 1, self.qk_rope_head_dim as i32])?.transpose(&[0, 2, 1, 3])?;
        let latent = self.kv_a_layernorm.forward(&compressed)?;
        let offset = cache.offset();
        let q_pe = self.rope.forward(&q_pe, offset)?;
        let k_pe = self.rope.forward(&k_pe, offset)?;
        let out = match &self.kv_up {
            KvUp::Absorbed { embed_q, unembed_out } => {
                let (latent, k_pe, _) = cache.update_and_fetch(&latent.expand_dims(1)?, &k_pe)?;
                let dt = q_pe.dtype();
                let mut pe_scores = q_pe.multiply(&Array::scalar_f32(self.scale, dt)?)?.matmul(&k_pe.swapaxes(-1, -2)?)?;
                if l > 1 {
                    let mask = causal_mask(l, offset as i32)?;
                    pe_scores = Array::where_(&mask, &pe_scores, &Array::scalar_f32(lowest(pe_scores.dtype()), pe_scores.dtype())?)?;
                }
                let mask = AttentionMask::Array(&pe_scores);
                if l == 1 {
                    let q = embed_q.forward(&q_nope, true)?;
                    let o = fast::scaled_dot_product_attention(&q, &latent, &latent, self.scale, mask)?;
                    unembed_out.forward(&o, true)?
                } else {
                    let k = embed_q.forward(&latent, false)?;
                    let v = unembed_out.forward(&latent, true)?;
                    fast::scaled_dot_product_attention(&q_nope, &k, &v, self.scale, mask)?
                }
            }
            KvUp::Expanded(kv_b_proj) => {
                let kv = kv_b_proj.forward(&latent)?.reshape(&[b, l, h, -1])?.transpose(&[0, 2, 1, 3])?;
                let mut kv = kv.split_at(&[self.qk_nope_head_dim as i32], -1)?;
                let values = kv.pop().expect("two parts");
                let k_nope = kv.pop().expect("two parts");
                // mx.repeat over the single head axis: the same values, broadcast.
                let k_pe = k_pe.broadcast_to(&[b, h, l, self.qk_rope_head_dim as i32])?;
                let keys = Array::concatenate(&[&k_nope, &k_pe], -1)?;
                let (keys, values, mask) = cache.update_and_fetch(&keys, &values)?;
                let queries = Array::concatenate(&[&q_nope, &q_pe], -1)?;
                fast::scaled_dot_product_attention(&queries, &keys, &values, self.scale, mask.as_attention()?)?
            }
        };
        let out = out.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
        self.o_proj.forward(&out)
    }
}

impl Params for QProj {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        match self {
            QProj::Full(p) => p.params(out),
            QProj::LowRank { a, norm, b } => crate::params!(out; *a, *norm, *b),
        }
    }
}

impl Params for KvUp {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        match self {
            KvUp::Absorbed { embed_q, unembed_out } => crate::params!(out; *embed_q, *unembed_out),
            KvUp::Expanded(l) => l.params(out),
        }
    }
}

impl Params for MlaAttention {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.q, self.kv_a_proj_with_mqa, self.kv_a_layernorm, self.kv_up, self.o_proj);
    }
}

// ---- mixture of experts -------------------------------------------------------------------

/// The top `k` of the last axis as mlx-lm takes it: `argpartition(-s, kth=k-1)[..., :k]`.
fn top_k_indices(s: &Array, k: usize) -> Result<Array> {
    s.negative()?.argpartition(k as i32 - 1, -1)?.slice_axis(-1, 0, k as i32)
}

/// Zeroes, along axis -2 of `s` `[…, G, E/G]`, the `G - topk_group` groups of lowest
/// `group_scores` `[…, G, 1]` (mlx-lm's `put_along_axis` of 0 over whole groups).
fn drop_groups(s: &Array, group_scores: &Array, n_group: usize, topk_group: usize) -> Result<Array> {
    let k = (n_group - topk_group) as i32;
    if k == 0 {
        return Ok(s.clone());
    }
    let idx = group_scores.argpartition(k - 1, -2)?.slice_axis(-2, 0, k)?;
    s.put_along_axis(&idx, &Array::scalar_f32(0.0, s.dtype())?, -2)
}

/// `[…, E]` → `[…, G, E/G]`.
fn unflatten_groups(s: &Array, n_group: usize) -> Result<Array> {
    let mut shape = s.shape();
    shape.pop();
    shape.extend([n_group as i32, -1]);
    s.reshape(&shape)
}

/// `[…, G, E/G]` → `[…, E]`.
fn flatten_groups(s: &Array) -> Result<Array> {
    let mut shape = s.shape();
    shape.truncate(shape.len() - 2);
    shape.push(-1);
    s.reshape(&shape)
}

/// mlx-lm deepseek_v3's `group_expert_select`: router logits `gates` `[…, E]` → (expert indices
/// `[…, k]`, their float32 weights).
pub fn group_expert_select(
    gates: &Array,
    bias: &Array,
    top_k: usize,
    n_group: usize,
    topk_group: usize,
    routed_scaling_factor: f32,
    norm_topk_prob: bool,
) -> Result<(Array, Array)> {
    let orig = gates.astype(Dtype::Float32)?.sigmoid()?;
    let mut s = orig.add(bias)?;
    if n_group > 1 {
        s = unflatten_groups(&s, n_group)?;
        // mx.topk(s, 2).sum(-1): the two largest, whose sum does not depend on their order.
        let n = s.dim(-1);
        let group_scores = s.sort(-1)?.slice_axis(-1, n - 2, n)?.sum(&[-1], true)?;
        s = flatten_groups(&drop_groups(&s, &group_scores, n_group, topk_group)?)?;
    }
    let inds = top_k_indices(&s, top_k)?;
    let mut scores = orig.take_along_axis(&inds, -1)?;
    if top_k > 1 && norm_topk_prob {
        scores = scores.divide(&scores.sum(&[-1], true)?)?;
    }
    let scores = scores.multiply(&Array::scalar_f32(routed_scaling_factor, scores.dtype())?)?;
    Ok((inds, scores))
}

/// The router (`mlp.gate`): `weight` `[E, hidden]`, deepseek_v3's `e_score_correction_bias`.
pub struct MoeGate {
    pub weight_t: Array,
    pub bias: Option<Array>,
    pub kind: RoutingKind,
    pub top_k: usize,
    pub routed_scaling_factor: f32,
}

impl MoeGate {
    /// `x` `[B, L, hidden]` → (indices `[B, L, k]`, weights `[B, L, k]`).
    pub fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let gates = x.matmul(&self.weight_t)?;
        match self.kind {
            RoutingKind::NoAuxTc { n_group, topk_group, norm_topk_prob } => group_expert_select(
                &gates,
                self.bias.as_ref().expect("noaux_tc has a correction bias"),
                self.top_k,
                n_group,
                topk_group,
                self.routed_scaling_factor,
                norm_topk_prob,
            ),
            RoutingKind::Greedy | RoutingKind::GroupLimitedGreedy { .. } => {
                let mut s = gates.softmax(-1, true)?;
                if let RoutingKind::GroupLimitedGreedy { n_group, topk_group } = self.kind {
                    let g = unflatten_groups(&s, n_group)?;
                    let group_scores = g.max(&[-1], true)?;
                    s = flatten_groups(&drop_groups(&g, &group_scores, n_group, topk_group)?)?;
                }
                let inds = top_k_indices(&s, self.top_k)?;
                let scores = s.take_along_axis(&inds, -1)?;
                let scores = scores.multiply(&Array::scalar_f32(self.routed_scaling_factor, scores.dtype())?)?;
                Ok((inds, scores))
            }
        }
    }
}

impl Params for MoeGate {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.weight_t, self.bias);
    }
}

pub struct Moe {
    pub gate: MoeGate,
    pub switch_mlp: SwitchGlu,
    pub shared_experts: Option<GatedMlp>,
    /// deepseek_v3 sums the experts in the (float32) weights' dtype and casts back.
    pub cast_back: bool,
}

impl Moe {
    /// Module `vb` (`model.layers.{i}.mlp`).
    pub fn load(vb: &Vb, c: &Config) -> Result<Self> {
        let experts = c.n_routed_experts.expect("a MoE layer has experts");
        let inter = c.moe_intermediate_size.expect("validated");
        let hidden = c.hidden_size;
        // HF layout: one tensor per expert, stacked as mlx-lm's sanitize does.
        for proj in ["gate_proj", "down_proj", "up_proj"] {
            for k in ["weight", "scales", "biases"] {
                let parts: Vec<String> = (0..experts).map(|e| format!("experts.{e}.{proj}.{k}")).collect();
                vb.stack(&parts, &format!("switch_mlp.{proj}.{k}"))?;
            }
        }
        let g = vb.pp("gate");
        let v3 = c.flavor() == Flavor::V3;
        Ok(Moe {
            gate: MoeGate {
                weight_t: g.get("weight", &[experts, hidden])?.transpose(&[1, 0])?,
                bias: if v3 { Some(Self::correction_bias(&g, experts)?) } else { None },
                kind: c.routing(),
                top_k: c.top_k(),
                routed_scaling_factor: c.routed_scaling_factor,
            },
            switch_mlp: SwitchGlu::load(&vb.pp("switch_mlp"), experts, hidden, inter, false, ExpertActivation::Swiglu)?,
            shared_experts: match c.n_shared_experts {
                Some(n) => Some(GatedMlp::load(&vb.pp("shared_experts"), hidden, inter * n, false, GateActivation::Silu)?),
                None => None,
            },
            cast_back: v3,
        })
    }

    /// `e_score_correction_bias`: kept in float32 when stored so (mlx-lm's `cast_predicate`
    /// never casts it), else in the compute dtype like every other weight.
    fn correction_bias(g: &Vb, experts: usize) -> Result<Array> {
        let b = g.get_uncast("e_score_correction_bias", &[experts])?;
        match g.dtype() {
            Some(d) if b.dtype() != Dtype::Float32 && b.dtype() != d => b.astype(d),
            _ => Ok(b),
        }
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let (inds, scores) = self.gate.route(x)?;
        let y = self.switch_mlp.forward(x, &inds)?;
        let y = combine(&y, &scores, if self.cast_back { Some(y.dtype()) } else { None })?;
        match &self.shared_experts {
            Some(s) => y.add(&s.forward(x)?),
            None => Ok(y),
        }
    }
}

impl Params for Moe {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.gate, self.switch_mlp, self.shared_experts);
    }
}

pub enum Mlp {
    Dense(GatedMlp),
    Moe(Box<Moe>),
}

impl Mlp {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Mlp::Dense(m) => m.forward(x),
            Mlp::Moe(m) => m.forward(x),
        }
    }
}

impl Params for Mlp {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        match self {
            Mlp::Dense(m) => m.params(out),
            Mlp::Moe(m) => m.params(out),
        }
    }
}

// ---- block --------------------------------------------------------------------------------

impl Mixer for MlaAttention {
    fn forward(&self, x: &Array, cache: &mut dyn Cache) -> Result<Array> {
        MlaAttention::forward(self, x, cache)
    }
}

impl FeedForwardPart for Mlp {
    fn forward(&self, x: &Array) -> Result<Array> {
        Mlp::forward(self, x)
    }
}

/// A DeepSeek layer: MLA, then a dense MLP or the experts, pre-norm.
pub type Block = PreNormBlock<MlaAttention, Mlp>;

impl Block {
    pub fn load(vb: &Vb, c: &Config, i: usize) -> Result<Self> {
        let (hidden, eps) = (c.hidden_size, c.rms_norm_eps);
        let m = vb.pp("mlp");
        let mlp = if c.is_moe_layer(i) {
            Mlp::Moe(Box::new(Moe::load(&m, c)?))
        } else {
            Mlp::Dense(GatedMlp::load(&m, hidden, c.intermediate_size, false, GateActivation::Silu)?)
        };
        Self::with_parts(vb, hidden, eps, MlaAttention::load(&vb.pp("self_attn"), c)?, mlp)
    }
}

// ---- model --------------------------------------------------------------------------------

pub type Deepseek = Stack<Block>;

// ---- load ---------------------------------------------------------------------------------

impl Loadable for Deepseek {
    type Config = Config;

    fn load(c: Config, _: &ModelConfig, vb: &Vb) -> Result<Self> {
        let m = vb.pp("model");
        if c.flavor() == Flavor::V3 && c.num_hidden_layers <= 61 {
            // mlx-lm drops DeepSeek-V3's multi-token-prediction layer.
            m.pp("layers").pp(61).discard_all();
        }
        let layers = (0..c.num_hidden_layers).map(|i| Block::load(&m.pp("layers").pp(i), &c, i)).collect::<Result<_>>()?;
        Stack::with_layers(vb, layers, c.hidden_size, c.vocab_size, c.rms_norm_eps, false)
    }
}

/// mlx-lm maps kimi_k2 and joyai_llm_flash onto deepseek_v3's code (`MODEL_REMAPPING`).
pub const ARCH_V3: Architecture = Architecture::new::<Deepseek>("deepseek_v3", &["kimi_k2", "joyai_llm_flash"]);
pub const ARCH_V2: Architecture = Architecture::new::<Deepseek>("deepseek_v2", &[]);

#[cfg(test)]
mod tests {
    use crate::loader::ModelConfig;
    use serde_json::{json, Value};

    fn base(model_type: &str) -> Value {
        json!({
            "model_type": model_type, "vocab_size": 320, "hidden_size": 64, "intermediate_size": 128,
            "moe_intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
            "n_shared_experts": 1, "n_routed_experts": 8, "kv_lora_rank": 32, "q_lora_rank": 32,
            "qk_rope_head_dim": 16, "v_head_dim": 32, "qk_nope_head_dim": 64, "n_group": 4, "topk_group": 2,
            "num_experts_per_tok": 2, "first_k_dense_replace": 1, "topk_method": "group_limited_greedy",
            "rope_scaling": {"type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.8}
        })
    }

    fn check(v: &Value) -> Result<(), String> {
        let c = ModelConfig::from_json(&v.to_string(), "config.json".as_ref()).map_err(|e| e.to_string())?;
        crate::models::check_config(&c).map_err(|e| e.to_string())
    }

    fn parse(v: &Value) -> super::Config {
        let c = ModelConfig::from_json(&v.to_string(), "config.json".as_ref()).unwrap();
        c.parse().unwrap()
    }

    #[test]
    fn config_errors_name_the_field() {
        for t in ["deepseek_v2", "deepseek_v3", "kimi_k2"] {
            let mut ok = base(t);
            if t != "deepseek_v2" {
                ok["topk_method"] = json!("noaux_tc");
            }
            check(&ok).unwrap();
            for field in [
                "hidden_size", "intermediate_size", "num_attention_heads", "kv_lora_rank", "qk_rope_head_dim",
                "qk_nope_head_dim", "v_head_dim", "moe_intermediate_size", "num_experts_per_tok",
            ] {
                let mut missing = ok.clone();
                missing.as_object_mut().unwrap().remove(field);
                // mlx-lm's deepseek_v3 defaults num_experts_per_tok to 1.
                if !(field == "num_experts_per_tok" && t != "deepseek_v2") {
                    let e = check(&missing).unwrap_err();
                    assert!(e.contains(field), "{t}: missing {field}: {e}");
                }
                let mut zero = ok.clone();
                zero[field] = json!(0);
                let e = check(&zero).unwrap_err();
                assert!(e.contains(field), "{t}: zero {field}: {e}");
            }
            for (field, bad) in [("q_lora_rank", json!(0)), ("n_group", json!(3)), ("topk_group", json!(5)), ("moe_layer_freq", json!(0))] {
                let mut v = ok.clone();
                v[field] = bad;
                let e = check(&v).unwrap_err();
                assert!(e.contains(field), "{t}: {field}: {e}");
            }
        }
        let mut v = base("deepseek_v3");
        v["topk_method"] = json!("greedy");
        assert!(check(&v).unwrap_err().contains("topk_method"));
        let mut v = base("deepseek_v2");
        v.as_object_mut().unwrap().remove("rope_scaling");
        assert!(check(&v).unwrap_err().contains("rope_scaling"));
    }

    #[test]
    fn defaults_and_scale_follow_mlx_lm() {
        let mut v = base("deepseek_v3");
        v.as_object_mut().unwrap().remove("q_lora_rank");
        assert_eq!(parse(&v).q_lora_rank, Some(1536));
        v["q_lora_rank"] = Value::Null;
        assert_eq!(parse(&v).q_lora_rank, None);
        let c = parse(&v);
        // (64 + 16)^-0.5 · (0.1 · 0.8 · ln 4 + 1)²
        let s = 0.1 * 0.8 * 4f64.ln() + 1.0;
        assert_eq!(c.softmax_scale(), (80f64.powf(-0.5) * s * s) as f32);
        assert!(!c.is_moe_layer(0) && c.is_moe_layer(1) && c.is_moe_layer(2));
        v["moe_layer_freq"] = json!(2);
        let c = parse(&v);
        assert!(!c.is_moe_layer(1) && c.is_moe_layer(2));
        assert!(matches!(
            c.routing(),
            super::RoutingKind::NoAuxTc { n_group: 4, topk_group: 2, norm_topk_prob: true }
        ));
        v["rope_scaling"]["type"] = json!("deepseek_yarn");
        assert!(matches!(parse(&v).rope().unwrap().scaling, crate::loader::RopeScaling::Yarn { .. }));
    }
}
