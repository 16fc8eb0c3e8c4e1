// The min-cut rematerialization partition of a joint graph (remat_partition.h): every forward value
// is an edge in -> out whose capacity is its bytes; cutting it means saving it. Source feeds the values
// the backward may not recompute, the backward's reads drain to the sink; the minimum cut is the
// cheapest saved set from which the backward can recompute the rest.
#include "tessel/passes/remat_partition.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "tessel/ir/core_ops.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;

// Dinic's max flow on a small graph.
struct Flow {
  struct Edge {
    int to;
    int64_t cap;
  };
  std::vector<Edge> edges;
  std::vector<std::vector<int>> adj;
  std::vector<int> level, it;
  explicit Flow(int n) : adj(static_cast<size_t>(n)) {}
  void add(int a, int b, int64_t cap) {
    adj[a].push_back(static_cast<int>(edges.size()));
    edges.push_back({b, cap});
    adj[b].push_back(static_cast<int>(edges.size()));
    edges.push_back({a, 0});
  }
  bool bfs(int s, int t) {
    level.assign(adj.size(), -1);
    std::queue<int> q;
    level[s] = 0;
    q.push(s);
    while (!q.empty()) {
      int u = q.front();
      q.pop();
      for (int e : adj[u])
        if (edges[e].cap > 0 && level[edges[e].to] < 0) {
          level[edges[e].to] = level[u] + 1;
          q.push(edges[e].to);
        }
    }
    return level[t] >= 0;
  }
  int64_t dfs(int u, int t, int64_t f) {
    if (u == t) return f;
    for (int& i = it[u]; i < static_cast<int>(adj[u].size()); ++i) {
      Edge& e = edges[adj[u][i]];
      if (e.cap <= 0 || level[e.to] != level[u] + 1) continue;
      int64_t d = dfs(e.to, t, std::min(f, e.cap));
      if (d > 0) {
        e.cap -= d;
        edges[adj[u][i] ^ 1].cap += d;
        return d;
      }
    }
    return 0;
  }
  void run(int s, int t) {
    while (bfs(s, t)) {
      it.assign(adj.size(), 0);
      while (dfs(s, t, kInf) > 0) {
      }
    }
  }
  // Nodes reachable from s in the residual graph: the source side of the minimum cut.
  std::vector<bool> source_side(int s) const {
    std::vector<bool> seen(adj.size(), false);
    std::vector<int> stack = {s};
    seen[s] = true;
    while (!stack.empty()) {
      int u = stack.back();
      stack.pop_back();
      for (int e : adj[u])
        if (edges[e].cap > 0 && !seen[edges[e].to]) {
          seen[edges[e].to] = true;
          stack.push_back(edges[e].to);
        }
    }
    return seen;
  }
};

// Primitives the backward may run again: the ones a fused loop recomputes for the price of its loads.
bool recomputable(const Node& n) {
  const std::optional<CoreOp> op = core_op_of(n);
  if (!op) return false;
  const CoreOpInfo& i = core_op_info(*op);
  if (i.elementwise()) return *op != CoreOp::bitcast_convert;
  switch (*op) {
    case CoreOp::broadcast_in_dim:
    case CoreOp::reshape:
    case CoreOp::transpose:
    case CoreOp::slice:
    case CoreOp::pad:
    case CoreOp::concatenate:
    case CoreOp::iota: return true;
    default: return false;
  }
}

int64_t bytes_of(const Value* v) {
  return shape_numel(v->type.shape) * static_cast<int64_t>(dtype_size(v->type.dtype));
}

}  // namespace

RematPartition partition_for_remat(const Graph& g, size_t num_forward_outputs) {
  const auto& nodes = g.nodes();
  // Forward nodes: those the forward outputs need.
  std::unordered_set<const Value*> needed;
  for (size_t i = 0; i < num_forward_outputs && i < g.outputs.size(); ++i) needed.insert(g.outputs[i]);
  std::vector<bool> fwd(nodes.size(), false);
  for (size_t i = nodes.size(); i-- > 0;) {
    for (const Value* v : nodes[i]->outputs) fwd[i] = fwd[i] || needed.count(v);
    if (fwd[i])
      for (const Value* v : nodes[i]->inputs)
        if (v) needed.insert(v);
  }
  // One in/out pair per forward node result.
  std::unordered_map<const Value*, int> id;
  std::vector<const Value*> vals;
  std::vector<size_t> producer;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (fwd[i])
      for (const Value* v : nodes[i]->outputs) {
        id[v] = static_cast<int>(vals.size());
        vals.push_back(v);
        producer.push_back(i);
      }
  const int S = 2 * static_cast<int>(vals.size()), T = S + 1;
  Flow f(T + 1);
  for (size_t k = 0; k < vals.size(); ++k) {
    const int in = 2 * static_cast<int>(k), out = in + 1;
    f.add(in, out, std::max<int64_t>(bytes_of(vals[k]), 1));  // 1: a zero-byte value still counts
    const Node& n = *nodes[producer[k]];
    if (!recomputable(n)) f.add(S, in, kInf);
    for (const Value* u : n.inputs) {
      auto it = u ? id.find(u) : id.end();
      if (it == id.end()) continue;  // an input or constant: free
      f.add(2 * it->second + 1, in, kInf);
    }
  }
  std::unordered_set<const Value*> read;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (!fwd[i])
      for (const Value* u : nodes[i]->inputs) {
        auto it = u ? id.find(u) : id.end();
        if (it != id.end() && read.insert(u).second) f.add(2 * it->second + 1, T, kInf);
      }
  f.run(S, T);
  const std::vector<bool> src = f.source_side(S);
  RematPartition p;
  for (size_t k = 0; k < vals.size(); ++k) {
    const bool in_s = src[2 * k], out_s = src[2 * k + 1];
    if (in_s && !out_s) {
      p.saved.push_back(vals[k]);
      p.saved_bytes += bytes_of(vals[k]);
    }
  }
  // Recomputed: forward nodes on the sink side that lead to a backward read.
  std::unordered_set<const Value*> want;
  for (const Value* v : read) want.insert(v);
  std::unordered_set<const Value*> saved(p.saved.begin(), p.saved.end());
  std::vector<bool> again(nodes.size(), false);
  for (size_t i = nodes.size(); i-- > 0;) {
    if (!fwd[i]) continue;
    bool w = false;
    for (const Value* v : nodes[i]->outputs) w = w || (want.count(v) && !saved.count(v));
    if (!w) continue;
    again[i] = true;
    for (const Value* u : nodes[i]->inputs)
      if (u && id.count(u)) want.insert(u);
  }
  for (size_t i = 0; i < nodes.size(); ++i)
    if (again[i]) p.recomputed.push_back(nodes[i].get());
  return p;
}

