//! Qwen3.5's and Qwen3-VL's vision side (issue 15): the Qwen3-VL vision tower that turns an image, at its own
//! resolution, into one row per 2 × 2 block of patches at the text model's width, and the
//! [`ImageEncoder`] that runs the processor ([`QwenImageProcessor`]) in front of it. Follows
//! mlx-vlm 0.7.10 `models/qwen3_vl/vision.py` (`VisionModel`, which `qwen3_5/vision.py` reuses;
//! Qwen3.5 has no deepstack mergers), checked against it by tests/vision_qwen.rs:
//! - patch embedding: a Conv3d with kernel = stride = (temporal, patch, patch), with bias, here
//!   the equivalent matrix over each processed patch flattened (channel, t, y, x);
//! - a learned position table of `num_position_embeddings` (an n × n grid) bilinearly
//!   interpolated to the image's patch grid (`fast_pos_embed_interpolate`: `linspace(0, n − 1,
//!   side)` in float32, the four neighbours weighted and summed), in the patches' merge-block order;
//! - `depth` blocks: LayerNorm (eps 1e-6) → attention (fused qkv with bias, a 2-D rope over the
//!   whole head: the first half of the angles from the patch's row, the second from its column,
//!   `inv_freq = 1 / 10000^(2i / (head_dim / 2))`, each angle used twice as `rotate_half` pairs
//!   them; softmax scale `head_dim^-½`, every patch of the image sees every other) → residual,
//!   LayerNorm → fc1 → GELU (tanh form) → fc2 → residual;
//! - the merger: LayerNorm (eps 1e-6) per patch, each merge block's `merge²` patches concatenated,
//!   fc1 → GELU (erf form) → fc2 to `out_hidden_size` (the text model's width);
//! - deepstack (Qwen3-VL, `vision_config.deepstack_visual_indexes`, none for Qwen3.5): after each
//!   listed block, its output through a merger of its own (`deepstack_merger_list.{i}`, the i-th
//!   listed block's; its LayerNorm over each merge block's concatenated patches, "postshuffle"),
//!   the features taken in block order. [`QwenVision::forward`] gives them after the main rows,
//!   side by side (`[rows, (1 + deepstack) · out_hidden_size]`): the text model adds them to its
//!   hidden states at the image's positions after its first layers (`qwen3_vl.rs`).
//!
//! A video (given as frames) goes through the video processor ([`QwenVideoProcessor`]) whole,
//! then each temporal group through the tower as an image ([`QwenTower::forward_groups`]).
//!
//! Weights sit under `vision_tower.` (mlx-vlm) or `model.visual.` (Hugging Face); the Conv3d
//! weight as `[out, T, p, p, C]` (MLX) or `[out, C, T, p, p]` (PyTorch).
use serde::Deserialize;
use serde_json::Value;

use super::vision_lm::{ImageEncoder, RowScale};
use crate::error::{Error, Result};
use crate::loader::Vb;
use crate::media::{QwenImageProcessor, QwenVideoProcessor, RgbImage};
use crate::mlx::fast::{self, AttentionMask};
use crate::mlx::{Array, Dtype};
use crate::nn::activation::gelu_approx;
use crate::nn::{Embedding, LayerNorm, Linear, Params};
use crate::nn::rope::{rotate_half_rope, signed_sin};

/// `vision_config` of a qwen3_5 config.json, with mlx-vlm's defaults.
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
    pub num_position_embeddings: usize,
    pub deepstack_visual_indexes: Vec<usize>,
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
            num_position_embeddings: 2304,
            deepstack_visual_indexes: vec![],
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
            ("num_position_embeddings", self.num_position_embeddings),
        ])?;
        if self.in_channels != 3 {
            return Err(format!("vision_config.in_channels {} is not 3 (RGB)", self.in_channels));
        }
        if self.hidden_size % self.num_heads != 0 || (self.hidden_size / self.num_heads) % 4 != 0 {
            return Err("vision_config.hidden_size / num_heads must be a multiple of 4 (the 2-D rope)".into());
        }
        let side = (self.num_position_embeddings as f64).sqrt() as usize;
        if side * side != self.num_position_embeddings {
            return Err(format!("vision_config.num_position_embeddings {} is not a square", self.num_position_embeddings));
        }
        let ds = &self.deepstack_visual_indexes;
        if let Some(&i) = ds.iter().find(|&&i| i >= self.depth) {
            return Err(format!("vision_config.deepstack_visual_indexes holds {i}, past the tower's depth {}", self.depth));
        }
        if ds.iter().enumerate().any(|(k, i)| ds[..k].contains(i)) {
            return Err(format!("vision_config.deepstack_visual_indexes {ds:?} names a block twice"));
        }
        Ok(())
    }

    fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }
}

