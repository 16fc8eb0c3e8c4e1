// Op family: reductions (Reduce*, ArgMax/ArgMin), softmax-likes, cumulative ops, TopK, and losses.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "tessel/ir/op_registry.h"
#include "tessel/ops/decompose_util.h"
#include "tessel/ops/sym_util.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Visits every element of `shape` in row-major order with its flat index and the flat index of
// the element it maps to when the dims flagged in `reduced` collapse to size 1. A counter walk
// keeps this cheap: no per-element division.
template <typename F>
void for_each_reduced(const Shape& shape, const std::vector<bool>& reduced, F&& f) {
  const int r = static_cast<int>(shape.size());
  int64_t n = shape_numel(shape);
  if (n <= 0) return;
  Shape out_shape = shape;
  for (int d = 0; d < r; ++d)
    if (reduced[d]) out_shape[d] = 1;
  std::vector<int64_t> os = strides_of(out_shape);
  for (int d = 0; d < r; ++d)
    if (reduced[d]) os[d] = 0;
  std::vector<int64_t> idx(r, 0);
  int64_t o = 0;
  for (int64_t i = 0; i < n; ++i) {
    f(i, o);
    for (int d = r - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        o += os[d];
        break;
      }
      o -= os[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

// Integer range of an integer or bool dtype, as int64 (u64 max is clamped to int64 max).
std::pair<int64_t, int64_t> int_range(DType t) {
  switch (t) {
    case DType::i64:
      return {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
    case DType::i32:
      return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
    case DType::i16:
      return {std::numeric_limits<int16_t>::min(), std::numeric_limits<int16_t>::max()};
    case DType::i8:
      return {-128, 127};
    case DType::i4:
      return {-8, 7};
    case DType::i2:
      return {-2, 1};
    case DType::u2:
      return {0, 3};
    case DType::u64:
      return {0, std::numeric_limits<int64_t>::max()};
    case DType::u32:
      return {0, std::numeric_limits<uint32_t>::max()};
    case DType::u16:
      return {0, 65535};
    case DType::u8:
      return {0, 255};
    case DType::u4:
      return {0, 15};
    case DType::boolean:
      return {0, 1};
    default:
      return {0, 0};
  }
}

// Integer values as int64 in an order-preserving form: u64 has its sign bit flipped so that
// signed comparison orders it correctly (flip again to get the bits back).
constexpr int64_t kSignBit = std::numeric_limits<int64_t>::min();
std::vector<int64_t> ordered_ints(const Tensor& t) {
  std::vector<int64_t> v = t.to_i64();
  if (t.dtype() == DType::u64)
    for (auto& a : v) a ^= kSignBit;
  return v;
}

// Reads a scalar-like int input (shape [] or [1]), e.g. CumSum's axis or TopK's k.
int64_t scalar_int(const Tensor& t, const char* what) {
  if (t.numel() != 1)
    fail("{} must hold exactly one value, got shape {}", what, shape_str(t.shape()));
  if (!is_int(t.dtype())) fail("{} must be an integer tensor", what);
  return t.get_i(0);
}


// ---- decomposition helpers -------------------------------------------------------------------



// isnan(x) as bool (always false for integers).
Value* nan_mask(CoreBuilder& b, Value* x) { return b.compare("ne", x, x); }

// Index along `axis` (keepdims, i64) of the first (or last) max/min of x; NaN wins like numpy.
// Some element is always hit (the extreme itself, or a NaN), so `none` only has to lose the final
// reduction: the axis length, or 2^62 past a symbolic one.
Value* arg_index(CoreBuilder& b, Value* x, int axis, bool is_max, bool last) {
  const Dims s = x->type.dims();
  Value* m = b.broadcast_to(b.reduce(x, is_max ? "max" : "min", {axis}, true), s);
  Value* hit = b.compare("eq", x, m);
  if (is_float(x->type.dtype)) hit = b.emit(CoreOp::or_, {hit, nan_mask(b, x)});
  const double past = s[axis].is_static() ? static_cast<double>(s[axis].constant_term()) : 0x1p62;
  Value* none = b.full(DType::i64, s, last ? -1.0 : past);
  Value* idx = b.select(hit, b.iota(DType::i64, s, axis), none);
  return b.reduce(idx, last ? "max" : "min", {axis}, true);
}

// Softmax (or log-softmax) of x along `axis` in x's dtype: subtract the max, exp, sum, divide.
Value* softmax_core(CoreBuilder& b, Value* x, int axis, bool log) {
  Value* m = b.reduce(x, "max", {axis}, true);
  Value* z = b.sub(x, m);
  Value* e = b.emit(CoreOp::exp, {z});
  Value* s = b.reduce(e, "sum", {axis}, true);
  return log ? b.sub(z, b.emit(CoreOp::log, {s})) : b.div(e, s);
}

// ---- Reduce* ---------------------------------------------------------------------------------

enum class RK { sum, mean, max, min, prod, l1, l2, log_sum, log_sum_exp, sum_square };

// Resolves axes into a per-dim mask; nullopt means "noop" (identity).
std::optional<std::vector<bool>> reduce_mask(const std::vector<int64_t>& axes, int rank,
                                             bool noop) {
  std::vector<bool> mask(rank, false);
  if (axes.empty()) {
    if (noop) return std::nullopt;
    std::fill(mask.begin(), mask.end(), true);
    return mask;
  }
  // normalize_axis lets axis 0 through for rank 0 (other ops need that); a scalar has no axis.
  if (rank == 0) fail("axis {} is out of range for a scalar (rank 0)", axes.front());
  for (int64_t a : axes) {
    int d = normalize_axis(a, rank);
    if (mask[d]) fail("axis {} is listed twice", a);
    mask[d] = true;
  }
  return mask;
}

Dims reduced_shape(const Dims& s, const std::vector<bool>& mask, bool keepdims) {
  Dims out;
  for (size_t d = 0; d < s.size(); ++d) {
    if (!mask[d])
      out.push_back(s[d]);
    else if (keepdims)
      out.push_back(1);
  }
  return out;
}

Shape reduced_shape(const Shape& s, const std::vector<bool>& mask, bool keepdims) {
  return static_shape(reduced_shape(dims_of(s), mask, keepdims));
}

void infer_reduce(InferCtx& ctx) {
  const TensorType& x = ctx.in(0);
  const Node& n = ctx.node();
  if (n.has_attr("axes")) fail("the axes attribute is not allowed at this opset; axes is an input");
  const int r = static_cast<int>(x.shape.size());
  bool keep = n.attr_i("keepdims", 1) != 0;
  bool noop = n.attr_i("noop_with_empty_axes", 0) != 0;
  std::vector<int64_t> axes;
  if (ctx.has_in(1)) {
    const TensorType& at = ctx.in(1);
    if (at.dtype != DType::i64) fail("axes must be int64, got {}", dtype_name(at.dtype));
    if (at.shape.size() > 1) fail("axes must be 1-D, got {}", shape_str(at.shape));
    auto known = known_ints(ctx, 1);
    if (known) {
      axes = *known;
    } else {
      int64_t na = at.shape.empty() ? 1 : at.shape[0];
      if (na < 0) unsupported("axes of unknown length and value");
      if (na == 0) {
        axes.clear();
      } else {
        // Axes only known at run time: the rank is still static, the sizes are not.
        if (na > r) fail("{} axes given for a rank-{} input", na, r);
        Shape out;
        if (keep)
          out.assign(r, kUnknownDim);
        else
          out.assign(r - na, kUnknownDim);
        for (size_t d = 0; keep && d < out.size(); ++d)
          if (x.shape[d] == 1) out[d] = 1;
        ctx.set_out(0, TensorType{x.dtype, out});  // unknown dims: symbolic ones are unknown here too
        return;
      }
    }
  }
  auto mask = reduce_mask(axes, r, noop);
  if (!mask) {
    ctx.set_out(0, x);
    return;
  }
  ctx.set_out(0, TensorType::of(x.dtype, reduced_shape(x.dims(), *mask, keep)));
}

Tensor reduce_float(const Tensor& x, const std::vector<bool>& mask, RK k, const Shape& out_shape) {
  const Shape keep_shape = reduced_shape(x.shape(), mask, true);
  const int64_t on = shape_numel(keep_shape);
  int64_t count = 1;
  for (size_t d = 0; d < mask.size(); ++d)
    if (mask[d]) count *= x.dim(static_cast<int>(d));
  const std::vector<double> v = x.to_f64();
  std::vector<double> acc(on, 0.0);
  if (k == RK::prod) std::fill(acc.begin(), acc.end(), 1.0);
  if (k == RK::max || k == RK::log_sum_exp) std::fill(acc.begin(), acc.end(), -kInf);
  if (k == RK::min) std::fill(acc.begin(), acc.end(), kInf);
  auto take_max = [](double& a, double b) {
    if (b > a || std::isnan(b)) a = std::isnan(a) ? a : b;
  };
  switch (k) {
    case RK::sum:
    case RK::mean:
    case RK::log_sum:
      for_each_reduced(x.shape(), mask, [&](int64_t i, int64_t o) { acc[o] += v[i]; });
      break;
    case RK::prod:
      for_each_reduced(x.shape(), mask, [&](int64_t i, int64_t o) { acc[o] *= v[i]; });
      break;
    case RK::l1:
      for_each_reduced(x.shape(), mask, [&](int64_t i, int64_t o) { acc[o] += std::fabs(v[i]); });
      break;
    case RK::l2:
    case RK::sum_square:
      for_each_reduced(x.shape(), mask, [&](int64_t i, int64_t o) { acc[o] += v[i] * v[i]; });
      break;
    case RK::max:
      for_each_reduced(x.shape(), mask, [&](int64_t i, int64_t o) { take_max(acc[o], v[i]); });
      break;
    case RK::min:
      for_each_reduced(x.shape(), mask, [&](int64_t i, int64_t o) {
        if (v[i] < acc[o] || std::isnan(v[i])) acc[o] = std::isnan(acc[o]) ? acc[o] : v[i];
      });
      break;
    case RK::log_sum_exp: {
      // Shift by the max so large inputs do not overflow exp.
      std::vector<double> m(on, -kInf);
      for_each_reduced(x.shape(), mask, [&](int64_t i, int64_t o) { take_max(m[o], v[i]); });
      std::fill(acc.begin(), acc.end(), 0.0);
      for_each_reduced(x.shape(), mask, [&](int64_t i, int64_t o) {
        if (std::isfinite(m[o])) acc[o] += std::exp(v[i] - m[o]);
      });
      for (int64_t o = 0; o < on; ++o)
        acc[o] = std::isfinite(m[o]) ? m[o] + std::log(acc[o]) : m[o];
      break;
    }
  }
  for (int64_t o = 0; o < on; ++o) {
    if (k == RK::mean)
      acc[o] = acc[o] / static_cast<double>(count);
    else if (k == RK::l2)
      acc[o] = std::sqrt(acc[o]);
    else if (k == RK::log_sum)
      acc[o] = std::log(acc[o]);
  }
  return Tensor::from_f64(x.dtype(), out_shape, acc);
}

Tensor reduce_int(const Tensor& x, const std::vector<bool>& mask, RK k, const Shape& out_shape) {
  if (k == RK::l2 || k == RK::log_sum || k == RK::log_sum_exp) {
    // Irrational results: compute in double, then truncate like a cast.
    Tensor f = Tensor::from_f64(DType::f64, x.shape(), x.to_f64());
    std::vector<double> r = reduce_float(f, mask, k, out_shape).to_f64();
    std::vector<int64_t> ri(r.size());
    for (size_t i = 0; i < r.size(); ++i) {
      if (!std::isfinite(r[i])) fail("integer reduction result {} is not representable", r[i]);
      ri[i] = static_cast<int64_t>(r[i]);
    }
    return Tensor::from_i64(x.dtype(), out_shape, ri);
  }
  const Shape keep_shape = reduced_shape(x.shape(), mask, true);
  const int64_t on = shape_numel(keep_shape);
  int64_t count = 1;
  for (size_t d = 0; d < mask.size(); ++d)
    if (mask[d]) count *= x.dim(static_cast<int>(d));
  const bool u64 = x.dtype() == DType::u64 && (k == RK::max || k == RK::min);
  const std::vector<int64_t> v = u64 ? ordered_ints(x) : x.to_i64();
  auto [lo, hi] = int_range(x.dtype());
  if (u64) lo = kSignBit, hi = std::numeric_limits<int64_t>::max();
  std::vector<uint64_t> acc(on, 0);  // unsigned: wrap-around instead of UB
  std::vector<int64_t> mm(on, k == RK::max ? lo : hi);
  if (k == RK::prod) std::fill(acc.begin(), acc.end(), 1);
  for_each_reduced(x.shape(), mask, [&](int64_t i, int64_t o) {
    const int64_t a = v[i];
    switch (k) {
      case RK::sum:
      case RK::mean:
        acc[o] += static_cast<uint64_t>(a);
        break;
      case RK::prod:
        acc[o] *= static_cast<uint64_t>(a);
        break;
      case RK::l1:
        acc[o] += a < 0 ? uint64_t{0} - static_cast<uint64_t>(a) : static_cast<uint64_t>(a);
        break;
      case RK::sum_square:
        acc[o] += static_cast<uint64_t>(a) * static_cast<uint64_t>(a);
        break;
      case RK::max:
        mm[o] = std::max(mm[o], a);
        break;
      case RK::min:
        mm[o] = std::min(mm[o], a);
        break;
      default:
        break;
    }
  });
  std::vector<int64_t> res(on);
  for (int64_t o = 0; o < on; ++o) {
    if (k == RK::max || k == RK::min)
      res[o] = u64 ? mm[o] ^ kSignBit : mm[o];
    else if (k == RK::mean)
      res[o] = count ? static_cast<int64_t>(acc[o]) / count : 0;
    else
      res[o] = static_cast<int64_t>(acc[o]);
  }
  return Tensor::from_i64(x.dtype(), out_shape, res);
}


// Axes computed at run time, recovered from the static input and output shapes when they can
// only be one set (reducing a size-1 dim or not gives the same values, so those dims do not count).
std::optional<std::vector<int64_t>> axes_from_shapes(const Shape& in, const Shape& out, bool keep) {
  const int r = static_cast<int>(in.size());
  if (!shape_known(out)) return std::nullopt;
  if (keep) {
    if (out.size() != in.size()) return std::nullopt;
    std::vector<int64_t> axes;
    for (int d = 0; d < r; ++d)
      if (out[d] != in[d]) axes.push_back(d);
    return axes;
  }
  if (r > 16 || static_cast<int>(out.size()) > r) return std::nullopt;
  std::optional<std::vector<int64_t>> found;
  for (uint32_t set = 0; set < (1u << r); ++set) {
    Shape kept;
    std::vector<int64_t> axes;
    for (int d = 0; d < r; ++d) {
      if (set >> d & 1u) {
        if (in[d] != 1) axes.push_back(d);
      } else {
        kept.push_back(in[d]);
      }
    }
    if (kept != out) continue;
    if (found && *found != axes) return std::nullopt;  // ambiguous: the values would differ
    found = axes;
  }
  return found;
}

// Reduce* as core reduce (+ elementwise pre/post steps); the axes input must be a constant.
DecomposeFn reduce_decomposition(RK k) {
  return [k](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    Value* x = n.inputs[0];
    const DType dt = x->type.dtype;
    const int r = static_cast<int>(x->type.shape.size());
    const bool keep = n.attr_i("keepdims", 1) != 0;
    std::vector<int64_t> axes;
    if (auto known = b.known(1); known || !n.has_input(1)) {
      if (known) axes = known->to_i64();
      auto mask = reduce_mask(axes, r, n.attr_i("noop_with_empty_axes", 0) != 0);
      if (!mask) return {x};
      axes.clear();
      for (int d = 0; d < r; ++d)
        if ((*mask)[d]) axes.push_back(d);
    } else if (auto inferred = x->type.symbolic() ? std::nullopt
                                                  : axes_from_shapes(x->type.shape, n.outputs[0]->type.shape, keep)) {
      axes = *inferred;
    } else {
      b.need_constant(1, "axes");
    }
    // Irrational results on ints are computed in f64 and truncated back (the reference's cast);
    // an integer mean sums in i64 before the truncating divide.
    const bool irrational = k == RK::l2 || k == RK::log_sum || k == RK::log_sum_exp;
    DType ct = math_type(dt);
    if (!is_float(dt) && irrational) ct = DType::f64;
    if (k == RK::mean && is_int(dt)) ct = DType::i64;
    Value* v = b.convert(x, ct);
    Value* y = nullptr;
    switch (k) {
      case RK::max: y = b.reduce(v, "max", axes, keep); break;
      case RK::min: y = b.reduce(v, "min", axes, keep); break;
      case RK::prod: y = b.reduce(v, "prod", axes, keep); break;
      case RK::sum: y = b.reduce(v, "sum", axes, keep); break;
      case RK::l1: y = b.reduce(abs_of(b, v), "sum", axes, keep); break;
      case RK::sum_square: y = b.reduce(b.mul(v, v), "sum", axes, keep); break;
      case RK::l2: y = b.emit(CoreOp::sqrt, {b.reduce(b.mul(v, v), "sum", axes, keep)}); break;
      case RK::log_sum: y = b.emit(CoreOp::log, {b.reduce(v, "sum", axes, keep)}); break;
      case RK::mean:
        y = b.div(b.reduce(v, "sum", axes, keep), element_count(b, v, axes, ct, keep));
        break;
      case RK::log_sum_exp: {
        // Shift by the max where it is finite (an all -inf or +inf slice keeps its max).
        Value* m = b.reduce(v, "max", axes, true);
        Value* finite = b.compare("lt", abs_of(b, m), b.scalar(ct, kInf));
        m = b.select(finite, m, b.scalar(ct, 0.0));
        Value* s = b.reduce(b.emit(CoreOp::exp, {b.sub(v, m)}), "sum", axes, true);
        y = b.add(b.emit(CoreOp::log, {s}), m);
        y = b.reshape(y, n.outputs[0]->type.dims());
        break;
      }
    }
    return {b.convert(y, dt)};
  };
}

OpDef reduce_op(std::string name, int since, RK k) {
  OpDef d;
  d.name = std::move(name);
  d.min_inputs = 1;
  d.max_inputs = 2;
  d.since = since;
  d.fusion = FusionKind::reduction;
  d.attrs = {
      {"keepdims", AttrKind::i}, {"noop_with_empty_axes", AttrKind::i}, {"axes", AttrKind::ints}};
  d.upgrade = [](Graph& g, Node& n, int) {
    // Older opsets carry axes as an attribute; the current form takes them as an input.
    if (n.inputs.size() > 1) fail("takes one input before axes became an input");
    if (n.has_attr("axes")) {
      std::vector<int64_t> axes = n.attr_ints("axes");
      Tensor t = Tensor::from_i64(DType::i64, {static_cast<int64_t>(axes.size())}, axes);
      n.inputs.resize(2, nullptr);
      n.inputs[1] = g.add_constant(g.unique_name(n.name + "_axes"), t);
      n.attrs.erase("axes");
    }
  };
  d.infer = infer_reduce;
  d.cost = cost_per_input_element(k == RK::log_sum_exp ? 4 : 1);
  d.decompose = reduce_decomposition(k);
  d.kernel = [k](KernelCtx& c) {
    const Tensor& x = c.in(0);
    const Node& n = c.node();
    bool keep = n.attr_i("keepdims", 1) != 0;
    bool noop = n.attr_i("noop_with_empty_axes", 0) != 0;
    std::vector<int64_t> axes;
    if (c.has_in(1)) axes = c.in(1).to_i64();
    auto mask = reduce_mask(axes, x.rank(), noop);
    if (!mask) {
      c.set_out(0, x);
      return;
    }
    Shape out_shape = reduced_shape(x.shape(), *mask, keep);
    if (is_float(x.dtype()))
      c.set_out(0, reduce_float(x, *mask, k, out_shape));
    else
      c.set_out(0, reduce_int(x, *mask, k, out_shape));
  };
  return d;
}

// ---- ArgMax / ArgMin -------------------------------------------------------------------------

OpDef arg_op(std::string name, bool is_max) {
  OpDef d;
  d.name = std::move(name);
  d.since = 1;  // later opsets only added negative axes and select_last_index
  d.fusion = FusionKind::reduction;
  d.attrs = {{"axis", AttrKind::i}, {"keepdims", AttrKind::i}, {"select_last_index", AttrKind::i}};
  d.cost = cost_per_input_element(1);
  d.infer = [](InferCtx& ctx) {
    const TensorType& x = ctx.in(0);
    int r = static_cast<int>(x.shape.size());
    if (r == 0) fail("{} needs an input of rank >= 1, got a scalar", ctx.node().op->name);
    int axis = normalize_axis(ctx.node().attr_i("axis", 0), r);
    if (x.shape[axis] == 0) fail("cannot take the arg of an empty axis");
    std::vector<bool> mask(r, false);
    mask[axis] = true;
    ctx.set_out(0, TensorType::of(DType::i64, reduced_shape(x.dims(), mask, ctx.node().attr_i("keepdims", 1) != 0)));
  };
  d.kernel = [is_max](KernelCtx& c) {
    const Tensor& x = c.in(0);
    const Node& n = c.node();
    int r = x.rank();
    if (r == 0) fail("{} needs an input of rank >= 1, got a scalar", n.op->name);
    int axis = normalize_axis(n.attr_i("axis", 0), r);
    bool last = n.attr_i("select_last_index", 0) != 0;
    int64_t len = x.dim(axis);
    if (len == 0) fail("cannot take the arg of an empty axis");
    int64_t inner = 1, outer = 1;
    for (int d = axis + 1; d < r; ++d) inner *= x.dim(d);
    for (int d = 0; d < axis; ++d) outer *= x.dim(d);
    std::vector<bool> mask(r, false);
    mask[axis] = true;
    Shape os = reduced_shape(x.shape(), mask, n.attr_i("keepdims", 1) != 0);
    std::vector<int64_t> res(outer * inner);
    const bool fl = is_float(x.dtype());
    const std::vector<double> vf = fl ? x.to_f64() : std::vector<double>{};
    const std::vector<int64_t> vi = fl ? std::vector<int64_t>{} : ordered_ints(x);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        int64_t base = o * len * inner + in, best = 0;
        for (int64_t j = 1; j < len; ++j) {
          int64_t a = base + j * inner, b = base + best * inner;
          bool better, equal;
          if (fl) {
            // Like numpy, the first NaN wins both ArgMax and ArgMin.
            const bool na = std::isnan(vf[a]), nb = std::isnan(vf[b]);
            better = (na && !nb) || (!nb && (is_max ? vf[a] > vf[b] : vf[a] < vf[b]));
            equal = vf[a] == vf[b] || (na && nb);
          } else {
            better = is_max ? vi[a] > vi[b] : vi[a] < vi[b];
            equal = vi[a] == vi[b];
          }
          if (better || (last && equal)) best = j;
        }
        res[o * inner + in] = best;
      }
    c.set_out(0, Tensor::from_i64(DType::i64, os, res));
  };
  d.decompose = [is_max](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    Value* x = n.inputs[0];
    const int axis = normalize_axis(n.attr_i("axis", 0), static_cast<int>(x->type.shape.size()));
    Value* idx = arg_index(b, x, axis, is_max, n.attr_i("select_last_index", 0) != 0);
    return {b.reshape(idx, n.outputs[0]->type.dims())};
  };
  return d;
}

// ---- Softmax, LogSoftmax, Hardmax ------------------------------------------------------------

enum class SM { softmax, log_softmax, hardmax };

// Splits a shape into outer x len x inner around `axis`.
void split_at(const Shape& s, int axis, int64_t& outer, int64_t& len, int64_t& inner) {
  outer = 1;
  len = s[axis];
  inner = 1;
  for (int d = 0; d < axis; ++d) outer *= s[d];
  for (size_t d = axis + 1; d < s.size(); ++d) inner *= s[d];
}

// Opsets < 13 normalize the input flattened to 2-D at `axis` (default 1). That is the opset-13
// op along the last axis when every dim after `axis` is 1, which is checked when the input's
// shape is already known (graph inputs, constants); otherwise the node becomes
// Flatten -> op(axis=-1) -> Reshape(Shape(x)), ending in an Identity that keeps this node's
// output value (the importer maps the ONNX output name to it).
void upgrade_softmax_2d(Graph& g, Node& n, int) {
  const int64_t axis = n.attr_i("axis", 1);
  n.attrs["axis"] = axis;
  if (!n.has_input(0)) fail("missing input 0");
  Value* x = n.inputs[0];
  if (!x->producer) {
    const Shape& s = x->type.shape;
    const int a = normalize_axis(axis, static_cast<int>(s.size()));
    bool trailing_ones = true;
    for (size_t d = a + 1; d < s.size(); ++d) trailing_ones = trailing_ones && s[d] == 1;
    if (trailing_ones) return;
  }
  const OpRegistry& reg = OpRegistry::get();
  const OpDef* flatten = reg.find("Flatten");
  const OpDef* shape = reg.find("Shape");
  const OpDef* reshape = reg.find("Reshape");
  const OpDef* identity = reg.find("Identity");
  if (!flatten || !shape || !reshape || !identity)
    unsupported("{} before opset 13 needs Flatten, Shape, Reshape and Identity", n.op_name());
  const std::string base = n.name.empty() ? n.op_name() : n.name;
  Node* shp = g.add_node(shape, base + "_shape", {x}, {g.unique_name(base + "_shape")});
  Node* flat = g.add_node(flatten, base + "_flatten", {x}, {g.unique_name(base + "_flat")},
                          {{"axis", axis}});
  Node* op = g.add_node(n.op, base + "_2d", {flat->outputs[0]}, {g.unique_name(base + "_2d")},
                        {{"axis", int64_t{-1}}});
  Node* back = g.add_node(reshape, base + "_reshape", {op->outputs[0], shp->outputs[0]},
                          {g.unique_name(base + "_restored")}, {{"allowzero", int64_t{1}}});
  n.op = identity;
  n.inputs = {back->outputs[0]};
  n.attrs.clear();
  // The new nodes were appended after `n`; move `n` behind them to keep topological order.
  auto& nodes = g.mutable_nodes();
  auto it = std::find_if(nodes.begin(), nodes.end(), [&](const auto& p) { return p.get() == &n; });
  if (it == nodes.end()) fail("upgrade: node not in its graph");
  std::rotate(it, it + 1, nodes.end());
}

OpDef softmax_op(std::string name, SM kind) {
  OpDef d;
  d.name = std::move(name);
  d.since = 13;
  d.attrs = {{"axis", AttrKind::i}};
  d.cost = cost_per_input_element(kind == SM::hardmax ? 2 : 5);  // max, subtract, exp, sum, divide
  d.upgrade = upgrade_softmax_2d;
  d.infer = [](InferCtx& ctx) {
    const TensorType& x = ctx.in(0);
    if (!is_float(x.dtype)) fail("needs a float input, got {}", dtype_name(x.dtype));
    int r = static_cast<int>(x.shape.size());
    if (r == 0) fail("needs an input of rank >= 1");
    normalize_axis(ctx.node().attr_i("axis", -1), r);
    ctx.set_out(0, x);
  };
  d.kernel = [kind](KernelCtx& c) {
    const Tensor& x = c.in(0);
    int axis = normalize_axis(c.node().attr_i("axis", -1), x.rank());
    int64_t outer, len, inner;
    split_at(x.shape(), axis, outer, len, inner);
    std::vector<double> v = x.to_f64();
    std::vector<double> y(v.size());
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        const int64_t base = o * len * inner + in;
        double m = -kInf;
        int64_t arg = 0;
        for (int64_t j = 0; j < len; ++j) {
          double a = v[base + j * inner];
          if (a > m) {
            m = a;
            arg = j;
          }
        }
        if (kind == SM::hardmax) {
          for (int64_t j = 0; j < len; ++j) y[base + j * inner] = j == arg ? 1.0 : 0.0;
          continue;
        }
        double s = 0;
        for (int64_t j = 0; j < len; ++j) s += std::exp(v[base + j * inner] - m);
        const double ls = std::log(s);
        for (int64_t j = 0; j < len; ++j) {
          double z = v[base + j * inner] - m;
          y[base + j * inner] = kind == SM::softmax ? std::exp(z) / s : z - ls;
        }
      }
    c.set_out(0, Tensor::from_f64(x.dtype(), x.shape(), y));
  };
  d.decompose = [kind](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    Value* x = n.inputs[0];
    const DType dt = x->type.dtype;
    const int axis = normalize_axis(n.attr_i("axis", -1), static_cast<int>(x->type.shape.size()));
    if (kind == SM::hardmax) {
      // The kernel's first strict maximum skips NaN (an all-NaN slice picks index 0).
      Value* ninf = b.scalar(dt, -kInf);
      Value* idx = arg_index(b, b.select(nan_mask(b, x), ninf, x), axis, true, false);
      Value* hot = b.compare("eq", b.iota(DType::i64, x->type.dims(), axis), idx);
      return {b.select(hot, b.scalar(dt, 1.0), b.scalar(dt, 0.0))};
    }
    Value* y = softmax_core(b, b.convert(x, math_type(dt)), axis, kind == SM::log_softmax);
    return {b.convert(y, dt)};
  };
  return d;
}

// ---- CumSum / CumProd ------------------------------------------------------------------------

OpDef cum_op(std::string name, int since, bool prod) {
  OpDef d;
  d.name = std::move(name);
  d.min_inputs = d.max_inputs = 2;
  d.since = since;
  d.attrs = {{"exclusive", AttrKind::i}, {"reverse", AttrKind::i}};
  d.cost = cost_per_input_element(1);
  d.infer = [](InferCtx& ctx) {
    const TensorType& x = ctx.in(0);
    if (!is_int(ctx.in(1).dtype)) fail("axis must be int32 or int64");
    if (x.shape.empty()) fail("{} needs an input of rank >= 1, got a scalar", ctx.node().op->name);
    const Dims s = x.dims();
    if (auto a = known_ints(ctx, 1)) {
      if (a->size() != 1) fail("axis must hold one value");
      const int axis = normalize_axis((*a)[0], static_cast<int>(x.shape.size()));
      if (s[static_cast<size_t>(axis)].is_symbolic())  // the decomposition's refusal, at inference
        unsupported("{} along the axis of symbolic size {}: its window is the whole axis", ctx.node().op->name,
                    s[static_cast<size_t>(axis)].str());
    } else if (x.symbolic()) {
      unsupported("{} over symbolic sizes needs its axis known at compile time", ctx.node().op->name);
    }
    ctx.set_out(0, x);
  };
  d.kernel = [prod](KernelCtx& c) {
    const Tensor& x = c.in(0);
    if (x.rank() == 0) fail("{} needs an input of rank >= 1, got a scalar", c.node().op->name);
    int axis = normalize_axis(scalar_int(c.in(1), "axis"), x.rank());
    bool excl = c.node().attr_i("exclusive", 0) != 0;
    bool rev = c.node().attr_i("reverse", 0) != 0;
    int64_t outer, len, inner;
    split_at(x.shape(), axis, outer, len, inner);
    auto run = [&](auto& v, auto ident, auto op) {
      using T = std::decay_t<decltype(ident)>;
      std::vector<T> y(v.size());
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t in = 0; in < inner; ++in) {
          T acc = ident;
          for (int64_t s = 0; s < len; ++s) {
            int64_t j = rev ? len - 1 - s : s;
            int64_t p = o * len * inner + j * inner + in;
            if (excl) {
              y[p] = acc;
              acc = op(acc, static_cast<T>(v[p]));
            } else {
              acc = op(acc, static_cast<T>(v[p]));
              y[p] = acc;
            }
          }
        }
      return y;
    };
    if (is_float(x.dtype())) {
      std::vector<double> v = x.to_f64();
      auto y =
          run(v, prod ? 1.0 : 0.0, [prod](double a, double b) { return prod ? a * b : a + b; });
      c.set_out(0, Tensor::from_f64(x.dtype(), x.shape(), y));
    } else {
      std::vector<int64_t> v = x.to_i64();
      std::vector<uint64_t> vu(v.begin(), v.end());
      auto y = run(vu, uint64_t{prod ? 1u : 0u},
                   [prod](uint64_t a, uint64_t b) { return prod ? a * b : a + b; });
      std::vector<int64_t> yi(y.begin(), y.end());
      c.set_out(0, Tensor::from_i64(x.dtype(), x.shape(), yi));
    }
  };
  // A window of the whole axis padded with the identity on the leading side (trailing when
  // reversed); exclusive first shifts the input by one along the axis. An axis computed at run time
  // selects among the per-axis results.
  d.decompose = [prod](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    Value* x = n.inputs[0];
    const DType dt = x->type.dtype;
    const Dims s = x->type.dims();
    const size_t r = s.size();
    const bool rev = n.attr_i("reverse", 0) != 0, excl = n.attr_i("exclusive", 0) != 0;
    const DType ct = math_type(dt);
    Value* v = b.convert(x, ct);
    auto along = [&](int axis) {
      if (s[axis].is_symbolic())
        unsupported("{} along the axis of symbolic size {}: its window is the whole axis", n.op_name(), s[axis].str());
      const int64_t len = s[axis];
      if (len == 0) return v;
      Value* u = v;
      if (excl) {
        std::vector<int64_t> lo(r, 0), hi(r, 0);
        (rev ? hi : lo)[axis] = 1;
        (rev ? lo : hi)[axis] = -1;
        u = b.emit(CoreOp::pad, {u, b.scalar(ct, prod ? 1.0 : 0.0)}, {{"low", lo}, {"high", hi}});
      }
      std::vector<int64_t> window(r, 1), padding(2 * r, 0);
      window[axis] = len;
      padding[2 * axis + (rev ? 1 : 0)] = len - 1;
      return b.emit(CoreOp::reduce_window, {u},
                    {{"kind", std::string(prod ? "prod" : "sum")}, {"window", window}, {"padding", padding}});
    };
    Value* y = nullptr;
    if (auto known = b.known(1)) {
      y = along(normalize_axis(scalar_int(*known, "axis"), static_cast<int>(r)));
    } else if (r == 1) {
      y = along(0);
    } else {
      // The axis is only known at run time: every candidate, picked by comparing with it.
      Value* a = b.convert(b.reshape(n.inputs[1], {}), DType::i64);
      a = b.select(b.compare("lt", a, b.scalar(DType::i64, 0.0)), b.add(a, b.scalar(DType::i64, static_cast<double>(r))), a);
      for (int d = 0; d < static_cast<int>(r); ++d)
        y = y ? b.select(b.compare("eq", a, b.scalar(DType::i64, d)), along(d), y) : along(d);
    }
    return {b.convert(y, dt)};
  };
  return d;
}

// ---- TopK ------------------------------------------------------------------------------------

OpDef topk_op() {
  OpDef d;
  d.name = "TopK";
  d.min_inputs = d.max_inputs = 2;
  d.min_outputs = d.max_outputs = 2;
  d.since = 10;  // 11 added `largest` and `sorted` whose defaults are the opset-10 behaviour
  d.attrs = {
      {"axis", AttrKind::i}, {"largest", AttrKind::i}, {"sorted", AttrKind::i}, {"k", AttrKind::i}};
  d.upgrade = [](Graph& g, Node& n, int) {
    if (!n.has_attr("k")) fail("missing required attribute 'k'");
    Tensor t = Tensor::from_i64(DType::i64, {1}, std::vector<int64_t>{n.attr_i("k")});
    n.inputs.resize(2, nullptr);
    n.inputs[1] = g.add_constant(g.unique_name(n.name + "_k"), t);
    n.attrs.erase("k");
  };
  d.infer = [](InferCtx& ctx) {
    const TensorType& x = ctx.in(0);
    if (ctx.node().has_attr("k"))
      fail("the k attribute is not allowed at this opset; k is an input");
    int r = static_cast<int>(x.shape.size());
    int axis = normalize_axis(ctx.node().attr_i("axis", -1), r);
    Shape s = x.shape;
    s[axis] = kUnknownDim;
    if (auto k = known_ints(ctx, 1)) {
      if (k->size() != 1) fail("k must hold one value");
      int64_t kv = (*k)[0];
      if (kv < 0 || (x.shape[axis] >= 0 && kv > x.shape[axis]))
        fail("k = {} is out of range for axis size {}", kv, x.shape[axis]);
      s[axis] = kv;
    }
    ctx.set_out(0, TensorType{x.dtype, s});
    ctx.set_out(1, TensorType{DType::i64, s});
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    int axis = normalize_axis(c.node().attr_i("axis", -1), x.rank());
    bool largest = c.node().attr_i("largest", 1) != 0;
    int64_t k = scalar_int(c.in(1), "k");
    int64_t outer, len, inner;
    split_at(x.shape(), axis, outer, len, inner);
    if (k < 0 || k > len) fail("k = {} is out of range for axis size {}", k, len);
    Shape s = x.shape();
    s[axis] = k;
    const bool fl = is_float(x.dtype());
    std::vector<double> vf = fl ? x.to_f64() : std::vector<double>{};
    std::vector<int64_t> vi = fl ? std::vector<int64_t>{} : ordered_ints(x);
    std::vector<double> yf(fl ? outer * k * inner : 0);
    std::vector<int64_t> yi(fl ? 0 : outer * k * inner), ix(outer * k * inner);
    std::vector<int64_t> order(len);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        const int64_t base = o * len * inner + in;
        std::iota(order.begin(), order.end(), 0);
        // Ties keep the lower index first (stable sort); NaN counts as the largest value.
        auto less_f = [&](int64_t a, int64_t b) {
          double va = vf[base + a * inner], vb = vf[base + b * inner];
          if (std::isnan(va) || std::isnan(vb))
            return largest ? std::isnan(va) && !std::isnan(vb) : std::isnan(vb) && !std::isnan(va);
          return largest ? va > vb : va < vb;
        };
        auto less_i = [&](int64_t a, int64_t b) {
          int64_t va = vi[base + a * inner], vb = vi[base + b * inner];
          return largest ? va > vb : va < vb;
        };
        if (fl)
          std::stable_sort(order.begin(), order.end(), less_f);
        else
          std::stable_sort(order.begin(), order.end(), less_i);
        for (int64_t j = 0; j < k; ++j) {
          int64_t p = o * k * inner + j * inner + in;
          ix[p] = order[j];
          if (fl)
            yf[p] = vf[base + order[j] * inner];
          else
            yi[p] = vi[base + order[j] * inner];
        }
      }
    if (x.dtype() == DType::u64)
      for (auto& a : yi) a ^= kSignBit;
    c.set_out(0, fl ? Tensor::from_f64(x.dtype(), s, yf) : Tensor::from_i64(x.dtype(), s, yi));
    c.set_out(1, Tensor::from_i64(DType::i64, s, ix));
  };
  // Stable sort along the axis, then the first k (read from the output shape, else k must be known).
  d.decompose = [](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    Value* x = n.inputs[0];
    const Shape& s = x->type.shape;
    const int axis = normalize_axis(n.attr_i("axis", -1), static_cast<int>(s.size()));
    std::vector<Value*> sorted = b.emit_multi(CoreOp::sort, {x}, 2,
                                              {{"axis", int64_t{axis}},
                                               {"descending", int64_t{n.attr_i("largest", 1) != 0}}});
    std::vector<int64_t> starts(s.size(), 0), stops(s.begin(), s.end());
    stops[axis] = n.outputs[0]->type.shape[axis];
    if (stops[axis] == kUnknownDim) stops[axis] = scalar_int(b.need_constant(1, "k"), "k");
    return {b.slice(sorted[0], starts, stops), b.slice(sorted[1], starts, stops)};
  };
  return d;
}

