#include "gated_delta.h"

#include "ablation.h"
#include "cpu_simd.h"
#include "cpu_thread_pool.h"
#include "cuda_jit.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/fast.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace mlex {
namespace {

// ---- CPU ------------------------------------------------------------------------------------

// Element offset of a[i0, i1, i2] (first three axes; the last axis is read with its stride).
inline int64_t at3(const mx::array& a, int64_t i0, int64_t i1, int64_t i2) {
  return i0 * a.strides()[0] + i1 * a.strides()[1] + i2 * a.strides()[2];
}

#ifdef MLEX_X86_64
// rows_step's AVX2 part: whole blocks of 8 rows from r0; returns the first row it left.
// Multiplies and adds stay separate, as in the reference: compiled without FMA so that the
// compiler cannot contract them.
__attribute__((target("avx2"))) int64_t rows_step_avx2(float* st, int64_t dv, int64_t dk, int64_t r0,
                                                            int64_t r1, const float* k, const float* q,
                                                            const float* v, float g, float beta, float* y) {
  const __m256 gv = _mm256_set1_ps(g), bv = _mm256_set1_ps(beta);
  int64_t r = r0;
  for (; r + 8 <= r1; r += 8) {
    __m256 kv = _mm256_setzero_ps();
    for (int64_t i = 0; i < dk; ++i) {
      float* p = st + i * dv + r;
      const __m256 s = _mm256_mul_ps(_mm256_loadu_ps(p), gv);
      _mm256_storeu_ps(p, s);
      kv = _mm256_add_ps(kv, _mm256_mul_ps(s, _mm256_set1_ps(k[i])));
    }
    const __m256 delta = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(v + r), kv), bv);
    __m256 out = _mm256_setzero_ps();
    for (int64_t i = 0; i < dk; ++i) {
      float* p = st + i * dv + r;
      const __m256 s = _mm256_add_ps(_mm256_loadu_ps(p), _mm256_mul_ps(_mm256_set1_ps(k[i]), delta));
      _mm256_storeu_ps(p, s);
      out = _mm256_add_ps(out, _mm256_mul_ps(s, _mm256_set1_ps(q[i])));
    }
    _mm256_storeu_ps(y + r, out);
  }
  return r;
}
#endif

// One token through rows [r0, r1) of the state, kept transposed (`st[i * dv + r]` is S[r, i]) so
// that consecutive rows are adjacent: 8 rows go through AVX2 lanes together while each row's
// sums still run over i in order, with every product rounded before it is added, exactly as the
// reference graph's multiply-then-sum ops do. That makes this kernel's float32 results the same
// as the reference's, not merely close (mlx-lm's bfloat16 models then give identical tokens).
inline void rows_step(float* st, int64_t dv, int64_t dk, int64_t r0, int64_t r1, const float* k, const float* q,
                      const float* v, float g, float beta, float* y) {
  int64_t r = r0;
#ifdef MLEX_X86_64
  if (has_avx2_fma()) r = rows_step_avx2(st, dv, dk, r0, r1, k, q, v, g, beta, y);
#endif
  for (; r < r1; ++r) {
    float kv = 0.f;
    for (int64_t i = 0; i < dk; ++i) {
      float& s = st[i * dv + r];
      s = s * g;
      const float p = s * k[i];
      kv = kv + p;
    }
    const float delta = (v[r] - kv) * beta;
    float out = 0.f;
    for (int64_t i = 0; i < dk; ++i) {
      float& s = st[i * dv + r];
      const float u = k[i] * delta;
      s = s + u;
      const float p = s * q[i];
      out = out + p;
    }
    y[r] = out;
  }
}

