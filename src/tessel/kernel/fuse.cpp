// Fusion: the core graph -> the kernel level (docs/passes/fuse.md).
//
// 1. Views. transpose, slice, broadcast_in_dim and reshape results are described as strided views
//    of a root value (offset + strides per dim); they cost nothing: loads read the root through them.
// 2. Groups. In topological order every fusible node joins the group of a producer when the
//    iteration spaces agree (vertical fusion), or starts a group:
//      loop groups: pointwise ops over one shape F, plus reductions over axes R of F; values are
//        element values (shape F) or row values (F without R: one per outer point). Layer norm,
//        RMS norm and softmax become one loop group each.
//      matmul / conv groups: the library call plus pointwise consumers of its result (epilogue).
//    A join is refused if it would make the group depend on itself through another group.
// 3. Materialisation. A group stores a value when something outside it (or a graph output) uses it.
// 4. Lowering. Each group becomes a Kernel: loop space (outer = kept dims, inner = reduced dims or
//    the last dim), accesses with composed strides, SSA instructions per phase, and one `kernel`
//    node in the graph in place of the group's nodes.
#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "tessel/ir/core_ops.h"
#include "tessel/ir/op_registry.h"
#include "tessel/kernel/kernel.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

bool is_core(const Node& n) { return n.op->core.has_value(); }

// Every size known (static, or symbolic: docs/dynamic-shapes.md; not a data-dependent `?`) and
// non-empty: kernels are not generated for values without elements.
bool sized_value(const Value* v) {
  if (!v || !v->type.dims_defined()) return false;
  return provably_positive(dims_numel(v->type.dims()));
}
Dims dims(const Value* v) { return v->type.dims(); }
// Whether a size is statically at most 1 (a symbolic one is >= 1 and may be more).
bool at_most_one(const Dim& d) { return d.is_static() && d.constant_term() <= 1; }

bool sized_node(const Node& n) {
  for (const Value* v : n.inputs)
    if (v && !sized_value(v)) return false;
  for (const Value* v : n.outputs)
    if (!v || !sized_value(v)) return false;
  return !n.outputs.empty();
}

// ---- views ---------------------------------------------------------------------------------------

struct View {
  const Value* root = nullptr;
  Dim offset = 0;
  Dims strides;  // per dim of the viewed value
};

bool is_view_op(std::optional<CoreOp> op) {
  return op == CoreOp::reshape || op == CoreOp::transpose || op == CoreOp::broadcast_in_dim || op == CoreOp::slice;
}

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

// A convolution's input that is a view oneDNN cannot read (a channel slice, shufflenet's channel shuffle:
// an offset or strides that are neither NCHW nor NHWC) gets an explicit copy (a convert to its own
// dtype, fused as a loop kernel) so the convolution stays a library kernel; before, such a convolution
// stayed a core node on the graph backend's im2col kernel (shufflenet_v2: 13 of them, 0.3 ms each).
void topo_sort(Graph& g);

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

// ---- what the code generators handle ---------------------------------------------------------------

bool loop_dtype(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::i32 || t == DType::i64 || t == DType::boolean;
}

// The operand dtypes the loop generators take for each primitive: the table's `loop` column (core_ops.def).
bool pointwise_ok(const Node& n) {
  const auto c = core_op_named(n.op->name);
  if (!c || !core_op_info(*c).elementwise()) return false;
  for (const Value* v : n.inputs)
    if (!v || !loop_dtype(v->type.dtype)) return false;
  if (n.outputs.size() != 1 || !loop_dtype(n.outputs[0]->type.dtype)) return false;
  const DType t = n.inputs.empty() ? DType::f32 : n.inputs[0]->type.dtype;
  const bool fl = t == DType::f32 || t == DType::f64;
  switch (core_op_info(*c).loop) {
    case LoopTypes::floats: return fl;
    case LoopTypes::numeric: return t != DType::boolean;
    case LoopTypes::ints_bools: return !fl;
    case LoopTypes::all: return true;
    case LoopTypes::by_target: {  // convert
      const DType to = n.outputs[0]->type.dtype;
      if (to == DType::boolean || to == DType::f32 || to == DType::f64) return true;
      return !fl;  // integer <-> integer wraps; float -> integer stays with the reference semantics
    }
    case LoopTypes::none: return false;
  }
  return false;
}

bool reduce_ok(const Node& n) {
  if (core_op_named(n.op->name) != CoreOp::reduce) return false;
  const DType t = n.inputs[0]->type.dtype;
  return (t == DType::f32 || t == DType::f64) && reduction_combiner(n.attr_s("kind")).has_value();
}

// ---- groups --------------------------------------------------------------------------------------

enum class GKind { loop, matmul, conv };

// The most core nodes one kernel fuses. Real kernels fuse tens (a layer norm, a softmax, an
// epilogue); a model that is one long elementwise chain would otherwise become one kernel whose
// lowering recurses once per node (a stack overflow at ~20000) and whose C++ function g++ takes
// minutes over. A longer chain becomes several kernels, each stored once in between.
constexpr size_t kMaxKernelNodes = 512;

struct Group {
  GKind kind = GKind::loop;
  Dims F;                        // the iteration space
  std::vector<bool> R;           // reduced dims of F (loop groups)
  bool reduces = false;
  const Node* anchor = nullptr;  // matmul / conv node
  std::vector<const Node*> nodes;
};

enum class Level { elem, row };

// Collapses a run of dims (sizes, strides) into one (size, stride), if they form a single stride.
std::optional<std::pair<Dim, Dim>> collapse(const Dims& sizes, const Dims& st);

struct Fuser {
  Graph& g;
  const FuseOptions& opts;
  std::vector<View> views;                 // per value id: its view (root = itself when not a view)
  std::vector<bool> is_view;               // per value id: produced by a folded view node
  std::vector<int> group_of_value;         // per value id: the group computing it (-1)
  std::vector<Level> level;                // per value id: level inside its group
  std::vector<std::set<int>> deps;         // per value id: groups it depends on
  std::vector<Group> groups;
  std::map<const Node*, int> node_group;
  // Values decide_layouts must leave row-major: an earlier run stored them in another layout that a
  // node outside every kernel would have read or written (layout_violations).
  std::set<int> row_major_only;

  Fuser(Graph& graph, const FuseOptions& o, std::set<int> row_major = {})
      : g(graph), opts(o), row_major_only(std::move(row_major)) {}

  size_t nv() const {
    size_t n = 0;
    for (const auto& v : g.values()) n = std::max(n, static_cast<size_t>(v->id) + 1);
    return n;
  }

  // Layout: 4-D activations between convolutions are stored channels-last (NHWC) when every
  // reader is a kernel that reads through index maps (pointwise, reduce, a convolution's input).
  std::vector<bool> nhwc;  // per value id
  // A matmul result read only through one transpose (attention heads merged back) is stored in the
  // transpose's order, so the transpose and the reshape after it become views: physical dim i holds
  // logical dim order[i]. Empty: row-major.
  std::vector<std::vector<int64_t>> order;  // per value id

