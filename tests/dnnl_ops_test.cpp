// The oneDNN matmul and convolution wrappers against float64 loops; the matmul floor's counts.
#include "tessel/targets/cpu/dnnl_ops.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <vector>

#include "tessel/driver/matmul_floor.h"
#include "tessel/ir/graph.h"
#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/passes/pass.h"
#include "tessel/support/error.h"
#include "corpus_util.h"
#include "test_util.h"

namespace tessel::cpu {
namespace {

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

double activate(const Epilogue& e, double v) {
  switch (e.act) {
    case Activation::none:
      return v;
    case Activation::relu:
      return std::max(v, 0.0);
    case Activation::clip:
      return std::min(std::max(v, static_cast<double>(e.clip_lo)), static_cast<double>(e.clip_hi));
    case Activation::gelu_erf:
      return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    case Activation::gelu_tanh:
      return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    case Activation::sigmoid:
      return 1 / (1 + std::exp(-v));
    case Activation::tanh:
      return std::tanh(v);
    case Activation::leaky_relu:
      return v > 0 ? v : static_cast<double>(e.slope) * v;
    case Activation::swish:
      return v / (1 + std::exp(-v));
  }
  return v;
}

// One expected element: the float64 value and its tolerance (fp32 accumulation: relative to the sum
// of |terms|, plus a little for the activation's approximation).
struct Want {
  double v = 0, tol = 0;
};

Want finish(const Epilogue& e, double acc, double abs_sum, double bias, double old) {
  double v = e.alpha * (acc + bias) + (e.accumulate ? old : 0.0);
  double mag =
      std::abs(e.alpha) * (abs_sum + std::abs(bias)) + (e.accumulate ? std::abs(old) : 0.0);
  return {activate(e, v), 1e-4 * mag + 1e-5};
}

// C through the descriptor's strides (contiguous when its c strides are 0), as a float64 loop.
std::vector<Want> reference_matmul(const MatmulDesc& d, const float* a, const float* b,
                                   const float* bias, const std::vector<float>& c_old) {
  const int64_t cb = d.c_m || d.c_n || d.c_batch ? d.c_batch : d.M * d.N;
  const int64_t cm = d.c_m || d.c_n || d.c_batch ? d.c_m : d.N;
  const int64_t cn = d.c_m || d.c_n || d.c_batch ? d.c_n : 1;
  std::vector<Want> out(c_old.size());
  for (size_t i = 0; i < c_old.size(); ++i)
    out[i] = {c_old[i], 0};  // elements outside C stay as they were
  for (int64_t t = 0; t < d.batch; ++t)
    for (int64_t m = 0; m < d.M; ++m)
      for (int64_t n = 0; n < d.N; ++n) {
        double acc = 0, abs_sum = 0;
        for (int64_t k = 0; k < d.K; ++k) {
          const double p = static_cast<double>(a[t * d.a_batch + m * d.a_m + k * d.a_k]) *
                           static_cast<double>(b[t * d.b_batch + k * d.b_k + n * d.b_n]);
          acc += p;
          abs_sum += std::abs(p);
        }
        const size_t ci = static_cast<size_t>(t * cb + m * cm + n * cn);
        out[ci] = finish(d.epilogue, acc, abs_sum, bias ? bias[n] : 0.0, c_old[ci]);
      }
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<Want>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i)
    if (!(std::abs(got[i] - want[i].v) <= want[i].tol)) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", want " << want[i].v
                    << " ± " << want[i].tol;
      ++bad;
    }
}

// Elements an operand spans through its strides (the buffer the test allocates for it).
size_t span(int64_t batch, int64_t s_batch, int64_t r, int64_t s_r, int64_t c, int64_t s_c) {
  return static_cast<size_t>((batch - 1) * s_batch + (r - 1) * s_r + (c - 1) * s_c + 1);
}

// Runs `d` (with buffers sized from its strides) through Matmul and the float64 loop.
void check_matmul(MatmulDesc d, const std::string& what, bool constant_b = false, bool bias = false,
                  size_t c_size = 0) {
  std::vector<float> a = random_floats(span(d.batch, d.a_batch, d.M, d.a_m, d.K, d.a_k), 1);
  std::vector<float> b = random_floats(span(d.batch, d.b_batch, d.K, d.b_k, d.N, d.b_n), 2);
  std::vector<float> bv = random_floats(static_cast<size_t>(d.N), 3);
  if (c_size == 0) c_size = static_cast<size_t>(d.batch * d.M * d.N);
  std::vector<float> c = random_floats(c_size, 4);
  const std::vector<Want> want =
      reference_matmul(d, a.data(), b.data(), bias ? bv.data() : nullptr, c);
  if (constant_b) d.constant_b = b.data();
  if (bias) d.bias = bv.data();
  Matmul mm(d);
  EXPECT_EQ(mm.packed_b(), constant_b);
  if (constant_b)
    std::fill(b.begin(), b.end(), 0.0f);  // packed at construction: the buffer is not read again
  mm.run(a.data(), constant_b ? nullptr : b.data(), c.data());
  expect_close(c, want, what + " " + matmul_str(d) + " (" + mm.impl() + ")");
}