// Inputs float32 (any strides: the q/k/v rows are slices of the conv output); outputs y
// `[B, T, Hv, Dv]` and the state `[B, Hv, Dv, Dk]`, both float32. The (batch, value head) pairs
// are spread over the thread pool; each keeps its [Dv, Dk] state in the output buffer.
class CpuGatedDelta : public mx::Primitive {
 public:
  using mx::Primitive::Primitive;

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    for (auto& out : outputs) out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) enc.set_input_array(in);
    for (auto& out : outputs) enc.set_output_array(out);
    const mx::array q = inputs[0], k = inputs[1], v = inputs[2], g = inputs[3], beta = inputs[4], st = inputs[5];
    float* y = outputs[0].data<float>();
    float* so = outputs[1].data<float>();
    const size_t ny = outputs[0].size(), ns = outputs[1].size();
    enc.dispatch([=]() {
      try {
        run(q, k, v, g, beta, st, y, so);
      } catch (...) {
        // Only allocation can fail here; MLX's CPU thread must not see an exception.
        std::fill(y, y + ny, std::numeric_limits<float>::quiet_NaN());
        std::fill(so, so + ns, std::numeric_limits<float>::quiet_NaN());
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("[CpuGatedDelta] runs on the CPU only");
  }
  const char* name() const override { return "CpuGatedDelta"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const CpuGatedDelta*>(&other) != nullptr;
  }

 private:
  static void run(const mx::array& q, const mx::array& k, const mx::array& v, const mx::array& g,
                  const mx::array& beta, const mx::array& st, float* y, float* so) {
    const int64_t B = q.shape(0), T = q.shape(1), hk = q.shape(2), dk = q.shape(3), hv = v.shape(2),
                  dv = v.shape(3);
    const int64_t rep = hv / hk;
    const float *qp = q.data<float>(), *kp = k.data<float>(), *vp = v.data<float>(), *gp = g.data<float>(),
                *bp = beta.data<float>(), *sp = st.data<float>();
    auto pair = [&](int64_t n) {
      const int64_t b = n / hv, h = n % hv, kh = h / rep;
      // The state, transposed ([Dk, Dv]) for rows_step.
      std::vector<float> s(dk * dv), qr(dk), kr(dk), vr(dv);
      for (int64_t r = 0; r < dv; ++r) {
        for (int64_t i = 0; i < dk; ++i) s[i * dv + r] = sp[at3(st, b, h, r) + i * st.strides()[3]];
      }
      for (int64_t t = 0; t < T; ++t) {
        const float* qs = qp + q.strides()[0] * b + q.strides()[1] * t + q.strides()[2] * kh;
        const float* ks = kp + k.strides()[0] * b + k.strides()[1] * t + k.strides()[2] * kh;
        const float* vs = vp + at3(v, b, t, h);
        for (int64_t i = 0; i < dk; ++i) {
          qr[i] = qs[i * q.strides()[3]];
          kr[i] = ks[i * k.strides()[3]];
        }
        for (int64_t i = 0; i < dv; ++i) vr[i] = vs[i * v.strides()[3]];
        const float gt = gp[at3(g, b, t, h)], bt = bp[at3(beta, b, t, h)];
        rows_step(s.data(), dv, dk, 0, dv, kr.data(), qr.data(), vr.data(), gt, bt, y + ((b * T + t) * hv + h) * dv);
      }
      float* out = so + n * dv * dk;
      for (int64_t r = 0; r < dv; ++r) {
        for (int64_t i = 0; i < dk; ++i) out[r * dk + i] = s[i * dv + r];
      }
    };
    const int64_t pairs = B * hv;
    // A pair's work is T·Dv·Dk·4 flops; below ~2^16 a wake-up of the workers costs more.
    if (pairs > 1 && T * dv * dk * pairs >= (1 << 16)) {
      const int64_t tasks = std::min<int64_t>(pairs, pool().size());
      pool().run(static_cast<int>(tasks), [&](int task) {
        for (int64_t n = task; n < pairs; n += tasks) pair(n);
      });
    } else {
      for (int64_t n = 0; n < pairs; ++n) pair(n);
    }
  }
};

// ---- CUDA -----------------------------------------------------------------------------------

constexpr int kWarps = 4;

constexpr const char* kHeader = R"(
__device__ __forceinline__ float mlex_gd_float(float v) { return v; }
__device__ __forceinline__ float mlex_gd_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float mlex_gd_float(__half v) { return __half2float(v); }
__device__ __forceinline__ void mlex_gd_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void mlex_gd_store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
__device__ __forceinline__ void mlex_gd_store(__half* p, float v) { *p = __float2half(v); }
// v rounded to the dtype `tag` points to, as the reference's ops round each result.
__device__ __forceinline__ float mlex_gd_round(float v, const float*) { return v; }
__device__ __forceinline__ float mlex_gd_round(float v, const __nv_bfloat16*) { return __bfloat162float(__float2bfloat16(v)); }
__device__ __forceinline__ float mlex_gd_round(float v, const __half*) { return __half2float(__float2half(v)); }
__device__ __forceinline__ float mlex_gd_warp_sum(float v) {
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
)";

// Template constants: DK, DV, HK, HV; dims = {T, B}; consts = {Dk^-1, Dk^-0.5, eps of the q/k
// RMSNorm}. One warp per (batch, value head, row of S): lane l keeps S[row, l + 32i] for
// i < DK/32 in registers through all T tokens. Each token it also does what the reference does
// with ops before the recurrence (normalize_qk and the gates), rounding where those ops round:
// q/k RMS-normalised over the warp and scaled (q by Dk^-1, k by Dk^-0.5), β = sigmoid(b),
// g = exp(−exp(A_log)·softplus(a + dt_bias)). The next token's inputs are loaded before the
// current one is computed, so their latency overlaps the warp reductions.
constexpr const char* kSource = R"(
  constexpr int NPT = DK / 32;
  const int lane = threadIdx.x & 31;
  const long warp = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int T = dims[0];
  const long B = dims[1];
  if (warp >= B * HV * DV) return;
  const long n = warp / DV;
  const int row = warp % DV;
  const long b = n / HV;
  const int h = n % HV;
  const int kh = h / (HV / HK);
  const auto* qp = q + (b * T * HK + kh) * DK + lane;
  const auto* kp = k + (b * T * HK + kh) * DK + lane;
  const auto* vp = v + (b * T * HV + h) * DV + row;
  const auto* ap = a + b * T * HV + h;
  const auto* bp = b_in + b * T * HV + h;
  auto* yp = y + (b * T * HV + h) * DV + row;
  const float q_scale = mlex_gd_round(consts[0], q), k_scale = mlex_gd_round(consts[1], q), eps = consts[2];
  const float decay_rate = expf(a_log[h]);
  const float dt = mlex_gd_float(dt_bias[h]);
  float s[NPT];
  #pragma unroll
  for (int i = 0; i < NPT; ++i) s[i] = state_in[(n * DV + row) * DK + lane + 32 * i];
  float qn[NPT], kn[NPT], vn = 0.f, an = 0.f, bn = 0.f;
  if (T > 0) {
    #pragma unroll
    for (int i = 0; i < NPT; ++i) {
      qn[i] = mlex_gd_float(qp[32 * i]);
      kn[i] = mlex_gd_float(kp[32 * i]);
    }
    vn = mlex_gd_float(vp[0]);
    an = mlex_gd_float(ap[0]);
    bn = mlex_gd_float(bp[0]);
  }
  for (int t = 0; t < T; ++t) {
    float qc[NPT], kc[NPT];
    #pragma unroll
    for (int i = 0; i < NPT; ++i) {
      qc[i] = qn[i];
      kc[i] = kn[i];
    }
    const float vc = vn, ac = an, bc = bn;
    if (t + 1 < T) {
      const long dq = (long)(t + 1) * HK * DK;
      #pragma unroll
      for (int i = 0; i < NPT; ++i) {
        qn[i] = mlex_gd_float(qp[dq + 32 * i]);
        kn[i] = mlex_gd_float(kp[dq + 32 * i]);
      }
      vn = mlex_gd_float(vp[(long)(t + 1) * HV * DV]);
      an = mlex_gd_float(ap[(long)(t + 1) * HV]);
      bn = mlex_gd_float(bp[(long)(t + 1) * HV]);
    }
    // normalize_qk
    float qq = 0.f, kk = 0.f;
    #pragma unroll
    for (int i = 0; i < NPT; ++i) {
      qq += qc[i] * qc[i];
      kk += kc[i] * kc[i];
    }
    qq = mlex_gd_warp_sum(qq);
    kk = mlex_gd_warp_sum(kk);
    const float rq = rsqrtf(qq / DK + eps), rk = rsqrtf(kk / DK + eps);
    #pragma unroll
    for (int i = 0; i < NPT; ++i) {
      qc[i] = mlex_gd_round(mlex_gd_round(qc[i] * rq, q) * q_scale, q);
      kc[i] = mlex_gd_round(mlex_gd_round(kc[i] * rk, q) * k_scale, q);
    }
    // The gates.
    const float x = mlex_gd_round(ac + dt, q);
    const float softplus = mlex_gd_round(fmaxf(x, 0.f) + log1pf(expf(-fabsf(x))), q);
    const float gc = expf(-decay_rate * softplus);
    const float beta = mlex_gd_round(1.f / (1.f + expf(-bc)), q);
    // The recurrence, each product rounded before it is added (no fused multiply-add), as the
    // reference's separate multiply and sum ops do.
    float kv = 0.f;
    #pragma unroll
    for (int i = 0; i < NPT; ++i) {
      s[i] = __fmul_rn(s[i], gc);
      kv = __fadd_rn(kv, __fmul_rn(s[i], kc[i]));
    }
    kv = mlex_gd_warp_sum(kv);
    const float delta = __fmul_rn(__fsub_rn(vc, kv), beta);
    float out = 0.f;
    #pragma unroll
    for (int i = 0; i < NPT; ++i) {
      s[i] = __fadd_rn(s[i], __fmul_rn(kc[i], delta));
      out = __fadd_rn(out, __fmul_rn(s[i], qc[i]));
    }
    out = mlex_gd_warp_sum(out);
    if (lane == 0) mlex_gd_store(yp + (long)t * HV * DV, out);
  }
  #pragma unroll
  for (int i = 0; i < NPT; ++i) state_out[(n * DV + row) * DK + lane + 32 * i] = s[i];
)";

