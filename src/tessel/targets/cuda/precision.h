// The CUDA target's precision choice (docs/runtime/cuda-backend.md, "bf16"): which element type every
// value has in device memory. The kernel level stays f32; only storage changes, and every generated
// kernel converts on load and store, computing in f32 registers (cuBLASLt: bf16 operands, f32 compute).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/kernel/kernel.h"

namespace tessel::cuda {

enum class Precision { f32, bf16 };

// "f32" or "bf16" (the CLI's --precision), else a one-line tessel::Error naming the choices.
Precision parse_precision(const std::string& s);
const char* precision_name(Precision p);
// The relative error `--check` and the bench accept at this precision: 1e-4 for f32, 2e-2 for bf16
// (issue 15's bars; bf16 keeps 8 significant bits, a relative step of 2^-8 = 3.9e-3 per rounding).
double precision_tolerance(Precision p);

// The element type of every value of the kernel-level graph `g` (its kernels: `kernels`) in device memory,
// by value id. Under f32 every value keeps its dtype. Under bf16 the storage follows PyTorch's autocast,
// so that the residual stream and normalized activations keep f32 while matmuls and convolutions take
// bf16 (docs/runtime/cuda-backend.md, "bf16"):
// - a matmul's or convolution's result (a matmul or conv kernel, a dot_general node) is bf16, unless its
//   epilogue reads an f32 computed value (a residual): then f32 (cuBLASLt: bf16 A and B, f32 C and D);
// - a loop kernel's result is f32 when it reduces (softmax, normalization, mean) or reads an f32 computed
//   value, else bf16; a node's (gather, copies) is f32 when it reads an f32 value, constants included;
// - a graph input is f32; a constant is bf16 when a matmul or conv kernel or a dot_general reads it, else f32,
//   but one a library kernel's epilogue reads (a bias) has the type of that kernel's result (cuBLASLt's rule);
// - any of these is bf16 when every reader takes it as a matmul's or convolution's operand, or some
//   convolution as its activation (autocast's cast, done once by its producer); a matmul operand stored
//   f32 beside a bf16 one is converted by the runtime before the call;
// - whatever the above, a value stays f32 when its memory (the values a reshape chain aliases) holds a
//   graph output (the user receives f32) or has a single element (scales, epsilons: nothing to save).
// Non-f32 values keep their dtype. `kernels` may be empty (a core graph: its dot_generals are the matmuls).
std::vector<DType> value_storage(const Graph& g, const std::vector<Kernel>& kernels, Precision p);

// The element type of each argument of kernel `k` (run by kernel node `kn`): its value's storage; a
// scratch buffer is bf16 under bf16 when it is f32.
std::vector<DType> kernel_arg_storage(const Node& kn, const Kernel& k, const std::vector<DType>& value_storage, Precision p);

// Host conversions of whole buffers (weights at upload, inputs per call): round to nearest even; a finite
// f32 beyond bf16's range saturates to bf16's largest finite value (masks of -3.4e38 stay finite); NaN
// stays NaN.
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t h);
void f32_to_bf16(const float* src, uint16_t* dst, int64_t n);
void bf16_to_f32(const uint16_t* src, float* dst, int64_t n);

}  // namespace tessel::cuda
