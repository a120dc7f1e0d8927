// A faster CUDA kernel than MLX 0.32's `qmv` for the decode step's quantized matrix-vector
// product: `x @ dequantize(w)ᵀ` with one row of x (or the few rows of a continuous batch), affine 4-bit weights, bfloat16/float16
// activations. MLX's kernel streams weights at about a fifth of an H200's memory bandwidth,
// and these products are most of a large model's decode step (BENCHMARKS.md).
// It goes through `mlx::core::fast::cuda_kernel`, so it is an ordinary op of the lazy graph.
#pragma once

#include <optional>

#include "mlx/mlx.h"

namespace mlex {

// The product as a lazy array, or nothing when this kernel does not cover the case (not the
// CUDA backend, more than 32 rows of x, another mode, bit width, group size or dtype): the caller
// then uses mx::quantized_matmul.
std::optional<mlx::core::array> cuda_quantized_matvec(const mlx::core::array& x, const mlx::core::array& w,
                                                      const mlx::core::array& scales,
                                                      const std::optional<mlx::core::array>& biases,
                                                      bool transpose, int group_size, int bits,
                                                      const std::string& mode);

}  // namespace mlex
