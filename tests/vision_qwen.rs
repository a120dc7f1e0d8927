//! Qwen3.5, Qwen3-VL and Qwen2.5-VL vision against mlx-vlm 0.7.10 (issue 15).
//!
//! tests/oracle/qwen3_5_vlm.py builds mlx-vlm's whole qwen3_5 Model (the Qwen3-VL vision tower
//! and the hybrid Qwen3.5 text model with interleaved multimodal rope) on tiny random weights:
//! - the tower's output for two images (15 and 12 merged tokens) must match within 1e-4;
//! - mlx-vlm's Qwen3VLImageProcessor on images of odd sizes (kept, downscaled by max_pixels,
//!   upscaled by min_pixels) must give our pixels exactly, with the same grid;
//! - for a prompt holding a PNG (and with `--two-images` two PNGs), mlex loads the same
//!   checkpoint (a VisionLm with 3-D rope positions), binds the PNGs and must give the same first
//!   logits (1e-4) and the same 32 greedy tokens, directly and through a Session with a chat
//!   template (whole and in prefill chunks of 10), and a second turn resumes from the first
//!   prompt's cached prefix with the tokens of a fresh session;
//! - the same greedy tokens for qwen3_5_moe (`--moe`), for a 4-bit quantized model
//!   (`--quantize`: the tower's linears and position table too), and for the checkpoint rewritten
//!   in Hugging Face's layout; bad checkpoints and bad images are errors naming the problem.
//!
//! tests/oracle/qwen2_5_vl_vlm.py does the same for Qwen2.5-VL (the window-attention tower, the
//! Qwen2 decoder with chunked multimodal rope, a flat config.json): tower within 1e-4, first
//! logits 1e-4, 32 greedy tokens for a two-image prompt, directly and through a Session.
//!
//! tests/oracle/qwen3_vl_vlm.py does the same for Qwen3-VL (the Qwen3-VL tower with two deepstack
//! mergers, the Qwen3 decoder with q/k norms and interleaved multimodal rope, the deepstack
//! features added after its first two layers): tower rows and deepstack features within 1e-4
//! (images and video), first logits 1e-4 and 32 greedy tokens for image, two-image, 4-bit and
//! video prompts, through a Session, text-only and Hugging Face layouts, bad checkpoints.
//!
//! Video (given as frames), with `--video`: both scripts run mlx-vlm's numpy
//! Qwen3VLVideoProcessor (its own pixel budget, from video_preprocessor_config.json) on a 3-frame
//! video of odd size and on videos of odd sizes and frame counts: our pixels must be within 1/255
//! (and the same grid); the tower on the video's patches within 1e-4; for a prompt holding the
//! video (Qwen3.5: a timestamp and a block per temporal group; Qwen2.5-VL: one block), the rope
//! placement of the video's rows gives get_rope_index's position ids, the first logits within 1e-4 and the same 32 greedy tokens, directly, in two prefill chunks and through
//! a Session with a chat template (a second turn resuming from the cached prefix), for
//! qwen3_5_moe and a 4-bit quantized Qwen3.5 too; bad videos (frames of two sizes, too many or too small
//! frames, none) are INVALID_ARGUMENT naming the part.
//!
//! Without `MLEX_ORACLE_VENV` (the venv holding mlx-vlm) the oracle tests skip, saying so.
mod common;

use common::oracle_arrays::{f32_array, f32_values, greedy, i32_values, max_abs_diff};
use common::{read_tensors, repo_root, require_oracle, RawTensor};
use mlex::loader::{ModelConfig, Vb, WeightStore};
use mlex::media::{decode_image, QwenImageProcessor, QwenVideoProcessor, RgbImage};
use mlex::mlx::{Array, Dtype};
use mlex::models::qwen_vision::{QwenTower, QwenVision};
use mlex::models::vision_lm::{ImageData, MEDIA_TOKEN_BASE};
use std::cell::RefCell;
use std::path::Path;
use std::process::Command;

const IMAGE_PAD: u32 = 300;

const QWEN3_5: &str = "qwen3_5_vlm.py";
const QWEN2_5_VL: &str = "qwen2_5_vl_vlm.py";

fn run_oracle(args: &[&str], test: &str) -> Option<tempfile::TempDir> {
    run_script(QWEN3_5, args, test)
}

fn run_script(script: &str, args: &[&str], test: &str) -> Option<tempfile::TempDir> {
    let python = require_oracle(test)?;
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(&python)
        .arg(repo_root().join("tests/oracle").join(script))
        .arg(out.path())
        .args(args)
        .status()
        .unwrap();
    assert!(status.success(), "the oracle {script} failed");
    Some(out)
}

/// A checkpoint directory holding `files` of the oracle's output (its io.safetensors stays out).
fn model_dir(out: &Path, files: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in files {
        std::fs::copy(out.join(f), dir.path().join(f)).unwrap();
    }
    dir
}

const CHECKPOINT: [&str; 3] = ["config.json", "preprocessor_config.json", "model.safetensors"];

fn processor() -> QwenImageProcessor {
    QwenImageProcessor { patch_size: 4, min_pixels: 256, max_pixels: 1920, ..Default::default() }
}

#[test]
fn qwen3_5_vision_tower_and_preprocessing_match_mlx_vlm() {
    let Some(out) = run_oracle(&[], "qwen3_5_vision_tower_and_preprocessing_match_mlx_vlm") else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let dir = model_dir(out.path(), &CHECKPOINT);
    let path = dir.path().join("config.json");
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    let store = RefCell::new(WeightStore::open(dir.path()).unwrap());
    let vb = Vb::new(&store, None);
    let vision = QwenVision::load(&cfg.raw, &vb).unwrap().expect("a vision_config");
    vb.pp("language_model").discard_all();
    store.into_inner().finish().expect("the tower takes every vision tensor");
    for (tag, tokens) in [("a", 15), ("b", 12)] {
        let grid = i32_values(get(&format!("grid_{tag}")));
        let (gh, gw) = (grid[1] as usize, grid[2] as usize);
        let rows = vision.forward(&f32_array(get(&format!("pixels_{tag}"))), gh, gw).unwrap();
        assert_eq!(rows.shape(), [tokens, 64]);
        let d = max_abs_diff(&rows, &f32_array(get(&format!("tower_{tag}"))));
        assert!(d <= 1e-4, "image {tag}: the tower differs from mlx-vlm's by {d}");
        eprintln!("image {tag} ({gh}x{gw} patches, {tokens} rows): max |Δ| {d:e}");
    }
    let err = vision.forward(&Array::zeros(&[6, 96], Dtype::Float32).unwrap(), 2, 3).unwrap_err().to_string();
    assert!(err.contains("multiple of 2"), "{err}");

    // Preprocessing: the processor's patches for images of odd sizes, exactly.
    let p = processor();
    let mut k = 0;
    while let Some(img) = io.iter().find(|t| t.name == format!("image_{k}")) {
        let (h, w) = (img.shape[0] as u32, img.shape[1] as u32);
        let ours = p.preprocess(&RgbImage::from_raw(w, h, img.data.clone()).unwrap()).unwrap();
        let grid = i32_values(get(&format!("grid_{k}")));
        assert_eq!([ours.grid.0, ours.grid.1, ours.grid.2].map(|v| v as i32).to_vec(), grid, "image {k} ({w}x{h}): grid");
        let want = f32_values(get(&format!("processed_{k}")));
        assert_eq!(ours.data.len(), want.len(), "image {k}");
        let d = ours.data.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert_eq!(d, 0.0, "image {k} ({w}x{h}, grid {grid:?}): pixels differ from mlx-vlm's by {d}");
        k += 1;
    }
    assert_eq!(k, 12);
}

