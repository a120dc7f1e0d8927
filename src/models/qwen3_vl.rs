//! qwen3_vl (Qwen3-VL dense): the Qwen3 decoder as mlx-vlm 0.7.10's `models/qwen3_vl/language.py`
//! runs it behind the Qwen3-VL vision tower ([`super::qwen_vision`], with deepstack): per-head
//! RMSNorm on q and k before the rope, explicit `head_dim`, no projection biases (unless
//! `attention_bias`), the SwiGLU MLP; rope over the whole head at `rope_theta` as multimodal rope
//! in the "interleaved" layout (`rope_scaling.mrope_section`, or `rope_parameters`', default
//! [24, 20, 20]: frequency i reads h when `i % 3 == 1`, w when `i % 3 == 2`, within their
//! sections, else t: [`super::mrope`]); deepstack: the tower's intermediate features
//! (`deepstack_visual_indexes`) added to the hidden states at the image and video positions
//! after each of the first layers, feature i after layer i (`_deepstack_process`). Text positions
//! take plain rope at `offset + the images' shift`. A checkpoint without `vision_config`, or
//! without the tower's tensors (mlx-lm's text-only conversion), loads as this text model alone.
//!
//! Weights: mlx-vlm's `language_model.model.*` / `language_model.lm_head`, or Hugging Face's
//! `model.language_model.*` (or `model.*`) / `lm_head`.
use serde::Deserialize;
use serde_json::Value;

use super::mrope::MropeStyle;
use super::mrope_text::{AttentionSpec, MropeText, TextDims};
use super::{ArchConfig, Architecture, CausalLm, Loadable};
use crate::error::{Error, Result};
use crate::loader::{check_size, ModelConfig, Vb};

// ---- config -------------------------------------------------------------------------------

/// config.json (the merged `text_config`) as mlx-vlm's qwen3_vl `TextConfig` reads it.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    pub vocab_size: usize,
    #[serde(default)]
    pub rope_theta: Option<f32>,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    /// Newer Hugging Face configs: `rope_theta` and `mrope_section` here.
    #[serde(default)]
    pub rope_parameters: Option<Value>,
    /// Unset: tied when the weights hold no `lm_head` (mlx-vlm's default is untied, mlx-lm's
    /// qwen3 tied; real Qwen3-VL configs say).
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default)]
    pub attention_bias: bool,
}

fn default_eps() -> f32 {
    1e-6
}

impl Config {
    fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// `rope_scaling`, else `rope_parameters`.
    fn rope_block(&self) -> Option<&Value> {
        self.rope_scaling.as_ref().filter(|v| !v.is_null()).or(self.rope_parameters.as_ref().filter(|v| !v.is_null()))
    }

    /// `rope_theta`, else `rope_parameters.rope_theta`, else Qwen3-VL's 5e6.
    fn theta(&self) -> f32 {
        let nested = self.rope_parameters.as_ref().and_then(|p| p.get("rope_theta")).and_then(Value::as_f64);
        self.rope_theta.or(nested.map(|t| t as f32)).unwrap_or(5_000_000.0)
    }

    /// `mrope_section` (three sizes, each at most head_dim / 2: see `validate`), default mlx-vlm's
    /// [24, 20, 20].
    fn mrope_section(&self) -> std::result::Result<[usize; 3], String> {
        Ok(super::mrope::mrope_section(self.rope_block(), "rope_scaling")?.unwrap_or([24, 20, 20]))
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
            ("head_dim", self.head_dim()),
            ("vocab_size", self.vocab_size),
        ] {
            check_size(name, v)?;
        }
        super::transformer::validate_heads(self.num_attention_heads, self.kv_heads(), self.hidden_size, self.head_dim)?;
        if self.head_dim() % 2 != 0 {
            return Err(format!("head_dim {} must be even (rope)", self.head_dim()));
        }
        if let Some(kind) = self.rope_block().and_then(|r| r.get("type").or_else(|| r.get("rope_type"))).and_then(Value::as_str) {
            if kind != "mrope" && kind != "default" {
                return Err(format!("field 'rope_scaling.type' = {kind:?}: only mrope and default are supported"));
            }
        }
        if !(self.theta().is_finite() && self.theta() > 0.0) {
            return Err(format!("field 'rope_theta' = {} must be positive", self.theta()));
        }
        let sec = self.mrope_section()?;
        if sec.iter().any(|&s| s > self.head_dim() / 2) {
            return Err(format!("field 'rope_scaling.mrope_section' = {sec:?}: a section is larger than head_dim / 2 = {}", self.head_dim() / 2));
        }
        Ok(())
    }
}

// ---- model --------------------------------------------------------------------------------

/// Qwen3-VL's text model (the skeleton of `mrope_text.rs` with q/k norms and interleaved rope).
pub type Qwen3VlText = MropeText<Config>;

