// See cpu_matvec_avx512.h.
// GCC 12's own AVX-512 headers trip this warning (_mm512_undefined_epi32 in _mm512_cvtepu8_epi32).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "cpu_matvec_avx512.h"

#include "cpu_avx512_blocks.h"

#include <algorithm>
#include <type_traits>


namespace mlex {

#ifdef MLEX_X86_64

namespace {

using avx512::block_scales;
using avx512::Xs;

// How far ahead of each row's reads to prefetch, in bytes: about four 576-wide 4-bit rows, which
// measured best of 512, 1152 and 2304 on the CI machine (a four-row block's rows are four
// interleaved streams).
constexpr int kPrefetch4 = 1152;
constexpr int kPrefetch8 = 2304;

// R weight rows of 4 or 8 bits against MX rows of x.
template <int R, int MX, int BITS, ScaleDtype SD>
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void rows_kernel(const uint8_t* w, size_t row_bytes,
                                                                            const char* s, const char* b, int groups,
                                                                            int group_size, const Xs& xs, int K) {
  alignas(64) float sc[R][kAvx512MaxGroups];
  float bsum[R][4];
  block_scales<R, MX, SD>(s, b, groups, xs, sc, bsum);
  __m512 t[R][MX];
  _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
    _Pragma("GCC unroll 4") for (int m = 0; m < MX; ++m) t[r][m] = _mm512_setzero_ps();
  }
  // 4-bit values to floats by table lookup (vpermps reads only an index's low four bits): one
  // instruction for the low nibble instead of an AND and a conversion (6 % faster in isolation).
  const __m512 to_float = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const int blocks = K / 32, per_group = group_size / 32;
  int g = 0, in_group = 0;  // the group of block j, without a division per block
  for (int j = 0; j < blocks; ++j) {
    __m512 x0[MX], x1[MX];
    _Pragma("GCC unroll 4") for (int m = 0; m < MX; ++m) {
      x0[m] = _mm512_loadu_ps(xs.x + m * xs.x_stride + 32 * j);
      x1[m] = _mm512_loadu_ps(xs.x + m * xs.x_stride + 32 * j + 16);
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
      __m512 lo, hi;
      if constexpr (BITS == 4) {
        const uint8_t* p = w + r * row_bytes + 16 * static_cast<size_t>(j);
        if ((j & 3) == 0) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch4), _MM_HINT_T0);
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        lo = _mm512_permutexvar_ps(v, to_float);
        hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), to_float);
      } else {
        const uint8_t* p = w + r * row_bytes + 32 * static_cast<size_t>(j);
        if ((j & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch8), _MM_HINT_T0);
        lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
        hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16))));
      }
      const __m512 scale = _mm512_set1_ps(sc[r][g]);
      _Pragma("GCC unroll 4") for (int m = 0; m < MX; ++m) {
        const __m512 a = _mm512_fmadd_ps(hi, x1[m], _mm512_mul_ps(lo, x0[m]));
        t[r][m] = _mm512_fmadd_ps(a, scale, t[r][m]);
      }
    }
    if (++in_group == per_group) {
      in_group = 0;
      ++g;
    }
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
    _Pragma("GCC unroll 4") for (int m = 0; m < MX; ++m) xs.out[m * xs.out_stride + r] = hsum512(t[r][m]) + bsum[r][m];
  }
}

