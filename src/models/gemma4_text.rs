//! gemma4_text, and the text model of gemma4 (multimodal) checkpoints. Follows mlx-lm 0.32.2
//! `models/gemma4_text.py` and its wrapper `models/gemma4.py` (with `rope_utils.py`'s
//! `initialize_rope` / `ProportionalRoPE` and `switch_layers.py`'s `SwitchGLU`):
//! - each layer is "sliding_attention" (a [`RotatingKvCache`] of `sliding_window` tokens) or
//!   "full_attention" (a [`KvCache`]), from `layer_types` or else `sliding_window_pattern`
//!   (pattern - 1 sliding layers, then one full); each kind has its own rotary settings in
//!   `rope_parameters` (default: full layers "proportional" rope rotating a quarter of the head,
//!   base 1e6; sliding layers plain rope, base 1e4), and full layers their own head size
//!   (`global_head_dim`);
//! - attention with softmax scale 1, RMSNorm of each head of q and k (plain `w` norms, not
//!   Gemma 3's `1 + w`) and a weightless RMSNorm of v; with `attention_k_eq_v` full layers have
//!   no `v_proj`: the values are the keys before their norm and rotation;
//! - KV sharing: the last `num_kv_shared_layers` layers project only queries and attend to the
//!   keys/values (and mask, and positions) the last earlier layer of their kind stored in this
//!   step; they keep no cache (`make_caches` covers the other layers only, as mlx-lm's
//!   `make_cache`), and their MLP is twice as wide when `use_double_wide_mlp`;
//! - each block: x + post_attn_norm(attn(input_norm(x))), then h + post_ff_norm(ff(h)) where ff
//!   is the GeGLU MLP of pre_ff_norm(h), or with `enable_moe_block` that MLP (normed by
//!   post_ff_norm_1) plus a mixture of experts (router on h: RMSNorm with `scale · hidden^-½`,
//!   top k of its logits softmaxed, times `per_expert_scale`; GeGLU experts on
//!   pre_ff_norm_2(h), normed by post_ff_norm_2); then per-layer inputs (below) and the whole
//!   block output times the learned `layer_scalar`;
//! - per-layer inputs (`hidden_size_per_layer_input` > 0): a second embedding of the token ids
//!   (times √P) and a projection of the scaled input embeddings (times hidden^-½, RMSNormed), summed
//!   and times 2^-½, one P-slice per layer; each block adds
//!   post_norm(proj(gelu(gate(h)) · slice));
//! - input embeddings times √hidden (in their dtype); final RMSNorm; output head tied unless
//!   `tie_word_embeddings` is false; logits softcapped `c · tanh(x / c)` with
//!   `final_logit_softcapping` (unless null).
//!
//! Checkpoints in the Hugging Face layout load as mlx-lm's sanitize makes them: `rotary_emb`
//! tables, clipping bounds (`input_max` …) and KV-shared layers' k/v projections are dropped,
//! fused experts (`experts.gate_up_proj`, `experts.down_proj`) are split.
//!
//! gemma4 (`model_type` "gemma4" outside, or as `outer_model_type` over a `text_config`): the
//! text model's weights sit under `language_model.` (mlx layout) or `model.language_model.` (Hugging
//! Face layout); the vision and audio towers, their embedders and the projector are dropped.
//! mlx-lm's wrapper also sets the text model's `vocab_size` to the top-level one: the merged
//! config here takes `text_config`'s when both are given (a checkpoint where they differ cannot
//! load in mlx-lm either, its embedding having the top-level size).
use super::transformer::validate_heads;
use super::{ArchConfig, Architecture, CausalLm, LmHead, Loadable};
use crate::error::{Error, Result};
use crate::loader::{check_size, ModelConfig, RopeConfig, RopeFields, Vb};
use crate::mlx::{eval, fast, Array, Dtype};
use crate::nn::switch::{combine, top_k};
use crate::nn::{
    Cache, Embedding, ExpertActivation, GateActivation, GatedMlp, LayerCaches, Linear, Mask, Params,
    Projections, RmsNorm, Rope, SwitchGlu,
};
use serde::Deserialize;
use serde_json::{json, Value};

// ---- config -------------------------------------------------------------------------------

/// config.json (or the merged `text_config`) as mlx-lm's gemma4_text `ModelArgs` reads it, with
/// its defaults for absent fields.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct Gemma4Config {
    pub model_type: String,
    /// "gemma4" when this is the `text_config` of a multimodal checkpoint.
    pub outer_model_type: Option<String>,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    pub head_dim: usize,
    /// Head size of the full-attention layers; null or 0: `head_dim`.
    pub global_head_dim: Option<usize>,
    pub rms_norm_eps: f32,
    pub vocab_size: usize,
    pub vocab_size_per_layer_input: usize,
    pub num_key_value_heads: usize,
    /// KV heads of full-attention layers with `attention_k_eq_v` (else `num_key_value_heads`).
    pub num_global_key_value_heads: Option<usize>,
    pub num_kv_shared_layers: usize,
    /// Width P of the per-layer inputs; null or 0: none.
    pub hidden_size_per_layer_input: Option<usize>,
    pub rope_traditional: bool,
    /// `{"full_attention": {...}, "sliding_attention": {...}}`, each an `initialize_rope`
    /// scaling config with its `rope_theta`; null: mlx-lm's default pair.
    pub rope_parameters: Option<Value>,
    pub sliding_window: usize,
    pub sliding_window_pattern: usize,
    pub max_position_embeddings: usize,
    pub attention_k_eq_v: bool,
    pub final_logit_softcapping: Option<f32>,
    pub use_double_wide_mlp: bool,
    pub enable_moe_block: bool,
    pub num_experts: Option<usize>,
    pub top_k_experts: Option<usize>,
    pub moe_intermediate_size: Option<usize>,
    pub layer_types: Option<Vec<String>>,
    pub tie_word_embeddings: bool,
    /// "vision": the tokens of one image also attend to each other (both ways) in the prompt.
    pub use_bidirectional_attention: Option<String>,
}

impl Default for Gemma4Config {
    fn default() -> Self {
        Gemma4Config {
            model_type: "gemma4_text".into(),
            outer_model_type: None,
            hidden_size: 1536,
            num_hidden_layers: 35,
            intermediate_size: 6144,
            num_attention_heads: 8,
            head_dim: 256,
            global_head_dim: Some(512),
            rms_norm_eps: 1e-6,
            vocab_size: 262144,
            vocab_size_per_layer_input: 262144,
            num_key_value_heads: 1,
            num_global_key_value_heads: None,
            num_kv_shared_layers: 20,
            hidden_size_per_layer_input: Some(256),
            rope_traditional: false,
            rope_parameters: None,
            sliding_window: 512,
            sliding_window_pattern: 5,
            max_position_embeddings: 131072,
            attention_k_eq_v: false,
            final_logit_softcapping: Some(30.0),
            use_double_wide_mlp: true,
            enable_moe_block: false,
            num_experts: None,
            top_k_experts: None,
            moe_intermediate_size: None,
            layer_types: None,
            tie_word_embeddings: true,
            use_bidirectional_attention: None,
        }
    }
}

/// The attention of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Keys of the last `sliding_window` positions only.
    Sliding,
    Full,
}

impl LayerKind {
    fn key(self) -> &'static str {
        match self {
            LayerKind::Sliding => "sliding_attention",
            LayerKind::Full => "full_attention",
        }
    }
}

