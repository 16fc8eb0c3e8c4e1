// The KTIR function emitter's declarations (internal to src/tessel/export/ktir*.cpp): the index-map helpers,
// memory views and the FuncEmitter class, shared by ktir.cpp (matmul, vector, re-layout, convolutions as
// strided taps) and ktir_conv.cpp (convolutions with padding, groups or dilation).
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tessel/export/ktir.h"
#include "tessel/support/error.h"

namespace tessel::ktir::detail {

// Thrown inside one kernel's export when KTIR (or this exporter) cannot state it: the kernel is skipped.
struct Unsupported {
  std::string why;
};
[[noreturn]] inline void cannot(std::string why) { throw Unsupported{std::move(why)}; }

inline std::string elem_type(DType t) {
  switch (t) {
    case DType::f64: return "f64";
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i64: return "i64";
    case DType::i32: return "i32";
    case DType::i16: return "i16";
    case DType::i8: return "i8";
    case DType::boolean: return "i1";
    default: cannot(fmt::format("no KTIR element type for {}", dtype_name(t)));
  }
}
inline bool is_fp(DType t) { return t == DType::f64 || t == DType::f32 || t == DType::f16 || t == DType::bf16; }

inline std::string dims_x(const std::vector<int64_t>& s) {
  std::string r;
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "x" : "") + std::to_string(s[i]);
  return r;
}
inline std::string tensor_ty(const std::vector<int64_t>& s, DType t) { return fmt::format("tensor<{}x{}>", dims_x(s), elem_type(t)); }
inline std::string list(const std::vector<int64_t>& v) {
  std::string r;
  for (size_t i = 0; i < v.size(); ++i) r += (i ? ", " : "") + std::to_string(v[i]);
  return r;
}
inline std::string list(const std::vector<std::string>& v) {
  std::string r;
  for (size_t i = 0; i < v.size(); ++i) r += (i ? ", " : "") + v[i];
  return r;
}
// affine_set of the box [0, ext) in every dim
inline std::string box_set(const std::vector<int64_t>& ext) {
  std::vector<std::string> ds, cs;
  for (size_t i = 0; i < ext.size(); ++i) {
    ds.push_back(fmt::format("d{}", i));
    cs.push_back(fmt::format("d{} >= 0", i));
    cs.push_back(fmt::format("-d{} + {} >= 0", i, ext[i] - 1));
  }
  return fmt::format("affine_set<({}) : ({})>", list(ds), list(cs));
}
inline std::string identity_map(size_t r) {
  std::vector<std::string> ds;
  for (size_t i = 0; i < r; ++i) ds.push_back(fmt::format("d{}", i));
  return fmt::format("affine_map<({0}) -> ({0})>", list(ds));
}

// Element attribute text of a constant of type t.
inline std::string literal(double v, DType t) {
  // i1 as 1 / 0, which MLIR reads as it reads true / false (ktir-cpu 9e03d63 read "true" as 0)
  if (t == DType::boolean) return v != 0 ? "1" : "0";
  if (!is_fp(t)) return fmt::format("{}", static_cast<int64_t>(v));
  if (std::isfinite(v)) return fmt::format("{:.9e}", v);
  // non-finite floats as their bit pattern
  if (t == DType::f32) {
    const float f = static_cast<float>(v);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    return fmt::format("0x{:08X}", bits);
  }
  if (t == DType::f64) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    return fmt::format("0x{:016X}", bits);
  }
  if (t == DType::f16) return std::isnan(v) ? "0x7E00" : v > 0 ? "0x7C00" : "0xFC00";
  return std::isnan(v) ? "0x7FC0" : v > 0 ? "0x7F80" : "0xFF80";  // bf16
}

// ---- index maps over the tile dims -----------------------------------------------------------------

struct Affine {
  int64_t base = 0;
  std::vector<int64_t> strides;
};

