// One CUDA kernel for what a qwen3-style decode step does to q and k between the q/k/v product
// and attention: each head's RMSNorm (q_norm, k_norm) then the rotary embedding, for q and k.
// MLX runs that as four kernels (two RMSNorms, two RoPEs); on the H200 a decode step is bound
// by the host's cost per kernel launch (BENCHMARKS.md), so three fewer launches per layer is
// decode speed.
#pragma once

#include <optional>
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

}  // namespace mlex
