// The decode-step matrix-vector product of affine weights with AVX-512, for CPUs that have it
// (x86-64 servers since Skylake-X, including the CI machines; 2, 3, 5 and 6 bits also need VBMI,
// Ice Lake and later): a decode step on the CPU spent about two thirds of its time in these
// products (BENCHMARKS.md).
//
// Why a kernel of its own rather than wider registers in the AVX2 one: the AVX2 kernel broadcasts
// each 32-bit word and shifts each lane by its own amount (five instructions per eight
// multiply-adds), works one weight row at a time, and loses much of its time to per-row setup
// and memory latency on 576-wide rows. This one
//  - widens 16 packed bytes into 16 lanes and turns low and high nibbles into floats with a
//    16-entry table lookup (and one shift), against x laid out per 32 values as
//    [16 even | 16 odd] to match (4-bit);
//  - works four weight rows at once (one load of x for four rows, four independent chains);
//  - prefetches each row's bytes ahead, and the next rows' scales and biases, since four
//    interleaved row streams and short bursts of scales defeat the hardware prefetcher;
//  - reads 16-bit scales and biases as stored, widening them in registers;
//  - unpacks 2/3/5/6-bit bit streams with two byte shuffles per 32 values (VBMI), where the
//    AVX2 kernel spends about nine instructions per eight values.
// The arithmetic stays float32: per row, Σ_blocks scale · Σ q·x + Σ_g bias · Σ x over the group.
// Only the order of the sums differs from the AVX2 kernel's (results agree to float rounding).
// Up to four rows of x (a continuous batch's decode step) share each unpacked block of weights.
// Each (weight row, x row) product runs the same operations in the same order whatever block,
// batch or thread split it falls in, so a batch's rows are bit for bit their single-row results.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu_scales.h"

namespace mlex {

// Callers check has_avx512() (cpu_simd.h) first.

// The widest row, in groups of scales, the kernel takes (it widens a block's scales on its stack).
constexpr int kAvx512MaxGroups = 1024;

// x (K floats) rearranged for the 4-bit kernel: per 32 values, the 16 even then the 16 odd ones
// (the low and high nibbles of 16 packed bytes). Other widths take x as it is.
void deinterleave_x_q4(const float* x, int K, float* out);

// out[m · out_stride + r] = Σ_k dequantize(w)[r, k] · x[m, k] for r < rows and m < M, for `bits`
// 2-6 or 8, group_size a multiple of 32 and groups ≤ kAvx512MaxGroups. w: the first row's packed
// bytes (rows are `row_bytes` apart); s, b: the first row's scales and biases in `dtype`, `groups`
// per row, rows contiguous; xk: M rows of K as the kernel takes them (deinterleave_x_q4 for 4
// bits); xsum: M rows of Σ x per group. Each unpacked block of weights serves up to four rows of
// x. Bits other than 4 and 8 need has_avx512_vbmi().
void matvec_rows_avx512(const uint8_t* w, size_t row_bytes, const void* s, const void* b, ScaleDtype dtype,
                        int groups, int group_size, int bits, const float* xk, const float* xsum, int M, int K,
                        int rows, float* out, size_t out_stride);

}  // namespace mlex
