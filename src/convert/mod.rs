//! GGUF → MLX checkpoint conversion, pure Rust (no MLX needed).
//!
//! Output: an mlx-lm style directory (`config.json` with the `quantization` section and per-module
//! overrides, `model.safetensors`, `tokenizer.json`, `tokenizer_config.json`,
//! `generation_config.json`).
//!
//! Tensor encodings (default): every Linear/Embedding weight gets the MLX affine quantization
//! nearest to its own GGUF type ([`affine::native_bits`]), and the GGUF's per-tensor mix becomes
//! per-module overrides in config.json:
//! - Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q5_K are repacked losslessly into MLX affine groups
//!   of 32 (Q4_0: scale d, bias −8d; Q4_1: d, m; Q5_0: d, −16d; Q8_0: 8-bit, d, −128d; Q4_K/Q5_K:
//!   per sub-block of 32, d·sc, −dmin·m). Scales/biases are f16 where every one is exact in f16,
//!   else f32.
//! - Q6_K → 6 bits, Q3_K → 3, Q2_K → 3, Q8_K → 8: dequantized and re-quantized with MLX's affine
//!   rule at group 32 (their sub-blocks of 16 have no exact group-32 layout).
//! - Float weights (F32/F16/BF16) are written as `float_dtype`.
//!
//! `q_bits` (`--q-bits`) instead re-quantizes everything but Q4_0/Q4_1/Q8_0 (kept lossless) at
//! `q_group_size`; `float` (`--float`) writes those as `float_dtype` (the converter's behaviour
//! before K-quants were mapped).
//! 1-D tensors (norms, biases) stay float: F32/F16/BF16 keep their type, others `float_dtype`.
//! llama's Q/K rows are un-permuted (llama.cpp interleaves the rotary halves); whole rows move,
//! so this works for quantized rows too (groups run along the columns). Stacked expert weights
//! `[experts, rows, cols]` quantize row by row like matrices.
pub mod affine;
pub mod arch;
pub mod safetensors;
pub mod tokenizer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value as Json};

use crate::error::{Error, Result};
use crate::gguf::{GgmlType, GgufFile, TensorInfo};
use arch::{Hparams, Mapped};
use safetensors::{Dtype, Entry, SafetensorsWriter};

/// Float dtype for tensors written unquantized (and for re-quantized scales/biases).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FloatDtype {
    #[default]
    F16,
    BF16,
    F32,
}

impl FloatDtype {
    fn dtype(self) -> Dtype {
        match self {
            FloatDtype::F16 => Dtype::F16,
            FloatDtype::BF16 => Dtype::BF16,
            FloatDtype::F32 => Dtype::F32,
        }
    }
    fn torch_name(self) -> &'static str {
        match self {
            FloatDtype::F16 => "float16",
            FloatDtype::BF16 => "bfloat16",
            FloatDtype::F32 => "float32",
        }
    }
}

impl std::str::FromStr for FloatDtype {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f16" | "float16" | "fp16" => Ok(FloatDtype::F16),
            "bf16" | "bfloat16" => Ok(FloatDtype::BF16),
            "f32" | "float32" | "fp32" => Ok(FloatDtype::F32),
            _ => Err(Error::InvalidArgument(format!("unknown float dtype '{s}' (f16, bf16, f32)"))),
        }
    }
}

/// Conversion options.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    /// Re-quantize every tensor except the Q4_0/Q4_1/Q8_0 repacks (K-quants, Q5_*, floats) to this
    /// many bits (2, 3, 4, 5, 6, 8) at `q_group_size`, overriding the per-tensor default.
    pub q_bits: Option<u8>,
    /// Group size for `q_bits` (32, 64, 128).
    pub q_group_size: u32,
    pub float_dtype: FloatDtype,
    /// Write every tensor except the Q4_0/Q4_1/Q8_0 repacks as `float_dtype` (no lossy step).
    pub float: bool,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions { q_bits: None, q_group_size: 64, float_dtype: FloatDtype::F16, float: false }
    }
}

/// Group size of the default re-quantization of K-quants without an exact layout.
pub const NATIVE_GROUP: u32 = 32;

/// Progress: `done` of `total` source tensors, `tensor` the one just finished.
#[derive(Debug, Clone)]
pub struct ConvertProgress {
    pub done: usize,
    pub total: usize,
    pub tensor: String,
}