  Dims physical_strides(const Value* v) const {
    const Dims s = dims(v);
    if (nhwc[v->id]) return {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]};  // [N, C, H, W] laid out as [N, H, W, C]
    const std::vector<int64_t>& o = order[v->id];
    if (o.empty()) return dims_strides(s);
    Dims ps;
    for (int64_t d : o) ps.push_back(s[static_cast<size_t>(d)]);
    const Dims rs = dims_strides(ps);
    Dims st(s.size());
    for (size_t i = 0; i < o.size(); ++i) st[static_cast<size_t>(o[i])] = rs[i];
    return st;
  }

  // The strides of a dot_general result's [batch, M, N] if its layout lets each group collapse.
  std::optional<std::array<Dim, 3>> matmul_result_strides(const Node& dot, const Dims& st) const {
    const size_t nb = dot.attr_ints("lhs_batch", {}).size();
    const size_t rank = dot.outputs[0]->type.shape.size();
    const Dims s = dims(dot.outputs[0]);
    const size_t nm = dot.inputs[0]->type.shape.size() - nb - dot.attr_ints("lhs_contract").size();
    auto group = [&](size_t b, size_t e) {
      return collapse(Dims(s.begin() + static_cast<long>(b), s.begin() + static_cast<long>(e)),
                      Dims(st.begin() + static_cast<long>(b), st.begin() + static_cast<long>(e)));
    };
    auto gb = group(0, nb), gm = group(nb, nb + nm), gn = group(nb + nm, rank);
    if (!gb || !gm || !gn) return std::nullopt;
    return std::array<Dim, 3>{gb->second, gm->second, gn->second};
  }

  // A node that may run channels-last outside every kernel (can_run_channels_last), and one that will:
  // its operands and result all chose NHWC.
  bool layout_step(const Node& n) const { return opts.layout_steps && sized_node(n) && can_run_channels_last(n); }
  bool nhwc_step(const Node& n) const {
    if (!layout_step(n) || !nhwc[n.outputs[0]->id]) return false;
    for (const Value* u : n.inputs)
      if (!nhwc[u->id]) return false;
    return true;
  }

  void decide_layouts() {
    std::map<const Value*, std::vector<const Node*>> consumers;
    for (const auto& n : g.nodes())
      for (const Value* u : n->inputs)
        if (u) consumers[u].push_back(n.get());
    auto is_conv = [&](const Node& n) {
      return opts.matmul && is_core(n) && sized_node(n) && is_core_op(n, CoreOp::convolution) && conv_spec(n).has_value();
    };
    auto readers_ok = [&](const Value* v) {
      if (std::find(g.outputs.begin(), g.outputs.end(), v) != g.outputs.end()) return false;
      auto it = consumers.find(v);
      if (it == consumers.end()) return false;
      for (const Node* c : it->second) {
        if (!is_core(*c) || !sized_node(*c)) return false;
        if (is_conv(*c) && c->inputs[0] == v && c->inputs[1] != v) continue;
        if (pointwise_ok(*c) || reduce_ok(*c) || layout_step(*c)) continue;
        return false;
      }
      return true;
    };
    for (const auto& up : g.nodes()) {
      const Node& n = *up;
      if (n.outputs.size() != 1 || !n.outputs[0]) continue;
      const Value* v = n.outputs[0];
      if (!sized_value(v) || v->type.shape.size() != 4 || v->type.dtype != DType::f32) continue;
      bool source = false;
      if (is_conv(n)) {
        source = true;
      } else if (layout_step(n)) {
        source = true;  // every operand channels-last (layout_violations undoes a step left half-way)
        for (const Value* u : n.inputs) source = source && nhwc[u->id];
      } else if (is_core(n) && sized_node(n) && pointwise_ok(n)) {
        for (const Value* u : n.inputs) source = source || (nhwc[u->id] && u->type == TensorType::of(u->type.dtype, dims(v)));
      }
      if (source && readers_ok(v) && !row_major_only.count(v->id)) nhwc[v->id] = true;
    }
    for (const auto& up : g.nodes()) {
      const Node& n = *up;
      if (!opts.matmul || !is_core(n) || !sized_node(n) || !is_core_op(n, CoreOp::dot_general)) continue;
      const Value* v = n.outputs[0];
      if (v->type.dtype != DType::f32 || std::find(g.outputs.begin(), g.outputs.end(), v) != g.outputs.end()) continue;
      auto it = consumers.find(v);
      if (it == consumers.end() || it->second.size() != 1) continue;
      const Node& t = *it->second[0];
      if (!is_core(t) || !is_core_op(t, CoreOp::transpose) || !sized_node(t)) continue;
      const Value* tv = t.outputs[0];
      auto jt = consumers.find(tv);
      if (jt == consumers.end() || std::find(g.outputs.begin(), g.outputs.end(), tv) != g.outputs.end()) continue;
      bool reshapes = true;
      for (const Node* c : jt->second) reshapes = reshapes && is_core(*c) && is_core_op(*c, CoreOp::reshape);
      if (!reshapes || row_major_only.count(v->id)) continue;
      order[v->id] = t.attr_ints("perm");
      if (!matmul_result_strides(n, physical_strides(v))) order[v->id].clear();
    }
  }

  void init() {
    const size_t n = nv();
    nhwc.assign(n, false);
    order.assign(n, {});
    views.resize(n);
    is_view.assign(n, false);
    group_of_value.assign(n, -1);
    level.assign(n, Level::elem);
    deps.assign(n, {});
    for (const auto& v : g.values()) views[v->id].root = v.get();
    decide_layouts();  // reads roots and offsets only
    for (const auto& v : g.values()) {
      if (!sized_value(v.get())) continue;
      views[v->id].strides = physical_strides(v.get());
      const Dims s = dims(v.get());
      for (size_t d = 0; d < s.size(); ++d)
        if (s[d] == 1) views[v->id].strides[d] = 0;
    }
  }

  // The row value a view chain starts from, when `v` is a chain of reshapes of a row value of
  // group `gi`, optionally ending in a broadcast_in_dim that maps the row dims onto the non-reduced
  // dims of the group's space in order (a row value read at every element).
  bool row_root(const Value* v, int gi, const Value** root) const {
    const Value* cur = v;
    bool first = true;
    while (cur->producer && is_view[cur->id]) {
      const Node& n = *cur->producer;
      if (is_core_op(n, CoreOp::broadcast_in_dim)) {
        if (!first) return false;
        const Group& gr = groups[static_cast<size_t>(gi)];
        const Dims in = tessel::dims(n.inputs[0]);
        auto dims = n.attr_ints("dims");
        std::vector<int64_t> want;
        if (in.size() == gr.F.size()) {
          for (size_t d = 0; d < in.size(); ++d) want.push_back(static_cast<int64_t>(d));
        } else {
          for (size_t d = 0; d < gr.F.size(); ++d)
            if (!gr.R[d]) want.push_back(static_cast<int64_t>(d));
        }
        if (dims != want || !is_row_shape(gr, in) || tessel::dims(cur) != gr.F) return false;
      } else if (!is_core_op(n, CoreOp::reshape)) {
        return false;
      }
      first = false;
      cur = n.inputs[0];
    }
    if (cur == v || group_of_value[cur->id] != gi || level[cur->id] != Level::row) return false;
    *root = cur;
    return true;
  }

  Dims row_shape(const Group& gr) const {
    Dims s;
    for (size_t d = 0; d < gr.F.size(); ++d)
      if (!gr.R[d]) s.push_back(gr.F[d]);
    return s;
  }
  bool is_row_shape(const Group& gr, const Dims& s) const {
    if (!gr.reduces) return false;
    if (s == row_shape(gr)) return true;
    if (s.size() != gr.F.size()) return false;
    for (size_t d = 0; d < s.size(); ++d)
      if (s[d] != (gr.R[d] ? Dim(1) : gr.F[d])) return false;
    return true;
  }

  // How operand `u` of a node placed in group gi at `lv` is read: inline (a member value at a
  // compatible level) or from memory. Returns false if it cannot be read there at all.
  bool operand_ok(const Value* u, int gi, Level lv, bool* inline_read) const {
    const Group& gr = groups[gi];
    *inline_read = false;
    if (group_of_value[u->id] == gi && !is_view[u->id]) {
      if (level[u->id] == lv) {
        *inline_read = true;
        return true;
      }
      return false;
    }
    const Value* rr = nullptr;
    if (is_view[u->id] && row_root(u, gi, &rr)) {
      // a row value reshaped (row level) or broadcast to the full space (element level)
      const Dims s = dims(u);
      if (lv == Level::row ? is_row_shape(gr, s) : s == gr.F) {
        *inline_read = true;
        return true;
      }
      return false;
    }
    // from memory: the root must not be computed by this group
    const Value* root = views[u->id].root;
    if (group_of_value[root->id] == gi) return false;
    const Dims s = dims(u);
    if (lv == Level::elem) return s == gr.F;
    return is_row_shape(gr, s);
  }

  // Groups each group reads from (directly, through values computed outside it), kept up to date
  // as groups grow.
  std::vector<std::set<int>> gdeps;

  bool reaches(const std::set<int>& from, int target) const {
    std::vector<int> stack(from.begin(), from.end());
    std::set<int> seen(from.begin(), from.end());
    while (!stack.empty()) {
      const int h = stack.back();
      stack.pop_back();
      if (h == target) return true;
      for (int d : gdeps[static_cast<size_t>(h)])
        if (seen.insert(d).second) stack.push_back(d);
    }
    return false;
  }

  void add_group_deps(const Node& n, int gi) {
    for (const Value* u : n.inputs) {
      if (!u) continue;
      for (int d : deps[u->id])
        if (d != gi) gdeps[static_cast<size_t>(gi)].insert(d);
    }
  }

  // Whether node n may join group gi; sets the level it would have.
  bool can_join(const Node& n, int gi, Level* lv_out) const {
    const Group& gr = groups[gi];
    if (gr.nodes.size() >= kMaxKernelNodes) return false;
    const Dims out = dims(n.outputs[0]);
    Level lv;
    if (is_core_op(n, CoreOp::reduce)) {
      if (gr.kind != GKind::loop) return false;
      const Dims x = dims(n.inputs[0]);
      if (x != gr.F) return false;
      std::vector<bool> mask(x.size(), false);
      for (int64_t a : n.attr_ints("axes")) mask[static_cast<size_t>(a)] = true;
      if (gr.reduces && mask != gr.R) return false;
      Dim inner = 1;
      for (size_t d = 0; d < x.size(); ++d)
        if (mask[d]) inner *= x[d];
      if (at_most_one(inner)) return false;
      lv = Level::row;
      // operand at element level
      bool inl = false;
      if (!operand_ok(n.inputs[0], gi, Level::elem, &inl) || !inl) return false;
    } else {
      if (out == gr.F && !(gr.kind == GKind::loop && gr.reduces && is_row_shape(gr, out)))
        lv = Level::elem;
      else if (gr.kind == GKind::loop && is_row_shape(gr, out))
        lv = Level::row;
      else
        return false;
      bool any_inline = false;
      for (const Value* u : n.inputs) {
        bool inl = false;
        if (!operand_ok(u, gi, lv, &inl)) return false;
        any_inline = any_inline || inl;
      }
      if (!any_inline) return false;
    }
    // No path from the group to n through another group or node: no group that n's other operands
    // depend on may itself (now, transitively) depend on this group.
    std::set<int> from;
    for (const Value* u : n.inputs) {
      const Value* rr = nullptr;
      const bool member = group_of_value[u->id] == gi && !is_view[u->id];
      if (member || (is_view[u->id] && row_root(u, gi, &rr))) continue;
      from.insert(deps[u->id].begin(), deps[u->id].end());
    }
    if (reaches(from, gi)) return false;
    *lv_out = lv;
    return true;
  }

  // Groups that produce the operands of n (directly or through a row view), in operand order.
  std::vector<int> candidate_groups(const Node& n) const {
    std::vector<int> c;
    for (const Value* u : n.inputs) {
      const Value* cur = u;
      while (cur->producer && is_view[cur->id]) cur = cur->producer->inputs[0];
      const int gi = group_of_value[cur->id];
      if (gi >= 0 && std::find(c.begin(), c.end(), gi) == c.end()) c.push_back(gi);
    }
    return c;
  }

  void assign(const Node& n, int gi, Level lv) {
    if (gdeps.size() < groups.size()) gdeps.resize(groups.size());
    add_group_deps(n, gi);
    groups[gi].nodes.push_back(&n);
    node_group[&n] = gi;
    for (const Value* v : n.outputs) {
      group_of_value[v->id] = gi;
      level[v->id] = lv;
    }
  }

  void propagate_deps(const Node& n) {
    std::set<int> d;
    for (const Value* u : n.inputs)
      if (u) d.insert(deps[u->id].begin(), deps[u->id].end());
    auto it = node_group.find(&n);
    if (it != node_group.end()) d.insert(it->second);
    for (const Value* v : n.outputs)
      if (v) deps[v->id] = d;
  }

  // decide_layouts runs before the groups exist, so it can pick channels-last or a transposed order
  // for a value whose producer or reader then stays a core node (a convolution whose input turned out
  // to be a view conv_spec refuses, a dot_general matmul_spec refuses, a reduce over unit axes): such
  // a node reads and writes row-major, and the kernels on the other side would read the buffer in the
  // wrong order (ConvNeXt's downsample). The values with a non-row-major layout whose producer, or a
  // reader (directly or through folded views), is in no group and no channels-last step, or that reach
  // a graph output. (A step with one operand left row-major makes its other operands and its result
  // violations: the next round leaves them row-major too.)
  std::vector<int> layout_violations() const {
    std::map<const Value*, std::vector<const Node*>> consumers;
    for (const auto& n : g.nodes())
      for (const Value* u : n->inputs)
        if (u) consumers[u].push_back(n.get());
    auto grouped = [&](const Node* n) { return node_group.count(n) > 0 || nhwc_step(*n); };
    // a graph output is read by the caller, row-major: a view there stays a core node
    std::function<bool(const Value*)> readers_grouped = [&](const Value* v) {
      if (std::find(g.outputs.begin(), g.outputs.end(), v) != g.outputs.end()) return false;
      auto it = consumers.find(v);
      if (it == consumers.end()) return true;
      for (const Node* c : it->second) {
        if (grouped(c)) continue;
        const Value* out = c->outputs.empty() ? nullptr : c->outputs[0];
        if (!out || !is_view[out->id] || !readers_grouped(out)) return false;
      }
      return true;
    };
    std::vector<int> bad;
    for (const auto& v : g.values()) {
      if (!nhwc[v->id] && order[v->id].empty()) continue;
      if (!v->producer || !grouped(v->producer) || !readers_grouped(v.get())) bad.push_back(v->id);
    }
    return bad;
  }

  std::optional<MatmulSpec> matmul_spec(const Node& n) const;
  std::optional<ConvSpec> conv_spec(const Node& n) const;
  // How a convolution reads its input x straight from the memory of x's root: as NCHW (false) or
  // NHWC (true, e.g. convnext's LayerNorm2d result permuted back to NCHW, a view of an [N, H, W, C]
  // buffer); nullopt when neither.
  std::optional<bool> conv_input_layout(const Value* x) const;

  void run() {
    init();
    for (const auto& up : g.nodes()) {
      const Node& n = *up;
      if (is_core(n) && sized_node(n) && is_view_op(n.op->core) && n.inputs[0]) {
        if (auto v = view_of(n, views[n.inputs[0]->id])) {
          views[n.outputs[0]->id] = *v;
          is_view[n.outputs[0]->id] = true;
          group_of_value[n.outputs[0]->id] = -1;
          propagate_deps(n);
          continue;
        }
      }
      if (!is_core(n) || !sized_node(n)) {
        propagate_deps(n);
        continue;
      }
      const std::optional<CoreOp> op = n.op->core;
      if (opts.matmul && op == CoreOp::dot_general && matmul_spec(n)) {
        start_group(n, GKind::matmul, dims(n.outputs[0]), {});
      } else if (opts.matmul && op == CoreOp::convolution && conv_spec(n)) {
        start_group(n, GKind::conv, dims(n.outputs[0]), {});
      } else if (pointwise_ok(n) || reduce_ok(n)) {
        bool joined = false;
        if (opts.fuse) {
          for (int gi : candidate_groups(n)) {
            Level lv;
            if (can_join(n, gi, &lv)) {
              if (op == CoreOp::reduce && !groups[gi].reduces) {
                groups[gi].reduces = true;
                std::vector<bool> mask(groups[gi].F.size(), false);
                for (int64_t a : n.attr_ints("axes")) mask[static_cast<size_t>(a)] = true;
                groups[gi].R = mask;
              }
              assign(n, gi, lv);
              joined = true;
              break;
            }
          }
        }
        if (!joined) {
          if (op == CoreOp::reduce) {
            const Dims x = dims(n.inputs[0]);
            std::vector<bool> mask(x.size(), false);
            for (int64_t a : n.attr_ints("axes")) mask[static_cast<size_t>(a)] = true;
            Dim inner = 1;
            for (size_t d = 0; d < x.size(); ++d)
              if (mask[d]) inner *= x[d];
            if (!at_most_one(inner)) {
              start_group(n, GKind::loop, x, mask, Level::row);
              groups.back().reduces = true;
            }
          } else {
            start_group(n, GKind::loop, dims(n.outputs[0]), std::vector<bool>(n.outputs[0]->type.shape.size(), false));
          }
        }
      }
      propagate_deps(n);
    }
    if (opts.fuse) merge_vertical();
    if (opts.fuse) merge_siblings();
  }

  // Vertical merging of elementwise loop groups: joining node by node puts a node with two producer
  // groups into one of them only, so a chain of updates whose operations start from inputs alone
  // (AdamW's p·decay, β1·m, β2·v) stays several loops. A plain elementwise loop group b that the plain
  // elementwise loop group a over the same space depends on joins a when no third group lies between
  // them and a's nodes read b's values directly (element i reads element i: no view), so the merged
  // loop computes b's values before a's in the same iteration.
  int vertical_merged = 0;
  std::map<int, int> merged_into;  // a group merged vertically -> the group it joined (deps[] keep old ids)
  int merged_id(int g) const {
    for (auto it = merged_into.find(g); it != merged_into.end(); it = merged_into.find(g)) g = it->second;
    return g;
  }
  void merge_vertical() {
    auto plain = [&](const Group& gr) {
      if (gr.kind != GKind::loop || gr.nodes.empty() || gr.reduces) return false;
      for (bool r : gr.R)
        if (r) return false;
      return true;
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t a = 0; a < groups.size() && !changed; ++a) {
        if (!plain(groups[a])) continue;
        const std::vector<int> producers(gdeps[a].begin(), gdeps[a].end());
        for (int b : producers) {
          const Group& ga = groups[a];
          const Group& gb = groups[static_cast<size_t>(b)];
          if (b == static_cast<int>(a) || !plain(gb) || ga.F != gb.F) continue;
          if (ga.nodes.size() + gb.nodes.size() > kMaxKernelNodes) continue;
          bool between = false;
          for (int x : gdeps[a])
            between = between || (x != b && reaches({x}, b));
          bool direct = true;
          for (const Node* n : ga.nodes)
            for (const Value* u : n->inputs) {
              if (!u) continue;
              const Value* root = views[u->id].root;
              const int rg = root ? group_of_value[root->id] : -1;
              if (rg == b && (root != u || is_view[u->id])) direct = false;
              // a path from b to a through a node in no group (a convolution, a library call)
              if (rg != b && rg != static_cast<int>(a))
                for (int d : deps[u->id]) between = between || merged_id(d) == b;
            }
          if (between || !direct) continue;
          for (const Node* n : gb.nodes) {
            node_group[n] = static_cast<int>(a);
            for (const Value* v : n->outputs) group_of_value[v->id] = static_cast<int>(a);
          }
          groups[a].nodes.insert(groups[a].nodes.end(), groups[static_cast<size_t>(b)].nodes.begin(),
                                 groups[static_cast<size_t>(b)].nodes.end());
          groups[static_cast<size_t>(b)].nodes.clear();
          merged_into[b] = static_cast<int>(a);
          gdeps[a].insert(gdeps[static_cast<size_t>(b)].begin(), gdeps[static_cast<size_t>(b)].end());
          for (auto& d : gdeps)
            if (d.erase(b)) d.insert(static_cast<int>(a));
          gdeps[a].erase(static_cast<int>(a));
          ++vertical_merged;
          changed = true;
          break;
        }
      }
    }
  }

  // Sibling (horizontal) fusion: loop kernels over the same iteration space that read a common
  // buffer and do not depend on each other become one kernel, so the buffer is read once.
  int siblings_merged = 0;
  void merge_siblings() {
    auto roots_read = [&](const Group& gr, int gi) {
      std::set<const Value*> r;
      for (const Node* n : gr.nodes)
        for (const Value* u : n->inputs) {
          const Value* root = views[u->id].root;
          if (group_of_value[root->id] != gi && !root->constant) r.insert(root);
        }
      return r;
    };
    for (size_t a = 0; a < groups.size(); ++a) {
      if (groups[a].kind != GKind::loop || groups[a].nodes.empty()) continue;
      for (size_t b = a + 1; b < groups.size(); ++b) {
        Group& ga = groups[a];
        Group& gb = groups[b];
        if (gb.kind != GKind::loop || gb.nodes.empty() || ga.F != gb.F || ga.R != gb.R || ga.reduces != gb.reduces) continue;
        if (ga.nodes.size() + gb.nodes.size() > kMaxKernelNodes) continue;
        const std::set<const Value*> ra = roots_read(ga, static_cast<int>(a)), rb = roots_read(gb, static_cast<int>(b));
        bool shared = false;
        for (const Value* v : ra) shared = shared || rb.count(v);
        if (!shared) continue;
        if (reaches(gdeps[a], static_cast<int>(b)) || reaches(gdeps[b], static_cast<int>(a))) continue;
        // b joins a
        for (const Node* n : gb.nodes) {
          node_group[n] = static_cast<int>(a);
          for (const Value* v : n->outputs) group_of_value[v->id] = static_cast<int>(a);
          ga.nodes.push_back(n);
        }
        gb.nodes.clear();
        gdeps[a].insert(gdeps[b].begin(), gdeps[b].end());
        gdeps[a].erase(static_cast<int>(a));
        for (auto& d : gdeps)
          if (d.erase(static_cast<int>(b))) d.insert(static_cast<int>(a));
        gdeps[a].erase(static_cast<int>(a));
        ++siblings_merged;
      }
    }
    // keep every group's nodes in graph order
    std::map<const Node*, size_t> pos;
    for (size_t i = 0; i < g.nodes().size(); ++i) pos[g.nodes()[i].get()] = i;
    for (Group& gr : groups)
      std::sort(gr.nodes.begin(), gr.nodes.end(), [&](const Node* x, const Node* y) { return pos[x] < pos[y]; });
  }

  void start_group(const Node& n, GKind kind, Dims F, std::vector<bool> R, Level lv = Level::elem) {
    Group gr;
    gr.kind = kind;
    gr.F = std::move(F);
    gr.R = R.empty() ? std::vector<bool>(gr.F.size(), false) : std::move(R);
    if (kind != GKind::loop) gr.anchor = &n;
    groups.push_back(std::move(gr));
    assign(n, static_cast<int>(groups.size()) - 1, lv);
  }
};

