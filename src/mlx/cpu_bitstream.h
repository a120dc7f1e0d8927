// Reading MLX's packed quantized rows eight values at a time on x86, shared by the CPU row
// kernels (cpu_quantized_matmul.cpp) and the prompt GEMM (cpu_gemm.cpp). MLX packs a
// row as one little-endian bit stream, value i in bits [i·bits, (i+1)·bits): eight values take
// exactly `bits` bytes and start on a byte (group sizes are multiples of 8).
#pragma once

#include <cstdint>
#include <cstring>

#include "cpu_simd.h"

namespace mlex {

// Per-lane shifts for one bit width (plain ints: made on any CPU, once per matmul). For 2 to 6
// bits every value of a chunk ends within bit 48: lanes whose value ends in the low 32 bits shift
// the low word, the others the word from bit 16.
struct BitLanes {
  alignas(32) int32_t shift_lo[8];
  alignas(32) int32_t shift_hi[8];
  alignas(32) int32_t use_hi[8];
  int bits;
  explicit BitLanes(int b) : bits(b) {
    for (int j = 0; j < 8; ++j) {
      const int at = j * b;
      const bool high = at + b > 32;
      shift_lo[j] = high ? 0 : at;
      shift_hi[j] = high ? at - 16 : 0;
      use_hi[j] = high ? -1 : 0;
    }
  }
};

#ifdef MLEX_X86_64

// BitLanes in registers, for a kernel's loop.
struct BitLanesAvx2 {
  __m256i shift_lo, shift_hi, use_hi, mask;
  int bits;
  __attribute__((target("avx2,fma"))) explicit BitLanesAvx2(const BitLanes& l) : bits(l.bits) {
    shift_lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(l.shift_lo));
    shift_hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(l.shift_hi));
    use_hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(l.use_hi));
    mask = _mm256_set1_epi32((1 << l.bits) - 1);
  }

  // The eight values of the chunk at `chunk` as floats. `wide`: eight bytes may be read there
  // (it is not the end of the weights); fixed-size copies are single loads, where a variable size
  // would be a library call per eight values.
  __attribute__((target("avx2,fma"))) __m256 values(const uint8_t* chunk, bool wide) const {
    uint64_t v = 0;
    if (bits == 4) {
      uint32_t u;
      std::memcpy(&u, chunk, 4);
      v = u;
    } else if (bits == 8 || wide) {
      std::memcpy(&v, chunk, 8);  // bits past the chunk's are never selected by a lane
    } else {
      std::memcpy(&v, chunk, static_cast<size_t>(bits));
    }
    if (bits == 8) return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(v))));
    const __m256i l = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(v))), shift_lo);
    const __m256i h = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(v >> 16))), shift_hi);
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_blendv_epi8(l, h, use_hi), mask));
  }
};

#endif

}  // namespace mlex
