// KTIR export (see ktir.h, docs/ir/tile.md, "KTIR export"). Every index map of the kernel level is re-derived over the
// tile dims (b m n k, or p e) and checked to be affine there before it becomes a strided memory view;
// a kernel whose maps, partition or ops KTIR cannot state is skipped with the reason, never
// approximated.
#include "tessel/export/ktir.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "tessel/ir/core_ops.h"
#include "tessel/support/error.h"
#include "tessel/support/escape.h"

#include "tessel/export/ktir_emit.h"

namespace tessel::ktir {
namespace detail {

// A memory view of `global` indexed by the tile dims `tdims` (their full extents), where tile point
// x is logical element logical(x) of the global; its strides are in padded DRAM elements.
const View& FuncEmitter::view(int global, const std::vector<int>& tdims,
                              const std::function<int64_t(const std::vector<int64_t>&)>& logical, const std::string& what,
                              bool by_index, const std::vector<int64_t>* ext_override) {
  const Global& g = p_.globals.at(static_cast<size_t>(global));
  const Layout lay(g);
  std::vector<int64_t> ext;
  for (int d : tdims) ext.push_back(t_.dims[static_cast<size_t>(d)].size);
  if (ext_override) ext = *ext_override;
  auto addr = [&](const std::vector<int64_t>& x) { return by_index ? lay.at_index(logical(x)) : lay.at(logical(x)); };
  View v;
  v.global = global;
  v.what = what;
  v.dtype = g.dtype;
  try {
    const Affine a = fit(ext, addr, what);
    v.base = a.base;
    for (size_t i = 0; i < tdims.size(); ++i)
      if (ext[i] > 1 && a.strides[i] != 0) {
        v.tdims.push_back(tdims[i]);
        v.sizes.push_back(ext[i]);
        v.strides.push_back(a.strides[i]);
      }
  } catch (const Unsupported& first) {
    if (!split_view(v, tdims, ext, addr, what)) throw first;
  }
  if (v.sizes.empty()) v.sizes = {1}, v.strides = {1};
  if (!base_coordinates(v)) cannot(fmt::format("{}: base offset {} is no sum of its strides", what, v.base));
  for (const View& o : views_list_)
    if (o.global == v.global && o.base == v.base && o.sizes == v.sizes && o.strides == v.strides && o.tdims == v.tdims) return o;
  v.memref = fmt::format("memref<{}x{}>", dims_x(v.sizes), elem_type(v.dtype));
  const std::string ptr = arg_of_global_.at(global);
  v.name = fresh("view");
  std::vector<std::string> names;
  for (int d : v.tdims) names.push_back(t_.dims[static_cast<size_t>(d)].name);
  views_ << fmt::format("    // {}: {} over [{}]{}\n", v.name, mlir_comment_text(what), list(names),
                        v.base ? fmt::format(", from element {} (coordinates [{}]{})", v.base, list(v.coord),
                                             v.lead >= 0 ? fmt::format(", and {} along a leading stride-1 dim", v.lead) : "")
                               : "");
  views_ << fmt::format("    {} = ktdp.construct_memory_view {}, sizes: [{}], strides: [{}] {{\n", v.name, ptr, list(v.sizes),
                        list(v.strides));
  views_ << fmt::format("      coordinate_set = {}, memory_space = #ktdp.spyre_memory_space<HBM>\n", box_set(v.sizes));
  views_ << fmt::format("    }} : {}\n", v.memref);
  views_list_.push_back(v);
  return views_list_.back();
}

// Every tile of dim d (each core's slice from c·slice, whole tiles then the partial one) lies within one
// block of f elements or covers whole blocks.
bool FuncEmitter::tiles_within(int d, int64_t f) const {
  if (d == pieces_dim_ && f == pieces_f_) return true;  // the tiles are emitted as runs within rows or of whole rows
  const Dim& dm = t_.dims[static_cast<size_t>(d)];
  for (int64_t c = 0; c < dm.split; ++c) {
    const int64_t lo = c * dm.slice, hi = std::min(dm.size, lo + dm.slice);
    for (int64_t t0 = lo; t0 < hi; t0 += dm.tile) {
      const int64_t n = std::min(dm.tile, hi - t0);
      if (!(t0 % f + n <= f || (t0 % f == 0 && n % f == 0))) return false;
    }
  }
  return true;
}

// A view affine over the tile dims once one of them is split into (x / f, x % f), f a divisor of its
// extent whose blocks no tile crosses; fills v (tdims, sizes, strides, base, split) and returns true,
// or false when no such split exists.
bool FuncEmitter::split_view(View& v, const std::vector<int>& tdims, const std::vector<int64_t>& ext,
                             const std::function<int64_t(const std::vector<int64_t>&)>& addr, const std::string& what) {
  // first a split no tile crosses; else one whose crossing tiles go row by row (small tiles only)
  for (int pass = 0; pass < 2; ++pass)
  for (size_t i = 0; i < tdims.size(); ++i)
    for (int64_t f = 2; f < ext[i]; ++f) {
      if (ext[i] % f != 0) continue;
      if (pieces_f_ > 0 && !(tdims[i] == pieces_dim_ && f == pieces_f_)) continue;
      const bool within = tiles_within(tdims[i], f);
      if (pass == 0 ? !within : (within || t_.dims[static_cast<size_t>(tdims[i])].tile > 64)) continue;
      std::vector<int64_t> e2;
      for (size_t j = 0; j < ext.size(); ++j) {
        if (j == i) e2.push_back(ext[i] / f), e2.push_back(f);
        else e2.push_back(ext[j]);
      }
      Affine a;
      try {
        a = fit(e2, [&](const std::vector<int64_t>& y) {
          std::vector<int64_t> x;
          for (size_t j = 0, k = 0; j < ext.size(); ++j, ++k) {
            if (j == i) x.push_back(y[k] * f + y[k + 1]), ++k;
            else x.push_back(y[k]);
          }
          return addr(x);
        }, what);
      } catch (const Unsupported&) {
        continue;
      }
      v.base = a.base;
      v.per_row = pass == 1;
      for (size_t j = 0, k = 0; j < ext.size(); ++j, ++k) {
        if (j == i) {
          v.split_at = static_cast<int>(v.sizes.size());
          v.split_f = f;
          v.tdims.push_back(tdims[j]);
          v.sizes.push_back(ext[j] / f), v.strides.push_back(a.strides[k]);
          v.sizes.push_back(f), v.strides.push_back(a.strides[k + 1]);
          ++k;
        } else if (ext[j] > 1 && a.strides[k] != 0) {
          v.tdims.push_back(tdims[j]);
          v.sizes.push_back(ext[j]);
          v.strides.push_back(a.strides[k]);
        }
      }
      return true;
    }
  return false;
}

void FuncEmitter::access(const View& v, std::vector<std::string>& at, std::vector<int64_t>& tile, std::vector<int64_t>& dense,
                         int64_t only) {
  size_t vd = 0;  // view dim (the lead dim not counted)
  auto plus = [&](const std::string& x, int64_t c) {
    if (c == 0) return x;
    const std::string r = fresh("at");
    line(fmt::format("{} = arith.addi {}, {} : index", r, x, idx(c)));
    return r;
  };
  if (v.lead >= 0) at.push_back(idx(v.lead)), tile.push_back(1);
  for (size_t i = 0; i < v.tdims.size(); ++i) {
    const int d = v.tdims[i];
    const int64_t n = tile_ext_[static_cast<size_t>(d)];
    dense.push_back(n);
    if (static_cast<int>(vd) == v.split_at) {
      const int64_t f = v.split_f;
      const std::string hi = fresh("blk"), lo = fresh("in");
      const std::string start = only >= 0 ? plus(offset_[static_cast<size_t>(d)], only) : offset_[static_cast<size_t>(d)];
      line(fmt::format("{} = arith.divsi {}, {} : index", hi, start, idx(f)));
      line(fmt::format("{} = arith.remsi {}, {} : index", lo, start, idx(f)));
      at.push_back(plus(hi, v.coord.at(vd)));
      at.push_back(plus(lo, v.coord.at(vd + 1)));
      if (only >= 0) dense.back() = 1, tile.push_back(1), tile.push_back(1);
      else if (n <= f) tile.push_back(1), tile.push_back(n);
      else tile.push_back(n / f), tile.push_back(f);
      vd += 2;
    } else {
      at.push_back(plus(offset_[static_cast<size_t>(d)], v.coord.at(vd)));
      tile.push_back(n);
      vd += 1;
    }
  }
  if (v.tdims.empty()) at.push_back(idx(v.coord.at(0))), tile.push_back(1), dense.push_back(1);
}

// Loads the current tile of `v` and returns it as a tensor over the tile dims `compute` (dims the view
// lacks broadcast, extent-1 dims it has but `compute` lacks collapsed) in `compute_dtype`.
// The reassociation between the view's access tile (a lead dim, a split pair) and the dense tile of
// `rank` dims, as tensor.collapse_shape / expand_shape write it.
static std::string regroup(const View& v, size_t rank) {
  std::vector<std::string> gs;
  int64_t j = 0;  // access tile dim
  int nl = 0;     // view dim, the lead not counted
  for (size_t i = 0; i < rank; ++i) {
    std::vector<int64_t> g;
    if (i == 0 && v.lead >= 0) g.push_back(j++);
    if (nl == v.split_at) g.push_back(j++), g.push_back(j++), nl += 2;
    else g.push_back(j++), nl += 1;
    std::string t;
    for (size_t k = 0; k < g.size(); ++k) t += (k ? ", " : "") + std::to_string(g[k]);
    gs.push_back("[" + t + "]");
  }
  std::string r;
  for (size_t i = 0; i < gs.size(); ++i) r += (i ? ", " : "") + gs[i];
  return r;
}

// The split dim's position among v.tdims (per_row views).
static size_t split_tdim(const View& v) {
  size_t vd = 0;
  for (size_t i = 0; i < v.tdims.size(); ++i) {
    if (static_cast<int>(vd) == v.split_at) return i;
    vd += 1;
  }
  return v.tdims.size();
}

std::string FuncEmitter::load_access(const View& v, int64_t only, std::vector<int64_t>& tile) {
  std::vector<std::string> at;
  std::vector<int64_t> vtile;
  access(v, at, vtile, tile, only);
  const std::string at_ty = fmt::format("!ktdp.access_tile<{}xindex>", dims_x(vtile));
  const std::string acc = fresh("tile");
  line(fmt::format("{} = ktdp.construct_access_tile {}[{}] {{", acc, v.name, list(at)));
  line(fmt::format("  access_tile_set = {}, access_tile_order = {}", box_set(vtile), identity_map(vtile.size())));
  line(fmt::format("}} : {} -> {}", v.memref, at_ty));
  std::string x = fresh("ld");
  line(fmt::format("{} = ktdp.load {} : {} -> {}", x, acc, at_ty, tensor_ty(vtile, v.dtype)));
  if (vtile.size() != tile.size()) {  // the split dim's pair (and a lead dim) back into one dim
    const std::string c = fresh("ld");
    line(fmt::format("{} = tensor.collapse_shape {} [{}] : {} into {}", c, x, regroup(v, tile.size()), tensor_ty(vtile, v.dtype),
                     tensor_ty(tile, v.dtype)));
    x = c;
  }
  return x;
}

std::string FuncEmitter::load(const View& v, const std::vector<int>& compute, DType compute_dtype) {
  std::vector<int64_t> tile;
  std::string x;
  if (!v.per_row) {
    x = load_access(v, -1, tile);
  } else {
    // row by row into the whole tile
    for (int d : v.tdims) tile.push_back(tile_ext_[static_cast<size_t>(d)]);
    const size_t sd = split_tdim(v);
    x = fresh("rows");
    line(fmt::format("{} = tensor.empty() : {}", x, tensor_ty(tile, v.dtype)));
    for (int64_t j = 0; j < tile[sd]; ++j) {
      std::vector<int64_t> one;
      const std::string r = load_access(v, j, one);
      std::vector<std::string> off, sz, st;
      for (size_t i = 0; i < tile.size(); ++i)
        off.push_back(i == sd ? std::to_string(j) : "0"), sz.push_back(std::to_string(one[i])), st.push_back("1");
      const std::string y = fresh("rows");
      line(fmt::format("{} = tensor.insert_slice {} into {}[{}] [{}] [{}] : {} into {}", y, r, x, list(off), list(sz), list(st),
                       tensor_ty(one, v.dtype), tensor_ty(tile, v.dtype)));
      x = y;
    }
  }
  // keep the view dims that are compute dims
  std::vector<int64_t> kept;
  std::vector<int> kept_dims;
  std::vector<std::vector<int64_t>> groups;
  std::vector<int64_t> pending;
  for (size_t i = 0; i < v.tdims.size(); ++i) {
    pending.push_back(static_cast<int64_t>(i));
    const bool keep = std::find(compute.begin(), compute.end(), v.tdims[i]) != compute.end();
    if (!keep && tile[i] != 1)
      cannot(fmt::format("operand tile of '{}' varies along dim {} the computation does not index",
                         p_.globals[static_cast<size_t>(v.global)].name, t_.dims[static_cast<size_t>(v.tdims[i])].name));
    if (keep) groups.push_back(pending), pending.clear(), kept.push_back(tile[i]), kept_dims.push_back(v.tdims[i]);
  }
  const std::vector<int64_t> full = [&] {
    std::vector<int64_t> s;
    for (int d : compute) s.push_back(tile_ext_[static_cast<size_t>(d)]);
    return s;
  }();
  if (kept.empty()) {
    // a single element: extract it and splat it over the compute tile
    if (tile.size() > 1) {
      std::vector<std::string> all;
      for (size_t i = 0; i < tile.size(); ++i) all.push_back(std::to_string(i));
      const std::string c = fresh("one");
      line(fmt::format("{} = tensor.collapse_shape {} [[{}]] : {} into {}", c, x, list(all), tensor_ty(tile, v.dtype),
                       tensor_ty({1}, v.dtype)));
      x = c;
    }
    const std::string s = fresh("s");
    line(fmt::format("{} = tensor.extract {}[{}] : {}", s, x, idx(0), tensor_ty({1}, v.dtype)));
    std::string sc = s;
    if (v.dtype != compute_dtype) {
      sc = fresh("s");
      line(fmt::format("{} = arith.{} {} : {} to {}", sc, dtype_size(compute_dtype) > dtype_size(v.dtype) ? "extf" : "truncf", s,
                       elem_type(v.dtype), elem_type(compute_dtype)));
    }
    const std::string r = fresh("splat");
    line(fmt::format("{} = tensor.splat {} : {}", r, sc, tensor_ty(full, compute_dtype)));
    return r;
  }
  if (!pending.empty()) groups.back().insert(groups.back().end(), pending.begin(), pending.end());
  if (kept.size() != tile.size()) {
    std::vector<std::string> gs;
    for (const auto& g : groups) gs.push_back("[" + list(g) + "]");
    const std::string c = fresh("ld");
    line(fmt::format("{} = tensor.collapse_shape {} [{}] : {} into {}", c, x, list(gs), tensor_ty(tile, v.dtype),
                     tensor_ty(kept, v.dtype)));
    x = c;
  }
  if (v.dtype != compute_dtype) {
    if (!is_fp(v.dtype) || !is_fp(compute_dtype)) cannot("integer operands stored in another type");
    const std::string c = fresh("cv");
    line(fmt::format("{} = arith.{} {} : {} to {}", c, dtype_size(compute_dtype) > dtype_size(v.dtype) ? "extf" : "truncf", x,
                     tensor_ty(kept, v.dtype), tensor_ty(kept, compute_dtype)));
    x = c;
  }
  if (kept.size() != full.size()) {
    std::vector<int64_t> added;
    for (size_t i = 0; i < compute.size(); ++i)
      if (std::find(kept_dims.begin(), kept_dims.end(), compute[i]) == kept_dims.end()) added.push_back(static_cast<int64_t>(i));
    const std::string e = fresh("empty"), b = fresh("bc");
    line(fmt::format("{} = tensor.empty() : {}", e, tensor_ty(full, compute_dtype)));
    line(fmt::format("{} = linalg.broadcast ins({} : {}) outs({} : {}) dimensions = [{}]", b, x, tensor_ty(kept, compute_dtype), e,
                     tensor_ty(full, compute_dtype), list(added)));
    x = b;
  }
  return x;
}

// Stores `value` (a tensor over compute_ in value_dtype) into the current tile of `v`.
void FuncEmitter::store(const View& v, const std::string& value, DType value_dtype, bool row) {
  v.stored = true;
  std::vector<int64_t> full = shape(row);
  std::vector<int64_t> tile;
  if (v.tdims.empty()) cannot("a store of a single element over the whole tile");
  for (int d : v.tdims) tile.push_back(tile_ext_[static_cast<size_t>(d)]);
  std::vector<int> cdims = compute_;
  if (row) cdims.pop_back();
  for (int d : cdims)
    if (std::find(v.tdims.begin(), v.tdims.end(), d) == v.tdims.end() && tile_ext_[static_cast<size_t>(d)] > 1)
      cannot(fmt::format("a store that does not index dim {}", t_.dims[static_cast<size_t>(d)].name));
  std::string x = value;
  if (value_dtype != v.dtype) {
    if (!is_fp(v.dtype) || !is_fp(value_dtype)) cannot("integer results stored in another type");
    const std::string c = fresh("cv");
    line(fmt::format("{} = arith.{} {} : {} to {}", c, dtype_size(v.dtype) < dtype_size(value_dtype) ? "truncf" : "extf", x,
                     tensor_ty(full, value_dtype), tensor_ty(full, v.dtype)));
    x = c;
  }
  // reshape the compute tensor to the view's tile (extent-1 dims added or dropped)
  std::vector<int64_t> nz_full, nz_tile;
  for (int64_t e : full)
    if (e != 1) nz_full.push_back(e);
  for (int64_t e : tile)
    if (e != 1) nz_tile.push_back(e);
  if (nz_full != nz_tile) cannot("a store whose tile is not the compute tile");
  if (full != tile) {
    const std::string c = fresh("st");
    const std::string all = [&] {
      std::vector<std::string> a;
      for (size_t i = 0; i < full.size(); ++i) a.push_back(std::to_string(i));
      return list(a);
    }();
    const std::string all_t = [&] {
      std::vector<std::string> a;
      for (size_t i = 0; i < tile.size(); ++i) a.push_back(std::to_string(i));
      return list(a);
    }();
    // through one flat dim: collapse, then expand
    const int64_t n = [&] {
      int64_t r = 1;
      for (int64_t e : full) r *= e;
      return r;
    }();
    std::string flat = x;
    if (full.size() != 1) {
      flat = fresh("st");
      line(fmt::format("{} = tensor.collapse_shape {} [[{}]] : {} into {}", flat, x, all, tensor_ty(full, v.dtype),
                       tensor_ty({n}, v.dtype)));
    }
    if (tile.size() != 1)
      line(fmt::format("{} = tensor.expand_shape {} [[{}]] output_shape [{}] : {} into {}", c, flat, all_t, list(tile),
                       tensor_ty({n}, v.dtype), tensor_ty(tile, v.dtype)));
    else
      line(fmt::format("{} = tensor.collapse_shape {} [] : {} into {}", c, flat, tensor_ty({n}, v.dtype), tensor_ty(tile, v.dtype)));
    x = tile.size() != 1 ? c : flat;
  }
  if (!v.per_row) return store_access(v, x, -1);
  const size_t sd = split_tdim(v);
  for (int64_t j = 0; j < tile[sd]; ++j) {  // row by row out of the whole tile
    std::vector<int64_t> one = tile;
    one[sd] = 1;
    std::vector<std::string> off, sz, st;
    for (size_t i = 0; i < tile.size(); ++i)
      off.push_back(i == sd ? std::to_string(j) : "0"), sz.push_back(std::to_string(one[i])), st.push_back("1");
    const std::string r = fresh("row");
    line(fmt::format("{} = tensor.extract_slice {}[{}] [{}] [{}] : {} to {}", r, x, list(off), list(sz), list(st),
                     tensor_ty(tile, v.dtype), tensor_ty(one, v.dtype)));
    store_access(v, r, j);
  }
}

void FuncEmitter::store_access(const View& v, std::string x, int64_t only) {
  std::vector<std::string> at;
  std::vector<int64_t> vtile, tile;
  access(v, at, vtile, tile, only);
  if (vtile.size() != tile.size()) {  // the split dim as its pair (and a lead dim)
    const std::string c = fresh("st");
    line(fmt::format("{} = tensor.expand_shape {} [{}] output_shape [{}] : {} into {}", c, x, regroup(v, tile.size()), list(vtile),
                     tensor_ty(tile, v.dtype), tensor_ty(vtile, v.dtype)));
    x = c;
  }
  const std::string at_ty = fmt::format("!ktdp.access_tile<{}xindex>", dims_x(vtile));
  const std::string acc = fresh("tile");
  line(fmt::format("{} = ktdp.construct_access_tile {}[{}] {{", acc, v.name, list(at)));
  line(fmt::format("  access_tile_set = {}, access_tile_order = {}", box_set(vtile), identity_map(vtile.size())));
  line(fmt::format("}} : {} -> {}", v.memref, at_ty));
  line(fmt::format("ktdp.store {}, {} : {}, {}", x, acc, tensor_ty(vtile, v.dtype), at_ty));
}

std::string FuncEmitter::broadcast_row(const std::string& row, DType t) {
  const std::string e = fresh("empty"), b = fresh("bc");
  line(fmt::format("{} = tensor.empty() : {}", e, tensor_ty(shape(false), t)));
  line(fmt::format("{} = linalg.broadcast ins({} : {}) outs({} : {}) dimensions = [{}]", b, row, tensor_ty(shape(true), t), e,
                   tensor_ty(shape(false), t), compute_.size() - 1));
  return b;
}

std::string FuncEmitter::constant(double v, DType t, bool row) {
  const std::string n = fresh("cst");
  line(fmt::format("{} = arith.constant dense<{}> : {}", n, literal(v, t), tensor_ty(shape(row), t)));
  return n;
}

// The SSA tensor of instruction `id` at element shape (row = false) or row shape (row = true).
std::string FuncEmitter::value(int id, bool row) {
  if (id < 0 || id >= static_cast<int>(k_.body.size()))
    throw Error(Location{.node = t_.node, .pass = "ktir"}, fmt::format("kernel {}: instruction %{} out of range", k_.name, id));
  auto key = std::make_pair(id, row ? 1 : 0);
  auto it = vals_.find(key);
  if (it != vals_.end()) return it->second;
  const KInstr& in = k_.body[static_cast<size_t>(id)];
  const DType t = in.dtype;
  std::string r;
  const bool is_reduce = in.is(CoreOp::reduce);
  const bool is_row_value = in.row || is_reduce;
  if (in.is(KInstrKind::constant)) {
    r = constant(in.value, t, row);
  } else if (!row && is_row_value) {
    if (compute_.size() < 2) cannot("a row value in a kernel without rows");
    r = broadcast_row(value(id, true), t);
  } else if (row && !is_row_value) {
    cannot(fmt::format("element value %{} used as a row value", id));
  } else if (in.is(KInstrKind::load)) {
    const KAccess& acc = k_.accesses.at(static_cast<size_t>(in.access));
    if (row) {
      // a row value read from memory (a reduction's result stored by an earlier kernel): the view indexes
      // the target dims but the last compute dim, at its start
      if (compute_.size() < 2) cannot("a row load in a kernel without rows");
      auto lit = loaded_.find(-1 - in.access);
      if (lit != loaded_.end()) {
        r = lit->second;
      } else {
        std::vector<int> dims = target_, cdims = compute_;
        const size_t drop = static_cast<size_t>(std::find(dims.begin(), dims.end(), compute_.back()) - dims.begin());
        if (drop < dims.size()) dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(drop));
        cdims.pop_back();
        const std::function<int64_t(const std::vector<int64_t>&)> f = [&](const std::vector<int64_t>& x) {
          std::vector<int64_t> full = x;
          if (drop < target_.size()) full.insert(full.begin() + static_cast<std::ptrdiff_t>(drop), 0);
          return access_at(k_, acc, linear_of_(full));
        };
        const View& v = view(global_of_arg(acc.arg), dims, f, fmt::format("row access #{} of {}", in.access, k_.name));
        r = loaded_[-1 - in.access] = load(v, cdims, t);
      }
    } else if (!acc_.empty() && acc.arg == (k_.kind == KernelKind::conv ? k_.conv.y : k_.mm.c)) {
      const KAccess& ca = k_.accesses.at(static_cast<size_t>(c_access_));
      if (acc.offset != ca.offset || acc.strides != ca.strides) cannot("the epilogue reads the product through another map than it stores it");
      r = acc_;
      if (t != DType::f32) cannot("a product read as a non-f32 value");
    } else {
      auto lit = loaded_.find(in.access);
      if (lit != loaded_.end()) {
        r = lit->second;
      } else {
        const int g = global_of_arg(acc.arg);
        const View& v = *[&] {
          const std::function<int64_t(const std::vector<int64_t>&)> f = [&](const std::vector<int64_t>& x) {
            return access_at(k_, acc, linear_of_(x));
          };
          return &view(g, target_, f, fmt::format("access #{} of {}", in.access, k_.name));
        }();
        r = loaded_[in.access] = load(v, compute_, t);
      }
    }
  } else if (is_reduce) {
    // The kind's combining primitive and identity come from the core-op table.
    const auto combiner = reduction_combiner(in.attr);
    if (!combiner || !is_fp(t)) cannot(fmt::format("reduce.{} on {}", in.attr, dtype_name(t)));
    const CoreOpInfo& c = core_op_info(*combiner);
    const std::string x = value(in.args.at(0), false);
    const std::string init = constant(c.identity, t, true);
    r = fresh("red");
    line(fmt::format("{} = {} {{ {} }} ins({} : {}) outs({} : {}) dimensions = [{}]", r, core_op_info(CoreOp::reduce).ktir_f,
                     c.ktir_f, x, tensor_ty(shape(false), t), init, tensor_ty(shape(true), t), compute_.size() - 1));
  } else {
    const std::string ty = tensor_ty(shape(row), t);
    std::vector<std::string> a;
    for (int x : in.args) a.push_back(value(x, row));
    auto arg_dtype = [&](size_t i) { return k_.body.at(static_cast<size_t>(in.args.at(i))).dtype; };
    const bool fl = is_fp(t);
    r = fresh("v");
    const std::string_view op = in.name();
    const CoreOpInfo* p = in.is(KInstrKind::core) ? &core_op_info(in.core) : nullptr;
    // The table's spelling for the operand class: float, bool or another integer (core_ops.def).
    auto spelling = [&](DType d) { return std::string(is_fp(d) ? p->ktir_f : d == DType::boolean ? p->ktir_b : p->ktir_i); };
    if (p && p->kind == CoreKind::unary) {
      const std::string name = spelling(t);
      if (fl && !name.empty()) {
        line(fmt::format("{} = {} {} : {}", r, name, a.at(0), ty));
      } else if (!fl && t != DType::boolean && !name.empty()) {  // an integer unary is a subtraction from zero (neg)
        const std::string z = constant(0, t, row);
        line(fmt::format("{} = {} {}, {} : {}", r, name, z, a.at(0), ty));
      } else {
        cannot(fmt::format("{} on {}", op, dtype_name(t)));
      }
    } else if (p && p->kind == CoreKind::binary) {
      const std::string name = spelling(t);
      if (name.empty()) cannot(fmt::format("{} on {}", op, dtype_name(t)));
      line(fmt::format("{} = {} {}, {} : {}", r, name, a.at(0), a.at(1), ty));
    } else if (p && p->kind == CoreKind::compare) {
      const DType at = arg_dtype(0);
      const std::string aty = tensor_ty(shape(row), at);
      static const std::map<std::string, std::string> fp = {{"eq", "oeq"}, {"ne", "une"}, {"lt", "olt"},
                                                            {"le", "ole"}, {"gt", "ogt"}, {"ge", "oge"}};
      static const std::map<std::string, std::string> ip = {{"eq", "eq"},   {"ne", "ne"},   {"lt", "slt"},
                                                            {"le", "sle"}, {"gt", "sgt"}, {"ge", "sge"}};
      const auto& tbl = is_fp(at) ? fp : ip;
      auto cit = tbl.find(in.attr);
      if (cit == tbl.end()) cannot(fmt::format("compare direction '{}'", in.attr));
      line(fmt::format("{} = {} {}, {}, {} : {}", r, spelling(at), cit->second, a.at(0), a.at(1), aty));
    } else if (p && p->kind == CoreKind::select) {
      line(fmt::format("{} = {} {}, {}, {} : {}, {}", r, spelling(t), a.at(0), a.at(1), a.at(2), tensor_ty(shape(row), DType::boolean), ty));
    } else if (p && p->kind == CoreKind::convert) {  // the cast family, chosen by the two dtypes
      const DType from = arg_dtype(0);
      const std::string fty = tensor_ty(shape(row), from);
      if (from == t) {
        r = a.at(0);
      } else if (is_fp(from) && is_fp(t)) {
        line(fmt::format("{} = arith.{} {} : {} to {}", r, dtype_size(t) > dtype_size(from) ? "extf" : "truncf", a.at(0), fty, ty));
      } else if (t == DType::boolean) {
        const std::string z = constant(0, from, row);
        line(fmt::format("{} = arith.{} {}, {}, {} : {}", r, is_fp(from) ? "cmpf" : "cmpi", is_fp(from) ? "une" : "ne", a.at(0), z, fty));
      } else if (is_fp(t)) {
        line(fmt::format("{} = arith.{} {} : {} to {}", r, from == DType::boolean ? "uitofp" : "sitofp", a.at(0), fty, ty));
      } else if (is_fp(from)) {
        line(fmt::format("{} = arith.fptosi {} : {} to {}", r, a.at(0), fty, ty));
      } else {
        const char* o = from == DType::boolean ? "extui" : dtype_size(t) > dtype_size(from) ? "extsi" : "trunci";
        line(fmt::format("{} = arith.{} {} : {} to {}", r, o, a.at(0), fty, ty));
      }
    } else {
      cannot(fmt::format("no KTIR form for '{}' ({})", op, dtype_name(t)));
    }
  }
  vals_[key] = r;
  return r;
}

}  // namespace detail
}  // namespace tessel::ktir

