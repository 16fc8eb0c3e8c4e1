// The partitioner, the repair suggestions and the partitioned executable. docs/graph-breaks.md.
#include "tessel/runtime/partition.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/runtime/compiled_backend.h"
#include "tessel/runtime/graph_backend.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"

namespace tessel {

// ---- the TorchFallback op --------------------------------------------------------------------

const OpDef* torch_fallback_op() {
  // Not added to the op registry: the op table (docs/ops.md) lists ONNX-level ops, and a TorchFallback
  // node only exists in graphs built by the Python frontend, never in a model file.
  static const OpDef def = [] {
    auto infer = [](InferCtx& c) {
      const Node& n = c.node();
      auto dtypes = n.attr_strings("out_dtypes");
      auto ranks = n.attr_ints("out_ranks");
      auto dims = n.attr_ints("out_shapes");
      if (dtypes.size() != ranks.size()) fail("out_dtypes and out_ranks differ in length");
      if (static_cast<int>(dtypes.size()) < c.num_outputs()) fail("{} outputs but {} output types", c.num_outputs(), dtypes.size());
      size_t at = 0;
      for (int i = 0; i < c.num_outputs(); ++i) {
        auto dt = dtype_from_name(dtypes[i]);
        if (!dt) fail("unknown dtype '{}'", dtypes[i]);
        if (ranks[i] < 0 || at + ranks[i] > dims.size()) fail("out_shapes is shorter than out_ranks says");
        Shape s(dims.begin() + at, dims.begin() + at + ranks[i]);
        at += ranks[i];
        if (n.outputs[i]) c.set_out(i, TensorType{*dt, s});
      }
    };
    auto kernel = [](KernelCtx& c) {
      unsupported("aten op '{}' runs in PyTorch only (TorchFallback)", c.node().attr_s("target", "?"));
    };
    OpDef d = make_op("TorchFallback", 1, 0, -1,
                      {{"target", AttrKind::s, true}, {"reason", AttrKind::s}, {"out_dtypes", AttrKind::strings, true},
                       {"out_ranks", AttrKind::ints, true}, {"out_shapes", AttrKind::ints, true}},
                      infer, kernel);
    d.domain = "tessel.torch";
    d.min_outputs = 0;
    d.max_outputs = 1024;
    d.deterministic = false;  // never folded at compile time: it only runs in PyTorch
    return d;
  }();
  return &def;
}

std::string_view break_kind_name(BreakKind k) {
  switch (k) {
    case BreakKind::data_dependent: return "data-dependent shape";
    case BreakKind::no_core_form: return "no core form";
    case BreakKind::torch_fallback: return "torch fallback";
  }
  return "?";
}

namespace {

// A dim only known when the node runs (data-dependent). A symbolic dim (docs/dynamic-shapes.md) is
// known: an expression of the size symbols.
bool has_unknown_dim(const Value* v) { return v && !v->type.dims_defined(); }

// Consumers of every value: (node, input index); graph outputs count as a use with node null.
struct Uses {
  std::map<const Value*, std::vector<std::pair<Node*, int>>> of;
  explicit Uses(const Graph& g) {
    for (const auto& n : g.nodes())
      for (size_t i = 0; i < n->inputs.size(); ++i)
        if (n->inputs[i]) of[n->inputs[i]].push_back({n.get(), static_cast<int>(i)});
    for (const Value* v : g.outputs) of[v].push_back({nullptr, 0});
  }
  // The single consumer of v (not a graph output), or null.
  std::pair<Node*, int> single(const Value* v) const {
    auto it = of.find(v);
    if (it == of.end() || it->second.size() != 1 || !it->second[0].first) return {nullptr, 0};
    return it->second[0];
  }
};

std::optional<std::vector<int64_t>> const_ints(const Value* v) {
  if (!v || !v->constant) return std::nullopt;
  return v->constant->to_i64();
}

// The axes a ReduceSum node reduces (normalised, sorted); nullopt when unknown.
std::optional<std::set<int64_t>> reduce_axes(const Node& n) {
  const int64_t rank = static_cast<int64_t>(n.inputs[0]->type.shape.size());
  std::vector<int64_t> axes;
  if (n.has_input(1)) {
    auto a = const_ints(n.inputs[1]);
    if (!a) return std::nullopt;
    axes = *a;
  } else if (n.has_attr("axes")) {
    axes = n.attr_ints("axes");
  }
  std::set<int64_t> out;
  if (axes.empty()) {
    if (n.attr_i("noop_with_empty_axes", 0)) return out;
    for (int64_t d = 0; d < rank; ++d) out.insert(d);
    return out;
  }
  for (int64_t a : axes) out.insert(a < 0 ? a + rank : a);
  return out;
}

bool static_type(const Value* v) { return v && !has_unknown_dim(v); }

// Whether `c`, reading the row-indexed value at input `i`, treats every row (axis 0) independently
// with operands that do not depend on the rows: then selecting rows before or after it is the same.
bool row_wise(const Node& c, int i) {
  static const std::set<std::string> unary = {"Relu", "Sigmoid", "Tanh", "Gelu", "Erf", "Exp", "Neg", "Abs",
                                              "Sqrt", "Cast", "Identity", "LeakyRelu", "Softplus", "Elu",
                                              "Selu", "HardSigmoid", "HardSwish", "Mish", "Log", "Reciprocal",
                                              "Sin", "Cos", "Floor", "Ceil", "Round", "Sign"};
  static const std::set<std::string> binary = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "PRelu"};
  const std::string& op = c.op_name();
  const int64_t rank = static_cast<int64_t>(c.inputs[i]->type.shape.size());
  if (rank < 1 || c.outputs.size() != 1) return false;
  auto others_static = [&] {
    for (size_t k = 0; k < c.inputs.size(); ++k)
      if (static_cast<int>(k) != i && c.inputs[k] && !static_type(c.inputs[k])) return false;
    return true;
  };
  // An operand that broadcasts along the rows: lower rank, or a leading 1 at equal rank.
  auto broadcasts_on_rows = [&](const Value* o) {
    const auto& s = o->type.shape;
    const int64_t r = static_cast<int64_t>(s.size());
    return r < rank || (r == rank && s[0] == 1);
  };
  if (unary.count(op)) return i == 0 && others_static();
  if (op == "Clip") return i == 0 && others_static();
  if (binary.count(op)) {
    if (!others_static()) return false;
    const Value* o = c.inputs[1 - i];
    return o && broadcasts_on_rows(o);
  }
  if (op == "Gemm") {
    if (i != 0 || c.attr_i("transA", 0) != 0 || !others_static() || rank != 2) return false;
    return !c.has_input(2) || broadcasts_on_rows(c.inputs[2]);
  }
  if (op == "MatMul") return i == 0 && rank >= 2 && static_type(c.inputs[1]) && c.inputs[1]->type.shape.size() == 2;
  if (op == "Softmax" || op == "LogSoftmax" || op == "LayerNormalization") {
    if (i != 0 || !others_static() || rank < 2) return false;
    int64_t axis = c.attr_i("axis", -1);
    if (axis < 0) axis += rank;
    return axis >= 1;
  }
  return false;
}

// ---- pattern A: NonZero -> index chain -> Gather(axis 0) -> row-wise ops -> ReduceSum over rows --
struct NonZeroMatch {
  Node* nonzero = nullptr;
  std::vector<Node*> index_chain;   // Transpose / Squeeze / Reshape ... from NonZero to the index vector
  Node* gather = nullptr;
  std::vector<Node*> row_ops;
  Node* reduce = nullptr;
  int reduce_input_from = 0;        // unused: ReduceSum always reads input 0
};

std::optional<NonZeroMatch> match_nonzero(const Graph& g, const Node& nz) {
  if (nz.op_name() != "NonZero") return std::nullopt;
  const Value* m = nz.inputs[0];
  if (m->type.shape.size() != 1 || has_unknown_dim(m)) return std::nullopt;
  const int64_t rows = m->type.shape[0];
  Uses uses(g);
  NonZeroMatch r;
  r.nonzero = const_cast<Node*>(&nz);
  const Value* v = nz.outputs[0];
  static const std::set<std::string> index_ops = {"Transpose", "Squeeze", "Reshape", "Flatten", "Identity"};
  for (;;) {
    auto [c, i] = uses.single(v);
    if (!c) return std::nullopt;
    if (c->op_name() == "Gather" && i == 1) {
      if (v->type.shape.size() != 1) return std::nullopt;
      r.gather = c;
      break;
    }
    if (!index_ops.count(c->op_name()) || i != 0) return std::nullopt;
    r.index_chain.push_back(c);
    v = c->outputs[0];
  }
  const Value* x = r.gather->inputs[0];
  const int64_t xr = static_cast<int64_t>(x->type.shape.size());
  int64_t axis = r.gather->attr_i("axis", 0);
  if (axis < 0) axis += xr;
  if (axis != 0 || !static_type(x) || x->type.shape[0] != rows) return std::nullopt;
  const Value* y = r.gather->outputs[0];
  for (;;) {
    auto [c, i] = uses.single(y);
    if (!c) return std::nullopt;
    if (c->op_name() == "ReduceSum" && i == 0) {
      auto axes = reduce_axes(*c);
      if (!axes || !axes->count(0)) return std::nullopt;
      r.reduce = c;
      return r;
    }
    if (!row_wise(*c, i)) return std::nullopt;
    r.row_ops.push_back(c);
    y = c->outputs[0];
  }
}

// ---- pattern B: Compress(x, c[, axis]) -> ReduceSum over the compressed axis -------------------
struct CompressMatch {
  Node* compress = nullptr;
  Node* reduce = nullptr;
};

std::optional<CompressMatch> match_compress(const Graph& g, const Node& n) {
  if (n.op_name() != "Compress") return std::nullopt;
  const Value* x = n.inputs[0];
  const Value* c = n.inputs[1];
  if (!static_type(x) || !static_type(c) || c->type.dtype != DType::boolean || c->type.shape.size() != 1) return std::nullopt;
  int64_t len = 1;
  int64_t axis = 0;
  if (n.has_attr("axis")) {
    axis = n.attr_i("axis");
    if (axis < 0) axis += static_cast<int64_t>(x->type.shape.size());
    if (axis < 0 || axis >= static_cast<int64_t>(x->type.shape.size())) return std::nullopt;
    len = x->type.shape[axis];
  } else {
    for (int64_t d : x->type.shape) len *= d;
  }
  if (c->type.shape[0] != len) return std::nullopt;
  Uses uses(g);
  auto [r, i] = uses.single(n.outputs[0]);
  if (!r || r->op_name() != "ReduceSum" || i != 0) return std::nullopt;
  auto axes = reduce_axes(*r);
  if (!axes || !axes->count(axis)) return std::nullopt;
  return CompressMatch{const_cast<Node*>(&n), r};
}

}  // namespace