/// A layer kind's rotary embedding, as `initialize_rope` builds it from its `rope_parameters`.
#[derive(Debug, Clone)]
pub enum RopeSpec {
    /// A variant `nn::Rope` implements (default, linear, llama3, yarn, dynamic).
    Standard(RopeConfig),
    /// `ProportionalRoPE`: the first `partial_rotary_factor · dims` features (in pairs) rotate
    /// with frequencies `factor · base^(2i/dims)` (exponent over the whole head), the rest not.
    Proportional { theta: f32, factor: f32, partial_rotary_factor: f64 },
}

impl Gemma4Config {
    /// The text model of a gemma4 (multimodal) checkpoint.
    pub fn is_wrapped(&self) -> bool {
        self.model_type == "gemma4" || self.outer_model_type.as_deref() == Some("gemma4")
    }

    /// Each layer's kind: `layer_types`, or mlx-lm's default pattern.
    pub fn layer_kinds(&self) -> std::result::Result<Vec<LayerKind>, String> {
        let n = self.num_hidden_layers;
        let Some(types) = &self.layer_types else {
            check_size("sliding_window_pattern", self.sliding_window_pattern)?;
            let p = self.sliding_window_pattern;
            return Ok((0..n).map(|i| if i % p == p - 1 { LayerKind::Full } else { LayerKind::Sliding }).collect());
        };
        // mlx-lm reads the first num_hidden_layers entries.
        if types.len() < n {
            return Err(format!("field 'layer_types' has {} entries for num_hidden_layers = {n}", types.len()));
        }
        types[..n]
            .iter()
            .enumerate()
            .map(|(i, t)| match t.as_str() {
                "sliding_attention" => Ok(LayerKind::Sliding),
                "full_attention" => Ok(LayerKind::Full),
                other => Err(format!(
                    "field 'layer_types[{i}]' = '{other}' is neither 'sliding_attention' nor 'full_attention'"
                )),
            })
            .collect()
    }

    /// Index of the first KV-shared layer (`num_hidden_layers` when no layer shares).
    pub fn first_shared(&self) -> usize {
        self.num_hidden_layers.saturating_sub(self.num_kv_shared_layers)
    }

    /// For each layer, the layer whose keys/values it attends to: itself, or for a KV-shared
    /// layer the last layer of its kind before the shared ones (mlx-lm's `previous_kvs`).
    pub fn kv_sources(&self) -> std::result::Result<Vec<usize>, String> {
        let kinds = self.layer_kinds()?;
        let n = self.num_hidden_layers;
        if self.num_kv_shared_layers >= n {
            return Err(format!(
                "field 'num_kv_shared_layers' = {} must be below num_hidden_layers = {n}",
                self.num_kv_shared_layers
            ));
        }
        let m = self.first_shared();
        (0..n)
            .map(|j| {
                if j < m {
                    return Ok(j);
                }
                (0..m).rev().find(|&i| kinds[i] == kinds[j]).ok_or_else(|| {
                    format!(
                        "field 'num_kv_shared_layers' = {}: shared layer {j} ({}) has no earlier layer of its kind to share",
                        self.num_kv_shared_layers,
                        kinds[j].key()
                    )
                })
            })
            .collect()
    }

    pub fn head_dim_for(&self, kind: LayerKind) -> usize {
        match (kind, self.global_head_dim) {
            (LayerKind::Full, Some(g)) if g > 0 => g,
            _ => self.head_dim,
        }
    }

    /// Values are the keys (no `v_proj`) in this kind of layer.
    pub fn k_eq_v(&self, kind: LayerKind) -> bool {
        self.attention_k_eq_v && kind == LayerKind::Full
    }

    pub fn kv_heads_for(&self, kind: LayerKind) -> usize {
        match self.num_global_key_value_heads {
            Some(g) if self.k_eq_v(kind) => g,
            _ => self.num_key_value_heads,
        }
    }

    /// P, when the model has per-layer inputs.
    pub fn per_layer_width(&self) -> Option<usize> {
        self.hidden_size_per_layer_input.filter(|&p| p > 0)
    }

    /// The MLP width of layer `i` (doubled in KV-shared layers with `use_double_wide_mlp`).
    pub fn mlp_width(&self, i: usize) -> usize {
        let m = self.first_shared();
        let doubled = self.use_double_wide_mlp && m > 0 && i >= m;
        self.intermediate_size * if doubled { 2 } else { 1 }
    }

    /// The `rope_parameters` entry of a layer kind (mlx-lm's default pair when none are given,
    /// `{}` when the kind has no entry).
    fn rope_params(&self, kind: LayerKind) -> std::result::Result<Value, String> {
        let all = match &self.rope_parameters {
            None | Some(Value::Null) => json!({
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
                "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 10000.0, "rope_type": "default"},
            }),
            Some(v) => v.clone(),
        };
        let Some(obj) = all.as_object() else {
            return Err("field 'rope_parameters' must be an object keyed by layer type".into());
        };
        match obj.get(kind.key()) {
            None => Ok(json!({})),
            Some(v) if v.is_object() => Ok(v.clone()),
            Some(_) => Err(format!("field 'rope_parameters.{}' must be an object", kind.key())),
        }
    }

    pub fn rope_spec(&self, kind: LayerKind) -> std::result::Result<RopeSpec, String> {
        let p = self.rope_params(kind)?;
        let field = |name: &str| format!("rope_parameters.{}.{name}", kind.key());
        let num = |name: &str, default: f64| -> std::result::Result<f64, String> {
            match p.get(name) {
                None => Ok(default),
                Some(v) => v.as_f64().ok_or_else(|| format!("field '{}' must be a number", field(name))),
            }
        };
        let theta = num("rope_theta", 10000.0)?;
        if !(theta.is_finite() && theta > 0.0) {
            return Err(format!("field '{}' = {theta} must be positive", field("rope_theta")));
        }
        let kind_name = p.get("type").or_else(|| p.get("rope_type")).and_then(|t| t.as_str()).unwrap_or("default");
        if kind_name == "proportional" {
            let factor = num("factor", 1.0)?;
            let prf = num("partial_rotary_factor", 1.0)?;
            let dims = self.head_dim_for(kind);
            let rotated = (dims as f64 * prf) as i64;
            if !(factor.is_finite() && factor > 0.0) {
                return Err(format!("field '{}' = {factor} must be positive", field("factor")));
            }
            if !(0.0..=1.0).contains(&prf) || rotated < 0 || rotated as usize > dims {
                return Err(format!("field '{}' = {prf} must lie in [0, 1]", field("partial_rotary_factor")));
            }
            // arange(0, rotated, 2) rotated pairs, (dims - rotated) // 2 still ones: one per pair.
            let rotated = rotated as usize;
            if rotated.div_ceil(2) + (dims - rotated) / 2 != dims / 2 {
                return Err(format!(
                    "field '{}' = {prf} rotates an odd number ({rotated}) of the {dims} features",
                    field("partial_rotary_factor")
                ));
            }
            return Ok(RopeSpec::Proportional { theta: theta as f32, factor: factor as f32, partial_rotary_factor: prf });
        }
        let fields = RopeFields {
            rope_theta: Some(theta as f32),
            rope_traditional: self.rope_traditional,
            rope_scaling: Some(p.clone()),
            rope_parameters: None,
        };
        fields.parse(theta as f32).map(RopeSpec::Standard).map_err(|m| format!("field 'rope_parameters.{}': {m}", kind.key()))
    }
}

