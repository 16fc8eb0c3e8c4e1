// The CUDA target's toolchain: the device (what cudaGetDeviceProperties says, or why there is none) and
// NVRTC, which compiles generated CUDA C++ to a cubin for the device's compute capability, cached on disk
// by content hash like the CPU target's shared objects. No header of the CUDA toolkit is included here:
// a build without the toolkit (-DTESSEL_CUDA=OFF) compiles toolchain_nocuda.cpp instead, whose functions
// say so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessel::cuda {

// Whether this build has the CUDA target (the toolkit was found at configure time).
bool built_with_cuda();

struct DeviceInfo {
  bool usable = false;
  std::string why;                 // one line, when not usable: no toolkit, no driver, no GPU
  std::string name;                // "NVIDIA H200"
  int cc_major = 0, cc_minor = 0;  // compute capability
  int sms = 0;                     // multiprocessors
  uint64_t memory_bytes = 0;
  int driver_version = 0, runtime_version = 0;
};

// Device 0, asked once per process.
const DeviceInfo& device_info();

// "sm_90" for compute capability 9.0: the device's (or "sm_90a" when TESSEL_CUDA_ARCH asks for it; any other
// value of it is an error), or `fallback` when there is no usable device
// (generated source can be compiled, and checked, without a GPU).
std::string device_arch(const std::string& fallback = "sm_90");

struct NvrtcOptions {
  std::string arch = "sm_90";   // --gpu-architecture
  std::string cache_dir;        // empty: the CPU target's cache directory ($TESSEL_CACHE_DIR, ...), folder cuda/
  bool use_cache = true;
};

struct NvrtcResult {
  std::string cubin;            // the compiled module's bytes
  bool cache_hit = false;
  double seconds = 0;           // NVRTC wall time (0 on a hit)
  std::string key;              // hex XXH3-128 of source + arch + NVRTC version + options
  std::string arch;
  std::string cache_path;       // where the cubin is stored (empty when the cache was not used)
};

// NVRTC's version as major * 1000 + minor * 10 (0 without the toolkit).
int nvrtc_version();

// Compiles `source` for `options.arch` unless the cache holds a cubin of that key whose checksum file
// matches its bytes (a damaged entry is compiled again). Throws tessel::Error with NVRTC's log (first
// lines) naming `name_hint` when the source does not compile, or when this build has no CUDA.
NvrtcResult compile_cuda_source(const std::string& source, const std::string& name_hint, const NvrtcOptions& options = {});

// Device memory and streams for code that holds no CUDA header (the pointer API's tests and tools):
// addresses and streams as integers; every failure (and a build without CUDA) is a tessel::Error.
uint64_t device_alloc(size_t bytes);
void device_free(uint64_t p);
void copy_to_device(uint64_t dst, const void* src, size_t bytes);   // synchronous
void copy_to_host(void* dst, uint64_t src, size_t bytes);           // synchronous
uint64_t stream_create();
void stream_destroy(uint64_t s);
void stream_synchronize(uint64_t s);

}  // namespace tessel::cuda
