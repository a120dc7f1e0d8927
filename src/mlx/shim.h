/* mlex's flat C ABI over MLX's C++ API (see shim.cpp).
 *
 * Conventions (DESIGN.md §8.4):
 * - every entry returns an int status: 0 on success, non-zero on failure, and never throws;
 *   on failure mlex_last_error() holds MLX's message for the calling thread;
 * - results come back through out-parameters; arrays are opaque heap handles freed with
 *   mlex_array_free (the Rust side wraps each one in an RAII type);
 * - every op runs on the calling thread's default stream of the default device.
 */
#ifndef MLEX_SHIM_H
#define MLEX_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mlex_array_s* mlex_array;

/* Same order as mlx::core::Dtype::Val. */
typedef enum {
  MLEX_BOOL = 0,
  MLEX_UINT8,
  MLEX_UINT16,
  MLEX_UINT32,
  MLEX_UINT64,
  MLEX_INT8,
  MLEX_INT16,
  MLEX_INT32,
  MLEX_INT64,
  MLEX_FLOAT16,
  MLEX_FLOAT32,
  MLEX_FLOAT64,
  MLEX_BFLOAT16,
  MLEX_COMPLEX64,
} mlex_dtype;

typedef enum { MLEX_DEVICE_CPU = 0, MLEX_DEVICE_GPU = 1 } mlex_device;

/* Called once MLX no longer needs memory handed over by mlex_array_from_data. */
typedef void (*mlex_release_fn)(void* ctx);

const char* mlex_last_error(void);
const char* mlex_version(void);

/* ---- lifetime and inspection ---- */
void mlex_array_free(mlex_array a);
int mlex_array_clone(mlex_array a, mlex_array* out);
int mlex_array_ndim(mlex_array a, size_t* out);
int mlex_array_shape(mlex_array a, int32_t* out, size_t cap);
int mlex_array_dtype(mlex_array a, mlex_dtype* out);
int mlex_array_size(mlex_array a, size_t* out);
int mlex_array_nbytes(mlex_array a, size_t* out);
/* Evaluates `a`, converts to `dtype` and copies `nbytes` bytes (must equal size*itemsize) into dst. */
int mlex_array_read(mlex_array a, mlex_dtype dtype, void* dst, size_t nbytes);

/* ---- construction ---- */
/* Wraps `data` without copying where MLX can (CPU); `release(ctx)` runs once MLX is done with it. */
int mlex_array_from_data(void* data, const int32_t* shape, size_t ndim, mlex_dtype dtype,
                         mlex_release_fn release, void* ctx, mlex_array* out);
/* Copies `data` into a new array. */
int mlex_array_from_copy(const void* data, const int32_t* shape, size_t ndim, mlex_dtype dtype,
                         mlex_array* out);
int mlex_array_scalar_f32(float v, mlex_dtype dtype, mlex_array* out);
int mlex_array_scalar_i32(int32_t v, mlex_dtype dtype, mlex_array* out);
int mlex_zeros(const int32_t* shape, size_t ndim, mlex_dtype dtype, mlex_array* out);
int mlex_ones(const int32_t* shape, size_t ndim, mlex_dtype dtype, mlex_array* out);
int mlex_full(const int32_t* shape, size_t ndim, float v, mlex_dtype dtype, mlex_array* out);
int mlex_arange(double start, double stop, double step, mlex_dtype dtype, mlex_array* out);

/* ---- evaluation, devices, memory ---- */
int mlex_eval(const mlex_array* arrays, size_t n);
int mlex_async_eval(const mlex_array* arrays, size_t n);
/* Unevaluated operations behind `arrays`, as "name count" lines; *out is valid until the next call on this thread. */
int mlex_graph_census(const mlex_array* arrays, size_t n, const char** out);
int mlex_synchronize(void);
int mlex_set_default_device(mlex_device d);
int mlex_default_device(mlex_device* out);
int mlex_gpu_available(bool* out);
int mlex_memory_active(size_t* out);
int mlex_memory_peak(size_t* out);
int mlex_memory_cache(size_t* out);
int mlex_memory_reset_peak(void);
/* MLX's memory limit (bytes): allocations beyond it fail. */
int mlex_memory_limit(size_t* out);
int mlex_memory_clear_cache(void);
int mlex_set_memory_limit(size_t limit, size_t* previous);
int mlex_set_cache_limit(size_t limit, size_t* previous);
int mlex_set_wired_limit(size_t limit, size_t* previous);