// Fits f(point) = base + sum strides[d]·point[d] over the box `ext` and checks it: every point when the
// box is small, else every line along each dim through the two extreme corners.
inline Affine fit(const std::vector<int64_t>& ext, const std::function<int64_t(const std::vector<int64_t>&)>& f,
           const std::string& what) {
  const size_t r = ext.size();
  std::vector<int64_t> pt(r, 0);
  Affine a;
  a.base = f(pt);
  a.strides.assign(r, 0);
  for (size_t d = 0; d < r; ++d)
    if (ext[d] > 1) {
      pt[d] = 1;
      a.strides[d] = f(pt) - a.base;
      pt[d] = 0;
    }
  auto check = [&](const std::vector<int64_t>& q) {
    int64_t want = a.base;
    for (size_t d = 0; d < r; ++d) want += a.strides[d] * q[d];
    if (f(q) != want) cannot(fmt::format("{} is not affine over the tile dims", what));
  };
  int64_t total = 1;
  for (int64_t e : ext) total *= std::max<int64_t>(1, e);
  if (total <= (int64_t{1} << 18)) {
    std::vector<int64_t> q(r, 0);
    for (int64_t i = 0; i < total; ++i) {
      check(q);
      for (size_t d = r; d-- > 0;) {
        if (++q[d] < ext[d]) break;
        q[d] = 0;
      }
    }
  } else {
    for (int corner = 0; corner < 2; ++corner)
      for (size_t d = 0; d < r; ++d) {
        std::vector<int64_t> q(r);
        for (size_t j = 0; j < r; ++j) q[j] = corner ? std::max<int64_t>(0, ext[j] - 1) : 0;
        for (int64_t i = 0; i < ext[d]; ++i) q[d] = i, check(q);
      }
  }
  return a;
}

// Element `linear` of the kernel's loop space (outer dims, then inner, row-major) through `acc`.
inline int64_t access_at(const Kernel& k, const KAccess& acc, int64_t linear) {
  std::vector<int64_t> ext = require_static(k.outer);
  for (const tessel::Dim& d : k.inner) ext.push_back(d);
  int64_t off = acc.offset;
  for (size_t d = ext.size(); d-- > 0;) {
    const int64_t i = linear % ext[d];
    linear /= ext[d];
    off += acc.strides[d] * i;
  }
  return off;
}

// Padded DRAM element address of element `l` of a global, where `l` is a dense offset in the global's
// physical dim order (`perm`, outermost first; row-major when empty): the kernel level's accesses
// are offsets into the value's dense physical layout (NHWC activations, results stored transposed).
// The innermost physical dim is padded.
struct Layout {
  Shape shape;
  std::vector<int64_t> pstride;  // per logical dim, in padded elements
  std::vector<size_t> order;     // physical dims, outermost first
  explicit Layout(const Global& g) : shape(g.shape) {
    const size_t r = shape.size();
    pstride.assign(r, 1);
    for (size_t i = 0; i < r; ++i) order.push_back(g.perm.size() == r ? static_cast<size_t>(g.perm[i]) : i);
    int64_t s = 1;
    for (size_t i = r; i-- > 0;) {
      pstride[order[i]] = s;
      s *= g.padded[order[i]];
    }
  }
  // the address of logical element `l` (row-major over the logical shape)
  int64_t at_index(int64_t l) const {
    int64_t a = 0;
    for (size_t d = shape.size(); d-- > 0;) {
      a += (l % shape[d]) * pstride[d];
      l /= shape[d];
    }
    return a;
  }
  int64_t at(int64_t l) const {
    int64_t a = 0;
    for (size_t i = order.size(); i-- > 0;) {
      const size_t d = order[i];
      a += (l % shape[d]) * pstride[d];
      l /= shape[d];
    }
    return a;
  }
};

// ---- one function ----------------------------------------------------------------------------------

