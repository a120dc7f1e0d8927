//! Qwen's video preprocessing (Qwen3-VL / Qwen3.5 and Qwen2.5-VL) for a video given as its
//! frames, as mlx-vlm 0.7.10's numpy `Qwen3VLVideoProcessor` (`models/qwen3_vl/
//! processing_qwen3_vl.py`, the video processor of its Qwen3-VL and Qwen2.5-VL processors, a port
//! of transformers' Qwen2-VL / Qwen3-VL video processors) computes it:
//! - every frame given is kept: mlx-vlm samples nothing from a frames list (its `fps`,
//!   `min_frames`, `max_frames` settings are read and left unused); mlex refuses more than
//!   `max_frames` frames rather than take a video the model was never meant to see whole;
//! - the frames must have one size (mlx-vlm stacks them into one array), each side at least
//!   `factor = patch · merge` pixels, the aspect ratio under 200;
//! - `smart_resize` over the whole video: each side rounded (ties to even) to a multiple of the
//!   factor; when the volume `⌈T / temporal⌉·temporal · h · w` exceeds `max_pixels`, both sides
//!   are scaled by `β = √(T·h·w / max_pixels)` and floored (at least one factor), when it falls
//!   below `min_pixels`, by `β = √(min_pixels / (T·h·w))` and ceiled (T: the frame count);
//! - each frame resized with PIL's BICUBIC (none when the size is kept), rescaled and normalised
//!   as an image is ([`QwenImageProcessor`]);
//! - the last frame repeated to fill the last temporal group; the patches cut per temporal group
//!   as an image's are, groups in order: `video_grid_thw` = (groups, rows, cols) in patches.
//!
//! Timestamps (the Qwen3-VL / Qwen3.5 prompt writes one per temporal group): a group sits at the
//! mean of its first and last frame's times, frame i at `i / fps` with the video processor's
//! `fps` (2 by default): a frames list carries no times of its own, and mlx-vlm times it so.
//!
//! Settings as mlx-vlm's `_qwen_vl_video_kwargs` reads them: `video_preprocessor_config.json`,
//! else `preprocessor_config.json` (older checkpoints keep both processors' settings there);
//! `size.shortest_edge` / `longest_edge` are `min_pixels` / `max_pixels` unless those keys are
//! given, defaults 128·32·32 and 32·32·768 (the video processor's own, not the image's).
use super::image::{resize_with, RgbImage, BICUBIC};
use super::processor_config::ProcessorConfig;
use super::qwen::{QwenImageProcessor, QwenPixels};
use crate::error::{Error, Result};

/// Qwen's video processor settings.
#[derive(Debug, Clone, PartialEq)]
pub struct QwenVideoProcessor {
    /// Patching, pixel budget (`min_pixels` / `max_pixels` of the whole video), rescale, normalise.
    pub frame: QwenImageProcessor,
    /// Frames per second assumed for a frames list (timestamps).
    pub fps: f64,
    /// The most frames a video may have (a decoded video: the most sampled).
    pub max_frames: usize,
    /// The fewest frames sampled from a decoded video (fewer when it has fewer).
    pub min_frames: usize,
}

impl Default for QwenVideoProcessor {
    /// mlx-vlm's `Qwen3VLVideoProcessor` defaults.
    fn default() -> Self {
        QwenVideoProcessor {
            frame: QwenImageProcessor { min_pixels: 128 * 32 * 32, max_pixels: 32 * 32 * 768, ..Default::default() },
            fps: 2.0,
            max_frames: 768,
            min_frames: 4,
        }
    }
}

fn invalid(what: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(what.to_string())
}

impl QwenVideoProcessor {
    /// From a parsed video processor config (absent or null keys keep the defaults, the patch
    /// size `default_patch`).
    pub fn from_config(cfg: &serde_json::Value, default_patch: usize) -> Result<Self> {
        let d = QwenVideoProcessor::default();
        let base = QwenImageProcessor { patch_size: default_patch, ..d.frame };
        let frame = QwenImageProcessor::from_config_over(cfg, base)?;
        let c = ProcessorConfig::new(cfg);
        let fps = match c.get("fps") {
            None => d.fps,
            Some(v) => v.as_f64().filter(|f| f.is_finite() && *f > 0.0).ok_or_else(|| ProcessorConfig::bad("fps", v))?,
        };
        let max_frames = c.size("max_frames", 1 << 20)?.unwrap_or(d.max_frames);
        let min_frames = c.size("min_frames", 1 << 20)?.unwrap_or(d.min_frames);
        Ok(QwenVideoProcessor { frame, fps, max_frames, min_frames })
    }

