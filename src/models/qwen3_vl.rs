//! qwen3_vl (Qwen3-VL dense): the Qwen3 decoder as mlx-vlm 0.7.10's `models/qwen3_vl/language.py`
//! runs it behind the Qwen3-VL vision tower ([`super::qwen_vision`], with deepstack): per-head
//! RMSNorm on q and k before the rope, explicit `head_dim`, no projection biases (unless
//! `attention_bias`), the SwiGLU MLP; rope over the whole head at `rope_theta` as multimodal rope
//! in the "interleaved" layout (`rope_scaling.mrope_section`, or `rope_parameters`', default
//! [24, 20, 20]: frequency i reads h when `i % 3 == 1`, w when `i % 3 == 2`, within their
//! sections, else t: [`super::mrope`]); deepstack: the tower's intermediate features
//! (`deepstack_visual_indexes`) added to the hidden states at the image and video positions
//! after each of the first layers, feature i after layer i (`_deepstack_process`). Text positions
//! take plain rope at `offset + the images' shift`. A checkpoint without `vision_config`, or
//! without the tower's tensors (mlx-lm's text-only conversion), loads as this text model alone.
//!
//! Weights: mlx-vlm's `language_model.model.*` / `language_model.lm_head`, or Hugging Face's
//! `model.language_model.*` (or `model.*`) / `lm_head`.
use serde::Deserialize;
use serde_json::Value;

use super::mrope::{rotate_grid, MropeStyle, RopePositions};
use super::{run_layers, ArchConfig, Architecture, CausalLm, LmHead, Loadable};
use crate::error::{Error, Result};
use crate::loader::{check_size, ModelConfig, RopeConfig, RopeScaling, Vb};
use crate::mlx::{fast, Array, Dtype};
use crate::nn::{Cache, Embedding, GateActivation, GatedMlp, KvCache, LayerCaches, Linear, Params, RmsNorm, Rope};

// ---- config -------------------------------------------------------------------------------

/// config.json (the merged `text_config`) as mlx-vlm's qwen3_vl `TextConfig` reads it.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
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
    pub rope_scaling: Option<Value>,
    /// Newer Hugging Face configs: `rope_theta` and `mrope_section` here.
    #[serde(default)]
    pub rope_parameters: Option<Value>,
    /// Unset: tied when the weights hold no `lm_head` (mlx-vlm's default is untied, mlx-lm's
    /// qwen3 tied; real Qwen3-VL configs say).
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default)]
    pub attention_bias: bool,
}

fn default_eps() -> f32 {
    1e-6
}

impl Config {
    fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// `rope_scaling`, else `rope_parameters`.
    fn rope_block(&self) -> Option<&Value> {
        self.rope_scaling.as_ref().filter(|v| !v.is_null()).or(self.rope_parameters.as_ref().filter(|v| !v.is_null()))
    }

    /// `rope_theta`, else `rope_parameters.rope_theta`, else Qwen3-VL's 5e6.
    fn theta(&self) -> f32 {
        let nested = self.rope_parameters.as_ref().and_then(|p| p.get("rope_theta")).and_then(Value::as_f64);
        self.rope_theta.or(nested.map(|t| t as f32)).unwrap_or(5_000_000.0)
    }

    /// `mrope_section`: three sizes, each at most head_dim / 2; default mlx-vlm's [24, 20, 20].
    fn mrope_section(&self) -> std::result::Result<[usize; 3], String> {
        let sec = match self.rope_block().and_then(|r| r.get("mrope_section")).filter(|v| !v.is_null()) {
            None => [24, 20, 20],
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
            ("head_dim", self.head_dim()),
            ("vocab_size", self.vocab_size),
        ] {
            check_size(name, v)?;
        }
        super::transformer::validate_heads(self.num_attention_heads, self.kv_heads(), self.hidden_size, self.head_dim)?;
        if self.head_dim() % 2 != 0 {
            return Err(format!("head_dim {} must be even (rope)", self.head_dim()));
        }
        if let Some(kind) = self.rope_block().and_then(|r| r.get("type").or_else(|| r.get("rope_type"))).and_then(Value::as_str) {
            if kind != "mrope" && kind != "default" {
                return Err(format!("field 'rope_scaling.type' = {kind:?}: only mrope and default are supported"));
            }
        }
        if !(self.theta().is_finite() && self.theta() > 0.0) {
            return Err(format!("field 'rope_theta' = {} must be positive", self.theta()));
        }
        let sec = self.mrope_section()?;
        if sec.iter().any(|&s| s > self.head_dim() / 2) {
            return Err(format!("field 'rope_scaling.mrope_section' = {sec:?}: a section is larger than head_dim / 2 = {}", self.head_dim() / 2));
        }
        Ok(())
    }
}

