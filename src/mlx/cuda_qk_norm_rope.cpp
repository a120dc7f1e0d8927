#include "cuda_qk_norm_rope.h"

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>

#include "ablation.h"
#include "cuda_half_helpers.h"
#include "cuda_jit.h"
#include "cuda_short_attention.h"

namespace mx = mlx::core;

namespace mlex {
namespace {

// Device code both kernels share: one head's RMSNorm (optional) and rotary embedding. A block
// holds one head, HALF = D/2 threads rounded up to a warp: thread t takes the pair (t, t + D/2)
// (or (2t, 2t + 1) traditional). As MLX's kernels compute them: the head's
// 1 / sqrt(mean(x²) + eps) in float32, the normalized value w · T(x · that) rounded to T; then
// the pair rotated by (position · scale) · inv_freq_t in float32 and rounded to T, with
// inv_freq_t = exp(-t · ln(base) / (D/2)) (`step` = ln(base) / (D/2)) or 1 / freqs[t].
constexpr const char* kNormRope = R"(
// Thread t's rotated pair of the head at `src` (normalized by `nw` first when NORM), into o1/o2
// for indexes i1/i2; false for the threads past the pairs. Every thread of the block must call
// it: the norm's sum is a block reduction.
template <typename T, int D, bool TRAD, bool NORM, bool FREQS, typename W>
__device__ __forceinline__ bool mlex_norm_rope(const T* src, const W* nw, float eps, const float* freqs, float step,
                                               float pos_scaled, float& o1, float& o2, int& i1, int& i2) {
  constexpr int HALF = D / 2;
  const int t = threadIdx.x;
  i1 = TRAD ? 2 * t : t;
  i2 = TRAD ? 2 * t + 1 : t + HALF;
  float x1 = 0.0f, x2 = 0.0f;
  if (t < HALF) {
    x1 = mlex_float(src[i1]);
    x2 = mlex_float(src[i2]);
  }
  if (NORM) {
    float s = x1 * x1 + x2 * x2;
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    __shared__ float part[32];
    if ((t & 31) == 0) part[t >> 5] = s;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < (int)(blockDim.x + 31) / 32; ++w) total += part[w];
    if (t >= HALF) return false;
    const float r = rsqrtf(total / (float)D + eps);
    x1 = mlex_round(mlex_float(nw[i1]) * mlex_round(x1 * r, src), src);
    x2 = mlex_round(mlex_float(nw[i2]) * mlex_round(x2 * r, src), src);
  }
  if (t >= HALF) return false;
  const float inv = FREQS ? 1.0f / freqs[t] : expf(-(float)t * step);
  const float theta = pos_scaled * inv;
  float sn, cs;
  sincosf(theta, &sn, &cs);
  o1 = x1 * cs - x2 * sn;
  o2 = x1 * sn + x2 * cs;
  return true;
}
)";

// Template constants: T the activation type, HQ and HKV the q and k heads, D the head size,
// TRAD the traditional (interleaved) pairing, FREQS whether `freqs` replaces the base,
// PER_ROW whether `pos` holds one position per batch row; STEP_BITS, SCALE_BITS and EPS_BITS
// the floats ln(base)/(D/2), the position scale and the norm's eps, as their bits.
// One block per (batch row, head).
constexpr const char* kSource = R"(
  const int head = blockIdx.x % (HQ + HKV);
  const int b = blockIdx.x / (HQ + HKV);
  const bool is_q = head < HQ;
  // The k heads follow the q heads in each row of qkv, so head indexes both.
  const T* src = qkv + ((unsigned long long)b * (HQ + 2 * HKV) + head) * D;
  const float ps = (float)pos[PER_ROW ? b : 0] * __int_as_float(SCALE_BITS);
  float o1, o2;
  int i1, i2;
  if (!mlex_norm_rope<T, D, TRAD, true, FREQS>(src, is_q ? q_norm : k_norm, __int_as_float(EPS_BITS), freqs,
                                               __int_as_float(STEP_BITS), ps, o1, o2, i1, i2)) {
    return;
  }
  T* dst = is_q ? q + ((unsigned long long)b * HQ + head) * D : k + ((unsigned long long)b * HKV + head - HQ) * D;
  mlex_store(&dst[i1], o1);
  mlex_store(&dst[i2], o2);
)";

