// Op family: shape and data-movement ops (reshape, transpose, slicing, padding, resizing, ...).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "tessel/ir/op_registry.h"
#include "tessel/ops/decompose_util.h"
#include "tessel/ops/sym_util.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

// The node's output as a reshape of its input 0 (Reshape, Flatten, Squeeze, Unsqueeze): the rule
// gave the output its dims (static or symbolic), a Reshape's from its target read as sizes.
std::vector<Value*> decompose_reshape(CoreBuilder& b, const Node& n) {
  return {b.reshape(n.inputs[0], n.outputs[0]->type.dims())};
}

using Ints = std::vector<int64_t>;

// ---- small helpers -----------------------------------------------------------------------------

OpDef make_op(std::string name, int min_in, int max_in, int since,
              std::vector<AttrSpec> attrs = {}) {
  OpDef d;
  d.name = std::move(name);
  d.min_inputs = min_in;
  d.max_inputs = max_in;
  d.since = since;
  d.attrs = std::move(attrs);
  d.fusion = FusionKind::injective;
  return d;
}

// Legacy attributes are listed so that old models import; upgrade() removes them. One that is still
// present at a current opset is invalid.
void reject_attr(const Node& n, const char* name) {
  if (n.has_attr(name)) fail("attribute '{}' is not valid at this opset", name);
}

// Moves an int-list attribute into input `slot` as an i64 constant.
void attr_to_input(Graph& g, Node& n, const std::string& attr, size_t slot) {
  if (!n.has_attr(attr)) return;
  Ints v = n.attr_ints(attr);
  n.attrs.erase(attr);
  Value* c = g.add_constant(g.unique_name(n.name + "_" + attr),
                            Tensor::from_i64(DType::i64, {static_cast<int64_t>(v.size())}, v));
  if (n.inputs.size() <= slot) n.inputs.resize(slot + 1, nullptr);
  n.inputs[slot] = c;
}

Ints tensor_ints(const Tensor& t) {
  if (!is_int(t.dtype())) fail("expected an integer tensor, got {}", dtype_name(t.dtype()));
  return t.to_i64();
}

int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r) || r > (int64_t{1} << 40)) fail("tensor size overflows");
  return r;
}
// The same for sizes: static ones checked as above, symbolic ones multiplied as expressions.
Dim checked_mul(const Dim& a, const Dim& b) {
  if (a.is_static() && b.is_static()) return checked_mul(a.constant_term(), b.constant_term());
  return a * b;
}

// Row-major odometer over `shape`.
bool next_index(Ints& idx, const Shape& shape) {
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    if (++idx[d] < shape[d]) return true;
    idx[d] = 0;
  }
  return false;
}

// Builds an output of `out` shape whose element at multi-index o is the input element at flat
// index src(o), or `fill` (one element of the same dtype) when src returns -1. Copies raw bytes, so
// every dtype is moved exactly.
template <typename F>
Tensor remap(const Tensor& x, const Shape& out, F&& src, const uint8_t* fill = nullptr) {
  int64_t total = 1;
  for (int64_t d : out) total = checked_mul(total, d);
  if (total > (int64_t{1} << 34)) fail("output of {} elements is too large", total);
  Tensor y(x.dtype(), out);
  const int64_t n = y.numel();
  if (n == 0) return y;
  const size_t es = static_cast<size_t>(dtype_size(x.dtype()));
  const uint8_t* xp = x.bytes();
  uint8_t* yp = y.bytes();
  Ints idx(out.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t s = src(idx);
    if (s < 0) {
      if (fill) std::memcpy(yp + i * es, fill, es);
    } else {
      std::memcpy(yp + i * es, xp + s * es, es);
    }
    next_index(idx, out);
  }
  return y;
}

int64_t flat_of(const Ints& idx, const Ints& strides) {
  int64_t f = 0;
  for (size_t d = 0; d < idx.size(); ++d) f += idx[d] * strides[d];
  return f;
}

// An int list for messages; unlike shape_str, -1 prints as -1 (it is a value, not an unknown dim).
// Sizes print by their expression.
std::string ints_str(const Dims& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + v[i].str();
  return s + "]";
}
std::string ints_str(const Ints& v) { return ints_str(dims_of(v)); }

// Input i's value as a list of sizes when it is known: a constant, folded shape arithmetic or a
// symbolic value (docs/dynamic-shapes.md); nullopt otherwise.
std::optional<Dims> known_dims(const InferCtx& c, int i) {
  if (auto v = c.sym_value(i)) return v->elems;
  if (auto v = known_ints(c, i)) return dims_of(*v);
  return std::nullopt;
}

// Sizes taken from a value (a target shape): a symbolic entry must be >= `lo` for every value of the
// symbols (entries 0 and -1 mean something else in Reshape, and no size is negative).
void check_size_entries(const Dims& v, int64_t lo, const char* what) {
  for (const Dim& d : v)
    if (d.is_symbolic() && !provably_ge(d, Dim(lo)))
      unsupported("{} {}: the entry {} is at least {} only for some values of the symbols", what, ints_str(v), d.str(), lo);
}

// max(0, ceil(diff / k)) for k >= 1, when the symbols decide it: the number of elements a stride
// of k takes from a run of `diff` (Slice, Range).
Dim ceil_count(const Dim& diff, int64_t k, const std::string& what) {
  if (diff.is_static()) {
    const int64_t v = diff.constant_term();
    return v > 0 ? 1 + (v - 1) / k : 0;
  }
  if (provably_ge(Dim(0), diff)) return 0;
  if (provably_nonneg(diff)) {
    if (k == 1) return diff;
    if (auto q = exact_div(diff + (k - 1), Dim(k))) return *q;
  }
  unsupported("{}: the count of {} in steps of {} is not a size expression for every value of the symbols", what,
              diff.str(), k);
}

Tensor i64_vector(const Ints& v) {
  return Tensor::from_i64(DType::i64, {static_cast<int64_t>(v.size())}, v);
}

// ---- Reshape -----------------------------------------------------------------------------------

// The output dims of Reshape; unknown dims stay unknown. `in` may contain unknown and symbolic dims,
// `target` symbolic sizes (shape arithmetic). A -1 takes the elements left over when that is an exact
// division for every value of the symbols; otherwise the reshape is refused.
Dims reshape_target(const Dims& in, const Dims& target, bool allowzero) {
  check_size_entries(target, 1, "reshape target");
  Dims out(target.size());
  int infer_at = -1;
  for (size_t i = 0; i < target.size(); ++i) {
    const Dim& t = target[i];
    if (t == -1) {
      if (infer_at >= 0) fail("reshape target {} has more than one -1", ints_str(target));
      infer_at = static_cast<int>(i);
      out[i] = kUnknownDim;
    } else if (t == 0 && !allowzero) {
      if (i >= in.size())
        fail("reshape target {} copies dim {} but the input has rank {}", ints_str(target), i,
             in.size());
      out[i] = in[i];
    } else if (dim_unknown(t)) {
      fail("reshape target {} has a negative dim", ints_str(target));
    } else {
      out[i] = t;
    }
  }
  if (allowzero && infer_at >= 0)
    for (const Dim& t : target)
      if (t == 0) fail("reshape target {} mixes 0 and -1 with allowzero=1", ints_str(target));
  const Dim in_n = numel_or_unknown(in);
  if (infer_at >= 0) {
    Dim rest = 1;
    bool known = !dim_unknown(in_n);
    for (size_t i = 0; i < out.size(); ++i)
      if (static_cast<int>(i) != infer_at) {
        if (dim_unknown(out[i]))
          known = false;
        else
          rest = checked_mul(rest, out[i]);
      }
    if (known) {
      const auto q = rest == 0 ? std::nullopt : exact_div(in_n, rest);
      if (!q && in_n.is_static() && rest.is_static()) fail("cannot reshape {} into {}", dims_str(in), ints_str(target));
      if (!q)
        unsupported("Reshape of {} into {}: the -1 is {} / {}, not an exact division for every value of the symbols",
                    dims_str(in), ints_str(target), in_n.str(), rest.str());
      out[infer_at] = *q;
    }
  }
  const Dim out_n = numel_or_unknown(out);
  if (!dim_unknown(in_n) && !dim_unknown(out_n) && in_n != out_n) {
    if (in_n.is_static() && out_n.is_static())
      fail("cannot reshape {} ({} elements) into {}", dims_str(in), in_n.str(), dims_str(out));
    unsupported("Reshape of {} into {}: {} and {} elements are equal only for some values of the symbols",
                dims_str(in), dims_str(out), in_n.str(), out_n.str());
  }
  return out;
}

OpDef reshape_op() {
  OpDef d = make_op("Reshape", 2, 2, 14, {{"allowzero", AttrKind::i}, {"shape", AttrKind::ints}});
  d.upgrade = [](Graph& g, Node& n, int) { attr_to_input(g, n, "shape", 1); };
  d.infer = [](InferCtx& c) {
    reject_attr(c.node(), "shape");
    bool allowzero = c.node().attr_i("allowzero", 0) != 0;
    const TensorType& x = c.in(0);
    if (auto t = known_dims(c, 1)) {
      c.set_out(0, TensorType::of(x.dtype, reshape_target(x.dims(), *t, allowzero)));
      forward_sym_value(c);
      return;
    }
    const Shape& ss = c.in(1).shape;
    if (ss.size() != 1 || ss[0] < 0) unsupported("Reshape with a target of unknown rank");
    c.set_out(0, {x.dtype, Shape(ss[0], kUnknownDim)});
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    Dims s = reshape_target(dims_of(x.shape()), dims_of(tensor_ints(c.in(1))), c.node().attr_i("allowzero", 0) != 0);
    c.set_out(0, x.reshaped(static_shape(s)));
  };
  return d;
}

// ---- Transpose ---------------------------------------------------------------------------------

Ints transpose_perm(const Node& n, int rank) {
  Ints perm;
  if (n.has_attr("perm")) {
    perm = n.attr_ints("perm");
    if (static_cast<int>(perm.size()) != rank)
      fail("perm has {} entries for rank {}", perm.size(), rank);
    std::vector<bool> seen(rank, false);
    for (auto& p : perm) {
      p = normalize_axis(p, rank);
      if (seen[p]) fail("perm repeats axis {}", p);
      seen[p] = true;
    }
  } else {
    for (int i = rank - 1; i >= 0; --i) perm.push_back(i);
  }
  return perm;
}

OpDef transpose_op() {
  OpDef d = make_op("Transpose", 1, 1, 1, {{"perm", AttrKind::ints}});
  d.infer = [](InferCtx& c) {
    const Dims x = c.in(0).dims();
    Ints perm = transpose_perm(c.node(), static_cast<int>(x.size()));
    Dims s;
    for (int64_t p : perm) s.push_back(x[p]);
    c.set_out(0, TensorType::of(c.in(0).dtype, s));
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    Ints perm = transpose_perm(c.node(), x.rank());
    Shape s;
    for (int64_t p : perm) s.push_back(x.dim(p));
    Ints st = strides_of(x.shape());
    Ints ps;
    for (int64_t p : perm) ps.push_back(st[p]);
    c.set_out(0, remap(x, s, [&](const Ints& o) { return flat_of(o, ps); }));
  };
  return d;
}

std::vector<Value*> decompose_transpose(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  return {b.transpose(x, transpose_perm(n, static_cast<int>(x->type.shape.size())))};
}

// ---- Squeeze / Unsqueeze -----------------------------------------------------------------------

// A symbolic dim is never assumed to be 1: squeezing one is refused.
Dims squeeze_shape(const Dims& in, const std::optional<Ints>& axes) {
  int r = static_cast<int>(in.size());
  std::vector<bool> drop(r, false);
  if (axes) {
    for (int64_t a : *axes) {
      int ax = normalize_axis(a, r);
      if (in[ax].is_symbolic())
        unsupported("cannot squeeze axis {} of symbolic size {}: it is 1 only for some values of the symbols", ax,
                    in[ax].str());
      if (!dim_unknown(in[ax]) && in[ax] != 1) fail("cannot squeeze axis {} of size {}", ax, in[ax].str());
      drop[ax] = true;
    }
  } else {
    for (int i = 0; i < r; ++i) {
      if (dim_unknown(in[i]))
        unsupported("Squeeze without axes on an input of unknown dims {}", dims_str(in));
      if (in[i].is_symbolic())
        unsupported("Squeeze without axes on {}: whether {} is 1 depends on the symbols", dims_str(in), in[i].str());
      drop[i] = in[i] == 1;
    }
  }
  Dims out;
  for (int i = 0; i < r; ++i)
    if (!drop[i]) out.push_back(in[i]);
  return out;
}

