//! Bad input must come back as a clean `Err` naming what is wrong (file, tensor, field), never a
//! panic or an abort. Every case starts from a tiny llama checkpoint written by
//! `common::TinyLlama` (no Python needed) and breaks one thing.
mod common;

use common::{
    edit_json, patch_safetensors_header, read_tensors, tiny_llama_dir, write_safetensors, RawTensor, Rng, TinyLlama,
    TINY_VOCAB,
};
use mlex::{Error, GenerateOptions, GenerateReply, LoadOptions, SamplingConfig, Session};
use serde_json::{json, Value};
use std::path::Path;

fn load(dir: &Path) -> mlex::Result<Session> {
    // CPU, f32: the configuration CI runs.
    Session::load_with_options(dir, LoadOptions { dtype: Some(mlex::Dtype::Float32), ..Default::default() })
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampling: SamplingConfig { temperature: 0.0, ..Default::default() },
        ignore_eos: true,
        ..Default::default()
    }
}

/// Loads `dir` expecting an error; returns it.
fn load_err(dir: &Path) -> Error {
    match load(dir) {
        Ok(_) => panic!("loading {} succeeded; expected an error", dir.display()),
        Err(e) => e,
    }
}

/// Asserts `e` is `InvalidCheckpoint` and that its message mentions every one of `needles`.
#[track_caller]
fn assert_checkpoint_err(e: &Error, needles: &[&str]) {
    assert!(matches!(e, Error::InvalidCheckpoint { .. }), "expected InvalidCheckpoint, got {e:?}");
    let msg = e.to_string();
    for n in needles {
        assert!(msg.contains(n), "error message does not name '{n}': {msg}");
    }
}

const PROMPT: &[u32] = &[72, 101, 108, 108, 111, 44, 32, 119];

// ---------------------------------------------------------------------------------------------
// The good checkpoint

#[test]
fn smoke_tiny_llama_generates() {
    let dir = tiny_llama_dir();
    let session = load(dir.path()).expect("loading the Rust-written tiny llama");
    let mut streamed = vec![];
    let reply = session
        .generate_tokens(PROMPT, greedy(8), |t| {
            streamed.push(t.id);
            true
        })
        .expect("generate");
    assert_eq!(reply.tokens.len(), 8, "{reply:?}");
    assert_eq!(reply.logprobs.len(), 8);
    assert_eq!(streamed, reply.tokens, "the callback sees every token, in order");
    assert!(reply.tokens.iter().all(|&t| (t as usize) < TINY_VOCAB), "{:?}", reply.tokens);
    assert!(reply.logprobs.iter().all(|&l| l.is_finite() && l <= 1e-6), "{:?}", reply.logprobs);
    // Greedy is deterministic.
    let again = session.generate_tokens(PROMPT, greedy(8), |_| true).unwrap();
    assert_eq!(again.tokens, reply.tokens);
    // And the text path works through the tokenizer written next to it.
    let text = session.generate_text("Hello", greedy(4), |_| true).expect("generate_text");
    assert_eq!(text.tokens.len(), 4);
}

#[test]
fn smoke_tiny_llama_tied_generates() {
    let dir = tempfile::tempdir().unwrap();
    TinyLlama { tie_word_embeddings: true, ..Default::default() }.write(dir.path());
    let session = load(dir.path()).expect("loading the tied tiny llama");
    let reply = session.generate_tokens(PROMPT, greedy(8), |_| true).expect("generate");
    assert_eq!(reply.tokens.len(), 8);
}

// ---------------------------------------------------------------------------------------------
// safetensors

#[test]
fn truncated_safetensors() {
    let dir = tiny_llama_dir();
    let f = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    assert_checkpoint_err(&load_err(dir.path()), &["model.safetensors"]);
}

#[test]
fn truncated_inside_header() {
    let dir = tiny_llama_dir();
    let f = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..20]).unwrap();
    assert_checkpoint_err(&load_err(dir.path()), &["model.safetensors"]);
}

