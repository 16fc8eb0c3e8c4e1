// C++ generation for the CPU target (docs/runtime/compiled-backend.md): one readable function per kernel of a
// kernel module, with provenance comments naming the fused source nodes.
//
//   extern "C" void tsl_k<index>(void* const* args, const long* sz, long lo, long hi);
//
// Identifiers are derived from the kernel's index, never from a name; names (kernels, source nodes,
// values, the model) appear only in comments, escaped by cpp_comment_text (docs/security.md).
//
// args holds one pointer per kernel arg (inputs, outputs, scratch); sz the values of the module's size
// symbols (module_symbols' order; unread when every size is static: docs/dynamic-shapes.md), which
// loop bounds, strides and offsets read as locals S<i>; [lo, hi) is the part of the
// kernel's parallel range (Kernel::parallel_extent) this call computes, so calls on disjoint ranges
// may run on different threads. Matmul and convolution kernels get a function for their epilogue
// only (the library call runs first, from the runtime); a kernel without epilogue, or whose epilogue
// oneDNN applies as bias and post-ops, gets none.
// Inner loops are marked `#pragma omp simd`; math comes from tessel_rt.h, written to vectorise.
#pragma once

#include <string>
#include <vector>

#include "tessel/kernel/kernel.h"

namespace tessel::cpu {

std::string kernel_symbol(size_t index);            // "tsl_k3" for kernel 3 of its module
// False for a library call without epilogue, or whose epilogue runs inside oneDNN.
bool has_generated_function(const Kernel& k, bool epilogue_in_library = false);

// The whole translation unit: a banner, the runtime header include and every kernel's function
// (in_library[i]: kernel i's epilogue runs inside oneDNN, so it gets no function).
std::string generate_cpp(const KernelModule& m, const std::string& model_name, const std::vector<bool>& in_library = {});

// One kernel's function (used by the docs and tests); `symbols` as module_symbols gives them.
std::string generate_kernel(const Kernel& k, size_t index, const std::vector<std::string>& symbols = {});
// The size symbols of the module, sorted: the order of the generated functions' sz[].
std::vector<std::string> module_symbols(const KernelModule& m);

}  // namespace tessel::cpu
