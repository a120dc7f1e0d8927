// See cpu_quantized_matmul.h. Layout (MLX's affine quantization): row n of the packed weight
// holds K values of `bits` bits, lowest bits first within each uint32; group g of `group_size`
// values dequantizes as scale[n, g] * q + bias[n, g]. So a dot product with x is
//   Σ_g scale[n, g] · Σ_{i∈g} q_i x_i  +  Σ_g bias[n, g] · Σ_{i∈g} x_i
// and the per-group sums of x are computed once per call and shared by every output row.
#include "cpu_quantized_matmul.h"

#include "cpu_fast_ops.h"

#include "ablation.h"
#include "cpu_bitstream.h"
#include "cpu_primitive.h"
#include "cpu_scales.h"
#include "cpu_gemm.h"
#include "cpu_matvec_avx512.h"
#include "cpu_matvec_vnni.h"
#include "cpu_simd.h"
#include "cpu_strided.h"
#include "cpu_thread_pool.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>


namespace mx = mlx::core;

namespace mlex {
namespace {

// ---- kernels: one output value = Σ_g scale_g · dot(q_g, x_g) + Σ_g bias_g · xsum_g ----

float row_scalar(const uint32_t* wq, const float* scales, const float* biases, const float* x, const float* xsum,
                 int groups, int group_size, int bits) {
  const int per_word = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  float total = 0.f;
  for (int g = 0; g < groups; ++g) {
    const uint32_t* w = wq + g * group_size / per_word;
    const float* xg = x + g * group_size;
    float dot = 0.f;
    for (int i = 0; i < group_size / per_word; ++i) {
      uint32_t word = w[i];
      for (int j = 0; j < per_word; ++j) dot += static_cast<float>((word >> (bits * j)) & mask) * xg[i * per_word + j];
    }
    total += scales[g] * dot + biases[g] * xsum[g];
  }
  return total;
}

// 2, 3, 5 and 6 bits: MLX packs each row as one little-endian bit stream, value i in bits
// [i·bits, (i+1)·bits). Eight values take exactly `bits` bytes, so the row is read in byte-aligned
// chunks of eight values (group sizes are multiples of 8).
inline void unpack8(const uint8_t* chunk, int bits, int32_t* out) {
  uint64_t v = 0;
  std::memcpy(&v, chunk, static_cast<size_t>(bits));  // little-endian hosts (x86-64, arm64)
  const uint64_t mask = (1u << bits) - 1;
  for (int j = 0; j < 8; ++j) out[j] = static_cast<int32_t>((v >> (j * bits)) & mask);
}

float row_bitstream(const uint32_t* wq, const float* scales, const float* biases, const float* x, const float* xsum,
                    int groups, int group_size, int bits) {
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(wq);
  float total = 0.f;
  int32_t q[8];
  for (int g = 0; g < groups; ++g) {
    const float* xg = x + g * group_size;
    float dot = 0.f;
    for (int i = 0; i < group_size; i += 8) {
      unpack8(bytes + static_cast<size_t>(g * group_size + i) / 8 * bits, bits, q);
      for (int j = 0; j < 8; ++j) dot += static_cast<float>(q[j]) * xg[i + j];
    }
    total += scales[g] * dot + biases[g] * xsum[g];
  }
  return total;
}

#ifdef MLEX_X86_64

// How the single-row kernels read a group's scale or bias: float32, or a stored 16-bit value
// widened in a register (F16C / a shift), so a decode step reads 2 bytes instead of 4.
struct ScF32 {
  using T = float;
  static float at(const T* p, int g) { return p[g]; }
};
struct ScF16 {
  using T = uint16_t;
  __attribute__((target("f16c"))) static float at(const T* p, int g) { return _cvtsh_ss(p[g]); }
};
struct ScBF16 {
  using T = uint16_t;
  static float at(const T* p, int g) { return bf16_to_float(p[g]); }
};

// 4-bit: one uint32 = 8 values; broadcast it and shift each lane by 4·lane.
template <class S>
__attribute__((target("avx2,fma,f16c"))) float row_q4_avx2(const uint32_t* wq, const typename S::T* scales,
                                                           const typename S::T* biases, const float* x,
                                                           const float* xsum, int groups, int group_size) {
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i mask = _mm256_set1_epi32(0xF);
  const int words = group_size / 8;
  __m256 total = _mm256_setzero_ps();
  float bias_total = 0.f;
  for (int g = 0; g < groups; ++g) {
    const uint32_t* w = wq + g * words;
    const float* xg = x + g * group_size;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 1 < words; i += 2) {
      __m256i q0 = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w[i])), shifts), mask);
      __m256i q1 = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w[i + 1])), shifts), mask);
      a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q0), _mm256_loadu_ps(xg + 8 * i), a0);
      a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q1), _mm256_loadu_ps(xg + 8 * i + 8), a1);
    }
    for (; i < words; ++i) {
      __m256i q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w[i])), shifts), mask);
      a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_loadu_ps(xg + 8 * i), a0);
    }
    total = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), _mm256_set1_ps(S::at(scales, g)), total);
    bias_total += S::at(biases, g) * xsum[g];
  }
  return hsum(total) + bias_total;
}

