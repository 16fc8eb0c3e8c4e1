// Op family: matrix products (MatMul, Gemm, MatMulInteger, Einsum) and Det, with a fast f32 path.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <numeric>
#include <string>

#include "tessel/ops/kernel_util.h"
#include "tessel/ir/op_registry.h"
#include "tessel/ops/decompose_util.h"
#include "tessel/ops/sym_util.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

// C[m,n] = sum_k A[m,k] * B[k,n] for one matrix pair; f32 accumulates every output row in double
// so the reference stays accurate for long K.
void gemm_f32(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n,
              std::vector<double>& acc) {
  acc.assign(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0);
    double* ap = acc.data();
    for (int64_t p = 0; p < k; ++p) {
      // no skipping of zero elements: 0 * inf and 0 * NaN are NaN (the random-graph tester found the
      // reference dropping a NaN of B where A's element was 0)
      const double av = a[i * k + p];
      const float* bp = b + p * n;
      for (int64_t j = 0; j < n; ++j) ap[j] += av * static_cast<double>(bp[j]);
    }
    for (int64_t j = 0; j < n; ++j) c[i * n + j] = static_cast<float>(ap[j]);
  }
}

// numpy matmul shape rule over dims. Dims may be unknown or symbolic; mismatched known K is an error,
// and so are batch dims that do not broadcast (refused when the symbols do not decide it).
struct MatMulDims {
  Dims out;    // final output shape
  Dims batch;  // broadcast batch shape
  Dims a_batch, b_batch;
  Dim m = 1, k = 1, n = 1;
};

MatMulDims matmul_dims(const Dims& a, const Dims& b) {
  if (a.empty() || b.empty())
    fail("MatMul operands must have rank >= 1, got {} and {}", dims_str(a), dims_str(b));
  MatMulDims s;
  Dims a2 = a, b2 = b;
  const bool a1 = a.size() == 1, b1 = b.size() == 1;
  if (a1) a2.insert(a2.begin(), 1);
  if (b1) b2.push_back(1);
  const Dim ka = a2[a2.size() - 1], kb = b2[b2.size() - 2];
  s.k = ka == kb ? ka : merge_equal_dims(ka, kb, fmt::format("MatMul inner dimensions differ: {} and {}", dims_str(a), dims_str(b)));
  s.m = a2[a2.size() - 2];
  s.n = b2[b2.size() - 1];
  s.a_batch.assign(a2.begin(), a2.end() - 2);
  s.b_batch.assign(b2.begin(), b2.end() - 2);
  // broadcast_dims handles unknown dims conservatively only when both known; do it by hand.
  const size_t r = std::max(s.a_batch.size(), s.b_batch.size());
  s.batch.assign(r, 1);
  for (size_t i = 0; i < r; ++i) {
    const Dim da = i + s.a_batch.size() >= r ? s.a_batch[i + s.a_batch.size() - r] : Dim(1);
    const Dim db = i + s.b_batch.size() >= r ? s.b_batch[i + s.b_batch.size() - r] : Dim(1);
    if (da == 1)
      s.batch[i] = db;
    else if (db == 1 || da == db)
      s.batch[i] = da;
    else
      s.batch[i] = merge_equal_dims(da, db, fmt::format("MatMul batch dimensions do not broadcast: {} and {}",
                                                        dims_str(a), dims_str(b)));
  }
  s.out = s.batch;
  if (!a1) s.out.push_back(s.m);
  if (!b1) s.out.push_back(s.n);
  return s;
}

// The same for the static shapes the kernels see.
struct MatMulShape {
  Shape out, batch, a_batch, b_batch;
  int64_t m = 1, k = 1, n = 1;
};

MatMulShape matmul_shape(const Shape& a, const Shape& b) {
  const MatMulDims d = matmul_dims(dims_of(a), dims_of(b));
  return {static_shape(d.out), static_shape(d.batch), static_shape(d.a_batch), static_shape(d.b_batch), d.m, d.k, d.n};
}

bool is_matmul_dtype(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16 || is_int(t);
}

