//! All tensors of a checkpoint (single or sharded safetensors), handed out by name exactly once so
//! that missing, mis-shaped and left-over tensors are all errors naming the tensor and its file.
use super::quant_config::QuantConfig;
use super::safetensors::SafetensorsFile;
use crate::error::{Error, Result};
use crate::mlx::{quant, random, Array, Dtype};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

pub struct WeightStore {
    dir: PathBuf,
    files: Vec<SafetensorsFile>,
    /// tensor name → index into `files`; entries are removed as the model takes them.
    remaining: BTreeMap<String, usize>,
    /// The float dtype the model computes in; float tensors are cast to it as they are taken.
    pub compute_dtype: Option<Dtype>,
    /// Random weights made on demand instead of read from files (benchmarks of real shapes).
    synthetic: Option<Synthetic>,
    /// Tensors made at load from stored ones (a sanitize step: per-expert weights stacked into
    /// one), handed out like stored ones.
    made: BTreeMap<String, Array>,
}

/// Random weights of whatever shape the model asks for, quantized as `quant` says.
struct Synthetic {
    quant: Option<QuantConfig>,
    key: random::RandomKey,
    /// Scales/biases made together with a packed weight, waiting to be taken.
    pending: HashMap<String, Array>,
}

impl WeightStore {
    /// Opens `model.safetensors.index.json`'s shards, or every `*.safetensors` in `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let mut names: Vec<String> = if index.is_file() {
            let text = std::fs::read_to_string(&index).map_err(|e| Error::io(format!("reading {}", index.display()), e))?;
            super::safetensors_header::index_shards(&text, &index)?
        } else {
            let rd = std::fs::read_dir(dir).map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".safetensors"))
                .collect()
        };
        names.sort();
        if names.is_empty() {
            return Err(Error::checkpoint(dir, "no .safetensors weights in the model directory"));
        }
        let mut files = vec![];
        let mut remaining = BTreeMap::new();
        for (i, name) in names.iter().enumerate() {
            if name.contains('/') || name.contains("..") {
                return Err(Error::checkpoint(&index, format!("shard name '{name}' leaves the model directory")));
            }
            let path = dir.join(name);
            if !path.is_file() {
                return Err(Error::checkpoint(&path, "shard listed in the index is missing"));
            }
            let f = SafetensorsFile::open(&path)?;
            for t in f.tensors.keys() {
                if let Some(prev) = remaining.insert(t.clone(), i) {
                    return Err(Error::checkpoint(
                        &path,
                        format!("tensor '{t}' also appears in {}", names[prev]),
                    ));
                }
            }
            files.push(f);
        }
        Ok(WeightStore { dir: dir.to_path_buf(), files, remaining, compute_dtype: None, synthetic: None, made: BTreeMap::new() })
    }

    /// A store that invents random weights (normal, std 0.02) for every tensor the model takes,
    /// quantized per `quant`: real shapes without a checkpoint on disk.
    pub fn synthetic(quant: Option<QuantConfig>, dtype: Dtype, seed: u64) -> Result<Self> {
        Ok(WeightStore {
            dir: PathBuf::from("<random weights>"),
            files: vec![],
            remaining: BTreeMap::new(),
            compute_dtype: Some(dtype),
            synthetic: Some(Synthetic { quant, key: random::RandomKey::new(seed)?, pending: HashMap::new() }),
            made: BTreeMap::new(),
        })
    }

    pub fn contains(&self, name: &str) -> bool {
        if let Some(s) = &self.synthetic {
            return match name.strip_suffix(".scales") {
                Some(prefix) => s.quant.as_ref().and_then(|q| q.for_module(prefix)).is_some(),
                None => true,
            };
        }
        self.remaining.contains_key(name) || self.made.contains_key(name)
    }

    /// Drops a tensor the model does not use (e.g. `rotary_emb.inv_freq`, a tied `lm_head`).
    pub fn discard(&mut self, name: &str) {
        self.remaining.remove(name);
        self.made.remove(name);
    }

    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.remaining.keys().chain(self.made.keys())
    }

    /// Shape and dtype of a remaining tensor.
    pub fn info(&self, name: &str) -> Option<(Vec<usize>, Dtype)> {
        if let Some(a) = self.made.get(name) {
            return Some((a.shape().iter().map(|&d| d as usize).collect(), a.dtype()));
        }
        let i = *self.remaining.get(name)?;
        let t = &self.files[i].tensors[name];
        Some((t.shape.clone(), t.dtype))
    }

    /// Takes tensor `name`, checking its shape (and that it is a float tensor when `float`),
    /// casting floats to the compute dtype.
    pub fn take(&mut self, name: &str, shape: &[usize], kind: TensorKind) -> Result<Array> {
        if self.synthetic.is_some() {
            return self.take_synthetic(name, shape, kind);
        }
        if let Some(arr) = self.made.remove(name) {
            return self.check_made(name, arr, shape, kind);
        }
        let i = self.remaining.remove(name).ok_or_else(|| {
            Error::checkpoint(&self.dir, format!("missing tensor '{name}' (expected shape {shape:?})"))
        })?;
        let file = &self.files[i];
        let t = &file.tensors[name];
        if t.shape != shape {
            return Err(Error::checkpoint(
                &file.path,
                format!("tensor '{name}' has shape {:?}, expected {shape:?}", t.shape),
            ));
        }
        let ok = match kind {
            TensorKind::Float => t.dtype.is_float(),
            TensorKind::Packed => t.dtype == Dtype::Uint32,
            TensorKind::Scales => t.dtype.is_float() || t.dtype == Dtype::Uint8,
        };
        if !ok {
            return Err(Error::checkpoint(
                &file.path,
                format!("tensor '{name}' has dtype {}, expected {}", t.dtype.name(), kind.describe()),
            ));
        }
        let arr = file.array(t)?;
        match (kind, self.compute_dtype) {
            (TensorKind::Scales, Some(d)) if keeps_16bit_scales(t.dtype, d)? => Ok(arr),
            (TensorKind::Float, Some(d)) | (TensorKind::Scales, Some(d)) if t.dtype.is_float() && t.dtype != d => {
                arr.astype(d)
            }
            _ => Ok(arr),
        }
    }

    fn check_made(&self, name: &str, arr: Array, shape: &[usize], kind: TensorKind) -> Result<Array> {
        let have: Vec<usize> = arr.shape().iter().map(|&d| d as usize).collect();
        if have != shape {
            return Err(Error::checkpoint(&self.dir, format!("tensor '{name}' has shape {have:?}, expected {shape:?}")));
        }
        let d = arr.dtype();
        let ok = match kind {
            TensorKind::Float => d.is_float(),
            TensorKind::Packed => d == Dtype::Uint32,
            TensorKind::Scales => d.is_float() || d == Dtype::Uint8,
        };
        if !ok {
            return Err(Error::checkpoint(&self.dir, format!("tensor '{name}' has dtype {}, expected {}", d.name(), kind.describe())));
        }
        match (kind, self.compute_dtype) {
            (TensorKind::Scales, Some(c)) if keeps_16bit_scales(d, c)? => Ok(arr),
            (TensorKind::Float, Some(c)) | (TensorKind::Scales, Some(c)) if d.is_float() && d != c => arr.astype(c),
            _ => Ok(arr),
        }
    }

    /// Stacks the stored tensors `parts` (same shape and dtype) along a new first axis into a
    /// tensor named `into`, taking the parts (mlx-lm's sanitize of per-expert weights into one
    /// `[experts, …]` tensor). Returns false, touching nothing, when the first part is absent.
    pub fn stack(&mut self, parts: &[String], into: &str) -> Result<bool> {
        if self.synthetic.is_some() || parts.is_empty() || !self.remaining.contains_key(&parts[0]) {
            return Ok(false);
        }
        let (shape0, dtype0) = self.info(&parts[0]).expect("present");
        let mut arrays = Vec::with_capacity(parts.len());
        for name in parts {
            let i = self.remaining.remove(name).ok_or_else(|| {
                Error::checkpoint(&self.dir, format!("missing tensor '{name}' (stacking into '{into}')"))
            })?;
            let file = &self.files[i];
            let t = &file.tensors[name.as_str()];
            if t.shape != shape0 || t.dtype != dtype0 {
                return Err(Error::checkpoint(
                    &file.path,
                    format!("tensor '{name}' ({:?} {}) differs from '{}' ({shape0:?} {})", t.shape, t.dtype.name(), parts[0], dtype0.name()),
                ));
            }
            arrays.push(file.array(t)?.expand_dims(0)?);
        }
        let refs: Vec<&Array> = arrays.iter().collect();
        self.made.insert(into.to_string(), Array::concatenate(&refs, 0)?);
        Ok(true)
    }

    /// Replaces the stored tensor `name` by the named tensors `f` makes from it, handed out like
    /// stored ones (a sanitize step that reinterprets or splits a stored layout, e.g. gpt-oss's
    /// interleaved gate/up experts). Returns false, touching nothing, when `name` is not stored.
    pub fn remake(&mut self, name: &str, f: impl FnOnce(Array) -> Result<Vec<(String, Array)>>) -> Result<bool> {
        if self.synthetic.is_some() || !self.remaining.contains_key(name) {
            return Ok(false);
        }
        let i = self.remaining.remove(name).expect("present");
        let file = &self.files[i];
        for (n, a) in f(file.array(&file.tensors[name])?)? {
            self.made.insert(n, a);
        }
        Ok(true)
    }

    fn take_synthetic(&mut self, name: &str, shape: &[usize], kind: TensorKind) -> Result<Array> {
        let dtype = self.compute_dtype.unwrap_or(Dtype::Bfloat16);
        let s = self.synthetic.as_mut().expect("synthetic store");
        let dims: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
        match kind {
            TensorKind::Float if dims.len() == 1 => Array::ones(&dims, dtype),
            TensorKind::Float => random::normal(&dims, dtype, 0.02, &s.key.next()?),
            TensorKind::Packed => {
                let prefix = name.strip_suffix(".weight").unwrap_or(name);
                let spec = s.quant.as_ref().and_then(|q| q.for_module(prefix)).ok_or_else(|| {
                    Error::InvalidArgument(format!("no quantization for synthetic '{prefix}'"))
                })?;
                // Any leading axes (stacked experts `[E, out, packed]`) stay; the last unpacks.
                let mut unpacked = dims.clone();
                let last = unpacked.len() - 1;
                unpacked[last] = (dims[last] as usize * 32 / spec.bits as usize) as i32;
                let w = random::normal(&unpacked, dtype, 0.02, &s.key.next()?)?;
                let q = quant::quantize(&w, spec.group_size as i32, spec.bits as i32, spec.mode)?;
                s.pending.insert(format!("{prefix}.scales"), q.scales);
                if let Some(b) = q.biases {
                    s.pending.insert(format!("{prefix}.biases"), b);
                }
                Ok(q.weight)
            }
            TensorKind::Scales => s
                .pending
                .remove(name)
                .ok_or_else(|| Error::InvalidArgument(format!("synthetic '{name}' requested before its weight"))),
        }
    }

    /// Fails naming every tensor the model did not take.
    pub fn finish(self) -> Result<()> {
        if let Some(name) = self.made.keys().next() {
            return Err(Error::checkpoint(&self.dir, format!("unexpected tensor(s) the model does not use: {name}")));
        }
        if self.remaining.is_empty() {
            return Ok(());
        }
        let mut extra: Vec<String> = self.remaining.keys().take(5).cloned().collect();
        if self.remaining.len() > 5 {
            extra.push(format!("… {} more", self.remaining.len() - 5));
        }
        let file = *self.remaining.values().next().expect("remaining is not empty");
        Err(Error::checkpoint(
            &self.files[file].path,
            format!("unexpected tensor(s) the model does not use: {}", extra.join(", ")),
        ))
    }
}

