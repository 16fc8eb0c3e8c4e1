// Op family: convolutions, Col2Im and pooling, sharing one N-D window geometry (see for_each_tap).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "tessel/ir/op_registry.h"
#include "tessel/ops/decompose_util.h"
#include "tessel/ops/sym_util.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

// The window geometry along the spatial dims: kernel, strides, dilations, begin/end pads and the
// resulting output extents (kUnknownDim when the input extent is unknown).
struct Window {
  int nd = 0;
  std::vector<int64_t> k, s, d, pb, pe, in, out;
  int64_t eff(int i) const { return (k[i] - 1) * d[i] + 1; }
};

std::vector<int64_t> ints_or(const Node& n, const std::string& name, int nd, int64_t dflt) {
  std::vector<int64_t> v = n.attr_ints(name, std::vector<int64_t>(static_cast<size_t>(nd), dflt));
  if (static_cast<int>(v.size()) != nd)
    fail("attribute '{}' has {} values, expected {}", name, v.size(), nd);
  return v;
}

// Sanity bounds on window geometry: far above any real model, low enough that the extent
// arithmetic cannot overflow int64.
constexpr int64_t kMaxWindowExtent = int64_t{1} << 31;
constexpr int64_t kMaxWindowTaps = int64_t{1} << 24;
constexpr int64_t kMaxPoolSteps = int64_t{1} << 34;

// Forward geometry (conv and pools): the input is pooled/convolved over windows of `k`.
Window forward_window(const Node& n, const Shape& in_spatial, const std::vector<int64_t>& k,
                      bool ceil_mode) {
  Window w;
  w.nd = static_cast<int>(in_spatial.size());
  w.k = k;
  w.in = in_spatial;
  w.s = ints_or(n, "strides", w.nd, 1);
  w.d = ints_or(n, "dilations", w.nd, 1);
  int64_t taps = 1;
  for (int i = 0; i < w.nd; ++i) {
    if (w.k[i] < 1) fail("kernel extent must be >= 1, got {}", w.k[i]);
    if (w.s[i] < 1) fail("strides must be >= 1, got {}", w.s[i]);
    if (w.d[i] < 1) fail("dilations must be >= 1, got {}", w.d[i]);
    // Bounds that keep the window arithmetic below from overflowing (and a huge kernel under
    // SAME padding from looping over ~forever taps).
    if (w.k[i] > kMaxWindowExtent || w.s[i] > kMaxWindowExtent || w.d[i] > kMaxWindowExtent ||
        w.eff(i) > kMaxWindowExtent)
      fail("window along spatial dim {} is too large (kernel {}, stride {}, dilation {})", i, w.k[i],
           w.s[i], w.d[i]);
    taps *= w.k[i];
    if (taps > kMaxWindowTaps) fail("kernel {} has too many taps (more than {})", shape_str(w.k), kMaxWindowTaps);
  }
  std::vector<int64_t> pads =
      n.attr_ints("pads", std::vector<int64_t>(static_cast<size_t>(2 * w.nd), 0));
  if (static_cast<int>(pads.size()) != 2 * w.nd)
    fail("pads has {} values, expected {}", pads.size(), 2 * w.nd);
  for (int64_t p : pads) {
    if (p < 0) fail("pads must be >= 0");
    if (p > kMaxWindowExtent) fail("pad {} is too large", p);
  }
  w.pb.assign(pads.begin(), pads.begin() + w.nd);
  w.pe.assign(pads.begin() + w.nd, pads.end());
  const std::string ap = n.attr_s("auto_pad", "NOTSET");
  if (ap != "NOTSET" && ap != "SAME_UPPER" && ap != "SAME_LOWER" && ap != "VALID")
    fail("bad auto_pad '{}'", ap);
  w.out.assign(static_cast<size_t>(w.nd), kUnknownDim);
  for (int i = 0; i < w.nd; ++i) {
    const int64_t in = w.in[i];
    if (ap == "VALID") {
      w.pb[i] = w.pe[i] = 0;
    } else if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
      if (in == kUnknownDim) continue;
      const int64_t o = (in + w.s[i] - 1) / w.s[i];
      const int64_t total = std::max<int64_t>(0, (o - 1) * w.s[i] + w.eff(i) - in);
      const int64_t small = total / 2;
      w.pb[i] = ap == "SAME_UPPER" ? small : total - small;
      w.pe[i] = total - w.pb[i];
      w.out[i] = o;
      continue;
    }
    if (in == kUnknownDim) continue;
    const int64_t span = in + w.pb[i] + w.pe[i] - w.eff(i);
    if (span < 0)
      fail("window of extent {} does not fit the padded input extent {}", w.eff(i),
           in + w.pb[i] + w.pe[i]);
    int64_t o = (ceil_mode ? (span + w.s[i] - 1) / w.s[i] : span / w.s[i]) + 1;
    // A last window that would start in the end padding is dropped.
    if (ceil_mode && (o - 1) * w.s[i] >= in + w.pb[i]) --o;
    w.out[i] = o;
  }
  return w;
}

int64_t prod(const std::vector<int64_t>& v) {
  int64_t p = 1;
  for (int64_t x : v) p *= x;
  return p;
}

// Visits every position g of a grid (row-major) for one kernel tap `kt`: the matching target
// coordinate along dim i is g_i * s_i - pb_i + kt_i * d_i. fn(grid_flat, target_flat, in_pad)
// gets target_flat = -1 when outside the target, and in_pad = whether it lies within the padded
// range [-pb, T + pe).
template <typename Fn>
void for_each_tap(const std::vector<int64_t>& grid, const std::vector<int64_t>& target,
                  const Window& w, const std::vector<int64_t>& kt, Fn&& fn) {
  const int nd = static_cast<int>(grid.size());
  std::vector<std::vector<int64_t>> coord(nd);
  std::vector<std::vector<char>> padok(nd);
  for (int i = 0; i < nd; ++i) {
    coord[i].resize(static_cast<size_t>(grid[i]));
    padok[i].resize(static_cast<size_t>(grid[i]));
    for (int64_t g = 0; g < grid[i]; ++g) {
      const int64_t t = g * w.s[i] - w.pb[i] + kt[i] * w.d[i];
      coord[i][g] = (t >= 0 && t < target[i]) ? t : -1;
      padok[i][g] = t >= -w.pb[i] && t < target[i] + w.pe[i];
    }
  }
  const int64_t total = prod(grid);
  if (total == 0) return;
  const int64_t inner = grid[nd - 1];
  const std::vector<int64_t> tstr = strides_of(target);
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
  for (int64_t base = 0; base < total; base += inner) {
    int64_t off = 0;
    bool valid = true, pad = true;
    for (int i = 0; i < nd - 1; ++i) {
      const int64_t c = coord[i][idx[i]];
      if (c < 0)
        valid = false;
      else
        off += c * tstr[i];
      if (!padok[i][idx[i]]) pad = false;
    }
    const std::vector<int64_t>& cl = coord[nd - 1];
    const std::vector<char>& pl = padok[nd - 1];
    for (int64_t g = 0; g < inner; ++g) {
      const bool ok = valid && cl[g] >= 0;
      fn(base + g, ok ? off + cl[g] : int64_t{-1}, pad && pl[g]);
    }
    for (int i = nd - 2; i >= 0; --i) {
      if (++idx[i] < grid[i]) break;
      idx[i] = 0;
    }
  }
}

// Row-major decomposition of a flat kernel-tap index.
std::vector<int64_t> unflatten(int64_t flat, const std::vector<int64_t>& dims) {
  std::vector<int64_t> r(dims.size());
  for (size_t i = dims.size(); i-- > 0;) {
    r[i] = flat % dims[i];
    flat /= dims[i];
  }
  return r;
}

Shape spatial_of(const Shape& s) {
  return Shape(s.begin() + 2, s.end());
}

// Convolution and pooling take a symbolic batch dim (0) only: a spatial output extent is a floor
// division, and a channel count sizes the weights. The batch dim, for the rule to put back.
Dim symbolic_batch_only(const TensorType& x, const std::string& op) {
  const Dims d = x.dims();
  for (size_t i = 1; i < d.size(); ++i)
    if (d[i].is_symbolic())
      unsupported("{} over {}: dim {} is symbolic ({}), only the batch dim may be ({})", op, x.str(), i, d[i].str(),
                  i == 1 ? "the channel count sizes the weights" : "a spatial output size is a floor division");
  return d.empty() ? Dim(kUnknownDim) : d[0];
}

// `t` with its batch dim (0) replaced by `batch`.
TensorType with_batch(const TensorType& t, const Dim& batch) {
  Dims d = t.dims();
  d[0] = batch;
  return TensorType::of(t.dtype, d);
}

// ---- decomposition helpers ----------------------------------------------------------------------


// Per-dim low/high lists as core's interleaved padding (low0, high0, low1, high1, ...).
std::vector<int64_t> interleave(const std::vector<int64_t>& lo, const std::vector<int64_t>& hi) {
  std::vector<int64_t> r;
  for (size_t i = 0; i < lo.size(); ++i) {
    r.push_back(lo[i]);
    r.push_back(hi[i]);
  }
  return r;
}

// y + bias[C] along dim 1.
Value* add_channel_bias(CoreBuilder& b, Value* y, Value* bias) {
  Shape s(y->type.shape.size(), 1);
  s[1] = y->type.shape[1];
  return b.add(y, b.reshape(b.convert(bias, y->type.dtype), s));
}

// Core convolution with a window's geometry (its begin/end pads as padding).
Value* core_conv(CoreBuilder& b, Value* x, Value* w, const Window& win, int64_t groups) {
  return b.emit(CoreOp::convolution, {x, w},
                {{"strides", win.s}, {"dilations", win.d}, {"padding", interleave(win.pb, win.pe)}, {"groups", groups}});
}

