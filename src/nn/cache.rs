//! What a layer keeps between steps, behind one trait: the engine, the decode loop and the
//! prompt cache handle every kind alike (growing KV, sliding-window KV, and — for the hybrid
//! models to come — recurrent state), and the attention mask comes from the cache (mlx-lm's
//! `create_attention_mask` / `cache.make_mask`), since only the cache knows which keys it holds.
use crate::error::{Error, Result};
use crate::mlx::fast::AttentionMask;
use super::quantized_kv_cache::QuantizedKv;
use super::{BatchKvCache, BoundedKvCache, KvCache, QuantizedKvCache, RotatingKvCache, StateCache};
use crate::mlx::{Array, Dtype};

/// The mask a layer's queries need over the keys its cache returned.
pub enum Mask {
    /// Every query sees every key (one query over a full-attention cache).
    None,
    /// Causal, aligned to the end of the keys (MLX's "causal" mode: cached prefixes work).
    Causal,
    /// An explicit boolean `[L, S]` mask (sliding windows).
    Array(Array),
    /// A left-padded batch (continuous batching): row b sees no key before `key_start[b]`
    /// (int32 `[B]`), and with `causal` no key after its own position either.
    Padded { key_start: Array, causal: bool },
    /// A short pass over a cache's whole buffers (`nn::kv_cache`): query i sees keys
    /// `0 ..= prev + i`, which `mask` (additive `[L, C]`) spells out for MLX's attention.
    Short { prev: usize, mask: Array },
    /// A prompt chunk over a cache's whole buffers on CUDA (`nn::kv_cache`): as `Short`, for
    /// `mask.dim(0)` queries, a bucket at least the chunk's own count. The caller pads the
    /// queries with rows of zeros to that count and drops their outputs ([`Mask::pad_queries`]).
    Bucketed { mask: Array },
}

impl Mask {
    /// The mask as MLX's attention takes it (`Padded` has its own op: see `nn::attention`).
    pub fn as_attention(&self) -> Result<AttentionMask<'_>> {
        match self {
            Mask::None => Ok(AttentionMask::None),
            Mask::Causal => Ok(AttentionMask::Causal),
            Mask::Array(a) | Mask::Short { mask: a, .. } | Mask::Bucketed { mask: a } => Ok(AttentionMask::Array(a)),
            Mask::Padded { .. } => Err(Error::Mlx("a padded batch's mask needs the padded attention op".into())),
        }
    }

    /// `q` (`[B, H, L, D]`) with rows of zeros up to a bucketed mask's query count, and the
    /// count of its own rows to keep of the attention's output; None where nothing is padded
    /// (any other mask, or a chunk already of its bucket's count).
    pub fn pad_queries(&self, q: &Array) -> Result<Option<(Array, i32)>> {
        let Mask::Bucketed { mask } = self else { return Ok(None) };
        let (l, rows) = (q.dim(2), mask.dim(0));
        if rows == l {
            return Ok(None);
        }
        let s = q.shape();
        let zeros = Array::zeros(&[s[0], s[1], rows - l, s[3]], q.dtype())?;
        Ok(Some((Array::concatenate(&[q, &zeros], 2)?, l)))
    }
}

/// What a kernel that writes a decode step's keys and values itself is given: the `[B, H, C, D]`
/// key and value buffers, the column the token goes into, each row's rope position (None: the
/// column, for every row), each row's first visible key (None: the first), and whether the
/// buffers are the cache's own (row contiguous, shared with no other array), so that the kernel
/// may write them in place and hand the same arrays back.
pub struct TokenSlot<'a> {
    pub keys: &'a Array,
    pub values: &'a Array,
    pub column: usize,
    pub positions: Option<&'a Array>,
    pub key_start: Option<&'a Array>,
    pub owned: bool,
}

/// Such a kernel: the step's output and the buffers after its write, or None where it declines.
pub type TokenStep<'a> = &'a mut dyn FnMut(TokenSlot) -> Result<Option<(Array, Array, Array)>>;

/// One layer's state.
pub trait Cache {
    /// Tokens seen (positions consumed).
    fn offset(&self) -> usize;

    /// Whether [`Cache::trim_to`] can bring the state back to exactly the first `n` tokens.
    fn can_trim_to(&self, n: usize) -> bool;

    /// Forgets everything after the first `n` tokens (prompt-cache reuse of a shared prefix,
    /// a replaced forced token). Callers check [`Cache::can_trim_to`] first.
    fn trim_to(&mut self, n: usize) -> Result<()>;

