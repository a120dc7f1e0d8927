//! Quantization: MLX's packed formats (affine, mxfp4, mxfp8, nvfp4) and the quantized matmul.
use super::array::Array;
use super::error::check;
use super::sys;
use crate::error::{Error, Result};
use std::ffi::CString;

pub use super::quant_mode::QuantMode;

fn mode_cstr(mode: QuantMode) -> CString {
    CString::new(mode.as_str()).expect("mode names have no NUL")
}

/// A quantized weight as MLX packs it.
#[derive(Debug)]
pub struct Quantized {
    pub weight: Array,
    pub scales: Array,
    pub biases: Option<Array>,
}

/// Quantizes `w` along its last axis.
pub fn quantize(w: &Array, group_size: i32, bits: i32, mode: QuantMode) -> Result<Quantized> {
    let m = mode_cstr(mode);
    let mut outs: [sys::mlex_array; 3] = [std::ptr::null_mut(); 3];
    let mut n = 0usize;
    check(unsafe { sys::mlex_quantize(w.raw(), group_size, bits, m.as_ptr(), outs.as_mut_ptr(), &mut n) })?;
    let mut arrays: Vec<Array> = outs[..n].iter().map(|&r| Array::from_raw(r)).collect();
    if arrays.len() < 2 {
        return Err(Error::Mlx(format!("quantize returned {} arrays", arrays.len())));
    }
    let biases = if arrays.len() == 3 { arrays.pop() } else { None };
    let scales = arrays.pop().unwrap();
    let weight = arrays.pop().unwrap();
    Ok(Quantized { weight, scales, biases })
}

/// Unpacks a quantized weight back to floats.
pub fn dequantize(
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    group_size: i32,
    bits: i32,
    mode: QuantMode,
) -> Result<Array> {
    let m = mode_cstr(mode);
    Array::try_from_op(|out| unsafe {
        sys::mlex_dequantize(
            w.raw(),
            scales.raw(),
            biases.map_or(std::ptr::null_mut(), |b| b.raw()),
            group_size,
            bits,
            m.as_ptr(),
            -1,
            out,
        )
    })
}

/// `x @ dequantize(w).T` (transpose) or `x @ dequantize(w)` without materialising the weight.
#[allow(clippy::too_many_arguments)]
pub fn quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    transpose: bool,
    group_size: i32,
    bits: i32,
    mode: QuantMode,
) -> Result<Array> {
    let m = mode_cstr(mode);
    Array::try_from_op(|out| unsafe {
        sys::mlex_quantized_matmul(
            x.raw(),
            w.raw(),
            scales.raw(),
            biases.map_or(std::ptr::null_mut(), |b| b.raw()),
            transpose,
            group_size,
            bits,
            m.as_ptr(),
            out,
        )
    })
}

/// What [`quantized_matmul_fused`] applies to the product.
#[derive(Clone, Copy)]
pub enum Epilogue<'a> {
    /// `residual + x @ Wᵀ`.
    AddResidual(&'a Array),
    /// `silu(g) · u` where `x @ Wᵀ = [g, u]` (a fused gate/up projection; half the columns).
    SwiGlu,
    /// `x @ Wᵀ + bias` (the projection's own bias, `[out]`).
    AddBias(&'a Array),
}

/// `x @ dequantize(w).T` with the ops around it in a decode step: `norm` (weight, eps) first
/// normalizes x (RMSNorm), `epilogue` follows the product. One kernel on CUDA for decode rows of
/// 4-bit affine weights (the other ops cost no launch of their own), else the same ops unfused.
/// The epilogues give the unfused result bit for bit; the fused norm sums x² in its own order, so
/// it may differ from MLX's RMSNorm in the last bit of the normalized x.
#[allow(clippy::too_many_arguments)]
pub fn quantized_matmul_fused(
    x: &Array,
    norm: Option<(&Array, f32)>,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    group_size: i32,
    bits: i32,
    mode: QuantMode,
    epilogue: Option<Epilogue<'_>>,
) -> Result<Array> {
    let m = mode_cstr(mode);
    let (kind, residual) = match epilogue {
        None => (0, std::ptr::null_mut()),
        Some(Epilogue::AddResidual(r)) => (1, r.raw()),
        Some(Epilogue::SwiGlu) => (2, std::ptr::null_mut()),
        Some(Epilogue::AddBias(b)) => (3, b.raw()),
    };
    let (norm_weight, eps) = norm.map_or((std::ptr::null_mut(), 0.0), |(w, eps)| (w.raw(), eps));
    Array::try_from_op(|out| unsafe {
        sys::mlex_quantized_matmul_fused(
            x.raw(),
            norm_weight,
            eps,
            w.raw(),
            scales.raw(),
            biases.map_or(std::ptr::null_mut(), |b| b.raw()),
            group_size,
            bits,
            m.as_ptr(),
            kind,
            residual,
            out,
        )
    })
}

/// Mixture-of-experts product over quantized experts: for every index `i` of `rhs_indices`,
/// `x @ dequantize(w[i]).T` (`w` `[E, out, in·bits/32]`). `sorted` promises ascending indices
/// (MLX then walks each expert's weights once: the prefill path).
#[allow(clippy::too_many_arguments)]
pub fn gather_qmm(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    rhs_indices: &Array,
    group_size: i32,
    bits: i32,
    mode: QuantMode,
    sorted: bool,
) -> Result<Array> {
    let m = mode_cstr(mode);
    Array::try_from_op(|out| unsafe {
        sys::mlex_gather_qmm(
            x.raw(),
            w.raw(),
            scales.raw(),
            biases.map_or(std::ptr::null_mut(), |b| b.raw()),
            std::ptr::null_mut(),
            rhs_indices.raw(),
            true,
            group_size,
            bits,
            m.as_ptr(),
            sorted,
            out,
        )
    })
}
