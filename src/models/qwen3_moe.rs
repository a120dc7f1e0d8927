//! qwen3_moe (Qwen3-30B-A3B, Qwen3-235B-A22B). Follows mlx-lm `models/qwen3_moe.py`: qwen3's
//! attention (q/k RMSNorm, no biases), and in every `decoder_sparse_step`-th layer not listed in
//! `mlp_only_layers` a mixture of experts: softmax router, top k (`norm_topk_prob` renormalises
//! them), experts stacked in `mlp.switch_mlp`. mlx-lm rotates with the plain base (it ignores
//! `rope_scaling` here); so do we.
use super::transformer::{ArchSpec, DecoderConfig, DecoderModel, FeedForward};
use super::{ArchConfig, Architecture, Loadable};
use crate::error::Result;
use crate::loader::{check_size, ModelConfig, Vb};
use crate::nn::moe::stack_experts;
use crate::nn::{ExpertActivation, Linear, Routing, SparseMoe, SwitchGlu};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    #[serde(flatten)]
    pub base: DecoderConfig,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub decoder_sparse_step: usize,
    pub mlp_only_layers: Vec<usize>,
    pub moe_intermediate_size: usize,
    pub norm_topk_prob: bool,
}

impl ArchConfig for Config {
    fn validate(&self) -> std::result::Result<(), String> {
        self.base.validate()?;
        check_size("decoder_sparse_step", self.decoder_sparse_step)?;
        validate_experts(self.num_experts, self.num_experts_per_tok, "num_experts")?;
        check_size("moe_intermediate_size", self.moe_intermediate_size)
    }
}

/// `k` experts out of `n`: both positive, k ≤ n.
pub fn validate_experts(n: usize, k: usize, n_field: &str) -> std::result::Result<(), String> {
    check_size(n_field, n)?;
    check_size("num_experts_per_tok", k)?;
    if k > n {
        return Err(format!("field 'num_experts_per_tok' = {k} exceeds {n_field} = {n}"));
    }
    Ok(())
}

impl Config {
    fn is_sparse(&self, layer: usize) -> bool {
        !self.mlp_only_layers.contains(&layer) && self.num_experts > 0 && (layer + 1) % self.decoder_sparse_step == 0
    }
}

crate::decoder_newtype!(Qwen3Moe);

impl Loadable for Qwen3Moe {
    type Config = Config;

    fn load(c: Config, _: &ModelConfig, vb: &Vb) -> Result<Self> {
        let mut base = c.base.clone();
        base.rope.rope_scaling = None;
        base.rope.rope_parameters = None;
        let spec = ArchSpec { qkv_bias: false, o_bias: false, mlp_bias: false, qk_norm: true, tie_default: false };
        let h = base.hidden_size;
        let ffn = |layer: &Vb, i: usize| -> Result<FeedForward> {
            let mlp = layer.pp("mlp");
            if !c.is_sparse(i) {
                return FeedForward::dense(&mlp, &base, base.intermediate_size, false);
            }
            let names = [("gate_proj", "gate_proj"), ("up_proj", "up_proj"), ("down_proj", "down_proj")];
            stack_experts(&mlp, c.num_experts, &names, "switch_mlp")?;
            Ok(FeedForward::Sparse(SparseMoe {
                gate: Linear::load(&mlp.pp("gate"), h, c.num_experts, false)?,
                experts: SwitchGlu::load(&mlp.pp("switch_mlp"), c.num_experts, h, c.moe_intermediate_size, false, ExpertActivation::Swiglu)?,
                k: c.num_experts_per_tok,
                routing: Routing::SoftmaxTopK { largest_last: true, normalize: c.norm_topk_prob },
                shared: None,
                cast_back: true,
            }))
        };
        Ok(Qwen3Moe(DecoderModel::load_with(&base, spec, vb, |_| true, ffn)?))
    }
}

pub const ARCH: Architecture = Architecture::new::<Qwen3Moe>("qwen3_moe", &[]);
