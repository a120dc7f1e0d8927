//! The key/value cache of the `kv_bits` option: mlx-lm's `QuantizedKVCache`, entered as mlx-lm's
//! `maybe_quantize_kv_cache` does, and the attention that reads it (mlx-lm's
//! `quantized_scaled_dot_product_attention`: two `quantized_matmul`s, the keys' and the values',
//! with a precise softmax between).
//!
//! The cache starts as a plain [`KvCache`]; once it holds `start` tokens (mlx-lm's
//! `quantized_kv_start`, checked after each forward pass) its buffers are quantized (affine,
//! `bits` per element, groups of `group_size` along the head dimension) and every later token is
//! quantized as it is written. A forward pass never mixes the two: the switch happens between
//! passes, as in mlx-lm (here at the start of the next pass, which is the same state).
use super::cache::{Cache, Mask};
use super::kv_cache::{grow, write, KvCache};
use crate::error::{Error, Result};
use crate::mlx::quant::{quantize, quantized_matmul, QuantMode};
use crate::mlx::{Array, Dtype};

/// A quantized tensor as MLX packs it (affine): `[B, H, S, D·bits/32]` uint32 words, and a scale
/// and a bias per group `[B, H, S, D/group_size]`.
#[derive(Clone)]
pub struct Packed {
    pub w: Array,
    pub scales: Array,
    pub biases: Array,
}

impl Packed {
    fn quantize(x: &Array, group_size: i32, bits: i32) -> Result<Packed> {
        let q = quantize(x, group_size, bits, QuantMode::Affine)?;
        let biases = q.biases.ok_or_else(|| Error::Mlx("affine quantization returned no biases".into()))?;
        Ok(Packed { w: q.weight, scales: q.scales, biases })
    }

    fn arrays(&self) -> [&Array; 3] {
        [&self.w, &self.scales, &self.biases]
    }

    fn map(&self, f: impl Fn(&Array) -> Result<Array>) -> Result<Packed> {
        Ok(Packed { w: f(&self.w)?, scales: f(&self.scales)?, biases: f(&self.biases)? })
    }

    fn capacity(&self) -> usize {
        self.w.dim(2) as usize
    }
}

/// What a quantized cache hands its attention: the keys and values held so far, packed.
pub struct QuantizedKv {
    pub keys: Packed,
    pub values: Packed,
    pub mask: Mask,
    pub group_size: i32,
    pub bits: i32,
}

#[derive(Clone)]
pub struct QuantizedKvCache {
    group_size: i32,
    bits: i32,
    /// Tokens held before the cache switches to quantized storage.
    start: usize,
    /// The plain phase (before `start`).
    plain: KvCache,
    /// The quantized phase: keys and values.
    packed: Option<(Packed, Packed)>,
    /// Tokens seen (the quantized phase's; the plain phase counts in `plain`).
    offset: usize,
}

impl QuantizedKvCache {
    pub fn new(bits: u32, group_size: u32, start: usize) -> Self {
        QuantizedKvCache {
            group_size: group_size as i32,
            bits: bits as i32,
            start,
            plain: KvCache::new(),
            packed: None,
            offset: 0,
        }
    }

    /// Whether the keys/values are held quantized by now.
    pub fn is_quantized(&self) -> bool {
        self.packed.is_some()
    }

    fn check(&self, k: &Array, v: &Array) -> Result<()> {
        for (what, d) in [("key", k.dim(-1)), ("value", v.dim(-1))] {
            if d % self.group_size != 0 {
                return Err(Error::InvalidArgument(format!(
                    "kv_group_size {} does not divide this model's {what} head dimension {d}",
                    self.group_size
                )));
            }
        }
        Ok(())
    }

    /// Quantizes the plain buffers once they hold `start` tokens (mlx-lm's `to_quantized`, the
    /// whole buffer with its unused tail, as mlx-lm does).
    fn switch_if_due(&mut self) -> Result<()> {
        if self.packed.is_some() || self.plain.offset == 0 || self.plain.offset < self.start {
            return Ok(());
        }
        let Some((k, v)) = self.plain.arrays() else { return Ok(()) };
        let packed = (Packed::quantize(k, self.group_size, self.bits)?, Packed::quantize(v, self.group_size, self.bits)?);
        self.offset = self.plain.offset;
        self.packed = Some(packed);
        self.plain = KvCache::new();
        Ok(())
    }

