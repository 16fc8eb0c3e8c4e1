// Outputs in the caller's memory (GraphBackendOptions::output_aliases) and recycled output buffers
// (recycled_outputs), on the graph and compiled backends: an optimizer step updating its parameters
// and state in place gives the values the copying executable gives; outputs that cannot be written
// over their input are copied back after the last step; bad aliases are one-line errors.
#include <gtest/gtest.h>

#include <cmath>

#include "tessel/driver/optimizer.h"
#include "tessel/ir/printer.h"
#include "tessel/runtime/compiled_backend.h"
#include "tessel/runtime/graph_backend.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"

using namespace tessel;

namespace {

Tensor ramp(Shape s, double scale, double shift) {
  Tensor t(DType::f32, std::move(s));
  for (int64_t i = 0; i < t.numel(); ++i) t.set_f(i, std::sin(scale * static_cast<double>(i) + shift));
  return t;
}

std::vector<Tensor> scalars(const OptimizerSpec& spec, int64_t step) {
  std::vector<Tensor> ins;
  for (double s : optimizer_scalar_values(spec, 0.01, step)) ins.push_back(Tensor::from_f64(DType::f32, {}, std::vector<double>{s}));
  return ins;
}

// A graph compiled by the graph or the compiled backend (one thread) with output aliases: its run and
// its plan's figures.
struct Aliased {
  std::unique_ptr<GraphExecutable> ge;
  std::unique_ptr<CompiledExecutable> ce;
  Aliased(const std::string& backend, const std::string& text, std::vector<int> aliases) {
    if (backend == "graph") {
      GraphBackendOptions o;
      o.output_aliases = std::move(aliases);
      ge = compile_graph(parse_graph(text), {}, o);
    } else {
      CompiledBackendOptions o;
      o.threads = 1;
      o.output_aliases = std::move(aliases);
      ce = compile_cpu(parse_graph(text), {}, o);
    }
  }
  std::vector<Tensor> run(const std::vector<Tensor>& ins) { return ge ? ge->run(ins) : ce->run(ins); }
  const GraphCompileStats& stats() const { return ge ? ge->stats() : ce->stats().graph; }
};

}  // namespace

// AdamW over a small and a large (multi-threaded) parameter: with the aliases every output is written
// straight over its input (one fused loop reads p, g, m, v and writes p, m, v), and three steps give
// bit for bit what the executable returning fresh tensors gives.
TEST(InPlaceOutputs, AdamWUpdatesTheCallersTensors) {
  OptimizerSpec spec;
  spec.kind = "adamw";
  spec.shapes = {{5}, {96, 700}};
  spec.weight_decay = 0.01;
  CompiledBackendOptions co;
  co.threads = 2;
  auto copying = compile_cpu(build_optimizer_graph(spec), {}, co);
  co.output_aliases = optimizer_output_aliases(spec);
  ASSERT_EQ(co.output_aliases, (std::vector<int>{3, 5, 6, 7, 9, 10}));
  auto inplace = compile_cpu(build_optimizer_graph(spec), {}, co);
  EXPECT_EQ(inplace->stats().graph.outputs_in_place, 6);
  EXPECT_EQ(inplace->stats().graph.outputs_copied_back, 0);
  std::vector<Tensor> ref, mine;  // per parameter p, m, v
  for (size_t i = 0; i < spec.shapes.size(); ++i)
    for (int k = 0; k < 3; ++k) {
      Tensor t = k == 0 ? ramp(spec.shapes[i], 0.37, static_cast<double>(i)) : Tensor(DType::f32, spec.shapes[i]);
      ref.push_back(t.clone());
      mine.push_back(t.clone());
    }
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<Tensor> a = scalars(spec, step), b = scalars(spec, step);
    for (size_t i = 0; i < spec.shapes.size(); ++i) {
      const Tensor g = ramp(spec.shapes[i], 0.11 * static_cast<double>(step), 0.5);
      a.insert(a.end(), {ref[3 * i], g, ref[3 * i + 1], ref[3 * i + 2]});
      b.insert(b.end(), {mine[3 * i], g, mine[3 * i + 1], mine[3 * i + 2]});
    }
    std::vector<Tensor> out_ref = copying->run(a);
    std::vector<Tensor> out = inplace->run(b);
    ASSERT_EQ(out.size(), 6u);
    for (size_t k = 0; k < out.size(); ++k) {
      EXPECT_EQ(out[k].bytes(), mine[k].bytes()) << "output " << k << " is the caller's tensor";
      EXPECT_TRUE(mine[k].same_as(out_ref[k])) << "step " << step << " output " << k;
      ref[k] = out_ref[k];
    }
  }
  // The parameters moved (the test can fail): p after three steps differs from its start.
  EXPECT_FALSE(mine[0].same_as(ramp(spec.shapes[0], 0.37, 0)));
}

