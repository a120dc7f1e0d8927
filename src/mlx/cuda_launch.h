// Our compiled CUDA kernels launched as an op of MLX's lazy graph, without MLX's CustomKernel
// (issue 14).
//
// `fast::precompiled_cuda_kernel` copies the kernel's whole binary (12–28 KB) into every
// primitive it makes, and looks its module up by name at each launch; a decode step launches
// our kernels ~120 times, and on the H200 that cost small models 17–21 % of their decode speed.
// Here a kernel's module is loaded once (cuModuleLoadData, on its first launch) and each launch
// is a small primitive holding a pointer to it, which adds one kernel node to MLX's command
// encoder the way MLX's own primitives do.
//
// libmlx's CUDA encoder is reached through its exported symbols (resolved at run time, so the
// same binary runs on the CPU build of libmlx, where `available()` is false), and the CUDA
// driver through the libcuda libmlx already loaded. Both are checked against the pinned MLX
// version's headers (vendor/mlx.lock); when a symbol is missing, `available()` says why and
// callers use `fast::precompiled_cuda_kernel` instead.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "mlx/mlx.h"

namespace mlex::cuda_launch {

// A compiled kernel (cubin or PTX) and, after its first launch, its loaded function.
class Kernel {
 public:
  Kernel(std::string name, std::string binary) : name_(std::move(name)), binary_(std::move(binary)) {}
  const std::string& name() const { return name_; }
  const std::string& binary() const { return binary_; }
  // The loaded function (a CUfunction), loading the module into the current context the first
  // time. Throws std::runtime_error naming the kernel when the driver refuses it.
  void* function() const;

 private:
  std::string name_;
  std::string binary_;
  mutable std::once_flag once_;
  mutable void* function_ = nullptr;
  mutable std::string error_;
};

// Empty when kernels can be launched directly here; otherwise why not.
const std::string& why_not();
inline bool available() { return why_not().empty(); }

// The kernel as an op: inputs (made row contiguous first) then outputs, all pointers, in the
// kernel's parameter order; grid in threads (as MLX's kernels take it), block in threads.
// `in_place`: indexes of inputs the kernel writes (outside MLX's value semantics: the caller
// owns them); each must be row contiguous (else the launch throws), and is registered with the
// encoder as written, so that later readers of the buffer run after the kernel.
std::vector<mlx::core::array> launch(const std::shared_ptr<const Kernel>& kernel,
                                     const std::vector<mlx::core::array>& inputs,
                                     const std::vector<mlx::core::Shape>& output_shapes,
                                     const std::vector<mlx::core::Dtype>& output_dtypes,
                                     std::tuple<int, int, int> grid, std::tuple<int, int, int> block,
                                     mlx::core::Stream stream, const std::vector<int>& in_place = {});

// Moves the managed-memory buffers of `arrays` (evaluated) into device memory and waits: the
// bytes moved, 0 where there is no CUDA or the device cannot prefetch (best effort). Arrays
// made from host data (weights read from a file) live in CUDA managed memory, whose pages
// otherwise migrate on the GPU's first touch, page fault by page fault, inside the first request.
size_t prefetch_to_device(const std::vector<mlx::core::array>& arrays);

}  // namespace mlex::cuda_launch
