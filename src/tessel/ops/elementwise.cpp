// Op family: elementwise arithmetic, math functions, comparisons, logical and bitwise ops, casts.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "tessel/ir/core_ops.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ir/op_registry.h"
#include "tessel/ops/decompose_util.h"
#include "tessel/ops/sym_util.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- dtype classes ---------------------------------------------------------------------------

// How a kernel must read an element: get_i reinterprets u64 as int64, so unsigned types need
// their own comparisons and division.
enum class Cls { f, s, u };
Cls cls_of(DType t) {
  return is_float(t) ? Cls::f : is_signed_int(t) ? Cls::s : Cls::u;
}

enum class Types { floats, signed_or_float, numeric, ints, unsigned_ints, boolean, any };

bool types_ok(Types ts, DType t) {
  switch (ts) {
    case Types::floats:
      return is_float(t);
    case Types::signed_or_float:
      return is_float(t) || is_signed_int(t);
    case Types::numeric:
      return is_float(t) || is_int(t);
    case Types::ints:
      return is_int(t);
    case Types::unsigned_ints:
      return is_unsigned_int(t);
    case Types::boolean:
      return is_bool(t);
    case Types::any:
      return true;
  }
  return false;
}

void check_types(const InferCtx& ctx, Types ts, int input) {
  DType t = ctx.in(input).dtype;
  if (!types_ok(ts, t))
    fail("{} is not defined for input {} of dtype {}", ctx.node().op_name(), input, dtype_name(t));
}

void check_same_dtype(const InferCtx& ctx) {
  for (int i = 1; i < ctx.num_inputs(); ++i)
    if (ctx.has_in(i) && ctx.in(i).dtype != ctx.in(0).dtype)
      fail("operands have different dtypes {} and {}", dtype_name(ctx.in(0).dtype),
           dtype_name(ctx.in(i).dtype));
}

std::optional<DType> dtype_of_onnx(int64_t t) { return dtype_from_onnx(static_cast<int>(t)); }

// round_mode only steers casts to float8e8m0 (default "up").
E8M0Round round_mode_of(const Node& n) {
  std::string m = n.attr_s("round_mode", "up");
  if (m == "up") return E8M0Round::up;
  if (m == "down") return E8M0Round::down;
  if (m == "nearest") return E8M0Round::nearest;
  fail("round_mode must be up, down or nearest, got '{}'", m);
}
void check_round_mode(const Node& n) { round_mode_of(n); }

DType to_attr_dtype(const Node& n) {
  int64_t to = n.attr_i("to");
  auto dt = dtype_of_onnx(to);
  if (!dt) {
    switch (to) {
      case 8:
        unsupported("casts to or from string tensors are not supported");
      case 14:
        unsupported("complex64 tensors are not supported");
      case 15:
        unsupported("complex128 tensors are not supported");
      default:
        break;
    }
    fail("'to' = {} is not an ONNX data type", to);
  }
  return *dt;
}

// ---- broadcasting loops ----------------------------------------------------------------------

// Calls f(out_index, a_index, b_index) over the numpy broadcast of shapes a and b into `out`.
template <typename F>
void for_each_bcast(const Shape& a, const Shape& b, const Shape& out, F&& f) {
  const int64_t n = shape_numel(out);
  if (a == out && b == out) {
    for (int64_t i = 0; i < n; ++i) f(i, i, i);
    return;
  }
  // A scalar operand (bias, epsilon, exponent) needs no index table.
  if (a == out && shape_numel(b) == 1) {
    for (int64_t i = 0; i < n; ++i) f(i, i, int64_t{0});
    return;
  }
  if (b == out && shape_numel(a) == 1) {
    for (int64_t i = 0; i < n; ++i) f(i, int64_t{0}, i);
    return;
  }
  const std::vector<int64_t> ia = broadcast_index(a, out), ib = broadcast_index(b, out);
  for (int64_t i = 0; i < n; ++i) f(i, ia[i], ib[i]);
}

uint64_t get_u(const Tensor& t, int64_t i) {
  return static_cast<uint64_t>(t.get_i(i));
}
void set_u(Tensor& t, int64_t i, uint64_t v) {
  t.set_i(i, static_cast<int64_t>(v));
}

// A binary kernel with separate element functions per dtype class. Output dtype defaults to a's.
struct BinaryFns {
  BinaryF f;                                      // floats, in double
  std::function<int64_t(int64_t, int64_t)> s;     // signed ints
  std::function<uint64_t(uint64_t, uint64_t)> u;  // unsigned ints and bool
};

Tensor apply_binary(const Tensor& a, const Tensor& b, const BinaryFns& fns) {
  Shape s = broadcast_shapes(a.shape(), b.shape());
  Tensor y(a.dtype(), s);
  switch (cls_of(a.dtype())) {
    case Cls::f:
      if (!fns.f) fail("op is not defined for {}", dtype_name(a.dtype()));
      if (a.dtype() == DType::f32) {
        const float* ap = a.data<float>();
        const float* bp = b.data<float>();
        float* yp = y.data<float>();
        for_each_bcast(a.shape(), b.shape(), s, [&](int64_t i, int64_t j, int64_t k) {
          yp[i] = static_cast<float>(fns.f(ap[j], bp[k]));
        });
      } else {
        for_each_bcast(a.shape(), b.shape(), s, [&](int64_t i, int64_t j, int64_t k) {
          y.set_f(i, fns.f(a.get_f(j), b.get_f(k)));
        });
      }
      break;
    case Cls::s:
      if (!fns.s) fail("op is not defined for {}", dtype_name(a.dtype()));
      for_each_bcast(a.shape(), b.shape(), s, [&](int64_t i, int64_t j, int64_t k) {
        y.set_i(i, fns.s(a.get_i(j), b.get_i(k)));
      });
      break;
    case Cls::u:
      if (!fns.u) fail("op is not defined for {}", dtype_name(a.dtype()));
      for_each_bcast(a.shape(), b.shape(), s, [&](int64_t i, int64_t j, int64_t k) {
        set_u(y, i, fns.u(get_u(a, j), get_u(b, k)));
      });
      break;
  }
  return y;
}

// Both operands of an arithmetic binary op share one dtype (ONNX has no implicit promotion).
void infer_binary_same(InferCtx& ctx) {
  check_same_dtype(ctx);
  infer_broadcast(ctx);
}

// Shape arithmetic on sizes (docs/dynamic-shapes.md): the result of one pair of sizes, or nullopt
// when it is not a size expression for every value of the symbols (an inexact division).
using SizeFn = std::function<std::optional<Dim>(const Dim&, const Dim&)>;

// Sets output 0's value when both operands are integer sizes and one is symbolic.
void infer_sizes(InferCtx& ctx, const SizeFn& f) {
  if (!f || !is_int(ctx.in(0).dtype)) return;
  set_sym_elementwise(ctx, {0, 1}, ctx.in(0).dtype, [&f](const std::vector<Dim>& e) { return f(e[0], e[1]); });
}

OpDef binary(std::string name, int since, Types ts, BinaryFns fns, SizeFn sizes = nullptr) {
  OpDef d;
  d.name = std::move(name);
  d.min_inputs = d.max_inputs = 2;
  d.since = since;
  d.fusion = FusionKind::pointwise;
  d.infer = [ts, sizes](InferCtx& ctx) {
    check_types(ctx, ts, 0);
    infer_binary_same(ctx);
    infer_sizes(ctx, sizes);
  };
  d.kernel = [fns](KernelCtx& c) { c.set_out(0, apply_binary(c.in(0), c.in(1), fns)); };
  return d;
}

// ---- unary ops -------------------------------------------------------------------------------

using UnaryKernel = std::function<Tensor(const Tensor&)>;

OpDef unary(std::string name, int since, Types ts, UnaryKernel k,
            std::optional<DType> out = std::nullopt) {
  OpDef d;
  d.name = std::move(name);
  d.since = since;
  d.fusion = FusionKind::pointwise;
  d.infer = [ts, out](InferCtx& ctx) {
    check_types(ctx, ts, 0);
    ctx.set_out(0, with_dtype(ctx.in(0), out.value_or(ctx.in(0).dtype)));
  };
  d.kernel = [k](KernelCtx& c) { c.set_out(0, k(c.in(0))); };
  return d;
}

// A float-only math function.
OpDef unary_f(std::string name, int since, double (*f)(double)) {
  UnaryF fn = f;
  return unary(std::move(name), since, Types::floats, [fn](const Tensor& x) { return map_unary(x, fn); });
}

