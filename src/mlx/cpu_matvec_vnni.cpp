// See cpu_matvec_vnni.h.
// GCC 12's own AVX-512 headers trip this warning (_mm512_undefined_* in casts and broadcasts).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "cpu_matvec_vnni.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu_avx512_blocks.h"
#include "cpu_simd.h"

namespace mlex {

#ifdef MLEX_X86_64

bool has_avx512_vnni() {
  static const bool yes = has_avx512() && __builtin_cpu_supports("avx512vnni");
  return yes;
}

namespace {

// As the float kernel's (cpu_matvec_avx512.cpp): about four 576-wide 4-bit rows ahead.
constexpr int kPrefetch4 = 1152;
constexpr int kPrefetch8 = 2304;

struct X8 {
  const int8_t* q;  // the first row of x as quantize_x_int8 wrote it
  size_t q_stride;
  const float* d;  // its block scales
  size_t d_stride;
  const float* xsum;  // its exact Σ x per group
  size_t xsum_stride;
  float* out;
  size_t out_stride;
  int pairs;
};

// For R weight rows and MX rows of x: each pair j's four factors [c_A, c_B, c_A/16, c_B/16] (c =
// the block's group scale · the block's d; the last two for the 4-bit kernel's high nibbles) at
// c + (r·MX + m)·cs + 4j; and t[r][m] starts as the lanes of Σ_g bias_g · Σ_{i∈g} x_i.
template <int R, int MX, ScaleDtype SD>
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) inline void pair_factors(const char* s, const char* b,
                                                                                    int groups, int group_size,
                                                                                    const X8& xs, float* c, size_t cs,
                                                                                    __m512 (*t)[MX]) {
  constexpr size_t elem = SD == ScaleDtype::F32 ? 4 : 2;
  const size_t scale_row = static_cast<size_t>(groups) * elem;
  for (size_t i = 0; i < R * scale_row; i += 64) {
    _mm_prefetch(s + R * scale_row + i, _MM_HINT_T0);
    _mm_prefetch(b + R * scale_row + i, _MM_HINT_T0);
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
    _Pragma("GCC unroll 4") for (int m = 0; m < MX; ++m) t[r][m] = _mm512_setzero_ps();
  }
  for (int g = 0; g < groups; g += 16) {
    const int n = std::min(16, groups - g);
    const __mmask16 k = static_cast<__mmask16>((1u << n) - 1);
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
      const __m512 bias = avx512::load16<SD>(b + r * scale_row + g * elem, n);
      _Pragma("GCC unroll 4") for (int m = 0; m < MX; ++m) {
        t[r][m] = _mm512_fmadd_ps(bias, _mm512_maskz_loadu_ps(k, xs.xsum + m * xs.xsum_stride + g), t[r][m]);
      }
    }
  }
  // Sixteen blocks at a time: their group scales (lane i ← group i / per), times the blocks' d,
  // interleaved with a sixteenth of themselves into eight pairs' factors.
  const int per = group_size / 32;
  const __m512i expand = _mm512_srlv_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(__builtin_ctz(static_cast<unsigned>(per))));
  const __m512i lo_idx = _mm512_setr_epi32(0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23);
  const __m512i hi_idx = _mm512_setr_epi32(8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31);
  const __m512 sixteenth = _mm512_set1_ps(1.0f / 16);
  for (int b0 = 0; b0 < 2 * xs.pairs; b0 += 16) {
    const int g0 = b0 / per;
    // Pairs left from b0: the second half's factors are written only if there are any.
    const bool second = 2 * xs.pairs - b0 > 8;
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
      __m512 sv = avx512::load16<SD>(s + r * scale_row + g0 * elem, std::min(16, groups - g0));
      if (per > 1) sv = _mm512_permutexvar_ps(expand, sv);
      _Pragma("GCC unroll 4") for (int m = 0; m < MX; ++m) {
        const __m512 cb = _mm512_mul_ps(sv, _mm512_loadu_ps(xs.d + m * xs.d_stride + b0));
        const __m512 cb16 = _mm512_mul_ps(cb, sixteenth);
        float* at = c + (r * MX + m) * cs + 2 * b0;
        _mm512_storeu_ps(at, _mm512_permutex2var_ps(cb, lo_idx, cb16));
        if (second) _mm512_storeu_ps(at + 16, _mm512_permutex2var_ps(cb, hi_idx, cb16));
      }
    }
  }
}

