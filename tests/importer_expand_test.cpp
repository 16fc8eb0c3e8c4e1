// Ops the ONNX importer expands into graph ops (If, Scan, GRU, LSTM, Adam, ...) and the opset-6 PRelu
// rule, checked against float64 references written here; TreeEnsemble's kernel against hand results.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "op_test_util.h"
#include "tessel/frontend/onnx/importer.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"

using namespace tessel;
namespace fs = std::filesystem;

namespace {

// A model under construction: f32 graph inputs, initializers, nodes with attributes, outputs.
struct Model {
  onnx::ModelProto m;
  std::vector<Tensor> feeds;
  explicit Model(int opset = 22) {
    m.set_ir_version(10);
    auto* o = m.add_opset_import();
    o->set_domain("");
    o->set_version(opset);
    m.mutable_graph()->set_name("g");
  }
  void opset(const std::string& domain, int v) {
    auto* o = m.add_opset_import();
    o->set_domain(domain);
    o->set_version(v);
  }
  static void set_type(onnx::ValueInfoProto* vi, const std::string& name, int elem, const Shape& s) {
    vi->set_name(name);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(elem);
    auto* sh = tt->mutable_shape();
    for (int64_t d : s) sh->add_dim()->set_dim_value(d);
  }
  void input(const std::string& name, const Tensor& value) {
    set_type(m.mutable_graph()->add_input(), name, dtype_to_onnx(value.dtype()), value.shape());
    feeds.push_back(value);
  }
  void output(const std::string& name, int elem = 1) {
    auto* o = m.mutable_graph()->add_output();
    o->set_name(name);
    o->mutable_type()->mutable_tensor_type()->set_elem_type(elem);
  }
  static onnx::NodeProto* node(onnx::GraphProto* g, const std::string& op, std::vector<std::string> ins,
                               std::vector<std::string> outs, const std::string& domain = "") {
    auto* n = g->add_node();
    n->set_op_type(op);
    n->set_domain(domain);
    for (auto& i : ins) n->add_input(i);
    for (auto& o : outs) n->add_output(o);
    return n;
  }
  onnx::NodeProto* node(const std::string& op, std::vector<std::string> ins, std::vector<std::string> outs,
                        const std::string& domain = "") {
    return node(m.mutable_graph(), op, std::move(ins), std::move(outs), domain);
  }
  std::string save(const std::string& file) const {
    fs::path d = fs::temp_directory_path() / ("tessel_expand_test_" + std::to_string(getpid()));
    fs::create_directories(d);
    std::ofstream f(d / file, std::ios::binary);
    m.SerializeToOstream(&f);
    return (d / file).string();
  }
  std::vector<Tensor> run(const std::string& file) const {
    ImportOptions o;
    for (const Tensor& t : feeds) o.input_shapes.push_back(t.shape());
    ImportedModel im = import_onnx(save(file), o);
    return run_eager(*im.graph, feeds);
  }
  std::string error(const std::string& file, bool* is_unsupported) const {
    try {
      run(file);
    } catch (const Error& e) {
      *is_unsupported = e.is_unsupported();
      return e.what();
    }
    ADD_FAILURE() << "no error for " << file;
    return "";
  }
};

void attr_i(onnx::NodeProto* n, const std::string& name, int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}
void attr_f(onnx::NodeProto* n, const std::string& name, float v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(v);
}
void attr_s(onnx::NodeProto* n, const std::string& name, const std::string& v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(v);
}
void attr_ints(onnx::NodeProto* n, const std::string& name, const std::vector<int64_t>& v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}
onnx::GraphProto* attr_g(onnx::NodeProto* n, const std::string& name) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::GRAPH);
  return a->mutable_g();
}

