// The CUDA target's lowering, assembled in this one place: the graph passes, fusion with the CUDA
// target's options, and cuda-orient-transposes (a registered stage: transposes that feed a device matmul
// keep their operand's row order). compile_cuda (runtime/cuda_backend.h) generates, compiles and runs
// what comes out; `tessel compile --target cuda --emit kernel|cuda` and the NVRTC tests print or compile
// it without a device. Every stage runs through one StageRunner (timed, verified, dumped, printed).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessel/kernel/kernel.h"
#include "tessel/passes/pass.h"

namespace tessel::lower {

struct CudaOptions {
  std::string pipeline = "core";  // the graph passes (by name; "" none)
  FuseOptions fuse;               // the model's own choices, under cuda_fuse_options
  PassOptions stages;             // verify, dump_dir (NN-<stage>), print_after
};

// The fusion options of the CUDA target: `base` with conv1d and conv_input_views on, and host steps
// on row-major buffers.
FuseOptions cuda_fuse_options(FuseOptions base = {});

// Lowers `g` for the CUDA target. Example inputs bind unknown input dims (every input stays an input);
// with size symbols, the code is for the examples' binding (docs/dynamic-shapes.md).
KernelModule lower_cuda(std::unique_ptr<Graph> g, const std::vector<Tensor>& example_inputs, const CudaOptions& opts);

}  // namespace tessel::lower
