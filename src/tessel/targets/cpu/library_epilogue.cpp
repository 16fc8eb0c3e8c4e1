// Matching a kernel's epilogue onto oneDNN's bias and post-ops (see library_epilogue.h).
#include "tessel/targets/cpu/library_epilogue.h"

#include <cmath>
#include <set>

namespace tessel::cpu {
namespace {

struct Matcher {
  const Kernel& k;
  int acc_arg;
  Dim channels;  // the result's channel count (a matmul's N may be symbolic)
  std::set<int> used;  // instructions the pattern accounts for

  const KInstr& at(int i) const { return k.body[static_cast<size_t>(i)]; }
  bool is(int i, CoreOp op) const { return at(i).is(op); }
  bool is(int i, KInstrKind kind) const { return at(i).is(kind); }
  bool is_const(int i, double v, double tol = 0) const {
    return is(i, KInstrKind::constant) && std::fabs(at(i).value - v) <= tol * std::fabs(v);
  }
  std::optional<double> const_value(int i) const {
    if (!is(i, KInstrKind::constant)) return std::nullopt;
    return at(i).value;
  }
  int arg(int i, int j) const { return at(i).args[static_cast<size_t>(j)]; }
  void take(int i) { used.insert(i); }

  // The library result itself.
  bool acc(int i) {
    if (!is(i, KInstrKind::load) || k.accesses[static_cast<size_t>(at(i).access)].arg != acc_arg) return false;
    take(i);
    return true;
  }

  // A load of a constant [channels] vector indexed by the channel only.
  bool bias(int i, int* bias_arg) {
    if (!is(i, KInstrKind::load)) return false;
    const KAccess& b = k.accesses[static_cast<size_t>(at(i).access)];
    const KArg& a = k.args[static_cast<size_t>(b.arg)];
    if (a.role != KArg::Role::in || !a.type.dims_defined() || !(dims_numel(a.type.dims()) == channels) || !(b.offset == 0))
      return false;
    // exactly one loop dim moves through the bias, with stride 1, and it is the channel dim of the result
    int dim = -1;
    for (size_t d = 0; d < b.strides.size(); ++d) {
      if (b.strides[d] == 0) continue;
      if (dim >= 0 || !(b.strides[d] == 1)) return false;
      dim = static_cast<int>(d);
    }
    if (dim < 0) return false;
    const Dim& extent = static_cast<size_t>(dim) < k.outer.size() ? k.outer[static_cast<size_t>(dim)]
                                                                    : k.inner[static_cast<size_t>(dim) - k.outer.size()];
    if (!(extent == channels)) return false;
    // the result's stride along that dim is the channel stride
    Dim want = 1;
    if (k.kind == KernelKind::conv && !k.conv.y_nhwc) want = k.conv.oh * k.conv.ow;
    for (const KAccess& r : k.accesses)
      if (r.arg == acc_arg && !(r.strides[static_cast<size_t>(dim)] == want)) return false;
    *bias_arg = b.arg;
    take(i);
    return true;
  }

  // acc, acc + bias, scale · acc, scale · (acc + bias)
  bool linear(int i, LibraryEpilogue& e) {
    if (acc(i)) return true;
    if (is(i, CoreOp::add)) {
      for (int s = 0; s < 2; ++s)
        if (acc(arg(i, s)) && bias(arg(i, 1 - s), &e.bias_arg)) {
          take(i);
          e.summary += "bias";
          return true;
        }
      return false;
    }
    // A scale is oneDNN's output scale, which its f32 convolutions reject ("could not create a
    // primitive descriptor"): for a convolution the generated epilogue applies it.
    if ((is(i, CoreOp::mul) || is(i, CoreOp::div)) && const_value(arg(i, 1)) && k.kind == KernelKind::matmul) {
      const double c = *const_value(arg(i, 1));
      if (c == 0 || !std::isfinite(c)) return false;
      if (!linear(arg(i, 0), e)) return false;
      e.epilogue.alpha = static_cast<float>(is(i, CoreOp::mul) ? c : 1.0 / c);
      take(i);
      take(arg(i, 1));
      e.summary += (e.summary.empty() ? "" : " + ") + std::string("scale");
      return true;
    }
    return false;
  }

