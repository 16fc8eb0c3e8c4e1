// Op family: sampling, detection and signal ops (GridSample, AffineGrid, RoiAlign,
// NonMaxSuppression, window functions, DFT, STFT, MelWeightMatrix).
#include <algorithm>
#include <cmath>
#include <complex>
#include <limits>
#include <numbers>

#include "tessel/ir/op_registry.h"
#include "tessel/ops/decompose_util.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

using cplx = std::complex<double>;
constexpr double kPi = std::numbers::pi;
constexpr double kInf = std::numeric_limits<double>::infinity();

// A statically known scalar input (a one-element tensor), or nullopt.
std::optional<double> known_scalar(const InferCtx& c, int i) {
  const Tensor* t = c.value(i);
  if (!t || t->numel() != 1) return std::nullopt;
  return t->get_f(0);
}

double scalar_of(const Tensor& t, const char* what) {
  if (t.numel() != 1) fail("{} must have exactly one element, got {}", what, t.numel());
  return t.get_f(0);
}

int64_t int_scalar_of(const Tensor& t, const char* what) {
  if (t.numel() != 1) fail("{} must have exactly one element, got {}", what, t.numel());
  return t.get_i(0);
}

DType float_dtype_attr(const Node& n, const char* attr) {
  auto d = dtype_from_onnx(static_cast<int>(n.attr_i(attr, 1)));
  if (!d) unsupported("{} {} is not a supported data type", attr, n.attr_i(attr, 1));
  return *d;
}

// ---- decomposition helpers --------------------------------------------------------------------

// Multi-step float math runs in f32 (f64 stays f64) and is converted back once.
DType compute_type(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

Value* add_c(CoreBuilder& b, Value* v, double c) {
  return b.add(v, b.scalar(v->type.dtype, c));
}
Value* mul_c(CoreBuilder& b, Value* v, double c) {
  return b.mul(v, b.scalar(v->type.dtype, c));
}
Value* div_c(CoreBuilder& b, Value* v, double c) {
  return b.div(v, b.scalar(v->type.dtype, c));
}
Value* clamp_c(CoreBuilder& b, Value* v, double lo, double hi) {
  return b.min(b.max(v, b.scalar(v->type.dtype, lo)), b.scalar(v->type.dtype, hi));
}
Value* and_of(CoreBuilder& b, Value* p, Value* q) {
  return p ? b.binary(CoreOp::and_, p, q) : q;
}
// lo <= v <= hi as a bool tensor (false for NaN).
Value* within(CoreBuilder& b, Value* v, double lo, double hi) {
  return b.binary(CoreOp::and_, b.compare("ge", v, b.scalar(v->type.dtype, lo)),
                  b.compare("le", v, b.scalar(v->type.dtype, hi)));
}
// Component `k` of the last dim of `v`, with that dim dropped.
Value* component(CoreBuilder& b, Value* v, int64_t k) {
  Shape s = v->type.shape;
  std::vector<int64_t> starts(s.size(), 0), stops(s.begin(), s.end());
  starts.back() = k;
  stops.back() = k + 1;
  s.pop_back();
  return b.reshape(b.slice(v, starts, stops), s);
}
Value* dims_of(CoreBuilder& b, Value* v, const Shape& shape, std::vector<int64_t> dims) {
  return b.emit(CoreOp::broadcast_in_dim, {v},
                {{"shape", std::vector<int64_t>(shape)}, {"dims", std::move(dims)}});
}
Value* dot(CoreBuilder& b, Value* lhs, Value* rhs, std::vector<int64_t> lc, std::vector<int64_t> rc,
           std::vector<int64_t> lb = {}, std::vector<int64_t> rb = {}) {
  return b.emit(CoreOp::dot_general, {lhs, rhs},
                {{"lhs_batch", std::move(lb)},
                 {"rhs_batch", std::move(rb)},
                 {"lhs_contract", std::move(lc)},
                 {"rhs_contract", std::move(rc)}});
}

// ---- GridSample -----------------------------------------------------------------------------

enum class Pad { zeros, border, reflection };
enum class Interp { linear, nearest, cubic };

struct GridSampleCfg {
  Interp mode;
  Pad pad;
  bool align;
};

GridSampleCfg grid_sample_cfg(const Node& n) {
  GridSampleCfg g{};
  std::string m = n.attr_s("mode", "linear");
  if (m == "linear" || m == "bilinear")
    g.mode = Interp::linear;
  else if (m == "nearest")
    g.mode = Interp::nearest;
  else if (m == "cubic" || m == "bicubic")
    g.mode = Interp::cubic;
  else
    fail("unknown GridSample mode '{}'", m);
  std::string p = n.attr_s("padding_mode", "zeros");
  if (p == "zeros")
    g.pad = Pad::zeros;
  else if (p == "border")
    g.pad = Pad::border;
  else if (p == "reflection")
    g.pad = Pad::reflection;
  else
    fail("unknown GridSample padding_mode '{}'", p);
  g.align = n.attr_i("align_corners", 0) != 0;
  return g;
}

// Reflects x into the interval [lo, hi] (mirror at both ends, repeatedly).
double reflect(double x, double lo, double hi) {
  const double span = hi - lo;
  if (span <= 0) return lo;
  double d = std::fabs(x - lo);
  const double flips = std::floor(d / span);
  const double extra = d - flips * span;
  return std::fmod(flips, 2.0) == 0 ? lo + extra : hi - extra;
}

// Applies border/reflection padding to a pixel coordinate along a dim of size len.
double pad_coord(double x, int64_t len, const GridSampleCfg& g) {
  if (g.pad == Pad::border) return std::clamp(x, 0.0, static_cast<double>(len - 1));
  if (g.pad == Pad::reflection) {
    x = g.align ? reflect(x, 0, static_cast<double>(len - 1)) : reflect(x, -0.5, len - 0.5);
    return std::clamp(x, 0.0, static_cast<double>(len - 1));
  }
  return x;
}

// The tap index actually read for integer position i, or -1 when it reads the zero padding.
int64_t tap_index(int64_t i, int64_t len, const GridSampleCfg& g) {
  if (g.pad == Pad::zeros) return (i >= 0 && i < len) ? i : -1;
  return static_cast<int64_t>(pad_coord(static_cast<double>(i), len, g));
}

double cubic_weight(double t) {
  constexpr double a = -0.75;
  t = std::fabs(t);
  if (t <= 1) return ((a + 2) * t - (a + 3)) * t * t + 1;
  if (t < 2) return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a;
  return 0;
}

void grid_sample_infer(InferCtx& c) {
  const auto& x = c.in(0);
  const auto& g = c.in(1);
  const size_t r = x.shape.size();
  if (r < 3 || g.shape.size() != r) fail("GridSample input and grid must have the same rank >= 3");
  if (g.shape.back() >= 0 && g.shape.back() != static_cast<int64_t>(r) - 2)
    fail("grid's last dim must be {}, got {}", r - 2, g.shape.back());
  if (!is_float(x.dtype) || !is_float(g.dtype)) fail("GridSample needs float input and grid");
  GridSampleCfg cfg = grid_sample_cfg(c.node());
  if (cfg.mode == Interp::cubic && r != 4)
    unsupported("GridSample cubic mode is only defined for 4-D input");
  Shape s = {x.shape[0], x.shape[1]};
  s.insert(s.end(), g.shape.begin() + 1, g.shape.end() - 1);
  c.set_out(0, {x.dtype, s});
}

void grid_sample_kernel(KernelCtx& c) {
  const Tensor& x = c.in(0);
  const Tensor& grid = c.in(1);
  const GridSampleCfg cfg = grid_sample_cfg(c.node());
  const int sp = x.rank() - 2;
  if (grid.rank() != x.rank() || grid.shape().back() != sp)
    fail("grid shape {} does not fit the input", shape_str(grid.shape()));
  if (grid.dim(0) != x.dim(0))
    fail("grid batch {} differs from input batch {}", grid.dim(0), x.dim(0));
  if (cfg.mode == Interp::cubic && sp != 2)
    unsupported("GridSample cubic mode is only defined for 4-D input");
  const int64_t N = x.dim(0), C = x.dim(1);
  Shape os = {N, C};
  os.insert(os.end(), grid.shape().begin() + 1, grid.shape().end() - 1);
  Tensor y(x.dtype(), os);
  int64_t out_sp = 1;
  for (int d = 0; d < sp; ++d) out_sp *= os[d + 2];
  const auto xst = strides_of(x.shape());
  std::vector<double> xin = x.to_f64();
  std::vector<double> coord(sp);
  std::vector<int64_t> base(sp);
  std::vector<double> frac(sp);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out_sp; ++o) {
      // Grid components are ordered (x, y[, z]) = innermost spatial dim first.
      for (int d = 0; d < sp; ++d) {
        const double gv = grid.get_f((n * out_sp + o) * sp + (sp - 1 - d));
        const int64_t len = x.dim(d + 2);
        coord[d] = cfg.align ? (gv + 1) / 2 * (len - 1) : ((gv + 1) * len - 1) / 2;
        if (cfg.mode != Interp::cubic) coord[d] = pad_coord(coord[d], len, cfg);
      }
      // Far-outside coordinates only read padding; bounding them keeps the integer casts defined.
      bool finite = true;
      for (int d = 0; d < sp; ++d) {
        finite = finite && std::isfinite(coord[d]);
        coord[d] = std::clamp(coord[d], -1e12, 1e12);
      }
      for (int64_t ch = 0; ch < C; ++ch) {
        const int64_t xbase = n * xst[0] + ch * xst[1];
        auto read = [&](const std::vector<int64_t>& idx) -> double {
          int64_t off = xbase;
          for (int d = 0; d < sp; ++d) {
            if (idx[d] < 0 || idx[d] >= x.dim(d + 2)) return 0.0;
            off += idx[d] * xst[d + 2];
          }
          return xin[off];
        };
        double v = 0;
        std::vector<int64_t> idx(sp);
        if (!finite) {
          v = 0;
        } else if (cfg.mode == Interp::nearest) {
          for (int d = 0; d < sp; ++d) idx[d] = static_cast<int64_t>(std::nearbyint(coord[d]));
          v = read(idx);
        } else if (cfg.mode == Interp::linear) {
          for (int d = 0; d < sp; ++d) {
            base[d] = static_cast<int64_t>(std::floor(coord[d]));
            frac[d] = coord[d] - base[d];
          }
          for (int corner = 0; corner < (1 << sp); ++corner) {
            double w = 1;
            for (int d = 0; d < sp; ++d) {
              const bool hi = (corner >> d) & 1;
              idx[d] = base[d] + hi;
              w *= hi ? frac[d] : 1 - frac[d];
            }
            if (w != 0) v += w * read(idx);
          }
        } else {
          for (int d = 0; d < sp; ++d) {
            base[d] = static_cast<int64_t>(std::floor(coord[d]));
            frac[d] = coord[d] - base[d];
          }
          for (int a = 0; a < 4; ++a)
            for (int b = 0; b < 4; ++b) {
              const double w = cubic_weight(frac[0] + 1 - a) * cubic_weight(frac[1] + 1 - b);
              idx[0] = tap_index(base[0] - 1 + a, x.dim(2), cfg);
              idx[1] = tap_index(base[1] - 1 + b, x.dim(3), cfg);
              v += w * read(idx);
            }
        }
        y.set_f((n * C + ch) * out_sp + o, v);
      }
    }
  c.set_out(0, std::move(y));
}

