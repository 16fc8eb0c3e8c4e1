// Elementwise and activation ops: shape rules and reference kernels against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"

using namespace tessel;

namespace {

// Builds a one-node graph over the given inputs, infers it and runs it.
struct OneNode {
  Graph g;
  Node* node = nullptr;

  OneNode(const std::string& op, const std::vector<Tensor>& inputs,
          std::map<std::string, Attr> attrs = {}, int num_outputs = 1) {
    const OpDef* def = OpRegistry::get().find(op);
    if (!def) throw std::runtime_error("no op " + op);
    std::vector<Value*> ins;
    for (size_t i = 0; i < inputs.size(); ++i)
      ins.push_back(
          g.add_input("in" + std::to_string(i), TensorType{inputs[i].dtype(), inputs[i].shape()}));
    std::vector<std::string> outs;
    for (int i = 0; i < num_outputs; ++i) outs.push_back("out" + std::to_string(i));
    node = g.add_node(def, "n", ins, outs, std::move(attrs));
    for (Value* v : node->outputs) g.outputs.push_back(v);
    infer_graph(g);
  }
  std::vector<Tensor> run(const std::vector<Tensor>& inputs) { return run_eager(g, inputs); }
};

std::vector<Tensor> run1(const std::string& op, const std::vector<Tensor>& inputs,
                         std::map<std::string, Attr> attrs = {}, int num_outputs = 1) {
  OneNode n(op, inputs, std::move(attrs), num_outputs);
  return n.run(inputs);
}

Tensor f32(Shape s, std::vector<double> v) {
  return Tensor::from_f64(DType::f32, std::move(s), v);
}
Tensor ints(DType t, Shape s, std::vector<int64_t> v) {
  return Tensor::from_i64(t, std::move(s), v);
}

void expect_f(const Tensor& t, std::vector<double> want, double tol = 1e-6) {
  ASSERT_EQ(t.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(t.get_f(i))) << "element " << i;
    } else {
      EXPECT_NEAR(t.get_f(i), want[i], tol) << "element " << i;
    }
  }
}

void expect_i(const Tensor& t, std::vector<int64_t> want) {
  ASSERT_EQ(t.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(t.get_i(i), want[i]) << "element " << i;
}

}  // namespace

TEST(Elementwise, RoundHalfToEven) {
  auto y = run1("Round", {f32({6}, {0.5, 1.5, 2.5, -0.5, -1.5, 2.6})});
  expect_f(y[0], {0, 2, 2, -0.0, -2, 3});
}

TEST(Elementwise, IntegerAbsNegWrap) {
  auto y = run1("Abs", {ints(DType::i8, {3}, {-128, -5, 7})});
  expect_i(y[0], {-128, 5, 7});  // |-128| does not fit in int8 and wraps
  y = run1("Neg", {ints(DType::i32, {2}, {std::numeric_limits<int32_t>::min(), 3})});
  expect_i(y[0], {std::numeric_limits<int32_t>::min(), -3});
}

TEST(Elementwise, DivAndModIntegers) {
  auto y =
      run1("Div", {ints(DType::i32, {4}, {7, -7, 7, -7}), ints(DType::i32, {4}, {2, 2, -2, -2})});
  expect_i(y[0], {3, -3, -3, 3});  // truncation toward zero
  y = run1("Mod", {ints(DType::i32, {4}, {7, -7, 7, -7}), ints(DType::i32, {4}, {3, 3, -3, -3})});
  expect_i(y[0], {1, 2, -2, -1});  // sign of the divisor
  y = run1("Mod", {ints(DType::i32, {4}, {7, -7, 7, -7}), ints(DType::i32, {4}, {3, 3, -3, -3})},
           {{"fmod", int64_t{1}}});
  expect_i(y[0], {1, -1, 1, -1});  // sign of the dividend
  EXPECT_THROW(run1("Div", {ints(DType::i32, {1}, {1}), ints(DType::i32, {1}, {0})}), Error);
}

TEST(Elementwise, UnsignedComparisonsAndDivision) {
  const int64_t big = static_cast<int64_t>(uint64_t{1} << 63);  // 2^63 as u64
  auto y = run1("Greater", {ints(DType::u64, {2}, {big, 1}), ints(DType::u64, {2}, {1, big})});
  EXPECT_EQ(y[0].dtype(), DType::boolean);
  expect_i(y[0], {1, 0});
  y = run1("Div", {ints(DType::u64, {1}, {big}), ints(DType::u64, {1}, {2})});
  EXPECT_EQ(static_cast<uint64_t>(y[0].get_i(0)), uint64_t{1} << 62);
}