    /// The temporal groups a video of `frames` frames becomes.
    pub fn groups(&self, frames: usize) -> usize {
        frames.div_ceil(self.frame.temporal_patch_size)
    }

    /// The (height, width) every frame of a video of `frames` frames of `height × width` is
    /// resized to.
    pub fn target_size(&self, frames: usize, height: u32, width: u32) -> Result<(u32, u32)> {
        let f = self.frame.patch_size * self.frame.merge_size;
        if (height as usize) < f || (width as usize) < f {
            return Err(invalid(format!("its {width}x{height} frames are too small: each side must be at least {f} pixels")));
        }
        let (h, w, n) = (height as f64, width as f64, frames as f64);
        if h.max(w) / h.min(w) > 200.0 {
            return Err(invalid(format!("its {width}x{height} frames: the aspect ratio must be smaller than 200")));
        }
        let f = f as f64;
        let mut hb = (h / f).round_ties_even() * f;
        let mut wb = (w / f).round_ties_even() * f;
        let tb = (self.groups(frames) * self.frame.temporal_patch_size) as f64;
        if tb * hb * wb > self.frame.max_pixels as f64 {
            let beta = ((n * h * w) / self.frame.max_pixels as f64).sqrt();
            hb = f.max((h / beta / f).floor() * f);
            wb = f.max((w / beta / f).floor() * f);
        } else if tb * hb * wb < self.frame.min_pixels as f64 {
            let beta = (self.frame.min_pixels as f64 / (n * h * w)).sqrt();
            hb = (h * beta / f).ceil() * f;
            wb = (w * beta / f).ceil() * f;
        }
        if hb * wb > super::MAX_IMAGE_PIXELS as f64 {
            return Err(invalid(format!("its {width}x{height} frames resize to {wb}x{hb}, which is out of range")));
        }
        Ok((hb as u32, wb as u32))
    }

    /// The patches of a video's frames: `[groups · rows · cols, 3 · T · p · p]`, grid (groups,
    /// rows, cols) in patches.
    pub fn preprocess(&self, frames: &[RgbImage]) -> Result<QwenPixels> {
        let Some(first) = frames.first() else { return Err(invalid("a video needs at least one frame")) };
        if frames.len() > self.max_frames {
            return Err(invalid(format!("it has {} frames, more than the {} this model's video processor takes", frames.len(), self.max_frames)));
        }
        if let Some((i, f)) = frames.iter().enumerate().find(|(_, f)| (f.width, f.height) != (first.width, first.height)) {
            return Err(invalid(format!(
                "its frames differ in size (frame 0 is {}x{}, frame {i} {}x{}): a video's frames must all have one size",
                first.width, first.height, f.width, f.height
            )));
        }
        let (th, tw) = self.target_size(frames.len(), first.height, first.width)?;
        let resized: Vec<RgbImage> = if (th, tw) == (first.height, first.width) {
            frames.to_vec()
        } else {
            frames.iter().map(|f| resize_with(f, tw, th, BICUBIC)).collect::<Result<_>>()?
        };
        let t = self.frame.temporal_patch_size;
        let mut refs: Vec<&RgbImage> = resized.iter().collect();
        let last = *refs.last().expect("not empty");
        refs.resize(self.groups(frames.len()) * t, last);
        Ok(self.frame.patches(&refs))
    }

    /// The time (seconds) of each temporal group of a video of `frames` frames: the mean of its
    /// first and last frame's (the repeated last frame counted at its own index, as mlx-vlm
    /// times the padded frames).
    pub fn timestamps(&self, frames: usize) -> Vec<f64> {
        let t = self.frame.temporal_patch_size;
        (0..self.groups(frames)).map(|g| ((g * t) as f64 / self.fps + ((g + 1) * t - 1) as f64 / self.fps) / 2.0).collect()
    }

