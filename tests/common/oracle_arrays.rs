//! Reading an oracle's tensors (safetensors written by tests/oracle/*.py) as arrays, and comparing
//! arrays, and greedy decoding: what the media oracle tests (vision, vision_gemma4, vision_qwen,
//! audio_gemma4) share.
use super::RawTensor;
use mlex::mlx::{Array, Dtype};

/// An F32 tensor's values.
pub fn f32_values(t: &RawTensor) -> Vec<f32> {
    assert_eq!(t.dtype, "F32", "{}", t.name);
    t.data.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

/// An F32 tensor as an array of its shape.
pub fn f32_array(t: &RawTensor) -> Array {
    let shape: Vec<i32> = t.shape.iter().map(|&d| d as i32).collect();
    Array::from_slice(&f32_values(t), &shape).unwrap()
}

/// An I32 tensor's values.
pub fn i32_values(t: &RawTensor) -> Vec<i32> {
    assert_eq!(t.dtype, "I32", "{}", t.name);
    t.data.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect()
}

/// The largest |a − b| over two arrays of one shape, in float32.
pub fn max_abs_diff(a: &Array, b: &Array) -> f32 {
    assert_eq!(a.shape(), b.shape());
    let f = |x: &Array| x.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
    let (a, b) = (f(a), f(b));
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// `n` greedy tokens after a prompt whose last logits are `last` (`[V]`): its argmax, then each
/// next one the argmax of `step(previous token)`'s logits (the model's one-token forward).
pub fn greedy(last: &Array, n: usize, mut step: impl FnMut(u32) -> Array) -> Vec<u32> {
    let argmax = |a: &Array| a.reshape(&[-1]).unwrap().argmax(0, false).unwrap().astype(Dtype::Uint32).unwrap().to_vec::<u32>().unwrap()[0];
    let mut got = vec![argmax(last)];
    while got.len() < n {
        let next = argmax(&step(*got.last().unwrap()));
        got.push(next);
    }
    got
}