// Collapses a run of dims (sizes, strides) into one (size, stride), if they form a single stride.
std::optional<std::pair<Dim, Dim>> collapse(const Dims& sizes, const Dims& st) {
  Dim size = 1, stride = 0;
  bool first = true;
  for (size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i] == 1) continue;
    if (first) {
      stride = st[i];
      first = false;
    } else if (st[i] != stride * size) {
      return std::nullopt;
    }
    size *= sizes[i];
  }
  if (first) stride = 0;
  return std::make_pair(size, stride);
}

std::optional<MatmulSpec> Fuser::matmul_spec(const Node& n) const {
  const Value* a = n.inputs[0];
  const Value* b = n.inputs[1];
  if (a->type.dtype != DType::f32 || b->type.dtype != DType::f32) return std::nullopt;
  auto lb = n.attr_ints("lhs_batch", {}), rb = n.attr_ints("rhs_batch", {});
  auto lc = n.attr_ints("lhs_contract"), rc = n.attr_ints("rhs_contract");
  const Dims as = tessel::dims(a);
  const Dims bs = tessel::dims(b);
  auto pick = [](const Dims& s, const Dims& st, const std::vector<int64_t>& dims, Dims* sz, Dims* sd) {
    for (int64_t d : dims) {
      sz->push_back(s[static_cast<size_t>(d)]);
      sd->push_back(st[static_cast<size_t>(d)]);
    }
  };
  auto free_dims = [](size_t rank, const std::vector<int64_t>& x, const std::vector<int64_t>& y) {
    std::vector<int64_t> f;
    for (size_t d = 0; d < rank; ++d)
      if (std::find(x.begin(), x.end(), static_cast<int64_t>(d)) == x.end() &&
          std::find(y.begin(), y.end(), static_cast<int64_t>(d)) == y.end())
        f.push_back(static_cast<int64_t>(d));
    return f;
  };
  const View& av = views[a->id];
  const View& bv = views[b->id];
  if (av.root->type.dtype != DType::f32 || bv.root->type.dtype != DType::f32) return std::nullopt;
  if (!opts.symbolic_activation_matmuls && !av.root->constant && !bv.root->constant &&
      (!dims_static(as) || !dims_static(bs)))
    return std::nullopt;  // left a core dot_general (FuseOptions::symbolic_activation_matmuls)
  Dims s1, t1, s2, t2, s3, t3, s4, t4, s5, t5, s6, t6;
  pick(as, av.strides, lb, &s1, &t1);
  pick(as, av.strides, free_dims(as.size(), lb, lc), &s2, &t2);
  pick(as, av.strides, lc, &s3, &t3);
  pick(bs, bv.strides, rb, &s4, &t4);
  pick(bs, bv.strides, rc, &s5, &t5);
  pick(bs, bv.strides, free_dims(bs.size(), rb, rc), &s6, &t6);
  auto ab = collapse(s1, t1), am = collapse(s2, t2), ak = collapse(s3, t3);
  auto bb = collapse(s4, t4), bk = collapse(s5, t5), bn = collapse(s6, t6);
  if (!ab || !am || !ak || !bb || !bk || !bn) return std::nullopt;
  if (ak->first != bk->first) return std::nullopt;
  if (ab->first != bb->first && bb->first != 1) return std::nullopt;
  // a matrix dim read with stride 0 (a view broadcasting it: Expand of a row into rows) is no matrix the
  // library takes ("could not create a descriptor": fuzz seed 555345); the view is materialised instead
  auto broadcast = [](const std::pair<Dim, Dim>& d) { return d.second == 0 && !(d.first == 1); };
  if (broadcast(*am) || broadcast(*ak) || broadcast(*bk) || broadcast(*bn)) return std::nullopt;
  MatmulSpec m;
  m.batch = ab->first;
  m.m = am->first;
  m.k = ak->first;
  m.n = bn->first;
  m.a_offset = av.offset;
  m.a_batch = ab->second;
  m.a_m = am->second;
  m.a_k = ak->second;
  m.b_offset = bv.offset;
  m.b_batch = bb->first == 1 ? Dim(0) : bb->second;
  m.b_k = bk->second;
  m.b_n = bn->second;
  if (!provably_positive(m.m) || !provably_positive(m.n) || !provably_positive(m.k) || !provably_positive(m.batch)) return std::nullopt;
  return m;
}