TEST(DnnlOps, Available) {
  EXPECT_TRUE(dnnl_available());
  EXPECT_NE(dnnl_version().find("oneDNN 2."), std::string::npos) << dnnl_version();
}

TEST(DnnlMatmul, Plain2D) {
  check_matmul(contiguous_matmul(1, 37, 53, 61), "plain");
  check_matmul(contiguous_matmul(1, 128, 256, 64), "plain");
  EXPECT_TRUE(Matmul::supported(contiguous_matmul(1, 37, 53, 61)));
}

TEST(DnnlMatmul, VectorEdges) {
  check_matmul(contiguous_matmul(1, 1, 40, 17), "M=1");
  check_matmul(contiguous_matmul(1, 9, 1, 17), "N=1");
  check_matmul(contiguous_matmul(1, 9, 40, 1), "K=1");
  check_matmul(contiguous_matmul(3, 1, 8, 5), "batched M=1");
}

TEST(DnnlMatmul, BatchedContiguous) {
  check_matmul(contiguous_matmul(5, 19, 23, 29), "batched");
}

// Attention: Q and K are column blocks of one [T, 3·H·D] qkv buffer; head h of Q is A[h] with row
// stride 3·H·D, and K^T is B[h] read through strides (k along a row, n down the rows).
TEST(DnnlMatmul, AttentionStrides) {
  const int64_t H = 4, T = 33, D = 16, row = 3 * H * D;
  MatmulDesc qk;
  qk.batch = H, qk.M = T, qk.N = T, qk.K = D;
  qk.a_batch = D, qk.a_m = row, qk.a_k = 1;
  qk.b_batch = D, qk.b_k = 1, qk.b_n = row;
  EXPECT_TRUE(Matmul::supported(qk));
  check_matmul(qk, "Q·K^T");
  qk.epilogue.alpha = 0.25f;  // the 1/sqrt(D) scale
  check_matmul(qk, "Q·K^T scaled");
  // P·V with P contiguous [H, T, T] and V a column block [T, D] of each head.
  MatmulDesc pv;
  pv.batch = H, pv.M = T, pv.N = D, pv.K = T;
  pv.a_batch = T * T, pv.a_m = T, pv.a_k = 1;
  pv.b_batch = D, pv.b_k = row, pv.b_n = 1;
  // ... written straight into [T, H·D] (the transpose back folded into C's strides).
  pv.c_batch = D, pv.c_m = H * D, pv.c_n = 1;
  check_matmul(pv, "P·V into [T, H·D]");
}

TEST(DnnlMatmul, SharedAndTransposedOperands) {
  MatmulDesc d = contiguous_matmul(3, 21, 34, 27, /*b_shared=*/true);
  check_matmul(d, "batch-shared B");
  check_matmul(d, "batch-shared constant B", true);
  MatmulDesc t = contiguous_matmul(3, 21, 34, 27);
  t.b_k = 1, t.b_n = 27;  // B[b] stored as [N, K]
  check_matmul(t, "transposed B");
  check_matmul(t, "transposed constant B", true);
  MatmulDesc at = contiguous_matmul(2, 21, 34, 27);
  at.a_m = 1, at.a_k = 21;  // A[b] stored as [K, M]
  check_matmul(at, "transposed A");
  MatmulDesc sa = contiguous_matmul(3, 21, 34, 27);
  sa.a_batch = 0;  // A shared across the batch
  check_matmul(sa, "batch-shared A");
}

TEST(DnnlMatmul, ConstantBiasEpilogues) {
  MatmulDesc d = contiguous_matmul(1, 50, 96, 80);
  check_matmul(d, "constant B + bias", true, true);
  d.epilogue.act = Activation::gelu_erf;
  check_matmul(d, "bias + gelu_erf", true, true);
  d.epilogue.act = Activation::gelu_tanh;
  check_matmul(d, "bias + gelu_tanh", false, true);
  d.epilogue.act = Activation::relu;
  d.epilogue.alpha = 0.5f;
  check_matmul(d, "alpha + bias + relu", true, true);
  d.epilogue = {};
  d.epilogue.accumulate = true;
  check_matmul(d, "bias + residual accumulate", true, true);
  d.epilogue.act = Activation::clip;
  d.epilogue.clip_lo = -0.5f, d.epilogue.clip_hi = 0.5f;
  check_matmul(d, "accumulate + clip", false, true);
  for (Activation act : {Activation::sigmoid, Activation::tanh, Activation::swish}) {
    d.epilogue = {};
    d.epilogue.act = act;
    check_matmul(d, "activation", false, true);
  }
  MatmulDesc b = contiguous_matmul(4, 17, 24, 32, true);
  b.epilogue.act = Activation::relu;
  check_matmul(b, "batched shared constant B + bias + relu", true, true);
}

