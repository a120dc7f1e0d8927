//! The gated MLP of llama-family models: down(silu(gate(x)) · up(x)).
use super::linear::Linear;
use crate::error::Result;
use crate::mlx::{fast, Array};

pub struct GatedMlp {
    pub gate_proj: Linear,
    pub up_proj: Linear,
    pub down_proj: Linear,
}

impl GatedMlp {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let g = self.gate_proj.forward(x)?;
        let u = self.up_proj.forward(x)?;
        self.down_proj.forward(&fast::swiglu(&g, &u)?)
    }
}