    /// Appends `[B, H, L, D]` keys/values to the quantized buffers; returns everything held.
    fn append_packed(&mut self, k: &Array, v: &Array) -> Result<(Packed, Packed)> {
        let (gs, bits) = (self.group_size, self.bits);
        let (kq, vq) = (Packed::quantize(k, gs, bits)?, Packed::quantize(v, gs, bits)?);
        let prev = self.offset;
        let l = k.dim(2) as usize;
        let (pk, pv) = self.packed.as_mut().expect("quantized phase");
        if prev + l > pk.capacity() {
            let g = |buf: &Array, like: &Array| grow(&Some(buf.clone()), like, prev, l);
            *pk = Packed { w: g(&pk.w, &kq.w)?, scales: g(&pk.scales, &kq.scales)?, biases: g(&pk.biases, &kq.biases)? };
            *pv = Packed { w: g(&pv.w, &vq.w)?, scales: g(&pv.scales, &vq.scales)?, biases: g(&pv.biases, &vq.biases)? };
        }
        let put = |buf: &Packed, x: &Packed| -> Result<Packed> {
            Ok(Packed { w: write(&buf.w, &x.w, prev)?, scales: write(&buf.scales, &x.scales, prev)?, biases: write(&buf.biases, &x.biases, prev)? })
        };
        *pk = put(pk, &kq)?;
        *pv = put(pv, &vq)?;
        self.offset += l;
        let n = self.offset;
        let cut = |p: &Packed| if n < p.capacity() { p.map(|a| a.slice_axis(2, 0, n as i32)) } else { Ok(p.clone()) };
        Ok((cut(pk)?, cut(pv)?))
    }
}

impl Cache for QuantizedKvCache {
    fn offset(&self) -> usize {
        if self.packed.is_some() {
            self.offset
        } else {
            self.plain.offset
        }
    }

    fn can_trim_to(&self, _n: usize) -> bool {
        true
    }

    fn trim_to(&mut self, n: usize) -> Result<()> {
        if self.packed.is_some() {
            self.offset = self.offset.min(n);
            Ok(())
        } else {
            self.plain.trim_to(n)
        }
    }

    /// For attention that reads plain arrays only: the quantized keys/values dequantized.
    fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Array, Array, Mask)> {
        if let Some(q) = self.update_and_fetch_quantized(k, v)? {
            let deq = |p: &Packed| {
                crate::mlx::quant::dequantize(&p.w, &p.scales, Some(&p.biases), q.group_size, q.bits, QuantMode::Affine)?
                    .astype(k.dtype())
            };
            return Ok((deq(&q.keys)?, deq(&q.values)?, q.mask));
        }
        self.plain.update_and_fetch(k, v)
    }

    fn update_and_fetch_quantized(&mut self, k: &Array, v: &Array) -> Result<Option<QuantizedKv>> {
        self.check(k, v)?;
        self.switch_if_due()?;
        if self.packed.is_none() {
            return Ok(None);
        }
        let l = k.dim(2);
        let (keys, values) = self.append_packed(k, v)?;
        let mask = if l > 1 { Mask::Causal } else { Mask::None };
        Ok(Some(QuantizedKv { keys, values, mask, group_size: self.group_size, bits: self.bits }))
    }

    fn state(&self) -> Vec<&Array> {
        match &self.packed {
            Some((k, v)) => k.arrays().into_iter().chain(v.arrays()).collect(),
            None => self.plain.state(),
        }
    }

    fn boxed_clone(&self) -> Box<dyn Cache> {
        Box::new(self.clone())
    }
}

/// The most negative finite value of a float dtype (`mx.finfo(dtype).min`).
fn finfo_min(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::Float16 => -65504.0,
        // bfloat16's largest finite value, 0x7F7F (f32::MAX would round to infinity).
        Dtype::Bfloat16 => -f32::from_bits(0x7F7F_0000),
        _ => f32::MIN,
    }
}