// A transposed convolution as a core convolution: x interior-padded with stride - 1 zeros, the
// weight [C, M/g, k...] regrouped to [M, C/g, k...] and flipped spatially, stride 1, the same
// dilation, and low/high padding that yields the spatial extents `out`.
Value* core_conv_transpose(CoreBuilder& b, Value* x, Value* w, int64_t groups, const Window& win,
                           const Shape& out) {
  const Shape& ws = w->type.shape;
  const size_t r = ws.size();
  const int64_t c = ws[0], mg = ws[1];
  Shape g4 = {groups, c / groups, mg};
  g4.insert(g4.end(), ws.begin() + 2, ws.end());
  std::vector<int64_t> perm(r + 1);
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[1], perm[2]);
  Shape regrouped = {groups * mg, c / groups};
  regrouped.insert(regrouped.end(), ws.begin() + 2, ws.end());
  w = b.reshape(b.transpose(b.reshape(w, g4), perm), regrouped);
  std::vector<int64_t> starts(r, 0), stops(regrouped.begin(), regrouped.end()), strides(r, 1);
  for (size_t i = 2; i < r; ++i) {
    starts[i] = regrouped[i] - 1;
    stops[i] = -1;
    strides[i] = -1;
  }
  w = b.slice(w, starts, stops, strides);
  std::vector<int64_t> zeros(r, 0), interior(r, 0), lo, hi;
  bool strided = false;
  for (int i = 0; i < win.nd; ++i) {
    interior[i + 2] = win.s[i] - 1;
    strided = strided || win.s[i] > 1;
    const int64_t len = win.s[i] * (win.in[i] - 1) + 1;
    lo.push_back(win.eff(i) - 1 - win.pb[i]);
    hi.push_back(out[i] - 1 + win.eff(i) - len - lo.back());
  }
  if (strided)
    x = b.emit(CoreOp::pad, {x, b.scalar(x->type.dtype, 0)}, {{"low", zeros}, {"high", zeros}, {"interior", interior}});
  return b.emit(CoreOp::convolution, {x, w},
                {{"dilations", win.d}, {"padding", interleave(lo, hi)}, {"groups", groups}});
}

// ---- Conv ---------------------------------------------------------------------------------------

// One grouped N-D convolution with double accumulation: y[n, m, out] = b[m] + sum w * x.
template <typename T>
void conv_core(const T* x, const T* wt, const T* bias, T* y, int64_t batch, int64_t c_in,
               int64_t m_out, int64_t group, const Window& w) {
  const int64_t cg = c_in / group, mg = m_out / group;
  const int64_t kp = prod(w.k), op = prod(w.out), ip = prod(w.in);
  bool identity = true;  // 1x1, stride 1, no padding: the input already is the column matrix
  for (int i = 0; i < w.nd; ++i)
    identity = identity && w.k[i] == 1 && w.s[i] == 1 && w.pb[i] == 0 && w.pe[i] == 0;
  std::vector<T> col(identity ? 0 : static_cast<size_t>(cg * kp * op));
  std::vector<double> acc(static_cast<size_t>(op));
  std::vector<std::vector<int64_t>> taps(static_cast<size_t>(kp));
  for (int64_t t = 0; t < kp; ++t) taps[t] = unflatten(t, w.k);
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t g = 0; g < group; ++g) {
      const T* xg = x + (n * c_in + g * cg) * ip;
      const T* cm = xg;
      if (!identity) {
        for (int64_t c = 0; c < cg; ++c)
          for (int64_t t = 0; t < kp; ++t) {
            T* row = col.data() + (c * kp + t) * op;
            const T* xc = xg + c * ip;
            for_each_tap(w.out, w.in, w, taps[t],
                         [&](int64_t o, int64_t i, bool) { row[o] = i >= 0 ? xc[i] : T(0); });
          }
        cm = col.data();
      }
      for (int64_t m = 0; m < mg; ++m) {
        const int64_t mo = g * mg + m;
        std::fill(acc.begin(), acc.end(), bias ? static_cast<double>(bias[mo]) : 0.0);
        const T* wr = wt + mo * cg * kp;
        double* ap = acc.data();
        for (int64_t r = 0; r < cg * kp; ++r) {
          const double wv = static_cast<double>(wr[r]);
          if (wv == 0.0) continue;
          const T* cr = cm + r * op;
          for (int64_t o = 0; o < op; ++o) ap[o] += wv * static_cast<double>(cr[o]);
        }
        T* yr = y + (n * m_out + mo) * op;
        for (int64_t o = 0; o < op; ++o) yr[o] = static_cast<T>(ap[o]);
      }
    }
  }
}

// Kernel extents of a conv: from W's shape, cross-checked with kernel_shape when given.
std::vector<int64_t> conv_kernel(const Node& n, const Shape& wshape, int nd) {
  std::vector<int64_t> k(wshape.begin() + 2, wshape.end());
  if (n.has_attr("kernel_shape")) {
    std::vector<int64_t> ks = n.attr_ints("kernel_shape");
    if (static_cast<int>(ks.size()) != nd)
      fail("kernel_shape has {} values, expected {}", ks.size(), nd);
    for (int i = 0; i < nd; ++i) {
      if (k[i] != kUnknownDim && k[i] != ks[i])
        fail("kernel_shape {} disagrees with W {}", shape_str(ks), shape_str(wshape));
      k[i] = ks[i];
    }
  }
  return k;
}

void check_conv_operands(const Shape& x, const Shape& wt, int64_t group) {
  if (x.size() < 3) fail("Conv input must have rank >= 3 (N, C, spatial...), got {}", shape_str(x));
  if (wt.size() != x.size())
    fail("Conv weight rank {} differs from input rank {}", wt.size(), x.size());
  if (group < 1) fail("group must be >= 1, got {}", group);
}

TensorType infer_conv_type(InferCtx& c, DType out_dt) {
  const Shape& x = c.in(0).shape;
  const Shape& wt = c.in(1).shape;
  const int64_t group = c.node().attr_i("group", 1);
  check_conv_operands(x, wt, group);
  const int nd = static_cast<int>(x.size()) - 2;
  if (x[1] != kUnknownDim && wt[1] != kUnknownDim && x[1] != wt[1] * group)
    fail("Conv input has {} channels but W expects {} x group {}", x[1], wt[1], group);
  if (wt[0] != kUnknownDim && wt[0] % group != 0)
    fail("Conv output channels {} not divisible by group {}", wt[0], group);
  std::vector<int64_t> k = conv_kernel(c.node(), wt, nd);
  for (int64_t v : k)
    if (v == kUnknownDim) unsupported("Conv with an unknown kernel extent");
  Window w = forward_window(c.node(), spatial_of(x), k, false);
  Shape out = {x[0], wt[0]};
  out.insert(out.end(), w.out.begin(), w.out.end());
  return with_batch({out_dt, out}, symbolic_batch_only(c.in(0), c.node().op_name()));
}

// Runs a float or (zero-point-shifted) integer conv in double, or natively in f32.
Tensor run_conv(const Node& node, const Tensor& x, const Tensor& wt, const Tensor* bias,
                DType out_dt, const std::vector<double>* xv_in = nullptr,
                const std::vector<double>* wv_in = nullptr) {
  const int64_t group = node.attr_i("group", 1);
  check_conv_operands(x.shape(), wt.shape(), group);
  const int nd = x.rank() - 2;
  const int64_t batch = x.dim(0), c_in = x.dim(1), m_out = wt.dim(0);
  if (c_in != wt.dim(1) * group)
    fail("Conv input has {} channels but W expects {} x group {}", c_in, wt.dim(1), group);
  if (m_out % group != 0) fail("Conv output channels {} not divisible by group {}", m_out, group);
  if (bias && (bias->rank() != 1 || bias->dim(0) != m_out))
    fail("Conv bias must have shape [{}]", m_out);
  Window w = forward_window(node, spatial_of(x.shape()), conv_kernel(node, wt.shape(), nd), false);
  Shape out = {batch, m_out};
  out.insert(out.end(), w.out.begin(), w.out.end());
  if (out_dt == DType::f32 && !xv_in) {
    Tensor y(DType::f32, out);
    conv_core<float>(x.data<float>(), wt.data<float>(), bias ? bias->data<float>() : nullptr,
                     y.data<float>(), batch, c_in, m_out, group, w);
    return y;
  }
  const std::vector<double> xv = xv_in ? *xv_in : x.to_f64();
  const std::vector<double> wv = wv_in ? *wv_in : wt.to_f64();
  const std::vector<double> bv = bias ? bias->to_f64() : std::vector<double>{};
  std::vector<double> yv(static_cast<size_t>(shape_numel(out)));
  conv_core<double>(xv.data(), wv.data(), bias ? bv.data() : nullptr, yv.data(), batch, c_in, m_out,
                    group, w);
  if (is_float(out_dt)) return Tensor::from_f64(out_dt, out, yv);
  std::vector<int64_t> yi(yv.size());
  for (size_t i = 0; i < yv.size(); ++i) yi[i] = static_cast<int64_t>(std::llround(yv[i]));
  return Tensor::from_i64(out_dt, out, yi);
}

const std::vector<AttrSpec> kConvAttrs = {
    {"auto_pad", AttrKind::s},        {"dilations", AttrKind::ints}, {"group", AttrKind::i},
    {"kernel_shape", AttrKind::ints}, {"pads", AttrKind::ints},      {"strides", AttrKind::ints}};

Cost conv_cost(const Node& n) {
  Cost c;
  if (!n.inputs[1] || !n.outputs[0]) return c;
  const Shape& wt = n.inputs[1]->type.shape;
  const int64_t per =
      std::max<int64_t>(shape_numel(wt), 0) / std::max<int64_t>(wt.empty() ? 1 : wt[0], 1);
  const int64_t outn = std::max<int64_t>(shape_numel(n.outputs[0]->type.shape), 0);
  c.flops = 2.0 * static_cast<double>(per) * static_cast<double>(outn);
  for (const Value* v : n.inputs)
    if (v) c.bytes += std::max<int64_t>(shape_numel(v->type.shape), 0) * dtype_size(v->type.dtype);
  c.bytes += outn * dtype_size(n.outputs[0]->type.dtype);
  return c;
}

// The taps of each spatial dim that read the input for some output position: [lo, hi] (the taps
// outside read padding only). A dilated convolution over a small input (DeepLabV3's ASPP at dilation
// 24 and 36 on a 14 x 14 map) has such taps at both ends of its kernel.
struct LiveTaps {
  std::vector<int64_t> lo, hi;
};

LiveTaps live_taps(const Window& w) {
  LiveTaps t;
  for (int i = 0; i < w.nd; ++i) {
    auto live = [&](int64_t k) {  // some output o in [0, out) reads input o*s - pb + k*d in [0, in)
      const int64_t first = k * w.d[i] - w.pb[i];
      const int64_t o0 = first < 0 ? (-first + w.s[i] - 1) / w.s[i] : 0;
      return o0 < w.out[i] && first + o0 * w.s[i] < w.in[i];
    };
    int64_t lo = 0, hi = w.k[i] - 1;
    while (lo <= hi && !live(lo)) ++lo;
    while (hi > lo && !live(hi)) --hi;
    t.lo.push_back(lo > hi ? 0 : lo);  // (no live tap at all: the output is the bias; nothing cropped)
    t.hi.push_back(lo > hi ? w.k[i] - 1 : hi);
  }
  return t;
}

