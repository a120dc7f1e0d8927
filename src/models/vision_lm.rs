//! A language model with a vision tower in front (issue 15): how image tokens reach a decoder
//! without the engine, the batcher or the prompt cache knowing about images.
//!
//! The chat prompt holds, for each image, a run of the model's image token (Gemma 3: 256
//! `<image_soft_token>`, as its processor expands them, and with pan and scan one more run per
//! crop, text between: `vision_lm/pan_and_scan.rs`; Gemma 4: one `<|image|>`, whose image
//! decides how many tokens it takes). [`CausalLm::bind_images`] encodes each image (decode, the
//! model's preprocessing, tower, projector: an [`ImageEncoder`]) and replaces its run with ids of
//! its own, one per row the image became: `MEDIA_TOKEN_BASE + first + i`, where the range
//! `first..first + rows` is given to an image's content (its bytes, compared whole: a hash alone
//! could be made to collide) and never reused. [`CausalLm::forward_prompt`] turns those ids into
//! the image's rows. So everything keyed on token ids keys on the image too: a second turn about
//! the same image reuses the first's cached prefix, and a different image never does.
//!
//! A video (given as frames: [`CausalLm::bind_media`]) is, for Gemma 4, its kept frames, each
//! bound as an image is but encoded as a frame (the video's own soft-token budget) and keyed apart
//! from the same bytes as an image; the chat template's video marker becomes each kept frame's
//! timestamp and a run of one video token ([`VideoPrompt`], [`VideoLayout::Frames`]). Qwen3.5 and
//! Qwen2.5-VL encode a video whole and keep it as one entry keyed on all of its frames: its
//! temporal groups each take a video token (Qwen3.5, after their timestamps) or one token takes
//! them all (Qwen2.5-VL): `vision_lm/whole_video.rs`.
//!
//! Qwen3.5, Qwen3-VL and Qwen2.5-VL (`qwen_vision.rs`, `qwen2_5_vision.rs`): the template's `<|image_pad|>`
//! is one token standing for the image's merged patches, and their text models place tokens on a
//! 3-D rope (`mrope.rs`): [`VisionLm::with_mrope`] (in `vision_lm/mrope_prompt.rs`) gives each
//! prompt chunk its positions from its ids and keeps each image's shift in a cache of its own.
//!
//! An audio clip (Gemma 4 checkpoints with an audio tower: [`VisionLm::with_audio`]) is bound
//! the same way: the prompt's one audio token per clip becomes as many ids as the clip takes
//! (its duration), keyed on the clip's bytes ([`super::audio_input`]).
//!
//! The last [`KEPT_IMAGES`] images (at most [`KEPT_BYTES`] of their bytes) are kept with their
//! features (an image's tokens are embedded while its prompt is prefilled, right after
//! `bind_images`). An image seen again after it was dropped gets new ids: a prompt-cache miss,
//! never another image's rows; an id whose features were dropped is an error.
use std::collections::VecDeque;
use std::sync::Mutex;

mod mrope_prompt;
mod whole_video;
mod pan_and_scan;

pub use crate::chat::ImageData;
pub use whole_video::WholeVideoPrompt;

use super::audio_input::{AudioInput, AudioPrompt};
use super::gemma3_vision::Gemma3Vision;
use super::gemma4_vision::Gemma4Vision;
use super::mrope::MediaGrid;
use super::CausalLm;
use crate::error::{Error, Result};
use crate::chat::Media;
use crate::media::{decode_image, Gemma3ImageProcessor, Gemma4ImageProcessor, Gemma4VideoProcessor, RgbImage};
use crate::mlx::{Array, Dtype};
use crate::nn::{LayerCaches, Params};

/// Prompt ids from here up stand for image tokens (far above any vocabulary).
pub const MEDIA_TOKEN_BASE: u32 = 0x8000_0000;

/// Images whose features stay in memory (a 4B Gemma 3's image is 256 × 2560 values).
pub const KEPT_IMAGES: usize = 64;

/// The most encoded image bytes kept with them (the newest image is kept whatever its size).
pub const KEPT_BYTES: usize = 256 << 20;

/// A vision config's sizes (`vision_config.<name>`) each between 1 and 2^20, or the first that
/// is not, named.
pub(crate) fn check_sizes(fields: &[(&str, usize)]) -> std::result::Result<(), String> {
    match fields.iter().find(|(_, v)| *v == 0 || *v > 1 << 20) {
        Some((name, _)) => Err(format!("vision_config.{name} must be between 1 and 2^20")),
        None => Ok(()),
    }
}

/// Whether a prompt id stands for an image token.
pub fn is_media_token(id: u32) -> bool {
    id >= MEDIA_TOKEN_BASE
}

