//! Rotary position embeddings with the scaling variants of mlx-lm's `rope_utils.initialize_rope`.
use crate::error::Result;
use crate::loader::{RopeConfig, RopeScaling};
use super::norm::RmsNorm;
use crate::mlx::{fast, Array};

pub struct Rope {
    dims: i32,
    traditional: bool,
    base: f32,
    scale: f32,
    /// Precomputed inverse frequencies (llama3, yarn) replacing `base`.
    freqs: Option<Array>,
    /// Yarn's input multiplier.
    mscale: f32,
    /// Dynamic NTK: (factor, max_position_embeddings).
    dynamic: Option<(f32, f32)>,
}

impl Rope {
    pub fn new(dims: usize, cfg: &RopeConfig, max_position_embeddings: Option<usize>) -> Result<Self> {
        let d = dims as f64;
        let base = cfg.theta as f64;
        // base^(2i/d) for i in 0..d/2: the per-pair wavelength divisors MLX's rope expects as freqs.
        let base_freqs = || (0..dims / 2).map(|i| base.powf((2 * i) as f64 / d)).collect::<Vec<f64>>();
        let mut rope = Rope {
            dims: dims as i32,
            traditional: cfg.traditional,
            base: cfg.theta,
            scale: 1.0,
            freqs: None,
            mscale: 1.0,
            dynamic: None,
        };
        match &cfg.scaling {
            RopeScaling::Default => {}
            RopeScaling::Linear { factor } => rope.scale = 1.0 / factor,
            RopeScaling::Dynamic { factor } => {
                rope.dynamic = Some((*factor, max_position_embeddings.unwrap_or(2048) as f32));
            }
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                let (factor, lo, hi, old) =
                    (*factor as f64, *low_freq_factor as f64, *high_freq_factor as f64, *original_max_position_embeddings as f64);
                let low_wavelen = old / lo;
                let high_wavelen = old / hi;
                let freqs: Vec<f32> = base_freqs()
                    .into_iter()
                    .map(|f| {
                        let wavelen = 2.0 * std::f64::consts::PI * f;
                        let scaled = if wavelen > low_wavelen { f * factor } else { f };
                        if wavelen > high_wavelen && wavelen < low_wavelen {
                            let smooth = (old / wavelen - lo) / (hi - lo);
                            (scaled / ((1.0 - smooth) / factor + smooth)) as f32
                        } else {
                            scaled as f32
                        }
                    })
                    .collect();
                rope.freqs = Some(Array::from_slice(&freqs, &[freqs.len() as i32])?);
            }
            RopeScaling::Yarn { factor, original_max_position_embeddings, beta_fast, beta_slow, mscale, mscale_all_dim } => {
                let (factor, orig) = (*factor as f64, *original_max_position_embeddings as f64);
                let correction_dim = |rot: f64| (d * (orig / (rot * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * base.ln());
                let low = correction_dim(*beta_fast as f64).floor().max(0.0);
                let high = correction_dim(*beta_slow as f64).ceil().min(d - 1.0);
                let get_mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
                rope.mscale = (get_mscale(factor, *mscale as f64) / get_mscale(factor, *mscale_all_dim as f64)) as f32;
                let hi = if low == high { high + 0.001 } else { high };
                let freqs: Vec<f32> = base_freqs()
                    .into_iter()
                    .enumerate()
                    .map(|(i, extra)| {
                        let ramp = ((i as f64 - low) / (hi - low)).clamp(0.0, 1.0);
                        let mask = 1.0 - ramp;
                        let inter = factor * extra;
                        ((inter * extra) / (inter * mask + extra * (1.0 - mask))) as f32
                    })
                    .collect();
                rope.freqs = Some(Array::from_slice(&freqs, &[freqs.len() as i32])?);
            }
        }
        Ok(rope)
    }

    /// Whether rows at different positions can share one call ([`Rope::forward_rows`]): not with
    /// dynamic NTK, whose base depends on the sequence length.
    pub fn batchable(&self) -> bool {
        self.dynamic.is_none()
    }

    /// Rotates `x` (`[B, H, L, D]`) with row b at positions `positions[b]..positions[b]+L`
    /// (int32 `[B]`: the rows of a continuous batch).
    pub fn forward_rows(&self, x: &Array, positions: &Array) -> Result<Array> {
        if self.dynamic.is_some() {
            return Err(crate::error::Error::Mlx("dynamic NTK rope does not batch rows at different positions".into()));
        }
        let x = if self.mscale != 1.0 { x.multiply(&Array::scalar_f32(self.mscale, x.dtype())?)? } else { x.clone() };
        fast::rope_offsets(&x, self.dims, self.traditional, self.base, self.scale, positions, self.freqs.as_ref())
    }

    /// The q and k heads of a decode step's fused q/k/v product (`[B, HQ + 2·HKV, 1, D]`)
    /// normalized by `q_norm` / `k_norm` and rotated at `positions` (int32 `[1]` or `[B]`), in
    /// one CUDA kernel instead of four; None where that does not apply (another backend or
    /// dtype, a scaled or length-dependent rope, a partial rotation), and the caller runs the ops.
    pub fn norm_rotate_qk(
        &self,
        qkv: &Array,
        heads: (i32, i32),
        q_norm: &RmsNorm,
        k_norm: &RmsNorm,
        positions: &Array,
    ) -> Result<Option<(Array, Array)>> {
        if self.mscale != 1.0 || self.dynamic.is_some() || self.dims != qkv.dim(-1) || q_norm.eps != k_norm.eps {
            return Ok(None);
        }
        fast::cuda_qk_norm_rope(
            qkv,
            heads,
            &q_norm.weight,
            &k_norm.weight,
            q_norm.eps,
            self.traditional,
            self.base,
            self.scale,
            self.freqs.as_ref(),
            positions,
        )
    }

    /// `(dims, traditional, base, scale, freqs)` as `fast::rope` takes them, for a kernel that
    /// rotates by itself; None for a rope that is more than that call (yarn's input scale, dynamic
    /// NTK's length-dependent base).
    pub fn plain(&self) -> Option<(i32, bool, f32, f32, Option<&Array>)> {
        (self.mscale == 1.0 && self.dynamic.is_none()).then_some((self.dims, self.traditional, self.base, self.scale, self.freqs.as_ref()))
    }

    /// Rotates `x` (`[B, H, L, D]`) for positions `offset..offset+L`.
    pub fn forward(&self, x: &Array, offset: usize) -> Result<Array> {
        let mut x = x.clone();
        if self.mscale != 1.0 {
            // All our architectures rotate the full head, so scaling the whole input matches
            // mlx-lm's `x[..., :dims] *= mscale`.
            x = x.multiply(&Array::scalar_f32(self.mscale, x.dtype())?)?;
        }
        let mut base = self.base;
        if let Some((factor, max_pos)) = self.dynamic {
            let seq_len = (x.dim(-2) as f32 + offset as f32).max(max_pos);
            let d = self.dims as f32;
            base = self.base * ((factor * seq_len / max_pos) - (factor - 1.0)).powf(d / (d - 2.0));
        }
        fast::rope(&x, self.dims, self.traditional, base, self.scale, offset as i32, self.freqs.as_ref())
    }
}


/// `x·cos + rotate_half(x)·sin` for rotary tables computed outside MLX's `fast::rope` (vision
/// towers' 2-D positions), with the head (`x`'s last axis, D) split into `groups` equal parts,
/// each rotated inside itself: `rotate_half` of a part `(x₁, x₂)` is `(−x₂, x₁)`. `cos` and `sin`
/// are `[..., D]`, broadcastable against `x`, with the sine already negated on each part's first
/// half ([`signed_sin`]). The halves are swapped through a reversed view (no copy), so the
/// rotation costs two products and a sum instead of slices, negations and a concatenation, with
/// the same values bit for bit (`(−a)·b = a·(−b)`).
pub fn rotate_half_rope(x: &Array, cos: &Array, sin: &Array, groups: i32) -> Result<Array> {
    let shape = x.shape();
    let d = *shape.last().expect("rank ≥ 1");
    let split = |t: &Array| -> Result<Array> {
        let mut s = t.shape();
        s.pop();
        s.extend([groups, 2, d / (2 * groups)]);
        t.reshape(&s)
    };
    let parts = split(x)?;
    let rank = parts.ndim();
    // The axis of size 2 reversed: (x₁, x₂) → (x₂, x₁) within each part.
    let mut start = vec![0; rank];
    let mut stop = parts.shape();
    let mut strides = vec![1; rank];
    start[rank - 2] = 1;
    stop[rank - 2] = -3;
    strides[rank - 2] = -1;
    let swapped = parts.slice(&start, &stop, &strides)?;
    parts.multiply(&split(cos)?)?.add(&swapped.multiply(&split(sin)?)?)?.reshape(&shape)
}

/// The sine table [`rotate_half_rope`] takes for one part of the head: `sin` `[..., D/(2·groups)]`
/// (one angle per rotated pair) becomes `[−sin, sin]` along the last axis.
pub fn signed_sin(sin: &Array) -> Result<Array> {
    let axis = sin.ndim() as i32 - 1;
    Array::concatenate(&[&sin.negative()?, sin], axis)
}