// Batched matmul with numpy semantics; the output dtype is `out_dt`. f32 takes the fast path,
// other floats go through double and integers through wrapping int64.
Tensor batched_matmul(const Tensor& a, const Tensor& b, DType out_dt) {
  MatMulShape s = matmul_shape(a.shape(), b.shape());
  Tensor out(out_dt, s.out);
  const int64_t m = s.m, k = s.k, n = s.n;
  const std::vector<int64_t> ia = broadcast_index(s.a_batch, s.batch);
  const std::vector<int64_t> ib = broadcast_index(s.b_batch, s.batch);
  const int64_t nb = static_cast<int64_t>(ia.size());
  if (a.dtype() == DType::f32 && b.dtype() == DType::f32 && out_dt == DType::f32) {
    std::vector<double> acc;
    for (int64_t t = 0; t < nb; ++t)
      gemm_f32(a.data<float>() + ia[t] * m * k, b.data<float>() + ib[t] * k * n,
               out.data<float>() + t * m * n, m, k, n, acc);
    return out;
  }
  if (is_float(a.dtype())) {
    const std::vector<double> av = a.to_f64(), bv = b.to_f64();
    std::vector<double> ov(static_cast<size_t>(out.numel()));
    for (int64_t t = 0; t < nb; ++t)
      gemm_f64(av.data() + ia[t] * m * k, bv.data() + ib[t] * k * n, ov.data() + t * m * n, m, k,
               n);
    return Tensor::from_f64(out_dt, s.out, ov);
  }
  const std::vector<int64_t> av = a.to_i64(), bv = b.to_i64();
  std::vector<int64_t> ov(static_cast<size_t>(out.numel()));
  for (int64_t t = 0; t < nb; ++t)
    gemm_i64(av.data() + ia[t] * m * k, bv.data() + ib[t] * k * n, ov.data() + t * m * n, m, k, n);
  return Tensor::from_i64(out_dt, s.out, ov);
}

// ---- decomposition helpers ----------------------------------------------------------------------


// numpy matmul as dot_general: 1-D operands become matrices, batch dims are broadcast explicitly,
// then one batched contraction of a's last dim with b's second-to-last, reshaped to `want`.
Value* core_matmul(CoreBuilder& b, Value* x, Value* y, const DimList& want) {
  auto as_matrix = [&](Value* v, bool row) {
    if (v->type.shape.size() != 1) return v;
    const Dim k = v->type.dims()[0];
    return b.reshape(v, row ? Dims{1, k} : Dims{k, 1});
  };
  x = as_matrix(x, true);
  y = as_matrix(y, false);
  const Dims xs = x->type.dims();
  const Dims ys = y->type.dims();
  Dims batch = broadcast_dims(Dims(xs.begin(), xs.end() - 2), Dims(ys.begin(), ys.end() - 2));
  const int64_t nb = static_cast<int64_t>(batch.size());
  Dims x_full = batch, y_full = batch;
  x_full.insert(x_full.end(), xs.end() - 2, xs.end());
  y_full.insert(y_full.end(), ys.end() - 2, ys.end());
  std::vector<int64_t> batch_dims(static_cast<size_t>(nb));
  std::iota(batch_dims.begin(), batch_dims.end(), 0);
  Value* r = b.emit(CoreOp::dot_general, {b.broadcast_to(x, x_full), b.broadcast_to(y, y_full)},
                    {{"lhs_batch", batch_dims},
                     {"rhs_batch", batch_dims},
                     {"lhs_contract", std::vector<int64_t>{nb + 1}},
                     {"rhs_contract", std::vector<int64_t>{nb}}});
  return b.reshape(r, want);
}

Cost matmul_cost(const Node& n) {
  Cost c;
  if (!n.inputs[0] || !n.inputs[1] || !n.outputs[0]) return c;
  const Shape& a = n.inputs[0]->type.shape;
  const int64_t k = a.empty() ? 1 : a.back();
  const int64_t outn = shape_numel(n.outputs[0]->type.shape);
  c.flops = 2.0 * static_cast<double>(std::max<int64_t>(k, 1)) *
            static_cast<double>(std::max<int64_t>(outn, 0));
  for (const Value* v : n.inputs)
    if (v) c.bytes += std::max<int64_t>(shape_numel(v->type.shape), 0) * dtype_size(v->type.dtype);
  c.bytes += std::max<int64_t>(outn, 0) * dtype_size(n.outputs[0]->type.dtype);
  return c;
}

OpDef matmul_def() {
  OpDef d;
  d.name = "MatMul";
  d.min_inputs = d.max_inputs = 2;
  d.since = 1;
  d.fusion = FusionKind::matmul;
  d.cost = matmul_cost;
  d.infer = [](InferCtx& c) {
    const TensorType& a = c.in(0);
    const TensorType& b = c.in(1);
    if (a.dtype != b.dtype)
      fail("MatMul operands have different dtypes {} and {}", dtype_name(a.dtype),
           dtype_name(b.dtype));
    if (!is_matmul_dtype(a.dtype)) unsupported("MatMul on {}", dtype_name(a.dtype));
    c.set_out(0, TensorType::of(a.dtype, matmul_dims(a.dims(), b.dims()).out));
  };
  d.kernel = [](KernelCtx& c) { c.set_out(0, batched_matmul(c.in(0), c.in(1), c.in(0).dtype())); };
  d.decompose = [](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    return {core_matmul(b, n.inputs[0], n.inputs[1], n.outputs[0]->type.dims())};
  };
  return d;
}

// ---- Gemm ---------------------------------------------------------------------------------------

