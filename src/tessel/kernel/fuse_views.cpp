// Fusion, phase 1: views (the phases: kernel/fuse.cpp; docs/passes/fuse.md). transpose, slice,
// broadcast_in_dim and reshape results as strided views of a root value (offset + strides per dim),
// and the rewrites before grouping that keep library operands readable through them
// (densify_library_constants, densify_conv_inputs).
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "tessel/ir/core_ops.h"
#include "tessel/ir/op_registry.h"
#include "tessel/kernel/fuse_phases.h"

namespace tessel::fuse_detail {

bool is_view_op(std::optional<CoreOp> op) {
  return op == CoreOp::reshape || op == CoreOp::transpose || op == CoreOp::broadcast_in_dim || op == CoreOp::slice;
}

namespace {

// Strides for `to` when a value of shape `from` with strides `st` is reshaped, if the reshape is
// expressible as a view (every group of dims that merges is contiguous with itself).
// Symbolic sizes merge and split by divisibility: a product is extended while the other side's is a
// multiple of it.
bool smaller_product(const Dim& a, const Dim& b) {
  if (a.is_static() && b.is_static()) return a.constant_term() < b.constant_term();
  return exact_div(b, a).has_value();
}

std::optional<Dims> restride(const Dims& from, const Dims& st, const Dims& to) {
  Dims out(to.size(), Dim(0));
  // drop size-1 dims of the source
  Dims fs, fst;
  for (size_t i = 0; i < from.size(); ++i)
    if (from[i] != 1) {
      fs.push_back(from[i]);
      fst.push_back(st[i]);
    }
  size_t fi = 0, ti = 0;
  while (ti < to.size()) {
    if (to[ti] == 1) {
      out[ti++] = 0;
      continue;
    }
    if (fi >= fs.size()) return std::nullopt;
    // take source dims [fi, fe) and target dims [ti, te) with equal products
    Dim fp = fs[fi], tp = to[ti];
    size_t fe = fi + 1, te = ti + 1;
    while (fp != tp) {
      if (smaller_product(fp, tp)) {
        if (fe >= fs.size()) return std::nullopt;
        fp *= fs[fe++];
      } else if (smaller_product(tp, fp)) {
        while (te < to.size() && to[te] == 1) ++te;
        if (te >= to.size()) return std::nullopt;
        tp *= to[te++];
      } else {
        return std::nullopt;  // symbolic products neither of which divides the other
      }
    }
    for (size_t k = fi; k + 1 < fe; ++k)
      if (fst[k] != fst[k + 1] * fs[k + 1]) return std::nullopt;  // not contiguous within the group
    Dim s = fst[fe - 1];
    for (size_t k = te; k-- > ti;) {
      out[k] = to[k] == 1 ? Dim(0) : s;
      s *= to[k];
    }
    fi = fe;
    ti = te;
  }
  if (fi != fs.size()) return std::nullopt;
  return out;
}

}  // namespace

std::optional<View> view_of(const Node& n, const View& src) {
  const std::optional<CoreOp> op = n.op->core;
  const Dims in = dims(n.inputs[0]);
  const Dims out = dims(n.outputs[0]);
  View v{src.root, src.offset, {}};
  if (op == CoreOp::reshape) {
    auto s = restride(in, src.strides, out);
    if (!s) return std::nullopt;
    v.strides = *s;
  } else if (op == CoreOp::transpose) {
    for (int64_t p : n.attr_ints("perm")) v.strides.push_back(src.strides[static_cast<size_t>(p)]);
  } else if (op == CoreOp::broadcast_in_dim) {
    v.strides.assign(out.size(), 0);
    auto dims = n.attr_ints("dims");
    for (size_t k = 0; k < dims.size(); ++k)
      if (in[k] == out[static_cast<size_t>(dims[k])]) v.strides[static_cast<size_t>(dims[k])] = src.strides[k];
  } else if (op == CoreOp::slice) {
    auto starts = n.attr_dims("starts");
    auto steps = n.attr_ints("strides", std::vector<int64_t>(in.size(), 1));
    for (size_t d = 0; d < in.size(); ++d) {
      if (steps[d] <= 0) return std::nullopt;  // (steps are static)
      v.offset += starts[d] * src.strides[d];
      v.strides.push_back(src.strides[d] * steps[d]);
    }
  } else {
    return std::nullopt;
  }
  for (size_t d = 0; d < out.size(); ++d)
    if (out[d] == 1) v.strides[d] = 0;
  return v;
}

namespace {

// A constant operand of a matmul (either side) or a convolution (the weights) that is a view of a
// smaller constant -- canonicalize makes an all-equal constant a scalar and a broadcast_in_dim --
// reads through zero strides, which oneDNN takes neither as a matrix nor as weights. Such an operand
// becomes a dense constant of its full shape (the same bytes the model had before canonicalize).
// A value's own memory as a view: row-major, size-1 dims with stride 0.
View row_major_view(const Value* v) {
  const Dims s = dims(v);
  View w{v, 0, dims_strides(s)};
  for (size_t d = 0; d < s.size(); ++d)
    if (s[d] == 1) w.strides[d] = 0;
  return w;
}

// The view ops between v and the value they view (outermost first, in `chain`); returns that value.
const Value* view_chain(const Value* v, std::vector<const Node*>* chain) {
  while (v->producer && is_core(*v->producer) && sized_node(*v->producer) && is_view_op(v->producer->op->core) &&
         v->producer->inputs[0]) {
    chain->push_back(v->producer);
    v = v->producer->inputs[0];
  }
  return v;
}

}  // namespace

// How a convolution reads an input of shape s through view v of its root's memory: as NCHW (false),
// as NHWC (true), or neither (nullopt: an offset, a slice, a shuffle).
std::optional<bool> conv_read_layout(const View& v, const Dims& s) {
  if (v.offset != 0 || dims_numel(dims(v.root)) != dims_numel(s)) return std::nullopt;
  auto strides_are = [&](const Dims& want) {
    for (size_t d = 0; d < s.size(); ++d)
      if (s[d] != 1 && v.strides[d] != want[d]) return false;
    return true;
  };
  if (strides_are(dims_strides(s))) return false;
  if (s.size() == 4 && strides_are({s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]})) return true;
  return std::nullopt;
}

