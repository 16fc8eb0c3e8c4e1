// Op family: sampling, detection and signal ops (GridSample, AffineGrid, RoiAlign,
// NonMaxSuppression, window functions, DFT, STFT, MelWeightMatrix).
#include <algorithm>
#include <cmath>
#include <complex>
#include <numbers>

#include "tessel/ir/op_registry.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

using cplx = std::complex<double>;
constexpr double kPi = std::numbers::pi;

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
  int64_t in_sp = 1, out_sp = 1;
  for (int d = 0; d < sp; ++d) in_sp *= x.dim(d + 2), out_sp *= os[d + 2];
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
  return make_op(std::move(name), 17, 1, 1,
              {{"output_datatype", AttrKind::i}, {"periodic", AttrKind::i}}, infer, kernel);
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

}  // namespace

void register_misc_ops(OpRegistry& r) {
  {
    OpDef d =
        make_op("GridSample", 20, 2, 2,
             {{"align_corners", AttrKind::i}, {"mode", AttrKind::s}, {"padding_mode", AttrKind::s}},
             grid_sample_infer, grid_sample_kernel);
    d.upgrade = grid_sample_upgrade;
    r.add(std::move(d));
  }
  r.add(make_op("AffineGrid", 20, 2, 2, {{"align_corners", AttrKind::i}}, affine_grid_infer,
             affine_grid_kernel));
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
    r.add(std::move(d));
  }
  r.add(make_op("NonMaxSuppression", 10, 2, 5, {{"center_point_box", AttrKind::i}}, nms_infer,
             nms_kernel));
  r.add(window_op("HannWindow", 0.5, 0.5, 0.0));
  r.add(window_op("HammingWindow", 25.0 / 46.0, 21.0 / 46.0, 0.0));
  r.add(window_op("BlackmanWindow", 0.42, 0.5, 0.08));
  {
    OpDef d = make_op("DFT", 20, 1, 3,
                   {{"inverse", AttrKind::i}, {"onesided", AttrKind::i}, {"axis", AttrKind::i}},
                   dft_infer, dft_kernel);
    d.upgrade = dft_upgrade;
    r.add(std::move(d));
  }
  r.add(make_op("STFT", 17, 2, 4, {{"onesided", AttrKind::i}}, stft_infer, stft_kernel));
  r.add(
      make_op("MelWeightMatrix", 17, 5, 5, {{"output_datatype", AttrKind::i}}, mel_infer, mel_kernel));
}

}  // namespace tessel
