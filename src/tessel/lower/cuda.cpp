// The CUDA target's lowering (see cuda.h).
#include "tessel/lower/cuda.h"

#include <numeric>

#include <fmt/format.h>

#include "tessel/ir/bind.h"
#include "tessel/ir/core_ops.h"
#include "tessel/ir/infer.h"
#include "tessel/passes/pass.h"
#include "tessel/lower/lowering.h"
#include "tessel/support/error.h"

namespace tessel::lower {

namespace {

// A transpose whose only reader is a dot_general the device matmul takes (batch dims leading, one
// contracting dim among the last two) keeps its last two dims in its operand's order, and the dot_general
// contracts the other one: cuBLASLt reads a matrix stored either way, and the copy then walks its
// operand's rows (coalesced, 16-byte vectors) instead of striding across them. The bar block's K^T
// ([4,512,12,64] -> [4,12,64,512], 14.6 us, 10% of the copy roof on the H200) becomes a head copy like
// Q's and V's. The dot_general's output is the same (one free dim per side keeps its place).
// Returns how many transposes it turned.
size_t orient_matmul_transposes(Graph& g) {
  size_t turned = 0;
  const std::vector<int> uses = g.use_counts();
  for (const auto& up : g.mutable_nodes()) {
    Node& n = *up;
    if (!is_core_op(n, CoreOp::dot_general) || n.inputs.size() != 2) continue;
    for (int side = 0; side < 2; ++side) {
      Value* v = n.inputs[static_cast<size_t>(side)];
      Node* t = v ? v->producer : nullptr;
      if (!t || !is_core_op(*t, CoreOp::transpose) || uses[static_cast<size_t>(v->id)] != 1) continue;
      const int64_t r = static_cast<int64_t>(v->type.shape.size());
      if (r < 2) continue;
      std::vector<int64_t> batch(static_cast<size_t>(r - 2));
      std::iota(batch.begin(), batch.end(), 0);
      const std::string bk = side ? "rhs_batch" : "lhs_batch", ck = side ? "rhs_contract" : "lhs_contract";
      std::vector<int64_t> c = n.attr_ints(ck, {}), perm = t->attr_ints("perm", {});
      if (n.attr_ints(bk, {}) != batch || c.size() != 1 || (c[0] != r - 1 && c[0] != r - 2)) continue;
      if (static_cast<int64_t>(perm.size()) != r || perm[static_cast<size_t>(r - 2)] < perm[static_cast<size_t>(r - 1)]) continue;
      std::swap(perm[static_cast<size_t>(r - 2)], perm[static_cast<size_t>(r - 1)]);
      std::swap(v->type.shape[static_cast<size_t>(r - 2)], v->type.shape[static_cast<size_t>(r - 1)]);
      if (v->type.symbolic()) std::swap(v->type.sym[static_cast<size_t>(r - 2)], v->type.sym[static_cast<size_t>(r - 1)]);
      t->attrs["perm"] = perm;
      c[0] = c[0] == r - 1 ? r - 2 : r - 1;
      n.attrs[ck] = c;
      ++turned;
    }
  }
  return turned;
}

}  // namespace

FuseOptions cuda_fuse_options(FuseOptions base) {
  base.conv1d = base.conv_input_views = true;
  base.layout_steps = false;  // host steps read and write row-major buffers
  return base;
}

KernelModule lower_cuda(std::unique_ptr<Graph> g, const std::vector<Tensor>& ex, const CudaOptions& opts) {
  // Unknown input dims take the example inputs' sizes (the graph backend's binding, without baking
  // values: every input stays an input).
  if (!ex.empty() && !graph_symbols(*g).empty()) {
    // Size symbols (docs/dynamic-shapes.md): CUDA code is generated for one binding, the examples'.
    std::vector<Shape> shapes;
    for (const Tensor& t : ex) shapes.push_back(t.shape());
    Bindings b;
    if (std::string why = bind_symbols(*g, shapes, b); !why.empty()) throw Error(Location{.pass = "cuda"}, why);
    g = instantiate_graph(*g, b);
  } else if (!ex.empty()) {
    bind_input_shapes(*g, ex);
    infer_graph(*g);
  }
  Lowering lw(opts.stages);
  try {
    lw.graph_passes(*g, opts.pipeline);
  } catch (const Error& e) {
    throw e.with_context(Location{.pass = "cuda: the core pipeline (the CUDA target needs the model decomposed)"});
  }
  KernelModule m = lw.fuse(std::move(g), cuda_fuse_options(opts.fuse), true);
  lw.run(
      "cuda-orient-transposes", [&m] { return fmt::format("{} transposes turned", orient_matmul_transposes(*m.graph)); },
      [&m] { return print_kernel_module(m, true); }, [&m] { return m.kernels.size(); },
      [&m] { verify_kernel_module(m); });
  return m;
}

}  // namespace tessel::lower