// A float convolution without the kernel taps that read only padding: the weight sliced to the live
// taps and the padding shifted, the output's extents unchanged. Only for a constant weight whose
// dropped taps are all finite (the ONNX reference multiplies padding's zeros by them, so an inf or NaN
// there is a NaN it gives; tessel's convolution kernels skip padded taps, but the crop should not be
// what decides). `win` and `w` are updated; false when nothing is dropped.
bool crop_dead_taps(CoreBuilder& b, const Value* weight, Value*& w, Window& win) {
  if (!weight->constant || win.nd == 0) return false;
  for (int i = 0; i < win.nd; ++i)
    if (win.in[i] <= 0 || win.out[i] <= 0 || win.k[i] <= 0) return false;
  LiveTaps t = live_taps(win);
  Window cropped = win;
  bool any = false;
  for (int i = 0; i < win.nd; ++i) {
    const int64_t k = t.hi[i] - t.lo[i] + 1, pb = win.pb[i] - t.lo[i] * win.d[i];
    const int64_t pe = (win.out[i] - 1) * win.s[i] + (k - 1) * win.d[i] + 1 - win.in[i] - pb;
    if (k == win.k[i] || pb < 0 || pe < 0) {  // (a negative pad would crop the input: left whole)
      t.lo[i] = 0, t.hi[i] = win.k[i] - 1;
      continue;
    }
    cropped.k[i] = k, cropped.pb[i] = pb, cropped.pe[i] = pe;
    any = true;
  }
  if (!any) return false;
  const Tensor& c = *weight->constant;
  if (c.shape().size() != static_cast<size_t>(win.nd) + 2) return false;
  const std::vector<int64_t> taps(c.shape().begin() + 2, c.shape().end());
  const int64_t per_filter = prod(taps);
  for (int64_t e = 0; e < c.numel(); ++e) {
    if (std::isfinite(c.get_f(e))) continue;
    int64_t rest = e % per_filter;
    for (int i = win.nd - 1; i >= 0; --i) {
      const int64_t k = rest % taps[static_cast<size_t>(i)];
      rest /= taps[static_cast<size_t>(i)];
      if (k < t.lo[i] || k > t.hi[i]) return false;  // a dropped tap is inf or NaN
    }
  }
  const size_t r = w->type.shape.size();
  Shape starts(r, 0), stops = w->type.shape;
  for (int i = 0; i < win.nd; ++i) {
    starts[static_cast<size_t>(i) + 2] = t.lo[i];
    stops[static_cast<size_t>(i) + 2] = t.hi[i] + 1;
  }
  w = b.slice(w, starts, stops);
  win = cropped;
  return true;
}

// Conv: core convolution with auto_pad resolved from the static shapes (the kernel taps that read
// only padding dropped), then the bias added (in f32 for narrow floats, so the result rounds once).
std::vector<Value*> decompose_conv(CoreBuilder& b, const Node& n) {
  const DType dt = n.outputs[0]->type.dtype, ct = n.has_input(2) ? math_type(dt) : dt;
  Value* x = b.convert(n.inputs[0], ct);
  Value* w = b.convert(n.inputs[1], ct);
  const Shape& xs = x->type.shape;
  const int nd = static_cast<int>(xs.size()) - 2;
  Window win = forward_window(n, spatial_of(xs), conv_kernel(n, w->type.shape, nd), false);
  crop_dead_taps(b, n.inputs[1], w, win);
  Value* y = core_conv(b, x, w, win, n.attr_i("group", 1));
  if (n.has_input(2)) y = add_channel_bias(b, y, n.inputs[2]);
  return {b.convert(y, dt)};
}

OpDef conv_def() {
  OpDef d;
  d.name = "Conv";
  d.min_inputs = 2;
  d.max_inputs = 3;
  d.since = 1;
  d.attrs = kConvAttrs;
  d.cost = conv_cost;
  d.infer = [](InferCtx& c) {
    const DType dt = c.in(0).dtype;
    if (dt != DType::f32 && dt != DType::f64 && dt != DType::f16 && dt != DType::bf16)
      fail("Conv needs a float input, got {}", dtype_name(dt));
    if (c.in(1).dtype != dt || (c.has_in(2) && c.in(2).dtype != dt))
      fail("Conv operands have different dtypes");
    TensorType out = infer_conv_type(c, dt);
    if (c.has_in(2)) {
      const Shape& b = c.in(2).shape;
      if (b.size() != 1 ||
          (b[0] != kUnknownDim && out.shape[1] != kUnknownDim && b[0] != out.shape[1]))
        fail("Conv bias must have shape [{}], got {}", out.shape[1], shape_str(b));
    }
    c.set_out(0, out);
  };
  d.kernel = [](KernelCtx& c) {
    c.set_out(
        0, run_conv(c.node(), c.in(0), c.in(1), c.has_in(2) ? &c.in(2) : nullptr, c.in(0).dtype()));
  };
  return d;
}

// Integer input minus its zero point (scalar, or per leading-dim slice for the weights).
std::vector<double> shifted(const Tensor& x, const Tensor* zp) {
  std::vector<double> v = x.to_f64();
  if (!zp) return v;
  if (zp->dtype() != x.dtype())
    fail("zero point dtype {} differs from input {}", dtype_name(zp->dtype()),
         dtype_name(x.dtype()));
  if (zp->numel() == 1) {
    const double z = zp->get_f(0);
    for (double& e : v) e -= z;
    return v;
  }
  if (zp->numel() != x.dim(0))
    fail("zero point has {} values, expected 1 or {}", zp->numel(), x.dim(0));
  const int64_t per = x.numel() / std::max<int64_t>(x.dim(0), 1);
  for (int64_t i = 0; i < x.numel(); ++i) v[i] -= zp->get_f(i / per);
  return v;
}

// ConvInteger: operands widened to i32 minus their zero points (x's scalar, w's scalar or per
// output channel), then an i32 convolution (padding with zeros = the shifted zero point).
std::vector<Value*> decompose_conv_integer(CoreBuilder& b, const Node& n) {
  auto shifted = [&](int i, int zp) {
    Value* v = b.convert(n.inputs[i], DType::i32);
    if (!n.has_input(zp)) return v;
    Value* z = b.convert(n.inputs[zp], DType::i32);
    const int64_t cnt = shape_numel(z->type.shape);
    Shape s(v->type.shape.size(), 1);
    s[0] = cnt;
    return b.sub(v, b.reshape(z, cnt == 1 ? Shape{} : s));
  };
  Value* x = shifted(0, 2);
  Value* w = shifted(1, 3);
  const Shape& xs = x->type.shape;
  const int nd = static_cast<int>(xs.size()) - 2;
  const Window win = forward_window(n, spatial_of(xs), conv_kernel(n, w->type.shape, nd), false);
  return {core_conv(b, x, w, win, n.attr_i("group", 1))};
}

OpDef conv_integer_def() {
  OpDef d;
  d.name = "ConvInteger";
  d.min_inputs = 2;
  d.max_inputs = 4;
  d.since = 10;
  d.attrs = kConvAttrs;
  d.cost = conv_cost;
  d.infer = [](InferCtx& c) {
    for (int i : {0, 1})
      if (c.in(i).dtype != DType::u8 && c.in(i).dtype != DType::i8)
        fail("ConvInteger input {} must be uint8 or int8", i);
    c.set_out(0, infer_conv_type(c, DType::i32));
  };
  d.kernel = [](KernelCtx& c) {
    if (c.has_in(2) && c.in(2).numel() != 1) fail("ConvInteger x_zero_point must be a scalar");
    const std::vector<double> xv = shifted(c.in(0), c.has_in(2) ? &c.in(2) : nullptr);
    const std::vector<double> wv = shifted(c.in(1), c.has_in(3) ? &c.in(3) : nullptr);
    c.set_out(0, run_conv(c.node(), c.in(0), c.in(1), nullptr, DType::i32, &xv, &wv));
  };
  return d;
}

// ---- ConvTranspose ------------------------------------------------------------------------------

// Geometry of a transposed conv: `w.in` is the input grid, `w.out` the produced image extents.
Window transpose_window(const Node& n, const Shape& in_spatial, const std::vector<int64_t>& k) {
  Window w;
  w.nd = static_cast<int>(in_spatial.size());
  w.k = k;
  w.in = in_spatial;
  w.s = ints_or(n, "strides", w.nd, 1);
  w.d = ints_or(n, "dilations", w.nd, 1);
  std::vector<int64_t> op = ints_or(n, "output_padding", w.nd, 0);
  std::vector<int64_t> pads =
      n.attr_ints("pads", std::vector<int64_t>(static_cast<size_t>(2 * w.nd), 0));
  if (static_cast<int>(pads.size()) != 2 * w.nd)
    fail("pads has {} values, expected {}", pads.size(), 2 * w.nd);
  w.pb.assign(pads.begin(), pads.begin() + w.nd);
  w.pe.assign(pads.begin() + w.nd, pads.end());
  const std::string ap = n.attr_s("auto_pad", "NOTSET");
  if (ap != "NOTSET" && ap != "SAME_UPPER" && ap != "SAME_LOWER" && ap != "VALID")
    fail("bad auto_pad '{}'", ap);
  std::vector<int64_t> oshape;
  if (n.has_attr("output_shape")) {
    oshape = n.attr_ints("output_shape");
    // output_shape may list all dims or just the spatial ones.
    if (static_cast<int>(oshape.size()) == w.nd + 2)
      oshape.erase(oshape.begin(), oshape.begin() + 2);
    if (static_cast<int>(oshape.size()) != w.nd)
      fail("output_shape has {} values, expected {}", oshape.size(), w.nd);
  }
  w.out.assign(static_cast<size_t>(w.nd), kUnknownDim);
  for (int i = 0; i < w.nd; ++i) {
    if (w.s[i] < 1 || w.d[i] < 1 || w.k[i] < 1)
      fail("strides, dilations and kernel extents must be >= 1");
    if (w.in[i] == kUnknownDim) continue;
    const int64_t full = w.s[i] * (w.in[i] - 1) + op[i] + w.eff(i);
    if (ap == "VALID") w.pb[i] = w.pe[i] = 0;
    int64_t target = -1;
    if (!oshape.empty())
      target = oshape[i];
    else if (ap == "SAME_UPPER" || ap == "SAME_LOWER")
      target = w.in[i] * w.s[i];
    if (target >= 0) {
      // A target beyond the full output gives negative pads: extra output at the edges.
      const int64_t total = full - target;
      const int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);  // floor division
      if (ap == "SAME_UPPER") {
        w.pb[i] = half;
        w.pe[i] = total - half;
      } else {
        w.pb[i] = total - half;
        w.pe[i] = half;
      }
    }
    w.out[i] = full - w.pb[i] - w.pe[i];
    if (w.out[i] < 0) fail("ConvTranspose output extent is negative");
  }
  return w;
}

