// Op family: the core level's 38 primitives (docs/ir/core.md), lowercase names.
//
// The semantics of every primitive (operands, attributes, shape rules, rounding, NaN and integer
// behaviour) are specified in docs/ir/core.md, "Semantics"; the entries below implement exactly that.
// The ops are registered in the domain "tessel.core" (never imported from ONNX).
#include <algorithm>
#include <type_traits>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "tessel/ir/core_ops.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ir/op_registry.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

// Core ops live in their own domain: the ONNX importer never resolves a node to one of them, and
// the op table does not list them as ai.onnx.
void add_core(OpRegistry& r, OpDef d) {
  d.domain = "tessel.core";
  d.symbolic = true;  // every core rule reads dims (static or symbolic)
  r.add(std::move(d));
}

// ---- shared checks ---------------------------------------------------------------------------

// Static or symbolic dims (docs/dynamic-shapes.md), never unknown ones: the core level knows every
// size, as a number or as an expression of the size symbols.
void need_static(const TensorType& t, const char* what) {
  if (!t.dims_defined()) fail("{} {} has an unknown dim: the core level needs static or symbolic shapes", what, t.str());
}

void need_static_all(InferCtx& ctx) {
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_in(i)) fail("operand {} is missing", i);
    need_static(ctx.in(i), "operand");
  }
}

// a <= b for every value of the symbols (a static pair compares as numbers).
bool dim_le(const Dim& a, const Dim& b) { return provably_ge(b, a); }

// ceil(a / s) for a stride s >= 1: exact for a static a, or for s = 1.
Dim ceil_div_dim(const Dim& a, int64_t s) {
  if (a.is_static()) return Dim((a.constant_term() + s - 1) / s);
  if (s == 1) return a;
  if (auto q = exact_div(a + (s - 1), Dim(s))) return *q;
  unsupported("a stride of {} over the symbolic size {} (not a polynomial)", s, a.str());
}

// `layout` (reduce_window, concatenate): how the compiled backend stores the operands and the result,
// "nchw" (row-major, the default) or "nhwc" (channels-last, 4-D only; runs_channels_last in
// kernel/kernel.h). It does not change the values.
void check_layout(InferCtx& ctx, const Dims& x) {
  if (!ctx.node().has_attr("layout")) return;
  const std::string l = ctx.node().attr_s("layout");
  if (l != "nchw" && l != "nhwc") fail("layout '{}' is neither nchw nor nhwc", l);
  if (l == "nhwc" && x.size() != 4) fail("layout nhwc needs a 4-D operand, not rank {}", x.size());
}

void same_type(const TensorType& a, const TensorType& b, const char* what) {
  if (a.dtype != b.dtype)
    fail("{}: operand dtypes differ ({} vs {}); insert an explicit convert", what, dtype_name(a.dtype),
         dtype_name(b.dtype));
  if (a.shape != b.shape || a.sym != b.sym)
    fail("{}: operand shapes differ ({} vs {}); insert an explicit broadcast_in_dim", what,
         dims_str(a.dims()), dims_str(b.dims()));
}

DType dtype_attr(const Node& n, const std::string& name) {
  std::string s = n.attr_s(name);
  auto t = dtype_from_name(s);
  if (!t) fail("{} '{}' is not a tessel dtype name", name, s);
  return *t;
}

// Integer order that is correct for u64 too (get_i returns u64 bits as int64).
bool int_less(DType t, int64_t a, int64_t b) {
  if (t == DType::u64) return static_cast<uint64_t>(a) < static_cast<uint64_t>(b);
  return a < b;
}

std::pair<int64_t, int64_t> int_limits(DType t) {
  switch (t) {
    case DType::i64: return {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
    case DType::i32: return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
    case DType::i16: return {-32768, 32767};
    case DType::i8: return {-128, 127};
    case DType::i4: return {-8, 7};
    case DType::i2: return {-2, 1};
    case DType::u64: return {0, -1};  // all ones = UINT64_MAX
    case DType::u32: return {0, std::numeric_limits<uint32_t>::max()};
    case DType::u16: return {0, 65535};
    case DType::u8: return {0, 255};
    case DType::u4: return {0, 15};
    case DType::u2: return {0, 3};
    default: return {0, 1};  // bool
  }
}


// Element-size copy of one element (any dtype; sub-byte types are one byte each).
inline void copy_elem(Tensor& dst, int64_t di, const Tensor& src, int64_t si, int es) {
  std::memcpy(dst.bytes() + di * es, src.bytes() + si * es, static_cast<size_t>(es));
}

// Advances a row-major multi-index over `shape`; returns false after the last element.
bool next_index(std::vector<int64_t>& idx, const Shape& shape) {
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    if (++idx[d] < shape[d]) return true;
    idx[d] = 0;
  }
  return false;
}

std::vector<int64_t> ints_of_rank(const Node& n, const std::string& name, size_t rank, int64_t dflt,
                                  const char* per = "per dim") {
  std::vector<int64_t> v = n.has_attr(name) ? n.attr_ints(name) : std::vector<int64_t>(rank, dflt);
  if (v.size() != rank) fail("{} has {} entries, expected {} ({})", name, v.size(), rank, per);
  return v;
}

// ---- elementwise -----------------------------------------------------------------------------

enum class Cls { any_float, numeric, int_or_bool, numeric_or_bool };

void check_class(DType t, Cls c, const std::string& op) {
  bool ok = false;
  switch (c) {
    case Cls::any_float: ok = is_float(t); break;
    case Cls::numeric: ok = is_float(t) || is_int(t); break;
    case Cls::int_or_bool: ok = is_int(t) || is_bool(t); break;
    case Cls::numeric_or_bool: ok = true; break;
  }
  if (!ok) fail("{} is not defined for {}", op, dtype_name(t));
}

using F1 = double (*)(double);

OpDef unary_def(const std::string& name, F1 f, bool ints_ok) {
  OpDef d;
  d.name = name;
  d.fusion = FusionKind::pointwise;
  d.infer = [name, ints_ok](InferCtx& ctx) {
    need_static_all(ctx);
    check_class(ctx.in(0).dtype, ints_ok ? Cls::numeric : Cls::any_float, name);
    ctx.set_out(0, ctx.in(0));
  };
  d.kernel = [f](KernelCtx& c) {
    const Tensor& x = c.in(0);
    Tensor y(x.dtype(), x.shape());
    const int64_t n = x.numel();
    if (is_float(x.dtype())) {
      if (x.dtype() == DType::f32) {
        const float* xp = x.data<float>();
        float* yp = y.data<float>();
        for (int64_t i = 0; i < n; ++i) yp[i] = static_cast<float>(f(xp[i]));
      } else {
        for (int64_t i = 0; i < n; ++i) y.set_f(i, f(x.get_f(i)));
      }
    } else {  // only neg reaches here
      for (int64_t i = 0; i < n; ++i)
        y.set_i(i, static_cast<int64_t>(0 - static_cast<uint64_t>(x.get_i(i))));
    }
    c.set_out(0, std::move(y));
  };
  return d;
}

enum class Bin { add, mul, div, rem, pow, max, min, and_, or_, xor_ };

double bin_f(Bin op, double a, double b) {
  switch (op) {
    case Bin::add: return a + b;
    case Bin::mul: return a * b;
    case Bin::div: return a / b;
    case Bin::rem: return std::fmod(a, b);
    case Bin::pow: return std::pow(a, b);
    case Bin::max: return (std::isnan(a) || std::isnan(b)) ? std::numeric_limits<double>::quiet_NaN() : std::max(a, b);
    case Bin::min: return (std::isnan(a) || std::isnan(b)) ? std::numeric_limits<double>::quiet_NaN() : std::min(a, b);
    default: return 0;  // unreachable: rejected by infer
  }
}

int64_t bin_i(Bin op, DType t, int64_t a, int64_t b) {
  const bool u64 = t == DType::u64;
  switch (op) {
    case Bin::add: return wrap_add(a, b);
    case Bin::mul: return wrap_mul(a, b);
    case Bin::div:
    case Bin::rem: {
      if (b == 0) fail("integer {} by zero", op == Bin::div ? "division" : "remainder");
      if (u64) {
        uint64_t ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
        return static_cast<int64_t>(op == Bin::div ? ua / ub : ua % ub);
      }
      if (b == -1) return op == Bin::div ? static_cast<int64_t>(0 - static_cast<uint64_t>(a)) : 0;
      return op == Bin::div ? a / b : a % b;
    }
    case Bin::pow: {
      if (!u64 && b < 0) fail("pow on integers needs an exponent >= 0, got {}", b);
      uint64_t base = static_cast<uint64_t>(a), e = static_cast<uint64_t>(b), r = 1;
      while (e) {
        if (e & 1) r *= base;
        base *= base;
        e >>= 1;
      }
      return static_cast<int64_t>(r);
    }
    case Bin::max: return int_less(t, a, b) ? b : a;
    case Bin::min: return int_less(t, b, a) ? b : a;
    case Bin::and_: return a & b;
    case Bin::or_: return a | b;
    case Bin::xor_: return a ^ b;
  }
  return 0;
}

