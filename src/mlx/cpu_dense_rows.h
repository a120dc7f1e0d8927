// The product of a few rows of x with a float32 weight stored [N, K] row-major (a dense layer's
// weight, or a tied embedding as the output head), on the CPU: a decode step (one row, or a
// continuous batch's up to 32), a short prompt chunk, a speculative pass. MLX's CPU wheel sends
// these to the reference BLAS it bundles, which read the weights at ~5 GB/s here (an unquantized
// checkpoint decoded at the speed of its matvecs; a 31-token chunk after a prompt-cache hit took
// 1.3 s on an 8-layer 1024-wide model). Many rows go to the packed GEMM (cpu_gemm.h).
//
// Each output is one 8-lane chain of fused multiply-adds over k in order (lane j sums the k ≡ j
// mod 8), a fixed horizontal sum, then the K mod 8 tail in order: the same operations for every
// (row of x, row of w) whatever M is, which rows share a block, or how the rows are split over
// threads. So a batch's rows are bit for bit their single-row results, and a speculative pass's
// rows are the decode step's.
#pragma once

#include <cstddef>

namespace mlex {

// out[m · out_stride + n] = Σ_k x[m · K + k] · w[n · K + k] for m < M and n < N (x and w
// row-major and contiguous). Runs on the calling thread; callers split N across threads. Needs
// has_avx2_fma() (cpu_simd.h).
void dense_rows(const float* x, int M, const float* w, int N, int K, float* out, size_t out_stride);

}  // namespace mlex
