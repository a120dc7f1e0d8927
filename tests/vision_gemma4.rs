//! Gemma 4 vision against mlx-vlm 0.7.10 (issue 15).
//!
//! - tests/oracle/gemma4_vision.py builds mlx-vlm's Gemma 4 vision encoder and embedder on tiny
//!   random weights (clipped linears and standardization on), runs them on pixels of two aspect
//!   ratios (15 and 8 soft tokens) and runs its Gemma4ImageProcessor on random images of odd
//!   sizes; mlex must give the same tower output (within 1e-5 of its largest value), the same
//!   embedded rows (1e-5) and the same pixels (exactly).
//! - tests/oracle/gemma4_vlm.py builds mlx-vlm's whole gemma4 Model (vision + text with per-layer
//!   inputs) and greedy-decodes 32 tokens for a prompt holding a PNG; mlex loads the same
//!   checkpoint (wrapped in a VisionLm), binds the same PNG and must give the same first logits
//!   (1e-4) and the same 32 tokens, directly and through a Session with a chat template; also with
//!   two images of different sizes, and with bidirectional attention over each image.
//! - The same with `--video`: after the image, a video of 3 frames (PNGs, 63 soft tokens each at
//!   the video budget of 70), expanded by mlx-vlm's own Gemma4Processor (timestamps, markers) and
//!   encoded as its `_encode_video` does (patches padded to the budget); mlex binds the frames as
//!   a video part and must give the same 32 tokens, directly and through a Session (causal and
//!   bidirectional). Bad video input (a video file, a video for a model without a video tower,
//!   frames of different sizes) is INVALID_ARGUMENT naming the part.
//!
//! Without `MLEX_ORACLE_VENV` (the venv holding mlx-vlm) the oracle tests skip, saying so.
mod common;

use common::oracle_arrays::{f32_array, greedy, i32_values, max_abs_diff};
use common::{read_tensors, repo_root, require_oracle, RawTensor};
use mlex::loader::{ModelConfig, Vb, WeightStore};
use mlex::media::{Gemma4ImageProcessor, RgbImage};
use mlex::mlx::{Array, Dtype};
use mlex::models::gemma4_vision::Gemma4Vision;
use mlex::chat::Media;
use mlex::models::vision_lm::{ImageData, MEDIA_TOKEN_BASE};
use std::cell::RefCell;
use std::path::Path;
use std::process::Command;

/// Runs `tests/oracle/<script> OUT [args]` into a new directory (None, with a skip, without the
/// oracle venv).
fn run_oracle(script: &str, test: &str) -> Option<tempfile::TempDir> {
    run_oracle_with(script, &[], test)
}

fn run_oracle_with(script: &str, args: &[&str], test: &str) -> Option<tempfile::TempDir> {
    let python = require_oracle(test)?;
    let out = tempfile::tempdir().unwrap();
    let status =
        Command::new(&python).arg(repo_root().join("tests/oracle").join(script)).arg(out.path()).args(args).status().unwrap();
    assert!(status.success(), "the oracle {script} failed");
    Some(out)
}

/// A checkpoint directory holding `files` of the oracle's output (its io.safetensors stays out:
/// the weight store reads every safetensors file of a directory).
fn model_dir(out: &Path, files: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in files {
        std::fs::copy(out.join(f), dir.path().join(f)).unwrap();
    }
    dir
}

/// The vision side of the checkpoint in `dir`, checking that it takes every tensor there.
fn load_vision(dir: &Path) -> Gemma4Vision {
    let path = dir.join("config.json");
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    let store = RefCell::new(WeightStore::open(dir).unwrap());
    let vision = Gemma4Vision::load(&cfg.raw, &Vb::new(&store, None)).unwrap().expect("a vision_config");
    store.into_inner().finish().expect("every tensor of the checkpoint is used");
    vision
}

