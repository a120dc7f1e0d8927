//! The text model the Qwen vision-language architectures share (Qwen2.5-VL, Qwen3-VL): a
//! pre-norm decoder whose attention rotates by 3-D multimodal positions, optionally adding
//! deepstack features after its first layers, loaded from any of the layouts mlx-vlm, Hugging
//! Face and mlx-lm write. Each architecture brings its config (as the type parameter, so that
//! each has its own `Loadable`), the sizes and its attention's [`AttentionSpec`].
use std::marker::PhantomData;

use super::mrope::{rotate_grid, MropeStyle, RopePositions};
use super::{run_layers, CausalLm, LmHead};
use crate::error::{Error, Result};
use crate::loader::{RopeConfig, RopeScaling, Vb};
use crate::mlx::{fast, Array, Dtype};
use crate::nn::{Cache, Embedding, GateActivation, GatedMlp, KvCache, LayerCaches, Linear, Params, RmsNorm, Rope};

/// What distinguishes one architecture's attention from another's.
pub struct AttentionSpec {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub qkv_bias: bool,
    pub o_bias: bool,
    /// Per-head RMSNorm of q and k with this eps (Qwen3-VL), or none (Qwen2.5-VL).
    pub qk_norm_eps: Option<f32>,
    pub theta: f32,
    pub section: [usize; 3],
    pub style: MropeStyle,
}

struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    qk_norms: Option<(RmsNorm, RmsNorm)>,
    rope: Rope,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    theta: f32,
    section: [usize; 3],
    style: MropeStyle,
}

impl Attention {
    fn load(vb: &Vb, s: &AttentionSpec) -> Result<Self> {
        let (h, hd) = (s.hidden, s.head_dim);
        let (hq, hkv) = (s.heads * hd, s.kv_heads * hd);
        let rope_cfg = RopeConfig { theta: s.theta, traditional: false, scaling: RopeScaling::Default };
        let qk_norms = match s.qk_norm_eps {
            Some(eps) => Some((RmsNorm::load(&vb.pp("q_norm"), hd, eps)?, RmsNorm::load(&vb.pp("k_norm"), hd, eps)?)),
            None => None,
        };
        Ok(Attention {
            q_proj: Linear::load(&vb.pp("q_proj"), h, hq, s.qkv_bias)?,
            k_proj: Linear::load(&vb.pp("k_proj"), h, hkv, s.qkv_bias)?,
            v_proj: Linear::load(&vb.pp("v_proj"), h, hkv, s.qkv_bias)?,
            o_proj: Linear::load(&vb.pp("o_proj"), hq, h, s.o_bias)?,
            qk_norms,
            rope: Rope::new(hd, &rope_cfg, None)?,
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: hd,
            theta: s.theta,
            section: s.section,
            style: s.style,
        })
    }

    fn forward(&self, x: &Array, cache: &mut dyn Cache, pos: &RopePositions) -> Result<Array> {
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        let hd = self.head_dim as i32;
        let split = |y: Array, n: usize| y.reshape(&[b, l, n as i32, hd]);
        let (q, k) = (split(self.q_proj.forward(x)?, self.heads)?, split(self.k_proj.forward(x)?, self.kv_heads)?);
        let (q, k) = match &self.qk_norms {
            Some((qn, kn)) => (qn.forward(&q)?, kn.forward(&k)?),
            None => (q, k),
        };
        let q = q.transpose(&[0, 2, 1, 3])?;
        let k = k.transpose(&[0, 2, 1, 3])?;
        let v = split(self.v_proj.forward(x)?, self.kv_heads)?.transpose(&[0, 2, 1, 3])?;
        let (q, k) = match pos {
            RopePositions::Start(start) => (self.rope.forward(&q, *start)?, self.rope.forward(&k, *start)?),
            RopePositions::Grid(p) => {
                if p.iter().any(|a| a.len() != l as usize) {
                    return Err(Error::InvalidArgument(format!("{l} tokens with {} rope positions", p[0].len())));
                }
                let r = |t: &Array| rotate_grid(t, p, self.head_dim, self.theta, self.section, self.style);
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
        if let Some((qn, kn)) = &self.qk_norms {
            qn.params(out);
            kn.params(out);
        }
    }
}

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

/// The sizes the skeleton needs from an architecture's config.
pub struct TextDims {
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub vocab: usize,
    pub eps: f32,
    /// None: tied when the weights hold no `lm_head` (mlx-vlm's and mlx-lm's defaults differ).
    pub tie: Option<bool>,
}

/// The text model of an architecture whose config is `C`.
pub struct MropeText<C> {
    embed_tokens: Embedding,
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: LmHead,
    vocab_size: usize,
    arch: PhantomData<fn() -> C>,
}

impl<C> MropeText<C> {
    /// The text model of checkpoint root `vb` (the tower's tensors discarded).
    pub fn load(vb: &Vb, d: &TextDims, attention: &AttentionSpec) -> Result<Self> {
        vb.pp("vision_tower").discard_all();
        vb.pp("visual").discard_all();
        vb.pp("model").pp("visual").discard_all();
        // mlx-vlm: language_model.model.*; Hugging Face: model.language_model.*; mlx-lm: model.*.
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
        let tied = d.tie.unwrap_or(!head.contains("weight") && !head.contains("scales"));
        let h = d.hidden;
        let layers = (0..d.layers)
            .map(|i| {
                let lv = m.pp("layers").pp(i);
                Ok(Block {
                    input_layernorm: RmsNorm::load(&lv.pp("input_layernorm"), h, d.eps)?,
                    self_attn: Attention::load(&lv.pp("self_attn"), attention)?,
                    post_attention_layernorm: RmsNorm::load(&lv.pp("post_attention_layernorm"), h, d.eps)?,
                    mlp: GatedMlp::load(&lv.pp("mlp"), h, d.intermediate, false, GateActivation::Silu)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(MropeText {
            embed_tokens: Embedding::load(&m.pp("embed_tokens"), d.vocab, h)?,
            layers,
            norm: RmsNorm::load(&m.pp("norm"), h, d.eps)?,
            lm_head: LmHead::load(&head_root, tied, h, d.vocab)?,
            vocab_size: d.vocab,
            arch: PhantomData,
        })
    }

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

impl<C> CausalLm for MropeText<C> {
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

impl<C> Params for MropeText<C> {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.embed_tokens, self.layers, self.norm, self.lm_head);
    }
}
