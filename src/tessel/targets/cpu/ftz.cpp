// Subnormal results flushed where only library products read them (see ftz.h).
#include "tessel/targets/cpu/ftz.h"

#include <functional>
#include <vector>

#include "tessel/ir/core_ops.h"
#include "tessel/ir/op_registry.h"

namespace tessel::cpu {

int mark_ftz_stores(KernelModule& m) {
  const Graph& g = *m.graph;
  const std::vector<std::vector<const Node*>> readers = g.users();
  // Whether every reader of v is a library product, looking through reshapes (views of the same bytes).
  std::function<bool(const Value*)> only_products = [&](const Value* v) {
    if (g.returns(v) || readers[static_cast<size_t>(v->id)].empty()) return false;
    for (const Node* r : readers[static_cast<size_t>(v->id)]) {
      if (is_core_op(*r, CoreOp::reshape)) {
        if (!only_products(r->outputs[0])) return false;
        continue;
      }
      if (!is_kernel_node(*r)) return false;
      const Kernel& k = m.kernels.at(static_cast<size_t>(r->attr_i("kernel")));
      if (k.kind == KernelKind::loop) return false;
    }
    return true;
  };
  int marked = 0;
  for (const auto& n : g.nodes()) {
    if (!is_kernel_node(*n)) continue;
    Kernel& k = m.kernels.at(static_cast<size_t>(n->attr_i("kernel")));
    if (k.kind != KernelKind::loop) continue;
    bool any = false;
    for (KInstr& in : k.body) {
      if (!in.is(KInstrKind::store) || (in.dtype != DType::f32 && in.dtype != DType::f64)) continue;
      const int arg = k.accesses.at(static_cast<size_t>(in.access)).arg;
      const int out = arg - k.num_inputs();
      if (out < 0 || out >= static_cast<int>(n->outputs.size()) || !only_products(n->outputs[static_cast<size_t>(out)]))
        continue;
      in.attr = "ftz";
      any = true;
    }
    marked += any;
  }
  return marked;
}

}  // namespace tessel::cpu