// Per-element function for each dtype class of one tensor.
Tensor map_by_class(const Tensor& x, const UnaryF& f, const UnaryI& s,
                    const std::function<uint64_t(uint64_t)>& u) {
  switch (cls_of(x.dtype())) {
    case Cls::f:
      return map_unary(x, f);
    case Cls::s:
      return map_unary(x, f, s);
    case Cls::u: {
      Tensor y(x.dtype(), x.shape());
      for (int64_t i = 0; i < x.numel(); ++i) set_u(y, i, u(get_u(x, i)));
      return y;
    }
  }
  return x;
}

// ---- decomposition into core ops ---------------------------------------------------------------



// A rank-0 constant of `like`'s dtype (the binary sugar broadcasts it).
Value* k(CoreBuilder& b, Value* like, double v) { return b.scalar(like->type.dtype, v); }
Value* neg(CoreBuilder& b, Value* x) { return b.unary(CoreOp::neg, x); }

// An op of one input computed by `f` in the input's own dtype (exact or singly rounded math).
DecomposeFn elementwise(std::function<Value*(CoreBuilder&, Value*)> f) {
  return [f](CoreBuilder& b, const Node& n) -> std::vector<Value*> { return {f(b, n.inputs[0])}; };
}

// An op of one float input computed by `f` on the input in math_type, stored back once.
DecomposeFn float_math(std::function<Value*(CoreBuilder&, Value*)> f) {
  return [f](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    DType t = n.inputs[0]->type.dtype;
    return {store_as(b, f(b, b.convert(n.inputs[0], math_type(t))), t)};
  };
}


// (1 - x)(1 + x): 1 - x² without the cancellation near |x| = 1.
Value* one_minus_sq(CoreBuilder& b, Value* x) { return b.mul(b.sub(k(b, x, 1), x), b.add(k(b, x, 1), x)); }

Value* sinh_cosh(CoreBuilder& b, Value* x, bool sinh) {
  Value* ep = b.unary(CoreOp::exp, x);
  Value* em = b.unary(CoreOp::exp, neg(b, x));
  return b.mul(sinh ? b.sub(ep, em) : b.add(ep, em), k(b, x, 0.5));
}

// Sign: 1, -1, or x itself (0, -0 and NaN pass through).
std::vector<Value*> decompose_sign(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  Value* zero = k(b, x, 0);
  Value* r = is_unsigned_int(x->type.dtype) ? x : b.select(b.compare("lt", x, zero), k(b, x, -1), x);
  return {b.select(b.compare("gt", x, zero), k(b, x, 1), r)};
}

// x XOR all-ones: bitwise NOT on ints, logical NOT on bool.
std::vector<Value*> decompose_not(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  return {b.binary(CoreOp::xor_, x, b.constant(Tensor::scalar_i(x->type.dtype, -1)))};
}

std::vector<Value*> decompose_isinf(CoreBuilder& b, const Node& n) {
  Value* x = b.convert(n.inputs[0], math_type(n.inputs[0]->type.dtype));  // f8 types may lack inf
  Value* r = b.full(DType::boolean, x->type.dims(), 0);
  for (double inf : {kInf, -kInf})
    if (n.attr_i(inf > 0 ? "detect_positive" : "detect_negative", 1) != 0)
      r = b.binary(CoreOp::or_, r, b.compare("eq", x, k(b, x, inf)));
  return {r};
}

// Mod: fmod=1 is core rem (C fmod, truncated integer remainder). fmod=0 (integers) gives the
// remainder the divisor's sign: a non-zero remainder whose sign differs gets the divisor added.
std::vector<Value*> decompose_mod(CoreBuilder& b, const Node& n) {
  const Dims s = n.outputs[0]->type.dims();
  Value* y = b.broadcast_to(n.inputs[1], s);
  Value* r = b.emit(CoreOp::rem, {b.broadcast_to(n.inputs[0], s), y});
  if (n.attr_i("fmod", 0) != 0 || is_unsigned_int(r->type.dtype)) return {r};
  Value* zero = k(b, r, 0);
  Value* sign_differs = b.compare("ne", b.compare("lt", r, zero), b.compare("lt", y, zero));
  return {b.select(b.binary(CoreOp::and_, b.compare("ne", r, zero), sign_differs), b.add(r, y), r)};
}

// Pow as the kernel computes it. Floats: in the wider float of the two, or in f64 when an integer
// base meets a float exponent (the real power then truncates to the base's type). Integers: in the
// base's type; a negative exponent gives the truncated 1 / base^|e|, non-zero only for base ±1.
std::vector<Value*> decompose_pow(CoreBuilder& b, const Node& n) {
  const Dims s = n.outputs[0]->type.dims();
  Value* x = b.broadcast_to(n.inputs[0], s);
  Value* e = b.broadcast_to(n.inputs[1], s);
  const DType t = x->type.dtype, te = e->type.dtype;
  if (is_float(t) || is_float(te)) {
    const DType ct = !is_float(t) ? DType::f64 : is_float(te) && dtype_bits(te) > dtype_bits(t) ? te : t;
    return {store_as(b, b.emit(CoreOp::pow, {b.convert(x, ct), b.convert(e, ct)}), t)};
  }
  e = b.convert(e, t);
  auto known = b.known(1);
  bool maybe_negative = is_signed_int(t);
  if (known) {
    std::vector<int64_t> v = known->to_i64();
    maybe_negative = maybe_negative && std::any_of(v.begin(), v.end(), [](int64_t i) { return i < 0; });
  }
  if (!maybe_negative) return {b.emit(CoreOp::pow, {x, e})};
  Value* zero = k(b, e, 0);
  Value* unit = b.binary(CoreOp::or_, b.compare("eq", x, k(b, x, 1)), b.compare("eq", x, k(b, x, -1)));
  Value* inverse = b.select(unit, b.emit(CoreOp::pow, {x, b.binary(CoreOp::and_, e, k(b, e, 1))}), zero);
  return {b.select(b.compare("lt", e, zero), inverse, b.emit(CoreOp::pow, {x, b.max(e, zero)}))};
}

// BitShift on unsigned ints: LEFT multiplies by 2^n (wrapping to 0 once n reaches the width),
// RIGHT divides by 2^n (0 once n reaches the width; the divisor is kept from wrapping to 0).
std::vector<Value*> decompose_bitshift(CoreBuilder& b, const Node& n) {
  const Dims s = n.outputs[0]->type.dims();
  Value* x = b.broadcast_to(n.inputs[0], s);
  Value* sh = b.convert(b.broadcast_to(n.inputs[1], s), x->type.dtype);
  Value* two = k(b, x, 2);
  if (n.attr_s("direction") == "LEFT") return {b.mul(x, b.binary(CoreOp::pow, two, sh))};
  const int w = dtype_bits(x->type.dtype);
  Value* q = b.div(x, b.binary(CoreOp::pow, two, b.min(sh, k(b, sh, w - 1))));
  return {b.select(b.compare("ge", sh, k(b, sh, w)), k(b, x, 0), q)};
}

DecomposeFn compare_as(std::string direction) {
  return [direction](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    return {b.compare(direction, n.inputs[0], n.inputs[1])};
  };
}

// Variadic Max/Min/Sum/Mean with numpy broadcasting: a chain of binary core ops. Sums of narrow
// floats accumulate in f32.
DecomposeFn fold_as(CoreOp op, bool mean = false) {
  return [op, mean](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    const DType t = n.outputs[0]->type.dtype;
    const DType ct = op == CoreOp::add ? math_type(t) : t;
    Value* acc = b.convert(n.inputs[0], ct);
    for (size_t i = 1; i < n.inputs.size(); ++i) acc = b.binary(op, acc, b.convert(n.inputs[i], ct));
    if (mean) acc = b.div(acc, k(b, acc, static_cast<double>(n.inputs.size())));
    return {store_as(b, b.broadcast_to(acc, n.outputs[0]->type.dims()), t)};
  };
}

// Cast and CastLike: convert to the output's dtype, with the node's `saturate`.
std::vector<Value*> decompose_cast(CoreBuilder& b, const Node& n) {
  const DType to = n.outputs[0]->type.dtype;
  if (to == DType::f8e8m0 && round_mode_of(n) != E8M0Round::up)
    unsupported("core convert rounds float8e8m0 up only; round_mode '{}' has no core form", n.attr_s("round_mode"));
  if (n.inputs[0]->type.dtype == to) return {n.inputs[0]};
  return {b.emit(CoreOp::convert, {n.inputs[0]},
                 {{"dtype", std::string(dtype_name(to))}, {"saturate", n.attr_i("saturate", 1)}})};
}

