// Op family: linear quantization (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
// QLinearMatMul, QLinearConv).
#include <algorithm>
#include <cmath>

#include "tessel/ir/op_registry.h"
#include "tessel/ops/decompose_util.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

bool is_int_quant(DType t) {
  switch (t) {
    case DType::i2:
    case DType::u2:
    case DType::i4:
    case DType::u4:
    case DType::i8:
    case DType::u8:
    case DType::i16:
    case DType::u16:
    case DType::i32:
      return true;
    default:
      return false;
  }
}

bool is_float_quant(DType t) {
  return t == DType::f8e4m3fn || t == DType::f8e4m3fnuz || t == DType::f8e5m2 ||
         t == DType::f8e5m2fnuz || t == DType::f4e2m1;
}

std::pair<int64_t, int64_t> int_range(DType t) {
  switch (t) {
    case DType::i2:
      return {-2, 1};
    case DType::u2:
      return {0, 3};
    case DType::i4:
      return {-8, 7};
    case DType::u4:
      return {0, 15};
    case DType::i8:
      return {-128, 127};
    case DType::u8:
      return {0, 255};
    case DType::i16:
      return {-32768, 32767};
    case DType::u16:
      return {0, 65535};
    case DType::i32:
      return {INT32_MIN, INT32_MAX};
    default:
      fail("{} is not a quantized integer type", dtype_name(t));
  }
}

// Rounds a value computed in double to the precision of float type `t`, so that arithmetic
// "in t" matches a runtime computing in t (a single rounding of an exact double result).
double round_to(DType t, double v) {
  if (t == DType::f64) return v;
  if (t == DType::f32) return static_cast<float>(v);
  if (is_small_float(t)) return decode_float_bits(t, encode_float_bits(t, v));
  return v;
}

DType onnx_dtype_attr(int64_t code, const char* what) {
  auto d = dtype_from_onnx(static_cast<int>(code));
  if (!d) unsupported("{} {} is not a supported data type", what, code);
  return *d;
}

// Maps each element of x to the element of a scale/zero-point tensor that applies to it
// (per tensor, per axis, or per block along `axis`).
std::vector<int64_t> param_index(const Shape& x, const Shape& p, int64_t axis_attr, int64_t block,
                                 const char* what) {
  const int64_t n = shape_numel(x);
  const int r = static_cast<int>(x.size());
  const int64_t pn = shape_numel(p);
  if (block > 0) {
    if (p.size() != x.size())
      fail("blocked {} must have the rank of the input ({}), got {}", what, r, p.size());
    const int axis = normalize_axis(axis_attr, r);
    for (int d = 0; d < r; ++d) {
      if (d == axis) {
        if (p[d] < 1 || block * (p[d] - 1) >= x[d] || block * p[d] < x[d])
          fail("{} has {} blocks on axis {} but the input dim {} with block_size {} needs {}", what,
               p[d], d, x[d], block, (x[d] + block - 1) / block);
      } else if (p[d] != x[d]) {
        fail("blocked {} dim {} is {} but the input's is {}", what, d, p[d], x[d]);
      }
    }
    std::vector<int64_t> idx(n);
    const auto xs = strides_of(x);
    const auto ps = strides_of(p);
    for (int64_t i = 0; i < n; ++i) {
      int64_t off = 0;
      for (int d = 0; d < r; ++d) {
        int64_t c = (i / xs[d]) % x[d];
        off += (d == axis ? c / block : c) * ps[d];
      }
      idx[i] = off;
    }
    return idx;
  }
  if (pn == 1 && p.size() <= 1) return std::vector<int64_t>(n, 0);
  if (p.size() != 1)
    fail("{} must be a scalar or 1-D (per axis) without block_size, got shape {}", what,
         shape_str(p));
  const int axis = normalize_axis(axis_attr, r);
  if (p[0] != x[axis])
    fail("per-axis {} has {} elements but input axis {} has {}", what, p[0], axis, x[axis]);
  std::vector<int64_t> idx(n);
  const auto xs = strides_of(x);
  for (int64_t i = 0; i < n; ++i) idx[i] = (i / xs[axis]) % x[axis];
  return idx;
}

