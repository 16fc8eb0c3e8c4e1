// The kernel level (docs/ir/kernel.md) and the fusion pass (docs/passes/fuse.md): what fuses on the
// transformer block, text round trips on every corpus model, verifier errors, and fused kernels
// computing what the unfused core graph computes (the eager interpreter is the oracle).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "corpus_util.h"
#include "tessel/ir/printer.h"
#include "tessel/kernel/kernel.h"
#include "tessel/passes/pass.h"
#include "tessel/runtime/compiled_backend.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"

using namespace tessel;

namespace {

KernelModule fused_corpus_model(const std::string& name, const FuseOptions& fo = {}) {
  testenv::CorpusCase c = testenv::load_corpus_model(name);
  run_pipeline(*c.model.graph, parse_pipeline("core"), PassOptions{});
  return fuse(std::move(c.model.graph), fo);
}

const Kernel* kernel_from(const KernelModule& m, const std::string& source_prefix) {
  for (const Kernel& k : m.kernels)
    for (const std::string& s : k.sources)
      if (s.rfind(source_prefix, 0) == 0) return &k;
  return nullptr;
}

int count_op(const Kernel& k, const std::string& op) {
  int n = 0;
  for (const KInstr& in : k.body) n += in.name() == op;
  return n;
}

class CorpusKernel : public ::testing::TestWithParam<std::string> {};

}  // namespace

// Layer norm and softmax are one kernel each; bias, GELU and the residual add are matmul epilogues.
TEST(KernelLevel, TransformerBlockFusion) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  KernelModule m = fused_corpus_model("tblock_s");
  verify_kernel_module(m);
  const Kernel* ln = kernel_from(m, "/ln1/LayerNormalization");
  ASSERT_TRUE(ln);
  EXPECT_EQ(ln->kind, KernelKind::loop);
  EXPECT_EQ(ln->sources, std::vector<std::string>{"/ln1/LayerNormalization"});
  EXPECT_EQ(ln->phases, 3);  // mean, variance, normalise
  EXPECT_EQ(count_op(*ln, "reduce"), 2);
  EXPECT_EQ(ln->num_outputs(), 1);
  const Kernel* sm = kernel_from(m, "/Softmax");
  ASSERT_TRUE(sm);
  EXPECT_EQ(sm->kind, KernelKind::loop);
  EXPECT_EQ(count_op(*sm, "reduce"), 2);  // max, sum
  EXPECT_EQ(sm->outer, (std::vector<int64_t>{512}));
  EXPECT_EQ(sm->inner, (std::vector<int64_t>{128}));
  const Kernel* fc1 = kernel_from(m, "/fc1/MatMul");
  ASSERT_TRUE(fc1);
  EXPECT_EQ(fc1->kind, KernelKind::matmul);
  std::set<std::string> src(fc1->sources.begin(), fc1->sources.end());
  for (const char* s : {"/fc1/Add", "/Div_1", "/Erf", "/Add_1", "/Mul", "/Mul_1"}) EXPECT_TRUE(src.count(s)) << s;
  EXPECT_EQ(count_op(*fc1, "erf"), 1);
  const Kernel* fc2 = kernel_from(m, "/fc2/MatMul");
  ASSERT_TRUE(fc2);
  std::set<std::string> src2(fc2->sources.begin(), fc2->sources.end());
  EXPECT_TRUE(src2.count("/fc2/Add") && src2.count("/Add_2")) << "bias and residual add fuse into fc2";
  // The attention scores: a batched matmul reading Q and K^T straight out of the qkv result.
  const Kernel* qk = kernel_from(m, "/MatMul");
  ASSERT_TRUE(qk);
  EXPECT_EQ(qk->mm.batch, 4);
  EXPECT_EQ(qk->mm.a_m, 768);
  EXPECT_EQ(qk->mm.b_n, 768);
  EXPECT_EQ(qk->mm.b_offset, 256);
  // Fusion saves traffic on every fused kernel.
  for (const Kernel& k : m.kernels)
    if (k.fused_nodes > 1) {
      EXPECT_LT(k.bytes_fused, k.bytes_unfused) << k.name;
    }
}

