// Reverse-mode autodiff (passes/autodiff*.cpp): every primitive's vector-Jacobian rule against central
// differences in f64 on the eager interpreter, a table walk that fails for a primitive without a rule
// or a test, whole models, and the one-line errors for bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "tessel/ir/core_builder.h"
#include "tessel/ir/core_ops.h"
#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/ir/printer.h"
#include "tessel/ir/verifier.h"
#include "tessel/driver/train.h"
#include "tessel/passes/autodiff.h"
#include "tessel/passes/pass.h"
#include "tessel/passes/remat_partition.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"
#include "corpus_util.h"

using namespace tessel;

namespace {

using Ints = std::vector<int64_t>;
using Build = std::function<Value*(Graph&, CoreBuilder&, std::vector<Value*>&)>;

struct Case {
  std::string op;     // the primitive under test (its core-op table name)
  std::string label;  // what this configuration checks
  std::vector<Shape> shapes;                    // f64 inputs x0, x1, ... (all differentiated)
  std::vector<std::pair<double, double>> range;  // uniform range per input ({-1, 1} when absent)
  Build build;        // emits the primitive (and any helpers) on the inputs; returns the result
  double h = 1e-5;    // relative step of the central differences
  double tol = 1e-6;  // |autodiff - fd| <= tol * max(1, |fd|)
};

Value* ints_const(CoreBuilder& b, Shape s, std::vector<double> v) {
  return b.constant(Tensor::from_f64(DType::i64, std::move(s), v));
}

// (the cases name their primitive as the table does, which the coverage check compares)
Value* emit(CoreBuilder& b, const std::string& op, std::vector<Value*> in, std::map<std::string, Attr> a = {}) {
  const std::optional<CoreOp> core = core_op_named(op);
  if (!core) throw std::runtime_error("not a primitive: " + op);
  return b.emit(*core, std::move(in), std::move(a));
}

Case unary(const std::string& op, double lo = -1, double hi = 1) {
  return {op, "[2,3]", {{2, 3}}, {{lo, hi}},
          [op](Graph&, CoreBuilder& b, std::vector<Value*>& x) { return emit(b, op, {x[0]}); }};
}

Case binary(const std::string& op, std::pair<double, double> ra = {-1, 1}, std::pair<double, double> rc = {-1, 1}) {
  return {op, "[2,3]", {{2, 3}, {2, 3}}, {ra, rc},
          [op](Graph&, CoreBuilder& b, std::vector<Value*>& x) { return emit(b, op, {x[0], x[1]}); }};
}

std::vector<Case> cases() {
  std::vector<Case> c;
  for (const char* op : {"neg", "sin", "atan", "erf", "tanh", "exp"}) c.push_back(unary(op, -1.5, 1.5));
  c.push_back(unary("log", 0.3, 2));
  c.push_back(unary("sqrt", 0.3, 2));
  c.push_back({"floor", "zero derivative", {{2, 3}}, {{-3, 3}},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) { return b.mul(emit(b, "floor", {x[0]}), x[0]); }});
  c.push_back({"round_even", "zero derivative", {{2, 3}}, {{-3, 3}},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) { return b.add(emit(b, "round_even", {x[0]}), x[0]); }});
  c.push_back(binary("add"));
  c.push_back(binary("mul"));
  c.push_back(binary("div", {-1, 1}, {0.5, 2}));
  c.push_back(binary("rem", {-3, 3}, {0.7, 1.3}));
  c.push_back(binary("pow", {0.5, 2}, {-1.5, 1.5}));
  c.push_back(binary("max"));
  c.push_back(binary("min"));
  c.push_back({"max", "a tie splits the cotangent", {{2, 3}}, {},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) { return emit(b, "max", {x[0], x[0]}); }});
  for (const char* op : {"and", "or", "xor"}) {
    const std::string o = op;
    c.push_back({o, "bool operands on the path", {{2, 3}, {2, 3}}, {},
                 [o](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                   Value* p = emit(b, o, {b.compare("gt", x[0], b.full(DType::f64, {2, 3}, 0.0)),
                                          b.compare("lt", x[1], b.full(DType::f64, {2, 3}, 0.0))});
                   return b.select(p, b.mul(x[0], x[1]), x[1]);
                 }});
  }
  c.push_back({"compare", "a float select on it", {{2, 3}, {2, 3}}, {},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                 return b.select(b.compare("gt", x[0], x[1]), b.mul(x[0], x[0]), x[1]);
               }});
  c.push_back({"select", "constant predicate", {{2, 3}, {2, 3}}, {},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                 Value* p = b.constant(Tensor::from_f64(DType::boolean, {2, 3}, std::vector<double>{1, 0, 0, 1, 1, 0}));
                 return emit(b, "select", {p, x[0], x[1]});
               }});
  c.push_back({"convert", "f64 -> f64", {{2, 3}}, {},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                 return b.mul(emit(b, "convert", {x[0]}, {{"dtype", std::string("f64")}}), x[0]);
               }});
  c.push_back({"convert", "f64 -> f32 -> f64 (f32 rounding: loose)", {{2, 3}}, {},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                 Value* f = emit(b, "convert", {x[0]}, {{"dtype", std::string("f32")}});
                 return emit(b, "convert", {b.mul(f, f)}, {{"dtype", std::string("f64")}});
               },
               1e-2, 1e-4});
  c.push_back({"convert", "i64 operand: no cotangent", {{2, 3}}, {},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                 Value* i = emit(b, "convert", {ints_const(b, {2, 3}, {1, 2, 3, 4, 5, 6})}, {{"dtype", std::string("f64")}});
                 return b.mul(i, x[0]);
               }});
  c.push_back({"iota", "a float iota on the path", {{2, 3}}, {},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) { return b.mul(x[0], b.iota(DType::f64, {2, 3}, 1)); }});
  for (const char* kind : {"sum", "max", "min"})
    c.push_back({"reduce", std::string(kind) + " over [0, 2]", {{2, 3, 4}}, {},
                 [k = std::string(kind)](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                   return emit(b, "reduce", {x[0]}, {{"kind", k}, {"axes", Ints{0, 2}}});
                 }});
  c.push_back({"reduce", "prod over [1]", {{2, 3, 4}}, {{0.5, 1.5}},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                 return emit(b, "reduce", {x[0]}, {{"kind", std::string("prod")}, {"axes", Ints{1}}});
               }});
  c.push_back({"reduce", "max with a tie shares the cotangent", {{2, 3}}, {},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                 Value* t = b.concat({x[0], x[0]}, 1);
                 return emit(b, "reduce", {t}, {{"kind", std::string("max")}, {"axes", Ints{1}}});
               }});
  auto window = [&c](const std::string& kind, const std::string& label, Shape s, Ints w, Ints st, Ints dil,
                     Ints pad, std::pair<double, double> r = {-1, 1}) {
    c.push_back({"reduce_window", kind + " " + label, {s}, {r},
                 [=](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                   return emit(b, "reduce_window", {x[0]},
                               {{"kind", kind}, {"window", w}, {"strides", st}, {"dilations", dil}, {"padding", pad}});
                 }});
  };
  window("sum", "2x2 stride 2,1 padded", {1, 2, 5, 5}, {1, 1, 2, 2}, {1, 1, 2, 1}, {1, 1, 1, 1}, {0, 0, 0, 0, 1, 0, 0, 1});
  window("sum", "cumsum form", {2, 6}, {1, 6}, {1, 1}, {1, 1}, {0, 0, 5, 0});
  window("sum", "dilated, negative padding", {1, 1, 7, 6}, {1, 1, 2, 3}, {1, 1, 2, 1}, {1, 1, 2, 1}, {0, 0, 0, 0, -1, 1, 1, 0});
  window("max", "3x3 stride 2 pad 1 (max_pool)", {1, 2, 6, 5}, {1, 1, 3, 3}, {1, 1, 2, 2}, {1, 1, 1, 1},
         {0, 0, 0, 0, 1, 1, 1, 1});
  window("max", "dilated", {1, 1, 7, 7}, {1, 1, 2, 2}, {1, 1, 1, 2}, {1, 1, 3, 2}, {0, 0, 0, 0, 0, 1, 0, 0});
  window("min", "2x2", {1, 2, 4, 4}, {1, 1, 2, 2}, {1, 1, 2, 2}, {1, 1, 1, 1}, {0, 0, 0, 0, 0, 0, 0, 0});
  window("prod", "overlapping", {2, 5}, {1, 3}, {1, 1}, {1, 1}, {0, 0, 1, 1}, {0.5, 1.5});
  auto dot = [&c](const std::string& label, Shape a, Shape w, Ints lb, Ints rb, Ints lc, Ints rc) {
    c.push_back({"dot_general", label, {a, w}, {},
                 [=](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                   return emit(b, "dot_general", {x[0], x[1]},
                               {{"lhs_batch", lb}, {"rhs_batch", rb}, {"lhs_contract", lc}, {"rhs_contract", rc}});
                 }});
  };
  dot("matmul", {2, 3}, {3, 4}, {}, {}, {1}, {0});
  dot("batch dims not leading", {2, 3, 4}, {4, 2, 5}, {0}, {1}, {2}, {0});
  dot("two contract dims out of order", {3, 2, 4}, {4, 5, 3}, {}, {}, {2, 0}, {0, 2});
  dot("vector dot", {4}, {4}, {}, {}, {0}, {0});
  auto conv = [&c](const std::string& label, Shape xs, Shape ws, Ints st, Ints dil, Ints pad, int64_t groups) {
    c.push_back({"convolution", label, {xs, ws}, {},
                 [=](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                   return emit(b, "convolution", {x[0], x[1]},
                               {{"strides", st}, {"dilations", dil}, {"padding", pad}, {"groups", groups}});
                 }});
  };
  conv("3x3 stride 2 pad 1", {2, 2, 5, 6}, {3, 2, 3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, 1);
  conv("dilated, asymmetric padding", {1, 2, 7, 6}, {2, 2, 2, 3}, {1, 2}, {2, 1}, {0, 1, 2, 0}, 1);
  conv("groups 2", {2, 4, 6, 5}, {4, 2, 2, 3}, {1, 2}, {1, 1}, {0, 1, 1, 0}, 2);
  conv("depthwise", {1, 3, 5, 5}, {3, 1, 3, 3}, {2, 1}, {1, 1}, {1, 1, 1, 1}, 3);
  conv("1-D stride 3", {2, 2, 9}, {3, 2, 2}, {3}, {1}, {2, 1}, 1);
  c.push_back({"broadcast_in_dim", "[3] -> [2,3]", {{3}}, {},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                 return emit(b, "broadcast_in_dim", {x[0]}, {{"shape", Ints{2, 3}}, {"dims", Ints{1}}});
               }});
  c.push_back({"broadcast_in_dim", "[2,1] -> [2,4,3] (a size-1 dim grows)", {{2, 1}}, {},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                 return emit(b, "broadcast_in_dim", {x[0]}, {{"shape", Ints{2, 4, 3}}, {"dims", Ints{0, 2}}});
               }});
  c.push_back({"reshape", "[2,6] -> [3,4]", {{2, 6}}, {},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) { return emit(b, "reshape", {x[0]}, {{"shape", Ints{3, 4}}}); }});
  c.push_back({"transpose", "perm [2,0,1]", {{2, 3, 4}}, {},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) { return emit(b, "transpose", {x[0]}, {{"perm", Ints{2, 0, 1}}}); }});
  c.push_back({"slice", "strided, reversed", {{5, 6}}, {},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                 return emit(b, "slice", {x[0]}, {{"starts", Ints{1, 5}}, {"stops", Ints{5, 0}}, {"strides", Ints{2, -2}}});
               }});
  c.push_back({"slice", "through element 0 backwards", {{4, 3}}, {},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                 return emit(b, "slice", {x[0]}, {{"starts", Ints{3, 0}}, {"stops", Ints{-1, 2}}, {"strides", Ints{-1, 1}}});
               }});
  c.push_back({"pad", "negative, interior, the padding value too", {{3, 4}, {}}, {},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                 return emit(b, "pad", {x[0], x[1]}, {{"low", Ints{1, -1}}, {"high", Ints{2, 0}}, {"interior", Ints{1, 2}}});
               }});
  c.push_back({"concatenate", "three operands", {{2, 3}, {2, 1}, {2, 2}}, {},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) { return b.concat({x[0], x[1], x[2]}, 1); }});
  c.push_back({"concatenate", "an operand twice", {{2, 3}}, {},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) { return b.concat({x[0], x[0]}, 0); }});
  c.push_back({"gather", "duplicate and negative indices", {{4, 3}}, {},
               [](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                 Value* i = ints_const(b, {2, 3}, {0, -1, 2, 3, 3, 0});
                 return emit(b, "gather", {x[0], i}, {{"axis", int64_t{0}}});
               }});
  for (const char* red : {"none", "add", "mul", "max", "min"}) {
    const std::string r = red;
    c.push_back({"scatter", r, {{4, 3}, {2, 3}}, {{0.5, 1.5}, {0.5, 1.5}},
                 [r](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                   // add may repeat an index (-1 wraps to 3); the others write each element once.
                   Value* i = r == "add" ? ints_const(b, {2, 3}, {0, 3, 2, 1, -1, 2})
                                         : ints_const(b, {2, 3}, {0, 3, 2, 1, -2, 0});
                   return emit(b, "scatter", {x[0], i, x[1]}, {{"axis", int64_t{0}}, {"reduction", r}});
                 }});
  }
  for (int64_t desc : {0, 1})
    c.push_back({"sort", desc ? "descending" : "ascending", {{3, 5}}, {},
                 [desc](Graph&, CoreBuilder& b, std::vector<Value*>& x) {
                   return b.emit_multi(CoreOp::sort, {x[0]}, 2, {{"axis", int64_t{1}}, {"descending", desc}})[0];
                 }});
  return c;
}

