//! Images for vision models: decoding caller bytes into RGB pixels, with bounds checked before any
//! pixel buffer exists, and Gemma 3's image preprocessing (transformers' `Gemma3ImageProcessor`,
//! PIL backend) reproduced bit for bit: RGB conversion (transparency composited onto white),
//! PIL's antialiased BILINEAR resize in 8-bit fixed point, rescale by 1/255, normalisation.
//!
//! Why our own resize: the model was trained on what PIL's `Image.resize(.., BILINEAR)` produces,
//! which is not textbook bilinear interpolation: on a downscale the triangle filter's support
//! widens with the scale factor (an antialiasing convolution), the two passes are separable
//! (horizontal, then vertical) with an 8-bit intermediate, and the weights are fixed point with
//! 22 fractional bits. The image crate's resize differs from that by several levels per pixel;
//! this one matches it exactly (tests/image_preprocess.rs compares against the HF processor) with
//! Pillow 12.x, pass order included (see [`resize_bilinear`]). Pillow 13 runs the vertical pass
//! first for many more shapes, one level of rounding apart in some pixels; the oracle pins 12.3.
//!
//! JPEG decoding is the known gap: the image crate's decoder is not libjpeg-turbo (PIL's), so JPEG
//! pixels differ by a few levels before preprocessing (measured after it: up to 4/255 for colour,
//! 1/255 for grayscale). PNG, GIF and WebP decode identically.
use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageReader, Limits};

use crate::error::{Error, Result};

/// The most pixels (width × height) an image may have: 64 Mi pixels (8192 × 8192). Larger images
/// are refused from their header, before anything is decoded.
pub const MAX_IMAGE_PIXELS: u64 = 64 * 1024 * 1024;

/// The longest side accepted (a 1 × 64k strip is fine; the pixel count bounds the rest).
const MAX_IMAGE_SIDE: u32 = 65_535;

/// An 8-bit RGB image, row-major, `data.len() == width * height * 3` (HWC, as `np.array(pil)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    pub width: u32,
    pub height: u32,
    pub data: Vec<u8>,
}

impl RgbImage {
    /// An image from raw HWC RGB bytes; InvalidArgument when the length does not match.
    pub fn from_raw(width: u32, height: u32, data: Vec<u8>) -> Result<RgbImage> {
        if width == 0 || height == 0 {
            return Err(Error::InvalidArgument(format!("image is empty ({width}x{height} pixels)")));
        }
        let want = width as u64 * height as u64 * 3;
        if data.len() as u64 != want {
            return Err(Error::InvalidArgument(format!(
                "RGB image of {width}x{height} needs {want} bytes, got {}",
                data.len()
            )));
        }
        Ok(RgbImage { width, height, data })
    }

    /// The pixel rows `y0..y1` and columns `x0..x1` (clamped to the image) as a new image.
    fn crop(&self, x0: u32, y0: u32, x1: u32, y1: u32) -> RgbImage {
        let (x1, y1) = (x1.min(self.width), y1.min(self.height));
        let (w, h) = (x1 - x0, y1 - y0);
        let mut data = Vec::with_capacity(w as usize * h as usize * 3);
        for y in y0..y1 {
            let row = (y as usize * self.width as usize + x0 as usize) * 3;
            data.extend_from_slice(&self.data[row..row + w as usize * 3]);
        }
        RgbImage { width: w, height: h, data }
    }
}

fn invalid(what: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(what.to_string())
}

/// Decodes PNG, JPEG, WebP or GIF (its first frame) bytes into RGB, the format found from the bytes
/// themselves. Transparency (an alpha channel, a palette's or a tRNS transparent colour) is
/// composited onto white, as transformers' `convert_to_rgb` does (`PIL.Image.alpha_composite` over
/// an opaque white background); grayscale is replicated into the three channels. EXIF orientation
/// is not applied (the HF processors do not apply it either).
///
/// Bad input is `Error::InvalidArgument` naming the cause: empty input, an unknown format, a zero
/// or too large size (refused from the header: more than [`MAX_IMAGE_PIXELS`] pixels or a side
/// over 65,535), truncated or corrupt data (with the decoder's message). The decoder runs under
/// allocation limits, so no input makes it allocate more than the bounded image needs.
pub fn decode_image(bytes: &[u8]) -> Result<RgbImage> {
    let (format, decoder) = open_image(bytes)?;
    let img = DynamicImage::from_decoder(decoder).map_err(|e| invalid(format!("cannot decode {format:?} image: {e}")))?;
    Ok(to_rgb(img))
}

