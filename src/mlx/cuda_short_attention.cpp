#include "cuda_short_attention.h"

#include <cstring>
#include <string>
#include <tuple>

#include "ablation.h"
#include "cuda_half_helpers.h"
#include "cuda_jit.h"

namespace mx = mlx::core;

namespace mlex {
namespace {

// Template constants: T the activation type, HQ and HKV the heads, D the head size, WARPS the
// warps of a block, SCALE_BITS the softmax scale as a float's bits, QT whether q and out are
// token-major ([B, L, H, D]: a short pass built as decode rows) rather than [B, H, L, D].
// meta (int32 [3]): the keys before the first query, the buffers' capacity C, the queries L.
// One block per (row, head, query). Warp w takes keys w, w + WARPS, ...; each lane holds D / 32
// consecutive elements of q, of the key it reads and of its running output, so a key's score
// is one warp sum. Each warp keeps an online softmax (running max, sum of exponentials, the
// weighted sum of values); the block then merges the warps' partial results in shared memory.
constexpr const char* kSource = R"(
  constexpr int PER = D / 32;
  const int prev = meta[0], cap = meta[1], nq = meta[2];
  const int blk = blockIdx.x;
  const int l = blk % nq;
  const int h = (blk / nq) % HQ;
  const int b = blk / (nq * HQ);
  const int kvh = h / (HQ / HKV);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const unsigned long long row = QT ? ((unsigned long long)b * nq + l) * HQ + h : ((unsigned long long)b * HQ + h) * nq + l;
  const T* qp = q + row * D + lane * PER;
  const float scale = __int_as_float(SCALE_BITS);
  float qv[PER], acc[PER];
  #pragma unroll
  for (int i = 0; i < PER; ++i) {
    qv[i] = mlex_float(qp[i]) * scale;
    acc[i] = 0.0f;
  }
  const unsigned long long head = ((unsigned long long)b * HKV + kvh) * (unsigned long long)cap * D + lane * PER;
  const T* kb = k + head;
  const T* vb = v + head;
  const int keys = prev + l + 1;
)";

}  // namespace

// (No newline after the opening quote: spliced after kSource, the text is what it was as one.)
const char* const kCudaAttendOneQuery = R"(  const float neg_inf = __int_as_float(0xff800000);
  float m = neg_inf, s = 0.0f;
  for (int j = w; j < keys; j += WARPS) {
    const T* kr = kb + (unsigned long long)j * D;
    float d = 0.0f;
    #pragma unroll
    for (int i = 0; i < PER; ++i) d += qv[i] * mlex_float(kr[i]);
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    const float mn = fmaxf(m, d);
    const float c = expf(m - mn), p = expf(d - mn);
    s = s * c + p;
    const T* vr = vb + (unsigned long long)j * D;
    #pragma unroll
    for (int i = 0; i < PER; ++i) acc[i] = acc[i] * c + p * mlex_float(vr[i]);
    m = mn;
  }
  __shared__ float wm[WARPS], ws[WARPS];
  __shared__ float wacc[WARPS][D];
  if (lane == 0) {
    wm[w] = m;
    ws[w] = s;
  }
  #pragma unroll
  for (int i = 0; i < PER; ++i) wacc[w][lane * PER + i] = acc[i];
  __syncthreads();
  const int t = threadIdx.x;
  if (t >= D) return;
  float mx_ = neg_inf;
  for (int i = 0; i < WARPS; ++i) mx_ = fmaxf(mx_, wm[i]);
  float total = 0.0f, o = 0.0f;
  for (int i = 0; i < WARPS; ++i) {
    const float f = wm[i] == neg_inf ? 0.0f : expf(wm[i] - mx_);
    total += ws[i] * f;
    o += wacc[i][t] * f;
  }
  mlex_store(&out[row * D + t], o / total);
)";

namespace {

const cuda_jit::KernelSpec& spec() {
  static const std::string body = std::string(kSource) + kCudaAttendOneQuery;
  static const cuda_jit::KernelSpec s{"short_attention", kCudaHalfHelpers, body.c_str(), {"q", "k", "v", "meta"}, {"out"}};
  return s;
}

int float_bits(float f) {
  int i = 0;
  std::memcpy(&i, &f, sizeof i);
  return i;
}

// The int32 [3] meta of a pass, made once for all its layers.
mx::array meta_of(int prev, int cap, int nq) {
  thread_local std::optional<std::tuple<int, int, int, mx::array>> last;
  if (!last || std::get<0>(*last) != prev || std::get<1>(*last) != cap || std::get<2>(*last) != nq) {
    last.emplace(prev, cap, nq, mx::array({prev, cap, nq}, mx::int32));
  }
  return std::get<3>(*last);
}

}  // namespace

std::optional<mx::array> cuda_short_attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
                                              int prev, bool token_major, bool flat) {
  // Benchmark ablation only (BENCHMARKS.md): the whole buffers under a mask, through MLX.
  static const bool cuda = cuda_jit::available();
  if (mlex::ablated(MLEX_ABLATE_KERNEL_CUDA_SHORT_ATTN) || !cuda || mx::to_stream({}).device != mx::Device::gpu) {
    return std::nullopt;
  }
  const mx::Dtype t = q.dtype();
  if ((t != mx::bfloat16 && t != mx::float16 && t != mx::float32) || q.ndim() != 4 || k.ndim() != 4 ||
      v.shape() != k.shape() || k.dtype() != t || v.dtype() != t) {
    return std::nullopt;
  }
  const int b = q.shape(0), hq = q.shape(1), nq = q.shape(2), d = q.shape(3);
  const int hkv = k.shape(1), cap = k.shape(2);
  if (k.shape(0) != b || k.shape(3) != d || hkv < 1 || hq % hkv != 0 || d % 32 != 0 || d > 256 || nq < 1 ||
      prev < 0 || prev + nq > cap) {
    return std::nullopt;
  }
  // q as a [B, H, L, D] view of token-major memory (decode rows): read it, and write the output,
  // in that layout, rather than copying q and the output through transposes.
  const mx::array qin = token_major ? mx::transpose(q, {0, 2, 1, 3}) : q;
  constexpr int warps = 32;
  const int blocks = b * hq * nq;
  // [B, HQ, 1, D] row contiguous is [B, 1, HQ·D] in memory.
  const bool flat_out = flat && nq == 1 && !token_major;
  const mx::Shape out_shape = flat_out ? mx::Shape{b, 1, hq * d} : qin.shape();
  auto outs = cuda_jit::try_run(spec(), {qin, k, v, meta_of(prev, cap, nq)}, {out_shape}, {t},
                                {blocks * warps * 32, 1, 1},
                                {warps * 32, 1, 1},
                                {{"T", t}, {"HQ", hq}, {"HKV", hkv}, {"D", d}, {"WARPS", warps},
                                 {"SCALE_BITS", float_bits(scale)}, {"QT", token_major}});
  if (!outs) return std::nullopt;
  return token_major ? mx::transpose((*outs)[0], {0, 2, 1, 3}) : (*outs)[0];
}

}  // namespace mlex