// 4-bit for R rows of x at once (a continuous batch's decode step): each word is unpacked once
// and used for every row, so a batch reads and unpacks the weights once per step instead of once
// per request. Per row the arithmetic and its order are row_q4_avx2's exactly (same two
// accumulators, same FMA sequence), so each row's result is bit-identical to it.
template <int R>
__attribute__((target("avx2,fma"))) void rows_q4_avx2(const uint32_t* wq, const float* scales, const float* biases,
                                                      const float* x, size_t x_stride, const float* xsum,
                                                      size_t xsum_stride, int groups, int group_size, float* out,
                                                      size_t out_stride) {
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i mask = _mm256_set1_epi32(0xF);
  const int words = group_size / 8;
  __m256 total[R];
  float bias_total[R];
  _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
    total[r] = _mm256_setzero_ps();
    bias_total[r] = 0.f;
  }
  for (int g = 0; g < groups; ++g) {
    const uint32_t* w = wq + g * words;
    __m256 a0[R], a1[R];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 1 < words; i += 2) {
      const __m256 q0 =
          _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w[i])), shifts), mask));
      const __m256 q1 = _mm256_cvtepi32_ps(
          _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w[i + 1])), shifts), mask));
      _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
        const float* xg = x + r * x_stride + g * group_size;
        a0[r] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(xg + 8 * i), a0[r]);
        a1[r] = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xg + 8 * i + 8), a1[r]);
      }
    }
    for (; i < words; ++i) {
      const __m256 q =
          _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w[i])), shifts), mask));
      _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) a0[r] = _mm256_fmadd_ps(q, _mm256_loadu_ps(x + r * x_stride + g * group_size + 8 * i), a0[r]);
    }
    const __m256 sc = _mm256_set1_ps(scales[g]);
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
      total[r] = _mm256_fmadd_ps(_mm256_add_ps(a0[r], a1[r]), sc, total[r]);
      bias_total[r] += biases[g] * xsum[r * xsum_stride + g];
    }
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) out[r * out_stride] = hsum(total[r]) + bias_total[r];
}

// 8-bit: the bytes are the values in order; widen 8 at a time.
template <class S>
__attribute__((target("avx2,fma,f16c"))) float row_q8_avx2(const uint32_t* wq, const typename S::T* scales,
                                                           const typename S::T* biases, const float* x,
                                                           const float* xsum, int groups, int group_size) {
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(wq);
  __m256 total = _mm256_setzero_ps();
  float bias_total = 0.f;
  for (int g = 0; g < groups; ++g) {
    const uint8_t* w = bytes + g * group_size;
    const float* xg = x + g * group_size;
    __m256 a = _mm256_setzero_ps();
    for (int i = 0; i < group_size; i += 8) {
      __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + i));
      a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), _mm256_loadu_ps(xg + i), a);
    }
    total = _mm256_fmadd_ps(a, _mm256_set1_ps(S::at(scales, g)), total);
    bias_total += S::at(biases, g) * xsum[g];
  }
  return hsum(total) + bias_total;
}