/// An image's size (width, height) as [`decode_image`] would decode it, read from its header
/// alone (the same checks, nothing decoded): what a prompt needs before the pixels (Gemma 3's
/// pan-and-scan crop count).
pub fn image_size(bytes: &[u8]) -> Result<(u32, u32)> {
    Ok(open_image(bytes)?.1.dimensions())
}

/// The checked decoder of `bytes` (format, size and the decoders' known panics refused first).
fn open_image(bytes: &[u8]) -> Result<(image::ImageFormat, impl ImageDecoder + '_)> {
    if bytes.is_empty() {
        return Err(invalid("image is empty (0 bytes)"));
    }
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| invalid(format!("cannot read image: {e}")))?;
    let format = match reader.format() {
        Some(f @ (image::ImageFormat::Png | image::ImageFormat::Jpeg | image::ImageFormat::WebP | image::ImageFormat::Gif)) => f,
        Some(other) => return Err(invalid(format!("unsupported image format {other:?} (PNG, JPEG, WebP and GIF are)"))),
        None => return Err(invalid("unknown image format (PNG, JPEG, WebP and GIF are supported)")),
    };
    match format {
        image::ImageFormat::Png => check_png_palette(bytes)?,
        image::ImageFormat::Jpeg => check_jpeg_sampling(bytes)?,
        _ => {}
    }
    let mut reader = reader;
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_IMAGE_SIDE);
    limits.max_image_height = Some(MAX_IMAGE_SIDE);
    // The largest decoded buffer (16-bit RGBA at the pixel bound) plus room for the decoder's own.
    limits.max_alloc = Some(MAX_IMAGE_PIXELS * 8 + (64 << 20));
    reader.limits(limits);
    let decoder = reader.into_decoder().map_err(|e| invalid(format!("cannot decode {format:?} image: {e}")))?;
    let (width, height) = decoder.dimensions();
    if width == 0 || height == 0 {
        return Err(invalid(format!("{format:?} image is empty ({width}x{height} pixels)")));
    }
    if width as u64 * height as u64 > MAX_IMAGE_PIXELS {
        return Err(invalid(format!(
            "{format:?} image of {width}x{height} pixels is too large (at most {MAX_IMAGE_PIXELS} pixels)"
        )));
    }
    Ok((format, decoder))
}

/// InvalidArgument for a PNG palette (PLTE chunk) whose length is not a whole number of RGB
/// entries: the spec makes it an error, and png 0.18.1 takes it (any length of 3..=768) and then
/// panics expanding an indexed image's pixels through it (`create_rgba_palette` slices the
/// leftover 1 or 2 bytes as 3; image-rs/image-png#694). Found by fuzz/'s `media_image` target.
/// Walks the chunk headers only (a truncated file is left to the decoder).
pub(crate) fn check_png_palette(bytes: &[u8]) -> Result<()> {
    let mut at = 8usize; // the signature
    while let Some(head) = at.checked_add(8).and_then(|end| bytes.get(at..end)) {
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        match &head[4..] {
            b"PLTE" if len % 3 != 0 => {
                return Err(invalid(format!(
                    "corrupt PNG image: its palette (PLTE chunk) of {len} bytes is not a whole number of RGB entries"
                )))
            }
            b"IEND" => break,
            _ => {}
        }
        at = at.saturating_add(12).saturating_add(len); // length, type, data, CRC
    }
    Ok(())
}

