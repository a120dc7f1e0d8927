//! Gemma 3's vision side (issue 15): the SigLIP encoder that turns an image's pixels into patch
//! features, and the projector that pools them into the text model's image tokens. Follows
//! mlx-vlm 0.7.10 `models/gemma3/vision.py` and `gemma3.py` (`Gemma3MultiModalProjector`), and
//! is checked against them by tests/vision.rs:
//! - patch embedding: a `patch_size`-strided convolution with bias (done here as patches times a
//!   matrix: the same sums), plus a learned position embedding per patch;
//! - `num_hidden_layers` pre-norm blocks: LayerNorm → multi-head attention (biased q/k/v/out, no
//!   mask: every patch sees every patch) → residual, LayerNorm → fc1 → GELU (tanh form, MLX's
//!   "precise") → fc2 → residual; then a final LayerNorm (eps 1e-5 in mlx-vlm, not the config's);
//! - projector: the `P×P` patch grid average-pooled to `√mm_tokens_per_image` a side, Gemma's
//!   RMSNorm (`1 + w`), then `· mm_input_projection_weight` (`[vision, text]`, not transposed).
//!
//! The checkpoint's weights sit under `vision_tower.vision_model.` and `multi_modal_projector.`;
//! the convolution's weight may be stored as MLX lays it out (`[out, kh, kw, in]`, mlx-vlm
//! converted checkpoints) or as PyTorch does (`[out, in, kh, kw]`), and both load.
use serde::Deserialize;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::loader::Vb;
use crate::mlx::fast::{self, AttentionMask};
use crate::mlx::{Array, Dtype};
use crate::nn::activation::gelu_approx;
use crate::nn::{LayerNorm, Linear, Params, RmsNorm};

/// `vision_config` of a gemma3 config.json, with mlx-vlm's defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct VisionConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub patch_size: usize,
    pub image_size: usize,
    pub num_channels: usize,
    pub layer_norm_eps: f32,
}

impl Default for VisionConfig {
    /// google/gemma-3-4b-it's.
    fn default() -> Self {
        VisionConfig {
            hidden_size: 1152,
            intermediate_size: 4304,
            num_hidden_layers: 27,
            num_attention_heads: 16,
            patch_size: 14,
            image_size: 896,
            num_channels: 3,
            layer_norm_eps: 1e-6,
        }
    }
}

impl VisionConfig {
    fn validate(&self, tokens_per_image: usize) -> std::result::Result<(), String> {
        let positive = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("patch_size", self.patch_size),
            ("image_size", self.image_size),
            ("num_channels", self.num_channels),
        ];
        super::vision_lm::check_sizes(&positive)?;
        if self.hidden_size % self.num_attention_heads != 0 {
            return Err("vision_config.hidden_size is not a multiple of num_attention_heads".into());
        }
        if self.image_size % self.patch_size != 0 {
            return Err("vision_config.image_size is not a multiple of patch_size".into());
        }
        let side = self.image_size / self.patch_size;
        let tokens_side = (tokens_per_image as f64).sqrt() as usize;
        if tokens_side == 0 || tokens_side * tokens_side != tokens_per_image || side % tokens_side != 0 {
            return Err(format!(
                "mm_tokens_per_image {tokens_per_image} is not a square whose side divides the {side}×{side} patch grid"
            ));
        }
        Ok(())
    }
}

struct EncoderLayer {
    layer_norm1: LayerNorm,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    out_proj: Linear,
    layer_norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

impl EncoderLayer {
    fn load(vb: &Vb, c: &VisionConfig) -> Result<Self> {
        let (d, eps) = (c.hidden_size, c.layer_norm_eps);
        let attn = vb.pp("self_attn");
        Ok(EncoderLayer {
            layer_norm1: LayerNorm::load(&vb.pp("layer_norm1"), d, eps)?,
            q_proj: Linear::load(&attn.pp("q_proj"), d, d, true)?,
            k_proj: Linear::load(&attn.pp("k_proj"), d, d, true)?,
            v_proj: Linear::load(&attn.pp("v_proj"), d, d, true)?,
            out_proj: Linear::load(&attn.pp("out_proj"), d, d, true)?,
            layer_norm2: LayerNorm::load(&vb.pp("layer_norm2"), d, eps)?,
            fc1: Linear::load(&vb.pp("mlp").pp("fc1"), d, c.intermediate_size, true)?,
            fc2: Linear::load(&vb.pp("mlp").pp("fc2"), c.intermediate_size, d, true)?,
        })
    }

    fn forward(&self, x: &Array, heads: i32) -> Result<Array> {
        let shape = x.shape();
        let (b, l, d) = (shape[0], shape[1], shape[2]);
        let h = self.layer_norm1.forward(x)?;
        let split = |t: Array| t.reshape(&[b, l, heads, d / heads])?.transpose(&[0, 2, 1, 3]);
        let q = split(self.q_proj.forward(&h)?)?;
        let k = split(self.k_proj.forward(&h)?)?;
        let v = split(self.v_proj.forward(&h)?)?;
        let scale = ((d / heads) as f32).powf(-0.5);
        let attn = fast::scaled_dot_product_attention(&q, &k, &v, scale, AttentionMask::None)?;
        let attn = attn.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, d])?;
        let x = x.add(&self.out_proj.forward(&attn)?)?;
        let h = gelu_approx(&self.fc1.forward(&self.layer_norm2.forward(&x)?)?)?;
        x.add(&self.fc2.forward(&h)?)
    }
}

