//! gemma3_text, and the text model of gemma3 (multimodal) checkpoints. Follows mlx-lm 0.32.2
//! `models/gemma3_text.py` and its wrapper `models/gemma3.py`:
//! - layers alternate sliding-window attention (rope base `rope_local_base_freq`, a
//!   [`RotatingKvCache`] of `sliding_window` tokens) and global attention (`rope_theta` and
//!   `rope_scaling`, a full [`KvCache`]): layer i is global when
//!   `i % sliding_window_pattern == sliding_window_pattern - 1` (mlx-lm reads no `layer_types`);
//! - softmax scale `query_pre_attn_scalar^-0.5`, per-head q/k RMSNorm, every norm Gemma's `1 + w`;
//! - each block: x + post_attn_norm(attn(input_norm(x))), then h + post_ff_norm(mlp(pre_ff_norm(h))),
//!   with a GeGLU MLP; float16 residual sums are taken in float32 and clipped to float16's range;
//! - input embeddings times sqrt(hidden_size) rounded to bfloat16, then cast to their dtype;
//! - the output head is tied exactly when the checkpoint has no `lm_head.weight` (mlx-lm's
//!   sanitize; config.json's `tie_word_embeddings` is not read). No final logit softcapping:
//!   mlx-lm ignores `final_logit_softcapping`, and so does this file.
//!
//! gemma3 (`model_type` "gemma3" outside, or as `outer_model_type` over a `text_config`): the
//! text model's weights sit under `language_model.`, the vision tower and projector are dropped,
//! and the text config's heads default to 8 query / 4 KV heads instead of 4 / 1.
use super::transformer::validate_heads;
use super::stack::{Layer, Stack};
use super::gemma3_vision::Gemma3Vision;
use super::vision_lm::VisionLm;
use super::{ArchConfig, Architecture, LmHead, Loadable};
use crate::media::Gemma3ImageProcessor;
use crate::error::Result;
use crate::loader::{check_size, ModelConfig, RopeConfig, RopeFields, Vb};
use crate::mlx::{Array, Dtype};
use crate::nn::{
    Attention, AttentionSpec, Cache, Embedding, GateActivation, GatedMlp, Params, RmsNorm, Rope,
    
};
use serde::Deserialize;
use serde_json::Value;

// ---- config -------------------------------------------------------------------------------

/// config.json (or the merged `text_config`) as mlx-lm's gemma3_text `ModelArgs` reads it, with
/// its defaults for absent fields.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct Gemma3Config {
    pub model_type: String,
    /// "gemma3" when this is the `text_config` of a multimodal checkpoint.
    pub outer_model_type: Option<String>,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub intermediate_size: usize,
    /// Default 4 (8 in a gemma3 wrapper).
    pub num_attention_heads: Option<usize>,
    /// Default 1 (4 in a gemma3 wrapper).
    pub num_key_value_heads: Option<usize>,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub vocab_size: usize,
    pub rope_theta: f32,
    pub rope_local_base_freq: f32,
    pub query_pre_attn_scalar: f64,
    pub sliding_window: usize,
    pub sliding_window_pattern: usize,
    pub max_position_embeddings: usize,
    pub rope_scaling: Option<Value>,
}

impl Default for Gemma3Config {
    fn default() -> Self {
        Gemma3Config {
            model_type: "gemma3_text".into(),
            outer_model_type: None,
            hidden_size: 1152,
            num_hidden_layers: 26,
            intermediate_size: 6912,
            num_attention_heads: None,
            num_key_value_heads: None,
            head_dim: 256,
            rms_norm_eps: 1e-6,
            vocab_size: 262144,
            rope_theta: 1_000_000.0,
            rope_local_base_freq: 10_000.0,
            query_pre_attn_scalar: 256.0,
            sliding_window: 512,
            sliding_window_pattern: 6,
            max_position_embeddings: 32768,
            rope_scaling: None,
        }
    }
}

