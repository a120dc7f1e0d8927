#include "cuda_launch.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <unordered_set>

#include "mlx/allocator.h"
#include "mlx/primitives.h"

#if defined(__linux__)
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#endif

#include "ablation.h"

#include "mlx/backend/cuda/cuda.h"

namespace mx = mlx::core;

namespace mlex::cuda_launch {
namespace {

// CUDA's dim3 as libmlx's exported functions take it by value (three unsigned ints).
struct Dim3 {
  unsigned int x = 1, y = 1, z = 1;
};

// libmlx's cu::CommandEncoder, opaque: only its exported member functions are called.
struct Encoder;

using CuResult = int;  // CUresult; 0 is CUDA_SUCCESS

// CUmemLocation (type 1: CU_MEM_LOCATION_TYPE_DEVICE, id: the device ordinal).
struct CuMemLocation {
  int type = 1;
  int id = 0;
};

#if defined(__linux__)
// The address of function `name` of the library mapped at `base` from file `path`, found in the
// file's static symbol table (.symtab), for a function the library does not export. nullptr
// when the file has no such table or no such function.
void* local_function(const char* path, uintptr_t base, const char* name) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* map = fstat(fd, &st) == 0 ? mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  close(fd);
  if (map == MAP_FAILED) return nullptr;
  const char* p = static_cast<const char*>(map);
  const size_t size = st.st_size, len = std::strlen(name);
  void* found = nullptr;
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(p);
  bool ok = size >= sizeof *eh && std::memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_ident[EI_CLASS] == ELFCLASS64 &&
            eh->e_shentsize == sizeof(Elf64_Shdr) && eh->e_shoff + eh->e_shnum * sizeof(Elf64_Shdr) <= size;
  const auto* sh = ok ? reinterpret_cast<const Elf64_Shdr*>(p + eh->e_shoff) : nullptr;
  for (int i = 0; ok && found == nullptr && i < eh->e_shnum; ++i) {
    if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum) continue;
    const Elf64_Shdr& strs = sh[sh[i].sh_link];
    if (sh[i].sh_offset + sh[i].sh_size > size || strs.sh_offset + strs.sh_size > size) continue;
    const auto* syms = reinterpret_cast<const Elf64_Sym*>(p + sh[i].sh_offset);
    for (size_t j = 0, n = sh[i].sh_size / sizeof(Elf64_Sym); j < n; ++j) {
      const Elf64_Sym& s = syms[j];
      if (ELF64_ST_TYPE(s.st_info) != STT_FUNC || s.st_value == 0 || s.st_name + len >= strs.sh_size) continue;
      if (std::memcmp(p + strs.sh_offset + s.st_name, name, len + 1) == 0) {
        found = reinterpret_cast<void*>(base + s.st_value);
        break;
      }
    }
  }
  munmap(map, size);
  return found;
}
#endif

struct Api {
  // libmlx 0.32 (mlx/backend/cuda/device.h)
  Encoder& (*get_command_encoder)(mx::Stream) = nullptr;
  void (*set_input_array)(Encoder*, const mx::array&) = nullptr;
  void (*set_output_array)(Encoder*, const mx::array&) = nullptr;
  void (*add_kernel_node_raw)(Encoder*, void* fn, Dim3 grid, Dim3 block, Dim3 cluster, uint32_t smem,
                              void** params) = nullptr;
  void (*add_completed_handler)(Encoder*, std::function<void()>) = nullptr;
  // cu::malloc_async: device memory from the stream's pool, as MLX's own kernels allocate their
  // outputs. Not exported: found in libmlx's symbol table; nullptr when it is not there.
  mx::allocator::Data (*malloc_async)(size_t, Encoder&) = nullptr;
  // the CUDA driver, for weights: see prefetch_to_device
  CuResult (*mem_prefetch)(unsigned long long, size_t, CuMemLocation, unsigned int, void*) = nullptr;
  CuResult (*ctx_synchronize)() = nullptr;
  // the CUDA driver
  CuResult (*ctx_get_current)(void**) = nullptr;
  CuResult (*ctx_set_current)(void*) = nullptr;
  CuResult (*device_get)(int*, int) = nullptr;
  CuResult (*primary_ctx_retain)(void**, int) = nullptr;
  CuResult (*module_load_data)(void**, const void*) = nullptr;
  CuResult (*module_get_function)(void**, void*, const char*) = nullptr;
  CuResult (*error_string)(CuResult, const char**) = nullptr;
  std::string why_not;
};

