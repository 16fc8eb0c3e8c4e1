// The CUDA toolchain with the toolkit (see toolchain.h): device queries through the runtime API, NVRTC
// compiles to a cubin, and a cache of cubins under <cache>/cuda/<key>.cubin with <key>.sum beside it.
#include <cuda_runtime.h>
#include <nvrtc.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "tessel/support/checksum.h"
#include "tessel/support/error.h"
#include "tessel/targets/cuda/libs.h"
#include "tessel/support/escape.h"
#include "tessel/support/limits.h"
#include "tessel/targets/cpu/toolchain.h"
#include "tessel/targets/cuda/toolchain.h"

namespace tessel::cuda {
namespace {

namespace fs = std::filesystem;

// Cubins of whole models are a few MB; the bound keeps a hostile cache file from being read whole.
constexpr uint64_t kMaxCubinBytes = uint64_t{1} << 30;

std::string temp_suffix() {
  static std::atomic<unsigned> counter{0};
  return ".tessel-tmp." + std::to_string(getpid()) + "." + std::to_string(counter++);
}

void write_atomically(const fs::path& path, const std::string& bytes) {
  const std::string tmp = path.string() + temp_suffix();
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) {
      std::remove(tmp.c_str());
      fail("cannot write '{}'", display_text(tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail("cannot rename into '{}'", display_text(path.string()));
  }
}

// The first lines of an NVRTC log: enough to see the error, bounded for the one-line message.
std::string log_head(const std::string& log) {
  std::string s;
  int lines = 0;
  for (char c : log) {
    if (c == '\n' && ++lines == 6) break;
    s += c;
  }
  return display_text(s);
}

}  // namespace

bool built_with_cuda() { return true; }

const DeviceInfo& device_info() {
  static const DeviceInfo info = [] {
    DeviceInfo d;
    cudaRuntimeGetVersion(&d.runtime_version);
    cudaDriverGetVersion(&d.driver_version);
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
      d.why = e != cudaSuccess ? fmt::format("no usable CUDA device: {} ({})", cudaGetErrorString(e), cudaGetErrorName(e))
                               : "no CUDA device on this machine";
      cudaGetLastError();
      return d;
    }
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
      d.why = "cudaGetDeviceProperties failed for device 0";
      return d;
    }
    d.usable = true;
    d.name = p.name;
    d.cc_major = p.major;
    d.cc_minor = p.minor;
    d.sms = p.multiProcessorCount;
    d.memory_bytes = p.totalGlobalMem;
    return d;
  }();
  return info;
}

std::string device_arch(const std::string& fallback) {
  const DeviceInfo& d = device_info();
  if (!d.usable) return fallback;
  const std::string arch = fmt::format("sm_{}{}", d.cc_major, d.cc_minor);
  // TESSEL_CUDA_ARCH picks the device's architecture-specific target instead (sm_90a on Hopper: wgmma and
  // setmaxnreg, which no generated kernel uses yet; docs/decisions.md, "sm_90, not sm_90a").
  if (const char* e = std::getenv("TESSEL_CUDA_ARCH"); e && *e) {
    const std::string want = e;
    if (want == arch || (d.cc_major >= 9 && want == arch + "a")) return want;
    throw Error(Location{.pass = "nvrtc"},
                fmt::format("TESSEL_CUDA_ARCH='{}' does not fit the device ({}, {}): use {} or {}a", display_text(want),
                            display_text(d.name), arch, arch, arch));
  }
  return arch;
}