namespace {

// Copies `nodes` of `src` into a new graph: values the copied nodes read that none of them produces
// are `first_inputs` (in order), then src's inputs (in src order), or copied constants; anything else
// is an error.
std::unique_ptr<Graph> copy_nodes(const Graph& src, const std::vector<const Node*>& nodes,
                                  const std::vector<const Value*>& first_inputs, const std::vector<const Value*>& outputs,
                                  const std::string& name) {
  auto g = std::make_unique<Graph>();
  g->name = name;
  std::unordered_map<const Value*, Value*> map;
  std::unordered_set<const Value*> produced;
  for (const Node* n : nodes)
    for (const Value* v : n->outputs) produced.insert(v);
  std::unordered_set<const Value*> read;
  for (const Node* n : nodes)
    for (const Value* v : n->inputs)
      if (v) read.insert(v);
  for (const Value* v : outputs) read.insert(v);
  for (const Value* v : first_inputs) map[v] = g->add_input(v->name, v->type);
  for (const Value* v : src.inputs)
    if (read.count(v) && !map.count(v)) map[v] = g->add_input(v->name, v->type);
  auto get = [&](const Value* v) -> Value* {
    if (!v) return nullptr;
    auto it = map.find(v);
    if (it != map.end()) return it->second;
    if (v->constant) return map[v] = g->add_constant(v->name, *v->constant);
    fail("{}: '{}' is read but neither computed, saved nor an input", name, v->name);
  };
  for (const Node* n : nodes) {
    std::vector<Value*> ins;
    for (const Value* v : n->inputs) ins.push_back(get(v));
    std::vector<std::string> names;
    for (const Value* v : n->outputs) names.push_back(v->name);
    Node* c = g->add_node(n->op, n->name, std::move(ins), names, n->attrs);
    for (size_t i = 0; i < n->outputs.size(); ++i) {
      c->outputs[i]->type = n->outputs[i]->type;
      map[n->outputs[i]] = c->outputs[i];
    }
  }
  for (const Value* v : outputs) g->outputs.push_back(get(v));
  return g;
}

}  // namespace

SplitGraphs split_by_partition(const Graph& joint, size_t num_forward_outputs, const RematPartition& p) {
  std::unordered_set<const Value*> needed;
  for (size_t i = 0; i < num_forward_outputs && i < joint.outputs.size(); ++i) needed.insert(joint.outputs[i]);
  std::vector<bool> fwd(joint.nodes().size(), false);
  for (size_t i = joint.nodes().size(); i-- > 0;) {
    for (const Value* v : joint.nodes()[i]->outputs) fwd[i] = fwd[i] || needed.count(v);
    if (fwd[i])
      for (const Value* v : joint.nodes()[i]->inputs)
        if (v) needed.insert(v);
  }
  std::unordered_set<const Node*> again(p.recomputed.begin(), p.recomputed.end());
  std::vector<const Node*> fnodes, bnodes;
  for (size_t i = 0; i < joint.nodes().size(); ++i) {
    const Node* n = joint.nodes()[i].get();
    if (fwd[i]) fnodes.push_back(n);
    if (!fwd[i] || again.count(n)) bnodes.push_back(n);
  }
  std::vector<const Value*> fouts(joint.outputs.begin(), joint.outputs.begin() + static_cast<long>(num_forward_outputs));
  fouts.insert(fouts.end(), p.saved.begin(), p.saved.end());
  std::vector<const Value*> bouts(joint.outputs.begin() + static_cast<long>(num_forward_outputs), joint.outputs.end());
  SplitGraphs s;
  s.forward = copy_nodes(joint, fnodes, {}, fouts, joint.name + "_forward");
  s.backward = copy_nodes(joint, bnodes, p.saved, bouts, joint.name + "_backward");
  return s;
}

}  // namespace tessel
