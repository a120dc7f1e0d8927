//! Vision towers against mlx-vlm (issue 15's bar: encoder outputs within 1e-4 in float32).
//!
//! The oracle (tests/oracle/gemma3_vision.py, run with the oracle venv, which holds mlx-vlm
//! 0.7.10) builds mlx-vlm's own Gemma 3 SigLIP tower and projector on tiny random weights, runs
//! them on random pixels and writes weights, config.json, pixels and outputs; here mlex loads
//! the same checkpoint (both convolution layouts) and must give the same features.
mod common;

use common::oracle_arrays::{f32_array, i32_values, max_abs_diff};
use common::{read_tensors, repo_root, require_oracle};
use mlex::loader::{ModelConfig, Vb, WeightStore};
use mlex::mlx::{Array, Dtype};
use mlex::models::gemma3_vision::Gemma3Vision;
use std::cell::RefCell;
use std::path::Path;
use std::process::Command;

/// Runs `tests/oracle/<script>` into a new directory (None, with a skip, without the oracle venv).
fn run_oracle(script: &str, test: &str) -> Option<tempfile::TempDir> {
    let python = require_oracle(test)?;
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(&python).arg(repo_root().join("tests/oracle").join(script)).arg(out.path()).status().unwrap();
    assert!(status.success(), "the oracle {script} failed");
    Some(out)
}

/// Loads the vision side of the checkpoint in `dir`, checking that it takes every tensor but the
/// text model's.
fn load(dir: &Path) -> Gemma3Vision {
    let path = dir.join("config.json");
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    let store = RefCell::new(WeightStore::open(dir).unwrap());
    let vb = Vb::new(&store, None);
    let vision = Gemma3Vision::load(&cfg.raw, &vb).unwrap().expect("a vision_config");
    vb.pp("language_model").discard_all();
    store.into_inner().finish().expect("every tensor of the checkpoint is used");
    vision
}

#[test]
fn gemma3_vision_tower_and_projector_match_mlx_vlm() {
    let Some(out) = run_oracle("gemma3_vision.py", "gemma3_vision_tower_and_projector_match_mlx_vlm") else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| f32_array(io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}")));
    let (pixels, tower, features) = (get("pixel_values"), get("tower"), get("features"));

    // The checkpoint as mlx-vlm converts it (conv [out, kh, kw, in]) and as PyTorch stores it.
    for weights in ["model.safetensors", "model_torch_conv.safetensors"] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(out.path().join("config.json"), dir.path().join("config.json")).unwrap();
        std::fs::copy(out.path().join(weights), dir.path().join("model.safetensors")).unwrap();
        let vision = load(dir.path());
        assert_eq!((vision.image_size(), vision.tokens_per_image()), (32, 16));
        let ours_tower = vision.tower(&pixels).unwrap();
        let d = max_abs_diff(&ours_tower, &tower);
        assert!(d <= 1e-4, "{weights}: tower differs from mlx-vlm's by {d}");
        let ours = vision.encode(&pixels).unwrap();
        let d = max_abs_diff(&ours, &features);
        assert!(d <= 1e-4, "{weights}: image features differ from mlx-vlm's by {d}");
        eprintln!("{weights}: max |Δ| features {d:e}");
    }
}

