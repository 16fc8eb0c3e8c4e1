// The graph backend (src/tessel/runtime/graph_backend.h): every corpus model gives the reference
// outputs with no more peak memory than eager, the arena planner never lets live buffers share bytes
// and does reuse dead ones, guards catch a changed shape-determining input, and the docs example
// shows what the planner produces.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>

#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/ir/printer.h"
#include "tessel/ir/verifier.h"
#include "tessel/kernel/arena_plan.h"
#include "tessel/runtime/graph_backend.h"
#include "tessel/runtime/interpreter.h"
#include "corpus_util.h"

using namespace tessel;

namespace {

class GraphCorpus : public ::testing::TestWithParam<std::string> {};

std::string ops_list(const std::map<std::string, int>& m) {
  std::string s;
  for (const auto& [op, n] : m) s += (s.empty() ? "" : ", ") + op + "×" + std::to_string(n);
  return s;
}

}  // namespace

TEST_P(GraphCorpus, MatchesReferenceWithNoMorePeakMemoryThanEager) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared/models";
  auto c = testenv::load_corpus_model(GetParam());
  RunStats eager;
  run_eager(*c.model.graph, c.inputs, &eager);
  auto exe = compile_graph(std::move(c.model.graph), c.inputs);
  GraphRunStats gs;
  auto outs = exe->run(c.inputs, &gs);
  testenv::expect_matches_reference(outs, c.refs, GetParam());
  EXPECT_LE(gs.peak_bytes, eager.peak_bytes) << GetParam() << ": arena " << gs.arena_bytes << ", heap peak "
                                             << gs.heap_peak_bytes;
  EXPECT_FALSE(plan_has_conflict(exe->buffer_requests(), exe->plan()));
  // A second call reuses the arena and gives the same results.
  auto again = exe->run(c.inputs);
  ASSERT_EQ(again.size(), outs.size());
  for (size_t i = 0; i < outs.size(); ++i) EXPECT_TRUE(again[i].same_as(outs[i])) << GetParam() << " output " << i;
}

// Once every op of a model has a decomposition, nothing runs through the reference kernels: no node
// outside the core level (only NonZero's data-dependent region may stay there) and no core op
// without a typed kernel.
TEST_P(GraphCorpus, NoReferenceFallbacks) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared/models";
  auto c = testenv::load_corpus_model(GetParam());
  auto exe = compile_graph(std::move(c.model.graph), c.inputs);
  const GraphCompileStats& s = exe->stats();
  EXPECT_EQ(s.pipeline_error, "") << GetParam();
  EXPECT_EQ(s.fallback_count(), 0) << GetParam() << ": core ops without a typed kernel: " << ops_list(s.fallback);
  if (GetParam() == "nonzero_break") {
    EXPECT_EQ(s.dynamic.count("NonZero"), 1u) << ops_list(s.dynamic);
  } else {
    EXPECT_EQ(s.dynamic_count(), 0) << GetParam() << ": not decomposed to core ops: " << ops_list(s.dynamic);
  }
}

INSTANTIATE_TEST_SUITE_P(Corpus, GraphCorpus,
                         ::testing::Values("tblock_s", "tblock_s_dynamo", "tblock_bert", "ffn_s", "attn_s", "bert_tiny",
                                           "gpt2_tiny", "mobilenet_v2", "nonzero_break"),
                         [](const auto& info) { return info.param; });

TEST(ArenaPlan, DisjointLifetimesShareAndOverlappingOnesDoNot) {
  // a lives over steps 0-1, b over 1-2, c over 2-3: a and c may share, b must not touch either.
  std::vector<BufferRequest> reqs = {{1000, 0, 1}, {1000, 1, 2}, {1000, 2, 3}};
  ArenaPlan p = plan_arena(reqs, 64);
  EXPECT_EQ(p.offsets[0], p.offsets[2]);
  EXPECT_NE(p.offsets[0], p.offsets[1]);
  EXPECT_EQ(p.size, 2048u);
  EXPECT_EQ(p.lower_bound, 2048u);
  EXPECT_FALSE(plan_has_conflict(reqs, p));
  for (size_t off : p.offsets) EXPECT_EQ(off % 64, 0u);
}