TEST(Elementwise, PowMixedTypes) {
  auto y = run1("Pow", {ints(DType::i32, {3}, {2, 3, -2}), f32({3}, {3, 2, 3})});
  EXPECT_EQ(y[0].dtype(), DType::i32);
  expect_i(y[0], {8, 9, -8});
  y = run1("Pow", {f32({2}, {4, 2}), ints(DType::i64, {1}, {2})});
  expect_f(y[0], {16, 4});
  y = run1("Pow", {ints(DType::i64, {2}, {3, 2}), ints(DType::i64, {2}, {4, 62})});
  expect_i(y[0], {81, int64_t{1} << 62});
}

TEST(Elementwise, BitShiftNarrowsToWidth) {
  auto y = run1("BitShift", {ints(DType::u8, {3}, {16, 255, 1}), ints(DType::u8, {3}, {1, 1, 8})},
                {{"direction", std::string("LEFT")}});
  expect_i(y[0], {32, 254, 0});
}

TEST(Elementwise, VariadicBroadcast) {
  auto y = run1("Max", {f32({2, 1}, {1, 5}), f32({3}, {2, 3, 4}), f32({}, {0})});
  EXPECT_EQ(y[0].shape(), (Shape{2, 3}));
  expect_f(y[0], {2, 3, 4, 5, 5, 5});
  y = run1("Mean", {f32({2}, {1, 2}), f32({2}, {3, 6})});
  expect_f(y[0], {2, 4});
  y = run1("Min", {f32({2}, {NAN, 1}), f32({2}, {0, 2})});
  expect_f(y[0], {NAN, 1});
}

TEST(Elementwise, CastSaturatesFloat8) {
  Tensor x = f32({4}, {1000, -1000, INFINITY, 0.3});
  auto y = run1("Cast", {x}, {{"to", int64_t{17}}});  // float8e4m3fn, saturate by default
  EXPECT_EQ(y[0].dtype(), DType::f8e4m3fn);
  expect_f(y[0], {448, -448, 448, 0.3125});
  y = run1("Cast", {x}, {{"to", int64_t{17}}, {"saturate", int64_t{0}}});
  expect_f(y[0], {NAN, NAN, NAN, 0.3125});
  y = run1("Cast", {f32({3}, {-2.7, 3.9, 0})}, {{"to", int64_t{6}}});  // to int32 truncates
  expect_i(y[0], {-2, 3, 0});
  y = run1("Cast", {f32({3}, {-2.7, NAN, 0})}, {{"to", int64_t{9}}});  // to bool
  expect_i(y[0], {1, 1, 0});
}

TEST(Elementwise, CastSubByteAndE8M0) {
  // To int2 wraps (-3 -> 1, 2 -> -2); to uint2 wraps modulo 4.
  Tensor x = f32({7}, {-3, -2, -1, 0, 1, 2, 3});
  auto y = run1("Cast", {x}, {{"to", int64_t{26}}});
  EXPECT_EQ(y[0].dtype(), DType::i2);
  expect_i(y[0], {1, -2, -1, 0, 1, -2, -1});
  y = run1("Cast", {x}, {{"to", int64_t{25}}});
  EXPECT_EQ(y[0].dtype(), DType::u2);
  expect_i(y[0], {1, 2, 3, 0, 1, 2, 3});
  // To float8e8m0: 3 lies midway between 2 and 4, 0.3 between 0.25 and 0.5.
  Tensor z = f32({3}, {3, 0.3, -8});
  y = run1("Cast", {z}, {{"to", int64_t{24}}});  // round_mode "up" by default
  EXPECT_EQ(y[0].dtype(), DType::f8e8m0);
  expect_f(y[0], {4, 0.5, 8});
  y = run1("Cast", {z}, {{"to", int64_t{24}}, {"round_mode", std::string("down")}});
  expect_f(y[0], {2, 0.25, 8});
  y = run1("Cast", {z}, {{"to", int64_t{24}}, {"round_mode", std::string("nearest")}});
  expect_f(y[0], {4, 0.25, 8});
  EXPECT_THROW(OneNode("Cast", {z}, {{"to", int64_t{24}}, {"round_mode", std::string("odd")}}),
               Error);
  // And back: every code is a power of two.
  y = run1("Cast", {y[0]}, {{"to", int64_t{1}}});
  expect_f(y[0], {4, 0.25, 8});
}

TEST(Elementwise, QuantizeTwoBit) {
  // y = saturate(round(x / 2) + zp): int2 clamps to [-2, 1], uint2 to [0, 3].
  Tensor x = f32({5}, {-9, -2, 1, 2, 9});
  auto y = run1("QuantizeLinear", {x, f32({}, {2}), ints(DType::i2, {}, {0})});
  EXPECT_EQ(y[0].dtype(), DType::i2);
  expect_i(y[0], {-2, -1, 0, 1, 1});  // -4.5 -> -2 (clamped), -1, 0.5 -> 0 (even), 1, 4.5 -> 1
  y = run1("QuantizeLinear", {x, f32({}, {2}), ints(DType::u2, {}, {1})});
  expect_i(y[0], {0, 0, 1, 2, 3});
  auto d = run1("DequantizeLinear", {ints(DType::u2, {4}, {0, 1, 2, 3}), f32({}, {2}),
                                     ints(DType::u2, {1}, {1})});
  expect_f(d[0], {-2, 0, 2, 4});
}

