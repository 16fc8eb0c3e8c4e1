// Fusion, phases 3 and 4: materialisation and lowering (the phases: kernel/fuse.cpp;
// docs/passes/fuse.md). Each group becomes a Kernel: the member values it stores (phase 3: those
// read outside the group, or graph outputs), its loop space (outer = kept dims, inner = reduced dims
// or the last dim), accesses with composed strides and SSA instructions per phase; then
// collapse_loops and fused_traffic.
#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tessel/ir/core_ops.h"
#include "tessel/ir/op_registry.h"
#include "tessel/kernel/fuse_phases.h"
#include "tessel/support/error.h"

namespace tessel::fuse_detail {
namespace {

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

}  // namespace

Kernel lower_group(Fuser& fz, int gi, std::vector<const Value*>* ins, std::vector<const Value*>* outs) {
  Lowering lw(fz, gi);
  lw.lower();
  collapse_loops(lw.k);
  lw.k.bytes_fused = fused_traffic(lw.k);
  *ins = std::move(lw.ins);
  *outs = std::move(lw.outs);
  return std::move(lw.k);
}

}  // namespace tessel::fuse_detail
