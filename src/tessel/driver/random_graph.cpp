// Seeded random graphs (see random_graph.h): draws ops with operands from a pool of f32 values and lets
// each op's shape rule (the op registry) reject invalid draws, which are then drawn again.
#include "tessel/driver/random_graph.h"

#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>

#include "tessel/ir/bind.h"
#include "tessel/ir/core_ops.h"
#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/ir/verifier.h"
#include "tessel/support/error.h"

namespace tessel::randgraph {

uint64_t Rng::next() {
  uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

int64_t Rng::uniform(int64_t lo, int64_t hi) {
  if (hi <= lo) return lo;
  return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
}

double Rng::real() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

namespace {

using Attrs = std::map<std::string, Attr>;

// Odd sizes on purpose: 1 (broadcast), primes (no even split over cores, tiles or vector lanes).
int64_t draw_dim(Rng& r, bool zero_dims) {
  if (zero_dims && r.chance(0.03)) return 0;
  static const std::vector<int64_t> dims = {1, 1, 2, 3, 3, 4, 5, 7, 7, 8, 13, 17};
  return r.pick(dims);
}

Shape draw_shape(Rng& r, const GenOptions& o, int min_rank = 0) {
  Shape s(static_cast<size_t>(r.uniform(min_rank, o.max_rank)));
  for (auto& d : s) d = draw_dim(r, o.zero_dims);
  return s;
}

// A special f32 value: what IEEE arithmetic and reduced-precision storage find hardest (NaN, the
// infinities, signed zeros, denormals, the edges of f16's range), all representable in f32 without
// making f32 sums overflow where double sums would not.
float special_value(Rng& r) {
  static const std::vector<float> v = {NAN, INFINITY, -INFINITY, -0.0f, 0.0f, 1e-40f, -3e-42f, 1e-30f, 6e4f, 7e4f,
                                       -1e5f, 1e-8f, 65504.0f, 1e-20f};
  return r.pick(v);
}

// Finite values at the edge of f32's range: sums and products of these overflow in f32 where eager's
// double accumulation does not (docs/random-graphs.md, "f32 range").
float extreme_value(Rng& r) {
  static const std::vector<float> v = {1e30f, -1e30f, 3e38f, -3e38f, std::numeric_limits<float>::max(), 1e-38f};
  return r.pick(v);
}

// Ordinary values in [-2, 2) on a 1/64 grid for half the tensors (exact in every storage dtype, so
// reduced-precision storage shows only arithmetic rounding), uniform for the rest.
float ordinary_value(Rng& r, bool grid) {
  if (grid) return static_cast<float>(r.uniform(-128, 127)) / 64.0f;
  return static_cast<float>(r.real() * 4.0 - 2.0);
}

Tensor random_tensor(Rng& r, const Shape& s, bool special) {
  Tensor t(DType::f32, s);
  float* d = t.data<float>();
  // One mode per tensor: mostly ordinary, sometimes sprinkled with specials or extremes, or scaled.
  const double mode = r.real();
  const bool grid = r.chance(0.5);
  const double scale = mode < 0.88 ? 1.0 : mode < 0.94 ? 1e4 : 1e-4;
  const double p_special = special && mode >= 0.66 && mode < 0.82 ? 0.15 : 0.0;
  const double p_extreme = special && mode >= 0.82 && mode < 0.88 ? 0.1 : 0.0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double u = r.real();
    d[i] = u < p_special ? special_value(r) : u < p_special + p_extreme ? extreme_value(r)
                                            : static_cast<float>(ordinary_value(r, grid) * scale);
  }
  return t;
}

Tensor ints(std::vector<int64_t> v) {
  return Tensor::from_i64(DType::i64, {static_cast<int64_t>(v.size())}, v);
}

// One graph being drawn.
struct Drawer {
  Rng& r;
  const GenOptions& o;
  Graph& g;
  std::vector<Value*> pool;   // f32 values ops may consume
  std::vector<Value*> extra_outputs;  // non-f32 results (ArgMax): outputs only
  int counter = 0;

  std::string fresh(const char* base) { return fmt::format("{}{}", base, counter++); }

  Value* leaf(const Shape& s) {
    // Mostly graph inputs (the backends compute on them); sometimes constants (weights, folding).
    if (r.chance(0.8)) return g.add_input(fresh("in"), TensorType{DType::f32, s});
    return g.add_constant(fresh("w"), random_tensor(r, s, o.special_values));
  }
  Value* const_i64(std::vector<int64_t> v) { return g.add_constant(fresh("c"), ints(std::move(v))); }
  Value* const_f32(float x) { return g.add_constant(fresh("c"), Tensor::scalar_f(DType::f32, x)); }

  Value* operand() {
    if (pool.empty() || r.chance(0.15)) {
      Value* v = leaf(draw_shape(r, o));
      pool.push_back(v);
      return v;
    }
    // Prefer recent values: longer chains.
    const int64_t n = static_cast<int64_t>(pool.size());
    return pool[static_cast<size_t>(r.chance(0.6) ? n - 1 : r.uniform(0, n - 1))];
  }

  // A shape that broadcasts with `s`: drop leading dims, set some to 1, or add a leading dim.
  Shape broadcast_partner(const Shape& s) {
    Shape p = s;
    if (!p.empty() && r.chance(0.3)) p.erase(p.begin(), p.begin() + r.uniform(1, static_cast<int64_t>(p.size())));
    for (auto& d : p)
      if (r.chance(0.3)) d = 1;
    if (static_cast<int>(p.size()) < o.max_rank && r.chance(0.15)) p.insert(p.begin(), draw_dim(r, o.zero_dims));
    return p;
  }

  Value* partner(Value* x) {
    // Another pool value of a broadcast-compatible shape when there is one, else a new leaf.
    if (r.chance(0.4)) {
      std::vector<Value*> ok;
      for (Value* v : pool)
        if (v != x) {
          try {
            broadcast_shapes(v->type.shape, x->type.shape);
            ok.push_back(v);
          } catch (const Error&) {
          }
        }
      if (!ok.empty()) return r.pick(ok);
    }
    return leaf(broadcast_partner(x->type.shape));
  }

  int64_t axis_of(const Value* x, bool allow_negative = true) {
    const int64_t rank = static_cast<int64_t>(x->type.shape.size());
    if (rank == 0) return 0;
    const int64_t a = r.uniform(0, rank - 1);
    return allow_negative && r.chance(0.3) ? a - rank : a;
  }

  std::vector<int64_t> axes_of(const Value* x) {
    std::vector<int64_t> a;
    const int64_t rank = static_cast<int64_t>(x->type.shape.size());
    for (int64_t i = 0; i < rank; ++i)
      if (r.chance(0.5)) a.push_back(r.chance(0.3) ? i - rank : i);
    return a;
  }

  // Adds the node when the op's shape rule accepts it; returns its outputs, or nothing.
  std::optional<std::vector<Value*>> try_add(const std::string& op, const std::vector<Value*>& ins, Attrs attrs,
                                             int outputs = 1) {
    const OpDef* def = OpRegistry::get().find(op);
    if (!def) fail("random graph: no op '{}'", op);
    const int n_in = static_cast<int>(ins.size());  // shape rules leave the arity to the verifier
    if (n_in < def->min_inputs || (def->max_inputs >= 0 && n_in > def->max_inputs)) fail("random graph: {} takes {}..{} inputs", op, def->min_inputs, def->max_inputs);
    Node probe;
    probe.op = def;
    probe.inputs = ins;
    probe.attrs = attrs;
    std::vector<Value> outs(static_cast<size_t>(outputs));
    for (auto& v : outs) probe.outputs.push_back(&v);
    std::vector<const Tensor*> known;
    for (const Value* v : ins) known.push_back(v && v->constant ? &*v->constant : nullptr);
    try {
      infer_node(probe, known, nullptr);
    } catch (const Error&) {
      return std::nullopt;
    }
    for (const Value& v : outs)
      if (!shape_known(v.type.shape) || shape_numel(v.type.shape) > 4096) return std::nullopt;
    std::vector<std::string> names;
    for (int i = 0; i < outputs; ++i) names.push_back(fresh("v"));
    Node* n = g.add_node(def, fresh("n"), ins, names, std::move(attrs));
    for (int i = 0; i < outputs; ++i) n->outputs[static_cast<size_t>(i)]->type = outs[static_cast<size_t>(i)].type;
    return n->outputs;
  }

  // ---- one function per op family: each draws operands and attributes and tries the node ----

  bool unary() {
    static const std::vector<std::string> ops = {"Relu", "Neg", "Abs", "Exp", "Log", "Sqrt", "Tanh", "Sigmoid", "Erf",
                                                 "Floor", "Ceil", "Reciprocal", "Sin", "Cos", "Softplus", "Round", "Sign",
                                                 "Identity", "Atan", "Softsign"};
    return add1(r.pick(ops), {operand()}, {});
  }

  bool unary_with_attrs() {
    Value* x = operand();
    switch (r.uniform(0, 3)) {
      case 0: return add1("LeakyRelu", {x}, {{"alpha", r.chance(0.5) ? 0.01 : -1.5}});
      case 1: return add1("Elu", {x}, {{"alpha", r.chance(0.5) ? 1.0 : 0.3}});
      case 2: return add1("HardSigmoid", {x}, {{"alpha", 0.2}, {"beta", r.chance(0.5) ? 0.5 : 0.1}});
      default: return add1("Selu", {x}, {});
    }
  }

  bool binary() {
    static const std::vector<std::string> ops = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "PRelu"};
    Value* x = operand();
    return add1(r.pick(ops), {x, partner(x)}, {});
  }

  bool variadic() {
    static const std::vector<std::string> ops = {"Sum", "Mean", "Max", "Min"};
    Value* x = operand();
    std::vector<Value*> ins = {x, partner(x)};
    if (r.chance(0.5)) ins.push_back(partner(x));
    return add1(r.pick(ops), ins, {});
  }

  bool where() {
    Value* a = operand();
    Value* b = partner(a);
    auto c = try_add(r.chance(0.5) ? "Greater" : "LessOrEqual", {a, b}, {});
    if (!c) return false;
    return add1("Where", {(*c)[0], r.chance(0.5) ? a : b, partner(a)}, {});
  }

  float clip_bound(bool low) {
    if (o.special_values && r.chance(0.25)) {
      static const std::vector<float> v = {NAN, INFINITY, -INFINITY, -0.0f, 1e30f};
      return r.pick(v);
    }
    return low ? static_cast<float>(r.uniform(-8, 2)) / 4.0f : static_cast<float>(r.uniform(-2, 8)) / 4.0f;
  }

  bool clip() {
    Value* x = operand();
    std::vector<Value*> ins = {x};
    const int form = static_cast<int>(r.uniform(0, 3));  // none, min, max, both
    ins.push_back(form & 1 ? const_f32(clip_bound(true)) : nullptr);
    if (form & 2) ins.push_back(const_f32(clip_bound(false)));
    while (!ins.empty() && !ins.back() && ins.size() > 1) ins.pop_back();
    return add1("Clip", ins, {});
  }

  bool relu_family() {  // core-friendly activations the compiled backend maps to oneDNN epilogues
    Value* x = r.chance(0.5) && !pool.empty() ? pool.back() : operand();
    if (r.chance(0.5)) return add1("Relu", {x}, {});
    return add1("Clip", {x, const_f32(clip_bound(true)), const_f32(clip_bound(false))}, {});
  }

  bool reduce() {
    static const std::vector<std::string> ops = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                                                 "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare", "ReduceL1"};
    Value* x = operand();
    std::vector<Value*> ins = {x};
    Attrs a = {{"keepdims", static_cast<int64_t>(r.chance(0.5))}};
    if (r.chance(0.85)) ins.push_back(const_i64(axes_of(x)));
    if (r.chance(0.1)) a["noop_with_empty_axes"] = int64_t{1};
    return add1(r.pick(ops), ins, a);
  }