// Opset 16 names the modes bilinear/bicubic; opset 20 renamed them linear/cubic.
void grid_sample_upgrade(Graph&, Node& n, int) {
  std::string m = n.attr_s("mode", "bilinear");
  n.attrs["mode"] = std::string(m == "bilinear" ? "linear" : m == "bicubic" ? "cubic" : m);
}

// ---- GridSample as core ops: the grid is run-time data, so each tap's source index is computed
// in-graph (floor, clamp, convert), its value gathered from the flattened spatial dims, masked to
// zero outside the input, weighted and summed.

// reflect() in-graph (span is static).
Value* reflect_v(CoreBuilder& b, Value* x, double lo, double hi) {
  const double span = hi - lo;
  if (span <= 0) return b.full(x->type.dtype, x->type.shape, lo);
  Value* d = abs_of(b, add_c(b, x, -lo));
  Value* flips = b.unary(CoreOp::floor, div_c(b, d, span));
  Value* extra = b.sub(d, mul_c(b, flips, span));
  Value* even = b.compare("eq", b.binary(CoreOp::rem, flips, b.scalar(x->type.dtype, 2)),
                          b.scalar(x->type.dtype, 0));
  return b.select(even, add_c(b, extra, lo), b.sub(b.scalar(x->type.dtype, hi), extra));
}

// pad_coord() in-graph.
Value* pad_coord_v(CoreBuilder& b, Value* x, int64_t len, const GridSampleCfg& g) {
  const double last = static_cast<double>(len - 1);
  if (g.pad == Pad::border) return clamp_c(b, x, 0, last);
  if (g.pad == Pad::reflection) {
    x = g.align ? reflect_v(b, x, 0, last) : reflect_v(b, x, -0.5, len - 0.5);
    return clamp_c(b, x, 0, last);
  }
  return x;
}

// c0 t^3 + c1 t^2 + c2 t + c3.
Value* cubic_poly(CoreBuilder& b, Value* t, double c0, double c1, double c2, double c3) {
  Value* r = add_c(b, mul_c(b, t, c0), c1);
  r = add_c(b, b.mul(r, t), c2);
  return add_c(b, b.mul(r, t), c3);
}

struct Tap {
  Value* pos;  // integral float position along one dim
  Value* w;    // weight, nullptr for 1
};

std::vector<Tap> grid_taps(CoreBuilder& b, Value* c, int64_t len, const GridSampleCfg& g) {
  if (g.mode == Interp::nearest) return {{b.unary(CoreOp::round_even, c), nullptr}};
  Value* base = b.unary(CoreOp::floor, c);
  Value* f = b.sub(c, base);
  Value* one = b.scalar(c->type.dtype, 1);
  if (g.mode == Interp::linear) return {{base, b.sub(one, f)}, {add_c(b, base, 1), f}};
  // cubic_weight(f + 1 - a) for a = 0..3, each on its own branch of the piecewise polynomial.
  constexpr double A = -0.75;
  auto inner = [&](Value* t) { return cubic_poly(b, t, A + 2, -(A + 3), 0, 1); };
  auto outer = [&](Value* t) { return cubic_poly(b, t, A, -5 * A, 8 * A, -4 * A); };
  Value* w[4] = {outer(add_c(b, f, 1)), inner(f), inner(b.sub(one, f)),
                 outer(b.sub(b.scalar(c->type.dtype, 2), f))};
  std::vector<Tap> taps;
  for (int a = 0; a < 4; ++a) {
    Value* pos = add_c(b, base, a - 1);
    // tap_index(): border/reflection move each integer tap inside (then truncate, >= 0 here).
    if (g.pad != Pad::zeros) pos = b.unary(CoreOp::floor, pad_coord_v(b, pos, len, g));
    taps.push_back({pos, w[a]});
  }
  return taps;
}