const Api& api() {
  static const Api a = [] {
    Api a;
#if defined(__linux__)
    if (!mx::cu::is_available()) {
      a.why_not = "this libmlx has no CUDA backend";
      return a;
    }
    // libmlx itself (by the file that holds one of its functions: it may have been loaded
    // privately, by the Node addon), and the libcuda it loaded.
    Dl_info info{};
    void* mlx = nullptr;
    if (dladdr(reinterpret_cast<void*>(&mx::cu::is_available), &info) != 0 && info.dli_fname != nullptr) {
      mlx = dlopen(info.dli_fname, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    }
    void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (mlx == nullptr || cuda == nullptr) {
      a.why_not = mlx == nullptr ? "libmlx could not be found among the loaded libraries"
                                 : "libcuda.so.1 is not loaded";
      return a;
    }
    auto sym = [&](void* lib, auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (fn == nullptr && a.why_not.empty()) a.why_not = std::string("missing symbol ") + name;
    };
    sym(mlx, a.get_command_encoder, "_ZN3mlx4core2cu19get_command_encoderENS0_6StreamE");
    sym(mlx, a.set_input_array, "_ZN3mlx4core2cu14CommandEncoder15set_input_arrayERKNS0_5arrayE");
    sym(mlx, a.set_output_array, "_ZN3mlx4core2cu14CommandEncoder16set_output_arrayERKNS0_5arrayE");
    sym(mlx, a.add_kernel_node_raw, "_ZN3mlx4core2cu14CommandEncoder19add_kernel_node_rawEP9CUfunc_st4dim3S5_S5_jPPv");
    sym(mlx, a.add_completed_handler, "_ZN3mlx4core2cu14CommandEncoder21add_completed_handlerESt8functionIFvvEE");
    sym(cuda, a.ctx_get_current, "cuCtxGetCurrent");
    sym(cuda, a.ctx_set_current, "cuCtxSetCurrent");
    sym(cuda, a.device_get, "cuDeviceGet");
    sym(cuda, a.primary_ctx_retain, "cuDevicePrimaryCtxRetain");
    sym(cuda, a.module_load_data, "cuModuleLoadData");
    sym(cuda, a.module_get_function, "cuModuleGetFunction");
    sym(cuda, a.error_string, "cuGetErrorString");
    // Optional: without them outputs come from MLX's managed memory and weights are not prefetched.
    a.mem_prefetch = reinterpret_cast<decltype(a.mem_prefetch)>(dlsym(cuda, "cuMemPrefetchAsync_v2"));
    a.ctx_synchronize = reinterpret_cast<decltype(a.ctx_synchronize)>(dlsym(cuda, "cuCtxSynchronize"));
    if (a.why_not.empty()) {
      void* f = local_function(info.dli_fname, reinterpret_cast<uintptr_t>(info.dli_fbase),
                               "_ZN3mlx4core2cu12malloc_asyncEmRNS1_14CommandEncoderE");
      Dl_info in{};
      // Only an address inside libmlx itself (a stale or foreign symbol table would point elsewhere).
      if (f != nullptr && dladdr(f, &in) != 0 && in.dli_fbase == info.dli_fbase) {
        a.malloc_async = reinterpret_cast<decltype(a.malloc_async)>(f);
      }
    }
#else
    a.why_not = "CUDA kernels are launched on Linux only";
#endif
    return a;
  }();
  return a;
}

std::string cu_error(CuResult r) {
  const char* s = nullptr;
  if (api().error_string != nullptr) api().error_string(r, &s);
  return s != nullptr ? s : "CUDA error " + std::to_string(r);
}

// The device address of an array's first element. libmlx's CUDA buffers
// (mlx/backend/cuda/allocator.h: CudaBuffer) begin with the device pointer.
void* device_address(const mx::array& a) {
  if (a.nbytes() == 0) return nullptr;
  struct CudaBufferHead {
    void* data;
  };
  auto* head = static_cast<const CudaBufferHead*>(a.buffer().ptr());
  return static_cast<char*>(head->data) + a.offset();
}

class Launch : public mx::Primitive {
 public:
  Launch(mx::Stream s, std::shared_ptr<const Kernel> kernel, Dim3 grid, Dim3 block, std::vector<int> in_place)
      : mx::Primitive(s), kernel_(std::move(kernel)), grid_(grid), block_(block), in_place_(std::move(in_place)) {}

  void eval_cpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error(kernel_->name() + " is a CUDA kernel: it has no CPU implementation");
  }

  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const Api& a = api();
    Encoder& enc = a.get_command_encoder(stream());
    void* fn = kernel_->function();
    // Device memory, as MLX's kernels take (cu::malloc_async). mx::allocator::malloc is managed
    // memory: when it reuses a cached device buffer, MLX first copies that buffer into fresh
    // managed memory with a synchronous cudaMemcpy, stalling the host mid-encoding.
    const bool device_memory = a.malloc_async != nullptr && !ablated(MLEX_ABLATE_KERNEL_CUDA_DEVICE_ALLOC);
    for (auto& out : outputs) {
      out.set_data(device_memory ? a.malloc_async(out.nbytes(), enc) : mx::allocator::malloc(out.nbytes()));
    }
    std::vector<void*> addresses;
    addresses.reserve(inputs.size() + outputs.size());
    // An input that is not row contiguous is copied first, by MLX's own Contiguous primitive on
    // this stream (as CustomKernel does); the copies live until the GPU is done with them.
    std::vector<mx::array> copies;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto& in = inputs[i];
      const mx::array* x = &in;
      const bool written = std::find(in_place_.begin(), in_place_.end(), static_cast<int>(i)) != in_place_.end();
      if (written && !in.flags().row_contiguous) {
        // A copy would take the writes: the caller promised a contiguous buffer.
        throw std::runtime_error(kernel_->name() + ": a buffer written in place is not row contiguous");
      }
      if (!in.flags().row_contiguous) {
        // (Contiguous's members are not exported from libmlx: its op makes one, called through
        // its vtable.)
        copies.push_back(mx::contiguous(in, false, stream()));
        std::vector<mx::array> out{copies.back()};
        copies.back().primitive().eval_gpu({in}, out);
        x = &copies.back();
      }
      a.set_input_array(&enc, *x);
      // Written in place: registered as this kernel's output too, so that MLX orders whatever
      // reads the buffer later after this kernel.
      if (written) a.set_output_array(&enc, *x);
      addresses.push_back(device_address(*x));
    }
    for (const auto& out : outputs) {
      a.set_output_array(&enc, out);
      addresses.push_back(device_address(out));
    }
    std::vector<void*> params(addresses.size());
    for (size_t i = 0; i < addresses.size(); ++i) params[i] = &addresses[i];
    a.add_kernel_node_raw(&enc, fn, grid_, block_, Dim3{}, 0, params.data());
    if (!copies.empty()) a.add_completed_handler(&enc, [keep = std::move(copies)]() {});
  }

  const char* name() const override { return "MlexCudaKernel"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const Launch*>(&other);
    return o != nullptr && o->kernel_ == kernel_ && o->grid_.x == grid_.x && o->grid_.y == grid_.y &&
           o->grid_.z == grid_.z && o->block_.x == block_.x && o->block_.y == block_.y && o->block_.z == block_.z;
  }

 private:
  std::shared_ptr<const Kernel> kernel_;
  Dim3 grid_, block_;
  std::vector<int> in_place_;
};

