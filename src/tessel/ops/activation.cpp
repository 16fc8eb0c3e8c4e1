// Op family: activation functions (Relu, Sigmoid, Gelu, ...), pointwise over one input.
#include <algorithm>
#include <cmath>
#include <functional>

#include "tessel/ir/op_registry.h"
#include "tessel/ops/decompose_util.h"
#include "tessel/ops/sym_util.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

// Builds the element function from the node's attributes (read once per kernel call).
using MakeFn = std::function<UnaryF(const Node&)>;

double sigmoid(double x) {
  // Written so that exp never overflows.
  if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
  double e = std::exp(x);
  return e / (1.0 + e);
}

double softplus(double x) {
  return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}

// With `fi`, the op is also defined for signed integers and computes them exactly.
OpDef activation(std::string name, int since, std::vector<AttrSpec> attrs, MakeFn make,
                 UnaryI fi = nullptr) {
  OpDef d;
  d.name = std::move(name);
  d.since = since;
  d.attrs = std::move(attrs);
  d.fusion = FusionKind::pointwise;
  const bool ints_ok = static_cast<bool>(fi);
  d.infer = [ints_ok, make](InferCtx& ctx) {
    DType t = ctx.in(0).dtype;
    if (!is_float(t) && !(ints_ok && is_signed_int(t)))
      fail("{} is not defined for dtype {}", ctx.node().op_name(), dtype_name(t));
    make(ctx.node());  // rejects bad attribute values before anything runs
    infer_same_as_input(ctx);
  };
  d.kernel = [make, fi](KernelCtx& c) { c.set_out(0, map_unary(c.in(0), make(c.node()), fi)); };
  return d;
}

// An activation without attributes.
OpDef plain(std::string name, int since, double (*f)(double), UnaryI fi = nullptr) {
  UnaryF fn = f;
  return activation(
      std::move(name), since, {}, [fn](const Node&) { return fn; }, std::move(fi));
}

Tensor prelu_kernel(const Tensor& x, const Tensor& slope) {
  if (is_unsigned_int(x.dtype())) return x;  // never negative (and get_i would misread u64)
  Tensor y(x.dtype(), x.shape());
  const int64_t n = x.numel();
  std::vector<int64_t> idx;
  const bool same = slope.shape() == x.shape();
  if (!same) idx = broadcast_index(slope.shape(), x.shape());
  auto at = [&](int64_t i) { return same ? i : idx[i]; };
  if (x.dtype() == DType::f32) {
    const float* xp = x.data<float>();
    const float* sp = slope.data<float>();
    float* yp = y.data<float>();
    for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] < 0 ? xp[i] * sp[at(i)] : xp[i];
  } else if (is_float(x.dtype())) {
    for (int64_t i = 0; i < n; ++i) {
      double v = x.get_f(i);
      y.set_f(i, v < 0 ? v * slope.get_f(at(i)) : v);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      int64_t v = x.get_i(i);
      y.set_i(i, v < 0 ? static_cast<int64_t>(static_cast<uint64_t>(v) *
                                              static_cast<uint64_t>(slope.get_i(at(i))))
                       : v);
    }
  }
  return y;
}

// Ops whose opset-1 form carried `consumed_inputs`, an in-place hint that never changed results.
constexpr std::string_view kConsumedInputsOps[] = {"Relu", "Tanh", "Sigmoid",     "LeakyRelu",
                                                   "Elu",  "Selu", "HardSigmoid", "PRelu"};

// Registers `d`, with the upgrade from its opset-1 form where it has one. Every activation takes
// symbolic sizes (docs/dynamic-shapes.md): the result has the input's dims.
void add(OpRegistry& r, OpDef d) {
  d.symbolic = true;
  if (std::find(std::begin(kConsumedInputsOps), std::end(kConsumedInputsOps), d.name) !=
      std::end(kConsumedInputsOps)) {
    d.attrs.push_back({"consumed_inputs", AttrKind::ints});
    // After the op's own upgrade, if it has one (PRelu's slope rule).
    d.upgrade = [then = std::move(d.upgrade)](Graph& g, Node& n, int opset) {
      n.attrs.erase("consumed_inputs");
      if (then) then(g, n, opset);
    };
    d.infer = [inner = std::move(d.infer)](InferCtx& ctx) {
      if (ctx.node().has_attr("consumed_inputs"))
        fail("attribute 'consumed_inputs' only exists before opset 6");
      inner(ctx);
    };
  }
  r.add(std::move(d));
}

