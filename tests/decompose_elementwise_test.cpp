// Decomposition hooks of the elementwise and activation families: each decomposed node (core ops
// only) computes what the op's reference kernel computes, on the inputs where the core forms are
// delicate (signs, NaN, infinities, wrapping, out-of-range shifts, narrow floats).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "op_test_util.h"
#include "tessel/passes/pass.h"

using namespace tessel;
using namespace tessel::testenv;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Runs one `op` node with the given inputs (graph inputs, or constants where `constant[i]`) after
// the decompose pass; every node left must be a core op.
std::vector<Tensor> run_decomposed(const std::string& op, const std::vector<Tensor>& ins,
                                   int num_outs = 1, std::map<std::string, Attr> attrs = {},
                                   std::vector<bool> constant = {}) {
  std::vector<Tensor> given;
  Graph g = one_node_graph(op, ins, constant, num_outs, std::move(attrs), given);
  decompose(g);
  for (const auto& node : g.nodes()) EXPECT_EQ(node->op->domain, "tessel.core") << node->op_name();
  return run_eager(g, given);
}

// The decomposed node against the op's reference kernel, output by output.
void check(const std::string& op, const std::vector<Tensor>& ins,
           std::map<std::string, Attr> attrs = {}, double rtol = 1e-6, int num_outs = 1,
           std::vector<bool> constant = {}) {
  std::vector<Tensor> want = run_op(op, ins, num_outs, attrs);
  std::vector<Tensor> got = run_decomposed(op, ins, num_outs, attrs, constant);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    expect_same(got[i], want[i], rtol, op + " output " + std::to_string(i));
}

Tensor f16(Shape s, std::vector<double> v) {
  return Tensor::from_f64(DType::f16, std::move(s), v);
}
Tensor f64(Shape s, std::vector<double> v) {
  return Tensor::from_f64(DType::f64, std::move(s), v);
}

const std::vector<double> kSpecial = {0.0,   -0.0, 1.0,   -1.0, 0.5,   -2.5, 1e-4,
                                      -3e-3, 7.25, -40.0, kInf, -kInf, kNaN};

}  // namespace

TEST(DecomposeElementwise, TrigAndHyperbolicMatchTheKernels) {
  // (Near the zeros of cos beyond ±π/2, e.g. 3π/2, f32 math loses the tiny result: not checked.)
  const Tensor x = f32({9}, {0.0, 0.3, -1.2, 1.5707964, -1.5707964, 3.0, 4.0, 10.0, -25.0});
  for (const char* op : {"Cos", "Tan", "Sinh", "Cosh", "Asinh"}) check(op, {x}, {}, 2e-5);
  // The inverse functions at and beyond their domain's ends (±π/2, 0, π, NaN, ±inf).
  const Tensor unit = f32({9}, {-1.0, -0.999, -0.5, 0.0, 1e-3, 0.5, 0.999, 1.0, 1.5});
  for (const char* op : {"Asin", "Acos", "Atanh"}) check(op, {unit}, {}, 2e-5);
  check("Acosh", {f32({6}, {0.5, 1.0, 1.001, 2.0, 100.0, kInf})}, {}, 2e-5);
  check("Cos", {f64({4}, {0.0, M_PI / 2, 1.0, -M_PI})}, {}, 1e-12);
  check("Cos", {f16({4}, {0.0, 1.5703125, 1.0, -3.140625})}, {}, 1e-3);
}

TEST(DecomposeElementwise, CosNearItsZerosKeepsRelativeAccuracy) {
  // cos(x) ≈ π/2 - x near π/2: the result is tiny, the input's rounding must not swamp it.
  const double x = static_cast<float>(M_PI / 2) + 1e-6;
  auto got = run_decomposed("Cos", {f32({1}, {x})});
  EXPECT_NEAR(got[0].get_f(0), std::cos(static_cast<float>(x)), 1e-3 * std::fabs(std::cos(x)));
}

TEST(DecomposeElementwise, SignAbsCeilRoundKeepSpecialValues) {
  const Tensor x = f32({static_cast<int64_t>(kSpecial.size())}, kSpecial);
  for (const char* op : {"Sign", "Abs", "Ceil", "Round", "Reciprocal", "IsNaN"}) check(op, {x});
  check("Round", {f32({6}, {0.5, 1.5, 2.5, -0.5, -1.5, 2.4999})});
  const Tensor i = ints(DType::i8, {5}, {-128, -3, 0, 5, 127});
  for (const char* op : {"Sign", "Abs"}) check(op, {i});
  for (const char* op : {"Sign", "Abs"}) check(op, {ints(DType::u8, {3}, {0, 7, 255})});
}

TEST(DecomposeElementwise, IsInfHonoursItsFlags) {
  const Tensor x = f16({5}, {1.0, kInf, -kInf, kNaN, -65504.0});
  check("IsInf", {x});
  check("IsInf", {x}, {{"detect_negative", int64_t{0}}});
  check("IsInf", {x}, {{"detect_positive", int64_t{0}}});
  auto none = run_decomposed("IsInf", {x}, 1,
                             {{"detect_positive", int64_t{0}}, {"detect_negative", int64_t{0}}});
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(none[0].get_i(i), 0);
}