std::vector<Value*> grid_sample_decompose(CoreBuilder& b, const Node& n) {
  const GridSampleCfg cfg = grid_sample_cfg(n);
  Value* x = n.inputs[0];
  const Shape& xs = x->type.shape;
  const Shape& out = n.outputs[0]->type.shape;
  const int sp = static_cast<int>(xs.size()) - 2;
  const int64_t N = xs[0], C = xs[1];
  const int64_t S = shape_numel(Shape(xs.begin() + 2, xs.end())),
                P = shape_numel(Shape(out.begin() + 2, out.end()));
  const DType ct = x->type.dtype == DType::f64 || n.inputs[1]->type.dtype == DType::f64
                       ? DType::f64
                       : DType::f32;
  Value* grid = b.convert(b.reshape(n.inputs[1], {N, P, sp}), ct);
  Value* all_finite = nullptr;
  std::vector<std::vector<Tap>> taps;
  for (int d = 0; d < sp; ++d) {
    // Grid components are ordered (x, y[, z]) = innermost spatial dim first.
    Value* gv = component(b, grid, sp - 1 - d);
    const int64_t len = xs[d + 2];
    Value* c =
        cfg.align
            ? mul_c(b, add_c(b, gv, 1), (len - 1) / 2.0)
            : mul_c(b, add_c(b, mul_c(b, add_c(b, gv, 1), static_cast<double>(len)), -1), 0.5);
    if (cfg.mode != Interp::cubic) c = pad_coord_v(b, c, len, cfg);
    // Non-finite coordinates give 0; far-outside ones are bounded so the integer conversions
    // stay defined.
    Value* finite = b.compare("lt", abs_of(b, c), b.scalar(ct, kInf));
    all_finite = and_of(b, all_finite, finite);
    c = b.select(finite, clamp_c(b, c, -(1 << 22), 1 << 22), b.scalar(ct, 0));
    taps.push_back(grid_taps(b, c, len, cfg));
  }
  Value* xf = b.convert(b.reshape(x, {N, C, S}), ct);
  const Shape ncp = {N, C, P};
  Value* acc = nullptr;
  for (std::vector<size_t> pick(sp, 0);;) {
    Value *flat = nullptr, *inside = nullptr, *w = nullptr;
    int64_t stride = 1;
    for (int d = sp - 1; d >= 0; --d) {
      const Tap& t = taps[d][pick[d]];
      const int64_t len = xs[d + 2];
      inside = and_of(b, inside, within(b, t.pos, 0, static_cast<double>(len - 1)));
      Value* i = mul_c(b, b.convert(clamp_c(b, t.pos, 0, static_cast<double>(len - 1)), DType::i32),
                       static_cast<double>(stride));
      flat = flat ? b.add(flat, i) : i;
      if (t.w) w = w ? b.mul(w, t.w) : t.w;
      stride *= len;
    }
    Value* v = b.emit(CoreOp::gather, {xf, dims_of(b, flat, ncp, {0, 2})}, {{"axis", int64_t{2}}});
    v = b.select(dims_of(b, inside, ncp, {0, 2}), v, b.scalar(ct, 0));
    if (w) v = b.mul(v, dims_of(b, w, ncp, {0, 2}));
    acc = acc ? b.add(acc, v) : v;
    // Next combination of taps (odometer over the spatial dims).
    int d = 0;
    while (d < sp && ++pick[d] == taps[d].size()) pick[d++] = 0;
    if (d == sp) break;
  }
  acc = b.select(dims_of(b, all_finite, ncp, {0, 2}), acc, b.scalar(ct, 0));
  return {b.convert(b.reshape(acc, out), x->type.dtype)};
}

// ---- AffineGrid -----------------------------------------------------------------------------

void affine_grid_infer(InferCtx& c) {
  const auto& th = c.in(0);
  if (th.shape.size() != 3) fail("AffineGrid theta must be [N, 2, 3] or [N, 3, 4]");
  const auto& sz = c.in(1);
  if (sz.shape.size() != 1 || sz.shape[0] < 0)
    fail("AffineGrid size must be a 1-D tensor of static length");
  const int64_t r = sz.shape[0];
  if (r != 4 && r != 5) fail("AffineGrid size must have 4 or 5 elements");
  Shape s(r, kUnknownDim);
  if (auto v = known_ints(c, 1)) {
    s = {(*v)[0]};
    s.insert(s.end(), v->begin() + 2, v->end());
    s.push_back(r - 2);
  } else {
    s = Shape(r, kUnknownDim);
    s[0] = th.shape[0];
    s.back() = r - 2;
  }
  c.set_out(0, {th.dtype, s});
}

void affine_grid_kernel(KernelCtx& c) {
  const Tensor& th = c.in(0);
  const std::vector<int64_t> sz = c.in(1).to_i64();
  const int sp = static_cast<int>(sz.size()) - 2;
  if (sp != 2 && sp != 3) fail("AffineGrid size must have 4 or 5 elements");
  const int64_t N = sz[0];
  if (th.rank() != 3 || th.dim(0) != N || th.dim(1) != sp || th.dim(2) != sp + 1)
    fail("theta shape {} does not fit size with {} spatial dims", shape_str(th.shape()), sp);
  const bool align = c.node().attr_i("align_corners", 0) != 0;
  Shape os = {N};
  os.insert(os.end(), sz.begin() + 2, sz.end());
  os.push_back(sp);
  for (int64_t d : os)
    if (d < 0) fail("AffineGrid size must be non-negative");
  Tensor y(th.dtype(), os);
  auto norm = [&](int64_t i, int64_t len) {
    if (align) return len > 1 ? -1.0 + 2.0 * i / (len - 1) : 0.0;
    return (2.0 * i + 1) / len - 1;
  };
  int64_t pts = 1;
  for (int d = 0; d < sp; ++d) pts *= sz[d + 2];
  std::vector<double> t = th.to_f64();
  std::vector<double> p(sp + 1);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < pts; ++i) {
      // Homogeneous point (x, y[, z], 1), x along the innermost dim.
      int64_t rem = i;
      for (int d = sp - 1; d >= 0; --d) {
        const int64_t len = sz[d + 2];
        p[sp - 1 - d] = norm(rem % len, len);
        rem /= len;
      }
      p[sp] = 1;
      for (int k = 0; k < sp; ++k) {
        double acc = 0;
        for (int j = 0; j <= sp; ++j) acc += t[(n * sp + k) * (sp + 1) + j] * p[j];
        y.set_f((n * pts + i) * sp + k, acc);
      }
    }
  c.set_out(0, std::move(y));
}

// ---- RoiAlign -------------------------------------------------------------------------------

void roi_align_infer(InferCtx& c) {
  const auto& x = c.in(0);
  const auto& rois = c.in(1);
  if (x.shape.size() != 4) fail("RoiAlign input must be 4-D");
  if (rois.shape.size() != 2 || (rois.shape[1] >= 0 && rois.shape[1] != 4))
    fail("rois must be [num_rois, 4]");
  if (c.in(2).shape.size() != 1) fail("batch_indices must be 1-D");
  const auto& n = c.node();
  std::string mode = n.attr_s("mode", "avg");
  if (mode != "avg" && mode != "max") fail("unknown RoiAlign mode '{}'", mode);
  std::string ct = n.attr_s("coordinate_transformation_mode", "half_pixel");
  if (ct != "half_pixel" && ct != "output_half_pixel")
    fail("unknown coordinate_transformation_mode '{}'", ct);
  const int64_t oh = n.attr_i("output_height", 1), ow = n.attr_i("output_width", 1);
  if (oh < 1 || ow < 1) fail("output_height and output_width must be positive");
  int64_t R = rois.shape[0] >= 0 ? rois.shape[0] : c.in(2).shape[0];
  c.set_out(0, {x.dtype, {R, x.shape[1], oh, ow}});
}

