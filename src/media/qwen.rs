//! Qwen3-VL / Qwen3.5's image preprocessing (issue 15), as mlx-vlm 0.7.10's numpy
//! `Qwen3VLImageProcessor` (`models/qwen3_vl/processing_qwen3_vl.py`, a port of transformers'
//! Qwen2-VL processor) computes it:
//! - `smart_resize`: each side rounded (Python's `round`, ties to even) to a multiple of
//!   `factor = patch_size · merge_size`; if the area exceeds `max_pixels`, both sides scaled by
//!   `β = √(h·w / max_pixels)` and floored to the factor (at least one factor), if it falls below
//!   `min_pixels`, scaled by `β = √(min_pixels / (h·w))` and ceiled; aspect ratios over 200 refused;
//! - PIL's BICUBIC on the 8-bit image to that size (none when it is the image's own);
//! - `× rescale_factor`, then `(x − mean) / std` per channel, in float32;
//! - the image repeated `temporal_patch_size` times and cut into patches of
//!   `temporal × patch × patch`, ordered by merge block (row, col), then inside the block (row,
//!   col), each patch flattened (channel, t, y, x): `[grid_h · grid_w, 3 · T · p · p]`.
//!
//! Settings as mlx-vlm's `_qwen_vl_image_kwargs` reads them: `preprocessor_config.json` with
//! `processor_config.json`'s `image_processor` over it; `size.shortest_edge` / `longest_edge` are
//! `min_pixels` / `max_pixels` unless those keys are given; the patch size defaults to 16
//! (Qwen3-VL, Qwen3.5) or 14 (Qwen2.5-VL).
use super::image::{decode_image, resize_with, RgbImage, BICUBIC};
use super::processor_config::ProcessorConfig;
use crate::error::{Error, Result};

/// Qwen's image processor settings.
#[derive(Debug, Clone, PartialEq)]
pub struct QwenImageProcessor {
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub merge_size: usize,
    pub min_pixels: usize,
    pub max_pixels: usize,
    pub rescale_factor: f64,
    /// `(mean, std)` per channel when `do_normalize` is on.
    pub normalize: Option<([f32; 3], [f32; 3])>,
}

impl Default for QwenImageProcessor {
    /// mlx-vlm's `Qwen3VLImageProcessor` defaults.
    fn default() -> Self {
        QwenImageProcessor {
            patch_size: 16,
            temporal_patch_size: 2,
            merge_size: 2,
            min_pixels: 56 * 56,
            max_pixels: 14 * 14 * 4 * 1280,
            rescale_factor: 1.0 / 255.0,
            normalize: Some(([0.5; 3], [0.5; 3])),
        }
    }
}

/// A preprocessed image: `data` `[patches, patch_dim]` (f32, row-major) and its patch grid.
#[derive(Debug, Clone, PartialEq)]
pub struct QwenPixels {
    pub data: Vec<f32>,
    pub patches: usize,
    pub patch_dim: usize,
    /// (grid_t, grid_h, grid_w) in patches.
    pub grid: (usize, usize, usize),
}

fn invalid(what: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(what.to_string())
}

impl QwenImageProcessor {
    /// From a parsed `preprocessor_config.json` (absent or null keys keep the defaults, the
    /// patch size `default_patch`); settings not reproduced (rescale off) are InvalidArgument
    /// rather than silently different.
    pub fn from_config(cfg: &serde_json::Value, default_patch: usize) -> Result<Self> {
        Self::from_config_over(cfg, QwenImageProcessor { patch_size: default_patch, ..Default::default() })
    }

    /// [`Self::from_config`] with other defaults (`base`: the video processor's).
    pub(crate) fn from_config_over(cfg: &serde_json::Value, base: QwenImageProcessor) -> Result<Self> {
        let c = ProcessorConfig::new(cfg);
        let mut p = base;
        if let Some(n) = c.size("patch_size", 1024)? {
            p.patch_size = n;
        }
        if let Some(n) = c.size("temporal_patch_size", 16)? {
            p.temporal_patch_size = n;
        }
        if let Some(n) = c.size("merge_size", 16)? {
            p.merge_size = n;
        }
        if let Some(sizes) = c.get("size") {
            let edge = |k: &str| ProcessorConfig::size_of(&format!("size.{k}"), sizes.get(k), 1 << 40);
            if let Some(n) = edge("shortest_edge")? {
                p.min_pixels = n;
            }
            if let Some(n) = edge("longest_edge")? {
                p.max_pixels = n;
            }
        }
        if let Some(n) = c.size("min_pixels", 1 << 40)? {
            p.min_pixels = n;
        }
        if let Some(n) = c.size("max_pixels", 1 << 40)? {
            p.max_pixels = n;
        }
        if p.min_pixels > p.max_pixels {
            return Err(invalid(format!("processor config: min_pixels {} exceeds max_pixels {}", p.min_pixels, p.max_pixels)));
        }
        if let Some(f) = c.rescale_factor()? {
            p.rescale_factor = f;
        }
        c.require_on(&["do_rescale"])?;
        p.normalize = c.normalize(true)?;
        Ok(p)
    }