/* ---- element-wise ---- */
typedef enum {
  MLEX_UNARY_NEGATIVE = 0,
  MLEX_UNARY_EXP,
  MLEX_UNARY_LOG,
  MLEX_UNARY_SQRT,
  MLEX_UNARY_RSQRT,
  MLEX_UNARY_SQUARE,
  MLEX_UNARY_ABS,
  MLEX_UNARY_SIGMOID,
  MLEX_UNARY_TANH,
  MLEX_UNARY_ERF,
  MLEX_UNARY_SIN,
  MLEX_UNARY_COS,
  MLEX_UNARY_LOGICAL_NOT,
  MLEX_UNARY_STOP_GRADIENT,
  MLEX_UNARY_COPY,
  MLEX_UNARY_FLOOR,
  MLEX_UNARY_ISNAN,
} mlex_unary_op;

typedef enum {
  MLEX_BINARY_ADD = 0,
  MLEX_BINARY_SUBTRACT,
  MLEX_BINARY_MULTIPLY,
  MLEX_BINARY_DIVIDE,
  MLEX_BINARY_MAXIMUM,
  MLEX_BINARY_MINIMUM,
  MLEX_BINARY_POWER,
  MLEX_BINARY_EQUAL,
  MLEX_BINARY_NOT_EQUAL,
  MLEX_BINARY_LESS,
  MLEX_BINARY_LESS_EQUAL,
  MLEX_BINARY_GREATER,
  MLEX_BINARY_GREATER_EQUAL,
  MLEX_BINARY_LOGICAL_AND,
  MLEX_BINARY_LOGICAL_OR,
  MLEX_BINARY_MATMUL,
  MLEX_BINARY_REMAINDER,
  MLEX_BINARY_FLOOR_DIVIDE,
  MLEX_BINARY_LOGADDEXP,
} mlex_binary_op;

int mlex_unary(mlex_unary_op op, mlex_array a, mlex_array* out);
int mlex_binary(mlex_binary_op op, mlex_array a, mlex_array b, mlex_array* out);
int mlex_where(mlex_array cond, mlex_array a, mlex_array b, mlex_array* out);
/* 1-D convolution: input [N, L, C_in], weight [C_out, K, C_in / groups] (MLX layout). */
int mlex_conv1d(mlex_array input, mlex_array weight, int stride, int padding, int dilation, int groups, mlex_array* out);
int mlex_astype(mlex_array a, mlex_dtype dtype, mlex_array* out);
/* c + alpha * (a @ b) * beta-free form of addmm used by biased linears: out = c + a @ b */
int mlex_addmm(mlex_array c, mlex_array a, mlex_array b, float alpha, float beta, mlex_array* out);

/* ---- reductions (axes == NULL / n_axes == 0 reduces everything) ---- */
typedef enum {
  MLEX_REDUCE_SUM = 0,
  MLEX_REDUCE_MEAN,
  MLEX_REDUCE_MAX,
  MLEX_REDUCE_MIN,
  MLEX_REDUCE_LOGSUMEXP,
} mlex_reduce_op;
int mlex_reduce(mlex_reduce_op op, mlex_array a, const int32_t* axes, size_t n_axes, bool keepdims,
                mlex_array* out);