// The decode step's q/k/v straight into the key/value cache: constants as above, NORM whether
// q and k are normalized first. `at` is int32 [2]: the buffers' column written and their
// capacity. One block per (batch row, q, k or v head): q heads are written to `q`, k heads
// (rotated) and v heads (as they are) into column `slot` of the buffers `k_buf` / `v_buf`, in
// place (see cuda_qkv_into_cache: the caller owns them).
constexpr const char* kCacheSource = R"(
  constexpr int ROW = HQ + 2 * HKV;
  const int head = blockIdx.x % ROW;
  const int b = blockIdx.x / ROW;
  const int slot = at[0];
  const int cap = at[1];
  T* k_cache = const_cast<T*>(k_buf);
  T* v_cache = const_cast<T*>(v_buf);
  const T* src = qkv + ((unsigned long long)b * ROW + head) * D;
  const int t = threadIdx.x;
  if (head >= HQ + HKV) {
    T* dst = v_cache + (((unsigned long long)b * HKV + head - HQ - HKV) * cap + slot) * D;
    for (int i = t; i < D; i += blockDim.x) dst[i] = src[i];
    return;
  }
  const bool is_q = head < HQ;
  const float ps = (float)pos[PER_ROW ? b : 0] * __int_as_float(SCALE_BITS);
  float o1, o2;
  int i1, i2;
  if (!mlex_norm_rope<T, D, TRAD, NORM, FREQS>(src, is_q ? q_norm : k_norm, __int_as_float(EPS_BITS), freqs,
                                               __int_as_float(STEP_BITS), ps, o1, o2, i1, i2)) {
    return;
  }
  T* dst = is_q ? q + ((unsigned long long)b * HQ + head) * D
                : k_cache + (((unsigned long long)b * HKV + head - HQ) * cap + slot) * D;
  mlex_store(&dst[i1], o1);
  mlex_store(&dst[i2], o2);
)";

// The whole attention block of a decode step (a full-attention cache, up to a short context):
// constants as kCacheSource's, WARPS the warps of a block, ATTN_BITS the softmax scale's bits.
// One block per (batch row, q head). Every block of a kv group rotates that group's key and
// writes it, and the value, into column `slot`: the same bits from each block, so what a block
// reads back after its barrier is right whichever write landed. Then the head's rotated q,
// rounded to T as kCacheSource stores it, attends over keys 0 ..= slot exactly as
// cuda_short_attention's kernel does (its second half, kCudaAttendOneQuery, the same sums in the
// same order), so the output is the two kernels' bit for bit; written as [B, 1, HQ·D].
constexpr const char* kAttnSource = R"(
  constexpr int ROW = HQ + 2 * HKV;
  constexpr int PER = D / 32;
  const int h = blockIdx.x % HQ;
  const int b = blockIdx.x / HQ;
  const int kvh = h / (HQ / HKV);
  const int slot = at[0];
  const int cap = at[1];
  T* k_cache = const_cast<T*>(k_buf);
  T* v_cache = const_cast<T*>(v_buf);
  const T* src = qkv + (unsigned long long)b * ROW * D;
  const float ps = (float)pos[PER_ROW ? b : 0] * __int_as_float(SCALE_BITS);
  const float eps = __int_as_float(EPS_BITS), step = __int_as_float(STEP_BITS);
  // q rounded to T (as kCacheSource stores it), kept as floats.
  __shared__ float qs[D];
  float o1, o2;
  int i1, i2;
  if (mlex_norm_rope<T, D, TRAD, NORM, FREQS>(src + h * D, q_norm, eps, freqs, step, ps, o1, o2, i1, i2)) {
    qs[i1] = mlex_round(o1, src);
    qs[i2] = mlex_round(o2, src);
  }
  // (The norm's block sum reuses its shared scratch in the next call.)
  __syncthreads();
  const unsigned long long head = ((unsigned long long)b * HKV + kvh) * (unsigned long long)cap * D;
  if (mlex_norm_rope<T, D, TRAD, NORM, FREQS>(src + (HQ + kvh) * D, k_norm, eps, freqs, step, ps, o1, o2, i1, i2)) {
    T* kd = k_cache + head + (unsigned long long)slot * D;
    mlex_store(&kd[i1], o1);
    mlex_store(&kd[i2], o2);
  }
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    v_cache[head + (unsigned long long)slot * D + i] = src[(HQ + HKV + kvh) * D + i];
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const float scale = __int_as_float(ATTN_BITS);
  float qv[PER], acc[PER];
  #pragma unroll
  for (int i = 0; i < PER; ++i) {
    qv[i] = qs[lane * PER + i] * scale;
    acc[i] = 0.0f;
  }
  const T* kb = k_cache + head + lane * PER;
  const T* vb = v_cache + head + lane * PER;
  const int keys = slot + 1;
  // Row b * HQ + h of out ([B, 1, HQ·D]).
  const unsigned long long row = (unsigned long long)b * HQ + h;
)";

