//! Helpers for the GGUF tests: tiny block encoders, a synthetic model builder, a safetensors reader.
#![allow(dead_code)]
use std::collections::HashMap;
use std::path::Path;

use half::f16;
use mlex::gguf::writer::GgufWriter;
use mlex::gguf::{GgmlType, Value, ValueType};

/// Deterministic pseudo-random numbers (xorshift), no extra crates.
pub struct Rng(pub u64);
impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_bits().to_le_bytes()
}

/// Encode f32 values (length multiple of 32) as Q4_0 blocks.
pub fn enc_q4_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks_exact(32) {
        let amax = b.iter().copied().fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
        let d = amax / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16_bytes(d));
        let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
        for j in 0..16 {
            out.push(q(b[j]) | (q(b[j + 16]) << 4));
        }
    }
    out
}

/// Encode as Q4_1 blocks.
pub fn enc_q4_1(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks_exact(32) {
        let mn = b.iter().copied().fold(f32::INFINITY, f32::min);
        let mx = b.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let d = (mx - mn) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16_bytes(d));
        out.extend_from_slice(&f16_bytes(mn));
        let q = |v: f32| (((v - mn) * id + 0.5) as i32).clamp(0, 15) as u8;
        for j in 0..16 {
            out.push(q(b[j]) | (q(b[j + 16]) << 4));
        }
    }
    out
}

/// Encode as Q8_0 blocks.
pub fn enc_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks_exact(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16_bytes(d));
        for &v in b {
            out.push(((v * id).round() as i32).clamp(-127, 127) as i8 as u8);
        }
    }
    out
}

pub fn enc_f16(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| f16_bytes(*v)).collect()
}

pub fn enc_f32(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Random K-quant (or other) blocks with sane f16 scale fields.
pub fn random_blocks(ty: GgmlType, n_elems: usize, rng: &mut Rng) -> Vec<u8> {
    random_blocks_d(ty, n_elems, rng, 0.01)
}

/// Random blocks whose f16 super-scales (d, dmin) are uniform in ±`d_scale`.
pub fn random_blocks_d(ty: GgmlType, n_elems: usize, rng: &mut Rng, d_scale: f32) -> Vec<u8> {
    let bs = ty.block_size();
    let ts = ty.type_size();
    let fields: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[],
    };
    let mut out = Vec::new();
    for _ in 0..n_elems / bs {
        let mut b = rng.bytes(ts);
        for &f in fields {
            let d = f16_bytes(rng.uniform() * d_scale);
            b[f] = d[0];
            b[f + 1] = d[1];
        }
        out.extend_from_slice(&b);
    }
    out
}