std::vector<Value*> decompose_bitcast(CoreBuilder& b, const Node& n) {
  const DType to = n.outputs[0]->type.dtype;
  if (n.inputs[0]->type.dtype == to) return {n.inputs[0]};
  return {b.emit(CoreOp::bitcast_convert, {n.inputs[0]}, {{"dtype", std::string(dtype_name(to))}})};
}

std::vector<Value*> decompose_where(CoreBuilder& b, const Node& n) {
  Value* r = b.select(n.inputs[0], n.inputs[1], n.inputs[2]);
  return {b.broadcast_to(r, n.outputs[0]->type.dims())};
}

// Clip: max with the lower bound, then min with the upper one (NaN-propagating: a NaN input or bound
// gives NaN; min > max gives max).
// A bound may be [1]-shaped, and after the opset-11 upgrade f32 for any float input.
std::vector<Value*> decompose_clip(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  for (int i = 1; i < 3; ++i)
    if (n.has_input(i)) x = b.binary(i == 1 ? CoreOp::max : CoreOp::min, x, b.convert(b.reshape(n.inputs[i], {}), x->type.dtype));
  return {x};
}

// Dropout at inference is the identity with an all-true mask. Training mode with a ratio > 0 draws
// a random mask: no core form.
std::vector<Value*> decompose_dropout(CoreBuilder& b, const Node& n) {
  if (n.has_input(2) && b.need_constant(2, "Dropout's training_mode").get_i(0) != 0 &&
      (!n.has_input(1) || b.need_constant(1, "Dropout's ratio").get_f(0) != 0))
    unsupported("Dropout in training mode draws a random mask: no core form");
  std::vector<Value*> r = {n.inputs[0]};
  if (n.outputs.size() > 1)
    r.push_back(n.outputs[1] ? b.full(DType::boolean, n.inputs[0]->type.dims(), 1) : nullptr);
  return r;
}

// ---- legacy opsets --------------------------------------------------------------------------

// Ops whose opset-1 form carried `consumed_inputs`, an in-place hint that never changed results.
constexpr std::string_view kConsumedInputsOps[] = {
    "Abs", "Neg", "Reciprocal", "Sqrt", "Exp", "Log", "Ceil", "Floor", "Max", "Min", "Sum", "Mean"};
// Ops whose forms before opset 7 broadcast only when asked (`broadcast`), aligning B with A at
// `axis`; Add/Sub/Mul/Div also had `consumed_inputs` in opset 1.
constexpr std::string_view kLegacyBroadcastOps[] = {"Add",  "Sub",     "Mul", "Div", "Pow", "Equal",
                                                    "Less", "Greater", "And", "Or",  "Xor"};

