//! `config.json` as typed structs: serde views with mlx-lm's defaults, validated at load with
//! errors that name the file and the field.
use super::quant_config::QuantConfig;
use crate::error::{Error, Result};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// What every architecture shares, read by the session and the engine. Each architecture reads
/// the rest of config.json into its own config struct ([`ModelConfig::parse`]).
#[derive(Debug, Clone, Deserialize)]
pub struct ModelConfig {
    pub model_type: String,
    pub num_hidden_layers: usize,
    pub vocab_size: usize,
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    #[serde(default)]
    pub eos_token_id: Option<Value>,
    #[serde(default)]
    pub bos_token_id: Option<Value>,
    /// Parsed from `quantization` (mlx-lm) or `quantization_config`.
    #[serde(skip)]
    pub quantization: Option<QuantConfig>,
    /// The text model's view of config.json: a nested `text_config` (multimodal checkpoints such
    /// as gemma3 / qwen3_5) merged over the top level, the outer `model_type` kept as
    /// `outer_model_type`.
    #[serde(skip)]
    pub raw: Value,
    /// The file read (errors name it).
    #[serde(skip)]
    pub path: PathBuf,
}

/// Rotary settings of a config: `rope_theta`, `rope_scaling`, transformers 5's `rope_parameters`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RopeFields {
    #[serde(default)]
    pub rope_theta: Option<f32>,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub rope_parameters: Option<Value>,
}

impl RopeFields {
    /// The rotary variant, `default_theta` when the config gives none.
    pub fn parse(&self, default_theta: f32) -> std::result::Result<RopeConfig, String> {
        let params = self.rope_parameters.as_ref();
        let theta = self
            .rope_theta
            .or_else(|| params.and_then(|p| p.get("rope_theta")).and_then(|v| v.as_f64()).map(|v| v as f32))
            .unwrap_or(default_theta);
        let scaling_v = self.rope_scaling.as_ref().or(params).filter(|v| !v.is_null());
        let scaling = match scaling_v {
            None => RopeScaling::Default,
            Some(v) => parse_scaling(v)?,
        };
        Ok(RopeConfig { theta, traditional: self.rope_traditional, scaling })
    }
}

/// Rotary embedding variants of mlx-lm's `initialize_rope`.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum RopeScaling {
    #[default]
    Default,
    /// Positions divided by `factor`.
    Linear { factor: f32 },
    /// Dynamic NTK: base grows with the sequence length.
    Dynamic { factor: f32 },
    Llama3 { factor: f32, low_freq_factor: f32, high_freq_factor: f32, original_max_position_embeddings: f32 },
    Yarn {
        factor: f32,
        original_max_position_embeddings: f32,
        beta_fast: f32,
        beta_slow: f32,
        mscale: f32,
        mscale_all_dim: f32,
    },
}

#[derive(Debug, Clone, Default)]
pub struct RopeConfig {
    pub theta: f32,
    pub traditional: bool,
    pub scaling: RopeScaling,
}

impl ModelConfig {
    /// The half-precision dtype config.json declares for the weights (`torch_dtype`, or
    /// transformers 5's `dtype`), if it declares float16 or bfloat16: on a GPU, what mlex
    /// computes in when the caller names no dtype, whatever the widest stored tensor is (GGUF
    /// conversions keep norms in float32).
    pub fn declared_half_dtype(&self) -> Option<crate::mlx::Dtype> {
        let v = self.raw.get("torch_dtype").or_else(|| self.raw.get("dtype"))?.as_str()?;
        match v {
            "float16" | "half" => Some(crate::mlx::Dtype::Float16),
            "bfloat16" => Some(crate::mlx::Dtype::Bfloat16),
            _ => None,
        }
    }

