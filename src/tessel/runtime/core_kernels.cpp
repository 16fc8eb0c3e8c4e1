// Typed kernels for the core ops, chosen per node when the graph backend compiles (core_kernels.h).
// Each maker parses the node's attributes and shapes once and returns a closure over raw memory; the
// semantics are those of the reference kernels in src/tessel/ops/core.cpp (floats computed in double
// and rounded once to the storage type, integers wrapping), except dot_general and convolution on
// f32, f16 and bf16, which accumulate in f32.
#include "tessel/runtime/core_kernels.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "tessel/ir/core_ops.h"
#include "tessel/ir/op_registry.h"
#include "tessel/kernel/kernel.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/support/error.h"
#include "tessel/targets/cpu/dnnl_ops.h"

namespace tessel {
namespace {

// ---- element types -------------------------------------------------------------------------------
// Storage types with a compute type C (double for floats, int64 for integers and bool), a load into
// C and a store from C that rounds (floats) or wraps (integers) like Tensor::set_f / set_i.

struct F16 { uint16_t bits; };
struct BF16 { uint16_t bits; };
struct Bool { uint8_t b; };

const float* f16_to_float_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t i = 0; i < 65536; ++i) t[i] = static_cast<float>(decode_float_bits(DType::f16, i));
    return t;
  }();
  return table.data();
}

template <class T> struct Elem;
template <> struct Elem<double> {
  using C = double;
  static constexpr bool fl = true;
  static double load(double x) { return x; }
  static double store(double c) { return c; }
};
template <> struct Elem<float> {
  using C = double;
  static constexpr bool fl = true;
  static double load(float x) { return x; }
  static float store(double c) { return static_cast<float>(c); }
};
template <> struct Elem<F16> {
  using C = double;
  static constexpr bool fl = true;
  static double load(F16 x) { return f16_to_float_table()[x.bits]; }
  static F16 store(double c) { return F16{static_cast<uint16_t>(encode_float_bits(DType::f16, c))}; }
};
template <> struct Elem<BF16> {
  using C = double;
  static constexpr bool fl = true;
  static double load(BF16 x) { return std::bit_cast<float>(static_cast<uint32_t>(x.bits) << 16); }
  static BF16 store(double c) { return BF16{static_cast<uint16_t>(encode_float_bits(DType::bf16, c))}; }
};
template <class I> struct IntElem {
  using C = int64_t;
  static constexpr bool fl = false;
  static int64_t load(I x) { return static_cast<int64_t>(x); }
  static I store(int64_t c) { return static_cast<I>(c); }  // wraps (C++20 conversion)
};
template <> struct Elem<int64_t> : IntElem<int64_t> {};
template <> struct Elem<int32_t> : IntElem<int32_t> {};
template <> struct Elem<int8_t> : IntElem<int8_t> {};
template <> struct Elem<uint8_t> : IntElem<uint8_t> {};
template <> struct Elem<Bool> {
  using C = int64_t;
  static constexpr bool fl = false;
  static int64_t load(Bool x) { return x.b != 0; }
  static Bool store(int64_t c) { return Bool{static_cast<uint8_t>(c != 0)}; }
};

// Calls f(T* tag) with the storage type of `t`; false when `t` has no typed kernels.
template <class F> bool with_type(DType t, F&& f) {
  switch (t) {
    case DType::f64: f(static_cast<double*>(nullptr)); return true;
    case DType::f32: f(static_cast<float*>(nullptr)); return true;
    case DType::f16: f(static_cast<F16*>(nullptr)); return true;
    case DType::bf16: f(static_cast<BF16*>(nullptr)); return true;
    case DType::i64: f(static_cast<int64_t*>(nullptr)); return true;
    case DType::i32: f(static_cast<int32_t*>(nullptr)); return true;
    case DType::i8: f(static_cast<int8_t*>(nullptr)); return true;
    case DType::u8: f(static_cast<uint8_t*>(nullptr)); return true;
    case DType::boolean: f(static_cast<Bool*>(nullptr)); return true;
    default: return false;
  }
}

// Calls f(U* tag) with an unsigned integer type of `bytes` bytes (data movement ignores the dtype).
template <class F> bool with_size(int bytes, F&& f) {
  switch (bytes) {
    case 1: f(static_cast<uint8_t*>(nullptr)); return true;
    case 2: f(static_cast<uint16_t*>(nullptr)); return true;
    case 4: f(static_cast<uint32_t*>(nullptr)); return true;
    case 8: f(static_cast<uint64_t*>(nullptr)); return true;
    default: return false;
  }
}

template <class T> using Tag = std::remove_pointer_t<T>;

Shape static_shape(const Value* v) { return v->type.shape; }
int64_t numel_of(const Value* v) { return shape_numel(v->type.shape); }
std::vector<int64_t> row_strides(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int d = static_cast<int>(s.size()) - 2; d >= 0; --d) st[d] = st[d + 1] * s[d + 1];
  return st;
}

template <class T> const T* in_ptr(KernelEnv& e, int id) { return reinterpret_cast<const T*>(e.ptr[id]); }
template <class T> T* out_ptr(KernelEnv& e, int id) { return reinterpret_cast<T*>(e.ptr[id]); }

// ---- strided copies --------------------------------------------------------------------------------
// dst[dst_off + sum i_d*dst[d]] = src[src_off + sum i_d*src[d]] over the index space `shape`.

struct CopyPlan {
  std::vector<int64_t> shape, src, dst;
  int64_t src_off = 0, dst_off = 0;
  bool empty() const {
    for (int64_t n : shape)
      if (n == 0) return true;
    return false;
  }
};

// Drops unit dims and merges neighbours that are contiguous in both source and destination.
CopyPlan simplify(const CopyPlan& p) {
  CopyPlan q;
  q.src_off = p.src_off;
  q.dst_off = p.dst_off;
  for (size_t d = 0; d < p.shape.size(); ++d) {
    if (p.shape[d] == 1) continue;
    if (!q.shape.empty() && q.src.back() == p.src[d] * p.shape[d] && q.dst.back() == p.dst[d] * p.shape[d]) {
      q.shape.back() *= p.shape[d];
      q.src.back() = p.src[d];
      q.dst.back() = p.dst[d];
      continue;
    }
    q.shape.push_back(p.shape[d]);
    q.src.push_back(p.src[d]);
    q.dst.push_back(p.dst[d]);
  }
  return q;
}

// Copies with a conversion D(load(S)) (identity when S and D are the same type).
template <class S, class D> inline D convert_elem(S x) {
  if constexpr (std::is_same_v<S, D>) return x;
  else return static_cast<D>(Elem<S>::load(x));
}

