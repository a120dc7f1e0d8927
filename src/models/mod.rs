//! Architectures. One file per `model_type` family, each owning its config struct, its layers
//! and its weight names, behind the [`CausalLm`] trait; `registry.rs` lists them (one line each).
//!
//! Adding an architecture: write `src/models/<name>.rs` with a serde `Config` (mlx-lm's defaults,
//! validated in [`ArchConfig::validate`]), a model struct implementing [`CausalLm`] + [`Params`],
//! and `pub const ARCH: Architecture = Architecture::new::<Config, Model>("<model_type>", &[aliases])`;
//! then add `pub mod <name>;` below and `<name>::ARCH` to `registry::ARCHITECTURES`. Shared layers
//! live in `crate::nn`; [`run_layers`] and [`LmHead`] cover what every decoder does.
pub mod audio_input;
pub mod deepseek;
pub mod gemma3_text;
pub mod gemma3_vision;
pub mod gemma4_text;
pub mod gemma4_audio;
pub mod gemma4_vision;
pub mod gpt_oss;
pub mod llama;
pub mod minicpm;
pub mod mixtral;
pub mod mrope;
pub mod mrope_text;
pub mod nemotron_h;
pub mod qwen2;
pub mod qwen2_5_vision;
pub mod qwen2_5_vl;
pub mod qwen2_moe;
pub mod qwen3;
pub mod qwen3_moe;
pub mod qwen3_next;
pub mod qwen3_vl;
pub mod qwen_vision;
pub mod registry;
pub mod smollm3;
pub mod stack;
pub mod transformer;
pub mod vision_lm;

use crate::error::Result;
use crate::loader::{ModelConfig, Vb};
use crate::mlx::{async_eval, eval, Array, Dtype};
use crate::nn::{Cache, Embedding, LayerCaches, Linear, Params, RmsNorm};
use serde::de::DeserializeOwned;

pub use registry::{build_model, check_config, supported_model_types};

/// A decoder-only language model.
pub trait CausalLm: Params {
    /// Token ids `[B, L]` (int) → hidden states `[B, L, hidden]` (the input embeddings).
    fn embed(&self, tokens: &Array) -> Result<Array>;

    /// Input embeddings `[B, L, hidden]` → logits `[B, L, vocab]`, extending `caches`.
    fn forward_embeddings(&self, h: Array, caches: &mut LayerCaches) -> Result<Array>;

    /// Token ids `[B, L]` → logits `[B, L, vocab]`, extending `caches`.
    fn forward(&self, tokens: &Array, caches: &mut LayerCaches) -> Result<Array> {
        self.forward_embeddings(self.embed(tokens)?, caches)
    }

    /// Input rows `h` `[1, L, hidden]` already at the decoder's input scale (image rows as a
    /// vision tower gives them, text rows times the model's embedding scale), with token ids `ids`
    /// `[1, L]` for what the model reads besides the rows (Gemma 4's per-layer inputs; image
    /// positions hold the pad id) and which positions are image rows (`media`, L of them) → logits,
    /// extending `caches`. Only models whose vision towers need it
    /// ([`vision_lm::RowScale::Input`]) implement it.
    fn forward_input_rows(&self, h: Array, ids: &Array, media: &[bool], caches: &mut LayerCaches) -> Result<Array> {
        let _ = (h, ids, media, caches);
        Err(crate::error::Error::InvalidArgument("this model takes no input rows at its decoder's scale".into()))
    }

    /// Input embeddings `[1, L, hidden]` → logits with the tokens at rope `positions` (3-D
    /// multimodal rope: [`mrope`]) instead of the caches' offset, extending `caches`. Only text
    /// models behind a Qwen vision tower implement it.
    fn forward_embeddings_at(&self, h: Array, positions: &mrope::RopePositions, caches: &mut LayerCaches) -> Result<Array> {
        let _ = (h, positions, caches);
        Err(crate::error::Error::InvalidArgument("this model takes no multimodal rope positions".into()))
    }

    /// [`Self::forward_embeddings_at`], with deepstack features (Qwen3-VL): `deepstack[i]`
    /// `[1, L, hidden]` (zero at text positions) added to the hidden states after layer `i`.
    fn forward_embeddings_deepstack(
        &self,
        h: Array,
        positions: &mrope::RopePositions,
        deepstack: &[Array],
        caches: &mut LayerCaches,
    ) -> Result<Array> {
        let _ = (h, positions, deepstack, caches);
        Err(crate::error::Error::InvalidArgument("this model takes no deepstack features".into()))
    }

    /// How many of the prompt ids `ids` (the rest of a prompt being prefilled) the next prefill
    /// chunk takes, given the `n` wanted: `n`, unless that would split a run of the model's own
    /// ids (an image's tokens: [`vision_lm`]), which a chunk takes whole.
    fn prefill_chunk_len(&self, ids: &[u32], n: usize) -> usize {
        let _ = ids;
        n
    }

