//! A language model with a vision tower in front (issue 15): how image tokens reach a decoder
//! without the engine, the batcher or the prompt cache knowing about images.
//!
//! The chat prompt holds, for each image, a run of the model's image token (`<image_soft_token>`
//! for Gemma 3, as its processor expands them). [`CausalLm::bind_images`] encodes each image
//! (decode, the model's preprocessing, tower, projector) and replaces its run with ids of its
//! own: `MEDIA_TOKEN_BASE + slot · tokens_per_image + i`, where `slot` is given to an image's
//! content (its bytes, compared whole: a hash alone could be made to collide) and never reused.
//! [`VisionLm::embed`] turns those ids into the image's rows. So everything keyed on token ids
//! keys on the image too: a second turn about the same image reuses the first's cached prefix,
//! and a different image never does.
//!
//! The last [`KEPT_IMAGES`] images (at most [`KEPT_BYTES`] of their bytes) are kept with their
//! features (an image's tokens are embedded while its prompt is prefilled, right after
//! `bind_images`). An image seen again after it was dropped gets a new slot: a prompt-cache miss,
//! never another image's rows; an id whose features were dropped is an error.
use std::collections::VecDeque;
use std::sync::Mutex;

pub use crate::chat::ImageData;

use super::gemma3_vision::Gemma3Vision;
use super::CausalLm;
use crate::error::{Error, Result};
use crate::media::{decode_image, Gemma3ImageProcessor};
use crate::mlx::{Array, Dtype};
use crate::nn::{LayerCaches, Params};

/// Prompt ids from here up stand for image tokens (far above any vocabulary).
pub const MEDIA_TOKEN_BASE: u32 = 0x8000_0000;

/// Images whose features stay in memory (a 4B Gemma 3's image is 256 × 2560 values).
pub const KEPT_IMAGES: usize = 64;

/// The most encoded image bytes kept with them (the newest image is kept whatever its size).
pub const KEPT_BYTES: usize = 256 << 20;

/// Whether a prompt id stands for an image token.
pub fn is_media_token(id: u32) -> bool {
    id >= MEDIA_TOKEN_BASE
}

/// How a model's prompt marks an image (what its processor writes for each image marker the
/// chat template renders).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagePrompt {
    /// What the template writes per image (Gemma 3: `<start_of_image>`).
    pub marker: String,
    /// What the processor writes in its place (Gemma 3: `\n\n<start_of_image>` + the image token
    /// `tokens_per_image` times + `<end_of_image>\n\n`).
    pub expansion: String,
    /// The id of the image token, and how many an image takes.
    pub image_token: u32,
    pub tokens_per_image: usize,
}

/// An image kept: its slot, its bytes, its rows `[tokens_per_image, hidden]`.
struct Kept {
    slot: u32,
    image: ImageData,
    rows: Array,
}

#[derive(Default)]
struct Slots {
    next: u32,
    /// Least recently used first.
    kept: VecDeque<Kept>,
}

/// A Gemma 3 text model with its vision tower.
pub struct VisionLm {
    text: Box<dyn CausalLm>,
    vision: Gemma3Vision,
    processor: Gemma3ImageProcessor,
    prompt: ImagePrompt,
    slots: Mutex<Slots>,
}

impl VisionLm {
    /// `processor`: the checkpoint's preprocessing (pan and scan must be off: its crops take
    /// prompt text of their own, which is not reproduced).
    pub fn new(text: Box<dyn CausalLm>, vision: Gemma3Vision, image_token: u32, processor: Gemma3ImageProcessor) -> Self {
        let t = vision.tokens_per_image();
        let prompt = ImagePrompt {
            marker: "<start_of_image>".into(),
            expansion: format!("\n\n<start_of_image>{}<end_of_image>\n\n", "<image_soft_token>".repeat(t)),
            image_token,
            tokens_per_image: t,
        };
        VisionLm { text, vision, processor, prompt, slots: Mutex::new(Slots::default()) }
    }