// d[j * dm + i] = s[j + i * sn] for j < m, i < n: a 2-d transpose (attention's Kᵀ of a decode step,
// [heads, P, 32] -> [heads, 32, P]). run_copy's element-by-element walk took about 0.55 ns an element for
// it (21 us for one layer's Kᵀ at P = 300: 45 of a 2-layer decoder's 190 us a token); 4-byte elements go
// through 8 x 8 blocks transposed in AVX2 registers where the CPU has AVX2 (bit moves only: NaN payloads
// and -0 kept), the edges and other sizes element by element.
template <class U> void transpose_scalar(const U* __restrict s, U* __restrict d, int64_t j0, int64_t j1, int64_t i0,
                                         int64_t i1, int64_t sn, int64_t dm) {
  for (int64_t j = j0; j < j1; ++j)
    for (int64_t i = i0; i < i1; ++i) d[j * dm + i] = s[j + i * sn];
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void transpose_8x8_blocks(const uint32_t* s, uint32_t* d, int64_t m, int64_t n, int64_t sn,
                                                          int64_t dm) {
  const float* sf = reinterpret_cast<const float*>(s);
  float* df = reinterpret_cast<float*>(d);
  for (int64_t i0 = 0; i0 + 8 <= n; i0 += 8)
    for (int64_t j0 = 0; j0 + 8 <= m; j0 += 8) {
      // r_k: source row i0 + k, elements j0 .. j0 + 7
      const float* b = sf + i0 * sn + j0;
      const __m256 r0 = _mm256_loadu_ps(b), r1 = _mm256_loadu_ps(b + sn), r2 = _mm256_loadu_ps(b + 2 * sn),
                   r3 = _mm256_loadu_ps(b + 3 * sn), r4 = _mm256_loadu_ps(b + 4 * sn), r5 = _mm256_loadu_ps(b + 5 * sn),
                   r6 = _mm256_loadu_ps(b + 6 * sn), r7 = _mm256_loadu_ps(b + 7 * sn);
      const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
                   t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                   t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
      const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
                   u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
                   u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
                   u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      // destination row j0 + k, elements i0 .. i0 + 7
      float* o = df + j0 * dm + i0;
      _mm256_storeu_ps(o, _mm256_permute2f128_ps(u0, u4, 0x20));
      _mm256_storeu_ps(o + dm, _mm256_permute2f128_ps(u1, u5, 0x20));
      _mm256_storeu_ps(o + 2 * dm, _mm256_permute2f128_ps(u2, u6, 0x20));
      _mm256_storeu_ps(o + 3 * dm, _mm256_permute2f128_ps(u3, u7, 0x20));
      _mm256_storeu_ps(o + 4 * dm, _mm256_permute2f128_ps(u0, u4, 0x31));
      _mm256_storeu_ps(o + 5 * dm, _mm256_permute2f128_ps(u1, u5, 0x31));
      _mm256_storeu_ps(o + 6 * dm, _mm256_permute2f128_ps(u2, u6, 0x31));
      _mm256_storeu_ps(o + 7 * dm, _mm256_permute2f128_ps(u3, u7, 0x31));
    }
}
#endif

template <class U> void transpose_2d(const U* __restrict s, U* __restrict d, int64_t m, int64_t n, int64_t sn, int64_t dm) {
#if defined(__x86_64__)
  if constexpr (sizeof(U) == 4) {
    static const bool avx2 = __builtin_cpu_supports("avx2");
    if (avx2) {
      transpose_8x8_blocks(reinterpret_cast<const uint32_t*>(s), reinterpret_cast<uint32_t*>(d), m, n, sn, dm);
      const int64_t m8 = m / 8 * 8, n8 = n / 8 * 8;
      transpose_scalar(s, d, m8, m, 0, n, sn, dm);   // the last rows of the destination
      transpose_scalar(s, d, 0, m8, n8, n, sn, dm);  // the last columns of the others
      return;
    }
  }
#endif
  transpose_scalar(s, d, 0, m, 0, n, sn, dm);
}

// Calls f(source offset, destination offset) at every index of the plan's first `outer` dims.
template <class F> void walk_outer(const CopyPlan& p, int outer, F&& f) {
  std::vector<int64_t> idx(static_cast<size_t>(outer), 0);
  int64_t so = p.src_off, dof = p.dst_off;
  while (true) {
    f(so, dof);
    int dd = outer - 1;
    for (; dd >= 0; --dd) {
      so += p.src[dd];
      dof += p.dst[dd];
      if (++idx[static_cast<size_t>(dd)] < p.shape[dd]) break;
      so -= p.src[dd] * p.shape[dd];
      dof -= p.dst[dd] * p.shape[dd];
      idx[static_cast<size_t>(dd)] = 0;
    }
    if (dd < 0) return;
  }
}

template <class S, class D> void run_copy(const CopyPlan& p, const S* s, D* d) {
  if (p.empty()) return;
  const int r = static_cast<int>(p.shape.size());
  if (r == 0) {
    d[p.dst_off] = convert_elem<S, D>(s[p.src_off]);
    return;
  }
  if constexpr (std::is_same_v<S, D> && std::is_unsigned_v<S>) {
    // The last two dims transposed: contiguous destination rows read down source columns (the plans
    // are in destination order, so the destination's last stride is 1).
    if (r >= 2 && p.dst[r - 1] == 1 && p.src[r - 2] == 1 && p.src[r - 1] > 1 && p.shape[r - 1] * p.shape[r - 2] >= 256) {
      const int64_t m = p.shape[r - 2], n = p.shape[r - 1], sn = p.src[r - 1], dm = p.dst[r - 2];
      walk_outer(p, r - 2, [&](int64_t so, int64_t dof) { transpose_2d(s + so, d + dof, m, n, sn, dm); });
      return;
    }
  }
  const int64_t n = p.shape[r - 1], ss = p.src[r - 1], ds = p.dst[r - 1];
  walk_outer(p, r - 1, [&](int64_t so, int64_t dof) {
    const S* sp = s + so;
    D* dp = d + dof;
    if constexpr (std::is_same_v<S, D>) {
      if (ss == 1 && ds == 1) std::memcpy(dp, sp, static_cast<size_t>(n) * sizeof(S));
      else
        for (int64_t i = 0; i < n; ++i) dp[i * ds] = sp[i * ss];
    } else {
      for (int64_t i = 0; i < n; ++i) dp[i * ds] = convert_elem<S, D>(sp[i * ss]);
    }
  });
}

// ---- strided pointwise walks ------------------------------------------------------------------------
// N arrays walked together over one index space (array 0 is the result, contiguous): the dims are
// merged where every array is contiguous across them, and `inner` gets the offsets of each run of
// the last dim.

template <int N> struct Walk {
  std::vector<int64_t> shape;
  std::array<std::vector<int64_t>, N> st;
};

template <int N> Walk<N> simplify_walk(const Walk<N>& w) {
  Walk<N> q;
  for (size_t d = 0; d < w.shape.size(); ++d) {
    if (w.shape[d] == 1) continue;
    bool merge = !q.shape.empty();
    for (int k = 0; k < N && merge; ++k) merge = q.st[k].back() == w.st[k][d] * w.shape[d];
    if (merge) {
      q.shape.back() *= w.shape[d];
      for (int k = 0; k < N; ++k) q.st[k].back() = w.st[k][d];
      continue;
    }
    q.shape.push_back(w.shape[d]);
    for (int k = 0; k < N; ++k) q.st[k].push_back(w.st[k][d]);
  }
  return q;
}

template <int N, class F> void walk(const Walk<N>& w, F inner) {
  const int r = static_cast<int>(w.shape.size());
  std::array<int64_t, N> off{};
  std::array<int64_t, N> step{};
  if (r == 0) {
    inner(off, step, int64_t{1});
    return;
  }
  for (int64_t n : w.shape)
    if (n == 0) return;
  for (int k = 0; k < N; ++k) step[k] = w.st[k][r - 1];
  std::vector<int64_t> idx(r, 0);
  while (true) {
    inner(off, step, w.shape[r - 1]);
    int d = r - 2;
    for (; d >= 0; --d) {
      for (int k = 0; k < N; ++k) off[k] += w.st[k][d];
      if (++idx[d] < w.shape[d]) break;
      for (int k = 0; k < N; ++k) off[k] -= w.st[k][d] * w.shape[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

// Operand k of a pointwise node as (memory id, strides over the result's shape).
struct PointwiseOperand {
  int id;
  std::vector<int64_t> strides;
};

PointwiseOperand operand_access(const Value* v, const ViewMap& views) {
  auto it = views.find(v->id);
  if (it != views.end()) return {it->second.src_id, it->second.strides};
  return {v->id, row_strides(v->type.shape)};
}

bool any_view(const Node& n, const ViewMap& views) {
  for (const Value* v : n.inputs)
    if (v && views.count(v->id)) return true;
  return false;
}

template <int N> Walk<N> pointwise_walk(const Node& n, const std::array<PointwiseOperand, N - 1>& ops) {
  Walk<N> w;
  w.shape = n.outputs[0]->type.shape;
  w.st[0] = row_strides(w.shape);
  for (int k = 1; k < N; ++k) w.st[k] = ops[k - 1].strides;
  return simplify_walk(w);
}

// A kernel made of strided copies of whole elements from operands into the result.
struct PlannedCopy {
  int src_id;
  CopyPlan plan;
};

CoreKernel copies_kernel(int out_id, int elem_bytes, std::vector<PlannedCopy> copies) {
  CoreKernel k;
  with_size(elem_bytes, [&](auto tag) {
    using U = Tag<decltype(tag)>;
    k = [out_id, copies = std::move(copies)](KernelEnv& e) {
      for (const auto& c : copies) run_copy(c.plan, in_ptr<U>(e, c.src_id), out_ptr<U>(e, out_id));
    };
  });
  return k;
}

CoreKernel make_broadcast(const Node& n) {
  const Shape in = static_shape(n.inputs[0]), out = static_shape(n.outputs[0]);
  const std::vector<int64_t> dims = n.attr_ints("dims");
  const auto ist = row_strides(in);
  CopyPlan p;
  p.shape = out;
  p.dst = row_strides(out);
  p.src.assign(out.size(), 0);
  for (size_t i = 0; i < dims.size(); ++i)
    if (!(in[i] == 1 && out[dims[i]] != 1)) p.src[dims[i]] = ist[i];
  return copies_kernel(n.outputs[0]->id, dtype_size(n.outputs[0]->type.dtype),
                       {{n.inputs[0]->id, simplify(p)}});
}

CoreKernel make_transpose(const Node& n) {
  const Shape in = static_shape(n.inputs[0]), out = static_shape(n.outputs[0]);
  const std::vector<int64_t> perm = n.attr_ints("perm");
  const auto ist = row_strides(in);
  CopyPlan p;
  p.shape = out;
  p.dst = row_strides(out);
  for (int64_t d : perm) p.src.push_back(ist[d]);
  return copies_kernel(n.outputs[0]->id, dtype_size(n.outputs[0]->type.dtype),
                       {{n.inputs[0]->id, simplify(p)}});
}

CoreKernel make_slice(const Node& n) {
  const Shape in = static_shape(n.inputs[0]), out = static_shape(n.outputs[0]);
  const std::vector<int64_t> starts = n.attr_ints("starts");
  const std::vector<int64_t> steps = n.attr_ints("strides", std::vector<int64_t>(in.size(), 1));
  const auto ist = row_strides(in);
  CopyPlan p;
  p.shape = out;
  p.dst = row_strides(out);
  for (size_t d = 0; d < in.size(); ++d) {
    p.src.push_back(steps[d] * ist[d]);
    if (out[d] > 0) p.src_off += starts[d] * ist[d];
  }
  return copies_kernel(n.outputs[0]->id, dtype_size(n.outputs[0]->type.dtype),
                       {{n.inputs[0]->id, simplify(p)}});
}

CoreKernel make_concatenate(const Node& n) {
  const Shape out = static_shape(n.outputs[0]);
  const int64_t axis = n.attr_i("axis");
  const auto ost = row_strides(out);
  std::vector<PlannedCopy> copies;
  int64_t at = 0;
  for (const Value* v : n.inputs) {
    CopyPlan p;
    p.shape = v->type.shape;
    p.src = row_strides(p.shape);
    p.dst = ost;
    p.dst_off = at * ost[axis];
    at += p.shape[axis];
    copies.push_back({v->id, simplify(p)});
  }
  return copies_kernel(n.outputs[0]->id, dtype_size(n.outputs[0]->type.dtype), std::move(copies));
}

// pad: the result is filled with the padding value, then the kept operand elements are copied in.
CoreKernel make_pad(const Node& n) {
  const Shape in = static_shape(n.inputs[0]), out = static_shape(n.outputs[0]);
  const size_t r = in.size();
  const auto low = n.attr_ints("low");
  const auto interior = n.attr_ints("interior", std::vector<int64_t>(r, 0));
  const auto ist = row_strides(in), ost = row_strides(out);
  CopyPlan p;
  for (size_t d = 0; d < r; ++d) {
    const int64_t step = interior[d] + 1;
    // operand index j lands at low + j*step; keep those inside [0, out)
    int64_t j0 = low[d] >= 0 ? 0 : (-low[d] + step - 1) / step;
    int64_t j1 = out[d] - 1 - low[d] < 0 ? 0 : std::min(in[d], (out[d] - 1 - low[d]) / step + 1);
    const int64_t count = std::max<int64_t>(0, j1 - j0);
    p.shape.push_back(count);
    p.src.push_back(ist[d]);
    p.dst.push_back(step * ost[d]);
    p.src_off += j0 * ist[d];
    p.dst_off += (low[d] + j0 * step) * ost[d];
  }
  const int x = n.inputs[0]->id, pv = n.inputs[1]->id, y = n.outputs[0]->id;
  const int64_t total = numel_of(n.outputs[0]);
  CopyPlan plan = simplify(p);
  if (p.empty()) plan.shape = {0};
  CoreKernel k;
  with_size(dtype_size(n.outputs[0]->type.dtype), [&](auto tag) {
    using U = Tag<decltype(tag)>;
    k = [=](KernelEnv& e) {
      U* yp = out_ptr<U>(e, y);
      std::fill(yp, yp + total, *in_ptr<U>(e, pv));
      run_copy(plan, in_ptr<U>(e, x), yp);
    };
  });
  return k;
}

// ---- elementwise ----------------------------------------------------------------------------------

template <class T, class F> void map1(const T* x, T* y, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) y[i] = Elem<T>::store(f(Elem<T>::load(x[i])));
}
template <class T, class F> void map2(const T* a, const T* b, T* y, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) y[i] = Elem<T>::store(f(Elem<T>::load(a[i]), Elem<T>::load(b[i])));
}

template <class T> CoreKernel unary_typed(CoreOp op, int x, int y, int64_t n) {
  using E = Elem<T>;
  auto make = [=](auto f) -> CoreKernel {
    return [=](KernelEnv& e) { map1(in_ptr<T>(e, x), out_ptr<T>(e, y), n, f); };
  };
  if constexpr (E::fl) {
    if (op == CoreOp::neg) return make([](double v) { return -v; });
    if (op == CoreOp::exp) return make([](double v) { return std::exp(v); });
    if (op == CoreOp::log) return make([](double v) { return std::log(v); });
    if (op == CoreOp::sqrt) return make([](double v) { return std::sqrt(v); });
    if (op == CoreOp::sin) return make([](double v) { return std::sin(v); });
    if (op == CoreOp::atan) return make([](double v) { return std::atan(v); });
    if (op == CoreOp::erf) return make([](double v) { return std::erf(v); });
    if (op == CoreOp::tanh) return make([](double v) { return std::tanh(v); });
    if (op == CoreOp::floor) return make([](double v) { return std::floor(v); });
    if (op == CoreOp::round_even) return make([](double v) { return std::nearbyint(v); });  // ties to even
  } else if (!std::is_same_v<T, Bool>) {
    if (op == CoreOp::neg) return make([](int64_t v) { return static_cast<int64_t>(0 - static_cast<uint64_t>(v)); });
  }
  return {};
}

double nan_max(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return std::max(a, b);
}
double nan_min(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return std::min(a, b);
}

int64_t int_div(int64_t a, int64_t b) {
  if (b == 0) fail("integer division by zero");
  if (b == -1) return static_cast<int64_t>(0 - static_cast<uint64_t>(a));
  return a / b;
}
int64_t int_rem(int64_t a, int64_t b) {
  if (b == 0) fail("integer remainder by zero");
  if (b == -1) return 0;
  return a % b;
}
int64_t int_pow(int64_t a, int64_t b) {
  if (b < 0) fail("pow on integers needs an exponent >= 0, got {}", b);
  uint64_t base = static_cast<uint64_t>(a), e = static_cast<uint64_t>(b), r = 1;
  while (e) {
    if (e & 1) r *= base;
    base *= base;
    e >>= 1;
  }
  return static_cast<int64_t>(r);
}

// y = f(a, b) with a and b read through strides (views); the runs where one operand is a broadcast
// scalar or both are contiguous get their own loops.
template <class T, class F> void map2_walk(const Walk<3>& w, const T* a, const T* b, T* y, F f) {
  using E = Elem<T>;
  walk(w, [&](const std::array<int64_t, 3>& off, const std::array<int64_t, 3>& st, int64_t n) {
    const T* ap = a + off[1];
    const T* bp = b + off[2];
    T* yp = y + off[0];
    if (st[1] == 1 && st[2] == 1) {
      map2(ap, bp, yp, n, f);
    } else if (st[1] == 1 && st[2] == 0) {
      const auto bv = E::load(*bp);
      for (int64_t i = 0; i < n; ++i) yp[i] = E::store(f(E::load(ap[i]), bv));
    } else if (st[1] == 0 && st[2] == 1) {
      const auto av = E::load(*ap);
      for (int64_t i = 0; i < n; ++i) yp[i] = E::store(f(av, E::load(bp[i])));
    } else {
      for (int64_t i = 0; i < n; ++i) yp[i] = E::store(f(E::load(ap[i * st[1]]), E::load(bp[i * st[2]])));
    }
  });
}

template <class T> CoreKernel binary_typed(CoreOp op, int a, int b, int y, int64_t n,
                                           std::shared_ptr<const Walk<3>> w = nullptr) {
  using E = Elem<T>;
  auto make = [=](auto f) -> CoreKernel {
    if (w) return [=](KernelEnv& e) { map2_walk(*w, in_ptr<T>(e, a), in_ptr<T>(e, b), out_ptr<T>(e, y), f); };
    return [=](KernelEnv& e) { map2(in_ptr<T>(e, a), in_ptr<T>(e, b), out_ptr<T>(e, y), n, f); };
  };
  if constexpr (E::fl) {
    if (op == CoreOp::add) return make([](double u, double v) { return u + v; });
    if (op == CoreOp::mul) return make([](double u, double v) { return u * v; });
    if (op == CoreOp::div) return make([](double u, double v) { return u / v; });
    if (op == CoreOp::rem) return make([](double u, double v) { return std::fmod(u, v); });
    if (op == CoreOp::pow) return make([](double u, double v) { return std::pow(u, v); });
    if (op == CoreOp::max) return make(nan_max);
    if (op == CoreOp::min) return make(nan_min);
    return {};
  } else {
    if (op == CoreOp::and_) return make([](int64_t u, int64_t v) { return u & v; });
    if (op == CoreOp::or_) return make([](int64_t u, int64_t v) { return u | v; });
    if (op == CoreOp::xor_) return make([](int64_t u, int64_t v) { return u ^ v; });
    if (op == CoreOp::max) return make([](int64_t u, int64_t v) { return std::max(u, v); });
    if (op == CoreOp::min) return make([](int64_t u, int64_t v) { return std::min(u, v); });
    if (std::is_same_v<T, Bool>) return {};
    if (op == CoreOp::add) return make(wrap_add);
    if (op == CoreOp::mul) return make(wrap_mul);
    if (op == CoreOp::div) return make(int_div);
    if (op == CoreOp::rem) return make(int_rem);
    if (op == CoreOp::pow) return make(int_pow);
    return {};
  }
}

CoreKernel make_compare(const Node& n, const ViewMap& views) {
  static const std::vector<std::string> dirs = {"eq", "ne", "lt", "le", "gt", "ge"};
  auto it = std::find(dirs.begin(), dirs.end(), n.attr_s("direction"));
  if (it == dirs.end()) return {};
  const int dir = static_cast<int>(it - dirs.begin());
  const std::array<PointwiseOperand, 2> ops = {operand_access(n.inputs[0], views), operand_access(n.inputs[1], views)};
  const Walk<3> w = pointwise_walk<3>(n, ops);
  const int a = ops[0].id, b = ops[1].id, y = n.outputs[0]->id;
  CoreKernel k;
  with_type(n.inputs[0]->type.dtype, [&](auto tag) {
    using T = Tag<decltype(tag)>;
    using E = Elem<T>;
    k = [=](KernelEnv& e) {
      const T* ap = in_ptr<T>(e, a);
      const T* bp = in_ptr<T>(e, b);
      uint8_t* yp = out_ptr<uint8_t>(e, y);
      walk(w, [&](const std::array<int64_t, 3>& off, const std::array<int64_t, 3>& st, int64_t count) {
        for (int64_t i = 0; i < count; ++i) {
          const auto u = E::load(ap[off[1] + i * st[1]]), v = E::load(bp[off[2] + i * st[2]]);
          bool r = false;
          switch (dir) {
            case 0: r = u == v; break;
            case 1: r = !(u == v); break;
            case 2: r = u < v; break;
            case 3: r = u <= v; break;
            case 4: r = u > v; break;
            default: r = u >= v; break;
          }
          yp[off[0] + i] = r ? 1 : 0;
        }
      });
    };
  });
  return k;
}

CoreKernel make_select(const Node& n, const ViewMap& views) {
  const std::array<PointwiseOperand, 3> ops = {operand_access(n.inputs[0], views), operand_access(n.inputs[1], views),
                                               operand_access(n.inputs[2], views)};
  const Walk<4> w = pointwise_walk<4>(n, ops);
  const int p = ops[0].id, t = ops[1].id, f = ops[2].id, y = n.outputs[0]->id;
  CoreKernel k;
  with_size(dtype_size(n.outputs[0]->type.dtype), [&](auto tag) {
    using U = Tag<decltype(tag)>;
    k = [=](KernelEnv& e) {
      const uint8_t* pp = in_ptr<uint8_t>(e, p);
      const U* tp = in_ptr<U>(e, t);
      const U* fp = in_ptr<U>(e, f);
      U* yp = out_ptr<U>(e, y);
      walk(w, [&](const std::array<int64_t, 4>& off, const std::array<int64_t, 4>& st, int64_t count) {
        for (int64_t i = 0; i < count; ++i)
          yp[off[0] + i] = pp[off[1] + i * st[1]] ? tp[off[2] + i * st[2]] : fp[off[3] + i * st[3]];
      });
    };
  });
  return k;
}

// One element of convert, with the reference's rules (float -> int truncates, NaN/inf give 0 and
// out-of-range values clamp to int64 before wrapping; anything -> bool is "!= 0").
template <class S, class D> D convert_one(S s) {
  using ES = Elem<S>;
  using ED = Elem<D>;
  if constexpr (std::is_same_v<D, Bool>) {
    return Bool{static_cast<uint8_t>(ES::load(s) != 0)};
  } else if constexpr (ED::fl) {
    return ED::store(static_cast<double>(ES::load(s)));
  } else if constexpr (ES::fl) {
    const double v = ES::load(s);
    int64_t iv = 0;
    if (std::isfinite(v)) {
      const double t = std::trunc(v);
      if (t >= 9.2233720368547758e18) iv = std::numeric_limits<int64_t>::max();
      else if (t <= -9.2233720368547758e18) iv = std::numeric_limits<int64_t>::min();
      else iv = static_cast<int64_t>(t);
    }
    return ED::store(iv);
  } else {
    return ED::store(ES::load(s));
  }
}

CoreKernel make_convert(const Node& n) {
  const DType from = n.inputs[0]->type.dtype, to = n.outputs[0]->type.dtype;
  const int x = n.inputs[0]->id, y = n.outputs[0]->id;
  const int64_t count = numel_of(n.outputs[0]);
  CoreKernel k;
  if (from == to) {
    const size_t bytes = static_cast<size_t>(count) * dtype_size(to);
    return [=](KernelEnv& e) {
      if (bytes && e.ptr[x] != e.ptr[y]) std::memmove(e.ptr[y], e.ptr[x], bytes);
    };
  }
  with_type(from, [&](auto stag) {
    using S = Tag<decltype(stag)>;
    with_type(to, [&](auto dtag) {
      using D = Tag<decltype(dtag)>;
      k = [=](KernelEnv& e) {
        const S* xp = in_ptr<S>(e, x);
        D* yp = out_ptr<D>(e, y);
        for (int64_t i = 0; i < count; ++i) yp[i] = convert_one<S, D>(xp[i]);
      };
    });
  });
  return k;
}

// ---- iota, gather ----------------------------------------------------------------------------------

CoreKernel make_iota(const Node& n) {
  const Shape out = static_shape(n.outputs[0]);
  const int64_t axis = n.attr_i("axis");
  if (n.outputs[0]->type.dtype == DType::boolean || axis < 0 || axis >= static_cast<int64_t>(out.size())) return {};
  const int64_t inner = row_strides(out)[axis], dim = out[axis], count = shape_numel(out);
  const int y = n.outputs[0]->id;
  CoreKernel k;
  with_type(n.outputs[0]->type.dtype, [&](auto tag) {
    using T = Tag<decltype(tag)>;
    using E = Elem<T>;
    k = [=](KernelEnv& e) {
      T* yp = out_ptr<T>(e, y);
      for (int64_t i = 0; i < count; ++i) yp[i] = E::store(static_cast<typename E::C>((i / inner) % dim));
    };
  });
  return k;
}

// A gather index wrapped once (negative counts from the end), or the error naming it.
inline int64_t gather_position(int64_t j, int64_t axis_dim) {
  const int64_t w = j < 0 ? j + axis_dim : j;
  if (w < 0 || w >= axis_dim) fail("gather index {} is out of range for a dim of {}", j, axis_dim);
  return w;
}

// out[p] = data[p with p[axis] replaced by idx[p]], over the index's shape; the index and the data are
// read through strides (a broadcast index is a view: Resize's positions along one axis, never
// materialised at the output's size).
template <class U, class I>
void gather_loop(const U* data, const I* idx, U* out, const Shape& ishape, const std::vector<int64_t>& dstride,
                 const std::vector<int64_t>& istride, int64_t axis, int64_t axis_dim) {
  const int r = static_cast<int>(ishape.size());
  const int64_t count = shape_numel(ishape);
  std::vector<int64_t> pos(r, 0);
  int64_t base = 0, ib = 0;  // offsets in data (without the axis term) and in the index
  for (int64_t i = 0; i < count; ++i) {
    out[i] = data[base + gather_position(static_cast<int64_t>(idx[ib]), axis_dim) * dstride[axis]];
    for (int d = r - 1; d >= 0; --d) {
      if (d != axis) base += dstride[d];
      ib += istride[d];
      if (++pos[d] < ishape[d]) break;
      if (d != axis) base -= dstride[d] * ishape[d];
      ib -= istride[d] * ishape[d];
      pos[d] = 0;
    }
  }
}

// The gather of a row-major data value by an index that varies along the axis only and has the data's
// sizes elsewhere (torch.index_select; Resize's positions): per outer position and index, one copy of
// the contiguous inner block. The m positions are checked before anything is written.
template <class U, class I>
void take_loop(const U* data, const I* idx, int64_t istep, U* out, int64_t outer, int64_t m, int64_t inner,
               int64_t axis_dim, bool parallel) {
  std::vector<int64_t> at(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) at[static_cast<size_t>(i)] = gather_position(static_cast<int64_t>(idx[i * istep]), axis_dim) * inner;
  const int64_t* a = at.data();
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t o = 0; o < outer; ++o) {
    const U* src = data + o * axis_dim * inner;
    U* dst = out + o * m * inner;
    if (inner == 1)
      for (int64_t i = 0; i < m; ++i) dst[i] = src[a[i]];
    else
      for (int64_t i = 0; i < m; ++i) std::memcpy(dst + i * inner, src + a[i], static_cast<size_t>(inner) * sizeof(U));
  }
}

CoreKernel make_gather(const Node& n, const ViewMap& views) {
  const Shape data = static_shape(n.inputs[0]), ishape = static_shape(n.inputs[1]);
  const int64_t axis = n.attr_i("axis");
  const DType it = n.inputs[1]->type.dtype;
  const int r = static_cast<int>(data.size());
  if (axis < 0 || axis >= r || ishape.size() != data.size() || (it != DType::i64 && it != DType::i32)) return {};
  const PointwiseOperand dop = operand_access(n.inputs[0], views), iop = operand_access(n.inputs[1], views);
  const std::vector<int64_t> dstride = dop.strides, istride = iop.strides;
  const int64_t axis_dim = data[axis];
  const int d = dop.id, ix = iop.id, y = n.outputs[0]->id;
  // the take path: data row-major, the index constant but along the axis, the data's sizes elsewhere
  bool take = dstride == row_strides(data);
  int64_t outer = 1, inner = 1;
  for (int k = 0; k < r; ++k) {
    if (k == axis) continue;
    take = take && istride[k] == 0 && ishape[k] == data[k];
    (k < axis ? outer : inner) *= data[k];
  }
  const int64_t m = ishape[axis], istep = istride[axis];
  const bool parallel = outer > 1 && outer * m * inner >= (int64_t{1} << 15);
  CoreKernel k;
  with_size(dtype_size(n.outputs[0]->type.dtype), [&](auto tag) {
    using U = Tag<decltype(tag)>;
    k = [=](KernelEnv& e) {
      if (take && it == DType::i64)
        take_loop(in_ptr<U>(e, d), in_ptr<int64_t>(e, ix), istep, out_ptr<U>(e, y), outer, m, inner, axis_dim, parallel);
      else if (take)
        take_loop(in_ptr<U>(e, d), in_ptr<int32_t>(e, ix), istep, out_ptr<U>(e, y), outer, m, inner, axis_dim, parallel);
      else if (it == DType::i64)
        gather_loop(in_ptr<U>(e, d), in_ptr<int64_t>(e, ix), out_ptr<U>(e, y), ishape, dstride, istride, axis, axis_dim);
      else
        gather_loop(in_ptr<U>(e, d), in_ptr<int32_t>(e, ix), out_ptr<U>(e, y), ishape, dstride, istride, axis, axis_dim);
    };
  });
  return k;
}

// ---- scatter ----------------------------------------------------------------------------------------

// The typed scatter without a reduction (the others combine in the reference kernel's wider type):
// y = data, then upd[p] written at p with p[axis] replaced by idx[p], for every position p of the
// index's shape in row-major order (a repeated position keeps the last, as the reference kernel does).
// The index and the updates are read through strides (a broadcast index is a view: aten index_copy_'s
// positions). Every index is checked before anything is written. When y is the data's own memory (run
// in place, can_run_in_place: a static KV cache written at a few positions) the copy is skipped and
// only the updated positions are written.
template <class I> struct ScatterIndex {
  const I* idx;
  int64_t axis_dim;
  int64_t operator()(int64_t at) const {
    const int64_t j = static_cast<int64_t>(idx[at]);
    const int64_t w = j < 0 ? j + axis_dim : j;
    if (w < 0 || w >= axis_dim) fail("scatter index {} is out of range for a dim of {}", j, axis_dim);
    return w;
  }
};

CoreKernel make_scatter(const Node& n, const ViewMap& views) {
  if (n.attr_s("reduction", "none") != "none") return {};
  const Shape data = static_shape(n.inputs[0]), ishape = static_shape(n.inputs[1]);
  const int64_t axis = n.attr_i("axis");
  const DType it = n.inputs[1]->type.dtype;
  const int r = static_cast<int>(data.size());
  if (axis < 0 || axis >= r || ishape.size() != data.size() || static_shape(n.inputs[2]) != ishape ||
      (it != DType::i64 && it != DType::i32))
    return {};
  const PointwiseOperand dop = operand_access(n.inputs[0], views), iop = operand_access(n.inputs[1], views),
                         uop = operand_access(n.inputs[2], views);
  // over the index's positions: y's offset without the axis term (idx gives it), the index's, the update's
  Walk<3> w;
  w.shape = ishape;
  w.st = {row_strides(data), iop.strides, uop.strides};
  const int64_t axis_stride = w.st[0][static_cast<size_t>(axis)];
  w.st[0][static_cast<size_t>(axis)] = 0;
  w = simplify_walk(w);
  const auto vit = views.find(n.inputs[0]->id);
  const std::optional<StridedView> dview = vit != views.end() ? std::optional<StridedView>(vit->second) : std::nullopt;
  const int64_t axis_dim = data[static_cast<size_t>(axis)];
  const int es = dtype_size(n.outputs[0]->type.dtype);
  const size_t bytes = static_cast<size_t>(shape_numel(data)) * static_cast<size_t>(es);
  const int d = dop.id, ix = iop.id, u = uop.id, y = n.outputs[0]->id;
  CoreKernel k;
  with_size(es, [&](auto tag) {
    using U = Tag<decltype(tag)>;
    auto run = [=](KernelEnv& e, auto at) {
      walk(w, [&](const std::array<int64_t, 3>& off, const std::array<int64_t, 3>& step, int64_t m) {
        for (int64_t t = 0; t < m; ++t) at(off[1] + t * step[1]);
      });
      uint8_t* out = e.ptr[static_cast<size_t>(y)];
      const uint8_t* src = e.ptr[static_cast<size_t>(d)];
      if (dview) materialize_view(*dview, src, data, es, out);    // (never in place: no write over a view)
      else if (out != src) std::memcpy(out, src, bytes);
      U* yp = reinterpret_cast<U*>(out);
      const U* up = in_ptr<U>(e, u);
      walk(w, [&](const std::array<int64_t, 3>& off, const std::array<int64_t, 3>& step, int64_t m) {
        for (int64_t t = 0; t < m; ++t) yp[off[0] + t * step[0] + at(off[1] + t * step[1]) * axis_stride] = up[off[2] + t * step[2]];
      });
    };
    if (it == DType::i64) k = [=](KernelEnv& e) { run(e, ScatterIndex<int64_t>{in_ptr<int64_t>(e, ix), axis_dim}); };
    else k = [=](KernelEnv& e) { run(e, ScatterIndex<int32_t>{in_ptr<int32_t>(e, ix), axis_dim}); };
  });
  return k;
}

// ---- reductions ------------------------------------------------------------------------------------

using RK = ReduceKind;

std::optional<RK> reduce_kind(const Node& n) { return reduce_kind_named(n.attr_s("kind")); }

// The accumulator of one reduction kind in compute type C (double or int64).
template <class T> struct Reducer {
  using E = Elem<T>;
  using C = typename E::C;
  RK k;
  C identity() const {
    if constexpr (E::fl) {
      return reduce_identity(k);
    } else if constexpr (std::is_same_v<T, Bool>) {
      return k == RK::min ? 1 : 0;
    } else {
      return k == RK::sum ? 0 : k == RK::prod ? 1
             : k == RK::max ? static_cast<C>(std::numeric_limits<T>::min())
                            : static_cast<C>(std::numeric_limits<T>::max());
    }
  }
  void add(C& a, C v) const {
    if constexpr (E::fl) {
      reduce_combine(k, a, v);
    } else {
      switch (k) {
        case RK::sum: a = wrap_add(a, v); break;
        case RK::prod: a = wrap_mul(a, v); break;
        case RK::max: a = std::max(a, v); break;
        case RK::min: a = std::min(a, v); break;
      }
    }
  }
};

// Offsets (in elements) of every position of `shape` walked with `strides`, row-major.
std::vector<int64_t> offsets_of(const Shape& shape, const std::vector<int64_t>& strides) {
  std::vector<int64_t> offs(static_cast<size_t>(shape_numel(shape)));
  std::vector<int64_t> pos(shape.size(), 0);
  int64_t o = 0;
  for (size_t i = 0; i < offs.size(); ++i) {
    offs[i] = o;
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      o += strides[d];
      if (++pos[d] < shape[d]) break;
      o -= strides[d] * shape[d];
      pos[d] = 0;
    }
  }
  return offs;
}

CoreKernel make_reduce(const Node& n) {
  const auto kind = reduce_kind(n);
  if (!kind) return {};
  const Shape in = static_shape(n.inputs[0]);
  const auto ist = row_strides(in);
  std::vector<bool> reduced(in.size(), false);
  for (int64_t a : n.attr_ints("axes")) {
    if (a < 0 || a >= static_cast<int64_t>(in.size())) return {};
    reduced[a] = true;
  }
  Shape kept_shape, red_shape;
  std::vector<int64_t> kept_st, red_st;
  for (size_t d = 0; d < in.size(); ++d) {
    (reduced[d] ? red_shape : kept_shape).push_back(in[d]);
    (reduced[d] ? red_st : kept_st).push_back(ist[d]);
  }
  auto outer = std::make_shared<std::vector<int64_t>>(offsets_of(kept_shape, kept_st));
  const int64_t red_count = shape_numel(red_shape);
  // Reducing a contiguous trailing block needs no offset table.
  const bool contiguous = !red_shape.empty() && red_st.back() == 1 && red_count * 1 == red_count &&
                          [&] {
                            int64_t s = 1;
                            for (int d = static_cast<int>(red_shape.size()) - 1; d >= 0; --d) {
                              if (red_st[d] != s) return false;
                              s *= red_shape[d];
                            }
                            return true;
                          }();
  auto inner = std::make_shared<std::vector<int64_t>>(contiguous ? std::vector<int64_t>{} : offsets_of(red_shape, red_st));
  const int x = n.inputs[0]->id, y = n.outputs[0]->id;
  const DType t = n.inputs[0]->type.dtype;
  if (t == DType::boolean && (*kind == RK::sum || *kind == RK::prod)) return {};
  CoreKernel k;
  with_type(t, [&](auto tag) {
    using T = Tag<decltype(tag)>;
    const Reducer<T> red{*kind};
    k = [=](KernelEnv& e) {
      const T* xp = in_ptr<T>(e, x);
      T* yp = out_ptr<T>(e, y);
      for (size_t o = 0; o < outer->size(); ++o) {
        auto acc = red.identity();
        // An empty reduction reads nothing: its input has no buffer (offsets from null are UB).
        const T* base = red_count > 0 ? xp + (*outer)[o] : nullptr;
        if (contiguous)
          for (int64_t i = 0; i < red_count; ++i) red.add(acc, Elem<T>::load(base[i]));
        else
          for (int64_t off : *inner) red.add(acc, Elem<T>::load(base[off]));
        yp[o] = Elem<T>::store(acc);
      }
    };
  });
  return k;
}

// The taps of one spatial dim of a window: for every output position o, the window positions
// [lo[o], hi[o]) whose input position o * stride - pad + w * dil lies inside the input.
struct TapRange {
  std::vector<int64_t> lo, hi;
};

TapRange tap_range(int64_t in, int64_t out, int64_t window, int64_t stride, int64_t dil, int64_t pad) {
  TapRange t;
  for (int64_t o = 0; o < out; ++o) {
    int64_t lo = 0, hi = window;
    while (lo < hi && o * stride - pad + lo * dil < 0) ++lo;
    while (hi > lo && o * stride - pad + (hi - 1) * dil >= in) --hi;
    t.lo.push_back(lo);
    t.hi.push_back(hi);
  }
  return t;
}

// [lo, hi): the outputs along a dim whose every tap is inside the input (the others are the edges).
std::pair<int64_t, int64_t> full_window_range(const TapRange& t, int64_t window) {
  const int64_t out = static_cast<int64_t>(t.lo.size());
  int64_t lo = 0, hi = out;
  while (lo < out && (t.lo[static_cast<size_t>(lo)] != 0 || t.hi[static_cast<size_t>(lo)] != window)) ++lo;
  while (hi > lo && (t.lo[static_cast<size_t>(hi - 1)] != 0 || t.hi[static_cast<size_t>(hi - 1)] != window)) --hi;
  return {lo, hi};
}

// Whether a reduce_window is a pooling: a window (with strides, dilations, pads) only over the last
// two dims; every leading dim is a plane index (window 1, stride 1, no pads, same size).
bool is_2d_pooling(const Shape& in, const Shape& out, const std::vector<int64_t>& window, const std::vector<int64_t>& strides,
                   const std::vector<int64_t>& dil, const std::vector<int64_t>& pad) {
  const size_t r = in.size();
  if (r < 2) return false;
  for (size_t d = 0; d + 2 < r; ++d)
    if (window[d] != 1 || strides[d] != 1 || dil[d] != 1 || pad[2 * d] != 0 || pad[2 * d + 1] != 0 || in[d] != out[d])
      return false;
  return true;
}

// Loops that must vectorise (the product kernels, pooling) are compiled at O3.
// The pooling taps are also cloned for AVX-512 and AVX2 machines, picked at load time (the library is
// built for baseline x86-64: SSE2 only made googlenet's channels-last max pools 3x slower than ORT's).
#if defined(__clang__)
#define TESSEL_GEMM_OPTIMIZE  // clang has no per-function optimisation level (the sanitized build)
#define TESSEL_VECTOR_CLONES  // nor clones of function templates (clang 14)
#else
#define TESSEL_GEMM_OPTIMIZE __attribute__((optimize("O3")))
#if defined(__x86_64__)
#define TESSEL_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TESSEL_VECTOR_CLONES
#endif
#endif

// Reducer::add of one float reduction kind, branch-free (selects), so that the pooling loops below
// vectorise: the same results, NaN included.
template <class C> inline bool nan_value(C v) {
  if constexpr (std::is_floating_point_v<C>) return std::isnan(v);
  return false;
}

template <class C, RK K> inline C pool_add(C a, C v) {
  if constexpr (K == RK::sum) return a + v;
  if constexpr (K == RK::prod) return a * v;
  if constexpr (K == RK::max) return nan_value(a) ? a : (nan_value(v) || v > a) ? v : a;
  return nan_value(a) ? a : (nan_value(v) || v < a) ? v : a;
}

// The accumulator of a pooling: Elem<T>::C (double for floats: sums round once), except f32 max and min,
// which only select among their taps and are exact in f32 itself (twice the vector width, no converts:
// googlenet's 3x3 stride-1 max pools took 1 ms each).
template <class T, RK K>
using PoolC = std::conditional_t<std::is_same_v<T, float> && (K == RK::max || K == RK::min), float, typename Elem<T>::C>;

template <class T, RK K> inline PoolC<T, K> pool_load(T x) {
  if constexpr (std::is_same_v<PoolC<T, K>, T>) return x;
  else return Elem<T>::load(x);
}
template <class T, RK K> inline T pool_store(PoolC<T, K> c) {
  if constexpr (std::is_same_v<PoolC<T, K>, T>) return c;
  else return Elem<T>::store(c);
}

// acc[i] = acc[i] (+) tap[i * stride] for i in [0, n).
template <class T, RK K>
TESSEL_GEMM_OPTIMIZE TESSEL_VECTOR_CLONES void pool_tap(PoolC<T, K>* __restrict acc, const T* __restrict tap, int64_t n, int64_t stride) {
  for (int64_t i = 0; i < n; ++i) acc[i] = pool_add<PoolC<T, K>, K>(acc[i], pool_load<T, K>(tap[i * stride]));
}

// acc[p·C + c] (+)= tap[p·stride + c] for p in [0, pixels), c in [0, C): one tap over a run of
// channels-last output pixels whose inputs are `stride` elements apart (a strided pooling's row).
template <class T, RK K>
TESSEL_GEMM_OPTIMIZE TESSEL_VECTOR_CLONES void pool_tap_pixels(PoolC<T, K>* __restrict acc, const T* __restrict tap,
                                                               int64_t pixels, int64_t C, int64_t stride) {
  for (int64_t p = 0; p < pixels; ++p)
    for (int64_t c = 0; c < C; ++c)
      acc[p * C + c] = pool_add<PoolC<T, K>, K>(acc[p * C + c], pool_load<T, K>(tap[p * stride + c]));
}

template <class T, RK K> struct AddOf {
  using C = PoolC<T, K>;
  void operator()(C& a, C v) const { a = pool_add<C, K>(a, v); }
};

// reduce_window as a 2-D pooling over planes: the in-range taps of each output row and column are
// known at compile time, so no tap tests bounds, and the loops run tap by tap over a row of outputs
// (resnet50's MaxPool: the generic loop below took a fifth of the model's time). Every result is
// still reduced over its taps in the generic loop's order (rows, then columns), so the results are
// the same.
template <class T, RK K>
CoreKernel pooling_2d_kernel(const Node& n, const Shape& in, const Shape& out, const std::vector<int64_t>& window,
                             const std::vector<int64_t>& strides, const std::vector<int64_t>& dil,
                             const std::vector<int64_t>& pad) {
  const size_t r = in.size();
  const int64_t H = in[r - 2], W = in[r - 1], OH = out[r - 2], OW = out[r - 1], KW = window[r - 1];
  const int64_t sh = strides[r - 2], sw = strides[r - 1], dh = dil[r - 2], dw = dil[r - 1];
  const int64_t ph = pad[2 * (r - 2)], pw = pad[2 * (r - 1)];
  int64_t planes = 1;
  for (size_t d = 0; d + 2 < r; ++d) planes *= in[d];
  auto rows = std::make_shared<TapRange>(tap_range(H, OH, window[r - 2], sh, dh, ph));
  auto cols = std::make_shared<TapRange>(tap_range(W, OW, KW, sw, dw, pw));
  // [full_lo, full_hi): the outputs of a row whose every column tap is inside the input
  const std::pair<int64_t, int64_t> full = full_window_range(*cols, KW);  // (clang 14 captures no bindings)
  const int64_t full_lo = full.first, full_hi = full.second;
  const int x = n.inputs[0]->id, y = n.outputs[0]->id;
  using C = PoolC<T, K>;
  // Planes are independent: split across the OpenMP team (the compiled backend's thread count) when
  // there is enough work; each plane is reduced exactly as on one thread.
  const bool parallel = planes > 1 && planes * OH * OW * window[r - 2] * KW >= (int64_t{1} << 16);
  if constexpr (std::is_same_v<C, T>) {
    // f32 max/min: separable. Each input row is reduced over the column taps once (into hbuf), then each
    // output row over the row taps of hbuf: KH + KW passes per output row instead of KH · KW, each over a
    // whole row. The first maximal tap in (row, column) order is still the one kept, so the results
    // (signed zeros and NaN included) are the generic loop's.
    return [=](KernelEnv& e) {
      const T* xp = in_ptr<T>(e, x);
      T* yp = out_ptr<T>(e, y);
      const C identity = static_cast<C>(Reducer<T>{K}.identity());
#pragma omp parallel if (parallel)
      {
        const AddOf<T, K> add;
        std::vector<C> hbuf(static_cast<size_t>(H * OW));
#pragma omp for schedule(static)
        for (int64_t p = 0; p < planes; ++p) {
          const T* plane = xp + p * H * W;
          for (int64_t h = 0; h < H; ++h) {
            C* hr = hbuf.data() + h * OW;
            const T* row = plane + h * W;
            std::fill(hr, hr + OW, identity);
            for (int64_t ow = 0; ow < full_lo; ++ow)
              for (int64_t kw = cols->lo[static_cast<size_t>(ow)]; kw < cols->hi[static_cast<size_t>(ow)]; ++kw)
                add(hr[ow], row[ow * sw - pw + kw * dw]);
            for (int64_t kw = 0; kw < KW; ++kw)
              pool_tap<T, K>(hr + full_lo, row - pw + kw * dw + full_lo * sw, full_hi - full_lo, sw);
            for (int64_t ow = std::max(full_hi, full_lo); ow < OW; ++ow)
              for (int64_t kw = cols->lo[static_cast<size_t>(ow)]; kw < cols->hi[static_cast<size_t>(ow)]; ++kw)
                add(hr[ow], row[ow * sw - pw + kw * dw]);
          }
          for (int64_t oh = 0; oh < OH; ++oh) {
            T* yrow = yp + (p * OH + oh) * OW;
            std::fill(yrow, yrow + OW, identity);
            for (int64_t kh = rows->lo[static_cast<size_t>(oh)]; kh < rows->hi[static_cast<size_t>(oh)]; ++kh)
              pool_tap<T, K>(yrow, hbuf.data() + (oh * sh - ph + kh * dh) * OW, OW, 1);
          }
        }
      }
    };
  }
  return [=](KernelEnv& e) {
    const T* xp = in_ptr<T>(e, x);
    T* yp = out_ptr<T>(e, y);
#pragma omp parallel if (parallel)
    {
    const AddOf<T, K> add;
    std::vector<C> acc(static_cast<size_t>(OW));
    C* ac = acc.data();
    auto edge = [&](const T* row, int64_t ow) {
      for (int64_t kw = cols->lo[static_cast<size_t>(ow)]; kw < cols->hi[static_cast<size_t>(ow)]; ++kw)
        add(ac[ow], pool_load<T, K>(row[ow * sw - pw + kw * dw]));
    };
#pragma omp for schedule(static)
    for (int64_t p = 0; p < planes; ++p) {
      const T* plane = xp + p * H * W;
      for (int64_t oh = 0; oh < OH; ++oh) {
        std::fill(acc.begin(), acc.end(), static_cast<C>(Reducer<T>{K}.identity()));
        for (int64_t kh = rows->lo[static_cast<size_t>(oh)]; kh < rows->hi[static_cast<size_t>(oh)]; ++kh) {
          const T* row = plane + (oh * sh - ph + kh * dh) * W;
          for (int64_t ow = 0; ow < full_lo; ++ow) edge(row, ow);
          for (int64_t kw = 0; kw < KW; ++kw)
            pool_tap<T, K>(ac + full_lo, row - pw + kw * dw + full_lo * sw, full_hi - full_lo, sw);
          for (int64_t ow = std::max(full_hi, full_lo); ow < OW; ++ow) edge(row, ow);
        }
        T* yrow = yp + (p * OH + oh) * OW;
        for (int64_t ow = 0; ow < OW; ++ow) yrow[ow] = pool_store<T, K>(ac[ow]);
      }
    }
    }
  };
}

// reduce_window over H and W of an [N, C, H, W] value stored channels-last, the result likewise: per
// output pixel, its in-range taps in the generic loop's order (rows, then columns), each one pass over
// the C contiguous channels (vectorised across channels; the same results as the row-major loops).
template <class T, RK K>
CoreKernel pooling_nhwc_kernel(const Node& n, const Shape& in, const Shape& out, const std::vector<int64_t>& window,
                               const std::vector<int64_t>& strides, const std::vector<int64_t>& dil,
                               const std::vector<int64_t>& pad) {
  const int64_t N = in[0], C = in[1], H = in[2], W = in[3], OH = out[2], OW = out[3], KW = window[3];
  const int64_t sh = strides[2], sw = strides[3], dh = dil[2], dw = dil[3], ph = pad[4], pw = pad[6];
  auto rows = std::make_shared<TapRange>(tap_range(H, OH, window[2], sh, dh, ph));
  auto cols = std::make_shared<TapRange>(tap_range(W, OW, KW, sw, dw, pw));
  // [full_lo, full_hi): the output pixels of a row whose every column tap is inside the input. Tap kw
  // of one input row is, over those pixels, one contiguous run of (full_hi - full_lo) · C elements with
  // stride 1, and pixels of C elements sw · C apart otherwise: one call each, not one per pixel.
  const std::pair<int64_t, int64_t> full = full_window_range(*cols, KW);  // (clang 14 captures no bindings)
  const int64_t full_lo = full.first, full_hi = full.second;
  const int x = n.inputs[0]->id, y = n.outputs[0]->id;
  using A = PoolC<T, K>;
  const bool parallel = N * OH > 1 && N * OH * OW * C * window[2] * KW >= (int64_t{1} << 16);
  return [=](KernelEnv& e) {
    const T* xp = in_ptr<T>(e, x);
    T* yp = out_ptr<T>(e, y);
    const A identity = static_cast<A>(Reducer<T>{K}.identity());
#pragma omp parallel if (parallel)
    {
      std::vector<A> buf(std::is_same_v<A, T> ? 0 : static_cast<size_t>(OW * C));
#pragma omp for schedule(static)
      for (int64_t i = 0; i < N * OH; ++i) {
        const int64_t b = i / OH, oh = i % OH;
        const size_t r = static_cast<size_t>(oh);
        T* yrow = yp + i * OW * C;
        A* acc;
        if constexpr (std::is_same_v<A, T>) acc = yrow;  // f32 max/min accumulate in the result
        else acc = buf.data();
        std::fill(acc, acc + OW * C, identity);
        auto pixel = [&](const T* xrow, int64_t ow) {
          for (int64_t kw = cols->lo[static_cast<size_t>(ow)]; kw < cols->hi[static_cast<size_t>(ow)]; ++kw)
            pool_tap<T, K>(acc + ow * C, xrow + (ow * sw - pw + kw * dw) * C, C, 1);
        };
        // Row by row of taps, each tap's columns in order: every pixel reduces its taps in the generic
        // loop's order (rows, then columns), so the results are the same.
        for (int64_t kh = rows->lo[r]; kh < rows->hi[r]; ++kh) {
          const T* xrow = xp + ((b * H + oh * sh - ph + kh * dh) * W) * C;
          for (int64_t ow = 0; ow < full_lo; ++ow) pixel(xrow, ow);
          if (sw == 1) {
            for (int64_t kw = 0; kw < KW && full_hi > full_lo; ++kw)
              pool_tap<T, K>(acc + full_lo * C, xrow + (full_lo - pw + kw * dw) * C, (full_hi - full_lo) * C, 1);
          } else {
            for (int64_t kw = 0; kw < KW && full_hi > full_lo; ++kw)
              pool_tap_pixels<T, K>(acc + full_lo * C, xrow + (full_lo * sw - pw + kw * dw) * C, full_hi - full_lo, C, sw * C);
          }
          for (int64_t ow = std::max(full_hi, full_lo); ow < OW; ++ow) pixel(xrow, ow);
        }
        if constexpr (!std::is_same_v<A, T>)
          for (int64_t k = 0; k < OW * C; ++k) yrow[k] = pool_store<T, K>(acc[k]);
      }
    }
  };
}

// concatenate along C of [N, C_i, H, W] values stored channels-last: operand i fills channels
// [at_i, at_i + C_i) of every pixel of the [N, H, W, C] result.
CoreKernel concatenate_nhwc_kernel(const Node& n) {
  const Shape out = static_shape(n.outputs[0]);
  const int64_t pixels = out[0] * out[2] * out[3], C = out[1];
  std::vector<std::pair<int, int64_t>> parts;  // (operand value id, its channels), in order
  for (const Value* v : n.inputs) parts.emplace_back(v->id, v->type.shape[1]);
  const int y = n.outputs[0]->id;
  // Pixels are split across the team: each pixel is C floats written once (googlenet's and
  // squeezenet's concatenations of up to 832 channels).
  const bool parallel = pixels > 1 && pixels * C >= (int64_t{1} << 15);
  return [=](KernelEnv& e) {
    float* yp = out_ptr<float>(e, y);
    std::vector<const float*> src;
    for (const auto& [id, ci] : parts) src.push_back(in_ptr<float>(e, id));
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t p = 0; p < pixels; ++p) {
      float* dst = yp + p * C;
      for (size_t i = 0; i < parts.size(); ++i) {
        const int64_t ci = parts[i].second;
        std::memcpy(dst, src[i] + p * ci, static_cast<size_t>(ci) * sizeof(float));
        dst += ci;
      }
    }
  };
}

