// The op registry and the helpers that op families share.
#include "tessel/ir/op_registry.h"

#include "tessel/support/limits.h"

#include <mutex>

#include "tessel/support/error.h"

namespace tessel {

std::string_view attr_kind_name(AttrKind k) {
  static constexpr std::string_view names[] = {"int", "float", "string", "ints", "floats", "strings", "tensor", "dims"};
  return names[static_cast<int>(k)];
}

std::string_view fusion_kind_name(FusionKind k) {
  static constexpr std::string_view names[] = {"pointwise", "reduction", "injective", "matmul", "opaque"};
  return names[static_cast<int>(k)];
}

InferCtx::InferCtx(const Node& node, const std::vector<const Tensor*>& known, const std::vector<const SymTensor*>* sym)
    : node_(node), known_(known), sym_(sym), out_sym_(node.outputs.size()), outs_(node.outputs.size()),
      set_(node.outputs.size(), false), out_values_(node.outputs.size()) {}

std::optional<SymTensor> InferCtx::sym_value(int i) const {
  if (!has_in(i)) return std::nullopt;
  if (sym_ && i < static_cast<int>(sym_->size()) && (*sym_)[static_cast<size_t>(i)]) return *(*sym_)[static_cast<size_t>(i)];
  const Tensor* t = value(i);
  if (!t || !is_int(t->dtype()) || t->numel() > (1 << 16)) return std::nullopt;
  SymTensor s{t->dtype(), t->shape(), {}};
  for (int64_t k = 0; k < t->numel(); ++k) s.elems.push_back(t->get_i(k));
  return s;
}

void InferCtx::set_out_sym_value(int i, SymTensor t) {
  if (i >= num_outputs()) return;
  if (static_cast<int64_t>(t.elems.size()) != shape_numel(t.shape)) fail("a symbolic value of shape {} has {} elements", shape_str(t.shape), t.elems.size());
  if (t.all_static()) {
    Tensor v(t.dtype, t.shape);
    for (size_t k = 0; k < t.elems.size(); ++k) v.set_i(static_cast<int64_t>(k), t.elems[k].constant_term());
    set_out_value(i, std::move(v));
    return;
  }
  set_out(i, TensorType{t.dtype, t.shape});
  out_sym_[static_cast<size_t>(i)] = std::move(t);
}

const TensorType& InferCtx::in(int i) const {
  if (!has_in(i)) fail("input {} is required", i);
  return node_.inputs[i]->type;
}

const Tensor* InferCtx::value(int i) const {
  if (!has_in(i) || i >= static_cast<int>(known_.size())) return nullptr;
  if (!known_[i] && resolve_) return resolve_(i);
  return known_[i];
}

void InferCtx::set_out(int i, TensorType t) {
  if (i >= num_outputs()) return;  // optional output not requested
  if (t.shape.size() > kMaxRank) fail("output {} would have rank {}, over tessel's limit of {}", i, t.shape.size(), kMaxRank);
  outs_[i] = std::move(t);
  set_[i] = true;
}

void InferCtx::set_out_value(int i, Tensor t) {
  if (i >= num_outputs()) return;
  set_out(i, TensorType{t.dtype(), t.shape()});
  out_values_[i] = std::move(t);
}

KernelCtx::KernelCtx(const Node& node, std::vector<const Tensor*> inputs)
    : node_(node), inputs_(std::move(inputs)), outs_(node.outputs.size()) {}

const Tensor& KernelCtx::in(int i) const {
  if (!has_in(i)) fail("input {} is required", i);
  return *inputs_[i];
}

void KernelCtx::set_out(int i, Tensor t) {
  if (i >= num_outputs()) return;
  outs_[i] = std::move(t);
}

OpRegistry& OpRegistry::get() {
  static OpRegistry* reg = [] {
    auto* r = new OpRegistry;
    register_elementwise_ops(*r);
    register_activation_ops(*r);
    register_reduction_ops(*r);
    register_normalization_ops(*r);
    register_matmul_ops(*r);
    register_conv_pool_ops(*r);
    register_attention_ops(*r);
    register_shape_ops(*r);
    register_index_ops(*r);
    register_quantize_ops(*r);
    register_misc_ops(*r);
    register_core_ops(*r);
    register_kernel_ops(*r);
    register_ml_ops(*r);
    register_collective_ops(*r);
    return r;
  }();
  return *reg;
}

void OpRegistry::add(OpDef def) {
  if (ops_.count(def.name)) fail("op '{}' is registered twice", def.name);
  if (!def.infer || !def.kernel) fail("op '{}' needs an infer rule and a reference kernel", def.name);
  if (def.domain == "tessel.core") {
    def.core = core_op_named(def.name);
    if (!def.core) fail("core op '{}' is not a row of the core-op table (ir/core_ops.def)", def.name);
  }
  std::string name = def.name;
  const std::optional<CoreOp> core = def.core;
  auto it = ops_.emplace(std::move(name), std::move(def)).first;
  if (core) by_core_[static_cast<size_t>(*core)] = &it->second;
}

const OpDef* OpRegistry::find(const std::string& name) const {
  auto it = ops_.find(name);
  return it == ops_.end() ? nullptr : &it->second;
}

std::vector<const OpDef*> OpRegistry::all() const {
  std::vector<const OpDef*> out;
  for (const auto& [_, d] : ops_) out.push_back(&d);
  return out;
}

Cost op_cost(const Node& node) {
  if (node.op->cost) return node.op->cost(node);
  Cost c;
  for (const Value* v : node.inputs)
    if (v && shape_known(v->type.shape)) c.bytes += shape_numel(v->type.shape) * dtype_size(v->type.dtype);
  for (const Value* v : node.outputs)
    if (v && shape_known(v->type.shape)) {
      c.bytes += shape_numel(v->type.shape) * dtype_size(v->type.dtype);
      c.flops += shape_numel(v->type.shape);
    }
  return c;
}

OpDef make_op(std::string name, int since, int min_inputs, int max_inputs, std::vector<AttrSpec> attrs,
              InferFn infer, KernelFn kernel, FusionKind fusion) {
  OpDef d;
  d.name = std::move(name);
  d.since = since;
  d.min_inputs = min_inputs;
  d.max_inputs = max_inputs;
  d.attrs = std::move(attrs);
  d.infer = std::move(infer);
  d.kernel = std::move(kernel);
  d.fusion = fusion;
  return d;
}

CostFn cost_per_input_element(double per_elem) {
  return [per_elem](const Node& n) {
    Cost c;
    for (const Value* v : n.inputs)
      if (v && shape_known(v->type.shape)) c.bytes += shape_numel(v->type.shape) * dtype_size(v->type.dtype);
    for (const Value* v : n.outputs)
      if (v && shape_known(v->type.shape)) c.bytes += shape_numel(v->type.shape) * dtype_size(v->type.dtype);
    const Value* x = n.inputs.empty() ? nullptr : n.inputs[0];
    if (x && shape_known(x->type.shape)) c.flops = per_elem * static_cast<double>(shape_numel(x->type.shape));
    return c;
  };
}

void infer_same_as_input(InferCtx& ctx, int input) { ctx.set_out(0, ctx.in(input)); }

void infer_broadcast(InferCtx& ctx, std::optional<DType> out_dtype) {
  Dims s = ctx.in(0).dims();
  for (int i = 1; i < ctx.num_inputs(); ++i)
    if (ctx.has_in(i)) s = broadcast_dims(s, ctx.in(i).dims());
  ctx.set_out(0, TensorType::of(out_dtype.value_or(ctx.in(0).dtype), s));
}

std::optional<std::vector<int64_t>> known_ints(const InferCtx& ctx, int input) {
  const Tensor* t = ctx.value(input);
  if (!t) return std::nullopt;
  return t->to_i64();
}

Tensor map_unary(const Tensor& x, const UnaryF& f, const UnaryI& fi, std::optional<DType> out) {
  DType od = out.value_or(x.dtype());
  Tensor y(od, x.shape());
  const int64_t n = x.numel();
  if (!is_float(x.dtype()) && fi) {
    for (int64_t i = 0; i < n; ++i) y.set_i(i, fi(x.get_i(i)));
  } else if (x.dtype() == DType::f32 && od == DType::f32) {
    const float* xp = x.data<float>();
    float* yp = y.data<float>();
    for (int64_t i = 0; i < n; ++i) yp[i] = static_cast<float>(f(xp[i]));
  } else {
    if (!is_float(x.dtype()) && !f) fail("op is not defined for {}", dtype_name(x.dtype()));
    for (int64_t i = 0; i < n; ++i) y.set_f(i, f(x.get_f(i)));
  }
  return y;
}

Tensor map_binary(const Tensor& a, const Tensor& b, const BinaryF& f, const BinaryI& fi,
                  std::optional<DType> out) {
  Shape s = broadcast_shapes(a.shape(), b.shape());
  DType od = out.value_or(a.dtype());
  Tensor y(od, s);
  const int64_t n = y.numel();
  const bool same = a.shape() == s && b.shape() == s;
  std::vector<int64_t> ia, ib;
  if (!same) {
    ia = broadcast_index(a.shape(), s);
    ib = broadcast_index(b.shape(), s);
  }
  auto A = [&](int64_t i) { return same ? i : ia[i]; };
  auto B = [&](int64_t i) { return same ? i : ib[i]; };
  if (!is_float(a.dtype()) && fi) {
    for (int64_t i = 0; i < n; ++i) y.set_i(i, fi(a.get_i(A(i)), b.get_i(B(i))));
  } else if (a.dtype() == DType::f32 && b.dtype() == DType::f32 && od == DType::f32) {
    const float* ap = a.data<float>();
    const float* bp = b.data<float>();
    float* yp = y.data<float>();
    for (int64_t i = 0; i < n; ++i) yp[i] = static_cast<float>(f(ap[A(i)], bp[B(i)]));
  } else {
    if (!f) fail("op is not defined for {}", dtype_name(a.dtype()));
    for (int64_t i = 0; i < n; ++i) y.set_f(i, f(a.get_f(A(i)), b.get_f(B(i))));
  }
  return y;
}

}  // namespace tessel
