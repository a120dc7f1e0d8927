//! MLX operations as methods on [`Array`]. Each builds a graph node; nothing runs until eval.
use super::array::Array;
use super::dtype::Dtype;
use super::error::check;
use super::sys;
use crate::error::Result;

macro_rules! unary {
    ($($(#[$m:meta])* $name:ident => $op:ident),* $(,)?) => {$(
        $(#[$m])*
        pub fn $name(&self) -> Result<Array> {
            Array::try_from_op(|out| unsafe { sys::mlex_unary(sys::$op, self.raw(), out) })
        }
    )*};
}

macro_rules! binary {
    ($($(#[$m:meta])* $name:ident => $op:ident),* $(,)?) => {$(
        $(#[$m])*
        pub fn $name(&self, other: &Array) -> Result<Array> {
            Array::try_from_op(|out| unsafe { sys::mlex_binary(sys::$op, self.raw(), other.raw(), out) })
        }
    )*};
}

macro_rules! reduce {
    ($($name:ident => $op:ident),* $(,)?) => {$(
        /// Reduces over `axes` (all axes when empty).
        pub fn $name(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
            Array::try_from_op(|out| unsafe {
                sys::mlex_reduce(sys::$op, self.raw(), axes.as_ptr(), axes.len(), keepdims, out)
            })
        }
    )*};
}

fn raw_or_null(a: Option<&Array>) -> sys::mlex_array {
    a.map_or(std::ptr::null_mut(), |a| a.raw())
}

impl Array {
    unary! {
        negative => MLEX_UNARY_NEGATIVE,
        exp => MLEX_UNARY_EXP,
        log => MLEX_UNARY_LOG,
        sqrt => MLEX_UNARY_SQRT,
        rsqrt => MLEX_UNARY_RSQRT,
        square => MLEX_UNARY_SQUARE,
        abs => MLEX_UNARY_ABS,
        sigmoid => MLEX_UNARY_SIGMOID,
        tanh => MLEX_UNARY_TANH,
        erf => MLEX_UNARY_ERF,
        sin => MLEX_UNARY_SIN,
        cos => MLEX_UNARY_COS,
        logical_not => MLEX_UNARY_LOGICAL_NOT,
        /// A copy that owns its own buffer.
        copy => MLEX_UNARY_COPY,
        floor => MLEX_UNARY_FLOOR,
        isnan => MLEX_UNARY_ISNAN,
    }

    binary! {
        add => MLEX_BINARY_ADD,
        subtract => MLEX_BINARY_SUBTRACT,
        multiply => MLEX_BINARY_MULTIPLY,
        divide => MLEX_BINARY_DIVIDE,
        maximum => MLEX_BINARY_MAXIMUM,
        minimum => MLEX_BINARY_MINIMUM,
        power => MLEX_BINARY_POWER,
        equal => MLEX_BINARY_EQUAL,
        not_equal => MLEX_BINARY_NOT_EQUAL,
        less => MLEX_BINARY_LESS,
        less_equal => MLEX_BINARY_LESS_EQUAL,
        greater => MLEX_BINARY_GREATER,
        greater_equal => MLEX_BINARY_GREATER_EQUAL,
        logical_and => MLEX_BINARY_LOGICAL_AND,
        logical_or => MLEX_BINARY_LOGICAL_OR,
        /// Matrix product with NumPy broadcasting of batch axes.
        matmul => MLEX_BINARY_MATMUL,
        remainder => MLEX_BINARY_REMAINDER,
        /// Integer (floor) division.
        floor_divide => MLEX_BINARY_FLOOR_DIVIDE,
        /// log(exp(a) + exp(b)), computed stably (mlx `logaddexp`; `softplus(x)` is `logaddexp(x, 0)`).
        logaddexp => MLEX_BINARY_LOGADDEXP,
    }

    reduce! {
        sum => MLEX_REDUCE_SUM,
        mean => MLEX_REDUCE_MEAN,
        max => MLEX_REDUCE_MAX,
        min => MLEX_REDUCE_MIN,
        logsumexp => MLEX_REDUCE_LOGSUMEXP,
    }

    /// x · sigmoid(x)
    pub fn silu(&self) -> Result<Array> {
        self.multiply(&self.sigmoid()?)
    }

    pub fn astype(&self, dtype: Dtype) -> Result<Array> {
        if self.dtype() == dtype {
            return Ok(self.clone());
        }
        Array::try_from_op(|out| unsafe { sys::mlex_astype(self.raw(), dtype.to_sys(), out) })
    }

    /// `beta·c + alpha·(a @ b)` in one op (biased linear layers).
    pub fn addmm(c: &Array, a: &Array, b: &Array, alpha: f32, beta: f32) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_addmm(c.raw(), a.raw(), b.raw(), alpha, beta, out) })
    }

    /// 1-D convolution of `self` `[N, L, C_in]` with `weight` `[C_out, K, C_in / groups]`.
    pub fn conv1d(&self, weight: &Array, stride: i32, padding: i32, dilation: i32, groups: i32) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_conv1d(self.raw(), weight.raw(), stride, padding, dilation, groups, out) })
    }

    pub fn where_(cond: &Array, a: &Array, b: &Array) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_where(cond.raw(), a.raw(), b.raw(), out) })
    }

    pub fn argmax(&self, axis: i32, keepdims: bool) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_argmax(self.raw(), axis, keepdims, out) })
    }

    pub fn softmax(&self, axis: i32, precise: bool) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_softmax(self.raw(), axis, precise, out) })
    }

    pub fn cumsum(&self, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_cumsum(self.raw(), axis, reverse, inclusive, out) })
    }

    pub fn sort(&self, axis: i32) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_sort(self.raw(), axis, out) })
    }

    pub fn argsort(&self, axis: i32) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_argsort(self.raw(), axis, out) })
    }

    pub fn argpartition(&self, kth: i32, axis: i32) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_argpartition(self.raw(), kth, axis, out) })
    }

    pub fn reshape(&self, shape: &[i32]) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_reshape(self.raw(), shape.as_ptr(), shape.len(), out) })
    }

    pub fn transpose(&self, axes: &[i32]) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_transpose(self.raw(), axes.as_ptr(), axes.len(), out) })
    }

    pub fn swapaxes(&self, a: i32, b: i32) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_swapaxes(self.raw(), a, b, out) })
    }

    pub fn expand_dims(&self, axis: i32) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_expand_dims(self.raw(), axis, out) })
    }

    pub fn squeeze(&self, axis: i32) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_squeeze(self.raw(), axis, out) })
    }

    pub fn broadcast_to(&self, shape: &[i32]) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_broadcast_to(self.raw(), shape.as_ptr(), shape.len(), out) })
    }

    pub fn concatenate(arrays: &[&Array], axis: i32) -> Result<Array> {
        let raws: Vec<sys::mlex_array> = arrays.iter().map(|a| a.raw()).collect();
        Array::try_from_op(|out| unsafe { sys::mlex_concatenate(raws.as_ptr(), raws.len(), axis, out) })
    }

    /// Splits along `axis` at the given indices (n indices → n+1 parts).
    pub fn split_at(&self, indices: &[i32], axis: i32) -> Result<Vec<Array>> {
        let mut raws: Vec<sys::mlex_array> = vec![std::ptr::null_mut(); indices.len() + 1];
        check(unsafe {
            sys::mlex_split_sections(self.raw(), indices.as_ptr(), indices.len(), axis, raws.as_mut_ptr())
        })?;
        Ok(raws.into_iter().map(Array::from_raw).collect())
    }

    /// `a[start:stop:strides]` over every axis.
    pub fn slice(&self, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<Array> {
        Array::try_from_op(|out| unsafe {
            sys::mlex_slice(self.raw(), start.as_ptr(), stop.as_ptr(), strides.as_ptr(), start.len(), out)
        })
    }

    /// Slices `[start, stop)` of one axis, keeping the others whole.
    pub fn slice_axis(&self, axis: i32, start: i32, stop: i32) -> Result<Array> {
        let shape = self.shape();
        let ax = if axis < 0 { shape.len() as i32 + axis } else { axis } as usize;
        let mut lo = vec![0; shape.len()];
        let mut hi = shape.clone();
        lo[ax] = start;
        hi[ax] = stop;
        self.slice(&lo, &hi, &vec![1; shape.len()])
    }

    /// A copy of `self` with `[start, stop)` replaced by `update`.
    pub fn slice_update(&self, update: &Array, start: &[i32], stop: &[i32]) -> Result<Array> {
        let strides = vec![1; start.len()];
        Array::try_from_op(|out| unsafe {
            sys::mlex_slice_update(
                self.raw(),
                update.raw(),
                start.as_ptr(),
                stop.as_ptr(),
                strides.as_ptr(),
                start.len(),
                out,
            )
        })
    }

    pub fn take(&self, indices: &Array, axis: i32) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_take(self.raw(), indices.raw(), axis, out) })
    }

    pub fn take_along_axis(&self, indices: &Array, axis: i32) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_take_along_axis(self.raw(), indices.raw(), axis, out) })
    }

    /// For every index of `rhs_indices`, `self @ b[index]` (`b` `[E, K, N]`): mixture-of-experts
    /// products over dense experts. `sorted` promises ascending indices.
    pub fn gather_mm(&self, b: &Array, rhs_indices: &Array, sorted: bool) -> Result<Array> {
        Array::try_from_op(|out| unsafe {
            sys::mlex_gather_mm(self.raw(), b.raw(), std::ptr::null_mut(), rhs_indices.raw(), sorted, out)
        })
    }

    pub fn put_along_axis(&self, indices: &Array, values: &Array, axis: i32) -> Result<Array> {
        Array::try_from_op(|out| unsafe {
            sys::mlex_put_along_axis(self.raw(), indices.raw(), values.raw(), axis, out)
        })
    }

    /// Reinterprets the bytes as `dtype` (no conversion), reshaped to `shape`.
    pub fn view_as(&self, dtype: Dtype, shape: &[i32]) -> Result<Array> {
        let v = Array::try_from_op(|out| unsafe { sys::mlex_view(self.raw(), dtype.to_sys(), out) })?;
        v.reshape(shape)
    }

    pub fn contiguous(&self) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_contiguous(self.raw(), out) })
    }
}

