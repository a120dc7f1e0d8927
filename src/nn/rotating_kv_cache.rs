//! The key/value cache of a sliding-window attention layer (gemma3's local layers, gpt-oss's
//! alternate layers; mlx-lm's `RotatingKVCache`): a query at position p attends to the keys of
//! positions p-W+1..=p. Keys older than any future query can see are dropped, so memory stays
//! bounded by the window (plus a growth step) however long the conversation.
//!
//! Instead of a ring buffer written modulo W (whose reordering mlx-lm has to undo for prefill),
//! this keeps positions `start..offset` in order and drops the front when the buffer would grow:
//! the same keys reach attention, and masks are plain position comparisons.
use super::cache::{Cache, Mask, SavedCache};
use super::kv_cache::{attends_whole, bucket_rows, grow, write, SHORT_PASS};
use crate::error::{Error, Result};
use crate::mlx::{Array, Dtype};
use std::cell::RefCell;

/// Tokens older than the window kept anyway, so that a short trim (a replaced forced token, a
/// prompt-cache hit a few tokens back) stays possible.
const TRIM_SLACK: usize = 64;

#[derive(Clone)]
pub struct RotatingKvCache {
    window: usize,
    keys: Option<Array>,
    values: Option<Array>,
    /// Absolute position of the buffer's first token.
    start: usize,
    /// Tokens seen.
    offset: usize,
}

impl RotatingKvCache {
    pub fn new(window: usize) -> Self {
        RotatingKvCache { window: window.max(1), keys: None, values: None, start: 0, offset: 0 }
    }

    /// Drops stored positions no query from `offset` on can see (keeping `TRIM_SLACK`), then
    /// makes room for `extra` more tokens.
    fn make_room(&mut self, k: &Array, v: &Array, extra: usize) -> Result<()> {
        let used = self.offset - self.start;
        let capacity = self.keys.as_ref().map_or(0, |a| a.dim(2) as usize);
        if self.keys.is_some() && used + extra <= capacity {
            return Ok(());
        }
        let keep_from = (self.offset + 1).saturating_sub(self.window + TRIM_SLACK).max(self.start);
        if keep_from > self.start {
            let drop = (keep_from - self.start) as i32;
            let cut = |b: &Option<Array>| -> Result<Option<Array>> {
                b.as_ref().map(|a| a.slice_axis(2, drop, used as i32)).transpose()
            };
            self.keys = cut(&self.keys)?;
            self.values = cut(&self.values)?;
            self.start = keep_from;
        }
        let used = self.offset - self.start;
        self.keys = Some(grow(&self.keys, k, used, extra)?);
        self.values = Some(grow(&self.values, v, used, extra)?);
        Ok(())
    }
}

impl RotatingKvCache {
    /// Writes `k`, `v` (`[B, H, L, D]`) after the positions held (making room first); returns
    /// the position of the first and the buffers.
    fn store(&mut self, k: &Array, v: &Array) -> Result<(usize, Array, Array)> {
        self.make_room(k, v, k.dim(2) as usize)?;
        let prev = self.offset;
        let keys = write(self.keys.as_ref().unwrap(), k, prev - self.start)?;
        let values = write(self.values.as_ref().unwrap(), v, prev - self.start)?;
        self.offset += k.dim(2) as usize;
        self.keys = Some(keys.clone());
        self.values = Some(values.clone());
        Ok((prev, keys, values))
    }

    /// Appends `k`, `v` (`[B, H, L, D]`) and returns the whole buffers with a mask of the
    /// chunk's queries over them, padded to its [`bucket_rows`] past [`SHORT_PASS`]: on CUDA,
    /// as `KvCache` does for full attention (cuDNN compiles its attention per shape; see
    /// `kv_cache::bucket_rows`). A short pass keeps its own count (2..=16: few shapes).
    fn append_whole(&mut self, k: &Array, v: &Array) -> Result<(Array, Array, Mask)> {
        let l = k.dim(2) as usize;
        let (prev, keys, values) = self.store(k, v)?;
        let rows = if l <= SHORT_PASS { l } else { bucket_rows(l) };
        let mask = window_mask(prev, l, rows, self.start, keys.dim(2) as usize, self.window, keys.dtype())?;
        Ok((keys, values, Mask::Bucketed { mask }))
    }
}

