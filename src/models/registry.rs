//! `model_type` → architecture, with the aliases mlx-lm maps onto the same code
//! (its `MODEL_REMAPPING`). One line per architecture.
use super::{Architecture, CausalLm};
use crate::error::Result;
use crate::loader::{ModelConfig, Vb};

/// Every architecture implemented here.
pub const ARCHITECTURES: &[Architecture] = &[
    super::llama::ARCH,
    super::qwen2::ARCH,
    super::qwen2_5_vl::ARCH,
    super::qwen3::ARCH,
    super::qwen3_moe::ARCH,
    super::qwen3_next::ARCH,
    super::qwen3_next::ARCH_QWEN3_5,
    super::qwen3_next::ARCH_QWEN3_5_MOE,
    super::qwen3_vl::ARCH,
    super::qwen2_moe::ARCH,
    super::mixtral::ARCH,
    super::minicpm::ARCH,
    super::smollm3::ARCH,
    super::gemma3_text::ARCH,
    super::gemma4_text::ARCH,
    super::gpt_oss::ARCH,
    super::deepseek::ARCH_V3,
    super::deepseek::ARCH_V2,
    super::nemotron_h::ARCH,
];

/// Every `model_type` accepted, aliases included.
pub fn supported_model_types() -> Vec<&'static str> {
    ARCHITECTURES.iter().flat_map(|a| std::iter::once(a.model_type).chain(a.aliases.iter().copied())).collect()
}

fn find(config: &ModelConfig) -> Result<&'static Architecture> {
    let t = config.model_type.as_str();
    ARCHITECTURES.iter().find(|a| a.model_type == t || a.aliases.contains(&t)).ok_or_else(|| {
        config.error(format!(
            "unsupported model_type '{t}' (supported: {})",
            supported_model_types().join(", ")
        ))
    })
}

/// Checks that `config` names a known architecture and that its fields are valid for it.
pub fn check_config(config: &ModelConfig) -> Result<()> {
    (find(config)?.check)(config)
}

/// Builds the model `config.model_type` names from the weights under `vb`.
pub fn build_model(config: &ModelConfig, vb: &Vb) -> Result<Box<dyn CausalLm>> {
    (find(config)?.load)(config, vb)
}
