// Symbolic sizes on the compiled CPU backend (docs/dynamic-shapes.md): one compilation of a graph with
// size symbols runs every binding its facts allow, each against the eager interpreter on the same
// inputs; a binding outside them is refused with the reason.
#include <gtest/gtest.h>

#include "graph_test_util.h"
#include "tessel/ir/bind.h"
#include "tessel/ir/printer.h"
#include "tessel/runtime/compiled_backend.h"
#include "tessel/runtime/graph_backend.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/targets/cpu/codegen.h"
#include "test_util.h"

using namespace tessel;

namespace {

// Softmax over the rows of x·w, with a symbolic row count.
const char* kRowsSoftmax = R"(graph @sm(%x: f32[s0,64], %w: f32[64,32]) symbols(s0 in [1, 4096]) {
  %h: f32[s0,32] = dot_general(%x, %w) {lhs_batch = ints[], lhs_contract = [1], rhs_batch = ints[], rhs_contract = [0]} loc("mm")
  %m: f32[s0] = reduce(%h) {axes = [1], kind = "max"} loc("max")
  %mb: f32[s0,32] = broadcast_in_dim(%m) {dims = [0], shape = dims[s0, 32]} loc("max")
  %mn: f32[s0,32] = neg(%mb) loc("sub")
  %d: f32[s0,32] = add(%h, %mn) loc("sub")
  %e: f32[s0,32] = exp(%d) loc("exp")
  %s: f32[s0] = reduce(%e) {axes = [1], kind = "sum"} loc("sum")
  %sb: f32[s0,32] = broadcast_in_dim(%s) {dims = [0], shape = dims[s0, 32]} loc("sum")
  %y: f32[s0,32] = div(%e, %sb) loc("div")
  return %y
}
)";

using testenv::varied_f32;
CompiledBackendOptions options() { return testenv::compiled_test_options(); }

void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<double> a = got.to_f64(), b = want.to_f64();
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], tol * (1 + std::abs(b[i]))) << what << " element " << i;
}

}  // namespace

// Both ways a symbolic compilation runs a binding: one executable rebound per binding (the default)
// and an instance per binding.
class DynamicCompiledBoth : public ::testing::TestWithParam<bool> {
 protected:
  CompiledBackendOptions opts() const {
    CompiledBackendOptions o = options();
    o.rebind = GetParam();
    return o;
  }
};
INSTANTIATE_TEST_SUITE_P(Ways, DynamicCompiledBoth, ::testing::Bool(),
                         [](const auto& i) { return i.param ? std::string("Rebound") : std::string("Instances"); });

TEST_P(DynamicCompiledBoth, OneCompilationServesEveryRowCount) {
  auto exe = compile_cpu(parse_graph(kRowsSoftmax, "sm.tsl"), {}, opts());
  ASSERT_TRUE(exe->symbolic());
  EXPECT_EQ(exe->stats().rebinding, GetParam()) << exe->stats().rebind_refused;
  EXPECT_EQ(exe->stats().symbols, std::vector<std::string>{"s0"});
  // the generated code takes the row count at run time (its loops only need it as the parallel range)
  EXPECT_NE(exe->source().find("sz[i] is the value of symbol i: s0."), std::string::npos) << exe->source();
  EXPECT_EQ(exe->source().find("1024"), std::string::npos) << "no size of a binding is baked in";
  const auto original = parse_graph(kRowsSoftmax, "sm.tsl");
  const Tensor w = varied_f32({64, 32}, 7);
  int calls = 0;
  for (int64_t rows : {1, 7, 100, 513, 7}) {
    const Tensor x = varied_f32({rows, 64}, static_cast<uint32_t>(rows));
    const std::vector<Tensor> want = run_eager(*original, {x, w});
    const std::vector<Tensor> got = exe->run({x, w});
    ASSERT_EQ(got.size(), 1u);
    expect_close(got[0], want[0], 1e-5, fmt::format("s0 = {}", rows));
    ++calls;
  }
  if (GetParam()) {  // rebound at every call whose binding differs from the call before
    EXPECT_EQ(exe->stats().instances, 0);
    EXPECT_EQ(exe->stats().rebinds, 5);
  } else {  // one instance per distinct binding; the repeated one is reused
    EXPECT_EQ(exe->stats().instances, 4);
  }
}