namespace tessel::ktir {
namespace detail {

std::string FuncEmitter::zero_accumulator(const std::string& acc_ty, std::string* zero) {
  const std::string z = fresh("zero"), e = fresh("empty"), a0 = fresh("acc");
  if (zero) *zero = z;
  line(fmt::format("{} = arith.constant 0.000000000e+00 : f32", z));
  line(fmt::format("{} = tensor.empty() : {}", e, acc_ty));
  line(fmt::format("{} = linalg.fill ins({} : f32) outs({} : {}) -> {}", a0, z, e, acc_ty, acc_ty));
  return a0;
}

std::string FuncEmitter::accumulate_tiles(size_t k, int64_t size, int64_t tile, const std::string& acc0,
                                          const std::string& acc_ty, const std::string& iv_prefix,
                                          const std::function<std::string(const std::string&)>& product) {
  const int64_t full = size / tile, tail = size % tile;
  std::string acc = acc0;
  tile_ext_[k] = tile;
  if (full == 1) {
    offset_[k] = lo_[k];
    acc = product(acc);
  } else if (full > 1) {
    const std::string res = fresh("acc"), iv = fresh(iv_prefix), it = fresh("acc_in");
    line(fmt::format("{} = scf.for {} = {} to {} step {} iter_args({} = {}) -> ({}) {{", res, iv, lo_[k], idx(full * tile),
                     idx(tile), it, acc, acc_ty));
    ++depth_;
    offset_[k] = iv;
    line(fmt::format("scf.yield {} : {}", product(it), acc_ty));
    --depth_;
    line("}");
    acc = res;
  }
  if (tail > 0) {
    tile_ext_[k] = tail;
    offset_[k] = idx(full * tile);
    acc = product(acc);
    tile_ext_[k] = tile;
  }
  return acc;
}

void FuncEmitter::nest(const std::vector<int>& dims, size_t i, const std::function<void()>& body) {
  if (i == dims.size()) {
    // a new region: values of another tile's body are not visible here
    vals_.clear();
    loaded_.clear();
    body();
    return;
  }
  const size_t d = static_cast<size_t>(dims[i]);
  const Dim& dm = t_.dims[d];
  if (dm.split == 1) return extent_tiles(dims, i, dm.size, body);
  // cores [0, q) hold a whole slice, core q the rest (if any), cores past it nothing
  const int64_t q = std::min(dm.split, dm.size / dm.slice), rest = dm.size - q * dm.slice;
  if (q == dm.split) return extent_tiles(dims, i, dm.slice, body);
  auto guarded = [&](const char* pred, int64_t core, int64_t extent) {
    const std::string c = fresh("on_" + dm.name);
    line(fmt::format("{} = arith.cmpi {}, %tid_{}, {} : index", c, pred, dm.name, idx(core)));
    line(fmt::format("scf.if {} {{", c));
    ++depth_;
    extent_tiles(dims, i, extent, body);
    --depth_;
    line("}");
  };
  if (q > 0) guarded("slt", q, dm.slice);
  if (rest > 0) guarded("eq", q, rest);
}

void FuncEmitter::extent_tiles(const std::vector<int>& dims, size_t i, int64_t extent, const std::function<void()>& body) {
  const size_t d = static_cast<size_t>(dims[i]);
  const Dim& dm = t_.dims[d];
  const int64_t T = dm.tile, full = extent / T, tail = extent % T;
  const std::string& lo = lo_[d];
  auto start = [&](int64_t off) {
    if (off == 0) return lo;
    if (dm.split == 1) return idx(off);
    const std::string r = fresh("s_" + dm.name);
    line(fmt::format("{} = arith.addi {}, {} : index", r, lo, idx(off)));
    return r;
  };
  tile_ext_[d] = T;
  if (full == 1) {
    offset_[d] = lo;
    nest(dims, i + 1, body);
  } else if (full > 1) {
    const std::string hi = start(full * T), iv = fresh("i" + dm.name);
    line(fmt::format("scf.for {} = {} to {} step {} {{", iv, lo, hi, idx(T)));
    ++depth_;
    offset_[d] = iv;
    nest(dims, i + 1, body);
    line("scf.yield");
    --depth_;
    line("}");
  }
  if (tail > 0) {
    tile_ext_[d] = tail;
    offset_[d] = start(full * T);
    nest(dims, i + 1, body);
    tile_ext_[d] = T;
  }
}

void FuncEmitter::emit_body_stores() {
  for (size_t i = 0; i < k_.body.size(); ++i) {
    const KInstr& in = k_.body[i];
    if (!in.is(KInstrKind::store)) continue;
    const KAccess& acc = k_.accesses.at(static_cast<size_t>(in.access));
    const int g = global_of_arg(acc.arg);
    // a row store (a reduction's result) indexes the target dims but the last compute dim, at its start
    std::vector<int> dims = target_;
    size_t drop = dims.size();
    if (in.row) {
      if (compute_.size() < 2) cannot("a row store in a kernel without rows");
      drop = static_cast<size_t>(std::find(dims.begin(), dims.end(), compute_.back()) - dims.begin());
      if (drop < dims.size()) dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(drop));
    }
    const std::function<int64_t(const std::vector<int64_t>&)> f = [&](const std::vector<int64_t>& x) {
      std::vector<int64_t> full = x;
      if (drop < target_.size()) full.insert(full.begin() + static_cast<std::ptrdiff_t>(drop), 0);
      return access_at(k_, acc, linear_of_(full));
    };
    const View& v = view(g, dims, f, fmt::format("access #{} of {}", in.access, k_.name));
    const std::string x = value(in.args.at(0), in.row);
    store(v, x, k_.body.at(static_cast<size_t>(in.args.at(0))).dtype, in.row);
  }
}

std::string FuncEmitter::emit_vector() {
  const int p = dim_index("p"), e = dim_index("e");
  const Dim& dp = t_.dims[static_cast<size_t>(p)];
  const Dim& de = t_.dims[static_cast<size_t>(e)];
  if (de.split != 1 || de.tile != de.size) cannot("the e dim is split or tiled");
  const int64_t P = dp.size, E = de.size;
  if (k_.outer_count() * k_.inner_count() != P * E)
    throw Error(Location{.node = t_.node, .pass = "ktir"},
                fmt::format("tile kernel {}: p {} x e {} is not kernel {}'s loop space", t_.name, P, E, k_.name));
  const bool inner = k_.splits_inner();
  target_ = {p, e};
  compute_ = {p, e};
  linear_of_ = [=](const std::vector<int64_t>& x) { return inner ? x[1] * P + x[0] : x[0] * E + x[1]; };
  if (inner && E > 1) cannot("a pointwise kernel split along its innermost dim with more than one element per point");
  nest(t_.order, 0, [&] { emit_body_stores(); });
  return "vector";
}

// A re-layout copy: the matmul operand it feeds, read through that matmul's strides ([batch, rows,
// cols] with a non-unit innermost stride), written dense. Within one matrix the source is affine over
// (p, e); across matrices it is not, so then the source is a 3-D view (matrix, row, col) and every
// tile must lie within one matrix or cover whole ones.
std::string FuncEmitter::emit_relayout() {
  const int p = dim_index("p"), e = dim_index("e");
  const Dim& dp = t_.dims[static_cast<size_t>(p)];
  const Dim& de = t_.dims[static_cast<size_t>(e)];
  if (de.split != 1 || de.tile != de.size) cannot("the e dim is split or tiled");
  int gin = -1, gout = -1;
  for (const Operand& op : t_.operands) (op.out ? gout : gin) = op.global;
  std::string role;
  for (const TileKernel& c : p_.kernels)
    for (const Operand& op : c.operands)
      if (c.kind == TileKind::matmul && op.global == gout) role = op.role;
  if (gin < 0 || gout < 0 || (role != "a" && role != "b"))
    throw Error(Location{.node = t_.node, .pass = "ktir"}, fmt::format("re-layout copy {} feeds no matmul operand", t_.name));
  const MatmulSpec& mm = k_.mm;
  const bool a = role == "a";
  const int64_t batch = mm.batch, rows = a ? mm.m : mm.k, cols = a ? mm.k : mm.n;
  const int64_t off = a ? mm.a_offset : mm.b_offset, sb = a ? mm.a_batch : mm.b_batch, sr = a ? mm.a_m : mm.b_k,
                se = a ? mm.a_k : mm.b_n;
  if (dp.size != batch * rows || de.size != cols)
    throw Error(Location{.node = t_.node, .pass = "ktir"},
                fmt::format("re-layout copy {}: p {} x e {} is not the operand's {}x{}x{}", t_.name, dp.size, de.size, batch, rows, cols));
  const DType dt = p_.globals[static_cast<size_t>(gout)].dtype;
  if (p_.globals[static_cast<size_t>(gin)].dtype != dt) cannot("a re-layout copy between device dtypes");
  target_ = {p, e};
  compute_ = {p, e};
  linear_of_ = [=](const std::vector<int64_t>& x) { return x[0] * cols + x[1]; };
  const View& dst = view(gout, {p, e}, linear_of_, "the dense copy");
  auto src_at = [=](int64_t bi, int64_t r, int64_t c) { return off + sb * bi + sr * r + se * c; };
  if (batch == 1 || sb == rows * sr) {
    const View& src = view(gin, {p, e}, [&](const std::vector<int64_t>& x) { return src_at(x[0] / rows, x[0] % rows, x[1]); },
                           fmt::format("matmul {} as it reads it", role));
    nest(t_.order, 0, [&] { store(dst, load(src, compute_, dt), dt); });
    return "relayout";
  }
  // every tile (core c's slice from c·slice, tiles of `tile`, the last partial) within one matrix or whole ones
  for (int64_t c = 0; c < dp.split; ++c) {
    const int64_t lo = c * dp.slice, hi = std::min(dp.size, lo + dp.slice);
    for (int64_t t0 = lo; t0 < hi; t0 += dp.tile) {
      const int64_t n = std::min(dp.tile, hi - t0);
      if (!(t0 % rows + n <= rows || (t0 % rows == 0 && n % rows == 0)))
        cannot(fmt::format("a tile of rows [{}, {}) crosses a matrix boundary (matrices of {} rows)", t0, t0 + n, rows));
    }
  }
  const Global& g = p_.globals.at(static_cast<size_t>(gin));
  const Layout lay(g);
  const std::string what = fmt::format("matmul {} as it reads it, per matrix", role);
  const Affine af = fit({batch, rows, cols}, [&](const std::vector<int64_t>& x) { return lay.at(src_at(x[0], x[1], x[2])); }, what);
  View v;
  v.global = gin;
  v.what = what;
  v.base = af.base;
  v.dtype = dt;
  v.sizes = {batch, rows, cols};
  v.strides = af.strides;
  if (!base_coordinates(v) || v.lead >= 0) cannot(fmt::format("{}: base offset {} is no sum of its strides", what, v.base));
  v.memref = fmt::format("memref<{}x{}>", dims_x(v.sizes), elem_type(dt));
  v.name = fresh("view");
  views_ << fmt::format("    // {}: {} over [matrix, row, col]{}\n", v.name, mlir_comment_text(what),
                        v.base ? fmt::format(", from element {} (coordinates [{}])", v.base, list(v.coord)) : "");
  views_ << fmt::format("    {} = ktdp.construct_memory_view {}, sizes: [{}], strides: [{}] {{\n", v.name, arg_of_global_.at(gin),
                        list(v.sizes), list(v.strides));
  views_ << fmt::format("      coordinate_set = {}, memory_space = #ktdp.spyre_memory_space<HBM>\n", box_set(v.sizes));
  views_ << fmt::format("    }} : {}\n", v.memref);
  views_list_.push_back(v);
  const View& src = views_list_.back();
  nest(t_.order, 0, [&] {
    const int64_t n = tile_ext_[static_cast<size_t>(p)];
    const std::string& p0 = offset_[static_cast<size_t>(p)];
    const std::string bi = fresh("mat"), r0 = fresh("row");
    line(fmt::format("{} = arith.divsi {}, {} : index", bi, p0, idx(rows)));
    line(fmt::format("{} = arith.remsi {}, {} : index", r0, p0, idx(rows)));
    const std::vector<int64_t> tile = n <= rows ? std::vector<int64_t>{1, n, cols} : std::vector<int64_t>{n / rows, rows, cols};
    std::vector<std::string> at = {bi, r0, idx(0)};
    for (size_t i = 0; i < 3; ++i)
      if (src.coord[i] != 0) {
        const std::string r = fresh("at");
        line(fmt::format("{} = arith.addi {}, {} : index", r, at[i], idx(src.coord[i])));
        at[i] = r;
      }
    const std::string at_ty = fmt::format("!ktdp.access_tile<{}xindex>", dims_x(tile));
    const std::string acc = fresh("tile"), x = fresh("ld"), c = fresh("ld");
    line(fmt::format("{} = ktdp.construct_access_tile {}[{}] {{", acc, src.name, list(at)));
    line(fmt::format("  access_tile_set = {}, access_tile_order = {}", box_set(tile), identity_map(3)));
    line(fmt::format("}} : {} -> {}", src.memref, at_ty));
    line(fmt::format("{} = ktdp.load {} : {} -> {}", x, acc, at_ty, tensor_ty(tile, dt)));
    line(fmt::format("{} = tensor.collapse_shape {} [[0, 1], [2]] : {} into {}", c, x, tensor_ty(tile, dt), tensor_ty({n, cols}, dt)));
    store(dst, c, dt);
  });
  return "relayout";
}

// The epilogue's loop space of a convolution (linear_of_, c_access_): the store of y inverted (its offsets are
// y's dense physical layout); without an epilogue, y's physical order itself.
void FuncEmitter::conv_epilogue_map() {
  const ConvSpec& c = k_.conv;
  const int64_t S = c.oh * c.ow, OC = c.oc;
  // by value: linear_of_ outlives this call
  const bool nhwc = c.y_nhwc;
  auto phys_y = [nhwc, S, OC](int64_t b, int64_t o, int64_t p) { return nhwc ? (b * S + p) * OC + o : (b * OC + o) * S + p; };
  if (!k_.body.empty()) {
    int ya = -1;
    for (const KInstr& in : k_.body)
      if (in.is(KInstrKind::store) && k_.accesses.at(static_cast<size_t>(in.access)).arg == c.y) ya = in.access;
    if (ya < 0) cannot("an epilogue that does not store the convolution's result");
    c_access_ = ya;
    const KAccess& acc = k_.accesses[static_cast<size_t>(ya)];
    std::vector<int64_t> ext = require_static(k_.outer);
    for (const tessel::Dim& d : k_.inner) ext.push_back(d);
    std::vector<size_t> by(ext.size());
    for (size_t i = 0; i < by.size(); ++i) by[i] = i;
    std::stable_sort(by.begin(), by.end(), [&](size_t a, size_t b) { return acc.strides[a] > acc.strides[b]; });
    linear_of_ = [=](const std::vector<int64_t>& x) {
      int64_t rest = phys_y(x[0], x[2], x[1]) - acc.offset, lin = 0;
      std::vector<int64_t> idx(ext.size(), 0);
      for (size_t d : by)
        if (acc.strides[d] > 0) idx[d] = rest / acc.strides[d], rest -= idx[d] * acc.strides[d];
      for (size_t d = 0; d < ext.size(); ++d) lin = lin * ext[d] + idx[d];
      return lin;
    };
    // the inverse must be one: every output element found again
    for (int64_t b = 0; b < c.n; ++b)
      for (int64_t p : {int64_t{0}, S - 1})
        for (int64_t o : {int64_t{0}, OC - 1})
          if (access_at(k_, acc, linear_of_({b, p, o})) != phys_y(b, o, p)) cannot("an epilogue whose loop space is not the result's");
  } else {
    linear_of_ = [=](const std::vector<int64_t>& x) { return phys_y(x[0], x[2], x[1]); };
  }
}

// A convolution of one group without padding or dilation: per tap of the window, the matmul of x's pixels
// [s, c] (the im2col of one tap is affine over (n, s split into rows and columns, c): a strided view) by
// the weights [c, oc], accumulated over r = c in f32, then the epilogue. Operand views go by logical index
// through each global's declaration (NHWC activations, [C, KH, KW, OC] weights).
std::string FuncEmitter::emit_conv() {
  const ConvSpec& c = k_.conv;
  // padding, groups or dilation (a border no view can state): the input rows loaded once per tile and
  // each tap's im2col sliced out of them in the scratchpad (ktir_conv.cpp)
  if (c.pad_top || c.pad_left || c.pad_bottom || c.pad_right || c.dil_h != 1 || c.dil_w != 1 || c.groups != 1 || c.kh * c.kw > 64)
    return emit_conv_window();
  const int64_t window = c.kh * c.kw;
  const int n = dim_index("n"), oc = dim_index("oc"), sd = dim_index("s"), r = dim_index("r");
  const Dim& dr = t_.dims[static_cast<size_t>(r)];
  if (dr.split > 1) cannot(fmt::format("the reduction is split over {} cores", dr.split));
  if (t_.dims[static_cast<size_t>(n)].tile != 1) cannot("batch tiles of more than one image");
  if (t_.order.empty() || t_.order.back() != r) cannot("a loop order without r innermost");
  const int gx = global_of_arg(c.x), gw = global_of_arg(c.w), gy = global_of_arg(c.y);
  const int64_t S = c.oh * c.ow, C = c.c, OC = c.oc;
  if (dr.size != C * window || dr.tile % window != 0) cannot("reduction tiles that are not whole input channels");
  // per tap (kh, kw): x over (n, s, channel), w over (channel, oc), by logical index
  const std::vector<int64_t> xext = {t_.dims[static_cast<size_t>(n)].size, S, C}, wext = {C, OC};
  std::vector<const View*> vxs, vws;
  for (int64_t kh = 0; kh < c.kh; ++kh)
    for (int64_t kw = 0; kw < c.kw; ++kw) {
      const std::string tap = window > 1 ? fmt::format(", tap ({}, {})", kh, kw) : "";
      vxs.push_back(&view(gx, {n, sd, r}, [&](const std::vector<int64_t>& x) {
        const int64_t oh = x[1] / c.ow, ow = x[1] % c.ow;
        return ((x[0] * C + x[2]) * c.h + oh * c.stride_h + kh) * c.wd + ow * c.stride_w + kw;
      }, "conv x" + tap, true, &xext));
      vws.push_back(&view(gw, {r, oc}, [&](const std::vector<int64_t>& x) { return (x[1] * C + x[0]) * window + kh * c.kw + kw; },
                          "conv w" + tap, true, &wext));
    }
  conv_epilogue_map();
  target_ = {n, sd, oc};
  compute_ = {sd, oc};
  const DType dtx = p_.globals[static_cast<size_t>(gx)].dtype, dtw = p_.globals[static_cast<size_t>(gw)].dtype;
  const size_t ks = static_cast<size_t>(sd), ko = static_cast<size_t>(oc), kr = static_cast<size_t>(r);
  const std::vector<int> outer(t_.order.begin(), t_.order.end() - 1);
  nest(outer, 0, [&] {
    const int64_t ts = tile_ext_[ks], to = tile_ext_[ko];
    const std::string acc_ty = tensor_ty({ts, to}, DType::f32);
    const std::string a0 = zero_accumulator(acc_ty);
    auto product = [&](const std::string& into) {
      // the r tile as whole channels: its channel offset and count stand in for r while the taps load
      const std::string r_off = offset_[kr];
      const int64_t r_ext = tile_ext_[kr], tc = r_ext / window;
      std::string ch = r_off;
      if (window > 1) {
        ch = fresh("ch");
        line(fmt::format("{} = arith.divsi {}, {} : index", ch, r_off, idx(window)));
      }
      offset_[kr] = ch;
      tile_ext_[kr] = tc;
      std::string res = into;
      for (size_t tap = 0; tap < vxs.size(); ++tap) {
        const std::string at = load(*vxs[tap], {sd, r}, dtx), bt = load(*vws[tap], {r, oc}, dtw);
        const std::string m = fresh("mm");
        line(fmt::format("{} = linalg.matmul ins({}, {} : {}, {}) outs({} : {}) -> {}", m, at, bt, tensor_ty({ts, tc}, dtx),
                         tensor_ty({tc, to}, dtw), res, acc_ty, acc_ty));
        res = m;
      }
      offset_[kr] = r_off;
      tile_ext_[kr] = r_ext;
      return res;
    };
    acc_ = accumulate_tiles(kr, dr.size, dr.tile, a0, acc_ty, "ir", product);
    vals_.clear();
    loaded_.clear();
    if (k_.body.empty()) {
      const View& vy = view(gy, target_, [&](const std::vector<int64_t>& x) { return (x[0] * OC + x[2]) * S + x[1]; }, "conv y", true);
      store(vy, acc_, DType::f32);
    } else {
      emit_body_stores();
    }
  });
  return "conv";
}

// One core's slice of a split k, accumulated into `acc`: the cores' extents differ when the split is uneven
// (cores [0, q) hold a whole slice, core q the rest, cores past it nothing) and a slice may end in a partial
// tile, while every core of a K group must reach the cross-core sum. So the whole tiles run in one loop whose
// bound follows the core's coordinate (arith.select), and each partial tile, of its own static extent, in
// a loop of one trip on the cores that have it and none on the others (ktir-cpu 9e03d63 returns no values
// from scf.if).
std::string FuncEmitter::ksplit_slice(const std::string& acc0, const std::string& acc_ty,
                                      const std::function<std::string(const std::string&)>& product) {
  const size_t kk = static_cast<size_t>(dim_index("k"));
  const Dim& dk = t_.dims[kk];
  const int64_t T = dk.tile, q = std::min(dk.split, dk.size / dk.slice), rest = dk.size - q * dk.slice;
  // per core class: its condition on %tid_k (empty: every core), whole tiles and partial tile
  struct Part {
    std::string pred;
    int64_t core, whole, tail;
  };
  std::vector<Part> parts;
  if (q == dk.split) parts.push_back({"", 0, dk.slice / T * T, dk.slice % T});
  else {
    if (q > 0) parts.push_back({"slt", q, dk.slice / T * T, dk.slice % T});
    if (rest > 0) parts.push_back({"eq", q, rest / T * T, rest % T});
  }
  auto cond = [&](const Part& pt) {
    const std::string c = fresh("on_k");
    line(fmt::format("{} = arith.cmpi {}, %tid_{}, {} : index", c, pt.pred, dk.name, idx(pt.core)));
    return c;
  };
  // the end of the core's whole tiles: lo + whole, whole chosen by the core's class (0 for idle cores)
  std::string whole = idx(0);
  for (size_t i = parts.size(); i-- > 0;) {
    if (parts[i].pred.empty()) {
      whole = idx(parts[i].whole);
      continue;
    }
    const std::string c = cond(parts[i]), w = fresh("whole_k");
    line(fmt::format("{} = arith.select {}, {}, {} : index", w, c, idx(parts[i].whole), whole));
    whole = w;
  }
  const std::string hi = fresh("hi_k");
  line(fmt::format("{} = arith.addi {}, {} : index", hi, lo_[kk], whole));
  std::string acc = acc0;
  bool any_whole = false;
  for (const Part& pt : parts) any_whole = any_whole || pt.whole > 0;
  tile_ext_[kk] = T;
  if (any_whole) {
    const std::string r = fresh("acc"), iv = fresh("ik"), it = fresh("acc_in");
    line(fmt::format("{} = scf.for {} = {} to {} step {} iter_args({} = {}) -> ({}) {{", r, iv, lo_[kk], hi, idx(T), it, acc, acc_ty));
    ++depth_;
    offset_[kk] = iv;
    line(fmt::format("scf.yield {} : {}", product(it), acc_ty));
    --depth_;
    line("}");
    acc = r;
  }
  for (const Part& pt : parts) {
    if (pt.tail == 0) continue;
    tile_ext_[kk] = pt.tail;
    offset_[kk] = hi;
    if (pt.pred.empty()) {
      acc = product(acc);
      continue;
    }
    const std::string trips = fresh("trips_k"), r = fresh("acc"), iv = fresh("tail_k"), it = fresh("acc_in");
    line(fmt::format("{} = arith.select {}, {}, {} : index", trips, cond(pt), idx(1), idx(0)));
    line(fmt::format("{} = scf.for {} = {} to {} step {} iter_args({} = {}) -> ({}) {{", r, iv, idx(0), trips, idx(1), it, acc, acc_ty));
    ++depth_;
    line(fmt::format("scf.yield {} : {}", product(it), acc_ty));
    --depth_;
    line("}");
    acc = r;
  }
  tile_ext_[kk] = T;
  return acc;
}

std::string FuncEmitter::emit_matmul() {
  const MatmulSpec& mm = k_.mm;
  const int b = dim_index("b"), m = dim_index("m"), n = dim_index("n"), kd = dim_index("k");
  const Dim& dk = t_.dims[static_cast<size_t>(kd)];
  // A K split: each core's partial sum over its slice of k, summed across the cores of its group with
  // ktdp.inter_tile_produce / inter_tile_reduce (ktir-cpu's reduce path), stored by the group's first core.
  // k is the last split dim, so (ktir-cpu numbering cores with the first grid dim fastest) the cores of a
  // group are g + j·G, G the product of the other splits.
  if (t_.dims[static_cast<size_t>(b)].tile != 1) cannot("batch tiles of more than one matrix");
  if (t_.order.empty() || t_.order.back() != kd) cannot("a loop order without k innermost");
  // An operand the mapper re-laid out (TileKind::relayout) is read from its dense copy.
  auto relaid = [&](const std::string& role) {
    for (const Operand& op : t_.operands)
      if (op.role == role && relayout_writing(p_, op.global)) return op.global;
    return -1;
  };
  const int ra = relaid("a"), rb = relaid("b");
  const int ga = ra >= 0 ? ra : global_of_arg(mm.a), gb = rb >= 0 ? rb : global_of_arg(mm.b);
  const View& va = view(ga, {b, m, kd}, [&](const std::vector<int64_t>& x) {
    if (ra >= 0) return (x[0] * mm.m + x[1]) * mm.k + x[2];
    return mm.a_offset + mm.a_batch * x[0] + mm.a_m * x[1] + mm.a_k * x[2];
  }, "matmul A");
  const View& vb = view(gb, {b, kd, n}, [&](const std::vector<int64_t>& x) {
    if (rb >= 0) return (x[0] * mm.k + x[1]) * mm.n + x[2];
    return mm.b_offset + mm.b_batch * x[0] + mm.b_k * x[1] + mm.b_n * x[2];
  }, "matmul B");
  const std::vector<int> outer(t_.order.begin(), t_.order.end() - 1);
  const DType dta = p_.globals[static_cast<size_t>(ga)].dtype, dtb = p_.globals[static_cast<size_t>(gb)].dtype;
  const size_t km = static_cast<size_t>(m), kn = static_cast<size_t>(n), kk = static_cast<size_t>(kd);
  // One (b, m, n) tile, whole or partial: the k tiles accumulated in f32, then the epilogue or the store.
  auto tile_body = [&] {
    const int64_t tm = tile_ext_[km], tn = tile_ext_[kn];
    const std::string acc_ty = tensor_ty({tm, tn}, DType::f32);
    std::string z;  // the zero constant: the K-split reduction's identity fills with it too
    const std::string a0 = zero_accumulator(acc_ty, &z);
    auto product = [&](const std::string& into) {
      const int64_t tk = tile_ext_[kk];
      const std::string at = load(va, {m, kd}, dta), bt = load(vb, {kd, n}, dtb);
      loaded_.clear();  // the next k tile loads its own
      const std::string r = fresh("mm");
      line(fmt::format("{} = linalg.matmul ins({}, {} : {}, {}) outs({} : {}) -> {}", r, at, bt, tensor_ty({tm, tk}, dta),
                       tensor_ty({tk, tn}, dtb), into, acc_ty, acc_ty));
      return r;
    };
    // k: the whole tiles in a loop carrying the accumulator, the partial one after it
    std::string acc = a0;
    tile_ext_[kk] = dk.tile;
    if (dk.split == 1) {
      acc = accumulate_tiles(kk, dk.size, dk.tile, acc, acc_ty, "ik", product);
    } else {
      acc = ksplit_slice(acc, acc_ty, product);
    }
    if (dk.split > 1) {
      int64_t G = 1;
      for (const Dim& d : t_.dims)
        if (&d != &dk && d.split > 1) G *= d.split;
      const std::string members = fmt::format("affine_set<(i)[g] : ((i - g) mod {0} == 0, i - g >= 0, -i + g + {1} >= 0)>", G,
                                              G * (dk.split - 1));
      const std::string fut_ty = fmt::format("!ktdp.tile_future<{}, groups = affine_set<(g) : (g >= 0, -g + {} >= 0)>>", acc_ty, G - 1);
      const std::string fut = fresh("partial"), gid = fresh("gid"), ze = fresh("empty"), id = fresh("ident"), red = fresh("sum");
      line(fmt::format("{} = ktdp.inter_tile_produce producer_tiles_per_group = {} : {} -> {}", fut, members, acc_ty, fut_ty));
      line("{");
      line(fmt::format("  ^bb0({}: index):", gid));
      line(fmt::format("    ktdp.yield_partial {} : {}", acc, acc_ty));
      line("}");
      line(fmt::format("{} = tensor.empty() : {}", ze, acc_ty));
      line(fmt::format("{} = linalg.fill ins({} : f32) outs({} : {}) -> {}", id, z, ze, acc_ty, acc_ty));
      line(fmt::format("{} = ktdp.inter_tile_reduce({}) consumer_tiles_per_group = {}, identity({} : {}) : {} -> {}", red, fut, members,
                       id, acc_ty, fut_ty, acc_ty));
      line("{");
      const std::string lhs = fresh("lhs"), rhs = fresh("rhs"), re = fresh("empty"), rs = fresh("rsum");
      line(fmt::format("  ^bb0({}: {}, {}: {}):", lhs, acc_ty, rhs, acc_ty));
      line(fmt::format("    {} = tensor.empty() : {}", re, acc_ty));
      line(fmt::format("    {} = linalg.add ins({}, {} : {}, {}) outs({} : {}) -> {}", rs, lhs, rhs, acc_ty, acc_ty, re, acc_ty, acc_ty));
      line(fmt::format("    ktdp.yield_reduced {} : {}", rs, acc_ty));
      line("}");
      acc = red;
      const std::string w = fresh("writer");
      line(fmt::format("{} = arith.cmpi eq, %tid_{}, {} : index", w, dk.name, idx(0)));
      line(fmt::format("scf.if {} {{", w));
      ++depth_;
    }
    acc_ = acc;
    vals_.clear();
    loaded_.clear();
    struct CloseWriter {  // the writer's scf.if, closed after the epilogue
      FuncEmitter* f;
      bool open;
      ~CloseWriter() {
        if (open) --f->depth_, f->line("}");
      }
    } close_writer{this, dk.split > 1};
    // epilogue over the product tile (b m n), or the product stored as it is
    if (k_.body.empty()) {
      const int gc = global_of_arg(mm.c);
      const bool contiguous = mm.c_batch == 0 && mm.c_m == 0 && mm.c_n == 0;
      const View& vc = view(gc, target_, [&](const std::vector<int64_t>& x) {
        return contiguous ? linear_of_(x) : static_cast<int64_t>(mm.c_batch * x[0] + mm.c_m * x[1] + mm.c_n * x[2]);
      }, "matmul C");
      store(vc, acc_, DType::f32);
    } else {
      emit_body_stores();
    }
  };
  target_ = {b, m, n};
  compute_ = {m, n};
  const int64_t B = mm.batch, M = mm.m, N = mm.n;
  linear_of_ = [=](const std::vector<int64_t>& x) { return (x[0] * M + x[1]) * N + x[2]; };
  if (!k_.body.empty()) {
    if (k_.outer_count() * k_.inner_count() != B * M * N)
      throw Error(Location{.node = t_.node, .pass = "ktir"},
                  fmt::format("kernel {}: the epilogue's loop space is not the product's {}x{}x{}", k_.name, B, M, N));
    for (size_t i = 0; i < k_.body.size(); ++i)
      if (k_.body[i].is(KInstrKind::store) && k_.accesses.at(static_cast<size_t>(k_.body[i].access)).arg == mm.c) c_access_ = k_.body[i].access;
    if (c_access_ < 0) cannot("an epilogue that does not store the product's buffer");
  }
  nest(outer, 0, tile_body);
  return "matmul";
}

std::string FuncEmitter::run() {
  const size_t nd = t_.dims.size();
  for (const Dim& d : t_.dims) {
    if (d.split < 1 || d.slice <= 0 || d.tile <= 0)
      throw Error(Location{.node = t_.node, .pass = "ktir"}, fmt::format("tile kernel {}: dim {} is not mapped", t_.name, d.name));
    // partial tiles, short last slices and idle cores are emitted as such (nest); elements left out are not
    if (d.split * d.slice < d.size)
      throw Error(Location{.node = t_.node, .pass = "ktir"},
                  fmt::format("tile kernel {}: dim {} of {} over {} cores x slice {} in tiles of {} does not cover it", t_.name,
                              d.name, d.size, d.split, d.slice, d.tile));
  }
  offset_.assign(nd, "");
  lo_.assign(nd, "");
  tile_ext_.clear();
  for (const Dim& d : t_.dims) tile_ext_.push_back(d.tile);
  // arguments: the globals of the operands, each once
  for (const Operand& op : t_.operands) {
    if (op.global < 0 || arg_of_global_.count(op.global)) continue;
    // every operand is a buffer of the kernel, or the re-laid-out copy of one
    if (!relayout_writing(p_, op.global)) (void)arg_of(op.global);
    arg_of_global_[op.global] = fmt::format("%arg{}", arg_globals_.size());
    arg_globals_.push_back(op.global);
  }
  // the layout of every global: its padded shape in DRAM
  for (int g : arg_globals_) {
    const Global& gl = p_.globals[static_cast<size_t>(g)];
    const Layout lay(gl);
    const std::string n = fmt::format("%g{}", arg_of_global_[g].substr(4));
    views_ << fmt::format("    // {}: {} {}[{}] in DRAM as {}[{}]{}\n", n, mlir_comment_text(gl.name), dtype_name(gl.logical),
                          list(gl.shape), dtype_name(gl.dtype), list(gl.padded),
                          gl.perm.empty() ? "" : fmt::format(", physical order [{}]", list(gl.perm)));
    views_ << fmt::format("    {} = ktdp.construct_memory_view {}, sizes: [{}], strides: [{}] {{\n", n, arg_of_global_[g],
                          list(gl.padded), list(lay.pstride));
    views_ << fmt::format("      coordinate_set = {}, memory_space = #ktdp.spyre_memory_space<HBM>\n", box_set(gl.padded));
    views_ << fmt::format("    }} : memref<{}x{}>\n", dims_x(gl.padded), elem_type(gl.dtype));
  }
  // the core grid: the split dims, in dim order
  std::vector<int64_t> grid;
  std::vector<std::string> tids;
  for (size_t d = 0; d < nd; ++d)
    if (t_.dims[d].split > 1) {
      grid.push_back(t_.dims[d].split);
      tids.push_back("%tid_" + t_.dims[d].name);
    }
  // ktir-cpu's grid has at most three dims
  if (grid.size() > 3) cannot(fmt::format("a core grid of {} dims", grid.size()));
  std::string tid_line;
  if (grid.empty()) {
    grid = {1};
    tid_line = "    %tid = ktdp.get_compute_tile_id : index\n";
  } else {
    std::vector<std::string> tys(tids.size(), "index");
    tid_line = fmt::format("    {} = ktdp.get_compute_tile_id : {}\n", list(tids), list(tys));
  }
  for (size_t d = 0; d < nd; ++d) {
    const Dim& dm = t_.dims[d];
    if (dm.split > 1) {
      lo_[d] = "%lo_" + dm.name;
      line(fmt::format("{} = arith.muli %tid_{}, {} : index", lo_[d], dm.name, idx(dm.slice)));
    } else {
      lo_[d] = idx(0);
    }
  }
  const std::string kind = t_.kind == TileKind::matmul     ? emit_matmul()
                           : t_.kind == TileKind::relayout ? emit_relayout()
                           : t_.kind == TileKind::conv     ? emit_conv()
                                                           : emit_vector();
  std::ostringstream out;
  out << fmt::format("  // {}: {} kernel {} of node \"{}\"\n", t_.name, kind, mlir_comment_text(k_.name), mlir_comment_text(t_.node));
  std::vector<std::string> src;
  for (const auto& s : t_.sources) src.push_back("\"" + mlir_comment_text(s) + "\"");
  out << fmt::format("  //   sources {}\n", list(src));
  std::vector<std::string> ds;
  for (const Dim& d : t_.dims)
    ds.push_back(fmt::format("{} {}/{}x{} tile {}", d.name, d.size, d.split, d.slice, d.tile));
  std::vector<std::string> ord;
  for (int o : t_.order) ord.push_back(t_.dims[static_cast<size_t>(o)].name);
  out << fmt::format("  //   dims (size/split x slice) {}; loop order {}; {} cores\n", list(ds), list(ord), t_.cores);
  out << fmt::format("  func.func @{}(\n", t_.name);
  for (size_t i = 0; i < arg_globals_.size(); ++i) {
    const Global& g = p_.globals[static_cast<size_t>(arg_globals_[i])];
    out << fmt::format("      %arg{}: index{}  // {} {}[{}]\n", i, i + 1 < arg_globals_.size() ? "," : "", mlir_comment_text(g.name),
                       dtype_name(g.dtype), list(g.padded));
  }
  out << fmt::format("  ) attributes {{grid = [{}]}} {{\n", list(grid));
  out << tid_line << consts_.str() << views_.str() << body_.str();
  out << "    return\n  }\n";
  return out.str();
}

}  // namespace detail