// ConvTranspose: see core_conv_transpose; output_padding, output_shape and auto_pad only change
// the output extents, read from the node's output type.
std::vector<Value*> decompose_conv_transpose(CoreBuilder& b, const Node& n) {
  const DType dt = n.outputs[0]->type.dtype, ct = n.has_input(2) ? math_type(dt) : dt;
  Value* x = b.convert(n.inputs[0], ct);
  Value* w = b.convert(n.inputs[1], ct);
  const Shape& xs = x->type.shape;
  const int nd = static_cast<int>(xs.size()) - 2;
  const Window win = transpose_window(n, spatial_of(xs), conv_kernel(n, w->type.shape, nd));
  Value* y = core_conv_transpose(b, x, w, n.attr_i("group", 1), win, spatial_of(n.outputs[0]->type.shape));
  if (n.has_input(2)) y = add_channel_bias(b, y, n.inputs[2]);
  return {b.convert(y, dt)};
}

OpDef conv_transpose_def() {
  OpDef d;
  d.name = "ConvTranspose";
  d.min_inputs = 2;
  d.max_inputs = 3;
  d.since = 1;
  d.attrs = kConvAttrs;
  d.attrs.push_back({"output_padding", AttrKind::ints});
  d.attrs.push_back({"output_shape", AttrKind::ints});
  d.infer = [](InferCtx& c) {
    const Shape& x = c.in(0).shape;
    const Shape& wt = c.in(1).shape;
    const int64_t group = c.node().attr_i("group", 1);
    check_conv_operands(x, wt, group);
    const DType dt = c.in(0).dtype;
    if (!is_float(dt) || c.in(1).dtype != dt)
      fail("ConvTranspose needs float operands of one dtype");
    if (x[1] != kUnknownDim && wt[0] != kUnknownDim && x[1] != wt[0])
      fail("ConvTranspose input has {} channels but W has {}", x[1], wt[0]);
    if (x[1] != kUnknownDim && x[1] % group != 0)
      fail("ConvTranspose input channels {} not divisible by group {}", x[1], group);
    const int nd = static_cast<int>(x.size()) - 2;
    std::vector<int64_t> k = conv_kernel(c.node(), wt, nd);
    for (int64_t v : k)
      if (v == kUnknownDim) unsupported("ConvTranspose with an unknown kernel extent");
    Window w = transpose_window(c.node(), spatial_of(x), k);
    Shape out = {x[0], wt[1] == kUnknownDim ? kUnknownDim : wt[1] * group};
    out.insert(out.end(), w.out.begin(), w.out.end());
    c.set_out(0, {dt, out});
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    const Tensor& wt = c.in(1);
    const int64_t group = c.node().attr_i("group", 1);
    check_conv_operands(x.shape(), wt.shape(), group);
    const int nd = x.rank() - 2;
    const int64_t batch = x.dim(0), c_in = x.dim(1), mg = wt.dim(1), m_out = mg * group;
    if (c_in != wt.dim(0) || c_in % group != 0) fail("ConvTranspose channel mismatch");
    const int64_t cg = c_in / group;
    Window w =
        transpose_window(c.node(), spatial_of(x.shape()), conv_kernel(c.node(), wt.shape(), nd));
    const int64_t kp = prod(w.k), ip = prod(w.in), op = prod(w.out);
    const std::vector<double> xv = x.to_f64(), wv = wt.to_f64();
    std::vector<double> bv(static_cast<size_t>(m_out), 0.0);
    if (c.has_in(2)) {
      if (c.in(2).numel() != m_out) fail("ConvTranspose bias must have {} values", m_out);
      bv = c.in(2).to_f64();
    }
    Shape oshape = {batch, m_out};
    oshape.insert(oshape.end(), w.out.begin(), w.out.end());
    std::vector<double> yv(static_cast<size_t>(shape_numel(oshape)));
    std::vector<double> col(static_cast<size_t>(ip));
    for (int64_t t = 0; t < kp; ++t) {
      const std::vector<int64_t> kt = unflatten(t, w.k);
      for (int64_t n = 0; n < batch; ++n)
        for (int64_t g = 0; g < group; ++g)
          for (int64_t m = 0; m < mg; ++m) {
            // col[i] = sum_c x[n, c, i] * w[c, m, tap], scattered to the tap's output positions.
            std::fill(col.begin(), col.end(), 0.0);
            for (int64_t ci = 0; ci < cg; ++ci) {
              const int64_t ch = g * cg + ci;
              const double wk = wv[(ch * mg + m) * kp + t];
              if (wk == 0.0) continue;
              const double* xr = xv.data() + (n * c_in + ch) * ip;
              for (int64_t i = 0; i < ip; ++i) col[i] += wk * xr[i];
            }
            double* yr = yv.data() + (n * m_out + g * mg + m) * op;
            for_each_tap(w.in, w.out, w, kt, [&](int64_t i, int64_t o, bool) {
              if (o >= 0) yr[o] += col[i];
            });
          }
    }
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t m = 0; m < m_out; ++m)
        for (int64_t o = 0; o < op; ++o) yv[(n * m_out + m) * op + o] += bv[m];
    c.set_out(0, Tensor::from_f64(x.dtype(), oshape, yv));
  };
  return d;
}

// ---- Col2Im -------------------------------------------------------------------------------------

// Col2Im: every block tap t holds a [N, C, blocks...] grid that lands on the image at offset
// t * dilation - pad with the stride between blocks: one interior pad (negative low/high crop) per
// tap, summed.
std::vector<Value*> decompose_col2im(CoreBuilder& b, const Node& n) {
  const Shape& out = n.outputs[0]->type.shape;
  if (!shape_known(out)) b.need_constant(1, "image_shape");
  const std::vector<int64_t> blk = b.need_constant(2, "block_shape").to_i64();
  const Shape img = spatial_of(out);
  const Window win = forward_window(n, img, blk, false);
  const int64_t kp = prod(blk), nb = out[0], ch = out[1];
  Shape grid = {nb, ch};
  grid.insert(grid.end(), win.out.begin(), win.out.end());
  Value* x = b.reshape(n.inputs[0], {nb, ch, kp, prod(win.out)});
  Value* zero = b.scalar(x->type.dtype, 0);
  Value* sum = nullptr;
  for (int64_t t = 0; t < kp; ++t) {
    const std::vector<int64_t> kt = unflatten(t, blk);
    std::vector<int64_t> lo(2, 0), hi(2, 0), interior(2, 0);
    for (int i = 0; i < win.nd; ++i) {
      lo.push_back(kt[i] * win.d[i] - win.pb[i]);
      hi.push_back(img[i] - lo.back() - ((win.out[i] - 1) * win.s[i] + 1));
      interior.push_back(win.s[i] - 1);
    }
    Value* xt = b.reshape(b.slice(x, {0, 0, t, 0}, {nb, ch, t + 1, prod(win.out)}), grid);
    Value* placed = b.emit(CoreOp::pad, {xt, zero}, {{"low", lo}, {"high", hi}, {"interior", interior}});
    sum = sum ? b.add(sum, placed) : placed;
  }
  return {sum};
}

OpDef col2im_def() {
  OpDef d;
  d.name = "Col2Im";
  d.min_inputs = d.max_inputs = 3;
  d.since = 18;
  d.attrs = {{"dilations", AttrKind::ints}, {"pads", AttrKind::ints}, {"strides", AttrKind::ints}};
  d.infer = [](InferCtx& c) {
    const Shape& x = c.in(0).shape;
    if (x.size() != 3) fail("Col2Im input must be [N, C*prod(block), L], got {}", shape_str(x));
    auto img = known_ints(c, 1);
    auto blk = known_ints(c, 2);
    if (!img || !blk) {
      const int64_t nd = c.in(1).shape.empty() ? kUnknownDim : c.in(1).shape[0];
      if (nd == kUnknownDim) unsupported("Col2Im with an image_shape of unknown length");
      Shape out = {x[0], kUnknownDim};
      out.resize(static_cast<size_t>(2 + nd), kUnknownDim);
      c.set_out(0, {c.in(0).dtype, out});
      return;
    }
    if (img->size() != blk->size()) fail("Col2Im image_shape and block_shape lengths differ");
    for (int64_t v : *img)
      if (v < 1) fail("Col2Im image_shape must be positive, got {}", shape_str(*img));
    const int64_t kp = prod(*blk);
    if (kp <= 0) fail("Col2Im block_shape must be positive");
    if (x[1] != kUnknownDim && x[1] % kp != 0)
      fail("Col2Im input dim 1 ({}) is not a multiple of {}", x[1], kp);
    Shape out = {x[0], x[1] == kUnknownDim ? kUnknownDim : x[1] / kp};
    out.insert(out.end(), img->begin(), img->end());
    c.set_out(0, {c.in(0).dtype, out});
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    const std::vector<int64_t> img = c.in(1).to_i64(), blk = c.in(2).to_i64();
    if (x.rank() != 3 || img.size() != blk.size() || img.empty())
      fail("Col2Im: bad operand shapes");
    // The block grid is the forward window of a conv over the image.
    Window w = forward_window(c.node(), Shape(img.begin(), img.end()), blk, false);
    const int64_t kp = prod(blk), lp = prod(w.out), ip = prod(img);
    if (x.dim(1) % kp != 0 || x.dim(2) != lp)
      fail("Col2Im input {} does not match {} blocks of {} values", shape_str(x.shape()), lp, kp);
    const int64_t batch = x.dim(0), ch = x.dim(1) / kp;
    const std::vector<double> xv = x.to_f64();
    Shape oshape = {batch, ch};
    oshape.insert(oshape.end(), img.begin(), img.end());
    std::vector<double> yv(static_cast<size_t>(shape_numel(oshape)));
    for (int64_t t = 0; t < kp; ++t) {
      const std::vector<int64_t> kt = unflatten(t, blk);
      for (int64_t n = 0; n < batch; ++n)
        for (int64_t cc = 0; cc < ch; ++cc) {
          const double* xr = xv.data() + ((n * ch + cc) * kp + t) * lp;
          double* yr = yv.data() + (n * ch + cc) * ip;
          for_each_tap(w.out, w.in, w, kt, [&](int64_t l, int64_t o, bool) {
            if (o >= 0) yr[o] += xr[l];
          });
        }
    }
    c.set_out(0, Tensor::from_f64(x.dtype(), oshape, yv));
  };
  return d;
}

