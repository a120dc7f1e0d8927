//! MLX affine quantization: layout, packing, and the lossless GGUF block repacks.
//!
//! A quantized row of `n` values with `bits` bits and group size `g` is stored as a little-endian
//! bit stream (value k of the row at bits `k*bits ..`), viewed as `n*bits/32` u32 words, plus one
//! `scale` and one `bias` per group: `w = scale * q + bias`. For bits 2/4/8 this is MLX's "value j
//! of a u32 in bits j*bits"; for 3/5/6 bits MLX packs 8 (or 4) values into 3/5/3 bytes in the same
//! little-endian order, so one bit-stream packer covers every width.
use half::f16;

use crate::gguf::GgmlType;

pub const SUPPORTED_BITS: [u8; 6] = [2, 3, 4, 5, 6, 8];
pub const SUPPORTED_GROUPS: [u32; 3] = [32, 64, 128];

/// Little-endian bit-stream packer over a byte buffer.
pub struct BitPacker<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    nbits: u32,
}

impl<'a> BitPacker<'a> {
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        BitPacker { out, acc: 0, nbits: 0 }
    }

    #[inline]
    pub fn push(&mut self, v: u32, bits: u32) {
        self.acc |= (v as u64) << self.nbits;
        self.nbits += bits;
        while self.nbits >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.nbits -= 8;
        }
    }

    /// Flush a partial byte (never needed when rows are multiples of 32 values).
    pub fn finish(self) {
        if self.nbits > 0 {
            self.out.push(self.acc as u8);
        }
    }
}

/// Quantize one group the way MLX's `quantize` (affine mode) does: the extreme with the larger
/// magnitude ("edge") is represented exactly, zero maps to an integer when possible.
/// Returns (scale, bias) and writes the integer levels into `q`.
pub fn quantize_group(w: &[f32], bits: u32, q: &mut [u32]) -> (f32, f32) {
    let n_bins = ((1u32 << bits) - 1) as f32;
    let eps = 1e-7f32;
    let mut w_min = f32::INFINITY;
    let mut w_max = f32::NEG_INFINITY;
    for &v in w {
        w_max = w_max.max(v);
        w_min = w_min.min(v);
    }
    let mask = w_min.abs() > w_max.abs();
    let mut scale = ((w_max - w_min) / n_bins).max(eps);
    if !mask {
        scale = -scale;
    }
    let edge = if mask { w_min } else { w_max };
    let q0 = (edge / scale).round_ties_even();
    let mut bias = 0.0;
    if q0 != 0.0 {
        scale = edge / q0;
        bias = edge;
    }
    for (qi, &v) in q.iter_mut().zip(w) {
        let x = ((v - bias) / scale).round_ties_even();
        *qi = x.clamp(0.0, n_bins) as u32;
    }
    (scale, bias)
}

/// Quantize a row of f32 values: appends packed bytes to `packed`, and one scale and bias per
/// group to `scales` / `biases`.
pub fn quantize_row(
    row: &[f32],
    bits: u32,
    group: usize,
    packed: &mut Vec<u8>,
    scales: &mut Vec<f32>,
    biases: &mut Vec<f32>,
) {
    debug_assert_eq!(row.len() % group, 0);
    let mut q = vec![0u32; group];
    let mut pk = BitPacker::new(packed);
    for g in row.chunks_exact(group) {
        let (s, b) = quantize_group(g, bits, &mut q);
        scales.push(s);
        biases.push(b);
        for &v in &q {
            pk.push(v, bits);
        }
    }
    pk.finish();
}

/// Inverse of the packing, for tests and checks: unpack `n` values of `bits` bits.
pub fn unpack(packed: &[u8], bits: u32, n: usize) -> Vec<u32> {
    let mut out = Vec::with_capacity(n);
    let mut acc: u64 = 0;
    let mut nb = 0u32;
    let mut it = packed.iter();
    while out.len() < n {
        while nb < bits {
            acc |= (*it.next().expect("packed data too short") as u64) << nb;
            nb += 8;
        }
        out.push((acc & ((1u64 << bits) - 1)) as u32);
        acc >>= bits;
        nb -= bits;
    }
    out
}

