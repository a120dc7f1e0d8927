// mlex's flat extern "C" shim over MLX's C++ API. Only the ops mlex uses; every entry catches
// everything so that no C++ exception ever unwinds into Rust (DESIGN.md §8.4).
#include "shim.h"
#include "cpu_fast_ops.h"
#include "cpu_decode_attention.h"
#include "cpu_dense_matmul.h"
#include "cpu_matvec_vnni.h"
#include "cpu_quantized_matmul.h"
#include "cuda_qk_norm_rope.h"
#include "cuda_launch.h"
#include "cuda_short_attention.h"
#include "cuda_quantized_matvec.h"
#include "gated_delta.h"
#include "ablation.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <unordered_set>
#include <exception>
#include <string>
#include <vector>

#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

// MLX's CUDA backend keeps its compiled work in LRU caches: the CUDA graphs of its command
// encoder (keyed on a graph's topology), cuDNN's attention graphs (keyed on the shapes: every
// new prompt length and key length is a new entry), convolutions. Each cache counts its misses
// for the life of the process and, once they pass twice its capacity, throws "Cache thrashing
// is happening" on every further miss. A long-running process (`mlex serve`, a Node or Electron
// app) sees prompts of ever new lengths, so past a few hundred of them each new length would fail
// its request, and the failed commit leaves MLX's encoder unusable for the next one. The
// caches still evict; only the check is off. A value the user exported wins (no overwrite).
// This runs when the binary or the Node addon is loaded, before any MLX stream or cache exists
// (MLX reads the variable when it builds each cache, lazily), and before any thread of ours.
// tests/cuda_cache_thrashing.rs shows it on CUDA.
__attribute__((constructor)) static void mlex_process_env_defaults() {
  setenv("MLX_ENABLE_CACHE_THRASHING_CHECK", "0", /*overwrite=*/0);
}

struct mlex_array_s {
  mx::array a;
};

namespace {

thread_local std::string g_last_error;

mlex_array wrap(mx::array a) { return new mlex_array_s{std::move(a)}; }

const mx::array& unwrap(mlex_array h) {
  if (h == nullptr) throw std::invalid_argument("null array handle");
  return h->a;
}

std::optional<mx::array> opt(mlex_array h) {
  if (h == nullptr) return std::nullopt;
  return h->a;
}

mx::Dtype to_dtype(mlex_dtype d) {
  switch (d) {
    case MLEX_BOOL: return mx::bool_;
    case MLEX_UINT8: return mx::uint8;
    case MLEX_UINT16: return mx::uint16;
    case MLEX_UINT32: return mx::uint32;
    case MLEX_UINT64: return mx::uint64;
    case MLEX_INT8: return mx::int8;
    case MLEX_INT16: return mx::int16;
    case MLEX_INT32: return mx::int32;
    case MLEX_INT64: return mx::int64;
    case MLEX_FLOAT16: return mx::float16;
    case MLEX_FLOAT32: return mx::float32;
    case MLEX_FLOAT64: return mx::float64;
    case MLEX_BFLOAT16: return mx::bfloat16;
    case MLEX_COMPLEX64: return mx::complex64;
  }
  throw std::invalid_argument("unknown dtype code " + std::to_string(static_cast<int>(d)));
}

mlex_dtype from_dtype(mx::Dtype d) { return static_cast<mlex_dtype>(static_cast<int>(d.val())); }

mx::Shape to_shape(const int32_t* shape, size_t ndim) {
  if (ndim > 0 && shape == nullptr) throw std::invalid_argument("null shape");
  return mx::Shape(shape, shape + ndim);
}

std::vector<mx::array> to_vec(const mlex_array* arrays, size_t n) {
  std::vector<mx::array> v;
  v.reserve(n);
  for (size_t i = 0; i < n; ++i) v.push_back(unwrap(arrays[i]));
  return v;
}

// Runs `f`, turning any exception into status 1 + a thread-local message.
template <typename F>
int guard(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    g_last_error = e.what();
  } catch (...) {
    g_last_error = "unknown C++ exception in MLX";
  }
  return 1;
}

}  // namespace

namespace mlex {
std::atomic<uint32_t>& ablated_kernels() {
  static std::atomic<uint32_t> bits{0};
  return bits;
}
}  // namespace mlex

