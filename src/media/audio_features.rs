//! Gemma 4's audio feature extractor (issue 15): a 16 kHz mono waveform to the log-mel frames its
//! audio tower takes, computed as mlx-vlm 0.7.10's `Gemma4AudioFeatureExtractor`
//! (`models/gemma4/audio_feature_extractor.py`, the USM front end) computes them, checked against
//! it by tests/audio_gemma4.rs:
//! - the waveform is cut to `max_length` samples (30 s) and zero-padded to a multiple of 128;
//! - `frame_length // 2` zeros are put in front (the first frame centred on t = 0); frames of
//!   `frame_length + 1` samples every `hop_length` (20 ms / 10 ms), the last sample dropped (no
//!   pre-emphasis; HTK-flavoured pre-emphasis when configured), times a periodic Hann window;
//! - |rfft| over `fft_length` (the next power of two, doubled with `fft_overdrive`), times an HTK
//!   mel filterbank (no area normalisation, transformers' `mel_filter_bank`), `ln(x + mel_floor)`,
//!   optionally minus `per_bin_mean` and over `per_bin_stddev`;
//! - a frame is valid when the padded waveform's sample at its last position is real audio; invalid
//!   frames are zeroed (the mask goes to the tower).
//!
//! Plain Rust, f64 inside (numpy computes the FFT in float32 and the rest in float64: the
//! difference is far below the 1e-4 the test allows). No MLX here.
use serde::Deserialize;

/// The feature extractor's settings (`feature_extractor` of processor_config.json), with
/// mlx-vlm's defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Gemma4AudioFeatureExtractor {
    pub feature_size: usize,
    pub sampling_rate: u32,
    pub padding_value: f32,
    pub frame_length_ms: f64,
    pub hop_length_ms: f64,
    pub min_frequency: f64,
    pub max_frequency: f64,
    pub preemphasis: f64,
    pub preemphasis_htk_flavor: bool,
    pub fft_overdrive: bool,
    pub dither: f64,
    pub input_scale_factor: f64,
    pub mel_floor: f64,
    pub per_bin_mean: Option<Vec<f64>>,
    pub per_bin_stddev: Option<Vec<f64>>,
    /// The most samples taken (the processor's call default `max_length`: 30 s at 16 kHz) and
    /// the padding multiple. mlx-vlm reads neither from the config (they are arguments of its
    /// `__call__`), so neither is read here.
    #[serde(skip)]
    pub max_length: usize,
    #[serde(skip)]
    pub pad_to_multiple_of: usize,
}

impl Default for Gemma4AudioFeatureExtractor {
    fn default() -> Self {
        Gemma4AudioFeatureExtractor {
            feature_size: 128,
            sampling_rate: 16_000,
            padding_value: 0.0,
            frame_length_ms: 20.0,
            hop_length_ms: 10.0,
            min_frequency: 0.0,
            max_frequency: 8000.0,
            preemphasis: 0.0,
            preemphasis_htk_flavor: true,
            fft_overdrive: false,
            dither: 0.0,
            input_scale_factor: 1.0,
            mel_floor: 1e-3,
            per_bin_mean: None,
            per_bin_stddev: None,
            max_length: 480_000,
            pad_to_multiple_of: 128,
        }
    }
}

/// Log-mel frames `[frames, feature_size]` (row-major) and which frames hold real audio.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioFeatures {
    pub data: Vec<f32>,
    pub frames: usize,
    pub bins: usize,
    pub mask: Vec<bool>,
}

impl Gemma4AudioFeatureExtractor {
    /// The settings of a processor_config.json (its `feature_extractor` object, else defaults).
    pub fn from_config(json: &serde_json::Value) -> Result<Self, String> {
        let fe = match json.get("feature_extractor") {
            Some(v) if v.is_object() => {
                let mut v = v.clone();
                v.as_object_mut().expect("object").remove("feature_extractor_type");
                serde_path_to_error::deserialize::<_, Self>(v)
                    .map_err(|e| format!("feature_extractor.{}: {}", e.path(), e.inner()))?
            }
            _ => Self::default(),
        };
        fe.validate()?;
        Ok(fe)
    }

