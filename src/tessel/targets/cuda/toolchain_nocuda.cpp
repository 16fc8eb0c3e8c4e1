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

}  // namespace tessel::cuda