  bool arg_reduce() {
    Value* x = operand();
    auto v = try_add(r.chance(0.5) ? "ArgMax" : "ArgMin", {x},
                     {{"axis", axis_of(x)}, {"keepdims", static_cast<int64_t>(r.chance(0.5))},
                      {"select_last_index", static_cast<int64_t>(r.chance(0.3))}});
    if (v) extra_outputs.push_back((*v)[0]);
    return v.has_value();
  }

  bool matmul() {
    Value* a = operand();
    const Shape& s = a->type.shape;
    if (s.empty()) return false;
    Shape bs;
    if (s.size() == 1 || r.chance(0.5)) {
      bs = {s.back(), draw_dim(r, o.zero_dims)};
    } else {
      bs = broadcast_partner(Shape(s.begin(), s.end() - 2));
      bs.push_back(s.back());
      bs.push_back(draw_dim(r, o.zero_dims));
    }
    return add1("MatMul", {a, leaf(bs)}, {});
  }

  bool gemm() {
    const int64_t m = draw_dim(r, o.zero_dims), k = draw_dim(r, o.zero_dims), n = draw_dim(r, o.zero_dims);
    const bool ta = r.chance(0.3), tb = r.chance(0.5);
    Value* a = nullptr;
    for (Value* v : pool)
      if (v->type.shape.size() == 2) a = v;
    const Shape as = a ? a->type.shape : (ta ? Shape{k, m} : Shape{m, k});
    if (!a) a = leaf(as);
    const int64_t K = ta ? as[0] : as[1], M = ta ? as[1] : as[0];
    std::vector<Value*> ins = {a, leaf(tb ? Shape{n, K} : Shape{K, n})};
    if (r.chance(0.7)) ins.push_back(leaf(r.chance(0.5) ? Shape{n} : r.chance(0.5) ? Shape{M, n} : Shape{1, n}));
    Attrs at = {{"transA", int64_t{ta}}, {"transB", int64_t{tb}}};
    if (r.chance(0.4)) at["alpha"] = r.chance(0.5) ? 0.5 : -2.0;
    if (r.chance(0.4)) at["beta"] = r.chance(0.5) ? 0.0 : 1.5;
    return add1("Gemm", ins, at);
  }

