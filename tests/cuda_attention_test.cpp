// Fused attention on the CUDA target (docs/runtime/cuda-backend.md, "Fused attention"): the pattern
// QK -> softmax(alpha * S [+ mask]) -> PV is found by value (alpha read off the softmax kernel), fuses only
// with bf16 Q/K/V, its kernel compiles with NVRTC, and on a GPU the fused kernel matches both the unfused
// steps and the eager interpreter on odd shapes (37 queries and keys: not a multiple of the 64-row tile),
// with and without a mask.
#include <gtest/gtest.h>

#include <cmath>

#include "corpus_util.h"
#include "tessel/ir/printer.h"
#include "tessel/runtime/cuda_backend.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/targets/cuda/attention.h"
#include "tessel/targets/cuda/codegen.h"
#include "tessel/targets/cuda/precision.h"
#include "tessel/targets/cuda/toolchain.h"
#include "cuda_test_util.h"
#include "test_util.h"

using namespace tessel;

namespace {

// B=2, H=3, T=37, head dim 16; Q, K, V sliced from one projection (as a B=4 BERT block's are).
std::string attention_graph(bool mask, bool softmax = true) {
  std::string g = R"(graph @attn(%x: f32[2,37,144], %mk: f32[2,1,1,37]) {
  const %sc: f32[1] = [0.25]
  %q: f32[2,37,48] = slice(%x) {starts = [0, 0, 0], stops = [2, 37, 48], strides = [1, 1, 1]} loc("/Split")
  %k: f32[2,37,48] = slice(%x) {starts = [0, 0, 48], stops = [2, 37, 96], strides = [1, 1, 1]} loc("/Split")
  %v: f32[2,37,48] = slice(%x) {starts = [0, 0, 96], stops = [2, 37, 144], strides = [1, 1, 1]} loc("/Split")
  %qr: f32[2,37,3,16] = reshape(%q) {shape = [2, 37, 3, 16]} loc("/Reshape")
  %kr: f32[2,37,3,16] = reshape(%k) {shape = [2, 37, 3, 16]} loc("/Reshape_1")
  %vr: f32[2,37,3,16] = reshape(%v) {shape = [2, 37, 3, 16]} loc("/Reshape_2")
  %qt: f32[2,3,37,16] = transpose(%qr) {perm = [0, 2, 1, 3]} loc("/Transpose")
  %kt: f32[2,3,16,37] = transpose(%kr) {perm = [0, 2, 3, 1]} loc("/Transpose_1")
  %vt: f32[2,3,37,16] = transpose(%vr) {perm = [0, 2, 1, 3]} loc("/Transpose_2")
  %s: f32[2,3,37,37] = dot_general(%qt, %kt) {lhs_batch = [0, 1], lhs_contract = [3], rhs_batch = [0, 1], rhs_contract = [2]} loc("/MatMul")
  %scb: f32[2,3,37,37] = broadcast_in_dim(%sc) {dims = [3], shape = [2, 3, 37, 37]} loc("/Mul")
  %ss: f32[2,3,37,37] = mul(%s, %scb) loc("/Mul")
)";
  // with a mask: 0.25 * S + mask; without: 0.25 * S + 0.25 * S (alpha 0.5)
  g += mask ? R"(  %mb: f32[2,3,37,37] = broadcast_in_dim(%mk) {dims = [0, 1, 2, 3], shape = [2, 3, 37, 37]} loc("/Add")
  %sm: f32[2,3,37,37] = add(%ss, %mb) loc("/Add")
)"
            : R"(  %sm: f32[2,3,37,37] = add(%ss, %ss) loc("/Add")
)";
  g += R"(  %mx: f32[2,3,37] = reduce(%sm) {axes = [3], kind = "max"} loc("/Softmax")
  %mxb: f32[2,3,37,37] = broadcast_in_dim(%mx) {dims = [0, 1, 2], shape = [2, 3, 37, 37]} loc("/Softmax")
  %n: f32[2,3,37,37] = neg(%mxb) loc("/Softmax")
  %d: f32[2,3,37,37] = add(%sm, %n) loc("/Softmax")
  %e: f32[2,3,37,37] = exp(%d) loc("/Softmax")
  %z: f32[2,3,37] = reduce(%e) {axes = [3], kind = "sum"} loc("/Softmax")
  %zb: f32[2,3,37,37] = broadcast_in_dim(%z) {dims = [0, 1, 2], shape = [2, 3, 37, 37]} loc("/Softmax")
  %p: f32[2,3,37,37] = div(%e, %zb) loc("/Softmax")
)";
  // not a softmax: the probabilities doubled
  if (!softmax) g += "  %ph: f32[2,3,37,37] = add(%p, %p) loc(\"/Double\")\n";
  g += R"(  %o: f32[2,3,37,16] = dot_general()" + std::string(softmax ? "%p" : "%ph") + R"(, %vt) {lhs_batch = [0, 1], lhs_contract = [3], rhs_batch = [0, 1], rhs_contract = [2]} loc("/MatMul_1")
  return %o
}
)";
  return g;
}

