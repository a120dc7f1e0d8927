//! Mixture-of-experts layers over stacked expert weights (mlx-lm's `switch_layers.py`): each
//! token runs through the `k` experts its router picked, as one `gather_mm` / `gather_qmm` per
//! projection — never a loop over experts. With many (token, expert) pairs (prefill) the pairs
//! are sorted by expert first, so each expert's weights are read once.
use super::linear::QuantWeight;
use super::module::Params;
use crate::error::Result;
use crate::loader::Vb;
use crate::mlx::{fast, quant, Array, Dtype};

/// Pairs from which mlx-lm sorts by expert (its `indices.size >= 64`).
const SORT_MIN_PAIRS: usize = 64;

/// `[experts, out, in]` weights, dense or quantized, with an optional `[experts, out]` bias.
pub enum SwitchLinear {
    /// `weight_t`: the `[E, in, out]` transposed view, made once at load.
    Dense { weight_t: Array, bias: Option<Array> },
    Quantized { q: QuantWeight, bias: Option<Array> },
}

impl SwitchLinear {
    /// Module `vb`'s `weight` (`[experts, out, in]`, quantized or not) and optionally `bias`.
    pub fn load(vb: &Vb, experts: usize, inp: usize, out: usize, bias: bool) -> Result<Self> {
        let b = if bias { Some(vb.get("bias", &[experts, out])?) } else { None };
        Ok(match vb.quant_spec(inp)? {
            Some(spec) => SwitchLinear::Quantized { q: QuantWeight::load(vb, &[experts], out, inp, spec)?, bias: b },
            None => SwitchLinear::Dense { weight_t: vb.get("weight", &[experts, out, inp])?.swapaxes(-1, -2)?, bias: b },
        })
    }

    /// `x` `[…, 1, in]` through expert `indices[…]` → `[…, 1, out]`.
    pub fn forward(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array> {
        let (y, bias) = match self {
            SwitchLinear::Dense { weight_t, bias } => (x.gather_mm(weight_t, indices, sorted)?, bias),
            SwitchLinear::Quantized { q, bias } => (
                quant::gather_qmm(
                    x,
                    &q.weight,
                    &q.scales,
                    q.biases.as_ref(),
                    indices,
                    q.spec.group_size as i32,
                    q.spec.bits as i32,
                    q.spec.mode,
                    sorted,
                )?,
                bias,
            ),
        };
        match bias {
            Some(b) => y.add(&b.take(indices, 0)?.expand_dims(-2)?),
            None => Ok(y),
        }
    }
}

impl Params for SwitchLinear {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        match self {
            SwitchLinear::Dense { weight_t, bias } => crate::params!(out; *weight_t, *bias),
            SwitchLinear::Quantized { q, bias } => crate::params!(out; *q, *bias),
        }
    }
}

/// How an expert combines its gate and up projections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertActivation {
    /// silu(gate) · up.
    Swiglu,
    /// gpt-oss: gate and up clamped to `limit` (gate from above only), then
    /// gate·sigmoid(alpha·gate) · (up + 1).
    ClampedSwiglu { alpha: f32, limit: f32 },
    /// gelu_approx(gate) · up (gemma4's experts: mlx-lm's `GeGLU`).
    Geglu,
}

/// Gated expert MLPs: down(act(gate(x), up(x))) per selected expert (mlx-lm's `SwitchGLU`).
pub struct SwitchGlu {
    pub gate_proj: SwitchLinear,
    pub up_proj: SwitchLinear,
    pub down_proj: SwitchLinear,
    pub activation: ExpertActivation,
}

impl SwitchGlu {
    /// `gate_proj`, `up_proj`, `down_proj` of module `vb` (e.g. `model.layers.3.mlp.switch_mlp`).
    pub fn load(vb: &Vb, experts: usize, hidden: usize, inter: usize, bias: bool, activation: ExpertActivation) -> Result<Self> {
        Ok(SwitchGlu {
            gate_proj: SwitchLinear::load(&vb.pp("gate_proj"), experts, hidden, inter, bias)?,
            up_proj: SwitchLinear::load(&vb.pp("up_proj"), experts, hidden, inter, bias)?,
            down_proj: SwitchLinear::load(&vb.pp("down_proj"), experts, inter, hidden, bias)?,
            activation,
        })
    }