TEST(Elementwise, WhereAndClip) {
  Tensor c = ints(DType::boolean, {2, 1}, {1, 0});
  auto y = run1("Where", {c, f32({2}, {1, 2}), f32({}, {9})});
  EXPECT_EQ(y[0].shape(), (Shape{2, 2}));
  expect_f(y[0], {1, 2, 9, 9});
  y = run1("Clip", {f32({4}, {-3, 0.5, 7, NAN}), f32({}, {-1}), f32({}, {1})});
  expect_f(y[0], {-1, 0.5, 1, NAN});
  y = run1("Clip", {ints(DType::i8, {3}, {-100, 5, 100}), ints(DType::i8, {}, {-10}),
                    ints(DType::i8, {}, {10})});
  expect_i(y[0], {-10, 5, 10});
}

TEST(Elementwise, IsInfAndDropoutInference) {
  auto y = run1("IsInf", {f32({3}, {INFINITY, -INFINITY, 1})}, {{"detect_positive", int64_t{0}}});
  expect_i(y[0], {0, 1, 0});
  y = run1("Dropout", {f32({2}, {1, 2})}, {}, 2);
  expect_f(y[0], {1, 2});
  EXPECT_EQ(y[1].dtype(), DType::boolean);
  expect_i(y[1], {1, 1});
}

TEST(Elementwise, RejectsMismatchedDtypes) {
  EXPECT_THROW(OneNode("Add", {f32({1}, {1}), ints(DType::i32, {1}, {1})}), Error);
  EXPECT_THROW(OneNode("Sqrt", {ints(DType::i32, {1}, {4})}), Error);
}

TEST(Activation, HandComputedValues) {
  Tensor x = f32({3}, {-1, 0, 2});
  expect_f(run1("Relu", {x})[0], {0, 0, 2});
  expect_f(run1("LeakyRelu", {x}, {{"alpha", 0.1}})[0], {-0.1, 0, 2});
  expect_f(run1("Elu", {x})[0], {std::exp(-1.0) - 1, 0, 2});
  expect_f(run1("Sigmoid", {x})[0], {1 / (1 + std::exp(1.0)), 0.5, 1 / (1 + std::exp(-2.0))});
  expect_f(run1("HardSigmoid", {x})[0], {0.3, 0.5, 0.9});
  expect_f(run1("HardSwish", {x})[0], {-1.0 / 3, 0, 2 * (2.0 / 6 + 0.5)});
  expect_f(run1("Softsign", {x})[0], {-0.5, 0, 2.0 / 3});
  expect_f(run1("Softplus", {x})[0],
           {std::log(1 + std::exp(-1.0)), std::log(2.0), std::log(1 + std::exp(2.0))});
  expect_f(run1("ThresholdedRelu", {x}, {{"alpha", 1.5}})[0], {0, 0, 2});
  expect_f(run1("Shrink", {f32({3}, {-2, 0.3, 2})}, {{"bias", 0.5}, {"lambd", 1.0}})[0],
           {-1.5, 0, 1.5});
  expect_f(run1("Gelu", {x})[0], {-0.15865525393145707, 0, 1.9544997361036416});
  expect_f(run1("PRelu", {f32({2, 2}, {-1, -2, 3, -4}), f32({2}, {0.5, 0.25})})[0],
           {-0.5, -0.5, 3, -1});
  expect_i(run1("Relu", {ints(DType::i32, {2}, {-3, 4})})[0], {0, 4});
  // SwiGLU: A * sigmoid(alpha * A) * B. With A = 0 the gate is 0; A = 2, alpha = 1, B = 3:
  // 2 * 3 / (1 + e^-2); A = -1, alpha = 0.5, B = 4: -4 / (1 + e^0.5).
  expect_f(run1("SwiGLU", {f32({2}, {0, 2}), f32({2}, {5, 3})})[0], {0, 6 / (1 + std::exp(-2.0))});
  expect_f(run1("SwiGLU", {f32({1}, {-1}), f32({1}, {4})}, {{"alpha", 0.5}})[0],
           {-4 / (1 + std::exp(0.5))});
  EXPECT_THROW(OneNode("SwiGLU", {f32({2}, {1, 2}), f32({1}, {1})}), Error);  // no broadcasting
  EXPECT_THROW(OneNode("SwiGLU", {ints(DType::i32, {1}, {1}), ints(DType::i32, {1}, {1})}), Error);
}

