// Op family: normalization (LayerNorm, RMSNorm, Instance/Batch/Group norm, Lp, MVN, LRN).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "tessel/ir/op_registry.h"
#include "tessel/ops/decompose_util.h"
#include "tessel/ops/sym_util.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

void check_float(const TensorType& t, const char* what) {
  if (!is_float(t.dtype)) fail("{} must be float, got {}", what, dtype_name(t.dtype));
}

// The ONNX dtype code of `stash_type` as a tessel dtype.
DType stash_dtype(int64_t code) {
  switch (code) {
    case 1:
      return DType::f32;
    case 10:
      return DType::f16;
    case 11:
      return DType::f64;
    case 16:
      return DType::bf16;
    default:
      fail("stash_type {} is not a float type", code);
  }
}

// Values of `t` broadcast to `shape` (unidirectionally), as doubles.
std::vector<double> broadcast_to(const Tensor& t, const Shape& shape, const char* what) {
  Shape b;
  try {
    b = broadcast_shapes(t.shape(), shape);
  } catch (const Error&) {
    fail("{} of shape {} does not broadcast to {}", what, shape_str(t.shape()), shape_str(shape));
  }
  if (b != shape)
    fail("{} of shape {} does not broadcast to {}", what, shape_str(t.shape()), shape_str(shape));
  const std::vector<double> v = t.to_f64();
  if (t.shape() == shape) return v;
  const std::vector<int64_t> idx = broadcast_index(t.shape(), shape);
  std::vector<double> out(idx.size());
  for (size_t i = 0; i < idx.size(); ++i) out[i] = v[idx[i]];
  return out;
}

// A LayerNorm-style parameter broadcast to X. When it only varies along the normalized dims
// (the common case) it comes back with one entry per row position (`inner` values) so that no
// full-size copy is made; `per_row` tells which form was returned.
std::vector<double> row_param(const Tensor& t, const Shape& xs, int axis, int64_t inner,
                              const char* what, bool& per_row) {
  Shape ts = t.shape();
  while (!ts.empty() && ts.front() == 1) ts.erase(ts.begin());
  Shape tail(xs.begin() + axis, xs.end());
  while (!tail.empty() && tail.front() == 1) tail.erase(tail.begin());
  per_row = ts == tail && t.numel() == inner && t.rank() <= static_cast<int>(xs.size());
  if (per_row) return t.to_f64();
  return broadcast_to(t, xs, what);
}

// Per-channel parameter of a [N, C, ...] op: must be 1-D with C entries.
std::vector<double> per_channel(const Tensor& t, int64_t c, const char* what) {
  if (t.rank() != 1 || t.dim(0) != c)
    fail("{} must have shape [{}], got {}", what, c, shape_str(t.shape()));
  return t.to_f64();
}

void check_per_channel(const InferCtx& ctx, int i, const Dim& c, const char* what) {
  const Dims s = ctx.in(i).dims();
  auto message = [&] { return fmt::format("{} must have shape [{}], got {}", what, c.str(), dims_str(s)); };
  if (s.size() != 1) fail("{}", message());
  if (!(s[0] == c)) merge_equal_dims(c, s[0], message());
}


// ---- decomposition helpers -------------------------------------------------------------------

// Statistics run in f32 (f64 when the input or stash type is f64) and round once at the end.
DType compute_dtype(DType x, DType stash = DType::f32) {
  return x == DType::f64 || stash == DType::f64 ? DType::f64 : DType::f32;
}

// Mean over `axes` (keepdims), x minus it, and the mean of its square (the biased variance).
// Without centering (RMS) the mean is absent and the "variance" is the mean square of x.
struct Moments {
  Value* mean = nullptr;
  Value* diff = nullptr;
  Value* var = nullptr;
};

Moments moments(CoreBuilder& b, Value* x, const std::vector<int64_t>& axes, bool center = true) {
  Value* cnt = element_count(b, x, axes, x->type.dtype, true);
  Moments m;
  if (center) m.mean = b.div(b.reduce(x, "sum", axes, true), cnt);
  m.diff = center ? b.sub(x, m.mean) : x;
  m.var = b.div(b.reduce(b.mul(m.diff, m.diff), "sum", axes, true), cnt);
  return m;
}