// 2, 3, 5 and 6 bits: eight values per `bits`-byte chunk (cpu_bitstream.h).
__attribute__((target("avx2,fma"))) float row_bitstream_avx2(const uint32_t* wq, const float* scales,
                                                             const float* biases, const float* x, const float* xsum,
                                                             int groups, int group_size, const BitLanes& bit_lanes,
                                                             const uint8_t* end) {
  const BitLanesAvx2 lanes(bit_lanes);
  const int bits = bit_lanes.bits;
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(wq);
  __m256 total = _mm256_setzero_ps();
  float bias_total = 0.f;
  for (int g = 0; g < groups; ++g) {
    const float* xg = x + g * group_size;
    __m256 a = _mm256_setzero_ps();
    for (int i = 0; i < group_size; i += 8) {
      const uint8_t* chunk = bytes + static_cast<size_t>(g * group_size + i) / 8 * bits;
      a = _mm256_fmadd_ps(lanes.values(chunk, chunk + 8 <= end), _mm256_loadu_ps(xg + i), a);
    }
    total = _mm256_fmadd_ps(a, _mm256_set1_ps(scales[g]), total);
    bias_total += biases[g] * xsum[g];
  }
  return hsum(total) + bias_total;
}

#endif

struct Problem {
  const float* x;
  const uint32_t* w;
  // [N, groups] scales and biases, float32 or 16-bit (cpu_scales.h).
  const void* scales;
  const void* biases;
  ScaleDtype scale_dtype;
  float* out;
  int M, N, K, group_size, bits;
  bool int8;  // 8-bit activations where the CPU has VNNI (set_cpu_int8_activations)
};

thread_local bool t_int8_activations = false;