    /// Which frames of a decoded video (one whose frames carry times: an animated image) are
    /// kept, as transformers' `Qwen3VLVideoProcessor.sample_frames` samples a decoded video with
    /// metadata: `n = ⌊duration · fps⌋` (transformers: `int(total_frames / video_fps · fps)`, the
    /// same for a constant frame rate), clamped to `[min_frames, max_frames]` and to the frame
    /// count, then `linspace(0, T − 1, n)` rounded (ties to even). mlx-vlm samples nothing itself.
    pub fn sample_timed(&self, frames: usize, duration: f64) -> Vec<usize> {
        let n = (duration * self.fps).floor().max(0.0) as usize;
        let n = n.max(self.min_frames).min(self.max_frames).min(frames).max(1);
        linspace_round(frames, n)
    }

    /// The time (seconds) of each temporal group of a decoded video whose kept frames start at
    /// `starts`: the mean of its first and last frame's, the last frame repeated to fill the last
    /// group (transformers' and mlx-vlm's Qwen3-VL `_calculate_timestamps` with metadata, a
    /// frame's time its real start rather than `index / video_fps`).
    pub fn timestamps_at(&self, starts: &[f64]) -> Vec<f64> {
        let t = self.frame.temporal_patch_size;
        let Some(&last) = starts.last() else { return vec![] };
        let mut times = starts.to_vec();
        times.resize(self.groups(starts.len()) * t, last);
        times.chunks(t).map(|g| (g[0] + g[t - 1]) / 2.0).collect()
    }

    /// The text before a temporal group's vision block: `<s.s seconds>` (one decimal, rounded
    /// as Python's format rounds: the exact binary value, ties to even).
    pub fn timestamp_text(seconds: f64) -> String {
        format!("<{seconds:.1} seconds>")
    }
}

