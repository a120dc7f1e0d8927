//! mixtral (Mixtral 8x7B / 8x22B). Follows mlx-lm `models/mixtral.py`: llama's attention without
//! biases (head_dim = hidden / heads), and in every layer `block_sparse_moe`: top k of the
//! router logits, softmax over those k, experts stacked in `switch_mlp` (the Hugging Face
//! `experts.{e}.w1/w2/w3` layout is stacked at load). mlx-lm rotates with the plain base.
use super::qwen3_moe::validate_experts;
use super::transformer::{ArchSpec, DecoderConfig, DecoderModel, FeedForward};
use super::{ArchConfig, Architecture, Loadable};
use crate::error::Result;
use crate::loader::{ModelConfig, Vb};
use crate::nn::moe::stack_experts;
use crate::nn::{ExpertActivation, Linear, Routing, SparseMoe, SwitchGlu};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    #[serde(flatten)]
    pub base: DecoderConfig,
    #[serde(default = "default_experts")]
    pub num_local_experts: usize,
    #[serde(default = "default_k")]
    pub num_experts_per_tok: usize,
}

fn default_experts() -> usize {
    8
}

fn default_k() -> usize {
    2
}

impl ArchConfig for Config {
    fn validate(&self) -> std::result::Result<(), String> {
        self.base.validate()?;
        validate_experts(self.num_local_experts, self.num_experts_per_tok, "num_local_experts")
    }
}

crate::decoder_newtype!(Mixtral);

impl Loadable for Mixtral {
    type Config = Config;

    fn load(c: Config, _: &ModelConfig, vb: &Vb) -> Result<Self> {
        let mut base = c.base.clone();
        base.head_dim = None;
        base.rope.rope_scaling = None;
        base.rope.rope_parameters = None;
        let spec = ArchSpec { qkv_bias: false, o_bias: false, mlp_bias: false, qk_norm: false, tie_default: false };
        let h = base.hidden_size;
        let ffn = |layer: &Vb, _| -> Result<FeedForward> {
            let moe = layer.pp("block_sparse_moe");
            let names = [("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")];
            stack_experts(&moe, c.num_local_experts, &names, "switch_mlp")?;
            Ok(FeedForward::Sparse(SparseMoe {
                gate: Linear::load(&moe.pp("gate"), h, c.num_local_experts, false)?,
                experts: SwitchGlu::load(&moe.pp("switch_mlp"), c.num_local_experts, h, base.intermediate_size, false, ExpertActivation::Swiglu)?,
                k: c.num_experts_per_tok,
                routing: Routing::TopKSoftmax { largest_last: false },
                shared: None,
                cast_back: false,
            }))
        };
        Ok(Mixtral(DecoderModel::load_with(&base, spec, vb, |_| true, ffn)?))
    }
}

pub const ARCH: Architecture = Architecture::new::<Mixtral>("mixtral", &[]);