/// mlx-lm's `quantized_scaled_dot_product_attention`: `q` `[B, Hq, L, D]` over the packed keys and
/// values of `kv` (`Hkv` heads, grouped-query heads sharing them) → `[B, Hq, L, Dv]`.
pub fn quantized_attention(q: &Array, kv: &QuantizedKv, scale: f32) -> Result<Array> {
    // MLX 0.32's CUDA backend has no quantized_matmul for most of these shapes (a key count
    // that is not a multiple of its tile, e.g. a 32,000-token prefill fails with "No
    // implementation for problem shape"): there each layer's keys and values are dequantized
    // for the product (the cache keeps them quantized; the copy lives for one layer).
    if !cfg!(target_os = "macos") && crate::mlx::default_device()? == crate::mlx::Device::Gpu {
        return attention_over_dequantized(q, kv, scale);
    }
    let s = q.shape();
    let (b, hq, l, d) = (s[0], s[1], s[2], s[3]);
    let hkv = kv.keys.w.dim(-3);
    let repeats = hq / hkv;
    let mut q = q.multiply(&Array::scalar_f32(scale, q.dtype())?)?;
    let (mut keys, mut values) = (kv.keys.clone(), kv.values.clone());
    if repeats > 1 {
        q = q.reshape(&[b, hkv, repeats, l, d])?;
        keys = keys.map(|a| a.expand_dims(-3))?;
        values = values.map(|a| a.expand_dims(-3))?;
    }
    let (gs, bits) = (kv.group_size, kv.bits);
    let mut scores = quantized_matmul(&q, &keys.w, &keys.scales, Some(&keys.biases), true, gs, bits, QuantMode::Affine)?;
    let bool_mask = match &kv.mask {
        Mask::None => None,
        Mask::Causal => {
            let kl = scores.dim(-1);
            let qi = Array::arange((kl - l) as f64, kl as f64, 1.0, Dtype::Int32)?.reshape(&[-1, 1])?;
            let ki = Array::arange(0.0, kl as f64, 1.0, Dtype::Int32)?.reshape(&[1, -1])?;
            Some(qi.greater_equal(&ki)?)
        }
        Mask::Array(m) | Mask::Short { mask: m, .. } | Mask::Bucketed { mask: m } => {
            let m = if repeats > 1 && m.ndim() > 3 { m.expand_dims(-3)? } else { m.clone() };
            if m.dtype() == Dtype::Bool {
                Some(m)
            } else {
                scores = scores.add(&m)?;
                None
            }
        }
        Mask::Padded { .. } => return Err(Error::Mlx("a quantized cache does not batch".into())),
    };
    if let Some(m) = bool_mask {
        let floor = Array::scalar_f32(finfo_min(scores.dtype()), scores.dtype())?;
        scores = Array::where_(&m, &scores, &floor)?;
    }
    let p = scores.softmax(-1, true)?;
    let out = quantized_matmul(&p, &values.w, &values.scales, Some(&values.biases), false, gs, bits, QuantMode::Affine)?;
    if repeats > 1 {
        let dv = out.dim(-1);
        out.reshape(&[b, hq, l, dv])
    } else {
        Ok(out)
    }
}

