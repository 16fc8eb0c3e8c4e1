// Op family: indexing ops (Gather*, Scatter*, NonZero, Compress, OneHot, Unique, TensorScatter).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "tessel/ir/op_registry.h"
#include "tessel/ops/decompose_util.h"
#include "tessel/ops/sym_util.h"
#include "tessel/support/error.h"

namespace tessel {

namespace {

// These kernels move elements without converting them, so copying raw bytes keeps every dtype
// (small floats, bool, 4-bit) exact.
void copy_elems(Tensor& dst, int64_t di, const Tensor& src, int64_t si, int64_t n) {
  if (n <= 0) return;
  const size_t esz = dtype_size(src.dtype());
  std::memcpy(dst.bytes() + di * esz, src.bytes() + si * esz, n * esz);
}

int64_t prod(const Shape& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to && i < s.size(); ++i) p *= s[i];
  return p;
}

void check_index_dtype(DType t, const char* what) {
  if (t != DType::i32 && t != DType::i64)
    fail("{} must be int32 or int64, got {}", what, dtype_name(t));
}

// ONNX indices may be negative (counting from the end); anything else out of range is bad input.
int64_t fix_index(int64_t idx, int64_t dim, const char* what) {
  if (idx < -dim || idx >= dim)
    fail("{} {} is out of range for a dimension of size {}", what, idx, dim);
  return idx < 0 ? idx + dim : idx;
}

int64_t dim_or_unknown(int64_t a, int64_t b) {
  return a >= 0 ? a : b;
}

// ---- Gather ---------------------------------------------------------------------------------

// Entries of a list of sizes taken by static indices (shape[0], shape[-1] in exported models).
void gather_sizes(InferCtx& c) {
  auto ops = symbolic_operands(c, {0, 1});
  if (!ops) {
    // A Gather of dims a Shape lists, known ones only, by constant indices: sizes although the whole shape
    // is not known.
    const std::optional<Dims> listed = listed_dims(c.node().inputs[0]);
    const Tensor* ix = c.value(1);
    if (!listed || !ix || c.in(0).shape.size() != 1) return;
    SymTensor r{DType::i64, ix->shape(), {}};
    const int64_t n = static_cast<int64_t>(listed->size());
    for (int64_t k = 0; k < ix->numel(); ++k) {
      const int64_t i = ix->get_i(k);
      if (i < -n || i >= n) return;  // (the kernel reports it)
      const Dim& d = (*listed)[static_cast<size_t>(i < 0 ? i + n : i)];
      if (dim_unknown(d)) return;
      r.elems.push_back(d);
    }
    c.set_out_sym_value(0, std::move(r));
    return;
  }
  if ((*ops)[0].shape.size() != 1) return;
  const SymTensor &data = (*ops)[0], &ix = (*ops)[1];
  SymTensor r{data.dtype, ix.shape, {}};
  for (const Dim& i : ix.elems) {
    if (i.is_symbolic()) return;
    r.elems.push_back(data.elems[static_cast<size_t>(fix_index(i.constant_term(), data.shape[0], "Gather index"))]);
  }
  c.set_out_sym_value(0, std::move(r));
}

void gather_infer(InferCtx& c) {
  const Dims d = c.in(0).dims();
  const auto& ix = c.in(1);
  check_index_dtype(ix.dtype, "Gather indices");
  const int r = static_cast<int>(d.size());
  if (r < 1) fail("Gather data must have rank >= 1");
  const int axis = normalize_axis(c.node().attr_i("axis", 0), r);
  Dims s(d.begin(), d.begin() + axis);
  const Dims id = ix.dims();
  s.insert(s.end(), id.begin(), id.end());
  s.insert(s.end(), d.begin() + axis + 1, d.end());
  c.set_out(0, TensorType::of(c.in(0).dtype, s));
  gather_sizes(c);
}

void gather_kernel(KernelCtx& c) {
  const Tensor& d = c.in(0);
  const Tensor& ix = c.in(1);
  const int axis = normalize_axis(c.node().attr_i("axis", 0), d.rank());
  const int64_t outer = prod(d.shape(), 0, axis), n = d.dim(axis);
  const int64_t inner = prod(d.shape(), axis + 1, d.rank());
  Shape s(d.shape().begin(), d.shape().begin() + axis);
  s.insert(s.end(), ix.shape().begin(), ix.shape().end());
  s.insert(s.end(), d.shape().begin() + axis + 1, d.shape().end());
  Tensor y(d.dtype(), s);
  const int64_t m = ix.numel();
  std::vector<int64_t> idx(m);
  for (int64_t j = 0; j < m; ++j) idx[j] = fix_index(ix.get_i(j), n, "Gather index");
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < m; ++j)
      copy_elems(y, (o * m + j) * inner, d, (o * n + idx[j]) * inner, inner);
  c.set_out(0, std::move(y));
}