#[test]
fn header_offsets_past_end_of_file() {
    let dir = tiny_llama_dir();
    let f = dir.path().join("model.safetensors");
    let name = "model.layers.1.mlp.up_proj.weight";
    patch_safetensors_header(&f, |h| {
        let offs = h[name]["data_offsets"].as_array().unwrap().clone();
        let begin = offs[0].as_u64().unwrap();
        // Same length (so dtype × shape still matches), but far beyond the data.
        let len = offs[1].as_u64().unwrap() - begin;
        h[name]["data_offsets"] = json!([begin + (1 << 20), begin + (1 << 20) + len]);
    });
    assert_checkpoint_err(&load_err(dir.path()), &["model.safetensors", name]);
}

#[test]
fn header_length_absurd() {
    let dir = tiny_llama_dir();
    let f = dir.path().join("model.safetensors");
    let mut bytes = std::fs::read(&f).unwrap();
    bytes[..8].copy_from_slice(&(u64::MAX - 7).to_le_bytes());
    std::fs::write(&f, &bytes).unwrap();
    assert_checkpoint_err(&load_err(dir.path()), &["model.safetensors"]);
}

#[test]
fn header_not_json() {
    let dir = tiny_llama_dir();
    let f = dir.path().join("model.safetensors");
    let mut bytes = std::fs::read(&f).unwrap();
    bytes[8] = b'!';
    std::fs::write(&f, &bytes).unwrap();
    assert_checkpoint_err(&load_err(dir.path()), &["model.safetensors"]);
}

#[test]
fn wrong_dtype_for_a_tensor() {
    // A float weight stored as I32 (same byte size, so the header itself is consistent).
    let dir = tiny_llama_dir();
    let name = "model.layers.0.self_attn.q_proj.weight";
    patch_safetensors_header(&dir.path().join("model.safetensors"), |h| {
        h[name]["dtype"] = json!("I32");
    });
    assert_checkpoint_err(&load_err(dir.path()), &["model.safetensors", name]);
}

#[test]
fn dtype_size_mismatch() {
    // F16 declared for F32 data: dtype × shape no longer matches the stored bytes.
    let dir = tiny_llama_dir();
    let name = "model.norm.weight";
    patch_safetensors_header(&dir.path().join("model.safetensors"), |h| {
        h[name]["dtype"] = json!("F16");
    });
    assert_checkpoint_err(&load_err(dir.path()), &["model.safetensors", name]);
}

