// algebraic's "sum of adjacent zero-pads" rule (passes/algebraic.cpp): a split's gradient — slices'
// cotangents padded with zeros and summed — becomes one concatenate. Checked against the eager
// interpreter on the graph before the rule (the oracle), on the golden case and on a joint graph.
#include <gtest/gtest.h>

#include <random>

#include "tessel/driver/train.h"
#include "tessel/ir/core_builder.h"
#include "tessel/ir/printer.h"
#include "tessel/passes/autodiff.h"
#include "tessel/passes/pass.h"
#include "tessel/runtime/interpreter.h"
#include "test_util.h"

using namespace tessel;

namespace {

std::vector<Tensor> random_inputs(const Graph& g, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-2, 2);
  std::vector<Tensor> ins;
  for (const Value* v : g.inputs) {
    std::vector<double> x(static_cast<size_t>(shape_numel(v->type.shape)));
    for (double& e : x) e = u(rng);
    ins.push_back(Tensor::from_f64(v->type.dtype, v->type.shape, x));
  }
  return ins;
}

size_t count_op(const Graph& g, const std::string& op) {
  size_t k = 0;
  for (const auto& n : g.nodes()) k += n->op_name() == op;
  return k;
}

}  // namespace

// Every output of the golden case (the rewritten sums and the ones that must stay) equals the eager
// interpreter's on the graph before the pass, element for element.
TEST(PadSums, RewrittenSumsEqualTheOriginal) {
  const std::string path = testenv::source_dir() + "/tests/golden/algebraic/pad_sums.in.tsl";
  auto before = parse_graph(testenv::read_text(path), path);
  auto after = parse_graph(testenv::read_text(path), path);
  run_pipeline(*after, parse_pipeline("algebraic,dce"), PassOptions{});
  // the three-way split is one concatenate, and the rule fired exactly on the two adjacent sums
  EXPECT_EQ(after->outputs[0]->producer->op_name(), "concatenate");
  EXPECT_EQ(after->outputs[0]->producer->inputs.size(), 3u);
  // the heads: one concatenate of the untransposed blocks, then one transpose (and the reshape)
  const Node* heads = after->outputs[1]->producer;
  ASSERT_EQ(heads->op_name(), "reshape");
  ASSERT_EQ(heads->inputs[0]->producer->op_name(), "transpose");
  EXPECT_EQ(heads->inputs[0]->producer->inputs[0]->producer->op_name(), "concatenate");
  EXPECT_EQ(heads->inputs[0]->producer->inputs[0]->producer->inputs.size(), 3u);
  EXPECT_EQ(after->outputs[2]->producer->op_name(), "pad");
  for (size_t i = 3; i < after->outputs.size(); ++i) EXPECT_EQ(after->outputs[i]->producer->op_name(), "add") << i;
  for (unsigned seed : {1u, 2u, 3u}) {
    const std::vector<Tensor> ins = random_inputs(*before, seed);
    const std::vector<Tensor> want = run_eager(*before, ins), got = run_eager(*after, ins);
    ASSERT_EQ(want.size(), got.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i].to_f64(), want[i].to_f64()) << "output " << i;
  }
}

// The gradient of a three-way split along the last dim (q, k, v of one projection, as attention's)
// is one concatenate after simplify — no pad, no sum of pads — and equal to the unsimplified joint
// graph's (whose rules tests/autodiff_test.cpp checks against central differences).
TEST(PadSums, SplitGradientIsOneConcatenate) {
  auto build = [] {
    auto g = std::make_unique<Graph>();
    Node origin;
    origin.name = "split";
    CoreBuilder b(*g, origin);
    Value* x = g->add_input("x", {DType::f32, {4, 12}});
    Value* w = g->add_input("w", {DType::f32, {4, 12}});
    Value* y = b.mul(x, w);
    Value* q = b.slice(y, {0, 0}, {4, 4}, {1, 1});
    Value* k = b.slice(y, {0, 4}, {4, 8}, {1, 1});
    Value* v = b.slice(y, {0, 8}, {4, 12}, {1, 1});
    Value* s = b.add(b.mul(b.unary(CoreOp::tanh, q), k), b.unary(CoreOp::exp, v));
    g->outputs = {b.reduce(s, "sum", {0, 1}, false)};
    return g;
  };
  auto raw = build(), simple = build();
  AutodiffOptions o;
  o.wrt = {"w"};
  build_joint_graph(*raw, o);
  AutodiffResult r = build_joint_graph(*simple, o);
  run_pipeline(*simple, parse_pipeline("simplify"), PassOptions{});
  name_gradient_outputs(*simple, r);
  EXPECT_EQ(count_op(*raw, "pad"), 3u);
  EXPECT_EQ(count_op(*simple, "pad"), 0u) << print_graph(*simple);
  EXPECT_EQ(count_op(*simple, "concatenate"), 1u) << print_graph(*simple);
  const std::vector<Tensor> ins = random_inputs(*raw, 7);
  const std::vector<Tensor> want = run_eager(*raw, ins), got = run_eager(*simple, ins);
  ASSERT_EQ(got.size(), 2u);
  const std::vector<double> gw = got[1].to_f64(), ww = want[1].to_f64();
  ASSERT_EQ(gw.size(), ww.size());
  for (size_t i = 0; i < gw.size(); ++i) EXPECT_NEAR(gw[i], ww[i], 1e-5 * (1 + std::abs(ww[i]))) << i;
}
