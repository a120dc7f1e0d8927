//! qwen2 (Qwen2 / Qwen2.5). Follows mlx-lm `models/qwen2.py`: bias on q/k/v, none on o_proj or
//! the MLP, tied embeddings by default.
use super::transformer::ArchSpec;
use super::Architecture;

crate::decoder_architecture!(Qwen2, |_| ArchSpec {
    qkv_bias: true,
    o_bias: false,
    mlp_bias: false,
    qk_norm: false,
    tie_default: true
});

pub const ARCH: Architecture = Architecture::new::<Qwen2>("qwen2", &[]);