// MLX makes its device current with the runtime API; if this thread has no context yet, take
// the device's primary context, the one the runtime API uses.
void make_context_current() {
  const Api& a = api();
  void* ctx = nullptr;
  if (a.ctx_get_current(&ctx) != 0 || ctx == nullptr) {
    int dev = 0;
    CuResult r = a.device_get(&dev, 0);
    if (r == 0) r = a.primary_ctx_retain(&ctx, dev);
    if (r == 0) r = a.ctx_set_current(ctx);
    if (r != 0) throw std::runtime_error("no CUDA context: " + cu_error(r));
  }
}

}  // namespace

size_t prefetch_to_device(const std::vector<mx::array>& arrays) {
  const Api& a = api();
  if (!a.why_not.empty() || a.mem_prefetch == nullptr || a.ctx_synchronize == nullptr) return 0;
  try {
    make_context_current();
  } catch (const std::exception&) {
    return 0;
  }
  // libmlx's CudaBuffer (mlx/backend/cuda/allocator.h): device -1 is managed memory.
  struct CudaBufferHead {
    void* data;
    size_t size;
    int device;
  };
  std::unordered_set<const void*> seen;
  size_t bytes = 0;
  for (const auto& x : arrays) {
    if (x.nbytes() == 0 || !x.is_available()) continue;
    auto* head = static_cast<const CudaBufferHead*>(x.buffer().ptr());
    // Small buffers may share pages with MLX's pool of scalars, which the host reads.
    if (head == nullptr || head->data == nullptr || head->device != -1 || head->size < (64u << 10)) continue;
    if (!seen.insert(head).second) continue;
    // Best effort: where the device cannot prefetch (no concurrent managed access: MLX then
    // allocates pinned host memory instead), the weights stay where they are.
    if (a.mem_prefetch(reinterpret_cast<unsigned long long>(head->data), head->size, CuMemLocation{}, 0, nullptr) != 0) {
      break;
    }
    bytes += head->size;
  }
  if (bytes != 0) {
    if (CuResult r = a.ctx_synchronize(); r != 0) throw std::runtime_error("cuCtxSynchronize: " + cu_error(r));
  }
  return bytes;
}