/// How a model's prompt marks an image (what its processor writes for each image marker the
/// chat template renders).
#[derive(Debug, Clone, PartialEq)]
pub struct ImagePrompt {
    /// What the template writes per image (Gemma 3: `<start_of_image>`; Gemma 4: `<|image|>`).
    pub marker: String,
    /// What the processor writes in its place (Gemma 3: `\n\n<start_of_image>` + the image token
    /// 256 times + `<end_of_image>\n\n`; Gemma 4: `<|image>` + the image token once + `<image|>`,
    /// the one token standing for as many as the image turns out to take).
    pub expansion: String,
    /// The id of the image token, and how many of them the expansion writes per image.
    pub image_token: u32,
    pub placeholder_tokens: usize,
    /// How it marks a video (given as frames), for models that take them.
    pub video: Option<VideoPrompt>,
    /// Gemma 3's processor with pan and scan on (None when off, and for other models): an image
    /// it crops takes Gemma3Processor's sentence holding the expansion once for the whole image
    /// and once per crop (`vision_lm/pan_and_scan.rs`), each a run of `placeholder_tokens` rows.
    pub pan_and_scan: Option<Gemma3ImageProcessor>,
}

/// How a model's prompt marks a video given as frames: the template's marker becomes runs of one
/// video token (each standing for as many as its part of the video takes) with text around them.
#[derive(Debug, Clone, PartialEq)]
pub struct VideoPrompt {
    /// What the template writes per video (Gemma 4: `<|video|>`; Qwen3.5:
    /// `<|vision_start|><|video_pad|><|vision_end|>`; Qwen2.5-VL: `<|video_pad|>`).
    pub marker: String,
    /// The video token's id.
    pub video_token: u32,
    pub layout: VideoLayout,
}

/// How a video is cut into the prompt's video tokens, and encoded.
#[derive(Debug, Clone, PartialEq)]
pub enum VideoLayout {
    /// Gemma 4, as mlx-vlm's Gemma4Processor writes it: for each kept frame its timestamp
    /// `mm:ss`, a space, `boi`, the video token, `eoi`; frames joined with a space. Each frame is
    /// encoded alone, as an image is ([`ImageEncoder::encode_frame`]).
    Frames {
        /// The video token's text (`<|video|>`).
        video_token_text: String,
        /// What opens and closes each frame (the image's `<|image>` and `<image|>`).
        boi: String,
        eoi: String,
        /// Frame sampling and timestamps.
        processor: Gemma4VideoProcessor,
    },
    /// Qwen: the video encoded whole ([`ImageEncoder::encode_video`]; see `vision_lm/whole_video.rs`).
    Whole(WholeVideoPrompt),
}

impl VideoPrompt {
    /// What the processor writes for a video of `frames` (before sampling): a frames list's
    /// kept frames timed at the processor's fps, a decoded video's at their real times.
    pub fn expansion(&self, frames: &[ImageData]) -> String {
        match &self.layout {
            VideoLayout::Frames { video_token_text, boi, eoi, processor } => {
                let times = crate::chat::media::video_times(frames);
                processor
                    .sample(frames.len())
                    .into_iter()
                    .enumerate()
                    .map(|(j, k)| {
                        let stamp = match &times {
                            Some((starts, _)) => Gemma4VideoProcessor::timestamp_at(starts[k]),
                            None => processor.timestamp(j),
                        };
                        format!("{stamp} {boi}{video_token_text}{eoi}")
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            }
            VideoLayout::Whole(w) => w.expansion(frames),
        }
    }
}

/// How an encoder's rows join the text model's input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RowScale {
    /// The rows are in the token embeddings' scale: the prompt chunk goes through
    /// [`CausalLm::forward_embeddings`], which scales every row alike (Gemma 3).
    Embedding,
    /// The rows are at the decoder's input scale: text rows are the token embeddings times `scale`
    /// (in their dtype), and the chunk goes through [`CausalLm::forward_input_rows`] with `pad_id`
    /// in the image positions' ids (Gemma 4, whose per-layer inputs read ids).
    Input { scale: f32, pad_id: u32 },
}

/// A vision tower with its preprocessing and projector: a decoded image in, its rows out.
pub trait ImageEncoder: Params {
    /// The image's rows `[n, text hidden]` (n ≥ 1, the image's token count), as [`Self::row_scale`] says.
    fn encode(&self, image: &RgbImage) -> Result<Array>;

    /// A video frame's rows, as the model encodes frames (Gemma 4: a smaller budget).
    fn encode_frame(&self, _frame: &RgbImage) -> Result<Array> {
        Err(Error::InvalidArgument("this model takes no video".into()))
    }

