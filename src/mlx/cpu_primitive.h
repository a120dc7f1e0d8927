// What every mlex CPU kernel (an MLX primitive) shares: it runs on the CPU only, it allocates a
// float32 output and registers its arrays with MLX's CPU encoder, and its work runs on MLX's CPU
// thread, where an exception would end the process: a failure there (only allocation can fail in
// our loops) leaves NaNs in the output, which the caller sees as a bad result instead.
#pragma once

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

namespace mlex {

class CpuPrimitive : public mlx::core::UnaryPrimitive {
 public:
  using mlx::core::UnaryPrimitive::UnaryPrimitive;

  void eval_gpu(const std::vector<mlx::core::array>&, mlx::core::array&) override {
    throw std::runtime_error(std::string("[") + name() + "] runs on the CPU only");
  }

 protected:
  // Allocates `out` (float32), registers the arrays, and queues `work(out_data)` on the CPU thread
  // (the output's pointer is passed in: it exists only once allocated here).
  template <typename F>
  void dispatch(const std::vector<mlx::core::array>& inputs, mlx::core::array& out, F&& work) {
    out.set_data(mlx::core::allocator::malloc(out.nbytes()));
    auto& enc = mlx::core::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) enc.set_input_array(in);
    enc.set_output_array(out);
    float* o = out.data<float>();
    const size_t n = out.size();
    enc.dispatch([work = std::forward<F>(work), o, n]() mutable {
      try {
        work(o);
      } catch (...) {
        std::fill(o, o + n, std::numeric_limits<float>::quiet_NaN());
      }
    });
  }
};

}  // namespace mlex