// Builds graph @t(x0, x1, ...) -> sum(case(x) * W) in f64, W fixed and random.
std::unique_ptr<Graph> case_graph(const Case& cs) {
  auto g = std::make_unique<Graph>();
  Node origin;
  origin.name = "t";
  CoreBuilder b(*g, origin);
  std::vector<Value*> x;
  for (size_t i = 0; i < cs.shapes.size(); ++i) x.push_back(g->add_input("x" + std::to_string(i), {DType::f64, cs.shapes[i]}));
  Value* y = cs.build(*g, b, x);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> w(static_cast<size_t>(shape_numel(y->type.shape)));
  for (double& v : w) v = u(rng);
  Value* wy = b.mul(y, b.constant(Tensor::from_f64(DType::f64, y->type.shape, w)));
  Ints all;
  for (size_t i = 0; i < y->type.shape.size(); ++i) all.push_back(static_cast<int64_t>(i));
  g->outputs = {all.empty() ? wy : b.reduce(wy, "sum", all, false)};
  return g;
}

double loss(const Graph& g, const std::vector<Tensor>& ins) { return run_eager(g, ins)[0].get_f(0); }

// The autodiff gradients of `g` (scalar output) at `ins` against central differences.
void check_gradients(const Graph& fwd, Graph& joint, const std::vector<Tensor>& ins, double h, double tol,
                     const std::string& what) {
  std::vector<Tensor> outs = run_eager(joint, ins);
  ASSERT_EQ(outs.size(), 1 + ins.size()) << what;
  EXPECT_NEAR(outs[0].get_f(0), loss(fwd, ins), 1e-12) << what << ": the joint graph's forward output";
  for (size_t k = 0; k < ins.size(); ++k) {
    ASSERT_EQ(outs[1 + k].shape(), ins[k].shape()) << what;
    for (int64_t e = 0; e < ins[k].numel(); ++e) {
      std::vector<Tensor> p = ins, m = ins;  // Tensor copies share storage: clone the one perturbed
      p[k] = ins[k].clone();
      m[k] = ins[k].clone();
      const double x = ins[k].get_f(e), step = h * std::max(1.0, std::abs(x));
      p[k].set_f(e, x + step);
      m[k].set_f(e, x - step);
      const double fd = (loss(fwd, p) - loss(fwd, m)) / (2 * step);
      const double ad = outs[1 + k].get_f(e);
      EXPECT_LE(std::abs(ad - fd), tol * std::max(1.0, std::abs(fd)))
          << what << ": d/d" << fwd.inputs[k]->name << "[" << e << "] autodiff " << ad << " vs differences " << fd;
    }
  }
}

