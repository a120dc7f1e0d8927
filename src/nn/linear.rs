//! Linear layers, dense or quantized (mlx-lm's `nn.Linear` / `nn.QuantizedLinear`).
use crate::error::Result;
use super::module::Params;
use super::norm::RmsNorm;
use crate::loader::{QuantSpec, TensorKind, Vb};
use crate::mlx::quant::{self, Epilogue};
use crate::mlx::{Array, Dtype};

/// Rows of input from which a CPU build with OpenBLAS dequantizes and uses sgemm (see `matmul_t`).
const DEQUANT_GEMM_MIN_ROWS: usize = 32;

/// Rows of input from which a GPU prefill chunk dequantizes each weight and multiplies with
/// MLX's dense GEMM instead of its quantized matmul. On the H200 (`mlex bench --matvec S --rows
/// R`, BENCHMARKS.md), for the 7B's projections MLX's quantized matmul ran at ~80 GB/s of weights
/// with 512 rows, dequantize + GEMM 2.0-2.1× faster; with 128 rows the quantized matmul was
/// 1.4-1.6× faster. MLEX_CUDA_DEQUANT_GEMM_MIN_ROWS overrides it (0: never).
const CUDA_DEQUANT_GEMM_MIN_ROWS: usize = 256;

/// And only for weights of more than this many elements: at 512 rows a 1024 × 1024 weight took
/// 2.5× longer dequantized (11.7 against 28.7 µs), 4096 × 1024 broke even and 6144 × 1024 was
/// 1.8× faster; real SmolLM2's largest (1536 × 576) stay with the quantized matmul.
const CUDA_DEQUANT_GEMM_MIN_WEIGHTS: usize = 4096 * 1024;

/// Nor for weights of more than this many elements (a 16-bit copy of 320 MB): the dequantized
/// copies of the layers in flight add to the peak (the 7B at 512 tokens: 4.28 → 5.58 GiB, its
/// largest weight 136M elements); a 32B's or 70B's largest weights keep the quantized matmul.
const CUDA_DEQUANT_GEMM_MAX_WEIGHTS: usize = 160 << 20;

fn cuda_dequant_gemm_min_rows() -> usize {
    static ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| {
        std::env::var("MLEX_CUDA_DEQUANT_GEMM_MIN_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(CUDA_DEQUANT_GEMM_MIN_ROWS)
    })
}

/// A quantized weight and how to read it.
pub struct QuantWeight {
    pub weight: Array,
    pub scales: Array,
    pub biases: Option<Array>,
    pub spec: QuantSpec,
    /// The compute dtype where it is not the scales' own (16-bit scales kept in a float32 model
    /// on the CPU: `loader::weights::keeps_16bit_scales`); [`QuantWeight::dequantize`] widens them
    /// to it first.
    pub dequant_dtype: Option<Dtype>,
}

impl QuantWeight {
    /// Loads `weight/scales/biases` of module `vb` for an `[out, in]` matrix quantized per
    /// `spec` (`lead`: leading dimensions, e.g. `[experts]` for stacked expert weights).
    pub fn load(vb: &Vb, lead: &[usize], out: usize, inp: usize, spec: QuantSpec) -> Result<Self> {
        if inp % spec.group_size as usize != 0 || (inp * spec.bits as usize) % 32 != 0 {
            return Err(crate::error::Error::checkpoint(
                "config.json",
                format!("'{}': input size {inp} is not a multiple of the group size {}", vb.prefix(), spec.group_size),
            ));
        }
        let shape = |last: usize| -> Vec<usize> { lead.iter().copied().chain([out, last]).collect() };
        let groups = inp / spec.group_size as usize;
        let weight = vb.take("weight", &shape(inp * spec.bits as usize / 32), TensorKind::Packed)?;
        let mut scales = vb.take("scales", &shape(groups), TensorKind::Scales)?;
        let mut biases =
            if spec.mode.has_biases() { Some(vb.take("biases", &shape(groups), TensorKind::Scales)?) } else { None };
        let mut dequant_dtype = vb.dtype().filter(|&d| scales.dtype().is_float() && scales.dtype() != d);
        if let (Some(d), false) = (dequant_dtype, lead.is_empty()) {
            // Stacked weights (experts, heads) go through MLX's kernels, which widen every 16-bit
            // scale of the stack on each call (measured: 2.4× slower for 64 experts): float32.
            scales = scales.astype(d)?;
            biases = biases.map(|b| b.astype(d)).transpose()?;
            dequant_dtype = None;
        }
        Ok(QuantWeight { weight, scales, biases, spec, dequant_dtype })
    }