Dims unsqueeze_shape(const Dims& in, const Ints& axes) {
  int r = static_cast<int>(in.size() + axes.size());
  std::vector<bool> ins(r, false);
  for (int64_t a : axes) {
    int ax = normalize_axis(a, r);
    if (ins[ax]) fail("Unsqueeze repeats axis {}", ax);
    ins[ax] = true;
  }
  Dims out;
  size_t k = 0;
  for (int i = 0; i < r; ++i) out.push_back(ins[i] ? Dim(1) : in[k++]);
  return out;
}

OpDef squeeze_op(bool un) {
  OpDef d = make_op(un ? "Unsqueeze" : "Squeeze", un ? 2 : 1, 2, 13, {{"axes", AttrKind::ints}});
  d.upgrade = [](Graph& g, Node& n, int) { attr_to_input(g, n, "axes", 1); };
  d.infer = [un](InferCtx& c) {
    reject_attr(c.node(), "axes");
    const TensorType& x = c.in(0);
    std::optional<Ints> axes;
    if (c.has_in(1)) {
      axes = known_ints(c, 1);
      if (!axes) {
        const Shape& as = c.in(1).shape;
        if (as.size() != 1 || as[0] < 0) unsupported("axes of unknown length");
        int64_t r = static_cast<int64_t>(x.shape.size()) + (un ? as[0] : -as[0]);
        if (r < 0) fail("too many axes");
        c.set_out(0, {x.dtype, Shape(r, kUnknownDim)});
        return;
      }
    } else if (un) {
      fail("Unsqueeze needs axes");
    }
    c.set_out(0, TensorType::of(x.dtype, un ? unsqueeze_shape(x.dims(), *axes) : squeeze_shape(x.dims(), axes)));
    forward_sym_value(c);
  };
  d.kernel = [un](KernelCtx& c) {
    const Tensor& x = c.in(0);
    std::optional<Ints> axes;
    if (c.has_in(1))
      axes = tensor_ints(c.in(1));
    else if (un)
      fail("Unsqueeze needs axes");
    const Dims in = dims_of(x.shape());
    c.set_out(0, x.reshaped(static_shape(un ? unsqueeze_shape(in, *axes) : squeeze_shape(in, axes))));
  };
  return d;
}

// ---- Flatten -----------------------------------------------------------------------------------

Dims flatten_shape(const Dims& in, int64_t axis) {
  int r = static_cast<int>(in.size());
  if (axis < -r || axis > r) fail("Flatten axis {} is out of range for rank {}", axis, r);
  if (axis < 0) axis += r;
  return {numel_or_unknown(Dims(in.begin(), in.begin() + axis)), numel_or_unknown(Dims(in.begin() + axis, in.end()))};
}

OpDef flatten_op() {
  OpDef d = make_op("Flatten", 1, 1, 1, {{"axis", AttrKind::i}});
  d.infer = [](InferCtx& c) {
    c.set_out(0, TensorType::of(c.in(0).dtype, flatten_shape(c.in(0).dims(), c.node().attr_i("axis", 1))));
    forward_sym_value(c);
  };
  d.kernel = [](KernelCtx& c) {
    c.set_out(0, c.in(0).reshaped(static_shape(flatten_shape(dims_of(c.in(0).shape()), c.node().attr_i("axis", 1)))));
  };
  return d;
}

// ---- Concat ------------------------------------------------------------------------------------

// Lists of sizes concatenated (ONNX exporters build a Reshape's target so): the inputs' values in
// order, when they are all known lists and one is symbolic.
void concat_sizes(InferCtx& c) {
  auto ops = symbolic_operands(c, every_input(c));
  if (!ops || ops->front().shape.size() != 1) return;
  SymTensor r{c.in(0).dtype, {0}, {}};
  for (const SymTensor& o : *ops) r.elems.insert(r.elems.end(), o.elems.begin(), o.elems.end());
  r.shape[0] = static_cast<int64_t>(r.elems.size());
  c.set_out_sym_value(0, std::move(r));
}

OpDef concat_op() {
  OpDef d = make_op("Concat", 1, -1, 4, {{"axis", AttrKind::i}});
  d.upgrade = [](Graph&, Node& n, int) {
    if (!n.has_attr("axis")) n.attrs["axis"] = int64_t{1};
  };
  d.infer = [](InferCtx& c) {
    const TensorType& x0 = c.in(0);
    int r = static_cast<int>(x0.shape.size());
    if (r == 0) fail("Concat of scalars");
    int ax = normalize_axis(c.node().attr_i("axis"), r);
    Dims out = x0.dims();
    for (int i = 1; i < c.num_inputs(); ++i) {
      const TensorType& t = c.in(i);
      if (t.dtype != x0.dtype)
        fail("Concat inputs have dtypes {} and {}", dtype_name(x0.dtype), dtype_name(t.dtype));
      if (static_cast<int>(t.shape.size()) != r)
        fail("Concat inputs have ranks {} and {}", r, t.shape.size());
      const Dims td = t.dims();
      for (int d2 = 0; d2 < r; ++d2) {
        if (d2 == ax)
          out[d2] = dim_unknown(out[d2]) || dim_unknown(td[d2]) ? Dim(kUnknownDim) : out[d2] + td[d2];
        else if (!(out[d2] == td[d2]))
          out[d2] = merge_equal_dims(out[d2], td[d2], fmt::format("Concat inputs {} and {} differ off the axis",
                                                                  dims_str(x0.dims()), dims_str(td)));
      }
    }
    c.set_out(0, TensorType::of(x0.dtype, out));
    concat_sizes(c);
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x0 = c.in(0);
    int r = x0.rank();
    int ax = normalize_axis(c.node().attr_i("axis"), r);
    Shape out = x0.shape();
    out[ax] = 0;
    for (int i = 0; i < c.num_inputs(); ++i) {
      const Tensor& t = c.in(i);
      if (t.rank() != r || t.dtype() != x0.dtype()) fail("Concat inputs differ in rank or dtype");
      for (int d2 = 0; d2 < r; ++d2)
        if (d2 != ax && t.dim(d2) != x0.dim(d2))
          fail("Concat inputs {} and {} differ off the axis", shape_str(x0.shape()),
               shape_str(t.shape()));
      out[ax] += t.dim(ax);
    }
    Tensor y(x0.dtype(), out);
    int64_t outer = 1, inner = 1;
    for (int d2 = 0; d2 < ax; ++d2) outer *= out[d2];
    for (int d2 = ax + 1; d2 < r; ++d2) inner *= out[d2];
    const size_t es = static_cast<size_t>(dtype_size(x0.dtype()));
    uint8_t* yp = y.bytes();
    size_t row = static_cast<size_t>(out[ax] * inner) * es;
    size_t off = 0;
    for (int i = 0; i < c.num_inputs(); ++i) {
      const Tensor& t = c.in(i);
      size_t chunk = static_cast<size_t>(t.dim(ax) * inner) * es;
      if (chunk)
        for (int64_t o = 0; o < outer; ++o)
          std::memcpy(yp + o * row + off, t.bytes() + o * chunk, chunk);
      off += chunk;
    }
    c.set_out(0, std::move(y));
  };
  return d;
}

std::vector<Value*> decompose_concat(CoreBuilder& b, const Node& n) {
  const int r = static_cast<int>(n.inputs[0]->type.shape.size());
  return {b.concat(n.inputs, normalize_axis(n.attr_i("axis"), r))};
}

// ---- Split -------------------------------------------------------------------------------------

// Sizes of the pieces along the axis; nullopt when they depend on an unknown value.
std::optional<Ints> split_sizes(const Node& n, int64_t dim, const std::optional<Ints>& split,
                                int nout) {
  if (split) {
    if (static_cast<int>(split->size()) != nout)
      fail("split has {} entries for {} outputs", split->size(), nout);
    int64_t sum = 0;
    for (int64_t s : *split) {
      if (s < 0) fail("split has a negative size");
      sum += s;
    }
    if (dim >= 0 && sum != dim) fail("split sizes sum to {} but the axis has {}", sum, dim);
    return split;
  }
  if (dim < 0) return std::nullopt;
  Ints out;
  if (n.has_attr("num_outputs")) {
    int64_t k = n.attr_i("num_outputs");
    if (k != nout) fail("num_outputs is {} but the node has {} outputs", k, nout);
    int64_t chunk = (dim + k - 1) / k;
    for (int64_t i = 0; i < k; ++i)
      out.push_back(std::max<int64_t>(0, std::min(chunk, dim - i * chunk)));
    if (chunk * (k - 1) >= dim && dim > 0) fail("cannot split {} into {} non-empty pieces", dim, k);
  } else {
    if (dim % nout) fail("cannot split an axis of {} into {} equal parts", dim, nout);
    out.assign(nout, dim / nout);
  }
  return out;
}

// split_sizes for an axis of any size: a symbolic one splits into equal pieces when the division is
// exact for every value of the symbols; explicit sizes (static) cannot sum to it.
std::optional<Dims> split_dims(const Node& n, const Dim& dim, const std::optional<Ints>& split, int nout) {
  if (dim.is_static()) {
    auto s = split_sizes(n, dim.constant_term(), split, nout);
    return s ? std::optional<Dims>(dims_of(*s)) : std::nullopt;
  }
  if (n.has_attr("num_outputs") && n.attr_i("num_outputs") != nout)
    fail("num_outputs is {} but the node has {} outputs", n.attr_i("num_outputs"), nout);
  const auto q = split ? std::nullopt : exact_div(dim, Dim(nout));
  if (!q)
    unsupported("Split of an axis of symbolic size {} into {} pieces: {}", dim.str(), nout,
                split ? "static sizes cannot sum to it for every value of the symbols"
                      : "the division is not exact for every value of the symbols");
  return Dims(static_cast<size_t>(nout), *q);
}

OpDef split_op() {
  OpDef d =
      make_op("Split", 1, 2, 13,
              {{"axis", AttrKind::i}, {"num_outputs", AttrKind::i}, {"split", AttrKind::ints}});
  d.max_outputs = 1 << 16;
  d.upgrade = [](Graph& g, Node& n, int opset) {
    if (opset < 2 && n.inputs.size() > 1) unsupported("Split-1 with a split input");
    attr_to_input(g, n, "split", 1);
  };
  d.infer = [](InferCtx& c) {
    reject_attr(c.node(), "split");
    const TensorType& x = c.in(0);
    int r = static_cast<int>(x.shape.size());
    if (r == 0) fail("Split needs an input of rank >= 1, got a scalar");
    int ax = normalize_axis(c.node().attr_i("axis", 0), r);
    std::optional<Ints> split;
    bool unknown = false;
    if (c.has_in(1)) {
      split = known_ints(c, 1);
      unknown = !split;
    }
    const Dims xd = x.dims();
    auto sizes = unknown ? std::nullopt : split_dims(c.node(), xd[ax], split, c.num_outputs());
    for (int i = 0; i < c.num_outputs(); ++i) {
      Dims s = xd;
      s[ax] = sizes ? (*sizes)[i] : Dim(kUnknownDim);
      c.set_out(i, TensorType::of(x.dtype, s));
    }
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    if (x.rank() == 0) fail("Split needs an input of rank >= 1, got a scalar");
    int ax = normalize_axis(c.node().attr_i("axis", 0), x.rank());
    std::optional<Ints> split;
    if (c.has_in(1)) split = tensor_ints(c.in(1));
    Ints sizes = *split_sizes(c.node(), x.dim(ax), split, c.num_outputs());
    Ints st = strides_of(x.shape());
    int64_t start = 0;
    for (int i = 0; i < c.num_outputs(); ++i) {
      Shape s = x.shape();
      s[ax] = sizes[i];
      if (c.wants_out(i)) {
        int64_t base = start;
        c.set_out(i, remap(x, s, [&](const Ints& o) { return flat_of(o, st) + base * st[ax]; }));
      }
      start += sizes[i];
    }
  };
  return d;
}