  bool softmax() {
    Value* x = operand();
    return add1(r.chance(0.6) ? "Softmax" : "LogSoftmax", {x}, {{"axis", axis_of(x)}});
  }

  bool layer_norm() {
    Value* x = operand();
    const int64_t rank = static_cast<int64_t>(x->type.shape.size());
    if (rank == 0) return false;
    const int64_t axis = r.uniform(0, rank - 1);
    const Shape norm(x->type.shape.begin() + axis, x->type.shape.end());
    std::vector<Value*> ins = {x, leaf(norm)};
    if (r.chance(0.6)) ins.push_back(leaf(norm));
    return add1("LayerNormalization", ins,
                {{"axis", r.chance(0.3) ? axis - rank : axis}, {"epsilon", r.chance(0.8) ? 1e-5 : 0.0}});
  }

  bool reshape() {
    Value* x = operand();
    // Regroup the elements: a random factorisation of the element count, with a -1 or 0 sometimes.
    const int64_t n = shape_numel(x->type.shape);
    std::vector<int64_t> dims;
    int64_t left = n;
    const int rank = static_cast<int>(r.uniform(0, o.max_rank));
    for (int i = 0; i + 1 < rank && left > 0; ++i) {
      std::vector<int64_t> divs;
      for (int64_t d = 1; d <= left; ++d)
        if (left % d == 0) divs.push_back(d);
      const int64_t d = r.pick(divs);
      dims.push_back(d);
      left /= d;
    }
    if (rank > 0 || left != 1) dims.push_back(left);
    if (n == 0) dims = {0, r.pick(std::vector<int64_t>{1, 3, 5})};
    if (!dims.empty() && n > 0 && r.chance(0.3)) dims[static_cast<size_t>(r.uniform(0, static_cast<int64_t>(dims.size()) - 1))] = -1;
    return add1("Reshape", {x, const_i64(dims)}, {});
  }

