// Decomposition hooks of the quantization and misc (sampling, signal, detection) families: the
// decomposed node (core ops only) against the op's reference kernel, on inputs where the core
// forms are delicate: rounding ties, NaN, saturation, blocked and per-axis parameters, Hermitian
// spectra, padding modes, samples outside the image.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "op_test_util.h"
#include "tessel/ir/graph.h"
#include "tessel/passes/pass.h"

using namespace tessel;
using namespace tessel::testenv;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Case {
  std::string op;
  std::vector<Tensor> ins;  // an invalid Tensor is an omitted optional input
  std::map<std::string, Attr> attrs;
  std::vector<int> constant = {};  // inputs given as compile-time constants
  int outs = 1;
};

// The node with `c.constant` inputs as graph constants, the rest as graph inputs.
std::unique_ptr<Graph> build(const Case& c, std::vector<Tensor>& feeds) {
  auto g = std::make_unique<Graph>();
  const OpDef* def = OpRegistry::get().find(c.op);
  if (!def) fail("no op {}", c.op);
  std::vector<Value*> ins;
  for (size_t i = 0; i < c.ins.size(); ++i) {
    const Tensor& t = c.ins[i];
    const bool k =
        std::find(c.constant.begin(), c.constant.end(), static_cast<int>(i)) != c.constant.end();
    if (!t.valid()) {
      ins.push_back(nullptr);
    } else if (k) {
      ins.push_back(g->add_constant("k" + std::to_string(i), t));
    } else {
      ins.push_back(g->add_input("in" + std::to_string(i), TensorType{t.dtype(), t.shape()}));
      feeds.push_back(t);
    }
  }
  std::vector<std::string> names;
  for (int i = 0; i < c.outs; ++i) names.push_back("out" + std::to_string(i));
  Node* n = g->add_node(def, "node", ins, names, c.attrs);
  for (Value* v : n->outputs) g->outputs.push_back(v);
  infer_graph(*g);
  return g;
}

// Runs the case through its reference kernel and through decompose; expects only core ops after
// decompose, the same types, integers exactly equal and floats within atol + rtol * |want|.
void check(const Case& c, double rtol = 1e-5, double atol = 1e-6) {
  std::vector<Tensor> feeds_ref, feeds_dec;
  auto ref = build(c, feeds_ref);
  std::vector<Tensor> want = run_eager(*ref, feeds_ref);
  auto dec = build(c, feeds_dec);
  decompose(*dec);
  for (const auto& n : dec->nodes())
    ASSERT_EQ(n->op->domain, "tessel.core") << c.op << " left " << n->op->name;
  std::vector<Tensor> got = run_eager(*dec, feeds_dec);
  ASSERT_EQ(got.size(), want.size());
  for (size_t o = 0; o < want.size(); ++o) {
    ASSERT_EQ(got[o].dtype(), want[o].dtype()) << c.op;
    ASSERT_EQ(got[o].shape(), want[o].shape()) << c.op;
    for (int64_t i = 0; i < want[o].numel(); ++i) {
      if (!is_float(want[o].dtype())) {
        EXPECT_EQ(got[o].get_i(i), want[o].get_i(i)) << c.op << " output " << o << " element " << i;
        continue;
      }
      const double g = got[o].get_f(i), w = want[o].get_f(i);
      if (std::isnan(w) || std::isinf(w))
        EXPECT_TRUE(std::isnan(w) ? std::isnan(g) : g == w)
            << c.op << " element " << i << ": " << g << " vs " << w;
      else
        EXPECT_NEAR(g, w, atol + rtol * std::fabs(w))
            << c.op << " output " << o << " element " << i;
    }
  }
}

Tensor typed(DType t, Shape s, std::vector<double> v) {
  return Tensor::from_f64(t, std::move(s), v);
}
Tensor scalar_i64(int64_t v) {
  return Tensor::scalar_i(DType::i64, v);
}

// Deterministic values in [lo, hi).
std::vector<double> ramp(int64_t n, double lo, double hi, uint32_t seed = 1) {
  std::vector<double> v(n);
  uint32_t s = seed * 2654435761u + 12345u;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = lo + (hi - lo) * (s >> 8) / static_cast<double>(1u << 24);
  }
  return v;
}

const std::vector<double> kTricky = {0.0, 0.5,  1.5, 2.5,   -0.5, -1.5, 254.5, 255.5,
                                     300, -300, 1e9, -kInf, kInf, kNaN, 7.49,  -3.51};

