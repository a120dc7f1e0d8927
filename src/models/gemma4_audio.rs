//! Gemma 4's audio side (issue 15): the USM-style conformer encoder that turns log-mel frames into
//! one soft token per 40 ms, and the embedder that projects them to the text model's width.
//! Follows mlx-vlm 0.7.10 `models/gemma4/audio.py` (`AudioEncoder`) and `gemma4.py`
//! (`MultimodalEmbedder` as `embed_audio`), checked against them by tests/audio_gemma4.rs:
//! - subsampling: two blocks of (frames masked to 0, zero padding 1 on time and frequency, a 3×3
//!   stride-2 convolution without bias, LayerNorm over channels with weight only, ReLU), the mask
//!   taking every second frame; then (frequency × channel) flattened and projected to `hidden_size`;
//! - `num_hidden_layers` macaron conformer blocks: ½·FFW (clip, RMSNorm, linear ×4, SiLU, linear,
//!   clip, RMSNorm), attention (clip, RMSNorm, chunked local attention, clip, RMSNorm, residual),
//!   padding rows zeroed, a light convolution (RMSNorm, linear ×2, GLU, causal depthwise conv,
//!   clip, RMSNorm, SiLU, linear, residual), ½·FFW, clip, RMSNorm. Clips are ±`gradient_clipping`;
//!   every linear of a block is clippable (its bounds always stored beside it);
//! - the attention: per-head queries scaled by `head_dim^-½ / ln 2 · softplus(per_dim_scale)`,
//!   keys by `ln(1 + e) / ln 2`; queries in blocks of `attention_chunk_size`, each block seeing
//!   `attention_context_left − 1` keys back and `attention_context_right` ahead (a context of
//!   chunk + left − 1 + right keys), logits = content term + relative-position term (sinusoidal
//!   offsets projected by `relative_k_proj`, aligned by the pad-reshape "relative shift"), soft-
//!   capped by `attention_logit_cap`, invalid keys set to `attention_invalid_logits_value`; all
//!   in float32;
//! - `output_proj` (with bias) to `output_proj_dims`; padding rows set to 0;
//! - the embedder (`embed_audio`): RMSNorm without weight, bias-free projection to the text width.
//!   Its rows take the audio tokens' places AFTER the text rows' √hidden scaling.
//!
//! The convolutions are written as strided slices and a matmul (the MLX shim has no 2-D
//! convolution); the same sums, in another order: within float32 rounding of MLX's conv.
//!
//! Weights sit under `audio_tower.` and `embed_audio.` (mlx layout: convolutions
//! `[out, kh, kw, in]` and `[out, k, 1]`) or `model.audio_tower.` / `model.embed_audio.` (Hugging
//! Face layout: `[out, in, kh, kw]` and `[out, 1, k]`, transposed at load).
use serde::Deserialize;
use serde_json::Value;

use super::gemma4_vision::ClippableLinear;
use crate::error::{Error, Result};
use crate::loader::Vb;
use crate::mlx::{fast, Array, Dtype};
use crate::nn::{Linear, Params, RmsNorm};

/// The frequency bins the subsampling's projection was sized for (mlx-vlm's `INPUT_FEAT_SIZE`).
pub const INPUT_FEAT_SIZE: usize = 128;

/// `audio_config` of a gemma4 config.json, with mlx-vlm's defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct AudioConfig {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub subsampling_conv_channels: Vec<usize>,
    pub conv_kernel_size: usize,
    pub residual_weight: f32,
    pub attention_chunk_size: usize,
    pub attention_context_left: usize,
    pub attention_context_right: usize,
    pub attention_logit_cap: f32,
    pub attention_invalid_logits_value: f32,
    pub rms_norm_eps: f32,
    pub gradient_clipping: f32,
    pub output_proj_dims: Option<usize>,
}

impl Default for AudioConfig {
    fn default() -> Self {
        AudioConfig {
            hidden_size: 1024,
            num_hidden_layers: 12,
            num_attention_heads: 8,
            subsampling_conv_channels: vec![128, 32],
            conv_kernel_size: 5,
            residual_weight: 0.5,
            attention_chunk_size: 12,
            attention_context_left: 13,
            attention_context_right: 0,
            attention_logit_cap: 50.0,
            attention_invalid_logits_value: -1e9,
            rms_norm_eps: 1e-6,
            gradient_clipping: 1e10,
            output_proj_dims: Some(1536),
        }
    }
}