// data [outer, n, inner] gathered along axis 1 with the indices flattened to [m] and broadcast to
// [outer, m, inner] (core gather wraps negative indices once, as Gather does); constant indices
// become slices where they can.
// A symbolic gathered axis takes the run-time form (the positions of negative indices depend on it).
std::vector<Value*> decompose_gather(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  const Dims ds = x->type.dims();
  const Dims out = n.outputs[0]->type.dims();
  const int r = static_cast<int>(ds.size());
  const int axis = normalize_axis(n.attr_i("axis", 0), r);
  if (auto c = b.known(1); c && ds[axis].is_static()) {
    std::vector<int64_t> idx = c->to_i64();
    for (auto& i : idx) i = fix_index(i, ds[axis], "Gather index");
    return {b.reshape(take_along_axis(b, x, axis, idx), out)};
  }
  const Dim outer = dims_numel(Dims(ds.begin(), ds.begin() + axis)), inner = dims_numel(Dims(ds.begin() + axis + 1, ds.end()));
  const Dim m = dims_numel(n.inputs[1]->type.dims());
  Value* idx = b.reshape(n.inputs[1], {m});
  Value* data = b.reshape(x, {outer, ds[axis], inner});
  Value* y = b.emit(CoreOp::gather, {data, broadcast_into(b, idx, {outer, m, inner}, {1})}, {{"axis", int64_t{1}}});
  return {b.reshape(y, out)};
}

// ---- GatherElements -------------------------------------------------------------------------

void gather_elements_infer(InferCtx& c) {
  const auto& d = c.in(0);
  const auto& ix = c.in(1);
  check_index_dtype(ix.dtype, "GatherElements indices");
  if (d.shape.size() != ix.shape.size() || d.shape.empty())
    fail("GatherElements data and indices must have the same rank >= 1, got {} and {}",
         d.shape.size(), ix.shape.size());
  normalize_axis(c.node().attr_i("axis", 0), static_cast<int>(d.shape.size()));
  c.set_out(0, with_dtype(ix, d.dtype));
}

void gather_elements_kernel(KernelCtx& c) {
  const Tensor& d = c.in(0);
  const Tensor& ix = c.in(1);
  const int r = d.rank();
  const int axis = normalize_axis(c.node().attr_i("axis", 0), r);
  for (int k = 0; k < r; ++k)
    if (k != axis && ix.dim(k) > d.dim(k))
      fail("GatherElements indices dim {} is {} but data's is only {}", k, ix.dim(k), d.dim(k));
  Tensor y(d.dtype(), ix.shape());
  const auto ds = strides_of(d.shape());
  std::vector<int64_t> pos(r, 0);
  for (int64_t i = 0; i < ix.numel(); ++i) {
    int64_t off = 0;
    for (int k = 0; k < r; ++k)
      off += (k == axis ? fix_index(ix.get_i(i), d.dim(axis), "GatherElements index") : pos[k]) *
             ds[k];
    copy_elems(y, i, d, off, 1);
    for (int k = r - 1; k >= 0; --k) {
      if (++pos[k] < ix.dim(k)) break;
      pos[k] = 0;
    }
  }
  c.set_out(0, std::move(y));
}

// Core gather is GatherElements (negative indices wrap once in both).
std::vector<Value*> decompose_gather_elements(CoreBuilder& b, const Node& n) {
  const int r = static_cast<int>(n.inputs[0]->type.shape.size());
  const int64_t axis = normalize_axis(n.attr_i("axis", 0), r);
  return {b.emit(CoreOp::gather, {n.inputs[0], n.inputs[1]}, {{"axis", axis}})};
}

// Index tuples along idx's last axis, each a position in `dims` (negative components count from
// the end), as row-major linear positions (i64, shape idx.shape[:-1]).
Value* linear_index(CoreBuilder& b, Value* idx, const Shape& dims) {
  Value* i = b.convert(idx, DType::i64);
  const Shape& s = i->type.shape;
  const int64_t k = static_cast<int64_t>(dims.size()), last = static_cast<int64_t>(s.size()) - 1;
  auto along_last = [&](const std::vector<int64_t>& v) {
    return broadcast_into(b, b.constant(Tensor::from_i64(DType::i64, {k}, v)), s, {last});
  };
  i = b.select(b.compare("lt", i, b.full(DType::i64, s, 0)), b.add(i, along_last(dims)), i);
  return b.reduce(b.mul(i, along_last(strides_of(dims))), "sum", {last}, false);
}

// linear_index over symbolic positions: each tuple component wrapped (negative counts from the end)
// and weighted by its row-major stride, the sizes computed as values.
Value* linear_index_sym(CoreBuilder& b, Value* idx, const Dims& dims) {
  Value* i = b.convert(idx, DType::i64);
  const Dims s = i->type.dims();
  const size_t last = s.size() - 1;
  const Dims lead(s.begin(), s.end() - 1);
  Dims starts(s.size(), 0), stops = s;
  Value* lin = nullptr;
  Dim stride = 1;
  for (size_t j = dims.size(); j-- > 0;) {
    starts[last] = static_cast<int64_t>(j);
    stops[last] = static_cast<int64_t>(j + 1);
    Value* c = b.reshape(b.slice(i, starts, stops), lead);
    Value* n = b.broadcast_to(b.size_value(dims[j], DType::i64), lead);
    c = b.select(b.compare("lt", c, b.full(DType::i64, lead, 0)), b.add(c, n), c);
    if (!(stride == 1)) c = b.mul(c, b.broadcast_to(b.size_value(stride, DType::i64), lead));
    lin = lin ? b.add(lin, c) : c;
    stride *= dims[j];
  }
  return lin;
}