// 1 / sqrt(var + eps), the reference kernels' order.
Value* inv_std(CoreBuilder& b, Value* var, double eps) {
  const DType t = var->type.dtype;
  // Sequenced, not nested: argument evaluation order is unspecified, and the constants' names (and
  // the documented core form, docs/ir/core.md) must not depend on the compiler.
  Value* root = b.emit(CoreOp::sqrt, {b.add(var, b.scalar(t, eps))});
  return b.div(b.scalar(t, 1.0), root);
}

// A per-channel [C] parameter as [C, 1, ...] for an [N, C, ...] input of rank r, in dtype t.
Value* per_channel_view(CoreBuilder& b, Value* p, size_t r, DType t) {
  Shape s(r - 1, 1);
  s[0] = p->type.shape[0];
  return b.reshape(b.convert(p, t), s);
}

// GroupNormalization on [N, C, ...] (InstanceNormalization: groups == C).
Value* group_norm_core(CoreBuilder& b, const Node& n, int64_t groups) {
  Value* x = n.inputs[0];
  const Dims xs = x->type.dims();
  const DType ct = compute_dtype(x->type.dtype);
  const Dim block = *exact_div(dims_numel(xs), xs[0] * groups);  // the rule checked groups divide C
  Value* v = b.reshape(b.convert(x, ct), {xs[0], groups, block});
  Moments m = moments(b, v, {2});
  Value* y = b.reshape(b.mul(m.diff, inv_std(b, m.var, n.attr_f("epsilon", 1e-5))), xs);
  y = b.mul(y, per_channel_view(b, n.inputs[1], xs.size(), ct));
  y = b.add(y, per_channel_view(b, n.inputs[2], xs.size(), ct));
  return b.convert(y, x->type.dtype);
}

// ---- LayerNormalization / RMSNormalization ---------------------------------------------------

