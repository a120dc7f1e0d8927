//! minicpm. Follows mlx-lm `models/minicpm.py`: the llama-shaped block (no biases, head size
//! `hidden_size / num_attention_heads`, rope of `rope_theta` (default 1e6) / `rope_scaling`) with
//! three scalings: token embeddings × `scale_emb`; each residual branch (attention, MLP) ×
//! `scale_depth / sqrt(num_hidden_layers)`; and, with an own `lm_head` (the default,
//! `tie_word_embeddings: false`), the final hidden state ÷ `hidden_size / dim_model_base` before
//! it. A checkpoint without `lm_head.weight` reuses the embedding table there (mlx-lm's sanitize
//! copies it), still with that division. Tied embeddings use the table without the division, as
//! mlx-lm's forward does (its loader itself rejects such checkpoints).
use super::transformer::{validate_heads, ArchSpec, DecoderBlock, DecoderConfig};
use super::{ArchConfig, Architecture, CausalLm, LmHead, Loadable};
use crate::error::{Error, Result};
use crate::loader::{check_size, ModelConfig, RopeConfig, RopeFields, Vb};
use crate::mlx::{Array, Dtype};
use crate::nn::{Cache, Embedding, KvCache, LayerCaches, Params, RmsNorm, Rope};
use serde::Deserialize;
use serde_json::Value;

// ---- config -------------------------------------------------------------------------------

/// mlx-lm's `ModelArgs` of minicpm: only the rope fields below are read (not `head_dim`, not
/// `rope_parameters`).
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    pub hidden_size: usize,
    pub dim_model_base: f64,
    pub num_hidden_layers: usize,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    pub rms_norm_eps: f32,
    pub vocab_size: usize,
    pub num_key_value_heads: usize,
    pub scale_depth: f64,
    pub scale_emb: f64,
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    #[serde(default = "default_theta")]
    pub rope_theta: f32,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn default_theta() -> f32 {
    1_000_000.0
}

impl Config {
    fn rope_fields(&self) -> RopeFields {
        RopeFields {
            rope_theta: Some(self.rope_theta),
            rope_traditional: self.rope_traditional,
            rope_scaling: self.rope_scaling.clone(),
            rope_parameters: None,
        }
    }

    fn rope(&self) -> Result<RopeConfig> {
        self.rope_fields().parse(self.rope_theta).map_err(Error::InvalidArgument)
    }

    /// The same block as a llama-family config (mlx-lm's minicpm block is llama's without biases,
    /// its head size `hidden_size // num_attention_heads`).
    fn decoder(&self) -> DecoderConfig {
        DecoderConfig {
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            intermediate_size: self.intermediate_size,
            num_attention_heads: self.num_attention_heads,
            num_key_value_heads: Some(self.num_key_value_heads),
            head_dim: Some(self.hidden_size / self.num_attention_heads.max(1)),
            rms_norm_eps: self.rms_norm_eps,
            vocab_size: self.vocab_size,
            rope: self.rope_fields(),
            tie_word_embeddings: Some(self.tie_word_embeddings),
            attention_bias: Some(false),
            mlp_bias: false,
            max_position_embeddings: self.max_position_embeddings,
        }
    }

    /// `scale_depth / sqrt(num_hidden_layers)`, in double precision as Python computes it.
    fn residual_scale(&self) -> f32 {
        (self.scale_depth / (self.num_hidden_layers as f64).sqrt()) as f32
    }
}

impl ArchConfig for Config {
    fn validate(&self) -> std::result::Result<(), String> {
        for (name, v) in [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("vocab_size", self.vocab_size),
        ] {
            check_size(name, v)?;
        }
        let head_dim = self.hidden_size / self.num_attention_heads;
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(format!(
                "field 'hidden_size' = {} over num_attention_heads = {} gives head size {head_dim}, not a positive even number",
                self.hidden_size, self.num_attention_heads
            ));
        }
        validate_heads(self.num_attention_heads, self.num_key_value_heads, self.hidden_size, Some(head_dim))?;
        for (name, v) in [("dim_model_base", self.dim_model_base), ("scale_depth", self.scale_depth), ("scale_emb", self.scale_emb)] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("field '{name}' = {v} must be positive"));
            }
        }
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0) {
            return Err(format!("field 'rms_norm_eps' = {} is out of range", self.rms_norm_eps));
        }
        self.rope_fields().parse(self.rope_theta).map(|_| ())
    }
}

// ---- model --------------------------------------------------------------------------------

pub struct MiniCpm {
    pub embed_tokens: Embedding,
    pub layers: Vec<DecoderBlock>,
    pub norm: RmsNorm,
    pub lm_head: LmHead,
    /// `scale_emb`.
    pub scale_emb: f32,
    /// `scale_depth / sqrt(num_hidden_layers)`, on both residual branches.
    pub residual_scale: f32,
    /// `hidden_size / dim_model_base`, dividing the head's input (untied models only).
    pub head_divisor: Option<f32>,
    pub vocab_size: usize,
}

