//! Architectures. Each file maps one `model_type` family onto the shared decoder in
//! `transformer.rs`; `registry.rs` picks one by `model_type` (with aliases).
pub mod llama;
pub mod qwen2;
pub mod qwen3;
pub mod registry;
pub mod transformer;

pub use registry::{build_model, supported_model_types};
pub use transformer::{ArchSpec, DecoderModel};
