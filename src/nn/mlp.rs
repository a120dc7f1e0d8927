//! The gated MLP of llama-family models: down(silu(gate(x)) · up(x)).
use super::linear::{Linear, Projections};
use crate::error::Result;
use crate::mlx::{fast, Array};

pub struct GatedMlp {
    /// gate and up projections (fused into one matmul where the checkpoint allows).
    pub gate_up: Projections,
    pub down_proj: Linear,
}

impl GatedMlp {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let gu = self.gate_up.forward(x)?;
        self.down_proj.forward(&fast::swiglu(&gu[0], &gu[1])?)
    }
}