void* Kernel::function() const {
  std::call_once(once_, [this] {
    const Api& a = api();
    try {
      make_context_current();
      void* module = nullptr;
      if (CuResult r = a.module_load_data(&module, binary_.c_str()); r != 0) {
        throw std::runtime_error("cuModuleLoadData: " + cu_error(r));
      }
      if (CuResult r = a.module_get_function(&function_, module, name_.c_str()); r != 0) {
        throw std::runtime_error("cuModuleGetFunction: " + cu_error(r));
      }
    } catch (const std::exception& e) {
      error_ = e.what();
      function_ = nullptr;
    }
  });
  if (function_ == nullptr) throw std::runtime_error(name_ + " could not be loaded: " + error_);
  return function_;
}

const std::string& why_not() { return api().why_not; }

std::vector<mx::array> launch(const std::shared_ptr<const Kernel>& kernel, const std::vector<mx::array>& inputs,
                              const std::vector<mx::Shape>& output_shapes, const std::vector<mx::Dtype>& output_dtypes,
                              std::tuple<int, int, int> grid, std::tuple<int, int, int> block, mx::Stream stream,
                              const std::vector<int>& in_place) {
  if (!available()) throw std::runtime_error(kernel->name() + ": " + why_not());
  auto blocks = [](int g, int t) { return static_cast<unsigned int>((g + t - 1) / t); };
  const auto [gx, gy, gz] = grid;
  const auto [tx, ty, tz] = block;
  if (tx <= 0 || ty <= 0 || tz <= 0 || gx <= 0 || gy <= 0 || gz <= 0) {
    throw std::invalid_argument(kernel->name() + ": grid and block sizes must be positive");
  }
  Dim3 g{blocks(gx, tx), blocks(gy, ty), blocks(gz, tz)};
  Dim3 b{static_cast<unsigned int>(tx), static_cast<unsigned int>(ty), static_cast<unsigned int>(tz)};
  return mx::array::make_arrays(output_shapes, output_dtypes, std::make_shared<Launch>(stream, kernel, g, b, in_place),
                                 inputs);
}

}  // namespace mlex::cuda_launch
