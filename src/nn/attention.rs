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
        let qkv = self.qkv.forward(x)?;
        let heads = |y: &Array, n: usize, norm: Option<&RmsNorm>| -> Result<Array> {
            let y = y.reshape(&[b, l, n as i32, -1])?;
            let y = match norm {
                Some(nm) => nm.forward(&y)?,
                None => y,
            };
            y.transpose(&[0, 2, 1, 3])
        };
        let q = heads(&qkv[0], self.n_heads, self.q_norm.as_ref())?;
        let k = heads(&qkv[1], self.n_kv_heads, self.k_norm.as_ref())?;
        let v = heads(&qkv[2], self.n_kv_heads, None)?;
        let q = self.rope.forward(&q, cache.offset)?;
        let k = self.rope.forward(&k, cache.offset)?;
        let (k, v) = cache.update_and_fetch(&k, &v)?;
        // A single query attends to everything cached; several need the causal mask (MLX aligns
        // it to the end of the keys, so cached prefixes are handled).
        let mask = if l > 1 { AttentionMask::Causal } else { AttentionMask::None };
        let o = fast::scaled_dot_product_attention(&q, &k, &v, self.scale, mask)?;
        let o = o.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
        self.o_proj.forward(&o)
    }
}
