// The CUDA toolchain in a build without the CUDA toolkit (-DTESSEL_CUDA=OFF): every entry point says so.
#include "tessel/support/error.h"
#include "tessel/targets/cuda/toolchain.h"

namespace tessel::cuda {

bool built_with_cuda() { return false; }

const DeviceInfo& device_info() {
  static const DeviceInfo info{.usable = false, .why = "this tessel was built without the CUDA target (configure with -DTESSEL_CUDA=ON and a CUDA toolkit)"};
  return info;
}

std::string device_arch(const std::string& fallback) { return fallback; }

int nvrtc_version() { return 0; }

NvrtcResult compile_cuda_source(const std::string&, const std::string& name_hint, const NvrtcOptions&) {
  throw Error(Location{.file = name_hint, .pass = "nvrtc"}, device_info().why);
}

namespace {
[[noreturn]] void no_cuda() { throw Error(Location{.pass = "cuda"}, device_info().why); }
}  // namespace

uint64_t device_alloc(size_t) { no_cuda(); }
void device_free(uint64_t) {}
void copy_to_device(uint64_t, const void*, size_t) { no_cuda(); }
void copy_to_host(void*, uint64_t, size_t) { no_cuda(); }
uint64_t stream_create() { no_cuda(); }
void stream_destroy(uint64_t) {}
void stream_synchronize(uint64_t) { no_cuda(); }

}  // namespace tessel::cuda