// ---- NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss -------------------------------------

// Checks input [N, C, d...] against target [N, d...] and returns the loss's static type.
TensorType infer_loss(InferCtx& ctx) {
  const TensorType& x = ctx.in(0);
  const TensorType& t = ctx.in(1);
  if (!is_float(x.dtype)) fail("input must be float, got {}", dtype_name(x.dtype));
  if (!is_int(t.dtype)) fail("target must be integer, got {}", dtype_name(t.dtype));
  if (x.shape.size() < 2) fail("input must have rank >= 2, got {}", shape_str(x.shape));
  if (t.shape.size() + 1 != x.shape.size())
    fail("target {} must have rank one less than input {}", shape_str(t.shape), shape_str(x.shape));
  if (ctx.has_in(2)) {
    const TensorType& w = ctx.in(2);
    if (w.shape.size() != 1) fail("weight must be 1-D, got {}", shape_str(w.shape));
    if (w.dtype != x.dtype)
      fail("weight dtype {} differs from input {}", dtype_name(w.dtype), dtype_name(x.dtype));
  }
  std::string red = ctx.node().attr_s("reduction", "mean");
  if (red == "none") {
    Shape s = t.shape;
    for (size_t d = 0; d < s.size(); ++d) {
      int64_t xd = x.shape[d == 0 ? 0 : d + 1];
      if (s[d] < 0) s[d] = xd;
    }
    return TensorType{x.dtype, s};
  }
  if (red != "sum" && red != "mean") fail("reduction must be none, sum or mean, got '{}'", red);
  return TensorType{x.dtype, {}};
}

