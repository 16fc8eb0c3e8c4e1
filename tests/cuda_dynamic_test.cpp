// The CUDA target with size symbols (docs/dynamic-shapes.md, "On CUDA"): a decode step's attention over a
// KV cache of symbolic length is generated and compiled once, every function taking the symbols as
// parameters; each new length makes that binding's steps without compiling again and matches the eager
// interpreter; a length outside the symbol's range or a wrong static dim is a one-line guard error.
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>
#include <string>

#include "tessel/driver/random_graph.h"
#include "tessel/ir/bind.h"
#include "tessel/ir/printer.h"
#include "tessel/runtime/cuda_backend.h"
#include "tessel/runtime/graph_backend.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"
#include "tessel/targets/cuda/codegen.h"
#include "tessel/targets/cuda/toolchain.h"
#include "corpus_util.h"
#include "cuda_test_util.h"
#include "test_util.h"

using namespace tessel;

namespace {

// One decode step of 4 heads over a cache of s0 positions: the new key and value concatenated onto the
// caches (the new caches are outputs), the scores against the cache's keys, a softmax over s0+1
// positions, the product with the values, and the last position of the new key cache sliced out.
const char* const kDecode = R"(graph @decode(%q: f32[1,4,1,16], %kc: f32[1,4,s0,16], %kn: f32[1,4,1,16], %vc: f32[1,4,s0,16], %vn: f32[1,4,1,16], %ids: i64[1,4,2,16]) symbols(s0 in [1, 4096]) {
  %k: f32[1,4,s0+1,16] = concatenate(%kc, %kn) {axis = 2} loc("/k_cache")
  %v: f32[1,4,s0+1,16] = concatenate(%vc, %vn) {axis = 2} loc("/v_cache")
  %kt: f32[1,4,16,s0+1] = transpose(%k) {perm = [0, 1, 3, 2]} loc("/kt")
  %s: f32[1,4,1,s0+1] = dot_general(%q, %kt) {lhs_batch = [0, 1], lhs_contract = [3], rhs_batch = [0, 1], rhs_contract = [2]} loc("/scores")
  %m: f32[1,4,1] = reduce(%s) {axes = [3], kind = "max"} loc("/softmax")
  %mb: f32[1,4,1,s0+1] = broadcast_in_dim(%m) {dims = [0, 1, 2], shape = dims[1, 4, 1, s0+1]} loc("/softmax")
  %n: f32[1,4,1,s0+1] = neg(%mb) loc("/softmax")
  %d: f32[1,4,1,s0+1] = add(%s, %n) loc("/softmax")
  %e: f32[1,4,1,s0+1] = exp(%d) loc("/softmax")
  %z: f32[1,4,1] = reduce(%e) {axes = [3], kind = "sum"} loc("/softmax")
  %zb: f32[1,4,1,s0+1] = broadcast_in_dim(%z) {dims = [0, 1, 2], shape = dims[1, 4, 1, s0+1]} loc("/softmax")
  %p: f32[1,4,1,s0+1] = div(%e, %zb) loc("/softmax")
  %o: f32[1,4,1,16] = dot_general(%p, %v) {lhs_batch = [0, 1], lhs_contract = [3], rhs_batch = [0, 1], rhs_contract = [2]} loc("/attn")
  %last: f32[1,4,1,16] = slice(%k) {starts = dims[0, 0, s0, 0], stops = dims[1, 4, s0+1, 16], strides = [1, 1, 1, 1]} loc("/last")
  %pos: i64[1,s0+1] = iota() {shape = dims[1, s0+1], axis = 1, dtype = "i64"} loc("/positions")
  %picked: f32[1,4,2,16] = gather(%v, %ids) {axis = 2} loc("/picked")
  return %o, %k, %v, %last, %pos, %picked
}
)";

std::vector<Tensor> decode_inputs(int64_t len) {
  Tensor ids(DType::i64, {1, 4, 2, 16});  // positions in the new value cache, some counted from its end
  for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int64_t>()[i] = i % 3 == 0 ? -1 - i % (len + 1) : (i * 7) % (len + 1);
  return {cuda_test::ramp({1, 4, 1, 16}, 1), cuda_test::ramp({1, 4, len, 16}, 2), cuda_test::ramp({1, 4, 1, 16}, 3),
          cuda_test::ramp({1, 4, len, 16}, 4), cuda_test::ramp({1, 4, 1, 16}, 5), ids};
}

}  // namespace

