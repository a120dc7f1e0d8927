// What a quantized product's kernel does with the product before writing it: the op that would
// follow it in the decode graph, folded in to save an op (a kernel launch on CUDA, an op's
// scheduling and a buffer on the CPU) per use. Shared by the CUDA and CPU kernels.
#pragma once

namespace mlex {

enum class Epilogue : int {
  None = 0,
  // residual + x @ wᵀ (the residual stream's add after an output or down projection).
  AddResidual = 1,
  // silu(g) * u where x @ wᵀ = [g, u] (a fused gate/up projection): the output has half the rows.
  SwiGlu = 2,
  // x @ wᵀ + bias (a projection's own bias, one value per output column: qwen2's q/k/v).
  AddBias = 3,
};

}  // namespace mlex