// alpha * op(A) op(B) + beta * C. Integer Gemm with a scale computes the scaled sum in f64 and
// truncates (the kernel's rule); narrow floats compute in f32.
std::vector<Value*> decompose_gemm(CoreBuilder& b, const Node& n) {
  const DType dt = n.outputs[0]->type.dtype;
  const double alpha = n.attr_f("alpha", 1.0), beta = n.attr_f("beta", 1.0);
  const bool has_c = n.has_input(2);
  const bool int_scaled = is_int(dt) && (alpha != 1.0 || (has_c && beta != 1.0));
  const DType ct = int_scaled ? DType::f64 : math_type(dt);
  auto operand = [&](int i) { return is_int(dt) ? n.inputs[i] : b.convert(n.inputs[i], ct); };
  const int64_t ka = n.attr_i("transA", 0) != 0 ? 0 : 1, kb = n.attr_i("transB", 0) != 0 ? 1 : 0;
  Value* y = b.emit(CoreOp::dot_general, {operand(0), operand(1)},
                    {{"lhs_contract", std::vector<int64_t>{ka}}, {"rhs_contract", std::vector<int64_t>{kb}}});
  y = b.convert(y, ct);
  if (alpha != 1.0) y = b.mul(y, b.scalar(ct, alpha));
  if (has_c) {
    Value* c = b.convert(n.inputs[2], ct);
    if (beta != 1.0) c = b.mul(c, b.scalar(ct, beta));
    y = b.add(y, b.broadcast_to(c, y->type.dims()));
  }
  return {b.convert(y, dt)};
}

OpDef gemm_def() {
  OpDef d;
  d.name = "Gemm";
  d.min_inputs = 2;
  d.max_inputs = 3;
  d.since = 7;  // 7..13 only differ in allowed dtypes and C becoming optional (11)
  d.fusion = FusionKind::matmul;
  d.cost = [](const Node& n) {
    Cost c = matmul_cost(n);
    const Shape& a = n.inputs[0]->type.shape;
    if (a.size() == 2 && n.attr_i("transA", 0) != 0 && a.back() > 0)
      c.flops =
          c.flops / static_cast<double>(a.back()) * static_cast<double>(std::max<int64_t>(a[0], 1));
    return c;
  };
  // `broadcast` only exists before opset 7; the upgrade drops it since C always broadcasts now.
  d.attrs = {{"alpha", AttrKind::f},
             {"beta", AttrKind::f},
             {"transA", AttrKind::i},
             {"transB", AttrKind::i},
             {"broadcast", AttrKind::i}};
  d.upgrade = [](Graph&, Node& n, int) { n.attrs.erase("broadcast"); };
  d.infer = [](InferCtx& c) {
    if (c.node().has_attr("broadcast")) fail("Gemm attribute 'broadcast' was removed in opset 7");
    const TensorType& a = c.in(0);
    const TensorType& b = c.in(1);
    const Dims ad = a.dims(), bd = b.dims();
    if (ad.size() != 2 || bd.size() != 2)
      fail("Gemm operands must be 2-D, got {} and {}", dims_str(ad), dims_str(bd));
    if (a.dtype != b.dtype) fail("Gemm operands have different dtypes");
    if (!is_matmul_dtype(a.dtype)) unsupported("Gemm on {}", dtype_name(a.dtype));
    const bool ta = c.node().attr_i("transA", 0) != 0, tb = c.node().attr_i("transB", 0) != 0;
    const Dim m = ta ? ad[1] : ad[0], ka = ta ? ad[0] : ad[1];
    const Dim kb = tb ? bd[1] : bd[0], n = tb ? bd[0] : bd[1];
    if (!(ka == kb)) merge_equal_dims(ka, kb, fmt::format("Gemm inner dimensions differ: A {} B {}", dims_str(ad), dims_str(bd)));
    if (c.has_in(2)) {
      const Dims cs = c.in(2).dims();
      if (cs.size() > 2) fail("Gemm C must have rank <= 2, got {}", dims_str(cs));
      if (!dims_unknown(cs) && !dim_unknown(m) && !dim_unknown(n)) broadcast_dims(cs, {m, n});
    }
    c.set_out(0, TensorType::of(a.dtype, {m, n}));
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& a = c.in(0);
    const Tensor& b = c.in(1);
    const bool ta = c.node().attr_i("transA", 0) != 0, tb = c.node().attr_i("transB", 0) != 0;
    const double alpha = c.node().attr_f("alpha", 1.0), beta = c.node().attr_f("beta", 1.0);
    const int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
    const int64_t n = tb ? b.dim(0) : b.dim(1);
    if ((tb ? b.dim(1) : b.dim(0)) != k) fail("Gemm inner dimensions differ");
    const DType dt = a.dtype();
    Tensor out(dt, {m, n});
    std::vector<int64_t> cidx;
    if (c.has_in(2)) cidx = broadcast_index(c.in(2).shape(), {m, n});
    if (dt == DType::f32) {
      // Transpose into contiguous row-major copies so the fast kernel applies.
      const float* ap = a.data<float>();
      const float* bp = b.data<float>();
      std::vector<float> at, bt;
      if (ta) {
        at.resize(static_cast<size_t>(m * k));
        for (int64_t i = 0; i < m; ++i)
          for (int64_t p = 0; p < k; ++p) at[i * k + p] = ap[p * m + i];
        ap = at.data();
      }
      if (tb) {
        bt.resize(static_cast<size_t>(k * n));
        for (int64_t p = 0; p < k; ++p)
          for (int64_t j = 0; j < n; ++j) bt[p * n + j] = bp[j * k + p];
        bp = bt.data();
      }
      std::vector<float> prod(static_cast<size_t>(m * n));
      std::vector<double> acc;
      gemm_f32(ap, bp, prod.data(), m, k, n, acc);
      float* o = out.data<float>();
      if (c.has_in(2) && c.in(2).dtype() != DType::f32) fail("Gemm C dtype differs from A");
      const float* cv = c.has_in(2) ? c.in(2).data<float>() : nullptr;
      for (int64_t i = 0; i < m * n; ++i) {
        double v = alpha * static_cast<double>(prod[i]);
        if (cv) v += beta * static_cast<double>(cv[cidx[i]]);
        o[i] = static_cast<float>(v);
      }
      c.set_out(0, std::move(out));
      return;
    }
    const bool fl = is_float(dt);
    const std::vector<double> af = fl ? a.to_f64() : std::vector<double>{};
    const std::vector<double> bf = fl ? b.to_f64() : std::vector<double>{};
    const std::vector<int64_t> ai = fl ? std::vector<int64_t>{} : a.to_i64();
    const std::vector<int64_t> bi = fl ? std::vector<int64_t>{} : b.to_i64();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        if (fl) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p)
            s += af[ta ? p * m + i : i * k + p] * bf[tb ? j * k + p : p * n + j];
          s *= alpha;
          if (c.has_in(2)) s += beta * c.in(2).get_f(cidx[i * n + j]);
          out.set_f(i * n + j, s);
        } else {
          int64_t s = 0;
          for (int64_t p = 0; p < k; ++p)
            s = wrap_add(s,
                         wrap_mul(ai[ta ? p * m + i : i * k + p], bi[tb ? j * k + p : p * n + j]));
          double v = alpha * static_cast<double>(s);
          if (c.has_in(2)) v += beta * static_cast<double>(c.in(2).get_i(cidx[i * n + j]));
          out.set_i(i * n + j, static_cast<int64_t>(v));
        }
      }
    c.set_out(0, std::move(out));
  };
  return d;
}