// Stores `v` (already divided by the scale, zero point not yet added) into quantized element i.
void store_quantized(Tensor& y, int64_t i, double v, double zp, bool saturate) {
  const DType t = y.dtype();
  if (is_float_quant(t)) {
    y.bytes()[i] =
        static_cast<uint8_t>(encode_float_bits(t, v + zp, saturate || t == DType::f4e2m1));
    return;
  }
  auto [lo, hi] = int_range(t);
  double q = std::nearbyint(v);  // default rounding mode: half to even
  if (std::isnan(q)) q = 0;
  q += zp;
  q = std::clamp(q, static_cast<double>(lo), static_cast<double>(hi));
  y.set_i(i, static_cast<int64_t>(q));
}

// ---- QuantizeLinear -------------------------------------------------------------------------

DType quantize_out_dtype(const Node& n, const TensorType* zp) {
  const int64_t od = n.attr_i("output_dtype", 0);
  if (zp) {
    if (od && onnx_dtype_attr(od, "output_dtype") != zp->dtype)
      fail("output_dtype disagrees with the zero point's type {}", dtype_name(zp->dtype));
    return zp->dtype;
  }
  return od ? onnx_dtype_attr(od, "output_dtype") : DType::u8;
}

void quantize_infer(InferCtx& c) {
  const auto& x = c.in(0);
  if (!is_float(x.dtype) && x.dtype != DType::i32)
    fail("QuantizeLinear input must be float or int32");
  if (!is_float(c.in(1).dtype)) fail("y_scale must be a float type");
  DType t = quantize_out_dtype(c.node(), c.has_in(2) ? &c.in(2) : nullptr);
  if (!is_int_quant(t) && !is_float_quant(t))
    unsupported("QuantizeLinear to {} is not supported", dtype_name(t));
  if (c.node().has_attr("precision")) onnx_dtype_attr(c.node().attr_i("precision"), "precision");
  c.set_out(0, {t, x.shape});
}

void quantize_kernel(KernelCtx& c) {
  const auto& n = c.node();
  const Tensor& x = c.in(0);
  const Tensor& s = c.in(1);
  const Tensor* zp = c.has_in(2) ? &c.in(2) : nullptr;
  TensorType zpt = zp ? TensorType{zp->dtype(), zp->shape()} : TensorType{};
  const DType t = quantize_out_dtype(n, zp ? &zpt : nullptr);
  const int64_t axis = n.attr_i("axis", 1), block = n.attr_i("block_size", 0);
  const bool saturate = n.attr_i("saturate", 1) != 0;
  const DType prec =
      n.has_attr("precision") ? onnx_dtype_attr(n.attr_i("precision"), "precision") : s.dtype();
  auto si = param_index(x.shape(), s.shape(), axis, block, "y_scale");
  std::vector<int64_t> zi;
  if (zp) {
    if (zp->numel() != s.numel())
      fail("y_zero_point has {} elements but y_scale has {}", zp->numel(), s.numel());
    zi = param_index(x.shape(), zp->shape(), axis, block, "y_zero_point");
  }
  Tensor y(t, x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double sc = round_to(prec, s.get_f(si[i]));
    const double v = round_to(prec, round_to(prec, x.get_f(i)) / sc);
    store_quantized(y, i, v, zp ? zp->get_f(zi[i]) : 0.0, saturate);
  }
  c.set_out(0, std::move(y));
}

// ---- DequantizeLinear -----------------------------------------------------------------------

DType dequantize_out_dtype(const Node& n, DType scale) {
  const int64_t od = n.attr_i("output_dtype", 0);
  return od ? onnx_dtype_attr(od, "output_dtype") : scale;
}

void dequantize_infer(InferCtx& c) {
  const auto& x = c.in(0);
  if (!is_int_quant(x.dtype) && !is_float_quant(x.dtype))
    unsupported("DequantizeLinear of {} is not supported", dtype_name(x.dtype));
  if (c.has_in(2) && c.in(2).dtype != x.dtype) fail("x_zero_point must have the type of x");
  if (!is_float(c.in(1).dtype)) fail("x_scale must be a float type");
  DType t = dequantize_out_dtype(c.node(), c.in(1).dtype);
  if (!is_float(t)) fail("output_dtype must be a float type");
  c.set_out(0, {t, x.shape});
}

