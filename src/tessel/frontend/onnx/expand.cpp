// Import-time expansion of If, Scan, RNN/GRU/LSTM, the training optimizers and the tensor forms of
// the optional ops into graph ops (see expand.h).
#include "tessel/frontend/onnx/expand.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

// ---- attribute access ----

const Attr* find_attr(const ExpandCtx& c, const std::string& n) {
  auto it = c.attrs.find(n);
  return it == c.attrs.end() ? nullptr : &it->second;
}
int64_t attr_i(const ExpandCtx& c, const std::string& n, int64_t dflt) {
  const Attr* a = find_attr(c, n);
  if (!a) return dflt;
  if (const auto* v = std::get_if<int64_t>(a)) return *v;
  fail("attribute '{}' must be an int", n);
}
double attr_f(const ExpandCtx& c, const std::string& n, double dflt) {
  const Attr* a = find_attr(c, n);
  if (!a) return dflt;
  if (const auto* v = std::get_if<double>(a)) return *v;
  if (const auto* v = std::get_if<int64_t>(a)) return static_cast<double>(*v);
  fail("attribute '{}' must be a float", n);
}
double attr_f_required(const ExpandCtx& c, const std::string& n) {
  if (!find_attr(c, n)) fail("missing required attribute '{}'", n);
  return attr_f(c, n, 0);
}
std::string attr_s(const ExpandCtx& c, const std::string& n, const std::string& dflt) {
  const Attr* a = find_attr(c, n);
  if (!a) return dflt;
  if (const auto* v = std::get_if<std::string>(a)) return *v;
  fail("attribute '{}' must be a string", n);
}
std::vector<int64_t> attr_ints(const ExpandCtx& c, const std::string& n) {
  const Attr* a = find_attr(c, n);
  if (!a) return {};
  if (const auto* v = std::get_if<std::vector<int64_t>>(a)) return *v;
  fail("attribute '{}' must be ints", n);
}
std::vector<double> attr_floats(const ExpandCtx& c, const std::string& n) {
  const Attr* a = find_attr(c, n);
  if (!a) return {};
  if (const auto* v = std::get_if<std::vector<double>>(a)) return *v;
  if (const auto* v = std::get_if<std::vector<int64_t>>(a)) return {v->begin(), v->end()};
  fail("attribute '{}' must be floats", n);
}
std::vector<std::string> attr_strings(const ExpandCtx& c, const std::string& n) {
  const Attr* a = find_attr(c, n);
  if (!a) return {};
  if (const auto* v = std::get_if<std::vector<std::string>>(a)) return *v;
  fail("attribute '{}' must be strings", n);
}

const onnx::GraphProto& graph_attr(const onnx::NodeProto& np, const std::string& n) {
  for (const auto& a : np.attribute())
    if (a.name() == n && a.type() == onnx::AttributeProto::GRAPH) return a.g();
  fail("missing required subgraph attribute '{}'", n);
}

Value* input(const ExpandCtx& c, int i) {
  return i < static_cast<int>(c.inputs.size()) ? c.inputs[i] : nullptr;
}
Value* need_input(const ExpandCtx& c, int i, const char* what) {
  Value* v = input(c, i);
  if (!v) fail("missing required input {} ({})", i, what);
  return v;
}

// ---- emitting graph ops ----

class Emit {
 public:
  Emit(Graph& g, std::string name) : g_(g), name_(std::move(name)) {}

  std::vector<Value*> ops(const std::string& op, std::vector<Value*> ins, int nout,
                          std::map<std::string, Attr> attrs = {}) {
    const OpDef* def = OpRegistry::get().find(op);
    if (!def) fail("internal: graph op {} is not registered", op);
    std::vector<std::string> outs(static_cast<size_t>(nout), name_ + "." + op);
    return g_.add_node(def, name_, std::move(ins), outs, std::move(attrs))->outputs;
  }
  Value* op(const std::string& op, std::vector<Value*> ins, std::map<std::string, Attr> attrs = {}) {
    return ops(op, std::move(ins), 1, std::move(attrs))[0];
  }
  Value* constant(Tensor t) { return g_.add_constant(name_ + ".c", std::move(t)); }
  Value* ints(const std::vector<int64_t>& v) {
    return constant(Tensor::from_i64(DType::i64, {static_cast<int64_t>(v.size())}, v));
  }
  Value* index(int64_t i) { return constant(Tensor::scalar_i(DType::i64, i)); }
  Value* scalar(DType t, double v) { return constant(Tensor::scalar_f(t, v)); }

  Value* add(Value* a, Value* b) { return op("Add", {a, b}); }
  Value* sub(Value* a, Value* b) { return op("Sub", {a, b}); }
  Value* mul(Value* a, Value* b) { return op("Mul", {a, b}); }
  Value* div(Value* a, Value* b) { return op("Div", {a, b}); }
  Value* sqrt(Value* a) { return op("Sqrt", {a}); }
  Value* matmul(Value* a, Value* b) { return op("MatMul", {a, b}); }
  Value* cast(Value* v, DType t) { return op("Cast", {v}, {{"to", int64_t{dtype_to_onnx(t)}}}); }
  // Element `i` along `axis`, the axis removed.
  Value* take(Value* v, int64_t i, int64_t axis) { return op("Gather", {v, index(i)}, {{"axis", axis}}); }
  Value* slice(Value* v, int64_t axis, int64_t start, int64_t end) {
    return op("Slice", {v, ints({start}), ints({end}), ints({axis})});
  }
  Value* unsqueeze(Value* v, int64_t axis) { return op("Unsqueeze", {v, ints({axis})}); }
  Value* concat(const std::vector<Value*>& vs, int64_t axis) {
    return vs.size() == 1 ? vs[0] : op("Concat", vs, {{"axis", axis}});
  }
  // vs stacked along a new axis `axis` (negative counts from the end of the result).
  Value* stack(const std::vector<Value*>& vs, int64_t axis) {
    std::vector<Value*> us;
    for (Value* v : vs) us.push_back(unsqueeze(v, axis));
    return concat(us, axis);
  }
  Value* transpose(Value* v, std::vector<int64_t> perm) { return op("Transpose", {v}, {{"perm", std::move(perm)}}); }

