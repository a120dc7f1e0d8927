// See cpu_gemm.h.
// GCC 12 flags the undefined pass-through operand of its own AVX-512 unpack intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "cpu_gemm.h"

#include "ablation.h"
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

// Elements at, at + stride, …, at + 15 · stride of a scale (or bias) array of `dtype`, as floats
// (exact: vcvtph2ps, or a bfloat16's bits shifted into place).
__attribute__((target("avx512f"))) inline __m512 sixteen_rows(const void* p, ScaleDtype dtype, size_t at,
                                                               size_t stride) {
  if (dtype == ScaleDtype::F32) {
    alignas(64) float v[16];
    for (int i = 0; i < 16; ++i) v[i] = static_cast<const float*>(p)[at + i * stride];
    return _mm512_load_ps(v);
  }
  alignas(32) uint16_t h[16];
  for (int i = 0; i < 16; ++i) h[i] = static_cast<const uint16_t*>(p)[at + i * stride];
  const __m256i raw = _mm256_load_si256(reinterpret_cast<const __m256i*>(h));
  if (dtype == ScaleDtype::F16) return _mm512_cvtph_ps(raw);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// r[t] becomes column t of the 16×16 block of 32-bit values whose rows were r[0..16).
__attribute__((target("avx512f"))) inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4a + c]: rows 4a .. 4a + 3 of columns c, c + 4, c + 8, c + 12 (one per 128-bit lane).
  for (int a = 0; a < 16; a += 4) {
    u[a] = _mm512_unpacklo_epi64(t[a], t[a + 2]);
    u[a + 1] = _mm512_unpackhi_epi64(t[a], t[a + 2]);
    u[a + 2] = _mm512_unpacklo_epi64(t[a + 1], t[a + 3]);
    u[a + 3] = _mm512_unpackhi_epi64(t[a + 1], t[a + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i lo_a = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), hi_a = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xDD);
    const __m512i lo_b = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88),
                  hi_b = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xDD);
    r[c] = _mm512_shuffle_i32x4(lo_a, lo_b, 0x88);
    r[c + 8] = _mm512_shuffle_i32x4(lo_a, lo_b, 0xDD);
    r[c + 4] = _mm512_shuffle_i32x4(hi_a, hi_b, 0x88);
    r[c + 12] = _mm512_shuffle_i32x4(hi_a, hi_b, 0xDD);
  }
}

// pack for 4 bits with AVX-512 and rows a multiple of 16 (every superpanel of the models' weights):
// the same panels, values and bits (scale · q + bias, one rounding), about 5× faster, which is what
// a short prompt's prefill spends most in (the dequantization is once per weight per chunk). A
// 4-bit word holds eight consecutive k of one row, so sixteen rows' words for sixteen k-blocks
// are loaded as a 16×16 block of words and transposed in registers; each word lane then yields
// eight k-rows of sixteen values by a shift and a mask.
// scales/biases: row n0 + j's group g at [j · stride + g], as stored (dtype: float32, float16 or
// bfloat16, widened here: the sixteen rows' values for the block's groups are gathered anyway).
__attribute__((target("avx512f"))) void pack_q4_avx512(const void* scales, const void* biases, ScaleDtype dtype,
                                                       size_t stride, const uint32_t* w, int K, int group_size, int n0,
                                                       int rows, int k0, int kc, int nr, float* wt) {
  const size_t row_words = static_cast<size_t>(K) / 8;
  const int padded = (rows + nr - 1) / nr * nr;
  const int words = kc / 8, g_first = k0 / group_size, groups = (k0 + kc - 1) / group_size + 1 - g_first;
  const __m512i nibble = _mm512_set1_epi32(0xF);
  alignas(64) float sv[16 * 16], bv[16 * 16];  // [group of the block][row]: groups <= kc / 8 + 1 <= 33
  std::vector<float> sv_heap, bv_heap;
  float *sp = sv, *bp = bv;
  if (groups > 16) {
    sv_heap.resize(static_cast<size_t>(groups) * 16);
    bv_heap.resize(static_cast<size_t>(groups) * 16);
    sp = sv_heap.data(), bp = bv_heap.data();
  }
  for (int j0 = 0; j0 < padded; j0 += 16) {
    float* panel = wt + static_cast<size_t>(j0 / nr) * kc * nr + (j0 % nr);
    if (j0 >= rows) {  // past the last row: zeros, as the micro-kernels read whole panels
      for (int k = 0; k < kc; ++k) _mm512_storeu_ps(panel + static_cast<size_t>(k) * nr, _mm512_setzero_ps());
      continue;
    }
    for (int g = 0; g < groups; ++g) {
      const size_t at = static_cast<size_t>(j0) * stride + g_first + g;
      _mm512_store_ps(sp + g * 16, sixteen_rows(scales, dtype, at, stride));
      _mm512_store_ps(bp + g * 16, sixteen_rows(biases, dtype, at, stride));
    }
    const uint32_t* row0 = w + static_cast<size_t>(n0 + j0) * row_words + k0 / 8;
    for (int b0 = 0; b0 < words; b0 += 16) {
      const int count = std::min(16, words - b0);
      const __mmask16 live = static_cast<__mmask16>((1u << count) - 1);
      __m512i r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_maskz_loadu_epi32(live, row0 + i * row_words + b0);
      transpose16(r);
      for (int t = 0; t < count; ++t) {
        const int k = (b0 + t) * 8;
        const int g = (k0 + k) / group_size - g_first;
        const __m512 s = _mm512_load_ps(sp + g * 16), b = _mm512_load_ps(bp + g * 16);
        float* dst = panel + static_cast<size_t>(k) * nr;
        for (int j = 0; j < 8; ++j) {
          const __m512i q = _mm512_and_si512(_mm512_srli_epi32(r[t], 4 * j), nibble);
          _mm512_storeu_ps(dst + j * nr, _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(q), b));
        }
      }
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
    if (bits == 4 && nr == kNr512 && rows % 16 == 0 && !mlex::ablated(MLEX_ABLATE_KERNEL_CPU_PACK_Q4)) {
      const size_t at = static_cast<size_t>(n0) * scales.groups * (scales.dtype == ScaleDtype::F32 ? 4 : 2);
      return pack_q4_avx512(static_cast<const char*>(scales.scales) + at, static_cast<const char*>(scales.biases) + at,
                            scales.dtype, scales.groups, w, K, group_size, n0, rows, k0, kc, nr, wt);
    }
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