/// Fused kernels of `mlx::core::fast`.
pub mod fast {
    use super::*;

    /// RMS normalisation over the last axis, times `weight` when given.
    pub fn rms_norm(x: &Array, weight: Option<&Array>, eps: f32) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_fast_rms_norm(x.raw(), raw_or_null(weight), eps, out) })
    }

    pub fn layer_norm(x: &Array, weight: Option<&Array>, bias: Option<&Array>, eps: f32) -> Result<Array> {
        Array::try_from_op(|out| unsafe {
            sys::mlex_fast_layer_norm(x.raw(), raw_or_null(weight), raw_or_null(bias), eps, out)
        })
    }

    /// Rotary embedding of the first `dims` features of the last axis, positions starting at
    /// `offset`. `freqs` (per-pair inverse frequencies, already scaled) replaces `base` when given.
    pub fn rope(
        x: &Array,
        dims: i32,
        traditional: bool,
        base: f32,
        scale: f32,
        offset: i32,
        freqs: Option<&Array>,
    ) -> Result<Array> {
        Array::try_from_op(|out| unsafe {
            sys::mlex_fast_rope(x.raw(), dims, traditional, base, scale, offset, raw_or_null(freqs), out)
        })
    }

    /// [`rope`] with each row of `x`'s leading (batch) axis at its own first position
    /// (`offsets` int32 `[B]`: a continuous batch's rows).
    pub fn rope_offsets(
        x: &Array,
        dims: i32,
        traditional: bool,
        base: f32,
        scale: f32,
        offsets: &Array,
        freqs: Option<&Array>,
    ) -> Result<Array> {
        Array::try_from_op(|out| unsafe {
            sys::mlex_fast_rope_offsets(x.raw(), dims, traditional, base, scale, offsets.raw(), raw_or_null(freqs), out)
        })
    }

    /// A decode step's q and k heads of the fused q/k/v product `qkv` (`[B, HQ + 2·HKV, 1, D]`)
    /// normalized per head (RMSNorm with `q_norm` / `k_norm`) and rotated as [`rope_offsets`]
    /// (`positions` int32 `[1]` or `[B]`), in one CUDA kernel: `(q [B, HQ, 1, D], k [B, HKV, 1, D])`,
    /// or None where that kernel does not apply (not CUDA, other dtypes or shapes).
    #[allow(clippy::too_many_arguments)]
    pub fn cuda_qk_norm_rope(
        qkv: &Array,
        heads: (i32, i32),
        q_norm: &Array,
        k_norm: &Array,
        eps: f32,
        traditional: bool,
        base: f32,
        scale: f32,
        freqs: Option<&Array>,
        positions: &Array,
    ) -> Result<Option<(Array, Array)>> {
        let (mut q, mut k) = (std::ptr::null_mut(), std::ptr::null_mut());
        crate::mlx::error::check(unsafe {
            sys::mlex_cuda_qk_norm_rope(
                qkv.raw(),
                heads.0,
                heads.1,
                q_norm.raw(),
                k_norm.raw(),
                eps,
                traditional,
                base,
                scale,
                raw_or_null(freqs),
                positions.raw(),
                &mut q,
                &mut k,
            )
        })?;
        if q.is_null() || k.is_null() {
            return Ok(None);
        }
        Ok(Some((Array::from_raw(q), Array::from_raw(k))))
    }

    /// q's and k's per-head norm weights and eps as the shim takes them (NULL, NULL: none).
    fn norm_args(qk_norm: Option<(&Array, &Array, f32)>) -> (sys::mlex_array, sys::mlex_array, f32) {
        match qk_norm {
            Some((q, k, eps)) => (q.raw(), k.raw(), eps),
            None => (std::ptr::null_mut(), std::ptr::null_mut(), 0.0),
        }
    }

    /// Where a decode step's token goes in a cache's buffers ([`cpu_decode_attention`]): the
    /// column, each row's rope position (int32 `[B]`; None: the column) and each row's first
    /// visible key (int32 `[B]`; None: the first).
    pub struct DecodeRows<'a> {
        pub column: usize,
        pub positions: Option<&'a Array>,
        pub key_start: Option<&'a Array>,
    }

    /// A decode step's attention on the CPU in one kernel of ours: `qkv` (`[B, 1, (HQ + 2·HKV)·D]`,
    /// the fused product) normalized per head (`qk_norm`: q's and k's weights and eps), rotated
    /// (`rope`: dims, traditional, base, scale, freqs) at each row's position, k and v written
    /// into the buffers `k_cache` / `v_cache` (`[B, HKV, C, D]`) at `rows.column`, and each row's
    /// query attending to its keys. Returns (output `[B, 1, HQ·D]`, the key buffer, the value
    /// buffer), or None where it does not apply (not the CPU, not float32): the caller runs the
    /// separate ops.
    #[allow(clippy::too_many_arguments)]
    pub fn cpu_decode_attention(
        qkv: &Array,
        k_cache: &Array,
        v_cache: &Array,
        rows: &DecodeRows,
        heads: (i32, i32),
        scale: f32,
        qk_norm: Option<(&Array, &Array, f32)>,
        rope: Option<(i32, bool, f32, f32, Option<&Array>)>,
    ) -> Result<Option<(Array, Array, Array)>> {
        let (mut o, mut k, mut v) = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
        let (qn, kn, eps) = norm_args(qk_norm);
        let (dims, traditional, base, rope_scale, freqs) = rope.unwrap_or((0, false, 0.0, 1.0, None));
        crate::mlx::error::check(unsafe {
            sys::mlex_cpu_decode_attention(
                qkv.raw(),
                k_cache.raw(),
                v_cache.raw(),
                rows.column as i32,
                raw_or_null(rows.positions),
                raw_or_null(rows.key_start),
                heads.0,
                heads.1,
                scale,
                qn,
                kn,
                eps,
                dims,
                traditional,
                base,
                rope_scale,
                raw_or_null(freqs),
                &mut o,
                &mut k,
                &mut v,
            )
        })?;
        if o.is_null() || k.is_null() || v.is_null() {
            return Ok(None);
        }
        Ok(Some((Array::from_raw(o), Array::from_raw(k), Array::from_raw(v))))
    }

    /// A decode step's q/k/v straight into a full-attention cache in one CUDA kernel of ours:
    /// `qkv` (`[B, HQ + 2·HKV, 1, D]`) normalized per head (`qk_norm`: q's and k's weights and
    /// eps), rotated (`rope`: traditional, base, scale, freqs; the whole head) at `positions`
    /// (int32 `[1]` or `[B]`), k and v written into column `at[0]` of `k_cache` / `v_cache`
    /// (`[B, HKV, at[1], D]`; `at` int32 `[2]`) IN PLACE (`qkv`: `[B, HQ + 2·HKV, 1, D]`, or the
    /// product as it comes, `[B, 1, (HQ + 2·HKV)·D]`). Returns q `[B, HQ, 1, D]`, or None
    /// where it does not apply (not CUDA, not 16-bit, other shapes). Buffers that are not row
    /// contiguous when the kernel runs fail its evaluation (a copy would take the writes).
    ///
    /// # Safety (not memory safety: MLX's value semantics)
    /// The caller owns the buffers: no other array may share them (a clone would see the write),
    /// and what reads the new column must depend on q. `nn::BatchKvCache` keeps to that.
    #[allow(clippy::too_many_arguments)]
    pub fn cuda_qkv_into_cache(
        qkv: &Array,
        heads: (i32, i32),
        qk_norm: Option<(&Array, &Array, f32)>,
        rope: (bool, f32, f32, Option<&Array>),
        positions: &Array,
        at: &Array,
        k_cache: &Array,
        v_cache: &Array,
    ) -> Result<Option<Array>> {
        let mut q = std::ptr::null_mut();
        let (qn, kn, eps) = norm_args(qk_norm);
        let (traditional, base, scale, freqs) = rope;
        crate::mlx::error::check(unsafe {
            sys::mlex_cuda_qkv_into_cache(
                qkv.raw(),
                heads.0,
                heads.1,
                qn,
                kn,
                eps,
                traditional,
                base,
                scale,
                raw_or_null(freqs),
                positions.raw(),
                at.raw(),
                k_cache.raw(),
                v_cache.raw(),
                &mut q,
            )
        })?;
        Ok((!q.is_null()).then(|| Array::from_raw(q)))
    }

    /// [`cuda_qkv_into_cache`]'s write and then the attention of each query over keys
    /// `0 ..= at[0]` (`attn_scale`: the softmax scale), in one CUDA kernel: the same bits as that
    /// write followed by [`cuda_short_attention`], as `[B, 1, HQ·D]`. None where it does not apply
    /// (also head sizes not a multiple of 32 or over 256). The same safety rules as
    /// [`cuda_qkv_into_cache`].
    #[allow(clippy::too_many_arguments)]
    pub fn cuda_decode_attention(
        qkv: &Array,
        heads: (i32, i32),
        qk_norm: Option<(&Array, &Array, f32)>,
        rope: (bool, f32, f32, Option<&Array>),
        positions: &Array,
        at: &Array,
        k_cache: &Array,
        v_cache: &Array,
        attn_scale: f32,
    ) -> Result<Option<Array>> {
        let mut out = std::ptr::null_mut();
        let (qn, kn, eps) = norm_args(qk_norm);
        let (traditional, base, scale, freqs) = rope;
        crate::mlx::error::check(unsafe {
            sys::mlex_cuda_decode_attention(
                qkv.raw(),
                heads.0,
                heads.1,
                qn,
                kn,
                eps,
                traditional,
                base,
                scale,
                raw_or_null(freqs),
                positions.raw(),
                at.raw(),
                k_cache.raw(),
                v_cache.raw(),
                attn_scale,
                &mut out,
            )
        })?;
        Ok((!out.is_null()).then(|| Array::from_raw(out)))
    }

    /// A short pass's attention over a cache's whole buffers `k`, `v` (`[B, HKV, C, D]`): query
    /// l of `q` (`[B, HQ, L, D]`) sees keys `0 ..= prev + l`, in one CUDA kernel of ours; None
    /// where it does not apply (not CUDA, other shapes): the caller masks instead. `token_major`:
    /// `q` is a `[B, HQ, L, D]` transposed view of `[B, L, HQ, D]` memory (a pass built as decode
    /// rows), read in place; the result is then such a view too. `flat` (one query, not
    /// token-major): the result is `[B, 1, HQ·D]`, as the output projection takes it.
    pub fn cuda_short_attention(q: &Array, k: &Array, v: &Array, scale: f32, prev: usize, token_major: bool, flat: bool) -> Result<Option<Array>> {
        let mut out = std::ptr::null_mut();
        crate::mlx::error::check(unsafe {
            sys::mlex_cuda_short_attention(q.raw(), k.raw(), v.raw(), scale, prev as i32, token_major, flat, &mut out)
        })?;
        Ok((!out.is_null()).then(|| Array::from_raw(out)))
    }

    /// [`scaled_dot_product_attention`] over a left-padded batch: row b's queries see no key
    /// before `key_start[b]` (int32 `[B]`); `causal` as the causal mode on top of it.
    pub fn scaled_dot_product_attention_padded(
        q: &Array,
        k: &Array,
        v: &Array,
        scale: f32,
        causal: bool,
        key_start: &Array,
    ) -> Result<Array> {
        Array::try_from_op(|out| unsafe {
            sys::mlex_fast_sdpa_padded(q.raw(), k.raw(), v.raw(), scale, causal, key_start.raw(), out)
        })
    }

    /// The gated delta rule recurrence through mlex's CPU kernel (`src/mlx/gated_delta.h`):
    /// q, k `[B, T, Hk, Dk]`, v `[B, T, Hv, Dv]`, g, beta `[B, T, Hv]`, state `[B, Hv, Dv, Dk]`
    /// float32 → (y `[B, T, Hv, Dv]` in q's dtype, the new state). `None` where it does not apply
    /// (not the CPU, other shapes): `nn::gated_delta` then runs the reference graph.
    pub fn gated_delta(
        q: &Array,
        k: &Array,
        v: &Array,
        g: &Array,
        beta: &Array,
        state: &Array,
    ) -> Result<Option<(Array, Array)>> {
        let (mut y, mut s): (sys::mlex_array, sys::mlex_array) = (std::ptr::null_mut(), std::ptr::null_mut());
        check(unsafe {
            sys::mlex_gated_delta(q.raw(), k.raw(), v.raw(), g.raw(), beta.raw(), state.raw(), &mut y, &mut s)
        })?;
        if y.is_null() || s.is_null() {
            return Ok(None);
        }
        Ok(Some((Array::from_raw(y), Array::from_raw(s))))
    }

    /// All of mlx-lm's `gated_delta_update` (q/k normalisation, gates, recurrence) through mlex's
    /// CUDA kernel: q, k as the conv gives them, a, b `[B, T, Hv]`, a_log, dt_bias `[Hv]`. `None`
    /// where it does not apply (not CUDA, other shapes or dtypes).
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
    ) -> Result<Option<(Array, Array)>> {
        let (mut y, mut s): (sys::mlex_array, sys::mlex_array) = (std::ptr::null_mut(), std::ptr::null_mut());
        check(unsafe {
            sys::mlex_gated_delta_update(
                q.raw(), k.raw(), v.raw(), a.raw(), b.raw(), a_log.raw(), dt_bias.raw(), state.raw(), &mut y, &mut s,
            )
        })?;
        if y.is_null() || s.is_null() {
            return Ok(None);
        }
        Ok(Some((Array::from_raw(y), Array::from_raw(s))))
    }

    /// The attention mask of [`scaled_dot_product_attention`].
    pub enum AttentionMask<'a> {
        None,
        Causal,
        Array(&'a Array),
    }

    /// softmax(q·kᵀ·scale + mask)·v with grouped-query broadcasting; q `[B, Hq, L, D]`, k/v `[B, Hkv, S, D]`.
    pub fn scaled_dot_product_attention(
        q: &Array,
        k: &Array,
        v: &Array,
        scale: f32,
        mask: AttentionMask<'_>,
    ) -> Result<Array> {
        let (mode, arr): (&[u8], Option<&Array>) = match mask {
            AttentionMask::None => (b"\0", None),
            AttentionMask::Causal => (b"causal\0", None),
            AttentionMask::Array(a) => (b"\0", Some(a)),
        };
        Array::try_from_op(|out| unsafe {
            sys::mlex_fast_sdpa(q.raw(), k.raw(), v.raw(), scale, mode.as_ptr().cast(), raw_or_null(arr), out)
        })
    }

    /// [`scaled_dot_product_attention`] with a learned per-head sink logit (`sinks` `[Hq]`) that
    /// joins every softmax without a value (gpt-oss).
    pub fn scaled_dot_product_attention_sinks(
        q: &Array,
        k: &Array,
        v: &Array,
        scale: f32,
        mask: AttentionMask<'_>,
        sinks: &Array,
    ) -> Result<Array> {
        let (mode, arr): (&[u8], Option<&Array>) = match mask {
            AttentionMask::None => (b"\0", None),
            AttentionMask::Causal => (b"causal\0", None),
            AttentionMask::Array(a) => (b"\0", Some(a)),
        };
        Array::try_from_op(|out| unsafe {
            sys::mlex_fast_sdpa_sinks(q.raw(), k.raw(), v.raw(), scale, mode.as_ptr().cast(), raw_or_null(arr), sinks.raw(), out)
        })
    }

    /// silu(gate) · up, one compiled kernel.
    pub fn swiglu(gate: &Array, up: &Array) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_compiled_swiglu(gate.raw(), up.raw(), out) })
    }

    /// silu(gate) · x computed in float32, in `like`'s dtype (mlx-lm's `precise_swiglu`), one
    /// compiled kernel.
    pub fn precise_swiglu(like: &Array, gate: &Array, x: &Array) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_compiled_precise_swiglu(like.raw(), gate.raw(), x.raw(), out) })
    }

    /// gelu_tanh(gate) · up, one compiled kernel.
    pub fn geglu(gate: &Array, up: &Array) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_compiled_geglu(gate.raw(), up.raw(), out) })
    }

    /// MLX's `nn.gelu_approx` (`0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`), one compiled kernel
    /// (mlx-lm's and mlx-vlm's `nn.GELU(approx="precise")` is the same compiled function).
    pub fn gelu_approx(x: &Array) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_compiled_gelu_approx(x.raw(), out) })
    }
}
