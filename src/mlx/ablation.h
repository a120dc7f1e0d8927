// Which of our kernels a benchmark switched off (src/ablation.rs reads MLEX_ABLATE_* once and
// sets these through mlex_set_ablations): a kernel that is off returns nothing, so MLX's op runs.
#pragma once

#include <atomic>
#include <cstdint>

#include "shim.h"

namespace mlex {

std::atomic<uint32_t>& ablated_kernels();

inline bool ablated(uint32_t kernel) { return (ablated_kernels().load(std::memory_order_relaxed) & kernel) != 0; }

}  // namespace mlex