// ---- quantization -------------------------------------------------------------------------------

TEST(DecomposeQuantize, PerTensorTiesNaNAndSaturation) {
  const int64_t n = static_cast<int64_t>(kTricky.size());
  check({"QuantizeLinear", {f32({n}, kTricky), f32({}, {1.0}), ints(DType::u8, {}, {3})}});
  check({"QuantizeLinear", {f32({n}, kTricky), f32({}, {0.5}), ints(DType::i8, {}, {-1})}});
  check({"QuantizeLinear", {f32({n}, kTricky), f32({}, {2.0})}});  // no zero point: u8
  check({"QuantizeLinear", {f32({n}, kTricky), f32({}, {1e-3}), ints(DType::i32, {}, {7})}});
  check({"QuantizeLinear", {f32({n}, kTricky), f32({1}, {0.25}), ints(DType::u4, {1}, {2})}});
  check({"QuantizeLinear",
         {f32({n}, kTricky), f32({}, {1.0})},
         {{"output_dtype", int64_t{25}}}});  // int2
}

TEST(DecomposeQuantize, PerAxisBlockedAndPrecision) {
  Tensor x = f32({2, 3, 4}, ramp(24, -40, 40));
  check({"QuantizeLinear",
         {x, f32({3}, {0.1, 0.7, 3.0}), ints(DType::i8, {3}, {-5, 0, 9})},
         {{"axis", int64_t{1}}}});
  check({"QuantizeLinear",
         {x, f32({4}, {0.1, 0.7, 3.0, 1.0}), ints(DType::u8, {4}, {0, 1, 128, 255})},
         {{"axis", int64_t{-1}}}});
  // Blocks of 3 along the last axis (4 = one full block and one partial).
  Tensor s = f32({2, 3, 2}, ramp(12, 0.05, 2.0, 3));
  Tensor z = ints(DType::i4, {2, 3, 2}, {-8, 7, 0, 1, -1, 3, 2, -2, 5, -5, 6, 0});
  check({"QuantizeLinear", {x, s, z}, {{"axis", int64_t{2}}, {"block_size", int64_t{3}}}});
  check({"DequantizeLinear",
         {ints(DType::i8, {2, 3, 4},
               {-128, 127, 0, 5, 6, 7, -3, -4, 100, 1, 2, 3, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, -1, -2}),
          s, ints(DType::i8, {2, 3, 2}, {1, 2, 3, 4, 5, 6, -1, -2, -3, -4, -5, -6})},
         {{"axis", int64_t{2}}, {"block_size", int64_t{3}}}});
  // f16 input and scale: every step rounds to f16, as the kernel does.
  check({"QuantizeLinear",
         {typed(DType::f16, {6}, {1.0, 2.5, 3.5, 1000.0, -7.0, 60000.0}),
          typed(DType::f16, {}, {0.3})},
         {{"output_dtype", int64_t{5}}}});  // int16
  check({"QuantizeLinear",
         {f32({6}, {1.0, 2.5, 3.5, 1000.0, -7.0, 0.1}), f32({}, {0.3})},
         {{"precision", int64_t{10}}, {"output_dtype", int64_t{3}}}});  // precision f16, int8 out
}

TEST(DecomposeQuantize, FloatTargetsSaturateFlag) {
  const int64_t n = static_cast<int64_t>(kTricky.size());
  for (int64_t sat : {0, 1}) {
    SCOPED_TRACE("saturate " + std::to_string(sat));
    check({"QuantizeLinear",
           {f32({n}, kTricky), f32({}, {0.01}), typed(DType::f8e4m3fn, {}, {0.0})},
           {{"saturate", sat}}});
    check({"QuantizeLinear",
           {f32({n}, kTricky), f32({}, {1e-3}), typed(DType::f8e5m2, {}, {1.5})},
           {{"saturate", sat}}});
  }
  check({"QuantizeLinear",
         {f32({n}, kTricky), f32({}, {0.5})},
         {{"output_dtype", int64_t{23}}}});  // float4e2m1
}