// Clamp to [0, 1] keeping NaN (ONNX's reference clips with np.clip, which propagates it; std::max and
// std::min return their first operand when either is NaN, which dropped it).
double clamp01_nan(double x) { return std::isnan(x) ? x : std::max(0.0, std::min(1.0, x)); }

// ---- decomposition into core ops ---------------------------------------------------------------

// Activation math runs in f32 for the narrow floats (f16, bf16, f8) and in f64 for integer Shrink,
// then is rounded to the storage type once, as the reference kernels (which compute in double) do.
DType compute_type(DType t) { return !is_float(t) ? DType::f64 : dtype_bits(t) < 32 ? DType::f32 : t; }


// A rank-0 constant of `like`'s dtype (the binary sugar broadcasts it).
Value* k(CoreBuilder& b, Value* like, double v) { return b.scalar(like->type.dtype, v); }
// exp(x) - 1 loses every digit for small |x| (exp(x) rounds to 1 first: Selu(-3e-5) was off by 1e-3
// relative, found by the random-graph tester); tanh(x/2) * (exp(x) + 1) is the same function with no
// cancellation, and gives -1 at -inf, inf at inf and -0 at -0 as expm1 does.
Value* expm1_of(CoreBuilder& b, Value* x) {
  return b.mul(b.unary(CoreOp::tanh, b.mul(x, k(b, x, 0.5))), b.add(b.unary(CoreOp::exp, x), k(b, x, 1)));
}
Value* clamp01(CoreBuilder& b, Value* x) { return b.max(k(b, x, 0), b.min(x, k(b, x, 1))); }

// One division: 1 / (1 + e) for x >= 0, e · that for x < 0 (e = exp(-|x|) <= 1, so no overflow; e · r
// is within 1.5 ulp of e / (1 + e)). Two divisions were a fifth of a SiLU epilogue's vector work.
Value* sigmoid_of(CoreBuilder& b, Value* x) {
  Value* e = b.unary(CoreOp::exp, b.unary(CoreOp::neg, abs_of(b, x)));
  Value* r = b.div(k(b, x, 1), b.add(k(b, x, 1), e));
  return b.select(b.compare("ge", x, k(b, x, 0)), r, b.mul(e, r));
}

// max(x, 0) + log(1 + exp(-|x|)): no overflow for large |x|.
// log(1 + u) for u >= 0 keeping u's low bits where 1 + u rounds them away: log(w) · u / (w − 1) with
// w = 1 + u (Goldberg's log1p), and u itself where w rounds to 1. log(1 + u) alone was 4e-4 off at
// Softplus(-10) and 0 for Softplus(-100) (fuzz seed 9000917).
Value* log1p_of(CoreBuilder& b, Value* u) {
  Value* one = k(b, u, 1);
  Value* w = b.add(one, u);
  Value* exact = b.div(b.mul(b.unary(CoreOp::log, w), u), b.sub(w, one));  // (w = 1: not selected)
  return b.select(b.compare("eq", w, one), u, exact);
}

Value* softplus_of(CoreBuilder& b, Value* x) {
  Value* e = b.unary(CoreOp::exp, b.unary(CoreOp::neg, abs_of(b, x)));
  return b.add(b.max(x, k(b, x, 0)), log1p_of(b, e));
}

// An activation of one input: `f` computes on x in compute_type; the result is stored back once.
using ActMath = std::function<Value*(CoreBuilder&, const Node&, Value*)>;
DecomposeFn act_core(ActMath f) {
  return [f](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    const DType t = n.inputs[0]->type.dtype;
    return {store_as(b, f(b, n, b.convert(n.inputs[0], compute_type(t))), t)};
  };
}

