//! The skeleton most decoders share, written once: a pre-norm block
//! (x + mixer(norm(x)); x + ffn(norm(x))) and the stack embed → blocks → norm → head. An
//! architecture whose layers differ only in their attention (MLA, sinks) or feed-forward part
//! (dense, MoE) plugs those in; one with its own residual scheme (gemma's extra norms, minicpm's
//! scalings) writes its own block and model.
use super::{run_layers, CausalLm, LmHead};
use crate::error::Result;
use crate::loader::Vb;
use crate::mlx::{Array, Dtype};
use crate::nn::{Attention, Cache, Embedding, GatedMlp, LayerCaches, Params, RmsNorm, SparseMoe};

/// A layer's token mixer: reads and extends its cache.
pub trait Mixer: Params {
    fn forward(&self, x: &Array, cache: &mut dyn Cache) -> Result<Array>;

    /// `residual + forward(x)`: a mixer may fold the add into its last kernel.
    fn forward_add(&self, x: &Array, cache: &mut dyn Cache, residual: &Array) -> Result<Array> {
        residual.add(&self.forward(x, cache)?)
    }

    /// `residual + forward(norm(x))`: a mixer may fold the norm into its first kernel too.
    fn forward_add_normed(&self, x: &Array, norm: &RmsNorm, cache: &mut dyn Cache, residual: &Array) -> Result<Array> {
        self.forward_add(&norm.forward(x)?, cache, residual)
    }

    /// Whether it can run the rows of a continuous batch (see `nn::batch_kv_cache`).
    fn batchable(&self) -> bool {
        false
    }
}

/// A layer's feed-forward part.
pub trait FeedForwardPart: Params {
    fn forward(&self, x: &Array) -> Result<Array>;

    /// `residual + forward(x)`: a part may fold the add into its last kernel.
    fn forward_add(&self, x: &Array, residual: &Array) -> Result<Array> {
        residual.add(&self.forward(x)?)
    }

    /// `residual + forward(norm(x))`: a part may fold the norm into its first kernel too.
    fn forward_add_normed(&self, x: &Array, norm: &RmsNorm, residual: &Array) -> Result<Array> {
        self.forward_add(&norm.forward(x)?, residual)
    }
}

impl Mixer for Attention {
    fn forward(&self, x: &Array, cache: &mut dyn Cache) -> Result<Array> {
        Attention::forward(self, x, cache)
    }

    fn forward_add(&self, x: &Array, cache: &mut dyn Cache, residual: &Array) -> Result<Array> {
        Attention::forward_add(self, x, cache, residual)
    }

    fn forward_add_normed(&self, x: &Array, norm: &RmsNorm, cache: &mut dyn Cache, residual: &Array) -> Result<Array> {
        Attention::forward_add_normed(self, x, norm, cache, residual)
    }

    fn batchable(&self) -> bool {
        Attention::batchable(self)
    }
}

impl FeedForwardPart for GatedMlp {
    fn forward(&self, x: &Array) -> Result<Array> {
        GatedMlp::forward(self, x)
    }

    fn forward_add(&self, x: &Array, residual: &Array) -> Result<Array> {
        GatedMlp::forward_add(self, x, residual)
    }

    fn forward_add_normed(&self, x: &Array, norm: &RmsNorm, residual: &Array) -> Result<Array> {
        GatedMlp::forward_add_normed(self, x, norm, residual)
    }
}

impl FeedForwardPart for SparseMoe {
    fn forward(&self, x: &Array) -> Result<Array> {
        SparseMoe::forward(self, x)
    }
}

/// One decoder layer, as [`Stack`] runs it.
pub trait Layer: Params {
    fn forward(&self, x: &Array, cache: &mut dyn Cache) -> Result<Array>;

    /// Whether it can run the rows of a continuous batch.
    fn batchable(&self) -> bool {
        false
    }
}

/// `h = x + self_attn(input_layernorm(x)); h + mlp(post_attention_layernorm(h))`.
pub struct PreNormBlock<A, F> {
    pub input_layernorm: RmsNorm,
    pub self_attn: A,
    pub post_attention_layernorm: RmsNorm,
    pub mlp: F,
}

