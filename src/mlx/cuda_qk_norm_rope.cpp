#include "cuda_qk_norm_rope.h"

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "ablation.h"
#include "cuda_half_helpers.h"
#include "cuda_jit.h"

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
// q and k are normalized first. `at` is int32 [2]: the position (= the cache slot written) and
// the buffers' capacity. One block per (batch row, q, k or v head): q heads are written to `q`,
// k heads (rotated) and v heads (as they are) to row `slot` of `k_cache` / `v_cache`, which are
// `k_in` / `v_in` updated in place (cuda_launch's donation). Where MLX could not hand over an
// input's buffer, the output is a fresh one: every block then first copies a share of the input
// over, all rows but the slot's (which only its head's block writes).
constexpr const char* kCacheSource = R"(
  constexpr int ROW = HQ + 2 * HKV;
  const int head = blockIdx.x % ROW;
  const int b = blockIdx.x / ROW;
  const int slot = at[0];
  const int cap = at[1];
  const int nb = gridDim.x / ROW;
  constexpr int CHUNKS = D * (int)sizeof(T) / 16;  // 16-byte pieces of a row
  const unsigned long long pieces = (unsigned long long)nb * HKV * cap * CHUNKS;
  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  if (k_cache != k_in) {
    for (unsigned long long i = first; i < pieces; i += stride) {
      if ((int)((i / CHUNKS) % cap) != slot) reinterpret_cast<uint4*>(k_cache)[i] = reinterpret_cast<const uint4*>(k_in)[i];
    }
  }
  if (v_cache != v_in) {
    for (unsigned long long i = first; i < pieces; i += stride) {
      if ((int)((i / CHUNKS) % cap) != slot) reinterpret_cast<uint4*>(v_cache)[i] = reinterpret_cast<const uint4*>(v_in)[i];
    }
  }
  const T* src = qkv + ((unsigned long long)b * ROW + head) * D;
  const int t = threadIdx.x;
  if (head >= HQ + HKV) {
    T* dst = v_cache + (((unsigned long long)b * HKV + head - HQ - HKV) * cap + slot) * D;
    for (int i = t; i < D; i += blockDim.x) dst[i] = src[i];
    return;
  }
  const bool is_q = head < HQ;
  const float ps = (float)slot * __int_as_float(SCALE_BITS);
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
                                      {"qkv", "q_norm", "k_norm", "at", "freqs", "k_in", "v_in"},
                                      {"q", "k_cache", "v_cache"}};
  return s;
}

int float_bits(float f) {
  int i = 0;
  std::memcpy(&i, &f, sizeof i);
  return i;
}

}  // namespace

namespace {

// Whether this file's kernels apply to `qkv`, the fused q/k/v product of one decode step
// ([B, HQ + 2·HKV, 1, D], bfloat16 or float16, on the GPU), with this rope; not when a
// benchmark ablated the kernel (BENCHMARKS.md: MLX's ops run instead).
bool applies(uint32_t ablation, const mx::array& qkv, int n_q_heads, int n_kv_heads, const RopeArgs& rope) {
  static const bool cuda = cuda_jit::available();
  if (mlex::ablated(ablation) || !cuda || mx::to_stream({}).device != mx::Device::gpu) return false;
  const mx::Dtype t = qkv.dtype();
  if ((t != mx::bfloat16 && t != mx::float16) || qkv.ndim() != 4 || qkv.shape(1) != n_q_heads + 2 * n_kv_heads ||
      qkv.shape(2) != 1) {
    return false;
  }
  const int d = qkv.shape(3);
  if (d % 2 != 0 || d > 1024) return false;
  return !rope.freqs || (rope.freqs->dtype() == mx::float32 && rope.freqs->shape() == mx::Shape{d / 2});
}

// The constants both kernels take (see their sources), then `more`.
std::vector<std::pair<std::string, cuda_jit::Constant>> constants(
    const mx::array& qkv, int n_q_heads, int n_kv_heads, const RopeArgs& rope, float eps,
    std::initializer_list<std::pair<std::string, cuda_jit::Constant>> more) {
  const int d = qkv.shape(3);
  const float step = std::log(rope.base) / static_cast<float>(d / 2);
  std::vector<std::pair<std::string, cuda_jit::Constant>> c{
      {"T", qkv.dtype()}, {"HQ", n_q_heads}, {"HKV", n_kv_heads}, {"D", d}, {"TRAD", rope.traditional},
      {"FREQS", rope.freqs.has_value()}, {"STEP_BITS", rope.freqs ? 0 : float_bits(step)},
      {"SCALE_BITS", float_bits(rope.scale)}, {"EPS_BITS", float_bits(eps)}};
  c.insert(c.end(), more.begin(), more.end());
  return c;
}

// One block per head, of D/2 threads rounded up to a warp.
int threads_per_head(const mx::array& qkv) { return (qkv.shape(3) / 2 + 31) / 32 * 32; }

}  // namespace