TEST(DecomposeElementwise, LogicalAndBitwise) {
  const Tensor p = ints(DType::boolean, {4}, {0, 0, 1, 1}),
               q = ints(DType::boolean, {4}, {0, 1, 0, 1});
  for (const char* op : {"And", "Or", "Xor"}) check(op, {p, q});
  check("Not", {p});
  const Tensor a = ints(DType::i16, {3}, {-1, 0x1234, -32768}), b = ints(DType::i16, {1}, {0x0ff0});
  for (const char* op : {"BitwiseAnd", "BitwiseOr", "BitwiseXor"}) check(op, {a, b});
  check("BitwiseNot", {a});
  check("BitwiseNot", {ints(DType::u8, {2}, {0, 0x5a})});
}

TEST(DecomposeElementwise, BitShiftAtAndBeyondTheWidth) {
  const Tensor x = ints(DType::u8, {6}, {0xff, 0x81, 1, 200, 0xff, 3});
  const Tensor n = ints(DType::u8, {6}, {0, 1, 7, 8, 9, 200});
  for (const char* dir : {"LEFT", "RIGHT"})
    check("BitShift", {x, n}, {{"direction", std::string(dir)}});
  const Tensor y = ints(DType::u64, {3}, {-1, 12345, 1});
  const Tensor m = ints(DType::u64, {3}, {63, 3, 64});
  for (const char* dir : {"LEFT", "RIGHT"})
    check("BitShift", {y, m}, {{"direction", std::string(dir)}});
}

TEST(DecomposeElementwise, ModTakesTheDivisorsSign) {
  const Tensor a = ints(DType::i32, {8}, {-7, 7, -7, 7, 6, -6, 0, -2147483647 - 1});
  const Tensor b = ints(DType::i32, {8}, {3, -3, -3, 3, 3, 3, 5, -1});
  check("Mod", {a, b});
  check("Mod", {a, b}, {{"fmod", int64_t{1}}});
  auto floor_mod = run_decomposed("Mod", {a, b});
  EXPECT_EQ(floor_mod[0].to_i64(), (std::vector<int64_t>{2, -2, -1, 1, 0, 0, 0, 0}));
  check("Mod", {f32({4}, {-7.5, 7.5, 5.0, -0.0}), f32({1}, {2.0})}, {{"fmod", int64_t{1}}});
  check("Mod", {ints(DType::u16, {2}, {65535, 7}), ints(DType::u16, {2}, {10, 7})});
}

TEST(DecomposeElementwise, PowWithMixedDtypes) {
  // Integer base, float exponent: the real power truncated (not the exponent truncated).
  check("Pow", {ints(DType::i32, {3}, {2, 3, -3}), f32({3}, {1.5, 0.5, 2.0})});
  // Negative integer exponents: 1 / base^|e| truncated, non-zero only for base ±1.
  check("Pow", {ints(DType::i64, {6}, {1, -1, -1, 2, 3, -2}),
                ints(DType::i64, {6}, {-2, -3, -2, -1, 2, 3})});
  check("Pow", {ints(DType::i32, {3}, {2, 3, 4}), ints(DType::i64, {1}, {3})});
  check("Pow", {f16({3}, {2.0, 0.5, 9.0}), f32({3}, {0.1, 3.0, 0.5})});
  check("Pow", {f32({3}, {2.0, -2.0, 0.0}), ints(DType::i32, {3}, {10, 3, 0})});
}

TEST(DecomposeElementwise, VariadicWithBroadcasting) {
  const Tensor a = f32({2, 1}, {1.0, kNaN}), b = f32({3}, {0.5, 2.0, -1.0}), c = f32({1}, {1.5});
  for (const char* op : {"Max", "Min", "Sum", "Mean"}) check(op, {a, b, c});
  for (const char* op : {"Max", "Min", "Sum", "Mean"}) check(op, {b});
  check("Max", {ints(DType::u32, {2}, {4000000000LL, 1}), ints(DType::u32, {1}, {2})});
  // f16 sums accumulate wider than f16 and round once.
  check("Mean", {f16({2}, {2048.0, 1.0}), f16({2}, {1.0, 1.0}), f16({2}, {1.0, 0.5})}, {}, 1e-3);
}

