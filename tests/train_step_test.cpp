// The compiled training step (driver/train_step.cpp): forward and backward halves built by the
// compiled and graph backends give the joint graph's outputs and gradients as the eager interpreter
// computes them (the joint graph itself is checked against f64 differences in autodiff_test.cpp).
#include <gtest/gtest.h>

#include <cmath>

#include "tessel/driver/optimizer.h"
#include "tessel/driver/train_step.h"
#include "tessel/ir/printer.h"
#include "tessel/passes/pass.h"
#include "tessel/runtime/compiled_backend.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"
#include "corpus_util.h"

using namespace tessel;

namespace {

double rel_err(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_f64(), y = b.to_f64();
  double d = 0, n = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) d += (x[i] - y[i]) * (x[i] - y[i]), n += y[i] * y[i];
  return x.size() != y.size() ? INFINITY : std::sqrt(d) / std::max(std::sqrt(n), 1e-30);
}

class Step : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(Step, HalvesGiveTheJointGraphsGradients) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared/models";
  auto [m, data, refs] = testenv::load_corpus_model("tblock_s");
  // The oracle: the joint graph (same lifting, seeded) run by the eager interpreter.
  auto om = testenv::load_corpus_model("tblock_s");
  Graph& jg = *om.model.graph;
  TrainOptions to;
  to.seed = true;
  TrainGraph jt = build_train_graph(jg, to);

  TrainStepOptions o;
  o.backend = GetParam();
  o.threads = 2;
  std::unique_ptr<TrainStep> s = TrainStep::build(std::move(m.graph), o);
  ASSERT_EQ(s->info().parameters, jt.parameters);
  std::vector<Tensor> ins = data;
  for (const Tensor& p : s->initial_parameters()) ins.push_back(p);
  ASSERT_EQ(ins.size(), s->input_names().size());
  const Shape os = jg.inputs.back()->type.shape;
  std::vector<double> sv(static_cast<size_t>(shape_numel(os)));
  for (size_t i = 0; i < sv.size(); ++i) sv[i] = std::sin(0.37 * static_cast<double>(i));
  const Tensor seed = Tensor::from_f64(DType::f32, os, sv);
  std::vector<Tensor> jin = ins;
  jin.push_back(seed);
  const std::vector<Tensor> joint = run_eager(jg, jin);

  std::vector<Tensor> saved;
  const std::vector<Tensor> out = s->forward(ins, saved);
  EXPECT_EQ(saved.size(), s->info().partition.saved.size());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_LE(rel_err(out[0], joint[0]), 1e-5);
  // A second forward must not disturb the first's saved tensors (outputs are copies, not arena views).
  std::vector<Tensor> saved2;
  s->forward(ins, saved2);
  const std::vector<Tensor> grads = s->backward(saved, ins, seed);
  ASSERT_EQ(grads.size(), jt.parameters.size());
  for (size_t k = 0; k < grads.size(); ++k)
    EXPECT_LE(rel_err(grads[k], joint[1 + k]), 1e-5) << jt.parameters[k] << " on " << GetParam();
}

INSTANTIATE_TEST_SUITE_P(TrainStep, Step, ::testing::Values("compiled", "graph", "eager"));

TEST(TrainStep, BadCallsAreOneLineErrors) {
  auto g = parse_graph(
      "graph @n(%x: f32[2,3], %w: f32[3]) {\n"
      "  %t: f32[2] = MatMul(%x, %w) loc(\"mm\")\n"
      "  %y: f32[2] = Tanh(%t) loc(\"tanh\")\n"
      "  return %y\n"
      "}\n",
      "n");
  TrainStepOptions o;
  o.backend = "eager";
  o.train.wrt = {"w"};
  auto s = TrainStep::build(std::move(g), o);
  std::vector<Tensor> saved;
  try {
    s->forward({Tensor::from_f64(DType::f32, {2, 3}, std::vector<double>(6, 1.0))}, saved);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 inputs given, the model takes 2"), std::string::npos) << e.what();
  }
  auto g2 = parse_graph("graph @n(%x: f32[2]) {\n  %y: f32[2] = Tanh(%x) loc(\"t\")\n  return %y\n}\n", "n");
  o.backend = "fast";
  EXPECT_THROW(TrainStep::build(std::move(g2), o), Error);
}

