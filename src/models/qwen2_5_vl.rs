//! qwen2_5_vl (Qwen2.5-VL, issue 15): the Qwen2 decoder as mlx-vlm 0.7.10's
//! `models/qwen2_5_vl/language.py` runs it behind its vision tower ([`super::qwen2_5_vision`]):
//! q/k/v with bias, o_proj and the SwiGLU MLP without, `head_dim = hidden / heads`, rope over the
//! whole head at `rope_theta` (default 1e6) as multimodal rope in the "chunked" layout
//! (`rope_scaling.mrope_section`: the first frequencies read the t position, the next h, the
//! next w: [`super::mrope`]), tied embeddings by default. A checkpoint without `vision_config`
//! loads as this text model alone.
//!
//! Weights: mlx-vlm's `language_model.model.*` / `language_model.lm_head`, or Hugging Face's
//! `model.*` (or `model.language_model.*`) / `lm_head`.
use serde::Deserialize;
use serde_json::Value;

use super::mrope::MropeStyle;
use super::mrope_text::{AttentionSpec, MropeText, TextDims};
use super::{ArchConfig, Architecture, CausalLm, Loadable};
use crate::error::{Error, Result};
use crate::loader::{check_size, ModelConfig, Vb};

// ---- config -------------------------------------------------------------------------------

#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    pub vocab_size: usize,
    #[serde(default = "default_theta")]
    pub rope_theta: f32,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default = "default_tie")]
    pub tie_word_embeddings: bool,
}

fn default_eps() -> f32 {
    1e-6
}

fn default_theta() -> f32 {
    1_000_000.0
}

fn default_tie() -> bool {
    true
}

impl Config {
    fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads.max(1)
    }

    /// `rope_scaling.mrope_section` (three sizes), default mlx-vlm's [16, 24, 24].
    fn mrope_section(&self) -> std::result::Result<[usize; 3], String> {
        Ok(super::mrope::mrope_section(self.rope_scaling.as_ref(), "rope_scaling")?.unwrap_or([16, 24, 24]))
    }
}

impl ArchConfig for Config {
    fn validate(&self) -> std::result::Result<(), String> {
        for (name, v) in [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.kv_heads()),
            ("vocab_size", self.vocab_size),
        ] {
            check_size(name, v)?;
        }
        super::transformer::validate_heads(self.num_attention_heads, self.kv_heads(), self.hidden_size, None)?;
        if self.head_dim() % 2 != 0 {
            return Err(format!("hidden_size / num_attention_heads = {} must be even (rope)", self.head_dim()));
        }
        if let Some(kind) = self.rope_scaling.as_ref().and_then(|r| r.get("type").or_else(|| r.get("rope_type"))).and_then(Value::as_str) {
            if kind != "mrope" && kind != "default" {
                return Err(format!("field 'rope_scaling.type' = {kind:?}: only mrope and default are supported"));
            }
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(format!("field 'rope_theta' = {} must be positive", self.rope_theta));
        }
        self.mrope_section().map(|_| ())
    }
}

// ---- model --------------------------------------------------------------------------------

/// Qwen2.5-VL's text model (the skeleton of `mrope_text.rs`: biased q/k/v, no q/k norms, rope
/// sections in chunks).
pub type Qwen2_5VlText = MropeText<Config>;

impl Loadable for Qwen2_5VlText {
    type Config = Config;

    fn load(c: Config, _: &ModelConfig, vb: &Vb) -> Result<Self> {
        let dims = TextDims {
            hidden: c.hidden_size,
            intermediate: c.intermediate_size,
            layers: c.num_hidden_layers,
            vocab: c.vocab_size,
            eps: c.rms_norm_eps,
            tie: Some(c.tie_word_embeddings),
        };
        let attention = AttentionSpec {
            hidden: c.hidden_size,
            heads: c.num_attention_heads,
            kv_heads: c.kv_heads(),
            head_dim: c.head_dim(),
            qkv_bias: true,
            o_bias: false,
            qk_norm_eps: None,
            theta: c.rope_theta,
            section: c.mrope_section().map_err(Error::InvalidArgument)?,
            style: MropeStyle::Chunked,
        };
        MropeText::load(vb, &dims, &attention)
    }
}

/// A qwen2_5_vl checkpoint: with a `vision_config`, the text model behind its tower.
fn load_with_vision(c: &ModelConfig, vb: &Vb) -> Result<Box<dyn CausalLm>> {
    let vision = super::qwen2_5_vision::Qwen25Vision::load(&c.raw, vb).map_err(|e| match e {
        Error::InvalidArgument(m) => c.error(m),
        other => other,
    })?;
    let text = super::load_as::<Qwen2_5VlText>(c, vb)?;
    let Some(vision) = vision else { return Ok(text) };
    let vc = vision.config();
    let patching = (vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size);
    super::qwen_vision::with_tower(c, text, vision, patching, (151_655, 151_656), 14, false)
}

pub const ARCH: Architecture = Architecture {
    model_type: "qwen2_5_vl",
    aliases: &["qwen2_5_vl_text"],
    check: super::check_as::<Qwen2_5VlText>,
    load: load_with_vision,
};