// ---- Pools --------------------------------------------------------------------------------------

enum class PoolKind { max, avg, lp };

std::vector<int64_t> pool_kernel(const Node& n, int nd) {
  std::vector<int64_t> k = n.attr_ints("kernel_shape");
  if (static_cast<int>(k.size()) != nd)
    fail("kernel_shape has {} values, expected {}", k.size(), nd);
  return k;
}

std::vector<AttrSpec> pool_attrs(PoolKind kind) {
  std::vector<AttrSpec> a = {{"auto_pad", AttrKind::s},     {"ceil_mode", AttrKind::i},
                             {"dilations", AttrKind::ints}, {"kernel_shape", AttrKind::ints, true},
                             {"pads", AttrKind::ints},      {"strides", AttrKind::ints}};
  if (kind == PoolKind::max) a.push_back({"storage_order", AttrKind::i});
  if (kind == PoolKind::avg) a.push_back({"count_include_pad", AttrKind::i});
  if (kind == PoolKind::lp) a.push_back({"p", AttrKind::i});
  return a;
}

OpDef pool_def(const std::string& name, PoolKind kind, int since) {
  OpDef d;
  d.name = name;
  d.since = since;
  d.max_outputs = kind == PoolKind::max ? 2 : 1;
  d.attrs = pool_attrs(kind);
  d.fusion = FusionKind::opaque;  // windowed, not a reduction over whole axes
  d.infer = [kind](InferCtx& c) {
    const TensorType& x = c.in(0);
    if (x.shape.size() < 3) fail("pool input must have rank >= 3, got {}", shape_str(x.shape));
    const bool int_ok = kind == PoolKind::max && (x.dtype == DType::u8 || x.dtype == DType::i8);
    if (!is_float(x.dtype) && !int_ok) fail("pooling on {} is not allowed", dtype_name(x.dtype));
    const int nd = static_cast<int>(x.shape.size()) - 2;
    const Dim batch = symbolic_batch_only(x, c.node().op_name());
    Window w = forward_window(c.node(), spatial_of(x.shape), pool_kernel(c.node(), nd),
                              c.node().attr_i("ceil_mode", 0) != 0);
    Shape out = {x.shape[0], x.shape[1]};
    out.insert(out.end(), w.out.begin(), w.out.end());
    c.set_out(0, with_batch({x.dtype, out}, batch));
    if (c.num_outputs() > 1 && c.node().outputs[1]) c.set_out(1, with_batch({DType::i64, out}, batch));
  };
  d.kernel = [kind](KernelCtx& c) {
    const Tensor& x = c.in(0);
    const int nd = x.rank() - 2;
    if (nd < 1) fail("pool input must have rank >= 3");
    Window w = forward_window(c.node(), spatial_of(x.shape()), pool_kernel(c.node(), nd),
                              c.node().attr_i("ceil_mode", 0) != 0);
    const int64_t planes = x.dim(0) * x.dim(1), ip = prod(w.in), op = prod(w.out), kp = prod(w.k);
    // kp <= kMaxWindowTaps and planes * op is an output size, so this cannot overflow.
    if (static_cast<double>(kp) * static_cast<double>(planes) * static_cast<double>(op) >
        static_cast<double>(kMaxPoolSteps))
      fail("pool of {} outputs over a {}-tap window is too much work (more than {} steps)",
           planes * op, kp, kMaxPoolSteps);
    const bool include_pad = c.node().attr_i("count_include_pad", 0) != 0;
    const int64_t p = c.node().attr_i("p", 2);
    const bool col_major = c.node().attr_i("storage_order", 0) != 0;
    if (kind == PoolKind::lp && p <= 0) fail("LpPool p must be positive, got {}", p);
    Shape oshape = {x.dim(0), x.dim(1)};
    oshape.insert(oshape.end(), w.out.begin(), w.out.end());
    const std::vector<double> xv = x.to_f64();
    const int64_t on = planes * op;
    std::vector<double> acc(static_cast<size_t>(on), kind == PoolKind::max ? -INFINITY : 0.0);
    std::vector<int64_t> cnt(static_cast<size_t>(on), 0), arg(static_cast<size_t>(on), -1);
    // Column-major flat positions for storage_order = 1.
    std::vector<int64_t> cm_of;
    if (kind == PoolKind::max && col_major && c.wants_out(1)) {
      cm_of.resize(static_cast<size_t>(ip));
      const std::vector<int64_t> rm = strides_of(w.in);
      for (int64_t i = 0; i < ip; ++i) {
        int64_t rest = i, cmi = 0, cs = 1;
        for (int dd = 0; dd < nd; ++dd) {
          const int64_t coord = rest / rm[dd];
          rest %= rm[dd];
          cmi += coord * cs;
          cs *= w.in[dd];
        }
        cm_of[i] = cmi;
      }
    }
    for (int64_t t = 0; t < kp; ++t) {
      const std::vector<int64_t> kt = unflatten(t, w.k);
      for (int64_t pl = 0; pl < planes; ++pl) {
        const double* xr = xv.data() + pl * ip;
        double* ar = acc.data() + pl * op;
        int64_t* cr = cnt.data() + pl * op;
        int64_t* gr = arg.data() + pl * op;
        for_each_tap(w.out, w.in, w, kt, [&](int64_t o, int64_t i, bool in_pad) {
          if (i < 0) {
            if (in_pad && include_pad) ++cr[o];
            return;
          }
          const double v = xr[i];
          switch (kind) {
            case PoolKind::max:
              if (v > ar[o] || gr[o] < 0) {
                ar[o] = v;
                gr[o] = i;
              }
              break;
            case PoolKind::avg:
              ar[o] += v;
              ++cr[o];
              break;
            case PoolKind::lp:
              ar[o] += std::pow(std::fabs(v), static_cast<double>(p));
              break;
          }
        });
      }
    }
    for (int64_t o = 0; o < on; ++o) {
      if (kind == PoolKind::avg) acc[o] = cnt[o] > 0 ? acc[o] / static_cast<double>(cnt[o]) : NAN;
      if (kind == PoolKind::lp) acc[o] = std::pow(acc[o], 1.0 / static_cast<double>(p));
    }
    if (is_float(x.dtype())) {
      c.set_out(0, Tensor::from_f64(x.dtype(), oshape, acc));
    } else {
      std::vector<int64_t> iv(acc.size());
      for (size_t i = 0; i < acc.size(); ++i) iv[i] = static_cast<int64_t>(acc[i]);
      c.set_out(0, Tensor::from_i64(x.dtype(), oshape, iv));
    }
    if (kind == PoolKind::max && c.wants_out(1)) {
      std::vector<int64_t> idx(static_cast<size_t>(on));
      for (int64_t o = 0; o < on; ++o) {
        const int64_t pl = o / std::max<int64_t>(op, 1);
        const int64_t local = arg[o] < 0 ? 0 : (col_major ? cm_of[arg[o]] : arg[o]);
        idx[o] = pl * ip + local;
      }
      c.set_out(1, Tensor::from_i64(DType::i64, oshape, idx));
    }
  };
  return d;
}

// ---- pool decompositions ----

// The node's pool window over x's spatial dims.
Window pool_window_of(const Node& n, const Shape& xs) {
  return forward_window(n, spatial_of(xs), pool_kernel(n, static_cast<int>(xs.size()) - 2),
                        n.attr_i("ceil_mode", 0) != 0);
}

// High padding that gives exactly `w.out` windows along spatial dim i (more than pe for
// ceil_mode's partial last window, possibly less when trailing input is never read).
int64_t pool_high(const Window& w, int i) { return (w.out[i] - 1) * w.s[i] + w.eff(i) - w.in[i] - w.pb[i]; }

// reduce_window {kind} over the spatial dims of [N, C, spatial...]; padded taps hold the kind's
// identity.
Value* pool_reduce(CoreBuilder& b, Value* x, const std::string& kind, const Window& w) {
  std::vector<int64_t> win = {1, 1}, str = {1, 1}, dil = {1, 1}, pad = {0, 0, 0, 0};
  for (int i = 0; i < w.nd; ++i) {
    win.push_back(w.k[i]);
    str.push_back(w.s[i]);
    dil.push_back(w.d[i]);
    pad.push_back(w.pb[i]);
    pad.push_back(pool_high(w, i));
  }
  return b.emit(CoreOp::reduce_window, {x},
                {{"kind", kind}, {"window", win}, {"strides", str}, {"dilations", dil}, {"padding", pad}});
}

// Per output position of one plane (shape [1, 1, out...]), the number of taps AveragePool divides
// by: the taps inside the input, or inside the padded range with count_include_pad.
Tensor pool_counts(const Window& w, bool include_pad, DType dt) {
  std::vector<double> cnt(static_cast<size_t>(prod(w.out)), 0.0);
  for (int64_t t = 0; t < prod(w.k); ++t)
    for_each_tap(w.out, w.in, w, unflatten(t, w.k), [&](int64_t o, int64_t i, bool in_pad) {
      if (i >= 0 || (include_pad && in_pad)) cnt[o] += 1;
    });
  Shape s = {1, 1};
  s.insert(s.end(), w.out.begin(), w.out.end());
  return Tensor::from_f64(dt, s, cnt);
}