/// What a conversion produced.
#[derive(Debug, Clone)]
pub struct ConvertSummary {
    pub architecture: String,
    pub out_dir: PathBuf,
    pub files: Vec<PathBuf>,
    /// Tensors in model.safetensors.
    pub tensors: usize,
    /// Modules stored quantized, by (bits, group size).
    pub quantized: BTreeMap<(u8, u32), usize>,
    /// Modules repacked losslessly (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K).
    pub lossless: usize,
    /// Modules re-quantized from dequantized values.
    pub requantized: usize,
    /// Tensors written as floats.
    pub float_tensors: usize,
    pub safetensors_bytes: u64,
    pub tie_word_embeddings: bool,
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Encoding {
    Float(Dtype),
    Lossless { bits: u32, scale_dtype: Dtype },
    Requant { bits: u32, group: u32, scale_dtype: Dtype },
}

struct Plan<'a> {
    src: &'a TensorInfo,
    mapped: Mapped,
    /// Row-major output shape.
    shape: Vec<u64>,
    enc: Encoding,
}

impl Plan<'_> {
    fn out_name(&self) -> String {
        format!("{}.{}", self.mapped.module, self.mapped.param)
    }

    fn entries(&self) -> Vec<Entry> {
        match self.enc {
            Encoding::Float(dtype) => vec![Entry { name: self.out_name(), dtype, shape: self.shape.clone() }],
            Encoding::Lossless { bits, scale_dtype } => self.quant_entries(bits, 32, scale_dtype),
            Encoding::Requant { bits, group, scale_dtype } => self.quant_entries(bits, group, scale_dtype),
        }
    }

    /// `[..., rows, cols]` → weight `[..., rows, cols·bits/32]`, scales/biases `[..., rows, cols/group]`.
    fn quant_entries(&self, bits: u32, group: u32, sd: Dtype) -> Vec<Entry> {
        let (lead, cols) = self.shape.split_at(self.shape.len() - 1);
        let cols = cols[0];
        let with_last = |last: u64| lead.iter().copied().chain([last]).collect::<Vec<_>>();
        let m = &self.mapped.module;
        vec![
            Entry { name: format!("{m}.weight"), dtype: Dtype::U32, shape: with_last(cols * bits as u64 / 32) },
            Entry { name: format!("{m}.scales"), dtype: sd, shape: with_last(cols / group as u64) },
            Entry { name: format!("{m}.biases"), dtype: sd, shape: with_last(cols / group as u64) },
        ]
    }
}