std::optional<bool> Fuser::conv_input_layout(const Value* x) const {
  const View& v = views[x->id];
  const Dims s = dims(x);
  if (v.offset != 0 || dims_numel(dims(v.root)) != dims_numel(s)) return std::nullopt;
  if (v.root == x) return nhwc[x->id];  // not a view (or views not folded yet: decide_layouts)
  if (!opts.conv_input_views) return dims(v.root) == s ? std::optional<bool>(nhwc[v.root->id]) : std::nullopt;
  return conv_read_layout(v, s);
}

std::optional<ConvSpec> Fuser::conv_spec(const Node& n) const {
  const Value* x = n.inputs[0];
  const Value* w = n.inputs[1];
  const Value* y = n.outputs[0];
  if (x->type.dtype != DType::f32 || w->type.dtype != DType::f32) return std::nullopt;
  // 2-D, or 1-D (the Whisper-style audio front) as 2-D with H = 1 where the options allow it: the
  // [N, C, W] buffers are [N, C, 1, W] in memory.
  const size_t rank = x->type.shape.size();
  const bool conv1d = rank == 3 && opts.conv1d;
  if ((rank != 4 && !conv1d) || w->type.shape.size() != rank) return std::nullopt;
  // both operands read contiguously from their roots; the weights are a constant
  const View& wv = views[w->id];
  if (!wv.root->constant || wv.offset != 0) return std::nullopt;
  if (wv.root->type != w->type) return std::nullopt;
  const std::optional<bool> x_nhwc = conv_input_layout(x);
  if (!x_nhwc) return std::nullopt;
  ConvSpec c;
  auto as_2d = [&](Dims s) {
    if (conv1d) s.insert(s.begin() + 2, Dim(1));
    return s;
  };
  const Dims xs = as_2d(dims(x)), ws = as_2d(dims(w)), ys = as_2d(dims(y));
  // only the batch may be symbolic
  for (size_t d = 1; d < xs.size(); ++d)
    if (xs[d].is_symbolic() || ys[d].is_symbolic()) return std::nullopt;
  c.n = xs[0], c.c = xs[1], c.h = xs[2], c.wd = xs[3];
  c.oc = ws[0], c.kh = ws[2], c.kw = ws[3];
  c.oh = ys[2], c.ow = ys[3];
  const size_t sp = rank - 2;  // spatial dims
  auto st = n.attr_ints("strides", std::vector<int64_t>(sp, 1));
  auto dl = n.attr_ints("dilations", std::vector<int64_t>(sp, 1));
  auto pd = n.attr_ints("padding", std::vector<int64_t>(2 * sp, 0));
  if (st.size() != sp || dl.size() != sp || pd.size() != 2 * sp) return std::nullopt;
  if (conv1d) {
    st.insert(st.begin(), 1);
    dl.insert(dl.begin(), 1);
    pd.insert(pd.begin(), {0, 0});
  }
  c.stride_h = st[0], c.stride_w = st[1];
  c.dil_h = dl[0], c.dil_w = dl[1];
  // padding: (low, high) per spatial dim, as [h_low, h_high, w_low, w_high]
  c.pad_top = pd[0], c.pad_bottom = pd[1], c.pad_left = pd[2], c.pad_right = pd[3];
  c.x_nhwc = *x_nhwc;
  c.groups = n.attr_i("groups", 1);
  if (c.groups <= 0 || c.c % c.groups || c.oc % c.groups || ws[1] != c.c / c.groups) return std::nullopt;
  for (int64_t p : pd)
    if (p < 0) return std::nullopt;
  return c;
}