impl AudioConfig {
    fn validate(&self) -> std::result::Result<(), String> {
        let mut sizes = vec![
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("conv_kernel_size", self.conv_kernel_size),
            ("attention_chunk_size", self.attention_chunk_size),
            ("attention_context_left", self.attention_context_left),
        ];
        if let Some(d) = self.output_proj_dims {
            sizes.push(("output_proj_dims", d));
        }
        super::vision_lm::check_sizes(&sizes).map_err(|e| e.replace("vision_config", "audio_config"))?;
        if self.subsampling_conv_channels.len() != 2 || self.subsampling_conv_channels.iter().any(|&c| c == 0 || c > 1 << 16) {
            return Err("audio_config.subsampling_conv_channels must hold two sizes between 1 and 2^16".into());
        }
        if self.hidden_size % self.num_attention_heads != 0 || self.hidden_size % 2 != 0 {
            return Err("audio_config.hidden_size must be even and a multiple of num_attention_heads".into());
        }
        if self.attention_context_right > 1 << 16 || self.attention_context_left > 1 << 16 || self.attention_chunk_size > 1 << 16 {
            return Err("audio_config.attention_context_* / attention_chunk_size must be at most 2^16".into());
        }
        if !(self.attention_logit_cap > 0.0) || !self.gradient_clipping.is_finite() || !(self.gradient_clipping > 0.0) {
            return Err("audio_config.attention_logit_cap and gradient_clipping must be positive numbers".into());
        }
        Ok(())
    }

    fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Keys each query block sees before its own (`attention_context_left − 1`).
    fn past(&self) -> usize {
        self.attention_context_left.saturating_sub(1)
    }

    fn context(&self) -> usize {
        self.attention_chunk_size + self.past() + self.attention_context_right
    }
}

fn scalar(v: f32) -> Result<Array> {
    Array::scalar_f32(v, Dtype::Float32)
}

/// `x` clamped to ±`c` (`mx.clip` with Python-float bounds: the array's dtype is kept).
fn clip(x: &Array, c: f32) -> Result<Array> {
    let dt = x.dtype();
    x.maximum(&Array::scalar_f32(-c, dt)?)?.minimum(&Array::scalar_f32(c, dt)?)
}

/// Zero rows of `x` along `axis` in front (`before`) and behind (`after`).
fn pad_axis(x: &Array, axis: usize, before: i32, after: i32) -> Result<Array> {
    if before == 0 && after == 0 {
        return Ok(x.clone());
    }
    let mut parts = vec![];
    let shape = x.shape();
    let zeros = |n: i32| -> Result<Array> {
        let mut s = shape.clone();
        s[axis] = n;
        Array::zeros(&s, x.dtype())
    };
    if before > 0 {
        parts.push(zeros(before)?);
    }
    parts.push(x.clone());
    if after > 0 {
        parts.push(zeros(after)?);
    }
    let refs: Vec<&Array> = parts.iter().collect();
    Array::concatenate(&refs, axis as i32)
}

/// Loads a convolution weight stored `[out, …spatial, in]` (mlx) or `[out, in, …spatial]` (HF),
/// returning the mlx layout.
fn conv_weight(vb: &Vb, out: usize, spatial: &[usize], inp: usize) -> Result<Array> {
    let mut mlx = vec![out];
    mlx.extend_from_slice(spatial);
    mlx.push(inp);
    let mut hf = vec![out, inp];
    hf.extend_from_slice(spatial);
    match vb.stored_shape("weight") {
        Some(s) if s == mlx => vb.get("weight", &mlx),
        Some(s) if s == hf => {
            let w = vb.get("weight", &hf)?;
            let perm: Vec<i32> = std::iter::once(0).chain(2..2 + spatial.len() as i32).chain(std::iter::once(1)).collect();
            w.transpose(&perm)?.contiguous()
        }
        _ => vb.get("weight", &mlx), // the store names the tensor and the shape it expected
    }
}

