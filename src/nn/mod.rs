//! Layers shared by the architectures in `crate::models`.
pub mod attention;
pub mod cache;
pub mod embedding;
pub mod gated_delta;
pub mod kv_cache;
pub mod linear;
pub mod mlp;
pub mod module;
pub mod moe;
pub mod norm;
pub mod rope;
pub mod rotating_kv_cache;
pub mod state_cache;
pub mod switch;

pub use attention::{Attention, AttentionSpec};
pub use cache::{Cache, LayerCaches, Mask};
pub use embedding::Embedding;
pub use kv_cache::KvCache;
pub use linear::{Linear, Projections};
pub use mlp::{GateActivation, GatedMlp};
pub use module::Params;
pub use moe::{Routing, SparseMoe};
pub use norm::RmsNorm;
pub use rope::Rope;
pub use rotating_kv_cache::RotatingKvCache;
pub use state_cache::StateCache;
pub use switch::{ExpertActivation, SwitchGlu, SwitchLinear};
