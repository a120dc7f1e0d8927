//! smollm3. Follows mlx-lm `models/smollm3.py`: llama (its `ModelArgs` defaults, tied embeddings
//! by default) whose layers listed as 0 in `no_rope_layers` attend without rotary positions. When
//! the list is absent, layer `i` skips rope exactly when `(i + 1) % no_rope_layer_interval == 0`
//! (interval 4 by default); a given list must have one entry per layer.
use super::transformer::{ArchSpec, DecoderConfig, DecoderModel};
use super::{ArchConfig, Architecture, CausalLm, Loadable};
use crate::error::Result;
use crate::loader::{ModelConfig, Vb};
use crate::mlx::{Array, Dtype};
use crate::nn::{LayerCaches, Params};
use serde::Deserialize;
use serde_json::Value;

// ---- config -------------------------------------------------------------------------------

#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    #[serde(flatten)]
    pub base: DecoderConfig,
    #[serde(default = "default_interval")]
    pub no_rope_layer_interval: usize,
    /// Per layer: truthy = rotary positions, falsy = none (mlx-lm tests `not use_rope`).
    #[serde(default)]
    pub no_rope_layers: Option<Vec<Value>>,
    /// llama's per-layer attention kinds; only full attention is supported here.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
}

fn default_interval() -> usize {
    4
}

impl Config {
    /// Whether each layer rotates q/k (mlx-lm's `no_rope_layers` after `__post_init__`).
    pub fn uses_rope(&self) -> std::result::Result<Vec<bool>, String> {
        let n = self.base.num_hidden_layers;
        match &self.no_rope_layers {
            Some(list) => {
                if list.len() != n {
                    return Err(format!(
                        "field 'no_rope_layers' has {} entries but num_hidden_layers = {n}",
                        list.len()
                    ));
                }
                list.iter()
                    .enumerate()
                    .map(|(i, v)| match v {
                        Value::Bool(b) => Ok(*b),
                        Value::Number(x) => Ok(x.as_f64().is_some_and(|x| x != 0.0)),
                        Value::Null => Ok(false),
                        other => Err(format!("field 'no_rope_layers[{i}]' = {other} is not a number or boolean")),
                    })
                    .collect()
            }
            None => {
                let k = self.no_rope_layer_interval;
                if k == 0 {
                    return Err("field 'no_rope_layer_interval' must be positive".into());
                }
                Ok((0..n).map(|i| (i + 1) % k != 0).collect())
            }
        }
    }
}

impl ArchConfig for Config {
    fn validate(&self) -> std::result::Result<(), String> {
        self.base.validate()?;
        if let Some(t) = self.layer_types.iter().flatten().find(|t| t.as_str() != "full_attention") {
            return Err(format!("field 'layer_types': '{t}' layers are not supported (only full_attention)"));
        }
        self.uses_rope().map(|_| ())
    }
}

// ---- model --------------------------------------------------------------------------------

/// The shared llama-family decoder, built with no rotary embedding in the no-rope layers.
pub struct SmolLm3(pub DecoderModel);

impl Params for SmolLm3 {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        self.0.params(out)
    }
}

impl CausalLm for SmolLm3 {
    fn embed(&self, tokens: &Array) -> Result<Array> {
        self.0.embed(tokens)
    }

    fn forward_embeddings(&self, h: Array, caches: &mut LayerCaches) -> Result<Array> {
        self.0.forward_embeddings(h, caches)
    }

    fn make_caches(&self) -> LayerCaches {
        self.0.make_caches()
    }

    fn vocab_size(&self) -> usize {
        self.0.vocab_size
    }

    fn dtype(&self) -> Dtype {
        self.0.dtype()
    }
}

// ---- load ---------------------------------------------------------------------------------

impl Loadable for SmolLm3 {
    type Config = Config;

    fn load(c: Config, _: &ModelConfig, vb: &Vb) -> Result<Self> {
        let rope = c.uses_rope().map_err(crate::error::Error::InvalidArgument)?;
        // mlx-lm builds llama's attention: `attention_bias` on all four projections.
        let bias = c.base.attention_bias.unwrap_or(false);
        let spec = ArchSpec { qkv_bias: bias, o_bias: bias, mlp_bias: c.base.mlp_bias, qk_norm: false, tie_default: true };
        Ok(SmolLm3(DecoderModel::load_with_rope(&c.base, spec, vb, |i| rope[i])?))
    }
}

pub const ARCH: Architecture = Architecture::new::<SmolLm3>("smollm3", &[]);

#[cfg(test)]
mod tests {
    use super::Config;
    use crate::loader::ModelConfig;
    use serde_json::{json, Value};

    fn base(layers: usize) -> Value {
        json!({
            "model_type": "smollm3", "hidden_size": 64, "num_hidden_layers": layers, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 320
        })
    }

    fn parse(v: &Value) -> Result<Config, String> {
        let c = ModelConfig::from_json(&v.to_string(), "config.json".as_ref()).map_err(|e| e.to_string())?;
        crate::models::check_config(&c).map_err(|e| e.to_string())?;
        c.parse::<Config>().map_err(|e| e.to_string())
    }

    #[test]
    fn rope_layers_as_mlx_lm_decides() {
        let c = parse(&base(8)).unwrap();
        assert_eq!(c.uses_rope().unwrap(), [true, true, true, false, true, true, true, false]);
        let mut v = base(3);
        v["no_rope_layer_interval"] = json!(2);
        assert_eq!(parse(&v).unwrap().uses_rope().unwrap(), [true, false, true]);
        // An explicit list wins over the interval; falsy entries skip rope.
        v["no_rope_layers"] = json!([0, true, 1]);
        assert_eq!(parse(&v).unwrap().uses_rope().unwrap(), [false, true, true]);
    }

    #[test]
    fn config_errors_name_the_field() {
        let mut v = base(3);
        v["no_rope_layers"] = json!([1, 0]);
        assert!(parse(&v).unwrap_err().contains("no_rope_layers"));
        let mut v = base(3);
        v["no_rope_layer_interval"] = json!(0);
        assert!(parse(&v).unwrap_err().contains("no_rope_layer_interval"));
        let mut v = base(3);
        v["layer_types"] = json!(["full_attention", "sliding_attention", "full_attention"]);
        assert!(parse(&v).unwrap_err().contains("layer_types"));
        for field in ["hidden_size", "intermediate_size", "num_attention_heads"] {
            let mut v = base(3);
            v[field] = json!(0);
            let e = parse(&v).unwrap_err();
            assert!(e.contains(field), "zero {field}: {e}");
        }
    }
}
