// One CUDA kernel for what a decode step does to q, k and v between the q/k/v product and
// attention: each head's RMSNorm (q_norm, k_norm, qwen3-style) then the rotary embedding, for q
// and k; and, for a full-attention cache, the writes of k and v into it. MLX runs that as up to
// six kernels (two RMSNorms, two RoPEs, two SliceUpdates); on the H200 a decode step is bound by
// the host's cost per kernel launch (BENCHMARKS.md), so each launch saved per layer is decode
// speed.
#pragma once

#include <optional>
#include <tuple>
#include <utility>

#include "mlx/mlx.h"

namespace mlex {

// What the rope does (MLX's fast::rope arguments; the rope rotates the whole head).
struct RopeArgs {
  bool traditional;
  float base;
  float scale;
  std::optional<mlx::core::array> freqs;  // float32 [D/2]: replaces base
};

// qkv: [B, HQ + 2·HKV, 1, D] (the fused q/k/v product of one decode step, heads in that order);
// q_norm / k_norm: [D]; positions: int32 [1] (all rows at one position) or [B] (each row at its
// own). Returns (q, k) as [B, HQ, 1, D] and [B, HKV, 1, D], normalized and rotated: one kernel on
// CUDA for bfloat16/float16, or nothing where it does not apply (the caller runs MLX's ops).
// The sums of squares and the sines run in another order and precision than MLX's kernels, so
// an element may differ from theirs in its last bit.
std::optional<std::pair<mlx::core::array, mlx::core::array>> cuda_qk_norm_rope(
    const mlx::core::array& qkv, int n_q_heads, int n_kv_heads, const mlx::core::array& q_norm,
    const mlx::core::array& k_norm, float eps, const RopeArgs& rope, const mlx::core::array& positions);

// A decode step's q/k/v from the fused product straight into a full-attention key/value cache,
// in one kernel where MLX runs four to six (the q/k norms and ropes, then a SliceUpdate each for
// k and v): q and k normalized (`norms`: q_norm and k_norm, [D]; none: no norms) and rotated at
// `positions` (int32 [1], or [B]: each row's), k and v written into column at[0] of the buffers.
// qkv: [B, HQ + 2·HKV, 1, D]; at: int32 [2], the column and the buffers' capacity (an array, so
// that one kernel serves every step); k_cache / v_cache: [B, HKV, capacity, D] of qkv's dtype,
// row contiguous buffers. Returns q [B, HQ, 1, D]; nothing where the kernel does not apply.
//
// The buffers are written IN PLACE, outside MLX's value semantics: the caller must own them
// (no other array shares them, as a continuous batch's buffers: nn::batch_kv_cache) and keep
// using the same arrays, and whatever reads the new column must depend on q (so that it runs
// after the write). MLX's way, an output taking over its input's buffer, does not work here:
// with the decode pipeline the previous step's kernels, still in flight, hold the buffers, so
// nearly every step copied the whole cache (8k tokens: decode 8x slower, BENCHMARKS.md).
std::optional<mlx::core::array> cuda_qkv_into_cache(
    const mlx::core::array& qkv, int n_q_heads, int n_kv_heads,
    const std::optional<std::pair<mlx::core::array, mlx::core::array>>& norms, float eps, const RopeArgs& rope,
    const mlx::core::array& positions, const mlx::core::array& at, const mlx::core::array& k_cache,
    const mlx::core::array& v_cache);

// cuda_qkv_into_cache's write and then each query's attention over keys 0 ..= at[0] (scale: the
// softmax scale), in one kernel rather than two: the same bits as cuda_qkv_into_cache followed by
// cuda_short_attention, for head sizes that kernel takes (D a multiple of 32, at most 256).
// Returns the attention [B, 1, HQ·D]. Meant for short contexts: one block per query head reads
// every key (cuda_short_attention's trade-off). The same ownership rules as cuda_qkv_into_cache.
std::optional<mlx::core::array> cuda_decode_attention(
    const mlx::core::array& qkv, int n_q_heads, int n_kv_heads,
    const std::optional<std::pair<mlx::core::array, mlx::core::array>>& norms, float eps, const RopeArgs& rope,
    const mlx::core::array& positions, const mlx::core::array& at, const mlx::core::array& k_cache,
    const mlx::core::array& v_cache, float scale);

}  // namespace mlex
