// Reading MLX arrays that are views (transposes, slices of a larger buffer, broadcasts) in place
// on the CPU, from their strides, instead of adding a `contiguous` copy op to the graph.
#pragma once

#include <cstdint>

#include "mlx/mlx.h"

namespace mlex {

// Rows are the last axis; `a` has this many of them (every leading axis multiplied out).
inline int64_t row_count(const mlx::core::array& a) {
  int64_t n = 1;
  for (int ax = 0; ax + 1 < static_cast<int>(a.ndim()); ++ax) n *= a.shape(ax);
  return n;
}

// Element offset, from `a`'s data pointer, of the first element of row `r` (row-major order over
// the leading axes); element i of the row is at that offset + i * a.strides().back().
inline int64_t row_offset(const mlx::core::array& a, int64_t r) {
  int64_t off = 0;
  for (int ax = static_cast<int>(a.ndim()) - 2; ax >= 0; --ax) {
    const int64_t n = a.shape(ax);
    off += (r % n) * a.strides()[ax];
    r /= n;
  }
  return off;
}

}  // namespace mlex