// ---- lowering ------------------------------------------------------------------------------------

constexpr int kScratchArg = -1000;  // an access's arg before args are numbered: the scratch buffer

struct Lowering {
  Fuser& fz;
  const Group& gr;
  int gi;
  Kernel k;
  std::vector<const Value*> ins;          // node inputs (roots read from memory)
  std::vector<const Value*> outs;         // node outputs (materialised member values)
  std::vector<int> loop_of_dim;           // F dim -> loop dim (-1: size 1, dropped)
  std::map<std::pair<int, int>, int> elem_memo;  // (value id, phase) -> instr
  std::map<int, int> row_memo;                    // value id -> instr
  std::map<int, int> phase_of;                    // value id -> phase where an element value is computable / row value available

  Lowering(Fuser& f, int g_index) : fz(f), gr(f.groups[g_index]), gi(g_index) {}

  int arg_of_input(const Value* root) {
    for (size_t i = 0; i < ins.size(); ++i)
      if (ins[i] == root) return static_cast<int>(i);
    ins.push_back(root);
    return static_cast<int>(ins.size()) - 1;
  }

  // The access for a value of shape `s` whose elements sit at `strides` (offset `offset`) in
  // buffer `arg`, read at element level (shape F) or row level (F without, or with unit, reduced dims).
  int access(int arg, const Dim& offset, const Dims& s, const Dims& strides, Level lv) {
    Dims fstr(gr.F.size(), Dim(0));  // stride per dim of F
    if (lv == Level::elem || s.size() == gr.F.size()) {
      for (size_t d = 0; d < s.size(); ++d) fstr[d] = s[d] == 1 ? Dim(0) : strides[d];
    } else {
      size_t j = 0;
      for (size_t d = 0; d < gr.F.size(); ++d)
        if (!gr.R[d]) {
          fstr[d] = s[j] == 1 ? Dim(0) : strides[j];
          ++j;
        }
    }
    KAccess a;
    a.arg = arg;
    a.offset = offset;
    a.strides.assign(static_cast<size_t>(k.loop_rank()), Dim(0));
    for (size_t d = 0; d < gr.F.size(); ++d)
      if (loop_of_dim[d] >= 0) a.strides[static_cast<size_t>(loop_of_dim[d])] += fstr[d];
    return intern_access(a);
  }