impl ArchConfig for Gemma4Config {
    fn validate(&self) -> std::result::Result<(), String> {
        for (name, v) in [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("intermediate_size", self.intermediate_size),
            ("vocab_size", self.vocab_size),
            ("head_dim", self.head_dim),
            ("sliding_window", self.sliding_window),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            check_size(name, v)?;
        }
        validate_heads(self.num_attention_heads, self.num_key_value_heads, self.hidden_size, Some(self.head_dim))?;
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0) {
            return Err(format!("field 'rms_norm_eps' = {} is out of range", self.rms_norm_eps));
        }
        if let Some(c) = self.final_logit_softcapping {
            if !(c.is_finite() && c > 0.0) {
                return Err(format!("field 'final_logit_softcapping' = {c} must be positive (or null)"));
            }
        }
        let kinds = self.layer_kinds()?;
        self.kv_sources()?;
        for kind in [LayerKind::Sliding, LayerKind::Full] {
            if !kinds.contains(&kind) {
                continue;
            }
            let hd = self.head_dim_for(kind);
            if hd % 2 != 0 || hd > (1 << 16) {
                let name = if hd == self.head_dim { "head_dim" } else { "global_head_dim" };
                return Err(format!("field '{name}' = {hd} must be even for rotary embeddings"));
            }
            let kv = self.kv_heads_for(kind);
            if kv == 0 || self.num_attention_heads % kv != 0 {
                let name = if self.k_eq_v(kind) && self.num_global_key_value_heads.is_some() {
                    "num_global_key_value_heads"
                } else {
                    "num_key_value_heads"
                };
                return Err(format!("field '{name}' = {kv} must divide num_attention_heads = {}", self.num_attention_heads));
            }
            self.rope_spec(kind)?;
        }
        if let Some(p) = self.per_layer_width() {
            check_size("hidden_size_per_layer_input", p)?;
            check_size("vocab_size_per_layer_input", self.vocab_size_per_layer_input)?;
            check_size("hidden_size_per_layer_input × num_hidden_layers", p * self.num_hidden_layers)?;
            if self.vocab_size_per_layer_input < self.vocab_size {
                // Token ids past the per-layer table would read out of bounds.
                return Err(format!(
                    "field 'vocab_size_per_layer_input' = {} is below vocab_size = {}",
                    self.vocab_size_per_layer_input, self.vocab_size
                ));
            }
        }
        if self.enable_moe_block {
            let need = |name: &str, v: Option<usize>| -> std::result::Result<usize, String> {
                let v = v.ok_or_else(|| format!("field '{name}' is needed when enable_moe_block is true"))?;
                check_size(name, v)?;
                Ok(v)
            };
            let n = need("num_experts", self.num_experts)?;
            let k = need("top_k_experts", self.top_k_experts)?;
            need("moe_intermediate_size", self.moe_intermediate_size)?;
            if k > n {
                return Err(format!("field 'top_k_experts' = {k} exceeds num_experts = {n}"));
            }
        }
        Ok(())
    }
}

// ---- rope ---------------------------------------------------------------------------------

enum G4Rope {
    Standard(Rope),
    /// Precomputed per-pair frequencies (infinite for the pairs that do not rotate).
    Freqs { dims: i32, traditional: bool, freqs: Array },
}

impl G4Rope {
    fn new(dims: usize, spec: &RopeSpec, traditional: bool, max_position_embeddings: usize) -> Result<Self> {
        match spec {
            RopeSpec::Standard(cfg) => Ok(G4Rope::Standard(Rope::new(dims, cfg, Some(max_position_embeddings))?)),
            RopeSpec::Proportional { theta, factor, partial_rotary_factor } => {
                let rotated = (dims as f64 * partial_rotary_factor) as usize;
                // Built with MLX ops in float32, as mlx-lm does: factor · base^(arange(0, r, 2) / dims).
                let f32s = |v: f32| Array::scalar_f32(v, Dtype::Float32);
                let mut freqs = Array::arange(0.0, rotated as f64, 2.0, Dtype::Float32)?
                    .divide(&f32s(dims as f32)?)?;
                freqs = f32s(*factor)?.multiply(&f32s(*theta)?.power(&freqs)?)?;
                let still = ((dims - rotated) / 2) as i32;
                if still > 0 {
                    freqs = Array::concatenate(&[&freqs, &Array::full(&[still], f32::INFINITY, Dtype::Float32)?], 0)?;
                }
                eval(&[&freqs])?;
                Ok(G4Rope::Freqs { dims: dims as i32, traditional, freqs })
            }
        }
    }

    fn forward(&self, x: &Array, offset: usize) -> Result<Array> {
        match self {
            G4Rope::Standard(r) => r.forward(x, offset),
            G4Rope::Freqs { dims, traditional, freqs } => {
                fast::rope(x, *dims, *traditional, 1.0, 1.0, offset as i32, Some(freqs))
            }
        }
    }
}

// ---- attention ----------------------------------------------------------------------------

/// What a layer with its own keys/values hands to the KV-shared layers reading them: the
/// keys/values its queries attended to this step, their mask, and the position of its first query.
pub struct SharedKv {
    pub keys: Array,
    pub values: Array,
    pub mask: Mask,
    pub offset: usize,
}

/// `mask` (a chunk of L queries over S keys, the chunk's own keys last) with the query/key pairs of
/// `overlay` (`[L, L]`, over the chunk's keys) let through too: mlx-vlm's
/// `_apply_blockwise_bidirectional_overlay`. The chunk's keys must be the last L: what
/// `Cache::update_and_fetch` returns (not `update_and_fetch_for_sdpa`'s whole buffers).
fn with_overlay(mask: Mask, overlay: &Array, s: i32) -> Result<Mask> {
    let l = overlay.dim(0);
    let base = match mask {
        Mask::Array(a) | Mask::Short { mask: a, .. } | Mask::Bucketed { mask: a } => a,
        Mask::Causal => {
            // Key c is visible to query r when c <= r + (S - L).
            let r = Array::arange(0.0, l as f64, 1.0, Dtype::Int32)?.reshape(&[l, 1])?;
            let c = Array::arange(0.0, s as f64, 1.0, Dtype::Int32)?.reshape(&[1, s])?;
            c.less_equal(&r.add(&Array::scalar_i32(s - l, Dtype::Int32)?)?)?
        }
        Mask::None => return Ok(Mask::None),
        padded @ Mask::Padded { .. } => return Ok(padded),
    };
    let extra = if s > l {
        let none = Array::zeros(&[l, s - l], Dtype::Bool)?;
        Array::concatenate(&[&none, overlay], 1)?
    } else {
        overlay.clone()
    };
    Ok(Mask::Array(base.logical_or(&extra)?))
}

/// Drops checkpoint tensors mlx-lm's sanitize drops (clipping bounds of Gemma's clippable linears).
fn drop_clip_bounds(vb: &Vb) {
    for name in ["input_max", "input_min", "output_max", "output_min"] {
        vb.discard(name);
    }
}

fn linear(vb: &Vb, inp: usize, out: usize) -> Result<Linear> {
    drop_clip_bounds(vb);
    Linear::load(vb, inp, out, false)
}

pub struct G4Attention {
    /// q (and k, and v unless values are the keys), fused where the checkpoint allows; only q in
    /// a KV-shared layer.
    qkv: Projections,
    o_proj: Linear,
    q_norm: RmsNorm,
    /// None in a KV-shared layer.
    k_norm: Option<RmsNorm>,
    rope: G4Rope,
    k_eq_v: bool,
    n_heads: usize,
    n_kv_heads: usize,
    eps: f32,
}

