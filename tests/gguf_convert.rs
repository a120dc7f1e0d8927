//! GGUF reader, block decoders and GGUF → MLX conversion.
//!
//! Fixtures: tests/fixtures/quant_ref.gguf (made by tests/gguf/make_quant_fixtures.py with the
//! `gguf` Python package) and tests/fixtures/affine_ref.safetensors (made by
//! tests/gguf/make_affine_fixtures.py with MLX's own `mx.quantize`). Everything else is built
//! here in test code.
#[path = "common/gguf.rs"]
mod common;
#[path = "common/skip.rs"]
mod skips;

use std::path::{Path, PathBuf};

use common::*;
use skips::{skip, skip_unless_ci};
use mlex::convert::{affine, convert_gguf, ConvertOptions, FloatDtype};
use mlex::error::Error;
use mlex::gguf::writer::GgufWriter;
use mlex::gguf::{GgmlType, GgufFile, Value};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn check_quant_reference(path: &Path) {
    let g = GgufFile::open(path).unwrap();
    let types = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "F16", "BF16"];
    for ty in types {
        let q = g.tensor(&format!("{ty}.q")).unwrap_or_else(|| panic!("{ty}.q missing"));
        assert_eq!(q.ty.name(), ty);
        let r = g.tensor(&format!("{ty}.f32")).unwrap();
        let got = g.dequantize(q).unwrap();
        let want = g.dequantize(r).unwrap();
        assert_eq!(got.len(), want.len(), "{ty}");
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{ty} element {i}: ours {a} reference {b}");
        }
    }
}

#[test]
fn gguf_quants_match_reference() {
    check_quant_reference(&fixture("quant_ref.gguf"));
}

/// With `MLEX_GGUF_PYTHON` (a Python that has `gguf` + numpy), regenerate fixtures with other
/// seeds and compare again.
#[test]
fn gguf_quants_match_live_python() {
    let Ok(py) = std::env::var("MLEX_GGUF_PYTHON") else {
        skip("gguf_quants_match_live_python", "MLEX_GGUF_PYTHON not set (a Python with gguf and numpy)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gguf/make_quant_fixtures.py");
    for seed in ["1", "99", "31337"] {
        let out = dir.path().join(format!("q{seed}.gguf"));
        let st = std::process::Command::new(&py).arg(&script).arg(&out).arg(seed).status().unwrap();
        assert!(st.success());
        check_quant_reference(&out);
    }
}

/// Our affine quantizer reproduces `mx.quantize` (affine, f32 input) bit for bit.
#[test]
fn affine_matches_mlx_quantize() {
    let st = read_safetensors(&fixture("affine_ref.safetensors"));
    let w = &st["w"];
    let (rows, cols) = (w.shape[0] as usize, w.shape[1] as usize);
    let wv = w.f32s();
    for bits in [2u32, 3, 4, 5, 6, 8] {
        for gs in [32usize, 64, 128] {
            let key = format!("b{bits}_g{gs}");
            let (mut packed, mut scales, mut biases) = (Vec::new(), Vec::new(), Vec::new());
            for r in 0..rows {
                affine::quantize_row(&wv[r * cols..(r + 1) * cols], bits, gs, &mut packed, &mut scales, &mut biases);
            }
            let rw = &st[&format!("{key}.weight")];
            assert_eq!(rw.shape, vec![rows as u64, (cols * bits as usize / 32) as u64], "{key}");
            assert_eq!(packed, rw.data, "{key}: packed weights differ");
            let rs = st[&format!("{key}.scales")].f32s();
            let rb = st[&format!("{key}.biases")].f32s();
            for i in 0..scales.len() {
                assert_eq!(scales[i].to_bits(), rs[i].to_bits(), "{key} scale {i}: {} vs {}", scales[i], rs[i]);
                assert_eq!(biases[i].to_bits(), rb[i].to_bits(), "{key} bias {i}: {} vs {}", biases[i], rb[i]);
            }
        }
    }
}

/// Q4_0 / Q4_1 / Q8_0 → MLX affine g32 is exact: MLX's w = scale·q + bias (in f32) equals the
/// GGUF dequantization bit for bit.
#[test]
fn lossless_repack_is_exact() {
    let mut rng = Rng(42);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        let vals = rng.vec(32 * 64, 0.3);
        let data = match ty {
            GgmlType::Q4_0 => enc_q4_0(&vals),
            GgmlType::Q4_1 => enc_q4_1(&vals),
            _ => enc_q8_0(&vals),
        };
        let mut want = vec![0f32; vals.len()];
        mlex::gguf::quants::dequantize_row(ty, &data, &mut want).unwrap();
        let (mut p, mut s, mut b) = (Vec::new(), Vec::new(), Vec::new());
        affine::repack_lossless_row(ty, &data, &mut p, &mut s, &mut b);
        let bits = affine::lossless_bits(ty).unwrap();
        let q = affine::unpack(&p, bits, vals.len());
        assert!(affine::lossless_fits_f16(ty, &data));
        for i in 0..vals.len() {
            // Scales/biases stored in f16 must be exact.
            let (sc, bi) = (s[i / 32], b[i / 32]);
            assert_eq!(half::f16::from_f32(sc).to_f32(), sc);
            assert_eq!(half::f16::from_f32(bi).to_f32(), bi);
            let got = sc * q[i] as f32 + bi;
            // Equal values; only the sign of a zero may differ (GGUF's d·0 is −0 for negative d).
            assert_eq!(got, want[i], "{ty} element {i}: {got} vs {}", want[i]);
        }
    }
}

fn write_gguf(dir: &Path, name: &str, w: &GgufWriter) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, w.to_bytes()).unwrap();
    p
}

fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// A float llama: q/k un-permuted exactly; config and tie handling.
#[test]
fn convert_llama_f32_unpermutes_qk() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model("llama", GgmlType::F32, GgmlType::F32, false);
    let src = write_gguf(dir.path(), "tiny.gguf", &m.writer);
    let out = dir.path().join("out");
    let opts = ConvertOptions { float_dtype: FloatDtype::F32, ..Default::default() };
    let mut seen = Vec::new();
    let sum = convert_gguf(&src, &out, &opts, &mut |p| seen.push((p.done, p.total))).unwrap();
    assert_eq!(seen.last().unwrap().0, seen.last().unwrap().1);
    assert!(sum.tie_word_embeddings);
    let st = read_safetensors(&out.join("model.safetensors"));
    let q = st["model.layers.0.self_attn.q_proj.weight"].f32s();
    assert_eq!(st["model.layers.0.self_attn.q_proj.weight"].shape, vec![(HEADS * HEAD_DIM) as u64, HIDDEN as u64]);
    assert_eq!(q, m.q_hf, "q_proj not un-permuted");
    assert_eq!(st["model.layers.0.self_attn.k_proj.weight"].f32s(), m.k_hf, "k_proj not un-permuted");
    assert!(!st.contains_key("lm_head.weight"));
    assert_eq!(st["model.norm.weight"].dtype, "F32");
    let cfg = read_json(&out.join("config.json"));
    assert_eq!(cfg["model_type"], "llama");
    assert_eq!(cfg["hidden_size"], HIDDEN);
    assert_eq!(cfg["num_attention_heads"], HEADS);
    assert_eq!(cfg["num_key_value_heads"], KV_HEADS);
    assert_eq!(cfg["intermediate_size"], FFN);
    assert_eq!(cfg["vocab_size"], m.vocab);
    assert_eq!(cfg["tie_word_embeddings"], true);
    assert_eq!(cfg["rms_norm_eps"].as_f64().unwrap(), 1e-5, "shortest decimal of the f32");
    assert_eq!(cfg["rope_theta"].as_f64().unwrap(), 10000.0);
    assert!(cfg.get("quantization").is_none());
    assert_eq!(cfg["eos_token_id"], 2);
}