// Generation and NVRTC need no GPU: one translation unit for every length, each function taking S0 last.
TEST(CudaDynamic, GeneratedOnceWithSizeParameters) {
  std::unique_ptr<Graph> g;
  try {
    g = parse_graph(kDecode);
  } catch (const Error& e) {
    FAIL() << e.what();
  }
  KernelModule m = lower_for_cuda(std::move(g));
  ASSERT_EQ(graph_symbols(*m.graph), std::vector<std::string>{"s0"});
  int device_nodes = 0, host_nodes = 0;
  for (const auto& n : m.graph->nodes()) {
    if (is_kernel_node(*n) || is_core_op(*n, CoreOp::reshape)) continue;
    (cuda::device_node_supported(*n) || cuda::device_matmul_spec(*n) ? device_nodes : host_nodes)++;
  }
  EXPECT_EQ(host_nodes, 0) << print_kernel_module(m, true);
  EXPECT_GE(device_nodes, 5) << "the concatenations, the slice, the iota and the gather run on the device";
  const std::string src = cuda::generate_cuda(m, "decode");
  // every generated function (all but the prelude's tsl_hold) ends its parameters with the symbol
  const std::regex fn(R"(__global__ void (tsl_[kn][0-9]+\w*)\(([^)]*)\))");
  int functions = 0;
  for (auto it = std::sregex_iterator(src.begin(), src.end(), fn); it != std::sregex_iterator(); ++it, ++functions) {
    const std::string params = (*it)[2];
    EXPECT_NE(params.rfind(", long long S0"), std::string::npos) << (*it)[1] << ": " << params;
  }
  EXPECT_GE(functions, 4);
  // the oracle the GPU tests compare with runs the graph at any length (and checks the gather's indices)
  for (int64_t len : {5, 300}) {
    const std::vector<Tensor> out = run_eager(*parse_graph(kDecode), decode_inputs(len));
    ASSERT_EQ(out.size(), 6u);
    EXPECT_EQ(out[4].shape(), (Shape{1, len + 1}));
    EXPECT_EQ(out[4].data<int64_t>()[len], len);
  }
  EXPECT_NE(src.find("(S0 + 1L)"), std::string::npos) << "the concatenated length, read at run time";
  if (cuda::built_with_cuda()) {
    cuda::NvrtcOptions o = cuda_test::nvrtc_options();
    o.use_cache = false;
    EXPECT_GT(cuda::compile_cuda_source(src, "decode", o).cubin.size(), 1000u);
  }
}

// On a GPU: one executable for lengths 5, 17, 300 and back, each equal to the eager interpreter; the
// NVRTC compilation happened once (the source never changes), each new length rebinds, and a length
// repeated is captured as a CUDA graph.
TEST(CudaDynamic, OneCompilationServesEveryLength) {
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  auto exe = compile_cuda(parse_graph(kDecode));
  ASSERT_TRUE(exe->symbolic());
  const std::string source = exe->source();
  const double nvrtc = exe->stats().nvrtc_seconds;
  const auto eager = parse_graph(kDecode);
  const int64_t lengths[] = {5, 17, 17, 17, 300, 5};
  for (int64_t len : lengths) {
    const std::vector<Tensor> in = decode_inputs(len);
    const std::vector<Tensor> want = run_eager(*eager, in);
    testenv::expect_matches_reference(exe->run(in), want, "length " + std::to_string(len), 1e-5);
    EXPECT_EQ(exe->output_types()[1].shape, (Shape{1, 4, len + 1, 16}));
    if (len == 17) {
      EXPECT_EQ(exe->stats().host_steps, 0);
    }
  }
  EXPECT_EQ(exe->stats().rebinds, 4);  // 5, 17, 300, 5
  EXPECT_EQ(exe->source(), source);
  EXPECT_EQ(exe->stats().nvrtc_seconds, nvrtc);
  // the same length twice in a row: the second call captured, the third replayed
  for (int i = 0; i < 3; ++i) exe->run(decode_inputs(9));
  EXPECT_TRUE(exe->uses_graph());
}

