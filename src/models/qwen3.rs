//! qwen3. Follows mlx-lm `models/qwen3.py`: per-head RMSNorm on q and k before rotary, explicit
//! `head_dim`, no projection biases unless `attention_bias` says so.
use super::transformer::ArchSpec;
use super::Architecture;

crate::decoder_architecture!(Qwen3, |c| {
    let bias = c.attention_bias.unwrap_or(false);
    ArchSpec { qkv_bias: bias, o_bias: bias, mlp_bias: false, qk_norm: true, tie_default: true }
});

pub const ARCH: Architecture = Architecture::new::<Qwen3>("qwen3", &[]);
