// GCC 12's own AVX-512 headers trip these warnings (their _mm512_undefined_* placeholders).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "cpu_fast_ops.h"

#include "ablation.h"
#include "cpu_primitive.h"
#include "cpu_simd.h"
#include "cpu_strided.h"
#include "cpu_thread_pool.h"

// MLX's element-wise kernels (for its sigmoid); its SIMD math type-puns, which GCC warns about.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-aliasing"
#include "mlx/backend/cpu/unary_ops.h"
#pragma GCC diagnostic pop

#include <cmath>
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <limits>
#include <vector>


namespace mx = mlx::core;

namespace mlex {
namespace {

bool on_cpu() { return mx::to_stream({}).device == mx::Device::cpu; }

// x · rsqrt(mean(x²) + eps) · w over the last axis, as MLX's reference graph computes it.
class CpuRmsNorm : public CpuPrimitive {
 public:
  CpuRmsNorm(mx::Stream s, float eps, bool has_weight) : CpuPrimitive(s), eps_(eps), has_weight_(has_weight) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array x = inputs[0];
    const std::optional<mx::array> w = has_weight_ ? std::optional<mx::array>(inputs[1]) : std::nullopt;
    const float eps = eps_;
    dispatch(inputs, out, [x, w, eps](float* o) {
      const int64_t d = x.shape(-1), rows = row_count(x), xs = x.strides().back();
      const float* xp = x.data<float>();
      const float* wp = w ? w->data<float>() : nullptr;
      const int64_t ws = w ? w->strides()[0] : 0;
      for (int64_t r = 0; r < rows; ++r) rms_norm_row(xp + row_offset(x, r), xs, d, wp, ws, eps, o + r * d);
    });
  }
  const char* name() const override { return "CpuRmsNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const CpuRmsNorm*>(&other);
    return o && o->eps_ == eps_ && o->has_weight_ == has_weight_;
  }

 private:
  float eps_;
  bool has_weight_;
};

// Rotates pairs of the first `dims` features of `[..., L, D]` by (offset + l)·scale·inv_freq_i;
// inv_freq_i = exp(-i·ln(base)/(dims/2)) or 1/freqs[i]; the rest of the features pass through.
// With `offsets` (int32 `[B]`, a batch whose rows sit at different positions: continuous
// batching), row b of the leading axis uses offsets[b] instead of `offset`.
class CpuRope : public CpuPrimitive {
 public:
  CpuRope(mx::Stream s, int dims, bool traditional, float base, float scale, int offset, bool has_freqs,
          bool has_offsets)
      : CpuPrimitive(s), dims_(dims), traditional_(traditional), base_(base), scale_(scale), offset_(offset),
        has_freqs_(has_freqs), has_offsets_(has_offsets) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array x = inputs[0];
    const std::optional<mx::array> freqs = has_freqs_ ? std::optional<mx::array>(inputs[1]) : std::nullopt;
    const std::optional<mx::array> offsets = has_offsets_ ? std::optional<mx::array>(inputs.back()) : std::nullopt;
    const int dims = dims_, offset = offset_;
    const bool traditional = traditional_;
    const float base = base_, scale = scale_;
    dispatch(inputs, out, [=](float* o) {
      const int half = dims / 2;
      const int64_t d = x.shape(-1), len = x.shape(-2), rows = row_count(x), xs = x.strides().back();
      // Positions: one table of `len` rows, or one per batch row with per-row offsets.
      const int64_t batches = offsets ? x.shape(0) : 1;
      const int64_t rows_per_batch = rows / batches;
      std::vector<float> inv(half);
      rope_inv_freqs(half, base, freqs ? freqs->data<float>() : nullptr, freqs ? freqs->strides()[0] : 0, inv.data());
      std::vector<float> cs(static_cast<size_t>(batches * len) * half), sn(cs.size());
      for (int64_t b = 0; b < batches; ++b) {
        const int64_t off = offsets ? offsets->data<int32_t>()[b * offsets->strides()[0]] : offset;
        for (int64_t l = 0; l < len; ++l) {
          const size_t at = static_cast<size_t>((b * len + l) * half);
          rope_angles(static_cast<float>(l), off, scale, inv.data(), half, cs.data() + at, sn.data() + at);
        }
      }
      const float* xp = x.data<float>();
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t at = (r / rows_per_batch) * len + r % len;
        rope_row(xp + row_offset(x, r), xs, d, dims, traditional, cs.data() + at * half, sn.data() + at * half,
                 o + r * d);
      }
    });
  }
  const char* name() const override { return "CpuRope"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const CpuRope*>(&other);
    return o && o->dims_ == dims_ && o->traditional_ == traditional_ && o->base_ == base_ && o->scale_ == scale_ &&
           o->offset_ == offset_ && o->has_freqs_ == has_freqs_ && o->has_offsets_ == has_offsets_;
  }

 private:
  int dims_;
  bool traditional_;
  float base_, scale_;
  int offset_;
  bool has_freqs_, has_offsets_;
};


