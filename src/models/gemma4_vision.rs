//! Gemma 4's vision side (issue 15): the vision encoder that turns an image, at its own aspect
//! ratio, into a variable number of soft tokens, and the embedder that projects them to the text
//! model's width. Follows mlx-vlm 0.7.10 `models/gemma4/vision.py` (`VisionModel`) and
//! `gemma4.py` (`MultimodalEmbedder`), checked against them by tests/vision_gemma4.rs:
//! - patches of `patch_size` pixels, flattened (row, col, channel), mapped from [0, 1] to
//!   `2·(x − 0.5)` and projected without bias; plus a learned 2-D position embedding: a table
//!   `[2, position_embedding_size, hidden]`, row 0 indexed by the patch's column, row 1 by its row;
//! - `num_hidden_layers` blocks of four plain RMSNorms (weight, not `1 + w`) around attention and
//!   a GeGLU MLP (`down(gelu_tanh(gate(x)) · up(x))`); attention has RMSNormed q and k (with
//!   weight), v RMSNormed without weight, softmax scale 1, no mask (an image has no padding here),
//!   and a 2-D RoPE: the first half of each head rotated by the patch's column, the second half by
//!   its row, each half with `rotate_half` inside itself, base `rope_parameters.rope_theta`;
//! - with `use_clipped_linears`, every linear clamps its input and output to scalar bounds stored
//!   beside it (`input_min` …); without, those bounds are dropped (mlx-vlm's sanitize);
//! - the pooler averages each `k × k` block of patches (`k = pooling_kernel_size`), row-major over
//!   the pooled grid, times √hidden; with `standardize`, `(x − std_bias) · std_scale`;
//! - the embedder (`embed_vision`): RMSNorm without weight, then a bias-free projection to the text
//!   width. Its rows take the image tokens' places in the text model's input AFTER the text rows'
//!   √hidden scaling (they are not scaled).
//!
//! Weights sit under `vision_tower.` and `embed_vision.` (mlx layout) or `model.vision_tower.` and
//! `model.embed_vision.` (Hugging Face layout); linears as `….q_proj.linear.weight` (Gemma 4's
//! clippable linear wraps an inner `linear`).
use serde::Deserialize;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::loader::Vb;
use crate::mlx::fast::{self, AttentionMask};
use crate::mlx::{Array, Dtype};
use crate::nn::rope::{rotate_half_rope, signed_sin};
use crate::nn::{Linear, Params, RmsNorm};

/// `vision_config` of a gemma4 config.json, with mlx-vlm's defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct VisionConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub patch_size: usize,
    pub position_embedding_size: usize,
    pub pooling_kernel_size: usize,
    pub default_output_length: usize,
    pub rope_parameters: Option<Value>,
    pub use_clipped_linears: bool,
    pub standardize: bool,
}

impl Default for VisionConfig {
    fn default() -> Self {
        VisionConfig {
            hidden_size: 768,
            intermediate_size: 3072,
            num_hidden_layers: 16,
            num_attention_heads: 12,
            num_key_value_heads: 12,
            head_dim: 64,
            rms_norm_eps: 1e-6,
            patch_size: 16,
            position_embedding_size: 10240,
            pooling_kernel_size: 3,
            default_output_length: 280,
            rope_parameters: None,
            use_clipped_linears: false,
            standardize: false,
        }
    }
}

impl VisionConfig {
    fn rope_theta(&self) -> std::result::Result<f32, String> {
        match self.rope_parameters.as_ref().and_then(|r| r.get("rope_theta")) {
            None | Some(Value::Null) => Ok(100.0),
            Some(v) => v
                .as_f64()
                .filter(|t| t.is_finite() && *t > 0.0)
                .map(|t| t as f32)
                .ok_or_else(|| format!("vision_config.rope_parameters.rope_theta {v} is not a positive number")),
        }
    }

