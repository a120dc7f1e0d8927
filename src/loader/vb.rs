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
use crate::mlx::{Array, Dtype, QuantMode};
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

    /// A float tensor of this module in its stored dtype, not cast to the compute dtype: for the
    /// few parameters mlx-lm keeps in float32 whatever the model's dtype (its `cast_predicate`,
    /// e.g. deepseek_v3's `e_score_correction_bias`).
    pub fn get_uncast(&self, name: &str, shape: &[usize]) -> Result<Array> {
        self.take_uncast(name, shape, TensorKind::Float)
    }

    /// [`Vb::take`] without the cast to the compute dtype: tensors a sanitize step computes with
    /// in their stored precision, as mlx-lm does (deepseek_v3's re-quantized `kv_b_proj`).
    pub fn take_uncast(&self, name: &str, shape: &[usize], kind: TensorKind) -> Result<Array> {
        let mut store = self.store.borrow_mut();
        let compute = store.compute_dtype.take();
        let out = store.take(&self.path(name), shape, kind);
        store.compute_dtype = compute;
        out
    }

    /// The stored shape of tensor `name` of this module (for layouts that differ between
    /// exporters, e.g. a convolution's PyTorch `[out, in, kh, kw]` or MLX `[out, kh, kw, in]`).
    pub fn stored_shape(&self, name: &str) -> Option<Vec<usize>> {
        self.store.borrow().info(&self.path(name)).map(|(shape, _)| shape)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.store.borrow().contains(&self.path(name))
    }

    /// Drops tensor `name` of this module if present (precomputed tables the model recomputes).
    pub fn discard(&self, name: &str) {
        self.store.borrow_mut().discard(&self.path(name));
    }

    /// Whether any tensor is stored under this module.
    pub fn holds_any(&self) -> bool {
        let under = format!("{}.", self.prefix);
        self.store.borrow().names().any(|n| n.starts_with(&under))
    }

    /// Drops every tensor under this module (a part the model does not build, e.g. the vision
    /// tower of a multimodal checkpoint when only its text model runs).
    pub fn discard_all(&self) {
        let under = format!("{}.", self.prefix);
        let mut store = self.store.borrow_mut();
        let names: Vec<String> = store.names().filter(|n| n.starts_with(&under)).cloned().collect();
        for n in names {
            store.discard(&n);
        }
    }

    /// Stacks this module's tensors `parts` (short names) into `into` (a short name): see
    /// `WeightStore::stack`. False when the first part is absent.
    pub fn stack(&self, parts: &[String], into: &str) -> Result<bool> {
        let full: Vec<String> = parts.iter().map(|p| self.path(p)).collect();
        self.store.borrow_mut().stack(&full, &self.path(into))
    }

    /// Replaces this module's stored tensor `name` by the tensors `f` makes from it, their names
    /// short as well: see `WeightStore::remake`. False when `name` is not stored.
    pub fn remake(&self, name: &str, f: impl FnOnce(Array) -> Result<Vec<(String, Array)>>) -> Result<bool> {
        self.store
            .borrow_mut()
            .remake(&self.path(name), |a| Ok(f(a)?.into_iter().map(|(n, a)| (self.path(&n), a)).collect()))
    }

    /// The compute dtype the store casts floats to, when one is set.
    pub fn dtype(&self) -> Option<Dtype> {
        self.store.borrow().compute_dtype
    }

    /// This module's quantization when the checkpoint stores it quantized (mlx-lm's rule: a
    /// module is quantized exactly when its `.scales` tensor is present). As mlx-lm 0.32's loader
    /// does: a module named in the `quantization` block takes that entry (an entry without
    /// `mode` is affine); any other module's group size, bits and mode are read off its stored
    /// tensors (`in_features` wide), since the block's default can be wrong for it (MoE
    /// checkpoints keep 8-bit affine routers beside mxfp4 experts).
    pub fn quant_spec(&self, in_features: usize) -> Result<Option<QuantSpec>> {
        if !self.contains("scales") {
            return Ok(None);
        }
        if let Some(q) = self.quant {
            if let Some(spec) = q.overrides.get(&self.prefix) {
                return Ok(*spec);
            }
        }
        let store = self.store.borrow();
        if let (Some((wshape, _)), Some((sshape, sdtype))) = (store.info(&self.path("weight")), store.info(&self.path("scales"))) {
            return infer_spec(&wshape, &sshape, sdtype, in_features)
                .map(Some)
                .map_err(|m| Error::checkpoint("config.json", format!("'{}': {m}", self.prefix)));
        }
        match self.quant.and_then(|q| q.default) {
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

/// Group size, bits and mode of a stored quantized weight (mlx-lm's `infer_quant_config`): only
/// affine keeps float scales; each other mode allows one (bits, group) pair.
fn infer_spec(weight: &[usize], scales: &[usize], scales_dtype: Dtype, in_features: usize) -> std::result::Result<QuantSpec, String> {
    let (Some(&packed), Some(&groups)) = (weight.last(), scales.last()) else {
        return Err("quantized weight without dimensions".into());
    };
    if groups == 0 || in_features % groups != 0 || (packed * 32) % in_features != 0 {
        return Err(format!(
            "stored shapes (weight {weight:?}, scales {scales:?}) do not fit {in_features} input features"
        ));
    }
    let (group_size, bits) = ((in_features / groups) as u32, (packed * 32 / in_features) as u32);
    let mode = if scales_dtype != Dtype::Uint8 {
        QuantMode::Affine
    } else {
        match (bits, group_size) {
            (4, 16) => QuantMode::Nvfp4,
            (4, 32) => QuantMode::Mxfp4,
            (8, 32) => QuantMode::Mxfp8,
            _ => return Err(format!("cannot infer the quantization mode of {bits} bits with group size {group_size}")),
        }
    };
    mode.validate(bits, group_size)?;
    Ok(QuantSpec { group_size, bits, mode })
}
