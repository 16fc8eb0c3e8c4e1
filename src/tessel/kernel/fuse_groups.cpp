// Fusion, phase 2: groups, and the layouts of materialised values (phase 3) (the phases:
// kernel/fuse.cpp; docs/passes/fuse.md).
// What the code generators handle (pointwise_ok, reduce_ok, matmul_spec, conv_spec); the Fuser, which
// chooses the layouts of stored values (decide_layouts, physical_strides: channels-last activations,
// transposed matmul results), forms the groups in topological order (vertical fusion, then
// merge_vertical and merge_siblings) and drops a layout the groups cannot honour (layout_violations).
// Which member values a group stores is settled when it is lowered (fuse_lower.cpp).
#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "tessel/ir/core_ops.h"
#include "tessel/kernel/fuse_phases.h"

namespace tessel::fuse_detail {
namespace {

// Whether a size is statically at most 1 (a symbolic one is >= 1 and may be more).
bool at_most_one(const Dim& d) { return d.is_static() && d.constant_term() <= 1; }

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

// The most core nodes one kernel fuses. Real kernels fuse tens (a layer norm, a softmax, an
// epilogue); a model that is one long elementwise chain would otherwise become one kernel whose
// lowering recurses once per node (a stack overflow at ~20000) and whose C++ function g++ takes
// minutes over. A longer chain becomes several kernels, each stored once in between.
constexpr size_t kMaxKernelNodes = 512;

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

}  // namespace

size_t Fuser::nv() const {
  size_t n = 0;
  for (const auto& v : g.values()) n = std::max(n, static_cast<size_t>(v->id) + 1);
  return n;
}

Dims Fuser::physical_strides(const Value* v) const {
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

std::optional<std::array<Dim, 3>> Fuser::matmul_result_strides(const Node& dot, const Dims& st) const {
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

bool Fuser::layout_step(const Node& n) const { return opts.layout_steps && sized_node(n) && can_run_channels_last(n); }

bool Fuser::nhwc_step(const Node& n) const {
  if (!layout_step(n) || !nhwc[n.outputs[0]->id]) return false;
  for (const Value* u : n.inputs)
    if (!nhwc[u->id]) return false;
  return true;
}

void Fuser::decide_layouts() {
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

void Fuser::init() {
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

bool Fuser::row_root(const Value* v, int gi, const Value** root) const {
  const Value* cur = v;
  bool first = true;
  while (cur->producer && is_view[cur->id]) {
    const Node& n = *cur->producer;
    if (is_core_op(n, CoreOp::broadcast_in_dim)) {
      if (!first) return false;
      const Group& gr = groups[static_cast<size_t>(gi)];
      const Dims in = fuse_detail::dims(n.inputs[0]);
      auto dims = n.attr_ints("dims");
      std::vector<int64_t> want;
      if (in.size() == gr.F.size()) {
        for (size_t d = 0; d < in.size(); ++d) want.push_back(static_cast<int64_t>(d));
      } else {
        for (size_t d = 0; d < gr.F.size(); ++d)
          if (!gr.R[d]) want.push_back(static_cast<int64_t>(d));
      }
      if (dims != want || !is_row_shape(gr, in) || fuse_detail::dims(cur) != gr.F) return false;
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

Dims Fuser::row_shape(const Group& gr) const {
  Dims s;
  for (size_t d = 0; d < gr.F.size(); ++d)
    if (!gr.R[d]) s.push_back(gr.F[d]);
  return s;
}

bool Fuser::is_row_shape(const Group& gr, const Dims& s) const {
  if (!gr.reduces) return false;
  if (s == row_shape(gr)) return true;
  if (s.size() != gr.F.size()) return false;
  for (size_t d = 0; d < s.size(); ++d)
    if (s[d] != (gr.R[d] ? Dim(1) : gr.F[d])) return false;
  return true;
}

bool Fuser::operand_ok(const Value* u, int gi, Level lv, bool* inline_read) const {
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

// A depth-first walk of gdeps (whose sets hold most of each group's transitive producers, so a walk
// usually ends one step from its start: the direct membership test below). The visited marks are a
// vector, not a set: on a model with hundreds of groups the walks dominated fusion (issue 42).
bool Fuser::reaches(const std::set<int>& from, int target, int skip) const {
  const size_t n = std::max(gdeps.size(), groups.size());
  std::vector<char> seen(n, 0);
  std::vector<int> stack;
  for (int f : from)
    if (f != skip && !seen[static_cast<size_t>(f)]) seen[static_cast<size_t>(f)] = 1, stack.push_back(f);
  const int target_first = static_cast<size_t>(target) < gfirst.size() ? gfirst[static_cast<size_t>(target)] : -1;
  while (!stack.empty()) {
    const int h = stack.back();
    stack.pop_back();
    if (h == target) return true;
    if (static_cast<size_t>(h) >= gdeps.size()) continue;
    // nothing of h comes after target's first node: h (and what only h leads to) cannot depend on it
    if (static_cast<size_t>(h) < glast.size() && glast[static_cast<size_t>(h)] < target_first) continue;
    const std::set<int>& d = gdeps[static_cast<size_t>(h)];
    if (d.count(target)) return true;
    for (int x : d)
      if (!seen[static_cast<size_t>(x)]) seen[static_cast<size_t>(x)] = 1, stack.push_back(x);
  }
  return false;
}

void Fuser::add_group_deps(const Node& n, int gi) {
  for (const Value* u : n.inputs) {
    if (!u) continue;
    for (int d : deps[u->id])
      if (d != gi) gdeps[static_cast<size_t>(gi)].insert(d);
  }
}

bool Fuser::can_join(const Node& n, int gi, Level* lv_out) const {
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

std::vector<int> Fuser::candidate_groups(const Node& n) const {
  std::vector<int> c;
  for (const Value* u : n.inputs) {
    const Value* cur = u;
    while (cur->producer && is_view[cur->id]) cur = cur->producer->inputs[0];
    const int gi = group_of_value[cur->id];
    if (gi >= 0 && std::find(c.begin(), c.end(), gi) == c.end()) c.push_back(gi);
  }
  return c;
}

void Fuser::span_group(int gi, const Node& n) {
  if (gfirst.size() < groups.size()) gfirst.resize(groups.size(), INT32_MAX), glast.resize(groups.size(), -1);
  const int p = node_pos.at(&n);
  gfirst[static_cast<size_t>(gi)] = std::min(gfirst[static_cast<size_t>(gi)], p);
  glast[static_cast<size_t>(gi)] = std::max(glast[static_cast<size_t>(gi)], p);
}

void Fuser::span_merge(int into, int from) {
  gfirst[static_cast<size_t>(into)] = std::min(gfirst[static_cast<size_t>(into)], gfirst[static_cast<size_t>(from)]);
  glast[static_cast<size_t>(into)] = std::max(glast[static_cast<size_t>(into)], glast[static_cast<size_t>(from)]);
}

void Fuser::assign(const Node& n, int gi, Level lv) {
  if (gdeps.size() < groups.size()) gdeps.resize(groups.size());
  span_group(gi, n);
  add_group_deps(n, gi);
  groups[gi].nodes.push_back(&n);
  node_group[&n] = gi;
  for (const Value* v : n.outputs) {
    group_of_value[v->id] = gi;
    level[v->id] = lv;
  }
}

void Fuser::propagate_deps(const Node& n) {
  std::set<int> d;
  for (const Value* u : n.inputs)
    if (u) d.insert(deps[u->id].begin(), deps[u->id].end());
  auto it = node_group.find(&n);
  if (it != node_group.end()) d.insert(it->second);
  for (const Value* v : n.outputs)
    if (v) deps[v->id] = d;
}

std::vector<int> Fuser::layout_violations() const {
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

void Fuser::run() {
  init();
  for (size_t i = 0; i < g.nodes().size(); ++i) node_pos[g.nodes()[i].get()] = static_cast<int>(i);
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

void Fuser::merge_vertical() {
  auto plain = [&](const Group& gr) {
    if (gr.kind != GKind::loop || gr.nodes.empty() || gr.reduces) return false;
    for (bool r : gr.R)
      if (r) return false;
    return true;
  };
  // Each merge takes the first mergeable (a, b) in index order. After b joins a, no pair of a lower
  // group than a can have become mergeable except one whose producer is a (paths only contract, a only
  // grows, b is empty), so the next scan starts at the lowest such consumer, else at a: the same merges
  // in the same order as a scan from group 0 after every merge, without rescanning the groups before
  // (on a model with repeated refinement blocks that rescanning took minutes; issue 42).
  size_t start = 0;
  std::vector<std::vector<int>> absorbed(groups.size());  // per group: itself and the groups merged into it
  for (size_t i = 0; i < groups.size(); ++i) absorbed[i] = {static_cast<int>(i)};
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t a = start; a < groups.size() && !changed; ++a) {
      if (!plain(groups[a])) continue;
      const std::vector<int> producers(gdeps[a].begin(), gdeps[a].end());
      for (int b : producers) {
        const Group& ga = groups[a];
        const Group& gb = groups[static_cast<size_t>(b)];
        if (b == static_cast<int>(a) || !plain(gb) || ga.F != gb.F) continue;
        if (ga.nodes.size() + gb.nodes.size() > kMaxKernelNodes) continue;
        // a path from b to a through another group: one walk from a's other producers
        bool between = reaches(gdeps[a], b, b);
        bool direct = true;
        for (const Node* n : ga.nodes)
          for (const Value* u : n->inputs) {
            if (!u || between) continue;
            const Value* root = views[u->id].root;
            const int rg = root ? group_of_value[root->id] : -1;
            if (rg == b && (root != u || is_view[u->id])) direct = false;
            // a path from b to a through a node in no group (a convolution, a library call): u depends
            // on b or a group merged into it (deps[] keep the ids of before the merges)
            if (rg != b && rg != static_cast<int>(a))
              for (int x : absorbed[static_cast<size_t>(b)]) between = between || deps[u->id].count(x) > 0;
          }
        if (between || !direct) continue;
        for (const Node* n : gb.nodes) {
          node_group[n] = static_cast<int>(a);
          for (const Value* v : n->outputs) group_of_value[v->id] = static_cast<int>(a);
        }
        groups[a].nodes.insert(groups[a].nodes.end(), groups[static_cast<size_t>(b)].nodes.begin(),
                               groups[static_cast<size_t>(b)].nodes.end());
        groups[static_cast<size_t>(b)].nodes.clear();
        absorbed[a].insert(absorbed[a].end(), absorbed[static_cast<size_t>(b)].begin(), absorbed[static_cast<size_t>(b)].end());
        absorbed[static_cast<size_t>(b)].clear();
        span_merge(static_cast<int>(a), b);
        gdeps[a].insert(gdeps[static_cast<size_t>(b)].begin(), gdeps[static_cast<size_t>(b)].end());
        for (auto& d : gdeps)
          if (d.erase(b)) d.insert(static_cast<int>(a));
        gdeps[a].erase(static_cast<int>(a));
        ++vertical_merged;
        changed = true;
        start = a;
        for (size_t c = 0; c < a; ++c)
          if (gdeps[c].count(static_cast<int>(a))) {
            start = c;
            break;
          }
        break;
      }
    }
  }
}

void Fuser::merge_siblings() {
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
      span_merge(static_cast<int>(a), static_cast<int>(b));
      gdeps[a].insert(gdeps[b].begin(), gdeps[b].end());
      gdeps[a].erase(static_cast<int>(a));
      for (auto& d : gdeps)
        if (d.erase(static_cast<int>(b))) d.insert(static_cast<int>(a));
      gdeps[a].erase(static_cast<int>(a));
      ++siblings_merged;
    }
  }
  // keep every group's nodes in graph order
  for (Group& gr : groups)
    std::sort(gr.nodes.begin(), gr.nodes.end(), [&](const Node* x, const Node* y) { return node_pos.at(x) < node_pos.at(y); });
}

void Fuser::start_group(const Node& n, GKind kind, Dims F, std::vector<bool> R, Level lv) {
  Group gr;
  gr.kind = kind;
  gr.F = std::move(F);
  gr.R = R.empty() ? std::vector<bool>(gr.F.size(), false) : std::move(R);
  if (kind != GKind::loop) gr.anchor = &n;
  groups.push_back(std::move(gr));
  assign(n, static_cast<int>(groups.size()) - 1, lv);
}

std::optional<MatmulSpec> Fuser::matmul_spec(const Node& n) const {
  const Value* a = n.inputs[0];
  const Value* b = n.inputs[1];
  if (a->type.dtype != DType::f32 || b->type.dtype != DType::f32) return std::nullopt;
  auto lb = n.attr_ints("lhs_batch", {}), rb = n.attr_ints("rhs_batch", {});
  auto lc = n.attr_ints("lhs_contract"), rc = n.attr_ints("rhs_contract");
  const Dims as = fuse_detail::dims(a);
  const Dims bs = fuse_detail::dims(b);
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

}  // namespace tessel::fuse_detail