    /// Reads and validates `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::ModelNotFound(format!("{} has no config.json", dir.display()))
            } else {
                Error::io(format!("reading {}", path.display()), e)
            }
        })?;
        Self::from_json(&text, &path)
    }

    pub fn from_json(text: &str, path: &Path) -> Result<Self> {
        let top: Value =
            serde_json::from_str(text).map_err(|e| Error::checkpoint(path, format!("not valid JSON: {e}")))?;
        if !top.is_object() {
            return Err(Error::checkpoint(path, "bad config: expected a JSON object"));
        }
        let raw = text_view(&top);
        let mut cfg: ModelConfig = deserialize(&raw, path)?;
        let q = top.get("quantization").or_else(|| top.get("quantization_config"));
        if let Some(q) = q {
            cfg.quantization = Some(QuantConfig::from_json(q).map_err(|m| Error::checkpoint(path, m))?);
        }
        cfg.raw = raw;
        cfg.path = path.to_path_buf();
        cfg.validate().map_err(|m| Error::checkpoint(path, m))?;
        Ok(cfg)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        for (name, v) in [("num_hidden_layers", self.num_hidden_layers), ("vocab_size", self.vocab_size)] {
            check_size(name, v)?;
        }
        Ok(())
    }

    /// config.json read as architecture config `T` (serde defaults are mlx-lm's); errors name the
    /// file and the field.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T> {
        deserialize(&self.raw, &self.path)
    }

    /// An error about this config.json.
    pub fn error(&self, message: impl Into<String>) -> Error {
        Error::checkpoint(&self.path, message)
    }

    /// The context length the model was trained for, when the config says.
    pub fn context_length(&self) -> Option<usize> {
        self.max_position_embeddings
    }
}

/// A size field must be positive and plausible.
pub fn check_size(name: &str, v: usize) -> std::result::Result<(), String> {
    if v == 0 {
        return Err(format!("field '{name}' must be positive"));
    }
    if v > (1 << 24) {
        return Err(format!("field '{name}' = {v} is implausibly large"));
    }
    Ok(())
}

/// `text_config` merged over the top level (the text model's fields win); the top level's
/// `model_type` stays reachable as `outer_model_type`.
fn text_view(top: &Value) -> Value {
    let mut merged = top.clone();
    if let Some(text) = top.get("text_config").and_then(|t| t.as_object()) {
        let m = merged.as_object_mut().expect("an object");
        if let Some(outer) = top.get("model_type") {
            m.insert("outer_model_type".into(), outer.clone());
        }
        for (k, v) in text {
            m.insert(k.clone(), v.clone());
        }
        m.remove("text_config");
    }
    merged
}

// serde_path_to_error names the offending field ("field 'num_hidden_layers': invalid type …").
fn deserialize<T: DeserializeOwned>(raw: &Value, path: &Path) -> Result<T> {
    serde_path_to_error::deserialize(raw.clone()).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        if field == "." {
            Error::checkpoint(path, format!("bad config: {inner}"))
        } else {
            Error::checkpoint(path, format!("field '{field}': {inner}"))
        }
    })
}

fn parse_scaling(v: &Value) -> std::result::Result<RopeScaling, String> {
    let kind = v
        .get("type")
        .or_else(|| v.get("rope_type"))
        .and_then(|t| t.as_str())
        .unwrap_or("default");
    let num = |key: &str| v.get(key).and_then(|x| x.as_f64()).map(|x| x as f32);
    let factor = || {
        num("factor").filter(|f| *f > 0.0).ok_or_else(|| format!("rope_scaling of type '{kind}' needs a positive 'factor'"))
    };
    Ok(match kind {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "dynamic" => RopeScaling::Dynamic { factor: factor()? },
        "llama3" => RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: num("low_freq_factor").unwrap_or(1.0),
            high_freq_factor: num("high_freq_factor").unwrap_or(4.0),
            original_max_position_embeddings: num("original_max_position_embeddings").unwrap_or(8192.0),
        },
        "yarn" => RopeScaling::Yarn {
            factor: factor()?,
            original_max_position_embeddings: num("original_max_position_embeddings").unwrap_or(4096.0),
            beta_fast: num("beta_fast").unwrap_or(32.0),
            beta_slow: num("beta_slow").unwrap_or(1.0),
            mscale: num("mscale").unwrap_or(1.0),
            mscale_all_dim: num("mscale_all_dim").unwrap_or(0.0),
        },
        other => return Err(format!("unsupported rope_scaling type '{other}'")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx::Dtype;

    #[test]
    fn declared_half_dtype_reads_torch_dtype_or_dtype() {
        let cfg = |extra: &str| {
            let text = format!(r#"{{"model_type": "llama", "num_hidden_layers": 1, "vocab_size": 8{extra}}}"#);
            ModelConfig::from_json(&text, Path::new("config.json")).unwrap()
        };
        assert_eq!(cfg(r#", "torch_dtype": "float16""#).declared_half_dtype(), Some(Dtype::Float16));
        assert_eq!(cfg(r#", "dtype": "bfloat16""#).declared_half_dtype(), Some(Dtype::Bfloat16));
        assert_eq!(cfg(r#", "torch_dtype": "float32""#).declared_half_dtype(), None);
        assert_eq!(cfg("").declared_half_dtype(), None);
    }
}