int mlex_argmax(mlex_array a, int32_t axis, bool keepdims, mlex_array* out);
int mlex_softmax(mlex_array a, int32_t axis, bool precise, mlex_array* out);
int mlex_cumsum(mlex_array a, int32_t axis, bool reverse, bool inclusive, mlex_array* out);
int mlex_sort(mlex_array a, int32_t axis, mlex_array* out);
int mlex_argsort(mlex_array a, int32_t axis, mlex_array* out);
/* Indices such that element kth is in sorted position (smaller ones before it). */
int mlex_argpartition(mlex_array a, int32_t kth, int32_t axis, mlex_array* out);

/* ---- shapes and indexing ---- */
int mlex_reshape(mlex_array a, const int32_t* shape, size_t ndim, mlex_array* out);
int mlex_transpose(mlex_array a, const int32_t* axes, size_t n, mlex_array* out);
int mlex_swapaxes(mlex_array a, int32_t axis1, int32_t axis2, mlex_array* out);
int mlex_expand_dims(mlex_array a, int32_t axis, mlex_array* out);
int mlex_squeeze(mlex_array a, int32_t axis, mlex_array* out);
int mlex_broadcast_to(mlex_array a, const int32_t* shape, size_t ndim, mlex_array* out);
int mlex_concatenate(const mlex_array* arrays, size_t n, int32_t axis, mlex_array* out);
int mlex_split_sections(mlex_array a, const int32_t* indices, size_t n_indices, int32_t axis,
                        mlex_array* outs /* n_indices + 1 */);
int mlex_slice(mlex_array a, const int32_t* start, const int32_t* stop, const int32_t* strides,
               size_t ndim, mlex_array* out);
int mlex_slice_update(mlex_array a, mlex_array update, const int32_t* start, const int32_t* stop,
                      const int32_t* strides, size_t ndim, mlex_array* out);
int mlex_take(mlex_array a, mlex_array indices, int32_t axis, mlex_array* out);
int mlex_take_along_axis(mlex_array a, mlex_array indices, int32_t axis, mlex_array* out);
int mlex_put_along_axis(mlex_array a, mlex_array indices, mlex_array values, int32_t axis,
                        mlex_array* out);
int mlex_contiguous(mlex_array a, mlex_array* out);
/* Reinterprets the bytes as another dtype (the last axis scales by the size ratio). */
int mlex_view(mlex_array a, mlex_dtype dtype, mlex_array* out);

/* ---- fast (fused) ops ---- */
/* weight may be NULL */
int mlex_fast_rms_norm(mlex_array x, mlex_array weight, float eps, mlex_array* out);
int mlex_fast_layer_norm(mlex_array x, mlex_array weight, mlex_array bias, float eps, mlex_array* out);
/* base is used when freqs is NULL; freqs (per-dimension frequencies) replaces it otherwise. */
int mlex_fast_rope(mlex_array x, int32_t dims, bool traditional, float base, float scale, int32_t offset,
                   mlex_array freqs, mlex_array* out);
/* A qwen3-style decode step's q/k heads normalized (q_norm, k_norm: RMSNorm per head) and
   rotated (as mlex_fast_rope; freqs may be NULL), in one CUDA kernel: qkv [B, HQ + 2·HKV, 1, D]
   (the fused product's heads), positions int32 [1] or [B]. Writes q [B, HQ, 1, D] and
   k [B, HKV, 1, D]; where the kernel does not apply (not CUDA, other dtypes or shapes) both are
   set to NULL and the caller runs the separate ops. */
int mlex_cuda_qk_norm_rope(mlex_array qkv, int32_t n_q_heads, int32_t n_kv_heads, mlex_array q_norm,
                           mlex_array k_norm, float eps, bool traditional, float base, float scale, mlex_array freqs,
                           mlex_array positions, mlex_array* out_q, mlex_array* out_k);
/* A decode step's attention on the CPU in one kernel (src/mlx/cpu_decode_attention.h): qkv
   [B, 1, (HQ + 2·HKV)·D] (the fused product), k_cache/v_cache [B, HKV, C, D] holding `offset`
   columns. q and k normalized per head (q_norm/k_norm, both or neither may be NULL) and rotated
   as mlex_fast_rope (rope_dims 0: not rotated; freqs may be NULL) at `offset`, or at positions[b]
   (int32 [B], may be NULL) for row b; the token's key and value written into the buffers at
   column `offset`; then row b's query attends to columns key_start[b] (int32 [B]; NULL: 0) ..=
   offset. Sets *out
   [B, 1, HQ·D] and *out_k / *out_v (the buffers after the write), or leaves all three NULL where
   the kernel does not apply (the caller runs the separate ops). */
