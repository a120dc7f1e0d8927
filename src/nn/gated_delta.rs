//! The gated delta rule (Qwen3.5 / Qwen3-Next linear attention; mlx-lm's `gated_delta.py`): per
//! token t and value head, with S the `[Dv, Dk]` float32 state,
//! `S = g_t·S; S += k_t ⊗ (v_t − S·k_t)·β_t; y_t = S·q_t`.
//! [`gated_delta_update`] is what a layer calls (mlx-lm's `normalize_qk` + `gated_delta_update`):
//! on CUDA all of it is one kernel of ours; elsewhere q/k are normalised and the gates computed
//! with ops, then [`gated_delta`] runs the recurrence through our CPU kernel or, failing that,
//! [`gated_delta_ops`], the plain graph of MLX ops mlx-lm runs off Metal, which is also the
//! reference the kernels are tested against (`tests/mlx_ops.rs`). Kernels: `src/mlx/gated_delta.cpp`.
use crate::error::Result;
use crate::mlx::{fast, Array, Dtype};

/// q, k `[B, T, Hk, Dk]` as the conv gives them, v `[B, T, Hv, Dv]`, the gate inputs a, b
/// `[B, T, Hv]`, the layer's `A_log` and `dt_bias` `[Hv]`, state `[B, Hv, Dv, Dk]` float32 →
/// (y `[B, T, Hv, Dv]`, the new state).
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_update(
    q: &Array,
    k: &Array,
    v: &Array,
    a: &Array,
    b: &Array,
    a_log: &Array,
    dt_bias: &Array,
    state: &Array,
) -> Result<(Array, Array)> {
    if let Some(r) = fast::gated_delta_update(q, k, v, a, b, a_log, dt_bias, state)? {
        return Ok(r);
    }
    let (q, k) = normalize_qk(q, k)?;
    let (g, beta) = gates(a, b, a_log, dt_bias)?;
    gated_delta(&q, &k, v, &g, &beta, state)
}

/// L2-normalised q and k (eps 1e-6 on the sum of squares, as an RMSNorm), q also scaled by
/// Dk^-0.5 (the readout scale), as mlx-lm's `normalize_qk`.
pub fn normalize_qk(q: &Array, k: &Array) -> Result<(Array, Array)> {
    let inv = (q.dim(-1) as f64).powf(-0.5);
    let rms_eps = (1e-6 * inv * inv) as f32;
    let q = fast::rms_norm(q, None, rms_eps)?.multiply(&Array::scalar_f32((inv * inv) as f32, q.dtype())?)?;
    let k = fast::rms_norm(k, None, rms_eps)?.multiply(&Array::scalar_f32(inv as f32, k.dtype())?)?;
    Ok((q, k))
}

/// (g, β): g = exp(−exp(A_log)·softplus(a + dt_bias)) in float32, β = sigmoid(b).
pub fn gates(a: &Array, b: &Array, a_log: &Array, dt_bias: &Array) -> Result<(Array, Array)> {
    let softplus = a.add(dt_bias)?.logaddexp(&Array::scalar_f32(0.0, a.dtype())?)?;
    let g = a_log.astype(Dtype::Float32)?.exp()?.negative()?.multiply(&softplus)?.exp()?;
    Ok((g, b.sigmoid()?))
}

/// q, k `[B, T, Hk, Dk]`, v `[B, T, Hv, Dv]`, g, beta `[B, T, Hv]`, state `[B, Hv, Dv, Dk]` float32
/// → (y `[B, T, Hv, Dv]` in q's dtype, the new state).
pub fn gated_delta(q: &Array, k: &Array, v: &Array, g: &Array, beta: &Array, state: &Array) -> Result<(Array, Array)> {
    match fast::gated_delta(q, k, v, g, beta, state)? {
        Some(r) => Ok(r),
        None => gated_delta_ops(q, k, v, g, beta, state),
    }
}

/// The reference: one step of ~10 ops per token, as mlx-lm's `gated_delta_ops`.
pub fn gated_delta_ops(q: &Array, k: &Array, v: &Array, g: &Array, beta: &Array, state: &Array) -> Result<(Array, Array)> {
    let sh = q.shape();
    let (b, s, nk, dk) = (sh[0], sh[1], sh[2], sh[3]);
    let nv = v.dim(2);
    let r = nv / nk;
    let (q, k) = if r > 1 {
        let rep = |t: &Array| t.expand_dims(-2)?.broadcast_to(&[b, s, nk, r, dk])?.reshape(&[b, s, nv, dk]);
        (rep(q)?, rep(k)?)
    } else {
        (q.clone(), k.clone())
    };
    let mut st = state.clone();
    let mut ys = Vec::with_capacity(s as usize);
    for t in 0..s {
        let at = |x: &Array| -> Result<Array> { x.slice_axis(1, t, t + 1)?.squeeze(1) };
        let (qt, kt, vt, gt, bt) = (at(&q)?, at(&k)?, at(v)?, at(g)?, at(beta)?);
        let kt = kt.expand_dims(-2)?; // [B, H, 1, Dk]
        st = st.multiply(&gt.expand_dims(-1)?.expand_dims(-1)?)?;
        let kv_mem = st.multiply(&kt)?.sum(&[-1], false)?; // [B, H, Dv]
        let delta = vt.subtract(&kv_mem)?.multiply(&bt.expand_dims(-1)?)?;
        st = st.add(&kt.multiply(&delta.expand_dims(-1)?)?)?;
        let y = st.multiply(&qt.expand_dims(-2)?)?.sum(&[-1], false)?;
        ys.push(y.astype(qt.dtype())?.expand_dims(1)?);
    }
    let y = if ys.len() == 1 { ys.pop().unwrap() } else { Array::concatenate(&ys.iter().collect::<Vec<_>>(), 1)? };
    Ok((y, st))
}