// Normalizes each row of X flattened to [prod(dims[:axis]), prod(dims[axis:])].
OpDef last_axes_norm(std::string name, int since, bool rms) {
  OpDef d;
  d.name = std::move(name);
  d.min_inputs = 2;
  d.max_inputs = rms ? 2 : 3;
  d.max_outputs = rms ? 1 : 3;
  d.since = since;
  d.attrs = {{"axis", AttrKind::i}, {"epsilon", AttrKind::f}, {"stash_type", AttrKind::i}};
  d.cost = cost_per_input_element(rms ? 5 : 7);  // statistics passes, then normalize, scale, shift
  d.infer = [](InferCtx& ctx) {
    const TensorType& x = ctx.in(0);
    check_float(x, "X");
    int r = static_cast<int>(x.shape.size());
    int axis = normalize_axis(ctx.node().attr_i("axis", -1), r);
    ctx.set_out(0, x);
    Dims s = x.dims();
    // Symbolic sizes: the scale and bias must broadcast to X for every value of the symbols (the
    // decomposition multiplies them in; the reference kernel checks static shapes as it runs).
    for (int i = 1; i < std::min(ctx.num_inputs(), 3); ++i)
      if (ctx.has_in(i) && (x.symbolic() || ctx.in(i).symbolic()) && !(broadcast_dims(s, ctx.in(i).dims()) == s))
        unsupported("{} {} does not broadcast to X {}", i == 1 ? "Scale" : "B", ctx.in(i).str(), x.str());
    for (int i = axis; i < r; ++i) s[i] = 1;
    DType st = stash_dtype(ctx.node().attr_i("stash_type", 1));
    for (int i = 1; i < ctx.num_outputs(); ++i) ctx.set_out(i, TensorType::of(st, s));
  };
  d.kernel = [rms](KernelCtx& c) {
    const Tensor& x = c.in(0);
    int r = x.rank();
    int axis = normalize_axis(c.node().attr_i("axis", -1), r);
    const double eps = c.node().attr_f("epsilon", 1e-5);
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < axis; ++i) outer *= x.dim(i);
    for (int i = axis; i < r; ++i) inner *= x.dim(i);
    const std::vector<double> v = x.to_f64();
    bool sc_row = false, b_row = false;
    const std::vector<double> sc = row_param(c.in(1), x.shape(), axis, inner, "Scale", sc_row);
    std::vector<double> bias;
    if (c.has_in(2)) bias = row_param(c.in(2), x.shape(), axis, inner, "B", b_row);
    std::vector<double> y(v.size()), mean(outer), inv(outer);
    for (int64_t o = 0; o < outer; ++o) {
      const double* row = v.data() + o * inner;
      double m = 0;
      if (!rms) {
        for (int64_t j = 0; j < inner; ++j) m += row[j];
        m /= static_cast<double>(inner);
      }
      double var = 0;
      for (int64_t j = 0; j < inner; ++j) var += (row[j] - m) * (row[j] - m);
      var /= static_cast<double>(inner);
      const double is = 1.0 / std::sqrt(var + eps);
      mean[o] = m;
      inv[o] = is;
      for (int64_t j = 0; j < inner; ++j) {
        int64_t p = o * inner + j;
        // (no B: nothing added -- + 0.0 would turn a -0 into +0, and 1 / y from -inf into +inf)
        y[p] = (row[j] - m) * is * sc[sc_row ? j : p];
        if (!bias.empty()) y[p] += bias[b_row ? j : p];
      }
    }
    c.set_out(0, Tensor::from_f64(x.dtype(), x.shape(), y));
    Shape s = x.shape();
    for (int i = axis; i < r; ++i) s[i] = 1;
    DType st = stash_dtype(c.node().attr_i("stash_type", 1));
    if (c.wants_out(1)) c.set_out(1, Tensor::from_f64(st, s, mean));
    if (c.wants_out(2)) c.set_out(2, Tensor::from_f64(st, s, inv));
  };
  d.decompose = [rms](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    Value* x = n.inputs[0];
    const int r = static_cast<int>(x->type.shape.size());
    const int axis = normalize_axis(n.attr_i("axis", -1), r);
    const DType st = stash_dtype(n.attr_i("stash_type", 1));
    const DType ct = compute_dtype(x->type.dtype, st);
    std::vector<int64_t> axes(r - axis);
    std::iota(axes.begin(), axes.end(), axis);
    Moments m = moments(b, b.convert(x, ct), axes, !rms);
    Value* is = inv_std(b, m.var, n.attr_f("epsilon", 1e-5));
    Value* y = b.mul(b.mul(m.diff, is), b.convert(n.inputs[1], ct));
    if (n.has_input(2)) y = b.add(y, b.convert(n.inputs[2], ct));
    std::vector<Value*> out = {b.convert(y, x->type.dtype)};
    if (n.outputs.size() > 1) out.push_back(n.outputs[1] ? b.convert(m.mean, st) : nullptr);
    if (n.outputs.size() > 2) out.push_back(n.outputs[2] ? b.convert(is, st) : nullptr);
    return out;
  };
  return d;
}

// ---- InstanceNormalization / GroupNormalization ----------------------------------------------

// Normalizes X [N, C, ...] over groups of `C / groups` channels and all spatial positions, then
// applies a per-channel scale and bias.
Tensor group_norm(const Tensor& x, int64_t groups, const std::vector<double>& sc,
                  const std::vector<double>& bias, double eps) {
  const int64_t n = x.dim(0), ch = x.dim(1);
  if (groups <= 0 || ch % groups != 0) fail("{} channels do not split into {} groups", ch, groups);
  int64_t spatial = 1;
  for (int i = 2; i < x.rank(); ++i) spatial *= x.dim(i);
  const int64_t cpg = ch / groups, block = cpg * spatial;
  const std::vector<double> v = x.to_f64();
  std::vector<double> y(v.size());
  for (int64_t b = 0; b < n; ++b)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t base = (b * groups + g) * block;
      double m = 0, var = 0;
      for (int64_t j = 0; j < block; ++j) m += v[base + j];
      m /= static_cast<double>(block);
      for (int64_t j = 0; j < block; ++j) var += (v[base + j] - m) * (v[base + j] - m);
      var /= static_cast<double>(block);
      const double is = 1.0 / std::sqrt(var + eps);
      for (int64_t j = 0; j < block; ++j) {
        const int64_t k = g * cpg + j / spatial;
        y[base + j] = (v[base + j] - m) * is * sc[k] + bias[k];
      }
    }
  return Tensor::from_f64(x.dtype(), x.shape(), y);
}

