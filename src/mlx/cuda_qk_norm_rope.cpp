#include "cuda_qk_norm_rope.h"

#include <cmath>
#include <cstring>
#include <string>

#include "ablation.h"
#include "cuda_half_helpers.h"
#include "cuda_jit.h"

namespace mx = mlx::core;

namespace mlex {
namespace {

// Template constants: T the activation type, HQ and HKV the q and k heads, D the head size,
// TRAD the traditional (interleaved) pairing, FREQS whether `freqs` replaces the base,
// PER_ROW whether `pos` holds one position per batch row; STEP_BITS, SCALE_BITS and EPS_BITS
// the floats ln(base)/(D/2), the position scale and the norm's eps, as their bits.
// One block per (batch row, head), of HALF = D/2 threads rounded up to a warp: thread t takes
// the pair (t, t + D/2) (or (2t, 2t + 1) with TRAD). As MLX's kernels compute them: the head's
// 1 / sqrt(mean(x²) + eps) in float32, the normalized value w · T(x · that) rounded to T; then
// the pair rotated by (position · scale) · inv_freq_t in float32 and rounded to T, with
// inv_freq_t = exp(-t · ln(base) / (D/2)) or 1 / freqs[t] (MLX's rope).
constexpr const char* kSource = R"(
  constexpr int HALF = D / 2;
  const int head = blockIdx.x % (HQ + HKV);
  const int b = blockIdx.x / (HQ + HKV);
  const bool is_q = head < HQ;
  // The k heads follow the q heads in each row of qkv, so head indexes both.
  const T* src = qkv + ((unsigned long long)b * (HQ + 2 * HKV) + head) * D;
  const int t = threadIdx.x;
  const int i1 = TRAD ? 2 * t : t;
  const int i2 = TRAD ? 2 * t + 1 : t + HALF;
  float x1 = 0.0f, x2 = 0.0f;
  if (t < HALF) {
    x1 = mlex_float(src[i1]);
    x2 = mlex_float(src[i2]);
  }
  float s = x1 * x1 + x2 * x2;
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  __shared__ float part[32];
  if ((t & 31) == 0) part[t >> 5] = s;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < (int)(blockDim.x + 31) / 32; ++w) total += part[w];
  if (t >= HALF) return;
  const float r = rsqrtf(total / (float)D + __int_as_float(EPS_BITS));
  const T* nw = is_q ? q_norm : k_norm;
  const float n1 = mlex_round(mlex_float(nw[i1]) * mlex_round(x1 * r, src), src);
  const float n2 = mlex_round(mlex_float(nw[i2]) * mlex_round(x2 * r, src), src);
  const float inv = FREQS ? 1.0f / freqs[t] : expf(-(float)t * __int_as_float(STEP_BITS));
  const float theta = ((float)pos[PER_ROW ? b : 0] * __int_as_float(SCALE_BITS)) * inv;
  float sn, cs;
  sincosf(theta, &sn, &cs);
  T* dst = is_q ? q + ((unsigned long long)b * HQ + head) * D : k + ((unsigned long long)b * HKV + head - HQ) * D;
  mlex_store(&dst[i1], n1 * cs - n2 * sn);
  mlex_store(&dst[i2], n1 * sn + n2 * cs);
)";

const cuda_jit::KernelSpec& spec() {
  static const cuda_jit::KernelSpec s{
      "qk_norm_rope", kCudaHalfHelpers, kSource, {"qkv", "q_norm", "k_norm", "pos", "freqs"}, {"q", "k"}};
  return s;
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
  static const bool cuda = cuda_jit::available();
  if (mlex::ablated(MLEX_ABLATE_KERNEL_CUDA_QK_ROPE) || !cuda || mx::to_stream({}).device != mx::Device::gpu) {
    return std::nullopt;
  }
  const mx::Dtype t = qkv.dtype();
  if ((t != mx::bfloat16 && t != mx::float16) || qkv.ndim() != 4 || qkv.shape(1) != n_q_heads + 2 * n_kv_heads ||
      qkv.shape(2) != 1) {
    return std::nullopt;
  }
  const int b = qkv.shape(0), d = qkv.shape(3);
  if (d % 2 != 0 || d > 1024 || q_norm.dtype() != t || k_norm.dtype() != t || q_norm.shape() != mx::Shape{d} ||
      k_norm.shape() != mx::Shape{d} || positions.ndim() != 1 ||
      (positions.shape(0) != 1 && positions.shape(0) != b)) {
    return std::nullopt;
  }
  if (rope.freqs && (rope.freqs->dtype() != mx::float32 || rope.freqs->shape() != mx::Shape{d / 2})) return std::nullopt;
  const int threads = (d / 2 + 31) / 32 * 32;
  const int blocks = b * (n_q_heads + n_kv_heads);
  const mx::array pos = mx::astype(positions, mx::int32);
  const float step = std::log(rope.base) / static_cast<float>(d / 2);
  auto outs = cuda_jit::try_run(
      spec(), {qkv, q_norm, k_norm, pos, rope.freqs ? *rope.freqs : mx::array(0.0f)},
      {{b, n_q_heads, 1, d}, {b, n_kv_heads, 1, d}}, {t, t}, {blocks * threads, 1, 1}, {threads, 1, 1},
      {{"T", t}, {"HQ", n_q_heads}, {"HKV", n_kv_heads}, {"D", d}, {"TRAD", rope.traditional},
       {"FREQS", rope.freqs.has_value()}, {"PER_ROW", positions.shape(0) != 1},
       {"STEP_BITS", rope.freqs ? 0 : float_bits(step)}, {"SCALE_BITS", float_bits(rope.scale)},
       {"EPS_BITS", float_bits(eps)}});
  if (!outs) return std::nullopt;
  return std::make_pair((*outs)[0], (*outs)[1]);
}

}  // namespace mlex