TEST(DecomposeQuantize, Dequantize) {
  check({"DequantizeLinear",
         {ints(DType::i32, {4}, {INT32_MIN, INT32_MAX, 0, -5}), f32({}, {0.5}),
          ints(DType::i32, {}, {7})}});
  check({"DequantizeLinear",
         {ints(DType::u8, {2, 3}, {0, 1, 128, 200, 254, 255}),
          typed(DType::f16, {3}, {0.1, 2.0, 1e-3}), ints(DType::u8, {3}, {128, 0, 255})},
         {{"axis", int64_t{1}}}});
  check({"DequantizeLinear",
         {typed(DType::f8e4m3fn, {4}, {1.0, -448, 0.125, 3.5}), f32({}, {2.0}),
          typed(DType::f8e4m3fn, {}, {-2.0})}});
  check({"DequantizeLinear",
         {ints(DType::i4, {3}, {-8, 7, 1}), f32({}, {0.75})},
         {{"output_dtype", int64_t{10}}}});
}

TEST(DecomposeQuantize, DynamicQuantizeLinear) {
  check({"DynamicQuantizeLinear", {f32({2, 5}, ramp(10, -3, 7))}, {}, {}, 3});
  check(
      {"DynamicQuantizeLinear", {f32({4}, {0.5, 1.5, 2.5, 10.0})}, {}, {}, 3});  // min clipped to 0
  check({"DynamicQuantizeLinear", {f32({3}, {-4, -1, -0.5})}, {}, {}, 3});       // max clipped to 0
  check({"DynamicQuantizeLinear", {f32({3}, {0, 0, 0})}, {}, {}, 3});            // scale 0
}

TEST(DecomposeQuantize, QLinearMatMulPerRowColumnAndBatch) {
  Tensor a = ints(DType::u8, {2, 3, 4}, {0,   255, 3,  9, 17, 100, 128, 64, 1, 2,   3,  4,
                                         200, 201, 50, 0, 99, 98,  7,   6,  5, 250, 30, 40});
  Tensor b = ints(DType::u8, {4, 2}, {1, 255, 128, 0, 7, 9, 200, 100});
  check({"QLinearMatMul",
         {a, f32({}, {0.02}), ints(DType::u8, {}, {128}), b, f32({2}, {0.01, 0.05}),
          ints(DType::u8, {2}, {120, 3}), f32({}, {0.3}), ints(DType::u8, {}, {10})}});
  // Per-row a (3 rows), f16 scales, int8 everywhere.
  Tensor ai = ints(DType::i8, {3, 4}, {-128, 127, 0, 5, 6, -7, 8, 9, 100, -100, 50, -50});
  Tensor bi = ints(DType::i8, {4, 3}, {1, -1, 2, -2, 3, -3, 127, -128, 0, 4, 4, 4});
  check({"QLinearMatMul",
         {ai, typed(DType::f16, {3}, {0.01, 0.1, 0.05}), ints(DType::i8, {3}, {0, 1, -1}), bi,
          typed(DType::f16, {}, {0.02}), ints(DType::i8, {}, {2}), typed(DType::f16, {}, {0.07}),
          ints(DType::i8, {}, {-3})}});
  // A vector operand.
  check({"QLinearMatMul",
         {ints(DType::u8, {4}, {1, 2, 250, 4}), f32({}, {0.1}), ints(DType::u8, {}, {3}), b,
          f32({}, {0.2}), ints(DType::u8, {}, {100}), f32({}, {0.5}), ints(DType::u8, {}, {0})}});
}

TEST(DecomposeQuantize, QLinearConvPadsGroupsBias) {
  std::vector<int64_t> xv(2 * 4 * 5 * 5), wv(6 * 2 * 3 * 3);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<int64_t>((i * 37 + 11) % 256);
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = static_cast<int64_t>((i * 53 + 5) % 256) - 128;
  Tensor x = ints(DType::u8, {2, 4, 5, 5}, xv);
  Tensor w = ints(DType::i8, {6, 2, 3, 3}, wv);
  auto params = [&](Tensor ws, Tensor wz, Tensor bias) {
    return std::vector<Tensor>{x,  f32({}, {0.05}), ints(DType::u8, {}, {120}), w,   ws,
                               wz, f32({}, {0.9}),  ints(DType::u8, {}, {128}), bias};
  };
  Tensor ws = f32({6}, {0.01, 0.02, 0.03, 0.015, 0.005, 0.04});
  Tensor wz = ints(DType::i8, {6}, {0, 1, -1, 2, 0, 0});
  Tensor bias = ints(DType::i32, {6}, {100, -2000, 0, 5, 77777, -1});
  check({"QLinearConv",
         params(ws, wz, bias),
         {{"group", int64_t{2}},
          {"pads", std::vector<int64_t>{1, 0, 2, 1}},
          {"strides", std::vector<int64_t>{2, 1}}}});
  check({"QLinearConv",
         params(f32({}, {0.02}), ints(DType::i8, {}, {0}), Tensor()),
         {{"group", int64_t{2}},
          {"auto_pad", std::string("SAME_UPPER")},
          {"dilations", std::vector<int64_t>{2, 1}}}});
}