void compute(const Problem& p) {
  // A prompt chunk: the packed GEMM (cpu_gemm.h).
  if (p.M >= kGemmMinRows && quantized_gemm_available() && !mlex::ablated(MLEX_ABLATE_KERNEL_CPU_GEMM)) {
    quantized_gemm(p.x, p.w, ScaleRows{p.scales, p.biases, p.scale_dtype, p.K / p.group_size}, p.out, p.M, p.N, p.K,
                   p.group_size, p.bits);
    return;
  }
  const int groups = p.K / p.group_size;
  const ScaleRows scale_rows{p.scales, p.biases, p.scale_dtype, groups};
  const int words_per_row = p.K * p.bits / 32;
  std::vector<float> xsum(static_cast<size_t>(p.M) * groups);
  for (int m = 0; m < p.M; ++m)
    for (int g = 0; g < groups; ++g) {
      const float* xg = p.x + static_cast<size_t>(m) * p.K + g * p.group_size;
      float s = 0.f;
      for (int i = 0; i < p.group_size; ++i) s += xg[i];
      xsum[static_cast<size_t>(m) * groups + g] = s;
    }
#ifdef MLEX_X86_64
  const BitLanes lanes(p.bits);
  const uint8_t* end = reinterpret_cast<const uint8_t*>(p.w) + static_cast<size_t>(p.N) * words_per_row * 4;
#endif
  // s, b: row n's scales and biases as floats (ScaleRows::rows).
  auto row = [&](int n, int m, const float* s, const float* b) -> float {
    const uint32_t* wq = p.w + static_cast<size_t>(n) * words_per_row;
    const float* x = p.x + static_cast<size_t>(m) * p.K;
    const float* xs = xsum.data() + static_cast<size_t>(m) * groups;
#ifdef MLEX_X86_64
    if (has_avx2_fma()) {
      if (p.bits == 4) return row_q4_avx2<ScF32>(wq, s, b, x, xs, groups, p.group_size);
      if (p.bits == 8) return row_q8_avx2<ScF32>(wq, s, b, x, xs, groups, p.group_size);
      return row_bitstream_avx2(wq, s, b, x, xs, groups, p.group_size, lanes, end);
    }
#endif
    if (p.bits != 4 && p.bits != 8) return row_bitstream(wq, s, b, x, xs, groups, p.group_size, p.bits);
    return row_scalar(wq, s, b, x, xs, groups, p.group_size, p.bits);
  };
  // Split the output rows; small problems stay on this thread (waking workers costs more). Both
  // constants were measured on a 2-core x86 (smollm2-135m shape, 4-bit decode): threshold 2^18
  // multiply-adds and 4 tasks per thread gave 54–65 tok/s; 2^16 gave 42–47, 2^20 gave 45–54, and
  // 2 tasks per thread 46–49.
  const double work = static_cast<double>(p.M) * p.N * p.K;
  const int tasks = work < (1 << 18) ? 1 : pool().size() * 4;
  const int chunk = (p.N + tasks - 1) / tasks;
#ifdef MLEX_X86_64
  // 8-bit activations (opt-in): 4 and 8 bits, groups of 32-512 (cpu_matvec_vnni.h).
  const bool vnni_groups = p.group_size % 32 == 0 && p.group_size <= 512 &&
                           ((p.group_size / 32) & (p.group_size / 32 - 1)) == 0 && groups <= kAvx512MaxGroups;
  if (p.int8 && (p.bits == 4 || p.bits == 8) && vnni_groups && has_avx512_vnni()) {
    const Int8XLayout layout = Int8XLayout::of(p.K);
    std::vector<int8_t> xq(static_cast<size_t>(p.M) * layout.q_stride);
    std::vector<float> xd(static_cast<size_t>(p.M) * layout.d_stride);
    for (int m = 0; m < p.M; ++m) {
      quantize_x_int8(p.x + static_cast<size_t>(m) * p.K, p.K, p.bits, xq.data() + m * layout.q_stride,
                      xd.data() + m * layout.d_stride);
    }
    const size_t row_bytes = static_cast<size_t>(p.K) * p.bits / 8;
    const int chunk4 = (chunk + 3) / 4 * 4;
    pool().run((p.N + chunk4 - 1) / chunk4, [&](int t) {
      const int lo = t * chunk4, hi = std::min(p.N, lo + chunk4);
      const size_t at = static_cast<size_t>(lo) * groups * (p.scale_dtype == ScaleDtype::F32 ? 4 : 2);
      matvec_rows_vnni(reinterpret_cast<const uint8_t*>(p.w) + static_cast<size_t>(lo) * row_bytes, row_bytes,
                       static_cast<const char*>(p.scales) + at, static_cast<const char*>(p.biases) + at, p.scale_dtype,
                       groups, p.group_size, p.bits, xq.data(), xd.data(), xsum.data(), p.M, p.K, hi - lo, p.out + lo,
                       static_cast<size_t>(p.N));
    });
    return;
  }
  // 4 and 8 bits on a CPU with AVX-512, 2, 3, 5 and 6 with AVX-512 VBMI too (cpu_matvec_avx512.h),
  // the scales as stored.
  const bool avx512_bits = p.bits == 4 || p.bits == 8 ? has_avx512() : p.bits != 7 && has_avx512_vbmi();
  if (avx512_bits && p.group_size % 32 == 0 && groups <= kAvx512MaxGroups) {
    std::vector<float> deinterleaved;
    const float* xk = p.x;
    if (p.bits == 4) {
      deinterleaved.resize(static_cast<size_t>(p.M) * p.K);
      for (int m = 0; m < p.M; ++m) {
        deinterleave_x_q4(p.x + static_cast<size_t>(m) * p.K, p.K, deinterleaved.data() + static_cast<size_t>(m) * p.K);
      }
      xk = deinterleaved.data();
    }
    const size_t row_bytes = static_cast<size_t>(p.K) * p.bits / 8;
    const int chunk4 = (chunk + 3) / 4 * 4;  // whole four-row blocks per task
    pool().run((p.N + chunk4 - 1) / chunk4, [&](int t) {
      const int lo = t * chunk4, hi = std::min(p.N, lo + chunk4);
      const size_t at = static_cast<size_t>(lo) * groups * (p.scale_dtype == ScaleDtype::F32 ? 4 : 2);
      const uint8_t* w = reinterpret_cast<const uint8_t*>(p.w) + static_cast<size_t>(lo) * row_bytes;
      matvec_rows_avx512(w, row_bytes, static_cast<const char*>(p.scales) + at, static_cast<const char*>(p.biases) + at,
                         p.scale_dtype, groups, p.group_size, p.bits, xk, xsum.data(), p.M, p.K, hi - lo, p.out + lo,
                         static_cast<size_t>(p.N));
    });
    return;
  }
  // Several rows of x (a batch's decode step) share each unpacked 4-bit weight row.
  if (p.bits == 4 && p.M > 1 && has_avx2_fma()) {
    pool().run(tasks, [&](int t) {
      const int lo = t * chunk, hi = std::min(p.N, lo + chunk);
      thread_local ScaleRows::Buffer buf;  // kept: no allocation per decode-step matmul
      for (int n = lo; n < hi; ++n) {
        const uint32_t* wq = p.w + static_cast<size_t>(n) * words_per_row;
        const float *s, *b;
        scale_rows.row(lo, hi, n, buf, s, b);
        for (int m = 0; m < p.M;) {
          const int r = std::min(4, p.M - m);
          const float* x = p.x + static_cast<size_t>(m) * p.K;
          const float* xs = xsum.data() + static_cast<size_t>(m) * groups;
          float* o = p.out + static_cast<size_t>(m) * p.N + n;
          const size_t xst = p.K, gst = groups, ost = p.N;
          switch (r) {
            case 4: rows_q4_avx2<4>(wq, s, b, x, xst, xs, gst, groups, p.group_size, o, ost); break;
            case 3: rows_q4_avx2<3>(wq, s, b, x, xst, xs, gst, groups, p.group_size, o, ost); break;
            case 2: rows_q4_avx2<2>(wq, s, b, x, xst, xs, gst, groups, p.group_size, o, ost); break;
            default: rows_q4_avx2<1>(wq, s, b, x, xst, xs, gst, groups, p.group_size, o, ost); break;
          }
          m += r;
        }
      }
    });
    return;
  }
#endif
#ifdef MLEX_X86_64
  // 4 and 8 bits with 16-bit scales (a float32 model's decode step on the CPU): the kernels read
  // them as stored, widening each in a register.
  if ((p.bits == 4 || p.bits == 8) && p.scale_dtype != ScaleDtype::F32 && has_avx2_fma() && has_f16c()) {
    const auto* s16 = static_cast<const uint16_t*>(p.scales);
    const auto* b16 = static_cast<const uint16_t*>(p.biases);
    pool().run(tasks, [&](int t) {
      const int lo = t * chunk, hi = std::min(p.N, lo + chunk);
      for (int n = lo; n < hi; ++n) {
        const uint32_t* wq = p.w + static_cast<size_t>(n) * words_per_row;
        const uint16_t* s = s16 + static_cast<size_t>(n) * groups;
        const uint16_t* b = b16 + static_cast<size_t>(n) * groups;
        for (int m = 0; m < p.M; ++m) {
          const float* x = p.x + static_cast<size_t>(m) * p.K;
          const float* xs = xsum.data() + static_cast<size_t>(m) * groups;
          const bool f16 = p.scale_dtype == ScaleDtype::F16;
          float v;
          if (p.bits == 4) {
            v = f16 ? row_q4_avx2<ScF16>(wq, s, b, x, xs, groups, p.group_size)
                    : row_q4_avx2<ScBF16>(wq, s, b, x, xs, groups, p.group_size);
          } else {
            v = f16 ? row_q8_avx2<ScF16>(wq, s, b, x, xs, groups, p.group_size)
                    : row_q8_avx2<ScBF16>(wq, s, b, x, xs, groups, p.group_size);
          }
          p.out[static_cast<size_t>(m) * p.N + n] = v;
        }
      }
    });
    return;
  }
#endif
  pool().run(tasks, [&](int t) {
    const int lo = t * chunk, hi = std::min(p.N, lo + chunk);
    thread_local ScaleRows::Buffer buf;
    for (int n = lo; n < hi; ++n) {
      const float *s, *b;
      scale_rows.row(lo, hi, n, buf, s, b);
      for (int m = 0; m < p.M; ++m) p.out[static_cast<size_t>(m) * p.N + n] = row(n, m, s, b);
    }
  });
}

