// The CUDA backend's lowering to the kernel level, shared by compile_cuda and the device-less paths
// (`tessel compile --target cuda`, the NVRTC tests): see cuda_backend.h.
#include "tessel/ir/infer.h"
#include "tessel/passes/pass.h"
#include "tessel/runtime/cuda_backend.h"
#include "tessel/support/error.h"

namespace tessel {

FuseOptions cuda_fuse_options(FuseOptions base) {
  base.conv1d = base.conv_input_views = true;
  base.layout_steps = false;  // host steps read and write row-major buffers
  return base;
}

KernelModule lower_for_cuda(std::unique_ptr<Graph> g, const std::vector<Tensor>& ex, const CudaBackendOptions& opts) {
  // Unknown input dims take the example inputs' sizes (the graph backend's binding, without baking
  // values: every input stays an input).
  if (!ex.empty()) {
    bind_input_shapes(*g, ex);
    infer_graph(*g);
  }
  if (!opts.pipeline.empty()) {
    try {
      run_pipeline(*g, parse_pipeline(opts.pipeline), PassOptions{});
    } catch (const Error& e) {
      throw e.with_context(Location{.pass = "cuda: the core pipeline (the CUDA target needs the model decomposed)"});
    }
  }
  KernelModule m = fuse(std::move(g), cuda_fuse_options(opts.fuse));
  verify_kernel_module(m);
  return m;
}

}  // namespace tessel