std::vector<Tensor> random_inputs(const Case& cs, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Tensor> ins;
  for (size_t i = 0; i < cs.shapes.size(); ++i) {
    auto [lo, hi] = i < cs.range.size() ? cs.range[i] : std::pair<double, double>{-1, 1};
    std::uniform_real_distribution<double> u(lo, hi);
    std::vector<double> v(static_cast<size_t>(shape_numel(cs.shapes[i])));
    for (double& e : v) e = u(rng);
    ins.push_back(Tensor::from_f64(DType::f64, cs.shapes[i], v));
  }
  return ins;
}

class Rule : public ::testing::TestWithParam<Case> {};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string s = info.param.op + "_" + std::to_string(info.index);
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

}  // namespace

// Each case's primitive, differentiated with respect to every input, against central differences; the
// joint graph is checked raw and after the simplify pipeline.
TEST_P(Rule, MatchesCentralDifferencesInF64) {
  const Case& cs = GetParam();
  auto fwd = case_graph(cs);
  const std::vector<Tensor> ins = random_inputs(cs, 11);
  std::vector<std::string> wrt;
  for (const Value* v : fwd->inputs) wrt.push_back(v->name);
  for (bool simplify : {false, true}) {
    auto joint = case_graph(cs);
    AutodiffOptions o;
    o.wrt = wrt;
    AutodiffResult r = build_joint_graph(*joint, o);
    EXPECT_EQ(r.gradients.size(), wrt.size());
    verify_graph(*joint);
    if (simplify) run_pipeline(*joint, parse_pipeline("simplify"), PassOptions{});
    check_gradients(*fwd, *joint, ins, cs.h, cs.tol, cs.op + " (" + cs.label + (simplify ? ", simplified)" : ")"));
  }
}