fn write_json(path: &Path, v: &Json) -> Result<()> {
    let mut s = serde_json::to_string_pretty(v).expect("json");
    s.push('\n');
    std::fs::write(path, s).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// Convert a GGUF file into an MLX checkpoint directory.
pub fn convert_gguf(
    gguf: &Path,
    out_dir: &Path,
    opts: &ConvertOptions,
    progress: &mut dyn FnMut(ConvertProgress),
) -> Result<ConvertSummary> {
    if opts.float && opts.q_bits.is_some() {
        return Err(Error::InvalidArgument("--float and --q-bits exclude each other".into()));
    }
    if let Some(b) = opts.q_bits {
        if !affine::SUPPORTED_BITS.contains(&b) {
            return Err(Error::InvalidArgument(format!("--q-bits {b}: MLX affine supports 2, 3, 4, 5, 6, 8")));
        }
        if !affine::SUPPORTED_GROUPS.contains(&opts.q_group_size) {
            return Err(Error::InvalidArgument(format!(
                "--q-group-size {}: MLX affine supports 32, 64, 128",
                opts.q_group_size
            )));
        }
    }
    let g = GgufFile::open(gguf)?;
    let mut h = Hparams::read(&g)?;
    let mut warnings = Vec::new();
    let vocab = tokenizer::Vocab::read(&g)?;
    if vocab.is_none() {
        warnings.push("the GGUF has no tokenizer (tokenizer.ggml.model); no tokenizer files written".into());
    }
    // Build the tokenizer first: a vocabulary we cannot express fails before any big write.
    let tok_json = match &vocab {
        Some(v) => Some(v.tokenizer_json(&g, &mut warnings)?),
        None => None,
    };

    // ---- plan ----
    let mut plans: Vec<Plan> = Vec::new();
    for t in &g.tensors {
        let mapped = match arch::map_name(&h, &t.name) {
            Ok(Some(m)) => m,
            Ok(None) => {
                if t.name == "rope_freqs.weight" && h.rope_scaling.is_none() {
                    let factors = g.dequantize(t)?;
                    let orig = g.get_u64(&format!("{}.rope.scaling.original_context_length", h.arch))?;
                    match arch::infer_llama3_rope_scaling(&factors, h.rope_theta, h.head_dim, orig) {
                        Some(rs) => h.rope_scaling = Some(rs),
                        None => warnings.push(
                            "rope_freqs.weight does not match llama3 rope scaling: dropped, rope_scaling not set".into(),
                        ),
                    }
                }
                continue;
            }
            Err(msg) => return Err(g.err(msg)),
        };
        let shape = t.shape();
        if let Some(exp) = arch::expected_shape(&h, &mapped) {
            if exp != shape {
                return Err(g.err(format!(
                    "tensor '{}' has shape {shape:?}, expected {exp:?} from the metadata",
                    t.name
                )));
            }
        }
        let is_matrix = shape.len() >= 2;
        if !t.ty.can_dequantize() && affine::lossless_bits(t.ty).is_none() {
            return Err(g.err(format!("tensor '{}': type {} is not supported by the converter", t.name, t.ty)));
        }
        if shape.len() > 3 || (shape.len() == 3 && !mapped.module.contains("switch_mlp")) {
            return Err(g.err(format!("tensor '{}': unexpected {}-D shape {shape:?}", t.name, shape.len())));
        }
        let float_of_type = match t.ty {
            GgmlType::F32 => Dtype::F32,
            GgmlType::F16 => Dtype::F16,
            GgmlType::BF16 => Dtype::BF16,
            _ => opts.float_dtype.dtype(),
        };
        let cols = *shape.last().unwrap_or(&1);
        let legacy = opts.float || opts.q_bits.is_some();
        let lossless = |bits: u32| {
            let exact_f16 = opts.float_dtype == FloatDtype::F16 && affine::lossless_fits_f16(t.ty, g.tensor_data(t));
            Encoding::Lossless { bits, scale_dtype: if exact_f16 { Dtype::F16 } else { Dtype::F32 } }
        };
        let enc = if !is_matrix || !mapped.quantizable {
            Encoding::Float(float_of_type)
        } else if let Some(bits) = affine::lossless_bits(t.ty).filter(|_| !legacy || is_legacy_lossless(t.ty)) {
            lossless(bits)
        } else if let Some(b) = opts.q_bits {
            let group = opts.q_group_size;
            if cols % group as u64 == 0 {
                Encoding::Requant { bits: b as u32, group, scale_dtype: opts.float_dtype.dtype() }
            } else {
                warnings.push(format!(
                    "{}: {cols} columns are not a multiple of group size {group}; written as float",
                    t.name
                ));
                Encoding::Float(opts.float_dtype.dtype())
            }
        } else if let (false, Some((bits, _))) = (opts.float, affine::native_bits(t.ty)) {
            // K-quant rows are whole 256-element super-blocks: always a multiple of 32.
            Encoding::Requant { bits, group: NATIVE_GROUP, scale_dtype: opts.float_dtype.dtype() }
        } else {
            Encoding::Float(opts.float_dtype.dtype())
        };
        if let Some(heads) = mapped.unpermute_heads {
            let rows = shape[0];
            if heads == 0 || rows % heads != 0 || (rows / heads) % 2 != 0 {
                return Err(g.err(format!("tensor '{}': {rows} rows cannot be split into {heads} heads", t.name)));
            }
        }
        plans.push(Plan { src: t, mapped, shape, enc });
    }
    plans.sort_by_key(|p| p.out_name());

    // Required tensors (named as in the GGUF, and as what they become).
    let have = |n: &str| plans.iter().any(|p| p.out_name() == n);
    let mut required = vec!["token_embd.weight".to_string(), "output_norm.weight".to_string()];
    for l in 0..h.n_layers {
        for part in h.required_layer_tensors() {
            required.push(format!("blk.{l}.{part}.weight"));
        }
    }
    if let Some(missing) = required.iter().find(|n| g.tensor(n).is_none()) {
        let hf = match arch::map_name(&h, missing) {
            Ok(Some(m)) => format!(" ({}.{})", m.module, m.param),
            _ => String::new(),
        };
        return Err(g.err(format!(
            "missing tensor '{missing}'{hf}: architecture '{}' with block_count {} needs it",
            h.arch, h.n_layers
        )));
    }
    let tie = !have("lm_head.weight");
    let attention_bias = have("model.layers.0.self_attn.q_proj.bias");
    if h.arch == "qwen2" && !attention_bias {
        return Err(g.err("qwen2 GGUF without blk.0.attn_q.bias"));
    }

    // ---- quantization config ----
    let mut quantized: BTreeMap<(u8, u32), usize> = BTreeMap::new();
    let mut module_q: Vec<(String, Option<(u8, u32)>)> = Vec::new();
    for p in plans.iter().filter(|p| p.mapped.quantizable && p.mapped.param == "weight") {
        let q = match p.enc {
            Encoding::Lossless { bits, .. } => Some((bits as u8, 32)),
            Encoding::Requant { bits, group, .. } => Some((bits as u8, group)),
            Encoding::Float(_) => None,
        };
        if let Some(k) = q {
            *quantized.entry(k).or_default() += 1;
        }
        module_q.push((p.mapped.module.clone(), q));
    }
    let default_q = quantized.iter().max_by_key(|(k, n)| (**n, k.0, k.1)).map(|(k, _)| *k);

    std::fs::create_dir_all(out_dir).map_err(|e| Error::io(format!("creating {}", out_dir.display()), e))?;
    if let Ok(rd) = std::fs::read_dir(out_dir) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if (n.ends_with(".safetensors") && n != "model.safetensors") || n == "model.safetensors.index.json" {
                return Err(Error::InvalidArgument(format!(
                    "output directory {} already holds another checkpoint ({n}); use an empty directory",
                    out_dir.display()
                )));
            }
        }
    }

    // ---- tensors ----
    let entries: Vec<Entry> = plans.iter().flat_map(|p| p.entries()).collect();
    let n_entries = entries.len();
    let st_path = out_dir.join("model.safetensors");
    let tmp_path = out_dir.join("model.safetensors.partial");
    let mut w = SafetensorsWriter::create(&tmp_path, entries, &[("format", "mlx")])?;
    let total = plans.len();
    let (mut lossless, mut requantized, mut float_tensors) = (0, 0, 0);
    for (i, p) in plans.iter().enumerate() {
        match p.enc {
            Encoding::Float(_) => float_tensors += 1,
            Encoding::Lossless { .. } => lossless += 1,
            Encoding::Requant { .. } => requantized += 1,
        }
        write_tensor(&g, p, &mut w)?;
        progress(ConvertProgress { done: i + 1, total, tensor: p.src.name.clone() });
    }
    let bytes = w.finish()?;
    std::fs::rename(&tmp_path, &st_path)
        .map_err(|e| Error::io(format!("renaming {} to {}", tmp_path.display(), st_path.display()), e))?;

    // ---- config.json ----
    let bos = vocab.as_ref().and_then(|v| v.bos);
    let eos = vocab.as_ref().and_then(|v| v.eos);
    let mut config = h.config_json(tie, attention_bias, bos, eos, opts.float_dtype.torch_name());
    if let Some((bits, group)) = default_q {
        let mut q = Map::new();
        q.insert("group_size".into(), json!(group));
        q.insert("bits".into(), json!(bits));
        q.insert("mode".into(), json!("affine"));
        for (module, mq) in &module_q {
            match mq {
                Some(k) if *k == (bits, group) => {}
                Some((b, gs)) => {
                    q.insert(module.clone(), json!({"group_size": gs, "bits": b}));
                }
                None => {
                    q.insert(module.clone(), json!(false));
                }
            }
        }
        config.insert("quantization".into(), Json::Object(q.clone()));
        config.insert("quantization_config".into(), Json::Object(q));
    }
    let mut files = vec![st_path];
    let p = out_dir.join("config.json");
    write_json(&p, &Json::Object(config))?;
    files.push(p);

    // ---- tokenizer ----
    if let (Some(v), Some(tj)) = (&vocab, tok_json) {
        let p = out_dir.join("tokenizer.json");
        write_json(&p, &tj)?;
        files.push(p);
        let p = out_dir.join("tokenizer_config.json");
        write_json(&p, &v.tokenizer_config())?;
        files.push(p);
        let mut gc = Map::new();
        if let Some(b) = v.bos {
            gc.insert("bos_token_id".into(), json!(b));
        }
        let eos = v.eos_ids();
        match eos.len() {
            0 => {}
            1 => {
                gc.insert("eos_token_id".into(), json!(eos[0]));
            }
            _ => {
                gc.insert("eos_token_id".into(), json!(eos));
            }
        }
        if let Some(p) = v.pad {
            gc.insert("pad_token_id".into(), json!(p));
        }
        let p = out_dir.join("generation_config.json");
        write_json(&p, &Json::Object(gc))?;
        files.push(p);
    }

    Ok(ConvertSummary {
        architecture: h.arch.clone(),
        out_dir: out_dir.to_path_buf(),
        files,
        tensors: n_entries,
        quantized,
        lossless,
        requantized,
        float_tensors,
        safetensors_bytes: bytes,
        tie_word_embeddings: tie,
        warnings,
    })
}