/// The oracle's images (image.png, and image2.png with --two-images).
fn oracle_images(out: &Path, two: bool) -> Vec<Vec<u8>> {
    let names: &[&str] = if two { &["image.png", "image2.png"] } else { &["image.png"] };
    names.iter().map(|f| std::fs::read(out.join(f)).unwrap()).collect()
}

/// Runs of the image token collapsed to one (what the chat template writes).
fn collapsed(ids: &[u32]) -> Vec<u32> {
    let mut out: Vec<u32> = vec![];
    for &t in ids {
        if t == IMAGE_PAD && out.last() == Some(&IMAGE_PAD) {
            continue;
        }
        out.push(t);
    }
    out
}

#[test]
fn qwen3_5_image_prompt_matches_mlx_vlm_greedy() {
    image_prompt_matches(QWEN3_5, "qwen3_5_image_prompt_matches_mlx_vlm_greedy", &[]);
}

#[test]
fn qwen3_5_two_image_prompt_matches_mlx_vlm_greedy() {
    image_prompt_matches(QWEN3_5, "qwen3_5_two_image_prompt_matches_mlx_vlm_greedy", &["--two-images"]);
}

/// qwen3_5_moe: the same tower in front of the mixture-of-experts text model.
#[test]
fn qwen3_5_moe_image_prompt_matches_mlx_vlm_greedy() {
    image_prompt_matches(QWEN3_5, "qwen3_5_moe_image_prompt_matches_mlx_vlm_greedy", &["--two-images", "--moe"]);
}

/// Quantized as mlx-vlm's convert does (4 bits, groups of 32: the tower's linears and its
/// position table too).
#[test]
fn qwen3_5_quantized_image_prompt_matches_mlx_vlm_greedy() {
    image_prompt_matches(QWEN3_5, "qwen3_5_quantized_image_prompt_matches_mlx_vlm_greedy", &["--two-images", "--quantize"]);
}

