// Special values follow the ONNX spec identically on eager, graph, compiled and the functional
// simulator (docs/decisions.md, "Special values"): Clip with a NaN bound gives NaN everywhere (the
// spec's Min(max, Max(input, min)) with NaN-propagating Max/Min; np.clip in the reference
// implementation), alone and as a matmul epilogue; clamping activations keep a NaN input; a matmul
// keeps 0 * NaN = NaN. Expected values are written out by hand from the spec, not computed.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>

#include "tessel/driver/graph_diff.h"
#include "tessel/ir/printer.h"
#include "tessel/runtime/interpreter.h"

using namespace tessel;

namespace {

// Eager on `text` gives `expected` (NaN where expected is NaN).
void expect_eager(const std::string& text, const std::vector<Tensor>& inputs, const std::vector<float>& expected) {
  auto g = parse_graph(text);
  const std::vector<Tensor> eager = run_eager(*g, inputs);
  ASSERT_EQ(eager[0].numel(), static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) {
    if (std::isnan(expected[i])) EXPECT_TRUE(std::isnan(eager[0].get_f(static_cast<int64_t>(i)))) << "eager element " << i;
    else EXPECT_EQ(eager[0].get_f(static_cast<int64_t>(i)), expected[i]) << "eager element " << i;
  }
}

Tensor f32(std::vector<double> v) { return Tensor::from_f64(DType::f32, {static_cast<int64_t>(v.size())}, v); }

}  // namespace

TEST(SpecialValues, ClipWithNaNBoundsIsNaNOnEager) {
  const std::vector<Tensor> x = {f32({-2, 0.5, 3, NAN})};
  expect_eager(R"(graph @g(%x: f32[4]) {
  const %lo: f32[] = [nan]
  const %hi: f32[] = [1]
  %y: f32[4] = Clip(%x, %lo, %hi) loc("clip")
  return %y
})", x, {NAN, NAN, NAN, NAN});
  expect_eager(R"(graph @g(%x: f32[4]) {
  const %lo: f32[] = [-1]
  const %hi: f32[] = [nan]
  %y: f32[4] = Clip(%x, %lo, %hi) loc("clip")
  return %y
})", x, {NAN, NAN, NAN, NAN});
  // ordinary bounds: NaN input stays NaN; min > max gives max
  expect_eager(R"(graph @g(%x: f32[4]) {
  const %lo: f32[] = [-1]
  const %hi: f32[] = [1]
  %y: f32[4] = Clip(%x, %lo, %hi) loc("clip")
  return %y
})", x, {-1, 0.5, 1, NAN});
  expect_eager(R"(graph @g(%x: f32[4]) {
  const %lo: f32[] = [2]
  const %hi: f32[] = [1]
  %y: f32[4] = Clip(%x, %lo, %hi) loc("clip")
  return %y
})", x, {1, 1, 1, NAN});
  expect_eager(R"(graph @g(%x: f32[4]) {
  %y: f32[4] = HardSigmoid(%x) {alpha = 0.5, beta = 0.5} loc("hs")
  return %y
})", x, {0, 0.75, 1, NAN});
}

// The same graphs on every backend agree with eager (the random-graph tester's check_graph), NaN
// placement exact: Clip alone (a loop kernel) and after a MatMul (oneDNN's clip epilogue).
TEST(SpecialValues, ClipWithNaNBoundsAgreesOnEveryBackend) {
  for (const char* lo : {"nan", "-1", "inf", "-inf"})
    for (const char* hi : {"nan", "1", "-inf"}) {
      const std::string text = fmt::format(R"(graph @g(%x: f32[5,3], %w: f32[3,4]) {{
  const %lo: f32[] = [{}]
  const %hi: f32[] = [{}]
  %m: f32[5,4] = MatMul(%x, %w) loc("mm")
  %y: f32[5,4] = Clip(%m, %lo, %hi) loc("c1")
  %z: f32[5,3] = Clip(%x, %lo, %hi) loc("c2")
  return %y, %z
}})", lo, hi);
      auto g = parse_graph(text);
      for (uint64_t seed : {1u, 2u, 3u})
        for (const auto& f : randgraph::check_graph(*g, seed, randgraph::DiffOptions{}))
          ADD_FAILURE() << "Clip(" << lo << ", " << hi << ") seed " << seed << " on " << f.backend << ": " << f.detail;
    }
}

// issue 41 (fuzz-graphs --seed 555154): LayerNormalization without B adds nothing, so a -0 result stays -0
// (eager once added 0.0, and 1 / y gave +inf where every other backend gave -inf). Row [1, 1]: each
// normalised value is 0; a scale of -1 makes it -0, whose reciprocal is -inf.
TEST(SpecialValues, LayerNormWithoutBiasKeepsNegativeZero) {
  const std::vector<double> ones = {1, 1};
  const std::vector<Tensor> x = {Tensor::from_f64(DType::f32, {1, 2}, ones)};
  expect_eager(R"(graph @g(%x: f32[1,2]) {
  const %s: f32[2] = [-1, 1]
  const %one: f32[] = [1]
  %y: f32[1,2] = LayerNormalization(%x, %s) {axis = -1} loc("ln")
  %r: f32[1,2] = Div(%one, %y) loc("recip")
  return %r
})", x, {-INFINITY, INFINITY});
}
