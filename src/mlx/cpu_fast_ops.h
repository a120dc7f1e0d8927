// Our own CPU implementations of three of MLX's `fast` ops: RMSNorm, RoPE and attention (and of
// swiglu, which MLX would JIT-compile). MLX's CPU backend has no kernels for the three: it expands
// each into its reference graph of generic ops (~8 for RMSNorm, ~20 for RoPE, ~10 for attention): on a decode
// step those ops' dispatch costs more than their arithmetic, and attention's matmuls go to the
// wheel's slow reference BLAS (BENCHMARKS.md, CPU section).
// Each is one MLX primitive computing what that reference graph computes, in float32.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "mlx/mlx.h"

namespace mlex {

// Each returns the result as a lazy array, or nothing when it does not cover the case (not on the
// CPU, not float32, a shape it does not handle): the caller then uses MLX's op.

std::optional<mlx::core::array> cpu_rms_norm(const mlx::core::array& x, const std::optional<mlx::core::array>& weight,
                                             float eps);

// One row of cpu_rms_norm: `d` elements of x `stride` apart, w (may be null) `w_stride` apart,
// into `out`. The one definition both that op and the quantized matmul's folded norm run, so
// their results are the same bits.
void rms_norm_row(const float* x, int64_t stride, int64_t d, const float* w, int64_t w_stride, float eps, float* out);

// The pieces of cpu_rope and cpu_attention that the decode-step kernel (cpu_decode_attention.h)
// runs too, so that its results are the same bits as theirs.
// Per-pair inverse frequencies: exp(-i·ln(base)/half), or 1/freqs[i·freq_stride] where freqs is given.
void rope_inv_freqs(int half, float base, const float* freqs, int64_t freq_stride, float* inv);
// cos and sin of (l + offset)·scale·inv[i], i < half: the angles of position offset + l.
void rope_angles(float l, int64_t offset, float scale, const float* inv, int half, float* c, float* s);
// One row of `d` features of x (`xs` apart) rotated by those angles into `out` (contiguous): the
// first `dims` features in pairs (i, i + dims/2), or (2i, 2i+1) when `traditional`.
void rope_row(const float* x, int64_t xs, int64_t d, int dims, bool traditional, const float* c, const float* s,
              float* out);
// One query row: softmax(q·kᵀ)·v over `seen` keys, q already scaled (D contiguous floats); keys
// `kstride` apart with elements `kin` apart (values alike); D floats into `out`.
void attend_row(const float* q, const float* kb, int64_t kstride, int64_t kin, const float* vb, int64_t vstride,
                int64_t vin, int64_t seen, int64_t D, float* out);
// row(0) … row(rows − 1), spread over the thread pool where rows × keys_by_width (multiply-adds
// per row) is worth a wake-up of the workers.
void attend_rows(int64_t rows, int64_t keys_by_width, const std::function<void(int64_t)>& row);

// Whether cpu_rms_norm is switched off (the benchmark ablation MLEX_ABLATE_CPU_FAST_OPS).
bool cpu_fast_ops_ablated();

// `freqs` (per-pair wavelength divisors) replaces `base` when given, as in mx::fast::rope;
// `offsets` (`[B]`) replaces `offset` per row of the batch when given (continuous batching).
std::optional<mlx::core::array> cpu_rope(const mlx::core::array& x, int dims, bool traditional, float base, float scale,
                                         int offset, const std::optional<mlx::core::array>& freqs,
                                         const std::optional<mlx::core::array>& offsets = std::nullopt);

// softmax(q·kᵀ·scale)·v for q `[B, Hq, L, D]` and k/v `[B, Hkv, S, D]` (Hq a multiple of Hkv,
// L <= S), without a mask or with MLX's causal one (the queries are the last L positions);
// `key_start` (`[B]`) hides each batch row's first keys (a left-padded batch).
std::optional<mlx::core::array> cpu_attention(const mlx::core::array& q, const mlx::core::array& k,
                                              const mlx::core::array& v, float scale, bool causal,
                                              const std::optional<mlx::core::array>& key_start = std::nullopt);

// silu(gate) · up for float32 `gate` and `up` of one shape (views read in place), bit for bit what
// MLX's compiled kernel for `gate · sigmoid(gate) · up` gives, without its JIT (see the .cpp).
std::optional<mlx::core::array> cpu_swiglu(const mlx::core::array& gate, const mlx::core::array& up);

// One row of cpu_swiglu: o[i] = silu(g[i]) · u[i] for contiguous rows, the same bits.
void swiglu_row(const float* g, const float* u, float* o, int64_t n);

// log Σ exp(x) over the last axis of float32 x, bit for bit MLX's CPU result (see the .cpp): the
// sampler's normalizer over the vocabulary.
std::optional<mlx::core::array> cpu_logsumexp_last(const mlx::core::array& x, bool keepdims);

}  // namespace mlex