std::optional<std::pair<BreakKind, std::string>> break_reason(const Node& n) {
  const OpDef* op = n.op;
  if (op->domain == "tessel.torch")
    return std::pair{BreakKind::torch_fallback,
                     n.attr_s("reason", fmt::format("unsupported aten op {}: no tessel lowering", n.attr_s("target", "?")))};
  if (op->core.has_value() || op->domain == "tessel.kernel") return std::nullopt;
  bool inputs_static = true;
  for (const Value* v : n.inputs) inputs_static = inputs_static && !has_unknown_dim(v);
  for (const Value* v : n.outputs)
    if (inputs_static && has_unknown_dim(v))
      return std::pair{BreakKind::data_dependent,
                       fmt::format("data-dependent output shape: {} gives {} for {}", op->name, v->type.str(),
                                   n.inputs.empty() || !n.inputs[0] ? std::string("?") : n.inputs[0]->type.str())};
  if (!op->decompose) return std::pair{BreakKind::no_core_form, fmt::format("{} has no core form", op->name)};
  return std::nullopt;
}

std::string suggest_repair(const Graph& g, const Node& n) {
  const std::string& op = n.op_name();
  if (op == "NonZero") {
    if (auto m = match_nonzero(g, n))
      return fmt::format(
          "nonzero-gather-reduce (auto-repairable with repair=True / --repair): the rows NonZero selects from '{}' "
          "feed {} row-wise op(s) and a sum over rows ('{}'); compute them on all {} rows and sum "
          "Where(mask, y, 0) instead, e.g. torch.where(mask[:, None], f(x), 0).sum(0) for f(x[mask.nonzero()...]).sum(0)",
          m->gather->inputs[0]->name, m->row_ops.size(), m->reduce->name, n.inputs[0]->type.shape[0]);
    return "keep the shape fixed: instead of selecting with nonzero / boolean indexing, compute on every element and "
           "mask with where(mask, y, 0) (sum) or a count of the mask (mean)";
  }
  if (op == "Compress") {
    if (match_compress(g, n))
      return "compress-reduce (auto-repairable with repair=True / --repair): the selected elements are only summed; "
             "sum Where(mask, x, 0) instead, e.g. torch.where(m, x, 0).sum() for x.masked_select(m).sum()";
    return "masked_select / Compress has a data-dependent length: keep the shape with where(mask, x, 0)";
  }
  if (op == "Unique") return "unique has a data-dependent length: use a fixed-size form (one-hot / bincount over a known range)";
  if (op == "NonMaxSuppression") return "pad the selection to max_output_boxes_per_class and mask the padding";
  if (op == "TorchFallback") {
    std::string target = n.attr_s("target", "");
    if (target.find("_local_scalar_dense") != std::string::npos || target.find("item") != std::string::npos)
      return "keep the value a 0-d tensor instead of calling .item() (e.g. x / s instead of x / s.item())";
    if (target.find("nonzero") != std::string::npos || target.find("masked_select") != std::string::npos)
      return "keep the shape fixed with torch.where(mask, x, 0)";
    return fmt::format("rewrite {} with supported ops, or add a lowering for it to python/tessel/aten_table.py", target);
  }
  return "";
}