 private:
  Graph& g_;
  std::string name_;
};

const Tensor* known_value(const Value* v, const InferResult& r) {
  if (v->constant) return &*v->constant;
  auto it = r.folded.find(v);
  return it == r.folded.end() ? nullptr : &it->second;
}

int64_t static_dim(const Value* v, int axis, const char* what) {
  const Shape& s = v->type.shape;
  if (axis < 0 || axis >= static_cast<int>(s.size())) fail("{} has rank {}; axis {} is out of range", what, s.size(), axis);
  if (s[axis] < 0) unsupported("{} has a dynamic dimension {}; the expansion needs it static", what, axis);
  return s[axis];
}

// Unrolling copies a body once per step: a bound on the copies keeps a hostile or mistaken model (a
// sequence axis of 10^9) from growing the graph without limit; real models stay far below it.
constexpr int64_t kMaxUnrolledNodes = 1 << 20;
void check_unroll(int64_t steps, int64_t nodes_per_step, const char* what) {
  if (steps > kMaxUnrolledNodes / std::max<int64_t>(nodes_per_step, 1))
    unsupported("{} over {} steps of {} nodes each would unroll past {} nodes", what, steps, nodes_per_step,
                kMaxUnrolledNodes);
}

// ---- If ----

// A condition known at import time inlines the branch it selects. Otherwise both branches are
// imported and each pair of outputs is chosen at run time: with Where when the two have one static
// type, else with tessel's Choose, whose result's dims are those the two share and unknown where they
// differ (torchvision's batched NMS gives i64[0] when there are no boxes, else i64[?]); what follows
// then runs in the graph backend's dynamic region. Both branches are computed, so both must be valid
// on the inputs (a branch may compute something the model never asked for).
std::vector<Value*> expand_if(ExpandCtx& c, const onnx::NodeProto& np) {
  Value* cond = need_input(c, 0, "cond");
  const InferResult& r = c.infer();
  int64_t cond_elems = 1;
  for (int64_t d : cond->type.shape) cond_elems *= d;
  if (cond_elems != 1) fail("cond must have exactly one element, has shape {}", shape_str(cond->type.shape));
  const onnx::GraphProto& then_g = graph_attr(np, "then_branch");
  const onnx::GraphProto& else_g = graph_attr(np, "else_branch");
  if (then_g.output_size() != else_g.output_size())
    fail("then_branch has {} outputs but else_branch has {}", then_g.output_size(), else_g.output_size());
  if (const Tensor* k = known_value(cond, r)) return c.import_body(k->get_i(0) != 0 ? then_g : else_g, {});
  std::vector<Value*> a = c.import_body(then_g, {});
  std::vector<Value*> b = c.import_body(else_g, {});
  c.infer();
  Emit e(c.g, c.node_name);
  Value* pred = cond->type.shape.empty() ? cond : e.op("Reshape", {cond, e.ints({})});
  std::vector<Value*> out;
  for (size_t i = 0; i < a.size(); ++i) {
    const TensorType& ta = a[i]->type;
    const TensorType& tb = b[i]->type;
    const bool is_static = std::none_of(ta.shape.begin(), ta.shape.end(), [](int64_t d) { return d < 0; });
    if (ta.dtype != tb.dtype || ta.shape.size() != tb.shape.size())
      unsupported("If with a condition known only at run time needs both branches' output {} to have one dtype "
                  "and rank; then gives {}, else {}", i, ta.str(), tb.str());
    out.push_back(e.op(ta.shape == tb.shape && is_static ? "Where" : "Choose", {pred, a[i], b[i]}));
  }
  return out;
}

// ---- Scan ----

// One scan over inputs whose sequence axis is known: the body is imported once per step.
struct ScanLoop {
  std::vector<Value*> states;
  std::vector<Value*> scans;
  std::vector<int64_t> in_axes, in_dirs, out_axes, out_dirs;
  int num_scan_outputs = 0;
};

