#include "cpu_dense_matmul.h"

#include "ablation.h"
#include "cpu_dense_rows.h"
#include "cpu_gemm.h"
#include "cpu_primitive.h"
#include "cpu_strided.h"
#include "cpu_thread_pool.h"

#include <vector>

namespace mx = mlx::core;

namespace mlex {
namespace {

class CpuDenseMatmul : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& x = inputs[0];
    const auto& w_t = inputs[1];
    const int K = x.shape(-1), N = out.shape(-1);
    const int M = static_cast<int>(out.size() / N);
    const bool gather = !x.flags().row_contiguous;
    dispatch(inputs, out, [x, w_t, M, N, K, gather](float* o) {
      const float* xp = x.data<float>();
      std::vector<float> rows;
      if (gather) {  // a view as x: gathered into rows here, not by a copy op in the graph
        rows.resize(static_cast<size_t>(M) * K);
        const int64_t step = x.strides().back();
        for (int m = 0; m < M; ++m) {
          const float* src = xp + mlex::row_offset(x, m);
          for (int k = 0; k < K; ++k) rows[static_cast<size_t>(m) * K + k] = src[k * step];
        }
        xp = rows.data();
      }
      // w_t is [K, N] with strides (1, K): the [N, K] row-major weight it views.
      if (M >= kGemmMinRows) {
        dense_gemm(xp, w_t.data<float>(), o, M, N, K);
        return;
      }
      // A few rows: each weight row read once for all of them (cpu_dense_rows.h), the weight's
      // rows split across the pool (whole outputs per thread: the split changes no result).
      const float* w = w_t.data<float>();
      const double work = static_cast<double>(M) * N * K;
      const int tasks = work < (1 << 18) ? 1 : pool().size() * 4;
      const int chunk = (N + tasks - 1) / tasks;
      pool().run((N + chunk - 1) / chunk, [&](int t) {
        const int lo = t * chunk, hi = std::min(N, lo + chunk);
        dense_rows(xp, M, w + static_cast<size_t>(lo) * K, hi - lo, K, o + lo, static_cast<size_t>(N));
      });
    });
  }
  const char* name() const override { return "CpuDenseMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const CpuDenseMatmul*>(&other) != nullptr;
  }
};

}  // namespace

std::optional<mx::array> cpu_dense_matmul(const mx::array& x, const mx::array& w_t) {
  auto stream = mx::to_stream({});
  if (mlex::ablated(MLEX_ABLATE_KERNEL_CPU_GEMM) || stream.device != mx::Device::cpu || !quantized_gemm_available() ||
      x.dtype() != mx::float32 || w_t.dtype() != mx::float32 || x.ndim() < 2 || w_t.ndim() != 2) {
    return std::nullopt;
  }
  const int K = x.shape(-1), N = w_t.shape(1);
  if (K == 0 || N == 0 || w_t.shape(0) != K) return std::nullopt;
  const size_t rows = x.size() / K;
  if (rows == 0 || (rows < static_cast<size_t>(kGemmMinRows) && mlex::ablated(MLEX_ABLATE_KERNEL_CPU_DENSE_ROWS))) {
    return std::nullopt;
  }
  // An evaluated transposed view of a row-contiguous [N, K] array, starting at its buffer.
  if (!w_t.is_available() || w_t.strides(0) != 1 || w_t.strides(1) != K || w_t.data_size() != w_t.size() ||
      w_t.offset() != 0) {
    return std::nullopt;
  }
  auto shape = x.shape();
  shape.back() = N;
  return mx::array(shape, mx::float32, std::make_shared<CpuDenseMatmul>(stream), {x, w_t});
}

}  // namespace mlex