struct View {
  std::string name, memref, what;
  int global = -1;
  mutable bool stored = false;
  std::vector<int> tdims;          // the tile dims its dims are (broadcast and extent-1 dims dropped)
  std::vector<int64_t> sizes, strides;
  int64_t base = 0;                // the first element's padded address
  std::vector<int64_t> coord;      // base as coordinates of the view (sizes grown to hold them)
  DType dtype = DType::f16;
  // A tile dim the map is affine over only as (x / split_f, x % split_f) (a row index of a [B·T, C]
  // loop space read per batch, a reduction over heads·d): view dims split_at and split_at + 1 are that
  // pair, every other view dim is one of tdims in order. -1: none.
  int split_at = -1;
  int64_t split_f = 0;
  // Some tile of the split dim crosses a block: that dim is accessed one element (row) at a time, the
  // rows gathered with tensor.insert_slice and scattered with tensor.extract_slice.
  bool per_row = false;
  // >= 0: the base is no sum of the other dims' strides (a convolution tap one element in), so the view
  // has one more, leading dim of stride 1 accessed at this coordinate; sizes/strides hold it first,
  // coord and split_at do not count it.
  int64_t lead = -1;
};

// The base address as coordinates along the view's dims (largest stride first), so the view starts at
// its argument itself: ktir-cpu takes any SSA pointer of a construct_memory_view for an argument of
// the function (an `arith.addi %argN, ...` pointer was listed as one more input). Returns false when
// the strides cannot add up to it.
inline bool base_coordinates(View& v) {
  std::vector<size_t> by(v.strides.size());
  for (size_t i = 0; i < by.size(); ++i) by[i] = i;
  std::stable_sort(by.begin(), by.end(), [&](size_t a, size_t b) { return v.strides[a] > v.strides[b]; });
  v.coord.assign(v.strides.size(), 0);
  int64_t rest = v.base;
  for (size_t i : by)
    if (v.strides[i] > 0) v.coord[i] = rest / v.strides[i], rest -= v.coord[i] * v.strides[i];
  for (size_t i = 0; i < v.sizes.size(); ++i) v.sizes[i] += v.coord[i];
  if (rest != 0) {
    v.lead = rest;
    v.sizes.insert(v.sizes.begin(), rest + 1);
    v.strides.insert(v.strides.begin(), 1);
  }
  return true;
}

class FuncEmitter {
 public:
  FuncEmitter(const TileProgram& p, const KernelModule& m, const TileKernel& t, const Kernel& k)
      : p_(p), m_(m), t_(t), k_(k) {}

  std::string run();
  // After run(): the globals of %arg0, %arg1, ... in order.
  const std::vector<int>& arg_globals() const { return arg_globals_; }
  std::vector<KtirView> views() const {
    std::vector<KtirView> r;
    for (const View& v : views_list_) {
      KtirView k;
      k.global = v.global;
      k.what = v.what;
      k.stored = v.stored;
      for (int d : v.tdims) {
        const std::string& nm = t_.dims[static_cast<size_t>(d)].name;
        if (static_cast<int>(k.dims.size()) == v.split_at) k.dims.push_back(nm + "/" + std::to_string(v.split_f)), k.dims.push_back(nm + "%" + std::to_string(v.split_f));
        else k.dims.push_back(nm);
      }
      const size_t l = v.lead >= 0 ? 1 : 0;
      for (size_t i = l; i < v.sizes.size(); ++i) k.sizes.push_back(v.sizes[i] - (i - l < v.coord.size() ? v.coord[i - l] : 0));
      k.strides.assign(v.strides.begin() + static_cast<std::ptrdiff_t>(l), v.strides.end());
      k.base = v.base;
      r.push_back(std::move(k));
    }
    return r;
  }

