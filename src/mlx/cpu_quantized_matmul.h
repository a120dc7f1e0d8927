// A faster CPU quantized matmul than MLX's own (which runs a scalar loop on one thread on x86):
// `x @ dequantize(w)ᵀ` for affine 2/3/4/5/6/8-bit weights with float32 activations and float32,
// float16 or bfloat16 scales and biases (16-bit ones widened per row: cpu_scales.h) — 4 and 8
// bits vectorised with AVX2/FMA where the CPU has it — spread over a small thread pool.
// It is an MLX primitive, so it sits in the lazy graph like any other op.
#pragma once

#include <optional>

#include "mlx/mlx.h"
#include "quant_epilogue.h"

namespace mlex {

// The product as a lazy array, or nothing when this kernel does not cover the case (not on the
// CPU, another mode or bit width, other dtypes, weights not evaluated and row-contiguous): the
// caller then uses mx::quantized_matmul. With `norm_weight` (float32 [K]) the product is of
// cpu_rms_norm(x, norm_weight, eps), the same bits, normalized inside this op (a decoder layer's
// pre-norm folded in: one op fewer in the graph). With `epilogue`, the op that follows the product
// in a decode step is applied here too, giving the unfused ops' bits: residual + product (float32
// `residual` of the product's shape), or silu(g) · u of the product's halves [g, u] as
// cpu_swiglu computes it (half the columns).
std::optional<mlx::core::array> cpu_quantized_matmul(const mlx::core::array& x, const mlx::core::array& w,
                                                     const mlx::core::array& scales,
                                                     const std::optional<mlx::core::array>& biases, bool transpose,
                                                     int group_size, int bits, const std::string& mode,
                                                     const std::optional<mlx::core::array>& norm_weight = std::nullopt,
                                                     float eps = 0.0f, Epilogue epilogue = Epilogue::None,
                                                     const std::optional<mlx::core::array>& residual = std::nullopt);

// Whether the products this thread builds from now on round their activations to 8 bits on CPUs
// with AVX-512 VNNI (cpu_matvec_vnni.h; decode steps and short passes, not prompt chunks). A
// session's engine thread sets it from LoadOptions::int8_activations before it builds anything.
void set_cpu_int8_activations(bool on);

}  // namespace mlex