    /// A whole video's rows (its decoded frames, in order) and their merged grid (temporal
    /// groups, rows, cols), for [`VideoLayout::Whole`] (Qwen).
    fn encode_video(&self, _frames: &[RgbImage]) -> Result<(Array, (usize, usize, usize))> {
        Err(Error::InvalidArgument("this model takes no video".into()))
    }

    fn row_scale(&self) -> RowScale;

    /// An image's merged patch grid (rows, cols) on the text model's 3-D rope, from its decoded
    /// size (width, height), for towers whose text model takes multimodal rope positions
    /// (Qwen: [`super::mrope`]); None for the others.
    fn mrope_grid(&self, _size: (u32, u32)) -> Option<(usize, usize)> {
        None
    }

    /// Deepstack (Qwen3-VL): how many features each of [`Self::encode`]'s rows carries after its
    /// own, side by side (the rows `(1 + this) · hidden` wide), for the text model to add to its
    /// hidden states at the image's positions ([`CausalLm::forward_embeddings_deepstack`]).
    fn deepstack_layers(&self) -> usize {
        0
    }
}

/// Gemma 3's SigLIP tower and projector with its processor (a fixed 256 tokens per image, and
/// as many again per pan-and-scan crop, whole image first; rows divided by √hidden: see
/// [`Gemma3Vision::merge_image_tokens`]).
pub struct Gemma3Images {
    pub vision: Gemma3Vision,
    pub processor: Gemma3ImageProcessor,
}

impl ImageEncoder for Gemma3Images {
    fn encode(&self, image: &RgbImage) -> Result<Array> {
        let pv = self.processor.preprocess(image)?;
        crate::startup_trace::mark("image preprocessed");
        let shape: Vec<i32> = pv.shape.iter().map(|&d| d as i32).collect();
        let pixels = Array::from_slice(&pv.data, &shape)?;
        let t = (pv.shape[0] * self.vision.tokens_per_image()) as i32;
        self.vision.merge_scale(&self.vision.encode(&pixels)?)?.reshape(&[t, -1])
    }

    fn row_scale(&self) -> RowScale {
        RowScale::Embedding
    }
}

impl Params for Gemma3Images {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        self.vision.params(out);
    }
}

/// Gemma 4's vision encoder and embedder with its processor (as many tokens as the image's
/// aspect ratio gives within the budget; rows at the decoder's input scale).
pub struct Gemma4Images {
    pub vision: Gemma4Vision,
    pub processor: Gemma4ImageProcessor,
    /// The video frames' preprocessing, when the checkpoint takes video.
    pub video: Option<Gemma4VideoProcessor>,
}

impl Gemma4Images {
    fn rows(&self, processor: &Gemma4ImageProcessor, image: &RgbImage) -> Result<Array> {
        let pv = processor.preprocess(image)?;
        crate::startup_trace::mark("image preprocessed");
        let shape: Vec<i32> = pv.shape.iter().map(|&d| d as i32).collect();
        let pixels = Array::from_slice(&pv.data, &shape)?;
        let n = self.vision.soft_tokens(pv.shape[2], pv.shape[3]);
        if n == 0 {
            return Err(Error::InvalidArgument(format!("the image becomes no tokens ({}x{} pixels after resizing)", pv.shape[3], pv.shape[2])));
        }
        self.vision.encode(&pixels)?.reshape(&[n as i32, -1])
    }
}

impl ImageEncoder for Gemma4Images {
    fn encode(&self, image: &RgbImage) -> Result<Array> {
        self.rows(&self.processor, image)
    }

    /// mlx-vlm's `_encode_video`: the frame at the video budget, through the same tower and
    /// embedder (its patches padded to the budget, the padding masked out: the same rows).
    fn encode_frame(&self, frame: &RgbImage) -> Result<Array> {
        match &self.video {
            Some(v) => self.rows(&v.frame, frame),
            None => Err(Error::InvalidArgument("this checkpoint takes no video".into())),
        }
    }

    fn row_scale(&self) -> RowScale {
        RowScale::Input { scale: (self.vision.text_hidden() as f64).sqrt() as f32, pad_id: 0 }
    }
}

impl Params for Gemma4Images {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        self.vision.params(out);
    }
}

/// What a media part is, for messages ("an image", "a video", "an audio clip").
fn media_kind(m: &Media) -> &'static str {
    match m {
        Media::Image(_) => "an image",
        Media::Video(_) => "a video",
        Media::Audio(_) => "an audio clip",
    }
}

