// The CUDA target (docs/runtime/cuda-backend.md): every corpus model's generated CUDA C++ compiles with
// NVRTC (wherever the toolkit is, GPU or not), each model run on the GPU matches the eager interpreter,
// hostile names stay inside comments, and the page's worked example is what the generator prints.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdlib>
#include <functional>
#include <regex>
#include <sstream>

#include "corpus_util.h"
#include "tessel/ir/printer.h"
#include "tessel/runtime/cuda_backend.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"
#include "tessel/targets/cuda/codegen.h"
#include "tessel/targets/cuda/toolchain.h"
#include "cuda_test_util.h"
#include "test_util.h"

using namespace tessel;

namespace {

const char* const kCorpus[] = {"tblock_s", "attn_s", "ffn_s", "bert_tiny", "gpt2_tiny", "mobilenet_v2", "tblock_bert"};

// A small softmax over rows of 64: one rows-form kernel of three phases (max, sum, normalise).
const char* const kSoftmax = R"(graph @softmax_rows(%x: f32[2,64]) {
  %m: f32[2] = reduce(%x) {axes = [1], kind = "max"} loc("/Softmax")
  %mb: f32[2,64] = broadcast_in_dim(%m) {dims = [0], shape = [2, 64]} loc("/Softmax")
  %n: f32[2,64] = neg(%mb) loc("/Softmax")
  %d: f32[2,64] = add(%x, %n) loc("/Softmax")
  %e: f32[2,64] = exp(%d) loc("/Softmax")
  %z: f32[2] = reduce(%e) {axes = [1], kind = "sum"} loc("/Softmax")
  %zb: f32[2,64] = broadcast_in_dim(%z) {dims = [0], shape = [2, 64]} loc("/Softmax")
  %p: f32[2,64] = div(%e, %zb) loc("/Softmax")
  return %p
}
)";

}  // namespace

class CudaCorpus : public testing::TestWithParam<const char*> {};

// Generation needs no toolkit; compiling needs NVRTC (a GPU does not matter: sm_90 is the target).
TEST_P(CudaCorpus, GeneratedSourceCompilesWithNvrtc) {
  if (!testenv::have_shared()) {
    GTEST_SKIP() << "needs ../shared";
  }
  testenv::CorpusCase c = testenv::load_corpus_model(GetParam());
  KernelModule m = lower_for_cuda(std::move(c.model.graph), c.inputs);
  const std::string src = cuda::generate_cuda(m, GetParam());
  ASSERT_FALSE(m.kernels.empty());
  for (size_t i = 0; i < m.kernels.size(); ++i)
    if (cuda::has_generated_function(m.kernels[i])) {
      EXPECT_NE(src.find("__global__ void " + cuda::kernel_symbol(i) + "("), std::string::npos) << GetParam() << " kernel " << i;
    }
  if (!cuda::built_with_cuda()) GTEST_SKIP() << "source generated; compiling it needs the CUDA toolkit (-DTESSEL_CUDA=ON)";
  cuda::NvrtcOptions o = cuda_test::nvrtc_options();
  o.use_cache = false;
  const cuda::NvrtcResult r = cuda::compile_cuda_source(src, GetParam(), o);
  EXPECT_GT(r.cubin.size(), 1000u);
}

