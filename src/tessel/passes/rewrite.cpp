// The rewrite driver shared by the rewriting passes: one ordered walk, first firing rule per node.
#include "tessel/passes/rewrite.h"

#include <fmt/format.h>

#include <algorithm>

#include "tessel/ir/op_registry.h"
#include "tessel/passes/pass_util.h"

namespace tessel {

bool Rewriter::replace(Node& n, Value* by) { return forward_uses(g_, n.outputs[0], by); }

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
  // The rules tried on each op, in list order (built once per op name met).
  std::map<std::string, std::vector<const RewriteRule*>> by_op;
  auto rules_for = [&](const std::string& op) -> const std::vector<const RewriteRule*>& {
    auto [it, added] = by_op.try_emplace(op);
    if (added)
      for (const RewriteRule& r : rules)
        if (r.ops.empty() || std::find(r.ops.begin(), r.ops.end(), op) != r.ops.end()) it->second.push_back(&r);
    return it->second;
  };
  // Indexing (not iterators): a rule may insert nodes in front of the one visited.
  for (visiting_ = 0; visiting_ < g_.nodes().size(); ++visiting_) {
    Node& n = *g_.mutable_nodes()[visiting_];
    if (n.op->domain != "tessel.core" || n.outputs.empty() || !n.outputs[0]) continue;
    try_rules(rules_for(n.op->name), n);
  }
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
