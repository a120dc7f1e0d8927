//! The pre-norm decoder-only transformer shared by llama, qwen2 and qwen3:
//! embed → N × (x + attn(norm(x)); x + mlp(norm(x))) → norm → lm_head (or tied embeddings).
//! Section order as in every architecture file: spec, block, model, load.
use crate::error::{Error, Result};
use crate::loader::{ModelConfig, WeightStore};
use crate::mlx::{async_eval, eval, Array};
use crate::nn::{Attention, Embedding, GatedMlp, KvCache, Linear, Projections, RmsNorm, Rope};

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

/// Layers of a prefill chunk scheduled beyond the one being waited for (see `DecoderModel::forward`).
const PREFILL_LAYERS_AHEAD: usize = 2;

pub struct DecoderBlock {
    pub input_layernorm: RmsNorm,
    pub self_attn: Attention,
    pub post_attention_layernorm: RmsNorm,
    pub mlp: GatedMlp,
}

impl DecoderBlock {
    fn forward(&self, x: &Array, cache: &mut KvCache) -> Result<Array> {
        let h = x.add(&self.self_attn.forward(&self.input_layernorm.forward(x)?, cache)?)?;
        h.add(&self.mlp.forward(&self.post_attention_layernorm.forward(&h)?)?)
    }
}

pub struct DecoderModel {
    pub config: ModelConfig,
    pub embed_tokens: Embedding,
    pub layers: Vec<DecoderBlock>,
    pub norm: RmsNorm,
    /// None when tied to the embeddings.
    pub lm_head: Option<Linear>,
}

impl DecoderModel {
    /// `tokens` `[B, L]` (int32) → logits `[B, L, vocab]`, extending `caches` (one per layer).
    pub fn forward(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Array> {
        if caches.len() != self.layers.len() {
            return Err(Error::InvalidArgument(format!(
                "{} caches for {} layers",
                caches.len(),
                self.layers.len()
            )));
        }
        let mut h = self.embed_tokens.forward(tokens)?;
        // Prefill keeps only a few layers queued ahead of the device. MLX releases an
        // intermediate once the kernels that read it have completed, so a whole-model graph
        // submitted at once keeps most layers' activations alive together (on the GPU this put
        // our peak above mlx-lm's); waiting on the layer PREFILL_LAYERS_AHEAD back keeps the
        // device busy while bounding what is in flight. A decode step is too small to matter.
        // (MLEX_ABLATE_PREFILL_BOUND: benchmark ablation only, BENCHMARKS.md.)
        let bounded = tokens.dim(-1) > 1 && std::env::var_os("MLEX_ABLATE_PREFILL_BOUND").is_none();
        let mut in_flight = std::collections::VecDeque::with_capacity(PREFILL_LAYERS_AHEAD + 1);
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            h = layer.forward(&h, cache)?;
            if bounded {
                async_eval(&[&h])?;
                in_flight.push_back(h.clone());
                if in_flight.len() > PREFILL_LAYERS_AHEAD {
                    eval(&[&in_flight.pop_front().expect("not empty")])?;
                }
            }
        }
        let h = self.norm.forward(&h)?;
        match &self.lm_head {
            Some(head) => head.forward(&h),
            None => self.embed_tokens.as_linear(&h),
        }
    }

    pub fn new_caches(&self) -> Vec<KvCache> {
        (0..self.layers.len()).map(|_| KvCache::new()).collect()
    }

