//! Audio bytes to the mono waveform an audio model's feature extractor takes (issue 15): WAV
//! (PCM), FLAC and MP3 decoded with symphonia, channels averaged (mlx-vlm's `load_audio`:
//! `audio.mean(axis=1)`), then resampled to the model's rate.
//!
//! The resampler is scipy's `signal.resample_poly(x, up, down, padtype="edge")` — what mlx-vlm
//! 0.7.10 uses through mlx-audio's `resample_audio` — written out: `up/down` the reduced rate
//! ratio, a low-pass FIR of `2·10·max(up, down) + 1` taps (`firwin`: cutoff `1/max(up, down)` of
//! Nyquist, Kaiser window β = 5, unit DC gain, times `up`), zero-stuffed polyphase filtering with
//! the signal extended by its edge values on both sides, the filter's delay removed, `ceil(n·up /
//! down)` samples out. Computed in f64, output f32.
//!
//! Bounds: at most [`MAX_AUDIO_BYTES`] of input and `max_seconds` of audio (the model's longest
//! clip: decoding stops and the input is refused past it); sample rates 1 kHz–384 kHz, at most 32
//! channels. Anything that is not decodable audio is `INVALID_ARGUMENT` saying why; nothing panics.
use std::io::Cursor;
use std::sync::Arc;

use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::{DecoderOptions, CODEC_TYPE_NULL};
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::FormatOptions;
use symphonia::core::io::{MediaSourceStream, MediaSourceStreamOptions};
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;

use crate::error::{Error, Result};

pub use crate::chat::audio_part::MAX_AUDIO_BYTES;