class CpuQuantizedMatmul : public CpuPrimitive {
 public:
  // norm: inputs[4] is an RMSNorm weight, applied to x (with eps) before the product; epilogue:
  // the op applied to the product (AddResidual: the last input is the residual).
  // int8: 8-bit activations (the building thread's set_cpu_int8_activations).
  CpuQuantizedMatmul(mx::Stream s, int group_size, int bits, bool norm, float eps, Epilogue epilogue, bool int8)
      : CpuPrimitive(s), group_size_(group_size), bits_(bits), norm_(norm), eps_(eps), epilogue_(epilogue), int8_(int8) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& x = inputs[0];
    const int K = x.shape(-1), N = inputs[1].shape(0);
    const mx::Dtype sd = inputs[2].dtype();
    const ScaleDtype scale_dtype =
        sd == mx::float16 ? ScaleDtype::F16 : sd == mx::bfloat16 ? ScaleDtype::BF16 : ScaleDtype::F32;
    Problem p{x.data<float>(), inputs[1].data<uint32_t>(), inputs[2].data<void>(), inputs[3].data<void>(),
              scale_dtype, nullptr, static_cast<int>(out.size() / out.shape(-1)), N, K, group_size_, bits_, int8_};
    // A view as x is gathered into rows here, on the CPU thread, rather than by a copy op in the
    // graph (one op per matmul of a decode step).
    const bool gather = !x.flags().row_contiguous;
    const std::optional<mx::array> nw = norm_ ? std::optional<mx::array>(inputs[4]) : std::nullopt;
    const std::optional<mx::array> res =
        epilogue_ == Epilogue::AddResidual ? std::optional<mx::array>(inputs.back()) : std::nullopt;
    const float eps = eps_;
    const Epilogue epilogue = epilogue_;
    dispatch(inputs, out, [p, gather, x, nw, eps, epilogue, res](float* o) mutable {
      // SwiGLU reads the whole product [g, u]: it goes to a buffer, the output is half as wide.
      std::vector<float> product;
      if (epilogue == Epilogue::SwiGlu) product.resize(static_cast<size_t>(p.M) * p.N);
      p.out = epilogue == Epilogue::SwiGlu ? product.data() : o;
      std::vector<float> rows;
      if (nw) {
        // The normalized rows, as cpu_rms_norm writes them (views read in place).
        rows.resize(static_cast<size_t>(p.M) * p.K);
        for (int m = 0; m < p.M; ++m) {
          rms_norm_row(p.x + mlex::row_offset(x, m), x.strides().back(), p.K, nw->data<float>(), nw->strides()[0], eps,
                       rows.data() + static_cast<size_t>(m) * p.K);
        }
        p.x = rows.data();
      } else if (gather) {
        rows.resize(static_cast<size_t>(p.M) * p.K);
        const int64_t step = x.strides().back();
        for (int m = 0; m < p.M; ++m) {
          const float* src = p.x + mlex::row_offset(x, m);
          for (int k = 0; k < p.K; ++k) rows[static_cast<size_t>(m) * p.K + k] = src[k * step];
        }
        p.x = rows.data();
      }
      compute(p);
      // The epilogues as the unfused graph computes them: MLX's add(residual, y), cpu_swiglu.
      if (res) {
        const float* rp = res->data<float>();
        const int64_t rs = res->strides().back();
        for (int m = 0; m < p.M; ++m) {
          const float* r = rp + mlex::row_offset(*res, m);
          float* y = o + static_cast<size_t>(m) * p.N;
          for (int n = 0; n < p.N; ++n) y[n] = r[n * rs] + y[n];
        }
      } else if (epilogue == Epilogue::SwiGlu) {
        const int half = p.N / 2;
        for (int m = 0; m < p.M; ++m) {
          const float* g = product.data() + static_cast<size_t>(m) * p.N;
          swiglu_row(g, g + half, o + static_cast<size_t>(m) * half, half);
        }
      }
    });
  }
  const char* name() const override { return "CpuQuantizedMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const CpuQuantizedMatmul*>(&other);
    return o != nullptr && o->group_size_ == group_size_ && o->bits_ == bits_ && o->norm_ == norm_ && o->eps_ == eps_ &&
           o->epilogue_ == epilogue_ && o->int8_ == int8_;
  }

 private:
  int group_size_, bits_;
  bool norm_;
  float eps_;
  Epilogue epilogue_;
  bool int8_;
};

