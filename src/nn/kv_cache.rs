//! The per-layer key/value cache of full attention: a buffer that grows in fixed steps (as
//! mlx-lm's `KVCache`), written in place with `slice_update`, read as a prefix view.
use super::cache::{Cache, Mask, SavedCache, TokenSlot, TokenStep};
use crate::error::Result;
use crate::mlx::{Array, Dtype};
use std::cell::RefCell;

/// Growth step in tokens: reallocating every token would copy the whole cache each step.
pub const KV_STEP: usize = 256;

/// The most queries of a pass that attends to whole buffers on CUDA (see [`short_pass_mask`]).
pub const SHORT_PASS: usize = 16;

/// A short pass on CUDA (2..=[`SHORT_PASS`] queries: a speculative verification, a small
/// prompt chunk) attends to the whole key/value buffers under this mask instead of to the
/// prefix views with a causal flag. MLX runs several queries through cuDNN's attention, whose
/// compiled graph is keyed on the key length: a prefix that grows by a few tokens each pass
/// built a new graph every pass (~60 ms: prompt lookup ran 5× slower than plain decoding on the
/// H200), while the buffers change length only every [`KV_STEP`] tokens. `[L, C]`, additive in
/// `dtype`: 0 where key `j` is visible to query `i` (`j <= offset + i`), -inf elsewhere (the
/// buffers' unused tail included). One mask serves every layer of a pass (memoized per thread).
fn short_pass_mask(offset: usize, queries: usize, capacity: usize, dtype: Dtype) -> Result<Array> {
    thread_local! {
        static LAST: RefCell<Option<((usize, usize, usize, Dtype), Array)>> = const { RefCell::new(None) };
    }
    let key = (offset, queries, capacity, dtype);
    if let Some(m) = LAST.with(|l| l.borrow().as_ref().filter(|(k, _)| *k == key).map(|(_, m)| m.clone())) {
        return Ok(m);
    }
    let keys = Array::arange(0.0, capacity as f64, 1.0, Dtype::Int32)?.reshape(&[1, capacity as i32])?;
    let last = Array::arange(offset as f64, (offset + queries) as f64, 1.0, Dtype::Int32)?.reshape(&[queries as i32, 1])?;
    let zero = Array::scalar_f32(0.0, dtype)?;
    let hidden = Array::scalar_f32(f32::NEG_INFINITY, dtype)?;
    let mask = Array::where_(&keys.less_equal(&last)?, &zero, &hidden)?;
    LAST.with(|l| *l.borrow_mut() = Some((key, mask.clone())));
    Ok(mask)
}

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
    let s = like.shape();
    grow_as(buf, (s[0], s[1], s[3]), like.dtype(), used, extra)
}

/// [`grow`] for tokens of `(B, H, D)` heads of `dtype`. The new length is a multiple of
/// [`KV_STEP`] (mlx-lm appends whole steps after the tokens used, which after a trim gives any
/// length): on CUDA the buffers' length keys cuDNN's compiled attention (see [`KvCache::append_whole`]).
pub(crate) fn grow_as(buf: &Option<Array>, (b, h, d): (i32, i32, i32), dtype: Dtype, used: usize, extra: usize) -> Result<Array> {
    let fresh = grown_length(used, extra) - used;
    let fresh = Array::zeros(&[b, h, fresh as i32, d], dtype)?;
    Ok(match buf {
        Some(c) => {
            let c = if used < c.dim(2) as usize { c.slice_axis(2, 0, used as i32)? } else { c.clone() };
            Array::concatenate(&[&c, &fresh], 2)?
        }
        None => fresh,
    })
}

