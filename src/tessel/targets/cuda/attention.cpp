// Fused attention for the CUDA target (see attention.h): the pattern, the softmax recognised by value,
// and the generated flash kernel.
#include "tessel/targets/cuda/attention.h"

#include <cmath>
#include <limits>
#include <map>

#include "tessel/ir/core_ops.h"
#include "tessel/support/error.h"
#include "tessel/targets/cuda/codegen.h"
#include "tessel/targets/cuda/epilogue.h"

namespace tessel::cuda {
namespace {

// Kernel `k` on one row: x and mask by inner position; the stored row, or nullopt when the body reads
// anything else, stores a row-level value, or uses an op outside eval_scalar_op's set.
std::optional<std::vector<double>> eval_row(const Kernel& k, int x_arg, int mask_arg, const std::vector<double>& x,
                                            const std::vector<double>& mask) {
  const size_t n = k.body.size(), T = x.size();
  std::vector<std::vector<double>> per(n);
  std::vector<double> scal(n, 0);
  std::vector<double> out(T, std::nan(""));
  auto is_scalar = [&](int j) { const KInstr& in = k.body[static_cast<size_t>(j)]; return in.row || in.is(CoreOp::reduce); };
  auto val = [&](int j, size_t t) { return is_scalar(j) ? scal[static_cast<size_t>(j)] : per[static_cast<size_t>(j)][t]; };
  for (int p = 0; p <= k.phases; ++p) {
    for (size_t i = 0; i < n; ++i) {
      const KInstr& in = k.body[i];
      if (!in.row || in.phase != p) continue;
      if (in.is(KInstrKind::constant)) { scal[i] = in.value; continue; }
      if (in.is(KInstrKind::load) || in.is(KInstrKind::store)) return std::nullopt;
      std::vector<double> a;
      for (int j : in.args) {
        if (!is_scalar(j)) return std::nullopt;
        a.push_back(scal[static_cast<size_t>(j)]);
      }
      const std::optional<double> r = eval_scalar_op(in, a);
      if (!r) return std::nullopt;
      scal[i] = *r;
    }
    if (p == k.phases) break;
    std::vector<size_t> reduces;
    for (size_t i = 0; i < n; ++i) {
      const KInstr& in = k.body[i];
      if (in.row || in.phase != p) continue;
      if (in.is(CoreOp::reduce)) {
        if (in.attr != "sum" && in.attr != "max") return std::nullopt;
        scal[i] = in.attr == "sum" ? 0.0 : -std::numeric_limits<double>::infinity();
        reduces.push_back(i);
      } else {
        per[i].assign(T, 0);
      }
    }
    for (size_t t = 0; t < T; ++t)
      for (size_t i = 0; i < n; ++i) {
        const KInstr& in = k.body[i];
        if (in.row || in.phase != p) continue;
        if (in.is(KInstrKind::load)) {
          const int arg = k.accesses[static_cast<size_t>(in.access)].arg;
          if (arg == x_arg) per[i][t] = x[t];
          else if (arg == mask_arg && mask_arg >= 0) per[i][t] = mask[t];
          else return std::nullopt;
        } else if (in.is(KInstrKind::constant)) {
          per[i][t] = in.value;
        } else if (in.is(KInstrKind::store)) {
          out[t] = val(in.args.at(0), t);
        } else if (in.is(CoreOp::reduce)) {
          const double a = val(in.args.at(0), t);
          scal[i] = in.attr == "sum" ? scal[i] + a : std::max(scal[i], a);
        } else {
          std::vector<double> a;
          for (int j : in.args) a.push_back(val(j, t));
          const std::optional<double> r = eval_scalar_op(in, a);
          if (!r) return std::nullopt;
          per[i][t] = *r;
        }
      }
  }
  for (double o : out)
    if (std::isnan(o)) return std::nullopt;  // every element stored
  return out;
}

std::vector<double> softmax_of(const std::vector<double>& x, const std::vector<double>& m, double alpha) {
  double mx = -std::numeric_limits<double>::infinity();
  for (size_t t = 0; t < x.size(); ++t) mx = std::max(mx, alpha * x[t] + m[t]);
  std::vector<double> p(x.size());
  double z = 0;
  for (size_t t = 0; t < x.size(); ++t) z += p[t] = std::exp(alpha * x[t] + m[t] - mx);
  for (double& v : p) v /= z;
  return p;
}

std::string mem_t(DType t) { return t == DType::bf16 ? "tsl_bf16" : "float"; }

}  // namespace

std::optional<double> softmax_scale(const Kernel& k, int x_arg, int mask_arg) {
  if (k.kind != KernelKind::loop || k.inner.size() != 1 || k.inner[0] < 2) return std::nullopt;
  const size_t T = static_cast<size_t>(k.inner[0]);
  std::vector<double> x(T, 0), m(T, 0);
  x[0] = 1;
  const auto p = eval_row(k, x_arg, mask_arg, x, m);
  if (!p || (*p)[0] <= 0 || (*p)[1] <= 0) return std::nullopt;
  const double alpha = std::log((*p)[0] / (*p)[1]);
  if (!std::isfinite(alpha) || alpha == 0) return std::nullopt;
  for (int trial = 0; trial < 3; ++trial) {
    for (size_t t = 0; t < T; ++t) {
      x[t] = std::sin(1.7 * static_cast<double>(t) + trial) * 2;
      m[t] = mask_arg >= 0 ? std::cos(0.9 * static_cast<double>(t) * (trial + 1)) * 3 : 0;
    }
    const auto got = eval_row(k, x_arg, mask_arg, x, m);
    if (!got) return std::nullopt;
    const std::vector<double> want = softmax_of(x, m, alpha);
    for (size_t t = 0; t < T; ++t)
      if (std::fabs((*got)[t] - want[t]) > 1e-6) return std::nullopt;
  }
  return alpha;
}

std::vector<AttentionMatch> find_attention(const KernelModule& m, const std::vector<DType>& st) {
  std::vector<AttentionMatch> r;
  if (!m.graph) return r;
  const Graph& g = *m.graph;
  const auto& nodes = g.nodes();
  std::map<const Node*, size_t> index;
  for (size_t i = 0; i < nodes.size(); ++i) index[nodes[i].get()] = i;
  const auto users = g.users();
  auto mem = [&](const Value* v) { return static_cast<size_t>(v->id) < st.size() ? st[static_cast<size_t>(v->id)] : v->type.dtype; };
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& qk = *nodes[i];
    const std::optional<MatmulSpec> s = device_matmul_spec(qk);
    if (!s) continue;
    const Value* S = qk.outputs[0];
    const auto& su = users[static_cast<size_t>(S->id)];
    if (su.size() != 1 || g.returns(S) || !is_kernel_node(*su[0])) continue;
    const Node& sm = *su[0];
    const Kernel& k = m.kernels.at(static_cast<size_t>(sm.attr_i("kernel")));
    if (k.kind != KernelKind::loop || sm.outputs.size() != 1 || sm.inputs.size() > 2) continue;
    int x_arg = -1, mask_arg = -1;
    for (size_t a = 0; a < sm.inputs.size(); ++a) (sm.inputs[a] == S ? x_arg : mask_arg) = static_cast<int>(a);
    if (x_arg < 0 || k.args.size() != sm.inputs.size() + 1) continue;
    const Value* P = sm.outputs[0];
    const auto& pu = users[static_cast<size_t>(P->id)];
    if (pu.size() != 1 || g.returns(P)) continue;
    const Node& pv = *pu[0];
    const std::optional<MatmulSpec> o = device_matmul_spec(pv);
    if (!o || pv.inputs[0] != P) continue;
    // rows of the softmax = the score rows, read densely
    if (k.inner.size() != 1 || k.inner[0] != s->n || k.outer_count() != s->batch * s->m) continue;
    if (o->batch != s->batch || o->m != s->m || o->k != s->n) continue;
    bool dense = true;
    int64_t stride = k.inner[0];
    for (const KAccess& acc : k.accesses) {
      if (acc.arg != x_arg) continue;
      int64_t want = stride;
      dense = dense && acc.offset == 0 && acc.strides.back() == 1;
      for (size_t d = k.outer.size(); d-- > 0;) {
        dense = dense && acc.strides[d] == want;
        want *= k.outer[d];
      }
    }
    if (!dense) continue;
    const std::optional<double> alpha = softmax_scale(k, x_arg, mask_arg);
    if (!alpha) continue;
    AttentionMatch a;
    a.qk = i, a.softmax = index[&sm], a.pv = index[&pv];
    a.s = *s, a.o = *o;
    a.alpha = *alpha;
    a.mask_arg = mask_arg;
    const DType tq = mem(qk.inputs[0]), tk = mem(qk.inputs[1]), tv = mem(pv.inputs[1]), to = mem(pv.outputs[0]);
    if (tq != DType::bf16 || tk != DType::bf16 || tv != DType::bf16)
      a.why = "attention not fused: Q, K and V are not bf16 in memory (the fused kernel's mma.sync takes bf16; --precision bf16)";
    else if (s->k % 16 != 0 || s->k > 128 || o->n % 8 != 0 || o->n > 128)
      a.why = fmt::format("attention not fused: head dims {} and {} (the fused kernel takes multiples of 16 and 8 up to 128)", s->k, o->n);
    else if ((to != DType::bf16 && to != DType::f32) || (mask_arg >= 0 && mem(sm.inputs[static_cast<size_t>(mask_arg)]) != DType::bf16 &&
                                                         mem(sm.inputs[static_cast<size_t>(mask_arg)]) != DType::f32))
      a.why = "attention not fused: an output or mask type other than bf16 or f32";
    else {
      a.fused = true;
      a.why = fmt::format("attention fused: {} x [{} queries x {} keys], head dims {}/{}, scale {:.6g}{} -> {} (flash, online softmax, mma.sync bf16)",
                          s->batch, s->m, s->n, s->k, o->n, *alpha, mask_arg >= 0 ? ", mask" : "", attention_symbol(a.pv));
    }
    r.push_back(a);
  }
  return r;
}