/// A clippable linear of a conformer block: mlx-vlm builds every one with clipping on, its
/// bounds ±inf until the checkpoint's are loaded; a checkpoint without them clips nothing.
fn clippable(vb: &Vb, inp: usize, out: usize) -> Result<ClippableLinear> {
    ClippableLinear::load(vb, inp, out, vb.contains("input_min"))
}

struct ConvBlock {
    /// `[out, 3, 3, in]`, reshaped to `[out, 9·in]`.
    weight: Array,
    norm_weight: Array,
    eps: f32,
}

impl ConvBlock {
    fn load(vb: &Vb, inp: usize, out: usize, eps: f32) -> Result<Self> {
        let w = conv_weight(&vb.pp("conv"), out, &[3, 3], inp)?;
        Ok(ConvBlock { weight: w.reshape(&[out as i32, (9 * inp) as i32])?, norm_weight: vb.pp("norm").get("weight", &[out])?, eps })
    }

    /// `x` `[B, T, F, C]`, `valid` `[B, T]` (1 real, 0 padding) → `[B, T', F', C']`, the new `valid`.
    fn forward(&self, x: &Array, valid: &Array) -> Result<(Array, Array)> {
        let x = x.multiply(&valid.astype(x.dtype())?.expand_dims(2)?.expand_dims(3)?)?;
        let x = pad_axis(&pad_axis(&x, 1, 1, 1)?, 2, 1, 1)?;
        let s = x.shape();
        let (b, tp, fp, c) = (s[0], s[1], s[2], s[3]);
        let (t_out, f_out) = ((tp - 3) / 2 + 1, (fp - 3) / 2 + 1);
        let mut taps = Vec::with_capacity(9);
        for i in 0..3 {
            for j in 0..3 {
                taps.push(x.slice(&[0, i, j, 0], &[b, i + 2 * (t_out - 1) + 1, j + 2 * (f_out - 1) + 1, c], &[1, 2, 2, 1])?);
            }
        }
        let refs: Vec<&Array> = taps.iter().collect();
        let cols = Array::concatenate(&refs, 3)?; // [B, T', F', 9·C] ordered (kh, kw, c)
        let y = cols.matmul(&self.weight.transpose(&[1, 0])?)?;
        let v = valid.slice(&[0, 0], &[b, valid.shape()[1]], &[1, 2])?.slice_axis(1, 0, t_out)?;
        let y = fast::layer_norm(&y, Some(&self.norm_weight), None, self.eps)?;
        let y = y.maximum(&Array::scalar_f32(0.0, y.dtype())?)?;
        Ok((y, v))
    }
}

struct FeedForward {
    pre: RmsNorm,
    ffw1: ClippableLinear,
    ffw2: ClippableLinear,
    post: RmsNorm,
}

impl FeedForward {
    fn load(vb: &Vb, d: usize) -> Result<Self> {
        Ok(FeedForward {
            pre: RmsNorm::load(&vb.pp("pre_layer_norm"), d, 1e-6)?,
            ffw1: clippable(&vb.pp("ffw_layer_1"), d, 4 * d)?,
            ffw2: clippable(&vb.pp("ffw_layer_2"), 4 * d, d)?,
            post: RmsNorm::load(&vb.pp("post_layer_norm"), d, 1e-6)?,
        })
    }

    fn forward(&self, x: &Array, c: &AudioConfig) -> Result<Array> {
        let h = self.pre.forward(&clip(x, c.gradient_clipping)?)?;
        let h = self.ffw2.forward(&self.ffw1.forward(&h)?.silu()?)?;
        let h = self.post.forward(&clip(&h, c.gradient_clipping)?)?;
        x.add(&h.multiply(&Array::scalar_f32(c.residual_weight, h.dtype())?)?)
    }
}

struct Attention {
    q_proj: ClippableLinear,
    k_proj: ClippableLinear,
    v_proj: ClippableLinear,
    post: ClippableLinear,
    relative_k_proj: Linear,
    per_dim_scale: Array,
}