// A length that grows by one a call (a decoded token's KV length): the rebound executable keeps its arena
// plan while every buffer fits the eighth of room the plan gave it, plans again (bigger) when one
// outgrows it, and keeps the bigger plan for a shorter length; every call against eager.
TEST(DynamicCompiled, ArenaPlanKeptWhileEveryBufferFits) {
  CompiledBackendOptions o = options();
  o.rebind = true;
  auto exe = compile_cpu(parse_graph(kRowsSoftmax, "sm.tsl"), {}, o);
  ASSERT_TRUE(exe->stats().rebinding) << exe->stats().rebind_refused;
  const auto original = parse_graph(kRowsSoftmax, "sm.tsl");
  const Tensor w = varied_f32({64, 32}, 7);
  auto call = [&](int64_t rows) {
    const Tensor x = varied_f32({rows, 64}, static_cast<uint32_t>(rows));
    GraphRunStats st;
    const std::vector<Tensor> got = exe->run({x, w}, &st);
    expect_close(got.at(0), run_eager(*original, {x, w}).at(0), 1e-5, fmt::format("s0 = {}", rows));
    return st.arena_bytes;
  };
  const size_t first = call(96);
  ASSERT_GT(first, 0u);
  for (int64_t rows = 97; rows <= 108; ++rows) EXPECT_EQ(call(rows), first) << rows << " rows fit the plan for 96 and an eighth";
  const size_t grown = call(120);
  EXPECT_GT(grown, first) << "120 rows outgrow it";
  EXPECT_EQ(call(3), grown) << "a shorter length keeps the plan";
  EXPECT_EQ(call(121), grown);
}

// Two symbols changing one at a time, back and forth: what the rebound executable redoes for a changed
// symbol (types, views, the typed kernels of transposes, concatenations and products of computed
// operands, the arena plan) and what it keeps must agree with eager at every call.
TEST_P(DynamicCompiledBoth, SymbolsChangingOneAtATime) {
  const char* text = R"(graph @two(%x: f32[s0,s1], %c: f32[s0,8], %w: f32[8,8]) symbols(s0 in [1, 64], s1 in [1, 64]) {
  %m: f32[s0] = reduce(%x) {axes = [1], kind = "max"} loc("max")
  %mb: f32[s0,s1] = broadcast_in_dim(%m) {dims = [0], shape = dims[s0, s1]} loc("max")
  %mn: f32[s0,s1] = neg(%mb) loc("sub")
  %d: f32[s0,s1] = add(%x, %mn) loc("sub")
  %e: f32[s0,s1] = exp(%d) loc("exp")
  %t: f32[s1,s0] = transpose(%e) {perm = [1, 0]} loc("t")
  %p: f32[s1,8] = dot_general(%t, %c) {lhs_batch = ints[], lhs_contract = [1], rhs_batch = ints[], rhs_contract = [0]} loc("pv")
  %q: f32[s1,8] = dot_general(%p, %w) {lhs_batch = ints[], lhs_contract = [1], rhs_batch = ints[], rhs_contract = [0]} loc("proj")
  %k: f32[s0+s1,8] = concatenate(%c, %q) {axis = 0} loc("cat")
  %r: f32[s0+s1,8] = tanh(%k) loc("tanh")
  return %r, %e
}
)";
  auto exe = compile_cpu(parse_graph(text, "two.tsl"), {}, opts());
  EXPECT_EQ(exe->stats().rebinding, GetParam()) << exe->stats().rebind_refused;
  const auto original = parse_graph(text, "two.tsl");
  const Tensor w = varied_f32({8, 8}, 3);
  for (auto [r, c] : std::vector<std::pair<int64_t, int64_t>>{{2, 3}, {2, 5}, {4, 5}, {4, 5}, {1, 1}, {2, 3}, {64, 3}, {2, 64}}) {
    const Tensor x = varied_f32({r, c}, static_cast<uint32_t>(10 * r + c)), kc = varied_f32({r, 8}, static_cast<uint32_t>(r));
    const std::vector<Tensor> want = run_eager(*original, {x, kc, w});
    const std::vector<Tensor> got = exe->run({x, kc, w});
    ASSERT_EQ(got.size(), 2u);
    for (size_t i = 0; i < 2; ++i) expect_close(got[i], want[i], 1e-5, fmt::format("s0 = {}, s1 = {}, output {}", r, c, i));
  }
  if (GetParam()) {
    EXPECT_EQ(exe->stats().rebinds, 7) << "the repeated binding keeps what it has";
  }
}