void dequantize_kernel(KernelCtx& c) {
  const auto& n = c.node();
  const Tensor& x = c.in(0);
  const Tensor& s = c.in(1);
  const Tensor* zp = c.has_in(2) ? &c.in(2) : nullptr;
  const DType t = dequantize_out_dtype(n, s.dtype());
  const int64_t axis = n.attr_i("axis", 1), block = n.attr_i("block_size", 0);
  auto si = param_index(x.shape(), s.shape(), axis, block, "x_scale");
  std::vector<int64_t> zi;
  if (zp) {
    if (zp->numel() != s.numel())
      fail("x_zero_point has {} elements but x_scale has {}", zp->numel(), s.numel());
    zi = param_index(x.shape(), zp->shape(), axis, block, "x_zero_point");
  }
  Tensor y(t, x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double d = round_to(t, x.get_f(i) - (zp ? zp->get_f(zi[i]) : 0.0));
    y.set_f(i, d * round_to(t, s.get_f(si[i])));
  }
  c.set_out(0, std::move(y));
}

// ---- DynamicQuantizeLinear ------------------------------------------------------------------

void dynamic_quantize_infer(InferCtx& c) {
  if (c.in(0).dtype != DType::f32) fail("DynamicQuantizeLinear input must be float32");
  c.set_out(0, {DType::u8, c.in(0).shape});
  c.set_out(1, {DType::f32, {}});
  c.set_out(2, {DType::u8, {}});
}

void dynamic_quantize_kernel(KernelCtx& c) {
  const Tensor& x = c.in(0);
  const float* xp = x.data<float>();
  // The range always includes 0 so that 0 is exactly representable.
  float lo = 0, hi = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (std::isnan(xp[i])) fail("DynamicQuantizeLinear input contains NaN");
    lo = std::min(lo, xp[i]);
    hi = std::max(hi, xp[i]);
  }
  const float scale = (hi - lo) / 255.0f;
  float zpf = scale == 0 ? 0.0f : std::nearbyint(std::clamp(0.0f - lo / scale, 0.0f, 255.0f));
  Tensor y(DType::u8, x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) {
    float q = scale == 0 ? 0.0f : std::nearbyint(xp[i] / scale) + zpf;
    y.data<uint8_t>()[i] = static_cast<uint8_t>(std::clamp(q, 0.0f, 255.0f));
  }
  c.set_out(0, std::move(y));
  c.set_out(1, Tensor::scalar_f(DType::f32, scale));
  c.set_out(2, Tensor::scalar_i(DType::u8, static_cast<int64_t>(zpf)));
}

// ---- QLinearMatMul --------------------------------------------------------------------------

// numpy matmul shape rule (rank-1 operands promoted and the added dim removed again).
Shape matmul_shape(Shape a, Shape b) {
  if (a.empty() || b.empty()) fail("matmul operands must have rank >= 1");
  const bool a1 = a.size() == 1, b1 = b.size() == 1;
  if (a1) a.insert(a.begin(), 1);
  if (b1) b.push_back(1);
  const int64_t k1 = a.back(), k2 = b[b.size() - 2];
  if (k1 >= 0 && k2 >= 0 && k1 != k2) fail("matmul inner dims differ: {} vs {}", k1, k2);
  Shape batch = broadcast_shapes(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2));
  if (!a1) batch.push_back(a[a.size() - 2]);
  if (!b1) batch.push_back(b.back());
  return batch;
}

// Per-tensor scale/zero point, or one value per row of A (dim -2) / per column of B (dim -1).
double qparam(const Tensor& p, int64_t row_or_col, const char* what) {
  if (p.numel() == 1) return p.get_f(0);
  if (row_or_col < p.numel() && p.rank() == 1) return p.get_f(row_or_col);
  unsupported("{} of shape {} is not supported (only per-tensor or per-row/column)", what,
              shape_str(p.shape()));
}

void qlinear_matmul_infer(InferCtx& c) {
  const auto& a = c.in(0);
  const auto& b = c.in(3);
  if (c.in(2).dtype != a.dtype || c.in(5).dtype != b.dtype)
    fail("zero points must match their operands' types");
  if (!is_int_quant(a.dtype) || !is_int_quant(b.dtype))
    fail("QLinearMatMul operands must be 8-bit integers");
  c.set_out(0, {c.in(7).dtype, matmul_shape(a.shape, b.shape)});
}