// Bad shapes: a length outside the symbol's range, a static dim that differs, a device call before any
// binding -- each one line, nothing run.
TEST(CudaDynamic, ShapesOutsideTheFactsAreGuardErrors) {
  if (!cuda::device_info().usable) GTEST_SKIP() << "no GPU: " << cuda::device_info().why;
  auto exe = compile_cuda(parse_graph(kDecode));
  EXPECT_THROW(exe->run_device({1, 2, 3, 4, 5}, {6, 7, 8, 9}, 0), Error);
  try {
    exe->run(decode_inputs(5000));
    ADD_FAILURE() << "a length of 5000 ran";
  } catch (const GuardFailure& e) {
    EXPECT_NE(std::string(e.what()).find("s0"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
  std::vector<Tensor> wrong = decode_inputs(8);
  wrong[0] = cuda_test::ramp({1, 4, 2, 16});
  EXPECT_THROW(exe->run(wrong), GuardFailure);
  wrong = decode_inputs(8);
  wrong[5].data<int64_t>()[3] = 9;  // a gather index past the new cache's 9 positions: the call's error, not a read outside
  EXPECT_THROW(exe->run(wrong), Error);
  wrong = decode_inputs(8);
  wrong[0] = cuda_test::ramp({1, 4, 2, 16});
  EXPECT_THROW(exe->run(wrong), GuardFailure);
  testenv::expect_matches_reference(exe->run(decode_inputs(8)), run_eager(*parse_graph(kDecode), decode_inputs(8)), "after the errors", 1e-5);
}

// Random graphs with a size symbol (docs/random-graphs.md, the symbolic mode) through the CUDA target's
// lowering and generator: every one that lowers gives source NVRTC compiles (no size printed as a number
// where it is a symbol, no conversion of a symbolic size refused halfway); on a GPU each runs at the
// symbol's lowest and highest value against the eager interpreter.
TEST(CudaDynamic, RandomSymbolicGraphsGenerateAndCompile) {
  int count = 120;
  if (const char* c = std::getenv("TESSEL_RANDGRAPH_COUNT")) count = std::atoi(c);
  const bool gpu = cuda::device_info().usable;
  int symbolic = 0, compiled = 0, ran = 0;
  std::string source;  // every graph's functions in one translation unit per batch of 20 (NVRTC's time is per call)
  auto flush = [&](const std::string& what) {
    if (source.empty() || !cuda::built_with_cuda()) return;
    cuda::NvrtcOptions o = cuda_test::nvrtc_options();
    o.use_cache = false;
    try {
      cuda::compile_cuda_source(cuda::cuda_prelude() + source, "random", o);
    } catch (const Error& e) {
      ADD_FAILURE() << what << ": " << e.what();
    }
    source.clear();
  };
  for (int seed = 1; seed <= count; ++seed) {
    auto g = randgraph::random_graph(static_cast<uint64_t>(seed));
    auto sym = randgraph::symbolize(*g, "s");
    if (!sym) continue;
    ++symbolic;
    const std::string text = print_graph(*sym);
    KernelModule m;
    try {
      m = lower_for_cuda(parse_graph(text));
    } catch (const Error& e) {
      continue;  // (the pipeline's refusals are the CPU's too; the symbolic random-graph test covers them)
    }
    if (graph_symbols(*m.graph).empty()) continue;
    std::string src;
    try {
      src = cuda::generate_cuda(m, "random");
    } catch (const Error& e) {
      ADD_FAILURE() << "seed " << seed << ": " << e.what() << "\n" << text;
      continue;
    }
    ++compiled;
    // (one unit per batch: the functions' names carry the seed so that they do not collide)
    const size_t body = src.find("extern \"C\" __global__ void tsl_hold");
    std::string fns = src.substr(src.find('\n', src.find("\n}\n", body) + 1));
    fns = std::regex_replace(fns, std::regex(R"(\btsl_([kn][0-9]+))"), "tsl_r" + std::to_string(seed) + "_$1");
    source += fns;
    if (compiled % 20 == 0) flush("seeds up to " + std::to_string(seed));
    if (!gpu) continue;
    const auto parsed = parse_graph(text);
    const Graph& sg = *parsed;
    for (const int64_t at : {int64_t{0}, int64_t{16}}) {
      Bindings b;
      for (const auto& [name, info] : sg.symbols.all()) b[name] = std::min(info.hi, info.lo + at);
      const auto bound = instantiate_graph(sg, b);
      const std::vector<Tensor> in = randgraph::random_inputs(*bound, static_cast<uint64_t>(seed));
      std::vector<Tensor> want;
      try {
        want = run_eager(*bound, in);
      } catch (const Error&) {
        break;
      }
      auto exe = compile_cuda(parse_graph(text));
      testenv::expect_matches_reference(exe->run(in), want, "seed " + std::to_string(seed), 1e-4);
      ++ran;
    }
  }
  flush("the last seeds");
  std::printf("symbolic %d, generated %d, ran %d\n", symbolic, compiled, ran);
  EXPECT_GT(symbolic, count / 4);
  EXPECT_GT(compiled, symbolic / 2) << "most symbolic graphs lower for CUDA";
  if (gpu) {
    EXPECT_GT(ran, compiled);
  }
}