// reduce_window on float types: for every result position, the window's in-range operand positions.
CoreKernel make_reduce_window(const Node& n) {
  const auto kind = reduce_kind(n);
  const DType t = n.inputs[0]->type.dtype;
  if (!kind || !is_float(t)) return {};
  const Shape in = static_shape(n.inputs[0]), out = static_shape(n.outputs[0]);
  const size_t r = in.size();
  const auto window = n.attr_ints("window");
  const auto strides = n.attr_ints("strides", std::vector<int64_t>(r, 1));
  const auto dil = n.attr_ints("dilations", std::vector<int64_t>(r, 1));
  const auto pad = n.attr_ints("padding", std::vector<int64_t>(2 * r, 0));
  const auto ist = row_strides(in);
  const int x = n.inputs[0]->id, y = n.outputs[0]->id;
  const int64_t count = shape_numel(out), wcount = shape_numel(window);
  const bool pooling = count > 0 && is_2d_pooling(in, out, window, strides, dil, pad);
  CoreKernel k;
  with_type(t, [&](auto tag) {
    using T = Tag<decltype(tag)>;
    const Reducer<T> red{*kind};
    if (pooling) {
      switch (*kind) {
        case RK::sum: k = pooling_2d_kernel<T, RK::sum>(n, in, out, window, strides, dil, pad); break;
        case RK::max: k = pooling_2d_kernel<T, RK::max>(n, in, out, window, strides, dil, pad); break;
        case RK::min: k = pooling_2d_kernel<T, RK::min>(n, in, out, window, strides, dil, pad); break;
        case RK::prod: k = pooling_2d_kernel<T, RK::prod>(n, in, out, window, strides, dil, pad); break;
      }
      return;
    }
    k = [=](KernelEnv& e) {
      const T* xp = in_ptr<T>(e, x);
      T* yp = out_ptr<T>(e, y);
      std::vector<int64_t> opos(r, 0), wpos(r, 0);
      for (int64_t o = 0; o < count; ++o) {
        auto acc = red.identity();
        std::fill(wpos.begin(), wpos.end(), 0);
        for (int64_t w = 0; w < wcount; ++w) {
          int64_t off = 0;
          bool inside = true;
          for (size_t d = 0; d < r && inside; ++d) {
            const int64_t c = opos[d] * strides[d] - pad[2 * d] + wpos[d] * dil[d];
            inside = c >= 0 && c < in[d];
            off += c * ist[d];
          }
          if (inside) red.add(acc, Elem<T>::load(xp[off]));
          for (int d = static_cast<int>(r) - 1; d >= 0; --d) {
            if (++wpos[d] < window[d]) break;
            wpos[d] = 0;
          }
        }
        yp[o] = Elem<T>::store(acc);
        for (int d = static_cast<int>(r) - 1; d >= 0; --d) {
          if (++opos[d] < out[d]) break;
          opos[d] = 0;
        }
      }
    };
  });
  return k;
}

