//! Animated images as videos: an animated GIF, animated WebP or APNG given where a video goes is
//! decoded into its frames with the `image` crate's animation decoders, each frame composited by
//! the decoder onto the full canvas (disposal and blending as the format says), flattened to RGB
//! over white as an image is ([`super::decode_image`]), and kept with its presentation time.
//!
//! Times: frame `i` starts at the sum of the delays before it and ends at that plus its own delay
//! (the video's duration is the sum of all delays), summed in milliseconds (exact for GIF's
//! centiseconds and WebP's milliseconds). A delay of at most 10 ms (GIF's 0 and 1 centisecond,
//! which encoders write for "as fast as possible") is taken as 100 ms, as browsers play GIFs
//! (Firefox, Chromium); the same rule is applied to WebP and APNG frames.
//!
//! A still image (PNG, JPEG, a one-frame GIF or WebP) is a one-frame video at time 0.
//!
//! Real video containers (MP4 / MOV, WebM / MKV, AVI, MPEG-TS, FLV, Ogg) are refused: mlex decodes
//! no video codec (there is no pure-Rust H.264 / HEVC / VP9 / AV1 decoder fit for this, and the C
//! codec libraries bring patent-licensing and build-size costs); the caller passes frames.
//!
//! Bounds, checked while decoding (frames are pulled one at a time, each dropped once encoded):
//! the canvas at most [`MAX_IMAGE_PIXELS`] pixels, at most `max_frames` frames (a GIF with more is
//! refused when frame `max_frames + 1` is read, the rest never decoded), the kept frames (PNG,
//! fast compression) at most `max_bytes` bytes together, and the decoded pixels at most
//! [`MAX_DECODED_BYTES`] bytes of RGB together.
use std::io::Cursor;

use image::codecs::gif::GifDecoder;
use image::codecs::png::{CompressionType, FilterType, PngDecoder, PngEncoder};
use image::codecs::webp::WebPDecoder;
use image::{AnimationDecoder, DynamicImage, Frames, ImageDecoder, ImageEncoder, Limits};

// Through `crate::media` (not `super::image`): the fuzz crate compiles this file on its own.
use crate::error::{Error, Result};
use crate::media::{check_png_palette, image_size, to_rgb, MAX_IMAGE_PIXELS};

/// The most RGB bytes an animation's frames may decode to together (each frame is dropped once
/// encoded: this bounds the work, not the memory).
pub const MAX_DECODED_BYTES: u64 = 4 << 30;

/// A delay at most this (milliseconds) is played as [`SHORT_DELAY_AS_MS`].
pub const SHORT_DELAY_MS: f64 = 10.0;
/// What a too short delay is played as (milliseconds).
pub const SHORT_DELAY_AS_MS: f64 = 100.0;

/// One decoded frame: a PNG of its RGB pixels, and when it is shown (seconds).
#[derive(Debug, Clone)]
pub struct AnimationFrame {
    pub png: Vec<u8>,
    pub start: f64,
    pub end: f64,
}

/// What a video part's single file is.
#[derive(Debug)]
pub enum Animation {
    /// A still image: a one-frame video of the bytes as given.
    Still,
    /// An animation's frames, in order.
    Frames(Vec<AnimationFrame>),
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

/// The container a video file's header names, if it is one mlex refuses.
pub fn video_container(bytes: &[u8]) -> Option<&'static str> {
    let at = |from: usize, tag: &[u8]| bytes.get(from..from + tag.len()) == Some(tag);
    if at(4, b"ftyp") || at(4, b"moov") || at(4, b"mdat") || at(4, b"wide") || at(4, b"free") {
        Some("MP4/MOV")
    } else if at(0, &[0x1A, 0x45, 0xDF, 0xA3]) {
        Some("WebM/MKV")
    } else if at(0, b"RIFF") && at(8, b"AVI ") {
        Some("AVI")
    } else if at(0, b"FLV") {
        Some("FLV")
    } else if at(0, b"OggS") {
        Some("Ogg")
    } else if bytes.len() >= 189 && bytes[0] == 0x47 && bytes[188] == 0x47 {
        Some("MPEG-TS")
    } else if at(0, &[0, 0, 1, 0xBA]) || at(0, &[0, 0, 1, 0xB3]) {
        Some("MPEG-PS")
    } else {
        None
    }
}