// ---- MatMulInteger ------------------------------------------------------------------------------

// Both operands widened to i32 minus their zero points (a's per row, b's per column), then a
// numpy matmul in i32 (wrapping like the kernel's int64 sum truncated to i32).
std::vector<Value*> decompose_matmul_integer(CoreBuilder& b, const Node& n) {
  auto shifted = [&](int i, int zp, bool per_row) {
    Value* x = b.convert(n.inputs[i], DType::i32);
    if (!n.has_input(zp)) return x;
    Value* z = b.convert(n.inputs[zp], DType::i32);
    const int64_t cnt = shape_numel(z->type.shape);
    z = b.reshape(z, cnt == 1 ? Shape{} : per_row ? Shape{cnt, 1} : Shape{cnt});
    return b.sub(x, b.broadcast_to(z, x->type.shape));
  };
  Value* a = shifted(0, 2, n.inputs[0]->type.shape.size() >= 2);
  Value* c = shifted(1, 3, false);
  return {core_matmul(b, a, c, n.outputs[0]->type.dims())};
}

OpDef matmul_integer_def() {
  OpDef d;
  d.name = "MatMulInteger";
  d.min_inputs = 2;
  d.max_inputs = 4;
  d.since = 10;
  d.fusion = FusionKind::matmul;
  d.cost = matmul_cost;
  d.infer = [](InferCtx& c) {
    for (int i : {0, 1})
      if (c.in(i).dtype != DType::u8 && c.in(i).dtype != DType::i8)
        fail("MatMulInteger input {} must be uint8 or int8, got {}", i, dtype_name(c.in(i).dtype));
    c.set_out(0, TensorType::of(DType::i32, matmul_dims(c.in(0).dims(), c.in(1).dims()).out));
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& a = c.in(0);
    const Tensor& b = c.in(1);
    MatMulShape s = matmul_shape(a.shape(), b.shape());
    // Subtract the zero points into int64 copies; a's zero point is scalar or per row (M),
    // b's is scalar or per column (N).
    auto shifted = [&](const Tensor& x, int zp_in, bool per_row) {
      std::vector<int64_t> v = x.to_i64();
      if (!c.has_in(zp_in)) return v;
      const Tensor& zp = c.in(zp_in);
      if (zp.dtype() != x.dtype()) fail("zero point dtype differs from its input");
      const int64_t inner = x.rank() >= 1 ? x.dim(x.rank() - 1) : 1;
      const int64_t rows = x.rank() >= 2 ? x.dim(x.rank() - 2) : 1;
      const int64_t along = per_row ? rows : inner;
      if (zp.numel() != 1 && zp.numel() != along)
        fail("zero point has {} elements, expected 1 or {}", zp.numel(), along);
      for (size_t i = 0; i < v.size(); ++i) {
        int64_t idx = 0;
        if (zp.numel() != 1) {
          const int64_t pos = static_cast<int64_t>(i);
          idx = per_row ? (pos / inner) % rows : pos % inner;
        }
        v[i] -= zp.get_i(idx);
      }
      return v;
    };
    const bool a1 = a.rank() == 1;
    const std::vector<int64_t> av = shifted(a, 2, !a1);
    const std::vector<int64_t> bv = shifted(b, 3, false);
    const std::vector<int64_t> ia = broadcast_index(s.a_batch, s.batch);
    const std::vector<int64_t> ib = broadcast_index(s.b_batch, s.batch);
    std::vector<int64_t> ov(static_cast<size_t>(shape_numel(s.out)));
    for (size_t t = 0; t < ia.size(); ++t)
      gemm_i64(av.data() + ia[t] * s.m * s.k, bv.data() + ib[t] * s.k * s.n,
               ov.data() + t * s.m * s.n, s.m, s.k, s.n);
    c.set_out(0, Tensor::from_i64(DType::i32, s.out, ov));
  };
  return d;
}