// An If on the graph input `c` whose output is `out`: each branch one op over the outer value `x`, its
// result of the given shape.
void add_if(Model& md, const std::string& out, const std::string& then_op, const Shape& then_shape,
            const std::string& else_op, const Shape& else_shape) {
  auto* n = md.node("If", {"c"}, {out});
  auto* then_g = attr_g(n, "then_branch");
  Model::node(then_g, then_op, {"x"}, {"t"});
  Model::set_type(then_g->add_output(), "t", 1, then_shape);
  auto* else_g = attr_g(n, "else_branch");
  Model::node(else_g, else_op, {"x"}, {"e"});
  Model::set_type(else_g->add_output(), "e", 1, else_shape);
}

Tensor random_f32(const Shape& s, unsigned seed, double lo = -1, double hi = 1) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = static_cast<float>(d(gen));
  return Tensor::from_f64(DType::f32, s, v);
}

void expect_close(const Tensor& got, const std::vector<double>& want, double tol = 1e-5) {
  std::vector<double> g = got.to_f64();
  ASSERT_EQ(g.size(), want.size());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], want[i], tol * (1 + std::fabs(want[i]))) << "element " << i;
}

double sigm(double x) { return 1 / (1 + std::exp(-x)); }

// ---- float64 references of the recurrent cells (ONNX gate orders: GRU z r h, LSTM i o f c) ----

struct Rec {
  int64_t S, B, I, H;
  std::vector<double> x, w, r, b, h0;  // one direction's slice of W, R, B, initial_h
};

// h' for one step of a GRU with linear_before_reset = 1.
std::vector<double> gru_step(const Rec& p, const std::vector<double>& h, int64_t t) {
  const int64_t B = p.B, I = p.I, H = p.H;
  std::vector<double> out(static_cast<size_t>(B * H));
  for (int64_t bi = 0; bi < B; ++bi) {
    auto gate = [&](int g, int64_t j, bool with_x) {
      double xw = 0, hr = 0;
      for (int64_t k = 0; k < I && with_x; ++k) xw += p.x[(t * B + bi) * I + k] * p.w[(g * H + j) * I + k];
      for (int64_t k = 0; k < H; ++k) hr += h[bi * H + k] * p.r[(g * H + j) * H + k];
      return std::pair{xw + p.b[g * H + j], hr + p.b[3 * H + g * H + j]};
    };
    for (int64_t j = 0; j < H; ++j) {
      auto [zx, zh] = gate(0, j, true);
      auto [rx, rh] = gate(1, j, true);
      auto [hx, hh] = gate(2, j, true);
      const double z = sigm(zx + zh), r = sigm(rx + rh);
      const double cand = std::tanh(hx + r * hh);
      out[bi * H + j] = (1 - z) * cand + z * h[bi * H + j];
    }
  }
  return out;
}

}  // namespace

// Bidirectional GRU (linear_before_reset = 1, biases, initial state): Y and Y_h against float64.
TEST(ImportExpand, BidirectionalGruMatchesFloat64Reference) {
  const int64_t S = 3, B = 2, I = 2, H = 3;
  Tensor x = random_f32({S, B, I}, 1), w = random_f32({2, 3 * H, I}, 2), r = random_f32({2, 3 * H, H}, 3);
  Tensor b = random_f32({2, 6 * H}, 4), h0 = random_f32({2, B, H}, 5);
  Model md;
  md.input("X", x), md.input("W", w), md.input("R", r), md.input("B", b), md.input("h0", h0);
  auto* n = md.node("GRU", {"X", "W", "R", "B", "", "h0"}, {"Y", "Y_h"});
  attr_i(n, "hidden_size", H);
  attr_i(n, "linear_before_reset", 1);
  attr_s(n, "direction", "bidirectional");
  md.output("Y"), md.output("Y_h");
  std::vector<Tensor> out = md.run("gru.onnx");
  ASSERT_EQ(out[0].shape(), (Shape{S, 2, B, H}));
  std::vector<double> y(static_cast<size_t>(S * 2 * B * H)), yh(static_cast<size_t>(2 * B * H));
  for (int64_t d = 0; d < 2; ++d) {
    auto part = [&](const Tensor& t, int64_t n_per) {
      std::vector<double> all = t.to_f64();
      return std::vector<double>(all.begin() + d * n_per, all.begin() + (d + 1) * n_per);
    };
    Rec p{S, B, I, H, x.to_f64(), part(w, 3 * H * I), part(r, 3 * H * H), part(b, 6 * H), part(h0, B * H)};
    std::vector<double> h = p.h0;
    for (int64_t k = 0; k < S; ++k) {
      const int64_t t = d == 0 ? k : S - 1 - k;
      h = gru_step(p, h, t);
      std::copy(h.begin(), h.end(), y.begin() + (t * 2 + d) * B * H);
    }
    std::copy(h.begin(), h.end(), yh.begin() + d * B * H);
  }
  expect_close(out[0], y);
  expect_close(out[1], yh);
}