/// numpy's `linspace(0, frames − 1, n).round()` (ties to even): `n` indices of `frames`.
pub fn linspace_round(frames: usize, n: usize) -> Vec<usize> {
    if n == 0 || frames == 0 {
        return vec![];
    }
    if n == 1 {
        return vec![0];
    }
    let stop = (frames - 1) as f64;
    let step = stop / (n - 1) as f64;
    (0..n).map(|j| if j == n - 1 { stop } else { j as f64 * step }).map(|y| y.round_ties_even() as usize).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn video() -> QwenVideoProcessor {
        QwenVideoProcessor {
            frame: QwenImageProcessor { patch_size: 4, min_pixels: 512, max_pixels: 4096, ..Default::default() },
            ..Default::default()
        }
    }

    #[test]
    fn smart_resize_over_the_video() {
        let v = video();
        // 3 frames 45x29: 32 x 48 over 4 padded frames is 6144 > 4096: β = √(3·29·45 / 4096).
        assert_eq!(v.target_size(3, 29, 45).unwrap(), (24, 40));
        // Kept: 2 frames of 24 x 40 = 1920 pixels, within [512, 4096].
        assert_eq!(v.target_size(2, 24, 40).unwrap(), (24, 40));
        // Upscaled: one frame of 8 x 8 (padded to 2: 128 < 512): β = √(512 / 64), ceiled.
        assert_eq!(v.target_size(1, 8, 8).unwrap(), (24, 24));
        assert!(v.target_size(2, 7, 40).unwrap_err().to_string().contains("too small"));
        assert!(v.target_size(2, 8, 1700).unwrap_err().to_string().contains("aspect ratio"));
    }

    #[test]
    fn patches_pair_frames_and_pad_the_last_group() {
        let v = video();
        let frame = |k: u8| RgbImage::from_raw(40, 24, vec![k; 40 * 24 * 3]).unwrap();
        let px = v.preprocess(&[frame(0), frame(255), frame(51)]).unwrap();
        assert_eq!((px.grid, px.patches, px.patch_dim), ((2, 6, 10), 120, 96));
        // Patch 0 of group 0: channel 0, t 0 then t 1 (16 values each); group 1 repeats frame 2.
        assert!(px.data[0] == -1.0 && (px.data[16] - 1.0).abs() < 1e-6);
        let g1 = &px.data[60 * 96..61 * 96];
        assert!(g1.iter().all(|&x| (x - (51.0f32 / 255.0 - 0.5) / 0.5).abs() < 1e-6));
        let err = v.preprocess(&[frame(0), RgbImage::from_raw(40, 25, vec![0; 40 * 25 * 3]).unwrap()]).unwrap_err();
        assert!(err.to_string().contains("differ in size"), "{err}");
        let few = QwenVideoProcessor { max_frames: 2, ..v.clone() };
        assert!(few.preprocess(&[frame(0), frame(0), frame(0)]).unwrap_err().to_string().contains("3 frames"));
        assert!(v.preprocess(&[]).is_err());
    }

    #[test]
    fn timestamps_and_config() {
        let v = QwenVideoProcessor::default();
        assert_eq!(v.timestamps(5), vec![0.25, 1.25, 2.25]);
        let text: Vec<String> = v.timestamps(5).into_iter().map(QwenVideoProcessor::timestamp_text).collect();
        // Python: f"{0.25:.1f}" is "0.2" (an exact tie, to even).
        assert_eq!(text, ["<0.2 seconds>", "<1.2 seconds>", "<2.2 seconds>"]);
        assert_eq!(QwenVideoProcessor { fps: 4.0, ..v.clone() }.timestamps(4), vec![0.125, 0.625]);
        let cfg = serde_json::json!({"patch_size": 14, "size": {"shortest_edge": 4096, "longest_edge": 8192}, "fps": 1.0, "max_frames": 64});
        let p = QwenVideoProcessor::from_config(&cfg, 16).unwrap();
        assert_eq!((p.frame.patch_size, p.frame.min_pixels, p.frame.max_pixels, p.fps, p.max_frames), (14, 4096, 8192, 1.0, 64));
        let d = QwenVideoProcessor::from_config(&serde_json::json!({}), 14).unwrap();
        assert_eq!((d.frame.patch_size, d.frame.min_pixels, d.frame.max_pixels), (14, 131072, 786432));
        assert!(QwenVideoProcessor::from_config(&serde_json::json!({"fps": 0}), 16).is_err());
        assert_eq!(QwenVideoProcessor::from_config(&serde_json::json!({"min_frames": 2}), 16).unwrap().min_frames, 2);
    }

    #[test]
    fn decoded_video_sampling_and_timestamps() {
        let v = QwenVideoProcessor::default();
        // 10 frames over 5 s at 2 fps: all kept.
        assert_eq!(v.sample_timed(10, 5.0), (0..10).collect::<Vec<_>>());
        // 100 frames over 10 s: 20 frames, np.linspace(0, 99, 20).round().
        let want = [0, 5, 10, 16, 21, 26, 31, 36, 42, 47, 52, 57, 63, 68, 73, 78, 83, 89, 94, 99];
        assert_eq!(v.sample_timed(100, 10.0), want.to_vec());
        // Short: min_frames (4), but never more than the video has.
        assert_eq!(v.sample_timed(30, 0.5), vec![0, 10, 19, 29]);
        assert_eq!(v.sample_timed(3, 0.3), vec![0, 1, 2]);
        assert_eq!(v.sample_timed(1, 0.0), vec![0]);
        // Long: max_frames.
        let few = QwenVideoProcessor { max_frames: 5, ..v.clone() };
        assert_eq!(few.sample_timed(1000, 100.0), vec![0, 250, 500, 749, 999]);
        // Group times: the mean of first and last, the last repeated.
        assert_eq!(v.timestamps_at(&[0.0, 0.1, 0.5, 0.9, 2.0]), vec![0.05, 0.7, 2.0]);
        // A steady 2 fps video is timed as a frames list is, but for a padded last group: the
        // repeated frame is the last frame (its time), where mlx-vlm times a frames list's
        // padding at its own index.
        let starts: Vec<f64> = (0..5).map(|i| i as f64 * 0.5).collect();
        assert_eq!(v.timestamps_at(&starts[..4]), v.timestamps(4));
        assert_eq!((v.timestamps_at(&starts), v.timestamps(5)), (vec![0.25, 1.25, 2.0], vec![0.25, 1.25, 2.25]));
    }
}