/// An image kept: its ids' range (offsets from [`MEDIA_TOKEN_BASE`]), its bytes, its rows
/// `[len, hidden]`.
struct Kept {
    first: u32,
    len: u32,
    /// The image (a whole video: its first frame).
    image: ImageData,
    /// A video encoded whole: its frames, and where its rows sit on the 3-D rope.
    frames: Option<Vec<ImageData>>,
    grid: Option<MediaGrid>,
    /// Encoded as a video frame (another budget than as an image).
    frame: bool,
    /// The decoded size (width, height).
    size: (u32, u32),
    rows: Array,
    /// An audio clip (its bytes in `image`).
    audio: bool,
}

impl Kept {
    /// A new entry (its ids given by [`VisionLm::keep`]).
    fn new(image: &ImageData, frame: bool, audio: bool, size: (u32, u32), rows: Array) -> Self {
        Kept { first: 0, len: 0, image: image.clone(), frames: None, grid: None, frame, size, rows, audio }
    }

    /// The encoded bytes it holds.
    fn bytes(&self) -> usize {
        match &self.frames {
            Some(f) => f.iter().map(|i| i.bytes.len()).sum(),
            None => self.image.bytes.len(),
        }
    }
}

#[derive(Default)]
struct Slots {
    /// The next free id offset.
    next: u32,
    /// Least recently used first.
    kept: VecDeque<Kept>,
}

/// A text model with a vision tower in front.
pub struct VisionLm {
    text: Box<dyn CausalLm>,
    encoder: Box<dyn ImageEncoder>,
    prompt: ImagePrompt,
    slots: Mutex<Slots>,
    /// The text model takes 3-D rope positions (Qwen: see `vision_lm/mrope_prompt.rs`).
    mrope: bool,
    /// The audio tower and how the prompt marks a clip, for checkpoints that take audio.
    audio: Option<(AudioPrompt, AudioInput)>,
}

impl VisionLm {
    pub fn new(text: Box<dyn CausalLm>, encoder: Box<dyn ImageEncoder>, prompt: ImagePrompt) -> Self {
        VisionLm { text, encoder, prompt, slots: Mutex::new(Slots::default()), mrope: false, audio: None }
    }

    /// The same model taking audio clips too (Gemma 4 with an `audio_config`).
    pub fn with_audio(mut self, prompt: AudioPrompt, input: AudioInput) -> Self {
        self.audio = Some((prompt, input));
        self
    }

    /// Gemma 3. `processor`: the checkpoint's preprocessing; with pan and scan on, an image it
    /// crops is the whole image and its crops, in the prompt as Gemma3Processor writes them.
    pub fn gemma3(text: Box<dyn CausalLm>, vision: Gemma3Vision, image_token: u32, processor: Gemma3ImageProcessor) -> Self {
        let t = vision.tokens_per_image();
        let prompt = ImagePrompt {
            marker: "<start_of_image>".into(),
            expansion: format!("\n\n<start_of_image>{}<end_of_image>\n\n", "<image_soft_token>".repeat(t)),
            image_token,
            placeholder_tokens: t,
            video: None,
            pan_and_scan: processor.do_pan_and_scan.then(|| processor.clone()),
        };
        VisionLm::new(text, Box::new(Gemma3Images { vision, processor }), prompt)
    }

    /// Gemma 4: the template's `<|image|>` becomes `<|image>` `<|image|>` `<image|>`, and that one
    /// image token as many as the image takes (mlx-vlm's Gemma4Processor writes them all at once).
    /// `video`: the video token's id and the video processor, for checkpoints that take video
    /// (frames): the template's `<|video|>` becomes one `mm:ss <|image><|video|><image|>` per kept
    /// frame, and each frame's video token as many as the frame takes.
    pub fn gemma4(
        text: Box<dyn CausalLm>,
        vision: Gemma4Vision,
        image_token: u32,
        processor: Gemma4ImageProcessor,
        video: Option<(u32, Gemma4VideoProcessor)>,
    ) -> Self {
        let prompt = ImagePrompt {
            marker: "<|image|>".into(),
            expansion: "<|image><|image|><image|>".into(),
            image_token,
            placeholder_tokens: 1,
            video: video.as_ref().map(|(video_token, p)| VideoPrompt {
                marker: "<|video|>".into(),
                video_token: *video_token,
                layout: VideoLayout::Frames {
                    video_token_text: "<|video|>".into(),
                    boi: "<|image>".into(),
                    eoi: "<image|>".into(),
                    processor: p.clone(),
                },
            }),
            pan_and_scan: None,
        };
        let video = video.map(|(_, p)| p);
        VisionLm::new(text, Box::new(Gemma4Images { vision, processor, video }), prompt)
    }