// One slice per output (the sizes come from the split input or the attributes, so that omitted
// outputs, which have no type, are skipped correctly).
std::vector<Value*> decompose_split(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  const Dims s = x->type.dims();
  const int ax = normalize_axis(n.attr_i("axis", 0), static_cast<int>(s.size()));
  std::optional<Ints> split;
  if (n.has_input(1)) split = tensor_ints(b.need_constant(1, "Split sizes"));
  Dims starts(s.size(), 0), stops = s;
  std::vector<Value*> outs;
  const Dims sizes = *split_dims(n, s[ax], split, static_cast<int>(n.outputs.size()));
  for (const Dim& size : sizes) {
    stops[ax] = starts[ax] + size;
    outs.push_back(b.slice(x, starts, stops));
    starts[ax] = stops[ax];
  }
  return outs;
}

// ---- Slice -------------------------------------------------------------------------------------

// Start, step and count of one axis's slice. Sizes: a symbolic axis, or bounds from shape arithmetic,
// give symbolic starts and counts.
struct SliceAxis {
  Dim start;
  int64_t step;
  Dim count;
};

// One axis of static size `dim` sliced from s to e (ONNX bounds: negative ones count from the end,
// every one is clamped).
SliceAxis static_slice_axis(int64_t dim, int64_t s, int64_t e, int64_t step) {
  if (s < 0) s = s < -dim ? -dim - 1 : s + dim;  // avoid overflow; clamped below anyway
  if (e < 0) e = e < -dim ? -dim - 1 : e + dim;
  int64_t count;
  if (step > 0) {
    s = std::clamp<int64_t>(s, 0, dim);
    e = std::clamp<int64_t>(e, 0, dim);
    count = e > s ? 1 + (e - s - 1) / step : 0;  // rounded up without e - s + step (overflows)
  } else {
    s = std::clamp<int64_t>(s, 0, dim - 1);
    e = std::clamp<int64_t>(e, -1, dim - 1);
    // (s - e) / (-step) rounded up; -step cannot overflow for step > INT64_MIN.
    if (step == std::numeric_limits<int64_t>::min())
      count = s > e ? 1 : 0;
    else
      count = s > e ? 1 + (s - e - 1) / (-step) : 0;
  }
  return {s, step, count};
}

// A bound of a slice along an axis of size `dim`, counted from the end when it is a negative number,
// clamped to [lo, hi] where the symbols decide the clamp. A symbolic bound must be non-negative for
// every value (whether it counts from the end would depend on them).
Dim clamp_slice_bound(Dim v, const Dim& dim, const Dim& lo, const Dim& hi) {
  if (v.is_static()) {
    // No axis reaches 2^40 elements (checked_mul's limit on any tensor): a bound beyond it (INT64_MAX
    // for "to the end", INT64_MIN for "from the start") is past either end for every value.
    const int64_t lim = int64_t{1} << 40, c = v.constant_term();
    if (c >= lim) return hi;
    if (c <= -lim) return lo;
    if (c < 0) v = v + dim;
  } else if (!provably_nonneg(v)) {
    unsupported("Slice bound {} is negative for some values of the symbols (then it would count from the end)",
                v.str());
  }
  if (provably_ge(lo, v)) return lo;
  if (provably_ge(v, hi)) return hi;
  if (provably_ge(v, lo) && provably_ge(hi, v)) return v;
  unsupported("Slice bound {} on an axis of size {}: its clamp to [{}, {}] depends on the symbols", v.str(),
              dim.str(), lo.str(), hi.str());
}

// static_slice_axis for a symbolic axis or symbolic bounds, where the symbols decide every clamp.
SliceAxis symbolic_slice_axis(const Dim& dim, const Dim& start, const Dim& end, int64_t step) {
  if (step == std::numeric_limits<int64_t>::min()) unsupported("Slice step {} over symbolic sizes", step);
  // (the core slice walks a symbolic dim forward only; the symbols' ranges may decide the clamps, not this)
  if (step < 0 && dim.is_symbolic()) unsupported("Slice with step {} over the symbolic axis {}", step, dim.str());
  const std::string what = fmt::format("Slice of an axis of size {}", dim.str());
  if (step > 0) {
    const Dim s = clamp_slice_bound(start, dim, 0, dim), e = clamp_slice_bound(end, dim, 0, dim);
    return {s, step, ceil_count(e - s, step, what)};
  }
  const Dim s = clamp_slice_bound(start, dim, 0, dim - 1), e = clamp_slice_bound(end, dim, -1, dim - 1);
  return {s, step, ceil_count(s - e, -step, what)};
}

// Per-axis start/step/count for data of dims `in`; axes not sliced take everything.
std::vector<SliceAxis> slice_plan(const Dims& in, const Dims& starts, const Dims& ends,
                                  const std::optional<Ints>& axes_in,
                                  const std::optional<Ints>& steps_in) {
  int r = static_cast<int>(in.size());
  size_t n = starts.size();
  if (ends.size() != n) fail("Slice starts and ends have different lengths");
  Ints axes;
  if (axes_in) {
    axes = *axes_in;
    if (axes.size() != n) fail("Slice axes has {} entries for {} starts", axes.size(), n);
  } else {
    for (size_t i = 0; i < n; ++i) axes.push_back(static_cast<int64_t>(i));
  }
  Ints steps = steps_in ? *steps_in : Ints(n, 1);
  if (steps.size() != n) fail("Slice steps has {} entries for {} starts", steps.size(), n);
  // normalize_axis lets axis 0 through for rank 0 (other ops need that); a scalar has no axis to slice.
  if (r == 0 && n > 0) fail("Slice of a scalar (rank 0): there is no axis to slice");
  std::vector<SliceAxis> plan(r);
  std::vector<bool> seen(r, false);
  for (int i = 0; i < r; ++i) plan[i] = {0, 1, in[i]};
  for (size_t i = 0; i < n; ++i) {
    int ax = normalize_axis(axes[i], r);
    if (seen[ax]) fail("Slice repeats axis {}", ax);
    seen[ax] = true;
    const Dim& dim = in[ax];
    const int64_t step = steps[i];
    if (step == 0) fail("Slice step is 0");
    if (dim_unknown(dim))
      plan[ax] = {0, step, kUnknownDim};
    else if (dim.is_static() && starts[i].is_static() && ends[i].is_static())
      plan[ax] = static_slice_axis(dim.constant_term(), starts[i].constant_term(), ends[i].constant_term(), step);
    else
      plan[ax] = symbolic_slice_axis(dim, starts[i], ends[i], step);
  }
  return plan;
}

// A list of sizes sliced (shape[1:], shape[:-2] in exported models): the elements the plan takes.
void slice_sizes(InferCtx& c, const std::vector<SliceAxis>& plan) {
  auto ops = symbolic_operands(c, {0});
  if (!ops || plan.size() != 1 || !plan[0].start.is_static() || !plan[0].count.is_static()) return;
  SymTensor r{c.in(0).dtype, {plan[0].count.constant_term()}, {}};
  for (int64_t k = 0; k < plan[0].count.constant_term(); ++k)
    r.elems.push_back(ops->front().elems[static_cast<size_t>(plan[0].start.constant_term() + k * plan[0].step)]);
  c.set_out_sym_value(0, std::move(r));
}

OpDef slice_op() {
  OpDef d =
      make_op("Slice", 3, 5, 10,
              {{"starts", AttrKind::ints}, {"ends", AttrKind::ints}, {"axes", AttrKind::ints}});
  d.upgrade = [](Graph& g, Node& n, int) {
    if (!n.has_attr("starts") || !n.has_attr("ends")) fail("Slice needs starts and ends");
    attr_to_input(g, n, "starts", 1);
    attr_to_input(g, n, "ends", 2);
    attr_to_input(g, n, "axes", 3);
  };
  d.infer = [](InferCtx& c) {
    for (const char* a : {"starts", "ends", "axes"}) reject_attr(c.node(), a);
    const TensorType& x = c.in(0);
    auto starts = known_dims(c, 1), ends = known_dims(c, 2);
    std::optional<Ints> axes, steps;
    bool known = starts && ends;
    if (c.has_in(3)) known = known && (axes = known_ints(c, 3));
    if (c.has_in(4)) known = known && (steps = known_ints(c, 4));
    if (!known) {
      c.set_out(0, {x.dtype, Shape(x.shape.size(), kUnknownDim)});
      return;
    }
    const auto plan = slice_plan(x.dims(), *starts, *ends, axes, steps);
    Dims s;
    for (const auto& p : plan) s.push_back(p.count);
    c.set_out(0, TensorType::of(x.dtype, s));
    slice_sizes(c, plan);
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    std::optional<Ints> axes, steps;
    if (c.has_in(3)) axes = tensor_ints(c.in(3));
    if (c.has_in(4)) steps = tensor_ints(c.in(4));
    Ints start, step;
    Shape s;
    for (const auto& p : slice_plan(dims_of(x.shape()), dims_of(tensor_ints(c.in(1))), dims_of(tensor_ints(c.in(2))),
                                    axes, steps)) {
      start.push_back(p.start);
      step.push_back(p.step);
      s.push_back(p.count);
    }
    Ints st = strides_of(x.shape());
    c.set_out(0, remap(x, s, [&](const Ints& o) {
                int64_t f = 0;
                for (size_t k = 0; k < o.size(); ++k)
                  f += (start[k] + o[k] * step[k]) * st[k];
                return f;
              }));
  };
  return d;
}

// One core slice; a negative step is a negative stride (stop -1 reaches element 0). A symbolic count
// with a step other than 1 needs at least one element (the stop is computed from the last one).
std::vector<Value*> decompose_slice(CoreBuilder& b, const Node& n) {
  std::optional<Ints> axes, steps;
  if (n.has_input(3)) axes = tensor_ints(b.need_constant(3, "Slice axes"));
  if (n.has_input(4)) steps = tensor_ints(b.need_constant(4, "Slice steps"));
  Value* x = n.inputs[0];
  auto plan = slice_plan(x->type.dims(), b.need_sizes(1, "Slice starts"), b.need_sizes(2, "Slice ends"), axes, steps);
  Dims starts, stops;
  Ints strides;
  for (const SliceAxis& p : plan) {
    if (p.count.is_symbolic() && p.step == 1) {
      starts.push_back(p.start);
      strides.push_back(1);
      stops.push_back(p.start + p.count);
      continue;
    }
    if (p.count.is_symbolic() && !provably_positive(p.count))
      unsupported("Slice with step {} takes {} elements, which is 0 for some values of the symbols", p.step,
                  p.count.str());
    const bool some = p.count.is_symbolic() || p.count.constant_term() > 0;
    const bool many = p.count.is_symbolic() || p.count.constant_term() > 1;
    const int64_t step = many ? p.step : 1;
    const Dim start = some ? p.start : Dim(0);
    starts.push_back(start);
    strides.push_back(step);
    stops.push_back(some ? start + (p.count - 1) * step + (step > 0 ? 1 : -1) : start);
  }
  return {b.slice(x, starts, stops, strides)};
}

// ---- Expand / Tile -----------------------------------------------------------------------------

OpDef expand_op() {
  OpDef d = make_op("Expand", 2, 2, 8);
  d.infer = [](InferCtx& c) {
    const TensorType& x = c.in(0);
    if (auto s = known_dims(c, 1)) {
      for (const Dim& v : *s)
        if (dim_unknown(v)) fail("Expand shape {} has a negative dim", ints_str(*s));
      check_size_entries(*s, 0, "Expand shape");
      c.set_out(0, TensorType::of(x.dtype, broadcast_dims(x.dims(), *s)));
      return;
    }
    const Shape& ss = c.in(1).shape;
    if (ss.size() != 1 || ss[0] < 0) unsupported("Expand to a shape of unknown rank");
    c.set_out(0, {x.dtype, Shape(std::max<int64_t>(ss[0], x.shape.size()), kUnknownDim)});
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    Ints target = tensor_ints(c.in(1));
    for (int64_t v : target)
      if (v < 0) fail("Expand shape {} has a negative dim", ints_str(target));
    Shape out = broadcast_shapes(x.shape(), target);
    Ints bi = broadcast_index(x.shape(), out);
    int64_t i = 0;
    c.set_out(0, remap(x, out, [&](const Ints&) { return bi[i++]; }));
  };
  return d;
}