    pub fn validate(&self) -> Result<(), String> {
        let bad = |m: &str| Err(format!("feature_extractor.{m}"));
        if self.feature_size == 0 || self.feature_size > 4096 {
            return bad("feature_size must be between 1 and 4096");
        }
        if self.sampling_rate < 1000 || self.sampling_rate > 384_000 {
            return bad("sampling_rate must be between 1000 and 384000");
        }
        if self.frame_length() < 2 || self.frame_length() > 1 << 16 || self.hop_length() == 0 || self.hop_length() > 1 << 16 {
            return bad("frame_length_ms / hop_length_ms give frames of 2 to 65536 samples and a hop of 1 to 65536");
        }
        if !(self.mel_floor > 0.0) || !self.mel_floor.is_finite() {
            return bad("mel_floor must be a positive number");
        }
        if !(self.min_frequency >= 0.0 && self.min_frequency <= self.max_frequency) || !self.max_frequency.is_finite() {
            return bad("min_frequency / max_frequency must satisfy 0 <= min <= max");
        }
        for (name, v) in [("per_bin_mean", &self.per_bin_mean), ("per_bin_stddev", &self.per_bin_stddev)] {
            if v.as_ref().is_some_and(|v| v.len() != self.feature_size) {
                return Err(format!("feature_extractor.{name} must hold feature_size ({}) values", self.feature_size));
            }
        }
        if self.dither != 0.0 {
            // Random noise: no two runs (nor mlex and the reference) could agree.
            return bad("dither is not supported (it adds random noise)");
        }
        if self.max_length == 0 || self.max_length > 1 << 26 || self.pad_to_multiple_of > 1 << 16 {
            return bad("max_length must be between 1 and 2^26 samples, pad_to_multiple_of at most 2^16");
        }
        Ok(())
    }

    /// Samples per frame (`round(sampling_rate · frame_length_ms / 1000)`).
    pub fn frame_length(&self) -> usize {
        (self.sampling_rate as f64 * self.frame_length_ms / 1000.0).round_ties_even() as usize
    }

    pub fn hop_length(&self) -> usize {
        (self.sampling_rate as f64 * self.hop_length_ms / 1000.0).round_ties_even() as usize
    }

    pub fn fft_length(&self) -> usize {
        let n = self.frame_length().next_power_of_two();
        if self.fft_overdrive {
            2 * n
        } else {
            n
        }
    }

    /// The HTK mel filterbank `[fft_length/2 + 1][feature_size]` (transformers' `mel_filter_bank`,
    /// norm None, FFT bin frequencies `linspace(0, sampling_rate // 2, bins)`).
    pub fn mel_filters(&self) -> Vec<Vec<f64>> {
        let bins = self.fft_length() / 2 + 1;
        let n = self.feature_size;
        let hz_to_mel = |f: f64| 2595.0 * (1.0 + f / 700.0).log10();
        let mel_to_hz = |m: f64| 700.0 * (10f64.powf(m / 2595.0) - 1.0);
        let (lo, hi) = (hz_to_mel(self.min_frequency), hz_to_mel(self.max_frequency));
        let points: Vec<f64> = linspace(lo, hi, n + 2).into_iter().map(mel_to_hz).collect();
        let fft_freqs = linspace(0.0, (self.sampling_rate / 2) as f64, bins);
        let diff: Vec<f64> = points.windows(2).map(|w| w[1] - w[0]).collect();
        fft_freqs
            .iter()
            .map(|&f| {
                (0..n)
                    .map(|i| {
                        let down = -(points[i] - f) / diff[i];
                        let up = (points[i + 2] - f) / diff[i + 1];
                        down.min(up).max(0.0)
                    })
                    .collect()
            })
            .collect()
    }