  std::vector<int64_t> permutation(int64_t rank) {
    std::vector<int64_t> p(static_cast<size_t>(rank));
    std::iota(p.begin(), p.end(), 0);
    for (int64_t i = rank - 1; i > 0; --i) std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(r.uniform(0, i))]);
    return p;
  }

  bool transpose() {
    Value* x = operand();
    Attrs a;
    if (r.chance(0.8)) a["perm"] = permutation(static_cast<int64_t>(x->type.shape.size()));
    return add1("Transpose", {x}, a);
  }

  bool slice() {
    Value* x = operand();
    const Shape& s = x->type.shape;
    if (s.empty()) return false;
    std::vector<int64_t> starts, ends, axes, steps;
    for (int64_t ax = 0; ax < static_cast<int64_t>(s.size()); ++ax) {
      if (!r.chance(0.6)) continue;
      const int64_t d = s[static_cast<size_t>(ax)];
      const int64_t step = r.pick(std::vector<int64_t>{1, 1, 2, 3, -1, -2});
      int64_t b = r.uniform(-d - 2, d + 2), e = r.uniform(-d - 2, d + 2);
      if (r.chance(0.1)) e = step > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
      starts.push_back(b);
      ends.push_back(e);
      axes.push_back(r.chance(0.3) ? ax - static_cast<int64_t>(s.size()) : ax);
      steps.push_back(step);
    }
    if (starts.empty()) return false;
    std::vector<Value*> ins = {x, const_i64(starts), const_i64(ends), const_i64(axes)};
    if (r.chance(0.8)) ins.push_back(const_i64(steps));
    return add1("Slice", ins, {});
  }

  bool concat() {
    Value* x = operand();
    const Shape& s = x->type.shape;
    if (s.empty()) return false;
    const int64_t axis = axis_of(x, false);
    std::vector<Value*> ins = {x};
    for (int i = 0, n = static_cast<int>(r.uniform(1, 2)); i < n; ++i) {
      Shape t = s;
      t[static_cast<size_t>(axis)] = draw_dim(r, o.zero_dims);
      ins.push_back(r.chance(0.2) ? x : leaf(t));
    }
    return add1("Concat", ins, {{"axis", r.chance(0.3) ? axis - static_cast<int64_t>(s.size()) : axis}});
  }

  bool gather() {
    Value* x = operand();
    const Shape& s = x->type.shape;
    if (s.empty()) return false;
    const int64_t axis = axis_of(x, false), d = s[static_cast<size_t>(axis)];
    if (d == 0) return false;
    Shape is = draw_shape(r, o);
    if (is.size() > 2) is.resize(2);
    Tensor idx(DType::i64, is);
    for (int64_t i = 0; i < idx.numel(); ++i) idx.set_i(i, r.uniform(-d, d - 1));  // negatives wrap
    return add1("Gather", {x, g.add_constant(fresh("idx"), idx)}, {{"axis", axis}});
  }

  bool squeeze_unsqueeze() {
    Value* x = operand();
    const int64_t rank = static_cast<int64_t>(x->type.shape.size());
    if (r.chance(0.5)) {
      std::vector<int64_t> axes;
      for (int64_t i = 0; i < rank; ++i)
        if (x->type.shape[static_cast<size_t>(i)] == 1 && r.chance(0.7)) axes.push_back(i);
      if (axes.empty()) return add1("Squeeze", {x}, {});
      return add1("Squeeze", {x, const_i64(axes)}, {});
    }
    const int64_t a = r.uniform(-rank - 1, rank);
    return add1("Unsqueeze", {x, const_i64({a})}, {});
  }

  bool flatten_expand() {
    Value* x = operand();
    const int64_t rank = static_cast<int64_t>(x->type.shape.size());
    if (r.chance(0.5)) return add1("Flatten", {x}, {{"axis", r.uniform(-rank, rank)}});
    Shape t = x->type.shape;
    for (auto& d : t)
      if (d == 1 && r.chance(0.7)) d = draw_dim(r, o.zero_dims);
    if (static_cast<int>(t.size()) < o.max_rank && r.chance(0.3)) t.insert(t.begin(), draw_dim(r, false));
    if (r.chance(0.3) && !t.empty()) t.back() = 1;  // broadcasting the other way round
    return add1("Expand", {x, const_i64(t)}, {});
  }

  bool pad() {
    Value* x = operand();
    const int64_t rank = static_cast<int64_t>(x->type.shape.size());
    std::vector<int64_t> pads(static_cast<size_t>(2 * rank));
    for (auto& p : pads) p = r.uniform(-1, 2);
    static const std::vector<std::string> modes = {"constant", "constant", "reflect", "edge"};
    std::vector<Value*> ins = {x, const_i64(pads)};
    if (r.chance(0.5)) ins.push_back(const_f32(o.special_values && r.chance(0.2) ? NAN : -1.25f));
    bool empty = false;  // edge and reflect need elements to copy
    for (int64_t d : x->type.shape) empty = empty || d == 0;
    return add1("Pad", ins, {{"mode", empty ? std::string("constant") : r.pick(modes)}});
  }

  bool cumsum() {
    Value* x = operand();
    if (x->type.shape.empty()) return false;
    return add1("CumSum", {x, g.add_constant(fresh("c"), Tensor::scalar_i(DType::i64, axis_of(x)))},
                {{"exclusive", static_cast<int64_t>(r.chance(0.3))}, {"reverse", static_cast<int64_t>(r.chance(0.3))}});
  }

  // ---- core ops, drawn directly (the graph level accepts them; eager runs their reference kernels) ----

  bool core_unary() {
    // Every unary row of the core-op table, in table order (the order fixes what a seed draws).
    static const std::vector<std::string> ops = [] {
      std::vector<std::string> v;
      for (const CoreOpInfo& i : kCoreOps)
        if (i.kind == CoreKind::unary) v.emplace_back(i.name);
      return v;
    }();
    return add1(r.pick(ops), {operand()}, {});
  }

  bool core_binary() {
    static const std::vector<std::string> ops = {"add", "mul", "div", "rem", "pow", "max", "min"};
    Value* x = operand();
    Value* y = nullptr;
    for (Value* v : pool)
      if (v != x && v->type == x->type && r.chance(0.5)) y = v;
    return add1(r.pick(ops), {x, y ? y : leaf(x->type.shape)}, {});
  }

  bool core_select() {
    static const std::vector<std::string> dirs = {"eq", "ne", "lt", "le", "gt", "ge"};
    Value* a = operand();
    Value* b = leaf(a->type.shape);
    auto c = try_add("compare", {a, b}, {{"direction", r.pick(dirs)}});
    return c && add1("select", {(*c)[0], a, b}, {});
  }

  bool core_reduce() {
    static const std::vector<std::string> kinds = {"sum", "max", "min", "prod"};
    Value* x = operand();
    std::vector<int64_t> axes;
    for (int64_t i = 0; i < static_cast<int64_t>(x->type.shape.size()); ++i)
      if (r.chance(0.5)) axes.push_back(i);
    return add1("reduce", {x}, {{"kind", r.pick(kinds)}, {"axes", axes}});
  }

  bool core_movement() {
    Value* x = operand();
    const Shape& s = x->type.shape;
    const int64_t rank = static_cast<int64_t>(s.size());
    switch (r.uniform(0, 3)) {
      case 0: return add1("transpose", {x}, {{"perm", permutation(rank)}});
      case 1: {
        std::vector<int64_t> st, sp, str;
        for (int64_t d : s) {
          const int64_t stride = r.chance(0.7) ? r.uniform(1, 3) : -r.uniform(1, 2);
          int64_t a = stride > 0 ? r.uniform(0, d) : r.uniform(0, std::max<int64_t>(d - 1, 0));
          int64_t b = stride > 0 ? r.uniform(a, d) : r.uniform(-1, a);
          if (d == 0 && stride < 0) a = b = 0;
          st.push_back(a), sp.push_back(b), str.push_back(d == 0 ? 1 : stride);
        }
        return add1("slice", {x}, {{"starts", st}, {"stops", sp}, {"strides", str}});
      }
      case 2: {
        std::vector<int64_t> lo, hi, in;
        for (int64_t i = 0; i < rank; ++i) lo.push_back(r.uniform(-1, 2)), hi.push_back(r.uniform(-1, 2)), in.push_back(r.uniform(0, 1));
        return add1("pad", {x, const_f32(r.chance(0.8) ? 0.5f : -INFINITY)}, {{"low", lo}, {"high", hi}, {"interior", in}});
      }
      default: {
        // broadcast_in_dim into a shape with one more leading dim
        Shape out = s;
        out.insert(out.begin(), draw_dim(r, o.zero_dims));
        std::vector<int64_t> dims;
        for (int64_t i = 0; i < rank; ++i) dims.push_back(i + 1);
        for (int64_t i = 0; i < rank; ++i)
          if (s[static_cast<size_t>(i)] == 1 && r.chance(0.5)) out[static_cast<size_t>(i + 1)] = draw_dim(r, false);
        return add1("broadcast_in_dim", {x}, {{"shape", out}, {"dims", dims}});
      }
    }
  }

  bool core_dot() {
    Value* a = operand();
    const Shape& s = a->type.shape;
    if (s.empty()) return false;
    // contract a's last dim with a new operand's first; batch over a's first dim when rank 3
    const int64_t rank = static_cast<int64_t>(s.size());
    if (rank == 3 && r.chance(0.5)) {
      Value* b = leaf({s[0], s[2], draw_dim(r, o.zero_dims)});
      return add1("dot_general", {a, b},
                  {{"lhs_batch", std::vector<int64_t>{0}}, {"rhs_batch", std::vector<int64_t>{0}},
                   {"lhs_contract", std::vector<int64_t>{2}}, {"rhs_contract", std::vector<int64_t>{1}}});
    }
    Value* b = leaf({s.back(), draw_dim(r, o.zero_dims)});
    return add1("dot_general", {a, b},
                {{"lhs_contract", std::vector<int64_t>{rank - 1}}, {"rhs_contract", std::vector<int64_t>{0}}});
  }

  bool add1(const std::string& op, const std::vector<Value*>& ins, Attrs attrs) {
    auto v = try_add(op, ins, std::move(attrs));
    if (!v) return false;
    pool.push_back((*v)[0]);
    return true;
  }

  using Family = bool (Drawer::*)();
  struct Weighted {
    Family f;
    int weight;
  };
  static const std::vector<Weighted>& families() {
    static const std::vector<Weighted> f = {
        {&Drawer::unary, 6},          {&Drawer::unary_with_attrs, 2}, {&Drawer::binary, 8},
        {&Drawer::variadic, 2},       {&Drawer::where, 2},            {&Drawer::clip, 4},
        {&Drawer::relu_family, 2},    {&Drawer::reduce, 5},           {&Drawer::arg_reduce, 1},
        {&Drawer::matmul, 4},         {&Drawer::gemm, 3},             {&Drawer::softmax, 3},
        {&Drawer::layer_norm, 2},     {&Drawer::reshape, 3},          {&Drawer::transpose, 3},
        {&Drawer::slice, 3},          {&Drawer::concat, 3},           {&Drawer::gather, 2},
        {&Drawer::squeeze_unsqueeze, 2}, {&Drawer::flatten_expand, 2}, {&Drawer::pad, 2},
        {&Drawer::cumsum, 1},         {&Drawer::core_unary, 2},       {&Drawer::core_binary, 2},
        {&Drawer::core_select, 1},    {&Drawer::core_reduce, 2},      {&Drawer::core_movement, 3},
        {&Drawer::core_dot, 2},
    };
    return f;
  }

  bool draw_one() {
    int total = 0;
    for (const auto& w : families()) total += w.weight;
    int64_t x = r.uniform(0, total - 1);
    for (const auto& w : families()) {
      if (x < w.weight) return (this->*w.f)();
      x -= w.weight;
    }
    return false;
  }
};

}  // namespace