template <size_t N>
bool listed(const std::string_view (&names)[N], const std::string& name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

void upgrade_legacy_broadcast(Graph& g, Node& n, int /*opset*/) {
  n.attrs.erase("consumed_inputs");
  const bool bcast = n.attr_i("broadcast", 0) != 0;
  const bool has_axis = n.has_attr("axis");
  const int64_t axis = n.attr_i("axis", 0);
  n.attrs.erase("broadcast");
  n.attrs.erase("axis");
  // Equal shapes, or B matched against A's trailing dims: numpy broadcasting does the same.
  if (!bcast || !has_axis || n.inputs.size() < 2 || !n.inputs[0] || !n.inputs[1]) return;
  // B lines up with A from `axis` on: trailing ones on B make numpy align it the same way. That
  // needs the ranks of A and B now (before inference): known for graph inputs and constants.
  Value* a = n.inputs[0];
  Value* b = n.inputs[1];
  if (b->constant && b->constant->numel() == 1) return;  // a one-element B broadcasts anywhere
  if (!(a->is_input || a->constant) || !(b->is_input || b->constant))
    unsupported("legacy broadcast with axis={} needs A and B to be graph inputs or constants (their "
                "ranks are not known before inference)",
                axis);
  const int ra = static_cast<int>(a->type.shape.size());
  const int rb = static_cast<int>(b->type.shape.size());
  const int64_t ax = axis < 0 ? axis + ra : axis;
  if (ax < 0 || ax + rb > ra)
    fail("broadcast axis {} does not fit B {} into A {}", axis, shape_str(b->type.shape),
         shape_str(a->type.shape));
  if (ra - ax == rb) return;  // B already ends at A's last dim
  Shape s = b->type.shape;
  s.resize(static_cast<size_t>(ra - ax), 1);
  if (b->constant) {
    n.inputs[1] = g.add_constant(g.unique_name(b->name + "_aligned"), b->constant->reshaped(s));
    return;
  }
  // B is a graph input: Reshape it in the graph. A dim not known yet is given as 0, which Reshape
  // (allowzero = 0) copies from B.
  const OpDef* reshape = OpRegistry::get().find("Reshape");
  if (!reshape) unsupported("legacy broadcast with axis={} needs the Reshape op", axis);
  for (auto& d : s)
    if (d < 0) d = 0;
  const int64_t rank = static_cast<int64_t>(s.size());
  Value* target = g.add_constant(g.unique_name(b->name + "_aligned_shape"),
                                 Tensor::from_i64(DType::i64, {rank}, s));
  const std::string base = n.name.empty() ? n.op_name() : n.name;
  Node* rs = g.add_node(reshape, base + "_align_b", {b, target}, {g.unique_name(b->name + "_aligned")});
  n.inputs[1] = rs->outputs[0];
  // The Reshape was appended after `n`; move it in front of `n` to keep topological order.
  auto& nodes = g.mutable_nodes();
  auto it = std::find_if(nodes.begin(), nodes.end(), [&](const auto& p) { return p.get() == &n; });
  if (it == nodes.end()) fail("upgrade: node not in its graph");
  std::rotate(it, nodes.end() - 1, nodes.end());
}

// Rejects an attribute that only legacy opsets define (the upgrade removes it from those).
InferFn reject_legacy_attrs(InferFn inner, std::vector<std::string> names) {
  return [inner = std::move(inner), names = std::move(names)](InferCtx& ctx) {
    for (const auto& a : names)
      if (ctx.node().has_attr(a))
        fail("attribute '{}' only exists before opset {}", a, ctx.node().op->since);
    inner(ctx);
  };
}

// Registers `d`, adding the upgrade from its legacy forms where it has one. Every op of this family
// takes symbolic sizes (docs/dynamic-shapes.md): the rules broadcast dims, the decompositions
// broadcast to the output's dims.
void add(OpRegistry& r, OpDef d) {
  d.symbolic = true;
  if (listed(kConsumedInputsOps, d.name)) {
    d.attrs.push_back({"consumed_inputs", AttrKind::ints});
    d.upgrade = [](Graph&, Node& n, int) { n.attrs.erase("consumed_inputs"); };
    d.infer = reject_legacy_attrs(std::move(d.infer), {"consumed_inputs"});
  } else if (listed(kLegacyBroadcastOps, d.name)) {
    d.attrs.push_back({"broadcast", AttrKind::i});
    d.attrs.push_back({"axis", AttrKind::i});
    d.attrs.push_back({"consumed_inputs", AttrKind::ints});
    d.upgrade = upgrade_legacy_broadcast;
    d.infer = reject_legacy_attrs(std::move(d.infer), {"broadcast", "axis", "consumed_inputs"});
  }
  r.add(std::move(d));
}

void register_unary(OpRegistry& r) {
  add(r, with_decomposition(unary("Abs", 6, Types::numeric, [](const Tensor& x) {
        auto f = [](double v) { return std::fabs(v); };
        auto s = [](int64_t v) { return v < 0 ? wrap_sub(0, v) : v; };  // |INT_MIN| wraps, as in C
        return map_by_class(x, f, s, [](uint64_t v) { return v; });
      }), elementwise(abs_of)));
  {
    OpDef d = unary("Neg", 6, Types::signed_or_float, [](const Tensor& x) {
      return map_unary(
          x, [](double v) { return -v; }, [](int64_t v) { return wrap_sub(0, v); });
    });
    d.decompose = decompose_as(CoreOp::neg);
    add(r, std::move(d));
  }
  add(r, with_decomposition(unary("Sign", 9, Types::numeric, [](const Tensor& x) {
        auto f = [](double v) { return std::isnan(v) || v == 0 ? v : v > 0 ? 1.0 : -1.0; };
        auto s = [](int64_t v) -> int64_t { return (v > 0) - (v < 0); };
        return map_by_class(x, f, s, [](uint64_t v) -> uint64_t { return v != 0; });
      }), decompose_sign));
  add(r, with_decomposition(unary_f("Reciprocal", 6, [](double v) { return 1.0 / v; }),
                            elementwise([](CoreBuilder& b, Value* x) { return b.div(k(b, x, 1), x); })));
  add(r, with_decomposition(unary_f("Sqrt", 6, [](double v) { return std::sqrt(v); }), decompose_as(CoreOp::sqrt)));
  add(r, with_decomposition(unary_f("Exp", 6, [](double v) { return std::exp(v); }), decompose_as(CoreOp::exp)));
  add(r, with_decomposition(unary_f("Log", 6, [](double v) { return std::log(v); }), decompose_as(CoreOp::log)));
  add(r, with_decomposition(unary_f("Ceil", 6, [](double v) { return std::ceil(v); }),
                            elementwise([](CoreBuilder& b, Value* x) { return neg(b, b.unary(CoreOp::floor, neg(b, x))); })));
  add(r, with_decomposition(unary_f("Floor", 6, [](double v) { return std::floor(v); }), decompose_as(CoreOp::floor)));
  // nearbyint in the default rounding mode rounds halfway cases to even, as ONNX Round asks.
  add(r, with_decomposition(unary_f("Round", 11, [](double v) { return std::nearbyint(v); }), decompose_as(CoreOp::round_even)));
  add(r, with_decomposition(unary_f("Sin", 7, [](double v) { return std::sin(v); }), decompose_as(CoreOp::sin)));
  add(r, with_decomposition(unary_f("Cos", 7, [](double v) { return std::cos(v); }), float_math(cos_of)));
  add(r, with_decomposition(unary_f("Tan", 7, [](double v) { return std::tan(v); }),
                            float_math([](CoreBuilder& b, Value* x) { return b.div(b.unary(CoreOp::sin, x), cos_of(b, x)); })));
  // asin x = atan(x / sqrt(1 - x²)) (±inf at |x| = 1 gives ±π/2); acos x = 2 atan(sqrt((1 - x) / (1 + x))).
  add(r, with_decomposition(unary_f("Asin", 7, [](double v) { return std::asin(v); }),
                            float_math([](CoreBuilder& b, Value* x) {
                              return b.unary(CoreOp::atan, b.div(x, b.unary(CoreOp::sqrt, one_minus_sq(b, x))));
                            })));
  add(r, with_decomposition(unary_f("Acos", 7, [](double v) { return std::acos(v); }),
                            float_math([](CoreBuilder& b, Value* x) {
                              Value* q = b.div(b.sub(k(b, x, 1), x), b.add(k(b, x, 1), x));
                              return b.mul(k(b, x, 2), b.unary(CoreOp::atan, b.unary(CoreOp::sqrt, q)));
                            })));
  add(r, with_decomposition(unary_f("Atan", 7, [](double v) { return std::atan(v); }), decompose_as(CoreOp::atan)));
  add(r, with_decomposition(unary_f("Sinh", 9, [](double v) { return std::sinh(v); }),
                            float_math([](CoreBuilder& b, Value* x) { return sinh_cosh(b, x, true); })));
  add(r, with_decomposition(unary_f("Cosh", 9, [](double v) { return std::cosh(v); }),
                            float_math([](CoreBuilder& b, Value* x) { return sinh_cosh(b, x, false); })));
  // asinh x = sign(x) log(|x| + sqrt(x² + 1)): the odd form stays accurate for negative x.
  add(r, with_decomposition(unary_f("Asinh", 9, [](double v) { return std::asinh(v); }),
                            float_math([](CoreBuilder& b, Value* x) {
                              Value* a = abs_of(b, x);
                              Value* r = b.unary(CoreOp::log, b.add(a, b.unary(CoreOp::sqrt, b.add(b.mul(a, a), k(b, x, 1)))));
                              return b.select(b.compare("lt", x, k(b, x, 0)), neg(b, r), r);
                            })));
  // acosh x = log(x + sqrt((x - 1)(x + 1))); atanh x = log((1 + x) / (1 - x)) / 2.
  add(r, with_decomposition(unary_f("Acosh", 9, [](double v) { return std::acosh(v); }),
                            float_math([](CoreBuilder& b, Value* x) {
                              Value* s = b.unary(CoreOp::sqrt, b.mul(b.sub(x, k(b, x, 1)), b.add(x, k(b, x, 1))));
                              return b.unary(CoreOp::log, b.add(x, s));
                            })));
  add(r, with_decomposition(unary_f("Atanh", 9, [](double v) { return std::atanh(v); }),
                            float_math([](CoreBuilder& b, Value* x) {
                              Value* q = b.div(b.add(k(b, x, 1), x), b.sub(k(b, x, 1), x));
                              return b.mul(k(b, x, 0.5), b.unary(CoreOp::log, q));
                            })));
  add(r, with_decomposition(unary_f("Erf", 9, [](double v) { return std::erf(v); }), decompose_as(CoreOp::erf)));
  add(r, with_decomposition(unary("Not", 1, Types::boolean, [](const Tensor& x) {
        Tensor y(DType::boolean, x.shape());
        for (int64_t i = 0; i < x.numel(); ++i) y.bytes()[i] = x.bytes()[i] ? 0 : 1;
        return y;
      }), decompose_not));
  add(r, with_decomposition(unary("BitwiseNot", 18, Types::ints, [](const Tensor& x) {
        Tensor y(x.dtype(), x.shape());
        for (int64_t i = 0; i < x.numel(); ++i)
          y.set_i(i, ~x.get_i(i));  // set_i narrows to the width
        return y;
      }), decompose_not));
  add(r, with_decomposition(unary(
             "IsNaN", 9, Types::floats,
             [](const Tensor& x) {
               Tensor y(DType::boolean, x.shape());
               for (int64_t i = 0; i < x.numel(); ++i) y.bytes()[i] = std::isnan(x.get_f(i));
               return y;
             },
             DType::boolean),
         [](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
           return {b.compare("ne", n.inputs[0], n.inputs[0])};
         }));
  {
    OpDef d = unary("IsInf", 10, Types::floats, nullptr, DType::boolean);
    d.attrs = {{"detect_negative", AttrKind::i}, {"detect_positive", AttrKind::i}};
    d.kernel = [](KernelCtx& c) {
      const Tensor& x = c.in(0);
      const bool neg = c.node().attr_i("detect_negative", 1) != 0;
      const bool pos = c.node().attr_i("detect_positive", 1) != 0;
      Tensor y(DType::boolean, x.shape());
      for (int64_t i = 0; i < x.numel(); ++i) {
        double v = x.get_f(i);
        y.bytes()[i] = std::isinf(v) && (v > 0 ? pos : neg);
      }
      c.set_out(0, std::move(y));
    };
    d.decompose = decompose_isinf;
    add(r, std::move(d));
  }
}

// ---- binary arithmetic -----------------------------------------------------------------------

int64_t div_s(int64_t a, int64_t b) {
  if (b == 0) fail("integer division by zero");
  if (b == -1) return wrap_sub(0, a);  // INT64_MIN / -1 overflows in C++
  return a / b;                        // truncates toward zero, as ONNX integer Div does
}

uint64_t div_u(uint64_t a, uint64_t b) {
  if (b == 0) fail("integer division by zero");
  return a / b;
}

// Integer power by squaring, wrapping like repeated multiplication would.
int64_t ipow(int64_t base, int64_t e) {
  if (e < 0) {
    // Truncated 1 / base^|e|: only |base| == 1 gives a non-zero result.
    if (base == 1) return 1;
    if (base == -1) return (e % 2 == 0) ? 1 : -1;
    if (base == 0) fail("integer Pow: zero to a negative power");
    return 0;
  }
  uint64_t result = 1, b = static_cast<uint64_t>(base);
  uint64_t ue = static_cast<uint64_t>(e);
  while (ue) {
    if (ue & 1) result *= b;
    b *= b;
    ue >>= 1;
  }
  return static_cast<int64_t>(result);
}

Tensor pow_kernel(const Tensor& a, const Tensor& b) {
  Shape s = broadcast_shapes(a.shape(), b.shape());
  Tensor y(a.dtype(), s);
  const bool af = is_float(a.dtype()), bf = is_float(b.dtype());
  if (a.dtype() == DType::f32 && b.dtype() == DType::f32) {
    const float* ap = a.data<float>();
    const float* bp = b.data<float>();
    float* yp = y.data<float>();
    for_each_bcast(a.shape(), b.shape(), s, [&](int64_t i, int64_t j, int64_t k) {
      yp[i] = static_cast<float>(std::pow(static_cast<double>(ap[j]), static_cast<double>(bp[k])));
    });
  } else if (af || bf) {
    // Float base or float exponent: real power, then converted to the base dtype.
    for_each_bcast(a.shape(), b.shape(), s, [&](int64_t i, int64_t j, int64_t k) {
      y.set_f(i, std::pow(a.get_f(j), b.get_f(k)));
    });
  } else {
    const bool ua = cls_of(a.dtype()) == Cls::u, ub = cls_of(b.dtype()) == Cls::u;
    for_each_bcast(a.shape(), b.shape(), s, [&](int64_t i, int64_t j, int64_t k) {
      int64_t base = a.get_i(j), e = b.get_i(k);
      if (ub && e < 0) e = std::numeric_limits<int64_t>::max();  // huge unsigned exponent
      if (ua && base < 0) fail("integer Pow: u64 base beyond int64 is not supported");
      y.set_i(i, ipow(base, e));
    });
  }
  return y;
}

Tensor mod_kernel(const Tensor& a, const Tensor& b, bool fmod) {
  BinaryFns fns;
  fns.f = [](double x, double y) { return std::fmod(x, y); };
  if (fmod) {
    fns.s = [](int64_t x, int64_t y) -> int64_t {
      if (y == 0) fail("integer modulo by zero");
      if (y == -1) return 0;
      return x % y;
    };
  } else {
    // Result takes the divisor's sign (Python's %).
    fns.s = [](int64_t x, int64_t y) -> int64_t {
      if (y == 0) fail("integer modulo by zero");
      if (y == -1) return 0;
      int64_t m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return m;
    };
  }
  fns.u = [](uint64_t x, uint64_t y) -> uint64_t {
    if (y == 0) fail("integer modulo by zero");
    return x % y;
  };
  return apply_binary(a, b, fns);
}

void register_binary(OpRegistry& r) {
  add(r, with_decomposition(binary("Add", 7, Types::numeric,
                {[](double a, double b) { return a + b; }, wrap_add,
                 [](uint64_t a, uint64_t b) { return a + b; }},
                [](const Dim& a, const Dim& b) -> std::optional<Dim> { return a + b; }), decompose_as(CoreOp::add)));
  add(r, with_decomposition(binary("Sub", 7, Types::numeric,
                                   {[](double a, double b) { return a - b; }, wrap_sub,
                                    [](uint64_t a, uint64_t b) { return a - b; }},
                                   [](const Dim& a, const Dim& b) -> std::optional<Dim> { return a - b; }),
                            decompose_sub));
  add(r, with_decomposition(binary("Mul", 7, Types::numeric,
                {[](double a, double b) { return a * b; }, wrap_mul,
                 [](uint64_t a, uint64_t b) { return a * b; }},
                [](const Dim& a, const Dim& b) -> std::optional<Dim> { return a * b; }), decompose_as(CoreOp::mul)));
  // Integer Div truncates: a size expression only where the division is exact for every value.
  add(r, with_decomposition(binary("Div", 7, Types::numeric, {[](double a, double b) { return a / b; }, div_s, div_u},
                                   [](const Dim& a, const Dim& b) { return exact_div(a, b); }),
                            decompose_as(CoreOp::div)));
  {
    OpDef d = binary("Mod", 10, Types::numeric, {});
    d.attrs = {{"fmod", AttrKind::i}};
    d.infer = [](InferCtx& ctx) {
      check_types(ctx, Types::numeric, 0);
      int64_t fm = ctx.node().attr_i("fmod", 0);
      if (fm != 0 && fm != 1) fail("fmod must be 0 or 1, got {}", fm);
      if (is_float(ctx.in(0).dtype) && fm == 0)
        fail("Mod on floating point inputs requires fmod=1");
      infer_binary_same(ctx);
    };
    d.kernel = [](KernelCtx& c) {
      c.set_out(0, mod_kernel(c.in(0), c.in(1), c.node().attr_i("fmod", 0) != 0));
    };
    d.decompose = decompose_mod;
    add(r, std::move(d));
  }
  {
    OpDef d = binary("Pow", 7, Types::numeric, {});
    d.infer = [](InferCtx& ctx) {
      check_types(ctx, Types::numeric, 0);
      check_types(ctx, Types::numeric, 1);
      infer_broadcast(ctx);
    };
    d.kernel = [](KernelCtx& c) { c.set_out(0, pow_kernel(c.in(0), c.in(1))); };
    d.decompose = decompose_pow;
    add(r, std::move(d));
  }
  {
    OpDef d = binary("BitShift", 11, Types::unsigned_ints, {});
    d.attrs = {{"direction", AttrKind::s, true}};
    d.infer = [](InferCtx& ctx) {
      check_types(ctx, Types::unsigned_ints, 0);
      std::string dir = ctx.node().attr_s("direction");
      if (dir != "LEFT" && dir != "RIGHT") fail("direction must be LEFT or RIGHT, got '{}'", dir);
      infer_binary_same(ctx);
    };
    d.kernel = [](KernelCtx& c) {
      const bool left = c.node().attr_s("direction") == "LEFT";
      BinaryFns fns;
      fns.u = [left](uint64_t x, uint64_t n) -> uint64_t {
        if (n >= 64) return 0;
        return left ? x << n : x >> n;  // set_u narrows left shifts to the width
      };
      c.set_out(0, apply_binary(c.in(0), c.in(1), fns));
    };
    d.decompose = decompose_bitshift;
    add(r, std::move(d));
  }
  auto bitwise = [](uint64_t (*f)(uint64_t, uint64_t)) {
    // Two's complement bit patterns are the same through int64 and uint64.
    return BinaryFns{
        nullptr,
        [f](int64_t a, int64_t b) {
          return static_cast<int64_t>(f(static_cast<uint64_t>(a), static_cast<uint64_t>(b)));
        },
        f};
  };
  add(r, with_decomposition(binary("BitwiseAnd", 18, Types::ints, bitwise([](uint64_t a, uint64_t b) { return a & b; })),
                            decompose_as(CoreOp::and_)));
  add(r, with_decomposition(binary("BitwiseOr", 18, Types::ints, bitwise([](uint64_t a, uint64_t b) { return a | b; })),
                            decompose_as(CoreOp::or_)));
  add(r, with_decomposition(binary("BitwiseXor", 18, Types::ints, bitwise([](uint64_t a, uint64_t b) { return a ^ b; })),
                            decompose_as(CoreOp::xor_)));
  add(r, with_decomposition(binary("And", 7, Types::boolean,
                                   {nullptr, nullptr, [](uint64_t a, uint64_t b) -> uint64_t { return a && b; }}),
                            decompose_as(CoreOp::and_)));
  add(r, with_decomposition(binary("Or", 7, Types::boolean,
                                   {nullptr, nullptr, [](uint64_t a, uint64_t b) -> uint64_t { return a || b; }}),
                            decompose_as(CoreOp::or_)));
  add(r, with_decomposition(binary("Xor", 7, Types::boolean, {nullptr, nullptr, [](uint64_t a, uint64_t b) -> uint64_t {
                                                                return (a != 0) != (b != 0);
                                                              }}),
                            decompose_as(CoreOp::xor_)));
}

// ---- comparisons -----------------------------------------------------------------------------

enum class Cmp { eq, lt, le, gt, ge };  // in SizeCmp's order

template <typename T>
bool compare(Cmp op, T a, T b) {
  switch (op) {
    case Cmp::eq:
      return a == b;
    case Cmp::lt:
      return a < b;
    case Cmp::le:
      return a <= b;
    case Cmp::gt:
      return a > b;
    case Cmp::ge:
      return a >= b;
  }
  return false;
}

Tensor compare_kernel(const Tensor& a, const Tensor& b, Cmp op) {
  Shape s = broadcast_shapes(a.shape(), b.shape());
  Tensor y(DType::boolean, s);
  uint8_t* yp = y.bytes();
  switch (cls_of(a.dtype())) {
    case Cls::f:
      for_each_bcast(a.shape(), b.shape(), s, [&](int64_t i, int64_t j, int64_t k) {
        yp[i] = compare(op, a.get_f(j), b.get_f(k));
      });
      break;
    case Cls::s:
      for_each_bcast(a.shape(), b.shape(), s, [&](int64_t i, int64_t j, int64_t k) {
        yp[i] = compare(op, a.get_i(j), b.get_i(k));
      });
      break;
    case Cls::u:
      for_each_bcast(a.shape(), b.shape(), s, [&](int64_t i, int64_t j, int64_t k) {
        yp[i] = compare(op, get_u(a, j), get_u(b, k));
      });
      break;
  }
  return y;
}

OpDef comparison(std::string name, int since, Cmp op) {
  OpDef d;
  d.name = std::move(name);
  d.min_inputs = d.max_inputs = 2;
  d.since = since;
  d.fusion = FusionKind::pointwise;
  d.infer = [op](InferCtx& ctx) {
    check_types(ctx, op == Cmp::eq ? Types::any : Types::numeric, 0);
    check_same_dtype(ctx);
    infer_broadcast(ctx, DType::boolean);
    // Sizes compared where the symbols decide it (ONNX exporters test shape entries against 0 or -1).
    if (!is_int(ctx.in(0).dtype)) return;
    const SizeCmp sc = static_cast<SizeCmp>(op);
    set_sym_elementwise(ctx, {0, 1}, DType::boolean, [sc](const std::vector<Dim>& e) -> std::optional<Dim> {
      auto r = compare_sizes(sc, e[0], e[1]);
      if (!r) return std::nullopt;
      return Dim(*r ? 1 : 0);
    });
  };
  d.kernel = [op](KernelCtx& c) { c.set_out(0, compare_kernel(c.in(0), c.in(1), op)); };
  return d;
}

// ---- variadic Max / Min / Sum / Mean ---------------------------------------------------------

enum class Fold { max, min, sum, mean };

template <typename T>
T fold_step(Fold op, T acc, T v) {
  switch (op) {
    case Fold::max:
      return v > acc ? v : acc;
    case Fold::min:
      return v < acc ? v : acc;
    case Fold::sum:
    case Fold::mean:
      return acc + v;
  }
  return acc;
}

double fold_step_f(Fold op, double acc, double v) {
  if ((op == Fold::max || op == Fold::min) && (std::isnan(acc) || std::isnan(v))) return kNaN;
  return fold_step(op, acc, v);
}

Tensor fold_kernel(const KernelCtx& c, Fold op) {
  Shape s = c.in(0).shape();
  for (int k = 1; k < c.num_inputs(); ++k) s = broadcast_shapes(s, c.in(k).shape());
  const DType dt = c.in(0).dtype();
  Tensor y(dt, s);
  const int64_t n = y.numel();
  auto indices = [&](const Tensor& x) {
    return x.shape() == s ? std::vector<int64_t>{} : broadcast_index(x.shape(), s);
  };
  auto at = [](const std::vector<int64_t>& idx, int64_t i) { return idx.empty() ? i : idx[i]; };
  const Cls cls = cls_of(dt);
  if (cls == Cls::f) {
    std::vector<double> acc(n);
    for (int k = 0; k < c.num_inputs(); ++k) {
      const Tensor& x = c.in(k);
      auto idx = indices(x);
      for (int64_t i = 0; i < n; ++i) {
        double v = x.get_f(at(idx, i));
        acc[i] = k == 0 ? v : fold_step_f(op, acc[i], v);
      }
    }
    const double scale = op == Fold::mean ? 1.0 / c.num_inputs() : 1.0;
    for (int64_t i = 0; i < n; ++i) y.set_f(i, op == Fold::mean ? acc[i] * scale : acc[i]);
  } else if (cls == Cls::s) {
    std::vector<int64_t> acc(n);
    for (int k = 0; k < c.num_inputs(); ++k) {
      const Tensor& x = c.in(k);
      auto idx = indices(x);
      for (int64_t i = 0; i < n; ++i) {
        int64_t v = x.get_i(at(idx, i));
        acc[i] = k == 0                               ? v
                 : op == Fold::max || op == Fold::min ? fold_step(op, acc[i], v)
                                                      : wrap_add(acc[i], v);
      }
    }
    for (int64_t i = 0; i < n; ++i) y.set_i(i, op == Fold::mean ? acc[i] / c.num_inputs() : acc[i]);
  } else {
    std::vector<uint64_t> acc(n);
    for (int k = 0; k < c.num_inputs(); ++k) {
      const Tensor& x = c.in(k);
      auto idx = indices(x);
      for (int64_t i = 0; i < n; ++i) {
        uint64_t v = get_u(x, at(idx, i));
        acc[i] = k == 0 ? v : fold_step(op, acc[i], v);
      }
    }
    for (int64_t i = 0; i < n; ++i)
      set_u(y, i, op == Fold::mean ? acc[i] / c.num_inputs() : acc[i]);
  }
  return y;
}

// Max, Min and Sum of sizes: a Max or Min only where the symbols decide which one is larger.
std::optional<Dim> fold_sizes(Fold op, const std::vector<Dim>& e) {
  Dim acc = e[0];
  for (size_t i = 1; i < e.size(); ++i) {
    if (op == Fold::sum) {
      acc += e[i];
      continue;
    }
    const Dim& big = op == Fold::max ? acc : e[i];
    const Dim& small = op == Fold::max ? e[i] : acc;
    if (provably_ge(big, small)) continue;  // acc stays
    if (!provably_ge(small, big)) return std::nullopt;
    acc = e[i];
  }
  return acc;
}

OpDef variadic(std::string name, int since, Fold op, Types ts) {
  OpDef d;
  d.name = std::move(name);
  d.min_inputs = 1;
  d.max_inputs = -1;
  d.since = since;
  d.fusion = FusionKind::pointwise;
  d.infer = [ts, op](InferCtx& ctx) {
    check_types(ctx, ts, 0);
    for (int i = 0; i < ctx.num_inputs(); ++i)
      if (!ctx.has_in(i)) fail("input {} is missing", i);
    check_same_dtype(ctx);
    infer_broadcast(ctx);
    if (op == Fold::mean || !is_int(ctx.in(0).dtype)) return;
    set_sym_elementwise(ctx, every_input(ctx), ctx.in(0).dtype, [op](const std::vector<Dim>& e) { return fold_sizes(op, e); });
  };
  d.kernel = [op](KernelCtx& c) { c.set_out(0, fold_kernel(c, op)); };
  return d;
}

// ---- casts -----------------------------------------------------------------------------------

bool is_f8(DType t) {
  return t == DType::f8e4m3fn || t == DType::f8e4m3fnuz || t == DType::f8e5m2 ||
         t == DType::f8e5m2fnuz;
}

Tensor cast_tensor(const Tensor& x, DType to, bool saturate, E8M0Round round) {
  if (x.dtype() == to) return x;
  Tensor y(to, x.shape());
  const int64_t n = x.numel();
  const DType from = x.dtype();
  if (to == DType::f8e8m0) {
    // Through float32, the sign dropped; NaN and inf become NaN (0xFF) even with saturate.
    for (int64_t i = 0; i < n; ++i) y.bytes()[i] = encode_e8m0(x.get_f(i), saturate, round);
  } else if (is_f8(to)) {
    // saturate clamps infinities too; without it, they become inf (e5m2) or NaN (the rest).
    for (int64_t i = 0; i < n; ++i)
      y.bytes()[i] = static_cast<uint8_t>(encode_float_bits(to, x.get_f(i), saturate));
  } else if (to == DType::f4e2m1) {
    // float4 has neither inf nor NaN: inf saturates, and NaN becomes -0 (0x8) as the ONNX
    // conformance data has it.
    for (int64_t i = 0; i < n; ++i) {
      double v = x.get_f(i);
      y.bytes()[i] = std::isnan(v) ? 0x8 : static_cast<uint8_t>(encode_float_bits(to, v, true));
    }
  } else if (from == DType::f32 && to == DType::f64) {
    const float* xp = x.data<float>();
    double* yp = y.data<double>();
    for (int64_t i = 0; i < n; ++i) yp[i] = xp[i];
  } else if (is_float(to)) {
    for (int64_t i = 0; i < n; ++i) y.set_f(i, x.get_f(i));
  } else if (is_bool(to)) {
    for (int64_t i = 0; i < n; ++i)
      y.bytes()[i] = is_float(from) ? x.get_f(i) != 0 : x.get_i(i) != 0;
  } else if (is_float(from)) {
    for (int64_t i = 0; i < n; ++i) y.set_f(i, x.get_f(i));  // truncates toward zero
  } else {
    for (int64_t i = 0; i < n; ++i) y.set_i(i, x.get_i(i));  // wraps to the target width
  }
  return y;
}

// Sizes cast between i32 and i64 stay sizes (exporters cast shape entries so); a cast to any other
// type gives a value with no size form.
void cast_sizes(InferCtx& ctx) {
  auto sizes_type = [](DType t) { return t == DType::i64 || t == DType::i32; };
  if (sizes_type(ctx.in(0).dtype) && sizes_type(ctx.outs()[0].dtype)) forward_sym_value(ctx);
}

void register_casts(OpRegistry& r) {
  {
    OpDef d;
    d.name = "Cast";
    d.since = 6;
    d.fusion = FusionKind::pointwise;
    d.attrs = {{"to", AttrKind::i, true}, {"saturate", AttrKind::i}, {"round_mode", AttrKind::s}};
    d.infer = [](InferCtx& ctx) {
      check_round_mode(ctx.node());
      ctx.set_out(0, with_dtype(ctx.in(0), to_attr_dtype(ctx.node())));
      cast_sizes(ctx);
    };
    d.kernel = [](KernelCtx& c) {
      c.set_out(0,
                cast_tensor(c.in(0), to_attr_dtype(c.node()), c.node().attr_i("saturate", 1) != 0,
                            round_mode_of(c.node())));
    };
    d.decompose = decompose_cast;
    add(r, std::move(d));
  }
  {
    OpDef d;
    d.name = "CastLike";
    d.since = 15;
    d.min_inputs = d.max_inputs = 2;
    d.fusion = FusionKind::pointwise;
    d.attrs = {{"saturate", AttrKind::i}, {"round_mode", AttrKind::s}};
    d.infer = [](InferCtx& ctx) {
      check_round_mode(ctx.node());
      ctx.set_out(0, with_dtype(ctx.in(0), ctx.in(1).dtype));
      cast_sizes(ctx);
    };
    d.kernel = [](KernelCtx& c) {
      c.set_out(0, cast_tensor(c.in(0), c.in(1).dtype(), c.node().attr_i("saturate", 1) != 0,
                               round_mode_of(c.node())));
    };
    d.decompose = decompose_cast;
    add(r, std::move(d));
  }
  {
    OpDef d;
    d.name = "BitCast";
    d.since = 26;
    d.fusion = FusionKind::pointwise;
    d.attrs = {{"to", AttrKind::i, true}};
    d.infer = [](InferCtx& ctx) {
      DType to = to_attr_dtype(ctx.node());
      DType from = ctx.in(0).dtype;
      if (dtype_bits(to) != dtype_bits(from))
        fail("BitCast from {} ({} bits) to {} ({} bits): bit widths differ", dtype_name(from),
             dtype_bits(from), dtype_name(to), dtype_bits(to));
      ctx.set_out(0, with_dtype(ctx.in(0), to));
    };
    d.kernel = [](KernelCtx& c) {
      const Tensor& x = c.in(0);
      DType to = to_attr_dtype(c.node());
      Tensor y(to, x.shape());
      if (const int bits = dtype_bits(to); bits < 8) {
        // 4- and 2-bit values are stored one per byte: int4/int2 sign-extended, uint4/uint2 and
        // float4 as the bare field.
        const uint8_t mask = static_cast<uint8_t>((1u << bits) - 1);
        for (int64_t i = 0; i < x.numel(); ++i) {
          uint8_t v = x.bytes()[i] & mask;
          y.bytes()[i] = is_signed_int(to) ? static_cast<uint8_t>(wrap_to_int(to, v)) : v;
        }
      } else if (to == DType::boolean) {
        for (int64_t i = 0; i < x.numel(); ++i) y.bytes()[i] = x.bytes()[i] != 0;
      } else if (x.nbytes()) {
        std::memcpy(y.bytes(), x.bytes(), x.nbytes());
      }
      c.set_out(0, std::move(y));
    };
    d.decompose = decompose_bitcast;
    add(r, std::move(d));
  }
}

// ---- selection and clamping ------------------------------------------------------------------

Tensor where_kernel(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Shape s = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape()), b.shape());
  Tensor y(a.dtype(), s);
  const int64_t n = y.numel();
  const size_t es = static_cast<size_t>(dtype_size(a.dtype()));
  auto idx = [&](const Tensor& t) {
    return t.shape() == s ? std::vector<int64_t>{} : broadcast_index(t.shape(), s);
  };
  const auto ic = idx(cond), ia = idx(a), ib = idx(b);
  auto at = [](const std::vector<int64_t>& v, int64_t i) { return v.empty() ? i : v[i]; };
  const uint8_t* cp = cond.bytes();
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* src = cp[at(ic, i)] ? a.bytes() + at(ia, i) * es : b.bytes() + at(ib, i) * es;
    std::memcpy(y.bytes() + i * es, src, es);
  }
  return y;
}

