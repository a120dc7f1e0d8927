// Quantization scales and biases as the CPU kernels read them. A checkpoint stores them in 16
// bits (float16 or bfloat16) and on the CPU, where the model computes in float32, they are kept
// so: decode is memory-bound and float32 scales and biases are 8 bytes per group of 32 4-bit
// weights (16 bytes), half as much again as the weights. The kernels widen a block of weight
// rows' scales and biases at a time into a small float buffer (exactly: every 16-bit float is a
// float32), so their arithmetic, and its results, are those of float32 scales.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_simd.h"

namespace mlex {

enum class ScaleDtype { F32, F16, BF16 };

// float16 → float32, exactly (normal, subnormal, zero, inf, nan), without F16C.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else {
    const float f = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant · 2^-24, exact
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

#ifdef MLEX_X86_64
// As has_avx2_fma (and so off under MLEX_CPU_QMM_SCALAR, which tests the portable paths).
inline bool has_f16c() {
  static const bool yes = __builtin_cpu_supports("f16c") && has_avx2_fma();
  return yes;
}

__attribute__((target("avx2,f16c"))) inline void widen_avx2(const uint16_t* src, ScaleDtype t, int n, float* dst) {
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256 f = t == ScaleDtype::F16 ? _mm256_cvtph_ps(h)
                                          : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    _mm256_storeu_ps(dst + i, f);
  }
  for (; i < n; ++i) dst[i] = t == ScaleDtype::F16 ? _cvtsh_ss(src[i]) : bf16_to_float(src[i]);
}
#endif

// n 16-bit values from src as float32 into dst.
inline void widen(const uint16_t* src, ScaleDtype t, int n, float* dst) {
#ifdef MLEX_X86_64
  if (has_f16c()) return widen_avx2(src, t, n, dst);
#endif
  for (int i = 0; i < n; ++i) dst[i] = t == ScaleDtype::F16 ? half_to_float(src[i]) : bf16_to_float(src[i]);
}

// The scales and biases of a [rows, groups] quantized matrix, in their stored dtype.
struct ScaleRows {
  const void* scales;
  const void* biases;
  ScaleDtype dtype;
  int groups;

  // Rows a kernel widens at once: one call per block, not per row (a 576-wide row has 18
  // groups, and a call per row cost more than the bytes it saved), into a buffer that stays in L1.
  static constexpr int kBlock = 64;

  // A thread's buffers for a block's widened scales and biases (unused for float32), and where
  // the current block's rows start.
  struct Buffer {
    std::vector<float> s, b;
    const float* block_s = nullptr;
    const float* block_b = nullptr;
  };

  // Rows n0 .. n0 + count (count ≤ kBlock) as floats, row n0 + i's at s + i · groups: the
  // stored ones for float32, else widened into `buf`.
  void rows(size_t n0, int count, Buffer& buf, const float*& s, const float*& b) const {
    const size_t at = n0 * static_cast<size_t>(groups), n = static_cast<size_t>(count) * groups;
    if (dtype == ScaleDtype::F32) {
      s = static_cast<const float*>(scales) + at;
      b = static_cast<const float*>(biases) + at;
      return;
    }
    if (buf.s.size() < n) {
      buf.s.resize(n);
      buf.b.resize(n);
    }
    widen(static_cast<const uint16_t*>(scales) + at, dtype, static_cast<int>(n), buf.s.data());
    widen(static_cast<const uint16_t*>(biases) + at, dtype, static_cast<int>(n), buf.b.data());
    s = buf.s.data();
    b = buf.b.data();
  }

  // Row n's scales and biases for a thread walking rows lo .. hi in order: a block of rows is
  // widened when n starts one.
  void row(int lo, int hi, int n, Buffer& buf, const float*& s, const float*& b) const {
    const int i = (n - lo) % kBlock;
    if (i == 0) rows(static_cast<size_t>(n), std::min(kBlock, hi - n), buf, buf.block_s, buf.block_b);
    s = buf.block_s + static_cast<size_t>(i) * groups;
    b = buf.block_b + static_cast<size_t>(i) * groups;
  }
};

}  // namespace mlex
