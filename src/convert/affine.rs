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
///
/// - Q4_0 `d·(q−8)`, Q5_0 `d·(q−16)`, Q8_0 `d·q` (q signed): scale d, bias −8d / −16d / −128d;
/// - Q4_1 / Q5_1 `d·q + m`: scale d, bias m;
/// - Q4_K / Q5_K: each sub-block of 32 is `(d·sc)·q − dmin·m` with f16 `d`, `dmin` and 6-bit
///   `sc`, `m`: scale d·sc, bias −dmin·m. Both products need at most 11 + 6 significant bits, so
///   they are exact in f32, and `scale·q + bias` rounds the same real number the reference
///   dequantizer (`d1·q − m1`) rounds: MLX's values equal GGUF's bit for bit (up to the sign of 0).
///
/// Q6_K, Q3_K and Q2_K use sub-blocks of 16 with their own scales (and Q8_K an f32 scale, whose
/// `−128d` bias is not exact), so they have no exact group-32 layout: see [`native_bits`].
pub fn lossless_bits(ty: GgmlType) -> Option<u32> {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K => Some(4),
        GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5_K => Some(5),
        GgmlType::Q8_0 => Some(8),
        _ => None,
    }
}

/// The MLX affine bit width nearest to a GGUF block type, and whether the conversion is exact
/// (a repack, [`lossless_bits`]) rather than a dequantize + re-quantize.
///
/// Q6_K → 6, Q3_K → 3, Q8_K → 8 bits. Q2_K → 3 bits, not 2: a Q2_K sub-block of 16 holds 4 levels
/// `a·q − b` with its own a and b, so an MLX group of 32 spans two different 4-level grids (up to
/// 8 distinct values); 2 bits would collapse them onto 4 levels and add more error than Q2_K
/// itself has, 3 bits (8 levels) keeps the re-quantization error well under Q2_K's own step.
pub fn native_bits(ty: GgmlType) -> Option<(u32, bool)> {
    if let Some(b) = lossless_bits(ty) {
        return Some((b, true));
    }
    match ty {
        GgmlType::Q6_K => Some((6, false)),
        GgmlType::Q3_K | GgmlType::Q2_K => Some((3, false)),
        GgmlType::Q8_K => Some((8, false)),
        _ => None,
    }
}

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// The 6-bit (scale, min) pair `j` (0..8) of the 12-byte K-quant scale block (as the dequantizer).
#[inline]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Scale and bias (as f32, exact) of each group of 32 of one lossless block, in element order:
/// one pair for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, eight for Q4_K/Q5_K.
pub fn lossless_scales_biases(ty: GgmlType, block: &[u8], mut f: impl FnMut(f32, f32)) {
    match ty {
        GgmlType::Q4_0 => {
            let d = f16_at(block, 0);
            f(d, -8.0 * d)
        }
        GgmlType::Q5_0 => {
            let d = f16_at(block, 0);
            f(d, -16.0 * d)
        }
        GgmlType::Q8_0 => {
            let d = f16_at(block, 0);
            f(d, -128.0 * d)
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 => f(f16_at(block, 0), f16_at(block, 2)),
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
            let sc = &block[4..16];
            for j in 0..8 {
                let (s, m) = scale_min_k4(j, sc);
                f(d * s as f32, -(dmin * m as f32))
            }
        }
        _ => unreachable!("not a lossless type"),
    }
}

/// Whether every scale and bias of a lossless tensor's data is exactly representable in f16
/// (d and m are f16 already; −8d, −128d can overflow f16 for huge d; the K-quant products d·sc
/// usually need more than f16's 11 significant bits).
pub fn lossless_fits_f16(ty: GgmlType, data: &[u8]) -> bool {
    let exact = |v: f32| f16::from_f32(v).to_f32() == v;
    data.chunks_exact(ty.type_size()).all(|b| {
        let mut ok = true;
        lossless_scales_biases(ty, b, |s, bias| ok &= exact(s) && exact(bias));
        ok
    })
}

/// Repack one row of lossless blocks ([`lossless_bits`]) into MLX packed bytes (group 32) and
/// push one scale and bias per group.
pub fn repack_lossless_row(
    ty: GgmlType,
    row: &[u8],
    packed: &mut Vec<u8>,
    scales: &mut Vec<f32>,
    biases: &mut Vec<f32>,
) {
    for b in row.chunks_exact(ty.type_size()) {
        lossless_scales_biases(ty, b, |s, bias| {
            scales.push(s);
            biases.push(bias);
        });
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
            GgmlType::Q5_0 | GgmlType::Q5_1 => {
                // As Q4_0/Q4_1 plus a u32 of fifth bits: bit e belongs to element e.
                let (qh_at, qs_at) = if ty == GgmlType::Q5_0 { (2, 6) } else { (4, 8) };
                let qh = u32::from_le_bytes([b[qh_at], b[qh_at + 1], b[qh_at + 2], b[qh_at + 3]]);
                let qs = &b[qs_at..qs_at + 16];
                let mut pk = BitPacker::new(packed);
                for e in 0..32 {
                    let nib = if e < 16 { qs[e] & 0x0F } else { qs[e - 16] >> 4 };
                    pk.push(nib as u32 | (((qh >> e) & 1) << 4), 5);
                }
                pk.finish();
            }
            GgmlType::Q8_0 => {
                // q_mlx = q_gguf + 128 in 0..=255; w = d*q_gguf = d*q_mlx − 128d.
                packed.extend(b[2..34].iter().map(|&x| (x as i8 as i16 + 128) as u8));
            }
            GgmlType::Q4_K => {
                // Per 64 elements (32 bytes): sub-block 2i = the low nibbles, 2i+1 = the high ones.
                let qs = &b[16..144];
                for i in 0..4 {
                    let q = &qs[i * 32..i * 32 + 32];
                    for pair in q.chunks_exact(2) {
                        packed.push((pair[0] & 0x0F) | ((pair[1] & 0x0F) << 4));
                    }
                    for pair in q.chunks_exact(2) {
                        packed.push((pair[0] >> 4) | (pair[1] & 0xF0));
                    }
                }
            }
            GgmlType::Q5_K => {
                // As Q4_K; element l of sub-block j has its fifth bit at bit j of qh[l].
                let qh = &b[16..48];
                let qs = &b[48..176];
                let mut pk = BitPacker::new(packed);
                for i in 0..4 {
                    let q = &qs[i * 32..i * 32 + 32];
                    for l in 0..32 {
                        pk.push(((q[l] & 0x0F) | (((qh[l] >> (2 * i)) & 1) << 4)) as u32, 5);
                    }
                    for l in 0..32 {
                        pk.push(((q[l] >> 4) | (((qh[l] >> (2 * i + 1)) & 1) << 4)) as u32, 5);
                    }
                }
                pk.finish();
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