OpDef tile_op() {
  OpDef d = make_op("Tile", 2, 2, 6);
  auto out_shape = [](const Dims& in, const Ints& rep) {
    if (rep.size() != in.size())
      fail("Tile repeats has {} entries for rank {}", rep.size(), in.size());
    Dims s;
    for (size_t i = 0; i < in.size(); ++i) {
      if (rep[i] < 0) fail("Tile repeat {} is negative", rep[i]);
      s.push_back(dim_unknown(in[i]) ? Dim(kUnknownDim) : checked_mul(in[i], Dim(rep[i])));
    }
    return s;
  };
  d.infer = [out_shape](InferCtx& c) {
    const TensorType& x = c.in(0);
    if (auto r = known_ints(c, 1))
      c.set_out(0, TensorType::of(x.dtype, out_shape(x.dims(), *r)));
    else
      c.set_out(0, {x.dtype, Shape(x.shape.size(), kUnknownDim)});
  };
  d.kernel = [out_shape](KernelCtx& c) {
    const Tensor& x = c.in(0);
    Shape s = static_shape(out_shape(dims_of(x.shape()), tensor_ints(c.in(1))));
    Ints st = strides_of(x.shape());
    c.set_out(0, remap(x, s, [&](const Ints& o) {
                int64_t f = 0;
                for (size_t k = 0; k < o.size(); ++k)
                  f += (o[k] % x.dim(static_cast<int>(k))) * st[k];
                return f;
              }));
  };
  return d;
}

std::vector<Value*> decompose_expand(CoreBuilder& b, const Node& n) {
  return {b.broadcast_to(n.inputs[0], n.outputs[0]->type.dims())};
}

// x [d0, d1, ...] broadcast to [r0, d0, r1, d1, ...] (r = repeats), then merged into [r0*d0, ...].
std::vector<Value*> decompose_tile(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  const Dims in = x->type.dims(), out = n.outputs[0]->type.dims();
  Dims wide;
  Ints dims;
  for (size_t i = 0; i < in.size(); ++i) {
    wide.push_back(in[i] == 0 ? Dim(1) : *exact_div(out[i], in[i]));
    dims.push_back(static_cast<int64_t>(wide.size()));
    wide.push_back(in[i]);
  }
  return {b.reshape(broadcast_into(b, x, wide, dims), out)};
}

// ---- Pad ---------------------------------------------------------------------------------------

// Full per-axis [begin..., end...] pads from the pads input and optional axes.
Ints full_pads(int r, const Ints& pads, const std::optional<Ints>& axes_in) {
  Ints axes;
  if (axes_in)
    axes = *axes_in;
  else
    for (int i = 0; i < r; ++i) axes.push_back(i);
  if (pads.size() != 2 * axes.size())
    fail("pads has {} entries for {} axes", pads.size(), axes.size());
  Ints full(2 * r, 0);
  size_t n = axes.size();
  for (size_t i = 0; i < n; ++i) {
    int ax = normalize_axis(axes[i], r);
    full[ax] = pads[i];
    full[ax + r] = pads[i + n];
  }
  return full;
}

// A symbolic axis may be padded (or cropped by negative pads while the result stays a size for every
// value of the symbols).
Dims pad_shape(const Dims& in, const Ints& full) {
  int r = static_cast<int>(in.size());
  Dims s(r);
  for (int i = 0; i < r; ++i) {
    if (dim_unknown(in[i])) {
      s[i] = kUnknownDim;
      continue;
    }
    if (in[i].is_symbolic()) {
      s[i] = in[i] + full[i] + full[i + r];
      if (!provably_nonneg(s[i]))
        unsupported("pads {} crop the axis of symbolic size {} to {}, negative for some values of the symbols",
                    ints_str(full), in[i].str(), s[i].str());
      continue;
    }
    int64_t v;
    if (__builtin_add_overflow(in[i].constant_term(), full[i], &v) || __builtin_add_overflow(v, full[i + r], &v))
      fail("pads {} overflow", ints_str(full));
    if (v < 0) fail("pads {} remove more than the input {} has", ints_str(full), dims_str(in));
    s[i] = v;
  }
  return s;
}

// Input index for padded position p (already shifted by the begin pad) of an axis of size d.
int64_t pad_source(int64_t p, int64_t d, int mode) {
  if (p >= 0 && p < d) return p;
  switch (mode) {
    case 0:
      return -1;  // constant
    case 1:
      return std::clamp<int64_t>(p, 0, d - 1);  // edge
    case 2: {                                   // reflect, mirrored about the edge elements
      if (d == 1) return 0;
      int64_t period = 2 * (d - 1);
      int64_t m = ((p % period) + period) % period;
      return m < d ? m : period - m;
    }
    default:
      return ((p % d) + d) % d;  // wrap
  }
}

int pad_mode(const Node& n) {
  std::string m = n.attr_s("mode", "constant");
  if (m == "constant") return 0;
  if (m == "edge") return 1;
  if (m == "reflect") return 2;
  if (m == "wrap") return 3;
  fail("unknown Pad mode '{}'", m);
}

// constant: one core pad (negative pads crop); edge, reflect, wrap: per axis, the source positions
// of the padded axis taken with slices and concatenated.
std::vector<Value*> decompose_pad(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  const Dims in = x->type.dims(), out = n.outputs[0]->type.dims();
  const int r = static_cast<int>(in.size()), mode = pad_mode(n);
  std::optional<Ints> axes;
  if (n.has_input(3)) axes = tensor_ints(b.need_constant(3, "Pad axes"));
  Ints full = full_pads(r, tensor_ints(b.need_constant(1, "pads")), axes);
  if (mode == 0) {
    if (std::all_of(full.begin(), full.end(), [](int64_t p) { return p == 0; })) return {x};
    Value* v = n.has_input(2) ? b.reshape(n.inputs[2], {}) : b.scalar(x->type.dtype, 0);
    return {b.emit(CoreOp::pad, {x, v},
                   {{"low", Ints(full.begin(), full.begin() + r)}, {"high", Ints(full.begin() + r, full.end())}})};
  }
  Value* y = x;
  for (int k = 0; k < r; ++k) {
    if (full[k] == 0 && full[k + r] == 0) continue;
    if (in[k].is_symbolic())
      unsupported("{} padding of the axis of symbolic size {}: the source positions depend on its value",
                  n.attr_s("mode"), in[k].str());
    if (in[k] == 0 && out[k] > 0) fail("cannot {} pad an empty axis", n.attr_s("mode"));
    Ints idx;
    for (int64_t o = 0; o < out[k]; ++o) idx.push_back(pad_source(o - full[k], in[k], mode));
    y = take_along_axis(b, y, k, idx);
  }
  return {y};
}

OpDef pad_op() {
  OpDef d = make_op("Pad", 2, 4, 11,
                    {{"mode", AttrKind::s}, {"pads", AttrKind::ints}, {"value", AttrKind::f}});
  d.upgrade = [](Graph& g, Node& n, int opset) {
    if (opset < 2) unsupported("Pad-1 (paddings attribute)");
    if (!n.has_attr("pads")) fail("Pad needs pads");
    double v = n.attr_f("value", 0.0);
    n.attrs.erase("value");
    attr_to_input(g, n, "pads", 1);
    if (v != 0.0) {
      DType dt = n.inputs[0]->type.dtype;
      n.inputs.resize(3, nullptr);
      n.inputs[2] = g.add_constant(g.unique_name(n.name + "_value"), Tensor::scalar_f(dt, v));
    }
  };
  auto mode_of = pad_mode;
  d.infer = [mode_of](InferCtx& c) {
    reject_attr(c.node(), "pads");
    reject_attr(c.node(), "value");
    mode_of(c.node());
    const TensorType& x = c.in(0);
    if (c.has_in(2) && c.in(2).dtype != x.dtype)
      fail("Pad constant_value has dtype {} for data {}", dtype_name(c.in(2).dtype),
           dtype_name(x.dtype));
    int r = static_cast<int>(x.shape.size());
    auto pads = known_ints(c, 1);
    std::optional<Ints> axes;
    bool known = pads.has_value();
    if (c.has_in(3)) known = known && (axes = known_ints(c, 3));
    if (!known) {
      c.set_out(0, {x.dtype, Shape(r, kUnknownDim)});
      return;
    }
    const Ints full = full_pads(r, *pads, axes);
    // The decomposition's refusal, at inference (docs/dynamic-shapes.md): the source positions of an
    // edge, reflect or wrap pad depend on the axis's size.
    const Dims in = x.dims();
    for (int k = 0; k < r; ++k)
      if (mode_of(c.node()) != 0 && (full[k] != 0 || full[k + r] != 0) && in[k].is_symbolic())
        unsupported("{} padding of the axis of symbolic size {}: the source positions depend on its value",
                    c.node().attr_s("mode"), in[k].str());
    c.set_out(0, TensorType::of(x.dtype, pad_shape(in, full)));
  };
  d.kernel = [mode_of](KernelCtx& c) {
    const Tensor& x = c.in(0);
    int r = x.rank();
    int mode = mode_of(c.node());
    std::optional<Ints> axes;
    if (c.has_in(3)) axes = tensor_ints(c.in(3));
    Ints full = full_pads(r, tensor_ints(c.in(1)), axes);
    Shape s = static_shape(pad_shape(dims_of(x.shape()), full));
    Tensor fill(x.dtype(), {1});
    if (c.has_in(2)) {
      const Tensor& v = c.in(2);
      if (v.numel() != 1) fail("Pad constant_value must have one element");
      if (v.dtype() != x.dtype()) fail("Pad constant_value dtype differs from data");
      std::memcpy(fill.bytes(), v.bytes(), static_cast<size_t>(dtype_size(x.dtype())));
    }
    for (int i = 0; i < r; ++i)
      if (mode != 0 && x.dim(i) == 0 && s[i] > 0)
        fail("cannot {} pad an empty axis", c.node().attr_s("mode"));
    Ints st = strides_of(x.shape());
    c.set_out(0, remap(
                     x, s,
                     [&](const Ints& o) {
                       int64_t f = 0;
                       for (int k = 0; k < r; ++k) {
                         int64_t src = pad_source(o[k] - full[k], x.dim(k), mode);
                         if (src < 0) return int64_t{-1};
                         f += src * st[k];
                       }
                       return f;
                     },
                     fill.bytes()));
  };
  return d;
}

// ---- Shape / Size ------------------------------------------------------------------------------

OpDef shape_op() {
  OpDef d = make_op("Shape", 1, 1, 1, {{"start", AttrKind::i}, {"end", AttrKind::i}});
  d.infer = [](InferCtx& c) {
    const Dims in = c.in(0).dims();
    auto [s, e] = shape_range(c.node(), static_cast<int64_t>(in.size()));
    Dims v(in.begin() + s, in.begin() + e);
    if (!dims_unknown(v))
      c.set_out_sym_value(0, SymTensor{DType::i64, {e - s}, v});  // a plain value when every dim is static
    else
      c.set_out(0, {DType::i64, {e - s}});
  };
  d.kernel = [](KernelCtx& c) {
    const Shape& in = c.in(0).shape();
    auto [s, e] = shape_range(c.node(), static_cast<int64_t>(in.size()));
    c.set_out(0, i64_vector(Ints(in.begin() + s, in.begin() + e)));
  };
  d.cost = [](const Node&) { return Cost{}; };
  return d;
}

