// What our CPU kernels share about x86 SIMD: whether AVX2/FMA may be used (checked once at run
// time, so one binary runs on any x86-64), and a horizontal sum. Code using them is compiled with
// `__attribute__((target("avx2,fma")))` and guarded by MLEX_X86_64 and has_avx2_fma().
#pragma once

#include <cstdint>
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

// The AVX-512 subset our AVX-512 kernels use (F, BW, VL), where the CPU and OS have it; off under
// MLEX_CPU_NO_AVX512 (tests of the AVX2 kernels on a machine that has AVX-512; the benchmarks'
// ablation) and MLEX_CPU_QMM_SCALAR.
inline bool has_avx512() {
  static const bool yes = has_avx2_fma() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && std::getenv("MLEX_CPU_NO_AVX512") == nullptr;
  return yes;
}

// has_avx512 and AVX-512 VBMI (byte permutes and bit-field extraction: Ice Lake and later).
inline bool has_avx512_vbmi() {
  static const bool yes = has_avx512() && __builtin_cpu_supports("avx512vbmi");
  return yes;
}

__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// The sum of v's lanes. (GCC 12's _mm512_reduce_add_ps and lane shuffles trip -Wuninitialized
// in its own headers; a store and two half loads do not.)
__attribute__((target("avx512f,avx2"))) inline float hsum512(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  return hsum(_mm256_add_ps(_mm256_load_ps(t), _mm256_load_ps(t + 8)));
}

// a · b over n floats.
__attribute__((target("avx2,fma"))) inline float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  float t = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) t += a[i] * b[i];
  return t;
}

// acc += p · v
__attribute__((target("avx2,fma"))) inline void axpy_avx2(float p, const float* v, float* acc, int64_t n) {
  const __m256 pv = _mm256_set1_ps(p);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + i), _mm256_loadu_ps(acc + i)));
  for (; i < n; ++i) acc[i] += p * v[i];
}
#endif

}  // namespace mlex
