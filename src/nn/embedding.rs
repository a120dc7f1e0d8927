//! Token embeddings, dense or quantized; `as_linear` serves tied output heads.
use super::linear::QuantWeight;
use super::module::Params;
use super::norm::RmsNorm;
use crate::error::Result;
use crate::loader::Vb;
use crate::mlx::Array;

pub enum Embedding {
    /// The `[vocab, dim]` table and its transposed view (for the tied output head), made once.
    Dense { table: Array, table_t: Array },
    Quantized(QuantWeight),
}

impl Embedding {
    pub fn load(vb: &Vb, vocab: usize, dim: usize) -> Result<Self> {
        Ok(match vb.quant_spec(dim)? {
            Some(spec) => Embedding::Quantized(QuantWeight::load(vb, &[], vocab, dim, spec)?),
            None => {
                let table = vb.get("weight", &[vocab, dim])?;
                Embedding::Dense { table_t: table.transpose(&[1, 0])?, table }
            }
        })
    }

    /// Rows of the table for `ids` (any shape) → `[..ids.shape, dim]`.
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        match self {
            Embedding::Dense { table, .. } => table.take(ids, 0),
            Embedding::Quantized(q) => q.dequantize(Some(ids)),
        }
    }

    /// `x @ tableᵀ`: the tied language-model head.
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        match self {
            Embedding::Dense { table_t, .. } => x.matmul(table_t),
            Embedding::Quantized(q) => q.matmul_t(x),
        }
    }

    /// [`Embedding::as_linear`] of `norm(x)` (the final norm before a tied head), the norm
    /// folded into a quantized product's kernel where ours applies (CUDA decode rows).
    pub fn as_linear_normed(&self, x: &Array, norm: &RmsNorm) -> Result<Array> {
        match self {
            Embedding::Dense { .. } => self.as_linear(&norm.forward(x)?),
            Embedding::Quantized(q) => q.matmul_t_normed(x, norm, None),
        }
    }
}

impl Params for Embedding {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        match self {
            // The transposed view (the table is its input): evaluating it at load leaves the
            // tied head an evaluated view, which the CPU's dense kernels take (an unevaluated
            // transpose sent a 0.6B's 622 MB float32 head to the reference BLAS each token).
            Embedding::Dense { table_t, .. } => out.push(table_t),
            Embedding::Quantized(q) => q.params(out),
        }
    }
}
