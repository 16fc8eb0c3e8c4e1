// Decomposition hooks of the reduction, normalization and attention families: each case runs one
// node eagerly with its reference kernel, then again after the core pipeline (decompose +
// simplify), which must leave only core ops and give the same values.
#include <gtest/gtest.h>

#include <cmath>

#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/passes/pass.h"
#include "tessel/runtime/interpreter.h"
#include "op_test_util.h"

using namespace tessel;
using namespace tessel::testenv;

namespace {

using In = NodeInput;

// Eager reference vs the core pipeline's graph; returns the decomposed outputs.
std::vector<Tensor> check_decomposes(const std::string& op, const std::vector<In>& ins, int num_outs = 1,
                                     const std::map<std::string, Attr>& attrs = {}, double tol = 1e-5) {
  std::vector<Tensor> given;
  Graph ref = one_node_graph(op, ins, num_outs, attrs, given);
  std::vector<Tensor> want = run_eager(ref, given);
  Graph g = one_node_graph(op, ins, num_outs, attrs, given);
  run_pipeline(g, parse_pipeline("core"), PassOptions{});
  for (const auto& n : g.nodes()) EXPECT_EQ(n->op->domain, "tessel.core") << n->name << " (" << n->op_name() << ")";
  std::vector<Tensor> got = run_eager(g, given);
  EXPECT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    EXPECT_EQ(got[i].dtype(), want[i].dtype()) << "output " << i;
    EXPECT_EQ(got[i].shape(), want[i].shape()) << "output " << i;
    std::vector<double> w = want[i].to_f64(), a = got[i].to_f64();
    if (w.size() != a.size()) continue;
    for (size_t j = 0; j < w.size(); ++j) {
      if (std::isnan(w[j]) || std::isinf(w[j]))
        EXPECT_TRUE(std::isnan(w[j]) ? std::isnan(a[j]) : a[j] == w[j]) << "output " << i << " element " << j;
      else
        EXPECT_NEAR(a[j], w[j], tol * (1 + std::fabs(w[j]))) << "output " << i << " element " << j;
    }
  }
  return got;
}

// Deterministic pseudo-random values in [-2, 2).
std::vector<double> ramp(int64_t n, int seed = 1) {
  std::vector<double> v(static_cast<size_t>(n));
  uint32_t s = 2654435761u * static_cast<uint32_t>(seed);
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<double>(s >> 8) / static_cast<double>(1 << 24) * 4.0 - 2.0;
  }
  return v;
}

Tensor rnd(DType t, Shape s, int seed = 1) {
  int64_t n = shape_numel(s);
  return Tensor::from_f64(t, std::move(s), ramp(n, seed));
}

}  // namespace

TEST(DecomposeReduction, ReduceLogSumExpKeepsInfiniteSlices) {
  const double inf = INFINITY;
  Tensor x = f32({3, 2}, {-inf, -inf, 1000, 999, inf, 1});
  auto y = check_decomposes("ReduceLogSumExp", {{x}, {i64({1}, {1}), true}}, 1, {{"keepdims", int64_t{0}}});
  EXPECT_EQ(y[0].shape(), (Shape{3}));
  EXPECT_EQ(y[0].to_f64()[0], -inf);
  EXPECT_NEAR(y[0].to_f64()[1], 1000 + std::log1p(std::exp(-1.0)), 1e-3);
}

TEST(DecomposeReduction, ReducesWithNoopAndIntegerMean) {
  check_decomposes("ReduceMean", {{ints(DType::i32, {2, 3}, {1, 2, 4, -7, 5, 9})}, {i64({1}, {-1}), true}});
  check_decomposes("ReduceL1", {{ints(DType::u8, {2, 2}, {1, 200, 3, 4})}, {i64({1}, {0}), true}});
  check_decomposes("ReduceL2", {{ints(DType::i64, {4}, {3, 4, 1, 1})}});
  auto id = check_decomposes("ReduceSum", {{f32({2}, {1, 2})}, {i64({0}, {}), true}}, 1,
                             {{"noop_with_empty_axes", int64_t{1}}});
  expect_near(id[0], {1, 2});
  check_decomposes("ReduceSumSquare", {{rnd(DType::f16, {2, 3, 4})}, {i64({2}, {0, 2}), true}}, 1, {}, 1e-3);
}

