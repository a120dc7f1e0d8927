//! Videos a model encodes whole (Qwen3.5, Qwen3-VL and Qwen2.5-VL, given as frames): the frames go
//! through the model's video processor together (their count sets the resize, consecutive frames
//! pair into temporal groups) and the tower, so the video is kept as one entry, keyed on all of
//! its frames' bytes, with its merged grid for the 3-D rope ([`MediaGrid`]).
//!
//! How the prompt writes it, as mlx-vlm 0.7.10's processors do for a frames list:
//! - Qwen3.5 and Qwen3-VL (`Qwen3VLProcessor`): the template's `<|vision_start|><|video_pad|><|vision_end|>`
//!   becomes, per temporal group, `<t.t seconds>` and that block, its one video token standing
//!   for the group's rows; each group sits on the rope as an image would;
//! - Qwen2.5-VL (`Qwen2_5_VLProcessor`): the template's `<|video_pad|>` stands for all rows, one
//!   block on the rope whose temporal axis steps one per group.
use super::{media_kind, ImageData, Kept, VisionLm, MEDIA_TOKEN_BASE};
use crate::chat::Media;
use crate::error::{Error, Result};
use crate::media::{decode_image, QwenVideoProcessor};
use crate::models::mrope::MediaGrid;

/// How the prompt writes a video encoded whole.
#[derive(Debug, Clone, PartialEq)]
pub struct WholeVideoPrompt {
    /// The video token's text (`<|video_pad|>`).
    pub video_token_text: String,
    /// Qwen3.5: what opens and closes each temporal group's block (`<|vision_start|>`,
    /// `<|vision_end|>`), each group after its timestamp; None (Qwen2.5-VL): the video token
    /// alone, for the whole video.
    pub groups: Option<(String, String)>,
    /// The frames' preprocessing and timestamps.
    pub processor: QwenVideoProcessor,
}

impl WholeVideoPrompt {
    /// Which of a video's frames the processor keeps: a frames list, all of them (mlx-vlm
    /// samples none); a decoded video (its frames timed), sampled at the processor's fps over
    /// its real duration ([`QwenVideoProcessor::sample_timed`]).
    pub fn kept(&self, frames: &[ImageData]) -> Vec<usize> {
        match crate::chat::media::video_times(frames) {
            Some((_, duration)) => self.processor.sample_timed(frames.len(), duration),
            None => (0..frames.len()).collect(),
        }
    }

    /// The temporal groups' times (seconds) of a video's kept frames.
    fn group_times(&self, frames: &[ImageData]) -> Vec<f64> {
        let kept = self.kept(frames);
        match crate::chat::media::video_times(frames) {
            Some((starts, _)) => self.processor.timestamps_at(&kept.iter().map(|&k| starts[k]).collect::<Vec<_>>()),
            None => self.processor.timestamps(kept.len()),
        }
    }

    /// What the processor writes for a video of `frames` (before sampling).
    pub fn expansion(&self, frames: &[ImageData]) -> String {
        match &self.groups {
            None => self.video_token_text.clone(),
            Some((start, end)) => self
                .group_times(frames)
                .into_iter()
                .map(|s| format!("{}{start}{}{end}", QwenVideoProcessor::timestamp_text(s), self.video_token_text))
                .collect(),
        }
    }

    /// How many video tokens [`Self::expansion`] writes for `frames` frames.
    fn expansion_units(&self, frames: usize) -> usize {
        match self.groups {
            None => 1,
            Some(_) => self.processor.groups(frames),
        }
    }
}

/// A key for a video's frames (their hashes folded), for counting distinct media.
pub(super) fn key(frames: &[ImageData]) -> u64 {
    frames.iter().fold(0x9e37_79b9_7f4a_7c15u64, |h, f| (h ^ f.hash).rotate_left(17).wrapping_mul(0x0000_0100_0000_01b3))
}

/// The video being placed: its media part (1-based), its ids, how many each of its prompt's
/// video tokens takes, and how many of those tokens are placed.
#[derive(Debug, Default)]
pub(super) struct Binding {
    part: usize,
    first: u32,
    per_unit: u32,
    units: u32,
    done: u32,
}