const std::string& header() {
  static const std::string h = std::string(kCudaHalfHelpers) + kNormRope;
  return h;
}

const cuda_jit::KernelSpec& spec() {
  static const cuda_jit::KernelSpec s{
      "qk_norm_rope", header().c_str(), kSource, {"qkv", "q_norm", "k_norm", "pos", "freqs"}, {"q", "k"}};
  return s;
}

const cuda_jit::KernelSpec& cache_spec() {
  static const cuda_jit::KernelSpec s{"qkv_rope_cache",
                                      header().c_str(),
                                      kCacheSource,
                                      {"qkv", "q_norm", "k_norm", "pos", "at", "freqs", "k_buf", "v_buf"},
                                      {"q"}};
  return s;
}

// The head size D of a decode step's fused product `qkv`: [B, HQ + 2·HKV, 1, D], or the product
// as the projection writes it, [B, 1, (HQ + 2·HKV)·D] (the same memory, so the step needs no
// reshape op); 0 for any other shape.
int head_dim_of(const mx::array& qkv, int n_q_heads, int n_kv_heads) {
  const int row = n_q_heads + 2 * n_kv_heads;
  if (row <= 0) return 0;
  if (qkv.ndim() == 4 && qkv.shape(1) == row && qkv.shape(2) == 1) return qkv.shape(3);
  if (qkv.ndim() == 3 && qkv.shape(1) == 1 && qkv.shape(2) % row == 0) return qkv.shape(2) / row;
  return 0;
}

const cuda_jit::KernelSpec& attn_spec() {
  static const std::string body = std::string(kAttnSource) + kCudaAttendOneQuery;
  static const cuda_jit::KernelSpec s{"qkv_cache_attention",
                                      header().c_str(),
                                      body.c_str(),
                                      {"qkv", "q_norm", "k_norm", "pos", "at", "freqs", "k_buf", "v_buf"},
                                      {"out"}};
  return s;
}

// Whether either kernel applies to a decode step's fused product `qkv` (head_dim_of: 16-bit, D
// even and at most 1024) and `rope`, on CUDA, with `ablation` off.
bool applies(uint32_t ablation, const mx::array& qkv, int n_q_heads, int n_kv_heads, const RopeArgs& rope) {
  static const bool cuda = cuda_jit::available();
  if (mlex::ablated(ablation) || !cuda || mx::to_stream({}).device != mx::Device::gpu) return false;
  const mx::Dtype t = qkv.dtype();
  const int d = head_dim_of(qkv, n_q_heads, n_kv_heads);
  if ((t != mx::bfloat16 && t != mx::float16) || d == 0 || d % 2 != 0 || d > 1024) return false;
  return !rope.freqs || (rope.freqs->dtype() == mx::float32 && rope.freqs->shape() == mx::Shape{d / 2});
}

// A float32 scalar for an input a kernel does not read (no norms, no frequency table), made
// once per thread rather than allocated at every launch.
const mx::array& unused_input() {
  thread_local const mx::array none(0.0f);
  return none;
}

