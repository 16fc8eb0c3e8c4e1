// The CLI's CUDA target (docs/runtime/cuda-backend.md): `tessel run|bench|compile MODEL --target cuda`.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tessel/targets/cuda/precision.h"

namespace tessel {

// `tessel run MODEL --target cuda`: runs test_data_set_0 (or `inputs_dir`) `repeat` times on the GPU,
// prints the outputs and, with `check`, compares them with the data set's outputs (bound `max_rel`; 0:
// the precision's, precision_tolerance). Returns the exit code.
int cmd_run_cuda(const std::string& model, const std::string& inputs_dir, bool check, double max_rel, int repeat,
                 cuda::Precision precision = cuda::Precision::f32);

// `tessel compile MODEL --target cuda --emit cuda|kernel`: the generated CUDA C++ (or the kernel level it
// comes from), without a device. Returns the text.
// `dynamic`: the inputs' dim_params stay size symbols (--dynamic).
std::string emit_cuda(const std::string& model, const std::string& emit, cuda::Precision precision = cuda::Precision::f32, bool dynamic = false);
// `tessel run MODEL --target cuda --dynamic --inputs a,b,c`: one symbolic compilation, each data set run on it.
int cmd_run_cuda_dynamic(const std::string& model, const std::string& inputs_dirs, bool check, double max_rel, int repeat,
                         cuda::Precision precision = cuda::Precision::f32);

struct CudaBenchOptions {
  int iters = 20;
  std::string json_path;
  std::string cache_dir;
  cuda::Precision precision = cuda::Precision::f32;  // the outputs are checked at precision_tolerance
};

// `tessel bench MODEL --target cuda`: compile time, first call, steady call (with and without the
// copies), per-kernel times from CUDA events against each kernel's roofline, and the outputs against
// the data set's (or the eager interpreter's). Prints a table; returns the JSON it writes.
nlohmann::json bench_cuda(const std::string& model, const CudaBenchOptions& o);

}  // namespace tessel