  // Reading value u (through its view of a root buffer).
  int access_for(const Value* u, Level lv) {
    const View& v = fz.views[u->id];
    return access(arg_of_input(v.root), v.offset, dims(u), v.strides, lv);
  }

  // Writing member value v into its own buffer (arg numbers of outputs are fixed up later).
  int store_access(const Value* v, Level lv) {
    const int out = static_cast<int>(std::find(outs.begin(), outs.end(), v) - outs.begin());
    return access(-1 - out, 0, dims(v), fz.physical_strides(v), lv);
  }

  // The stored value behind arg index `arg` once args are numbered (inputs, outputs, scratch), or null.
  const Value* output_value(int arg) const {
    const int i = arg - static_cast<int>(ins.size());
    return i >= 0 && i < static_cast<int>(outs.size()) ? outs[static_cast<size_t>(i)] : nullptr;
  }

  int add(KInstr in) {
    k.body.push_back(std::move(in));
    return static_cast<int>(k.body.size()) - 1;
  }

  // A one-element constant read through any view is a literal of the body.
  std::optional<KInstr> scalar_constant(const Value* u) const {
    const Value* root = fz.views[u->id].root;
    if (!root->constant || root->constant->numel() != 1) return std::nullopt;
    KInstr in;
    in.kind = KInstrKind::constant;
    in.dtype = u->type.dtype;
    const DType t = u->type.dtype;
    in.value = (t == DType::f32 || t == DType::f64) ? root->constant->get_f(0) : static_cast<double>(root->constant->get_i(0));
    in.row = true;
    in.phase = 0;
    return in;
  }

  // Accesses are shared by loads and stores that read or write the same elements.
  int intern_access(const KAccess& a) {
    for (size_t i = 0; i < k.accesses.size(); ++i) {
      const KAccess& b = k.accesses[i];
      if (b.arg == a.arg && b.offset == a.offset && b.strides == a.strides) return static_cast<int>(i);
    }
    k.accesses.push_back(a);
    return static_cast<int>(k.accesses.size()) - 1;
  }

  const Value* strip_row_view(const Value* u) const {
    const Value* cur = u;
    while (cur->producer && fz.is_view[cur->id]) cur = cur->producer->inputs[0];
    return cur;
  }

  bool is_member(const Value* u) const { return fz.group_of_value[u->id] == gi && !fz.is_view[u->id]; }

  // Phase from which operand u is available: 0 from memory, else its member's phase.
  int phase_needed(const Value* u) {
    const Value* base = strip_row_view(u);
    return is_member(base) ? phase_of.at(base->id) : 0;
  }

  void compute_phases() {
    for (const Node* n : gr.nodes) {
      int p = 0;
      for (const Value* u : n->inputs) p = std::max(p, phase_needed(u));
      if (is_core_op(*n, CoreOp::reduce)) p += 1;  // the result is available after the loop
      if (n == gr.anchor) p = 0;
      phase_of[n->outputs[0]->id] = p;
    }
  }

  KInstr from_node(const Node& n, std::vector<int> args) {
    if (!n.op->core) fail("'{}' ({}) is fused but is no core primitive", n.name, n.op->name);
    KInstr in;
    in.core = *n.op->core;
    in.dtype = n.outputs[0]->type.dtype;
    in.args = std::move(args);
    if (in.is(CoreOp::compare)) in.attr = n.attr_s("direction");
    if (in.is(CoreOp::reduce)) in.attr = n.attr_s("kind");
    return in;
  }

  // Element value u in phase p.
  int elem(const Value* u, int p) {
    auto key = std::make_pair(u->id, p);
    if (auto it = elem_memo.find(key); it != elem_memo.end()) return it->second;
    int id;
    const Value* base = strip_row_view(u);
    if (fz.is_view[u->id] && fz.group_of_value[base->id] == gi && fz.level[base->id] == Level::row) {
      id = row(base);  // a row value broadcast to every element
    } else if (is_member(u) && u->producer != gr.anchor) {
      const Node& n = *u->producer;
      std::vector<int> args;
      for (const Value* x : n.inputs) args.push_back(elem(x, p));
      KInstr in = from_node(n, args);
      in.phase = p;
      id = add(in);
    } else if (!is_member(u) && scalar_constant(u)) {
      id = row(u);
    } else {
      KInstr in;
      in.kind = KInstrKind::load;
      in.dtype = u->type.dtype;
      in.access = (is_member(u) && u->producer == gr.anchor) ? acc_access : access_for(u, Level::elem);
      in.phase = p;
      // a load that does not vary along the inner dims is a row value
      const KAccess& a = k.accesses[static_cast<size_t>(in.access)];
      bool row_load = true;
      for (size_t d = k.outer.size(); d < a.strides.size(); ++d) row_load = row_load && a.strides[d] == 0;
      if (row_load && gr.kind == GKind::loop && !k.outer.empty()) {
        in.row = true;
        in.phase = 0;
      }
      id = add(in);
    }
    elem_memo[key] = id;
    return id;
  }

  int acc_access = -1;  // where the library result is read (matmul / conv kernels)

  // Row value u (a member at row level, or a row view of one, or a row-shaped value in memory).
  int row(const Value* u) {
    const Value* base = strip_row_view(u);
    if (fz.group_of_value[base->id] == gi && fz.level[base->id] == Level::row) {
      if (auto it = row_memo.find(base->id); it != row_memo.end()) return it->second;
      const Node& n = *base->producer;
      int id;
      if (is_core_op(n, CoreOp::reduce)) {
        const int p = phase_of.at(base->id) - 1;
        KInstr in = from_node(n, {elem(n.inputs[0], p)});
        in.phase = p;
        id = add(in);
      } else {
        std::vector<int> args;
        for (const Value* x : n.inputs) args.push_back(row(x));
        KInstr in = from_node(n, args);
        in.row = true;
        in.phase = phase_of.at(base->id);
        id = add(in);
      }
      row_memo[base->id] = id;
      return id;
    }
    if (auto it = row_memo.find(-1 - u->id); it != row_memo.end()) return it->second;
    if (auto c = scalar_constant(u)) {
      const int id = add(*c);
      row_memo[-1 - u->id] = id;
      return id;
    }
    KInstr in;
    in.kind = KInstrKind::load;
    in.dtype = u->type.dtype;
    in.access = access_for(u, Level::row);
    in.row = true;
    in.phase = 0;
    const int id = add(in);
    row_memo[-1 - u->id] = id;
    return id;
  }

  void lower();
};