int mlex_cpu_decode_attention(mlex_array qkv, mlex_array k_cache, mlex_array v_cache, int32_t offset,
                              mlex_array positions, mlex_array key_start, int32_t n_q_heads, int32_t n_kv_heads, float scale, mlex_array q_norm,
                              mlex_array k_norm, float eps, int32_t rope_dims, bool traditional, float base,
                              float rope_scale, mlex_array freqs, mlex_array* out, mlex_array* out_k,
                              mlex_array* out_v);
/* A decode step's q/k/v straight into a full-attention cache in one CUDA kernel
   (src/mlx/cuda_qk_norm_rope.h): qkv [B, HQ + 2·HKV, 1, D] (or the product as it comes,
   [B, 1, (HQ + 2·HKV)·D]); q_norm/k_norm both or neither NULL;
   rotated as mlex_fast_rope (the whole head; freqs may be NULL) at positions (int32 [1] or [B]);
   k and v written IN PLACE into column at[0] of k_cache/v_cache [B, HKV, at[1], D] (at: int32
   [2]; evaluated buffers the caller owns). Sets *out_q [B, HQ, 1, D], or leaves it NULL where the
   kernel does not apply (the caller runs the separate ops). */
int mlex_cuda_qkv_into_cache(mlex_array qkv, int32_t n_q_heads, int32_t n_kv_heads, mlex_array q_norm,
                             mlex_array k_norm, float eps, bool traditional, float base, float scale,
                             mlex_array freqs, mlex_array positions, mlex_array at, mlex_array k_cache,
                             mlex_array v_cache, mlex_array* out_q);
/* The same write and then the attention of each query over keys 0 ..= at[0], in one CUDA kernel
   (src/mlx/cuda_qk_norm_rope.h: cuda_decode_attention; attn_scale: the softmax scale). Sets
   *out [B, 1, HQ·D], or leaves it NULL where the kernel does not apply. */
int mlex_cuda_decode_attention(mlex_array qkv, int32_t n_q_heads, int32_t n_kv_heads, mlex_array q_norm,
                               mlex_array k_norm, float eps, bool traditional, float base, float scale,
                               mlex_array freqs, mlex_array positions, mlex_array at, mlex_array k_cache,
                               mlex_array v_cache, float attn_scale, mlex_array* out);
/* As mlex_fast_rope with each row of x's leading (batch) axis at its own position: offsets [B]
   int32 (continuous batching). */
int mlex_fast_rope_offsets(mlex_array x, int32_t dims, bool traditional, float base, float scale, mlex_array offsets,
                           mlex_array freqs, mlex_array* out);
/* As mlex_fast_sdpa over a left-padded batch: batch row b's queries see no key before
   key_start[b] ([B] int32); causal as mlex_fast_sdpa's "causal" mode on top of it. */
int mlex_fast_sdpa_padded(mlex_array q, mlex_array k, mlex_array v, float scale, bool causal, mlex_array key_start,
                          mlex_array* out);
/* A short pass's attention on CUDA (src/mlx/cuda_short_attention.h): q [B, HQ, L, D] over the
   whole key/value buffers k, v [B, HKV, C, D], query l seeing keys 0 ..= prev + l, in one kernel
   of ours (token_major: q is a transposed view of [B, L, HQ, D] memory, and *out is then one too;
   flat, one query: *out is [B, 1, HQ·D]). Sets *out, or leaves it NULL where the kernel does not
   apply (the caller masks). */
int mlex_cuda_short_attention(mlex_array q, mlex_array k, mlex_array v, float scale, int32_t prev, bool token_major,
                              bool flat, mlex_array* out);