extern "C" {

const char* mlex_last_error(void) { return g_last_error.c_str(); }
const char* mlex_version(void) { return mx::version(); }

void mlex_array_free(mlex_array a) { delete a; }

int mlex_array_clone(mlex_array a, mlex_array* out) {
  return guard([&] { *out = wrap(unwrap(a)); });
}
int mlex_array_ndim(mlex_array a, size_t* out) {
  return guard([&] { *out = unwrap(a).ndim(); });
}
int mlex_array_shape(mlex_array a, int32_t* out, size_t cap) {
  return guard([&] {
    const auto& s = unwrap(a).shape();
    if (s.size() > cap) throw std::invalid_argument("shape buffer too small");
    for (size_t i = 0; i < s.size(); ++i) out[i] = s[i];
  });
}
int mlex_array_dtype(mlex_array a, mlex_dtype* out) {
  return guard([&] { *out = from_dtype(unwrap(a).dtype()); });
}
int mlex_array_size(mlex_array a, size_t* out) {
  return guard([&] { *out = unwrap(a).size(); });
}
int mlex_array_nbytes(mlex_array a, size_t* out) {
  return guard([&] { *out = unwrap(a).nbytes(); });
}
int mlex_array_read(mlex_array a, mlex_dtype dtype, void* dst, size_t nbytes) {
  return guard([&] {
    mx::array x = unwrap(a);
    auto dt = to_dtype(dtype);
    // Wait for this array alone (array::eval of a scheduled array waits on its own event). A
    // new op on `x` would queue behind everything scheduled on its stream since, and any eval
    // waits while more than MLX's limit of command buffers are in flight: either way the read
    // of a pipelined decode step's token would wait for the next step, and the device would
    // idle while the host builds the one after. So a read that needs no conversion creates no
    // op, and a conversion runs on the CPU once `x` is ready.
    x.eval();
    if (x.dtype() != dt || !x.flags().row_contiguous) {
      x = mx::contiguous(mx::astype(x, dt, mx::Device::cpu), false, mx::Device::cpu);
      x.eval();
    }
    if (x.nbytes() != nbytes)
      throw std::invalid_argument("read of " + std::to_string(nbytes) + " bytes from an array of " +
                                  std::to_string(x.nbytes()));
    if (nbytes) std::memcpy(dst, x.data<void>(), nbytes);
  });
}

namespace {
// Whether an array can wrap memory MLX did not allocate (a weight in the checkpoint's map) without
// a copy: MLX's own constructor for that copies on every allocator but Metal's. The CPU-only
// build's allocator keeps a buffer's size in the 8 bytes before its data, which `Buffer::raw_ptr`
// skips; a buffer placed 8 bytes before foreign data then reads it in place. Such an array's data
// is not owned (`Data` with a deleter), so MLX never frees it, donates it to an op's output or
// asks for its size. Checked once on a real allocation; GPU builds (other allocators) copy.
bool wraps_foreign_data() {
  static const bool ok = [] {
    if (mx::is_available(mx::Device::gpu)) return false;
    auto& a = mx::allocator::allocator();
    auto b = a.malloc(64);
    const bool r = b.ptr() != nullptr && b.raw_ptr() == static_cast<char*>(b.ptr()) + sizeof(size_t) && a.size(b) == 64;
    a.free(b);
    return r;
  }();
  return ok;
}
}  // namespace

int mlex_array_from_data(void* data, const int32_t* shape, size_t ndim, mlex_dtype dtype,
                         mlex_release_fn release, void* ctx, mlex_array* out) {
  return guard([&] {
    if (data != nullptr && wraps_foreign_data()) {
      mx::allocator::Buffer buf(static_cast<char*>(data) - sizeof(size_t));
      mx::allocator::Data owner(buf, [release, ctx](mx::allocator::Buffer) {
        if (release) release(ctx);
      });
      *out = wrap(mx::array(std::move(owner), to_shape(shape, ndim), to_dtype(dtype)));
      return;
    }
    auto deleter = [release, ctx](void*) {
      if (release) release(ctx);
    };
    *out = wrap(mx::array(data, to_shape(shape, ndim), to_dtype(dtype), deleter));
  });
}
int mlex_array_from_copy(const void* data, const int32_t* shape, size_t ndim, mlex_dtype dtype,
                         mlex_array* out) {
  return guard([&] {
    auto dt = to_dtype(dtype);
    auto sh = to_shape(shape, ndim);
    size_t n = 1;
    for (auto d : sh) n *= static_cast<size_t>(d);
    mx::array a(mx::allocator::malloc(n * dt.size()), sh, dt);
    if (n) std::memcpy(a.data<void>(), data, n * dt.size());
    *out = wrap(std::move(a));
  });
}
int mlex_array_scalar_f32(float v, mlex_dtype dtype, mlex_array* out) {
  return guard([&] { *out = wrap(mx::array(v, to_dtype(dtype))); });
}
int mlex_array_scalar_i32(int32_t v, mlex_dtype dtype, mlex_array* out) {
  return guard([&] { *out = wrap(mx::array(v, to_dtype(dtype))); });
}
int mlex_zeros(const int32_t* shape, size_t ndim, mlex_dtype dtype, mlex_array* out) {
  return guard([&] { *out = wrap(mx::zeros(to_shape(shape, ndim), to_dtype(dtype))); });
}
int mlex_ones(const int32_t* shape, size_t ndim, mlex_dtype dtype, mlex_array* out) {
  return guard([&] { *out = wrap(mx::ones(to_shape(shape, ndim), to_dtype(dtype))); });
}
int mlex_full(const int32_t* shape, size_t ndim, float v, mlex_dtype dtype, mlex_array* out) {
  return guard([&] { *out = wrap(mx::full(to_shape(shape, ndim), v, to_dtype(dtype))); });
}
int mlex_arange(double start, double stop, double step, mlex_dtype dtype, mlex_array* out) {
  return guard([&] { *out = wrap(mx::arange(start, stop, step, to_dtype(dtype))); });
}

int mlex_eval(const mlex_array* arrays, size_t n) {
  return guard([&] { mx::eval(to_vec(arrays, n)); });
}
int mlex_async_eval(const mlex_array* arrays, size_t n) {
  return guard([&] { mx::async_eval(to_vec(arrays, n)); });
}
int mlex_graph_census(const mlex_array* arrays, size_t n, const char** out) {
  // Counts the not-yet-evaluated operations the arrays depend on, by primitive name (a
  // multi-output operation once, through its first output): "name count" lines, most frequent first.
  static thread_local std::string text;
  return guard([&] {
    std::unordered_set<std::uintptr_t> seen;
    std::map<std::string, int> counts;
    std::vector<mx::array> stack = to_vec(arrays, n);
    while (!stack.empty()) {
      mx::array a = stack.back();
      stack.pop_back();
      if (!seen.insert(a.id()).second || !a.has_primitive()) continue;
      bool counted = false;
      for (const auto& s : a.siblings()) {
        counted |= !seen.insert(s.id()).second;
      }
      if (!counted) counts[a.primitive().name()]++;
      for (const auto& in : a.inputs()) stack.push_back(in);
    }
    std::vector<std::pair<int, std::string>> rows;
    for (auto& [name, c] : counts) rows.push_back({c, name});
    std::sort(rows.begin(), rows.end(), [](auto& x, auto& y) { return x.first > y.first || (x.first == y.first && x.second < y.second); });
    text.clear();
    for (auto& [c, name] : rows) text += name + " " + std::to_string(c) + "\n";
    *out = text.c_str();
  });
}
int mlex_synchronize(void) {
  return guard([&] { mx::synchronize(); });
}
int mlex_set_default_device(mlex_device d) {
  return guard([&] {
    mx::Device dev = d == MLEX_DEVICE_GPU ? mx::Device::gpu : mx::Device::cpu;
    if (!mx::is_available(dev)) throw std::runtime_error("this MLX build has no GPU backend");
    mx::set_default_device(dev);
  });
}
int mlex_default_device(mlex_device* out) {
  return guard([&] {
    *out = mx::default_device().type == mx::Device::gpu ? MLEX_DEVICE_GPU : MLEX_DEVICE_CPU;
  });
}
int mlex_gpu_available(bool* out) {
  return guard([&] { *out = mx::is_available(mx::Device::gpu); });
}
int mlex_memory_active(size_t* out) {
  return guard([&] { *out = mx::get_active_memory(); });
}
int mlex_memory_peak(size_t* out) {
  return guard([&] { *out = mx::get_peak_memory(); });
}
int mlex_memory_cache(size_t* out) {
  return guard([&] { *out = mx::get_cache_memory(); });
}
int mlex_memory_reset_peak(void) {
  return guard([&] { mx::reset_peak_memory(); });
}
int mlex_memory_limit(size_t* out) {
  return guard([&] { *out = mx::get_memory_limit(); });
}
int mlex_memory_clear_cache(void) {
  return guard([&] { mx::clear_cache(); });
}
int mlex_set_memory_limit(size_t limit, size_t* previous) {
  return guard([&] { *previous = mx::set_memory_limit(limit); });
}
int mlex_set_cache_limit(size_t limit, size_t* previous) {
  return guard([&] { *previous = mx::set_cache_limit(limit); });
}
int mlex_set_wired_limit(size_t limit, size_t* previous) {
  return guard([&] { *previous = mx::set_wired_limit(limit); });
}

int mlex_unary(mlex_unary_op op, mlex_array a, mlex_array* out) {
  return guard([&] {
    const auto& x = unwrap(a);
    switch (op) {
      case MLEX_UNARY_NEGATIVE: *out = wrap(mx::negative(x)); return;
      case MLEX_UNARY_EXP: *out = wrap(mx::exp(x)); return;
      case MLEX_UNARY_LOG: *out = wrap(mx::log(x)); return;
      case MLEX_UNARY_SQRT: *out = wrap(mx::sqrt(x)); return;
      case MLEX_UNARY_RSQRT: *out = wrap(mx::rsqrt(x)); return;
      case MLEX_UNARY_SQUARE: *out = wrap(mx::square(x)); return;
      case MLEX_UNARY_ABS: *out = wrap(mx::abs(x)); return;
      case MLEX_UNARY_SIGMOID: *out = wrap(mx::sigmoid(x)); return;
      case MLEX_UNARY_TANH: *out = wrap(mx::tanh(x)); return;
      case MLEX_UNARY_ERF: *out = wrap(mx::erf(x)); return;
      case MLEX_UNARY_SIN: *out = wrap(mx::sin(x)); return;
      case MLEX_UNARY_COS: *out = wrap(mx::cos(x)); return;
      case MLEX_UNARY_LOGICAL_NOT: *out = wrap(mx::logical_not(x)); return;
      case MLEX_UNARY_STOP_GRADIENT: *out = wrap(mx::stop_gradient(x)); return;
      case MLEX_UNARY_COPY: *out = wrap(mx::copy(x)); return;
      case MLEX_UNARY_FLOOR: *out = wrap(mx::floor(x)); return;
      case MLEX_UNARY_ISNAN: *out = wrap(mx::isnan(x)); return;
    }
    throw std::invalid_argument("unknown unary op");
  });
}

int mlex_binary(mlex_binary_op op, mlex_array a, mlex_array b, mlex_array* out) {
  return guard([&] {
    const auto& x = unwrap(a);
    const auto& y = unwrap(b);
    switch (op) {
      case MLEX_BINARY_ADD: *out = wrap(mx::add(x, y)); return;
      case MLEX_BINARY_SUBTRACT: *out = wrap(mx::subtract(x, y)); return;
      case MLEX_BINARY_MULTIPLY: *out = wrap(mx::multiply(x, y)); return;
      case MLEX_BINARY_DIVIDE: *out = wrap(mx::divide(x, y)); return;
      case MLEX_BINARY_MAXIMUM: *out = wrap(mx::maximum(x, y)); return;
      case MLEX_BINARY_MINIMUM: *out = wrap(mx::minimum(x, y)); return;
      case MLEX_BINARY_POWER: *out = wrap(mx::power(x, y)); return;
      case MLEX_BINARY_EQUAL: *out = wrap(mx::equal(x, y)); return;
      case MLEX_BINARY_NOT_EQUAL: *out = wrap(mx::not_equal(x, y)); return;
      case MLEX_BINARY_LESS: *out = wrap(mx::less(x, y)); return;
      case MLEX_BINARY_LESS_EQUAL: *out = wrap(mx::less_equal(x, y)); return;
      case MLEX_BINARY_GREATER: *out = wrap(mx::greater(x, y)); return;
      case MLEX_BINARY_GREATER_EQUAL: *out = wrap(mx::greater_equal(x, y)); return;
      case MLEX_BINARY_LOGICAL_AND: *out = wrap(mx::logical_and(x, y)); return;
      case MLEX_BINARY_LOGICAL_OR: *out = wrap(mx::logical_or(x, y)); return;
      case MLEX_BINARY_MATMUL:
        if (auto fast = mlex::cpu_dense_matmul(x, y)) {
          *out = wrap(std::move(*fast));
        } else {
          *out = wrap(mx::matmul(x, y));
        }
        return;
      case MLEX_BINARY_REMAINDER: *out = wrap(mx::remainder(x, y)); return;
      case MLEX_BINARY_FLOOR_DIVIDE: *out = wrap(mx::floor_divide(x, y)); return;
      case MLEX_BINARY_LOGADDEXP: *out = wrap(mx::logaddexp(x, y)); return;
    }
    throw std::invalid_argument("unknown binary op");
  });
}

int mlex_where(mlex_array cond, mlex_array a, mlex_array b, mlex_array* out) {
  return guard([&] { *out = wrap(mx::where(unwrap(cond), unwrap(a), unwrap(b))); });
}
int mlex_conv1d(mlex_array input, mlex_array weight, int stride, int padding, int dilation, int groups, mlex_array* out) {
  return guard([&] { *out = wrap(mx::conv1d(unwrap(input), unwrap(weight), stride, padding, dilation, groups)); });
}
int mlex_astype(mlex_array a, mlex_dtype dtype, mlex_array* out) {
  return guard([&] { *out = wrap(mx::astype(unwrap(a), to_dtype(dtype))); });
}
int mlex_addmm(mlex_array c, mlex_array a, mlex_array b, float alpha, float beta, mlex_array* out) {
  return guard([&] {
    // A dense layer's bias + x @ w_t with many rows of x on the CPU: our GEMM, then the add.
    if (alpha == 1.f && beta == 1.f) {
      if (auto fast = mlex::cpu_dense_matmul(unwrap(a), unwrap(b))) {
        *out = wrap(mx::add(*fast, unwrap(c)));
        return;
      }
    }
    *out = wrap(mx::addmm(unwrap(c), unwrap(a), unwrap(b), alpha, beta));
  });
}

int mlex_reduce(mlex_reduce_op op, mlex_array a, const int32_t* axes, size_t n_axes, bool keepdims,
                mlex_array* out) {
  return guard([&] {
    const auto& x = unwrap(a);
    std::vector<int> ax;
    if (n_axes == 0) {
      for (int i = 0; i < static_cast<int>(x.ndim()); ++i) ax.push_back(i);
    } else {
      ax.assign(axes, axes + n_axes);
    }
    switch (op) {
      case MLEX_REDUCE_SUM: *out = wrap(mx::sum(x, ax, keepdims)); return;
      case MLEX_REDUCE_MEAN: *out = wrap(mx::mean(x, ax, keepdims)); return;
      case MLEX_REDUCE_MAX: *out = wrap(mx::max(x, ax, keepdims)); return;
      case MLEX_REDUCE_MIN: *out = wrap(mx::min(x, ax, keepdims)); return;
      case MLEX_REDUCE_LOGSUMEXP: {
        const int nd = static_cast<int>(x.ndim());
        if (ax.size() == 1 && (ax[0] == nd - 1 || ax[0] == -1)) {
          if (auto fast = mlex::cpu_logsumexp_last(x, keepdims)) {
            *out = wrap(std::move(*fast));
            return;
          }
        }
        *out = wrap(mx::logsumexp(x, ax, keepdims));
        return;
      }
    }
    throw std::invalid_argument("unknown reduction");
  });
}
int mlex_argmax(mlex_array a, int32_t axis, bool keepdims, mlex_array* out) {
  return guard([&] { *out = wrap(mx::argmax(unwrap(a), axis, keepdims)); });
}
int mlex_softmax(mlex_array a, int32_t axis, bool precise, mlex_array* out) {
  return guard([&] { *out = wrap(mx::softmax(unwrap(a), std::vector<int>{axis}, precise)); });
}
int mlex_cumsum(mlex_array a, int32_t axis, bool reverse, bool inclusive, mlex_array* out) {
  return guard([&] { *out = wrap(mx::cumsum(unwrap(a), axis, reverse, inclusive)); });
}
int mlex_sort(mlex_array a, int32_t axis, mlex_array* out) {
  return guard([&] { *out = wrap(mx::sort(unwrap(a), axis)); });
}
int mlex_argsort(mlex_array a, int32_t axis, mlex_array* out) {
  return guard([&] { *out = wrap(mx::argsort(unwrap(a), axis)); });
}
int mlex_argpartition(mlex_array a, int32_t kth, int32_t axis, mlex_array* out) {
  return guard([&] { *out = wrap(mx::argpartition(unwrap(a), kth, axis)); });
}

int mlex_reshape(mlex_array a, const int32_t* shape, size_t ndim, mlex_array* out) {
  return guard([&] { *out = wrap(mx::reshape(unwrap(a), to_shape(shape, ndim))); });
}
int mlex_transpose(mlex_array a, const int32_t* axes, size_t n, mlex_array* out) {
  return guard([&] { *out = wrap(mx::transpose(unwrap(a), std::vector<int>(axes, axes + n))); });
}
int mlex_swapaxes(mlex_array a, int32_t axis1, int32_t axis2, mlex_array* out) {
  return guard([&] { *out = wrap(mx::swapaxes(unwrap(a), axis1, axis2)); });
}
int mlex_expand_dims(mlex_array a, int32_t axis, mlex_array* out) {
  return guard([&] { *out = wrap(mx::expand_dims(unwrap(a), axis)); });
}
int mlex_squeeze(mlex_array a, int32_t axis, mlex_array* out) {
  return guard([&] { *out = wrap(mx::squeeze(unwrap(a), axis)); });
}
int mlex_broadcast_to(mlex_array a, const int32_t* shape, size_t ndim, mlex_array* out) {
  return guard([&] { *out = wrap(mx::broadcast_to(unwrap(a), to_shape(shape, ndim))); });
}
int mlex_concatenate(const mlex_array* arrays, size_t n, int32_t axis, mlex_array* out) {
  return guard([&] { *out = wrap(mx::concatenate(to_vec(arrays, n), axis)); });
}
int mlex_split_sections(mlex_array a, const int32_t* indices, size_t n_indices, int32_t axis,
                        mlex_array* outs) {
  return guard([&] {
    auto parts = mx::split(unwrap(a), mx::Shape(indices, indices + n_indices), axis);
    for (size_t i = 0; i < parts.size(); ++i) outs[i] = wrap(parts[i]);
  });
}
int mlex_slice(mlex_array a, const int32_t* start, const int32_t* stop, const int32_t* strides,
               size_t ndim, mlex_array* out) {
  return guard([&] {
    *out = wrap(mx::slice(unwrap(a), to_shape(start, ndim), to_shape(stop, ndim),
                          to_shape(strides, ndim)));
  });
}
int mlex_slice_update(mlex_array a, mlex_array update, const int32_t* start, const int32_t* stop,
                      const int32_t* strides, size_t ndim, mlex_array* out) {
  return guard([&] {
    *out = wrap(mx::slice_update(unwrap(a), unwrap(update), to_shape(start, ndim), to_shape(stop, ndim),
                                 to_shape(strides, ndim)));
  });
}
int mlex_take(mlex_array a, mlex_array indices, int32_t axis, mlex_array* out) {
  return guard([&] { *out = wrap(mx::take(unwrap(a), unwrap(indices), axis)); });
}
int mlex_take_along_axis(mlex_array a, mlex_array indices, int32_t axis, mlex_array* out) {
  return guard([&] { *out = wrap(mx::take_along_axis(unwrap(a), unwrap(indices), axis)); });
}
int mlex_put_along_axis(mlex_array a, mlex_array indices, mlex_array values, int32_t axis,
                        mlex_array* out) {
  return guard(
      [&] { *out = wrap(mx::put_along_axis(unwrap(a), unwrap(indices), unwrap(values), axis)); });
}
int mlex_contiguous(mlex_array a, mlex_array* out) {
  return guard([&] { *out = wrap(mx::contiguous(unwrap(a))); });
}

int mlex_view(mlex_array a, mlex_dtype dtype, mlex_array* out) {
  return guard([&] { *out = wrap(mx::view(unwrap(a), to_dtype(dtype))); });
}

int mlex_fast_rms_norm(mlex_array x, mlex_array weight, float eps, mlex_array* out) {
  return guard([&] {
    // Our own CPU kernel where it applies (MLX's CPU backend expands it into ~8 ops); same below.
    if (auto fast = mlex::cpu_rms_norm(unwrap(x), opt(weight), eps)) {
      *out = wrap(*fast);
      return;
    }
    *out = wrap(mx::fast::rms_norm(unwrap(x), opt(weight), eps));
  });
}
int mlex_fast_layer_norm(mlex_array x, mlex_array weight, mlex_array bias, float eps, mlex_array* out) {
  return guard([&] { *out = wrap(mx::fast::layer_norm(unwrap(x), opt(weight), opt(bias), eps)); });
}
int mlex_fast_rope(mlex_array x, int32_t dims, bool traditional, float base, float scale, int32_t offset,
                   mlex_array freqs, mlex_array* out) {
  return guard([&] {
    if (auto fast = mlex::cpu_rope(unwrap(x), dims, traditional, base, scale, offset, opt(freqs))) {
      *out = wrap(*fast);
      return;
    }
    std::optional<float> b;
    if (freqs == nullptr) b = base;
    *out = wrap(mx::fast::rope(unwrap(x), dims, traditional, b, scale, offset, opt(freqs)));
  });
}
int mlex_cpu_decode_attention(mlex_array qkv, mlex_array k_cache, mlex_array v_cache, int32_t offset,
                              mlex_array positions, mlex_array key_start, int32_t n_q_heads, int32_t n_kv_heads, float scale, mlex_array q_norm,
                              mlex_array k_norm, float eps, int32_t rope_dims, bool traditional, float base,
                              float rope_scale, mlex_array freqs, mlex_array* out, mlex_array* out_k,
                              mlex_array* out_v) {
  return guard([&] {
    *out = *out_k = *out_v = nullptr;
    const mlex::DecodeAttentionArgs args{n_q_heads, n_kv_heads,  offset, opt(positions), opt(key_start),
                                         scale,     opt(q_norm), opt(k_norm), eps,         rope_dims,
                                         traditional, base,      rope_scale,  opt(freqs)};
    if (auto r = mlex::cpu_decode_attention(unwrap(qkv), unwrap(k_cache), unwrap(v_cache), args)) {
      *out = wrap(std::get<0>(*r));
      *out_k = wrap(std::get<1>(*r));
      *out_v = wrap(std::get<2>(*r));
    }
  });
}
int mlex_cuda_qkv_into_cache(mlex_array qkv, int32_t n_q_heads, int32_t n_kv_heads, mlex_array q_norm,
                             mlex_array k_norm, float eps, bool traditional, float base, float scale,
                             mlex_array freqs, mlex_array positions, mlex_array at, mlex_array k_cache,
                             mlex_array v_cache, mlex_array* out_q) {
  return guard([&] {
    *out_q = nullptr;
    const mlex::RopeArgs rope{traditional, base, scale, opt(freqs)};
    std::optional<std::pair<mx::array, mx::array>> norms;
    if (q_norm != nullptr && k_norm != nullptr) norms.emplace(unwrap(q_norm), unwrap(k_norm));
    if (auto q = mlex::cuda_qkv_into_cache(unwrap(qkv), n_q_heads, n_kv_heads, norms, eps, rope, unwrap(positions),
                                           unwrap(at), unwrap(k_cache), unwrap(v_cache))) {
      *out_q = wrap(*q);
    }
  });
}
int mlex_cuda_decode_attention(mlex_array qkv, int32_t n_q_heads, int32_t n_kv_heads, mlex_array q_norm,
                               mlex_array k_norm, float eps, bool traditional, float base, float scale,
                               mlex_array freqs, mlex_array positions, mlex_array at, mlex_array k_cache,
                               mlex_array v_cache, float attn_scale, mlex_array* out) {
  return guard([&] {
    *out = nullptr;
    const mlex::RopeArgs rope{traditional, base, scale, opt(freqs)};
    std::optional<std::pair<mx::array, mx::array>> norms;
    if (q_norm != nullptr && k_norm != nullptr) norms.emplace(unwrap(q_norm), unwrap(k_norm));
    if (auto o = mlex::cuda_decode_attention(unwrap(qkv), n_q_heads, n_kv_heads, norms, eps, rope, unwrap(positions),
                                             unwrap(at), unwrap(k_cache), unwrap(v_cache), attn_scale)) {
      *out = wrap(*o);
    }
  });
}
int mlex_cuda_qk_norm_rope(mlex_array qkv, int32_t n_q_heads, int32_t n_kv_heads, mlex_array q_norm,
                           mlex_array k_norm, float eps, bool traditional, float base, float scale, mlex_array freqs,
                           mlex_array positions, mlex_array* out_q, mlex_array* out_k) {
  return guard([&] {
    *out_q = nullptr;
    *out_k = nullptr;
    const mlex::RopeArgs rope{traditional, base, scale, opt(freqs)};
    if (auto qk = mlex::cuda_qk_norm_rope(unwrap(qkv), n_q_heads, n_kv_heads, unwrap(q_norm), unwrap(k_norm), eps,
                                          rope, unwrap(positions))) {
      *out_q = wrap(qk->first);
      *out_k = wrap(qk->second);
    }
  });
}
int mlex_fast_rope_offsets(mlex_array x, int32_t dims, bool traditional, float base, float scale, mlex_array offsets,
                           mlex_array freqs, mlex_array* out) {
  return guard([&] {
    const mx::array& off = unwrap(offsets);
    if (auto fast = mlex::cpu_rope(unwrap(x), dims, traditional, base, scale, 0, opt(freqs), off)) {
      *out = wrap(*fast);
      return;
    }
    std::optional<float> b;
    if (freqs == nullptr) b = base;
    *out = wrap(mx::fast::rope(unwrap(x), dims, traditional, b, scale, mx::astype(off, mx::int32), opt(freqs)));
  });
}

int mlex_fast_sdpa_padded(mlex_array q, mlex_array k, mlex_array v, float scale, bool causal, mlex_array key_start,
                          mlex_array* out) {
  return guard([&] {
    const mx::array &qa = unwrap(q), &ka = unwrap(k), &start = unwrap(key_start);
    if (auto fast = mlex::cpu_attention(qa, ka, unwrap(v), scale, causal, start)) {
      *out = wrap(*fast);
      return;
    }
    // Boolean mask [B, 1, L, S]: key j visible to query l of row b when j >= key_start[b] (and,
    // causal, j <= S - L + l).
    const int L = qa.shape(2), S = ka.shape(2);
    auto cols = mx::reshape(mx::arange(S, mx::int32), {1, 1, 1, S});
    auto mask = mx::greater_equal(cols, mx::reshape(mx::astype(start, mx::int32), {-1, 1, 1, 1}));
    if (causal) {
      auto rows = mx::reshape(mx::arange(S - L, S, mx::int32), {1, 1, L, 1});
      mask = mx::logical_and(mask, mx::less_equal(cols, rows));
    }
    *out = wrap(mx::fast::scaled_dot_product_attention(qa, ka, unwrap(v), scale, "", mask));
  });
}

int mlex_cuda_prefetch(const mlex_array* arrays, size_t n, uint64_t* bytes) {
  return guard([&] { *bytes = mlex::cuda_launch::prefetch_to_device(to_vec(arrays, n)); });
}
int mlex_cuda_short_attention(mlex_array q, mlex_array k, mlex_array v, float scale, int32_t prev, bool token_major,
                              bool flat, mlex_array* out) {
  return guard([&] {
    *out = nullptr;
    if (auto o = mlex::cuda_short_attention(unwrap(q), unwrap(k), unwrap(v), scale, prev, token_major, flat)) {
      *out = wrap(*o);
    }
  });
}

int mlex_fast_sdpa(mlex_array q, mlex_array k, mlex_array v, float scale, const char* mask_mode,
                   mlex_array mask, mlex_array* out) {
  return guard([&] {
    std::string mode = mask_mode ? mask_mode : "";
    if (mask != nullptr && mode.empty()) mode = "array";
    if (mask == nullptr && (mode.empty() || mode == "causal")) {
      if (auto fast = mlex::cpu_attention(unwrap(q), unwrap(k), unwrap(v), scale, mode == "causal")) {
        *out = wrap(*fast);
        return;
      }
    }
    *out = wrap(mx::fast::scaled_dot_product_attention(unwrap(q), unwrap(k), unwrap(v), scale, mode,
                                                       opt(mask)));
  });
}

int mlex_fast_sdpa_sinks(mlex_array q, mlex_array k, mlex_array v, float scale, const char* mask_mode,
                         mlex_array mask, mlex_array sinks, mlex_array* out) {
  return guard([&] {
    std::string mode = mask_mode ? mask_mode : "";
    if (mask != nullptr && mode.empty()) mode = "array";
    *out = wrap(mx::fast::scaled_dot_product_attention(unwrap(q), unwrap(k), unwrap(v), scale, mode,
                                                       opt(mask), opt(sinks)));
  });
}

int mlex_gated_delta(mlex_array q, mlex_array k, mlex_array v, mlex_array g, mlex_array beta, mlex_array state,
                     mlex_array* y, mlex_array* state_out) {
  return guard([&] {
    *y = nullptr;
    *state_out = nullptr;
    if (auto r = mlex::gated_delta(unwrap(q), unwrap(k), unwrap(v), unwrap(g), unwrap(beta), unwrap(state))) {
      *y = wrap(r->first);
      *state_out = wrap(r->second);
    }
  });
}

int mlex_gated_delta_update(mlex_array q, mlex_array k, mlex_array v, mlex_array a, mlex_array b, mlex_array a_log,
                            mlex_array dt_bias, mlex_array state, mlex_array* y, mlex_array* state_out) {
  return guard([&] {
    *y = nullptr;
    *state_out = nullptr;
    if (auto r = mlex::gated_delta_update(unwrap(q), unwrap(k), unwrap(v), unwrap(a), unwrap(b), unwrap(a_log),
                                          unwrap(dt_bias), unwrap(state))) {
      *y = wrap(r->first);
      *state_out = wrap(r->second);
    }
  });
}

int mlex_gather_mm(mlex_array a, mlex_array b, mlex_array lhs_indices, mlex_array rhs_indices,
                   bool sorted_indices, mlex_array* out) {
  return guard([&] {
    *out = wrap(mx::gather_mm(unwrap(a), unwrap(b), opt(lhs_indices), opt(rhs_indices), sorted_indices));
  });
}

int mlex_gather_qmm(mlex_array x, mlex_array w, mlex_array scales, mlex_array biases, mlex_array lhs_indices,
                    mlex_array rhs_indices, bool transpose, int32_t group_size, int32_t bits, const char* mode,
                    bool sorted_indices, mlex_array* out) {
  return guard([&] {
    *out = wrap(mx::gather_qmm(unwrap(x), unwrap(w), unwrap(scales), opt(biases), opt(lhs_indices),
                               opt(rhs_indices), transpose, group_size, bits, mode ? mode : "affine",
                               std::nullopt, sorted_indices));
  });
}

int mlex_quantize(mlex_array w, int32_t group_size, int32_t bits, const char* mode, mlex_array* outs,
                  size_t* n_out) {
  return guard([&] {
    auto parts = mx::quantize(unwrap(w), group_size, bits, mode ? mode : "affine");
    for (size_t i = 0; i < parts.size(); ++i) outs[i] = wrap(parts[i]);
    *n_out = parts.size();
  });
}
int mlex_dequantize(mlex_array w, mlex_array scales, mlex_array biases, int32_t group_size, int32_t bits,
                    const char* mode, int32_t out_dtype, mlex_array* out) {
  return guard([&] {
    std::optional<mx::Dtype> dt;
    if (out_dtype >= 0) dt = to_dtype(static_cast<mlex_dtype>(out_dtype));
    *out = wrap(mx::dequantize(unwrap(w), unwrap(scales), opt(biases), group_size, bits,
                               mode ? mode : "affine", std::nullopt, dt));
  });
}
namespace {
mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const std::optional<mx::array>& biases, bool transpose, int group_size, int bits,
                           const std::string& mode) {
  // Our own CPU kernel where it applies (MLX's runs a scalar loop on one thread on x86).
  if (auto fast = mlex::cpu_quantized_matmul(x, w, scales, biases, transpose, group_size, bits, mode)) {
    return *fast;
  }
  // And on CUDA for the decode step's matrix-vector products (MLX's qmv is far from bandwidth).
  if (auto fast = mlex::cuda_quantized_matvec(x, w, scales, biases, transpose, group_size, bits, mode)) {
    return *fast;
  }
  return mx::quantized_matmul(x, w, scales, biases, transpose, group_size, bits, mode);
}
mx::array swiglu(const mx::array& gate, const mx::array& up);
}  // namespace