// e[i] = exp(x[i·xs] − top) for i < n, with MLX's own exp, its bits. With AVX2/FMA the fma() of
// MLX's exp becomes one instruction (exactly rounded, as the library call is) and nothing else is
// fused; with AVX-512 the loop runs sixteen lanes at a time (mlx_exp16).
[[gnu::flatten]] void exp_shifted_scalar(const float* x, int64_t xs, float top, float* e, int64_t n) {
  for (int64_t i = 0; i < n; ++i) e[i] = mx::simd::exp(mx::simd::Simd<float, 1>(x[i * xs] - top)).value;
}
#ifdef MLEX_X86_64
[[gnu::flatten]] __attribute__((target("avx2,fma"), optimize("O3", "fp-contract=off"))) void exp_shifted_avx2(
    const float* x, float top, float* e, int64_t n) {
  for (int64_t i = 0; i < n; ++i) e[i] = mx::simd::exp(mx::simd::Simd<float, 1>(x[i] - top)).value;
}

// MLX's exp (mlx/backend/cpu/simd/math.h) on sixteen lanes, each the bits of its scalar version,
// which is what MLX's x86 build runs: GCC does not vectorise that one (it rounds x + 0.5 in double
// and branches per element), so the loops above stay scalar, ~25 cycles an element. The double
// add is exact, so floor(x + 0.5) is computed exactly here as floor(x) + (x − floor(x) ≥ 0.5);
// the polynomial's fma() steps are single FMAs, as the library calls are exactly rounded; nothing
// else may be contracted (fp-contract=off).
__attribute__((target("avx512f,fma"), optimize("fp-contract=off"))) inline __m512 mlx_exp16(__m512 in) {
  const __m512 x = _mm512_mul_ps(in, _mm512_set1_ps(1.442695f));
  const __m512 lo = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __mmask16 up = _mm512_cmp_ps_mask(_mm512_sub_ps(x, lo), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  const __m512 ipart = _mm512_mask_add_ps(lo, up, lo, _mm512_set1_ps(1.0f));
  const __m512 f = _mm512_sub_ps(x, ipart);
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(ipart), _mm512_set1_epi32(127)), 23);
  __m512 r = _mm512_mul_ps(_mm512_castsi512_ps(e), p);
  r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(in, in, _CMP_UNORD_Q), in);
  r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(in, _mm512_set1_ps(88.0f), _CMP_GT_OQ),
                         _mm512_set1_ps(std::numeric_limits<float>::infinity()));
  return _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(in, _mm512_set1_ps(-88.0f), _CMP_LT_OQ), _mm512_setzero_ps());
}

__attribute__((target("avx512f,fma"), optimize("fp-contract=off"))) void exp_shifted_avx512(
    const float* x, float top, float* e, int64_t n) {
  const __m512 t = _mm512_set1_ps(top);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(e + i, k, mlx_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), t)));
  }
}

// o = (g · sigmoid(g)) · u with MLX's sigmoid, 1 / (1 + exp(|g|)) taken as is for g < 0 and
// subtracted from 1 otherwise: the scalar loop's bits.
__attribute__((target("avx512f,fma"), optimize("fp-contract=off"))) void swiglu_avx512(
    const float* g, const float* u, float* o, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(k, g + i);
    const __m512 y = _mm512_div_ps(one, _mm512_add_ps(one, mlx_exp16(_mm512_abs_ps(x))));
    const __m512 sig = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), _mm512_sub_ps(one, y), y);
    _mm512_mask_storeu_ps(o + i, k, _mm512_mul_ps(_mm512_mul_ps(x, sig), _mm512_maskz_loadu_ps(k, u + i)));
  }
}
#endif

void exp_shifted(const float* x, int64_t xs, float top, float* e, int64_t n) {
#ifdef MLEX_X86_64
  if (xs == 1 && has_avx512()) return exp_shifted_avx512(x, top, e, n);
  if (xs == 1 && has_avx2_fma()) return exp_shifted_avx2(x, top, e, n);
#endif
  exp_shifted_scalar(x, xs, top, e, n);
}

