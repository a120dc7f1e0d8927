// What our CPU kernels share about x86 SIMD: whether AVX2/FMA may be used (checked once at run
// time, so one binary runs on any x86-64), and a horizontal sum. Code using them is compiled with
// `__attribute__((target("avx2,fma")))` and guarded by MLEX_X86_64 and has_avx2_fma().
#pragma once

#include <cstdlib>

#if defined(__x86_64__)
#include <immintrin.h>
#define MLEX_X86_64 1
#endif

namespace mlex {

#ifdef MLEX_X86_64
// MLEX_CPU_QMM_SCALAR: tests of the portable paths on a machine that has AVX2.
inline bool has_avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          std::getenv("MLEX_CPU_QMM_SCALAR") == nullptr;
  return yes;
}

__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
#endif

}  // namespace mlex