const mlex::cuda_jit::KernelSpec kSpec{
    "gated_delta_update", kHeader, kSource,
    {"q", "k", "v", "a", "b_in", "a_log", "dt_bias", "state_in", "dims", "consts"}, {"y", "state_out"}};

// Benchmark ablation only (src/ablation.rs): the reference graph everywhere.
bool ablated() { return mlex::ablated(MLEX_ABLATE_KERNEL_GATED_DELTA); }

bool is_float(mx::Dtype d) { return d == mx::float32 || d == mx::bfloat16 || d == mx::float16; }

}  // namespace

std::optional<std::pair<mx::array, mx::array>> gated_delta(const mx::array& q, const mx::array& k,
                                                           const mx::array& v, const mx::array& g,
                                                           const mx::array& beta, const mx::array& state) {
  const auto s = mx::to_stream({});
  if (ablated() || s.device != mx::Device::cpu || q.ndim() != 4 || k.shape() != q.shape() || v.ndim() != 4 ||
      g.ndim() != 3 || beta.ndim() != 3 || state.ndim() != 4) {
    return std::nullopt;
  }
  const int B = q.shape(0), T = q.shape(1), hk = q.shape(2), dk = q.shape(3), hv = v.shape(2), dv = v.shape(3);
  const mx::Shape gs{B, T, hv};
  if (v.shape(0) != B || v.shape(1) != T || hk == 0 || hv % hk != 0 || dk == 0 || dv == 0 || g.shape() != gs ||
      beta.shape() != gs || state.shape() != mx::Shape{B, hv, dv, dk} || !is_float(q.dtype()) ||
      k.dtype() != q.dtype() || v.dtype() != q.dtype() || !is_float(g.dtype()) || !is_float(beta.dtype()) ||
      state.dtype() != mx::float32) {
    return std::nullopt;
  }
  const auto f32 = [&](const mx::array& a) { return mx::astype(a, mx::float32, s); };
  auto outs = mx::array::make_arrays({{B, T, hv, dv}, state.shape()}, {mx::float32, mx::float32},
                                     std::make_shared<CpuGatedDelta>(s),
                                     {f32(q), f32(k), f32(v), f32(g), f32(beta), state});
  return std::make_pair(mx::astype(outs[0], q.dtype(), s), outs[1]);
}

