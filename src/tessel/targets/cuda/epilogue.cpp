// The cuBLASLt epilogue decision for matmul kernels (see epilogue.h).
#include "tessel/targets/cuda/epilogue.h"

#include <cmath>
#include <map>
#include <optional>

#include "tessel/ir/core_ops.h"
#include "tessel/support/error.h"

namespace tessel::cuda {
namespace {

// The scalar value of every instruction, in double, given the loaded values by access; nullopt for an op
// outside the small set an epilogue is matched from (then it is not folded).
std::optional<double> eval(const Kernel& k, const std::map<int, double>& loaded, int* stored_access) {
  std::vector<double> v(k.body.size(), 0);
  std::optional<double> out;
  for (size_t i = 0; i < k.body.size(); ++i) {
    const KInstr& in = k.body[i];
    auto a = [&](size_t j) { return v[static_cast<size_t>(in.args.at(j))]; };
    if (in.is(KInstrKind::load)) {
      const auto it = loaded.find(in.access);
      if (it == loaded.end()) return std::nullopt;
      v[i] = it->second;
    } else if (in.is(KInstrKind::constant)) {
      v[i] = in.value;
    } else if (in.is(KInstrKind::store)) {
      if (out) return std::nullopt;  // one store only
      out = a(0);
      *stored_access = in.access;
    } else {
      std::vector<double> ops;
      for (size_t j = 0; j < in.args.size(); ++j) ops.push_back(a(j));
      const std::optional<double> r = eval_scalar_op(in, ops);
      if (!r) return std::nullopt;
      v[i] = *r;
    }
    if (in.dtype != DType::f32 && !in.is(KInstrKind::store)) return std::nullopt;
  }
  return out;
}

}  // namespace

std::optional<double> eval_scalar_op(const KInstr& in, const std::vector<double>& a) {
  auto is = [&](CoreOp c) { return in.is(c); };
  if (a.size() == 1) {
    if (is(CoreOp::neg)) return -a[0];
    if (is(CoreOp::tanh)) return std::tanh(a[0]);
    if (is(CoreOp::erf)) return std::erf(a[0]);
    if (is(CoreOp::exp)) return std::exp(a[0]);
    if (is(CoreOp::sqrt)) return std::sqrt(a[0]);
    return std::nullopt;
  }
  if (a.size() == 2) {
    if (is(CoreOp::add)) return a[0] + a[1];
    if (is(CoreOp::mul)) return a[0] * a[1];
    if (is(CoreOp::div)) return a[0] / a[1];
    if (is(CoreOp::max)) return std::max(a[0], a[1]);
    if (is(CoreOp::min)) return std::min(a[0], a[1]);
    if (is(CoreOp::pow)) return std::pow(a[0], a[1]);
  }
  return std::nullopt;
}

namespace {

double gelu_tanh(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

}  // namespace

LtEpilogue match_lt_epilogue(const Kernel& k) {
  LtEpilogue e;
  if (k.kind != KernelKind::matmul || k.body.empty()) {
    e.why = "no epilogue";
    return e;
  }
  const MatmulSpec& mm = k.mm;
  if (mm.c_batch || mm.c_m || mm.c_n) {
    e.why = "generated epilogue: the product is stored through strides";
    return e;
  }
  if (k.phases != 1) {
    e.why = "generated epilogue: more than one phase";
    return e;
  }
  // The loop must walk C's [rows, N] elements: C's access has the loop's dense strides with N innermost.
  const size_t nd = k.outer.size() + k.inner.size();
  std::vector<int64_t> ext = require_static(k.outer);
  for (const Dim& d : k.inner) ext.push_back(d);
  int c_access = -1;
  for (size_t a = 0; a < k.accesses.size(); ++a)
    if (k.accesses[a].arg == mm.c) c_access = static_cast<int>(a);
  if (c_access < 0) {
    e.why = "generated epilogue: it does not read the product";
    return e;
  }
  const KAccess& ca = k.accesses[static_cast<size_t>(c_access)];
  int64_t dense = 1;
  for (size_t d = nd; d-- > 0;) {
    if (ca.strides.size() != nd || ca.strides[d] != dense) {
      e.why = "generated epilogue: its loop is not the product's row-major order";
      return e;
    }
    dense *= ext[d];
  }
  if (ca.offset != 0 || dense != mm.batch * mm.m * mm.n) {
    e.why = "generated epilogue: its loop is not the whole product";
    return e;
  }
  // Every other access: a bias over N (stride 0 on whole rows, C's strides within a row), or a residual /
  // the result in C's own layout.
  std::map<int, char> role;  // access -> 'c', 'b' (bias), 'r' (residual or result)
  role[c_access] = 'c';
  for (size_t a = 0; a < k.accesses.size(); ++a) {
    if (static_cast<int>(a) == c_access) continue;
    const KAccess& x = k.accesses[a];
    if (x.offset != 0 || x.strides.size() != nd) {
      e.why = "generated epilogue: an operand with an offset";
      return e;
    }
    bool same = x.strides == ca.strides, bias = true;
    for (size_t d = 0; d < nd; ++d) {
      const bool in_row = ca.strides[d] < mm.n;  // a dim inside one row of N
      bias = bias && x.strides[d] == (in_row ? ca.strides[d] : Dim(0));
    }
    if (same) role[static_cast<int>(a)] = 'r';
    else if (bias) role[static_cast<int>(a)] = 'b';
    else {
      e.why = "generated epilogue: an operand neither a bias over N nor in the product's layout";
      return e;
    }
  }
  // Evaluate on sample values: which access is stored, which loaded ones are bias and residual.
  int stored = -1;
  std::map<int, double> probe;
  for (const auto& [a, r] : role) probe[a] = 0.25;
  if (!eval(k, probe, &stored) || stored < 0) {
    e.why = "generated epilogue: an op outside add/mul/div/neg/max/min/pow/tanh/erf/exp/sqrt";
    return e;
  }
  int bias_a = -1, res_a = -1;
  for (const KInstr& in : k.body) {
    if (!in.is(KInstrKind::load)) continue;
    const char r = role[in.access];
    if (r == 'b') {
      if (bias_a >= 0 && bias_a != in.access) { e.why = "generated epilogue: two bias vectors"; return e; }
      bias_a = in.access;
    } else if (r == 'r' && in.access != c_access) {
      if (res_a >= 0 && res_a != in.access) { e.why = "generated epilogue: two residuals"; return e; }
      res_a = in.access;
    }
  }
  if (k.accesses[static_cast<size_t>(stored)].strides != ca.strides) {
    e.why = "generated epilogue: the result is not stored in the product's layout";
    return e;
  }
  struct Form { bool bias; LtEpilogue::Act act; bool residual; };
  const Form forms[] = {{true, LtEpilogue::Act::none, false},      {true, LtEpilogue::Act::gelu_tanh, false},
                        {false, LtEpilogue::Act::gelu_tanh, false}, {true, LtEpilogue::Act::relu, false},
                        {false, LtEpilogue::Act::relu, false},      {true, LtEpilogue::Act::none, true},
                        {false, LtEpilogue::Act::none, true}};
  for (const Form& f : forms) {
    if (f.bias != (bias_a >= 0) || f.residual != (res_a >= 0)) continue;
    bool ok = true;
    for (int s = 0; s < 41 && ok; ++s) {
      const double c = -4.0 + 0.2 * s + 0.013, b = 0.37 - 0.05 * s, r = 0.5 + 0.11 * s;
      std::map<int, double> in = {{c_access, c}};
      if (bias_a >= 0) in[bias_a] = b;
      if (res_a >= 0) in[res_a] = r;
      int st = -1;
      const std::optional<double> got = eval(k, in, &st);
      double x = c + (f.bias ? b : 0);
      x = f.act == LtEpilogue::Act::gelu_tanh ? gelu_tanh(x) : f.act == LtEpilogue::Act::relu ? std::max(x, 0.0) : x;
      x += f.residual ? r : 0;
      ok = got && std::fabs(*got - x) <= 1e-6 * std::max(1.0, std::fabs(x));
    }
    if (!ok) continue;
    e.fold = true;
    e.bias = f.bias;
    e.act = f.act;
    e.residual = f.residual;
    e.bias_arg = bias_a >= 0 ? k.accesses[static_cast<size_t>(bias_a)].arg : -1;
    e.residual_arg = res_a >= 0 ? k.accesses[static_cast<size_t>(res_a)].arg : -1;
    e.out_arg = k.accesses[static_cast<size_t>(stored)].arg;
    e.why = fmt::format("cuBLASLt epilogue: {}{}{}", f.bias ? "bias" : "",
                        f.act == LtEpilogue::Act::gelu_tanh ? (f.bias ? " + GELU (tanh)" : "GELU (tanh)") : f.act == LtEpilogue::Act::relu ? (f.bias ? " + ReLU" : "ReLU") : "",
                        f.residual ? (f.bias || f.act != LtEpilogue::Act::none ? " + residual (beta = 1)" : "residual (beta = 1)") : "");
    return e;
  }
  e.why = "generated epilogue: not bias / GELU (tanh) / ReLU / residual (an erf GELU stays generated)";
  return e;
}

}  // namespace tessel::cuda
