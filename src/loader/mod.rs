//! From a path on disk to typed config and validated tensors.
pub mod config;
pub mod hub;
pub mod quant_config;
pub mod safetensors;
pub mod safetensors_header;
pub mod vb;
pub mod weights;

pub use config::{check_size, ModelConfig, RopeConfig, RopeFields, RopeScaling};
pub use hub::resolve_model_path;
pub use quant_config::{QuantConfig, QuantSpec};
pub use vb::Vb;
pub use weights::{TensorKind, WeightStore};
