// The CUDA target at --precision bf16 (docs/runtime/cuda-backend.md, "bf16"): the host conversion against
// hand-computed bit patterns, which values stay f32, every corpus model's bf16 source compiling with
// NVRTC, and on a GPU every corpus model within 2e-2 of the eager interpreter (f32).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "corpus_util.h"
#include "tessel/ir/printer.h"
#include "tessel/runtime/cuda_backend.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"
#include "tessel/targets/cuda/codegen.h"
#include "tessel/targets/cuda/precision.h"
#include "tessel/targets/cuda/toolchain.h"
#include "cuda_test_util.h"
#include "test_util.h"

using namespace tessel;

namespace {

const char* const kCorpus[] = {"tblock_s", "attn_s", "ffn_s", "bert_tiny", "gpt2_tiny", "mobilenet_v2", "tblock_bert"};

float from_bits(uint32_t u) {
  float f = 0;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

// Round to nearest, ties to even, on the bits; saturation of finite values; NaN and infinity kept.
TEST(CudaBf16, HostConversionRoundsToNearestEven) {
  EXPECT_EQ(cuda::f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(cuda::f32_to_bf16(from_bits(0x3f808000)), 0x3f80);  // a tie: down to the even 0x3f80
  EXPECT_EQ(cuda::f32_to_bf16(from_bits(0x3f818000)), 0x3f82);  // a tie: up to the even 0x3f82
  EXPECT_EQ(cuda::f32_to_bf16(from_bits(0x3f808001)), 0x3f81);  // just above the tie
  EXPECT_EQ(cuda::f32_to_bf16(from_bits(0x3f807fff)), 0x3f80);  // just below
  EXPECT_EQ(cuda::f32_to_bf16(-2.5f), 0xc020);
  EXPECT_EQ(cuda::f32_to_bf16(std::numeric_limits<float>::lowest()), 0xff7f);  // saturates, not -inf
  EXPECT_EQ(cuda::f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(cuda::bf16_to_f32(cuda::f32_to_bf16(std::nanf("")))));
  EXPECT_EQ(cuda::bf16_to_f32(0x4049), 3.140625f);
  EXPECT_EQ(cuda::parse_precision("bf16"), cuda::Precision::bf16);
  EXPECT_THROW(cuda::parse_precision("fp8"), Error);
  EXPECT_EQ(cuda::precision_tolerance(cuda::Precision::bf16), 2e-2);
}

namespace {

// A pre-norm block with its residual read again by a matmul: an RMS norm (a reduction) feeding /Up, whose
// tanh feeds /Down, which adds the input back (the residual); /Head reads that sum as its operand and adds it
// to its own product.
std::string residual_block() {
  auto values = [](int n, double f, double amp) {
    std::string s;
    for (int i = 0; i < n; ++i) s += fmt::format("{}{:.4g}", i ? ", " : "", amp * std::sin(f * i + 0.1));
    return "[" + s + "]";
  };
  return "graph @block(%x: f32[8,16]) {\n  const %w1: f32[16,16] = " + values(256, 0.7, 0.3) + "\n  const %w2: f32[16,16] = " + values(256, 0.3, 0.3) +
         "\n  const %g: f32[16] = " + values(16, 0.5, 1.0) + "\n  const %b1: f32[16] = " + values(16, 0.9, 0.2) +
         "\n  const %b2: f32[16] = " + values(16, 1.1, 0.2) + R"(
  const %n: f32[1] = [0.0625]
  %sq: f32[8,16] = mul(%x, %x) loc("/Norm")
  %ss: f32[8] = reduce(%sq) {axes = [1], kind = "sum"} loc("/Norm")
  %nb: f32[8] = broadcast_in_dim(%n) {dims = [0], shape = [8]} loc("/Norm")
  %ms: f32[8] = mul(%ss, %nb) loc("/Norm")
  %rq: f32[8] = sqrt(%ms) loc("/Norm")
  %rs: f32[8] = div(%nb, %rq) loc("/Norm")
  %rb: f32[8,16] = broadcast_in_dim(%rs) {dims = [0], shape = [8, 16]} loc("/Norm")
  %gb: f32[8,16] = broadcast_in_dim(%g) {dims = [1], shape = [8, 16]} loc("/Norm")
  %h0: f32[8,16] = mul(%x, %rb) loc("/Norm")
  %h: f32[8,16] = mul(%h0, %gb) loc("/Norm")
  %a0: f32[8,16] = dot_general(%h, %w1) {lhs_contract = [1], rhs_contract = [0]} loc("/Up")
  %b1b: f32[8,16] = broadcast_in_dim(%b1) {dims = [1], shape = [8, 16]} loc("/Up")
  %a: f32[8,16] = add(%a0, %b1b) loc("/Up")
  %t: f32[8,16] = tanh(%a) loc("/Act")
  %b0: f32[8,16] = dot_general(%t, %w2) {lhs_contract = [1], rhs_contract = [0]} loc("/Down")
  %b2b: f32[8,16] = broadcast_in_dim(%b2) {dims = [1], shape = [8, 16]} loc("/Down")
  %b: f32[8,16] = add(%b0, %b2b) loc("/Down")
  %y: f32[8,16] = add(%b, %x) loc("/Residual")
  %c: f32[8,16] = dot_general(%y, %w1) {lhs_contract = [1], rhs_contract = [0]} loc("/Head")
  %o: f32[8,16] = add(%c, %y) loc("/Out")
  return %o
}
)";
}

}  // namespace

// Storage as autocast's: the residual stream (the input, the sum /Down adds it to) and a normalization's
// constants stay f32; weights, the normalized value only /Up reads and /Up's result are bf16; each bias has
// its matmul's result type (/Up's bf16, /Down's f32: the type cuBLASLt folds a bias in); /Head reads the
// f32 sum both as its operand and in its epilogue, so it stays f32 (the runtime gives /Head's cuBLASLt call a
// bf16 copy). On a GPU the block matches eager within 2e-2, and the copy shows in the step's decision.
TEST(CudaBf16, StorageFollowsAutocast) {
  KernelModule m = lower_for_cuda(parse_graph(residual_block()));
  const std::vector<DType> f32 = cuda::value_storage(*m.graph, m.kernels, cuda::Precision::f32),
                           bf = cuda::value_storage(*m.graph, m.kernels, cuda::Precision::bf16);
  std::map<std::string, DType> by_name;
  for (const auto& v : m.graph->values()) {
    EXPECT_EQ(f32[static_cast<size_t>(v->id)], v->type.dtype) << v->name;
    by_name[v->name] = bf[static_cast<size_t>(v->id)];
  }
  const std::map<std::string, DType> want = {{"x", DType::f32}, {"g", DType::f32},  {"h", DType::bf16}, {"w1", DType::bf16},
                                             {"w2", DType::bf16}, {"t", DType::bf16}, {"y", DType::f32}, {"o", DType::f32},
                                             {"b1", DType::bf16}, {"b2", DType::f32}};
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(by_name.count(name)) << name << " is not a kernel-level value:\n" << print_kernel_module(m, true);
    EXPECT_EQ(by_name[name], t) << name << ":\n" << print_kernel_module(m, true);
  }
  const std::string src = cuda::generate_cuda(m, "block", cuda::Precision::bf16);
  if (cuda::built_with_cuda()) {
    EXPECT_NO_THROW(cuda::compile_cuda_source(src, "block", cuda_test::nvrtc_options(false)));
  }
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  const Tensor x = cuda_test::ramp({8, 16});
  const std::vector<Tensor> eager = run_eager(*parse_graph(residual_block()), {x});
  CudaBackendOptions o;
  o.precision = cuda::Precision::bf16;
  auto exe = compile_cuda(parse_graph(residual_block()), {x}, o);
  for (int call = 0; call < 3; ++call) testenv::expect_matches_reference(exe->run({x}), eager, "block bf16 call " + std::to_string(call), 2e-2);
  int copies = 0;
  for (const CudaStepInfo& i : exe->steps()) copies += i.how.find("read as its bf16 copy") != std::string::npos;
  EXPECT_EQ(copies, 1);
}

