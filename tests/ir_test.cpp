// Graph IR: construction, inference, the text form (print/parse round trip, malformed text), verifier.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/ir/printer.h"
#include "tessel/ir/verifier.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"

using namespace tessel;

namespace {

const OpDef* op(const char* name) {
  const OpDef* d = OpRegistry::get().find(name);
  EXPECT_NE(d, nullptr) << name;
  return d;
}

// y = (x + c) * x with a broadcast constant row.
std::unique_ptr<Graph> small_graph() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input("x", {DType::f32, {2, 3}});
  std::vector<double> cv = {1, 2, 3};
  Value* c = g->add_constant("c", Tensor::from_f64(DType::f32, {3}, cv));
  Node* add = g->add_node(op("Add"), "/block/add", {x, c}, {"s"});
  Node* mul = g->add_node(op("Mul"), "/block/mul", {add->outputs[0], x}, {"y"});
  g->outputs.push_back(mul->outputs[0]);
  infer_graph(*g);
  return g;
}

std::string expect_parse_error(const std::string& text) {
  try {
    parse_graph(text, "bad.tsl");
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return "";
}

// The verifier's message for `g`, or a failure (and "") when it accepts the graph.
std::string expect_verify_error(const Graph& g, const std::string& why) {
  try {
    verify_graph(g);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "the verifier accepted " << why;
  return "";
}

}  // namespace

TEST(Graph, InferAndRun) {
  auto g = small_graph();
  EXPECT_EQ(g->outputs[0]->type.str(), "f32[2,3]");
  verify_graph(*g);
  std::vector<double> xv = {1, 2, 3, 4, 5, 6};
  auto out = run_eager(*g, {Tensor::from_f64(DType::f32, {2, 3}, xv)});
  ASSERT_EQ(out.size(), 1u);
  // (x + c) * x with c broadcast over rows: row 0: (1+1)*1, (2+2)*2, (3+3)*3; row 1: (4+1)*4, ...
  std::vector<double> want = {2, 8, 18, 20, 35, 54};
  EXPECT_EQ(out[0].to_f64(), want);
}

TEST(Graph, PrintedForm) {
  auto g = small_graph();
  const std::string want =
      "# tessel graph level\n"
      "graph @main(%x: f32[2,3]) {\n"
      "  const %c: f32[3] = [1, 2, 3]\n"
      "  %s: f32[2,3] = Add(%x, %c) loc(\"/block/add\")\n"
      "  %y: f32[2,3] = Mul(%s, %x) loc(\"/block/mul\")\n"
      "  return %y\n"
      "}\n";
  EXPECT_EQ(print_graph(*g), want);
}

// Graph::clone: the same text (symbols included), the same value ids, and a copy that changes alone.
TEST(Graph, CloneIsWholeAndIndependent) {
  auto g = small_graph();
  auto c = g->clone();
  EXPECT_EQ(print_graph(*c), print_graph(*g));
  ASSERT_EQ(c->values().size(), g->values().size());
  for (size_t i = 0; i < g->values().size(); ++i) EXPECT_EQ(c->values()[i]->id, g->values()[i]->id);
  // Changing the copy leaves the original alone: a value renamed, an output replaced.
  ASSERT_TRUE(c->rename_value(c->outputs[0], "z"));
  c->outputs[0] = c->inputs[0];
  EXPECT_EQ(g->outputs[0]->name, "y");
  EXPECT_EQ(g->find_value("z"), nullptr);
  EXPECT_EQ(g->find_value("y"), g->outputs[0]);
  EXPECT_NE(c->find_value("z"), nullptr);
  auto s = parse_graph(
      "graph @f(%x: f32[s0,4]) symbols(s0 in [1, 64]) {\n"
      "  %y: f32[s0,4] = neg(%x) loc(\"n\")\n"
      "  return %y\n"
      "}\n");
  auto sc = s->clone();
  EXPECT_EQ(print_graph(*sc), print_graph(*s));
  EXPECT_EQ(sc->symbols.all().size(), 1u);
  verify_graph(*sc);
}

TEST(Graph, RoundTripWithBlobsAttributesAndQuotedNames) {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input("onnx::input:0", {DType::f16, {2, 8}});
  std::vector<double> w(16);
  for (int i = 0; i < 16; ++i) w[i] = i * 0.25 - 1;
  Value* c = g->add_constant("w", Tensor::from_f64(DType::f16, {2, 8}, w));
  Node* n = g->add_node(op("Add"), "odd \"name\"\n", {x, c}, {"out"});
  n->attrs.clear();
  g->outputs.push_back(n->outputs[0]);
  infer_graph(*g);
  std::string p1 = print_graph(*g);
  EXPECT_NE(p1.find("%\"onnx::input:0\""), std::string::npos);
  EXPECT_NE(p1.find("blob<0>"), std::string::npos);
  auto g2 = parse_graph(p1);
  verify_graph(*g2);
  EXPECT_EQ(print_graph(*g2), p1);
  EXPECT_TRUE(g2->find_value("w")->constant->same_as(*c->constant));
}

TEST(Graph, AttributesRoundTrip) {
  // Attribute values of every kind survive print -> parse -> print (checked on a node whose op
  // accepts no attributes: the parser keeps them and the verifier is what rejects them).
  auto g = small_graph();
  Node* n = g->mutable_nodes()[0].get();
  n->attrs["i"] = int64_t{-3};
  n->attrs["f"] = 1.0;
  n->attrs["g"] = 1e-5;
  n->attrs["s"] = std::string("a \"b\"");
  n->attrs["li"] = std::vector<int64_t>{1, -2};
  n->attrs["lf"] = std::vector<double>{0.5, 2.0};
  n->attrs["le"] = std::vector<int64_t>{};
  n->attrs["ls"] = std::vector<std::string>{"x", "y"};
  n->attrs["t"] = Tensor::scalar_i(DType::i64, 7);
  std::string p1 = print_graph(*g);
  EXPECT_NE(p1.find("{f = 1.0, g = 1.0000000000000001e-05, i = -3, le = ints[], lf = [0.5, 2.0], li = [1, -2], "
                    "ls = [\"x\", \"y\"], s = \"a \\\"b\\\"\", t = tensor<i64[]> [7]}"),
            std::string::npos)
      << p1;
  auto g2 = parse_graph(p1);
  EXPECT_EQ(print_graph(*g2), p1);
  EXPECT_EQ(std::get<double>(g2->nodes()[0]->attrs.at("f")), 1.0);
  EXPECT_EQ(std::get<std::vector<int64_t>>(g2->nodes()[0]->attrs.at("le")).size(), 0u);
  const std::string msg = expect_verify_error(*g2, "attributes outside the schema");
  EXPECT_NE(msg.find("node '/block/add' (Add)"), std::string::npos) << msg;
}

TEST(Parser, ErrorsCarryLineAndColumn) {
  EXPECT_NE(expect_parse_error("graph @g(%x: f32[2]) {\n  %y: f32[2] = Frobnicate(%x) loc(\"n\")\n  return %y\n}\n")
                .find("bad.tsl:2:16: [parse] unknown op 'Frobnicate'"),
            std::string::npos);
  EXPECT_NE(expect_parse_error("graph @g(%x: f33[2]) {\n}\n").find("bad.tsl:1:14: [parse] unknown dtype 'f33'"),
            std::string::npos);
  EXPECT_NE(expect_parse_error("graph @g(%x: f32[2]) {\n  %y: f32[2] = Add(%x, %z) loc(\"n\")\n  return %y\n}\n")
                .find("bad.tsl:2:26: [parse] use of undefined value '%z'"),
            std::string::npos);
  EXPECT_NE(expect_parse_error("graph @g(%x: f32[2]) {\n  const %c: f32[2] = [1]\n  return %x\n}\n")
                .find("1 elements given for f32[2]"),
            std::string::npos);
  EXPECT_NE(expect_parse_error("graph @g(%x: f32[2]) {\n  return %x\n").find("expected '}'"), std::string::npos);
  EXPECT_NE(expect_parse_error("graph @g(%x: f32[2]) {\n  const %c: f32[20] = blob<3>\n  return %c\n}\n")
                .find("bad.tsl:2:23: [parse] blob<3> is not defined"),
            std::string::npos);
  EXPECT_NE(expect_parse_error("graph @g(%x: f32[2]) {\n  const %c: f32[20] = blob<elided 80 bytes>\n  return %c\n}\n")
                .find("elided"),
            std::string::npos);
}

TEST(Verifier, NamesTheNode) {
  auto g = small_graph();
  // Break the type of the Add's output: the verifier re-runs the shape rule and names the node.
  g->mutable_nodes()[0]->outputs[0]->type.shape = {3, 2};
  const std::string msg = expect_verify_error(*g, "a wrong type");
  EXPECT_NE(msg.find("node '/block/add' (Add)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f32[3,2]"), std::string::npos) << msg;
}

TEST(Verifier, UseBeforeDefinition) {
  auto g = small_graph();
  std::swap(g->mutable_nodes()[0], g->mutable_nodes()[1]);
  const std::string msg = expect_verify_error(*g, "a use before its definition");
  EXPECT_NE(msg.find("used before it is defined"), std::string::npos) << msg;
}

TEST(Interpreter, RejectsWrongInputs) {
  auto g = small_graph();
  std::vector<double> v(6, 1.0);
  try {
    run_eager(*g, {Tensor::from_f64(DType::f32, {3, 2}, v)});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input 'x' must have shape [2,3] but got [3,2]"), std::string::npos) << e.what();
  }
  try {
    run_eager(*g, {Tensor::from_f64(DType::f64, {2, 3}, v)});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input 'x' must be f32[2,3] but got f64[2,3]"), std::string::npos) << e.what();
  }
}

// unique_name gives the first free `base_N`, as probing from 1 would, though it resumes where the last
// probe for that base stopped (issue 41: a Scan of 8192 steps took minutes to import); a name freed by
// compact() or rename_value() is found again.
TEST(Graph, UniqueNameIsTheFirstFreeSuffix) {
  Graph g;
  const TensorType t = TensorType::of(DType::f32, Dims{4});
  Value* x = g.add_input("x", t);
  EXPECT_EQ(g.unique_name("y"), "y");
  EXPECT_EQ(g.unique_name("x"), "x_1");
  EXPECT_EQ(g.unique_name("x"), "x_1");  // not taken yet: the same answer
  for (int i = 0; i < 5; ++i) g.add_value("x", t);
  EXPECT_EQ(g.find_value("x_5")->name, "x_5");
  EXPECT_EQ(g.unique_name("x"), "x_6");
  Value* three = g.find_value("x_3");
  ASSERT_TRUE(g.rename_value(three, "renamed"));
  EXPECT_EQ(g.unique_name("x"), "x_3");  // freed by the rename
  g.add_value("x", t);                    // takes x_3
  g.compact();                            // drops every value nothing defines or uses: all but the input
  EXPECT_EQ(g.unique_name("x"), "x_1");
  EXPECT_EQ(x->name, "x");
  Graph h;
  h.add_input("a", t);
  for (int i = 0; i < 20000; ++i) h.add_value("a", t);  // (quadratic before: 2e8 probes)
  EXPECT_EQ(h.unique_name("a"), "a_20001");
}

// The verifier's re-inference computes a small constant subgraph's values only when a later rule
// reads them (issue 41: every broadcast of a constant re-ran after every pass). A Reshape whose shape
// is the end of a chain of 100 000 constant Adds reads it: the chain is evaluated then, in order and
// without recursion, and a wrong stored type behind it is still caught.
TEST(Verifier, ComputesDeferredValuesWhenARuleReadsThem) {
  const int n = 100000;
  std::string text = "graph @g(%x: f32[64]) {\n  const %c: i64[2] = [2,16]\n  const %one: i64[2] = [1,1]\n";
  std::string prev = "%c";
  for (int i = 0; i < n; ++i) {
    // [1,1] added and subtracted in turn: the chain ends where it began, at [2,16].
    const bool add = i % 2 == 0;
    text += fmt::format("  %a{}: i64[2] = {}({}, %one) loc(\"a{}\")\n", i, add ? "Add" : "Sub", prev, i);
    prev = fmt::format("%a{}", i);
  }
  text += fmt::format("  %b: i64[2] = Add({}, %one) loc(\"b\")\n", prev);  // [3,17]
  text += "  const %fix: i64[2] = [1,-1]\n  %s: i64[2] = Add(%b, %fix) loc(\"s\")\n";  // [4,16]
  text += "  %y: f32[4,16] = Reshape(%x, %s) loc(\"y\")\n  return %y\n}\n";
  auto g = parse_graph(text, "chain.tsl");
  EXPECT_NO_THROW(verify_graph(*g));
  g->outputs[0]->type = TensorType::of(DType::f32, Dims{8, 8});
  const std::string msg = expect_verify_error(*g, "a wrong type behind a deferred shape");
  EXPECT_NE(msg.find("f32[4,16]"), std::string::npos) << msg;
}

// Values are renamed only through the graph (add_value, rename_value, hand_name_over), which keeps
// its name index true; hand_name_over gives the carrier the model's name and frees it nowhere else.
TEST(Graph, HandNameOverKeepsTheIndex) {
  Graph g;
  const TensorType t = TensorType::of(DType::f32, Dims{4});
  Value* old = g.add_value("y", t);
  Value* carrier = g.add_value("tmp", t);
  g.add_value("y.replaced", t);  // taken: the old value gets the next free name
  g.hand_name_over(old, carrier);
  EXPECT_EQ(carrier->name, "y");
  EXPECT_EQ(old->name, "y.replaced_1");
  EXPECT_EQ(g.find_value("y"), carrier);
  EXPECT_EQ(g.find_value("tmp"), nullptr);
  EXPECT_EQ(g.check_name_index(), "");
  old->name = "behind_its_back";  // what no pass may do
  EXPECT_NE(g.check_name_index().find("behind_its_back"), std::string::npos);
}