// GPT-2 stores each projection's product as [B·T, N] and reshapes it to [B, T, N] before its GELU;
// algebraic moves the GELU in front of the reshape, so it is the matmul's epilogue (cuBLASLt's GELU on
// CUDA). The residual adds stay in the layer norms' loops, one loop per norm. The compiled
// results stay those of the model's reference outputs (Models/CompiledCorpus, gpt2_tiny).
TEST(KernelLevel, Gpt2EpiloguesReachThroughReshapes) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  KernelModule m = fused_corpus_model("gpt2_tiny");
  verify_kernel_module(m);
  for (const char* mlp : {"node_Gemm_305", "node_Gemm_310"}) {
    const Kernel* k = kernel_from(m, mlp);
    ASSERT_TRUE(k) << mlp;
    EXPECT_EQ(k->kind, KernelKind::matmul) << mlp;
    EXPECT_EQ(count_op(*k, "tanh"), 1) << mlp << ": the tanh GELU is the MLP matmul's epilogue";
  }
  for (const char* ln : {"node_layer_norm_1", "node_layer_norm_2", "node_layer_norm_3", "node_layer_norm_4"}) {
    int loops = 0;
    for (const Kernel& k : m.kernels)
      loops += std::find(k.sources.begin(), k.sources.end(), ln) != k.sources.end();
    EXPECT_EQ(loops, 1) << ln << " is one loop";
  }
}

// Without fusion every pointwise node is a kernel of its own: more kernels, more traffic.
TEST(KernelLevel, FusionAblation) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  FuseOptions off;
  off.fuse = false;
  KernelModule a = fused_corpus_model("tblock_s");
  KernelModule b = fused_corpus_model("tblock_s", off);
  verify_kernel_module(b);
  int64_t ta = 0, tb = 0;
  for (const Kernel& k : a.kernels) ta += k.bytes_fused;
  for (const Kernel& k : b.kernels) tb += k.bytes_fused;
  EXPECT_GT(b.kernels.size(), 3 * a.kernels.size());
  EXPECT_GT(tb, 2 * ta);
}

TEST_P(CorpusKernel, TextRoundTrips) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  KernelModule m = fused_corpus_model(GetParam());
  const std::string text = print_kernel_module(m);
  KernelModule back = parse_kernel_module(text, GetParam());
  EXPECT_EQ(print_kernel_module(back), text);
}

INSTANTIATE_TEST_SUITE_P(Models, CorpusKernel,
                         ::testing::Values("tblock_s", "tblock_s_dynamo", "ffn_s", "attn_s", "bert_tiny", "gpt2_tiny",
                                           "mobilenet_v2", "nonzero_break"));

namespace {

const char* kSmall = R"(# tessel kernel level
# tessel graph level
graph @g(%x: f32[4,8]) {
  %y: f32[4,8] = kernel(%x) {kernel = 0} loc("n")
  return %y
}
# kernels
kernel k0 loop outer [4] inner [8] phases 1 {
  from "n"
  fused 2 nodes, traffic 512 -> 256 bytes
  arg 0 in %x: f32[4,8]
  arg 1 out %y: f32[4,8]
  access #0 arg 0 offset 0 strides [8, 1]
  access #1 arg 1 offset 0 strides [8, 1]
  %0 = load f32 () #0 @0
  %1 = exp f32 (%0) @0
  %2 = store f32 (%1) #1 @0
}
)";

std::string replace(std::string s, const std::string& from, const std::string& to) {
  s.replace(s.find(from), from.size(), to);
  return s;
}