// MaxPool's Indices: a running first-maximum over the window taps in the kernel's order (a tap
// wins when strictly larger, or when no tap inside the input was seen yet), each tap a strided
// slice of x padded with the lowest value. A tap's position is a compile-time table (-1 in the
// padding); storage_order 1 numbers the plane column-major. Plane offsets (n * C + c) * plane
// come from iotas.
Value* pool_argmax(CoreBuilder& b, Value* x, const Window& w, bool col_major) {
  const Dims xs = x->type.dims();
  const DType dt = x->type.dtype;
  const double lowest = is_float(dt) ? -INFINITY : dt == DType::u8 ? 0.0 : -128.0;
  std::vector<int64_t> lo = {0, 0}, hi = {0, 0};
  for (int i = 0; i < w.nd; ++i) {
    lo.push_back(w.pb[i]);
    hi.push_back(pool_high(w, i));
  }
  Value* padded = b.emit(CoreOp::pad, {x, b.scalar(dt, lowest)}, {{"low", lo}, {"high", hi}});
  Shape plane_out = {1, 1};
  plane_out.insert(plane_out.end(), w.out.begin(), w.out.end());
  const std::vector<int64_t> rm = strides_of(w.in);
  Value *best = nullptr, *arg = nullptr;
  for (int64_t t = 0; t < prod(w.k); ++t) {
    const std::vector<int64_t> kt = unflatten(t, w.k);
    std::vector<int64_t> pos(static_cast<size_t>(prod(w.out)), -1);
    for_each_tap(w.out, w.in, w, kt, [&](int64_t o, int64_t i, bool) {
      if (i < 0 || !col_major) {
        pos[o] = i;
        return;
      }
      int64_t cm = 0, scale = 1;
      for (int dd = 0; dd < w.nd; ++dd) {
        cm += (i / rm[dd]) % w.in[dd] * scale;
        scale *= w.in[dd];
      }
      pos[o] = cm;
    });
    Dims starts = {0, 0}, stops = {xs[0], xs[1]};
    std::vector<int64_t> strides = {1, 1};
    for (int i = 0; i < w.nd; ++i) {
      starts.push_back(kt[i] * w.d[i]);
      stops.push_back(starts.back() + (w.out[i] - 1) * w.s[i] + 1);
      strides.push_back(w.s[i]);
    }
    Value* v = b.slice(padded, starts, stops, strides);
    Value* p = b.broadcast_to(b.constant(Tensor::from_i64(DType::i64, plane_out, pos)), v->type.dims());
    if (!best) {
      best = v;
      arg = p;
      continue;
    }
    Value* none = b.scalar(DType::i64, -1);
    Value* take = b.binary(CoreOp::or_, b.compare("gt", v, best),
                           b.binary(CoreOp::and_, b.compare("eq", arg, none), b.compare("ne", p, none)));
    best = b.select(take, v, best);
    arg = b.select(take, p, arg);
  }
  const Dims os = arg->type.dims();
  Value* plane = b.add(b.mul(b.iota(DType::i64, os, 0), b.scalar(DType::i64, static_cast<double>(xs[1].value()))),
                       b.iota(DType::i64, os, 1));
  return b.add(arg, b.mul(plane, b.scalar(DType::i64, static_cast<double>(prod(w.in)))));
}

DecomposeFn decompose_pool(PoolKind kind) {
  return [kind](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    const DType dt = n.outputs[0]->type.dtype;
    const Window w = pool_window_of(n, n.inputs[0]->type.shape);
    if (kind == PoolKind::max) {
      Value* idx = nullptr;
      if (n.outputs.size() > 1 && n.outputs[1])
        idx = pool_argmax(b, n.inputs[0], w, n.attr_i("storage_order", 0) != 0);
      std::vector<Value*> r = {pool_reduce(b, n.inputs[0], "max", w)};
      if (n.outputs.size() > 1) r.push_back(idx);
      return r;
    }
    const DType ct = math_type(dt);
    Value* x = b.convert(n.inputs[0], ct);
    if (kind == PoolKind::avg) {
      Value* cnt = b.constant(pool_counts(w, n.attr_i("count_include_pad", 0) != 0, ct));
      return {b.convert(b.div(pool_reduce(b, x, "sum", w), cnt), dt)};
    }
    // LpPool: (sum |x|^p)^(1/p); p = 1 and 2 without pow.
    const int64_t p = n.attr_i("p", 2);
    if (p <= 0) fail("LpPool p must be positive, got {}", p);
    Value* ax = b.max(x, b.emit(CoreOp::neg, {x}));
    Value* xp = p == 1 ? ax : p == 2 ? b.mul(ax, ax) : b.binary(CoreOp::pow, ax, b.scalar(ct, static_cast<double>(p)));
    Value* sum = pool_reduce(b, xp, "sum", w);
    Value* y = p == 1   ? sum
               : p == 2 ? b.unary(CoreOp::sqrt, sum)
                        : b.binary(CoreOp::pow, sum, b.scalar(ct, 1.0 / static_cast<double>(p)));
    return {b.convert(y, dt)};
  };
}

// GlobalAveragePool / GlobalMaxPool: a reduce over every spatial dim, kept as 1s.
std::vector<Value*> decompose_global_pool(CoreBuilder& b, const Node& n, bool is_max) {
  std::vector<int64_t> axes(n.inputs[0]->type.shape.size() - 2);
  std::iota(axes.begin(), axes.end(), 2);
  const DType dt = n.outputs[0]->type.dtype;
  if (is_max) return {b.reduce(n.inputs[0], "max", axes, true)};
  const DType ct = math_type(dt);
  Value* x = b.convert(n.inputs[0], ct);
  Value* sum = b.reduce(x, "sum", axes, true);
  Value* count = element_count(b, x, axes, ct, true);
  return {b.convert(b.div(sum, count), dt)};
}

OpDef global_pool_def(const std::string& name, bool is_max) {
  OpDef d;
  d.name = name;
  d.since = 1;
  d.fusion = FusionKind::reduction;
  d.infer = [](InferCtx& c) {
    const TensorType& x = c.in(0);
    if (x.shape.size() < 3)
      fail("global pool input must have rank >= 3, got {}", shape_str(x.shape));
    if (!is_float(x.dtype)) fail("global pooling needs a float input");
    Dims out = x.dims();  // a reduction over the spatial dims: any of them may be symbolic
    std::fill(out.begin() + 2, out.end(), Dim(1));
    c.set_out(0, TensorType::of(x.dtype, out));
  };
  d.kernel = [is_max](KernelCtx& c) {
    const Tensor& x = c.in(0);
    if (x.rank() < 3) fail("global pool input must have rank >= 3");
    const int64_t planes = x.dim(0) * x.dim(1), ip = x.numel() / std::max<int64_t>(planes, 1);
    Shape out = {x.dim(0), x.dim(1)};
    out.resize(x.shape().size(), 1);
    std::vector<double> r(static_cast<size_t>(planes));
    if (x.dtype() == DType::f32) {
      const float* p = x.data<float>();
      for (int64_t pl = 0; pl < planes; ++pl) {
        double a = is_max ? -INFINITY : 0.0;
        for (int64_t i = 0; i < ip; ++i)
          a = is_max ? std::max(a, static_cast<double>(p[pl * ip + i])) : a + p[pl * ip + i];
        r[pl] = is_max ? a : a / static_cast<double>(ip);
      }
    } else {
      const std::vector<double> v = x.to_f64();
      for (int64_t pl = 0; pl < planes; ++pl) {
        double a = is_max ? -INFINITY : 0.0;
        for (int64_t i = 0; i < ip; ++i)
          a = is_max ? std::max(a, v[pl * ip + i]) : a + v[pl * ip + i];
        r[pl] = is_max ? a : a / static_cast<double>(ip);
      }
    }
    c.set_out(0, Tensor::from_f64(x.dtype(), out, r));
  };
  return d;
}

// ---- MaxUnpool ----------------------------------------------------------------------------------

Shape unpool_default_shape(const Node& n, const Shape& x) {
  const int nd = static_cast<int>(x.size()) - 2;
  std::vector<int64_t> k = pool_kernel(n, nd);
  std::vector<int64_t> s = ints_or(n, "strides", nd, 1);
  std::vector<int64_t> pads =
      n.attr_ints("pads", std::vector<int64_t>(static_cast<size_t>(2 * nd), 0));
  if (static_cast<int>(pads.size()) != 2 * nd)
    fail("pads has {} values, expected {}", pads.size(), 2 * nd);
  Shape out = {x[0], x[1]};
  for (int i = 0; i < nd; ++i) {
    if (s[i] < 1 || k[i] < 1) fail("MaxUnpool strides and kernel_shape must be >= 1");
    const int64_t o = x[i + 2] == kUnknownDim
                          ? kUnknownDim
                          : (x[i + 2] - 1) * s[i] + k[i] - pads[i] - pads[i + nd];
    if (x[i + 2] != kUnknownDim && o < 0) fail("MaxUnpool output extent is negative");
    out.push_back(o);
  }
  return out;
}

// MaxUnpool: a scatter of x into a zero tensor of the output shape, both flattened. Indices are
// flat positions in the default unpooled shape; an explicit (static) output_shape keeps their
// coordinates, so they are re-linearised with div/rem.
std::vector<Value*> decompose_max_unpool(CoreBuilder& b, const Node& n) {
  const Shape& out = n.outputs[0]->type.shape;
  if (!shape_known(out)) b.need_constant(2, "output_shape");
  const Shape dflt = unpool_default_shape(n, n.inputs[0]->type.shape);
  const int64_t cnt = shape_numel(n.inputs[0]->type.shape);
  Value* idx = b.reshape(n.inputs[1], {cnt});
  if (out != dflt) {
    const std::vector<int64_t> ds = strides_of(dflt), os = strides_of(out);
    Value* dst = nullptr;
    for (size_t d = 0; d < dflt.size(); ++d) {
      Value* coord = b.binary(CoreOp::rem, b.div(idx, b.scalar(DType::i64, static_cast<double>(ds[d]))),
                              b.scalar(DType::i64, static_cast<double>(dflt[d])));
      Value* term = b.mul(coord, b.scalar(DType::i64, static_cast<double>(os[d])));
      dst = dst ? b.add(dst, term) : term;
    }
    idx = dst;
  }
  Value* zeros = b.full(n.outputs[0]->type.dtype, {shape_numel(out)}, 0);
  Value* y = b.emit(CoreOp::scatter, {zeros, idx, b.reshape(n.inputs[0], {cnt})}, {{"axis", int64_t{0}}});
  return {b.reshape(y, out)};
}

