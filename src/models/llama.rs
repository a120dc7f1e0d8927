//! llama (and Mistral / llama-shaped models). Follows mlx-lm `models/llama.py`: optional
//! `attention_bias` on all four projections, optional `mlp_bias`, tied embeddings by default.
use super::transformer::ArchSpec;
use crate::loader::ModelConfig;

pub fn spec(c: &ModelConfig) -> ArchSpec {
    let bias = c.attention_bias.unwrap_or(false);
    ArchSpec { qkv_bias: bias, o_bias: bias, mlp_bias: c.mlp_bias, qk_norm: false, tie_default: true }
}