    /// Builds the model from `weights`, taking every tensor strictly (see `WeightStore`).
    pub fn load(config: ModelConfig, spec: ArchSpec, w: &mut WeightStore) -> Result<Self> {
        let c = &config;
        let q = c.quantization.as_ref();
        let (hidden, inter) = (c.hidden_size, c.intermediate_size);
        let (nh, nkv, hd) = (c.num_attention_heads, c.num_kv_heads(), c.head_dim());
        let tie = c.tie_word_embeddings.unwrap_or(spec.tie_default);

        // Sanitize as mlx-lm does: precomputed rotary tables are recomputed, a tied head is dropped.
        let stale: Vec<String> = w.names().filter(|n| n.contains("self_attn.rotary_emb.inv_freq")).cloned().collect();
        for n in stale {
            w.discard(&n);
        }
        if tie {
            w.discard("lm_head.weight");
        }

        let embed_tokens = Embedding::load(w, q, "model.embed_tokens", c.vocab_size, hidden)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let lin = |w: &mut WeightStore, name: &str, inp: usize, out: usize, bias: bool| {
                Linear::load(w, q, &format!("{p}.{name}"), inp, out, bias)
            };
            let self_attn = Attention {
                qkv: Projections::new("qkv", vec![
                    lin(w, "self_attn.q_proj", hidden, nh * hd, spec.qkv_bias)?,
                    lin(w, "self_attn.k_proj", hidden, nkv * hd, spec.qkv_bias)?,
                    lin(w, "self_attn.v_proj", hidden, nkv * hd, spec.qkv_bias)?,
                ])?,
                o_proj: lin(w, "self_attn.o_proj", nh * hd, hidden, spec.o_bias)?,
                q_norm: if spec.qk_norm { Some(RmsNorm::load(w, &format!("{p}.self_attn.q_norm"), hd, c.rms_norm_eps)?) } else { None },
                k_norm: if spec.qk_norm { Some(RmsNorm::load(w, &format!("{p}.self_attn.k_norm"), hd, c.rms_norm_eps)?) } else { None },
                rope: Rope::new(hd, &c.rope, c.max_position_embeddings)?,
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
                scale: (hd as f32).powf(-0.5),
            };
            let mlp = GatedMlp {
                gate_up: Projections::new("gate_up", vec![
                    lin(w, "mlp.gate_proj", hidden, inter, spec.mlp_bias)?,
                    lin(w, "mlp.up_proj", hidden, inter, spec.mlp_bias)?,
                ])?,
                down_proj: lin(w, "mlp.down_proj", inter, hidden, spec.mlp_bias)?,
            };
            layers.push(DecoderBlock {
                input_layernorm: RmsNorm::load(w, &format!("{p}.input_layernorm"), hidden, c.rms_norm_eps)?,
                self_attn,
                post_attention_layernorm: RmsNorm::load(w, &format!("{p}.post_attention_layernorm"), hidden, c.rms_norm_eps)?,
                mlp,
            });
        }
        let norm = RmsNorm::load(w, "model.norm", hidden, c.rms_norm_eps)?;
        let lm_head = if tie { None } else { Some(Linear::load(w, q, "lm_head", hidden, c.vocab_size, false)?) };
        Ok(DecoderModel { config, embed_tokens, layers, norm, lm_head })
    }

    /// Every parameter array (for evaluation at load and byte counts).
    pub fn parameters(&self) -> Vec<&Array> {
        fn lin(l: &Linear) -> Vec<&Array> {
            match l {
                Linear::Dense { weight_t, bias } => std::iter::once(weight_t).chain(bias.iter()).collect(),
                Linear::Quantized { q, bias } => {
                    [&q.weight, &q.scales].into_iter().chain(q.biases.iter()).chain(bias.iter()).collect()
                }
            }
        }
        let mut out: Vec<&Array> = match &self.embed_tokens {
            Embedding::Dense { table, .. } => vec![table],
            Embedding::Quantized(q) => [&q.weight, &q.scales].into_iter().chain(q.biases.iter()).collect(),
        };
        for l in &self.layers {
            let a = &l.self_attn;
            for p in a.qkv.linears().into_iter().chain(l.mlp.gate_up.linears()).chain([&a.o_proj, &l.mlp.down_proj]) {
                out.extend(lin(p));
            }
            out.extend(a.q_norm.iter().chain(a.k_norm.iter()).map(|n| &n.weight));
            out.push(&l.input_layernorm.weight);
            out.push(&l.post_attention_layernorm.weight);
        }
        out.push(&self.norm.weight);
        if let Some(h) = &self.lm_head {
            out.extend(lin(h));
        }
        out
    }
}
