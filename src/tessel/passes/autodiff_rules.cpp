// The vector-Jacobian rule of every core primitive (the `vjp` column of ir/core_ops.def): given the
// cotangent of a node's result, the core nodes that compute the cotangents of its operands.
//
// core_vjp switches over CoreOp without a default, so a new primitive does not compile until it has a
// case here; tests/autodiff_test.cpp checks each rule against central differences in f64. Semantics of
// every primitive: docs/ir/core.md. Ties (max/min, reduce max) split or pick as docs/passes/autodiff.md
// says; rules that divide by an operand (reduce prod, scatter mul) assume it is non-zero.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "tessel/ir/core_builder.h"
#include "tessel/ir/core_ops.h"
#include "tessel/passes/autodiff.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

using Ints = std::vector<int64_t>;

DType dt(const Value* v) { return v->type.dtype; }
const Shape& shp(const Value* v) { return v->type.shape; }
int64_t rank(const Value* v) { return static_cast<int64_t>(v->type.shape.size()); }

Value* zeros_like(CoreBuilder& b, const Value* v) { return b.full(dt(v), shp(v), 0.0); }
Value* neg(CoreBuilder& b, Value* v) { return b.unary(CoreOp::neg, v); }
Value* sc(CoreBuilder& b, const Value* like, double v) { return b.scalar(dt(like), v); }

// select(pred, v, 0)
Value* where(CoreBuilder& b, Value* pred, Value* v) { return b.select(pred, v, zeros_like(b, v)); }

Value* pad(CoreBuilder& b, Value* v, const Ints& low, const Ints& high, const Ints& interior) {
  bool id = true;
  for (size_t d = 0; d < low.size(); ++d) id = id && low[d] == 0 && high[d] == 0 && interior[d] == 0;
  if (id) return v;
  return b.emit(CoreOp::pad, {v, sc(b, v, 0.0)}, {{"low", low}, {"high", high}, {"interior", interior}});
}

Value* reduce_sum(CoreBuilder& b, Value* v, const Ints& axes) {
  if (axes.empty()) return v;
  return b.emit(CoreOp::reduce, {v}, {{"kind", std::string("sum")}, {"axes", axes}});
}

// Broadcasts `v` (the result of reducing `axes` out of shape `full`) back to `full`.
Value* unreduce(CoreBuilder& b, Value* v, const Shape& full, const Ints& axes) {
  Ints dims;
  for (int64_t d = 0; d < static_cast<int64_t>(full.size()); ++d)
    if (std::find(axes.begin(), axes.end(), d) == axes.end()) dims.push_back(d);
  if (dims.size() == full.size()) return v;
  return b.emit(CoreOp::broadcast_in_dim, {v}, {{"shape", Ints(full)}, {"dims", dims}});
}

// transpose(v, perm) where result dim i is v's dim perm[i]: `src[j]` names the operand dim that v's dim
// j holds; the result puts operand dim a at position a.
Value* to_operand_order(CoreBuilder& b, Value* v, const Ints& src) {
  Ints perm(src.size());
  for (size_t j = 0; j < src.size(); ++j) perm[src[j]] = static_cast<int64_t>(j);
  return b.transpose(v, perm);
}

// ---- elementwise ---------------------------------------------------------------------------------

// Whether `v` is computed from constants alone (a constant, or a few broadcasts, reshapes or converts
// of one): such an operand of max/min is a bound, like relu's 0, not a value with a gradient.
bool constant_expr(const Value* v, int depth = 6) {
  if (!v) return false;
  if (v->constant) return true;
  if (v->is_input || !v->producer || depth == 0) return false;
  for (const Value* u : v->producer->inputs)
    if (u && !constant_expr(u, depth - 1)) return false;
  return true;
}


Value* unary_vjp(CoreBuilder& b, CoreOp op, const Node& n, Value* g) {
  Value* x = n.inputs[0];
  Value* y = n.outputs[0];
  switch (op) {
    case CoreOp::neg: return neg(b, g);
    case CoreOp::exp: return b.mul(g, y);
    case CoreOp::log: return b.div(g, x);
    case CoreOp::sqrt: return b.div(g, b.mul(y, sc(b, y, 2.0)));
    // cos x = sin(x + pi/2): the core level has no cos.
    case CoreOp::sin: return b.mul(g, b.unary(CoreOp::sin, b.add(x, sc(b, x, std::numbers::pi / 2))));
    case CoreOp::atan: return b.div(g, b.add(b.mul(x, x), sc(b, x, 1.0)));
    case CoreOp::erf:  // 2/sqrt(pi) exp(-x^2)
      return b.mul(g, b.mul(b.unary(CoreOp::exp, neg(b, b.mul(x, x))), sc(b, x, 2.0 / std::sqrt(std::numbers::pi))));
    case CoreOp::tanh: return b.mul(g, b.sub(sc(b, y, 1.0), b.mul(y, y)));
    default: fail("no unary rule for {}", core_op_name(op));
  }
}