/// Additive `[rows, capacity]` in `dtype`: query i (position `prev + i`) sees buffer slot j
/// (position `start + j`) when `prev + i - window < start + j <= prev + i`; the padding rows
/// (`i >= queries`) see slot 0 only, so that none is all -inf. One mask serves every
/// sliding-window layer of a pass (memoized per thread).
fn window_mask(prev: usize, queries: usize, rows: usize, start: usize, capacity: usize, window: usize, dtype: Dtype) -> Result<Array> {
    type Key = (usize, usize, usize, usize, usize, usize, Dtype);
    thread_local! {
        static LAST: RefCell<Option<(Key, Array)>> = const { RefCell::new(None) };
    }
    let key = (prev, queries, rows, start, capacity, window, dtype);
    if let Some(m) = LAST.with(|l| l.borrow().as_ref().filter(|(k, _)| *k == key).map(|(_, m)| m.clone())) {
        return Ok(m);
    }
    let i32s = |from: usize, to: usize, shape: &[i32]| Array::arange(from as f64, to as f64, 1.0, Dtype::Int32)?.reshape(shape);
    let kpos = i32s(start, start + capacity, &[1, capacity as i32])?;
    let qpos = i32s(prev, prev + rows, &[rows as i32, 1])?;
    let w = Array::scalar_i32(window as i32, Dtype::Int32)?;
    let seen = kpos.less_equal(&qpos)?.logical_and(&qpos.less(&kpos.add(&w)?)?)?;
    let padding = i32s(0, rows, &[rows as i32, 1])?.greater_equal(&Array::scalar_i32(queries as i32, Dtype::Int32)?)?;
    let first = i32s(0, capacity, &[1, capacity as i32])?.equal(&Array::scalar_i32(0, Dtype::Int32)?)?;
    let seen = Array::where_(&padding, &first, &seen)?;
    let mask = Array::where_(&seen, &Array::scalar_f32(0.0, dtype)?, &Array::scalar_f32(f32::NEG_INFINITY, dtype)?)?;
    LAST.with(|l| *l.borrow_mut() = Some((key, mask.clone())));
    Ok(mask)
}

impl Cache for RotatingKvCache {
    fn offset(&self) -> usize {
        self.offset
    }

    fn can_trim_to(&self, n: usize) -> bool {
        // The next query (position n) needs the keys from n+1-W on.
        n <= self.offset && (self.start == 0 || (n + 1).saturating_sub(self.window) >= self.start)
    }

    fn trim_to(&mut self, n: usize) -> Result<()> {
        if !self.can_trim_to(n) {
            return Err(Error::Mlx(format!(
                "sliding-window cache holds positions {}..{}, cannot go back to {n}",
                self.start, self.offset
            )));
        }
        self.offset = n;
        Ok(())
    }

    fn update_and_fetch_for_sdpa(&mut self, k: &Array, v: &Array) -> Result<(Array, Array, Mask)> {
        let l = k.dim(2) as usize;
        // (Float32 attention never reaches cuDNN; our short-pass kernel knows no window, so
        // here short passes take the mask too.)
        if l > 1 && k.dtype() != Dtype::Float32 && crate::mlx::on_cuda() {
            self.make_room(k, v, l)?; // (then a no-op inside either path)
            let capacity = self.keys.as_ref().map_or(0, |a| a.dim(2) as usize);
            if attends_whole(l, capacity, k.dtype()) {
                return self.append_whole(k, v);
            }
        }
        self.update_and_fetch(k, v)
    }

    fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Array, Array, Mask)> {
        let l = k.dim(2) as usize;
        let (prev, keys, values) = self.store(k, v)?;
        // The first new query (position prev) sees keys from prev+1-W on.
        let first = (prev + 1).saturating_sub(self.window).max(self.start);
        let (from, to) = ((first - self.start) as i32, (self.offset - self.start) as i32);
        let k_out = keys.slice_axis(2, from, to)?;
        let v_out = values.slice_axis(2, from, to)?;
        // Causal suffices while even the last query's window reaches back to `first`.
        let mask = if l == 1 {
            Mask::None
        } else if self.offset <= first + self.window {
            Mask::Causal
        } else {
            let q = Array::arange(prev as f64, self.offset as f64, 1.0, Dtype::Int32)?.reshape(&[l as i32, 1])?;
            let kpos = Array::arange(first as f64, self.offset as f64, 1.0, Dtype::Int32)?.reshape(&[1, -1])?;
            let w = Array::scalar_i32(self.window as i32, Dtype::Int32)?;
            Mask::Array(q.greater_equal(&kpos)?.logical_and(&q.less(&kpos.add(&w)?)?)?)
        };
        Ok((k_out, v_out, mask))
    }

    fn state(&self) -> Vec<&Array> {
        self.keys.iter().chain(self.values.iter()).collect()
    }

    fn boxed_clone(&self) -> Box<dyn Cache> {
        Box::new(self.clone())
    }

    /// Kind `"rotating"`, ints `[window, start, offset]`, arrays the keys and values of
    /// positions `start..offset`.
    fn save(&self) -> Result<Option<SavedCache>> {
        let used = (self.offset - self.start) as i32;
        let held = |b: &Option<Array>| b.as_ref().filter(|_| used > 0).map(|a| a.slice_axis(2, 0, used)).transpose();
        Ok(Some(SavedCache {
            kind: "rotating".into(),
            ints: vec![self.window, self.start, self.offset],
            arrays: vec![held(&self.keys)?, held(&self.values)?],
        }))
    }

    fn restore(&mut self, saved: SavedCache) -> Result<()> {
        let fits = |k: &Array, v: &Array, used: usize| k.ndim() == 4 && k.shape() == v.shape() && k.dim(2) as usize == used;
        match (saved.kind.as_str(), saved.ints.as_slice(), saved.arrays.as_slice()) {
            ("rotating", &[w, 0, 0], [None, None]) if w == self.window => *self = RotatingKvCache::new(w),
            ("rotating", &[w, start, offset], [Some(k), Some(v)])
                if w == self.window && start < offset && fits(k, v, offset - start) =>
            {
                *self = RotatingKvCache { window: w, keys: Some(k.clone()), values: Some(v.clone()), start, offset };
            }
            _ => return Err(saved.mismatch(format!("expected a sliding-window cache of window {}", self.window))),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx::fast;
    use crate::nn::kv_cache::tests::rand;

    /// Attention over the whole buffers under the window mask, queries padded to their bucket,
    /// equals attention over the keys `update_and_fetch` returns under its own mask: chunks
    /// within the window, one that overflows it (keys dropped from the front, the slack kept),
    /// and one after a trim; short passes (4, 16 queries: not padded); a window smaller than a
    /// bucket's padding (padding rows see slot 0).
    #[test]
    fn whole_buffers_under_the_window_mask_equal_the_windowed_keys() {
        for window in [100usize, 40] {
            let (mut whole, mut windowed) = (RotatingKvCache::new(window), RotatingKvCache::new(window));
            let mut seed = window as u64;
            for (l, trim) in [(30usize, None), (4, None), (17, None), (90, None), (300, None), (20, Some(430usize)), (70, None), (16, None)] {
                if let Some(n) = trim {
                    whole.trim_to(n).unwrap();
                    windowed.trim_to(n).unwrap();
                }
                seed += 3;
                let (k, v, q) = (rand(&[1, 2, l as i32, 8], seed), rand(&[1, 2, l as i32, 8], seed + 1), rand(&[1, 4, l as i32, 8], seed + 2));
                let (kw, vw, mw) = whole.append_whole(&k, &v).unwrap();
                let (ks, vs, ms) = windowed.update_and_fetch(&k, &v).unwrap();
                assert_eq!(kw.dim(2) % 256, 0, "whole buffers");
                let (qw, keep) = mw.pad_queries(&q).unwrap().unwrap_or((q.clone(), l as i32));
                assert_eq!(qw.dim(2) as usize, if l > SHORT_PASS { bucket_rows(l) } else { l });
                let got = fast::scaled_dot_product_attention(&qw, &kw, &vw, 0.3, mw.as_attention().unwrap()).unwrap();
                let got = got.slice_axis(2, 0, keep).unwrap();
                let want = fast::scaled_dot_product_attention(&q, &ks, &vs, 0.3, ms.as_attention().unwrap()).unwrap();
                let (g, w) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
                assert_eq!(g.len(), w.len());
                for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                    assert!((a - b).abs() <= 1e-5, "window {window}, {l} queries after {trim:?}: element {i}: {a} vs {b}");
                }
                assert_eq!((whole.start, whole.offset), (windowed.start, windowed.offset));
            }
        }
    }
}