/// InvalidArgument for a JPEG frame with a component sampled more finely than the first one (a
/// chroma plane of 4 × 1 blocks per MCU under a 2 × 2 luma, say): zune-jpeg 0.5.15 (the image
/// crate's JPEG decoder) panics in its IDCT on such a frame (etemesi254/zune-image#361, open).
/// Encoders give the first component (luma) the largest factors; found by fuzz/'s `media_image`
/// target. Walks the marker segments as a decoder does (entropy-coded data skipped to the next
/// marker) and checks every frame header (SOFn).
fn check_jpeg_sampling(bytes: &[u8]) -> Result<()> {
    let mut at = 2usize; // SOI
    while at + 1 < bytes.len() {
        if bytes[at] != 0xFF {
            at += 1; // entropy-coded data
            continue;
        }
        let marker = bytes[at + 1];
        match marker {
            0xFF => {
                at += 1; // fill byte
                continue;
            }
            0x00 | 0x01 | 0xD0..=0xD8 => {
                at += 2; // stuffed 0xFF, TEM, RSTn, SOI: no length
                continue;
            }
            0xD9 => break,
            _ => {}
        }
        let Some(len) = bytes.get(at + 2..at + 4).map(|b| u16::from_be_bytes([b[0], b[1]]) as usize) else { break };
        let seg = bytes.get(at + 4..(at + 2 + len).min(bytes.len())).unwrap_or(&[]);
        if matches!(marker, 0xC0..=0xCF) && !matches!(marker, 0xC4 | 0xC8 | 0xCC) && seg.len() >= 6 {
            let factors: Vec<(u8, u8)> =
                seg[6..].chunks_exact(3).take(seg[5] as usize).map(|c| (c[1] >> 4, c[1] & 15)).collect();
            if let Some(&(h0, v0)) = factors.first() {
                if let Some((i, &(h, v))) = factors.iter().enumerate().find(|(_, &(h, v))| h > h0 || v > v0) {
                    return Err(invalid(format!(
                        "unsupported JPEG image: component {} is sampled {h}x{v} per MCU, more finely than \
                         the first component's {h0}x{v0}",
                        i + 1
                    )));
                }
            }
        }
        at += 2 + len.max(2);
    }
    Ok(())
}

/// RGB conversion as transformers' `convert_to_rgb` on a PIL image: without transparency PIL's
/// `convert("RGB")`; with it, `alpha_composite` over opaque white, then RGB.
pub(crate) fn to_rgb(img: DynamicImage) -> RgbImage {
    let (width, height) = (img.width(), img.height());
    if !img.color().has_alpha() {
        return RgbImage { width, height, data: img.into_rgb8().into_raw() };
    }
    let rgba = img.into_rgba8().into_raw();
    let mut data = Vec::with_capacity(width as usize * height as usize * 3);
    for px in rgba.chunks_exact(4) {
        let a = px[3] as u32;
        for &c in &px[..3] {
            data.push(over_white(c as u32, a));
        }
    }
    RgbImage { width, height, data }
}

/// One channel of a source pixel (value `c`, alpha `a`) composited over opaque white, in the
/// fixed point of Pillow's `alpha_composite` (7 fractional bits, division by 255 by shifts). Over
/// an opaque destination its weights reduce to `a·128` and `(255 − a)·128`.
fn over_white(c: u32, a: u32) -> u8 {
    if a == 0 {
        return 255;
    }
    const BITS: u32 = 7;
    let tmp = (c * a + 255 * (255 - a)) << BITS;
    let t = tmp + (0x80 << BITS);
    ((((t >> 8) + t) >> 8) >> BITS) as u8
}

// ---------------------------------------------------------------------------------------------
// PIL's BILINEAR (and BICUBIC: same passes, another kernel) resize (8 bits per channel)

/// Fractional bits of the fixed-point weights (32-bit accumulators, 8-bit samples, 2 spare bits).
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// For each output sample along one axis: the first input sample, how many contribute, and their
/// weights in fixed point (`ksize` slots per output sample).
struct AxisWeights {
    first: Vec<usize>,
    count: Vec<usize>,
    ksize: usize,
    weights: Vec<i32>,
}

/// A resampling filter as Pillow defines it: its support at scale 1 and its kernel.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Filter {
    support: f64,
    kernel: fn(f64) -> f64,
}

/// PIL's BILINEAR (a triangle).
pub(crate) const BILINEAR: Filter = Filter { support: 1.0, kernel: triangle };

/// PIL's BICUBIC (Keys' cubic convolution with a = −0.5).
pub(crate) const BICUBIC: Filter = Filter { support: 2.0, kernel: bicubic };

