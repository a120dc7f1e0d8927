//! Scoped weight names (candle's `VarBuilder::pp`): a layer is loaded from a `Vb` already
//! pointing at its module path, and asks for its tensors by their short names, so no
//! architecture builds "model.layers.{i}.self_attn.q_proj.weight" strings by hand.
//!
//! ```ignore
//! let layer = vb.pp("model").pp("layers").pp(3);
//! let q = Linear::load(&layer.pp("self_attn").pp("q_proj"), hidden, heads * head_dim, false)?;
//! ```
use super::quant_config::{QuantConfig, QuantSpec};
use super::weights::{TensorKind, WeightStore};
use crate::error::{Error, Result};
use crate::mlx::{Array, Dtype};
use std::cell::RefCell;
use std::fmt::Display;

#[derive(Clone)]
pub struct Vb<'a> {
    store: &'a RefCell<WeightStore>,
    quant: Option<&'a QuantConfig>,
    prefix: String,
}

impl<'a> Vb<'a> {
    pub fn new(store: &'a RefCell<WeightStore>, quant: Option<&'a QuantConfig>) -> Self {
        Vb { store, quant, prefix: String::new() }
    }

    /// The module `name` below this one.
    pub fn pp(&self, name: impl Display) -> Vb<'a> {
        let prefix = if self.prefix.is_empty() { name.to_string() } else { format!("{}.{name}", self.prefix) };
        Vb { store: self.store, quant: self.quant, prefix }
    }

    /// This module's path (`model.layers.3.self_attn`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The full name of tensor `name` of this module.
    pub fn path(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    /// Takes tensor `name` of this module, checking its shape and kind (see `WeightStore::take`).
    pub fn take(&self, name: &str, shape: &[usize], kind: TensorKind) -> Result<Array> {
        self.store.borrow_mut().take(&self.path(name), shape, kind)
    }

    /// A float tensor of this module.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Array> {
        self.take(name, shape, TensorKind::Float)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.store.borrow().contains(&self.path(name))
    }

    /// Drops tensor `name` of this module if present (precomputed tables the model recomputes).
    pub fn discard(&self, name: &str) {
        self.store.borrow_mut().discard(&self.path(name));
    }

    /// The compute dtype the store casts floats to, when one is set.
    pub fn dtype(&self) -> Option<Dtype> {
        self.store.borrow().compute_dtype
    }

    /// This module's quantization when the checkpoint stores it quantized (mlx-lm's rule: a
    /// module is quantized exactly when its `.scales` tensor is present). A per-module entry of
    /// the `quantization` block wins over the default.
    pub fn quant_spec(&self) -> Result<Option<QuantSpec>> {
        if !self.contains("scales") {
            return Ok(None);
        }
        match self.quant.and_then(|q| q.for_module(&self.prefix)) {
            Some(spec) => Ok(Some(spec)),
            None => Err(Error::checkpoint(
                "config.json",
                format!(
                    "'{}.scales' is present but config.json has no quantization settings for '{}'",
                    self.prefix, self.prefix
                ),
            )),
        }
    }
}