// R weight rows of 4 or 8 bits against MX rows of 8-bit x. `c`: room for pair_factors.
template <int R, int MX, int BITS, ScaleDtype SD>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma"))) void rows_kernel(const uint8_t* w,
                                                                                     size_t row_bytes, const char* s,
                                                                                     const char* b, int groups,
                                                                                     int group_size, const X8& xs,
                                                                                     int K, float* c) {
  const size_t cs = 2 * xs.d_stride;
  __m512 t[R][MX];
  pair_factors<R, MX, SD>(s, b, groups, group_size, xs, c, cs, t);
  // Low nibbles in the lower 32 bytes, high nibbles (16× their value) in the upper 32.
  const __m512i nibbles = _mm512_inserti64x4(_mm512_set1_epi8(0x0F), _mm256_set1_epi8(static_cast<char>(0xF0)), 1);
  // Which factor each 32-bit lane of a pair's sums takes (its four bytes are of one block).
  const __m512i factor = BITS == 4 ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
                                   : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  // The pairs whose 64 values are all in the row, then a last lone block if K / 32 is odd.
  const int full = K / 64;
  for (int j = 0; j < xs.pairs; ++j) {
    const bool last = j == full;
    __m512i xm[MX];
    _Pragma("GCC unroll 4") for (int m = 0; m < MX; ++m) xm[m] = _mm512_loadu_si512(xs.q + m * xs.q_stride + 64 * j);
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
      __m512i wv;
      if constexpr (BITS == 4) {
        const uint8_t* p = w + r * row_bytes + 32 * static_cast<size_t>(j);
        if ((j & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch4), _MM_HINT_T0);
        // A last lone block has 16 bytes: never read past the row.
        const __m256i bytes = last ? _mm256_maskz_loadu_epi8(0xFFFF, p) : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        wv = _mm512_and_si512(_mm512_broadcast_i64x4(bytes), nibbles);
      } else {
        const uint8_t* p = w + r * row_bytes + 64 * static_cast<size_t>(j);
        _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch8), _MM_HINT_T0);
        wv = last ? _mm512_maskz_loadu_epi8(0xFFFFFFFFull, p) : _mm512_loadu_si512(p);
      }
      _Pragma("GCC unroll 4") for (int m = 0; m < MX; ++m) {
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, xm[m]);
        const __m512 cv =
            _mm512_permutexvar_ps(factor, _mm512_castps128_ps512(_mm_loadu_ps(c + (r * MX + m) * cs + 4 * j)));
        t[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), cv, t[r][m]);
      }
    }
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
    _Pragma("GCC unroll 4") for (int m = 0; m < MX; ++m) xs.out[m * xs.out_stride + r] = hsum512(t[r][m]);
  }
}

// Weight rows in blocks of four (the last ones one at a time) against MX rows of x.
template <int MX, int BITS, ScaleDtype SD>
void rows_mx(const uint8_t* w, size_t row_bytes, const char* s, const char* b, int groups, int group_size, X8 xs,
             int K, int rows, float* c) {
  const size_t scale_row = static_cast<size_t>(groups) * (SD == ScaleDtype::F32 ? 4 : 2);
  int r = 0;
  for (; r + 4 <= rows; r += 4) {
    X8 at = xs;
    at.out += r;
    rows_kernel<4, MX, BITS, SD>(w + r * row_bytes, row_bytes, s + r * scale_row, b + r * scale_row, groups,
                                 group_size, at, K, c);
  }
  for (; r < rows; ++r) {
    X8 at = xs;
    at.out += r;
    rows_kernel<1, MX, BITS, SD>(w + r * row_bytes, row_bytes, s + r * scale_row, b + r * scale_row, groups,
                                 group_size, at, K, c);
  }
}

