// The decode step's affine matrix-vector product with 8-bit activations and integer dot products
// (AVX-512 VNNI `vpdpbusd`: 64 multiply-adds an instruction), as llama.cpp computes its products:
// an opt-in (LoadOptions::int8_activations), because it moves results away from mlx-lm's.
//
// Why: on a CPU whose caches hold the model (SmolLM2 in a 260 MB L3) the float kernel
// (cpu_matvec_avx512.h) is bound by its vector instructions, 7 for 32 multiply-adds; this one
// spends about 5 for 64. What it changes: each 32-value block of x is rounded to 8 bits with a
// scale of its own (d = max|x| / 127, q = round(x · 127 / max|x|)), so a product moves by about
// one part in 254 of each block's largest value, times the weights. The weights' bias term
// (Σ_g bias_g · Σ_{i∈g} x_i) still uses the exact float sums of x, and the weights are read as
// stored: only x is rounded.
//
// Layout per pair of blocks (64 values of x, 32 bytes of a 4-bit row or 64 of an 8-bit one):
//  - 8-bit weights: x's 64 values in order; one `vpdpbusd` of the row's 64 bytes.
//  - 4-bit weights: the row's 32 bytes are loaded twice into one register, masked to their low
//    nibbles in the lower half and high nibbles in the upper half (so the upper half's values
//    are 16×, undone by its scale); x is laid out to match: [A even | B even | A odd | B odd]
//    (A, B the pair's two blocks, 16 values each).
// Per (weight row, x row, pair) the integer sums are exact and are scaled by
// scale[g] · d[block] (per block, four 32-bit lanes each) into a float accumulator; the order of
// operations does not depend on how rows are split over threads or batched.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu_scales.h"

namespace mlex {

#if defined(__x86_64__)
// AVX-512 F/BW/VL and VNNI (Ice Lake and later server CPUs, Sapphire Rapids, Zen 4), where the
// float kernels may use AVX-512 (cpu_simd.h's has_avx512, so MLEX_CPU_NO_AVX512 turns it off).
bool has_avx512_vnni();
#else
inline bool has_avx512_vnni() { return false; }
#endif

// How a row of K values of x is laid out for the kernel: `pairs` pairs of 32-value blocks (the
// last one zero-padded), 64 bytes each; one float scale per block, padded with zeros to a
// multiple of 16 blocks.
struct Int8XLayout {
  int pairs;
  size_t q_stride;  // bytes between rows of x
  size_t d_stride;  // floats between rows of scales
  static Int8XLayout of(int K) {
    const int pairs = (K / 32 + 1) / 2;
    return {pairs, static_cast<size_t>(pairs) * 64, static_cast<size_t>((2 * pairs + 15) / 16 * 16)};
  }
};

// Rounds x (K floats, K a multiple of 32) to 8 bits per block, laid out for `bits` (4 or 8):
// q gets layout.q_stride bytes, d layout.d_stride floats.
void quantize_x_int8(const float* x, int K, int bits, int8_t* q, float* d);

// out[m · out_stride + r] ≈ Σ_k dequantize(w)[r, k] · x[m, k] for r < rows and m < M, with x as
// quantize_x_int8 wrote it (rows layout.q_stride and layout.d_stride apart) and xsum its exact
// Σ x per group (M rows of `groups`). bits 4 or 8; group_size 32, 64, 128, 256 or 512; groups ≤
// kAvx512MaxGroups. w, s, b: the first row's bytes, scales and biases (as in matvec_rows_avx512).
void matvec_rows_vnni(const uint8_t* w, size_t row_bytes, const void* s, const void* b, ScaleDtype dtype, int groups,
                      int group_size, int bits, const int8_t* xq, const float* xd, const float* xsum, int M, int K,
                      int rows, float* out, size_t out_stride);

}  // namespace mlex
