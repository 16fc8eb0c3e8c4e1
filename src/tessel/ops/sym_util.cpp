// Shared pieces of the graph-level ops' rules for symbolic sizes (docs/dynamic-shapes.md).
#include "tessel/ops/sym_util.h"

#include <algorithm>

#include "tessel/support/error.h"

namespace tessel {

Dim numel_or_unknown(const Dims& d) { return dims_unknown(d) ? Dim(kUnknownDim) : dims_numel(d); }

Dim merge_equal_dims(const Dim& a, const Dim& b, const std::string& what) {
  if (dim_unknown(a)) return b;
  if (dim_unknown(b) || a == b) return a;
  if (a.is_symbolic() || b.is_symbolic())
    unsupported("{}: {} and {} must be equal, which the symbols do not decide", what, a.str(), b.str());
  fail("{}", what);
}

std::pair<int64_t, int64_t> shape_range(const Node& n, int64_t r) {
  int64_t s = n.attr_i("start", 0), e = n.attr_i("end", r);
  if (s < 0) s += r;
  if (e < 0) e += r;
  s = std::clamp<int64_t>(s, 0, r);
  e = std::clamp<int64_t>(e, 0, r);
  return {s, std::max(s, e)};
}

std::optional<Dims> listed_dims(const Value* v) {
  const Node* p = v ? v->producer : nullptr;
  if (!p || !p->op || p->op->name != "Shape" || !p->op->domain.empty() || !p->has_input(0)) return std::nullopt;
  const Dims in = p->inputs[0]->type.dims();
  const auto [s, e] = shape_range(*p, static_cast<int64_t>(in.size()));
  return Dims(in.begin() + s, in.begin() + e);
}

namespace {

// Input i's value as sizes: an integer value (static or symbolic), or a small known bool tensor as
// 0 and 1 (a Where's condition).
std::optional<SymTensor> operand_value(const InferCtx& c, int i) {
  if (auto s = c.sym_value(i)) return s;
  const Tensor* t = c.value(i);
  if (!t || !is_bool(t->dtype()) || t->numel() > (1 << 16)) return std::nullopt;
  SymTensor s{t->dtype(), t->shape(), {}};
  for (int64_t k = 0; k < t->numel(); ++k) s.elems.push_back(t->get_i(k));
  return s;
}

}  // namespace

std::optional<std::vector<SymTensor>> symbolic_operands(const InferCtx& c, const std::vector<int>& ins) {
  std::vector<SymTensor> ops;
  bool symbolic = false;
  for (int i : ins) {
    auto v = operand_value(c, i);
    if (!v) return std::nullopt;
    symbolic = symbolic || !v->all_static();
    ops.push_back(std::move(*v));
  }
  if (!symbolic) return std::nullopt;
  return ops;
}

std::optional<SymTensor> sym_elementwise(const std::vector<SymTensor>& ops, DType dtype, const SymElemFn& f) {
  Shape out;
  for (const SymTensor& o : ops) out = broadcast_shapes(out, o.shape);
  std::vector<std::vector<int64_t>> index;
  for (const SymTensor& o : ops) index.push_back(broadcast_index(o.shape, out));
  SymTensor r{dtype, out, {}};
  std::vector<Dim> args(ops.size());
  for (int64_t i = 0; i < shape_numel(out); ++i) {
    for (size_t k = 0; k < ops.size(); ++k) args[k] = ops[k].elems[static_cast<size_t>(index[k][static_cast<size_t>(i)])];
    auto e = f(args);
    if (!e) return std::nullopt;
    r.elems.push_back(std::move(*e));
  }
  return r;
}

void set_sym_elementwise(InferCtx& c, const std::vector<int>& ins, DType dtype, const SymElemFn& f) {
  auto ops = symbolic_operands(c, ins);
  if (!ops) return;
  if (auto r = sym_elementwise(*ops, dtype, f)) c.set_out_sym_value(0, std::move(*r));
}

void forward_sym_value(InferCtx& c) {
  auto ops = symbolic_operands(c, {0});
  if (!ops || !c.out_set(0)) return;
  const TensorType& t = c.outs()[0];
  if (t.symbolic() || !shape_known(t.shape) || shape_numel(t.shape) != static_cast<int64_t>((*ops)[0].elems.size())) return;
  c.set_out_sym_value(0, SymTensor{t.dtype, t.shape, std::move((*ops)[0].elems)});
}

std::optional<bool> compare_sizes(SizeCmp op, const Dim& a, const Dim& b) {
  switch (op) {
    case SizeCmp::eq:
      if (a == b) return true;
      if (provably_positive(a - b) || provably_positive(b - a)) return false;
      return std::nullopt;
    case SizeCmp::lt:
      if (provably_positive(b - a)) return true;
      if (provably_nonneg(a - b)) return false;
      return std::nullopt;
    case SizeCmp::le:
      if (provably_nonneg(b - a)) return true;
      if (provably_positive(a - b)) return false;
      return std::nullopt;
    case SizeCmp::gt:
      return compare_sizes(SizeCmp::lt, b, a);
    case SizeCmp::ge:
      return compare_sizes(SizeCmp::le, b, a);
  }
  return std::nullopt;
}

}  // namespace tessel
