// compile_cuda in a build without the CUDA toolkit (-DTESSEL_CUDA=OFF): a one-line error.
#include "tessel/runtime/cuda_backend.h"
#include "tessel/support/error.h"
#include "tessel/targets/cuda/toolchain.h"

namespace tessel {

std::unique_ptr<CudaExecutable> compile_cuda(std::unique_ptr<Graph>, const std::vector<Tensor>&, const CudaBackendOptions&) {
  throw Error(Location{.pass = "cuda"}, cuda::device_info().why);
}

}  // namespace tessel
