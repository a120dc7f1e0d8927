//! Key/value caches of a continuous batch: the rows of several requests in one `[B, H, S, D]`
//! buffer per layer, so that one decode step runs every request's token through each weight
//! matrix once (mlx-lm's `BatchKVCache`). Rows are right-aligned: all write their next token in
//! the same column, and a row with a shorter history is padded on the left. Each step the batch
//! tells every layer where each row stands (its rope position) and where its keys start (the
//! attention mask), computed once per step rather than once per layer.
//!
//! A request joins with the batch-1 caches its own prefill filled (left-padding it or the batch
//! to a common length) and leaves with its row cut back out, so the prompt cache keeps working
//! on single-request caches.
use super::cache::{Cache, LayerCaches, Mask, TokenSlot, TokenStep};
use super::kv_cache::{grow, grow_as, write, KvCache};
use crate::error::{Error, Result};
use crate::mlx::{Array, Dtype};

/// One layer's keys/values of a batch. Row b holds its tokens in columns `pad[b]..used`.
pub struct BatchKvCache {
    keys: Array,
    values: Array,
    /// Columns written (the same for every row).
    used: usize,
    /// This step's rope position of each row's first new token (int32 `[B]`).
    positions: Option<Array>,
    /// This step's first visible key of each row (int32 `[B]`; None: no row is padded).
    key_start: Option<Array>,
    /// This decode step's boolean mask `[B, 1, 1, used + 1]` (GPU only: one array for every layer,
    /// where the padded attention op would build it again in each layer; the CPU's attention
    /// kernel reads `key_start` directly).
    step_mask: Option<Array>,
    /// Whether `keys` and `values` are buffers this cache made itself (`write_token_with`'s
    /// growth: fresh, row contiguous, shared with no other array), which a kernel may then
    /// write in place (`Attention`'s CUDA decode step). Any other assignment, and a clone
    /// (which shares the buffers), clears it.
    owned: bool,
}

impl Clone for BatchKvCache {
    fn clone(&self) -> Self {
        BatchKvCache {
            keys: self.keys.clone(),
            values: self.values.clone(),
            used: self.used,
            positions: self.positions.clone(),
            key_start: self.key_start.clone(),
            step_mask: self.step_mask.clone(),
            owned: false,
        }
    }
}

/// `x` (`[B, H, S, D]`) with `n` zero columns before its first `len` ones.
fn pad_left(x: &Array, len: usize, n: usize) -> Result<Array> {
    let x = x.slice_axis(2, 0, len as i32)?;
    if n == 0 {
        return Ok(x);
    }
    let s = x.shape();
    let zeros = Array::zeros(&[s[0], s[1], n as i32, s[3]], x.dtype())?;
    Array::concatenate(&[&zeros, &x], 2)
}

impl BatchKvCache {
    /// Columns `from..used` of row `row`, as a single request's cache.
    fn row(&self, row: usize, from: usize) -> Result<KvCache> {
        let r = row as i32;
        let cut = |a: &Array| a.slice_axis(0, r, r + 1)?.slice_axis(2, from as i32, self.used as i32);
        KvCache::from_arrays(&cut(&self.keys)?, &cut(&self.values)?)
    }
}

impl Cache for BatchKvCache {
    fn offset(&self) -> usize {
        self.used
    }

    fn can_trim_to(&self, n: usize) -> bool {
        n == self.used
    }

    fn trim_to(&mut self, n: usize) -> Result<()> {
        if n == self.used {
            Ok(())
        } else {
            Err(Error::Mlx("a batch's cache is trimmed row by row (leave the batch first)".into()))
        }
    }

    fn positions(&self) -> Option<&Array> {
        self.positions.as_ref()
    }

    fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Array, Array, Mask)> {
        let l = k.dim(2) as usize;
        let capacity = self.keys.dim(2) as usize;
        if self.used + l > capacity {
            self.keys = grow(&Some(self.keys.clone()), k, self.used, l)?;
            self.values = grow(&Some(self.values.clone()), v, self.used, l)?;
        }
        self.keys = write(&self.keys, k, self.used)?;
        self.values = write(&self.values, v, self.used)?;
        self.owned = false;
        self.used += l;
        let end = self.used as i32;
        let mask = match (&self.key_start, &self.step_mask) {
            (Some(_), Some(m)) if l == 1 && m.dim(-1) as usize == self.used => Mask::Array(m.clone()),
            (Some(start), _) => Mask::Padded { key_start: start.clone(), causal: l > 1 },
            (None, _) if l > 1 => Mask::Causal,
            (None, _) => Mask::None,
        };
        Ok((self.keys.slice_axis(2, 0, end)?, self.values.slice_axis(2, 0, end)?, mask))
    }

    fn write_token_with(&mut self, heads: (i32, i32, i32), dtype: Dtype, step: TokenStep<'_>) -> Result<Option<Array>> {
        if self.used + 1 > self.keys.dim(2) as usize || !self.owned {
            self.keys = grow_as(&Some(self.keys.clone()), heads, dtype, self.used, 1)?;
            self.values = grow_as(&Some(self.values.clone()), heads, dtype, self.used, 1)?;
            self.owned = true;
        }
        let slot = TokenSlot {
            keys: &self.keys,
            values: &self.values,
            column: self.used,
            positions: self.positions.as_ref(),
            key_start: self.key_start.as_ref(),
            owned: true,
        };
        let Some((out, k, v)) = step(slot)? else { return Ok(None) };
        // The old buffers' last reference is now the kernel's op's: it may write them in place.
        self.keys = k;
        self.values = v;
        self.used += 1;
        Ok(Some(out))
    }

    fn state(&self) -> Vec<&Array> {
        vec![&self.keys, &self.values]
    }

    fn as_batch(&mut self) -> Option<&mut BatchKvCache> {
        Some(self)
    }

    fn boxed_clone(&self) -> Box<dyn Cache> {
        Box::new(self.clone())
    }
}

/// The caches of every layer of a batch, and where each row starts.
pub struct BatchCaches {
    caches: LayerCaches,
    /// Left padding of each row (columns before its first token).
    pads: Vec<usize>,
}