OpDef max_unpool_def() {
  OpDef d;
  d.name = "MaxUnpool";
  d.min_inputs = 2;
  d.max_inputs = 3;
  d.since = 9;
  d.attrs = {{"kernel_shape", AttrKind::ints, true},
             {"pads", AttrKind::ints},
             {"strides", AttrKind::ints}};
  d.infer = [](InferCtx& c) {
    const TensorType& x = c.in(0);
    if (x.shape.size() < 3) fail("MaxUnpool input must have rank >= 3");
    if (c.in(1).dtype != DType::i64) fail("MaxUnpool indices must be int64");
    if (c.has_in(2)) {
      auto os = known_ints(c, 2);
      if (os) {
        if (os->size() != x.shape.size())
          fail("MaxUnpool output_shape has {} values, expected {}", os->size(), x.shape.size());
        for (int64_t v : *os)
          if (v < 0) fail("MaxUnpool output_shape {} has a negative dim", shape_str(*os));
        c.set_out(0, {x.dtype, Shape(os->begin(), os->end())});
      } else {
        c.set_out(0, {x.dtype, Shape(x.shape.size(), kUnknownDim)});
      }
      return;
    }
    c.set_out(0, {x.dtype, unpool_default_shape(c.node(), x.shape)});
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    const Tensor& ix = c.in(1);
    if (x.rank() < 3) fail("MaxUnpool input must have rank >= 3");
    if (ix.shape() != x.shape())
      fail("MaxUnpool indices shape {} differs from X {}", shape_str(ix.shape()),
           shape_str(x.shape()));
    Shape out;
    if (c.has_in(2)) {
      const std::vector<int64_t> os = c.in(2).to_i64();
      out.assign(os.begin(), os.end());
      if (out.size() != x.shape().size()) fail("MaxUnpool output_shape has the wrong length");
      for (int64_t v : out)
        if (v < 0) fail("MaxUnpool output_shape {} has a negative dim", shape_str(out));
    } else {
      out = unpool_default_shape(c.node(), x.shape());
    }
    Tensor y(x.dtype(), out);
    const std::vector<int64_t> idx = ix.to_i64();
    // Indices are flat positions in a tensor of the default unpooled shape (MaxPool's output
    // convention); an explicit output_shape keeps each element at the same coordinates.
    const Shape dflt = unpool_default_shape(c.node(), x.shape());
    const std::vector<int64_t> ds = strides_of(dflt), os = strides_of(out);
    const int64_t dn = shape_numel(dflt);
    for (int64_t i = 0; i < x.numel(); ++i) {
      int64_t t = idx[i];
      if (t < 0 || t >= dn) fail("MaxUnpool index {} out of range [0, {})", t, dn);
      int64_t dst = 0;
      for (size_t dd = 0; dd < dflt.size(); ++dd) {
        const int64_t coord = t / ds[dd];
        t %= ds[dd];
        if (coord >= out[dd])
          fail("MaxUnpool index {} falls outside output_shape {}", idx[i], shape_str(out));
        dst += coord * os[dd];
      }
      if (is_float(x.dtype()))
        y.set_f(dst, x.get_f(i));
      else
        y.set_i(dst, x.get_i(i));
    }
    c.set_out(0, std::move(y));
  };
  return d;
}

// ---- CausalConvWithState ------------------------------------------------------------------------

// Depthwise causal 1-D conv over [past_state, input] (opset 27), optionally followed by SiLU; the
// last K-1 steps of that concatenation become the next state.
// CausalConvWithState: a depthwise convolution over [past_state (zeros when absent), x], the
// bias and SiLU after it (in f32 for narrow floats); the new state is the last K - 1 steps.
std::vector<Value*> decompose_causal_conv_with_state(CoreBuilder& b, const Node& n) {
  const DType dt = n.outputs[0]->type.dtype, ct = math_type(dt);
  Value* x = b.convert(n.inputs[0], ct);
  Value* w = b.convert(n.inputs[1], ct);
  const Shape& xs = x->type.shape;
  const int64_t st = w->type.shape[2] - 1, len = xs[2];
  Value* past = n.has_input(3) ? b.convert(n.inputs[3], ct) : b.full(ct, {xs[0], xs[1], st}, 0);
  Value* full = st > 0 ? b.concat({past, x}, 2) : x;
  Value* y = b.emit(CoreOp::convolution, {full, w}, {{"groups", xs[1]}});
  if (n.has_input(2)) y = add_channel_bias(b, y, n.inputs[2]);
  const std::string act = n.attr_s("activation", "none");
  if (act == "silu" || act == "swish")
    y = b.div(y, b.add(b.scalar(ct, 1), b.unary(CoreOp::exp, b.emit(CoreOp::neg, {y}))));
  std::vector<Value*> r = {b.convert(y, dt)};
  if (n.outputs.size() > 1)
    r.push_back(b.convert(b.slice(full, {0, 0, len}, {xs[0], xs[1], len + st}), dt));
  return r;
}

OpDef causal_conv_with_state_def() {
  OpDef d;
  d.name = "CausalConvWithState";
  d.min_inputs = 2;
  d.max_inputs = 4;
  d.min_outputs = 1;
  d.max_outputs = 2;
  d.since = 27;
  d.attrs = {{"activation", AttrKind::s}};
  d.infer = [](InferCtx& c) {
    const TensorType& x = c.in(0);
    const Shape& w = c.in(1).shape;
    if (!is_float(x.dtype) || c.in(1).dtype != x.dtype)
      fail("CausalConvWithState needs float operands of one dtype");
    if (x.shape.size() != 3 || w.size() != 3)
      unsupported("CausalConvWithState only for 1-D inputs [N, C, L]");
    if (w[1] != 1 && w[1] != kUnknownDim)
      unsupported("CausalConvWithState weights must be depthwise [C, 1, K]");
    if (w[0] != kUnknownDim && x.shape[1] != kUnknownDim && w[0] != x.shape[1])
      fail("CausalConvWithState weight has {} channels, input {}", w[0], x.shape[1]);
    const std::string act = c.node().attr_s("activation", "none");
    if (act != "none" && act != "silu" && act != "swish")
      unsupported("CausalConvWithState activation '{}'", act);
    c.set_out(0, x);
    if (c.num_outputs() > 1 && c.node().outputs[1])
      c.set_out(1,
                {x.dtype, {x.shape[0], x.shape[1], w[2] == kUnknownDim ? kUnknownDim : w[2] - 1}});
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    const Tensor& wt = c.in(1);
    if (x.rank() != 3 || wt.rank() != 3 || wt.dim(1) != 1 || wt.dim(0) != x.dim(1) || wt.dim(2) < 1)
      fail("CausalConvWithState needs input [N, C, L] and weight [C, 1, K]");
    const int64_t n = x.dim(0), ch = x.dim(1), len = x.dim(2), k = wt.dim(2), st = k - 1,
                  full = st + len;
    const std::vector<double> xv = x.to_f64(), wv = wt.to_f64();
    const std::vector<double> bv =
        c.has_in(2) ? c.in(2).to_f64() : std::vector<double>(static_cast<size_t>(ch), 0.0);
    if (static_cast<int64_t>(bv.size()) != ch)
      fail("CausalConvWithState bias must have {} values", ch);
    std::vector<double> pv(static_cast<size_t>(n * ch * st), 0.0);
    if (c.has_in(3)) {
      if (c.in(3).shape() != Shape{n, ch, st})
        fail("CausalConvWithState past_state must be [{}, {}, {}]", n, ch, st);
      pv = c.in(3).to_f64();
    }
    const std::string act = c.node().attr_s("activation", "none");
    const bool silu = act == "silu" || act == "swish";
    std::vector<double> y(static_cast<size_t>(n * ch * len)), ns(static_cast<size_t>(n * ch * st));
    std::vector<double> row(static_cast<size_t>(full));
    for (int64_t b = 0; b < n; ++b)
      for (int64_t cc = 0; cc < ch; ++cc) {
        const int64_t plane = b * ch + cc;
        for (int64_t t = 0; t < st; ++t) row[t] = pv[plane * st + t];
        for (int64_t t = 0; t < len; ++t) row[st + t] = xv[plane * len + t];
        for (int64_t t = 0; t < len; ++t) {
          double a = bv[cc];
          for (int64_t j = 0; j < k; ++j) a += wv[cc * k + j] * row[t + j];
          y[plane * len + t] = silu ? a / (1.0 + std::exp(-a)) : a;
        }
        for (int64_t t = 0; t < st; ++t) ns[plane * st + t] = row[full - st + t];
      }
    c.set_out(0, Tensor::from_f64(x.dtype(), x.shape(), y));
    if (c.wants_out(1)) c.set_out(1, Tensor::from_f64(x.dtype(), {n, ch, st}, ns));
  };
  return d;
}

// ---- DeformConv ---------------------------------------------------------------------------------