void Lowering::lower() {
  // Library operands first, so they are args 0 and 1.
  if (gr.anchor) {
    arg_of_input(fz.views[gr.anchor->inputs[0]->id].root);
    arg_of_input(fz.views[gr.anchor->inputs[1]->id].root);
  }
  // Outputs: member values something outside the group reads (directly or through views).
  std::map<const Value*, std::vector<const Node*>> consumers;
  for (const auto& n : fz.g.nodes())
    for (const Value* u : n->inputs)
      if (u) consumers[u].push_back(n.get());
  std::function<bool(const Value*)> inside_only = [&](const Value* u) {
    if (std::find(fz.g.outputs.begin(), fz.g.outputs.end(), u) != fz.g.outputs.end()) return false;
    for (const Node* c : consumers[u]) {
      auto it = fz.node_group.find(c);
      if (it != fz.node_group.end() && it->second == gi) continue;
      if (fz.is_view[c->outputs[0]->id] && inside_only(c->outputs[0])) continue;
      return false;
    }
    return true;
  };
  for (const Node* n : gr.nodes)
    if (!inside_only(n->outputs[0])) outs.push_back(n->outputs[0]);
  // View values consumed inside (row views) may themselves be used outside: those are handled by
  // the view nodes that stay in the graph, reading the stored root.

  // Loop space.
  const int rank = static_cast<int>(gr.F.size());
  std::vector<int> outer_dims, inner_dims;
  for (int d = 0; d < rank; ++d) {
    if (gr.F[static_cast<size_t>(d)] == 1) continue;
    if (gr.kind == GKind::loop && gr.reduces ? gr.R[static_cast<size_t>(d)] : false)
      inner_dims.push_back(d);
    else
      outer_dims.push_back(d);
  }
  if (!(gr.kind == GKind::loop && gr.reduces) && !outer_dims.empty()) {
    // Walk the memory of the first stored value in order: channels-last outputs put C innermost.
    for (const Value* o : outs)
      if (fz.nhwc[o->id] && dims(o) == gr.F) {
        std::vector<int> order;
        for (int d : {0, 2, 3, 1})
          if (std::find(outer_dims.begin(), outer_dims.end(), d) != outer_dims.end()) order.push_back(d);
        outer_dims = order;
        break;
      }
    inner_dims.push_back(outer_dims.back());
    outer_dims.pop_back();
  }
  loop_of_dim.assign(static_cast<size_t>(rank), -1);
  for (size_t i = 0; i < outer_dims.size(); ++i) {
    loop_of_dim[static_cast<size_t>(outer_dims[i])] = static_cast<int>(i);
    k.outer.push_back(gr.F[static_cast<size_t>(outer_dims[i])]);
  }
  for (size_t i = 0; i < inner_dims.size(); ++i) {
    loop_of_dim[static_cast<size_t>(inner_dims[i])] = static_cast<int>(outer_dims.size() + i);
    k.inner.push_back(gr.F[static_cast<size_t>(inner_dims[i])]);
  }
  if (k.inner.empty()) k.inner.push_back(1);

  compute_phases();
  if (gr.kind != GKind::loop) {
    // the library result in memory: the dot/conv value; if it is not an output, it lives in an
    // output of the same shape that the epilogue overwrites in place, or in a scratch buffer
    const Value* acc = gr.anchor->outputs[0];
    const bool stored = std::find(outs.begin(), outs.end(), acc) != outs.end();
    if (stored) {
      acc_access = store_access(acc, Level::elem);
    } else {
      const Value* host = nullptr;
      for (const Value* o : outs)
        if (o->type == acc->type && phase_of.at(o->id) == 0 && fz.level[o->id] == Level::elem) host = o;
      if (host) {
        acc_access = store_access(host, Level::elem);
      } else {
        acc_access = access(kScratchArg, 0, dims(acc), dims_strides(dims(acc)), Level::elem);
      }
    }
  }
  // Stores.
  int max_phase = 0;
  for (const Value* v : outs) {
    if (gr.anchor && v == gr.anchor->outputs[0]) continue;  // written by the library call
    const Level lv = fz.level[v->id];
    const int p = phase_of.at(v->id);
    KInstr st;
    st.kind = KInstrKind::store;
    st.dtype = v->type.dtype;
    if (lv == Level::elem) {
      st.args = {elem(v, p)};
      st.phase = p;
      max_phase = std::max(max_phase, p);
    } else {
      st.args = {row(v)};
      st.row = true;
      st.phase = p;
      max_phase = std::max(max_phase, p - 1);
    }
    st.access = store_access(v, lv);
    add(st);
  }
  for (const KInstr& in : k.body)
    if (!in.row) max_phase = std::max(max_phase, in.phase);
  k.phases = max_phase + 1;
  for (KInstr& in : k.body)
    if (in.row) in.phase = std::min(in.phase, k.phases);

  // Args: inputs, outputs, scratch; fix access arg indices.
  const int nin = static_cast<int>(ins.size());
  for (const Value* v : ins) k.args.push_back(KArg{v->name, v->type, KArg::Role::in});
  for (const Value* v : outs) k.args.push_back(KArg{v->name, v->type, KArg::Role::out});
  int scratch = -1;
  for (KAccess& a : k.accesses) {
    if (a.arg == kScratchArg) {
      if (scratch < 0) {
        scratch = static_cast<int>(k.args.size());
        k.args.push_back(KArg{"scratch0", gr.anchor->outputs[0]->type, KArg::Role::scratch});
      }
      a.arg = scratch;
    } else if (a.arg < 0) {
      a.arg = nin + (-1 - a.arg);
    }
  }
  if (gr.kind != GKind::loop) {
    const int c = k.accesses[static_cast<size_t>(acc_access)].arg;
    if (gr.kind == GKind::matmul) {
      k.kind = KernelKind::matmul;
      k.mm = *fz.matmul_spec(*gr.anchor);
      k.mm.a = arg_of_input(fz.views[gr.anchor->inputs[0]->id].root);
      k.mm.b = arg_of_input(fz.views[gr.anchor->inputs[1]->id].root);
      k.mm.c = c;
      if (const Value* cv = output_value(c); cv && !fz.order[cv->id].empty()) {
        auto cs = fz.matmul_result_strides(*gr.anchor, fz.physical_strides(cv));
        k.mm.c_batch = (*cs)[0], k.mm.c_m = (*cs)[1], k.mm.c_n = (*cs)[2];
      }
    } else {
      k.kind = KernelKind::conv;
      k.conv = *fz.conv_spec(*gr.anchor);
      k.conv.x = arg_of_input(fz.views[gr.anchor->inputs[0]->id].root);
      k.conv.w = arg_of_input(fz.views[gr.anchor->inputs[1]->id].root);
      k.conv.y = c;
      const Value* yv = output_value(c);
      k.conv.y_nhwc = yv && fz.nhwc[yv->id];
    }
  }

  // Provenance and traffic.
  std::set<std::string> seen;
  for (const Node* n : gr.nodes) {
    if (seen.insert(n->name).second) k.sources.push_back(n->name);
    bool sym = false;
    for (const Value* v : n->inputs) sym = sym || (v && v->type.symbolic());
    for (const Value* v : n->outputs) sym = sym || (v && v->type.symbolic());
    if (!sym) {
      k.bytes_unfused += static_cast<int64_t>(op_cost(*n).bytes);
      continue;
    }
    // symbolic: every operand and result once (the default cost's bytes, as an expression)
    for (const auto* vs : {&n->inputs, &n->outputs})
      for (const Value* v : *vs)
        if (v) k.bytes_unfused += dims_numel(dims(v)) * dtype_size(v->type.dtype);
  }
  k.fused_nodes = static_cast<int>(gr.nodes.size());
}

// Bytes the kernel moves: every output written once, and of every input the elements its loads and
// the library call touch (a view of part of a buffer reads only that part).
// Symbolic sizes: a maximum or minimum the provers cannot decide takes the buffer's whole size.
Dim fused_traffic(const Kernel& k) {
  auto max_dim = [](const Dim& a, const Dim& b) { return provably_ge(a, b) ? a : provably_ge(b, a) ? b : a + b; };
  Dims touched(k.args.size(), Dim(0));
  auto extent = [&](size_t d) { return d < k.outer.size() ? k.outer[d] : k.inner[d - k.outer.size()]; };
  for (const KAccess& a : k.accesses) {
    Dim n = 1;
    for (size_t d = 0; d < a.strides.size(); ++d)
      if (a.strides[d] != 0) n *= extent(d);
    touched[static_cast<size_t>(a.arg)] = max_dim(touched[static_cast<size_t>(a.arg)], n);
  }
  if (k.kind == KernelKind::matmul) {
    const MatmulSpec& m = k.mm;
    const Dim ea = (m.a_batch != 0 ? m.batch : Dim(1)) * m.m * m.k, eb = (m.b_batch != 0 ? m.batch : Dim(1)) * m.k * m.n;
    if (m.a == m.b) {  // two parts of one buffer (attention: Q and K out of the qkv result)
      touched[static_cast<size_t>(m.a)] = max_dim(touched[static_cast<size_t>(m.a)], ea + eb);
    } else {
      touched[static_cast<size_t>(m.a)] = max_dim(touched[static_cast<size_t>(m.a)], ea);
      touched[static_cast<size_t>(m.b)] = max_dim(touched[static_cast<size_t>(m.b)], eb);
    }
  } else if (k.kind == KernelKind::conv) {
    touched[static_cast<size_t>(k.conv.x)] = dims_numel(k.args[static_cast<size_t>(k.conv.x)].type.dims());
    touched[static_cast<size_t>(k.conv.w)] = dims_numel(k.args[static_cast<size_t>(k.conv.w)].type.dims());
  }
  Dim bytes = 0;
  for (size_t i = 0; i < k.args.size(); ++i) {
    const KArg& a = k.args[i];
    if (a.role == KArg::Role::scratch) continue;
    const Dim numel = dims_numel(a.type.dims());
    const Dim n = a.role == KArg::Role::out ? numel : provably_ge(numel, touched[i]) ? touched[i] : numel;
    bytes += n * dtype_size(a.type.dtype);
  }
  return bytes;
}

