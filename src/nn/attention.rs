//! Multi-head attention with grouped-query KV heads, rotary positions, optional q/k norms and
//! projection biases: the attention of llama, qwen2 and qwen3.
use super::kv_cache::KvCache;
use super::linear::{Linear, Projections};
use super::norm::RmsNorm;
use super::rope::Rope;
use crate::error::Result;
use crate::mlx::fast::{self, AttentionMask};
use crate::mlx::Array;

pub struct Attention {
    /// q, k and v projections (fused into one matmul where the checkpoint allows).
    pub qkv: Projections,
    pub o_proj: Linear,
    /// qwen3: RMSNorm over each head's features of q and k, before rotary.
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    pub rope: Rope,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
}

impl Attention {
    /// `x`: `[B, L, hidden]` → `[B, L, hidden]`.
    pub fn forward(&self, x: &Array, cache: &mut KvCache) -> Result<Array> {
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        let (q, k, v) = if l == 1 { self.decode_qkv(x, b, cache.offset)? } else { self.prefill_qkv(x, b, l, cache.offset)? };
        let (k, v) = cache.update_and_fetch(&k, &v)?;
        // A single query attends to everything cached; several need the causal mask (MLX aligns
        // it to the end of the keys, so cached prefixes are handled).
        let mask = if l > 1 { AttentionMask::Causal } else { AttentionMask::None };
        let o = fast::scaled_dot_product_attention(&q, &k, &v, self.scale, mask)?;
        // [B, H, L, D] → [B, L, H·D]; with one query the transpose is only a reshape.
        let o = if l == 1 { o.reshape(&[b, 1, -1])? } else { o.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, -1])? };
        self.o_proj.forward(&o)
    }

    fn norm(x: Array, norm: Option<&RmsNorm>) -> Result<Array> {
        match norm {
            Some(n) => n.forward(&x),
            None => Ok(x),
        }
    }

    /// q, k, v as `[B, H, L, D]`, normed and rotated (any L).
    fn prefill_qkv(&self, x: &Array, b: i32, l: i32, offset: usize) -> Result<(Array, Array, Array)> {
        let qkv = self.qkv.forward(x)?;
        let heads = |y: &Array, n: usize, norm: Option<&RmsNorm>| -> Result<Array> {
            Self::norm(y.reshape(&[b, l, n as i32, -1])?, norm)?.transpose(&[0, 2, 1, 3])
        };
        let q = self.rope.forward(&heads(&qkv[0], self.n_heads, self.q_norm.as_ref())?, offset)?;
        let k = self.rope.forward(&heads(&qkv[1], self.n_kv_heads, self.k_norm.as_ref())?, offset)?;
        let v = heads(&qkv[2], self.n_kv_heads, None)?;
        Ok((q, k, v))
    }

    /// The decode step (L = 1) with as few ops as possible, since per-op overhead is what a
    /// decode step costs: `[B, 1, H·D]` reshapes straight to `[B, H, 1, D]` (no transposes), and
    /// without q/k norms one rope rotates q and k together.
    fn decode_qkv(&self, x: &Array, b: i32, offset: usize) -> Result<(Array, Array, Array)> {
        let (hq, hkv) = (self.n_heads as i32, self.n_kv_heads as i32);
        match &self.qkv {
            Projections::Fused { linear, .. } => {
                let y = linear.forward(x)?.reshape(&[b, hq + 2 * hkv, 1, -1])?;
                if self.q_norm.is_none() && self.k_norm.is_none() {
                    let mut parts = y.split_at(&[hq + hkv], 1)?;
                    let v = parts.pop().unwrap();
                    let qk = self.rope.forward(&parts.pop().unwrap(), offset)?;
                    let mut qk = qk.split_at(&[hq], 1)?;
                    let k = qk.pop().unwrap();
                    return Ok((qk.pop().unwrap(), k, v));
                }
                let mut parts = y.split_at(&[hq, hq + hkv], 1)?;
                let v = parts.pop().unwrap();
                let k = self.rope.forward(&Self::norm(parts.pop().unwrap(), self.k_norm.as_ref())?, offset)?;
                let q = self.rope.forward(&Self::norm(parts.pop().unwrap(), self.q_norm.as_ref())?, offset)?;
                Ok((q, k, v))
            }
            Projections::Separate(_) => {
                let qkv = self.qkv.forward(x)?;
                let heads = |y: &Array, n: i32| y.reshape(&[b, n, 1, -1]);
                let q = self.rope.forward(&Self::norm(heads(&qkv[0], hq)?, self.q_norm.as_ref())?, offset)?;
                let k = self.rope.forward(&Self::norm(heads(&qkv[1], hkv)?, self.k_norm.as_ref())?, offset)?;
                Ok((q, k, heads(&qkv[2], hkv)?))
            }
        }
    }
}