std::string parse_error(const std::string& text) {
  try {
    parse_kernel_module(text, "bad.tsl");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(KernelLevel, VerifierNamesTheKernel) {
  EXPECT_NO_THROW(parse_kernel_module(kSmall));
  EXPECT_EQ(print_kernel_module(parse_kernel_module(kSmall)), kSmall);
  // an access past the end of its buffer
  std::string e = parse_error(replace(kSmall, "strides [8, 1]\n  access #1", "strides [9, 1]\n  access #1"));
  EXPECT_NE(e.find("k0"), std::string::npos) << e;
  EXPECT_NE(e.find("access #0 reaches"), std::string::npos) << e;
  // a value used before it is defined
  e = parse_error(replace(kSmall, "exp f32 (%0)", "exp f32 (%2)"));
  EXPECT_NE(e.find("not defined before"), std::string::npos) << e;
  // a store into an input
  e = parse_error(replace(kSmall, "store f32 (%1) #1", "store f32 (%1) #0"));
  EXPECT_NE(e.find("stores into an input"), std::string::npos) << e;
  // a dtype mismatch between an instruction and its buffer
  e = parse_error(replace(kSmall, "load f32", "load f64"));
  EXPECT_NE(e.find("buffer holds f32"), std::string::npos) << e;
  // arg types must match the node's values
  e = parse_error(replace(kSmall, "arg 1 out %y: f32[4,8]", "arg 1 out %y: f32[8,4]"));
  EXPECT_NE(e.find("does not match node value"), std::string::npos) << e;
  // syntax errors carry the line
  e = parse_error(replace(kSmall, "phases 1", "phases one"));
  EXPECT_NE(e.find("bad.tsl"), std::string::npos) << e;
  EXPECT_NE(e.find("expected an integer"), std::string::npos) << e;
}

// Sibling fusion: a reduction of x and a reduction of exp(x) over the same rows are one kernel that
// loads x once, and compute what the eager interpreter computes.
TEST(KernelLevel, SiblingFusionSharesTheLoad) {
  const char* text = R"(# tessel graph level
graph @siblings(%x: f32[4,16]) {
  %s: f32[4] = reduce(%x) {axes = [1], kind = "sum"} loc("/sum")
  %e: f32[4,16] = exp(%x) loc("/exp")
  %m: f32[4] = reduce(%e) {axes = [1], kind = "max"} loc("/max")
  return %s, %m
}
)";
  KernelModule m = fuse(parse_graph(text));
  verify_kernel_module(m);
  ASSERT_EQ(m.kernels.size(), 1u);
  const Kernel& k = m.kernels[0];
  EXPECT_EQ(k.num_outputs(), 2);
  EXPECT_EQ(count_op(k, "load"), 1) << print_kernel(k);
  EXPECT_EQ(count_op(k, "reduce"), 2);
  std::vector<double> xs(64);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.37 * static_cast<double>(i)) * 3;
  Tensor x = Tensor::from_f64(DType::f32, {4, 16}, xs);
  std::vector<Tensor> want = run_eager(*parse_graph(text), {x});
  CompiledBackendOptions o;
  o.threads = 1;
  o.toolchain.cache_dir = (std::filesystem::path(testenv::tessel_binary()).parent_path() / "test-compile-cache").string();
  std::vector<Tensor> got = compile_cpu(parse_graph(text), {x}, o)->run({x});
  testenv::expect_matches_reference(got, want, "siblings", 1e-6);
}

// A model that is one long elementwise chain: fusion used to make it one kernel whose lowering
// recursed once per node (a stack overflow at ~20000 nodes, a crash from input). Kernels are
// bounded (kMaxKernelNodes in fuse_groups.cpp), so the chain becomes several kernels.
TEST(KernelLevel, LongElementwiseChainIsSplitIntoBoundedKernels) {
  const int n = 20000;
  std::string text = "graph @chain(%x: f32[4]) {\n";
  std::string prev = "x";
  for (int i = 0; i < n; ++i) {
    text += fmt::format("  %v{}: f32[4] = Relu(%{}) loc(\"r{}\")\n", i, prev, i);
    prev = fmt::format("v{}", i);
  }
  text += "  return %" + prev + "\n}\n";
  std::unique_ptr<Graph> g = parse_graph(text, "chain.tsl");
  run_pipeline(*g, parse_pipeline("core"), PassOptions{});
  KernelModule m = fuse(std::move(g), FuseOptions{});
  verify_kernel_module(m);
  EXPECT_GT(m.kernels.size(), 1u);
  int covered = 0;
  for (const Kernel& k : m.kernels) {
    EXPECT_LE(k.fused_nodes, 1024) << k.name;
    covered += k.fused_nodes;
  }
  EXPECT_GE(covered, n);  // every max of the chain is in some kernel
}
