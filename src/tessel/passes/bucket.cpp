// Padding a symbolic core graph to a bucket, with masks (see bucket.h).
#include "tessel/passes/bucket.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "tessel/ir/bind.h"
#include "tessel/ir/core_builder.h"
#include "tessel/ir/core_ops.h"
#include "tessel/ir/op_registry.h"
#include "tessel/support/error.h"
#include "tessel/support/escape.h"

namespace tessel {
namespace {

bool is_bare(const Dim& d, const std::string& s) {
  return d.constant_term() == 0 && d.terms().size() == 1 && d.terms()[0].coef == 1 && d.terms()[0].syms == std::vector<std::string>{s};
}
bool names(const Dim& d, const std::string& s) {
  const std::vector<std::string> syms = d.symbols();
  return std::find(syms.begin(), syms.end(), s) != syms.end();
}

[[noreturn]] void refuse(const Node& n, const std::string& why) {
  throw Error(Location{.node = n.name, .op = n.op_name(), .pass = "bucket"}, "cannot pad to a bucket: " + why, true);
}

// The dims of `v` (a value of the symbolic graph) at positions `axes` that must read padded positions
// through a mask: those that are the symbol alone. A dim that names it otherwise is refused.
std::vector<int> padded_axes(const Node& n, const Value* v, const std::vector<int64_t>& axes, const std::string& s,
                             const char* what) {
  std::vector<int> out;
  const Dims d = v->type.dims();
  for (int64_t a : axes) {
    const Dim& x = d.at(static_cast<size_t>(a));
    if (is_bare(x, s)) out.push_back(static_cast<int>(a));
    else if (names(x, s)) refuse(n, fmt::format("it {} over dim {} of size {}, which is not {} alone", what, a, x.str(), s));
  }
  return out;
}

// Every dim of `v` that names the symbol; refused when `moves` (the op moves positions along it).
void refuse_along(const Node& n, const Value* v, const std::vector<int64_t>& axes, const std::string& s, const char* what) {
  const Dims d = v->type.dims();
  for (int64_t a : axes)
    if (names(d.at(static_cast<size_t>(a)), s))
      refuse(n, fmt::format("it {} along dim {} of size {}: padded positions would move", what, a, d[static_cast<size_t>(a)].str()));
}

std::vector<int64_t> all_axes(const Value* v) {
  std::vector<int64_t> a(v->type.dims().size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int64_t>(i);
  return a;
}

// What a node of the symbolic graph needs: per operand, the axes to mask (and the value padded
// positions take there). Refuses what a mask cannot make right.
struct Masking {
  std::vector<std::vector<int>> axes;  // per operand
  double fill = 0;
};

Masking plan_node(const Node& n, const std::string& s) {
  Masking m;
  m.axes.resize(n.inputs.size());
  const auto op = core_op_of(n);
  if (!op) {
    if (n.op->name == "Sizes" && n.op->domain == "tessel") {
      for (const Dim& d : n.attr_dims("dims"))
        if (names(d, s)) refuse(n, fmt::format("it reads the size {} as data (padding would change it)", d.str()));
      return m;
    }
    for (const Value* v : n.inputs)
      if (v)
        for (const Dim& d : v->type.dims())
          if (names(d, s)) refuse(n, "it is not a core op (only core ops are padded)");
    return m;
  }
  const CoreOpInfo& info = core_op_info(*op);
  if (info.elementwise() || info.kind == CoreKind::convert || info.kind == CoreKind::bitcast) return m;
  switch (*op) {
    case CoreOp::broadcast_in_dim:
    case CoreOp::reshape:
    case CoreOp::transpose:
    case CoreOp::iota:
      return m;
    case CoreOp::reduce: {
      m.axes[0] = padded_axes(n, n.inputs[0], n.attr_ints("axes"), s, "reduces");
      const auto combiner = reduction_combiner(n.attr_s("kind"));
      if (!m.axes[0].empty() && !combiner) refuse(n, fmt::format("its reduction '{}' has no identity", n.attr_s("kind")));
      if (combiner) m.fill = core_op_info(*combiner).identity;
      return m;
    }
    case CoreOp::dot_general:
      m.axes[0] = padded_axes(n, n.inputs[0], n.attr_ints("lhs_contract"), s, "contracts");
      m.axes[1] = padded_axes(n, n.inputs[1], n.attr_ints("rhs_contract"), s, "contracts");
      return m;
    case CoreOp::convolution: {
      std::vector<int64_t> spatial;
      for (size_t d = 2; d < n.inputs[0]->type.dims().size(); ++d) spatial.push_back(static_cast<int64_t>(d));
      refuse_along(n, n.inputs[0], spatial, s, "slides a window");
      refuse_along(n, n.inputs[0], {1}, s, "contracts channels");
      return m;
    }
    case CoreOp::reduce_window:
    case CoreOp::sort:
    case CoreOp::scatter:
    case CoreOp::gather:
      refuse_along(n, n.inputs[0], all_axes(n.inputs[0]), s, "reads across positions");
      return m;
    case CoreOp::slice:
    case CoreOp::pad:
    case CoreOp::concatenate: {
      // Fine where the dims naming the symbol are kept whole.
      const Value* in = n.inputs[0];
      const Dims di = in->type.dims(), dout = n.outputs[0]->type.dims();
      for (size_t d = 0; d < di.size(); ++d)
        if (names(di[d], s) && !(di[d] == dout[d])) refuse(n, fmt::format("it cuts, pads or joins dim {} of size {}", d, di[d].str()));
      if (*op == CoreOp::concatenate)
        for (const Value* v : n.inputs)
          if (names(v->type.dims().at(static_cast<size_t>(n.attr_i("axis"))), s))
            refuse(n, "it joins along a dim that names the symbol");
      return m;
    }
    default:
      for (const Value* v : n.inputs)
        if (v)
          for (const Dim& d : v->type.dims())
            if (names(d, s)) refuse(n, "the op is not known to keep padded positions apart");
      return m;
  }
}

std::vector<int> bare_dims(const Value* v, const std::string& s, bool refuse_others, const char* what) {
  std::vector<int> out;
  const Dims d = v->type.dims();
  for (size_t i = 0; i < d.size(); ++i) {
    if (is_bare(d[i], s)) out.push_back(static_cast<int>(i));
    else if (refuse_others && names(d[i], s))
      throw Error(Location{.pass = "bucket"},
                  fmt::format("cannot pad to a bucket: {} '{}' has dim {} of size {}, which is not {} alone", what,
                              display_text(v->name), i, d[i].str(), s),
                  true);
  }
  return out;
}

}  // namespace

int64_t choose_bucket(const std::vector<int64_t>& buckets, int64_t length) {
  int64_t best = -1;
  for (int64_t b : buckets)
    if (b >= length && (best < 0 || b < best)) best = b;
  if (best < 0) {
    const int64_t largest = buckets.empty() ? 0 : *std::max_element(buckets.begin(), buckets.end());
    throw Error(Location{.pass = "bucket"}, fmt::format("no bucket holds length {} (the largest is {})", length, largest));
  }
  return best;
}

BucketedGraph pad_to_bucket(const Graph& core, const std::string& symbol, int64_t bucket, const Bindings& others) {
  if (bucket < 1) throw Error(Location{.pass = "bucket"}, fmt::format("bucket {} must be at least 1", bucket));
  BucketedGraph out;
  std::vector<Masking> plans;
  for (const auto& n : core.nodes()) plans.push_back(plan_node(*n, symbol));
  for (const Value* v : core.inputs) out.input_padded.push_back(bare_dims(v, symbol, true, "input"));
  for (const Value* v : core.outputs) out.output_padded.push_back(bare_dims(v, symbol, true, "output"));

  Bindings b = others;
  b[symbol] = bucket;
  std::unique_ptr<Graph> g = instantiate_graph(core, b);
  // Rebuilt in order: each node after the masks of its operands.
  auto o = std::make_unique<Graph>();
  o->name = g->name;
  o->symbols = g->symbols;
  std::map<const Value*, Value*> map;
  for (const Value* v : g->inputs) map[v] = o->add_input(v->name, v->type);
  out.valid_input = o->unique_name(symbol + ".valid");
  Value* valid = o->add_input(out.valid_input, TensorType{DType::boolean, {bucket}});
  for (const auto& v : g->values())
    if (v->constant && !v->producer && !v->is_input) map[v.get()] = o->add_constant(v->name, *v->constant);
  for (size_t k = 0; k < g->nodes().size(); ++k) {
    const Node& n = *g->nodes()[k];
    std::vector<Value*> ins;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      Value* x = n.inputs[i] ? map.at(n.inputs[i]) : nullptr;
      if (x && !plans[k].axes[i].empty()) {
        CoreBuilder cb(*o, n);
        Value* keep = nullptr;
        for (int a : plans[k].axes[i]) {
          Value* m = cb.emit(CoreOp::broadcast_in_dim, {valid}, {{"dims", std::vector<int64_t>{a}}, {"shape", std::vector<int64_t>(x->type.shape)}});
          keep = keep ? cb.emit(CoreOp::and_, {keep, m}) : m;
        }
        x = cb.select(keep, x, cb.full(x->type.dtype, x->type.shape, plans[k].fill));
        ++out.masks;
      }
      ins.push_back(x);
    }
    o->add_copy(n, std::move(ins), map);
  }
  for (const Value* v : g->outputs) o->outputs.push_back(map.at(v));
  out.graph = std::move(o);
  return out;
}

}  // namespace tessel