// ---- partitioning ------------------------------------------------------------------------------

PartitionPlan partition_graph(Graph& g) {
  PartitionPlan plan;
  InferResult inf = infer_graph(g);
  plan.folded = std::move(inf.folded);
  const auto& nodes = g.nodes();
  std::map<const Node*, int> level;       // compiled nodes: partition index
  std::map<const Node*, int> brk;         // break nodes: index into plan.breaks
  for (const auto& up : nodes) {
    const Node* n = up.get();
    bool all_folded = !n->outputs.empty();
    for (const Value* v : n->outputs) all_folded = all_folded && (!v || plan.folded.count(v));
    auto why = all_folded ? std::nullopt : break_reason(*n);
    int after = -1, lev = 0;
    for (const Value* v : n->inputs) {
      if (!v || !v->producer || plan.folded.count(v)) continue;
      const Node* p = v->producer;
      if (auto b = brk.find(p); b != brk.end()) {
        const int a = plan.breaks[b->second].after_partition;
        after = std::max(after, a);
        lev = std::max(lev, a + 1);
      } else {
        after = std::max(after, level.at(p));
        lev = std::max(lev, level.at(p));
      }
    }
    if (why) {
      GraphBreak gb;
      gb.node = n;
      gb.kind = why->first;
      gb.reason = why->second;
      gb.op = n->op_name() == "TorchFallback" ? n->attr_s("target", "?") : n->op_name();
      gb.location = n->name;
      gb.repair = suggest_repair(g, *n);
      gb.after_partition = after;
      brk[n] = static_cast<int>(plan.breaks.size());
      plan.breaks.push_back(std::move(gb));
    } else {
      level[n] = lev;
    }
  }
  int nparts = 0;
  for (const auto& [n, l] : level) nparts = std::max(nparts, l + 1);
  // Which values leave each partition: used by a node of another partition, a break, or a graph output.
  std::set<const Value*> graph_outs(g.outputs.begin(), g.outputs.end());
  std::map<const Value*, std::set<int>> used_in;   // partition indices using a value (-1: a break)
  for (const auto& up : nodes) {
    auto lv = level.find(up.get());
    for (const Value* v : up->inputs)
      if (v) used_in[v].insert(lv == level.end() ? -1 : lv->second);
  }
  std::vector<int> part_index(nparts, -1);   // level -> index in plan.partitions (empty levels dropped)
  for (int k = 0; k < nparts; ++k) {
    Partition p;
    for (const auto& up : nodes)
      if (auto lv = level.find(up.get()); lv != level.end() && lv->second == k) p.nodes.push_back(up.get());
    std::set<const Node*> inside(p.nodes.begin(), p.nodes.end());
    for (const Node* n : p.nodes)
      for (const Value* v : n->outputs) {
        if (!v) continue;
        bool leaves = graph_outs.count(v) > 0;
        for (int u : used_in[v]) leaves = leaves || u != k;
        if (leaves && !plan.folded.count(v)) p.outputs.push_back(v);
      }
    if (p.outputs.empty()) continue;   // nothing it computes is needed
    auto sub = std::make_unique<Graph>();
    sub->name = fmt::format("{}_part{}", g.name, plan.partitions.size());
    sub->symbols = g.symbols;  // its sizes name the model's symbols (docs/dynamic-shapes.md)
    std::map<const Value*, Value*> map;
    for (const Node* n : p.nodes) {
      std::vector<Value*> ins;
      for (const Value* v : n->inputs) {
        if (!v) {
          ins.push_back(nullptr);
          continue;
        }
        auto it = map.find(v);
        if (it == map.end()) {
          Value* nv = nullptr;
          if (v->constant) {
            nv = sub->add_constant(v->name, *v->constant);
          } else if (auto f = plan.folded.find(v); f != plan.folded.end()) {
            nv = sub->add_constant(v->name, f->second);
          } else {
            nv = sub->add_input(v->name, v->type);
            p.inputs.push_back(v);
          }
          it = map.emplace(v, nv).first;
        }
        ins.push_back(it->second);
      }
      sub->add_copy(*n, std::move(ins), map);
    }
    for (const Value* v : p.outputs) sub->outputs.push_back(map.at(v));
    p.graph = std::move(sub);
    part_index[k] = static_cast<int>(plan.partitions.size());
    plan.partitions.push_back(std::move(p));
  }
  // Steps: breaks that need no partition, then each partition followed by the breaks after it.
  for (int k = -1; k < nparts; ++k) {
    if (k >= 0 && part_index[k] >= 0) plan.steps.push_back({false, part_index[k]});
    for (size_t b = 0; b < plan.breaks.size(); ++b)
      if (plan.breaks[b].after_partition == k) plan.steps.push_back({true, static_cast<int>(b)});
  }
  // Partition indices in the breaks refer to the kept partitions.
  for (auto& b : plan.breaks) {
    int a = b.after_partition;
    while (a >= 0 && part_index[a] < 0) --a;
    b.after_partition = a >= 0 ? part_index[a] : -1;
  }
  return plan;
}

