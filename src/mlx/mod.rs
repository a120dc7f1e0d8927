//! Safe Rust over MLX, through our C++ shim (`shim.h` / `shim.cpp`).
//!
//! MLX is not thread-safe: every [`Array`] is created and used on the engine thread
//! (`crate::generate::engine`); arrays are `Send` so they can be built there, never `Sync`.
mod array;
mod blas;
mod device;
mod dtype;
mod error;
mod ops;
pub mod quant;
mod quant_mode;
pub mod random;
pub mod threads;
pub(crate) mod sys;

pub use array::{async_eval, eval, graph_census, prefetch_to_device, Array};
pub use blas::blas_backend;
pub use device::*;
pub use dtype::{Dtype, Element};
pub use ops::fast;
pub use quant::QuantMode;