    /// The image's first id, encoding it unless it is kept.
    fn image_slot(&self, image: &ImageData) -> Result<u32> {
        let t = self.prompt.tokens_per_image;
        let mut slots = self.slots.lock().map_err(|_| Error::Mlx("image slots poisoned by a panic".into()))?;
        if let Some(at) = slots.kept.iter().position(|k| k.image == *image) {
            let k = slots.kept.remove(at).expect("found above");
            let slot = k.slot;
            slots.kept.push_back(k);
            return Ok(MEDIA_TOKEN_BASE + slot * t as u32);
        }
        let slot = slots.next;
        if (slot as u64 + 1) * t as u64 > (u32::MAX - MEDIA_TOKEN_BASE) as u64 {
            return Err(Error::InvalidArgument("this session has seen too many distinct images".into()));
        }
        let pv = self.processor.preprocess(&decode_image(&image.bytes)?)?;
        let shape: Vec<i32> = pv.shape.iter().map(|&d| d as i32).collect();
        let pixels = Array::from_slice(&pv.data, &shape)?;
        let rows = self.vision.merge_scale(&self.vision.encode(&pixels)?)?.reshape(&[t as i32, -1])?;
        rows.eval()?;
        slots.next += 1;
        slots.kept.push_back(Kept { slot, image: image.clone(), rows });
        while slots.kept.len() > 1
            && (slots.kept.len() > KEPT_IMAGES || slots.kept.iter().map(|k| k.image.bytes.len()).sum::<usize>() > KEPT_BYTES)
        {
            slots.kept.pop_front();
        }
        Ok(MEDIA_TOKEN_BASE + slot * t as u32)
    }

    /// The rows of media ids `ids` (consecutive ids of one image or several).
    fn media_rows(&self, ids: &[u32]) -> Result<Array> {
        let t = self.prompt.tokens_per_image as u32;
        let slots = self.slots.lock().map_err(|_| Error::Mlx("image slots poisoned by a panic".into()))?;
        let mut parts = vec![];
        let mut i = 0;
        while i < ids.len() {
            let slot = (ids[i] - MEDIA_TOKEN_BASE) / t;
            let first = (ids[i] - MEDIA_TOKEN_BASE) % t;
            let mut n = 1;
            while i + n < ids.len() && ids[i + n] == ids[i] + n as u32 && (first + n as u32) < t {
                n += 1;
            }
            let rows = slots.kept.iter().find(|k| k.slot == slot).map(|k| &k.rows).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "the prompt refers to an image this session no longer keeps (more than {KEPT_IMAGES} images since)"
                ))
            })?;
            parts.push(rows.slice_axis(0, first as i32, (first + n as u32) as i32)?);
            i += n;
        }
        let refs: Vec<&Array> = parts.iter().collect();
        Array::concatenate(&refs, 0)
    }
}

impl Params for VisionLm {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        self.text.params(out);
        self.vision.params(out);
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
        if !ids.iter().any(|&t| is_media_token(t)) {
            return self.text.forward_prompt(ids, caches);
        }
        let mut parts = vec![];
        let mut i = 0;
        while i < ids.len() {
            let media = is_media_token(ids[i]);
            let j = i + ids[i..].iter().take_while(|&&t| is_media_token(t) == media).count();
            parts.push(if media {
                self.media_rows(&ids[i..j])?.astype(self.text.dtype())?.expand_dims(0)?
            } else {
                self.text.embed(&Array::from_slice(&ids[i..j], &[1, (j - i) as i32])?)?
            });
            i = j;
        }
        let refs: Vec<&Array> = parts.iter().collect();
        self.text.forward_embeddings(Array::concatenate(&refs, 1)?, caches)
    }

    fn forward_embeddings(&self, h: Array, caches: &mut LayerCaches) -> Result<Array> {
        self.text.forward_embeddings(h, caches)
    }

    fn make_caches(&self) -> LayerCaches {
        self.text.make_caches()
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

    fn bind_images(&self, ids: Vec<u32>, images: &[&ImageData]) -> Result<Vec<u32>> {
        let t = self.prompt.tokens_per_image;
        let mut out = Vec::with_capacity(ids.len());
        let mut next = images.iter();
        let mut i = 0;
        while i < ids.len() {
            if ids[i] != self.prompt.image_token {
                out.push(ids[i]);
                i += 1;
                continue;
            }
            let run = ids[i..].iter().take_while(|&&t| t == self.prompt.image_token).count();
            if run != t {
                return Err(Error::InvalidArgument(format!(
                    "the prompt holds a run of {run} image tokens at position {i}; an image takes {t}"
                )));
            }
            let image = next.next().ok_or_else(|| {
                Error::InvalidArgument("the prompt has more image places than the messages have images".into())
            })?;
            let n = images.len() - next.len();
            let first = self.image_slot(image).map_err(|e| match e {
                Error::InvalidArgument(m) => Error::InvalidArgument(format!("image {n} of the conversation: {m}")),
                other => other,
            })?;
            out.extend((0..t as u32).map(|k| first + k));
            i += run;
        }
        // The prompt's last token is fed as a sampled one would be (`embed`, not `forward_prompt`).
        if out.last().is_some_and(|&t| is_media_token(t)) {
            return Err(Error::InvalidArgument("the prompt ends with an image: the chat template must put text after it".into()));
        }
        if next.next().is_some() {
            return Err(Error::InvalidArgument(format!(
                "the chat template placed fewer image markers than the messages have images ({})",
                images.len()
            )));
        }
        Ok(out)
    }
}
