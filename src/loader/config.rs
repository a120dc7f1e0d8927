//! `config.json` as typed structs: serde views with mlx-lm's defaults, validated at load with
//! errors that name the file and the field.
use super::quant_config::QuantConfig;
use crate::error::{Error, Result};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// The fields our architectures read (a superset across llama / qwen2 / qwen3).
#[derive(Debug, Clone, Deserialize)]
pub struct ModelConfig {
    pub model_type: String,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    pub vocab_size: usize,
    #[serde(default)]
    pub rope_theta: Option<f32>,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    /// transformers ≥ 5 nests rope_theta / rope_scaling here.
    #[serde(default)]
    pub rope_parameters: Option<Value>,
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default)]
    pub attention_bias: Option<bool>,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    #[serde(default)]
    pub eos_token_id: Option<Value>,
    #[serde(default)]
    pub bos_token_id: Option<Value>,
    /// Parsed from `quantization` (mlx-lm) or `quantization_config`.
    #[serde(skip)]
    pub quantization: Option<QuantConfig>,
    #[serde(skip)]
    pub rope: RopeConfig,
}

fn default_eps() -> f32 {
    1e-6
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
        let raw: Value =
            serde_json::from_str(text).map_err(|e| Error::checkpoint(path, format!("not valid JSON: {e}")))?;
        // serde_path_to_error names the offending field ("field 'num_hidden_layers': invalid type …").
        let mut cfg: ModelConfig = serde_path_to_error::deserialize(raw.clone()).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.into_inner();
            if field == "." {
                Error::checkpoint(path, format!("bad config: {inner}"))
            } else {
                Error::checkpoint(path, format!("field '{field}': {inner}"))
            }
        })?;
        let q = raw.get("quantization").or_else(|| raw.get("quantization_config"));
        if let Some(q) = q {
            cfg.quantization = Some(QuantConfig::from_json(q).map_err(|m| Error::checkpoint(path, m))?);
        }
        cfg.rope = cfg.parse_rope().map_err(|m| Error::checkpoint(path, m))?;
        cfg.validate().map_err(|m| Error::checkpoint(path, m))?;
        Ok(cfg)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        let positive = [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("vocab_size", self.vocab_size),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(format!("field '{name}' must be positive"));
            }
            if v > (1 << 24) {
                return Err(format!("field '{name}' = {v} is implausibly large"));
            }
        }
        let kv = self.num_kv_heads();
        if kv == 0 || self.num_attention_heads % kv != 0 {
            return Err(format!(
                "field 'num_key_value_heads' = {kv} must divide num_attention_heads = {}",
                self.num_attention_heads
            ));
        }
        if self.head_dim.is_none() && self.hidden_size % self.num_attention_heads != 0 {
            return Err("hidden_size is not a multiple of num_attention_heads and no head_dim is given".into());
        }
        if self.head_dim() % 2 != 0 {
            return Err(format!("field 'head_dim' = {} must be even for rotary embeddings", self.head_dim()));
        }
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0) {
            return Err(format!("field 'rms_norm_eps' = {} is out of range", self.rms_norm_eps));
        }
        Ok(())
    }

    pub fn num_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// The context length the model was trained for, when the config says.
    pub fn context_length(&self) -> Option<usize> {
        self.max_position_embeddings
    }

    fn parse_rope(&self) -> std::result::Result<RopeConfig, String> {
        let params = self.rope_parameters.as_ref();
        let theta = self
            .rope_theta
            .or_else(|| params.and_then(|p| p.get("rope_theta")).and_then(|v| v.as_f64()).map(|v| v as f32))
            .unwrap_or(10000.0);
        let scaling_v = self.rope_scaling.as_ref().or(params).filter(|v| !v.is_null());
        let scaling = match scaling_v {
            None => RopeScaling::Default,
            Some(v) => parse_scaling(v)?,
        };
        Ok(RopeConfig { theta, traditional: self.rope_traditional, scaling })
    }
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
