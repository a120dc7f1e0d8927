//! llama (and Mistral / llama-shaped models). Follows mlx-lm `models/llama.py`: optional
//! `attention_bias` on all four projections, optional `mlp_bias`, tied embeddings by default.
use super::transformer::ArchSpec;
use super::Architecture;

crate::decoder_architecture!(Llama, |c| {
    let bias = c.attention_bias.unwrap_or(false);
    ArchSpec { qkv_bias: bias, o_bias: bias, mlp_bias: c.mlp_bias, qk_norm: false, tie_default: true }
});

pub const ARCH: Architecture = Architecture::new::<Llama>("llama", &["mistral", "iquestcoder", "xverse"]);
