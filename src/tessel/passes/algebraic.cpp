// algebraic: local rewrites of core ops that never change a result (docs/passes/algebraic.md):
// identities (x·1, x+0, x/1, −(−x), pow(x, 1)), chains that collapse (transpose∘transpose,
// reshape∘reshape, broadcast∘broadcast, widening convert chains), ops that do nothing (identity
// transpose, reshape to the same shape, a whole-tensor slice, select on a constant predicate),
// elementwise math on broadcast scalars, which moves in front of the broadcast so fold-constants can
// evaluate it on one element, and elementwise math on a reshaped product, which moves in front of the
// reshape so fusion can put it in the product's kernel; products over one element become multiplies,
// and a product whose operand repeats along its batch (grouped-query attention's repeat_kv) reads the
// unrepeated operand with the repeated heads as rows. The rules are a list run by the shared driver
// (rewrite.h): one forward walk, the first rule that fires on a node wins, and a rewrite edits the node
// in place or replaces its result by an existing value.
#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include "tessel/ir/core_ops.h"
#include "tessel/ir/op_registry.h"
#include "tessel/passes/pass.h"
#include "tessel/passes/pass_util.h"
#include "tessel/passes/rewrite.h"

namespace tessel {
namespace {

Value* in(const Node& n, int i) { return n.inputs[static_cast<size_t>(i)]; }
Value* out(const Node& n) { return n.outputs[0]; }
bool splat_is(const Value* v, double x) { return splat_of(v) == x; }

// Whether a node's types or attributes name a size symbol (docs/dynamic-shapes.md). The rules that
// compare sizes do it on Dims; the ones that build new shapes from static ones (the sinks and the
// pad sum) leave such nodes as they are.
bool touches_symbols(const Node& n) {
  if (n.has_symbolic_attr()) return true;
  for (const Value* v : n.inputs)
    if (v && v->type.symbolic()) return true;
  for (const Value* v : n.outputs)
    if (v && v->type.symbolic()) return true;
  return false;
}
std::function<bool(const Node&)> static_only(std::function<bool(const Node&)> match) {
  return [match = std::move(match)](const Node& n) { return !touches_symbols(n) && (!match || match(n)); };
}
bool same_dims(const Value* a, const Value* b) { return a->type.dims() == b->type.dims(); }

// A rule whose rewrite replaces the node's result by one of its operands.
RewriteRule forward_operand(std::string name, CoreOp op, std::function<bool(const Node&)> match, int operand) {
  return {std::move(name), {op}, std::move(match),
          [operand](Rewriter& r, Node& n) { return r.replace(n, in(n, operand)); }};
}

// ---- transpose, reshape ----

bool compose_transposes(Rewriter& r, Node& n) {
  const Node* p = core_producer(in(n, 0), CoreOp::transpose);
  std::vector<int64_t> perm = n.attr_ints("perm"), inner = p->attr_ints("perm"), composed(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) composed[i] = inner[static_cast<size_t>(perm[i])];
  n.inputs[0] = p->inputs[0];
  n.attrs["perm"] = composed;
  // An identity composition goes too; if its result cannot be replaced the composed node stays,
  // uncounted, and the identity-transpose rule below tries (and fails) the same replacement.
  return !is_identity(composed) || r.replace(n, in(n, 0));
}

bool compose_reshapes(Rewriter& r, Node& n) {
  n.inputs[0] = core_producer(in(n, 0), CoreOp::reshape)->inputs[0];
  if (same_dims(in(n, 0), out(n))) r.replace(n, in(n, 0));
  return true;
}

// ---- broadcast_in_dim ----
// The three broadcast steps run in order on one visit (compose with a broadcast operand, fold a
// unit-dim reshape operand, drop a broadcast to the same shape); the visit counts under the name of
// the last step that ran.

void compose_broadcasts(Node& n) {
  const Node* p = core_producer(in(n, 0), CoreOp::broadcast_in_dim);
  // Operand dim i of the inner broadcast lands at inner_dims[i], which this one maps to dims[...].
  std::vector<int64_t> dims = n.attr_ints("dims"), composed;
  for (int64_t d : p->attr_ints("dims")) composed.push_back(dims[static_cast<size_t>(d)]);
  n.inputs[0] = p->inputs[0];
  n.attrs["dims"] = composed;
}

// A reshape operand that only inserts or drops size-1 dims (the keepdims of a reduction) folds into
// the broadcast: each non-unit source dim keeps its place in order. False, and nothing changed, when
// the operand is not such a reshape.
bool fold_unit_dim_reshape(Node& n) {
  const Node* p = core_producer(in(n, 0), CoreOp::reshape);
  if (!p) return false;
  const std::vector<int64_t> dims = n.attr_ints("dims");
  const Dims src = p->inputs[0]->type.dims();
  const Dims mid = in(n, 0)->type.dims();
  std::vector<int64_t> composed;
  size_t j = 0;
  bool ok = true;
  for (size_t i = 0; i < src.size() && ok; ++i) {
    if (src[i] == 1) {  // a unit source dim may go anywhere a broadcast can put it
      while (j < mid.size() && !(mid[j] == 1)) ++j;
    } else {
      while (j < mid.size() && mid[j] == 1) ++j;
      ok = j < mid.size() && mid[j] == src[i];
    }
    if (j >= mid.size()) ok = false;
    if (ok) composed.push_back(dims[j++]);
  }
  for (; ok && j < mid.size(); ++j) ok = mid[j] == 1;
  if (!ok) return false;
  n.inputs[0] = p->inputs[0];
  n.attrs["dims"] = composed;
  return true;
}

bool broadcast_is_noop(const Node& n) {
  return same_dims(in(n, 0), out(n)) && is_identity(n.attr_ints("dims"));
}

// The last step, after an earlier one changed the node.
void drop_noop_broadcast(Rewriter& r, Node& n) {
  if (broadcast_is_noop(n) && r.replace(n, in(n, 0))) r.count_as("broadcast to the same shape");
}

bool simplify_broadcast_chain(Rewriter& r, Node& n) {
  compose_broadcasts(n);
  if (fold_unit_dim_reshape(n)) r.count_as("broadcast∘reshape");
  drop_noop_broadcast(r, n);
  return true;
}

bool simplify_broadcast_of_reshape(Rewriter& r, Node& n) {
  if (!fold_unit_dim_reshape(n)) return false;
  drop_noop_broadcast(r, n);
  return true;
}

// ---- convert ----

bool converts_exactly_twice(const Node& n) {
  const Node* p = core_producer(in(n, 0), CoreOp::convert);
  return p && converts_exactly(p->inputs[0]->type.dtype, in(n, 0)->type.dtype);
}

bool compose_converts(Rewriter& r, Node& n) {
  // The inner convert lost nothing, so converting its source directly gives the same values.
  n.inputs[0] = in(n, 0)->producer->inputs[0];
  if (in(n, 0)->type.dtype == out(n)->type.dtype) r.replace(n, in(n, 0));
  return true;
}

// ---- ops that copy their operand ----

bool is_noop_copy(const Node& n) {
  if (in(n, 0)->type != out(n)->type) return false;
  const std::optional<CoreOp> op = n.op->core;
  if (op == CoreOp::concatenate) return n.inputs.size() == 1;
  if (op == CoreOp::reduce) return n.attr_ints("axes").empty();
  if (op == CoreOp::slice) {
    const Dims st = n.attr_dims("starts"), sp = n.attr_dims("stops"), dims = in(n, 0)->type.dims();
    auto str = n.attr_ints("strides", std::vector<int64_t>(st.size(), 1));
    for (size_t d = 0; d < st.size(); ++d)
      if (!(st[d] == 0) || str[d] != 1 || !(sp[d] == dims[d])) return false;
    return true;
  }
  if (op == CoreOp::pad) {
    for (const char* a : {"low", "high", "interior"})
      for (int64_t v : n.attr_ints(a, {}))
        if (v != 0) return false;
    return true;
  }
  return false;
}

// ---- a sum of zero-pads of adjacent blocks ----
// Slice's VJP pads each slice's cotangent with zeros to the operand's shape, so a split's gradient is
// add(add(pad(gq), pad(gk)), pad(gv)): three zero-filled full-size buffers and two adds. When two pads
// by 0 (no interior padding, no cropping) place their operands in blocks that agree in every dim but
// one and touch along it, their sum is one pad of the two operands' concatenation: every element is
// either one operand's or a padding zero, as before (up to the sign of a zero: -0 + 0 is +0).
// Concatenated operands of the same axis are flattened, so a chain of sums becomes one concatenate, and
// the sum that covers the whole result is the concatenate itself.

struct ZeroPad {
  const Node* node = nullptr;
  std::vector<int64_t> low, high;
};

std::optional<ZeroPad> zero_pad(const Value* v) {
  const Node* p = core_producer(v, CoreOp::pad);
  if (!p || p->inputs.size() != 2 || !splat_is(p->inputs[1], 0)) return std::nullopt;
  ZeroPad z{p, p->attr_ints("low"), p->attr_ints("high")};
  const size_t r = v->type.shape.size();
  if (z.low.size() != r || z.high.size() != r) return std::nullopt;
  for (int64_t i : p->attr_ints("interior", {}))
    if (i != 0) return std::nullopt;
  for (size_t d = 0; d < r; ++d)
    if (z.low[d] < 0 || z.high[d] < 0) return std::nullopt;
  return z;
}

// The one dim along which pad `a`'s block ends where `b`'s begins, every other dim placed alike; -1 if
// there is none.
int64_t adjacent_dim(const ZeroPad& a, const ZeroPad& b, const Shape& out) {
  int64_t axis = -1;
  for (size_t d = 0; d < out.size(); ++d) {
    if (a.low[d] == b.low[d] && a.high[d] == b.high[d]) continue;
    if (axis >= 0 || out[d] - a.high[d] != b.low[d] || out[d] - a.high[d] == a.low[d] ||
        out[d] - b.high[d] == b.low[d])
      return -1;  // a second differing dim, a gap or overlap, or an empty block
    axis = static_cast<int64_t>(d);
  }
  return axis;
}

bool adds_adjacent_zero_pads(const Node& n) {
  auto a = zero_pad(in(n, 0)), b = zero_pad(in(n, 1));
  if (!a || !b || a->node == b->node) return false;
  const Shape& out_shape = out(n)->type.shape;
  return adjacent_dim(*a, *b, out_shape) >= 0 || adjacent_dim(*b, *a, out_shape) >= 0;
}

void append_concat_operands(std::vector<Value*>& to, Value* v, int64_t axis) {
  const Node* c = core_producer(v, CoreOp::concatenate);
  if (c && c->attr_i("axis") == axis) {
    to.insert(to.end(), c->inputs.begin(), c->inputs.end());
    return;
  }
  to.push_back(v);
}

Value* emit(Rewriter& r, const Node& at, CoreOp op, std::vector<Value*> ins, std::map<std::string, Attr> attrs,
            const std::string& suffix, const TensorType& type) {
  Graph& g = r.graph();
  auto node = std::make_unique<Node>();
  node->op = OpRegistry::get().find(std::string(core_op_name(op)));
  node->name = at.name;
  node->inputs = std::move(ins);
  node->outputs = {g.add_value(g.unique_name(at.outputs[0]->name + suffix), type)};
  node->attrs = std::move(attrs);
  return r.insert_before_visited(std::move(node));
}

// concatenate(reshape(transpose(x_i, P)), ...) along `axis` where every operand is the same transpose
// of operands that differ only along the transposed dim that lands first in the concatenated
// (merged) dim: the same as reshape(transpose(concatenate(x_i), P)) — one contiguous concatenate and
// one transpose copy instead of one transpose copy per operand and the concatenate. A split's gradient
// in attention is this: the heads of q, k and v, each [b, h, t, d] moved to [b, t, h·d]. The plan: the
// x_i (concatenates along the same dim flattened), the x dim to join and the transpose.
struct HoistPlan {
  std::vector<Value*> xs;
  int64_t x_axis = 0;
  std::vector<int64_t> perm;
  Shape x_shape;  // the joined x
};

std::optional<HoistPlan> hoist_transposes(const std::vector<Value*>& parts, int64_t axis) {
  if (parts.size() < 2) return std::nullopt;
  HoistPlan h;
  Shape t0;
  const auto a = static_cast<size_t>(axis);
  for (size_t i = 0; i < parts.size(); ++i) {
    const Value* v = parts[i];
    const Node* t = core_producer(v, CoreOp::transpose);
    if (!t)
      if (const Node* rs = core_producer(v, CoreOp::reshape)) t = core_producer(rs->inputs[0], CoreOp::transpose);
    if (!t) return std::nullopt;
    const Shape& ts = t->outputs[0]->type.shape;
    const Shape& rs = v->type.shape;
    if (ts.size() < rs.size() || a >= rs.size()) return std::nullopt;
    const size_t k = a + (ts.size() - rs.size());  // t dims a..k merge into the result's dim a
    int64_t merged = 1;
    for (size_t d = a; d <= k; ++d) merged *= ts[d];
    if (merged != rs[a]) return std::nullopt;
    for (size_t d = 0; d < rs.size(); ++d)
      if (d != a && rs[d] != ts[d < a ? d : d + (k - a)]) return std::nullopt;
    if (i == 0) {
      h.perm = t->attr_ints("perm");
      t0 = ts;
    } else {
      if (t->attr_ints("perm") != h.perm || ts.size() != t0.size()) return std::nullopt;
      for (size_t d = 0; d < ts.size(); ++d)
        if (d != a && ts[d] != t0[d]) return std::nullopt;
    }
    h.x_axis = h.perm[a];
    append_concat_operands(h.xs, t->inputs[0], h.x_axis);
  }
  h.x_shape = h.xs[0]->type.shape;
  h.x_shape[static_cast<size_t>(h.x_axis)] = 0;
  for (const Value* x : h.xs) h.x_shape[static_cast<size_t>(h.x_axis)] += x->type.shape[static_cast<size_t>(h.x_axis)];
  return h;
}

// Emits concatenate(parts) along `axis` of result type `type` in front of node `at` (hoisting a common
// transpose when it can), and returns the value.
Value* emit_concatenate(Rewriter& r, const Node& at, std::vector<Value*> parts, int64_t axis, const TensorType& type) {
  auto h = hoist_transposes(parts, axis);
  if (!h) return emit(r, at, CoreOp::concatenate, std::move(parts), {{"axis", axis}}, ".concat", type);
  const DType dt = type.dtype;
  Value* cx = emit(r, at, CoreOp::concatenate, h->xs, {{"axis", h->x_axis}}, ".concat", TensorType{dt, h->x_shape});
  Shape ts;
  for (int64_t p : h->perm) ts.push_back(h->x_shape[static_cast<size_t>(p)]);
  Value* ct = emit(r, at, CoreOp::transpose, {cx}, {{"perm", h->perm}}, ".transpose", TensorType{dt, ts});
  if (ts == type.shape) return ct;
  return emit(r, at, CoreOp::reshape, {ct}, {{"shape", std::vector<int64_t>(type.shape)}}, ".reshape", type);
}

bool pads_to_concatenate(Rewriter& r, Node& n) {
  ZeroPad a = *zero_pad(in(n, 0)), b = *zero_pad(in(n, 1));
  const Shape& out_shape = out(n)->type.shape;
  int64_t axis = adjacent_dim(a, b, out_shape);
  if (axis < 0) {
    std::swap(a, b);
    axis = adjacent_dim(a, b, out_shape);
  }
  const auto d = static_cast<size_t>(axis);
  std::vector<Value*> parts;
  append_concat_operands(parts, a.node->inputs[0], axis);
  append_concat_operands(parts, b.node->inputs[0], axis);
  Shape cshape = a.node->inputs[0]->type.shape;
  cshape[d] += b.node->inputs[0]->type.shape[d];
  Value* c = emit_concatenate(r, n, std::move(parts), axis, TensorType{out(n)->type.dtype, cshape});
  std::vector<int64_t> low = a.low, high = a.high;
  high[d] = b.high[d];
  bool covers = true;
  for (size_t i = 0; i < low.size(); ++i) covers = covers && low[i] == 0 && high[i] == 0;
  if (covers && r.replace(n, c)) return true;
  // The add becomes the pad, so its output value (and name) stays where it is.
  n.op = OpRegistry::get().find("pad");
  n.inputs = {c, a.node->inputs[1]};
  n.attrs = {{"low", low}, {"high", high}, {"interior", std::vector<int64_t>(out_shape.size(), 0)}};
  return true;
}

// ---- elementwise math on broadcast scalars ----

// The rank-0 value `v` broadcasts (v itself when rank 0), or a new rank-0 constant when `v` is a
// splat constant; null otherwise.
Value* scalar_source(Graph& g, Value* v) {
  if (v->type.shape.empty()) return v;
  if (const Node* p = core_producer(v, CoreOp::broadcast_in_dim); p && p->inputs[0]->type.shape.empty()) return p->inputs[0];
  if (v->constant && v->constant->numel() > 0 && splat_of(v)) {
    Tensor s = Tensor(v->type.dtype, {});
    std::memcpy(s.bytes(), v->constant->bytes(), dtype_size(v->type.dtype));
    return g.add_constant(g.unique_name(v->name + ".scalar"), std::move(s));
  }
  return nullptr;
}

// Convert has its own rules above and is left out, as the pass always has.
bool may_sink_broadcasts(const Node& n) {
  return n.op->fusion == FusionKind::pointwise && !is_core_op(n, CoreOp::convert) && !n.inputs.empty() &&
         !out(n)->type.shape.empty();
}

// op(broadcast(a), broadcast(b), ...) with every operand a broadcast of a rank-0 value (or a splat
// constant) → broadcast(op(a, b, ...)): the math runs once instead of once per element.
bool sink_scalar_broadcasts(Rewriter& r, Node& n) {
  Graph& g = r.graph();
  std::vector<Value*> scalars;
  for (Value* v : n.inputs) {
    Value* s = scalar_source(g, v);
    if (!s) return false;
    scalars.push_back(s);
  }
  Value* o = out(n);
  auto scalar_node = std::make_unique<Node>();
  scalar_node->op = n.op;
  scalar_node->name = n.name;
  scalar_node->inputs = scalars;
  scalar_node->outputs = {g.add_value(g.unique_name(o->name + ".scalar"), TensorType{o->type.dtype, {}})};
  scalar_node->attrs = n.attrs;
  Value* s = r.insert_before_visited(std::move(scalar_node));
  // The original node becomes the broadcast, so its output value (and name) stays where it is.
  n.op = OpRegistry::get().find("broadcast_in_dim");
  n.inputs = {s};
  n.attrs = {{"shape", std::vector<int64_t>(o->type.shape)}, {"dims", std::vector<int64_t>{}}};
  return true;
}

// ---- elementwise math below a reshape ----

// Whether `v` is a scalar broadcast to its shape: a broadcast of a rank-0 value or a splat constant.
bool is_broadcast_scalar(const Value* v) {
  if (const Node* p = core_producer(v, CoreOp::broadcast_in_dim); p && p->inputs[0]->type.shape.empty()) return true;
  return v->constant && v->constant->numel() > 0 && splat_of(v).has_value();
}

// A reshape's operand that was computed by a contraction or by elementwise math: a value whose kernel
// elementwise math can join (a matmul's epilogue, a loop over the same space). Null otherwise.
const Value* joinable_reshape_source(const Value* v) {
  const Node* p = core_producer(v, CoreOp::reshape);
  if (!p) return nullptr;
  const Node* xp = p->inputs[0]->producer;
  const bool joinable = xp && (is_core_op(*xp, CoreOp::dot_general) || is_core_op(*xp, CoreOp::convolution) ||
                               xp->op->fusion == FusionKind::pointwise);
  return joinable ? p->inputs[0] : nullptr;
}

// The dims of broadcast `b` (to shape `to`) as a broadcast to `src` when every dim it maps its operand to
// lies in the trailing dims `to` and `src` share (a bias over the last dim: [N] → [B, T, N] becomes
// [N] → [B·T, N]); nullopt when one does not.
std::optional<std::vector<int64_t>> broadcast_dims_in(const Node& b, const Shape& to, const Shape& src) {
  size_t common = 0;
  while (common < to.size() && common < src.size() && to[to.size() - 1 - common] == src[src.size() - 1 - common]) ++common;
  std::vector<int64_t> dims;
  for (int64_t d : b.attr_ints("dims")) {
    if (d < static_cast<int64_t>(to.size() - common)) return std::nullopt;
    dims.push_back(d - static_cast<int64_t>(to.size()) + static_cast<int64_t>(src.size()));
  }
  return dims;
}

// The shape to move elementwise node `n` to: that of the values its reshaped operands were computed in,
// when at least one operand is a reshape of a joinable value (joinable_reshape_source), all such have
// one shape, and every other operand is a broadcast of a scalar or into the trailing dims both shapes
// share (a bias over the last dim; another stays where its dims mean something); nullopt otherwise (also
// for shapes not known statically). From anything but a joinable
// value (an input, a constant, a gather) the moved math would be a loop of its own in front of the
// reader it was fused into.
std::optional<Shape> reshape_source_shape(const Node& n) {
  const Shape& o = out(n)->type.shape;
  if (n.op->fusion != FusionKind::pointwise || n.inputs.empty() || o.empty() || !shape_known(o)) return std::nullopt;
  std::optional<Shape> src;
  for (const Value* v : n.inputs) {
    if (const Value* x = joinable_reshape_source(v)) {
      if (src && *src != x->type.shape) return std::nullopt;
      src = x->type.shape;
    }
  }
  if (!src || !shape_known(*src)) return std::nullopt;
  for (const Value* v : n.inputs) {
    if (joinable_reshape_source(v) || is_broadcast_scalar(v)) continue;
    const Node* b = core_producer(v, CoreOp::broadcast_in_dim);
    // Any other operand (a residual) keeps the op where it is: the product's kernel would store the sum
    // instead of the product, and in bf16 storage round the larger sum (BERT-base bf16: max rel error
    // 1.3e-2 → 2.1e-2 with its residual adds moved; docs/decisions.md).
    if (!b || !broadcast_dims_in(*b, v->type.shape, *src)) return std::nullopt;
  }
  return src;
}

// op(reshape(x), b, ...) with b broadcasts → reshape(op(x, broadcast'(b), ...)): a
// reshape only renames the row-major elements, so elementwise math gives the same elements on either
// side of it. Below the reshape the math is over the shape its source was computed in, where fusion can
// put it in the source's kernel: GPT-2's MLP stores its product as [B·T, 3072] and reshapes it to
// [B, T, 3072] before the GELU, which then becomes the matmul's epilogue (on CUDA, cuBLASLt's GELU).
// Walking forward, the next elementwise node sees the new reshape and moves too; reshape∘reshape
// composes the last one with a reader's reshape back.
bool sink_reshape(Rewriter& r, Node& n) {
  Graph& g = r.graph();
  const std::optional<Shape> src = reshape_source_shape(n);
  if (!src) return false;
  auto insert = [&](const char* op, Value* from, const std::string& name, std::map<std::string, Attr> attrs) {
    auto m = std::make_unique<Node>();
    m->op = OpRegistry::get().find(op);
    m->name = n.name;
    m->inputs = {from};
    m->outputs = {g.add_value(g.unique_name(name), TensorType{from->type.dtype, *src})};
    m->attrs = std::move(attrs);
    return r.insert_before_visited(std::move(m));
  };
  std::vector<Value*> ins;
  for (Value* v : n.inputs) {
    if (is_broadcast_scalar(v)) {
      ins.push_back(insert("broadcast_in_dim", scalar_source(g, v), v->name + ".b",
                           {{"shape", std::vector<int64_t>(*src)}, {"dims", std::vector<int64_t>{}}}));
      continue;
    }
    if (const Node* b = core_producer(v, CoreOp::broadcast_in_dim)) {
      ins.push_back(insert("broadcast_in_dim", b->inputs[0], v->name + ".b",
                           {{"shape", std::vector<int64_t>(*src)}, {"dims", *broadcast_dims_in(*b, v->type.shape, *src)}}));
      continue;
    }
    ins.push_back(v->producer->inputs[0]);  // a reshape of a value of shape src (reshape_source_shape)
  }
  Value* o = out(n);
  auto moved = std::make_unique<Node>();
  moved->op = n.op;
  moved->name = n.name;
  moved->inputs = ins;
  moved->outputs = {g.add_value(g.unique_name(o->name + ".flat"), TensorType{o->type.dtype, *src})};
  moved->attrs = n.attrs;
  Value* m = r.insert_before_visited(std::move(moved));
  // The original node becomes the reshape, so its output value (and name) stays where it is.
  n.op = OpRegistry::get().find("reshape");
  n.inputs = {m};
  n.attrs = {{"shape", std::vector<int64_t>(o->type.shape)}};
  return true;
}

// ---- a product whose operand repeats along its batch (grouped-query attention) ----
// Grouped-query attention repeats each key/value head for G query heads before the products
// (transformers' repeat_kv, SDPA's enable_gqa, ONNX Attention with fewer kv heads): a broadcast to
// [.., KV, G, T, D], reshaped to [.., KV·G, T, D], copied whole on every call (a decoded token copies
// the whole cache G times). When the product's last batch dim holds G innermost, the G query heads of
// one group read the same matrix, so they are rows of one product instead:
//   dot_general(A[.., H, M, K], repeat(B)) = reshape(dot_general(reshape(A, [.., H/G, G·M, K]), B))
// with B the repeated value taken from the broadcast's operand by the same reshapes and transposes,
// G left out. Each output element is the same dot product of the same operands.

// Where the repeated axis (size G) sits in a value: its dim, and the product of the sizes inside that
// dim that vary faster than it. Sizes may be symbolic (a KV cache's length); the dim holding the repeat
// is then still a number.
struct RepeatAt {
  size_t dim = 0;
  Dim inner = 1;
};

// The repeat's place after a reshape from `in` to `out`; nullopt when it cannot be shown to stay whole
// inside one dim of `out` for every value of the symbols.
std::optional<RepeatAt> repeat_after_reshape(const Dims& in, const RepeatAt& at, int64_t g, const Dims& out) {
  Dim stride = at.inner;  // its stride in the row-major order of the elements
  for (size_t i = at.dim + 1; i < in.size(); ++i) stride *= in[i];
  Dim below = 1;  // the stride of out dim d
  for (size_t d = out.size(); d-- > 0;) {
    const Dim above = below * out[d];
    if (provably_ge(stride, below) && provably_ge(above, stride * g)) {
      auto inner = exact_div(stride, below);
      if (!inner || !exact_div(above, stride * g)) return std::nullopt;
      return RepeatAt{d, *inner};
    }
    below = above;
  }
  return std::nullopt;
}

// The dims without the repeat (its dim divided by G); nullopt when that dim is not a multiple of G.
std::optional<Dims> without_repeat(Dims d, const RepeatAt& at, int64_t g) {
  auto q = exact_div(d[at.dim], Dim(g));
  if (!q) return std::nullopt;
  d[at.dim] = *q;
  return d;
}

// The rhs of a product traced back to a broadcast that repeats it along one new axis: the broadcast's
// operand, the repeat's size, the reshapes and transposes from the broadcast to the rhs (in order)
// and the dims of each of their results without the repeat.
struct RepeatedOperand {
  Value* source = nullptr;
  Dims source_dims;  // the broadcast's dims with the repeated axis of size 1
  int64_t g = 1;
  std::vector<const Node*> chain;
  std::vector<Dims> unrepeated;  // per chain node, its result's dims without the repeat
  RepeatAt last;                 // in the rhs
};

std::optional<RepeatedOperand> repeated_operand(const Value* rhs) {
  std::vector<const Node*> chain;
  const Value* v = rhs;
  const Node* b = nullptr;
  for (int hops = 0; hops < 8 && v->producer; ++hops) {
    const Node* p = v->producer;
    if (!v->type.dims_defined()) return std::nullopt;
    if (is_core_op(*p, CoreOp::broadcast_in_dim)) {
      b = p;
      break;
    }
    if (!is_core_op(*p, CoreOp::reshape) && !is_core_op(*p, CoreOp::transpose)) return std::nullopt;
    chain.push_back(p);
    v = p->inputs[0];
  }
  if (!b || chain.empty() || !b->inputs[0]->type.dims_defined()) return std::nullopt;
  std::reverse(chain.begin(), chain.end());
  const Dims to = b->outputs[0]->type.dims();
  const Dims from = b->inputs[0]->type.dims();
  const std::vector<int64_t> dims = b->attr_ints("dims", {});
  if (dims.size() != from.size()) return std::nullopt;
  // One axis repeated (new, or of size 1 in the operand) by a number, every other one the operand's own,
  // in order.
  std::optional<size_t> axis;
  std::vector<bool> mapped(to.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const auto d = static_cast<size_t>(dims[i]);
    if (dims[i] < 0 || d >= to.size() || (i > 0 && dims[i] <= dims[i - 1])) return std::nullopt;
    mapped[d] = true;
    if (from[i] == to[d]) continue;
    if (!(from[i] == 1) || axis) return std::nullopt;
    axis = d;
  }
  for (size_t d = 0; d < to.size(); ++d) {
    if (mapped[d]) continue;
    if (axis) return std::nullopt;
    axis = d;
  }
  if (!axis || !to[*axis].is_static() || to[*axis].value() < 2) return std::nullopt;
  RepeatedOperand r;
  r.source = b->inputs[0];
  r.g = to[*axis].value();
  r.source_dims = to;
  r.source_dims[*axis] = 1;
  RepeatAt at{*axis, 1};
  Dims shape = to;
  for (const Node* c : chain) {
    const Dims o = c->outputs[0]->type.dims();
    if (is_core_op(*c, CoreOp::transpose)) {
      const std::vector<int64_t> perm = c->attr_ints("perm");
      auto it = std::find(perm.begin(), perm.end(), static_cast<int64_t>(at.dim));
      if (it == perm.end()) return std::nullopt;
      at.dim = static_cast<size_t>(it - perm.begin());
    } else {
      auto next = repeat_after_reshape(shape, at, r.g, o);
      if (!next) return std::nullopt;
      at = *next;
    }
    auto u = without_repeat(o, at, r.g);
    if (!u) return std::nullopt;
    r.unrepeated.push_back(std::move(*u));
    shape = o;
  }
  r.chain = std::move(chain);
  r.last = at;
  return r;
}

// The product's batch dims are its operands' leading dims, the lhs is [batch.., M, K], and the rhs
// repeats along the last batch dim with nothing inside it: the plan, else nullopt (the rule then leaves
// the node as it is).
std::optional<RepeatedOperand> grouped_product(const Node& n) {
  const Value* lhs = in(n, 0);
  const Value* rhs = in(n, 1);
  if (!lhs->type.dims_defined() || !rhs->type.dims_defined() || !out(n)->type.dims_defined()) return std::nullopt;
  const Dims ls = lhs->type.dims();
  if (ls.size() < 3 || rhs->type.shape.size() != ls.size()) return std::nullopt;
  const size_t nb = ls.size() - 2;
  std::vector<int64_t> batch(nb);
  for (size_t i = 0; i < nb; ++i) batch[i] = static_cast<int64_t>(i);
  const auto nb64 = static_cast<int64_t>(nb);
  if (n.attr_ints("lhs_batch", {}) != batch || n.attr_ints("rhs_batch", {}) != batch) return std::nullopt;
  if (n.attr_ints("lhs_contract", {}) != std::vector<int64_t>{nb64 + 1}) return std::nullopt;
  const std::vector<int64_t> rc = n.attr_ints("rhs_contract", {});
  if (rc != std::vector<int64_t>{nb64} && rc != std::vector<int64_t>{nb64 + 1}) return std::nullopt;
  auto r = repeated_operand(rhs);
  if (!r || r->last.dim != nb - 1 || !(r->last.inner == 1) || !exact_div(ls[nb - 1], Dim(r->g))) return std::nullopt;
  return r;
}

bool ungroup_product(Rewriter& r, Node& n) {
  const auto plan = grouped_product(n);
  if (!plan) return false;
  const int64_t g = plan->g;
  const size_t nb = in(n, 0)->type.shape.size() - 2;
  auto grouped = [&](Dims d) {  // [.., H, M, X] as [.., H/G, G·M, X]
    d[nb - 1] = *exact_div(d[nb - 1], Dim(g));
    d[nb] = d[nb] * g;
    return d;
  };
  auto add = [&](CoreOp op, Value* x, std::map<std::string, Attr> attrs, const char* suffix, const Dims& d) {
    return emit(r, n, op, {x}, std::move(attrs), suffix, TensorType::of(x->type.dtype, d));
  };
  // B: the broadcast's operand through the same reshapes and transposes without the repeat; a run of
  // reshapes becomes one.
  Value* b = plan->source;
  Dims pending = plan->source_dims;  // the broadcast's dims, the repeat's axis of size 1
  auto reshape_to_pending = [&] {
    if (!(b->type.dims() == pending)) b = add(CoreOp::reshape, b, {{"shape", dims_attr(pending)}}, ".ungrouped", pending);
  };
  for (size_t i = 0; i < plan->chain.size(); ++i) {
    const Node& c = *plan->chain[i];
    if (is_core_op(c, CoreOp::transpose)) {
      reshape_to_pending();
      b = add(CoreOp::transpose, b, {{"perm", c.attr_ints("perm")}}, ".ungrouped", plan->unrepeated[i]);
    }
    pending = plan->unrepeated[i];
  }
  reshape_to_pending();
  // A: the G heads of a group as G·M rows.
  Value* a = in(n, 0);
  const Dims as = grouped(a->type.dims());
  a = add(CoreOp::reshape, a, {{"shape", dims_attr(as)}}, ".grouped", as);
  Value* o = out(n);
  auto prod = std::make_unique<Node>();
  prod->op = n.op;
  prod->name = n.name;
  prod->inputs = {a, b};
  prod->outputs = {r.graph().add_value(r.graph().unique_name(o->name + ".grouped"),
                                       TensorType::of(o->type.dtype, grouped(o->type.dims())))};
  prod->attrs = n.attrs;
  Value* m = r.insert_before_visited(std::move(prod));
  // The product node becomes the reshape back, so its output value (and name) stays where it is.
  n.op = OpRegistry::get().find("reshape");
  n.inputs = {m};
  n.attrs = {{"shape", dims_attr(o->type.dims())}};
  return true;
}

// ---- a product over a contraction of size 1 ----
// A dot_general whose contracted dims all have size 1 sums one product per element: it is the
// elementwise product of its operands broadcast to the result (an outer product; transformers' rotary
// embedding computes its angles as inv_freq[.., D/2, 1] @ positions[.., 1, T]), a loop fusion can join
// instead of a library call. Up to the sign of a zero (0 + -0 is +0), as x+0.

// The broadcast dims of a product's operand (its dims without the contracted ones, in order) into the
// result [batch.., lhs free.., rhs free..]; nullopt unless they come out increasing (no transpose).
std::optional<std::vector<int64_t>> operand_dims_in_result(size_t rank, const std::vector<int64_t>& batch,
                                                           const std::vector<int64_t>& contract, size_t free_at) {
  std::vector<int64_t> dims;
  size_t free = 0;
  for (size_t d = 0; d < rank; ++d) {
    const auto di = static_cast<int64_t>(d);
    if (std::find(contract.begin(), contract.end(), di) != contract.end()) continue;
    auto b = std::find(batch.begin(), batch.end(), di);
    dims.push_back(b != batch.end() ? b - batch.begin() : static_cast<int64_t>(free_at + free++));
  }
  for (size_t i = 1; i < dims.size(); ++i)
    if (dims[i] <= dims[i - 1]) return std::nullopt;
  return dims;
}

// Each operand of a product over one element: its broadcast dims into the result and its dims without
// the contracted ones; nullopt when the product is not one (or an operand's dims would be transposed).
struct OneElementOperand {
  std::vector<int64_t> dims;
  Shape kept;
};
std::optional<std::array<OneElementOperand, 2>> one_element_product(const Node& n) {
  const DType dt = out(n)->type.dtype;
  const std::vector<int64_t> lc = n.attr_ints("lhs_contract", {});
  if (lc.empty()) return std::nullopt;
  std::array<OneElementOperand, 2> ops;
  size_t free_at = n.attr_ints("lhs_batch", {}).size();
  for (int side = 0; side < 2; ++side) {
    const Shape& s = in(n, side)->type.shape;
    if (in(n, side)->type.dtype != dt || !shape_known(s)) return std::nullopt;
    const std::vector<int64_t> contract = n.attr_ints(side == 0 ? "lhs_contract" : "rhs_contract", {});
    for (int64_t d : contract)
      if (d < 0 || static_cast<size_t>(d) >= s.size() || s[static_cast<size_t>(d)] != 1) return std::nullopt;
    auto dims = operand_dims_in_result(s.size(), n.attr_ints(side == 0 ? "lhs_batch" : "rhs_batch", {}), contract, free_at);
    if (!dims) return std::nullopt;
    OneElementOperand& o = ops[static_cast<size_t>(side)];
    o.dims = std::move(*dims);
    for (size_t d = 0; d < s.size(); ++d)
      if (std::find(contract.begin(), contract.end(), static_cast<int64_t>(d)) == contract.end()) o.kept.push_back(s[d]);
    free_at = o.dims.empty() ? free_at : static_cast<size_t>(o.dims.back()) + 1;  // the rhs's free dims follow the lhs's
  }
  return ops;
}

bool product_to_multiply(Rewriter& r, Node& n) {
  const auto plan = one_element_product(n);
  if (!plan) return false;
  const Shape o = out(n)->type.shape;
  std::vector<Value*> ins;
  for (int side = 0; side < 2; ++side) {
    const OneElementOperand& op = (*plan)[static_cast<size_t>(side)];
    Value* v = in(n, side);
    if (op.kept != v->type.shape)
      v = emit(r, n, CoreOp::reshape, {v}, {{"shape", std::vector<int64_t>(op.kept)}}, side == 0 ? ".lhs" : ".rhs",
               TensorType{v->type.dtype, op.kept});
    ins.push_back(emit(r, n, CoreOp::broadcast_in_dim, {v}, {{"shape", std::vector<int64_t>(o)}, {"dims", op.dims}},
                       side == 0 ? ".lhs_b" : ".rhs_b", TensorType{v->type.dtype, o}));
  }
  n.op = OpRegistry::get().find("mul");
  n.inputs = ins;
  n.attrs = {};
  return true;
}

// ---- the rule list: for each node the first rule (in this order) that fires ----

const std::vector<RewriteRule>& algebraic_rules() {
  static const std::vector<RewriteRule> rules = {
      forward_operand("x+0", CoreOp::add, [](const Node& n) { return splat_is(in(n, 1), 0); }, 0),
      forward_operand("x+0", CoreOp::add, [](const Node& n) { return splat_is(in(n, 0), 0); }, 1),
      forward_operand("x*1", CoreOp::mul, [](const Node& n) { return splat_is(in(n, 1), 1); }, 0),
      forward_operand("x*1", CoreOp::mul, [](const Node& n) { return splat_is(in(n, 0), 1); }, 1),
      forward_operand("x/1", CoreOp::div, [](const Node& n) { return is_float(out(n)->type.dtype) && splat_is(in(n, 1), 1); }, 0),
      forward_operand("pow(x,1)", CoreOp::pow, [](const Node& n) { return splat_is(in(n, 1), 1); }, 0),
      {"pow(x,2)", {CoreOp::pow}, [](const Node& n) { return is_float(out(n)->type.dtype) && splat_is(in(n, 1), 2); },
       [](Rewriter&, Node& n) {
         // x² is exact as x·x in the wider compute type, and cheaper everywhere.
         n.op = OpRegistry::get().find("mul");
         n.inputs[1] = n.inputs[0];
         return true;
       }},
      {"idempotent", {CoreOp::max, CoreOp::min, CoreOp::and_, CoreOp::or_}, [](const Node& n) { return in(n, 0) == in(n, 1); },
       [](Rewriter& r, Node& n) { return r.replace(n, in(n, 0)); }},
      {"-(-x)", {CoreOp::neg}, [](const Node& n) { return core_producer(in(n, 0), CoreOp::neg) != nullptr; },
       [](Rewriter& r, Node& n) { return r.replace(n, in(n, 0)->producer->inputs[0]); }},
      forward_operand("select(p,x,x)", CoreOp::select, [](const Node& n) { return in(n, 1) == in(n, 2); }, 1),
      {"select(const)", {CoreOp::select}, [](const Node& n) { return splat_of(in(n, 0)).has_value(); },
       [](Rewriter& r, Node& n) { return r.replace(n, *splat_of(in(n, 0)) != 0 ? in(n, 1) : in(n, 2)); }},
      {"transpose∘transpose", {CoreOp::transpose}, [](const Node& n) { return core_producer(in(n, 0), CoreOp::transpose) != nullptr; },
       compose_transposes},
      forward_operand("transpose∘transpose", CoreOp::transpose, [](const Node& n) { return is_identity(n.attr_ints("perm")); }, 0),
      {"reshape∘reshape", {CoreOp::reshape}, [](const Node& n) { return core_producer(in(n, 0), CoreOp::reshape) != nullptr; },
       compose_reshapes},
      forward_operand("reshape∘reshape", CoreOp::reshape,
                      [](const Node& n) { return same_dims(in(n, 0), out(n)); }, 0),
      {"broadcast∘broadcast", {CoreOp::broadcast_in_dim},
       [](const Node& n) { return core_producer(in(n, 0), CoreOp::broadcast_in_dim) != nullptr; }, simplify_broadcast_chain},
      {"broadcast∘reshape", {CoreOp::broadcast_in_dim}, nullptr, simplify_broadcast_of_reshape},
      forward_operand("broadcast to the same shape", CoreOp::broadcast_in_dim, broadcast_is_noop, 0),
      forward_operand("convert to the same type", CoreOp::convert,
                      [](const Node& n) { return in(n, 0)->type.dtype == out(n)->type.dtype; }, 0),
      {"convert chain", {CoreOp::convert}, converts_exactly_twice, compose_converts},
      {"sum of adjacent zero-pads", {CoreOp::add}, static_only(adds_adjacent_zero_pads), pads_to_concatenate},
      {"no-op", {CoreOp::slice, CoreOp::concatenate, CoreOp::reduce, CoreOp::pad}, is_noop_copy,
       [](Rewriter& r, Node& n) { return r.replace(n, in(n, 0)); }},
      {"elementwise on broadcast scalars", {}, static_only(may_sink_broadcasts), sink_scalar_broadcasts},
      {"elementwise below a reshape", {}, static_only(nullptr), sink_reshape},
      {"product over one element", {CoreOp::dot_general}, static_only(nullptr), product_to_multiply},
      {"product of a repeated operand", {CoreOp::dot_general}, nullptr, ungroup_product},
  };
  return rules;
}

}  // namespace

std::string simplify_algebra(Graph& g) {
  Rewriter r(g);
  r.apply(algebraic_rules());
  g.compact();
  return r.note();
}

}  // namespace tessel