TEST(DnnlMatmul, StridedOutput) {
  MatmulDesc d = contiguous_matmul(2, 12, 10, 8);
  // C inside a wider buffer; the rest must stay untouched.
  d.c_batch = 12 * 25, d.c_m = 25, d.c_n = 1;
  check_matmul(d, "strided C", false, false, static_cast<size_t>(2 * 12 * 25));
}

TEST(DnnlMatmul, OddStridesRunOnTheReferenceKernel) {
  MatmulDesc d = contiguous_matmul(1, 9, 11, 13);
  d.a_m = 26, d.a_k = 2;  // no unit stride in A
  EXPECT_FALSE(Matmul::supported(d));
  check_matmul(d, "A with stride 2");
}

TEST(DnnlMatmul, FollowsThreadCountChanges) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  MatmulDesc d = contiguous_matmul(1, 64, 96, 128);
  std::vector<float> a = random_floats(64 * 128, 7), b = random_floats(128 * 96, 8), c(64 * 96);
  std::vector<float> bias = random_floats(96, 9);
  const std::vector<Want> want = reference_matmul(d, a.data(), b.data(), bias.data(), c);
  d.constant_b = b.data();
  d.bias = bias.data();  // the bias must survive the rebuild
  Matmul mm(d);
  omp_set_num_threads(2);
  mm.run(a.data(), nullptr, c.data());
  omp_set_num_threads(saved);
  expect_close(c, want, "rebuilt for 2 threads");
}

TEST(DnnlMatmul, Errors) {
  auto message = [](const MatmulDesc& d) {
    try {
      Matmul mm(d);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  MatmulDesc zero = contiguous_matmul(1, 0, 4, 4);
  EXPECT_NE(message(zero).find("matmul [0x4]·[4x4]: dims must be positive"), std::string::npos)
      << message(zero);
  EXPECT_FALSE(Matmul::supported(zero));
  MatmulDesc neg = contiguous_matmul(12, 128, 128, 64);
  neg.a_m = -64;
  EXPECT_NE(message(neg).find("matmul [12x128x64]·[12x64x128]: negative strides"),
            std::string::npos)
      << message(neg);
  // A zero stride inside C's matrix (results overlapping) stays unsupported; inside A or B it is a
  // broadcast operand, copied dense (BroadcastOperandIsCopiedDense).
  MatmulDesc bcast = contiguous_matmul(1, 4, 4, 4);
  bcast.c_batch = 16, bcast.c_m = 0, bcast.c_n = 1;
  EXPECT_NE(message(bcast).find("zero stride"), std::string::npos) << message(bcast);
  try {
    Matmul mm(bcast);
  } catch (const Error& e) {
    EXPECT_TRUE(e.is_unsupported());
  }
  Matmul ok(contiguous_matmul(1, 4, 4, 4));
  std::vector<float> buf(16);
  EXPECT_THROW(ok.run(buf.data(), nullptr, buf.data()), Error);
  MatmulDesc overlap = contiguous_matmul(2, 4, 4, 4);
  overlap.c_batch = 0, overlap.c_m = 4, overlap.c_n = 1;
  EXPECT_NE(message(overlap).find("batch results overlap"), std::string::npos) << message(overlap);
}

// ---- convolution ----

std::vector<Want> reference_conv(const ConvDesc& d, const float* x, const float* w,
                                 const float* bias, const std::vector<float>& y_old) {
  const int64_t cg = d.C / d.groups, og = d.OC / d.groups;
  std::vector<Want> out(y_old.size());
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t o = 0; o < d.OC; ++o)
      for (int64_t oh = 0; oh < d.OH; ++oh)
        for (int64_t ow = 0; ow < d.OW; ++ow) {
          double acc = 0, abs_sum = 0;
          const int64_t g = o / og;
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t kh = 0; kh < d.KH; ++kh)
              for (int64_t kw = 0; kw < d.KW; ++kw) {
                const int64_t ih = oh * d.stride_h - d.pad_top + kh * d.dil_h;
                const int64_t iw = ow * d.stride_w - d.pad_left + kw * d.dil_w;
                if (ih < 0 || ih >= d.H || iw < 0 || iw >= d.W) continue;
                const double p =
                    static_cast<double>(x[((n * d.C + g * cg + c) * d.H + ih) * d.W + iw]) *
                    static_cast<double>(w[((o * cg + c) * d.KH + kh) * d.KW + kw]);
                acc += p;
                abs_sum += std::abs(p);
              }
          const size_t yi = static_cast<size_t>(((n * d.OC + o) * d.OH + oh) * d.OW + ow);
          out[yi] = finish(d.epilogue, acc, abs_sum, bias ? bias[o] : 0.0, y_old[yi]);
        }
  return out;
}

