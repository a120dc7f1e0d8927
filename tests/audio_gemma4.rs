//! Gemma 4 audio against mlx-vlm 0.7.10 (issue 15).
//!
//! - tests/oracle/gemma4_audio.py builds mlx-vlm's whole gemma4 Model with a tiny audio tower on
//!   random weights (clipped linears that clip, gradient clipping, look-ahead context), writes a
//!   16 kHz WAV it synthesizes and runs mlx-vlm's Gemma4AudioFeatureExtractor, audio tower and
//!   embedder on it (and on a second, random waveform of odd length); mlex must decode the WAV to
//!   the same samples (exactly), give the same log-mel features and mask (1e-4), the same tower
//!   output and embedded rows (1e-4), and the same 32 greedy tokens for a prompt holding the clip,
//!   directly (bind_media) and through a Session with a chat template.
//! - Bad audio (not audio, empty, a truncated header, longer than 30 s) is INVALID_ARGUMENT naming
//!   the part; an audio part for a checkpoint without an audio tower is INVALID_ARGUMENT too.
//! - FLAC and MP3 clips (tests/fixtures/audio, made by make_audio_fixtures.py) decode: FLAC to the
//!   exact samples, MP3 to the tone it encodes.
//! - The resampler equals scipy's `resample_poly(padtype="edge")` (mlx-vlm's loader's) within
//!   1e-5 for five source rates (a committed reference), and a stereo 44.1 kHz WAV is averaged
//!   to mono and resampled (compared with scipy live when `MLEX_SCIPY_PYTHON` names a Python
//!   with scipy).
//! - Through a Session: a second turn about the same clip resumes from the prompt cache, another
//!   clip does not; the CLI's `--audio FILE` works, and fails on a model without an audio tower.
//!
//! Without `MLEX_ORACLE_VENV` (the venv holding mlx-vlm) the oracle tests skip, saying so.
mod common;

use common::oracle_arrays::{f32_array, f32_values, greedy, i32_values, max_abs_diff};
use common::{read_tensors, repo_root, require_oracle};
use mlex::chat::{ContentPart, Media};
use mlex::loader::{ModelConfig, Vb, WeightStore};
use mlex::media::{decode_audio, Gemma4AudioFeatureExtractor};
use mlex::mlx::Array;
use mlex::models::gemma4_audio::Gemma4Audio;
use mlex::models::vision_lm::{ImageData, MEDIA_TOKEN_BASE};
use mlex::{ChatMessage, GenerateOptions, Session};
use std::cell::RefCell;
use std::path::Path;
use std::process::Command;

const AUDIO_TOKEN: u32 = 303;

fn run_oracle(test: &str) -> Option<tempfile::TempDir> {
    let python = require_oracle(test)?;
    let out = tempfile::tempdir().unwrap();
    let status =
        Command::new(&python).arg(repo_root().join("tests/oracle/gemma4_audio.py")).arg(out.path()).status().unwrap();
    assert!(status.success(), "the oracle gemma4_audio.py failed");
    Some(out)
}

fn model_dir(out: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "processor_config.json", "model.safetensors"] {
        std::fs::copy(out.join(f), dir.path().join(f)).unwrap();
    }
    dir
}