    /// The image's ids (first offset, count) and decoded size (width, height), encoding it
    /// (as an image, or as a video `frame`) unless it is kept.
    fn image_ids(&self, image: &ImageData, frame: bool) -> Result<(u32, u32, (u32, u32))> {
        let mut slots = self.slots.lock().map_err(|_| Error::Mlx("image slots poisoned by a panic".into()))?;
        if let Some(at) = slots.kept.iter().position(|k| !k.audio && k.frames.is_none() && k.frame == frame && k.image == *image) {
            let k = slots.kept.remove(at).expect("found above");
            let ids = (k.first, k.len, k.size);
            slots.kept.push_back(k);
            return Ok(ids);
        }
        let decoded = decode_image(&image.bytes)?;
        crate::startup_trace::mark("image decoded");
        let size = (decoded.width, decoded.height);
        let rows = if frame { self.encoder.encode_frame(&decoded)? } else { self.encoder.encode(&decoded)? };
        self.keep(slots, Kept::new(image, frame, false, size, rows))
    }

    /// An audio clip's ids (first offset, count), encoding it unless it is kept.
    fn audio_ids(&self, clip: &ImageData) -> Result<(u32, u32)> {
        let Some((_, input)) = &self.audio else {
            return Err(Error::InvalidArgument("this model takes no audio (it has no audio tower)".into()));
        };
        let mut slots = self.slots.lock().map_err(|_| Error::Mlx("image slots poisoned by a panic".into()))?;
        if let Some(at) = slots.kept.iter().position(|k| k.audio && k.image == *clip) {
            let k = slots.kept.remove(at).expect("found above");
            let ids = (k.first, k.len);
            slots.kept.push_back(k);
            return Ok(ids);
        }
        let rows = input.encode(&clip.bytes)?;
        let (first, len, _) = self.keep(slots, Kept::new(clip, false, true, (0, 0), rows))?;
        Ok((first, len))
    }

    /// The id ranges (first offset, count) of the kept audio clips (none without an audio tower).
    fn audio_ranges(&self) -> Vec<(u32, u32)> {
        if self.audio.is_none() {
            return vec![];
        }
        match self.slots.lock() {
            Ok(slots) => slots.kept.iter().filter(|k| k.audio).map(|k| (k.first, k.len)).collect(),
            Err(_) => vec![],
        }
    }

    /// Gives an entry's encoded rows the next free ids and keeps it (dropping the least recently
    /// used): its (first, len, size).
    fn keep(&self, mut slots: std::sync::MutexGuard<'_, Slots>, mut entry: Kept) -> Result<(u32, u32, (u32, u32))> {
        let len = entry.rows.shape()[0] as u32;
        let first = slots.next;
        if first as u64 + len as u64 > (u32::MAX - MEDIA_TOKEN_BASE) as u64 {
            return Err(Error::InvalidArgument("this session has seen too many distinct images".into()));
        }
        // Scheduled, not waited for: the prompt's graph is built while the tower runs.
        if crate::ablation::get().prefill_overlap {
            entry.rows.eval()?;
        } else {
            crate::mlx::async_eval(&[&entry.rows])?;
        }
        crate::startup_trace::mark("media rows scheduled");
        slots.next += len;
        let size = entry.size;
        (entry.first, entry.len) = (first, len);
        slots.kept.push_back(entry);
        while slots.kept.len() > 1
            && (slots.kept.len() > KEPT_IMAGES || slots.kept.iter().map(Kept::bytes).sum::<usize>() > KEPT_BYTES)
        {
            slots.kept.pop_front();
        }
        Ok((first, len, size))
    }

    /// The rows of media ids `ids` (consecutive ids of one image or several).
    fn media_rows(&self, ids: &[u32]) -> Result<Array> {
        let slots = self.slots.lock().map_err(|_| Error::Mlx("image slots poisoned by a panic".into()))?;
        let mut parts = vec![];
        let mut i = 0;
        while i < ids.len() {
            let at = ids[i] - MEDIA_TOKEN_BASE;
            let kept = slots.kept.iter().find(|k| k.first <= at && at < k.first + k.len).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "the prompt refers to an image this session no longer keeps (more than {KEPT_IMAGES} images since)"
                ))
            })?;
            let first = at - kept.first;
            let mut n = 1;
            while i + n < ids.len() && ids[i + n] == ids[i] + n as u32 && first + (n as u32) < kept.len {
                n += 1;
            }
            parts.push(kept.rows.slice_axis(0, first as i32, (first + n as u32) as i32)?);
            i += n;
        }
        let refs: Vec<&Array> = parts.iter().collect();
        Array::concatenate(&refs, 0)
    }
}

impl Params for VisionLm {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        self.text.params(out);
        self.encoder.params(out);
        if let Some((_, a)) = &self.audio {
            a.params(out);
        }
    }
}

