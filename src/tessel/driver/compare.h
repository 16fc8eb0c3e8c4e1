// Comparing computed outputs with reference outputs.
#pragma once

#include <string>

#include "tessel/support/tensor.h"

namespace tessel {

struct Comparison {
  bool match = false;
  double max_abs = 0;     // max |out - ref|
  double rel = 0;         // max |out - ref| / max |ref|
  std::string mismatch;   // why it does not match (empty when it does)
};

struct Tolerance {
  double rtol = 1e-3;     // per element: |out - ref| <= atol + rtol * |ref| (numpy allclose, as ONNX's runner)
  double atol = 1e-7;
  double max_rel = -1;    // if >= 0: instead require max_abs / max|ref| <= max_rel (model checks)
};

// Dtype and shape must agree; integers and bools exactly; floats within tolerance; NaN matches NaN.
Comparison compare_tensors(const Tensor& out, const Tensor& ref, const Tolerance& tol);

}  // namespace tessel
