//! The key/value cache of the `max_kv_size` option: mlx-lm's `RotatingKVCache(max_size, keep=4)`
//! ported as it is, ring buffer and all, so that every query sees exactly the keys mlx-lm's does
//! (the conformance suite compares the two token for token).
//!
//! What that means (M = `max_size`, K = `keep`):
//! - a multi-token step (prefill chunks, forced tokens) puts the buffer back in temporal order,
//!   cuts it to the first K and the last M-1-K tokens, and appends the new ones; its queries get
//!   mlx-lm's causal mask with a window of M over those keys (the kept first tokens drop out of
//!   a query's window like any other: mlx-lm's mask counts columns, not positions);
//! - a one-token step (decoding) writes into the buffer in place, growing it in steps of 256 up
//!   to M, then overwriting the oldest token after the first K: it sees the first K tokens and
//!   the last M-K, with no mask.
//!
//! Memory stays bounded by M tokens (plus, during a prefill chunk of N tokens, M-1+N).
//! This differs from [`super::RotatingKvCache`], mlex's own sliding window of models trained with
//! one (gemma3's local layers), which keeps no first tokens and masks by true positions.
use super::cache::{Cache, Mask};
use super::kv_cache::{write, KV_STEP};
use crate::error::{Error, Result};
use crate::mlx::{Array, Dtype};

/// Tokens at the start that a `max_kv_size` cache always keeps (mlx-lm's `keep=4`: attention
/// sinks, "Efficient Streaming Language Models with Attention Sinks").
pub const KEEP_FIRST: usize = 4;

#[derive(Clone)]
pub struct BoundedKvCache {
    max_size: usize,
    keep: usize,
    keys: Option<Array>,
    values: Option<Array>,
    /// Tokens seen.
    offset: usize,
    /// mlx-lm's `_idx`: the next write position in the buffer.
    idx: usize,
}

/// The mask mlx-lm's `create_causal_mask(n, offset, window_size)` makes: `[n, offset + n]`, query
/// i (column offset + i) sees column j when j <= offset + i and offset + i < j + window.
pub fn causal_window_mask(n: usize, offset: usize, window: usize) -> Result<Array> {
    let q = Array::arange(offset as f64, (offset + n) as f64, 1.0, Dtype::Int32)?.reshape(&[n as i32, 1])?;
    let k = Array::arange(0.0, (offset + n) as f64, 1.0, Dtype::Int32)?.reshape(&[1, -1])?;
    let w = Array::scalar_i32(window as i32, Dtype::Int32)?;
    q.greater_equal(&k)?.logical_and(&q.less(&k.add(&w)?)?)
}

impl BoundedKvCache {
    /// A cache of at most `max_size` tokens that keeps the first `keep` (`max_size` > `keep`).
    pub fn new(max_size: usize, keep: usize) -> Self {
        let max_size = max_size.max(keep + 1);
        BoundedKvCache { max_size, keep, keys: None, values: None, offset: 0, idx: 0 }
    }

    pub fn max_size(&self) -> usize {
        self.max_size
    }

    /// Tokens held (`min(offset, max_size)`, as mlx-lm's `size()`).
    pub fn size(&self) -> usize {
        self.offset.min(self.max_size)
    }

    /// The buffer in temporal order, its unused end cut off (mlx-lm's `_temporal_order`).
    fn temporal_order(&self, v: &Array) -> Result<Array> {
        let cap = v.dim(2) as usize;
        if self.idx == cap {
            Ok(v.clone())
        } else if self.idx < self.offset {
            let parts = [(0, self.keep), (self.idx, cap), (self.keep, self.idx)];
            concat_parts(v, &parts, None)
        } else {
            v.slice_axis(2, 0, self.idx as i32)
        }
    }

    /// `v` without the `trim` tokens after the first `keep`, then `append` (mlx-lm's `_trim`).
    fn trim_front(&self, trim: usize, v: &Array, append: Option<&Array>) -> Result<Array> {
        let len = v.dim(2) as usize;
        if trim > 0 {
            concat_parts(v, &[(0, self.keep), ((trim + self.keep).min(len), len)], append)
        } else {
            concat_parts(v, &[(0, len)], append)
        }
    }

    /// A multi-token step (mlx-lm's `_update_concat`); returns the whole buffer.
    fn update_concat(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        match (&self.keys, &self.values) {
            (Some(keys), Some(values)) => {
                let keys = self.temporal_order(keys)?;
                let values = self.temporal_order(values)?;
                self.idx = keys.dim(2) as usize;
                // At most max_size - 1 + L, so that every new token sees max_size keys.
                let trim = (self.idx + 1).saturating_sub(self.max_size);
                self.keys = Some(self.trim_front(trim, &keys, Some(k))?);
                self.values = Some(self.trim_front(trim, &values, Some(v))?);
            }
            _ => {
                self.keys = Some(k.clone());
                self.values = Some(v.clone());
            }
        }
        self.offset += k.dim(2) as usize;
        let keys = self.keys.clone().expect("set above");
        self.idx = keys.dim(2) as usize;
        Ok((keys, self.values.clone().expect("set above")))
    }