// The loss from log-probabilities `lp` shaped [N, C, d...] (as doubles).
Tensor nll(const std::vector<double>& lp, const Shape& xs, const Tensor& target,
           const Tensor* weight, const Node& n, DType out_dtype) {
  const int64_t N = xs[0], C = xs[1];
  int64_t D = 1;
  for (size_t d = 2; d < xs.size(); ++d) D *= xs[d];
  for (int d = 0; d < target.rank(); ++d)
    if (target.dim(d) != xs[d == 0 ? 0 : d + 1])
      fail("target shape {} does not match input {}", shape_str(target.shape()), shape_str(xs));
  std::vector<double> w;
  if (weight) {
    if (weight->numel() != C) fail("weight has {} entries for {} classes", weight->numel(), C);
    w = weight->to_f64();
  }
  const bool has_ignore = n.has_attr("ignore_index");
  const int64_t ignore = n.attr_i("ignore_index", 0);
  const std::vector<int64_t> tv = target.to_i64();
  std::vector<double> loss(N * D);
  double wsum = 0, lsum = 0;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t d = 0; d < D; ++d) {
      int64_t cls = tv[i * D + d];
      if (has_ignore && cls == ignore) {
        loss[i * D + d] = 0;
        continue;
      }
      if (cls < 0 || cls >= C) fail("target class {} is out of range [0, {})", cls, C);
      double wt = weight ? w[cls] : 1.0;
      double l = -lp[(i * C + cls) * D + d] * wt;
      loss[i * D + d] = l;
      wsum += wt;
      lsum += l;
    }
  std::string red = n.attr_s("reduction", "mean");
  if (red == "none") return Tensor::from_f64(out_dtype, target.shape(), loss);
  if (red == "sum") return Tensor::scalar_f(out_dtype, lsum);
  if (red == "mean") return Tensor::scalar_f(out_dtype, lsum / wsum);
  fail("reduction must be none, sum or mean, got '{}'", red);
}