// X is [N, C, ...]: N and the spatial dims may be symbolic, the channel count may not.
void infer_nc(InferCtx& ctx) {
  const TensorType& x = ctx.in(0);
  check_float(x, "X");
  if (x.shape.size() < 2) fail("X must have rank >= 2 ([N, C, ...]), got {}", shape_str(x.shape));
  if (x.dims()[1].is_symbolic())
    unsupported("{} over a symbolic channel count {}", ctx.node().op_name(), x.dims()[1].str());
}

OpDef instance_norm() {
  OpDef d;
  d.name = "InstanceNormalization";
  d.cost = cost_per_input_element(7);
  d.min_inputs = d.max_inputs = 3;
  d.since = 6;
  d.attrs = {{"epsilon", AttrKind::f}, {"consumed_inputs", AttrKind::ints}};
  // Opset 1 differs only by the legacy consumed_inputs attribute.
  d.upgrade = [](Graph&, Node& n, int) { n.attrs.erase("consumed_inputs"); };
  d.infer = [](InferCtx& ctx) {
    infer_nc(ctx);
    if (ctx.node().has_attr("consumed_inputs"))
      fail("consumed_inputs is not an attribute at opset >= 6");
    check_per_channel(ctx, 1, ctx.in(0).shape[1], "scale");
    check_per_channel(ctx, 2, ctx.in(0).shape[1], "B");
    ctx.set_out(0, ctx.in(0));
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    const int64_t ch = x.dim(1);
    c.set_out(0, group_norm(x, ch, per_channel(c.in(1), ch, "scale"), per_channel(c.in(2), ch, "B"),
                            c.node().attr_f("epsilon", 1e-5)));
  };
  d.decompose = [](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    return {group_norm_core(b, n, n.inputs[0]->type.shape[1])};
  };
  return d;
}

// GroupNormalization-18 takes scale and bias per group; 21 takes them per channel. The channel
// count must be static to rewrite: either it equals num_groups (the forms agree), or scale and
// bias are constants that can be repeated per channel.
void upgrade_group_norm_18(Graph& g, Node& n, int) {
  if (!n.has_input(0) || !n.has_input(1) || !n.has_input(2)) fail("needs 3 inputs");
  const Value* x = n.inputs[0];
  const int64_t groups = n.attr_i("num_groups");
  const Shape& xs = x->type.shape;
  if (x->producer || xs.size() < 2 || xs[1] < 0)
    unsupported("GroupNormalization-18 needs a statically known channel count");
  const int64_t ch = xs[1];
  if (ch == groups) return;
  if (groups <= 0 || ch % groups != 0) fail("{} channels do not split into {} groups", ch, groups);
  for (int i = 1; i <= 2; ++i) {
    const Value* v = n.inputs[i];
    if (!v->constant)
      unsupported("GroupNormalization-18 with a non-constant per-group scale or bias");
    const Tensor& t = *v->constant;
    if (t.rank() != 1 || t.dim(0) != groups)
      fail("input {} must have shape [{}], got {}", i, groups, shape_str(t.shape()));
    const std::vector<double> per_group = t.to_f64();
    std::vector<double> per_chan(ch);
    for (int64_t c = 0; c < ch; ++c) per_chan[c] = per_group[c / (ch / groups)];
    n.inputs[i] = g.add_constant(g.unique_name(v->name + "_per_channel"),
                                 Tensor::from_f64(t.dtype(), {ch}, per_chan));
  }
}