// An output whose kernel reads its input transposed, and one whose input a later step still reads,
// cannot be written over the input: both are computed in the arena and copied over it after the last
// step; every step saw the old value.
TEST(InPlaceOutputs, UnsafeOutputsAreCopiedBack) {
  const std::string text = R"(# tessel graph level
graph @g(%a: f32[3,3], %b: f32[3,3]) {
  %t: f32[3,3] = transpose(%a) {perm = [1, 0]} loc("t")
  %y: f32[3,3] = add(%t, %b) loc("y")
  %s: f32[3] = reduce(%b) {axes = [0], kind = "sum"} loc("s")
  %bs: f32[3,3] = broadcast_in_dim(%s) {dims = [1], shape = [3,3]} loc("bs")
  %z: f32[3,3] = mul(%b, %bs) loc("z")
  return %y, %z
}
)";
  for (const std::string backend : {"graph", "compiled"}) {
    SCOPED_TRACE(backend);
    const Tensor a0 = ramp({3, 3}, 0.7, 0.1), b0 = ramp({3, 3}, 0.3, 0.9);
    const std::vector<Tensor> want = Aliased(backend, text, {}).run({a0, b0});
    Tensor a = a0.clone(), b = b0.clone();
    Aliased exe(backend, text, {0, 1});
    const std::vector<Tensor> got = exe.run({a, b});
    const GraphCompileStats& st = exe.stats();
    EXPECT_EQ(st.outputs_copied_back + st.outputs_in_place, 2);
    // The compiled backend fuses the transpose into y's loop, which reads a transposed.
    if (backend == "compiled") {
      EXPECT_GE(st.outputs_copied_back, 1);
    }
    EXPECT_TRUE(a.same_as(want[0]));
    EXPECT_TRUE(b.same_as(want[1]));
    EXPECT_EQ(got[0].bytes(), a.bytes());
    EXPECT_EQ(got[1].bytes(), b.bytes());
    EXPECT_FALSE(a.same_as(a0));
  }
}

// A graph that returns its input a beside a result: an alias of a to output 1 cannot be taken.
const char* const kReturnsInputA = R"(# tessel graph level
graph @g(%a: f32[4], %b: f32[2]) {
  %y: f32[4] = exp(%a) loc("y")
  return %y, %a
}
)";