// The loss from log-probabilities lp [N, C, d...] (in the compute dtype): gather the target class,
// weight it, zero ignored positions, then reduce. Returns the loss in the output dtype.
Value* nll_core(CoreBuilder& b, const Node& n, Value* lp) {
  const DType ct = lp->type.dtype;
  Value* t = n.inputs[1];
  const Shape& ts = t->type.shape;
  Value* valid = nullptr;
  if (n.has_attr("ignore_index")) {
    Value* ign = b.scalar(t->type.dtype, static_cast<double>(n.attr_i("ignore_index")));
    valid = b.compare("ne", t, ign);
    t = b.select(valid, t, b.scalar(t->type.dtype, 0.0));
  }
  Shape ts1 = ts;
  ts1.insert(ts1.begin() + 1, 1);
  Value* picked = b.reshape(b.emit(CoreOp::gather, {lp, b.reshape(t, ts1)}, {{"axis", int64_t{1}}}), ts);
  Value* w = b.full(ct, ts, 1.0);
  if (n.has_input(2)) {
    const int64_t numel = shape_numel(ts);
    Value* g = b.emit(CoreOp::gather, {b.convert(n.inputs[2], ct), b.reshape(t, {numel})}, {{"axis", int64_t{0}}});
    w = b.reshape(g, ts);
  }
  if (valid) w = b.select(valid, w, b.scalar(ct, 0.0));
  Value* loss = b.mul(b.emit(CoreOp::neg, {picked}), w);
  std::vector<int64_t> all(ts.size());
  std::iota(all.begin(), all.end(), 0);
  const std::string red = n.attr_s("reduction", "mean");
  if (red == "sum") loss = b.reduce(loss, "sum", all, false);
  if (red == "mean") loss = b.div(b.reduce(loss, "sum", all, false), b.reduce(w, "sum", all, false));
  return b.convert(loss, n.outputs[0]->type.dtype);
}