#[test]
fn wrong_shape() {
    // Same element count, transposed-looking shape: only a shape check can catch it.
    let dir = tiny_llama_dir();
    let name = "model.layers.1.mlp.gate_proj.weight";
    patch_safetensors_header(&dir.path().join("model.safetensors"), |h| {
        let shape: Vec<u64> = h[name]["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
        h[name]["shape"] = json!([shape[1], shape[0]]);
    });
    assert_checkpoint_err(&load_err(dir.path()), &["model.safetensors", name]);
}

#[test]
fn missing_tensor() {
    let dir = tiny_llama_dir();
    let f = dir.path().join("model.safetensors");
    let name = "model.layers.1.mlp.down_proj.weight";
    let tensors: Vec<RawTensor> = read_tensors(&f).into_iter().filter(|t| t.name != name).collect();
    write_safetensors(&f, &tensors);
    assert_checkpoint_err(&load_err(dir.path()), &[name]);
}

#[test]
fn extra_unexpected_tensor() {
    let dir = tiny_llama_dir();
    let f = dir.path().join("model.safetensors");
    let name = "model.layers.0.mlp.extra_proj.weight";
    let mut tensors = read_tensors(&f);
    tensors.push(RawTensor::f32(name, &[4, 4], &Rng::new(1).uniform(16, 0.1)));
    write_safetensors(&f, &tensors);
    assert_checkpoint_err(&load_err(dir.path()), &["model.safetensors", name]);
}

#[test]
fn no_weights_at_all() {
    let dir = tiny_llama_dir();
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let e = load_err(dir.path());
    assert!(matches!(e, Error::InvalidCheckpoint { .. } | Error::ModelNotFound(_)), "{e:?}");
    assert!(e.to_string().contains("safetensors"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// config.json

#[test]
fn unknown_model_type() {
    let dir = tiny_llama_dir();
    edit_json(&dir.path().join("config.json"), |c| c["model_type"] = json!("gpt_neverheard"));
    assert_checkpoint_err(&load_err(dir.path()), &["config.json", "gpt_neverheard"]);
}

#[test]
fn malformed_config_json() {
    let dir = tiny_llama_dir();
    std::fs::write(dir.path().join("config.json"), "{\"model_type\": \"llama\", \"hidden_size\": 32,").unwrap();
    assert_checkpoint_err(&load_err(dir.path()), &["config.json"]);
}

#[test]
fn config_missing_required_field() {
    let dir = tiny_llama_dir();
    edit_json(&dir.path().join("config.json"), |c| {
        c.as_object_mut().unwrap().remove("hidden_size");
    });
    assert_checkpoint_err(&load_err(dir.path()), &["config.json", "hidden_size"]);
}

#[test]
fn config_field_of_wrong_type() {
    let dir = tiny_llama_dir();
    edit_json(&dir.path().join("config.json"), |c| c["num_hidden_layers"] = json!("two"));
    assert_checkpoint_err(&load_err(dir.path()), &["config.json", "num_hidden_layers"]);
}

#[test]
fn unsupported_quantization_bits() {
    // q_proj stored as a 7-bit affine quantized linear (group 32), and the config says bits 7.
    let dir = tiny_llama_dir();
    let tl = TinyLlama::default();
    let f = dir.path().join("model.safetensors");
    let prefix = "model.layers.0.self_attn.q_proj";
    let (out, inp, group, bits) = (tl.heads * tl.head_dim, tl.hidden, 32usize, 7usize);
    let mut tensors: Vec<RawTensor> = read_tensors(&f).into_iter().filter(|t| t.name != format!("{prefix}.weight")).collect();
    let mut rng = Rng::new(7);
    let packed: Vec<u32> = (0..out * inp * bits / 32).map(|_| rng.next_u64() as u32).collect();
    tensors.push(RawTensor::u32(&format!("{prefix}.weight"), &[out, inp * bits / 32], &packed));
    tensors.push(RawTensor::f32(&format!("{prefix}.scales"), &[out, inp / group], &vec![0.01; out * inp / group]));
    tensors.push(RawTensor::f32(&format!("{prefix}.biases"), &[out, inp / group], &vec![-0.5; out * inp / group]));
    write_safetensors(&f, &tensors);
    edit_json(&dir.path().join("config.json"), |c| {
        let q = json!({"group_size": group, "bits": bits, "mode": "affine"});
        c["quantization"] = q.clone();
        c["quantization_config"] = q;
    });
    let e = load_err(dir.path());
    assert!(matches!(e, Error::InvalidCheckpoint { .. } | Error::InvalidArgument(_)), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains('7') && (msg.contains("bits") || msg.contains("quantiz")), "{msg}");
}

#[test]
fn unsupported_quantization_mode() {
    let dir = tiny_llama_dir();
    edit_json(&dir.path().join("config.json"), |c| {
        c["quantization"] = json!({"group_size": 64, "bits": 4, "mode": "int4_made_up"});
    });
    let e = load_err(dir.path());
    assert!(matches!(e, Error::InvalidCheckpoint { .. }), "{e:?}");
    assert!(e.to_string().contains("int4_made_up"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Tokenizer, prompt and options

#[test]
fn missing_tokenizer_json_when_generating_from_text() {
    let dir = tiny_llama_dir();
    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    // Loading may succeed (token-id prompts need no tokenizer); text generation must not.
    let e = match load(dir.path()) {
        Err(e) => e,
        Ok(session) => {
            // Token ids still work without a tokenizer.
            let r = session.generate_tokens(PROMPT, greedy(2), |_| true).expect("token-id generation without tokenizer");
            assert_eq!(r.tokens.len(), 2);
            session.generate_text("Hello", greedy(2), |_| true).expect_err("generate_text without tokenizer.json")
        }
    };
    assert!(matches!(e, Error::Tokenizer(_) | Error::InvalidCheckpoint { .. }), "{e:?}");
    assert!(e.to_string().contains("tokenizer"), "{e}");
}

#[test]
fn malformed_tokenizer_json() {
    let dir = tiny_llama_dir();
    std::fs::write(dir.path().join("tokenizer.json"), "{\"model\": ").unwrap();
    let e = match load(dir.path()) {
        Err(e) => e,
        Ok(session) => session.generate_text("Hello", greedy(2), |_| true).expect_err("generate_text with a broken tokenizer.json"),
    };
    assert!(matches!(e, Error::Tokenizer(_) | Error::InvalidCheckpoint { .. }), "{e:?}");
    assert!(e.to_string().contains("tokenizer"), "{e}");
}

#[test]
fn empty_prompt() {
    let dir = tiny_llama_dir();
    let session = load(dir.path()).unwrap();
    let e = session.generate_tokens(&[], greedy(4), |_| true).expect_err("empty prompt");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
}

#[test]
fn token_id_out_of_vocabulary() {
    let dir = tiny_llama_dir();
    let session = load(dir.path()).unwrap();
    let bad = TINY_VOCAB as u32 + 5;
    let e = session.generate_tokens(&[1, 2, bad], greedy(4), |_| true).expect_err("token id beyond the vocabulary");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains(&bad.to_string()), "{e}");
    // The session is still usable afterwards.
    assert_eq!(session.generate_tokens(PROMPT, greedy(2), |_| true).unwrap().tokens.len(), 2);
}

/// A clean outcome for an oversized request: a clear InvalidArgument, or a reply that stopped
/// within bounds.
#[track_caller]
fn assert_clean(result: mlex::Result<GenerateReply>, max_tokens: usize) {
    match result {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("max_tokens") || m.contains("context"), "{m}"),
        Err(e) => panic!("expected InvalidArgument or a clamped reply, got {e:?}"),
        Ok(r) => {
            assert!(r.tokens.len() <= max_tokens);
            assert_eq!(r.tokens.len(), r.logprobs.len());
        }
    }
}

#[test]
fn absurd_max_tokens() {
    let dir = tiny_llama_dir();
    let session = load(dir.path()).unwrap();
    assert_clean(session.generate_tokens(PROMPT, greedy(usize::MAX), |_| true), usize::MAX);
    // And it was not left in a bad state.
    assert_eq!(session.generate_tokens(PROMPT, greedy(2), |_| true).unwrap().tokens.len(), 2);
}

#[test]
fn max_tokens_beyond_context() {
    // max_position_embeddings is 128; ask for more than fits after the prompt.
    let dir = tiny_llama_dir();
    let session = load(dir.path()).unwrap();
    let max = 2 * TinyLlama::default().max_position_embeddings;
    assert_clean(session.generate_tokens(PROMPT, greedy(max), |_| true), max);
}

#[test]
fn invalid_sampling_option() {
    let dir = tiny_llama_dir();
    let session = load(dir.path()).unwrap();
    let opts = GenerateOptions {
        max_tokens: 2,
        sampling: SamplingConfig { temperature: f32::NAN, ..Default::default() },
        ..Default::default()
    };
    let e = session.generate_tokens(PROMPT, opts, |_| true).expect_err("NaN temperature");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("temperature"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Paths

#[test]
fn nonexistent_model_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-model");
    let e = load_err(&missing);
    assert!(matches!(e, Error::ModelNotFound(_)), "{e:?}");
    assert!(e.to_string().contains("no-such-model"), "{e}");
}

#[test]
fn directory_without_config() {
    let dir = tiny_llama_dir();
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    let e = load_err(dir.path());
    assert!(matches!(e, Error::ModelNotFound(_) | Error::InvalidCheckpoint { .. }), "{e:?}");
    assert!(e.to_string().contains("config.json"), "{e}");
}

/// The Rust-written safetensors parse back as written (guards the helpers the tests above use).
#[test]
fn safetensors_writer_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("t.safetensors");
    let a = RawTensor::f32("a", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = RawTensor::u32("b", &[3], &[7, 8, 9]);
    write_safetensors(&f, &[a.clone(), b.clone()]);
    let bytes = std::fs::read(&f).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!(n % 8, 0, "header padded to 8 bytes");
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(header["a"]["data_offsets"], json!([0, 24]));
    assert_eq!(header["b"]["data_offsets"], json!([24, 36]));
    assert_eq!(header["__metadata__"]["format"], json!("mlx"));
    let back = read_tensors(&f);
    assert_eq!(back.len(), 2);
    assert_eq!((back[0].name.as_str(), &back[0].data), ("a", &a.data));
    assert_eq!((back[1].name.as_str(), &back[1].shape, &back[1].data), ("b", &b.shape, &b.data));
}