using namespace detail;

KtirExport export_ktir_kernels(const TileProgram& p, const KernelModule& m) {
  KtirExport e;
  for (const TileKernel& t : p.kernels) {
    if (t.kind == TileKind::host) {
      e.skipped.push_back(fmt::format("{}: host step \"{}\"", t.name, t.node));
      continue;
    }
    int kernel = t.kernel;
    if (t.kind == TileKind::relayout) {
      // a re-layout copy reads its source through the strides of the matmul that reads the copy
      for (const TileKernel& c : p.kernels)
        for (const Operand& op : c.operands)
          if (c.kind == TileKind::matmul && !t.operands.empty() && op.global == t.operands.back().global) kernel = c.kernel;
    }
    if (kernel < 0 || kernel >= static_cast<int>(m.kernels.size()))
      throw Error(Location{.node = t.node, .pass = "ktir"},
                  fmt::format("tile kernel {} refers to kernel {} of a module with {}", t.name, kernel, m.kernels.size()));
    const Kernel& k = m.kernels[static_cast<size_t>(kernel)];
    if ((t.kind == TileKind::matmul || t.kind == TileKind::relayout) != (k.kind == KernelKind::matmul) ||
        (t.kind == TileKind::conv) != (k.kind == KernelKind::conv))
      throw Error(Location{.node = t.node, .pass = "ktir"},
                  fmt::format("tile kernel {} is {} but kernel {} is {}", t.name, tile_kind_name(t.kind), k.name, kernel_kind_name(k.kind)));
    try {
      FuncEmitter f(p, m, t, k);  // k: for a re-layout copy, the kernel of the matmul it feeds
      KtirKernel kk;
      kk.tile_kernel = t.name;
      kk.node = t.node;
      kk.func = f.run();
      kk.args = f.arg_globals();
      kk.views = f.views();
      // One module per kernel: ktir-cpu reads one function per module (with several it ran every
      // function with the body of the last one, without an error).
      kk.module = fmt::format("// KTIR (ktdp dialect) exported by tessel: model \"{}\", target {}, {} cores, tile kernel {}\n",
                              mlir_comment_text(p.name), mlir_comment_text(p.target), p.cores, t.name) +
                  "module {\n" + kk.func + "}\n";
      e.kernels.push_back(std::move(kk));
    } catch (const Unsupported& u) {
      e.skipped.push_back(fmt::format("{}: {} \"{}\": {}", t.name, tile_kind_name(t.kind), t.node, u.why));
    }
  }
  return e;
}