/// The SigLIP encoder and Gemma 3's projector.
pub struct Gemma3Vision {
    config: VisionConfig,
    /// `[patch·patch·channels, hidden]`: the convolution as a matrix over (kh, kw, channel).
    patch_weight_t: Array,
    patch_bias: Array,
    position_embedding: Array,
    layers: Vec<EncoderLayer>,
    post_layernorm: LayerNorm,
    soft_emb_norm: RmsNorm,
    /// `[vision hidden, text hidden]`.
    projection: Array,
    tokens_per_image: usize,
    text_hidden: usize,
}

impl Gemma3Vision {
    /// The vision side of a gemma3 checkpoint (`raw`: its config.json, text fields merged over
    /// the top level as `ModelConfig::raw` holds it), or `None` when it has no `vision_config`.
    pub fn load(raw: &Value, vb: &Vb) -> Result<Option<Self>> {
        let Some(vc) = raw.get("vision_config") else { return Ok(None) };
        let config: VisionConfig = serde_json::from_value(vc.clone())
            .map_err(|e| Error::InvalidArgument(format!("config.json: vision_config: {e}")))?;
        let field = |name: &str, default: u64| raw.get(name).and_then(Value::as_u64).unwrap_or(default) as usize;
        let text_hidden = field("hidden_size", 0);
        let tokens_per_image = field("mm_tokens_per_image", 256);
        if text_hidden == 0 {
            return Err(Error::InvalidArgument("config.json: the text model's hidden_size is missing".into()));
        }
        config.validate(tokens_per_image).map_err(|e| Error::InvalidArgument(format!("config.json: {e}")))?;
        let (d, p, ch) = (config.hidden_size, config.patch_size, config.num_channels);
        let tower = vb.pp("vision_tower").pp("vision_model");
        let emb = tower.pp("embeddings");
        let conv = emb.pp("patch_embedding");
        // Stored [out, kh, kw, in] (MLX) or [out, in, kh, kw] (PyTorch); the matrix wants the former.
        let w = match conv.stored_shape("weight") {
            Some(s) if s == [d, ch, p, p] && s != [d, p, p, ch] => conv.get("weight", &[d, ch, p, p])?.transpose(&[0, 2, 3, 1])?,
            _ => conv.get("weight", &[d, p, p, ch])?,
        };
        let patch_weight_t = w.reshape(&[d as i32, (p * p * ch) as i32])?.transpose(&[1, 0])?;
        let patches = (config.image_size / p) * (config.image_size / p);
        let layers = (0..config.num_hidden_layers)
            .map(|i| EncoderLayer::load(&tower.pp("encoder").pp("layers").pp(i), &config))
            .collect::<Result<Vec<_>>>()?;
        let proj = vb.pp("multi_modal_projector");
        Ok(Some(Gemma3Vision {
            patch_bias: conv.get("bias", &[d])?,
            position_embedding: emb.pp("position_embedding").get("weight", &[patches, d])?,
            patch_weight_t,
            layers,
            post_layernorm: LayerNorm::load(&tower.pp("post_layernorm"), d, 1e-5)?,
            soft_emb_norm: RmsNorm::load_plus_one(&proj.pp("mm_soft_emb_norm"), d, config.layer_norm_eps)?,
            projection: proj.get("mm_input_projection_weight", &[d, text_hidden])?,
            tokens_per_image,
            text_hidden,
            config,
        }))
    }

    /// The image side length the processor must resize to.
    pub fn image_size(&self) -> usize {
        self.config.image_size
    }

    /// The text tokens one image becomes.
    pub fn tokens_per_image(&self) -> usize {
        self.tokens_per_image
    }

    /// The encoder's output: `pixels` `[B, channels, size, size]` (as the processor makes them)
    /// to patch features `[B, patches, vision hidden]`.
    pub fn tower(&self, pixels: &Array) -> Result<Array> {
        let c = &self.config;
        let shape = pixels.shape();
        let (s, p, ch) = (c.image_size as i32, c.patch_size as i32, c.num_channels as i32);
        if shape.len() != 4 || shape[1] != ch || shape[2] != s || shape[3] != s {
            return Err(Error::InvalidArgument(format!(
                "image pixels must be [batch, {ch}, {s}, {s}], got {shape:?}"
            )));
        }
        let (b, g) = (shape[0], s / p);
        let dtype = self.patch_weight_t.dtype();
        // NCHW → patches [B, g·g, p·p·ch] ordered (row, col) and, inside, (kh, kw, channel).
        let x = pixels
            .astype(dtype)?
            .transpose(&[0, 2, 3, 1])?
            .reshape(&[b, g, p, g, p, ch])?
            .transpose(&[0, 1, 3, 2, 4, 5])?
            .reshape(&[b, g * g, p * p * ch])?;
        let mut x = Array::addmm(&self.patch_bias, &x, &self.patch_weight_t, 1.0, 1.0)?;
        x = x.add(&self.position_embedding)?;
        let heads = c.num_attention_heads as i32;
        for layer in &self.layers {
            x = layer.forward(&x, heads)?;
        }
        self.post_layernorm.forward(&x)
    }