/// The converter's old lossless set, kept under `--q-bits` and `--float`.
fn is_legacy_lossless(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
}

/// Source row of output row `r`.
fn src_row(p: &Plan, r: u64) -> u64 {
    match p.mapped.unpermute_heads {
        Some(heads) => arch::unpermute_src_row(r, p.shape[0], heads),
        None => r,
    }
}

fn write_tensor(g: &GgufFile, p: &Plan, w: &mut SafetensorsWriter) -> Result<()> {
    let t = p.src;
    let name = p.out_name();
    if p.shape.len() < 2 {
        // 1-D (or scalar): whole tensor, element permutation for Q/K biases.
        let Encoding::Float(dtype) = p.enc else { unreachable!("only matrices are quantized") };
        let mut vals = g.dequantize(t)?;
        if p.mapped.shift != 0.0 {
            vals.iter_mut().for_each(|v| *v += p.mapped.shift);
        }
        let vals: Vec<f32> = match p.mapped.unpermute_heads {
            Some(heads) => {
                let n = vals.len() as u64;
                (0..n).map(|r| vals[arch::unpermute_src_row(r, n, heads) as usize]).collect()
            }
            None => vals,
        };
        let mut buf = Vec::with_capacity(vals.len() * 4);
        dtype.extend_from_f32(&mut buf, &vals);
        return w.write(&name, &buf);
    }
    // All leading axes (rows, or experts × rows) flatten into rows: the file order.
    let cols = *p.shape.last().expect("matrix") as usize;
    let rows: u64 = p.shape[..p.shape.len() - 1].iter().product();
    let data = g.tensor_data(t);
    let rb = t.row_bytes() as usize;
    let mut row = vec![0f32; cols];
    let mut buf: Vec<u8> = Vec::with_capacity(cols * 4);
    match p.enc {
        Encoding::Float(dtype) => {
            for r in 0..rows {
                g.dequantize_row(t, src_row(p, r), &mut row)?;
                buf.clear();
                dtype.extend_from_f32(&mut buf, &row);
                w.write(&name, &buf)?;
            }
        }
        Encoding::Lossless { scale_dtype, .. } | Encoding::Requant { scale_dtype, .. } => {
            let m = &p.mapped.module;
            let wname = format!("{m}.weight");
            let mut scales = Vec::new();
            let mut biases = Vec::new();
            for r in 0..rows {
                buf.clear();
                let s = src_row(p, r) as usize;
                match p.enc {
                    Encoding::Lossless { .. } => {
                        affine::repack_lossless_row(t.ty, &data[s * rb..(s + 1) * rb], &mut buf, &mut scales, &mut biases)
                    }
                    Encoding::Requant { bits, group, .. } => {
                        g.dequantize_row(t, s as u64, &mut row)?;
                        affine::quantize_row(&row, bits, group as usize, &mut buf, &mut scales, &mut biases)
                    }
                    Encoding::Float(_) => unreachable!(),
                }
                w.write(&wname, &buf)?;
            }
            buf.clear();
            scale_dtype.extend_from_f32(&mut buf, &scales);
            w.write(&format!("{m}.scales"), &buf)?;
            buf.clear();
            scale_dtype.extend_from_f32(&mut buf, &biases);
            w.write(&format!("{m}.biases"), &buf)?;
        }
    }
    Ok(())
}

/// A progress bar and a callback that drives it (for the CLI).
pub fn progress_bar_callback() -> (indicatif::ProgressBar, impl FnMut(ConvertProgress)) {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} tensors {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let b = bar.clone();
    let cb = move |p: ConvertProgress| {
        b.set_length(p.total as u64);
        b.set_position(p.done as u64);
        b.set_message(p.tensor);
    };
    (bar, cb)
}