Tensor clip_kernel(const KernelCtx& c) {
  const Tensor& x = c.in(0);
  auto bound = [&](int i) -> const Tensor* {
    if (!c.has_in(i)) return nullptr;
    if (c.in(i).numel() != 1)
      fail("Clip bound {} must be a scalar, got shape {}", i == 1 ? "min" : "max",
           shape_str(c.in(i).shape()));
    return &c.in(i);
  };
  const Tensor* lo = bound(1);
  const Tensor* hi = bound(2);
  switch (cls_of(x.dtype())) {
    case Cls::f: {
      const double l = lo ? lo->get_f(0) : -INFINITY, h = hi ? hi->get_f(0) : INFINITY;
      // The spec's Min(max, Max(input, min)) with ONNX's NaN-propagating Max and Min (np.clip in the
      // reference implementation): a NaN input or bound gives NaN (docs/decisions.md); min > max
      // yields max everywhere, as the spec asks.
      return map_unary(x, [l, h](double v) {
        return std::isnan(v) || std::isnan(l) || std::isnan(h) ? NAN : std::min(std::max(v, l), h);
      });
    }
    case Cls::s: {
      const int64_t l = lo ? lo->get_i(0) : std::numeric_limits<int64_t>::min();
      const int64_t h = hi ? hi->get_i(0) : std::numeric_limits<int64_t>::max();
      return map_unary(x, nullptr, [l, h](int64_t v) { return std::min(std::max(v, l), h); });
    }
    case Cls::u: {
      const uint64_t l = lo ? get_u(*lo, 0) : 0;
      const uint64_t h = hi ? get_u(*hi, 0) : std::numeric_limits<uint64_t>::max();
      return map_by_class(x, nullptr, nullptr,
                          [l, h](uint64_t v) { return std::min(std::max(v, l), h); });
    }
  }
  return x;
}

