//! Multi-head attention with grouped-query KV heads and the variants our architectures need:
//! projection biases, per-head q/k RMSNorm (qwen3, gemma3), rotary positions or none (smollm3's
//! no-rope layers), sliding windows (the layer's cache decides: see `nn::cache`), and learned
//! attention sinks (gpt-oss).
use super::cache::{Cache, Mask};
use super::kv_cache::SHORT_PASS;
use super::linear::{Linear, Projections};
use super::module::Params;
use super::norm::RmsNorm;
use super::quantized_kv_cache::quantized_attention;
use super::rope::Rope;
use crate::error::Result;
use crate::loader::Vb;
use crate::mlx::fast::AttentionMask;
use crate::mlx::{fast, Array};

/// The shape and options of one attention layer, as its architecture reads them from config.json.
pub struct AttentionSpec {
    pub hidden: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub qkv_bias: bool,
    pub o_bias: bool,
    /// RMSNorm of each head of q and k before rotary: `Some((eps, plus_one))`.
    pub qk_norm: Option<(f32, bool)>,
    /// Softmax scale (usually head_dim^-0.5).
    pub scale: f32,
    /// Learned per-head sink logits (`sinks` `[n_heads]`, gpt-oss).
    pub sinks: bool,
}

/// Where a step's new tokens sit: one offset for the whole batch, or one position per row.
enum At {
    Offset(usize),
    Rows(Array),
}

/// int32 `[offset]`, the position of a decode step's token: one array for all layers of a step
/// (memoized per thread), not one host allocation per layer.
fn position(offset: usize) -> Result<Array> {
    positions(offset, 1)
}

/// Keys up to which a CUDA decode step attends with our short-pass kernel rather than MLX's:
/// on the H200 ours was faster at 768 keys (one kernel instead of two slices and MLX's), MLX's
/// at 4k-8k (ours runs one block per query head; MLX's splits the keys over blocks).
const SHORT_KERNEL_KEYS: usize = 1024;

/// `linear(norm(x))`, the norm folded into the product where it can be.
fn fused(linear: &Linear, x: &Array, norm: Option<&RmsNorm>) -> Result<Array> {
    match norm {
        Some(n) => linear.forward_normed(x, n),
        None => linear.forward(x),
    }
}

/// int32 `[column, capacity]`: where a decode step's token goes in buffers of that capacity (one
/// array for all layers of a step, memoized per thread as [`position`]).
fn cache_column(column: usize, capacity: usize) -> Result<Array> {
    thread_local! {
        static LAST: Memo = const { std::cell::RefCell::new(None) };
    }
    memoized(&LAST, (column, capacity), || Array::from_slice(&[column as i32, capacity as i32], &[2]))
}

/// The last array a call site made, with its key.
type Memo = std::cell::RefCell<Option<((usize, usize), Array)>>;

/// `make()`'s array, or the one made last for the same `key` on this thread (a step's layers all
/// ask for the same one).
fn memoized(last: &'static std::thread::LocalKey<Memo>, key: (usize, usize), make: impl FnOnce() -> Result<Array>) -> Result<Array> {
    if let Some(a) = last.with(|l| l.borrow().as_ref().filter(|(k, _)| *k == key).map(|(_, a)| a.clone())) {
        return Ok(a);
    }
    let a = make()?;
    last.with(|l| *l.borrow_mut() = Some((key, a.clone())));
    Ok(a)
}

/// int32 `[n]`: `offset .. offset + n`, the positions of a pass's tokens (memoized per thread, as
/// [`position`]).
fn positions(offset: usize, n: usize) -> Result<Array> {
    thread_local! {
        static LAST: Memo = const { std::cell::RefCell::new(None) };
    }
    memoized(&LAST, (offset, n), || {
        let v: Vec<i32> = (offset..offset + n).map(|p| p as i32).collect();
        Array::from_slice(&v, &[n as i32])
    })
}

pub struct Attention {
    /// q, k and v projections (fused into one matmul where the checkpoint allows).
    pub qkv: Projections,
    pub o_proj: Linear,
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    /// None: no positional rotation in this layer.
    pub rope: Option<Rope>,
    pub sinks: Option<Array>,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
}