OpDef binary_def(const std::string& name, Bin op) {
  const bool logical = op == Bin::and_ || op == Bin::or_ || op == Bin::xor_;
  OpDef d;
  d.name = name;
  d.min_inputs = d.max_inputs = 2;
  d.fusion = FusionKind::pointwise;
  d.infer = [name, logical](InferCtx& ctx) {
    need_static_all(ctx);
    same_type(ctx.in(0), ctx.in(1), name.c_str());
    check_class(ctx.in(0).dtype, logical ? Cls::int_or_bool : Cls::numeric, name);
    ctx.set_out(0, ctx.in(0));
  };
  d.kernel = [op](KernelCtx& c) {
    const Tensor& a = c.in(0);
    const Tensor& b = c.in(1);
    if (a.shape() != b.shape() || a.dtype() != b.dtype()) fail("operand types differ");
    Tensor y(a.dtype(), a.shape());
    const int64_t n = a.numel();
    if (is_float(a.dtype())) {
      if (a.dtype() == DType::f32) {
        const float* ap = a.data<float>();
        const float* bp = b.data<float>();
        float* yp = y.data<float>();
        for (int64_t i = 0; i < n; ++i) yp[i] = static_cast<float>(bin_f(op, ap[i], bp[i]));
      } else {
        for (int64_t i = 0; i < n; ++i) y.set_f(i, bin_f(op, a.get_f(i), b.get_f(i)));
      }
    } else {
      for (int64_t i = 0; i < n; ++i) y.set_i(i, bin_i(op, a.dtype(), a.get_i(i), b.get_i(i)));
    }
    c.set_out(0, std::move(y));
  };
  return d;
}

double round_even(double x) {
  if (!std::isfinite(x)) return x;
  double r = std::round(x);  // ties away from zero
  if (std::fabs(x - std::trunc(x)) == 0.5) r = 2.0 * std::round(x / 2.0);
  return r;
}

// The reference function of each unary row of the core-op table, and which dtypes it takes
// (docs/ir/core.md: neg takes integers too). A unary row without a specialization fails to compile.
struct UnaryRef {
  F1 f;
  bool ints_ok = false;
};
template <CoreOp op> UnaryRef unary_ref() = delete;
template <> UnaryRef unary_ref<CoreOp::neg>() { return {[](double x) { return -x; }, true}; }
template <> UnaryRef unary_ref<CoreOp::exp>() { return {[](double x) { return std::exp(x); }}; }
template <> UnaryRef unary_ref<CoreOp::log>() { return {[](double x) { return std::log(x); }}; }
template <> UnaryRef unary_ref<CoreOp::sqrt>() { return {[](double x) { return std::sqrt(x); }}; }
template <> UnaryRef unary_ref<CoreOp::sin>() { return {[](double x) { return std::sin(x); }}; }
template <> UnaryRef unary_ref<CoreOp::atan>() { return {[](double x) { return std::atan(x); }}; }
template <> UnaryRef unary_ref<CoreOp::erf>() { return {[](double x) { return std::erf(x); }}; }
template <> UnaryRef unary_ref<CoreOp::tanh>() { return {[](double x) { return std::tanh(x); }}; }
template <> UnaryRef unary_ref<CoreOp::floor>() { return {[](double x) { return std::floor(x); }}; }
template <> UnaryRef unary_ref<CoreOp::round_even>() { return {round_even}; }

// The reference operation of each binary row; likewise a compile error when missing.
template <CoreOp op> constexpr Bin bin_ref() = delete;
template <> constexpr Bin bin_ref<CoreOp::add>() { return Bin::add; }
template <> constexpr Bin bin_ref<CoreOp::mul>() { return Bin::mul; }
template <> constexpr Bin bin_ref<CoreOp::div>() { return Bin::div; }
template <> constexpr Bin bin_ref<CoreOp::rem>() { return Bin::rem; }
template <> constexpr Bin bin_ref<CoreOp::pow>() { return Bin::pow; }
template <> constexpr Bin bin_ref<CoreOp::max>() { return Bin::max; }
template <> constexpr Bin bin_ref<CoreOp::min>() { return Bin::min; }
template <> constexpr Bin bin_ref<CoreOp::and_>() { return Bin::and_; }
template <> constexpr Bin bin_ref<CoreOp::or_>() { return Bin::or_; }
template <> constexpr Bin bin_ref<CoreOp::xor_>() { return Bin::xor_; }

// Registers the row `op` if it is a unary or binary elementwise op (the others are written out below).
template <CoreOp op> void register_elementwise_row(OpRegistry& r) {
  constexpr const CoreOpInfo& i = core_op_info(op);
  if constexpr (i.kind == CoreKind::unary) {
    const UnaryRef u = unary_ref<op>();
    add_core(r, unary_def(std::string(i.name), u.f, u.ints_ok));
  } else if constexpr (i.kind == CoreKind::binary) {
    add_core(r, binary_def(std::string(i.name), bin_ref<op>()));
  }
}

void register_elementwise(OpRegistry& r) {
#define TESSEL_CORE_OP(id, ...) register_elementwise_row<CoreOp::id>(r);
#include "tessel/ir/core_ops.def"
#undef TESSEL_CORE_OP

  {
    OpDef d;
    d.name = "compare";
    d.min_inputs = d.max_inputs = 2;
    d.fusion = FusionKind::pointwise;
    d.attrs = {{"direction", AttrKind::s, true}};
    static const std::vector<std::string> dirs = {"eq", "ne", "lt", "le", "gt", "ge"};
    auto dir_of = [](const Node& n) {
      std::string s = n.attr_s("direction");
      auto it = std::find(dirs.begin(), dirs.end(), s);
      if (it == dirs.end()) fail("direction '{}' is not one of eq, ne, lt, le, gt, ge", s);
      return static_cast<int>(it - dirs.begin());
    };
    d.infer = [dir_of](InferCtx& ctx) {
      need_static_all(ctx);
      dir_of(ctx.node());
      same_type(ctx.in(0), ctx.in(1), "compare");
      ctx.set_out(0, TensorType::of(DType::boolean, ctx.in(0).dims()));
    };
    d.kernel = [dir_of](KernelCtx& c) {
      const int dir = dir_of(c.node());
      const Tensor& a = c.in(0);
      const Tensor& b = c.in(1);
      Tensor y(DType::boolean, a.shape());
      const int64_t n = a.numel();
      auto pick = [dir](bool lt, bool eq, bool gt) {
        switch (dir) {
          case 0: return eq;
          case 1: return !eq;
          case 2: return lt;
          case 3: return lt || eq;
          case 4: return gt;
          default: return gt || eq;
        }
      };
      for (int64_t i = 0; i < n; ++i) {
        bool lt, eq, gt;
        if (is_float(a.dtype())) {
          double x = a.get_f(i), z = b.get_f(i);
          lt = x < z, eq = x == z, gt = x > z;  // all false with NaN; ne is then true
        } else {
          int64_t x = a.get_i(i), z = b.get_i(i);
          lt = int_less(a.dtype(), x, z), gt = int_less(a.dtype(), z, x), eq = x == z;
        }
        y.bytes()[i] = pick(lt, eq, gt) ? 1 : 0;
      }
      c.set_out(0, std::move(y));
    };
    add_core(r, std::move(d));
  }
  {
    OpDef d;
    d.name = "select";
    d.min_inputs = d.max_inputs = 3;
    d.fusion = FusionKind::pointwise;
    d.infer = [](InferCtx& ctx) {
      need_static_all(ctx);
      if (ctx.in(0).dtype != DType::boolean) fail("select's predicate must be bool, got {}", dtype_name(ctx.in(0).dtype));
      same_type(ctx.in(1), ctx.in(2), "select");
      if (ctx.in(0).dims() != ctx.in(1).dims())
        fail("select: predicate shape {} differs from the operands' {}", dims_str(ctx.in(0).dims()),
             dims_str(ctx.in(1).dims()));
      ctx.set_out(0, ctx.in(1));
    };
    d.kernel = [](KernelCtx& c) {
      const Tensor& p = c.in(0);
      const Tensor& t = c.in(1);
      const Tensor& f = c.in(2);
      Tensor y(t.dtype(), t.shape());
      const int es = dtype_size(t.dtype());
      for (int64_t i = 0; i < t.numel(); ++i) copy_elem(y, i, p.bytes()[i] ? t : f, i, es);
      c.set_out(0, std::move(y));
    };
    add_core(r, std::move(d));
  }
}

// ---- casts -------------------------------------------------------------------------------------

bool is_f8_type(DType t) {
  return t == DType::f8e4m3fn || t == DType::f8e4m3fnuz || t == DType::f8e5m2 || t == DType::f8e5m2fnuz;
}