std::unique_ptr<Graph> random_graph(uint64_t seed, const GenOptions& opts) {
  Rng r(seed);
  auto g = std::make_unique<Graph>();
  g->name = fmt::format("rand{}", seed);
  Drawer d{r, opts, *g};
  const int nodes = static_cast<int>(r.uniform(1, opts.max_nodes));
  int added = 0;
  for (int attempt = 0; added < nodes && attempt < nodes * 30; ++attempt) added += d.draw_one();
  if (added == 0) {  // always at least one op
    Value* x = g->add_input("in_fallback", TensorType{DType::f32, {3}});
    d.pool.push_back(x);
    d.add1("Relu", {x}, {});
  }
  // Outputs: every value nothing consumes (the sinks), then the non-f32 results.
  std::vector<int> uses = g->use_counts();
  for (const auto& n : g->nodes())
    for (Value* v : n->outputs)
      if (v && uses[static_cast<size_t>(v->id)] == 0) g->outputs.push_back(v);
  g->compact();
  return g;
}

std::vector<Tensor> random_inputs(const Graph& g, uint64_t seed, bool special_values) {
  if (!g.symbols.empty()) {
    Bindings lowest;
    for (const auto& [name, info] : g.symbols.all()) lowest[name] = info.lo;
    return random_inputs(*instantiate_graph(g, lowest), seed, special_values);
  }
  std::vector<Tensor> in;
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const TensorType& t = g.inputs[i]->type;
    uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a of the name: values follow the input, not its position
    for (char c : g.inputs[i]->name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ULL;
    Rng r(seed * 0x9e3779b97f4a7c15ULL ^ h);
    if (t.dtype != DType::f32) fail("random graph inputs: input {} is {}, only f32 is drawn", i, t.str());
    in.push_back(random_tensor(r, t.shape, special_values));
  }
  return in;
}