// ---- matrix products -------------------------------------------------------------------------------

// C[M,N] = A[M,K] * B[K,N] (row-major, C overwritten). Blocks of 4 rows by 32 columns of C are summed
// over all of K in local accumulators (registers, with the AVX-512 or AVX2 clone): each step of K reads
// 4 numbers of A and 32 of B for 128 multiply-adds, and the 32 columns of B (K x 32) stay in cache
// while every block of rows passes over them. Edges (fewer rows or columns) take the plain loop.
template <class A>
TESSEL_GEMM_OPTIMIZE TESSEL_VECTOR_CLONES void gemm(const A* __restrict a, const A* __restrict b, A* __restrict c,
                                                    int64_t m, int64_t k, int64_t n) {
  constexpr int64_t MR = 4, NR = 32;
  for (int64_t j0 = 0; j0 < n; j0 += NR) {
    const int64_t nb = std::min(NR, n - j0);
    int64_t i0 = 0;
    if (nb == NR) {
      for (; i0 + MR <= m; i0 += MR) {
        A acc[MR][NR] = {};
        const A* a0 = a + i0 * k;
        for (int64_t p = 0; p < k; ++p) {
          const A* __restrict br = b + p * n + j0;
          for (int64_t r = 0; r < MR; ++r) {
            const A av = a0[r * k + p];
            for (int64_t j = 0; j < NR; ++j) acc[r][j] += av * br[j];
          }
        }
        for (int64_t r = 0; r < MR; ++r)
          for (int64_t j = 0; j < NR; ++j) c[(i0 + r) * n + j0 + j] = acc[r][j];
      }
    }
    for (int64_t i = i0; i < m; ++i) {
      A* __restrict cr = c + i * n + j0;
      for (int64_t j = 0; j < nb; ++j) cr[j] = A(0);
      const A* ar = a + i * k;
      for (int64_t p = 0; p < k; ++p) {
        const A av = ar[p];
        const A* __restrict br = b + p * n + j0;
        for (int64_t j = 0; j < nb; ++j) cr[j] += av * br[j];
      }
    }
  }
}