    /// Appends `[B, Hkv, L, D]` keys/values; returns the keys/values the new queries attend to
    /// and the mask they need. Only attention caches implement it.
    fn update_and_fetch(&mut self, _k: &Array, _v: &Array) -> Result<(Array, Array, Mask)> {
        Err(Error::Mlx("this layer's cache holds no keys/values".into()))
    }

    /// [`Cache::update_and_fetch`] for MLX's fused attention op only: the keys/values may be
    /// longer than the tokens held (whole buffers) with a mask that hides the rest, where that
    /// keeps the op's shapes stable for MLX's kernels (see `nn::kv_cache`).
    fn update_and_fetch_for_sdpa(&mut self, k: &Array, v: &Array) -> Result<(Array, Array, Mask)> {
        self.update_and_fetch(k, v)
    }

    /// A cache that holds its keys/values quantized (`kv_bits`: see `nn::quantized_kv_cache`)
    /// appends `[B, Hkv, L, D]` keys/values and returns them packed, for attention by quantized
    /// matmuls. None (nothing appended): this cache returns plain arrays ([`Cache::update_and_fetch`]).
    fn update_and_fetch_quantized(&mut self, _k: &Array, _v: &Array) -> Result<Option<QuantizedKv>> {
        Ok(None)
    }

    /// The rope position of each row's first new token (int32 `[B]`) when the rows of a batch
    /// stand at different positions (continuous batching); None: all at [`Cache::offset`].
    fn positions(&self) -> Option<&Array> {
        None
    }

    /// The state arrays (evaluated alongside a step's output, counted for the pool's budget).
    fn state(&self) -> Vec<&Array>;

    /// Whether this is a recurrent state, which can never be taken back (only to what it holds).
    fn is_recurrent(&self) -> bool {
        false
    }

    /// The recurrent state, for the layers that keep one (see [`StateCache`]).
    fn as_state(&mut self) -> Option<&mut StateCache> {
        None
    }

    /// A plain growing key/value cache (the kind that can join a continuous batch).
    fn as_kv(&self) -> Option<&KvCache> {
        None
    }

    /// A decode step whose kernel writes the token's key and value into the buffers itself
    /// (`Attention`'s CPU and CUDA decode kernels): the cache makes room for one more column of
    /// `heads` (`(B, H, D)`) of `dtype`, hands `step` the buffers, and keeps the buffers `step`
    /// returns with the step's output. None (a cache that does not take such writes, or `step`
    /// declined): nothing is stored, and the caller goes through `update_and_fetch`.
    fn write_token_with(&mut self, _heads: (i32, i32, i32), _dtype: Dtype, _step: TokenStep<'_>) -> Result<Option<Array>> {
        Ok(None)
    }

    /// A continuous batch's cache (see `nn::batch_kv_cache`).
    fn as_batch(&mut self) -> Option<&mut BatchKvCache> {
        None
    }

    /// This cache as `Any`, for the kinds a model reaches past the trait (a vision model's
    /// multimodal rope positions: `models::mrope`); None for the others.
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }

    /// A copy sharing the arrays (MLX arrays are immutable values: writes to the copy never
    /// reach the original; see `generate::prompt_cache`).
    fn boxed_clone(&self) -> Box<dyn Cache>;

    /// Bytes held.
    fn nbytes(&self) -> usize {
        self.state().iter().map(|a| a.nbytes()).sum()
    }

    /// This layer's state as the disk prompt cache writes it (`generate::prompt_disk`); None for
    /// the kinds it does not persist (quantized, bounded and batch caches: never pooled).
    fn save(&self) -> Result<Option<SavedCache>> {
        Ok(None)
    }

    /// Takes `saved` (as [`Cache::save`] gave it) into this fresh cache of the same kind; a kind,
    /// window or slot count that differs from this cache's is an error.
    fn restore(&mut self, saved: SavedCache) -> Result<()> {
        Err(Error::Mlx(format!("a {} cache cannot be restored into this layer's cache", saved.kind)))
    }
}

/// One layer's state as the disk prompt cache stores it: its kind (`"kv"`, `"rotating"`,
/// `"state"`), the integers that kind needs (offsets, window) and its arrays (None: an empty slot).
pub struct SavedCache {
    pub kind: String,
    pub ints: Vec<usize>,
    pub arrays: Vec<Option<Array>>,
}

impl SavedCache {
    /// The error of a saved state that does not fit the cache it is restored into.
    pub fn mismatch(&self, what: impl std::fmt::Display) -> Error {
        Error::Mlx(format!("saved {} cache {:?} does not fit this layer: {what}", self.kind, self.ints))
    }
}

