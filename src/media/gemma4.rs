//! Gemma 4's image preprocessing (mlx-vlm 0.7.10 `models/gemma4/processing_gemma4.py`,
//! `Gemma4ImageProcessor`, which follows transformers'): the image keeps its aspect ratio and is
//! resized to the largest size whose sides are multiples of `pooling_kernel_size · patch_size`
//! and whose patches fit the budget `max_soft_tokens · pooling_kernel_size²`, with PIL's BICUBIC
//! filter on the 8-bit image (no resize when the size already fits; mlx-vlm uses BICUBIC whatever
//! the config's `resample` says), then rescaled by 1/255. Normalisation is off by default (the
//! tower maps [0, 1] to [−1, 1] itself; with `do_normalize`, `(x − mean) / std` in float32). No
//! padding: the image's soft-token count is `(H/p)·(W/p)/k²`, which varies with its aspect ratio.
use super::image::{decode_image, resize_with, PixelValues, RgbImage, BICUBIC};
use super::processor_config::ProcessorConfig;
use crate::error::{Error, Result};

/// The soft-token budgets the Gemma 4 checkpoints are trained with (any positive one is accepted).
pub const GEMMA4_SOFT_TOKEN_BUDGETS: [usize; 5] = [70, 140, 280, 560, 1120];

/// Gemma 4's image processor, as the checkpoints' `processor_config.json` configures it.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma4ImageProcessor {
    pub patch_size: usize,
    pub max_soft_tokens: usize,
    pub pooling_kernel_size: usize,
    pub rescale_factor: f64,
    /// `(mean, std)` per channel when `do_normalize` is on.
    pub normalize: Option<([f32; 3], [f32; 3])>,
}

impl Default for Gemma4ImageProcessor {
    /// The gemma-4 checkpoints': 16-pixel patches, 280 soft tokens, 3 × 3 pooling, 1/255.
    fn default() -> Self {
        Gemma4ImageProcessor {
            patch_size: 16,
            max_soft_tokens: 280,
            pooling_kernel_size: 3,
            rescale_factor: 1.0 / 255.0,
            normalize: None,
        }
    }
}

fn invalid(what: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(what.to_string())
}

impl Gemma4ImageProcessor {
    /// From a checkpoint's processor config (parsed `processor_config.json`, whose image settings
    /// sit under `image_processor`, or a flat `preprocessor_config.json`); absent or null keys
    /// keep the defaults. Settings not reproduced (resize or rescale off) are InvalidArgument
    /// rather than silently different.
    pub fn from_config(cfg: &serde_json::Value) -> Result<Self> {
        let c = ProcessorConfig::new(cfg);
        let mut p = Gemma4ImageProcessor::default();
        if let Some(n) = c.size("patch_size", 1024)? {
            p.patch_size = n;
        }
        if let Some(n) = c.size("max_soft_tokens", 1 << 16)? {
            p.max_soft_tokens = n;
        }
        if let Some(n) = c.size("pooling_kernel_size", 64)? {
            p.pooling_kernel_size = n;
        }
        if let Some(f) = c.rescale_factor()? {
            p.rescale_factor = f;
        }
        c.require_on(&["do_resize", "do_rescale", "do_convert_rgb"])?;
        // The processor's defaults: normalisation off, mean and std 0.5 when on.
        p.normalize = c.normalize(false)?;
        Ok(p)
    }

    /// The size (height, width) an image of `height × width` is resized to: processing_gemma4's
    /// `get_aspect_ratio_preserving_size`, in the same float64 arithmetic.
    pub fn target_size(&self, height: u32, width: u32) -> Result<(u32, u32)> {
        let (k, p) = (self.pooling_kernel_size, self.patch_size);
        let max_patches = self.max_soft_tokens * k * k;
        let target_px = (max_patches * p * p) as f64;
        let (h, w) = (height as f64, width as f64);
        let factor = (target_px / (h * w)).sqrt();
        let side = (k * p) as f64;
        let mut th = (factor * h / side).floor() * side;
        let mut tw = (factor * w / side).floor() * side;
        if th == 0.0 && tw == 0.0 {
            return Err(invalid(format!("a {width}x{height} image cannot be resized for Gemma 4 (0 x 0 target)")));
        }
        let max_side = ((max_patches / (k * k)) * k * p) as f64;
        if th == 0.0 {
            th = side;
            tw = ((w / h).floor() * side).min(max_side);
        } else if tw == 0.0 {
            tw = side;
            th = ((h / w).floor() * side).min(max_side);
        }
        Ok((th as u32, tw as u32))
    }