fn triangle(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// A filter's weights for resampling `in_size` samples to `out_size`: sample centres at
/// `(i + 0.5) · scale`, the support widened by the downscale factor (antialiasing), weights
/// normalised to sum 1 and then rounded half away from zero to fixed point.
fn axis_weights(in_size: usize, out_size: usize, filter: Filter) -> AxisWeights {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = filter.support * filterscale;
    let ksize = support.ceil() as usize * 2 + 1;
    let inv = 1.0 / filterscale;
    let mut first = Vec::with_capacity(out_size);
    let mut count = Vec::with_capacity(out_size);
    let mut weights = vec![0i32; out_size * ksize];
    let mut k = vec![0f64; ksize];
    for o in 0..out_size {
        let center = (o as f64 + 0.5) * scale;
        // C-style truncating casts, as the reference computes the window.
        let lo = ((center - support + 0.5) as i64).max(0) as usize;
        let hi = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
        let n = hi.saturating_sub(lo).min(ksize);
        let mut total = 0.0;
        for (i, slot) in k.iter_mut().enumerate().take(n) {
            let w = (filter.kernel)(((i + lo) as f64 - center + 0.5) * inv);
            *slot = w;
            total += w;
        }
        let row = &mut weights[o * ksize..(o + 1) * ksize];
        for i in 0..n {
            let w = if total != 0.0 { k[i] / total } else { k[i] };
            let scaled = w * (1u32 << PRECISION_BITS) as f64;
            row[i] = if scaled < 0.0 { (scaled - 0.5) as i32 } else { (scaled + 0.5) as i32 };
        }
        first.push(lo);
        count.push(n);
    }
    AxisWeights { first, count, ksize, weights }
}

#[inline]
fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Resizes as PIL's `Image.resize((width, height), Image.BILINEAR)` on an RGB image, exactly: two
/// separable passes with an 8-bit intermediate, each skipped when that axis keeps its size. The
/// horizontal pass runs first, except for a very tall, narrow image that shrinks vertically
/// (height over 100 × its width), where Pillow 12 runs the vertical pass first: measured against
/// Pillow 12.3 (its threshold is exact: 17 × 1700 horizontal first, 17 × 1701 vertical first).
///
/// InvalidArgument for an empty source or target, or pixel data whose length is not
/// `width × height × 3`.
pub fn resize_bilinear(img: &RgbImage, width: u32, height: u32) -> Result<RgbImage> {
    resize_with(img, width, height, BILINEAR)
}

/// [`resize_bilinear`] with another of PIL's filters (same passes, same pass order).
pub(crate) fn resize_with(img: &RgbImage, width: u32, height: u32, filter: Filter) -> Result<RgbImage> {
    check(img)?;
    if width == 0 || height == 0 {
        return Err(invalid(format!("cannot resize to {width}x{height} pixels")));
    }
    let (in_w, in_h) = (img.width as usize, img.height as usize);
    let (out_w, out_h) = (width as usize, height as usize);
    let vertical_first = out_h < in_h && in_h > 100 * in_w;
    let mut cur = img.data.clone();
    let (mut w, mut h) = (in_w, in_h);
    for pass in if vertical_first { [false, true] } else { [true, false] } {
        if pass && out_w != w {
            cur = horizontal_pass(&cur, w, h, out_w, filter);
            w = out_w;
        } else if !pass && out_h != h {
            cur = vertical_pass(&cur, w, h, out_h, filter);
            h = out_h;
        }
    }
    Ok(RgbImage { width, height, data: cur })
}

/// InvalidArgument unless `img` is non-empty and its data holds exactly its pixels.
fn check(img: &RgbImage) -> Result<()> {
    if img.width == 0 || img.height == 0 {
        return Err(invalid(format!("image is empty ({}x{} pixels)", img.width, img.height)));
    }
    if img.data.len() as u64 != img.width as u64 * img.height as u64 * 3 {
        return Err(invalid(format!(
            "RGB image of {}x{} needs {} bytes, got {}",
            img.width,
            img.height,
            img.width as u64 * img.height as u64 * 3,
            img.data.len()
        )));
    }
    Ok(())
}

/// Splits `out` (`rows` rows of `row_len` bytes) into bands of whole rows and fills them with
/// `fill(first_row, band)`, on several threads when the image is large enough to pay for them
/// (a resize of a few hundred thousand samples takes milliseconds on one core, and it sits on the
/// path to an image prompt's first token). The bands' results do not depend on the split.
fn par_rows(out: &mut [u8], row_len: usize, rows: usize, work_per_row: usize, fill: impl Fn(usize, &mut [u8]) + Sync) {
    /// Samples × taps below which one thread does it all (a thread costs tens of microseconds).
    const MIN_WORK_PER_THREAD: usize = 250_000;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    let threads = threads.min((rows * work_per_row / MIN_WORK_PER_THREAD).max(1)).min(rows.max(1));
    if threads <= 1 {
        fill(0, out);
        return;
    }
    let band = rows.div_ceil(threads);
    std::thread::scope(|s| {
        let mut parts = out.chunks_mut(band * row_len).enumerate();
        let first = parts.next();
        for (i, part) in parts {
            let fill = &fill;
            s.spawn(move || fill(i * band, part));
        }
        if let Some((_, part)) = first {
            fill(0, part);
        }
    });
}

/// Resamples each row of a `w × h` RGB image to `out_w` pixels.
fn horizontal_pass(src: &[u8], w: usize, h: usize, out_w: usize, filter: Filter) -> Vec<u8> {
    let half = 1i32 << (PRECISION_BITS - 1);
    let ax = axis_weights(w, out_w, filter);
    let mut out = vec![0u8; out_w * h * 3];
    par_rows(&mut out, out_w * 3, h, out_w * 3 * ax.ksize, |y0, band| {
        for (dy, dst) in band.chunks_exact_mut(out_w * 3).enumerate() {
            let y = y0 + dy;
            let row = &src[y * w * 3..(y + 1) * w * 3];
            for (x, out) in dst.chunks_exact_mut(3).enumerate() {
                let n = ax.count[x];
                let k = &ax.weights[x * ax.ksize..x * ax.ksize + n];
                let px = &row[ax.first[x] * 3..(ax.first[x] + n) * 3];
                let (mut r, mut g, mut b) = (half, half, half);
                for (p, &wt) in px.chunks_exact(3).zip(k) {
                    r += p[0] as i32 * wt;
                    g += p[1] as i32 * wt;
                    b += p[2] as i32 * wt;
                }
                out[0] = clip8(r);
                out[1] = clip8(g);
                out[2] = clip8(b);
            }
        }
    });
    out
}

/// Resamples each column of a `w × h` RGB image to `out_h` pixels.
fn vertical_pass(src: &[u8], w: usize, h: usize, out_h: usize, filter: Filter) -> Vec<u8> {
    let half = 1i32 << (PRECISION_BITS - 1);
    let ax = axis_weights(h, out_h, filter);
    let stride = w * 3;
    let mut out = vec![0u8; out_h * stride];
    par_rows(&mut out, stride, out_h, stride * ax.ksize, |y0, band| {
        let mut acc = vec![0i32; stride];
        for (dy, dst) in band.chunks_exact_mut(stride).enumerate() {
            let y = y0 + dy;
            acc.iter_mut().for_each(|a| *a = half);
            let k = &ax.weights[y * ax.ksize..y * ax.ksize + ax.count[y]];
            for (i, &wt) in k.iter().enumerate() {
                let row = &src[(ax.first[y] + i) * stride..(ax.first[y] + i + 1) * stride];
                for (a, &p) in acc.iter_mut().zip(row) {
                    *a += p as i32 * wt;
                }
            }
            for (d, &a) in dst.iter_mut().zip(&acc) {
                *d = clip8(a);
            }
        }
    });
    out
}

// ---------------------------------------------------------------------------------------------
// Gemma 3

/// A preprocessed batch of images: `data` in `shape` = [n, 3, height, width] (NCHW, f32), where n
/// is 1 plus the pan-and-scan crops.
#[derive(Debug, Clone, PartialEq)]
pub struct PixelValues {
    pub data: Vec<f32>,
    pub shape: [usize; 4],
    /// Pan-and-scan crops after the whole image (0 when pan and scan is off or did not apply).
    pub num_crops: usize,
}

/// Gemma 3's image processor (transformers' `Gemma3ImageProcessor`, as configured by the
/// checkpoints' `preprocessor_config.json`): RGB, resize to `height × width` with PIL BILINEAR
/// (no aspect ratio kept), `× rescale_factor`, `(x − mean) / std`; with pan and scan, also crops of
/// an elongated image, each processed the same way after the whole image.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma3ImageProcessor {
    pub height: u32,
    pub width: u32,
    pub rescale_factor: f64,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    pub do_pan_and_scan: bool,
    pub pan_and_scan_min_crop_size: u32,
    pub pan_and_scan_max_num_crops: u32,
    pub pan_and_scan_min_ratio_to_activate: f64,
}