void qlinear_matmul_kernel(KernelCtx& c) {
  Tensor a = c.in(0), b = c.in(3);
  const Tensor &as = c.in(1), &az = c.in(2), &bs = c.in(4), &bz = c.in(5), &ys = c.in(6),
               &yz = c.in(7);
  if (ys.numel() != 1 || yz.numel() != 1)
    unsupported("QLinearMatMul needs a per-tensor output scale");
  Shape out = matmul_shape(a.shape(), b.shape());
  if (a.rank() == 1) a = a.reshaped({1, a.dim(0)});
  if (b.rank() == 1) b = b.reshaped({b.dim(0), 1});
  const int64_t M = a.dim(a.rank() - 2), K = a.dim(a.rank() - 1), N = b.dim(b.rank() - 1);
  Shape batch = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                                 Shape(b.shape().begin(), b.shape().end() - 2));
  auto ai = broadcast_index(Shape(a.shape().begin(), a.shape().end() - 2), batch);
  auto bi = broadcast_index(Shape(b.shape().begin(), b.shape().end() - 2), batch);
  Tensor y(yz.dtype(), out);
  const double ysc = ys.get_f(0), yzp = yz.get_f(0);
  const DType sdt = ys.dtype();
  int64_t o = 0;
  for (size_t bt = 0; bt < ai.size(); ++bt)
    for (int64_t m = 0; m < M; ++m) {
      const int64_t azp = static_cast<int64_t>(qparam(az, m, "a_zero_point"));
      const double asc = qparam(as, m, "a_scale");
      for (int64_t nn = 0; nn < N; ++nn, ++o) {
        const int64_t bzp = static_cast<int64_t>(qparam(bz, nn, "b_zero_point"));
        const double bsc = qparam(bs, nn, "b_scale");
        int64_t acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc += (a.get_i((ai[bt] * M + m) * K + k) - azp) *
                 (b.get_i((bi[bt] * K + k) * N + nn) - bzp);
        // The combined scale is formed in the scales' precision, the product in float32.
        const double mult = round_to(sdt, round_to(sdt, asc * bsc) / ysc);
        const double v = round_to(DType::f32, static_cast<double>(acc) * mult);
        store_quantized(y, o, v, yzp, true);
      }
    }
  c.set_out(0, std::move(y));
}

// ---- QLinearConv ----------------------------------------------------------------------------

int64_t prod_of(const std::vector<int64_t>& v) {
  int64_t p = 1;
  for (int64_t d : v) p *= d;
  return p;
}

struct ConvGeom {
  std::vector<int64_t> kernel, strides, dilations, pads_begin, pads_end, out;
};

ConvGeom conv_geometry(const Node& n, const Shape& x, const Shape& w) {
  const int sp = static_cast<int>(x.size()) - 2;
  if (sp < 1 || w.size() != x.size())
    fail("QLinearConv input and weight must have the same rank >= 3");
  ConvGeom g;
  g.kernel = n.attr_ints("kernel_shape", Shape(w.begin() + 2, w.end()));
  g.strides = n.attr_ints("strides", std::vector<int64_t>(sp, 1));
  g.dilations = n.attr_ints("dilations", std::vector<int64_t>(sp, 1));
  auto pads = n.attr_ints("pads", std::vector<int64_t>(2 * sp, 0));
  if (static_cast<int>(g.kernel.size()) != sp || static_cast<int>(g.strides.size()) != sp ||
      static_cast<int>(g.dilations.size()) != sp || static_cast<int>(pads.size()) != 2 * sp)
    fail("kernel_shape, strides, dilations and pads must match the {} spatial dims", sp);
  for (int d = 0; d < sp; ++d)
    if (g.kernel[d] != w[d + 2])
      fail("kernel_shape {} does not match the weight shape", shape_str(g.kernel));
  const std::string ap = n.attr_s("auto_pad", "NOTSET");
  for (int d = 0; d < sp; ++d) {
    if (g.strides[d] < 1 || g.dilations[d] < 1 || g.kernel[d] < 1)
      fail("strides, dilations and kernel must be positive");
    const int64_t ek = (g.kernel[d] - 1) * g.dilations[d] + 1;
    int64_t pb = pads[d], pe = pads[d + sp];
    if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
      const int64_t o = (x[d + 2] + g.strides[d] - 1) / g.strides[d];
      const int64_t total = std::max<int64_t>(0, (o - 1) * g.strides[d] + ek - x[d + 2]);
      pb = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      pe = total - pb;
    } else if (ap == "VALID") {
      pb = pe = 0;
    } else if (ap != "NOTSET") {
      fail("unknown auto_pad '{}'", ap);
    }
    g.pads_begin.push_back(pb);
    g.pads_end.push_back(pe);
    const int64_t o = (x[d + 2] + pb + pe - ek) / g.strides[d] + 1;
    if (o < 1) fail("convolution output dim {} would be empty", d);
    g.out.push_back(o);
  }
  return g;
}