    fn validate(&self) -> std::result::Result<(), String> {
        let positive = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("patch_size", self.patch_size),
            ("position_embedding_size", self.position_embedding_size),
            ("pooling_kernel_size", self.pooling_kernel_size),
        ];
        super::vision_lm::check_sizes(&positive)?;
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err("vision_config.num_attention_heads is not a multiple of num_key_value_heads".into());
        }
        if self.head_dim % 4 != 0 {
            // The 2-D RoPE rotates two halves, each by its own half-rotation.
            return Err(format!("vision_config.head_dim {} is not a multiple of 4", self.head_dim));
        }
        self.rope_theta()?;
        Ok(())
    }
}

/// A linear layer that, with clipping on, clamps its input and output to stored scalar bounds
/// (Gemma 4's audio tower uses it too).
pub(crate) struct ClippableLinear {
    linear: Linear,
    /// (input_min, input_max, output_min, output_max).
    bounds: Option<[Array; 4]>,
}

impl ClippableLinear {
    pub(crate) fn load(vb: &Vb, inp: usize, out: usize, clip: bool) -> Result<Self> {
        let names = ["input_min", "input_max", "output_min", "output_max"];
        let bounds = if clip {
            let get = |n: &str| vb.get(n, &[]);
            Some([get(names[0])?, get(names[1])?, get(names[2])?, get(names[3])?])
        } else {
            for n in names {
                vb.discard(n);
            }
            None
        };
        Ok(ClippableLinear { linear: Linear::load(&vb.pp("linear"), inp, out, false)?, bounds })
    }

    pub(crate) fn forward(&self, x: &Array) -> Result<Array> {
        match &self.bounds {
            None => self.linear.forward(x),
            Some([imin, imax, omin, omax]) => {
                let x = x.maximum(imin)?.minimum(imax)?;
                self.linear.forward(&x)?.maximum(omin)?.minimum(omax)
            }
        }
    }
}

impl Params for ClippableLinear {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        self.linear.params(out);
        if let Some(b) = &self.bounds {
            out.extend(b.iter());
        }
    }
}

struct Block {
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
    q_proj: ClippableLinear,
    k_proj: ClippableLinear,
    v_proj: ClippableLinear,
    o_proj: ClippableLinear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    gate_proj: ClippableLinear,
    up_proj: ClippableLinear,
    down_proj: ClippableLinear,
}

impl Block {
    fn load(vb: &Vb, c: &VisionConfig) -> Result<Self> {
        let (d, eps, clip) = (c.hidden_size, c.rms_norm_eps, c.use_clipped_linears);
        let (qd, kvd) = (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim);
        let attn = vb.pp("self_attn");
        let mlp = vb.pp("mlp");
        let norm = |name: &str| RmsNorm::load(&vb.pp(name), d, eps);
        Ok(Block {
            input_layernorm: norm("input_layernorm")?,
            post_attention_layernorm: norm("post_attention_layernorm")?,
            pre_feedforward_layernorm: norm("pre_feedforward_layernorm")?,
            post_feedforward_layernorm: norm("post_feedforward_layernorm")?,
            q_proj: ClippableLinear::load(&attn.pp("q_proj"), d, qd, clip)?,
            k_proj: ClippableLinear::load(&attn.pp("k_proj"), d, kvd, clip)?,
            v_proj: ClippableLinear::load(&attn.pp("v_proj"), d, kvd, clip)?,
            o_proj: ClippableLinear::load(&attn.pp("o_proj"), qd, d, clip)?,
            // VisionRMSNorm's eps is its default 1e-6, whatever the config says.
            q_norm: RmsNorm::load(&attn.pp("q_norm"), c.head_dim, 1e-6)?,
            k_norm: RmsNorm::load(&attn.pp("k_norm"), c.head_dim, 1e-6)?,
            gate_proj: ClippableLinear::load(&mlp.pp("gate_proj"), d, c.intermediate_size, clip)?,
            up_proj: ClippableLinear::load(&mlp.pp("up_proj"), d, c.intermediate_size, clip)?,
            down_proj: ClippableLinear::load(&mlp.pp("down_proj"), c.intermediate_size, d, clip)?,
        })
    }