// data flattened to [batch, indexed positions, rest] and gathered along axis 1 with the linear
// positions broadcast over `rest`. Symbolic sizes take the same form with run-time strides.
std::vector<Value*> decompose_gathernd(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  const size_t bd = static_cast<size_t>(n.attr_i("batch_dims", 0));
  if (!dims_static(x->type.dims()) || !dims_static(n.inputs[1]->type.dims())) {
    const Dims dd = x->type.dims();
    const size_t k = static_cast<size_t>(n.inputs[1]->type.dims().back().value());
    const Dims indexed(dd.begin() + bd, dd.begin() + bd + k);
    const Dim nb = dims_numel(Dims(dd.begin(), dd.begin() + bd));
    const Dim rest = dims_numel(Dims(dd.begin() + bd + k, dd.end()));
    Value* lin = linear_index_sym(b, n.inputs[1], indexed);
    const Dims ls = lin->type.dims();
    const Dim m = dims_numel(Dims(ls.begin() + bd, ls.end()));
    Value* data = b.reshape(x, {nb, dims_numel(indexed), rest});
    Value* idx = broadcast_into(b, b.reshape(lin, {nb, m}), {nb, m, rest}, {0, 1});
    return {b.reshape(b.emit(CoreOp::gather, {data, idx}, {{"axis", int64_t{1}}}), n.outputs[0]->type.dims())};
  }
  const Shape& ds = x->type.shape;
  const Shape& out = n.outputs[0]->type.shape;
  const size_t k = static_cast<size_t>(n.inputs[1]->type.shape.back()), r = ds.size();
  const int64_t nb = prod(ds, 0, bd), rest = prod(ds, bd + k, r);
  Value* lin = linear_index(b, n.inputs[1], Shape(ds.begin() + bd, ds.begin() + bd + k));
  const int64_t m = nb ? shape_numel(lin->type.shape) / nb : 0;
  Value* data = b.reshape(x, {nb, prod(ds, bd, bd + k), rest});
  Value* idx = broadcast_into(b, b.reshape(lin, {nb, m}), {nb, m, rest}, {0, 1});
  return {b.reshape(b.emit(CoreOp::gather, {data, idx}, {{"axis", int64_t{1}}}), out)};
}

// ---- GatherND -------------------------------------------------------------------------------

Shape gathernd_shape(const Shape& d, const Shape& ix, int64_t b) {
  const int64_t r = static_cast<int64_t>(d.size()), q = static_cast<int64_t>(ix.size());
  if (r < 1 || q < 1) fail("GatherND data and indices must have rank >= 1");
  if (b < 0 || b >= std::min(r, q)) fail("GatherND batch_dims {} must be less than both ranks", b);
  const int64_t k = ix.back();
  if (k < 0) unsupported("GatherND needs a static last dimension of indices");
  if (k < 1 || k > r - b) fail("GatherND indices last dim {} must be in [1, {}]", k, r - b);
  for (int64_t i = 0; i < b; ++i)
    if (d[i] >= 0 && ix[i] >= 0 && d[i] != ix[i])
      fail("GatherND batch dim {} differs: {} vs {}", i, d[i], ix[i]);
  Shape s(ix.begin(), ix.end() - 1);
  for (int64_t i = 0; i < b; ++i) s[i] = dim_or_unknown(s[i], d[i]);
  s.insert(s.end(), d.begin() + b + k, d.end());
  return s;
}

// The same rule over symbolic sizes: the tuple length must be static, and a batch dim the same
// size in both (a symbol against another size would hold only for some of its values).
Dims gathernd_dims(const Dims& d, const Dims& ix, int64_t b) {
  const int64_t r = static_cast<int64_t>(d.size()), q = static_cast<int64_t>(ix.size());
  if (r < 1 || q < 1) fail("GatherND data and indices must have rank >= 1");
  if (b < 0 || b >= std::min(r, q)) fail("GatherND batch_dims {} must be less than both ranks", b);
  if (!ix.back().is_static()) unsupported("GatherND needs a static last dimension of indices, not {}", ix.back());
  const int64_t k = ix.back().value();
  if (k < 1 || k > r - b) fail("GatherND indices last dim {} must be in [1, {}]", k, r - b);
  for (int64_t i = 0; i < b; ++i)
    if (!(d[i] == ix[i])) {
      if (d[i].is_static() && ix[i].is_static()) fail("GatherND batch dim {} differs: {} vs {}", i, d[i], ix[i]);
      unsupported("GatherND batch dim {} is {} in data but {} in indices", i, d[i], ix[i]);
    }
  Dims s(ix.begin(), ix.end() - 1);
  s.insert(s.end(), d.begin() + b + k, d.end());
  return s;
}

void gathernd_infer(InferCtx& c) {
  check_index_dtype(c.in(1).dtype, "GatherND indices");
  const int64_t b = c.node().attr_i("batch_dims", 0);
  if (!dims_static(c.in(0).dims()) || !dims_static(c.in(1).dims())) {
    c.set_out(0, TensorType::of(c.in(0).dtype, gathernd_dims(c.in(0).dims(), c.in(1).dims(), b)));
    return;
  }
  c.set_out(0, {c.in(0).dtype, gathernd_shape(c.in(0).shape, c.in(1).shape, b)});
}

void gathernd_kernel(KernelCtx& c) {
  const Tensor& d = c.in(0);
  const Tensor& ix = c.in(1);
  const int64_t b = c.node().attr_i("batch_dims", 0);
  Tensor y(d.dtype(), gathernd_shape(d.shape(), ix.shape(), b));
  const int64_t k = ix.shape().back();
  const int64_t batches = prod(d.shape(), 0, b);
  const int64_t per_batch_data = prod(d.shape(), b, d.rank());
  const int64_t slice = prod(d.shape(), b + k, d.rank());
  const int64_t tuples = batches ? ix.numel() / k / batches : 0;
  const auto ds = strides_of(d.shape());
  for (int64_t bi = 0; bi < batches; ++bi)
    for (int64_t t = 0; t < tuples; ++t) {
      const int64_t base = (bi * tuples + t) * k;
      int64_t off = bi * per_batch_data;
      for (int64_t j = 0; j < k; ++j)
        off += fix_index(ix.get_i(base + j), d.dim(b + j), "GatherND index") * ds[b + j];
      copy_elems(y, (bi * tuples + t) * slice, d, off, slice);
    }
  c.set_out(0, std::move(y));
}