#[test]
fn gemma3_vision_rejects_bad_configs_and_pixels() {
    // No Python: a config naming an impossible geometry, and pixels of the wrong shape.
    let dir = tempfile::tempdir().unwrap();
    let config = serde_json::json!({
        "model_type": "gemma3",
        "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                          "num_attention_heads": 4, "patch_size": 4, "image_size": 30},
        "text_config": {"model_type": "gemma3_text", "hidden_size": 48, "num_hidden_layers": 1,
                        "vocab_size": 64, "mm_tokens_per_image": 16}
    });
    let path = dir.path().join("config.json");
    std::fs::write(&path, config.to_string()).unwrap();
    common::write_safetensors(&dir.path().join("model.safetensors"), &[common::RawTensor::f32("x", &[1], &[0.0])]);
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    let store = RefCell::new(WeightStore::open(dir.path()).unwrap());
    let err = Gemma3Vision::load(&cfg.raw, &Vb::new(&store, None)).err().expect("image_size 30 is not a multiple of 4");
    assert!(err.to_string().contains("image_size is not a multiple of patch_size"), "{err}");

    let mut bad = cfg.raw.clone();
    bad["vision_config"]["image_size"] = 32.into();
    bad["mm_tokens_per_image"] = 15.into();
    let err = Gemma3Vision::load(&bad, &Vb::new(&store, None)).err().expect("15 tokens is not a square");
    assert!(err.to_string().contains("mm_tokens_per_image 15"), "{err}");

    // A missing tensor names itself.
    bad["mm_tokens_per_image"] = 16.into();
    let err = Gemma3Vision::load(&bad, &Vb::new(&store, None)).err().expect("no weights");
    assert!(err.to_string().contains("vision_tower.vision_model.embeddings.patch_embedding.weight"), "{err}");
}

/// The whole gemma3 model on an image prompt: mlx-vlm's (tests/oracle/gemma3_vlm.py: vision
/// tower, projector and language model on tiny random weights, prefill with the image tokens
/// merged, then greedy decoding) and mlex's give the same merged embeddings, the same first
/// logits, and the same 32 greedy tokens.
#[test]
fn gemma3_image_prompt_matches_mlx_vlm_greedy() {
    let Some(out) = run_oracle("gemma3_vlm.py", "gemma3_image_prompt_matches_mlx_vlm_greedy") else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let pixels = f32_array(get("pixel_values"));
    let ids: Vec<u32> = i32_values(get("input_ids")).into_iter().map(|t| t as u32).collect();
    let want: Vec<u32> = i32_values(get("tokens")).into_iter().map(|t| t as u32).collect();

    let model_dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(out.path().join(f), model_dir.path().join(f)).unwrap();
    }
    // The tower on its own (pixels in: the oracle's, not decoded from a file), and the text model
    // from the config without its vision_config (with it, build_model would take the tower too).
    let vision = load(model_dir.path());
    let path = model_dir.path().join("config.json");
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json.as_object_mut().unwrap().remove("vision_config");
    let cfg = ModelConfig::from_json(&json.to_string(), &path).unwrap();
    let store = RefCell::new(WeightStore::open(model_dir.path()).unwrap());
    let model = mlex::models::build_model(&cfg, &Vb::new(&store, None)).unwrap();
    store.into_inner().finish().expect("every tensor of the checkpoint is used");

    let image_token = cfg.raw["image_token_index"].as_u64().unwrap() as u32;
    let tokens = Array::from_slice(&ids, &[1, ids.len() as i32]).unwrap();
    let h = model.embed(&tokens).unwrap();
    let h = vision.merge_image_tokens(&h, &ids, image_token, &vision.encode(&pixels).unwrap()).unwrap();
    let d = max_abs_diff(&h, &f32_array(get("embeds")));
    assert!(d <= 1e-5, "merged embeddings differ from mlx-vlm's by {d}");

    let mut caches = model.make_caches();
    let logits = model.forward_embeddings(h, &mut caches).unwrap();
    let l = ids.len() as i32;
    let last = logits.slice_axis(1, l - 1, l).unwrap().reshape(&[-1]).unwrap();
    let d = max_abs_diff(&last, &f32_array(get("logits0")));
    assert!(d <= 1e-4, "first logits differ from mlx-vlm's by {d}");
    let mut next = last.argmax(0, false).unwrap().astype(Dtype::Uint32).unwrap().to_vec::<u32>().unwrap()[0];
    let mut got = vec![next];
    while got.len() < want.len() {
        let logits = model.forward(&Array::from_slice(&[next], &[1, 1]).unwrap(), &mut caches).unwrap();
        next = logits.reshape(&[-1]).unwrap().argmax(0, false).unwrap().astype(Dtype::Uint32).unwrap().to_vec::<u32>().unwrap()[0];
        got.push(next);
    }
    assert_eq!(got, want, "greedy tokens differ from mlx-vlm's");
}