Tensor convert_tensor(const Tensor& x, DType to, bool saturate) {
  Tensor y(to, x.shape());
  const int64_t n = x.numel();
  const DType from = x.dtype();
  if (from == to) {
    if (x.nbytes()) std::memcpy(y.bytes(), x.bytes(), x.nbytes());
    return y;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (is_bool(to)) {
      y.bytes()[i] = (is_float(from) ? x.get_f(i) != 0 : x.get_i(i) != 0) ? 1 : 0;
    } else if (to == DType::f8e8m0) {
      y.bytes()[i] = encode_e8m0(x.get_f(i), saturate, E8M0Round::up);
    } else if (is_f8_type(to)) {
      y.bytes()[i] = static_cast<uint8_t>(encode_float_bits(to, x.get_f(i), saturate));
    } else if (to == DType::f4e2m1) {
      double v = x.get_f(i);
      y.bytes()[i] = std::isnan(v) ? 0x8 : static_cast<uint8_t>(encode_float_bits(to, v, true));
    } else if (is_float(to) || is_float(from)) {
      y.set_f(i, x.get_f(i));  // float -> int truncates toward zero
    } else {
      y.set_i(i, x.get_i(i));  // int -> int wraps
    }
  }
  return y;
}

void register_casts(OpRegistry& r) {
  {
    OpDef d;
    d.name = "convert";
    d.fusion = FusionKind::pointwise;
    d.attrs = {{"dtype", AttrKind::s, true}, {"saturate", AttrKind::i}};
    d.infer = [](InferCtx& ctx) {
      need_static_all(ctx);
      int64_t s = ctx.node().attr_i("saturate", 1);
      if (s != 0 && s != 1) fail("saturate must be 0 or 1, got {}", s);
      ctx.set_out(0, TensorType::of(dtype_attr(ctx.node(), "dtype"), ctx.in(0).dims()));
    };
    d.kernel = [](KernelCtx& c) {
      c.set_out(0, convert_tensor(c.in(0), dtype_attr(c.node(), "dtype"), c.node().attr_i("saturate", 1) != 0));
    };
    add_core(r, std::move(d));
  }
  {
    OpDef d;
    d.name = "bitcast_convert";
    d.fusion = FusionKind::pointwise;
    d.attrs = {{"dtype", AttrKind::s, true}};
    d.infer = [](InferCtx& ctx) {
      need_static_all(ctx);
      DType to = dtype_attr(ctx.node(), "dtype");
      DType from = ctx.in(0).dtype;
      if (dtype_bits(to) != dtype_bits(from) || dtype_size(to) != dtype_size(from))
        fail("bitcast_convert from {} ({} bits) to {} ({} bits): element sizes differ", dtype_name(from),
             dtype_bits(from), dtype_name(to), dtype_bits(to));
      ctx.set_out(0, TensorType::of(to, ctx.in(0).dims()));
    };
    d.kernel = [](KernelCtx& c) {
      const Tensor& x = c.in(0);
      DType to = dtype_attr(c.node(), "dtype");
      Tensor y(to, x.shape());
      const int bits = dtype_bits(to);
      if (bits < 8 && !is_bool(to)) {
        const unsigned mask = (1u << bits) - 1;
        for (int64_t i = 0; i < x.numel(); ++i) {
          unsigned v = x.bytes()[i] & mask;
          if (is_signed_int(to) && (v >> (bits - 1)) & 1u) v |= ~mask;  // sign-extend
          y.bytes()[i] = static_cast<uint8_t>(v);
        }
      } else if (is_bool(to)) {
        for (int64_t i = 0; i < x.numel(); ++i) y.bytes()[i] = x.bytes()[i] != 0;
      } else if (x.nbytes()) {
        std::memcpy(y.bytes(), x.bytes(), x.nbytes());
      }
      c.set_out(0, std::move(y));
    };
    add_core(r, std::move(d));
  }
}

// ---- reductions ----------------------------------------------------------------------------------

using RK = ReduceKind;

RK kind_of(const Node& n) {
  // The kind names its combining primitive in the core-op table (sum -> add, prod -> mul).
  const std::string k = n.attr_s("kind");
  if (const std::optional<RK> r = reduce_kind_named(k)) return *r;
  fail("kind '{}' is not one of sum, max, min, prod", k);
}

void check_reduce_dtype(DType t, RK k) {
  if (is_bool(t) && (k == RK::sum || k == RK::prod)) fail("reduce sum/prod is not defined for bool");
}

// Accumulator for one reduction kind over one dtype.
struct Acc {
  RK k;
  DType t;
  bool fl;
  double identity_f() const { return reduce_identity(k); }
  int64_t identity_i() const {
    switch (k) {
      case RK::sum: return 0;
      case RK::prod: return 1;
      case RK::max: return int_limits(t).first;
      default: return int_limits(t).second;
    }
  }
  void add_f(double& a, double v) const { reduce_combine(k, a, v); }
  void add_i(int64_t& a, int64_t v) const {
    switch (k) {
      case RK::sum: a = wrap_add(a, v); break;
      case RK::prod: a = wrap_mul(a, v); break;
      case RK::max:
        if (int_less(t, a, v)) a = v;
        break;
      case RK::min:
        if (int_less(t, v, a)) a = v;
        break;
    }
  }
};

Cost reduce_window_cost(const Node& n) {
  Cost c;
  for (const Value* v : n.inputs)
    if (v && shape_known(v->type.shape)) c.bytes += shape_numel(v->type.shape) * dtype_size(v->type.dtype);
  const Value* o = n.outputs.empty() ? nullptr : n.outputs[0];
  if (o && shape_known(o->type.shape)) {
    c.bytes += shape_numel(o->type.shape) * dtype_size(o->type.dtype);
    double w = 1;
    if (n.has_attr("window"))
      for (int64_t k : n.attr_ints("window")) w *= static_cast<double>(std::max<int64_t>(k, 0));
    c.flops = w * static_cast<double>(shape_numel(o->type.shape));
  }
  return c;
}

template <class D>
struct WindowGeomT {
  std::vector<int64_t> window, strides, dilations, padding;
  std::vector<D> out;
};
using WindowGeom = WindowGeomT<int64_t>;

// Output dim of a windowed op: floor((in + lo + hi - eff) / stride) + 1, 0 when the window does
// not fit once.
int64_t window_out(int64_t in, int64_t lo, int64_t hi, int64_t k, int64_t s, int64_t dil) {
  const int64_t padded = in + lo + hi;
  if (padded < 0) fail("padding {}, {} leaves a negative size for a dim of {}", lo, hi, in);
  const int64_t eff = dil * (k - 1) + 1;
  if (padded < eff) return 0;
  return (padded - eff) / s + 1;
}

// Symbolic: a dim whose window covers one element with no padding and stride 1 (the N and C of a
// pooling) passes through; a windowed symbolic dim is refused (its size is a floor division).
Dim window_out(const Dim& in, int64_t lo, int64_t hi, int64_t k, int64_t s, int64_t dil) {
  if (in.is_static()) return window_out(in.constant_term(), lo, hi, k, s, dil);
  if (lo == 0 && hi == 0 && k == 1 && s == 1) return in;
  unsupported("a window over the symbolic size {} (its output size is a floor division)", in.str());
}

template <class D>
WindowGeomT<D> reduce_window_geom(const Node& n, const std::vector<D>& in) {
  const size_t r = in.size();
  WindowGeomT<D> g;
  g.window = n.attr_ints("window");
  if (g.window.size() != r) fail("window has {} entries, expected {} (one per dim)", g.window.size(), r);
  g.strides = ints_of_rank(n, "strides", r, 1);
  g.dilations = ints_of_rank(n, "dilations", r, 1);
  g.padding = ints_of_rank(n, "padding", 2 * r, 0, "low and high per dim");
  for (size_t d = 0; d < r; ++d) {
    if (g.window[d] < 1) fail("window[{}] = {} must be >= 1", d, g.window[d]);
    if (g.strides[d] < 1) fail("strides[{}] = {} must be >= 1", d, g.strides[d]);
    if (g.dilations[d] < 1) fail("dilations[{}] = {} must be >= 1", d, g.dilations[d]);
    g.out.push_back(window_out(in[d], g.padding[2 * d], g.padding[2 * d + 1], g.window[d], g.strides[d],
                               g.dilations[d]));
  }
  return g;
}

std::vector<bool> reduce_axes_mask(const Node& n, int rank) {
  std::vector<int64_t> axes = n.attr_ints("axes");
  std::vector<bool> mask(rank, false);
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i] < 0 || axes[i] >= rank) fail("axis {} is out of range for rank {}", axes[i], rank);
    if (i > 0 && axes[i] <= axes[i - 1]) fail("axes must be sorted and unique, got {} after {}", axes[i], axes[i - 1]);
    mask[axes[i]] = true;
  }
  return mask;
}