#[test]
fn gemma4_vision_tower_embedder_and_preprocessing_match_mlx_vlm() {
    let Some(out) = run_oracle("gemma4_vision.py", "gemma4_vision_tower_embedder_and_preprocessing_match_mlx_vlm") else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let vision = load_vision(model_dir(out.path(), &["config.json", "model.safetensors"]).path());
    for (tag, tokens) in [("a", 15), ("b", 8)] {
        let pixels = f32_array(get(&format!("pixels_{tag}")));
        let s = pixels.shape();
        assert_eq!(vision.soft_tokens(s[2] as usize, s[3] as usize), tokens);
        let tower = vision.tower(&pixels).unwrap();
        let theirs = f32_array(get(&format!("tower_{tag}")));
        // The tower's output is large (pooled features times √hidden, up to ~30 here): within
        // 1e-5 of its largest value (float32 rounding: a few ulp).
        let scale = theirs.abs().unwrap().max(&[], false).unwrap().item_f32().unwrap().max(1.0);
        let d = max_abs_diff(&tower, &theirs);
        assert!(d <= 1e-5 * scale, "image {tag}: tower differs from mlx-vlm's by {d} (largest value {scale})");
        let rows = vision.encode(&pixels).unwrap();
        let d2 = max_abs_diff(&rows, &f32_array(get(&format!("features_{tag}"))));
        assert!(d2 <= 1e-5, "image {tag}: embedded rows differ from mlx-vlm's by {d2}");
        eprintln!("image {tag} ({tokens} tokens): max |Δ| tower {d:e} (largest value {scale}), rows {d2:e}");
    }
    // Pixels that do not fit the pooling grid are refused.
    let odd = Array::zeros(&[1, 3, 20, 40], Dtype::Float32).unwrap();
    let err = vision.tower(&odd).err().expect("20 px is not a multiple of 8").to_string();
    assert!(err.contains("multiples of 8"), "{err}");

    // Preprocessing: the processor's pixels for images of odd sizes, exactly.
    let mut k = 0;
    while let Some(img) = io.iter().find(|t| t.name == format!("image_{k}")) {
        let want = get(&format!("processed_{k}"));
        let max_soft = i32_values(get(&format!("max_soft_tokens_{k}")))[0] as usize;
        let normalize = io.iter().find(|t| t.name == format!("normalize_{k}")).map(|t| {
            let v: Vec<f32> = t.data.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
            ([v[0], v[1], v[2]], [v[3], v[4], v[5]])
        });
        let p = Gemma4ImageProcessor { max_soft_tokens: max_soft, normalize, ..Gemma4ImageProcessor::default() };
        let rgb = RgbImage::from_raw(img.shape[1] as u32, img.shape[0] as u32, img.data.clone()).unwrap();
        let pv = p.preprocess(&rgb).unwrap();
        assert_eq!(pv.shape.to_vec(), want.shape, "case {k}: {}x{} image", img.shape[1], img.shape[0]);
        let want: Vec<f32> = want.data.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        let diff = pv.data.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(diff == 0.0, "case {k} ({}x{} → {:?}): pixels differ by up to {diff}", img.shape[1], img.shape[0], pv.shape);
        k += 1;
    }
    assert!(k >= 9, "only {k} preprocessing cases");
}

/// The prompt ids mlx-vlm's processor wrote, with the image's run collapsed to the one image
/// token the chat-template path puts there.
fn collapsed(ids: &[u32], image_token: u32) -> Vec<u32> {
    let mut out: Vec<u32> = vec![];
    for &t in ids {
        if t == image_token && out.last() == Some(&image_token) {
            continue;
        }
        out.push(t);
    }
    out
}

#[test]
fn gemma4_image_prompt_matches_mlx_vlm_greedy() {
    image_prompt_matches("gemma4_image_prompt_matches_mlx_vlm_greedy", &[]);
}

/// Two images of different sizes (15 and 14 tokens) in one prompt.
#[test]
fn gemma4_two_image_prompt_matches_mlx_vlm_greedy() {
    image_prompt_matches("gemma4_two_image_prompt_matches_mlx_vlm_greedy", &["--two-images"]);
}

/// The same with `use_bidirectional_attention: "vision"` (the larger Gemma 4 models): the image's
/// tokens attend to each other both ways in the prompt (here the image's 15 tokens outrun the
/// sliding window of 8, which the overlay ignores).
#[test]
fn gemma4_bidirectional_image_prompt_matches_mlx_vlm_greedy() {
    image_prompt_matches("gemma4_bidirectional_image_prompt_matches_mlx_vlm_greedy", &["--bidirectional", "--two-images"]);
}

/// The oracle's images (image.png, and image2.png with --two-images), in prompt order.
fn oracle_images(out: &Path) -> Vec<Vec<u8>> {
    ["image.png", "image2.png"].iter().map(|f| out.join(f)).filter(|p| p.is_file()).map(|p| std::fs::read(p).unwrap()).collect()
}

