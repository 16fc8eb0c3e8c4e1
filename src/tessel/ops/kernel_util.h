// Arithmetic shared by the reference kernels of several op families: wrapping integer math and the
// plain matrix product the matmul-like kernels are built on.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tessel {

// Integer arithmetic that wraps like two's complement: computed in uint64 so overflow is defined,
// then narrowed to the element type by Tensor::set_i.
inline int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
inline int64_t wrap_sub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
inline int64_t wrap_mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}

// C[m,n] = sum_k A[m,k] * B[k,n], row-major, i-k-j order (one output row accumulated at a time).
inline void gemm_f64(const double* a, const double* b, double* c, int64_t m, int64_t k, int64_t n) {
  for (int64_t i = 0; i < m; ++i) {
    double* cp = c + i * n;
    std::fill(cp, cp + n, 0.0);
    for (int64_t p = 0; p < k; ++p) {
      const double av = a[i * k + p];
      const double* bp = b + p * n;
      for (int64_t j = 0; j < n; ++j) cp[j] += av * bp[j];
    }
  }
}

// The same product on integers, wrapping.
inline void gemm_i64(const int64_t* a, const int64_t* b, int64_t* c, int64_t m, int64_t k, int64_t n) {
  for (int64_t i = 0; i < m; ++i) {
    int64_t* cp = c + i * n;
    std::fill(cp, cp + n, int64_t{0});
    for (int64_t p = 0; p < k; ++p) {
      const int64_t av = a[i * k + p];
      const int64_t* bp = b + p * n;
      for (int64_t j = 0; j < n; ++j) cp[j] = wrap_add(cp[j], wrap_mul(av, bp[j]));
    }
  }
}

}  // namespace tessel