// ---- repairs -----------------------------------------------------------------------------------

namespace {

// Moves the nodes appended since `first_new` to just before `before` (keeping their order).
void move_before(Graph& g, size_t first_new, const Node* before) {
  auto& nodes = g.mutable_nodes();
  auto pos = std::find_if(nodes.begin(), nodes.end(), [&](const auto& p) { return p.get() == before; });
  std::rotate(pos, nodes.begin() + static_cast<std::ptrdiff_t>(first_new), nodes.end());
}

Value* add_const_i64(Graph& g, const std::string& base, const std::vector<int64_t>& v) {
  return g.add_constant(g.unique_name(base), Tensor::from_i64(DType::i64, {static_cast<int64_t>(v.size())}, v));
}

const OpDef* op(const char* name) {
  const OpDef* d = OpRegistry::get().find(name);
  if (!d) fail("op {} is not registered", name);
  return d;
}

}  // namespace

std::vector<RepairRecord> repair_breaks(Graph& g) {
  infer_graph(g);
  std::vector<RepairRecord> done;
  std::set<const Node*> dead;
  for (;;) {
    bool changed = false;
    for (const auto& up : g.nodes()) {
      Node* n = up.get();
      if (dead.count(n)) continue;
      if (auto m = match_nonzero(g, *n)) {
        Value* mask = n->inputs[0];
        Value* x = m->gather->inputs[0];
        Node* first = m->row_ops.empty() ? m->reduce : m->row_ops.front();
        Value* y = m->row_ops.empty() ? m->gather->outputs[0] : m->row_ops.back()->outputs[0];
        for (auto& in : first->inputs)
          if (in == m->gather->outputs[0]) in = x;
        // y's rank is unchanged; its first dim becomes the mask's length.
        const int64_t rank = static_cast<int64_t>(y->type.shape.size());
        const size_t first_new = g.nodes().size();
        const std::string base = n->name + ".repair";
        if (mask->type.dtype != DType::boolean)
          mask = g.add_node(op("Cast"), base + "/cast", {mask}, {g.unique_name(base + "/mask")},
                            {{"to", int64_t{dtype_to_onnx(DType::boolean)}}})->outputs[0];
        if (rank > 1) {
          std::vector<int64_t> axes;
          for (int64_t d = 1; d < rank; ++d) axes.push_back(d);
          mask = g.add_node(op("Unsqueeze"), base + "/unsqueeze", {mask, add_const_i64(g, base + "/axes", axes)},
                            {g.unique_name(base + "/mask_rows")})->outputs[0];
        }
        Value* zero = g.add_constant(g.unique_name(base + "/zero"), Tensor::scalar_f(y->type.dtype, 0.0));
        Value* w = g.add_node(op("Where"), base + "/where", {mask, y, zero}, {g.unique_name(base + "/masked")})->outputs[0];
        m->reduce->inputs[0] = w;
        move_before(g, first_new, m->reduce);
        dead.insert(n);
        dead.insert(m->gather);
        for (Node* c : m->index_chain) dead.insert(c);
        done.push_back({"nonzero-gather-reduce", n->name,
                        fmt::format("{} row-wise op(s) on all {} rows of '{}', Where(mask, ., 0) before '{}'",
                                    m->row_ops.size(), x->type.shape[0], x->name, m->reduce->name)});
        changed = true;
        break;
      }
      if (auto m = match_compress(g, *n)) {
        Value* x = n->inputs[0];
        Value* c = n->inputs[1];
        const size_t first_new = g.nodes().size();
        const std::string base = n->name + ".repair";
        const int64_t rank = static_cast<int64_t>(x->type.shape.size());
        if (n->has_attr("axis")) {
          int64_t axis = n->attr_i("axis");
          if (axis < 0) axis += rank;
          std::vector<int64_t> shape(rank, 1);
          shape[axis] = x->type.shape[axis];
          if (rank > 1)
            c = g.add_node(op("Reshape"), base + "/reshape_mask", {c, add_const_i64(g, base + "/shape", shape)},
                           {g.unique_name(base + "/mask")})->outputs[0];
        } else if (rank != 1) {
          x = g.add_node(op("Reshape"), base + "/flatten", {x, add_const_i64(g, base + "/shape", {-1})},
                         {g.unique_name(base + "/flat")})->outputs[0];
        }
        Value* zero = g.add_constant(g.unique_name(base + "/zero"), Tensor::scalar_f(x->type.dtype, 0.0));
        Value* w = g.add_node(op("Where"), base + "/where", {c, x, zero}, {g.unique_name(base + "/masked")})->outputs[0];
        m->reduce->inputs[0] = w;
        move_before(g, first_new, m->reduce);
        dead.insert(n);
        done.push_back({"compress-reduce", n->name, fmt::format("Where(mask, x, 0) summed by '{}'", m->reduce->name)});
        changed = true;
        break;
      }
    }
    if (!changed) break;
    // Re-infer so that later matches see the now static shapes.
    g.erase_nodes_if([&](const Node& n) { return dead.count(&n) > 0; });
    dead.clear();
    g.compact();
    infer_graph(g);
  }
  return done;
}