fn image_prompt_matches(test: &str, args: &[&str]) {
    let Some(out) = run_oracle_with("gemma4_vlm.py", args, test) else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let ids: Vec<u32> = i32_values(get("input_ids")).into_iter().map(|t| t as u32).collect();
    let want: Vec<u32> = i32_values(get("tokens")).into_iter().map(|t| t as u32).collect();

    // Our preprocessing of the PNG gives the processor's pixels.
    let png = std::fs::read(out.path().join("image.png")).unwrap();
    let p = Gemma4ImageProcessor { patch_size: 4, max_soft_tokens: 20, pooling_kernel_size: 2, ..Default::default() };
    let pv = p.preprocess_bytes(&png).unwrap();
    let d = max_abs_diff(&Array::from_slice(&pv.data, &[1, 3, 24, 40]).unwrap(), &f32_array(get("pixel_values")));
    assert_eq!(d, 0.0, "pixels differ from mlx-vlm's processor");

    let dir = model_dir(out.path(), &["config.json", "processor_config.json", "model.safetensors"]);
    let path = dir.path().join("config.json");
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    let store = RefCell::new(WeightStore::open(dir.path()).unwrap());
    let model = mlex::models::build_model(&cfg, &Vb::new(&store, None)).unwrap();
    store.into_inner().finish().expect("every tensor of the checkpoint is used");
    let prompt = model.image_prompt().expect("a gemma4 checkpoint with vision_config takes images");
    assert_eq!((prompt.marker.as_str(), prompt.image_token, prompt.placeholder_tokens), ("<|image|>", 300, 1));

    let images: Vec<ImageData> = oracle_images(out.path()).into_iter().map(ImageData::new).collect();
    let refs: Vec<&ImageData> = images.iter().collect();
    let bound = model.bind_images(collapsed(&ids, 300), &refs).unwrap();
    assert_eq!(bound.len(), ids.len(), "the images take 15 (and 14) tokens");
    for (i, (&b, &t)) in bound.iter().zip(&ids).enumerate() {
        assert_eq!(b >= MEDIA_TOKEN_BASE, t == 300, "position {i}");
        if t != 300 {
            assert_eq!(b, t, "position {i}");
        }
    }

    let mut caches = model.make_caches();
    let logits = model.forward_prompt(&bound, &mut caches).unwrap();
    let l = bound.len() as i32;
    let last = logits.slice_axis(1, l - 1, l).unwrap().reshape(&[-1]).unwrap();
    let d = max_abs_diff(&last, &f32_array(get("logits0")));
    assert!(d <= 1e-4, "first logits differ from mlx-vlm's by {d}");
    eprintln!("first logits: max |Δ| {d:e}");
    let got = greedy(&last, want.len(), |t| {
        model.forward(&Array::from_slice(&[t], &[1, 1]).unwrap(), &mut caches).unwrap()
    });
    assert_eq!(got, want, "greedy tokens differ from mlx-vlm's");

    // The same images again reuse their ids; another image gets ids of its own.
    let again = model.bind_images(collapsed(&ids, 300), &refs).unwrap();
    assert_eq!(again, bound);
    let seed = ImageData::new(std::fs::read(repo_root().join("fuzz/corpus/media_image/seed-png-rgba")).unwrap());
    let mut others = refs.clone();
    others[0] = &seed;
    let other = model.bind_images(collapsed(&ids, 300), &others).unwrap();
    let first_media = |v: &[u32]| *v.iter().find(|&&t| t >= MEDIA_TOKEN_BASE).unwrap();
    assert!(first_media(&other) >= first_media(&bound) + 15, "another image reused the first one's ids");
    // Two image tokens in a row are not one image's place.
    let mut two = collapsed(&ids, 300);
    let at = two.iter().position(|&t| t == 300).unwrap();
    two.insert(at, 300);
    let err = model.bind_images(two, &refs).unwrap_err().to_string();
    assert!(err.contains("run of 2 image tokens"), "{err}");

    // A prefill chunk never splits an image: the cut moves back to its start, or (an image
    // starting the chunk) forward to its end.
    let start = bound.iter().position(|&t| t >= MEDIA_TOKEN_BASE).unwrap();
    let rest = &bound[..bound.len() - 1];
    assert_eq!(model.prefill_chunk_len(rest, start + 5), start);
    assert_eq!(model.prefill_chunk_len(&rest[start..], 5), 15);
    assert_eq!(model.prefill_chunk_len(rest, start), start);
    assert_eq!(model.prefill_chunk_len(rest, start + 15), start + 15);
}

