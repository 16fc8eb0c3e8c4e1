// Random-graph differential testing (docs/random-graphs.md): the generator is deterministic and covers
// its ops, odd and zero sizes and special values; the tester catches a backend that is wrong; every
// minimised failure kept in tests/randgraph/*.tsl agrees on every backend; and 1000 random graphs agree
// with eager on graph, compiled, spyre (DL16) and tpu-v5e (bf16).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "tessel/driver/graph_diff.h"
#include "tessel/driver/random_graph.h"
#include "tessel/ir/printer.h"
#include "tessel/runtime/interpreter.h"
#include "test_util.h"

using namespace tessel;
namespace fs = std::filesystem;

namespace {

std::string text_of(const Graph& g) {
  PrintOptions po;
  po.inline_limit = 1 << 20;
  return print_graph(g, po);
}

}  // namespace

TEST(RandomGraph, OneSeedGivesOneGraphAndItsTextRoundTrips) {
  for (uint64_t seed : {1u, 2u, 77u, 4096u}) {
    const std::string a = text_of(*randgraph::random_graph(seed)), b = text_of(*randgraph::random_graph(seed));
    EXPECT_EQ(a, b) << seed;
    EXPECT_EQ(text_of(*parse_graph(a)), a) << seed;
  }
  EXPECT_NE(text_of(*randgraph::random_graph(1)), text_of(*randgraph::random_graph(2)));
  auto g = randgraph::random_graph(5);
  const auto x = randgraph::random_inputs(*g, 5), y = randgraph::random_inputs(*g, 5);
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(x[i].same_as(y[i]));
}

// Over 400 seeds every op the generator lists is drawn, and the inputs hold zero-sized dims, NaN,
// infinities, negative zeros and denormals: the campaign exercises what it claims to.
TEST(RandomGraph, CoversItsOpsSizesAndSpecialValues) {
  std::set<std::string> seen;
  bool zero_dim = false, nan = false, inf = false, neg_zero = false, denormal = false, big = false;
  for (uint64_t seed = 1; seed <= 400; ++seed) {
    auto g = randgraph::random_graph(seed);
    for (const auto& n : g->nodes()) seen.insert(n->op_name());
    for (const auto& v : g->values())
      for (int64_t d : v->type.shape) zero_dim = zero_dim || d == 0;
    for (const Tensor& t : randgraph::random_inputs(*g, seed))
      for (int64_t i = 0; i < t.numel(); ++i) {
        const double x = t.get_f(i);
        nan = nan || std::isnan(x);
        inf = inf || std::isinf(x);
        neg_zero = neg_zero || (x == 0 && std::signbit(x));
        denormal = denormal || std::fpclassify(static_cast<float>(x)) == FP_SUBNORMAL;
        big = big || (std::isfinite(x) && std::fabs(x) > 1e30);
      }
  }
  for (const std::string& op : randgraph::generated_ops()) EXPECT_TRUE(seen.count(op)) << op << " never drawn";
  EXPECT_TRUE(zero_dim && nan && inf && neg_zero && denormal && big)
      << zero_dim << nan << inf << neg_zero << denormal << big;
}