// An operand of a product in canonical layout ([batch, rows, cols] contiguous, compute type A):
// either the operand itself, a copy packed once at compile time (constants), or packed per call.
template <class T, class A> struct Operand {
  int id = 0;
  bool direct = false;                       // the operand's memory is already canonical
  std::shared_ptr<std::vector<A>> packed;    // constant operand, packed at compile time
  CopyPlan plan;                             // operand -> canonical
  int64_t numel = 0;

  const A* get(KernelEnv& e, std::vector<A>& scratch) const {
    if (direct) return reinterpret_cast<const A*>(e.ptr[id]);
    if (packed) return packed->data();
    scratch.resize(static_cast<size_t>(numel));
    run_copy<T, A>(plan, in_ptr<T>(e, id), scratch.data());
    return scratch.data();
  }
};

// Canonical layout of `v` with its dims in the order `order`.
template <class T, class A> Operand<T, A> make_operand(const Value* v, const std::vector<int64_t>& order) {
  Operand<T, A> op;
  op.id = v->id;
  const Shape s = v->type.shape;
  const auto st = row_strides(s);
  CopyPlan p;
  for (int64_t d : order) {
    p.shape.push_back(s[d]);
    p.src.push_back(st[d]);
  }
  p.dst = row_strides(p.shape);
  op.plan = simplify(p);
  op.numel = shape_numel(s);
  bool identity = true;
  for (size_t i = 0; i < order.size(); ++i) identity = identity && order[i] == static_cast<int64_t>(i);
  if (std::is_same_v<T, A> && identity) {
    op.direct = true;
  } else if (v->constant) {
    op.packed = std::make_shared<std::vector<A>>(static_cast<size_t>(op.numel));
    run_copy<T, A>(op.plan, v->constant->template data<T>(), op.packed->data());
  }
  return op;
}