void register_reductions(OpRegistry& r) {
  {
    OpDef d;
    d.name = "reduce";
    d.fusion = FusionKind::reduction;
    d.attrs = {{"kind", AttrKind::s, true}, {"axes", AttrKind::ints, true}};
    d.cost = cost_per_input_element(1);
    d.infer = [](InferCtx& ctx) {
      need_static_all(ctx);
      const TensorType& x = ctx.in(0);
      RK k = kind_of(ctx.node());
      check_reduce_dtype(x.dtype, k);
      std::vector<bool> mask = reduce_axes_mask(ctx.node(), static_cast<int>(x.shape.size()));
      const Dims xd = x.dims();
      Dims out;
      for (size_t i = 0; i < mask.size(); ++i)
        if (!mask[i]) out.push_back(xd[i]);
      ctx.set_out(0, TensorType::of(x.dtype, out));
    };
    d.kernel = [](KernelCtx& c) {
      const Tensor& x = c.in(0);
      const Acc acc{kind_of(c.node()), x.dtype(), is_float(x.dtype())};
      std::vector<bool> mask = reduce_axes_mask(c.node(), x.rank());
      Shape out_shape;
      for (int i = 0; i < x.rank(); ++i)
        if (!mask[i]) out_shape.push_back(x.dim(i));
      // Output stride of each input dim (0 for reduced dims).
      std::vector<int64_t> os(x.rank(), 0);
      {
        int64_t s = 1;
        for (int i = x.rank() - 1; i >= 0; --i)
          if (!mask[i]) {
            os[i] = s;
            s *= x.dim(i);
          }
      }
      const int64_t on = shape_numel(out_shape);
      Tensor y(x.dtype(), out_shape);
      std::vector<double> af(acc.fl ? on : 0, acc.identity_f());
      std::vector<int64_t> ai(acc.fl ? 0 : on, acc.identity_i());
      if (x.numel() > 0) {
        std::vector<int64_t> idx(x.rank(), 0);
        int64_t o = 0;
        for (int64_t i = 0; i < x.numel(); ++i) {
          if (acc.fl)
            acc.add_f(af[o], x.get_f(i));
          else
            acc.add_i(ai[o], x.get_i(i));
          for (int dd = x.rank() - 1; dd >= 0; --dd) {
            if (++idx[dd] < x.dim(dd)) {
              o += os[dd];
              break;
            }
            o -= os[dd] * (x.dim(dd) - 1);
            idx[dd] = 0;
          }
        }
      }
      for (int64_t i = 0; i < on; ++i) {
        if (acc.fl)
          y.set_f(i, af[i]);
        else
          y.set_i(i, ai[i]);
      }
      c.set_out(0, std::move(y));
    };
    add_core(r, std::move(d));
  }
  {
    OpDef d;
    d.name = "reduce_window";
    d.fusion = FusionKind::reduction;
    d.attrs = {{"kind", AttrKind::s, true},
               {"window", AttrKind::ints, true},
               {"strides", AttrKind::ints},
               {"dilations", AttrKind::ints},
               {"padding", AttrKind::ints},
               {"layout", AttrKind::s}};
    d.cost = reduce_window_cost;
    d.infer = [](InferCtx& ctx) {
      need_static_all(ctx);
      const TensorType& x = ctx.in(0);
      check_layout(ctx, x.dims());
      check_reduce_dtype(x.dtype, kind_of(ctx.node()));
      ctx.set_out(0, TensorType::of(x.dtype, reduce_window_geom(ctx.node(), x.dims()).out));
    };
    d.kernel = [](KernelCtx& c) {
      const Tensor& x = c.in(0);
      const Acc acc{kind_of(c.node()), x.dtype(), is_float(x.dtype())};
      const WindowGeom g = reduce_window_geom(c.node(), x.shape());
      Tensor y(x.dtype(), g.out);
      const int r = x.rank();
      const std::vector<int64_t> xs = strides_of(x.shape());
      const Shape wshape(g.window.begin(), g.window.end());
      std::vector<int64_t> oi(r, 0), wi(r, 0);
      for (int64_t o = 0; o < y.numel(); ++o) {
        double af = acc.identity_f();
        int64_t ai = acc.identity_i();
        std::fill(wi.begin(), wi.end(), 0);
        do {
          int64_t flat = 0;
          bool inside = true;
          for (int dd = 0; dd < r && inside; ++dd) {
            int64_t p = oi[dd] * g.strides[dd] + wi[dd] * g.dilations[dd] - g.padding[2 * dd];
            if (p < 0 || p >= x.dim(dd)) inside = false;
            flat += p * xs[dd];
          }
          if (!inside) continue;  // a padded position holds the identity
          if (acc.fl)
            acc.add_f(af, x.get_f(flat));
          else
            acc.add_i(ai, x.get_i(flat));
        } while (next_index(wi, wshape));
        if (acc.fl)
          y.set_f(o, af);
        else
          y.set_i(o, ai);
        next_index(oi, g.out);
      }
      c.set_out(0, std::move(y));
    };
    add_core(r, std::move(d));
  }
}

// ---- contractions --------------------------------------------------------------------------------

template <class D>
struct DotGeomT {
  std::vector<int64_t> lb, rb, lc, rc, lf, rf;  // lf/rf: free dims in order
  D B = 1, M = 1, N = 1, K = 1;
  std::vector<D> out;
};
using DotGeom = DotGeomT<int64_t>;

template <class D>
DotGeomT<D> dot_geom(const Node& n, const std::vector<D>& a, const std::vector<D>& b) {
  DotGeomT<D> g;
  g.lb = n.attr_ints("lhs_batch", {});
  g.rb = n.attr_ints("rhs_batch", {});
  g.lc = n.attr_ints("lhs_contract");
  g.rc = n.attr_ints("rhs_contract");
  if (g.lb.size() != g.rb.size()) fail("lhs_batch has {} dims but rhs_batch {}", g.lb.size(), g.rb.size());
  if (g.lc.size() != g.rc.size())
    fail("lhs_contract has {} dims but rhs_contract {}", g.lc.size(), g.rc.size());
  auto check = [](const std::vector<int64_t>& bd, const std::vector<int64_t>& cd, const std::vector<D>& s,
                  const char* side, std::vector<int64_t>& free) {
    std::vector<bool> used(s.size(), false);
    for (const auto* lst : {&bd, &cd})
      for (int64_t dd : *lst) {
        if (dd < 0 || dd >= static_cast<int64_t>(s.size()))
          fail("{} dim {} is out of range for rank {}", side, dd, s.size());
        if (used[dd]) fail("{} dim {} is listed twice in the batch/contract dims", side, dd);
        used[dd] = true;
      }
    for (size_t dd = 0; dd < s.size(); ++dd)
      if (!used[dd]) free.push_back(static_cast<int64_t>(dd));
  };
  check(g.lb, g.lc, a, "lhs", g.lf);
  check(g.rb, g.rc, b, "rhs", g.rf);
  for (size_t i = 0; i < g.lb.size(); ++i) {
    if (a[g.lb[i]] != b[g.rb[i]])
      fail("batch dim pair {}: lhs dim {} has size {} but rhs dim {} has {}", i, g.lb[i], a[g.lb[i]], g.rb[i],
           b[g.rb[i]]);
    g.B *= a[g.lb[i]];
    g.out.push_back(a[g.lb[i]]);
  }
  for (size_t i = 0; i < g.lc.size(); ++i) {
    if (a[g.lc[i]] != b[g.rc[i]])
      fail("contract dim pair {}: lhs dim {} has size {} but rhs dim {} has {}", i, g.lc[i], a[g.lc[i]], g.rc[i],
           b[g.rc[i]]);
    g.K *= a[g.lc[i]];
  }
  for (int64_t dd : g.lf) {
    g.M *= a[dd];
    g.out.push_back(a[dd]);
  }
  for (int64_t dd : g.rf) {
    g.N *= b[dd];
    g.out.push_back(b[dd]);
  }
  return g;
}

// Gathers `t` permuted so that dims in `order` come first..last, as a flat row-major index list.
std::vector<int64_t> permuted_offsets(const Shape& s, const std::vector<int64_t>& order) {
  const std::vector<int64_t> st = strides_of(s);
  Shape ps;
  for (int64_t dd : order) ps.push_back(s[dd]);
  std::vector<int64_t> offs;
  const int64_t n = shape_numel(s);
  offs.reserve(static_cast<size_t>(std::max<int64_t>(n, 0)));
  if (n <= 0) return offs;
  std::vector<int64_t> idx(order.size(), 0);
  do {
    int64_t f = 0;
    for (size_t i = 0; i < order.size(); ++i) f += idx[i] * st[order[i]];
    offs.push_back(f);
  } while (next_index(idx, ps));
  return offs;
}

Cost dot_cost(const Node& n) {
  Cost c;
  for (const Value* v : n.inputs)
    if (v && shape_known(v->type.shape)) c.bytes += shape_numel(v->type.shape) * dtype_size(v->type.dtype);
  const Value* o = n.outputs.empty() ? nullptr : n.outputs[0];
  if (!o || !shape_known(o->type.shape) || n.inputs.size() < 1 || !n.inputs[0]) return c;
  c.bytes += shape_numel(o->type.shape) * dtype_size(o->type.dtype);
  double k = 1;
  const Shape& a = n.inputs[0]->type.shape;
  if (n.has_attr("lhs_contract"))
    for (int64_t dd : n.attr_ints("lhs_contract"))
      if (dd >= 0 && dd < static_cast<int64_t>(a.size())) k *= static_cast<double>(std::max<int64_t>(a[dd], 0));
  c.flops = 2.0 * k * static_cast<double>(shape_numel(o->type.shape));
  return c;
}