TEST(ArenaPlan, SmallBufferFillsAGapBetweenLiveOnes) {
  // a (4096, 0-3) and b (4096, 0-3) stay live; c (4096, 0-0) dies and leaves a gap between them at
  // the start; d (1000, 2-3) goes into that gap instead of on top.
  std::vector<BufferRequest> reqs = {{4096, 0, 3}, {4096, 0, 0}, {4096, 0, 3}, {1000, 2, 3}};
  ArenaPlan p = plan_arena(reqs, 64);
  EXPECT_FALSE(plan_has_conflict(reqs, p));
  EXPECT_EQ(p.size, 3u * 4096);
  EXPECT_EQ(p.offsets[3], p.offsets[1]);
}

TEST(ArenaPlan, RandomRequestsNeverConflict) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<BufferRequest> reqs;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      int a = static_cast<int>(rng() % 30), b = static_cast<int>(rng() % 30);
      reqs.push_back({static_cast<size_t>(rng() % 5000), std::min(a, b), std::max(a, b)});
    }
    ArenaPlan p = plan_arena(reqs, 64);
    ASSERT_FALSE(plan_has_conflict(reqs, p)) << "trial " << trial;
    EXPECT_GE(p.size, p.lower_bound);
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_LE(p.offsets[i] + reqs[i].bytes, p.size);
  }
}

namespace {

// x: f32[6] reshaped to the value of the i64[2] input `shape`: the result's shape is only known from
// the input's value.
std::unique_ptr<Graph> reshape_by_input() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input("x", TensorType{DType::f32, {6}});
  Value* s = g->add_input("shape", TensorType{DType::i64, {2}});
  Node* n = g->add_node(OpRegistry::get().find("Reshape"), "r", {x, s}, {"y"});
  Node* e = g->add_node(OpRegistry::get().find("Exp"), "e", {n->outputs[0]}, {"z"});
  g->outputs = {e->outputs[0]};
  infer_graph(*g);
  return g;
}

Tensor ints(std::vector<int64_t> v) { return Tensor::from_i64(DType::i64, {static_cast<int64_t>(v.size())}, v); }

}  // namespace

TEST(GraphBackend, GuardCatchesAChangedShapeInput) {
  std::vector<double> xs = {0, 1, 2, 3, 4, 5};
  Tensor x = Tensor::from_f64(DType::f32, {6}, xs);
  auto exe = compile_graph(reshape_by_input(), {x, ints({2, 3})});
  ASSERT_EQ(exe->stats().baked_inputs, std::vector<std::string>{"shape"});
  for (const auto& v : exe->graph().values())  // with the value baked, every shape is static
    EXPECT_TRUE(shape_known(v->type.shape)) << v->name;
  auto out = exe->run({x, ints({2, 3})});
  ASSERT_EQ(out[0].shape(), (Shape{2, 3}));
  EXPECT_NEAR(out[0].get_f(5), std::exp(5.0), 1e-4);
  EXPECT_THROW(exe->run({x, ints({3, 2})}), GuardFailure);
  try {
    exe->run({x, ints({3, 2})});
  } catch (const GuardFailure& e) {
    EXPECT_NE(std::string(e.what()).find("'shape'"), std::string::npos) << e.what();
  }
  // Recompiling for the new value works.
  auto exe2 = compile_graph(reshape_by_input(), {x, ints({3, 2})});
  EXPECT_EQ(exe2->run({x, ints({3, 2})})[0].shape(), (Shape{3, 2}));
}

TEST(GraphBackend, WithoutExamplesShapesStayDynamicAndRunByReference) {
  std::vector<double> xs = {0, 1, 2, 3, 4, 5};
  Tensor x = Tensor::from_f64(DType::f32, {6}, xs);
  auto exe = compile_graph(reshape_by_input());
  EXPECT_TRUE(exe->stats().baked_inputs.empty());
  EXPECT_GE(exe->stats().dynamic_count(), 1);
  auto a = exe->run({x, ints({2, 3})});
  auto b = exe->run({x, ints({3, 2})});
  EXPECT_EQ(a[0].shape(), (Shape{2, 3}));
  EXPECT_EQ(b[0].shape(), (Shape{3, 2}));
}

TEST(GraphBackend, WrongInputTypeIsAGuardFailure) {
  std::vector<double> xs = {0, 1, 2, 3, 4, 5};
  Tensor x = Tensor::from_f64(DType::f32, {6}, xs);
  auto exe = compile_graph(reshape_by_input(), {x, ints({2, 3})});
  Tensor x64 = Tensor::from_f64(DType::f64, {6}, xs);
  EXPECT_THROW(exe->run({x64, ints({2, 3})}), GuardFailure);
  EXPECT_THROW(exe->run({x}), Error);
}