// ---- signal ops ---------------------------------------------------------------------------------

TEST(DecomposeSignal, DftLengthsAxesAndOnesided) {
  Tensor re = f32({2, 6, 3, 1}, ramp(36, -1, 1));
  Tensor cx = f32({2, 6, 3, 2}, ramp(72, -1, 1, 7));
  for (const Tensor& x : {re, cx})
    for (int64_t axis : {1, 2, -3})
      for (int64_t len : {0, 4, 9}) {
        std::vector<Tensor> ins = {x, len ? scalar_i64(len) : Tensor(), scalar_i64(axis)};
        for (int64_t inv : {0, 1}) check({"DFT", ins, {{"inverse", inv}}, {1, 2}});
        check({"DFT", ins, {{"onesided", int64_t{1}}}, {1, 2}});
      }
  // irfft: the input holds the first bins of a Hermitian spectrum (even and odd lengths).
  for (int64_t len : {0, 7, 10, 3})
    check({"DFT",
           {cx, len ? scalar_i64(len) : Tensor(), scalar_i64(1)},
           {{"inverse", int64_t{1}}, {"onesided", int64_t{1}}},
           {1, 2}});
  // A run-time axis (the length is kept, so the output type is static).
  check({"DFT", {cx, Tensor(), scalar_i64(-2)}, {}});
  check({"DFT", {cx, Tensor(), scalar_i64(1)}, {{"inverse", int64_t{1}}}});
  // f16 input is transformed in f32.
  check({"DFT", {typed(DType::f16, {3, 8, 2}, ramp(48, -2, 2)), Tensor(), scalar_i64(1)}, {}, {2}},
        2e-3, 2e-3);
}

TEST(DecomposeSignal, Stft) {
  Tensor sig = f32({2, 40, 1}, ramp(80, -1, 1));
  Tensor sigc = f32({1, 33, 2}, ramp(66, -1, 1, 5));
  Tensor win = f32({8}, {0.1, 0.3, 0.7, 1.0, 1.0, 0.7, 0.3, 0.1});
  check({"STFT", {sig, scalar_i64(5), win}, {}, {1}});
  check(
      {"STFT", {sig, scalar_i64(3), Tensor(), scalar_i64(9)}, {{"onesided", int64_t{0}}}, {1, 3}});
  check({"STFT", {sigc, scalar_i64(4), win, scalar_i64(8)}, {{"onesided", int64_t{0}}}, {1, 3}});
}

TEST(DecomposeSignal, WindowsAndMel) {
  for (const char* op : {"HannWindow", "HammingWindow", "BlackmanWindow"})
    for (int64_t periodic : {0, 1})
      for (int64_t size : {1, 2, 10, 33})
        check({op, {Tensor::scalar_i(DType::i32, size)}, {{"periodic", periodic}}, {0}});
  check({"HannWindow",
         {Tensor::scalar_i(DType::i64, 16)},
         {{"output_datatype", int64_t{11}}},
         {0}});  // f64
  // num_mel_bins and dft_length fix the shape; rate and band edges may be run-time.
  Tensor nmel = Tensor::scalar_i(DType::i32, 8), dft = Tensor::scalar_i(DType::i32, 64);
  check({"MelWeightMatrix",
         {nmel, dft, Tensor::scalar_i(DType::i32, 8000), f32({}, {0}), f32({}, {4000})},
         {},
         {0, 1}});
  check({"MelWeightMatrix",
         {Tensor::scalar_i(DType::i32, 20), Tensor::scalar_i(DType::i32, 31),
          Tensor::scalar_i(DType::i32, 16000), f32({}, {100}), f32({}, {7000})},
         {},
         {0, 1, 2, 3, 4}});
}

// ---- sampling ops
// ---------------------------------------------------------------------------------

