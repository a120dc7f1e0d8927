// The gated delta rule recurrence of Qwen3.5 / Qwen3-Next linear attention as one op, for the
// CPU (an MLX primitive) and CUDA (a kernel of ours compiled and cached by cuda_jit.h, which also
// takes in the q/k normalisation and gate computations that precede it). The
// reference graph (`nn/gated_delta.rs`, what mlx-lm runs off Metal) costs ~10 ops per token and
// layer: a 2,048-token prompt through 18 such layers is ~370k ops, and a decode step ~200.
// Per token t and value head h, with S the [Dv, Dk] state in float32:
//   S = g_t·S;  kv = S·k_t;  S += k_t ⊗ (v_t − kv)·β_t;  y_t = S·q_t
// q/k head h / (Hv / Hk) serves value head h.
#pragma once

#include <optional>
#include <utility>

#include "mlx/mlx.h"

namespace mlex {

// On the CPU: q, k `[B, T, Hk, Dk]` (normalised), v `[B, T, Hv, Dv]`, g and beta `[B, T, Hv]`,
// state `[B, Hv, Dv, Dk]` (float32). Returns (y `[B, T, Hv, Dv]` in q's dtype, the new state in
// float32) as lazy arrays, or nothing when this kernel does not cover the case (another device,
// other shapes or dtypes): the caller then runs the reference graph.
std::optional<std::pair<mlx::core::array, mlx::core::array>> gated_delta(
    const mlx::core::array& q, const mlx::core::array& k, const mlx::core::array& v, const mlx::core::array& g,
    const mlx::core::array& beta, const mlx::core::array& state);

// On CUDA, all of mlx-lm's gated_delta_update in one kernel: q, k `[B, T, Hk, Dk]` as the conv
// gives them (normalize_qk is done inside), a and b `[B, T, Hv]` (the gates are computed inside
// from them, A_log and dt_bias `[Hv]`), v and state as above. Nothing where it does not apply.
std::optional<std::pair<mlx::core::array, mlx::core::array>> gated_delta_update(
    const mlx::core::array& q, const mlx::core::array& k, const mlx::core::array& v, const mlx::core::array& a,
    const mlx::core::array& b, const mlx::core::array& a_log, const mlx::core::array& dt_bias,
    const mlx::core::array& state);

}  // namespace mlex