std::vector<Value*> binary_vjp(CoreBuilder& b, CoreOp op, const Node& n, Value* g, const std::vector<bool>& need) {
  Value* a = n.inputs[0];
  Value* c = n.inputs[1];
  Value* y = n.outputs[0];
  Value* ga = nullptr;
  Value* gc = nullptr;
  switch (op) {
    case CoreOp::add:
      ga = g, gc = g;
      break;
    case CoreOp::mul:
      if (need[0]) ga = b.mul(g, c);
      if (need[1]) gc = b.mul(g, a);
      break;
    case CoreOp::div:
      if (need[0]) ga = b.div(g, c);
      if (need[1]) gc = neg(b, b.div(b.mul(g, y), c));  // -g a / c^2 = -g y / c
      break;
    case CoreOp::rem:
      // fmod(a, c) = a - trunc(a / c) c, and trunc(a / c) = (a - y) / c: piecewise, d/dc = -trunc(a/c).
      if (need[0]) ga = g;
      if (need[1]) gc = neg(b, b.mul(g, b.div(b.sub(a, y), c)));
      break;
    case CoreOp::pow:
      // d/da = c a^(c-1) (not c y / a: a may be 0); d/dc = y log a.
      if (need[0]) ga = b.mul(g, b.mul(c, b.binary(CoreOp::pow, a, b.sub(c, sc(b, c, 1.0)))));
      if (need[1]) gc = b.mul(g, b.mul(y, b.unary(CoreOp::log, a)));
      break;
    case CoreOp::max:
    case CoreOp::min: {
      // The operand that wins gets g. A tie with a constant operand goes wholly to the constant, so the
      // other gets 0: relu = max(x, 0) has relu'(0) = 0 and a clip bound passes nothing at the bound, as
      // PyTorch's threshold_backward and hardtanh_backward. A tie of two computed operands splits g/2
      // each (torch.maximum, jax.lax.max). docs/decisions.md, "Training: ties of max and min".
      Value* win_a = b.compare(op == CoreOp::max ? "gt" : "lt", a, c);
      Value* tie = b.compare("eq", a, c);
      const bool ka = constant_expr(a), kc = constant_expr(c);
      Value* zero = zeros_like(b, g);
      Value* tie_a = ka == kc ? b.mul(g, sc(b, g, 0.5)) : ka ? g : zero;  // what operand a gets on a tie
      Value* tie_c = ka == kc ? tie_a : kc ? g : zero;
      if (need[0]) ga = b.select(win_a, g, b.select(tie, tie_a, zero));
      if (need[1]) gc = b.select(win_a, zero, b.select(tie, tie_c, g));
      break;
    }
    default: fail("no binary rule for {}", core_op_name(op));
  }
  return {need[0] ? ga : nullptr, need[1] ? gc : nullptr};
}

// ---- reductions ----------------------------------------------------------------------------------

Value* reduce_vjp(CoreBuilder& b, const Node& n, Value* g) {
  Value* x = n.inputs[0];
  Value* y = n.outputs[0];
  const std::string kind = n.attr_s("kind");
  const Ints axes = n.attr_ints("axes");
  const Shape& s = shp(x);
  Value* gb = unreduce(b, g, s, axes);
  if (kind == "sum") return gb;
  if (kind == "max" || kind == "min") {
    // The cotangent is shared evenly by the elements equal to the extremum (jax.lax.reduce_max).
    Value* hit = b.compare("eq", x, unreduce(b, y, s, axes));
    Value* count = reduce_sum(b, b.select(hit, b.full(dt(x), s, 1.0), zeros_like(b, x)), axes);
    return where(b, hit, unreduce(b, b.div(g, count), s, axes));
  }
  if (kind == "prod") return b.div(b.mul(gb, unreduce(b, y, s, axes)), x);  // assumes no zero element
  fail("reduce kind '{}' has no derivative", kind);
}

