// Opening NVRTC and cuBLASLt on first use (see libs.h).
#include "tessel/targets/cuda/libs.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <string>
#include <vector>

#include "tessel/support/error.h"

namespace tessel::cuda {
namespace {

// The library of this major version (the headers' own), by the loader's search (LD_LIBRARY_PATH,
// ldconfig), then in the toolkit's folder this build was configured with.
void* open_library(const std::string& stem, int major, std::string* tried) {
  std::vector<std::string> names = {fmt::format("{}.so.{}", stem, major)};
#ifdef TESSEL_CUDA_LIBRARY_DIR
  names.push_back(fmt::format("{}/{}.so.{}", TESSEL_CUDA_LIBRARY_DIR, stem, major));
#endif
  for (const std::string& n : names) {
    if (void* h = ::dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    const char* why = ::dlerror();
    *tried += fmt::format("{}{} ({})", tried->empty() ? "" : "; ", n, why ? why : "not found");
  }
  return nullptr;
}

template <typename Api, typename Fill>
Api load(const std::string& stem, int major, Fill fill) {
  std::string tried;
  void* h = open_library(stem, major, &tried);
  if (!h) throw Error(Location{.pass = "cuda"}, fmt::format("cannot open {}: tried {}", stem, tried));
  Api api;
  fill(api, [&](const char* name) {
    void* f = ::dlsym(h, name);
    if (!f) throw Error(Location{.pass = "cuda"}, fmt::format("{}.so.{} has no {}", stem, major, name));
    return f;
  });
  return api;
}

}  // namespace

const NvrtcApi& nvrtc() {
  static const NvrtcApi api = load<NvrtcApi>("libnvrtc", CUDART_VERSION / 1000, [](NvrtcApi& a, auto sym) {
#define TESSEL_FILL(name) a.name = reinterpret_cast<decltype(a.name)>(sym(#name));
    TESSEL_NVRTC_FUNCTIONS(TESSEL_FILL)
#undef TESSEL_FILL
  });
  return api;
}

const CublasLtApi& cublaslt() {
  static const CublasLtApi api = load<CublasLtApi>("libcublasLt", CUBLAS_VER_MAJOR, [](CublasLtApi& a, auto sym) {
#define TESSEL_FILL(name) a.name = reinterpret_cast<decltype(a.name)>(sym(#name));
    TESSEL_CUBLASLT_FUNCTIONS(TESSEL_FILL)
#undef TESSEL_FILL
  });
  return api;
}

}  // namespace tessel::cuda
