// Whole-graph inference and single-node evaluation.
#include "tessel/ir/infer.h"

#include "tessel/ir/op_registry.h"
#include "tessel/support/error.h"

namespace tessel {

namespace {
Location node_loc(const Node& n, const char* pass) {
  Location l;
  l.node = n.name;
  l.op = n.op ? n.op->name : "";
  l.pass = pass;
  return l;
}
}  // namespace



void infer_node(Node& n, const std::vector<const Tensor*>& known, std::vector<std::optional<Tensor>>* out_values,
                bool verify_only) {
  try {
    InferCtx ctx(n, known);
    n.op->infer(ctx);
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      if (!n.outputs[i]) continue;
      if (!ctx.out_set(i)) fail("shape rule did not set output {}", i);
      if (!verify_only) {
        n.outputs[i]->type = ctx.outs()[i];
      } else if (n.outputs[i]->type != ctx.outs()[i]) {
        fail("output '{}' has type {} but the op's shape rule gives {}", n.outputs[i]->name,
             n.outputs[i]->type.str(), ctx.outs()[i].str());
      }
    }
    if (out_values) *out_values = ctx.out_values();
  } catch (const Error& e) {
    throw e.with_context(node_loc(n, verify_only ? "verify" : "infer"));
  }
}

std::vector<Tensor> run_node(const Node& n, const std::vector<const Tensor*>& inputs) {
  try {
    KernelCtx ctx(n, inputs);
    n.op->kernel(ctx);
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      const Value* v = n.outputs[i];
      if (!v) continue;
      const Tensor& t = ctx.outs()[i];
      if (!t.valid()) fail("kernel did not produce output {}", i);
      if (t.dtype() != v->type.dtype)
        fail("kernel produced {} for output {} but its type is {}", dtype_name(t.dtype()), i, v->type.str());
      const Shape& st = v->type.shape;
      bool ok = st.size() == t.shape().size();
      for (size_t d = 0; ok && d < st.size(); ++d) ok = st[d] < 0 || st[d] == t.shape()[d];
      if (!ok) fail("kernel produced shape {} for output {} but its type is {}", shape_str(t.shape()), i, v->type.str());
    }
    return std::move(ctx.outs());
  } catch (const Error& e) {
    throw e.with_context(node_loc(n, "run"));
  } catch (const std::bad_alloc&) {
    throw Error(node_loc(n, "run"), "out of memory");
  } catch (const std::length_error&) {
    throw Error(node_loc(n, "run"), "tensor too large");
  }
}

InferResult infer_graph(Graph& g, int64_t fold_limit, bool verify_only) {
  InferResult r;
  auto known_of = [&](const Value* v) -> const Tensor* {
    if (!v) return nullptr;
    if (v->constant) return &*v->constant;
    auto it = r.folded.find(v);
    return it == r.folded.end() ? nullptr : &it->second;
  };
  for (auto& np : g.mutable_nodes()) {
    Node& n = *np;
    std::vector<const Tensor*> known;
    bool all_known = true;
    int64_t elems = 0;
    for (const Value* v : n.inputs) {
      known.push_back(known_of(v));
      if (v && !known.back()) all_known = false;
      if (known.back()) elems += known.back()->numel();
    }
    std::vector<std::optional<Tensor>> out_values;
    infer_node(n, known, &out_values, verify_only);
    bool any_value = false;
    for (size_t i = 0; i < n.outputs.size(); ++i)
      if (n.outputs[i] && out_values[i]) {
        r.folded[n.outputs[i]] = std::move(*out_values[i]);
        any_value = true;
      }
    if (any_value || !all_known || !n.op->deterministic || elems > fold_limit) continue;
    bool small = true;
    for (const Value* v : n.outputs)
      if (v && (!shape_known(v->type.shape) || shape_numel(v->type.shape) > fold_limit)) small = false;
    if (!small) continue;
    auto outs = run_node(n, known);
    for (size_t i = 0; i < n.outputs.size(); ++i)
      if (n.outputs[i]) r.folded[n.outputs[i]] = std::move(outs[i]);
  }
  return r;
}

}  // namespace tessel
