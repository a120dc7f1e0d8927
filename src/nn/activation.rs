//! Activations shared by several models, in MLX's own forms and order of operations, so that
//! their values follow mlx-lm's and mlx-vlm's.
use crate::error::Result;
use crate::mlx::{fast, Array, Device};

/// MLX's `gelu_approx` (`nn.GELU(approx="precise")`, the tanh form):
/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, in that order. On a GPU one compiled kernel,
/// as MLX's own function is compiled: its eight element-wise kernels were about a sixth of a
/// SigLIP block's launches (Gemma 3's tower). On the CPU the plain operations, whose values the
/// CPU oracle tests pin.
pub fn gelu_approx(x: &Array) -> Result<Array> {
    if crate::mlx::default_device()? == Device::Gpu {
        return fast::gelu_approx(x);
    }
    gelu_approx_ops(x)
}

/// [`gelu_approx`] as separate operations (its CPU form; the compiled kernel's reference).
pub fn gelu_approx_ops(x: &Array) -> Result<Array> {
    let dt = x.dtype();
    let c = |v: f32| Array::scalar_f32(v, dt);
    let inner = x.add(&c(0.044715)?.multiply(&x.power(&c(3.0)?)?)?)?;
    let t = c((2.0 / std::f64::consts::PI).sqrt() as f32)?.multiply(&inner)?.tanh()?;
    c(0.5)?.multiply(x)?.multiply(&c(1.0)?.add(&t)?)
}