class CudaCorpusBf16 : public testing::TestWithParam<const char*> {};

// The bf16 source of every corpus model: bf16 buffers appear (the model has f32 activations), and NVRTC
// compiles it (here, without a GPU: sm_90 is the target).
TEST_P(CudaCorpusBf16, GeneratedSourceCompilesWithNvrtc) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  testenv::CorpusCase c = testenv::load_corpus_model(GetParam());
  KernelModule m = lower_for_cuda(std::move(c.model.graph), c.inputs);
  const std::string src = cuda::generate_cuda(m, GetParam(), cuda::Precision::bf16);
  EXPECT_NE(src.find("tsl_bf16* __restrict__"), std::string::npos) << GetParam();
  EXPECT_NE(src.find("tsl_f2bf("), std::string::npos) << GetParam();
  if (!cuda::built_with_cuda()) GTEST_SKIP() << "source generated; compiling it needs the CUDA toolkit (-DTESSEL_CUDA=ON)";
  const cuda::NvrtcResult r = cuda::compile_cuda_source(src, GetParam(), cuda_test::nvrtc_options(false));
  EXPECT_GT(r.cubin.size(), 1000u);
}

// On a GPU: bf16 storage, f32 compute, within 2e-2 of the eager interpreter's f32 outputs, on the stream
// call, the captured call and a replay.
TEST_P(CudaCorpusBf16, MatchesEagerOnTheGpu) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  testenv::CorpusCase c = testenv::load_corpus_model(GetParam());
  const std::vector<Tensor> eager = run_eager(*c.model.graph, c.inputs);
  CudaBackendOptions o;
  o.cache_dir = testing::TempDir() + "/tessel_cuda_cache";
  o.model_name = GetParam();
  o.precision = cuda::Precision::bf16;
  auto exe = compile_cuda(std::move(c.model.graph), c.inputs, o);
  EXPECT_EQ(exe->stats().precision, "bf16");
  for (int call = 0; call < 3; ++call)
    testenv::expect_matches_reference(exe->run(c.inputs), eager, std::string(GetParam()) + " bf16 call " + std::to_string(call), 2e-2);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaCorpusBf16, testing::ValuesIn(kCorpus),
                         [](const testing::TestParamInfo<const char*>& p) { return std::string(p.param); });