// ---- attention ----------------------------------------------------------------------------

struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
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
        let bias = c.attention_bias;
        let rope_cfg = RopeConfig { theta: c.theta(), traditional: false, scaling: RopeScaling::Default };
        Ok(Attention {
            q_proj: Linear::load(&vb.pp("q_proj"), h, hq, bias)?,
            k_proj: Linear::load(&vb.pp("k_proj"), h, hkv, bias)?,
            v_proj: Linear::load(&vb.pp("v_proj"), h, hkv, bias)?,
            o_proj: Linear::load(&vb.pp("o_proj"), hq, h, bias)?,
            q_norm: RmsNorm::load(&vb.pp("q_norm"), hd, c.rms_norm_eps)?,
            k_norm: RmsNorm::load(&vb.pp("k_norm"), hd, c.rms_norm_eps)?,
            rope: Rope::new(hd, &rope_cfg, None)?,
            heads: c.num_attention_heads,
            kv_heads: c.kv_heads(),
            head_dim: hd,
            theta: c.theta(),
            section: c.mrope_section().map_err(Error::InvalidArgument)?,
        })
    }

    fn forward(&self, x: &Array, cache: &mut dyn Cache, pos: &RopePositions) -> Result<Array> {
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        let hd = self.head_dim as i32;
        let split = |y: Array, n: usize| y.reshape(&[b, l, n as i32, hd]);
        let q = self.q_norm.forward(&split(self.q_proj.forward(x)?, self.heads)?)?.transpose(&[0, 2, 1, 3])?;
        let k = self.k_norm.forward(&split(self.k_proj.forward(x)?, self.kv_heads)?)?.transpose(&[0, 2, 1, 3])?;
        let v = split(self.v_proj.forward(x)?, self.kv_heads)?.transpose(&[0, 2, 1, 3])?;
        let (q, k) = match pos {
            RopePositions::Start(start) => (self.rope.forward(&q, *start)?, self.rope.forward(&k, *start)?),
            RopePositions::Grid(p) => {
                if p.iter().any(|a| a.len() != l as usize) {
                    return Err(Error::InvalidArgument(format!("{l} tokens with {} rope positions", p[0].len())));
                }
                let r = |t: &Array| rotate_grid(t, p, self.head_dim, self.theta, self.section, MropeStyle::Interleaved);
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
        crate::params!(out; self.q_proj, self.k_proj, self.v_proj, self.o_proj, self.q_norm, self.k_norm);
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

/// Qwen3-VL's text model.
pub struct Qwen3VlText {
    embed_tokens: Embedding,
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: LmHead,
    vocab_size: usize,
}

impl Qwen3VlText {
    /// `deepstack[i]` (`[1, L, hidden]`) added after layer i.
    fn run(&self, h: Array, pos: &RopePositions, deepstack: &[Array], caches: &mut LayerCaches) -> Result<Array> {
        let h = run_layers(h, &self.layers, caches, |l, i, x, c| {
            let h = x.add(&l.self_attn.forward(&l.input_layernorm.forward(x)?, c, pos)?)?;
            let h = h.add(&l.mlp.forward(&l.post_attention_layernorm.forward(&h)?)?)?;
            match deepstack.get(i) {
                Some(d) => h.add(d),
                None => Ok(h),
            }
        })?;
        self.lm_head.forward(&self.norm.forward(&h)?, &self.embed_tokens)
    }
}

impl CausalLm for Qwen3VlText {
    fn embed(&self, tokens: &Array) -> Result<Array> {
        self.embed_tokens.forward(tokens)
    }

    fn forward_embeddings(&self, h: Array, caches: &mut LayerCaches) -> Result<Array> {
        let start = caches.offset();
        self.run(h, &RopePositions::Start(start), &[], caches)
    }

    fn forward_embeddings_at(&self, h: Array, positions: &RopePositions, caches: &mut LayerCaches) -> Result<Array> {
        self.run(h, positions, &[], caches)
    }

    fn forward_embeddings_deepstack(&self, h: Array, positions: &RopePositions, deepstack: &[Array], caches: &mut LayerCaches) -> Result<Array> {
        if let Some(d) = deepstack.iter().find(|d| d.shape() != h.shape()) {
            return Err(Error::InvalidArgument(format!("deepstack features {:?} for hidden states {:?}", d.shape(), h.shape())));
        }
        self.run(h, positions, deepstack, caches)
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

impl Params for Qwen3VlText {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.embed_tokens, self.layers, self.norm, self.lm_head);
    }
}

impl Loadable for Qwen3VlText {
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
        let head = head_root.pp("lm_head");
        let tied = c.tie_word_embeddings.unwrap_or(!head.contains("weight") && !head.contains("scales"));
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
        Ok(Qwen3VlText {
            embed_tokens: Embedding::load(&m.pp("embed_tokens"), c.vocab_size, h)?,
            layers,
            norm: RmsNorm::load(&m.pp("norm"), h, c.rms_norm_eps)?,
            lm_head: LmHead::load(&head_root, tied, h, c.vocab_size)?,
            vocab_size: c.vocab_size,
        })
    }
}

/// A qwen3_vl checkpoint: with a `vision_config` (and the tower's tensors), the text model behind
/// the Qwen3-VL tower with deepstack, taking images and video (each temporal group after its
/// timestamp, as Qwen3.5); else the text model alone.
fn load_with_vision(c: &ModelConfig, vb: &Vb) -> Result<Box<dyn CausalLm>> {
    let vision = super::qwen_vision::QwenVision::load_deepstack(&c.raw, vb).map_err(|e| match e {
        Error::InvalidArgument(m) => c.error(m),
        other => other,
    })?;
    let text = super::load_as::<Qwen3VlText>(c, vb)?;
    let Some(vision) = vision else { return Ok(text) };
    let vc = vision.config();
    let layers = c.raw.get("num_hidden_layers").and_then(Value::as_u64).unwrap_or(0) as usize;
    if vc.deepstack_visual_indexes.len() > layers {
        return Err(c.error(format!(
            "vision_config.deepstack_visual_indexes lists {} blocks, more than the text model's {layers} layers",
            vc.deepstack_visual_indexes.len()
        )));
    }
    let patching = (vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size);
    super::qwen_vision::with_tower(c, text, vision, patching, (151_655, 151_656), 16, true)
}

pub const ARCH: Architecture = Architecture {
    model_type: "qwen3_vl",
    aliases: &["qwen3_vl_text"],
    check: super::check_as::<Qwen3VlText>,
    load: load_with_vision,
};

#[cfg(test)]
mod tests {
    use crate::loader::ModelConfig;

    /// Qwen3-VL-2B-Instruct's config.json as Hugging Face (and mlx-community) ship it, in short:
    /// the text model's fields under `text_config`, rope in `rope_scaling` or (newer) in
    /// `rope_parameters` with its theta.
    fn config(rope: serde_json::Value) -> ModelConfig {
        let mut text = serde_json::json!({
            "model_type": "qwen3_vl_text", "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
            "vocab_size": 151936, "max_position_embeddings": 262144, "tie_word_embeddings": true,
        });
        for (k, v) in rope.as_object().unwrap() {
            text[k] = v.clone();
        }
        let json = serde_json::json!({
            "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
            "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
            "tie_word_embeddings": true, "text_config": text,
            "vision_config": {"model_type": "qwen3_vl", "depth": 24, "hidden_size": 1024, "intermediate_size": 4096,
                              "num_heads": 16, "out_hidden_size": 2048, "patch_size": 16, "spatial_merge_size": 2,
                              "temporal_patch_size": 2, "num_position_embeddings": 2304,
                              "deepstack_visual_indexes": [5, 11, 17], "hidden_act": "gelu_pytorch_tanh"},
        });
        ModelConfig::from_json(&json.to_string(), std::path::Path::new("config.json")).unwrap()
    }

    #[test]
    fn real_configs_check() {
        let scaling = serde_json::json!({"rope_theta": 5000000, "rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20], "rope_type": "default"}});
        let params = serde_json::json!({"rope_parameters": {"mrope_interleaved": true, "mrope_section": [24, 20, 20], "rope_type": "default", "rope_theta": 5000000}});
        for rope in [scaling, params] {
            let c = config(rope);
            crate::models::check_config(&c).unwrap();
            let parsed = crate::models::parse_config::<super::Qwen3VlText>(&c).unwrap();
            assert_eq!((parsed.theta(), parsed.mrope_section().unwrap(), parsed.head_dim()), (5e6, [24, 20, 20], 128));
        }
        let bad = config(serde_json::json!({"rope_scaling": {"mrope_section": [24, 20, 80], "rope_type": "default"}}));
        let err = crate::models::check_config(&bad).unwrap_err().to_string();
        assert!(err.contains("mrope_section"), "{err}");
    }
}