/// MLX's `gelu` (`nn.GELU()`): `x · (1 + erf(x / √2)) / 2`.
pub(crate) fn gelu_erf(x: &Array) -> Result<Array> {
    let dt = x.dtype();
    let c = |v: f32| Array::scalar_f32(v, dt);
    let e = x.divide(&c(std::f64::consts::SQRT_2 as f32)?)?.erf()?;
    x.multiply(&c(1.0)?.add(&e)?)?.divide(&c(2.0)?)
}

struct Block {
    norm1: LayerNorm,
    norm2: LayerNorm,
    qkv: Linear,
    proj: Linear,
    fc1: Linear,
    fc2: Linear,
}

impl Block {
    fn load(vb: &Vb, c: &VisionConfig) -> Result<Self> {
        let d = c.hidden_size;
        Ok(Block {
            norm1: LayerNorm::load(&vb.pp("norm1"), d, 1e-6)?,
            norm2: LayerNorm::load(&vb.pp("norm2"), d, 1e-6)?,
            qkv: Linear::load(&vb.pp("attn").pp("qkv"), d, 3 * d, true)?,
            proj: Linear::load(&vb.pp("attn").pp("proj"), d, d, true)?,
            fc1: Linear::load(&vb.pp("mlp").pp("linear_fc1"), d, c.intermediate_size, true)?,
            fc2: Linear::load(&vb.pp("mlp").pp("linear_fc2"), c.intermediate_size, d, true)?,
        })
    }

    /// `x` `[L, hidden]`; `rope`: (cos, sin) `[1, L, 1, head_dim]`.
    fn forward(&self, x: &Array, rope: &(Array, Array), heads: i32) -> Result<Array> {
        let l = x.shape()[0];
        let h = self.norm1.forward(x)?;
        let qkv = self.qkv.forward(&h)?.reshape(&[l, 3, heads, -1])?;
        let hd = qkv.shape()[3];
        let part = |i: i32| -> Result<Array> { qkv.slice_axis(1, i, i + 1)?.reshape(&[1, l, heads, hd]) };
        let (q, k, v) = (apply_rope(&part(0)?, rope)?, apply_rope(&part(1)?, rope)?, part(2)?);
        let t = |a: &Array| a.transpose(&[0, 2, 1, 3]);
        let scale = (hd as f64).powf(-0.5) as f32;
        let o = fast::scaled_dot_product_attention(&t(&q)?, &t(&k)?, &t(&v)?, scale, AttentionMask::None)?;
        let o = o.transpose(&[0, 2, 1, 3])?.reshape(&[l, -1])?;
        let x = x.add(&self.proj.forward(&o)?)?;
        let m = self.fc2.forward(&gelu_approx(&self.fc1.forward(&self.norm2.forward(&x)?)?)?)?;
        x.add(&m)
    }
}

impl Params for Block {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.norm1, self.norm2, self.qkv, self.proj, self.fc1, self.fc2);
    }
}

/// `x·cos + rotate_half(x)·sin` over the whole head (`x` `[1, L, H, D]`; the tables
/// `[1, L, 1, D]` from [`vision_rope`]), cast back to `x`'s dtype.
pub(crate) fn apply_rope(x: &Array, (cos, sin): &(Array, Array)) -> Result<Array> {
    rotate_half_rope(x, cos, sin, 1)?.astype(x.dtype())
}

/// The Qwen3-VL vision tower (Qwen3.5's).
pub struct QwenVision {
    config: VisionConfig,
    /// `[C·T·p·p, hidden]`: the Conv3d as a matrix over (channel, t, y, x).
    patch_weight_t: Array,
    patch_bias: Array,
    /// The learned position table (quantized in some mlx-community conversions).
    pos_embed: Embedding,
    blocks: Vec<Block>,
    merger: Merger,
    /// Deepstack: (block index, its merger), in `deepstack_visual_indexes` order.
    deepstack: Vec<(usize, Merger)>,
}

/// A patch merger: LayerNorm, each merge block's patches concatenated, fc1 → GELU (erf) → fc2.
/// `postshuffle` (deepstack's): the norm over the concatenated patches, else over each patch.
struct Merger {
    norm: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    postshuffle: bool,
}

