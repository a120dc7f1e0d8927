//! Fuzzes image decoding (src/media/image.rs: `decode_image` over PNG, JPEG, WebP and GIF bytes,
//! through the `image` crate under mlex's size and allocation limits) and the Gemma 3
//! preprocessing that follows it (RGB conversion, PIL's BILINEAR resize, pan-and-scan crops,
//! normalisation). Image bytes come from callers, so no input may panic, hang or allocate past the
//! bound: bad bytes are `InvalidArgument` with a message. A decoded image is non-empty, within the
//! size bounds and holds exactly width × height × 3 bytes; its preprocessing succeeds with the
//! processor's shape, finite values in [-1, 1], and every resized pixel within the source's range
//! per channel (the triangle filter's weights are non-negative). The processor here is small
//! (14 × 10, crops from 8 pixels) so each input stays fast and elongated images get crops.
//!
//! An input whose header declares more than [`FUZZ_MAX_PIXELS`] pixels but no more than mlex's
//! bound is skipped: a few hundred bytes of JPEG claiming 239 × 62,991 pixels decode (zeros past
//! the data) in about a second, and the fuzzer breeds such inputs until they are most of what it
//! runs (1,250 inputs/s instead of thousands). Decoding them is the same code as decoding a small
//! image; headers past the bound still go through `decode_image` (refused), and 2^18 pixels still
//! admits a side of 65,535 (4 × 65,535).
//!
//! The same bytes also go through the animated path (src/media/animation.rs: a video part given
//! as one animated GIF, WebP or PNG), with small bounds (16 frames, 4 MiB of frames): it returns
//! a still, or frames in order, each timed (start not before the last one's, a positive delay)
//! and re-encoded as a PNG that decodes to the canvas's size; or `InvalidArgument`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mlex_fuzz::error::Error;
use mlex_fuzz::media::animation::{decode_animation, Animation};
use mlex_fuzz::media::{decode_image, Gemma3ImageProcessor, MAX_IMAGE_PIXELS};
use std::io::Cursor;

/// The most pixels an input's header may declare for it to be decoded here (see above).
const FUZZ_MAX_PIXELS: u64 = 1 << 18;

/// width × height as the header declares it, when the format is known and the header parses.
fn declared_pixels(data: &[u8]) -> Option<u64> {
    let reader = image::ImageReader::new(Cursor::new(data)).with_guessed_format().ok()?;
    let (w, h) = reader.into_dimensions().ok()?;
    Some(w as u64 * h as u64)
}

fuzz_target!(|data: &[u8]| {
    if declared_pixels(data).is_some_and(|n| n > FUZZ_MAX_PIXELS && n <= MAX_IMAGE_PIXELS) {
        return;
    }
    match decode_animation(data, 16, 4 << 20) {
        Ok(Animation::Still) => {}
        Ok(Animation::Frames(frames)) => {
            assert!(!frames.is_empty() && frames.len() <= 16, "{} frames", frames.len());
            let mut last = 0.0;
            let mut size = None;
            for (i, f) in frames.iter().enumerate() {
                assert!(f.start.is_finite() && f.end.is_finite() && f.start >= last && f.end > f.start, "frame {i}: {} .. {}", f.start, f.end);
                last = f.start;
                let px = decode_image(&f.png).expect("a re-encoded frame decodes");
                assert_eq!(px.data.len() as u64, px.width as u64 * px.height as u64 * 3);
                assert!(size.is_none_or(|s| s == (px.width, px.height)), "frame {i} changes size");
                size = Some((px.width, px.height));
            }
        }
        Err(Error::InvalidArgument(msg)) => assert!(!msg.is_empty()),
        Err(e) => panic!("bad animation bytes must be InvalidArgument, got {e:?}"),
    }
    let img = match decode_image(data) {
        Ok(img) => img,
        Err(Error::InvalidArgument(msg)) => {
            assert!(!msg.is_empty());
            return;
        }
        Err(e) => panic!("bad image bytes must be InvalidArgument, got {e:?}"),
    };
    let (w, h) = (img.width as u64, img.height as u64);
    assert!(w > 0 && h > 0, "empty image {w}x{h}");
    assert!(w <= 65_535 && h <= 65_535 && w * h <= MAX_IMAGE_PIXELS, "image of {w}x{h} past the bounds");
    assert_eq!(img.data.len() as u64, w * h * 3, "{w}x{h}");

    // Per-channel range of the source: every resized (and cropped) pixel lies within it.
    let (mut lo, mut hi) = ([255u8; 3], [0u8; 3]);
    for px in img.data.chunks_exact(3) {
        for c in 0..3 {
            lo[c] = lo[c].min(px[c]);
            hi[c] = hi[c].max(px[c]);
        }
    }

    let p = Gemma3ImageProcessor {
        height: 14,
        width: 10,
        do_pan_and_scan: true,
        pan_and_scan_min_crop_size: 8,
        pan_and_scan_max_num_crops: 4,
        ..Default::default()
    };
    let out = p.preprocess(&img).expect("a decoded image preprocesses");
    let n = 1 + out.num_crops;
    assert!(out.num_crops <= 4, "{} crops", out.num_crops);
    assert_eq!(out.shape, [n, 3, 14, 10]);
    assert_eq!(out.data.len(), n * 3 * 14 * 10);
    let plane = 14 * 10;
    for (i, &v) in out.data.iter().enumerate() {
        assert!(v.is_finite() && (-1.0..=1.0).contains(&v), "value {v} at {i}");
        // (x / 255 − 0.5) / 0.5 back to the 8-bit level x.
        let level = ((v + 1.0) * 127.5).round() as i32;
        let c = i / plane % 3;
        assert!(
            (lo[c] as i32 - 1..=hi[c] as i32 + 1).contains(&level),
            "level {level} of channel {c} outside the source's {}..={}",
            lo[c],
            hi[c]
        );
    }
});