    /// The soft tokens an image of `height × width` pixels (after resizing) becomes.
    pub fn soft_tokens(&self, height: u32, width: u32) -> usize {
        let p = self.patch_size as u32;
        ((height / p) * (width / p)) as usize / (self.pooling_kernel_size * self.pooling_kernel_size)
    }

    /// The resized 8-bit image (what the float output is an exact function of).
    pub fn resized(&self, img: &RgbImage) -> Result<RgbImage> {
        let (th, tw) = self.target_size(img.height, img.width)?;
        if (th, tw) == (img.height, img.width) {
            return Ok(img.clone());
        }
        resize_with(img, tw, th, BICUBIC)
    }

    /// [`decode_image`] then [`Self::preprocess`].
    pub fn preprocess_bytes(&self, bytes: &[u8]) -> Result<PixelValues> {
        self.preprocess(&decode_image(bytes)?)
    }

    /// The pixel values `[1, 3, H, W]` in [0, 1], as the processor's `pixel_values` for this image.
    pub fn preprocess(&self, img: &RgbImage) -> Result<PixelValues> {
        let r = self.resized(img)?;
        let (h, w) = (r.height as usize, r.width as usize);
        let plane = h * w;
        // numpy: uint8 → float32, × rescale_factor (a Python float: the product is taken in float32).
        let factor = self.rescale_factor as f32;
        let lut: Vec<[f32; 3]> = (0..256u32)
            .map(|v| {
                let x = v as f32 * factor;
                match self.normalize {
                    None => [x; 3],
                    Some((mean, std)) => std::array::from_fn(|c| (x - mean[c]) / std[c]),
                }
            })
            .collect();
        let mut data = vec![0f32; 3 * plane];
        let (red, rest) = data.split_at_mut(plane);
        let (green, blue) = rest.split_at_mut(plane);
        for (((px, rd), gd), bd) in r.data.chunks_exact(3).zip(red).zip(green).zip(blue) {
            (*rd, *gd, *bd) = (lut[px[0] as usize][0], lut[px[1] as usize][1], lut[px[2] as usize][2]);
        }
        Ok(PixelValues { data, shape: [1, 3, h, w], num_crops: 0 })
    }
}

/// Gemma 4's video preprocessing (mlx-vlm 0.7.10 `Gemma4VideoProcessor`) for a video given as
/// decoded frames: more than `num_frames` frames are sampled down uniformly (numpy's
/// `linspace(0, T − 1, num_frames).round()`, ties to even); each frame is resized and rescaled as
/// an image is ([`Gemma4ImageProcessor`], with the video's own budget: 70 soft tokens by default);
/// frame `j` is stamped `j / fps` seconds (`mm:ss`), with mlx-vlm's 2 frames a second for frames
/// it did not decode itself. The processor pads each frame's patches to the budget; the padding
/// is masked out of the tower's attention and pooling, so a frame's rows are its image rows at
/// the video budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma4VideoProcessor {
    /// A frame's preprocessing.
    pub frame: Gemma4ImageProcessor,
    /// The most frames kept.
    pub num_frames: usize,
    /// Frames per second, for the timestamps.
    pub fps: f64,
}

impl Default for Gemma4VideoProcessor {
    fn default() -> Self {
        Gemma4VideoProcessor {
            frame: Gemma4ImageProcessor { max_soft_tokens: 70, ..Gemma4ImageProcessor::default() },
            num_frames: 32,
            fps: 2.0,
        }
    }
}