OpDef group_norm_op() {
  OpDef d;
  d.name = "GroupNormalization";
  d.cost = cost_per_input_element(7);
  d.min_inputs = d.max_inputs = 3;
  d.since = 21;
  d.attrs = {
      {"epsilon", AttrKind::f}, {"num_groups", AttrKind::i, true}, {"stash_type", AttrKind::i}};
  d.upgrade = upgrade_group_norm_18;
  d.infer = [](InferCtx& ctx) {
    infer_nc(ctx);
    const Node& n = ctx.node();
    stash_dtype(n.attr_i("stash_type", 1));
    int64_t g = n.attr_i("num_groups");
    int64_t ch = ctx.in(0).shape[1];
    if (g <= 0 || (ch >= 0 && ch % g != 0)) fail("{} channels do not split into {} groups", ch, g);
    check_per_channel(ctx, 1, ch, "scale");
    check_per_channel(ctx, 2, ch, "bias");
    ctx.set_out(0, ctx.in(0));
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    const Node& n = c.node();
    const int64_t ch = x.dim(1);
    c.set_out(0, group_norm(x, n.attr_i("num_groups"), per_channel(c.in(1), ch, "scale"),
                            per_channel(c.in(2), ch, "bias"), n.attr_f("epsilon", 1e-5)));
  };
  d.decompose = [](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    return {group_norm_core(b, n, n.attr_i("num_groups"))};
  };
  return d;
}

// ---- BatchNormalization ----------------------------------------------------------------------