// docs/training.md's worked example: the neuron of docs/passes/autodiff.md as a training step. The
// split graphs print as the page shows them, and forward + backward give the page's numbers.
TEST(TrainStep, DocsWorkedExample) {
  const std::string md = testenv::read_text(testenv::source_dir() + "/docs/training.md");
  auto g = parse_graph(testenv::md_block(md, "```tsl model"), "docs/training.md");
  TrainStepOptions o;
  o.backend = "compiled";
  o.threads = 1;
  o.train.wrt = {"w"};
  auto s = TrainStep::build(std::move(g), o);
  EXPECT_EQ(print_graph(s->forward_graph()), testenv::md_block(md, "```tsl forward"));
  EXPECT_EQ(print_graph(s->backward_graph()), testenv::md_block(md, "```tsl backward"));
  const std::vector<Tensor> ins = {Tensor::from_f64(DType::f32, {2, 3}, std::vector<double>{1, 2, 3, -1, 0, 2}),
                                   Tensor::from_f64(DType::f32, {3}, std::vector<double>{0.5, -0.25, 0.125})};
  std::vector<Tensor> saved;
  const std::vector<Tensor> out = s->forward(ins, saved);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_NEAR(out[0].get_f(0), 0.1134, 5e-5);
  const std::vector<Tensor> grads = s->backward(saved, ins, Tensor::from_f64(DType::f32, {}, std::vector<double>{1}));
  ASSERT_EQ(grads.size(), 1u);
  const std::vector<double> want = {-0.0684, 1.7432, 4.4948};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(grads[0].get_f(static_cast<int64_t>(i)), want[i], 5e-5);
  // Twice the seed, twice the gradient (the backward takes the output's cotangent).
  const std::vector<Tensor> g2 = s->backward(saved, ins, Tensor::from_f64(DType::f32, {}, std::vector<double>{2}));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(g2[0].get_f(static_cast<int64_t>(i)), 2 * want[i], 1e-4);
}

// docs/training.md's AdamW example: the graph's text, and two steps through the compiled backend give
// the values torch.optim.AdamW gives for the same steps (recorded on the page from torch 1.13).
TEST(TrainStep, DocsAdamWExample) {
  const std::string md = testenv::read_text(testenv::source_dir() + "/docs/training.md");
  OptimizerSpec spec;
  spec.kind = "adamw";
  spec.shapes = {{2}};
  spec.weight_decay = 0.01;
  EXPECT_EQ(print_graph(*build_optimizer_graph(spec)), testenv::md_block(md, "```tsl adamw"));
  CompiledBackendOptions co;
  co.threads = 1;
  auto exe = compile_cpu(build_optimizer_graph(spec), {}, co);
  // One loop for the parameter's whole update (fuse's vertical group merging; 4 without it) and one
  // for the scalar -step_size.
  EXPECT_EQ(exe->stats().loop_kernels, 2);
  auto t = [](std::vector<double> v) { return Tensor::from_f64(DType::f32, {static_cast<int64_t>(v.size())}, v); };
  Tensor p = t({1, -2}), m = t({0, 0}), v = t({0, 0});
  const std::vector<std::vector<double>> grads = {{0.5, 0.25}, {-1, 0.5}};
  const std::vector<std::vector<std::vector<double>>> want = {
      {{0.899, -2.098}, {0.05, 0.025}, {2.5e-4, 6.25e-5}},
      {{0.9347114, -2.1924202}, {-0.055, 0.0725}, {1.24975e-3, 3.124375e-4}}};
  for (int step = 1; step <= 2; ++step) {
    std::vector<Tensor> ins;
    for (double s : optimizer_scalar_values(spec, 0.1, step)) ins.push_back(Tensor::from_f64(DType::f32, {}, std::vector<double>{s}));
    ins.insert(ins.end(), {p, t(grads[static_cast<size_t>(step - 1)]), m, v});
    std::vector<Tensor> out = exe->run(ins);
    ASSERT_EQ(out.size(), 3u);
    for (size_t k = 0; k < 3; ++k)
      for (int64_t i = 0; i < 2; ++i) {
        const double w = want[static_cast<size_t>(step - 1)][k][static_cast<size_t>(i)];
        EXPECT_NEAR(out[k].get_f(i), w, 1e-6 * std::max(1.0, std::abs(w)) + 1e-12) << "step " << step << " output " << k;
      }
    p = out[0], m = out[1], v = out[2];
  }
  // Bad specifications are one-line errors.
  spec.beta1 = 1.5;
  EXPECT_THROW(build_optimizer_graph(spec), Error);
  spec.kind = "lion";
  EXPECT_THROW(build_optimizer_graph(spec), Error);
}