TEST(InPlaceOutputs, BadAliasesAreOneLineErrors) {
  const std::string text = kReturnsInputA;
  auto compile = [&](std::vector<int> aliases) {
    GraphBackendOptions o;
    o.output_aliases = std::move(aliases);
    return compile_graph(parse_graph(text), {}, o);
  };
  EXPECT_THROW(compile({5, -1}), Error);      // no such input
  EXPECT_THROW(compile({1, -1}), Error);      // f32[2] cannot hold f32[4]
  EXPECT_THROW(compile({0, -1}), Error);      // a is also returned
  EXPECT_THROW(compile({0}), Error);          // one alias per output
  try {
    compile({1, -1});
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

// Recycled outputs: a run reuses the buffer the caller dropped and allocates a new one while the
// caller still holds the last result, which keeps its values.
TEST(InPlaceOutputs, RecycledOutputsAreReusedOnlyWhenDropped) {
  const std::string text = R"(# tessel graph level
graph @g(%a: f32[64,300]) {
  %y: f32[64,300] = exp(%a) loc("y")
  return %y, %y
}
)";
  CompiledBackendOptions o;
  o.threads = 2;
  o.recycled_outputs = true;
  auto exe = compile_cpu(parse_graph(text), {}, o);
  EXPECT_EQ(exe->stats().graph.outputs_recycled, 1);
  const Tensor a = ramp({64, 300}, 0.01, 0), a2 = ramp({64, 300}, 0.02, 0);
  const uint8_t* first = nullptr;
  {
    std::vector<Tensor> y = exe->run({a});
    first = y[0].bytes();
    EXPECT_NEAR(y[0].get_f(7), std::exp(a.get_f(7)), 1e-5);
  }
  std::vector<Tensor> y1 = exe->run({a});
  EXPECT_EQ(y1[0].bytes(), first);  // dropped: reused
  std::vector<Tensor> y2 = exe->run({a2});
  EXPECT_NE(y2[0].bytes(), y1[0].bytes());  // held: a new buffer
  EXPECT_NEAR(y1[0].get_f(100), std::exp(a.get_f(100)), 1e-5);
  EXPECT_NEAR(y2[0].get_f(100), std::exp(a2.get_f(100)), 1e-5);
  // A value returned twice is two buffers: the caller may update one in place (`.grad +=`).
  EXPECT_NE(y2[1].bytes(), y2[0].bytes());
  EXPECT_TRUE(y2[1].same_as(y2[0]));
}

// A static KV cache's write: a scatter of two positions (one negative) into the cache along its length,
// the index a broadcast of the positions (a view the typed kernel reads through strides), the new cache
// read by a later step and returned as the cache's new value. Aliased, the scatter writes its two
// positions straight into the caller's cache (no copy of the cache); both backends give what the eager
// interpreter gives. An index out of range is an error that leaves the cache as it was.
TEST(InPlaceOutputs, AScatterWritesItsPositionsIntoTheCallersCache) {
  const std::string text = R"(# tessel graph level
graph @g(%cache: f32[2,6,3], %pos: i64[2], %u: f32[2,2,3]) {
  %idx: i64[2,2,3] = broadcast_in_dim(%pos) {dims = [1], shape = [2,2,3]} loc("idx")
  %c2: f32[2,6,3] = scatter(%cache, %idx, %u) {axis = 1} loc("c2")
  %s: f32[2,3] = reduce(%c2) {axes = [1], kind = "sum"} loc("s")
  return %s, %c2
}
)";
  const Tensor cache0 = ramp({2, 6, 3}, 0.3, 0.2), u = ramp({2, 2, 3}, 0.9, 1.1);
  const Tensor pos = Tensor::from_i64(DType::i64, {2}, std::vector<int64_t>{4, -1});
  const std::vector<Tensor> want = run_eager(*parse_graph(text), {cache0, pos, u});
  EXPECT_FALSE(want[1].same_as(cache0));
  for (const std::string backend : {"graph", "compiled"}) {
    SCOPED_TRACE(backend);
    Aliased exe(backend, text, {-1, 0});
    EXPECT_EQ(exe.stats().outputs_in_place, 1);
    Tensor cache = cache0.clone();
    const std::vector<Tensor> got = exe.run({cache, pos, u});
    EXPECT_EQ(got[1].bytes(), cache.bytes());
    EXPECT_TRUE(cache.same_as(want[1]));
    for (int64_t i = 0; i < want[0].numel(); ++i)  // (the compiled sum may add in another order)
      EXPECT_NEAR(got[0].get_f(i), want[0].get_f(i), 1e-5) << i;
    Tensor untouched = cache0.clone();
    EXPECT_THROW(exe.run({untouched, Tensor::from_i64(DType::i64, {2}, std::vector<int64_t>{1, 6}), u}), Error);
    EXPECT_TRUE(untouched.same_as(cache0));
  }
}

// With optional_aliases (tessel.compile's mutated inputs) an alias the graph cannot take is dropped,
// not an error: the output comes back as a tensor of its own and the input is left alone.
TEST(InPlaceOutputs, OptionalAliasesAreDroppedNotRefused) {
  const std::string text = kReturnsInputA;
  GraphBackendOptions o;
  o.output_aliases = {0, -1};   // a is also returned
  o.optional_aliases = true;
  auto exe = compile_graph(parse_graph(text), {}, o);
  EXPECT_EQ(exe->stats().aliases_dropped, 1);
  EXPECT_EQ(exe->stats().outputs_in_place + exe->stats().outputs_copied_back, 0);
  Tensor a = ramp({4}, 0.5, 0), b = ramp({2}, 0.5, 0);
  const Tensor a0 = a.clone();
  const std::vector<Tensor> got = exe->run({a, b});
  EXPECT_TRUE(a.same_as(a0));
  EXPECT_NE(got[0].bytes(), a.bytes());
  EXPECT_NEAR(got[0].get_f(2), std::exp(a0.get_f(2)), 1e-6);
}