impl G4Attention {
    fn load(vb: &Vb, c: &Gemma4Config, kind: LayerKind, has_kv: bool, rope: G4Rope) -> Result<Self> {
        vb.pp("rotary_emb").discard_all();
        let (hidden, d) = (c.hidden_size, c.head_dim_for(kind));
        let (n_heads, n_kv_heads) = (c.num_attention_heads, c.kv_heads_for(kind));
        let k_eq_v = c.k_eq_v(kind);
        let mut parts = vec![linear(&vb.pp("q_proj"), hidden, n_heads * d)?];
        let k_norm = if has_kv {
            parts.push(linear(&vb.pp("k_proj"), hidden, n_kv_heads * d)?);
            if !k_eq_v {
                parts.push(linear(&vb.pp("v_proj"), hidden, n_kv_heads * d)?);
            }
            Some(RmsNorm::load(&vb.pp("k_norm"), d, c.rms_norm_eps)?)
        } else {
            // KV-shared layers reuse an earlier layer's keys/values (mlx-lm's sanitize drops these).
            for name in ["k_proj", "v_proj", "k_norm"] {
                vb.pp(name).discard_all();
            }
            None
        };
        let qkv = if parts.len() > 1 { Projections::new("qkv", parts)? } else { Projections::Separate(parts) };
        Ok(G4Attention {
            qkv,
            o_proj: linear(&vb.pp("o_proj"), n_heads * d, hidden)?,
            q_norm: RmsNorm::load(&vb.pp("q_norm"), d, c.rms_norm_eps)?,
            k_norm,
            rope,
            k_eq_v,
            n_heads,
            n_kv_heads,
            eps: c.rms_norm_eps,
        })
    }

    /// `x` `[B, L, hidden]` → `[B, L, hidden]`: with its own cache (returning what it stored for
    /// the KV-shared layers), or reading `shared`.
    /// `overlay`: `[L, L]` booleans of query/key pairs of this chunk that see each other besides
    /// the causal mask (the tokens of one image, with bidirectional attention over images).
    pub fn forward(
        &self,
        x: &Array,
        cache: Option<&mut dyn Cache>,
        shared: Option<&SharedKv>,
        overlay: Option<&Array>,
    ) -> Result<(Array, Option<SharedKv>)> {
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        let proj = self.qkv.forward(x)?;
        // [B, L, n·D] → [B, n, L, D] (one query: a reshape suffices), the norm taken per head.
        let heads = |y: &Array, n: usize, norm: Option<&RmsNorm>| -> Result<Array> {
            let y = if l == 1 { y.reshape(&[b, n as i32, 1, -1])? } else { y.reshape(&[b, l, n as i32, -1])? };
            let y = match norm {
                Some(nm) => nm.forward(&y)?,
                None => fast::rms_norm(&y, None, self.eps)?,
            };
            if l == 1 {
                Ok(y)
            } else {
                y.transpose(&[0, 2, 1, 3])
            }
        };
        let q = heads(&proj[0], self.n_heads, Some(&self.q_norm))?;
        let own = match (shared, cache) {
            (Some(_), _) => None,
            (None, Some(cache)) => {
                let (Some(k_norm), Some(k_raw)) = (&self.k_norm, proj.get(1)) else {
                    return Err(Error::InvalidArgument("a KV-shared gemma4 layer ran without shared keys/values".into()));
                };
                let offset = cache.offset();
                let v_raw = if self.k_eq_v { k_raw } else { &proj[2] };
                let k = self.rope.forward(&heads(k_raw, self.n_kv_heads, Some(k_norm))?, offset)?;
                let v = heads(v_raw, self.n_kv_heads, None)?;
                let (keys, values, mask) = cache.update_and_fetch(&k, &v)?;
                let mask = match overlay {
                    Some(o) => with_overlay(mask, o, keys.dim(2))?,
                    None => mask,
                };
                Some(SharedKv { keys, values, mask, offset })
            }
            (None, None) => return Err(Error::InvalidArgument("gemma4 attention needs a cache or shared keys/values".into())),
        };
        let kv = shared.or(own.as_ref()).expect("one of the two");
        let q = self.rope.forward(&q, kv.offset)?;
        let o = fast::scaled_dot_product_attention(&q, &kv.keys, &kv.values, 1.0, kv.mask.as_attention()?)?;
        let o = if l == 1 { o.reshape(&[b, 1, -1])? } else { o.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, -1])? };
        Ok((self.o_proj.forward(&o)?, own))
    }
}

impl Params for G4Attention {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.qkv, self.o_proj, self.q_norm, self.k_norm);
    }
}

// ---- mixture of experts -------------------------------------------------------------------

pub struct G4Moe {
    router_proj: Linear,
    /// `router.scale · hidden^-½` (the router's RMSNorm weight), in the weights' dtype.
    router_norm: Array,
    per_expert_scale: Array,
    experts: SwitchGlu,
    pre_feedforward_layernorm_2: RmsNorm,
    post_feedforward_layernorm_1: RmsNorm,
    post_feedforward_layernorm_2: RmsNorm,
    k: usize,
    eps: f32,
}

impl G4Moe {
    /// Layer module `vb` (`model.layers.{i}`).
    fn load(vb: &Vb, c: &Gemma4Config) -> Result<Self> {
        let (h, eps) = (c.hidden_size, c.rms_norm_eps);
        let (n, k, inter) = (
            c.num_experts.unwrap_or_default(),
            c.top_k_experts.unwrap_or_default(),
            c.moe_intermediate_size.unwrap_or_default(),
        );
        let router = vb.pp("router");
        let experts = vb.pp("experts");
        // Hugging Face layout: gate and up stacked in one `[E, 2·I, H]` tensor (gate first).
        experts.remake("gate_up_proj", |a| {
            let half = a.dim(-2) / 2;
            let mut parts = a.split_at(&[half], -2)?;
            let up = parts.pop().expect("two parts");
            let gate = parts.pop().expect("two parts");
            Ok(vec![("switch_glu.gate_proj.weight".into(), gate), ("switch_glu.up_proj.weight".into(), up)])
        })?;
        experts.remake("down_proj", |a| Ok(vec![("switch_glu.down_proj.weight".into(), a)]))?;
        let scale = router.get("scale", &[h])?;
        let root = Array::scalar_f32((h as f64).powf(-0.5) as f32, scale.dtype())?;
        Ok(G4Moe {
            router_proj: linear(&router.pp("proj"), h, n)?,
            router_norm: scale.multiply(&root)?,
            per_expert_scale: router.get("per_expert_scale", &[n])?,
            experts: SwitchGlu::load(&experts.pp("switch_glu"), n, h, inter, false, ExpertActivation::Geglu)?,
            pre_feedforward_layernorm_2: RmsNorm::load(&vb.pp("pre_feedforward_layernorm_2"), h, eps)?,
            post_feedforward_layernorm_1: RmsNorm::load(&vb.pp("post_feedforward_layernorm_1"), h, eps)?,
            post_feedforward_layernorm_2: RmsNorm::load(&vb.pp("post_feedforward_layernorm_2"), h, eps)?,
            k,
            eps,
        })
    }

    /// The experts' share of the feed-forward of `h` (the block's post-attention residual).
    fn forward(&self, h: &Array) -> Result<Array> {
        let scores = self.router_proj.forward(&fast::rms_norm(h, Some(&self.router_norm), self.eps)?)?;
        let (idx, picked) = top_k(&scores, self.k, true)?;
        let weights = picked.softmax(-1, false)?.multiply(&self.per_expert_scale.take(&idx, 0)?)?;
        let y = self.experts.forward(&self.pre_feedforward_layernorm_2.forward(h)?, &idx)?;
        self.post_feedforward_layernorm_2.forward(&combine(&y, &weights, None)?)
    }
}

