//! Qwen2.5-VL's vision tower (issue 15): the Qwen2-VL patch transformer with window attention,
//! following mlx-vlm 0.7.10 `models/qwen2_5_vl/vision.py` (`VisionModel`), checked against it by
//! tests/vision_qwen.rs. What differs from Qwen3's tower ([`super::qwen_vision`]):
//! - the Conv3d patch embedding has no bias, and there is no learned position table;
//! - blocks are RMSNorm (eps 1e-6) → attention → residual, RMSNorm → SwiGLU MLP (gate, up, down
//!   with bias, `silu(gate) · up`) → residual;
//! - window attention: the merge blocks (2 × 2 patches) are regrouped into windows of
//!   `window_size / merge / patch` merge blocks per side (row-major windows, row-major inside; the
//!   last row and column of windows partial), and a block attends only within its window, except
//!   the blocks in `fullatt_block_indexes`, which see the whole image; the 2-D rope follows the
//!   patches into that order;
//! - the merger: RMSNorm (`ln_q`) per patch, each merge block's patches concatenated, `mlp.0` →
//!   GELU (erf form) → `mlp.2`, and the rows put back in the image's row-major order.
//!
//! Weights under `vision_tower.` (mlx-vlm), `visual.` or `model.visual.` (Hugging Face).
use serde::Deserialize;
use serde_json::Value;

use super::qwen_vision::{apply_rope, gelu_erf, vision_rope};
use crate::error::{Error, Result};
use crate::loader::Vb;
use crate::mlx::fast::{self, AttentionMask};
use crate::mlx::Array;
use crate::nn::{Linear, Params, RmsNorm};

/// `vision_config` of a qwen2_5_vl config.json, with mlx-vlm's defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct VisionConfig {
    pub depth: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub out_hidden_size: usize,
    pub num_heads: usize,
    pub patch_size: usize,
    pub in_channels: usize,
    pub spatial_merge_size: usize,
    pub temporal_patch_size: usize,
    pub window_size: usize,
    pub fullatt_block_indexes: Vec<usize>,
}

impl Default for VisionConfig {
    fn default() -> Self {
        VisionConfig {
            depth: 32,
            hidden_size: 1280,
            intermediate_size: 3420,
            out_hidden_size: 1536,
            num_heads: 16,
            patch_size: 14,
            in_channels: 3,
            spatial_merge_size: 2,
            temporal_patch_size: 2,
            window_size: 112,
            fullatt_block_indexes: vec![7, 15, 23, 31],
        }
    }
}

impl VisionConfig {
    fn validate(&self) -> std::result::Result<(), String> {
        super::vision_lm::check_sizes(&[
            ("depth", self.depth),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("out_hidden_size", self.out_hidden_size),
            ("num_heads", self.num_heads),
            ("patch_size", self.patch_size),
            ("spatial_merge_size", self.spatial_merge_size),
            ("temporal_patch_size", self.temporal_patch_size),
            ("window_size", self.window_size),
        ])?;
        if self.in_channels != 3 {
            return Err(format!("vision_config.in_channels {} is not 3 (RGB)", self.in_channels));
        }
        if self.hidden_size % self.num_heads != 0 || (self.hidden_size / self.num_heads) % 4 != 0 {
            return Err("vision_config.hidden_size / num_heads must be a multiple of 4 (the 2-D rope)".into());
        }
        if self.window_size < self.spatial_merge_size * self.patch_size {
            return Err(format!(
                "vision_config.window_size {} is smaller than one merge block ({} pixels)",
                self.window_size,
                self.spatial_merge_size * self.patch_size
            ));
        }
        Ok(())
    }
}

