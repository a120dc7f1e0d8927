//! Explicitly keyed randomness, so a seed fully determines a generation.
use super::array::Array;
use super::sys;
use crate::error::Result;

/// A PRNG key; `next` splits it so every draw uses a fresh subkey.
pub struct RandomKey {
    key: Array,
}

impl RandomKey {
    pub fn new(seed: u64) -> Result<Self> {
        Ok(RandomKey { key: Array::try_from_op(|out| unsafe { sys::mlex_random_key(seed, out) })? })
    }

    /// Returns a fresh subkey and advances the state.
    pub fn next(&mut self) -> Result<Array> {
        let mut a = std::ptr::null_mut();
        let mut b = std::ptr::null_mut();
        super::error::check(unsafe { sys::mlex_random_split(self.key.raw(), &mut a, &mut b) })?;
        self.key = Array::from_raw(a);
        Ok(Array::from_raw(b))
    }
}

/// Draws one index per row from unnormalised log-probabilities along `axis`.
pub fn categorical(logits: &Array, axis: i32, key: &Array) -> Result<Array> {
    Array::try_from_op(|out| unsafe { sys::mlex_random_categorical(logits.raw(), axis, key.raw(), out) })
}

/// Normal(0, `scale`) samples.
pub fn normal(shape: &[i32], dtype: crate::mlx::Dtype, scale: f32, key: &Array) -> Result<Array> {
    Array::try_from_op(|out| unsafe {
        sys::mlex_random_normal(shape.as_ptr(), shape.len(), dtype.to_sys(), scale, key.raw(), out)
    })
}