// Clip before opset 11 took min/max as attributes; they become constant inputs.
void upgrade_clip(Graph& g, Node& n, int /*opset*/) {
  n.attrs.erase("consumed_inputs");
  const double lo = n.attr_f("min", -std::numeric_limits<float>::max());
  const double hi = n.attr_f("max", std::numeric_limits<float>::max());
  n.attrs.erase("min");
  n.attrs.erase("max");
  // Clip-6 only takes float types; the kernel converts the bounds to the input's dtype.
  n.inputs.resize(3, nullptr);
  n.inputs[1] = g.add_constant(g.unique_name(n.name + "_min"), Tensor::scalar_f(DType::f32, lo));
  n.inputs[2] = g.add_constant(g.unique_name(n.name + "_max"), Tensor::scalar_f(DType::f32, hi));
}

// Dropout before opset 12 took `ratio` as an attribute, and before opset 7 trained unless
// `is_test` was set; both become constant inputs.
void upgrade_dropout(Graph& g, Node& n, int opset) {
  if (opset < 10 && n.outputs.size() > 1 && n.outputs[1])
    unsupported("Dropout before opset 10 returns a mask of the input dtype; not supported");
  const double ratio = n.attr_f("ratio", 0.5);
  const bool training = opset < 7 && n.attr_i("is_test", 0) == 0;
  n.attrs.erase("ratio");
  n.attrs.erase("is_test");
  n.attrs.erase("consumed_inputs");
  n.inputs.resize(training ? 3 : 2, nullptr);
  n.inputs[1] =
      g.add_constant(g.unique_name(n.name + "_ratio"), Tensor::scalar_f(DType::f32, ratio));
  if (training)
    n.inputs[2] = g.add_constant(g.unique_name(n.name + "_training_mode"),
                                 Tensor::scalar_i(DType::boolean, 1));
}