OpDef nll_op() {
  OpDef d;
  d.name = "NegativeLogLikelihoodLoss";
  d.min_inputs = 2;
  d.max_inputs = 3;
  d.since = 12;
  d.attrs = {{"ignore_index", AttrKind::i}, {"reduction", AttrKind::s}};
  d.infer = [](InferCtx& ctx) { ctx.set_out(0, infer_loss(ctx)); };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    c.set_out(0, nll(x.to_f64(), x.shape(), c.in(1), c.has_in(2) ? &c.in(2) : nullptr, c.node(),
                     x.dtype()));
  };
  d.decompose = [](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    return {nll_core(b, n, b.convert(n.inputs[0], math_type(n.inputs[0]->type.dtype)))};
  };
  return d;
}

OpDef sce_op() {
  OpDef d;
  d.name = "SoftmaxCrossEntropyLoss";
  d.min_inputs = 2;
  d.max_inputs = 3;
  d.max_outputs = 2;
  d.since = 12;
  d.attrs = {{"ignore_index", AttrKind::i}, {"reduction", AttrKind::s}};
  d.infer = [](InferCtx& ctx) {
    ctx.set_out(0, infer_loss(ctx));
    if (ctx.num_outputs() > 1) ctx.set_out(1, ctx.in(0));
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    int64_t outer, len, inner;
    split_at(x.shape(), 1, outer, len, inner);
    std::vector<double> v = x.to_f64();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        const int64_t base = o * len * inner + in;
        double m = -kInf;
        for (int64_t j = 0; j < len; ++j) m = std::max(m, v[base + j * inner]);
        double s = 0;
        for (int64_t j = 0; j < len; ++j) s += std::exp(v[base + j * inner] - m);
        const double ls = std::log(s) + m;
        for (int64_t j = 0; j < len; ++j) v[base + j * inner] -= ls;
      }
    c.set_out(0, nll(v, x.shape(), c.in(1), c.has_in(2) ? &c.in(2) : nullptr, c.node(), x.dtype()));
    if (c.wants_out(1)) c.set_out(1, Tensor::from_f64(x.dtype(), x.shape(), v));
  };
  d.decompose = [](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    const DType dt = n.inputs[0]->type.dtype;
    Value* lp = softmax_core(b, b.convert(n.inputs[0], math_type(dt)), 1, true);
    std::vector<Value*> out = {nll_core(b, n, lp)};
    if (n.outputs.size() > 1) out.push_back(n.outputs[1] ? b.convert(lp, dt) : nullptr);
    return out;
  };
  return d;
}

}  // namespace