impl Binding {
    /// Whether a video has video tokens still to place.
    pub(super) fn open(&self) -> bool {
        self.done < self.units
    }

    /// The media part (1-based) of the video placed last.
    pub(super) fn part(&self) -> usize {
        self.part
    }
}

fn naming(part: usize) -> impl Fn(Error) -> Error {
    move |e| match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("the video (media part {part} of the conversation): {m}")),
        other => other,
    }
}

impl VisionLm {
    /// The ids of the prompt's next video token: the next media part's video (encoded whole
    /// unless kept) when `b` has placed all of the last one's, then its next unit's rows.
    pub(super) fn bind_whole_video_unit<'m, 'd: 'm>(
        &self,
        w: &WholeVideoPrompt,
        b: &mut Binding,
        next: &mut impl Iterator<Item = (usize, &'m Media<'d>)>,
    ) -> Result<Vec<u32>> {
        if !b.open() {
            let (n, part) = next
                .next()
                .ok_or_else(|| Error::InvalidArgument("the prompt has more video places than the messages have videos".into()))?;
            let n = n + 1;
            let Media::Video(frames) = part else {
                return Err(Error::InvalidArgument(format!(
                    "media part {n} of the conversation is {}, and the prompt has a video's place there",
                    media_kind(part)
                )));
            };
            let timed = crate::chat::media::video_times(frames).is_some();
            let frames: Vec<ImageData> = w.kept(frames).into_iter().map(|k| frames[k].clone()).collect();
            let frames = &frames[..];
            if !timed && frames.len() > w.processor.max_frames {
                return Err(naming(n)(Error::InvalidArgument(format!(
                    "it has {} frames, more than the {} this model's video processor takes",
                    frames.len(),
                    w.processor.max_frames
                ))));
            }
            let (first, len, grid) = self.whole_video_ids(frames, w.groups.is_none()).map_err(naming(n))?;
            let units = if w.groups.is_some() { grid.t } else { 1 };
            if units != w.expansion_units(frames.len()) {
                return Err(Error::Mlx(format!("a video of {} frames became {units} temporal groups", frames.len())));
            }
            *b = Binding { part: n, first, per_unit: len / units as u32, units: units as u32, done: 0 };
        }
        let from = b.first + b.done * b.per_unit;
        b.done += 1;
        Ok((from..from + b.per_unit).map(|k| MEDIA_TOKEN_BASE + k).collect())
    }

    /// A video's ids (first offset, count) and grid, encoding it unless it is kept; `stacked`:
    /// its groups form one rope block.
    fn whole_video_ids(&self, frames: &[ImageData], stacked: bool) -> Result<(u32, u32, MediaGrid)> {
        let mut slots = self.slots.lock().map_err(|_| Error::Mlx("image slots poisoned by a panic".into()))?;
        if let Some(at) = slots.kept.iter().position(|k| k.frames.as_deref() == Some(frames)) {
            let k = slots.kept.remove(at).expect("found above");
            let grid = k.grid.ok_or_else(|| Error::Mlx("a kept video has no grid".into()))?;
            let ids = (k.first, k.len, grid);
            slots.kept.push_back(k);
            return Ok(ids);
        }
        let Some(first) = frames.first() else { return Err(Error::InvalidArgument("a video needs at least one frame".into())) };
        let decoded = frames
            .iter()
            .enumerate()
            .map(|(i, f)| {
                decode_image(&f.bytes).map_err(|e| match e {
                    Error::InvalidArgument(m) => Error::InvalidArgument(format!("frame {i}: {m}")),
                    other => other,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (rows, (t, h, w)) = self.encoder.encode_video(&decoded)?;
        let grid = MediaGrid { t, h, w, stacked };
        if grid.rows() != rows.shape()[0] as usize {
            return Err(Error::Mlx(format!("a video's grid {t}x{h}x{w} does not match its {} rows", rows.shape()[0])));
        }
        let size = (decoded[0].width, decoded[0].height);
        let mut entry = Kept::new(first, true, false, size, rows);
        (entry.frames, entry.grid) = (Some(frames.to_vec()), Some(grid));
        let (first, len, _) = self.keep(slots, entry)?;
        Ok((first, len, grid))
    }
}