impl Gemma3Config {
    /// The text model of a gemma3 (multimodal) checkpoint.
    pub fn is_wrapped(&self) -> bool {
        self.model_type == "gemma3" || self.outer_model_type.as_deref() == Some("gemma3")
    }

    pub fn num_heads(&self) -> usize {
        self.num_attention_heads.unwrap_or(if self.is_wrapped() { 8 } else { 4 })
    }

    pub fn num_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(if self.is_wrapped() { 4 } else { 1 })
    }

    /// Layer `i` attends globally (else within the sliding window).
    pub fn is_global(&self, i: usize) -> bool {
        i % self.sliding_window_pattern == self.sliding_window_pattern - 1
    }

    /// Rotary settings of the global layers (`rope_theta`, `rope_scaling`; never traditional).
    pub fn global_rope(&self) -> std::result::Result<RopeConfig, String> {
        let fields = RopeFields { rope_theta: Some(self.rope_theta), rope_scaling: self.rope_scaling.clone(), ..Default::default() };
        fields.parse(self.rope_theta)
    }

    /// Rotary settings of the sliding-window layers: plain, base `rope_local_base_freq`.
    pub fn local_rope(&self) -> RopeConfig {
        RopeConfig { theta: self.rope_local_base_freq, traditional: false, scaling: Default::default() }
    }

    pub fn attention_spec(&self) -> AttentionSpec {
        AttentionSpec {
            hidden: self.hidden_size,
            n_heads: self.num_heads(),
            n_kv_heads: self.num_kv_heads(),
            head_dim: self.head_dim,
            qkv_bias: false,
            o_bias: false,
            qk_norm: Some((self.rms_norm_eps, true)),
            // mlx-lm takes the power in double precision.
            scale: self.query_pre_attn_scalar.powf(-0.5) as f32,
            sinks: false,
        }
    }
}

impl ArchConfig for Gemma3Config {
    fn validate(&self) -> std::result::Result<(), String> {
        for (name, v) in [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("intermediate_size", self.intermediate_size),
            ("vocab_size", self.vocab_size),
            ("head_dim", self.head_dim),
            ("sliding_window", self.sliding_window),
            ("sliding_window_pattern", self.sliding_window_pattern),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            check_size(name, v)?;
        }
        validate_heads(self.num_heads(), self.num_kv_heads(), self.hidden_size, Some(self.head_dim))?;
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0) {
            return Err(format!("field 'rms_norm_eps' = {} is out of range", self.rms_norm_eps));
        }
        for (name, v) in [
            ("query_pre_attn_scalar", self.query_pre_attn_scalar),
            ("rope_theta", self.rope_theta as f64),
            ("rope_local_base_freq", self.rope_local_base_freq as f64),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("field '{name}' = {v} must be positive"));
            }
        }
        self.global_rope().map(|_| ())
    }
}

// ---- block --------------------------------------------------------------------------------

/// `x + y`; in float16 the sum is taken in float32 and clipped to float16's range (mlx-lm's
/// `clip_residual`).
fn residual(x: &Array, y: &Array) -> Result<Array> {
    if x.dtype() != Dtype::Float16 {
        return x.add(y);
    }
    let bound = 65504.0;
    let sum = x.astype(Dtype::Float32)?.add(&y.astype(Dtype::Float32)?)?;
    sum.maximum(&Array::scalar_f32(-bound, Dtype::Float32)?)?
        .minimum(&Array::scalar_f32(bound, Dtype::Float32)?)?
        .astype(Dtype::Float16)
}

pub struct Gemma3Block {
    pub input_layernorm: RmsNorm,
    pub self_attn: Attention,
    pub post_attention_layernorm: RmsNorm,
    pub pre_feedforward_layernorm: RmsNorm,
    pub mlp: GatedMlp,
    pub post_feedforward_layernorm: RmsNorm,
}

