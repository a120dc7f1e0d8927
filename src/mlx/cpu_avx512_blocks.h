// What the AVX-512 matrix-vector kernels (cpu_matvec_avx512.cpp, float activations, and
// cpu_matvec_vnni.cpp, 8-bit activations) share: how a block of weight rows' scales and biases
// are read and how each (weight row, x row)'s bias term Σ_g bias_g · Σ_{i∈g} x_i is summed. One
// source, so both kernels read the same scales the same way.
#pragma once

#include "cpu_matvec_avx512.h"
#include "cpu_scales.h"
#include "cpu_simd.h"

#ifdef MLEX_X86_64

namespace mlex {

namespace avx512 {

// Sixteen scales (or biases) from p as floats; lanes past n are zero.
template <ScaleDtype SD>
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 load16(const void* p, int n) {
  const __mmask16 k = static_cast<__mmask16>((1u << n) - 1);
  if constexpr (SD == ScaleDtype::F32) {
    return _mm512_maskz_loadu_ps(k, p);
  } else if constexpr (SD == ScaleDtype::F16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p));
  } else {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p)), 16));
  }
}

// Rows of x go through the kernels MX at a time: each unpacked weight block serves MX rows.
// Per (weight row, x row) the operations and their order do not depend on R or MX, so every
// output is the same bits whichever block or batch it is computed in.
struct Xs {
  const float* x;     // the first row, as the kernel takes it
  size_t x_stride;    // between rows of x
  const float* xsum;  // the first row's Σ x per group
  size_t xsum_stride;
  float* out;  // the first row's first output
  size_t out_stride;
};

// A block's scales as floats (sc[r][g]) and each (weight row, x row)'s Σ_g bias_g · Σ_{i∈g} x_i
// (bsum[r][m], sixteen groups at a time), after asking for the next block's scales and biases:
// this block's products hide their latency.
template <int R, int MX, ScaleDtype SD>
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) inline void block_scales(const char* s, const char* b,
                                                                                  int groups, const Xs& xs,
                                                                                  float (*sc)[kAvx512MaxGroups],
                                                                                  float (*bsum)[4]) {
  constexpr size_t elem = SD == ScaleDtype::F32 ? 4 : 2;
  const size_t scale_row = static_cast<size_t>(groups) * elem;
  for (size_t i = 0; i < R * scale_row; i += 64) {
    _mm_prefetch(s + R * scale_row + i, _MM_HINT_T0);
    _mm_prefetch(b + R * scale_row + i, _MM_HINT_T0);
  }
  __m512 bt[R][MX];
  _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
    _Pragma("GCC unroll 4") for (int m = 0; m < MX; ++m) bt[r][m] = _mm512_setzero_ps();
  }
  for (int g = 0; g < groups; g += 16) {
    const int n = groups - g < 16 ? groups - g : 16;
    const __mmask16 k = static_cast<__mmask16>((1u << n) - 1);
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
      _mm512_store_ps(sc[r] + g, load16<SD>(s + r * scale_row + g * elem, n));
      const __m512 bias = load16<SD>(b + r * scale_row + g * elem, n);
      _Pragma("GCC unroll 4") for (int m = 0; m < MX; ++m) {
        bt[r][m] = _mm512_fmadd_ps(bias, _mm512_maskz_loadu_ps(k, xs.xsum + m * xs.xsum_stride + g), bt[r][m]);
      }
    }
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
    _Pragma("GCC unroll 4") for (int m = 0; m < MX; ++m) bsum[r][m] = hsum512(bt[r][m]);
  }
}

}  // namespace avx512
}  // namespace mlex

#endif