std::optional<std::pair<mx::array, mx::array>> cuda_qk_norm_rope(const mx::array& qkv, int n_q_heads,
                                                                 int n_kv_heads, const mx::array& q_norm,
                                                                 const mx::array& k_norm, float eps,
                                                                 const RopeArgs& rope, const mx::array& positions) {
  if (!applies(MLEX_ABLATE_KERNEL_CUDA_QK_ROPE, qkv, n_q_heads, n_kv_heads, rope)) return std::nullopt;
  const mx::Dtype t = qkv.dtype();
  const int b = qkv.shape(0), d = qkv.shape(3);
  if (q_norm.dtype() != t || k_norm.dtype() != t || q_norm.shape() != mx::Shape{d} || k_norm.shape() != mx::Shape{d} ||
      positions.ndim() != 1 || (positions.shape(0) != 1 && positions.shape(0) != b)) {
    return std::nullopt;
  }
  const int threads = threads_per_head(qkv);
  const int blocks = b * (n_q_heads + n_kv_heads);
  auto outs = cuda_jit::try_run(
      spec(), {qkv, q_norm, k_norm, mx::astype(positions, mx::int32), rope.freqs ? *rope.freqs : mx::array(0.0f)},
      {{b, n_q_heads, 1, d}, {b, n_kv_heads, 1, d}}, {t, t}, {blocks * threads, 1, 1}, {threads, 1, 1},
      constants(qkv, n_q_heads, n_kv_heads, rope, eps, {{"PER_ROW", positions.shape(0) != 1}}));
  if (!outs) return std::nullopt;
  return std::make_pair((*outs)[0], (*outs)[1]);
}

std::optional<std::tuple<mx::array, mx::array, mx::array>> cuda_qkv_rope_into_cache(
    const mx::array& qkv, int n_q_heads, int n_kv_heads, const std::optional<std::pair<mx::array, mx::array>>& norms,
    float eps, const RopeArgs& rope, const mx::array& at, const mx::array& k_cache, const mx::array& v_cache) {
  if (!applies(MLEX_ABLATE_KERNEL_CUDA_KV_WRITE, qkv, n_q_heads, n_kv_heads, rope)) return std::nullopt;
  const mx::Dtype t = qkv.dtype();
  const int b = qkv.shape(0), d = qkv.shape(3);
  // (The copy of a cache that could not be taken over moves 16-byte pieces of rows.)
  if (d % 8 != 0 || k_cache.ndim() != 4 || k_cache.shape() != v_cache.shape() || k_cache.dtype() != t ||
      v_cache.dtype() != t || k_cache.shape(0) != b || k_cache.shape(1) != n_kv_heads || k_cache.shape(3) != d ||
      at.dtype() != mx::int32 || at.shape() != mx::Shape{2}) {
    return std::nullopt;
  }
  if (norms && (norms->first.dtype() != t || norms->second.dtype() != t || norms->first.shape() != mx::Shape{d} ||
                norms->second.shape() != mx::Shape{d})) {
    return std::nullopt;
  }
  const int threads = threads_per_head(qkv);
  const int blocks = b * (n_q_heads + 2 * n_kv_heads);
  const mx::array none(0.0f);
  auto outs = cuda_jit::try_run(
      cache_spec(),
      {qkv, norms ? norms->first : none, norms ? norms->second : none, at, rope.freqs ? *rope.freqs : none, k_cache,
       v_cache},
      {{b, n_q_heads, 1, d}, k_cache.shape(), v_cache.shape()}, {t, t, t}, {blocks * threads, 1, 1}, {threads, 1, 1},
      constants(qkv, n_q_heads, n_kv_heads, rope, norms ? eps : 0.0f, {{"NORM", norms.has_value()}}), {}, {-1, 5, 6});
  if (!outs) return std::nullopt;
  return std::make_tuple((*outs)[0], (*outs)[1], (*outs)[2]);
}

}  // namespace mlex
