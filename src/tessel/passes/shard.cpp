// Tensor-parallel sharding by propagation (see shard.h; docs/multichip.md).
#include "tessel/passes/shard.h"

#include <fmt/format.h>

#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <algorithm>
#include <tuple>

#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/passes/pass.h"
#include "tessel/support/error.h"

namespace tessel {

namespace {

// How one source value is held across the ranks:
//  R: every rank holds it whole;
//  S: split along `dim` — `blocks` equal blocks, each cut into `ranks` equal pieces, rank r holding
//     piece r of every block (blocks > 1 only before a Split of that dim into `blocks` parts: Q, K and V
//     of one fused projection, each split across the ranks);
//  P: every rank holds a partial sum; the value is their sum.
enum class Kind { R, S, P };
struct Layout {
  Kind kind = Kind::R;
  int dim = -1;
  int blocks = 1;
};

int64_t prod(const Shape& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

// Rank r's piece of `t` along `dim` cut as Layout S(dim, blocks) over n ranks.
Tensor slice_tensor(const Tensor& t, int dim, int blocks, int n, int r) {
  const Shape& s = t.shape();
  const int64_t d = s[static_cast<size_t>(dim)];
  const int64_t piece = d / (int64_t(blocks) * n);
  Shape out_shape = s;
  out_shape[static_cast<size_t>(dim)] = piece * blocks;
  Tensor out(t.dtype(), out_shape);
  const int64_t outer = prod(s, 0, static_cast<size_t>(dim));
  const size_t inner = static_cast<size_t>(prod(s, static_cast<size_t>(dim) + 1, s.size())) * size_t(dtype_size(t.dtype()));
  const uint8_t* src = t.bytes();
  uint8_t* dst = out.bytes();
  for (int64_t o = 0; o < outer; ++o)
    for (int b = 0; b < blocks; ++b) {
      const int64_t first = int64_t(b) * (d / blocks) + int64_t(r) * piece;
      std::memcpy(dst, src + (size_t(o * d + first)) * inner, size_t(piece) * inner);
      dst += size_t(piece) * inner;
    }
  return out;
}

Tensor i64_tensor(const Shape& v) {
  return Tensor::from_i64(DType::i64, Shape{static_cast<int64_t>(v.size())}, v);
}

int norm_axis(int64_t axis, size_t rank) { return static_cast<int>(axis < 0 ? axis + int64_t(rank) : axis); }

class Sharder {
 public:
  Sharder(Graph& src, const InferResult& inf, int n, ShardKind kind) : src_(src), inf_(inf), n_(n), kind_(kind), map_(size_t(n)) {
    users_ = src_.users();
  }

  ShardedProgram run() {
    out_.ranks = n_;
    for (int r = 0; r < n_; ++r) {
      auto g = std::make_unique<Graph>();
      g->name = src_.name;
      out_.graphs.push_back(std::move(g));
    }
    out_.kind = kind_;
    for (const Value* v : src_.inputs)
      for (int r = 0; r < n_; ++r) map_[size_t(r)][v] = graph(r).add_input(v->name, v->type);
    if (kind_ == ShardKind::data) {  // each rank takes its rows of every input the ranks divide
      int split = 0;
      for (const Value* v : src_.inputs) {
        if (v->type.shape.empty() || v->type.shape[0] < n_ || v->type.shape[0] % n_ != 0) continue;
        std::vector<Value*> p = piece(v, 0, 1);
        for (int r = 0; r < n_; ++r) map_[size_t(r)][v] = p[size_t(r)];
        lay_[v] = Layout{Kind::S, 0, 1};
        ++split;
      }
      if (split == 0)
        throw Error(Location{.pass = "shard"}, fmt::format("dp={}: no input's first dim is a multiple of {} (the batch to split)", n_, n_));
    }
    for (const auto& n : src_.nodes()) node(*n);
    for (int r = 0; r < n_; ++r) graph(r).outputs.clear();
    for (const Value* v : src_.outputs) {
      std::vector<Value*> w = whole(v);
      for (int r = 0; r < n_; ++r) graph(r).outputs.push_back(w[size_t(r)]);
    }
    for (int r = 0; r < n_; ++r) {
      Graph& g = graph(r);
      // what the split left unread goes: a whole weight behind an Identity whose reader took its slices
      eliminate_dead_code(g);
      infer_graph(g);
    }
    for (const Value* c : src_.constants()) out_.weight_bytes += int64_t(c->constant->nbytes());
    for (const Value* c : graph(0).constants()) out_.weight_bytes_per_rank += int64_t(c->constant->nbytes());
    return std::move(out_);
  }

 private:
  Graph& graph(int r) { return *out_.graphs[size_t(r)]; }
  // The value `v` copies through Identity nodes (exports repeat a shared weight through them).
  static const Value* origin(const Value* v) {
    while (v->producer && v->producer->op_name() == "Identity" && v->producer->op->domain.empty()) v = v->producer->inputs[0];
    return v;
  }
  const Tensor* known(const Value* v) const {
    v = origin(v);
    if (v->constant) return &*v->constant;
    auto it = inf_.folded.find(v);
    return it == inf_.folded.end() ? nullptr : &it->second;
  }
  Layout layout(const Value* v) const {
    auto it = lay_.find(v);
    return it == lay_.end() ? Layout{} : it->second;
  }
  void note(const Node& n, std::string rule) { out_.decisions.push_back({n.name, n.op_name(), std::move(rule)}); }

  // Rank r's value for `v` as it is held (a source constant: the same tensor, shared).
  Value* at(int r, const Value* v) {
    auto& m = map_[size_t(r)];
    if (auto it = m.find(v); it != m.end()) return it->second;
    if (!v->constant) throw Error(Location{.pass = "shard"}, fmt::format("value '{}' has no rank value (graph not in topological order)", v->name));
    return m[v] = graph(r).add_constant(v->name, *v->constant);
  }
  std::vector<Value*> all(const Value* v) {
    std::vector<Value*> out;
    for (int r = 0; r < n_; ++r) out.push_back(v ? at(r, v) : nullptr);
    return out;
  }
  // Every input's rank values as they are held (an absent input stays absent), per input.
  std::vector<std::vector<Value*>> held_inputs(const Node& n) {
    std::vector<std::vector<Value*>> per_input;
    for (const Value* v : n.inputs) per_input.push_back(v ? all(v) : std::vector<Value*>{});
    return per_input;
  }
  // Whether every input after the first is whole on every rank.
  bool rest_replicated(const Node& n) const {
    for (size_t i = 1; i < n.inputs.size(); ++i)
      if (n.inputs[i] && layout(n.inputs[i]).kind != Kind::R) return false;
    return true;
  }

  const OpDef* op(const char* name) {
    const OpDef* d = OpRegistry::get().find(name);
    if (!d) throw Error(Location{.pass = "shard"}, fmt::format("op {} is not registered", name));
    return d;
  }
  // Appends one node to every rank's graph: op, name, per-rank inputs and attributes; its one output per rank.
  std::vector<Value*> emit(const char* opname, const std::string& name, const std::vector<std::vector<Value*>>& ins,
                           std::map<std::string, Attr> attrs) {
    std::vector<Value*> out;
    for (int r = 0; r < n_; ++r) {
      Graph& g = graph(r);
      Node* nn = g.add_node(op(opname), name, ins[size_t(r)], {g.unique_name(name)}, attrs);
      out.push_back(nn->outputs[0]);
    }
    return out;
  }
  std::vector<Value*> constants(const std::string& base, const std::function<Tensor(int)>& make) {
    std::vector<Value*> out;
    for (int r = 0; r < n_; ++r) {
      Graph& g = graph(r);
      out.push_back(g.add_constant(g.unique_name(base), make(r)));
    }
    return out;
  }

  // The value made whole on every rank: an all-gather of a split value, an all-reduce of partial sums.
  std::vector<Value*> whole(const Value* v) {
    const Layout l = layout(v);
    if (l.kind == Kind::R) return all(v);
    if (auto it = whole_.find(v); it != whole_.end()) return it->second;
    std::vector<std::vector<Value*>> ins;
    for (int r = 0; r < n_; ++r) ins.push_back({at(r, v)});
    std::vector<Value*> w;
    if (l.kind == Kind::P) {
      w = emit("AllReduce", v->name + "/all_reduce", ins, {{"ranks", int64_t(n_)}});
      ++out_.all_reduces;
    } else {
      w = emit("AllGather", v->name + "/all_gather", ins, {{"ranks", int64_t(n_)}, {"axis", int64_t(l.dim)}});
      ++out_.all_gathers;
      if (l.blocks > 1) w = unblock(v, w, l);
    }
    return whole_[v] = w;
  }
  // An all-gather of a blocked split lays the pieces out rank by rank ([r0: b0 b1 ..][r1: ..]); the
  // value wants them block by block: reshape the dim into (ranks, blocks, piece), swap the two, merge.
  std::vector<Value*> unblock(const Value* v, const std::vector<Value*>& g, const Layout& l) {
    const Shape& s = v->type.shape;
    const size_t d = static_cast<size_t>(l.dim);
    Shape split(s.begin(), s.begin() + long(d));
    split.push_back(n_);
    split.push_back(l.blocks);
    split.push_back(s[d] / (int64_t(n_) * l.blocks));
    split.insert(split.end(), s.begin() + long(d) + 1, s.end());
    std::vector<int64_t> perm(split.size());
    std::iota(perm.begin(), perm.end(), 0);
    std::swap(perm[d], perm[d + 1]);
    auto shape_a = constants(v->name + ".unblock_shape", [&](int) { return i64_tensor(split); });
    auto shape_b = constants(v->name + ".whole_shape", [&](int) { return i64_tensor(s); });
    std::vector<std::vector<Value*>> ins;
    for (int r = 0; r < n_; ++r) ins.push_back({g[size_t(r)], shape_a[size_t(r)]});
    auto a = emit("Reshape", v->name + "/unblock", ins, {});
    ins.clear();
    for (int r = 0; r < n_; ++r) ins.push_back({a[size_t(r)]});
    auto b = emit("Transpose", v->name + "/unblock", ins, {{"perm", perm}});
    ins.clear();
    for (int r = 0; r < n_; ++r) ins.push_back({b[size_t(r)], shape_b[size_t(r)]});
    return emit("Reshape", v->name + "/unblock", ins, {});
  }
  // A value every rank holds whole, cut to each rank's piece along `dim` (a constant: its slices; an
  // activation: a Slice node, blocks == 1 only). Empty when it cannot be cut.
  std::vector<Value*> piece(const Value* v, int dim, int blocks) {
    const auto key = std::make_tuple(known(v) ? origin(v) : v, dim, blocks);  // one slice of a weight, however it is reached
    if (auto it = pieces_.find(key); it != pieces_.end()) return it->second;
    const Shape& s = v->type.shape;
    if (s[size_t(dim)] % (int64_t(n_) * blocks) != 0) return {};
    std::vector<Value*> out;
    if (const Tensor* t = known(v)) {
      out = constants(v->name + ".shard", [&](int r) { return slice_tensor(*t, dim, blocks, n_, r); });
    } else if (blocks == 1) {
      const int64_t p = s[size_t(dim)] / n_;
      auto starts = constants(v->name + ".shard_start", [&](int r) { return i64_tensor({r * p}); });
      auto ends = constants(v->name + ".shard_end", [&](int r) { return i64_tensor({(r + 1) * p}); });
      auto axes = constants(v->name + ".shard_axis", [&](int) { return i64_tensor({dim}); });
      std::vector<std::vector<Value*>> ins;
      for (int r = 0; r < n_; ++r) ins.push_back({at(r, v), starts[size_t(r)], ends[size_t(r)], axes[size_t(r)]});
      out = emit("Slice", v->name + "/shard", ins, {});
    } else {
      return {};
    }
    return pieces_[key] = out;
  }

  // Copies `n` into every rank's graph reading ins[r]; its outputs take the layouts given.
  void copy(const Node& n, const std::vector<std::vector<Value*>>& ins, const std::vector<Layout>& outs,
            const std::vector<std::map<std::string, Attr>>* attrs = nullptr) {
    for (int r = 0; r < n_; ++r) graph(r).add_copy(n, ins[size_t(r)], map_[size_t(r)], attrs ? &(*attrs)[size_t(r)] : nullptr);
    for (size_t i = 0; i < n.outputs.size() && i < outs.size(); ++i)
      if (n.outputs[i] && outs[i].kind != Kind::R) lay_[n.outputs[i]] = outs[i];
  }
  std::vector<std::vector<Value*>> by_rank(const std::vector<std::vector<Value*>>& per_input) {
    std::vector<std::vector<Value*>> ins(static_cast<size_t>(n_));
    for (const auto& vs : per_input)
      for (int r = 0; r < n_; ++r) ins[size_t(r)].push_back(vs.empty() ? nullptr : vs[size_t(r)]);
    return ins;
  }
  std::vector<Layout> same(const Node& n, Layout l) { return std::vector<Layout>(n.outputs.size(), l); }

  // Every rank computes the node whole: its split inputs gathered, its partial sums reduced.
  void replicate(const Node& n) {
    std::vector<std::vector<Value*>> per_input;
    std::string made;
    for (const Value* v : n.inputs) {
      if (!v) { per_input.push_back({}); continue; }
      const Layout l = layout(v);
      if (l.kind != Kind::R)
        made += fmt::format("{}{} of '{}'", made.empty() ? "" : ", ", l.kind == Kind::P ? "all-reduce" : "all-gather", v->name);
      per_input.push_back(whole(v));
    }
    copy(n, by_rank(per_input), same(n, Layout{}));
    if (!made.empty()) note(n, "whole on every rank after " + made);
  }

  bool pointwise(const Node& n) const {
    return n.op->domain.empty() && n.op->fusion == FusionKind::pointwise && !n.has_attr("axis") && n.outputs.size() == 1;
  }

  // Blocks of a fused projection's columns: its output reaches, through pointwise ops reading
  // constants (a bias), one Split of the last dim into equal parts.
  int blocks_after(const Value* v) const {
    const Value* cur = v;
    for (int hop = 0; hop < 8; ++hop) {
      const auto& us = users_[size_t(cur->id)];
      if (us.size() > 1 && !src_.returns(cur)) return block_slices(cur, us);
      if (us.size() != 1 || src_.returns(cur)) return 1;
      const Node* u = us[0];
      if (u->op_name() == "Split" && u->op->domain.empty() && u->inputs[0] == cur) {
        const size_t rank = cur->type.shape.size();
        if (norm_axis(u->attr_i("axis", 0), rank) != int(rank) - 1) return 1;
        for (const Value* o : u->outputs)
          if (!o || o->type.shape != u->outputs[0]->type.shape) return 1;
        return static_cast<int>(u->outputs.size());
      }
      if (u->op_name() == "Reshape" && u->op->domain.empty() && u->inputs[0] == cur && !cur->type.shape.empty() &&
          !u->outputs[0]->type.shape.empty() && u->outputs[0]->type.shape.back() == cur->type.shape.back()) {
        cur = u->outputs[0];
        continue;
      }
      if (!pointwise(*u)) return 1;
      for (const Value* in : u->inputs)
        if (in && in != cur && !known(in)) return 1;
      cur = u->outputs[0];
    }
    return 1;
  }

  // A Slice's starts, ends, axes (normalised) and steps, when all of them are known.
  struct SliceArgs {
    std::vector<int64_t> starts, ends, steps;
    std::vector<int> axes;
    int entry(int axis) const {  // the entry slicing `axis`, -1 when none does
      for (size_t i = 0; i < axes.size(); ++i)
        if (axes[i] == axis) return int(i);
      return -1;
    }
  };
  std::optional<SliceArgs> slice_args(const Node& u) const {
    const size_t rank = u.inputs[0]->type.shape.size();
    const Tensor* st = known(u.inputs[1]);
    const Tensor* en = known(u.inputs[2]);
    const Tensor* ax = u.has_input(3) ? known(u.inputs[3]) : nullptr;
    const Tensor* sp = u.has_input(4) ? known(u.inputs[4]) : nullptr;
    if (!st || !en || (u.has_input(3) && !ax) || (u.has_input(4) && !sp)) return std::nullopt;
    SliceArgs s{st->to_i64(), en->to_i64(), {}, {}};
    if (ax) {
      for (int64_t a : ax->to_i64()) s.axes.push_back(norm_axis(a, rank));
    } else {
      for (size_t i = 0; i < s.starts.size(); ++i) s.axes.push_back(int(i));
    }
    s.steps = sp ? sp->to_i64() : std::vector<int64_t>(s.starts.size(), 1);
    if (s.ends.size() != s.starts.size() || s.axes.size() != s.starts.size() || s.steps.size() != s.starts.size())
      return std::nullopt;
    return s;
  }
  // A Slice's bounds along `axis` clamped to its size, when that axis is sliced with step 1.
  std::optional<std::pair<int64_t, int64_t>> slice_bounds(const Node& u, const SliceArgs& s, int axis) const {
    const int i = s.entry(axis);
    if (i < 0 || s.steps[size_t(i)] != 1) return std::nullopt;
    const int64_t size = u.inputs[0]->type.shape[size_t(axis)];
    auto clamp = [&](int64_t x) { return std::clamp(x < 0 ? x + size : x, int64_t(0), size); };
    return std::make_pair(clamp(s.starts[size_t(i)]), clamp(s.ends[size_t(i)]));
  }
  // Blocks of a fused projection read by Slices of its last dim, each one whole block.
  int block_slices(const Value* v, const std::vector<const Node*>& us) const {
    const int last = int(v->type.shape.size()) - 1;
    if (last < 0) return 1;
    const int64_t size = v->type.shape.back();
    int64_t len = -1;
    for (const Node* u : us) {
      if (u->op_name() != "Slice" || !u->op->domain.empty() || u->inputs[0] != v) return 1;
      const auto args = slice_args(*u);
      const auto b = args ? slice_bounds(*u, *args, last) : std::nullopt;
      if (!b || b->second <= b->first) return 1;
      const int64_t l = b->second - b->first;
      if ((len >= 0 && l != len) || b->first % l != 0 || size % l != 0) return 1;
      len = l;
    }
    return len > 0 ? int(size / len) : 1;
  }

  // A Slice along another axis than the split keeps it; a Slice of one whole block of a blocked split
  // takes each rank's piece of that block.
  bool slice(const Node& n) {
    const Value* x = n.inputs[0];
    const Layout l = layout(x);
    if (l.kind != Kind::S || !rest_replicated(n)) return false;
    const auto args = slice_args(n);
    if (!args) return false;
    std::vector<std::vector<Value*>> per_input = held_inputs(n);
    if (args->entry(l.dim) < 0) {  // another axis is sliced
      copy(n, by_rank(per_input), {l});
      return true;
    }
    const auto b = slice_bounds(n, *args, l.dim);
    if (!b) return false;
    const int64_t size = x->type.shape[size_t(l.dim)];
    const int64_t block = size / l.blocks;
    if (b->first == 0 && b->second == size) {  // the whole axis
      copy(n, by_rank(per_input), {l});
      return true;
    }
    if (l.blocks == 1 || b->second - b->first != block || b->first % block != 0) return false;
    // the axis's entry of starts and ends becomes the rank's piece of that block, in its local size
    const int64_t piece_len = block / n_;
    const int64_t first = b->first / block * piece_len;
    std::vector<int64_t> starts = args->starts, ends = args->ends;
    const size_t i = size_t(args->entry(l.dim));
    starts[i] = first;
    ends[i] = first + piece_len;
    per_input[1] = constants(n.inputs[1]->name + ".shard", [&](int) { return i64_tensor(starts); });
    per_input[2] = constants(n.inputs[2]->name + ".shard", [&](int) { return i64_tensor(ends); });
    copy(n, by_rank(per_input), {Layout{Kind::S, l.dim, 1}});
    note(n, fmt::format("block {} of a column-parallel projection, split across the ranks", b->first / block));
    return true;
  }

  void node(const Node& n) {
    bool split = false;
    for (const Value* v : n.inputs) split |= v && layout(v).kind != Kind::R;
    const std::string& op = n.op_name();
    const bool onnx = n.op->domain.empty();
    if (onnx && op == "MatMul" && matmul(n, split)) return;
    if (onnx && op == "Gemm" && gemm(n)) return;
    if (onnx && op == "Conv" && conv(n, split)) return;
    if (!split) return replicate(n);
    if (pointwise(n) && elementwise(n)) return;
    if (onnx && (op == "Reshape" || op == "Flatten") && reshape(n)) return;
    if (onnx && (op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool" || op == "GlobalMaxPool") && pool(n)) return;
    if (onnx && op == "Transpose" && transpose(n)) return;
    if (onnx && op == "Split" && split_op(n)) return;
    if (onnx && op == "Slice" && slice(n)) return;
    if (onnx && (op == "Softmax" || op == "LogSoftmax" || op == "LayerNormalization") && keeps_other_axes(n)) return;
    replicate(n);
  }

  // A bias added after a split contraction would be added once per rank: rank 0 adds it, the others add
  // zeros. Empty when the bias is not known.
  std::vector<Value*> on_rank0(const Value* c) {
    const Tensor* t = known(c);
    if (!t) return {};
    return constants(c->name + ".rank0", [&](int r) { return r == 0 ? *t : Tensor(c->type.dtype, c->type.shape); });
  }
  void note_columns(const Node& n, const Value* w, int64_t cols, int blocks) {
    note(n, fmt::format("column-parallel: '{}' {} split by columns, {} per rank{}", w->name, shape_str(w->type.shape), cols / n_,
                        blocks > 1 ? fmt::format(" ({} blocks of {})", blocks, cols / n_ / blocks) : ""));
  }

  bool matmul(const Node& n, bool split) {
    const Value* a = n.inputs[0];
    const Value* b = n.inputs[1];
    const Layout la = layout(a), lb = layout(b);
    const size_t ra = a->type.shape.size(), rb = b->type.shape.size();
    const size_t ro = n.outputs[0]->type.shape.size();
    const Tensor* w = known(b);
    if (!split) {  // column-parallel: a constant weight split by its columns
      if (!w || rb != 2 || kind_ != ShardKind::tensor) return false;
      const int64_t cols = b->type.shape[1];
      int blocks = blocks_after(n.outputs[0]);
      if (cols % (int64_t(n_) * blocks) != 0) blocks = 1;
      if (cols % n_ != 0) return false;
      auto wp = piece(b, 1, blocks);
      copy(n, by_rank({all(a), wp}), {Layout{Kind::S, int(ro) - 1, blocks}});
      note_columns(n, b, cols, blocks);
      return true;
    }
    if (ra < 2 || rb < 2) return false;
    // partial sums through a linear op: P @ R, R @ P
    if ((la.kind == Kind::P && lb.kind == Kind::R) || (la.kind == Kind::R && lb.kind == Kind::P)) {
      copy(n, by_rank({all(a), all(b)}), {Layout{Kind::P}});
      note(n, "partial sums stay partial (a matmul is linear)");
      return true;
    }
    // row-parallel: the contraction split, a constant weight split by its rows
    if (la.kind == Kind::S && la.dim == int(ra) - 1 && la.blocks == 1) {
      if (w && rb == 2 && lb.kind == Kind::R) {
        auto wp = piece(b, 0, 1);
        if (wp.empty()) return false;
        copy(n, by_rank({all(a), wp}), {Layout{Kind::P}});
        note(n, fmt::format("row-parallel: '{}' {} split by rows, {} per rank; partial sums", b->name,
                            shape_str(b->type.shape), b->type.shape[0] / n_));
        return true;
      }
      if (lb.kind == Kind::S && lb.dim == int(rb) - 2 && lb.blocks == 1) {
        copy(n, by_rank({all(a), all(b)}), {Layout{Kind::P}});
        note(n, "contraction split on both sides; partial sums");
        return true;
      }
      return false;
    }
    // rows or batch of A split (B whole or split alike), or B's columns split (A whole)
    auto broadcast_at = [&](const Value* v, size_t r, int od) {  // v's dim aligned with output dim od is absent or 1
      const int j = od - int(ro - r);
      return j < 0 || v->type.shape[size_t(j)] == 1;
    };
    if (la.kind == Kind::S && la.dim < int(ra) - 1) {
      const int od = la.dim + int(ro - ra);
      const bool rows = la.dim == int(ra) - 2;
      if (lb.kind == Kind::R && (rows || broadcast_at(b, rb, od))) {
        copy(n, by_rank({all(a), all(b)}), {Layout{Kind::S, od, la.blocks}});
        return true;
      }
      if (!rows && lb.kind == Kind::S && lb.dim + int(ro - rb) == od && lb.blocks == la.blocks) {
        copy(n, by_rank({all(a), all(b)}), {Layout{Kind::S, od, la.blocks}});
        return true;
      }
      return false;
    }
    if (la.kind == Kind::R && lb.kind == Kind::S) {
      const int od = lb.dim + int(ro - rb);
      if (lb.dim == int(rb) - 1 || (lb.dim < int(rb) - 2 && broadcast_at(a, ra, od))) {
        copy(n, by_rank({all(a), all(b)}), {Layout{Kind::S, od, lb.blocks}});
        return true;
      }
    }
    return false;
  }

  // Gemm (A B' alpha + C beta, 2-D): by the columns of a constant B when A is whole (a bias C of one row
  // split alike), by its rows when A's columns are split (partial sums; C added on rank 0 alone).
  bool gemm(const Node& n) {
    if (n.attr_i("transA", 0) != 0) return false;
    const Value* a = n.inputs[0];
    const Value* b = n.inputs[1];
    const Value* c = n.has_input(2) ? n.inputs[2] : nullptr;
    const Layout la = layout(a);
    if (layout(b).kind != Kind::R || (c && layout(c).kind != Kind::R) || !known(b)) return false;
    const bool tb = n.attr_i("transB", 0) != 0;
    const int64_t cols = b->type.shape[tb ? 0 : 1], rows = b->type.shape[tb ? 1 : 0];
    if (la.kind == Kind::R) {
      if (kind_ != ShardKind::tensor) return false;
      int blocks = blocks_after(n.outputs[0]);
      if (cols % (int64_t(n_) * blocks) != 0) blocks = 1;
      if (cols % n_ != 0) return false;
      std::vector<Value*> cp;
      if (c) {
        const Shape& cs = c->type.shape;
        if (cs.empty() || (cs.size() == 1 && cs[0] == 1) || (cs.size() == 2 && cs[1] == 1)) cp = all(c);   // a per-row or scalar bias
        else if ((cs.size() == 1 || cs[0] == 1)) cp = piece(c, int(cs.size()) - 1, blocks);
        if (cp.empty()) return false;
      }
      auto bp = piece(b, tb ? 0 : 1, blocks);
      copy(n, by_rank({all(a), bp, cp}), {Layout{Kind::S, 1, blocks}});
      note_columns(n, b, cols, blocks);
      return true;
    }
    if (la.kind == Kind::S && la.dim == 1 && la.blocks == 1 && rows % n_ == 0) {
      const std::vector<Value*> cp = c ? on_rank0(c) : std::vector<Value*>{};
      if (c && cp.empty()) return false;
      auto bp = piece(b, tb ? 1 : 0, 1);
      copy(n, by_rank({all(a), bp, cp}), {Layout{Kind::P}});
      note(n, fmt::format("row-parallel: '{}' {} split by rows, {} per rank; partial sums{}", b->name, shape_str(b->type.shape),
                          rows / n_, c ? " (the bias added on rank 0)" : ""));
      return true;
    }
    if (la.kind == Kind::P && !c) {
      copy(n, by_rank({all(a), all(b)}), {Layout{Kind::P}});
      note(n, "partial sums stay partial (a matmul is linear)");
      return true;
    }
    // rows split (data parallel): B whole, a bias the same for every row
    if (la.kind == Kind::S && la.dim == 0 && (!c || c->type.shape.size() < 2 || c->type.shape[0] == 1)) {
      copy(n, by_rank({all(a), all(b), c ? all(c) : std::vector<Value*>{}}), {la});
      return true;
    }
    return false;
  }

  // Conv by output channels (its input whole), by input channels (its input split by channels: partial
  // sums, the bias on rank 0), a depthwise conv keeps a channel split (each rank its channels' groups),
  // and a batch split passes through.
  bool conv(const Node& n, bool split) {
    const Value* x = n.inputs[0];
    const Value* w = n.inputs[1];
    const Value* b = n.has_input(2) ? n.inputs[2] : nullptr;
    const Layout l = layout(x);
    if (layout(w).kind != Kind::R || (b && layout(b).kind != Kind::R) || !known(w)) return false;
    const int64_t group = n.attr_i("group", 1);
    const Shape& ws = w->type.shape;
    const int64_t cout = ws[0], cin = x->type.shape[1];
    auto with_bias = [&](std::vector<std::vector<Value*>> ins, const std::vector<Value*>& bias) {
      if (b) ins.push_back(bias);
      return by_rank(ins);
    };
    if (!split) {
      if (kind_ != ShardKind::tensor || group != 1 || cout % n_ != 0) return false;
      std::vector<Value*> bp = b ? piece(b, 0, 1) : std::vector<Value*>{};
      copy(n, with_bias({all(x), piece(w, 0, 1)}, bp), {Layout{Kind::S, 1, 1}});
      note(n, fmt::format("output channels split: '{}' {}, {} per rank", w->name, shape_str(ws), cout / n_));
      return true;
    }
    if (l.kind == Kind::S && l.dim == 0) {
      copy(n, with_bias({all(x), all(w)}, b ? all(b) : std::vector<Value*>{}), {l});
      return true;
    }
    if (l.kind == Kind::S && l.dim == 1 && l.blocks == 1) {
      if (group == 1 && cin % n_ == 0) {
        const std::vector<Value*> bp = b ? on_rank0(b) : std::vector<Value*>{};
        if (b && bp.empty()) return false;
        copy(n, with_bias({all(x), piece(w, 1, 1)}, bp), {Layout{Kind::P}});
        note(n, fmt::format("input channels split: '{}' {}, {} per rank; partial sums{}", w->name, shape_str(ws), cin / n_,
                            b ? " (the bias added on rank 0)" : ""));
        return true;
      }
      if (group == cin && cout == cin && ws[1] == 1 && cin % n_ == 0) {  // depthwise
        std::vector<std::map<std::string, Attr>> attrs(size_t(n_), n.attrs);
        for (auto& a : attrs) a["group"] = group / n_;
        copy(n, with_bias({all(x), piece(w, 0, 1)}, b ? piece(b, 0, 1) : std::vector<Value*>{}), {l}, &attrs);
        return true;
      }
      return false;
    }
    if (l.kind == Kind::P && !b && group == 1) {
      copy(n, by_rank({all(x), all(w)}), {Layout{Kind::P}});
      return true;
    }
    return false;
  }

  // Pooling works per image and channel: a split of either stays; averages keep partial sums.
  bool pool(const Node& n) {
    const Layout l = layout(n.inputs[0]);
    const bool average = n.op_name() == "AveragePool" || n.op_name() == "GlobalAveragePool";
    if (!(l.kind == Kind::S && l.dim <= 1) && !(l.kind == Kind::P && average)) return false;
    copy(n, by_rank({all(n.inputs[0])}), same(n, l));
    return true;
  }

  bool elementwise(const Node& n) {
    const std::string& op = n.op_name();
    std::vector<Layout> ls;
    int partial = 0, splits = 0;
    for (const Value* v : n.inputs) {
      ls.push_back(v ? layout(v) : Layout{});
      partial += ls.back().kind == Kind::P;
      splits += ls.back().kind == Kind::S;
    }
    if (partial > 0 && splits == 0) {  // linear in the partial sums
      const size_t k = n.inputs.size();
      const bool linear = ((op == "Add" || op == "Sub") && partial == int(k)) ||
                          (op == "Mul" && partial == 1) || (op == "Div" && ls[0].kind == Kind::P && k == 2) ||
                          ((op == "Neg" || op == "Identity") && k == 1);
      if (linear) {
        copy(n, by_rank(held_inputs(n)), {Layout{Kind::P}});
        return true;
      }
    }
    const size_t ro = n.outputs[0]->type.shape.size();
    // the split every split input agrees on (partial sums are made whole first)
    int od = -1, blocks = 1;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (ls[i].kind != Kind::S) continue;
      const int d = ls[i].dim + int(ro - n.inputs[i]->type.shape.size());
      if (od >= 0 && (d != od || ls[i].blocks != blocks)) return false;
      od = d;
      blocks = ls[i].blocks;
    }
    if (od < 0) return false;
    std::vector<std::vector<Value*>> per_input;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const Value* v = n.inputs[i];
      if (!v) { per_input.push_back({}); continue; }
      if (ls[i].kind == Kind::S) { per_input.push_back(all(v)); continue; }
      const int j = od - int(ro - v->type.shape.size());
      if (j < 0 || v->type.shape[size_t(j)] == 1) {
        per_input.push_back(ls[i].kind == Kind::P ? whole(v) : all(v));
        continue;
      }
      if (ls[i].kind == Kind::P) return false;  // (a partial sum the size of the split: gather instead)
      auto p = piece(v, j, blocks);
      if (p.empty()) return false;
      per_input.push_back(p);
    }
    copy(n, by_rank(per_input), {Layout{Kind::S, od, blocks}});
    return true;
  }

  bool reshape(const Node& n) {
    const Value* x = n.inputs[0];
    const Layout l = layout(x);
    const bool flatten = n.op_name() == "Flatten";
    if (l.kind == Kind::P) {
      copy(n, by_rank(flatten ? std::vector<std::vector<Value*>>{all(x)} : std::vector<std::vector<Value*>>{all(x), all(n.inputs[1])}),
           {Layout{Kind::P}});
      return true;
    }
    if (l.kind != Kind::S) return false;
    const Shape& is = x->type.shape;
    const Shape& os = n.outputs[0]->type.shape;
    // The input is pre x blocks chunks of C elements each (a block of the split dim and everything after
    // it), rank r holding the r-th piece of every chunk. An output dim e keeps the split when the dims
    // before it count whole chunks and it cuts each of their chunks into nb blocks of C elements: S(e, nb)
    // (768 -> 12 heads x 64; [S, B, 768] -> [S, B x 12 heads, 64] splits each batch's heads: 4 blocks).
    const int64_t chunks = prod(is, 0, size_t(l.dim)) * l.blocks;
    const int64_t chunk = is[size_t(l.dim)] / l.blocks * prod(is, size_t(l.dim) + 1, is.size());
    for (size_t e = 0; e < os.size(); ++e) {
      const int64_t outer = prod(os, 0, e);
      if (outer == 0 || chunks % outer != 0) continue;
      const int64_t nb = chunks / outer;
      if (os[e] % nb != 0) continue;
      const int64_t per = os[e] / nb;
      if (per * prod(os, e + 1, os.size()) != chunk || per % n_ != 0) continue;
      const int blocks = static_cast<int>(nb);
      if (flatten) {  // its output shape follows the rank's input
        copy(n, by_rank({all(x)}), {Layout{Kind::S, int(e), blocks}});
        return true;
      }
      Shape local = os;
      local[e] /= n_;
      auto shape = constants(n.inputs[1]->name + ".shard", [&](int) { return i64_tensor(local); });
      copy(n, by_rank({all(x), shape}), {Layout{Kind::S, int(e), blocks}});
      return true;
    }
    return false;
  }

  bool transpose(const Node& n) {
    const Value* x = n.inputs[0];
    const Layout l = layout(x);
    if (l.kind == Kind::P) {
      copy(n, by_rank({all(x)}), {Layout{Kind::P}});
      return true;
    }
    const size_t rank = x->type.shape.size();
    std::vector<int64_t> dflt(rank);
    for (size_t i = 0; i < rank; ++i) dflt[i] = int64_t(rank - 1 - i);
    const std::vector<int64_t> perm = n.attr_ints("perm", dflt);
    for (size_t j = 0; j < perm.size(); ++j)
      if (perm[j] == l.dim) {
        copy(n, by_rank({all(x)}), {Layout{Kind::S, int(j), l.blocks}});
        return true;
      }
    return false;
  }

  bool split_op(const Node& n) {
    const Value* x = n.inputs[0];
    const Layout l = layout(x);
    std::vector<std::vector<Value*>> per_input = held_inputs(n);
    if (l.kind == Kind::P) {
      copy(n, by_rank(per_input), same(n, Layout{Kind::P}));
      return true;
    }
    const size_t rank = x->type.shape.size();
    const int axis = norm_axis(n.attr_i("axis", 0), rank);
    if (axis != l.dim) {
      copy(n, by_rank(per_input), same(n, l));
      return true;
    }
    // Q, K, V of a fused projection: each part split across the ranks
    if (l.blocks != int(n.outputs.size())) return false;
    std::vector<int64_t> sizes;
    for (const Value* o : n.outputs) {
      if (!o || o->type.shape[size_t(axis)] % n_ != 0) return false;
      sizes.push_back(o->type.shape[size_t(axis)] / n_);
    }
    std::vector<std::map<std::string, Attr>> attrs(size_t(n_), n.attrs);
    if (n.has_input(1)) {
      per_input[1] = constants(n.inputs[1]->name + ".shard", [&](int) { return i64_tensor(sizes); });
    } else if (n.has_attr("split")) {
      for (auto& a : attrs) a["split"] = sizes;
    }
    copy(n, by_rank(per_input), same(n, Layout{Kind::S, l.dim, 1}), &attrs);
    note(n, fmt::format("the {} parts of a column-parallel projection, each split across the ranks", n.outputs.size()));
    return true;
  }

  // Softmax / LogSoftmax over an axis, LayerNormalization over the axes from `axis` on: a split of
  // another (an earlier) axis stays.
  bool keeps_other_axes(const Node& n) {
    const Value* x = n.inputs[0];
    const Layout l = layout(x);
    if (l.kind != Kind::S || !rest_replicated(n)) return false;
    const size_t rank = x->type.shape.size();
    const int axis = norm_axis(n.attr_i("axis", -1), rank);
    const bool layer_norm = n.op_name() == "LayerNormalization";
    if (layer_norm ? l.dim >= axis : l.dim == axis) return false;
    std::vector<std::vector<Value*>> per_input = held_inputs(n);
    copy(n, by_rank(per_input), same(n, l));
    return true;
  }

  Graph& src_;
  const InferResult& inf_;
  const int n_;
  const ShardKind kind_;
  ShardedProgram out_;
  std::vector<std::map<const Value*, Value*>> map_;
  std::map<const Value*, Layout> lay_;
  std::map<const Value*, std::vector<Value*>> whole_;
  std::map<std::tuple<const Value*, int, int>, std::vector<Value*>> pieces_;
  std::vector<std::vector<const Node*>> users_;
};

}  // namespace

const char* shard_kind_name(ShardKind k) { return k == ShardKind::tensor ? "tp" : "dp"; }

ShardedProgram shard_tensor_parallel(const Graph& g, int ranks) { return shard_graph(g, ShardKind::tensor, ranks); }

ShardedProgram shard_graph(const Graph& g, ShardKind kind, int ranks) {
  if (ranks < 1 || ranks > 1024)
    throw Error(Location{.pass = "shard"}, fmt::format("{} = {} is not in 1..1024", shard_kind_name(kind), ranks));
  for (const auto& v : g.values())
    if (v->type.symbolic())
      throw Error(Location{.pass = "shard"},
                  fmt::format("value '{}' has symbolic sizes {}: shard a graph with its inputs bound", v->name, v->type.str()));
  auto src = g.clone();
  if (ranks == 1) {  // nothing to split: the graph itself
    ShardedProgram p;
    p.kind = kind;
    for (const Value* c : src->constants()) p.weight_bytes += int64_t(c->constant->nbytes());
    p.weight_bytes_per_rank = p.weight_bytes;
    p.graphs.push_back(std::move(src));
    return p;
  }
  InferResult inf = infer_graph(*src);
  return Sharder(*src, inf, ranks, kind).run();
}

}  // namespace tessel