TEST(DecomposeReduction, ArgMaxLastIndexAndNaN) {
  const double nan = NAN;
  Tensor x = f32({2, 4}, {1, 3, 3, 0, 2, nan, 5, nan});
  auto first = check_decomposes("ArgMax", {{x}}, 1, {{"axis", int64_t{1}}});
  EXPECT_EQ(first[0].to_i64(), (std::vector<int64_t>{1, 1}));
  auto last = check_decomposes("ArgMax", {{x}}, 1, {{"axis", int64_t{-1}}, {"select_last_index", int64_t{1}}});
  EXPECT_EQ(last[0].to_i64(), (std::vector<int64_t>{2, 3}));
  check_decomposes("ArgMin", {{ints(DType::u64, {3, 2}, {5, 1, 5, 0, 2, 7})}}, 1,
                   {{"keepdims", int64_t{0}}, {"select_last_index", int64_t{1}}});
}

TEST(DecomposeReduction, CumSumExclusiveReverse) {
  Tensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  for (int64_t excl : {0, 1})
    for (int64_t rev : {0, 1})
      check_decomposes("CumSum", {{x}, {i64({}, {1}), true}}, 1, {{"exclusive", excl}, {"reverse", rev}});
  auto y = check_decomposes("CumSum", {{x}, {i64({}, {1}), true}}, 1,
                            {{"exclusive", int64_t{1}}, {"reverse", int64_t{1}}});
  expect_near(y[0], {5, 3, 0, 11, 6, 0});
  check_decomposes("CumProd", {{ints(DType::i32, {4}, {2, 3, -1, 5})}, {i64({}, {0}), true}}, 1,
                   {{"exclusive", int64_t{1}}});
}

TEST(DecomposeReduction, SoftmaxFamilyAndTopK) {
  Tensor x = rnd(DType::f16, {2, 3, 5});
  check_decomposes("Softmax", {{x}}, 1, {{"axis", int64_t{1}}}, 1e-3);
  check_decomposes("LogSoftmax", {{x}}, 1, {}, 1e-3);
  check_decomposes("Hardmax", {{f32({2, 3}, {1, 4, 4, -1, -2, -3})}});
  check_decomposes("TopK", {{f32({2, 4}, {3, 1, 3, 2, 0, -1, 5, 5})}, {i64({1}, {3}), true}}, 2);
  check_decomposes("TopK", {{f32({2, 4}, {3, 1, 3, 2, 0, -1, 5, 5})}, {i64({1}, {2}), true}}, 2,
                   {{"largest", int64_t{0}}, {"axis", int64_t{1}}});
}

TEST(DecomposeReduction, LossesWithWeightsAndIgnoreIndex) {
  Tensor x = rnd(DType::f32, {3, 4, 2});
  Tensor t = i64({3, 2}, {0, 3, -1, 2, 1, -1});
  Tensor w = f32({4}, {0.5, 1, 2, 3});
  for (const char* red : {"none", "sum", "mean"}) {
    std::map<std::string, Attr> at = {{"reduction", std::string(red)}, {"ignore_index", int64_t{-1}}};
    check_decomposes("SoftmaxCrossEntropyLoss", {{x}, {t}, {w}}, 2, at);
    check_decomposes("NegativeLogLikelihoodLoss", {{x}, {t}, {w}}, 1, at);
  }
  check_decomposes("SoftmaxCrossEntropyLoss", {{x}, {i64({3, 2}, {0, 3, 1, 2, 1, 0})}}, 1);
}

TEST(DecomposeNormalization, LayerNormStatsOutputsAndHalf) {
  Tensor x = rnd(DType::f16, {2, 3, 4});
  auto y = check_decomposes("LayerNormalization", {{x}, {rnd(DType::f16, {3, 4}, 2)}, {rnd(DType::f16, {4}, 3)}}, 3,
                            {{"axis", int64_t{1}}}, 2e-3);
  EXPECT_EQ(y[1].dtype(), DType::f32);
  EXPECT_EQ(y[1].shape(), (Shape{2, 1, 1}));
  check_decomposes("RMSNormalization", {{rnd(DType::f32, {2, 5})}, {rnd(DType::f32, {5}, 4)}});
}

