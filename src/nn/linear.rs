//! Linear layers, dense or quantized (mlx-lm's `nn.Linear` / `nn.QuantizedLinear`).
use crate::error::Result;
use crate::loader::{QuantConfig, QuantSpec, TensorKind, WeightStore};
use crate::mlx::{quant, Array};

/// A quantized weight and how to read it.
pub struct QuantWeight {
    pub weight: Array,
    pub scales: Array,
    pub biases: Option<Array>,
    pub spec: QuantSpec,
}

impl QuantWeight {
    /// Loads `{prefix}.weight/.scales/.biases` for an `[out, in]` matrix quantized per `spec`.
    pub fn load(w: &mut WeightStore, prefix: &str, out: usize, inp: usize, spec: QuantSpec) -> Result<Self> {
        let packed_cols = inp * spec.bits as usize / 32;
        let groups = inp / spec.group_size as usize;
        let weight = w.take(&format!("{prefix}.weight"), &[out, packed_cols], TensorKind::Packed)?;
        let scales = w.take(&format!("{prefix}.scales"), &[out, groups], TensorKind::Scales)?;
        let biases = if spec.mode.has_biases() {
            Some(w.take(&format!("{prefix}.biases"), &[out, groups], TensorKind::Scales)?)
        } else {
            None
        };
        Ok(QuantWeight { weight, scales, biases, spec })
    }

    /// `x @ Wᵀ` without materialising W.
    pub fn matmul_t(&self, x: &Array) -> Result<Array> {
        quant::quantized_matmul(
            x,
            &self.weight,
            &self.scales,
            self.biases.as_ref(),
            true,
            self.spec.group_size as i32,
            self.spec.bits as i32,
            self.spec.mode,
        )
    }
}

/// The quantization of module `prefix`, if the checkpoint stores it quantized (mlx-lm's rule:
/// a module is quantized exactly when `{prefix}.scales` is in the weights).
pub fn quant_spec_for(w: &WeightStore, q: Option<&QuantConfig>, prefix: &str) -> Result<Option<QuantSpec>> {
    if !w.contains(&format!("{prefix}.scales")) {
        return Ok(None);
    }
    match q.and_then(|q| q.for_module(prefix)) {
        Some(spec) => Ok(Some(spec)),
        None => Err(crate::error::Error::checkpoint(
            "config.json",
            format!("'{prefix}.scales' is present but config.json has no quantization settings for '{prefix}'"),
        )),
    }
}

pub enum Linear {
    Dense { weight: Array, bias: Option<Array> },
    Quantized { q: QuantWeight, bias: Option<Array> },
}

impl Linear {
    /// Loads `{prefix}.weight` (`[out, in]`) and optionally `{prefix}.bias`, quantized or not.
    pub fn load(
        w: &mut WeightStore,
        q: Option<&QuantConfig>,
        prefix: &str,
        inp: usize,
        out: usize,
        bias: bool,
    ) -> Result<Linear> {
        let b = if bias { Some(w.take(&format!("{prefix}.bias"), &[out], TensorKind::Float)?) } else { None };
        Ok(match quant_spec_for(w, q, prefix)? {
            Some(spec) => Linear::Quantized { q: QuantWeight::load(w, prefix, out, inp, spec)?, bias: b },
            None => Linear::Dense { weight: w.take(&format!("{prefix}.weight"), &[out, inp], TensorKind::Float)?, bias: b },
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Linear::Dense { weight, bias } => {
                let wt = weight.transpose(&[1, 0])?;
                match bias {
                    Some(b) => Array::addmm(b, x, &wt, 1.0, 1.0),
                    None => x.matmul(&wt),
                }
            }
            Linear::Quantized { q, bias } => {
                let y = q.matmul_t(x)?;
                match bias {
                    Some(b) => y.add(b),
                    None => Ok(y),
                }
            }
        }
    }
}
