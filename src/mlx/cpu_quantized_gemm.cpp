// See cpu_quantized_gemm.h.
#include "cpu_quantized_gemm.h"

#include "cpu_simd.h"
#include "cpu_thread_pool.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace mlex {
namespace {

// Columns of a panel (two AVX2 vectors), rows of x per micro-tile, weight rows per superpanel
// (what a task dequantizes at once, and x is read once per), and k per block (a superpanel's
// panels are 64 × 256 floats = 64 KB, an L2-resident block).
constexpr int kNr = 16;
constexpr int kMr = 6;
constexpr int kSuper = 64;
constexpr int kKc = 256;

// Dequantizes rows n0 .. n0 + rows of w, columns k0 .. k0 + kc, into k-major panels of 16 rows:
// panel p's element (k, j) at wt[p · kc · 16 + k · 16 + j]; rows past `rows` are zeros.
void pack(const uint32_t* w, const float* scales, const float* biases, int N, int K, int group_size, int bits, int n0,
          int rows, int k0, int kc, float* wt) {
  const size_t row_bytes = static_cast<size_t>(K) * bits / 8;
  const uint8_t* base = reinterpret_cast<const uint8_t*>(w);
  const int groups = K / group_size;
  const uint32_t mask = (1u << bits) - 1;
  const int padded = (rows + kNr - 1) / kNr * kNr;
  for (int j = 0; j < padded; ++j) {
    float* col = wt + static_cast<size_t>(j / kNr) * kc * kNr + (j % kNr);
    if (j >= rows) {
      for (int k = 0; k < kc; ++k) col[k * kNr] = 0.f;
      continue;
    }
    const size_t n = static_cast<size_t>(n0 + j);
    const uint8_t* row = base + n * row_bytes;
    const float* s = scales + n * groups;
    const float* b = biases + n * groups;
    // k0 and kc are multiples of 8 and so is the group size: eight values share a group.
    for (int k = 0; k < kc; k += 8) {
      const int at = k0 + k;
      const float sg = s[at / group_size], bg = b[at / group_size];
      const size_t byte = static_cast<size_t>(at) * bits / 8;  // eight values start on a byte
      uint64_t v = 0;
      std::memcpy(&v, row + byte, static_cast<size_t>(bits));  // eight values are `bits` bytes
      for (int t = 0; t < 8; ++t) col[(k + t) * kNr] = sg * static_cast<float>((v >> (t * bits)) & mask) + bg;
    }
  }
}

#ifdef MLEX_X86_64

// c[r, 0..ncols) (+)= Σ_k x[r, k] · wt[k, 0..16) for MR rows, k in order.
template <int MR>
__attribute__((target("avx2,fma"))) void micro(const float* x, size_t ldx, const float* wt, int kc, float* c,
                                               size_t ldc, int ncols, bool accumulate) {
  __m256 acc[MR][2];
  _Pragma("GCC unroll 6") for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int k = 0; k < kc; ++k) {
    const __m256 w0 = _mm256_loadu_ps(wt + k * kNr);
    const __m256 w1 = _mm256_loadu_ps(wt + k * kNr + 8);
    _Pragma("GCC unroll 6") for (int r = 0; r < MR; ++r) {
      const __m256 xb = _mm256_broadcast_ss(x + r * ldx + k);
      acc[r][0] = _mm256_fmadd_ps(xb, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(xb, w1, acc[r][1]);
    }
  }
  _Pragma("GCC unroll 6") for (int r = 0; r < MR; ++r) {
    float* cr = c + r * ldc;
    if (ncols == kNr) {
      __m256 lo = acc[r][0], hi = acc[r][1];
      if (accumulate) {
        lo = _mm256_add_ps(_mm256_loadu_ps(cr), lo);
        hi = _mm256_add_ps(_mm256_loadu_ps(cr + 8), hi);
      }
      _mm256_storeu_ps(cr, lo);
      _mm256_storeu_ps(cr + 8, hi);
    } else {
      alignas(32) float tmp[kNr];
      _mm256_store_ps(tmp, acc[r][0]);
      _mm256_store_ps(tmp + 8, acc[r][1]);
      for (int j = 0; j < ncols; ++j) cr[j] = accumulate ? cr[j] + tmp[j] : tmp[j];
    }
  }
}

using Micro = void (*)(const float*, size_t, const float*, int, float*, size_t, int, bool);
constexpr Micro kMicro[kMr + 1] = {nullptr, micro<1>, micro<2>, micro<3>, micro<4>, micro<5>, micro<6>};

#endif

}  // namespace

bool quantized_gemm_available() {
#ifdef MLEX_X86_64
  return has_avx2_fma();
#else
  return false;
#endif
}

void quantized_gemm(const float* x, const uint32_t* w, const float* scales, const float* biases, float* out, int M,
                    int N, int K, int group_size, int bits) {
#ifdef MLEX_X86_64
  const int supers = (N + kSuper - 1) / kSuper;
  const int tasks = std::min(supers, pool().size() * 2);
  pool().run(tasks, [&](int t) {
    std::vector<float> wt(static_cast<size_t>(kSuper) * kKc);
    for (int sp = t; sp < supers; sp += tasks) {
      const int n0 = sp * kSuper, rows = std::min(kSuper, N - n0);
      const int panels = (rows + kNr - 1) / kNr;
      for (int k0 = 0; k0 < K; k0 += kKc) {
        const int kc = std::min(kKc, K - k0);
        pack(w, scales, biases, N, K, group_size, bits, n0, rows, k0, kc, wt.data());
        for (int m0 = 0; m0 < M; m0 += kMr) {
          const int mr = std::min(kMr, M - m0);
          const float* xm = x + static_cast<size_t>(m0) * K + k0;
          for (int p = 0; p < panels; ++p) {
            const int ncols = std::min(kNr, rows - p * kNr);
            float* c = out + static_cast<size_t>(m0) * N + n0 + p * kNr;
            kMicro[mr](xm, K, wt.data() + static_cast<size_t>(p) * kc * kNr, kc, c, N, ncols, k0 > 0);
          }
        }
      }
    }
  });
#else
  (void)x, (void)w, (void)scales, (void)biases, (void)out, (void)M, (void)N, (void)K, (void)group_size, (void)bits;
#endif
}

}  // namespace mlex