/// A byte-level tokenizer over the oracle model's 320 ids: bytes 0..=255, Gemma 3's image and
/// turn tokens at 300..=306 (300 is the config's image_token_index), fillers elsewhere.
fn write_gemma3_tokenizer(dir: &Path) {
    let mut tok = common::tiny_tokenizer_json();
    let specials = [
        (300, "<image_soft_token>"),
        (301, "<start_of_image>"),
        (302, "<end_of_image>"),
        (303, "<start_of_turn>"),
        (304, "<end_of_turn>"),
        (305, "<bos>"),
        (306, "<eos>"),
    ];
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
    // Gemma 3's template, cut down: image parts become <start_of_image>.
    let template = "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ message['role'] }}\n\
        {% if message['content'] is string %}{{ message['content'] }}{% else %}{% for item in message['content'] %}\
        {% if item['type'] == 'image' %}<start_of_image>{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}\
        {% endfor %}{% endif %}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}";
    let config = serde_json::json!({"bos_token": "<bos>", "eos_token": "<eos>", "chat_template": template,
                                    "tokenizer_class": "PreTrainedTokenizerFast"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
}

/// Images through a whole session: a message's image part reaches the model (the same image
/// gives the same reply, from the prompt cache the second time), a different image is never
/// served from the first one's cache, inline data URLs work like bytes, and bad images, image
/// parts for a text-only model and a template that places no image marker are clear errors.
#[test]
fn gemma3_images_through_a_session() {
    use mlex::chat::{parse_messages_json, ContentPart, ImageData};
    use mlex::{ChatMessage, GenerateOptions, Session};

    let Some(out) = run_oracle("gemma3_vlm.py", "gemma3_images_through_a_session") else { return };
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(out.path().join(f), dir.path().join(f)).unwrap();
    }
    write_gemma3_tokenizer(dir.path());
    let session = Session::load(dir.path()).unwrap();
    assert!(session.info().supports_images);

    let seed = |name: &str| std::fs::read(repo_root().join("fuzz/corpus/media_image").join(name)).unwrap();
    // (Two images that differ where the model can see: the RGBA PNG and WebP seeds differ only
    // under transparent pixels.)
    let (png, webp) = (seed("seed-png-rgba"), seed("seed-png-gray16"));
    let ask = |img: &[u8]| {
        vec![ChatMessage::user_with_images(vec![
            ContentPart::Text("look: ".into()),
            ContentPart::Image(ImageData::new(img.to_vec())),
            ContentPart::Text("what is it?".into()),
        ])]
    };
    let opts = GenerateOptions { max_tokens: 6, ignore_eos: true, ..Default::default() };
    // Where the image's tokens start: the template's marker, after the "\n\n" the processor adds.
    let ids = session.encode_messages(&ask(&png), None, None).unwrap();
    let image_start = ids.iter().position(|&t| t == 301).unwrap() + 3;

    let first = session.generate(&ask(&png), opts.clone()).unwrap();
    assert_eq!(first.usage.prompt_tokens, ids.len() + 2 + 16 + 1 + 2, "the marker expands to 2 + 1 + 16 + 1 + 2 tokens");
    let again = session.generate(&ask(&png), opts.clone()).unwrap();
    assert_eq!(again.tokens, first.tokens);
    assert!(again.usage.cached_tokens >= image_start + 16, "{} cached", again.usage.cached_tokens);
    let other = session.generate(&ask(&webp), opts.clone()).unwrap();
    assert!(other.usage.cached_tokens <= image_start, "another image reused {} cached tokens", other.usage.cached_tokens);
    assert_ne!(other.logprobs, first.logprobs, "the image does not reach the model");
    // An image whose hash equals the first's (as a crafted collision would) is still another image.
    let forged = ImageData { bytes: webp.clone().into(), hash: ImageData::new(png.clone()).hash, time: None };
    let msgs = vec![ChatMessage::user_with_images(vec![
        ContentPart::Text("look: ".into()),
        ContentPart::Image(forged),
        ContentPart::Text("what is it?".into()),
    ])];
    let collided = session.generate(&msgs, opts.clone()).unwrap();
    assert_eq!(collided.logprobs, other.logprobs, "a hash collision swapped images");
    assert!(collided.usage.cached_tokens <= image_start || collided.usage.cached_tokens >= image_start + 16);

    // The same image inline, as an OpenAI client sends it.
    use base64::Engine as _;
    let url = format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(&png));
    let json = serde_json::json!([{"role": "user", "content": [
        {"type": "text", "text": "look: "}, {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "what is it?"}]}]);
    let parsed = parse_messages_json(&json.to_string()).unwrap();
    assert_eq!(parsed, ask(&png));
    assert_eq!(session.generate(&parsed, opts.clone()).unwrap().tokens, first.tokens);

    // Bad input.
    let err = session.generate(&ask(b"not an image"), opts.clone()).unwrap_err().to_string();
    assert!(err.contains("image 1 of the conversation") && err.contains("image"), "{err}");
    // A marker typed in the text: two places for one image.
    let mut typed = ask(&png);
    typed[0].content.push_str(" <start_of_image>");
    let err = session.generate(&typed, opts.clone()).unwrap_err().to_string();
    assert!(err.contains("placed 2 image marker(s)") && err.contains("for 1 image"), "{err}");
    // Gemma 3's tower takes no video: a video part is refused, naming it.
    assert!(!session.info().supports_video);
    let video = vec![ChatMessage::user_with_images(vec![
        ContentPart::Text("look: ".into()),
        ContentPart::Video(vec![ImageData::new(png.clone()), ImageData::new(png.clone())]),
        ContentPart::Text("what is it?".into()),
    ])];
    let err = session.generate(&video, opts.clone()).unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGUMENT");
    assert!(err.to_string().contains("message 0 holds a video part, and this model takes no video"), "{err}");
    let text_only = Session::load(common::tiny_llama_dir().path()).unwrap();
    assert!(!text_only.info().supports_images);
    let err = text_only.generate(&ask(&png), opts).unwrap_err().to_string();
    assert!(err.contains("takes no images"), "{err}");
}