/* Moves the managed-memory buffers of the (evaluated) arrays into CUDA device memory and waits
   (src/mlx/cuda_launch.h: prefetch_to_device); *bytes: how many bytes moved, 0 without CUDA. */
int mlex_cuda_prefetch(const mlex_array* arrays, size_t n, uint64_t* bytes);
/* mask_mode: "" (none, or mask given), "causal"; mask may be NULL. */
int mlex_fast_sdpa(mlex_array q, mlex_array k, mlex_array v, float scale, const char* mask_mode,
                   mlex_array mask, mlex_array* out);
/* The gated delta rule recurrence (src/mlx/gated_delta.h) through our CPU or CUDA kernel: q, k
   [B, T, Hk, Dk], v [B, T, Hv, Dv], g, beta [B, T, Hv], state [B, Hv, Dv, Dk] float32. Sets *y
   and *state_out, or leaves both NULL when no kernel of ours covers the case. */
int mlex_gated_delta(mlex_array q, mlex_array k, mlex_array v, mlex_array g, mlex_array beta, mlex_array state,
                     mlex_array* y, mlex_array* state_out);
/* All of mlx-lm's gated_delta_update (q/k normalisation, gates, recurrence) in our CUDA kernel:
   q, k raw [B, T, Hk, Dk], a, b [B, T, Hv], a_log, dt_bias [Hv]. NULLs where it does not apply. */
int mlex_gated_delta_update(mlex_array q, mlex_array k, mlex_array v, mlex_array a, mlex_array b, mlex_array a_log,
                            mlex_array dt_bias, mlex_array state, mlex_array* y, mlex_array* state_out);
/* As mlex_fast_sdpa with per-head attention sinks (`sinks` [Hq], NULL for none: gpt-oss). */
int mlex_fast_sdpa_sinks(mlex_array q, mlex_array k, mlex_array v, float scale, const char* mask_mode,
                         mlex_array mask, mlex_array sinks, mlex_array* out);

/* ---- quantization (mode: "affine", "mxfp4", "mxfp8", "nvfp4") ---- */
/* outs receives 2 (no biases: mx* / nv modes) or 3 arrays; n_out tells how many were written. */
int mlex_quantize(mlex_array w, int32_t group_size, int32_t bits, const char* mode, mlex_array* outs,
                  size_t* n_out);
/* biases may be NULL; out_dtype < 0 keeps MLX's default. */
int mlex_dequantize(mlex_array w, mlex_array scales, mlex_array biases, int32_t group_size, int32_t bits,
                    const char* mode, int32_t out_dtype, mlex_array* out);
int mlex_quantized_matmul(mlex_array x, mlex_array w, mlex_array scales, mlex_array biases, bool transpose,
                          int32_t group_size, int32_t bits, const char* mode, mlex_array* out);
/* x @ dequantize(w)ᵀ with the ops around it in a decode step, in one kernel where our CUDA
   matrix-vector kernel applies (else as separate ops): norm_weight (may be NULL): the product
   is of rms_norm(x, norm_weight, eps); epilogue 0: the product; 1: residual + product; 2:
   silu(g) * u of the product's halves [g, u] (a fused gate/up projection). residual is NULL
   unless epilogue is 1. The epilogues give the separate ops' result bit for bit; the norm
   sums x² in another order than MLX's RMSNorm, so it may differ in the last bit. */
int mlex_quantized_matmul_fused(mlex_array x, mlex_array norm_weight, float eps, mlex_array w, mlex_array scales,
                                mlex_array biases, int32_t group_size, int32_t bits, const char* mode,
                                int32_t epilogue, mlex_array residual, mlex_array* out);

/* Mixture-of-experts products: for each index in rhs_indices, x @ w[index] (w [E, …]).
   lhs_indices may be NULL; sorted_indices promises rhs_indices ascending (prefill). */
int mlex_gather_mm(mlex_array a, mlex_array b, mlex_array lhs_indices, mlex_array rhs_indices,
                   bool sorted_indices, mlex_array* out);