/// Q4_1 projections + Q8_0 embedding (SmolLM2's mix): lossless, permuted whole rows, and the
/// mlx-lm quantization config with the 8-bit override.
#[test]
fn convert_llama_q4_1_lossless() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model("llama", GgmlType::Q4_1, GgmlType::Q8_0, false);
    let src = write_gguf(dir.path(), "tiny.gguf", &m.writer);
    let out = dir.path().join("out");
    let sum = convert_gguf(&src, &out, &ConvertOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(sum.lossless, 8);
    assert_eq!(sum.requantized, 0);
    let st = read_safetensors(&out.join("model.safetensors"));
    let g = GgufFile::open(&src).unwrap();

    // q_proj: MLX dequantization == GGUF dequantization with rows un-permuted.
    let t = g.tensor("blk.0.attn_q.weight").unwrap();
    let gq = g.dequantize(t).unwrap();
    let rows = HEADS * HEAD_DIM;
    let want = {
        // undo: GGUF row h*hd + 2i + t → HF row h*hd + t*half + i
        let mut w = vec![0f32; gq.len()];
        for r in 0..rows {
            let (h, within) = (r / HEAD_DIM, r % HEAD_DIM);
            let (tt, i) = (within / (HEAD_DIM / 2), within % (HEAD_DIM / 2));
            let s = h * HEAD_DIM + 2 * i + tt;
            w[r * HIDDEN..(r + 1) * HIDDEN].copy_from_slice(&gq[s * HIDDEN..(s + 1) * HIDDEN]);
        }
        w
    };
    let p = "model.layers.0.self_attn.q_proj";
    let (w, s, b) = (&st[&format!("{p}.weight")], &st[&format!("{p}.scales")], &st[&format!("{p}.biases")]);
    assert_eq!(w.dtype, "U32");
    assert_eq!(w.shape, vec![rows as u64, (HIDDEN / 8) as u64]);
    assert_eq!(s.shape, vec![rows as u64, (HIDDEN / 32) as u64]);
    assert_eq!(s.dtype, "F16");
    let got = mlx_dequantize(w, s, b, 4);
    assert_eq!(got, want);

    // Embedding: 8-bit lossless.
    let e = "model.embed_tokens";
    let got = mlx_dequantize(&st[&format!("{e}.weight")], &st[&format!("{e}.scales")], &st[&format!("{e}.biases")], 8);
    assert_eq!(got, g.dequantize(g.tensor("token_embd.weight").unwrap()).unwrap());

    let cfg = read_json(&out.join("config.json"));
    let q = &cfg["quantization"];
    assert_eq!(q["group_size"], 32);
    assert_eq!(q["bits"], 4);
    assert_eq!(q["mode"], "affine");
    assert_eq!(q["model.embed_tokens"], serde_json::json!({"group_size": 32, "bits": 8}));
    assert_eq!(cfg["quantization_config"], cfg["quantization"]);
}

/// K-quants: floats with --float, re-quantized with --q-bits; a 1-D tensor always float.
#[test]
fn convert_qwen2_kquants_float_and_q_bits() {
    for wty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_0, GgmlType::Q3_K, GgmlType::Q2_K, GgmlType::Q5_K] {
        let dir = tempfile::tempdir().unwrap();
        let m = tiny_model("qwen2", wty, GgmlType::Q6_K, true);
        let src = write_gguf(dir.path(), "tiny.gguf", &m.writer);
        let g = GgufFile::open(&src).unwrap();

        // --float: floats (f16), no quantization section.
        let out = dir.path().join("f");
        let opts = ConvertOptions { float: true, ..Default::default() };
        let sum = convert_gguf(&src, &out, &opts, &mut |_| {}).unwrap();
        assert!(!sum.tie_word_embeddings);
        let st = read_safetensors(&out.join("model.safetensors"));
        let q = &st["model.layers.0.self_attn.q_proj.weight"];
        assert_eq!(q.dtype, "F16");
        let want = g.dequantize(g.tensor("blk.0.attn_q.weight").unwrap()).unwrap();
        let got = q.f32s();
        for (a, b) in got.iter().zip(&want) {
            assert_eq!(*a, half::f16::from_f32(*b).to_f32(), "{wty}: qwen2 is not permuted");
        }
        assert_eq!(st["model.layers.0.self_attn.q_proj.bias"].dtype, "F32");
        let cfg = read_json(&out.join("config.json"));
        assert_eq!(cfg["model_type"], "qwen2");
        assert!(cfg.get("quantization").is_none());

        // --q-bits 4 --q-group-size 64.
        let out = dir.path().join("q");
        let opts = ConvertOptions { q_bits: Some(4), q_group_size: 64, float_dtype: FloatDtype::F32, float: false };
        let sum = convert_gguf(&src, &out, &opts, &mut |_| {}).unwrap();
        assert_eq!(sum.requantized, 9, "{wty}");
        let st = read_safetensors(&out.join("model.safetensors"));
        let p = "model.layers.0.mlp.down_proj";
        let (w, s, b) = (&st[&format!("{p}.weight")], &st[&format!("{p}.scales")], &st[&format!("{p}.biases")]);
        assert_eq!(w.shape, vec![HIDDEN as u64, (FFN / 8) as u64]);
        assert_eq!(s.shape, vec![HIDDEN as u64, (FFN / 64) as u64]);
        let got = mlx_dequantize(w, s, b, 4);
        let want = g.dequantize(g.tensor("blk.0.ffn_down.weight").unwrap()).unwrap();
        let scales = s.f32s();
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            let sc = scales[i / 64].abs();
            // MLX moves the scale so the larger-magnitude edge is exact; the other edge may clip by up to one step.
            assert!((a - b).abs() <= sc * 1.001 + 1e-6, "{wty} element {i}: {a} vs {b} (scale {sc})");
        }
        let cfg = read_json(&out.join("config.json"));
        assert_eq!(cfg["quantization"]["bits"], 4);
        assert_eq!(cfg["quantization"]["group_size"], 64);
    }
}