/// `x · v` with `v` a Python float: the scalar takes `x`'s dtype.
fn scale(x: &Array, v: f32) -> Result<Array> {
    x.multiply(&Array::scalar_f32(v, x.dtype())?)
}

impl MiniCpm {
    /// mlx-lm's `DecoderLayer`: `h = x + attn(norm(x)) · s; h + mlp(norm(h)) · s`.
    fn block(&self, l: &DecoderBlock, x: &Array, cache: &mut dyn Cache) -> Result<Array> {
        let r = l.self_attn.forward(&l.input_layernorm.forward(x)?, cache)?;
        let h = x.add(&scale(&r, self.residual_scale)?)?;
        let r = l.mlp.forward(&l.post_attention_layernorm.forward(&h)?)?;
        h.add(&scale(&r, self.residual_scale)?)
    }
}

impl CausalLm for MiniCpm {
    /// The embeddings already multiplied by `scale_emb` (the residual stream's input).
    fn embed(&self, tokens: &Array) -> Result<Array> {
        scale(&self.embed_tokens.forward(tokens)?, self.scale_emb)
    }

    fn forward_embeddings(&self, h: Array, caches: &mut LayerCaches) -> Result<Array> {
        let h = super::run_layers(h, &self.layers, caches, |l, _, x, c| self.block(l, x, c))?;
        let mut h = self.norm.forward(&h)?;
        if let Some(d) = self.head_divisor {
            h = h.divide(&Array::scalar_f32(d, h.dtype())?)?;
        }
        self.lm_head.forward(&h, &self.embed_tokens)
    }

    fn make_caches(&self) -> LayerCaches {
        LayerCaches(self.layers.iter().map(|_| Box::new(KvCache::new()) as Box<dyn Cache>).collect())
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn dtype(&self) -> Dtype {
        self.norm.weight.dtype()
    }
}

impl Params for MiniCpm {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.embed_tokens, self.layers, self.norm, self.lm_head);
    }
}

// ---- load ---------------------------------------------------------------------------------

impl Loadable for MiniCpm {
    type Config = Config;

    fn load(c: Config, _: &ModelConfig, vb: &Vb) -> Result<Self> {
        let m = vb.pp("model");
        let dc = c.decoder();
        let spec = ArchSpec { qkv_bias: false, o_bias: false, mlp_bias: false, qk_norm: false, tie_default: false };
        let rope = c.rope()?;
        let hd = dc.head_dim();
        let layers = (0..c.num_hidden_layers)
            .map(|i| DecoderBlock::load(&m.pp("layers").pp(i), &dc, &spec, Some(Rope::new(hd, &rope, c.max_position_embeddings)?)))
            .collect::<Result<_>>()?;
        // Untied without a stored head: mlx-lm's sanitize makes `lm_head` a copy of the table.
        let own_head = !c.tie_word_embeddings && vb.pp("lm_head").contains("weight");
        Ok(MiniCpm {
            embed_tokens: Embedding::load(&m.pp("embed_tokens"), c.vocab_size, c.hidden_size)?,
            layers,
            norm: RmsNorm::load(&m.pp("norm"), c.hidden_size, c.rms_norm_eps)?,
            lm_head: LmHead::load(vb, !own_head, c.hidden_size, c.vocab_size)?,
            scale_emb: c.scale_emb as f32,
            residual_scale: c.residual_scale(),
            head_divisor: (!c.tie_word_embeddings).then(|| (c.hidden_size as f64 / c.dim_model_base) as f32),
            vocab_size: c.vocab_size,
        })
    }
}

pub const ARCH: Architecture = Architecture::new::<MiniCpm>("minicpm", &[]);

#[cfg(test)]
mod tests {
    use crate::loader::ModelConfig;
    use serde_json::{json, Value};

    fn base() -> Value {
        json!({
            "model_type": "minicpm", "hidden_size": 64, "dim_model_base": 32, "num_hidden_layers": 2,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
            "rms_norm_eps": 1e-5, "vocab_size": 320, "scale_depth": 1.4, "scale_emb": 12
        })
    }

    fn check(v: &Value) -> Result<(), String> {
        let c = ModelConfig::from_json(&v.to_string(), "config.json".as_ref()).map_err(|e| e.to_string())?;
        crate::models::check_config(&c).map_err(|e| e.to_string())
    }

    #[test]
    fn config_errors_name_the_field() {
        check(&base()).unwrap();
        for field in ["dim_model_base", "scale_depth", "scale_emb", "num_key_value_heads", "rms_norm_eps", "intermediate_size"] {
            let mut missing = base();
            missing.as_object_mut().unwrap().remove(field);
            let e = check(&missing).unwrap_err();
            assert!(e.contains(field), "missing {field}: {e}");
            let mut zero = base();
            zero[field] = json!(0);
            let e = check(&zero).unwrap_err();
            assert!(e.contains(field), "zero {field}: {e}");
        }
    }
}