void qlinear_conv_infer(InferCtx& c) {
  const auto& x = c.in(0);
  const auto& w = c.in(3);
  if (!shape_known(x.shape) || !shape_known(w.shape))
    unsupported("QLinearConv needs static shapes");
  ConvGeom g = conv_geometry(c.node(), x.shape, w.shape);
  Shape s = {x.shape[0], w.shape[0]};
  s.insert(s.end(), g.out.begin(), g.out.end());
  c.set_out(0, {c.in(7).dtype, s});
}

void qlinear_conv_kernel(KernelCtx& c) {
  const Tensor &x = c.in(0), &xs = c.in(1), &xz = c.in(2), &w = c.in(3), &ws = c.in(4),
               &wz = c.in(5);
  const Tensor &ys = c.in(6), &yz = c.in(7);
  const Tensor* bias = c.has_in(8) ? &c.in(8) : nullptr;
  ConvGeom g = conv_geometry(c.node(), x.shape(), w.shape());
  const int sp = x.rank() - 2;
  const int64_t group = c.node().attr_i("group", 1);
  const int64_t N = x.dim(0), C = x.dim(1), M = w.dim(0), CG = w.dim(1);
  if (group < 1 || C != CG * group || M % group != 0)
    fail("channels {} / weight {}x{} do not fit group {}", C, M, CG, group);
  if (xs.numel() != 1 || xz.numel() != 1 || ys.numel() != 1 || yz.numel() != 1)
    fail("x and y scales and zero points must be per-tensor");
  if ((ws.numel() != 1 && ws.numel() != M) || (wz.numel() != 1 && wz.numel() != M))
    fail("w_scale and w_zero_point must be per-tensor or per output channel");
  if (bias && bias->numel() != M) fail("bias must have {} elements", M);
  Shape os = {N, M};
  os.insert(os.end(), g.out.begin(), g.out.end());
  Tensor y(yz.dtype(), os);
  const auto xst = strides_of(x.shape());
  const auto wst = strides_of(w.shape());
  const int64_t out_sp = prod_of(g.out), k_sp = prod_of(g.kernel);
  const int64_t xzp = xz.get_i(0);
  const DType sdt = xs.dtype();
  std::vector<int64_t> opos(sp), kpos(sp);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      const int64_t gi = m / (M / group);
      const int64_t wzp = wz.get_i(wz.numel() == 1 ? 0 : m);
      const double mult = round_to(
          sdt, round_to(sdt, xs.get_f(0) * ws.get_f(ws.numel() == 1 ? 0 : m)) / ys.get_f(0));
      for (int64_t o = 0; o < out_sp; ++o) {
        int64_t t = o;
        for (int d = sp - 1; d >= 0; --d) {
          opos[d] = t % g.out[d];
          t /= g.out[d];
        }
        int64_t acc = bias ? bias->get_i(m) : 0;
        for (int64_t cg = 0; cg < CG; ++cg) {
          const int64_t ch = gi * CG + cg;
          for (int64_t k = 0; k < k_sp; ++k) {
            int64_t kt = k;
            for (int d = sp - 1; d >= 0; --d) {
              kpos[d] = kt % g.kernel[d];
              kt /= g.kernel[d];
            }
            int64_t xoff = n * xst[0] + ch * xst[1];
            bool inside = true;
            for (int d = 0; d < sp && inside; ++d) {
              const int64_t p = opos[d] * g.strides[d] + kpos[d] * g.dilations[d] - g.pads_begin[d];
              inside = p >= 0 && p < x.dim(d + 2);
              xoff += p * xst[d + 2];
            }
            // Padding holds the zero point, i.e. real zero.
            if (!inside) continue;
            int64_t woff = m * wst[0] + cg * wst[1];
            for (int d = 0; d < sp; ++d) woff += kpos[d] * wst[d + 2];
            acc += (x.get_i(xoff) - xzp) * (w.get_i(woff) - wzp);
          }
        }
        const double v = round_to(DType::f32, static_cast<double>(acc) * mult);
        store_quantized(y, (n * M + m) * out_sp + o, v, yz.get_f(0), true);
      }
    }
  c.set_out(0, std::move(y));
}

// ---- decomposition hooks ---------------------------------------------------------------------