std::optional<std::pair<mx::array, mx::array>> gated_delta_update(const mx::array& q, const mx::array& k,
                                                                  const mx::array& v, const mx::array& a,
                                                                  const mx::array& b, const mx::array& a_log,
                                                                  const mx::array& dt_bias, const mx::array& state) {
  const auto s = mx::to_stream({});
  static const bool cuda = cuda_jit::available();
  if (ablated() || !cuda || s.device != mx::Device::gpu || q.ndim() != 4 || k.shape() != q.shape() ||
      v.ndim() != 4 || a.ndim() != 3 || state.ndim() != 4) {
    return std::nullopt;
  }
  const int B = q.shape(0), T = q.shape(1), hk = q.shape(2), dk = q.shape(3), hv = v.shape(2), dv = v.shape(3);
  const mx::Shape gs{B, T, hv};
  const auto dt = q.dtype();
  if (v.shape(0) != B || v.shape(1) != T || hk == 0 || hv % hk != 0 || dk % 32 != 0 || dk == 0 || dk > 256 ||
      dv == 0 || a.shape() != gs || b.shape() != gs || a_log.shape() != mx::Shape{hv} ||
      dt_bias.shape() != mx::Shape{hv} || state.shape() != mx::Shape{B, hv, dv, dk} || !is_float(dt) ||
      k.dtype() != dt || v.dtype() != dt || a.dtype() != dt || b.dtype() != dt || dt_bias.dtype() != dt ||
      !is_float(a_log.dtype()) || state.dtype() != mx::float32) {
    return std::nullopt;
  }
  // normalize_qk's constants, as mlx-lm computes them (in double, then float).
  const double inv = 1.0 / std::sqrt(static_cast<double>(dk));
  const mx::array consts({static_cast<float>(inv * inv), static_cast<float>(inv), static_cast<float>(1e-6 * inv * inv)});
  const int warps = B * hv * dv;
  const int blocks = (warps + kWarps - 1) / kWarps;
  auto outs = cuda_jit::try_run(kSpec,
                                {q, k, v, a, b, mx::astype(a_log, mx::float32, s), dt_bias, state,
                                 mx::array({T, B}, mx::int32), consts},
                                {{B, T, hv, dv}, state.shape()}, {dt, mx::float32}, {blocks * kWarps * 32, 1, 1},
                                {kWarps * 32, 1, 1}, {{"DK", dk}, {"DV", dv}, {"HK", hk}, {"HV", hv}}, s);
  if (!outs) return std::nullopt;
  return std::make_pair((*outs)[0], (*outs)[1]);
}

}  // namespace mlex
