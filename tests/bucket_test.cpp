// Padding a symbolic core graph to a bucket (passes/bucket.h): the padded graph, run on zero-padded
// inputs and its mask, gives the unpadded graph's results in the leading positions; without the masks
// it would not (the test checks that it is the masks that make it right); what padding would change
// and no mask can fix is refused, naming the node.
#include <gtest/gtest.h>

#include "graph_test_util.h"
#include "tessel/ir/bind.h"
#include "tessel/ir/printer.h"
#include "tessel/passes/bucket.h"
#include "tessel/runtime/interpreter.h"

using namespace tessel;

namespace {

// Scores of s0 queries against s1 keys, softmax over the keys, then the values: every way padding
// along the keys reaches a result (a max, a sum and a contraction over s1).
const char* kAttention = R"(graph @attn(%q: f32[s0,8], %k: f32[s1,8], %v: f32[s1,4]) symbols(s0 in [1, 64], s1 in [1, 64]) {
  %s: f32[s0,s1] = dot_general(%q, %k) {lhs_batch = ints[], lhs_contract = [1], rhs_batch = ints[], rhs_contract = [1]} loc("scores")
  %m: f32[s0] = reduce(%s) {axes = [1], kind = "max"} loc("softmax")
  %mb: f32[s0,s1] = broadcast_in_dim(%m) {dims = [0], shape = dims[s0, s1]} loc("softmax")
  %n: f32[s0,s1] = neg(%mb) loc("softmax")
  %d: f32[s0,s1] = add(%s, %n) loc("softmax")
  %e: f32[s0,s1] = exp(%d) loc("softmax")
  %z: f32[s0] = reduce(%e) {axes = [1], kind = "sum"} loc("softmax")
  %zb: f32[s0,s1] = broadcast_in_dim(%z) {dims = [0], shape = dims[s0, s1]} loc("softmax")
  %p: f32[s0,s1] = div(%e, %zb) loc("softmax")
  %y: f32[s0,4] = dot_general(%p, %v) {lhs_batch = ints[], lhs_contract = [1], rhs_batch = ints[], rhs_contract = [0]} loc("values")
  return %y
}
)";

Tensor padded(const Tensor& t, const Shape& s) {
  Tensor out(t.dtype(), s);
  const std::vector<double> v = t.to_f64();
  const int64_t cols = t.shape().back(), rows = t.shape()[0];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out.set_f(r * s.back() + c, v[static_cast<size_t>(r * cols + c)]);
  return out;
}

}  // namespace

TEST(Bucket, PaddedKeysAreMaskedOut) {
  const auto g = parse_graph(kAttention, "attn.tsl");
  for (int64_t keys : {1, 5, 13, 16}) {
    const BucketedGraph bg = pad_to_bucket(*g, "s1", 16, {{"s0", 3}});
    EXPECT_EQ(bg.masks, 4) << "the max, the sum and both operands of the values' contraction";
    EXPECT_EQ(bg.input_padded, (std::vector<std::vector<int>>{{}, {0}, {0}}));
    EXPECT_EQ(bg.output_padded, (std::vector<std::vector<int>>{{}}));
    const Tensor q = testenv::varied_f32({3, 8}, 1), k = testenv::varied_f32({keys, 8}, 2), v = testenv::varied_f32({keys, 4}, 3);
    const std::vector<Tensor> want = run_eager(*g, {q, k, v});
    Tensor valid(DType::boolean, {16});
    for (int64_t i = 0; i < keys; ++i) valid.set_i(i, 1);
    const std::vector<Tensor> got = run_eager(*bg.graph, {q, padded(k, {16, 8}), padded(v, {16, 4}), valid});
    ASSERT_EQ(got[0].shape(), want[0].shape());
    const std::vector<double> a = got[0].to_f64(), b = want[0].to_f64();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << "keys " << keys << " element " << i;
    // The masks are what makes it right: with every position marked valid the padded keys take part.
    if (keys < 16) {
      Tensor all(DType::boolean, {16});
      for (int64_t i = 0; i < 16; ++i) all.set_i(i, 1);
      const std::vector<double> c = run_eager(*bg.graph, {q, padded(k, {16, 8}), padded(v, {16, 4}), all})[0].to_f64();
      double diff = 0;
      for (size_t i = 0; i < c.size(); ++i) diff = std::max(diff, std::abs(c[i] - b[i]));
      EXPECT_GT(diff, 1e-3) << "keys " << keys << ": the padded keys changed nothing, so the test proves nothing";
    }
  }
}

TEST(Bucket, WhatPaddingWouldChangeIsRefused) {
  struct Case {
    const char* body;
    const char* reason;
  };
  const Case cases[] = {
      {R"(%y: f32[s0,4] = slice(%x) {starts = [0, 0], stops = dims[s0, 4], strides = [1, 1]} loc("whole")
  %z: f32[s0+1,4] = concatenate(%y, %c) {axis = 0} loc("join")
  return %z)",
       "node 'join'"},
      {R"(%y: f32[s0,4] = neg(%x) loc("n")
  %z: f32[4*s0] = reshape(%y) {shape = dims[4*s0]} loc("flat")
  return %z)",
       "output 'z' has dim 0 of size 4*s0"},
      {R"(%y: f32[4*s0] = reshape(%x) {shape = dims[4*s0]} loc("flat")
  %z: f32[] = reduce(%y) {axes = [0], kind = "sum"} loc("total")
  return %z)",
       "reduces over dim 0 of size 4*s0"},
      {R"(%y: f32[s0,4] = neg(%x) loc("n")
  return %y)",
       ""},
  };
  for (const Case& c : cases) {
    const std::string text = std::string("graph @g(%x: f32[s0,4], %c: f32[1,4]) symbols(s0 in [1, 64]) {\n  ") + c.body + "\n}\n";
    const auto g = parse_graph(text, "g.tsl");
    if (std::string(c.reason).empty()) {
      EXPECT_NO_THROW(pad_to_bucket(*g, "s0", 8)) << text;
      continue;
    }
    try {
      pad_to_bucket(*g, "s0", 8);
      ADD_FAILURE() << "padded: " << text;
    } catch (const Error& e) {
      EXPECT_TRUE(e.is_unsupported()) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.reason), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(choose_bucket({64, 128, 256}, 100), 128);
  EXPECT_EQ(choose_bucket({64, 128, 256}, 64), 64);
  EXPECT_THROW(choose_bucket({64, 128, 256}, 257), Error);
}