namespace {

// Two heads' scores from one packed projection: slices, transposes and a dot_general over two batch dims,
// which no kernel covers (a view's batch dims take two strides): all on the device, none on the host.
const char* const kHeads = R"(graph @heads(%x: f32[2,5,24]) {
  %q: f32[2,5,12] = slice(%x) {starts = [0, 0, 0], stops = [2, 5, 12], strides = [1, 1, 1]} loc("/Split")
  %k: f32[2,5,12] = slice(%x) {starts = [0, 0, 12], stops = [2, 5, 24], strides = [1, 1, 1]} loc("/Split")
  %qr: f32[2,5,3,4] = reshape(%q) {shape = [2, 5, 3, 4]} loc("/Reshape")
  %kr: f32[2,5,3,4] = reshape(%k) {shape = [2, 5, 3, 4]} loc("/Reshape_1")
  %qt: f32[2,3,5,4] = transpose(%qr) {perm = [0, 2, 1, 3]} loc("/Transpose")
  %kt: f32[2,3,4,5] = transpose(%kr) {perm = [0, 2, 3, 1]} loc("/Transpose_1")
  %s: f32[2,3,5,5] = dot_general(%qt, %kt) {lhs_batch = [0, 1], lhs_contract = [3], rhs_batch = [0, 1], rhs_contract = [2]} loc("/MatMul")
  return %s
}
)";

}  // namespace