TEST(GraphBackend, DataErrorsNameTheNode) {
  auto g = std::make_unique<Graph>();
  Value* d = g->add_input("d", TensorType{DType::f32, {1, 4}});
  Value* i = g->add_input("i", TensorType{DType::i64, {1, 2}});  // rank 2: not baked
  Node* n = g->add_node(OpRegistry::get().find("GatherElements"), "my_gather", {d, i}, {"y"}, {{"axis", int64_t{1}}});
  g->outputs = {n->outputs[0]};
  infer_graph(*g);
  Tensor dv = Tensor::from_f64(DType::f32, {1, 4}, std::vector<double>{1, 2, 3, 4});
  auto idx = [](int64_t a, int64_t b) { return Tensor::from_i64(DType::i64, {1, 2}, std::vector<int64_t>{a, b}); };
  auto exe = compile_graph(std::move(g), {dv, idx(0, 1)});
  EXPECT_TRUE(exe->stats().baked_inputs.empty());
  EXPECT_EQ(exe->run({dv, idx(3, -1)})[0].to_f64(), (std::vector<double>{4, 4}));
  try {
    exe->run({dv, idx(0, 9)});
    FAIL() << "an out-of-range index must be an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("my_gather"), std::string::npos) << e.what();
  }
}

// docs/runtime/graph-backend.md: the worked example's plan table is what the planner produces.
TEST(GraphBackend, DocsWorkedExample) {
  std::string md = testenv::read_text(testenv::source_dir() + "/docs/runtime/graph-backend.md");
  auto block = [&](const std::string& open) {
    auto b = md.find(open);
    if (b == std::string::npos) return std::string();
    b += open.size();
    return md.substr(b, md.find("```", b) - b);
  };
  std::string text = block("```tsl\n"), table = block("```text plan\n");
  ASSERT_FALSE(text.empty() || table.empty()) << "the page needs a ```tsl block and a ```text plan block";
  auto g = parse_graph(text, "docs/runtime/graph-backend.md");
  verify_graph(*g);
  Tensor x = Tensor::from_f64(DType::f32, {4, 8}, std::vector<double>(32, 0.5));
  auto exe = compile_graph(std::move(g), {x});
  EXPECT_EQ(describe_plan(*exe), table);
}

// `tessel run MODEL --backend graph --check` prints what compiling decided and the memory, and passes.
TEST(GraphBackend, CliRunGraphBackendCheck) {
  const std::string cmd = testenv::tessel_binary() + " run " + testenv::source_dir() + "/examples/tblock_s --backend graph --check 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << out;
  for (const char* want : {"compiled for the graph backend in", "reference fallbacks", "dynamic region", "ran graph in",
                           "peak intermediate memory", "arena plan", "PASS"})
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
}

// Transposes of the last two dims (attention's Kᵀ) go through 8 x 8 blocks transposed in registers for
// 4-byte elements where the CPU has AVX2, the edges element by element; any other permutation walks the
// copy plan. Every case equals the eager interpreter's result bit for bit, at sizes with and without edges.
TEST(GraphBackend, TransposesAreBitExactAtEverySize) {
  std::mt19937 rng(7);
  std::normal_distribution<double> normal;
  for (const char* dt : {"f32", "i32", "f16", "f64"}) {
    for (const Shape& s : std::vector<Shape>{{4, 300, 32}, {3, 37, 45}, {2, 8, 8}, {1, 16, 24}, {5, 9, 17}, {64, 64}, {2, 3, 40, 33}}) {
      for (const bool last_two : {true, false}) {
        const size_t r = s.size();
        std::vector<int64_t> perm(r);
        std::iota(perm.begin(), perm.end(), 0);
        if (last_two) std::swap(perm[r - 1], perm[r - 2]);
        else std::rotate(perm.begin(), perm.begin() + 1, perm.end());
        Shape out;
        for (int64_t d : perm) out.push_back(s[static_cast<size_t>(d)]);
        const std::string text = fmt::format(
            "graph @t(%x: {0}[{1}]) {{\n  %y: {0}[{2}] = transpose(%x) {{perm = [{3}]}} loc(\"t\")\n  return %y\n}}\n", dt,
            fmt::join(s, ","), fmt::join(out, ","), fmt::join(perm, ", "));
        auto g = parse_graph(text, "transpose");
        verify_graph(*g);
        std::vector<double> v(static_cast<size_t>(shape_numel(s)));
        for (double& e : v) e = std::string(dt) == "i32" ? std::round(normal(rng) * 1000) : normal(rng);
        const Tensor t = Tensor::from_f64(g->inputs[0]->type.dtype, s, v);
        const std::vector<Tensor> want = run_eager(*g, {t});
        auto exe = compile_graph(std::move(g), {t});
        const std::vector<Tensor> got = exe->run({t});
        ASSERT_EQ(got[0].nbytes(), want[0].nbytes());
        EXPECT_EQ(std::memcmp(got[0].bytes(), want[0].bytes(), static_cast<size_t>(want[0].nbytes())), 0)
            << dt << " " << text;
      }
    }
  }
}