/// A decoded clip: mono samples at `sample_rate`.
#[derive(Debug, Clone, PartialEq)]
pub struct Waveform {
    pub samples: Vec<f32>,
    pub sample_rate: u32,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

/// Decodes WAV, FLAC or MP3 bytes to mono at their own rate, refusing clips longer than
/// `max_seconds`.
pub fn decode_audio(bytes: &[u8], max_seconds: f64) -> Result<Waveform> {
    if bytes.is_empty() {
        return Err(invalid("the audio is empty (0 bytes)"));
    }
    if bytes.len() > MAX_AUDIO_BYTES {
        return Err(invalid(format!("the audio is larger than {MAX_AUDIO_BYTES} bytes")));
    }
    let source: Arc<[u8]> = bytes.into();
    let mss = MediaSourceStream::new(Box::new(Cursor::new(source)), MediaSourceStreamOptions::default());
    let probed = symphonia::default::get_probe()
        .format(&Hint::new(), mss, &FormatOptions::default(), &MetadataOptions::default())
        .map_err(|e| invalid(format!("the audio is not WAV, FLAC or MP3 that can be read ({e})")))?;
    let mut format = probed.format;
    let track = format
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL)
        .ok_or_else(|| invalid("the audio holds no audio track"))?;
    let track_id = track.id;
    let params = track.codec_params.clone();
    let rate = params.sample_rate.ok_or_else(|| invalid("the audio does not say its sample rate"))?;
    if !(1000..=384_000).contains(&rate) {
        return Err(invalid(format!("the audio's sample rate {rate} Hz is outside 1 kHz to 384 kHz")));
    }
    let max_samples = (max_seconds * rate as f64).ceil() as u64;
    if let Some(n) = params.n_frames.filter(|&n| n > max_samples) {
        return Err(too_long(n as f64 / rate as f64, max_seconds));
    }
    let mut decoder = symphonia::default::get_codecs()
        .make(&params, &DecoderOptions::default())
        .map_err(|e| invalid(format!("the audio's codec is not supported ({e})")))?;
    let mut samples: Vec<f32> = vec![];
    let mut buffer: Option<SampleBuffer<f32>> = None;
    let mut bad_packet: Option<&'static str> = None;
    loop {
        let packet = match format.next_packet() {
            Ok(p) => p,
            // The end of the stream (a truncated file ends here too, with what it holds).
            Err(SymphoniaError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(SymphoniaError::ResetRequired) => break,
            Err(e) => return Err(invalid(format!("the audio could not be read ({e})"))),
        };
        if packet.track_id() != track_id {
            continue;
        }
        let decoded = match decoder.decode(&packet) {
            Ok(d) => d,
            Err(SymphoniaError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            // A damaged packet is skipped, as symphonia's own players do (an MP3 frame with a bad
            // header, say); a clip where none decodes is refused below with the last reason.
            Err(SymphoniaError::DecodeError(e)) => {
                bad_packet = Some(e);
                continue;
            }
            Err(e) => return Err(invalid(format!("the audio is corrupt ({e})"))),
        };
        let spec = *decoded.spec();
        let channels = spec.channels.count();
        if channels == 0 || channels > 32 {
            return Err(invalid(format!("the audio has {channels} channels (1 to 32 are taken)")));
        }
        if spec.rate != rate {
            return Err(invalid("the audio changes its sample rate midway"));
        }
        let frames = decoded.frames();
        if buffer.as_ref().is_none_or(|b| b.capacity() < frames * channels) {
            buffer = Some(SampleBuffer::new(decoded.capacity() as u64, spec));
        }
        let buf = buffer.as_mut().expect("set above");
        buf.copy_interleaved_ref(decoded);
        let inter = &buf.samples()[..frames * channels];
        if (samples.len() + frames) as u64 > max_samples {
            return Err(too_long((samples.len() + frames) as f64 / rate as f64, max_seconds));
        }
        if channels == 1 {
            samples.extend_from_slice(inter);
        } else {
            // numpy's mean over the channel axis, in float32.
            samples.extend(inter.chunks_exact(channels).map(|c| c.iter().sum::<f32>() / channels as f32));
        }
    }
    if samples.is_empty() {
        return Err(invalid(match bad_packet {
            Some(e) => format!("the audio is corrupt: no packet decodes ({e})"),
            None => "the audio holds no samples".into(),
        }));
    }
    if samples.iter().any(|s| !s.is_finite()) {
        return Err(invalid("the audio holds samples that are not finite numbers"));
    }
    Ok(Waveform { samples, sample_rate: rate })
}

fn too_long(seconds: f64, max: f64) -> Error {
    invalid(format!("the audio is longer than the model takes ({seconds:.1} s; at most {max} s)"))
}

/// Decodes and resamples to `rate` (see the module header).
pub fn load_audio(bytes: &[u8], rate: u32, max_seconds: f64) -> Result<Vec<f32>> {
    let w = decode_audio(bytes, max_seconds)?;
    Ok(resample_poly(&w.samples, w.sample_rate, rate))
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The modified Bessel function of the first kind, order 0 (its power series).
fn bessel_i0(x: f64) -> f64 {
    let (mut sum, mut term, q) = (1.0, 1.0, x * x / 4.0);
    for k in 1..200 {
        term *= q / (k * k) as f64;
        sum += term;
        if term < sum * 1e-17 {
            break;
        }
    }
    sum
}

/// scipy's `firwin(taps, cutoff, window=("kaiser", beta))` (a low-pass, scaled to unit gain at 0).
fn firwin_kaiser(taps: usize, cutoff: f64, beta: f64) -> Vec<f64> {
    let alpha = 0.5 * (taps - 1) as f64;
    let i0b = bessel_i0(beta);
    let mut h: Vec<f64> = (0..taps)
        .map(|n| {
            let m = n as f64 - alpha;
            let x = cutoff * m;
            let sinc = if x == 0.0 { 1.0 } else { (std::f64::consts::PI * x).sin() / (std::f64::consts::PI * x) };
            let r = 2.0 * n as f64 / (taps - 1) as f64 - 1.0;
            let w = bessel_i0(beta * (1.0 - r * r).max(0.0).sqrt()) / i0b;
            cutoff * sinc * w
        })
        .collect();
    let s: f64 = h.iter().sum();
    h.iter_mut().for_each(|v| *v /= s);
    h
}

/// scipy's `resample_poly(x, to, from, padtype="edge")` (see the module header).
pub fn resample_poly(x: &[f32], from: u32, to: u32) -> Vec<f32> {
    if from == to || x.is_empty() {
        return x.to_vec();
    }
    let g = gcd(from as u64, to as u64);
    let (up, down) = ((to as u64 / g) as usize, (from as u64 / g) as usize);
    let n_in = x.len();
    let n_out = (n_in * up).div_ceil(down);
    let max_rate = up.max(down);
    let half_len = 10 * max_rate;
    let mut h = firwin_kaiser(2 * half_len + 1, 1.0 / max_rate as f64, 5.0);
    h.iter_mut().for_each(|v| *v *= up as f64);
    // The filter delayed so that its centre lands on an output sample, as scipy pads it.
    let n_pre_pad = down - half_len % down;
    let n_pre_remove = (half_len + n_pre_pad) / down;
    let mut hp = vec![0.0; n_pre_pad];
    hp.extend_from_slice(&h);
    let len_h = hp.len() as i64;
    let (first, last) = (x[0] as f64, x[n_in - 1] as f64);
    let at = |j: i64| -> f64 {
        if j < 0 {
            first
        } else if j as usize >= n_in {
            last
        } else {
            x[j as usize] as f64
        }
    };
    let (up_i, down_i) = (up as i64, down as i64);
    (0..n_out)
        .map(|k| {
            // y[i] = Σ_j x_ext[j] · h[i·down − j·up], over the taps that land on input samples.
            let i = (k + n_pre_remove) as i64;
            let pos = i * down_i;
            // j from ceil((pos - len_h + 1) / up) to floor(pos / up)
            let j_hi = pos.div_euclid(up_i);
            let j_lo = (pos - len_h + 1 + up_i - 1).div_euclid(up_i);
            let mut s = 0.0;
            for j in j_lo..=j_hi {
                s += at(j) * hp[(pos - j * up_i) as usize];
            }
            s as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resampling_keeps_a_low_tone_and_the_length() {
        let from = 44_100;
        let x: Vec<f32> = (0..4410).map(|i| (2.0 * std::f32::consts::PI * 440.0 * i as f32 / from as f32).sin()).collect();
        let y = resample_poly(&x, from, 16_000);
        assert_eq!(y.len(), 1600);
        for (i, v) in y.iter().enumerate().skip(100).take(1400) {
            let want = (2.0 * std::f64::consts::PI * 440.0 * i as f64 / 16_000.0).sin() as f32;
            assert!((v - want).abs() < 2e-3, "sample {i}: {v} vs {want}");
        }
        assert_eq!(resample_poly(&x, 16_000, 16_000), x);
    }

    #[test]
    fn bad_bytes_are_invalid_argument() {
        for bytes in [&b""[..], b"not audio at all, just some text bytes", b"RIFF\x10\x00\x00\x00WAVEfmt "] {
            match decode_audio(bytes, 30.0) {
                Err(Error::InvalidArgument(m)) => assert!(m.contains("audio"), "{m}"),
                other => panic!("{other:?}"),
            }
        }
    }
}