struct Block {
    norm1: RmsNorm,
    norm2: RmsNorm,
    qkv: Linear,
    proj: Linear,
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Block {
    fn load(vb: &Vb, c: &VisionConfig) -> Result<Self> {
        let d = c.hidden_size;
        let mlp = vb.pp("mlp");
        Ok(Block {
            norm1: RmsNorm::load(&vb.pp("norm1"), d, 1e-6)?,
            norm2: RmsNorm::load(&vb.pp("norm2"), d, 1e-6)?,
            qkv: Linear::load(&vb.pp("attn").pp("qkv"), d, 3 * d, true)?,
            proj: Linear::load(&vb.pp("attn").pp("proj"), d, d, true)?,
            gate: Linear::load(&mlp.pp("gate_proj"), d, c.intermediate_size, true)?,
            up: Linear::load(&mlp.pp("up_proj"), d, c.intermediate_size, true)?,
            down: Linear::load(&mlp.pp("down_proj"), c.intermediate_size, d, true)?,
        })
    }

    /// `x` `[L, hidden]` (window order); `segments`: the (start, end) ranges that attend within
    /// themselves; `rope` (cos, sin) `[1, L, 1, head_dim]`.
    fn forward(&self, x: &Array, rope: &(Array, Array), heads: i32, segments: &[(i32, i32)]) -> Result<Array> {
        let l = x.shape()[0];
        let h = self.norm1.forward(x)?;
        let qkv = self.qkv.forward(&h)?.reshape(&[l, 3, heads, -1])?;
        let hd = qkv.shape()[3];
        let part = |i: i32| -> Result<Array> { qkv.slice_axis(1, i, i + 1)?.reshape(&[1, l, heads, hd]) };
        let t = |a: &Array| a.transpose(&[0, 2, 1, 3]);
        let (q, k, v) = (t(&apply_rope(&part(0)?, rope)?)?, t(&apply_rope(&part(1)?, rope)?)?, t(&part(2)?)?);
        let scale = (hd as f64).powf(-0.5) as f32;
        let mut outs = Vec::with_capacity(segments.len());
        for &(a, b) in segments {
            let s = |x: &Array| x.slice_axis(2, a, b);
            outs.push(fast::scaled_dot_product_attention(&s(&q)?, &s(&k)?, &s(&v)?, scale, AttentionMask::None)?);
        }
        let refs: Vec<&Array> = outs.iter().collect();
        let o = Array::concatenate(&refs, 2)?.transpose(&[0, 2, 1, 3])?.reshape(&[l, -1])?;
        let x = x.add(&self.proj.forward(&o)?)?;
        let n = self.norm2.forward(&x)?;
        let g = self.gate.forward(&n)?;
        let m = self.down.forward(&g.multiply(&g.sigmoid()?)?.multiply(&self.up.forward(&n)?)?)?;
        x.add(&m)
    }
}

impl Params for Block {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.norm1, self.norm2, self.qkv, self.proj, self.gate, self.up, self.down);
    }
}

/// Qwen2.5-VL's vision tower.
pub struct Qwen25Vision {
    config: VisionConfig,
    /// `[C·T·p·p, hidden]`: the Conv3d as a matrix over (channel, t, y, x).
    patch_weight_t: Array,
    blocks: Vec<Block>,
    ln_q: RmsNorm,
    mlp0: Linear,
    mlp2: Linear,
}

impl Qwen25Vision {
    /// The vision side of a qwen2_5_vl checkpoint, or `None` when it has no `vision_config` (or
    /// no tower tensors: a text-only conversion).
    pub fn load(raw: &Value, vb: &Vb) -> Result<Option<Self>> {
        let Some(vc) = raw.get("vision_config").filter(|v| !v.is_null()) else { return Ok(None) };
        let config: VisionConfig = serde_path_to_error::deserialize(vc.clone())
            .map_err(|e| Error::InvalidArgument(format!("config.json: vision_config.{e}")))?;
        config.validate().map_err(|e| Error::InvalidArgument(format!("config.json: {e}")))?;
        let text_hidden = raw.get("hidden_size").and_then(Value::as_u64).unwrap_or(0) as usize;
        if text_hidden != config.out_hidden_size {
            return Err(Error::InvalidArgument(format!(
                "config.json: vision_config.out_hidden_size {} differs from the text model's hidden_size {text_hidden}",
                config.out_hidden_size
            )));
        }
        let roots = [vb.pp("vision_tower"), vb.pp("visual"), vb.pp("model").pp("visual")];
        let root = match roots.iter().find(|r| r.pp("patch_embed").pp("proj").contains("weight")) {
            Some(r) => r.clone(),
            None if roots.iter().all(|r| !r.holds_any()) => return Ok(None),
            None => roots[0].clone(),
        };
        let (d, c, t, p) = (config.hidden_size, config.in_channels, config.temporal_patch_size, config.patch_size);
        let pe = root.pp("patch_embed").pp("proj");
        let mlx_shape = [d, t, p, p, c];
        let torch_shape = [d, c, t, p, p];
        let w = match pe.stored_shape("weight") {
            Some(s) if s == torch_shape && s != mlx_shape => pe.get("weight", &torch_shape)?,
            _ => pe.get("weight", &mlx_shape)?.transpose(&[0, 4, 1, 2, 3])?,
        };
        let patch_weight_t = w.reshape(&[d as i32, -1])?.transpose(&[1, 0])?.contiguous()?;
        let blocks = (0..config.depth).map(|i| Block::load(&root.pp("blocks").pp(i), &config)).collect::<Result<Vec<_>>>()?;
        let merged = d * config.spatial_merge_size * config.spatial_merge_size;
        let merger = root.pp("merger");
        Ok(Some(Qwen25Vision {
            blocks,
            ln_q: RmsNorm::load(&merger.pp("ln_q"), d, 1e-6)?,
            mlp0: Linear::load(&merger.pp("mlp").pp(0), merged, merged, true)?,
            mlp2: Linear::load(&merger.pp("mlp").pp(2), merged, config.out_hidden_size, true)?,
            patch_weight_t,
            config,
        }))
    }