// On a GPU: the model's outputs equal the eager interpreter's, on the first (stream) call, the second
// (captured into a CUDA graph) and the third (graph replay).
TEST_P(CudaCorpus, MatchesEagerOnTheGpu) {
  if (!testenv::have_shared()) {
    GTEST_SKIP() << "needs ../shared";
  }
  if (!cuda::device_info().usable) {
    GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  }
  testenv::CorpusCase c = testenv::load_corpus_model(GetParam());
  const std::vector<Tensor> eager = run_eager(*c.model.graph, c.inputs);
  CudaBackendOptions o;
  o.cache_dir = testing::TempDir() + "/tessel_cuda_cache";
  o.model_name = GetParam();
  auto exe = compile_cuda(std::move(c.model.graph), c.inputs, o);
  for (int call = 0; call < 3; ++call) {
    const std::vector<Tensor> outs = exe->run(c.inputs);
    testenv::expect_matches_reference(outs, eager, std::string(GetParam()) + " call " + std::to_string(call), 1e-4);
  }
  if (exe->stats().host_steps == 0) {
    EXPECT_TRUE(exe->uses_graph()) << GetParam();
  }
  testenv::expect_matches_reference(exe->run(c.inputs), c.refs, std::string(GetParam()) + " vs its data set", 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaCorpus, testing::ValuesIn(kCorpus),
                         [](const testing::TestParamInfo<const char*>& p) { return std::string(p.param); });

// Every name a model carries is hostile here: each must reach the source only inside a // comment,
// escaped (no line break, no comment close, no backslash at a line end), and the source must compile.
TEST(CudaCodegen, HostileNamesStayInComments) {
  const std::string hostile = "q\"uote\nnew line */ evil(); /* \\\n#define X 1\\";
  auto g = parse_graph(kSoftmax);
  for (const auto& n : g->nodes()) const_cast<Node&>(*n).name = hostile;
  for (const auto& v : g->values()) v->name = hostile + v->name;
  g->name = hostile;
  KernelModule m = lower_for_cuda(std::move(g));
  ASSERT_EQ(m.kernels.size(), 1u);
  m.kernels[0].name = hostile;
  const std::string src = cuda::generate_cuda(m, hostile);
  std::istringstream lines(src);
  int mentions = 0;
  for (std::string l; std::getline(lines, l);) {
    const bool comment = l.rfind("//", 0) == 0;
    if (l.find("evil") != std::string::npos) {
      ++mentions;
      EXPECT_TRUE(comment) << "a name left its comment: " << l;
      EXPECT_EQ(l.find("*/"), std::string::npos) << l;
    }
    EXPECT_TRUE(l.empty() || l.back() != '\\') << "line splice: " << l;
    if (!comment) {
      EXPECT_EQ(l.find("#define"), std::string::npos) << "a planted directive: " << l;
    }
  }
  EXPECT_GE(mentions, 3) << "the names are shown (escaped) in the provenance comments";
  if (!cuda::built_with_cuda()) GTEST_SKIP() << "escaping checked; compiling needs the CUDA toolkit";
  EXPECT_NO_THROW(cuda::compile_cuda_source(src, "hostile", cuda_test::nvrtc_options()));
}

// Convolutions other than the 1x1 channels-last one run as im2col + one cuBLASLt matmul (codegen.h,
// conv_as_matmul): resnet's 7x7 stride-2 stem (its NCHW result read by a max pool), a padded 3x3, a strided
// dilated 3x3; a grouped one stays the direct conv. The pools (reduce_window) run on the device. Each
// matches the eager interpreter at f32 and at bf16 storage, with no host step.
TEST(CudaBackend, ConvolutionsRunAsIm2colMatmuls) {
  const char* text = R"(graph @convs(%x: f32[2,3,40,40], %w1: f32[16,3,7,7], %w2: f32[16,16,3,3], %w3: f32[8,16,3,3], %w4: f32[8,2,3,3]) {
  %a: f32[2,16,20,20] = Conv(%x, %w1) {pads = [3, 3, 3, 3], strides = [2, 2]} loc("/stem")
  %ar: f32[2,16,20,20] = Relu(%a) loc("/stem.relu")
  %p: f32[2,16,10,10] = MaxPool(%ar) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]} loc("/maxpool")
  %b: f32[2,16,10,10] = Conv(%p, %w2) {pads = [1, 1, 1, 1]} loc("/conv3x3")
  %c: f32[2,8,4,4] = Conv(%b, %w3) {pads = [1, 1, 1, 1], strides = [2, 2], dilations = [2, 2]} loc("/strided_dilated")
  %d: f32[2,8,4,4] = Conv(%c, %w4) {pads = [1, 1, 1, 1], group = 4} loc("/grouped")
  %e: f32[2,8,2,2] = AveragePool(%d) {kernel_shape = [2, 2], strides = [2, 2]} loc("/avgpool")
  return %e
}
)";
  // The weights are constants (a convolution kernel needs them so; a weight input stays a core node).
  auto make = [&] {
    auto g = parse_graph(text);
    int seed = 1;
    for (const char* name : {"w1", "w2", "w3", "w4"}) {
      Value* in = g->find_value(name);
      g->replace_all_uses(in, g->add_constant(std::string(name) + "_const", cuda_test::ramp(in->type.shape, seed++, 40.0f)));
      g->inputs.erase(std::find(g->inputs.begin(), g->inputs.end(), in));
    }
    return g;
  };
  const KernelModule m = lower_for_cuda(make());
  int as_matmul = 0, convs = 0;
  for (const Kernel& k : m.kernels) {
    convs += k.kind == KernelKind::conv;
    as_matmul += k.kind == KernelKind::conv && cuda::conv_as_matmul(k.conv);
  }
  EXPECT_EQ(convs, 4);
  EXPECT_GE(as_matmul, 3);  // the grouped one is not
  const std::string src = cuda::generate_cuda(m, "convs");
  EXPECT_NE(src.find("_im2col("), std::string::npos) << src;
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  const std::vector<Tensor> in = {cuda_test::ramp({2, 3, 40, 40}, 0, 10.0f)};
  const std::vector<Tensor> eager = run_eager(*make(), in);
  for (const cuda::Precision p : {cuda::Precision::f32, cuda::Precision::bf16}) {
    CudaBackendOptions o;
    o.precision = p;
    auto exe = compile_cuda(make(), in, o);
    EXPECT_EQ(exe->stats().im2col_convs, as_matmul) << cuda::precision_name(p);
    EXPECT_EQ(exe->stats().host_steps, 0);
    for (int call = 0; call < 3; ++call)
      testenv::expect_matches_reference(exe->run(in), eager, fmt::format("convs {} call {}", cuda::precision_name(p), call),
                                        cuda::precision_tolerance(p));
  }
}