/// A byte-level tokenizer over the oracle model's 320 ids: bytes 0..=255 as themselves, Gemma 4's
/// image tokens at 300..=302 (`<|image|>`, `<|image>`, `<image|>`), `<|video|>` 304, `<bos>` 305,
/// `<eos>` 306.
fn write_gemma4_tokenizer(dir: &Path) {
    let mut tok = common::tiny_tokenizer_json();
    let specials =
        [(300, "<|image|>"), (301, "<|image>"), (302, "<image|>"), (303, "<|audio|>"), (304, "<|video|>"), (305, "<bos>"), (306, "<eos>")];
    let vocab = tok["model"]["vocab"].as_object_mut().unwrap();
    vocab.retain(|_, id| id.as_u64().unwrap() < 256);
    let mut added = vec![];
    for id in 256..320u64 {
        let content = specials.iter().find(|(i, _)| *i == id).map_or(format!("<unused_{id}>"), |(_, s)| s.to_string());
        vocab.insert(content.clone(), id.into());
        added.push(serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                                      "rstrip": false, "normalized": false, "special": true}));
    }
    tok["added_tokens"] = added.into();
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    // Renders exactly the oracle's prompt text: bos, then the parts (images as `<|image|>`,
    // videos as `<|video|>`).
    let template = "{{ bos_token }}{% for message in messages %}{% for item in message['content'] %}\
        {% if item['type'] == 'image' %}<|image|>{% elif item['type'] == 'video' %}<|video|>\
        {% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}\
        {% endfor %}{% endfor %}";
    let config = serde_json::json!({"bos_token": "<bos>", "eos_token": "<eos>", "chat_template": template,
                                    "tokenizer_class": "PreTrainedTokenizerFast"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
}

/// The whole path: a Session over the checkpoint reports images, its chat template's marker is
/// expanded, the PNG decoded and preprocessed, and 32 greedy tokens equal mlx-vlm's.
#[test]
fn gemma4_images_through_a_session() {
    images_through_a_session("gemma4_images_through_a_session", &[]);
}

#[test]
fn gemma4_bidirectional_images_through_a_session() {
    images_through_a_session("gemma4_bidirectional_images_through_a_session", &["--bidirectional", "--two-images"]);
}

fn images_through_a_session(test: &str, args: &[&str]) {
    use mlex::chat::ContentPart;
    use mlex::{ChatMessage, GenerateOptions, Session};

    let Some(out) = run_oracle_with("gemma4_vlm.py", args, test) else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let ids: Vec<u32> = i32_values(get("input_ids")).into_iter().map(|t| t as u32).collect();
    let want: Vec<u32> = i32_values(get("tokens")).into_iter().map(|t| t as u32).collect();
    let dir = model_dir(out.path(), &["config.json", "processor_config.json", "model.safetensors"]);
    write_gemma4_tokenizer(dir.path());
    let session = Session::load(dir.path()).unwrap();
    assert!(session.info().supports_images);
    // No video_token_id in this checkpoint's config: no video.
    assert!(!session.info().supports_video);
    let png = std::fs::read(out.path().join("image.png")).unwrap();
    let video = vec![ChatMessage::user_with_images(vec![
        ContentPart::Text("look: ".into()),
        ContentPart::Video(vec![ImageData::new(png.clone()), ImageData::new(png)]),
        ContentPart::Text(" what is it?".into()),
    ])];
    let err = session.generate(&video, GenerateOptions { max_tokens: 2, ..Default::default() }).unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGUMENT");
    assert!(err.to_string().contains("message 0 holds a video part, and this model takes no video"), "{err}");
    let mut parts = vec![ContentPart::Text("look: ".into())];
    for (i, img) in oracle_images(out.path()).into_iter().enumerate() {
        if i > 0 {
            parts.push(ContentPart::Text(" and ".into()));
        }
        parts.push(ContentPart::Image(ImageData::new(img)));
    }
    parts.push(ContentPart::Text(" what is it?".into()));
    let ask = vec![ChatMessage::user_with_images(parts)];
    // Prefill chunks of 10 tokens: the image (15 tokens at 8..23) must not be split.
    for step in [512, 10] {
        let session = Session::load(dir.path()).unwrap(); // fresh: no cached prefix
        let opts = GenerateOptions { max_tokens: want.len(), ignore_eos: true, prefill_step_size: step, ..Default::default() };
        let reply = session.generate(&ask, opts).unwrap();
        assert_eq!(reply.usage.prompt_tokens, ids.len(), "the prompt as mlx-vlm's processor expands it");
        assert_eq!(reply.tokens, want, "prefill chunks of {step}: greedy tokens through the session differ from mlx-vlm's");
    }
}

/// The oracle's video frames (frame0.png ..), in order.
fn oracle_frames(out: &Path) -> Vec<ImageData> {
    (0..).map(|k| out.join(format!("frame{k}.png"))).take_while(|p| p.is_file()).map(|p| ImageData::new(std::fs::read(p).unwrap())).collect()
}

/// A prompt with an image and a 3-frame video (63 tokens a frame), bound directly.
#[test]
fn gemma4_video_prompt_matches_mlx_vlm_greedy() {
    let test = "gemma4_video_prompt_matches_mlx_vlm_greedy";
    let Some(out) = run_oracle_with("gemma4_vlm.py", &["--video"], test) else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let ids: Vec<u32> = i32_values(get("input_ids")).into_iter().map(|t| t as u32).collect();
    let want: Vec<u32> = i32_values(get("tokens")).into_iter().map(|t| t as u32).collect();

    // Our frame preprocessing gives the processor's patches (its real ones: the first 252 of 280).
    let frames = oracle_frames(out.path());
    assert_eq!(frames.len(), 3);
    let vp = mlex::media::Gemma4VideoProcessor::from_config(&serde_json::from_str(
        &std::fs::read_to_string(out.path().join("processor_config.json")).unwrap(),
    ).unwrap())
    .unwrap();
    let theirs = get("pixel_values_videos");
    assert_eq!(theirs.shape, vec![1, 3, 280, 48]);
    let theirs: Vec<f32> = theirs.data.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    for (k, f) in frames.iter().enumerate() {
        let pv = vp.frame.preprocess_bytes(&f.bytes).unwrap();
        assert_eq!(pv.shape, [1, 3, 56, 72], "frame {k}");
        let (h, w) = (56usize, 72usize);
        for (pi, (py, px)) in (0..h / 4).flat_map(|y| (0..w / 4).map(move |x| (y, x))).enumerate() {
            for (q, (ky, kx, c)) in (0..4).flat_map(|a| (0..4).flat_map(move |b| (0..3).map(move |c| (a, b, c)))).enumerate() {
                let ours = pv.data[c * h * w + (py * 4 + ky) * w + px * 4 + kx];
                assert_eq!(ours, theirs[(k * 280 + pi) * 48 + q], "frame {k} patch {pi} value {q}");
            }
        }
    }

    let dir = model_dir(out.path(), &["config.json", "processor_config.json", "model.safetensors"]);
    let path = dir.path().join("config.json");
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    let store = RefCell::new(WeightStore::open(dir.path()).unwrap());
    let model = mlex::models::build_model(&cfg, &Vb::new(&store, None)).unwrap();
    store.into_inner().finish().expect("every tensor of the checkpoint is used");
    let video = model.image_prompt().and_then(|p| p.video.as_ref()).expect("a checkpoint with video_token_id takes video");
    assert_eq!((video.marker.as_str(), video.video_token), ("<|video|>", 304));
    // A decoded video (frames timed: 40 frames, 3 s each) is sampled as a frames list is (32 of
    // 40) and stamped at its kept frames' real starts; a frames list at j / 2 s.
    let timed: Vec<ImageData> = (0..40u8).map(|k| ImageData::timed(vec![k], k as f64 * 3.0, (k + 1) as f64 * 3.0)).collect();
    let stamps = |text: &str| {
        text.split(' ').filter(|w| w.len() == 5 && w.as_bytes()[2] == b':').map(String::from).collect::<Vec<_>>()
    };
    let (real, listed) = (stamps(&video.expansion(&timed)), stamps(&video.expansion(&timed.iter().map(|f| ImageData::new(f.bytes.to_vec())).collect::<Vec<_>>())));
    assert_eq!((real.len(), listed.len()), (32, 32));
    // linspace(0, 39, 32).round(): 0, 1, 3, ... 38, 39 → 0 s, 3 s, 9 s, ... 114 s, 117 s.
    assert_eq!((&real[..3], &real[30..]), (&["00:00", "00:03", "00:09"].map(String::from)[..], &["01:54", "01:57"].map(String::from)[..]));
    assert_eq!((&listed[..3], &listed[31]), (&["00:00", "00:00", "00:01"].map(String::from)[..], &"00:15".to_string()));

    let image = ImageData::new(std::fs::read(out.path().join("image.png")).unwrap());
    let media = [Media::Image(&image), Media::Video(&frames)];
    let short = collapsed(&collapsed(&ids, 300), 304);
    let bound = model.bind_media(short.clone(), &media).unwrap();
    assert_eq!(bound.len(), ids.len(), "the image takes 15 tokens, each frame 63");
    for (i, (&b, &t)) in bound.iter().zip(&ids).enumerate() {
        assert_eq!(b >= MEDIA_TOKEN_BASE, t == 300 || t == 304, "position {i}");
        if b < MEDIA_TOKEN_BASE {
            assert_eq!(b, t, "position {i}");
        }
    }
    let mut caches = model.make_caches();
    let logits = model.forward_prompt(&bound, &mut caches).unwrap();
    let l = bound.len() as i32;
    let last = logits.slice_axis(1, l - 1, l).unwrap().reshape(&[-1]).unwrap();
    let d = max_abs_diff(&last, &f32_array(get("logits0")));
    assert!(d <= 1e-4, "first logits differ from mlx-vlm's by {d}");
    eprintln!("first logits: max |Δ| {d:e}");
    let got = greedy(&last, want.len(), |t| {
        model.forward(&Array::from_slice(&[t], &[1, 1]).unwrap(), &mut caches).unwrap()
    });
    assert_eq!(got, want, "greedy tokens differ from mlx-vlm's");

    // The same video again reuses its ids; frames are keyed apart from the same bytes as an image.
    assert_eq!(model.bind_media(short.clone(), &media).unwrap(), bound);
    let as_image = [Media::Image(&frames[0]), Media::Video(&frames)];
    let other = model.bind_media(short.clone(), &as_image).unwrap();
    let media_ids = |v: &[u32]| v.iter().copied().filter(|&t| t >= MEDIA_TOKEN_BASE).collect::<Vec<_>>();
    assert_eq!(media_ids(&other)[15..], media_ids(&bound)[15..], "the frames keep their ids");
    assert!(!media_ids(&bound).contains(&media_ids(&other)[0]), "a frame's rows were reused for an image");
    // Frames of different sizes are refused, naming the part.
    let mixed = vec![frames[0].clone(), image.clone(), frames[2].clone()];
    let err = model.bind_media(short.clone(), &[Media::Image(&image), Media::Video(&mixed)]).unwrap_err().to_string();
    assert!(err.contains("media part 2") && err.contains("differ in size"), "{err}");
    // An image where the prompt has a frame, and too few frames.
    let err = model.bind_media(short.clone(), &[Media::Image(&image), Media::Image(&image)]).unwrap_err().to_string();
    assert!(err.contains("media part 2 of the conversation is an image"), "{err}");
    let err = model.bind_media(short.clone(), &[Media::Image(&image), Media::Video(&frames[..2])]).unwrap_err().to_string();
    assert!(err.contains("more video places"), "{err}");
    // More distinct images and kept frames than a session keeps at once: refused up front (3
    // videos of 100 frames keep 32 each).
    let many: Vec<Vec<ImageData>> = (0..3).map(|v| (0..100).map(|k| ImageData::new(vec![v, k as u8, 1])).collect()).collect();
    let err = model.bind_media(short.clone(), &many.iter().map(|f| Media::Video(f)).collect::<Vec<_>>()).unwrap_err().to_string();
    assert!(err.contains("96 distinct images and video frames, more than the 64"), "{err}");
    // A prefill chunk never splits a frame.
    let start = bound.iter().position(|&t| t == 304 || (t >= MEDIA_TOKEN_BASE && !media_ids(&bound)[..15].contains(&t))).unwrap();
    assert_eq!(model.prefill_chunk_len(&bound[..bound.len() - 1], start + 5), start);
}

#[test]
fn gemma4_video_through_a_session() {
    video_through_a_session("gemma4_video_through_a_session", &["--video"]);
}

#[test]
fn gemma4_bidirectional_video_through_a_session() {
    video_through_a_session("gemma4_bidirectional_video_through_a_session", &["--video", "--bidirectional"]);
}

/// A video processor keeping 2 of the 3 frames (numpy's linspace: the first and the last).
#[test]
fn gemma4_sampled_video_through_a_session() {
    video_through_a_session("gemma4_sampled_video_through_a_session", &["--video", "--num-frames", "2"]);
}

/// The whole path for a video part: the template's `<|video|>` expanded per frame with its
/// timestamp, the frames decoded, preprocessed at the video budget and encoded; 32 greedy tokens
/// equal mlx-vlm's; the same video from JSON (frames as data: URLs).
fn video_through_a_session(test: &str, args: &[&str]) {
    use mlex::chat::{parse_messages_json, ContentPart};
    use mlex::{ChatMessage, GenerateOptions, Session};

    let Some(out) = run_oracle_with("gemma4_vlm.py", args, test) else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let ids: Vec<u32> = i32_values(get("input_ids")).into_iter().map(|t| t as u32).collect();
    let want: Vec<u32> = i32_values(get("tokens")).into_iter().map(|t| t as u32).collect();
    let dir = model_dir(out.path(), &["config.json", "processor_config.json", "model.safetensors"]);
    write_gemma4_tokenizer(dir.path());
    let session = Session::load(dir.path()).unwrap();
    assert!(session.info().supports_images && session.info().supports_video);
    let png = std::fs::read(out.path().join("image.png")).unwrap();
    let frames = oracle_frames(out.path());
    let ask = vec![ChatMessage::user_with_images(vec![
        ContentPart::Text("look: ".into()),
        ContentPart::Image(ImageData::new(png.clone())),
        ContentPart::Text(" and ".into()),
        ContentPart::Video(frames.clone()),
        ContentPart::Text(" what is it?".into()),
    ])];
    // Prefill chunks of 10 tokens: no frame (63 tokens) may be split.
    for step in [512, 10] {
        let session = Session::load(dir.path()).unwrap(); // fresh: no cached prefix
        let opts = GenerateOptions { max_tokens: want.len(), ignore_eos: true, prefill_step_size: step, ..Default::default() };
        let reply = session.generate(&ask, opts).unwrap();
        assert_eq!(reply.usage.prompt_tokens, ids.len(), "the prompt as mlx-vlm's processor expands it");
        assert_eq!(reply.tokens, want, "prefill chunks of {step}: greedy tokens through the session differ from mlx-vlm's");
    }
    // From JSON, frames inline; a second turn about the same video reuses the cached prefix.
    use base64::Engine as _;
    let url = |b: &[u8]| format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(b));
    let json = serde_json::json!([{"role": "user", "content": [
        {"type": "text", "text": "look: "}, {"type": "image", "image": url(&png)}, {"type": "text", "text": " and "},
        {"type": "video", "video": frames.iter().map(|f| url(&f.bytes)).collect::<Vec<_>>()},
        {"type": "text", "text": " what is it?"}]}]);
    let parsed = parse_messages_json(&json.to_string()).unwrap();
    let opts = GenerateOptions { max_tokens: want.len(), ignore_eos: true, ..Default::default() };
    let first = session.generate(&parsed, opts.clone()).unwrap();
    assert_eq!(first.tokens, want);
    let again = session.generate(&parsed, opts).unwrap();
    assert_eq!(again.tokens, want);
    assert!(again.usage.cached_tokens >= ids.len() - 20, "{} cached of {}", again.usage.cached_tokens, ids.len());
    // The same frames as one animated image at 2 frames a second (mlx-vlm's timing of a frames
    // list), when sampling keeps every frame (a sampled video's stamps are its frames' real
    // times): a lossless WebP gives mlx-vlm's prompt and tokens, as bytes and as a data: URL; a
    // GIF (its palette is lossy) the prompt and tokens of its own decoded frames given as a list.
    if !args.contains(&"--num-frames") {
        use mlex::chat::media::animated_video;
        let ask_with = |video: Vec<ImageData>| {
            vec![ChatMessage::user_with_images(vec![
                ContentPart::Text("look: ".into()),
                ContentPart::Image(ImageData::new(png.clone())),
                ContentPart::Text(" and ".into()),
                ContentPart::Video(video),
                ContentPart::Text(" what is it?".into()),
            ])]
        };
        let opts = GenerateOptions { max_tokens: want.len(), ignore_eos: true, ..Default::default() };
        let bytes: Vec<&[u8]> = frames.iter().map(|f| &f.bytes[..]).collect();
        let webp = common::animated_webp(&bytes, 500);
        let video = animated_video(ImageData::new(webp.clone())).unwrap();
        assert_eq!(video.iter().map(|f| f.time.unwrap()).collect::<Vec<_>>(), [[0.0, 0.5], [0.5, 1.0], [1.0, 1.5]]);
        let reply = Session::load(dir.path()).unwrap().generate(&ask_with(video), opts.clone()).unwrap();
        assert_eq!((reply.usage.prompt_tokens, &reply.tokens), (ids.len(), &want), "an animated WebP of the frames");
        let json = serde_json::json!([{"role": "user", "content": [
            {"type": "text", "text": "look: "}, {"type": "image", "image": url(&png)}, {"type": "text", "text": " and "},
            {"type": "video", "video": url(&webp)}, {"type": "text", "text": " what is it?"}]}]);
        let reply = Session::load(dir.path()).unwrap().generate(&parse_messages_json(&json.to_string()).unwrap(), opts.clone()).unwrap();
        assert_eq!((reply.usage.prompt_tokens, &reply.tokens), (ids.len(), &want), "an animated WebP as a data: URL");
        let gif = animated_video(ImageData::new(common::animated_gif(&bytes, 500))).unwrap();
        let listed: Vec<ImageData> = gif.iter().map(|f| ImageData::new(f.bytes.to_vec())).collect();
        let a = Session::load(dir.path()).unwrap().generate(&ask_with(gif), opts.clone()).unwrap();
        let b = Session::load(dir.path()).unwrap().generate(&ask_with(listed), opts).unwrap();
        assert_eq!((a.usage.prompt_tokens, &a.tokens), (b.usage.prompt_tokens, &b.tokens), "a GIF and its frames as a list");
        assert_eq!(a.usage.prompt_tokens, ids.len());
        // The CLI: --video FILE gives what --video-frames of the same frames gives; an MP4 is refused.
        let webp_path = out.path().join("clip.webp");
        std::fs::write(&webp_path, &webp).unwrap();
        let frame_paths: Vec<String> = (0..frames.len()).map(|k| out.path().join(format!("frame{k}.png")).display().to_string()).collect();
        let cli = |video: &[&str]| {
            std::process::Command::new(env!("CARGO_BIN_EXE_mlex"))
                .args(["generate", "--model", dir.path().to_str().unwrap(), "--prompt", " what is it?"])
                .args(video)
                .args(["--max-tokens", "4", "--ignore-eos", "--json", "--device", "cpu"])
                .output()
                .unwrap()
        };
        let json_of = |run: std::process::Output| {
            assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
            serde_json::from_slice::<serde_json::Value>(&run.stdout).unwrap()
        };
        let animated = json_of(cli(&["--video", webp_path.to_str().unwrap()]));
        let listed = json_of(cli(&["--video-frames", &frame_paths.join(",")]));
        assert_eq!((&animated["usage"]["prompt_tokens"], &animated["tokens"]), (&listed["usage"]["prompt_tokens"], &listed["tokens"]));
        let mp4 = out.path().join("clip.mp4");
        std::fs::write(&mp4, b"\0\0\0\x20ftypisom\0\0\x02\0").unwrap();
        let run = cli(&["--video", mp4.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success() && err.contains("--video") && err.contains("decodes no video codecs"), "{err}");
    }
    // A video whose template place is missing (a template without video parts) is refused.
    let typed = vec![ChatMessage::user_with_images(vec![
        ContentPart::Text("<|video|> ".into()),
        ContentPart::Video(frames.clone()),
        ContentPart::Text(" what?".into()),
    ])];
    let err = session.generate(&typed, GenerateOptions { max_tokens: 2, ..Default::default() }).unwrap_err().to_string();
    assert!(err.contains("placed 2 video marker(s)") && err.contains("for 1 video"), "{err}");
}

/// Bad video input, no Python: a video file is refused (no video codecs), naming the part; a text-only
/// model refuses a video part.
#[test]
fn gemma4_bad_video_input_names_the_part() {
    use mlex::chat::{parse_messages_json, parse_messages_json_with, ContentPart, MediaAccess};
    use mlex::{ChatMessage, GenerateOptions, Session};

    let png = std::fs::read(repo_root().join("fuzz/corpus/media_image/seed-png-rgba")).unwrap();
    let parse = |content: serde_json::Value| {
        let json = serde_json::json!([{"role": "user", "content": content}]);
        parse_messages_json(&json.to_string()).unwrap_err()
    };
    for file in [serde_json::json!("clip.mp4"), serde_json::json!("file:///tmp/clip.webm"), serde_json::json!({"url": "clip.mp4"})] {
        let err = parse(serde_json::json!([{"type": "text", "text": "what happens?"}, {"type": "video", "video": file}]));
        assert_eq!(err.code(), "INVALID_ARGUMENT");
        let msg = err.to_string();
        assert!(msg.contains("content part 1 (video)") && msg.contains("decodes no video codecs") && msg.contains("frames"), "{msg}");
    }
    let err = parse(serde_json::json!([{"type": "video", "video": []}])).to_string();
    assert!(err.contains("content part 0 (video): a video part needs at least one frame"), "{err}");
    let err = parse(serde_json::json!([{"type": "video", "video": ["/no/such/frame.png"]}])).to_string();
    assert!(err.contains("content part 0 (video): frame 0:") && err.contains("/no/such/frame.png"), "{err}");
    let err = parse(serde_json::json!([{"type": "video", "video": [1, 2]}])).to_string();
    assert!(err.contains("frame 0: a frame must be an image"), "{err}");
    // The server reads no local files: frames inline only.
    let tmp = tempfile::tempdir().unwrap();
    let frame = tmp.path().join("frame.png");
    std::fs::write(&frame, &png).unwrap();
    let json = serde_json::json!([{"role": "user", "content": [{"type": "video", "video": [frame.display().to_string()]}]}]);
    let err = parse_messages_json_with(&json.to_string(), MediaAccess::InlineOnly).unwrap_err().to_string();
    assert!(err.contains("content part 0 (video): frame 0") && err.contains("as data: URLs"), "{err}");
    let ok = parse_messages_json_with(&json.to_string(), MediaAccess::LocalFiles).unwrap();
    assert_eq!(ok[0].images[0].video.as_ref().map(Vec::len), Some(1));
    // Round trip: serialized with its frames inline, it reads back the same.
    let back = parse_messages_json(&serde_json::to_string(&ok).unwrap()).unwrap();
    assert_eq!(back, ok);

    let text_only = Session::load(common::tiny_llama_dir().path()).unwrap();
    assert!(!text_only.info().supports_video);
    let msgs = vec![ChatMessage::user_with_images(vec![
        ContentPart::Text("what happens?".into()),
        ContentPart::Video(vec![ImageData::new(png.clone()), ImageData::new(png)]),
    ])];
    let err = text_only.generate(&msgs, GenerateOptions { max_tokens: 2, ..Default::default() }).unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGUMENT");
    assert!(err.to_string().contains("message 0 holds a video part, and this model takes no video"), "{err}");
}

/// Bad checkpoints: a missing vision tensor is named, a bad vision_config field is named. No Python.
#[test]
fn gemma4_vision_bad_checkpoints_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let config = serde_json::json!({
        "model_type": "gemma4",
        "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "patch_size": 4,
                          "position_embedding_size": 64, "pooling_kernel_size": 2},
        "text_config": {"model_type": "gemma4_text", "hidden_size": 48, "num_hidden_layers": 1,
                        "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
                        "head_dim": 16, "global_head_dim": 16, "vocab_size": 320,
                        "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0}
    });
    let path = dir.path().join("config.json");
    std::fs::write(&path, config.to_string()).unwrap();
    // Every vision tensor but the first layer's query projection.
    let (d, p) = (32usize, 4usize);
    let t = |name: &str, shape: &[usize]| RawTensor::f32(name, shape, &vec![0.01; shape.iter().product()]);
    let mut tensors = vec![
        t("vision_tower.patch_embedder.input_proj.weight", &[d, 3 * p * p]),
        t("vision_tower.patch_embedder.position_embedding_table", &[2, 64, d]),
        t("embed_vision.embedding_projection.weight", &[48, d]),
    ];
    let l = "vision_tower.encoder.layers.0";
    for n in ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"] {
        tensors.push(t(&format!("{l}.{n}.weight"), &[d]));
    }
    for n in ["q_norm", "k_norm"] {
        tensors.push(t(&format!("{l}.self_attn.{n}.weight"), &[16]));
    }
    for n in ["k_proj", "v_proj", "o_proj"] {
        tensors.push(t(&format!("{l}.self_attn.{n}.linear.weight"), &[d, d]));
    }
    common::write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    let store = RefCell::new(WeightStore::open(dir.path()).unwrap());
    let err = Gemma4Vision::load(&cfg.raw, &Vb::new(&store, None)).err().expect("a tensor is missing").to_string();
    assert!(err.contains("vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight"), "{err}");
    // Through the model builder too.
    let store = RefCell::new(WeightStore::open(dir.path()).unwrap());
    let err = mlex::models::build_model(&cfg, &Vb::new(&store, None)).err().expect("a tensor is missing").to_string();
    assert!(err.contains("vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight"), "{err}");

    let store = RefCell::new(WeightStore::open(dir.path()).unwrap());
    let mut bad = cfg.raw.clone();
    bad["vision_config"]["head_dim"] = 18.into();
    let err = Gemma4Vision::load(&bad, &Vb::new(&store, None)).err().expect("head_dim 18").to_string();
    assert!(err.contains("head_dim 18 is not a multiple of 4"), "{err}");
    bad["vision_config"]["head_dim"] = 16.into();
    bad["vision_config"]["rope_parameters"] = serde_json::json!({"rope_theta": -1});
    let err = Gemma4Vision::load(&bad, &Vb::new(&store, None)).err().expect("negative theta").to_string();
    assert!(err.contains("rope_theta"), "{err}");
}