    /// The float weight (`ids`: only those rows, an embedding lookup), in the compute dtype.
    /// Kept 16-bit scales are widened first: MLX's dequantize computes in the scales' dtype (a
    /// float32 output dtype only casts the rounded 16-bit result).
    pub fn dequantize(&self, ids: Option<&Array>) -> Result<Array> {
        let rows = |a: &Array| -> Result<Array> { ids.map_or_else(|| Ok(a.clone()), |i| a.take(i, 0)) };
        let widen = |a: &Array| -> Result<Array> {
            let r = rows(a)?;
            match self.dequant_dtype {
                Some(d) => r.astype(d),
                None => Ok(r),
            }
        };
        let biases = self.biases.as_ref().map(widen).transpose()?;
        quant::dequantize(
            &rows(&self.weight)?,
            &widen(&self.scales)?,
            biases.as_ref(),
            self.spec.group_size as i32,
            self.spec.bits as i32,
            self.spec.mode,
        )
    }

    /// `x @ Wᵀ` without materialising W — except for long prefill chunks on a CPU whose BLAS is
    /// OpenBLAS, or on a GPU: there dequantizing and a dense GEMM is faster than MLX's quantized
    /// matmul (the decode path, a few rows at a time, keeps the quantized kernels).
    pub fn matmul_t(&self, x: &Array) -> Result<Array> {
        if self.dequantize_for_gemm(x)? {
            let w = self.dequantize(None)?;
            return x.matmul(&w.transpose(&[1, 0])?);
        }
        quant::quantized_matmul(
            x,
            &self.weight,
            &self.scales,
            self.biases.as_ref(),
            true,
            self.spec.group_size as i32,
            self.spec.bits as i32,
            self.spec.mode,
        )
    }
}

impl QuantWeight {
    /// Elements of the float weight.
    fn elements(&self) -> usize {
        self.weight.size() / self.weight.dim(-1).max(1) as usize * self.scales.dim(-1) as usize * self.spec.group_size as usize
    }

    /// Whether [`QuantWeight::matmul_t`] dequantizes for a dense GEMM (long prefill chunks: on a
    /// CPU with OpenBLAS, or on CUDA for mid-sized weights).
    fn dequantize_for_gemm(&self, x: &Array) -> Result<bool> {
        let rows = x.size() / x.dim(-1).max(1) as usize;
        // The GPU on Linux is CUDA (Metal's quantized matmul is MLX's best-tuned kernel: not measured, not changed).
        let cuda = !cfg!(target_os = "macos")
            && (1..=rows).contains(&cuda_dequant_gemm_min_rows())
            && (CUDA_DEQUANT_GEMM_MIN_WEIGHTS + 1..=CUDA_DEQUANT_GEMM_MAX_WEIGHTS).contains(&self.elements());
        let (cpu, gpu) = (cfg!(mlex_openblas) && rows >= DEQUANT_GEMM_MIN_ROWS, cuda);
        if !cpu && !gpu {
            return Ok(false);
        }
        Ok(match crate::mlx::default_device()? {
            crate::mlx::Device::Cpu => cpu,
            crate::mlx::Device::Gpu => gpu,
        })
    }

    /// [`QuantWeight::matmul_t`] followed by `epilogue`, folded into the product's kernel where
    /// ours applies (CUDA decode rows): the same values, one launch fewer.
    pub fn matmul_t_then(&self, x: &Array, epilogue: Epilogue<'_>) -> Result<Array> {
        self.matmul_t_fused(x, None, Some(epilogue))
    }

    /// `matmul_t(norm(x))`, then `epilogue`: the layer's pre-norm folded into the product's
    /// kernel where ours applies (CUDA decode rows), one launch fewer.
    pub fn matmul_t_normed(&self, x: &Array, norm: &RmsNorm, epilogue: Option<Epilogue<'_>>) -> Result<Array> {
        self.matmul_t_fused(x, Some(norm), epilogue)
    }

    fn matmul_t_fused(&self, x: &Array, norm: Option<&RmsNorm>, epilogue: Option<Epilogue<'_>>) -> Result<Array> {
        if self.dequantize_for_gemm(x)? {
            let x = match norm {
                Some(n) => n.forward(x)?,
                None => x.clone(),
            };
            let y = self.matmul_t(&x)?;
            return match epilogue {
                None => Ok(y),
                Some(Epilogue::AddResidual(r)) => r.add(&y),
                Some(Epilogue::AddBias(b)) => y.add(b),
                Some(Epilogue::SwiGlu) => {
                    let half = y.dim(-1) / 2;
                    let gu = y.split_at(&[half], -1)?;
                    crate::mlx::fast::swiglu(&gu[0], &gu[1])
                }
            };
        }
        quant::quantized_matmul_fused(
            x,
            norm.map(|n| (&n.weight, n.eps)),
            &self.weight,
            &self.scales,
            self.biases.as_ref(),
            self.spec.group_size as i32,
            self.spec.bits as i32,
            self.spec.mode,
            epilogue,
        )
    }
}