/// Speed, side by side with mlx-vlm in the same run (not a pass/fail test): the Gemma 3 tower and
/// projector at gemma-3-4b's widths on one image, same random weights, best of 3 after a warm-up.
///
/// `MLEX_ORACLE_VENV=<venv> [MLEX_BENCH_SIZE=224] cargo test --release --test vision -- --ignored --nocapture bench_`
#[test]
#[ignore]
fn bench_gemma3_tower_against_mlx_vlm() {
    let Some(python) = require_oracle("bench_gemma3_tower_against_mlx_vlm") else { return };
    let size = std::env::var("MLEX_BENCH_SIZE").unwrap_or_else(|_| "224".into());
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(&python)
        .arg(repo_root().join("tests/oracle/gemma3_vision_bench.py"))
        .arg(out.path())
        .args(["--size", &size, "--runs", "3"])
        .status()
        .unwrap();
    assert!(status.success(), "the oracle failed");
    let theirs: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.path().join("bench.json")).unwrap()).unwrap();
    let theirs: Vec<f64> = theirs["ms"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let pixels = f32_array(&read_tensors(&out.path().join("pixels.safetensors"))[0]);
    std::fs::remove_file(out.path().join("pixels.safetensors")).unwrap();
    let vision = load(out.path());
    let encode = || {
        let t0 = std::time::Instant::now();
        vision.encode(&pixels).unwrap().eval().unwrap();
        t0.elapsed().as_secs_f64() * 1e3
    };
    encode();
    let ours: Vec<f64> = (0..3).map(|_| encode()).collect();
    let best = |v: &[f64]| v.iter().cloned().fold(f64::INFINITY, f64::min);
    println!(
        "gemma3 tower + projector, {size} px, one image: mlex {ours:.1?} ms, mlx-vlm {theirs:.1?} ms: best {:.1} vs {:.1} ms, {:.2}x",
        best(&ours),
        best(&theirs),
        best(&theirs) / best(&ours)
    );
}