#[test]
fn gemma4_audio_features_and_tower_match_mlx_vlm() {
    let Some(out) = run_oracle("gemma4_audio_features_and_tower_match_mlx_vlm") else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));

    // The WAV decodes to the samples the oracle wrote (int16 / 32768, exactly).
    let wav = std::fs::read(out.path().join("clip.wav")).unwrap();
    let w = decode_audio(&wav, 30.0).unwrap();
    assert_eq!(w.sample_rate, 16_000);
    assert_eq!(w.samples, f32_values(get("wave_a")), "the WAV's samples");
    // At the extractor's rate there is no resampling: the samples go in as they are.
    assert_eq!(mlex::media::load_audio(&wav, 16_000, 30.0).unwrap(), w.samples);

    let dir = model_dir(out.path());
    let path = dir.path().join("config.json");
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    let store = RefCell::new(WeightStore::open(dir.path()).unwrap());
    let audio = Gemma4Audio::load(&cfg.raw, &Vb::new(&store, None)).unwrap().expect("an audio_config");
    let fe = Gemma4AudioFeatureExtractor::default();
    for tag in ["a", "b"] {
        let wave = f32_values(get(&format!("wave_{tag}")));
        let f = fe.extract(&wave);
        let want = get(&format!("features_{tag}"));
        assert_eq!(vec![f.frames, f.bins], want.shape, "clip {tag}: feature shape");
        let d = f.data.iter().zip(f32_values(want)).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(d <= 1e-4, "clip {tag}: log-mel features differ from mlx-vlm's by {d}");
        let mask: Vec<bool> = i32_values(get(&format!("mask_{tag}"))).into_iter().map(|v| v != 0).collect();
        assert_eq!(f.mask, mask, "clip {tag}: frame mask");

        // The tower on mlx-vlm's own features (so the tower alone is compared).
        let feats = f32_array(want).expand_dims(0).unwrap();
        let valid = Array::from_slice(&mask, &[1, mask.len() as i32]).unwrap();
        let (tower, _) = audio.tower(&feats, &valid).unwrap();
        let theirs = f32_array(get(&format!("tower_{tag}"))).expand_dims(0).unwrap();
        let scale = theirs.abs().unwrap().max(&[], false).unwrap().item_f32().unwrap().max(1.0);
        let d1 = max_abs_diff(&tower, &theirs);
        assert!(d1 <= 1e-4 * scale, "clip {tag}: tower output differs from mlx-vlm's by {d1} (largest value {scale})");
        let rows = audio.encode(&feats, &valid).unwrap();
        let d2 = max_abs_diff(&rows, &f32_array(get(&format!("rows_{tag}"))));
        assert!(d2 <= 1e-4, "clip {tag}: embedded rows differ from mlx-vlm's by {d2}");
        eprintln!("clip {tag} ({} frames): max |Δ| features {d:e}, tower {d1:e} (largest {scale}), rows {d2:e}", f.frames);
    }
}

/// The prompt ids mlx-vlm's processor wrote, with the clip's run collapsed to one audio token.
fn collapsed(ids: &[u32]) -> Vec<u32> {
    let mut out: Vec<u32> = vec![];
    for &t in ids {
        if !(t == AUDIO_TOKEN && out.last() == Some(&AUDIO_TOKEN)) {
            out.push(t);
        }
    }
    out
}