    /// A chunk of prompt ids (on the host) → logits, extending `caches`: [`Self::forward`], unless
    /// prompts hold ids of the model's own (a vision tower's image ids: [`vision_lm`]).
    fn forward_prompt(&self, ids: &[u32], caches: &mut LayerCaches) -> Result<Array> {
        self.forward(&Array::from_slice(ids, &[1, ids.len() as i32])?, caches)
    }

    /// Fresh, empty caches, one per layer, of the kind each layer needs.
    fn make_caches(&self) -> LayerCaches;

    /// Whether several requests can decode together in one batch (continuous batching: every
    /// layer a plain key/value cache and attention that takes per-row positions and padding).
    /// The engine serves the others one step each in turn.
    fn batchable(&self) -> bool {
        false
    }

    /// Rows of the output (the vocabulary size).
    fn vocab_size(&self) -> usize;

    /// The float dtype the model computes in.
    fn dtype(&self) -> Dtype;

    /// How the prompt marks an image, for models with a vision tower ([`vision_lm`]).
    fn image_prompt(&self) -> Option<&vision_lm::ImagePrompt> {
        None
    }

    /// How the prompt marks an audio clip, for models with an audio tower ([`audio_input`]).
    fn audio_prompt(&self) -> Option<&audio_input::AudioPrompt> {
        None
    }

    /// The prompt `ids` with each image's run of image tokens replaced by ids standing for that
    /// image (`images` in prompt order), the images encoded: see [`vision_lm`].
    fn bind_images(&self, ids: Vec<u32>, images: &[&vision_lm::ImageData]) -> Result<Vec<u32>> {
        if images.is_empty() {
            Ok(ids)
        } else {
            Err(crate::error::Error::InvalidArgument("this model takes no images (it has no vision tower)".into()))
        }
    }

    /// [`Self::bind_images`] for images and videos (as frames), in prompt order.
    fn bind_media(&self, ids: Vec<u32>, media: &[crate::chat::Media]) -> Result<Vec<u32>> {
        if media.iter().any(|m| matches!(m, crate::chat::Media::Video(_))) {
            return Err(crate::error::Error::InvalidArgument("this model takes no video".into()));
        }
        if media.iter().any(|m| matches!(m, crate::chat::Media::Audio(_))) {
            return Err(crate::error::Error::InvalidArgument("this model takes no audio (it has no audio tower)".into()));
        }
        let images: Vec<&vision_lm::ImageData> =
            media.iter().filter_map(|m| if let crate::chat::Media::Image(i) = m { Some(*i) } else { None }).collect();
        self.bind_images(ids, &images)
    }

    /// Every parameter array (evaluated at load, counted in `weights_bytes`).
    fn parameters(&self) -> Vec<&Array> {
        let mut out = vec![];
        self.params(&mut out);
        out
    }
}

/// An architecture's own view of config.json.
pub trait ArchConfig: DeserializeOwned {
    /// Checks what serde cannot (ranges, divisibility): the message names the field.
    fn validate(&self) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// Builds a model from its config and scoped weights.
pub trait Loadable: Sized + CausalLm + 'static {
    type Config: ArchConfig;
    fn load(config: Self::Config, common: &ModelConfig, vb: &Vb) -> Result<Self>;
}

/// One registry entry: a `model_type`, its aliases, how to check its config and build it.
pub struct Architecture {
    pub model_type: &'static str,
    pub aliases: &'static [&'static str],
    pub check: fn(&ModelConfig) -> Result<()>,
    pub load: fn(&ModelConfig, &Vb) -> Result<Box<dyn CausalLm>>,
}