impl Merger {
    fn load(vb: &Vb, c: &VisionConfig, postshuffle: bool) -> Result<Self> {
        let merged = c.hidden_size * c.spatial_merge_size * c.spatial_merge_size;
        Ok(Merger {
            norm: LayerNorm::load(&vb.pp("norm"), if postshuffle { merged } else { c.hidden_size }, 1e-6)?,
            fc1: Linear::load(&vb.pp("linear_fc1"), merged, merged, true)?,
            fc2: Linear::load(&vb.pp("linear_fc2"), merged, c.out_hidden_size, true)?,
            postshuffle,
        })
    }

    /// Patches `[L, hidden]` (merge-block order) to `[L / merge², out_hidden_size]`.
    fn forward(&self, x: &Array, merged: i32) -> Result<Array> {
        let x = if self.postshuffle {
            self.norm.forward(&x.reshape(&[-1, merged])?)?
        } else {
            self.norm.forward(x)?.reshape(&[-1, merged])?
        };
        self.fc2.forward(&gelu_erf(&self.fc1.forward(&x)?)?)
    }
}

impl Params for Merger {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.norm, self.fc1, self.fc2);
    }
}

impl QwenVision {
    /// The vision side of a qwen3_5 checkpoint (`raw`: its config.json as `ModelConfig::raw`
    /// holds it), or `None` when it has no `vision_config`. Qwen3.5 takes no deepstack (mlx-vlm's
    /// qwen3_5 refuses it too).
    pub fn load(raw: &Value, vb: &Vb) -> Result<Option<Self>> {
        Self::load_with(raw, vb, false)
    }

    /// The vision side of a qwen3_vl checkpoint: as [`Self::load`], with the deepstack mergers
    /// `vision_config.deepstack_visual_indexes` lists.
    pub fn load_deepstack(raw: &Value, vb: &Vb) -> Result<Option<Self>> {
        Self::load_with(raw, vb, true)
    }

