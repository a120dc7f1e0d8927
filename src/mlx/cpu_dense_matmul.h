// `x @ w_t` on the CPU for a float32 weight stored [out, in] and used through its transposed view
// (`Linear`'s dense weights, a tied embedding as the head): our packed GEMM (cpu_gemm.h) for many
// rows, our row kernel (cpu_dense_rows.h) for up to 32, instead of the reference BLAS MLX's CPU
// wheel bundles (~4 GFLOP/s on this machine; a vision tower's patches, an unquantized
// checkpoint's prompt chunks and decode steps spent most of their time there).
// It is an MLX primitive, so it sits in the lazy graph like any other op.
#pragma once

#include <optional>

#include "mlx/mlx.h"

namespace mlex {

// The product as a lazy array, or nothing when this kernel does not cover the case (not on the
// CPU or no AVX2/FMA, not float32, w_t not an evaluated transposed view of a row-contiguous
// [out, in] array): the caller then uses mx::matmul.
std::optional<mlx::core::array> cpu_dense_matmul(const mlx::core::array& x, const mlx::core::array& w_t);

}  // namespace mlex
