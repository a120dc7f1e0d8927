#include "cuda_quantized_matvec.h"

#include "ablation.h"
#include "cuda_half_helpers.h"
#include "cuda_jit.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace mx = mlx::core;

namespace mlex {
namespace {

// Rows of w per warp and warps per block: 8 rows a block keeps a 3,584-row projection spread
// over ~450 blocks, enough to keep every SM's memory pipe busy.
constexpr int kRowsPerWarp = 2;
constexpr int kWarps = 4;
// The most rows of x (decode rows of a batch) the kernel takes; each further 8 rows re-read w.
constexpr int kMaxRowsOfX = 32;
// Rows of x up to which the one-row instantiation serves (see cuda_quantized_matvec).
constexpr int kSmallRows = 4;

// Helpers NVRTC compiles ahead of the kernel body, after kCudaHalfHelpers (cuda_jit's prelude
// brings the CUDA bfloat16/half types).
constexpr const char* kHeader = R"(
__device__ __forceinline__ float2 mlex_unpack2(uint32_t u, const __nv_bfloat16*) {
  // bfloat16 is the top half of a float32.
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}
__device__ __forceinline__ float2 mlex_unpack2(uint32_t u, const __half*) {
  return make_float2(__half2float(__ushort_as_half((unsigned short)(u & 0xffffu))),
                     __half2float(__ushort_as_half((unsigned short)(u >> 16))));
}
// The element-wise ops the epilogues fold in, as MLX's unfused graph applies them to a half
// type (its Add, Multiply and Sigmoid functors): + and * are the type's own operators (one
// rounding); sigmoid is 1 / (1 + exp|x|), or one minus it for x >= 0, each step in T.
template <typename T> __device__ __forceinline__ T mlex_add(T a, T b) { return a + b; }
template <typename T> __device__ __forceinline__ T mlex_mul(T a, T b) { return a * b; }
template <typename T> __device__ __forceinline__ T mlex_sigmoid(T x) {
  const T one = T(1.0f);
  const T y = one / (one + hexp(__habs(x)));
  return mlex_float(x) < 0.0f ? y : one - y;
}
// A nibble masked in place (q * 16^i, i < 4) as an exact float: OR-ed into the mantissa of 2^23
// and 2^23 subtracted, cheaper than an int-to-float conversion per weight.
__device__ __forceinline__ float mlex_nibble(uint32_t word, uint32_t mask) {
  return __uint_as_float((word & mask) | 0x4b000000u) - 8388608.0f;
}
)";

// Template constants: N rows, K columns, GS group size, ROWS rows of w per warp, WARPS per
// block, SPLIT warps per set of rows (each a share of K), MB rows of x per block, EPI the epilogue (the Epilogue enum of the header), NORM
// whether x is RMS-normalized first (with eps the float whose bits are EPS_BITS). The grid's y extent is the number of rows of x (M, known only
// at run time, so that the kernel is compiled once per MB bucket rather than once per batch
// size): block (bx, y) with y % MB == 0 takes rows y .. y + MB of x (those that exist); the
// others exit at once.
// Lane l of a team's warp s takes chunks 32 s + l, 32 (s + SPLIT) + l, ... of 32 weights (one 16-byte load of packed words,
// inside one quantization group since GS >= 32) for each of the warp's rows, turns them into
// floats once, and uses them against each of its rows of x. A nibble is used in place
// (q * 16^i) against x / 16^i, so no shifts: sum_k (s q_k + b) x_k = s * sum_k q_k x_k +
// b * sum_k x_k per group, in float32. Each output is summed in the same order whatever MB is,
// so a batch row gets exactly the value the same row would get alone.
constexpr const char* kSource = R"(
  constexpr int CHUNKS = K / 32;
  constexpr int GROUPS = K / GS;
  // Outputs per row of x: N, or N / 2 where the epilogue joins rows o and o + N / 2 (SwiGLU).
  constexpr int NO = EPI == 2 ? N / 2 : N;
  // SPLIT warps share a set of rows, each taking every SPLIT-th run of 32 chunks of K.
  constexpr int TEAMS = WARPS / SPLIT;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int team = warp / SPLIT, slice = warp % SPLIT;
  const int o0 = (blockIdx.x * TEAMS + team) * (EPI == 2 ? 1 : ROWS);
  // The warp's r-th row of w: consecutive rows, or the gate and up rows of output o0.
  auto wrow = [&](int r) { return EPI == 2 ? o0 + r * NO : o0 + r; };
  auto has_row = [&](int r) { return EPI == 2 ? o0 < NO : o0 + r < N; };
  const int m0 = blockIdx.y;
  if (m0 % MB != 0) return;
  const int rows_x = min(MB, (int)gridDim.y - m0);
  // NORM: x is the residual stream and the kernel multiplies rms_norm(x, nw) instead, as MLX's
  // RMSNorm writes it (each row's 1 / sqrt(mean(x²) + eps) in float32, then w · T(x · that),
  // rounded to T). The whole block takes part in each row's sum of squares before any warp
  // leaves.
  __shared__ float rms[MB];
  if constexpr (NORM) {
    __shared__ float part[MB][WARPS];
    for (int m = 0; m < rows_x; ++m) {
      const T* xm = x + (unsigned long long)(m0 + m) * K;
      float s = 0.0f;
      for (int j = threadIdx.x; j < K; j += WARPS * 32) {
        const float v = mlex_float(xm[j]);
        s += v * v;
      }
      #pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) part[m][threadIdx.x >> 5] = s;
    }
    __syncthreads();
    if (threadIdx.x < rows_x) {
      float s = 0.0f;
      #pragma unroll
      for (int i = 0; i < WARPS; ++i) s += part[threadIdx.x][i];
      rms[threadIdx.x] = rsqrtf(s / (float)K + __int_as_float(EPS_BITS));
    }
    __syncthreads();
  }
  // A team past the last row still reaches the block's barrier below.
  const bool active = o0 < NO;
  const uint4* wq = reinterpret_cast<const uint4*>(w);
  // 16-byte loads need 16-byte aligned buffers; a view into a larger buffer may not be.
  const bool aligned = ((reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(w) |
                         (NORM ? reinterpret_cast<unsigned long long>(nw) : 0ull)) & 15) == 0;
  float acc[ROWS][MB];
  #pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    #pragma unroll
    for (int m = 0; m < MB; ++m) acc[r][m] = 0.0f;
  }
  #pragma unroll 2
  for (int c = slice * 32 + lane; active && c < CHUNKS; c += 32 * SPLIT) {
    // This chunk of each of the warp's rows of w, as floats q * 16^(i % 4).
    float wf[ROWS][32];
    #pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const unsigned long long at = (unsigned long long)wrow(r) * CHUNKS + c;
      uint4 wv;
      if (!has_row(r)) {
        wv = make_uint4(0, 0, 0, 0);
      } else if (aligned) {
        wv = wq[at];
      } else {
        wv = make_uint4(w[4 * at], w[4 * at + 1], w[4 * at + 2], w[4 * at + 3]);
      }
      const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
      #pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t lo = words[j], hi = words[j] >> 16;
        wf[r][8 * j + 0] = mlex_nibble(lo, 0xfu);
        wf[r][8 * j + 1] = mlex_nibble(lo, 0xf0u);
        wf[r][8 * j + 2] = mlex_nibble(lo, 0xf00u);
        wf[r][8 * j + 3] = mlex_nibble(lo, 0xf000u);
        wf[r][8 * j + 4] = mlex_nibble(hi, 0xfu);
        wf[r][8 * j + 5] = mlex_nibble(hi, 0xf0u);
        wf[r][8 * j + 6] = mlex_nibble(hi, 0xf00u);
        wf[r][8 * j + 7] = mlex_nibble(hi, 0xf000u);
      }
    }
    const int g = (c * 32) / GS;
    #pragma unroll
    for (int m = 0; m < MB; ++m) {
      if (m >= rows_x) break;
      const T* xm = x + (unsigned long long)(m0 + m) * K;
      float xs[32];
      float xsum = 0.0f;
      if (aligned) {
        const uint4* xq = reinterpret_cast<const uint4*>(xm);
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint4 v = xq[c * 4 + j];
          const uint32_t u[4] = {v.x, v.y, v.z, v.w};
          uint32_t g[4] = {0, 0, 0, 0};
          if constexpr (NORM) {
            const uint4 gv = reinterpret_cast<const uint4*>(nw)[c * 4 + j];
            g[0] = gv.x, g[1] = gv.y, g[2] = gv.z, g[3] = gv.w;
          }
          #pragma unroll
          for (int h = 0; h < 4; ++h) {
            float2 f = mlex_unpack2(u[h], x);
            if constexpr (NORM) {
              const float2 w2 = mlex_unpack2(g[h], x);
              f.x = mlex_round(w2.x * mlex_round(f.x * rms[m], x), x);
              f.y = mlex_round(w2.y * mlex_round(f.y * rms[m], x), x);
            }
            xs[8 * j + 2 * h] = f.x;
            xs[8 * j + 2 * h + 1] = f.y;
          }
        }
      } else {
        #pragma unroll
        for (int i = 0; i < 32; ++i) {
          xs[i] = mlex_float(xm[c * 32 + i]);
          if constexpr (NORM) xs[i] = mlex_round(mlex_float(nw[c * 32 + i]) * mlex_round(xs[i] * rms[m], x), x);
        }
      }
      #pragma unroll
      for (int i = 0; i < 32; ++i) {
        xsum += xs[i];
        // Nibble i of a word is q * 16^(i % 4) in place (the top four read from word >> 16).
        xs[i] *= (i % 4 == 0) ? 1.0f : (i % 4 == 1) ? 0.0625f : (i % 4 == 2) ? 0.00390625f : 0.000244140625f;
      }
      #pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        if (!has_row(r)) break;
        float d0 = 0.0f, d1 = 0.0f;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
          d0 += wf[r][8 * j + 0] * xs[8 * j + 0];
          d1 += wf[r][8 * j + 1] * xs[8 * j + 1];
          d0 += wf[r][8 * j + 2] * xs[8 * j + 2];
          d1 += wf[r][8 * j + 3] * xs[8 * j + 3];
          d0 += wf[r][8 * j + 4] * xs[8 * j + 4];
          d1 += wf[r][8 * j + 5] * xs[8 * j + 5];
          d0 += wf[r][8 * j + 6] * xs[8 * j + 6];
          d1 += wf[r][8 * j + 7] * xs[8 * j + 7];
        }
        const unsigned long long sg = (unsigned long long)wrow(r) * GROUPS + g;
        acc[r][m] += mlex_float(scales[sg]) * (d0 + d1) + mlex_float(biases[sg]) * xsum;
      }
    }
  }
  // Each row's sum: the warp's lanes (a butterfly), then the team's warps in order. The order
  // depends on K alone (SPLIT is chosen from the shape), not on MB.
  #pragma unroll
  for (int m = 0; m < MB; ++m) {
    if (m >= rows_x) break;
    #pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      float v = acc[r][m];
      #pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      acc[r][m] = v;
    }
  }
  if constexpr (SPLIT > 1) {
    __shared__ float team_part[WARPS][ROWS][MB];
    if (lane == 0) {
      #pragma unroll
      for (int m = 0; m < MB; ++m) {
        #pragma unroll
        for (int r = 0; r < ROWS; ++r) team_part[warp][r][m] = acc[r][m];
      }
    }
    __syncthreads();
    if (slice != 0) return;
    #pragma unroll
    for (int m = 0; m < MB; ++m) {
      #pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        float v = team_part[warp][r][m];
        #pragma unroll
        for (int p = 1; p < SPLIT; ++p) v += team_part[warp + p][r][m];
        acc[r][m] = v;
      }
    }
  }
  if (!active || lane != 0) return;
  #pragma unroll
  for (int m = 0; m < MB; ++m) {
    if (m >= rows_x) break;
    T y[ROWS];
    #pragma unroll
    for (int r = 0; r < ROWS; ++r) mlex_store(&y[r], acc[r][m]);
    // The epilogues are MLX's own element-wise functors on the rounded products, in the order
    // the unfused graph applies them, so the result is bit for bit the unfused one's.
    if constexpr (EPI == 2) {
      // silu(gate) * up, as the compiled SwiGLU: each step rounded to T.
      const T s = mlex_sigmoid(y[0]);
      const T t = mlex_mul(y[0], s);
      out[(unsigned long long)(m0 + m) * NO + o0] = mlex_mul(t, y[1]);
    } else {
      #pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        if (o0 + r >= N) break;
        const unsigned long long at = (unsigned long long)(m0 + m) * N + o0 + r;
        // residual + product (the residual stream's add, as the unfused graph writes it), or
        // product + bias.
        out[at] = EPI == 1 ? mlex_add(res[at], y[r]) : EPI == 3 ? mlex_add(y[r], res[o0 + r]) : y[r];
      }
    }
  }
)";