template <int BITS, ScaleDtype SD>
void rows_all(const uint8_t* w, size_t row_bytes, const void* s, const void* b, int groups, int group_size,
              const X8& xs, int M, int K, int rows) {
  // A thread's room for one block's pair factors: 4 weight rows × 4 rows of x.
  thread_local std::vector<float> c;
  c.resize(16 * 2 * xs.d_stride);
  const char* sc = static_cast<const char*>(s);
  const char* bc = static_cast<const char*>(b);
  for (int m = 0; m < M; m += 4) {
    X8 at = xs;
    at.q += m * xs.q_stride;
    at.d += m * xs.d_stride;
    at.xsum += m * xs.xsum_stride;
    at.out += m * xs.out_stride;
    switch (std::min(4, M - m)) {
      case 4: rows_mx<4, BITS, SD>(w, row_bytes, sc, bc, groups, group_size, at, K, rows, c.data()); break;
      case 3: rows_mx<3, BITS, SD>(w, row_bytes, sc, bc, groups, group_size, at, K, rows, c.data()); break;
      case 2: rows_mx<2, BITS, SD>(w, row_bytes, sc, bc, groups, group_size, at, K, rows, c.data()); break;
      default: rows_mx<1, BITS, SD>(w, row_bytes, sc, bc, groups, group_size, at, K, rows, c.data()); break;
    }
  }
}

template <int BITS>
void rows_typed(const uint8_t* w, size_t row_bytes, const void* s, const void* b, ScaleDtype dtype, int groups,
                int group_size, const X8& xs, int M, int K, int rows) {
  switch (dtype) {
    case ScaleDtype::F32: return rows_all<BITS, ScaleDtype::F32>(w, row_bytes, s, b, groups, group_size, xs, M, K, rows);
    case ScaleDtype::F16: return rows_all<BITS, ScaleDtype::F16>(w, row_bytes, s, b, groups, group_size, xs, M, K, rows);
    case ScaleDtype::BF16: return rows_all<BITS, ScaleDtype::BF16>(w, row_bytes, s, b, groups, group_size, xs, M, K, rows);
  }
}

}  // namespace

__attribute__((target("avx512f,avx512bw,avx512vl"))) void quantize_x_int8(const float* x, int K, int bits, int8_t* q,
                                                                           float* d) {
  const Int8XLayout layout = Int8XLayout::of(K);
  std::memset(q, 0, layout.q_stride);
  std::fill(d, d + layout.d_stride, 0.0f);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (int blk = 0; blk < K / 32; ++blk) {
    const __m512 a = _mm512_loadu_ps(x + 32 * blk), b = _mm512_loadu_ps(x + 32 * blk + 16);
    const __m512 m = _mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b));
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, m);
    float amax = 0.0f;
    for (float v : lanes) amax = std::max(amax, v);
    d[blk] = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    // Round to nearest, ties to even (the default rounding mode), saturating to ±127.
    const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, id));
    const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, id));
    int8_t* pair = q + 64 * (blk / 2);
    const int half = blk & 1;
    if (bits == 4) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pair + 16 * half), _mm512_cvtsepi32_epi8(_mm512_permutex2var_epi32(qa, even, qb)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pair + 32 + 16 * half), _mm512_cvtsepi32_epi8(_mm512_permutex2var_epi32(qa, odd, qb)));
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pair + 32 * half), _mm512_cvtsepi32_epi8(qa));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pair + 32 * half + 16), _mm512_cvtsepi32_epi8(qb));
    }
  }
}

void matvec_rows_vnni(const uint8_t* w, size_t row_bytes, const void* s, const void* b, ScaleDtype dtype, int groups,
                      int group_size, int bits, const int8_t* xq, const float* xd, const float* xsum, int M, int K,
                      int rows, float* out, size_t out_stride) {
  const Int8XLayout layout = Int8XLayout::of(K);
  const X8 xs{xq, layout.q_stride, xd, layout.d_stride, xsum, static_cast<size_t>(groups), out, out_stride, layout.pairs};
  if (bits == 4) return rows_typed<4>(w, row_bytes, s, b, dtype, groups, group_size, xs, M, K, rows);
  return rows_typed<8>(w, row_bytes, s, b, dtype, groups, group_size, xs, M, K, rows);
}

#else

void quantize_x_int8(const float*, int, int, int8_t*, float*) {}
void matvec_rows_vnni(const uint8_t*, size_t, const void*, const void*, ScaleDtype, int, int, int, const int8_t*,
                      const float*, const float*, int, int, int, float*, size_t) {}

#endif

}  // namespace mlex