    /// The projector: patch features `[B, patches, vision hidden]` to image tokens
    /// `[B, tokens_per_image, text hidden]`.
    pub fn project(&self, features: &Array) -> Result<Array> {
        let shape = features.shape();
        let (b, d) = (shape[0], shape[2]);
        let g = (self.config.image_size / self.config.patch_size) as i32;
        let t = (self.tokens_per_image as f64).sqrt() as i32;
        let k = g / t;
        let pooled = features.reshape(&[b, t, k, t, k, d])?.mean(&[2, 4], false)?.reshape(&[b, t * t, d])?;
        let normed = self.soft_emb_norm.forward(&pooled)?;
        normed.matmul(&self.projection)?.astype(features.dtype())
    }

    /// Both: pixels to image tokens.
    pub fn encode(&self, pixels: &Array) -> Result<Array> {
        self.project(&self.tower(pixels)?)
    }

    /// mlx-vlm's `prepare_inputs_for_multimodal`: the token embeddings `h` `[1, L, text hidden]`
    /// (unscaled, as `CausalLm::embed` gives them) with each run of `image_token` in `tokens`
    /// replaced by the next image's tokens of `images` (`encode`'s `[N, tokens_per_image, text
    /// hidden]`) divided by √hidden: the language model scales every row by √hidden (rounded to
    /// bfloat16), so image rows reach it as the projector made them, up to that rounding.
    /// (mlx-vlm divides by the top-level config's `hidden_size`, 2048 when absent, whatever the
    /// text model's width: a scale of √(width/2048) Hugging Face does not apply. mlex takes the
    /// text model's width, as mlx-vlm does when the checkpoint's config.json states it.)
    pub fn merge_image_tokens(&self, h: &Array, tokens: &[u32], image_token: u32, images: &Array) -> Result<Array> {
        let t = self.tokens_per_image;
        let (shape, img_shape) = (h.shape(), images.shape());
        if shape.len() != 3 || shape[0] != 1 || shape[1] as usize != tokens.len() {
            return Err(Error::InvalidArgument(format!("embeddings {shape:?} do not match {} tokens", tokens.len())));
        }
        let mut runs = vec![];
        let mut i = 0;
        while i < tokens.len() {
            if tokens[i] == image_token {
                let start = i;
                while i < tokens.len() && tokens[i] == image_token {
                    i += 1;
                }
                if i - start != t {
                    return Err(Error::InvalidArgument(format!(
                        "the prompt holds a run of {} image tokens at position {start}; an image takes {t}",
                        i - start
                    )));
                }
                runs.push(start);
            } else {
                i += 1;
            }
        }
        if img_shape.len() != 3 || img_shape[0] as usize != runs.len() || img_shape[1] as usize != t {
            return Err(Error::InvalidArgument(format!(
                "the prompt has places for {} image(s) of {t} tokens, the images are {img_shape:?}",
                runs.len()
            )));
        }
        let scaled = self.merge_scale(images)?.astype(h.dtype())?;
        let mut parts = vec![];
        let mut at = 0i32;
        for (k, &start) in runs.iter().enumerate() {
            let start = start as i32;
            if start > at {
                parts.push(h.slice_axis(1, at, start)?);
            }
            parts.push(scaled.slice_axis(0, k as i32, k as i32 + 1)?);
            at = start + t as i32;
        }
        if (at as usize) < tokens.len() {
            parts.push(h.slice_axis(1, at, tokens.len() as i32)?);
        }
        Array::concatenate(&parts.iter().collect::<Vec<_>>(), 1)
    }

    /// Image tokens as they join the token embeddings: divided by √hidden (see
    /// [`Self::merge_image_tokens`]).
    pub fn merge_scale(&self, images: &Array) -> Result<Array> {
        images.divide(&Array::scalar_f32((self.text_hidden as f64).sqrt() as f32, images.dtype())?)
    }

    /// The compute dtype of the tower (its weights').
    pub fn dtype(&self) -> Dtype {
        self.patch_weight_t.dtype()
    }
}

impl Params for Gemma3Vision {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        out.extend([&self.patch_weight_t, &self.patch_bias, &self.position_embedding, &self.projection]);
        for l in &self.layers {
            for lin in [&l.q_proj, &l.k_proj, &l.v_proj, &l.out_proj, &l.fc1, &l.fc2] {
                lin.params(out);
            }
            l.layer_norm1.params(out);
            l.layer_norm2.params(out);
        }
        self.post_layernorm.params(out);
        self.soft_emb_norm.params(out);
    }
}
