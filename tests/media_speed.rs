//! Host time of an image part before the GPU sees it: decoding a PNG and each processor's
//! preprocessing, on a 320 × 240 PNG of noise (the image of tests/vlm_prompt_bench.rs's size).
//! On a GPU this host work is most of an image prompt's time to first token at small shapes
//! (BENCHMARKS.md, seventh session). Not a pass/fail test: ignored, it prints medians.
//!
//! `cargo test --release --test media_speed -- --ignored --nocapture`
use mlex::media::{decode_image, Gemma3ImageProcessor, Gemma4ImageProcessor, QwenImageProcessor};
use std::time::Instant;

fn noise_png(w: u32, h: u32) -> Vec<u8> {
    let mut state = 0x2545_f491u32;
    let img = image::RgbImage::from_fn(w, h, |_, _| {
        let mut px = [0u8; 3];
        for c in &mut px {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            *c = state as u8;
        }
        image::Rgb(px)
    });
    let mut out = std::io::Cursor::new(vec![]);
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

/// Median milliseconds of `f` over 50 runs, after 5 untimed.
fn time(mut f: impl FnMut()) -> f64 {
    for _ in 0..5 {
        f();
    }
    let mut t: Vec<f64> = (0..50)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    t[t.len() / 2]
}

/// The PNG of tests/oracle/vlm_prompt_bench.py: two channels of gradients and one of noise, which
/// PNG's filters and deflate compress (a PNG of pure noise is stored nearly raw).
fn bench_png(w: u32, h: u32) -> Vec<u8> {
    let mut state = 0x9e37_79b9u32;
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        image::Rgb([((x * 3) % 256) as u8, ((y * 5 + x) % 256) as u8, state as u8])
    });
    let mut out = std::io::Cursor::new(vec![]);
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

#[test]
#[ignore]
fn bench_image_decode_and_preprocessing() {
    let bench = bench_png(320, 240);
    println!("PNG decode (320x240, gradients and noise, {} bytes): {:.2} ms", bench.len(), time(|| drop(decode_image(&bench).unwrap())));
    let png = noise_png(320, 240);
    let img = decode_image(&png).unwrap();
    let g3 = Gemma3ImageProcessor { height: 224, width: 224, ..Default::default() };
    let g4 = Gemma4ImageProcessor { max_soft_tokens: 70, ..Default::default() };
    let qwen = QwenImageProcessor::default();
    println!("PNG decode (320x240, {} bytes): {:.2} ms", png.len(), time(|| drop(decode_image(&png).unwrap())));
    println!("Gemma 3 preprocess (224 px): {:.2} ms", time(|| drop(g3.preprocess(&img).unwrap())));
    println!("Gemma 4 preprocess (70 tokens): {:.2} ms", time(|| drop(g4.preprocess(&img).unwrap())));
    println!("  of which the bicubic resize to 432x336: {:.2} ms", time(|| drop(g4.resized(&img).unwrap())));
    println!("Qwen preprocess: {:.2} ms", time(|| drop(qwen.preprocess(&img).unwrap())));
}