impl Layer for Gemma3Block {
    fn forward(&self, x: &Array, cache: &mut dyn Cache) -> Result<Array> {
        let r = self.self_attn.forward(&self.input_layernorm.forward(x)?, cache)?;
        let h = residual(x, &self.post_attention_layernorm.forward(&r)?)?;
        let r = self.mlp.forward(&self.pre_feedforward_layernorm.forward(&h)?)?;
        residual(&h, &self.post_feedforward_layernorm.forward(&r)?)
    }
}

impl Gemma3Block {
    /// Layer module `vb` (`model.layers.{i}`).
    pub fn load(vb: &Vb, c: &Gemma3Config, rope: Rope) -> Result<Self> {
        let (hidden, eps) = (c.hidden_size, c.rms_norm_eps);
        let norm = |name: &str| RmsNorm::load_plus_one(&vb.pp(name), hidden, eps);
        Ok(Gemma3Block {
            input_layernorm: norm("input_layernorm")?,
            self_attn: Attention::load(&vb.pp("self_attn"), &c.attention_spec(), Some(rope))?,
            post_attention_layernorm: norm("post_attention_layernorm")?,
            pre_feedforward_layernorm: norm("pre_feedforward_layernorm")?,
            mlp: GatedMlp::load(&vb.pp("mlp"), hidden, c.intermediate_size, false, GateActivation::GeluTanh)?,
            post_feedforward_layernorm: norm("post_feedforward_layernorm")?,
        })
    }
}

impl Params for Gemma3Block {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.input_layernorm, self.self_attn, self.post_attention_layernorm,
            self.pre_feedforward_layernorm, self.mlp, self.post_feedforward_layernorm);
    }
}

// ---- model --------------------------------------------------------------------------------

/// Gemma 3's text model: the shared stack over its four-norm blocks, with embeddings scaled by
/// sqrt(hidden_size) rounded to bfloat16 (mlx-lm rounds it so, whatever the model's dtype).
pub type Gemma3Text = Stack<Gemma3Block>;

// ---- load ---------------------------------------------------------------------------------

impl Loadable for Gemma3Text {
    type Config = Gemma3Config;

    fn load(c: Gemma3Config, _: &ModelConfig, vb: &Vb) -> Result<Self> {
        let root = if c.is_wrapped() {
            // The vision side is loaded before (`load_with_vision`); what is left is dropped.
            vb.pp("vision_tower").discard_all();
            vb.pp("multi_modal_projector").discard_all();
            vb.pp("language_model")
        } else {
            vb.clone()
        };
        let m = root.pp("model");
        let global_rope = c.global_rope().map_err(crate::error::Error::InvalidArgument)?;
        let local_rope = c.local_rope();
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut windows = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let (rope, window) = if c.is_global(i) {
                (Rope::new(c.head_dim, &global_rope, Some(c.max_position_embeddings))?, None)
            } else {
                (Rope::new(c.head_dim, &local_rope, None)?, Some(c.sliding_window))
            };
            layers.push(Gemma3Block::load(&m.pp("layers").pp(i), &c, rope)?);
            windows.push(window);
        }
        let tied = !root.pp("lm_head").contains("weight");
        Ok(Stack {
            embed_tokens: Embedding::load(&m.pp("embed_tokens"), c.vocab_size, c.hidden_size)?,
            layers,
            norm: RmsNorm::load_plus_one(&m.pp("norm"), c.hidden_size, c.rms_norm_eps)?,
            lm_head: LmHead::load(&root, tied, c.hidden_size, c.vocab_size)?,
            embed_scale: Some(Array::scalar_f32((c.hidden_size as f64).sqrt() as f32, Dtype::Bfloat16)?),
            windows,
            vocab_size: c.vocab_size,
        })
    }
}

pub const ARCH: Architecture = Architecture {
    model_type: "gemma3_text",
    aliases: &["gemma3"],
    check: super::check_as::<Gemma3Text>,
    load: load_with_vision,
};