    /// `x` `[B, L, hidden]`; `rope`: the tables of the 2-D RoPE ([`Gemma4Vision::rope_tables`]).
    fn forward(&self, x: &Array, rope: &(Array, Array), c: &VisionConfig) -> Result<Array> {
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        let (hq, hkv, hd) = (c.num_attention_heads as i32, c.num_key_value_heads as i32, c.head_dim as i32);
        let h = self.input_layernorm.forward(x)?;
        let q = self.q_norm.forward(&self.q_proj.forward(&h)?.reshape(&[b, l, hq, hd])?)?;
        let k = self.k_norm.forward(&self.k_proj.forward(&h)?.reshape(&[b, l, hkv, hd])?)?;
        let v = fast::rms_norm(&self.v_proj.forward(&h)?.reshape(&[b, l, hkv, hd])?, None, 1e-6)?;
        let q = apply_rope(&q, rope)?.transpose(&[0, 2, 1, 3])?;
        let k = apply_rope(&k, rope)?.transpose(&[0, 2, 1, 3])?;
        let v = v.transpose(&[0, 2, 1, 3])?;
        let attn = fast::scaled_dot_product_attention(&q, &k, &v, 1.0, AttentionMask::None)?;
        let attn = attn.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, hq * hd])?;
        let h = x.add(&self.post_attention_layernorm.forward(&self.o_proj.forward(&attn)?)?)?;
        let n = self.pre_feedforward_layernorm.forward(&h)?;
        let ff = self.down_proj.forward(&fast::geglu(&self.gate_proj.forward(&n)?, &self.up_proj.forward(&n)?)?)?;
        h.add(&self.post_feedforward_layernorm.forward(&ff)?)
    }
}

impl Params for Block {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        for n in [
            &self.input_layernorm,
            &self.post_attention_layernorm,
            &self.pre_feedforward_layernorm,
            &self.post_feedforward_layernorm,
            &self.q_norm,
            &self.k_norm,
        ] {
            n.params(out);
        }
        for l in [&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj, &self.gate_proj, &self.up_proj, &self.down_proj] {
            l.params(out);
        }
    }
}

/// `x·cos + rotate_half(x)·sin` on each half of the head (`x` `[B, L, H, D]`; the tables
/// `[L, 1, D]` from [`Gemma4Vision::rope_tables`], one half of D per spatial axis, each half's
/// rotation inside itself).
fn apply_rope(x: &Array, (cos, sin): &(Array, Array)) -> Result<Array> {
    rotate_half_rope(x, cos, sin, 2)
}

/// Gemma 4's vision encoder and its embedder into the text model.
pub struct Gemma4Vision {
    config: VisionConfig,
    input_proj: Linear,
    /// `[2, position_embedding_size, hidden]`.
    position_table: Array,
    layers: Vec<Block>,
    /// (std_bias, std_scale) with `standardize`.
    standardize: Option<(Array, Array)>,
    embedding_projection: Linear,
    rope_theta: f32,
    text_hidden: usize,
}

