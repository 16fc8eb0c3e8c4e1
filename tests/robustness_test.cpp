// Robustness: tiny bad graphs found by mutation fuzzing of the ONNX node tests. Each must give a
// clear tessel::Error (at inference or at run time), never a crash, abort or huge allocation.
#include <gtest/gtest.h>

#include <cstdint>

#include "op_test_util.h"

using namespace tessel;
using namespace tessel::testenv;

namespace {

// ArgMax/ArgMin of a scalar indexed shape[0] of an empty shape.
TEST(Robustness, ArgMaxOfScalarIsAnError) {
  EXPECT_THROW(run_op("ArgMax", {f32({}, {1.0})}), Error);
  EXPECT_THROW(run_op("ArgMin", {f32({}, {1.0})}), Error);
}

}  // namespace

namespace {

// A huge kernel_shape under SAME padding looped over 2^41 taps (a hang); huge extents also
// overflowed the window arithmetic.
TEST(Robustness, PoolWithHugeKernelIsAnError) {
  Tensor x = Tensor::from_f64(DType::f32, {1, 1, 4, 4}, std::vector<double>(16, 1.0));
  EXPECT_THROW(run_op("MaxPool", {x}, 1,
                      {{"kernel_shape", std::vector<int64_t>{int64_t{1} << 40, 2}},
                       {"auto_pad", std::string("SAME_LOWER")}}),
               Error);
  EXPECT_THROW(run_op("AveragePool", {x}, 1,
                      {{"kernel_shape", std::vector<int64_t>{2, 2}},
                       {"strides", std::vector<int64_t>{INT64_MAX, 1}},
                       {"auto_pad", std::string("SAME_UPPER")}}),
               Error);
  EXPECT_THROW(run_op("MaxPool", {x}, 1,
                      {{"kernel_shape", std::vector<int64_t>{2, 2}},
                       {"dilations", std::vector<int64_t>{int64_t{1} << 62, 1}}}),
               Error);
}

}  // namespace

namespace {

// Slice of a scalar indexed its per-axis table (size 0) at axis 0 (found by the onnx fuzzer;
// tests/fuzz/onnx/regress-slice-of-scalar.onnx replays the model it found).
TEST(Robustness, SliceOfScalarIsAnError) {
  EXPECT_THROW(run_op("Slice", {f32({}, {1.0}), i64({1}, {0}), i64({1}, {1}), i64({1}, {0})}), Error);
}

// Split of a scalar indexed shape[0] of an empty shape.
TEST(Robustness, SplitOfScalarIsAnError) {
  EXPECT_THROW(run_op("Split", {f32({}, {1.0}), i64({2}, {0, 0})}, 2), Error);
}

}  // namespace

namespace {

// CumSum of a scalar read shape[0] of an empty shape in split_at.
TEST(Robustness, CumSumOfScalarIsAnError) {
  EXPECT_THROW(run_op("CumSum", {f32({}, {1.0}), i64({}, {0})}), Error);
}

// A window op with an absurd size tried to allocate it.
TEST(Robustness, WindowOfHugeSizeIsAnError) {
  EXPECT_THROW(run_op("HannWindow", {i64({}, {int64_t{1} << 62})}), Error);
}

}  // namespace

namespace {

// Scalar inputs reached shape[axis] / shape.back() of an empty shape.
TEST(Robustness, CompressDftLpNormalizationOfScalarAreErrors) {
  Tensor cond = ints(DType::boolean, {1}, {1});
  EXPECT_THROW(run_op("Compress", {f32({}, {1.0}), cond}, 1, {{"axis", int64_t{0}}}), Error);
  EXPECT_THROW(run_op("DFT", {f32({}, {1.0})}), Error);
  EXPECT_THROW(run_op("LpNormalization", {f32({}, {1.0})}, 1, {{"axis", int64_t{0}}}), Error);
}

}  // namespace

TEST(Robustness, AbsurdTensorSizeIsAnError) {
  // 2^40 f32 elements: refused by name instead of attempted.
  EXPECT_THROW(tessel::Tensor(tessel::DType::f32, {int64_t{1} << 20, int64_t{1} << 20}), tessel::Error);
  EXPECT_THROW(tessel::Tensor(tessel::DType::u8, {int64_t{1} << 62, 4}), tessel::Error);  // the product overflows
}

// A float tensor read as integers (a shape given as floats) held 6.6e180: converting it to int64 was
// undefined behaviour (found by the onnx fuzzer; tests/fuzz/onnx/regress-float-shape-beyond-int64.onnx).
// Values beyond int64 saturate.
TEST(Robustness, FloatBeyondInt64SaturatesWhenReadAsInteger) {
  const std::vector<double> v = {6.5e30, -6.5e30, 42.5};
  Tensor t = Tensor::from_f64(DType::f32, {3}, v);
  EXPECT_EQ(t.get_i(0), INT64_MAX);
  EXPECT_EQ(t.get_i(1), INT64_MIN);
  EXPECT_EQ(t.get_i(2), 42);
}

// A reduction of a scalar with axes [0] indexed its per-axis mask (size 0) at 0 (found by the tsl
// fuzzer; tests/fuzz/tsl/regress-reduce-of-scalar-with-axes.tsl).
TEST(Robustness, ReduceOfScalarWithAxesIsAnError) {
  EXPECT_THROW(run_op("ReduceMean", {i64({}, {3}), i64({1}, {0})}), Error);
}

namespace {

// A scalar has no axes. normalize_axis once let axis 0 through for rank 0, and each op that then
// indexed a per-axis table of the scalar's (empty) shape read out of bounds (the class behind the
// fuzzers' Slice and Reduce findings). Every op with an axis attribute now refuses a scalar's axis 0.
TEST(Robustness, AxisOfAScalarIsAnErrorForEveryAxisOp) {
  const Tensor s = f32({}, {1.0});
  for (const char* op : {"Softmax", "LogSoftmax", "Hardmax", "Concat", "Flatten", "LpNormalization",
                         "ArgMax", "ArgMin"}) {
    SCOPED_TRACE(op);
    // Flatten's axis ranges over [-r, r]: for a scalar axis 0 is valid (a [1,1] result).
    if (std::string(op) == "Flatten") {
      EXPECT_NO_THROW(run_op(op, {s}, 1, {{"axis", int64_t{0}}}));
      continue;
    }
    EXPECT_THROW(run_op(op, {s}, 1, {{"axis", int64_t{0}}}), Error);
  }
  EXPECT_THROW(run_op("Gather", {s, i64({}, {0})}, 1, {{"axis", int64_t{0}}}), Error);
  EXPECT_THROW(run_op("CumSum", {s, i64({}, {0})}), Error);
  EXPECT_THROW(run_op("Split", {s}, 1, {{"axis", int64_t{0}}}), Error);
}

}  // namespace
