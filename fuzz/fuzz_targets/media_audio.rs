//! Fuzzes audio decoding (src/media/audio.rs: `decode_audio` over WAV, FLAC and MP3 bytes through
//! symphonia under mlex's byte and duration bounds), the resampler that follows it (scipy's
//! `resample_poly` written out) and Gemma 4's log-mel features (src/media/audio_features.rs).
//! Audio bytes come from callers, so no input may panic, hang or allocate past the bound: bad
//! bytes are `InvalidArgument` with a message. A decoded clip is non-empty, finite, at a rate in
//! 1 kHz–384 kHz and no longer than the bound (2 s here, to keep each input fast); resampled to
//! 16 kHz it has ceil(n · 16000 / rate) samples, and its features one finite row of 128 bins per
//! frame with one mask entry each.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mlex_fuzz::error::Error;
use mlex_fuzz::media::{decode_audio, resample_poly, Gemma4AudioFeatureExtractor};

fuzz_target!(|data: &[u8]| {
    match decode_audio(data, 2.0) {
        Ok(w) => {
            assert!(!w.samples.is_empty());
            assert!((1000..=384_000).contains(&w.sample_rate));
            assert!(w.samples.len() as f64 <= (2.0 * w.sample_rate as f64).ceil());
            assert!(w.samples.iter().all(|s| s.is_finite()));
            let y = resample_poly(&w.samples, w.sample_rate, 16_000);
            let g = gcd(w.sample_rate as u64, 16_000);
            let (up, down) = (16_000 / g, w.sample_rate as u64 / g);
            assert_eq!(y.len() as u64, (w.samples.len() as u64 * up).div_ceil(down));
            let f = Gemma4AudioFeatureExtractor::default().extract(&y);
            assert_eq!(f.data.len(), f.frames * f.bins);
            assert_eq!(f.mask.len(), f.frames);
            assert!(f.data.iter().all(|v| v.is_finite()));
        }
        Err(Error::InvalidArgument(m)) => assert!(!m.is_empty()),
        Err(e) => panic!("not InvalidArgument: {e:?}"),
    }
});

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