void densify_library_constants(Graph& g) {
  for (const auto& np : g.nodes()) {
    Node& n = *np;
    if (!is_core(n) || !sized_node(n)) continue;
    std::vector<size_t> operands;
    if (is_core_op(n, CoreOp::dot_general)) {
      operands = {0, 1};
    } else if (is_core_op(n, CoreOp::convolution)) {
      operands = {1};
    } else {
      continue;
    }
    for (size_t i : operands) {
      Value* v = i < n.inputs.size() ? n.inputs[i] : nullptr;
      if (!v || v->constant) continue;
      std::vector<const Node*> chain;
      const Value* root = view_chain(v, &chain);
      if (chain.empty() || !root->constant || !sized_value(root) || v->type.symbolic()) continue;
      View view = row_major_view(root);
      bool ok = true;
      for (auto it = chain.rbegin(); it != chain.rend() && ok; ++it) {
        auto next = view_of(**it, view);
        ok = next.has_value();
        if (ok) view = *next;
      }
      if (!ok) continue;
      // a matmul's batch dims may broadcast (B shared across the batch); its matrix dims may not
      const Shape& shape = v->type.shape;
      const auto skip = is_core_op(n, CoreOp::dot_general)
                            ? n.attr_ints(i == 0 ? "lhs_batch" : "rhs_batch", {})
                            : std::vector<int64_t>{};
      bool broadcast = is_core_op(n, CoreOp::convolution);  // conv weights are read from a dense root only
      for (size_t d = 0; d < shape.size(); ++d)
        if (shape[d] > 1 && view.strides[d] == 0 &&
            std::find(skip.begin(), skip.end(), static_cast<int64_t>(d)) == skip.end())
          broadcast = true;
      if (!broadcast) continue;
      Tensor dense(v->type.dtype, shape);
      const size_t es = static_cast<size_t>(dtype_size(v->type.dtype));
      const uint8_t* src = root->constant->bytes();
      uint8_t* dst = dense.bytes();
      std::vector<int64_t> idx(shape.size(), 0);
      for (int64_t e = 0, numel = shape_numel(shape); e < numel; ++e) {
        int64_t at = view.offset;
        for (size_t d = 0; d < shape.size(); ++d) at += idx[d] * view.strides[d];
        std::memcpy(dst + static_cast<size_t>(e) * es, src + static_cast<size_t>(at) * es, es);
        for (size_t d = shape.size(); d-- > 0;) {
          if (++idx[d] < shape[d]) break;
          idx[d] = 0;
        }
      }
      n.inputs[i] = g.add_constant(g.unique_name(v->name + ".dense"), std::move(dense));
    }
  }
}