    fn load_with(raw: &Value, vb: &Vb, deepstack: bool) -> Result<Option<Self>> {
        let Some(vc) = raw.get("vision_config").filter(|v| !v.is_null()) else { return Ok(None) };
        let config: VisionConfig = serde_path_to_error::deserialize(vc.clone())
            .map_err(|e| Error::InvalidArgument(format!("config.json: vision_config.{e}")))?;
        config.validate().map_err(|e| Error::InvalidArgument(format!("config.json: {e}")))?;
        if !deepstack && !config.deepstack_visual_indexes.is_empty() {
            return Err(Error::InvalidArgument("config.json: vision_config.deepstack_visual_indexes must be empty for qwen3_5".into()));
        }
        let text_hidden = raw.get("hidden_size").and_then(Value::as_u64).unwrap_or(0) as usize;
        if text_hidden != config.out_hidden_size {
            return Err(Error::InvalidArgument(format!(
                "config.json: vision_config.out_hidden_size {} differs from the text model's hidden_size {text_hidden}",
                config.out_hidden_size
            )));
        }
        let has = |root: &Vb| root.pp("patch_embed").pp("proj").contains("weight");
        let root = if has(&vb.pp("model").pp("visual")) {
            vb.pp("model").pp("visual")
        } else if has(&vb.pp("vision_tower")) {
            vb.pp("vision_tower")
        } else if !vb.pp("vision_tower").holds_any() && !vb.pp("model").pp("visual").holds_any() {
            // A text-only conversion that kept the config's vision_config (mlx-lm drops the tower).
            return Ok(None);
        } else {
            vb.pp("vision_tower")
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
        let deepstack = (config.deepstack_visual_indexes.iter().enumerate())
            .map(|(k, &i)| Ok((i, Merger::load(&root.pp("deepstack_merger_list").pp(k), &config, true)?)))
            .collect::<Result<Vec<_>>>()?;
        let extra = root.pp("deepstack_merger_list").pp(deepstack.len());
        if extra.holds_any() {
            return Err(Error::InvalidArgument(format!(
                "the weights hold {}.*, a deepstack merger vision_config.deepstack_visual_indexes does not list ({} listed)",
                extra.prefix(),
                deepstack.len()
            )));
        }
        Ok(Some(QwenVision {
            patch_bias: pe.get("bias", &[d])?,
            pos_embed: Embedding::load(&root.pp("pos_embed"), config.num_position_embeddings, d)?,
            blocks,
            merger: Merger::load(&root.pp("merger"), &config, false)?,
            deepstack,
            patch_weight_t,
            config,
        }))
    }

    pub fn config(&self) -> &VisionConfig {
        &self.config
    }

    /// The interpolated position table rows for a `gh × gw` patch grid, in merge-block order.
    fn positions(&self, gh: usize, gw: usize) -> Result<Array> {
        let n = (self.config.num_position_embeddings as f64).sqrt() as usize;
        // mlx's linspace(0, n − 1, k): t = i / (k − 1), then t · (n − 1), in float32.
        let lin = |k: usize| -> Vec<f32> {
            (0..k).map(|i| if k == 1 { 0.0 } else { (i as f32 / (k - 1) as f32) * (n - 1) as f32 }).collect()
        };
        let (hs, ws) = (lin(gh), lin(gw));
        let m = self.config.spatial_merge_size;
        let count = gh * gw;
        let mut idx = vec![vec![0i32; count]; 4];
        let mut wts = vec![vec![0f32; count]; 4];
        let mut j = 0;
        for bh in 0..gh / m {
            for bw in 0..gw / m {
                for mh in 0..m {
                    for mw in 0..m {
                        let (r, c) = (bh * m + mh, bw * m + mw);
                        let (hf, wf) = (hs[r] as i32, ws[c] as i32);
                        let (hc, wc) = ((hf + 1).min(n as i32 - 1), (wf + 1).min(n as i32 - 1));
                        let (dh, dw) = (hs[r] - hf as f32, ws[c] - wf as f32);
                        let (bf, bc) = (hf * n as i32, hc * n as i32);
                        let corners = [
                            (bf + wf, (1.0 - dh) * (1.0 - dw)),
                            (bf + wc, (1.0 - dh) * dw),
                            (bc + wf, dh * (1.0 - dw)),
                            (bc + wc, dh * dw),
                        ];
                        for (q, (i, w)) in corners.into_iter().enumerate() {
                            idx[q][j] = i;
                            wts[q][j] = w;
                        }
                        j += 1;
                    }
                }
            }
        }
        let mut sum: Option<Array> = None;
        for q in 0..4 {
            let rows = self.pos_embed.forward(&Array::from_slice(&idx[q], &[count as i32])?)?;
            // The weights in the rows' dtype (mlx-vlm: a quantized table's packed dtype would
            // truncate them).
            let w = Array::from_slice(&wts[q], &[count as i32, 1])?.astype(rows.dtype())?;
            let term = rows.multiply(&w)?;
            sum = Some(match sum {
                None => term,
                Some(s) => s.add(&term)?,
            });
        }
        Ok(sum.expect("four corners"))
    }

    /// The tower (`VisionModel.__call__` for one image): processed patches `[gh·gw, C·T·p·p]`
    /// (merge-block order) to rows `[gh·gw / merge², out_hidden_size]`, and with deepstack each
    /// listed block's features after them, side by side (`[…, (1 + deepstack) · out_hidden_size]`).
    pub fn forward(&self, patches: &Array, gh: usize, gw: usize) -> Result<Array> {
        let (rows, deep) = self.forward_deepstack(patches, gh, gw)?;
        if deep.is_empty() {
            return Ok(rows);
        }
        let mut all = vec![&rows];
        all.extend(deep.iter());
        Array::concatenate(&all, 1)
    }

    /// How many deepstack features [`Self::forward`] gives after each row's own.
    pub fn deepstack_layers(&self) -> usize {
        self.deepstack.len()
    }

    /// The tower's rows `[gh·gw / merge², out_hidden_size]` and its deepstack features (one such
    /// array per listed block, in block order, as mlx-vlm lists them).
    pub fn forward_deepstack(&self, patches: &Array, gh: usize, gw: usize) -> Result<(Array, Vec<Array>)> {
        let c = &self.config;
        let m = c.spatial_merge_size;
        let dim = c.in_channels * c.temporal_patch_size * c.patch_size * c.patch_size;
        if gh == 0 || gw == 0 || gh % m != 0 || gw % m != 0 || patches.shape() != [(gh * gw) as i32, dim as i32] {
            return Err(Error::InvalidArgument(format!(
                "image patches must be [{gh}·{gw}, {dim}] with the grid a multiple of {m}, got {:?}",
                patches.shape()
            )));
        }
        let dt = self.patch_weight_t.dtype();
        let x = patches.astype(dt)?.matmul(&self.patch_weight_t)?.add(&self.patch_bias)?;
        let mut x = x.add(&self.positions(gh, gw)?)?;
        let rope = vision_rope(c.head_dim(), m, gh, gw)?;
        let merged = (c.hidden_size * m * m) as i32;
        let mut deep = vec![];
        for (i, b) in self.blocks.iter().enumerate() {
            x = b.forward(&x, &rope, c.num_heads as i32)?;
            if let Some((_, merger)) = self.deepstack.iter().find(|(at, _)| *at == i) {
                deep.push(merger.forward(&x, merged)?);
            }
        }
        Ok((self.merger.forward(&x, merged)?, deep))
    }
}

impl Params for QwenVision {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        out.extend([&self.patch_weight_t, &self.patch_bias]);
        self.pos_embed.params(out);
        for b in &self.blocks {
            b.params(out);
        }
        self.merger.params(out);
        for (_, m) in &self.deepstack {
            m.params(out);
        }
    }
}