// A scale or zero point broadcast to x's shape: per tensor, per `axis`, or per block of `block`
// elements along `axis` (the blocks are repeated, then cut to x's length).
Value* expand_param(CoreBuilder& b, Value* p, const Shape& x, int64_t axis_attr, int64_t block) {
  const Shape& ps = p->type.shape;
  if (block <= 0 && shape_numel(ps) == 1 && ps.size() <= 1)
    return b.broadcast_to(b.reshape(p, {}), x);
  const int axis = normalize_axis(axis_attr, static_cast<int>(x.size()));
  if (block <= 0)
    return b.emit(CoreOp::broadcast_in_dim, {p},
                  {{"shape", std::vector<int64_t>(x)}, {"dims", std::vector<int64_t>{axis}}});
  Shape one = ps, rep = ps;
  one.insert(one.begin() + axis + 1, 1);
  rep.insert(rep.begin() + axis + 1, block);
  Shape flat = ps;
  flat[axis] *= block;
  Value* r = b.reshape(b.broadcast_to(b.reshape(p, one), rep), flat);
  std::vector<int64_t> stops(x.begin(), x.end());
  return b.slice(r, std::vector<int64_t>(x.size(), 0), stops);
}

Value* clamp(CoreBuilder& b, Value* v, double lo, double hi) {
  const DType t = v->type.dtype;
  return b.min(b.max(v, b.scalar(t, lo)), b.scalar(t, hi));
}

// store_quantized for integer targets: `v` (float, already divided by the scale) rounded half to
// even (NaN -> 0), plus the zero point `zp` (x-shaped or null), clamped to t's range, converted.
// The add and clamp run in f32, exact for every target but int32, which needs f64.
Value* requantize(CoreBuilder& b, Value* v, Value* zp, DType t) {
  Value* q = b.unary(CoreOp::round_even, v);
  q = b.select(b.compare("ne", q, q), b.scalar(q->type.dtype, 0), q);
  const DType ct = t == DType::i32 ? DType::f64 : DType::f32;
  q = b.convert(q, ct);
  if (zp) q = b.add(q, b.convert(zp, ct));
  auto [lo, hi] = int_range(t);
  return b.convert(clamp(b, q, static_cast<double>(lo), static_cast<double>(hi)), t);
}

bool known_zero(const Value* v) {
  if (!v->constant) return false;
  for (int64_t i = 0; i < v->constant->numel(); ++i)
    if (v->constant->get_f(i) != 0) return false;
  return true;
}

std::vector<Value*> quantize_decompose(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  const Shape& xs = x->type.shape;
  const DType t = n.outputs[0]->type.dtype;
  const int64_t axis = n.attr_i("axis", 1), block = n.attr_i("block_size", 0);
  const DType prec = n.has_attr("precision") ? onnx_dtype_attr(n.attr_i("precision"), "precision")
                                             : n.inputs[1]->type.dtype;
  Value* v =
      b.div(b.convert(x, prec), expand_param(b, b.convert(n.inputs[1], prec), xs, axis, block));
  Value* zp = n.has_input(2) ? expand_param(b, n.inputs[2], xs, axis, block) : nullptr;
  if (!is_float_quant(t)) return {requantize(b, v, zp, t)};
  // Float targets: one rounding of v + zp (in double, as the kernel) with the saturate flag.
  if (zp && !known_zero(n.inputs[2]))
    v = b.add(b.convert(v, DType::f64), b.convert(zp, DType::f64));
  // float4 has no NaN: the kernel (as ONNX's reference) stores it as +6, where convert gives -0.
  if (t == DType::f4e2m1) v = b.select(b.compare("ne", v, v), b.scalar(v->type.dtype, 6), v);
  const bool sat = n.attr_i("saturate", 1) != 0 || t == DType::f4e2m1;
  return {
      b.emit(CoreOp::convert, {v}, {{"dtype", std::string(dtype_name(t))}, {"saturate", int64_t{sat}}})};
}

// (x - zero point) is exact in a wider integer type (or f32 for the float8 inputs) and rounded
// once to the output type, then multiplied by the scale in the output type.
std::vector<Value*> dequantize_decompose(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  const Shape& xs = x->type.shape;
  const DType t = n.outputs[0]->type.dtype;
  const int64_t axis = n.attr_i("axis", 1), block = n.attr_i("block_size", 0);
  Value* d = x;
  if (n.has_input(2) && !known_zero(n.inputs[2])) {
    const DType wide = is_float(x->type.dtype)       ? DType::f32
                       : x->type.dtype == DType::i32 ? DType::i64
                                                     : DType::i32;
    d = b.sub(b.convert(x, wide), b.convert(expand_param(b, n.inputs[2], xs, axis, block), wide));
  }
  Value* s = expand_param(b, b.convert(n.inputs[1], t), xs, axis, block);
  return {b.mul(b.convert(d, t), s)};
}