ConvDesc conv(int64_t N, int64_t C, int64_t H, int64_t W, int64_t OC, int64_t k, int64_t stride,
              int64_t pad, int64_t groups = 1) {
  ConvDesc d;
  d.N = N, d.C = C, d.H = H, d.W = W, d.OC = OC, d.KH = d.KW = k;
  d.stride_h = d.stride_w = stride;
  d.pad_top = d.pad_left = d.pad_bottom = d.pad_right = pad;
  d.groups = groups;
  d.OH = (H + 2 * pad - k) / stride + 1;
  d.OW = (W + 2 * pad - k) / stride + 1;
  return d;
}

void check_conv(ConvDesc d, const std::string& what, bool bias) {
  for (ConvLayout layout : {ConvLayout::nchw, ConvLayout::blocked, ConvLayout::automatic}) {
    d.layout = layout;
    std::vector<float> x = random_floats(static_cast<size_t>(d.N * d.C * d.H * d.W), 11);
    std::vector<float> w =
        random_floats(static_cast<size_t>(d.OC * (d.C / d.groups) * d.KH * d.KW), 12);
    std::vector<float> bv = random_floats(static_cast<size_t>(d.OC), 13);
    std::vector<float> y = random_floats(static_cast<size_t>(d.N * d.OC * d.OH * d.OW), 14);
    const std::vector<Want> want =
        reference_conv(d, x.data(), w.data(), bias ? bv.data() : nullptr, y);
    d.weights = w.data();
    d.bias = bias ? bv.data() : nullptr;
    Conv2d cv(d);
    std::fill(w.begin(), w.end(), 0.0f);  // packed at construction
    cv.run(x.data(), y.data());
    const char* lname = layout == ConvLayout::nchw      ? "nchw"
                        : layout == ConvLayout::blocked ? "blocked"
                                                        : "auto";
    expect_close(y, want, what + " " + conv_str(d) + " " + lname + " (" + cv.impl() + ")");
  }
  // Channels-last activations (the compiled backend's layout between convolutions), in and out.
  auto to_nhwc = [](const std::vector<float>& a, int64_t n, int64_t c, int64_t h, int64_t w) {
    std::vector<float> b(a.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < c; ++j)
        for (int64_t k = 0; k < h * w; ++k) b[static_cast<size_t>((i * h * w + k) * c + j)] = a[static_cast<size_t>((i * c + j) * h * w + k)];
    return b;
  };
  auto from_nhwc = [](const std::vector<float>& b, int64_t n, int64_t c, int64_t h, int64_t w) {
    std::vector<float> a(b.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < c; ++j)
        for (int64_t k = 0; k < h * w; ++k) a[static_cast<size_t>((i * c + j) * h * w + k)] = b[static_cast<size_t>((i * h * w + k) * c + j)];
    return a;
  };
  for (auto [sn, dn] : {std::pair{false, true}, std::pair{true, true}, std::pair{true, false}}) {
    d.layout = ConvLayout::automatic;
    d.src_nhwc = sn, d.dst_nhwc = dn;
    std::vector<float> x = random_floats(static_cast<size_t>(d.N * d.C * d.H * d.W), 21);
    std::vector<float> w = random_floats(static_cast<size_t>(d.OC * (d.C / d.groups) * d.KH * d.KW), 22);
    std::vector<float> bv = random_floats(static_cast<size_t>(d.OC), 23);
    std::vector<float> y = random_floats(static_cast<size_t>(d.N * d.OC * d.OH * d.OW), 24);
    const std::vector<Want> want = reference_conv(d, x.data(), w.data(), bias ? bv.data() : nullptr, y);
    d.weights = w.data();
    d.bias = bias ? bv.data() : nullptr;
    Conv2d cv(d);
    std::vector<float> xin = sn ? to_nhwc(x, d.N, d.C, d.H, d.W) : x;
    std::vector<float> yout = dn ? to_nhwc(y, d.N, d.OC, d.OH, d.OW) : y;
    cv.run(xin.data(), yout.data());
    if (dn) yout = from_nhwc(yout, d.N, d.OC, d.OH, d.OW);
    expect_close(yout, want, what + " " + conv_str(d) + (sn ? " nhwc" : " nchw") + " -> " + (dn ? "nhwc" : "nchw") + " (" + cv.impl() + ")");
  }
}