    /// The log-mel features of one waveform at `sampling_rate` (longer than `max_length`: cut).
    pub fn extract(&self, waveform: &[f32]) -> AudioFeatures {
        let wave = &waveform[..waveform.len().min(self.max_length)];
        let mut len = wave.len().min(self.max_length);
        let m = self.pad_to_multiple_of;
        if m > 0 && len % m != 0 {
            len = (len / m + 1) * m;
        }
        let (fl, hop, nfft) = (self.frame_length(), self.hop_length(), self.fft_length());
        let pad_left = fl / 2;
        // The padded waveform: pad_left zeros, the samples, padding_value up to `len`.
        let total = pad_left + len;
        let sample = |i: usize| -> f64 {
            if i < pad_left {
                0.0
            } else if i - pad_left < wave.len() {
                wave[i - pad_left] as f64 * self.input_scale_factor
            } else {
                self.padding_value as f64 * self.input_scale_factor
            }
        };
        let real = |i: usize| i >= pad_left && i - pad_left < wave.len();
        let unfold = fl + 1;
        let frames = if total >= unfold { (total - unfold) / hop + 1 } else { 0 };
        // Periodic Hann window, computed in float32 as numpy does.
        let window: Vec<f64> = (0..fl)
            .map(|n| {
                let a = 2.0f32 * std::f32::consts::PI * (n as f32) / (fl as f32);
                (0.5f32 - 0.5f32 * a.cos()) as f64
            })
            .collect();
        let filters = self.mel_filters();
        let bins = nfft / 2 + 1;
        // Each triangle's nonzero span (the products outside it are exact zeros in the sum).
        let spans: Vec<(usize, usize)> = (0..self.feature_size)
            .map(|j| {
                let lo = (0..bins).find(|&b| filters[b][j] != 0.0).unwrap_or(0);
                let hi = (0..bins).rev().find(|&b| filters[b][j] != 0.0).map_or(0, |b| b + 1);
                (lo, hi.max(lo))
            })
            .collect();
        let n_mel = self.feature_size;
        let fft = Fft::new(nfft);
        let (mut re, mut im) = (vec![0.0f64; nfft], vec![0.0f64; nfft]);
        let mut mag = vec![0.0f64; bins];
        let mut data = Vec::with_capacity(frames * n_mel);
        let mut mask = Vec::with_capacity(frames);
        let p = self.preemphasis;
        for t in 0..frames {
            let start = t * hop;
            re.iter_mut().for_each(|v| *v = 0.0);
            im.iter_mut().for_each(|v| *v = 0.0);
            for k in 0..fl {
                let x = if p > 0.0 {
                    if self.preemphasis_htk_flavor {
                        if k == 0 {
                            sample(start) * (1.0 - p)
                        } else {
                            sample(start + k) - p * sample(start + k - 1)
                        }
                    } else {
                        sample(start + k + 1) - p * sample(start + k)
                    }
                } else {
                    sample(start + k)
                };
                re[k] = x * window[k];
            }
            fft.forward(&mut re, &mut im);
            for b in 0..bins {
                mag[b] = (re[b] * re[b] + im[b] * im[b]).sqrt();
            }
            let valid = real(start + unfold - 1);
            mask.push(valid);
            for j in 0..n_mel {
                let mut s = 0.0;
                for b in spans[j].0..spans[j].1 {
                    s += mag[b] * filters[b][j];
                }
                let mut v = (s + self.mel_floor).ln();
                if let Some(mean) = &self.per_bin_mean {
                    v -= mean[j];
                }
                if let Some(std) = &self.per_bin_stddev {
                    v /= std[j];
                }
                data.push(if valid { v as f32 } else { 0.0 });
            }
        }
        AudioFeatures { data, frames, bins: n_mel, mask }
    }
}

fn linspace(a: f64, b: f64, n: usize) -> Vec<f64> {
    if n == 1 {
        return vec![a];
    }
    let step = (b - a) / (n - 1) as f64;
    // numpy: start + i·step, the last point exactly `b`.
    (0..n).map(|i| if i == n - 1 { b } else { a + i as f64 * step }).collect()
}

/// An in-place iterative radix-2 complex FFT of a fixed power-of-two size.
struct Fft {
    n: usize,
    cos: Vec<f64>,
    sin: Vec<f64>,
}