impl CausalLm for VisionLm {
    /// Token ids the model sampled (decode steps): never images, so the text model's embedding,
    /// with no look at the ids (reading them would wait for the step that sampled them).
    fn embed(&self, tokens: &Array) -> Result<Array> {
        self.text.embed(tokens)
    }

    /// A prompt chunk: runs of text ids through the text embedding, runs of image ids from their
    /// images' rows.
    fn forward_prompt(&self, ids: &[u32], caches: &mut LayerCaches) -> Result<Array> {
        if self.mrope {
            return self.forward_prompt_mrope(ids, caches);
        }
        if !ids.iter().any(|&t| is_media_token(t)) {
            return self.text.forward_prompt(ids, caches);
        }
        let scale = self.encoder.row_scale();
        let mut parts = vec![];
        let mut i = 0;
        while i < ids.len() {
            let media = is_media_token(ids[i]);
            let j = i + ids[i..].iter().take_while(|&&t| is_media_token(t) == media).count();
            parts.push(if media {
                self.media_rows(&ids[i..j])?.astype(self.text.dtype())?.expand_dims(0)?
            } else {
                let rows = self.text.embed(&Array::from_slice(&ids[i..j], &[1, (j - i) as i32])?)?;
                match scale {
                    RowScale::Embedding => rows,
                    RowScale::Input { scale, .. } => rows.multiply(&Array::scalar_f32(scale, rows.dtype())?)?,
                }
            });
            i = j;
        }
        let refs: Vec<&Array> = parts.iter().collect();
        let h = Array::concatenate(&refs, 1)?;
        match scale {
            RowScale::Embedding => self.text.forward_embeddings(h, caches),
            RowScale::Input { pad_id, .. } => {
                // Audio tokens are never attended both ways (mlx-vlm's overlay takes image and
                // video tokens only): the mask marks the vision rows.
                let audio = self.audio_ranges();
                let in_audio = |t: u32| audio.iter().any(|&(a, n)| (a..a + n).contains(&(t - MEDIA_TOKEN_BASE)));
                let media: Vec<bool> = ids.iter().map(|&t| is_media_token(t) && !in_audio(t)).collect();
                let ids: Vec<u32> = ids.iter().map(|&t| if is_media_token(t) { pad_id } else { t }).collect();
                self.text.forward_input_rows(h, &Array::from_slice(&ids, &[1, ids.len() as i32])?, &media, caches)
            }
        }
    }

    fn forward_embeddings(&self, h: Array, caches: &mut LayerCaches) -> Result<Array> {
        if self.mrope {
            return self.forward_mrope(None, h, caches);
        }
        self.text.forward_embeddings(h, caches)
    }

    /// An image's tokens go into one chunk: the cut moves back to the start of the image it would
    /// split, or, when that image starts the chunk, forward to its end (Gemma 4's larger models
    /// attend both ways inside an image, which needs all of its tokens at once).
    fn prefill_chunk_len(&self, ids: &[u32], n: usize) -> usize {
        if n == 0 || n >= ids.len() || !is_media_token(ids[n]) || !is_media_token(ids[n - 1]) || ids[n] != ids[n - 1] + 1 {
            return n;
        }
        // ids[n - 1] and ids[n] are consecutive tokens of one image: find where its run starts.
        let mut start = n - 1;
        while start > 0 && is_media_token(ids[start - 1]) && ids[start] == ids[start - 1] + 1 {
            start -= 1;
        }
        if start > 0 {
            return start;
        }
        let mut end = n;
        while end < ids.len() && is_media_token(ids[end]) && ids[end] == ids[end - 1] + 1 {
            end += 1;
        }
        end
    }

    fn make_caches(&self) -> LayerCaches {
        let mut caches = self.text.make_caches();
        if self.mrope {
            caches.0.push(Box::new(super::mrope::PositionCache::new()));
        }
        caches
    }

    fn batchable(&self) -> bool {
        self.text.batchable()
    }

    fn vocab_size(&self) -> usize {
        self.text.vocab_size()
    }

    fn dtype(&self) -> Dtype {
        self.text.dtype()
    }

    fn image_prompt(&self) -> Option<&ImagePrompt> {
        Some(&self.prompt)
    }

    fn audio_prompt(&self) -> Option<&AudioPrompt> {
        self.audio.as_ref().map(|(p, _)| p)
    }

    fn bind_images(&self, ids: Vec<u32>, images: &[&ImageData]) -> Result<Vec<u32>> {
        let media: Vec<Media> = images.iter().map(|&i| Media::Image(i)).collect();
        self.bind_media(ids, &media)
    }

