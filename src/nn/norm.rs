//! RMSNorm (fused `fast::rms_norm`), plain or Gemma's `1 + w` variant.
use super::module::Params;
use crate::error::Result;
use crate::loader::Vb;
use crate::mlx::{fast, Array};

pub struct RmsNorm {
    pub weight: Array,
    pub eps: f32,
}

impl RmsNorm {
    /// Module `vb`'s `weight` (`[dim]`).
    pub fn load(vb: &Vb, dim: usize, eps: f32) -> Result<Self> {
        Ok(RmsNorm { weight: vb.get("weight", &[dim])?, eps })
    }

    /// Gemma's norm, `x · (1 + w)`: the `1 + w` is taken once here, in the weight's dtype, as
    /// mlx-lm does on every call (same rounding).
    pub fn load_plus_one(vb: &Vb, dim: usize, eps: f32) -> Result<Self> {
        let w = vb.get("weight", &[dim])?;
        let one = Array::scalar_f32(1.0, w.dtype())?;
        Ok(RmsNorm { weight: one.add(&w)?, eps })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        fast::rms_norm(x, Some(&self.weight), self.eps)
    }
}

impl Params for RmsNorm {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        out.push(&self.weight);
    }
}

/// LayerNorm with optional weight and bias (fused `fast::layer_norm`), as vision encoders use.
pub struct LayerNorm {
    pub weight: Option<Array>,
    pub bias: Option<Array>,
    pub eps: f32,
}

impl LayerNorm {
    /// Module `vb`'s `weight` and `bias` (`[dim]` each).
    pub fn load(vb: &Vb, dim: usize, eps: f32) -> Result<Self> {
        Ok(LayerNorm { weight: Some(vb.get("weight", &[dim])?), bias: Some(vb.get("bias", &[dim])?), eps })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        fast::layer_norm(x, self.weight.as_ref(), self.bias.as_ref(), self.eps)
    }
}

impl Params for LayerNorm {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        out.extend(self.weight.iter().chain(&self.bias));
    }
}
