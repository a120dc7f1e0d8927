//! Block decoders: ggml tensor data → f32.
//!
//! Written from the block layouts the GGUF format documents. The arithmetic follows the order
//! of the reference dequantizers (f16 scales widened to f32, `d * q`, then `- m` / `+ m`, no fused
//! multiply-add), so results are bit-identical to the `gguf` Python package's `dequantize`.
use half::{bf16, f16};

use super::types::{GgmlType, QK_K};

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// Dequantize `bytes` (a whole number of blocks of `ty`) into `out`.
/// The caller names the tensor in the error.
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), String> {
    let bs = ty.block_size();
    let ts = ty.type_size();
    if out.len() % bs != 0 {
        return Err(format!("{} elements are not a whole number of {ty} blocks ({bs})", out.len()));
    }
    let n_blocks = out.len() / bs;
    if bytes.len() != n_blocks * ts {
        return Err(format!(
            "{} bytes of {ty} data for {} elements (expected {})",
            bytes.len(),
            out.len(),
            n_blocks * ts
        ));
    }
    let blocks = bytes.chunks_exact(ts).zip(out.chunks_exact_mut(bs));
    match ty {
        GgmlType::F32 => {
            for (b, y) in blocks {
                y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (b, y) in blocks {
                y[0] = f16_at(b, 0);
            }
        }
        GgmlType::BF16 => {
            for (b, y) in blocks {
                y[0] = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        GgmlType::Q4_0 => blocks.for_each(|(b, y)| q4_0(b, y)),
        GgmlType::Q4_1 => blocks.for_each(|(b, y)| q4_1(b, y)),
        GgmlType::Q5_0 => blocks.for_each(|(b, y)| q5_0(b, y)),
        GgmlType::Q5_1 => blocks.for_each(|(b, y)| q5_1(b, y)),
        GgmlType::Q8_0 => blocks.for_each(|(b, y)| q8_0(b, y)),
        GgmlType::Q2_K => blocks.for_each(|(b, y)| q2_k(b, y)),
        GgmlType::Q3_K => blocks.for_each(|(b, y)| q3_k(b, y)),
        GgmlType::Q4_K => blocks.for_each(|(b, y)| q4_k(b, y)),
        GgmlType::Q5_K => blocks.for_each(|(b, y)| q5_k(b, y)),
        GgmlType::Q6_K => blocks.for_each(|(b, y)| q6_k(b, y)),
        GgmlType::Q8_K => blocks.for_each(|(b, y)| q8_k(b, y)),
        other => return Err(format!("tensor type {other} cannot be dequantized (not supported)")),
    }
    Ok(())
}

/// Q4_0: f16 d, 16 bytes of nibbles; element j<16 is the low nibble of byte j, element j+16 its
/// high nibble; value = d · (q − 8).
fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = d * ((qs[j] & 0x0F) as i32 - 8) as f32;
        y[j + 16] = d * ((qs[j] >> 4) as i32 - 8) as f32;
    }
}

/// Q4_1: f16 d, f16 m, nibbles as Q4_0; value = d · q + m.
fn q4_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    for j in 0..16 {
        y[j] = d * (qs[j] & 0x0F) as f32 + m;
        y[j + 16] = d * (qs[j] >> 4) as f32 + m;
    }
}

/// Q5_0: f16 d, u32 of fifth bits (bit i belongs to element i), nibbles as Q4_0; d · (q − 16).
fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let h0 = ((qh >> j) & 1) << 4;
        let h1 = ((qh >> (j + 16)) & 1) << 4;
        y[j] = d * ((((qs[j] & 0x0F) as u32) | h0) as i32 - 16) as f32;
        y[j + 16] = d * ((((qs[j] >> 4) as u32) | h1) as i32 - 16) as f32;
    }
}

/// Q5_1: f16 d, f16 m, u32 fifth bits, nibbles; d · q + m.
fn q5_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let h0 = ((qh >> j) & 1) << 4;
        let h1 = ((qh >> (j + 16)) & 1) << 4;
        y[j] = d * (((qs[j] & 0x0F) as u32) | h0) as f32 + m;
        y[j + 16] = d * (((qs[j] >> 4) as u32) | h1) as f32 + m;
    }
}

/// Q8_0: f16 d, 32 signed bytes; q · d.
fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..32 {
        y[j] = (b[2 + j] as i8) as f32 * d;
    }
}

/// Q8_K: f32 d, 256 signed bytes, 16 i16 block sums (unused here); q · d.
fn q8_k(b: &[u8], y: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for j in 0..QK_K {
        y[j] = (b[4 + j] as i8) as f32 * d;
    }
}

/// Q2_K: 16 bytes of (min<<4 | scale) per 16 elements, 64 bytes of 2-bit values, f16 d, f16 dmin.
/// Element e: half h = e/128, shift s = 2·((e%128)/32), byte h·32 + e%32; sub-block e/16.
fn q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    for (sb, ys) in y.chunks_exact_mut(16).enumerate() {
        let sc = scales[sb];
        let dl = d * (sc & 0x0F) as f32;
        let ml = dmin * (sc >> 4) as f32;
        for (l, v) in ys.iter_mut().enumerate() {
            let e = sb * 16 + l;
            let shift = 2 * ((e % 128) / 32);
            let q = (qs[(e / 128) * 32 + e % 32] >> shift) & 3;
            *v = dl * q as f32 - ml;
        }
    }
}

