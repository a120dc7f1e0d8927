//! The pre-norm decoder-only transformer shared by llama, qwen2 and qwen3 (and the llama-shaped
//! families built on them): embed → N × (x + attn(norm(x)); x + mlp(norm(x))) → norm → lm_head
//! (or tied embeddings). Section order as in every architecture file: config, block, model, load.
use super::stack::{FeedForwardPart, PreNormBlock, Stack};
use super::ArchConfig;
use crate::error::Result;
use crate::loader::{check_size, RopeConfig, RopeFields, Vb};
use crate::mlx::Array;
use crate::nn::{Attention, AttentionSpec, GateActivation, GatedMlp, Params, RmsNorm, Rope, SparseMoe};
use serde::Deserialize;

// ---- config -------------------------------------------------------------------------------

/// The config.json fields of the llama family (mlx-lm's `ModelArgs` of llama / qwen2 / qwen3).
#[derive(Debug, Clone, Deserialize)]
pub struct DecoderConfig {
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
    #[serde(flatten)]
    pub rope: RopeFields,
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default)]
    pub attention_bias: Option<bool>,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
}

fn default_eps() -> f32 {
    1e-6
}

impl DecoderConfig {
    pub fn num_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    pub fn rope(&self) -> Result<RopeConfig> {
        // validate() parsed it once already; this cannot fail after it.
        self.rope.parse(10000.0).map_err(crate::error::Error::InvalidArgument)
    }

    /// Attention of this config with the given biases / q-k norm.
    pub fn attention_spec(&self, qkv_bias: bool, o_bias: bool, qk_norm: bool) -> AttentionSpec {
        AttentionSpec {
            hidden: self.hidden_size,
            n_heads: self.num_attention_heads,
            n_kv_heads: self.num_kv_heads(),
            head_dim: self.head_dim(),
            qkv_bias,
            o_bias,
            qk_norm: qk_norm.then_some((self.rms_norm_eps, false)),
            scale: (self.head_dim() as f32).powf(-0.5),
            sinks: false,
        }
    }
}

impl ArchConfig for DecoderConfig {
    fn validate(&self) -> std::result::Result<(), String> {
        for (name, v) in [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("vocab_size", self.vocab_size),
        ] {
            check_size(name, v)?;
        }
        validate_heads(self.num_attention_heads, self.num_kv_heads(), self.hidden_size, self.head_dim)?;
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0) {
            return Err(format!("field 'rms_norm_eps' = {} is out of range", self.rms_norm_eps));
        }
        self.rope.parse(10000.0).map(|_| ())
    }
}

/// Heads must divide evenly into KV groups; without `head_dim` the hidden size must split into
/// the heads; rotary needs an even head size.
pub fn validate_heads(heads: usize, kv: usize, hidden: usize, head_dim: Option<usize>) -> std::result::Result<(), String> {
    check_size("num_attention_heads", heads)?;
    if kv == 0 || heads % kv != 0 {
        return Err(format!("field 'num_key_value_heads' = {kv} must divide num_attention_heads = {heads}"));
    }
    if head_dim.is_none() && hidden % heads != 0 {
        return Err("hidden_size is not a multiple of num_attention_heads and no head_dim is given".into());
    }
    let hd = head_dim.unwrap_or(hidden / heads);
    if hd == 0 || hd % 2 != 0 {
        return Err(format!("field 'head_dim' = {hd} must be even (and positive) for rotary embeddings"));
    }
    Ok(())
}

/// What distinguishes one architecture of the family from another.
#[derive(Debug, Clone, Copy)]
pub struct ArchSpec {
    /// Bias on q/k/v projections (qwen2; llama's `attention_bias`).
    pub qkv_bias: bool,
    /// Bias on the output projection (llama's `attention_bias`; never in qwen2).
    pub o_bias: bool,
    /// Bias on the MLP projections (llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// Per-head RMSNorm of q and k (qwen3).
    pub qk_norm: bool,
    /// Whether the output head reuses the embedding table when config.json does not say.
    pub tie_default: bool,
}

// ---- block --------------------------------------------------------------------------------

/// A layer's feed-forward part: the gated MLP, or a sparse mixture of experts (the MoE members
/// of the family: qwen3_moe, qwen2_moe, mixtral).
pub enum FeedForward {
    Dense(GatedMlp),
    Sparse(SparseMoe),
}

impl FeedForward {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            FeedForward::Dense(m) => m.forward(x),
            FeedForward::Sparse(m) => m.forward(x),
        }
    }

    /// The dense SwiGLU MLP of module `vb` (`model.layers.{i}.mlp`).
    pub fn dense(vb: &Vb, c: &DecoderConfig, inter: usize, bias: bool) -> Result<Self> {
        Ok(FeedForward::Dense(GatedMlp::load(vb, c.hidden_size, inter, bias, GateActivation::Silu)?))
    }
}

impl Params for FeedForward {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        match self {
            FeedForward::Dense(m) => m.params(out),
            FeedForward::Sparse(m) => m.params(out),
        }
    }
}

impl FeedForwardPart for FeedForward {
    fn forward(&self, x: &Array) -> Result<Array> {
        FeedForward::forward(self, x)
    }

    fn forward_add(&self, x: &Array, residual: &Array) -> Result<Array> {
        match self {
            FeedForward::Dense(m) => m.forward_add(x, residual),
            FeedForward::Sparse(m) => FeedForwardPart::forward_add(m, x, residual),
        }
    }

    fn forward_add_normed(&self, x: &Array, norm: &RmsNorm, residual: &Array) -> Result<Array> {
        match self {
            FeedForward::Dense(m) => m.forward_add_normed(x, norm, residual),
            FeedForward::Sparse(m) => FeedForwardPart::forward_add_normed(m, x, norm, residual),
        }
    }
}