// A gather whose index is a broadcast (Resize's positions along one axis: decompose_util's
// take_along_axis) reads the index through its view: the broadcast is never materialised at the
// output's size. Bit-exact against eager on the row-copy path (index varying along the axis only), the
// element path (the last axis) and the general strided path (an index varying along two dims), with
// i32 and negative indices; an index out of range is an error naming the node.
TEST(GraphBackend, GatherReadsABroadcastIndexThroughItsView) {
  struct Case {
    Shape x;
    int64_t axis;
    Shape idx;                 // the index operand before the broadcast
    std::vector<int64_t> dims; // where its dims go in the output
    const char* it;
  };
  const std::vector<Case> cases = {
      {{2, 3, 40, 33}, 2, {57}, {2}, "i64"},       // rows of 33 copied
      {{2, 3, 40, 33}, 3, {70}, {3}, "i64"},       // the last axis: element by element
      {{40, 5, 6}, 0, {19}, {0}, "i32"},           // nothing outside
      {{2, 3, 40, 33}, 2, {57, 33}, {2, 3}, "i64"},  // varies along two dims: the strided loop
  };
  std::mt19937 rng(11);
  std::normal_distribution<double> normal;
  for (const Case& c : cases) {
    Shape out = c.x;
    for (size_t i = 0; i < c.dims.size(); ++i) out[static_cast<size_t>(c.dims[i])] = c.idx[i];
    const std::string text = fmt::format(
        "graph @g(%x: f32[{0}], %i: {1}[{2}]) {{\n"
        "  %b: {1}[{3}] = broadcast_in_dim(%i) {{dims = [{4}], shape = [{5}]}} loc(\"b\")\n"
        "  %y: f32[{3}] = gather(%x, %b) {{axis = {6}}} loc(\"take\")\n"
        "  return %y\n}}\n",
        fmt::join(c.x, ","), c.it, fmt::join(c.idx, ","), fmt::join(out, ","), fmt::join(c.dims, ", "),
        fmt::join(out, ", "), c.axis);
    const int64_t n = c.x[static_cast<size_t>(c.axis)];
    std::vector<double> xv(static_cast<size_t>(shape_numel(c.x))), iv(static_cast<size_t>(shape_numel(c.idx)));
    for (double& e : xv) e = normal(rng);
    for (size_t k = 0; k < iv.size(); ++k) iv[k] = static_cast<double>(static_cast<int64_t>(rng() % (2 * n)) - n);
    auto g = parse_graph(text, "gather");
    verify_graph(*g);
    const Tensor x = Tensor::from_f64(DType::f32, c.x, xv);
    const Tensor i = Tensor::from_f64(g->inputs[1]->type.dtype, c.idx, iv);
    const std::vector<Tensor> want = run_eager(*g, {x, i});
    auto exe = compile_graph(std::move(g), {x, i});
    EXPECT_EQ(exe->stats().views, 1) << text;
    EXPECT_EQ(exe->stats().fallback_count(), 0) << text;
    const std::vector<Tensor> got = exe->run({x, i});
    ASSERT_EQ(got[0].nbytes(), want[0].nbytes());
    EXPECT_EQ(std::memcmp(got[0].bytes(), want[0].bytes(), static_cast<size_t>(want[0].nbytes())), 0) << text;
    std::vector<double> bad = iv;
    bad[bad.size() / 2] = static_cast<double>(n);
    try {
      exe->run({x, Tensor::from_f64(i.dtype(), c.idx, bad)});
      ADD_FAILURE() << "an index of " << n << " on a dim of " << n << " ran: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("take"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
    }
  }
}