std::vector<Value*> dynamic_quantize_decompose(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  std::vector<int64_t> all(x->type.shape.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  Value* zero = b.scalar(DType::f32, 0);
  // The range always includes 0 so that 0 is exactly representable.
  Value* lo = b.min(b.reduce(x, "min", all, false), zero);
  Value* hi = b.max(b.reduce(x, "max", all, false), zero);
  Value* scale = b.div(b.sub(hi, lo), b.scalar(DType::f32, 255));
  Value* degenerate = b.compare("eq", scale, zero);
  Value* zpf = b.unary(CoreOp::round_even, clamp(b, b.unary(CoreOp::neg, b.div(lo, scale)), 0, 255));
  zpf = b.select(degenerate, zero, zpf);
  Value* q = clamp(b, b.add(b.unary(CoreOp::round_even, b.div(x, scale)), zpf), 0, 255);
  q = b.select(degenerate, zero, q);
  return {b.convert(q, DType::u8), scale, b.convert(zpf, DType::u8)};
}

// A per-tensor quantization parameter as a scalar, or a 1-D one laid along dim `dim` of `shape`.
Value* lay_param(CoreBuilder& b, Value* p, const Shape& shape, int64_t dim) {
  if (shape_numel(p->type.shape) == 1) return b.broadcast_to(b.reshape(p, {}), shape);
  return b.emit(CoreOp::broadcast_in_dim, {p},
                {{"shape", std::vector<int64_t>(shape)}, {"dims", std::vector<int64_t>{dim}}});
}

// v - zero point in i32 (exact for the 8-bit operands).
Value* centred(CoreBuilder& b, Value* v, Value* zp, int64_t dim) {
  Value* z = lay_param(b, b.convert(zp, DType::i32), v->type.shape, dim);
  return b.sub(b.convert(v, DType::i32), z);
}

// The combined scale sa * sb / sy formed in the scales' precision (sy's dtype), then as f32.
Value* combined_scale(CoreBuilder& b, Value* sa, Value* sb, Value* sy) {
  const DType sdt = sy->type.dtype;
  return b.convert(b.div(b.mul(b.convert(sa, sdt), b.convert(sb, sdt)), b.reshape(sy, {})),
                   DType::f32);
}

// numpy matmul of two i32 operands as one dot_general (rank-1 operands become matrices, batch
// dims broadcast), reshaped to `out`.
Value* int_matmul(CoreBuilder& b, Value* a, Value* w, const Shape& out) {
  if (a->type.shape.size() == 1) a = b.reshape(a, {1, a->type.shape[0]});
  if (w->type.shape.size() == 1) w = b.reshape(w, {w->type.shape[0], 1});
  const Shape &as = a->type.shape, &ws = w->type.shape;
  Shape batch = broadcast_shapes(Shape(as.begin(), as.end() - 2), Shape(ws.begin(), ws.end() - 2));
  Shape af = batch, wf = batch;
  af.insert(af.end(), as.end() - 2, as.end());
  wf.insert(wf.end(), ws.end() - 2, ws.end());
  std::vector<int64_t> bd(batch.size());
  for (size_t i = 0; i < bd.size(); ++i) bd[i] = static_cast<int64_t>(i);
  const int64_t nb = static_cast<int64_t>(batch.size());
  Value* y = b.emit(CoreOp::dot_general, {b.broadcast_to(a, af), b.broadcast_to(w, wf)},
                    {{"lhs_batch", bd},
                     {"rhs_batch", bd},
                     {"lhs_contract", std::vector<int64_t>{nb + 1}},
                     {"rhs_contract", std::vector<int64_t>{nb}}});
  return b.reshape(y, out);
}

// Integer product of the centred operands, then requantized with the per-row (a) / per-column
// (b) scales: v = acc * (sa * sb / sy), rounded, plus y's zero point, saturated.
std::vector<Value*> qlinear_matmul_decompose(CoreBuilder& b, const Node& n) {
  const Shape& out = n.outputs[0]->type.shape;
  const int64_t ra = static_cast<int64_t>(n.inputs[0]->type.shape.size());
  const int64_t rb = static_cast<int64_t>(n.inputs[3]->type.shape.size());
  const int64_t ro = static_cast<int64_t>(out.size());
  Value* acc = int_matmul(b, centred(b, n.inputs[0], n.inputs[2], ra - 2),
                          centred(b, n.inputs[3], n.inputs[5], rb - 1), out);
  // Rows of a are dim -2 of the output (-1 when b is a vector); columns of b are dim -1.
  Value* sa = lay_param(b, n.inputs[1], out, ro - (rb == 1 ? 1 : 2));
  Value* sb = lay_param(b, n.inputs[4], out, ro - 1);
  Value* v = b.mul(b.convert(acc, DType::f32), combined_scale(b, sa, sb, n.inputs[6]));
  return {requantize(b, v, b.reshape(n.inputs[7], {}), n.outputs[0]->type.dtype)};
}

// Integer convolution of the centred operands (padding reads real zero), plus the i32 bias,
// then requantized with the per-output-channel combined scale.
std::vector<Value*> qlinear_conv_decompose(CoreBuilder& b, const Node& n) {
  Value *x = n.inputs[0], *w = n.inputs[3];
  const Shape& out = n.outputs[0]->type.shape;
  ConvGeom g = conv_geometry(n, x->type.shape, w->type.shape);
  std::vector<int64_t> padding;
  for (size_t d = 0; d < g.pads_begin.size(); ++d)
    padding.insert(padding.end(), {g.pads_begin[d], g.pads_end[d]});
  Value* acc = b.emit(CoreOp::convolution, {centred(b, x, n.inputs[2], 0), centred(b, w, n.inputs[5], 0)},
                      {{"strides", g.strides},
                       {"dilations", g.dilations},
                       {"padding", padding},
                       {"groups", n.attr_i("group", 1)}});
  if (n.has_input(8)) acc = b.add(acc, lay_param(b, n.inputs[8], out, 1));
  Value* sx = b.reshape(n.inputs[1], {});
  Value* v = b.mul(b.convert(acc, DType::f32),
                   combined_scale(b, sx, lay_param(b, n.inputs[4], out, 1), n.inputs[6]));
  return {requantize(b, v, b.reshape(n.inputs[7], {}), n.outputs[0]->type.dtype)};
}

}  // namespace

