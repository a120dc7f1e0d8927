// Our CUDA kernels, compiled once per machine rather than once per process (issue 14).
//
// `mlx::core::fast::cuda_kernel` hands a kernel's source to NVRTC in every new process (MLX
// keeps its own kernels on disk, not custom ones): ~0.5 s per instantiation, 6–7 s of a GPU
// cold start, and a speculative or batched step that needs a new instantiation stalls in the
// middle of a generation. Here a kernel is a whole translation unit of ours (no MLX device
// headers, which live only inside libmlx), compiled by the NVRTC that libmlx already loaded,
// kept as a cubin in a disk cache keyed by a hash of the source, the GPU architecture and the
// NVRTC version, loaded once per process and launched as an ordinary op of the lazy graph
// (cuda_launch; MLX's `fast::precompiled_cuda_kernel` where that is not available).
// MLEX_CUDA_KERNEL_CACHE=0 hands the kernels to `fast::cuda_kernel` instead, as before.
//
// The cache directory: $MLEX_KERNEL_CACHE_DIR, else $XDG_CACHE_HOME/mlex/cuda-kernels, else
// ~/.cache/mlex/cuda-kernels (a temporary directory if none can be made). An entry is written
// to a temporary name and renamed, carries its key and a checksum, and is recompiled (and
// rewritten) when it does not verify. MLEX_TRACE_KERNELS=1 prints each compile and cache read.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "mlx/mlx.h"

namespace mlex::cuda_jit {

// A compile-time constant of a kernel: an int, a bool, or a type (spelled as the CUDA type).
using Constant = std::variant<int, bool, mlx::core::Dtype>;

// A kernel in MLX's custom-kernel style: `body` is the function body; the signature is made
// from `inputs` (const pointers, in order) then `outputs` (pointers), each of its array's
// dtype; `header` is device code ahead of the function; constants become `constexpr` names (or
// `using` aliases for types) at the top of the body.
struct KernelSpec {
  const char* family;
  const char* header;
  const char* body;
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
};

// Whether kernels can be compiled here (CUDA backend with a GPU, NVRTC loaded). False on the
// CPU and Metal backends.
bool available();

// Runs the kernel (compiled or read from the cache on first use of these constants and
// dtypes): grid in threads as MLX's kernels take it, block in threads. `in_place`: inputs the
// kernel writes (cuda_launch::launch); a kernel with any runs only where direct launches are
// available (MLX's custom kernels would write a copy): elsewhere run throws. Inputs that are not row
// contiguous are copied first. Throws std::runtime_error naming the kernel when it cannot be
// compiled or loaded; callers fall back to MLX's own ops.
std::vector<mlx::core::array> run(const KernelSpec& spec, const std::vector<mlx::core::array>& inputs,
                                  const std::vector<mlx::core::Shape>& output_shapes,
                                  const std::vector<mlx::core::Dtype>& output_dtypes,
                                  std::tuple<int, int, int> grid, std::tuple<int, int, int> block,
                                  const std::vector<std::pair<std::string, Constant>>& constants,
                                  mlx::core::StreamOrDevice s = {}, const std::vector<int>& in_place = {});

// Like run, but a failure is reported once on stderr (naming the kernel and why) and turned
// into nothing, so the caller's reference path runs instead.
std::optional<std::vector<mlx::core::array>> try_run(
    const KernelSpec& spec, const std::vector<mlx::core::array>& inputs,
    const std::vector<mlx::core::Shape>& output_shapes, const std::vector<mlx::core::Dtype>& output_dtypes,
    std::tuple<int, int, int> grid, std::tuple<int, int, int> block,
    const std::vector<std::pair<std::string, Constant>>& constants, mlx::core::StreamOrDevice s = {},
    const std::vector<int>& in_place = {});

}  // namespace mlex::cuda_jit
