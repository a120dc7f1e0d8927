//! The per-layer key/value cache: a buffer that grows in fixed steps (as mlx-lm's `KVCache`),
//! written in place with `slice_update`, read as a prefix view.
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

impl KvCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `[B, H, L, D]` keys/values and returns everything cached so far.
    pub fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        let prev = self.offset;
        let l = k.dim(2) as usize;
        let capacity = self.keys.as_ref().map_or(0, |a| a.dim(2) as usize);
        if self.keys.is_none() || prev + l > capacity {
            let steps = (KV_STEP + l - 1) / KV_STEP;
            let grow = |cur: &Option<Array>, like: &Array| -> Result<Array> {
                let s = like.shape();
                let fresh = Array::zeros(&[s[0], s[1], (steps * KV_STEP) as i32, s[3]], like.dtype())?;
                Ok(match cur {
                    Some(c) => {
                        let c = if prev % KV_STEP != 0 { c.slice_axis(2, 0, prev as i32)? } else { c.clone() };
                        Array::concatenate(&[&c, &fresh], 2)?
                    }
                    None => fresh,
                })
            };
            self.keys = Some(grow(&self.keys, k)?);
            self.values = Some(grow(&self.values, v)?);
        }
        self.offset += l;
        let write = |buf: &Array, x: &Array| -> Result<Array> {
            let s = buf.shape();
            buf.slice_update(x, &[0, 0, prev as i32, 0], &[s[0], s[1], self.offset as i32, s[3]])
        };
        let keys = write(self.keys.as_ref().unwrap(), k)?;
        let values = write(self.values.as_ref().unwrap(), v)?;
        let k_out = keys.slice_axis(2, 0, self.offset as i32)?;
        let v_out = values.slice_axis(2, 0, self.offset as i32)?;
        self.keys = Some(keys);
        self.values = Some(values);
        Ok((k_out, v_out))
    }

    /// Forgets everything after the first `n` tokens (prompt-cache reuse of a shared prefix).
    pub fn trim_to(&mut self, n: usize) {
        self.offset = self.offset.min(n);
    }

    /// The cached state arrays (for evaluation alongside a step's output).
    pub fn state(&self) -> Vec<&Array> {
        self.keys.iter().chain(self.values.iter()).collect()
    }

    /// Bytes held by the buffers.
    pub fn nbytes(&self) -> usize {
        self.state().iter().map(|a| a.nbytes()).sum()
    }
}