/// mlx-lm's generate-time cache options (`max_kv_size`, `kv_bits`), for the layers that would
/// otherwise hold a plain growing [`KvCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCacheKind {
    /// At most `max_size` tokens, the first `keep` always among them ([`BoundedKvCache`]).
    Bounded { max_size: usize, keep: usize },
    /// Quantized to `bits` in groups of `group_size` once `start` tokens are held ([`QuantizedKvCache`]).
    Quantized { bits: u32, group_size: u32, start: usize },
}

impl KvCacheKind {
    /// An empty cache of this kind.
    pub fn make(self) -> Box<dyn Cache> {
        match self {
            KvCacheKind::Bounded { max_size, keep } => Box::new(BoundedKvCache::new(max_size, keep)),
            KvCacheKind::Quantized { bits, group_size, start } => Box::new(QuantizedKvCache::new(bits, group_size, start)),
        }
    }
}

/// The caches of every layer of a model, in layer order.
pub struct LayerCaches(pub Vec<Box<dyn Cache>>);

impl Clone for LayerCaches {
    fn clone(&self) -> Self {
        LayerCaches(self.0.iter().map(|c| c.boxed_clone()).collect())
    }
}

impl LayerCaches {
    /// One cache per layer from each layer's attention window: `None` a growing [`KvCache`]
    /// (full attention), `Some(w)` a [`RotatingKvCache`] of window `w` (sliding attention).
    pub fn for_windows(windows: impl IntoIterator<Item = Option<usize>>) -> Self {
        LayerCaches(
            windows
                .into_iter()
                .map(|w| match w {
                    Some(w) => Box::new(RotatingKvCache::new(w)) as Box<dyn Cache>,
                    None => Box::new(KvCache::new()) as Box<dyn Cache>,
                })
                .collect(),
        )
    }

    /// Every layer that holds a plain [`KvCache`] given an empty cache of `kind` instead (the
    /// others, sliding windows and recurrent states, are kept).
    pub fn with_kind(self, kind: KvCacheKind) -> Self {
        LayerCaches(self.0.into_iter().map(|c| if c.as_kv().is_some() { kind.make() } else { c }).collect())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Tokens held (every layer holds the same number).
    pub fn offset(&self) -> usize {
        self.0.first().map_or(0, |c| c.offset())
    }

    pub fn can_trim_to(&self, n: usize) -> bool {
        self.0.iter().all(|c| c.can_trim_to(n))
    }

    /// Whether any layer keeps a recurrent state (a hybrid or state-space model).
    pub fn has_recurrent_state(&self) -> bool {
        self.0.iter().any(|c| c.is_recurrent())
    }

    /// Whether these caches can join a continuous batch (every layer a plain key/value cache).
    pub fn batchable(&self) -> bool {
        !self.0.is_empty() && self.0.iter().all(|c| c.as_kv().is_some())
    }

    pub fn trim_to(&mut self, n: usize) -> Result<()> {
        for c in &mut self.0 {
            c.trim_to(n)?;
        }
        Ok(())
    }

    pub fn state(&self) -> Vec<&Array> {
        self.0.iter().flat_map(|c| c.state()).collect()
    }

    pub fn nbytes(&self) -> usize {
        self.0.iter().map(|c| c.nbytes()).sum()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Box<dyn Cache>> {
        self.0.iter_mut()
    }

    /// Every layer's state for the disk prompt cache; None when a layer's kind is not persisted.
    pub fn save(&self) -> Result<Option<Vec<SavedCache>>> {
        let mut out = Vec::with_capacity(self.0.len());
        for c in &self.0 {
            match c.save()? {
                Some(s) => out.push(s),
                None => return Ok(None),
            }
        }
        Ok(Some(out))
    }

    /// `saved` restored into these (fresh) caches, layer by layer.
    pub fn restore(&mut self, saved: Vec<SavedCache>) -> Result<()> {
        if saved.len() != self.0.len() {
            return Err(Error::Mlx(format!("saved state has {} layers, the model {}", saved.len(), self.0.len())));
        }
        for (c, s) in self.0.iter_mut().zip(saved) {
            c.restore(s)?;
        }
        if self.0.iter().any(|c| c.offset() != self.offset()) {
            return Err(Error::Mlx("saved layers hold different numbers of tokens".into()));
        }
        Ok(())
    }

    /// The fewest tokens these caches can be trimmed back to (0 for plain key/value caches, the
    /// whole offset with a recurrent state; a sliding window that moved on sits in between).
    pub fn trim_floor(&self) -> usize {
        let n = self.offset();
        // can_trim_to is false below the floor and true from it up to the offset.
        let (mut lo, mut hi) = (0, n);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.can_trim_to(mid) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    }
}