Tensor dropout_mask_all(const Shape& s) {
  Tensor m(DType::boolean, s);
  if (m.nbytes()) std::memset(m.bytes(), 1, m.nbytes());
  return m;
}

// A scalar operand (a Clip bound, Dropout's ratio) has at most one element; a symbolic dim is never
// assumed to be 1, so a symbolic shape is refused.
bool at_most_one_element(const TensorType& t) {
  if (t.symbolic()) unsupported("an operand of shape {} must have one element, which the symbols do not decide", t.str());
  return shape_numel(t.shape) <= 1;
}

void register_selection(OpRegistry& r) {
  {
    OpDef d;
    d.name = "Where";
    d.since = 9;
    d.min_inputs = d.max_inputs = 3;
    d.fusion = FusionKind::pointwise;
    d.infer = [](InferCtx& ctx) {
      if (!is_bool(ctx.in(0).dtype))
        fail("condition must be bool, got {}", dtype_name(ctx.in(0).dtype));
      if (ctx.in(1).dtype != ctx.in(2).dtype)
        fail("X and Y have different dtypes {} and {}", dtype_name(ctx.in(1).dtype),
             dtype_name(ctx.in(2).dtype));
      Dims s = broadcast_dims(broadcast_dims(ctx.in(0).dims(), ctx.in(1).dims()), ctx.in(2).dims());
      ctx.set_out(0, TensorType::of(ctx.in(1).dtype, s));
      if (is_int(ctx.in(1).dtype))
        set_sym_elementwise(ctx, {0, 1, 2}, ctx.in(1).dtype,
                            [](const std::vector<Dim>& e) -> std::optional<Dim> { return e[0] == 0 ? e[2] : e[1]; });
    };
    d.kernel = [](KernelCtx& c) { c.set_out(0, where_kernel(c.in(0), c.in(1), c.in(2))); };
    d.decompose = decompose_where;
    add(r, std::move(d));
  }
  {
    OpDef d;
    d.name = "Clip";
    d.since = 11;
    d.min_inputs = 1;
    d.max_inputs = 3;
    d.fusion = FusionKind::pointwise;
    // Attributes of the forms before opset 11, which the upgrade turns into inputs.
    d.attrs = {{"min", AttrKind::f}, {"max", AttrKind::f}, {"consumed_inputs", AttrKind::ints}};
    d.upgrade = upgrade_clip;
    d.infer = [](InferCtx& ctx) {
      for (const char* a : {"min", "max", "consumed_inputs"})
        if (ctx.node().has_attr(a))
          fail("Clip from opset 11 takes no '{}' attribute (min and max are inputs)", a);
      check_types(ctx, Types::numeric, 0);
      for (int i = 1; i < 3; ++i)
        if (ctx.has_in(i) && !at_most_one_element(ctx.in(i)))
          fail("Clip bound {} must be a scalar, got shape {}", i, shape_str(ctx.in(i).shape));
      infer_same_as_input(ctx);
    };
    d.kernel = [](KernelCtx& c) { c.set_out(0, clip_kernel(c)); };
    d.decompose = decompose_clip;
    add(r, std::move(d));
  }
  {
    OpDef d;
    d.name = "Identity";
    d.since = 1;
    d.fusion = FusionKind::injective;
    d.infer = [](InferCtx& ctx) {
      infer_same_as_input(ctx);
      forward_sym_value(ctx);
    };
    d.kernel = [](KernelCtx& c) { c.set_out(0, c.in(0)); };  // kernels never write into inputs
    d.decompose = [](CoreBuilder&, const Node& n) -> std::vector<Value*> { return {n.inputs[0]}; };
    add(r, std::move(d));
  }
  {
    OpDef d;
    d.name = "Dropout";
    d.since = 12;
    d.min_inputs = 1;
    d.max_inputs = 3;
    d.max_outputs = 2;
    d.deterministic = false;
    // ratio, is_test and consumed_inputs belong to the forms before opset 12 (upgraded).
    d.attrs = {{"seed", AttrKind::i},
               {"ratio", AttrKind::f},
               {"is_test", AttrKind::i},
               {"consumed_inputs", AttrKind::ints}};
    d.upgrade = upgrade_dropout;
    d.infer = [](InferCtx& ctx) {
      for (const char* a : {"ratio", "is_test", "consumed_inputs"})
        if (ctx.node().has_attr(a))
          fail("Dropout from opset 12 takes no '{}' attribute (ratio is an input)", a);
      check_types(ctx, Types::numeric, 0);
      if (ctx.has_in(1) && (!is_float(ctx.in(1).dtype) || !at_most_one_element(ctx.in(1))))
        fail("ratio must be a float scalar, got {}", ctx.in(1).str());
      if (ctx.has_in(2) && (!is_bool(ctx.in(2).dtype) || !at_most_one_element(ctx.in(2))))
        fail("training_mode must be a bool scalar, got {}", ctx.in(2).str());
      infer_same_as_input(ctx);
      ctx.set_out(1, with_dtype(ctx.in(0), DType::boolean));
    };
    d.kernel = [](KernelCtx& c) {
      const Tensor& x = c.in(0);
      for (int i = 1; i < 3; ++i)
        if (c.has_in(i) && c.in(i).numel() != 1)
          fail("{} must be a scalar, got shape {}", i == 1 ? "ratio" : "training_mode",
               shape_str(c.in(i).shape()));
      const double ratio = c.has_in(1) ? c.in(1).get_f(0) : 0.5;
      const bool training = c.has_in(2) && c.in(2).get_i(0) != 0;
      if (!training || ratio == 0) {
        c.set_out(0, x);
        if (c.wants_out(1)) c.set_out(1, dropout_mask_all(x.shape()));
        return;
      }
      if (!(ratio >= 0 && ratio < 1)) fail("ratio must be in [0, 1), got {}", ratio);
      // Training mode. With a seed, the mask draws uniform doubles from MT19937 seeded like
      // numpy's legacy RandomState (53 bits from two 32-bit outputs), so seeded runs agree with the
      // ONNX reference outputs; without one, every run draws a fresh mask.
      std::mt19937 rng(c.node().has_attr("seed") ? static_cast<uint32_t>(c.node().attr_i("seed"))
                                                 : std::random_device{}());
      auto uniform = [&rng]() {
        const uint32_t a = rng() >> 5, b = rng() >> 6;
        return (a * 67108864.0 + b) / 9007199254740992.0;
      };
      const double scale = 1.0 / (1.0 - ratio);
      Tensor y(x.dtype(), x.shape());
      Tensor m(DType::boolean, x.shape());
      for (int64_t i = 0; i < x.numel(); ++i) {
        const bool keep = uniform() >= ratio;
        const double v = x.get_f(i);
        m.bytes()[i] = keep;
        y.set_f(i, keep ? v * scale : v * 0.0);  // a dropped element is 0 * x, as mask * x is
      }
      c.set_out(0, std::move(y));
      if (c.wants_out(1)) c.set_out(1, std::move(m));
    };
    d.decompose = decompose_dropout;
    add(r, std::move(d));
  }
}

}  // namespace

void register_elementwise_ops(OpRegistry& r) {
  register_unary(r);
  register_binary(r);
  add(r, with_decomposition(comparison("Equal", 7, Cmp::eq), compare_as("eq")));
  add(r, with_decomposition(comparison("Less", 7, Cmp::lt), compare_as("lt")));
  add(r, with_decomposition(comparison("LessOrEqual", 12, Cmp::le), compare_as("le")));
  add(r, with_decomposition(comparison("Greater", 7, Cmp::gt), compare_as("gt")));
  add(r, with_decomposition(comparison("GreaterOrEqual", 12, Cmp::ge), compare_as("ge")));
  add(r, with_decomposition(variadic("Max", 6, Fold::max, Types::numeric), fold_as(CoreOp::max)));
  add(r, with_decomposition(variadic("Min", 6, Fold::min, Types::numeric), fold_as(CoreOp::min)));
  add(r, with_decomposition(variadic("Sum", 6, Fold::sum, Types::floats), fold_as(CoreOp::add)));
  add(r, with_decomposition(variadic("Mean", 6, Fold::mean, Types::floats), fold_as(CoreOp::add, true)));
  register_casts(r);
  register_selection(r);
}

}  // namespace tessel