impl Default for Gemma3ImageProcessor {
    /// The gemma-3 checkpoints' configuration: 896 × 896, 1/255, mean and std 0.5, pan and scan
    /// off (min crop 256, at most 4 crops, from an aspect ratio of 1.2).
    fn default() -> Self {
        Gemma3ImageProcessor {
            height: 896,
            width: 896,
            rescale_factor: 1.0 / 255.0,
            image_mean: [0.5; 3],
            image_std: [0.5; 3],
            do_pan_and_scan: false,
            pan_and_scan_min_crop_size: 256,
            pan_and_scan_max_num_crops: 4,
            pan_and_scan_min_ratio_to_activate: 1.2,
        }
    }
}

impl Gemma3ImageProcessor {
    /// From a checkpoint's processor config (a parsed `preprocessor_config.json`, or a
    /// `processor_config.json` whose image settings sit under `image_processor`); absent or null
    /// keys keep the defaults. Settings this implementation does not reproduce (another resample
    /// filter, resize/rescale/normalise turned off) and values of the wrong type or range (no
    /// crops, a crop size of 0) are InvalidArgument naming the key, never silently different.
    pub fn from_preprocessor_config(cfg: &serde_json::Value) -> Result<Self> {
        let cfg = cfg.get("image_processor").filter(|v| v.is_object()).unwrap_or(cfg);
        let mut p = Gemma3ImageProcessor::default();
        let get = |k: &str| cfg.get(k).filter(|v| !v.is_null());
        let bad = |k: &str, v: &serde_json::Value| invalid(format!("processor config: unsupported {k} {v}"));
        if let Some(size) = get("size") {
            let dim = |k: &str| size.get(k).and_then(|v| v.as_u64()).filter(|&v| v > 0 && v <= 8192);
            match (dim("height"), dim("width")) {
                (Some(h), Some(w)) => (p.height, p.width) = (h as u32, w as u32),
                _ => return Err(bad("size", size)),
            }
        }
        if let Some(v) = get("resample") {
            if v.as_u64() != Some(2) {
                return Err(bad("resample (only 2, BILINEAR)", v));
            }
        }
        for k in ["do_resize", "do_rescale", "do_normalize", "do_convert_rgb"] {
            if let Some(v) = get(k) {
                if v.as_bool() != Some(true) {
                    return Err(bad(k, v));
                }
            }
        }
        if let Some(v) = get("rescale_factor") {
            p.rescale_factor = v.as_f64().filter(|f| f.is_finite()).ok_or_else(|| bad("rescale_factor", v))?;
        }
        let triple = |k: &str, v: &serde_json::Value| -> Result<[f32; 3]> {
            match v.as_array().map(|a| a.iter().map(|x| x.as_f64()).collect::<Option<Vec<_>>>()) {
                Some(Some(a)) if a.len() == 3 => Ok([a[0] as f32, a[1] as f32, a[2] as f32]),
                _ => Err(bad(k, v)),
            }
        };
        if let Some(v) = get("image_mean") {
            p.image_mean = triple("image_mean", v)?;
        }
        if let Some(v) = get("image_std") {
            p.image_std = triple("image_std", v)?;
            if p.image_std.contains(&0.0) {
                return Err(bad("image_std", v));
            }
        }
        if let Some(v) = get("do_pan_and_scan") {
            p.do_pan_and_scan = v.as_bool().ok_or_else(|| bad("do_pan_and_scan", v))?;
        }
        if let Some(v) = get("pan_and_scan_min_crop_size") {
            p.pan_and_scan_min_crop_size = v.as_u64().filter(|&n| n > 0).ok_or_else(|| bad("pan_and_scan_min_crop_size", v))? as u32;
        }
        if let Some(v) = get("pan_and_scan_max_num_crops") {
            p.pan_and_scan_max_num_crops = v.as_u64().filter(|&n| n > 0 && n <= 64).ok_or_else(|| bad("pan_and_scan_max_num_crops", v))? as u32;
        }
        if let Some(v) = get("pan_and_scan_min_ratio_to_activate") {
            p.pan_and_scan_min_ratio_to_activate =
                v.as_f64().filter(|r| r.is_finite()).ok_or_else(|| bad("pan_and_scan_min_ratio_to_activate", v))?;
        }
        Ok(p)
    }