TEST(DnnlConv, Regular) {
  check_conv(conv(2, 8, 13, 13, 16, 3, 1, 1), "3x3 s1", true);
  check_conv(conv(1, 8, 13, 13, 16, 3, 1, 1), "3x3 s1 no bias", false);
  check_conv(conv(2, 16, 14, 15, 32, 3, 2, 1), "3x3 s2", true);
  check_conv(conv(1, 3, 32, 32, 32, 3, 2, 1), "first layer", true);
  ConvDesc asym = conv(1, 8, 14, 14, 8, 3, 2, 0);
  asym.pad_bottom = asym.pad_right = 1;  // TF "same" padding of a stride 2 layer
  asym.OH = asym.OW = 7;
  check_conv(asym, "asymmetric pads", true);
  // 3x3, stride 1, >= 64 channels on >= 14x14: oneDNN's Winograd kernel where it has one (AVX-512; the
  // impl in the message says which ran), the direct kernel elsewhere, the same bound against float64.
  check_conv(conv(1, 64, 16, 14, 64, 3, 1, 1), "3x3 s1 64 channels", true);
  check_conv(conv(1, 64, 28, 28, 96, 3, 1, 1), "3x3 s1 64 -> 96 channels at 28x28", false);
}

TEST(DnnlConv, PointwiseDepthwiseGrouped) {
  check_conv(conv(2, 32, 9, 9, 24, 1, 1, 0), "1x1", true);
  check_conv(conv(1, 32, 9, 9, 24, 1, 1, 0), "1x1 no bias", false);
  check_conv(conv(2, 32, 15, 15, 32, 3, 1, 1, 32), "depthwise s1", true);
  check_conv(conv(1, 24, 16, 16, 24, 3, 2, 1, 24), "depthwise s2", false);
  check_conv(conv(1, 8, 11, 11, 12, 3, 1, 1, 2), "grouped g2", true);
  ConvDesc dil = conv(1, 8, 17, 17, 8, 3, 1, 2);
  dil.dil_h = dil.dil_w = 2;
  dil.OH = dil.OW = 17;  // 17 + 2·2 - (2·(3-1) + 1) + 1
  check_conv(dil, "dilated", true);
}

// An NCHW input into a channels-last result (DeepLabV3's ASPP projection reads a concatenation): without
// AVX-512 oneDNN 2.6 offered only its reference kernel for those layouts (278 ms a call); the convolution
// now lets oneDNN choose both activation layouts there and reorders, on every ISA the same values.
TEST(DnnlConv, MixedLayoutsAvoidTheReferenceKernel) {
  ConvDesc d = conv(1, 64, 14, 14, 32, 1, 1, 0);
  d.layout = ConvLayout::automatic;
  d.src_nhwc = false, d.dst_nhwc = true;
  std::vector<float> x = random_floats(static_cast<size_t>(d.C * d.H * d.W), 31);
  std::vector<float> w = random_floats(static_cast<size_t>(d.OC * d.C), 32);
  std::vector<float> y(static_cast<size_t>(d.OC * d.OH * d.OW), 0.0f);
  const std::vector<Want> want = reference_conv(d, x.data(), w.data(), nullptr, y);
  d.weights = w.data();
  Conv2d cv(d);
  EXPECT_NE(cv.impl().rfind("ref", 0), 0u) << cv.impl();
  std::vector<float> out(y.size());
  cv.run(x.data(), out.data());
  std::vector<float> nchw(out.size());
  for (int64_t c = 0; c < d.OC; ++c)
    for (int64_t p = 0; p < d.OH * d.OW; ++p) nchw[static_cast<size_t>(c * d.OH * d.OW + p)] = out[static_cast<size_t>(p * d.OC + c)];
  expect_close(nchw, want, "nchw -> nhwc 1x1 (" + cv.impl() + ")");
}

TEST(DnnlConv, Epilogues) {
  ConvDesc d = conv(1, 16, 10, 10, 32, 1, 1, 0);
  d.epilogue.act = Activation::clip;  // relu6
  check_conv(d, "bias + relu6", true);
  d.epilogue = {};
  d.epilogue.accumulate = true;
  d.epilogue.act = Activation::relu;
  check_conv(d, "residual + relu", true);
  ConvDesc dw = conv(1, 32, 8, 8, 32, 3, 1, 1, 32);
  dw.epilogue.act = Activation::clip;
  check_conv(dw, "depthwise + relu6", true);
  d.epilogue = {};
  d.epilogue.act = Activation::swish;
  check_conv(d, "bias + swish", true);
  dw.epilogue.act = Activation::swish;
  check_conv(dw, "depthwise + swish", true);
  dw.epilogue.act = Activation::sigmoid;
  check_conv(dw, "depthwise + sigmoid", false);
}