// ---- Scatter family -------------------------------------------------------------------------

enum class Reduce { none, add, mul, max, min };

Reduce parse_reduction(const Node& n) {
  std::string s = n.attr_s("reduction", "none");
  if (s == "none") return Reduce::none;
  if (s == "add") return Reduce::add;
  if (s == "mul") return Reduce::mul;
  if (s == "max") return Reduce::max;
  if (s == "min") return Reduce::min;
  fail("unknown reduction '{}'", s);
}

// Combines update element `ui` into output element `oi` (the output starts as a copy of data).
void scatter_one(Tensor& y, int64_t oi, const Tensor& u, int64_t ui, Reduce red) {
  if (red == Reduce::none) return copy_elems(y, oi, u, ui, 1);
  if (is_float(y.dtype())) {
    double a = y.get_f(oi), b = u.get_f(ui);
    double v = red == Reduce::add   ? a + b
               : red == Reduce::mul ? a * b
               : red == Reduce::max ? std::max(a, b)
                                    : std::min(a, b);
    y.set_f(oi, v);
  } else {
    int64_t a = y.get_i(oi), b = u.get_i(ui);
    uint64_t ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
    int64_t v = red == Reduce::add   ? static_cast<int64_t>(ua + ub)
                : red == Reduce::mul ? static_cast<int64_t>(ua * ub)
                : red == Reduce::max ? std::max(a, b)
                                     : std::min(a, b);
    if (is_bool(y.dtype()) && red == Reduce::add) v = a || b;
    y.set_i(oi, v);
  }
}

// Symbolic sizes (a static KV cache written at a symbolic number of positions): updates must have the
// shape of indices, dim by dim equal for every value of the symbols; the result has data's type.
void scatter_elements_infer(InferCtx& c) {
  const auto& d = c.in(0);
  check_index_dtype(c.in(1).dtype, "scatter indices");
  if (c.in(2).dtype != d.dtype)
    fail("updates dtype {} differs from data {}", dtype_name(c.in(2).dtype), dtype_name(d.dtype));
  const Dims is = c.in(1).dims(), us = c.in(2).dims();
  if (is.size() != d.shape.size() || us.size() != is.size())
    fail("data, indices and updates must have the same rank, and updates the shape of indices");
  for (size_t i = 0; i < is.size(); ++i)
    if (!(is[i] == us[i])) {
      // a data-dependent dim (kUnknownDim, a NonZero's count) is checked by the kernel
      if ((is[i].is_static() && is[i].value() < 0) || (us[i].is_static() && us[i].value() < 0)) continue;
      if (is[i].is_static() && us[i].is_static())
        fail("data, indices and updates must have the same rank, and updates the shape of indices");
      unsupported("scatter indices dim {} is {} but updates' is {}, which the symbols do not decide equal", i, is[i],
                  us[i]);
    }
  if (d.shape.empty()) fail("data must have rank >= 1");
  normalize_axis(c.node().attr_i("axis", 0), static_cast<int>(d.shape.size()));
  parse_reduction(c.node());
  c.set_out(0, d);
}

void scatter_elements_kernel(KernelCtx& c) {
  const Tensor& d = c.in(0);
  const Tensor& ix = c.in(1);
  const Tensor& u = c.in(2);
  const int r = d.rank();
  const int axis = normalize_axis(c.node().attr_i("axis", 0), r);
  const Reduce red = parse_reduction(c.node());
  if (ix.shape() != u.shape())
    fail("updates shape {} differs from indices {}", shape_str(u.shape()), shape_str(ix.shape()));
  for (int k = 0; k < r; ++k)
    if (k != axis && ix.dim(k) > d.dim(k))
      fail("indices dim {} is {} but data's is only {}", k, ix.dim(k), d.dim(k));
  Tensor y = d.clone();
  const auto ds = strides_of(d.shape());
  std::vector<int64_t> pos(r, 0);
  for (int64_t i = 0; i < ix.numel(); ++i) {
    int64_t off = 0;
    for (int k = 0; k < r; ++k)
      off += (k == axis ? fix_index(ix.get_i(i), d.dim(axis), "scatter index") : pos[k]) * ds[k];
    scatter_one(y, off, u, i, red);
    for (int k = r - 1; k >= 0; --k) {
      if (++pos[k] < ix.dim(k)) break;
      pos[k] = 0;
    }
  }
  c.set_out(0, std::move(y));
}

// Core scatter is ScatterElements with the same reductions.
std::vector<Value*> decompose_scatter_elements(CoreBuilder& b, const Node& n) {
  const int r = static_cast<int>(n.inputs[0]->type.shape.size());
  const int64_t axis = normalize_axis(n.attr_i("axis", 0), r);
  return {b.emit(CoreOp::scatter, {n.inputs[0], n.inputs[1], n.inputs[2]},
                 {{"axis", axis}, {"reduction", n.attr_s("reduction", "none")}})};
}

