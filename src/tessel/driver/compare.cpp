// Output comparison with the error figures the CLI and the conformance report print.
#include "tessel/driver/compare.h"

#include <fmt/format.h>

#include <cmath>

namespace tessel {

Comparison compare_tensors(const Tensor& out, const Tensor& ref, const Tolerance& tol) {
  Comparison c;
  if (out.dtype() != ref.dtype()) {
    c.mismatch = fmt::format("dtype {} but the reference is {}", dtype_name(out.dtype()), dtype_name(ref.dtype()));
    return c;
  }
  if (out.shape() != ref.shape()) {
    c.mismatch = fmt::format("shape {} but the reference is {}", shape_str(out.shape()), shape_str(ref.shape()));
    return c;
  }
  const int64_t n = out.numel();
  if (!is_float(out.dtype())) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t a = out.get_i(i), b = ref.get_i(i);
      if (a != b) {
        c.max_abs = std::max(c.max_abs, std::fabs(static_cast<double>(a) - static_cast<double>(b)));
        if (c.mismatch.empty()) c.mismatch = fmt::format("element {} is {} but the reference is {}", i, a, b);
      }
    }
    c.match = c.mismatch.empty();
    return c;
  }
  double max_ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    double a = out.get_f(i), b = ref.get_f(i);
    if (std::isfinite(b)) max_ref = std::max(max_ref, std::fabs(b));
    if (std::isnan(a) || std::isnan(b)) {
      if (std::isnan(a) != std::isnan(b) && c.mismatch.empty())
        c.mismatch = fmt::format("element {} is {} but the reference is {}", i, a, b);
      continue;
    }
    if (std::isinf(a) || std::isinf(b)) {
      if (a != b && c.mismatch.empty()) c.mismatch = fmt::format("element {} is {} but the reference is {}", i, a, b);
      continue;
    }
    double d = std::fabs(a - b);
    c.max_abs = std::max(c.max_abs, d);
    if (tol.max_rel < 0 && d > tol.atol + tol.rtol * std::fabs(b) && c.mismatch.empty())
      c.mismatch = fmt::format("element {} is {} but the reference is {}", i, a, b);
  }
  c.rel = max_ref > 0 ? c.max_abs / max_ref : c.max_abs;
  if (tol.max_rel >= 0 && c.rel > tol.max_rel && c.mismatch.empty())
    c.mismatch = fmt::format("relative error {:.3g} exceeds {:.3g}", c.rel, tol.max_rel);
  c.match = c.mismatch.empty();
  return c;
}

}  // namespace tessel