impl Attention {
    fn load(vb: &Vb, d: usize, head_dim: usize) -> Result<Self> {
        let c = |n: &str| clippable(&vb.pp(n), d, d);
        Ok(Attention {
            q_proj: c("q_proj")?,
            k_proj: c("k_proj")?,
            v_proj: c("v_proj")?,
            post: c("post")?,
            relative_k_proj: Linear::load(&vb.pp("relative_k_proj"), d, d, false)?,
            per_dim_scale: vb.get("per_dim_scale", &[head_dim])?,
        })
    }

    /// `[B, T, …]` → `[B, U, context, …]`: each query block's keys (`indices` `[U·context]`).
    fn blocks_context(x: &Array, c: &AudioConfig, u: i32) -> Result<Array> {
        let (p, f, w) = (c.past() as i32, c.attention_context_right as i32, c.attention_chunk_size as i32);
        let x = pad_axis(x, 1, p, f + w - 1)?;
        let ctx = c.context() as i32;
        let idx: Vec<i32> = (0..u).flat_map(|b| (0..ctx).map(move |o| b * w + o)).collect();
        let g = x.take(&Array::from_slice(&idx, &[u * ctx])?, 1)?;
        let mut shape = x.shape();
        shape.splice(1..2, [u, ctx]);
        g.reshape(&shape)
    }

    /// `x` `[B, T, D]`, `valid` `[B, T]` (bool), `causal` `[W, context]` (bool).
    fn forward(&self, x: &Array, valid: &Array, causal: &Array, inv_timescales: &Array, c: &AudioConfig) -> Result<Array> {
        let s = x.shape();
        let (b, t) = (s[0], s[1]);
        let (n, h) = (c.num_attention_heads as i32, c.head_dim() as i32);
        let (w, ctx) = (c.attention_chunk_size as i32, c.context() as i32);
        let proj = |l: &ClippableLinear| -> Result<Array> { l.forward(x)?.astype(Dtype::Float32)?.reshape(&[b, t, n, h]) };
        let q_scale = (h as f64).powf(-0.5) / std::f64::consts::LN_2;
        let k_scale = (1.0 + std::f64::consts::E).ln() / std::f64::consts::LN_2;
        let softplus = self.per_dim_scale.logaddexp(&Array::scalar_f32(0.0, self.per_dim_scale.dtype())?)?;
        let q = proj(&self.q_proj)?.multiply(&softplus.multiply(&scalar(q_scale as f32)?)?)?;
        let k = proj(&self.k_proj)?.multiply(&scalar(k_scale as f32)?)?;
        let v = proj(&self.v_proj)?;
        let u = (t + w - 1) / w;
        let qb = pad_axis(&q, 1, 0, u * w - t)?.reshape(&[b, u, w, n, h])?;
        let kb = Self::blocks_context(&k, c, u)?; // [B, U, C, N, H]
        let vb = Self::blocks_context(&v, c, u)?;
        let valid_ctx = Self::blocks_context(&valid.astype(Dtype::Float32)?, c, u)?; // [B, U, C]
        let condition = valid_ctx
            .expand_dims(1)?
            .expand_dims(3)?
            .greater(&scalar(0.5)?)?
            .logical_and(&causal.expand_dims(0)?.expand_dims(0)?.expand_dims(0)?)?; // [B, 1, U, W, C]
        // Relative positions: offsets P, P−1, …, −F (S of them).
        let (p, f) = (c.past() as i32, c.attention_context_right as i32);
        let span = p + f + 1;
        let pos: Vec<f32> = (0..span).map(|i| (p - i) as f32).collect();
        let scaled = Array::from_slice(&pos, &[1, span, 1])?.multiply(inv_timescales)?;
        let signal = Array::concatenate(&[&scaled.sin()?, &scaled.cos()?], 2)?;
        let sin_emb = self.relative_k_proj.forward(&signal.astype(self.per_dim_scale.dtype())?)?;
        let sin_emb = sin_emb.reshape(&[span, n, h])?.astype(Dtype::Float32)?;
        let qp = qb.transpose(&[0, 3, 1, 2, 4])?; // [B, N, U, W, H]
        let kp = kb.transpose(&[0, 3, 1, 4, 2])?; // [B, N, U, H, C]
        let ac = qp.matmul(&kp)?; // [B, N, U, W, C]
        let bd = qp.reshape(&[b, n, u * w, h])?.matmul(&sin_emb.transpose(&[1, 2, 0])?)?.reshape(&[b, n, u, w, span])?;
        // The relative shift: pad to C + 1, flatten (W, C + 1), keep W·C, unflatten.
        let bd = pad_axis(&bd, 4, 0, ctx + 1 - span)?
            .reshape(&[b, n, u, w * (ctx + 1)])?
            .slice_axis(3, 0, w * ctx)?
            .reshape(&[b, n, u, w, ctx])?;
        let cap = scalar(c.attention_logit_cap)?;
        let logits = ac.add(&bd)?.divide(&cap)?.tanh()?.multiply(&cap)?;
        let logits = Array::where_(&condition, &logits, &scalar(c.attention_invalid_logits_value)?)?;
        let probs = logits.softmax(-1, false)?;
        let ctx_out = probs.matmul(&vb.transpose(&[0, 3, 1, 2, 4])?)?; // [B, N, U, W, H]
        let ctx_out = ctx_out.transpose(&[0, 2, 3, 1, 4])?.reshape(&[b, u * w, n, h])?.slice_axis(1, 0, t)?;
        self.post.forward(&ctx_out.reshape(&[b, t, n * h])?)
    }
}