struct Window {
  Ints k, s, d, lo, hi, in, out;
};

Window window_of(const Node& n) {
  Window w;
  const Value* x = n.inputs[0];
  const size_t r = shp(x).size();
  w.k = n.attr_ints("window");
  w.s = n.attr_ints("strides", Ints(r, 1));
  w.d = n.attr_ints("dilations", Ints(r, 1));
  const Ints p = n.attr_ints("padding", Ints(2 * r, 0));
  for (size_t i = 0; i < r; ++i) {
    w.lo.push_back(p[2 * i]);
    w.hi.push_back(p[2 * i + 1]);
  }
  w.in = Ints(shp(x));
  w.out = Ints(shp(n.outputs[0]));
  return w;
}

// The transpose of a strided window sum: each input element gets the sum of the cotangents of the
// windows it is in. The cotangent, dilated by the strides (interior padding), summed over the
// mirrored window: reduce_window sum with the same window and dilations, stride 1.
Value* window_sum_vjp(CoreBuilder& b, const Window& w, Value* g) {
  const size_t r = w.k.size();
  Ints interior(r), zero(r, 0), padding;
  for (size_t i = 0; i < r; ++i) interior[i] = w.s[i] - 1;
  Value* gd = pad(b, g, zero, zero, interior);
  for (size_t i = 0; i < r; ++i) {
    const int64_t dilated = (w.out[i] - 1) * w.s[i] + 1;
    padding.push_back(w.d[i] * (w.k[i] - 1) - w.lo[i]);
    padding.push_back(w.in[i] - dilated + w.lo[i]);
  }
  return b.emit(CoreOp::reduce_window, {gd},
                {{"kind", std::string("sum")}, {"window", w.k}, {"dilations", w.d}, {"padding", padding}});
}

// max/min/prod windows, one window tap at a time: tap t of every window is a strided slice of the
// padded input (the result's shape); its cotangent goes back through the slice's transpose (a pad).
// max/min give each window's cotangent to its first extremal tap (PyTorch's max_pool picks the first).
Value* window_taps_vjp(CoreBuilder& b, const Node& n, const Window& w, const std::string& kind, Value* g) {
  Value* x = n.inputs[0];
  Value* y = n.outputs[0];
  const size_t r = w.k.size();
  const double ident = kind == "max" ? -INFINITY : kind == "min" ? INFINITY : 1.0;
  Ints interior(r), padded(r);
  for (size_t i = 0; i < r; ++i) {
    interior[i] = w.s[i] - 1;
    padded[i] = w.in[i] + w.lo[i] + w.hi[i];
  }
  Value* xp = b.emit(CoreOp::pad, {x, sc(b, x, ident)}, {{"low", w.lo}, {"high", w.hi}, {"interior", Ints(r, 0)}});
  std::vector<Ints> starts;
  std::vector<Value*> taps;
  Ints t(r, 0);
  while (true) {
    Ints st(r), sp(r);
    for (size_t i = 0; i < r; ++i) {
      st[i] = t[i] * w.d[i];
      sp[i] = st[i] + (w.out[i] - 1) * w.s[i] + 1;
    }
    starts.push_back(st);
    taps.push_back(b.slice(xp, st, sp, w.s));
    size_t i = r;
    while (i > 0 && ++t[i - 1] == w.k[i - 1]) t[--i] = 0;
    if (i == 0) break;
  }
  const size_t T = taps.size();
  std::vector<Value*> gt(T);
  if (kind == "prod") {
    // The product of the other taps, from prefix and suffix products (no division by a zero tap).
    std::vector<Value*> pre(T), suf(T);
    for (size_t i = 0; i < T; ++i) pre[i] = i == 0 ? nullptr : (i == 1 ? taps[0] : b.mul(pre[i - 1], taps[i - 1]));
    for (size_t i = T; i-- > 0;) suf[i] = i + 1 == T ? nullptr : (i + 2 == T ? taps[T - 1] : b.mul(suf[i + 1], taps[i + 1]));
    for (size_t i = 0; i < T; ++i) {
      Value* o = pre[i] && suf[i] ? b.mul(pre[i], suf[i]) : pre[i] ? pre[i] : suf[i];
      gt[i] = o ? b.mul(g, o) : g;
    }
  } else {
    // first[o] = the lowest tap index equal to the window's result.
    Value* first = b.full(dt(y), shp(y), static_cast<double>(T));
    for (size_t i = T; i-- > 0;)
      first = b.select(b.compare("eq", taps[i], y), b.full(dt(y), shp(y), static_cast<double>(i)), first);
    for (size_t i = 0; i < T; ++i)
      gt[i] = where(b, b.compare("eq", first, b.full(dt(y), shp(y), static_cast<double>(i))), g);
  }
  Value* gp = nullptr;
  for (size_t i = 0; i < T; ++i) {
    Ints high(r);
    for (size_t d = 0; d < r; ++d) high[d] = padded[d] - (starts[i][d] + (w.out[d] - 1) * w.s[d] + 1);
    Value* back = pad(b, gt[i], starts[i], high, interior);
    gp = gp ? b.add(gp, back) : back;
  }
  Ints nlo(r), nhi(r);
  for (size_t i = 0; i < r; ++i) nlo[i] = -w.lo[i], nhi[i] = -w.hi[i];
  return pad(b, gp, nlo, nhi, Ints(r, 0));  // undo the padding (a negative pad crops)
}

