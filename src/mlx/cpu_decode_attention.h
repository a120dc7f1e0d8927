// A decode step's attention block on the CPU as one MLX primitive: from the fused q/k/v product to
// the attention output, with the new token's key and value written into the cache's buffers.
// Built from MLX ops this is ~10 ops a layer (a reshape, two splits, a rope, two slice updates, two
// slices, the attention, a reshape), and on a small model a decode step's per-op cost (building,
// scheduling and releasing each op: ~5 µs here) weighs as much as its arithmetic: SmolLM2-135M
// runs 30 such layers a token. The results are the bits of those ops (the same row functions as
// cpu_rms_norm, cpu_rope and cpu_attention, in the same order).
#pragma once

#include <optional>
#include <tuple>

#include "mlx/mlx.h"

namespace mlex {

struct DecodeAttentionArgs {
  int n_q_heads, n_kv_heads;
  // The buffers' column this step's token goes into (the tokens they already hold), which is also
  // its rope position unless `positions` (int32 `[B]`, a continuous batch's rows) gives each row's.
  int offset;
  std::optional<mlx::core::array> positions;
  // Each row's first visible key (int32 `[B]`: a left-padded batch), where given.
  std::optional<mlx::core::array> key_start;
  float scale;  // of the scores
  // Per-head RMSNorm of q and k before the rotation (qwen3, gemma 3), where given.
  std::optional<mlx::core::array> q_norm, k_norm;
  float norm_eps;
  // The rotation as mlex_fast_rope's: rope_dims 0 for none; freqs replaces base where given.
  int rope_dims;
  bool traditional;
  float base, rope_scale;
  std::optional<mlx::core::array> freqs;
};

// qkv `[B, 1, (HQ + 2·HKV)·D]`, k/v buffers `[B, HKV, C, D]` holding `offset` columns (C > offset);
// row b's query sees columns key_start[b] (or 0) ..= offset.
// Returns (the attention output `[B, 1, HQ·D]`, the key buffer, the value buffer) with this token
// written at `offset`: the buffers are reused in place where MLX lets them be donated (the cache
// held the only reference), else copied. Nothing where it does not apply (not the CPU, not float32,
// other shapes): the caller then runs the separate ops.
std::optional<std::tuple<mlx::core::array, mlx::core::array, mlx::core::array>> cpu_decode_attention(
    const mlx::core::array& qkv, const mlx::core::array& k_cache, const mlx::core::array& v_cache,
    const DecodeAttentionArgs& args);

}  // namespace mlex