// Gelu: x (1 + erf(x / √2)) / 2, or with approximate = "tanh" x (1 + tanh(√(2/π) (x + 0.044715 x³))) / 2.
Value* gelu_of(CoreBuilder& b, const Node& n, Value* x) {
  Value* inner;
  if (n.attr_s("approximate", "none") == "tanh") {
    Value* cubic = b.add(x, b.mul(k(b, x, 0.044715), b.mul(x, b.mul(x, x))));
    inner = b.unary(CoreOp::tanh, b.mul(k(b, x, std::sqrt(2.0 / M_PI)), cubic));
  } else {
    inner = b.unary(CoreOp::erf, b.div(x, k(b, x, std::sqrt(2.0))));
  }
  return b.mul(b.mul(k(b, x, 0.5), x), b.add(k(b, x, 1), inner));
}

// SwiGLU: A sigmoid(alpha A) B, A and B of one shape.
std::vector<Value*> decompose_swiglu(CoreBuilder& b, const Node& n) {
  const DType t = n.outputs[0]->type.dtype, ct = compute_type(t);
  Value* a = b.convert(n.inputs[0], ct);
  Value* gate = b.mul(a, sigmoid_of(b, b.mul(k(b, a, n.attr_f("alpha", 1.0)), a)));
  return {store_as(b, b.mul(gate, b.convert(n.inputs[1], ct)), t)};
}

// PRelu: x < 0 ? x * slope : x, the slope broadcast to x (integers multiply wrapping, in their type).
std::vector<Value*> decompose_prelu(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  if (is_unsigned_int(x->type.dtype)) return {x};
  Value* slope = b.broadcast_to(n.inputs[1], x->type.dims());
  return {b.select(b.compare("lt", x, k(b, x, 0)), b.mul(x, slope), x)};
}

// PRelu before opset 7 did not broadcast: the slope has X's shape or one element, shared by every
// element. Numpy broadcasting (opset 7) would give another answer for some slopes (a [C] slope with
// an [N, C, H, W] X lines up with W, where an old model may have meant the channels), so any other
// slope is an error, not a silent change of meaning. The check needs both shapes before inference:
// known for graph inputs and constants, else the node is refused.
void upgrade_prelu_slope(Graph& g, Node& n) {
  if (n.inputs.size() < 2 || !n.inputs[0] || !n.inputs[1]) return;
  Value* x = n.inputs[0];
  Value* slope = n.inputs[1];
  auto typed = [](const Value* v) { return v->is_input || v->constant.has_value(); };
  if (!typed(slope))
    unsupported("PRelu before opset 7 needs its slope to be a graph input or a constant (its shape decides "
                "whether the old non-broadcasting rule holds, and is not known before inference)");
  const Shape& ss = slope->type.shape;
  bool one = true;
  for (int64_t d : ss) one = one && d == 1;
  if (one) {
    // One shared value: as a rank-0 slope it broadcasts to X whatever X's rank.
    if (slope->constant) n.inputs[1] = g.add_constant(g.unique_name(slope->name + "_scalar"), slope->constant->reshaped({}));
    return;
  }
  if (!typed(x))
    unsupported("PRelu before opset 7 with a slope of {} elements needs X to be a graph input or a constant "
                "(the slope must have X's shape, which is not known before inference)", shape_str(ss));
  if (ss != x->type.shape)
    fail("PRelu before opset 7 does not broadcast: slope {} must have X's shape {} or one element",
         shape_str(ss), shape_str(x->type.shape));
}

}  // namespace