/// The message for a video container mlex refuses.
pub fn no_codec(container: &str) -> String {
    format!(
        "this is a {container} video file, and mlex decodes no video codecs: pass the video's frames, \
         {{\"type\": \"video\", \"video\": [frame, ...]}} (each an image), or an animated GIF, WebP or PNG"
    )
}

/// Decodes the frames of an animated GIF, WebP or PNG (APNG); anything else the image decoder
/// takes is [`Animation::Still`]. Errors are InvalidArgument, never a panic.
pub fn decode_animation(bytes: &[u8], max_frames: usize, max_bytes: usize) -> Result<Animation> {
    if bytes.is_empty() {
        return Err(invalid("the video file is empty (0 bytes)"));
    }
    if let Some(c) = video_container(bytes) {
        return Err(invalid(no_codec(c)));
    }
    // The decoders' panics (none known on these paths) become errors, not aborted requests.
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode(bytes, max_frames, max_bytes))) {
        Ok(r) => r,
        Err(_) => Err(invalid("the animated image could not be decoded (its decoder failed)")),
    }
}

fn limits() -> Limits {
    let mut l = Limits::default();
    l.max_image_width = Some(65_535);
    l.max_image_height = Some(65_535);
    l.max_alloc = Some(MAX_IMAGE_PIXELS * 8 + (64 << 20));
    l
}

fn decode(bytes: &[u8], max_frames: usize, max_bytes: usize) -> Result<Animation> {
    let cursor = || Cursor::new(bytes);
    fn bad(what: &'static str) -> impl Fn(image::ImageError) -> Error {
        move |e| invalid(format!("cannot decode the {what}: {e}"))
    }
    if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        let mut d = GifDecoder::new(cursor()).map_err(bad("GIF"))?;
        d.set_limits(limits()).map_err(bad("GIF"))?;
        let size = checked_size("GIF", d.dimensions())?;
        return frames("GIF", d.into_frames(), size, max_frames, max_bytes);
    }
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        check_png_palette(bytes)?;
        let mut d = PngDecoder::new(cursor()).map_err(bad("PNG"))?;
        d.set_limits(limits()).map_err(bad("PNG"))?;
        let size = checked_size("PNG", d.dimensions())?;
        if !d.is_apng().map_err(bad("PNG"))? {
            return Ok(Animation::Still);
        }
        let a = d.apng().map_err(bad("APNG"))?;
        return frames("APNG", a.into_frames(), size, max_frames, max_bytes);
    }
    if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        let mut d = WebPDecoder::new(cursor()).map_err(bad("WebP"))?;
        d.set_limits(limits()).map_err(bad("WebP"))?;
        let size = checked_size("WebP", d.dimensions())?;
        if !d.has_animation() {
            return Ok(Animation::Still);
        }
        return frames("WebP", d.into_frames(), size, max_frames, max_bytes);
    }
    // JPEG or anything else: a still image, if the image decoder takes it.
    image_size(bytes).map_err(|e| match e {
        Error::InvalidArgument(m) => invalid(format!(
            "not an image or animated image ({m}); a video part's file must be an animated GIF, WebP or PNG, or a still image"
        )),
        other => other,
    })?;
    Ok(Animation::Still)
}

fn checked_size(format: &str, (w, h): (u32, u32)) -> Result<(u32, u32)> {
    if w == 0 || h == 0 {
        return Err(invalid(format!("the {format} is empty ({w}x{h} pixels)")));
    }
    if w as u64 * h as u64 > MAX_IMAGE_PIXELS {
        return Err(invalid(format!("the {format}'s {w}x{h} frames are too large (at most {MAX_IMAGE_PIXELS} pixels)")));
    }
    Ok((w, h))
}

