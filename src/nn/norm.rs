//! RMSNorm (fused `fast::rms_norm`).
use crate::error::Result;
use crate::loader::{TensorKind, WeightStore};
use crate::mlx::{fast, Array};

pub struct RmsNorm {
    pub weight: Array,
    pub eps: f32,
}

impl RmsNorm {
    pub fn load(w: &mut WeightStore, prefix: &str, dim: usize, eps: f32) -> Result<Self> {
        Ok(RmsNorm { weight: w.take(&format!("{prefix}.weight"), &[dim], TensorKind::Float)?, eps })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        fast::rms_norm(x, Some(&self.weight), self.eps)
    }
}