/// Speed, side by side with mlx-vlm in the same run (not a pass/fail test): the Gemma 4 vision
/// encoder and embedder at mlx-vlm's default widths on one image, same random weights, best of 3
/// after a warm-up.
///
/// `MLEX_ORACLE_VENV=<venv> [MLEX_BENCH_SIZE=336] cargo test --release --test vision_gemma4 -- --ignored --nocapture bench_`
#[test]
#[ignore]
fn bench_gemma4_tower_against_mlx_vlm() {
    let Some(python) = require_oracle("bench_gemma4_tower_against_mlx_vlm") else { return };
    let size = std::env::var("MLEX_BENCH_SIZE").unwrap_or_else(|_| "336".into());
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(&python)
        .arg(repo_root().join("tests/oracle/gemma4_vision_bench.py"))
        .arg(out.path())
        .args(["--size", &size, "--runs", "3"])
        .status()
        .unwrap();
    assert!(status.success(), "the oracle failed");
    let bench: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.path().join("bench.json")).unwrap()).unwrap();
    let theirs: Vec<f64> = bench["ms"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let pixels = f32_array(&read_tensors(&out.path().join("pixels.safetensors"))[0]);
    let vision = load_vision(model_dir(out.path(), &["config.json", "model.safetensors"]).path());
    let encode = || {
        let t0 = std::time::Instant::now();
        vision.encode(&pixels).unwrap().eval().unwrap();
        t0.elapsed().as_secs_f64() * 1e3
    };
    encode();
    let ours: Vec<f64> = (0..3).map(|_| encode()).collect();
    let best = |v: &[f64]| v.iter().cloned().fold(f64::INFINITY, f64::min);
    println!(
        "gemma4 tower + embedder, {size} px ({} tokens), one image: mlex {ours:.1?} ms, mlx-vlm {theirs:.1?} ms: best {:.1} vs {:.1} ms, {:.2}x",
        bench["tokens"],
        best(&ours),
        best(&theirs),
        best(&theirs) / best(&ours)
    );
}