TEST(Elementwise, LegacyUpgrades) {
  // Clip-6: min/max attributes become constant inputs.
  Graph g;
  Value* x = g.add_input("x", TensorType{DType::f32, {3}});
  const OpDef* clip = OpRegistry::get().find("Clip");
  Node* n = g.add_node(clip, "c", {x}, {"y"}, {{"min", -1.0}, {"max", 2.0}});
  g.outputs.push_back(n->outputs[0]);
  clip->upgrade(g, *n, 6);
  EXPECT_FALSE(n->has_attr("min"));
  ASSERT_EQ(n->inputs.size(), 3u);
  infer_graph(g);
  expect_f(run_eager(g, {f32({3}, {-5, 0.5, 5})})[0], {-1, 0.5, 2});

  // Dropout-10: the ratio attribute becomes an input; inference mode is an identity.
  Graph g2;
  Value* x2 = g2.add_input("x", TensorType{DType::f32, {2}});
  const OpDef* drop = OpRegistry::get().find("Dropout");
  Node* d = g2.add_node(drop, "d", {x2}, {"y", "mask"}, {{"ratio", 0.3}});
  g2.outputs = {d->outputs[0], d->outputs[1]};
  drop->upgrade(g2, *d, 10);
  infer_graph(g2);
  auto out = run_eager(g2, {f32({2}, {3, -4})});
  expect_f(out[0], {3, -4});
  expect_i(out[1], {1, 1});
}

TEST(Elementwise, SeededTrainingDropoutIsReproducible) {
  std::map<std::string, Attr> attrs{{"seed", int64_t{7}}};
  std::vector<Tensor> in{f32({64}, std::vector<double>(64, 1.0)), f32({}, {0.5}),
                         ints(DType::boolean, {}, {1})};
  auto a = run1("Dropout", in, attrs, 2);
  auto b = run1("Dropout", in, attrs, 2);
  EXPECT_TRUE(a[0].same_as(b[0]));
  for (int64_t i = 0; i < 64; ++i) EXPECT_DOUBLE_EQ(a[0].get_f(i), a[1].get_i(i) ? 2.0 : 0.0);
}

TEST(Elementwise, LegacyAxisBroadcast) {
  // Add-6 with broadcast=1, axis=1: B [3] lines up with A's dim 1, not its last dim.
  Graph g;
  Value* a = g.add_input("a", TensorType{DType::f32, {2, 3, 2}});
  Value* b = g.add_constant("b", f32({3}, {10, 20, 30}));
  const OpDef* add = OpRegistry::get().find("Add");
  Node* n = g.add_node(add, "n", {a, b}, {"y"}, {{"broadcast", int64_t{1}}, {"axis", int64_t{1}}});
  g.outputs.push_back(n->outputs[0]);
  add->upgrade(g, *n, 6);
  EXPECT_FALSE(n->has_attr("axis"));
  infer_graph(g);
  auto y = run_eager(g, {f32({2, 3, 2}, std::vector<double>(12, 1.0))});
  expect_f(y[0], {11, 11, 21, 21, 31, 31, 11, 11, 21, 21, 31, 31});

  // The same with B a graph input: a Reshape of B to [3, 1] is inserted before the Add.
  Graph g3;
  Value* a3 = g3.add_input("a", TensorType{DType::f32, {2, 3, 2}});
  Value* b3 = g3.add_input("b", TensorType{DType::f32, {3}});
  Node* n3 =
      g3.add_node(add, "n", {a3, b3}, {"y"}, {{"broadcast", int64_t{1}}, {"axis", int64_t{1}}});
  g3.outputs.push_back(n3->outputs[0]);
  add->upgrade(g3, *n3, 6);
  ASSERT_EQ(g3.nodes().size(), 2u);
  EXPECT_EQ(g3.nodes()[0]->op_name(), "Reshape");
  EXPECT_EQ(g3.nodes()[1].get(), n3);
  infer_graph(g3);
  EXPECT_EQ(n3->inputs[1]->type.str(), "f32[3,1]");
  y = run_eager(g3, {f32({2, 3, 2}, std::vector<double>(12, 1.0)), f32({3}, {10, 20, 30})});
  expect_f(y[0], {11, 11, 21, 21, 31, 31, 11, 11, 21, 21, 31, 31});

  // From opset 7 on, the legacy attributes are an error rather than silently ignored.
  Graph g2;
  Value* a2 = g2.add_input("a", TensorType{DType::f32, {2}});
  g2.add_node(OpRegistry::get().find("Relu"), "r", {a2}, {"y"},
              {{"consumed_inputs", std::vector<int64_t>{0}}});
  EXPECT_THROW(infer_graph(g2), Error);
}
