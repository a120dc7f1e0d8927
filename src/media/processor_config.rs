//! Reading an image processor's settings from a checkpoint's `processor_config.json` (image
//! settings under `image_processor`) or flat `preprocessor_config.json`, the same way for every
//! model: absent or null keys keep the model's defaults, and a value mlex cannot reproduce is an
//! InvalidArgument naming the key, never a silently different preprocessing.
use crate::error::{Error, Result};
use serde_json::Value;

pub(crate) struct ProcessorConfig<'a> {
    cfg: &'a Value,
}

impl<'a> ProcessorConfig<'a> {
    pub(crate) fn new(cfg: &'a Value) -> Self {
        ProcessorConfig { cfg: cfg.get("image_processor").filter(|v| v.is_object()).unwrap_or(cfg) }
    }

    /// The key's value, unless absent or null.
    pub(crate) fn get(&self, k: &str) -> Option<&'a Value> {
        self.cfg.get(k).filter(|v| !v.is_null())
    }

    pub(crate) fn bad(k: &str, v: &Value) -> Error {
        Error::InvalidArgument(format!("processor config: unsupported {k} {v}"))
    }

    /// A count between 1 and `max`, if given.
    pub(crate) fn size(&self, k: &str, max: u64) -> Result<Option<usize>> {
        Self::size_of(k, self.get(k), max)
    }

    /// `v` (the value of key `k`) as a count between 1 and `max`, if given.
    pub(crate) fn size_of(k: &str, v: Option<&Value>, max: u64) -> Result<Option<usize>> {
        match v.filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(v) => v.as_u64().filter(|&n| n > 0 && n <= max).map(|n| Some(n as usize)).ok_or_else(|| Self::bad(k, v)),
        }
    }

    /// `rescale_factor`, if given (finite and positive).
    pub(crate) fn rescale_factor(&self) -> Result<Option<f64>> {
        match self.get("rescale_factor") {
            None => Ok(None),
            Some(v) => v.as_f64().filter(|f| f.is_finite() && *f > 0.0).map(Some).ok_or_else(|| Self::bad("rescale_factor", v)),
        }
    }

    /// Each of `keys` absent or true (the steps mlex always does).
    pub(crate) fn require_on(&self, keys: &[&str]) -> Result<()> {
        for k in keys {
            if let Some(v) = self.get(k) {
                if v.as_bool() != Some(true) {
                    return Err(Self::bad(k, v));
                }
            }
        }
        Ok(())
    }

    /// `(image_mean, image_std)` when `do_normalize` is on (`default_on` when absent), each
    /// defaulting to 0.5 per channel; a zero std is refused.
    pub(crate) fn normalize(&self, default_on: bool) -> Result<Option<([f32; 3], [f32; 3])>> {
        let on = match self.get("do_normalize") {
            None => default_on,
            Some(v) => v.as_bool().ok_or_else(|| Self::bad("do_normalize", v))?,
        };
        if !on {
            return Ok(None);
        }
        let triple = |k: &str| -> Result<[f32; 3]> {
            match self.get(k) {
                None => Ok([0.5; 3]),
                Some(v) => match v.as_array().map(|a| a.iter().map(|x| x.as_f64()).collect::<Option<Vec<_>>>()) {
                    Some(Some(a)) if a.len() == 3 => Ok([a[0] as f32, a[1] as f32, a[2] as f32]),
                    _ => Err(Self::bad(k, v)),
                },
            }
        };
        let (mean, std) = (triple("image_mean")?, triple("image_std")?);
        if std.contains(&0.0) {
            return Err(Self::bad("image_std", self.get("image_std").unwrap_or(&Value::Null)));
        }
        Ok(Some((mean, std)))
    }
}