TEST(DnnlConv, Errors) {
  std::vector<float> w(16 * 8 * 9);
  auto message = [&](ConvDesc d) {
    d.weights = w.data();
    try {
      Conv2d c(d);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  ConvDesc bad_out = conv(1, 8, 13, 13, 16, 3, 1, 1);
  bad_out.OH = 12;
  EXPECT_NE(message(bad_out).find("conv2d [1x8x13x13]*[16x8x3x3] s1 p1,1,1,1: the output is 12x13 "
                                  "but the shapes give 13x13"),
            std::string::npos)
      << message(bad_out);
  EXPECT_NE(message(conv(1, 8, 13, 13, 16, 3, 1, 1, 3)).find("groups = 3 must divide"),
            std::string::npos);
  EXPECT_NE(message(conv(1, 0, 13, 13, 16, 3, 1, 1)).find("dims must be positive"),
            std::string::npos);
  ConvDesc no_w = conv(1, 8, 13, 13, 16, 3, 1, 1);
  EXPECT_THROW(Conv2d{no_w}, Error);
}

// ---- matmul floor ----

// Packed weights handed to a second primitive (what the executable cache does across processes):
// used without a reorder when the layout matches, repacked from the plain weights when it does not,
// and a clear error when it does not and there are no plain weights.
TEST(DnnlMatmul, PrepackedWeights) {
  MatmulDesc d = contiguous_matmul(1, 64, 96, 80, true);
  std::vector<float> a = random_floats(static_cast<size_t>(d.M * d.K), 1);
  std::vector<float> b = random_floats(static_cast<size_t>(d.K * d.N), 2);
  std::vector<float> c0(static_cast<size_t>(d.M * d.N), 0.0f);
  const std::vector<Want> want = reference_matmul(d, a.data(), b.data(), nullptr, c0);
  MatmulDesc first = d;
  first.constant_b = b.data();
  Matmul packer(first);
  const PackedWeights pw = packer.packed_weights();
  ASSERT_TRUE(pw.valid());
  EXPECT_FALSE(pw.layout.empty());
  const std::vector<uint8_t> bytes(static_cast<const uint8_t*>(pw.data), static_cast<const uint8_t*>(pw.data) + pw.nbytes);

  MatmulDesc reuse = d;
  reuse.prepacked_b = {bytes.data(), bytes.size(), pw.layout, nullptr};
  Matmul m2(reuse);  // no plain weights at all: only the stored bytes
  EXPECT_TRUE(m2.used_prepacked());
  std::vector<float> c = c0;
  m2.run(a.data(), nullptr, c.data());
  expect_close(c, want, "prepacked");

  MatmulDesc other = d;
  other.constant_b = b.data();
  other.prepacked_b = {bytes.data(), bytes.size(), pw.layout + " (another layout)", nullptr};
  Matmul m3(other);
  EXPECT_FALSE(m3.used_prepacked());
  c = c0;
  m3.run(a.data(), nullptr, c.data());
  expect_close(c, want, "repacked after a layout mismatch");

  other.constant_b = nullptr;
  try {
    Matmul bad(other);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stored packed weights do not fit"), std::string::npos) << e.what();
  }
}

TEST(DnnlConv, PrepackedWeights) {
  ConvDesc d = conv(1, 16, 12, 12, 32, 3, 1, 1);
  std::vector<float> x = random_floats(static_cast<size_t>(d.N * d.C * d.H * d.W), 31);
  std::vector<float> w = random_floats(static_cast<size_t>(d.OC * d.C * d.KH * d.KW), 32);
  std::vector<float> y0(static_cast<size_t>(d.N * d.OC * d.OH * d.OW), 0.0f);
  const std::vector<Want> want = reference_conv(d, x.data(), w.data(), nullptr, y0);
  ConvDesc first = d;
  first.weights = w.data();
  Conv2d packer(first);
  const PackedWeights pw = packer.packed_weights();
  ASSERT_TRUE(pw.valid());
  const std::vector<uint8_t> bytes(static_cast<const uint8_t*>(pw.data), static_cast<const uint8_t*>(pw.data) + pw.nbytes);
  ConvDesc reuse = d;
  reuse.prepacked = {bytes.data(), bytes.size(), pw.layout, nullptr};
  Conv2d c2(reuse);
  EXPECT_TRUE(c2.used_prepacked());
  std::vector<float> y = y0;
  c2.run(x.data(), y.data());
  expect_close(y, want, "prepacked conv");
}

TEST(MatmulFloor, CountsTheFloatMatmulsOfAGraph) {
  const OpRegistry& reg = OpRegistry::get();
  Graph g;
  Value* x = g.add_input("x", TensorType{DType::f32, {1, 6, 8}});
  Value* w = g.add_constant("w", Tensor(DType::f32, {8, 5}));
  Node* wr = g.add_node(reg.find("reshape"), "wr", {w}, {"w3"},
                        {{"shape", std::vector<int64_t>{1, 8, 5}}});
  const std::vector<int64_t> b0{0}, c1{1}, c2{2}, b01{0, 1}, c3{3};
  Node* mm = g.add_node(
      reg.find("dot_general"), "proj", {x, wr->outputs[0]}, {"y"},
      {{"lhs_batch", b0}, {"lhs_contract", c2}, {"rhs_batch", b0}, {"rhs_contract", c1}});
  Value* q = g.add_input("q", TensorType{DType::f32, {2, 3, 4, 7}});
  Value* k = g.add_input("k", TensorType{DType::f32, {2, 3, 9, 7}});
  Node* qk = g.add_node(
      reg.find("dot_general"), "qk", {q, k}, {"s"},
      {{"lhs_batch", b01}, {"lhs_contract", c3}, {"rhs_batch", b01}, {"rhs_contract", c3}});
  Value* i = g.add_input("i", TensorType{DType::i64, {3, 4}});
  Node* imm = g.add_node(reg.find("dot_general"), "int", {i, i}, {"ii"},
                         {{"lhs_batch", std::vector<int64_t>{}},
                          {"lhs_contract", c1},
                          {"rhs_batch", std::vector<int64_t>{}},
                          {"rhs_contract", c1}});
  g.outputs = {mm->outputs[0], qk->outputs[0], imm->outputs[0]};
  infer_graph(g);

  const FloorResult r = measure_matmul_floor(g, 1, 3);
  EXPECT_EQ(r.matmuls, 2);  // the i64 one is not a float matmul
  EXPECT_DOUBLE_EQ(r.flops, 2.0 * 6 * 5 * 8 + 2.0 * 6 * 4 * 9 * 7);
  ASSERT_EQ(r.shapes.size(), 2u);
  EXPECT_NE(r.shapes[0].find("[6x8]·[8x5] packed"), std::string::npos) << r.shapes[0];
  EXPECT_NE(r.shapes[1].find("[6x4x7]·[6x7x9]  qk"), std::string::npos) << r.shapes[1];
  EXPECT_GT(r.median_ms, 0);
  EXPECT_LE(r.p10_ms, r.median_ms);
  EXPECT_LE(r.median_ms, r.p90_ms);
  EXPECT_THROW(measure_matmul_floor(g, 0, 3), Error);
  EXPECT_THROW(measure_matmul_floor(g, 1, 0), Error);
}

// A convnet's floor counts its convolutions (issue 37): torchvision's mobilenet_v2 (the shared corpus)
// has 52 Convs and one Gemm; the floor runs each convolution the compiled backend runs as a library
// kernel, and its FLOPs are 2·N·OC·OH·OW·(C/groups)·KH·KW per Conv and 2·M·N·K for the Gemm, computed
// here from the ONNX nodes' types before any pass.
TEST(MatmulFloor, CountsTheConvolutionsOfAConvnet) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  auto c = testenv::load_corpus_model("mobilenet_v2");
  Graph& g = *c.model.graph;
  int convs = 0;
  double flops = 0;
  for (const auto& n : g.nodes()) {
    const Shape &x = n->inputs[0]->type.shape, &y = n->outputs[0]->type.shape;
    if (n->op->name == "Conv") {
      const Shape& w = n->inputs[1]->type.shape;
      ++convs;
      flops += 2.0 * static_cast<double>(y[0] * y[1] * y[2] * y[3]) * static_cast<double>(w[1] * w[2] * w[3]);
    } else if (n->op->name == "Gemm") {
      flops += 2.0 * static_cast<double>(y[0] * y[1]) * static_cast<double>(x[1]);
    }
  }
  ASSERT_EQ(convs, 52);
  run_pipeline(g, parse_pipeline("core"), PassOptions{});
  const FloorResult r = measure_matmul_floor(g, 1, 2);
  EXPECT_EQ(r.convolutions, convs);
  EXPECT_EQ(r.matmuls, 1);
  EXPECT_NEAR(r.flops, flops, 1e-9 * flops);
  EXPECT_GT(r.median_ms, 0);
  EXPECT_NE(floor_summary(r).find("1 matmuls and 52 convolutions"), std::string::npos) << floor_summary(r);
}

}  // namespace
// A operand read through a zero stride along K (row i is a[4 i] repeated, a broadcast column) and a B
// with a zero stride along N (row k is b[k] repeated): oneDNN takes neither, so both are copied dense.
// Found by the random-graph tester (tests/randgraph/seed179_compiled_broadcast_matmul_operand.tsl).
TEST(DnnlMatmul, BroadcastOperandIsCopiedDense) {
  MatmulDesc d = contiguous_matmul(1, 3, 5, 4);
  d.a_k = 0;  // A[i][k] = a[i * a_m]
  d.b_n = 0;  // B[k][j] = b[k * b_k]
  Matmul mm(d);
  std::vector<float> a(12), b(20), c(15, -1.0f);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i + 1);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 7);
  mm.run(a.data(), b.data(), c.data());
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j) {
      double want = 0;
      for (int64_t k = 0; k < 4; ++k) want += a[static_cast<size_t>(i * d.a_m)] * b[static_cast<size_t>(k * d.b_k)];
      EXPECT_EQ(c[static_cast<size_t>(i * 5 + j)], static_cast<float>(want)) << i << "," << j;
    }
}

}  // namespace tessel::cpu