/// A Qwen vision tower (Qwen3-VL's here, Qwen2.5-VL's windowed one in `qwen2_5_vision.rs`): an
/// image's merged rows from its patches on a `gh × gw` grid.
pub trait QwenTower: Params {
    fn forward(&self, patches: &Array, gh: usize, gw: usize) -> Result<Array>;

    /// How many deepstack features each row carries after its own (Qwen3-VL; none for the
    /// others): [`Self::forward`]'s rows are `(1 + this) · out_hidden_size` wide.
    fn deepstack_layers(&self) -> usize {
        0
    }

    /// A video's rows from its patches, `t` temporal groups of `gh × gw` in order: each group
    /// through the tower as an image is (mlx-vlm's towers attend within a group only: one
    /// `cu_seqlens` segment, or window set, per group; the position table and rope repeat per
    /// group), the groups' rows in order.
    fn forward_groups(&self, patches: &Array, t: usize, gh: usize, gw: usize) -> Result<Array> {
        let n = (gh * gw) as i32;
        if t == 0 || patches.shape().first() != Some(&(t as i32 * n)) {
            return Err(Error::InvalidArgument(format!("video patches must be [{t}·{gh}·{gw}, …], got {:?}", patches.shape())));
        }
        let rows = (0..t as i32).map(|g| self.forward(&patches.slice_axis(0, g * n, (g + 1) * n)?, gh, gw)).collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Array> = rows.iter().collect();
        Array::concatenate(&refs, 0)
    }
}

impl QwenTower for QwenVision {
    fn forward(&self, patches: &Array, gh: usize, gw: usize) -> Result<Array> {
        QwenVision::forward(self, patches, gh, gw)
    }

    fn deepstack_layers(&self) -> usize {
        self.deepstack.len()
    }
}

/// A tower with Qwen's processors: an image's or a video's rows, and where they sit on the rope grid.
pub struct QwenImages<V> {
    pub vision: V,
    pub processor: QwenImageProcessor,
    /// The video processor, when the checkpoint takes video.
    pub video: Option<QwenVideoProcessor>,
}

impl<V: QwenTower> ImageEncoder for QwenImages<V> {
    fn encode(&self, image: &RgbImage) -> Result<Array> {
        let pv = self.processor.preprocess(image)?;
        let (_, gh, gw) = pv.grid;
        let patches = Array::from_slice(&pv.data, &[pv.patches as i32, pv.patch_dim as i32])?;
        self.vision.forward(&patches, gh, gw)
    }

    fn encode_video(&self, frames: &[RgbImage]) -> Result<(Array, (usize, usize, usize))> {
        let v = self.video.as_ref().ok_or_else(|| Error::InvalidArgument("this checkpoint takes no video".into()))?;
        let pv = v.preprocess(frames)?;
        let (t, gh, gw) = pv.grid;
        let patches = Array::from_slice(&pv.data, &[pv.patches as i32, pv.patch_dim as i32])?;
        let m = v.frame.merge_size;
        Ok((self.vision.forward_groups(&patches, t, gh, gw)?, (t, gh / m, gw / m)))
    }

    fn row_scale(&self) -> RowScale {
        RowScale::Embedding
    }

    fn mrope_grid(&self, size: (u32, u32)) -> Option<(usize, usize)> {
        self.processor.merged_grid(size.1, size.0).ok()
    }

