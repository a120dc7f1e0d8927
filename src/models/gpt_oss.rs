//! gpt_oss. Follows mlx-lm `models/gpt_oss.py` (with `activations.py`'s `swiglu_oai`,
//! `switch_layers.py`'s `SwitchGLU` and `rope_utils.py`'s `initialize_rope`): a pre-norm decoder
//! whose attention has biases on q/k/v/o and a learned sink logit per head, whose layers alternate
//! between a sliding window and full attention (`layer_types`), and whose MLP is a mixture of
//! experts — a biased router, its top-k logits softmaxed into the mixing weights, experts with
//! biases and the clamped SwiGLU (`(clip(up, ±7) + 1) · g·σ(1.702·g)`, `g = min(gate, 7)`). Rope
//! is `rope_theta` / `rope_scaling` (yarn in the released configs), never traditional; the output
//! head is always its own `lm_head`.
//!
//! Checkpoints in the Hugging Face layout (experts as `gate_up_proj_blocks` / `_scales` / `_bias`
//! with gate and up rows interleaved, mxfp4 blocks of 16 bytes) are rewritten at load as mlx-lm's
//! `sanitize` does; mlx-format checkpoints load as stored.
use super::transformer::validate_heads;
use super::stack::{FeedForwardPart, PreNormBlock, Stack};
use super::{ArchConfig, Architecture, Loadable};
use crate::error::{Error, Result};
use crate::loader::{check_size, ModelConfig, RopeConfig, RopeFields, Vb};
use crate::mlx::{Array, Dtype};
use crate::nn::switch::{combine, top_k};
use crate::nn::{
    Attention, AttentionSpec, ExpertActivation, Linear, Params, 
    Rope, SwitchGlu,
};
use serde::Deserialize;
use serde_json::Value;

// ---- config -------------------------------------------------------------------------------

/// mlx-lm's `ModelArgs` of gpt_oss, with its defaults (every field has one there). Only
/// `rope_theta` and `rope_scaling` describe the rotary embedding (mlx-lm reads neither
/// `rope_parameters` nor `rope_traditional` for this architecture).
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    #[serde(default = "d_layers")]
    pub num_hidden_layers: usize,
    #[serde(default = "d_experts")]
    pub num_local_experts: usize,
    #[serde(default = "d_experts_per_tok")]
    pub num_experts_per_tok: usize,
    #[serde(default = "d_vocab")]
    pub vocab_size: usize,
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f32,
    #[serde(default = "d_hidden")]
    pub hidden_size: usize,
    #[serde(default = "d_hidden")]
    pub intermediate_size: usize,
    #[serde(default = "d_head_dim")]
    pub head_dim: usize,
    #[serde(default = "d_heads")]
    pub num_attention_heads: usize,
    #[serde(default = "d_kv_heads")]
    pub num_key_value_heads: usize,
    #[serde(default = "d_window")]
    pub sliding_window: usize,
    #[serde(default = "d_theta")]
    pub rope_theta: f32,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    /// Per layer, "sliding_attention" or "full_attention"; by default the two alternate,
    /// sliding first.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
}

fn d_layers() -> usize {
    36
}
fn d_experts() -> usize {
    128
}
fn d_experts_per_tok() -> usize {
    4
}
fn d_vocab() -> usize {
    201088
}
fn d_eps() -> f32 {
    1e-5
}
fn d_hidden() -> usize {
    2880
}
fn d_head_dim() -> usize {
    64
}
fn d_heads() -> usize {
    64
}
fn d_kv_heads() -> usize {
    8
}
fn d_window() -> usize {
    128
}
fn d_theta() -> f32 {
    150000.0
}

/// The attention of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Keys of the last `sliding_window` positions only (a rotating cache).
    Sliding,
    Full,
}

impl Config {
    fn rope_fields(&self) -> RopeFields {
        RopeFields {
            rope_theta: Some(self.rope_theta),
            rope_traditional: false,
            rope_scaling: self.rope_scaling.clone(),
            rope_parameters: None,
        }
    }

    fn rope(&self) -> Result<RopeConfig> {
        self.rope_fields().parse(self.rope_theta).map_err(Error::InvalidArgument)
    }