// LSTM with peepholes and sequence_lens: past its length an entry keeps its state and outputs zeros.
TEST(ImportExpand, LstmWithPeepholesAndSequenceLengths) {
  const int64_t S = 3, B = 2, I = 1, H = 2;
  Tensor x = random_f32({S, B, I}, 11), w = random_f32({1, 4 * H, I}, 12), r = random_f32({1, 4 * H, H}, 13);
  Tensor p = random_f32({1, 3 * H}, 14);
  const std::vector<int64_t> lens = {3, 1};
  Model md;
  md.input("X", x), md.input("W", w), md.input("R", r), md.input("L", Tensor::from_i64(DType::i32, {B}, lens));
  md.input("P", p);
  auto* n = md.node("LSTM", {"X", "W", "R", "", "L", "", "", "P"}, {"Y", "Y_h", "Y_c"});
  attr_i(n, "hidden_size", H);
  md.output("Y"), md.output("Y_h"), md.output("Y_c");
  std::vector<Tensor> out = md.run("lstm.onnx");
  const std::vector<double> xv = x.to_f64(), wv = w.to_f64(), rv = r.to_f64(), pv = p.to_f64();
  std::vector<double> h(B * H, 0.0), c(B * H, 0.0), y(S * B * H, 0.0);
  for (int64_t t = 0; t < S; ++t) {
    std::vector<double> hn = h, cn = c;
    for (int64_t bi = 0; bi < B; ++bi) {
      if (t >= lens[bi]) continue;
      auto pre = [&](int g, int64_t j) {
        double s = xv[t * B + bi] * wv[g * H + j];
        for (int64_t k = 0; k < H; ++k) s += h[bi * H + k] * rv[(g * H + j) * H + k];
        return s;
      };
      for (int64_t j = 0; j < H; ++j) {
        const double cp = c[bi * H + j];
        const double i = sigm(pre(0, j) + pv[j] * cp), f = sigm(pre(2, j) + pv[2 * H + j] * cp);
        const double cc = std::tanh(pre(3, j));
        const double cnew = f * cp + i * cc;
        const double o = sigm(pre(1, j) + pv[H + j] * cnew);
        cn[bi * H + j] = cnew;
        hn[bi * H + j] = o * std::tanh(cnew);
        y[(t * B + bi) * H + j] = hn[bi * H + j];
      }
    }
    h = hn, c = cn;
  }
  expect_close(out[0], y);
  expect_close(out[1], h);
  expect_close(out[2], c);
}