    /// [`decode_image`] then [`Self::preprocess`].
    pub fn preprocess_bytes(&self, bytes: &[u8]) -> Result<PixelValues> {
        self.preprocess(&decode_image(bytes)?)
    }

    /// The resized 8-bit images (the whole image, then any pan-and-scan crops), before rescaling:
    /// what the float output is an exact function of.
    pub fn resized(&self, img: &RgbImage) -> Result<Vec<RgbImage>> {
        let mut parts = vec![resize_bilinear(img, self.width, self.height)?];
        for crop in self.pan_and_scan(img) {
            parts.push(resize_bilinear(&crop, self.width, self.height)?);
        }
        Ok(parts)
    }

    /// The pixel values, as the HF processor's `pixel_values` for this one image.
    pub fn preprocess(&self, img: &RgbImage) -> Result<PixelValues> {
        let parts = self.resized(img)?;
        let (h, w) = (self.height as usize, self.width as usize);
        let plane = h * w;
        let mut data = vec![0f32; parts.len() * 3 * plane];
        // transformers: uint8 → float64 × factor → float32, then (x − mean) / std in float32.
        let lut: Vec<[f32; 3]> = (0..256u32)
            .map(|v| {
                let x = (v as f64 * self.rescale_factor) as f32;
                std::array::from_fn(|c| (x - self.image_mean[c]) / self.image_std[c])
            })
            .collect();
        for (n, part) in parts.iter().enumerate() {
            let out = &mut data[n * 3 * plane..(n + 1) * 3 * plane];
            for (i, px) in part.data.chunks_exact(3).enumerate() {
                for c in 0..3 {
                    out[c * plane + i] = lut[px[c] as usize][c];
                }
            }
        }
        Ok(PixelValues { data, shape: [parts.len(), 3, h, w], num_crops: parts.len() - 1 })
    }

