//! The `quantization` block of an mlx-lm config: a global setting plus per-module overrides.
//!
//! ```json
//! "quantization": {"group_size": 64, "bits": 4, "mode": "affine",
//!                  "model.embed_tokens": {"group_size": 32, "bits": 8}, "lm_head": false}
//! ```
use crate::mlx::QuantMode;
use serde_json::Value;
use std::collections::HashMap;

/// How one module is quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantSpec {
    pub group_size: u32,
    pub bits: u32,
    pub mode: QuantMode,
}

impl QuantSpec {
    fn from_obj(v: &Value, default_mode: QuantMode, require_bits: bool, ctx: &str) -> Result<Self, String> {
        let mode = match v.get("mode").and_then(|m| m.as_str()) {
            Some(m) => QuantMode::parse(m).ok_or_else(|| format!("{ctx}: unknown quantization mode '{m}'"))?,
            None => default_mode,
        };
        let default_gs = match mode {
            QuantMode::Affine => 64,
            QuantMode::Nvfp4 => 16,
            _ => 32,
        };
        let group_size = match v.get("group_size") {
            Some(g) => g
                .as_u64()
                .and_then(|g| u32::try_from(g).ok())
                .ok_or_else(|| format!("{ctx}: group_size must be an integer"))?,
            None => default_gs,
        };
        let bits = match v.get("bits") {
            Some(b) => b
                .as_u64()
                .and_then(|b| u32::try_from(b).ok())
                .ok_or_else(|| format!("{ctx}: bits must be an integer"))?,
            None if mode == QuantMode::Affine && require_bits => return Err(format!("{ctx}: missing 'bits'")),
            None => if mode == QuantMode::Mxfp8 { 8 } else { 4 },
        };
        mode.validate(bits, group_size).map_err(|m| format!("{ctx}: {m}"))?;
        Ok(QuantSpec { group_size, bits, mode })
    }
}

/// Parsed quantization settings.
#[derive(Debug, Clone, Default)]
pub struct QuantConfig {
    pub default: Option<QuantSpec>,
    /// Module path → spec, or `None` for a module kept in floating point (`false` in JSON).
    pub overrides: HashMap<String, Option<QuantSpec>>,
}

impl QuantConfig {
    pub fn from_json(v: &Value) -> Result<Self, String> {
        let obj = v.as_object().ok_or("field 'quantization' must be an object")?;
        let mode = match obj.get("mode").and_then(|m| m.as_str()) {
            Some(m) => QuantMode::parse(m).ok_or_else(|| format!("quantization: unknown mode '{m}'"))?,
            None => QuantMode::Affine,
        };
        let default = if obj.contains_key("bits") || obj.contains_key("group_size") {
            Some(QuantSpec::from_obj(v, mode, true, "field 'quantization'")?)
        } else {
            None
        };
        let mut overrides = HashMap::new();
        for (k, val) in obj {
            if matches!(k.as_str(), "bits" | "group_size" | "mode" | "quant_method") {
                continue;
            }
            let ctx = format!("field 'quantization.{k}'");
            match val {
                Value::Bool(false) => {
                    overrides.insert(k.clone(), None);
                }
                Value::Object(_) => {
                    // As mlx's `to_quantized(**entry)`: a missing mode is affine, and missing
                    // group size / bits are the mode's defaults, not the block's.
                    let spec = QuantSpec::from_obj(val, QuantMode::Affine, false, &ctx)?;
                    overrides.insert(k.clone(), Some(spec));
                }
                Value::Bool(true) => {
                    overrides.insert(k.clone(), default);
                }
                _ => {} // unknown scalar keys (e.g. "quant_method" of other tools) are not module specs
            }
        }
        Ok(QuantConfig { default, overrides })
    }

    /// The spec for a module path (e.g. `model.layers.0.self_attn.q_proj`), if it is quantized.
    pub fn for_module(&self, path: &str) -> Option<QuantSpec> {
        match self.overrides.get(path) {
            Some(spec) => *spec,
            None => self.default,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_and_overrides() {
        let v: Value = serde_json::from_str(
            r#"{"group_size":64,"bits":4,"model.embed_tokens":{"group_size":32,"bits":8},"lm_head":false}"#,
        )
        .unwrap();
        let q = QuantConfig::from_json(&v).unwrap();
        assert_eq!(q.for_module("model.layers.0.mlp.up_proj").unwrap().bits, 4);
        assert_eq!(q.for_module("model.embed_tokens").unwrap().group_size, 32);
        assert!(q.for_module("lm_head").is_none());
    }

    #[test]
    fn override_without_mode_is_affine() {
        // An mxfp4 checkpoint whose routers stay 8-bit affine (mlx-lm writes no mode for them).
        let v: Value = serde_json::from_str(
            r#"{"group_size":32,"bits":4,"mode":"mxfp4","model.layers.0.mlp.gate":{"group_size":64,"bits":8}}"#,
        )
        .unwrap();
        let q = QuantConfig::from_json(&v).unwrap();
        let gate = q.for_module("model.layers.0.mlp.gate").unwrap();
        assert_eq!((gate.mode, gate.bits, gate.group_size), (QuantMode::Affine, 8, 64));
        assert_eq!(q.for_module("model.layers.0.mlp.experts").unwrap().mode, QuantMode::Mxfp4);
    }

    #[test]
    fn rejects_sizes_that_wrap_to_valid_ones() {
        // 2^32 + 64 and 2^32 + 4 once came through `as u32` as group size 64 and 4 bits (seen
        // while writing fuzz/fuzz_targets/config.rs, which now checks sizes are read as given).
        for q in [r#"{"group_size":4294967360,"bits":4}"#, r#"{"group_size":64,"bits":4294967300}"#] {
            let v: Value = serde_json::from_str(q).unwrap();
            let e = QuantConfig::from_json(&v).unwrap_err();
            assert!(e.contains("must be an integer"), "{q}: {e}");
        }
    }

    #[test]
    fn rejects_bits_7() {
        let v: Value = serde_json::from_str(r#"{"group_size":64,"bits":7}"#).unwrap();
        let e = QuantConfig::from_json(&v).unwrap_err();
        assert!(e.contains("bits 7"), "{e}");
    }
}