impl<A: Mixer, F: FeedForwardPart> PreNormBlock<A, F> {
    /// The two norms of layer module `vb` (`input_layernorm`, `post_attention_layernorm`) around
    /// the given parts.
    pub fn with_parts(vb: &Vb, hidden: usize, eps: f32, self_attn: A, mlp: F) -> Result<Self> {
        Ok(PreNormBlock {
            input_layernorm: RmsNorm::load(&vb.pp("input_layernorm"), hidden, eps)?,
            self_attn,
            post_attention_layernorm: RmsNorm::load(&vb.pp("post_attention_layernorm"), hidden, eps)?,
            mlp,
        })
    }
}

impl<A: Mixer, F: FeedForwardPart> Layer for PreNormBlock<A, F> {
    fn forward(&self, x: &Array, cache: &mut dyn Cache) -> Result<Array> {
        let h = self.self_attn.forward_add_normed(x, &self.input_layernorm, cache, x)?;
        self.mlp.forward_add_normed(&h, &self.post_attention_layernorm, &h)
    }

    fn batchable(&self) -> bool {
        self.self_attn.batchable()
    }
}

impl<A: Params, F: Params> Params for PreNormBlock<A, F> {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.input_layernorm, self.self_attn, self.post_attention_layernorm, self.mlp);
    }
}

/// `model.embed_tokens` → `model.layers.*` → `model.norm` → `lm_head` (or the tied table).
pub struct Stack<L> {
    pub embed_tokens: Embedding,
    pub layers: Vec<L>,
    pub norm: RmsNorm,
    pub lm_head: LmHead,
    pub vocab_size: usize,
    /// Each layer's attention window (None: full attention): it picks the layer's cache.
    pub windows: Vec<Option<usize>>,
    /// A scalar the input embeddings are multiplied by, in their dtype (Gemma's sqrt(hidden)).
    pub embed_scale: Option<Array>,
}

impl<L> Stack<L> {
    /// The embedding, final norm and head of checkpoint root `vb` around `layers` (all with
    /// full attention; set `windows` for sliding ones).
    pub fn with_layers(vb: &Vb, layers: Vec<L>, hidden: usize, vocab: usize, eps: f32, tied: bool) -> Result<Self> {
        let m = vb.pp("model");
        Ok(Stack {
            embed_tokens: Embedding::load(&m.pp("embed_tokens"), vocab, hidden)?,
            windows: vec![None; layers.len()],
            layers,
            norm: RmsNorm::load(&m.pp("norm"), hidden, eps)?,
            lm_head: LmHead::load(vb, tied, hidden, vocab)?,
            vocab_size: vocab,
            embed_scale: None,
        })
    }
}

impl<L: Layer> CausalLm for Stack<L> {
    fn embed(&self, tokens: &Array) -> Result<Array> {
        self.embed_tokens.forward(tokens)
    }

    fn forward_embeddings(&self, h: Array, caches: &mut LayerCaches) -> Result<Array> {
        // Scales whatever embeddings come in (given ones too), as mlx-lm's Gemma does.
        let h = match &self.embed_scale {
            Some(s) => h.multiply(&s.astype(h.dtype())?)?,
            None => h,
        };
        let h = run_layers(h, &self.layers, caches, |l, _, x, c| l.forward(x, c))?;
        self.lm_head.forward_normed(&h, &self.norm, &self.embed_tokens)
    }

    fn make_caches(&self) -> LayerCaches {
        LayerCaches::for_windows(self.windows.iter().copied())
    }

    fn batchable(&self) -> bool {
        self.windows.iter().all(|w| w.is_none()) && self.layers.iter().all(|l| l.batchable())
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn dtype(&self) -> Dtype {
        self.norm.weight.dtype()
    }
}

impl<L: Params> Params for Stack<L> {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.embed_tokens, self.layers, self.norm, self.lm_head);
    }
}