Tensor wave(const Shape& s, double f, double amp) {
  Tensor t(DType::f32, s);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(amp * std::sin(f * static_cast<double>(i) + 0.3));
  return t;
}

}  // namespace

// The softmax is recognised by value, with its scale; doubled probabilities are not a softmax; f32 storage
// finds the pattern but does not fuse it.
TEST(CudaAttention, PatternFoundByValue) {
  for (const bool mask : {false, true}) {
    KernelModule m = lower_for_cuda(parse_graph(attention_graph(mask)));
    const auto bf = cuda::find_attention(m, cuda::value_storage(*m.graph, m.kernels, cuda::Precision::bf16));
    ASSERT_EQ(bf.size(), 1u) << cuda::generate_cuda(m, "attn", cuda::Precision::bf16);
    EXPECT_TRUE(bf[0].fused) << bf[0].why;
    EXPECT_NEAR(bf[0].alpha, mask ? 0.25 : 0.5, 1e-6);
    EXPECT_EQ(bf[0].mask_arg >= 0, mask);
    const auto f32 = cuda::find_attention(m, cuda::value_storage(*m.graph, m.kernels, cuda::Precision::f32));
    ASSERT_EQ(f32.size(), 1u);
    EXPECT_FALSE(f32[0].fused);
    EXPECT_NE(f32[0].why.find("bf16"), std::string::npos) << f32[0].why;
    const std::string src = cuda::generate_cuda(m, "attn", cuda::Precision::bf16, true);
    EXPECT_NE(src.find("// attention fused:"), std::string::npos);
    EXPECT_NE(cuda::generate_cuda(m, "attn", cuda::Precision::bf16).find("// attention not fused: turned off"), std::string::npos);
    if (cuda::built_with_cuda()) {
      EXPECT_NO_THROW(cuda::compile_cuda_source(src, "attn", cuda_test::nvrtc_options(false)));
    }
    KernelModule d = lower_for_cuda(parse_graph(attention_graph(mask, false)));
    EXPECT_TRUE(cuda::find_attention(d, cuda::value_storage(*d.graph, d.kernels, cuda::Precision::bf16)).empty()) << "2 x softmax matched";
  }
}

// On a GPU: the fused kernel (bf16) against the unfused steps in the same process and against the eager
// interpreter (2e-2); f32 (unfused: the fused kernel takes bf16) against eager at 1e-4.
TEST(CudaAttention, FusedMatchesUnfusedOnTheGpu) {
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  const std::vector<Tensor> ins = {wave({2, 37, 144}, 0.37, 1.5), wave({2, 1, 1, 37}, 1.3, 2.0)};
  for (const bool mask : {false, true}) {
    const std::string text = attention_graph(mask);
    const std::vector<Tensor> eager = run_eager(*parse_graph(text), ins);
    std::vector<std::vector<Tensor>> outs;
    for (const bool fuse : {true, false}) {
      CudaBackendOptions o;
      o.precision = cuda::Precision::bf16;
      o.fuse_attention = fuse;
      auto exe = compile_cuda(parse_graph(text), ins, o);
      EXPECT_EQ(exe->stats().fused_attention, fuse ? 1 : 0);
      outs.push_back(exe->run(ins));
      outs.push_back(exe->run(ins));  // the captured call
      testenv::expect_matches_reference(outs.back(), eager, std::string("attention bf16 ") + (fuse ? "fused" : "unfused") + (mask ? " masked" : ""), 2e-2);
    }
    testenv::expect_matches_reference(outs[1], outs[3], std::string("fused vs unfused") + (mask ? " masked" : ""), 2e-2);
    auto f32 = compile_cuda(parse_graph(text), ins);
    EXPECT_EQ(f32->stats().fused_attention, 0);
    testenv::expect_matches_reference(f32->run(ins), eager, std::string("attention f32") + (mask ? " masked" : ""), 1e-4);
  }
}