void scatternd_infer(InferCtx& c) {
  const auto& d = c.in(0);
  const auto& ix = c.in(1);
  const auto& u = c.in(2);
  if (ix.dtype != DType::i64) fail("ScatterND indices must be int64");
  if (u.dtype != d.dtype)
    fail("updates dtype {} differs from data {}", dtype_name(u.dtype), dtype_name(d.dtype));
  if (ix.shape.empty()) fail("ScatterND indices must have rank >= 1");
  const int64_t k = ix.shape.back();
  if (k >= 0) {
    if (k > static_cast<int64_t>(d.shape.size()))
      fail("ScatterND indices last dim {} exceeds data rank {}", k, d.shape.size());
    Shape want(ix.shape.begin(), ix.shape.end() - 1);
    want.insert(want.end(), d.shape.begin() + k, d.shape.end());
    bool ok = want.size() == u.shape.size();
    for (size_t i = 0; ok && i < want.size(); ++i)
      ok = want[i] < 0 || u.shape[i] < 0 || want[i] == u.shape[i];
    if (!ok) fail("ScatterND updates shape {} should be {}", shape_str(u.shape), shape_str(want));
  }
  parse_reduction(c.node());
  c.set_out(0, d);
}

void scatternd_kernel(KernelCtx& c) {
  const Tensor& d = c.in(0);
  const Tensor& ix = c.in(1);
  const Tensor& u = c.in(2);
  const Reduce red = parse_reduction(c.node());
  const int64_t k = ix.shape().back();
  if (k > d.rank()) fail("ScatterND indices last dim {} exceeds data rank {}", k, d.rank());
  Shape want(ix.shape().begin(), ix.shape().end() - 1);
  want.insert(want.end(), d.shape().begin() + k, d.shape().end());
  if (u.shape() != want)
    fail("ScatterND updates shape {} should be {}", shape_str(u.shape()), shape_str(want));
  const int64_t slice = prod(d.shape(), k, d.rank());
  const int64_t tuples = prod(ix.shape(), 0, ix.rank() - 1);
  const auto ds = strides_of(d.shape());
  Tensor y = d.clone();
  for (int64_t t = 0; t < tuples; ++t) {
    int64_t off = 0;
    for (int64_t j = 0; j < k; ++j)
      off += fix_index(ix.get_i(t * k + j), d.dim(j), "ScatterND index") * ds[j];
    if (red == Reduce::none) {
      copy_elems(y, off, u, t * slice, slice);
    } else {
      for (int64_t e = 0; e < slice; ++e) scatter_one(y, off + e, u, t * slice + e, red);
    }
  }
  c.set_out(0, std::move(y));
}

// data flattened to [indexed positions, rest]; each update row scatters to its linear position.
std::vector<Value*> decompose_scatternd(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  const Shape& ds = x->type.shape;
  const size_t k = static_cast<size_t>(n.inputs[1]->type.shape.back());
  const int64_t rest = prod(ds, k, ds.size());
  Value* lin = linear_index(b, n.inputs[1], Shape(ds.begin(), ds.begin() + k));
  const int64_t m = shape_numel(lin->type.shape);
  Value* idx = broadcast_into(b, b.reshape(lin, {m}), {m, rest}, {0});
  Value* y = b.emit(CoreOp::scatter, {b.reshape(x, {prod(ds, 0, k), rest}), idx, b.reshape(n.inputs[2], {m, rest})},
                    {{"axis", int64_t{0}}, {"reduction", n.attr_s("reduction", "none")}});
  return {b.reshape(y, ds)};
}

// ---- TensorScatter --------------------------------------------------------------------------

void tensor_scatter_infer(InferCtx& c) {
  const auto& p = c.in(0);
  const auto& u = c.in(1);
  const int r = static_cast<int>(p.shape.size());
  if (r < 2) fail("TensorScatter past_cache must have rank >= 2");
  if (u.dtype != p.dtype || u.shape.size() != p.shape.size())
    fail("update must match past_cache's dtype and rank");
  const int axis = normalize_axis(c.node().attr_i("axis", -2), r);
  if (axis == 0) fail("TensorScatter axis cannot be the batch axis");
  std::string mode = c.node().attr_s("mode", "linear");
  if (mode != "linear" && mode != "circular") fail("unknown mode '{}'", mode);
  if (c.has_in(2) && c.in(2).dtype != DType::i64) fail("write_indices must be int64");
  c.set_out(0, p);
}

void tensor_scatter_kernel(KernelCtx& c) {
  const Tensor& p = c.in(0);
  const Tensor& u = c.in(1);
  const int r = p.rank();
  const int axis = normalize_axis(c.node().attr_i("axis", -2), r);
  const bool circular = c.node().attr_s("mode", "linear") == "circular";
  for (int k = 0; k < r; ++k)
    if (k != axis && u.dim(k) != p.dim(k))
      fail("update dim {} is {} but past_cache's is {}", k, u.dim(k), p.dim(k));
  const int64_t maxlen = p.dim(axis), len = u.dim(axis);
  if (len > maxlen) fail("update sequence length {} exceeds the cache's {}", len, maxlen);
  const int64_t batch = p.dim(0);
  std::vector<int64_t> wi(batch, 0);
  if (c.has_in(2)) {
    const Tensor& w = c.in(2);
    if (w.numel() != batch) fail("write_indices has {} entries, batch is {}", w.numel(), batch);
    for (int64_t i = 0; i < batch; ++i) wi[i] = w.get_i(i);
  }
  Tensor y = p.clone();
  const int64_t outer = prod(p.shape(), 0, axis);
  const int64_t per_batch = batch ? outer / batch : 0;
  const int64_t inner = prod(p.shape(), axis + 1, r);
  for (int64_t o = 0; o < outer; ++o) {
    const int64_t b = per_batch ? o / per_batch : 0;
    for (int64_t s = 0; s < len; ++s) {
      int64_t dst = wi[b] + s;
      if (circular)
        dst = ((dst % maxlen) + maxlen) % maxlen;
      else if (dst < 0 || dst >= maxlen)
        fail("write index {} + {} is outside the cache length {}", wi[b], s, maxlen);
      copy_elems(y, (o * maxlen + dst) * inner, u, (o * len + s) * inner, inner);
    }
  }
  c.set_out(0, std::move(y));
}