    /// Each layer's kind: `layer_types`, or mlx-lm's default (sliding, full, sliding, …).
    pub fn layer_kinds(&self) -> std::result::Result<Vec<LayerKind>, String> {
        let Some(types) = &self.layer_types else {
            if self.num_hidden_layers % 2 != 0 {
                // mlx-lm's default list has 2·(n // 2) entries and would silently skip the last
                // layer: ask for the pattern instead.
                return Err(format!(
                    "field 'layer_types' is needed: num_hidden_layers = {} is odd, so the default \
                     sliding/full alternation does not cover every layer",
                    self.num_hidden_layers
                ));
            }
            return Ok((0..self.num_hidden_layers).map(|i| if i % 2 == 0 { LayerKind::Sliding } else { LayerKind::Full }).collect());
        };
        if types.len() != self.num_hidden_layers {
            return Err(format!(
                "field 'layer_types' has {} entries for num_hidden_layers = {}",
                types.len(),
                self.num_hidden_layers
            ));
        }
        types
            .iter()
            .enumerate()
            .map(|(i, t)| match t.as_str() {
                "sliding_attention" => Ok(LayerKind::Sliding),
                "full_attention" => Ok(LayerKind::Full),
                other => Err(format!(
                    "field 'layer_types[{i}]' = '{other}' is neither 'sliding_attention' nor 'full_attention'"
                )),
            })
            .collect()
    }

    fn attention_spec(&self) -> AttentionSpec {
        AttentionSpec {
            hidden: self.hidden_size,
            n_heads: self.num_attention_heads,
            n_kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            qkv_bias: true,
            o_bias: true,
            qk_norm: None,
            // `1 / math.sqrt(head_dim)` in double precision, as Python computes it.
            scale: (1.0 / (self.head_dim as f64).sqrt()) as f32,
            sinks: true,
        }
    }
}

impl ArchConfig for Config {
    fn validate(&self) -> std::result::Result<(), String> {
        for (name, v) in [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("num_local_experts", self.num_local_experts),
            ("num_experts_per_tok", self.num_experts_per_tok),
            ("sliding_window", self.sliding_window),
            ("vocab_size", self.vocab_size),
        ] {
            check_size(name, v)?;
        }
        validate_heads(self.num_attention_heads, self.num_key_value_heads, self.hidden_size, Some(self.head_dim))?;
        if self.num_experts_per_tok > self.num_local_experts {
            return Err(format!(
                "field 'num_experts_per_tok' = {} exceeds num_local_experts = {}",
                self.num_experts_per_tok, self.num_local_experts
            ));
        }
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0) {
            return Err(format!("field 'rms_norm_eps' = {} is out of range", self.rms_norm_eps));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(format!("field 'rope_theta' = {} must be positive", self.rope_theta));
        }
        self.layer_kinds()?;
        self.rope_fields().parse(self.rope_theta).map(|_| ())
    }
}

// ---- block --------------------------------------------------------------------------------

/// mlx-lm's `MLPBlock`: route each token to its top-k experts, mix their outputs by the softmax
/// of the picked router logits.
pub struct MoeBlock {
    pub router: Linear,
    pub experts: SwitchGlu,
    pub k: usize,
}

impl MoeBlock {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let logits = self.router.forward(x)?;
        // `argpartition(g, kth=-k)[..., -k:]`: the k largest, in the partition's order.
        let (indices, picked) = top_k(&logits, self.k, true)?;
        let weights = picked.softmax(-1, true)?;
        let y = self.experts.forward(x, &indices)?;
        combine(&y, &weights, None)
    }

    /// Module `vb` (`model.layers.{i}.mlp`).
    fn load(vb: &Vb, c: &Config) -> Result<Self> {
        let experts = vb.pp("experts");
        sanitize_hf_experts(&experts)?;
        Ok(MoeBlock {
            router: Linear::load(&vb.pp("router"), c.hidden_size, c.num_local_experts, true)?,
            experts: SwitchGlu::load(
                &experts,
                c.num_local_experts,
                c.hidden_size,
                c.intermediate_size,
                true,
                ExpertActivation::ClampedSwiglu { alpha: 1.702, limit: 7.0 },
            )?,
            k: c.num_experts_per_tok,
        })
    }
}

impl Params for MoeBlock {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.router, self.experts);
    }
}