    /// `smart_resize`: the (height, width) an image of `height × width` is resized to.
    pub fn target_size(&self, height: u32, width: u32) -> Result<(u32, u32)> {
        let (h, w) = (height as f64, width as f64);
        if h.max(w) / h.min(w) > 200.0 {
            return Err(invalid(format!("a {width}x{height} image: the aspect ratio must be smaller than 200")));
        }
        let f = (self.patch_size * self.merge_size) as f64;
        let mut hb = (h / f).round_ties_even() * f;
        let mut wb = (w / f).round_ties_even() * f;
        if hb * wb > self.max_pixels as f64 {
            let beta = ((h * w) / self.max_pixels as f64).sqrt();
            hb = f.max((h / beta / f).floor() * f);
            wb = f.max((w / beta / f).floor() * f);
        } else if hb * wb < self.min_pixels as f64 {
            let beta = (self.min_pixels as f64 / (h * w)).sqrt();
            hb = (h * beta / f).ceil() * f;
            wb = (w * beta / f).ceil() * f;
        }
        if hb < f || wb < f || hb * wb > (super::MAX_IMAGE_PIXELS as f64) {
            return Err(invalid(format!("a {width}x{height} image resizes to {wb}x{hb}, which is out of range")));
        }
        Ok((hb as u32, wb as u32))
    }

    /// The tokens an image of `height × width` pixels (decoded) becomes, and its merged grid
    /// (rows, cols).
    pub fn merged_grid(&self, height: u32, width: u32) -> Result<(usize, usize)> {
        let (h, w) = self.target_size(height, width)?;
        let f = (self.patch_size * self.merge_size) as u32;
        Ok(((h / f) as usize, (w / f) as usize))
    }

    /// The resized 8-bit image.
    pub fn resized(&self, img: &RgbImage) -> Result<RgbImage> {
        let (th, tw) = self.target_size(img.height, img.width)?;
        if (th, tw) == (img.height, img.width) {
            return Ok(img.clone());
        }
        resize_with(img, tw, th, BICUBIC)
    }

    /// The patches of `img` (repeated over the temporal patch, as the processor does).
    pub fn preprocess(&self, img: &RgbImage) -> Result<QwenPixels> {
        let r = self.resized(img)?;
        Ok(self.patches(&vec![&r; self.temporal_patch_size]))
    }

    /// The patches of `frames` (one size, already resized to multiples of `patch · merge`; their
    /// count a multiple of the temporal patch): each temporal group's patches in merge-block
    /// order, groups in order, each patch flattened (channel, t, y, x).
    pub(crate) fn patches(&self, frames: &[&RgbImage]) -> QwenPixels {
        let (hh, ww) = (frames[0].height as usize, frames[0].width as usize);
        let (p, t, m) = (self.patch_size, self.temporal_patch_size, self.merge_size);
        let scale = self.rescale_factor as f32;
        // Per frame, channel planes as float32 `(x · scale − mean) / std`.
        let lut: Vec<[f32; 3]> = (0..256u32)
            .map(|v| {
                let x = v as f32 * scale;
                match self.normalize {
                    Some((mean, std)) => std::array::from_fn(|c| (x - mean[c]) / std[c]),
                    None => [x; 3],
                }
            })
            .collect();
        let planes: Vec<[Vec<f32>; 3]> = frames
            .iter()
            .map(|f| {
                let mut planes = [vec![0f32; hh * ww], vec![0f32; hh * ww], vec![0f32; hh * ww]];
                for (i, px) in f.data.chunks_exact(3).enumerate() {
                    for c in 0..3 {
                        planes[c][i] = lut[px[c] as usize][c];
                    }
                }
                planes
            })
            .collect();
        let (gt, gh, gw) = (frames.len() / t, hh / p, ww / p);
        let patch_dim = 3 * t * p * p;
        let mut data = Vec::with_capacity(gt * gh * gw * patch_dim);
        for group in planes.chunks_exact(t) {
            for bh in 0..gh / m {
                for bw in 0..gw / m {
                    for mh in 0..m {
                        for mw in 0..m {
                            let (y0, x0) = ((bh * m + mh) * p, (bw * m + mw) * p);
                            for c in 0..3 {
                                for frame in group {
                                    for y in 0..p {
                                        let row = (y0 + y) * ww + x0;
                                        data.extend_from_slice(&frame[c][row..row + p]);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        QwenPixels { data, patches: gt * gh * gw, patch_dim, grid: (gt, gh, gw) }
    }

    /// [`Self::preprocess`] of encoded image bytes.
    pub fn preprocess_bytes(&self, bytes: &[u8]) -> Result<QwenPixels> {
        self.preprocess(&decode_image(bytes)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_resize_rounds_scales_and_refuses() {
        let p = QwenImageProcessor { patch_size: 4, min_pixels: 256, max_pixels: 1920, ..Default::default() };
        assert_eq!(p.target_size(23, 37).unwrap(), (24, 40));
        assert_eq!(p.target_size(50, 16).unwrap(), (48, 16));
        // 12 / 8 = 1.5 rounds to 2 (ties to even), 20 / 8 = 2.5 to 2.
        assert_eq!(p.target_size(12, 20).unwrap(), (16, 16));
        let (h, w) = p.target_size(101, 67).unwrap();
        assert!(h * w <= 1920 && h % 8 == 0 && w % 8 == 0);
        let (h, w) = p.target_size(9, 13).unwrap();
        assert!(h * w >= 256);
        assert!(p.target_size(1, 300).is_err());
        let cfg = serde_json::json!({"patch_size": 4, "min_pixels": 2000, "max_pixels": 1000});
        assert!(QwenImageProcessor::from_config(&cfg, 16).unwrap_err().to_string().contains("min_pixels"));
        let sized = serde_json::json!({"size": {"shortest_edge": 65536, "longest_edge": 16777216}});
        let p = QwenImageProcessor::from_config(&sized, 14).unwrap();
        assert_eq!((p.patch_size, p.min_pixels, p.max_pixels), (14, 65536, 16777216));
    }
}