impl BatchCaches {
    /// A batch of one: `row`'s caches (every layer a [`KvCache`]: see [`LayerCaches::batchable`]).
    pub fn new(row: &LayerCaches) -> Result<Self> {
        let caches = row
            .0
            .iter()
            .map(|c| {
                let kv = c.as_kv().ok_or_else(|| Error::Mlx("only key/value caches batch".into()))?;
                let (k, v) = kv.arrays().ok_or_else(|| Error::Mlx("a request joins a batch after its prefill".into()))?;
                let used = kv.offset;
                Ok(Box::new(BatchKvCache {
                    keys: k.slice_axis(2, 0, used as i32)?,
                    values: v.slice_axis(2, 0, used as i32)?,
                    used,
                    positions: None,
                    key_start: None,
                    step_mask: None,
                    owned: false,
                }) as Box<dyn Cache>)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(BatchCaches { caches: LayerCaches(caches), pads: vec![0] })
    }

    pub fn rows(&self) -> usize {
        self.pads.len()
    }

    /// Columns in use (the longest row's tokens).
    pub fn used(&self) -> usize {
        self.caches.offset()
    }

    /// Adds `row`'s caches as the last row. The shorter side is padded on the left.
    pub fn join(&mut self, row: &LayerCaches) -> Result<()> {
        if row.len() != self.caches.len() {
            return Err(Error::Mlx(format!("{} caches joining a batch of {} layers", row.len(), self.caches.len())));
        }
        let (used, len) = (self.used(), row.offset());
        let total = used.max(len);
        for (mine, theirs) in self.caches.iter_mut().zip(row.0.iter()) {
            let b = mine.as_batch().ok_or_else(|| Error::Mlx("not a batch cache".into()))?;
            let kv = theirs.as_kv().ok_or_else(|| Error::Mlx("only key/value caches batch".into()))?;
            let (k, v) = kv.arrays().ok_or_else(|| Error::Mlx("a request joins a batch after its prefill".into()))?;
            let k = pad_left(k, len, total - len)?;
            let v = pad_left(v, len, total - len)?;
            b.keys = Array::concatenate(&[&pad_left(&b.keys, used, total - used)?, &k], 0)?;
            b.values = Array::concatenate(&[&pad_left(&b.values, used, total - used)?, &v], 0)?;
            b.owned = false;
            b.used = total;
        }
        for p in &mut self.pads {
            *p += total - used;
        }
        self.pads.push(total - len);
        Ok(())
    }

    /// Row `row`'s caches as a single request's (its padding dropped), in buffers of their own.
    pub fn extract(&self, row: usize) -> Result<LayerCaches> {
        let pad = self.pads[row];
        let caches = self
            .caches
            .0
            .iter()
            .map(|c| {
                let mut c = c.boxed_clone();
                let b = c.as_batch().expect("a batch holds batch caches");
                Ok(Box::new(b.row(row, pad)?) as Box<dyn Cache>)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(LayerCaches(caches))
    }

    /// Keeps the rows `keep` (in that order), dropping the columns no kept row needs.
    pub fn retain(&mut self, keep: &[usize]) -> Result<()> {
        if keep.is_empty() {
            return Err(Error::Mlx("a batch keeps at least one row".into()));
        }
        let trim = keep.iter().map(|&r| self.pads[r]).min().unwrap_or(0);
        let used = self.used();
        let idx: Vec<i32> = keep.iter().map(|&r| r as i32).collect();
        let idx = Array::from_slice(&idx, &[idx.len() as i32])?;
        let all = keep.len() == self.rows() && keep.iter().enumerate().all(|(i, &r)| i == r);
        for c in self.caches.iter_mut() {
            let b = c.as_batch().ok_or_else(|| Error::Mlx("not a batch cache".into()))?;
            let cut = |a: &Array| -> Result<Array> {
                let a = if all { a.clone() } else { a.take(&idx, 0)? };
                if trim > 0 {
                    a.slice_axis(2, trim as i32, used as i32)
                } else {
                    Ok(a)
                }
            };
            b.keys = cut(&b.keys)?;
            b.values = cut(&b.values)?;
            b.owned = false;
            b.used = used - trim;
        }
        self.pads = keep.iter().map(|&r| self.pads[r] - trim).collect();
        Ok(())
    }

    /// Tells every layer where each row stands for the next step; returns the caches to run it on.
    pub fn for_step(&mut self) -> Result<&mut LayerCaches> {
        let used = self.used();
        let pos: Vec<i32> = self.pads.iter().map(|&p| (used - p) as i32).collect();
        let positions = Array::from_slice(&pos, &[pos.len() as i32])?;
        let key_start = if self.pads.iter().any(|&p| p > 0) {
            let s: Vec<i32> = self.pads.iter().map(|&p| p as i32).collect();
            Some(Array::from_slice(&s, &[s.len() as i32])?)
        } else {
            None
        };
        let step_mask = match &key_start {
            Some(_) if crate::mlx::default_device()? == crate::mlx::Device::Gpu => {
                let s = used + 1;
                let mut m = vec![false; self.pads.len() * s];
                for (row, &p) in m.chunks_mut(s).zip(&self.pads) {
                    row[p..].fill(true);
                }
                Some(Array::from_slice(&m, &[self.pads.len() as i32, 1, 1, s as i32])?)
            }
            _ => None,
        };
        for c in self.caches.iter_mut() {
            let b = c.as_batch().ok_or_else(|| Error::Mlx("not a batch cache".into()))?;
            b.positions = Some(positions.clone());
            b.key_start = key_start.clone();
            b.step_mask = step_mask.clone();
        }
        Ok(&mut self.caches)
    }

    /// The state arrays of every layer (evaluated with each step).
    pub fn state(&self) -> Vec<&Array> {
        self.caches.state()
    }

    pub fn nbytes(&self) -> usize {
        self.caches.nbytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx::Dtype;

    /// A kernel may write a batch's buffers in place only while the batch made them itself: after
    /// its own growth, not after an append through MLX's ops, and never in a clone (which shares
    /// them). The slot a writer gets says so, and the batch keeps the arrays the writer returns.
    #[test]
    fn only_buffers_the_batch_made_itself_are_handed_out_for_writing_in_place() {
        let token = |v: f32| Array::full(&[1, 1, 1, 2], v, Dtype::Float32).unwrap();
        let mut solo = KvCache::new();
        solo.update_and_fetch(&token(1.0), &token(1.0)).unwrap();
        let mut batch = BatchCaches::new(&LayerCaches(vec![Box::new(solo)])).unwrap();
        let caches = batch.for_step().unwrap();
        let layer = caches.iter_mut().next().unwrap();
        let seen = std::cell::RefCell::new(vec![]);
        let mut step = |slot: TokenSlot| -> Result<Option<(Array, Array, Array)>> {
            seen.borrow_mut().push((slot.owned, slot.column));
            Ok(Some((token(0.0), slot.keys.clone(), slot.values.clone())))
        };
        // Joined from a request's cache (views of it): the batch grows its own buffers first.
        assert!(layer.write_token_with((1, 1, 2), Dtype::Float32, &mut step).unwrap().is_some());
        assert!(layer.write_token_with((1, 1, 2), Dtype::Float32, &mut step).unwrap().is_some());
        assert_eq!(*seen.borrow(), vec![(true, 1), (true, 2)]);
        assert_eq!(layer.offset(), 3);
        // A clone shares the buffers: neither may be written in place until it grows its own.
        let b = layer.as_batch().unwrap();
        let clone = b.clone();
        assert!(!clone.owned);
        // An append through MLX's ops gives arrays the batch did not make for writing.
        b.update_and_fetch(&token(2.0), &token(2.0)).unwrap();
        assert!(!b.owned);
        seen.borrow_mut().clear();
        assert!(layer.write_token_with((1, 1, 2), Dtype::Float32, &mut step).unwrap().is_some());
        assert_eq!(*seen.borrow(), vec![(true, 4)]);
    }
}
