//! The per-layer key/value cache of full attention: a buffer that grows in fixed steps (as
//! mlx-lm's `KVCache`), written in place with `slice_update`, read as a prefix view.
use super::cache::{Cache, Mask, SavedCache};
use crate::error::Result;
use crate::mlx::Array;

/// Growth step in tokens: reallocating every token would copy the whole cache each step.
pub const KV_STEP: usize = 256;

/// Cloning shares the buffers (MLX arrays are immutable values): a clone can be trimmed and
/// extended without touching the original (see `generate::prompt_cache`).
#[derive(Default, Clone)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    /// Tokens stored.
    pub offset: usize,
}

/// `buf` (`[B, H, cap, D]`) with room for `extra` more tokens after its first `used`.
pub(crate) fn grow(buf: &Option<Array>, like: &Array, used: usize, extra: usize) -> Result<Array> {
    let steps = extra.div_ceil(KV_STEP);
    let s = like.shape();
    let fresh = Array::zeros(&[s[0], s[1], (steps * KV_STEP) as i32, s[3]], like.dtype())?;
    Ok(match buf {
        Some(c) => {
            let c = if used < c.dim(2) as usize { c.slice_axis(2, 0, used as i32)? } else { c.clone() };
            Array::concatenate(&[&c, &fresh], 2)?
        }
        None => fresh,
    })
}

/// Writes `x` (`[B, H, L, D]`) into `buf` at token `at`.
pub(crate) fn write(buf: &Array, x: &Array, at: usize) -> Result<Array> {
    let s = buf.shape();
    buf.slice_update(x, &[0, 0, at as i32, 0], &[s[0], s[1], at as i32 + x.dim(2), s[3]])
}

impl KvCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// A cache of its own holding `keys`/`values` (`[1, H, S, D]`, e.g. a view of a batch's
    /// row): copied into buffers of the usual growth steps, so that it keeps nothing else alive
    /// and is counted as any other cache is (the prompt cache's byte budget).
    pub fn from_arrays(keys: &Array, values: &Array) -> Result<Self> {
        let offset = keys.dim(2) as usize;
        let own = |a: &Array| write(&grow(&None, a, 0, offset.max(1))?, a, 0);
        Ok(KvCache { keys: Some(own(keys)?), values: Some(own(values)?), offset })
    }

    /// The key and value buffers (valid up to `offset`), once anything was stored.
    pub fn arrays(&self) -> Option<(&Array, &Array)> {
        Some((self.keys.as_ref()?, self.values.as_ref()?))
    }

    /// Appends `[B, H, L, D]` keys/values and returns everything cached so far.
    pub fn append(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        let prev = self.offset;
        let l = k.dim(2) as usize;
        let capacity = self.keys.as_ref().map_or(0, |a| a.dim(2) as usize);
        if self.keys.is_none() || prev + l > capacity {
            self.keys = Some(grow(&self.keys, k, prev, l)?);
            self.values = Some(grow(&self.values, v, prev, l)?);
        }
        self.offset += l;
        let keys = write(self.keys.as_ref().unwrap(), k, prev)?;
        let values = write(self.values.as_ref().unwrap(), v, prev)?;
        let k_out = keys.slice_axis(2, 0, self.offset as i32)?;
        let v_out = values.slice_axis(2, 0, self.offset as i32)?;
        self.keys = Some(keys);
        self.values = Some(values);
        Ok((k_out, v_out))
    }
}

impl Cache for KvCache {
    fn offset(&self) -> usize {
        self.offset
    }

    fn can_trim_to(&self, _n: usize) -> bool {
        true
    }

    fn trim_to(&mut self, n: usize) -> Result<()> {
        self.offset = self.offset.min(n);
        Ok(())
    }

    fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Array, Array, Mask)> {
        let queries = k.dim(2);
        let (k, v) = self.append(k, v)?;
        // A single query attends to everything cached; several need the causal mask (MLX aligns
        // it to the end of the keys, so cached prefixes are handled).
        Ok((k, v, if queries > 1 { Mask::Causal } else { Mask::None }))
    }

    fn state(&self) -> Vec<&Array> {
        self.keys.iter().chain(self.values.iter()).collect()
    }

    fn as_kv(&self) -> Option<&KvCache> {
        Some(self)
    }

    /// Kind `"kv"`, ints `[offset]`, arrays the keys and values of the tokens held.
    fn save(&self) -> Result<Option<SavedCache>> {
        let held = |b: &Option<Array>| b.as_ref().filter(|_| self.offset > 0).map(|a| a.slice_axis(2, 0, self.offset as i32)).transpose();
        Ok(Some(SavedCache { kind: "kv".into(), ints: vec![self.offset], arrays: vec![held(&self.keys)?, held(&self.values)?] }))
    }

    fn restore(&mut self, saved: SavedCache) -> Result<()> {
        match (saved.kind.as_str(), saved.ints.as_slice(), saved.arrays.as_slice()) {
            ("kv", [0], [None, None]) => *self = KvCache::new(),
            ("kv", &[n], [Some(k), Some(v)]) if k.ndim() == 4 && k.shape() == v.shape() && k.dim(2) as usize == n => {
                *self = KvCache::from_arrays(k, v)?;
            }
            _ => return Err(saved.mismatch("expected a key/value cache: keys and values [B, H, offset, D]")),
        }
        Ok(())
    }

    fn boxed_clone(&self) -> Box<dyn Cache> {
        Box::new(self.clone())
    }
}