// ---- Einsum -------------------------------------------------------------------------------------

// A parsed equation. Labels are letters; the ellipsis becomes the pseudo-labels 256.. (one per
// broadcast dim, right-aligned across operands).
struct EinsumPlan {
  std::vector<std::vector<int>> in_labels;  // per input, one label per dim
  std::vector<int> out_labels;
  std::map<int, int64_t> size;  // label -> extent
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts(1);
  for (char ch : s) {
    if (ch == sep)
      parts.emplace_back();
    else
      parts.back() += ch;
  }
  return parts;
}

EinsumPlan plan_einsum(const std::string& eq_raw, const std::vector<Shape>& shapes) {
  std::string eq;
  for (char ch : eq_raw)
    if (ch != ' ') eq += ch;
  std::string lhs = eq, rhs;
  const bool explicit_out = eq.find("->") != std::string::npos;
  if (explicit_out) {
    lhs = eq.substr(0, eq.find("->"));
    rhs = eq.substr(eq.find("->") + 2);
  }
  std::vector<std::string> terms = split(lhs, ',');
  if (terms.size() != shapes.size())
    fail("Einsum equation '{}' has {} operands but {} inputs were given", eq_raw, terms.size(),
         shapes.size());
  EinsumPlan p;
  // Parse each term into letters with an optional ellipsis marker (-1).
  auto parse = [&](const std::string& t) {
    std::vector<int> out;
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i] == '.') {
        if (t.compare(i, 3, "...") != 0) fail("Einsum: bad ellipsis in '{}'", eq_raw);
        for (int x : out)
          if (x == -1) fail("Einsum: two ellipses in one term of '{}'", eq_raw);
        out.push_back(-1);
        i += 2;
      } else if (std::isalpha(static_cast<unsigned char>(t[i]))) {
        out.push_back(static_cast<unsigned char>(t[i]));
      } else {
        fail("Einsum: unexpected character '{}' in '{}'", t[i], eq_raw);
      }
    }
    return out;
  };
  int ell_rank = 0;
  std::vector<std::vector<int>> raw(terms.size());
  for (size_t i = 0; i < terms.size(); ++i) {
    raw[i] = parse(terms[i]);
    const bool has_ell = std::count(raw[i].begin(), raw[i].end(), -1) > 0;
    const int named = static_cast<int>(raw[i].size()) - (has_ell ? 1 : 0);
    const int r = static_cast<int>(shapes[i].size());
    if (has_ell ? r < named : r != named)
      fail("Einsum operand {} has rank {} but term '{}' needs {}", i, r, terms[i], named);
    if (has_ell) ell_rank = std::max(ell_rank, r - named);
  }
  std::map<int, int> count;
  for (size_t i = 0; i < terms.size(); ++i) {
    const int r = static_cast<int>(shapes[i].size());
    const int named =
        static_cast<int>(raw[i].size()) - (std::count(raw[i].begin(), raw[i].end(), -1) ? 1 : 0);
    const int er = r - named;
    std::vector<int> labels;
    for (int x : raw[i]) {
      if (x == -1) {
        for (int e = 0; e < er; ++e) labels.push_back(256 + ell_rank - er + e);
      } else {
        labels.push_back(x);
        ++count[x];
      }
    }
    for (size_t dpos = 0; dpos < labels.size(); ++dpos) {
      const int l = labels[dpos];
      const int64_t ext = shapes[i][dpos];
      auto it = p.size.find(l);
      if (it == p.size.end()) {
        p.size[l] = ext;
      } else if (it->second != ext) {
        if (l >= 256 && (it->second == 1 || ext == 1))
          it->second = std::max(it->second, ext);
        else
          fail("Einsum: label '{}' has extents {} and {}",
               l < 256 ? std::string(1, static_cast<char>(l)) : "...", it->second, ext);
      }
    }
    p.in_labels.push_back(std::move(labels));
  }
  if (explicit_out) {
    std::vector<int> o = parse(rhs);
    for (int x : o) {
      if (x == -1) {
        for (int e = 0; e < ell_rank; ++e) p.out_labels.push_back(256 + e);
      } else {
        if (!p.size.count(x))
          fail("Einsum: output label '{}' does not appear in the inputs", static_cast<char>(x));
        if (std::count(o.begin(), o.end(), x) > 1)
          fail("Einsum: output label '{}' repeated", static_cast<char>(x));
        p.out_labels.push_back(x);
      }
    }
  } else {
    for (int e = 0; e < ell_rank; ++e) p.out_labels.push_back(256 + e);
    for (auto [l, n] : count)
      if (n == 1) p.out_labels.push_back(l);  // std::map iterates letters alphabetically
  }
  for (int e = 0; e < ell_rank; ++e)
    if (!p.size.count(256 + e)) p.size[256 + e] = 1;
  return p;
}