impl Gemma4VideoProcessor {
    /// From a checkpoint's processor config: its `video_processor` object (absent: the defaults;
    /// mlx-vlm reads nothing of `image_processor` for videos). `max_soft_tokens` must be one of
    /// [`GEMMA4_SOFT_TOKEN_BUDGETS`], as mlx-vlm requires.
    pub fn from_config(cfg: &serde_json::Value) -> Result<Self> {
        let mut vp = match cfg.get("video_processor") {
            Some(serde_json::Value::Object(o)) => o.clone(),
            _ => serde_json::Map::new(),
        };
        let mut p = Gemma4VideoProcessor::default();
        if let Some(v) = vp.get("num_frames").filter(|v| !v.is_null()) {
            p.num_frames = v
                .as_u64()
                .filter(|&n| n > 0 && n <= 4096)
                .ok_or_else(|| invalid(format!("processor config: unsupported video_processor num_frames {v}")))?
                as usize;
        }
        for (k, v) in [
            ("patch_size", serde_json::json!(16)),
            ("max_soft_tokens", serde_json::json!(70)),
            ("pooling_kernel_size", serde_json::json!(3)),
            ("image_mean", serde_json::json!([0.0, 0.0, 0.0])),
            ("image_std", serde_json::json!([1.0, 1.0, 1.0])),
        ] {
            if vp.get(k).is_none_or(serde_json::Value::is_null) {
                vp.insert(k.into(), v);
            }
        }
        for k in ["num_frames", "default_fps", "video_processor_type", "size", "resample"] {
            vp.remove(k);
        }
        p.frame = Gemma4ImageProcessor::from_config(&serde_json::json!({ "image_processor": vp }))
            .map_err(|e| invalid(e.to_string().replace("processor config: ", "processor config: video_processor ")))?;
        if !GEMMA4_SOFT_TOKEN_BUDGETS.contains(&p.frame.max_soft_tokens) {
            return Err(invalid(format!(
                "processor config: video_processor max_soft_tokens {} is not one of {GEMMA4_SOFT_TOKEN_BUDGETS:?}",
                p.frame.max_soft_tokens
            )));
        }
        Ok(p)
    }

    /// Which of `n` frames are kept (indices, in order). A decoded video (an animated image) is
    /// sampled the same way: mlx-vlm's `linspace(0, n − 1, num_frames).round()` (transformers'
    /// default sampler takes `arange(num_frames) · n // num_frames` instead, and refuses videos
    /// shorter than `num_frames`; mlex keeps mlx-vlm's, so a video and its frames list agree).
    pub fn sample(&self, n: usize) -> Vec<usize> {
        if n <= self.num_frames {
            return (0..n).collect();
        }
        super::qwen_video::linspace_round(n, self.num_frames)
    }

    /// The timestamp written before kept frame `j` of a frames list: `mm:ss` of `j / fps`
    /// seconds (mlx-vlm's timing of frames it did not decode).
    pub fn timestamp(&self, j: usize) -> String {
        Self::timestamp_at(j as f64 / self.fps)
    }

