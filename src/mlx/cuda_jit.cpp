#include "cuda_jit.h"
#include "cuda_launch.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "mlx/backend/cuda/cuda.h"
#include "mlx/backend/gpu/device_info.h"
#include "mlx/fast.h"

#if defined(__linux__)
#include <dlfcn.h>
#include <unistd.h>
#endif

namespace mx = mlx::core;
namespace fs = std::filesystem;

namespace mlex::cuda_jit {
namespace {

// Bumped whenever the entry format or the generated prelude changes meaning.
constexpr const char* kFormat = "mlex-cubin 1";

// Whether our kernels come from the disk cache and are launched directly (cuda_launch), or are
// compiled by MLX in each process (`fast::cuda_kernel`). On by default; MLEX_CUDA_KERNEL_CACHE=0
// turns it off. (Through `fast::precompiled_cuda_kernel`, which copies a kernel's binary into
// every launch, the cache cost small models 17–21 % of their decode on the H200: BENCHMARKS.md;
// that path is used only where direct launches are not available.)
bool disk_cache_on() {
  static const bool on = [] {
    const char* v = std::getenv("MLEX_CUDA_KERNEL_CACHE");
    return v == nullptr || *v == '\0' || std::string(v) != "0";
  }();
  return on;
}

bool trace() {
  static const bool on = [] {
    const char* v = std::getenv("MLEX_TRACE_KERNELS");
    return v != nullptr && *v != '\0' && std::string(v) != "0";
  }();
  return on;
}

uint64_t fnv1a(const std::string& s, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

// ---- NVRTC, through the library libmlx already loaded ----------------------------------------

using Result = int;  // nvrtcResult; 0 is NVRTC_SUCCESS
using Program = void*;

struct Nvrtc {
  Result (*version)(int*, int*) = nullptr;
  Result (*create)(Program*, const char*, const char*, int, const char* const*, const char* const*) = nullptr;
  Result (*compile)(Program, int, const char* const*) = nullptr;
  Result (*cubin_size)(Program, size_t*) = nullptr;
  Result (*cubin)(Program, char*) = nullptr;
  Result (*ptx_size)(Program, size_t*) = nullptr;
  Result (*ptx)(Program, char*) = nullptr;
  Result (*log_size)(Program, size_t*) = nullptr;
  Result (*log)(Program, char*) = nullptr;
  Result (*destroy)(Program*) = nullptr;
  const char* (*error)(Result) = nullptr;
  int major = 0, minor = 0;
  std::string why_not;  // set when NVRTC could not be loaded
};

const Nvrtc& nvrtc() {
  static const Nvrtc n = [] {
    Nvrtc n;
#if defined(__linux__)
    void* lib = nullptr;
    const char* names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    for (int pass = 0; pass < 2 && lib == nullptr; ++pass) {
      for (const char* name : names) {
        lib = dlopen(name, RTLD_NOW | RTLD_LOCAL | (pass == 0 ? RTLD_NOLOAD : 0));
        if (lib != nullptr) break;
      }
    }
    if (lib == nullptr) {
      n.why_not = "NVRTC (libnvrtc.so) is not loaded and could not be opened";
      return n;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (fn == nullptr && n.why_not.empty()) n.why_not = std::string("NVRTC has no ") + name;
    };
    sym(n.version, "nvrtcVersion");
    sym(n.create, "nvrtcCreateProgram");
    sym(n.compile, "nvrtcCompileProgram");
    sym(n.cubin_size, "nvrtcGetCUBINSize");
    sym(n.cubin, "nvrtcGetCUBIN");
    sym(n.ptx_size, "nvrtcGetPTXSize");
    sym(n.ptx, "nvrtcGetPTX");
    sym(n.log_size, "nvrtcGetProgramLogSize");
    sym(n.log, "nvrtcGetProgramLog");
    sym(n.destroy, "nvrtcDestroyProgram");
    sym(n.error, "nvrtcGetErrorString");
    if (n.why_not.empty() && n.version(&n.major, &n.minor) != 0) n.why_not = "nvrtcVersion failed";
#else
    n.why_not = "CUDA kernels are built on Linux only";
#endif
    return n;
  }();
  return n;
}

// The GPU's architecture, as NVRTC's option spells it without the sm_/compute_ prefix ("90").
const std::string& arch() {
  static const std::string a = [] {
    const auto& info = mx::gpu::device_info(0);
    auto num = [&](const char* key) -> size_t {
      auto it = info.find(key);
      if (it == info.end() || !std::holds_alternative<size_t>(it->second)) {
        throw std::runtime_error(std::string("MLX reports no ") + key + " for GPU 0");
      }
      return std::get<size_t>(it->second);
    };
    return std::to_string(num("compute_capability_major")) + std::to_string(num("compute_capability_minor"));
  }();
  return a;
}

// Where NVRTC finds cuda_fp16.h / cuda_bf16.h: the toolkit MLX's own JIT uses (CUDA_HOME,
// CUDA_PATH, /usr/local/cuda), else NVIDIA's pip layout next to libnvrtc.
const std::string& cuda_include() {
  static const std::string dir = [] {
    std::vector<fs::path> candidates;
    for (const char* env : {"CUDA_HOME", "CUDA_PATH"}) {
      if (const char* v = std::getenv(env); v != nullptr && *v != '\0') candidates.emplace_back(fs::path(v) / "include");
    }
    candidates.emplace_back("/usr/local/cuda/include");
#if defined(__linux__)
    Dl_info info{};
    if (nvrtc().version != nullptr && dladdr(reinterpret_cast<void*>(nvrtc().version), &info) != 0 && info.dli_fname) {
      const fs::path lib = fs::path(info.dli_fname).parent_path();
      candidates.emplace_back(lib.parent_path() / "include");
    }
#endif
    for (const auto& c : candidates) {
      std::error_code ec;
      if (fs::exists(c / "cuda_fp16.h", ec)) return c.string();
    }
    return std::string();
  }();
  return dir;
}

// ---- the disk cache ---------------------------------------------------------------------------

const fs::path& cache_dir() {
  static const fs::path dir = [] {
    std::vector<fs::path> candidates;
    if (const char* v = std::getenv("MLEX_KERNEL_CACHE_DIR"); v != nullptr && *v != '\0') {
      candidates.emplace_back(v);
    } else {
      if (const char* v = std::getenv("XDG_CACHE_HOME"); v != nullptr && *v != '\0') {
        candidates.emplace_back(fs::path(v) / "mlex" / "cuda-kernels");
      }
      if (const char* v = std::getenv("HOME"); v != nullptr && *v != '\0') {
        candidates.emplace_back(fs::path(v) / ".cache" / "mlex" / "cuda-kernels");
      }
      std::error_code ec;
      auto tmp = fs::temp_directory_path(ec);
      if (!ec) candidates.emplace_back(tmp / "mlex-cuda-kernels");
    }
    for (const auto& c : candidates) {
      std::error_code ec;
      fs::create_directories(c, ec);
      if (fs::is_directory(c, ec)) return c;
    }
    return fs::path();  // no cache: compile in every process
  }();
  return dir;
}

// An entry: one header line "<format> <key> <bytes> <checksum>\n", then the binary.
std::optional<std::string> read_entry(const fs::path& path, const std::string& key) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  std::string head;
  if (!std::getline(f, head)) return std::nullopt;
  std::istringstream h(head);
  std::string fmt1, fmt2, k, sum;
  unsigned long long bytes = 0;
  if (!(h >> fmt1 >> fmt2 >> k >> bytes >> sum) || fmt1 + " " + fmt2 != kFormat || k != key || bytes == 0 ||
      bytes > (64ull << 20)) {
    return std::nullopt;
  }
  std::string bin(bytes, '\0');
  if (!f.read(bin.data(), static_cast<std::streamsize>(bytes)) || f.peek() != std::char_traits<char>::eof()) {
    return std::nullopt;
  }
  if (hex(fnv1a(bin)) != sum) return std::nullopt;
  return bin;
}

void write_entry(const fs::path& path, const std::string& key, const std::string& bin) {
  static std::atomic<unsigned> counter{0};
  std::random_device rd;
  const fs::path tmp = path.string() + ".tmp" + std::to_string(rd()) + "-" + std::to_string(counter++);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return;
    f << kFormat << ' ' << key << ' ' << bin.size() << ' ' << hex(fnv1a(bin)) << '\n';
    f.write(bin.data(), static_cast<std::streamsize>(bin.size()));
    if (!f) {
      f.close();
      std::error_code ec;
      fs::remove(tmp, ec);
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);  // atomic: a reader sees the old entry, the new one, or none
  if (ec) fs::remove(tmp, ec);
}

// ---- compiling --------------------------------------------------------------------------------

std::string compile(const std::string& name, const std::string& source) {
  const Nvrtc& n = nvrtc();
  if (!n.why_not.empty()) throw std::runtime_error(n.why_not);
  auto check = [&](Result r, const char* what) {
    if (r != 0) throw std::runtime_error(std::string(what) + " failed: " + n.error(r));
  };
  auto attempt = [&](bool sass) -> std::pair<Result, std::string> {
    Program prog = nullptr;
    check(n.create(&prog, source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr), "nvrtcCreateProgram");
    std::unique_ptr<Program, void (*)(Program*)> guard(&prog, [](Program* p) { nvrtc().destroy(p); });
    const std::string gpu = std::string("--gpu-architecture=") + (sass ? "sm_" : "compute_") + arch();
    const std::string inc = "--include-path=" + cuda_include();
    std::vector<const char*> opts{gpu.c_str()};
    if (!cuda_include().empty()) opts.push_back(inc.c_str());
    const Result r = n.compile(prog, static_cast<int>(opts.size()), opts.data());
    if (r != 0) {
      size_t size = 0;
      n.log_size(prog, &size);
      std::string log(size, '\0');
      if (size > 0) n.log(prog, log.data());
      return {r, log};
    }
    size_t size = 0;
    check(sass ? n.cubin_size(prog, &size) : n.ptx_size(prog, &size), "nvrtcGet{CUBIN,PTX}Size");
    std::string bin(size, '\0');
    check(sass ? n.cubin(prog, bin.data()) : n.ptx(prog, bin.data()), "nvrtcGet{CUBIN,PTX}");
    return {0, bin};
  };
  auto [r, out] = attempt(true);
  // An NVRTC older than the GPU cannot emit its machine code (NVRTC_ERROR_INVALID_OPTION):
  // PTX, which the driver compiles at load.
  if (r == 5) std::tie(r, out) = attempt(false);
  if (r != 0) {
    throw std::runtime_error("NVRTC could not compile " + name + " (" + n.error(r) + "): " + out);
  }
  return out;
}

std::string cuda_type(mx::Dtype d) {
  switch (d) {
    case mx::bfloat16: return "__nv_bfloat16";
    case mx::float16: return "__half";
    case mx::float32: return "float";
    case mx::int32: return "int";
    case mx::uint32: return "unsigned int";
    case mx::int64: return "long long";
    case mx::uint64: return "unsigned long long";
    case mx::uint8: return "unsigned char";
    case mx::int8: return "signed char";
    case mx::bool_: return "bool";
    default: throw std::runtime_error("no CUDA type for this dtype in mlex's kernels");
  }
}

// The prelude of every kernel: the half types, and the fixed-width names our kernels use.
constexpr const char* kPrelude = R"(#include <cuda_fp16.h>
#include <cuda_bf16.h>
typedef unsigned int uint32_t;
typedef int int32_t;
)";

struct Entry {
  std::string name;
  std::string binary;
  std::string error;  // non-empty: this instantiation cannot be built here
  std::shared_ptr<const cuda_launch::Kernel> kernel;  // loaded on its first direct launch
};

std::shared_ptr<const Entry> build(const KernelSpec& spec, const std::vector<mx::array>& inputs,
                                   const std::vector<mx::Dtype>& output_dtypes,
                                   const std::vector<std::pair<std::string, Constant>>& constants) {
  // The source after the function's name, so the name can carry the hash of the rest.
  std::string sig = "(\n";
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    sig += "    const " + cuda_type(inputs[i].dtype()) + "* __restrict__ " + spec.inputs[i] + ",\n";
  }
  for (size_t i = 0; i < spec.outputs.size(); ++i) {
    sig += "    " + cuda_type(output_dtypes[i]) + "* " + spec.outputs[i] + (i + 1 < spec.outputs.size() ? ",\n" : ") {\n");
  }
  for (const auto& [cname, v] : constants) {
    if (auto* i = std::get_if<int>(&v)) sig += "  constexpr int " + cname + " = " + std::to_string(*i) + ";\n";
    else if (auto* b = std::get_if<bool>(&v)) sig += "  constexpr bool " + cname + " = " + (*b ? "true" : "false") + ";\n";
    else sig += "  using " + cname + " = " + cuda_type(std::get<mx::Dtype>(v)) + ";\n";
  }
  const std::string head = std::string(kPrelude) + spec.header + "\nextern \"C\" __global__ void ";
  const std::string tail = sig + spec.body + "\n}\n";
  const Nvrtc& n = nvrtc();
  const std::string key = hex(fnv1a(std::string(kFormat) + "|" + arch() + "|" + std::to_string(n.major) + "." +
                                    std::to_string(n.minor) + "|" + cuda_include() + "|" + head + tail));
  auto entry = std::make_shared<Entry>();
  entry->name = std::string("mlex_") + spec.family + "_" + key;
  const std::string source = head + entry->name + tail;
  const fs::path path = cache_dir().empty() ? fs::path() : cache_dir() / (entry->name + ".cubin");
  const auto t0 = std::chrono::steady_clock::now();
  if (!path.empty()) {
    if (auto bin = read_entry(path, key)) {
      entry->binary = std::move(*bin);
      entry->kernel = std::make_shared<cuda_launch::Kernel>(entry->name, entry->binary);
      if (trace()) std::fprintf(stderr, "mlex: kernel %s read from %s\n", entry->name.c_str(), path.c_str());
      return entry;
    }
  }
  entry->binary = compile(entry->name, source);
  entry->kernel = std::make_shared<cuda_launch::Kernel>(entry->name, entry->binary);
  if (!path.empty()) write_entry(path, key, entry->binary);
  if (trace()) {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "mlex: kernel %s compiled in %.0f ms (%zu bytes)%s%s\n", entry->name.c_str(), ms,
                 entry->binary.size(), path.empty() ? "" : ", cached at ", path.c_str());
  }
  return entry;
}

