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
//
// The phases live in one file each, sharing what crosses files through fuse_phases.h:
//   fuse_views.cpp   1: views; densify_library_constants and densify_conv_inputs, which run first
//   fuse_groups.cpp  2: what the code generators handle, grouping and merging (Fuser); and of 3, the
//                    layout each stored value takes (decide_layouts, layout_violations)
//   fuse_lower.cpp   3: which values a group stores; 4: its Kernel, collapse_loops, fused_traffic
//   fuse.cpp         fuse(): the phases in order and the graph rewrite; topo_sort
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tessel/ir/op_registry.h"
#include "tessel/kernel/fuse_phases.h"
#include "tessel/kernel/kernel.h"
#include "tessel/support/error.h"

namespace tessel {
namespace fuse_detail {

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

}  // namespace fuse_detail

using fuse_detail::densify_conv_inputs;
using fuse_detail::densify_library_constants;
using fuse_detail::Fuser;
using fuse_detail::lower_group;
using fuse_detail::topo_sort;

KernelModule fuse(std::unique_ptr<Graph> core, const FuseOptions& opts) {
  const ScopedSymbolFacts facts(&core->symbols);  // size decisions within the graph's ranges (the object moves into m)
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
    std::vector<const Value*> ins, outs;
    Kernel k = lower_group(fz, static_cast<int>(gi), &ins, &outs);
    k.name = "k" + std::to_string(kernels.size());
    node_ins.push_back(ins);
    node_outs.push_back(outs);
    kernels.push_back(std::move(k));
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