#ifdef MLEX_X86_64
// One query row of attention with AVX-512 for a head width D of 16·C (C ≤ 16): the query and the
// output accumulator stay in registers across the keys (the AVX2 path reloads and stores the
// accumulator per key: most of a decode step's attention time), the softmax's exponentials are
// vectorised. q is already scaled; p holds `seen` floats of scratch.
template <int D>
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void attend_row_avx512(const float* q, const float* kb,
                                                                                  int64_t kstride, const float* vb,
                                                                                  int64_t vstride, int64_t seen,
                                                                                  float* p, float* out) {
  constexpr int C = D / 16;
  __m512 qv[C];
  _Pragma("GCC unroll 16") for (int c = 0; c < C; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < seen; ++j) {
    const float* kr = kb + j * kstride;
    __m512 s = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kr));
    _Pragma("GCC unroll 16") for (int c = 1; c < C; ++c) s = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kr + 16 * c), s);
    p[j] = hsum512(s);
    top = std::max(top, p[j]);
  }
  exp_shifted(p, 1, top, p, seen);
  __m512 acc[C];
  _Pragma("GCC unroll 16") for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
  float sum = 0.f;
  for (int64_t j = 0; j < seen; ++j) {
    const float* vr = vb + j * vstride;
    const __m512 pj = _mm512_set1_ps(p[j]);
    sum += p[j];
    _Pragma("GCC unroll 16") for (int c = 0; c < C; ++c) acc[c] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vr + 16 * c), acc[c]);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / sum);
  _Pragma("GCC unroll 16") for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + 16 * c, _mm512_mul_ps(acc[c], inv));
}
#endif

// Each query row against the keys it may see: scores = (scale·q)·kᵀ, a max-subtracted softmax,
// then ·v; query head h reads key/value head h / (Hq / Hkv). With `causal`, query l of L (the
// last L positions of the S keys) sees keys 0 … S-L+l, as MLX's causal mask does. Rows are spread
// over the thread pool once there is enough work for it to pay (at 2,048 tokens of context,
// attention is most of a CPU decode step, and all of a long prompt's prefill but the matmuls).
// With `key_start` (int32 `[B]`: a left-padded batch, continuous batching) batch row b's queries
// see no key before key_start[b].
class CpuAttention : public CpuPrimitive {
 public:
  CpuAttention(mx::Stream s, float scale, bool causal, bool has_start)
      : CpuPrimitive(s), scale_(scale), causal_(causal), has_start_(has_start) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array q = inputs[0], k = inputs[1], v = inputs[2];
    const std::optional<mx::array> key_start = has_start_ ? std::optional<mx::array>(inputs[3]) : std::nullopt;
    const float scale = scale_;
    const bool causal = causal_;
    dispatch(inputs, out, [=](float* o) {
      const int64_t batch = q.shape(0), hq = q.shape(1), L = q.shape(2), hkv = k.shape(1), S = k.shape(2),
                    D = q.shape(3);
      const int64_t rep = hq / hkv;
      const auto &qs = q.strides(), &ks = k.strides(), &vs = v.strides();
      const float *qp = q.data<float>(), *kp = k.data<float>(), *vp = v.data<float>();
      auto row = [&](int64_t bhl) {
        const int64_t l = bhl % L, bh = bhl / L, b = bh / hq, h = bh % hq, g = h / rep;
        // Keys this query sees: all of them without a mask, else up to its own position (L <= S,
        // so at least one).
        const int64_t end = causal ? S - L + l + 1 : S;
        const int64_t first =
            key_start ? std::clamp<int64_t>(key_start->data<int32_t>()[b * key_start->strides()[0]], 0, end - 1) : 0;
        std::vector<float> qh(D);
        const float* qr = qp + b * qs[0] + h * qs[1] + l * qs[2];
        for (int64_t i = 0; i < D; ++i) qh[i] = scale * qr[i * qs[3]];
        attend_row(qh.data(), kp + b * ks[0] + g * ks[1] + first * ks[2], ks[2], ks[3],
                   vp + b * vs[0] + g * vs[1] + first * vs[2], vs[2], vs[3], end - first, D, o + bhl * D);
      };
      const int64_t rows = batch * hq * L;
      attend_rows(rows, S * D, row);
    });
  }
  const char* name() const override { return "CpuAttention"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const CpuAttention*>(&other);
    return o && o->scale_ == scale_ && o->causal_ == causal_ && o->has_start_ == has_start_;
  }

 private:
  float scale_;
  bool causal_, has_start_;
};