// ---- running -----------------------------------------------------------------------------------

struct PartitionedExecutable::Compiled {
  std::unique_ptr<CompiledExecutable> compiled;
  std::unique_ptr<GraphExecutable> graph;
  std::unique_ptr<Graph> eager;
};

PartitionedExecutable::PartitionedExecutable() = default;
PartitionedExecutable::~PartitionedExecutable() = default;

namespace {

// The graph's output aliases as partition `p`'s (by its own input and output positions), when `p` is
// the whole graph: one partition and no break. Empty otherwise (nothing aliased).
std::vector<int> partition_aliases(const Graph& g, const PartitionPlan& plan, const Partition& p,
                                   const std::vector<int>& aliases) {
  if (aliases.empty() || plan.partitions.size() != 1 || !plan.breaks.empty()) return {};
  std::vector<int> out(p.outputs.size(), -1);
  bool any = false;
  for (size_t k = 0; k < aliases.size() && k < g.outputs.size(); ++k) {
    const int i = aliases[k];
    if (i < 0 || static_cast<size_t>(i) >= g.inputs.size()) continue;
    const auto o = std::find(p.outputs.begin(), p.outputs.end(), g.outputs[k]);
    const auto m = std::find(p.inputs.begin(), p.inputs.end(), g.inputs[static_cast<size_t>(i)]);
    if (o == p.outputs.end() || m == p.inputs.end() || out[static_cast<size_t>(o - p.outputs.begin())] >= 0) continue;
    out[static_cast<size_t>(o - p.outputs.begin())] = static_cast<int>(m - p.inputs.begin());
    any = true;
  }
  return any ? out : std::vector<int>{};
}

}  // namespace