void roi_align_kernel(KernelCtx& c) {
  const Tensor& x = c.in(0);
  const Tensor& rois = c.in(1);
  const Tensor& bidx = c.in(2);
  const auto& n = c.node();
  const bool is_max = n.attr_s("mode", "avg") == "max";
  const bool half_pixel = n.attr_s("coordinate_transformation_mode", "half_pixel") == "half_pixel";
  const int64_t oh = n.attr_i("output_height", 1), ow = n.attr_i("output_width", 1);
  const int64_t ratio = n.attr_i("sampling_ratio", 0);
  const double scale = n.attr_f("spatial_scale", 1.0);
  const int64_t R = rois.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  if (rois.rank() != 2 || rois.dim(1) != 4) fail("rois must be [num_rois, 4]");
  if (H < 1 || W < 1) fail("RoiAlign input has an empty spatial dim");
  if (bidx.numel() != R) fail("batch_indices has {} entries for {} rois", bidx.numel(), R);
  Tensor y(x.dtype(), {R, C, oh, ow});
  std::vector<double> xin = x.to_f64();
  const double off = half_pixel ? 0.5 : 0.0;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t b = bidx.get_i(r);
    if (b < 0 || b >= x.dim(0)) fail("batch index {} is out of range for batch {}", b, x.dim(0));
    const double x0 = rois.get_f(r * 4) * scale - off, y0 = rois.get_f(r * 4 + 1) * scale - off;
    const double x1 = rois.get_f(r * 4 + 2) * scale - off, y1 = rois.get_f(r * 4 + 3) * scale - off;
    double rw = x1 - x0, rh = y1 - y0;
    if (!half_pixel) {
      // The legacy mode forces at least a 1x1 region.
      rw = std::max(rw, 1.0);
      rh = std::max(rh, 1.0);
    }
    if (!std::isfinite(rw) || !std::isfinite(rh)) fail("roi {} has non-finite coordinates", r);
    const double bh = rh / oh, bw = rw / ow;
    const int64_t gh = ratio > 0 ? ratio : static_cast<int64_t>(std::ceil(rh / oh));
    const int64_t gw = ratio > 0 ? ratio : static_cast<int64_t>(std::ceil(rw / ow));
    if (gh > (1 << 20) || gw > (1 << 20) || gh * gw > (1 << 24))
      fail("roi {} needs too many sampling points", r);
    const double count = static_cast<double>(std::max<int64_t>(gh * gw, 1));
    for (int64_t ch = 0; ch < C; ++ch) {
      const double* plane = xin.data() + (b * C + ch) * H * W;
      for (int64_t ph = 0; ph < oh; ++ph)
        for (int64_t pw = 0; pw < ow; ++pw) {
          double acc = 0;
          bool first = true;
          for (int64_t iy = 0; iy < gh; ++iy)
            for (int64_t ix = 0; ix < gw; ++ix) {
              double yy = y0 + ph * bh + (iy + 0.5) * bh / gh;
              double xx = x0 + pw * bw + (ix + 0.5) * bw / gw;
              double w[4] = {0, 0, 0, 0};
              int64_t pos[4] = {0, 0, 0, 0};
              // Samples more than one pixel outside the map contribute zero.
              if (!(yy < -1.0 || yy > H || xx < -1.0 || xx > W) && std::isfinite(yy) &&
                  std::isfinite(xx)) {
                yy = std::max(yy, 0.0);
                xx = std::max(xx, 0.0);
                int64_t ylo = static_cast<int64_t>(yy), xlo = static_cast<int64_t>(xx), yhi, xhi;
                if (ylo >= H - 1)
                  yhi = ylo = H - 1, yy = static_cast<double>(ylo);
                else
                  yhi = ylo + 1;
                if (xlo >= W - 1)
                  xhi = xlo = W - 1, xx = static_cast<double>(xlo);
                else
                  xhi = xlo + 1;
                const double ly = yy - ylo, lx = xx - xlo, hy = 1 - ly, hx = 1 - lx;
                w[0] = hy * hx, w[1] = hy * lx, w[2] = ly * hx, w[3] = ly * lx;
                pos[0] = ylo * W + xlo, pos[1] = ylo * W + xhi, pos[2] = yhi * W + xlo,
                pos[3] = yhi * W + xhi;
              }
              if (is_max) {
                // Max mode takes the largest weighted corner, as the reference runtimes do.
                double m = std::max({w[0] * plane[pos[0]], w[1] * plane[pos[1]],
                                     w[2] * plane[pos[2]], w[3] * plane[pos[3]]});
                acc = first ? m : std::max(acc, m);
                first = false;
              } else {
                acc += w[0] * plane[pos[0]] + w[1] * plane[pos[1]] + w[2] * plane[pos[2]] +
                       w[3] * plane[pos[3]];
              }
            }
          y.set_f(((r * C + ch) * oh + ph) * ow + pw, is_max ? acc : acc / count);
        }
    }
  }
  c.set_out(0, std::move(y));
}

// Opset 10 RoiAlign had no coordinate_transformation_mode; it behaved as output_half_pixel.
void roi_align_upgrade(Graph&, Node& n, int) {
  if (!n.has_attr("coordinate_transformation_mode"))
    n.attrs["coordinate_transformation_mode"] = std::string("output_half_pixel");
}

// ---- NonMaxSuppression ----------------------------------------------------------------------

void nms_infer(InferCtx& c) {
  if (c.in(0).shape.size() != 3 || c.in(1).shape.size() != 3) fail("boxes and scores must be 3-D");
  const int64_t cpb = c.node().attr_i("center_point_box", 0);
  if (cpb != 0 && cpb != 1) fail("center_point_box must be 0 or 1");
  c.set_out(0, {DType::i64, {kUnknownDim, 3}});
}

// Choose (domain tessel): the run-time choice between two values by a one-element condition, as ONNX's
// If returns its taken branch's outputs. The importer computes both branches (frontend/onnx/expand.cpp)
// and uses Where when their types agree; Choose is for branches whose shapes differ (torchvision's
// batched NMS: an empty i64[0] when there are no boxes, else i64[?]). Its result has the dims the two
// share and unknown dims where they differ; with the condition known, the chosen value's own type.
void choose_infer(InferCtx& c) {
  const TensorType& a = c.in(1);
  const TensorType& b = c.in(2);
  if (shape_known(c.in(0).shape) && shape_numel(c.in(0).shape) != 1)
    fail("the condition must have one element, has shape {}", shape_str(c.in(0).shape));
  if (a.dtype != b.dtype) fail("the two values must have one dtype; they are {} and {}", a.str(), b.str());
  if (a.shape.size() != b.shape.size()) fail("the two values must have one rank; they are {} and {}", a.str(), b.str());
  if (const Tensor* k = c.value(0)) {
    c.set_out(0, k->get_i(0) != 0 ? a : b);
    return;
  }
  if (a == b) {
    c.set_out(0, a);
    return;
  }
  const Dims da = a.dims(), db = b.dims();
  Dims d(da.size());
  for (size_t i = 0; i < d.size(); ++i) d[i] = da[i] == db[i] ? da[i] : Dim(kUnknownDim);
  c.set_out(0, TensorType::of(a.dtype, d));
}

void choose_kernel(KernelCtx& c) {
  const Tensor& cond = c.in(0);
  if (cond.numel() != 1) fail("the condition must have one element, has shape {}", shape_str(cond.shape()));
  c.set_out(0, c.in(cond.get_i(0) != 0 ? 1 : 2));
}

void nms_kernel(KernelCtx& c) {
  const Tensor& boxes = c.in(0);
  const Tensor& scores = c.in(1);
  const bool center = c.node().attr_i("center_point_box", 0) == 1;
  const int64_t B = boxes.dim(0), S = boxes.dim(1);
  if (boxes.dim(2) != 4) fail("boxes last dim must be 4");
  if (scores.dim(0) != B || scores.dim(2) != S)
    fail("scores shape {} does not fit boxes {}", shape_str(scores.shape()),
         shape_str(boxes.shape()));
  const int64_t C = scores.dim(1);
  const int64_t max_out =
      c.has_in(2) && c.in(2).numel() > 0 ? int_scalar_of(c.in(2), "max_output_boxes_per_class") : 0;
  const double iou_th =
      c.has_in(3) && c.in(3).numel() > 0 ? scalar_of(c.in(3), "iou_threshold") : 0.0;
  const bool has_score_th = c.has_in(4) && c.in(4).numel() > 0;
  const double score_th = has_score_th ? scalar_of(c.in(4), "score_threshold") : 0.0;
  std::vector<double> bx = boxes.to_f64(), sc = scores.to_f64();
  // Boxes as (y1, x1, y2, x2) with y1 <= y2 and x1 <= x2.
  auto corners = [&](int64_t b, int64_t i) -> std::array<double, 4> {
    const double* p = bx.data() + (b * S + i) * 4;
    if (center) return {p[1] - p[3] / 2, p[0] - p[2] / 2, p[1] + p[3] / 2, p[0] + p[2] / 2};
    return {std::min(p[0], p[2]), std::min(p[1], p[3]), std::max(p[0], p[2]), std::max(p[1], p[3])};
  };
  auto iou = [](const std::array<double, 4>& a, const std::array<double, 4>& b) {
    const double aa = (a[2] - a[0]) * (a[3] - a[1]), ab = (b[2] - b[0]) * (b[3] - b[1]);
    if (aa <= 0 || ab <= 0) return 0.0;
    const double ih = std::min(a[2], b[2]) - std::max(a[0], b[0]);
    const double iw = std::min(a[3], b[3]) - std::max(a[1], b[1]);
    if (ih <= 0 || iw <= 0) return 0.0;
    const double inter = ih * iw;
    return inter / (aa + ab - inter);
  };
  std::vector<int64_t> out;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < C; ++k) {
      if (max_out <= 0) continue;
      std::vector<int64_t> cand;
      const double* s = sc.data() + (b * C + k) * S;
      for (int64_t i = 0; i < S; ++i)
        if (!std::isnan(s[i]) && (!has_score_th || s[i] > score_th)) cand.push_back(i);
      // Highest score first; ties keep the lower box index first.
      std::stable_sort(cand.begin(), cand.end(), [&](int64_t i, int64_t j) { return s[i] > s[j]; });
      std::vector<int64_t> kept;
      for (int64_t i : cand) {
        if (static_cast<int64_t>(kept.size()) >= max_out) break;
        const auto bi = corners(b, i);
        bool ok = true;
        for (int64_t j : kept)
          if (iou(bi, corners(b, j)) > iou_th) {
            ok = false;
            break;
          }
        if (ok) kept.push_back(i);
      }
      for (int64_t i : kept) out.insert(out.end(), {b, k, i});
    }
  c.set_out(0, Tensor::from_i64(DType::i64, {static_cast<int64_t>(out.size()) / 3, 3}, out));
}

// ---- Window functions -----------------------------------------------------------------------

