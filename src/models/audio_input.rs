//! Audio clips into a Gemma 4 prompt (issue 15): how the chat template's audio marker becomes
//! tokens, and how a clip's bytes become the rows that take those tokens' places.
//!
//! As mlx-vlm 0.7.10's Gemma4Processor: the template's `<|audio|>` becomes `<|audio>` + the audio
//! token × `min(ceil(ms / audio_ms_per_token), audio_seq_length)` + `<audio|>`, `ms` the clip's
//! duration at the feature extractor's rate. The prompt carries one audio token per clip
//! (`<|audio><|audio|><audio|>`) and [`super::vision_lm::VisionLm`] replaces it with as many
//! media ids as the clip takes ([`AudioInput::encode`]'s rows), keyed on the clip's bytes as
//! images are (the prompt cache reuses a prefix holding the same clip, never another's).
//!
//! A clip is decoded (WAV, FLAC, MP3), mixed down to mono and resampled to the extractor's rate
//! (src/media/audio.rs), turned into log-mel frames (src/media/audio_features.rs), run through
//! the tower and embedder (src/models/gemma4_audio.rs). Its token `i` takes row `i` of the
//! tower's output, wrapping around when the duration gives more tokens than the tower gives rows
//! (mlx-vlm's `masked_scatter` does: `indices % source.size`).
use super::gemma4_audio::Gemma4Audio;
use crate::error::{Error, Result};
use crate::media::{load_audio, Gemma4AudioFeatureExtractor};
use crate::mlx::{Array, Dtype};
use crate::nn::Params;

/// How a model's prompt marks an audio clip.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioPrompt {
    /// What the template writes per clip (Gemma 4: `<|audio|>`).
    pub marker: String,
    /// What stands for it in the prompt: `<|audio>` `<|audio|>` `<audio|>` (one audio token).
    pub expansion: String,
    /// The audio token's id.
    pub audio_token: u32,
}

/// Gemma 4's audio side with its preprocessing: clip bytes in, rows out.
pub struct AudioInput {
    pub tower: Gemma4Audio,
    pub extractor: Gemma4AudioFeatureExtractor,
    /// The most tokens a clip takes (`audio_seq_length`, 750: 30 s at 40 ms).
    pub audio_seq_length: usize,
    pub audio_ms_per_token: usize,
}

impl AudioInput {
    /// The longest clip taken, in seconds (the extractor's `max_length` samples).
    pub fn max_seconds(&self) -> f64 {
        self.extractor.max_length as f64 / self.extractor.sampling_rate as f64
    }

    /// The audio tokens a clip of `samples` samples (at the extractor's rate) takes.
    pub fn tokens(&self, samples: usize) -> usize {
        let ms = samples as f64 / self.extractor.sampling_rate as f64 * 1000.0;
        ((ms / self.audio_ms_per_token as f64).ceil() as usize).min(self.audio_seq_length)
    }

    /// The rows `[n, text hidden]` of a waveform at the extractor's rate (n ≥ 1: its tokens).
    pub fn encode_waveform(&self, wave: &[f32]) -> Result<Array> {
        let n = self.tokens(wave.len());
        if n == 0 {
            return Err(Error::InvalidArgument("the audio holds no samples".into()));
        }
        let f = self.extractor.extract(wave);
        if f.frames == 0 {
            return Err(Error::InvalidArgument("the audio is too short to make a single frame".into()));
        }
        let feats = Array::from_slice(&f.data, &[1, f.frames as i32, f.bins as i32])?;
        let valid = Array::from_slice(&f.mask, &[1, f.frames as i32])?;
        let rows = self.tower.encode(&feats, &valid)?;
        let t = rows.shape()[0] as usize;
        if n == t {
            return Ok(rows);
        }
        let idx: Vec<i32> = (0..n).map(|i| (i % t) as i32).collect();
        rows.take(&Array::from_slice(&idx, &[n as i32])?, 0)
    }

    /// The rows of a clip's encoded bytes.
    pub fn encode(&self, bytes: &[u8]) -> Result<Array> {
        let wave = load_audio(bytes, self.extractor.sampling_rate, self.max_seconds())?;
        self.encode_waveform(&wave)
    }

    pub fn dtype(&self) -> Dtype {
        self.tower.dtype()
    }
}

impl Params for AudioInput {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        self.tower.params(out);
    }
}