void register_activation_ops(OpRegistry& r) {
  using A = AttrSpec;
  const auto F = AttrKind::f;
  // Relu as core ops: max(x, 0) with the zero broadcast.
  auto relu_core = [](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    Value* x = n.inputs[0];
    return {b.emit(CoreOp::max, {x, b.broadcast_to(b.scalar(x->type.dtype, 0.0), x->type.dims())})};
  };
  add(r, with_decomposition(plain(
                                "Relu", 6, [](double x) { return x > 0 ? x : (std::isnan(x) ? x : 0.0); },
                                [](int64_t x) -> int64_t { return x > 0 ? x : 0; }),
                            relu_core));
  add(r, with_decomposition(plain("Tanh", 6, [](double x) { return std::tanh(x); }), decompose_as(CoreOp::tanh)));
  add(r, with_decomposition(plain("Sigmoid", 6, sigmoid),
                            act_core([](CoreBuilder& b, const Node&, Value* x) { return sigmoid_of(b, x); })));
  add(r, with_decomposition(plain("Softplus", 1, softplus),
                            act_core([](CoreBuilder& b, const Node&, Value* x) { return softplus_of(b, x); })));
  add(r, with_decomposition(plain("Softsign", 1, [](double x) { return x / (1.0 + std::fabs(x)); }),
                            act_core([](CoreBuilder& b, const Node&, Value* x) {
                              return b.div(x, b.add(k(b, x, 1), abs_of(b, x)));
                            })));
  add(r, with_decomposition(plain("HardSwish", 14,
                                  [](double x) { return x * clamp01_nan(x / 6.0 + 0.5); }),
                            act_core([](CoreBuilder& b, const Node&, Value* x) {
                              return b.mul(x, clamp01(b, b.add(b.div(x, k(b, x, 6)), k(b, x, 0.5))));
                            })));
  add(r, with_decomposition(plain("Mish", 18, [](double x) { return x * std::tanh(softplus(x)); }),
                            act_core([](CoreBuilder& b, const Node&, Value* x) {
                              return b.mul(x, b.unary(CoreOp::tanh, softplus_of(b, x)));
                            })));
  add(r, with_decomposition(activation("LeakyRelu", 6, {A{"alpha", F}}, [](const Node& n) -> UnaryF {
        double a = n.attr_f("alpha", 0.01);
        return [a](double x) { return x < 0 ? a * x : x; };
      }), act_core([](CoreBuilder& b, const Node& n, Value* x) {
        return b.select(b.compare("lt", x, k(b, x, 0)), b.mul(k(b, x, n.attr_f("alpha", 0.01)), x), x);
      })));
  add(r, with_decomposition(activation("Elu", 6, {A{"alpha", F}}, [](const Node& n) -> UnaryF {
        double a = n.attr_f("alpha", 1.0);
        return [a](double x) { return x < 0 ? a * std::expm1(x) : x; };
      }), act_core([](CoreBuilder& b, const Node& n, Value* x) {
        return b.select(b.compare("lt", x, k(b, x, 0)), b.mul(k(b, x, n.attr_f("alpha", 1.0)), expm1_of(b, x)), x);
      })));
  add(r, with_decomposition(activation("Selu", 6, {A{"alpha", F}, A{"gamma", F}}, [](const Node& n) -> UnaryF {
        double a = n.attr_f("alpha", 1.67326319217681884765625);
        double g = n.attr_f("gamma", 1.05070102214813232421875);
        return [a, g](double x) { return x > 0 ? g * x : g * a * std::expm1(x); };
      }), act_core([](CoreBuilder& b, const Node& n, Value* x) {
        const double a = n.attr_f("alpha", 1.67326319217681884765625);
        const double g = n.attr_f("gamma", 1.05070102214813232421875);
        return b.select(b.compare("gt", x, k(b, x, 0)), b.mul(k(b, x, g), x), b.mul(k(b, x, g * a), expm1_of(b, x)));
      })));
  add(r, with_decomposition(activation("Celu", 12, {A{"alpha", F}}, [](const Node& n) -> UnaryF {
        double a = n.attr_f("alpha", 1.0);
        if (a == 0) fail("Celu alpha must be non-zero");
        return [a](double x) { return std::isnan(x) ? x : std::max(0.0, x) + std::min(0.0, a * std::expm1(x / a)); };
      }), act_core([](CoreBuilder& b, const Node& n, Value* x) {
        Value* a = k(b, x, n.attr_f("alpha", 1.0));
        Value* neg_part = b.min(k(b, x, 0), b.mul(a, expm1_of(b, b.div(x, a))));
        return b.add(b.max(k(b, x, 0), x), neg_part);
      })));
  add(r, with_decomposition(activation("HardSigmoid", 6, {A{"alpha", F}, A{"beta", F}}, [](const Node& n) -> UnaryF {
        double a = n.attr_f("alpha", 0.2), b = n.attr_f("beta", 0.5);
        return [a, b](double x) { return clamp01_nan(a * x + b); };
      }), act_core([](CoreBuilder& b, const Node& n, Value* x) {
        return clamp01(b, b.add(b.mul(k(b, x, n.attr_f("alpha", 0.2)), x), k(b, x, n.attr_f("beta", 0.5))));
      })));
  add(r, with_decomposition(activation("ThresholdedRelu", 10, {A{"alpha", F}}, [](const Node& n) -> UnaryF {
        double a = n.attr_f("alpha", 1.0);
        return [a](double x) { return x > a ? x : 0.0; };
      }), act_core([](CoreBuilder& b, const Node& n, Value* x) {
        return b.select(b.compare("gt", x, k(b, x, n.attr_f("alpha", 1.0))), x, k(b, x, 0));
      })));
  add(r, with_decomposition(activation("Swish", 24, {A{"alpha", F}}, [](const Node& n) -> UnaryF {
        double a = n.attr_f("alpha", 1.0);
        return [a](double x) { return x * sigmoid(a * x); };
      }), act_core([](CoreBuilder& b, const Node& n, Value* x) {
        return b.mul(x, sigmoid_of(b, b.mul(k(b, x, n.attr_f("alpha", 1.0)), x)));
      })));
  {
    // SwiGLU (opset 28): Y = Swish_alpha(A) * B = A * sigmoid(alpha * A) * B, with A and B of one
    // shape (no broadcasting).
    OpDef d;
    d.name = "SwiGLU";
    d.since = 28;
    d.min_inputs = d.max_inputs = 2;
    d.attrs = {A{"alpha", F}};
    d.fusion = FusionKind::pointwise;
    d.infer = [](InferCtx& ctx) {
      const TensorType& a = ctx.in(0);
      const TensorType& b = ctx.in(1);
      if (!is_float(a.dtype)) fail("SwiGLU is not defined for dtype {}", dtype_name(a.dtype));
      if (b.dtype != a.dtype)
        fail("A and B have different dtypes {} and {}", dtype_name(a.dtype), dtype_name(b.dtype));
      const std::string what = fmt::format("A {} and B {} must have the same shape (SwiGLU does not broadcast)",
                                           dims_str(a.dims()), dims_str(b.dims()));
      if (a.shape.size() != b.shape.size()) fail("{}", what);
      Dims s = a.dims();
      const Dims bd = b.dims();
      for (size_t i = 0; i < s.size(); ++i) s[i] = merge_equal_dims(s[i], bd[i], what);
      ctx.set_out(0, TensorType::of(a.dtype, s));
    };
    d.kernel = [](KernelCtx& c) {
      const Tensor& a = c.in(0);
      const Tensor& b = c.in(1);
      if (a.shape() != b.shape())
        fail("A {} and B {} must have the same shape (SwiGLU does not broadcast)",
             shape_str(a.shape()), shape_str(b.shape()));
      const double alpha = c.node().attr_f("alpha", 1.0);
      Tensor y(a.dtype(), a.shape());
      for (int64_t i = 0; i < a.numel(); ++i) {
        const double x = a.get_f(i);
        y.set_f(i, x * sigmoid(alpha * x) * b.get_f(i));
      }
      c.set_out(0, std::move(y));
    };
    d.decompose = decompose_swiglu;
    add(r, std::move(d));
  }
  {
    OpDef d = activation("Gelu", 20, {A{"approximate", AttrKind::s}}, [](const Node& n) -> UnaryF {
      std::string mode = n.attr_s("approximate", "none");
      if (mode == "tanh") {
        const double k = std::sqrt(2.0 / M_PI);
        return
            [k](double x) { return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x))); };
      }
      if (mode != "none") fail("Gelu approximate must be 'none' or 'tanh', got '{}'", mode);
      return [](double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); };
    });
    d.decompose = act_core(gelu_of);
    add(r, std::move(d));
  }
  {
    // Shrink is defined for every numeric type; integers go through double (exact below 2^53).
    OpDef d = activation("Shrink", 9, {A{"bias", F}, A{"lambd", F}}, [](const Node& n) -> UnaryF {
      double b = n.attr_f("bias", 0.0), l = n.attr_f("lambd", 0.5);
      return [b, l](double x) { return x < -l ? x + b : x > l ? x - b : 0.0; };
    });
    d.infer = [](InferCtx& ctx) {
      DType t = ctx.in(0).dtype;
      if (!is_float(t) && !is_int(t)) fail("Shrink is not defined for dtype {}", dtype_name(t));
      infer_same_as_input(ctx);
    };
    d.kernel = [](KernelCtx& c) {
      const Node& n = c.node();
      const double b = n.attr_f("bias", 0.0), l = n.attr_f("lambd", 0.5);
      const Tensor& x = c.in(0);
      Tensor y(x.dtype(), x.shape());
      for (int64_t i = 0; i < x.numel(); ++i) {
        double v = x.get_f(i);
        y.set_f(i, v < -l ? v + b : v > l ? v - b : 0.0);
      }
      c.set_out(0, std::move(y));
    };
    d.decompose = act_core([](CoreBuilder& b, const Node& n, Value* x) {
      const double bias = n.attr_f("bias", 0.0), l = n.attr_f("lambd", 0.5);
      Value* mid = b.select(b.compare("gt", x, k(b, x, l)), b.sub(x, k(b, x, bias)), k(b, x, 0));
      return b.select(b.compare("lt", x, k(b, x, -l)), b.add(x, k(b, x, bias)), mid);
    });
    add(r, std::move(d));
  }
  {
    OpDef d;
    d.name = "PRelu";
    d.since = 7;
    d.min_inputs = d.max_inputs = 2;
    d.fusion = FusionKind::pointwise;
    d.infer = [](InferCtx& ctx) {
      DType t = ctx.in(0).dtype;
      if (!is_float(t) && !is_int(t)) fail("PRelu is not defined for dtype {}", dtype_name(t));
      if (ctx.in(1).dtype != t)
        fail("X and slope have different dtypes {} and {}", dtype_name(t),
             dtype_name(ctx.in(1).dtype));
      // The slope broadcasts to X (unidirectionally): the result keeps X's shape.
      const Dims x = ctx.in(0).dims();
      const Dims s = broadcast_dims(x, ctx.in(1).dims());
      if (s.size() != x.size())
        fail("slope {} has a higher rank than X {}", dims_str(ctx.in(1).dims()), dims_str(x));
      for (size_t i = 0; i < s.size(); ++i)
        if (!dim_unknown(x[i]) && !dim_unknown(s[i]))
          merge_equal_dims(x[i], s[i], fmt::format("slope {} does not broadcast to X {}", dims_str(ctx.in(1).dims()), dims_str(x)));
      infer_same_as_input(ctx);
    };
    d.kernel = [](KernelCtx& c) {
      Shape s = broadcast_shapes(c.in(0).shape(), c.in(1).shape());
      if (s != c.in(0).shape())
        fail("slope {} does not broadcast to X {}", shape_str(c.in(1).shape()),
             shape_str(c.in(0).shape()));
      c.set_out(0, prelu_kernel(c.in(0), c.in(1)));
    };
    d.decompose = decompose_prelu;
    d.upgrade = [](Graph& g, Node& n, int) { upgrade_prelu_slope(g, n); };
    add(r, std::move(d));
  }
}

}  // namespace tessel