/// The generated tokenizer.json loads in `tokenizers`, round-trips, and keeps specials whole.
#[test]
fn tokenizer_json_byte_level_bpe() {
    for pre in ["smollm", "qwen2", "llama-bpe", "default", "gpt-2"] {
        let dir = tempfile::tempdir().unwrap();
        let mut m = tiny_model("llama", GgmlType::F16, GgmlType::F16, false);
        for (k, v) in m.writer.metadata.iter_mut() {
            if k == "tokenizer.ggml.pre" {
                *v = Value::String(pre.into());
            }
        }
        let src = write_gguf(dir.path(), "tiny.gguf", &m.writer);
        let out = dir.path().join("out");
        let sum = convert_gguf(&src, &out, &ConvertOptions::default(), &mut |_| {}).unwrap();
        assert!(sum.warnings.is_empty(), "{pre}: {:?}", sum.warnings);
        let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
        for s in ["hello the world", "  leading spaces\nand 12345 numbers ünïcödé 😀", "<|im_start|>user\nhi<|im_end|>"] {
            let enc = tok.encode(s, false).unwrap();
            let dec = tok.decode(enc.get_ids(), false).unwrap();
            assert_eq!(dec, s, "{pre}: round trip");
        }
        let enc = tok.encode("<|im_start|>user hello<|im_end|>", false).unwrap();
        assert_eq!(enc.get_ids()[0], 1, "{pre}");
        assert_eq!(*enc.get_ids().last().unwrap(), 2, "{pre}");
        // merges applied: "Ġthe" and "hello" are single tokens
        let enc = tok.encode("hello the", false).unwrap();
        assert_eq!(enc.get_tokens(), &["hello", "Ġthe"], "{pre}");
        let tc = read_json(&out.join("tokenizer_config.json"));
        assert_eq!(tc["eos_token"], "<|im_end|>");
        assert_eq!(tc["bos_token"], "<|im_start|>");
        assert!(tc["chat_template"].as_str().unwrap().contains("im_start"));
        let gc = read_json(&out.join("generation_config.json"));
        assert_eq!(gc["eos_token_id"], 2);
    }
}

/// A SentencePiece ("llama") vocabulary: ▁ handling and byte fallback.
#[test]
fn tokenizer_json_sentencepiece() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = tiny_model("llama", GgmlType::F16, GgmlType::F16, false);
    m.writer.metadata.retain(|(k, _)| !k.starts_with("tokenizer."));
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2i32, 3, 3];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "hell", "hello", "▁hello", "▁w", "or", "▁wor", "▁world", "ld"];
    let mut scores = vec![0f32; tokens.len()];
    for (i, p) in pieces.iter().enumerate() {
        tokens.push(p.to_string());
        types.push(1);
        scores.push(-(i as f32));
    }
    let n = tokens.len();
    let w = &mut m.writer;
    w.str("tokenizer.ggml.model", "llama");
    w.kv("tokenizer.ggml.tokens", Value::Array(mlex::gguf::ValueType::String, tokens.iter().cloned().map(Value::String).collect()));
    w.kv("tokenizer.ggml.token_type", Value::Array(mlex::gguf::ValueType::I32, types.into_iter().map(Value::I32).collect()));
    w.kv("tokenizer.ggml.scores", Value::Array(mlex::gguf::ValueType::F32, scores.into_iter().map(Value::F32).collect()));
    w.u32("tokenizer.ggml.bos_token_id", 1);
    w.u32("tokenizer.ggml.eos_token_id", 2);
    w.u32("tokenizer.ggml.unknown_token_id", 0);
    for (k, v) in w.metadata.iter_mut() {
        if k == "llama.vocab_size" {
            *v = Value::U32(n as u32);
        }
    }
    // The embedding must match the new vocabulary size.
    let embd = enc_f16(&vec![0.01f32; n * HIDDEN]);
    for t in w.tensors.iter_mut() {
        if t.0 == "token_embd.weight" {
            t.1 = vec![HIDDEN as u64, n as u64];
            t.3 = embd.clone();
        }
    }
    let src = write_gguf(dir.path(), "spm.gguf", &m.writer);
    let out = dir.path().join("out");
    convert_gguf(&src, &out, &ConvertOptions::default(), &mut |_| {}).unwrap();
    let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    let enc = tok.encode("hello world", true).unwrap();
    assert_eq!(enc.get_tokens(), &["<s>", "▁hello", "▁world"]);
    let enc = tok.encode("hello\n", false).unwrap();
    assert_eq!(enc.get_tokens(), &["▁hello", "<0x0A>"]);
    for s in ["hello world", "héllo\tworld"] {
        let enc = tok.encode(s, false).unwrap();
        assert_eq!(tok.decode(enc.get_ids(), false).unwrap(), s);
    }
}

fn expect_checkpoint_err(r: Result<GgufFile, Error>, needle: &str) {
    match r {
        Err(Error::InvalidCheckpoint { msg, .. }) => assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}"),
        Err(e) => panic!("wrong error kind: {e}"),
        Ok(_) => panic!("expected an error containing {needle:?}"),
    }
}