 private:
  const TileProgram& p_;
  const KernelModule& m_;
  const TileKernel& t_;
  const Kernel& k_;
  std::ostringstream consts_, views_, body_;
  std::map<int64_t, std::string> idx_consts_;
  std::map<int, std::string> arg_of_global_;
  std::vector<int> arg_globals_;
  std::deque<View> views_list_;  // stable references
  std::map<std::string, int> counters_;
  int depth_ = 2;
  std::vector<std::string> offset_;   // per tile dim: the SSA index of the current tile's start
  std::vector<int64_t> tile_ext_;     // per tile dim: the tile's extent
  std::vector<int> compute_;          // the tile dims of the compute tensors (ordered)
  std::map<std::pair<int, int>, std::string> vals_;  // (instr, 0 elem / 1 row) -> SSA
  std::map<int, std::string> loaded_;                // access -> element tensor (f32 compute)
  std::string acc_;                                  // matmul: the accumulator tile
  int c_access_ = -1;                                // matmul: the epilogue access of c
  std::vector<int> target_;                          // the tile dims the kernel's loop space is over
  std::function<int64_t(const std::vector<int64_t>&)> linear_of_;  // target point -> loop-space element
  // > 0: the tiles of dim pieces_dim_ are emitted in runs that lie within one block of pieces_f_ elements
  // or cover whole ones (a convolution's output rows, ktir_conv.cpp): views split that dim by pieces_f_ alone.
  int pieces_dim_ = -1;
  int64_t pieces_f_ = 0;
  std::vector<int64_t> static_off_;                  // static_tiles: per tile dim, the tile's start
  std::vector<std::string> lo_;                      // per tile dim: the core's slice start

  std::string fresh(const std::string& prefix) { return fmt::format("%{}{}", prefix, counters_[prefix]++); }
  void line(const std::string& s) { body_ << std::string(static_cast<size_t>(depth_) * 2, ' ') << s << '\n'; }
  std::string idx(int64_t v) {
    auto it = idx_consts_.find(v);
    if (it != idx_consts_.end()) return it->second;
    const std::string n = fmt::format("%c{}", v);
    consts_ << fmt::format("    {} = arith.constant {} : index\n", n, v);
    return idx_consts_[v] = n;
  }
  int dim_index(const std::string& name) const {
    for (size_t i = 0; i < t_.dims.size(); ++i)
      if (t_.dims[i].name == name) return static_cast<int>(i);
    throw Error(Location{.node = t_.node, .pass = "ktir"}, fmt::format("tile kernel {} has no dim '{}'", t_.name, name));
  }
  int arg_of(int global) const {
    const std::string& name = p_.globals.at(static_cast<size_t>(global)).name;
    for (size_t i = 0; i < k_.args.size(); ++i)
      if (k_.args[i].name == name) return static_cast<int>(i);
    throw Error(Location{.node = t_.node, .pass = "ktir"},
                fmt::format("tile kernel {}: global '{}' is no arg of kernel {}", t_.name, name, k_.name));
  }
  int global_of_arg(int arg) const {
    const int g = p_.find_global(k_.args.at(static_cast<size_t>(arg)).name);
    if (g < 0)
      throw Error(Location{.node = t_.node, .pass = "ktir"},
                  fmt::format("tile kernel {}: arg {} of kernel {} ('{}') has no global", t_.name, arg, k_.name,
                              k_.args[static_cast<size_t>(arg)].name));
    return g;
  }

