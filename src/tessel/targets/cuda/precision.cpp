// The CUDA target's storage types under a precision choice (see precision.h).
#include "tessel/targets/cuda/precision.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "tessel/ir/core_ops.h"
#include "tessel/targets/cuda/codegen.h"
#include "tessel/support/error.h"

namespace tessel::cuda {

Precision parse_precision(const std::string& s) {
  if (s == "f32") return Precision::f32;
  if (s == "bf16") return Precision::bf16;
  throw Error(Location{.pass = "cuda"}, fmt::format("--precision must be f32 or bf16, not '{}'", s));
}

const char* precision_name(Precision p) { return p == Precision::bf16 ? "bf16" : "f32"; }

double precision_tolerance(Precision p) { return p == Precision::bf16 ? 2e-2 : 1e-4; }

namespace {

// How a node reads each of its inputs, for value_storage: as a matmul's or a convolution's operand.
struct Reads {
  std::vector<bool> operand;  // per input: only an A or B of a matmul, an x or w of a convolution
  std::vector<bool> conv_x;   // per input: a convolution's activation
};

Reads reads_of(const Node& n, const std::vector<Kernel>& kernels) {
  Reads r{std::vector<bool>(n.inputs.size(), false), std::vector<bool>(n.inputs.size(), false)};
  if (is_kernel_node(n)) {
    const size_t ki = static_cast<size_t>(n.attr_i("kernel"));
    if (ki >= kernels.size()) return r;
    const Kernel& k = kernels[ki];
    size_t in = 0;
    for (size_t ai = 0; ai < k.args.size() && in < n.inputs.size(); ++ai) {
      if (k.args[ai].role != KArg::Role::in) continue;
      const int a = static_cast<int>(ai);
      // an operand the epilogue reads too (y . W + y) is read as more than an operand
      const bool epilogue_reads = std::any_of(k.accesses.begin(), k.accesses.end(), [&](const KAccess& acc) { return acc.arg == a; });
      if (k.kind == KernelKind::matmul) r.operand[in] = (a == k.mm.a || a == k.mm.b) && !epilogue_reads;
      if (k.kind == KernelKind::conv) r.operand[in] = (a == k.conv.x || a == k.conv.w) && !epilogue_reads, r.conv_x[in] = a == k.conv.x;
      ++in;
    }
  } else if (device_matmul_spec(n)) {
    for (size_t i = 0; i < std::min<size_t>(2, n.inputs.size()); ++i) r.operand[i] = true;
  }
  return r;
}

enum class Producer { other, library, reduction };  // what computes a node's results, for value_storage

Producer producer_of(const Node& n, const std::vector<Kernel>& kernels) {
  if (device_matmul_spec(n)) return Producer::library;
  if (!is_kernel_node(n)) return Producer::other;
  const size_t ki = static_cast<size_t>(n.attr_i("kernel"));
  if (ki >= kernels.size()) return Producer::other;
  const Kernel& k = kernels[ki];
  if (k.kind != KernelKind::loop) return Producer::library;
  const bool reduces = std::any_of(k.body.begin(), k.body.end(), [](const KInstr& in) { return in.is(CoreOp::reduce); });
  return reduces ? Producer::reduction : Producer::other;
}

}  // namespace

std::vector<DType> value_storage(const Graph& g, const std::vector<Kernel>& kernels, Precision p) {
  size_t nv = 0;
  for (const auto& v : g.values()) nv = std::max(nv, static_cast<size_t>(v->id) + 1);
  std::vector<DType> st(nv, DType::f32);
  for (const auto& v : g.values()) st[static_cast<size_t>(v->id)] = v->type.dtype;
  if (p == Precision::f32) return st;
  // Memory classes: a reshape's result shares its operand's bytes (the runtime aliases them).
  std::vector<int> root(nv);
  std::iota(root.begin(), root.end(), 0);
  auto find = [&](const Value* v) {
    int x = v->id;
    while (root[static_cast<size_t>(x)] != x) x = root[static_cast<size_t>(x)];
    return static_cast<size_t>(x);
  };
  for (const auto& n : g.nodes())
    if (is_core_op(*n, CoreOp::reshape) && !n->inputs.empty() && n->inputs[0] && !n->outputs.empty() && n->outputs[0])
      root[find(n->outputs[0])] = static_cast<int>(find(n->inputs[0]));
  // Per class: kept f32 whatever reads it (a graph output, a single element); every reader a matmul's or
  // convolution's operand; some reader a convolution's activation (its generated im2col and direct
  // kernels take it in the weight's type); read by a library kernel at all (constants).
  std::vector<bool> keep(nv, false), read(nv, false), all_operand(nv, true), conv_x(nv, false), by_library(nv, false);
  for (const Value* v : g.outputs)
    if (v) keep[find(v)] = true;
  for (const auto& v : g.values())
    if (shape_known(v->type.shape) && shape_numel(v->type.shape) <= 1) keep[find(v.get())] = true;
  const auto& nodes = g.nodes();
  std::vector<Reads> reads(nodes.size());
  std::vector<Producer> producer(nodes.size(), Producer::other);
  for (size_t ni = 0; ni < nodes.size(); ++ni) {
    const Node& n = *nodes[ni];
    if (is_core_op(n, CoreOp::reshape)) continue;  // an alias, not a reader
    reads[ni] = reads_of(n, kernels);
    producer[ni] = producer_of(n, kernels);
    const Reads& r = reads[ni];
    const bool library = producer[ni] == Producer::library;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const Value* v = n.inputs[i];
      if (!v) continue;
      const size_t c = find(v);
      read[c] = true;
      all_operand[c] = all_operand[c] && r.operand[i];
      conv_x[c] = conv_x[c] || r.conv_x[i];
      by_library[c] = by_library[c] || library;
    }
  }
  // A class every reader takes only as an operand, or some convolution as its activation: bf16 unless kept.
  auto demoted = [&](size_t c) { return !keep[c] && read[c] && (all_operand[c] || conv_x[c]); };
  std::vector<bool> wide(nv, false);  // per class: stored f32
  // Constants: bf16 when a matmul or convolution reads them (weights, uploaded once as the library takes
  // them; their epilogues' constants are revised below), else f32 (normalization scales, embedding and
  // position tables, as autocast). Graph inputs: f32 unless demoted.
  for (const auto& v : g.values())
    if (v->type.dtype == DType::f32 && (v->constant || v->producer == nullptr)) {
      const size_t c = find(v.get());
      wide[c] = keep[c] || (v->constant ? !by_library[c] : !demoted(c));
    }
  for (size_t ni = 0; ni < nodes.size(); ++ni) {
    const Node* n = nodes[ni].get();
    if (is_core_op(*n, CoreOp::reshape)) continue;
    const Producer pr = producer[ni];
    const Reads& r = reads[ni];
    // An f32 value the node reads other than as an operand: a residual stream, an f32 activation; for a
    // kernel only its computed values count (a bias or a scale folded in does not widen a matmul's
    // result), for a node its constants too (a gather from an f32 table stays f32, as autocast's embedding)
    bool f32_in = false;
    for (size_t i = 0; i < n->inputs.size(); ++i) {
      const Value* v = n->inputs[i];
      if (!v || r.operand[i] || v->type.dtype != DType::f32 || (v->constant && is_kernel_node(*n))) continue;
      f32_in = f32_in || wide[find(v)];
    }
    bool wide_out = false;
    for (const Value* o : n->outputs) {
      if (!o || o->type.dtype != DType::f32) continue;
      const size_t c = find(o);
      wide[c] = keep[c] || (!demoted(c) && (pr == Producer::reduction || f32_in));
      wide_out = wide_out || wide[c];
    }
    // A library kernel's epilogue constants (a bias) take its result's type: cuBLASLt folds a bias only in
    // D's type (the last kernel reading a shared one decides; a mismatch leaves the epilogue generated).
    if (pr == Producer::library && is_kernel_node(*n))
      for (size_t i = 0; i < n->inputs.size(); ++i) {
        const Value* v = n->inputs[i];
        if (v && v->constant && !r.operand[i] && v->type.dtype == DType::f32 && !keep[find(v)]) wide[find(v)] = wide_out;
      }
  }
  for (const auto& v : g.values())
    if (v->type.dtype == DType::f32 && !wide[find(v.get())]) st[static_cast<size_t>(v->id)] = DType::bf16;
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
