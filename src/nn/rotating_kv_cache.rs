//! The key/value cache of a sliding-window attention layer (gemma3's local layers, gpt-oss's
//! alternate layers; mlx-lm's `RotatingKVCache`): a query at position p attends to the keys of
//! positions p-W+1..=p. Keys older than any future query can see are dropped, so memory stays
//! bounded by the window (plus a growth step) however long the conversation.
//!
//! Instead of a ring buffer written modulo W (whose reordering mlx-lm has to undo for prefill),
//! this keeps positions `start..offset` in order and drops the front when the buffer would grow:
//! the same keys reach attention, and masks are plain position comparisons.
use super::cache::{Cache, Mask, SavedCache};
use super::kv_cache::{grow, write};
use crate::error::{Error, Result};
use crate::mlx::{Array, Dtype};

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

    fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Array, Array, Mask)> {
        let l = k.dim(2) as usize;
        self.make_room(k, v, l)?;
        let prev = self.offset;
        let keys = write(self.keys.as_ref().unwrap(), k, prev - self.start)?;
        let values = write(self.values.as_ref().unwrap(), v, prev - self.start)?;
        self.offset += l;
        // The first new query (position prev) sees keys from prev+1-W on.
        let first = (prev + 1).saturating_sub(self.window).max(self.start);
        let (from, to) = ((first - self.start) as i32, (self.offset - self.start) as i32);
        let k_out = keys.slice_axis(2, from, to)?;
        let v_out = values.slice_axis(2, from, to)?;
        self.keys = Some(keys);
        self.values = Some(values);
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