  // x · (erf(x / sqrt 2) + 1) · 0.5, in the order the decomposition writes it
  bool gelu(int i, LibraryEpilogue& e) {
    if (!is(i, CoreOp::mul) || !is_const(arg(i, 1), 0.5)) return false;
    const int m = arg(i, 0);
    if (!is(m, CoreOp::mul)) return false;
    for (int s = 0; s < 2; ++s) {
      const int x = arg(m, s), a = arg(m, 1 - s);
      if (!is(a, CoreOp::add) || !is_const(arg(a, 1), 1.0)) continue;
      const int er = arg(a, 0);
      if (!is(er, CoreOp::erf)) continue;
      const int t = arg(er, 0);
      const bool scaled = (is(t, CoreOp::div) && is_const(arg(t, 1), std::sqrt(2.0), 1e-6)) ||
                          (is(t, CoreOp::mul) && is_const(arg(t, 1), 1 / std::sqrt(2.0), 1e-6));
      if (!scaled || arg(t, 0) != x) continue;
      if (!linear(x, e)) return false;
      for (int j : {i, arg(i, 1), m, a, arg(a, 1), er, t, arg(t, 1)}) take(j);
      e.epilogue.act = Activation::gelu_erf;
      return true;
    }
    return false;
  }

  // select(x < 0, slope · x, x): LeakyRelu's core form, as oneDNN's relu with a slope
  // (x > 0 ? x : slope · x). Only for slope > 0, where the two agree on ±0 too (the sign of slope · ±0).
  bool leaky_relu(int i, LibraryEpilogue& e) {
    if (!is(i, CoreOp::select)) return false;
    const int c = arg(i, 0), t = arg(i, 1), x = arg(i, 2);
    if (!is(c, CoreOp::compare) || at(c).attr != "lt" || arg(c, 0) != x || !is_const(arg(c, 1), 0.0) || !is(t, CoreOp::mul))
      return false;
    for (int s = 0; s < 2; ++s) {
      const std::optional<double> slope = const_value(arg(t, 1 - s));
      if (arg(t, s) != x || !slope || !(*slope > 0) || !std::isfinite(*slope)) continue;
      if (!linear(x, e)) return false;
      for (int j : {i, c, arg(c, 1), t, arg(t, 1 - s)}) take(j);
      e.epilogue.act = Activation::leaky_relu;
      e.epilogue.slope = static_cast<float>(*slope);
      return true;
    }
    return false;
  }

  // sigmoid(x) as the decomposition writes it, stable on both sides (ops/activation.cpp):
  //   e = exp(-max(x, -x));  s = 1 / (e + 1);  x >= 0 ? s : e · s
  // Returns x, or -1 when i is not that form. The instructions are taken only by the caller's match.
  int sigmoid_of(int i, std::vector<int>* parts) const {
    if (!is(i, CoreOp::select)) return -1;
    const int c = arg(i, 0), s = arg(i, 1), es = arg(i, 2);
    if (!is(c, CoreOp::compare) || at(c).attr != "ge" || !is_const(arg(c, 1), 0.0)) return -1;
    const int x = arg(c, 0);
    if (!is(s, CoreOp::div) || !is_const(arg(s, 0), 1.0)) return -1;
    const int d = arg(s, 1);
    if (!is(d, CoreOp::add) || !is_const(arg(d, 1), 1.0)) return -1;
    const int ex = arg(d, 0);
    if (!is(ex, CoreOp::exp) || !is(es, CoreOp::mul) || arg(es, 0) != ex || arg(es, 1) != s) return -1;
    const int n = arg(ex, 0);
    if (!is(n, CoreOp::neg)) return -1;
    const int mx = arg(n, 0);
    if (!is(mx, CoreOp::max) || arg(mx, 0) != x) return -1;
    const int nx = arg(mx, 1);
    if (!is(nx, CoreOp::neg) || arg(nx, 0) != x) return -1;
    *parts = {i, c, arg(c, 1), s, arg(s, 0), d, arg(d, 1), ex, es, n, mx, nx};
    return x;
  }

  // x · sigmoid(x) (SiLU / swish, efficientnet's activation) as oneDNN's swish with β = 1, and sigmoid
  // alone as its logistic. NaN stays NaN in both (x / (1 + exp(-x))), as in the generated form.
  bool sigmoid_family(int i, LibraryEpilogue& e) {
    std::vector<int> parts;
    if (int x = sigmoid_of(i, &parts); x >= 0) {
      if (!linear(x, e)) return false;
      for (int j : parts) take(j);
      e.epilogue.act = Activation::sigmoid;
      return true;
    }
    if (!is(i, CoreOp::mul)) return false;
    for (int s = 0; s < 2; ++s) {
      const int x = arg(i, s);
      if (sigmoid_of(arg(i, 1 - s), &parts) != x) continue;
      if (!linear(x, e)) return false;
      for (int j : parts) take(j);
      take(i);
      e.epilogue.act = Activation::swish;
      return true;
    }
    return false;
  }