std::unique_ptr<PartitionedExecutable> PartitionedExecutable::build(std::unique_ptr<Graph> g,
                                                                     const PartitionedOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<PartitionedExecutable> exe(new PartitionedExecutable());
  exe->graph_ = std::move(g);
  exe->plan_ = partition_graph(*exe->graph_);
  if (opts.backend != "eager" && opts.backend != "graph" && opts.backend != "compiled")
    throw Error(Location{.pass = "compile"}, fmt::format("unknown backend '{}' (eager, graph or compiled)", opts.backend));
  for (size_t k = 0; k < exe->plan_.partitions.size(); ++k) {
    Partition& p = exe->plan_.partitions[k];
    auto c = std::make_unique<Compiled>();
    try {
      if (opts.backend == "compiled") {
        CompiledBackendOptions co;
        co.threads = opts.threads;
        co.model_name = p.graph->name;
        co.output_aliases = partition_aliases(*exe->graph_, exe->plan_, p, opts.output_aliases);
        co.optional_aliases = true;
        c->compiled = compile_cpu(std::move(p.graph), {}, co);
      } else if (opts.backend == "graph") {
        c->graph = compile_graph(std::move(p.graph), {});
      } else {
        c->eager = std::move(p.graph);
      }
    } catch (const Error& e) {
      throw e.with_context(Location{.node = p.nodes.front()->name, .op = p.nodes.front()->op_name(),
                                    .pass = fmt::format("compile partition {}", k)});
    }
    exe->compiled_.push_back(std::move(c));
  }
  exe->compile_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return exe;
}