Value* reduce_window_vjp(CoreBuilder& b, const Node& n, Value* g) {
  const Window w = window_of(n);
  for (int64_t o : w.out)
    if (o == 0) return zeros_like(b, n.inputs[0]);
  const std::string kind = n.attr_s("kind");
  if (kind == "sum") return window_sum_vjp(b, w, g);
  if (kind == "max" || kind == "min" || kind == "prod") return window_taps_vjp(b, n, w, kind, g);
  fail("reduce_window kind '{}' has no derivative", kind);
}

// ---- contractions --------------------------------------------------------------------------------

// y = dot_general(a, c): dims [batch, a free, c free]. The cotangent of a contracts g's c-free dims
// with c's free dims (batching the batch dims); the result's dims come out as [batch, a free, a
// contract (in the order of c's contract dims sorted)] and are transposed back to a's layout.
std::vector<Value*> dot_vjp(CoreBuilder& b, const Node& n, Value* g, const std::vector<bool>& need) {
  Value* a = n.inputs[0];
  Value* c = n.inputs[1];
  const Ints lb = n.attr_ints("lhs_batch", {}), rb = n.attr_ints("rhs_batch", {});
  const Ints lc = n.attr_ints("lhs_contract"), rc = n.attr_ints("rhs_contract");
  auto free_dims = [](int64_t r, const Ints& bd, const Ints& cd) {
    Ints f;
    for (int64_t d = 0; d < r; ++d)
      if (std::find(bd.begin(), bd.end(), d) == bd.end() && std::find(cd.begin(), cd.end(), d) == cd.end())
        f.push_back(d);
    return f;
  };
  const Ints lf = free_dims(rank(a), lb, lc), rf = free_dims(rank(c), rb, rc);
  const int64_t nb = static_cast<int64_t>(lb.size()), nlf = static_cast<int64_t>(lf.size());
  const int64_t nrf = static_cast<int64_t>(rf.size());
  auto range = [](int64_t from, int64_t count) {
    Ints v;
    for (int64_t i = 0; i < count; ++i) v.push_back(from + i);
    return v;
  };
  // One side's cotangent: g against the other operand `o` (its batch dims ob, free dims of), giving
  // [batch, my free, o's remaining dims = o's contract dims in increasing order].
  // The swapped product o·g = [batch, o's remaining dims, my free] is emitted instead when the
  // transposes that follow it are cheaper: the library reads a transposed operand through strides,
  // while a transposed result is a copy. What follows is the transpose back to my operand's order and,
  // when my operand is itself a transpose (Linear's weight, attention's heads), that transpose's VJP,
  // which algebraic composes with it: best none at all (a weight's gradient), next one that keeps the
  // last dim in place (attention's dv = aᵀ·g: row copies instead of element gathers).
  auto cost = [&](const Value* mine, const Ints& src) {
    Ints f(src.size());
    for (size_t j = 0; j < src.size(); ++j) f[static_cast<size_t>(src[j])] = static_cast<int64_t>(j);
    if (const Node* t = mine->producer; t && is_core_op(*t, CoreOp::transpose)) {
      const Ints q = t->attr_ints("perm");
      if (q.size() == f.size()) {
        Ints composed(f.size());
        for (size_t i = 0; i < q.size(); ++i) composed[static_cast<size_t>(q[i])] = f[i];
        f = composed;
      }
    }
    bool identity = true;
    for (size_t e = 0; e < f.size(); ++e) identity = identity && f[e] == static_cast<int64_t>(e);
    if (identity) return 0;
    return f.empty() || f.back() == static_cast<int64_t>(f.size() - 1) ? 1 : 2;
  };
  auto side = [&](Value* mine, Value* o, const Ints& ob, const Ints& of, const Ints& g_free, const Ints& mine_b,
                  const Ints& mine_f, const Ints& mine_c, const Ints& o_c) {
    Ints oc_sorted = o_c;
    std::sort(oc_sorted.begin(), oc_sorted.end());
    Ints from_o;
    for (int64_t od : oc_sorted) from_o.push_back(mine_c[std::find(o_c.begin(), o_c.end(), od) - o_c.begin()]);
    Ints src = mine_b, swapped = mine_b;
    src.insert(src.end(), mine_f.begin(), mine_f.end());
    src.insert(src.end(), from_o.begin(), from_o.end());
    swapped.insert(swapped.end(), from_o.begin(), from_o.end());
    swapped.insert(swapped.end(), mine_f.begin(), mine_f.end());
    if (cost(mine, swapped) < cost(mine, src))
      return to_operand_order(
          b,
          b.emit(CoreOp::dot_general, {o, g},
                 {{"lhs_batch", ob}, {"rhs_batch", range(0, nb)}, {"lhs_contract", of}, {"rhs_contract", g_free}}),
          swapped);
    Value* r = b.emit(CoreOp::dot_general, {g, o},
                      {{"lhs_batch", range(0, nb)}, {"rhs_batch", ob}, {"lhs_contract", g_free}, {"rhs_contract", of}});
    return to_operand_order(b, r, src);
  };
  Value* ga = need[0] ? side(a, c, rb, rf, range(nb + nlf, nrf), lb, lf, lc, rc) : nullptr;
  Value* gc = need[1] ? side(c, a, lb, lf, range(nb, nlf), rb, rf, rc, lc) : nullptr;
  return {ga, gc};
}