std::string export_ktir(const TileProgram& p, const KernelModule& m, std::vector<std::string>* skipped) {
  const KtirExport e = export_ktir_kernels(p, m);
  std::ostringstream out;
  out << fmt::format("// KTIR (ktdp dialect, torch-spyre/RFCs 0682-KtirSpec) exported by tessel from the tile level\n");
  out << fmt::format("// model \"{}\", target {}, {} cores; {} of {} tile kernels exported\n", mlir_comment_text(p.name), mlir_comment_text(p.target), p.cores,
                     e.kernels.size(), p.kernels.size());
  for (const std::string& s : e.skipped) out << "// skipped " << mlir_comment_text(s) << '\n';
  out << "module {\n";
  for (size_t i = 0; i < e.kernels.size(); ++i) out << (i ? "\n" : "") << e.kernels[i].func;
  out << "}\n";
  if (skipped) skipped->insert(skipped->end(), e.skipped.begin(), e.skipped.end());
  return out.str();
}

nlohmann::json ktir_manifest(const TileProgram& p, const KtirExport& e) {
  using nlohmann::json;
  auto kind_name = [](Global::Kind k) {
    return k == Global::Kind::input ? "input" : k == Global::Kind::output ? "output" : k == Global::Kind::constant ? "constant" : "temp";
  };
  auto global_json = [&](int g) {
    const Global& gl = p.globals.at(static_cast<size_t>(g));
    return json{{"global", gl.name}, {"index", g}, {"kind", kind_name(gl.kind)}, {"dtype", std::string(dtype_name(gl.dtype))},
                {"logical_dtype", std::string(dtype_name(gl.logical))}, {"shape", gl.shape}, {"padded", gl.padded},
                {"perm", gl.perm}};
  };
  json ks = json::array();
  std::map<std::string, size_t> exported;
  for (size_t i = 0; i < e.kernels.size(); ++i) {
    const KtirKernel& k = e.kernels[i];
    exported[k.tile_kernel] = i;
    json args = json::array();
    for (size_t a = 0; a < k.args.size(); ++a) {
      json j = global_json(k.args[a]);
      j["arg"] = fmt::format("arg{}", a);
      bool stored = false;
      for (const KtirView& v : k.views) stored = stored || (v.global == k.args[a] && v.stored);
      j["written"] = stored;
      args.push_back(std::move(j));
    }
    ks.push_back({{"kernel", k.tile_kernel}, {"function", k.tile_kernel}, {"file", ktir_file_name(i, k)}, {"node", k.node},
                  {"args", std::move(args)}});
  }
  // every global's declaration: padded DRAM shape in logical dim order, physical order perm (outermost
  // first; empty: row-major), the innermost physical dim padded
  json globals = json::array();
  for (size_t g = 0; g < p.globals.size(); ++g) globals.push_back(global_json(static_cast<int>(g)));
  // every tile kernel in program order: exported (its file), or not (host steps and the rest, why)
  std::map<std::string, std::string> why;
  for (const std::string& s : e.skipped) why[s.substr(0, s.find(':'))] = s;
  json steps = json::array();
  for (const TileKernel& t : p.kernels) {
    json st{{"kernel", t.name}, {"kind", std::string(tile_kind_name(t.kind))}, {"node", t.node}};
    auto it = exported.find(t.name);
    if (it != exported.end()) {
      st["exported"] = true;
      st["file"] = ktir_file_name(it->second, e.kernels[it->second]);
    } else {
      st["exported"] = false;
      st["reason"] = why.count(t.name) ? why[t.name] : "not exported";
    }
    json ins = json::array(), outs = json::array();
    if (t.kind == TileKind::host) {
      for (int g : t.host_inputs) ins.push_back(p.globals.at(static_cast<size_t>(g)).name);
      for (int g : t.host_outputs) outs.push_back(p.globals.at(static_cast<size_t>(g)).name);
    } else {
      for (const Operand& o : t.operands)
        if (o.global >= 0) (o.out ? outs : ins).push_back(p.globals.at(static_cast<size_t>(o.global)).name);
    }
    st["reads"] = std::move(ins);
    st["writes"] = std::move(outs);
    steps.push_back(std::move(st));
  }
  json ins = json::array(), outs = json::array();
  for (int g : p.inputs) ins.push_back(p.globals.at(static_cast<size_t>(g)).name);
  for (int g : p.outputs) outs.push_back(p.globals.at(static_cast<size_t>(g)).name);
  return {{"model", p.name}, {"target", p.target}, {"cores", p.cores}, {"float_dtype", std::string(dtype_name(p.float_dtype))},
          {"dl16", p.dl16}, {"storage", e.storage}, {"inputs", ins}, {"outputs", outs}, {"kernels", std::move(ks)}, {"skipped", e.skipped},
          {"tile_kernels", p.kernels.size()}, {"globals", std::move(globals)}, {"steps", std::move(steps)}};
}

std::string ktir_file_name(size_t index, const KtirKernel& k) { return fmt::format("{:02d}-{}.mlir", index, k.tile_kernel); }

int64_t ktir_address(const Global& g, const std::vector<int64_t>& index) {
  const Layout lay(g);
  if (index.size() != g.shape.size()) throw Error(Location{.pass = "ktir"}, fmt::format("global '{}': index of rank {}", g.name, index.size()));
  int64_t a = 0;
  for (size_t d = 0; d < index.size(); ++d) a += index[d] * lay.pstride[d];
  return a;
}

int64_t ktir_logical_at(const Global& g, int64_t address) {
  const Layout lay(g);
  if (address < 0) return -1;
  int64_t logical = 0;
  std::vector<int64_t> idx(g.shape.size(), 0);
  for (size_t i = lay.order.size(); i-- > 0;) {
    const size_t d = lay.order[i];
    const int64_t p = g.padded[d];
    idx[d] = address % p;
    address /= p;
    if (idx[d] >= g.shape[d]) return -1;
  }
  if (address != 0) return -1;
  for (size_t d = 0; d < idx.size(); ++d) logical = logical * g.shape[d] + idx[d];
  return logical;
}

}  // namespace tessel::ktir
