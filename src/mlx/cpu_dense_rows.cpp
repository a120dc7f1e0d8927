#include "cpu_dense_rows.h"

#include <algorithm>
#include <cmath>

#include "cpu_simd.h"

namespace mlex {

#ifdef MLEX_X86_64
namespace {

// R weight rows against MB rows of x: R · MB independent chains, each as the header describes.
template <int R, int MB>
__attribute__((target("avx2,fma"))) void block(const float* x, int K, const float* w, float* out, size_t out_stride) {
  __m256 acc[MB][R];
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm256_setzero_ps();
  const int k8 = K & ~7;
  for (int k = 0; k < k8; k += 8) {
    __m256 xv[MB];
    for (int m = 0; m < MB; ++m) xv[m] = _mm256_loadu_ps(x + static_cast<size_t>(m) * K + k);
    for (int r = 0; r < R; ++r) {
      const __m256 wv = _mm256_loadu_ps(w + static_cast<size_t>(r) * K + k);
      for (int m = 0; m < MB; ++m) acc[m][r] = _mm256_fmadd_ps(wv, xv[m], acc[m][r]);
    }
  }
  for (int m = 0; m < MB; ++m) {
    for (int r = 0; r < R; ++r) {
      float s = hsum(acc[m][r]);
      const float* xm = x + static_cast<size_t>(m) * K;
      const float* wr = w + static_cast<size_t>(r) * K;
      for (int k = k8; k < K; ++k) s = std::fma(wr[k], xm[k], s);
      out[static_cast<size_t>(m) * out_stride + r] = s;
    }
  }
}

template <int MB>
__attribute__((target("avx2,fma"))) void rows_of_w(const float* x, int K, const float* w, int lo, int hi, float* out,
                                                   size_t out_stride) {
  int n = lo;
  for (; n + 4 <= hi; n += 4) block<4, MB>(x, K, w + static_cast<size_t>(n) * K, out + n, out_stride);
  for (; n < hi; ++n) block<1, MB>(x, K, w + static_cast<size_t>(n) * K, out + n, out_stride);
}

}  // namespace

void dense_rows(const float* x, int M, const float* w, int N, int K, float* out, size_t out_stride) {
  // Weight rows in blocks of ~128 KB, which stay in L2 while every row of x passes them.
  const int block_rows = std::max(4, (32768 / std::max(K, 1)) / 4 * 4);
  for (int lo = 0; lo < N; lo += block_rows) {
    const int hi = std::min(N, lo + block_rows);
    int m = 0;
    for (; m + 2 <= M; m += 2) {
      rows_of_w<2>(x + static_cast<size_t>(m) * K, K, w, lo, hi, out + static_cast<size_t>(m) * out_stride, out_stride);
    }
    if (m < M) rows_of_w<1>(x + static_cast<size_t>(m) * K, K, w, lo, hi, out + static_cast<size_t>(m) * out_stride, out_stride);
  }
}
#else
void dense_rows(const float*, int, const float*, int, int, float*, size_t) {}
#endif

}  // namespace mlex
