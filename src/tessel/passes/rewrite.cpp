// The rewrite driver shared by the rewriting passes: one ordered walk, first firing rule per node.
#include "tessel/passes/rewrite.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "tessel/ir/op_registry.h"
#include "tessel/passes/pass_util.h"

namespace tessel {

// Uses are forwarded lazily: the walk is in graph order, so every use of the visited node's result comes
// later and is resolved when its node is visited. Graph::replace_all_uses per rewrite made the walk
// quadratic (8000 rewrites over 92 000 nodes: 11 s; issue 41). A graph output moves at once, as
// forward_uses moves its name with it.
bool Rewriter::replace(Node& n, Value* by) {
  Value* from = n.outputs[0];
  by = resolved(by);
  if (from == by) return false;
  if (std::find(g_.outputs.begin(), g_.outputs.end(), from) != g_.outputs.end()) return forward_uses(g_, from, by);
  replaced_[from] = by;
  return true;
}

Value* Rewriter::resolved(Value* v) const {
  if (replaced_.empty()) return v;
  for (auto it = replaced_.find(v); it != replaced_.end(); it = replaced_.find(v)) v = it->second;
  return v;
}

Value* Rewriter::insert_before_visited(std::unique_ptr<Node> node) {
  Node* raw = node.get();
  for (Value* v : raw->outputs)
    if (v) v->producer = raw;
  auto& nodes = g_.mutable_nodes();
  nodes.insert(nodes.begin() + static_cast<long>(visiting_), std::move(node));
  ++visiting_;  // the visited node moved one place on
  return raw->outputs.empty() ? nullptr : raw->outputs[0];
}

bool Rewriter::try_rules(const std::vector<const RewriteRule*>& rules, Node& n) {
  for (const RewriteRule* r : rules) {
    if (r->match && !r->match(n)) continue;
    count_as_.clear();
    if (!r->rewrite(*this, n)) continue;
    ++applied_[count_as_.empty() ? r->name : count_as_];
    return true;
  }
  return false;
}

void Rewriter::apply(const std::vector<RewriteRule>& rules) {
  // The rules tried on each primitive, in list order (built once, indexed by the enum).
  std::array<std::vector<const RewriteRule*>, kNumCoreOps> by_op;
  for (size_t c = 0; c < kNumCoreOps; ++c)
    for (const RewriteRule& r : rules)
      if (r.ops.empty() || std::find(r.ops.begin(), r.ops.end(), static_cast<CoreOp>(c)) != r.ops.end())
        by_op[c].push_back(&r);
  auto rules_for = [&](CoreOp op) -> const std::vector<const RewriteRule*>& { return by_op[static_cast<size_t>(op)]; };
  // Indexing (not iterators): a rule may insert nodes in front of the one visited.
  for (visiting_ = 0; visiting_ < g_.nodes().size(); ++visiting_) {
    Node& n = *g_.mutable_nodes()[visiting_];
    if (!replaced_.empty())
      for (Value*& v : n.inputs)
        if (v) v = resolved(v);
    if (!n.op->core || n.outputs.empty() || !n.outputs[0]) continue;
    try_rules(rules_for(*n.op->core), n);
  }
  for (Value*& v : g_.outputs) v = resolved(v);  // (outputs move at once; kept for safety)
  replaced_.clear();
}

std::string Rewriter::note() const {
  int total = 0;
  std::string detail;
  for (const auto& [rule, count] : applied_) {
    total += count;
    detail += fmt::format("{}{} ×{}", detail.empty() ? "" : ", ", rule, count);
  }
  return fmt::format("applied {} rewrites{}", total, detail.empty() ? "" : " (" + detail + ")");
}

}  // namespace tessel
