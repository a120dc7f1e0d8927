//! From a path on disk to typed config and validated tensors.
pub mod config;
pub mod hub;
pub mod quant_config;
pub mod safetensors;
pub mod weights;

pub use config::{ModelConfig, RopeConfig, RopeScaling};
pub use hub::resolve_model_path;
pub use quant_config::{QuantConfig, QuantSpec};
pub use weights::{TensorKind, WeightStore};
