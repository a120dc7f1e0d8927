// Attention for a short pass on CUDA (2..16 queries: a speculative verification, a small prompt
// chunk) over a key/value cache's whole buffers, causal from an offset, in one kernel of ours.
//
// MLX sends attention with more than one query to cuDNN, under the mask of the whole buffers
// (nn::kv_cache); on the H200, prompt lookup ran 1.66x faster with this kernel instead
// (BENCHMARKS.md, sixth session). It is launched as a plain kernel node (cuda_launch) and takes
// the offset as data, so one instantiation serves every pass and no mask is read.
#pragma once

#include <optional>

#include "mlx/mlx.h"

namespace mlex {

// q: [B, HQ, L, D]; k, v: [B, HKV, C, D] (whole buffers: C >= prev + L); query l of row b sees
// keys 0 ..= prev + l. token_major: q is a transposed view of token-major [B, L, HQ, D] memory
// (decode rows), read as it is, and the result is then such a view too. Returns [B, HQ, L, D]
// in q's dtype (bfloat16, float16 or float32), computed in float32, or nothing where the
// kernel does not apply (not CUDA, other shapes). flat (one query, not token_major): the same
// memory shaped [B, 1, HQ·D], as the output projection takes it, with no reshape op.
// The kernel's second half as CUDA source, shared with cuda_decode_attention's kernel: one
// query's attention over `keys` keys (warp w takes keys w, w + WARPS, ...; an online softmax per
// warp, merged in shared memory), from each lane's `qv` (its D / 32 elements of q, scaled) and
// `acc` (zeros), `kb` / `vb` (the lane's elements of the head's first key and value), `lane`,
// `w`, constants T, D, WARPS and PER = D / 32; writes row `row` of `out` ([.., D]).
extern const char* const kCudaAttendOneQuery;

std::optional<mlx::core::array> cuda_short_attention(const mlx::core::array& q, const mlx::core::array& k,
                                                     const mlx::core::array& v, float scale, int prev,
                                                     bool token_major, bool flat = false);

}  // namespace mlex