// Scan-9 over axis 1 in reverse: a running sum as state, each partial sum as a scan output.
TEST(ImportExpand, ReverseScanOverAxisOne) {
  Tensor init = Tensor::from_f64(DType::f32, {2}, std::vector<double>{0, 100});
  Tensor xs = Tensor::from_f64(DType::f32, {2, 3}, std::vector<double>{1, 2, 3, 4, 5, 6});
  Model md(16);
  md.input("init", init), md.input("xs", Tensor::from_f64(DType::f32, {2, 3}, xs.to_f64()));
  auto* n = md.node("Scan", {"init", "xs"}, {"final", "partials"});
  attr_i(n, "num_scan_inputs", 1);
  attr_ints(n, "scan_input_axes", {1});
  attr_ints(n, "scan_input_directions", {1});
  auto* body = attr_g(n, "body");
  Model::set_type(body->add_input(), "s", 1, {2});
  Model::set_type(body->add_input(), "e", 1, {2});
  Model::node(body, "Add", {"s", "e"}, {"s2"});
  Model::node(body, "Identity", {"s2"}, {"o"});
  Model::set_type(body->add_output(), "s2", 1, {2});
  Model::set_type(body->add_output(), "o", 1, {2});
  md.output("final"), md.output("partials");
  std::vector<Tensor> out = md.run("scan.onnx");
  // Columns taken in the order 2, 1, 0: state 0 -> 3, 5, 6; state 100 -> 106, 111, 115.
  expect_close(out[0], {6, 115});
  ASSERT_EQ(out[1].shape(), (Shape{3, 2}));
  expect_close(out[1], {3, 106, 5, 111, 6, 115});
}

// If on a condition known only at run time runs both branches and selects; branches whose outputs
// differ in shape are chosen at run time (tessel's Choose, an unknown dim where they differ: batched NMS
// of no boxes), and branches that differ in rank or dtype are refused, not guessed.
TEST(ImportExpand, IfWithRunTimeCondition) {
  for (int cond : {0, 1}) {
    Tensor c(DType::boolean, {});
    c.set_i(0, cond);
    Model md(13);
    md.input("c", c), md.input("x", Tensor::from_f64(DType::f32, {2}, std::vector<double>{1, -2}));
    add_if(md, "y", "Neg", {2}, "Abs", {2});  // branches reading an outer-scope value
    md.output("y");
    expect_close(md.run("if.onnx")[0], cond ? std::vector<double>{-1, 2} : std::vector<double>{1, 2});
    Model ms(13);
    ms.input("c", c), ms.input("x", Tensor::from_f64(DType::f32, {2}, std::vector<double>{1, -2}));
    add_if(ms, "y", "Identity", {2}, "ReduceSum", {1});
    ms.output("y");
    const Tensor y = ms.run("if_shapes.onnx")[0];
    ASSERT_EQ(y.shape(), cond ? Shape{2} : Shape{1});
    expect_close(y, cond ? std::vector<double>{1, -2} : std::vector<double>{-1});
  }
  Tensor c(DType::boolean, {});
  Model md(13);
  md.input("c", c), md.input("x", Tensor::from_f64(DType::f32, {2}, std::vector<double>{1, -2}));
  add_if(md, "y", "Identity", {2}, "Flatten", {2, 1});
  md.output("y");
  bool unsup = false;
  std::string e = md.error("if_ranks.onnx", &unsup);
  EXPECT_TRUE(unsup) << e;
  EXPECT_NE(e.find("needs both branches' output 0 to have one dtype and rank"), std::string::npos) << e;
}

// If inside If, `depth` deep: each then-branch holds the next If, each else-branch an Abs of `x`.
void add_nested_if(Model& md, int depth) {
  onnx::NodeProto* n = md.node("If", {"c"}, {"y"});
  for (int level = 0; level < depth; ++level) {
    const std::string t = fmt::format("t{}", level), e = fmt::format("e{}", level);
    onnx::NodeProto* cur = n;
    auto* then_g = attr_g(cur, "then_branch");
    if (level + 1 < depth) n = Model::node(then_g, "If", {"c"}, {t});
    else Model::node(then_g, "Neg", {"x"}, {t});
    Model::set_type(then_g->add_output(), t, 1, {2});
    auto* else_g = attr_g(cur, "else_branch");
    Model::node(else_g, "Abs", {"x"}, {e});
    Model::set_type(else_g->add_output(), e, 1, {2});
  }
}