int mlex_quantized_matmul(mlex_array x, mlex_array w, mlex_array scales, mlex_array biases, bool transpose,
                          int32_t group_size, int32_t bits, const char* mode, mlex_array* out) {
  return guard([&] {
    *out = wrap(quantized_matmul(unwrap(x), unwrap(w), unwrap(scales), opt(biases), transpose, group_size, bits,
                                 mode ? mode : "affine"));
  });
}
int mlex_quantized_matmul_fused(mlex_array x, mlex_array norm_weight, float eps, mlex_array w, mlex_array scales,
                                mlex_array biases, int32_t group_size, int32_t bits, const char* mode,
                                int32_t epilogue, mlex_array residual, mlex_array* out) {
  return guard([&] {
    const std::string m = mode ? mode : "affine";
    if (epilogue < 0 || epilogue > 3) throw std::invalid_argument("unknown epilogue " + std::to_string(epilogue));
    if ((epilogue == 1 || epilogue == 3) && !residual) {
      throw std::invalid_argument(epilogue == 1 ? "the residual epilogue needs a residual" : "the bias epilogue needs a bias");
    }
    const auto epi = static_cast<mlex::Epilogue>(epilogue);
    if (auto fast = mlex::cuda_quantized_matvec(unwrap(x), unwrap(w), unwrap(scales), opt(biases), true, group_size,
                                                bits, m, epi, opt(residual), opt(norm_weight), eps)) {
      *out = wrap(*fast);
      return;
    }
    // Our CPU kernel with the norm and the epilogue folded in (the unfused ops' bits).
    if (auto fast = mlex::cpu_quantized_matmul(unwrap(x), unwrap(w), unwrap(scales), opt(biases), true, group_size,
                                               bits, m, opt(norm_weight), eps, epi, opt(residual))) {
      *out = wrap(*fast);
      return;
    }
    // Our CPU kernel with the norm folded in (the same bits as the norm's own op), or the norm on
    // its own (our CUDA kernel may still take the product and its epilogue), else the same ops
    // unfused, as the model would write them.
    std::optional<mx::array> product =
        norm_weight ? mlex::cpu_quantized_matmul(unwrap(x), unwrap(w), unwrap(scales), opt(biases), true, group_size,
                                                 bits, m, opt(norm_weight), eps)
                    : std::nullopt;
    if (norm_weight && !product) {
      mx::array xn = unwrap(x);
      auto cpu = mlex::cpu_rms_norm(xn, opt(norm_weight), eps);
      xn = cpu ? *cpu : mx::fast::rms_norm(xn, opt(norm_weight), eps);
      if (auto fast = mlex::cuda_quantized_matvec(xn, unwrap(w), unwrap(scales), opt(biases), true, group_size, bits,
                                                  m, epi, opt(residual))) {
        *out = wrap(*fast);
        return;
      }
      product = quantized_matmul(xn, unwrap(w), unwrap(scales), opt(biases), true, group_size, bits, m);
    }
    if (!product) product = quantized_matmul(unwrap(x), unwrap(w), unwrap(scales), opt(biases), true, group_size, bits, m);
    const mx::array& y = *product;
    if (epilogue == 0) {
      *out = wrap(y);
    } else if (epilogue == 1) {
      *out = wrap(mx::add(unwrap(residual), y));
    } else if (epilogue == 3) {
      *out = wrap(mx::add(y, unwrap(residual)));
    } else {
      auto halves = mx::split(y, 2, -1);
      *out = wrap(swiglu(halves[0], halves[1]));
    }
  });
}