// Generalized cosine window: a0 - a1 cos(2 pi n / D) + a2 cos(4 pi n / D).
OpDef window_op(std::string name, double a0, double a1, double a2) {
  auto infer = [](InferCtx& c) {
    if (!is_int(c.in(0).dtype)) fail("window size must be an integer");
    DType t = float_dtype_attr(c.node(), "output_datatype");
    if (!is_float(t)) fail("output_datatype must be a float type");
    auto n = known_scalar(c, 0);
    c.set_out(0, {t, {n ? static_cast<int64_t>(*n) : kUnknownDim}});
  };
  auto kernel = [a0, a1, a2](KernelCtx& c) {
    const int64_t n = int_scalar_of(c.in(0), "size");
    if (n < 0) fail("window size must be non-negative, got {}", n);
    if (n > (int64_t{1} << 34)) fail("window size {} is too large", n);
    const bool periodic = c.node().attr_i("periodic", 1) != 0;
    const double denom = periodic ? static_cast<double>(n) : static_cast<double>(n - 1);
    Tensor y(float_dtype_attr(c.node(), "output_datatype"), {n});
    for (int64_t i = 0; i < n; ++i) {
      const double ph = denom > 0 ? 2 * kPi * i / denom : 0.0;
      y.set_f(i, a0 - a1 * std::cos(ph) + a2 * std::cos(2 * ph));
    }
    c.set_out(0, std::move(y));
  };
  // The size is static when the output type is: iota phases, cos x = sin(x + pi/2).
  auto decompose = [a0, a1, a2](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    const Shape& s = n.outputs[0]->type.shape;
    const DType ct = compute_type(n.outputs[0]->type.dtype);
    const double denom = static_cast<double>(n.attr_i("periodic", 1) != 0 ? s[0] : s[0] - 1);
    Value* ph = mul_c(b, b.iota(ct, s, 0), denom > 0 ? 2 * kPi / denom : 0.0);
    Value* y = add_c(b, mul_c(b, cos_of(b, ph), -a1), a0);
    if (a2 != 0) y = b.add(y, mul_c(b, cos_of(b, mul_c(b, ph, 2)), a2));
    return {b.convert(y, n.outputs[0]->type.dtype)};
  };
  return with_decomposition(
      make_op(std::move(name), 17, 1, 1,
              {{"output_datatype", AttrKind::i}, {"periodic", AttrKind::i}}, infer, kernel),
      decompose);
}

// ---- DFT ------------------------------------------------------------------------------------

// One transform of `in` (complex samples) producing `len_out` outputs of an `n`-point DFT.
std::vector<cplx> dft_line(const std::vector<cplx>& in, int64_t n, int64_t len_out, bool inverse) {
  std::vector<cplx> out(len_out);
  const double sign = inverse ? 1.0 : -1.0;
  for (int64_t k = 0; k < len_out; ++k) {
    cplx acc = 0;
    for (int64_t j = 0; j < n && j < static_cast<int64_t>(in.size()); ++j) {
      // Reduce k*j modulo n first so the angle stays exact for long transforms.
      const double ang = sign * 2 * kPi * static_cast<double>((k * j) % n) / static_cast<double>(n);
      acc += in[j] * cplx(std::cos(ang), std::sin(ang));
    }
    out[k] = inverse ? acc / static_cast<double>(n) : acc;
  }
  return out;
}

struct DftCfg {
  int axis;
  int64_t n;        // transform length
  int64_t len_out;  // output length along the axis
  bool real_out;
};

DftCfg dft_cfg(const Node& node, const Shape& x, std::optional<int64_t> dft_len, int64_t axis_in) {
  const int r = static_cast<int>(x.size());
  if (r < 2 || (x.back() >= 0 && x.back() != 1 && x.back() != 2))
    fail("DFT input's last dim must be 1 or 2");
  int64_t a = axis_in < 0 ? axis_in + r : axis_in;
  if (a < 0 || a > r - 2) fail("DFT axis {} is out of range for rank {}", axis_in, r);
  const bool inverse = node.attr_i("inverse", 0) != 0, onesided = node.attr_i("onesided", 0) != 0;
  DftCfg c{static_cast<int>(a), 0, 0, false};
  const int64_t in_len = x[a];
  if (dft_len && *dft_len < 1) fail("dft_length must be positive, got {}", *dft_len);
  if (onesided && inverse) {
    c.n = dft_len ? *dft_len : (in_len >= 0 ? 2 * (in_len - 1) : kUnknownDim);
    c.len_out = c.n;
    c.real_out = true;
  } else {
    c.n = dft_len ? *dft_len : in_len;
    c.len_out = onesided && c.n >= 0 ? c.n / 2 + 1 : c.n;
  }
  return c;
}

void dft_infer(InferCtx& c) {
  const auto& x = c.in(0);
  if (!is_float(x.dtype)) fail("DFT input must be a float type");
  if (x.shape.size() < 2) fail("DFT input must have rank >= 2, got {}", shape_str(x.shape));
  std::optional<int64_t> len;
  if (c.has_in(1)) {
    auto v = known_scalar(c, 1);
    if (!v) {
      Shape s = x.shape;
      for (size_t d = 1; d + 1 < s.size(); ++d) s[d] = kUnknownDim;
      s.back() = c.node().attr_i("inverse", 0) && c.node().attr_i("onesided", 0) ? 1 : 2;
      return c.set_out(0, {x.dtype, s});
    }
    len = static_cast<int64_t>(*v);
  }
  const bool both = c.node().attr_i("inverse", 0) && c.node().attr_i("onesided", 0);
  const bool changes_len = len || c.node().attr_i("onesided", 0);
  std::optional<double> axis = c.has_in(2) ? known_scalar(c, 2) : std::optional<double>(-2);
  if (!axis) {
    // Unknown axis: only dims that the transform can resize become unknown.
    Shape s = x.shape;
    if (changes_len)
      for (size_t d = 1; d + 1 < s.size(); ++d) s[d] = kUnknownDim;
    s.back() = both ? 1 : 2;
    return c.set_out(0, {x.dtype, s});
  }
  DftCfg cfg = dft_cfg(c.node(), x.shape, len, static_cast<int64_t>(*axis));
  Shape s = x.shape;
  s[cfg.axis] = cfg.len_out;
  s.back() = cfg.real_out ? 1 : 2;
  c.set_out(0, {x.dtype, s});
}

void dft_kernel(KernelCtx& c) {
  const Tensor& x = c.in(0);
  std::optional<int64_t> len;
  if (c.has_in(1)) len = int_scalar_of(c.in(1), "dft_length");
  const int64_t axis = c.has_in(2) ? int_scalar_of(c.in(2), "axis") : -2;
  const DftCfg cfg = dft_cfg(c.node(), x.shape(), len, axis);
  const bool inverse = c.node().attr_i("inverse", 0) != 0;
  if (cfg.n < 1) fail("DFT length must be positive");
  const int r = x.rank();
  const int64_t comp = x.dim(r - 1);
  const int64_t in_len = x.dim(cfg.axis);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < cfg.axis; ++d) outer *= x.dim(d);
  for (int d = cfg.axis + 1; d < r - 1; ++d) inner *= x.dim(d);
  Shape os = x.shape();
  os[cfg.axis] = cfg.len_out;
  os.back() = cfg.real_out ? 1 : 2;
  Tensor y(x.dtype(), os);
  const int64_t ocomp = os.back();
  std::vector<double> xin = x.to_f64();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      std::vector<cplx> line(cfg.n, 0.0);
      if (cfg.real_out) {
        // Rebuild the full Hermitian spectrum from its first n/2+1 bins.
        const int64_t half = std::min(in_len, cfg.n / 2 + 1);
        for (int64_t k = 0; k < half; ++k) {
          const int64_t src = ((o * in_len + k) * inner + i) * comp;
          line[k] = cplx(xin[src], comp == 2 ? xin[src + 1] : 0.0);
        }
        for (int64_t k = cfg.n / 2 + 1; k < cfg.n; ++k) line[k] = std::conj(line[cfg.n - k]);
      } else {
        for (int64_t k = 0; k < std::min(in_len, cfg.n); ++k) {
          const int64_t src = ((o * in_len + k) * inner + i) * comp;
          line[k] = cplx(xin[src], comp == 2 ? xin[src + 1] : 0.0);
        }
      }
      std::vector<cplx> res = dft_line(line, cfg.n, cfg.len_out, inverse);
      for (int64_t k = 0; k < cfg.len_out; ++k) {
        const int64_t dst = ((o * cfg.len_out + k) * inner + i) * ocomp;
        y.set_f(dst, res[k].real());
        if (ocomp == 2) y.set_f(dst + 1, res[k].imag());
      }
    }
  c.set_out(0, std::move(y));
}