// A scatter along the axis at positions write_indices[batch] + s (mod the cache length if circular).
std::vector<Value*> decompose_tensor_scatter(CoreBuilder& b, const Node& n) {
  Value* cache = n.inputs[0];
  const Shape& us = n.inputs[1]->type.shape;
  const int64_t axis = normalize_axis(n.attr_i("axis", -2), static_cast<int>(us.size()));
  Value* pos = b.iota(DType::i64, us, axis);
  if (n.has_input(2)) pos = b.add(pos, broadcast_into(b, n.inputs[2], us, {0}));
  if (n.attr_s("mode", "linear") == "circular") {
    Value* len = b.full(DType::i64, us, static_cast<double>(cache->type.shape[axis]));
    pos = b.binary(CoreOp::rem, b.add(b.binary(CoreOp::rem, pos, len), len), len);
  }
  return {b.emit(CoreOp::scatter, {cache, pos, n.inputs[1]}, {{"axis", axis}})};
}

// ---- NonZero --------------------------------------------------------------------------------

Tensor nonzero_of(const Tensor& x) {
  std::vector<int64_t> hits;
  const bool fl = is_float(x.dtype());
  for (int64_t i = 0; i < x.numel(); ++i)
    if (fl ? x.get_f(i) != 0 : x.get_i(i) != 0) hits.push_back(i);
  const int r = x.rank();
  const int64_t n = static_cast<int64_t>(hits.size());
  Tensor y(DType::i64, {r, n});
  const auto st = strides_of(x.shape());
  int64_t* yp = y.data<int64_t>();
  for (int64_t j = 0; j < n; ++j)
    for (int k = 0; k < r; ++k) yp[k * n + j] = (hits[j] / st[k]) % x.dim(k);
  return y;
}

// NonZero has no decomposition: its output length is the number of non-zeros, known only at run time.
void nonzero_infer(InferCtx& c) {
  if (const Tensor* v = c.value(0)) return c.set_out_value(0, nonzero_of(*v));
  c.set_out(0, {DType::i64, {static_cast<int64_t>(c.in(0).shape.size()), kUnknownDim}});
}

// ---- Compress -------------------------------------------------------------------------------

// The positions a condition keeps along an axis of size n (unknown: -1).
std::vector<int64_t> compress_positions(const Tensor& cond, int64_t n) {
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < cond.numel(); ++i)
    if (cond.get_i(i)) {
      if (n >= 0 && i >= n) fail("Compress condition selects index {} but the axis has size {}", i, n);
      keep.push_back(i);
    }
  return keep;
}

// The output length is static only when the condition is known at compile time.
void compress_infer(InferCtx& c) {
  const auto& x = c.in(0);
  if (c.in(1).dtype != DType::boolean) fail("Compress condition must be bool");
  if (c.in(1).shape.size() != 1) fail("Compress condition must be 1-D");
  Shape s = {shape_numel(x.shape)};
  int axis = 0;
  if (c.node().has_attr("axis")) {
    s = x.shape;
    if (s.empty()) fail("Compress with an axis needs an input of rank >= 1, got a scalar");
    axis = normalize_axis(c.node().attr_i("axis"), static_cast<int>(s.size()));
  }
  const Tensor* cond = c.value(1);
  s[axis] = cond ? static_cast<int64_t>(compress_positions(*cond, s[axis]).size()) : kUnknownDim;
  c.set_out(0, {x.dtype, s});
}

// Called only when the condition is a compile-time constant (else the output length is unknown).
std::vector<Value*> decompose_compress(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  int axis = 0;
  if (n.has_attr("axis"))
    axis = normalize_axis(n.attr_i("axis"), static_cast<int>(x->type.shape.size()));
  else
    x = b.reshape(x, {shape_numel(x->type.shape)});
  const Tensor& cond = b.need_constant(1, "Compress condition");
  return {take_along_axis(b, x, axis, compress_positions(cond, x->type.shape[axis]))};
}

void compress_kernel(KernelCtx& c) {
  Tensor x = c.in(0);
  const Tensor& cond = c.in(1);
  int axis = 0;
  if (c.node().has_attr("axis")) {
    if (x.rank() == 0) fail("Compress with an axis needs an input of rank >= 1, got a scalar");
    axis = normalize_axis(c.node().attr_i("axis"), x.rank());
  } else {
    x = x.reshaped({x.numel()});
  }
  const int64_t n = x.dim(axis);
  const std::vector<int64_t> keep = compress_positions(cond, n);
  const int64_t outer = prod(x.shape(), 0, axis), inner = prod(x.shape(), axis + 1, x.rank());
  Shape s = x.shape();
  s[axis] = static_cast<int64_t>(keep.size());
  Tensor y(x.dtype(), s);
  const int64_t m = s[axis];
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < m; ++j)
      copy_elems(y, (o * m + j) * inner, x, (o * n + keep[j]) * inner, inner);
  c.set_out(0, std::move(y));
}

// ---- OneHot ---------------------------------------------------------------------------------