impl Params for QuantWeight {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        out.extend([&self.weight, &self.scales].into_iter().chain(self.biases.iter()));
    }
}

pub enum Linear {
    /// `weight_t` is the `[in, out]` transposed view of the stored `[out, in]` weight, made once at
    /// load so the decode step does not add a transpose op per layer per token.
    Dense { weight_t: Array, bias: Option<Array> },
    Quantized { q: QuantWeight, bias: Option<Array> },
}

impl Linear {
    /// Loads module `vb`'s `weight` (`[out, in]`) and optionally its `bias`, quantized or not.
    pub fn load(vb: &Vb, inp: usize, out: usize, bias: bool) -> Result<Linear> {
        let b = if bias { Some(vb.get("bias", &[out])?) } else { None };
        Ok(match vb.quant_spec(inp)? {
            Some(spec) => Linear::Quantized { q: QuantWeight::load(vb, &[], out, inp, spec)?, bias: b },
            None => Linear::dense(vb.get("weight", &[out, inp])?, b)?,
        })
    }

    /// A dense layer from an `[out, in]` weight.
    pub fn dense(weight: Array, bias: Option<Array>) -> Result<Linear> {
        Ok(Linear::Dense { weight_t: weight.transpose(&[1, 0])?, bias })
    }

    /// `residual + self.forward(x)` (a residual stream's add after an output projection), the
    /// add folded into the product's kernel where it can be.
    pub fn forward_add(&self, x: &Array, residual: &Array) -> Result<Array> {
        match self {
            Linear::Quantized { q, bias: None } => q.matmul_t_then(x, Epilogue::AddResidual(residual)),
            _ => residual.add(&self.forward(x)?),
        }
    }

    /// Output features.
    pub fn out_features(&self) -> i32 {
        match self {
            Linear::Dense { weight_t, .. } => weight_t.dim(1),
            Linear::Quantized { q, .. } => q.weight.dim(0),
        }
    }

    /// Stacks layers that read the same input (q/k/v, gate/up) into one, so a single matmul
    /// replaces several: fewer ops per token, which is what decode speed is made of. Returns the
    /// fused layer and the split points of its output, or the parts unchanged when they cannot
    /// be fused (mixed quantization, mixed biases).
    pub fn fuse(parts: Vec<Linear>) -> Result<std::result::Result<(Linear, Vec<i32>), Vec<Linear>>> {
        let mut splits = vec![];
        let mut acc = 0;
        for p in &parts[..parts.len() - 1] {
            acc += p.out_features();
            splits.push(acc);
        }
        let same_bias = parts.iter().all(|p| p.bias().is_some()) || parts.iter().all(|p| p.bias().is_none());
        let cat = |xs: Vec<&Array>| Array::concatenate(&xs, 0);
        let fused = match &parts[0] {
            Linear::Dense { .. } if same_bias && parts.iter().all(|p| matches!(p, Linear::Dense { .. })) => {
                let ws: Vec<Array> = parts
                    .iter()
                    .map(|p| if let Linear::Dense { weight_t, .. } = p { weight_t.transpose(&[1, 0]) } else { unreachable!() })
                    .collect::<Result<_>>()?;
                let bias = if parts[0].bias().is_some() { Some(cat(parts.iter().map(|p| p.bias().unwrap()).collect())?) } else { None };
                Linear::dense(cat(ws.iter().collect())?, bias)?
            }
            Linear::Quantized { q: q0, .. }
                if same_bias
                    && parts.iter().all(|p| matches!(p, Linear::Quantized { q, .. } if q.spec == q0.spec && q.biases.is_some() == q0.biases.is_some())) =>
            {
                let qs: Vec<&QuantWeight> = parts.iter().map(|p| if let Linear::Quantized { q, .. } = p { q } else { unreachable!() }).collect();
                let biases = if q0.biases.is_some() { Some(cat(qs.iter().map(|q| q.biases.as_ref().unwrap()).collect())?) } else { None };
                let bias = if parts[0].bias().is_some() { Some(cat(parts.iter().map(|p| p.bias().unwrap()).collect())?) } else { None };
                Linear::Quantized {
                    q: QuantWeight {
                        weight: cat(qs.iter().map(|q| &q.weight).collect())?,
                        scales: cat(qs.iter().map(|q| &q.scales).collect())?,
                        biases,
                        spec: q0.spec,
                        dequant_dtype: q0.dequant_dtype,
                    },
                    bias,
                }
            }
            _ => return Ok(Err(parts)),
        };
        Ok(Ok((fused, splits)))
    }