TEST(DecomposeNormalization, ChannelNorms) {
  Tensor x = rnd(DType::f32, {2, 4, 3, 2});
  Tensor c = rnd(DType::f32, {4}, 5);
  Tensor var = f32({4}, {0.5, 1, 2, 3});
  check_decomposes("BatchNormalization", {{x}, {c}, {c}, {c}, {var}});
  check_decomposes("BatchNormalization", {{x}, {c}, {c}, {c}, {var}}, 3, {{"training_mode", int64_t{1}}});
  check_decomposes("InstanceNormalization", {{x}, {c}, {var}});
  check_decomposes("GroupNormalization", {{x}, {c}, {var}}, 1, {{"num_groups", int64_t{2}}});
  check_decomposes("LRN", {{x}}, 1, {{"size", int64_t{2}}, {"alpha", 0.5}});
  check_decomposes("LpNormalization", {{f32({2, 2}, {0, 0, 3, -4})}}, 1, {{"p", int64_t{1}}});
  check_decomposes("MeanVarianceNormalization", {{x}});
}

TEST(DecomposeAttention, GqaCausalPastAndShortBoolMask) {
  // 3-D Q with 4 heads, K/V with 2 heads, a 2-step cache, a bool mask covering part of T.
  const int64_t B = 2, S = 3, L = 3, P = 2, D = 4;
  Tensor q = rnd(DType::f32, {B, S, 4 * D}, 1), k = rnd(DType::f32, {B, L, 2 * D}, 2),
         v = rnd(DType::f32, {B, L, 2 * D}, 3);
  std::vector<int64_t> mv;
  for (int i = 0; i < S * 4; ++i) mv.push_back(i % 3 != 1);
  Tensor mask = ints(DType::boolean, {S, 4}, mv);
  Tensor pk = rnd(DType::f32, {B, 2, P, D}, 4), pv = rnd(DType::f32, {B, 2, P, D}, 5);
  for (int64_t mode : {0, 1, 2, 3})
    check_decomposes("Attention", {{q}, {k}, {v}, {mask}, {pk}, {pv}}, 4,
                     {{"q_num_heads", int64_t{4}}, {"kv_num_heads", int64_t{2}}, {"is_causal", int64_t{1}},
                      {"softcap", 2.0}, {"qk_matmul_output_mode", mode}});
  // 4-D, float mask, custom scale, half precision.
  Tensor q4 = rnd(DType::f16, {1, 2, 3, 4}, 6), k4 = rnd(DType::f16, {1, 2, 5, 4}, 7), v4 = rnd(DType::f16, {1, 2, 5, 3}, 8);
  check_decomposes("Attention", {{q4}, {k4}, {v4}, {rnd(DType::f16, {3, 5}, 9)}}, 1, {{"scale", 0.3}}, 2e-3);
}

TEST(DecomposeAttention, RotaryLinearFlex) {
  Tensor x = rnd(DType::f32, {2, 3, 2 * 6}, 1);
  Tensor cache_c = rnd(DType::f32, {5, 3}, 2), cache_s = rnd(DType::f32, {5, 3}, 3);
  Tensor pos = i64({2, 3}, {0, 1, 2, 4, 3, 0});
  for (int64_t inter : {0, 1})
    check_decomposes("RotaryEmbedding", {{x}, {cache_c}, {cache_s}, {pos}}, 1,
                     {{"num_heads", int64_t{2}}, {"interleaved", inter}});
  check_decomposes("RotaryEmbedding", {{rnd(DType::f32, {2, 2, 3, 6})}, {rnd(DType::f32, {2, 3, 2}, 4)},
                                       {rnd(DType::f32, {2, 3, 2}, 5)}},
                   1, {{"rotary_embedding_dim", int64_t{4}}});
  const int64_t B = 2, T = 3, HQ = 4, HKV = 2, DK = 3, DV = 2;
  Tensor q = rnd(DType::f32, {B, T, HQ * DK}, 1), k = rnd(DType::f32, {B, T, HKV * DK}, 2),
         v = rnd(DType::f32, {B, T, HKV * DV}, 3), st = rnd(DType::f32, {B, HKV, DK, DV}, 4);
  Tensor decay = Tensor::from_f64(DType::f32, {B, T, HKV * DK}, std::vector<double>(B * T * HKV * DK, -0.1));
  Tensor beta = f32({B, T, 1}, {0.5, 0.2, 0.9, 0.1, 0.3, 0.7});
  for (const char* rule : {"linear", "gated", "delta", "gated_delta"})
    check_decomposes("LinearAttention", {{q}, {k}, {v}, {st}, {decay}, {beta}}, 2,
                     {{"q_num_heads", HQ}, {"kv_num_heads", HKV}, {"update_rule", std::string(rule)}});
  check_decomposes("FlexAttention", {{rnd(DType::f32, {1, 4, 3, 2})}, {rnd(DType::f32, {1, 2, 5, 2}, 2)},
                                     {rnd(DType::f32, {1, 2, 5, 3}, 3)}});
}