struct ConvAttrs {
  Ints s, d, lo, hi;
  int64_t groups = 1;
};

// y = convolution(x, w): x [N, C, sp...], w [O, C/G, k...], y [N, O, out...].
std::vector<Value*> conv_vjp(CoreBuilder& b, const Node& n, Value* g, const std::vector<bool>& need) {
  Value* x = n.inputs[0];
  Value* w = n.inputs[1];
  const Shape& xs = shp(x);
  const Shape& ws = shp(w);
  const Shape& ys = shp(n.outputs[0]);
  const size_t sp = xs.size() - 2;
  ConvAttrs a;
  a.s = n.attr_ints("strides", Ints(sp, 1));
  a.d = n.attr_ints("dilations", Ints(sp, 1));
  const Ints p = n.attr_ints("padding", Ints(2 * sp, 0));
  for (size_t i = 0; i < sp; ++i) a.lo.push_back(p[2 * i]), a.hi.push_back(p[2 * i + 1]);
  a.groups = n.attr_i("groups", 1);
  const int64_t N = xs[0], C = xs[1], O = ws[0], G = a.groups, Cg = C / G, Og = O / G;
  for (size_t i = 0; i < sp; ++i)
    if (ys[i + 2] == 0) return {need[0] ? zeros_like(b, x) : nullptr, need[1] ? zeros_like(b, w) : nullptr};
  Value* gx = nullptr;
  Value* gw = nullptr;
  if (need[0]) {
    // The transposed convolution: g dilated by the strides (interior padding), convolved with the
    // kernel flipped in space and with in/out channels swapped per group, padded so the result has
    // x's spatial size.
    Shape wg = {G, Og, Cg};
    wg.insert(wg.end(), ws.begin() + 2, ws.end());
    Ints perm = {0, 2, 1};
    for (size_t i = 0; i < sp; ++i) perm.push_back(static_cast<int64_t>(3 + i));
    Value* wt = b.transpose(b.reshape(w, wg), perm);
    Shape wn = {C, Og};
    wn.insert(wn.end(), ws.begin() + 2, ws.end());
    wt = b.reshape(wt, wn);
    Ints st(wn.size(), 0), so(wn.begin(), wn.end()), str(wn.size(), 1);
    for (size_t i = 0; i < sp; ++i) st[i + 2] = ws[i + 2] - 1, so[i + 2] = -1, str[i + 2] = -1;
    bool flip = false;
    for (size_t i = 0; i < sp; ++i) flip = flip || ws[i + 2] > 1;
    if (flip) wt = b.emit(CoreOp::slice, {wt}, {{"starts", st}, {"stops", so}, {"strides", str}});
    Ints zero(xs.size(), 0), interior(xs.size(), 0), padding;
    for (size_t i = 0; i < sp; ++i) interior[i + 2] = a.s[i] - 1;
    Value* gd = pad(b, g, zero, zero, interior);
    for (size_t i = 0; i < sp; ++i) {
      const int64_t dilated = (ys[i + 2] - 1) * a.s[i] + 1;
      padding.push_back(a.d[i] * (ws[i + 2] - 1) - a.lo[i]);
      padding.push_back(xs[i + 2] - dilated + a.lo[i]);
    }
    gx = b.emit(CoreOp::convolution, {gd, wt}, {{"dilations", a.d}, {"padding", padding}, {"groups", G}});
  }
  if (need[1]) {
    // dw[o, c, k] = sum_{n, p} g[n, o, p] x[n, c', p s + k d - lo]: a convolution of x with the roles
    // of batch and channels exchanged — x as [C/G, G*N, sp] (group-major channels), g as the kernel
    // [O, N, out] — strided by the dilations and dilated by the strides; then [C/G, O, k] -> [O, C/G, k].
    Shape xg = {N, G, Cg};
    xg.insert(xg.end(), xs.begin() + 2, xs.end());
    Ints perm = {2, 1, 0};
    for (size_t i = 0; i < sp; ++i) perm.push_back(static_cast<int64_t>(3 + i));
    Value* xt = b.transpose(b.reshape(x, xg), perm);
    Shape xn = {Cg, G * N};
    xn.insert(xn.end(), xs.begin() + 2, xs.end());
    xt = b.reshape(xt, xn);
    Ints gperm = {1, 0};
    for (size_t i = 0; i < sp; ++i) gperm.push_back(static_cast<int64_t>(2 + i));
    Value* gt = b.transpose(g, gperm);
    Ints padding;
    for (size_t i = 0; i < sp; ++i) {
      padding.push_back(a.lo[i]);
      padding.push_back(a.d[i] * (ws[i + 2] - 1) + a.s[i] * (ys[i + 2] - 1) + 1 - xs[i + 2] - a.lo[i]);
    }
    Value* r = b.emit(CoreOp::convolution, {xt, gt}, {{"strides", a.d}, {"dilations", a.s}, {"padding", padding}, {"groups", G}});
    gw = b.transpose(r, gperm);
  }
  return {gx, gw};
}