// `res` is the residual of AddResidual (or the bias of AddBias) and `nw` the RMSNorm weight of NORM; where unused they get
// x in their place (never read).
// The widest x the norm is folded into the product for. Every block of the product recomputes
// its rows' sum of squares, which costs GPU time in proportion to K: on the H200 the fold made
// decode of small models (K 576, 1024), which wait on the host, 1.25-1.3x faster, and halved
// that of a 7B (K 3584), which waits on the GPU (BENCHMARKS.md). MLEX_CUDA_NORM_FOLD_MAX_K
// overrides it.
int norm_fold_max_k() {
  static const int k = [] {
    const char* v = std::getenv("MLEX_CUDA_NORM_FOLD_MAX_K");
    return v != nullptr && *v != '\0' ? std::atoi(v) : 2048;
  }();
  return k;
}

// An integer setting from the environment (benchmarks), or `fallback` when unset.
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

// Warps that share each set of rows, splitting K (a power of two up to 8). Blocks of a long row
// (the 7B's down projection: 592 chunks of 32 weights, 3,584 rows) otherwise number too few to
// keep every SM's memory pipe busy. A function of K alone, so that a row's sum is added in the
// same order whatever the number of rows of x. MLEX_CUDA_QMV_SPLIT overrides it.
int split_for(int k) {
  static const int forced = env_int("MLEX_CUDA_QMV_SPLIT", 0);
  if (forced == 1 || forced == 2 || forced == 4 || forced == 8) return forced;
  const int chunks = k / 32;
  return chunks >= 512 ? 4 : chunks >= 256 ? 2 : 1;
}

