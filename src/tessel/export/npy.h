// NumPy .npy files (format version 1.0) of tensors: how the KTIR folder form carries constants, read by
// numpy.load with no other code. Types without a NumPy dtype (bf16, f8, sub-byte) are written as f32.
#pragma once

#include <string>

#include "tessel/support/tensor.h"

namespace tessel {

// The whole file's bytes: magic, header (descr, fortran_order False, shape), row-major data.
std::string npy_bytes(const Tensor& t);

}  // namespace tessel