/// A frame's delay in milliseconds, short ones played as browsers play them.
pub fn played_delay_ms(numer: u32, denom: u32) -> f64 {
    let ms = if denom == 0 { 0.0 } else { numer as f64 / denom as f64 };
    if ms <= SHORT_DELAY_MS {
        SHORT_DELAY_AS_MS
    } else {
        ms
    }
}

fn frames(format: &str, frames: Frames<'_>, (w, h): (u32, u32), max_frames: usize, max_bytes: usize) -> Result<Animation> {
    let mut out: Vec<AnimationFrame> = vec![];
    let (mut at_ms, mut bytes, mut decoded) = (0f64, 0usize, 0u64);
    for (i, frame) in frames.enumerate() {
        if i >= max_frames {
            return Err(invalid(format!("the {format} has more than {max_frames} frames (at most {max_frames} are taken)")));
        }
        let frame = frame.map_err(|e| invalid(format!("cannot decode frame {i} of the {format}: {e}")))?;
        let (numer, denom) = frame.delay().numer_denom_ms();
        let delay = played_delay_ms(numer, denom);
        let buffer = frame.into_buffer();
        if buffer.dimensions() != (w, h) {
            return Err(invalid(format!(
                "frame {i} of the {format} is {}x{}, not the canvas's {w}x{h}",
                buffer.width(),
                buffer.height()
            )));
        }
        decoded += w as u64 * h as u64 * 3;
        if decoded > MAX_DECODED_BYTES {
            return Err(invalid(format!("the {format}'s frames decode to more than {MAX_DECODED_BYTES} bytes")));
        }
        let rgb = to_rgb(DynamicImage::ImageRgba8(buffer));
        let mut png = Vec::with_capacity(rgb.data.len() / 4 + 64);
        PngEncoder::new_with_quality(&mut png, CompressionType::Fast, FilterType::Adaptive)
            .write_image(&rgb.data, w, h, image::ExtendedColorType::Rgb8)
            .map_err(|e| Error::Mlx(format!("re-encoding frame {i} of the {format}: {e}")))?;
        bytes += png.len();
        if bytes > max_bytes {
            return Err(invalid(format!("the {format}'s frames hold more than {max_bytes} bytes")));
        }
        let start = at_ms;
        at_ms += delay;
        out.push(AnimationFrame { png, start: start / 1000.0, end: at_ms / 1000.0 });
    }
    if out.is_empty() {
        return Err(invalid(format!("the {format} has no frames")));
    }
    Ok(Animation::Frames(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::codecs::gif::GifEncoder;
    use image::{Delay, Frame, RgbaImage};

    pub(crate) fn gif(frames: &[(RgbaImage, u32)]) -> Vec<u8> {
        let mut out = vec![];
        {
            let mut enc = GifEncoder::new(&mut out);
            for (img, ms) in frames {
                enc.encode_frame(Frame::from_parts(img.clone(), 0, 0, Delay::from_numer_denom_ms(*ms, 1))).unwrap();
            }
        }
        out
    }

    fn solid(w: u32, h: u32, c: [u8; 4]) -> RgbaImage {
        RgbaImage::from_pixel(w, h, image::Rgba(c))
    }

    fn err(bytes: &[u8]) -> String {
        match decode_animation(bytes, 8, 1 << 20) {
            Err(Error::InvalidArgument(m)) => m,
            other => panic!("not an InvalidArgument: {other:?}"),
        }
    }

    #[test]
    fn gif_frames_and_times() {
        let g = gif(&[(solid(6, 4, [255, 0, 0, 255]), 500), (solid(6, 4, [0, 0, 255, 255]), 250), (solid(6, 4, [0, 255, 0, 0]), 0)]);
        let Animation::Frames(f) = decode_animation(&g, 8, 1 << 20).unwrap() else { panic!("still") };
        assert_eq!(f.len(), 3);
        let times: Vec<(f64, f64)> = f.iter().map(|f| (f.start, f.end)).collect();
        // The 0 delay is played as 100 ms.
        assert_eq!(times, [(0.0, 0.5), (0.5, 0.75), (0.75, 0.85)]);
        let px = crate::media::decode_image(&f[1].png).unwrap();
        assert_eq!((px.width, px.height, &px.data[..3]), (6, 4, &[0, 0, 255][..]));
        // The encoder disposes each frame to the background: a transparent frame is flattened
        // over white.
        let px = crate::media::decode_image(&f[2].png).unwrap();
        assert_eq!(&px.data[..3], &[255, 255, 255]);
        assert_eq!((played_delay_ms(1, 100), played_delay_ms(20, 1), played_delay_ms(0, 0)), (100.0, 20.0, 100.0));
    }

    #[test]
    fn webp_and_png_stills_and_jpeg() {
        let img = DynamicImage::ImageRgb8(image::RgbImage::from_pixel(5, 3, image::Rgb([9, 8, 7])));
        for fmt in [image::ImageFormat::Png, image::ImageFormat::WebP, image::ImageFormat::Jpeg] {
            let mut b = Cursor::new(vec![]);
            img.write_to(&mut b, fmt).unwrap();
            assert!(matches!(decode_animation(b.get_ref(), 8, 1 << 20).unwrap(), Animation::Still), "{fmt:?}");
        }
        // A one-frame GIF is a one-frame animation.
        let g = gif(&[(solid(2, 2, [1, 2, 3, 255]), 100)]);
        let Animation::Frames(f) = decode_animation(&g, 8, 1 << 20).unwrap() else { panic!("still") };
        assert_eq!((f.len(), f[0].start, f[0].end), (1, 0.0, 0.1));
    }

    #[test]
    fn apng_frames() {
        // Hand-built: an APNG of two 2x1 RGB frames (acTL, fcTL, IDAT, fcTL, fdAT).
        let apng = apng_bytes(&[([255, 0, 0], 300), ([0, 255, 0], 0)]);
        let Animation::Frames(f) = decode_animation(&apng, 8, 1 << 20).unwrap() else { panic!("still") };
        assert_eq!(f.iter().map(|f| (f.start, f.end)).collect::<Vec<_>>(), [(0.0, 0.3), (0.3, 0.4)]);
        let px = crate::media::decode_image(&f[1].png).unwrap();
        assert_eq!(&px.data[..], &[0, 255, 0, 0, 255, 0]);
    }

    /// An APNG of 2x1 RGB frames, each one colour, with delays in ms.
    pub(crate) fn apng_bytes(frames: &[([u8; 3], u16)]) -> Vec<u8> {
        fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
            out.extend((data.len() as u32).to_be_bytes());
            let mut crc_in = kind.to_vec();
            crc_in.extend(data);
            out.extend(&crc_in);
            out.extend(crc32(&crc_in).to_be_bytes());
        }
        fn crc32(b: &[u8]) -> u32 {
            let mut c = !0u32;
            for &x in b {
                c ^= x as u32;
                for _ in 0..8 {
                    c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
                }
            }
            !c
        }
        fn zlib_stored(raw: &[u8]) -> Vec<u8> {
            let mut z = vec![0x78, 0x01, 1];
            z.extend((raw.len() as u16).to_le_bytes());
            z.extend((!(raw.len() as u16)).to_le_bytes());
            z.extend(raw);
            let (mut a, mut b) = (1u32, 0u32);
            for &x in raw {
                a = (a + x as u32) % 65521;
                b = (b + a) % 65521;
            }
            z.extend(((b << 16) | a).to_be_bytes());
            z
        }
        let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
        chunk(&mut out, b"IHDR", &[0, 0, 0, 2, 0, 0, 0, 1, 8, 2, 0, 0, 0]);
        let mut actl = (frames.len() as u32).to_be_bytes().to_vec();
        actl.extend(0u32.to_be_bytes());
        chunk(&mut out, b"acTL", &actl);
        let mut seq = 0u32;
        for (k, (c, ms)) in frames.iter().enumerate() {
            let mut fctl = seq.to_be_bytes().to_vec();
            seq += 1;
            for v in [2u32, 1, 0, 0] {
                fctl.extend(v.to_be_bytes());
            }
            fctl.extend(ms.to_be_bytes());
            fctl.extend(1000u16.to_be_bytes());
            fctl.extend([0, 0]);
            chunk(&mut out, b"fcTL", &fctl);
            let data = zlib_stored(&[0, c[0], c[1], c[2], c[0], c[1], c[2]]);
            if k == 0 {
                chunk(&mut out, b"IDAT", &data);
            } else {
                let mut fdat = seq.to_be_bytes().to_vec();
                seq += 1;
                fdat.extend(data);
                chunk(&mut out, b"fdAT", &fdat);
            }
        }
        chunk(&mut out, b"IEND", &[]);
        out
    }

    /// An animated WebP of `w x h` frames, each one opaque colour (lossless, from the `image`
    /// crate's still encoder, wrapped in ANMF chunks), with delays in ms.
    pub(crate) fn webp_bytes(w: u32, h: u32, frames: &[([u8; 3], u32)]) -> Vec<u8> {
        fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
            out.extend(kind);
            out.extend((data.len() as u32).to_le_bytes());
            out.extend(data);
            if data.len() % 2 == 1 {
                out.push(0);
            }
        }
        let u24 = |v: u32| v.to_le_bytes()[..3].to_vec();
        let mut body = b"WEBP".to_vec();
        let mut vp8x = vec![0x02, 0, 0, 0];
        vp8x.extend(u24(w - 1));
        vp8x.extend(u24(h - 1));
        chunk(&mut body, b"VP8X", &vp8x);
        chunk(&mut body, b"ANIM", &[255, 255, 255, 255, 0, 0]);
        for (c, ms) in frames {
            let img = DynamicImage::ImageRgb8(image::RgbImage::from_pixel(w, h, image::Rgb(*c)));
            let mut still = Cursor::new(vec![]);
            img.write_to(&mut still, image::ImageFormat::WebP).unwrap();
            let still = still.into_inner();
            assert_eq!(&still[12..16], b"VP8L");
            let mut anmf = [u24(0), u24(0), u24(w - 1), u24(h - 1), u24(*ms)].concat();
            anmf.push(0b10); // no blending, no disposal
            anmf.extend(&still[12..]);
            chunk(&mut body, b"ANMF", &anmf);
        }
        let mut out = b"RIFF".to_vec();
        out.extend((body.len() as u32).to_le_bytes());
        out.extend(body);
        out
    }

    #[test]
    fn webp_frames() {
        let w = webp_bytes(3, 2, &[([200, 10, 10], 40), ([10, 10, 200], 5)]);
        let Animation::Frames(f) = decode_animation(&w, 8, 1 << 20).unwrap() else { panic!("still") };
        assert_eq!(f.iter().map(|f| (f.start, f.end)).collect::<Vec<_>>(), [(0.0, 0.04), (0.04, 0.14)]);
        let px = crate::media::decode_image(&f[1].png).unwrap();
        assert_eq!((px.width, px.height, &px.data[..3]), (3, 2, &[10, 10, 200][..]));
        let m = err(&w[..w.len() - 9]);
        assert!(m.contains("WebP"), "{m}");
    }

    #[test]
    fn bad_inputs_are_refused() {
        let g = gif(&[(solid(4, 4, [255, 0, 0, 255]), 100), (solid(4, 4, [0, 0, 255, 255]), 100)]);
        // Truncated: the first frame's data cut.
        let m = err(&g[..g.len() - 12]);
        assert!(m.contains("GIF"), "{m}");
        // Too many frames: refused when the ninth is read.
        let many: Vec<_> = (0..20).map(|k| (solid(2, 2, [k as u8 * 10, 0, 0, 255]), 100)).collect();
        let m = err(&gif(&many));
        assert!(m.contains("more than 8 frames"), "{m}");
        // Too many bytes.
        let m = match decode_animation(&g, 8, 10) {
            Err(Error::InvalidArgument(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(m.contains("more than 10 bytes"), "{m}");
        // An MP4 header, WebM, AVI.
        let mut mp4 = vec![0, 0, 0, 0x20];
        mp4.extend(b"ftypisom\0\0\x02\0isomiso2avc1mp41");
        let m = err(&mp4);
        assert!(m.contains("MP4") && m.contains("decodes no video codecs") && m.contains("animated GIF"), "{m}");
        assert!(err(&[0x1A, 0x45, 0xDF, 0xA3, 1, 2, 3]).contains("WebM"));
        assert!(err(b"RIFF\0\0\0\0AVI LIST").contains("AVI"));
        // A zero-size GIF (logical screen 0x0).
        let mut zero = b"GIF89a".to_vec();
        zero.extend([0, 0, 0, 0, 0, 0, 0, 0x3B]);
        let m = err(&zero);
        assert!(m.contains("GIF"), "{m}");
        assert!(err(b"").contains("empty"));
        assert!(err(b"hello, world").contains("not an image"));
        // Truncated APNG.
        let a = apng_bytes(&[([1, 2, 3], 100), ([4, 5, 6], 100)]);
        assert!(decode_animation(&a[..a.len() - 30], 8, 1 << 20).is_err());
    }

    /// The fuzz seeds written by Pillow (an APNG and a lossless animated WebP of two 6x4 frames,
    /// 100 ms and 0 ms) and its two-frame GIF.
    #[test]
    fn pillow_animations_decode() {
        let seed = |name: &str| std::fs::read(format!("{}/fuzz/corpus/media_image/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        for name in ["seed-apng", "seed-webp-animated"] {
            let Animation::Frames(f) = decode_animation(&seed(name), 8, 1 << 20).unwrap() else { panic!("{name}: still") };
            assert_eq!(f.iter().map(|f| (f.start, f.end)).collect::<Vec<_>>(), [(0.0, 0.1), (0.1, 0.2)], "{name}");
            let px: Vec<_> = f.iter().map(|f| crate::media::decode_image(&f.png).unwrap()).collect();
            assert_eq!((px[0].width, px[0].height), (6, 4), "{name}");
            // (libwebp's animation encoder gives one frame's blue as 254.)
            let near = |a: &[u8], b: [u8; 3]| a.iter().zip(b).all(|(&x, y)| x.abs_diff(y) <= 1);
            assert!(near(&px[0].data[..3], [255, 0, 0]) && near(&px[1].data[..3], [0, 0, 255]), "{name}");
        }
        let Animation::Frames(f) = decode_animation(&seed("seed-gif-animated"), 8, 1 << 20).unwrap() else { panic!("gif: still") };
        assert_eq!(f.len(), 2);
    }

    /// A GIF of 10,000 frames is refused at frame 1025 (mlex's bound), never decoded whole.
    #[test]
    fn ten_thousand_frames_are_refused_early() {
        let mut g = b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff".to_vec();
        // Each frame: a graphic control extension (10 cs) and a 1x1 image of index 0.
        let frame = b"\x21\xf9\x04\x00\x0a\x00\x00\x00\x2c\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02\x44\x01\x00";
        for _ in 0..10_000 {
            g.extend(frame);
        }
        g.push(0x3b);
        let m = match decode_animation(&g, crate::chat::media::MAX_VIDEO_FRAMES, 1 << 30) {
            Err(Error::InvalidArgument(m)) => m,
            other => panic!("{:?}", other.map(|_| ())),
        };
        assert!(m.contains("more than 1024 frames"), "{m}");
        // 1024 of them are taken.
        let cut = 13 + 6 + 1024 * frame.len();
        let mut ok = g[..cut].to_vec();
        ok.push(0x3b);
        let Animation::Frames(f) = decode_animation(&ok, 1024, 1 << 30).unwrap() else { panic!("still") };
        assert_eq!((f.len(), f[1023].end), (1024, 102.4));
    }

    #[test]
    fn a_huge_canvas_is_refused_before_decoding() {
        // A GIF whose logical screen is 65535 x 65535.
        let mut g = b"GIF89a".to_vec();
        g.extend([0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0x3B]);
        let m = err(&g);
        assert!(m.contains("too large") || m.contains("GIF"), "{m}");
    }
}
