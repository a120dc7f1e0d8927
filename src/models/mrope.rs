//! Multimodal rope positions (Qwen3-VL / Qwen3.5, issue 15): where a prompt holding images puts
//! each token on the text model's rotary axes, and the state that carries the offset to decode.
//!
//! Follows mlx-vlm 0.7.10 `qwen3_5/language.py` (`get_rope_index`) and `rope_utils.py`
//! (`MRoPERotaryEmbedding`, style "interleaved"):
//! - a text token sits at the same position p on the three axes (t, h, w); the first token is 0;
//! - an image of `gh × gw` merged patches (one temporal patch) starting where a text token would
//!   sit at s puts its token k at (s, s + k / gw, s + k % gw), and the text after it continues
//!   at s + max(gh, gw): the image shifts every later position by `max(gh, gw) − gh·gw`;
//! - rotary frequency i (of `rotary_dims / 2`) reads axis h when `i % 3 == 1 && i < 3·section[1]`,
//!   axis w when `i % 3 == 2 && i < 3·section[2]`, else t; the angles are rotated as
//!   non-traditional rope (`x·cos + rotate_half(x)·sin` over the rotary dims, the rest passed).
//!
//! - a video (as mlx-vlm 0.7.10 places it) is `t` temporal groups of `gh × gw`: Qwen3.5 writes
//!   each group as a block of its own (timestamp text between), placed as an image is; Qwen2.5-VL
//!   writes them as one block whose token (g, r) sits at (s + g, s + r / gw, s + r % gw), the
//!   text after it at s + max(t, gh, gw) (mlx-vlm's `get_rope_index` steps the temporal axis by
//!   one a group: it reads no `second_per_grid_ts`). [`MediaGrid`] says which.
//!
//! [`PositionCache`] sits after the text model's layer caches (a [`super::vision_lm::VisionLm`]
//! with mrope adds it): it holds the shift each image of the sequence brought and where it ended,
//! so a decode step (and text after a cached prefix) sits at `offset + shift`; trimming the cache
//! (prompt-cache reuse) drops the images past the cut.
use std::any::Any;

use crate::error::{Error, Result};
use crate::mlx::{Array, Dtype};
use crate::nn::{Cache, SavedCache};

/// Where a chunk's tokens sit on the rotary axes.
#[derive(Debug, Clone, PartialEq)]
pub enum RopePositions {
    /// Positions `start..start + L` on every axis (plain rope).
    Start(usize),
    /// Each token's (t, h, w), L of each.
    Grid([Vec<i32>; 3]),
}

/// Where a media item's rows sit on the rope: `t` temporal groups (1 for an image) of `h × w`
/// merged patches, the rows in order (group, row, col).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MediaGrid {
    pub t: usize,
    pub h: usize,
    pub w: usize,
    /// The groups form one block (Qwen2.5-VL's video); else each group is a block of its own,
    /// placed as an image (Qwen3.5's video, whose groups the prompt separates by text).
    pub stacked: bool,
}

/// Where row k of a [`MediaGrid`] sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Its index in its block (the block starts where a text token would sit at s: at index
    /// `abs − in_block`).
    pub in_block: usize,
    /// Its offsets (t, h, w) from s.
    pub offsets: [i64; 3],
    /// The block's shift of what follows (`max extent − tokens`), when k is its last row.
    pub ends_block: Option<i64>,
}

impl MediaGrid {
    pub fn rows(&self) -> usize {
        self.t * self.h * self.w
    }

    pub fn place(&self, k: usize) -> Placement {
        let n = self.h * self.w;
        let (g, r) = (k / n, k % n);
        let (h, w) = ((r / self.w) as i64, (r % self.w) as i64);
        if self.stacked {
            let last = k + 1 == self.rows();
            let extent = self.t.max(self.h).max(self.w) as i64;
            Placement { in_block: k, offsets: [g as i64, h, w], ends_block: last.then_some(extent - self.rows() as i64) }
        } else {
            let last = r + 1 == n;
            let extent = self.h.max(self.w) as i64;
            Placement { in_block: r, offsets: [0, h, w], ends_block: last.then_some(extent - n as i64) }
        }
    }
}