Cost conv_cost(const Node& n) {
  Cost c;
  for (const Value* v : n.inputs)
    if (v && shape_known(v->type.shape)) c.bytes += shape_numel(v->type.shape) * dtype_size(v->type.dtype);
  const Value* o = n.outputs.empty() ? nullptr : n.outputs[0];
  if (!o || !shape_known(o->type.shape) || n.inputs.size() < 2 || !n.inputs[1]) return c;
  c.bytes += shape_numel(o->type.shape) * dtype_size(o->type.dtype);
  const Shape& w = n.inputs[1]->type.shape;
  double per = 1;  // C/groups * prod(k): the weight's element count per output channel
  for (size_t i = 1; i < w.size(); ++i) per *= static_cast<double>(std::max<int64_t>(w[i], 0));
  c.flops = 2.0 * per * static_cast<double>(shape_numel(o->type.shape));
  return c;
}

template <class D>
struct ConvGeomT {
  std::vector<int64_t> strides, dilations, padding;
  int64_t groups = 1;
  std::vector<D> out;
};
using ConvGeom = ConvGeomT<int64_t>;

// Symbolic: the batch dim only (channels and spatial dims static).
template <class D>
ConvGeomT<D> conv_geom(const Node& n, const std::vector<D>& x, const std::vector<D>& w) {
  if (x.size() < 3) fail("convolution input must be [N, C, spatial...] (rank >= 3), got {}", shape_str(x));
  if (w.size() != x.size())
    fail("convolution weight rank {} differs from the input rank {}", w.size(), x.size());
  const size_t sp = x.size() - 2;
  ConvGeomT<D> g;
  g.strides = ints_of_rank(n, "strides", sp, 1, "per spatial dim");
  g.dilations = ints_of_rank(n, "dilations", sp, 1, "per spatial dim");
  g.padding = ints_of_rank(n, "padding", 2 * sp, 0, "low and high per spatial dim");
  g.groups = n.attr_i("groups", 1);
  if (g.groups < 1) fail("groups = {} must be >= 1", g.groups);
  if (x[1] % g.groups != 0) fail("{} input channels are not divisible by groups = {}", x[1], g.groups);
  if (w[0] % g.groups != 0) fail("{} output channels are not divisible by groups = {}", w[0], g.groups);
  if (w[1] != x[1] / g.groups)
    fail("weight has {} input channels per group, expected C/groups = {}", w[1], x[1] / g.groups);
  g.out = {x[0], w[0]};
  for (size_t i = 0; i < sp; ++i) {
    if (g.strides[i] < 1) fail("strides[{}] = {} must be >= 1", i, g.strides[i]);
    if (g.dilations[i] < 1) fail("dilations[{}] = {} must be >= 1", i, g.dilations[i]);
    if (w[i + 2] < 1) fail("kernel dim {} has size {}; it must be >= 1", i, w[i + 2]);
    g.out.push_back(window_out(x[i + 2], g.padding[2 * i], g.padding[2 * i + 1], w[i + 2], g.strides[i],
                               g.dilations[i]));
  }
  return g;
}

void register_contractions(OpRegistry& r) {
  {
    OpDef d;
    d.name = "dot_general";
    d.min_inputs = d.max_inputs = 2;
    d.fusion = FusionKind::matmul;
    d.attrs = {{"lhs_batch", AttrKind::ints},
               {"rhs_batch", AttrKind::ints},
               {"lhs_contract", AttrKind::ints, true},
               {"rhs_contract", AttrKind::ints, true}};
    d.cost = dot_cost;
    d.infer = [](InferCtx& ctx) {
      need_static_all(ctx);
      const TensorType& a = ctx.in(0);
      const TensorType& b = ctx.in(1);
      if (a.dtype != b.dtype)
        fail("dot_general: operand dtypes differ ({} vs {}); insert an explicit convert", dtype_name(a.dtype),
             dtype_name(b.dtype));
      check_class(a.dtype, Cls::numeric, "dot_general");
      ctx.set_out(0, TensorType::of(a.dtype, dot_geom(ctx.node(), a.dims(), b.dims()).out));
    };
    d.kernel = [](KernelCtx& c) {
      const Tensor& a = c.in(0);
      const Tensor& b = c.in(1);
      const DotGeom g = dot_geom(c.node(), a.shape(), b.shape());
      // lhs as [B, M, K], rhs as [B, K, N] through offset tables.
      std::vector<int64_t> lo = g.lb, ro = g.rb;
      lo.insert(lo.end(), g.lf.begin(), g.lf.end());
      lo.insert(lo.end(), g.lc.begin(), g.lc.end());
      ro.insert(ro.end(), g.rc.begin(), g.rc.end());
      ro.insert(ro.end(), g.rf.begin(), g.rf.end());
      const std::vector<int64_t> la = permuted_offsets(a.shape(), lo);
      const std::vector<int64_t> rb = permuted_offsets(b.shape(), ro);
      Tensor y(a.dtype(), g.out);
      const int64_t B = g.B, M = g.M, N = g.N, K = g.K;
      // Pack both operands through the offset tables into [B, M, K] and [B, K, N], then multiply.
      auto pack = [](const auto& v, const std::vector<int64_t>& offsets) {
        std::remove_cvref_t<decltype(v)> out(offsets.size());
        for (size_t i = 0; i < offsets.size(); ++i) out[i] = v[offsets[i]];
        return out;
      };
      if (is_float(a.dtype())) {
        const std::vector<double> av = pack(a.to_f64(), la), bv = pack(b.to_f64(), rb);
        std::vector<double> yv(static_cast<size_t>(B * M * N));
        for (int64_t t = 0; t < B; ++t) gemm_f64(av.data() + t * M * K, bv.data() + t * K * N, yv.data() + t * M * N, M, K, N);
        for (int64_t i = 0; i < B * M * N; ++i) y.set_f(i, yv[i]);
      } else {
        const std::vector<int64_t> av = pack(a.to_i64(), la), bv = pack(b.to_i64(), rb);
        std::vector<int64_t> yv(static_cast<size_t>(B * M * N));
        for (int64_t t = 0; t < B; ++t) gemm_i64(av.data() + t * M * K, bv.data() + t * K * N, yv.data() + t * M * N, M, K, N);
        for (int64_t i = 0; i < B * M * N; ++i) y.set_i(i, yv[i]);
      }
      c.set_out(0, std::move(y));
    };
    add_core(r, std::move(d));
  }
  {
    OpDef d;
    d.name = "convolution";
    d.min_inputs = d.max_inputs = 2;
    d.fusion = FusionKind::matmul;
    d.attrs = {{"strides", AttrKind::ints},
               {"dilations", AttrKind::ints},
               {"padding", AttrKind::ints},
               {"groups", AttrKind::i}};
    d.cost = conv_cost;
    d.infer = [](InferCtx& ctx) {
      need_static_all(ctx);
      const TensorType& x = ctx.in(0);
      const TensorType& w = ctx.in(1);
      if (x.dtype != w.dtype)
        fail("convolution: operand dtypes differ ({} vs {}); insert an explicit convert", dtype_name(x.dtype),
             dtype_name(w.dtype));
      check_class(x.dtype, Cls::numeric, "convolution");
      ctx.set_out(0, TensorType::of(x.dtype, conv_geom(ctx.node(), x.dims(), w.dims()).out));
    };
    d.kernel = [](KernelCtx& c) {
      const Tensor& x = c.in(0);
      const Tensor& w = c.in(1);
      const ConvGeom g = conv_geom(c.node(), x.shape(), w.shape());
      Tensor y(x.dtype(), g.out);
      const bool fl = is_float(x.dtype());
      const std::vector<double> xf = fl ? x.to_f64() : std::vector<double>{};
      const std::vector<double> wf = fl ? w.to_f64() : std::vector<double>{};
      const std::vector<int64_t> xi = fl ? std::vector<int64_t>{} : x.to_i64();
      const std::vector<int64_t> wi = fl ? std::vector<int64_t>{} : w.to_i64();
      const int sp = x.rank() - 2;
      const int64_t N = x.dim(0), C = x.dim(1), O = w.dim(0), Cg = w.dim(1), Og = O / g.groups;
      const Shape xsp(x.shape().begin() + 2, x.shape().end());
      const Shape ksp(w.shape().begin() + 2, w.shape().end());
      const Shape osp(g.out.begin() + 2, g.out.end());
      const std::vector<int64_t> xst = strides_of(xsp);
      const int64_t xplane = shape_numel(xsp), kplane = shape_numel(ksp), oplane = shape_numel(osp);
      std::vector<int64_t> oi(sp, 0), ki(sp, 0);
      for (int64_t p = 0; p < oplane; ++p) {
        // Input offsets (within a plane) of each kernel tap for this output position; -1 = padding.
        std::vector<int64_t> tap(static_cast<size_t>(kplane), -1);
        std::fill(ki.begin(), ki.end(), 0);
        for (int64_t t = 0; t < kplane; ++t) {
          int64_t f = 0;
          bool inside = true;
          for (int dd = 0; dd < sp && inside; ++dd) {
            int64_t q = oi[dd] * g.strides[dd] + ki[dd] * g.dilations[dd] - g.padding[2 * dd];
            if (q < 0 || q >= xsp[dd]) inside = false;
            f += q * xst[dd];
          }
          if (inside) tap[t] = f;
          next_index(ki, ksp);
        }
        for (int64_t n = 0; n < N; ++n)
          for (int64_t o = 0; o < O; ++o) {
            const int64_t grp = o / Og;
            double accf = 0;
            int64_t acci = 0;
            for (int64_t cc = 0; cc < Cg; ++cc) {
              const int64_t xbase = (n * C + grp * Cg + cc) * xplane;
              const int64_t wbase = (o * Cg + cc) * kplane;
              for (int64_t t = 0; t < kplane; ++t) {
                if (tap[t] < 0) continue;
                if (fl)
                  accf += xf[xbase + tap[t]] * wf[wbase + t];
                else
                  acci = wrap_add(acci, wrap_mul(xi[xbase + tap[t]], wi[wbase + t]));
              }
            }
            const int64_t yi = (n * O + o) * oplane + p;
            if (fl)
              y.set_f(yi, accf);
            else
              y.set_i(yi, acci);
          }
        next_index(oi, osp);
      }
      c.set_out(0, std::move(y));
    };
    add_core(r, std::move(d));
  }
}