/// Gemma 3 with pan and scan on in its preprocessor_config.json (tests/oracle/gemma3_pan_and_scan.py:
/// crops from 8 pixels, at most 3, 32 × 32): for prompts holding images that are cropped (wide,
/// tall, capped at the most crops) and images that are not (under the ratio threshold, crops
/// under the minimum size), mlex's prompt ids equal Hugging Face's Gemma3Processor's exactly
/// (its "Here is the original image … crops …" sentence), its pixels (whole images then crops)
/// equal the processor's within 1/255, every run of soft tokens gets rows of its own, and 32
/// greedy tokens for a cropped image equal mlx-vlm's on the same tiny weights. Bad pan-and-scan
/// settings are load errors naming the file and the key.
#[test]
fn gemma3_pan_and_scan_matches_hf_and_mlx_vlm() {
    use mlex::chat::{ContentPart, ImageData};
    use mlex::media::Gemma3ImageProcessor;
    use mlex::{ChatMessage, GenerateOptions, Session};

    let Some(out) = run_oracle("gemma3_pan_and_scan.py", "gemma3_pan_and_scan_matches_hf_and_mlx_vlm") else { return };
    let dir = out.path();
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let session = Session::load(dir).unwrap();
    assert!(session.info().supports_images);
    let path = dir.join("config.json");
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    let store = RefCell::new(WeightStore::open(dir).unwrap());
    let model = mlex::models::build_model(&cfg, &Vb::new(&store, None)).unwrap();
    let prompt = model.image_prompt().expect("a vision tower");
    assert!(prompt.pan_and_scan.is_some(), "the config turns pan and scan on");
    let pre: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("preprocessor_config.json")).unwrap()).unwrap();
    let processor = Gemma3ImageProcessor::from_preprocessor_config(&pre).unwrap();
    assert_eq!((processor.width, processor.pan_and_scan_max_num_crops, processor.pan_and_scan_min_crop_size), (32, 3, 8));

    // The oracle's user message: "look: " image " (0) " image … " what is it?".
    let ask = |images: &[ImageData]| {
        let mut parts = vec![ContentPart::Text("look: ".into())];
        for (k, img) in images.iter().enumerate() {
            parts.push(ContentPart::Image(img.clone()));
            parts.push(ContentPart::Text(if k + 1 < images.len() { format!(" ({k}) ") } else { " what is it?".into() }));
        }
        vec![ChatMessage::user_with_images(parts)]
    };
    let tok = session.tokenizer().unwrap();
    let cases = manifest.as_array().unwrap();
    assert_eq!(cases.len(), 4);
    for case in cases {
        let name = case["case"].as_str().unwrap();
        let images: Vec<ImageData> =
            case["images"].as_array().unwrap().iter().map(|f| ImageData::new(std::fs::read(dir.join(f.as_str().unwrap())).unwrap())).collect();
        let want: Vec<u32> = case["input_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let crops: Vec<usize> = case["num_crops"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();

        let ids = tok.encode_chat_with_images(&ask(&images), None, None, Some(prompt)).unwrap();
        assert_eq!(ids, want, "{name}: prompt ids differ from Gemma3Processor's");

        // Pixels: each image, then its crops, in order.
        let raw = std::fs::read(dir.join(case["pixel_values"].as_str().unwrap())).unwrap();
        let theirs: Vec<f32> = raw.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        let mut ours = vec![];
        for (img, &k) in images.iter().zip(&crops) {
            let pv = processor.preprocess_bytes(&img.bytes).unwrap();
            assert_eq!(pv.num_crops, k, "{name}: crops");
            ours.extend(pv.data);
        }
        assert_eq!(ours.len(), theirs.len(), "{name}: pixel count");
        let d = ours.iter().zip(&theirs).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        // std 0.5: 1/255 in [0, 1] units is 2/255 here.
        assert!(d <= 2.0 / 255.0 + 1e-6, "{name}: pixels differ by {d}");

        // Binding: each run of 16 soft tokens its own consecutive media ids, in order, none reused.
        let refs: Vec<&ImageData> = images.iter().collect();
        let bound = model.bind_images(ids.clone(), &refs).unwrap();
        assert_eq!(bound.len(), ids.len());
        let media: Vec<u32> = bound.iter().copied().filter(|&t| mlex::models::vision_lm::is_media_token(t)).collect();
        assert_eq!(media.len(), ids.iter().filter(|&&t| t == 300).count());
        assert_eq!(media.len(), 16 * (images.len() + crops.iter().sum::<usize>()));
        // An image's ids run on across its crops' runs (an image seen before keeps its ids).
        let mut at = 0;
        for &k in &crops {
            let ids = &media[at..at + 16 * (1 + k)];
            assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{name}: an image's media ids out of order");
            at += ids.len();
        }
        eprintln!("{name}: crops {crops:?}, {} prompt ids equal, pixels within {d:e}", ids.len());
    }

    // 32 greedy tokens through the session (decode, preprocess, tower on the image and its 3
    // crops, prefill, decode) against mlx-vlm's.
    let greedy = &cases[0];
    assert_eq!(greedy["case"], "greedy");
    let want: Vec<u32> = greedy["tokens"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let image = ImageData::new(std::fs::read(dir.join(greedy["images"][0].as_str().unwrap())).unwrap());
    let opts = GenerateOptions { max_tokens: 32, ignore_eos: true, ..Default::default() };
    let reply = session.generate(&ask(&[image.clone()]), opts.clone()).unwrap();
    assert_eq!(reply.usage.prompt_tokens, greedy["input_ids"].as_array().unwrap().len());
    assert_eq!(reply.tokens, want, "greedy tokens differ from mlx-vlm's");
    // Again: from the prompt cache, the same.
    let again = session.generate(&ask(&[image]), opts).unwrap();
    assert_eq!(again.tokens, want);
    assert!(again.usage.cached_tokens > 16 * 4, "{} cached", again.usage.cached_tokens);
    drop(session);

    // processor_config.json's image_processor comes first, as transformers reads them; one
    // without it leaves preprocessor_config.json in charge.
    for (processor_config, on) in [
        (serde_json::json!({"image_processor": {"do_pan_and_scan": false, "size": {"height": 32, "width": 32}}}), false),
        (serde_json::json!({"image_seq_length": 16}), true),
    ] {
        let both = tempfile::tempdir().unwrap();
        for f in ["config.json", "model.safetensors", "preprocessor_config.json"] {
            std::fs::copy(dir.join(f), both.path().join(f)).unwrap();
        }
        std::fs::write(both.path().join("processor_config.json"), processor_config.to_string()).unwrap();
        let path = both.path().join("config.json");
        let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
        let store = RefCell::new(WeightStore::open(both.path()).unwrap());
        let model = mlex::models::build_model(&cfg, &Vb::new(&store, None)).unwrap();
        assert_eq!(model.image_prompt().unwrap().pan_and_scan.is_some(), on, "{processor_config}");
    }

    // Bad settings: load errors naming the file and the key (never a panic).
    for (file, settings, key) in [
        ("preprocessor_config.json", serde_json::json!({"do_pan_and_scan": true, "pan_and_scan_max_num_crops": 0}), "pan_and_scan_max_num_crops"),
        ("preprocessor_config.json", serde_json::json!({"do_pan_and_scan": "yes"}), "do_pan_and_scan"),
        ("preprocessor_config.json", serde_json::json!({"pan_and_scan_min_crop_size": 8.5}), "pan_and_scan_min_crop_size"),
        ("processor_config.json", serde_json::json!({"image_processor": {"pan_and_scan_min_ratio_to_activate": "wide"}}), "pan_and_scan_min_ratio_to_activate"),
    ] {
        let bad = tempfile::tempdir().unwrap();
        for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(dir.join(f), bad.path().join(f)).unwrap();
        }
        std::fs::write(bad.path().join(file), settings.to_string()).unwrap();
        let err = Session::load(bad.path()).err().expect("a bad setting").to_string();
        assert!(err.contains(key) && err.contains(file), "{settings}: {err}");
    }
}