// ---- movement ------------------------------------------------------------------------------------

Value* broadcast_vjp(CoreBuilder& b, const Node& n, Value* g) {
  const Shape& in = shp(n.inputs[0]);
  const Shape& out = shp(n.outputs[0]);
  const Ints dims = n.attr_ints("dims");
  Ints axes;
  for (int64_t d = 0; d < static_cast<int64_t>(out.size()); ++d) {
    auto it = std::find(dims.begin(), dims.end(), d);
    if (it == dims.end() || (in[it - dims.begin()] == 1 && out[d] != 1)) axes.push_back(d);
  }
  return b.reshape(reduce_sum(b, g, axes), in);
}

Value* slice_vjp(CoreBuilder& b, const Node& n, Value* g) {
  Value* x = n.inputs[0];
  const Shape& in = shp(x);
  const Shape& out = shp(n.outputs[0]);
  const size_t r = in.size();
  const Ints starts = n.attr_ints("starts");
  const Ints strides = n.attr_ints("strides", Ints(r, 1));
  for (int64_t m : out)
    if (m == 0) return zeros_like(b, x);
  // Negative strides: reverse those dims of g first, then it is a positive-stride slice.
  Ints rs(r, 0), re(out.begin(), out.end()), rstep(r, 1), low(r), high(r), interior(r);
  bool reverse = false;
  for (size_t i = 0; i < r; ++i) {
    const int64_t step = std::abs(strides[i]);
    low[i] = strides[i] > 0 ? starts[i] : starts[i] - (out[i] - 1) * step;
    interior[i] = step - 1;
    high[i] = in[i] - low[i] - ((out[i] - 1) * step + 1);
    if (strides[i] < 0 && out[i] > 1) rs[i] = out[i] - 1, re[i] = -1, rstep[i] = -1, reverse = true;
  }
  if (reverse) g = b.emit(CoreOp::slice, {g}, {{"starts", rs}, {"stops", re}, {"strides", rstep}});
  return pad(b, g, low, high, interior);
}

