// See cpu_gemm.h.
#include "cpu_gemm.h"

#include "cpu_bitstream.h"
#include "cpu_simd.h"
#include "cpu_thread_pool.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace mlex {
namespace {

// Columns of a panel (two AVX2 vectors; two AVX-512 vectors where the CPU has them), rows of x
// per micro-tile (6 with AVX2, 12 with AVX-512: the accumulators fill the register file), weight
// rows per superpanel (what a task dequantizes at once, and x is read once per), and k per block
// (a superpanel's panels are 64 × 256 floats = 64 KB, an L2-resident block). Every output is the
// same sequential sum over k with either width, so the two give the same bits.
constexpr int kNr = 16;
constexpr int kMr = 6;
constexpr int kNr512 = 32;
constexpr int kMr512 = 12;
constexpr int kSuper = 64;
constexpr int kKc = 256;

#ifdef MLEX_X86_64

// r[i] becomes column i of the 8×8 block whose rows were r[0..8).
__attribute__((target("avx2,fma"))) inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// Dequantizes rows n0 .. n0 + rows of w, columns k0 .. k0 + kc, into k-major panels of nr rows:
// panel p's element (k, j) at wt[p · kc · nr + k · nr + j]; rows past `rows` are zeros. Eight
// rows × eight columns at a time: each row's eight values dequantized as one vector
// (scale · q + bias), the 8×8 block transposed in registers, stored as eight k-rows.
// scales/biases: row n0 + j's group g at [j · stride + g - g0] (the block's groups from g0).
__attribute__((target("avx2,fma"))) void pack(const uint32_t* w, const float* scales, const float* biases,
                                              size_t stride, int g0, int N, int K, int group_size,
                                              const BitLanesAvx2& lanes, int n0, int rows, int k0, int kc, int nr,
                                              float* wt) {
  const int bits = lanes.bits;
  const size_t row_bytes = static_cast<size_t>(K) * bits / 8;
  const size_t total = row_bytes * N;
  const uint8_t* base = reinterpret_cast<const uint8_t*>(w);
  const int padded = (rows + nr - 1) / nr * nr;
  for (int j0 = 0; j0 < padded; j0 += 8) {
    float* panel = wt + static_cast<size_t>(j0 / nr) * kc * nr + (j0 % nr);
    // k0 and kc are multiples of 8 and so is the group size: eight values share a group.
    for (int k = 0; k < kc; k += 8) {
      const int at = k0 + k;
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        if (j0 + i >= rows) {
          r[i] = _mm256_setzero_ps();
          continue;
        }
        const size_t n = static_cast<size_t>(n0 + j0 + i);
        const size_t g = static_cast<size_t>(j0 + i) * stride + (at / group_size - g0);
        // Eight values start on a byte and take `bits` bytes.
        const size_t byte = n * row_bytes + static_cast<size_t>(at) * bits / 8;
        const __m256 q = lanes.values(base + byte, byte + 8 <= total);
        r[i] = _mm256_fmadd_ps(_mm256_set1_ps(scales[g]), q, _mm256_set1_ps(biases[g]));
      }
      transpose8(r);
      for (int t = 0; t < 8; ++t) _mm256_storeu_ps(panel + (k + t) * nr, r[t]);
    }
  }
}

// Copies rows n0 .. n0 + rows of a float32 w ([N, K] row-major), columns k0 .. k0 + kc, into the
// same k-major panels (8×8 blocks transposed in registers; rows past `rows` are zeros).
__attribute__((target("avx2,fma"))) void pack_dense(const float* w, int K, int n0, int rows, int k0, int kc, int nr,
                                                    float* wt) {
  const int padded = (rows + nr - 1) / nr * nr;
  for (int j0 = 0; j0 < padded; j0 += 8) {
    float* panel = wt + static_cast<size_t>(j0 / nr) * kc * nr + (j0 % nr);
    for (int k = 0; k < kc; k += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        const float* src = w + static_cast<size_t>(n0 + j0 + i) * K + k0 + k;
        if (j0 + i >= rows) {
          r[i] = _mm256_setzero_ps();
        } else if (k + 8 <= kc) {
          r[i] = _mm256_loadu_ps(src);
        } else {  // a k that is not a multiple of 8 (dense widths can be anything)
          alignas(32) float tail[8] = {};
          for (int t = 0; t < kc - k; ++t) tail[t] = src[t];
          r[i] = _mm256_load_ps(tail);
        }
      }
      transpose8(r);
      for (int t = 0; t < 8 && k + t < kc; ++t) _mm256_storeu_ps(panel + (k + t) * nr, r[t]);
    }
  }
}

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

// The same with AVX-512 on 32-column panels: c[r, 0..ncols) (+)= Σ_k x[r, k] · wt[k, 0..32).
template <int MR>
__attribute__((target("avx512f,avx2,fma"))) void micro512(const float* x, size_t ldx, const float* wt, int kc,
                                                          float* c, size_t ldc, int ncols, bool accumulate) {
  __m512 acc[MR][2];
  _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int k = 0; k < kc; ++k) {
    const __m512 w0 = _mm512_loadu_ps(wt + k * kNr512);
    const __m512 w1 = _mm512_loadu_ps(wt + k * kNr512 + 16);
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r) {
      const __m512 xb = _mm512_set1_ps(x[r * ldx + k]);
      acc[r][0] = _mm512_fmadd_ps(xb, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(xb, w1, acc[r][1]);
    }
  }
  _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r) {
    float* cr = c + r * ldc;
    if (ncols == kNr512) {
      __m512 lo = acc[r][0], hi = acc[r][1];
      if (accumulate) {
        lo = _mm512_add_ps(_mm512_loadu_ps(cr), lo);
        hi = _mm512_add_ps(_mm512_loadu_ps(cr + 16), hi);
      }
      _mm512_storeu_ps(cr, lo);
      _mm512_storeu_ps(cr + 16, hi);
    } else {
      alignas(64) float tmp[kNr512];
      _mm512_store_ps(tmp, acc[r][0]);
      _mm512_store_ps(tmp + 16, acc[r][1]);
      for (int j = 0; j < ncols; ++j) cr[j] = accumulate ? cr[j] + tmp[j] : tmp[j];
    }
  }
}