  bool activation(int i, LibraryEpilogue& e) {
    if (gelu(i, e) || leaky_relu(i, e) || sigmoid_family(i, e)) return true;
    // Relu and Clip (min/max with constants) stay in the generated epilogue: oneDNN's relu (a max) maps
    // NaN to 0 and its clip to a bound, where ONNX keeps it (docs/decisions.md;
    // tests/randgraph/seed4030_compiled_matmul_relu_nan.tsl, seed906_compiled_matmul_clip_nan.tsl). Its
    // NaN-keeping relu, elu(alpha 0) + linear(1, 0), was measured: the exp costs more than the pass.
    if (is(i, CoreOp::min) || is(i, CoreOp::max)) return false;
    return linear(i, e);
  }
};

}  // namespace

std::optional<LibraryEpilogue> match_library_epilogue(const Kernel& k) {
  if (k.kind == KernelKind::loop || k.body.empty()) return std::nullopt;
  const int acc_arg = k.kind == KernelKind::matmul ? k.mm.c : k.conv.y;
  const Dim channels = k.kind == KernelKind::matmul ? k.mm.n : Dim(k.conv.oc);
  int store = -1;
  for (size_t i = 0; i < k.body.size(); ++i) {
    if (!k.body[i].is(KInstrKind::store)) continue;
    if (store >= 0) return std::nullopt;  // one result only
    store = static_cast<int>(i);
  }
  if (store < 0) return std::nullopt;
  const KInstr& st = k.body[static_cast<size_t>(store)];
  if (k.accesses[static_cast<size_t>(st.access)].arg != acc_arg || st.dtype != DType::f32) return std::nullopt;
  Matcher m{k, acc_arg, channels, {}};
  LibraryEpilogue e;
  if (!m.activation(st.args[0], e)) return std::nullopt;
  m.take(store);
  if (m.used.size() != k.body.size()) return std::nullopt;  // something else is computed
  // the result is written where the library wrote it
  for (int i : m.used)
    if (k.body[static_cast<size_t>(i)].is(KInstrKind::load) && k.accesses[static_cast<size_t>(k.body[static_cast<size_t>(i)].access)].arg == acc_arg &&
        k.body[static_cast<size_t>(i)].access != st.access)
      return std::nullopt;
  if (e.epilogue.act != Activation::none) {
    static const char* names[] = {"none", "relu", "clip", "gelu_erf", "gelu_tanh", "sigmoid", "tanh", "leaky_relu", "swish"};
    e.summary += (e.summary.empty() ? "" : " + ") + std::string(names[static_cast<int>(e.epilogue.act)]);
  }
  if (e.summary.empty()) return std::nullopt;
  return e;
}

std::vector<bool> library_epilogues(const KernelModule& m, std::vector<LibraryEpilogue>* epilogues) {
  std::vector<bool> in(m.kernels.size(), false);
  if (epilogues) epilogues->assign(m.kernels.size(), LibraryEpilogue{});
  for (const auto& n : m.graph->nodes()) {
    if (!is_kernel_node(*n)) continue;
    const size_t id = static_cast<size_t>(n->attr_i("kernel"));
    auto lib = match_library_epilogue(m.kernels[id]);
    if (!lib) continue;
    // oneDNN takes the bias as a constant it copies
    const Value* bv = lib->bias_arg >= 0 ? n->inputs[static_cast<size_t>(lib->bias_arg)] : nullptr;
    if (bv && (!bv->constant || bv->type.dtype != DType::f32)) continue;
    in[id] = true;
    if (epilogues) (*epilogues)[id] = *lib;
  }
  return in;
}

MatmulDesc matmul_desc(const MatmulSpec& mm) {
  MatmulDesc d;
  d.batch = mm.batch, d.M = mm.m, d.N = mm.n, d.K = mm.k;
  d.a_batch = mm.a_batch, d.a_m = mm.a_m, d.a_k = mm.a_k;
  d.b_batch = mm.b_batch, d.b_k = mm.b_k, d.b_n = mm.b_n;
  d.c_batch = mm.c_batch, d.c_m = mm.c_m, d.c_n = mm.c_n;
  return d;
}

ConvDesc conv_desc(const ConvSpec& c) {
  ConvDesc d{};
  d.N = c.n, d.C = c.c, d.H = c.h, d.W = c.wd, d.OC = c.oc, d.KH = c.kh, d.KW = c.kw, d.OH = c.oh, d.OW = c.ow;
  d.stride_h = c.stride_h, d.stride_w = c.stride_w;
  d.pad_top = c.pad_top, d.pad_left = c.pad_left, d.pad_bottom = c.pad_bottom, d.pad_right = c.pad_right;
  d.dil_h = c.dil_h, d.dil_w = c.dil_w, d.groups = c.groups;
  d.src_nhwc = c.x_nhwc, d.dst_nhwc = c.y_nhwc;
  return d;
}

}  // namespace tessel::cpu