/// GGUF block types that map exactly onto MLX affine groups of 32: (bits).
pub fn lossless_bits(ty: GgmlType) -> Option<u32> {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 => Some(4),
        GgmlType::Q8_0 => Some(8),
        _ => None,
    }
}

/// Scale and bias (as f32, exact) of a lossless block: Q4_0 (d, −8d), Q4_1 (d, m), Q8_0 (d, −128d).
#[inline]
pub fn lossless_scale_bias(ty: GgmlType, block: &[u8]) -> (f32, f32) {
    let d = f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32();
    match ty {
        GgmlType::Q4_0 => (d, -8.0 * d),
        GgmlType::Q4_1 => (d, f16::from_bits(u16::from_le_bytes([block[2], block[3]])).to_f32()),
        GgmlType::Q8_0 => (d, -128.0 * d),
        _ => unreachable!("not a lossless type"),
    }
}

/// Whether every scale and bias of a lossless tensor's data is exactly representable in f16
/// (d and m are f16 already; −8d and −128d can overflow f16 for huge d).
pub fn lossless_fits_f16(ty: GgmlType, data: &[u8]) -> bool {
    data.chunks_exact(ty.type_size()).all(|b| {
        let (s, bias) = lossless_scale_bias(ty, b);
        f16::from_f32(s).to_f32() == s && f16::from_f32(bias).to_f32() == bias
    })
}

/// Repack one row of Q4_0 / Q4_1 / Q8_0 blocks into MLX packed bytes (group 32) and push one
/// scale and bias per block.
pub fn repack_lossless_row(
    ty: GgmlType,
    row: &[u8],
    packed: &mut Vec<u8>,
    scales: &mut Vec<f32>,
    biases: &mut Vec<f32>,
) {
    for b in row.chunks_exact(ty.type_size()) {
        let (s, bias) = lossless_scale_bias(ty, b);
        scales.push(s);
        biases.push(bias);
        match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 => {
                let qs = if ty == GgmlType::Q4_0 { &b[2..18] } else { &b[4..20] };
                // GGUF: element j<16 = low nibble of qs[j], element 16+j = high nibble.
                // MLX: consecutive elements, low nibble first.
                for pair in 0..16 {
                    let (e0, e1) = (2 * pair, 2 * pair + 1);
                    let nib = |e: usize| if e < 16 { qs[e] & 0x0F } else { qs[e - 16] >> 4 };
                    packed.push(nib(e0) | (nib(e1) << 4));
                }
            }
            GgmlType::Q8_0 => {
                // q_mlx = q_gguf + 128 in 0..=255; w = d*q_gguf = d*q_mlx − 128d.
                packed.extend(b[2..34].iter().map(|&x| (x as i8 as i16 + 128) as u8));
            }
            _ => unreachable!("not a lossless type"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_stream_matches_u32_layout() {
        let mut p = Vec::new();
        let mut bp = BitPacker::new(&mut p);
        for v in 0..8u32 {
            bp.push(v, 4);
        }
        bp.finish();
        let w = u32::from_le_bytes([p[0], p[1], p[2], p[3]]);
        for j in 0..8 {
            assert_eq!((w >> (4 * j)) & 0xF, j);
        }
        for bits in [2u32, 3, 4, 5, 6, 8] {
            let vals: Vec<u32> = (0..64).map(|i| (i * 7 + 3) % (1 << bits)).collect();
            let mut p = Vec::new();
            let mut bp = BitPacker::new(&mut p);
            vals.iter().for_each(|&v| bp.push(v, bits));
            bp.finish();
            assert_eq!(p.len(), 64 * bits as usize / 8);
            assert_eq!(unpack(&p, bits, 64), vals);
        }
    }

    #[test]
    fn quantize_group_reconstructs_edges() {
        let w: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 0.01).collect();
        let mut q = vec![0; 64];
        let (s, b) = quantize_group(&w, 4, &mut q);
        // max magnitude edge (w_max = 0.43) is exact
        let rec: Vec<f32> = q.iter().map(|&x| s * x as f32 + b).collect();
        let err = w.iter().zip(&rec).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(err <= s.abs() / 2.0 + 1e-6, "err {err} scale {s}");
        assert!(q.iter().all(|&x| x <= 15));
    }
}