// Subgraphs nested past protobuf's default recursion limit (100 messages: about 33 levels of If) are
// refused as that, not as a corrupt file; 30 levels import and run (issue 41: nested If).
TEST(ImportExpand, DeeplyNestedIfIsNamedAsSuch) {
  for (int depth : {30, 40}) {
    Tensor c(DType::boolean, {});
    c.set_i(0, 1);
    Model md(13);
    md.input("c", c), md.input("x", Tensor::from_f64(DType::f32, {2}, std::vector<double>{1, -2}));
    add_nested_if(md, depth);
    md.output("y");
    if (depth == 30) {
      expect_close(md.run("nested_if.onnx")[0], std::vector<double>{-1, 2});
    } else {
      bool unsup = false;
      const std::string e = md.error("nested_if_deep.onnx", &unsup);
      EXPECT_TRUE(unsup) << e;
      EXPECT_NE(e.find("nested deeper than protobuf parses by default"), std::string::npos) << e;
    }
  }
}

// ONNX graphs are in SSA form, as the ONNX checker holds them: an If whose output names a graph input,
// a node listing one output name twice, a Constant redefining a value, a graph output listed twice are
// one-line errors naming the name, not a silent rebinding (issue 41).
TEST(ImportExpand, SecondDefinitionsAreRefused) {
  auto refused = [](Model& md, const std::string& file, const std::string& want) {
    bool unsup = true;
    const std::string e = md.error(file, &unsup);
    EXPECT_FALSE(unsup) << e;
    EXPECT_NE(e.find(want), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  };
  Tensor c(DType::boolean, {});
  c.set_i(0, 1);
  {
    Model md(13);
    md.input("c", c), md.input("x", Tensor::from_f64(DType::f32, {2}, std::vector<double>{1, -2}));
    add_if(md, "x", "Neg", {2}, "Abs", {2});  // the If's output redefines the graph input x
    md.output("x");
    refused(md, "if_redefines.onnx", "redefines value 'x'");
  }
  {
    Model md(13);
    md.input("x", Tensor::from_f64(DType::f32, {4}, std::vector<double>{1, 2, 3, 4}));
    md.node("Split", {"x"}, {"a", "a"});
    md.output("a");
    refused(md, "split_twice.onnx", "redefines value 'a'");
  }
  {
    Model md(13);
    md.input("x", Tensor::from_f64(DType::f32, {2}, std::vector<double>{1, 2}));
    auto* k = md.node("Constant", {}, {"x"});
    auto* a = k->add_attribute();
    a->set_name("value_float");
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(1.0f);
    md.output("x");
    refused(md, "constant_redefines.onnx", "redefines value 'x'");
  }
  {
    Model md(13);
    md.input("x", Tensor::from_f64(DType::f32, {2}, std::vector<double>{1, 2}));
    md.node("Neg", {"x"}, {"y"});
    md.output("y"), md.output("y");
    refused(md, "output_twice.onnx", "graph output 'y' is listed twice");
  }
}

// Adam (ai.onnx.preview.training) at T = 0 (no bias correction) and T = 3, against float64.
TEST(ImportExpand, AdamMatchesFloat64Reference) {
  const double alpha = 0.9, beta = 0.95, eps = 1e-2, norm = 0.1, lr = 0.5;
  for (int64_t step : {0, 3}) {
    Model md(17);
    md.opset("ai.onnx.preview.training", 1);
    Tensor x = random_f32({3}, 21), g = random_f32({3}, 22), v = random_f32({3}, 23), h = random_f32({3}, 24, 0, 1);
    md.input("R", Tensor::scalar_f(DType::f32, lr)), md.input("T", Tensor::scalar_i(DType::i64, step));
    md.input("X", x), md.input("G", g), md.input("V", v), md.input("H", h);
    auto* n = md.node("Adam", {"R", "T", "X", "G", "V", "H"}, {"X2", "V2", "H2"}, "ai.onnx.preview.training");
    attr_f(n, "alpha", static_cast<float>(alpha)), attr_f(n, "beta", static_cast<float>(beta));
    attr_f(n, "epsilon", static_cast<float>(eps)), attr_f(n, "norm_coefficient", static_cast<float>(norm));
    md.output("X2"), md.output("V2"), md.output("H2");
    std::vector<Tensor> out = md.run("adam.onnx");
    std::vector<double> xs, vs, hs;
    const auto xv = x.to_f64(), gv = g.to_f64(), vv = v.to_f64(), hv = h.to_f64();
    const double a = static_cast<float>(alpha), b = static_cast<float>(beta);
    for (size_t i = 0; i < 3; ++i) {
      const double gr = static_cast<float>(norm) * xv[i] + gv[i];
      const double vn = a * vv[i] + (1 - a) * gr, hn = b * hv[i] + (1 - b) * gr * gr;
      const double r = step > 0 ? lr * std::sqrt(1 - std::pow(b, step)) / (1 - std::pow(a, step)) : lr;
      xs.push_back(xv[i] - r * vn / (std::sqrt(hn) + static_cast<float>(eps)));
      vs.push_back(vn), hs.push_back(hn);
    }
    expect_close(out[0], xs, 1e-4);
    expect_close(out[1], vs, 1e-5);
    expect_close(out[2], hs, 1e-5);
  }
}

// PRelu before opset 7 does not broadcast: a [C] slope with an [N, C, H, W] X is an error there
// (numpy broadcasting would line it up with W), while opset 7 broadcasts it; a one-element or
// same-shaped slope gives the same answer at both opsets.
TEST(ImportExpand, PreluFollowsItsOpset) {
  Tensor x = Tensor::from_f64(DType::f32, {1, 2, 1, 2}, std::vector<double>{-1, -2, -3, 4});
  auto model = [&](int opset, const Tensor& slope) {
    Model md(opset);
    md.input("x", x), md.input("s", slope);
    md.node("PRelu", {"x", "s"}, {"y"});
    md.output("y");
    return md;
  };
  Tensor per_w = Tensor::from_f64(DType::f32, {2}, std::vector<double>{10, 100});
  expect_close(model(7, per_w).run("prelu7.onnx")[0], {-10, -200, -30, 4});
  bool unsup = true;
  std::string e = model(6, per_w).error("prelu6.onnx", &unsup);
  EXPECT_FALSE(unsup) << e;
  EXPECT_NE(e.find("PRelu before opset 7 does not broadcast: slope [2] must have X's shape [1,2,1,2]"), std::string::npos) << e;
  expect_close(model(6, Tensor::from_f64(DType::f32, {1}, std::vector<double>{0.5})).run("prelu6_one.onnx")[0],
               {-0.5, -1, -1.5, 4});
  Tensor same = Tensor::from_f64(DType::f32, {1, 2, 1, 2}, std::vector<double>{1, 2, 3, 4});
  expect_close(model(6, same).run("prelu6_same.onnx")[0], {-1, -4, -9, 4});
}

// TreeEnsemble: two trees averaged then a logistic; a tree whose node points back at itself is an
// error, not a hang.
TEST(ImportExpand, TreeEnsembleAverageLogisticAndCycles) {
  using testenv::one_node_graph;
  auto attrs = [](std::vector<int64_t> true_ids) {
    std::map<std::string, Attr> a;
    a["aggregate_function"] = int64_t{0};
    a["post_transform"] = int64_t{2};
    a["n_targets"] = int64_t{1};
    a["tree_roots"] = std::vector<int64_t>{0, 1};
    a["nodes_featureids"] = std::vector<int64_t>{0, 1};
    a["nodes_modes"] = Tensor::from_i64(DType::u8, {2}, std::vector<int64_t>{0, 3});  // x0 <= 0.5, x1 > 2
    a["nodes_splits"] = Tensor::from_f64(DType::f32, {2}, std::vector<double>{0.5, 2});
    a["nodes_truenodeids"] = std::move(true_ids);
    a["nodes_trueleafs"] = std::vector<int64_t>{1, 1};
    a["nodes_falsenodeids"] = std::vector<int64_t>{1, 3};
    a["nodes_falseleafs"] = std::vector<int64_t>{1, 1};
    a["leaf_targetids"] = std::vector<int64_t>{0, 0, 0, 0};
    a["leaf_weights"] = Tensor::from_f64(DType::f32, {4}, std::vector<double>{1, 2, 3, 4});
    return a;
  };
  std::vector<Tensor> feeds;
  Tensor x = Tensor::from_f64(DType::f32, {2, 2}, std::vector<double>{0, 5, 1, 0});
  Graph g = one_node_graph("TreeEnsemble", {x}, {false}, 1, attrs({0, 2}), feeds);
  std::vector<Tensor> out = run_eager(g, feeds);
  // Row 0: leaf 0 (1) and leaf 2 (3) -> mean 2; row 1: leaf 1 (2) and leaf 3 (4) -> mean 3.
  expect_close(out[0], {sigm(2), sigm(3)});
  std::map<std::string, Attr> cyclic = attrs({0, 2});
  cyclic["nodes_trueleafs"] = std::vector<int64_t>{0, 1};  // node 0's true branch is node 0 again
  Graph gc = one_node_graph("TreeEnsemble", {x}, {false}, 1, cyclic, feeds);
  try {
    run_eager(gc, feeds);
    ADD_FAILURE() << "a cyclic tree ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has a cycle"), std::string::npos) << e.what();
  }
  // n_targets sizes the result: a model's 2^50 is an error (inference checks the output against the
  // allocation limit; the kernel checks its f64 buffer too), not a 9-petabyte allocation
  std::map<std::string, Attr> huge = attrs({0, 2});
  huge["n_targets"] = int64_t{1} << 50;
  try {
    Graph gh = one_node_graph("TreeEnsemble", {x}, {false}, 1, huge, feeds);
    run_eager(gh, feeds);
    ADD_FAILURE() << "a 2^50-target ensemble ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("limit"), std::string::npos) << e.what();
  }
}