// An instantiation's key: the spec, then the dtypes and constants as numbers. It is made on
// every launch (a decode step launches our kernels ~100 times), so it is built from integers,
// not formatted as a string.
struct InstanceKey {
  std::vector<uint64_t> words;
  bool operator==(const InstanceKey& o) const { return words == o.words; }
};

struct InstanceKeyHash {
  size_t operator()(const InstanceKey& k) const {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t w : k.words) h = (h ^ w) * 0x100000001b3ull;
    return static_cast<size_t>(h);
  }
};

// The instantiation for these dtypes and constants, built on first use.
std::shared_ptr<const Entry> entry_for(const KernelSpec& spec, const std::vector<mx::array>& inputs,
                                       const std::vector<mx::Dtype>& output_dtypes,
                                       const std::vector<std::pair<std::string, Constant>>& constants) {
  InstanceKey k;
  k.words.reserve(1 + inputs.size() + output_dtypes.size() + 2 * constants.size());
  k.words.push_back(reinterpret_cast<uintptr_t>(&spec));
  for (const auto& a : inputs) k.words.push_back(static_cast<uint64_t>(a.dtype().val()));
  for (const auto& d : output_dtypes) k.words.push_back(static_cast<uint64_t>(d.val()) | (1ull << 32));
  for (const auto& [cname, v] : constants) {
    k.words.push_back(fnv1a(cname) ^ v.index());
    if (auto* i = std::get_if<int>(&v)) k.words.push_back(static_cast<uint64_t>(static_cast<int64_t>(*i)));
    else if (auto* b = std::get_if<bool>(&v)) k.words.push_back(*b ? 1 : 0);
    else k.words.push_back(static_cast<uint64_t>(std::get<mx::Dtype>(v).val()));
  }
  static std::mutex mu;
  static std::unordered_map<InstanceKey, std::shared_ptr<const Entry>, InstanceKeyHash> built;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = built.find(k); it != built.end()) return it->second;
  std::shared_ptr<const Entry> e;
  try {
    e = build(spec, inputs, output_dtypes, constants);
  } catch (const std::exception& ex) {
    auto failed = std::make_shared<Entry>();
    failed->name = std::string("mlex_") + spec.family;
    failed->error = ex.what();
    e = failed;
  }
  built.emplace(k, e);
  return e;
}

}  // namespace