int mlex_random_key(uint64_t seed, mlex_array* out) {
  return guard([&] { *out = wrap(mx::random::key(seed)); });
}
int mlex_random_split(mlex_array key, mlex_array* out_a, mlex_array* out_b) {
  return guard([&] {
    auto [a, b] = mx::random::split(unwrap(key));
    *out_a = wrap(a);
    *out_b = wrap(b);
  });
}
int mlex_random_normal(const int32_t* shape, size_t ndim, mlex_dtype dtype, float scale, mlex_array key,
                       mlex_array* out) {
  return guard([&] {
    *out = wrap(mx::random::normal(to_shape(shape, ndim), to_dtype(dtype), 0.0f, scale, opt(key)));
  });
}
int mlex_random_categorical(mlex_array logits, int32_t axis, mlex_array key, mlex_array* out) {
  return guard([&] { *out = wrap(mx::random::categorical(unwrap(logits), axis, opt(key))); });
}

namespace {
std::vector<mx::array> swiglu_impl(const std::vector<mx::array>& in) {
  const auto& g = in[0];
  return {mx::multiply(mx::multiply(g, mx::sigmoid(g)), in[1])};
}
// MLX's nn.gelu_approx, in its order: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3))).
mx::array gelu_approx_expr(const mx::array& x) {
  auto dt = x.dtype();
  auto cube = mx::power(x, mx::array(3.0f, dt));
  auto inner = mx::multiply(mx::array(0.7978845608028654f, dt), mx::add(x, mx::multiply(mx::array(0.044715f, dt), cube)));
  return mx::multiply(mx::multiply(mx::array(0.5f, dt), x), mx::add(mx::array(1.0f, dt), mx::tanh(inner)));
}
std::vector<mx::array> geglu_impl(const std::vector<mx::array>& in) {
  return {mx::multiply(gelu_approx_expr(in[0]), in[1])};
}
std::vector<mx::array> gelu_approx_impl(const std::vector<mx::array>& in) { return {gelu_approx_expr(in[0])}; }
std::vector<mx::array> precise_swiglu_impl(const std::vector<mx::array>& in) {
  auto g = mx::astype(in[1], mx::float32);
  g = mx::multiply(g, mx::sigmoid(g));
  return {mx::astype(mx::multiply(g, mx::astype(in[2], mx::float32)), in[0].dtype())};
}
}  // namespace