// TfIdfVectorizer: unigrams counted once, bigrams at every skip up to max_skip_count, then weighted by
// mode (hand-counted: X = 1 2 1 2 gives 1:2, 2:2, (1,2):2 at distance 1 and (1,1):1 at distance 2).
TEST(ImportExpand, TfIdfVectorizerCountsSkipGrams) {
  using testenv::one_node_graph;
  auto attrs = [](const std::string& mode) {
    std::map<std::string, Attr> a;
    a["min_gram_length"] = int64_t{1};
    a["max_gram_length"] = int64_t{2};
    a["max_skip_count"] = int64_t{1};
    a["mode"] = mode;
    a["pool_int64s"] = std::vector<int64_t>{1, 2, 1, 2, 1, 1};
    a["ngram_counts"] = std::vector<int64_t>{0, 2};
    a["ngram_indexes"] = std::vector<int64_t>{0, 1, 2, 3};
    a["weights"] = std::vector<double>{1, 10, 100, 1000};
    return a;
  };
  std::vector<Tensor> feeds;
  Tensor x = Tensor::from_i64(DType::i64, {2, 4}, std::vector<int64_t>{1, 2, 1, 2, 3, 3, 3, 1});
  expect_close(run_eager(one_node_graph("TfIdfVectorizer", {x}, {false}, 1, attrs("TF"), feeds), feeds)[0],
               {2, 2, 2, 1, 1, 0, 0, 0});
  expect_close(run_eager(one_node_graph("TfIdfVectorizer", {x}, {false}, 1, attrs("TFIDF"), feeds), feeds)[0],
               {2, 20, 200, 1000, 1, 0, 0, 0});
  expect_close(run_eager(one_node_graph("TfIdfVectorizer", {x}, {false}, 1, attrs("IDF"), feeds), feeds)[0],
               {1, 10, 100, 1000, 1, 0, 0, 0});
  std::map<std::string, Attr> bad = attrs("TF");
  bad["ngram_counts"] = std::vector<int64_t>{0, 1};  // leaves 5 entries for 2-grams
  try {
    one_node_graph("TfIdfVectorizer", {x}, {false}, 1, bad, feeds);
    ADD_FAILURE() << "an inconsistent pool was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not split the pool"), std::string::npos) << e.what();
  }
}