impl Gemma4Vision {
    /// The vision side of a gemma4 checkpoint (`raw`: its config.json, text fields merged over the
    /// top level as `ModelConfig::raw` holds it), or `None` when it has no `vision_config`.
    pub fn load(raw: &Value, vb: &Vb) -> Result<Option<Self>> {
        let Some(vc) = raw.get("vision_config").filter(|v| !v.is_null()) else { return Ok(None) };
        let config: VisionConfig = serde_json::from_value(vc.clone())
            .map_err(|e| Error::InvalidArgument(format!("config.json: vision_config: {e}")))?;
        config.validate().map_err(|e| Error::InvalidArgument(format!("config.json: {e}")))?;
        let text_hidden = raw.get("hidden_size").and_then(Value::as_u64).unwrap_or(0) as usize;
        if text_hidden == 0 {
            return Err(Error::InvalidArgument("config.json: the text model's hidden_size is missing".into()));
        }
        // Hugging Face layout (`model.vision_tower.…`) or mlx-vlm's (`vision_tower.…`).
        let hf = vb.pp("model");
        let root = if hf.pp("vision_tower").pp("patch_embedder").pp("input_proj").contains("weight")
            || hf.pp("vision_tower").pp("patch_embedder").pp("input_proj").contains("scales")
        {
            hf
        } else {
            vb.clone()
        };
        let tower = root.pp("vision_tower");
        let (d, p) = (config.hidden_size, config.patch_size);
        let pe = tower.pp("patch_embedder");
        let layers = (0..config.num_hidden_layers)
            .map(|i| Block::load(&tower.pp("encoder").pp("layers").pp(i), &config))
            .collect::<Result<Vec<_>>>()?;
        let standardize = if config.standardize {
            Some((tower.get("std_bias", &[d])?, tower.get("std_scale", &[d])?))
        } else {
            None
        };
        Ok(Some(Gemma4Vision {
            input_proj: Linear::load(&pe.pp("input_proj"), 3 * p * p, d, false)?,
            position_table: pe.get("position_embedding_table", &[2, config.position_embedding_size, d])?,
            layers,
            standardize,
            embedding_projection: Linear::load(&root.pp("embed_vision").pp("embedding_projection"), d, text_hidden, false)?,
            rope_theta: config.rope_theta().map_err(Error::InvalidArgument)?,
            text_hidden,
            config,
        }))
    }

    pub fn config(&self) -> &VisionConfig {
        &self.config
    }

    /// The width of the rows [`Self::encode`] gives (the text model's).
    pub fn text_hidden(&self) -> usize {
        self.text_hidden
    }

    /// The soft tokens an image of `height × width` pixels becomes.
    pub fn soft_tokens(&self, height: usize, width: usize) -> usize {
        let (p, k) = (self.config.patch_size, self.config.pooling_kernel_size);
        (height / p) * (width / p) / (k * k)
    }

    /// The 2-D RoPE tables for a `rows × cols` patch grid, in `dtype`: (cos, sin), each
    /// `[rows·cols, 1, head_dim]`, the first half from the patch's column, the second from its
    /// row; the sine signed for [`rotate_half_rope`].
    fn rope_tables(&self, rows: i32, cols: i32, dtype: Dtype) -> Result<(Array, Array)> {
        let hd = self.config.head_dim as i32;
        let c = hd / 2; // channels per spatial axis
        let half = c / 2;
        let n = rows * cols;
        let xs: Vec<f32> = (0..n).map(|i| (i % cols) as f32).collect();
        let ys: Vec<f32> = (0..n).map(|i| (i / cols) as f32).collect();
        // mlx-vlm: timescale = base ** ((2 / c) · arange(half)), in float32 on the device.
        let exps = Array::arange(0.0, half as f64, 1.0, Dtype::Float32)?
            .multiply(&Array::scalar_f32(2.0 / c as f32, Dtype::Float32)?)?;
        let timescale = Array::scalar_f32(self.rope_theta, Dtype::Float32)?.power(&exps)?;
        let table = |pos: Vec<f32>| -> Result<(Array, Array)> {
            let ang = Array::from_slice(&pos, &[n, 1])?.divide(&timescale)?;
            let (cs, sn) = (ang.cos()?, ang.sin()?);
            Ok((Array::concatenate(&[&cs, &cs], 1)?, signed_sin(&sn)?))
        };
        let (cx, sx) = table(xs)?;
        let (cy, sy) = table(ys)?;
        let cos = Array::concatenate(&[&cx, &cy], 1)?.reshape(&[n, 1, hd])?.astype(dtype)?;
        let sin = Array::concatenate(&[&sx, &sy], 1)?.reshape(&[n, 1, hd])?.astype(dtype)?;
        Ok((cos, sin))
    }