impl Attention {
    /// Loads `q_proj`, `k_proj`, `v_proj`, `o_proj` (and `q_norm`, `k_norm`, `sinks`) of module `vb`.
    pub fn load(vb: &Vb, s: &AttentionSpec, rope: Option<Rope>) -> Result<Self> {
        let (hq, hkv) = (s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
        let norm = |name: &str| -> Result<Option<RmsNorm>> {
            Ok(match s.qk_norm {
                Some((eps, false)) => Some(RmsNorm::load(&vb.pp(name), s.head_dim, eps)?),
                Some((eps, true)) => Some(RmsNorm::load_plus_one(&vb.pp(name), s.head_dim, eps)?),
                None => None,
            })
        };
        Ok(Attention {
            qkv: Projections::new("qkv", vec![
                Linear::load(&vb.pp("q_proj"), s.hidden, hq, s.qkv_bias)?,
                Linear::load(&vb.pp("k_proj"), s.hidden, hkv, s.qkv_bias)?,
                Linear::load(&vb.pp("v_proj"), s.hidden, hkv, s.qkv_bias)?,
            ])?,
            o_proj: Linear::load(&vb.pp("o_proj"), hq, s.hidden, s.o_bias)?,
            q_norm: norm("q_norm")?,
            k_norm: norm("k_norm")?,
            rope,
            sinks: if s.sinks { Some(vb.get("sinks", &[s.n_heads])?) } else { None },
            n_heads: s.n_heads,
            n_kv_heads: s.n_kv_heads,
            head_dim: s.head_dim,
            scale: s.scale,
        })
    }

    /// `x`: `[B, L, hidden]` → `[B, L, hidden]`, extending `cache`.
    pub fn forward(&self, x: &Array, cache: &mut dyn Cache) -> Result<Array> {
        self.forward_then(x, None, cache, None)
    }

    /// `residual + self.forward(x, cache)`, the add folded into the output projection where it
    /// can be (one kernel fewer per layer in a decode step).
    pub fn forward_add(&self, x: &Array, cache: &mut dyn Cache, residual: &Array) -> Result<Array> {
        self.forward_then(x, None, cache, Some(residual))
    }

    /// `residual + self.forward(norm(x), cache)`: the layer's pre-norm folded into the q/k/v
    /// product's kernel of a decode step where it can be (one kernel fewer again).
    pub fn forward_add_normed(&self, x: &Array, norm: &RmsNorm, cache: &mut dyn Cache, residual: &Array) -> Result<Array> {
        self.forward_then(x, Some(norm), cache, Some(residual))
    }

    fn project_out(&self, o: &Array, residual: Option<&Array>) -> Result<Array> {
        match residual {
            Some(r) => self.o_proj.forward_add(o, r),
            None => self.o_proj.forward(o),
        }
    }

    /// `norm`: x is the residual stream, normalized by it first.
    fn forward_then(&self, x: &Array, norm: Option<&RmsNorm>, cache: &mut dyn Cache, residual: Option<&Array>) -> Result<Array> {
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        // Rows of a continuous batch each sit at their own position.
        let at = match cache.positions() {
            Some(p) => At::Rows(p.clone()),
            None => At::Offset(cache.offset()),
        };
        let mut token_major = false;
        let (q, k, v) = if l == 1 {
            let product = self.fused_product(x, norm)?;
            if let Some(y) = &product {
                if let Some(o) = self.decode_fused(y, cache)? {
                    return self.project_out(&o, residual);
                }
            }
            self.decode_qkv(x, product, norm, b, &at, false)?
        } else if let Some(qkv) = self.short_qkv(x, norm, l, &at, cache.offset())? {
            token_major = true;
            qkv
        } else {
            let xn = match norm {
                Some(n) => n.forward(x)?,
                None => x.clone(),
            };
            self.prefill_qkv(&xn, b, l, &at)?
        };
        if self.sinks.is_none() {
            // A quantized cache (`kv_bits`) is read by quantized matmuls, as mlx-lm does.
            if let Some(kv) = cache.update_and_fetch_quantized(&k, &v)? {
                let o = quantized_attention(&q, &kv, self.scale)?;
                let o = if l == 1 { o.reshape(&[b, 1, -1])? } else { o.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, -1])? };
                return self.project_out(&o, residual);
            }
        }
        let (k, v, mask) = cache.update_and_fetch_for_sdpa(&k, &v)?;
        let (q, keep) = match mask.pad_queries(&q)? {
            Some((padded, l)) => (padded, Some(l)),
            None => (q, None),
        };
        let o = match (&self.sinks, &mask) {
            (None, Mask::Padded { key_start, causal }) => {
                fast::scaled_dot_product_attention_padded(&q, &k, &v, self.scale, *causal, key_start)?
            }
            (None, Mask::Short { prev, mask }) => match fast::cuda_short_attention(&q, &k, &v, self.scale, *prev, token_major, false)? {
                Some(o) => o,
                None => fast::scaled_dot_product_attention(&q, &k, &v, self.scale, AttentionMask::Array(mask))?,
            },
            (Some(sinks), _) => fast::scaled_dot_product_attention_sinks(&q, &k, &v, self.scale, mask.as_attention()?, sinks)?,
            (None, _) => fast::scaled_dot_product_attention(&q, &k, &v, self.scale, mask.as_attention()?)?,
        };
        let o = match keep {
            Some(l) => o.slice_axis(2, 0, l)?,
            None => o,
        };
        // [B, H, L, D] → [B, L, H·D]; with one query the transpose is only a reshape.
        let o = if l == 1 { o.reshape(&[b, 1, -1])? } else { o.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, -1])? };
        self.project_out(&o, residual)
    }

    /// A decode step's attention block from the fused q/k/v product `y` (`[B, 1, (HQ + 2·HKV)·D]`),
    /// the token's key and value written into a plain or batch cache's buffers by a kernel of
    /// ours, where the separate ops (a reshape, splits, the rope, two slice updates, two slices,
    /// the attention) cost more per op than their arithmetic on small models: on the CPU one
    /// kernel (`fast::cpu_decode_attention`) does it all; on CUDA one writes q, k and v
    /// (`fast::cuda_qkv_into_cache`) and our short-pass attention reads the whole buffers. The
    /// output `[B, 1, HQ·D]`, or None where it does not apply (another cache kind or device,
    /// sinks, a scaled or length-dependent rope; on CUDA also a partial rotation, a left-padded
    /// batch, 32-bit): the caller goes on with `y`.
    fn decode_fused(&self, y: &Array, cache: &mut dyn Cache) -> Result<Option<Array>> {
        if self.sinks.is_some() {
            return Ok(None);
        }
        let rope = match &self.rope {
            Some(r) => match r.plain() {
                Some(p) => Some(p),
                None => return Ok(None),
            },
            None => None,
        };
        let qk_norm = match (&self.q_norm, &self.k_norm) {
            (Some(q), Some(k)) if q.eps == k.eps => Some((&q.weight, &k.weight, q.eps)),
            (None, None) => None,
            _ => return Ok(None),
        };
        let on_cpu = crate::mlx::default_device().is_ok_and(|d| d == crate::mlx::Device::Cpu);
        let (b, hq, hkv, d) = (y.dim(0), self.n_heads as i32, self.n_kv_heads as i32, self.head_dim as i32);
        if on_cpu && y.dtype() == crate::mlx::Dtype::Float32 {
            return cache.write_token_with((b, hkv, d), y.dtype(), &mut |slot| {
                let rows = fast::DecodeRows { column: slot.column, positions: slot.positions, key_start: slot.key_start };
                fast::cpu_decode_attention(y, slot.keys, slot.values, &rows, (hq, hkv), self.scale, qk_norm, rope)
            });
        }
        let Some((dims, traditional, base, scale, freqs)) = rope else { return Ok(None) };
        if !crate::mlx::on_cuda() || dims != d || !matches!(y.dtype(), crate::mlx::Dtype::Bfloat16 | crate::mlx::Dtype::Float16) {
            return Ok(None);
        }
        // y goes in as the product wrote it ([B, 1, (HQ + 2·HKV)·D]) and the attention comes out
        // as the output projection takes it ([B, 1, HQ·D]): no reshape op on either side.
        cache.write_token_with((b, hkv, d), y.dtype(), &mut |slot| {
            // The kernel writes the buffers in place: only a cache's own (a continuous batch's).
            // A left-padded batch keeps MLX's attention under its per-step mask (BatchKvCache).
            if !slot.owned || slot.key_start.is_some() {
                return Ok(None);
            }
            let at = cache_column(slot.column, slot.keys.dim(2) as usize)?;
            let pos = match slot.positions {
                Some(p) => p.clone(),
                None => position(slot.column)?,
            };
            let rope = (traditional, base, scale, freqs);
            // Short contexts: the write and the attention in one kernel (the same bits as the two).
            if slot.column < SHORT_KERNEL_KEYS {
                if let Some(o) = fast::cuda_decode_attention(y, (hq, hkv), qk_norm, rope, &pos, &at, slot.keys, slot.values, self.scale)? {
                    return Ok(Some((o, slot.keys.clone(), slot.values.clone())));
                }
            }
            let Some(q) = fast::cuda_qkv_into_cache(y, (hq, hkv), qk_norm, rope, &pos, &at, slot.keys, slot.values)? else {
                return Ok(None);
            };
            // Attention depends on q, so it runs after the write of this column. Our attention
            // kernel (one block per query head) for short contexts; MLX's, which splits long
            // ones over many blocks, past SHORT_KERNEL_KEYS (BENCHMARKS.md, tenth session).
            let ours = if slot.column < SHORT_KERNEL_KEYS {
                fast::cuda_short_attention(&q, slot.keys, slot.values, self.scale, slot.column, false, true)?
            } else {
                None
            };
            let o = match ours {
                Some(o) => o,
                None => {
                    let end = slot.column as i32 + 1;
                    let (kk, vv) = (slot.keys.slice_axis(2, 0, end)?, slot.values.slice_axis(2, 0, end)?);
                    fast::scaled_dot_product_attention(&q, &kk, &vv, self.scale, AttentionMask::None)?.reshape(&[b, 1, -1])?
                }
            };
            Ok(Some((o, slot.keys.clone(), slot.values.clone())))
        })
    }

    fn norm(x: Array, norm: Option<&RmsNorm>) -> Result<Array> {
        match norm {
            Some(n) => n.forward(&x),
            None => Ok(x),
        }
    }

    fn rope(&self, x: Array, at: &At) -> Result<Array> {
        match (&self.rope, at) {
            (Some(r), At::Offset(offset)) => r.forward(&x, *offset),
            (Some(r), At::Rows(positions)) => r.forward_rows(&x, positions),
            (None, _) => Ok(x),
        }
    }

    /// q and k of the fused product `qkv` (`[B, HQ + 2·HKV, 1, D]`) normalized and rotated by
    /// one CUDA kernel, where there are q/k norms and that kernel applies.
    fn norm_rotate_qk(&self, qkv: &Array, heads: (i32, i32), at: &At) -> Result<Option<(Array, Array)>> {
        let (Some(r), Some(qn), Some(kn)) = (&self.rope, &self.q_norm, &self.k_norm) else { return Ok(None) };
        match at {
            At::Offset(o) => r.norm_rotate_qk(qkv, heads, qn, kn, &position(*o)?),
            At::Rows(positions) => r.norm_rotate_qk(qkv, heads, qn, kn, positions),
        }
    }

    /// Whether this layer can run the rows of a continuous batch (each at its own position, a
    /// left-padded cache): not with sinks, nor with a rope whose frequencies depend on the length.
    pub fn batchable(&self) -> bool {
        self.sinks.is_none() && self.rope.as_ref().is_none_or(|r| r.batchable())
    }

    /// q, k, v as `[B, H, L, D]`, normed and rotated (any L).
    fn prefill_qkv(&self, x: &Array, b: i32, l: i32, offset: &At) -> Result<(Array, Array, Array)> {
        let qkv = self.qkv.forward(x)?;
        let heads = |y: &Array, n: usize, norm: Option<&RmsNorm>| -> Result<Array> {
            Self::norm(y.reshape(&[b, l, n as i32, -1])?, norm)?.transpose(&[0, 2, 1, 3])
        };
        let q = self.rope(heads(&qkv[0], self.n_heads, self.q_norm.as_ref())?, offset)?;
        let k = self.rope(heads(&qkv[1], self.n_kv_heads, self.k_norm.as_ref())?, offset)?;
        let v = heads(&qkv[2], self.n_kv_heads, None)?;
        Ok((q, k, v))
    }

    /// A short pass (a speculative verification, a prompt's last few tokens: one row of at most
    /// [`SHORT_PASS`] tokens) built as a decode step whose batch rows are its tokens, each at its
    /// own position: the pre-norm folded into the q/k/v product, one rope (or our q/k norm + rope
    /// kernel) and no transposed copies, where the prefill path runs a norm, two ropes and three
    /// copies per layer. q, k, v come back as `[1, H, L, D]` views of token-major arrays. None:
    /// not such a pass (or a rope whose frequencies depend on the length).
    fn short_qkv(&self, x: &Array, norm: Option<&RmsNorm>, l: i32, at: &At, offset: usize) -> Result<Option<(Array, Array, Array)>> {
        let short = x.dim(0) == 1 && l as usize <= SHORT_PASS && matches!(at, At::Offset(_));
        if !short || self.sinks.is_some() || !self.rope.as_ref().is_none_or(|r| r.batchable()) {
            return Ok(None);
        }
        let rows = x.reshape(&[l, 1, -1])?;
        let (q, k, v) = self.decode_qkv(&rows, None, norm, l, &At::Rows(positions(offset, l as usize)?), true)?;
        let view = |a: Array, h: usize| a.reshape(&[1, l, h as i32, -1])?.transpose(&[0, 2, 1, 3]);
        Ok(Some((view(q, self.n_heads)?, view(k, self.n_kv_heads)?, view(v, self.n_kv_heads)?)))
    }

    /// The fused q/k/v product of `x` (normalized by `norm` first, folded into the product where
    /// it can be), or None where the projections are separate.
    fn fused_product(&self, x: &Array, norm: Option<&RmsNorm>) -> Result<Option<Array>> {
        match &self.qkv {
            Projections::Fused { linear, .. } => fused(linear, x, norm).map(Some),
            Projections::Separate(_) => Ok(None),
        }
    }

    /// The decode step (L = 1) with as few ops as possible, since per-op overhead is what a
    /// decode step costs: `[B, 1, H·D]` reshapes straight to `[B, H, 1, D]` (no transposes), and
    /// without q/k norms one rope rotates q and k together. `contiguous_q` (a short pass, whose
    /// rows are one request's tokens): q and k rotated apart, so that q comes out row
    /// contiguous. Split from the joint rotation, q is a strided view, which our short-pass
    /// attention kernel had copied first: on the H200 that copy's encoding was ~28 % of a
    /// verification pass's host time, far more than a second rope costs. Done on every backend
    /// (one more rope a layer is negligible on the CPU), so the CPU suites cover this path.
    /// `product`: the fused projection of x where the caller made it already ([`Self::fused_product`]).
    fn decode_qkv(&self, x: &Array, product: Option<Array>, norm: Option<&RmsNorm>, b: i32, offset: &At, contiguous_q: bool) -> Result<(Array, Array, Array)> {
        let (hq, hkv) = (self.n_heads as i32, self.n_kv_heads as i32);
        match &self.qkv {
            Projections::Fused { linear, .. } => {
                let y = match product {
                    Some(y) => y,
                    None => fused(linear, x, norm)?,
                };
                let y = y.reshape(&[b, hq + 2 * hkv, 1, -1])?;
                if self.q_norm.is_none() && self.k_norm.is_none() && contiguous_q && b > 1 {
                    let mut parts = y.split_at(&[hq, hq + hkv], 1)?;
                    let v = parts.pop().unwrap();
                    let k = self.rope(parts.pop().unwrap(), offset)?;
                    let q = self.rope(parts.pop().unwrap(), offset)?;
                    return Ok((q, k, v));
                }
                if self.q_norm.is_none() && self.k_norm.is_none() {
                    let mut parts = y.split_at(&[hq + hkv], 1)?;
                    let v = parts.pop().unwrap();
                    let qk = self.rope(parts.pop().unwrap(), offset)?;
                    let mut qk = qk.split_at(&[hq], 1)?;
                    let k = qk.pop().unwrap();
                    return Ok((qk.pop().unwrap(), k, v));
                }
                let mut parts = y.split_at(&[hq, hq + hkv], 1)?;
                let v = parts.pop().unwrap();
                if let Some((q, k)) = self.norm_rotate_qk(&y, (hq, hkv), offset)? {
                    return Ok((q, k, v));
                }
                let k = self.rope(Self::norm(parts.pop().unwrap(), self.k_norm.as_ref())?, offset)?;
                let q = self.rope(Self::norm(parts.pop().unwrap(), self.q_norm.as_ref())?, offset)?;
                Ok((q, k, v))
            }
            Projections::Separate(_) => {
                let qkv = match norm {
                    Some(n) => self.qkv.forward_normed(x, n)?,
                    None => self.qkv.forward(x)?,
                };
                let heads = |y: &Array, n: i32| y.reshape(&[b, n, 1, -1]);
                let q = self.rope(Self::norm(heads(&qkv[0], hq)?, self.q_norm.as_ref())?, offset)?;
                let k = self.rope(Self::norm(heads(&qkv[1], hkv)?, self.k_norm.as_ref())?, offset)?;
                Ok((q, k, heads(&qkv[2], hkv)?))
            }
        }
    }
}

impl Params for Attention {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.qkv, self.o_proj, self.q_norm, self.k_norm, self.sinks);
    }
}