/// llama.cpp's Q/K row permutation (HF order → GGUF order) of a row-major [rows, cols] matrix.
pub fn permute_rows(w: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    let hd = rows / heads;
    let half = hd / 2;
    let mut out = vec![0f32; w.len()];
    for h in 0..heads {
        for t in 0..2 {
            for i in 0..half {
                let src = h * hd + t * half + i; // HF row
                let dst = h * hd + 2 * i + t; // GGUF row
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// GPT-2's byte → unicode table.
pub fn byte_to_unicode() -> Vec<char> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut table = vec![' '; 256];
    for (b, c) in bs.iter().zip(cs) {
        table[*b as usize] = char::from_u32(c).unwrap();
    }
    table
}

/// Shapes of the tiny llama: hidden 256, 4 heads of 64, 2 kv heads, ffn 512, vocab 300.
pub const HIDDEN: usize = 256;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const HEAD_DIM: usize = 64;
pub const FFN: usize = 512;

/// A byte-level BPE vocabulary: 3 specials, 256 bytes, a few merges.
pub fn add_gpt2_vocab(w: &mut GgufWriter, pre: &str) -> usize {
    let table = byte_to_unicode();
    let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<|im_start|>".into(), "<|im_end|>".into()];
    let mut types = vec![3i32, 3, 3];
    for b in 0..256 {
        tokens.push(table[b].to_string());
        types.push(1);
    }
    let merges = ["Ġ t", "h e", "Ġt he", "l l", "he ll", "hell o"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    tokens.push("<tool>".into());
    types.push(4);
    let n = tokens.len();
    w.kv("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.kv("tokenizer.ggml.pre", Value::String(pre.into()));
    w.kv("tokenizer.ggml.tokens", Value::Array(ValueType::String, tokens.into_iter().map(Value::String).collect()));
    w.kv("tokenizer.ggml.token_type", Value::Array(ValueType::I32, types.into_iter().map(Value::I32).collect()));
    w.kv(
        "tokenizer.ggml.merges",
        Value::Array(ValueType::String, merges.iter().map(|m| Value::String(m.to_string())).collect()),
    );
    w.u32("tokenizer.ggml.bos_token_id", 1);
    w.u32("tokenizer.ggml.eos_token_id", 2);
    w.u32("tokenizer.ggml.padding_token_id", 2);
    w.kv("tokenizer.ggml.add_bos_token", Value::Bool(false));
    w.str("tokenizer.chat_template", "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}");
    n
}

pub struct TinyModel {
    pub writer: GgufWriter,
    /// HF-order q_proj of layer 0 (row-major [HEADS*HEAD_DIM, HIDDEN]).
    pub q_hf: Vec<f32>,
    pub k_hf: Vec<f32>,
    pub vocab: usize,
}

/// Experts of the tiny qwen3moe, experts used per token, rows of each expert.
pub const EXPERTS: usize = 4;
pub const EXPERTS_USED: usize = 2;
pub const EXPERT_FF: usize = 256;

/// A one-layer llama (or qwen2) GGUF. `wty` is the type of the projection weights
/// (F32, F16, Q4_0, Q4_1, Q8_0 from real values; K-quants from random blocks).
pub fn tiny_model(arch: &str, wty: GgmlType, embd_ty: GgmlType, with_output: bool) -> TinyModel {
    tiny_model_layers(arch, wty, embd_ty, with_output, 1)
}

/// [`tiny_model`] with `n_layers` layers, for llama, qwen2, qwen3, qwen3moe (EXPERTS experts of
/// EXPERT_FF rows, an F32 router) and gemma3 (sliding window 16, every 2nd layer global).
pub fn tiny_model_layers(arch: &str, wty: GgmlType, embd_ty: GgmlType, with_output: bool, n_layers: usize) -> TinyModel {
    let mut rng = Rng(0x5eed_1234_abcd);
    let mut w = GgufWriter::new();
    w.str("general.architecture", arch);
    w.u32(&format!("{arch}.block_count"), n_layers as u32);
    w.u32(&format!("{arch}.context_length"), 1024);
    w.u32(&format!("{arch}.embedding_length"), HIDDEN as u32);
    w.u32(&format!("{arch}.feed_forward_length"), FFN as u32);
    w.u32(&format!("{arch}.attention.head_count"), HEADS as u32);
    w.u32(&format!("{arch}.attention.head_count_kv"), KV_HEADS as u32);
    w.f32(&format!("{arch}.rope.freq_base"), 10000.0);
    w.f32(&format!("{arch}.attention.layer_norm_rms_epsilon"), 1e-5);
    if matches!(arch, "qwen3" | "qwen3moe" | "gemma3") {
        w.u32(&format!("{arch}.attention.key_length"), HEAD_DIM as u32);
        w.u32(&format!("{arch}.attention.value_length"), HEAD_DIM as u32);
    }
    if arch == "qwen3moe" {
        w.u32(&format!("{arch}.expert_count"), EXPERTS as u32);
        w.u32(&format!("{arch}.expert_used_count"), EXPERTS_USED as u32);
        w.u32(&format!("{arch}.expert_feed_forward_length"), EXPERT_FF as u32);
    }
    if arch == "gemma3" {
        w.u32(&format!("{arch}.attention.sliding_window"), 16);
        w.u32(&format!("{arch}.attention.sliding_window_pattern"), 2);
    }
    let vocab = add_gpt2_vocab(&mut w, if arch.starts_with("qwen") { "qwen2" } else { "smollm" });
    w.u32(&format!("{arch}.vocab_size"), vocab as u32);

    let enc = |ty: GgmlType, vals: &[f32], rng: &mut Rng| -> Vec<u8> {
        match ty {
            GgmlType::F32 => enc_f32(vals),
            GgmlType::F16 => enc_f16(vals),
            GgmlType::Q4_0 => enc_q4_0(vals),
            GgmlType::Q4_1 => enc_q4_1(vals),
            GgmlType::Q8_0 => enc_q8_0(vals),
            other => random_blocks_d(other, vals.len(), rng, 0.001),
        }
    };
    let embd = rng.vec(vocab * HIDDEN, 0.05);
    let e = enc(embd_ty, &embd, &mut rng);
    w.tensor("token_embd.weight", &[vocab as u64, HIDDEN as u64], embd_ty, e);
    let (mut q_first, mut k_first) = (Vec::new(), Vec::new());
    for l in 0..n_layers {
        let q_hf = rng.vec(HEADS * HEAD_DIM * HIDDEN, 0.05);
        let k_hf = rng.vec(KV_HEADS * HEAD_DIM * HIDDEN, 0.05);
        let (q_g, k_g) = if arch == "llama" {
            (
                permute_rows(&q_hf, HEADS * HEAD_DIM, HIDDEN, HEADS),
                permute_rows(&k_hf, KV_HEADS * HEAD_DIM, HIDDEN, KV_HEADS),
            )
        } else {
            (q_hf.clone(), k_hf.clone())
        };
        if l == 0 {
            (q_first, k_first) = (q_hf, k_hf);
        }
        let mut mats: Vec<(&str, Vec<u64>, Vec<f32>)> = vec![
            ("attn_q", vec![(HEADS * HEAD_DIM) as u64, HIDDEN as u64], q_g),
            ("attn_k", vec![(KV_HEADS * HEAD_DIM) as u64, HIDDEN as u64], k_g),
            ("attn_v", vec![(KV_HEADS * HEAD_DIM) as u64, HIDDEN as u64], rng.vec(KV_HEADS * HEAD_DIM * HIDDEN, 0.05)),
            ("attn_output", vec![HIDDEN as u64, (HEADS * HEAD_DIM) as u64], rng.vec(HIDDEN * HEADS * HEAD_DIM, 0.05)),
        ];
        if arch == "qwen3moe" {
            let (e, ff, h) = (EXPERTS as u64, EXPERT_FF as u64, HIDDEN as u64);
            mats.push(("ffn_gate_exps", vec![e, ff, h], rng.vec(EXPERTS * EXPERT_FF * HIDDEN, 0.05)));
            mats.push(("ffn_up_exps", vec![e, ff, h], rng.vec(EXPERTS * EXPERT_FF * HIDDEN, 0.05)));
            mats.push(("ffn_down_exps", vec![e, h, ff], rng.vec(EXPERTS * EXPERT_FF * HIDDEN, 0.05)));
        } else {
            mats.push(("ffn_gate", vec![FFN as u64, HIDDEN as u64], rng.vec(FFN * HIDDEN, 0.05)));
            mats.push(("ffn_up", vec![FFN as u64, HIDDEN as u64], rng.vec(FFN * HIDDEN, 0.05)));
            mats.push(("ffn_down", vec![HIDDEN as u64, FFN as u64], rng.vec(HIDDEN * FFN, 0.05)));
        }
        for (n, shape, vals) in mats {
            let data = enc(wty, &vals, &mut rng);
            w.tensor(&format!("blk.{l}.{n}.weight"), &shape, wty, data);
        }
        if arch == "qwen2" {
            w.tensor_f32(&format!("blk.{l}.attn_q.bias"), &[(HEADS * HEAD_DIM) as u64], &rng.vec(HEADS * HEAD_DIM, 0.1));
            w.tensor_f32(&format!("blk.{l}.attn_k.bias"), &[(KV_HEADS * HEAD_DIM) as u64], &rng.vec(KV_HEADS * HEAD_DIM, 0.1));
            w.tensor_f32(&format!("blk.{l}.attn_v.bias"), &[(KV_HEADS * HEAD_DIM) as u64], &rng.vec(KV_HEADS * HEAD_DIM, 0.1));
        }
        if arch == "qwen3moe" {
            // llama.cpp never quantizes the router.
            w.tensor_f32(&format!("blk.{l}.ffn_gate_inp.weight"), &[EXPERTS as u64, HIDDEN as u64], &rng.vec(EXPERTS * HIDDEN, 0.5));
        }
        w.tensor_f32(&format!("blk.{l}.attn_norm.weight"), &[HIDDEN as u64], &rng.vec(HIDDEN, 1.0));
        w.tensor_f32(&format!("blk.{l}.ffn_norm.weight"), &[HIDDEN as u64], &rng.vec(HIDDEN, 1.0));
        if matches!(arch, "qwen3" | "qwen3moe" | "gemma3") {
            w.tensor_f32(&format!("blk.{l}.attn_q_norm.weight"), &[HEAD_DIM as u64], &rng.vec(HEAD_DIM, 1.0));
            w.tensor_f32(&format!("blk.{l}.attn_k_norm.weight"), &[HEAD_DIM as u64], &rng.vec(HEAD_DIM, 1.0));
        }
        if arch == "gemma3" {
            w.tensor_f32(&format!("blk.{l}.post_attention_norm.weight"), &[HIDDEN as u64], &rng.vec(HIDDEN, 1.0));
            w.tensor_f32(&format!("blk.{l}.post_ffw_norm.weight"), &[HIDDEN as u64], &rng.vec(HIDDEN, 1.0));
        }
    }
    w.tensor_f32("output_norm.weight", &[HIDDEN as u64], &rng.vec(HIDDEN, 1.0));
    if with_output {
        let o = rng.vec(vocab * HIDDEN, 0.05);
        let data = enc(wty, &o, &mut rng);
        w.tensor("output.weight", &[vocab as u64, HIDDEN as u64], wty, data);
    }
    TinyModel { writer: w, q_hf: q_first, k_hf: k_first, vocab }
}

/// A parsed safetensors tensor.
pub struct StTensor {
    pub dtype: String,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
}

impl StTensor {
    pub fn f32s(&self) -> Vec<f32> {
        match self.dtype.as_str() {
            "F32" => self.data.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect(),
            "F16" => self.data.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            "BF16" => self
                .data
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            d => panic!("f32s on {d}"),
        }
    }
}

/// Read a safetensors file strictly (aligned header, contiguous ascending offsets).
pub fn read_safetensors(path: &Path) -> HashMap<String, StTensor> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!((8 + n) % 8, 0, "header not 8-byte aligned");
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut spans = Vec::new();
    let mut out = HashMap::new();
    for (k, v) in header.as_object().unwrap() {
        if k == "__metadata__" {
            continue;
        }
        let off: Vec<usize> = v["data_offsets"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        spans.push((off[0], off[1]));
        let shape: Vec<u64> = v["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        let dtype = v["dtype"].as_str().unwrap().to_string();
        let size = match dtype.as_str() {
            "F32" | "U32" => 4,
            "F16" | "BF16" => 2,
            "U8" => 1,
            d => panic!("dtype {d}"),
        };
        assert_eq!(shape.iter().product::<u64>() as usize * size, off[1] - off[0], "{k}: size mismatch");
        out.insert(k.clone(), StTensor { dtype, shape, data: data[off[0]..off[1]].to_vec() });
    }
    spans.sort();
    let mut pos = 0;
    for (a, b) in spans {
        assert_eq!(a, pos, "hole or overlap in data");
        pos = b;
    }
    assert_eq!(pos, data.len(), "trailing bytes");
    out
}

/// Dequantize an MLX affine tensor triple to f32 rows (leading axes flattened into rows).
pub fn mlx_dequantize(w: &StTensor, s: &StTensor, b: &StTensor, bits: u32) -> Vec<f32> {
    let nd = w.shape.len();
    let rows = w.shape[..nd - 1].iter().product::<u64>() as usize;
    let cols = w.shape[nd - 1] as usize * 32 / bits as usize;
    let scales = s.f32s();
    let biases = b.f32s();
    let group = cols / s.shape[nd - 1] as usize;
    let row_bytes = w.data.len() / rows;
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let q = mlex::convert::affine::unpack(&w.data[r * row_bytes..(r + 1) * row_bytes], bits, cols);
        for (c, &qv) in q.iter().enumerate() {
            let gi = r * (cols / group) + c / group;
            out.push(scales[gi] * qv as f32 + biases[gi]);
        }
    }
    out
}