std::vector<Value*> unroll_scan(ExpandCtx& c, Emit& e, const onnx::GraphProto& body, ScanLoop s) {
  const size_t n = s.states.size(), m = s.scans.size();
  if (m == 0) fail("Scan needs at least one scan input");
  int64_t steps = -1;
  for (size_t j = 0; j < m; ++j) {
    const int rank = static_cast<int>(s.scans[j]->type.shape.size());
    int64_t ax = j < s.in_axes.size() ? s.in_axes[j] : 0;
    if (ax < -rank || ax >= rank) fail("scan_input_axes[{}] = {} is out of range for rank {}", j, ax, rank);
    s.in_axes.resize(m, 0);
    s.in_axes[j] = ax < 0 ? ax + rank : ax;
    int64_t len = static_dim(s.scans[j], static_cast<int>(s.in_axes[j]), "a scan input");
    if (steps >= 0 && len != steps) fail("scan inputs have different sequence lengths {} and {}", steps, len);
    steps = len;
  }
  if (steps == 0) unsupported("Scan over an empty sequence (the scan outputs' shapes come from the body)");
  check_unroll(steps, body.node_size() + static_cast<int64_t>(m) + 1, "Scan");
  if (static_cast<size_t>(body.input_size()) != n + m)
    fail("the body has {} inputs; Scan passes {} states and {} scan elements", body.input_size(), n, m);
  if (static_cast<size_t>(body.output_size()) != n + static_cast<size_t>(s.num_scan_outputs))
    fail("the body has {} outputs; Scan expects {} states and {} scan outputs", body.output_size(), n, s.num_scan_outputs);
  std::vector<std::vector<Value*>> elems(static_cast<size_t>(s.num_scan_outputs));
  for (int64_t t = 0; t < steps; ++t) {
    std::vector<Value*> args = s.states;
    for (size_t j = 0; j < m; ++j) {
      const bool rev = j < s.in_dirs.size() && s.in_dirs[j] != 0;
      args.push_back(e.take(s.scans[j], rev ? steps - 1 - t : t, s.in_axes[j]));
    }
    std::vector<Value*> outs = c.import_body(body, args);
    std::copy(outs.begin(), outs.begin() + static_cast<long>(n), s.states.begin());
    for (size_t k = 0; k < elems.size(); ++k) elems[k].push_back(outs[n + k]);
  }
  std::vector<Value*> result = s.states;
  for (size_t k = 0; k < elems.size(); ++k) {
    if (k < s.out_dirs.size() && s.out_dirs[k] != 0) std::reverse(elems[k].begin(), elems[k].end());
    result.push_back(e.stack(elems[k], k < s.out_axes.size() ? s.out_axes[k] : 0));
  }
  return result;
}

std::vector<Value*> expand_scan(ExpandCtx& c, const onnx::NodeProto& np, int opset) {
  c.infer();
  Emit e(c.g, c.node_name);
  const onnx::GraphProto& body = graph_attr(np, "body");
  const int64_t m = attr_i(c, "num_scan_inputs", -1);
  if (m < 1) fail("missing or invalid attribute 'num_scan_inputs'");
  const int first = opset < 9 ? 1 : 0;  // Scan-8 starts with the optional sequence_lens
  const int64_t total = static_cast<int64_t>(c.inputs.size()) - first;
  if (total < m) fail("Scan has {} state and scan inputs but num_scan_inputs is {}", total, m);
  ScanLoop s;
  for (int64_t i = 0; i < total; ++i) {
    Value* v = need_input(c, first + static_cast<int>(i), "state or scan input");
    (i < total - m ? s.states : s.scans).push_back(v);
  }
  s.num_scan_outputs = c.num_outputs - static_cast<int>(s.states.size());
  if (s.num_scan_outputs < 0) fail("Scan has fewer outputs than loop states");
  if (opset >= 9) {
    s.in_axes = attr_ints(c, "scan_input_axes");
    s.in_dirs = attr_ints(c, "scan_input_directions");
    s.out_axes = attr_ints(c, "scan_output_axes");
    s.out_dirs = attr_ints(c, "scan_output_directions");
    return unroll_scan(c, e, body, s);
  }
  // Scan-8: axis 0 of every state and scan input is a batch; the sequence is axis 1.
  if (input(c, 0)) unsupported("Scan-8 with sequence_lens (sequences of different lengths)");
  s.in_dirs = attr_ints(c, "directions");
  const int64_t batch = static_dim(s.scans[0], 0, "a scan input");
  if (batch == 0) unsupported("Scan-8 over an empty batch (the outputs' shapes come from the body)");
  check_unroll(batch, body.node_size() + 1, "Scan-8's batch");
  std::vector<std::vector<Value*>> per_batch;
  for (int64_t b = 0; b < batch; ++b) {
    ScanLoop one = s;
    for (auto& v : one.states) v = e.take(v, b, 0);
    for (auto& v : one.scans) v = e.take(v, b, 0);
    c.infer();
    per_batch.push_back(unroll_scan(c, e, body, one));
  }
  std::vector<Value*> out;
  for (size_t k = 0; k < per_batch[0].size(); ++k) {
    std::vector<Value*> col;
    for (auto& pb : per_batch) col.push_back(pb[k]);
    out.push_back(e.stack(col, 0));
  }
  return out;
}

// ---- RNN, GRU, LSTM ----

bool iequals(const std::string& a, const std::string& b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return std::tolower(x) == std::tolower(y); });
}

// One activation function of the recurrent ops, with its alpha and beta where it takes them.
struct Activation {
  std::string name;
  double alpha = 0, beta = 0;
};

// The activations per direction (ONNX lists the forward ones, then the reverse ones), each taking
// the next activation_alpha / activation_beta values where it has parameters, else its default.
std::vector<std::vector<Activation>> rnn_activations(const ExpandCtx& c, int per_dir, int dirs,
                                                     const std::vector<std::string>& dflt) {
  std::vector<std::string> names = attr_strings(c, "activations");
  if (names.empty())
    for (int d = 0; d < dirs; ++d) names.insert(names.end(), dflt.begin(), dflt.end());
  if (names.size() == static_cast<size_t>(per_dir) && dirs == 2) names.insert(names.end(), names.begin(), names.end());
  if (names.size() != static_cast<size_t>(per_dir * dirs))
    fail("activations lists {} functions; expected {} per direction", names.size(), per_dir);
  const std::vector<double> alphas = attr_floats(c, "activation_alpha"), betas = attr_floats(c, "activation_beta");
  size_t ia = 0, ib = 0;
  std::vector<std::vector<Activation>> out(static_cast<size_t>(dirs));
  for (size_t i = 0; i < names.size(); ++i) {
    Activation a{names[i]};
    auto take = [](const std::vector<double>& v, size_t& k, double d) { return k < v.size() ? v[k++] : d; };
    if (iequals(a.name, "LeakyRelu")) a.alpha = take(alphas, ia, 0.01);
    else if (iequals(a.name, "ThresholdedRelu") || iequals(a.name, "Elu")) a.alpha = take(alphas, ia, 1.0);
    else if (iequals(a.name, "HardSigmoid")) a.alpha = take(alphas, ia, 0.2), a.beta = take(betas, ib, 0.5);
    else if (iequals(a.name, "ScaledTanh")) a.alpha = take(alphas, ia, 1.0), a.beta = take(betas, ib, 1.0);
    else if (iequals(a.name, "Affine")) a.alpha = take(alphas, ia, 1.0), a.beta = take(betas, ib, 0.0);
    out[i / static_cast<size_t>(per_dir)].push_back(a);
  }
  return out;
}