    /// Images as [`Self::bind_images`]; a video's frames each take the next run of one video
    /// token (its kept frames: sampled as the model's processor samples them), encoded as frames.
    /// All of a video's frames must have one size (mlx-vlm takes a video as one array).
    fn bind_media(&self, ids: Vec<u32>, media: &[Media]) -> Result<Vec<u32>> {
        let t = self.prompt.placeholder_tokens;
        let video = self.prompt.video.as_ref();
        // Every image and kept frame of the prompt must stay kept until its prefill.
        let mut distinct = std::collections::HashSet::new();
        for m in media {
            match (m, video) {
                (Media::Image(i), _) => {
                    distinct.insert((false, i.hash, i.bytes.len()));
                }
                (Media::Video(frames), Some(v)) => match &v.layout {
                    VideoLayout::Frames { processor, .. } => {
                        for k in processor.sample(frames.len()) {
                            distinct.insert((true, frames[k].hash, frames[k].bytes.len()));
                        }
                    }
                    VideoLayout::Whole(w) => {
                        let kept: Vec<ImageData> = w.kept(frames).into_iter().map(|k| frames[k].clone()).collect();
                        distinct.insert((true, whole_video::key(&kept), kept.iter().map(|f| f.bytes.len()).sum()));
                    }
                },
                (Media::Video(_), None) => {}
                (Media::Audio(a), _) => {
                    distinct.insert((false, a.hash, a.bytes.len()));
                }
            }
        }
        if distinct.len() > KEPT_IMAGES {
            return Err(Error::InvalidArgument(format!(
                "the prompt holds {} distinct images and video frames, more than the {KEPT_IMAGES} a session keeps at once",
                distinct.len()
            )));
        }
        let bytes: usize = distinct.iter().map(|&(_, _, n)| n).sum();
        if distinct.len() > 1 && bytes > KEPT_BYTES {
            return Err(Error::InvalidArgument(format!(
                "the prompt's images and video frames hold {bytes} encoded bytes, more than the {KEPT_BYTES} a session keeps at once"
            )));
        }
        let mut out = Vec::with_capacity(ids.len());
        let mut next = media.iter().enumerate();
        // The video being bound: its number (1-based), its kept frames still to place, its frame size.
        let mut frames: (usize, std::collections::VecDeque<&ImageData>, Option<(u32, u32)>) = (0, Default::default(), None);
        // A video encoded whole, being placed unit by unit.
        let mut whole = whole_video::Binding::default();
        let audio_token = self.audio.as_ref().map(|(p, _)| p.audio_token);
        // A pan-and-scan image whose crops' runs are still to come: its number (1-based), the
        // next id offset, the ids left (a run of `t` per crop).
        let mut crops: Option<(usize, u32, u32)> = None;
        let mut i = 0;
        while i < ids.len() {
            if let Some((n, ..)) = crops {
                if Some(ids[i]) == audio_token || video.is_some_and(|v| ids[i] == v.video_token) {
                    return Err(Error::InvalidArgument(format!(
                        "the prompt has another media part's place at position {i} among image {n}'s pan-and-scan crops"
                    )));
                }
            }
            if Some(ids[i]) == audio_token {
                let (n, part) = next.next().ok_or_else(|| {
                    Error::InvalidArgument("the prompt has more audio places than the messages have audio clips".into())
                })?;
                let n = n + 1;
                let Media::Audio(clip) = part else {
                    return Err(Error::InvalidArgument(format!(
                        "media part {n} of the conversation is {}, and the prompt has an audio place there",
                        media_kind(part)
                    )));
                };
                if !frames.1.is_empty() || whole.open() {
                    return Err(Error::InvalidArgument(format!("the prompt has an audio place at position {i} inside a video's frames")));
                }
                let run = ids[i..].iter().take_while(|&&x| x == ids[i]).count();
                if run != 1 {
                    return Err(Error::InvalidArgument(format!(
                        "the prompt holds a run of {run} audio tokens at position {i}; an audio clip takes 1"
                    )));
                }
                let (first, len) = self.audio_ids(clip).map_err(|e| match e {
                    Error::InvalidArgument(m) => Error::InvalidArgument(format!("the audio (media part {n} of the conversation): {m}")),
                    other => other,
                })?;
                out.extend((0..len).map(|k| MEDIA_TOKEN_BASE + first + k));
                i += 1;
                continue;
            }
            let is_video = video.is_some_and(|v| ids[i] == v.video_token);
            if ids[i] != self.prompt.image_token && !is_video {
                out.push(ids[i]);
                i += 1;
                continue;
            }
            let run = ids[i..].iter().take_while(|&&x| x == ids[i]).count();
            if (!frames.1.is_empty() || whole.open()) && !is_video {
                return Err(Error::InvalidArgument(format!(
                    "the prompt has an image place at position {i} inside video {}'s frames",
                    frames.0.max(whole.part())
                )));
            }
            if is_video {
                if run != 1 {
                    return Err(Error::InvalidArgument(format!(
                        "the prompt holds a run of {run} video tokens at position {i}; a video frame takes 1"
                    )));
                }
                if let VideoLayout::Whole(w) = &video.expect("is_video").layout {
                    out.extend(self.bind_whole_video_unit(w, &mut whole, &mut next)?);
                    i += 1;
                    continue;
                }
                if frames.1.is_empty() {
                    let (n, part) = next.next().ok_or_else(|| {
                        Error::InvalidArgument("the prompt has more video places than the messages have videos".into())
                    })?;
                    let Media::Video(all) = part else {
                        return Err(Error::InvalidArgument(format!(
                            "media part {} of the conversation is {}, and the prompt has a video frame's place there",
                            n + 1,
                            media_kind(part)
                        )));
                    };
                    let VideoLayout::Frames { processor, .. } = &video.expect("is_video").layout else { unreachable!("whole videos are bound above") };
                    frames = (n + 1, processor.sample(all.len()).into_iter().map(|k| &all[k]).collect(), None);
                }
                let frame = frames.1.pop_front().expect("not empty");
                let k = frames.0;
                let (first, len, size) = self.image_ids(frame, true).map_err(|e| match e {
                    Error::InvalidArgument(m) => Error::InvalidArgument(format!("the video (media part {k} of the conversation): {m}")),
                    other => other,
                })?;
                if let Some(s) = frames.2.filter(|&s| s != size) {
                    return Err(Error::InvalidArgument(format!(
                        "the video (media part {k} of the conversation): its frames differ in size ({}x{} and {}x{}): a video's frames must all have one size",
                        s.0, s.1, size.0, size.1
                    )));
                }
                frames.2 = Some(size);
                out.extend((0..len).map(|j| MEDIA_TOKEN_BASE + first + j));
                i += 1;
                continue;
            }
            if run != t {
                return Err(Error::InvalidArgument(format!(
                    "the prompt holds a run of {run} image tokens at position {i}; an image takes {t}"
                )));
            }
            if let Some((n, at, left)) = crops.take() {
                // The next crop of a pan-and-scan image (Gemma3Processor's sentence in between).
                out.extend((0..t as u32).map(|k| MEDIA_TOKEN_BASE + at + k));
                if left > t as u32 {
                    crops = Some((n, at + t as u32, left - t as u32));
                }
                i += run;
                continue;
            }
            let (n, part) = next.next().ok_or_else(|| {
                Error::InvalidArgument("the prompt has more image places than the messages have images".into())
            })?;
            let n = n + 1;
            let Media::Image(image) = part else {
                return Err(Error::InvalidArgument(format!(
                    "media part {n} of the conversation is {}, and the prompt has an image place there",
                    media_kind(part)
                )));
            };
            let (first, len, _) = self.image_ids(image, false).map_err(|e| match e {
                Error::InvalidArgument(m) => Error::InvalidArgument(format!("image {n} of the conversation: {m}")),
                other => other,
            })?;
            // With pan and scan each run of `t` stands for `t` rows: the whole image's here, its
            // crops' in the runs that follow. Otherwise the run stands for all the image's rows.
            let take = if self.prompt.pan_and_scan.is_some() { len.min(t as u32) } else { len };
            out.extend((0..take).map(|k| MEDIA_TOKEN_BASE + first + k));
            if take < len {
                crops = Some((n, first + take, len - take));
            }
            i += run;
        }
        if let Some((n, _, left)) = crops {
            return Err(Error::InvalidArgument(format!(
                "the prompt has places for {} fewer pan-and-scan crops than image {n} of the conversation takes",
                left as usize / t.max(1)
            )));
        }
        if !frames.1.is_empty() || whole.open() {
            return Err(Error::InvalidArgument(format!(
                "the prompt has places for fewer frames than the video (media part {} of the conversation) keeps",
                frames.0.max(whole.part())
            )));
        }
        // The prompt's last token is fed as a sampled one would be (`embed`, not `forward_prompt`).
        if out.last().is_some_and(|&t| is_media_token(t)) {
            return Err(Error::InvalidArgument("the prompt ends with an image: the chat template must put text after it".into()));
        }
        if next.next().is_some() {
            return Err(Error::InvalidArgument(format!(
                "the chat template placed fewer image or video markers than the messages have media parts ({})",
                media.len()
            )));
        }
        Ok(out)
    }
}