// cuBLASLt algorithms chosen by timing (CudaBackendOptions::time_matmuls): each distinct matmul is timed
// once (tblock_s repeats its shapes), every timed step says so in its report, and the outputs equal the
// eager interpreter's with the timed choice and with the heuristic's first alike.
TEST(CudaBackend, MatmulAlgorithmsChosenByTiming) {
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  // The option is what this test sets: TESSEL_CUDA_TIME_MATMULS in the environment would override it.
  testenv::ScopedEnv no_override("TESSEL_CUDA_TIME_MATMULS", nullptr);
  for (const bool timed : {true, false}) {
    testenv::CorpusCase c = testenv::load_corpus_model("tblock_s");
    const std::vector<Tensor> eager = run_eager(*c.model.graph, c.inputs);
    CudaBackendOptions o;
    o.time_matmuls = timed;
    auto exe = compile_cuda(std::move(c.model.graph), c.inputs, o);
    const CudaCompileStats& st = exe->stats();
    ASSERT_GT(st.cublaslt_matmuls, 0);
    if (timed) {
      EXPECT_GT(st.timed_matmuls, 0);
      EXPECT_LE(st.timed_matmuls, st.cublaslt_matmuls);
      EXPECT_LE(st.retimed_algos, st.timed_matmuls);
    } else {
      EXPECT_EQ(st.timed_matmuls, 0);
    }
    int reported = 0;
    for (const CudaStepInfo& i : exe->steps()) reported += i.how.find("timed ") != std::string::npos;
    if (timed) {
      EXPECT_GE(reported, st.timed_matmuls);
    } else {
      EXPECT_EQ(reported, 0);
    }
    for (int call = 0; call < 3; ++call)
      testenv::expect_matches_reference(exe->run(c.inputs), eager, fmt::format("tblock_s timed={} call {}", timed, call), 1e-4);
  }
}

