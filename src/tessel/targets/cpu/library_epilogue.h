// Matmul and convolution epilogues that oneDNN can apply inside the library call (its bias and
// post-ops), so the result is written once instead of being read and written again by the
// generated epilogue: bias, a scale, and relu / clip / GELU (erf form).
#pragma once

#include <optional>
#include <vector>

#include "tessel/kernel/kernel.h"
#include "tessel/targets/cpu/dnnl_ops.h"

namespace tessel::cpu {

struct LibraryEpilogue {
  int bias_arg = -1;       // kernel arg holding the [channels] bias (a constant), or -1
  Epilogue epilogue;       // scale and activation
  std::string summary;     // "bias + gelu_erf", for reports
};

// The epilogue of a matmul or conv kernel as oneDNN post-ops, when its body is exactly
// store(act(scale · (acc + bias))) written back over the library result; otherwise nullopt and the
// generated epilogue runs after the call.
std::optional<LibraryEpilogue> match_library_epilogue(const Kernel& k);

// For every kernel of the module: whether its epilogue runs inside oneDNN (matched, and its bias, if
// any, is an f32 constant of the graph), with the matched epilogue in `epilogues`.
std::vector<bool> library_epilogues(const KernelModule& m, std::vector<LibraryEpilogue>* epilogues = nullptr);

// The library call of a matmul or conv kernel as oneDNN descriptors: dims, strides and layouts (no
// data pointers, bias or epilogue).
MatmulDesc matmul_desc(const MatmulSpec& mm);
ConvDesc conv_desc(const ConvSpec& c);

}  // namespace tessel::cpu