bool ready_row_contiguous(const mx::array& a) { return a.is_available() && a.flags().row_contiguous; }

}  // namespace

std::optional<mx::array> cpu_quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                                              const std::optional<mx::array>& biases, bool transpose, int group_size,
                                              int bits, const std::string& mode,
                                              const std::optional<mx::array>& norm_weight, float eps, Epilogue epilogue,
                                              const std::optional<mx::array>& residual) {
  // Benchmark ablation only (BENCHMARKS.md): MLX's own CPU kernel everywhere.
  const bool ablated = mlex::ablated(MLEX_ABLATE_KERNEL_CPU_QMM);
  auto stream = mx::to_stream({});
  if (ablated || stream.device != mx::Device::cpu || mode != "affine" || !transpose || !biases ||
      (bits < 2 || bits > 8 || bits == 7) || group_size % 8 != 0 || x.ndim() < 1 || x.dtype() != mx::float32 ||
      w.dtype() != mx::uint32 || w.ndim() != 2 ||
      (scales.dtype() != mx::float32 && scales.dtype() != mx::float16 && scales.dtype() != mx::bfloat16) ||
      biases->dtype() != scales.dtype()) {
    return std::nullopt;
  }
  const int K = x.shape(-1), N = w.shape(0);
  if (K % group_size != 0 || w.shape(1) != K * bits / 32 || scales.ndim() != 2 || scales.shape(0) != N ||
      scales.shape(1) != K / group_size || biases->shape() != scales.shape() || !ready_row_contiguous(w) ||
      !ready_row_contiguous(scales) || !ready_row_contiguous(*biases)) {
    return std::nullopt;
  }
  if (norm_weight && (mlex::ablated(MLEX_ABLATE_KERNEL_CPU_NORM_FOLD) || cpu_fast_ops_ablated() ||
                      norm_weight->dtype() != mx::float32 || norm_weight->ndim() != 1 || norm_weight->shape(0) != K)) {
    return std::nullopt;
  }
  auto shape = x.shape();
  shape.back() = N;
  if (epilogue != Epilogue::None) {
    // The bias add stays an op of its own on the CPU (the caller adds it).
    if (epilogue == Epilogue::AddBias || mlex::ablated(MLEX_ABLATE_KERNEL_CPU_EPILOGUE)) return std::nullopt;
    if (epilogue == Epilogue::AddResidual &&
        (!residual || residual->dtype() != mx::float32 || residual->shape() != shape)) {
      return std::nullopt;
    }
    if (epilogue == Epilogue::SwiGlu) {
      if (N % 2 != 0) return std::nullopt;
      shape.back() = N / 2;
    }
  }
  std::vector<mx::array> inputs{x, w, scales, *biases};
  if (norm_weight) inputs.push_back(*norm_weight);
  if (epilogue == Epilogue::AddResidual) inputs.push_back(*residual);
  return mx::array(shape, mx::float32,
                   std::make_shared<CpuQuantizedMatmul>(stream, group_size, bits, norm_weight.has_value(), eps, epilogue,
                                                        t_int8_activations),
                   inputs);
}

void set_cpu_int8_activations(bool on) { t_int8_activations = on; }

}  // namespace mlex