// Merges adjacent loop dims that every access walks as one (stride[d] == stride[d+1] * size[d+1]),
// within the outer dims and within the inner dims.
void collapse_loops(Kernel& k) {
  auto try_merge = [&](Dims& dims, size_t base) {
    for (size_t i = dims.size(); i-- > 1;) {
      const size_t d = base + i - 1;  // merge loop dims d and d+1
      bool ok = true;
      for (const KAccess& a : k.accesses) ok = ok && a.strides[d] == a.strides[d + 1] * dims[i];
      if (!ok) continue;
      dims[i - 1] *= dims[i];
      dims.erase(dims.begin() + static_cast<long>(i));
      for (KAccess& a : k.accesses) {
        a.strides[d] = a.strides[d + 1];
        a.strides.erase(a.strides.begin() + static_cast<long>(d) + 1);
      }
    }
  };
  try_merge(k.inner, k.outer.size());
  try_merge(k.outer, 0);
  // a pointwise kernel that collapsed to one outer and one inner dim may become one inner dim
  if (k.phases == 1 && k.kind == KernelKind::loop && k.outer.size() == 1 && k.inner.size() == 1) {
    bool reduce = false;
    for (const KInstr& in : k.body) reduce = reduce || in.is(CoreOp::reduce) || (in.row && !in.is(KInstrKind::constant));
    bool ok = !reduce;
    for (const KAccess& a : k.accesses) ok = ok && a.strides[0] == a.strides[1] * k.inner[0];
    if (ok) {
      k.inner[0] *= k.outer[0];
      k.outer.clear();
      for (KAccess& a : k.accesses) a.strides.erase(a.strides.begin());
    }
  }
}

// Orders nodes so every value is defined before use, keeping the original order where possible.
void topo_sort(Graph& g) {
  auto& nodes = g.mutable_nodes();
  std::map<const Value*, size_t> producer;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const Value* v : nodes[i]->outputs)
      if (v) producer[v] = i;
  std::vector<int> indeg(nodes.size(), 0);
  std::vector<std::vector<size_t>> users(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::set<size_t> preds;
    for (const Value* v : nodes[i]->inputs)
      if (v)
        if (auto it = producer.find(v); it != producer.end() && it->second != i) preds.insert(it->second);
    indeg[i] = static_cast<int>(preds.size());
    for (size_t p : preds) users[p].push_back(i);
  }
  std::set<size_t> ready;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (indeg[i] == 0) ready.insert(i);
  std::vector<size_t> order;
  while (!ready.empty()) {
    const size_t i = *ready.begin();
    ready.erase(ready.begin());
    for (size_t u : users[i])
      if (--indeg[u] == 0) ready.insert(u);
    order.push_back(i);
  }
  if (order.size() != nodes.size()) {
    std::string left;
    for (size_t i = 0; i < nodes.size(); ++i)
      if (indeg[i] > 0) left += (left.empty() ? "" : ", ") + nodes[i]->name + " (" + nodes[i]->op->name + ")";
    fail("fusion produced a cycle between kernels; nodes on it: {}", left);
  }
  std::vector<std::unique_ptr<Node>> out;
  for (size_t i : order) out.push_back(std::move(nodes[i]));
  nodes = std::move(out);
}

}  // namespace

KernelModule fuse(std::unique_ptr<Graph> core, const FuseOptions& opts) {
  KernelModule m;
  // Layouts are this pass's decision alone: a `layout` an input graph carries is dropped.
  for (auto& n : core->mutable_nodes()) n->attrs.erase("layout");
  if (opts.matmul) densify_library_constants(*core);
  if (opts.matmul && opts.conv_input_views) densify_conv_inputs(*core);
  // Layouts are chosen before grouping; a choice the groups cannot honour is dropped and fusion runs
  // again (each round leaves at least one more value row-major, so this ends).
  std::set<int> row_major;
  std::optional<Fuser> fuser;
  for (;;) {
    fuser.emplace(*core, opts, row_major);
    fuser->run();
    const std::vector<int> bad = fuser->layout_violations();
    if (bad.empty()) break;
    row_major.insert(bad.begin(), bad.end());
  }
  Fuser& fz = *fuser;
  for (auto& n : core->mutable_nodes())
    if (fz.nhwc_step(*n)) n->attrs["layout"] = std::string("nhwc");
  std::vector<Kernel> kernels;
  std::vector<std::vector<const Value*>> node_ins, node_outs;
  for (size_t gi = 0; gi < fz.groups.size(); ++gi) {
    if (fz.groups[gi].nodes.empty()) continue;  // merged into a sibling
    Lowering lw(fz, static_cast<int>(gi));
    lw.lower();
    collapse_loops(lw.k);
    lw.k.bytes_fused = fused_traffic(lw.k);
    lw.k.name = "k" + std::to_string(kernels.size());
    node_ins.push_back(lw.ins);
    node_outs.push_back(lw.outs);
    kernels.push_back(std::move(lw.k));
  }
  // Rewrite: drop grouped nodes, add one kernel node per group (its outputs are the stored values).
  Graph& g = *core;
  std::set<const Node*> grouped;
  for (const auto& gr : fz.groups)
    for (const Node* n : gr.nodes) grouped.insert(n);
  std::vector<std::unique_ptr<Node>> kept;
  for (auto& n : g.mutable_nodes())
    if (!grouped.count(n.get())) kept.push_back(std::move(n));
  for (size_t gi = 0; gi < kernels.size(); ++gi) {
    auto nd = std::make_unique<Node>();
    nd->op = &kernel_op();
    nd->name = kernels[gi].sources.empty() ? kernels[gi].name : kernels[gi].sources.front();
    nd->attrs["kernel"] = static_cast<int64_t>(gi);
    for (const Value* v : node_ins[gi]) nd->inputs.push_back(const_cast<Value*>(v));
    int o = 0;
    for (const Value* v : node_outs[gi]) {
      Value* mv = const_cast<Value*>(v);
      mv->producer = nd.get();
      mv->producer_output = o++;
      nd->outputs.push_back(mv);
    }
    kept.push_back(std::move(nd));
  }
  // Outputs of grouped nodes that no kernel stores lose their producer (nothing reads them).
  for (const auto& gr : fz.groups)
    for (const Node* n : gr.nodes)
      for (Value* v : n->outputs)
        if (v->producer == n) v->producer = nullptr;
  g.mutable_nodes() = std::move(kept);
  topo_sort(g);
  // Views and other nodes whose results nobody reads.
  for (bool changed = true; changed;) {
    changed = false;
    std::vector<int> uses = g.use_counts();
    const size_t before = g.nodes().size();
    g.erase_nodes_if([&](const Node& n) {
      if (is_kernel_node(n)) return false;
      for (const Value* v : n.outputs)
        if (v && uses[v->id] > 0) return false;
      return n.op->deterministic;
    });
    changed = g.nodes().size() != before;
  }
  // Values without producer that are still read would be a lowering bug.
  for (const auto& n : g.nodes())
    for (const Value* v : n->inputs)
      if (v && !v->producer && !v->constant && !v->is_input)
        throw Error(Location{.node = n->name, .op = n->op->name, .pass = "fuse"},
                    fmt::format("value '{}' is read but no longer computed after fusion", v->name));
  g.compact();
  m.graph = std::move(core);
  m.kernels = std::move(kernels);
  return m;
}

}  // namespace tessel