// TESSEL_CUDA_ARCH=sm_90a (on Hopper; the device's own name with "a") builds the generated kernels for the
// architecture-specific target; the outputs stay eager's. A value that does not name the device is a one-line
// error, not a silent fallback.
TEST(CudaToolchain, ArchitectureSpecificTargetOnRequest) {
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  const cuda::DeviceInfo& d = cuda::device_info();
  const std::string own = fmt::format("sm_{}{}", d.cc_major, d.cc_minor);
  testenv::ScopedEnv env("TESSEL_CUDA_ARCH", nullptr);
  EXPECT_EQ(cuda::device_arch(), own);
  const std::vector<std::string> asked = d.cc_major >= 9 ? std::vector<std::string>{own + "a", own} : std::vector<std::string>{own};
  for (const std::string& arch : asked) {
    env.set(arch.c_str());
    EXPECT_EQ(cuda::device_arch(), arch);
    testenv::CorpusCase c = testenv::load_corpus_model("tblock_s");
    const std::vector<Tensor> eager = run_eager(*c.model.graph, c.inputs);
    CudaBackendOptions o;
    o.cache_dir = testing::TempDir() + "/tessel_cuda_cache_arch";
    auto exe = compile_cuda(std::move(c.model.graph), c.inputs, o);
    EXPECT_EQ(exe->stats().arch, arch);
    for (int call = 0; call < 2; ++call)
      testenv::expect_matches_reference(exe->run(c.inputs), eager, fmt::format("tblock_s {} call {}", arch, call), 1e-4);
  }
  env.set("sm_80;");
  try {
    cuda::device_arch();
    ADD_FAILURE() << "TESSEL_CUDA_ARCH=sm_80; was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("TESSEL_CUDA_ARCH"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

// A cubin cached under the key is used again; a damaged one is compiled again.
TEST(CudaToolchain, CacheHitsAndRecoversFromDamage) {
  if (!cuda::built_with_cuda()) GTEST_SKIP() << "needs the CUDA toolkit (-DTESSEL_CUDA=ON)";
  cuda::NvrtcOptions o = cuda_test::nvrtc_options();
  o.cache_dir = testing::TempDir() + "/tessel_cuda_cache_damage";
  std::filesystem::remove_all(o.cache_dir);
  KernelModule m = lower_for_cuda(parse_graph(kSoftmax));
  const std::string src = cuda::generate_cuda(m, "softmax");
  const cuda::NvrtcResult a = cuda::compile_cuda_source(src, "softmax", o);
  EXPECT_FALSE(a.cache_hit);
  const cuda::NvrtcResult b = cuda::compile_cuda_source(src, "softmax", o);
  EXPECT_TRUE(b.cache_hit);
  EXPECT_EQ(a.cubin, b.cubin);
  { std::ofstream(b.cache_path, std::ios::binary | std::ios::trunc) << "not a cubin"; }
  const cuda::NvrtcResult c = cuda::compile_cuda_source(src, "softmax", o);
  EXPECT_FALSE(c.cache_hit);
  EXPECT_EQ(c.cubin, a.cubin);
  EXPECT_THROW(cuda::compile_cuda_source("__global__ void broken( {", "broken", o), Error);
}

// The row cache (docs/runtime/cuda-backend.md, "Launch forms"): a warp-rows softmax loads its row once
// and computes exp once per element, keeping both in register arrays; a width that is no multiple of 32
// guards the last lanes. Checked here in the source (NVRTC compiles it), on the GPU below.
TEST(CudaCodegen, RowCacheKeepsValuesAcrossPhases) {
  for (const char* width : {"64", "100", "1000"}) {
    const std::string text = std::regex_replace(std::string(kSoftmax), std::regex("64"), width);
    const std::string src = cuda::generate_cuda(lower_for_cuda(parse_graph(text)), "softmax");
    const int w = std::stoi(width);
    EXPECT_NE(src.find(fmt::format("for (int j = 0; j < {}; ++j)", (w + 31) / 32)), std::string::npos) << src;
    EXPECT_NE(src.find("c9[j] = v9;"), std::string::npos) << src;                // the exp, computed in phase 1
    EXPECT_NE(src.find("const float v5 = c9[j];  // kept from phase 1"), std::string::npos) << src;
    EXPECT_EQ(src.find("tsl_exp(v4)"), std::string::npos) << src;                 // not again in phase 2
    const size_t load = src.find("= a0[b0 + i0];");
    EXPECT_NE(load, std::string::npos) << src;
    EXPECT_EQ(load, src.rfind("= a0[b0 + i0];")) << src;                          // one load of the row
    EXPECT_EQ(src.find("if (t < "), w % 32 ? src.find(fmt::format("if (t < {})", w)) : std::string::npos) << src;
    if (cuda::built_with_cuda()) {
      EXPECT_GT(cuda::compile_cuda_source(src, "softmax", cuda_test::nvrtc_options(false)).cubin.size(), 1000u);
    }
  }
}

// pow by a constant 3 (GPT-2's tanh GELU) is generated as a product, any other exponent through powf;
// on a GPU the kernel matches the eager interpreter (negative bases included for the cube).
TEST(CudaCodegen, CubesAreProducts) {
  const char* text = R"(graph @powers(%x: f32[4,64]) {
  const %three: f32[] = [3]
  const %other: f32[] = [2.5]
  %p: f32[4,64] = Abs(%x) loc("p")
  %a: f32[4,64] = Pow(%x, %three) loc("a")
  %b: f32[4,64] = Pow(%p, %other) loc("b")
  %c: f32[4,64] = Add(%a, %b) loc("c")
  return %c
}
)";
  const std::string src = cuda::generate_cuda(lower_for_cuda(parse_graph(text)), "powers");
  EXPECT_NE(src.find("= (v0 * v0 * v0);"), std::string::npos) << src;
  EXPECT_NE(src.find("= tsl_pow(v4, v5);"), std::string::npos) << src;
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  const Tensor x = cuda_test::ramp({4, 64});
  const std::vector<Tensor> eager = run_eager(*parse_graph(text), {x});
  testenv::expect_matches_reference(compile_cuda(parse_graph(text), {x})->run({x}), eager, "powers", 1e-6);
}

// Index arithmetic is 32-bit where every position and address fits (a transposed read here), 64-bit
// where one does not (2^31 elements); the 32-bit kernel matches eager on the GPU.
TEST(CudaCodegen, IndexMathIs32BitWhereItFits) {
  const char* small = R"(graph @idx(%x: f32[6,40,8]) {
  %t: f32[8,40,6] = Transpose(%x) {perm = [2, 1, 0]} loc("t")
  %e: f32[8,40,6] = Exp(%t) loc("e")
  return %e
}
)";
  const std::string narrow = cuda::generate_cuda(lower_for_cuda(parse_graph(small)), "idx");
  EXPECT_NE(narrow.find("for (int e = (int)blockIdx.x"), std::string::npos) << narrow;
  EXPECT_EQ(narrow.find("long long", narrow.find("void tsl_k0")), std::string::npos) << narrow;
  const std::string big = std::regex_replace(std::string(small), std::regex("6,40,8\\]"), "65536,8,4096]");
  const std::string wide = cuda::generate_cuda(lower_for_cuda(parse_graph(std::regex_replace(big, std::regex("8,40,6\\]"), "4096,8,65536]"))), "idx");
  EXPECT_NE(wide.find("for (long long e = (long long)blockIdx.x"), std::string::npos) << wide;
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  const Tensor x = cuda_test::ramp({6, 40, 8});
  const std::vector<Tensor> eager = run_eager(*parse_graph(small), {x});
  testenv::expect_matches_reference(compile_cuda(parse_graph(small), {x})->run({x}), eager, "idx", 1e-6);
}