// Multiply-adds from which a product's blocks of rows are spread over the threads.
constexpr double kParallelMacs = 1 << 20;

template <class T, class A> CoreKernel dot_typed(const Node& n) {
  const Value* lv = n.inputs[0];
  const Value* rv = n.inputs[1];
  const Shape ls = lv->type.shape, rs = rv->type.shape;
  const auto lb = n.attr_ints("lhs_batch", {}), rb = n.attr_ints("rhs_batch", {});
  const auto lc = n.attr_ints("lhs_contract"), rc = n.attr_ints("rhs_contract");
  auto free_dims = [](size_t rank, const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    std::vector<int64_t> f;
    for (int64_t d = 0; d < static_cast<int64_t>(rank); ++d)
      if (std::find(a.begin(), a.end(), d) == a.end() && std::find(b.begin(), b.end(), d) == b.end()) f.push_back(d);
    return f;
  };
  const auto lf = free_dims(ls.size(), lb, lc), rf = free_dims(rs.size(), rb, rc);
  int64_t B = 1, M = 1, K = 1, N = 1;
  for (int64_t d : lb) B *= ls[d];
  for (int64_t d : lf) M *= ls[d];
  for (int64_t d : lc) K *= ls[d];
  for (int64_t d : rf) N *= rs[d];
  std::vector<int64_t> lorder = lb, rorder = rb;
  lorder.insert(lorder.end(), lf.begin(), lf.end());
  lorder.insert(lorder.end(), lc.begin(), lc.end());
  rorder.insert(rorder.end(), rc.begin(), rc.end());
  rorder.insert(rorder.end(), rf.begin(), rf.end());
  const auto L = make_operand<T, A>(lv, lorder);
  const auto R = make_operand<T, A>(rv, rorder);
  const int y = n.outputs[0]->id;
  return [=](KernelEnv& e) {
    // The operands' packed copies and the widened result live in buffers each thread keeps (a decode
    // step's Kᵀ, hundreds of KB, was a fresh allocation per call: its pages faulted in every time).
    thread_local std::vector<A> ls_buf, rs_buf, out_buf;
    const A* a = L.get(e, ls_buf);
    const A* b = R.get(e, rs_buf);
    A* c = nullptr;
    if constexpr (std::is_same_v<T, A>) c = out_ptr<A>(e, y);
    else {
      out_buf.resize(static_cast<size_t>(B * M * N));
      c = out_buf.data();
    }
    // Tasks of one batch entry's block of rows, spread over the threads when the product is large
    // (attention's Q·Kᵀ and P·V at a prefill's length); a decode step's product runs on one.
    const int64_t row_block = std::max<int64_t>(4, ((M + 15) / 16 + 3) / 4 * 4);  // ~16 blocks, 4 rows a multiple
    const int64_t blocks = (M + row_block - 1) / row_block, tasks = B * blocks;
    const bool parallel = static_cast<double>(B) * static_cast<double>(M) * static_cast<double>(N) *
                              static_cast<double>(K) >= kParallelMacs && tasks > 1;
#pragma omp parallel for schedule(dynamic) if (parallel)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t i = t / blocks, r0 = t % blocks * row_block, rows = std::min(row_block, M - r0);
      gemm(a + i * M * K + r0 * K, b + i * K * N, c + i * M * N + r0 * N, rows, K, N);
    }
    if constexpr (!std::is_same_v<T, A>) {
      T* yp = out_ptr<T>(e, y);
      for (int64_t i = 0; i < B * M * N; ++i) yp[i] = Elem<T>::store(c[i]);
    }
    // (a buffer grown past 8 MB by a long prefill is given back rather than kept by the thread)
    for (std::vector<A>* v : {&ls_buf, &rs_buf, &out_buf})
      if (v->capacity() * sizeof(A) > (size_t{8} << 20)) std::vector<A>().swap(*v);
  };
}