// The comparison is not blind: a different op, a NaN or an infinity moved, or an error beyond the
// tolerance is reported; rounding within it is not; signed zeros compare equal.
TEST(RandomGraph, ComparisonPolicyReportsWrongResults) {
  auto g = parse_graph(R"(graph @g(%in0: f32[3,5], %in1: f32[5]) {
  %v: f32[3,5] = Add(%in0, %in1) loc("add")
  return %v
})");
  auto wrong = parse_graph(R"(graph @g(%in0: f32[3,5], %in1: f32[5]) {
  %v: f32[3,5] = Sub(%in0, %in1) loc("sub")
  return %v
})");
  const auto in = randgraph::random_inputs(*g, 11);
  const Tensor a = run_eager(*g, in)[0], b = run_eager(*wrong, in)[0];
  for (const char* backend : {"graph", "compiled", "spyre", "tpu-v5e"}) {
    const randgraph::Policy p = randgraph::policy_for(backend);
    EXPECT_NE(randgraph::compare_output(a, b, p), "") << backend;
    EXPECT_EQ(randgraph::compare_output(a, a, p), "") << backend;
    Tensor near = a.clone(), nan = a.clone(), inf = a.clone(), zero = a.clone(), far = a.clone();
    near.set_f(0, a.get_f(0) * (1 + p.eps));
    EXPECT_EQ(randgraph::compare_output(a, near, p), "") << backend;
    nan.set_f(1, NAN);
    EXPECT_NE(randgraph::compare_output(a, nan, p), "") << backend;
    EXPECT_NE(randgraph::compare_output(nan, a, p), "") << backend;
    inf.set_f(2, INFINITY);
    EXPECT_NE(randgraph::compare_output(a, inf, p), "") << backend;
    Tensor minus = inf.clone();
    minus.set_f(2, -INFINITY);
    EXPECT_NE(randgraph::compare_output(inf, minus, p), "") << backend;
    zero.set_f(3, 0.0);
    Tensor negz = zero.clone();
    negz.set_f(3, -0.0);
    EXPECT_EQ(randgraph::compare_output(zero, negz, p), "") << backend;
    far.set_f(4, a.get_f(4) + 0.5);
    EXPECT_NE(randgraph::compare_output(a, far, p), "") << backend;
  }
  const std::string t = randgraph::finding_text(*g, 11, "note\nwith a newline");
  EXPECT_EQ(randgraph::seed_of_text(t), 11u);
  EXPECT_EQ(text_of(*parse_graph(t)), text_of(*g));
}

// Every failure the campaigns found, minimised: each must now agree on every backend.
TEST(RandomGraph, RegressionGraphsAgreeOnEveryBackend) {
  const fs::path dir = fs::path(testenv::source_dir()) / "tests" / "randgraph";
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".tsl") continue;
    ++n;
    const std::string text = testenv::read_text(e.path().string());
    auto g = parse_graph(text, e.path().string());
    for (const auto& f : randgraph::check_graph(*g, randgraph::seed_of_text(text), randgraph::DiffOptions{}))
      ADD_FAILURE() << e.path().filename() << " on " << f.backend << ": " << f.detail;
  }
  EXPECT_GT(n, 0);
}

// The CI campaign: 1000 graphs (seeds 1..1000), every one on every backend, 0 mismatches.
// TESSEL_RANDGRAPH_COUNT changes the count (longer campaigns: `tessel fuzz-graphs`).
TEST(RandomGraph, ThousandGraphsAgreeWithEager) {
  int count = 1000;
  if (const char* c = std::getenv("TESSEL_RANDGRAPH_COUNT")) count = std::atoi(c);
  const auto st = randgraph::run_campaign(1, count, randgraph::DiffOptions{});
  for (const auto& f : st.findings) ADD_FAILURE() << "seed " << f.seed << " on " << f.backend << ": " << f.detail << "\n" << f.tsl;
  EXPECT_EQ(st.graphs, count);
  for (const char* b : {"graph", "compiled", "spyre", "tpu-v5e"}) EXPECT_EQ(st.compared.at(b), count - st.eager_errors) << b;
}

// The symbolic mode (docs/random-graphs.md): every graph that holds for other sizes of its first
// input's largest dim is compiled once with that dim as a size symbol and run at two of its values,
// both against eager. The seeds that found the inference rules accepting what the decompositions then
// refused (a LayerNormalization scale that fixes the size, an edge Pad, a CumSum along the symbol) are
// among them; a mode that symbolized nothing would prove nothing.
TEST(RandomGraph, SymbolicModeAgreesWithEagerAtTwoSizes) {
  int count = 1000;
  if (const char* c = std::getenv("TESSEL_RANDGRAPH_COUNT")) count = std::atoi(c);
  randgraph::DiffOptions o;
  o.backends = {"symbolic"};
  const auto st = randgraph::run_campaign(1, count, o);
  for (const auto& f : st.findings) ADD_FAILURE() << "seed " << f.seed << " on " << f.backend << ": " << f.detail << "\n" << f.tsl;
  EXPECT_EQ(st.compared.at("symbolic") + st.not_symbolic, count - st.eager_errors);
  EXPECT_GT(st.compared.at("symbolic"), count / 4);
  // A LayerNormalization whose constant scale fixes the normalized size: the rule refuses it symbolic (it once
  // accepted it and the decomposition refused); a Relu of the same input is symbolic.
  auto ln = parse_graph(R"(graph @g(%x: f32[3,5]) {
  const %sc: f32[5] = [1, 2, 3, 4, 5]
  %y: f32[3,5] = LayerNormalization(%x, %sc) {axis = -1} loc("ln")
  return %y
})");
  EXPECT_EQ(randgraph::symbolize(*ln, "s"), nullptr);
  auto relu = parse_graph(R"(graph @g(%x: f32[3,5]) {
  %y: f32[3,5] = Relu(%x) loc("r")
  return %y
})");
  auto sym = randgraph::symbolize(*relu, "s");
  ASSERT_NE(sym, nullptr);
  EXPECT_EQ(sym->inputs[0]->type.str(), "f32[3,s]");
}

