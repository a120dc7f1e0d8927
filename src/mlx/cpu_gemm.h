// Products with many rows of x on the CPU, as a packed GEMM: out[M, N] = x[M, K] · wᵀ for a
// quantized w (dequantized as it is packed: a prompt chunk) or a float32 w (an unquantized
// checkpoint's prompt chunk, a vision tower's patches, for which MLX calls the reference BLAS
// the CPU wheel bundles, ~4 GFLOP/s here). The row kernels of cpu_quantized_matmul.cpp
// unpack each weight once per four rows of x and stream every row of x past every weight row:
// for a 512-row chunk that is memory traffic on x, not arithmetic. Here a block of weight rows
// is dequantized once into a small float panel (k-major, in cache) and reused by every row of x
// through a 6×16 register-blocked micro-kernel (the classic AVX2 GEMM shape), with x read once
// per 64 weight rows. Each output is a plain sequential sum over k of x · (scale · q + bias),
// in k order, whatever M is: a row's result does not depend on which rows share its chunk.
#pragma once

#include <cstdint>

#include "cpu_scales.h"

namespace mlex {

// Rows of x from which the GEMM is used (both kinds): above a continuous batch's decode step (max 32 rows),
// whose rows must stay bit-identical to one row decoded alone (the row kernels).
constexpr int kGemmMinRows = 33;

// Whether this CPU runs the GEMM (x86-64 with AVX2/FMA).
bool quantized_gemm_available();

// x: [M, K] row-major; w: [N, K·bits/32] packed rows (MLX affine layout); scales: their [N, K/group]
// scales and biases (float32 or 16-bit, widened as a block is packed).
void quantized_gemm(const float* x, const uint32_t* w, const ScaleRows& scales, float* out, int M, int N, int K,
                    int group_size, int bits);

// x: [M, K] row-major; w: [N, K] row-major (so the product is with its transpose).
void dense_gemm(const float* x, const float* w, float* out, int M, int N, int K);

}  // namespace mlex