    fn deepstack_layers(&self) -> usize {
        self.vision.deepstack_layers()
    }
}

impl<V: QwenTower> Params for QwenImages<V> {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        self.vision.params(out);
    }
}

/// A qwen3_5 (or qwen3_5_moe) checkpoint: with a `vision_config`, its text model behind the
/// vision tower as a [`super::vision_lm::VisionLm`] with multimodal rope; without, the text model
/// alone. The tower's tensors are taken first (the text model drops what is left of them).
pub fn load_with_vision(c: &crate::loader::ModelConfig, vb: &Vb) -> Result<Box<dyn super::CausalLm>> {
    let vision = QwenVision::load(&c.raw, vb).map_err(|e| match e {
        Error::InvalidArgument(m) => c.error(m),
        other => other,
    })?;
    let text = super::load_as::<super::qwen3_next::Qwen3Next>(c, vb)?;
    let Some(vision) = vision else { return Ok(text) };
    let vc = vision.config();
    let patching = (vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size);
    with_tower(c, text, vision, patching, (248_056, 248_057), 16, true)
}

/// `text` with a Qwen tower in front: the image and video tokens (`image_token_id` and
/// `video_token_id`, else `default_tokens`), the checkpoint's processors (patch size
/// `default_patch` unless they say), which must patch as the tower does (`patching`: patch size,
/// merge size, temporal patch size from `vision_config`), and 3-D rope positions. Video (as
/// frames) is taken when the video token is in the vocabulary and the video processor patches as
/// the tower does; `timestamped`: the prompt writes each temporal group after its timestamp
/// (Qwen3.5), else the whole video as one run (Qwen2.5-VL).
pub(crate) fn with_tower<V: QwenTower + 'static>(
    c: &crate::loader::ModelConfig,
    text: Box<dyn super::CausalLm>,
    vision: V,
    patching: (usize, usize, usize),
    default_tokens: (u32, u32),
    default_patch: usize,
    timestamped: bool,
) -> Result<Box<dyn super::CausalLm>> {
    let token = |key: &str, default: u32| -> Result<u32> {
        match c.raw.get(key).filter(|v| !v.is_null()) {
            None => Ok(default),
            Some(v) => Ok(v.as_u64().filter(|&t| t < u32::MAX as u64).ok_or_else(|| c.error(format!("{key} {v} is not a token id")))? as u32),
        }
    };
    let image_token = token("image_token_id", default_tokens.0)?;
    let video_token = token("video_token_id", default_tokens.1)?;
    if image_token as usize >= text.vocab_size() {
        return Err(c.error(format!("image_token_id {image_token} is outside the vocabulary ({})", text.vocab_size())));
    }
    let processor = processor_for(c, default_patch)?;
    let (patch_size, merge_size, temporal_patch_size) = patching;
    if (processor.patch_size, processor.merge_size, processor.temporal_patch_size) != patching {
        return Err(c.error(format!(
            "the image processor's patch_size {} / merge_size {} / temporal_patch_size {} differ from vision_config's {patch_size} / {merge_size} / {temporal_patch_size}",
            processor.patch_size, processor.merge_size, processor.temporal_patch_size,
        )));
    }
    let video = video_processor_for(c, default_patch)?;
    let fits = (video.frame.patch_size, video.frame.merge_size, video.frame.temporal_patch_size) == patching;
    let video = (fits && (video_token as usize) < text.vocab_size()).then_some(video);
    let prompt = super::vision_lm::ImagePrompt {
        marker: "<|image_pad|>".into(),
        expansion: "<|image_pad|>".into(),
        image_token,
        placeholder_tokens: 1,
        video: video.as_ref().map(|v| super::vision_lm::VideoPrompt {
            marker: if timestamped { "<|vision_start|><|video_pad|><|vision_end|>" } else { "<|video_pad|>" }.into(),
            video_token,
            layout: super::vision_lm::VideoLayout::Whole(super::vision_lm::WholeVideoPrompt {
                video_token_text: "<|video_pad|>".into(),
                groups: timestamped.then(|| ("<|vision_start|>".into(), "<|vision_end|>".into())),
                processor: v.clone(),
            }),
        }),
        pan_and_scan: None,
    };
    let encoder = Box::new(QwenImages { vision, processor, video });
    Ok(Box::new(super::vision_lm::VisionLm::new(text, encoder, prompt).with_mrope()))
}