Value* apply_activation(Emit& e, const Activation& a, Value* x) {
  const DType t = x->type.dtype;
  for (const char* plain : {"Relu", "Tanh", "Sigmoid", "Softsign", "Softplus"})
    if (iequals(a.name, plain)) return e.op(plain, {x});
  if (iequals(a.name, "LeakyRelu")) return e.op("LeakyRelu", {x}, {{"alpha", a.alpha}});
  if (iequals(a.name, "ThresholdedRelu")) return e.op("ThresholdedRelu", {x}, {{"alpha", a.alpha}});
  if (iequals(a.name, "Elu")) return e.op("Elu", {x}, {{"alpha", a.alpha}});
  if (iequals(a.name, "HardSigmoid")) return e.op("HardSigmoid", {x}, {{"alpha", a.alpha}, {"beta", a.beta}});
  if (iequals(a.name, "Affine")) return e.add(e.mul(e.scalar(t, a.alpha), x), e.scalar(t, a.beta));
  if (iequals(a.name, "ScaledTanh"))
    return e.mul(e.scalar(t, a.alpha), e.op("Tanh", {e.mul(e.scalar(t, a.beta), x)}));
  fail("unknown activation function '{}'", a.name);
}

enum class Cell { rnn, gru, lstm };

struct RecurrentSpec {
  Cell cell;
  int gates;                 // blocks of hidden_size rows in W and R
  std::vector<std::string> default_acts;
};

// The cell state of one direction between steps.
struct CellState {
  Value* h;
  Value* c = nullptr;        // LSTM only
};

// The per-direction weights, laid out for row-vector steps: x [B, I] @ wt [I, gates*H].
struct DirWeights {
  Value* xw;                 // X @ W^T + Wb for every step: [S, B, gates*H]
  Value* rt;                 // R^T: [H, gates*H]
  Value* rb = nullptr;       // Rb: [gates*H], or null without B
  Value* p = nullptr;        // LSTM peepholes [3H] (i, o, f), or null
};

Value* clipped(Emit& e, Value* x, double clip) {
  if (clip <= 0) return x;
  const DType t = x->type.dtype;
  return e.op("Clip", {x, e.scalar(t, -clip), e.scalar(t, clip)});
}

CellState rnn_step(Emit& e, const RecurrentSpec& spec, const DirWeights& w, const std::vector<Activation>& act,
                   Value* xw_t, const CellState& prev, int64_t hidden, double clip, bool linear_before_reset,
                   bool input_forget) {
  const int64_t H = hidden;
  auto gate = [&](Value* v, int k) { return e.slice(v, 1, k * H, (k + 1) * H); };
  auto with_rb = [&](Value* v) { return w.rb ? e.add(v, w.rb) : v; };
  const DType t = xw_t->type.dtype;
  if (spec.cell == Cell::rnn) {
    Value* pre = e.add(xw_t, with_rb(e.matmul(prev.h, w.rt)));
    return {apply_activation(e, act[0], clipped(e, pre, clip))};
  }
  if (spec.cell == Cell::gru) {
    // Gates in the order z, r, h; the h gate's recurrent part depends on linear_before_reset.
    Value* rt_zr = e.slice(w.rt, 1, 0, 2 * H);
    Value* rt_h = e.slice(w.rt, 1, 2 * H, 3 * H);
    Value* rb_zr = w.rb ? e.slice(w.rb, 0, 0, 2 * H) : nullptr;
    Value* rb_h = w.rb ? e.slice(w.rb, 0, 2 * H, 3 * H) : nullptr;
    Value* hr_zr = e.matmul(prev.h, rt_zr);
    if (rb_zr) hr_zr = e.add(hr_zr, rb_zr);
    Value* zr_pre = e.add(e.slice(xw_t, 1, 0, 2 * H), hr_zr);
    Value* z = apply_activation(e, act[0], clipped(e, gate(zr_pre, 0), clip));
    Value* r = apply_activation(e, act[0], clipped(e, gate(zr_pre, 1), clip));
    Value* rec;
    if (linear_before_reset) {
      Value* hr = e.matmul(prev.h, rt_h);
      if (rb_h) hr = e.add(hr, rb_h);
      rec = e.mul(r, hr);
    } else {
      rec = e.matmul(e.mul(r, prev.h), rt_h);
      if (rb_h) rec = e.add(rec, rb_h);
    }
    Value* hh = apply_activation(e, act[1], clipped(e, e.add(gate(xw_t, 2), rec), clip));
    Value* one_minus_z = e.sub(e.scalar(t, 1.0), z);
    return {e.add(e.mul(one_minus_z, hh), e.mul(z, prev.h))};
  }
  // LSTM: gates in the order i, o, f, c; peepholes in the order i, o, f.
  Value* pre = e.add(xw_t, with_rb(e.matmul(prev.h, w.rt)));
  auto peep = [&](Value* v, int k, Value* cell) {
    return w.p ? e.add(v, e.mul(e.slice(w.p, 0, k * H, (k + 1) * H), cell)) : v;
  };
  Value* i = apply_activation(e, act[0], clipped(e, peep(gate(pre, 0), 0, prev.c), clip));
  Value* f = input_forget ? e.sub(e.scalar(t, 1.0), i)
                          : apply_activation(e, act[0], clipped(e, peep(gate(pre, 2), 2, prev.c), clip));
  Value* cc = apply_activation(e, act[1], clipped(e, gate(pre, 3), clip));
  Value* c = e.add(e.mul(f, prev.c), e.mul(i, cc));
  Value* o = apply_activation(e, act[0], clipped(e, peep(gate(pre, 1), 1, c), clip));
  return {e.mul(o, apply_activation(e, act[2], c)), c};
}