TEST(DecomposeElementwise, ComparisonsWhereAndClip) {
  const Tensor a = f32({4}, {1.0, kNaN, -2.0, 3.0}), b = f32({1}, {1.0});
  for (const char* op : {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"})
    check(op, {a, b});
  check("Equal", {ints(DType::boolean, {2}, {0, 1}), ints(DType::boolean, {2}, {1, 1})});
  check("Where", {ints(DType::boolean, {2, 1}, {1, 0}), a, f32({}, {9.0})});
  const Tensor x = f32({5}, {-5.0, 0.0, 2.0, 9.0, kNaN});
  check("Clip", {x, f32({1}, {-1.0}), f32({}, {4.0})});
  check("Clip", {x, Tensor(), f32({}, {4.0})});
  check("Clip", {x, f32({}, {3.0}), f32({}, {1.0})});  // min > max: max everywhere
  check("Clip", {ints(DType::i8, {3}, {-100, 0, 100}), ints(DType::i8, {}, {-5}), Tensor()});
}

TEST(DecomposeElementwise, CastsAndBitCast) {
  const Tensor x = f32({5}, {1.7, -2.5, 1000.0, kInf, kNaN});
  check("Cast", {x}, {{"to", int64_t{7}}});  // int64, truncating
  for (int64_t sat : {0, 1})
    check("Cast", {x}, {{"to", int64_t{17}}, {"saturate", sat}});  // float8e4m3fn
  check("CastLike", {x, f16({1}, {0.0})});
  check("CastLike", {x, ints(DType::boolean, {1}, {0})});
  check("BitCast", {f32({2}, {1.0, -0.5})}, {{"to", int64_t{6}}});  // int32
}

TEST(DecomposeElementwise, DropoutAtInferenceIsTheIdentity) {
  const Tensor x = f32({3}, {1.0, -2.0, 3.0});
  check("Dropout", {x}, {}, 0, 2);
  check("Dropout", {x, f32({}, {0.5}), ints(DType::boolean, {}, {0})}, {}, 0, 2,
        {false, true, true});
  check("Dropout", {x, f32({}, {0.0}), ints(DType::boolean, {}, {1})}, {}, 0, 2,
        {false, true, true});
  // Training with a ratio > 0 draws a random mask: no core form, and the error says so.
  try {
    run_decomposed("Dropout", {x, f32({}, {0.5}), ints(DType::boolean, {}, {1})}, 1, {},
                   {false, true, true});
    FAIL() << "training Dropout decomposed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("training"), std::string::npos) << e.what();
  }
}

TEST(DecomposeActivation, MatchTheKernelsOnSpecialValues) {
  const Tensor x = f32({static_cast<int64_t>(kSpecial.size()) + 2}, [] {
    auto v = kSpecial;
    v.push_back(100.0);
    v.push_back(-100.0);
    return v;
  }());
  const Tensor y =
      f32({static_cast<int64_t>(kSpecial.size()) - 1},
          std::vector<double>(kSpecial.begin(), kSpecial.end() - 1));  // without the NaN
  for (const char* op : {"Celu", "HardSigmoid"}) check(op, {y}, {}, 1e-5);
  for (const char* op : {"Sigmoid", "Softplus", "Softsign", "HardSwish", "Mish", "LeakyRelu", "Elu",
                         "Selu", "ThresholdedRelu", "Swish", "Gelu"})
    check(op, {x}, {}, 1e-5);
  // NaN: the core forms propagate it where the kernels' std::max/std::min drop it (Celu gives 0,
  // HardSigmoid 1), as numpy (the ONNX reference) would.
  auto nan = run_decomposed("Celu", {f32({1}, {kNaN})});
  EXPECT_TRUE(std::isnan(nan[0].get_f(0)));
  check("Gelu", {x}, {{"approximate", std::string("tanh")}}, 1e-5);
  check("Celu", {y}, {{"alpha", 2.0}}, 1e-5);
  check("LeakyRelu", {x}, {{"alpha", 0.1}}, 1e-5);
  check("HardSigmoid", {y}, {{"alpha", 0.5}, {"beta", 0.25}}, 1e-5);
  check("ThresholdedRelu", {x}, {{"alpha", 0.5}}, 1e-5);
  check("Shrink", {x}, {{"bias", 1.5}, {"lambd", 1.0}}, 1e-6);
}

TEST(DecomposeActivation, NarrowFloatsAndIntegers) {
  const Tensor h = f16({5}, {-8.0, -0.75, 0.0, 0.5, 11.0});
  for (const char* op : {"Sigmoid", "Gelu", "Mish", "Elu", "HardSwish", "Swish"})
    check(op, {h}, {}, 1e-3);
  check("SwiGLU", {h, f16({5}, {1.0, 2.0, -3.0, 0.25, 0.5})}, {{"alpha", 1.702}}, 1e-3);
  check("Shrink", {ints(DType::i32, {5}, {-5, -1, 0, 1, 5})}, {{"bias", 1.5}, {"lambd", 1.0}});
  check("PRelu", {ints(DType::i8, {2, 2}, {-3, 4, -100, 0}), ints(DType::i8, {2}, {2, 3})});
  check("PRelu", {f32({2, 3}, {-1.0, 2.0, -3.0, kNaN, -0.5, 0.0}), f32({3}, {0.1, 0.2, 0.3})});
  check("PRelu", {ints(DType::u8, {2}, {200, 1}), ints(DType::u8, {1}, {3})});
}