impl Params for G4Moe {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.router_proj, self.router_norm, self.per_expert_scale, self.experts,
            self.pre_feedforward_layernorm_2, self.post_feedforward_layernorm_1, self.post_feedforward_layernorm_2);
    }
}

// ---- block --------------------------------------------------------------------------------

/// A block's gate on its slice of the per-layer inputs.
pub struct PerLayerGate {
    per_layer_input_gate: Linear,
    per_layer_projection: Linear,
    post_per_layer_input_norm: RmsNorm,
}

impl Params for PerLayerGate {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.per_layer_input_gate, self.per_layer_projection, self.post_per_layer_input_norm);
    }
}

pub struct G4Block {
    input_layernorm: RmsNorm,
    self_attn: G4Attention,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    mlp: GatedMlp,
    moe: Option<G4Moe>,
    post_feedforward_layernorm: RmsNorm,
    per_layer: Option<PerLayerGate>,
    layer_scalar: Array,
}

impl G4Block {
    pub fn forward(
        &self,
        x: &Array,
        cache: Option<&mut dyn Cache>,
        shared: Option<&SharedKv>,
        per_layer_input: Option<&Array>,
        overlay: Option<&Array>,
    ) -> Result<(Array, Option<SharedKv>)> {
        let (a, kv) = self.self_attn.forward(&self.input_layernorm.forward(x)?, cache, shared, overlay)?;
        let h = x.add(&self.post_attention_layernorm.forward(&a)?)?;
        let dense = self.mlp.forward(&self.pre_feedforward_layernorm.forward(&h)?)?;
        let ff = match &self.moe {
            None => dense,
            Some(moe) => moe.post_feedforward_layernorm_1.forward(&dense)?.add(&moe.forward(&h)?)?,
        };
        let mut h = h.add(&self.post_feedforward_layernorm.forward(&ff)?)?;
        if let (Some(g), Some(p)) = (&self.per_layer, per_layer_input) {
            let gated = fast::geglu(&g.per_layer_input_gate.forward(&h)?, p)?;
            let r = g.post_per_layer_input_norm.forward(&g.per_layer_projection.forward(&gated)?)?;
            h = h.add(&r)?;
        }
        Ok((h.multiply(&self.layer_scalar)?, kv))
    }

    /// Layer module `vb` (`model.layers.{i}`).
    fn load(vb: &Vb, c: &Gemma4Config, i: usize, kind: LayerKind, has_kv: bool, rope: G4Rope) -> Result<Self> {
        let (hidden, eps) = (c.hidden_size, c.rms_norm_eps);
        let norm = |name: &str| RmsNorm::load(&vb.pp(name), hidden, eps);
        let mlp = vb.pp("mlp");
        for name in ["gate_proj", "up_proj", "down_proj"] {
            drop_clip_bounds(&mlp.pp(name));
        }
        let per_layer = match c.per_layer_width() {
            Some(p) => Some(PerLayerGate {
                per_layer_input_gate: linear(&vb.pp("per_layer_input_gate"), hidden, p)?,
                per_layer_projection: linear(&vb.pp("per_layer_projection"), p, hidden)?,
                post_per_layer_input_norm: norm("post_per_layer_input_norm")?,
            }),
            None => None,
        };
        Ok(G4Block {
            input_layernorm: norm("input_layernorm")?,
            self_attn: G4Attention::load(&vb.pp("self_attn"), c, kind, has_kv, rope)?,
            post_attention_layernorm: norm("post_attention_layernorm")?,
            pre_feedforward_layernorm: norm("pre_feedforward_layernorm")?,
            mlp: GatedMlp::load(&mlp, hidden, c.mlp_width(i), false, GateActivation::GeluTanh)?,
            moe: if c.enable_moe_block { Some(G4Moe::load(vb, c)?) } else { None },
            post_feedforward_layernorm: norm("post_feedforward_layernorm")?,
            per_layer,
            layer_scalar: vb.get("layer_scalar", &[1])?,
        })
    }
}

impl Params for G4Block {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.input_layernorm, self.self_attn, self.post_attention_layernorm,
            self.pre_feedforward_layernorm, self.mlp, self.moe, self.post_feedforward_layernorm, self.per_layer,
            self.layer_scalar);
    }
}

// ---- model --------------------------------------------------------------------------------

/// The model-level half of the per-layer inputs.
pub struct PerLayerInputs {
    embed_tokens_per_layer: Embedding,
    per_layer_model_projection: Linear,
    per_layer_projection_norm: RmsNorm,
    /// P.
    width: usize,
}

impl Params for PerLayerInputs {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.embed_tokens_per_layer, self.per_layer_model_projection, self.per_layer_projection_norm);
    }
}

/// Stands in the cache list of the KV-shared layers while [`super::run_layers`] runs them: they
/// keep nothing (what they read is the source layer's, handed over in `forward_embeddings`).
struct NoCache;

impl Cache for NoCache {
    fn offset(&self) -> usize {
        0
    }
    fn can_trim_to(&self, _n: usize) -> bool {
        true
    }
    fn trim_to(&mut self, _n: usize) -> Result<()> {
        Ok(())
    }
    fn state(&self) -> Vec<&Array> {
        vec![]
    }
    fn boxed_clone(&self) -> Box<dyn Cache> {
        Box::new(NoCache)
    }
}

pub struct Gemma4Text {
    pub embed_tokens: Embedding,
    pub layers: Vec<G4Block>,
    pub norm: RmsNorm,
    pub lm_head: LmHead,
    pub per_layer_inputs: Option<PerLayerInputs>,
    /// Per layer with its own keys/values (the first `first_shared`): the sliding window, or None.
    pub windows: Vec<Option<usize>>,
    /// Per layer, the layer whose keys/values it reads (itself unless KV-shared).
    pub kv_sources: Vec<usize>,
    pub first_shared: usize,
    pub softcap: Option<f32>,
    pub hidden_size: usize,
    pub vocab_size: usize,
    /// `use_bidirectional_attention` is "vision" (see [`CausalLm::forward_input_rows`]).
    pub bidirectional_images: bool,
}

impl Gemma4Text {
    /// The token ids whose embeddings are nearest `embeds` (mlx-lm's recovery of the ids, for
    /// the per-layer inputs, when only embeddings are given).
    fn nearest_tokens(&self, embeds: &Array) -> Result<Array> {
        let table = match &self.embed_tokens {
            Embedding::Dense { table, .. } => table.clone(),
            Embedding::Quantized(q) => q.dequantize(None)?,
        };
        let norms_table = table.square()?.sum(&[-1], false)?;
        let norms_input = embeds.square()?.sum(&[-1], false)?.expand_dims(-1)?;
        let two = Array::scalar_f32(2.0, embeds.dtype())?;
        let dist = norms_table.add(&norms_input)?.subtract(&two.multiply(&self.embed_tokens.as_linear(embeds)?)?)?;
        dist.negative()?.argmax(-1, false)
    }