std::vector<Value*> expand_recurrent(ExpandCtx& c, const RecurrentSpec& spec) {
  c.infer();
  Emit e(c.g, c.node_name);
  Value* x = need_input(c, 0, "X");
  Value* w = need_input(c, 1, "W");
  Value* r = need_input(c, 2, "R");
  Value* b = input(c, 3);
  Value* seq_lens = input(c, 4);
  Value* h0 = input(c, 5);
  Value* c0 = spec.cell == Cell::lstm ? input(c, 6) : nullptr;
  Value* p = spec.cell == Cell::lstm ? input(c, 7) : nullptr;
  const DType t = x->type.dtype;
  if (!is_float(t)) fail("X must be a float tensor, is {}", x->type.str());
  if (x->type.shape.size() != 3) fail("X must have rank 3, has shape {}", shape_str(x->type.shape));
  const int64_t layout = attr_i(c, "layout", 0);
  if (layout != 0 && layout != 1) fail("layout must be 0 or 1, is {}", layout);
  if (layout == 1) {
    x = e.transpose(x, {1, 0, 2});
    if (h0) h0 = e.transpose(h0, {1, 0, 2});
    if (c0) c0 = e.transpose(c0, {1, 0, 2});
    c.infer();
  }
  const std::string dir = attr_s(c, "direction", "forward");
  if (dir != "forward" && dir != "reverse" && dir != "bidirectional")
    fail("direction must be forward, reverse or bidirectional, is '{}'", dir);
  const int dirs = dir == "bidirectional" ? 2 : 1;
  const int64_t steps = static_dim(x, 0, "X"), batch = static_dim(x, 1, "X");
  const int64_t hidden = attr_i(c, "hidden_size", static_dim(r, 2, "R"));
  if (static_dim(w, 0, "W") != dirs || static_dim(w, 1, "W") != spec.gates * hidden)
    fail("W has shape {}; expected [{}, {}, input_size]", shape_str(w->type.shape), dirs, spec.gates * hidden);
  if (b && (static_dim(b, 0, "B") != dirs || static_dim(b, 1, "B") != 2 * spec.gates * hidden))
    fail("B has shape {}; expected [{}, {}]", shape_str(b->type.shape), dirs, 2 * spec.gates * hidden);
  if (p && (static_dim(p, 0, "P") != dirs || static_dim(p, 1, "P") != 3 * hidden))
    fail("P has shape {}; expected [{}, {}]", shape_str(p->type.shape), dirs, 3 * hidden);
  if (steps == 0) unsupported("{} over an empty sequence", c.node_name);
  check_unroll(steps, 48 * dirs, "the recurrent op");
  const double clip = attr_f(c, "clip", 0.0);
  const bool lbr = attr_i(c, "linear_before_reset", 0) != 0;
  const bool input_forget = attr_i(c, "input_forget", 0) != 0;
  const auto acts = rnn_activations(c, static_cast<int>(spec.default_acts.size()), dirs, spec.default_acts);

  std::vector<Value*> ys, hs, cs;
  for (int d = 0; d < dirs; ++d) {
    const bool reverse = dir == "reverse" || d == 1;
    DirWeights dw;
    dw.xw = e.matmul(x, e.transpose(e.take(w, d, 0), {1, 0}));
    dw.rt = e.transpose(e.take(r, d, 0), {1, 0});
    if (b) {
      Value* bd = e.take(b, d, 0);
      dw.xw = e.add(dw.xw, e.slice(bd, 0, 0, spec.gates * hidden));
      dw.rb = e.slice(bd, 0, spec.gates * hidden, 2 * spec.gates * hidden);
    }
    if (p) dw.p = e.take(p, d, 0);
    Tensor zeros(t, {batch, hidden});
    CellState st{h0 ? e.take(h0, d, 0) : e.constant(zeros)};
    if (spec.cell == Cell::lstm) st.c = c0 ? e.take(c0, d, 0) : e.constant(zeros);
    std::vector<Value*> at(static_cast<size_t>(steps));
    for (int64_t k = 0; k < steps; ++k) {
      const int64_t pos = reverse ? steps - 1 - k : k;
      CellState next = rnn_step(e, spec, dw, acts[d], e.take(dw.xw, pos, 0), st, hidden, clip, lbr, input_forget);
      if (seq_lens) {
        // Past its length a batch entry keeps its state and outputs zeros; a reverse pass then
        // starts at each entry's own last step.
        Value* live = e.unsqueeze(e.op("Less", {e.constant(Tensor::scalar_i(seq_lens->type.dtype, pos)), seq_lens}), 1);
        at[pos] = e.op("Where", {live, next.h, e.constant(zeros)});
        next.h = e.op("Where", {live, next.h, st.h});
        if (next.c) next.c = e.op("Where", {live, next.c, st.c});
      } else {
        at[pos] = next.h;
      }
      st = next;
    }
    ys.push_back(e.unsqueeze(e.stack(at, 0), 1));  // [S, 1, B, H]
    hs.push_back(st.h);
    if (st.c) cs.push_back(st.c);
  }
  Value* y = e.concat(ys, 1);
  Value* yh = e.stack(hs, 0);
  Value* yc = cs.empty() ? nullptr : e.stack(cs, 0);
  if (layout == 1) {
    y = e.transpose(y, {2, 0, 1, 3});
    yh = e.transpose(yh, {1, 0, 2});
    if (yc) yc = e.transpose(yc, {1, 0, 2});
  }
  std::vector<Value*> out{y, yh};
  if (spec.cell == Cell::lstm) out.push_back(yc);
  return out;
}