// The ops marked symbolic_op take symbolic sizes (docs/dynamic-shapes.md); the rest refuse them.
void register_reduction_ops(OpRegistry& r) {
  r.add(symbolic_op(reduce_op("ReduceSum", 13, RK::sum)));
  r.add(symbolic_op(reduce_op("ReduceMean", 18, RK::mean)));
  r.add(symbolic_op(reduce_op("ReduceMax", 18, RK::max)));
  r.add(symbolic_op(reduce_op("ReduceMin", 18, RK::min)));
  r.add(symbolic_op(reduce_op("ReduceProd", 18, RK::prod)));
  r.add(symbolic_op(reduce_op("ReduceL1", 18, RK::l1)));
  r.add(symbolic_op(reduce_op("ReduceL2", 18, RK::l2)));
  r.add(symbolic_op(reduce_op("ReduceLogSum", 18, RK::log_sum)));
  r.add(symbolic_op(reduce_op("ReduceLogSumExp", 18, RK::log_sum_exp)));
  r.add(symbolic_op(reduce_op("ReduceSumSquare", 18, RK::sum_square)));
  r.add(symbolic_op(arg_op("ArgMax", true)));
  r.add(symbolic_op(arg_op("ArgMin", false)));
  r.add(symbolic_op(softmax_op("Softmax", SM::softmax)));
  r.add(symbolic_op(softmax_op("LogSoftmax", SM::log_softmax)));
  r.add(symbolic_op(softmax_op("Hardmax", SM::hardmax)));
  r.add(symbolic_op(cum_op("CumSum", 11, false)));
  r.add(symbolic_op(cum_op("CumProd", 26, true)));
  r.add(topk_op());
  r.add(nll_op());
  r.add(sce_op());
}

}  // namespace tessel