// The pointwise form's vector width: V adjacent elements per thread (16 bytes at the widest type in
// memory: 4 f32, 2 f64), unit-stride operands moved as one access, when the last dimension's extent is a
// multiple of V; a row of 333 or a transposed read keeps one element per thread. Division by a constant
// is a product with its reciprocal. On a GPU the vector kernels match eager at f32, f64 and bf16.
TEST(CudaCodegen, PointwiseVectorForm) {
  const std::string f32 = R"(graph @gelu(%x: f32[3,336], %b: f32[336]) {
  const %c: f32[] = [2.5]
  %s: f32[3,336] = Add(%x, %b) loc("s")
  %d: f32[3,336] = Div(%s, %c) loc("d")
  %e: f32[3,336] = Erf(%d) loc("e")
  %y: f32[3,336] = Mul(%e, %s) loc("y")
  return %y
}
)";
  const std::string f64 = std::regex_replace(f32, std::regex("f32"), "f64");
  for (const auto& [text, width] : {std::pair{f32, 4}, std::pair{f64, 2}}) {
    KernelModule m = lower_for_cuda(parse_graph(text));
    ASSERT_EQ(m.kernels.size(), 1u);
    const std::string src = cuda::generate_cuda(m, "gelu");
    const size_t k0 = src.find("void tsl_k0");
    ASSERT_NE(k0, std::string::npos) << src;
    const std::string t = width == 4 ? "float" : "double";
    EXPECT_NE(src.find(fmt::format("// {} adjacent elements per thread", width), k0), std::string::npos) << src;
    EXPECT_NE(src.find(fmt::format("const tsl_vec<{}, {}> L", t, width), k0), std::string::npos) << src;
    EXPECT_NE(src.find("% 16 == 0", k0), std::string::npos) << src;  // the alignment check
    EXPECT_NE(src.find("for (int e = (int)blockIdx.x", k0), std::string::npos) << src;     // the scalar loop after it
    EXPECT_NE(src.find(width == 4 ? "* 0.4f)" : "* 0.4)", k0), std::string::npos) << src;
    EXPECT_FALSE(std::regex_search(src.substr(k0), std::regex("v[0-9]+ / v[0-9]+"))) << src;
    EXPECT_EQ(cuda::launch_shape(m.kernels[0], 132).blocks, (3 * 336 + 256 * width - 1) / (256 * width));
    KernelModule big = lower_for_cuda(parse_graph(std::regex_replace(text, std::regex("3,336|336"), "1000,1024")));
    EXPECT_EQ(cuda::launch_shape(big.kernels[0], 1000).blocks, 1000 * 1024 / (256 * width));
  }
  for (const std::string& scalar : {std::regex_replace(f32, std::regex("336"), "333"),
                                    std::string(R"(graph @t(%x: f32[8,40]) {
  %t: f32[40,8] = Transpose(%x) {perm = [1, 0]} loc("t")
  %e: f32[40,8] = Exp(%t) loc("e")
  return %e
}
)")}) {
    const std::string src = cuda::generate_cuda(lower_for_cuda(parse_graph(scalar)), "scalar");
    EXPECT_EQ(src.find("adjacent elements per thread"), std::string::npos) << src;
  }
  // a divisor whose reciprocal is no normal f32 (0 here: x / 0 is +-inf or NaN) stays a division
  const std::string by_zero = cuda::generate_cuda(lower_for_cuda(parse_graph(std::regex_replace(f32, std::regex("\\[2\\.5\\]"), "[0]"))), "zero");
  EXPECT_TRUE(std::regex_search(by_zero.substr(by_zero.find("void tsl_k0")), std::regex("v[0-9]+ / v[0-9]+"))) << by_zero;
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  for (const std::string& text : {f32, f64}) {
    const DType t = text == f64 ? DType::f64 : DType::f32;
    std::vector<Tensor> ins = {cuda_test::ramp({3, 336}), cuda_test::ramp({336}, 5)};
    if (t == DType::f64)
      for (Tensor& x : ins) {
        const std::vector<double> d(x.data<float>(), x.data<float>() + x.numel());
        x = Tensor::from_f64(DType::f64, x.shape(), d);
      }
    const std::vector<Tensor> eager = run_eager(*parse_graph(text), ins);
    testenv::expect_matches_reference(compile_cuda(parse_graph(text), ins)->run(ins), eager, "gelu " + std::string(dtype_name(t)), 1e-6);
    if (t == DType::f64) continue;
    CudaBackendOptions o;
    o.precision = cuda::Precision::bf16;
    testenv::expect_matches_reference(compile_cuda(parse_graph(text), ins, o)->run(ins), eager, "gelu bf16", 2e-2);
  }
}

