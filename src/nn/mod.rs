//! Layers shared by the architectures in `crate::models`.
pub mod attention;
pub mod embedding;
pub mod kv_cache;
pub mod linear;
pub mod mlp;
pub mod norm;
pub mod rope;

pub use attention::Attention;
pub use embedding::Embedding;
pub use kv_cache::KvCache;
pub use linear::{Linear, Projections};
pub use mlp::GatedMlp;
pub use norm::RmsNorm;
pub use rope::Rope;