const cuda_jit::KernelSpec& spec() {
  static const std::string header = std::string(kCudaHalfHelpers) + kHeader;
  static const cuda_jit::KernelSpec s{"qmv4", header.c_str(), kSource, {"x", "w", "scales", "biases", "res", "nw"}, {"out"}};
  return s;
}

}  // namespace

std::optional<mx::array> cuda_quantized_matvec(const mx::array& x, const mx::array& w, const mx::array& scales,
                                               const std::optional<mx::array>& biases, bool transpose,
                                               int group_size, int bits, const std::string& mode, Epilogue epilogue,
                                               const std::optional<mx::array>& residual,
                                               const std::optional<mx::array>& norm_weight, float eps) {
  // Benchmark ablation only (BENCHMARKS.md): MLX's own kernel everywhere.
  const bool ablated = mlex::ablated(MLEX_ABLATE_KERNEL_CUDA_QMV);
  static const bool cuda = cuda_jit::available();
  if (ablated || !cuda || mx::to_stream({}).device != mx::Device::gpu || mode != "affine" || !transpose ||
      !biases || bits != 4 || (group_size != 32 && group_size != 64 && group_size != 128) || w.ndim() != 2 ||
      w.dtype() != mx::uint32 || x.ndim() < 1 || (x.dtype() != mx::bfloat16 && x.dtype() != mx::float16) ||
      scales.dtype() != x.dtype() || biases->dtype() != x.dtype()) {
    return std::nullopt;
  }
  if (epilogue != Epilogue::None && mlex::ablated(MLEX_ABLATE_KERNEL_CUDA_EPILOGUE)) return std::nullopt;
  if (norm_weight && (mlex::ablated(MLEX_ABLATE_KERNEL_CUDA_NORM_FOLD) || x.shape(-1) > norm_fold_max_k())) return std::nullopt;
  const int n = w.shape(0);
  const int k = x.shape(-1);
  const int m = k > 0 ? static_cast<int>(x.size() / k) : 0;
  // Decode rows only (one request, or a continuous batch); longer prefills go to MLX's matmul.
  if (m < 1 || m > kMaxRowsOfX || k % 32 != 0 || k % group_size != 0 || w.shape(1) * 8 != k ||
      scales.ndim() != 2 || scales.shape(0) != n || scales.shape(1) != k / group_size ||
      biases->shape() != scales.shape()) {
    return std::nullopt;
  }
  if (norm_weight && (norm_weight->ndim() != 1 || norm_weight->shape(0) != k || norm_weight->dtype() != x.dtype())) {
    return std::nullopt;
  }
  auto shape = x.shape();
  shape.back() = epilogue == Epilogue::SwiGlu ? n / 2 : n;
  if (epilogue == Epilogue::SwiGlu && n % 2 != 0) return std::nullopt;
  if (epilogue == Epilogue::AddResidual &&
      (!residual || residual->shape() != shape || residual->dtype() != x.dtype())) {
    return std::nullopt;
  }
  // A bias of another dtype would promote the sum (MLX's add): not ours to fold.
  if (epilogue == Epilogue::AddBias &&
      (!residual || residual->ndim() != 1 || residual->shape(0) != n || residual->dtype() != x.dtype())) {
    return std::nullopt;
  }
  // Rows of x per block: one, or up to eight. Each instantiation is compiled (NVRTC, ~0.5 s) on
  // its first use on a machine, then read from cuda_jit's disk cache; still, every bucket is a
  // compile in the middle of some first generation, so a batch of any size takes the 8-row
  // kernel (rows past the batch's are skipped at run time). Up to kSmallRows rows take the
  // one-row kernel (grid y = m, the weights read once per row), which the first decode step
  // already needed, so a speculative verification pass or a small batch needs nothing new.
  const int mb = m <= kSmallRows ? 1 : 8;
  // A warp's rows of w: two for one row of x (or the gate and up rows of one SwiGLU output).
  static const int rows_one = std::max(1, std::min(4, env_int("MLEX_CUDA_QMV_ROWS", kRowsPerWarp)));
  const int rows_per_warp = epilogue == Epilogue::SwiGlu ? kRowsPerWarp : mb == 1 ? rows_one : 1;
  const int split = split_for(k);
  const int warps = std::max(kWarps, split);
  const int outputs_per_block = (epilogue == Epilogue::SwiGlu ? 1 : rows_per_warp) * (warps / split);
  const int blocks = (static_cast<int>(shape.back()) + outputs_per_block - 1) / outputs_per_block;
  const mx::array& res = epilogue == Epilogue::AddResidual || epilogue == Epilogue::AddBias ? *residual : x;
  int eps_bits = 0;
  std::memcpy(&eps_bits, &eps, sizeof eps_bits);
  auto outs = cuda_jit::try_run(spec(), {x, w, scales, *biases, res, norm_weight ? *norm_weight : x}, {shape}, {x.dtype()},
                                {blocks * warps * 32, m, 1}, {warps * 32, 1, 1},
                                {{"T", x.dtype()}, {"N", n}, {"K", k}, {"GS", group_size}, {"ROWS", rows_per_warp},
                                 {"WARPS", warps}, {"SPLIT", split}, {"MB", mb}, {"EPI", static_cast<int>(epilogue)},
                                 {"NORM", norm_weight.has_value()}, {"EPS_BITS", norm_weight ? eps_bits : 0}});
  if (!outs) return std::nullopt;
  return (*outs)[0];
}

}  // namespace mlex
