//! The gated MLP of llama-family models, down(act(gate(x)) · up(x)), with SiLU (SwiGLU) or
//! tanh-approximated GELU (GeGLU, the Gemma family).
use super::linear::{Linear, Projections};
use super::module::Params;
use crate::error::Result;
use crate::loader::Vb;
use crate::mlx::{fast, Array};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateActivation {
    Silu,
    /// GELU, tanh approximation (`gelu_pytorch_tanh`).
    GeluTanh,
}

pub struct GatedMlp {
    /// gate and up projections (fused into one matmul where the checkpoint allows).
    pub gate_up: Projections,
    pub down_proj: Linear,
    pub activation: GateActivation,
}

impl GatedMlp {
    /// Loads `gate_proj`, `up_proj` and `down_proj` of module `vb`.
    pub fn load(vb: &Vb, hidden: usize, inter: usize, bias: bool, activation: GateActivation) -> Result<Self> {
        Ok(GatedMlp {
            gate_up: Projections::new("gate_up", vec![
                Linear::load(&vb.pp("gate_proj"), hidden, inter, bias)?,
                Linear::load(&vb.pp("up_proj"), hidden, inter, bias)?,
            ])?,
            down_proj: Linear::load(&vb.pp("down_proj"), inter, hidden, bias)?,
            activation,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let gu = self.gate_up.forward(x)?;
        let h = match self.activation {
            GateActivation::Silu => fast::swiglu(&gu[0], &gu[1])?,
            GateActivation::GeluTanh => fast::geglu(&gu[0], &gu[1])?,
        };
        self.down_proj.forward(&h)
    }
}

impl Params for GatedMlp {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.gate_up, self.down_proj);
    }
}