    /// `x` `[B, L, D]`, `indices` `[B, L, k]` (int) → `[B, L, k, D]`: each token through each
    /// of its experts.
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        let x = x.expand_dims(-2)?.expand_dims(-2)?; // [B, L, 1, 1, D]
        let (b, l, k) = (indices.dim(0), indices.dim(1), indices.dim(2));
        let pairs = indices.size();
        let sort = pairs >= SORT_MIN_PAIRS;
        let (x, idx, inverse) = if sort {
            let flat = indices.reshape(&[-1])?;
            let order = flat.argsort(0)?;
            let inverse = order.argsort(0)?;
            let token = order.floor_divide(&Array::scalar_i32(k, order.dtype())?)?;
            let x = x.reshape(&[b * l, 1, -1])?.take(&token, 0)?; // [N·k, 1, D]
            (x, flat.take(&order, 0)?, Some(inverse))
        } else {
            (x, indices.clone(), None)
        };
        let up = self.up_proj.forward(&x, &idx, sort)?;
        let gate = self.gate_proj.forward(&x, &idx, sort)?;
        let h = self.activate(&gate, &up)?;
        let y = self.down_proj.forward(&h, &idx, sort)?;
        let y = match inverse {
            Some(inv) => y.take(&inv, 0)?.reshape(&[b, l, k, 1, -1])?,
            None => y,
        };
        y.squeeze(-2)
    }

    fn activate(&self, gate: &Array, up: &Array) -> Result<Array> {
        match self.activation {
            ExpertActivation::Swiglu => fast::swiglu(gate, up),
            ExpertActivation::Geglu => fast::geglu(gate, up),
            ExpertActivation::ClampedSwiglu { alpha, limit } => {
                let dt = gate.dtype();
                let lim = Array::scalar_f32(limit, dt)?;
                let g = gate.minimum(&lim)?;
                let u = up.minimum(&lim)?.maximum(&Array::scalar_f32(-limit, dt)?)?;
                let glu = g.multiply(&g.multiply(&Array::scalar_f32(alpha, dt)?)?.sigmoid()?)?;
                glu.multiply(&u.add(&Array::scalar_f32(1.0, dt)?)?)
            }
        }
    }
}

impl Params for SwitchGlu {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.gate_proj, self.up_proj, self.down_proj);
    }
}

/// The top-`k` experts of each token from the router's `scores` `[B, L, E]`: (indices
/// `[B, L, k]`, their scores), by mlx-lm's `argpartition(-scores, kth=k-1)[..., :k]` (qwen2_moe,
/// mixtral) or `argpartition(scores, kth=-k)[..., -k:]` (qwen3_moe) — the two order the k
/// experts differently, which changes the order of the weighted sum.
pub fn top_k(scores: &Array, k: usize, largest_last: bool) -> Result<(Array, Array)> {
    let e = scores.dim(-1);
    let axis = scores.ndim() as i32 - 1;
    let k = k as i32;
    let idx = if largest_last {
        scores.argpartition(e - k, -1)?.slice_axis(axis, e - k, e)?
    } else {
        scores.negative()?.argpartition(k - 1, -1)?.slice_axis(axis, 0, k)?
    };
    let picked = scores.take_along_axis(&idx, -1)?;
    Ok((idx, picked))
}

/// Σ over the k experts of `y` `[B, L, k, D]` weighted by `scores` `[B, L, k]`, in `out` dtype.
pub fn combine(y: &Array, scores: &Array, out: Option<Dtype>) -> Result<Array> {
    let s = y.multiply(&scores.expand_dims(-1)?)?.sum(&[-2], false)?;
    match out {
        Some(d) if s.dtype() != d => s.astype(d),
        _ => Ok(s),
    }
}