// R weight rows of 2, 3, 5 or 6 bits (MLX packs a row as one little-endian bit stream: eight
// values in BITS bytes) against MX rows of x as they are. A block of 32 values is 4·BITS bytes:
// vpermb puts each eight values' BITS bytes in a 64-bit lane, vpmultishiftqb pulls the eight
// BITS-bit fields out of each lane into bytes (AVX-512 VBMI), then they widen to floats as the
// 8-bit ones do.
template <int R, int MX, int BITS, ScaleDtype SD>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,fma"))) void rows_kernel_bits(
    const uint8_t* w, size_t row_bytes, const char* s, const char* b, int groups, int group_size, const Xs& xs, int K) {
  alignas(64) float sc[R][kAvx512MaxGroups];
  float bsum[R][4];
  block_scales<R, MX, SD>(s, b, groups, xs, sc, bsum);
  __m512 t[R][MX];
  _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
    _Pragma("GCC unroll 4") for (int m = 0; m < MX; ++m) t[r][m] = _mm512_setzero_ps();
  }
  alignas(32) uint8_t gather[32], shifts[32];
  for (int lane = 0; lane < 4; ++lane) {
    for (int k = 0; k < 8; ++k) {
      gather[8 * lane + k] = static_cast<uint8_t>(std::min(lane * BITS + k, 4 * BITS - 1));
      shifts[8 * lane + k] = static_cast<uint8_t>(k * BITS);
    }
  }
  const __m256i gather_v = _mm256_load_si256(reinterpret_cast<const __m256i*>(gather));
  const __m256i shifts_v = _mm256_load_si256(reinterpret_cast<const __m256i*>(shifts));
  const __m256i field = _mm256_set1_epi8(static_cast<char>((1 << BITS) - 1));
  const __mmask32 block_bytes = (1u << (4 * BITS)) - 1;
  const int blocks = K / 32, per_group = group_size / 32;
  int g = 0, in_group = 0;
  for (int j = 0; j < blocks; ++j) {
    __m512 x0[MX], x1[MX];
    _Pragma("GCC unroll 4") for (int m = 0; m < MX; ++m) {
      x0[m] = _mm512_loadu_ps(xs.x + m * xs.x_stride + 32 * j);
      x1[m] = _mm512_loadu_ps(xs.x + m * xs.x_stride + 32 * j + 16);
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
      const uint8_t* p = w + r * row_bytes + 4 * BITS * static_cast<size_t>(j);
      if ((j & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch8), _MM_HINT_T0);
      const __m256i bytes = _mm256_maskz_loadu_epi8(block_bytes, p);  // never past this block
      const __m256i q = _mm256_and_si256(
          _mm256_multishift_epi64_epi8(shifts_v, _mm256_permutexvar_epi8(gather_v, bytes)), field);
      const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(q)));
      const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(q, 1)));
      const __m512 scale = _mm512_set1_ps(sc[r][g]);
      _Pragma("GCC unroll 4") for (int m = 0; m < MX; ++m) {
        const __m512 a = _mm512_fmadd_ps(hi, x1[m], _mm512_mul_ps(lo, x0[m]));
        t[r][m] = _mm512_fmadd_ps(a, scale, t[r][m]);
      }
    }
    if (++in_group == per_group) {
      in_group = 0;
      ++g;
    }
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
    _Pragma("GCC unroll 4") for (int m = 0; m < MX; ++m) xs.out[m * xs.out_stride + r] = hsum512(t[r][m]) + bsum[r][m];
  }
}

// Weight rows in blocks of four (the last ones one at a time) against MX rows of x.
template <int MX, int BITS, ScaleDtype SD>
void rows_mx(const uint8_t* w, size_t row_bytes, const char* s, const char* b, int groups, int group_size, Xs xs,
             int K, int rows) {
  const size_t scale_row = static_cast<size_t>(groups) * (SD == ScaleDtype::F32 ? 4 : 2);
  auto kernel = [&](auto r_count, int r) {
    constexpr int R = decltype(r_count)::value;
    Xs at = xs;
    at.out += r;
    const char *sr = s + r * scale_row, *br = b + r * scale_row;
    if constexpr (BITS == 4 || BITS == 8) {
      rows_kernel<R, MX, BITS, SD>(w + r * row_bytes, row_bytes, sr, br, groups, group_size, at, K);
    } else {
      rows_kernel_bits<R, MX, BITS, SD>(w + r * row_bytes, row_bytes, sr, br, groups, group_size, at, K);
    }
  };
  int r = 0;
  for (; r + 4 <= rows; r += 4) kernel(std::integral_constant<int, 4>{}, r);
  for (; r < rows; ++r) kernel(std::integral_constant<int, 1>{}, r);
}