CoreKernel make_dot(const Node& n) {
  switch (n.inputs[0]->type.dtype) {
    case DType::f32: return dot_typed<float, float>(n);
    case DType::f64: return dot_typed<double, double>(n);
    case DType::f16: return dot_typed<F16, float>(n);
    case DType::bf16: return dot_typed<BF16, float>(n);
    default: return {};
  }
}

// 2-d convolution (f32 / f64) as im2col + gemm per image and group; 1x1 kernels with stride 1 and
// no padding use the image directly.
template <class T> CoreKernel conv2d_typed(const Node& n) {
  const Shape xs = n.inputs[0]->type.shape, ws = n.inputs[1]->type.shape, ys = n.outputs[0]->type.shape;
  const auto st = n.attr_ints("strides", {1, 1}), dl = n.attr_ints("dilations", {1, 1});
  const auto pd = n.attr_ints("padding", {0, 0, 0, 0});
  const int64_t G = n.attr_i("groups", 1);
  const int64_t Nn = xs[0], C = xs[1], H = xs[2], W = xs[3], O = ys[1], OH = ys[2], OW = ys[3];
  const int64_t KH = ws[2], KW = ws[3], Cg = C / G, Og = O / G;
  const int64_t rows = Cg * KH * KW, cols = OH * OW;
  const bool direct = KH == 1 && KW == 1 && st[0] == 1 && st[1] == 1 && pd[0] == 0 && pd[1] == 0 && pd[2] == 0 &&
                      pd[3] == 0 && OH == H && OW == W;
  const int x = n.inputs[0]->id, w = n.inputs[1]->id, y = n.outputs[0]->id;
  return [=](KernelEnv& e) {
    const T* xp = in_ptr<T>(e, x);
    const T* wp = in_ptr<T>(e, w);
    T* yp = out_ptr<T>(e, y);
    std::vector<T> colbuf(direct ? 0 : static_cast<size_t>(rows * cols));
    for (int64_t img = 0; img < Nn; ++img)
      for (int64_t g = 0; g < G; ++g) {
        const T* xg = xp + (img * C + g * Cg) * H * W;
        const T* b = xg;
        if (!direct) {
          T* cb = colbuf.data();
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t kh = 0; kh < KH; ++kh)
              for (int64_t kw = 0; kw < KW; ++kw) {
                T* row = cb + ((c * KH + kh) * KW + kw) * cols;
                for (int64_t oh = 0; oh < OH; ++oh) {
                  const int64_t ih = oh * st[0] - pd[0] + kh * dl[0];
                  T* dst = row + oh * OW;
                  if (ih < 0 || ih >= H) {
                    std::fill(dst, dst + OW, T(0));
                    continue;
                  }
                  const T* src = xg + (c * H + ih) * W;
                  for (int64_t ow = 0; ow < OW; ++ow) {
                    const int64_t iw = ow * st[1] - pd[2] + kw * dl[1];
                    dst[ow] = (iw >= 0 && iw < W) ? src[iw] : T(0);
                  }
                }
              }
          b = cb;
        }
        gemm(wp + g * Og * rows, b, yp + (img * O + g * Og) * cols, Og, rows, cols);
      }
  };
}

// A 3-d convolution node's sizes and attributes (the sizes the node's verified types give); nullopt
// for attributes of another rank.
std::optional<cpu::Conv3dDesc> conv3d_desc(const Node& n) {
  const Shape xs = n.inputs[0]->type.shape, ws = n.inputs[1]->type.shape, ys = n.outputs[0]->type.shape;
  const auto st = n.attr_ints("strides", {1, 1, 1}), dl = n.attr_ints("dilations", {1, 1, 1});
  const auto pd = n.attr_ints("padding", {0, 0, 0, 0, 0, 0});
  if (xs.size() != 5 || ws.size() != 5 || ys.size() != 5 || st.size() != 3 || dl.size() != 3 || pd.size() != 6) return std::nullopt;
  cpu::Conv3dDesc d;
  d.N = xs[0], d.C = xs[1], d.D = xs[2], d.H = xs[3], d.W = xs[4];
  d.OC = ys[1], d.OD = ys[2], d.OH = ys[3], d.OW = ys[4];
  d.KD = ws[2], d.KH = ws[3], d.KW = ws[4];
  d.groups = n.attr_i("groups", 1);
  for (size_t i = 0; i < 3; ++i) d.stride[i] = st[i], d.dilation[i] = dl[i], d.pad_lo[i] = pd[2 * i], d.pad_hi[i] = pd[2 * i + 1];
  return d;
}