fn image_prompt_matches(script: &str, test: &str, args: &[&str]) {
    let two = args.contains(&"--two-images");
    let Some(out) = run_script(script, args, test) else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let ids: Vec<u32> = i32_values(get("input_ids")).into_iter().map(|t| t as u32).collect();
    let want: Vec<u32> = i32_values(get("tokens")).into_iter().map(|t| t as u32).collect();

    let dir = model_dir(out.path(), &CHECKPOINT);
    let path = dir.path().join("config.json");
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    let store = RefCell::new(WeightStore::open(dir.path()).unwrap());
    let model = mlex::models::build_model(&cfg, &Vb::new(&store, None)).unwrap();
    store.into_inner().finish().expect("every tensor of the checkpoint is used");
    let prompt = model.image_prompt().expect("a checkpoint with vision_config takes images");
    assert_eq!((prompt.marker.as_str(), prompt.image_token, prompt.placeholder_tokens), ("<|image_pad|>", IMAGE_PAD, 1));

    let images: Vec<ImageData> = oracle_images(out.path(), two).into_iter().map(ImageData::new).collect();
    let refs: Vec<&ImageData> = images.iter().collect();
    let bound = model.bind_images(collapsed(&ids), &refs).unwrap();
    assert_eq!(bound.len(), ids.len(), "the images take 15 (and 12) tokens");
    for (i, (&b, &t)) in bound.iter().zip(&ids).enumerate() {
        assert_eq!(b >= MEDIA_TOKEN_BASE, t == IMAGE_PAD, "position {i}");
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

    // In two chunks (the text before the first image, the rest): the same logits.
    let start = bound.iter().position(|&t| t >= MEDIA_TOKEN_BASE).unwrap();
    assert_eq!(model.prefill_chunk_len(&bound, start + 3), start, "a chunk never splits an image");
    let mut caches = model.make_caches();
    model.forward_prompt(&bound[..start], &mut caches).unwrap();
    let logits = model.forward_prompt(&bound[start..], &mut caches).unwrap();
    let n = (bound.len() - start) as i32;
    let d2 = max_abs_diff(&logits.slice_axis(1, n - 1, n).unwrap().reshape(&[-1]).unwrap(), &last);
    assert!(d2 <= 1e-5, "chunked prefill differs by {d2}");
}

/// A byte-level tokenizer over the oracle model's 320 ids: bytes as themselves, Qwen's vision
/// tokens at 300..=303, `<|im_end|>` 304; the template writes the oracle's prompt text.
fn write_qwen_tokenizer(dir: &Path) {
    let mut tok = common::tiny_tokenizer_json();
    let specials = [(300, "<|image_pad|>"), (301, "<|vision_start|>"), (302, "<|vision_end|>"), (303, "<|video_pad|>"), (304, "<|im_end|>")];
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
    let template = "{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }}\
        {% else %}{% for item in message['content'] %}\
        {% if item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>\
        {% elif item['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>\
        {% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}\
        {% endfor %}{% endif %}{% endfor %}";
    let config = serde_json::json!({"eos_token": "<|im_end|>", "chat_template": template, "tokenizer_class": "PreTrainedTokenizerFast"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
}

/// The whole path: a Session reports images, expands the template's image marker, decodes and
/// preprocesses the PNG, and gives mlx-vlm's 32 greedy tokens; a second turn resumes from the
/// first prompt's cached prefix (the image's shift carried) with a fresh session's tokens.
#[test]
fn qwen3_5_images_through_a_session() {
    images_through_a_session(QWEN3_5, "qwen3_5_images_through_a_session");
}

fn images_through_a_session(script: &str, test: &str) {
    use mlex::chat::ContentPart;
    use mlex::{ChatMessage, GenerateOptions, Session};

    let Some(out) = run_script(script, &["--two-images"], test) else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let ids: Vec<u32> = i32_values(get("input_ids")).into_iter().map(|t| t as u32).collect();
    let want: Vec<u32> = i32_values(get("tokens")).into_iter().map(|t| t as u32).collect();
    let dir = model_dir(out.path(), &CHECKPOINT);
    write_qwen_tokenizer(dir.path());
    let images = oracle_images(out.path(), true);
    let parts = vec![
        ContentPart::Text("look: ".into()),
        ContentPart::Image(ImageData::new(images[0].clone())),
        ContentPart::Text(" and ".into()),
        ContentPart::Image(ImageData::new(images[1].clone())),
        ContentPart::Text(" what is it?".into()),
    ];
    let ask = vec![ChatMessage::user_with_images(parts)];
    for step in [512, 10] {
        let session = Session::load(dir.path()).unwrap();
        assert!(session.info().supports_images);
        let opts = GenerateOptions { max_tokens: want.len(), ignore_eos: true, prefill_step_size: step, ..Default::default() };
        let reply = session.generate(&ask, opts).unwrap();
        assert_eq!(reply.usage.prompt_tokens, ids.len(), "the prompt as mlx-vlm's processor expands it");
        assert_eq!(reply.tokens, want, "prefill chunks of {step}: greedy tokens through the session differ from mlx-vlm's");
    }

    // A truncated PNG is INVALID_ARGUMENT naming the image, never a crash.
    let session = Session::load(dir.path()).unwrap();
    let bad = vec![ChatMessage::user_with_images(vec![
        ContentPart::Text("look: ".into()),
        ContentPart::Image(ImageData::new(images[0][..images[0].len() / 2].to_vec())),
        ContentPart::Text(" what is it?".into()),
    ])];
    let err = session.generate(&bad, GenerateOptions { max_tokens: 2, ..Default::default() }).unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGUMENT", "{err}");
    assert!(err.to_string().contains("image 1"), "{err}");

    // A second turn: its prompt extends the first's; the warm session resumes from the first
    // prompt's snapshot and must give what a fresh session gives.
    let mut turn2 = ask.clone();
    turn2.push(ChatMessage::assistant("ok."));
    turn2.push(ChatMessage::user(" and now?"));
    let opts = || GenerateOptions { max_tokens: 16, ignore_eos: true, ..Default::default() };
    let warm = Session::load(dir.path()).unwrap();
    warm.generate(&ask, opts()).unwrap();
    let second = warm.generate(&turn2, opts()).unwrap();
    assert!(second.usage.cached_tokens >= ids.len() - 1, "the second turn reused {} cached tokens", second.usage.cached_tokens);
    let fresh = Session::load(dir.path()).unwrap().generate(&turn2, opts()).unwrap();
    assert_eq!(fresh.usage.cached_tokens, 0);
    assert_eq!(second.tokens, fresh.tokens, "the second turn over the cached prefix differs from a fresh session's");
}

/// Bad checkpoints are errors naming the problem: a missing tower tensor, a bad vision field.
#[test]
fn qwen3_5_vision_bad_checkpoints_name_the_problem() {
    let Some(out) = run_oracle(&[], "qwen3_5_vision_bad_checkpoints_name_the_problem") else { return };
    let load = |dir: &Path| -> String {
        let path = dir.join("config.json");
        let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
        let store = RefCell::new(WeightStore::open(dir).unwrap());
        match mlex::models::build_model(&cfg, &Vb::new(&store, None)) {
            Ok(_) => panic!("loaded"),
            Err(e) => e.to_string(),
        }
    };
    // A missing tensor of the tower.
    let dir = model_dir(out.path(), &CHECKPOINT);
    let st = dir.path().join("model.safetensors");
    let tensors: Vec<RawTensor> = read_tensors(&st).into_iter().filter(|t| t.name != "vision_tower.blocks.1.attn.qkv.bias").collect();
    common::write_safetensors(&st, &tensors);
    let err = load(dir.path());
    assert!(err.contains("vision_tower.blocks.1.attn.qkv.bias"), "{err}");
    // Bad vision_config fields.
    for (field, value, says) in [
        ("num_heads", serde_json::json!(0), "num_heads"),
        ("num_position_embeddings", serde_json::json!(60), "not a square"),
        ("deepstack_visual_indexes", serde_json::json!([1]), "deepstack"),
        ("out_hidden_size", serde_json::json!(32), "out_hidden_size"),
        ("patch_size", serde_json::json!("big"), "patch_size"),
    ] {
        let dir = model_dir(out.path(), &CHECKPOINT);
        common::edit_json(&dir.path().join("config.json"), |c| c["vision_config"][field] = value.clone());
        let err = load(dir.path());
        assert!(err.contains(says) && err.contains("config.json"), "{field}: {err}");
    }
    // A processor whose patches do not fit the tower.
    let dir = model_dir(out.path(), &CHECKPOINT);
    common::edit_json(&dir.path().join("preprocessor_config.json"), |c| c["patch_size"] = 8.into());
    let err = load(dir.path());
    assert!(err.contains("patch_size 8"), "{err}");
    // A bad video processor config names its file; one whose patches do not fit the tower leaves
    // the model without video (images still served).
    let dir = model_dir(out.path(), &CHECKPOINT);
    std::fs::write(dir.path().join("video_preprocessor_config.json"), r#"{"patch_size": 4, "fps": 0}"#).unwrap();
    let err = load(dir.path());
    assert!(err.contains("video_preprocessor_config.json") && err.contains("fps"), "{err}");
    std::fs::write(dir.path().join("video_preprocessor_config.json"), r#"{"patch_size": 8}"#).unwrap();
    let path = dir.path().join("config.json");
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    let store = RefCell::new(WeightStore::open(dir.path()).unwrap());
    let model = mlex::models::build_model(&cfg, &Vb::new(&store, None)).unwrap();
    assert!(model.image_prompt().is_some_and(|p| p.video.is_none()), "a video processor of 8-pixel patches for a 4-pixel tower");
    // Bad images are INVALID_ARGUMENT, never a crash.
    let p = processor();
    let strip = RgbImage::from_raw(300, 1, vec![0; 900]).unwrap();
    assert!(p.preprocess(&strip).unwrap_err().to_string().contains("aspect ratio"));
    assert!(p.preprocess_bytes(b"not an image").is_err());
}

// ---- Qwen2.5-VL ----------------------------------------------------------------------------

/// tests/oracle/qwen2_5_vl_vlm.py: mlx-vlm's qwen2_5_vl Model (window-attention tower, Qwen2
/// decoder with chunked multimodal rope); its 16-pixel windows put the images' merged grids
/// (3 x 5 and 6 x 2) into partial windows, one block of three attends to the whole image.
#[test]
fn qwen2_5_vl_tower_matches_mlx_vlm() {
    use mlex::models::qwen2_5_vision::Qwen25Vision;
    let Some(out) = run_script(QWEN2_5_VL, &[], "qwen2_5_vl_tower_matches_mlx_vlm") else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let dir = model_dir(out.path(), &CHECKPOINT);
    let path = dir.path().join("config.json");
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    let store = RefCell::new(WeightStore::open(dir.path()).unwrap());
    let vb = Vb::new(&store, None);
    let vision = Qwen25Vision::load(&cfg.raw, &vb).unwrap().expect("a vision_config");
    vb.pp("language_model").discard_all();
    store.into_inner().finish().expect("the tower takes every vision tensor");
    for (tag, tokens) in [("a", 15), ("b", 12)] {
        let grid = i32_values(get(&format!("grid_{tag}")));
        let (gh, gw) = (grid[1] as usize, grid[2] as usize);
        let rows = vision.forward(&f32_array(get(&format!("pixels_{tag}"))), gh, gw).unwrap();
        assert_eq!(rows.shape(), [tokens, 64]);
        let d = max_abs_diff(&rows, &f32_array(get(&format!("tower_{tag}"))));
        assert!(d <= 1e-4, "image {tag}: the tower differs from mlx-vlm's by {d}");
        eprintln!("qwen2.5-vl image {tag} ({gh}x{gw} patches, {tokens} rows): max |Δ| {d:e}");
    }
}

#[test]
fn qwen2_5_vl_two_image_prompt_matches_mlx_vlm_greedy() {
    image_prompt_matches(QWEN2_5_VL, "qwen2_5_vl_two_image_prompt_matches_mlx_vlm_greedy", &["--two-images"]);
}

#[test]
fn qwen2_5_vl_images_through_a_session() {
    images_through_a_session(QWEN2_5_VL, "qwen2_5_vl_images_through_a_session");
}

#[test]
fn qwen2_5_vl_bad_checkpoints_name_the_problem() {
    let Some(out) = run_script(QWEN2_5_VL, &[], "qwen2_5_vl_bad_checkpoints_name_the_problem") else { return };
    let load = |dir: &Path| -> String {
        let path = dir.join("config.json");
        let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
        let store = RefCell::new(WeightStore::open(dir).unwrap());
        match mlex::models::build_model(&cfg, &Vb::new(&store, None)) {
            Ok(_) => panic!("loaded"),
            Err(e) => e.to_string(),
        }
    };
    let dir = model_dir(out.path(), &CHECKPOINT);
    let st = dir.path().join("model.safetensors");
    let tensors: Vec<RawTensor> = read_tensors(&st).into_iter().filter(|t| t.name != "vision_tower.merger.mlp.2.bias").collect();
    common::write_safetensors(&st, &tensors);
    let err = load(dir.path());
    assert!(err.contains("vision_tower.merger.mlp.2.bias"), "{err}");
    let dir = model_dir(out.path(), &CHECKPOINT);
    common::edit_json(&dir.path().join("config.json"), |c| c["vision_config"]["window_size"] = 4.into());
    let err = load(dir.path());
    assert!(err.contains("window_size") && err.contains("config.json"), "{err}");
    let dir = model_dir(out.path(), &CHECKPOINT);
    common::edit_json(&dir.path().join("config.json"), |c| c["rope_scaling"]["type"] = "yarn".into());
    let err = load(dir.path());
    assert!(err.contains("rope_scaling.type"), "{err}");
}

/// The oracle's checkpoint rewritten as Hugging Face stores Qwen3.5 (`model.language_model.*`,
/// `model.visual.*`, `lm_head`; conv1d `[C, 1, K]`, the Conv3d patch weight `[out, C, T, p, p]`,
/// the decoder's RMSNorm weights as w in `1 + w`, as mlx-vlm's sanitize reads them) loads to the
/// same model: the same 32 greedy tokens.
#[test]
fn qwen3_5_hugging_face_layout_gives_the_same_tokens() {
    let Some(out) = run_oracle(&[], "qwen3_5_hugging_face_layout_gives_the_same_tokens") else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let ids: Vec<u32> = i32_values(get("input_ids")).into_iter().map(|t| t as u32).collect();
    let want: Vec<u32> = i32_values(get("tokens")).into_iter().map(|t| t as u32).collect();
    let dir = model_dir(out.path(), &CHECKPOINT);
    let st = dir.path().join("model.safetensors");
    let shifted = [".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight", ".q_norm.weight", ".k_norm.weight"];
    let tensors: Vec<RawTensor> = read_tensors(&st)
        .into_iter()
        .map(|t| {
            let mut values = f32_values(&t);
            let mut shape = t.shape.clone();
            let name = if let Some(rest) = t.name.strip_prefix("language_model.model.") {
                format!("model.language_model.{rest}")
            } else if let Some(rest) = t.name.strip_prefix("language_model.") {
                rest.to_string()
            } else {
                t.name.replacen("vision_tower.", "model.visual.", 1)
            };
            // mlx-vlm's sanitize shifts these (named as it renames them) when reading this layout.
            if t.name.starts_with("language_model.") && shifted.iter().any(|s| t.name.ends_with(s)) {
                values.iter_mut().for_each(|v| *v -= 1.0);
            }
            if name.ends_with("conv1d.weight") {
                shape = vec![shape[0], 1, shape[1]];
            }
            if name.ends_with("patch_embed.proj.weight") {
                // [O, T, p, p, C] → [O, C, T, p, p]
                let (o, tt, p, c) = (shape[0], shape[1], shape[2], shape[4]);
                let mut moved = vec![0f32; values.len()];
                for oi in 0..o {
                    for ti in 0..tt {
                        for y in 0..p {
                            for x in 0..p {
                                for ci in 0..c {
                                    let from = (((oi * tt + ti) * p + y) * p + x) * c + ci;
                                    let to = (((oi * c + ci) * tt + ti) * p + y) * p + x;
                                    moved[to] = values[from];
                                }
                            }
                        }
                    }
                }
                values = moved;
                shape = vec![o, c, tt, p, p];
            }
            RawTensor::f32(&name, &shape, &values)
        })
        .collect();
    common::write_safetensors(&st, &tensors);
    let path = dir.path().join("config.json");
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    let store = RefCell::new(WeightStore::open(dir.path()).unwrap());
    let model = mlex::models::build_model(&cfg, &Vb::new(&store, None)).unwrap();
    store.into_inner().finish().expect("every tensor of the checkpoint is used");
    let image = ImageData::new(std::fs::read(out.path().join("image.png")).unwrap());
    let bound = model.bind_images(collapsed(&ids), &[&image]).unwrap();
    let mut caches = model.make_caches();
    let logits = model.forward_prompt(&bound, &mut caches).unwrap();
    let l = bound.len() as i32;
    let got = greedy(&logits.slice_axis(1, l - 1, l).unwrap().reshape(&[-1]).unwrap(), want.len(), |t| {
        model.forward(&Array::from_slice(&[t], &[1, 1]).unwrap(), &mut caches).unwrap()
    });
    assert_eq!(got, want, "the Hugging Face layout gives other tokens");
}

/// The Qwen3.5 tower's time on one image against mlx-vlm's (`MLEX_BENCH_SIZE` pixels a side,
/// default 448: 196 tokens; Qwen3-VL-2B's tower widths with `MLEX_BENCH_DEPTH` blocks, default
/// 4 (the real 24 take minutes a run on a small CPU), float32, random weights). On the CPU the
/// ratio mostly measures matmuls: mlex's own CPU GEMM (src/mlx/cpu_gemm.cpp) against the pip
/// wheel's bundled reference BLAS; compare on the GPU for the towers themselves.
#[test]
#[ignore]
fn bench_qwen3_5_tower_against_mlx_vlm() {
    let Some(python) = require_oracle("bench_qwen3_5_tower_against_mlx_vlm") else { return };
    let size = std::env::var("MLEX_BENCH_SIZE").unwrap_or_else(|_| "448".into());
    let depth = std::env::var("MLEX_BENCH_DEPTH").unwrap_or_else(|_| "4".into());
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(&python)
        .arg(repo_root().join("tests/oracle/qwen3_5_vision_bench.py"))
        .arg(out.path())
        .args(["--size", &size, "--runs", "3", "--depth", &depth])
        .status()
        .unwrap();
    assert!(status.success(), "the oracle failed");
    let bench: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.path().join("bench.json")).unwrap()).unwrap();
    let theirs: Vec<f64> = bench["ms"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let io = read_tensors(&out.path().join("pixels.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let (pixels, grid) = (f32_array(get("pixels")), i32_values(get("grid")));
    let dir = model_dir(out.path(), &["config.json", "model.safetensors"]);
    let path = dir.path().join("config.json");
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    let store = RefCell::new(WeightStore::open(dir.path()).unwrap());
    let vision = QwenVision::load(&cfg.raw, &Vb::new(&store, None)).unwrap().unwrap();
    let (gh, gw) = (grid[1] as usize, grid[2] as usize);
    let encode = || {
        let t0 = std::time::Instant::now();
        vision.forward(&pixels, gh, gw).unwrap().eval().unwrap();
        t0.elapsed().as_secs_f64() * 1e3
    };
    encode();
    let ours: Vec<f64> = (0..3).map(|_| encode()).collect();
    let best = |v: &[f64]| v.iter().cloned().fold(f64::INFINITY, f64::min);
    println!(
        "qwen3_5 tower ({depth} blocks), {size} px ({} tokens), one image: mlex {ours:.1?} ms, mlx-vlm {theirs:.1?} ms: best {:.1} vs {:.1} ms, {:.2}x",
        bench["tokens"],
        best(&ours),
        best(&theirs),
        best(&theirs) / best(&ours)
    );
}

// ---- video (as frames) ----------------------------------------------------------------------

const VIDEO_PAD: u32 = 303;

/// The oracle video's frames (frame_0.png …).
fn oracle_frames(out: &Path) -> Vec<ImageData> {
    (0..).map(|k| out.join(format!("frame_{k}.png"))).take_while(|p| p.is_file()).map(|p| ImageData::new(std::fs::read(p).unwrap())).collect()
}

/// Runs of the video token collapsed to one (what the chat template and our expansion write).
fn collapsed_video(ids: &[u32]) -> Vec<u32> {
    let mut out: Vec<u32> = vec![];
    for &t in ids {
        if t == VIDEO_PAD && out.last() == Some(&VIDEO_PAD) {
            continue;
        }
        out.push(t);
    }
    out
}

fn video_processing_and_tower_match(script: &str, test: &str, tower: &dyn Fn(&ModelConfig, &Vb) -> Box<dyn QwenTower>) {
    let Some(out) = run_script(script, &["--video"], test) else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.path().join("video_preprocessor_config.json")).unwrap()).unwrap();
    let p = QwenVideoProcessor::from_config(&cfg, 16).unwrap();
    assert_eq!((p.frame.patch_size, p.frame.min_pixels, p.frame.max_pixels, p.fps), (4, 512, 4096, 2.0));
    let check = |what: &str, ours: &mlex::media::QwenPixels, pixels: &RawTensor, grid: &RawTensor| -> f32 {
        let grid = i32_values(grid);
        assert_eq!([ours.grid.0, ours.grid.1, ours.grid.2].map(|v| v as i32).to_vec(), grid, "{what}: grid");
        let want = f32_values(pixels);
        assert_eq!(ours.data.len(), want.len(), "{what}");
        let d = ours.data.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(d <= 1.0 / 255.0, "{what} (grid {grid:?}): pixels differ from mlx-vlm's by {d}");
        d
    };
    // The processor alone on videos of odd sizes and frame counts.
    let mut k = 0;
    let mut worst = 0f32;
    while let Some(v) = io.iter().find(|t| t.name == format!("video_{k}")) {
        let (t, h, w) = (v.shape[0], v.shape[1], v.shape[2]);
        let frames: Vec<RgbImage> =
            v.data.chunks_exact(h * w * 3).map(|f| RgbImage::from_raw(w as u32, h as u32, f.to_vec()).unwrap()).collect();
        assert_eq!(frames.len(), t);
        let ours = p.preprocess(&frames).unwrap();
        worst = worst.max(check(&format!("video {k} ({t} frames of {w}x{h})"), &ours, get(&format!("vprocessed_{k}")), get(&format!("vgrid_{k}"))));
        k += 1;
    }
    assert_eq!(k, 8);
    // The oracle video, from its PNG frames.
    let frames: Vec<RgbImage> = oracle_frames(out.path()).iter().map(|f| decode_image(&f.bytes).unwrap()).collect();
    let ours = p.preprocess(&frames).unwrap();
    worst = worst.max(check("the oracle video", &ours, get("video_pixels"), get("video_grid")));
    eprintln!("{script}: video pixels: max |Δ| {worst:e} (8 videos and the oracle's)");

    let dir = model_dir(out.path(), &CHECKPOINT);
    let path = dir.path().join("config.json");
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    let store = RefCell::new(WeightStore::open(dir.path()).unwrap());
    let vision = tower(&cfg, &Vb::new(&store, None));
    let (t, gh, gw) = ours.grid;
    let rows = vision.forward_groups(&f32_array(get("video_pixels")), t, gh, gw).unwrap();
    assert_eq!(rows.shape(), [30, 64]);
    let d = max_abs_diff(&rows, &f32_array(get("video_tower")));
    assert!(d <= 1e-4, "the tower on the video differs from mlx-vlm's by {d}");
    eprintln!("{script}: video tower ({t} groups of {gh}x{gw} patches, 30 rows): max |Δ| {d:e}");
}

#[test]
fn qwen3_5_video_preprocessing_and_tower_match_mlx_vlm() {
    video_processing_and_tower_match(QWEN3_5, "qwen3_5_video_preprocessing_and_tower_match_mlx_vlm", &|cfg, vb| {
        Box::new(QwenVision::load(&cfg.raw, vb).unwrap().expect("a vision_config"))
    });
}

#[test]
fn qwen2_5_vl_video_preprocessing_and_tower_match_mlx_vlm() {
    use mlex::models::qwen2_5_vision::Qwen25Vision;
    video_processing_and_tower_match(QWEN2_5_VL, "qwen2_5_vl_video_preprocessing_and_tower_match_mlx_vlm", &|cfg, vb| {
        Box::new(Qwen25Vision::load(&cfg.raw, vb).unwrap().expect("a vision_config"))
    });
}

const VIDEO_CHECKPOINT: [&str; 4] = ["config.json", "preprocessor_config.json", "video_preprocessor_config.json", "model.safetensors"];

fn video_prompt_matches(script: &str, test: &str, marker: &str, args: &[&str]) {
    use mlex::chat::Media;
    use mlex::models::mrope::MediaGrid;
    let Some(out) = run_script(script, &[&["--video"], args].concat(), test) else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let ids: Vec<u32> = i32_values(get("input_ids")).into_iter().map(|t| t as u32).collect();
    let want: Vec<u32> = i32_values(get("tokens")).into_iter().map(|t| t as u32).collect();
    let dir = model_dir(out.path(), &VIDEO_CHECKPOINT);
    let path = dir.path().join("config.json");
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    let store = RefCell::new(WeightStore::open(dir.path()).unwrap());
    let model = mlex::models::build_model(&cfg, &Vb::new(&store, None)).unwrap();
    store.into_inner().finish().expect("every tensor of the checkpoint is used");
    let video = model.image_prompt().and_then(|p| p.video.as_ref()).expect("a Qwen checkpoint with a tower takes video");
    assert_eq!((video.marker.as_str(), video.video_token), (marker, VIDEO_PAD));

    let frames = oracle_frames(out.path());
    assert_eq!(frames.len(), 3);
    let short = collapsed_video(&ids);
    let bound = model.bind_media(short.clone(), &[Media::Video(&frames)]).unwrap();
    assert_eq!(bound.len(), ids.len(), "the video takes 30 tokens");
    for (i, (&b, &t)) in bound.iter().zip(&ids).enumerate() {
        assert_eq!(b >= MEDIA_TOKEN_BASE, t == VIDEO_PAD, "position {i}");
        if b < MEDIA_TOKEN_BASE {
            assert_eq!(b, t, "position {i}");
        }
    }
    // The rope placement (mrope::MediaGrid, as the model places a video's rows) gives
    // get_rope_index's position ids.
    let grid = MediaGrid { t: 2, h: 3, w: 5, stacked: marker == "<|video_pad|>" };
    let (mut k, mut shift) = (0usize, 0i64);
    let mut ours = [vec![], vec![], vec![]];
    for (i, &b) in bound.iter().enumerate() {
        let offsets = if b >= MEDIA_TOKEN_BASE {
            let place = grid.place(k);
            k += 1;
            let s = i as i64 - place.in_block as i64 + shift;
            shift += place.ends_block.unwrap_or(0);
            place.offsets.map(|d| s + d)
        } else {
            [i as i64 + shift; 3]
        };
        for (axis, p) in ours.iter_mut().zip(offsets) {
            axis.push(p as i32);
        }
    }
    assert_eq!(ours.concat(), i32_values(get("position_ids")), "position ids differ from get_rope_index's");

    let mut caches = model.make_caches();
    let logits = model.forward_prompt(&bound, &mut caches).unwrap();
    let l = bound.len() as i32;
    let last = logits.slice_axis(1, l - 1, l).unwrap().reshape(&[-1]).unwrap();
    let d = max_abs_diff(&last, &f32_array(get("logits0")));
    assert!(d <= 1e-4, "first logits differ from mlx-vlm's by {d}");
    let got = greedy(&last, want.len(), |t| {
        model.forward(&Array::from_slice(&[t], &[1, 1]).unwrap(), &mut caches).unwrap()
    });
    assert_eq!(got, want, "greedy tokens for the video prompt differ from mlx-vlm's");
    eprintln!("{script}: video prompt of {} ids: first logits max |Δ| {d:e}, {} greedy tokens identical", ids.len(), got.len());

    // The same video again is kept (the same ids); in two chunks cut inside the video's text
    // (Qwen3.5: between its groups) or right after it: the same logits.
    assert_eq!(model.bind_media(short, &[Media::Video(&frames)]).unwrap(), bound);
    let first = bound.iter().position(|&t| t >= MEDIA_TOKEN_BASE).unwrap();
    let cut = first + bound[first..].iter().position(|&t| t < MEDIA_TOKEN_BASE).unwrap() + 1;
    let mut caches = model.make_caches();
    model.forward_prompt(&bound[..cut], &mut caches).unwrap();
    let logits = model.forward_prompt(&bound[cut..], &mut caches).unwrap();
    let n = (bound.len() - cut) as i32;
    let d2 = max_abs_diff(&logits.slice_axis(1, n - 1, n).unwrap().reshape(&[-1]).unwrap(), &last);
    assert!(d2 <= 1e-5, "prefill cut at {cut} differs by {d2}");
}

#[test]
fn qwen3_5_video_prompt_matches_mlx_vlm_greedy() {
    video_prompt_matches(QWEN3_5, "qwen3_5_video_prompt_matches_mlx_vlm_greedy", "<|vision_start|><|video_pad|><|vision_end|>", &[]);
}

/// The video through qwen3_5_moe's text model, and through a 4-bit quantized model (the tower's
/// linears and position table too).
#[test]
fn qwen3_5_moe_and_quantized_video_prompts_match_mlx_vlm_greedy() {
    let marker = "<|vision_start|><|video_pad|><|vision_end|>";
    video_prompt_matches(QWEN3_5, "qwen3_5_moe_and_quantized_video_prompts_match_mlx_vlm_greedy", marker, &["--moe"]);
    video_prompt_matches(QWEN3_5, "qwen3_5_moe_and_quantized_video_prompts_match_mlx_vlm_greedy", marker, &["--quantize"]);
}

#[test]
fn qwen2_5_vl_video_prompt_matches_mlx_vlm_greedy() {
    video_prompt_matches(QWEN2_5_VL, "qwen2_5_vl_video_prompt_matches_mlx_vlm_greedy", "<|video_pad|>", &[]);
}

/// The whole path: a Session reports video, the template's video block becomes the processor's
/// text (timestamps per temporal group for Qwen3.5), and the greedy tokens are mlx-vlm's; bad
/// videos are INVALID_ARGUMENT naming the part.
fn video_through_a_session(script: &str, test: &str) {
    use mlex::chat::ContentPart;
    use mlex::{ChatMessage, GenerateOptions, Session};

    let Some(out) = run_script(script, &["--video"], test) else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let ids: Vec<u32> = i32_values(get("input_ids")).into_iter().map(|t| t as u32).collect();
    let want: Vec<u32> = i32_values(get("tokens")).into_iter().map(|t| t as u32).collect();
    let dir = model_dir(out.path(), &VIDEO_CHECKPOINT);
    write_qwen_tokenizer(dir.path());
    let frames = oracle_frames(out.path());
    let ask = |video: Vec<ImageData>| {
        vec![ChatMessage::user_with_images(vec![
            ContentPart::Text("look: ".into()),
            ContentPart::Video(video),
            ContentPart::Text(" what happens?".into()),
        ])]
    };
    for step in [512, 10] {
        let session = Session::load(dir.path()).unwrap();
        assert!(session.info().supports_video);
        let opts = GenerateOptions { max_tokens: want.len(), ignore_eos: true, prefill_step_size: step, ..Default::default() };
        let reply = session.generate(&ask(frames.clone()), opts).unwrap();
        assert_eq!(reply.usage.prompt_tokens, ids.len(), "the prompt as mlx-vlm's processor expands it");
        assert_eq!(reply.tokens, want, "prefill chunks of {step}: greedy tokens through the session differ from mlx-vlm's");
    }

    // Four frames (an even count: no padded group, which a frames list times at its own index
    // and a decoded video at its last frame's time) as one animated image at 2 frames a second:
    // all kept (⌊2 s · 2 fps⌋ = 4), the same prompt and tokens as the frames list. A lossless
    // WebP of the frames, and a GIF (its palette is lossy) against its own decoded frames.
    {
        use mlex::chat::media::animated_video;
        let opts = || GenerateOptions { max_tokens: 8, ignore_eos: true, ..Default::default() };
        let run = |video: Vec<ImageData>| Session::load(dir.path()).unwrap().generate(&ask(video), opts()).unwrap();
        let four: Vec<ImageData> = [0, 1, 2, 0].iter().map(|&k| frames[k].clone()).collect();
        let bytes: Vec<&[u8]> = four.iter().map(|f| &f.bytes[..]).collect();
        let listed = run(four.clone());
        let webp = run(animated_video(ImageData::new(common::animated_webp(&bytes, 500))).unwrap());
        assert_eq!((webp.usage.prompt_tokens, &webp.tokens), (listed.usage.prompt_tokens, &listed.tokens), "an animated WebP");
        let gif = animated_video(ImageData::new(common::animated_gif(&bytes, 500))).unwrap();
        let gif_listed = run(gif.iter().map(|f| ImageData::new(f.bytes.to_vec())).collect());
        let gif = run(gif);
        assert_eq!((gif.usage.prompt_tokens, &gif.tokens), (gif_listed.usage.prompt_tokens, &gif_listed.tokens), "a GIF");
        // Sampled: 8 frames over 2 s keep 4 (linspace(0, 7, 4): 0, 2, 5, 7), as many tokens as
        // those 4 given as a list (the timestamps differ: their real times).
        let eight: Vec<&[u8]> = [0, 1, 2, 0, 1, 2, 0, 1].iter().map(|&k| &frames[k].bytes[..]).collect();
        let sampled = run(animated_video(ImageData::new(common::animated_webp(&eight, 250))).unwrap());
        let kept = run([0, 2, 2, 1].iter().map(|&k| frames[k].clone()).collect());
        assert_eq!(sampled.usage.prompt_tokens, kept.usage.prompt_tokens, "an 8-frame video sampled to 4");
    }

    // A second turn resumes from the first prompt's cached prefix (the video's shifts carried)
    // with a fresh session's tokens.
    let mut turn2 = ask(frames.clone());
    turn2.push(ChatMessage::assistant("ok."));
    turn2.push(ChatMessage::user(" and then?"));
    let opts = || GenerateOptions { max_tokens: 16, ignore_eos: true, ..Default::default() };
    let warm = Session::load(dir.path()).unwrap();
    warm.generate(&ask(frames.clone()), opts()).unwrap();
    let second = warm.generate(&turn2, opts()).unwrap();
    assert!(second.usage.cached_tokens >= ids.len() - 1, "the second turn reused {} cached tokens", second.usage.cached_tokens);
    let fresh = Session::load(dir.path()).unwrap().generate(&turn2, opts()).unwrap();
    assert_eq!(second.tokens, fresh.tokens, "the second turn over the cached prefix differs from a fresh session's");

    let session = Session::load(dir.path()).unwrap();
    let fail = |video: Vec<ImageData>, says: &str| {
        let err = session.generate(&ask(video), GenerateOptions { max_tokens: 2, ..Default::default() }).unwrap_err();
        assert_eq!(err.code(), "INVALID_ARGUMENT", "{err}");
        assert!(err.to_string().contains("media part 1") && err.to_string().contains(says), "{err}");
    };
    let png = |w: u32, h: u32| {
        let mut bytes = vec![];
        let img = image::RgbImage::from_pixel(w, h, image::Rgb([9, 99, 199]));
        img.write_to(&mut std::io::Cursor::new(&mut bytes), image::ImageFormat::Png).unwrap();
        ImageData::new(bytes)
    };
    fail(vec![frames[0].clone(), png(44, 29)], "differ in size");
    fail(vec![png(45, 7), png(45, 7)], "too small");
    fail(vec![frames[0].clone(); 769], "769 frames");
    let truncated = ImageData::new(frames[1].bytes[..frames[1].bytes.len() / 2].to_vec());
    fail(vec![frames[0].clone(), truncated], "frame 1");
    // No frames: the part is left out of the message, and a model's binding refuses an empty video.
    let model_err = {
        use mlex::chat::Media;
        let path = dir.path().join("config.json");
        let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
        let store = RefCell::new(WeightStore::open(dir.path()).unwrap());
        let model = mlex::models::build_model(&cfg, &Vb::new(&store, None)).unwrap();
        model.bind_media(vec![1, VIDEO_PAD, 2], &[Media::Video(&[])]).unwrap_err()
    };
    assert!(model_err.to_string().contains("at least one frame"), "{model_err}");
}

#[test]
fn qwen3_5_video_through_a_session() {
    video_through_a_session(QWEN3_5, "qwen3_5_video_through_a_session");
}

#[test]
fn qwen2_5_vl_video_through_a_session() {
    video_through_a_session(QWEN2_5_VL, "qwen2_5_vl_video_through_a_session");
}

// ---- Qwen3-VL ------------------------------------------------------------------------------

/// tests/oracle/qwen3_vl_vlm.py: mlx-vlm's qwen3_vl Model (the Qwen3-VL tower with deepstack
/// mergers after blocks 0 and 2, the Qwen3 decoder with q/k norms and interleaved multimodal
/// rope, the deepstack features added after text layers 0 and 1).
const QWEN3_VL: &str = "qwen3_vl_vlm.py";

/// The tower's rows and both deepstack features for the two images and the video (as temporal
/// groups), within 1e-4 of mlx-vlm's; the rows `forward` gives carry the features side by side.
#[test]
fn qwen3_vl_tower_and_deepstack_match_mlx_vlm() {
    let Some(out) = run_script(QWEN3_VL, &["--video"], "qwen3_vl_tower_and_deepstack_match_mlx_vlm") else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let dir = model_dir(out.path(), &CHECKPOINT);
    let path = dir.path().join("config.json");
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    let store = RefCell::new(WeightStore::open(dir.path()).unwrap());
    let vb = Vb::new(&store, None);
    let err = QwenVision::load(&cfg.raw, &vb).err().expect("qwen3_5's loader refuses deepstack").to_string();
    assert!(err.contains("deepstack"), "{err}");
    let vision = QwenVision::load_deepstack(&cfg.raw, &vb).unwrap().expect("a vision_config");
    assert_eq!(vision.deepstack_layers(), 2);
    vb.pp("language_model").discard_all();
    store.into_inner().finish().expect("the tower takes every vision tensor, the deepstack mergers' too");
    let check = |what: &str, rows: &Array, deep: &[Array], tower: &str, deep_want: &str| {
        let d = max_abs_diff(rows, &f32_array(get(tower)));
        assert!(d <= 1e-4, "{what}: the tower differs from mlx-vlm's by {d}");
        let want = f32_array(get(deep_want));
        assert_eq!(deep.len(), 2);
        let mut worst = 0f32;
        for (k, f) in deep.iter().enumerate() {
            let w = want.slice_axis(0, k as i32, k as i32 + 1).unwrap().reshape(&f.shape()).unwrap();
            let dk = max_abs_diff(f, &w);
            assert!(dk <= 1e-4, "{what}: deepstack feature {k} differs from mlx-vlm's by {dk}");
            worst = worst.max(dk);
        }
        eprintln!("qwen3-vl {what}: rows max |Δ| {d:e}, deepstack max |Δ| {worst:e}");
    };
    for (tag, tokens) in [("a", 15), ("b", 12)] {
        let grid = i32_values(get(&format!("grid_{tag}")));
        let (gh, gw) = (grid[1] as usize, grid[2] as usize);
        let pixels = f32_array(get(&format!("pixels_{tag}")));
        let (rows, deep) = vision.forward_deepstack(&pixels, gh, gw).unwrap();
        assert_eq!(rows.shape(), [tokens, 64]);
        check(&format!("image {tag}"), &rows, &deep, &format!("tower_{tag}"), &format!("deep_{tag}"));
        let wide = vision.forward(&pixels, gh, gw).unwrap();
        assert_eq!(wide.shape(), [tokens, 3 * 64]);
        let d = max_abs_diff(&wide.slice_axis(1, 128, 192).unwrap(), &deep[1]);
        assert!(d <= 1e-5, "the wide rows carry the second feature: {d}");
    }
    // The video: two temporal groups of 6 x 10 patches, each through the tower alone.
    let grid = i32_values(get("video_grid"));
    let (t, gh, gw) = (grid[0] as usize, grid[1] as usize, grid[2] as usize);
    let rows = QwenTower::forward_groups(&vision, &f32_array(get("video_pixels")), t, gh, gw).unwrap();
    assert_eq!(rows.shape(), [30, 3 * 64]);
    let parts: Vec<Array> = (0..3).map(|k| rows.slice_axis(1, 64 * k, 64 * (k + 1)).unwrap()).collect();
    check("video", &parts[0], &parts[1..], "video_tower", "video_deep");
}

#[test]
fn qwen3_vl_image_prompt_matches_mlx_vlm_greedy() {
    image_prompt_matches(QWEN3_VL, "qwen3_vl_image_prompt_matches_mlx_vlm_greedy", &[]);
}

#[test]
fn qwen3_vl_two_image_prompt_matches_mlx_vlm_greedy() {
    image_prompt_matches(QWEN3_VL, "qwen3_vl_two_image_prompt_matches_mlx_vlm_greedy", &["--two-images"]);
}

/// 4 bits, groups of 32 (the tower's linears, deepstack mergers and position table too).
#[test]
fn qwen3_vl_quantized_image_prompt_matches_mlx_vlm_greedy() {
    image_prompt_matches(QWEN3_VL, "qwen3_vl_quantized_image_prompt_matches_mlx_vlm_greedy", &["--two-images", "--quantize"]);
}

#[test]
fn qwen3_vl_images_through_a_session() {
    images_through_a_session(QWEN3_VL, "qwen3_vl_images_through_a_session");
}

#[test]
fn qwen3_vl_video_prompt_matches_mlx_vlm_greedy() {
    let marker = "<|vision_start|><|video_pad|><|vision_end|>";
    video_prompt_matches(QWEN3_VL, "qwen3_vl_video_prompt_matches_mlx_vlm_greedy", marker, &[]);
    video_prompt_matches(QWEN3_VL, "qwen3_vl_video_prompt_matches_mlx_vlm_greedy", marker, &["--quantize"]);
}

#[test]
fn qwen3_vl_video_through_a_session() {
    video_through_a_session(QWEN3_VL, "qwen3_vl_video_through_a_session");
}

/// The oracle's checkpoint as mlx-lm converts qwen3_vl for text (config.json keeps its
/// vision_config, the tower's tensors are gone) loads as the text model alone, with the logits the
/// whole model gives for a text prompt; and rewritten in Hugging Face's layout
/// (`model.language_model.*`, `model.visual.*`, `lm_head`, the Conv3d as `[out, C, T, p, p]`) it
/// gives mlx-vlm's 32 greedy tokens.
#[test]
fn qwen3_vl_text_only_and_hugging_face_layouts_load() {
    let Some(out) = run_script(QWEN3_VL, &[], "qwen3_vl_text_only_and_hugging_face_layouts_load") else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let ids: Vec<u32> = i32_values(get("input_ids")).into_iter().map(|t| t as u32).collect();
    let want: Vec<u32> = i32_values(get("tokens")).into_iter().map(|t| t as u32).collect();
    let load = |dir: &Path| {
        let path = dir.join("config.json");
        let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
        let store = RefCell::new(WeightStore::open(dir).unwrap());
        let model = mlex::models::build_model(&cfg, &Vb::new(&store, None)).unwrap();
        store.into_inner().finish().expect("every tensor of the checkpoint is used");
        model
    };
    let text: Vec<u32> = b"look: what is it?".iter().map(|&b| b as u32).collect();
    let logits = |model: &dyn mlex::models::CausalLm| {
        let mut caches = model.make_caches();
        model.forward_prompt(&text, &mut caches).unwrap()
    };
    let whole = load(model_dir(out.path(), &CHECKPOINT).path());
    let dir = model_dir(out.path(), &CHECKPOINT);
    let st = dir.path().join("model.safetensors");
    let tensors: Vec<RawTensor> = read_tensors(&st).into_iter().filter(|t| !t.name.starts_with("vision_tower.")).collect();
    common::write_safetensors(&st, &tensors);
    let text_only = load(dir.path());
    assert!(text_only.image_prompt().is_none(), "no tower, no images");
    let d = max_abs_diff(&logits(text_only.as_ref()), &logits(whole.as_ref()));
    assert!(d <= 1e-5, "the text-only conversion's logits differ from the whole model's by {d}");
    // Without tie_word_embeddings in config.json, the stored lm_head says the head is untied.
    common::edit_json(&dir.path().join("config.json"), |c| {
        c.as_object_mut().unwrap().remove("tie_word_embeddings");
        c["text_config"].as_object_mut().unwrap().remove("tie_word_embeddings");
    });
    let d = max_abs_diff(&logits(load(dir.path()).as_ref()), &logits(whole.as_ref()));
    assert!(d <= 1e-5, "without tie_word_embeddings the logits differ by {d}");

    let dir = model_dir(out.path(), &CHECKPOINT);
    let st = dir.path().join("model.safetensors");
    let tensors: Vec<RawTensor> = read_tensors(&st)
        .into_iter()
        .map(|mut t| {
            t.name = if let Some(rest) = t.name.strip_prefix("language_model.model.") {
                format!("model.language_model.{rest}")
            } else if let Some(rest) = t.name.strip_prefix("language_model.") {
                rest.to_string()
            } else {
                t.name.replace("vision_tower.", "model.visual.")
            };
            if t.name == "model.visual.patch_embed.proj.weight" {
                // [out, T, p, p, C] → [out, C, T, p, p], float32.
                let (o, tt, p, c) = (t.shape[0], t.shape[1], t.shape[2], t.shape[4]);
                let src: Vec<f32> = t.data.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
                let mut dst = vec![0f32; src.len()];
                for oi in 0..o {
                    for ti in 0..tt {
                        for y in 0..p {
                            for x in 0..p {
                                for ci in 0..c {
                                    dst[(((oi * c + ci) * tt + ti) * p + y) * p + x] = src[(((oi * tt + ti) * p + y) * p + x) * c + ci];
                                }
                            }
                        }
                    }
                }
                t.shape = vec![o, c, tt, p, p];
                t.data = dst.iter().flat_map(|v| v.to_le_bytes()).collect();
            }
            t
        })
        .collect();
    common::write_safetensors(&st, &tensors);
    let model = load(dir.path());
    let images: Vec<ImageData> = oracle_images(out.path(), false).into_iter().map(ImageData::new).collect();
    let bound = model.bind_images(collapsed(&ids), &[&images[0]]).unwrap();
    let mut caches = model.make_caches();
    let logits = model.forward_prompt(&bound, &mut caches).unwrap();
    let l = bound.len() as i32;
    let got = greedy(&logits.slice_axis(1, l - 1, l).unwrap().reshape(&[-1]).unwrap(), want.len(), |t| {
        model.forward(&Array::from_slice(&[t], &[1, 1]).unwrap(), &mut caches).unwrap()
    });
    assert_eq!(got, want, "the Hugging Face layout's greedy tokens differ from mlx-vlm's");
}

/// Bad checkpoints are errors naming the problem: a missing or mis-shaped deepstack tensor, bad
/// deepstack indexes, a bad rope field.
#[test]
fn qwen3_vl_bad_checkpoints_name_the_problem() {
    let Some(out) = run_script(QWEN3_VL, &[], "qwen3_vl_bad_checkpoints_name_the_problem") else { return };
    let load = |dir: &Path| -> String {
        let path = dir.join("config.json");
        let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
        let store = RefCell::new(WeightStore::open(dir).unwrap());
        match mlex::models::build_model(&cfg, &Vb::new(&store, None)) {
            Ok(_) => panic!("loaded"),
            Err(e) => e.to_string(),
        }
    };
    let missing = "vision_tower.deepstack_merger_list.1.linear_fc2.bias";
    let dir = model_dir(out.path(), &CHECKPOINT);
    let st = dir.path().join("model.safetensors");
    let tensors: Vec<RawTensor> = read_tensors(&st).into_iter().filter(|t| t.name != missing).collect();
    common::write_safetensors(&st, &tensors);
    let err = load(dir.path());
    assert!(err.contains(missing), "{err}");
    // A deepstack norm over one patch (the main merger's shape), not the merge block's.
    let bad = "vision_tower.deepstack_merger_list.0.norm.weight";
    let dir = model_dir(out.path(), &CHECKPOINT);
    let st = dir.path().join("model.safetensors");
    let tensors: Vec<RawTensor> = read_tensors(&st)
        .into_iter()
        .map(|mut t| {
            if t.name == bad {
                t.shape = vec![32];
                t.data.truncate(32 * 4);
            }
            t
        })
        .collect();
    common::write_safetensors(&st, &tensors);
    let err = load(dir.path());
    assert!(err.contains(bad) && err.contains("128"), "{err}");
    // An unlisted deepstack merger is a tensor left over.
    let dir = model_dir(out.path(), &CHECKPOINT);
    common::edit_json(&dir.path().join("config.json"), |c| c["vision_config"]["deepstack_visual_indexes"] = serde_json::json!([0]));
    let err = load(dir.path());
    assert!(err.contains("vision_tower.deepstack_merger_list.1") && err.contains("config.json"), "{err}");
    for (field, value, says) in [
        ("deepstack_visual_indexes", serde_json::json!([0, 3]), "past the tower's depth"),
        ("deepstack_visual_indexes", serde_json::json!([2, 2]), "twice"),
        ("deepstack_visual_indexes", serde_json::json!([0, 1, 2, 0, 1]), "twice"),
    ] {
        let dir = model_dir(out.path(), &CHECKPOINT);
        common::edit_json(&dir.path().join("config.json"), |c| c["vision_config"][field] = value.clone());
        let err = load(dir.path());
        assert!(err.contains(says) && err.contains("config.json"), "{field} {value}: {err}");
    }
    let dir = model_dir(out.path(), &CHECKPOINT);
    common::edit_json(&dir.path().join("config.json"), |c| c["text_config"]["rope_scaling"]["rope_type"] = "yarn".into());
    let err = load(dir.path());
    assert!(err.contains("rope_scaling.type"), "{err}");
    let dir = model_dir(out.path(), &CHECKPOINT);
    common::edit_json(&dir.path().join("config.json"), |c| c["text_config"]["rope_scaling"]["mrope_section"] = serde_json::json!([3, 3]));
    let err = load(dir.path());
    assert!(err.contains("mrope_section"), "{err}");
}
