// The CUDA target's storage types under a precision choice (see precision.h).
#include "tessel/targets/cuda/precision.h"

#include <cmath>
#include <cstring>
#include <numeric>

#include "tessel/ir/core_ops.h"
#include "tessel/support/error.h"

namespace tessel::cuda {

Precision parse_precision(const std::string& s) {
  if (s == "f32") return Precision::f32;
  if (s == "bf16") return Precision::bf16;
  throw Error(Location{.pass = "cuda"}, fmt::format("--precision must be f32 or bf16, not '{}'", s));
}

const char* precision_name(Precision p) { return p == Precision::bf16 ? "bf16" : "f32"; }

double precision_tolerance(Precision p) { return p == Precision::bf16 ? 2e-2 : 1e-4; }

std::vector<DType> value_storage(const Graph& g, Precision p) {
  size_t nv = 0;
  for (const auto& v : g.values()) nv = std::max(nv, static_cast<size_t>(v->id) + 1);
  std::vector<DType> st(nv, DType::f32);
  for (const auto& v : g.values()) st[static_cast<size_t>(v->id)] = v->type.dtype;
  if (p == Precision::f32) return st;
  // Memory classes: a reshape's result shares its operand's bytes (the runtime aliases them).
  std::vector<int> root(nv);
  std::iota(root.begin(), root.end(), 0);
  auto find = [&](int x) {
    while (root[static_cast<size_t>(x)] != x) x = root[static_cast<size_t>(x)];
    return x;
  };
  for (const auto& n : g.nodes())
    if (is_core_op(*n, CoreOp::reshape) && !n->inputs.empty() && n->inputs[0] && !n->outputs.empty() && n->outputs[0])
      root[static_cast<size_t>(find(n->outputs[0]->id))] = find(n->inputs[0]->id);
  std::vector<bool> keep(nv, false);
  for (const Value* v : g.outputs)
    if (v) keep[static_cast<size_t>(find(v->id))] = true;
  for (const auto& v : g.values())
    if (shape_known(v->type.shape) && shape_numel(v->type.shape) <= 1) keep[static_cast<size_t>(find(v->id))] = true;
  for (const auto& v : g.values()) {
    const size_t id = static_cast<size_t>(v->id);
    if (v->type.dtype == DType::f32 && !keep[static_cast<size_t>(find(v->id))]) st[id] = DType::bf16;
  }
  return st;
}

std::vector<DType> kernel_arg_storage(const Node& kn, const Kernel& k, const std::vector<DType>& vs, Precision p) {
  std::vector<DType> r;
  size_t in = 0, out = 0;
  for (const KArg& a : k.args) {
    const Value* v = nullptr;
    if (a.role == KArg::Role::in && in < kn.inputs.size()) v = kn.inputs[in++];
    else if (a.role == KArg::Role::out && out < kn.outputs.size()) v = kn.outputs[out++];
    if (v && static_cast<size_t>(v->id) < vs.size()) r.push_back(vs[static_cast<size_t>(v->id)]);
    else r.push_back(p == Precision::bf16 && a.type.dtype == DType::f32 ? DType::bf16 : a.type.dtype);
  }
  return r;
}

uint16_t f32_to_bf16(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet, sign kept
  const uint32_t r = u + 0x7fffu + ((u >> 16) & 1u);
  uint16_t h = static_cast<uint16_t>(r >> 16);
  if (std::isfinite(x) && (h & 0x7fffu) == 0x7f80u) h = static_cast<uint16_t>((h & 0x8000u) | 0x7f7fu);  // saturate
  return h;
}

float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float x = 0;
  std::memcpy(&x, &u, 4);
  return x;
}

void f32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

void bf16_to_f32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

}  // namespace tessel::cuda