/// `mrope_section` of a rope block of config.json (`rope_scaling` or `rope_parameters`, named
/// `block_name` in the error): three sizes, or None where the block or the field is absent.
pub fn mrope_section(block: Option<&serde_json::Value>, block_name: &str) -> std::result::Result<Option<[usize; 3]>, String> {
    let Some(v) = block.and_then(|b| b.get("mrope_section")).filter(|v| !v.is_null()) else { return Ok(None) };
    match v.as_array().map(|a| a.iter().map(|x| x.as_u64().filter(|&n| n <= 1 << 16)).collect::<Option<Vec<_>>>()) {
        Some(Some(a)) if a.len() == 3 => Ok(Some([a[0] as usize, a[1] as usize, a[2] as usize])),
        _ => Err(format!("field '{block_name}.mrope_section' = {v} is not three sizes")),
    }
}

/// How MRoPE assigns frequencies to the axes (mlx-vlm's `style`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MropeStyle {
    /// Qwen3-VL / Qwen3.5: t h w t h w …, h and w each for their section's count.
    Interleaved,
    /// Qwen2.5-VL: the first `section[0]` frequencies t, the next `section[1]` h, then w.
    Chunked,
}

/// Rotates `x` `[B, H, L, D]` by per-token 3-D positions `pos` (L each), over the first
/// `rotary_dims` of each head, frequencies `1 / base^(2i / rotary_dims)` assigned to axes by
/// `section` as mlx-vlm's MRoPE of `style` does (frequencies past the sections read t).
pub fn rotate_grid(x: &Array, pos: &[Vec<i32>; 3], rotary_dims: usize, base: f32, section: [usize; 3], style: MropeStyle) -> Result<Array> {
    let l = pos[0].len();
    let half = rotary_dims / 2;
    let sel = |i: usize| -> usize {
        match style {
            MropeStyle::Interleaved if i % 3 == 1 && i < 3 * section[1] => 1,
            MropeStyle::Interleaved if i % 3 == 2 && i < 3 * section[2] => 2,
            MropeStyle::Chunked if i >= section[0] && i < section[0] + section[1] => 1,
            MropeStyle::Chunked if i >= section[0] + section[1] && i < section[0] + section[1] + section[2] => 2,
            _ => 0,
        }
    };
    let mut table = Vec::with_capacity(l * half);
    for j in 0..l {
        for i in 0..half {
            table.push(pos[sel(i)][j] as f32);
        }
    }
    // mlx-vlm: inv_freq = 1 / base^(arange(0, dim, 2) / dim), in float32.
    let r = rotary_dims as i32;
    let exps = Array::arange(0.0, r as f64, 2.0, Dtype::Float32)?.divide(&Array::scalar_f32(r as f32, Dtype::Float32)?)?;
    let inv = Array::scalar_f32(1.0, Dtype::Float32)?.divide(&Array::scalar_f32(base, Dtype::Float32)?.power(&exps)?)?;
    let freqs = Array::from_slice(&table, &[l as i32, half as i32])?.multiply(&inv)?;
    let emb = Array::concatenate(&[&freqs, &freqs], 1)?;
    let (cos, sin) = (emb.cos()?.astype(x.dtype())?, emb.sin()?.astype(x.dtype())?);
    let d = x.shape()[3];
    let h = half as i32;
    let rot = x.slice_axis(3, 0, r)?;
    let rotated = Array::concatenate(&[&rot.slice_axis(3, h, r)?.negative()?, &rot.slice_axis(3, 0, h)?], 3)?;
    let out = rot.multiply(&cos)?.add(&rotated.multiply(&sin)?)?;
    if r == d {
        Ok(out)
    } else {
        Array::concatenate(&[&out, &x.slice_axis(3, r, d)?], 3)
    }
}

/// The mrope state of one sequence: tokens seen and, per image, (the index just past its last
/// token, its shift).
#[derive(Debug, Clone, Default)]
pub struct PositionCache {
    offset: usize,
    images: Vec<(usize, i64)>,
}