/// Q3_K: 32-byte high-bit mask, 64 bytes of 2-bit low parts, 12 bytes of packed 6-bit scales,
/// f16 d. Element e: low bits as Q2_K, high bit = bit e/32 of hmask[e%32]; q = low − (hbit ? 0 : 4);
/// value = d · (scale − 32) · q, 16 scales of 16 elements each.
fn q3_k(b: &[u8], y: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let sc = &b[96..108];
    let d = f16_at(b, 108);
    for (sb, ys) in y.chunks_exact_mut(16).enumerate() {
        let low = if sb < 8 { sc[sb] & 0x0F } else { sc[sb - 8] >> 4 };
        let high = (sc[8 + sb % 4] >> (2 * (sb / 4))) & 3;
        let scale = ((low | (high << 4)) as i32 - 32) as f32;
        let dl = d * scale;
        for (l, v) in ys.iter_mut().enumerate() {
            let e = sb * 16 + l;
            let shift = 2 * ((e % 128) / 32);
            let lo = ((qs[(e / 128) * 32 + e % 32] >> shift) & 3) as i32;
            let hbit = (hmask[e % 32] >> (e / 32)) & 1;
            let q = lo - if hbit == 1 { 0 } else { 4 };
            *v = dl * q as f32;
        }
    }
}

/// The 6-bit (scale, min) pair `j` (0..8) of the 12-byte K-quant scale block.
#[inline]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Q4_K: f16 d, f16 dmin, 12 bytes of scales/mins, 128 bytes of nibbles. Per 64 elements (32 bytes):
/// the low nibbles form sub-block 2i, the high nibbles sub-block 2i+1; value = d·sc·q − dmin·m.
fn q4_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let sc = &b[4..16];
    let qs = &b[16..144];
    for i in 0..4 {
        let (s1, m1) = scale_min_k4(2 * i, sc);
        let (s2, m2) = scale_min_k4(2 * i + 1, sc);
        let (d1, mm1) = (d * s1 as f32, dmin * m1 as f32);
        let (d2, mm2) = (d * s2 as f32, dmin * m2 as f32);
        let q = &qs[i * 32..i * 32 + 32];
        let ys = &mut y[i * 64..i * 64 + 64];
        for l in 0..32 {
            ys[l] = d1 * (q[l] & 0x0F) as f32 - mm1;
            ys[l + 32] = d2 * (q[l] >> 4) as f32 - mm2;
        }
    }
}

/// Q5_K: as Q4_K plus a 32-byte high-bit array: element e's fifth bit is bit e/32 of qh[e%32].
fn q5_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let sc = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for i in 0..4 {
        let (s1, m1) = scale_min_k4(2 * i, sc);
        let (s2, m2) = scale_min_k4(2 * i + 1, sc);
        let (d1, mm1) = (d * s1 as f32, dmin * m1 as f32);
        let (d2, mm2) = (d * s2 as f32, dmin * m2 as f32);
        let q = &qs[i * 32..i * 32 + 32];
        let ys = &mut y[i * 64..i * 64 + 64];
        for l in 0..32 {
            let h1 = ((qh[l] >> (2 * i)) & 1) << 4;
            let h2 = ((qh[l] >> (2 * i + 1)) & 1) << 4;
            ys[l] = d1 * ((q[l] & 0x0F) | h1) as f32 - mm1;
            ys[l + 32] = d2 * ((q[l] >> 4) | h2) as f32 - mm2;
        }
    }
}

/// Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit high parts, 16 signed 8-bit scales, f16 d.
/// Per half of 128 elements (h): ql = 64 bytes, qh = 32 bytes; element n (0..128) of the half:
/// low nibble of ql[n%64] (n<64) or high nibble, high bits (qh[n%32] >> 2·(n/32)) & 3;
/// q = (low | high<<4) − 32; value = d · scale[e/16] · q.
fn q6_k(b: &[u8], y: &mut [f32]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let sc = &b[192..208];
    let d = f16_at(b, 208);
    for (sb, ys) in y.chunks_exact_mut(16).enumerate() {
        let dl = d * (sc[sb] as i8) as f32;
        for (l, v) in ys.iter_mut().enumerate() {
            let e = sb * 16 + l;
            let h = e / 128;
            let n = e % 128;
            let lb = ql[h * 64 + n % 64];
            let low = if n < 64 { lb & 0x0F } else { lb >> 4 };
            let high = (qh[h * 32 + n % 32] >> (2 * (n / 32))) & 3;
            let q = ((low | (high << 4)) as i32 - 32) as f32;
            *v = dl * q;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_hand_block() {
        // d = 1.0 (f16 0x3C00); byte j = j | (15-j)<<4
        let mut b = vec![0x00, 0x3C];
        for j in 0..16u8 {
            b.push(j | ((15 - j) << 4));
        }
        let mut y = [0f32; 32];
        dequantize_row(GgmlType::Q4_0, &b, &mut y).unwrap();
        for j in 0..16 {
            assert_eq!(y[j], j as f32 - 8.0);
            assert_eq!(y[j + 16], (15 - j) as f32 - 8.0);
        }
    }

    #[test]
    fn q8_0_hand_block() {
        let mut b = vec![0x00, 0x40]; // d = 2.0
        for j in 0..32i8 {
            b.push((j - 16) as u8);
        }
        let mut y = [0f32; 32];
        dequantize_row(GgmlType::Q8_0, &b, &mut y).unwrap();
        for j in 0..32 {
            assert_eq!(y[j], 2.0 * (j as f32 - 16.0));
        }
    }

    #[test]
    fn wrong_length_is_an_error() {
        let mut y = [0f32; 32];
        assert!(dequantize_row(GgmlType::Q4_0, &[0u8; 17], &mut y).is_err());
        let mut y = [0f32; 33];
        assert!(dequantize_row(GgmlType::Q4_0, &[0u8; 18], &mut y).is_err());
        assert!(dequantize_row(GgmlType::IQ2_XXS, &[0u8; 66], &mut [0f32; 256]).is_err());
    }
}