using Micro = void (*)(const float*, size_t, const float*, int, float*, size_t, int, bool);
constexpr Micro kMicro[kMr + 1] = {nullptr, micro<1>, micro<2>, micro<3>, micro<4>, micro<5>, micro<6>};
constexpr Micro kMicro512[kMr512 + 1] = {nullptr,       micro512<1>,  micro512<2>, micro512<3>, micro512<4>,
                                         micro512<5>,   micro512<6>,  micro512<7>, micro512<8>, micro512<9>,
                                         micro512<10>,  micro512<11>, micro512<12>};

// The blocked product; pack(n0, rows, k0, kc, nr, wt) fills a superpanel's panels of nr columns.
template <class Pack>
void gemm(const float* x, float* out, int M, int N, int K, const Pack& pack) {
  const bool wide = has_avx512();
  const int nr = wide ? kNr512 : kNr, mr_max = wide ? kMr512 : kMr;
  const Micro* micros = wide ? kMicro512 : kMicro;
  const int supers = (N + kSuper - 1) / kSuper;
  const int tasks = std::min(supers, pool().size() * 2);
  pool().run(tasks, [&](int t) {
    std::vector<float> wt(static_cast<size_t>(kSuper) * kKc);
    for (int sp = t; sp < supers; sp += tasks) {
      const int n0 = sp * kSuper, rows = std::min(kSuper, N - n0);
      const int panels = (rows + nr - 1) / nr;
      for (int k0 = 0; k0 < K; k0 += kKc) {
        const int kc = std::min(kKc, K - k0);
        pack(n0, rows, k0, kc, nr, wt.data());
        for (int m0 = 0; m0 < M; m0 += mr_max) {
          const int mr = std::min(mr_max, M - m0);
          const float* xm = x + static_cast<size_t>(m0) * K + k0;
          for (int p = 0; p < panels; ++p) {
            const int ncols = std::min(nr, rows - p * nr);
            float* c = out + static_cast<size_t>(m0) * N + n0 + p * nr;
            micros[mr](xm, K, wt.data() + static_cast<size_t>(p) * kc * nr, kc, c, N, ncols, k0 > 0);
          }
        }
      }
    }
  });
}

#endif

}  // namespace

bool quantized_gemm_available() {
#ifdef MLEX_X86_64
  return has_avx2_fma();
#else
  return false;
#endif
}

void quantized_gemm(const float* x, const uint32_t* w, const ScaleRows& scales, float* out, int M, int N, int K,
                    int group_size, int bits) {
#ifdef MLEX_X86_64
  const BitLanes bit_lanes(bits);
  gemm(x, out, M, N, K, [&](int n0, int rows, int k0, int kc, int nr, float* wt) {
    const int g0 = k0 / group_size, count = (k0 + kc - 1) / group_size + 1 - g0;
    if (scales.dtype == ScaleDtype::F32) {
      const size_t at = static_cast<size_t>(n0) * scales.groups;
      pack(w, static_cast<const float*>(scales.scales) + at, static_cast<const float*>(scales.biases) + at,
           scales.groups, 0, N, K, group_size, BitLanesAvx2(bit_lanes), n0, rows, k0, kc, nr, wt);
      return;
    }
    // 16-bit: the block's groups of its rows widened first (a few hundred values per 64 × 256 block).
    thread_local std::vector<float> s, b;
    s.resize(static_cast<size_t>(rows) * count);
    b.resize(static_cast<size_t>(rows) * count);
    for (int j = 0; j < rows; ++j) {
      const size_t at = static_cast<size_t>(n0 + j) * scales.groups + g0;
      widen(static_cast<const uint16_t*>(scales.scales) + at, scales.dtype, count, s.data() + static_cast<size_t>(j) * count);
      widen(static_cast<const uint16_t*>(scales.biases) + at, scales.dtype, count, b.data() + static_cast<size_t>(j) * count);
    }
    pack(w, s.data(), b.data(), count, g0, N, K, group_size, BitLanesAvx2(bit_lanes), n0, rows, k0, kc, nr, wt);
  });
#else
  (void)x, (void)w, (void)scales, (void)out, (void)M, (void)N, (void)K, (void)group_size, (void)bits;
#endif
}

void dense_gemm(const float* x, const float* w, float* out, int M, int N, int K) {
#ifdef MLEX_X86_64
  gemm(x, out, M, N, K,
       [&](int n0, int rows, int k0, int kc, int nr, float* wt) { pack_dense(w, K, n0, rows, k0, kc, nr, wt); });
#else
  (void)x, (void)w, (void)out, (void)M, (void)N, (void)K;
#endif
}

}  // namespace mlex
