// Attention as one fused kernel on the CUDA target (docs/runtime/cuda-backend.md, "Fused attention"):
// the kernel-level pattern
//   S = dot_general(Q, K)          a batched matmul the runtime runs on the device (device_matmul_spec)
//   P = kernel(S [, mask])         a loop kernel that is, row for row, softmax(alpha * S + mask)
//   O = dot_general(P, V)
// with S and P used nowhere else becomes tsl_attn_<i>: a flash-style kernel (online softmax, bf16 tensor
// cores through mma.sync m16n8k16, f32 accumulation), so S and P never reach memory. The softmax is
// recognised by value: its loop body is evaluated on sample rows (alpha read off one row, then checked
// on others), so any spelling of the softmax and of the scale is found. Only bf16-stored Q, K and V fuse
// (the kernel's matrix instructions take bf16); the decision, fused or why not, is printable.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tessel/kernel/kernel.h"

namespace tessel::cuda {

struct AttentionMatch {
  size_t qk = 0, softmax = 0, pv = 0;   // node indices in the kernel module's graph
  MatmulSpec s, o;                      // the two products (args 0, 1, 2 = lhs, rhs, result)
  double alpha = 1;                     // the scale inside the softmax
  int mask_arg = -1;                    // the softmax kernel's arg holding the mask, or -1
  bool fused = false;                   // false: the pattern is there, but `why` says what keeps it apart
  std::string why;
};

// Every attention pattern of `m`, under the element types `storage` (value_storage, by value id).
std::vector<AttentionMatch> find_attention(const KernelModule& m, const std::vector<DType>& storage);

std::string attention_symbol(size_t pv_node);  // tsl_attn_<pv node index>
// The fused kernel of a match (fused = true): parameters (q, k, v, [mask,] o); launch attention_launch.
std::string generate_attention(const KernelModule& m, const AttentionMatch& a, const std::vector<DType>& storage);
struct AttentionLaunch {
  int grid_x = 1, grid_y = 1, threads = 128;
};
AttentionLaunch attention_launch(const AttentionMatch& a);

// The softmax's scale if loop kernel `k` computes, row for row over its one inner dim, softmax(alpha * x
// + mask) of the arg `x_arg` (and `mask_arg` when >= 0); nullopt otherwise. Exposed for the tests.
std::optional<double> softmax_scale(const Kernel& k, int x_arg, int mask_arg);

}  // namespace tessel::cuda