std::vector<Value*> pad_vjp(CoreBuilder& b, const Node& n, Value* g, const std::vector<bool>& need) {
  Value* x = n.inputs[0];
  const Shape& in = shp(x);
  const size_t r = in.size();
  const Ints low = n.attr_ints("low"), high = n.attr_ints("high");
  const Ints interior = n.attr_ints("interior", Ints(r, 0));
  bool empty = false;
  for (int64_t d : in) empty = empty || d == 0;
  Value* gx = nullptr;
  if (empty) {
    gx = zeros_like(b, x);
  } else {
    // Undo cropping (negative low/high) with zeros, then take every (interior+1)-th element.
    Ints ulo(r), uhi(r), st(r), sp(r), step(r);
    for (size_t i = 0; i < r; ++i) {
      ulo[i] = std::max<int64_t>(0, -low[i]);
      uhi[i] = std::max<int64_t>(0, -high[i]);
      st[i] = std::max<int64_t>(0, low[i]);
      step[i] = interior[i] + 1;
      sp[i] = st[i] + (in[i] - 1) * step[i] + 1;
    }
    gx = b.slice(pad(b, g, ulo, uhi, Ints(r, 0)), st, sp, step);
  }
  Value* gv = nullptr;
  if (need[1]) {  // every output element that is no operand element is the padding value
    Ints all;
    for (size_t i = 0; i < shp(g).size(); ++i) all.push_back(static_cast<int64_t>(i));
    Ints xall;
    for (size_t i = 0; i < r; ++i) xall.push_back(static_cast<int64_t>(i));
    gv = b.sub(reduce_sum(b, g, all), reduce_sum(b, gx, xall));
  }
  return {need[0] ? gx : nullptr, gv};
}

std::vector<Value*> concat_vjp(CoreBuilder& b, const Node& n, Value* g, const std::vector<bool>& need) {
  const int64_t axis = n.attr_i("axis");
  std::vector<Value*> out(n.inputs.size(), nullptr);
  int64_t at = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const Shape& s = shp(n.inputs[i]);
    if (need[i]) {
      Ints st(s.size(), 0), sp(shp(g).begin(), shp(g).end());
      st[axis] = at;
      sp[axis] = at + s[axis];
      out[i] = b.slice(g, st, sp);
    }
    at += s[axis];
  }
  return out;
}

Value* scatter_add(CoreBuilder& b, Value* into, Value* idx, Value* upd, int64_t axis) {
  return b.emit(CoreOp::scatter, {into, idx, upd}, {{"axis", axis}, {"reduction", std::string("add")}});
}

Value* gather(CoreBuilder& b, Value* data, Value* idx, int64_t axis) {
  return b.emit(CoreOp::gather, {data, idx}, {{"axis", axis}});
}

// y = scatter(data, idx, upd). Duplicate indices: the rules assume each element is written once
// (reduction none: the last write wins and the overwritten updates get the cotangent too).
std::vector<Value*> scatter_vjp(CoreBuilder& b, const Node& n, Value* g, const std::vector<bool>& need) {
  Value* data = n.inputs[0];
  Value* idx = n.inputs[1];
  Value* upd = n.inputs[2];
  Value* y = n.outputs[0];
  const int64_t axis = n.attr_i("axis");
  const std::string red = n.attr_s("reduction", "none");
  Value* gd = nullptr;
  Value* gu = nullptr;
  if (red == "none") {
    if (need[0])
      gd = b.emit(CoreOp::scatter, {g, idx, zeros_like(b, upd)}, {{"axis", axis}, {"reduction", std::string("none")}});
    if (need[2]) gu = gather(b, g, idx, axis);
  } else if (red == "add") {
    gd = g;
    if (need[2]) gu = gather(b, g, idx, axis);
  } else if (red == "mul") {
    if (need[0]) gd = b.emit(CoreOp::scatter, {g, idx, upd}, {{"axis", axis}, {"reduction", std::string("mul")}});
    if (need[2]) gu = b.div(gather(b, b.mul(g, y), idx, axis), upd);  // assumes non-zero updates
  } else if (red == "max" || red == "min") {
    if (need[0]) gd = where(b, b.compare("eq", data, y), g);
    if (need[2]) gu = where(b, b.compare("eq", upd, gather(b, y, idx, axis)), gather(b, g, idx, axis));
  } else {
    fail("scatter reduction '{}' has no derivative", red);
  }
  return {need[0] ? gd : nullptr, nullptr, need[2] ? gu : nullptr};
}