int64_t onehot_depth(const Tensor& t) {
  if (t.numel() != 1) fail("OneHot depth must have one element, got {}", t.numel());
  double d = t.get_f(0);
  if (!(d >= 1) || d > 1e12) fail("OneHot depth must be positive, got {}", d);
  return static_cast<int64_t>(d);
}

void onehot_infer(InferCtx& c) {
  const auto& ix = c.in(0);
  if (c.in(2).shape.size() != 1 || (c.in(2).shape[0] >= 0 && c.in(2).shape[0] != 2))
    fail("OneHot values must be a 2-element vector");
  const int r = static_cast<int>(ix.shape.size());
  const int axis = normalize_axis(c.node().attr_i("axis", -1), r + 1);
  int64_t depth = kUnknownDim;
  if (const Tensor* d = c.value(1)) depth = onehot_depth(*d);
  Shape s = ix.shape;
  s.insert(s.begin() + axis, depth);
  c.set_out(0, {c.in(2).dtype, s});
}

void onehot_kernel(KernelCtx& c) {
  const Tensor& ix = c.in(0);
  const int64_t depth = onehot_depth(c.in(1));
  const Tensor& vals = c.in(2);
  if (vals.numel() != 2) fail("OneHot values must have 2 elements");
  const int axis = normalize_axis(c.node().attr_i("axis", -1), ix.rank() + 1);
  Shape s = ix.shape();
  s.insert(s.begin() + axis, depth);
  Tensor y(vals.dtype(), s);
  const int64_t outer = prod(ix.shape(), 0, axis), inner = prod(ix.shape(), axis, ix.rank());
  for (int64_t i = 0; i < y.numel(); ++i) copy_elems(y, i, vals, 0, 1);
  const bool fl = is_float(ix.dtype());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t in = 0; in < inner; ++in) {
      const int64_t src = o * inner + in;
      // Float indices are truncated toward zero, like a cast to int.
      int64_t k = -depth - 1;  // NaN/inf/huge float indices are out of range
      if (!fl)
        k = ix.get_i(src);
      else if (double f = ix.get_f(src); std::isfinite(f) && std::fabs(f) < 9e18)
        k = static_cast<int64_t>(std::trunc(f));
      if (k < 0) k += depth;
      if (k < 0 || k >= depth) continue;  // out-of-range indices give an all-"off" row
      copy_elems(y, (o * depth + k) * inner + in, vals, 1, 1);
    }
  c.set_out(0, std::move(y));
}

// The on value where the iota along the new axis equals the index (negative ones wrapped once;
// float indices truncate toward zero), else the off value.
std::vector<Value*> decompose_onehot(CoreBuilder& b, const Node& n) {
  const Shape& is = n.inputs[0]->type.shape;
  const Shape& out = n.outputs[0]->type.shape;
  const int axis = normalize_axis(n.attr_i("axis", -1), static_cast<int>(is.size()) + 1);
  const int64_t depth = out[axis];
  Value* k = b.convert(n.inputs[0], DType::i64);
  k = b.select(b.compare("lt", k, b.full(DType::i64, is, 0)), b.add(k, b.full(DType::i64, is, static_cast<double>(depth))), k);
  Shape ks = is;
  ks.insert(ks.begin() + axis, 1);
  Value* hit = b.compare("eq", b.broadcast_to(b.reshape(k, ks), out), b.iota(DType::i64, out, axis));
  Value* vals = n.inputs[2];
  Value* off = b.reshape(b.slice(vals, {0}, {1}), {});
  Value* on = b.reshape(b.slice(vals, {1}, {2}), {});
  return {b.select(hit, on, off)};
}

// ---- Unique ---------------------------------------------------------------------------------

// Unique has no decomposition: the number of distinct values is only known at run time.
void unique_infer(InferCtx& c) {
  const auto& x = c.in(0);
  const auto& n = c.node();
  Shape ys = {kUnknownDim};
  int64_t len = shape_numel(x.shape);
  if (n.has_attr("axis")) {
    const int axis = normalize_axis(n.attr_i("axis"), static_cast<int>(x.shape.size()));
    ys = x.shape;
    ys[axis] = kUnknownDim;
    len = x.shape[axis];
  }
  c.set_out(0, {x.dtype, ys});
  c.set_out(1, {DType::i64, {kUnknownDim}});
  c.set_out(2, {DType::i64, {len < 0 ? kUnknownDim : len}});
  c.set_out(3, {DType::i64, {kUnknownDim}});
}