// silu(gate) · up element-wise, computed as MLX's compiled kernel for the graph
// `(gate · sigmoid(gate)) · up` computes it (MLX's own sigmoid, the same order of products), so the
// results are the same bits. The compiled kernel is JIT-built: its first use in a process runs a
// compiler probe (`g++ --version`) and loads a shared library from MLX's cache, or on a machine
// whose cache is empty compiles it (~0.4 s per kernel variant here): the cold start's first
// forward paid for that. Views (the halves of a fused gate/up projection) are read in place.
class CpuSwiglu : public CpuPrimitive {
  // One row; flattened so that MLX's sigmoid (and its exp) is inlined into the loop.
  [[gnu::flatten]] static void row(const float* g, int64_t gs, const float* u, int64_t us, float* o, int64_t n) {
#ifdef MLEX_X86_64
    if (gs == 1 && us == 1 && has_avx512()) return swiglu_avx512(g, u, o, n);
    if (gs == 1 && us == 1 && has_avx2_fma()) return row_avx2(g, u, o, n);
#endif
    mx::detail::Sigmoid sigmoid;
    for (int64_t i = 0; i < n; ++i) {
      const float x = g[i * gs];
      o[i] = (x * sigmoid(x)) * u[i * us];
    }
  }
#ifdef MLEX_X86_64
  // The same loop on contiguous rows with AVX2/FMA: the fma() of MLX's exp becomes one
  // instruction (exactly rounded, as the library call is) and nothing else is fused, so it
  // computes the scalar loop's bits. GCC does not vectorise it (MLX's exp rounds x + 0.5 in
  // double); swiglu_avx512 does the sixteen-lane version.
  [[gnu::flatten]] __attribute__((target("avx2,fma"), optimize("O3", "fp-contract=off"))) static void row_avx2(
      const float* g, const float* u, float* o, int64_t n) {
    mx::detail::Sigmoid sigmoid;
    for (int64_t i = 0; i < n; ++i) o[i] = (g[i] * sigmoid(g[i])) * u[i];
  }
#endif

 public:
  explicit CpuSwiglu(mx::Stream s) : CpuPrimitive(s) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array g = inputs[0];
    const mx::array u = inputs[1];
    dispatch(inputs, out, [g, u](float* o) {
      const int64_t d = g.shape(-1), rows = row_count(g), gs = g.strides().back(), us = u.strides().back();
      const float* gp = g.data<float>();
      const float* up = u.data<float>();
      // One thread: a prefill chunk's swiglu is a few hundred microseconds a layer, less than
      // what handing it to the pool costs when the other cores are busy.
      for (int64_t r = 0; r < rows; ++r) row(gp + row_offset(g, r), gs, up + row_offset(u, r), us, o + r * d, d);
    });
  }
  const char* name() const override { return "CpuSwiglu"; }
  static void contiguous_row(const float* g, const float* u, float* o, int64_t n) { row(g, 1, u, 1, o, n); }
  bool is_equivalent(const mx::Primitive& other) const override { return dynamic_cast<const CpuSwiglu*>(&other); }
};

// log Σ exp(x) over the last axis, computed as MLX's CPU kernel computes it on x86 (the maximum,
// then Σ exp(x − maximum) in order, then log(Σ) + maximum, with MLX's own exp), so the results are
// the same bits. MLX's build for x86 runs that loop one element at a time, its exp calling the
// C library's fma() per polynomial step: on a vocabulary of 49,152 it took about a tenth of a
// CPU decode step (the sampler's logprobs). Here the exponentials are vectorised (exp_shifted)
// and only the sum stays sequential.
class CpuLogSumExp : public CpuPrimitive {
 public:
  explicit CpuLogSumExp(mx::Stream s) : CpuPrimitive(s) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array x = inputs[0];
    dispatch(inputs, out, [x](float* o) {
      const int64_t d = x.shape(-1), rows = row_count(x), xs = x.strides().back();
      const float* xp = x.data<float>();
      std::vector<float> e(static_cast<size_t>(d));
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = xp + row_offset(x, r);
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < d; ++i) top = row[i * xs] > top ? row[i * xs] : top;
        exp_shifted(row, xs, top, e.data(), d);
        float sum = 0.f;
        for (int64_t i = 0; i < d; ++i) sum += e[i];
        o[r] = std::isinf(top) ? top : std::log(sum) + top;
      }
    });
  }
  const char* name() const override { return "CpuLogSumExp"; }
  bool is_equivalent(const mx::Primitive& other) const override { return dynamic_cast<const CpuLogSumExp*>(&other); }
};