// The softmax on the GPU against the eager interpreter, through every rows form: one per warp (inner 64;
// 100 and 1000 with the row cache's guard and its largest arrays), one per thread (inner 8) and one per
// block (inner 2048).
TEST(CudaBackend, SoftmaxMatchesEager) {
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  for (const char* width : {"64", "8", "2048", "100", "1000"}) {
    std::string text = std::regex_replace(std::string(kSoftmax), std::regex("64"), width);
    auto g = parse_graph(text);
    const Tensor x = cuda_test::ramp({2, std::stoi(width)});
    const std::vector<Tensor> eager = run_eager(*g, {x});
    auto exe = compile_cuda(parse_graph(text), {x});
    testenv::expect_matches_reference(exe->run({x}), eager, std::string("softmax width ") + width, 1e-6);
  }
}

// Without a GPU, compiling for it is one line naming the reason (no crash, no partial work).
TEST(CudaBackend, NoDeviceIsOneLineError) {
  if (cuda::device_info().usable) GTEST_SKIP() << "a GPU is present";
  try {
    compile_cuda(parse_graph(kSoftmax));
    FAIL() << "compile_cuda without a device returned";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_FALSE(what.empty());
  }
}

// docs/runtime/cuda-backend.md: the ```tsl cuda-example graph, lowered for CUDA, generates the
// ```cuda k0 block exactly.
TEST(Docs, CudaBackendWorkedExample) {
  const std::string md = testenv::read_text(testenv::source_dir() + "/docs/runtime/cuda-backend.md");
  const std::string graph = testenv::md_block(md, "```tsl cuda-example"), want = testenv::md_block(md, "```cuda k0");
  ASSERT_FALSE(graph.empty() || want.empty()) << "the page needs a ```tsl cuda-example and a ```cuda k0 block";
  KernelModule m = lower_for_cuda(parse_graph(graph));
  ASSERT_EQ(m.kernels.size(), 1u);
  EXPECT_EQ(cuda::generate_kernel(m.kernels[0], 0), want);
}

// Gather and broadcast_in_dim run on the device (no host step); an index out of range is a one-line
// error naming the node after the call, never a read outside the buffer.
TEST(CudaBackend, GatherOnTheDeviceChecksIndices) {
  const char* text = R"(graph @gather_rows(%d: f32[4,3], %i: i64[2,3]) {
  %g: f32[2,3] = gather(%d, %i) {axis = 0} loc("/Gather")
  return %g
}
)";
  KernelModule m = lower_for_cuda(parse_graph(text));
  const std::string src = cuda::generate_cuda(m, "gather");
  EXPECT_NE(src.find("__global__ void tsl_n"), std::string::npos) << src;
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  Tensor d = cuda_test::ramp({4, 3}), i(DType::i64, {2, 3});
  const int64_t good[] = {0, 3, -1, 2, 1, 0};
  for (int k = 0; k < 6; ++k) i.data<int64_t>()[k] = good[k];
  auto exe = compile_cuda(parse_graph(text), {d, i});
  EXPECT_EQ(exe->stats().host_steps, 0);
  testenv::expect_matches_reference(exe->run({d, i}), run_eager(*parse_graph(text), {d, i}), "gather", 0);
  i.data<int64_t>()[4] = 4;
  try {
    exe->run({d, i});
    FAIL() << "an index of 4 into a dim of 4 passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
  }
  i.data<int64_t>()[4] = 1;
  EXPECT_NO_THROW(exe->run({d, i}));  // the flag was reset
}