/// mlx-lm's `sanitize` for one layer's experts in the Hugging Face layout (a no-op for mlx-format
/// checkpoints): mxfp4 `*_blocks` (`[E, rows, in/32, 16]` bytes) become packed `uint32` weights
/// (`[E, rows, in/8]`), `*_scales` the modules' `scales`, `*_bias` their `bias`; the fused
/// `gate_up_proj` rows alternate gate (even) and up (odd) and are split accordingly.
fn sanitize_hf_experts(vb: &Vb) -> Result<()> {
    let packed = |name: &str, a: Array| -> Result<Array> {
        let s = a.shape();
        if a.dtype() != Dtype::Uint8 || s.len() < 2 || s[s.len() - 1] != 16 {
            return Err(Error::checkpoint(
                "model weights",
                format!("'{}': expected mxfp4 blocks of 16 bytes, got {} {s:?}", vb.path(name), a.dtype().name()),
            ));
        }
        let mut shape = s[..s.len() - 2].to_vec();
        shape.push(s[s.len() - 2] * 4);
        a.view_as(Dtype::Uint32, &shape)
    };
    // `v[..., ::2, :]` and `v[..., 1::2, :]` (axis -2), or `v[..., ::2]` / `v[..., 1::2]` (axis -1).
    let deinterleave = |a: &Array, axis: usize| -> Result<(Array, Array)> {
        let s = a.shape();
        let strided = |first: i32| -> Result<Array> {
            let mut start = vec![0; s.len()];
            let mut strides = vec![1; s.len()];
            start[axis] = first;
            strides[axis] = 2;
            a.slice(&start, &s, &strides)?.contiguous()
        };
        Ok((strided(0)?, strided(1)?))
    };
    let split = |dst: &str, a: Array, axis: usize| -> Result<Vec<(String, Array)>> {
        let (gate, up) = deinterleave(&a, axis)?;
        Ok(vec![(format!("gate_proj.{dst}"), gate), (format!("up_proj.{dst}"), up)])
    };
    let rows = |a: &Array| a.ndim().saturating_sub(2);
    vb.remake("gate_up_proj_blocks", |a| {
        let w = packed("gate_up_proj_blocks", a)?;
        let axis = rows(&w);
        split("weight", w, axis)
    })?;
    vb.remake("gate_up_proj_scales", |a| {
        let axis = rows(&a);
        split("scales", a, axis)
    })?;
    vb.remake("gate_up_proj_bias", |a| {
        let axis = a.ndim().saturating_sub(1);
        split("bias", a, axis)
    })?;
    vb.remake("down_proj_blocks", |a| Ok(vec![("down_proj.weight".into(), packed("down_proj_blocks", a)?)]))?;
    vb.remake("down_proj_scales", |a| Ok(vec![("down_proj.scales".into(), a)]))?;
    vb.remake("down_proj_bias", |a| Ok(vec![("down_proj.bias".into(), a)]))?;
    Ok(())
}

impl FeedForwardPart for MoeBlock {
    fn forward(&self, x: &Array) -> Result<Array> {
        MoeBlock::forward(self, x)
    }
}

/// A gpt-oss layer: attention with sinks, then the experts, pre-norm.
pub type Block = PreNormBlock<Attention, MoeBlock>;

impl Block {
    /// Layer module `vb` (`model.layers.{i}`).
    fn load(vb: &Vb, c: &Config, rope: &RopeConfig) -> Result<Self> {
        let attn = Attention::load(&vb.pp("self_attn"), &c.attention_spec(), Some(Rope::new(c.head_dim, rope, None)?))?;
        Self::with_parts(vb, c.hidden_size, c.rms_norm_eps, attn, MoeBlock::load(&vb.pp("mlp"), c)?)
    }
}

// ---- model --------------------------------------------------------------------------------

/// Each layer's mask comes from its cache: causal over everything (full layers) or over the
/// last `sliding_window` positions (sliding layers), as mlx-lm's `full_mask` / `swa_mask`.
pub type GptOss = Stack<Block>;

// ---- load ---------------------------------------------------------------------------------

impl Loadable for GptOss {
    type Config = Config;

    fn load(c: Config, _: &ModelConfig, vb: &Vb) -> Result<Self> {
        let m = vb.pp("model");
        let rope = c.rope()?;
        let kinds = c.layer_kinds().map_err(Error::InvalidArgument)?;
        let layers = (0..c.num_hidden_layers).map(|i| Block::load(&m.pp("layers").pp(i), &c, &rope)).collect::<Result<_>>()?;
        let mut model = Stack::with_layers(vb, layers, c.hidden_size, c.vocab_size, c.rms_norm_eps, false)?;
        model.windows = kinds.iter().map(|k| (*k == LayerKind::Sliding).then_some(c.sliding_window)).collect();
        Ok(model)
    }
}

pub const ARCH: Architecture = Architecture::new::<GptOss>("gpt_oss", &[]);