// Sizes (domain tessel): an integer tensor of a static shape whose elements are sizes, some of them
// symbolic (docs/dynamic-shapes.md). fold-constants puts one in place of shape arithmetic that
// computes from symbolic sizes (Shape -> Gather -> Concat), so that the ops reading it (Reshape,
// Expand, ConstantOfShape, Range) see the sizes, and their decompositions read them through
// CoreBuilder::known_sizes. Read as data (not as a shape: `torch.arange(q) + past_length` in a causal
// mask), a symbolic size becomes a value computed at run time (CoreBuilder::size_value). Once the
// symbols are bound (instantiate_graph) it is a plain constant.
OpDef sizes_op() {
  OpDef d = make_op("Sizes", 0, 0, 1, {{"dims", AttrKind::ints}, {"shape", AttrKind::ints}, {"dtype", AttrKind::s}});
  d.domain = "tessel";
  d.symbolic = true;
  auto facts = [](const Node& n) {
    SymTensor t;
    const std::string dt = n.attr_s("dtype", "i64");
    const auto parsed = dtype_from_name(dt);
    if (!parsed || (*parsed != DType::i64 && *parsed != DType::i32)) fail("Sizes: dtype must be i64 or i32, got '{}'", dt);
    t.dtype = *parsed;
    t.elems = n.attr_dims("dims");
    t.shape = n.attr_ints("shape", {static_cast<int64_t>(t.elems.size())});
    if (t.shape.size() > 1 || !shape_known(t.shape) || shape_numel(t.shape) != static_cast<int64_t>(t.elems.size()))
      fail("Sizes: shape {} does not hold {} elements as a list", shape_str(t.shape), t.elems.size());
    return t;
  };
  d.infer = [facts](InferCtx& c) { c.set_out_sym_value(0, facts(c.node())); };
  d.kernel = [facts](KernelCtx& c) {
    const SymTensor t = facts(c.node());
    if (!t.all_static()) fail("Sizes {} names size symbols that have no value here (bind them first)", t.str());
    Tensor v(t.dtype, t.shape);
    for (size_t k = 0; k < t.elems.size(); ++k) v.set_i(static_cast<int64_t>(k), t.elems[k].constant_term());
    c.set_out(0, std::move(v));
  };
  d.decompose = [facts](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    const SymTensor t = facts(n);
    if (!t.all_static()) {
      if (t.shape.empty()) return {b.size_value(t.elems.at(0), t.dtype)};
      std::vector<Value*> parts;
      for (const Dim& e : t.elems) parts.push_back(b.reshape(b.size_value(e, t.dtype), {1}));
      return {parts.size() == 1 ? parts[0] : b.concat(parts, 0)};
    }
    Tensor v(t.dtype, t.shape);
    for (size_t k = 0; k < t.elems.size(); ++k) v.set_i(static_cast<int64_t>(k), t.elems[k].constant_term());
    return {b.constant(std::move(v))};
  };
  d.cost = [](const Node&) { return Cost{}; };
  return d;
}

OpDef size_op() {
  OpDef d = make_op("Size", 1, 1, 1);
  d.infer = [](InferCtx& c) {
    const Dim n = numel_or_unknown(c.in(0).dims());
    if (!dim_unknown(n))
      c.set_out_sym_value(0, SymTensor{DType::i64, {}, {n}});
    else
      c.set_out(0, {DType::i64, {}});
  };
  d.kernel = [](KernelCtx& c) { c.set_out(0, Tensor::scalar_i(DType::i64, c.in(0).numel())); };
  d.cost = [](const Node&) { return Cost{}; };
  return d;
}

// The value is known from the static input shape. Symbolic sizes read as data (not folded into a
// Sizes node that a shape operand reads) have no core form.
void need_static_sizes(const char* op, const Dims& in, const Dims& read) {
  if (dims_unknown(read)) unsupported("{} of {}, which has unknown dims", op, dims_str(in));
  if (!dims_static(read))
    unsupported("{} of {} is read as data: a symbolic size has no core form as a value", op, dims_str(in));
}

std::vector<Value*> decompose_shape(CoreBuilder& b, const Node& n) {
  const Dims in = n.inputs[0]->type.dims();
  auto [s, e] = shape_range(n, static_cast<int64_t>(in.size()));
  const Dims v(in.begin() + s, in.begin() + e);
  need_static_sizes("Shape", in, v);
  return {b.constant(i64_vector(static_shape(v)))};
}

std::vector<Value*> decompose_size(CoreBuilder& b, const Node& n) {
  const Dims in = n.inputs[0]->type.dims();
  const Dim numel = numel_or_unknown(in);
  need_static_sizes("Size", in, {numel});
  return {b.constant(Tensor::scalar_i(DType::i64, numel))};
}

// ---- ConstantOfShape / Range / EyeLike / Trilu -------------------------------------------------

Dims cos_shape(const Dims& v) {
  for (const Dim& x : v)
    if (dim_unknown(x)) fail("ConstantOfShape shape {} has a negative dim", ints_str(v));
  check_size_entries(v, 0, "ConstantOfShape shape");
  return v;
}

Tensor cos_fill(const Node& n) {
  if (!n.has_attr("value")) return Tensor(DType::f32, {1});
  const Tensor& v = n.attr_t("value");
  if (v.numel() != 1) fail("ConstantOfShape value must have exactly one element");
  return v;
}

OpDef constant_of_shape_op() {
  OpDef d = make_op("ConstantOfShape", 1, 1, 9, {{"value", AttrKind::tensor}});
  d.infer = [](InferCtx& c) {
    DType dt = cos_fill(c.node()).dtype();
    if (auto v = known_dims(c, 0)) {
      c.set_out(0, TensorType::of(dt, cos_shape(*v)));
      return;
    }
    const Shape& ss = c.in(0).shape;
    if (ss.size() != 1 || ss[0] < 0) unsupported("ConstantOfShape with a shape of unknown length");
    c.set_out(0, {dt, Shape(ss[0], kUnknownDim)});
  };
  d.kernel = [](KernelCtx& c) {
    Tensor v = cos_fill(c.node());
    Shape s = static_shape(cos_shape(dims_of(tensor_ints(c.in(0)))));
    int64_t n = shape_numel(s);
    if (n > (int64_t{1} << 34)) fail("ConstantOfShape output of {} elements is too large", n);
    c.set_out(0, remap(v, s, [](const Ints&) { return int64_t{0}; }));
  };
  return d;
}

std::vector<Value*> decompose_constant_of_shape(CoreBuilder& b, const Node& n) {
  return {b.broadcast_to(b.constant(cos_fill(n).reshaped({})), n.outputs[0]->type.dims())};
}

int64_t range_count(const Tensor& s, const Tensor& l, const Tensor& dl) {
  if (s.numel() != 1 || l.numel() != 1 || dl.numel() != 1) fail("Range inputs must be scalars");
  double n;
  if (is_float(s.dtype())) {
    double d = dl.get_f(0);
    if (d == 0) fail("Range delta is 0");
    n = std::ceil((l.get_f(0) - s.get_f(0)) / d);
    if (!std::isfinite(n)) fail("Range is infinite");
  } else {
    int64_t d = dl.get_i(0), a = s.get_i(0), b = l.get_i(0);
    if (d == 0) fail("Range delta is 0");
    // Exact ceil division on integers (avoids rounding through double for large ranges).
    __int128 diff = static_cast<__int128>(b) - a;
    __int128 q = diff / d;
    if ((diff % d != 0) && ((diff > 0) == (d > 0))) ++q;
    n = static_cast<double>(q);
  }
  if (n > static_cast<double>(int64_t{1} << 34)) fail("Range has too many elements");
  return std::max<int64_t>(0, static_cast<int64_t>(n));
}

// The length of a Range over sizes (Range(0, seq, 1) in exported models): integer start and limit, one
// of them symbolic, and a static delta, when the symbols decide it.
std::optional<Dim> symbolic_range_count(const InferCtx& c) {
  auto ops = symbolic_operands(c, {0, 1, 2});
  if (!ops) return std::nullopt;
  for (const SymTensor& o : *ops)
    if (o.elems.size() != 1) fail("Range inputs must be scalars");
  const Dim &start = (*ops)[0].elems[0], &limit = (*ops)[1].elems[0], &delta = (*ops)[2].elems[0];
  if (!delta.is_static() || delta.constant_term() == std::numeric_limits<int64_t>::min())
    unsupported("Range with delta {} over symbolic sizes", delta.str());
  const int64_t dl = delta.constant_term();
  if (dl == 0) fail("Range delta is 0");
  return dl > 0 ? ceil_count(limit - start, dl, "Range") : ceil_count(start - limit, -dl, "Range");
}

OpDef range_op() {
  OpDef d = make_op("Range", 3, 3, 11);
  d.infer = [](InferCtx& c) {
    DType dt = c.in(0).dtype;
    if (c.in(1).dtype != dt || c.in(2).dtype != dt) fail("Range inputs must share one dtype");
    const Tensor *a = c.value(0), *b = c.value(1), *e = c.value(2);
    if (a && b && e)
      c.set_out(0, {dt, {range_count(*a, *b, *e)}});
    else if (auto n = symbolic_range_count(c))
      c.set_out(0, TensorType::of(dt, {*n}));
    else
      c.set_out(0, {dt, {kUnknownDim}});
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor &s = c.in(0), &dl = c.in(2);
    int64_t n = range_count(s, c.in(1), dl);
    Tensor y(s.dtype(), {n});
    if (is_float(s.dtype())) {
      // Accumulate in the element type, as a running sum: out[i] = out[i-1] + delta.
      double v = s.get_f(0), d = dl.get_f(0);
      for (int64_t i = 0; i < n; ++i) {
        y.set_f(i, v);
        v = y.get_f(i) + d;
      }
    } else {
      int64_t v = s.get_i(0), d = dl.get_i(0);
      for (int64_t i = 0; i < n; ++i) y.set_i(i, v + i * d);
    }
    c.set_out(0, std::move(y));
  };
  return d;
}

// start + iota * delta (start and delta may be run-time scalars, a symbolic start a size computed at
// run time by its Sizes node; the length is static or symbolic).
std::vector<Value*> decompose_range(CoreBuilder& b, const Node& n) {
  const TensorType& t = n.outputs[0]->type;
  Value* iota = b.iota(t.dtype, t.dims(), 0);
  return {b.add(b.mul(iota, b.reshape(n.inputs[2], {})), b.reshape(n.inputs[0], {}))};
}

Value* i64_scalar(CoreBuilder& b, int64_t v) { return b.constant(Tensor::scalar_i(DType::i64, v)); }

// col - row over a [rows, cols] grid (i64).
Value* diagonal_offset(CoreBuilder& b, const DimList& rows_cols) {
  return b.sub(b.iota(DType::i64, rows_cols, 1), b.iota(DType::i64, rows_cols, 0));
}

DType eyelike_dtype(const Node& n, DType in) {
  if (!n.has_attr("dtype")) return in;
  auto dt = dtype_from_onnx(static_cast<int>(n.attr_i("dtype")));
  if (!dt) unsupported("EyeLike dtype {} is not supported", n.attr_i("dtype"));
  return *dt;
}

OpDef eyelike_op() {
  OpDef d = make_op("EyeLike", 1, 1, 9, {{"dtype", AttrKind::i}, {"k", AttrKind::i}});
  d.infer = [](InferCtx& c) {
    const TensorType& x = c.in(0);
    if (x.shape.size() != 2) fail("EyeLike needs a 2-D input, got {}", x.str());
    c.set_out(0, with_dtype(x, eyelike_dtype(c.node(), x.dtype)));
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    if (x.rank() != 2) fail("EyeLike needs a 2-D input");
    Tensor y(eyelike_dtype(c.node(), x.dtype()), x.shape());
    int64_t k = c.node().attr_i("k", 0);
    for (int64_t i = 0; i < x.dim(0); ++i) {
      int64_t j = i + k;
      if (j >= 0 && j < x.dim(1)) y.set_i(i * x.dim(1) + j, 1);
    }
    c.set_out(0, std::move(y));
  };
  return d;
}

std::vector<Value*> decompose_eyelike(CoreBuilder& b, const Node& n) {
  const TensorType& t = n.outputs[0]->type;
  Value* on = b.compare("eq", diagonal_offset(b, t.dims()), i64_scalar(b, n.attr_i("k", 0)));
  return {b.convert(on, t.dtype)};
}

// x where col - row >= k (upper) or <= k (lower), else 0; k may be a run-time scalar.
std::vector<Value*> decompose_trilu(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  const Dims s = x->type.dims();
  Value* k = n.has_input(1) ? b.reshape(b.convert(n.inputs[1], DType::i64), {}) : i64_scalar(b, 0);
  Value* diag = diagonal_offset(b, Dims(s.end() - 2, s.end()));
  Value* keep = b.compare(n.attr_i("upper", 1) ? "ge" : "le", diag, k);
  return {b.select(keep, x, b.full(x->type.dtype, s, 0))};
}