struct LightConv {
    pre: RmsNorm,
    linear_start: ClippableLinear,
    /// `[D, K, 1]`.
    depthwise: Array,
    conv_norm: RmsNorm,
    linear_end: ClippableLinear,
}

impl LightConv {
    fn load(vb: &Vb, c: &AudioConfig) -> Result<Self> {
        let d = c.hidden_size;
        Ok(LightConv {
            pre: RmsNorm::load(&vb.pp("pre_layer_norm"), d, c.rms_norm_eps)?,
            linear_start: clippable(&vb.pp("linear_start"), d, 2 * d)?,
            depthwise: conv_weight(&vb.pp("depthwise_conv1d"), d, &[c.conv_kernel_size], 1)?,
            conv_norm: RmsNorm::load(&vb.pp("conv_norm"), d, c.rms_norm_eps)?,
            linear_end: clippable(&vb.pp("linear_end"), d, d)?,
        })
    }

    fn forward(&self, x: &Array, c: &AudioConfig) -> Result<Array> {
        let d = c.hidden_size as i32;
        let h = self.linear_start.forward(&self.pre.forward(x)?)?;
        let (a, g) = (h.slice_axis(2, 0, d)?, h.slice_axis(2, d, 2 * d)?);
        let h = a.multiply(&g.sigmoid()?)?;
        let h = pad_axis(&h, 1, c.conv_kernel_size as i32 - 1, 0)?;
        let h = h.conv1d(&self.depthwise, 1, 0, 1, d)?;
        let h = self.conv_norm.forward(&clip(&h, c.gradient_clipping)?)?.silu()?;
        self.linear_end.forward(&h)?.add(x)
    }
}

struct Block {
    ff1: FeedForward,
    attn: Attention,
    lconv: LightConv,
    ff2: FeedForward,
    norm_pre_attn: RmsNorm,
    norm_post_attn: RmsNorm,
    norm_out: RmsNorm,
}

impl Block {
    fn load(vb: &Vb, c: &AudioConfig) -> Result<Self> {
        let d = c.hidden_size;
        Ok(Block {
            ff1: FeedForward::load(&vb.pp("feed_forward1"), d)?,
            attn: Attention::load(&vb.pp("self_attn"), d, c.head_dim())?,
            lconv: LightConv::load(&vb.pp("lconv1d"), c)?,
            ff2: FeedForward::load(&vb.pp("feed_forward2"), d)?,
            norm_pre_attn: RmsNorm::load(&vb.pp("norm_pre_attn"), d, 1e-6)?,
            norm_post_attn: RmsNorm::load(&vb.pp("norm_post_attn"), d, 1e-6)?,
            norm_out: RmsNorm::load(&vb.pp("norm_out"), d, 1e-6)?,
        })
    }