// A static KV cache written at a symbolic number of positions (transformers' static cache: aten
// index_copy_ lowered to ScatterElements), then read whole by the next product: the scatter's loop
// takes the binding's row count, and the cache keeps its static size. Then the same with the new cache
// written over the caller's tensor (output_aliases, as tessel.compile asks for a mutated input): every
// binding's scatter writes its rows straight into the cache passed in (outputs_in_place), the product
// reads the new rows, and the cache after each call is eager's.
TEST_P(DynamicCompiledBoth, ScatterIntoAStaticCacheAtSymbolicPositions) {
  const char* text = R"(graph @kv(%cache: f32[32,8], %pos: i64[s0,8], %k: f32[s0,8], %q: f32[s0,8]) symbols(s0 in [1, 32]) {
  %c: f32[32,8] = ScatterElements(%cache, %pos, %k) {axis = 0} loc("write")
  %ct: f32[8,32] = Transpose(%c) {perm = [1, 0]} loc("t")
  %s: f32[s0,32] = MatMul(%q, %ct) loc("scores")
  return %s, %c
}
)";
  const auto original = parse_graph(text, "kv.tsl");
  for (const bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "written over the caller's cache" : "returned");
    CompiledBackendOptions o = opts();
    if (in_place) o.output_aliases = {-1, 0}, o.optional_aliases = true;
    auto exe = compile_cpu(parse_graph(text, "kv.tsl"), {}, o);
    ASSERT_TRUE(exe->symbolic());
    Tensor cache = varied_f32({32, 8}, 5);
    int64_t start = 0;
    for (int64_t t : {5, 1, 3, 7, 3}) {
      std::vector<int64_t> idx;
      for (int64_t r = 0; r < t; ++r)
        for (int64_t c = 0; c < 8; ++c) idx.push_back(start + r);
      const Tensor pos = Tensor::from_i64(DType::i64, {t, 8}, idx);
      const Tensor k = varied_f32({t, 8}, static_cast<uint32_t>(t + 1)), q = varied_f32({t, 8}, static_cast<uint32_t>(t + 2));
      const std::vector<Tensor> want = run_eager(*original, {cache.clone(), pos, k, q});
      const std::vector<Tensor> got = exe->run({cache, pos, k, q});
      ASSERT_EQ(got.size(), 2u);
      EXPECT_EQ(got[1].bytes() == cache.bytes(), in_place);
      for (size_t i = 0; i < 2; ++i) expect_close(got[i], want[i], 1e-5, fmt::format("s0 = {} at {}, output {}", t, start, i));
      if (in_place) expect_close(cache, want[1], 0, fmt::format("s0 = {} at {}, the caller's cache", t, start));
      cache = want[1];
      start += t;
    }
    // (a symbolic executable's plan figures are those of its last binding)
    EXPECT_EQ(exe->stats().graph.outputs_in_place, in_place ? 1 : 0);
  }
}

TEST(DynamicCompiled, BindingOutsideTheFactsIsRefusedWithTheReason) {
  auto exe = compile_cpu(parse_graph(kRowsSoftmax, "sm.tsl"), {}, options());
  const Tensor w = varied_f32({64, 32}, 7);
  try {
    exe->run({varied_f32({5000, 64}, 1), w});
    FAIL() << "a row count outside [1, 4096] ran";
  } catch (const GuardFailure& e) {
    EXPECT_NE(std::string(e.what()).find("s0 = 5000 is outside"), std::string::npos) << e.what();
  }
  try {
    exe->run({varied_f32({5, 64}, 1), varied_f32({63, 32}, 1)});
    FAIL() << "a wrong static dim ran";
  } catch (const GuardFailure& e) {
    EXPECT_NE(std::string(e.what()).find("dim 0 is 63, the model takes 64"), std::string::npos) << e.what();
  }
}