// DFT-17 took the axis as an attribute (default 1); DFT-20 takes it as the third input.
void dft_upgrade(Graph& g, Node& n, int) {
  const int64_t axis = n.attr_i("axis", 1);
  n.attrs.erase("axis");
  Value* v = g.add_constant(g.unique_name(n.name + "_axis"), Tensor::scalar_i(DType::i64, axis));
  if (n.inputs.size() < 3) n.inputs.resize(3, nullptr);
  n.inputs[2] = v;
}

// ---- STFT -----------------------------------------------------------------------------------

void stft_infer(InferCtx& c) {
  const auto& x = c.in(0);
  if (x.shape.size() != 3 || (x.shape[2] >= 0 && x.shape[2] != 1 && x.shape[2] != 2))
    fail("STFT signal must be [batch, length, 1 or 2]");
  std::optional<double> step = known_scalar(c, 1);
  std::optional<int64_t> flen;
  if (c.has_in(3)) {
    if (auto v = known_scalar(c, 3)) flen = static_cast<int64_t>(*v);
  } else if (c.has_in(2) && c.in(2).shape.size() == 1 && c.in(2).shape[0] >= 0) {
    flen = c.in(2).shape[0];
  }
  const bool onesided = c.node().attr_i("onesided", 1) != 0;
  int64_t frames = kUnknownDim, bins = kUnknownDim;
  if (flen) bins = onesided ? *flen / 2 + 1 : *flen;
  if (flen && step && *step > 0 && x.shape[1] >= 0)
    frames = (x.shape[1] - *flen) / static_cast<int64_t>(*step) + 1;
  c.set_out(0, {x.dtype, {x.shape[0], frames, bins, 2}});
}

void stft_kernel(KernelCtx& c) {
  const Tensor& x = c.in(0);
  const int64_t step = int_scalar_of(c.in(1), "frame_step");
  const Tensor* win = c.has_in(2) ? &c.in(2) : nullptr;
  int64_t flen = 0;
  if (c.has_in(3))
    flen = int_scalar_of(c.in(3), "frame_length");
  else if (win)
    flen = win->numel();
  else
    fail("STFT needs a window or a frame_length");
  if (win && win->numel() != flen)
    fail("window has {} elements but frame_length is {}", win->numel(), flen);
  if (step < 1 || flen < 1) fail("frame_step and frame_length must be positive");
  const int64_t B = x.dim(0), L = x.dim(1), comp = x.dim(2);
  if (comp != 1 && comp != 2) fail("STFT signal's last dim must be 1 or 2, got {}", comp);
  if (flen > L) fail("frame_length {} exceeds the signal length {}", flen, L);
  const bool onesided = c.node().attr_i("onesided", 1) != 0;
  const int64_t frames = (L - flen) / step + 1, bins = onesided ? flen / 2 + 1 : flen;
  Tensor y(x.dtype(), {B, frames, bins, 2});
  std::vector<double> xin = x.to_f64();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t f = 0; f < frames; ++f) {
      std::vector<cplx> line(flen);
      for (int64_t j = 0; j < flen; ++j) {
        const int64_t src = (b * L + f * step + j) * comp;
        const double w = win ? win->get_f(j) : 1.0;
        line[j] = cplx(xin[src], comp == 2 ? xin[src + 1] : 0.0) * w;
      }
      std::vector<cplx> res = dft_line(line, flen, bins, false);
      for (int64_t k = 0; k < bins; ++k) {
        const int64_t dst = ((b * frames + f) * bins + k) * 2;
        y.set_f(dst, res[k].real());
        y.set_f(dst + 1, res[k].imag());
      }
    }
  c.set_out(0, std::move(y));
}

// ---- MelWeightMatrix ------------------------------------------------------------------------

void mel_infer(InferCtx& c) {
  DType t = float_dtype_attr(c.node(), "output_datatype");
  if (!is_float(t)) fail("output_datatype must be a float type");
  auto bins = known_scalar(c, 0);
  auto dft = known_scalar(c, 1);
  c.set_out(0, {t,
                {dft ? static_cast<int64_t>(*dft) / 2 + 1 : kUnknownDim,
                 bins ? static_cast<int64_t>(*bins) : kUnknownDim}});
}

void mel_kernel(KernelCtx& c) {
  const int64_t nmel = int_scalar_of(c.in(0), "num_mel_bins");
  const int64_t dft = int_scalar_of(c.in(1), "dft_length");
  const int64_t rate = int_scalar_of(c.in(2), "sample_rate");
  const double lo = scalar_of(c.in(3), "lower_edge_hertz"),
               hi = scalar_of(c.in(4), "upper_edge_hertz");
  if (nmel < 1 || dft < 1 || rate < 1)
    fail("num_mel_bins, dft_length and sample_rate must be positive");
  if (!(lo >= 0 && lo < hi && std::isfinite(hi)))
    fail("need 0 <= lower_edge_hertz < upper_edge_hertz (finite)");
  const int64_t nspec = dft / 2 + 1;
  auto to_mel = [](double f) { return 2595.0 * std::log10(1 + f / 700.0); };
  const double mlo = to_mel(lo), mhi = to_mel(hi);
  // ONNX divides the mel range by nmel + 2 although the nmel + 2 edges span only nmel + 1 steps,
  // so the top edge stays below upper_edge_hertz (the conformance data relies on this).
  const double step = (mhi - mlo) / static_cast<double>(nmel + 2);
  // Band edges as spectrogram bin indices.
  std::vector<int64_t> edge(nmel + 2);
  for (int64_t i = 0; i < nmel + 2; ++i) {
    const double hz = 700.0 * (std::pow(10.0, (i * step + mlo) / 2595.0) - 1);
    const double e = std::floor((dft + 1) * hz / rate);
    edge[i] = static_cast<int64_t>(std::min(e, static_cast<double>(nspec + 1)));
  }
  Tensor y(float_dtype_attr(c.node(), "output_datatype"), {nspec, nmel});
  auto put = [&](int64_t row, int64_t col, double v) {
    if (row >= 0 && row < nspec) y.set_f(row * nmel + col, v);
  };
  for (int64_t m = 0; m < nmel; ++m) {
    const int64_t a = edge[m], ctr = edge[m + 1], b = edge[m + 2];
    if (ctr == a)
      put(ctr, m, 1.0);
    else
      for (int64_t j = a; j <= ctr; ++j)
        put(j, m, static_cast<double>(j - a) / static_cast<double>(ctr - a));
    if (b > ctr)
      for (int64_t j = ctr; j < b; ++j)
        put(j, m, static_cast<double>(b - j) / static_cast<double>(b - ctr));
  }
  c.set_out(0, std::move(y));
}

// ---- decomposition hooks (GridSample's sits with its kernel) ----------------------------------

// The normalised coordinate of every index along dim `axis` of `shape` (AffineGrid's norm()).
Value* affine_coord(CoreBuilder& b, DType t, const Shape& shape, int axis, bool align) {
  const int64_t len = shape[axis];
  Value* i = b.iota(t, shape, axis);
  if (align)
    return len > 1 ? add_c(b, mul_c(b, i, 2.0 / static_cast<double>(len - 1)), -1)
                   : b.full(t, shape, 0);
  return add_c(b, b.div(add_c(b, mul_c(b, i, 2), 1), b.scalar(t, static_cast<double>(len))), -1);
}

// The homogeneous base grid [points, sp + 1] (x innermost, then y[, z], then 1) contracted with
// theta [N, sp, sp + 1]. The output shape carries `size`, which is therefore not needed.
std::vector<Value*> affine_grid_decompose(CoreBuilder& b, const Node& n) {
  const Shape& out = n.outputs[0]->type.shape;
  const int sp = static_cast<int>(out.back());
  const Shape spatial(out.begin() + 1, out.end() - 1);
  const int64_t pts = shape_numel(spatial);
  const DType ct = compute_type(n.outputs[0]->type.dtype);
  const bool align = n.attr_i("align_corners", 0) != 0;
  std::vector<Value*> cols;
  for (int d = sp - 1; d >= 0; --d)
    cols.push_back(b.reshape(affine_coord(b, ct, spatial, d, align), {pts, 1}));
  cols.push_back(b.full(ct, {pts, 1}, 1));
  Value* base = b.concat(cols, 1);
  Value* y = dot(b, b.convert(n.inputs[0], ct), base, {2}, {1});  // [N, sp, points]
  y = b.transpose(y, {0, 2, 1});
  return {b.convert(b.reshape(y, out), n.outputs[0]->type.dtype)};
}

