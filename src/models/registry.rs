//! `model_type` → architecture, with the aliases mlx-lm maps onto the same code.
use super::transformer::{ArchSpec, DecoderModel};
use super::{llama, qwen2, qwen3};
use crate::error::{Error, Result};
use crate::loader::{ModelConfig, WeightStore};
use std::path::Path;

type SpecFn = fn(&ModelConfig) -> ArchSpec;

/// Architectures implemented here.
const ARCHITECTURES: &[(&str, SpecFn)] = &[("llama", llama::spec), ("qwen2", qwen2::spec), ("qwen3", qwen3::spec)];

/// Other names for the same architectures (as mlx-lm's MODEL_REMAPPING).
const ALIASES: &[(&str, &str)] = &[("mistral", "llama"), ("iquestcoder", "llama"), ("xverse", "llama")];

/// Every `model_type` accepted, aliases included.
pub fn supported_model_types() -> Vec<&'static str> {
    ARCHITECTURES.iter().map(|(n, _)| *n).chain(ALIASES.iter().map(|(a, _)| *a)).collect()
}

fn canonical(model_type: &str) -> &str {
    ALIASES.iter().find(|(a, _)| *a == model_type).map_or(model_type, |(_, c)| c)
}

/// Builds the model `config.model_type` names from `weights`.
pub fn build_model(dir: &Path, config: ModelConfig, weights: &mut WeightStore) -> Result<DecoderModel> {
    let name = canonical(&config.model_type).to_string();
    let spec_fn = ARCHITECTURES.iter().find(|(n, _)| *n == name).map(|(_, f)| *f).ok_or_else(|| {
        Error::checkpoint(
            dir.join("config.json"),
            format!(
                "unsupported model_type '{}' (supported: {})",
                config.model_type,
                supported_model_types().join(", ")
            ),
        )
    })?;
    let spec = spec_fn(&config);
    DecoderModel::load(config, spec, weights)
}