    /// A one-token step (mlx-lm's `_update_in_place`).
    fn update_in_place(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        let s = k.dim(2) as usize;
        let prev = self.offset;
        let cap = self.keys.as_ref().map_or(0, |a| a.dim(2) as usize);
        if self.keys.is_none() || (prev >= cap && cap < self.max_size) {
            let new_size = KV_STEP.min(self.max_size.saturating_sub(prev)).max(s) as i32;
            let zeros = |x: &Array| {
                let sh = x.shape();
                Array::zeros(&[sh[0], sh[1], new_size, sh[3]], x.dtype())
            };
            let (nk, nv) = (zeros(k)?, zeros(v)?);
            (self.keys, self.values) = match (&self.keys, &self.values) {
                (Some(a), Some(b)) => (Some(Array::concatenate(&[a, &nk], 2)?), Some(Array::concatenate(&[b, &nv], 2)?)),
                _ => (Some(nk), Some(nv)),
            };
            self.idx = prev;
        }
        let cap = self.keys.as_ref().expect("allocated above").dim(2) as usize;
        if cap > self.max_size {
            let trim = cap - self.max_size;
            self.keys = Some(self.trim_front(trim, self.keys.as_ref().expect("allocated"), None)?);
            self.values = Some(self.trim_front(trim, self.values.as_ref().expect("allocated"), None)?);
            self.idx = self.max_size;
        }
        if self.idx == self.max_size {
            self.idx = self.keep;
        }
        let keys = write(self.keys.as_ref().expect("allocated"), k, self.idx)?;
        let values = write(self.values.as_ref().expect("allocated"), v, self.idx)?;
        self.offset += s;
        self.idx += s;
        let cap = keys.dim(2) as usize;
        let out = if self.offset < cap {
            (keys.slice_axis(2, 0, self.offset as i32)?, values.slice_axis(2, 0, self.offset as i32)?)
        } else {
            (keys.clone(), values.clone())
        };
        self.keys = Some(keys);
        self.values = Some(values);
        Ok(out)
    }
}

/// The column ranges `parts` of `v` (`[B, H, S, D]`, empty ranges skipped) and `append`, joined.
fn concat_parts(v: &Array, parts: &[(usize, usize)], append: Option<&Array>) -> Result<Array> {
    let mut pieces = vec![];
    for &(a, b) in parts {
        if b > a {
            pieces.push(v.slice_axis(2, a as i32, b as i32)?);
        }
    }
    if let Some(x) = append {
        pieces.push(x.clone());
    }
    match pieces.len() {
        0 => v.slice_axis(2, 0, 0),
        1 => Ok(pieces.pop().expect("one")),
        _ => Array::concatenate(&pieces.iter().collect::<Vec<_>>(), 2),
    }
}

impl Cache for BoundedKvCache {
    fn offset(&self) -> usize {
        self.offset
    }

    /// mlx-lm's `is_trimmable`: only while nothing was dropped yet.
    fn can_trim_to(&self, n: usize) -> bool {
        n == self.offset || (n < self.offset && self.offset < self.max_size)
    }

    fn trim_to(&mut self, n: usize) -> Result<()> {
        if !self.can_trim_to(n) {
            return Err(Error::Mlx(format!(
                "a max_kv_size cache of {} tokens that has dropped tokens cannot go back from {} to {n}",
                self.max_size, self.offset
            )));
        }
        let d = self.offset - n;
        self.offset = n;
        self.idx = self.idx.saturating_sub(d);
        Ok(())
    }

    fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Array, Array, Mask)> {
        let n = k.dim(2) as usize;
        if n == 1 {
            let (k, v) = self.update_in_place(k, v)?;
            return Ok((k, v, Mask::None));
        }
        // mlx-lm's make_mask, from the state before the update.
        let offset = (self.max_size - 1).min(self.offset);
        let mask = if offset + n > self.max_size {
            Mask::Array(causal_window_mask(n, offset, self.max_size)?)
        } else {
            Mask::Causal
        };
        let (k, v) = self.update_concat(k, v)?;
        Ok((k, v, mask))
    }

    fn state(&self) -> Vec<&Array> {
        self.keys.iter().chain(self.values.iter()).collect()
    }

    fn boxed_clone(&self) -> Box<dyn Cache> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys/values `[1, 1, n, 1]` whose values are their positions `from..from + n`.
    fn tokens(from: usize, n: usize) -> Array {
        Array::arange(from as f64, (from + n) as f64, 1.0, Dtype::Float32).unwrap().reshape(&[1, 1, n as i32, 1]).unwrap()
    }

    /// Feeds `n` tokens; returns the positions the new queries attend to (sorted) and the mask.
    fn step(c: &mut BoundedKvCache, n: usize) -> (Vec<usize>, Mask) {
        let t = tokens(c.offset(), n);
        let (k, v, mask) = c.update_and_fetch(&t, &t).unwrap();
        let keys: Vec<usize> = k.to_vec::<f32>().unwrap().into_iter().map(|x| x as usize).collect();
        assert_eq!(keys, v.to_vec::<f32>().unwrap().into_iter().map(|x| x as usize).collect::<Vec<_>>());
        let mut sorted = keys.clone();
        sorted.sort();
        (sorted, mask)
    }

    fn mask_rows(m: &Mask) -> Option<Vec<Vec<bool>>> {
        match m {
            Mask::Array(a) => {
                let cols = a.dim(1) as usize;
                Some(a.to_vec::<bool>().unwrap().chunks(cols).map(|r| r.to_vec()).collect())
            }
            _ => None,
        }
    }

    #[test]
    fn decoding_keeps_the_first_tokens_and_a_window_of_the_last() {
        let mut c = BoundedKvCache::new(8, KEEP_FIRST);
        for t in 0..30 {
            let (keys, mask) = step(&mut c, 1);
            let want: Vec<usize> = if t < 8 { (0..=t).collect() } else { (0..4).chain(t - 3..=t).collect() };
            assert_eq!(keys, want, "token {t}");
            assert!(matches!(mask, Mask::None));
            assert_eq!(c.size(), (t + 1).min(8));
        }
        // Memory stays at the window.
        assert_eq!(c.state()[0].dim(2), 8);
    }

    #[test]
    fn a_prefill_larger_than_the_window_sees_a_sliding_window_then_decoding_keeps_the_first() {
        let mut c = BoundedKvCache::new(8, KEEP_FIRST);
        let (keys, mask) = step(&mut c, 12);
        assert_eq!(keys, (0..12).collect::<Vec<_>>());
        // mlx-lm's mask: query i sees i-7..=i (the kept first tokens drop out of its window).
        let rows = mask_rows(&mask).expect("a window mask");
        for (i, row) in rows.iter().enumerate() {
            let want: Vec<bool> = (0..12).map(|j| j <= i && i < j + 8).collect();
            assert_eq!(row, &want, "query {i}");
        }
        // The next token: the first 4 and the last 4 (itself included).
        let (keys, _) = step(&mut c, 1);
        assert_eq!(keys, vec![0, 1, 2, 3, 9, 10, 11, 12]);
        assert_eq!(step(&mut c, 1).0, vec![0, 1, 2, 3, 10, 11, 12, 13]);
    }

    #[test]
    fn chunked_prefill_trims_to_the_first_tokens_and_the_window_before_each_chunk() {
        let mut c = BoundedKvCache::new(8, KEEP_FIRST);
        let (keys, mask) = step(&mut c, 6);
        assert_eq!(keys, (0..6).collect::<Vec<_>>());
        assert!(matches!(mask, Mask::Causal), "6 tokens fit the window");
        let (keys, mask) = step(&mut c, 6);
        assert_eq!(keys, (0..12).collect::<Vec<_>>());
        assert_eq!(mask_rows(&mask).expect("a window mask").len(), 6);
        // 12 held: keep 0..4 and the last 8 - 1 - 4 = 3, then the new 6.
        let (keys, mask) = step(&mut c, 6);
        assert_eq!(keys, [0, 1, 2, 3, 9, 10, 11].into_iter().chain(12..18).collect::<Vec<_>>());
        let rows = mask_rows(&mask).expect("a window mask");
        assert_eq!((rows.len(), rows[0].len()), (6, 13));
        // Decoding after it, then another chunk after rotation (temporal order restored).
        for _ in 0..5 {
            step(&mut c, 1);
        }
        assert_eq!(step(&mut c, 1).0, vec![0, 1, 2, 3, 20, 21, 22, 23]);
        let (keys, _) = step(&mut c, 3);
        assert_eq!(keys, vec![0, 1, 2, 3, 21, 22, 23, 24, 25, 26]);
    }

    #[test]
    fn trimming_works_until_tokens_were_dropped() {
        let mut c = BoundedKvCache::new(8, KEEP_FIRST);
        step(&mut c, 5);
        assert!(c.can_trim_to(3));
        c.trim_to(3).unwrap();
        assert_eq!(step(&mut c, 1).0, vec![0, 1, 2, 3]);
        step(&mut c, 6);
        assert_eq!(c.offset(), 10);
        assert!(!c.can_trim_to(9));
        assert!(c.can_trim_to(10));
        assert!(c.trim_to(9).is_err());
    }

    #[test]
    fn the_window_mask_matches_mlx_lm() {
        let m = causal_window_mask(2, 3, 3).unwrap();
        assert_eq!(m.shape(), vec![2, 5]);
        assert_eq!(m.to_vec::<bool>().unwrap(), vec![false, true, true, true, false, false, false, true, true, true]);
    }
}