// Operands that carry no cotangent (a zero derivative, or not floats).
std::vector<Value*> nothing(const Node& n) { return std::vector<Value*>(n.inputs.size(), nullptr); }

}  // namespace

std::vector<Value*> core_vjp(CoreBuilder& b, const Node& n, const std::vector<Value*>& out_ct,
                             const std::vector<bool>& need) {
  const std::optional<CoreOp> op = core_op_of(n);
  if (!op) fail("node '{}' ({}) is not a core primitive: autodiff runs on core graphs", n.name, n.op_name());
  bool any = false;
  for (bool x : need) any = any || x;
  // Only the first result carries a cotangent: sort's second (indices) is never a float.
  if (!any || out_ct.empty() || !out_ct[0]) return nothing(n);
  Value* g = out_ct[0];
  switch (*op) {
    case CoreOp::neg:
    case CoreOp::exp:
    case CoreOp::log:
    case CoreOp::sqrt:
    case CoreOp::sin:
    case CoreOp::atan:
    case CoreOp::erf:
    case CoreOp::tanh: return {unary_vjp(b, *op, n, g)};
    case CoreOp::add:
    case CoreOp::mul:
    case CoreOp::div:
    case CoreOp::rem:
    case CoreOp::pow:
    case CoreOp::max:
    case CoreOp::min: return binary_vjp(b, *op, n, g, need);
    // Zero derivatives (vjp = zero): piecewise constant, or no float operand/result.
    case CoreOp::floor:
    case CoreOp::round_even:
    case CoreOp::and_:
    case CoreOp::or_:
    case CoreOp::xor_:
    case CoreOp::compare:
    case CoreOp::iota: return nothing(n);
    case CoreOp::select:
      return {nullptr, need[1] ? where(b, n.inputs[0], g) : nullptr,
              need[2] ? b.select(n.inputs[0], zeros_like(b, g), g) : nullptr};
    case CoreOp::convert:
      if (!is_float(dt(n.inputs[0]))) return nothing(n);
      return {b.convert(g, dt(n.inputs[0]))};
    case CoreOp::bitcast_convert:
      fail("node '{}': bitcast_convert has no derivative (a gradient must flow through it from '{}' to '{}')", n.name,
           n.outputs[0]->name, n.inputs[0]->name);
    case CoreOp::reduce: return {reduce_vjp(b, n, g)};
    case CoreOp::reduce_window: return {reduce_window_vjp(b, n, g)};
    case CoreOp::dot_general: return dot_vjp(b, n, g, need);
    case CoreOp::convolution: return conv_vjp(b, n, g, need);
    case CoreOp::broadcast_in_dim: return {broadcast_vjp(b, n, g)};
    case CoreOp::reshape: return {b.reshape(g, shp(n.inputs[0]))};
    case CoreOp::transpose: {
      const Ints perm = n.attr_ints("perm");
      return {to_operand_order(b, g, perm)};
    }
    case CoreOp::slice: return {slice_vjp(b, n, g)};
    case CoreOp::pad: return pad_vjp(b, n, g, need);
    case CoreOp::concatenate: return concat_vjp(b, n, g, need);
    case CoreOp::gather: {
      const int64_t axis = n.attr_i("axis");
      return {scatter_add(b, zeros_like(b, n.inputs[0]), n.inputs[1], g, axis), nullptr};
    }
    case CoreOp::scatter: return scatter_vjp(b, n, g, need);
    case CoreOp::sort: {
      // values = operand permuted along axis by indices: each value's cotangent goes back to the
      // element it came from. The indices output has no derivative.
      const int64_t axis = n.attr_i("axis");
      return {scatter_add(b, zeros_like(b, n.inputs[0]), n.outputs[1], g, axis)};
    }
  }
  fail("node '{}': no vector-Jacobian rule for {}", n.name, n.op_name());
}

}  // namespace tessel
