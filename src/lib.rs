//! mlex: run local LLMs on Apple's MLX from Rust, Node.js and the command line.
//!
//! One Rust core over MLX's C++ API (through our own flat C shim), three backends (Metal, CUDA,
//! CPU). Start with [`Session`]: load a checkpoint, then generate from chat messages.
pub mod error;
pub mod mlx;
pub mod gguf;
pub mod convert;