// 3-d convolution (f32 / f64; video models' Conv3d) as the 2-d one, one output depth slice at a time:
// the slice's vol2col (Cg·KD·KH·KW rows by OH·OW columns: a whole volume's would be hundreds of MB) and
// the same product into a slice buffer, copied to the result's slice. Slices (per image, group and
// output depth) are spread over the OpenMP team, each thread with its own buffers. Each output element
// sums over the reduction rows in order, as the reference kernel does.
template <class T> CoreKernel conv3d_typed(const Node& n, const cpu::Conv3dDesc& d) {
  const int64_t Cg = d.C / d.groups, Og = d.OC / d.groups;
  const int64_t rows = Cg * d.KD * d.KH * d.KW, cols = d.OH * d.OW, slices = d.N * d.groups * d.OD;
  const int x = n.inputs[0]->id, w = n.inputs[1]->id, y = n.outputs[0]->id;
  const bool parallel = slices > 1 && Og * rows * cols * slices >= (int64_t{1} << 20);
  return [=](KernelEnv& e) {
    const T* xp = in_ptr<T>(e, x);
    const T* wp = in_ptr<T>(e, w);
    T* yp = out_ptr<T>(e, y);
#pragma omp parallel if (parallel)
    {
      std::vector<T> colbuf(static_cast<size_t>(rows * cols)), outbuf(static_cast<size_t>(Og * cols));
#pragma omp for schedule(dynamic)
      for (int64_t sidx = 0; sidx < slices; ++sidx) {
        const int64_t img = sidx / (d.groups * d.OD), g = (sidx / d.OD) % d.groups, od = sidx % d.OD;
        const T* xg = xp + (img * d.C + g * Cg) * d.D * d.H * d.W;
        T* cb = colbuf.data();
        for (int64_t c = 0; c < Cg; ++c)
          for (int64_t kd = 0; kd < d.KD; ++kd) {
            const int64_t id = od * d.stride[0] - d.pad_lo[0] + kd * d.dilation[0];
            for (int64_t kh = 0; kh < d.KH; ++kh)
              for (int64_t kw = 0; kw < d.KW; ++kw) {
                T* row = cb + (((c * d.KD + kd) * d.KH + kh) * d.KW + kw) * cols;
                if (id < 0 || id >= d.D) {
                  std::fill(row, row + cols, T(0));
                  continue;
                }
                for (int64_t oh = 0; oh < d.OH; ++oh) {
                  const int64_t ih = oh * d.stride[1] - d.pad_lo[1] + kh * d.dilation[1];
                  T* dst = row + oh * d.OW;
                  if (ih < 0 || ih >= d.H) {
                    std::fill(dst, dst + d.OW, T(0));
                    continue;
                  }
                  const T* src = xg + ((c * d.D + id) * d.H + ih) * d.W;
                  for (int64_t ow = 0; ow < d.OW; ++ow) {
                    const int64_t iw = ow * d.stride[2] - d.pad_lo[2] + kw * d.dilation[2];
                    dst[ow] = (iw >= 0 && iw < d.W) ? src[iw] : T(0);
                  }
                }
              }
          }
        gemm(wp + g * Og * rows, cb, outbuf.data(), Og, rows, cols);
        for (int64_t o = 0; o < Og; ++o)
          std::memcpy(yp + ((img * d.OC + g * Og + o) * d.OD + od) * cols, outbuf.data() + o * cols,
                      static_cast<size_t>(cols) * sizeof(T));
      }
    }
  };
}

// A 3-d f32 convolution of constant weights through oneDNN (its primitive built here, once): several
// times the vol2col product's speed on video models (r3d_18: 0.60 -> 0.114 s a call).
CoreKernel conv3d_library(const Node& n, cpu::Conv3dDesc d) {
  const Value* wv = n.inputs[1];
  if (!wv->constant || n.inputs[0]->type.dtype != DType::f32 || wv->type.dtype != DType::f32 || !cpu::dnnl_available()) return {};
  d.weights = wv->constant->data<float>();
  auto conv = std::make_shared<cpu::Conv3d>(d);
  const int x = n.inputs[0]->id, y = n.outputs[0]->id;
  return [conv, x, y](KernelEnv& e) { conv->run(in_ptr<float>(e, x), out_ptr<float>(e, y)); };
}

CoreKernel make_convolution(const Node& n) {
  const size_t rank = n.inputs[0]->type.shape.size();
  if (rank == 4) {
    switch (n.inputs[0]->type.dtype) {
      case DType::f32: return conv2d_typed<float>(n);
      case DType::f64: return conv2d_typed<double>(n);
      default: return {};
    }
  }
  const std::optional<cpu::Conv3dDesc> d = rank == 5 ? conv3d_desc(n) : std::nullopt;
  if (!d) return {};
  if (CoreKernel k = conv3d_library(n, *d)) return k;
  switch (n.inputs[0]->type.dtype) {
    case DType::f32: return conv3d_typed<float>(n, *d);
    case DType::f64: return conv3d_typed<double>(n, *d);
    default: return {};
  }
}

// The elementwise primitives of one or two operands (the table's kinds, core_ops.def).
bool is_unary(std::optional<CoreOp> op) { return op && core_op_info(*op).kind == CoreKind::unary; }
bool is_binary(std::optional<CoreOp> op) { return op && core_op_info(*op).kind == CoreKind::binary; }

CoreKernel make_elementwise(const Node& n, const ViewMap& views) {
  const CoreOp op = *n.op->core;  // (is_unary or is_binary: a primitive)
  const int64_t count = numel_of(n.outputs[0]);
  CoreKernel k;
  with_type(n.outputs[0]->type.dtype, [&](auto tag) {
    using T = Tag<decltype(tag)>;
    if (is_unary(op)) {
      if (!any_view(n, views)) k = unary_typed<T>(op, n.inputs[0]->id, n.outputs[0]->id, count);
    } else if (!any_view(n, views)) {
      k = binary_typed<T>(op, n.inputs[0]->id, n.inputs[1]->id, n.outputs[0]->id, count);
    } else {
      const std::array<PointwiseOperand, 2> ops = {operand_access(n.inputs[0], views), operand_access(n.inputs[1], views)};
      auto w = std::make_shared<const Walk<3>>(pointwise_walk<3>(n, ops));
      k = binary_typed<T>(op, ops[0].id, ops[1].id, n.outputs[0]->id, count, w);
    }
  });
  return k;
}

}  // namespace

CoreKernel make_channels_last_kernel(const Node& n) {
  if (!runs_channels_last(n)) return {};
  if (!can_run_channels_last(n))
    throw Error(Location{.node = n.name, .op = n.op->name},
                "layout nhwc is only for a pooling over H and W or a concatenation along C of f32 [N, C, H, W] values");
  if (is_core_op(n, CoreOp::concatenate)) return concatenate_nhwc_kernel(n);
  const Shape in = static_shape(n.inputs[0]), out = static_shape(n.outputs[0]);
  const auto window = n.attr_ints("window");
  const auto strides = n.attr_ints("strides", std::vector<int64_t>(4, 1));
  const auto dil = n.attr_ints("dilations", std::vector<int64_t>(4, 1));
  const auto pad = n.attr_ints("padding", std::vector<int64_t>(8, 0));
  const auto kind = reduce_kind(n);
  if (!kind) throw Error(Location{.node = n.name, .op = n.op->name}, "unknown reduction kind");
  switch (*kind) {
    case RK::sum: return pooling_nhwc_kernel<float, RK::sum>(n, in, out, window, strides, dil, pad);
    case RK::max: return pooling_nhwc_kernel<float, RK::max>(n, in, out, window, strides, dil, pad);
    case RK::min: return pooling_nhwc_kernel<float, RK::min>(n, in, out, window, strides, dil, pad);
    case RK::prod: return pooling_nhwc_kernel<float, RK::prod>(n, in, out, window, strides, dil, pad);
  }
  return {};
}

StridedView broadcast_view(const Node& n) {
  const Shape in = static_shape(n.inputs[0]), out = static_shape(n.outputs[0]);
  const std::vector<int64_t> dims = n.attr_ints("dims");
  const auto ist = row_strides(in);
  StridedView v;
  v.src_id = n.inputs[0]->id;
  v.strides.assign(out.size(), 0);
  for (size_t i = 0; i < dims.size(); ++i)
    if (!(in[i] == 1 && out[dims[i]] != 1)) v.strides[dims[i]] = ist[i];
  return v;
}

bool is_elementwise_unary(const Node& n) { return is_unary(n.op->core); }

CoreKernel make_unary_on_source(const Node& n, const StridedView& operand, int64_t count) {
  CoreKernel k;
  with_type(n.outputs[0]->type.dtype, [&](auto tag) {
    using T = Tag<decltype(tag)>;
    k = unary_typed<T>(*n.op->core, operand.src_id, n.outputs[0]->id, count);
  });
  return k;
}

bool reads_views(const Node& n) {
  return is_binary(n.op->core) || is_core_op(n, CoreOp::compare) || is_core_op(n, CoreOp::select) ||
         is_core_op(n, CoreOp::gather) || is_core_op(n, CoreOp::scatter);
}

void materialize_view(const StridedView& v, const uint8_t* src, const Shape& shape, int elem_bytes, uint8_t* dst) {
  CopyPlan p;
  p.shape = shape;
  p.src = v.strides;
  p.dst = row_strides(shape);
  p = simplify(p);
  with_size(elem_bytes, [&](auto tag) {
    using U = Tag<decltype(tag)>;
    run_copy(p, reinterpret_cast<const U*>(src), reinterpret_cast<U*>(dst));
  });
}

CoreKernel make_core_kernel(const Node& n, const ViewMap& views) {
  if (!n.op->core) return {};
  const std::optional<CoreOp> op = n.op->core;
  if (!reads_views(n) && any_view(n, views)) return {};
  try {
    if (is_unary(op) || is_binary(op)) return make_elementwise(n, views);
    switch (*op) {
      case CoreOp::compare: return make_compare(n, views);
      case CoreOp::select: return make_select(n, views);
      case CoreOp::convert: return make_convert(n);
      case CoreOp::broadcast_in_dim: return make_broadcast(n);
      case CoreOp::transpose: return make_transpose(n);
      case CoreOp::slice: return make_slice(n);
      case CoreOp::pad: return make_pad(n);
      case CoreOp::concatenate: return make_concatenate(n);
      case CoreOp::gather: return make_gather(n, views);
      case CoreOp::scatter: return make_scatter(n, views);
      case CoreOp::iota: return make_iota(n);
      case CoreOp::reduce: return make_reduce(n);
      case CoreOp::reduce_window: return make_reduce_window(n);
      case CoreOp::dot_general: return make_dot(n);
      case CoreOp::convolution: return make_convolution(n);
      default: break;  // no typed kernel: the reference kernel runs it
    }
  } catch (const Error&) {
    return {};  // an attribute the typed kernel cannot read: the reference kernel reports it
  }
  return {};
}

bool can_run_in_place(const Node& n, int input) {
  if (!n.op->core || n.outputs.size() != 1 || !n.has_input(input)) return false;
  const std::optional<CoreOp> op = n.op->core;
  const Value* in = n.inputs[input];
  const Value* out = n.outputs[0];
  // (symbolic types: the same sizes for every binding, not merely both symbolic in the same places)
  if (dtype_size(in->type.dtype) != dtype_size(out->type.dtype) || in->type.shape != out->type.shape ||
      in->type.sym != out->type.sym)
    return false;
  if (is_unary(op) || is_binary(op)) return true;
  if (op == CoreOp::select) return input > 0;
  if (op == CoreOp::convert) return in->type.dtype == out->type.dtype;
  // a scatter over its data (the typed kernel's case: no reduction, the index i64 or i32): only the
  // updated positions are written, after every index is checked
  if (op == CoreOp::scatter)
    return input == 0 && n.attr_s("reduction", "none") == "none" &&
           (n.inputs[1]->type.dtype == DType::i64 || n.inputs[1]->type.dtype == DType::i32);
  return false;
}

}  // namespace tessel
