// rewrite: the one pattern/rewrite mechanism of the rewriting passes (algebraic, canonicalize): rules
// keyed by the core op they rewrite, a driver that walks the graph once and applies the first rule that
// fires on each node, and the count of what fired that becomes the pass's note (docs/passes/README.md,
// "Writing a rewrite rule").
#pragma once

#include <functional>
#include <map>
#include <unordered_map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/ir/core_ops.h"
#include "tessel/ir/graph.h"

namespace tessel {

class Rewriter;

// One rewrite. The driver tries it on a node when the node's op is one of `ops` (every core op when
// `ops` is empty) and `match` (when set) accepts it; `rewrite` then edits the graph through the
// Rewriter and returns true, or returns false when it cannot apply after all (a replacement refused,
// say), and the next rule is tried. A rewrite that returns false should leave the node as it found it
// unless the edit is itself harmless (an operand chain already composed).
struct RewriteRule {
  std::string name;               // what the note counts it as ("x+0")
  std::vector<CoreOp> ops;        // the primitives it is tried on; empty = all
  std::function<bool(const Node&)> match;
  std::function<bool(Rewriter&, Node&)> rewrite;
};

// The graph edits a rule may make, and the count of what fired.
class Rewriter {
 public:
  explicit Rewriter(Graph& g) : g_(g) {}

  Graph& graph() { return g_; }

  // Replaces node `n`'s result by `by`: every use of it (and a graph output, which keeps its model
  // name) now reads `by`; the node is left for dce. False, and nothing changed, when the output's name
  // cannot move to `by` (see forward_uses in pass_util.h).
  bool replace(Node& n, Value* by);
  // Puts `node` in front of the node being visited (its operands must already be defined there); the
  // walk does not visit it. Returns its first output.
  Value* insert_before_visited(std::unique_ptr<Node> node);
  // Counts the node being visited under `name` instead of the rule's own name: for a rule whose steps
  // each have a name and where the last one that ran names the rewrite.
  void count_as(const std::string& name) { count_as_ = name; }
  // Counts a rewrite made outside the walk (a pass's edits of constants, say).
  void count(const std::string& name, int times = 1) { applied_[name] += times; }

  // Visits every tessel.core node that has a result, in graph order, and applies the first of
  // `rules` (in list order) that fires on it. Rules look only at a node's operands and their producers,
  // which the walk has already visited, so one walk leaves nothing for a second to do.
  void apply(const std::vector<RewriteRule>& rules);

  // "applied 6 rewrites (x*1 ×2, x+0 ×4)": the count per rule name, names in sorted order.
  std::string note() const;

 private:
  bool try_rules(const std::vector<const RewriteRule*>& rules, Node& n);
  Value* resolved(Value* v) const;  // v after the replacements made so far (a chain followed)

  Graph& g_;
  std::map<std::string, int> applied_;
  std::string count_as_;
  size_t visiting_ = 0;  // index of the node being visited in g_.nodes()
  std::unordered_map<Value*, Value*> replaced_;  // results replaced, whose later uses the walk forwards
};

}  // namespace tessel