#[test]
fn gemma4_audio_prompt_matches_mlx_vlm_greedy() {
    let Some(out) = run_oracle("gemma4_audio_prompt_matches_mlx_vlm_greedy") else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let ids: Vec<u32> = i32_values(get("input_ids")).into_iter().map(|t| t as u32).collect();
    let want: Vec<u32> = i32_values(get("tokens")).into_iter().map(|t| t as u32).collect();
    let dir = model_dir(out.path());
    let path = dir.path().join("config.json");
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    let store = RefCell::new(WeightStore::open(dir.path()).unwrap());
    let model = mlex::models::build_model(&cfg, &Vb::new(&store, None)).unwrap();
    store.into_inner().finish().expect("every tensor of the checkpoint is used");
    let prompt = model.audio_prompt().expect("a gemma4 checkpoint with audio_config takes audio");
    assert_eq!((prompt.marker.as_str(), prompt.audio_token), ("<|audio|>", AUDIO_TOKEN));

    let clip = ImageData::new(std::fs::read(out.path().join("clip.wav")).unwrap());
    let bound = model.bind_media(collapsed(&ids), &[Media::Audio(&clip)]).unwrap();
    assert_eq!(bound.len(), ids.len(), "the clip takes 33 tokens (1.3 s at 40 ms)");
    for (i, (&b, &t)) in bound.iter().zip(&ids).enumerate() {
        assert_eq!(b >= MEDIA_TOKEN_BASE, t == AUDIO_TOKEN, "position {i}");
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

    // The same clip again reuses its ids (a prompt-cache hit); another clip gets its own.
    assert_eq!(model.bind_media(collapsed(&ids), &[Media::Audio(&clip)]).unwrap(), bound);
    let other = ImageData::new(wav_bytes(&vec![0.25f32; 16_000 * 13 / 10], 16_000, 1));
    let rebound = model.bind_media(collapsed(&ids), &[Media::Audio(&other)]).unwrap();
    let first_media = |v: &[u32]| *v.iter().find(|&&t| t >= MEDIA_TOKEN_BASE).unwrap();
    assert!(first_media(&rebound) >= first_media(&bound) + 33, "another clip reused the first one's ids");
    // An image where the prompt has the audio's place, and two audio tokens in a row, are refused.
    let png = ImageData::new(std::fs::read(repo_root().join("fuzz/corpus/media_image/seed-png-rgba")).unwrap());
    let err = model.bind_media(collapsed(&ids), &[Media::Image(&png)]).unwrap_err().to_string();
    assert!(err.contains("media part 1 of the conversation is an image, and the prompt has an audio place"), "{err}");
    let mut two = collapsed(&ids);
    let at = two.iter().position(|&t| t == AUDIO_TOKEN).unwrap();
    two.insert(at, AUDIO_TOKEN);
    let err = model.bind_media(two, &[Media::Audio(&clip)]).unwrap_err().to_string();
    assert!(err.contains("run of 2 audio tokens"), "{err}");
}

/// A byte-level tokenizer over the oracle model's 320 ids: bytes as themselves, Gemma 4's image
/// (300..=302) and audio (303 `<|audio|>`, 307 `<|audio>`, 308 `<audio|>`) tokens, `<bos>` 305,
/// `<eos>` 306; a template that renders the oracle's prompt text (audio parts as `<|audio|>`).
fn write_gemma4_tokenizer(dir: &Path) {
    let mut tok = common::tiny_tokenizer_json();
    let specials = [
        (300, "<|image|>"),
        (301, "<|image>"),
        (302, "<image|>"),
        (303, "<|audio|>"),
        (304, "<|video|>"),
        (305, "<bos>"),
        (306, "<eos>"),
        (307, "<|audio>"),
        (308, "<audio|>"),
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
    let template = "{{ bos_token }}{% for message in messages %}{% for item in message['content'] %}\
        {% if item['type'] == 'image' %}<|image|>{% elif item['type'] == 'audio' %}<|audio|>\
        {% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}\
        {% endfor %}{% endfor %}";
    let config = serde_json::json!({"bos_token": "<bos>", "eos_token": "<eos>", "chat_template": template,
                                    "tokenizer_class": "PreTrainedTokenizerFast"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
}

/// 16-bit PCM WAV bytes of `samples` (interleaved when `channels` > 1).
fn wav_bytes(samples: &[f32], rate: u32, channels: u16) -> Vec<u8> {
    let data: Vec<u8> =
        samples.iter().flat_map(|&s| ((s.clamp(-1.0, 1.0) * 32767.0).round() as i16).to_le_bytes()).collect();
    let mut out = b"RIFF".to_vec();
    out.extend((36 + data.len() as u32).to_le_bytes());
    out.extend(b"WAVEfmt ");
    out.extend(16u32.to_le_bytes());
    out.extend(1u16.to_le_bytes());
    out.extend(channels.to_le_bytes());
    out.extend(rate.to_le_bytes());
    out.extend((rate * 2 * channels as u32).to_le_bytes());
    out.extend((2 * channels).to_le_bytes());
    out.extend(16u16.to_le_bytes());
    out.extend(b"data");
    out.extend((data.len() as u32).to_le_bytes());
    out.extend(data);
    out
}

/// The whole path: a Session over the checkpoint reports audio, its chat template's marker is
/// expanded, the WAV decoded and featurized, and 32 greedy tokens equal mlx-vlm's; bad clips are
/// INVALID_ARGUMENT naming the part.
#[test]
fn gemma4_audio_through_a_session() {
    let Some(out) = run_oracle("gemma4_audio_through_a_session") else { return };
    let io = read_tensors(&out.path().join("io.safetensors"));
    let get = |name: &str| io.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
    let ids: Vec<u32> = i32_values(get("input_ids")).into_iter().map(|t| t as u32).collect();
    let want: Vec<u32> = i32_values(get("tokens")).into_iter().map(|t| t as u32).collect();
    let dir = model_dir(out.path());
    write_gemma4_tokenizer(dir.path());
    let session = Session::load(dir.path()).unwrap();
    assert!(session.info().supports_audio && session.info().supports_images);
    let wav = std::fs::read(out.path().join("clip.wav")).unwrap();
    let ask = |clip: Vec<u8>| {
        vec![ChatMessage::user_with_images(vec![
            ContentPart::Text("listen: ".into()),
            ContentPart::Audio(ImageData::new(clip)),
            ContentPart::Text(" what is it?".into()),
        ])]
    };
    for step in [512, 10] {
        let opts = GenerateOptions { max_tokens: want.len(), ignore_eos: true, prefill_step_size: step, ..Default::default() };
        let reply = session.generate(&ask(wav.clone()), opts).unwrap();
        assert_eq!(reply.usage.prompt_tokens, ids.len(), "the prompt as mlx-vlm's processor expands it");
        assert_eq!(reply.tokens, want, "prefill chunks of {step}: greedy tokens through the session differ from mlx-vlm's");
    }
    // The same through parsed JSON messages (OpenAI's input_audio, base64).
    use base64::Engine as _;
    let json = serde_json::json!([{"role": "user", "content": [
        {"type": "text", "text": "listen: "},
        {"type": "input_audio", "input_audio": {"data": base64::engine::general_purpose::STANDARD.encode(&wav), "format": "wav"}},
        {"type": "text", "text": " what is it?"}]}]);
    let msgs = mlex::chat::parse_messages_json_with(&json.to_string(), mlex::chat::MediaAccess::InlineOnly).unwrap();
    let opts = GenerateOptions { max_tokens: want.len(), ignore_eos: true, ..Default::default() };
    assert_eq!(session.generate(&msgs, opts).unwrap().tokens, want);

    // A second turn about the same clip resumes after it (the prompt cache knows the clip by its
    // bytes); a different clip of the same length never reuses the first one's cache.
    let mut turn = ask(wav.clone());
    turn.push(ChatMessage::assistant("ok"));
    turn.push(ChatMessage::user("and then?"));
    let reply = session.generate(&turn, GenerateOptions { max_tokens: 2, ..Default::default() }).unwrap();
    assert!(reply.usage.cached_tokens >= ids.len() - 1, "cached {} of {}", reply.usage.cached_tokens, reply.usage.prompt_tokens);
    let mut samples = vec![0.0f32; 16_000 * 13 / 10];
    samples.iter_mut().enumerate().for_each(|(i, s)| *s = 0.3 * (i as f32 * 0.05).sin());
    let reply = session.generate(&ask(wav_bytes(&samples, 16_000, 1)), GenerateOptions { max_tokens: 2, ..Default::default() }).unwrap();
    assert!(reply.usage.cached_tokens <= 10, "another clip reused {} cached tokens", reply.usage.cached_tokens);

    // The CLI: --audio FILE before the --prompt text (bos, boa, 33 audio tokens, eoa, the text).
    let tokenizer_dir = dir.path().to_str().unwrap().to_string();
    let clip_path = out.path().join("clip.wav");
    let cli = |model: &str| {
        Command::new(env!("CARGO_BIN_EXE_mlex"))
            .args(["generate", "--model", model, "--prompt", " what is it?", "--audio", clip_path.to_str().unwrap()])
            .args(["--max-tokens", "4", "--ignore-eos", "--json", "--device", "cpu"])
            .output()
            .unwrap()
    };
    let run = cli(&tokenizer_dir);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let v: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], 1 + 35 + 12);
    assert_eq!(v["tokens"].as_array().unwrap().len(), 4);
    let text_only = common::tiny_llama_dir();
    let run = cli(text_only.path().to_str().unwrap());
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr).contains("takes no audio"), "{}", String::from_utf8_lossy(&run.stderr));

    // Bad clips: not audio, empty, a truncated header, longer than the 30 s the model takes.
    let long = wav_bytes(&vec![0.1; 16_000 * 31], 16_000, 1);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"this is not audio, only text".to_vec(), "not WAV, FLAC or MP3"),
        (vec![], "empty"),
        (wav[..30].to_vec(), "audio"),
        (long, "longer than the model takes"),
    ];
    for (bytes, what) in cases {
        let err = session.generate(&ask(bytes), GenerateOptions { max_tokens: 2, ..Default::default() }).unwrap_err();
        assert_eq!(err.code(), "INVALID_ARGUMENT", "{err}");
        let msg = err.to_string();
        assert!(msg.contains("the audio (media part 1 of the conversation)") && msg.contains(what), "{msg}");
    }
    drop(session);

    // The same checkpoint without its audio_config: no audio tower, audio parts refused.
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap()).unwrap();
    config.as_object_mut().unwrap().remove("audio_config");
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let session = Session::load(dir.path()).unwrap();
    assert!(!session.info().supports_audio && session.info().supports_images);
    let err = session.generate(&ask(wav), GenerateOptions { max_tokens: 2, ..Default::default() }).unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGUMENT");
    assert!(err.to_string().contains("message 0 holds an audio part, and this model takes no audio"), "{err}");
}