  // `logical` gives the dense physical offset of the element (the kernel level's accesses), or with
  // `by_index` its logical row-major index (convolutions' operands, laid out by their declaration).
  // `ext`: the view's extents when they are not the tile dims' (a convolution's channels along r).
  const View& view(int global, const std::vector<int>& tdims, const std::function<int64_t(const std::vector<int64_t>&)>& logical,
                   const std::string& what, bool by_index = false, const std::vector<int64_t>* ext = nullptr);
  bool split_view(View& v, const std::vector<int>& tdims, const std::vector<int64_t>& ext,
                  const std::function<int64_t(const std::vector<int64_t>&)>& addr, const std::string& what);
  bool tiles_within(int d, int64_t f) const;
  // The access indices and tile extents of the current tile in v's view dims (a split dim as its pair).
  // `only` >= 0 (per_row views): the split dim's element `only` of the tile alone.
  void access(const View& v, std::vector<std::string>& at, std::vector<int64_t>& tile, std::vector<int64_t>& dense,
              int64_t only = -1);
  // One access tile and its load or store (a split pair as one dim in `dense`).
  std::string load_access(const View& v, int64_t only, std::vector<int64_t>& dense);
  void store_access(const View& v, std::string x, int64_t only);
  std::string load(const View& v, const std::vector<int>& compute, DType compute_dtype);
  // row: `value` is a row tensor (the compute dims but the last), e.g. a reduction's result.
  void store(const View& v, const std::string& value, DType value_dtype, bool row = false);
  std::string broadcast_row(const std::string& row, DType t);
  std::string value(int id, bool row);
  std::string constant(double v, DType t, bool row);
  std::vector<int64_t> shape(bool row) const {
    std::vector<int64_t> s;
    for (size_t i = 0; i + (row ? 1 : 0) < compute_.size(); ++i) s.push_back(tile_ext_[static_cast<size_t>(compute_[i])]);
    return s;
  }
  void emit_body_stores();
  std::string emit_matmul();
  std::string ksplit_slice(const std::string& acc0, const std::string& acc_ty,
                           const std::function<std::string(const std::string&)>& product);
  // An f32 accumulator of type acc_ty filled with zeros; its name (and the zero constant's in *zero).
  std::string zero_accumulator(const std::string& acc_ty, std::string* zero = nullptr);
  // Dim k's `size` elements in tiles of `tile` from its offset lo_[k]: the whole tiles in one scf.for carrying
  // the accumulator (or inline when there is one), the partial tile after it; `product` adds one tile.
  std::string accumulate_tiles(size_t k, int64_t size, int64_t tile, const std::string& acc, const std::string& acc_ty,
                               const std::string& iv_prefix,
                               const std::function<std::string(const std::string&)>& product);
  std::string emit_vector();
  std::string emit_relayout();
  std::string emit_conv();
  void conv_epilogue_map();
  // ktir_conv.cpp: a convolution with padding, groups or dilation, its tiles unrolled (static offsets).
  std::string emit_conv_window();
  // The tiles of `dims` like nest(), every core (scf.if on its coordinate) and tile spelled out: offset_ holds
  // constants, static_off_ their values.
  void static_tiles(const std::vector<int>& dims, size_t i, const std::function<void()>& body);
  int64_t static_tile_count(const std::vector<int>& dims) const;
  // A view of `global` over `ext` (every dim kept), element x at logical index logical(x) of the global.
  const View& box_view(int global, const std::vector<int64_t>& ext, const std::function<int64_t(const std::vector<int64_t>&)>& logical,
                       const std::string& what);
  // The box of `sizes` at static coordinates `at` of a box_view, as a tensor in the view's dtype.
  std::string load_box(const View& v, const std::vector<int64_t>& at, const std::vector<int64_t>& sizes);
  // A zero tensor of `shape` (a convolution's border in the scratchpad), one constant per shape at the function's top.
  std::string border(const std::vector<int64_t>& shape, DType t);
  std::map<std::string, std::string> borders_;
  // The tiles of `dims` (outermost first) on each core, whole and partial, around `body`: per dim a loop
  // over the whole tiles of the core's extent and the partial tile after it as straight-line code of
  // its own static extent; where the cores' extents along a split dim differ (the last core's slice
  // is short, cores past the end have none), one scf.if per extent on the core's coordinate.
  void nest(const std::vector<int>& dims, size_t i, const std::function<void()>& body);
  void extent_tiles(const std::vector<int>& dims, size_t i, int64_t extent, const std::function<void()>& body);
  std::string header(const std::string& kind);
};

}  // namespace tessel::ktir::detail