std::unique_ptr<Graph> symbolize(const Graph& g, const std::string& name) {
  if (g.inputs.empty() || !g.symbols.empty()) return nullptr;
  int64_t n = 1;
  for (int64_t d : g.inputs[0]->type.shape) n = std::max(n, d);
  if (n <= 1) return nullptr;
  auto s = instantiate_graph(g, {});
  const Dim sym = Dim::symbol(name);
  for (Value* v : s->inputs) {
    Dims d = v->type.dims();
    for (Dim& x : d)
      if (x == n) x = sym;
    v->type = TensorType::of(v->type.dtype, d);
  }
  s->symbols.declare(SymbolInfo{name, n, n + 16});
  try {
    infer_graph(*s);
    verify_graph(*s);
  } catch (const Error&) {
    return nullptr;  // a size the graph fixes elsewhere
  }
  return s;
}

std::vector<std::string> generated_ops() {
  return {"Relu", "Neg", "Abs", "Exp", "Log", "Sqrt", "Tanh", "Sigmoid", "Erf", "Floor", "Ceil", "Reciprocal", "Sin",
          "Cos", "Softplus", "Round", "Sign", "Identity", "Atan", "Softsign", "LeakyRelu", "Elu", "HardSigmoid", "Selu",
          "Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "PRelu", "Sum", "Mean", "Greater", "LessOrEqual", "Where",
          "Clip", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceLogSumExp",
          "ReduceSumSquare", "ReduceL1", "ArgMax", "ArgMin", "MatMul", "Gemm", "Softmax", "LogSoftmax",
          "LayerNormalization", "Reshape", "Transpose", "Slice", "Concat", "Gather", "Squeeze", "Unsqueeze", "Flatten",
          "Expand", "Pad", "CumSum", "neg", "exp", "log", "sqrt", "sin", "atan", "erf", "tanh", "floor", "round_even",
          "add", "mul", "div", "rem", "pow", "max", "min", "compare", "select", "reduce", "transpose", "slice", "pad",
          "broadcast_in_dim", "dot_general"};
}

}  // namespace tessel::randgraph