    /// The tower's output (`VisionModel.__call__`): `pixels` `[B, 3, H, W]` in [0, 1] (as the
    /// processor makes them; H and W multiples of `patch_size · pooling_kernel_size`) to pooled
    /// features `[B, (H/p)·(W/p)/k², vision hidden]`.
    pub fn tower(&self, pixels: &Array) -> Result<Array> {
        let c = &self.config;
        let shape = pixels.shape();
        let (p, k) = (c.patch_size as i32, c.pooling_kernel_size as i32);
        if shape.len() != 4 || shape[1] != 3 || shape[2] <= 0 || shape[3] <= 0 || shape[2] % (p * k) != 0 || shape[3] % (p * k) != 0 {
            return Err(Error::InvalidArgument(format!(
                "image pixels must be [batch, 3, H, W] with H and W multiples of {}, got {shape:?}",
                p * k
            )));
        }
        let (b, rows, cols) = (shape[0], shape[2] / p, shape[3] / p);
        if rows as usize > c.position_embedding_size || cols as usize > c.position_embedding_size {
            return Err(Error::InvalidArgument(format!(
                "an image of {rows} x {cols} patches exceeds the position table ({} per side)",
                c.position_embedding_size
            )));
        }
        let n = rows * cols;
        let dtype = self.position_table.dtype();
        // NCHW → [B, rows·cols, p·p·3] ordered (row, col) and, inside, (kh, kw, channel).
        let patches = pixels
            .astype(Dtype::Float32)?
            .reshape(&[b, 3, rows, p, cols, p])?
            .transpose(&[0, 2, 4, 3, 5, 1])?
            .reshape(&[b, n, p * p * 3])?;
        let half = Array::scalar_f32(0.5, Dtype::Float32)?;
        let two = Array::scalar_f32(2.0, Dtype::Float32)?;
        let patches = two.multiply(&patches.subtract(&half)?)?.astype(dtype)?;
        let mut x = self.input_proj.forward(&patches)?;
        let xs: Vec<i32> = (0..n).map(|i| i % cols).collect();
        let ys: Vec<i32> = (0..n).map(|i| i / cols).collect();
        let d = c.hidden_size as i32;
        let table = |axis: i32| -> Result<Array> { self.position_table.slice_axis(0, axis, axis + 1)?.reshape(&[-1, d]) };
        let pos = table(0)?
            .take(&Array::from_slice(&xs, &[n])?, 0)?
            .add(&table(1)?.take(&Array::from_slice(&ys, &[n])?, 0)?)?;
        x = x.add(&pos)?;
        let rope = self.rope_tables(rows, cols, x.dtype())?;
        for layer in &self.layers {
            x = layer.forward(&x, &rope, c)?;
        }
        // Pooling: k × k blocks averaged (in float32), row-major over the pooled grid.
        let x = if k == 1 {
            x
        } else {
            let xf = x.astype(Dtype::Float32)?.reshape(&[b, rows / k, k, cols / k, k, d])?;
            let inv = Array::scalar_f32(1.0 / (k * k) as f32, Dtype::Float32)?;
            xf.multiply(&inv)?.sum(&[2, 4], false)?.reshape(&[b, -1, d])?.astype(x.dtype())?
        };
        let x = x.multiply(&Array::scalar_f32((c.hidden_size as f64).sqrt() as f32, x.dtype())?)?;
        match &self.standardize {
            Some((bias, scale)) => x.subtract(bias)?.multiply(scale),
            None => Ok(x),
        }
    }

    /// The embedder (`embed_vision`): tower features `[B, T, vision hidden]` to rows
    /// `[B, T, text hidden]`.
    pub fn embed(&self, features: &Array) -> Result<Array> {
        let normed = fast::rms_norm(features, None, self.config.rms_norm_eps)?;
        self.embedding_projection.forward(&normed)
    }

    /// Both: pixels to the rows that replace the image's tokens.
    pub fn encode(&self, pixels: &Array) -> Result<Array> {
        self.embed(&self.tower(pixels)?)
    }

    /// The compute dtype of the tower (its weights').
    pub fn dtype(&self) -> Dtype {
        self.position_table.dtype()
    }
}

impl Params for Gemma4Vision {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        self.input_proj.params(out);
        out.push(&self.position_table);
        for l in &self.layers {
            l.params(out);
        }
        if let Some((b, s)) = &self.standardize {
            out.extend([b, s]);
        }
        self.embedding_projection.params(out);
    }
}
