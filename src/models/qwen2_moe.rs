//! qwen2_moe (Qwen1.5-MoE, Qwen2-57B-A14B). Follows mlx-lm `models/qwen2_moe.py`: qwen2's
//! attention (q/k/v biases), and in every layer a mixture of experts (softmax router, top k,
//! no renormalisation) plus a shared expert whose output a sigmoid gate scales.
use super::qwen3_moe::validate_experts;
use super::transformer::{ArchSpec, DecoderConfig, DecoderModel, FeedForward};
use super::{ArchConfig, Architecture, Loadable};
use crate::error::Result;
use crate::loader::{check_size, ModelConfig, Vb};
use crate::nn::moe::stack_experts;
use crate::nn::{ExpertActivation, GateActivation, GatedMlp, Linear, Routing, SparseMoe, SwitchGlu};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    #[serde(flatten)]
    pub base: DecoderConfig,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub shared_expert_intermediate_size: usize,
}

impl ArchConfig for Config {
    fn validate(&self) -> std::result::Result<(), String> {
        self.base.validate()?;
        validate_experts(self.num_experts, self.num_experts_per_tok, "num_experts")?;
        check_size("moe_intermediate_size", self.moe_intermediate_size)?;
        check_size("shared_expert_intermediate_size", self.shared_expert_intermediate_size)
    }
}

crate::decoder_newtype!(Qwen2Moe);

impl Loadable for Qwen2Moe {
    type Config = Config;

    fn load(c: Config, _: &ModelConfig, vb: &Vb) -> Result<Self> {
        let spec = ArchSpec { qkv_bias: true, o_bias: false, mlp_bias: false, qk_norm: false, tie_default: false };
        let h = c.base.hidden_size;
        let ffn = |layer: &Vb, _| -> Result<FeedForward> {
            let mlp = layer.pp("mlp");
            let names = [("gate_proj", "gate_proj"), ("up_proj", "up_proj"), ("down_proj", "down_proj")];
            stack_experts(&mlp, c.num_experts, &names, "switch_mlp")?;
            let shared = GatedMlp::load(&mlp.pp("shared_expert"), h, c.shared_expert_intermediate_size, false, GateActivation::Silu)?;
            Ok(FeedForward::Sparse(SparseMoe {
                gate: Linear::load(&mlp.pp("gate"), h, c.num_experts, false)?,
                experts: SwitchGlu::load(&mlp.pp("switch_mlp"), c.num_experts, h, c.moe_intermediate_size, false, ExpertActivation::Swiglu)?,
                k: c.num_experts_per_tok,
                routing: Routing::SoftmaxTopK { largest_last: false, normalize: false },
                shared: Some((shared, Some(Linear::load(&mlp.pp("shared_expert_gate"), h, 1, false)?))),
                cast_back: false,
            }))
        };
        Ok(Qwen2Moe(DecoderModel::load_with(&c.base, spec, vb, |_| true, ffn)?))
    }
}

pub const ARCH: Architecture = Architecture::new::<Qwen2Moe>("qwen2_moe", &[]);