#[test]
fn malformed_files_are_clean_errors() {
    let m = tiny_model("llama", GgmlType::Q4_0, GgmlType::Q8_0, false);
    let good = m.writer.to_bytes();
    assert!(GgufFile::from_bytes("ok.gguf", good.clone()).is_ok());

    // Bad magic.
    let mut b = good.clone();
    b[0] = b'X';
    expect_checkpoint_err(GgufFile::from_bytes("x.gguf", b), "magic");
    // Unsupported version.
    let mut b = good.clone();
    b[4] = 9;
    expect_checkpoint_err(GgufFile::from_bytes("x.gguf", b), "version");
    // Truncated at every prefix length (a sample of them): never a panic, always an error.
    for cut in (0..good.len()).step_by(good.len() / 300 + 1) {
        let r = GgufFile::from_bytes("cut.gguf", good[..cut].to_vec());
        assert!(matches!(r, Err(Error::InvalidCheckpoint { .. })), "cut at {cut} was accepted");
    }
    expect_checkpoint_err(GgufFile::from_bytes("x.gguf", good[..good.len() - 1].to_vec()), "output_norm.weight");
    // Absurd counts.
    let mut b = good.clone();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    expect_checkpoint_err(GgufFile::from_bytes("x.gguf", b), "tensor count");
    let mut b = good.clone();
    b[16..24].copy_from_slice(&(1u64 << 50).to_le_bytes());
    expect_checkpoint_err(GgufFile::from_bytes("x.gguf", b), "metadata count");

    // Absurd string length / array count in metadata.
    let mut w = GgufWriter::new();
    w.str("general.architecture", "llama");
    let mut b = w.to_bytes();
    // key length field of the first kv at offset 24
    b[24..32].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    expect_checkpoint_err(GgufFile::from_bytes("x.gguf", b), "metadata entry 0");
    let mut w = GgufWriter::new();
    w.strs("tokenizer.ggml.tokens", &["a", "b"]);
    let mut b = w.to_bytes();
    let pos = 24 + 8 + "tokenizer.ggml.tokens".len() + 4 + 4; // array count
    b[pos..pos + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    expect_checkpoint_err(GgufFile::from_bytes("x.gguf", b), "tokenizer.ggml.tokens");

    // Unknown tensor type; offset past the end; misaligned offset.
    let tweak = |f: &dyn Fn(&mut GgufWriter)| {
        let mut w = GgufWriter::new();
        w.str("general.architecture", "llama");
        w.tensor_f32("a.weight", &[4], &[1.0, 2.0, 3.0, 4.0]);
        f(&mut w);
        w.to_bytes()
    };
    let b = tweak(&|_| {});
    assert!(GgufFile::from_bytes("ok.gguf", b.clone()).is_ok());
    let info = b.windows(8).position(|x| x == b"a.weight").unwrap() + 8; // after the name
    let ty_pos = info + 4 + 8;
    let off_pos = ty_pos + 4;
    let mut b2 = b.clone();
    b2[ty_pos..ty_pos + 4].copy_from_slice(&77u32.to_le_bytes());
    expect_checkpoint_err(GgufFile::from_bytes("x.gguf", b2), "tensor 'a.weight': unknown ggml type 77");
    let mut b2 = b.clone();
    b2[off_pos..off_pos + 8].copy_from_slice(&(1u64 << 20).to_le_bytes());
    expect_checkpoint_err(GgufFile::from_bytes("x.gguf", b2), "a.weight");
    let mut b2 = b.clone();
    b2[off_pos..off_pos + 8].copy_from_slice(&4u64.to_le_bytes());
    expect_checkpoint_err(GgufFile::from_bytes("x.gguf", b2), "not aligned");
    let mut b2 = b.clone();
    b2[info..info + 4].copy_from_slice(&9u32.to_le_bytes());
    expect_checkpoint_err(GgufFile::from_bytes("x.gguf", b2), "dimensions");

    // general.alignment honoured; bad alignment rejected.
    let mut w = GgufWriter::new();
    w.alignment = 64;
    w.kv("general.alignment", Value::U32(64));
    w.tensor_f32("a.weight", &[3], &[1.0, 2.0, 3.0]);
    w.tensor_f32("b.weight", &[2], &[4.0, 5.0]);
    let g = GgufFile::from_bytes("al.gguf", w.to_bytes()).unwrap();
    assert_eq!(g.alignment, 64);
    assert_eq!(g.data_offset % 64, 0);
    assert_eq!(g.dequantize(g.tensor("b.weight").unwrap()).unwrap(), vec![4.0, 5.0]);
    let mut w = GgufWriter::new();
    w.kv("general.alignment", Value::U32(48));
    expect_checkpoint_err(GgufFile::from_bytes("x.gguf", w.to_bytes()), "general.alignment");
}

#[test]
fn conversion_errors_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    // Unknown architecture.
    let mut m = tiny_model("llama", GgmlType::F16, GgmlType::F16, false);
    for (k, v) in m.writer.metadata.iter_mut() {
        if k == "general.architecture" {
            *v = Value::String("mamba".into());
        }
    }
    let src = write_gguf(dir.path(), "a.gguf", &m.writer);
    let e = convert_gguf(&src, &dir.path().join("o1"), &ConvertOptions::default(), &mut |_| {}).unwrap_err();
    assert!(matches!(e, Error::InvalidCheckpoint { .. }) && e.to_string().contains("mamba"), "{e}");

    // Unknown tensor.
    let mut m = tiny_model("llama", GgmlType::F16, GgmlType::F16, false);
    m.writer.tensor_f32("blk.0.weird.weight", &[4], &[0.0; 4]);
    let src = write_gguf(dir.path(), "b.gguf", &m.writer);
    let e = convert_gguf(&src, &dir.path().join("o2"), &ConvertOptions::default(), &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("blk.0.weird.weight"), "{e}");

    // Missing tensor.
    let mut m = tiny_model("llama", GgmlType::F16, GgmlType::F16, false);
    m.writer.tensors.retain(|t| t.0 != "blk.0.ffn_up.weight");
    let src = write_gguf(dir.path(), "c.gguf", &m.writer);
    let e = convert_gguf(&src, &dir.path().join("o3"), &ConvertOptions::default(), &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("mlp.up_proj"), "{e}");

    // Wrong shape.
    let mut m = tiny_model("llama", GgmlType::F32, GgmlType::F32, false);
    for t in m.writer.tensors.iter_mut() {
        if t.0 == "blk.0.attn_k.weight" {
            t.1 = vec![HIDDEN as u64 / 2, (KV_HEADS * HEAD_DIM * 2) as u64];
        }
    }
    let src = write_gguf(dir.path(), "d.gguf", &m.writer);
    let e = convert_gguf(&src, &dir.path().join("o4"), &ConvertOptions::default(), &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("blk.0.attn_k.weight"), "{e}");

    // Bad options.
    let opts = ConvertOptions { q_bits: Some(7), ..Default::default() };
    let e = convert_gguf(&src, &dir.path().join("o5"), &opts, &mut |_| {}).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)));

    // Not a file.
    let e = convert_gguf(&dir.path().join("nope.gguf"), &dir.path().join("o6"), &ConvertOptions::default(), &mut |_| {})
        .unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
}

/// The MLX bits and group a converted module got, from config.json's quantization block
/// (its per-module override or the default); None when the module is float.
fn module_quant(cfg: &serde_json::Value, module: &str) -> Option<(u32, u32)> {
    let q = cfg.get("quantization")?;
    let e = q.get(module).unwrap_or(q);
    if e == &serde_json::Value::Bool(false) {
        return None;
    }
    Some((e["bits"].as_u64()? as u32, e["group_size"].as_u64()? as u32))
}

/// The MLX dequantization of converted module `m` (bits from config.json), with its scales.
/// Values, (scales, biases), bits, group size.
type Dequantized = (Vec<f32>, (Vec<f32>, Vec<f32>), u32, u32);

fn dequant_module(st: &std::collections::HashMap<String, StTensor>, cfg: &serde_json::Value, m: &str) -> Dequantized {
    let (bits, group) = module_quant(cfg, m).unwrap_or_else(|| panic!("{m} is not quantized"));
    let (w, s, b) = (&st[&format!("{m}.weight")], &st[&format!("{m}.scales")], &st[&format!("{m}.biases")]);
    let cols = *w.shape.last().unwrap() as usize * 32 / bits as usize;
    assert_eq!(*s.shape.last().unwrap() as usize, cols / group as usize, "{m}: scales do not match group {group}");
    (mlx_dequantize(w, s, b, bits), (s.f32s(), b.f32s()), bits, group)
}

