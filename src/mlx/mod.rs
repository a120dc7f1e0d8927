//! Safe Rust over MLX (through the C++ shim in `shim.cpp`).
pub mod sys;