int nvrtc_version() {
  int major = 0, minor = 0;
  if (nvrtc().nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return 0;
  return major * 1000 + minor * 10;
}

NvrtcResult compile_cuda_source(const std::string& source, const std::string& name_hint, const NvrtcOptions& o) {
  NvrtcResult r;
  r.arch = o.arch;
  for (char c : o.arch)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_'))
      throw Error(Location{.file = name_hint, .pass = "nvrtc"}, fmt::format("architecture '{}' is not of the form sm_90", display_text(o.arch)));
  const std::vector<std::string> flags = {"--gpu-architecture=" + o.arch, "-std=c++17", "--device-as-default-execution-space"};
  std::string keyed = source;
  keyed += fmt::format("\n// nvrtc {}", nvrtc_version());
  for (const std::string& f : flags) keyed += " " + f;
  r.key = checksum_bytes(keyed.data(), keyed.size()).xxh3;

  fs::path dir;
  if (o.use_cache) {
    cpu::ToolchainOptions to;
    to.cache_dir = o.cache_dir;
    dir = fs::path(cpu::cache_directory(to)) / "cuda";
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) fail("cannot create the CUDA kernel cache '{}': {}", display_text(dir.string()), ec.message());
    const fs::path cubin = dir / (r.key + ".cubin"), sum = dir / (r.key + ".sum");
    r.cache_path = cubin.string();
    if (fs::exists(cubin) && fs::exists(sum)) {
      try {
        std::string bytes = read_regular_file(cubin.string(), "cached cubin", kMaxCubinBytes);
        const std::string want = read_regular_file(sum.string(), "cubin checksum", 256);
        if (checksum_bytes(bytes.data(), bytes.size()).str() == want) {
          r.cubin = std::move(bytes);
          r.cache_hit = true;
          return r;
        }
        fmt::print(stderr, "tessel: cached cubin '{}' does not match its checksum; compiling again\n", display_text(cubin.string()));
      } catch (const Error& e) {
        fmt::print(stderr, "tessel: cached cubin unreadable ({}); compiling again\n", e.what());
      }
    }
  }

  const auto t0 = std::chrono::steady_clock::now();
  nvrtcProgram prog = nullptr;
  if (nvrtc().nvrtcCreateProgram(&prog, source.c_str(), "tessel_kernels.cu", 0, nullptr, nullptr) != NVRTC_SUCCESS)
    throw Error(Location{.file = name_hint, .pass = "nvrtc"}, "nvrtcCreateProgram failed");
  std::vector<const char*> argv;
  for (const std::string& f : flags) argv.push_back(f.c_str());
  const nvrtcResult cr = nvrtc().nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  size_t log_size = 0;
  nvrtc().nvrtcGetProgramLogSize(prog, &log_size);
  std::string log(log_size, '\0');
  if (log_size) nvrtc().nvrtcGetProgramLog(prog, log.data());
  if (cr != NVRTC_SUCCESS) {
    nvrtc().nvrtcDestroyProgram(&prog);
    throw Error(Location{.file = name_hint, .pass = "nvrtc"},
                fmt::format("NVRTC could not compile the generated CUDA source for {}: {}", o.arch, log_head(log)));
  }
  size_t n = 0;
  nvrtc().nvrtcGetCUBINSize(prog, &n);
  r.cubin.resize(n);
  if (n) nvrtc().nvrtcGetCUBIN(prog, r.cubin.data());
  nvrtc().nvrtcDestroyProgram(&prog);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (n == 0) throw Error(Location{.file = name_hint, .pass = "nvrtc"}, "NVRTC produced an empty cubin");
  if (o.use_cache) {
    // checksum last: a reader that finds it finds the whole cubin
    write_atomically(dir / (r.key + ".cubin"), r.cubin);
    write_atomically(dir / (r.key + ".sum"), checksum_bytes(r.cubin.data(), r.cubin.size()).str());
  }
  return r;
}

namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(Location{.pass = "cuda"}, std::string(what) + ": " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")");
  }
}
}  // namespace

uint64_t device_alloc(size_t bytes) {
  void* p = nullptr;
  if (bytes) check(cudaMalloc(&p, bytes), "cudaMalloc");
  return reinterpret_cast<uintptr_t>(p);
}
void device_free(uint64_t p) {
  if (p) cudaFree(reinterpret_cast<void*>(static_cast<uintptr_t>(p)));
}
void copy_to_device(uint64_t dst, const void* src, size_t bytes) {
  if (bytes) check(cudaMemcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(dst)), src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}
void copy_to_host(void* dst, uint64_t src, size_t bytes) {
  if (bytes) check(cudaMemcpy(dst, reinterpret_cast<const void*>(static_cast<uintptr_t>(src)), bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
}
uint64_t stream_create() {
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return reinterpret_cast<uintptr_t>(s);
}
void stream_destroy(uint64_t s) {
  if (s) cudaStreamDestroy(reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(s)));
}
void stream_synchronize(uint64_t s) { check(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(s))), "cudaStreamSynchronize"); }

}  // namespace tessel::cuda
