// The cuBLASLt epilogue decision (docs/runtime/cuda-backend.md, "Epilogues"): a matmul followed by a bias
// and the tanh GELU folds into the library call; the same with ONNX's erf GELU keeps its generated
// epilogue (cuBLASLt's GELU is the tanh form: 5e-4 apart). On a GPU both match the eager interpreter.
#include <gtest/gtest.h>

#include "corpus_util.h"
#include "tessel/ir/printer.h"
#include "tessel/runtime/cuda_backend.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/targets/cuda/codegen.h"
#include "tessel/targets/cuda/epilogue.h"
#include "tessel/targets/cuda/toolchain.h"
#include "cuda_test_util.h"
#include "test_util.h"

using namespace tessel;

namespace {

const char* const kHead = R"(graph @fc(%x: f32[8,16], %w: f32[16,32], %b: f32[32]) {
  const %half: f32[] = [0.5]
  const %one: f32[] = [1]
  %h: f32[8,32] = MatMul(%x, %w) loc("/fc/MatMul")
  %hb: f32[8,32] = Add(%h, %b) loc("/fc/Add")
)";

// gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as torch exports approximate="tanh"
const char* const kTanh = R"(  const %three: f32[] = [3]
  const %k: f32[] = [0.044715]
  const %s2pi: f32[] = [0.7978845608]
  %p: f32[8,32] = Pow(%hb, %three) loc("/gelu")
  %q: f32[8,32] = Mul(%p, %k) loc("/gelu")
  %r: f32[8,32] = Add(%hb, %q) loc("/gelu")
  %s: f32[8,32] = Mul(%r, %s2pi) loc("/gelu")
  %t: f32[8,32] = Tanh(%s) loc("/gelu")
  %u: f32[8,32] = Add(%t, %one) loc("/gelu")
  %v: f32[8,32] = Mul(%hb, %u) loc("/gelu")
  %y: f32[8,32] = Mul(%v, %half) loc("/gelu")
  return %y
}
)";

// gelu(x) = 0.5 x (1 + erf(x / sqrt(2))), ONNX's Gelu/Erf pattern (torch's default GELU)
const char* const kErf = R"(  const %sqrt2: f32[] = [1.4142135381698608]
  %s: f32[8,32] = Div(%hb, %sqrt2) loc("/gelu")
  %t: f32[8,32] = Erf(%s) loc("/gelu")
  %u: f32[8,32] = Add(%t, %one) loc("/gelu")
  %v: f32[8,32] = Mul(%hb, %u) loc("/gelu")
  %y: f32[8,32] = Mul(%v, %half) loc("/gelu")
  return %y
}
)";

const Kernel* matmul_kernel(const KernelModule& m) {
  for (const Kernel& k : m.kernels)
    if (k.kind == KernelKind::matmul) return &k;
  return nullptr;
}

}  // namespace

TEST(CudaEpilogue, TanhGeluFoldsErfGeluDoesNot) {
  for (const bool tanh : {true, false}) {
    const std::string text = std::string(kHead) + (tanh ? kTanh : kErf);
    KernelModule m = lower_for_cuda(parse_graph(text));
    const Kernel* k = matmul_kernel(m);
    ASSERT_NE(k, nullptr) << text;
    const cuda::LtEpilogue e = cuda::match_lt_epilogue(*k);
    EXPECT_EQ(e.fold, tanh) << e.why;
    if (tanh) {
      EXPECT_TRUE(e.bias);
      EXPECT_EQ(e.act, cuda::LtEpilogue::Act::gelu_tanh);
      EXPECT_FALSE(e.residual);
    } else {
      EXPECT_NE(e.why.find("erf"), std::string::npos) << e.why;
    }
    EXPECT_NE(cuda::generate_cuda(m, "fc").find("// epilogue decision: " + e.why), std::string::npos);
  }
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  const std::vector<Tensor> ins = {cuda_test::ramp({8, 16}, 1, 40.0f), cuda_test::ramp({16, 32}, 2, 40.0f), cuda_test::ramp({32}, 3, 40.0f)};
  for (const bool tanh : {true, false}) {
    const std::string text = std::string(kHead) + (tanh ? kTanh : kErf);
    const std::vector<Tensor> eager = run_eager(*parse_graph(text), ins);
    auto exe = compile_cuda(parse_graph(text), ins);
    bool folded = false;
    for (const CudaStepInfo& s : exe->steps()) folded = folded || s.how.find("with its epilogue") != std::string::npos;
    EXPECT_EQ(folded, tanh);
    testenv::expect_matches_reference(exe->run(ins), eager, tanh ? "tanh gelu" : "erf gelu", 1e-4);
  }
}

// The bench's per-step profile times a generated epilogue apart from the cuBLASLt call before it (an event
// between the two): the erf GELU's step reports a part of its time, the tanh GELU's folded step none.
TEST(CudaEpilogue, ProfileTimesTheGeneratedEpilogueApart) {
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  const std::vector<Tensor> ins = {cuda_test::ramp({8, 16}, 1, 40.0f), cuda_test::ramp({16, 32}, 2, 40.0f), cuda_test::ramp({32}, 3, 40.0f)};
  for (const bool tanh : {true, false}) {
    auto exe = compile_cuda(parse_graph(std::string(kHead) + (tanh ? kTanh : kErf)), ins);
    int split = 0;
    for (const CudaStepTime& t : exe->profile(ins, 5)) {
      if (t.info.kind != "matmul") {
        EXPECT_EQ(t.epilogue_ms, -1) << t.info.name;
        continue;
      }
      EXPECT_EQ(t.epilogue_ms >= 0, !tanh) << t.info.name << " " << t.info.how;
      if (t.epilogue_ms >= 0) {
        ++split;
        EXPECT_LE(t.epilogue_ms, t.ms) << t.info.name;
      }
    }
    EXPECT_EQ(split, tanh ? 0 : 1);
  }
}