// ---- training optimizers (ai.onnx.preview.training) ----

// The inputs R, T, then `groups` groups of n tensors each; returns n and checks the count.
int64_t optimizer_arity(const ExpandCtx& c, int groups) {
  const int64_t rest = static_cast<int64_t>(c.inputs.size()) - 2;
  if (rest <= 0 || rest % groups != 0)
    fail("expects R, T and {} groups of equally many tensors, got {} inputs", groups, c.inputs.size());
  for (size_t i = 0; i < c.inputs.size(); ++i)
    if (!c.inputs[i]) fail("input {} is missing", i);
  return rest / groups;
}

// R and T as scalars of the parameters' dtype, and the predicate T > 0.
struct Step {
  Value* r;
  Value* t;
  Value* positive;
};
Step optimizer_step(Emit& e, const ExpandCtx& c, DType dt) {
  Value* r = e.cast(c.inputs[0], dt);
  Value* t = e.cast(c.inputs[1], dt);
  Value* positive = e.op("Greater", {c.inputs[1], e.constant(Tensor::scalar_i(c.inputs[1]->type.dtype, 0))});
  return {r, t, positive};
}

std::vector<Value*> expand_adagrad(ExpandCtx& c) {
  c.infer();
  Emit e(c.g, c.node_name);
  const int64_t n = optimizer_arity(c, 3);
  const double decay = attr_f(c, "decay_factor", 0), eps = attr_f(c, "epsilon", 0), norm = attr_f(c, "norm_coefficient", 0);
  std::vector<Value*> xs, hs;
  for (int64_t i = 0; i < n; ++i) {
    Value* x = c.inputs[2 + i];
    Value* g = c.inputs[2 + n + i];
    Value* h = c.inputs[2 + 2 * n + i];
    const DType dt = x->type.dtype;
    Step s = optimizer_step(e, c, dt);
    Value* rate = e.div(s.r, e.add(e.scalar(dt, 1.0), e.mul(s.t, e.scalar(dt, decay))));
    Value* greg = e.add(e.mul(e.scalar(dt, norm), x), g);
    Value* h_new = e.add(h, e.mul(greg, greg));
    Value* denom = e.add(e.sqrt(h_new), e.scalar(dt, eps));
    xs.push_back(e.sub(x, e.div(e.mul(rate, greg), denom)));
    hs.push_back(h_new);
  }
  xs.insert(xs.end(), hs.begin(), hs.end());
  return xs;
}

std::vector<Value*> expand_momentum(ExpandCtx& c) {
  c.infer();
  Emit e(c.g, c.node_name);
  const int64_t n = optimizer_arity(c, 3);
  const double alpha = attr_f_required(c, "alpha"), beta = attr_f_required(c, "beta");
  const double norm = attr_f_required(c, "norm_coefficient");
  const std::string mode = attr_s(c, "mode", "");
  if (mode != "standard" && mode != "nesterov") fail("mode must be 'standard' or 'nesterov', is '{}'", mode);
  std::vector<Value*> xs, vs;
  for (int64_t i = 0; i < n; ++i) {
    Value* x = c.inputs[2 + i];
    Value* g = c.inputs[2 + n + i];
    Value* v = c.inputs[2 + 2 * n + i];
    const DType dt = x->type.dtype;
    Step s = optimizer_step(e, c, dt);
    Value* greg = e.add(e.mul(e.scalar(dt, norm), x), g);
    // The first step (T = 0) takes the whole gradient: beta applies from the second on.
    Value* beta_adj = e.op("Where", {s.positive, e.scalar(dt, beta), e.scalar(dt, 1.0)});
    Value* v_new = e.add(e.mul(e.scalar(dt, alpha), v), e.mul(beta_adj, greg));
    Value* step = mode == "standard" ? v_new : e.add(greg, e.mul(e.scalar(dt, alpha), v_new));
    xs.push_back(e.sub(x, e.mul(s.r, step)));
    vs.push_back(v_new);
  }
  xs.insert(xs.end(), vs.begin(), vs.end());
  return xs;
}