TEST(DecomposeSampling, AffineGrid) {
  Tensor th2 = f32({2, 2, 3}, ramp(12, -1.5, 1.5));
  Tensor th3 = f32({1, 3, 4}, ramp(12, -1.5, 1.5, 9));
  for (int64_t align : {0, 1}) {
    check({"AffineGrid", {th2, i64({4}, {2, 3, 4, 5})}, {{"align_corners", align}}, {1}});
    check({"AffineGrid", {th2, i64({4}, {2, 3, 1, 5})}, {{"align_corners", align}}, {1}});
    check({"AffineGrid", {th3, i64({5}, {1, 1, 3, 2, 4})}, {{"align_corners", align}}, {1}});
  }
}

TEST(DecomposeSampling, GridSampleModesPaddingsAlign) {
  Tensor x = f32({2, 3, 4, 5}, ramp(120, -2, 2));
  // Inside, on the border, slightly and far outside, NaN, and exact halves (rounding ties).
  std::vector<double> gv = ramp(2 * 3 * 4 * 2, -1.6, 1.6, 4);
  gv[0] = kNaN, gv[3] = 25.0, gv[4] = -1.0, gv[5] = 1.0, gv[6] = -7.3, gv[8] = 0.25, gv[9] = -0.75,
  gv[10] = kInf;
  Tensor grid = f32({2, 3, 4, 2}, gv);
  for (const char* mode : {"linear", "nearest", "cubic"})
    for (const char* pad : {"zeros", "border", "reflection"})
      for (int64_t align : {0, 1}) {
        SCOPED_TRACE(std::string(mode) + " " + pad + " align " + std::to_string(align));
        check({"GridSample",
               {x, grid},
               {{"mode", std::string(mode)},
                {"padding_mode", std::string(pad)},
                {"align_corners", align}}},
              1e-5, 1e-5);
      }
  // Volumetric.
  Tensor x3 = f32({1, 2, 3, 4, 2}, ramp(48, -1, 1));
  Tensor g3 = f32({1, 2, 3, 2, 3}, ramp(36, -1.4, 1.4, 2));
  for (const char* mode : {"linear", "nearest"})
    for (const char* pad : {"zeros", "border", "reflection"})
      check({"GridSample",
             {x3, g3},
             {{"mode", std::string(mode)}, {"padding_mode", std::string(pad)}}},
            1e-5, 1e-5);
}

TEST(DecomposeSampling, RoiAlign) {
  Tensor x = f32({2, 3, 6, 7}, ramp(252, -3, 3));
  // Inside, partly outside, beyond the last pixel, fully outside, degenerate.
  Tensor rois = f32({5, 4}, {0.5, 1.0, 4.2,  5.5,  -2.0, -1.5, 3.0, 2.5, 5.0, 4.0,
                             9.0, 8.0, -9.0, -9.0, -4.0, -5.0, 2.0, 2.0, 2.0, 2.0});
  Tensor bidx = i64({5}, {0, 1, 1, 0, 1});
  for (const char* mode : {"avg", "max"})
    for (const char* ct : {"half_pixel", "output_half_pixel"})
      check({"RoiAlign",
             {x, rois, bidx},
             {{"mode", std::string(mode)},
              {"coordinate_transformation_mode", std::string(ct)},
              {"output_height", int64_t{3}},
              {"output_width", int64_t{2}},
              {"sampling_ratio", int64_t{2}},
              {"spatial_scale", 0.8}}},
            1e-5, 1e-5);
}

TEST(DecomposeMisc, DataDependentOrRuntimeShapesStay) {
  EXPECT_FALSE(OpRegistry::get().find("NonMaxSuppression")->decompose);
  // A run-time window length gives an unknown output dim: the node stays (or the hook refuses
  // it as unsupported), it is never half-decomposed.
  std::vector<Tensor> feeds;
  auto g = build({"HannWindow", {Tensor::scalar_i(DType::i32, 8)}}, feeds);
  bool stayed = false;
  try {
    decompose(*g);
    stayed = g->nodes().size() == 1 && g->nodes()[0]->op->name == "HannWindow";
  } catch (const Error& e) {
    stayed = e.is_unsupported();
  }
  EXPECT_TRUE(stayed);
  // RoiAlign with an adaptive sampling ratio.
  auto r = build(
      {"RoiAlign", {f32({1, 1, 4, 4}, ramp(16, 0, 1)), f32({1, 4}, {0, 0, 2, 2}), i64({1}, {0})}},
      feeds);
  EXPECT_THROW(decompose(*r), Error);
}

}  // namespace
