// Helpers shared by the CUDA target's tests: NVRTC options for sm_90 and a deterministic input ramp.
#pragma once

#include <gtest/gtest.h>
#include <string>
#include "tessel/support/tensor.h"
#include "tessel/targets/cuda/toolchain.h"

namespace tessel::cuda_test {

// sm_90 (the H200's) unless a device says otherwise; the cubin cache in the test's temp dir, or none.
inline cuda::NvrtcOptions nvrtc_options(bool use_cache = true) {
  cuda::NvrtcOptions o;
  o.arch = cuda::device_arch("sm_90");
  o.cache_dir = testing::TempDir() + "/tessel_cuda_cache";
  o.use_cache = use_cache;
  return o;
}

// Values in [-50, 50] / divisor, scrambled by a stride of 37 modulo 101: no two neighbours equal, so a
// wrong index shows; `seed` shifts the pattern between operands.
inline Tensor ramp(const Shape& s, int seed = 0, float divisor = 17.0f) {
  Tensor t(DType::f32, s);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(((i + seed) * 37 % 101) - 50) / divisor;
  return t;
}

}  // namespace tessel::cuda_test