// Benchmark ablation only (src/ablation.rs): MLX's reference graphs everywhere.
bool ablated() { return mlex::ablated(MLEX_ABLATE_KERNEL_CPU_FAST_OPS); }

}  // namespace

void rms_norm_row(const float* x, int64_t stride, int64_t d, const float* w, int64_t w_stride, float eps, float* out) {
  float ss = 0.f;
  for (int64_t i = 0; i < d; ++i) ss += x[i * stride] * x[i * stride];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
  for (int64_t i = 0; i < d; ++i) out[i] = w ? (x[i * stride] * inv) * w[i * w_stride] : x[i * stride] * inv;
}

void rope_inv_freqs(int half, float base, const float* freqs, int64_t freq_stride, float* inv) {
  if (freqs) {
    for (int i = 0; i < half; ++i) inv[i] = 1.0f / freqs[i * freq_stride];
  } else {
    const float step = std::log(base) / static_cast<float>(half);
    for (int i = 0; i < half; ++i) inv[i] = std::exp(static_cast<float>(-i) * step);
  }
}

void rope_angles(float l, int64_t offset, float scale, const float* inv, int half, float* c, float* s) {
  const float pos = (l + static_cast<float>(offset)) * scale;
  for (int i = 0; i < half; ++i) {
    const float theta = pos * inv[i];
    c[i] = std::cos(theta);
    s[i] = std::sin(theta);
  }
}

void rope_row(const float* x, int64_t xs, int64_t d, int dims, bool traditional, const float* c, const float* s,
              float* out) {
  const int half = dims / 2;
  for (int i = 0; i < half; ++i) {
    const int64_t i1 = traditional ? 2 * i : i, i2 = traditional ? 2 * i + 1 : i + half;
    const float x1 = x[i1 * xs], x2 = x[i2 * xs];
    out[i1] = x1 * c[i] - x2 * s[i];
    out[i2] = x1 * s[i] + x2 * c[i];
  }
  for (int64_t i = dims; i < d; ++i) out[i] = x[i * xs];
}

void attend_row(const float* q, const float* kb, int64_t kstride, int64_t kin, const float* vb, int64_t vstride,
                int64_t vin, int64_t seen, int64_t D, float* out) {
  std::vector<float> p(seen);
#ifdef MLEX_X86_64
  const bool simd = has_avx2_fma() && kin == 1 && vin == 1;
  if (simd && has_avx512() && (D == 64 || D == 128 || D == 256)) {
    if (D == 64) return attend_row_avx512<64>(q, kb, kstride, vb, vstride, seen, p.data(), out);
    if (D == 128) return attend_row_avx512<128>(q, kb, kstride, vb, vstride, seen, p.data(), out);
    return attend_row_avx512<256>(q, kb, kstride, vb, vstride, seen, p.data(), out);
  }
#endif
  std::vector<float> acc(D, 0.f);
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < seen; ++j) {
    const float* kr = kb + j * kstride;
    float dot = 0.f;
#ifdef MLEX_X86_64
    if (simd) {
      dot = dot_avx2(q, kr, D);
    } else
#endif
      for (int64_t i = 0; i < D; ++i) dot += q[i] * kr[i * kin];
    p[j] = dot;
    top = std::max(top, dot);
  }
  float sum = 0.f;
  for (int64_t j = 0; j < seen; ++j) {
    p[j] = std::exp(p[j] - top);
    sum += p[j];
  }
  for (int64_t j = 0; j < seen; ++j) {
    const float pj = p[j] / sum;
    const float* vr = vb + j * vstride;
#ifdef MLEX_X86_64
    if (simd) {
      axpy_avx2(pj, vr, acc.data(), D);
      continue;
    }
#endif
    for (int64_t i = 0; i < D; ++i) acc[i] += pj * vr[i * vin];
  }
  std::copy(acc.begin(), acc.end(), out);
}