TEST(DynamicCompiled, BindSymbolsChecksEveryFact) {
  auto g = parse_graph(R"(graph @g(%a: f32[s0,8], %b: f32[s0,s1]) symbols(s0 in [1, 64] multiple_of 4, s1 in [2, 9]) {
  %y: f32[s0,8] = neg(%a) loc("n")
  return %y
}
)",
                       "g.tsl");
  Bindings b;
  EXPECT_EQ(bind_symbols(*g, {{8, 8}, {8, 3}}, b), "");
  EXPECT_EQ(b.at("s0"), 8);
  EXPECT_EQ(b.at("s1"), 3);
  EXPECT_NE(bind_symbols(*g, {{8, 8}, {4, 3}}, b).find("from an earlier dim"), std::string::npos);
  EXPECT_NE(bind_symbols(*g, {{6, 8}, {6, 3}}, b).find("not a multiple of 4"), std::string::npos);
  EXPECT_NE(bind_symbols(*g, {{8, 8}, {8, 1}}, b).find("outside"), std::string::npos);
  EXPECT_NE(bind_symbols(*g, {{8, 8}}, b).find("takes 2 inputs"), std::string::npos);
  EXPECT_NE(bind_symbols(*g, {{8}, {8, 3}}, b).find("rank"), std::string::npos);
}

// A binding whose sizes overflow, or need more memory than one allocation may have, is a one-line
// error naming what, never a crash or a wrapped size.
TEST(DynamicCompiled, SizesThatOverflowAreRefused) {
  auto exe = compile_cpu(parse_graph(R"(graph @cube(%x: f32[s0]) symbols(s0 in [1, 4000000]) {
  %y: f32[s0,s0,s0] = broadcast_in_dim(%x) {dims = [2], shape = dims[s0, s0, s0]} loc("cube")
  %z: f32[s0,s0] = reduce(%y) {axes = [0], kind = "sum"} loc("sum")
  return %z
}
)",
                                     "cube.tsl"),
                         {}, options());
  const std::vector<Tensor> small = exe->run({varied_f32({3}, 1)});
  EXPECT_EQ(small[0].shape(), (Shape{3, 3}));
  for (int64_t n : {3000000, 1000000}) {  // n^3 past INT64_MAX; n^3 * 4 bytes past any allocation limit
    try {
      exe->run({varied_f32({n}, 1)});
      ADD_FAILURE() << "s0 = " << n << " ran";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      EXPECT_TRUE(what.find("overflow") != std::string::npos || what.find("too large") != std::string::npos ||
                  what.find("limit") != std::string::npos)
          << what;
    }
  }
}

// A decode step's shape: one query row against a symbolic number of cached keys. The query's
// projection has the same sizes at every length, so each new length's instance takes that library
// call from the first. The attention's two products (two computed operands, N and K following the
// length) are loop kernels reading the length at run time: no library call to build per length.
TEST(DynamicCompiled, InstancesShareTheLibraryCallsWhoseSizesAgree) {
  auto g = parse_graph(R"(graph @decode(%x: f32[1,64], %kv: f32[s0,64], %w: f32[64,64]) symbols(s0 in [1, 512]) {
  %q: f32[1,64] = dot_general(%x, %w) {lhs_batch = ints[], lhs_contract = [1], rhs_batch = ints[], rhs_contract = [0]} loc("q_proj")
  %s: f32[1,s0] = dot_general(%q, %kv) {lhs_batch = ints[], lhs_contract = [1], rhs_batch = ints[], rhs_contract = [1]} loc("scores")
  %e: f32[1,s0] = tanh(%s) loc("tanh")
  %y: f32[1,64] = dot_general(%e, %kv) {lhs_batch = ints[], lhs_contract = [1], rhs_batch = ints[], rhs_contract = [0]} loc("values")
  return %y
}
)",
                       "decode.tsl");
  const auto original = parse_graph(print_graph(*g), "decode.tsl");
  // the projection's weights as a constant, as a model's are
  g->inputs.pop_back();
  Value* w = g->find_value("w");
  w->is_input = false;
  w->constant = varied_f32({64, 64}, 5);
  CompiledBackendOptions o = options();
  o.rebind = false;  // (the rebound executable keeps the projection's call: DynamicCompiledBoth)
  auto exe = compile_cpu(std::move(g), {}, o);
  const Tensor x = varied_f32({1, 64}, 1);
  for (int64_t len : {3, 5, 9}) {
    const Tensor kv = varied_f32({len, 64}, static_cast<uint32_t>(len));
    const std::vector<Tensor> got = exe->run({x, kv});
    expect_close(got[0], run_eager(*original, {x, kv, varied_f32({64, 64}, 5)})[0], 1e-5, fmt::format("length {}", len));
  }
  EXPECT_EQ(exe->stats().instances, 3);
  EXPECT_EQ(exe->stats().library_reused, 2) << "the projection, taken by the second and third instances";
  EXPECT_EQ(exe->stats().matmul_kernels, 1) << "only the projection is a library call";
}
