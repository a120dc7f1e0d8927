#include "cpu_dense_matmul.h"

#include "ablation.h"
#include "cpu_gemm.h"
#include "cpu_primitive.h"
#include "cpu_strided.h"

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
      dense_gemm(xp, w_t.data<float>(), o, M, N, K);
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
  if (K == 0 || N == 0 || w_t.shape(0) != K || x.size() / K < static_cast<size_t>(kGemmMinRows)) return std::nullopt;
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