// Einsum as core ops: per operand, repeated labels take the diagonal (select on an iota mask, then
// a sum), every dim is broadcast to its label's extent (ellipsis dims of size 1) and labels no
// other operand nor the output uses are summed; then the operands are folded left to right with
// one dot_general each (shared labels still needed later are batch dims, the others are
// contracted), and a transpose puts the labels in output order.
std::vector<Value*> decompose_einsum(CoreBuilder& b, const Node& n) {
  std::vector<Shape> shapes;
  for (const Value* v : n.inputs) shapes.push_back(v->type.shape);
  const EinsumPlan p = plan_einsum(n.attr_s("equation"), shapes);
  struct Term {
    Value* v;
    std::vector<int> labels;
  };
  auto pos = [](const std::vector<int>& ls, int l) {
    return static_cast<int64_t>(std::find(ls.begin(), ls.end(), l) - ls.begin());
  };
  auto has = [&](const std::vector<int>& ls, int l) { return pos(ls, l) < static_cast<int64_t>(ls.size()); };
  std::vector<Term> terms;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    Term t{n.inputs[i], p.in_labels[i]};
    for (size_t d = 0; d < t.labels.size(); ++d) {
      const int64_t e = pos(std::vector<int>(t.labels.begin() + d + 1, t.labels.end()), t.labels[d]);
      if (d + 1 + e >= t.labels.size()) continue;
      const int64_t j = static_cast<int64_t>(d + 1) + e;
      const Shape& s = t.v->type.shape;
      Value* on_diag = b.compare("eq", b.iota(DType::i64, s, static_cast<int64_t>(d)), b.iota(DType::i64, s, j));
      t.v = b.reduce(b.select(on_diag, t.v, b.full(t.v->type.dtype, s, 0)), "sum", {j}, false);
      t.labels.erase(t.labels.begin() + j);
      --d;  // the label may repeat a third time
    }
    Shape full;
    for (int l : t.labels) full.push_back(p.size.at(l));
    t.v = b.broadcast_to(t.v, full);
    terms.push_back(std::move(t));
  }
  // Is label l used by the output or by a term other than `self`, from term `from` on?
  auto used_elsewhere = [&](int l, size_t self, size_t from) {
    if (has(p.out_labels, l)) return true;
    for (size_t k = from; k < terms.size(); ++k)
      if (k != self && has(terms[k].labels, l)) return true;
    return false;
  };
  for (size_t i = 0; i < terms.size(); ++i) {
    std::vector<int64_t> axes;
    std::vector<int> kept;
    for (size_t d = 0; d < terms[i].labels.size(); ++d) {
      if (used_elsewhere(terms[i].labels[d], i, 0))
        kept.push_back(terms[i].labels[d]);
      else
        axes.push_back(static_cast<int64_t>(d));
    }
    if (!axes.empty()) terms[i] = {b.reduce(terms[i].v, "sum", axes, false), kept};
  }
  Term cur = terms[0];
  for (size_t k = 1; k < terms.size(); ++k) {
    const Term& o = terms[k];
    std::vector<int64_t> lb, rb, lc, rc;
    std::vector<int> batch, lfree, rfree;
    for (int l : cur.labels) {
      if (!has(o.labels, l)) {
        lfree.push_back(l);
      } else if (used_elsewhere(l, k, k + 1)) {
        batch.push_back(l);
        lb.push_back(pos(cur.labels, l));
        rb.push_back(pos(o.labels, l));
      } else {
        lc.push_back(pos(cur.labels, l));
        rc.push_back(pos(o.labels, l));
      }
    }
    for (int l : o.labels)
      if (!has(cur.labels, l)) rfree.push_back(l);
    cur.v = b.emit(CoreOp::dot_general, {cur.v, o.v},
                   {{"lhs_batch", lb}, {"rhs_batch", rb}, {"lhs_contract", lc}, {"rhs_contract", rc}});
    cur.labels = batch;
    cur.labels.insert(cur.labels.end(), lfree.begin(), lfree.end());
    cur.labels.insert(cur.labels.end(), rfree.begin(), rfree.end());
  }
  std::vector<int64_t> perm;
  for (int l : p.out_labels) perm.push_back(pos(cur.labels, l));
  return {b.reshape(b.transpose(cur.v, perm), n.outputs[0]->type.shape)};
}