// ---- shape and data movement -------------------------------------------------------------------

template <class D>
void check_bcast(const Node& n, const std::vector<D>& in, const std::vector<D>& out, const std::vector<int64_t>& dims) {
  (void)n;
  if (dims.size() != in.size())
    fail("dims has {} entries but the operand has rank {}", dims.size(), in.size());
  for (const D& s : out)
    if (!dim_le(0, s)) fail("shape {} has a negative dim", dims_str(Dims(out.begin(), out.end())));
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0 || dims[i] >= static_cast<int64_t>(out.size()))
      fail("dims[{}] = {} is out of range for the output rank {}", i, dims[i], out.size());
    if (i > 0 && dims[i] <= dims[i - 1]) fail("dims must be strictly increasing, got {} after {}", dims[i], dims[i - 1]);
    if (in[i] != out[dims[i]] && in[i] != 1)
      fail("operand dim {} (size {}) cannot broadcast to output dim {} (size {})", i, in[i], dims[i], out[dims[i]]);
  }
}

template <class D>
struct SliceGeomT {
  std::vector<D> starts, stops;
  std::vector<int64_t> strides;
  std::vector<D> out;
};
using SliceGeom = SliceGeomT<int64_t>;

// Symbolic: starts and stops may be sizes (dims[..]) with a positive stride; the bounds must hold
// for every value of the symbols.
template <class D>
SliceGeomT<D> slice_geom(const Node& n, const std::vector<D>& in) {
  const size_t r = in.size();
  SliceGeomT<D> g;
  if constexpr (std::is_same_v<D, Dim>) {
    g.starts = n.attr_dims("starts");
    g.stops = n.attr_dims("stops");
  } else {
    g.starts = n.attr_ints("starts");
    g.stops = n.attr_ints("stops");
  }
  if (g.starts.size() != r) fail("starts has {} entries, expected {} (one per dim)", g.starts.size(), r);
  if (g.stops.size() != r) fail("stops has {} entries, expected {} (one per dim)", g.stops.size(), r);
  g.strides = ints_of_rank(n, "strides", r, 1);
  for (size_t d = 0; d < r; ++d) {
    const D a = g.starts[d], b = g.stops[d];
    const int64_t s = g.strides[d];
    if (s == 0) fail("strides[{}] is 0", d);
    if constexpr (std::is_same_v<D, Dim>) {
      if (!(a.is_static() && b.is_static() && in[d].is_static())) {
        if (s < 0) unsupported("slice: a negative stride over the symbolic dim {}", d);
        if (!(dim_le(0, a) && dim_le(a, b) && dim_le(b, in[d])))
          fail("dim {}: need 0 <= start <= stop <= {} for every value of the symbols, got start {} stop {}", d, in[d], a, b);
        g.out.push_back(ceil_div_dim(b - a, s));
        continue;
      }
    }
    if (s > 0) {
      if (!(0 <= a && a <= b && b <= in[d]))
        fail("dim {}: with stride {} need 0 <= start <= stop <= {}, got start {} stop {}", d, s, in[d], a, b);
      g.out.push_back((b - a + s - 1) / s);
    } else {
      if (!(-1 <= b && b <= a && a <= in[d] - 1) && !(a == b && a == -1))
        fail("dim {}: with stride {} need -1 <= stop <= start <= {}, got start {} stop {}", d, s, in[d] - 1, a, b);
      g.out.push_back((a - b + (-s) - 1) / (-s));
    }
  }
  return g;
}

template <class D>
struct PadGeomT {
  std::vector<int64_t> low, high, interior;
  std::vector<D> out;
};
using PadGeom = PadGeomT<int64_t>;

template <class D>
PadGeomT<D> pad_geom(const Node& n, const std::vector<D>& in) {
  const size_t r = in.size();
  PadGeomT<D> g;
  g.low = n.attr_ints("low");
  g.high = n.attr_ints("high");
  if (g.low.size() != r) fail("low has {} entries, expected {} (one per dim)", g.low.size(), r);
  if (g.high.size() != r) fail("high has {} entries, expected {} (one per dim)", g.high.size(), r);
  g.interior = ints_of_rank(n, "interior", r, 0);
  for (size_t d = 0; d < r; ++d) {
    if (g.interior[d] < 0) fail("interior[{}] = {} must be >= 0", d, g.interior[d]);
    D o = g.low[d] + g.high[d] + in[d];
    if (g.interior[d] != 0) o = o + std::max<int64_t>(in[d] - 1, 0) * g.interior[d];
    if (!dim_le(0, o)) fail("dim {}: padding low {} high {} leaves a negative size", d, g.low[d], g.high[d]);
    g.out.push_back(o);
  }
  return g;
}

// Resolves an ONNX-style element index along `axis` (negative wraps once).
int64_t resolve_index(int64_t v, int64_t dim) {
  int64_t w = v < 0 ? v + dim : v;
  if (w < 0 || w >= dim) fail("index {} is out of range for a dim of size {}", v, dim);
  return w;
}

void check_gather_like(const TensorType& data, const TensorType& idx, int64_t axis, const char* op) {
  if (!is_int(idx.dtype)) fail("{}: indices must have an integer dtype, got {}", op, dtype_name(idx.dtype));
  if (idx.shape.size() != data.shape.size())
    fail("{}: indices rank {} differs from the data rank {}", op, idx.shape.size(), data.shape.size());
  const int64_t r = static_cast<int64_t>(data.shape.size());
  if (axis < 0 || axis >= r) fail("{}: axis {} is out of range for rank {}", op, axis, r);
  const Dims id = idx.dims(), dd = data.dims();
  for (int64_t d = 0; d < r; ++d)
    if (d != axis && !dim_le(id[d], dd[d]))
      fail("{}: indices dim {} has size {}, larger than the data's {}", op, d, id[d], dd[d]);
}

// Flat data offset for each element of `idx` (row-major), with idx's value replacing the axis coordinate.
std::vector<int64_t> gather_offsets(const Tensor& data, const Tensor& idx, int axis) {
  const std::vector<int64_t> ds = strides_of(data.shape());
  std::vector<int64_t> offs(static_cast<size_t>(idx.numel()));
  if (idx.numel() == 0) return offs;
  std::vector<int64_t> ii(idx.rank(), 0);
  for (int64_t i = 0; i < idx.numel(); ++i) {
    int64_t f = 0;
    for (int d = 0; d < idx.rank(); ++d)
      f += (d == axis ? resolve_index(idx.get_i(i), data.dim(d)) : ii[d]) * ds[d];
    offs[i] = f;
    next_index(ii, idx.shape());
  }
  return offs;
}