int float_bits(float f) {
  int i = 0;
  std::memcpy(&i, &f, sizeof i);
  return i;
}

}  // namespace

std::optional<std::pair<mx::array, mx::array>> cuda_qk_norm_rope(const mx::array& qkv, int n_q_heads,
                                                                 int n_kv_heads, const mx::array& q_norm,
                                                                 const mx::array& k_norm, float eps,
                                                                 const RopeArgs& rope, const mx::array& positions) {
  // Benchmark ablation only (BENCHMARKS.md): MLX's norms and ropes.
  if (!applies(MLEX_ABLATE_KERNEL_CUDA_QK_ROPE, qkv, n_q_heads, n_kv_heads, rope)) return std::nullopt;
  const mx::Dtype t = qkv.dtype();
  const int b = qkv.shape(0), d = head_dim_of(qkv, n_q_heads, n_kv_heads);
  if (q_norm.dtype() != t || k_norm.dtype() != t || q_norm.shape() != mx::Shape{d} ||
      k_norm.shape() != mx::Shape{d} || positions.ndim() != 1 ||
      (positions.shape(0) != 1 && positions.shape(0) != b)) {
    return std::nullopt;
  }
  const int threads = (d / 2 + 31) / 32 * 32;
  const int blocks = b * (n_q_heads + n_kv_heads);
  const mx::array pos = mx::astype(positions, mx::int32);
  const float step = std::log(rope.base) / static_cast<float>(d / 2);
  auto outs = cuda_jit::try_run(
      spec(), {qkv, q_norm, k_norm, pos, rope.freqs ? *rope.freqs : unused_input()},
      {{b, n_q_heads, 1, d}, {b, n_kv_heads, 1, d}}, {t, t}, {blocks * threads, 1, 1}, {threads, 1, 1},
      {{"T", t}, {"HQ", n_q_heads}, {"HKV", n_kv_heads}, {"D", d}, {"TRAD", rope.traditional},
       {"FREQS", rope.freqs.has_value()}, {"PER_ROW", positions.shape(0) != 1},
       {"STEP_BITS", rope.freqs ? 0 : float_bits(step)}, {"SCALE_BITS", float_bits(rope.scale)},
       {"EPS_BITS", float_bits(eps)}});
  if (!outs) return std::nullopt;
  return std::make_pair((*outs)[0], (*outs)[1]);
}

namespace {

// Whether the cache-writing kernels take these buffers, positions and norms (applies() said yes
// for qkv).
bool cache_args_fit(const mx::array& qkv, int n_kv_heads, const std::optional<std::pair<mx::array, mx::array>>& norms,
                    const mx::array& positions, const mx::array& at, const mx::array& k_cache, const mx::array& v_cache,
                    int b, int d) {
  const mx::Dtype t = qkv.dtype();
  if (k_cache.ndim() != 4 || k_cache.shape() != v_cache.shape() || k_cache.dtype() != t ||
      v_cache.dtype() != t || k_cache.shape(0) != b || k_cache.shape(1) != n_kv_heads || k_cache.shape(3) != d ||
      at.dtype() != mx::int32 || at.shape() != mx::Shape{2} || positions.ndim() != 1 ||
      (positions.shape(0) != 1 && positions.shape(0) != b)) {
    return false;
  }
  return !norms || (norms->first.dtype() == t && norms->second.dtype() == t && norms->first.shape() == mx::Shape{d} &&
                    norms->second.shape() == mx::Shape{d});
}

}  // namespace