namespace tessel::cpu {
namespace {

// A vector times constant weights of 4 MB or more (a classifier's Gemm at batch 1) runs as oneDNN's
// inner product over plain [N, K] weights (its gemv kernel), with the bias, the residual and the
// activation of the epilogue, the weights stored either way round; a scale (Gemm's alpha), which that
// kernel does not take, keeps the matmul.
TEST(DnnlMatmul, LargeConstantVectorProductsRunAsGemv) {
  std::vector<float> b = random_floats(1100 * 1024, 2);
  auto impl_of = [&](MatmulDesc d) {
    d.constant_b = b.data();
    return Matmul(d).impl();
  };
  MatmulDesc d = contiguous_matmul(1, 1, 1100, 1024);
  d.epilogue.act = Activation::relu;
  check_matmul(d, "x . B + bias, relu", true, true);
  // (by the path, not oneDNN's kernel name: without AVX-512 its matmul is a gemm:jit kernel too)
  EXPECT_NE(impl_of(d).find("inner product"), std::string::npos) << impl_of(d);
  MatmulDesc t = d;
  t.b_k = 1, t.b_n = t.K;  // B read transposed: [N, K] in memory (ONNX Gemm with transB)
  t.epilogue = {};
  t.epilogue.accumulate = true;
  check_matmul(t, "x . B^T + bias + C", true, true);
  EXPECT_NE(impl_of(t).find("inner product"), std::string::npos) << impl_of(t);
  t.epilogue.alpha = 0.5f;
  check_matmul(t, "0.5 x . B^T + bias + C", true, true);
  EXPECT_EQ(impl_of(t).find("inner product"), std::string::npos) << impl_of(t);
  const MatmulDesc small = contiguous_matmul(1, 1, 100, 1024);  // 400 KB: stays packed
  EXPECT_EQ(impl_of(small).find("inner product"), std::string::npos) << impl_of(small);
}

// Matmuls on the thread team (MatmulDesc::team): split over the batch, N or M into single-threaded
// parts that the team's threads claim, each against the float64 loop; epilogues, bias, strides,
// constant B (packed per part over N, shared between parts over M) and a product too small to split.
TEST(DnnlMatmul, TeamParts) {
  for (int team : {2, 3}) {
    auto check = [&](MatmulDesc d, const std::string& what, bool constant_b, bool bias, int min_parts) {
      d.team = team;
      check_matmul(d, what + " team " + std::to_string(team), constant_b, bias);
      MatmulDesc probe = d;
      std::vector<float> b = random_floats(span(d.batch, d.b_batch, d.K, d.b_k, d.N, d.b_n), 2);
      if (constant_b) probe.constant_b = b.data();
      EXPECT_GE(Matmul(probe).parts(), min_parts) << what;
    };
    check(contiguous_matmul(1, 64, 256, 64), "over N", false, false, 2);
    MatmulDesc n = contiguous_matmul(1, 64, 200, 64);
    n.epilogue.act = Activation::relu;
    check(n, "over N, constant B + bias + relu (N not a multiple of 16)", true, true, 2);
    n.epilogue = {};
    n.epilogue.accumulate = true;
    check(n, "over N, accumulate", true, true, 2);
    check(contiguous_matmul(6, 32, 32, 64), "over the batch", false, false, 2);
    check(contiguous_matmul(4, 48, 40, 64, /*b_shared=*/true), "over the batch, shared constant B", true, true, 2);
    check(contiguous_matmul(1, 256, 48, 64), "over M", false, false, 2);
    check(contiguous_matmul(1, 256, 48, 64), "over M, constant B", true, true, 2);
    check(contiguous_matmul(1, 4, 8, 8), "too small to split", false, true, 1);
    const int64_t H = 4, T = 64, D = 32, row = 3 * H * D;
    MatmulDesc qk;
    qk.batch = H, qk.M = T, qk.N = T, qk.K = D;
    qk.a_batch = D, qk.a_m = row, qk.a_k = 1;
    qk.b_batch = D, qk.b_k = 1, qk.b_n = row;
    qk.epilogue.alpha = 0.25f;
    check(qk, "Q·K^T through strides", false, false, 2);
  }
}

}  // namespace
}  // namespace tessel::cpu
