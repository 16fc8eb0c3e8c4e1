// The shared pieces of the decomposition hooks that are too large to live inline in the header.
#include "tessel/ops/decompose_util.h"

namespace tessel {

Value* cos_of(CoreBuilder& b, Value* x) {
  const long double half_pi = 1.57079632679489661923132169163975144L;
  const DType t = x->type.dtype;
  const double hi = Tensor::scalar_f(t, static_cast<double>(half_pi)).get_f(0);
  Value* r = b.add(b.sub(b.scalar(t, hi), abs_of(b, x)), b.scalar(t, static_cast<double>(half_pi - hi)));
  return b.unary(CoreOp::sin, r);
}

Value* element_count(CoreBuilder& b, Value* x, const std::vector<int64_t>& axes, DType t, bool keepdims) {
  const Dims d = x->type.dims();
  Dim count = 1;
  for (int64_t a : axes) count *= d[static_cast<size_t>(a)];
  if (count.is_static()) return b.scalar(t, static_cast<double>(count.constant_term()));
  return b.convert(b.reduce(b.full(DType::f64, d, 1.0), "sum", axes, keepdims), t);
}

// `v` broadcast_in_dim'ed to `shape`, operand dim i going to output dim dims[i]; `v` if unchanged.
Value* broadcast_into(CoreBuilder& b, Value* v, const DimList& shape, std::vector<int64_t> dims) {
  if (v->type.dims() == shape.d) return v;
  return b.emit(CoreOp::broadcast_in_dim, {v}, {{"shape", dims_attr(shape)}, {"dims", dims}});
}

// x's slices at the compile-time positions `idx` (each in [0, dim)) along `axis`, in order. Runs
// of evenly spaced positions become strided slices (a repeated position: a slice broadcast), which
// are concatenated; when that takes many pieces, one gather with the positions broadcast over the
// other dims instead.
Value* take_along_axis(CoreBuilder& b, Value* x, int axis, const std::vector<int64_t>& idx) {
  const Dims s = x->type.dims();
  const int64_t m = static_cast<int64_t>(idx.size());
  Dims starts(s.size(), 0), stops = s;
  std::vector<int64_t> strides(s.size(), 1);
  struct Run {
    int64_t first, step, len;
  };
  std::vector<Run> runs;
  for (int64_t i = 0; i < m;) {
    int64_t step = i + 1 < m ? idx[i + 1] - idx[i] : 1, len = 1;
    while (i + len < m && idx[i + len] - idx[i + len - 1] == step) ++len;
    runs.push_back({idx[i], len == 1 ? 1 : step, len});
    i += len;
  }
  if (runs.size() > 8) {
    Value* pos = b.constant(Tensor::from_i64(DType::i64, {m}, idx));
    Dims is = s;
    is[axis] = m;
    return b.emit(CoreOp::gather, {x, broadcast_into(b, pos, is, {axis})}, {{"axis", int64_t{axis}}});
  }
  if (runs.empty()) {  // nothing taken: an empty slice
    stops[axis] = 0;
    return b.slice(x, starts, stops);
  }
  std::vector<Value*> parts;
  for (const Run& r : runs) {
    starts[axis] = r.first;
    strides[axis] = r.step == 0 ? 1 : r.step;
    stops[axis] = r.step == 0 ? r.first + 1 : r.first + (r.len - 1) * r.step + (r.step > 0 ? 1 : -1);
    Value* piece = b.slice(x, starts, stops, strides);
    if (r.step == 0) {
      Dims ps = piece->type.dims();
      ps[axis] = r.len;
      piece = b.broadcast_to(piece, ps);
    }
    parts.push_back(piece);
  }
  return b.concat(parts, axis);
}

}  // namespace tessel