// RoiAlign's sample positions along one axis (y or x) of every roi: for samples
// start + p * bin + (i + 0.5) * bin / g, the two neighbouring pixels (i32, 0 where the sample is
// more than one pixel outside the map) and their bilinear weights (0 there), each [R, out, g].
struct RoiAxis {
  Value *lo, *hi, *wlo, *whi;
};

RoiAxis roi_axis(CoreBuilder& b, Value* start, Value* bin, int64_t out, int64_t g, int64_t len) {
  const DType t = start->type.dtype;
  const int64_t R = start->type.shape[0];
  const Shape s = {R, out, g};
  Value* p = b.iota(t, s, 1);
  Value* i = add_c(b, b.iota(t, s, 2), 0.5);
  Value* st = dims_of(b, start, s, {0});
  Value* bn = dims_of(b, bin, s, {0});
  Value* v = b.add(b.add(st, b.mul(p, bn)), div_c(b, b.mul(i, bn), static_cast<double>(g)));
  Value* valid = within(b, v, -1, static_cast<double>(len));
  v = b.select(valid, b.max(v, b.scalar(t, 0)), b.scalar(t, 0));
  Value* lo = b.unary(CoreOp::floor, v);
  Value* at_end = b.compare("ge", lo, b.scalar(t, static_cast<double>(len - 1)));
  Value* last = b.scalar(t, static_cast<double>(len - 1));
  lo = b.select(at_end, last, lo);
  Value* hi = b.select(at_end, last, add_c(b, lo, 1));
  Value* l = b.sub(b.select(at_end, lo, v), lo);
  Value* zero = b.scalar(t, 0);
  return {b.convert(lo, DType::i32), b.convert(hi, DType::i32),
          b.select(valid, b.sub(b.scalar(t, 1), l), zero), b.select(valid, l, zero)};
}

// Every sample's four corners gathered from its roi's image plane, weighted, then summed (avg)
// or maxed (max) over corners and samples. The number of samples per bin must be static, so an
// adaptive sampling_ratio (0: ceil(roi size / output size), a run-time value) is unsupported.
std::vector<Value*> roi_align_decompose(CoreBuilder& b, const Node& n) {
  Value *x = n.inputs[0], *rois = n.inputs[1];
  const Shape& xs = x->type.shape;
  const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], R = rois->type.shape[0];
  const int64_t oh = n.attr_i("output_height", 1), ow = n.attr_i("output_width", 1);
  const int64_t g = n.attr_i("sampling_ratio", 0);
  if (g <= 0)
    unsupported(
        "RoiAlign with sampling_ratio 0 takes ceil(roi size / output size) samples per bin, known "
        "only at run time");
  const bool is_max = n.attr_s("mode", "avg") == "max";
  const bool half_pixel = n.attr_s("coordinate_transformation_mode", "half_pixel") == "half_pixel";
  const DType ct = compute_type(x->type.dtype);
  Value* r = add_c(b, mul_c(b, b.convert(rois, ct), n.attr_f("spatial_scale", 1.0)),
                   half_pixel ? -0.5 : 0.0);
  Value* x0 = component(b, r, 0);
  Value* y0 = component(b, r, 1);
  Value* rw = b.sub(component(b, r, 2), x0);
  Value* rh = b.sub(component(b, r, 3), y0);
  if (!half_pixel) {
    // The legacy mode forces at least a 1x1 region.
    rw = b.max(rw, b.scalar(ct, 1));
    rh = b.max(rh, b.scalar(ct, 1));
  }
  RoiAxis ya = roi_axis(b, y0, div_c(b, rh, static_cast<double>(oh)), oh, g, H);
  RoiAxis xa = roi_axis(b, x0, div_c(b, rw, static_cast<double>(ow)), ow, g, W);
  const Shape grid = {R, oh, g, ow, g};
  auto on_y = [&](Value* v) { return dims_of(b, v, grid, {0, 1, 2}); };
  auto on_x = [&](Value* v) { return dims_of(b, v, grid, {0, 3, 4}); };
  const int64_t samples = oh * g * ow * g;
  const Shape rcs = {R, C, samples};
  Value* planes = b.emit(
      CoreOp::gather,
      {b.convert(b.reshape(x, {N, C, H * W}), ct), dims_of(b, n.inputs[2], {R, C, H * W}, {0})},
      {{"axis", int64_t{0}}});
  Value* acc = nullptr;
  for (Value* yi : {ya.lo, ya.hi})
    for (Value* xi : {xa.lo, xa.hi}) {
      Value* pos = b.add(mul_c(b, on_y(yi), static_cast<double>(W)), on_x(xi));
      Value* w = b.mul(on_y(yi == ya.lo ? ya.wlo : ya.whi), on_x(xi == xa.lo ? xa.wlo : xa.whi));
      Value* v = b.emit(CoreOp::gather, {planes, dims_of(b, b.reshape(pos, {R, samples}), rcs, {0, 2})},
                        {{"axis", int64_t{2}}});
      v = b.mul(v, dims_of(b, b.reshape(w, {R, samples}), rcs, {0, 2}));
      acc = !acc ? v : is_max ? b.max(acc, v) : b.add(acc, v);
    }
  Value* y = b.reduce(b.reshape(acc, {R, C, oh, g, ow, g}), is_max ? "max" : "sum", {3, 5}, false);
  if (!is_max) y = div_c(b, y, static_cast<double>(g * g));
  return {b.convert(y, x->type.dtype)};
}

// W[j, c, k, o]: the weight of component c (re, im) of input sample j in component o of bin k of
// an n-point transform (samples beyond the J given are zero). `hermitian`: the J samples are the
// first bins of a Hermitian spectrum whose mirrored conjugates contribute too (onesided inverse).
// Built in double, angles reduced modulo n as the kernel does.
Tensor dft_matrix(DType t, int64_t J, int64_t comp, int64_t n, int64_t K, int64_t ocomp,
                  bool inverse, bool hermitian) {
  std::vector<double> w(static_cast<size_t>(J * comp * K * ocomp), 0.0);
  auto at = [&](int64_t j, int64_t c, int64_t k, int64_t o) -> double& {
    return w[((j * comp + c) * K + k) * ocomp + o];
  };
  const double sign = inverse ? 1.0 : -1.0, scale = inverse ? 1.0 / static_cast<double>(n) : 1.0;
  for (int64_t j = 0; j < J; ++j) {
    std::vector<std::pair<int64_t, bool>> uses = {{j, false}};
    if (hermitian && j >= 1 && n - j >= n / 2 + 1) uses.push_back({n - j, true});
    for (auto [m, conj] : uses)
      for (int64_t k = 0; k < K; ++k) {
        const double ang =
            sign * 2 * kPi * static_cast<double>((k * m) % n) / static_cast<double>(n);
        const double co = std::cos(ang) * scale, si = std::sin(ang) * scale;
        // (re + i im') (co + i si) with im' = -im for a conjugate.
        at(j, 0, k, 0) += co;
        if (ocomp == 2) at(j, 0, k, 1) += si;
        if (comp == 2) {
          at(j, 1, k, 0) += conj ? si : -si;
          if (ocomp == 2) at(j, 1, k, 1) += conj ? -co : co;
        }
      }
  }
  return Tensor::from_f64(t, {J, comp, K, ocomp}, w);
}

// v [..., J at axis, ..., comp] contracted with W [J, comp, K, ocomp]: [..., K at axis, ...,
// ocomp].
Value* dft_along(CoreBuilder& b, Value* v, int axis, Tensor w) {
  const int r = static_cast<int>(v->type.shape.size());
  Value* y = dot(b, v, b.constant(std::move(w)), {axis, r - 1}, {0, 1});
  std::vector<int64_t> perm;
  for (int d = 0; d < r - 1; ++d) perm.push_back(d < axis ? d : d == axis ? r - 2 : d - 1);
  perm.push_back(r - 1);
  return b.transpose(y, perm);
}