OpDef trilu_op() {
  OpDef d = make_op("Trilu", 1, 2, 14, {{"upper", AttrKind::i}});
  d.infer = [](InferCtx& c) {
    if (c.in(0).shape.size() < 2) fail("Trilu needs rank >= 2, got {}", c.in(0).str());
    infer_same_as_input(c);
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    if (x.rank() < 2) fail("Trilu needs rank >= 2");
    int64_t k = 0;
    if (c.has_in(1)) {
      if (c.in(1).numel() != 1) fail("Trilu k must be a scalar");
      k = c.in(1).get_i(0);
    }
    bool upper = c.node().attr_i("upper", 1) != 0;
    int64_t rows = x.dim(x.rank() - 2), cols = x.dim(x.rank() - 1);
    int64_t i = 0;
    c.set_out(0, remap(
                     x, x.shape(),
                     [&](const Ints&) {
                       int64_t f = i++;
                       int64_t rr = (f / cols) % rows, cc = f % cols;
                       bool keep = upper ? (cc - rr >= k) : (cc - rr <= k);
                       return keep ? f : int64_t{-1};
                     },
                     Tensor(x.dtype(), {1}).bytes()));
  };
  return d;
}

// ---- DepthToSpace / SpaceToDepth ---------------------------------------------------------------

OpDef depth_space_op(bool to_space) {
  std::vector<AttrSpec> attrs = {{"blocksize", AttrKind::i, true}};
  if (to_space) attrs.push_back({"mode", AttrKind::s});
  OpDef d = make_op(to_space ? "DepthToSpace" : "SpaceToDepth", 1, 1, 1, attrs);
  auto out_shape = [to_space](const Node& n, const Shape& in) {
    if (in.size() != 4) fail("{} needs a 4-D input, got {}", n.op_name(), shape_str(in));
    int64_t b = n.attr_i("blocksize");
    if (b <= 0 || b > (1 << 20)) fail("blocksize {} is out of range", b);
    std::string m = n.attr_s("mode", "DCR");
    if (m != "DCR" && m != "CRD") fail("unknown DepthToSpace mode '{}'", m);
    Shape s = in;
    auto scale = [&](int64_t v, bool mul) { return v < 0 ? kUnknownDim : mul ? v * b : v / b; };
    if (to_space) {
      if (in[1] >= 0 && in[1] % (b * b)) fail("channels {} not divisible by blocksize^2", in[1]);
      s[1] = in[1] < 0 ? kUnknownDim : in[1] / (b * b);
      s[2] = scale(in[2], true);
      s[3] = scale(in[3], true);
    } else {
      if ((in[2] >= 0 && in[2] % b) || (in[3] >= 0 && in[3] % b))
        fail("spatial dims {} not divisible by blocksize", shape_str(in));
      s[1] = in[1] < 0 ? kUnknownDim : in[1] * b * b;
      s[2] = scale(in[2], false);
      s[3] = scale(in[3], false);
    }
    return s;
  };
  d.infer = [out_shape](InferCtx& c) {
    c.set_out(0, {c.in(0).dtype, out_shape(c.node(), c.in(0).shape)});
  };
  d.kernel = [out_shape, to_space](KernelCtx& c) {
    const Tensor& x = c.in(0);
    Shape s = out_shape(c.node(), x.shape());
    int64_t b = c.node().attr_i("blocksize");
    bool crd = c.node().attr_s("mode", "DCR") == "CRD";
    Ints st = strides_of(x.shape());
    c.set_out(0, remap(x, s, [&](const Ints& o) {
                if (to_space) {
                  int64_t i = o[2] % b, j = o[3] % b;
                  int64_t ch = crd ? o[1] * b * b + i * b + j : (i * b + j) * s[1] + o[1];
                  return o[0] * st[0] + ch * st[1] + (o[2] / b) * st[2] + (o[3] / b) * st[3];
                }
                int64_t cin = x.dim(1);
                int64_t blk = o[1] / cin, ch = o[1] % cin;
                int64_t i = blk / b, j = blk % b;
                return o[0] * st[0] + ch * st[1] + (o[2] * b + i) * st[2] + (o[3] * b + j) * st[3];
              }));
  };
  return d;
}

// reshape (split the channels or the spatial dims into blocks), transpose, reshape.
DecomposeFn decompose_depth_space(bool to_space) {
  return [to_space](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    Value* x = n.inputs[0];
    const Shape& s = x->type.shape;
    const int64_t k = n.attr_i("blocksize"), N = s[0], C = s[1], H = s[2], W = s[3];
    Value* y;
    if (!to_space)
      y = b.transpose(b.reshape(x, {N, C, H / k, k, W / k, k}), {0, 3, 5, 1, 2, 4});
    else if (n.attr_s("mode", "DCR") == "CRD")
      y = b.transpose(b.reshape(x, {N, C / (k * k), k, k, H, W}), {0, 1, 4, 2, 5, 3});
    else
      y = b.transpose(b.reshape(x, {N, k, k, C / (k * k), H, W}), {0, 3, 4, 1, 5, 2});
    return {b.reshape(y, n.outputs[0]->type.shape)};
  };
}

// ---- CenterCropPad / ReverseSequence -----------------------------------------------------------

Ints ccp_axes(const Node& n, int r, size_t nshape) {
  Ints axes;
  if (n.has_attr("axes")) {
    for (int64_t a : n.attr_ints("axes")) axes.push_back(normalize_axis(a, r));
  } else {
    for (int i = 0; i < r; ++i) axes.push_back(i);
  }
  if (axes.size() != nshape)
    fail("CenterCropPad shape has {} entries for {} axes", nshape, axes.size());
  return axes;
}

OpDef center_crop_pad_op() {
  OpDef d = make_op("CenterCropPad", 2, 2, 18, {{"axes", AttrKind::ints}});
  d.infer = [](InferCtx& c) {
    const TensorType& x = c.in(0);
    int r = static_cast<int>(x.shape.size());
    auto v = known_ints(c, 1);
    if (!v) {
      c.set_out(0, {x.dtype, Shape(r, kUnknownDim)});
      return;
    }
    Ints axes = ccp_axes(c.node(), r, v->size());
    Shape s = x.shape;
    for (size_t i = 0; i < axes.size(); ++i) {
      if ((*v)[i] < 0) fail("CenterCropPad target size is negative");
      s[axes[i]] = (*v)[i];
    }
    c.set_out(0, {x.dtype, s});
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    int r = x.rank();
    Ints v = tensor_ints(c.in(1));
    Ints axes = ccp_axes(c.node(), r, v.size());
    Shape s = x.shape();
    Ints shift(r, 0);  // input index = output index + shift
    for (size_t i = 0; i < axes.size(); ++i) {
      int64_t ax = axes[i], din = x.dim(static_cast<int>(ax)), dout = v[i];
      if (dout < 0) fail("CenterCropPad target size is negative");
      s[ax] = dout;
      shift[ax] = din >= dout ? (din - dout) / 2 : -((dout - din) / 2);
    }
    Ints st = strides_of(x.shape());
    Tensor zero(x.dtype(), {1});
    c.set_out(0, remap(
                     x, s,
                     [&](const Ints& o) {
                       int64_t f = 0;
                       for (int k = 0; k < r; ++k) {
                         int64_t p = o[k] + shift[k];
                         if (p < 0 || p >= x.dim(k)) return int64_t{-1};
                         f += p * st[k];
                       }
                       return f;
                     },
                     zero.bytes()));
  };
  return d;
}

// One core pad of zeros: negative low/high crop.
std::vector<Value*> decompose_center_crop_pad(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  const Shape &in = x->type.shape, &out = n.outputs[0]->type.shape;
  Ints low, high;
  for (size_t k = 0; k < in.size(); ++k) {
    const int64_t shift = in[k] >= out[k] ? (in[k] - out[k]) / 2 : -((out[k] - in[k]) / 2);
    low.push_back(-shift);
    high.push_back(out[k] - in[k] + shift);
  }
  return {b.emit(CoreOp::pad, {x, b.scalar(x->type.dtype, 0)}, {{"low", low}, {"high", high}})};
}

// A gather along the time axis: position t of sequence b reads len[b]-1-t when t < len[b], else t.
std::vector<Value*> decompose_reverse_sequence(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  const Shape& s = x->type.shape;
  const int r = static_cast<int>(s.size());
  const int ba = normalize_axis(n.attr_i("batch_axis", 1), r), ta = normalize_axis(n.attr_i("time_axis", 0), r);
  const Shape tb = {s[0], s[1]};
  Value* t = b.iota(DType::i64, tb, ta);
  Value* len = broadcast_into(b, b.convert(n.inputs[1], DType::i64), tb, {ba});
  Value* rev = b.sub(b.sub(len, i64_scalar(b, 1)), t);
  Value* idx = b.select(b.compare("lt", t, len), rev, t);
  return {b.emit(CoreOp::gather, {x, broadcast_into(b, idx, s, {0, 1})}, {{"axis", int64_t{ta}}})};
}

OpDef reverse_sequence_op() {
  OpDef d = make_op("ReverseSequence", 2, 2, 10,
                    {{"batch_axis", AttrKind::i}, {"time_axis", AttrKind::i}});
  d.infer = [](InferCtx& c) {
    int r = static_cast<int>(c.in(0).shape.size());
    if (r < 2) fail("ReverseSequence needs rank >= 2");
    int b = normalize_axis(c.node().attr_i("batch_axis", 1), r),
        t = normalize_axis(c.node().attr_i("time_axis", 0), r);
    if (b == t || b > 1 || t > 1) fail("ReverseSequence batch_axis/time_axis must be 0 and 1");
    infer_same_as_input(c);
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    int r = x.rank();
    int b = normalize_axis(c.node().attr_i("batch_axis", 1), r),
        t = normalize_axis(c.node().attr_i("time_axis", 0), r);
    Ints lens = tensor_ints(c.in(1));
    if (static_cast<int64_t>(lens.size()) != x.dim(b))
      fail("sequence_lens has {} entries for batch {}", lens.size(), x.dim(b));
    for (int64_t l : lens)
      if (l < 0 || l > x.dim(t)) fail("sequence length {} is out of range [0, {}]", l, x.dim(t));
    Ints st = strides_of(x.shape());
    c.set_out(0, remap(x, x.shape(), [&](const Ints& o) {
                int64_t f = flat_of(o, st);
                int64_t len = lens[o[b]], tt = o[t];
                if (tt < len) f += (len - 1 - 2 * tt) * st[t];
                return f;
              }));
  };
  return d;
}

// ---- Resize / Upsample -------------------------------------------------------------------------

struct ResizeAttrs {
  std::string mode = "nearest";
  std::string coord = "half_pixel";
  std::string nearest = "round_prefer_floor";
  std::string policy = "stretch";
  double cubic_a = -0.75;
  bool exclude_outside = false;
  bool antialias = false;
  double extrapolation = 0.0;
};

