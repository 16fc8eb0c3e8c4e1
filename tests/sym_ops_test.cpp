// Graph-level ops over symbolic sizes (docs/dynamic-shapes.md, "Graph-level ops"): for each op family a
// small graph with a size symbol, lowered by fold-constants, decompose and dce without being specialised,
// against the original graph run eagerly on the same inputs for several values of the symbols (1
// included: a symbol is never assumed to be 1, but must work there); the ONNX shape-arithmetic chain
// folding into a Sizes node; and the refusals (a reason naming what is symbolic, never a crash).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "tessel/ir/bind.h"
#include "tessel/ir/core_builder.h"
#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/ir/printer.h"
#include "tessel/ir/verifier.h"
#include "tessel/passes/pass.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"
#include "op_test_util.h"

using namespace tessel;
using testenv::expect_same;

namespace {

bool is_sizes(const Node& n) { return n.op->name == "Sizes" && n.op->domain == "tessel"; }


// fold-constants, decompose, dce through the pass manager (verifying after each).
void lower(Graph& g, const Pass* decompose_pass = find_pass("decompose")) {
  run_pipeline(g, {find_pass("fold-constants"), decompose_pass, find_pass("dce")}, PassOptions{});
}

// Deterministic inputs: floats in [-2, 2), integers in [-7, 7] without 0 (divisors), bools alternating.
Tensor input_for(const TensorType& t, const Bindings& b, uint32_t seed) {
  const Shape s = eval_dims(t.dims(), b);
  Tensor x(t.dtype, s);
  uint32_t st = seed * 2654435761u + 7;
  for (int64_t i = 0; i < x.numel(); ++i) {
    st = st * 1664525u + 1013904223u;
    if (is_float(t.dtype)) {
      x.set_f(i, static_cast<double>(st >> 8) / static_cast<double>(1u << 24) * 4.0 - 2.0);
    } else if (is_bool(t.dtype)) {
      x.set_i(i, (st >> 12) & 1);
    } else {
      const int64_t v = static_cast<int64_t>((st >> 8) % 14) - 7;
      x.set_i(i, v >= 0 ? v + 1 : v);
    }
  }
  return x;
}

const std::vector<Bindings> kS0 = {{{"s0", 1}}, {{"s0", 5}}, {{"s0", 12}}};

// `text` lowered (fold-constants, decompose, dce) keeps its symbols, is all core ops, and computes
// what the original graph computes at every binding.
std::unique_ptr<Graph> check_lowering(const std::string& text, double tol = 1e-6, const std::vector<Bindings>& binds = kS0) {
  auto g = parse_graph(text);
  verify_graph(*g);  // the types written in the text are what the symbolic shape rules give
  auto lowered = parse_graph(text);
  lower(*lowered);
  bool symbolic = false;
  for (const auto& n : lowered->nodes()) {
    EXPECT_EQ(n->op->domain, "tessel.core") << n->op_name() << " is left at graph level";
    for (const Value* v : n->outputs) symbolic = symbolic || (v && v->type.symbolic());
  }
  EXPECT_TRUE(symbolic) << "the lowered graph was specialised:\n" << print_graph(*lowered);
  for (const Bindings& b : binds) {
    std::vector<Tensor> ins;
    for (size_t i = 0; i < g->inputs.size(); ++i) ins.push_back(input_for(g->inputs[i]->type, b, static_cast<uint32_t>(i + 1)));
    const std::vector<Tensor> want = run_eager(*g, ins);
    const std::vector<Tensor> got = run_eager(*instantiate_graph(*lowered, b), ins);
    EXPECT_EQ(got.size(), want.size());
    for (size_t k = 0; k < want.size() && k < got.size(); ++k)
      expect_same(got[k], want[k], tol, fmt::format("output {} ('{}') at {}", k, g->outputs[k]->name, b.begin()->second));
  }
  return lowered;
}

// The error checking or lowering `text` raises: unsupported, naming `reason`.
void expect_refused(const std::string& text, const std::string& reason) {
  try {
    auto g = parse_graph(text);
    verify_graph(*g);
    lower(*g);
    ADD_FAILURE() << "not refused; expected: " << reason;
  } catch (const Error& e) {
    EXPECT_TRUE(e.is_unsupported()) << e.what();
    EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(SymOps, ElementwiseArithmeticAndLogic) {
  check_lowering(R"(
graph @ew(%x: f32[s0,16], %y: f32[16], %z: f32[s0,1], %w: f32[1,16], %p: i64[s0,16], %q: i64[s0,16], %c: bool[s0,16]) symbols(s0 in [1, 64]) {
  %a: f32[s0,16] = Add(%x, %y) loc("a")
  %s: f32[s0,16] = Sub(%x, %z) loc("s")
  %m: f32[s0,16] = Mul(%z, %w) loc("m")
  %d: f32[s0,16] = Div(%a, %y) loc("d")
  %ab: f32[s0,16] = Abs(%x) loc("ab")
  %pw: f32[s0,16] = Pow(%ab, %y) loc("pw")
  %mx: f32[s0,16] = Max(%x, %y, %z) loc("mx")
  %mn: f32[s0,16] = Min(%x, %w) loc("mn")
  %sm: f32[s0,16] = Sum(%x, %y, %z) loc("sm")
  %me: f32[s0,16] = Mean(%x, %z) loc("me")
  %md: f32[s0,16] = Mod(%x, %y) {fmod = 1} loc("md")
  %im: i64[s0,16] = Mod(%p, %q) loc("im")
  %ia: i64[s0,16] = Add(%p, %q) loc("ia")
  %id: i64[s0,16] = Div(%p, %q) loc("id")
  %eq: bool[s0,16] = Equal(%p, %q) loc("eq")
  %lt: bool[s0,16] = Less(%x, %y) loc("lt")
  %le: bool[s0,16] = LessOrEqual(%x, %z) loc("le")
  %gt: bool[s0,16] = Greater(%x, %w) loc("gt")
  %ge: bool[s0,16] = GreaterOrEqual(%x, %y) loc("ge")
  %an: bool[s0,16] = And(%lt, %c) loc("an")
  %or: bool[s0,16] = Or(%le, %gt) loc("or")
  %xo: bool[s0,16] = Xor(%ge, %c) loc("xo")
  %nt: bool[s0,16] = Not(%an) loc("nt")
  %wh: f32[s0,16] = Where(%c, %x, %y) loc("wh")
  %ca: i32[s0,16] = Cast(%x) {to = 6} loc("ca")
  %cl: i64[s0,16] = CastLike(%x, %p) loc("cl")
  return %a, %s, %m, %d, %pw, %mx, %mn, %sm, %me, %md, %im, %ia, %id, %eq, %or, %xo, %nt, %wh, %ca, %cl
})");
}

// Tolerance 1e-5: the static decompositions of these functions are held to it too
// (decompose_elementwise_test), the symbolic form adds no error of its own.
TEST(SymOps, UnaryAndActivations) {
  check_lowering(R"(
graph @act(%x: f32[s0,8], %slope: f32[8], %x2: f32[s0,8]) symbols(s0 in [1, 64]) {
  const %lo: f32[] = [-0.5]
  const %hi: f32[] = [0.75]
  %ng: f32[s0,8] = Neg(%x) loc("ng")
  %ex: f32[s0,8] = Exp(%x) loc("ex")
  %ab: f32[s0,8] = Abs(%x) loc("ab")
  %lg: f32[s0,8] = Log(%ab) loc("lg")
  %sq: f32[s0,8] = Sqrt(%ab) loc("sq")
  %rc: f32[s0,8] = Reciprocal(%x) loc("rc")
  %er: f32[s0,8] = Erf(%x) loc("er")
  %th: f32[s0,8] = Tanh(%x) loc("th")
  %sg: f32[s0,8] = Sigmoid(%x) loc("sg")
  %rl: f32[s0,8] = Relu(%x) loc("rl")
  %lr: f32[s0,8] = LeakyRelu(%x) {alpha = 0.1} loc("lr")
  %el: f32[s0,8] = Elu(%x) loc("el")
  %se: f32[s0,8] = Selu(%x) loc("se")
  %ce: f32[s0,8] = Celu(%x) loc("ce")
  %ge: f32[s0,8] = Gelu(%x) loc("ge")
  %hs: f32[s0,8] = HardSigmoid(%x) loc("hs")
  %hw: f32[s0,8] = HardSwish(%x) loc("hw")
  %sp: f32[s0,8] = Softplus(%x) loc("sp")
  %ss: f32[s0,8] = Softsign(%x) loc("ss")
  %mi: f32[s0,8] = Mish(%x) loc("mi")
  %sn: f32[s0,8] = Sign(%x) loc("sn")
  %fl: f32[s0,8] = Floor(%x) loc("fl")
  %cg: f32[s0,8] = Ceil(%x) loc("cg")
  %rn: f32[s0,8] = Round(%x) loc("rn")
  %nan: bool[s0,8] = IsNaN(%lg) loc("nan")
  %inf: bool[s0,8] = IsInf(%rc) loc("inf")
  %cp: f32[s0,8] = Clip(%x, %lo, %hi) loc("cp")
  %pr: f32[s0,8] = PRelu(%x, %slope) loc("pr")
  %idn: f32[s0,8] = Identity(%x) loc("idn")
  %dr: f32[s0,8], %mask: bool[s0,8] = Dropout(%x) loc("dr")
  %sin: f32[s0,8] = Sin(%x) loc("sin")
  %cos: f32[s0,8] = Cos(%x) loc("cos")
  %shr: f32[s0,8] = Shrink(%x) {lambd = 0.25} loc("shr")
  %thr: f32[s0,8] = ThresholdedRelu(%x) {alpha = 0.5} loc("thr")
  %glu: f32[s0,8] = SwiGLU(%x, %x2) loc("glu")
  return %sin, %cos, %shr, %thr, %glu, %ng, %ex, %lg, %sq, %rc, %er, %th, %sg, %rl, %lr, %el, %se, %ce, %ge, %hs, %hw, %sp, %ss, %mi, %sn, %fl, %cg, %rn, %nan, %inf, %cp, %pr, %idn, %dr, %mask
})", 1e-5);
}

TEST(SymOps, ShapeAndIndexOps) {
  check_lowering(R"(
graph @sh(%x: f32[s0,4,6], %v: f32[s0,6], %w: f32[s0,8], %ix: i64[s0,4]) symbols(s0 in [1, 64]) {
  const %tgt: i64[2] = [-1, 12]
  const %tgt0: i64[3] = [0, 2, -1]
  const %ax1: i64[1] = [1]
  const %splits: i64[2] = [1, 3]
  const %st: i64[2] = [1, 0]
  const %en: i64[2] = [9223372036854775807, 3]
  const %axs: i64[2] = [0, 2]
  const %st1: i64[1] = [1]
  const %en1: i64[1] = [-1]
  const %ax1b: i64[1] = [1]
  const %etgt: i64[3] = [3, 1, 6]
  const %reps: i64[3] = [2, 1, 2]
  const %pads: i64[6] = [1, 0, 1, 1, 0, 2]
  const %pads2: i64[6] = [0, 1, 0, 0, 1, 0]
  const %gi: i64[2] = [3, -1]
  const %gz: i64[2] = [0, -1]
  %r: f32[2*s0,12] = Reshape(%x, %tgt) loc("r")
  %r0: f32[s0,2,12] = Reshape(%x, %tgt0) loc("r0")
  %t: f32[6,s0,4] = Transpose(%x) {perm = [2, 0, 1]} loc("t")
  %u: f32[s0,1,4,6] = Unsqueeze(%x, %ax1) loc("u")
  %q: f32[s0,4,6] = Squeeze(%u, %ax1) loc("q")
  %f: f32[s0,24] = Flatten(%x) {axis = 1} loc("f")
  %f0: f32[1,24*s0] = Flatten(%x) {axis = 0} loc("f0")
  %cc: f32[2*s0,4,6] = Concat(%x, %q) {axis = 0} loc("cc")
  %cs: f32[s0,8,6] = Concat(%x, %q) {axis = 1} loc("cs")
  %sp1: f32[s0,1,6], %sp2: f32[s0,3,6] = Split(%x, %splits) {axis = 1} loc("sp")
  %sl: f32[s0-1,4,3] = Slice(%x, %st, %en, %axs) loc("sl")
  %sl2: f32[s0,2,6] = Slice(%x, %st1, %en1, %ax1b) loc("sl2")
  %ex: f32[3,s0,6] = Expand(%v, %etgt) loc("ex")
  %tl: f32[2*s0,4,12] = Tile(%x, %reps) loc("tl")
  %pd: f32[s0+2,4,9] = Pad(%x, %pads) loc("pd")
  %pe: f32[s0,6,6] = Pad(%x, %pads2) {mode = "edge"} loc("pe")
  %tr: f32[s0,4,6] = Trilu(%x) loc("tr")
  %tr2: f32[s0,6] = Trilu(%v) {upper = 0} loc("tr2")
  %g: f32[s0,2,6] = Gather(%x, %gi) {axis = 1} loc("g")
  %g0: f32[2,4,6] = Gather(%x, %gz) {axis = 0} loc("g0")
  %ge: f32[s0,4] = GatherElements(%w, %ix) {axis = 1} loc("ge")
  %ey: f32[s0,6] = EyeLike(%v) {k = 1} loc("ey")
  return %ey, %r, %r0, %t, %f, %f0, %cc, %cs, %sp1, %sp2, %sl, %sl2, %ex, %tl, %pd, %pe, %tr, %tr2, %g, %g0, %ge
})");
}

// GatherND over symbolic indexed dims (what torch's x[i, j] with two index tensors lowers to): the
// positions are wrapped and linearised with strides computed at run time. The index values lie in
// [-7, 7], so every indexed dim is at least 8 here.
TEST(SymOps, GatherNDOverSymbolicDims) {
  check_lowering(R"(
graph @gnd(%x: f32[s0,s0,3], %i2: i64[s0,2], %b: f32[s0,9,3], %i1: i64[s0,1], %m: f32[s0,10], %i3: i64[2,s0,2]) symbols(s0 in [8, 64]) {
  %g: f32[s0,3] = GatherND(%x, %i2) loc("g")
  %gb: f32[s0,3] = GatherND(%b, %i1) {batch_dims = 1} loc("gb")
  %gm: f32[2,s0] = GatherND(%m, %i3) loc("gm")
  return %g, %gb, %gm
})", 1e-6, {{{"s0", 8}}, {{"s0", 13}}});
}

// ScatterElements over symbolic sizes: transformers' static KV cache writes a symbolic number of
// positions into a preallocated cache (aten index_copy_, lowered to ScatterElements), and a symbolic
// data tensor takes a scatter along its static axis. Index values lie in [-7, 7].
TEST(SymOps, ScatterElementsOverSymbolicSizes) {
  check_lowering(R"(
graph @sc(%d: f32[16,4], %i: i64[s0,4], %u: f32[s0,4], %e: f32[s0,8], %j: i64[s0,3], %v: f32[s0,3]) symbols(s0 in [1, 12]) {
  %a: f32[16,4] = ScatterElements(%d, %i, %u) {axis = 0} loc("a")
  %b: f32[16,4] = ScatterElements(%d, %i, %u) {axis = 0, reduction = "add"} loc("b")
  %c: f32[s0,8] = ScatterElements(%e, %j, %v) {axis = 1} loc("c")
  %m: f32[s0,8] = Scatter(%e, %j, %v) {axis = 1} loc("m")
  return %a, %b, %c, %m
})");
  expect_refused(R"(
graph @sc(%d: f32[16,4], %i: i64[s0,4], %u: f32[s1,4]) symbols(s0 in [1, 12], s1 in [1, 12]) {
  %a: f32[16,4] = ScatterElements(%d, %i, %u) {axis = 0} loc("a")
  return %a
})", "scatter indices dim 0 is s0 but updates' is s1");
}

// ONNX exporters' chain for a view(B, 2, 4) with B = x.size(0) (the graph's return to be added).
constexpr const char* kChain = R"(
graph @chain(%x: f32[s0,8]) symbols(s0 in [1, 4096]) {
  const %i0: i64[] = [0]
  const %ax: i64[1] = [0]
  const %tail: i64[2] = [2, 4]
  %s: i64[2] = Shape(%x) loc("/Shape")
  %b: i64[] = Gather(%s, %i0) {axis = 0} loc("/Gather")
  %bu: i64[1] = Unsqueeze(%b, %ax) loc("/Unsqueeze")
  %shape: i64[3] = Concat(%bu, %tail) {axis = 0} loc("/Concat")
  %y: f32[s0,2,4] = Reshape(%x, %shape) loc("/Reshape")
)";

// The chain: fold-constants leaves one Sizes node
// holding [s0, 2, 4] for the Reshape, which decomposes into a core reshape to dims[s0, 2, 4].
TEST(SymOps, ShapeArithmeticChainFoldsIntoSizes) {
  const std::string text = std::string(kChain) + "  return %y\n}\n";
  auto g = parse_graph(text);
  run_pipeline(*g, {find_pass("fold-constants"), find_pass("dce")}, PassOptions{});
  ASSERT_EQ(g->nodes().size(), 2u) << print_graph(*g);
  const Node& sizes = *g->nodes()[0];
  ASSERT_TRUE(is_sizes(sizes)) << print_graph(*g);
  EXPECT_EQ(dims_str(sizes.attr_dims("dims")), "[s0,2,4]");
  EXPECT_EQ(g->nodes()[1]->op_name(), "Reshape");
  EXPECT_EQ(g->nodes()[1]->inputs[1], sizes.outputs[0]);

  auto lowered = check_lowering(text);
  ASSERT_EQ(lowered->nodes().size(), 1u) << print_graph(*lowered);
  const Node& r = *lowered->nodes()[0];
  EXPECT_EQ(r.op_name(), "reshape");
  EXPECT_EQ(dims_str(r.attr_dims("shape")), "[s0,2,4]");
}

// The rest of the shape arithmetic exporters emit: Mul and an exact Div of sizes, casts between
// integer types, Slice of a shape, Equal and Where deciding on sizes, Max of sizes, Size; the sizes
// feed Reshape (with 0 and -1 entries), ConstantOfShape, Expand and Range.
TEST(SymOps, ShapeArithmeticFeedsShapeOperands) {
  check_lowering(R"(
graph @arith(%x: f32[s0,8], %y: f32[s0]) symbols(s0 in [1, 4096]) {
  const %i0: i64[] = [0]
  const %one: i64[] = [1]
  const %two: i64[] = [2]
  const %ax: i64[1] = [0]
  const %s1: i64[1] = [1]
  const %e2: i64[1] = [2]
  const %zeros: i64[2] = [0, 0]
  const %neg: i64[2] = [-1, -1]
  const %tgt: i64[3] = [0, 2, -1]
  %s: i64[2] = Shape(%x) loc("s")
  %b: i64[] = Gather(%s, %i0) {axis = 0} loc("b")
  %b2: i64[] = Mul(%b, %two) loc("b2")
  %h: i64[] = Div(%b2, %two) loc("h")
  %c32: i32[] = Cast(%h) {to = 6} loc("c32")
  %c64: i64[] = Cast(%c32) {to = 7} loc("c64")
  %mx: i64[] = Max(%c64, %one) loc("mx")
  %bu: i64[1] = Unsqueeze(%mx, %ax) loc("bu")
  %tail: i64[1] = Slice(%s, %s1, %e2) loc("tail")
  %t: i64[2] = Concat(%tail, %bu) {axis = 0} loc("t")
  %z: f32[8,s0] = ConstantOfShape(%t) loc("z")
  %e: f32[8,s0] = Expand(%y, %t) loc("e")
  %rg: i64[s0] = Range(%i0, %b, %one) loc("rg")
  %iz: bool[2] = Equal(%s, %zeros) loc("iz")
  %w: i64[2] = Where(%iz, %neg, %s) loc("w")
  %rw: f32[s0,8] = Reshape(%x, %w) loc("rw")
  %n: i64[] = Size(%x) loc("n")
  %nu: i64[1] = Unsqueeze(%n, %ax) loc("nu")
  %fl: f32[8*s0] = Reshape(%x, %nu) loc("fl")
  %r0: f32[s0,2,4] = Reshape(%x, %tgt) loc("r0")
  %r1: f32[8,s0] = Reshape(%fl, %t) loc("r1")
  return %z, %e, %rg, %rw, %fl, %r0, %r1
})");
}

// Every refusal is an "unsupported" error naming what is symbolic; never a crash or a wrong shape.
TEST(SymOps, RefusalsNameWhatIsSymbolic) {
  const std::string head =
      "graph @g(%x: f32[s0,6], %img: f32[1,3,s0,8], %w: f32[2,3,3,3]) symbols(s0 in [1, 64]) {\n";
  auto refused = [&](const std::string& body, const std::string& reason) {
    SCOPED_TRACE(body);
    expect_refused(head + body + "}\n", reason);
  };
  // A -1 that is not an exact division for every value of s0.
  refused("  const %t: i64[2] = [4, -1]\n  %y: f32[4,?] = Reshape(%x, %t) loc(\"r\")\n  return %y\n",
          "not an exact division for every value of the symbols");
  // An op whose rule was not written for symbolic sizes.
  refused("  %y: f32[s0,6] = LpNormalization(%x) loc(\"h\")\n  return %y\n", "LpNormalization has no shape rule for symbolic sizes");
  // A convolution's symbolic spatial dim: its output size is a floor division.
  refused("  %y: f32[1,2,?,6] = Conv(%img, %w) loc(\"c\")\n  return %y\n", "spatial");
  // s0 against 3: broadcasting decides nothing.
  refused("  const %k: f32[3,1] = [0, 1, 2]\n  %y: f32[3,6] = Add(%x, %k) loc(\"a\")\n  return %y\n",
          "which the symbols do not decide");
  // Squeezing a symbolic axis: it is 1 only for some values.
  refused("  const %a: i64[1] = [0]\n  %y: f32[6] = Squeeze(%x, %a) loc(\"q\")\n  return %y\n",
          "cannot squeeze axis 0 of symbolic size s0");
  // Two halves of a symbolic axis: s0 / 2 is not exact.
  refused("  %y: f32[?,6], %z: f32[?,6] = Split(%x) {axis = 0, num_outputs = 2} loc(\"s\")\n  return %y, %z\n",
          "Split of an axis of symbolic size s0 into 2 pieces");
  // A bound whose clamp depends on s0.
  refused("  const %b: i64[1] = [0]\n  const %e: i64[1] = [3]\n  %y: f32[?,6] = Slice(%x, %b, %e) loc(\"s\")\n  return %y\n",
          "depends on the symbols");
}

// A slice of a static axis up to a symbolic bound (transformers' sdpa_attention cutting a 383-long
// static-cache mask to the keys' length, `mask[..., :key.shape[-2]]`): the clamp to the axis is decided
// by the symbol's range (s0 <= 24 keeps s0 as is), so the graph stays symbolic and computes what the
// original does at every binding up to the axis; with a range past the axis the clamp depends on s0 and
// it is refused, as before ranges were read.
TEST(SymOps, SliceBoundDecidedByTheSymbolsRange) {
  const std::string body = R"( {
  const %i0: i64[] = [0]
  const %ax: i64[1] = [0]
  const %b: i64[1] = [0]
  const %a1: i64[1] = [1]
  %sk: i64[2] = Shape(%k) loc("sk")
  %n: i64[] = Gather(%sk, %i0) {axis = 0} loc("n")
  %e: i64[1] = Unsqueeze(%n, %ax) loc("e")
  %y: f32[1,s0] = Slice(%m, %b, %e, %a1) loc("y")
  %z: f32[s0,1] = Transpose(%y) {perm = [1, 0]} loc("t")
  %w: f32[s0,8] = Add(%k, %z) loc("w")
  return %w
}
)";
  const std::string head = "graph @mask(%m: f32[1,24], %k: f32[s0,8]) symbols(s0 in [2, ";
  check_lowering(head + "24])" + body, 1e-6, {{{"s0", 2}}, {{"s0", 17}}, {{"s0", 24}}});
  expect_refused(head + "64])" + body, "depends on the symbols");
}

// Sizes read as data, not as a shape: transformers' causal mask, `torch.arange(q) + past_length`
// (ONNX: a Range and an Add of a Gather of a Shape), a Range starting at a symbolic size, the shape
// itself returned. Each symbolic size is computed at run time (a sum of ones).
TEST(SymOps, SizesReadAsData) {
  check_lowering(R"(
graph @offsets(%x: f32[8,s0], %k: f32[s1,8]) symbols(s0 in [1, 64], s1 in [1, 64]) {
  const %i0: i64[] = [0]
  const %i1: i64[] = [1]
  const %zero: i64[] = [0]
  const %one: i64[] = [1]
  %sx: i64[2] = Shape(%x) loc("sx")
  %q: i64[] = Gather(%sx, %i1) {axis = 0} loc("q")
  %sk: i64[2] = Shape(%k) loc("sk")
  %p: i64[] = Gather(%sk, %i0) {axis = 0} loc("p")
  %r: i64[s0] = Range(%zero, %q, %one) loc("r")
  %pos: i64[s0] = Add(%r, %p) loc("pos")
  %end: i64[] = Add(%p, %q) loc("end")
  %kv: i64[s0] = Range(%p, %end, %one) loc("kv")
  %same: bool[s0] = Equal(%pos, %kv) loc("same")
  %pf: f32[s0] = Cast(%pos) {to = 1} loc("pf")
  %y: f32[8,s0] = Mul(%x, %pf) loc("y")
  return %y, %same, %sk
})", 1e-6, {{{"s0", 3}, {"s1", 5}}, {{"s0", 1}, {"s1", 9}}, {{"s0", 7}, {"s1", 2}}});
}

TEST(SymOps, MatMulAndGemm) {
  check_lowering(R"(
graph @mm(%x: f32[s0,6], %w: f32[6,4], %b3: f32[2,s0,6], %w3: f32[2,6,3], %v: f32[6], %c: f32[4], %xt: f32[6,s0]) symbols(s0 in [1, 64]) {
  %y: f32[s0,4] = MatMul(%x, %w) loc("y")
  %y3: f32[2,s0,3] = MatMul(%b3, %w3) loc("y3")
  %yv: f32[s0] = MatMul(%x, %v) loc("yv")
  %yb: f32[2,s0,4] = MatMul(%b3, %w) loc("yb")
  %g: f32[s0,4] = Gemm(%x, %w, %c) {alpha = 0.5, beta = 2.0} loc("g")
  %gt: f32[s0,4] = Gemm(%xt, %w, %c) {transA = 1} loc("gt")
  %k: f32[6,6] = MatMul(%xt, %x) loc("k")
  return %y, %y3, %yv, %yb, %g, %gt, %k
})");
}

TEST(SymOps, ReductionsSoftmaxAndCumulative) {
  check_lowering(R"(
graph @red(%x: f32[s0,6], %t: f32[2,s0,4]) symbols(s0 in [1, 64]) {
  const %a1: i64[1] = [1]
  const %a0: i64[1] = [0]
  const %ax: i64[] = [1]
  %rs: f32[s0,1] = ReduceSum(%x, %a1) loc("rs")
  %rm: f32[6] = ReduceMean(%x, %a0) {keepdims = 0} loc("rm")
  %rma: f32[1,1] = ReduceMean(%x) loc("rma")
  %rx: f32[2,1,4] = ReduceMax(%t, %a1) loc("rx")
  %rn: f32[s0] = ReduceMin(%x, %a1) {keepdims = 0} loc("rn")
  %rp: f32[s0,1] = ReduceProd(%x, %a1) loc("rp")
  %am: i64[s0] = ArgMax(%x) {axis = 1, keepdims = 0} loc("am")
  %an: i64[1,6] = ArgMin(%x) {axis = 0} loc("an")
  %al: i64[2,1,4] = ArgMax(%t) {axis = 1, select_last_index = 1} loc("al")
  %sm: f32[s0,6] = Softmax(%x) loc("sm")
  %ls: f32[2,s0,4] = LogSoftmax(%t) {axis = 1} loc("ls")
  %hm: f32[s0,6] = Hardmax(%x) loc("hm")
  %cs: f32[s0,6] = CumSum(%x, %ax) loc("cs")
  return %rs, %rm, %rma, %rx, %rn, %rp, %am, %an, %al, %sm, %ls, %hm, %cs
})", 1e-5);
}

TEST(SymOps, Normalizations) {
  check_lowering(R"(
graph @norm(%x: f32[s0,8], %img: f32[s0,4,3,3], %seq: f32[1,2,s0], %sc: f32[8], %bi: f32[8], %c4: f32[4], %d4: f32[4], %c2: f32[2], %d2: f32[2]) symbols(s0 in [1, 64]) {
  const %m4: f32[4] = [0.1, -0.2, 0.3, 0.0]
  const %v4: f32[4] = [1.0, 0.5, 2.0, 0.25]
  %ln: f32[s0,8] = LayerNormalization(%x, %sc, %bi) loc("ln")
  %lnr: f32[s0,8], %mean: f32[1,1], %inv: f32[1,1] = LayerNormalization(%x, %sc, %bi) {axis = 0} loc("lnr")
  %rms: f32[s0,8] = RMSNormalization(%x, %sc) loc("rms")
  %bn: f32[s0,4,3,3] = BatchNormalization(%img, %c4, %d4, %m4, %v4) loc("bn")
  %gn: f32[s0,4,3,3] = GroupNormalization(%img, %c4, %d4) {num_groups = 2} loc("gn")
  %in: f32[s0,4,3,3] = InstanceNormalization(%img, %c4, %d4) loc("in")
  %ins: f32[1,2,s0] = InstanceNormalization(%seq, %c2, %d2) loc("ins")
  return %ln, %lnr, %mean, %inv, %rms, %bn, %gn, %in, %ins
})", 1e-5);
}

TEST(SymOps, ConvolutionAndPoolingOverASymbolicBatch) {
  check_lowering(R"(
graph @conv(%x: f32[s0,3,7,7], %w: f32[4,3,3,3], %b: f32[4], %seq: f32[2,3,s0,5]) symbols(s0 in [1, 16]) {
  %c: f32[s0,4,4,4] = Conv(%x, %w, %b) {pads = [1, 1, 1, 1], strides = [2, 2]} loc("c")
  %mp: f32[s0,4,2,2], %ix: i64[s0,4,2,2] = MaxPool(%c) {kernel_shape = [2, 2], strides = [2, 2]} loc("mp")
  %ap: f32[s0,3,3,3] = AveragePool(%x) {kernel_shape = [3, 3], strides = [2, 2]} loc("ap")
  %ga: f32[s0,4,1,1] = GlobalAveragePool(%c) loc("ga")
  %gm: f32[s0,4,1,1] = GlobalMaxPool(%c) loc("gm")
  %gs: f32[2,3,1,1] = GlobalAveragePool(%seq) loc("gs")
  return %c, %mp, %ix, %ap, %ga, %gm, %gs
})", 1e-5);
}

// The decompose pass lowers every node of a symbolic graph to core ops.
TEST(SymOps, DecomposeLowersEverySymbolicNode) {
  auto g = parse_graph(std::string(kChain) + "  %z: f32[s0,2,4] = Relu(%y) loc(\"/Relu\")\n  return %z\n}\n");
  lower(*g, find_pass("decompose"));
  for (const auto& n : g->nodes()) EXPECT_EQ(n->op->domain, "tessel.core") << n->op_name() << " is left at graph level";
}
