//! qwen2_5_vl (Qwen2.5-VL, issue 15): the Qwen2 decoder as mlx-vlm 0.7.10's
//! `models/qwen2_5_vl/language.py` runs it behind its vision tower ([`super::qwen2_5_vision`]):
//! q/k/v with bias, o_proj and the SwiGLU MLP without, `head_dim = hidden / heads`, rope over the
//! whole head at `rope_theta` (default 1e6) as multimodal rope in the "chunked" layout
//! (`rope_scaling.mrope_section`: the first frequencies read the t position, the next h, the
//! next w: [`super::mrope`]), tied embeddings by default. A checkpoint without `vision_config`
//! loads as this text model alone.
//!
//! Weights: mlx-vlm's `language_model.model.*` / `language_model.lm_head`, or Hugging Face's
//! `model.*` (or `model.language_model.*`) / `lm_head`.
use serde::Deserialize;
use serde_json::Value;

use super::mrope::{rotate_grid, MropeStyle, RopePositions};
use super::{run_layers, ArchConfig, Architecture, CausalLm, LmHead, Loadable};
use crate::error::{Error, Result};
use crate::loader::{check_size, ModelConfig, RopeConfig, RopeScaling, Vb};
use crate::mlx::{fast, Array, Dtype};
use crate::nn::{Cache, Embedding, GateActivation, GatedMlp, KvCache, LayerCaches, Linear, Params, RmsNorm, Rope};

// ---- config -------------------------------------------------------------------------------

#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    pub vocab_size: usize,
    #[serde(default = "default_theta")]
    pub rope_theta: f32,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default = "default_tie")]
    pub tie_word_embeddings: bool,
}

fn default_eps() -> f32 {
    1e-6
}

fn default_theta() -> f32 {
    1_000_000.0
}

fn default_tie() -> bool {
    true
}

impl Config {
    fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads.max(1)
    }

    /// `rope_scaling.mrope_section` (three sizes summing to at most head_dim / 2), default
    /// mlx-vlm's [16, 24, 24] scaled down when the head is smaller.
    fn mrope_section(&self) -> std::result::Result<[usize; 3], String> {
        let sec = match self.rope_scaling.as_ref().and_then(|r| r.get("mrope_section")).filter(|v| !v.is_null()) {
            None => [16, 24, 24],
            Some(v) => match v.as_array().map(|a| a.iter().map(|x| x.as_u64().filter(|&n| n <= 1 << 16)).collect::<Option<Vec<_>>>()) {
                Some(Some(a)) if a.len() == 3 => [a[0] as usize, a[1] as usize, a[2] as usize],
                _ => return Err(format!("field 'rope_scaling.mrope_section' = {v} is not three sizes")),
            },
        };
        Ok(sec)
    }
}

impl ArchConfig for Config {
    fn validate(&self) -> std::result::Result<(), String> {
        for (name, v) in [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.kv_heads()),
            ("vocab_size", self.vocab_size),
        ] {
            check_size(name, v)?;
        }
        super::transformer::validate_heads(self.num_attention_heads, self.kv_heads(), self.hidden_size, None)?;
        if self.head_dim() % 2 != 0 {
            return Err(format!("hidden_size / num_attention_heads = {} must be even (rope)", self.head_dim()));
        }
        if let Some(kind) = self.rope_scaling.as_ref().and_then(|r| r.get("type").or_else(|| r.get("rope_type"))).and_then(Value::as_str) {
            if kind != "mrope" && kind != "default" {
                return Err(format!("field 'rope_scaling.type' = {kind:?}: only mrope and default are supported"));
            }
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(format!("field 'rope_theta' = {} must be positive", self.rope_theta));
        }
        self.mrope_section().map(|_| ())
    }
}

// ---- attention ----------------------------------------------------------------------------

struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    rope: Rope,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    theta: f32,
    section: [usize; 3],
}

impl Attention {
    fn load(vb: &Vb, c: &Config) -> Result<Self> {
        let (h, hd) = (c.hidden_size, c.head_dim());
        let (hq, hkv) = (c.num_attention_heads * hd, c.kv_heads() * hd);
        let rope_cfg = RopeConfig { theta: c.rope_theta, traditional: false, scaling: RopeScaling::Default };
        Ok(Attention {
            q_proj: Linear::load(&vb.pp("q_proj"), h, hq, true)?,
            k_proj: Linear::load(&vb.pp("k_proj"), h, hkv, true)?,
            v_proj: Linear::load(&vb.pp("v_proj"), h, hkv, true)?,
            o_proj: Linear::load(&vb.pp("o_proj"), hq, h, false)?,
            rope: Rope::new(hd, &rope_cfg, None)?,
            heads: c.num_attention_heads,
            kv_heads: c.kv_heads(),
            head_dim: hd,
            theta: c.rope_theta,
            section: c.mrope_section().map_err(Error::InvalidArgument)?,
        })
    }

