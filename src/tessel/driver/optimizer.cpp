// Building the optimizer-step graphs (SGD with momentum, AdamW) from core primitives.
#include "tessel/driver/optimizer.h"

#include <cmath>

#include <fmt/format.h>

#include "tessel/ir/core_builder.h"
#include "tessel/support/error.h"

namespace tessel {

std::vector<std::string> optimizer_scalars(const std::string& kind) {
  if (kind == "adamw") return {"decay", "step_size", "bc2_sqrt"};
  if (kind == "sgd") return {"lr", "mom", "damp"};
  fail("optimizer '{}' is not one of adamw, sgd", kind);
}

int optimizer_state_count(const OptimizerSpec& s) {
  if (s.kind == "adamw") return 2;
  if (s.kind == "sgd") return s.momentum != 0 ? 1 : 0;
  fail("optimizer '{}' is not one of adamw, sgd", s.kind);
}

std::vector<int> optimizer_output_aliases(const OptimizerSpec& s) {
  const int nscalar = static_cast<int>(optimizer_scalars(s.kind).size());
  const int nstate = optimizer_state_count(s);
  std::vector<int> a;
  for (size_t i = 0; i < s.shapes.size(); ++i) {
    const int base = nscalar + static_cast<int>(i) * (2 + nstate);  // p, g, state...
    a.push_back(base);
    for (int k = 0; k < nstate; ++k) a.push_back(base + 2 + k);
  }
  return a;
}

std::vector<double> optimizer_scalar_values(const OptimizerSpec& s, double lr, int64_t t) {
  if (t < 1) fail("optimizer step {} : steps count from 1", t);
  if (s.kind == "adamw") {
    const double bc1 = 1 - std::pow(s.beta1, static_cast<double>(t));
    const double bc2 = 1 - std::pow(s.beta2, static_cast<double>(t));
    return {1 - lr * s.weight_decay, lr / bc1, std::sqrt(bc2)};
  }
  optimizer_scalars(s.kind);
  return {lr, t == 1 ? 0.0 : s.momentum, t == 1 ? 1.0 : 1 - s.dampening};
}

std::unique_ptr<Graph> build_optimizer_graph(const OptimizerSpec& s) {
  const std::vector<std::string> scalars = optimizer_scalars(s.kind);
  if (s.shapes.empty()) fail("optimizer {}: no parameters", s.kind);
  if (s.kind == "adamw" && !(s.beta1 >= 0 && s.beta1 < 1 && s.beta2 >= 0 && s.beta2 < 1 && s.eps >= 0))
    fail("adamw: betas must be in [0, 1) and eps >= 0 (got {}, {}, {})", s.beta1, s.beta2, s.eps);
  if (s.kind == "sgd" && s.nesterov && (s.momentum <= 0 || s.dampening != 0))
    fail("sgd: Nesterov momentum requires a momentum and zero dampening");
  auto g = std::make_unique<Graph>();
  g->name = s.kind + "_step";
  const TensorType scalar{DType::f32, {}};
  std::vector<Value*> sc;
  for (const std::string& n : scalars) sc.push_back(g->add_input(n, scalar));
  const int nstate = optimizer_state_count(s);
  std::vector<Value*> outs;
  for (size_t i = 0; i < s.shapes.size(); ++i) {
    const TensorType t{DType::f32, s.shapes[i]};
    Value* p = g->add_input(fmt::format("p{}", i), t);
    Value* gr = g->add_input(fmt::format("g{}", i), t);
    std::vector<Value*> st;
    for (int k = 0; k < nstate; ++k) st.push_back(g->add_input(fmt::format("{}{}", k == 0 ? (s.kind == "sgd" ? "buf" : "m") : "v", i), t));
    Node origin;
    origin.name = fmt::format("{}/p{}", s.kind, i);
    CoreBuilder b(*g, origin);
    auto k = [&](double v) { return b.scalar(DType::f32, v); };
    if (s.kind == "adamw") {
      // torch.optim.AdamW (single-tensor): p *= 1 - lr wd; m = beta1 m + (1 - beta1) g;
      // v = beta2 v + (1 - beta2) g g; p += -step_size m / (sqrt(v) / bc2_sqrt + eps).
      // One builder call per statement: nodes are created in this order under every compiler (nested
      // calls as arguments would follow the compiler's argument evaluation order, and the graph's text,
      // which docs/training.md shows, would differ between gcc and clang).
      Value* p1 = b.mul(p, sc[0]);
      Value* m_g = b.mul(gr, k(1 - s.beta1));
      Value* m_m = b.mul(st[0], k(s.beta1));
      Value* m = b.add(m_m, m_g);
      Value* one_minus_beta2 = k(1 - s.beta2);
      Value* g2 = b.mul(gr, gr);
      Value* v_g = b.mul(g2, one_minus_beta2);
      Value* v_v = b.mul(st[1], k(s.beta2));
      Value* v = b.add(v_v, v_g);
      Value* eps = k(s.eps);
      Value* root = b.unary(CoreOp::sqrt, v);
      Value* denom = b.add(b.div(root, sc[2]), eps);
      Value* neg_step = b.emit(CoreOp::neg, {sc[1]});
      Value* update = b.div(m, denom);
      Value* np = b.add(p1, b.mul(update, neg_step));
      outs.insert(outs.end(), {np, m, v});
    } else {
      // torch.optim.SGD: d = g + wd p; buf = mom buf + damp d (the first step: buf = d);
      // d = nesterov ? d + momentum buf : buf; p += -lr d.
      Value* d = s.weight_decay != 0 ? b.add(gr, b.mul(p, k(s.weight_decay))) : gr;
      Value* buf = nullptr;
      if (nstate) {
        Value* damped = b.mul(d, sc[2]);
        Value* kept = b.mul(st[0], sc[1]);
        buf = b.add(kept, damped);
        d = s.nesterov ? b.add(d, b.mul(buf, k(s.momentum))) : buf;
      }
      Value* np = b.add(p, b.mul(d, b.emit(CoreOp::neg, {sc[0]})));
      outs.push_back(np);
      if (buf) outs.push_back(buf);
    }
  }
  g->outputs = outs;
  return g;
}

}  // namespace tessel