    /// `[B, L, layers, P]`: the per-layer inputs of tokens `ids` (input embeddings `embeds`,
    /// scaled `h`).
    fn per_layer_input_table(&self, p: &PerLayerInputs, h: &Array, ids: &Array) -> Result<Array> {
        let s = h.shape();
        let shape = [s[0], s[1], self.layers.len() as i32, p.width as i32];
        let scalar = |v: f64, like: &Array| Array::scalar_f32(v as f32, like.dtype());
        let from_ids = p.embed_tokens_per_layer.forward(ids)?;
        let from_ids = from_ids.multiply(&scalar((p.width as f64).sqrt(), &from_ids)?)?.reshape(&shape)?;
        let proj = p.per_layer_model_projection.forward(h)?;
        let proj = proj.multiply(&scalar((self.hidden_size as f64).powf(-0.5), &proj)?)?.reshape(&shape)?;
        let proj = p.per_layer_projection_norm.forward(&proj)?;
        let sum = proj.add(&from_ids)?;
        sum.multiply(&scalar(2f64.powf(-0.5), &sum)?)
    }

    /// Input embeddings `[B, L, hidden]` (and their token ids when known) → logits.
    fn run(&self, embeds: Array, ids: Option<&Array>, caches: &mut LayerCaches) -> Result<Array> {
        let h = embeds.multiply(&Array::scalar_f32((self.hidden_size as f64).sqrt() as f32, embeds.dtype())?)?;
        let ids = match (ids, &self.per_layer_inputs) {
            (Some(t), _) => Some(t.clone()),
            (None, Some(_)) => Some(self.nearest_tokens(&embeds)?),
            (None, None) => None,
        };
        self.run_rows(h, ids.as_ref(), None, caches)
    }

    /// Input rows at the decoder's scale `[B, L, hidden]` (and the ids the per-layer inputs read,
    /// required when the model has them) → logits.
    fn run_rows(&self, h: Array, ids: Option<&Array>, overlay: Option<&Array>, caches: &mut LayerCaches) -> Result<Array> {
        let table = match (&self.per_layer_inputs, ids) {
            (Some(p), Some(ids)) => Some(self.per_layer_input_table(p, &h, ids)?),
            (Some(_), None) => return Err(Error::InvalidArgument("gemma4: per-layer inputs need token ids".into())),
            (None, _) => None,
        };
        let layer_input = |i: usize| -> Result<Option<Array>> {
            table.as_ref().map(|t| t.slice_axis(2, i as i32, i as i32 + 1)?.squeeze(2)).transpose()
        };
        let m = self.first_shared;
        let read = |i: usize| self.kv_sources[m..].contains(&i);
        let mut stored: Vec<Option<SharedKv>> = (0..m).map(|_| None).collect();
        let h = super::run_layers(h, &self.layers[..m], caches, |layer, i, x, cache| {
            let (y, kv) = layer.forward(x, Some(cache), None, layer_input(i)?.as_ref(), overlay)?;
            if read(i) {
                stored[i] = kv;
            }
            Ok(y)
        })?;
        let n = self.layers.len();
        let h = if m < n {
            let mut none = LayerCaches((m..n).map(|_| Box::new(NoCache) as Box<dyn Cache>).collect());
            super::run_layers(h, &self.layers[m..], &mut none, |layer, j, x, _| {
                let kv = stored[self.kv_sources[m + j]].as_ref().expect("sources run first");
                Ok(layer.forward(x, None, Some(kv), layer_input(m + j)?.as_ref(), None)?.0)
            })?
        } else {
            h
        };
        let logits = self.lm_head.forward(&self.norm.forward(&h)?, &self.embed_tokens)?;
        match self.softcap {
            Some(c) => {
                let c = Array::scalar_f32(c, logits.dtype())?;
                logits.divide(&c)?.tanh()?.multiply(&c)
            }
            None => Ok(logits),
        }
    }
}

impl CausalLm for Gemma4Text {
    fn embed(&self, tokens: &Array) -> Result<Array> {
        self.embed_tokens.forward(tokens)
    }

    fn forward(&self, tokens: &Array, caches: &mut LayerCaches) -> Result<Array> {
        self.run(self.embed(tokens)?, Some(tokens), caches)
    }

    fn forward_embeddings(&self, h: Array, caches: &mut LayerCaches) -> Result<Array> {
        self.run(h, None, caches)
    }

    /// With `use_bidirectional_attention` "vision", each run of media positions (one image's
    /// tokens: the caller keeps an image within one chunk) also attends to itself both ways.
    fn forward_input_rows(&self, h: Array, ids: &Array, media: &[bool], caches: &mut LayerCaches) -> Result<Array> {
        let l = media.len();
        let overlay = if self.bidirectional_images && l > 1 && media.iter().any(|&m| m) {
            // Block ids: each maximal run of media positions its own, text positions none.
            let mut block = vec![-1i32; l];
            let mut next = 0;
            for i in 0..l {
                if media[i] {
                    if i > 0 && media[i - 1] {
                        block[i] = block[i - 1];
                    } else {
                        block[i] = next;
                        next += 1;
                    }
                }
            }
            let q = Array::from_slice(&block, &[l as i32, 1])?;
            let k = Array::from_slice(&block, &[1, l as i32])?;
            Some(q.equal(&k)?.logical_and(&q.greater_equal(&Array::scalar_i32(0, Dtype::Int32)?)?)?)
        } else {
            None
        };
        self.run_rows(h, Some(ids), overlay.as_ref(), caches)
    }

    fn make_caches(&self) -> LayerCaches {
        LayerCaches::for_windows(self.windows.iter().copied())
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn dtype(&self) -> Dtype {
        self.norm.weight.dtype()
    }
}

impl Params for Gemma4Text {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.embed_tokens, self.layers, self.norm, self.lm_head, self.per_layer_inputs);
    }
}

// ---- load ---------------------------------------------------------------------------------

/// Parts of a gemma4 checkpoint besides the text model (mlx-lm's gemma4 sanitize drops them).
const NON_TEXT: [&str; 6] =
    ["vision_tower", "multi_modal_projector", "audio_tower", "embed_audio", "embed_vision", "vision_embedder"];

impl Loadable for Gemma4Text {
    type Config = Gemma4Config;

    fn load(c: Gemma4Config, _: &ModelConfig, vb: &Vb) -> Result<Self> {
        let bad = |m: String| Error::InvalidArgument(m);
        let (root, m) = if c.is_wrapped() {
            // The vision side is loaded before (`load_with_vision`); what is left (audio) is dropped.
            for part in NON_TEXT {
                vb.pp(part).discard_all();
                vb.pp("model").pp(part).discard_all();
            }
            let root = vb.pp("language_model");
            let hf = vb.pp("model").pp("language_model");
            let hf_layout = hf.pp("embed_tokens").contains("weight");
            (root.clone(), if hf_layout { hf } else { root.pp("model") })
        } else {
            (vb.clone(), vb.pp("model"))
        };
        let kinds = c.layer_kinds().map_err(bad)?;
        let kv_sources = c.kv_sources().map_err(bad)?;
        let first_shared = c.first_shared();
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut windows = Vec::with_capacity(first_shared);
        for (i, &kind) in kinds.iter().enumerate() {
            let spec = c.rope_spec(kind).map_err(bad)?;
            let rope = G4Rope::new(c.head_dim_for(kind), &spec, c.rope_traditional, c.max_position_embeddings)?;
            let has_kv = i < first_shared;
            layers.push(G4Block::load(&m.pp("layers").pp(i), &c, i, kind, has_kv, rope)?);
            if has_kv {
                windows.push((kind == LayerKind::Sliding).then_some(c.sliding_window));
            }
        }
        let per_layer_inputs = match c.per_layer_width() {
            Some(p) => {
                let wide = c.num_hidden_layers * p;
                Some(PerLayerInputs {
                    embed_tokens_per_layer: Embedding::load(&m.pp("embed_tokens_per_layer"), c.vocab_size_per_layer_input, wide)?,
                    per_layer_model_projection: linear(&m.pp("per_layer_model_projection"), c.hidden_size, wide)?,
                    per_layer_projection_norm: RmsNorm::load(&m.pp("per_layer_projection_norm"), p, c.rms_norm_eps)?,
                    width: p,
                })
            }
            None => None,
        };
        Ok(Gemma4Text {
            embed_tokens: Embedding::load(&m.pp("embed_tokens"), c.vocab_size, c.hidden_size)?,
            layers,
            norm: RmsNorm::load(&m.pp("norm"), c.hidden_size, c.rms_norm_eps)?,
            lm_head: LmHead::load(&root, c.tie_word_embeddings, c.hidden_size, c.vocab_size)?,
            per_layer_inputs,
            windows,
            kv_sources,
            first_shared,
            softcap: c.final_logit_softcapping,
            hidden_size: c.hidden_size,
            vocab_size: c.vocab_size,
            bidirectional_images: c.use_bidirectional_attention.as_deref() == Some("vision"),
        })
    }
}