// Conv whose taps sample the input at learned fractional offsets (multilinear interpolation, zero
// outside the input), optionally scaled by a per-tap mask (deformable conv v2).
// DeformConv: the kernel's column matrix built from gathers. Per tap and output position the
// sampling point is the regular tap position plus the learned offset; each of its 2^nd cell corners
// is one gather (flat index into the plane, taps outside the input masked to 0) scaled by its
// multilinear weight. The columns (times the optional mask) then contract with the weight in one
// dot_general batched over the conv groups.
std::vector<Value*> decompose_deform_conv(CoreBuilder& b, const Node& n) {
  const DType dt = n.outputs[0]->type.dtype, ct = math_type(dt);
  Value* x = b.convert(n.inputs[0], ct);
  Value* w = b.convert(n.inputs[1], ct);
  const Shape& xs = x->type.shape;
  const int nd = static_cast<int>(xs.size()) - 2;
  const Window win = forward_window(n, spatial_of(xs), conv_kernel(n, w->type.shape, nd), false);
  const int64_t nb = xs[0], c = xs[1], m = w->type.shape[0], groups = n.attr_i("group", 1);
  const int64_t og = n.attr_i("offset_group", 1), kp = prod(win.k), op = prod(win.out), ip = prod(win.in);
  const int64_t cpg = c / og, cg = c / groups;
  Value* off = b.reshape(b.convert(n.inputs[2], ct), {nb, og, kp, nd, op});
  const Shape grid = {nb, og, kp, op}, cols = {nb, og, cpg, kp * op};
  const std::vector<int64_t> istr = strides_of(win.in);
  Value* i0 = b.scalar(DType::i64, 0);
  std::vector<Value*> lo(nd), frac(nd);
  for (int i = 0; i < nd; ++i) {
    std::vector<double> base(static_cast<size_t>(kp * op));
    for (int64_t t = 0; t < kp; ++t) {
      const std::vector<int64_t> kt = unflatten(t, win.k);
      for (int64_t o = 0; o < op; ++o)
        base[t * op + o] = static_cast<double>(unflatten(o, win.out)[i] * win.s[i] - win.pb[i] + kt[i] * win.d[i]);
    }
    Value* delta = b.reshape(b.slice(off, {0, 0, 0, i, 0}, {nb, og, kp, i + 1, op}), grid);
    Value* pos = b.add(delta, b.constant(Tensor::from_f64(ct, {1, 1, kp, op}, base)));
    Value* fl = b.unary(CoreOp::floor, pos);
    frac[i] = b.sub(pos, fl);
    lo[i] = b.convert(fl, DType::i64);
  }
  Value* xg = b.reshape(x, {nb, og, cpg, ip});
  Value* col = nullptr;
  for (int corner = 0; corner < (1 << nd); ++corner) {
    Value *inside = nullptr, *flat = nullptr, *wgt = nullptr;
    for (int i = 0; i < nd; ++i) {
      const bool up = (corner >> i) & 1;
      Value* q = up ? b.add(lo[i], b.scalar(DType::i64, 1)) : lo[i];
      Value* ok = b.binary(CoreOp::and_, b.compare("ge", q, i0), b.compare("lt", q, b.scalar(DType::i64, static_cast<double>(win.in[i]))));
      Value* wi = up ? frac[i] : b.sub(b.scalar(ct, 1), frac[i]);
      Value* fi = b.mul(q, b.scalar(DType::i64, static_cast<double>(istr[i])));
      inside = inside ? b.binary(CoreOp::and_, inside, ok) : ok;
      flat = flat ? b.add(flat, fi) : fi;
      wgt = wgt ? b.mul(wgt, wi) : wi;
    }
    auto per_col = [&](Value* v) { return b.broadcast_to(b.reshape(v, {nb, og, 1, kp * op}), cols); };
    Value* idx = per_col(b.select(inside, flat, i0));
    Value* v = b.emit(CoreOp::gather, {xg, idx}, {{"axis", int64_t{3}}});
    v = b.mul(b.select(per_col(inside), v, b.full(ct, cols, 0)), per_col(wgt));
    col = col ? b.add(col, v) : v;
  }
  if (n.has_input(4)) col = b.mul(col, b.reshape(b.convert(n.inputs[4], ct), {nb, og, 1, kp * op}));
  col = b.reshape(col, {nb, groups, cg, kp, op});
  Value* wr = b.reshape(w, {groups, m / groups, cg, kp});
  Value* y = b.emit(CoreOp::dot_general, {col, wr},
                    {{"lhs_batch", std::vector<int64_t>{1}},
                     {"rhs_batch", std::vector<int64_t>{0}},
                     {"lhs_contract", std::vector<int64_t>{2, 3}},
                     {"rhs_contract", std::vector<int64_t>{2, 3}}});  // [G, N, op, M/G]
  y = b.reshape(b.transpose(y, {1, 0, 3, 2}), n.outputs[0]->type.shape);
  if (n.has_input(3)) y = add_channel_bias(b, y, n.inputs[3]);
  return {b.convert(y, dt)};
}

OpDef deform_conv_def() {
  OpDef d;
  d.name = "DeformConv";
  d.min_inputs = 3;
  d.max_inputs = 5;
  d.since = 19;
  d.attrs = {{"dilations", AttrKind::ints},    {"group", AttrKind::i},
             {"kernel_shape", AttrKind::ints}, {"offset_group", AttrKind::i},
             {"pads", AttrKind::ints},         {"strides", AttrKind::ints}};
  d.cost = conv_cost;
  d.infer = [](InferCtx& c) {
    const DType dt = c.in(0).dtype;
    if (!is_float(dt) || c.in(1).dtype != dt || c.in(2).dtype != dt)
      fail("DeformConv needs float operands of one dtype");
    c.set_out(0, infer_conv_type(c, dt));
  };
  d.kernel = [](KernelCtx& c) {
    const Node& node = c.node();
    const Tensor& x = c.in(0);
    const Tensor& wt = c.in(1);
    const int64_t group = node.attr_i("group", 1), og = node.attr_i("offset_group", 1);
    check_conv_operands(x.shape(), wt.shape(), group);
    const int nd = x.rank() - 2;
    const int64_t batch = x.dim(0), c_in = x.dim(1), m_out = wt.dim(0);
    if (c_in != wt.dim(1) * group || m_out % group != 0) fail("DeformConv channel/group mismatch");
    if (og < 1 || c_in % og != 0)
      fail("DeformConv offset_group {} must divide {} channels", og, c_in);
    Window w =
        forward_window(node, spatial_of(x.shape()), conv_kernel(node, wt.shape(), nd), false);
    const int64_t kp = prod(w.k), op = prod(w.out), ip = prod(w.in);
    Shape oshape = {batch, m_out};
    oshape.insert(oshape.end(), w.out.begin(), w.out.end());
    Shape off_shape = {batch, og * nd * kp};
    off_shape.insert(off_shape.end(), w.out.begin(), w.out.end());
    if (c.in(2).shape() != off_shape)
      fail("DeformConv offset must have shape {}, got {}", shape_str(off_shape),
           shape_str(c.in(2).shape()));
    const bool has_mask = c.has_in(4);
    if (has_mask) {
      Shape ms = off_shape;
      ms[1] = og * kp;
      if (c.in(4).shape() != ms) fail("DeformConv mask must have shape {}", shape_str(ms));
    }
    const std::vector<double> xv = x.to_f64(), wv = wt.to_f64(), ov = c.in(2).to_f64();
    const std::vector<double> mv = has_mask ? c.in(4).to_f64() : std::vector<double>{};
    std::vector<double> bv(static_cast<size_t>(m_out), 0.0);
    if (c.has_in(3)) {
      if (c.in(3).numel() != m_out) fail("DeformConv bias must have {} values", m_out);
      bv = c.in(3).to_f64();
    }
    const std::vector<int64_t> istr = strides_of(w.in);
    const int64_t cpg = c_in / og, cg = c_in / group, mg = m_out / group;
    std::vector<double> col(static_cast<size_t>(c_in * kp * op));
    std::vector<double> pos(static_cast<size_t>(nd));
    std::vector<double> y(static_cast<size_t>(shape_numel(oshape)));
    for (int64_t n = 0; n < batch; ++n) {
      for (int64_t t = 0; t < kp; ++t) {
        const std::vector<int64_t> kt = unflatten(t, w.k);
        for (int64_t o = 0; o < op; ++o) {
          const std::vector<int64_t> oc = unflatten(o, w.out);
          for (int64_t g = 0; g < og; ++g) {
            for (int i = 0; i < nd; ++i) {
              const double delta = ov[((n * og + g) * nd * kp + t * nd + i) * op + o];
              pos[i] = static_cast<double>(oc[i] * w.s[i] - w.pb[i] + kt[i] * w.d[i]) + delta;
            }
            const double mk = has_mask ? mv[((n * og + g) * kp + t) * op + o] : 1.0;
            for (int64_t ci = g * cpg; ci < (g + 1) * cpg; ++ci) {
              const double* xc = xv.data() + (n * c_in + ci) * ip;
              // Sum over the 2^nd corners of the cell holding `pos`.
              double val = 0;
              for (int corner = 0; corner < (1 << nd); ++corner) {
                double wgt = 1;
                int64_t off = 0;
                bool inside = true;
                for (int i = 0; i < nd && inside; ++i) {
                  const double fl = std::floor(pos[i]);
                  const bool up = (corner >> i) & 1;
                  const int64_t q = static_cast<int64_t>(fl) + (up ? 1 : 0);
                  const double fr = pos[i] - fl;
                  wgt *= up ? fr : 1.0 - fr;
                  if (q < 0 || q >= w.in[i])
                    inside = false;
                  else
                    off += q * istr[i];
                }
                if (inside && wgt != 0.0) val += wgt * xc[off];
              }
              col[(ci * kp + t) * op + o] = val * mk;
            }
          }
        }
      }
      for (int64_t m = 0; m < m_out; ++m) {
        const int64_t g = m / mg;
        double* yr = y.data() + (n * m_out + m) * op;
        std::fill(yr, yr + op, bv[m]);
        for (int64_t cl = 0; cl < cg; ++cl)
          for (int64_t t = 0; t < kp; ++t) {
            const double wk = wv[(m * cg + cl) * kp + t];
            const double* cr = col.data() + ((g * cg + cl) * kp + t) * op;
            for (int64_t o = 0; o < op; ++o) yr[o] += wk * cr[o];
          }
      }
    }
    c.set_out(0, Tensor::from_f64(x.dtype(), oshape, y));
  };
  return d;
}

}  // namespace

void register_conv_pool_ops(OpRegistry& r) {
  // Conv and the pools take symbolic sizes (docs/dynamic-shapes.md): the batch dim, and any dim of a
  // global pool.
  r.add(symbolic_op(with_decomposition(conv_def(), decompose_conv)));
  r.add(with_decomposition(conv_integer_def(), decompose_conv_integer));
  r.add(with_decomposition(conv_transpose_def(), decompose_conv_transpose));
  r.add(with_decomposition(col2im_def(), decompose_col2im));
  r.add(symbolic_op(with_decomposition(pool_def("MaxPool", PoolKind::max, 1), decompose_pool(PoolKind::max))));
  // opset 1 lacks count_include_pad only
  r.add(symbolic_op(with_decomposition(pool_def("AveragePool", PoolKind::avg, 1), decompose_pool(PoolKind::avg))));
  r.add(symbolic_op(with_decomposition(pool_def("LpPool", PoolKind::lp, 2), decompose_pool(PoolKind::lp))));
  r.add(symbolic_op(with_decomposition(global_pool_def("GlobalAveragePool", false), [](CoreBuilder& b, const Node& n) {
    return decompose_global_pool(b, n, false);
  })));
  r.add(symbolic_op(with_decomposition(global_pool_def("GlobalMaxPool", true), [](CoreBuilder& b, const Node& n) {
    return decompose_global_pool(b, n, true);
  })));
  r.add(with_decomposition(max_unpool_def(), decompose_max_unpool));
  r.add(with_decomposition(causal_conv_with_state_def(), decompose_causal_conv_with_state));
  r.add(with_decomposition(deform_conv_def(), decompose_deform_conv));
}

}  // namespace tessel