ResizeAttrs resize_attrs(const Node& n) {
  ResizeAttrs a;
  a.mode = n.attr_s("mode", "nearest");
  if (a.mode == "bilinear" || a.mode == "trilinear") a.mode = "linear";
  a.coord = n.attr_s("coordinate_transformation_mode", "half_pixel");
  a.nearest = n.attr_s("nearest_mode", "round_prefer_floor");
  a.policy = n.attr_s("keep_aspect_ratio_policy", "stretch");
  a.cubic_a = n.attr_f("cubic_coeff_a", -0.75);
  a.exclude_outside = n.attr_i("exclude_outside", 0) != 0;
  a.antialias = n.attr_i("antialias", 0) != 0;
  a.extrapolation = n.attr_f("extrapolation_value", 0.0);
  if (a.mode != "nearest" && a.mode != "linear" && a.mode != "cubic")
    fail("unknown Resize mode '{}'", a.mode);
  static const char* coords[] = {
      "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",  "align_corners",
      "asymmetric", "tf_crop_and_resize",   "tf_half_pixel_for_nn"};
  if (std::find(std::begin(coords), std::end(coords), a.coord) == std::end(coords))
    fail("unknown coordinate_transformation_mode '{}'", a.coord);
  // "simple" is not an ONNX value: upgrade() sets it for Resize-10/Upsample, whose nearest
  // neighbour truncates when upsampling and rounds up when downsampling (as ONNX Runtime does).
  static const char* nm[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple"};
  if (std::find(std::begin(nm), std::end(nm), a.nearest) == std::end(nm))
    fail("unknown nearest_mode '{}'", a.nearest);
  if (a.policy != "stretch" && a.policy != "not_larger" && a.policy != "not_smaller")
    fail("unknown keep_aspect_ratio_policy '{}'", a.policy);
  return a;
}

// The resolved geometry: per-axis output size, scale, and roi (start, end) over all axes.
struct ResizePlan {
  Shape out;
  std::vector<double> scale, roi_start, roi_end;
};

// Builds the plan from the data shape and the (possibly absent or empty) roi/scales/sizes values.
// Returns nullopt if neither scales nor sizes is usable yet (unknown values).
ResizePlan resize_plan(const Node& n, const ResizeAttrs& a, const Shape& in,
                       const std::optional<std::vector<double>>& roi,
                       const std::optional<std::vector<double>>& scales,
                       const std::optional<Ints>& sizes) {
  int r = static_cast<int>(in.size());
  Ints axes;
  if (n.has_attr("axes")) {
    std::vector<bool> seen(r, false);
    for (int64_t ax : n.attr_ints("axes")) {
      int k = normalize_axis(ax, r);
      if (seen[k]) fail("Resize axes repeat {}", k);
      seen[k] = true;
      axes.push_back(k);
    }
  } else {
    for (int i = 0; i < r; ++i) axes.push_back(i);
  }
  size_t na = axes.size();
  ResizePlan p;
  p.out = in;
  p.scale.assign(r, 1.0);
  p.roi_start.assign(r, 0.0);
  p.roi_end.assign(r, 1.0);
  if (roi && !roi->empty() && a.coord == "tf_crop_and_resize") {
    if (roi->size() != 2 * na) fail("roi has {} entries for {} axes", roi->size(), na);
    for (size_t i = 0; i < na; ++i) {
      p.roi_start[axes[i]] = (*roi)[i];
      p.roi_end[axes[i]] = (*roi)[i + na];
    }
  }
  bool have_scales = scales && !scales->empty();
  bool have_sizes = sizes && !sizes->empty();
  if (have_scales == have_sizes) fail("Resize needs exactly one of scales and sizes");
  if (have_scales) {
    if (scales->size() != na) fail("scales has {} entries for {} axes", scales->size(), na);
    for (size_t i = 0; i < na; ++i) {
      int ax = static_cast<int>(axes[i]);
      double s = (*scales)[i];
      if (!(s > 0) || !std::isfinite(s)) fail("Resize scale {} is not a positive finite number", s);
      p.scale[ax] = s;
      if (in[ax] >= 0)
        p.out[ax] =
            static_cast<int64_t>(std::floor(in[ax] * (p.roi_end[ax] - p.roi_start[ax]) * s));
    }
  } else {
    if (sizes->size() != na) fail("sizes has {} entries for {} axes", sizes->size(), na);
    for (int64_t s : *sizes)
      if (s < 0) fail("Resize size {} is negative", s);
    if (a.policy == "stretch") {
      for (size_t i = 0; i < na; ++i) {
        int ax = static_cast<int>(axes[i]);
        p.out[ax] = (*sizes)[i];
        if (in[ax] > 0)
          p.scale[ax] = static_cast<double>((*sizes)[i]) / static_cast<double>(in[ax]);
      }
    } else {
      bool known = true;
      double sc = a.policy == "not_larger" ? std::numeric_limits<double>::infinity() : 0.0;
      for (size_t i = 0; i < na; ++i) {
        int64_t d = in[axes[i]];
        if (d <= 0) {
          known = false;
          continue;
        }
        double q = static_cast<double>((*sizes)[i]) / static_cast<double>(d);
        sc = a.policy == "not_larger" ? std::min(sc, q) : std::max(sc, q);
      }
      for (size_t i = 0; i < na; ++i) {
        int ax = static_cast<int>(axes[i]);
        if (!known) {
          p.out[ax] = kUnknownDim;
          continue;
        }
        p.scale[ax] = sc;
        p.out[ax] = static_cast<int64_t>(std::floor(sc * static_cast<double>(in[ax]) + 0.5));
      }
    }
  }
  return p;
}

// Maps an output coordinate to the input coordinate along one axis.
double resize_coord(const ResizeAttrs& a, double x, double scale, int64_t in_len, int64_t out_len,
                    double rs, double re) {
  const std::string& m = a.coord;
  if (m == "half_pixel") return (x + 0.5) / scale - 0.5;
  if (m == "half_pixel_symmetric") {
    double adj = static_cast<double>(out_len) / (scale * static_cast<double>(in_len));
    double center = static_cast<double>(in_len) / 2.0;
    double offset = center * (1.0 - adj);
    return offset + (x + 0.5) / scale - 0.5;
  }
  if (m == "pytorch_half_pixel") return out_len > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
  if (m == "align_corners") {
    // The resized length here is the unrounded in_len * scale, as the ONNX reference computes it.
    double len = static_cast<double>(in_len) * scale;
    return out_len == 1 || len <= 1 ? 0.0 : x * static_cast<double>(in_len - 1) / (len - 1);
  }
  if (m == "asymmetric") return x / scale;
  if (m == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  // tf_crop_and_resize
  double L = static_cast<double>(in_len - 1);
  if (out_len > 1) return rs * L + x * (re - rs) * L / static_cast<double>(out_len - 1);
  return 0.5 * (rs + re) * L;
}

double cubic_weight(double d, double A) {
  d = std::fabs(d);
  if (d <= 1) return ((A + 2) * d - (A + 3)) * d * d + 1;
  if (d < 2) return ((A * d - 5 * A) * d + 8 * A) * d - 4 * A;
  return 0;
}

struct Tap {
  int64_t index;
  double weight;
};

// Interpolation taps along one axis for output position x; empty means "extrapolate".
std::vector<Tap> resize_taps(const ResizeAttrs& a, int64_t x, double scale, int64_t in_len,
                             int64_t out_len, double rs, double re) {
  double xo = resize_coord(a, static_cast<double>(x), scale, in_len, out_len, rs, re);
  std::vector<Tap> taps;
  if (a.coord == "tf_crop_and_resize" && (xo < 0 || xo > static_cast<double>(in_len - 1)))
    return taps;
  auto clampi = [&](int64_t i) { return std::clamp<int64_t>(i, 0, in_len - 1); };
  if (a.mode == "nearest") {
    double f = std::floor(xo);
    int64_t i;
    if (a.nearest == "floor")
      i = static_cast<int64_t>(f);
    else if (a.nearest == "simple")
      i = static_cast<int64_t>(scale < 1.0 ? std::ceil(xo) : f);
    else if (a.nearest == "ceil")
      i = static_cast<int64_t>(std::ceil(xo));
    else if (xo - f == 0.5)
      i = static_cast<int64_t>(a.nearest == "round_prefer_floor" ? f : f + 1);
    else
      i = static_cast<int64_t>(std::round(xo));
    taps.push_back({clampi(i), 1.0});
    return taps;
  }
  bool cubic = a.mode == "cubic";
  double support = cubic ? 2.0 : 1.0;
  auto kern = [&](double d) {
    return cubic ? cubic_weight(d, a.cubic_a) : std::max(0.0, 1.0 - std::fabs(d));
  };
  if (a.antialias && scale < 1.0) {
    // The filter is stretched by 1/scale; taps outside the input take the edge value (or are
    // dropped with exclude_outside), and the weights are renormalised.
    double sup = support / scale;
    int64_t lo = static_cast<int64_t>(std::floor(xo - sup)),
            hi = static_cast<int64_t>(std::ceil(xo + sup));
    double sum = 0;
    for (int64_t i = lo; i <= hi; ++i) {
      double w = kern((static_cast<double>(i) - xo) * scale);
      if (w == 0 || (a.exclude_outside && (i < 0 || i >= in_len))) continue;
      taps.push_back({clampi(i), w});
      sum += w;
    }
    if (sum != 0)
      for (auto& t : taps) t.weight /= sum;
    return taps;
  }
  int64_t base = static_cast<int64_t>(std::floor(xo));
  double t = xo - static_cast<double>(base);
  if (!cubic) {
    if (in_len == 1 || t == 0) {
      taps.push_back({clampi(base), 1.0});
    } else {
      taps.push_back({clampi(base), 1.0 - t});
      taps.push_back({clampi(base + 1), t});
    }
    return taps;
  }
  double sum = 0;
  for (int64_t k = -1; k <= 2; ++k) {
    int64_t i = base + k;
    double w = cubic_weight(static_cast<double>(k) - t, a.cubic_a);
    if (i < 0 || i >= in_len) {
      if (a.exclude_outside) continue;
      i = clampi(i);
    }
    taps.push_back({i, w});
    sum += w;
  }
  if (a.exclude_outside && sum != 0)
    for (auto& tp : taps) tp.weight /= sum;
  return taps;
}

// Interpolated values for integer data truncate toward zero (as the ONNX reference and ONNX Runtime
// do), clamped to the type's range so that cubic overshoot does not wrap around.
int64_t to_int_saturated(double v, DType dt) {
  int bits = dtype_bits(dt);
  double lo = 0, hi = 0;
  if (is_signed_int(dt)) {
    lo = -std::ldexp(1.0, bits - 1);
    hi = std::ldexp(1.0, bits - 1) - 1;
  } else {
    hi = std::ldexp(1.0, bits) - 1;
  }
  if (std::isnan(v)) return 0;
  v = std::trunc(std::clamp(v, lo, hi));
  if (v >= 9.2e18) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(v);
}

Tensor resize_run(const Tensor& x, const ResizeAttrs& a, const ResizePlan& p) {
  int r = x.rank();
  int64_t total = 1;
  for (int64_t d : p.out) total = checked_mul(total, d);
  for (int k = 0; k < r; ++k)
    if (x.dim(k) == 0 && p.out[k] > 0) fail("cannot resize an empty axis");
  // Per axis, per output position: taps (input index, weight).
  std::vector<std::vector<std::vector<Tap>>> taps(r);
  for (int k = 0; k < r; ++k) {
    taps[k].resize(p.out[k]);
    bool identity = p.out[k] == x.dim(k) && p.scale[k] == 1.0 && a.coord != "tf_crop_and_resize";
    for (int64_t o = 0; o < p.out[k]; ++o)
      taps[k][o] = identity ? std::vector<Tap>{{o, 1.0}}
                            : resize_taps(a, o, p.scale[k], x.dim(k), p.out[k], p.roi_start[k],
                                          p.roi_end[k]);
  }
  Ints st = strides_of(x.shape());
  Tensor y(x.dtype(), p.out);
  if (y.numel() == 0) return y;
  if (a.mode == "nearest") {
    Tensor fill = Tensor::scalar_f(x.dtype(), a.extrapolation).reshaped({1});
    return remap(
        x, p.out,
        [&](const Ints& o) {
          int64_t f = 0;
          for (int k = 0; k < r; ++k) {
            const auto& t = taps[k][o[k]];
            if (t.empty()) return int64_t{-1};
            f += t[0].index * st[k];
          }
          return f;
        },
        fill.bytes());
  }
  std::vector<double> xv = x.to_f64();
  Ints idx(r, 0), tsel(r, 0);
  const bool integral = !is_float(x.dtype());
  for (int64_t i = 0; i < y.numel(); ++i) {
    bool extrap = false;
    for (int k = 0; k < r; ++k) extrap = extrap || taps[k][idx[k]].empty();
    double acc = a.extrapolation;
    if (!extrap) {
      acc = 0;
      std::fill(tsel.begin(), tsel.end(), 0);
      // Sum over the tensor product of per-axis taps.
      while (true) {
        double w = 1;
        int64_t f = 0;
        for (int k = 0; k < r; ++k) {
          const Tap& t = taps[k][idx[k]][tsel[k]];
          w *= t.weight;
          f += t.index * st[k];
        }
        acc += w * xv[f];
        int k = r - 1;
        for (; k >= 0; --k) {
          if (++tsel[k] < static_cast<int64_t>(taps[k][idx[k]].size())) break;
          tsel[k] = 0;
        }
        if (k < 0) break;
      }
    }
    if (integral)
      y.set_i(i, to_int_saturated(acc, x.dtype()));
    else
      y.set_f(i, acc);
    next_index(idx, p.out);
  }
  return y;
}

// Resize in core ops, separable per axis: along each resized axis, the taps (input positions and
// weights, computed here from the static shapes) become one gather of the positions per tap
// (slices where they run evenly) and a weighted sum of those. Interpolation computes in f32 (f64
// for f64 and integer data) and converts once at the end; integer results are clamped to the
// type's range and truncate, like the kernel. Positions that tf_crop_and_resize places outside the
// input take extrapolation_value.
Value* resize_core(CoreBuilder& b, Value* x, const ResizeAttrs& a, const ResizePlan& p) {
  const Shape& in = x->type.shape;
  const DType dt = x->type.dtype;
  const bool nearest = a.mode == "nearest";
  const DType ct = dt == DType::f64 || !is_float(dt) ? DType::f64 : DType::f32;
  Value* y = nearest ? x : b.convert(x, ct);
  std::vector<std::pair<int, Tensor>> outside;  // per axis: the output positions to extrapolate
  for (int k = 0; k < static_cast<int>(in.size()); ++k) {
    if (in[k] == 0 && p.out[k] > 0) fail("cannot resize an empty axis");
    if (p.out[k] == in[k] && p.scale[k] == 1.0 && a.coord != "tf_crop_and_resize") continue;
    std::vector<std::vector<Tap>> taps;
    size_t width = 1;
    Ints extrapolate;
    for (int64_t o = 0; o < p.out[k]; ++o) {
      taps.push_back(resize_taps(a, o, p.scale[k], in[k], p.out[k], p.roi_start[k], p.roi_end[k]));
      width = std::max(width, taps.back().size());
      extrapolate.push_back(taps.back().empty());
    }
    Value* sum = nullptr;
    for (size_t t = 0; t < width; ++t) {
      Ints idx;
      std::vector<double> w;
      for (const auto& tp : taps) {
        idx.push_back(t < tp.size() ? tp[t].index : 0);
        w.push_back(t < tp.size() ? tp[t].weight : 0.0);
      }
      Value* term = take_along_axis(b, y, k, idx);
      if (!std::all_of(w.begin(), w.end(), [](double v) { return v == 1.0; })) {
        Value* wv = b.constant(Tensor::from_f64(ct, {p.out[k]}, w));
        term = b.mul(term, broadcast_into(b, wv, term->type.shape, {k}));
      }
      sum = sum ? b.add(sum, term) : term;
    }
    y = sum;
    if (std::find(extrapolate.begin(), extrapolate.end(), 1) != extrapolate.end())
      outside.push_back({k, Tensor::from_i64(DType::boolean, {p.out[k]}, extrapolate)});
  }
  if (!nearest) {
    if (!is_float(dt)) {
      const int bits = dtype_bits(dt);
      const bool sgn = is_signed_int(dt);
      y = b.max(y, b.scalar(ct, sgn ? -std::ldexp(1.0, bits - 1) : 0.0));
      y = b.min(y, b.scalar(ct, std::ldexp(1.0, sgn ? bits - 1 : bits) - 1));
    }
    y = b.convert(y, dt);
  }
  for (const auto& [k, mask] : outside)
    y = b.select(broadcast_into(b, b.constant(mask), p.out, {k}), b.full(dt, p.out, a.extrapolation), y);
  return y;
}

std::optional<std::vector<double>> known_doubles(const InferCtx& c, int i) {
  const Tensor* t = c.value(i);
  if (!t) return std::nullopt;
  return t->to_f64();
}

std::vector<AttrSpec> resize_attr_specs() {
  return {{"antialias", AttrKind::i},
          {"axes", AttrKind::ints},
          {"coordinate_transformation_mode", AttrKind::s},
          {"cubic_coeff_a", AttrKind::f},
          {"exclude_outside", AttrKind::i},
          {"extrapolation_value", AttrKind::f},
          {"keep_aspect_ratio_policy", AttrKind::s},
          {"mode", AttrKind::s},
          {"nearest_mode", AttrKind::s}};
}

std::vector<Value*> decompose_resize(CoreBuilder& b, const Node& n) {
  ResizeAttrs a = resize_attrs(n);
  Value* x = n.inputs[0];
  std::optional<std::vector<double>> roi, scales;
  std::optional<Ints> sizes;
  if (n.has_input(1) && a.coord == "tf_crop_and_resize") roi = b.need_constant(1, "Resize roi").to_f64();
  if (n.has_input(2))
    scales = shape_numel(n.inputs[2]->type.shape) == 0 ? std::vector<double>{}
                                                        : b.need_constant(2, "Resize scales").to_f64();
  if (n.has_input(3)) sizes = tensor_ints(b.need_constant(3, "Resize sizes"));
  return {resize_core(b, x, a, resize_plan(n, a, x->type.shape, roi, scales, sizes))};
}

OpDef resize_op() {
  OpDef d = make_op("Resize", 1, 4, 11, resize_attr_specs());
  d.fusion = FusionKind::opaque;
  // Resize-10: (X, scales) with asymmetric coordinates and "simple" nearest neighbours.
  d.upgrade = [](Graph&, Node& n, int) {
    if (n.inputs.size() != 2) fail("Resize-10 takes X and scales");
    n.inputs = {n.inputs[0], nullptr, n.inputs[1]};
    n.attrs["coordinate_transformation_mode"] = std::string("asymmetric");
    n.attrs["nearest_mode"] = std::string("simple");
  };
  d.infer = [](InferCtx& c) {
    ResizeAttrs a = resize_attrs(c.node());
    const TensorType& x = c.in(0);
    std::optional<std::vector<double>> roi, scales;
    std::optional<Ints> sizes;
    bool known = true;
    if (c.has_in(1)) roi = known_doubles(c, 1);
    if (c.has_in(2)) {
      scales = known_doubles(c, 2);
      // A statically empty scales tensor is common when sizes is given.
      if (!scales && shape_numel(c.in(2).shape) == 0) scales = std::vector<double>{};
      if (!scales) known = false;
    }
    if (c.has_in(3)) known = known && (sizes = known_ints(c, 3)).has_value();
    if (a.coord == "tf_crop_and_resize" && c.has_in(1) && !roi) known = false;
    if (!known) {
      c.set_out(0, {x.dtype, Shape(x.shape.size(), kUnknownDim)});
      return;
    }
    c.set_out(0, {x.dtype, resize_plan(c.node(), a, x.shape, roi, scales, sizes).out});
  };
  d.kernel = [](KernelCtx& c) {
    ResizeAttrs a = resize_attrs(c.node());
    const Tensor& x = c.in(0);
    std::optional<std::vector<double>> roi, scales;
    std::optional<Ints> sizes;
    if (c.has_in(1)) roi = c.in(1).to_f64();
    if (c.has_in(2)) scales = c.in(2).to_f64();
    if (c.has_in(3)) sizes = tensor_ints(c.in(3));
    c.set_out(0, resize_run(x, a, resize_plan(c.node(), a, x.shape(), roi, scales, sizes)));
  };
  return d;
}

ResizeAttrs upsample_attrs(const Node& n) {
  for (const char* k : {"scales", "height_scale", "width_scale"}) reject_attr(n, k);
  ResizeAttrs a;
  a.mode = n.attr_s("mode", "nearest");
  if (a.mode == "bilinear") a.mode = "linear";
  if (a.mode != "nearest" && a.mode != "linear") fail("unknown Upsample mode '{}'", a.mode);
  a.coord = "asymmetric";
  a.nearest = "simple";
  return a;
}

std::vector<Value*> decompose_upsample(CoreBuilder& b, const Node& n) {
  ResizeAttrs a = upsample_attrs(n);
  Value* x = n.inputs[0];
  Node all_axes;
  auto scales = b.need_constant(1, "Upsample scales").to_f64();
  return {resize_core(b, x, a, resize_plan(all_axes, a, x->type.shape, std::nullopt, scales, std::nullopt))};
}

OpDef upsample_op() {
  OpDef d = make_op("Upsample", 1, 2, 9,
                    {{"mode", AttrKind::s},
                     {"scales", AttrKind::floats},
                     {"height_scale", AttrKind::f},
                     {"width_scale", AttrKind::f}});
  d.fusion = FusionKind::opaque;
  d.upgrade = [](Graph& g, Node& n, int opset) {
    if (opset < 7) unsupported("Upsample-1");
    if (!n.has_attr("scales")) fail("Upsample needs scales");
    std::vector<double> s = n.attr_floats("scales");
    n.attrs.erase("scales");
    n.inputs.resize(2, nullptr);
    n.inputs[1] = g.add_constant(g.unique_name(n.name + "_scales"),
                                 Tensor::from_f64(DType::f32, {static_cast<int64_t>(s.size())}, s));
  };
  auto attrs = upsample_attrs;
  d.infer = [attrs](InferCtx& c) {
    ResizeAttrs a = attrs(c.node());
    const TensorType& x = c.in(0);
    if (!c.has_in(1)) fail("Upsample needs scales");
    auto s = known_doubles(c, 1);
    if (!s) {
      c.set_out(0, {x.dtype, Shape(x.shape.size(), kUnknownDim)});
      return;
    }
    Node dummy;  // no axes attribute: all axes
    c.set_out(0, {x.dtype, resize_plan(dummy, a, x.shape, std::nullopt, s, std::nullopt).out});
  };
  d.kernel = [attrs](KernelCtx& c) {
    ResizeAttrs a = attrs(c.node());
    const Tensor& x = c.in(0);
    Node dummy;
    c.set_out(0, resize_run(x, a,
                            resize_plan(dummy, a, x.shape(), std::nullopt, c.in(1).to_f64(),
                                        std::nullopt)));
  };
  return d;
}

}  // namespace

// The ops marked symbolic_op take symbolic sizes (docs/dynamic-shapes.md); the rest refuse them.
void register_shape_ops(OpRegistry& r) {
  r.add(symbolic_op(with_decomposition(reshape_op(), decompose_reshape)));
  r.add(symbolic_op(with_decomposition(transpose_op(), decompose_transpose)));
  r.add(symbolic_op(with_decomposition(squeeze_op(false), decompose_reshape)));
  r.add(symbolic_op(with_decomposition(squeeze_op(true), decompose_reshape)));
  r.add(symbolic_op(with_decomposition(flatten_op(), decompose_reshape)));
  r.add(symbolic_op(with_decomposition(concat_op(), decompose_concat)));
  r.add(symbolic_op(with_decomposition(split_op(), decompose_split)));
  r.add(symbolic_op(with_decomposition(slice_op(), decompose_slice)));
  r.add(symbolic_op(with_decomposition(expand_op(), decompose_expand)));
  r.add(symbolic_op(with_decomposition(tile_op(), decompose_tile)));
  r.add(symbolic_op(with_decomposition(pad_op(), decompose_pad)));
  r.add(symbolic_op(with_decomposition(shape_op(), decompose_shape)));
  r.add(symbolic_op(with_decomposition(size_op(), decompose_size)));
  r.add(sizes_op());
  r.add(symbolic_op(with_decomposition(constant_of_shape_op(), decompose_constant_of_shape)));
  r.add(symbolic_op(with_decomposition(range_op(), decompose_range)));
  r.add(symbolic_op(with_decomposition(eyelike_op(), decompose_eyelike)));
  r.add(symbolic_op(with_decomposition(trilu_op(), decompose_trilu)));
  r.add(with_decomposition(depth_space_op(true), decompose_depth_space(true)));
  r.add(with_decomposition(depth_space_op(false), decompose_depth_space(false)));
  r.add(with_decomposition(center_crop_pad_op(), decompose_center_crop_pad));
  r.add(with_decomposition(reverse_sequence_op(), decompose_reverse_sequence));
  r.add(with_decomposition(resize_op(), decompose_resize));
  r.add(with_decomposition(upsample_op(), decompose_upsample));
}

}  // namespace tessel