    /// Gemma 3's pan and scan (transformers' `Gemma3ImageProcessor.pan_and_scan`): an image whose
    /// aspect ratio reaches the threshold is cut along its long side into
    /// `clamp(min(round_half_up(long / short), floor(long / min_crop)), 2, max_crops)` crops of
    /// `ceil(side / count)` pixels, none if a crop would be shorter than the minimum crop size;
    /// the last crop is clipped at the image's edge. Empty when pan and scan is off.
    /// Each crop as (x, y, width, height) in the `width × height` image, in order (row-major).
    pub fn pan_and_scan_boxes(&self, width: u32, height: u32) -> Vec<(u32, u32, u32, u32)> {
        if !self.do_pan_and_scan || width == 0 || height == 0 {
            return vec![];
        }
        let (w, h) = (width as f64, height as f64);
        let min_crop = self.pan_and_scan_min_crop_size as f64;
        let max_crops = self.pan_and_scan_max_num_crops as i64;
        let count = |long: f64, short: f64| {
            let n = ((long / short + 0.5).floor() as i64).min((long / min_crop).floor() as i64);
            n.max(2).min(max_crops)
        };
        let (nw, nh) = if w >= h {
            if w / h < self.pan_and_scan_min_ratio_to_activate {
                return vec![];
            }
            (count(w, h), 1)
        } else {
            if h / w < self.pan_and_scan_min_ratio_to_activate {
                return vec![];
            }
            (1, count(h, w))
        };
        if nw < 1 || nh < 1 {
            return vec![];
        }
        let cw = (w / nw as f64).ceil() as u32;
        let ch = (h / nh as f64).ceil() as u32;
        if (cw.min(ch) as f64) < min_crop {
            return vec![];
        }
        let mut boxes = Vec::new();
        for j in 0..nh as u32 {
            for i in 0..nw as u32 {
                let (x0, y0) = (cw * i, ch * j);
                // A crop starting past the edge would be an empty slice in the reference (which
                // then fails to resize it); with the minimum crop size ≥ 1 only a config of tiny
                // crops reaches this. mlex leaves it out.
                if x0 < width && y0 < height {
                    boxes.push((x0, y0, cw.min(width - x0), ch.min(height - y0)));
                }
            }
        }
        boxes
    }