void mlex_set_ablations(uint32_t kernels) { mlex::ablated_kernels().store(kernels); }

void mlex_set_cpu_int8_activations(int on) { mlex::set_cpu_int8_activations(on != 0); }

int mlex_cpu_int8_activations_supported(void) { return mlex::has_avx512_vnni() ? 1 : 0; }

namespace {
mx::array swiglu(const mx::array& gate, const mx::array& up) {
  if (auto fast = mlex::cpu_swiglu(gate, up)) return *fast;
  // Compiled once, shapeless: one fused kernel instead of three element-wise ops per layer.
  static auto fn = mx::compile(swiglu_impl, /*shapeless=*/true);
  return fn({gate, up})[0];
}
}  // namespace
int mlex_compiled_swiglu(mlex_array gate, mlex_array up, mlex_array* out) {
  return guard([&] { *out = wrap(swiglu(unwrap(gate), unwrap(up))); });
}
int mlex_compiled_geglu(mlex_array gate, mlex_array up, mlex_array* out) {
  return guard([&] {
    static auto fn = mx::compile(geglu_impl, /*shapeless=*/true);
    *out = wrap(fn({unwrap(gate), unwrap(up)})[0]);
  });
}

int mlex_compiled_gelu_approx(mlex_array x, mlex_array* out) {
  return guard([&] {
    static auto fn = mx::compile(gelu_approx_impl, /*shapeless=*/true);
    *out = wrap(fn({unwrap(x)})[0]);
  });
}

int mlex_compiled_precise_swiglu(mlex_array like, mlex_array gate, mlex_array x, mlex_array* out) {
  return guard([&] {
    static auto fn = mx::compile(precise_swiglu_impl, /*shapeless=*/true);
    *out = wrap(fn({unwrap(like), unwrap(gate), unwrap(x)})[0]);
  });
}

int mlex_save_safetensors(const char* path, const char* const* names, const mlex_array* arrays, size_t n) {
  return guard([&] {
    std::unordered_map<std::string, mx::array> m;
    for (size_t i = 0; i < n; ++i) m.insert({names[i], unwrap(arrays[i])});
    mx::save_safetensors(std::string(path), m, {{"format", "mlx"}});
  });
}

}  // extern "C"