// A static KV cache's write (aten index_copy_ lowered to a scatter along the length, its positions a
// broadcast index) and a read of the new cache: two launches on the device (copy, then the updates), no
// host step, so the call is captured in a CUDA graph; the generated source compiles with NVRTC; on a GPU
// the outputs equal the eager interpreter's over three calls, and an index out of range is the call's error.
TEST(CudaBackend, ScatterOnTheDevice) {
  const char* text = R"(graph @cache_write(%cache: f32[2,6,3], %pos: i64[2], %u: f32[2,2,3]) {
  %idx: i64[2,2,3] = broadcast_in_dim(%pos) {dims = [1], shape = [2,2,3]} loc("idx")
  %c2: f32[2,6,3] = scatter(%cache, %idx, %u) {axis = 1} loc("/index_copy")
  %e: f32[2,6,3] = exp(%c2) loc("e")
  return %e, %c2
}
)";
  KernelModule m = lower_for_cuda(parse_graph(text));
  const std::string src = cuda::generate_cuda(m, "scatter");
  EXPECT_NE(src.find("_s(const float* __restrict__ data"), std::string::npos) << src;
  if (cuda::built_with_cuda()) {
    cuda::NvrtcOptions o = cuda_test::nvrtc_options();
    o.use_cache = false;
    EXPECT_GT(cuda::compile_cuda_source(src, "scatter", o).cubin.size(), 1000u);
  }
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  const Tensor cache = cuda_test::ramp({2, 6, 3}), u = cuda_test::ramp({2, 2, 3});
  Tensor pos(DType::i64, {2});
  pos.data<int64_t>()[0] = 4;
  pos.data<int64_t>()[1] = -1;
  auto exe = compile_cuda(parse_graph(text), {cache, pos, u});
  EXPECT_EQ(exe->stats().host_steps, 0);
  const std::vector<Tensor> want = run_eager(*parse_graph(text), {cache, pos, u});
  for (int call = 0; call < 3; ++call)
    testenv::expect_matches_reference(exe->run({cache, pos, u}), want, "scatter call " + std::to_string(call), 1e-6);
  EXPECT_TRUE(exe->uses_graph());
  pos.data<int64_t>()[0] = 6;
  try {
    exe->run({cache, pos, u});
    FAIL() << "a position of 6 into a dim of 6 passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
  }
}

// A concatenation runs on the device: RoPE's rotate_half (cat(-x2, x1) along the last dim) and its cos/sin
// table (cat(f, f)) were a host step each in a llama decode step, which also kept the call out of a CUDA
// graph; here a three-operand concatenation along a middle dim too. The source compiles with NVRTC; on a
// GPU there is no host step, the call is captured, and the outputs equal the eager interpreter's.
TEST(CudaBackend, ConcatenateOnTheDevice) {
  const char* text = R"(graph @rotate_half(%x: f32[1,4,3,8], %f: f32[3,4]) {
  %a: f32[1,4,3,4] = slice(%x) {starts = [0, 0, 0, 0], stops = [1, 4, 3, 4], strides = [1, 1, 1, 1]} loc("/x1")
  %b: f32[1,4,3,4] = slice(%x) {starts = [0, 0, 0, 4], stops = [1, 4, 3, 8], strides = [1, 1, 1, 1]} loc("/x2")
  %nb: f32[1,4,3,4] = neg(%b) loc("/neg")
  %r: f32[1,4,3,8] = concatenate(%nb, %a) {axis = 3} loc("/rotate_half")
  %t: f32[3,8] = concatenate(%f, %f) {axis = 1} loc("/emb")
  %bt: f32[1,4,3,8] = broadcast_in_dim(%t) {dims = [2, 3], shape = [1, 4, 3, 8]} loc("/bt")
  %y: f32[1,4,3,8] = mul(%r, %bt) loc("/mul")
  %z: f32[1,4,3,8] = add(%y, %x) loc("/add")
  %q: f32[1,4,9,8] = concatenate(%x, %z, %x) {axis = 2} loc("/three")
  return %q, %r
}
)";
  KernelModule m = lower_for_cuda(parse_graph(text));
  int concats = 0;
  for (const auto& n : m.graph->nodes()) concats += is_core_op(*n, CoreOp::concatenate);
  ASSERT_EQ(concats, 3) << "the test needs its concatenations to reach the kernel level";
  for (const auto& n : m.graph->nodes())
    if (is_core_op(*n, CoreOp::concatenate)) {
      EXPECT_TRUE(cuda::device_node_supported(*n)) << n->name;
    }
  const std::string src = cuda::generate_cuda(m, "concatenate");
  EXPECT_NE(src.find("(i3 < 4LL)"), std::string::npos) << src;   // rotate_half: the first half from -x2
  EXPECT_NE(src.find("(i2 - 3LL)"), std::string::npos) << src;    // the middle operand of the three
  if (cuda::built_with_cuda()) {
    cuda::NvrtcOptions o = cuda_test::nvrtc_options();
    o.use_cache = false;
    EXPECT_GT(cuda::compile_cuda_source(src, "concatenate", o).cubin.size(), 1000u);
  }
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  const Tensor x = cuda_test::ramp({1, 4, 3, 8}), f = cuda_test::ramp({3, 4});
  auto exe = compile_cuda(parse_graph(text), {x, f});
  EXPECT_EQ(exe->stats().host_steps, 0);
  const std::vector<Tensor> want = run_eager(*parse_graph(text), {x, f});
  for (int call = 0; call < 3; ++call)
    testenv::expect_matches_reference(exe->run({x, f}), want, "concatenate call " + std::to_string(call), 0);
  EXPECT_TRUE(exe->uses_graph());
}