std::vector<Value*> expand_adam(ExpandCtx& c) {
  c.infer();
  Emit e(c.g, c.node_name);
  const int64_t n = optimizer_arity(c, 4);
  const double alpha = attr_f(c, "alpha", 0.9), beta = attr_f(c, "beta", 0.999), eps = attr_f(c, "epsilon", 1e-6);
  const double norm = attr_f(c, "norm_coefficient", 0), norm_post = attr_f(c, "norm_coefficient_post", 0);
  std::vector<Value*> xs, vs, hs;
  for (int64_t i = 0; i < n; ++i) {
    Value* x = c.inputs[2 + i];
    Value* g = c.inputs[2 + n + i];
    Value* v = c.inputs[2 + 2 * n + i];
    Value* h = c.inputs[2 + 3 * n + i];
    const DType dt = x->type.dtype;
    auto k = [&](double val) { return e.scalar(dt, val); };
    Step s = optimizer_step(e, c, dt);
    Value* greg = e.add(e.mul(k(norm), x), g);
    Value* v_new = e.add(e.mul(k(alpha), v), e.mul(k(1 - alpha), greg));
    Value* h_new = e.add(e.mul(k(beta), h), e.mul(k(1 - beta), e.mul(greg, greg)));
    Value* h_sqrt = e.add(e.sqrt(h_new), k(eps));
    // Bias correction from the second step on: R sqrt(1 - beta^T) / (1 - alpha^T).
    Value* corr = e.div(e.sqrt(e.sub(k(1), e.op("Pow", {k(beta), s.t}))), e.sub(k(1), e.op("Pow", {k(alpha), s.t})));
    Value* r_adj = e.op("Where", {s.positive, e.mul(s.r, corr), s.r});
    Value* x_new = e.sub(x, e.mul(r_adj, e.div(v_new, h_sqrt)));
    xs.push_back(e.mul(k(1 - norm_post), x_new));
    vs.push_back(v_new);
    hs.push_back(h_new);
  }
  xs.insert(xs.end(), vs.begin(), vs.end());
  xs.insert(xs.end(), hs.begin(), hs.end());
  return xs;
}

// ---- FlexAttention with score_mod / prob_mod subgraphs ----

// Scaled dot-product attention as graph ops, each subgraph applied to the whole [B, H, L, S] scores
// (before the softmax) or probabilities (after it); K and V heads are repeated for grouped queries.
// Without subgraphs FlexAttention stays a graph op (src/tessel/ops/attention.cpp).
std::vector<Value*> expand_flex_attention(ExpandCtx& c, const onnx::NodeProto& np) {
  c.infer();
  Emit e(c.g, c.node_name);
  Value* q = need_input(c, 0, "Q");
  Value* k = need_input(c, 1, "K");
  Value* v = need_input(c, 2, "V");
  const DType dt = q->type.dtype;
  if (!is_float(dt) || k->type.dtype != dt || v->type.dtype != dt) fail("FlexAttention needs float Q, K, V of one dtype");
  for (Value* x : {q, k, v})
    if (x->type.shape.size() != 4) fail("FlexAttention inputs must be 4-D, got {}", x->type.str());
  const int64_t hq = static_dim(q, 1, "Q"), hkv = static_dim(k, 1, "K"), depth = static_dim(q, 3, "Q");
  if (hkv <= 0 || hq % hkv != 0) fail("FlexAttention q heads {} must be a multiple of kv heads {}", hq, hkv);
  const DType ct = dtype_bits(dt) < 32 ? DType::f32 : dt;
  // x is `of` converted to the compute type: the shape is of's (x was just emitted and not inferred).
  auto repeat_heads = [&](Value* x, const Value* of) {
    if (hq == hkv) return x;
    const Shape s = of->type.shape;
    if (s.size() != 4) fail("FlexAttention inputs must be 4-D, got {}", of->type.str());
    for (int64_t d : s)
      if (d < 0) unsupported("FlexAttention with grouped heads needs static K and V shapes");
    Value* big = e.op("Expand", {e.unsqueeze(x, 2), e.ints({s[0], hkv, hq / hkv, s[2], s[3]})});
    return e.op("Reshape", {big, e.ints({s[0], hq, s[2], s[3]})});
  };
  const double scale = attr_f(c, "scale", 1.0 / std::sqrt(static_cast<double>(depth)));
  Value* kt = e.transpose(repeat_heads(e.cast(k, ct), k), {0, 1, 3, 2});
  Value* scores = e.mul(e.matmul(e.cast(q, ct), kt), e.scalar(ct, scale));
  const onnx::GraphProto* score_mod = nullptr;
  const onnx::GraphProto* prob_mod = nullptr;
  for (const auto& a : np.attribute()) {
    if (a.type() != onnx::AttributeProto::GRAPH) continue;
    if (a.name() == "score_mod") score_mod = &a.g();
    else if (a.name() == "prob_mod") prob_mod = &a.g();
    else unsupported("unsupported attribute '{}'", a.name());
  }
  auto apply = [&](const onnx::GraphProto* body, Value* x) {
    if (!body) return x;
    c.infer();
    std::vector<Value*> out = c.import_body(*body, {x});
    if (out.size() != 1) fail("subgraph '{}' must have one output, has {}", body->name(), out.size());
    return out[0];
  };
  scores = apply(score_mod, scores);
  Value* probs = apply(prob_mod, e.op("Softmax", {scores}, {{"axis", int64_t{-1}}}));
  Value* y = e.matmul(probs, repeat_heads(e.cast(v, ct), v));
  return {e.cast(y, dt)};
}

// ---- ai.onnx.ml: Binarizer, ArrayFeatureExtractor ----

// Y = X > threshold ? 1 : 0, in X's dtype.
std::vector<Value*> expand_binarizer(ExpandCtx& c) {
  c.infer();
  Emit e(c.g, c.node_name);
  Value* x = need_input(c, 0, "X");
  const DType dt = x->type.dtype;
  if (!is_float(dt) && !is_int(dt)) fail("Binarizer is not defined for {}", x->type.str());
  Value* above = e.op("Greater", {x, e.scalar(dt, attr_f(c, "threshold", 0.0))});
  return {e.op("Where", {above, e.scalar(dt, 1), e.scalar(dt, 0)})};
}