// Rows of x four at a time (the last ones in a smaller group), each block of weight rows in
// cache for all of them.
template <int BITS, ScaleDtype SD>
void rows_all(const uint8_t* w, size_t row_bytes, const char* s, const char* b, int groups, int group_size, Xs xs,
              int M, int K, int rows) {
  for (int m = 0; m < M; m += 4) {
    Xs at = xs;
    at.x += m * xs.x_stride;
    at.xsum += m * xs.xsum_stride;
    at.out += m * xs.out_stride;
    switch (std::min(4, M - m)) {
      case 4: rows_mx<4, BITS, SD>(w, row_bytes, s, b, groups, group_size, at, K, rows); break;
      case 3: rows_mx<3, BITS, SD>(w, row_bytes, s, b, groups, group_size, at, K, rows); break;
      case 2: rows_mx<2, BITS, SD>(w, row_bytes, s, b, groups, group_size, at, K, rows); break;
      default: rows_mx<1, BITS, SD>(w, row_bytes, s, b, groups, group_size, at, K, rows); break;
    }
  }
}

template <int BITS>
void rows_typed(const uint8_t* w, size_t row_bytes, const void* s, const void* b, ScaleDtype dtype, int groups,
                int group_size, const Xs& xs, int M, int K, int rows) {
  const char* sc = static_cast<const char*>(s);
  const char* bc = static_cast<const char*>(b);
  switch (dtype) {
    case ScaleDtype::F32: return rows_all<BITS, ScaleDtype::F32>(w, row_bytes, sc, bc, groups, group_size, xs, M, K, rows);
    case ScaleDtype::F16: return rows_all<BITS, ScaleDtype::F16>(w, row_bytes, sc, bc, groups, group_size, xs, M, K, rows);
    case ScaleDtype::BF16: return rows_all<BITS, ScaleDtype::BF16>(w, row_bytes, sc, bc, groups, group_size, xs, M, K, rows);
  }
}

}  // namespace

void deinterleave_x_q4(const float* x, int K, float* out) {
  for (int j = 0; j + 32 <= K; j += 32) {
    for (int i = 0; i < 16; ++i) {
      out[j + i] = x[j + 2 * i];
      out[j + 16 + i] = x[j + 2 * i + 1];
    }
  }
}

void matvec_rows_avx512(const uint8_t* w, size_t row_bytes, const void* s, const void* b, ScaleDtype dtype,
                        int groups, int group_size, int bits, const float* xk, const float* xsum, int M, int K,
                        int rows, float* out, size_t out_stride) {
  const Xs xs{xk, static_cast<size_t>(K), xsum, static_cast<size_t>(groups), out, out_stride};
  switch (bits) {
    case 2: return rows_typed<2>(w, row_bytes, s, b, dtype, groups, group_size, xs, M, K, rows);
    case 3: return rows_typed<3>(w, row_bytes, s, b, dtype, groups, group_size, xs, M, K, rows);
    case 4: return rows_typed<4>(w, row_bytes, s, b, dtype, groups, group_size, xs, M, K, rows);
    case 5: return rows_typed<5>(w, row_bytes, s, b, dtype, groups, group_size, xs, M, K, rows);
    case 6: return rows_typed<6>(w, row_bytes, s, b, dtype, groups, group_size, xs, M, K, rows);
    default: return rows_typed<8>(w, row_bytes, s, b, dtype, groups, group_size, xs, M, K, rows);
  }
}

#else

void deinterleave_x_q4(const float*, int, float*) {}
void matvec_rows_avx512(const uint8_t*, size_t, const void*, const void*, ScaleDtype, int, int, int, const float*,
                        const float*, int, int, int, float*, size_t) {}

#endif

}  // namespace mlex