/// A llama-family layer: attention and a dense or sparse feed-forward part, pre-norm.
pub type DecoderBlock = PreNormBlock<Attention, FeedForward>;

impl DecoderBlock {
    /// Layer module `vb` (`model.layers.{i}`) of a llama-family model (dense MLP).
    pub fn load(vb: &Vb, c: &DecoderConfig, spec: &ArchSpec, rope: Option<Rope>) -> Result<Self> {
        let mlp = FeedForward::dense(&vb.pp("mlp"), c, c.intermediate_size, spec.mlp_bias)?;
        Self::load_with_ffn(vb, c, spec, rope, mlp)
    }

    /// [`DecoderBlock::load`] with the feed-forward part given.
    pub fn load_with_ffn(vb: &Vb, c: &DecoderConfig, spec: &ArchSpec, rope: Option<Rope>, mlp: FeedForward) -> Result<Self> {
        let (hidden, eps) = (c.hidden_size, c.rms_norm_eps);
        // Precomputed rotary tables are recomputed (mlx-lm's sanitize).
        vb.pp("self_attn").pp("rotary_emb").discard("inv_freq");
        let attn = Attention::load(&vb.pp("self_attn"), &c.attention_spec(spec.qkv_bias, spec.o_bias, spec.qk_norm), rope)?;
        Self::with_parts(vb, hidden, eps, attn, mlp)
    }
}

// ---- model --------------------------------------------------------------------------------

/// A llama-family model.
pub type DecoderModel = Stack<DecoderBlock>;

// ---- load ---------------------------------------------------------------------------------

impl DecoderModel {
    /// Builds the model from module `vb` (the checkpoint root), taking every tensor strictly.
    pub fn load(c: &DecoderConfig, spec: ArchSpec, vb: &Vb) -> Result<Self> {
        Self::load_with_rope(c, spec, vb, |_| true)
    }

    /// [`DecoderModel::load`] where layer `i` rotates q/k only when `uses_rope(i)` (smollm3's
    /// no-rope layers).
    pub fn load_with_rope(c: &DecoderConfig, spec: ArchSpec, vb: &Vb, uses_rope: impl Fn(usize) -> bool) -> Result<Self> {
        let dense = |layer: &Vb, _| FeedForward::dense(&layer.pp("mlp"), c, c.intermediate_size, spec.mlp_bias);
        Self::load_with(c, spec, vb, uses_rope, dense)
    }

    /// [`DecoderModel::load_with_rope`] with each layer's feed-forward part built by
    /// `ffn(layer module, index)` (the MoE members of the family).
    pub fn load_with(
        c: &DecoderConfig,
        spec: ArchSpec,
        vb: &Vb,
        uses_rope: impl Fn(usize) -> bool,
        ffn: impl Fn(&Vb, usize) -> Result<FeedForward>,
    ) -> Result<Self> {
        let m = vb.pp("model");
        let rope = c.rope()?;
        let hd = c.head_dim();
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let layer = m.pp("layers").pp(i);
                let r = if uses_rope(i) { Some(Rope::new(hd, &rope, c.max_position_embeddings)?) } else { None };
                DecoderBlock::load_with_ffn(&layer, c, &spec, r, ffn(&layer, i)?)
            })
            .collect::<Result<_>>()?;
        let tied = c.tie_word_embeddings.unwrap_or(spec.tie_default);
        Stack::with_layers(vb, layers, c.hidden_size, c.vocab_size, c.rms_norm_eps, tied)
    }
}

/// `pub struct $model(pub DecoderModel)` implementing [`CausalLm`] and [`Params`] through it: for
/// the architecture files whose model is this decoder with their own loading.
#[macro_export]
macro_rules! decoder_newtype {
    ($model:ident) => {
        pub struct $model(pub $crate::models::transformer::DecoderModel);

        impl $crate::nn::Params for $model {
            fn params<'a>(&'a self, out: &mut Vec<&'a $crate::mlx::Array>) {
                self.0.params(out)
            }
        }

        impl $crate::models::CausalLm for $model {
            fn embed(&self, t: &$crate::mlx::Array) -> $crate::error::Result<$crate::mlx::Array> {
                self.0.embed(t)
            }
            fn forward_embeddings(
                &self,
                h: $crate::mlx::Array,
                c: &mut $crate::nn::LayerCaches,
            ) -> $crate::error::Result<$crate::mlx::Array> {
                self.0.forward_embeddings(h, c)
            }
            fn make_caches(&self) -> $crate::nn::LayerCaches {
                self.0.make_caches()
            }
            fn batchable(&self) -> bool {
                $crate::models::CausalLm::batchable(&self.0)
            }
            fn vocab_size(&self) -> usize {
                self.0.vocab_size
            }
            fn dtype(&self) -> $crate::mlx::Dtype {
                self.0.dtype()
            }
        }
    };
}

/// For the llama-shaped architecture files: a model of this family whose flags come from `spec`.
#[macro_export]
macro_rules! decoder_architecture {
    ($model:ident, $spec:expr) => {
        $crate::decoder_newtype!($model);

        impl $crate::models::Loadable for $model {
            type Config = $crate::models::transformer::DecoderConfig;
            fn load(
                c: Self::Config,
                _: &$crate::loader::ModelConfig,
                vb: &$crate::loader::Vb,
            ) -> $crate::error::Result<Self> {
                let spec: fn(&Self::Config) -> $crate::models::transformer::ArchSpec = $spec;
                Ok($model($crate::models::transformer::DecoderModel::load(&c, spec(&c), vb)?))
            }
        }
    };
}