TEST(CudaBf16, AttentionViewsRunOnTheDevice) {
  KernelModule m = lower_for_cuda(parse_graph(kHeads));
  for (const cuda::Precision p : {cuda::Precision::f32, cuda::Precision::bf16}) {
    const std::string src = cuda::generate_cuda(m, "heads", p);
    EXPECT_NE(src.find("(slice)"), std::string::npos) << src;
    EXPECT_NE(src.find("(transpose)"), std::string::npos) << src;
    EXPECT_NE(src.find("_mm(const"), std::string::npos) << src;
    if (cuda::built_with_cuda()) {
      EXPECT_NO_THROW(cuda::compile_cuda_source(src, "heads", cuda_test::nvrtc_options(false)));
    }
  }
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  const Tensor x = cuda_test::ramp({2, 5, 24});
  const std::vector<Tensor> eager = run_eager(*parse_graph(kHeads), {x});
  for (const cuda::Precision p : {cuda::Precision::f32, cuda::Precision::bf16}) {
    CudaBackendOptions o;
    o.precision = p;
    auto exe = compile_cuda(parse_graph(kHeads), {x}, o);
    EXPECT_EQ(exe->stats().host_steps, 0);
    testenv::expect_matches_reference(exe->run({x}), eager, std::string("heads ") + cuda::precision_name(p), cuda::precision_tolerance(p));
  }
}

// The transpose that makes K^T for the scores' dot_general keeps K's rows (perm [0, 2, 1, 3]) and the
// dot_general contracts K's last dim instead: the copy walks rows, cuBLASLt reads K stored transposed; the
// scores keep their shape (AttentionViewsRunOnTheDevice runs this graph against eager).
TEST(CudaBf16, MatmulOperandTransposeKeepsRows) {
  KernelModule m = lower_for_cuda(parse_graph(kHeads));
  const Node *kt = nullptr, *mm = nullptr;
  for (const auto& n : m.graph->nodes()) {
    if (n->name == "/Transpose_1") kt = n.get();
    if (n->name == "/MatMul") mm = n.get();
  }
  ASSERT_TRUE(kt && mm);
  EXPECT_EQ(kt->attr_ints("perm"), (std::vector<int64_t>{0, 2, 1, 3}));
  EXPECT_EQ(kt->outputs[0]->type.shape, (std::vector<int64_t>{2, 3, 5, 4}));
  EXPECT_EQ(mm->attr_ints("rhs_contract"), (std::vector<int64_t>{3}));
  EXPECT_EQ(mm->attr_ints("lhs_contract"), (std::vector<int64_t>{3}));
  EXPECT_EQ(mm->outputs[0]->type.shape, (std::vector<int64_t>{2, 3, 5, 5}));
  const std::optional<MatmulSpec> s = cuda::device_matmul_spec(*mm);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->b_k, 1);
  EXPECT_EQ(s->b_n, 4);
  EXPECT_TRUE(cuda::fits_cublaslt(*s));
  // the head copies (last dim 4, contiguous in their source) move as f32 vectors of 4 at f32
  EXPECT_NE(cuda::generate_cuda(m, "heads").find("// 4 adjacent elements per thread: read and written as vectors"), std::string::npos);
}

// docs/runtime/cuda-backend.md, "bf16": the bf16 example graph generates the ```cuda k1-bf16 block (its softmax kernel).
TEST(CudaBf16, WorkedExample) {
  const std::string md = testenv::read_text(testenv::source_dir() + "/docs/runtime/cuda-backend.md");
  const std::string graph = testenv::md_block(md, "```tsl cuda-bf16-example"), want = testenv::md_block(md, "```cuda k1-bf16");
  ASSERT_FALSE(graph.empty() || want.empty()) << "the page needs a ```tsl cuda-bf16-example and a ```cuda k1-bf16 block";
  const std::string src = cuda::generate_cuda(lower_for_cuda(parse_graph(graph)), "scores", cuda::Precision::bf16);
  const size_t at = src.find("// kernel k1");
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(src.substr(at), want);
}