void attend_rows(int64_t rows, int64_t keys_by_width, const std::function<void(int64_t)>& row) {
  // Below ~2^16 multiply-adds a wake-up of the workers costs more than it saves; above, a few
  // tasks per thread even out the causal rows' unequal lengths.
  if (rows > 1 && rows * keys_by_width >= (1 << 16)) {
    const int64_t tasks = std::min<int64_t>(rows, pool().size() * 8);
    pool().run(static_cast<int>(tasks), [&](int t) {
      for (int64_t r = t; r < rows; r += tasks) row(r);
    });
  } else {
    for (int64_t r = 0; r < rows; ++r) row(r);
  }
}

bool cpu_fast_ops_ablated() { return ablated(); }

void swiglu_row(const float* g, const float* u, float* o, int64_t n) { CpuSwiglu::contiguous_row(g, u, o, n); }

std::optional<mx::array> cpu_rms_norm(const mx::array& x, const std::optional<mx::array>& weight, float eps) {
  if (ablated() || !on_cpu() || x.ndim() < 1 || x.dtype() != mx::float32 ||
      (weight && (weight->dtype() != mx::float32 || weight->ndim() != 1 || weight->shape(0) != x.shape(-1)))) {
    return std::nullopt;
  }
  auto s = mx::to_stream({});
  std::vector<mx::array> inputs{x};
  if (weight) inputs.push_back(*weight);
  return mx::array(x.shape(), mx::float32, std::make_shared<CpuRmsNorm>(s, eps, weight.has_value()), inputs);
}

std::optional<mx::array> cpu_rope(const mx::array& x, int dims, bool traditional, float base, float scale, int offset,
                                  const std::optional<mx::array>& freqs, const std::optional<mx::array>& offsets) {
  if (ablated() || !on_cpu() || x.ndim() < 3 || x.dtype() != mx::float32 || dims % 2 != 0 || dims < 2 ||
      dims > x.shape(-1) || (freqs && (freqs->ndim() != 1 || freqs->shape(0) != dims / 2)) ||
      (offsets && (offsets->ndim() != 1 || offsets->shape(0) != x.shape(0)))) {
    return std::nullopt;
  }
  auto s = mx::to_stream({});
  std::vector<mx::array> inputs{x};
  if (freqs) inputs.push_back(mx::astype(*freqs, mx::float32, s));
  if (offsets) inputs.push_back(mx::astype(*offsets, mx::int32, s));
  return mx::array(x.shape(), mx::float32,
                   std::make_shared<CpuRope>(s, dims, traditional, base, scale, offset, freqs.has_value(),
                                             offsets.has_value()),
                   inputs);
}

std::optional<mx::array> cpu_attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
                                       bool causal, const std::optional<mx::array>& key_start) {
  if (ablated() || !on_cpu() || q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4 || q.dtype() != mx::float32 ||
      k.dtype() != mx::float32 || v.dtype() != mx::float32 || q.shape(2) == 0 || k.shape(0) != q.shape(0) ||
      v.shape(0) != q.shape(0) || k.shape(1) != v.shape(1) || k.shape(1) == 0 || q.shape(1) % k.shape(1) != 0 ||
      k.shape(2) != v.shape(2) || k.shape(2) < q.shape(2) || k.shape(3) != q.shape(3) || v.shape(3) != q.shape(3) ||
      (key_start && (key_start->ndim() != 1 || key_start->shape(0) != q.shape(0)))) {
    return std::nullopt;
  }
  auto s = mx::to_stream({});
  std::vector<mx::array> inputs{q, k, v};
  if (key_start) inputs.push_back(mx::astype(*key_start, mx::int32, s));
  return mx::array(q.shape(), mx::float32, std::make_shared<CpuAttention>(s, scale, causal, key_start.has_value()),
                   inputs);
}

std::optional<mx::array> cpu_swiglu(const mx::array& gate, const mx::array& up) {
  if (ablated() || !on_cpu() || gate.ndim() < 1 || gate.dtype() != mx::float32 || up.dtype() != mx::float32 ||
      gate.shape() != up.shape()) {
    return std::nullopt;
  }
  return mx::array(gate.shape(), mx::float32, std::make_shared<CpuSwiglu>(mx::to_stream({})), {gate, up});
}

std::optional<mx::array> cpu_logsumexp_last(const mx::array& x, bool keepdims) {
  if (ablated() || !on_cpu() || x.ndim() < 1 || x.dtype() != mx::float32 || x.shape(-1) < 1) return std::nullopt;
  auto shape = x.shape();
  if (keepdims) {
    shape.back() = 1;
  } else {
    shape.pop_back();
  }
  return mx::array(shape, mx::float32, std::make_shared<CpuLogSumExp>(mx::to_stream({})), {x});
}

}  // namespace mlex