std::string attention_symbol(size_t pv_node) { return fmt::format("tsl_attn_{}", pv_node); }

AttentionLaunch attention_launch(const AttentionMatch& a) {
  return AttentionLaunch{static_cast<int>((a.s.m + 63) / 64), static_cast<int>(a.s.batch), 128};
}

std::string generate_attention(const KernelModule& m, const AttentionMatch& a, const std::vector<DType>& st) {
  const Graph& g = *m.graph;
  const Node& qk = *g.nodes()[a.qk];
  const Node& sm = *g.nodes()[a.softmax];
  const Node& pv = *g.nodes()[a.pv];
  const Kernel& k = m.kernels.at(static_cast<size_t>(sm.attr_i("kernel")));
  auto mem = [&](const Value* v) { return static_cast<size_t>(v->id) < st.size() ? st[static_cast<size_t>(v->id)] : v->type.dtype; };
  const MatmulSpec& s = a.s;
  const MatmulSpec& o = a.o;
  const int64_t D = s.k, DV = o.n, TQ = s.m, TK = s.n;
  const int64_t KT = D <= 64 && DV <= 64 ? 64 : 32;
  const DType to = mem(pv.outputs[0]);
  const bool masked = a.mask_arg >= 0;
  const DType tm = masked ? mem(sm.inputs[static_cast<size_t>(a.mask_arg)]) : DType::f32;
  std::string c;
  c += fmt::format("// {}\n// nodes {} (QK), {} (softmax, kernel {}), {} (PV); S and P never reach memory\n", a.why, a.qk, a.softmax,
                   sm.attr_i("kernel"), a.pv);
  c += fmt::format("extern \"C\" __global__ void __launch_bounds__(128) {}(const tsl_bf16* __restrict__ q, const tsl_bf16* __restrict__ kk, "
                   "const tsl_bf16* __restrict__ v, {}{}* __restrict__ o) {{\n",
                   attention_symbol(a.pv), masked ? fmt::format("const {}* __restrict__ mask, ", mem_t(tm)) : "", mem_t(to));
  c += fmt::format("  constexpr int TQ = {}, TK = {}, D = {}, DV = {}, KT = {};\n", TQ, TK, D, DV, KT);
  // Row pads: 8 elements keep rows 16-byte aligned for the 16-byte tile stores; a tile filled by
  // transposing scalar stores (8 rows apart per thread) takes 2, so those rows do not share a bank.
  const bool k_rows = s.b_n == 1 && s.b_k % 8 == 0 && s.b_offset % 8 == 0 && s.b_batch % 8 == 0;
  const bool v_rows = o.b_n == 1 && o.b_k % 8 == 0 && o.b_offset % 8 == 0 && o.b_batch % 8 == 0 && DV % 8 == 0;
  c += "  __shared__ __align__(16) unsigned short sQ[64][D + 8];\n";
  c += fmt::format("  __shared__ __align__(16) unsigned short sK[KT][D + {}];\n", k_rows ? 2 : 8);
  c += fmt::format("  __shared__ __align__(16) unsigned short sVt[DV][KT + {}];\n", v_rows ? 2 : 8);
  c += "  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n";
  c += "  const long long bh = blockIdx.y;\n  const int q0 = blockIdx.x * 64;\n";
  // Tiles come in as 16-byte loads along whichever dim is contiguous in memory (8 elements; offsets and
  // strides multiples of 8 keep them aligned: buffers start 256-byte aligned), else element by element.
  auto al8 = [](std::initializer_list<int64_t> xs) {
    for (int64_t x : xs)
      if (x % 8 != 0) return false;
    return true;
  };
  if (s.a_k == 1 && al8({s.a_offset, s.a_batch, s.a_m, D})) {
    c += "  for (int i = threadIdx.x; i < 64 * (D / 8); i += blockDim.x) {\n    const int r = i / (D / 8), d8 = (i % (D / 8)) * 8, qi = q0 + r;\n";
    c += fmt::format("    *(uint4*)&sQ[r][d8] = qi < TQ ? *(const uint4*)(q + {}LL + bh * {}LL + (long long)qi * {}LL + d8) : make_uint4(0u, 0u, 0u, 0u);\n  }}\n",
                     s.a_offset, s.a_batch, s.a_m);
  } else {
    c += "  for (int i = threadIdx.x; i < 64 * D; i += blockDim.x) {\n    const int r = i / D, d = i % D, qi = q0 + r;\n";
    c += fmt::format("    sQ[r][d] = qi < TQ ? q[{}LL + bh * {}LL + (long long)qi * {}LL + (long long)d * {}LL].bits : (unsigned short)0;\n  }}\n",
                     s.a_offset, s.a_batch, s.a_m, s.a_k);
  }
  c += "  __syncthreads();\n";
  c += "  const int g = lane >> 2, c0 = (lane & 3) * 2, r0 = warp * 16 + g;\n";
  c += "  uint32_t qa[D / 16][4];\n";
  c += "  for (int t = 0; t < D / 16; ++t) {\n";
  c += "    qa[t][0] = *(const uint32_t*)&sQ[r0][t * 16 + c0];\n    qa[t][1] = *(const uint32_t*)&sQ[r0 + 8][t * 16 + c0];\n";
  c += "    qa[t][2] = *(const uint32_t*)&sQ[r0][t * 16 + c0 + 8];\n    qa[t][3] = *(const uint32_t*)&sQ[r0 + 8][t * 16 + c0 + 8];\n  }\n";
  c += "  float acc[DV / 8][4];\n  for (int t = 0; t < DV / 8; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;\n";
  c += "  float mrow[2] = {-tsl_inff(), -tsl_inff()}, lrow[2] = {0.0f, 0.0f};\n";
  c += "  const int qrow[2] = {q0 + r0, q0 + r0 + 8};\n";
  c += "  for (int j0 = 0; j0 < TK; j0 += KT) {\n    __syncthreads();  // the previous tile's readers are done\n";
  // K (element (d, key)) into sK[key][d]
  if (s.b_n == 1 && al8({s.b_offset, s.b_batch, s.b_k})) {  // keys contiguous (a materialized K^T)
    c += "    for (int i = threadIdx.x; i < D * (KT / 8); i += blockDim.x) {\n      const int d = i / (KT / 8), k8 = (i % (KT / 8)) * 8, kj = j0 + k8;\n";
    c += fmt::format("      const tsl_bf16* src = kk + {}LL + bh * {}LL + (long long)d * {}LL + kj;\n", s.b_offset, s.b_batch, s.b_k);
    c += "      if (kj + 8 <= TK) {\n        const uint4 w = *(const uint4*)src;\n        const unsigned short* h = (const unsigned short*)&w;\n";
    c += "        for (int e = 0; e < 8; ++e) sK[k8 + e][d] = h[e];\n";
    c += "      } else {\n        for (int e = 0; e < 8; ++e) sK[k8 + e][d] = kj + e < TK ? src[e].bits : (unsigned short)0;\n      }\n    }\n";
  } else if (s.b_k == 1 && al8({s.b_offset, s.b_batch, s.b_n, D})) {  // head dim contiguous (K as [T, D])
    c += "    for (int i = threadIdx.x; i < KT * (D / 8); i += blockDim.x) {\n      const int key = i / (D / 8), d8 = (i % (D / 8)) * 8, kj = j0 + key;\n";
    c += fmt::format("      *(uint4*)&sK[key][d8] = kj < TK ? *(const uint4*)(kk + {}LL + bh * {}LL + (long long)kj * {}LL + d8) : make_uint4(0u, 0u, 0u, 0u);\n    }}\n",
                     s.b_offset, s.b_batch, s.b_n);
  } else {
    c += "    for (int i = threadIdx.x; i < KT * D; i += blockDim.x) {\n      const int key = i / D, d = i % D, kj = j0 + key;\n";
    c += fmt::format("      sK[key][d] = kj < TK ? kk[{}LL + bh * {}LL + (long long)d * {}LL + (long long)kj * {}LL].bits : (unsigned short)0;\n    }}\n",
                     s.b_offset, s.b_batch, s.b_k, s.b_n);
  }
  // V (element (key, dv)) into sVt[dv][key]
  if (o.b_n == 1 && al8({o.b_offset, o.b_batch, o.b_k, DV})) {  // value dim contiguous (V as [T, DV])
    c += "    for (int i = threadIdx.x; i < KT * (DV / 8); i += blockDim.x) {\n      const int key = i / (DV / 8), d8 = (i % (DV / 8)) * 8, kj = j0 + key;\n";
    c += fmt::format("      const uint4 w = kj < TK ? *(const uint4*)(v + {}LL + bh * {}LL + (long long)kj * {}LL + d8) : make_uint4(0u, 0u, 0u, 0u);\n",
                     o.b_offset, o.b_batch, o.b_k);
    c += "      const unsigned short* h = (const unsigned short*)&w;\n      for (int e = 0; e < 8; ++e) sVt[d8 + e][key] = h[e];\n    }\n";
  } else if (o.b_k == 1 && al8({o.b_offset, o.b_batch, o.b_n})) {  // keys contiguous
    c += "    for (int i = threadIdx.x; i < DV * (KT / 8); i += blockDim.x) {\n      const int d = i / (KT / 8), k8 = (i % (KT / 8)) * 8, kj = j0 + k8;\n";
    c += fmt::format("      const tsl_bf16* src = v + {}LL + bh * {}LL + (long long)d * {}LL + kj;\n", o.b_offset, o.b_batch, o.b_n);
    c += "      if (kj + 8 <= TK) {\n        *(uint4*)&sVt[d][k8] = *(const uint4*)src;\n";
    c += "      } else {\n        for (int e = 0; e < 8; ++e) sVt[d][k8 + e] = kj + e < TK ? src[e].bits : (unsigned short)0;\n      }\n    }\n";
  } else {
    c += "    for (int i = threadIdx.x; i < KT * DV; i += blockDim.x) {\n      const int key = i / DV, d = i % DV, kj = j0 + key;\n";
    c += fmt::format("      sVt[d][key] = kj < TK ? v[{}LL + bh * {}LL + (long long)kj * {}LL + (long long)d * {}LL].bits : (unsigned short)0;\n    }}\n",
                     o.b_offset, o.b_batch, o.b_k, o.b_n);
  }
  c += "    __syncthreads();\n";
  c += "    float sc[KT / 8][4];\n";
  c += "    for (int nt = 0; nt < KT / 8; ++nt) {\n      sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;\n";
  c += "      for (int t = 0; t < D / 16; ++t)\n        tsl_mma_bf16(sc[nt], qa[t], *(const uint32_t*)&sK[nt * 8 + g][t * 16 + c0], *(const uint32_t*)&sK[nt * 8 + g][t * 16 + c0 + 8]);\n    }\n";
  c += "    float tmax[2] = {-tsl_inff(), -tsl_inff()};\n";
  c += "    for (int nt = 0; nt < KT / 8; ++nt)\n      for (int e = 0; e < 4; ++e) {\n";
  c += "        const int h = e >> 1, kj = j0 + nt * 8 + c0 + (e & 1);\n";
  c += fmt::format("        float x = sc[nt][e] * {}f;\n", fmt::format("{:.9g}", a.alpha));
  if (masked) {
    // the mask's index from the softmax kernel's access: outer point o = bh * TQ + row over k.outer
    const KAccess* ma = nullptr;
    for (const KAccess& acc : k.accesses)
      if (acc.arg == a.mask_arg) ma = &acc;
    std::string idx = ma->offset ? fmt::format("{}LL", ma->offset) : "0LL";
    c += "        if (kj < TK && qrow[h] < TQ) {\n          long long q_ = bh * TQ + qrow[h];\n";
    for (size_t d = k.outer.size(); d-- > 0;) {
      c += fmt::format("          const long long od{} = q_ % {}LL; q_ /= {}LL;\n", d, k.outer[d], k.outer[d]);
      if (ma->strides[d]) idx += fmt::format(" + od{} * {}LL", d, ma->strides[d]);
    }
    if (ma->strides.back()) idx += fmt::format(" + (long long)kj * {}LL", ma->strides.back());
    c += fmt::format("          x += {};\n        }}\n", tm == DType::bf16 ? "tsl_bf2f(mask[" + idx + "])" : "mask[" + idx + "]");
  }
  c += "        if (kj >= TK) x = -tsl_inff();\n        sc[nt][e] = x;\n        tmax[h] = fmaxf(tmax[h], x);\n      }\n";
  c += "    float base[2], keep[2], lsum[2] = {0.0f, 0.0f};\n";
  c += "    for (int h = 0; h < 2; ++h) {\n";
  c += "      tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], 1));\n";
  c += "      tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], 2));\n";
  c += "      const float mnew = fmaxf(mrow[h], tmax[h]);\n      base[h] = mnew == -tsl_inff() ? 0.0f : mnew;\n";
  c += "      keep[h] = expf(mrow[h] - base[h]);\n      mrow[h] = mnew;\n    }\n";
  c += "    for (int nt = 0; nt < KT / 8; ++nt)\n      for (int e = 0; e < 4; ++e) {\n";
  c += "        const float p = expf(sc[nt][e] - base[e >> 1]);\n        sc[nt][e] = p;\n        lsum[e >> 1] += p;\n      }\n";
  c += "    for (int h = 0; h < 2; ++h) lrow[h] = lrow[h] * keep[h] + lsum[h];\n";
  c += "    for (int t = 0; t < DV / 8; ++t) {\n      acc[t][0] *= keep[0]; acc[t][1] *= keep[0]; acc[t][2] *= keep[1]; acc[t][3] *= keep[1];\n    }\n";
  c += "    for (int kc = 0; kc < KT / 16; ++kc) {\n";
  c += "      const uint32_t pa[4] = {tsl_pack_bf16(sc[2 * kc][0], sc[2 * kc][1]), tsl_pack_bf16(sc[2 * kc][2], sc[2 * kc][3]),\n";
  c += "                              tsl_pack_bf16(sc[2 * kc + 1][0], sc[2 * kc + 1][1]), tsl_pack_bf16(sc[2 * kc + 1][2], sc[2 * kc + 1][3])};\n";
  c += "      for (int t = 0; t < DV / 8; ++t)\n        tsl_mma_bf16(acc[t], pa, *(const uint32_t*)&sVt[t * 8 + g][kc * 16 + c0], *(const uint32_t*)&sVt[t * 8 + g][kc * 16 + c0 + 8]);\n    }\n";
  c += "  }\n";
  c += "  float inv[2];\n  for (int h = 0; h < 2; ++h) {\n    float l = lrow[h];\n";
  c += "    l += __shfl_xor_sync(0xffffffffu, l, 1);\n    l += __shfl_xor_sync(0xffffffffu, l, 2);\n    inv[h] = 1.0f / l;\n  }\n";
  c += "  for (int t = 0; t < DV / 8; ++t)\n    for (int e = 0; e < 4; ++e) {\n      const int row = qrow[e >> 1], col = t * 8 + c0 + (e & 1);\n";
  c += fmt::format("      if (row < TQ) o[bh * {}LL + (long long)row * {}LL + col] = {};\n    }}\n}}\n", TQ * DV, DV,
                   to == DType::bf16 ? "tsl_f2bf(acc[t][e] * inv[e >> 1])" : "acc[t][e] * inv[e >> 1]");
  (void)qk;
  return c;
}

}  // namespace tessel::cuda