void register_movement_ops(OpRegistry& r) {
  {
    OpDef d;
    d.name = "broadcast_in_dim";
    d.fusion = FusionKind::injective;
    d.attrs = {{"shape", AttrKind::ints, true}, {"dims", AttrKind::ints, true}};
    d.infer = [](InferCtx& ctx) {
      need_static_all(ctx);
      const Dims out = ctx.node().attr_dims("shape");
      check_bcast(ctx.node(), ctx.in(0).dims(), out, ctx.node().attr_ints("dims"));
      ctx.set_out(0, TensorType::of(ctx.in(0).dtype, out));
    };
    d.kernel = [](KernelCtx& c) {
      const Tensor& x = c.in(0);
      const Shape out = c.node().attr_ints("shape");
      const std::vector<int64_t> dims = c.node().attr_ints("dims");
      check_bcast(c.node(), x.shape(), out, dims);
      const std::vector<int64_t> xs = strides_of(x.shape());
      std::vector<int64_t> src(out.size(), 0);  // input stride per output dim (0: broadcast)
      for (size_t i = 0; i < dims.size(); ++i)
        if (x.dim(static_cast<int>(i)) != 1) src[dims[i]] = xs[i];
      Tensor y(x.dtype(), out);
      const int es = dtype_size(x.dtype());
      if (y.numel() > 0) {
        std::vector<int64_t> oi(out.size(), 0);
        for (int64_t o = 0; o < y.numel(); ++o) {
          int64_t f = 0;
          for (size_t dd = 0; dd < out.size(); ++dd) f += oi[dd] * src[dd];
          copy_elem(y, o, x, f, es);
          next_index(oi, out);
        }
      }
      c.set_out(0, std::move(y));
    };
    add_core(r, std::move(d));
  }
  {
    OpDef d;
    d.name = "reshape";
    d.fusion = FusionKind::injective;
    d.attrs = {{"shape", AttrKind::ints, true}};
    d.infer = [](InferCtx& ctx) {
      need_static_all(ctx);
      const Dims out = ctx.node().attr_dims("shape");
      for (const Dim& s : out)
        if (!dim_le(0, s)) fail("reshape: shape {} has a negative dim (every dim is explicit here)", dims_str(out));
      const Dim n_in = dims_numel(ctx.in(0).dims()), n_out = dims_numel(out);
      if (n_in != n_out)
        fail("reshape: {} has {} elements but shape {} has {}", ctx.in(0).str(), n_in, dims_str(out), n_out);
      ctx.set_out(0, TensorType::of(ctx.in(0).dtype, out));
    };
    d.kernel = [](KernelCtx& c) {
      Shape out = c.node().attr_ints("shape");
      if (shape_numel(out) != c.in(0).numel()) fail("reshape: element counts differ");
      c.set_out(0, c.in(0).reshaped(out));
    };
    add_core(r, std::move(d));
  }
  {
    OpDef d;
    d.name = "transpose";
    d.fusion = FusionKind::injective;
    d.attrs = {{"perm", AttrKind::ints, true}};
    auto out_shape = []<class D>(const Node& n, const std::vector<D>& in) {
      std::vector<int64_t> perm = n.attr_ints("perm");
      if (perm.size() != in.size()) fail("perm has {} entries but the operand has rank {}", perm.size(), in.size());
      std::vector<bool> seen(in.size(), false);
      std::vector<D> out;
      for (int64_t p : perm) {
        if (p < 0 || p >= static_cast<int64_t>(in.size()) || seen[p])
          fail("perm is not a permutation of 0..{}", static_cast<int64_t>(in.size()) - 1);
        seen[p] = true;
        out.push_back(in[p]);
      }
      return out;
    };
    d.infer = [out_shape](InferCtx& ctx) {
      need_static_all(ctx);
      ctx.set_out(0, TensorType::of(ctx.in(0).dtype, out_shape(ctx.node(), ctx.in(0).dims())));
    };
    d.kernel = [out_shape](KernelCtx& c) {
      const Tensor& x = c.in(0);
      const Shape out = out_shape(c.node(), x.shape());
      const std::vector<int64_t> offs = permuted_offsets(x.shape(), c.node().attr_ints("perm"));
      Tensor y(x.dtype(), out);
      const int es = dtype_size(x.dtype());
      for (int64_t i = 0; i < y.numel(); ++i) copy_elem(y, i, x, offs[i], es);
      c.set_out(0, std::move(y));
    };
    add_core(r, std::move(d));
  }
  {
    OpDef d;
    d.name = "slice";
    d.fusion = FusionKind::injective;
    d.attrs = {{"starts", AttrKind::ints, true}, {"stops", AttrKind::ints, true}, {"strides", AttrKind::ints}};
    d.infer = [](InferCtx& ctx) {
      need_static_all(ctx);
      ctx.set_out(0, TensorType::of(ctx.in(0).dtype, slice_geom(ctx.node(), ctx.in(0).dims()).out));
    };
    d.kernel = [](KernelCtx& c) {
      const Tensor& x = c.in(0);
      const SliceGeom g = slice_geom(c.node(), x.shape());
      Tensor y(x.dtype(), g.out);
      const std::vector<int64_t> xs = strides_of(x.shape());
      const int es = dtype_size(x.dtype());
      if (y.numel() > 0) {
        std::vector<int64_t> oi(g.out.size(), 0);
        for (int64_t o = 0; o < y.numel(); ++o) {
          int64_t f = 0;
          for (size_t dd = 0; dd < oi.size(); ++dd) f += (g.starts[dd] + oi[dd] * g.strides[dd]) * xs[dd];
          copy_elem(y, o, x, f, es);
          next_index(oi, g.out);
        }
      }
      c.set_out(0, std::move(y));
    };
    add_core(r, std::move(d));
  }
  {
    OpDef d;
    d.name = "pad";
    d.min_inputs = d.max_inputs = 2;
    d.fusion = FusionKind::injective;
    d.attrs = {{"low", AttrKind::ints, true}, {"high", AttrKind::ints, true}, {"interior", AttrKind::ints}};
    d.infer = [](InferCtx& ctx) {
      need_static_all(ctx);
      const TensorType& v = ctx.in(1);
      if (!v.shape.empty()) fail("pad: the padding value must be a rank-0 tensor, got {}", v.str());
      if (v.dtype != ctx.in(0).dtype)
        fail("pad: padding value dtype {} differs from the operand's {}", dtype_name(v.dtype),
             dtype_name(ctx.in(0).dtype));
      ctx.set_out(0, TensorType::of(ctx.in(0).dtype, pad_geom(ctx.node(), ctx.in(0).dims()).out));
    };
    d.kernel = [](KernelCtx& c) {
      const Tensor& x = c.in(0);
      const Tensor& v = c.in(1);
      const PadGeom g = pad_geom(c.node(), x.shape());
      Tensor y(x.dtype(), g.out);
      const int es = dtype_size(x.dtype());
      for (int64_t i = 0; i < y.numel(); ++i) copy_elem(y, i, v, 0, es);
      const std::vector<int64_t> ys = strides_of(g.out);
      if (x.numel() > 0) {
        std::vector<int64_t> xi(x.rank(), 0);
        for (int64_t i = 0; i < x.numel(); ++i) {
          int64_t f = 0;
          bool inside = true;
          for (int dd = 0; dd < x.rank() && inside; ++dd) {
            const int64_t p = g.low[dd] + xi[dd] * (g.interior[dd] + 1);
            if (p < 0 || p >= g.out[dd]) inside = false;
            f += p * ys[dd];
          }
          if (inside) copy_elem(y, f, x, i, es);
          next_index(xi, x.shape());
        }
      }
      c.set_out(0, std::move(y));
    };
    add_core(r, std::move(d));
  }
  {
    OpDef d;
    d.name = "concatenate";
    d.min_inputs = 1;
    d.max_inputs = -1;
    d.fusion = FusionKind::injective;
    d.attrs = {{"axis", AttrKind::i, true}, {"layout", AttrKind::s}};
    d.infer = [](InferCtx& ctx) {
      need_static_all(ctx);
      const TensorType& a = ctx.in(0);
      const Dims ad = a.dims();
      check_layout(ctx, ad);
      const int64_t r = static_cast<int64_t>(a.shape.size());
      const int64_t axis = ctx.node().attr_i("axis");
      if (axis < 0 || axis >= r) fail("concatenate: axis {} is out of range for rank {}", axis, r);
      Dims out = ad;
      for (int i = 1; i < ctx.num_inputs(); ++i) {
        const TensorType& b = ctx.in(i);
        const Dims bd = b.dims();
        if (b.dtype != a.dtype)
          fail("concatenate: operand {} has dtype {}, operand 0 {}", i, dtype_name(b.dtype), dtype_name(a.dtype));
        if (bd.size() != ad.size())
          fail("concatenate: operand {} has rank {}, operand 0 {}", i, bd.size(), ad.size());
        for (int64_t dd = 0; dd < r; ++dd)
          if (dd != axis && bd[dd] != ad[dd])
            fail("concatenate: operand {} shape {} differs from {} outside axis {}", i, dims_str(bd), dims_str(ad), axis);
        out[axis] += bd[axis];
      }
      ctx.set_out(0, TensorType::of(a.dtype, out));
    };
    d.kernel = [](KernelCtx& c) {
      const int axis = static_cast<int>(c.node().attr_i("axis"));
      const Tensor& a = c.in(0);
      Shape out = a.shape();
      for (int i = 1; i < c.num_inputs(); ++i) out[axis] += c.in(i).dim(axis);
      Tensor y(a.dtype(), out);
      const int es = dtype_size(a.dtype());
      int64_t outer = 1, inner = 1;
      for (int dd = 0; dd < axis; ++dd) outer *= out[dd];
      for (int dd = axis + 1; dd < a.rank(); ++dd) inner *= out[dd];
      int64_t at = 0;
      for (int i = 0; i < c.num_inputs(); ++i) {
        const Tensor& t = c.in(i);
        const int64_t chunk = t.dim(axis) * inner;
        for (int64_t o = 0; o < outer && chunk > 0; ++o)
          std::memcpy(y.bytes() + (o * out[axis] * inner + at * inner) * es, t.bytes() + o * chunk * es,
                      static_cast<size_t>(chunk * es));
        at += t.dim(axis);
      }
      c.set_out(0, std::move(y));
    };
    add_core(r, std::move(d));
  }
  {
    OpDef d;
    d.name = "gather";
    d.min_inputs = d.max_inputs = 2;
    d.fusion = FusionKind::injective;
    d.attrs = {{"axis", AttrKind::i, true}};
    d.infer = [](InferCtx& ctx) {
      need_static_all(ctx);
      check_gather_like(ctx.in(0), ctx.in(1), ctx.node().attr_i("axis"), "gather");
      ctx.set_out(0, TensorType::of(ctx.in(0).dtype, ctx.in(1).dims()));
    };
    d.kernel = [](KernelCtx& c) {
      const Tensor& x = c.in(0);
      const Tensor& idx = c.in(1);
      const std::vector<int64_t> offs = gather_offsets(x, idx, static_cast<int>(c.node().attr_i("axis")));
      Tensor y(x.dtype(), idx.shape());
      const int es = dtype_size(x.dtype());
      for (int64_t i = 0; i < y.numel(); ++i) copy_elem(y, i, x, offs[i], es);
      c.set_out(0, std::move(y));
    };
    add_core(r, std::move(d));
  }
  {
    OpDef d;
    d.name = "scatter";
    d.min_inputs = d.max_inputs = 3;
    d.fusion = FusionKind::opaque;
    d.attrs = {{"axis", AttrKind::i, true}, {"reduction", AttrKind::s}};
    static const std::vector<std::string> reds = {"none", "add", "mul", "max", "min"};
    auto red_of = [](const Node& n) {
      std::string s = n.attr_s("reduction", "none");
      auto it = std::find(reds.begin(), reds.end(), s);
      if (it == reds.end()) fail("reduction '{}' is not one of none, add, mul, max, min", s);
      return static_cast<int>(it - reds.begin());
    };
    d.infer = [red_of](InferCtx& ctx) {
      need_static_all(ctx);
      red_of(ctx.node());
      check_gather_like(ctx.in(0), ctx.in(1), ctx.node().attr_i("axis"), "scatter");
      if (ctx.in(2).dims() != ctx.in(1).dims())
        fail("scatter: updates shape {} differs from the indices' {}", dims_str(ctx.in(2).dims()),
             dims_str(ctx.in(1).dims()));
      if (ctx.in(2).dtype != ctx.in(0).dtype)
        fail("scatter: updates dtype {} differs from the data's {}", dtype_name(ctx.in(2).dtype),
             dtype_name(ctx.in(0).dtype));
      ctx.set_out(0, ctx.in(0));
    };
    d.kernel = [red_of](KernelCtx& c) {
      const Tensor& x = c.in(0);
      const Tensor& idx = c.in(1);
      const Tensor& u = c.in(2);
      const int red = red_of(c.node());
      const std::vector<int64_t> offs = gather_offsets(x, idx, static_cast<int>(c.node().attr_i("axis")));
      Tensor y = x.clone();
      const int es = dtype_size(x.dtype());
      const bool fl = is_float(x.dtype());
      for (int64_t i = 0; i < u.numel(); ++i) {
        const int64_t o = offs[i];
        if (red == 0) {
          copy_elem(y, o, u, i, es);
        } else if (fl) {
          double a = y.get_f(o), b = u.get_f(i);
          y.set_f(o, red == 1 ? a + b : red == 2 ? a * b : bin_f(red == 3 ? Bin::max : Bin::min, a, b));
        } else {
          int64_t a = y.get_i(o), b = u.get_i(i);
          const Bin op = red == 1 ? Bin::add : red == 2 ? Bin::mul : red == 3 ? Bin::max : Bin::min;
          y.set_i(o, bin_i(op, x.dtype(), a, b));
        }
      }
      c.set_out(0, std::move(y));
    };
    add_core(r, std::move(d));
  }
  {
    OpDef d;
    d.name = "iota";
    d.min_inputs = d.max_inputs = 0;
    d.fusion = FusionKind::injective;
    d.attrs = {{"shape", AttrKind::ints, true}, {"axis", AttrKind::i, true}, {"dtype", AttrKind::s, true}};
    auto check = [](const Node& n) {
      Shape s = n.attr_ints("shape");
      for (int64_t v : s)
        if (v < 0) fail("iota: shape {} has a negative dim", shape_str(s));
      const int64_t axis = n.attr_i("axis");
      if (axis < 0 || axis >= static_cast<int64_t>(s.size()))
        fail("iota: axis {} is out of range for rank {}", axis, s.size());
      DType t = dtype_attr(n, "dtype");
      if (is_bool(t)) fail("iota is not defined for bool");
      return std::pair<Shape, DType>{s, t};
    };
    d.infer = [](InferCtx& ctx) {
      const Node& n = ctx.node();
      const Dims s = n.attr_dims("shape");
      for (const Dim& v : s)
        if (!dim_le(0, v)) fail("iota: shape {} has a negative dim", dims_str(s));
      const int64_t axis = n.attr_i("axis");
      if (axis < 0 || axis >= static_cast<int64_t>(s.size())) fail("iota: axis {} is out of range for rank {}", axis, s.size());
      const DType t = dtype_attr(n, "dtype");
      if (is_bool(t)) fail("iota is not defined for bool");
      ctx.set_out(0, TensorType::of(t, s));
    };
    d.kernel = [check](KernelCtx& c) {
      auto [s, t] = check(c.node());
      const int axis = static_cast<int>(c.node().attr_i("axis"));
      Tensor y(t, s);
      const std::vector<int64_t> st = strides_of(s);
      for (int64_t i = 0; i < y.numel(); ++i) {
        const int64_t v = (i / st[axis]) % s[axis];
        if (is_float(t))
          y.set_f(i, static_cast<double>(v));
        else
          y.set_i(i, v);
      }
      c.set_out(0, std::move(y));
    };
    add_core(r, std::move(d));
  }
}