/// A gemma3 checkpoint with a `vision_config` gets its vision tower too ([`VisionLm`]); the
/// tower's tensors are taken first (the text model drops whatever of them is left).
fn load_with_vision(c: &ModelConfig, vb: &Vb) -> Result<Box<dyn super::CausalLm>> {
    let vision = if c.raw.get("outer_model_type").and_then(Value::as_str) == Some("gemma3") || c.model_type == "gemma3" {
        Gemma3Vision::load(&c.raw, vb)?
    } else {
        None
    };
    let text = super::load_as::<Gemma3Text>(c, vb)?;
    let Some(vision) = vision else { return Ok(text) };
    let image_token = c.raw.get("image_token_index").and_then(Value::as_u64).unwrap_or(262_144) as u32;
    if image_token as usize >= text.vocab_size() {
        return Err(c.error(format!("image_token_index {image_token} is outside the vocabulary ({})", text.vocab_size())));
    }
    let dir = c.path.parent().map(std::path::Path::to_path_buf).unwrap_or_default();
    let processor = image_processor(&dir)?;
    let size = vision.image_size() as u32;
    let processor = Gemma3ImageProcessor { height: size, width: size, ..processor };
    Ok(Box::new(VisionLm::gemma3(text, vision, image_token, processor)))
}

/// The image processor's settings as transformers loads them for mlx-vlm: `processor_config.json`'s
/// `image_processor` when it has one, else `preprocessor_config.json`, else the defaults. A bad
/// setting is an error naming the file and the key.
fn image_processor(dir: &std::path::Path) -> Result<Gemma3ImageProcessor> {
    use crate::error::Error;
    let read = |name: &str| -> Result<Option<(std::path::PathBuf, Value)>> {
        let path = dir.join(name);
        if !path.is_file() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        let json: Value = serde_json::from_str(&text).map_err(|e| Error::checkpoint(&path, format!("not JSON: {e}")))?;
        Ok(Some((path, json)))
    };
    let nested = read("processor_config.json")?.filter(|(_, j)| j.get("image_processor").is_some_and(Value::is_object));
    match nested.map_or_else(|| read("preprocessor_config.json"), |n| Ok(Some(n)))? {
        Some((path, json)) => {
            Gemma3ImageProcessor::from_preprocessor_config(&json).map_err(|e| Error::checkpoint(&path, e.to_string()))
        }
        None => Ok(Gemma3ImageProcessor::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(extra: Value) -> Gemma3Config {
        let mut v = json!({"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 320});
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn defaults_and_layer_kinds() {
        let c = config(json!({"sliding_window_pattern": 2}));
        assert!(c.validate().is_ok());
        assert_eq!((c.sliding_window, c.query_pre_attn_scalar, c.rope_local_base_freq), (512, 256.0, 10_000.0));
        assert_eq!((0..4).map(|i| c.is_global(i)).collect::<Vec<_>>(), [false, true, false, true]);
        let wrapped = config(json!({"outer_model_type": "gemma3", "num_attention_heads": null, "num_key_value_heads": null}));
        assert_eq!((wrapped.num_heads(), wrapped.num_kv_heads()), (8, 4));
        let plain = config(json!({"num_attention_heads": null, "num_key_value_heads": null}));
        assert_eq!((plain.num_heads(), plain.num_kv_heads()), (4, 1));
    }

    #[test]
    fn bad_fields_are_named() {
        for (extra, field) in [
            (json!({"sliding_window": 0}), "sliding_window"),
            (json!({"sliding_window_pattern": 0}), "sliding_window_pattern"),
            (json!({"query_pre_attn_scalar": 0}), "query_pre_attn_scalar"),
            (json!({"head_dim": 15}), "head_dim"),
            (json!({"num_key_value_heads": 3}), "num_key_value_heads"),
            (json!({"rope_scaling": {"rope_type": "linear"}}), "factor"),
        ] {
            let err = config(extra.clone()).validate().expect_err(&format!("{extra} should be refused"));
            assert!(err.contains(field), "{extra}: '{err}' does not name {field}");
        }
    }
}