/// Default conversion: every weight gets the MLX quantization nearest to its GGUF type; exact
/// types repack bit for bit, Q6_K/Q3_K/Q2_K re-quantize within one step of the new grid; the
/// GGUF's mix is in config.json's per-module overrides.
#[test]
fn kquant_default_is_native_quantization() {
    let cases = [
        (GgmlType::Q4_K, 4, true),
        (GgmlType::Q5_K, 5, true),
        (GgmlType::Q5_0, 5, true),
        (GgmlType::Q5_1, 5, true),
        (GgmlType::Q4_0, 4, true),
        (GgmlType::Q4_1, 4, true),
        (GgmlType::Q8_0, 8, true),
        (GgmlType::Q6_K, 6, false),
        (GgmlType::Q3_K, 3, false),
        (GgmlType::Q2_K, 3, false),
    ];
    for (wty, bits, exact) in cases {
        let dir = tempfile::tempdir().unwrap();
        // Embedding Q6_K, output Q8_0 like a real K-quant mix; the projections `wty`.
        let mut m = tiny_model("qwen2", wty, GgmlType::Q6_K, true);
        let mut rng = Rng(7);
        for t in m.writer.tensors.iter_mut() {
            if t.0 == "output.weight" {
                t.2 = GgmlType::Q8_0;
                t.3 = enc_q8_0(&rng.vec(m.vocab * HIDDEN, 0.05));
            }
        }
        let src = write_gguf(dir.path(), "tiny.gguf", &m.writer);
        let g = GgufFile::open(&src).unwrap();
        let out = dir.path().join("out");
        let sum = convert_gguf(&src, &out, &ConvertOptions::default(), &mut |_| {}).unwrap();
        let cfg = read_json(&out.join("config.json"));
        let st = read_safetensors(&out.join("model.safetensors"));
        assert_eq!(sum.float_tensors, 6, "{wty}: only norms and biases stay float");
        let n_exact = 1 + if exact { 7 } else { 0 }; // output (Q8_0) + the projections
        assert_eq!((sum.lossless, sum.requantized), (n_exact, 9 - n_exact), "{wty}");
        let q = &cfg["quantization"];
        assert_eq!((q["bits"].as_u64().unwrap() as u32, q["group_size"].as_u64().unwrap()), (bits, 32), "{wty}: the majority");
        assert_eq!(q["mode"], "affine");
        assert_eq!(module_quant(&cfg, "model.embed_tokens"), Some((6, 32)), "{wty}");
        assert_eq!(module_quant(&cfg, "lm_head"), Some((8, 32)), "{wty}");
        assert_eq!(cfg["quantization_config"], cfg["quantization"]);
        for (gguf_name, module) in [
            ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj"),
            ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj"),
            ("token_embd.weight", "model.embed_tokens"),
            ("output.weight", "lm_head"),
        ] {
            let t = g.tensor(gguf_name).unwrap();
            let want = g.dequantize(t).unwrap();
            let (got, scales, b, group) = dequant_module(&st, &cfg, module);
            assert_eq!(st[&format!("{module}.weight")].shape[0], t.shape()[0]);
            let tensor_exact = affine::lossless_bits(t.ty).is_some();
            let expect_exact = match module {
                "lm_head" => true,             // Q8_0
                "model.embed_tokens" => false, // Q6_K
                _ => exact,
            };
            assert_eq!(tensor_exact, expect_exact, "{wty} {module}");
            if tensor_exact {
                assert_eq!(b, affine::lossless_bits(t.ty).unwrap());
                for (i, (a, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(a, w, "{wty} {module} element {i}: MLX {a} vs GGUF {w}");
                }
            } else {
                assert_eq!(b, affine::native_bits(t.ty).unwrap().0);
                let (scales, biases) = scales;
                for (i, (a, w)) in got.iter().zip(&want).enumerate() {
                    let (step, bias) = (scales[i / group as usize].abs(), biases[i / group as usize].abs());
                    // MLX makes the larger-magnitude edge exact; elsewhere half a step, and the other
                    // edge may clip by up to one step; the f16 scale and bias add their rounding
                    // (2^-11 relative, times up to 63 levels for the scale).
                    let tol = step * (1.0 + 64.0 / 2048.0) + bias / 2048.0 + 1e-7;
                    assert!((a - w).abs() <= tol, "{wty} {module} element {i}: {a} vs {w} (step {step})");
                }
            }
        }
    }
}

/// Q4_K / Q5_K / Q5_0 / Q5_1 blocks repack into MLX affine g32 exactly, element for element, and
/// the K-quant scales d·sc are exact in f32 (not, in general, in f16).
#[test]
fn kquant_lossless_repack_is_exact() {
    let mut rng = Rng(4242);
    for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q5_0, GgmlType::Q5_1] {
        let n = 256 * 16;
        let data = random_blocks_d(ty, n, &mut rng, 0.05);
        let mut want = vec![0f32; n];
        mlex::gguf::quants::dequantize_row(ty, &data, &mut want).unwrap();
        let (mut p, mut s, mut b) = (Vec::new(), Vec::new(), Vec::new());
        affine::repack_lossless_row(ty, &data, &mut p, &mut s, &mut b);
        let bits = affine::lossless_bits(ty).unwrap();
        assert_eq!(p.len(), n * bits as usize / 8);
        assert_eq!(s.len(), n / 32);
        let q = affine::unpack(&p, bits, n);
        for i in 0..n {
            let got = s[i / 32] * q[i] as f32 + b[i / 32];
            assert_eq!(got, want[i], "{ty} element {i}: {got} vs {}", want[i]);
        }
        if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K) {
            assert!(!affine::lossless_fits_f16(ty, &data), "{ty}: random d·sc should need f32");
        }
    }
}

/// Q2_K → 3 bits: re-quantizing Q2_K's values at 3 bits (group 32) stays well within Q2_K's own
/// step, where 2 bits would not; the figures are printed for the record.
#[test]
fn q2_k_requantizes_to_three_bits() {
    let mut rng = Rng(99);
    let n = 256 * 64;
    let data = random_blocks_d(GgmlType::Q2_K, n, &mut rng, 0.05);
    let mut vals = vec![0f32; n];
    mlex::gguf::quants::dequantize_row(GgmlType::Q2_K, &data, &mut vals).unwrap();
    let rms_for = |bits: u32| {
        let (mut p, mut s, mut b) = (Vec::new(), Vec::new(), Vec::new());
        affine::quantize_row(&vals, bits, 32, &mut p, &mut s, &mut b);
        let q = affine::unpack(&p, bits, n);
        let se: f64 = (0..n).map(|i| ((s[i / 32] * q[i] as f32 + b[i / 32]) - vals[i]) as f64).map(|e| e * e).sum();
        (se / n as f64).sqrt()
    };
    // Q2_K's own step: d·sc per sub-block of 16 (its error against the original weights is ~step/√12).
    let steps: f64 = data
        .chunks_exact(84)
        .flat_map(|b| {
            let d = half::f16::from_le_bytes([b[80], b[81]]).to_f32().abs() as f64;
            b[0..16].iter().map(move |sc| d * (sc & 0x0F) as f64).collect::<Vec<_>>()
        })
        .sum::<f64>()
        / (n / 16) as f64;
    let (e2, e3) = (rms_for(2), rms_for(3));
    eprintln!("Q2_K re-quantized at g32: rms error 2-bit {e2:.5}, 3-bit {e3:.5}; Q2_K's mean step {steps:.5}");
    assert!(e3 < e2 / 2.0, "3 bits {e3} vs 2 bits {e2}");
    assert!(e3 < steps / 3.46, "3-bit error {e3} exceeds Q2_K's own rms error for its step {steps}");
}

/// --q-bits overrides the native default for K-quants (legacy set stays lossless); --float gives
/// floats; both together are rejected.
#[test]
fn q_bits_and_float_override_native() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model("qwen2", GgmlType::Q4_K, GgmlType::Q8_0, false);
    let src = write_gguf(dir.path(), "tiny.gguf", &m.writer);
    let out = dir.path().join("q6");
    let opts = ConvertOptions { q_bits: Some(6), q_group_size: 64, ..Default::default() };
    let sum = convert_gguf(&src, &out, &opts, &mut |_| {}).unwrap();
    assert_eq!((sum.lossless, sum.requantized), (1, 7));
    let cfg = read_json(&out.join("config.json"));
    assert_eq!(module_quant(&cfg, "model.layers.0.mlp.up_proj"), Some((6, 64)));
    assert_eq!(module_quant(&cfg, "model.embed_tokens"), Some((8, 32)));

    let out = dir.path().join("f");
    let sum = convert_gguf(&src, &out, &ConvertOptions { float: true, ..Default::default() }, &mut |_| {}).unwrap();
    assert_eq!((sum.lossless, sum.requantized), (1, 0));
    let cfg = read_json(&out.join("config.json"));
    assert_eq!(cfg["quantization"]["model.layers.0.mlp.up_proj"], false);

    let opts = ConvertOptions { q_bits: Some(4), float: true, ..Default::default() };
    let e = convert_gguf(&src, &dir.path().join("x"), &opts, &mut |_| {}).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
}

