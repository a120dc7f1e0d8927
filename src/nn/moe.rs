//! A sparse mixture-of-experts block: a router picks `k` experts per token, the experts run as
//! one [`SwitchGlu`], their outputs are summed with the router's weights; optionally a shared
//! expert (always on, qwen2_moe gates it with a sigmoid). The routing variants are mlx-lm's:
//! they differ in where the softmax sits and in how `argpartition` orders the k picks (which
//! changes the order of the weighted sum, so both are kept exactly).
use super::linear::Linear;
use super::mlp::GatedMlp;
use super::module::Params;
use super::switch::{combine, top_k, SwitchGlu};
use crate::error::Result;
use crate::loader::Vb;
use crate::mlx::Array;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Routing {
    /// softmax over all experts, then the top k of it (qwen3_moe: `largest_last`, `normalize`
    /// the picked weights to sum 1 when `norm_topk_prob`; qwen2_moe: neither).
    SoftmaxTopK { largest_last: bool, normalize: bool },
    /// top k of the raw router logits, then a softmax over those k (mixtral, gpt-oss).
    TopKSoftmax { largest_last: bool },
}

pub struct SparseMoe {
    pub gate: Linear,
    pub experts: SwitchGlu,
    pub k: usize,
    pub routing: Routing,
    /// An always-on expert, and its optional sigmoid gate (`[1, hidden]` linear).
    pub shared: Option<(GatedMlp, Option<Linear>)>,
    /// Cast the weighted sum back to the experts' dtype (qwen3_moe does).
    pub cast_back: bool,
}

impl SparseMoe {
    /// `x` `[B, L, D]` → `[B, L, D]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let logits = self.gate.forward(x)?;
        let (idx, weights) = match self.routing {
            Routing::SoftmaxTopK { largest_last, normalize } => {
                let probs = logits.softmax(-1, true)?;
                let (idx, w) = top_k(&probs, self.k, largest_last)?;
                let w = if normalize { w.divide(&w.sum(&[-1], true)?)? } else { w };
                (idx, w)
            }
            Routing::TopKSoftmax { largest_last } => {
                let (idx, picked) = top_k(&logits, self.k, largest_last)?;
                (idx, picked.softmax(-1, true)?)
            }
        };
        let y = self.experts.forward(x, &idx)?;
        let y = combine(&y, &weights, self.cast_back.then(|| y.dtype()))?;
        match &self.shared {
            None => Ok(y),
            Some((mlp, gate)) => {
                let s = mlp.forward(x)?;
                let s = match gate {
                    Some(g) => g.forward(x)?.sigmoid()?.multiply(&s)?,
                    None => s,
                };
                y.add(&s)
            }
        }
    }
}

impl Params for SparseMoe {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.gate, self.experts);
        if let Some((mlp, gate)) = &self.shared {
            crate::params!(out; *mlp, *gate);
        }
    }
}

/// Stacks per-expert tensors of module `vb` (the Hugging Face layout,
/// `experts.{e}.{from}.{weight|scales|biases}`) into `{into}.{to}.{…}` (`[experts, …]`), as
/// mlx-lm's `sanitize` does; `names` maps each source projection to ours. Checkpoints saved by
/// mlx-lm are stacked already: nothing happens then.
pub fn stack_experts(vb: &Vb, experts: usize, names: &[(&str, &str)], into: &str) -> Result<()> {
    for (from, to) in names {
        for part in ["weight", "scales", "biases", "bias"] {
            let parts: Vec<String> = (0..experts).map(|e| format!("experts.{e}.{from}.{part}")).collect();
            vb.stack(&parts, &format!("{into}.{to}.{part}"))?;
        }
    }
    Ok(())
}