bool available() {
  static const bool ok = mx::cu::is_available() && nvrtc().why_not.empty();
  return ok;
}

std::vector<mx::array> run(const KernelSpec& spec, const std::vector<mx::array>& inputs,
                           const std::vector<mx::Shape>& output_shapes, const std::vector<mx::Dtype>& output_dtypes,
                           std::tuple<int, int, int> grid, std::tuple<int, int, int> block,
                           const std::vector<std::pair<std::string, Constant>>& constants, mx::StreamOrDevice s,
                           const std::vector<int>& in_place) {
  if (inputs.size() != spec.inputs.size() || output_shapes.size() != spec.outputs.size() ||
      output_dtypes.size() != spec.outputs.size()) {
    throw std::invalid_argument(std::string("mlex kernel ") + spec.family + ": wrong number of inputs or outputs");
  }
  if (!mx::cu::is_available()) throw std::runtime_error("CUDA is not available");
  if (!in_place.empty() && (!disk_cache_on() || !cuda_launch::available())) {
    throw std::runtime_error(std::string("mlex kernel ") + spec.family + " writes its inputs: it needs direct launches");
  }
  if (!disk_cache_on()) {
    // MLX compiles the kernel (NVRTC) in each process on first use, as before the disk cache.
    static std::mutex mu;
    static std::unordered_map<std::string, mx::fast::CustomKernelFunction> kernels;
    const mx::fast::CustomKernelFunction* fn;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = kernels.find(spec.family);
      if (it == kernels.end()) {
        it = kernels
                 .emplace(spec.family, mx::fast::cuda_kernel(std::string("mlex_") + spec.family, spec.inputs,
                                                             spec.outputs, spec.body, spec.header))
                 .first;
      }
      fn = &it->second;
    }
    std::vector<std::pair<std::string, mx::fast::TemplateArg>> targs(constants.begin(), constants.end());
    return (*fn)(inputs, output_shapes, output_dtypes, grid, block, targs, std::nullopt, false, s);
  }
  auto e = entry_for(spec, inputs, output_dtypes, constants);
  if (!e->error.empty()) throw std::runtime_error(e->name + ": " + e->error);
  if (cuda_launch::available()) {
    return cuda_launch::launch(e->kernel, inputs, output_shapes, output_dtypes, grid, block, mx::to_stream(s), in_place);
  }
  return mx::fast::precompiled_cuda_kernel(e->name, e->binary, inputs, output_shapes, output_dtypes, {}, grid, block,
                                           0, std::nullopt, /*ensure_row_contiguous=*/true, s);
}

std::optional<std::vector<mx::array>> try_run(const KernelSpec& spec, const std::vector<mx::array>& inputs,
                                              const std::vector<mx::Shape>& output_shapes,
                                              const std::vector<mx::Dtype>& output_dtypes,
                                              std::tuple<int, int, int> grid, std::tuple<int, int, int> block,
                                              const std::vector<std::pair<std::string, Constant>>& constants,
                                              mx::StreamOrDevice s, const std::vector<int>& in_place) {
  try {
    return run(spec, inputs, output_shapes, output_dtypes, grid, block, constants, s, in_place);
  } catch (const std::exception& ex) {
    static std::mutex mu;
    static std::unordered_map<std::string, bool> told;
    std::lock_guard<std::mutex> lock(mu);
    if (!told[spec.family]) {
      told[spec.family] = true;
      std::fprintf(stderr, "mlex: CUDA kernel %s unavailable, using MLX's ops instead: %s\n", spec.family, ex.what());
    }
    return std::nullopt;
  }
}

}  // namespace mlex::cuda_jit