    pub fn config(&self) -> &VisionConfig {
        &self.config
    }

    /// `get_window_index` for one image of `gh × gw` patches: the merge blocks in window order,
    /// and each non-empty window's (start, end) in patches of that order.
    fn windows(&self, gh: usize, gw: usize) -> (Vec<i32>, Vec<(i32, i32)>) {
        let m = self.config.spatial_merge_size;
        let ws = self.config.window_size / m / self.config.patch_size;
        let (lh, lw) = (gh / m, gw / m);
        let (nh, nw) = ((lh + ws - lh % ws) / ws, (lw + ws - lw % ws) / ws);
        let mut index = Vec::with_capacity(lh * lw);
        let mut segments = vec![];
        for wh in 0..nh {
            for ww in 0..nw {
                let start = index.len();
                for r in 0..ws {
                    for c in 0..ws {
                        let (row, col) = (wh * ws + r, ww * ws + c);
                        if row < lh && col < lw {
                            index.push((row * lw + col) as i32);
                        }
                    }
                }
                if index.len() > start {
                    segments.push(((start * m * m) as i32, (index.len() * m * m) as i32));
                }
            }
        }
        (index, segments)
    }

    /// The tower for one image: processed patches `[gh·gw, C·T·p·p]` (merge-block order) to rows
    /// `[gh·gw / merge², out_hidden_size]` (row-major over the merged grid).
    pub fn forward(&self, patches: &Array, gh: usize, gw: usize) -> Result<Array> {
        let c = &self.config;
        let m = c.spatial_merge_size;
        let dim = c.in_channels * c.temporal_patch_size * c.patch_size * c.patch_size;
        if gh == 0 || gw == 0 || gh % m != 0 || gw % m != 0 || patches.shape() != [(gh * gw) as i32, dim as i32] {
            return Err(Error::InvalidArgument(format!(
                "image patches must be [{gh}·{gw}, {dim}] with the grid a multiple of {m}, got {:?}",
                patches.shape()
            )));
        }
        let n = (gh * gw) as i32;
        let unit = (m * m) as i32;
        let dt = self.patch_weight_t.dtype();
        let (index, windows) = self.windows(gh, gw);
        let order = Array::from_slice(&index, &[index.len() as i32])?;
        let regroup = |a: &Array, lead: &[i32]| -> Result<Array> {
            let d = *a.shape().last().expect("rank ≥ 1");
            let mut shape = lead.to_vec();
            shape.extend([n, d]);
            a.reshape(&[n / unit, unit, d])?.take(&order, 0)?.reshape(&shape)
        };
        let x = patches.astype(dt)?.matmul(&self.patch_weight_t)?;
        let mut x = regroup(&x, &[])?;
        let (cos, sin) = vision_rope(c.hidden_size / c.num_heads, m, gh, gw)?;
        let rope = (regroup(&cos, &[1])?.reshape(&[1, n, 1, -1])?, regroup(&sin, &[1])?.reshape(&[1, n, 1, -1])?);
        let whole = [(0, n)];
        for (i, b) in self.blocks.iter().enumerate() {
            let segments: &[(i32, i32)] = if c.fullatt_block_indexes.contains(&i) { &whole } else { &windows };
            x = b.forward(&x, &rope, c.num_heads as i32, segments)?;
        }
        let merged = (c.hidden_size * m * m) as i32;
        let x = self.ln_q.forward(&x)?.reshape(&[-1, merged])?;
        let rows = self.mlp2.forward(&gelu_erf(&self.mlp0.forward(&x)?)?)?;
        // Back to the image's order: row j of the output is window-order row inverse[j].
        let mut inverse = vec![0i32; index.len()];
        for (pos, &blk) in index.iter().enumerate() {
            inverse[blk as usize] = pos as i32;
        }
        rows.take(&Array::from_slice(&inverse, &[inverse.len() as i32])?, 0)
    }
}

impl Params for Qwen25Vision {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        out.push(&self.patch_weight_t);
        for b in &self.blocks {
            b.params(out);
        }
        crate::params!(out; self.ln_q, self.mlp0, self.mlp2);
    }
}

impl super::qwen_vision::QwenTower for Qwen25Vision {
    fn forward(&self, patches: &Array, gh: usize, gw: usize) -> Result<Array> {
        Qwen25Vision::forward(self, patches, gh, gw)
    }
}