INSTANTIATE_TEST_SUITE_P(Autodiff, Rule, ::testing::ValuesIn(cases()), case_name);

// The core-op table's vjp column is honest and complete: every primitive has a finite-difference case
// above (rule and zero alike), and only `none` primitives lack one. A new primitive fails here (and
// core_vjp does not compile) until it has a rule and a case.
TEST(Autodiff, EveryPrimitiveHasARuleAndACase) {
  std::set<std::string> tested;
  for (const Case& c : cases()) tested.insert(c.op);
  for (const CoreOpInfo& i : kCoreOps) {
    const std::string name(i.name);
    if (i.vjp == Vjp::none)
      EXPECT_FALSE(tested.count(name)) << name << " is marked none but has a derivative test";
    else
      EXPECT_TRUE(tested.count(name)) << name << " (vjp " << vjp_name(i.vjp) << ") has no finite-difference case";
  }
  for (const std::string& t : tested) EXPECT_TRUE(core_op_named(t).has_value()) << t;
}

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Autodiff, BadInputIsAOneLineErrorNamingIt) {
  auto make = [](Shape out_shape) {
    auto g = std::make_unique<Graph>();
    Node origin;
    origin.name = "t";
    CoreBuilder b(*g, origin);
    Value* x = g->add_input("x", {DType::f32, {2, 3}});
    Value* y = b.unary(CoreOp::exp, x);
    g->outputs = {out_shape.empty() ? b.reduce(y, "sum", {0, 1}, false) : y};
    return g;
  };
  auto big = make({2, 3});
  AutodiffOptions o;
  o.wrt = {"x"};
  std::string e = error_of([&] { build_joint_graph(*big, o); });
  EXPECT_NE(e.find("not a scalar"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  // With a seed the same output differentiates: the seed is an input of the output's type.
  o.seed = true;
  AutodiffResult r = build_joint_graph(*big, o);
  EXPECT_EQ(r.seed_input, big->inputs.back()->name);
  EXPECT_EQ(big->inputs.back()->type.shape, (Shape{2, 3}));

  auto g = make({});
  o = {};
  o.wrt = {"nope"};
  e = error_of([&] { build_joint_graph(*g, o); });
  EXPECT_NE(e.find("'nope'"), std::string::npos) << e;

  // An integer parameter.
  auto gi = std::make_unique<Graph>();
  {
    Node origin;
    origin.name = "t";
    CoreBuilder b(*gi, origin);
    Value* i = gi->add_input("i", {DType::i64, {3}});
    Value* x = gi->add_input("x", {DType::f32, {3}});
    gi->outputs = {b.reduce(b.mul(x, b.convert(i, DType::f32)), "sum", {0}, false)};
  }
  o.wrt = {"i"};
  e = error_of([&] { build_joint_graph(*gi, o); });
  EXPECT_NE(e.find("'i' is i64"), std::string::npos) << e;

  // A primitive without a derivative on the path (bitcast_convert, vjp none) names the node.
  auto gb = std::make_unique<Graph>();
  {
    Node origin;
    origin.name = "/cast/Bitcast";
    CoreBuilder b(*gb, origin);
    Value* x = gb->add_input("x", {DType::f16, {3}});
    Value* y = b.emit(CoreOp::bitcast_convert, {x}, {{"dtype", std::string("bf16")}});
    gb->outputs = {b.reduce(b.convert(y, DType::f32), "sum", {0}, false)};
  }
  o.wrt = {"x"};
  e = error_of([&] { build_joint_graph(*gb, o); });
  EXPECT_NE(e.find("/cast/Bitcast"), std::string::npos) << e;
  EXPECT_NE(e.find("bitcast_convert"), std::string::npos) << e;

  // A graph-level (not decomposed) node on the path.
  auto gg = std::make_unique<Graph>();
  {
    Value* x = gg->add_input("x", {DType::f32, {2}});
    Node* n = gg->add_node(OpRegistry::get().find("Relu"), "/act/Relu", {x}, {"r"});
    infer_node(*n, {nullptr}, nullptr);
    Node origin;
    origin.name = "t";
    CoreBuilder b(*gg, origin);
    gg->outputs = {b.reduce(n->outputs[0], "sum", {0}, false)};
  }
  e = error_of([&] { build_joint_graph(*gg, o); });
  EXPECT_NE(e.find("/act/Relu"), std::string::npos) << e;
  EXPECT_NE(e.find("core pipeline"), std::string::npos) << e;
}

// A parameter that does not reach the output gets a zero gradient; a value used twice sums its
// cotangents (x*x + x: 2x + 1).
TEST(Autodiff, UnusedParameterIsZeroAndUsesSum) {
  Graph g;
  Node origin;
  origin.name = "t";
  CoreBuilder b(g, origin);
  Value* x = g.add_input("x", {DType::f64, {3}});
  Value* u = g.add_input("u", {DType::f64, {2}});
  (void)u;
  g.outputs = {b.reduce(b.add(b.mul(x, x), x), "sum", {0}, false)};
  AutodiffOptions o;
  o.wrt = {"x", "u"};
  AutodiffResult r = build_joint_graph(g, o);
  EXPECT_EQ(r.gradients, (std::vector<std::string>{"x.grad", "u.grad"}));
  run_pipeline(g, parse_pipeline("simplify"), PassOptions{});
  name_gradient_outputs(g, r);
  std::vector<Tensor> outs = run_eager(g, {Tensor::from_f64(DType::f64, {3}, std::vector<double>{1, 2, -3}),
                                           Tensor::from_f64(DType::f64, {2}, std::vector<double>{5, 6})});
  ASSERT_EQ(outs.size(), 3u);
  EXPECT_EQ(outs[1].to_f64(), (std::vector<double>{3, 5, -5}));
  EXPECT_EQ(outs[2].to_f64(), (std::vector<double>{0, 0}));
}

namespace {

// The core graph `g` computed in f64: f32 inputs, constants and convert targets become f64, and every
// node's result type is inferred again. Whole models checked against differences need f64 to resolve
// 1e-6.
void retype_f32_to_f64(Graph& g) {
  for (Value* v : g.inputs)
    if (v->type.dtype == DType::f32) v->type.dtype = DType::f64;
  for (Value* v : g.constants())
    if (v->type.dtype == DType::f32) {
      v->constant = Tensor::from_f64(DType::f64, v->type.shape, v->constant->to_f64());
      v->type.dtype = DType::f64;
    }
  for (const auto& n : g.nodes()) {
    auto it = n->attrs.find("dtype");
    if (it != n->attrs.end() && std::get<std::string>(it->second) == "f32") it->second = std::string("f64");
    std::vector<const Tensor*> known;
    for (const Value* v : n->inputs) known.push_back(v && v->constant ? &*v->constant : nullptr);
    infer_node(*n, known, nullptr);
  }
}

Tensor to_f64(const Tensor& t) { return is_float(t.dtype()) ? Tensor::from_f64(DType::f64, t.shape(), t.to_f64()) : t; }

class WholeModel : public ::testing::TestWithParam<std::string> {};

}  // namespace

// A model's parameters (its float initializers), through the core pipeline and autodiff, in f64: the
// gradient of <output, seed> of every parameter, along a random direction, against central
// differences of the forward graph along it (every element of every gradient counts).
TEST_P(WholeModel, GradientsMatchDifferencesInF64) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared/models";
  auto [m, data, refs] = testenv::load_corpus_model(GetParam());
  Graph& g = *m.graph;
  const size_t num_data = g.inputs.size();
  std::vector<LiftedParameter> params = lift_parameters(g);
  ASSERT_FALSE(params.empty());
  run_pipeline(g, parse_pipeline("core"), PassOptions{});
  retype_f32_to_f64(g);
  // The differences run the forward alone: the same model through the same steps, without autodiff.
  auto fm = testenv::load_corpus_model(GetParam());
  Graph& f = *fm.model.graph;
  lift_parameters(f);
  run_pipeline(f, parse_pipeline("core"), PassOptions{});
  retype_f32_to_f64(f);
  f.outputs.resize(1);
  run_pipeline(f, parse_pipeline("dce"), PassOptions{});
  AutodiffOptions o;
  o.output = g.outputs[0]->name;
  o.seed = true;
  for (const auto& p : params) o.wrt.push_back(p.name);
  const size_t num_out = g.outputs.size();
  AutodiffResult r = build_joint_graph(g, o);
  EXPECT_GE(r.softmax_max_skipped, 1) << "both models' attention softmax: its max gets no cotangent";
  run_pipeline(g, parse_pipeline("simplify"), PassOptions{});
  ASSERT_EQ(g.outputs.size(), num_out + params.size());

  std::vector<Tensor> ins;
  for (size_t i = 0; i < num_data; ++i) ins.push_back(to_f64(data[i]));
  for (const auto& p : params) ins.push_back(to_f64(p.value));
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  const Shape& os = g.inputs.back()->type.shape;
  std::vector<double> seed(static_cast<size_t>(shape_numel(os)));
  for (double& v : seed) v = u(rng);
  ins.push_back(Tensor::from_f64(DType::f64, os, seed));
  auto objective = [&](std::vector<Tensor> x) {
    x.pop_back();  // the seed
    const std::vector<double> y = run_eager(f, x)[0].to_f64();
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * seed[i];
    return s;
  };
  const std::vector<Tensor> outs = run_eager(g, ins);
  for (size_t k = 0; k < params.size(); ++k) {
    const std::vector<double> grad = outs[num_out + k].to_f64();
    const size_t slot = num_data + k;
    const std::vector<double> x = ins[slot].to_f64();
    std::vector<double> dir(x.size()), xp(x.size()), xm(x.size());
    // Each element moves relative to its size: masks hold -3.4e38 next to 0.
    double ad = 0;
    for (size_t e = 0; e < x.size(); ++e) {
      dir[e] = u(rng) * std::max(1.0, std::abs(x[e]));
      ad += grad[e] * dir[e];
    }
    const double step = 1e-5;
    for (size_t e = 0; e < x.size(); ++e) xp[e] = x[e] + step * dir[e], xm[e] = x[e] - step * dir[e];
    std::vector<Tensor> p = ins, mi = ins;
    p[slot] = Tensor::from_f64(DType::f64, ins[slot].shape(), xp);
    mi[slot] = Tensor::from_f64(DType::f64, ins[slot].shape(), xm);
    const double fd = (objective(p) - objective(mi)) / (2 * step);
    EXPECT_LE(std::abs(ad - fd), 1e-6 * std::max(1.0, std::abs(fd)))
        << GetParam() << ": d/d" << params[k].name << " along a random direction: autodiff " << ad << " vs " << fd;
  }
}

// tblock_s and tblock_bert always; TESSEL_AUTODIFF_MODELS=bert_tiny,gpt2_tiny (a comma list of
// ../shared/models folders) checks others by hand (slower: every parameter runs the forward twice).
std::vector<std::string> whole_models() {
  const char* env = std::getenv("TESSEL_AUTODIFF_MODELS");
  if (!env || !*env) return {"tblock_s", "tblock_bert"};
  std::vector<std::string> out;
  std::string s = env;
  for (size_t b = 0; b <= s.size();) {
    const size_t e = std::min(s.find(',', b), s.size());
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Autodiff, WholeModel, ::testing::ValuesIn(whole_models()));

// docs/passes/autodiff.md: the before block through `compile --train --wrt w` (build_train_graph) prints
// as the after block with the page's summary line, and computes the page's numbers.
TEST(Autodiff, DocsWorkedExample) {
  const std::string md = testenv::read_text(testenv::source_dir() + "/docs/passes/autodiff.md");
  auto g = parse_graph(testenv::md_block(md, "```tsl before"), "docs/passes/autodiff.md");
  TrainOptions o;
  o.wrt = {"w"};
  TrainGraph t = build_train_graph(*g, o);
  EXPECT_EQ(print_graph(*g), testenv::md_block(md, "```tsl after"));
  EXPECT_NE(md.find("```\n" + train_summary(t) + "\n```"), std::string::npos) << train_summary(t);
  std::vector<Tensor> outs = run_eager(*g, {Tensor::from_f64(DType::f32, {2, 3}, std::vector<double>{1, 2, 3, -1, 0, 2}),
                                            Tensor::from_f64(DType::f32, {3}, std::vector<double>{0.5, -0.25, 0.125})});
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_NEAR(outs[0].get_f(0), 0.1134, 5e-5);
  const std::vector<double> want = {-0.0684, 1.7432, 4.4948};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(outs[1].get_f(static_cast<int64_t>(i)), want[i], 5e-5);
  // The summary line of --train, as the CLI prints it.
  EXPECT_EQ(t.forward_nodes, 3u);
  EXPECT_EQ(t.saved.tensors, 1u);  // %y (tanh's rule reads its result)
  EXPECT_EQ(t.saved.bytes, 8);
}

// The min-cut partition (passes/remat_partition.cpp): sum(exp(tanh(x·w))²) reads tanh's and exp's
// results in the backward; saving the matmul's result alone (it may not be recomputed) and recomputing
// tanh and exp is cheaper, and the saved set must cover what the backward reads.
TEST(Autodiff, RematPartitionSavesTheMatmulAndRecomputesThePointwise) {
  Graph g;
  Node origin;
  origin.name = "t";
  CoreBuilder b(g, origin);
  Value* x = g.add_input("x", {DType::f32, {4, 8}});
  Value* w = g.add_input("w", {DType::f32, {8, 16}});
  Value* h = b.emit(CoreOp::dot_general, {x, w}, {{"lhs_contract", Ints{1}}, {"rhs_contract", Ints{0}}});
  Value* e = b.unary(CoreOp::exp, b.unary(CoreOp::tanh, h));
  g.outputs = {b.reduce(b.mul(e, e), "sum", {0, 1}, false)};
  AutodiffOptions o;
  o.wrt = {"w"};
  build_joint_graph(g, o);
  run_pipeline(g, parse_pipeline("simplify"), PassOptions{});
  const SavedActivations all = saved_activations(g, 1);
  EXPECT_GE(all.tensors, 2u);  // tanh's and exp's results at least
  const RematPartition p = partition_for_remat(g, 1);
  ASSERT_EQ(p.saved.size(), 1u);
  EXPECT_EQ(p.saved[0], h);
  EXPECT_EQ(p.saved_bytes, 4 * 16 * 4);
  std::set<std::string> again;
  for (const Node* n : p.recomputed) again.insert(n->op_name());
  EXPECT_EQ(again, (std::set<std::string>{"tanh", "exp"}));
  EXPECT_LT(p.saved_bytes, all.bytes);
}

// The joint graph of tblock_s cut by its partition: the forward graph's outputs, then the backward graph
// on the saved values and the inputs, give exactly the joint graph's outputs (eager, f32).
TEST(Autodiff, SplitByPartitionComputesTheJointGraph) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared/models";
  auto [m, data, refs] = testenv::load_corpus_model("tblock_s");
  Graph& g = *m.graph;
  std::vector<LiftedParameter> params = lift_parameters(g);
  run_pipeline(g, parse_pipeline("core"), PassOptions{});
  AutodiffOptions o;
  o.seed = true;
  for (const auto& p : params) o.wrt.push_back(p.name);
  build_joint_graph(g, o);
  run_pipeline(g, parse_pipeline("simplify"), PassOptions{});
  const RematPartition p = partition_for_remat(g, 1);
  EXPECT_FALSE(p.recomputed.empty());
  SplitGraphs s = split_by_partition(g, 1, p);
  verify_graph(*s.forward);
  verify_graph(*s.backward);
  std::map<std::string, Tensor> by_name;
  std::vector<Tensor> ins = data;
  for (const auto& lp : params) ins.push_back(lp.value);
  Tensor seed = Tensor::from_f64(DType::f32, g.inputs.back()->type.shape,
                                 std::vector<double>(static_cast<size_t>(shape_numel(g.inputs.back()->type.shape)), 0.5));
  ins.push_back(seed);
  for (size_t i = 0; i < ins.size(); ++i) by_name[g.inputs[i]->name] = ins[i];
  const std::vector<Tensor> joint = run_eager(g, ins);
  std::vector<Tensor> fin;
  for (const Value* v : s.forward->inputs) fin.push_back(by_name.at(v->name));
  const std::vector<Tensor> fout = run_eager(*s.forward, fin);
  ASSERT_EQ(fout.size(), 1 + p.saved.size());
  EXPECT_EQ(fout[0].to_f64(), joint[0].to_f64());
  for (size_t i = 0; i < p.saved.size(); ++i) by_name[p.saved[i]->name] = fout[1 + i];
  std::vector<Tensor> bin;
  for (const Value* v : s.backward->inputs) bin.push_back(by_name.at(v->name));
  const std::vector<Tensor> bout = run_eager(*s.backward, bin);
  ASSERT_EQ(bout.size(), params.size());
  for (size_t k = 0; k < params.size(); ++k) EXPECT_EQ(bout[k].to_f64(), joint[1 + k].to_f64()) << params[k].name;
}

// Ties of max/min as PyTorch's rules give them: relu'(0) = 0 (threshold_backward: g where x > 0), a
// clip bound passes nothing at the bound (hardtanh_backward: g where lo < x < hi), while max of two
// computed values that tie splits g/2 each (torch.maximum). The expected values are those rules, not
// differences (a central difference at a kink gives 1/2).
TEST(Autodiff, TiesWithAConstantGoToTheConstantAsPyTorch) {
  auto g = parse_graph(
      "graph @ties(%x: f32[6], %y: f32[6]) {\n"
      "  const %lo: f32[] = [0]\n"
      "  const %hi: f32[] = [6]\n"
      "  %r: f32[6] = Relu(%x) loc(\"relu\")\n"
      "  %c: f32[6] = Clip(%x, %lo, %hi) loc(\"clip\")\n"
      "  %m: f32[6] = Max(%x, %y) loc(\"max\")\n"
      "  %s: f32[6] = Add(%r, %c) loc(\"s\")\n"
      "  %t: f32[6] = Mul(%m, %y) loc(\"t\")\n"
      "  %u: f32[6] = Add(%s, %t) loc(\"u\")\n"
      "  %l: f32[] = ReduceSum(%u) {keepdims = 0} loc(\"l\")\n"
      "  return %l\n"
      "}\n",
      "ties");
  TrainOptions o;
  o.wrt = {"x", "y"};
  build_train_graph(*g, o);
  const std::vector<double> x = {0, 6, 3, -1, 7, 2};
  const std::vector<double> y = {0, 1, 3, 5, 0, 2};
  std::vector<Tensor> outs = run_eager(*g, {Tensor::from_f64(DType::f32, {6}, x), Tensor::from_f64(DType::f32, {6}, y)});
  ASSERT_EQ(outs.size(), 3u);
  for (size_t i = 0; i < x.size(); ++i) {
    // d/dx: relu (x > 0) + clip (0 < x < 6) + y * d max/dx (1 if x > y, 1/2 if x == y).
    const double dmax = x[i] > y[i] ? 1.0 : x[i] == y[i] ? 0.5 : 0.0;
    const double gx = (x[i] > 0) + (x[i] > 0 && x[i] < 6) + y[i] * dmax;
    const double gy = std::max(x[i], y[i]) + y[i] * (x[i] < y[i] ? 1.0 : x[i] == y[i] ? 0.5 : 0.0);
    EXPECT_EQ(outs[1].get_f(static_cast<int64_t>(i)), gx) << "x = " << x[i] << ", y = " << y[i];
    EXPECT_EQ(outs[2].get_f(static_cast<int64_t>(i)), gy) << "x = " << x[i] << ", y = " << y[i];
  }
}

// Softmax's max (autodiff.cpp, softmax_shift): softmax and log softmax do not change when the max they
// subtract moves, so autodiff builds no cotangent for it -- the gradients are the closed forms
// dL/dt = y (c - sum_k c_k y_k) and c - y sum_k c_k, and the backward has no compare, count or select.
// A max read by something else (here also an output) keeps its cotangent, as does one CSE shares
// between a softmax and a log softmax of the same tensor (each pattern is matched alone: conservative).
TEST(Autodiff, SoftmaxMaxGetsNoCotangent) {
  const char* text =
      "graph @sm(%t: f32[3,4], %u: f32[3,4], %c: f32[3,4], %d: f32[3,4]) {\n"
      "  %y: f32[3,4] = Softmax(%t) {axis = 1} loc(\"sm\")\n"
      "  %ls: f32[3,4] = LogSoftmax(%u) {axis = 1} loc(\"lsm\")\n"
      "  %a: f32[3,4] = Mul(%y, %c) loc(\"a\")\n"
      "  %b: f32[3,4] = Mul(%ls, %d) loc(\"b\")\n"
      "  %s: f32[3,4] = Add(%a, %b) loc(\"s\")\n"
      "  %l: f32[] = ReduceSum(%s) {keepdims = 0} loc(\"l\")\n"
      "  return %l\n"
      "}\n";
  auto g = parse_graph(text, "sm");
  TrainOptions o;
  o.wrt = {"t", "u"};
  const TrainGraph tg = build_train_graph(*g, o);
  EXPECT_EQ(tg.autodiff.softmax_max_skipped, 2);
  for (const auto& n : g->nodes()) {
    EXPECT_NE(n->op_name(), "compare") << n->name;
    EXPECT_NE(n->op_name(), "select") << n->name;
  }
  std::vector<double> t(12), c(12), d(12);
  for (int i = 0; i < 12; ++i) t[i] = 0.3 * i - 1.5 + (i % 3), c[i] = 0.25 * (i % 5) - 0.5, d[i] = 0.5 - 0.1 * i;
  t[6] = t[5];  // a tie for row 1's max (2.0): with the max's cotangent it would be shared
  const Tensor tt = Tensor::from_f64(DType::f32, {3, 4}, t);
  std::vector<Tensor> outs = run_eager(*g, {tt, tt, Tensor::from_f64(DType::f32, {3, 4}, c),
                                            Tensor::from_f64(DType::f32, {3, 4}, d)});
  ASSERT_EQ(outs.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    double mx = -1e30, s = 0, cy = 0, sd = 0;
    for (int k = 0; k < 4; ++k) mx = std::max(mx, t[r * 4 + k]);
    for (int k = 0; k < 4; ++k) s += std::exp(t[r * 4 + k] - mx);
    for (int k = 0; k < 4; ++k) cy += c[r * 4 + k] * std::exp(t[r * 4 + k] - mx) / s, sd += d[r * 4 + k];
    for (int k = 0; k < 4; ++k) {
      const double y = std::exp(t[r * 4 + k] - mx) / s;
      EXPECT_NEAR(outs[1].get_f(r * 4 + k), y * (c[r * 4 + k] - cy), 1e-6) << "softmax " << r << "," << k;
      EXPECT_NEAR(outs[2].get_f(r * 4 + k), d[r * 4 + k] - y * sd, 1e-6) << "log softmax " << r << "," << k;
    }
  }

  // The max also an output: it is read by more than the softmax, so it keeps its cotangent.
  auto h = parse_graph(
      "graph @sm2(%t: f32[3,4], %c: f32[3,4]) {\n"
      "  const %ax: i64[1] = [1]\n"
      "  %m: f32[3,4] = Softmax(%t) {axis = 1} loc(\"sm\")\n"
      "  %a: f32[3,4] = Mul(%m, %c) loc(\"a\")\n"
      "  %l: f32[] = ReduceSum(%a) {keepdims = 0} loc(\"l\")\n"
      "  %mx: f32[3] = ReduceMax(%t, %ax) {keepdims = 0} loc(\"mx\")\n"
      "  %l2: f32[] = ReduceSum(%mx) {keepdims = 0} loc(\"l2\")\n"
      "  %L: f32[] = Add(%l, %l2) loc(\"L\")\n"
      "  return %L\n"
      "}\n",
      "sm2");
  TrainOptions oh;
  oh.wrt = {"t"};
  const TrainGraph th = build_train_graph(*h, oh);
  bool shares_max = false;
  for (const auto& n : h->nodes()) shares_max = shares_max || n->op_name() == "compare";
  // (CSE may merge the two maxes: then it is not skipped; if it does not, the softmax's own one is)
  if (shares_max) {
    EXPECT_EQ(th.autodiff.softmax_max_skipped, 0);
  }
  std::vector<Tensor> o2 = run_eager(*h, {Tensor::from_f64(DType::f32, {3, 4}, t), Tensor::from_f64(DType::f32, {3, 4}, c)});
  ASSERT_EQ(o2.size(), 2u);
  for (int r = 0; r < 3; ++r) {
    double mx = -1e30, s = 0, cy = 0;
    int ties = 0;
    for (int k = 0; k < 4; ++k) mx = std::max(mx, t[r * 4 + k]);
    for (int k = 0; k < 4; ++k) s += std::exp(t[r * 4 + k] - mx), ties += t[r * 4 + k] == mx;
    for (int k = 0; k < 4; ++k) cy += c[r * 4 + k] * std::exp(t[r * 4 + k] - mx) / s;
    for (int k = 0; k < 4; ++k) {
      const double y = std::exp(t[r * 4 + k] - mx) / s;
      const double want = y * (c[r * 4 + k] - cy) + (t[r * 4 + k] == mx ? 1.0 / ties : 0.0);
      EXPECT_NEAR(o2[1].get_f(r * 4 + k), want, 1e-6) << r << "," << k;
    }
  }
}
