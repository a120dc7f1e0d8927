//! The gated delta rule (Qwen3.5 / Qwen3-Next linear attention; mlx-lm's `gated_delta.py`): per
//! token t and value head, with S the `[Dv, Dk]` float32 state,
//! `S = g_t·S; S += k_t ⊗ (v_t − S·k_t)·β_t; y_t = S·q_t`.
//! [`gated_delta`] runs it through our fused CPU / CUDA kernel (`src/mlx/gated_delta.cpp`) and
//! falls back to [`gated_delta_ops`], the plain graph of MLX ops mlx-lm runs off Metal, which is
//! also the reference the kernels are tested against (`tests/mlx_ops.rs`).
use crate::error::Result;
use crate::mlx::{fast, Array};

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