OpDef einsum_def() {
  OpDef d;
  d.name = "Einsum";
  d.min_inputs = 1;
  d.max_inputs = -1;
  d.since = 12;
  d.attrs = {{"equation", AttrKind::s, true}};
  d.infer = [](InferCtx& c) {
    std::vector<Shape> shapes;
    for (int i = 0; i < c.num_inputs(); ++i) {
      if (c.in(i).dtype != c.in(0).dtype) fail("Einsum inputs have different dtypes");
      shapes.push_back(c.in(i).shape);
    }
    EinsumPlan p = plan_einsum(c.node().attr_s("equation"), shapes);
    Shape out;
    for (int l : p.out_labels) out.push_back(p.size.at(l));
    c.set_out(0, {c.in(0).dtype, out});
  };
  d.kernel = [](KernelCtx& c) {
    std::vector<Shape> shapes;
    for (int i = 0; i < c.num_inputs(); ++i) shapes.push_back(c.in(i).shape());
    EinsumPlan p = plan_einsum(c.node().attr_s("equation"), shapes);
    // Loop labels: output labels first, then the summed ones.
    std::vector<int> loop = p.out_labels;
    for (const auto& [l, ext] : p.size)
      if (std::find(loop.begin(), loop.end(), l) == loop.end()) loop.push_back(l);
    const size_t nl = loop.size(), ni = p.in_labels.size();
    std::vector<int64_t> ext(nl);
    for (size_t j = 0; j < nl; ++j) ext[j] = p.size.at(loop[j]);
    // Per input, the element stride of each loop label (summed over repeated labels, which
    // walks the diagonal; zero for broadcast ellipsis dims of extent 1).
    std::vector<std::vector<int64_t>> st(ni, std::vector<int64_t>(nl, 0));
    for (size_t i = 0; i < ni; ++i) {
      const std::vector<int64_t> s = strides_of(shapes[i]);
      for (size_t dpos = 0; dpos < p.in_labels[i].size(); ++dpos) {
        if (shapes[i][dpos] == 1 && p.size.at(p.in_labels[i][dpos]) != 1) continue;
        const size_t j = std::find(loop.begin(), loop.end(), p.in_labels[i][dpos]) - loop.begin();
        st[i][j] += s[dpos];
      }
    }
    Shape oshape;
    for (int l : p.out_labels) oshape.push_back(p.size.at(l));
    const int64_t onum = shape_numel(oshape);
    const size_t no = p.out_labels.size();
    int64_t inner = 1;
    for (size_t j = no; j < nl; ++j) inner *= ext[j];
    const bool fl = is_float(c.in(0).dtype());
    std::vector<std::vector<double>> vf(ni);
    std::vector<std::vector<int64_t>> vi(ni);
    for (size_t i = 0; i < ni; ++i) {
      if (fl)
        vf[i] = c.in(static_cast<int>(i)).to_f64();
      else
        vi[i] = c.in(static_cast<int>(i)).to_i64();
    }
    std::vector<double> of(fl ? onum : 0);
    std::vector<int64_t> oi(fl ? 0 : onum);
    std::vector<int64_t> idx(nl, 0), off(ni, 0);
    const int64_t total = onum * inner;
    for (int64_t t = 0; t < total; ++t) {
      const int64_t o = t / std::max<int64_t>(inner, 1);
      if (fl) {
        double v = 1;
        for (size_t i = 0; i < ni; ++i) v *= vf[i][off[i]];
        of[o] += v;
      } else {
        int64_t v = 1;
        for (size_t i = 0; i < ni; ++i) v = wrap_mul(v, vi[i][off[i]]);
        oi[o] = wrap_add(oi[o], v);
      }
      for (size_t j = nl; j-- > 0;) {
        if (++idx[j] < ext[j]) {
          for (size_t i = 0; i < ni; ++i) off[i] += st[i][j];
          break;
        }
        for (size_t i = 0; i < ni; ++i) off[i] -= st[i][j] * (ext[j] - 1);
        idx[j] = 0;
      }
    }
    c.set_out(0, fl ? Tensor::from_f64(c.in(0).dtype(), oshape, of)
                    : Tensor::from_i64(c.in(0).dtype(), oshape, oi));
  };
  return d;
}

