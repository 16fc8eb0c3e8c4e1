// CUDA C++ generation for the CUDA target (docs/runtime/cuda-backend.md): one `__global__` function
// per kernel of a kernel module, compiled at run time by NVRTC (targets/cuda/nvrtc.h).
//
//   extern "C" __global__ void tsl_k<index>(T0* a0, T1* a1, ...)   one pointer per kernel arg
//
// Two launch forms, decided per kernel (launch_form):
//   pointwise  no reduction: every loop point (outer x inner) is one element of a grid-stride loop, or
//              (vector_width) V adjacent points per thread, unit-stride operands moved V at a time.
//   rows       each outer point is one block (grid-stride over the outer points); its threads split
//              the inner loop of every phase, and each reduction ends in a block reduction whose
//              result every thread holds for the next phases (softmax, layer norm).
// Matmul kernels run through cuBLASLt first (or tsl_k<index>_mm, a direct kernel every matmul kernel
// gets, when their strides fit no cuBLASLt layout or cuBLASLt offers no algorithm); convolution kernels through cuBLASLt (1x1 channels-last), tsl_k<index>_im2col then
// cuBLASLt (conv_as_matmul), or tsl_k<index>_conv, a direct convolution;
// tsl_k<index> is then their epilogue. Identifiers come from the kernel's index only; every name
// (kernels, source nodes, values, the model) appears only in comments, escaped by cpp_comment_text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessel/kernel/kernel.h"
#include "tessel/targets/cuda/precision.h"

namespace tessel::cuda {

enum class LaunchForm { pointwise, rows };

struct LaunchShape {
  LaunchForm form = LaunchForm::pointwise;
  int64_t blocks = 1;
  int threads = 256;
};

std::string kernel_symbol(size_t index);       // tsl_k3
std::string conv_symbol(size_t index);         // tsl_k3_conv
std::string matmul_symbol(size_t index);       // tsl_k3_mm (the direct fallback)
std::string im2col_symbol(size_t index);       // tsl_k3_im2col
// A 1x1, stride-1, unpadded, one-group convolution between channels-last buffers: the matmul
// y[N*H*W, OC] = x[N*H*W, C] . w^T as stored (cuBLASLt, no im2col).
bool conv_is_channels_last_matmul(const ConvSpec& c);
// A convolution the runtime runs as im2col + one cuBLASLt matmul when cuBLASLt takes it (channels-last y:
// y[N*OH*OW, OC] = col . w^T; NCHW y: per image y[OC, OH*OW] = w . col^T, batched): one group, not the 1x1
// channels-last case (a matmul without im2col), a reduction and output channels of at least 8. The direct
// conv stays as the fallback.
bool conv_as_matmul(const ConvSpec& c);
int64_t im2col_elements(const ConvSpec& c);    // col's element count: N*OH*OW x C*KH*KW
LaunchShape im2col_launch_shape(const Kernel& k, int sms);
bool has_generated_function(const Kernel& k);  // a loop kernel, or a library kernel with an epilogue
LaunchForm launch_form(const Kernel& k);
// The grid of a kernel's generated function: `sms` multiprocessors to fill (blocks are capped at a
// few waves of them; the grid-stride loops cover the rest). `storage`: each arg's element type in memory
// (kernel_arg_storage: the pointwise vector form's width follows the widest); empty: the args' own.
LaunchShape launch_shape(const Kernel& k, int sms, const std::vector<DType>& storage = {});
// The same for one binding of a symbolic kernel: the form as the code was generated (`generated`, the
// symbolic kernel), the counts of `bound` (instantiate_kernel of it).
LaunchShape launch_shape(const Kernel& generated, const Kernel& bound, int sms, const std::vector<DType>& storage = {});
LaunchShape conv_launch_shape(const Kernel& k, int sms);
LaunchShape matmul_launch_shape(const Kernel& k, int sms);

// Whether cuBLASLt can run the matmul of `mm` as given (unit stride on one dim of each operand and
// of the result, leading dims large enough); otherwise the direct tsl_k<i>_mm kernel runs it.
bool fits_cublaslt(const MatmulSpec& mm);

// Core nodes no kernel covers that run on the GPU as a generated pointwise function tsl_n<node index>
// (its position in the kernel-level graph) instead of a host step: broadcast_in_dim, and gather
// (GatherElements; an index out of range sets the int at `err` and writes 0, and the runtime reports
// it after the call, so no read leaves the buffer). Parameters: the operands, the result, then `err`
// for gather.
// transpose and slice too: a strided copy of the operand (the views fusion could not fold into a kernel).
// scatter without a reduction too (scatter_on_device): two launches, tsl_n<i> copying the data into the
// result and tsl_n<i>_s writing the updates at their positions (an index out of range sets `err` and
// writes nothing for it); both take (data, idx, upd, y, err).
// concatenate too: one pass over the result, each position read from the operand whose range along the
// axis holds it; it takes (x0, ..., x<k>, y).
bool device_node_supported(const Node& n);
bool scatter_on_device(const Node& n);
std::string scatter_update_symbol(size_t node_index);
LaunchShape scatter_update_launch_shape(const Node& n, int sms);
// A dot_general no kernel covers (fusion's one batch stride cannot take several batch dims of a view) on
// dense row-major operands [batch..., M, K] . [batch..., K, N] (either matrix may be stored transposed):
// its MatmulSpec (args 0, 1, 2 = lhs, rhs, result) for cuBLASLt, with tsl_n<i>_mm as the direct fallback.
std::optional<MatmulSpec> device_matmul_spec(const Node& n);
std::string node_matmul_symbol(size_t node_index);
std::string node_symbol(size_t node_index);
// `storage`: element types in memory by value id (value_storage); empty: the values' own dtypes.
// `symbols`: the module's size symbols (graph_symbols), every generated function's trailing `long long S<i>`
// parameters; empty for a static module.
std::string generate_node(const Node& n, size_t node_index, const std::vector<DType>& storage = {}, const std::vector<std::string>& symbols = {});
LaunchShape node_launch_shape(const Node& n, int sms, const std::vector<DType>& storage = {});  // storage as generate_node's

// The prelude every translation unit starts with: fixed-width types (NVRTC has no <cstdint>), the
// math functions the C spellings call (tsl_exp, tsl_max, ... with the CPU runtime's NaN rules) and
// the block reduction.
const std::string& cuda_prelude();

// The whole translation unit: a banner, the prelude, every kernel's functions and the functions of the
// graph's device nodes (device_node_supported). Under Precision::bf16 the buffers value_storage makes
// bf16 are read and written as bf16 (precision.h).
// `fuse_attention`: attention patterns (attention.h) get their fused kernel (else only a comment with the
// decision); off by default, as CudaBackendOptions::fuse_attention.
std::string generate_cuda(const KernelModule& m, const std::string& model_name, Precision p = Precision::f32, bool fuse_attention = false);
// One kernel's functions (its epilogue or loop function, and the direct conv/matmul where it has one).
// `storage`: each arg's element type in memory (kernel_arg_storage); empty: the args' own dtypes.
// `symbols` as generate_node's.
std::string generate_kernel(const Kernel& k, size_t index, const std::vector<DType>& storage = {}, const std::vector<std::string>& symbols = {});

}  // namespace tessel::cuda