pub const ARCH: Architecture = Architecture {
    model_type: "gemma4_text",
    aliases: &["gemma4"],
    check: super::check_as::<Gemma4Text>,
    load: load_with_vision,
};

/// A gemma4 checkpoint with a `vision_config` gets its vision tower too
/// ([`super::vision_lm::VisionLm`]), and with an `audio_config` its audio tower
/// ([`super::audio_input`]); the towers' tensors are taken first (the text model drops whatever
/// is left of the non-text parts).
fn load_with_vision(c: &ModelConfig, vb: &Vb) -> Result<Box<dyn CausalLm>> {
    let wrapped = c.raw.get("outer_model_type").and_then(Value::as_str) == Some("gemma4") || c.model_type == "gemma4";
    let vision = if wrapped { super::gemma4_vision::Gemma4Vision::load(&c.raw, vb)? } else { None };
    let audio = if wrapped && vision.is_some() { super::gemma4_audio::Gemma4Audio::load(&c.raw, vb)? } else { None };
    let text = super::load_as::<Gemma4Text>(c, vb)?;
    let Some(vision) = vision else { return Ok(text) };
    let image_token = c.raw.get("image_token_id").and_then(Value::as_u64).unwrap_or(258_880) as u32;
    if image_token as usize >= text.vocab_size() {
        return Err(c.error(format!("image_token_id {image_token} is outside the vocabulary ({})", text.vocab_size())));
    }
    // mlx-vlm's Gemma4Processor.from_pretrained: processor_config.json, else preprocessor_config.json.
    let dir = c.path.parent().map(std::path::Path::to_path_buf).unwrap_or_default();
    let file = ["processor_config.json", "preprocessor_config.json"].into_iter().map(|f| dir.join(f)).find(|p| p.is_file());
    let mut processor_json = None;
    let (processor, video_processor) = match file {
        Some(path) => {
            let text = std::fs::read_to_string(&path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
            let json: Value = serde_json::from_str(&text).map_err(|e| Error::checkpoint(&path, format!("not JSON: {e}")))?;
            let p = (
                crate::media::Gemma4ImageProcessor::from_config(&json).map_err(|e| Error::checkpoint(&path, e.to_string()))?,
                crate::media::Gemma4VideoProcessor::from_config(&json).map_err(|e| Error::checkpoint(&path, e.to_string()))?,
            );
            processor_json = Some((path, json));
            p
        }
        None => (crate::media::Gemma4ImageProcessor::default(), crate::media::Gemma4VideoProcessor::default()),
    };
    let vc = vision.config();
    if processor.patch_size != vc.patch_size || processor.pooling_kernel_size != vc.pooling_kernel_size {
        return Err(c.error(format!(
            "the image processor's patch_size {} / pooling_kernel_size {} differ from vision_config's {} / {}",
            processor.patch_size, processor.pooling_kernel_size, vc.patch_size, vc.pooling_kernel_size
        )));
    }
    // Video (as frames) needs the checkpoint's video token (mlx-vlm scatters frames only where
    // config.json names one) and a video processor whose patches fit the tower.
    let video = match c.raw.get("video_token_id").filter(|v| !v.is_null()) {
        None => None,
        Some(v) => {
            let id = v.as_u64().filter(|&id| (id as usize) < text.vocab_size()).ok_or_else(|| {
                c.error(format!("video_token_id {v} is not an id of the vocabulary ({})", text.vocab_size()))
            })? as u32;
            // A video processor whose patches do not fit the tower (mlx-vlm would fail on a
            // video): images are still served, video parts are refused.
            let f = &video_processor.frame;
            (f.patch_size == vc.patch_size && f.pooling_kernel_size == vc.pooling_kernel_size).then_some((id, video_processor))
        }
    };
    let lm = super::vision_lm::VisionLm::gemma4(text, vision, image_token, processor, video);
    Ok(Box::new(match audio {
        Some(tower) => with_audio(c, lm, tower, processor_json.as_ref())?,
        None => lm,
    }))
}

/// The audio side: its token (`audio_token_id`), the feature extractor (processor_config.json's
/// `feature_extractor`, else mlx-vlm's defaults: every Gemma 4 checkpoint's USM settings) and the
/// token budget (`audio_seq_length`, `audio_ms_per_token`), as mlx-vlm's Gemma4Processor reads them.
fn with_audio(
    c: &ModelConfig,
    lm: super::vision_lm::VisionLm,
    tower: super::gemma4_audio::Gemma4Audio,
    processor: Option<&(std::path::PathBuf, Value)>,
) -> Result<super::vision_lm::VisionLm> {
    use super::audio_input::{AudioInput, AudioPrompt};
    let vocab = lm.vocab_size();
    let audio_token = c.raw.get("audio_token_id").and_then(Value::as_u64).unwrap_or(258_881);
    if audio_token as usize >= vocab {
        return Err(c.error(format!("audio_token_id {audio_token} is outside the vocabulary ({vocab})")));
    }
    let extractor = match processor {
        Some((path, json)) => {
            crate::media::Gemma4AudioFeatureExtractor::from_config(json).map_err(|e| Error::checkpoint(path, e))?
        }
        None => crate::media::Gemma4AudioFeatureExtractor::default(),
    };
    if extractor.feature_size != super::gemma4_audio::INPUT_FEAT_SIZE {
        return Err(c.error(format!(
            "the audio feature extractor's feature_size {} differs from the audio tower's {} mel bins",
            extractor.feature_size,
            super::gemma4_audio::INPUT_FEAT_SIZE
        )));
    }
    let field = |name: &str, default: u64| -> Result<usize> {
        match processor.and_then(|(_, j)| j.get(name)).filter(|v| !v.is_null()) {
            None => Ok(default as usize),
            Some(v) => v.as_u64().filter(|&n| (1..=1 << 20).contains(&n)).map(|n| n as usize).ok_or_else(|| {
                let path = processor.map(|(p, _)| p.as_path()).unwrap_or(c.path.as_path());
                Error::checkpoint(path, format!("{name} must be between 1 and 2^20"))
            }),
        }
    };
    let input = AudioInput {
        tower,
        extractor,
        audio_seq_length: field("audio_seq_length", 750)?,
        audio_ms_per_token: field("audio_ms_per_token", 40)?,
    };
    let prompt =
        AudioPrompt { marker: "<|audio|>".into(), expansion: "<|audio><|audio|><audio|>".into(), audio_token: audio_token as u32 };
    Ok(lm.with_audio(prompt, input))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::RopeScaling;

    fn config(extra: Value) -> Gemma4Config {
        let mut v = json!({"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 6,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "global_head_dim": 32, "vocab_size": 320, "vocab_size_per_layer_input": 320,
            "hidden_size_per_layer_input": 32, "num_kv_shared_layers": 2, "sliding_window_pattern": 3});
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn defaults_layer_kinds_and_sharing() {
        let c = config(json!({}));
        assert!(c.validate().is_ok(), "{:?}", c.validate());
        use LayerKind::*;
        assert_eq!(c.layer_kinds().unwrap(), [Sliding, Sliding, Full, Sliding, Sliding, Full]);
        // Layers 4 (sliding) and 5 (full) read layers 3 and 2.
        assert_eq!(c.kv_sources().unwrap(), [0, 1, 2, 3, 3, 2]);
        assert_eq!((0..6).map(|i| c.mlp_width(i)).collect::<Vec<_>>(), [128, 128, 128, 128, 256, 256]);
        assert_eq!((c.head_dim_for(Sliding), c.head_dim_for(Full)), (16, 32));
        assert_eq!(c.final_logit_softcapping, Some(30.0));
        assert!(matches!(
            c.rope_spec(Full).unwrap(),
            RopeSpec::Proportional { theta: 1e6, factor: 1.0, partial_rotary_factor: 0.25 }
        ));
        match c.rope_spec(Sliding).unwrap() {
            RopeSpec::Standard(r) => assert_eq!((r.theta, r.scaling), (10000.0, RopeScaling::Default)),
            other => panic!("{other:?}"),
        }
        // A kind missing from rope_parameters: plain rope, base 10000.
        let c = config(json!({"rope_parameters": {"sliding_attention": {"rope_theta": 5.0}}}));
        assert!(matches!(c.rope_spec(Full).unwrap(), RopeSpec::Standard(RopeConfig { theta: 10000.0, .. })));
        let c = config(json!({"global_head_dim": null, "final_logit_softcapping": null}));
        assert_eq!((c.head_dim_for(Full), c.final_logit_softcapping), (16, None));
        let kv = config(json!({"attention_k_eq_v": true, "num_global_key_value_heads": 1}));
        assert_eq!((kv.kv_heads_for(Sliding), kv.kv_heads_for(Full)), (2, 1));
        assert!(kv.k_eq_v(Full) && !kv.k_eq_v(Sliding));
    }

    /// Random weights: logits of `tokens` `[1, L]` computed in one pass, in chunks with the
    /// caches, from embeddings only, and after trimming the caches back, must agree.
    #[test]
    fn cached_chunks_embeddings_and_trim_agree() {
        use crate::loader::WeightStore;
        let cfg = json!({"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 6,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "global_head_dim": 32, "vocab_size": 320, "vocab_size_per_layer_input": 320,
            "hidden_size_per_layer_input": 32, "num_kv_shared_layers": 2, "sliding_window_pattern": 3,
            "sliding_window": 4, "final_logit_softcapping": 0.5});
        let config = ModelConfig::from_json(&cfg.to_string(), std::path::Path::new("<test>/config.json")).unwrap();
        let weights = std::cell::RefCell::new(WeightStore::synthetic(None, Dtype::Float32, 7).unwrap());
        let model = crate::models::build_model(&config, &Vb::new(&weights, None)).unwrap();
        assert_eq!(model.make_caches().len(), 4, "KV-shared layers keep no cache");
        let ids: Vec<u32> = (0..12u32).map(|i| (i * 37 + 5) % 320).collect();
        let tokens = |r: std::ops::Range<usize>| Array::from_slice(&ids[r.clone()], &[1, r.len() as i32]).unwrap();
        let rows = |a: &Array| a.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
        let close = |a: &[f32], b: &[f32], what: &str| {
            assert_eq!(a.len(), b.len());
            let d = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            assert!(d < 1e-5, "{what}: max |Δ| = {d}");
        };
        let full = rows(&model.forward(&tokens(0..12), &mut model.make_caches()).unwrap());
        let row = |i: usize| &full[i * 320..(i + 1) * 320];
        // Logits of a few tenths, which the softcap bends without flattening them.
        let max = full.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(max > 0.1 && max < 0.5, "max |logit| {max}");
        let from_embeds = model.forward_embeddings(model.embed(&tokens(0..12)).unwrap(), &mut model.make_caches()).unwrap();
        close(&rows(&from_embeds), &full, "from embeddings");
        let mut caches = model.make_caches();
        close(&rows(&model.forward(&tokens(0..7), &mut caches).unwrap()), &full[..7 * 320], "prefill");
        for i in 7..12 {
            close(&rows(&model.forward(&tokens(i..i + 1), &mut caches).unwrap()), row(i), &format!("decode {i}"));
        }
        assert!(caches.can_trim_to(9));
        caches.trim_to(9).unwrap();
        close(&rows(&model.forward(&tokens(9..12), &mut caches).unwrap()), &full[9 * 320..], "after trim");
    }

    #[test]
    fn bad_fields_are_named() {
        for (extra, field) in [
            (json!({"sliding_window": 0}), "sliding_window"),
            (json!({"sliding_window_pattern": 0}), "sliding_window_pattern"),
            (json!({"hidden_size": 0}), "hidden_size"),
            (json!({"head_dim": 15}), "head_dim"),
            (json!({"global_head_dim": 33}), "global_head_dim"),
            (json!({"num_key_value_heads": 3}), "num_key_value_heads"),
            (json!({"attention_k_eq_v": true, "num_global_key_value_heads": 3}), "num_global_key_value_heads"),
            (json!({"num_kv_shared_layers": 6}), "num_kv_shared_layers"),
            (json!({"layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
                    "sliding_attention", "full_attention", "full_attention"]}), "num_kv_shared_layers"),
            (json!({"layer_types": ["sliding_attention"]}), "layer_types"),
            (json!({"layer_types": ["sliding_attention", "chunked_attention", "full_attention",
                    "sliding_attention", "sliding_attention", "full_attention"]}), "layer_types[1]"),
            (json!({"enable_moe_block": true, "top_k_experts": 2, "moe_intermediate_size": 64}), "num_experts"),
            (json!({"enable_moe_block": true, "num_experts": 4, "moe_intermediate_size": 64}), "top_k_experts"),
            (json!({"enable_moe_block": true, "num_experts": 4, "top_k_experts": 2}), "moe_intermediate_size"),
            (json!({"enable_moe_block": true, "num_experts": 4, "top_k_experts": 5, "moe_intermediate_size": 8}), "top_k_experts"),
            (json!({"final_logit_softcapping": 0.0}), "final_logit_softcapping"),
            (json!({"vocab_size_per_layer_input": 0}), "vocab_size_per_layer_input"),
            (json!({"rope_parameters": {"full_attention": {"rope_type": "linear"}}}), "rope_parameters.full_attention"),
            (json!({"rope_parameters": {"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 2.0}}}),
                "partial_rotary_factor"),
            (json!({"rope_parameters": {"sliding_attention": {"rope_theta": 0}}}), "rope_parameters.sliding_attention.rope_theta"),
            (json!({"rope_parameters": 3}), "rope_parameters"),
            (json!({"rms_norm_eps": 0.0}), "rms_norm_eps"),
        ] {
            let err = config(extra.clone()).validate().expect_err(&format!("{extra} should be refused"));
            assert!(err.contains(field), "{extra}: '{err}' does not name {field}");
        }
    }
}