    /// The timestamp written before a frame shown at `secs` seconds (a decoded video's frames:
    /// their real start, as transformers' `Gemma4Processor` writes `metadata.timestamps`):
    /// `mm:ss`, each floored.
    pub fn timestamp_at(secs: f64) -> String {
        let (mm, ss) = ((secs / 60.0).floor() as u64, (secs % 60.0).floor() as u64);
        format!("{mm:02}:{ss:02}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_sizes() {
        let p = Gemma4ImageProcessor::default();
        // A square image at the default budget: 280 tokens → 15 × 15 kernels… floored to 48-multiples.
        let (h, w) = p.target_size(1000, 1000).unwrap();
        assert_eq!((h % 48, w % 48), (0, 0));
        assert!(p.soft_tokens(h, w) <= 280);
        // Very narrow: one side takes one kernel, the other is capped.
        let q = Gemma4ImageProcessor { max_soft_tokens: 20, ..p.clone() };
        assert_eq!(q.target_size(333, 9).unwrap(), (960, 48));
        let cfg = serde_json::json!({"image_processor": {"max_soft_tokens": 70, "do_normalize": false}});
        assert_eq!(Gemma4ImageProcessor::from_config(&cfg).unwrap().max_soft_tokens, 70);
        // Degenerate shapes stay within the budget, on kernel multiples, with no side of 0.
        for (h, w) in [(1, 1), (1, 65_535), (65_535, 1), (8192, 8192), (3, 5000), (47, 48)] {
            let (th, tw) = p.target_size(h, w).unwrap();
            assert!(th > 0 && tw > 0 && th % 48 == 0 && tw % 48 == 0, "{h}x{w} -> {th}x{tw}");
            assert!(p.soft_tokens(th, tw) <= 280 && p.soft_tokens(th, tw) > 0, "{h}x{w} -> {th}x{tw}");
        }
        let norm = serde_json::json!({"do_normalize": true, "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0]});
        assert_eq!(Gemma4ImageProcessor::from_config(&norm).unwrap().normalize, Some(([0.0; 3], [1.0; 3])));
        let bad = serde_json::json!({"do_rescale": false});
        assert!(Gemma4ImageProcessor::from_config(&bad).is_err());
    }

    #[test]
    fn video_sampling_and_timestamps() {
        let v = Gemma4VideoProcessor::default();
        assert_eq!(v.sample(3), vec![0, 1, 2]);
        // numpy: np.linspace(0, 99, 32).round() (ties to even).
        let want = [0, 3, 6, 10, 13, 16, 19, 22, 26, 29, 32, 35, 38, 42, 45, 48, 51, 54, 57, 61, 64, 67, 70, 73, 77, 80,
            83, 86, 89, 93, 96, 99];
        assert_eq!(v.sample(100), want.to_vec());
        let w = Gemma4VideoProcessor { num_frames: 4, ..v.clone() };
        // linspace(0, 9, 4) = 0, 3, 6, 9; linspace(0, 6, 5) = 0, 1.5, 3, 4.5, 6 → 0, 2, 3, 4, 6.
        assert_eq!(w.sample(10), vec![0, 3, 6, 9]);
        assert_eq!(Gemma4VideoProcessor { num_frames: 5, ..v.clone() }.sample(7), vec![0, 2, 3, 4, 6]);
        assert_eq!((v.timestamp(0), v.timestamp(1), v.timestamp(2), v.timestamp(121)), ("00:00".into(), "00:00".into(), "00:01".into(), "01:00".into()));
        let cfg = serde_json::json!({"video_processor": {"patch_size": 4, "max_soft_tokens": 70, "pooling_kernel_size": 2, "num_frames": 8}});
        let p = Gemma4VideoProcessor::from_config(&cfg).unwrap();
        assert_eq!((p.frame.patch_size, p.frame.max_soft_tokens, p.frame.pooling_kernel_size, p.num_frames), (4, 70, 2, 8));
        assert_eq!(Gemma4VideoProcessor::from_config(&serde_json::json!({})).unwrap(), v);
        // The shape the Gemma 4 checkpoints' processor_config.json gives it (normalisation on,
        // by 0 and 1: the same values).
        let real = serde_json::json!({"video_processor": {"do_convert_rgb": true, "do_normalize": true, "do_rescale": true,
            "do_resize": true, "do_sample_frames": true, "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0],
            "max_soft_tokens": 70, "num_frames": 32, "patch_size": 16, "pooling_kernel_size": 3, "resample": 3,
            "rescale_factor": 0.00392156862745098, "return_metadata": false, "video_processor_type": "Gemma4VideoProcessor"}});
        let r = Gemma4VideoProcessor::from_config(&real).unwrap();
        assert_eq!((r.num_frames, r.frame.max_soft_tokens, r.frame.normalize), (32, 70, Some(([0.0; 3], [1.0; 3]))));
        let err = Gemma4VideoProcessor::from_config(&serde_json::json!({"video_processor": {"max_soft_tokens": 20}})).unwrap_err();
        assert!(err.to_string().contains("max_soft_tokens 20"), "{err}");
    }
}
