//! Token embeddings, dense or quantized; `as_linear` serves tied output heads.
use super::linear::{quant_spec_for, QuantWeight};
use crate::error::Result;
use crate::loader::{QuantConfig, TensorKind, WeightStore};
use crate::mlx::{quant, Array};

pub enum Embedding {
    /// The `[vocab, dim]` table and its transposed view (for the tied output head), made once.
    Dense { table: Array, table_t: Array },
    Quantized(QuantWeight),
}

impl Embedding {
    pub fn load(w: &mut WeightStore, q: Option<&QuantConfig>, prefix: &str, vocab: usize, dim: usize) -> Result<Self> {
        Ok(match quant_spec_for(w, q, prefix)? {
            Some(spec) => Embedding::Quantized(QuantWeight::load(w, prefix, vocab, dim, spec)?),
            None => {
                let table = w.take(&format!("{prefix}.weight"), &[vocab, dim], TensorKind::Float)?;
                Embedding::Dense { table_t: table.transpose(&[1, 0])?, table }
            }
        })
    }

    /// Rows of the table for `ids` (any shape) → `[..ids.shape, dim]`.
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        match self {
            Embedding::Dense { table, .. } => table.take(ids, 0),
            Embedding::Quantized(q) => {
                let w = q.weight.take(ids, 0)?;
                let s = q.scales.take(ids, 0)?;
                let b = q.biases.as_ref().map(|b| b.take(ids, 0)).transpose()?;
                quant::dequantize(&w, &s, b.as_ref(), q.spec.group_size as i32, q.spec.bits as i32, q.spec.mode)
            }
        }
    }

    /// `x @ tableᵀ`: the tied language-model head.
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        match self {
            Embedding::Dense { table_t, .. } => x.matmul(table_t),
            Embedding::Quantized(q) => q.matmul_t(x),
        }
    }
}