    fn forward(&self, x: &Array, valid: &Array, causal: &Array, inv: &Array, c: &AudioConfig) -> Result<Array> {
        let g = c.gradient_clipping;
        let x = self.ff1.forward(x, c)?;
        let h = self.norm_pre_attn.forward(&clip(&x, g)?)?;
        let h = clip(&self.attn.forward(&h, valid, causal, inv, c)?, g)?;
        let x = x.add(&self.norm_post_attn.forward(&h)?)?;
        let x = x.multiply(&valid.astype(x.dtype())?.expand_dims(2)?)?;
        let x = self.lconv.forward(&x, c)?;
        let x = self.ff2.forward(&x, c)?;
        self.norm_out.forward(&clip(&x, g)?)
    }
}

impl Params for Block {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        for n in [&self.norm_pre_attn, &self.norm_post_attn, &self.norm_out, &self.ff1.pre, &self.ff1.post, &self.ff2.pre, &self.ff2.post] {
            n.params(out);
        }
        for l in [&self.ff1.ffw1, &self.ff1.ffw2, &self.ff2.ffw1, &self.ff2.ffw2, &self.attn.q_proj, &self.attn.k_proj, &self.attn.v_proj, &self.attn.post] {
            l.params(out);
        }
        self.attn.relative_k_proj.params(out);
        out.push(&self.attn.per_dim_scale);
        self.lconv.pre.params(out);
        self.lconv.linear_start.params(out);
        out.push(&self.lconv.depthwise);
        self.lconv.conv_norm.params(out);
        self.lconv.linear_end.params(out);
    }
}

/// Gemma 4's audio encoder and its embedder into the text model.
pub struct Gemma4Audio {
    config: AudioConfig,
    conv0: ConvBlock,
    conv1: ConvBlock,
    input_proj: Linear,
    layers: Vec<Block>,
    output_proj: Option<Linear>,
    embedding_projection: Linear,
    text_hidden: usize,
}

impl Gemma4Audio {
    /// The audio side of a gemma4 checkpoint (`raw`: its config.json as `ModelConfig::raw` holds
    /// it), or `None` when it has no `audio_config`.
    pub fn load(raw: &Value, vb: &Vb) -> Result<Option<Self>> {
        let Some(ac) = raw.get("audio_config").filter(|v| !v.is_null()) else { return Ok(None) };
        let config: AudioConfig =
            serde_json::from_value(ac.clone()).map_err(|e| Error::InvalidArgument(format!("config.json: audio_config: {e}")))?;
        config.validate().map_err(|e| Error::InvalidArgument(format!("config.json: {e}")))?;
        let text_hidden = raw.get("hidden_size").and_then(Value::as_u64).unwrap_or(0) as usize;
        if text_hidden == 0 {
            return Err(Error::InvalidArgument("config.json: the text model's hidden_size is missing".into()));
        }
        let hf = vb.pp("model");
        let root = if hf.pp("audio_tower").pp("subsample_conv_projection").pp("input_proj_linear").contains("weight") {
            hf
        } else {
            vb.clone()
        };
        let tower = root.pp("audio_tower");
        let sscp = tower.pp("subsample_conv_projection");
        let (c0, c1) = (config.subsampling_conv_channels[0], config.subsampling_conv_channels[1]);
        let d = config.hidden_size;
        let mut freq = INPUT_FEAT_SIZE;
        for _ in 0..2 {
            freq = (freq + 2 - 3) / 2 + 1;
        }
        let layers = (0..config.num_hidden_layers).map(|i| Block::load(&tower.pp("layers").pp(i), &config)).collect::<Result<Vec<_>>>()?;
        let out_dim = config.output_proj_dims.unwrap_or(d);
        Ok(Some(Gemma4Audio {
            conv0: ConvBlock::load(&sscp.pp("layer0"), 1, c0, config.rms_norm_eps)?,
            conv1: ConvBlock::load(&sscp.pp("layer1"), c0, c1, config.rms_norm_eps)?,
            input_proj: Linear::load(&sscp.pp("input_proj_linear"), freq * c1, d, false)?,
            layers,
            output_proj: match config.output_proj_dims {
                Some(o) => Some(Linear::load(&tower.pp("output_proj"), d, o, true)?),
                None => None,
            },
            embedding_projection: Linear::load(&root.pp("embed_audio").pp("embedding_projection"), out_dim, text_hidden, false)?,
            text_hidden,
            config,
        }))
    }