// fuzz-graphs --seed 555345: a matmul whose A is a row expanded into rows (a matrix dim read with stride 0)
// made oneDNN refuse its descriptor on the compiled backend, statically and symbolically; the view is now
// materialised. Every backend agrees with eager, at the static shape and with the K dim symbolic.
TEST(RandomGraph, BroadcastMatrixOperandOfAMatmul) {
  for (const char* k : {"17", "s0"}) {
    const std::string text = fmt::format(R"(graph @g(%in0: f32[1,{0}], %in1: f32[17,{0}], %in2: f32[1,17]){1} {{
  const %c5: i64[3] = [8, 3, 17]
  const %w8: f32[17,3] = [-1.1, -1.2, -1.1, -0.07, 0.4, 1.0, -0.9, 0.8, -1.7, -0.7, 1.9, -0.2, -1.0, -1.4, 0.7, -0.2, 1.2, 1.1, 0.2, -0.2, -0.5, 0.8, 1.7, 0.2, 0.5, 1.8, -0.1, -1.6, -0.2, -1.9, 0.6, 0.7, -0.4, -1.2, 1.4, -1.2, 0.1, 0.3, 0.1, -0.3, -1.8, 0.9, -1.8, -1.3, -0.9, -1.9, -1.5, -0.01, -1, 1.3, 1.3]
  %v3: f32[1,17] = Gemm(%in0, %in1, %in2) {{transA = 0, transB = 1}} loc("n4")
  %v6: f32[8,3,17] = Expand(%v3, %c5) loc("n7")
  %v9: f32[8,3,3] = MatMul(%v6, %w8) loc("n10")
  return %v9
}})", k, std::string(k) == "s0" ? " symbols(s0 in [13, 29])" : "");
    auto g = parse_graph(text);
    randgraph::DiffOptions o;
    if (std::string(k) == "s0") o.backends = {"symbolic"};
    for (uint64_t seed : {1u, 2u})
      for (const auto& f : randgraph::check_graph(*g, seed, o)) ADD_FAILURE() << k << " on " << f.backend << ": " << f.detail;
  }
}

// fuzz-graphs --seed 9000917: an output whose every value lies below f32's normal range (Softplus(-100) is
// 3.7e-44 in eager's double, 0 in f32 arithmetic) is at f32's range edge, not a mismatch; the same graph
// one step inside the range still compares.
TEST(RandomGraph, SubnormalOutputsAreAtTheRangeEdge) {
  for (const char* shift : {"-100", "-10"}) {
    const std::string text = fmt::format(R"(graph @g(%x: f32[4]) {{
  const %zero: f32[] = [0]
  const %shift: f32[] = [{}]
  %z: f32[4] = Mul(%x, %zero) loc("z")
  %w: f32[4] = Add(%z, %shift) loc("w")
  %y: f32[4] = Softplus(%w) loc("y")
  return %y
}})", shift);
    auto g = parse_graph(text);
    for (const auto& f : randgraph::check_graph(*g, 7, randgraph::DiffOptions{}))
      ADD_FAILURE() << "shift " << shift << " on " << f.backend << ": " << f.detail;
  }
}