    fn forward(&self, x: &Array, cache: &mut dyn Cache, pos: &RopePositions) -> Result<Array> {
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        let hd = self.head_dim as i32;
        let heads = |y: Array, n: usize| y.reshape(&[b, l, n as i32, hd])?.transpose(&[0, 2, 1, 3]);
        let q = heads(self.q_proj.forward(x)?, self.heads)?;
        let k = heads(self.k_proj.forward(x)?, self.kv_heads)?;
        let v = heads(self.v_proj.forward(x)?, self.kv_heads)?;
        let (q, k) = match pos {
            RopePositions::Start(start) => (self.rope.forward(&q, *start)?, self.rope.forward(&k, *start)?),
            RopePositions::Grid(p) => {
                if p.iter().any(|a| a.len() != l as usize) {
                    return Err(Error::InvalidArgument(format!("{l} tokens with {} rope positions", p[0].len())));
                }
                let r = |t: &Array| rotate_grid(t, p, self.head_dim, self.theta, self.section, MropeStyle::Chunked);
                (r(&q)?, r(&k)?)
            }
        };
        let (k, v, mask) = cache.update_and_fetch(&k, &v)?;
        let scale = (self.head_dim as f64).powf(-0.5) as f32;
        let o = fast::scaled_dot_product_attention(&q, &k, &v, scale, mask.as_attention()?)?;
        self.o_proj.forward(&o.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)
    }
}

impl Params for Attention {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.q_proj, self.k_proj, self.v_proj, self.o_proj);
    }
}

// ---- block, model -------------------------------------------------------------------------

struct Block {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: GatedMlp,
}

impl Params for Block {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.input_layernorm, self.self_attn, self.post_attention_layernorm, self.mlp);
    }
}

/// Qwen2.5-VL's text model.
pub struct Qwen2_5VlText {
    embed_tokens: Embedding,
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: LmHead,
    vocab_size: usize,
}

impl Qwen2_5VlText {
    fn run(&self, h: Array, pos: &RopePositions, caches: &mut LayerCaches) -> Result<Array> {
        let h = run_layers(h, &self.layers, caches, |l, _, x, c| {
            let h = x.add(&l.self_attn.forward(&l.input_layernorm.forward(x)?, c, pos)?)?;
            h.add(&l.mlp.forward(&l.post_attention_layernorm.forward(&h)?)?)
        })?;
        self.lm_head.forward(&self.norm.forward(&h)?, &self.embed_tokens)
    }
}

impl CausalLm for Qwen2_5VlText {
    fn embed(&self, tokens: &Array) -> Result<Array> {
        self.embed_tokens.forward(tokens)
    }

    fn forward_embeddings(&self, h: Array, caches: &mut LayerCaches) -> Result<Array> {
        let start = caches.offset();
        self.run(h, &RopePositions::Start(start), caches)
    }

    fn forward_embeddings_at(&self, h: Array, positions: &RopePositions, caches: &mut LayerCaches) -> Result<Array> {
        self.run(h, positions, caches)
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

impl Params for Qwen2_5VlText {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.embed_tokens, self.layers, self.norm, self.lm_head);
    }
}

impl Loadable for Qwen2_5VlText {
    type Config = Config;

    fn load(c: Config, _: &ModelConfig, vb: &Vb) -> Result<Self> {
        vb.pp("vision_tower").discard_all();
        vb.pp("visual").discard_all();
        vb.pp("model").pp("visual").discard_all();
        let has = |v: &Vb| v.pp("embed_tokens").contains("weight") || v.pp("embed_tokens").contains("scales");
        let lm = vb.pp("language_model");
        let (m, head_root) = if has(&lm.pp("model")) {
            (lm.pp("model"), lm)
        } else if has(&vb.pp("model").pp("language_model")) {
            (vb.pp("model").pp("language_model"), vb.clone())
        } else {
            (vb.pp("model"), vb.clone())
        };
        let h = c.hidden_size;
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let lv = m.pp("layers").pp(i);
                Ok(Block {
                    input_layernorm: RmsNorm::load(&lv.pp("input_layernorm"), h, c.rms_norm_eps)?,
                    self_attn: Attention::load(&lv.pp("self_attn"), &c)?,
                    post_attention_layernorm: RmsNorm::load(&lv.pp("post_attention_layernorm"), h, c.rms_norm_eps)?,
                    mlp: GatedMlp::load(&lv.pp("mlp"), h, c.intermediate_size, false, GateActivation::Silu)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Qwen2_5VlText {
            embed_tokens: Embedding::load(&m.pp("embed_tokens"), c.vocab_size, h)?,
            layers,
            norm: RmsNorm::load(&m.pp("norm"), h, c.rms_norm_eps)?,
            lm_head: LmHead::load(&head_root, c.tie_word_embeddings, h, c.vocab_size)?,
            vocab_size: c.vocab_size,
        })
    }
}

/// A qwen2_5_vl checkpoint: with a `vision_config`, the text model behind its tower.
fn load_with_vision(c: &ModelConfig, vb: &Vb) -> Result<Box<dyn CausalLm>> {
    let vision = super::qwen2_5_vision::Qwen25Vision::load(&c.raw, vb).map_err(|e| match e {
        Error::InvalidArgument(m) => c.error(m),
        other => other,
    })?;
    let text = super::load_as::<Qwen2_5VlText>(c, vb)?;
    let Some(vision) = vision else { return Ok(text) };
    let vc = vision.config();
    let patching = (vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size);
    super::qwen_vision::with_tower(c, text, vision, patching, (151_655, 151_656), 14, false)
}

pub const ARCH: Architecture = Architecture {
    model_type: "qwen2_5_vl",
    aliases: &["qwen2_5_vl_text"],
    check: super::check_as::<Qwen2_5VlText>,
    load: load_with_vision,
};