// ---- sort --------------------------------------------------------------------------------------

void register_sort(OpRegistry& r) {
  OpDef d;
  d.name = "sort";
  d.min_outputs = 1;
  d.max_outputs = 2;
  d.fusion = FusionKind::opaque;
  d.attrs = {{"axis", AttrKind::i, true}, {"descending", AttrKind::i}};
  auto check = [](const Node& n, const Shape& s) {
    const int64_t axis = n.attr_i("axis");
    if (axis < 0 || axis >= static_cast<int64_t>(s.size()))
      fail("sort: axis {} is out of range for rank {}", axis, s.size());
    const int64_t desc = n.attr_i("descending", 0);
    if (desc != 0 && desc != 1) fail("descending must be 0 or 1, got {}", desc);
    return std::pair<int, bool>{static_cast<int>(axis), desc == 1};
  };
  d.infer = [check](InferCtx& ctx) {
    need_static_all(ctx);
    check(ctx.node(), ctx.in(0).shape);
    ctx.set_out(0, ctx.in(0));
    ctx.set_out(1, TensorType::of(DType::i64, ctx.in(0).dims()));
  };
  d.kernel = [check](KernelCtx& c) {
    const Tensor& x = c.in(0);
    auto [axis, desc] = check(c.node(), x.shape());
    Tensor y(x.dtype(), x.shape());
    Tensor ix(DType::i64, x.shape());
    const int64_t len = x.dim(axis);
    int64_t inner = 1;
    for (int dd = axis + 1; dd < x.rank(); ++dd) inner *= x.dim(dd);
    const int64_t outer = len > 0 && inner > 0 ? x.numel() / (len * inner) : 0;
    const bool fl = is_float(x.dtype());
    const int es = dtype_size(x.dtype());
    std::vector<int64_t> perm(static_cast<size_t>(len));
    std::vector<double> kf(fl ? len : 0);
    std::vector<int64_t> ki(fl ? 0 : len);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        const int64_t base = o * len * inner + in;
        for (int64_t k = 0; k < len; ++k) {
          if (fl)
            kf[k] = x.get_f(base + k * inner);
          else
            ki[k] = x.get_i(base + k * inner);
        }
        std::iota(perm.begin(), perm.end(), 0);
        // "a before b" in ascending order, NaN the largest; descending swaps the operands, and
        // stable_sort keeps equal keys in input order either way.
        auto less = [&](int64_t a, int64_t b) {
          if (fl) {
            const double va = kf[a], vb = kf[b];
            if (std::isnan(va)) return false;
            if (std::isnan(vb)) return true;
            return va < vb;
          }
          return int_less(x.dtype(), ki[a], ki[b]);
        };
        // desc is copied: clang 14 cannot capture a structured binding.
        std::stable_sort(perm.begin(), perm.end(),
                         [&, desc = desc](int64_t a, int64_t b) { return desc ? less(b, a) : less(a, b); });
        for (int64_t k = 0; k < len; ++k) {
          copy_elem(y, base + k * inner, x, base + perm[k] * inner, es);
          ix.set_i(base + k * inner, perm[k]);
        }
      }
    c.set_out(0, std::move(y));
    c.set_out(1, std::move(ix));
  };
  add_core(r, std::move(d));
}

}  // namespace

void register_core_ops(OpRegistry& r) {
  register_elementwise(r);
  register_casts(r);
  register_reductions(r);
  register_contractions(r);
  register_movement_ops(r);
  register_sort(r);
}

}  // namespace tessel