/// A stereo 44.1 kHz WAV: channels averaged in float32, resampled to 16 kHz; with
/// `MLEX_SCIPY_PYTHON` (a Python with scipy) also compared with scipy's resample_poly live (the
/// committed reference of `resample_poly_matches_scipy_reference` checks the resampler always).
#[test]
fn stereo_44k_wav_is_mixed_down_and_resampled() {
    let rate = 44_100;
    let n = 20_000;
    let mut inter = Vec::with_capacity(2 * n);
    for i in 0..n {
        let t = i as f32 / rate as f32;
        inter.push(0.5 * (2.0 * std::f32::consts::PI * 300.0 * t).sin());
        inter.push(0.3 * (2.0 * std::f32::consts::PI * 300.0 * t).sin() + 0.1 * ((i * 7919 % 200) as f32 / 100.0 - 1.0));
    }
    let wav = wav_bytes(&inter, rate, 2);
    let w = decode_audio(&wav, 30.0).unwrap();
    assert_eq!((w.sample_rate, w.samples.len()), (rate, n));
    let q = |s: f32| (s.clamp(-1.0, 1.0) * 32767.0).round() / 32768.0;
    assert_eq!(w.samples[10], (q(inter[20]) + q(inter[21])) / 2.0, "channels averaged in float32");
    let y = mlex::media::load_audio(&wav, 16_000, 30.0).unwrap();
    assert_eq!(y.len(), (n * 160).div_ceil(441));

    let Some(python) = std::env::var_os("MLEX_SCIPY_PYTHON").map(std::path::PathBuf::from) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("x.f32");
    std::fs::write(&input, w.samples.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    let output = tmp.path().join("y.f32");
    let script = "import sys, numpy as np\ntry:\n    from scipy import signal\nexcept ImportError:\n    sys.exit(3)\n\
        x = np.fromfile(sys.argv[1], dtype='<f4')\n\
        y = signal.resample_poly(x, 160, 441, padtype='edge').astype(np.float32)\ny.tofile(sys.argv[2])\n";
    let status = Command::new(&python).arg("-c").arg(script).arg(&input).arg(&output).status().unwrap();
    assert!(status.success(), "MLEX_SCIPY_PYTHON has no scipy");
    let want: Vec<f32> = std::fs::read(&output).unwrap().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    assert_eq!(want.len(), y.len());
    let d = y.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    assert!(d <= 1e-5, "resampled samples differ from scipy's resample_poly by {d}");
    eprintln!("resample_poly 44.1 kHz -> 16 kHz: max |Δ| against scipy {d:e}");
}

/// FLAC decodes to its exact samples (channels averaged); MP3 to the 440 Hz tone it encodes; both
/// resample to 16 kHz. The clips are committed (tests/fixtures/make_audio_fixtures.py made them).
#[test]
fn flac_and_mp3_clips_decode() {
    let flac = std::fs::read(repo_root().join("tests/fixtures/audio_saw.flac")).unwrap();
    let w = decode_audio(&flac, 30.0).unwrap();
    assert_eq!((w.sample_rate, w.samples.len()), (22_050, 5513));
    for (i, &s) in w.samples.iter().enumerate() {
        let (l, r) = (((i * 37) % 2000) as f32 - 1000.0, ((i * 91) % 3000) as f32 - 1500.0);
        assert_eq!(s, (l / 32768.0 + r / 32768.0) / 2.0, "FLAC sample {i}");
    }
    let y = mlex::media::load_audio(&flac, 16_000, 30.0).unwrap();
    assert_eq!(y.len(), (5513 * 320usize).div_ceil(441));

    let mp3 = std::fs::read(repo_root().join("tests/fixtures/audio_tone.mp3")).unwrap();
    let w = decode_audio(&mp3, 30.0).unwrap();
    assert_eq!(w.sample_rate, 44_100);
    // 0.5 s, plus the encoder's delay and padding (under two 1152-sample frames).
    assert!((22_050..22_050 + 2 * 1152 + 1).contains(&w.samples.len()), "{} samples", w.samples.len());
    // The tone: its 440 Hz component holds nearly all of the energy (a DFT bin over 0.4 s).
    let mid = &w.samples[2205..2205 + 17_640];
    let power = |f: f64| {
        let (mut re, mut im) = (0.0f64, 0.0f64);
        for (i, &s) in mid.iter().enumerate() {
            let a = 2.0 * std::f64::consts::PI * f * i as f64 / 44_100.0;
            re += s as f64 * a.cos();
            im += s as f64 * a.sin();
        }
        (re * re + im * im).sqrt() / mid.len() as f64
    };
    let (tone, off) = (power(440.0), power(1000.0));
    assert!(tone > 0.2 && off < 0.01, "440 Hz amplitude {tone}, 1 kHz {off}");
    let y = mlex::media::load_audio(&mp3, 16_000, 30.0).unwrap();
    assert_eq!(y.len(), (w.samples.len() * 160).div_ceil(441));
    // Truncated FLAC and MP3 still decode what they hold, or are INVALID_ARGUMENT; never a panic.
    for bytes in [&flac[..flac.len() / 2], &flac[..50], &mp3[..mp3.len() / 2], &mp3[..10]] {
        match decode_audio(bytes, 30.0) {
            Ok(w) => assert!(!w.samples.is_empty()),
            Err(e) => assert_eq!(e.code(), "INVALID_ARGUMENT", "{e}"),
        }
    }
}

/// The resampler against scipy's own `resample_poly(..., padtype="edge")` output for five source
/// rates, down and up (tests/fixtures/resample_poly_ref.f32, made by make_audio_fixtures.py).
#[test]
fn resample_poly_matches_scipy_reference() {
    let bytes = std::fs::read(repo_root().join("tests/fixtures/resample_poly_ref.f32")).unwrap();
    let want: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    let x: Vec<f32> = (0..1001usize).map(|i| ((i * 7919) % 4001) as f32 - 2000.0).map(|v| v / 4096.0).collect();
    let mut at = 0;
    for rate in [44_100u32, 48_000, 22_050, 8_000, 11_025] {
        let y = mlex::media::resample_poly(&x, rate, 16_000);
        let theirs = &want[at..at + y.len()];
        let d = y.iter().zip(theirs).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(d <= 1e-5, "{rate} Hz -> 16 kHz: differs from scipy's resample_poly by {d}");
        eprintln!("{rate} Hz -> 16 kHz ({} samples): max |Δ| against scipy {d:e}", y.len());
        at += y.len();
    }
    assert_eq!(at, want.len(), "the reference holds the five outputs exactly");
}

/// Mangled clips (bytes flipped, cut, spliced, from WAV, FLAC and MP3) decode or are
/// INVALID_ARGUMENT: never a panic, never an unbounded allocation.
#[test]
fn mangled_audio_never_panics() {
    let wav = wav_bytes(&(0..4000).map(|i| ((i % 50) as f32 - 25.0) / 30.0).collect::<Vec<_>>(), 16_000, 2);
    let flac = std::fs::read(repo_root().join("tests/fixtures/audio_saw.flac")).unwrap();
    let mp3 = std::fs::read(repo_root().join("tests/fixtures/audio_tone.mp3")).unwrap();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut outcomes = (0, 0);
    for base in [&wav, &flac, &mp3] {
        for round in 0..60 {
            let mut b = base.clone();
            match round % 4 {
                0 => {
                    for _ in 0..1 + next() % 8 {
                        let at = (next() as usize) % b.len();
                        b[at] ^= (next() % 255 + 1) as u8;
                    }
                }
                1 => b.truncate((next() as usize) % b.len()),
                2 => {
                    // A header field (sizes, rates, channels) set to an extreme.
                    let at = (next() as usize) % b.len().min(64);
                    let v = [0u8, 0xff, 0x7f, 0x80][(next() % 4) as usize];
                    let end = (at + 4).min(b.len());
                    b[at..end].iter_mut().for_each(|x| *x = v);
                }
                _ => {
                    let at = (next() as usize) % b.len();
                    let other = [&wav, &flac, &mp3][(next() % 3) as usize];
                    b.truncate(at);
                    b.extend_from_slice(&other[(next() as usize) % other.len()..]);
                }
            }
            match decode_audio(&b, 30.0) {
                Ok(w) => {
                    assert!(!w.samples.is_empty() && w.samples.len() <= 30 * w.sample_rate as usize);
                    outcomes.0 += 1;
                }
                Err(e) => {
                    assert_eq!(e.code(), "INVALID_ARGUMENT", "{e}");
                    outcomes.1 += 1;
                }
            }
        }
    }
    eprintln!("mangled clips: {} decoded, {} refused", outcomes.0, outcomes.1);
}

/// Bad audio checkpoints: a bad audio_config field and a missing tower tensor are named.
#[test]
fn gemma4_audio_bad_checkpoints_name_the_problem() {
    let Some(out) = run_oracle("gemma4_audio_bad_checkpoints_name_the_problem") else { return };
    let load = |edit: &dyn Fn(&mut serde_json::Value)| -> String {
        let dir = model_dir(out.path());
        let path = dir.path().join("config.json");
        let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        edit(&mut config);
        std::fs::write(&path, config.to_string()).unwrap();
        let cfg = ModelConfig::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
        let store = RefCell::new(WeightStore::open(dir.path()).unwrap());
        match mlex::models::build_model(&cfg, &Vb::new(&store, None)) {
            Ok(_) => panic!("loaded a bad checkpoint"),
            Err(e) => e.to_string(),
        }
    };
    let err = load(&|c| c["audio_config"]["hidden_size"] = 0.into());
    assert!(err.contains("audio_config.hidden_size must be between 1 and 2^20"), "{err}");
    let err = load(&|c| c["audio_config"]["num_attention_heads"] = 3.into());
    assert!(err.contains("audio_config.hidden_size must be even and a multiple of num_attention_heads"), "{err}");
    let err = load(&|c| c["audio_config"]["subsampling_conv_channels"] = serde_json::json!([8]));
    assert!(err.contains("audio_config.subsampling_conv_channels"), "{err}");
    let err = load(&|c| c["audio_config"]["num_hidden_layers"] = 3.into());
    assert!(err.contains("audio_tower.layers.2."), "{err}");
    let err = load(&|c| c["audio_token_id"] = 999.into());
    assert!(err.contains("audio_token_id 999 is outside the vocabulary"), "{err}");
}