impl Architecture {
    pub const fn new<M: Loadable>(model_type: &'static str, aliases: &'static [&'static str]) -> Self {
        Architecture { model_type, aliases, check: check_as::<M>, load: load_as::<M> }
    }
}

fn parse_config<M: Loadable>(c: &ModelConfig) -> Result<M::Config> {
    let cfg: M::Config = c.parse()?;
    cfg.validate().map_err(|m| c.error(m))?;
    Ok(cfg)
}

pub(crate) fn check_as<M: Loadable>(c: &ModelConfig) -> Result<()> {
    parse_config::<M>(c).map(|_| ())
}

pub(crate) fn load_as<M: Loadable>(c: &ModelConfig, vb: &Vb) -> Result<Box<dyn CausalLm>> {
    Ok(Box::new(M::load(parse_config::<M>(c)?, c, vb)?))
}

/// Layers of a prefill chunk scheduled beyond the one being waited for (see [`run_layers`]).
const PREFILL_LAYERS_AHEAD: usize = 2;
/// The fewest tokens of a pass whose layers are bounded (see [`run_layers`]). Shorter passes
/// (speculative verifications, a draft model catching up, a prompt's last few tokens) hold
/// little and run as one graph: waiting on every other layer made a 4-token verification pass
/// of SmolLM2 on the H200 cost 6–7 ms of host time against a decode step's 1.6, and kept the
/// next pass from being built while the device ran this one.
const PREFILL_BOUND_MIN_TOKENS: i32 = 128;

/// Runs `h` through `layers` in order, layer `i` with cache `i`.
///
/// Prefill keeps only a few layers queued ahead of the device. MLX releases an intermediate once
/// the kernels that read it have completed, so a whole-model graph submitted at once keeps most
/// layers' activations alive together (on the GPU this put our peak above mlx-lm's); waiting on
/// the layer PREFILL_LAYERS_AHEAD back keeps the device busy while bounding what is in flight. A
/// pass under PREFILL_BOUND_MIN_TOKENS is too small to matter. (MLEX_ABLATE_PREFILL_BOUND:
/// benchmark ablation only.)
pub fn run_layers<L>(
    mut h: Array,
    layers: &[L],
    caches: &mut LayerCaches,
    mut f: impl FnMut(&L, usize, &Array, &mut dyn Cache) -> Result<Array>,
) -> Result<Array> {
    if caches.len() != layers.len() {
        return Err(crate::error::Error::InvalidArgument(format!(
            "{} caches for {} layers",
            caches.len(),
            layers.len()
        )));
    }
    let bounded = h.dim(1) >= PREFILL_BOUND_MIN_TOKENS && !crate::ablation::get().prefill_bound;
    let mut in_flight = std::collections::VecDeque::with_capacity(PREFILL_LAYERS_AHEAD + 1);
    for (i, (layer, cache)) in layers.iter().zip(caches.iter_mut()).enumerate() {
        h = f(layer, i, &h, cache.as_mut())?;
        if bounded {
            async_eval(&[&h])?;
            in_flight.push_back(h.clone());
            if in_flight.len() > PREFILL_LAYERS_AHEAD {
                eval(&[&in_flight.pop_front().expect("not empty")])?;
            }
        }
    }
    Ok(h)
}

thread_local! {
    static LAST_POSITION_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// While alive (on this thread), [`LmHead`] computes the logits of the last position only: a
/// prompt chunk that also gives the next token (`generate::generator::Stepper::step_prompt`)
/// needs one row of logits, not one per prompt token (a vocabulary-wide product each). A hint:
/// models with a head of their own still return every position, and the caller takes the last.
pub struct LastPositionLogits(bool);

impl LastPositionLogits {
    pub fn scope() -> Self {
        LastPositionLogits(LAST_POSITION_ONLY.with(|c| c.replace(true)))
    }
}

impl Drop for LastPositionLogits {
    fn drop(&mut self) {
        LAST_POSITION_ONLY.with(|c| c.set(self.0));
    }
}

/// `h` `[B, L, hidden]`, or its last position `[B, 1, hidden]` inside a [`LastPositionLogits`] scope.
fn last_position_only(h: &Array) -> Result<Array> {
    let l = if h.ndim() >= 2 { h.dim(-2) } else { 1 };
    if l > 1 && LAST_POSITION_ONLY.with(|c| c.get()) {
        return h.slice_axis(-2, l - 1, l);
    }
    Ok(h.clone())
}

/// The output projection: its own `lm_head`, or the embedding table (tied).
pub enum LmHead {
    Own(Linear),
    Tied,
}

impl LmHead {
    /// `lm_head` of module `vb` unless `tied` (then a stored `lm_head.weight` is dropped, as
    /// mlx-lm's sanitize does).
    pub fn load(vb: &Vb, tied: bool, hidden: usize, vocab: usize) -> Result<Self> {
        if tied {
            vb.pp("lm_head").discard("weight");
            Ok(LmHead::Tied)
        } else {
            Ok(LmHead::Own(Linear::load(&vb.pp("lm_head"), hidden, vocab, false)?))
        }
    }

    pub fn forward(&self, h: &Array, embed: &Embedding) -> Result<Array> {
        let h = &last_position_only(h)?;
        match self {
            LmHead::Own(l) => l.forward(h),
            LmHead::Tied => embed.as_linear(h),
        }
    }

    /// `forward(norm(h))`: the final norm folded into the head's product where it can be.
    pub fn forward_normed(&self, h: &Array, norm: &RmsNorm, embed: &Embedding) -> Result<Array> {
        let h = &last_position_only(h)?;
        match self {
            LmHead::Own(l) => l.forward_normed(h, norm),
            LmHead::Tied => embed.as_linear_normed(h, norm),
        }
    }
}

impl Params for LmHead {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        if let LmHead::Own(l) = self {
            l.params(out);
        }
    }
}