    pub fn config(&self) -> &AudioConfig {
        &self.config
    }

    pub fn text_hidden(&self) -> usize {
        self.text_hidden
    }

    /// The compute dtype (the weights').
    pub fn dtype(&self) -> Dtype {
        self.conv0.weight.dtype()
    }

    /// The local causal mask of the chunked attention `[chunk, context]`.
    fn causal_mask(&self) -> Result<Array> {
        let c = &self.config;
        let (w, ctx, p, f) = (c.attention_chunk_size as i64, c.context() as i64, c.past() as i64, c.attention_context_right as i64);
        let m: Vec<bool> = (0..w)
            .flat_map(|q| (0..ctx).map(move |k| (q, k)))
            .map(|(q, k)| {
                let dist = q + p - k;
                (dist >= 0 && dist < p) || (dist < 0 && -dist < f)
            })
            .collect();
        Array::from_slice(&m, &[w as i32, ctx as i32])
    }

    /// The encoder's output (`AudioEncoder.__call__`): log-mel `features` `[B, T, 128]` and their
    /// `valid` frames `[B, T]` (bool) to `[B, T/4 (rounded up), output dims]`, padding rows 0, and
    /// the valid rows `[B, T']`.
    pub fn tower(&self, features: &Array, valid: &Array) -> Result<(Array, Array)> {
        let s = features.shape();
        if s.len() != 3 || s[2] as usize != INPUT_FEAT_SIZE || s[1] < 1 || valid.shape() != s[..2] {
            return Err(Error::InvalidArgument(format!(
                "audio features must be [batch, frames >= 1, {INPUT_FEAT_SIZE}] with a [batch, frames] mask, got {s:?} and {:?}",
                valid.shape()
            )));
        }
        let c = &self.config;
        let x = features.astype(self.dtype())?.expand_dims(3)?;
        let (x, v) = self.conv0.forward(&x, valid)?;
        let (x, v) = self.conv1.forward(&x, &v)?;
        let xs = x.shape();
        let mut x = self.input_proj.forward(&x.reshape(&[xs[0], xs[1], xs[2] * xs[3]])?)?;
        let causal = self.causal_mask()?;
        let nt = (c.hidden_size / 2) as i32;
        // mlx-vlm: exp(arange(nt) · −ln(10000) / max(nt − 1, 1)), in float32 on the device.
        let inc = (10000f64).ln() / (nt - 1).max(1) as f64;
        let inv = Array::arange(0.0, nt as f64, 1.0, Dtype::Float32)?.multiply(&scalar(-inc as f32)?)?.exp()?.reshape(&[1, 1, nt])?;
        for layer in &self.layers {
            x = layer.forward(&x, &v, &causal, &inv, c)?;
        }
        if let Some(p) = &self.output_proj {
            x = p.forward(&x)?;
        }
        let x = x.multiply(&v.astype(x.dtype())?.expand_dims(2)?)?;
        Ok((x, v))
    }

    /// The embedder (`embed_audio`): tower rows to text-width rows.
    pub fn embed(&self, rows: &Array) -> Result<Array> {
        let normed = fast::rms_norm(rows, None, self.config.rms_norm_eps)?;
        self.embedding_projection.forward(&normed)
    }

    /// Both, for one clip: `[1, T, 128]` features and mask to `[T', text hidden]`.
    pub fn encode(&self, features: &Array, valid: &Array) -> Result<Array> {
        let (rows, _) = self.tower(features, valid)?;
        let e = self.embed(&rows)?;
        let s = e.shape();
        e.reshape(&[s[1], s[2]])
    }
}

impl Params for Gemma4Audio {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        out.extend([&self.conv0.weight, &self.conv0.norm_weight, &self.conv1.weight, &self.conv1.norm_weight]);
        self.input_proj.params(out);
        for l in &self.layers {
            l.params(out);
        }
        if let Some(p) = &self.output_proj {
            p.params(out);
        }
        self.embedding_projection.params(out);
    }
}
