//! Gemma 3 image preprocessing against Hugging Face's processor, and bad image bytes.
//!
//! The oracle (tests/oracle/image_preprocess.py, run with the oracle venv) writes images of odd
//! sizes, modes and formats with PIL and the `pixel_values` transformers' Gemma3 image processor
//! computes from them; here mlex decodes the same bytes and preprocesses them, and every value
//! must be within 1/255 of the reference in [0, 1] units (2/255 after the normalisation by std 0.5)
//! (issue 15's bar). PNG, GIF and WebP (lossless and lossy) are held to more: equal, bit for bit,
//! since decoding and PIL's resize (Pillow 12.3, the version scripts/setup-oracle.sh pins) are
//! reproduced exactly. JPEG is the known gap: the image crate's decoder (zune-jpeg) is not libjpeg-turbo
//! (the IDCT rounds differently, and colour images are upsampled from subsampled chroma another
//! way), so decoded JPEG pixels differ by a few levels before any preprocessing; JPEG cases are held
//! to [`JPEG_TOLERANCE`] until mlex decodes JPEG as libjpeg-turbo does.
//! The bad-input tests need no Python: every malformed input is INVALID_ARGUMENT naming the cause,
//! and a header claiming a huge image is refused before anything is allocated for it.
mod common;

use common::{require_oracle, repo_root};
use mlex::media::{decode_image, Gemma3ImageProcessor, MAX_IMAGE_PIXELS};
use mlex::Error;
use std::process::Command;

/// The bound for the processed pixels of JPEG files, in [0, 1] units (measured: 4/255 for colour,
/// 1/255 for grayscale); every other format must be equal.
const JPEG_TOLERANCE: f32 = 5.0 / 255.0;