int mlex_gather_qmm(mlex_array x, mlex_array w, mlex_array scales, mlex_array biases, mlex_array lhs_indices,
                    mlex_array rhs_indices, bool transpose, int32_t group_size, int32_t bits, const char* mode,
                    bool sorted_indices, mlex_array* out);

/* ---- random ---- */
int mlex_random_key(uint64_t seed, mlex_array* out);
int mlex_random_split(mlex_array key, mlex_array* out_a, mlex_array* out_b);
/* Normal(0, scale) samples of `shape`. */
int mlex_random_normal(const int32_t* shape, size_t ndim, mlex_dtype dtype, float scale, mlex_array key,
                       mlex_array* out);
/* Samples indices from unnormalised log-probabilities along `axis`. */
int mlex_random_categorical(mlex_array logits, int32_t axis, mlex_array key, mlex_array* out);

/* ---- benchmark ablations (src/ablation.rs): which of our kernels are switched off ---- */
#define MLEX_ABLATE_KERNEL_CPU_QMM 1u
#define MLEX_ABLATE_KERNEL_CPU_FAST_OPS 2u
#define MLEX_ABLATE_KERNEL_CUDA_QMV 4u
#define MLEX_ABLATE_KERNEL_GATED_DELTA 8u
#define MLEX_ABLATE_KERNEL_CUDA_EPILOGUE 16u
#define MLEX_ABLATE_KERNEL_CPU_GEMM 32u
#define MLEX_ABLATE_KERNEL_CUDA_NORM_FOLD 64u
#define MLEX_ABLATE_KERNEL_CUDA_QK_ROPE 128u
#define MLEX_ABLATE_KERNEL_CPU_NORM_FOLD 256u
#define MLEX_ABLATE_KERNEL_CUDA_SHORT_ATTN 512u
#define MLEX_ABLATE_KERNEL_CUDA_DEVICE_ALLOC 1024u
#define MLEX_ABLATE_KERNEL_CPU_EPILOGUE 2048u
#define MLEX_ABLATE_KERNEL_CPU_DECODE_ATTN 4096u
#define MLEX_ABLATE_KERNEL_CUDA_KV_WRITE 8192u
#define MLEX_ABLATE_KERNEL_CPU_PACK_Q4 16384u
#define MLEX_ABLATE_KERNEL_CUDA_FUSED_ATTN 32768u
#define MLEX_ABLATE_KERNEL_CPU_DENSE_ROWS 65536u
void mlex_set_ablations(uint32_t kernels);

/* ---- 8-bit activations on the CPU (LoadOptions::int8_activations; cpu_matvec_vnni.h) ---- */
/* Whether the quantized products this thread builds from now on round activations to 8 bits. */
void mlex_set_cpu_int8_activations(int on);
/* Whether this CPU runs them (AVX-512 VNNI): 1 or 0. */
int mlex_cpu_int8_activations_supported(void);

/* ---- compile: fused element-wise helpers used by the models ---- */
/* silu(gate) * up, compiled once per process (shapeless) so elementwise chains fuse. */
int mlex_compiled_swiglu(mlex_array gate, mlex_array up, mlex_array* out);
/* gelu_approx(gate) * up (tanh approximation), compiled likewise. */
int mlex_compiled_geglu(mlex_array gate, mlex_array up, mlex_array* out);
/* MLX's nn.gelu_approx (tanh form) as one compiled kernel (a vision tower's MLP on the GPU). */
int mlex_compiled_gelu_approx(mlex_array x, mlex_array* out);
/* (silu(float32(gate)) * float32(x)) in like's dtype (mlx-lm's precise_swiglu), compiled likewise. */
int mlex_compiled_precise_swiglu(mlex_array like, mlex_array gate, mlex_array x, mlex_array* out);

/* ---- io ---- */
int mlex_save_safetensors(const char* path, const char* const* names, const mlex_array* arrays, size_t n);

#ifdef __cplusplus
}
#endif
#endif