OpDef batch_norm() {
  OpDef d;
  d.name = "BatchNormalization";
  d.cost = cost_per_input_element(7);
  d.min_inputs = d.max_inputs = 5;
  d.max_outputs = 5;  // opsets < 14 list 5 outputs in training mode
  d.since = 14;
  d.attrs = {{"epsilon", AttrKind::f},       {"momentum", AttrKind::f},
             {"training_mode", AttrKind::i}, {"spatial", AttrKind::i},
             {"is_test", AttrKind::i},       {"consumed_inputs", AttrKind::ints}};
  d.upgrade = [](Graph&, Node& n, int opset) {
    // Before 14, extra outputs meant training mode with a different output list; in inference
    // mode opsets 1..13 agree with 14 (spatial=1 is per-channel statistics, the only form here).
    // Before 7, is_test (default 0: training, batch statistics) selected the mode.
    if (opset < 7 && n.attr_i("is_test", 0) != 1)
      unsupported("training-mode BatchNormalization (is_test=0) before opset 7");
    if (n.outputs.size() > 1) unsupported("training-mode BatchNormalization before opset 14");
    if (n.attr_i("spatial", 1) != 1) unsupported("BatchNormalization with spatial=0");
    n.attrs.erase("spatial");
    n.attrs.erase("is_test");
    n.attrs.erase("consumed_inputs");
  };
  d.infer = [](InferCtx& ctx) {
    infer_nc(ctx);
    for (const char* a : {"spatial", "is_test", "consumed_inputs"})
      if (ctx.node().has_attr(a)) fail("{} is not an attribute at opset >= 9", a);
    if (ctx.num_outputs() > 3) fail("has at most 3 outputs at opset >= 14");
    int64_t ch = ctx.in(0).shape[1];
    const char* names[] = {"", "scale", "B", "input_mean", "input_var"};
    for (int i = 1; i < 5; ++i) check_per_channel(ctx, i, ch, names[i]);
    bool train = ctx.node().attr_i("training_mode", 0) != 0;
    if (!train && ctx.num_outputs() > 1)
      fail("running_mean/running_var outputs need training_mode=1");
    ctx.set_out(0, ctx.in(0));
    for (int i = 1; i < ctx.num_outputs(); ++i) ctx.set_out(i, ctx.in(i + 2));
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    const Node& n = c.node();
    const int64_t nb = x.dim(0), ch = x.dim(1);
    int64_t spatial = 1;
    for (int i = 2; i < x.rank(); ++i) spatial *= x.dim(i);
    const double eps = n.attr_f("epsilon", 1e-5);
    const double mom = n.attr_f("momentum", 0.9);
    const bool train = n.attr_i("training_mode", 0) != 0;
    const std::vector<double> sc = per_channel(c.in(1), ch, "scale");
    const std::vector<double> b = per_channel(c.in(2), ch, "B");
    std::vector<double> mean = per_channel(c.in(3), ch, "input_mean");
    std::vector<double> var = per_channel(c.in(4), ch, "input_var");
    const std::vector<double> v = x.to_f64();
    std::vector<double> run_mean = mean, run_var = var;
    if (train) {
      const double cnt = static_cast<double>(nb * spatial);
      for (int64_t k = 0; k < ch; ++k) {
        double m = 0, s = 0;
        for (int64_t i = 0; i < nb; ++i)
          for (int64_t j = 0; j < spatial; ++j) m += v[(i * ch + k) * spatial + j];
        m /= cnt;
        for (int64_t i = 0; i < nb; ++i)
          for (int64_t j = 0; j < spatial; ++j) {
            double t = v[(i * ch + k) * spatial + j] - m;
            s += t * t;
          }
        s /= cnt;
        run_mean[k] = mean[k] * mom + m * (1 - mom);
        run_var[k] = var[k] * mom + s * (1 - mom);
        mean[k] = m;
        var[k] = s;
      }
    }
    std::vector<double> y(v.size());
    for (int64_t i = 0; i < nb; ++i)
      for (int64_t k = 0; k < ch; ++k) {
        const double is = 1.0 / std::sqrt(var[k] + eps);
        for (int64_t j = 0; j < spatial; ++j) {
          int64_t p = (i * ch + k) * spatial + j;
          y[p] = (v[p] - mean[k]) * is * sc[k] + b[k];
        }
      }
    c.set_out(0, Tensor::from_f64(x.dtype(), x.shape(), y));
    if (c.wants_out(1)) c.set_out(1, Tensor::from_f64(c.in(3).dtype(), c.in(3).shape(), run_mean));
    if (c.wants_out(2)) c.set_out(2, Tensor::from_f64(c.in(4).dtype(), c.in(4).shape(), run_var));
  };
  // Inference: the given statistics; training: the batch's (over N and the spatial dims), with the
  // running statistics blended by momentum as extra outputs.
  d.decompose = [](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    Value* x = n.inputs[0];
    const size_t r = x->type.shape.size();
    const DType ct = compute_dtype(x->type.dtype);
    Value* v = b.convert(x, ct);
    Value* mean = per_channel_view(b, n.inputs[3], r, ct);
    Value* var = per_channel_view(b, n.inputs[4], r, ct);
    std::vector<Value*> out(n.outputs.size(), nullptr);
    if (n.attr_i("training_mode", 0) != 0) {
      std::vector<int64_t> axes = {0};
      for (size_t i = 2; i < r; ++i) axes.push_back(static_cast<int64_t>(i));
      Moments m = moments(b, v, axes);
      const double mom = n.attr_f("momentum", 0.9);
      for (int i = 1; i < static_cast<int>(out.size()); ++i) {
        if (!n.outputs[i]) continue;
        Value* given = b.convert(n.inputs[i + 2], ct);
        Value* batch = b.reshape(i == 1 ? m.mean : m.var, given->type.dims());
        Value* blend = b.add(b.mul(given, b.scalar(ct, mom)), b.mul(batch, b.scalar(ct, 1 - mom)));
        out[i] = b.convert(blend, n.outputs[i]->type.dtype);
      }
      mean = m.mean;
      var = m.var;
    }
    Value* y = b.mul(b.sub(v, mean), inv_std(b, var, n.attr_f("epsilon", 1e-5)));
    y = b.add(b.mul(y, per_channel_view(b, n.inputs[1], r, ct)), per_channel_view(b, n.inputs[2], r, ct));
    out[0] = b.convert(y, x->type.dtype);
    return out;
  };
  return d;
}

// ---- LpNormalization, MeanVarianceNormalization, LRN -----------------------------------------

