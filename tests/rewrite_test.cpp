// The shared rewrite driver (src/tessel/passes/rewrite.h): rule order is priority, a declined rewrite
// falls through to the next rule, rules see only their ops, inserted nodes land before the visited one,
// and the note counts what fired.
#include <gtest/gtest.h>

#include "tessel/ir/op_registry.h"
#include "tessel/ir/printer.h"
#include "tessel/ir/verifier.h"
#include "tessel/passes/pass_util.h"
#include "tessel/passes/rewrite.h"

using namespace tessel;

namespace {

std::unique_ptr<Graph> two_negs() {
  return parse_graph(
      "graph @g(%x: f32[2]) {\n"
      "  %a: f32[2] = neg(%x) loc(\"a\")\n"
      "  %b: f32[2] = neg(%a) loc(\"b\")\n"
      "  %c: f32[2] = exp(%b) loc(\"c\")\n"
      "  return %c\n"
      "}\n");
}

RewriteRule counting(std::string name, std::vector<CoreOp> ops, bool fires, int* tried) {
  return {std::move(name), std::move(ops), nullptr, [fires, tried](Rewriter&, Node&) {
            ++*tried;
            return fires;
          }};
}

}  // namespace

TEST(Rewrite, FirstFiringRuleWinsAndDeclinedRulesFallThrough) {
  auto g = two_negs();
  int declined = 0, first = 0, second = 0;
  Rewriter r(*g);
  r.apply({counting("declines", {CoreOp::neg}, false, &declined), counting("first", {CoreOp::neg}, true, &first),
           counting("second", {CoreOp::neg}, true, &second)});
  EXPECT_EQ(declined, 2);  // tried on both negs, fell through each time
  EXPECT_EQ(first, 2);
  EXPECT_EQ(second, 0);  // never reached: "first" fired
  EXPECT_EQ(r.note(), "applied 2 rewrites (first ×2)");
}

TEST(Rewrite, RulesSeeOnlyTheirOpsAndMatchGuardsTheRewrite) {
  auto g = two_negs();
  int on_exp = 0, on_any = 0, guarded = 0;
  RewriteRule never{"never", {}, [](const Node&) { return false; }, [&guarded](Rewriter&, Node&) {
                      ++guarded;
                      return true;
                    }};
  Rewriter r(*g);
  r.apply({never, counting("exp only", {CoreOp::exp}, false, &on_exp), counting("any", {}, false, &on_any)});
  EXPECT_EQ(guarded, 0);
  EXPECT_EQ(on_exp, 1);
  EXPECT_EQ(on_any, 3);
  EXPECT_EQ(r.note(), "applied 0 rewrites");
}

TEST(Rewrite, ReplaceForwardsUsesAndTheOutputName) {
  auto g = two_negs();
  // -(-x) → x: the exp now reads x, and the negs are left for dce.
  RewriteRule double_neg{"-(-x)", {CoreOp::neg},
                         [](const Node& n) { return core_producer(n.inputs[0], CoreOp::neg) != nullptr; },
                         [](Rewriter& r, Node& n) { return r.replace(n, n.inputs[0]->producer->inputs[0]); }};
  Rewriter r(*g);
  r.apply({double_neg});
  EXPECT_EQ(r.note(), "applied 1 rewrites (-(-x) ×1)");
  const Node& exp = *g->nodes()[2];
  EXPECT_EQ(exp.inputs[0]->name, "x");
  verify_graph(*g);
}

TEST(Rewrite, InsertedNodesGoBeforeTheVisitedOneAndAreNotVisited) {
  auto g = two_negs();
  int visits = 0;
  // Every exp gets another exp of its operand in front of it, and reads that instead.
  RewriteRule wrap{"wrap", {CoreOp::exp}, nullptr, [&visits](Rewriter& r, Node& n) {
                     ++visits;
                     Graph& gr = r.graph();
                     auto inner = std::make_unique<Node>();
                     inner->op = OpRegistry::get().find("exp");
                     inner->name = n.name;
                     inner->inputs = {n.inputs[0]};
                     inner->outputs = {gr.add_value(gr.unique_name("w"), n.inputs[0]->type)};
                     n.inputs[0] = r.insert_before_visited(std::move(inner));
                     r.count_as("wrapped");
                     return true;
                   }};
  Rewriter r(*g);
  r.apply({wrap});
  EXPECT_EQ(visits, 1);
  EXPECT_EQ(r.note(), "applied 1 rewrites (wrapped ×1)");
  ASSERT_EQ(g->nodes().size(), 4u);
  EXPECT_EQ(g->nodes()[2]->op_name(), "exp");
  EXPECT_EQ(g->nodes()[3]->op_name(), "exp");
  EXPECT_EQ(g->nodes()[3]->inputs[0]->producer, g->nodes()[2].get());
  verify_graph(*g);
}

TEST(Rewrite, CountsOutsideTheWalkJoinTheNote) {
  auto g = two_negs();
  Rewriter r(*g);
  r.count("by hand", 3);
  int tried = 0;
  r.apply({counting("neg", {CoreOp::neg}, true, &tried)});
  EXPECT_EQ(r.note(), "applied 5 rewrites (by hand ×3, neg ×2)");
}