/// Whether quantization scales/biases stored as `stored` stay so in a model computing in
/// `compute`: 16-bit ones on the CPU in a float32 model. Decode there is memory-bound and our CPU
/// kernels widen them per row (exactly), so float32 copies would only add bytes per token (+50%
/// over 4-bit weights at group 32). MLX's quantized_matmul accepts them too (a float32 result,
/// exact); its dequantize computes in the scales' dtype, so
/// [`crate::nn::linear::QuantWeight::dequantize`] widens them first, and stacked (expert) weights
/// are widened at load (`QuantWeight::load`). GPUs compute in 16 bits, where the cast is kept.
pub(crate) fn keeps_16bit_scales(stored: Dtype, compute: Dtype) -> Result<bool> {
    Ok(compute == Dtype::Float32
        && matches!(stored, Dtype::Float16 | Dtype::Bfloat16)
        && crate::mlx::default_device()? == crate::mlx::Device::Cpu)
}

/// What a tensor is expected to hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    /// Floating-point weights (cast to the compute dtype).
    Float,
    /// Packed quantized integers (uint32).
    Packed,
    /// Quantization scales/biases (float; uint8 for the E8M0 scales of mx modes).
    Scales,
}

impl TensorKind {
    fn describe(self) -> &'static str {
        match self {
            TensorKind::Float => "a float dtype",
            TensorKind::Packed => "uint32 (packed quantized weights)",
            TensorKind::Scales => "a float dtype (quantization scales)",
        }
    }
}