/// Attention over the dequantized keys and values (what [`quantized_attention`] computes, by
/// MLX's attention op).
pub fn attention_over_dequantized(q: &Array, kv: &QuantizedKv, scale: f32) -> Result<Array> {
    let deq = |p: &Packed| {
        crate::mlx::quant::dequantize(&p.w, &p.scales, Some(&p.biases), kv.group_size, kv.bits, QuantMode::Affine)
    };
    crate::mlx::fast::scaled_dot_product_attention(q, &deq(&kv.keys)?, &deq(&kv.values)?, scale, kv.mask.as_attention()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx::{fast, random};

    fn normal(shape: &[i32], key: &mut random::RandomKey) -> Array {
        random::normal(shape, Dtype::Float32, 1.0, &key.next().unwrap()).unwrap()
    }

    #[test]
    fn switches_to_quantized_storage_once_start_tokens_are_held() {
        let mut key = random::RandomKey::new(1).unwrap();
        let mut c = QuantizedKvCache::new(4, 32, 10);
        let kv = |n: i32, key: &mut random::RandomKey| (normal(&[1, 2, n, 64], key), normal(&[1, 2, n, 64], key));
        let (k, v) = kv(8, &mut key);
        assert!(c.update_and_fetch_quantized(&k, &v).unwrap().is_none(), "plain below start");
        c.update_and_fetch(&k, &v).unwrap();
        let (k, v) = kv(4, &mut key);
        // 8 < 10 held before this pass: still plain; 12 after it.
        assert!(c.update_and_fetch_quantized(&k, &v).unwrap().is_none());
        c.update_and_fetch(&k, &v).unwrap();
        let plain_bytes = c.nbytes();
        let (k, v) = kv(1, &mut key);
        let q = c.update_and_fetch_quantized(&k, &v).unwrap().expect("quantized from here on");
        assert!(c.is_quantized());
        assert_eq!(c.offset(), 13);
        assert_eq!(q.keys.w.shape(), vec![1, 2, 13, 64 * 4 / 32]);
        assert_eq!(q.keys.scales.shape(), vec![1, 2, 13, 2]);
        // 4 bits and a scale and a bias per 32 values: about a fifth of float32's bytes.
        assert!(c.nbytes() * 4 < plain_bytes, "{} vs {plain_bytes}", c.nbytes());
        c.trim_to(11).unwrap();
        assert_eq!(c.offset(), 11);
    }

    #[test]
    fn quantized_attention_equals_attention_over_the_dequantized_keys() {
        let mut key = random::RandomKey::new(2).unwrap();
        let (k, v) = (normal(&[1, 2, 20, 64], &mut key), normal(&[1, 2, 20, 64], &mut key));
        for l in [1, 5] {
            let q = normal(&[1, 4, l, 64], &mut key);
            let mut c = QuantizedKvCache::new(8, 64, 0);
            c.update_and_fetch(&k.slice_axis(2, 0, 20 - l).unwrap(), &v.slice_axis(2, 0, 20 - l).unwrap()).unwrap();
            let (kl, vl) = (k.slice_axis(2, 20 - l, 20).unwrap(), v.slice_axis(2, 20 - l, 20).unwrap());
            let kv = c.update_and_fetch_quantized(&kl, &vl).unwrap().expect("quantized");
            let ours = quantized_attention(&q, &kv, 0.125).unwrap();
            let deq = |p: &Packed| crate::mlx::quant::dequantize(&p.w, &p.scales, Some(&p.biases), 64, 8, QuantMode::Affine).unwrap();
            let mask = if l > 1 { fast::AttentionMask::Causal } else { fast::AttentionMask::None };
            let want = fast::scaled_dot_product_attention(&q, &deq(&kv.keys), &deq(&kv.values), 0.125, mask).unwrap();
            // The CUDA path's function computes the same.
            let cuda_path = attention_over_dequantized(&q, &kv, 0.125).unwrap();
            let d2 = cuda_path.subtract(&want).unwrap().abs().unwrap().max(&[0, 1, 2, 3], false).unwrap().item_f32().unwrap();
            assert!(d2 < 1e-6, "L={l}: dequantized path {d2}");
            let diff = ours.subtract(&want).unwrap().abs().unwrap().max(&[0, 1, 2, 3], false).unwrap().item_f32().unwrap();
            assert!(diff < 1e-4, "L={l}: {diff}");
        }
    }

    #[test]
    fn a_group_that_does_not_divide_the_head_dimension_is_an_invalid_argument() {
        let mut key = random::RandomKey::new(3).unwrap();
        let mut c = QuantizedKvCache::new(4, 64, 0);
        let k = normal(&[1, 2, 3, 32], &mut key);
        let e = c.update_and_fetch(&k, &k).err().expect("refused");
        assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("kv_group_size 64"), "{e}");
    }
}