void register_quantize_ops(OpRegistry& r) {
  // Each opset of QuantizeLinear/DequantizeLinear (10, 13, 19, 21, 23, 25) only added types,
  // granularities and attributes with backward-compatible defaults, so opset 10 imports as is.
  r.add(with_decomposition(make_op("QuantizeLinear", 10, 2, 3,
                                   {{"axis", AttrKind::i},
                                    {"block_size", AttrKind::i},
                                    {"output_dtype", AttrKind::i},
                                    {"precision", AttrKind::i},
                                    {"saturate", AttrKind::i}},
                                   quantize_infer, quantize_kernel, FusionKind::pointwise),
                           quantize_decompose));
  r.add(with_decomposition(
      make_op("DequantizeLinear", 10, 2, 3,
              {{"axis", AttrKind::i}, {"block_size", AttrKind::i}, {"output_dtype", AttrKind::i}},
              dequantize_infer, dequantize_kernel, FusionKind::pointwise),
      dequantize_decompose));
  {
    OpDef d = make_op("DynamicQuantizeLinear", 11, 1, 1, {}, dynamic_quantize_infer,
                   dynamic_quantize_kernel);
    d.min_outputs = d.max_outputs = 3;
    d.decompose = dynamic_quantize_decompose;
    r.add(std::move(d));
  }
  r.add(with_decomposition(make_op("QLinearMatMul", 10, 8, 8, {}, qlinear_matmul_infer,
                                   qlinear_matmul_kernel, FusionKind::matmul),
                           qlinear_matmul_decompose));
  r.add(with_decomposition(make_op("QLinearConv", 10, 8, 9,
                                   {{"auto_pad", AttrKind::s},
                                    {"dilations", AttrKind::ints},
                                    {"group", AttrKind::i},
                                    {"kernel_shape", AttrKind::ints},
                                    {"pads", AttrKind::ints},
                                    {"strides", AttrKind::ints}},
                                   qlinear_conv_infer, qlinear_conv_kernel),
                           qlinear_conv_decompose));
}

}  // namespace tessel