std::optional<mx::array> cuda_decode_attention(const mx::array& qkv, int n_q_heads, int n_kv_heads,
                                               const std::optional<std::pair<mx::array, mx::array>>& norms, float eps,
                                               const RopeArgs& rope, const mx::array& positions, const mx::array& at,
                                               const mx::array& k_cache, const mx::array& v_cache, float scale) {
  // Benchmark ablation only (BENCHMARKS.md): the write kernel, then the attention kernel.
  if (mlex::ablated(MLEX_ABLATE_KERNEL_CUDA_SHORT_ATTN | MLEX_ABLATE_KERNEL_CUDA_FUSED_ATTN) ||
      !applies(MLEX_ABLATE_KERNEL_CUDA_KV_WRITE, qkv, n_q_heads, n_kv_heads, rope)) {
    return std::nullopt;
  }
  const mx::Dtype t = qkv.dtype();
  const int b = qkv.shape(0), d = head_dim_of(qkv, n_q_heads, n_kv_heads);
  // The attention's lanes hold D / 32 elements each (cuda_short_attention's limits).
  if (d % 32 != 0 || d > 256 || n_kv_heads < 1 || n_q_heads % n_kv_heads != 0 ||
      !cache_args_fit(qkv, n_kv_heads, norms, positions, at, k_cache, v_cache, b, d)) {
    return std::nullopt;
  }
  constexpr int warps = 32;
  const float step = std::log(rope.base) / static_cast<float>(d / 2);
  const mx::array& none = unused_input();
  auto outs = cuda_jit::try_run(
      attn_spec(),
      {qkv, norms ? norms->first : none, norms ? norms->second : none, mx::astype(positions, mx::int32), at,
       rope.freqs ? *rope.freqs : none, k_cache, v_cache},
      {{b, 1, n_q_heads * d}}, {t}, {b * n_q_heads * warps * 32, 1, 1}, {warps * 32, 1, 1},
      {{"T", t}, {"HQ", n_q_heads}, {"HKV", n_kv_heads}, {"D", d}, {"TRAD", rope.traditional},
       {"FREQS", rope.freqs.has_value()}, {"NORM", norms.has_value()}, {"PER_ROW", positions.shape(0) != 1},
       {"STEP_BITS", rope.freqs ? 0 : float_bits(step)}, {"SCALE_BITS", float_bits(rope.scale)},
       {"EPS_BITS", norms ? float_bits(eps) : 0}, {"WARPS", warps}, {"ATTN_BITS", float_bits(scale)}},
      {}, {6, 7});
  if (!outs) return std::nullopt;
  return (*outs)[0];
}

std::optional<mx::array> cuda_qkv_into_cache(
    const mx::array& qkv, int n_q_heads, int n_kv_heads, const std::optional<std::pair<mx::array, mx::array>>& norms,
    float eps, const RopeArgs& rope, const mx::array& positions, const mx::array& at, const mx::array& k_cache,
    const mx::array& v_cache) {
  // Benchmark ablation only (BENCHMARKS.md): the separate kernels and MLX's cache writes.
  if (!applies(MLEX_ABLATE_KERNEL_CUDA_KV_WRITE, qkv, n_q_heads, n_kv_heads, rope)) return std::nullopt;
  const mx::Dtype t = qkv.dtype();
  const int b = qkv.shape(0), d = head_dim_of(qkv, n_q_heads, n_kv_heads);
  if (!cache_args_fit(qkv, n_kv_heads, norms, positions, at, k_cache, v_cache, b, d)) return std::nullopt;
  const int threads = (d / 2 + 31) / 32 * 32;
  const int blocks = b * (n_q_heads + 2 * n_kv_heads);
  const float step = std::log(rope.base) / static_cast<float>(d / 2);
  const mx::array& none = unused_input();
  auto outs = cuda_jit::try_run(
      cache_spec(),
      {qkv, norms ? norms->first : none, norms ? norms->second : none, mx::astype(positions, mx::int32), at,
       rope.freqs ? *rope.freqs : none, k_cache, v_cache},
      {{b, n_q_heads, 1, d}}, {t}, {blocks * threads, 1, 1}, {threads, 1, 1},
      {{"T", t}, {"HQ", n_q_heads}, {"HKV", n_kv_heads}, {"D", d}, {"TRAD", rope.traditional},
       {"FREQS", rope.freqs.has_value()}, {"NORM", norms.has_value()}, {"PER_ROW", positions.shape(0) != 1},
       {"STEP_BITS", rope.freqs ? 0 : float_bits(step)}, {"SCALE_BITS", float_bits(rope.scale)},
       {"EPS_BITS", norms ? float_bits(eps) : 0}},
      {}, {6, 7});
  if (!outs) return std::nullopt;
  return (*outs)[0];
}

}  // namespace mlex