namespace {

// A matmul, a softmax over its rows, an integer input passed through and an output that is a reshape of
// the input: what run_device copies in and out (f32, i64, an alias of an input's buffer).
const char* const kPointerModel = R"(graph @pointers(%x: f32[4,16], %w: f32[16,64], %i: i64[3]) {
  %y: f32[4,64] = MatMul(%x, %w) loc("/mm")
  %p: f32[4,64] = Softmax(%y) {axis = -1} loc("/softmax")
  %r: f32[64] = reshape(%x) {shape = [64]} loc("/reshape")
  return %p, %i, %r
}
)";

struct DeviceTensor {
  uint64_t p = 0;
  size_t bytes = 0;
  explicit DeviceTensor(size_t n) : p(cuda::device_alloc(n)), bytes(n) {}
  DeviceTensor(const DeviceTensor&) = delete;
  ~DeviceTensor() { cuda::device_free(p); }
};

size_t bytes_of(const TensorType& t) { return static_cast<size_t>(shape_numel(t.shape)) * dtype_size(t.dtype); }

Tensor read_back(const DeviceTensor& d, const TensorType& t) {
  Tensor h(t.dtype, t.shape);
  cuda::copy_to_host(h.bytes(), d.p, h.nbytes());
  return h;
}

}  // namespace

// The device-pointer call (CudaExecutable::run_device): inputs and outputs in the caller's device memory,
// on the caller's stream; new output addresses on every call (eager first call, captured second, replayed
// after) give the eager interpreter's results, at f32 and at bf16 storage (inputs converted on the device).
TEST(CudaBackend, DevicePointerCallMatchesEager) {
  const auto parsed = parse_graph(kPointerModel);
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  const Tensor x = cuda_test::ramp({4, 16}), w = cuda_test::ramp({16, 64}, 5, 400.0f);  // logits within +-3: bf16 weights stay within 2e-2 after the softmax
  Tensor i(DType::i64, {3});
  for (int k = 0; k < 3; ++k) i.data<int64_t>()[k] = 7 - 100 * k;
  const std::vector<Tensor> eager = run_eager(*parse_graph(kPointerModel), {x, w, i});
  for (cuda::Precision p : {cuda::Precision::f32, cuda::Precision::bf16}) {
    CudaBackendOptions o;
    o.precision = p;
    auto exe = compile_cuda(parse_graph(kPointerModel), {x, w, i}, o);
    ASSERT_EQ(exe->input_types().size(), 3u);
    ASSERT_EQ(exe->output_types().size(), 3u);
    EXPECT_EQ(exe->output_types()[0].shape, (Shape{4, 64}));
    DeviceTensor dx(x.nbytes()), dw(w.nbytes()), di(i.nbytes());
    cuda::copy_to_device(dx.p, x.bytes(), x.nbytes());
    cuda::copy_to_device(dw.p, w.bytes(), w.nbytes());
    cuda::copy_to_device(di.p, i.bytes(), i.nbytes());
    const uint64_t stream = cuda::stream_create();
    for (int call = 0; call < 4; ++call) {
      std::vector<std::unique_ptr<DeviceTensor>> outs;
      std::vector<uint64_t> optrs;
      for (const TensorType& t : exe->output_types()) {
        outs.push_back(std::make_unique<DeviceTensor>(bytes_of(t)));
        optrs.push_back(outs.back()->p);
      }
      exe->run_device({dx.p, dw.p, di.p}, optrs, stream);
      cuda::stream_synchronize(stream);
      std::vector<Tensor> got;
      for (size_t k = 0; k < outs.size(); ++k) got.push_back(read_back(*outs[k], exe->output_types()[k]));
      testenv::expect_matches_reference(got, eager, fmt::format("{} call {}", cuda::precision_name(p), call),
                                        p == cuda::Precision::f32 ? 1e-5 : 2e-2);
    }
    EXPECT_TRUE(exe->uses_graph());
    EXPECT_GT(exe->recapture_ms(2), 0.0);
    // the host-tensor call on the same executable still agrees after device calls
    testenv::expect_matches_reference(exe->run({x, w, i}), eager, "run() after run_device", p == cuda::Precision::f32 ? 1e-5 : 2e-2);
    cuda::stream_destroy(stream);
  }
}

// Wrong pointer counts and null pointers are one-line errors, not crashes.
TEST(CudaBackend, DevicePointerCallChecksItsArguments) {
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  auto exe = compile_cuda(parse_graph(kSoftmax));
  DeviceTensor a(2 * 64 * 4), b(2 * 64 * 4);
  for (auto call : {std::function<void()>([&] { exe->run_device({}, {b.p}, 0); }),
                    std::function<void()>([&] { exe->run_device({a.p}, {b.p, b.p}, 0); }),
                    std::function<void()>([&] { exe->run_device({0}, {b.p}, 0); }),
                    std::function<void()>([&] { exe->run_device({a.p}, {0}, 0); })}) {
    try {
      call();
      FAIL() << "bad arguments passed";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(exe->run_device({a.p}, {b.p}, 0));
  cuda::stream_synchronize(0);
}