// ---- Det ----------------------------------------------------------------------------------------

// Det by the Leibniz formula over the n! permutations, unrolled on per-element slices. Only small
// matrices: larger ones need pivoted elimination, whose pivot choice is data-dependent.
constexpr int64_t kMaxUnrolledDet = 4;

std::vector<Value*> decompose_det(CoreBuilder& b, const Node& n) {
  const DType dt = n.outputs[0]->type.dtype, ct = math_type(dt);
  Value* x = b.convert(n.inputs[0], ct);
  const Shape s = x->type.shape;
  const Shape batch = n.outputs[0]->type.shape;
  const int64_t m = s.back();
  if (m > kMaxUnrolledDet)
    unsupported("Det of {}x{} matrices (the core form unrolls the Leibniz formula up to {}x{})", m, m,
                kMaxUnrolledDet, kMaxUnrolledDet);
  auto elem = [&](int64_t i, int64_t j) {
    std::vector<int64_t> starts(s.size(), 0), stops(s.begin(), s.end());
    starts[s.size() - 2] = i;
    stops[s.size() - 2] = i + 1;
    starts[s.size() - 1] = j;
    stops[s.size() - 1] = j + 1;
    return b.reshape(b.slice(x, starts, stops), batch);
  };
  std::vector<int64_t> perm(static_cast<size_t>(m));
  std::iota(perm.begin(), perm.end(), 0);
  if (m == 0) return {b.convert(b.full(ct, batch, 1), dt)};
  Value* sum = nullptr;
  do {
    Value* t = elem(0, perm[0]);
    for (int64_t r = 1; r < m; ++r) t = b.mul(t, elem(r, perm[r]));
    int inversions = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = i + 1; j < m; ++j) inversions += perm[i] > perm[j];
    if (inversions % 2) t = b.emit(CoreOp::neg, {t});
    sum = sum ? b.add(sum, t) : t;
  } while (std::next_permutation(perm.begin(), perm.end()));
  return {b.convert(sum, dt)};
}

OpDef det_def() {
  OpDef d;
  d.name = "Det";
  d.since = 11;
  d.infer = [](InferCtx& c) {
    const TensorType& x = c.in(0);
    if (!is_float(x.dtype)) fail("Det needs a float input, got {}", dtype_name(x.dtype));
    if (x.shape.size() < 2) fail("Det needs rank >= 2, got {}", shape_str(x.shape));
    const int64_t a = x.shape[x.shape.size() - 2], b = x.shape.back();
    if (a != kUnknownDim && b != kUnknownDim && a != b)
      fail("Det needs square matrices, got {}", shape_str(x.shape));
    c.set_out(0, {x.dtype, Shape(x.shape.begin(), x.shape.end() - 2)});
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    const int64_t n = x.dim(x.rank() - 1);
    const Shape os(x.shape().begin(), x.shape().end() - 2);
    const std::vector<double> v = x.to_f64();
    const int64_t nb = shape_numel(os);
    std::vector<double> res(static_cast<size_t>(nb));
    std::vector<double> a(static_cast<size_t>(n * n));
    for (int64_t t = 0; t < nb; ++t) {
      std::copy(v.begin() + t * n * n, v.begin() + (t + 1) * n * n, a.begin());
      // LU decomposition with partial pivoting; the determinant is the signed pivot product.
      double det = 1;
      for (int64_t col = 0; col < n && det != 0; ++col) {
        int64_t piv = col;
        for (int64_t r = col + 1; r < n; ++r)
          if (std::fabs(a[r * n + col]) > std::fabs(a[piv * n + col])) piv = r;
        if (a[piv * n + col] == 0) {
          det = 0;
          break;
        }
        if (piv != col) {
          for (int64_t j = 0; j < n; ++j) std::swap(a[piv * n + j], a[col * n + j]);
          det = -det;
        }
        const double pv = a[col * n + col];
        det *= pv;
        for (int64_t r = col + 1; r < n; ++r) {
          const double f = a[r * n + col] / pv;
          for (int64_t j = col; j < n; ++j) a[r * n + j] -= f * a[col * n + j];
        }
      }
      res[t] = det;
    }
    c.set_out(0, Tensor::from_f64(x.dtype(), os, res));
  };
  return d;
}

}  // namespace

void register_matmul_ops(OpRegistry& r) {
  // MatMul and Gemm take symbolic sizes (docs/dynamic-shapes.md).
  r.add(symbolic_op(matmul_def()));
  r.add(symbolic_op(with_decomposition(gemm_def(), decompose_gemm)));
  r.add(with_decomposition(matmul_integer_def(), decompose_matmul_integer));
  r.add(with_decomposition(einsum_def(), decompose_einsum));
  r.add(with_decomposition(det_def(), decompose_det));
}

}  // namespace tessel