namespace {

// A convolution's input that is a view oneDNN cannot read (a channel slice, shufflenet's channel shuffle:
// an offset or strides that are neither NCHW nor NHWC) gets an explicit copy (a convert to its own
// dtype, fused as a loop kernel) so the convolution stays a library kernel; before, such a convolution
// stayed a core node on the graph backend's im2col kernel (shufflenet_v2: 13 of them, 0.3 ms each).

// A model's first convolution reads the image input, NCHW with a few channels (C < 8). oneDNN's
// direct kernel for an NCHW source writes its own blocked result, and the reorder of that result to
// the channels-last activations after it cost more than the convolution (squeezenet1_1: 0.22 ms of
// convolution, 0.5 ms of reorder; vgg11: 0.93 + 1.0 ms); its reorder of a 3-channel input to NHWC is
// slow too. A channels-last copy of the input, made by a generated loop kernel (a convert of the input
// transposed to [N, H, W, C]: 0.03 ms for 3x224x224), lets brgconv run NHWC to NHWC at the direct
// kernel's speed; the convolution reads the copy through a transpose back to NCHW (a view with NHWC
// strides, FuseOptions::conv_input_views).
bool first_layer_input(const Node& conv) {
  const Value* x = conv.inputs[0];
  const Dims s = dims(x);
  return x->is_input && s.size() == 4 && s[1].is_static() && s[1].constant_term() < 8 && conv.attr_i("groups", 1) == 1;
}

void channels_last_copy(Graph& g, Node* conv) {
  Value* x = conv->inputs[0];
  const Dims s = dims(x);
  const std::string name = g.unique_name(conv->name + ".channels_last_input");
  const std::string view = g.unique_name(name + ".view"), nchw = g.unique_name(name + ".nchw");
  const OpRegistry& reg = OpRegistry::get();
  Node* t = g.add_node(reg.find("transpose"), view, {x}, {view}, {{"perm", std::vector<int64_t>{0, 2, 3, 1}}});
  t->outputs[0]->type = TensorType::of(x->type.dtype, {s[0], s[2], s[3], s[1]});
  Node* copy = g.add_node(reg.find("convert"), name, {t->outputs[0]}, {name},
                          {{"dtype", std::string(dtype_name(x->type.dtype))}});
  copy->outputs[0]->type = t->outputs[0]->type;
  Node* back = g.add_node(reg.find("transpose"), nchw, {copy->outputs[0]}, {nchw},
                          {{"perm", std::vector<int64_t>{0, 3, 1, 2}}});
  back->outputs[0]->type = x->type;
  conv->inputs[0] = back->outputs[0];
}

}  // namespace

void densify_conv_inputs(Graph& g) {
  std::vector<Node*> convs;
  for (const auto& np : g.nodes())
    if (is_core(*np) && sized_node(*np) && is_core_op(*np, CoreOp::convolution) && np->inputs.size() >= 2 &&
        np->inputs[0] && np->inputs[0]->type.dtype == DType::f32 && np->inputs[1] && np->inputs[1]->constant)
      convs.push_back(np.get());
  bool added = false;
  for (Node* n : convs) {
    Value* x = n->inputs[0];
    std::vector<const Node*> chain;
    const Value* root = view_chain(x, &chain);
    if (chain.empty() && first_layer_input(*n)) {
      channels_last_copy(g, n);
      added = true;
      continue;
    }
    if (chain.empty() || root->constant || !sized_value(root)) continue;
    // A view op that cannot fold (a reshape merging transposed dims) materialises its result, which
    // the rest of the chain then views.
    View view = row_major_view(root);
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      auto next = view_of(**it, view);
      view = next ? *next : row_major_view((*it)->outputs[0]);
    }
    if (view.root == x || conv_read_layout(view, dims(x))) continue;  // readable as it is
    const std::string name = g.unique_name(n->name + ".dense_input");
    Node* copy = g.add_node(OpRegistry::get().find("convert"), name, {x}, {name},
                            {{"dtype", std::string(dtype_name(x->type.dtype))}});
    copy->outputs[0]->type = x->type;
    n->inputs[0] = copy->outputs[0];
    added = true;
  }
  if (added) topo_sort(g);
}

}  // namespace tessel::fuse_detail