void unique_kernel(KernelCtx& c) {
  Tensor x = c.in(0);
  const auto& node = c.node();
  const bool sorted = node.attr_i("sorted", 1) != 0;
  int axis = 0;
  if (node.has_attr("axis"))
    axis = normalize_axis(node.attr_i("axis"), x.rank());
  else
    x = x.reshaped({x.numel()});
  const int64_t n = x.dim(axis);
  const int64_t outer = prod(x.shape(), 0, axis), inner = prod(x.shape(), axis + 1, x.rank());
  const bool fl = is_float(x.dtype());
  // Slice j along the axis, as a comparable key (row-major over the remaining dims).
  auto cmp = [&](int64_t a, int64_t b) -> int {
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        const int64_t ia = (o * n + a) * inner + in, ib = (o * n + b) * inner + in;
        if (fl) {
          double va = x.get_f(ia), vb = x.get_f(ib);
          // NaNs sort last and equal each other, keeping the order strict and weak.
          const bool na = std::isnan(va), nb = std::isnan(vb);
          if (na || nb) {
            if (na != nb) return na ? 1 : -1;
            continue;
          }
          if (va < vb) return -1;
          if (va > vb) return 1;
        } else {
          int64_t va = x.get_i(ia), vb = x.get_i(ib);
          if (x.dtype() == DType::u64) {
            uint64_t ua = static_cast<uint64_t>(va), ub = static_cast<uint64_t>(vb);
            if (ua != ub) return ua < ub ? -1 : 1;
          } else if (va != vb) {
            return va < vb ? -1 : 1;
          }
        }
      }
    return 0;
  };
  // First occurrences in input order, each with its count and the inverse mapping.
  std::vector<int64_t> firsts, inverse(n), counts;
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cmp(a, b) < 0; });
  std::vector<int64_t> group_of(n);
  std::vector<int64_t> group_first;  // in sorted order
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || cmp(order[i - 1], order[i]) != 0) group_first.push_back(order[i]);
    group_of[order[i]] = static_cast<int64_t>(group_first.size()) - 1;
  }
  const int64_t g = static_cast<int64_t>(group_first.size());
  // Output position of each group: sorted order, or order of first appearance.
  std::vector<int64_t> pos(g);
  if (sorted) {
    std::iota(pos.begin(), pos.end(), 0);
  } else {
    std::vector<int64_t> gs(g);
    std::iota(gs.begin(), gs.end(), 0);
    std::sort(gs.begin(), gs.end(),
              [&](int64_t a, int64_t b) { return group_first[a] < group_first[b]; });
    for (int64_t i = 0; i < g; ++i) pos[gs[i]] = i;
  }
  std::vector<int64_t> first(g), count(g, 0);
  for (int64_t gi = 0; gi < g; ++gi) first[pos[gi]] = group_first[gi];
  for (int64_t i = 0; i < n; ++i) {
    inverse[i] = pos[group_of[i]];
    ++count[inverse[i]];
  }
  Shape ys = x.shape();
  ys[axis] = g;
  Tensor y(x.dtype(), ys);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < g; ++j)
      copy_elems(y, (o * g + j) * inner, x, (o * n + first[j]) * inner, inner);
  c.set_out(0, std::move(y));
  if (c.wants_out(1)) c.set_out(1, Tensor::from_i64(DType::i64, {g}, first));
  if (c.wants_out(2)) c.set_out(2, Tensor::from_i64(DType::i64, {n}, inverse));
  if (c.wants_out(3)) c.set_out(3, Tensor::from_i64(DType::i64, {g}, count));
}

}  // namespace

void register_index_ops(OpRegistry& r) {
  // Gather, GatherElements and GatherND only widened their index ranges (negative indices)
  // and dtypes across opsets, which this entry accepts, so the oldest forms import as is.
  // Gather, GatherElements and GatherND take symbolic sizes (docs/dynamic-shapes.md).
  r.add(symbolic_op(with_decomposition(make_op("Gather", 1, 2, 2, {{"axis", AttrKind::i}}, gather_infer, gather_kernel,
                                               FusionKind::injective),
                                       decompose_gather)));
  r.add(symbolic_op(with_decomposition(make_op("GatherElements", 11, 2, 2, {{"axis", AttrKind::i}},
                                               gather_elements_infer, gather_elements_kernel, FusionKind::injective),
                                       decompose_gather_elements)));
  r.add(symbolic_op(with_decomposition(make_op("GatherND", 11, 2, 2, {{"batch_dims", AttrKind::i}}, gathernd_infer,
                                               gathernd_kernel, FusionKind::injective),
                                       decompose_gathernd)));
  // ScatterElements 11 (no reduction) and 16 (add/mul) are subsets of 18.
  // Both take symbolic sizes (docs/dynamic-shapes.md).
  r.add(symbolic_op(with_decomposition(make_op("ScatterElements", 11, 3, 3, {{"axis", AttrKind::i}, {"reduction", AttrKind::s}},
                                               scatter_elements_infer, scatter_elements_kernel),
                                       decompose_scatter_elements)));
  r.add(symbolic_op(with_decomposition(
      make_op("Scatter", 9, 3, 3, {{"axis", AttrKind::i}}, scatter_elements_infer, scatter_elements_kernel),
      decompose_scatter_elements)));
  r.add(with_decomposition(
      make_op("ScatterND", 11, 3, 3, {{"reduction", AttrKind::s}}, scatternd_infer, scatternd_kernel),
      decompose_scatternd));
  r.add(with_decomposition(make_op("TensorScatter", 24, 2, 3, {{"axis", AttrKind::i}, {"mode", AttrKind::s}},
                                   tensor_scatter_infer, tensor_scatter_kernel),
                           decompose_tensor_scatter));
  r.add(make_op("NonZero", 9, 1, 1, {}, nonzero_infer,
             [](KernelCtx& c) { c.set_out(0, nonzero_of(c.in(0))); }));
  r.add(with_decomposition(
      make_op("Compress", 9, 2, 2, {{"axis", AttrKind::i}}, compress_infer, compress_kernel), decompose_compress));
  r.add(with_decomposition(make_op("OneHot", 9, 3, 3, {{"axis", AttrKind::i}}, onehot_infer, onehot_kernel),
                           decompose_onehot));
  {
    OpDef d = make_op("Unique", 11, 1, 1, {{"axis", AttrKind::i}, {"sorted", AttrKind::i}},
                   unique_infer, unique_kernel);
    d.max_outputs = 4;
    r.add(std::move(d));
  }
}

}  // namespace tessel
