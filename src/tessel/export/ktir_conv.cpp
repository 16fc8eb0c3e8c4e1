// KTIR export of convolutions with padding, groups or dilation (docs/ktir.md, "How a kernel becomes a function"):
// per output tile and tap, the tap's im2col tile is read from DRAM as tessel's plan reads it (a strided window
// of the input; the pixels the padding supplies are not read but zeros in the scratchpad), and the taps are
// accumulated in f32 — by a matmul per group (one group: one matmul), or for a depthwise convolution (tessel
// runs it on the vector unit) by a per-channel multiply-add. The tiles are spelled out with static offsets: a tile's border (which rows and columns are
// padding) depends on where it lies, and a tensor's shape in KTIR is static.
#include <algorithm>

#include "tessel/export/ktir_emit.h"
#include "tessel/support/escape.h"

namespace tessel::ktir::detail {

namespace {
// Tiles beyond this many (tiles x reduction tiles x taps) are not spelled out: the function would be huge.
constexpr int64_t kMaxUnrolled = 16384;

// A run of a tile's output pixels that is a rectangle of the output image: `rows` whole or partial rows
// from (oh, ow), `cols` wide, starting `at` pixels into the tile.
struct Piece {
  int64_t at, oh, ow, rows, cols;
};
std::vector<Piece> pieces(int64_t s0, int64_t ts, int64_t ow_size) {
  std::vector<Piece> r;
  for (int64_t s = s0, end = s0 + ts; s < end;) {
    const int64_t oh = s / ow_size, ow = s % ow_size;
    if (ow != 0 || end - s < ow_size) {
      const int64_t n = std::min(ow_size - ow, end - s);
      r.push_back({s - s0, oh, ow, 1, n});
      s += n;
    } else {
      const int64_t rows = (end - s) / ow_size;
      r.push_back({s - s0, oh, 0, rows, ow_size});
      s += rows * ow_size;
    }
  }
  return r;
}
}  // namespace

int64_t FuncEmitter::static_tile_count(const std::vector<int>& dims) const {
  int64_t n = 1;
  for (int d : dims) {
    const Dim& dm = t_.dims[static_cast<size_t>(d)];
    int64_t tiles = 0;
    for (int64_t c = 0; c < dm.split; ++c) {
      const int64_t lo = c * dm.slice, hi = std::min(dm.size, lo + dm.slice);
      if (hi > lo) tiles += (hi - lo + dm.tile - 1) / dm.tile;
    }
    n *= std::max<int64_t>(1, tiles);
  }
  return n;
}

void FuncEmitter::static_tiles(const std::vector<int>& dims, size_t i, const std::function<void()>& body) {
  if (i == dims.size()) {
    vals_.clear();
    loaded_.clear();
    body();
    return;
  }
  const size_t d = static_cast<size_t>(dims[i]);
  const Dim& dm = t_.dims[d];
  auto tiles = [&](int64_t lo, int64_t hi) {
    for (int64_t t0 = lo; t0 < hi; t0 += dm.tile) {
      offset_[d] = idx(t0);
      static_off_[d] = t0;
      tile_ext_[d] = std::min(dm.tile, hi - t0);
      static_tiles(dims, i + 1, body);
    }
    tile_ext_[d] = dm.tile;
  };
  if (dm.split == 1) return tiles(0, dm.size);
  for (int64_t c = 0; c < dm.split; ++c) {  // each core's slice under its coordinate; cores past the end have none
    const int64_t lo = c * dm.slice, hi = std::min(dm.size, lo + dm.slice);
    if (hi <= lo) break;
    const std::string on = fresh("on_" + dm.name);
    line(fmt::format("{} = arith.cmpi eq, %tid_{}, {} : index", on, dm.name, idx(c)));
    line(fmt::format("scf.if {} {{", on));
    ++depth_;
    tiles(lo, hi);
    --depth_;
    line("}");
  }
}

const View& FuncEmitter::box_view(int global, const std::vector<int64_t>& ext,
                                  const std::function<int64_t(const std::vector<int64_t>&)>& logical, const std::string& what) {
  const Global& g = p_.globals.at(static_cast<size_t>(global));
  const Layout lay(g);
  const Affine a = fit(ext, [&](const std::vector<int64_t>& x) { return lay.at_index(logical(x)); }, what);
  View v;
  v.global = global;
  v.what = what;
  v.dtype = g.dtype;
  v.base = a.base;
  v.sizes = ext;
  v.strides = a.strides;
  for (int64_t& s : v.strides)
    if (s == 0) s = 1;  // a dim of extent 1 (fit leaves its stride 0): any stride names its one element
  if (!base_coordinates(v)) cannot(fmt::format("{}: base offset {} is no sum of its strides", what, v.base));
  for (const View& o : views_list_)
    if (o.global == v.global && o.base == v.base && o.sizes == v.sizes && o.strides == v.strides && o.tdims.empty()) return o;
  v.memref = fmt::format("memref<{}x{}>", dims_x(v.sizes), elem_type(v.dtype));
  v.name = fresh("view");
  views_ << fmt::format("    // {}: {}{}\n", v.name, mlir_comment_text(what),
                        v.base ? fmt::format(", from element {} (coordinates [{}]{})", v.base, list(v.coord),
                                             v.lead >= 0 ? fmt::format(", and {} along a leading stride-1 dim", v.lead) : "")
                               : "");
  views_ << fmt::format("    {} = ktdp.construct_memory_view {}, sizes: [{}], strides: [{}] {{\n", v.name, arg_of_global_.at(global),
                        list(v.sizes), list(v.strides));
  views_ << fmt::format("      coordinate_set = {}, memory_space = #ktdp.spyre_memory_space<HBM>\n", box_set(v.sizes));
  views_ << fmt::format("    }} : {}\n", v.memref);
  views_list_.push_back(v);
  return views_list_.back();
}

std::string FuncEmitter::load_box(const View& v, const std::vector<int64_t>& at, const std::vector<int64_t>& sizes) {
  // a base one element off the other strides' sums: a leading stride-1 dim of extent 1 at that offset
  std::vector<std::string> ats;
  std::vector<int64_t> tile = sizes;
  if (v.lead >= 0) ats.push_back(idx(v.lead)), tile.insert(tile.begin(), 1);
  for (size_t i = 0; i < at.size(); ++i) ats.push_back(idx(at[i] + v.coord.at(i)));
  const std::string at_ty = fmt::format("!ktdp.access_tile<{}xindex>", dims_x(tile));
  const std::string acc = fresh("tile");
  std::string x = fresh("ld");
  line(fmt::format("{} = ktdp.construct_access_tile {}[{}] {{", acc, v.name, list(ats)));
  line(fmt::format("  access_tile_set = {}, access_tile_order = {}", box_set(tile), identity_map(tile.size())));
  line(fmt::format("}} : {} -> {}", v.memref, at_ty));
  line(fmt::format("{} = ktdp.load {} : {} -> {}", x, acc, at_ty, tensor_ty(tile, v.dtype)));
  if (v.lead >= 0) {
    std::vector<std::string> groups = {"[0, 1]"};
    for (size_t i = 1; i < sizes.size(); ++i) groups.push_back(fmt::format("[{}]", i + 1));
    const std::string y = fresh("ld");
    line(fmt::format("{} = tensor.collapse_shape {} [{}] : {} into {}", y, x, list(groups), tensor_ty(tile, v.dtype),
                     tensor_ty(sizes, v.dtype)));
    x = y;
  }
  return x;
}

std::string FuncEmitter::border(const std::vector<int64_t>& shape, DType t) {
  const std::string ty = tensor_ty(shape, t);
  auto it = borders_.find(ty);
  if (it != borders_.end()) return it->second;
  const std::string n = fmt::format("%border{}", borders_.size());
  consts_ << fmt::format("    {} = arith.constant dense<{}> : {}\n", n, literal(0, t), ty);
  return borders_[ty] = n;
}

std::string FuncEmitter::emit_conv_window() {
  const ConvSpec& c = k_.conv;
  const int n = dim_index("n"), oc = dim_index("oc"), sd = dim_index("s"), r = dim_index("r");
  const Dim& dr = t_.dims[static_cast<size_t>(r)];
  if (c.groups < 1 || c.c % c.groups != 0 || c.oc % c.groups != 0)
    throw Error(Location{.node = t_.node, .pass = "ktir"},
                fmt::format("tile kernel {}: {} groups do not divide {} -> {} channels", t_.name, c.groups, c.c, c.oc));
  const int64_t G = c.groups, cg = c.c / G, og = c.oc / G, window = c.kh * c.kw, OW = c.ow, OC = c.oc, S = c.oh * c.ow;
  // the product's form is the tile level's: a depthwise convolution on the vector unit, any other by matmuls
  const bool depthwise = G > 1 && cg == 1 && og == 1;
  if (t_.on_vector_unit != depthwise) cannot("a convolution on the vector unit that is not depthwise");
  if (dr.split > 1) cannot(fmt::format("the reduction is split over {} cores", dr.split));
  if (t_.dims[static_cast<size_t>(n)].tile != 1) cannot("batch tiles of more than one image");
  if (t_.order.empty() || t_.order.back() != r) cannot("a loop order without r innermost");
  if (dr.size != cg * window || dr.tile % window != 0) cannot("reduction tiles that are not whole input channels");
  if (G > 1 && dr.tile != dr.size) cannot("a grouped convolution with its reduction in tiles");
  const int gx = global_of_arg(c.x), gw = global_of_arg(c.w), gy = global_of_arg(c.y);
  const DType dtx = p_.globals[static_cast<size_t>(gx)].dtype, dtw = p_.globals[static_cast<size_t>(gw)].dtype;
  const std::vector<int> outer(t_.order.begin(), t_.order.end() - 1);
  const int64_t rtiles = (dr.size + dr.tile - 1) / dr.tile, bodies = static_tile_count(outer);
  if (bodies * rtiles * window > kMaxUnrolled)
    cannot(fmt::format("{} tiles x {} reduction tiles x {} taps to spell out (at most {})", bodies, rtiles, window, kMaxUnrolled));
  conv_epilogue_map();
  target_ = {n, sd, oc};
  compute_ = {sd, oc};
  static_off_.assign(t_.dims.size(), 0);
  if (!c.y_nhwc) pieces_dim_ = sd, pieces_f_ = OW;
  const size_t kn = static_cast<size_t>(n), ks = static_cast<size_t>(sd), ko = static_cast<size_t>(oc);
  static_tiles(outer, 0, [&] {
    const int64_t img = static_off_[kn], s0 = static_off_[ks], ts = tile_ext_[ks], oc0 = static_off_[ko], to = tile_ext_[ko];
    const std::string acc_ty = tensor_ty({ts, to}, DType::f32);
    std::string acc = zero_accumulator(acc_ty);
    const std::vector<Piece> ps = pieces(s0, ts, OW);
    // the groups the oc tile touches (one group: all of them)
    const int64_t g_lo = G > 1 ? oc0 / og : 0, g_hi = G > 1 ? (oc0 + to - 1) / og : 0;
    for (int64_t rt = 0; rt < dr.size; rt += dr.tile) {
      // the input channels of this reduction tile
      const int64_t c_lo = G > 1 ? g_lo * cg : rt / window, c_hi = G > 1 ? (g_hi + 1) * cg : std::min(dr.size, rt + dr.tile) / window;
      const int64_t nch = c_hi - c_lo;
      for (int64_t kh = 0; kh < c.kh; ++kh)
        for (int64_t kw = 0; kw < c.kw; ++kw) {
          const int64_t tap = kh * c.kw + kw;
          // the output pixels whose input this tap finds inside the image: rows [oh_lo, oh_hi), columns [ow_lo, ow_hi)
          auto first = [](int64_t pad, int64_t off, int64_t stride) { return off >= pad ? 0 : (pad - off + stride - 1) / stride; };
          auto end = [](int64_t pad, int64_t off, int64_t stride, int64_t in, int64_t out) {
            const int64_t last = in - 1 + pad - off;  // the largest o with o·stride + off - pad < in
            return last < 0 ? 0 : std::min(out, last / stride + 1);
          };
          const int64_t oh_lo = first(c.pad_top, kh * c.dil_h, c.stride_h), oh_hi = end(c.pad_top, kh * c.dil_h, c.stride_h, c.h, c.oh);
          const int64_t ow_lo = first(c.pad_left, kw * c.dil_w, c.stride_w), ow_hi = end(c.pad_left, kw * c.dil_w, c.stride_w, c.wd, OW);
          // the tap's im2col tile [ts, nch], read from DRAM as tessel's plan reads it (each tap's window a strided
          // load; the border is not read: zeros in the scratchpad), a run of the tile at a time
          const View* xv = nullptr;
          if (oh_hi > oh_lo && ow_hi > ow_lo)
            xv = &box_view(gx, {oh_hi - oh_lo, ow_hi - ow_lo, c.c}, [&](const std::vector<int64_t>& x) {
              const int64_t ih = (oh_lo + x[0]) * c.stride_h + kh * c.dil_h - c.pad_top;
              const int64_t iw = (ow_lo + x[1]) * c.stride_w + kw * c.dil_w - c.pad_left;
              return ((img * c.c + x[2]) * c.h + ih) * c.wd + iw;
            }, fmt::format("conv x, image {}, tap ({}, {}), over [output row, output column, channel] from ({}, {})", img, kh, kw,
                           oh_lo, ow_lo));
          std::string xt;
          for (const Piece& pc : ps) {
            const std::vector<int64_t> sz = {pc.rows, pc.cols, nch};
            const int64_t r0 = std::max(pc.oh, oh_lo), r1 = std::min(pc.oh + pc.rows, oh_hi);
            const int64_t c0 = std::max(pc.ow, ow_lo), c1 = std::min(pc.ow + pc.cols, ow_hi);
            std::string t3;
            if (r1 <= r0 || c1 <= c0) {
              t3 = border(sz, dtx);  // the tap reads only padding here
            } else {
              t3 = load_box(*xv, {r0 - oh_lo, c0 - ow_lo, c_lo}, {r1 - r0, c1 - c0, nch});
              if (r1 - r0 != pc.rows || c1 - c0 != pc.cols) {
                const std::string b = fresh("bordered");
                line(fmt::format("{} = tensor.insert_slice {} into {}[{}, {}, 0] [{}, {}, {}] [1, 1, 1] : {} into {}", b, t3,
                                 border(sz, dtx), r0 - pc.oh, c0 - pc.ow, r1 - r0, c1 - c0, nch,
                                 tensor_ty({r1 - r0, c1 - c0, nch}, dtx), tensor_ty(sz, dtx)));
                t3 = b;
              }
            }
            const std::string cl = fresh("tap");
            line(fmt::format("{} = tensor.collapse_shape {} [[0, 1], [2]] : {} into {}", cl, t3, tensor_ty(sz, dtx),
                             tensor_ty({pc.rows * pc.cols, nch}, dtx)));
            if (ps.size() == 1) {
              xt = cl;
              break;
            }
            if (xt.empty()) {
              xt = fresh("im2col");
              line(fmt::format("{} = tensor.empty() : {}", xt, tensor_ty({ts, nch}, dtx)));
            }
            const std::string x2 = fresh("im2col");
            line(fmt::format("{} = tensor.insert_slice {} into {}[{}, 0] [{}, {}] [1, 1] : {} into {}", x2, cl, xt, pc.at,
                             pc.rows * pc.cols, nch, tensor_ty({pc.rows * pc.cols, nch}, dtx), tensor_ty({ts, nch}, dtx)));
            xt = x2;
          }
          if (depthwise) {
            // channel oc0 + j of the tile is input channel oc0 + j: acc += x · w[channel], on the vector unit
            const View& wv = box_view(gw, {OC}, [&](const std::vector<int64_t>& x) { return x[0] * window + tap; },
                                      fmt::format("conv w, tap ({}, {}), over [channel]", kh, kw));
            const std::string w1 = load_box(wv, {oc0}, {to});
            const std::string wf = fresh("cv"), xf = fresh("cv"), we = fresh("empty"), wb = fresh("bc"), pr = fresh("mac"),
                              sum = fresh("acc");
            line(fmt::format("{} = arith.extf {} : {} to {}", wf, w1, tensor_ty({to}, dtw), tensor_ty({to}, DType::f32)));
            line(fmt::format("{} = tensor.empty() : {}", we, acc_ty));
            line(fmt::format("{} = linalg.broadcast ins({} : {}) outs({} : {}) dimensions = [0]", wb, wf, tensor_ty({to}, DType::f32),
                             we, acc_ty));
            line(fmt::format("{} = arith.extf {} : {} to {}", xf, xt, tensor_ty({ts, to}, dtx), acc_ty));
            line(fmt::format("{} = arith.mulf {}, {} : {}", pr, xf, wb, acc_ty));
            line(fmt::format("{} = arith.addf {}, {} : {}", sum, acc, pr, acc_ty));
            acc = sum;
          } else if (G == 1) {
            const View& wv = box_view(gw, {c.c, OC}, [&](const std::vector<int64_t>& x) { return (x[1] * c.c + x[0]) * window + tap; },
                                      fmt::format("conv w, tap ({}, {}), over [channel, oc]", kh, kw));
            const std::string wt = load_box(wv, {c_lo, oc0}, {nch, to});
            const std::string m = fresh("mm");
            line(fmt::format("{} = linalg.matmul ins({}, {} : {}, {}) outs({} : {}) -> {}", m, xt, wt, tensor_ty({ts, nch}, dtx),
                             tensor_ty({nch, to}, dtw), acc, acc_ty, acc_ty));
            acc = m;
          } else {
            // a block-diagonal product: per group the tile touches, its channels by its weights into its columns
            const View& wv = box_view(gw, {cg, OC}, [&](const std::vector<int64_t>& x) { return (x[1] * cg + x[0]) * window + tap; },
                                      fmt::format("conv w, tap ({}, {}), over [channel in group, oc]", kh, kw));
            for (int64_t g = g_lo; g <= g_hi; ++g) {
              const int64_t a = std::max(oc0, g * og), b = std::min(oc0 + to, (g + 1) * og);
              const std::string xg = fresh("grp"), ag = fresh("grp"), m = fresh("mm"), put = fresh("acc");
              const std::string wt = load_box(wv, {0, a}, {cg, b - a});
              const std::string gty = tensor_ty({ts, b - a}, DType::f32);
              line(fmt::format("{} = tensor.extract_slice {}[0, {}] [{}, {}] [1, 1] : {} to {}", xg, xt, g * cg - c_lo, ts, cg,
                               tensor_ty({ts, nch}, dtx), tensor_ty({ts, cg}, dtx)));
              line(fmt::format("{} = tensor.extract_slice {}[0, {}] [{}, {}] [1, 1] : {} to {}", ag, acc, a - oc0, ts, b - a, acc_ty, gty));
              line(fmt::format("{} = linalg.matmul ins({}, {} : {}, {}) outs({} : {}) -> {}", m, xg, wt, tensor_ty({ts, cg}, dtx),
                               tensor_ty({cg, b - a}, dtw), ag, gty, gty));
              line(fmt::format("{} = tensor.insert_slice {} into {}[0, {}] [{}, {}] [1, 1] : {} into {}", put, m, acc, a - oc0, ts, b - a,
                               gty, acc_ty));
              acc = put;
            }
          }
        }
    }
    // the epilogue and the store: over the whole tile where y's pixels are one dim of its layout (NHWC);
    // where they are rows of a padded plane (NCHW), run by run of the tile (each within a row or of whole rows)
    const std::vector<Piece> runs = c.y_nhwc ? std::vector<Piece>{{0, 0, 0, 1, ts}} : ps;
    for (const Piece& pc : runs) {
      const int64_t len = pc.rows * pc.cols;
      offset_[ks] = idx(s0 + pc.at);
      tile_ext_[ks] = len;
      acc_ = acc;
      if (runs.size() > 1) {
        acc_ = fresh("run");
        line(fmt::format("{} = tensor.extract_slice {}[{}, 0] [{}, {}] [1, 1] : {} to {}", acc_, acc, pc.at, len, to, acc_ty,
                         tensor_ty({len, to}, DType::f32)));
      }
      vals_.clear();
      loaded_.clear();
      if (k_.body.empty()) {
        const View& vy = view(gy, target_, [&](const std::vector<int64_t>& x) { return (x[0] * OC + x[2]) * S + x[1]; }, "conv y", true);
        store(vy, acc_, DType::f32);
      } else {
        emit_body_stores();
      }
    }
    tile_ext_[ks] = ts;
  });
  pieces_dim_ = -1;
  pieces_f_ = 0;
  return "conv";
}

}  // namespace tessel::ktir::detail