#[test]
fn gemma3_pixel_values_match_the_hf_processor() {
    let Some(python) = require_oracle("gemma3_pixel_values_match_the_hf_processor") else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(&python)
        .arg(repo_root().join("tests/oracle/image_preprocess.py"))
        .arg(dir.path())
        .output()
        .expect("run the image oracle");
    assert!(
        out.status.success(),
        "tests/oracle/image_preprocess.py failed (does the oracle venv have pillow and transformers? \
         scripts/setup-oracle.sh installs them):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("manifest.json")).unwrap()).unwrap();
    let cases = manifest.as_array().unwrap();
    assert!(cases.len() >= 10, "the oracle wrote {} cases", cases.len());

    let plain = Gemma3ImageProcessor::default();
    let pas = Gemma3ImageProcessor { do_pan_and_scan: true, ..Default::default() };
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let bytes = std::fs::read(dir.path().join(case["image"].as_str().unwrap())).unwrap();
        let proc = if case["pan_and_scan"].as_bool().unwrap() { &pas } else { &plain };
        let got = match proc.preprocess_bytes(&bytes) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let shape: Vec<usize> = case["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
        assert_eq!(got.shape.to_vec(), shape, "{name}: shape");
        assert_eq!(got.num_crops as u64, case["num_crops"].as_u64().unwrap(), "{name}: num_crops");
        let raw = std::fs::read(dir.path().join(case["pixel_values"].as_str().unwrap())).unwrap();
        let want: Vec<f32> = raw.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!(want.len(), got.data.len(), "{name}: element count");
        let (mut max, mut differ, mut sum) = (0f32, 0usize, 0f64);
        for (a, b) in got.data.iter().zip(&want) {
            let d = (a - b).abs();
            if d > 0.0 {
                differ += 1;
            }
            sum += d as f64;
            max = max.max(d);
        }
        let mean_01 = sum / want.len() as f64 * 0.5;
        // std 0.5 doubles a difference in [0, 1] units.
        let max_01 = max * 0.5;
        println!(
            "{name} ({} {}x{}): max |diff| {:.2}/255 in [0,1] units, mean {:.4}/255, {differ} of {} values differ",
            case["pil_mode"].as_str().unwrap(),
            case["size"][0],
            case["size"][1],
            max_01 * 255.0,
            mean_01 * 255.0,
            want.len()
        );
        let jpeg = case["image"].as_str().unwrap().ends_with(".jpg");
        let tolerance = if jpeg { JPEG_TOLERANCE + 1e-6 } else { 0.0 };
        if max_01 > tolerance {
            failures.push(format!("{name}: max |diff| {:.2}/255 in [0,1] units", max_01 * 255.0));
        }
    }
    assert!(failures.is_empty(), "mlex differs from the HF processor:\n{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Bad input

#[track_caller]
fn refused(bytes: &[u8], needle: &str) {
    match decode_image(bytes) {
        Err(e @ Error::InvalidArgument(_)) => {
            assert_eq!(e.code(), "INVALID_ARGUMENT");
            let msg = e.to_string();
            assert!(msg.to_lowercase().contains(&needle.to_lowercase()), "message {msg:?} does not name {needle:?}");
        }
        Err(e) => panic!("expected InvalidArgument naming {needle:?}, got {e:?}"),
        Ok(img) => panic!("expected InvalidArgument naming {needle:?}, got a {}x{} image", img.width, img.height),
    }
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

fn png_chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// A PNG signature and a valid IHDR (8-bit RGB) claiming `w × h`, then an empty IDAT and IEND.
fn png_header(w: u32, h: u32) -> Vec<u8> {
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    png_chunk(&mut out, b"IHDR", &ihdr);
    png_chunk(&mut out, b"IDAT", &[]);
    png_chunk(&mut out, b"IEND", &[]);
    out
}

/// A GIF header whose logical screen and first frame claim `w × h` (16-bit fields), with no data.
fn gif_header(w: u16, h: u16) -> Vec<u8> {
    let mut out = b"GIF89a".to_vec();
    out.extend_from_slice(&w.to_le_bytes());
    out.extend_from_slice(&h.to_le_bytes());
    out.extend_from_slice(&[0, 0, 0]);
    out.push(0x2C);
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&w.to_le_bytes());
    out.extend_from_slice(&h.to_le_bytes());
    out.push(0);
    out.push(0x3B);
    out
}

/// A 2 × 1 indexed PNG (8-bit indices 0 and 1) whose PLTE chunk holds `palette` as given, with a
/// tRNS chunk when `trns` is, and its pixels in a stored (uncompressed) zlib stream.
fn indexed_png(palette: &[u8], trns: Option<&[u8]>) -> Vec<u8> {
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&2u32.to_be_bytes());
    ihdr.extend_from_slice(&1u32.to_be_bytes());
    ihdr.extend_from_slice(&[8, 3, 0, 0, 0]);
    png_chunk(&mut out, b"IHDR", &ihdr);
    png_chunk(&mut out, b"PLTE", palette);
    if let Some(t) = trns {
        png_chunk(&mut out, b"tRNS", t);
    }
    let row = [0u8, 0, 1]; // filter type 0, then the two indices
    let mut idat = vec![0x78, 0x01, 0x01, row.len() as u8, 0, !(row.len() as u8), 0xff];
    idat.extend_from_slice(&row);
    let (a, b) = row.iter().fold((1u32, 0u32), |(a, b), &x| ((a + x as u32) % 65521, (b + a + x as u32) % 65521));
    idat.extend_from_slice(&((b << 16) | a).to_be_bytes());
    png_chunk(&mut out, b"IDAT", &idat);
    png_chunk(&mut out, b"IEND", &[]);
    out
}

fn small_png() -> Vec<u8> {
    use image::ImageEncoder;
    let (w, h) = (64u32, 48u32);
    let px: Vec<u8> = (0..w * h * 3).map(|i| (i * 7 % 251) as u8).collect();
    let mut out = Vec::new();
    image::codecs::png::PngEncoder::new(&mut out).write_image(&px, w, h, image::ExtendedColorType::Rgb8).unwrap();
    out
}

#[test]
fn a_valid_small_png_decodes() {
    let img = decode_image(&small_png()).unwrap();
    assert_eq!((img.width, img.height, img.data.len()), (64, 48, 64 * 48 * 3));
    assert_eq!(&img.data[..6], &[0, 7, 14, 21, 28, 35]);
}

#[test]
fn empty_input_is_refused() {
    refused(&[], "empty");
}

#[test]
fn unknown_bytes_are_refused() {
    let noise: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    refused(&noise, "unknown image format");
    refused(b"RIFF\0\0\0\0WAVEfmt ", "unknown image format"); // audio, not an image
    refused(b"BM\x36\0\0\0\0\0\0\0\x36\0\0\0", "unsupported image format");
}

#[test]
fn truncated_images_are_refused() {
    let png = small_png();
    for cut in [8, 20, 33, 40, png.len() / 2, png.len() - 13] {
        refused(&png[..cut], "png");
    }
    refused(&b"\xff\xd8\xff\xe0\0\x10JFIF\0"[..], "jpeg");
    refused(b"GIF89a\x10\0", "gif");
}

#[test]
fn zero_size_images_are_refused() {
    for (w, h) in [(0, 10), (10, 0), (0, 0)] {
        refused(&png_header(w, h), "png");
        refused(&gif_header(w as u16, h as u16), "gif");
    }
}

#[test]
fn palettes_of_partial_entries_are_refused() {
    // Found by fuzz/'s media_image target (corpus/media_image/regress-png-palette-length): png
    // 0.18.1 accepts a PLTE chunk of any length in 3..=768 and panicked expanding the pixels
    // through one that is not a whole number of RGB entries.
    let good = decode_image(&indexed_png(&[10, 20, 30, 40, 50, 60], None)).unwrap();
    assert_eq!(good.data, [10, 20, 30, 40, 50, 60]);
    let seen = decode_image(&indexed_png(&[10, 20, 30, 40, 50, 60], Some(&[0]))).unwrap();
    assert_eq!(seen.data, [255, 255, 255, 40, 50, 60]); // index 0 transparent: white
    for len in [4, 5, 7, 8, 26, 767] {
        let palette: Vec<u8> = (0..len).map(|i| i as u8).collect();
        refused(&indexed_png(&palette, None), "palette (PLTE chunk)");
        refused(&indexed_png(&palette, Some(&[0])), "palette (PLTE chunk)");
    }
}

#[test]
fn jpeg_chroma_sampled_finer_than_luma_is_refused() {
    // Found by fuzz/'s media_image target: zune-jpeg 0.5.15 panicked in its AVX2 IDCT on this
    // frame (2 × 2 luma, a third component of 4 × 1 blocks per MCU).
    let bytes = std::fs::read(repo_root().join("tests/fixtures/jpeg_chroma_finer_than_luma.jpg")).unwrap();
    refused(&bytes, "more finely than the first component's 2x2");
    // The frame header (SOF0) holds each component's sampling byte at 11, 14 and 17.
    let sof = bytes.windows(4).position(|w| w == b"\xff\xc0\x00\x11").unwrap();
    assert_eq!([bytes[sof + 11], bytes[sof + 14], bytes[sof + 17]], [0x22, 0x11, 0x41]);
    for (factors, refused_too) in [([0x11, 0x11, 0x44], true), ([0x22, 0x11, 0x14], true), ([0x22, 0x22, 0x11], false)] {
        let mut b = bytes.clone();
        (b[sof + 11], b[sof + 14], b[sof + 17]) = (factors[0], factors[1], factors[2]);
        match decode_image(&b) {
            Err(Error::InvalidArgument(msg)) => assert_eq!(msg.contains("more finely"), refused_too, "{factors:x?}: {msg}"),
            Err(e) => panic!("{factors:x?}: {e:?}"),
            Ok(_) => assert!(!refused_too, "{factors:x?} decoded"),
        }
    }
}

#[test]
fn huge_headers_are_refused_before_allocating() {
    // 20k × 20k is 400 M pixels (1.2 GB of RGB): refused from the header alone, at once.
    let t = std::time::Instant::now();
    refused(&png_header(20_000, 20_000), "too large");
    refused(&gif_header(20_000, 20_000), "too large");
    refused(&png_header(8193, 8193), "too large");
    refused(&png_header(1, 100_000), "png"); // a side over the decoder's limit
    assert!(t.elapsed().as_secs_f64() < 2.0, "refusing huge headers took {:?}", t.elapsed());
    const { assert!(8192 * 8192 <= MAX_IMAGE_PIXELS) };
}

#[test]
fn the_processor_reads_a_preprocessor_config() {
    let cfg = serde_json::json!({
        "do_convert_rgb": null, "do_normalize": true, "do_pan_and_scan": null, "do_rescale": true,
        "do_resize": true, "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor",
        "image_seq_length": 256, "image_std": [0.5, 0.5, 0.5], "pan_and_scan_max_num_crops": 4,
        "pan_and_scan_min_crop_size": 256, "pan_and_scan_min_ratio_to_activate": 1.2,
        "processor_class": "Gemma3Processor", "resample": 2, "rescale_factor": 0.00392156862745098,
        "size": {"height": 896, "width": 896}
    });
    assert_eq!(Gemma3ImageProcessor::from_preprocessor_config(&cfg).unwrap(), Gemma3ImageProcessor::default());
    let bicubic = serde_json::json!({"resample": 3});
    assert!(matches!(Gemma3ImageProcessor::from_preprocessor_config(&bicubic), Err(Error::InvalidArgument(_))));
}