impl PositionCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The shift of a token at index `n` (the sum of the shifts of the images ending by then).
    pub fn shift_at(&self, n: usize) -> i64 {
        self.images.iter().filter(|(end, _)| *end <= n).map(|(_, s)| s).sum()
    }

    /// An image ended just before index `end`, shifting what follows by `shift`.
    pub fn push_image(&mut self, end: usize, shift: i64) {
        self.images.retain(|(e, _)| *e < end);
        self.images.push((end, shift));
    }

    /// `n` more tokens seen.
    pub fn advance(&mut self, n: usize) {
        self.offset += n;
    }
}

impl Cache for PositionCache {
    fn offset(&self) -> usize {
        self.offset
    }

    fn can_trim_to(&self, n: usize) -> bool {
        n <= self.offset
    }

    fn trim_to(&mut self, n: usize) -> Result<()> {
        self.offset = self.offset.min(n);
        self.images.retain(|(end, _)| *end <= n);
        Ok(())
    }

    fn state(&self) -> Vec<&Array> {
        vec![]
    }

    fn boxed_clone(&self) -> Box<dyn Cache> {
        Box::new(self.clone())
    }

    fn save(&self) -> Result<Option<SavedCache>> {
        // Shifts are never positive (max(gh, gw) ≤ gh·gw): stored negated.
        let mut ints = vec![self.offset];
        for &(end, shift) in &self.images {
            ints.extend([end, (-shift).max(0) as usize]);
        }
        Ok(Some(SavedCache { kind: "mrope".into(), ints, arrays: vec![] }))
    }

    fn restore(&mut self, saved: SavedCache) -> Result<()> {
        if saved.kind != "mrope" || saved.ints.is_empty() || saved.ints.len() % 2 != 1 || !saved.arrays.is_empty() {
            return Err(saved.mismatch("expected multimodal rope positions"));
        }
        self.offset = saved.ints[0];
        self.images = saved.ints[1..].chunks_exact(2).map(|p| (p[0], -(p[1] as i64))).collect();
        Ok(())
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn Any> {
        Some(self)
    }
}

/// The [`PositionCache`] of `cache`, or an error naming what it is not.
pub fn position_cache(cache: &mut dyn Cache) -> Result<&mut PositionCache> {
    cache
        .as_any_mut()
        .and_then(|a| a.downcast_mut::<PositionCache>())
        .ok_or_else(|| Error::InvalidArgument("the caches lack the multimodal rope positions (made by another model?)".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn video_grids_place_rows() {
        // mlx-vlm's Qwen2.5-VL positions for a (2, 3, 5) video after 7 text tokens: the second
        // group's first row at (7 + 1, 7, 7), the text after at 7 + 5.
        let g = MediaGrid { t: 2, h: 3, w: 5, stacked: true };
        assert_eq!(g.place(15), Placement { in_block: 15, offsets: [1, 0, 0], ends_block: None });
        assert_eq!(g.place(29), Placement { in_block: 29, offsets: [1, 2, 4], ends_block: Some(5 - 30) });
        // Qwen3.5: each group a block of its own.
        let g = MediaGrid { stacked: false, ..g };
        assert_eq!(g.place(14), Placement { in_block: 14, offsets: [0, 2, 4], ends_block: Some(5 - 15) });
        assert_eq!(g.place(16), Placement { in_block: 1, offsets: [0, 0, 1], ends_block: None });
    }

    #[test]
    fn shifts_follow_images_and_trims() {
        let mut c = PositionCache::new();
        c.advance(22);
        c.push_image(22, 5 - 15);
        assert_eq!(c.shift_at(10), 0);
        assert_eq!(c.shift_at(22), -10);
        c.push_image(40, 6 - 12);
        assert_eq!(c.shift_at(41), -16);
        let saved = c.save().unwrap().unwrap();
        let mut d = PositionCache::new();
        d.restore(saved).unwrap();
        assert_eq!(d.shift_at(41), -16);
        d.trim_to(30).unwrap();
        assert_eq!((d.offset(), d.shift_at(41)), (22, -10));
    }
}