impl Fft {
    fn new(n: usize) -> Self {
        assert!(n.is_power_of_two());
        let (cos, sin) = (0..n / 2)
            .map(|k| {
                let a = -2.0 * std::f64::consts::PI * k as f64 / n as f64;
                (a.cos(), a.sin())
            })
            .unzip();
        Fft { n, cos, sin }
    }

    fn forward(&self, re: &mut [f64], im: &mut [f64]) {
        let n = self.n;
        let bits = n.trailing_zeros();
        if bits > 0 {
            for i in 0..n {
                let j = i.reverse_bits() >> (usize::BITS - bits);
                if j > i {
                    re.swap(i, j);
                    im.swap(i, j);
                }
            }
        }
        let mut len = 2;
        while len <= n {
            let step = n / len;
            for start in (0..n).step_by(len) {
                for k in 0..len / 2 {
                    let (c, s) = (self.cos[k * step], self.sin[k * step]);
                    let (a, b) = (start + k, start + k + len / 2);
                    let (xr, xi) = (re[b] * c - im[b] * s, re[b] * s + im[b] * c);
                    re[b] = re[a] - xr;
                    im[b] = im[a] - xi;
                    re[a] += xr;
                    im[a] += xi;
                }
            }
            len *= 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fft_matches_a_plain_dft() {
        let n = 16;
        let x: Vec<f64> = (0..n).map(|i| ((i * 7 % 5) as f64 - 2.0) * 0.3).collect();
        let (mut re, mut im) = (x.clone(), vec![0.0; n]);
        Fft::new(n).forward(&mut re, &mut im);
        for k in 0..n {
            let (mut r, mut i) = (0.0, 0.0);
            for (t, v) in x.iter().enumerate() {
                let a = -2.0 * std::f64::consts::PI * (k * t) as f64 / n as f64;
                r += v * a.cos();
                i += v * a.sin();
            }
            assert!((re[k] - r).abs() < 1e-9 && (im[k] - i).abs() < 1e-9, "bin {k}");
        }
    }

    #[test]
    fn config_reads_the_feature_extractor_and_ignores_the_rest() {
        let j = serde_json::json!({"feature_extractor": {"feature_extractor_type": "Gemma4AudioFeatureExtractor",
            "feature_size": 128, "mel_floor": 0.01, "max_length": 5, "processor_class": "X"}});
        let fe = Gemma4AudioFeatureExtractor::from_config(&j).unwrap();
        assert_eq!((fe.mel_floor, fe.max_length, fe.pad_to_multiple_of), (0.01, 480_000, 128));
        let none = Gemma4AudioFeatureExtractor::from_config(&serde_json::json!({"image_processor": {}})).unwrap();
        assert_eq!(none, Gemma4AudioFeatureExtractor::default());
        for (bad, field) in [
            (serde_json::json!({"dither": 0.1}), "dither"),
            (serde_json::json!({"per_bin_mean": [1.0]}), "per_bin_mean"),
            (serde_json::json!({"mel_floor": 0.0}), "mel_floor"),
            (serde_json::json!({"sampling_rate": "fast"}), "sampling_rate"),
        ] {
            let err = Gemma4AudioFeatureExtractor::from_config(&serde_json::json!({"feature_extractor": bad})).unwrap_err();
            assert!(err.contains(field), "{err}");
        }
    }

    #[test]
    fn frames_and_mask_follow_the_padding() {
        let fe = Gemma4AudioFeatureExtractor::default();
        assert_eq!((fe.frame_length(), fe.hop_length(), fe.fft_length()), (320, 160, 512));
        // 900 samples: padded to 1024, plus 160 in front: (1184 - 321) / 160 + 1 = 6 frames.
        let f = fe.extract(&vec![0.1; 900]);
        assert_eq!((f.frames, f.bins), (6, 128));
        // Frame t's last sample is 160·t + 320 of the left-padded waveform: real while < 1060.
        assert_eq!(f.mask, vec![true, true, true, true, true, false]);
        assert!(f.data[5 * 128..].iter().all(|&v| v == 0.0));
        assert!(fe.extract(&[]).frames == 0);
    }
}
