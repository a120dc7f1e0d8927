//! Logits → next token, on the device, with mlx-lm's semantics (`sample_utils.py`): the
//! repetition penalty edits logits; top-p, min-p and top-k filter log-probabilities in that
//! order; then argmax (temperature 0) or a categorical draw at the temperature.
use super::options::SamplingConfig;
use crate::error::Result;
use crate::mlx::{random, Array, Dtype};

pub struct Sampler {
    cfg: SamplingConfig,
    key: Option<random::RandomKey>,
}

impl Sampler {
    pub fn new(cfg: &SamplingConfig) -> Result<Self> {
        let key = if cfg.temperature > 0.0 {
            let seed = cfg.seed.unwrap_or_else(|| {
                let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                t.as_nanos() as u64 ^ (std::process::id() as u64) << 32
            });
            Some(random::RandomKey::new(seed)?)
        } else {
            None
        };
        Ok(Sampler { cfg: cfg.clone(), key })
    }

    /// Applies the repetition penalty to `logits` `[1, V]` for the `recent` token ids `[n]`.
    pub fn penalize(&self, logits: &Array, recent: Option<&Array>) -> Result<Array> {
        let p = self.cfg.repetition_penalty;
        match recent {
            Some(ids) if p != 1.0 && ids.size() > 0 => {
                let ids = ids.reshape(&[1, -1])?;
                let sel = logits.take_along_axis(&ids, -1)?;
                let zero = Array::scalar_f32(0.0, sel.dtype())?;
                let pen = Array::scalar_f32(p, sel.dtype())?;
                let new = Array::where_(&sel.less(&zero)?, &sel.multiply(&pen)?, &sel.divide(&pen)?)?;
                logits.put_along_axis(&ids, &new, -1)
            }
            _ => Ok(logits.clone()),
        }
    }

    /// Samples from `logprobs` `[1, V]` → token `[1]` (uint32).
    pub fn sample(&mut self, logprobs: &Array) -> Result<Array> {
        if self.cfg.temperature == 0.0 {
            return logprobs.argmax(-1, false)?.astype(Dtype::Uint32);
        }
        let scaled = self.filtered(logprobs)?;
        self.draw(&scaled)
    }

    /// A categorical draw (one per row) from `scaled` logits `[R, V]` ([`Sampler::filtered`]'s).
    pub fn draw(&mut self, scaled: &Array) -> Result<Array> {
        let key = self.key.as_mut().expect("a key exists whenever temperature > 0").next()?;
        random::categorical(scaled, -1, &key)?.astype(Dtype::Uint32)
    }

    /// The logits a sampled token is drawn from (temperature > 0): `logprobs` `[R, V]` after
    /// top-p, min-p and top-k, divided by the temperature. Their softmax is the distribution
    /// the sampler draws from (speculative decoding's acceptance rule needs it explicitly).
    pub fn filtered(&self, logprobs: &Array) -> Result<Array> {
        let c = &self.cfg;
        let neg_inf = || Array::scalar_f32(f32::NEG_INFINITY, logprobs.dtype());
        let mut lp = logprobs.clone();
        if c.top_p > 0.0 && c.top_p < 1.0 {
            let sorted = lp.sort(-1)?;
            let probs = sorted.astype(Dtype::Float32)?.exp()?;
            let mass_above = probs.cumsum(-1, true, false)?;
            let total = mass_above.slice_axis(-1, 0, 1)?.add(&probs.slice_axis(-1, 0, 1)?)?;
            let limit = total.multiply(&Array::scalar_f32(c.top_p, Dtype::Float32)?)?;
            let dropped = mass_above.greater_equal(&limit)?.astype(Dtype::Int32)?.sum(&[-1], true)?;
            let threshold = sorted.take_along_axis(&dropped, -1)?;
            lp = Array::where_(&lp.less(&threshold)?, &neg_inf()?, &lp)?;
        }
        if c.min_p > 0.0 {
            let top = lp.max(&[-1], true)?;
            let threshold = top.add(&Array::scalar_f32(c.min_p.ln(), lp.dtype())?)?;
            lp = Array::where_(&lp.less(&threshold)?, &neg_inf()?, &lp)?;
        }
        let vocab = lp.dim(-1);
        if c.top_k > 0 && (c.top_k as i32) < vocab {
            let k = c.top_k as i32;
            let idx = lp.negative()?.argpartition(k - 1, -1)?.slice_axis(-1, k, vocab)?;
            let fill = neg_inf()?.broadcast_to(&idx.shape())?;
            lp = lp.put_along_axis(&idx, &fill, -1)?;
        }
        lp.multiply(&Array::scalar_f32(1.0 / c.temperature, lp.dtype())?)
    }
}