namespace {

// A Scan node reading `ins` whose body adds its one scan element [1] to its one state [1].
void add_running_sum_scan(Model& md, const std::vector<std::string>& ins) {
  auto* n = md.node("Scan", ins, {"final"});
  attr_i(n, "num_scan_inputs", 1);
  auto* body = attr_g(n, "body");
  Model::set_type(body->add_input(), "s", 1, {1});
  Model::set_type(body->add_input(), "e", 1, {1});
  Model::node(body, "Add", {"s", "e"}, {"s2"});
  Model::set_type(body->add_output(), "s2", 1, {1});
  md.output("final");
}

// Importing `file` is refused as unsupported with a message containing `why`.
void expect_refused(Model& md, const std::string& file, const std::string& why) {
  try {
    import_onnx(md.save(file));
    ADD_FAILURE() << file << " was imported; expected a refusal naming '" << why << "'";
  } catch (const Error& e) {
    EXPECT_TRUE(e.is_unsupported()) << e.what();
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

}  // namespace

// A Scan over a huge sequence axis is refused before it unrolls, not after filling memory.
TEST(ImportExpand, ScanUnrollIsBounded) {
  Model md(16);
  md.input("init", Tensor::from_f64(DType::f32, {1}, std::vector<double>{0}));
  Model::set_type(md.m.mutable_graph()->add_input(), "xs", 1, {1 << 30, 1});  // declared only: never allocated
  add_running_sum_scan(md, {"init", "xs"});
  expect_refused(md, "scan_huge.onnx", "would unroll past");
}

// Scan-8 over an empty batch (axis 0 of the scan input is 0) is refused with a line, not unrolled
// zero times and then read at batch 0 (the fuzzer found the read).
TEST(ImportExpand, Scan8OverEmptyBatchIsRefused) {
  Model md(8);
  auto* g = md.m.mutable_graph();
  Model::set_type(g->add_input(), "init", 1, {0, 1});
  Model::set_type(g->add_input(), "xs", 1, {0, 3, 1});
  add_running_sum_scan(md, {"", "init", "xs"});
  expect_refused(md, "scan8_empty.onnx", "empty batch");
}

// FlexAttention with grouped heads (4 query heads over 2 key/value heads) and an identity score_mod
// subgraph: the expansion repeats K and V heads from the inputs' shapes (the fuzzer found it read the
// shape of a value it had just emitted, before inference) and equals the graph op without subgraphs.
TEST(ImportExpand, FlexAttentionGroupedHeadsWithScoreMod) {
  auto rnd = [](Shape s, uint32_t seed) {
    std::vector<double> v(static_cast<size_t>(shape_numel(s)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37 * static_cast<double>(i) + seed);
    return Tensor::from_f64(DType::f32, std::move(s), v);
  };
  std::vector<std::vector<Tensor>> outs;
  for (bool with_mod : {false, true}) {
    Model md(22);
    md.opset("ai.onnx.preview", 1);
    md.input("q", rnd({1, 4, 3, 2}, 1)), md.input("k", rnd({1, 2, 5, 2}, 2)), md.input("v", rnd({1, 2, 5, 2}, 3));
    auto* n = md.node("FlexAttention", {"q", "k", "v"}, {"y"}, "ai.onnx.preview");
    if (with_mod) {
      auto* g = attr_g(n, "score_mod");
      Model::set_type(g->add_input(), "s", 1, {1, 4, 3, 5});
      Model::node(g, "Identity", {"s"}, {"t"});
      Model::set_type(g->add_output(), "t", 1, {1, 4, 3, 5});
    }
    md.output("y");
    outs.push_back(md.run(with_mod ? "flex_mod.onnx" : "flex.onnx"));
  }
  ASSERT_EQ(outs[1].size(), 1u);
  EXPECT_EQ(outs[1][0].shape(), (Shape{1, 4, 3, 2}));
  const std::vector<double> a = outs[0][0].to_f64(), b = outs[1][0].to_f64();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << i;
}