/// The image processor of the checkpoint beside `c` (mlx-vlm's `_qwen_vl_image_kwargs`:
/// preprocessor_config.json, processor_config.json's `image_processor` over it), the patch size
/// `default_patch` unless they say.
pub(crate) fn processor_for(c: &crate::loader::ModelConfig, default_patch: usize) -> Result<QwenImageProcessor> {
    let dir = c.path.parent().map(std::path::Path::to_path_buf).unwrap_or_default();
    let read = |name: &str| read_json(&dir, name);
    let mut merged = read("preprocessor_config.json")?.unwrap_or_else(|| serde_json::json!({}));
    if let Some(Value::Object(over)) = read("processor_config.json")?.and_then(|p| p.get("image_processor").cloned()) {
        let m = merged.as_object_mut().expect("an object");
        for (k, v) in over {
            m.insert(k, v);
        }
    }
    QwenImageProcessor::from_config(&merged, default_patch)
        .map_err(|e| Error::checkpoint(dir.join("preprocessor_config.json"), format!("(with processor_config.json's image_processor) {e}")))
}

/// The video processor of the checkpoint beside `c` (mlx-vlm's `_qwen_vl_video_kwargs`:
/// video_preprocessor_config.json, else preprocessor_config.json), the patch size `default_patch`
/// unless it says.
pub(crate) fn video_processor_for(c: &crate::loader::ModelConfig, default_patch: usize) -> Result<QwenVideoProcessor> {
    let dir = c.path.parent().map(std::path::Path::to_path_buf).unwrap_or_default();
    let mut name = "video_preprocessor_config.json";
    let mut cfg = read_json(&dir, name)?;
    if cfg.is_none() {
        name = "preprocessor_config.json";
        cfg = read_json(&dir, name)?;
    }
    QwenVideoProcessor::from_config(&cfg.unwrap_or_else(|| serde_json::json!({})), default_patch)
        .map_err(|e| Error::checkpoint(dir.join(name), format!("(as the video processor's settings) {e}")))
}

/// A JSON object file of the checkpoint directory `dir`, if it is there.
fn read_json(dir: &std::path::Path, name: &str) -> Result<Option<Value>> {
    let path = dir.join(name);
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    let json: Value = serde_json::from_str(&text).map_err(|e| Error::checkpoint(&path, format!("not JSON: {e}")))?;
    if !json.is_object() {
        return Err(Error::checkpoint(&path, "not a JSON object"));
    }
    Ok(Some(json))
}

/// The vision 2-D rope's (cos, signed sin) `[1, L, 1, head_dim]` for a `gh × gw` patch grid in
/// merge-block order (`m × m` blocks): the first half of the angles from each patch's row, the
/// second from its column.
pub(crate) fn vision_rope(head_dim: usize, m: usize, gh: usize, gw: usize) -> Result<(Array, Array)> {
    let dim = head_dim / 2;
    let (mut rows, mut cols) = (Vec::with_capacity(gh * gw), Vec::with_capacity(gh * gw));
    for bh in 0..gh / m {
        for bw in 0..gw / m {
            for mh in 0..m {
                for mw in 0..m {
                    rows.push((bh * m + mh) as f32);
                    cols.push((bw * m + mw) as f32);
                }
            }
        }
    }
    let l = rows.len() as i32;
    // inv_freq = 1 / 10000^(arange(0, dim, 2) / dim), float32.
    let exps = Array::arange(0.0, dim as f64, 2.0, Dtype::Float32)?.divide(&Array::scalar_f32(dim as f32, Dtype::Float32)?)?;
    let inv = Array::scalar_f32(1.0, Dtype::Float32)?
        .divide(&Array::scalar_f32(10000.0, Dtype::Float32)?.power(&exps)?)?
        .reshape(&[1, -1])?;
    let fr = Array::from_slice(&rows, &[l, 1])?.multiply(&inv)?;
    let fc = Array::from_slice(&cols, &[l, 1])?.multiply(&inv)?;
    let freqs = Array::concatenate(&[&fr, &fc], 1)?;
    let cos = freqs.cos()?;
    // float32, as mlx-vlm's (the rotated head is cast back to its dtype); the sine signed for
    // `rotate_half_rope`.
    Ok((Array::concatenate(&[&cos, &cos], 1)?.reshape(&[1, l, 1, -1])?, signed_sin(&freqs.sin()?)?.reshape(&[1, l, 1, -1])?))
}