// A dot_general with a compile-time DFT matrix. A run-time axis (the output type is static only
// when the transform keeps the length) transforms along every axis that fits and selects.
std::vector<Value*> dft_decompose(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  const Shape& xs = x->type.shape;
  const Shape& out = n.outputs[0]->type.shape;
  const int r = static_cast<int>(xs.size());
  std::optional<int64_t> len;
  if (n.has_input(1)) len = int_scalar_of(b.need_constant(1, "dft_length"), "dft_length");
  const bool inverse = n.attr_i("inverse", 0) != 0;
  const DType ct = compute_type(x->type.dtype);
  Value* xc = b.convert(x, ct);
  auto transform = [&](int64_t axis) -> Value* {
    const DftCfg cfg = dft_cfg(n, xs, len, axis);
    Shape s = xs;
    s[cfg.axis] = cfg.len_out;
    s.back() = cfg.real_out ? 1 : 2;
    if (s != out) return nullptr;
    const int64_t J = std::min(xs[cfg.axis], cfg.real_out ? cfg.n / 2 + 1 : cfg.n);
    std::vector<int64_t> stops(xs.begin(), xs.end());
    stops[cfg.axis] = J;
    Value* v = b.slice(xc, std::vector<int64_t>(r, 0), stops);
    return dft_along(
        b, v, cfg.axis,
        dft_matrix(ct, J, xs.back(), cfg.n, cfg.len_out, s.back(), inverse, cfg.real_out));
  };
  Value* y = nullptr;
  if (!n.has_input(2) || b.known(2)) {
    y = transform(n.has_input(2) ? int_scalar_of(*b.known(2), "axis") : -2);
  } else {
    Value* ax = b.convert(b.reshape(n.inputs[2], {}), DType::i64);
    ax = b.select(b.compare("lt", ax, b.scalar(DType::i64, 0)), add_c(b, ax, r), ax);
    for (int64_t a = 0; a < r - 1; ++a)
      if (Value* v = transform(a))
        y = y ? b.select(b.compare("eq", ax, b.scalar(DType::i64, static_cast<double>(a))), v, y)
              : v;
  }
  if (!y) fail("no DFT axis gives the output type {}", n.outputs[0]->type.str());
  return {b.convert(y, x->type.dtype)};
}

// Frames gathered with iota indices (frame * step + offset), windowed, then one DFT contraction.
std::vector<Value*> stft_decompose(CoreBuilder& b, const Node& n) {
  Value* x = n.inputs[0];
  const Shape& xs = x->type.shape;
  const Shape& out = n.outputs[0]->type.shape;
  const int64_t step = int_scalar_of(b.need_constant(1, "frame_step"), "frame_step");
  const int64_t flen = n.has_input(3)
                           ? int_scalar_of(b.need_constant(3, "frame_length"), "frame_length")
                           : n.inputs[2]->type.shape.at(0);
  const int64_t B = xs[0], F = out[1], C = xs[2];
  const DType ct = compute_type(x->type.dtype);
  const Shape fs = {B, F, flen, C};
  Value* idx = b.add(mul_c(b, b.iota(DType::i32, fs, 1), static_cast<double>(step)),
                     b.iota(DType::i32, fs, 2));
  Value* frames = b.emit(CoreOp::gather, {x, b.reshape(idx, {B, F * flen, C})}, {{"axis", int64_t{1}}});
  frames = b.convert(b.reshape(frames, fs), ct);
  if (n.has_input(2)) frames = b.mul(frames, dims_of(b, b.convert(n.inputs[2], ct), fs, {2}));
  Value* y = dft_along(b, frames, 2, dft_matrix(ct, flen, C, flen, out[2], 2, false, false));
  return {b.convert(y, x->type.dtype)};
}

// Mel band edges from the (possibly run-time) rate and frequency range, computed in f64 as the
// kernel does, then each column's rising and falling ramps by comparisons with a row iota.
std::vector<Value*> mel_decompose(CoreBuilder& b, const Node& n) {
  const Shape& out = n.outputs[0]->type.shape;
  const int64_t nspec = out[0], nmel = out[1];
  const int64_t dft = int_scalar_of(b.need_constant(1, "dft_length"), "dft_length");
  const DType t = DType::f64;
  auto scalar_in = [&](int i) { return b.convert(b.reshape(n.inputs[i], {}), t); };
  const double ln10 = std::log(10.0);
  auto to_mel = [&](Value* f) {
    return mul_c(b, b.unary(CoreOp::log, add_c(b, div_c(b, f, 700), 1)), 2595 / ln10);
  };
  Value* mlo = to_mel(scalar_in(3));
  Value* step = div_c(b, b.sub(to_mel(scalar_in(4)), mlo), static_cast<double>(nmel + 2));
  Value* mel = b.add(b.mul(b.iota(t, {nmel + 2}, 0), step), mlo);
  Value* hz = mul_c(b, add_c(b, b.unary(CoreOp::exp, mul_c(b, div_c(b, mel, 2595), ln10)), -1), 700);
  Value* edge = b.unary(CoreOp::floor, b.div(mul_c(b, hz, static_cast<double>(dft + 1)), scalar_in(2)));
  edge = b.min(edge, b.scalar(t, static_cast<double>(nspec + 1)));
  auto band = [&](int64_t k) { return dims_of(b, b.slice(edge, {k}, {k + nmel}), out, {1}); };
  Value *lo = band(0), *ctr = band(1), *hi = band(2);
  Value* j = b.iota(t, out, 0);
  Value* rise =
      b.select(b.compare("eq", ctr, lo), b.scalar(t, 1), b.div(b.sub(j, lo), b.sub(ctr, lo)));
  Value* fall = b.div(b.sub(hi, j), b.sub(hi, ctr));
  Value* in_rise = b.binary(CoreOp::and_, b.compare("ge", j, lo), b.compare("le", j, ctr));
  Value* in_fall = b.binary(CoreOp::and_, b.compare("gt", j, ctr), b.compare("lt", j, hi));
  Value* y = b.select(in_rise, rise, b.select(in_fall, fall, b.scalar(t, 0)));
  return {b.convert(y, n.outputs[0]->type.dtype)};
}

// NonMaxSuppression has no decomposition: how many boxes it keeps is data-dependent (output
// shape [?, 3]), so it has no static-shape core form.

}  // namespace

void register_misc_ops(OpRegistry& r) {
  {
    OpDef d =
        make_op("GridSample", 20, 2, 2,
             {{"align_corners", AttrKind::i}, {"mode", AttrKind::s}, {"padding_mode", AttrKind::s}},
             grid_sample_infer, grid_sample_kernel);
    d.upgrade = grid_sample_upgrade;
    d.decompose = grid_sample_decompose;
    r.add(std::move(d));
  }
  r.add(with_decomposition(make_op("AffineGrid", 20, 2, 2, {{"align_corners", AttrKind::i}},
                                   affine_grid_infer, affine_grid_kernel),
                           affine_grid_decompose));
  {
    OpDef d = make_op("RoiAlign", 16, 3, 3,
                   {{"coordinate_transformation_mode", AttrKind::s},
                    {"mode", AttrKind::s},
                    {"output_height", AttrKind::i},
                    {"output_width", AttrKind::i},
                    {"sampling_ratio", AttrKind::i},
                    {"spatial_scale", AttrKind::f}},
                   roi_align_infer, roi_align_kernel);
    d.upgrade = roi_align_upgrade;
    d.decompose = roi_align_decompose;
    r.add(std::move(d));
  }
  r.add(make_op("NonMaxSuppression", 10, 2, 5, {{"center_point_box", AttrKind::i}}, nms_infer,
             nms_kernel));
  {
    OpDef d = make_op("Choose", 0, 3, 3, {}, choose_infer, choose_kernel);
    d.domain = "tessel";
    d.cost = [](const Node&) { return Cost{}; };
    r.add(std::move(d));
  }
  r.add(window_op("HannWindow", 0.5, 0.5, 0.0));
  r.add(window_op("HammingWindow", 25.0 / 46.0, 21.0 / 46.0, 0.0));
  r.add(window_op("BlackmanWindow", 0.42, 0.5, 0.08));
  {
    OpDef d = make_op("DFT", 20, 1, 3,
                   {{"inverse", AttrKind::i}, {"onesided", AttrKind::i}, {"axis", AttrKind::i}},
                   dft_infer, dft_kernel);
    d.upgrade = dft_upgrade;
    d.decompose = dft_decompose;
    r.add(std::move(d));
  }
  r.add(with_decomposition(
      make_op("STFT", 17, 2, 4, {{"onesided", AttrKind::i}}, stft_infer, stft_kernel),
      stft_decompose));
  r.add(with_decomposition(make_op("MelWeightMatrix", 17, 5, 5, {{"output_datatype", AttrKind::i}},
                                   mel_infer, mel_kernel),
                           mel_decompose));
}

}  // namespace tessel
