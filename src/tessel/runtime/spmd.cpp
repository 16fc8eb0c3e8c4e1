// Lockstep execution of a sharded program's ranks (see spmd.h).
#include "tessel/runtime/spmd.h"

#include <fmt/format.h>

#include <cstring>

#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/support/error.h"

namespace tessel {

namespace {

Error at_node(const Node& n, int rank, const std::string& why) {
  return Error(Location{.node = n.name, .op = n.op_name(), .pass = "run-spmd"}, fmt::format("rank {}: {}", rank, why));
}

// Sum of every rank's tensor, in rank order, accumulated in double.
Tensor all_reduce(const std::vector<const Tensor*>& xs) {
  const Tensor& x0 = *xs[0];
  std::vector<double> acc(static_cast<size_t>(x0.numel()), 0.0);
  for (const Tensor* x : xs)
    for (int64_t i = 0; i < x0.numel(); ++i) acc[size_t(i)] += x->get_f(i);
  return Tensor::from_f64(x0.dtype(), x0.shape(), acc);
}

// Every rank's tensor concatenated along `axis`, in rank order.
Tensor all_gather(const std::vector<const Tensor*>& xs, int axis) {
  const Tensor& x0 = *xs[0];
  const Shape& s = x0.shape();
  Shape os = s;
  os[size_t(axis)] *= int64_t(xs.size());
  Tensor out(x0.dtype(), os);
  int64_t outer = 1;
  for (int i = 0; i < axis; ++i) outer *= s[size_t(i)];
  size_t chunk = size_t(dtype_size(x0.dtype()));
  for (size_t i = size_t(axis); i < s.size(); ++i) chunk *= size_t(s[i]);
  uint8_t* dst = out.bytes();
  for (int64_t o = 0; o < outer; ++o)
    for (const Tensor* x : xs) {
      std::memcpy(dst, x->bytes() + size_t(o) * chunk, chunk);
      dst += chunk;
    }
  return out;
}

}  // namespace

std::vector<std::vector<Tensor>> run_spmd(const std::vector<const Graph*>& ranks, const std::vector<Tensor>& inputs) {
  const size_t n = ranks.size();
  if (n == 0) throw Error(Location{.pass = "run-spmd"}, "no ranks to run");
  const Graph& g0 = *ranks[0];
  for (size_t r = 1; r < n; ++r) {
    const Graph& g = *ranks[r];
    bool same = g.nodes().size() == g0.nodes().size() && g.inputs.size() == g0.inputs.size() && g.outputs.size() == g0.outputs.size();
    for (size_t k = 0; same && k < g.nodes().size(); ++k) same = g.nodes()[k]->op == g0.nodes()[k]->op;
    if (!same) throw Error(Location{.pass = "run-spmd"}, fmt::format("rank {}'s graph is not rank 0's program (nodes, inputs or outputs differ)", r));
  }
  if (inputs.size() != g0.inputs.size())
    throw Error(Location{.pass = "run-spmd"}, fmt::format("the program takes {} inputs but {} were given", g0.inputs.size(), inputs.size()));
  std::vector<std::vector<Tensor>> env(n);
  std::vector<std::vector<int>> last_use(n);
  for (size_t r = 0; r < n; ++r) {
    const Graph& g = *ranks[r];
    env[r].resize(g.values().size());
    last_use[r].assign(g.values().size(), -1);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Value* v = g.inputs[i];
      if (inputs[i].dtype() != v->type.dtype || inputs[i].shape() != v->type.shape)
        throw Error(Location{.pass = "run-spmd"}, fmt::format("input '{}' must be {} but got {}", v->name, v->type.str(),
                                                              TensorType{inputs[i].dtype(), inputs[i].shape()}.str()));
      env[r][size_t(v->id)] = inputs[i];
    }
    const auto& nodes = g.nodes();
    for (size_t k = 0; k < nodes.size(); ++k)
      for (const Value* v : nodes[k]->inputs)
        if (v) last_use[r][size_t(v->id)] = int(k);
    for (const Value* v : g.outputs) last_use[r][size_t(v->id)] = int(nodes.size());
  }
  auto input_of = [&](size_t r, const Node& nd, const Value* v) -> const Tensor* {
    if (!v) return nullptr;
    if (v->constant) return &*v->constant;
    const Tensor& t = env[r][size_t(v->id)];
    if (!t.valid()) throw at_node(nd, int(r), fmt::format("input '{}' has no value (graph not in topological order)", v->name));
    return &t;
  };
  const OpDef* reduce = OpRegistry::get().find("AllReduce");
  const OpDef* gather = OpRegistry::get().find("AllGather");
  for (size_t k = 0; k < g0.nodes().size(); ++k) {
    const Node& n0 = *g0.nodes()[k];
    if (n0.op == reduce || n0.op == gather) {
      std::vector<const Tensor*> xs;
      for (size_t r = 0; r < n; ++r) {
        const Node& nd = *ranks[r]->nodes()[k];
        if (nd.attr_i("ranks") != int64_t(n))
          throw at_node(nd, int(r), fmt::format("the collective's group has {} ranks but the program runs {}", nd.attr_i("ranks"), n));
        xs.push_back(input_of(r, nd, nd.inputs[0]));
        if (xs.back()->dtype() != xs[0]->dtype() || xs.back()->shape() != xs[0]->shape())
          throw at_node(nd, int(r), fmt::format("its input {} differs from rank 0's {}", TensorType{xs.back()->dtype(), xs.back()->shape()}.str(),
                                                TensorType{xs[0]->dtype(), xs[0]->shape()}.str()));
      }
      Tensor out;
      if (n0.op == reduce) {
        out = all_reduce(xs);
      } else {
        int64_t axis = n0.attr_i("axis");
        if (axis < 0) axis += xs[0]->rank();
        out = all_gather(xs, int(axis));
      }
      for (size_t r = 0; r < n; ++r) {
        const Node& nd = *ranks[r]->nodes()[k];
        if (out.shape() != nd.outputs[0]->type.shape)
          throw at_node(nd, int(r), fmt::format("the collective gives {} where the graph says {}", shape_str(out.shape()),
                                                nd.outputs[0]->type.str()));
        env[r][size_t(nd.outputs[0]->id)] = out;
      }
    } else {
      for (size_t r = 0; r < n; ++r) {
        const Node& nd = *ranks[r]->nodes()[k];
        std::vector<const Tensor*> ins;
        for (const Value* v : nd.inputs) ins.push_back(input_of(r, nd, v));
        std::vector<Tensor> outs = run_node(nd, ins);
        for (size_t i = 0; i < outs.size(); ++i)
          if (nd.outputs[i]) env[r][size_t(nd.outputs[i]->id)] = std::move(outs[i]);
      }
    }
    for (size_t r = 0; r < n; ++r) {  // free what no later node reads
      const Node& nd = *ranks[r]->nodes()[k];
      for (const Value* v : nd.inputs)
        if (v && !v->constant && !v->is_input && last_use[r][size_t(v->id)] == int(k)) env[r][size_t(v->id)] = Tensor();
      for (const Value* v : nd.outputs)
        if (v && last_use[r][size_t(v->id)] < 0) env[r][size_t(v->id)] = Tensor();
    }
  }
  std::vector<std::vector<Tensor>> out(n);
  for (size_t r = 0; r < n; ++r)
    for (const Value* v : ranks[r]->outputs) out[r].push_back(v->constant ? *v->constant : env[r][size_t(v->id)]);
  return out;
}

}  // namespace tessel