impl Loadable for Qwen3VlText {
    type Config = Config;

    fn load(c: Config, _: &ModelConfig, vb: &Vb) -> Result<Self> {
        let dims = TextDims {
            hidden: c.hidden_size,
            intermediate: c.intermediate_size,
            layers: c.num_hidden_layers,
            vocab: c.vocab_size,
            eps: c.rms_norm_eps,
            tie: c.tie_word_embeddings,
        };
        let attention = AttentionSpec {
            hidden: c.hidden_size,
            heads: c.num_attention_heads,
            kv_heads: c.kv_heads(),
            head_dim: c.head_dim(),
            qkv_bias: c.attention_bias,
            o_bias: c.attention_bias,
            qk_norm_eps: Some(c.rms_norm_eps),
            theta: c.theta(),
            section: c.mrope_section().map_err(Error::InvalidArgument)?,
            style: MropeStyle::Interleaved,
        };
        MropeText::load(vb, &dims, &attention)
    }
}

/// A qwen3_vl checkpoint: with a `vision_config` (and the tower's tensors), the text model behind
/// the Qwen3-VL tower with deepstack, taking images and video (each temporal group after its
/// timestamp, as Qwen3.5); else the text model alone.
fn load_with_vision(c: &ModelConfig, vb: &Vb) -> Result<Box<dyn CausalLm>> {
    let vision = super::qwen_vision::QwenVision::load_deepstack(&c.raw, vb).map_err(|e| match e {
        Error::InvalidArgument(m) => c.error(m),
        other => other,
    })?;
    let text = super::load_as::<Qwen3VlText>(c, vb)?;
    let Some(vision) = vision else { return Ok(text) };
    let vc = vision.config();
    let layers = c.raw.get("num_hidden_layers").and_then(Value::as_u64).unwrap_or(0) as usize;
    if vc.deepstack_visual_indexes.len() > layers {
        return Err(c.error(format!(
            "vision_config.deepstack_visual_indexes lists {} blocks, more than the text model's {layers} layers",
            vc.deepstack_visual_indexes.len()
        )));
    }
    let patching = (vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size);
    super::qwen_vision::with_tower(c, text, vision, patching, (151_655, 151_656), 16, true)
}

pub const ARCH: Architecture = Architecture {
    model_type: "qwen3_vl",
    aliases: &["qwen3_vl_text"],
    check: super::check_as::<Qwen3VlText>,
    load: load_with_vision,
};

#[cfg(test)]
mod tests {
    use crate::loader::ModelConfig;

    /// Qwen3-VL-2B-Instruct's config.json as Hugging Face (and mlx-community) ship it, in short:
    /// the text model's fields under `text_config`, rope in `rope_scaling` or (newer) in
    /// `rope_parameters` with its theta.
    fn config(rope: serde_json::Value) -> ModelConfig {
        let mut text = serde_json::json!({
            "model_type": "qwen3_vl_text", "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
            "vocab_size": 151936, "max_position_embeddings": 262144, "tie_word_embeddings": true,
        });
        for (k, v) in rope.as_object().unwrap() {
            text[k] = v.clone();
        }
        let json = serde_json::json!({
            "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
            "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
            "tie_word_embeddings": true, "text_config": text,
            "vision_config": {"model_type": "qwen3_vl", "depth": 24, "hidden_size": 1024, "intermediate_size": 4096,
                              "num_heads": 16, "out_hidden_size": 2048, "patch_size": 16, "spatial_merge_size": 2,
                              "temporal_patch_size": 2, "num_position_embeddings": 2304,
                              "deepstack_visual_indexes": [5, 11, 17], "hidden_act": "gelu_pytorch_tanh"},
        });
        ModelConfig::from_json(&json.to_string(), std::path::Path::new("config.json")).unwrap()
    }

    #[test]
    fn real_configs_check() {
        let scaling = serde_json::json!({"rope_theta": 5000000, "rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20], "rope_type": "default"}});
        let params = serde_json::json!({"rope_parameters": {"mrope_interleaved": true, "mrope_section": [24, 20, 20], "rope_type": "default", "rope_theta": 5000000}});
        for rope in [scaling, params] {
            let c = config(rope);
            crate::models::check_config(&c).unwrap();
            let parsed = crate::models::parse_config::<super::Qwen3VlText>(&c).unwrap();
            assert_eq!((parsed.theta(), parsed.mrope_section().unwrap(), parsed.head_dim()), (5e6, [24, 20, 20], 128));
        }
        let bad = config(serde_json::json!({"rope_scaling": {"mrope_section": [24, 20, 80], "rope_type": "default"}}));
        let err = crate::models::check_config(&bad).unwrap_err().to_string();
        assert!(err.contains("mrope_section"), "{err}");
    }
}
