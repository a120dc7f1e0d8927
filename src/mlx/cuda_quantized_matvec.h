// A faster CUDA kernel than MLX 0.32's `qmv` for the decode step's quantized matrix-vector
// product: `x @ dequantize(w)ᵀ` with one row of x (or the few rows of a continuous batch), affine 4-bit weights, bfloat16/float16
// activations. MLX's kernel streams weights at about a fifth of an H200's memory bandwidth,
// and these products are most of a large model's decode step (BENCHMARKS.md).
// It is compiled and cached by cuda_jit.h and run as an ordinary op of the lazy graph.
#pragma once

#include <optional>

#include "mlx/mlx.h"
#include "quant_epilogue.h"

namespace mlex {

// The product as a lazy array, or nothing when this kernel does not cover the case (not the
// CUDA backend, more than 32 rows of x, another mode, bit width, group size or dtype): the caller
// then uses mx::quantized_matmul. With `norm_weight`, the product is of rms_norm(x, norm_weight,
// eps) (the pre-norm of a decoder layer folded in: one launch fewer; norm_weight of x's dtype).
std::optional<mlx::core::array> cuda_quantized_matvec(const mlx::core::array& x, const mlx::core::array& w,
                                                      const mlx::core::array& scales,
                                                      const std::optional<mlx::core::array>& biases,
                                                      bool transpose, int group_size, int bits,
                                                      const std::string& mode,
                                                      Epilogue epilogue = Epilogue::None,
                                                      const std::optional<mlx::core::array>& residual = std::nullopt,
                                                      const std::optional<mlx::core::array>& norm_weight = std::nullopt,
                                                      float eps = 0.0f);

}  // namespace mlex