    fn bias(&self) -> Option<&Array> {
        match self {
            Linear::Dense { bias, .. } | Linear::Quantized { bias, .. } => bias.as_ref(),
        }
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Linear::Dense { weight_t, bias } => match bias {
                Some(b) => Array::addmm(b, x, weight_t, 1.0, 1.0),
                None => x.matmul(weight_t),
            },
            Linear::Quantized { q, bias: Some(b) } => q.matmul_t_then(x, Epilogue::AddBias(b)),
            Linear::Quantized { q, bias: None } => q.matmul_t(x),
        }
    }
}

impl Linear {
    /// `self.forward(norm(x))`, the norm folded into a quantized product's kernel where ours
    /// applies (CUDA decode rows).
    pub fn forward_normed(&self, x: &Array, norm: &RmsNorm) -> Result<Array> {
        match self {
            Linear::Quantized { q, bias } => q.matmul_t_normed(x, norm, bias.as_ref().map(Epilogue::AddBias)),
            Linear::Dense { .. } => self.forward(&norm.forward(x)?),
        }
    }
}

impl Params for Linear {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        match self {
            Linear::Dense { weight_t, bias } => out.extend(std::iter::once(weight_t).chain(bias.iter())),
            Linear::Quantized { q, bias } => {
                q.params(out);
                out.extend(bias.iter());
            }
        }
    }
}

/// Several projections of the same input (q/k/v, gate/up), run as one fused matmul whose output
/// is split, or separately when the checkpoint quantizes them differently.
pub enum Projections {
    Fused { linear: Linear, splits: Vec<i32> },
    Separate(Vec<Linear>),
}

impl Projections {
    /// `kind` ("qkv", "gate_up") names the group for the benchmark ablation below.
    pub fn new(kind: &str, parts: Vec<Linear>) -> Result<Self> {
        // Benchmark ablation only (src/ablation.rs).
        if crate::ablation::get().unfused(kind) {
            return Ok(Projections::Separate(parts));
        }
        Ok(match Linear::fuse(parts)? {
            Ok((linear, splits)) => Projections::Fused { linear, splits },
            Err(parts) => Projections::Separate(parts),
        })
    }

    /// One output per projection, in order.
    pub fn forward(&self, x: &Array) -> Result<Vec<Array>> {
        match self {
            Projections::Fused { linear, splits } => linear.forward(x)?.split_at(splits, -1),
            Projections::Separate(parts) => parts.iter().map(|p| p.forward(x)).collect(),
        }
    }

    /// [`Projections::forward`] of `norm(x)`, the norm folded into a fused quantized product's
    /// kernel where ours applies.
    pub fn forward_normed(&self, x: &Array, norm: &RmsNorm) -> Result<Vec<Array>> {
        match self {
            Projections::Fused { linear, splits } => linear.forward_normed(x, norm)?.split_at(splits, -1),
            Projections::Separate(_) => self.forward(&norm.forward(x)?),
        }
    }

    /// `silu(gate) · up` of a two-projection group [gate, up] (the SwiGLU MLP), folded into the
    /// fused product's kernel where it can be.
    pub fn swiglu(&self, x: &Array) -> Result<Array> {
        self.swiglu_of(x, None)
    }

    /// [`Projections::swiglu`] of `norm(x)`: the layer's pre-norm folded into the same kernel.
    pub fn swiglu_normed(&self, x: &Array, norm: &RmsNorm) -> Result<Array> {
        self.swiglu_of(x, Some(norm))
    }

    fn swiglu_of(&self, x: &Array, norm: Option<&RmsNorm>) -> Result<Array> {
        if let Projections::Fused { linear: Linear::Quantized { q, bias: None }, splits } = self {
            if splits.len() == 1 && splits[0] * 2 == q.weight.dim(0) {
                return match norm {
                    Some(n) => q.matmul_t_normed(x, n, Some(Epilogue::SwiGlu)),
                    None => q.matmul_t_then(x, Epilogue::SwiGlu),
                };
            }
        }
        let gu = match norm {
            Some(n) => self.forward_normed(x, n)?,
            None => self.forward(x)?,
        };
        crate::mlx::fast::swiglu(&gu[0], &gu[1])
    }

    pub fn linears(&self) -> Vec<&Linear> {
        match self {
            Projections::Fused { linear, .. } => vec![linear],
            Projections::Separate(parts) => parts.iter().collect(),
        }
    }
}

impl Params for Projections {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        for l in self.linears() {
            l.params(out);
        }
    }
}