/// The oracle's python (mlx-lm), as tests/common/mod.rs finds it: `$MLEX_ORACLE_VENV` or
/// `.venv-oracle`. None (skip) when absent, except in CI, where it is a failure.
fn oracle_python(test: &str) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = std::env::var_os("MLEX_ORACLE_VENV")
        .filter(|v| !v.is_empty())
        .map(|v| root.join(v))
        .unwrap_or_else(|| root.join(".venv-oracle"));
    let py = [venv.join("bin/python"), venv.join("bin/python3")].into_iter().find(|p| p.is_file());
    let ci = std::env::var("CI").map(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false")).unwrap_or(false);
    if py.is_none() {
        assert!(!ci, "{test}: no oracle venv (scripts/setup-oracle.sh); CI is set, so this is a failure");
        skip(&format!("{test} (mlx-lm comparison)"), "no oracle venv (run scripts/setup-oracle.sh or set MLEX_ORACLE_VENV)");
    }
    py
}

/// mlx-lm's greedy tokens and their log probabilities for `ids` on checkpoint `dir`.
fn mlx_lm_greedy(py: &Path, dir: &Path, ids: &[u32], n: usize) -> (Vec<u32>, Vec<f32>) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gguf/generate_ids.py");
    let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    let out = std::process::Command::new(py).arg(script).arg(dir).arg(ids.join(",")).arg(n.to_string()).output().unwrap();
    assert!(out.status.success(), "mlx-lm failed on {}:\n{}", dir.display(), String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let toks = v["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
    let lps = v["logprobs"].as_array().unwrap().iter().map(|t| t.as_f64().unwrap() as f32).collect();
    (toks, lps)
}

/// qwen3, qwen3moe and gemma3: a tiny K-quant GGUF converts (native quantization, the
/// architecture's own config fields and tensor names), loads in mlex and generates; with the
/// oracle, mlx-lm loads the same directory and picks the same greedy tokens.
#[test]
fn convert_new_archs_load_and_generate() {
    let oracle = oracle_python("convert_new_archs_load_and_generate");
    for (arch, model_type) in [("qwen3", "qwen3"), ("qwen3moe", "qwen3_moe"), ("gemma3", "gemma3_text")] {
        let dir = tempfile::tempdir().unwrap();
        let m = tiny_model_layers(arch, GgmlType::Q4_K, GgmlType::Q8_0, arch == "qwen3moe", 2);
        let src = write_gguf(dir.path(), "tiny.gguf", &m.writer);
        let g = GgufFile::open(&src).unwrap();
        let out = dir.path().join("out");
        let sum = convert_gguf(&src, &out, &ConvertOptions::default(), &mut |_| {}).unwrap();
        assert_eq!(sum.architecture, arch);
        let cfg = read_json(&out.join("config.json"));
        let st = read_safetensors(&out.join("model.safetensors"));
        assert_eq!(cfg["model_type"], model_type);
        assert_eq!(cfg["head_dim"], HEAD_DIM);
        assert_eq!(cfg["num_hidden_layers"], 2);
        assert_eq!(cfg["quantization"]["bits"], 4, "{arch}");
        assert_eq!(cfg["quantization"]["group_size"], 32, "{arch}");
        assert_eq!(module_quant(&cfg, "model.embed_tokens"), Some((8, 32)), "{arch}");
        for l in 0..2 {
            for n in ["q_norm", "k_norm"] {
                assert_eq!(st[&format!("model.layers.{l}.self_attn.{n}.weight")].shape, vec![HEAD_DIM as u64], "{arch}");
            }
        }
        // q/k are not permuted for these architectures.
        let (q, ..) = dequant_module(&st, &cfg, "model.layers.0.self_attn.q_proj");
        assert_eq!(q, g.dequantize(g.tensor("blk.0.attn_q.weight").unwrap()).unwrap(), "{arch}");
        match arch {
            "qwen3" => {
                assert_eq!(cfg["tie_word_embeddings"], true);
                assert_eq!(cfg["intermediate_size"], FFN);
                assert!(!st.contains_key("lm_head.weight"));
            }
            "qwen3moe" => {
                assert_eq!(cfg["tie_word_embeddings"], false);
                assert_eq!(cfg["num_experts"], EXPERTS);
                assert_eq!(cfg["num_experts_per_tok"], EXPERTS_USED);
                assert_eq!(cfg["moe_intermediate_size"], EXPERT_FF);
                assert_eq!(cfg["norm_topk_prob"], true);
                assert_eq!(cfg["decoder_sparse_step"], 1);
                assert_eq!(cfg["mlp_only_layers"], serde_json::json!([]));
                // Stacked experts: [experts, rows, cols] quantized along cols, exact for Q4_K.
                for (gg, mm, rows, cols) in [
                    ("ffn_gate_exps", "gate_proj", EXPERT_FF, HIDDEN),
                    ("ffn_up_exps", "up_proj", EXPERT_FF, HIDDEN),
                    ("ffn_down_exps", "down_proj", HIDDEN, EXPERT_FF),
                ] {
                    let module = format!("model.layers.1.mlp.switch_mlp.{mm}");
                    let w = &st[&format!("{module}.weight")];
                    assert_eq!(w.shape, vec![EXPERTS as u64, rows as u64, (cols / 8) as u64]);
                    assert_eq!(st[&format!("{module}.scales")].shape, vec![EXPERTS as u64, rows as u64, (cols / 32) as u64]);
                    let (got, ..) = dequant_module(&st, &cfg, &module);
                    assert_eq!(got, g.dequantize(g.tensor(&format!("blk.1.{gg}.weight")).unwrap()).unwrap(), "{module}");
                }
                // The router stays float (F32 in the GGUF).
                assert_eq!(st["model.layers.0.mlp.gate.weight"].shape, vec![EXPERTS as u64, HIDDEN as u64]);
                assert_eq!(cfg["quantization"]["model.layers.0.mlp.gate"], false);
            }
            "gemma3" => {
                assert_eq!(cfg["sliding_window"], 16);
                assert_eq!(cfg["sliding_window_pattern"], 2);
                assert_eq!(cfg["rope_local_base_freq"].as_f64(), Some(10000.0));
                assert_eq!(cfg["rope_theta"].as_f64(), Some(10000.0));
                assert_eq!(cfg["query_pre_attn_scalar"].as_f64(), Some(HEAD_DIM as f64));
                assert_eq!(cfg["hidden_activation"], "gelu_pytorch_tanh");
                // Every norm loses the +1 llama.cpp folded in.
                for (gg, mm) in [
                    ("blk.1.attn_norm", "model.layers.1.input_layernorm"),
                    ("blk.1.post_attention_norm", "model.layers.1.post_attention_layernorm"),
                    ("blk.1.ffn_norm", "model.layers.1.pre_feedforward_layernorm"),
                    ("blk.1.post_ffw_norm", "model.layers.1.post_feedforward_layernorm"),
                    ("blk.1.attn_q_norm", "model.layers.1.self_attn.q_norm"),
                    ("blk.1.attn_k_norm", "model.layers.1.self_attn.k_norm"),
                    ("output_norm", "model.norm"),
                ] {
                    let want: Vec<f32> =
                        g.dequantize(g.tensor(&format!("{gg}.weight")).unwrap()).unwrap().iter().map(|v| v - 1.0).collect();
                    assert_eq!(st[&format!("{mm}.weight")].f32s(), want, "{mm}");
                }
            }
            _ => unreachable!(),
        }

        let s = mlex::Session::load(&out).unwrap_or_else(|e| panic!("{arch}: {e}"));
        let prompt = [5u32, 17, 42, 100, 7];
        let opts = mlex::GenerateOptions { max_tokens: 6, ignore_eos: true, ..Default::default() };
        let reply = s.generate_tokens(&prompt, opts, |_| true).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert_eq!(reply.tokens.len(), 6, "{arch}");
        assert!(reply.logprobs.iter().all(|l| l.is_finite()), "{arch}: {:?}", reply.logprobs);
        if let Some(py) = &oracle {
            let (toks, lps) = mlx_lm_greedy(py, &out, &prompt, 6);
            // Same tokens with the same log probabilities, up to a near-tie (random tiny models
            // have flat distributions): after one, the two continuations may differ.
            for i in 0..toks.len() {
                let (a, b) = (reply.logprobs[i], lps[i]);
                assert!((a - b).abs() < 0.02, "{arch} step {i}: logprob {a} vs mlx-lm {b} ({:?} vs {toks:?})", reply.tokens);
                if reply.tokens[i] != toks[i] {
                    eprintln!("{arch}: near-tie at step {i} ({} vs {}, logprob {a} vs {b})", reply.tokens[i], toks[i]);
                    break;
                }
            }
        }
    }
}

/// Bad input for the new architectures names the tensor: a missing one, a wrong shape, an
/// unsupported type, a fused projection.
#[test]
fn new_arch_errors_name_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let conv = |w: &GgufWriter, name: &str| {
        let src = write_gguf(dir.path(), &format!("{name}.gguf"), w);
        convert_gguf(&src, &dir.path().join(name), &ConvertOptions::default(), &mut |_| {}).unwrap_err().to_string()
    };
    // Missing: gemma3's post-feedforward norm, qwen3's k norm, qwen3moe's router.
    for (arch, gone, hf) in [
        ("gemma3", "blk.0.post_ffw_norm.weight", "post_feedforward_layernorm"),
        ("qwen3", "blk.0.attn_k_norm.weight", "self_attn.k_norm"),
        ("qwen3moe", "blk.0.ffn_gate_inp.weight", "mlp.gate"),
    ] {
        let mut m = tiny_model(arch, GgmlType::Q4_K, GgmlType::Q8_0, false);
        m.writer.tensors.retain(|t| t.0 != gone);
        let e = conv(&m.writer, &format!("miss-{arch}"));
        assert!(e.contains(gone) && e.contains(hf), "{e}");
    }
    // Wrong shape of a stacked expert tensor (3 experts instead of 4).
    let mut m = tiny_model("qwen3moe", GgmlType::Q4_K, GgmlType::Q8_0, false);
    for t in m.writer.tensors.iter_mut() {
        if t.0 == "blk.0.ffn_up_exps.weight" {
            t.1[2] = 3;
            t.3.truncate(t.3.len() / 4 * 3);
        }
    }
    let e = conv(&m.writer, "shape");
    assert!(e.contains("blk.0.ffn_up_exps.weight") && e.contains("[3, 256, 256]"), "{e}");
    // A type the converter cannot decode.
    let mut m = tiny_model("gemma3", GgmlType::Q4_K, GgmlType::Q8_0, false);
    for t in m.writer.tensors.iter_mut() {
        if t.0 == "blk.0.ffn_gate.weight" {
            t.2 = GgmlType::IQ2_XXS;
            t.3 = vec![0u8; FFN * HIDDEN / 256 * GgmlType::IQ2_XXS.type_size()];
        }
    }
    let e = conv(&m.writer, "type");
    assert!(e.contains("blk.0.ffn_gate.weight") && e.contains("IQ2_XXS"), "{e}");
    // A fused QKV projection (llama.cpp's optional fusion).
    let mut m = tiny_model("qwen3", GgmlType::F16, GgmlType::F16, false);
    m.writer.tensor_f32("blk.0.attn_qkv.weight", &[4, 4], &[0.0; 16]);
    let e = conv(&m.writer, "fused");
    assert!(e.contains("blk.0.attn_qkv.weight") && e.contains("fused"), "{e}");
    // A tensor of another architecture (q norm in a llama).
    let mut m = tiny_model("llama", GgmlType::F16, GgmlType::F16, false);
    m.writer.tensor_f32("blk.0.attn_q_norm.weight", &[HEAD_DIM as u64], &[1.0; HEAD_DIM]);
    let e = conv(&m.writer, "foreign");
    assert!(e.contains("blk.0.attn_q_norm.weight"), "{e}");
}

