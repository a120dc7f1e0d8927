//! `mlex bench --matvec NxK,…`: one quantized projection timed alone, mlex's kernel against
//! MLX's own in the same process, as the effective bandwidth over the weight's bytes.
//!
//! A decode step of a 7B on the H200 waits on the GPU, and nearly all of that is its matrix-vector
//! products: this is the figure a change to `src/mlx/cuda_quantized_matvec.cpp` moves, without
//! the rest of the step around it. Each timed round builds `iters` products over four distinct
//! weights (together larger than the GPU's L2 for the 7B's shapes) and evaluates them at once, so
//! the host encodes while the device runs; for a projection whose kernel takes less time than the
//! host's few microseconds per op, the figure is the host's (`host_share`, the share of the time
//! spent building the ops, says how near).
//! With more than 32 rows (`--rows`, a prefill chunk) the variants are the quantized matmul (MLX's
//! on CUDA) and dequantize-then-GEMM (`MLEX_CUDA_DEQUANT_GEMM_MIN_ROWS`). On the CPU, rows up to
//! 32 also time `mlex_int8`: 8-bit activations (`LoadOptions::int8_activations`).
use crate::error::{Error, Result};
use crate::mlx::quant::{self, QuantMode};
use crate::mlx::random::{normal, RandomKey};
use crate::mlx::{eval, sys, Array, Dtype};
use serde_json::{json, Value};
use std::time::Instant;

/// What `mlex bench --matvec` measures.
pub struct MatvecSpec {
    /// `(out, in)` of each weight.
    pub shapes: Vec<(i32, i32)>,
    /// Rows of x (1: a lone request's decode step).
    pub rows: i32,
    pub bits: i32,
    pub group_size: i32,
    pub dtype: Dtype,
    /// Products per timed round.
    pub iters: usize,
    pub rounds: usize,
}

/// Parses `"37888x3584,3584x18944"`.
pub fn parse_shapes(s: &str) -> Result<Vec<(i32, i32)>> {
    s.split(',')
        .map(|p| {
            let (n, k) = p.trim().split_once('x').ok_or_else(|| Error::InvalidArgument(format!("--matvec: '{p}' is not OUTxIN")))?;
            let num = |v: &str| v.trim().parse::<i32>().ok().filter(|&v| v > 0);
            match (num(n), num(k)) {
                (Some(n), Some(k)) => Ok((n, k)),
                _ => Err(Error::InvalidArgument(format!("--matvec: '{p}' is not OUTxIN (positive integers)"))),
            }
        })
        .collect()
}

const WEIGHTS: usize = 4;

/// One JSON object per shape and variant: median microseconds per product and GB/s.
pub fn run(spec: &MatvecSpec, mut report: impl FnMut(Value)) -> Result<()> {
    let mut key = RandomKey::new(7)?;
    let restore = crate::ablation::get().kernels;
    let result = (|| {
        for &(n, k) in &spec.shapes {
            if k % spec.group_size != 0 {
                return Err(Error::InvalidArgument(format!("--matvec {n}x{k}: {k} is not a multiple of the group size {}", spec.group_size)));
            }
            let weights = (0..WEIGHTS)
                .map(|_| {
                    let w = normal(&[n, k], spec.dtype, 0.02, &key.next()?)?;
                    let q = quant::quantize(&w, spec.group_size, spec.bits, QuantMode::Affine)?;
                    let b = q.biases.clone();
                    eval(&[&q.weight, &q.scales, b.as_ref().unwrap_or(&q.scales)])?;
                    Ok(q)
                })
                .collect::<Result<Vec<_>>>()?;
            let x = normal(&[spec.rows, k], spec.dtype, 1.0, &key.next()?)?;
            x.eval()?;
            let bytes = {
                let q = &weights[0];
                (q.weight.nbytes() + q.scales.nbytes() + q.biases.as_ref().map_or(0, |b| b.nbytes())) as f64
            };
            // Over 32 rows, the quantized matmul is MLX's on CUDA, mlex's packed GEMM on the CPU.
            let variants: &[&str] = match (spec.rows > 32, crate::mlx::default_device()?) {
                (true, _) => &["quantized_matmul", "dequant_gemm"],
                (false, crate::mlx::Device::Cpu) => &["mlex", "mlex_int8", "mlx"],
                (false, crate::mlx::Device::Gpu) => &["mlex", "mlx"],
            };
            for &variant in variants {
                crate::mlx::set_cpu_int8_activations(variant == "mlex_int8");
                // MLX's own kernel on either device: ours switched off.
                let ours = sys::MLEX_ABLATE_KERNEL_CUDA_QMV | sys::MLEX_ABLATE_KERNEL_CPU_QMM;
                let ablate = if variant == "mlx" { restore | ours } else { restore };
                unsafe { sys::mlex_set_ablations(ablate) };
                let product = |q: &quant::Quantized| -> Result<Array> {
                    if variant == "dequant_gemm" {
                        let w = quant::dequantize(&q.weight, &q.scales, q.biases.as_ref(), spec.group_size, spec.bits, QuantMode::Affine)?;
                        return x.matmul(&w.transpose(&[1, 0])?);
                    }
                    quant::quantized_matmul(&x, &q.weight, &q.scales, q.biases.as_ref(), true, spec.group_size, spec.bits, QuantMode::Affine)
                };
                // Untimed: compiles or loads the kernels.
                let warm = weights.iter().map(product).collect::<Result<Vec<_>>>()?;
                eval(&warm.iter().collect::<Vec<_>>())?;
                let mut per_op = vec![];
                let mut host = vec![];
                for _ in 0..spec.rounds.max(1) {
                    let t0 = Instant::now();
                    let outs = (0..spec.iters).map(|i| product(&weights[i % WEIGHTS])).collect::<Result<Vec<_>>>()?;
                    let built = t0.elapsed().as_secs_f64();
                    eval(&outs.iter().collect::<Vec<_>>())?;
                    per_op.push(t0.elapsed().as_secs_f64() / spec.iters as f64);
                    host.push(built / spec.iters as f64);
                }
                per_op.sort_by(f64::total_cmp);
                host.sort_by(f64::total_cmp);
                let (t, h) = (per_op[per_op.len() / 2], host[host.len() / 2]);
                report(json!({
                    "shape": format!("{n}x{k}"), "rows": spec.rows, "bits": spec.bits, "group_size": spec.group_size,
                    "dtype": format!("{:?}", spec.dtype).to_lowercase(), "variant": variant,
                    "us_per_product": (t * 1e7).round() / 10.0,
                    "weight_gb_s": (bytes / t / 1e9 * 10.0).round() / 10.0,
                    // Building the ops alone took this share of the time: near 1, the host bounds the figure.
                    "host_share": (h / t * 100.0).round() / 100.0,
                }));
            }
        }
        Ok(())
    })();
    crate::mlx::set_cpu_int8_activations(false);
    unsafe { sys::mlex_set_ablations(restore) };
    result
}