/// The length [`grow_as`] gives buffers holding `used` tokens that need room for `extra` more.
fn grown_length(used: usize, extra: usize) -> usize {
    (used + extra).div_ceil(KV_STEP) * KV_STEP
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

/// The query count a prompt chunk of `queries` (more than [`SHORT_PASS`]) is padded to on CUDA:
/// the next multiple of [`QUERY_BUCKET`] (a chunk of the default 512 tokens: one of 8). MLX
/// sends several 16-bit queries to cuDNN's attention, whose compiled graph is keyed on the query
/// count and the key length: every prompt of a new length built a new graph, ~50 ms of its time
/// to first token on an H100 (`tests/cuda_cache_thrashing.rs` prints it), against ~2 ms for the
/// whole request of a length seen before. Padded to one of a few counts and over whole buffers
/// (a multiple of [`KV_STEP`] long), chunks reuse the graphs (BENCHMARKS.md, sixteenth session).
pub fn bucket_rows(queries: usize) -> usize {
    queries.div_ceil(QUERY_BUCKET) * QUERY_BUCKET
}

/// See [`bucket_rows`].
pub const QUERY_BUCKET: usize = 64;

/// The largest mask (padded queries × buffer length) a prompt chunk attends under on CUDA;
/// past it, the exact shapes and the causal flag. cuDNN reads the mask once per head: a
/// 32,000-token prompt (chunks of 512 over up to 32k keys) took 1.22 s with whole buffers
/// against 0.92 s at the exact shapes for the qwen3-0.6b shape, 2.33 against 1.99 s for
/// qwen2.5-7b (H100), while a graph build (~50 ms) is a small part of such a chunk. At this
/// bound (512 queries over 8,192 keys, 128 over 32,768: a chat's next turn) the reads are
/// ~0.1 ms a layer.
pub const MAX_BUCKETED_MASK: usize = 1 << 22;

/// Whether a pass of `queries` 16-bit queries over buffers `capacity` keys long attends to the
/// whole buffers under a mask on CUDA ([`KvCache::append_whole`]): short passes always, prompt
/// chunks while their mask is at most [`MAX_BUCKETED_MASK`].
pub fn attends_whole(queries: usize, capacity: usize, dtype: Dtype) -> bool {
    if queries <= SHORT_PASS {
        return queries > 1;
    }
    // (Float32 attention does not go to cuDNN: MLX computes it with its own operations.)
    dtype != Dtype::Float32 && !crate::ablation::get().cudnn_exact_shapes && bucket_rows(queries) * capacity <= MAX_BUCKETED_MASK
}

impl KvCache {
    /// Appends, then returns the whole buffers and the mask of these queries over them: a short
    /// pass's own rows ([`short_pass_mask`]), or, for more queries than [`SHORT_PASS`], the rows
    /// of its [`bucket_rows`] (rows past the chunk's own see keys as if it went on: finite).
    fn append_whole(&mut self, k: &Array, v: &Array) -> Result<(Array, Array, Mask)> {
        let (prev, queries) = (self.offset, k.dim(2) as usize);
        self.append(k, v)?;
        let (keys, values) = (self.keys.clone().unwrap(), self.values.clone().unwrap());
        let rows = if queries <= SHORT_PASS { queries } else { bucket_rows(queries) };
        let mask = short_pass_mask(prev, rows, keys.dim(2) as usize, keys.dtype())?;
        Ok((keys, values, if queries <= SHORT_PASS { Mask::Short { prev, mask } } else { Mask::Bucketed { mask } }))
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

    fn update_and_fetch_for_sdpa(&mut self, k: &Array, v: &Array) -> Result<(Array, Array, Mask)> {
        let queries = k.dim(2) as usize;
        // The buffers' length once these keys are in (`append`).
        let capacity = match &self.keys {
            Some(a) if self.offset + queries <= a.dim(2) as usize => a.dim(2) as usize,
            _ => grown_length(self.offset, queries),
        };
        if attends_whole(queries, capacity, k.dtype()) && crate::mlx::on_cuda() {
            return self.append_whole(k, v);
        }
        self.update_and_fetch(k, v)
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

    fn write_token_with(&mut self, heads: (i32, i32, i32), dtype: Dtype, step: TokenStep<'_>) -> Result<Option<Array>> {
        let prev = self.offset;
        if self.keys.as_ref().is_none_or(|k| prev + 1 > k.dim(2) as usize) {
            self.keys = Some(grow_as(&self.keys, heads, dtype, prev, 1)?);
            self.values = Some(grow_as(&self.values, heads, dtype, prev, 1)?);
        }
        let (keys, values) = (self.keys.as_ref().unwrap(), self.values.as_ref().unwrap());
        let Some((out, k, v)) = step(TokenSlot { keys, values, column: prev, positions: None, key_start: None, owned: false })? else {
            return Ok(None);
        };
        // The old buffers' last reference is now the kernel's op's: it may write them in place.
        self.keys = Some(k);
        self.values = Some(v);
        self.offset += 1;
        Ok(Some(out))
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::mlx::fast;

    /// Float32 values in [-0.5, 0.5) of `shape` from a xorshift seeded by `seed`.
    pub(crate) fn rand(shape: &[i32], seed: u64) -> Array {
        let n: i32 = shape.iter().product();
        let mut x = seed | 1;
        let v: Vec<f32> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        Array::from_slice(&v, shape).unwrap()
    }

    /// Short passes always attend to whole buffers; prompt chunks in 16-bit while their mask is
    /// at most MAX_BUCKETED_MASK elements; float32 chunks never.
    #[test]
    fn which_passes_attend_to_whole_buffers() {
        assert!(!attends_whole(1, 256, Dtype::Bfloat16));
        assert!(attends_whole(16, 32768, Dtype::Float32));
        assert!(attends_whole(300, 512, Dtype::Bfloat16));
        assert!(!attends_whole(300, 512, Dtype::Float32));
        assert!(attends_whole(512, 8192, Dtype::Float16));
        assert!(!attends_whole(512, 8448, Dtype::Float16));
        assert!(attends_whole(100, 32768, Dtype::Bfloat16));
        assert!(!attends_whole(129, 32768, Dtype::Bfloat16));
    }

    /// Attention over the whole buffers under the short-pass mask equals attention over the
    /// tokens held with the causal flag: a first chunk, a pass after a prefix, one that fills
    /// the buffer to its end, and one after a trim (stale keys past the offset stay hidden).
    /// Chunks of more than [`SHORT_PASS`] queries are padded to their bucket (40 → 64, 300 →
    /// 320), and the buffers they grow stay a multiple of [`KV_STEP`] long (221 + 40 tokens: 512,
    /// where whole steps after the tokens held would give 477).
    #[test]
    fn whole_buffers_under_the_mask_equal_the_causal_prefix() {
        let (mut whole, mut prefix) = (KvCache::new(), KvCache::new());
        let mut seed = 1;
        for (l, trim) in [(3usize, None), (250, None), (3, None), (5, Some(200usize)), (16, None), (40, None), (300, None), (17, Some(300))] {
            if let Some(n) = trim {
                whole.trim_to(n).unwrap();
                prefix.trim_to(n).unwrap();
            }
            seed += 1;
            let (k, v, q) = (rand(&[1, 2, l as i32, 8], seed), rand(&[1, 2, l as i32, 8], seed + 100), rand(&[1, 4, l as i32, 8], seed + 200));
            let (kw, vw, mw) = whole.append_whole(&k, &v).unwrap();
            let (kp, vp, mp) = prefix.update_and_fetch(&k, &v).unwrap();
            assert_eq!(kw.dim(2) as usize % KV_STEP, 0, "whole buffers");
            assert_eq!(matches!(mw, Mask::Bucketed { .. }), l > SHORT_PASS);
            let (qw, keep) = mw.pad_queries(&q).unwrap().unwrap_or((q.clone(), l as i32));
            assert_eq!(qw.dim(2) as usize, if l > SHORT_PASS { bucket_rows(l) } else { l });
            let got = fast::scaled_dot_product_attention(&qw, &kw, &vw, 0.3, mw.as_attention().unwrap()).unwrap();
            let got = got.slice_axis(2, 0, keep).unwrap();
            let want = fast::scaled_dot_product_attention(&q, &kp, &vp, 0.3, mp.as_attention().unwrap()).unwrap();
            let (g, w) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
            for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                assert!((a - b).abs() <= 1e-5, "{l} queries after {trim:?}: element {i}: {a} vs {b}");
            }
        }
    }
}