fn smollm2_path() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("MLEX_SMOLLM2_GGUF") {
        return Some(PathBuf::from(p));
    }
    let cache = std::env::var("MLEX_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| PathBuf::from(h).join(".cache/mlex")))
        .ok()?;
    let p = cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    p.exists().then_some(p)
}

/// Real weights: SmolLM2-135M-Instruct Q4_1 (scripts/fetch-smollm2.sh puts it in the cache).
#[test]
fn convert_real_smollm2() {
    let Some(src) = smollm2_path() else {
        skip_unless_ci("convert_real_smollm2", "SmolLM2 GGUF not found (run scripts/fetch-smollm2.sh)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("smollm2");
    let sum = convert_gguf(&src, &out, &ConvertOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(sum.architecture, "llama");
    assert!(sum.tie_word_embeddings);
    assert_eq!(sum.lossless, 30 * 7 + 1);
    assert_eq!(sum.requantized, 0);
    let cfg = read_json(&out.join("config.json"));
    assert_eq!(cfg["num_hidden_layers"], 30);
    assert_eq!(cfg["hidden_size"], 576);
    assert_eq!(cfg["num_key_value_heads"], 3);
    assert_eq!(cfg["quantization"]["bits"], 4);
    assert_eq!(cfg["quantization"]["model.embed_tokens"]["bits"], 8);
    let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    let s = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n";
    let enc = tok.encode(s, false).unwrap();
    assert_eq!(enc.get_ids()[0], 1);
    assert_eq!(tok.decode(enc.get_ids(), false).unwrap(), s);
    let st = read_safetensors(&out.join("model.safetensors"));
    assert_eq!(st["model.embed_tokens.weight"].shape, vec![49152, 576 / 4]);
}

/// Real SmolLM2 with 8-bit activations (LoadOptions::int8_activations, src/mlx/cpu_matvec_vnni.h)
/// follows the float32 run: the same first greedy tokens of a chat answer, each logprob within
/// 0.3 nats (scripts/int8-agreement.py measures where longer runs part: at near-ties). On a CPU
/// with AVX-512 VNNI the logprobs must differ (the integer path ran); elsewhere they are equal.
#[test]
fn real_smollm2_with_int8_activations_follows_the_float_run() {
    let Some(src) = smollm2_path() else {
        skip_unless_ci("real_smollm2_with_int8_activations_follows_the_float_run", "SmolLM2 GGUF not found (run scripts/fetch-smollm2.sh)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("smollm2");
    convert_gguf(&src, &out, &ConvertOptions::default(), &mut |_| {}).unwrap();
    let messages = [mlex::ChatMessage::user("Explain in three sentences why the sky is blue.")];
    let run = |int8: bool| {
        let load = mlex::LoadOptions { device: Some(mlex::mlx::Device::Cpu), int8_activations: int8, ..Default::default() };
        let s = mlex::Session::load_with_options(&out, load).unwrap();
        let vnni = std::arch::is_x86_feature_detected!("avx512vnni") && std::env::var_os("MLEX_CPU_NO_AVX512").is_none();
        assert_eq!(s.info().int8_activations, int8 && vnni);
        let opts = mlex::GenerateOptions { max_tokens: 12, ignore_eos: true, ..Default::default() };
        s.generate(&messages, opts).unwrap()
    };
    let (float, int8) = (run(false), run(true));
    assert_eq!(int8.tokens[..8], float.tokens[..8], "{:?} vs {:?}", int8.text, float.text);
    for (i, (a, b)) in int8.logprobs.iter().zip(&float.logprobs).take(8).enumerate() {
        assert!((a - b).abs() < 0.3, "token {i}: logprob {a} vs {b}");
    }
    let vnni = std::arch::is_x86_feature_detected!("avx512vnni") && std::env::var_os("MLEX_CPU_NO_AVX512").is_none();
    assert_eq!(int8.logprobs != float.logprobs, vnni, "the integer path ran exactly where the CPU has VNNI");
}

fn gemma3_path() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("MLEX_GEMMA3_GGUF") {
        return Some(PathBuf::from(p));
    }
    let cache = std::env::var("MLEX_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| PathBuf::from(h).join(".cache/mlex")))
        .ok()?;
    let p = cache.join("models/gemma-3-270m-q4_k_m.gguf");
    p.exists().then_some(p)
}

/// Real weights: Gemma-3-270M base, Q4_K_M (scripts/fetch-gemma3-270m.sh puts it in the cache):
/// the gemma3 config, the GGUF's own K-quant mix as MLX quantization, the tokenizer against the
/// real Hugging Face one (tests/tokenizer_real's assets), and a sensible continuation in mlex.
#[test]
fn convert_real_gemma3() {
    let Some(src) = gemma3_path() else {
        skip_unless_ci("convert_real_gemma3", "Gemma-3-270M GGUF not found (run scripts/fetch-gemma3-270m.sh)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gemma3");
    let sum = convert_gguf(&src, &out, &ConvertOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(sum.architecture, "gemma3");
    assert!(sum.tie_word_embeddings);
    // Q5_0 ×81 (rows of 640 cannot hold 256-blocks), Q4_K ×27, Q8_0 ×10 exact; Q6_K ×9 re-quantized.
    assert_eq!((sum.lossless, sum.requantized), (118, 9));
    let want: std::collections::BTreeMap<(u8, u32), usize> = [((4, 32), 27), ((5, 32), 81), ((6, 32), 9), ((8, 32), 10)].into();
    assert_eq!(sum.quantized, want);
    let cfg = read_json(&out.join("config.json"));
    assert_eq!(cfg["model_type"], "gemma3_text");
    assert_eq!(cfg["num_hidden_layers"], 18);
    assert_eq!(cfg["hidden_size"], 640);
    assert_eq!(cfg["head_dim"], 256);
    assert_eq!(cfg["num_key_value_heads"], 1);
    assert_eq!(cfg["sliding_window"], 512);
    assert_eq!(cfg["sliding_window_pattern"], 6);
    assert_eq!(cfg["query_pre_attn_scalar"], 256);
    assert_eq!(cfg["rope_local_base_freq"].as_f64(), Some(10000.0));
    assert_eq!(cfg["rope_theta"].as_f64(), Some(1_000_000.0));
    assert_eq!(cfg["quantization"]["bits"], 5);
    assert_eq!(cfg["quantization"]["model.embed_tokens"], serde_json::json!({"group_size": 32, "bits": 8}));

    let assets = std::env::var("MLEX_TEST_ASSETS").map(PathBuf::from).unwrap_or_else(|_| {
        std::env::var("MLEX_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/mlex"))
            .join("test-assets")
    });
    let reference = assets.join("gemma3/tokenizer.json");
    if reference.exists() {
        let ours = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
        let theirs = tokenizers::Tokenizer::from_file(&reference).unwrap();
        for s in [
            "The capital of France is",
            "  leading and trailing spaces  ",
            "numbers 1234567 and 3.14159, ünïcödé — 中文字符 😀👍🏽",
            "code:\n\tdef f(x):\n\t\treturn x**2  # square\n",
            "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
        ] {
            let a = ours.encode(s, true).unwrap();
            let b = theirs.encode(s, true).unwrap();
            assert_eq!(a.get_ids(), b.get_ids(), "{s:?}");
        }
    } else {
        skip_unless_ci("convert_real_gemma3 (tokenizer comparison)", &format!("{} not found (scripts/fetch-test-assets.sh)", reference.display()));
    }

    let s = mlex::Session::load(&out).unwrap();
    let opts = mlex::GenerateOptions { max_tokens: 16, ..Default::default() };
    let reply = s.generate_text("The capital of France is", opts, |_| true).unwrap();
    eprintln!("gemma-3-270m: The capital of France is{}", reply.text);
    assert!(reply.text.contains("France") || reply.text.contains("Paris"), "{:?}", reply.text);
}

/// llama.cpp's tokenizer test vectors (vocab-only GGUFs + inputs + HF-produced ids), shipped in the
/// llama-cpp-python sdist under vendor/llama.cpp/models/. Point `MLEX_GGML_VOCAB_DIR` at that
/// folder (`tar xzf llama_cpp_python-0.3.36.tar.gz --wildcards '*/models/ggml-vocab-*'`).
#[test]
fn tokenizer_matches_llama_cpp_vocab_tests() {
    let Ok(dir) = std::env::var("MLEX_GGML_VOCAB_DIR") else {
        skip("tokenizer_matches_llama_cpp_vocab_tests", "MLEX_GGML_VOCAB_DIR not set (llama.cpp's vocab test files)");
        return;
    };
    let dir = PathBuf::from(dir);
    let names = std::env::var("MLEX_GGML_VOCABS")
        .unwrap_or_else(|_| "gpt-2,llama-bpe,llama-spm,qwen2,starcoder,refact,phi-3,mpt,command-r".into());
    let tmp = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for name in names.split(',') {
        let gguf = dir.join(format!("ggml-vocab-{name}.gguf"));
        let g = GgufFile::open(&gguf).unwrap();
        let vocab = mlex::convert::tokenizer::Vocab::read(&g).unwrap().unwrap();
        let mut warnings = Vec::new();
        let tj = vocab.tokenizer_json(&g, &mut warnings).unwrap();
        let p = tmp.path().join(format!("{name}.json"));
        std::fs::write(&p, serde_json::to_vec(&tj).unwrap()).unwrap();
        let tok = tokenizers::Tokenizer::from_file(&p).unwrap();
        let inp = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.inp"))).unwrap();
        let out = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.out"))).unwrap();
        let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
        let expected: Vec<Vec<u32>> =
            out.lines().map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect()).collect();
        let (mut ok, mut n) = (0, 0);
        for (t, want) in texts.iter().zip(&expected) {
            n += 1;
            let got = tok.encode(*t, false).unwrap().get_ids().to_vec();
            if &got == want {
                ok += 1;
            } else if failures.len() < 40 {
                failures.push(format!("{name}: {t:?}\n   ours {got:?}\n   want {want:?}"));
            }
        }
        eprintln!("{name}: {ok}/{n} identical {warnings:?}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
