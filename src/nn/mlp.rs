//! The gated MLP of llama-family models, down(act(gate(x)) · up(x)), with SiLU (SwiGLU) or
//! tanh-approximated GELU (GeGLU, the Gemma family).
use super::linear::{Linear, Projections};
use super::module::Params;
use super::norm::RmsNorm;
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
        self.down_proj.forward(&self.gated(x)?)
    }

    /// `residual + self.forward(x)`, the add folded into the down projection where it can be.
    pub fn forward_add(&self, x: &Array, residual: &Array) -> Result<Array> {
        self.down_proj.forward_add(&self.gated(x)?, residual)
    }

    /// `residual + self.forward(norm(x))`: the layer's pre-norm folded into the gate/up
    /// product's kernel and the add into the down projection's, where they can be.
    pub fn forward_add_normed(&self, x: &Array, norm: &RmsNorm, residual: &Array) -> Result<Array> {
        let g = match self.activation {
            GateActivation::Silu => self.gate_up.swiglu_normed(x, norm)?,
            GateActivation::GeluTanh => self.gated(&norm.forward(x)?)?,
        };
        self.down_proj.forward_add(&g, residual)
    }

    /// act(gate(x)) · up(x).
    fn gated(&self, x: &Array) -> Result<Array> {
        match self.activation {
            GateActivation::Silu => self.gate_up.swiglu(x),
            GateActivation::GeluTanh => {
                let gu = self.gate_up.forward(x)?;
                fast::geglu(&gu[0], &gu[1])
            }
        }
    }
}

impl Params for GatedMlp {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.gate_up, self.down_proj);
    }
}