    /// The pan-and-scan crops of an image (see [`Self::pan_and_scan_boxes`]).
    fn pan_and_scan(&self, img: &RgbImage) -> Vec<RgbImage> {
        self.pan_and_scan_boxes(img.width, img.height)
            .into_iter()
            .map(|(x, y, w, h)| img.crop(x, y, x + w, y + h))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_sum_to_one_in_fixed_point() {
        for (i, o) in [(1, 896), (3, 896), (897, 896), (4000, 896), (2000, 896), (896, 896)] {
            let ax = axis_weights(i, o, BILINEAR);
            for x in 0..o {
                let s: i32 = ax.weights[x * ax.ksize..x * ax.ksize + ax.count[x]].iter().sum();
                assert!((s - (1 << PRECISION_BITS)).abs() <= ax.ksize as i32, "{i}->{o} at {x}: {s}");
            }
        }
    }

    #[test]
    fn constant_images_stay_constant() {
        let img = RgbImage::from_raw(5, 7, [10u8, 128, 250].repeat(35)).unwrap();
        for (w, h) in [(896, 896), (2, 3), (5, 7), (1, 1)] {
            let r = resize_bilinear(&img, w, h).unwrap();
            assert!(r.data.chunks_exact(3).all(|p| p == [10, 128, 250]), "{w}x{h}");
        }
    }

    #[test]
    fn malformed_images_are_refused() {
        let p = Gemma3ImageProcessor::default();
        let short = RgbImage { width: 4, height: 4, data: vec![0; 47] };
        assert!(matches!(p.preprocess(&short), Err(Error::InvalidArgument(_))));
        let empty = RgbImage { width: 0, height: 4, data: vec![] };
        assert!(matches!(p.preprocess(&empty), Err(Error::InvalidArgument(_))));
        let ok = RgbImage::from_raw(2, 2, vec![9; 12]).unwrap();
        assert!(matches!(resize_bilinear(&ok, 0, 3), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn over_white_ends() {
        assert_eq!(over_white(0, 0), 255);
        assert_eq!(over_white(17, 255), 17);
        assert_eq!(over_white(0, 128), 127);
    }

    #[test]
    fn pan_and_scan_counts() {
        let p = Gemma3ImageProcessor { do_pan_and_scan: true, ..Default::default() };
        let wide = RgbImage::from_raw(1000, 300, vec![0; 1000 * 300 * 3]).unwrap();
        let crops = p.pan_and_scan(&wide);
        assert_eq!(crops.len(), 3);
        assert_eq!((crops[0].width, crops[0].height), (334, 300));
        assert_eq!((crops[2].width, crops[2].height), (332, 300));
        let square = RgbImage::from_raw(500, 500, vec![0; 500 * 500 * 3]).unwrap();
        assert!(p.pan_and_scan(&square).is_empty());
        // Tall: crops down the image; capped at the most crops; clipped at the edge.
        assert_eq!(p.pan_and_scan_boxes(300, 1000), [(0, 0, 300, 334), (0, 334, 300, 334), (0, 668, 300, 332)]);
        assert_eq!(p.pan_and_scan_boxes(3000, 400).len(), 4);
        // Under the ratio threshold, or crops under the minimum size: none.
        assert!(p.pan_and_scan_boxes(1190, 1000).is_empty());
        assert!(p.pan_and_scan_boxes(500, 255).is_empty());
        // Tiny crops whose last would start past the edge (5 = 2 + 2 + 1, a fourth at 6): left out.
        let tiny = Gemma3ImageProcessor { pan_and_scan_min_crop_size: 1, ..p.clone() };
        assert_eq!(tiny.pan_and_scan_boxes(5, 1), [(0, 0, 2, 1), (2, 0, 2, 1), (4, 0, 1, 1)]);
        let off = Gemma3ImageProcessor::default();
        assert!(off.pan_and_scan_boxes(3000, 400).is_empty());
    }

    #[test]
    fn bad_pan_and_scan_settings_name_the_key() {
        use serde_json::json;
        for (cfg, key) in [
            (json!({"pan_and_scan_max_num_crops": 0}), "pan_and_scan_max_num_crops"),
            (json!({"pan_and_scan_max_num_crops": "4"}), "pan_and_scan_max_num_crops"),
            (json!({"pan_and_scan_min_crop_size": 0}), "pan_and_scan_min_crop_size"),
            (json!({"pan_and_scan_min_crop_size": -3}), "pan_and_scan_min_crop_size"),
            (json!({"pan_and_scan_min_ratio_to_activate": [1.2]}), "pan_and_scan_min_ratio_to_activate"),
            (json!({"do_pan_and_scan": 1}), "do_pan_and_scan"),
            (json!({"image_processor": {"do_pan_and_scan": "true"}}), "do_pan_and_scan"),
        ] {
            match Gemma3ImageProcessor::from_preprocessor_config(&cfg) {
                Err(Error::InvalidArgument(m)) => assert!(m.contains(key), "{cfg}: {m}"),
                other => panic!("{cfg}: {other:?}"),
            }
        }
        let nested = json!({"image_processor": {"do_pan_and_scan": true, "pan_and_scan_max_num_crops": 2}});
        let p = Gemma3ImageProcessor::from_preprocessor_config(&nested).unwrap();
        assert!(p.do_pan_and_scan && p.pan_and_scan_max_num_crops == 2);
    }
}