PartitionedExecutable::AliasCounts PartitionedExecutable::alias_counts() const {
  AliasCounts a;
  for (const auto& c : compiled_)
    if (c->compiled) {
      const GraphCompileStats& s = c->compiled->stats().graph;
      a.in_place += s.outputs_in_place;
      a.copied_back += s.outputs_copied_back;
      a.dropped += s.aliases_dropped;
    }
  return a;
}

std::vector<Tensor> PartitionedExecutable::run(const std::vector<Tensor>& inputs, const BreakRunner& runner) {
  return run_partition_plan(*graph_, plan_, inputs, [this](size_t k, const std::vector<Tensor>& ins) {
    Compiled& c = *compiled_[k];
    return c.compiled ? c.compiled->run(ins) : c.graph ? c.graph->run(ins) : run_eager(*c.eager, ins);
  }, runner);
}

std::vector<Tensor> run_partition_plan(const Graph& g, const PartitionPlan& plan, const std::vector<Tensor>& inputs,
                                       const PartitionRunner& run_partition, const BreakRunner& runner) {
  if (inputs.size() != g.inputs.size())
    throw Error(Location{.pass = "run"}, fmt::format("the model takes {} inputs but {} were given", g.inputs.size(), inputs.size()));
  std::vector<Tensor> env(g.values().size());
  std::vector<char> have(g.values().size(), 0);
  auto put = [&](const Value* v, Tensor t) {
    env[v->id] = std::move(t);
    have[v->id] = 1;
  };
  for (size_t i = 0; i < inputs.size(); ++i) put(g.inputs[i], inputs[i]);
  for (const Value* v : g.constants()) put(v, *v->constant);
  for (const auto& [v, t] : plan.folded) put(v, t);
  auto get = [&](const Value* v) -> const Tensor& {
    if (!have[v->id]) throw Error(Location{.pass = "run"}, fmt::format("value '{}' was not computed", v->name));
    return env[v->id];
  };
  for (const PartitionStep& s : plan.steps) {
    if (!s.is_break) {
      const Partition& p = plan.partitions[s.index];
      std::vector<Tensor> ins;
      for (const Value* v : p.inputs) ins.push_back(get(v));
      std::vector<Tensor> outs = run_partition(static_cast<size_t>(s.index), ins);
      if (outs.size() < p.outputs.size())
        throw Error(Location{.pass = "run"}, fmt::format("partition {} gave {} results for {} outputs", s.index, outs.size(),
                                                         p.outputs.size()));
      for (size_t i = 0; i < p.outputs.size(); ++i) put(p.outputs[i], std::move(outs[i]));
      continue;
    }
    const GraphBreak& b = plan.breaks[s.index];
    const Node& n = *b.node;
    std::vector<Tensor> ins;
    for (const Value* v : n.inputs) ins.push_back(v ? get(v) : Tensor());
    std::vector<Tensor> outs;
    if (runner) outs = runner(n, ins);
    if (outs.empty()) {
      std::vector<const Tensor*> ptrs;
      for (size_t i = 0; i < ins.size(); ++i) ptrs.push_back(n.inputs[i] ? &ins[i] : nullptr);
      try {
        outs = run_node(n, ptrs);
      } catch (const Error& e) {
        throw e.with_context(Location{.node = n.name, .op = n.op_name(), .pass = "run break"});
      }
    }
    if (outs.size() < n.outputs.size())
      throw Error(Location{.node = n.name, .op = b.op, .pass = "run break"},
                  fmt::format("gave {} results for {} outputs", outs.size(), n.outputs.size()));
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      const Value* v = n.outputs[i];
      if (!v) continue;
      const Tensor& t = outs[i];
      bool ok = t.dtype() == v->type.dtype && t.shape().size() == v->type.shape.size();
      for (size_t d = 0; ok && d < t.shape().size(); ++d) ok = v->type.shape[d] < 0 || v->type.shape[d] == t.shape()[d];
      if (!ok)
        throw Error(Location{.node = n.name, .op = b.op, .pass = "run break"},
                    fmt::format("output {} is {} but the graph expects {}", i, TensorType{t.dtype(), t.shape()}.str(),
                                v->type.str()));
      put(v, std::move(outs[i]));
    }
  }
  std::vector<Tensor> results;
  for (const Value* v : g.outputs) results.push_back(get(v));
  return results;
}

}  // namespace tessel