OpDef lp_norm() {
  OpDef d;
  d.name = "LpNormalization";
  d.cost = cost_per_input_element(3);
  d.since = 1;
  d.attrs = {{"axis", AttrKind::i}, {"p", AttrKind::i}};
  d.infer = [](InferCtx& ctx) {
    check_float(ctx.in(0), "input");
    if (ctx.in(0).shape.empty()) fail("LpNormalization needs an input of rank >= 1, got a scalar");
    normalize_axis(ctx.node().attr_i("axis", -1), static_cast<int>(ctx.in(0).shape.size()));
    int64_t p = ctx.node().attr_i("p", 2);
    if (p != 1 && p != 2) fail("p must be 1 or 2, got {}", p);
    ctx.set_out(0, ctx.in(0));
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    if (x.rank() == 0) fail("LpNormalization needs an input of rank >= 1, got a scalar");
    int axis = normalize_axis(c.node().attr_i("axis", -1), x.rank());
    const bool l1 = c.node().attr_i("p", 2) == 1;
    int64_t outer = 1, len = x.dim(axis), inner = 1;
    for (int i = 0; i < axis; ++i) outer *= x.dim(i);
    for (int i = axis + 1; i < x.rank(); ++i) inner *= x.dim(i);
    const std::vector<double> v = x.to_f64();
    std::vector<double> y(v.size());
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        const int64_t base = o * len * inner + in;
        double s = 0;
        for (int64_t j = 0; j < len; ++j) {
          double a = v[base + j * inner];
          s += l1 ? std::fabs(a) : a * a;
        }
        const double norm = l1 ? s : std::sqrt(s);
        // An all-zero slice stays zero (the reference output) rather than 0/0.
        for (int64_t j = 0; j < len; ++j)
          y[base + j * inner] = norm == 0 ? 0.0 : v[base + j * inner] / norm;
      }
    c.set_out(0, Tensor::from_f64(x.dtype(), x.shape(), y));
  };
  d.decompose = [](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    Value* x = n.inputs[0];
    const DType ct = compute_dtype(x->type.dtype);
    const int axis = normalize_axis(n.attr_i("axis", -1), static_cast<int>(x->type.shape.size()));
    Value* v = b.convert(x, ct);
    Value* norm = n.attr_i("p", 2) == 1 ? b.reduce(b.max(v, b.emit(CoreOp::neg, {v})), "sum", {axis}, true)
                                        : b.emit(CoreOp::sqrt, {b.reduce(b.mul(v, v), "sum", {axis}, true)});
    Value* zero = b.scalar(ct, 0.0);
    Value* y = b.select(b.compare("eq", norm, zero), zero, b.div(v, norm));
    return {b.convert(y, x->type.dtype)};
  };
  return d;
}

OpDef mvn() {
  OpDef d;
  d.name = "MeanVarianceNormalization";
  d.cost = cost_per_input_element(7);
  d.since = 9;
  d.attrs = {{"axes", AttrKind::ints}};
  d.infer = [](InferCtx& ctx) {
    check_float(ctx.in(0), "X");
    int r = static_cast<int>(ctx.in(0).shape.size());
    for (int64_t a : ctx.node().attr_ints("axes", {0, 2, 3})) normalize_axis(a, r);
    ctx.set_out(0, ctx.in(0));
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    const int r = x.rank();
    std::vector<bool> mask(r, false);
    for (int64_t a : c.node().attr_ints("axes", {0, 2, 3})) mask[normalize_axis(a, r)] = true;
    // Map each element to its statistics slot (the reduced dims collapsed).
    Shape ks = x.shape();
    for (int i = 0; i < r; ++i)
      if (mask[i]) ks[i] = 1;
    const int64_t slots = shape_numel(ks);
    const std::vector<int64_t> slot = broadcast_index(ks, x.shape());
    const std::vector<double> v = x.to_f64();
    std::vector<double> m(slots, 0), var(slots, 0), cnt(slots, 0), y(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      m[slot[i]] += v[i];
      cnt[slot[i]] += 1;
    }
    for (int64_t s = 0; s < slots; ++s) m[s] /= cnt[s];
    for (size_t i = 0; i < v.size(); ++i) var[slot[i]] += (v[i] - m[slot[i]]) * (v[i] - m[slot[i]]);
    for (int64_t s = 0; s < slots; ++s)
      var[s] = std::sqrt(var[s] / cnt[s]) + 1e-9;  // ONNX's epsilon
    for (size_t i = 0; i < v.size(); ++i) y[i] = (v[i] - m[slot[i]]) / var[slot[i]];
    c.set_out(0, Tensor::from_f64(x.dtype(), x.shape(), y));
  };
  d.decompose = [](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    Value* x = n.inputs[0];
    const int r = static_cast<int>(x->type.shape.size());
    const DType ct = compute_dtype(x->type.dtype);
    std::vector<int64_t> axes;
    for (int64_t a : n.attr_ints("axes", {0, 2, 3})) axes.push_back(normalize_axis(a, r));
    std::sort(axes.begin(), axes.end());
    Moments m = moments(b, b.convert(x, ct), axes);
    Value* sd = b.add(b.emit(CoreOp::sqrt, {m.var}), b.scalar(ct, 1e-9));
    return {b.convert(b.div(m.diff, sd), x->type.dtype)};
  };
  return d;
}