// The elements of X's last axis at the indices Y (flattened); a 1-D X gives a [1, n] result.
std::vector<Value*> expand_array_feature_extractor(ExpandCtx& c) {
  c.infer();
  Emit e(c.g, c.node_name);
  Value* x = need_input(c, 0, "X");
  Value* y = need_input(c, 1, "Y");
  if (y->type.dtype != DType::i64) fail("Y must be int64, is {}", y->type.str());
  if (x->type.shape.empty()) fail("X must have rank at least 1");
  Value* flat = e.op("Reshape", {y, e.ints({-1})});
  Value* z = e.op("Gather", {x, flat}, {{"axis", int64_t{-1}}});
  if (x->type.shape.size() == 1) z = e.unsqueeze(z, 0);
  return {z};
}

// ---- optionals, in their tensor forms ----

// Graph inputs of optional type are not supported, so an input here is always a present tensor
// and a missing one always an empty optional.
std::vector<Value*> expand_optional_has_element(ExpandCtx& c) {
  Emit e(c.g, c.node_name);
  Tensor r(DType::boolean, {});
  r.set_i(0, input(c, 0) ? 1 : 0);
  return {e.op("Identity", {e.constant(r)})};
}

std::vector<Value*> expand_optional_get_element(ExpandCtx& c) {
  Emit e(c.g, c.node_name);
  return {e.op("Identity", {need_input(c, 0, "input")})};
}

}  // namespace

const std::vector<ExpandedOp>& expanded_ops() {
  static const std::vector<ExpandedOp> ops = {
      {"ai.onnx", "If", "the branch a known condition selects; else both branches, and Where (one static type) or tessel.Choose (shapes that differ) per output"},
      {"ai.onnx", "Scan", "unrolled over a static sequence length (Scan-8 per batch entry, without sequence_lens)"},
      {"ai.onnx", "RNN", "unrolled cells of MatMul, Add and the activations; sequence_lens as Where masks"},
      {"ai.onnx", "GRU", "as RNN (gates z, r, h; linear_before_reset both ways)"},
      {"ai.onnx", "LSTM", "as RNN (gates i, o, f, c; peepholes, input_forget)"},
      {"ai.onnx", "OptionalHasElement", "a constant: true for a tensor input, false for a missing one"},
      {"ai.onnx", "OptionalGetElement", "Identity of a tensor input"},
      {"ai.onnx.preview", "FlexAttention", "with score_mod / prob_mod: MatMul, score_mod, Softmax, prob_mod, MatMul"},
      {"ai.onnx.preview.training", "Adagrad", "its elementwise update"},
      {"ai.onnx.preview.training", "Adam", "its elementwise update"},
      {"ai.onnx.preview.training", "Momentum", "its elementwise update (standard and nesterov)"},
      {"ai.onnx.ml", "Binarizer", "Greater and Where"},
      {"ai.onnx.ml", "ArrayFeatureExtractor", "Gather on the last axis"},
  };
  return ops;
}

bool is_expanded_op(const onnx::NodeProto& np) {
  const std::string domain = np.domain().empty() ? "ai.onnx" : np.domain();
  // FlexAttention without subgraphs is a graph op of its own (src/tessel/ops/attention.cpp).
  if (domain == "ai.onnx.preview" && np.op_type() == "FlexAttention") return !expanded_op_subgraphs(np).empty();
  for (const ExpandedOp& e : expanded_ops())
    if (e.domain == domain && e.op == np.op_type()) return true;
  return false;
}

std::vector<const onnx::GraphProto*> expanded_op_subgraphs(const onnx::NodeProto& np) {
  std::vector<const onnx::GraphProto*> out;
  for (const auto& a : np.attribute())
    if (a.type() == onnx::AttributeProto::GRAPH) out.push_back(&a.g());
  return out;
}

std::vector<Value*> expand_node(ExpandCtx& c, const onnx::NodeProto& np, int opset) {
  const std::string& op = np.op_type();
  // Nested expansions (a Scan in a Scan body) each pass the bound; this one bounds their product.
  if (static_cast<int64_t>(c.g.nodes().size()) > kMaxUnrolledNodes)
    unsupported("the graph already has over {} nodes from expanded control flow", kMaxUnrolledNodes);
  std::vector<Value*> out;
  if (op == "If") out = expand_if(c, np);
  else if (op == "Scan") out = expand_scan(c, np, opset);
  else if (op == "RNN") out = expand_recurrent(c, {Cell::rnn, 1, {"Tanh"}});
  else if (op == "GRU") out = expand_recurrent(c, {Cell::gru, 3, {"Sigmoid", "Tanh"}});
  else if (op == "LSTM") out = expand_recurrent(c, {Cell::lstm, 4, {"Sigmoid", "Tanh", "Tanh"}});
  else if (op == "Adagrad") out = expand_adagrad(c);
  else if (op == "Adam") out = expand_adam(c);
  else if (op == "Momentum") out = expand_momentum(c);
  else if (op == "FlexAttention") out = expand_flex_attention(c, np);
  else if (op == "Binarizer") out = expand_binarizer(c);
  else if (op == "ArrayFeatureExtractor") out = expand_array_feature_extractor(c);
  else if (op == "OptionalHasElement") out = expand_optional_has_element(c);
  else if (op == "OptionalGetElement") out = expand_optional_get_element(c);
  else fail("internal: {} is not expanded at import", op);
  if (static_cast<int>(out.size()) < c.num_outputs)
    fail("has {} outputs; {} defines {}", c.num_outputs, op, out.size());
  out.resize(static_cast<size_t>(c.num_outputs));
  // An output that is an outer value itself (a branch or a loop state passing an input through)
  // gets a node of its own, so that a graph output is never a graph input or constant.
  Emit e(c.g, c.node_name);
  for (Value*& v : out)
    if (v && (v->is_input || v->constant)) v = e.op("Identity", {v});
  return out;
}

}  // namespace tessel