OpDef lrn() {
  OpDef d;
  d.name = "LRN";
  d.since = 1;
  d.attrs = {{"alpha", AttrKind::f},
             {"beta", AttrKind::f},
             {"bias", AttrKind::f},
             {"size", AttrKind::i, true}};
  d.infer = [](InferCtx& ctx) {
    infer_nc(ctx);
    if (ctx.node().attr_i("size") <= 0) fail("size must be positive");
    ctx.set_out(0, ctx.in(0));
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    const Node& n = c.node();
    const double alpha = n.attr_f("alpha", 1e-4), beta = n.attr_f("beta", 0.75),
                 bias = n.attr_f("bias", 1.0);
    const int64_t size = n.attr_i("size");
    const int64_t lo = (size - 1) / 2, hi = size - 1 - lo;  // floor and ceil of (size-1)/2
    const int64_t nb = x.dim(0), ch = x.dim(1);
    int64_t spatial = 1;
    for (int i = 2; i < x.rank(); ++i) spatial *= x.dim(i);
    const std::vector<double> v = x.to_f64();
    std::vector<double> y(v.size());
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t k = 0; k < ch; ++k)
        for (int64_t j = 0; j < spatial; ++j) {
          double s = 0;
          for (int64_t i = std::max<int64_t>(0, k - lo); i <= std::min(ch - 1, k + hi); ++i) {
            double a = v[(b * ch + i) * spatial + j];
            s += a * a;
          }
          int64_t p = (b * ch + k) * spatial + j;
          y[p] = v[p] / std::pow(bias + alpha / static_cast<double>(size) * s, beta);
        }
    c.set_out(0, Tensor::from_f64(x.dtype(), x.shape(), y));
  };
  // The channel-window sum of squares is a reduce_window over dim 1.
  d.decompose = [](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    Value* x = n.inputs[0];
    const size_t r = x->type.shape.size();
    const DType ct = compute_dtype(x->type.dtype);
    const int64_t size = n.attr_i("size");
    Value* v = b.convert(x, ct);
    std::vector<int64_t> window(r, 1), padding(2 * r, 0);
    window[1] = size;
    padding[2] = (size - 1) / 2;
    padding[3] = size - 1 - padding[2];
    Value* s = b.emit(CoreOp::reduce_window, {b.mul(v, v)},
                      {{"kind", std::string("sum")}, {"window", window}, {"padding", padding}});
    const double alpha = n.attr_f("alpha", 1e-4), beta = n.attr_f("beta", 0.75), bias = n.attr_f("bias", 1.0);
    Value* base = b.add(b.mul(s, b.scalar(ct, alpha / static_cast<double>(size))), b.scalar(ct, bias));
    Value* y = b.div(v, b.binary(CoreOp::pow, base, b.scalar(ct, beta)));
    return {b.convert(y, x->type.dtype)};
  };
  return d;
}

}  // namespace

void register_normalization_ops(OpRegistry& r) {
  // These take symbolic sizes (docs/dynamic-shapes.md); the rest refuse them.
  r.add(symbolic_op(last_axes_norm("LayerNormalization", 17, false)));
  r.add(symbolic_op(last_axes_norm("RMSNormalization", 23, true)));
  r.add(symbolic_op(instance_norm()));
  r.add(symbolic_op(batch_norm()));
  r.add(symbolic_op(group_norm_op()));
  r.add(lp_norm());
  r.add(mvn());
  r.add(lrn());
}

}  // namespace tessel
