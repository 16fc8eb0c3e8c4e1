// Mapping the kernel level onto a dataflow target (see map.h): layout, work division, tiling,
// scheduling and allocation. docs/ir/tile.md walks through ffn_s on the spyre preset.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "tessel/ir/core_ops.h"
#include "tessel/kernel/arena_plan.h"
#include "tessel/support/error.h"
#include "tessel/targets/dataflow/cost.h"
#include "tessel/targets/dataflow/map.h"
#include "tessel/targets/dataflow/tile_traffic.h"

namespace tessel::dataflow {
namespace {

using dataflow::DmaDir;
using hw::HwSpec;
using hw::LayoutKind;
using hw::VectorOp;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

[[noreturn]] void map_error(const std::string& kernel, const std::string& msg) {
  throw Error(Location{.node = kernel, .pass = "tile"}, msg);
}

DType device_dtype(DType t, DType float_dtype) { return is_float(t) ? float_dtype : t; }

// Elements along the stick / lane dim that make one layout unit.
int64_t lane_unit(const HwSpec& hw, DType t) {
  return hw.layout.kind == LayoutKind::stick ? hw.layout.elements_per_stick(t) : hw.layout.tile_lanes;
}
int64_t row_unit(const HwSpec& hw, DType t) {
  return hw.layout.kind == LayoutKind::tiled ? hw.layout.tile_rows_for(t) : 1;
}


// ---- vector op classes of a loop body -------------------------------------------------------------

// The vector-unit class of one element of a loop-body instruction: the primitive's cost column in the
// core-op table (core_ops.def). Only primitives that never sit in a loop body have none; they keep the
// old table's fallback.
VectorOp vector_class(CoreOp op) {
  switch (core_op_info(op).cost) {
    case VectorCost::add: return VectorOp::add;
    case VectorCost::mul: return VectorOp::mul;
    case VectorCost::compare: return VectorOp::compare;
    case VectorCost::convert: return VectorOp::convert;
    case VectorCost::reduce: return VectorOp::reduce;
    case VectorCost::divide: return VectorOp::divide;
    case VectorCost::transcendental: return VectorOp::transcendental;
    case VectorCost::none: return VectorOp::transcendental;
  }
  return VectorOp::transcendental;
}

// Vector-unit cycles of `points` p-points of a loop body (element instructions run e times per point,
// row instructions once) and its element operations (the flops the report counts).
struct VectorWork {
  double cycles = 0;
  double ops = 0;
  std::vector<double> per_point = std::vector<double>(hw::kNumVectorOps, 0.0);  // element ops per point
};

VectorWork vector_work(const HwSpec& hw, const Kernel& k, int64_t points, int64_t e) {
  std::map<VectorOp, int64_t> n;
  double ops = 0;
  for (const KInstr& in : k.body) {
    if (in.is(KInstrKind::load) || in.is(KInstrKind::store) || in.is(KInstrKind::constant)) continue;
    const int64_t count = in.row ? points : points * e;
    n[vector_class(in.core)] += count;
    ops += static_cast<double>(count);
  }
  VectorWork w;
  for (const auto& [op, c] : n) {
    w.cycles += dataflow::vector_cycles(hw, op, c);
    w.per_point[static_cast<size_t>(op)] = static_cast<double>(c) / static_cast<double>(std::max<int64_t>(1, points));
  }
  w.ops = ops;
  return w;
}

// ---- operands -------------------------------------------------------------------------------------

struct Mapper {
  const KernelModule& m;
  const HwSpec& hw;
  const MapOptions& o;
  DType fdt;
  TileProgram p;
  std::map<const Value*, int> global_of;
  std::map<const Value*, std::vector<int64_t>> perm_of;  // the layout pass's choices (NHWC activations)
  int cores_max = 0;
  std::vector<TileKernel> before;  // re-layout copies the kernel being mapped needs first

  int global(const Value* v) {
    auto it = global_of.find(v);
    if (it != global_of.end()) return it->second;
    Global g;
    g.name = v->name;
    g.logical = v->type.dtype;
    g.dtype = device_dtype(v->type.dtype, fdt);
    g.shape = v->type.shape;
    auto pit = perm_of.find(v);
    if (pit != perm_of.end()) g.perm = pit->second;
    g.padded = padded_shape(v->type.shape, g.dtype, hw, g.perm);
    g.kind = v->constant ? Global::Kind::constant : Global::Kind::temp;
    p.globals.push_back(g);
    return global_of[v] = static_cast<int>(p.globals.size()) - 1;
  }

  int64_t esize(const Value* v) const { return static_cast<int64_t>(dtype_size(device_dtype(v->type.dtype, fdt))); }
};

Operand make_operand(Mapper& mp, std::string role, const Value* v, bool out, std::vector<int> dims, DType spad_dtype,
                     int copies, int64_t tile_bytes, int fanout = 1) {
  Operand op;
  op.role = std::move(role);
  op.global = v ? mp.global(v) : -1;  // null: in the scratchpad only (accumulators)
  op.out = out;
  op.dims = std::move(dims);
  op.spad_dtype = spad_dtype;
  op.copies = copies;
  op.tile_bytes = tile_bytes;
  op.fanout = fanout;
  return op;
}

// ---- matmul ---------------------------------------------------------------------------------------

struct MatmulPlan {
  int64_t sb = 1, sm = 1, sn = 1, sk = 1;     // splits
  int64_t bs = 0, ms = 0, ns = 0, ks = 0;     // slices
  int64_t tb = 1, tm = 0, tn = 0, tk = 0;     // tiles
  bool n_outer = false;                       // loop order n m k instead of m n k
  double compute = 0, memory = 0, reduce = 0, total = 0;
  int64_t dram_bytes = 0, spad = 0;
  std::string why_not;                        // set when the candidate cannot be tiled
};

// Scratchpad bytes of one core's buffers for tiles (tm, tn, tk): A and B double-buffered, the fp32
// accumulator, the output tile and each epilogue input double-buffered.
int64_t matmul_spad(const MatmulPlan& c, int64_t es, int64_t epi_tile_elems, int n_epi, bool dbl) {
  const int64_t cp = dbl ? 2 : 1;
  return cp * c.tm * c.tk * es + cp * c.tk * c.tn * es + c.tm * c.tn * 4 + cp * c.tm * c.tn * es +
         n_epi * cp * epi_tile_elems * es;
}

// The estimate of a split and tiling: matrix-unit time of every tile, DRAM time of the traffic
// (resident tiles not reloaded, broadcast tiles read once), K-split reduction, overlapped as the
// hardware file's overlap factor says.
void cost_matmul(const HwSpec& hw, DType dt, int n_epi, MatmulPlan& c) {
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  const int64_t mt = ceil_div(c.ms, c.tm), nt = ceil_div(c.ns, c.tn), kt = ceil_div(c.ks, c.tk);
  // Traffic per core, loop order m n k: A(m,k) stays resident across n when K is one tile; B(k,n)
  // is reloaded for every m tile unless it is the only tile. Order n m k: the mirror image.
  const int64_t a_slice = c.bs * c.ms * c.ks * es, b_slice = c.bs * c.ks * c.ns * es;
  const int64_t a_mnk = kt > 1 ? a_slice * nt : a_slice, b_mnk = kt > 1 || nt > 1 ? b_slice * mt : b_slice;
  const int64_t b_nmk = kt > 1 ? b_slice * mt : b_slice, a_nmk = kt > 1 || mt > 1 ? a_slice * nt : a_slice;
  c.n_outer = a_nmk + b_nmk < a_mnk + b_mnk;
  const int64_t a_bytes = c.n_outer ? a_nmk : a_mnk, b_bytes = c.n_outer ? b_nmk : b_mnk;
  const int64_t c_bytes = c.bs * c.ms * c.ns * es, epi_bytes = n_epi * c_bytes;
  const int64_t cores = c.sb * c.sm * c.sn * c.sk;
  const int64_t limit = hw.interconnect.broadcast_limit > 0 ? hw.interconnect.broadcast_limit : cores;
  // Cores that differ only in their N coordinate read the same A tiles at the same time (one DRAM
  // read, broadcast); those that differ only in M share B.
  const int64_t fa = std::min(c.sn, limit), fb = std::min(c.sm, limit);
  const int64_t reads = cores * (a_bytes / fa + b_bytes / fb + epi_bytes / std::max<int64_t>(1, c.sk));
  const int64_t writes = c.sb * c.sm * c.sn * c_bytes;
  c.dram_bytes = reads + writes;
  c.compute = static_cast<double>(c.bs * mt * nt * kt) * dataflow::matmul_cycles(hw, c.tm, c.tk, c.tn, dt);
  c.memory = static_cast<double>(reads) / hw.dram_read_bytes_per_cycle() +
             static_cast<double>(writes) / hw.dram_write_bytes_per_cycle();
  c.reduce = dataflow::reduce_cycles(hw, c.bs * c.ms * c.ns, static_cast<int>(c.sk), 4);
  c.total = dataflow::overlap_cycles(hw, c.compute, c.memory) + c.reduce;
}

MatmulPlan plan_matmul(const HwSpec& hw, const Kernel& k, DType dt, int64_t sb, int64_t sm, int64_t sn, int64_t sk,
                       int n_epi, bool dbl, int64_t usable) {
  const MatmulSpec& mm = k.mm;
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  const int64_t nu = lane_unit(hw, dt), ku = lane_unit(hw, dt), mu = row_unit(hw, dt);
  MatmulPlan c;
  c.sb = sb, c.sm = sm, c.sn = sn, c.sk = sk;
  c.bs = ceil_div(mm.batch, sb);
  c.ms = round_up(ceil_div(mm.m, sm), mu);
  c.ns = round_up(ceil_div(mm.n, sn), nu);
  c.ks = round_up(ceil_div(mm.k, sk), ku);
  // Tiles: every combination of halvings of the slices (whole units each) that fits the
  // scratchpad; the fastest by the same estimate as the splits. Large K tiles fill the matrix unit's
  // folds (a K tile of 64 on a 96-deep fold wastes a third of it); small ones cost reloads.
  auto halvings = [](int64_t slice, int64_t unit) {
    std::vector<int64_t> v;
    for (int64_t t = slice;; t = round_up(t / 2, unit)) {
      v.push_back(t);
      if (t <= unit || v.size() >= 8) break;
    }
    return v;
  };
  MatmulPlan best;
  bool found = false;
  int64_t smallest = std::numeric_limits<int64_t>::max();
  for (int64_t tk : halvings(c.ks, ku))
    for (int64_t tn : halvings(c.ns, nu))
      for (int64_t tm : halvings(c.ms, mu)) {
        MatmulPlan x = c;
        x.tm = tm, x.tn = tn, x.tk = tk;
        x.spad = matmul_spad(x, es, x.tm * x.tn, n_epi, dbl);
        smallest = std::min(smallest, x.spad);
        if (x.spad > usable) continue;
        cost_matmul(hw, dt, n_epi, x);
        if (!found || x.total < best.total - 1e-9 * best.total) best = x, found = true;
      }
  if (!found) {
    c.why_not = fmt::format("the smallest tile needs {} bytes of scratchpad, {} usable", smallest, usable);
    return c;
  }
  return best;
}

std::vector<int64_t> split_choices(int64_t units, int64_t cores) {
  std::vector<int64_t> v;
  for (int64_t s = 1; s <= std::min(units, cores); ++s) v.push_back(s);
  return v;
}

// A re-layout copy of matmul operand `v` into a dense [batch, rows, cols] global whose innermost
// (stick) dim is `cols`: the operand was read through strides whose innermost one is not 1, which a
// stick or tile layout cannot serve (each stick holds consecutive elements of one dim). A vector
// kernel over the rows, split across the cores like any vector kernel; returns the new global.
int relayout(Mapper& mp, const Node& n, const Value* v, const std::string& role, int64_t batch, int64_t rows, int64_t cols) {
  const HwSpec& hw = mp.hw;
  Global g;
  g.name = fmt::format("{}.{}_relayout", n.name, role);
  g.logical = v->type.dtype;
  g.dtype = device_dtype(v->type.dtype, mp.fdt);
  g.shape = {batch, rows, cols};
  g.padded = padded_shape(g.shape, g.dtype, hw);
  g.kind = Global::Kind::temp;
  mp.p.globals.push_back(g);
  const int out = static_cast<int>(mp.p.globals.size()) - 1;
  const Global& src = mp.p.globals[static_cast<size_t>(mp.global(v))];
  TileKernel t;
  t.kind = TileKind::relayout;
  t.node = g.name;
  t.sources = {n.name};
  t.on_vector_unit = true;
  const int64_t P = batch * rows;
  const int64_t row_bytes = mp.p.globals[static_cast<size_t>(out)].bytes() / std::max<int64_t>(1, P);
  const int64_t align = row_unit(hw, g.dtype);
  const int cp = mp.o.double_buffer ? 2 : 1;
  // split the rows over the cores; tile them to fit (in and out buffers, double-buffered)
  const int64_t split = std::min<int64_t>(mp.cores_max, ceil_div(P, align));
  const int64_t slice = round_up(ceil_div(P, split), align);
  // The source is read transposed: with a stick layout a tile of n rows touches, for each of its columns,
  // ceil(n / E) sticks of E elements (consecutive rows of one column), and the DMA moves whole sticks —
  // what ktir-cpu charges too (ktir_cpu/latency.py, _data_size: "HBM traffic is always charged at stick
  // granularity"); docs/sim.md, "KTIR".
  const int64_t per_stick = hw.layout.kind == LayoutKind::stick ? std::max<int64_t>(1, hw.layout.elements_per_stick(g.dtype)) : 0;
  auto read_bytes = [&](int64_t n) {
    return per_stick > 0 ? cols * ceil_div(n, per_stick) * per_stick * static_cast<int64_t>(dtype_size(g.dtype)) : n * row_bytes;
  };
  int64_t tile = slice;
  while (tile > align && cp * (read_bytes(tile) + tile * row_bytes) > mp.p.usable_spad) tile = round_up(tile / 2, align);
  if (cp * (read_bytes(tile) + tile * row_bytes) > mp.p.usable_spad)
    map_error(n.name, fmt::format("re-layout of tensor '{}': one row of {} bytes does not fit the scratchpad", v->name, row_bytes));
  t.dims = {{"p", P, ceil_div(P, slice), slice, tile, align, false}, {"e", cols, 1, cols, cols, 1, false}};
  t.order = {0, 1};
  t.cores = static_cast<int>(t.dims[0].split);
  Operand in;
  in.role = "in";
  in.global = mp.global(v);
  in.dims = {0, 1};
  in.spad_dtype = g.dtype;
  in.copies = cp;
  in.tile_bytes = read_bytes(tile);  // the whole sticks it touches
  Operand o = in;
  o.role = "out";
  o.global = out;
  o.out = true;
  o.tile_bytes = tile * row_bytes;
  t.operands = {in, o};
  t.vector_ops.assign(hw::kNumVectorOps, 0.0);
  t.vector_ops[static_cast<size_t>(VectorOp::convert)] = static_cast<double>(cols);  // one move per element
  t.flops = 0;
  t.dram_bytes = ceil_div(P, tile) * read_bytes(tile) + static_cast<int64_t>(P) * row_bytes;
  t.estimate_cycles = static_cast<double>(t.dram_bytes) / hw.dram_read_bytes_per_cycle();
  t.decision = fmt::format("re-lays %{} ({}) out as [{},{},{}] with {} innermost: the matmul reads it with a non-unit "
                           "innermost stride",
                           src.name, role, batch, rows, cols, role == "b" ? "N" : "K");
  mp.before.push_back(std::move(t));  // scratchpad offsets: the allocation stage
  return out;
}

void map_matmul(Mapper& mp, const Node& n, const Kernel& k, TileKernel& t) {
  const HwSpec& hw = mp.hw;
  const MatmulSpec& mm = k.mm;
  const Value* av = n.inputs[static_cast<size_t>(mm.a)];
  const DType dt = device_dtype(av->type.dtype, mp.fdt);
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  const int64_t cores = mp.cores_max;
  // Epilogue inputs: every input other than A and B.
  std::vector<int> epi;
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (static_cast<int>(i) != mm.a && static_cast<int>(i) != mm.b && n.inputs[i]) epi.push_back(static_cast<int>(i));
  const int64_t nu = lane_unit(hw, dt), ku = nu, mu = row_unit(hw, dt);
  std::vector<MatmulPlan> cands;
  std::string why_none;
  for (int64_t sb : split_choices(mm.batch, cores))
    for (int64_t sm : split_choices(ceil_div(mm.m, mu), cores / sb))
      for (int64_t sn : split_choices(ceil_div(mm.n, nu), cores / (sb * sm)))
        for (int64_t sk : split_choices(ceil_div(mm.k, ku), cores / (sb * sm * sn))) {
          MatmulPlan c = plan_matmul(hw, k, dt, sb, sm, sn, sk, static_cast<int>(epi.size()), mp.o.double_buffer,
                                     mp.p.usable_spad);
          if (!c.why_not.empty()) {
            why_none = c.why_not;
            continue;
          }
          cands.push_back(c);
        }
  if (cands.empty())
    map_error(n.name, fmt::format("matmul {}x{}x{}: no split fits the scratchpad: tensor '{}' ({})", mm.m, mm.k, mm.n,
                                  av->name, why_none));
  auto better = [](const MatmulPlan& x, const MatmulPlan& y) {
    if (std::abs(x.total - y.total) > 1e-9 * std::max(x.total, y.total)) return x.total < y.total;
    return x.sb * x.sm * x.sn * x.sk < y.sb * y.sm * y.sn * y.sk;  // equal time: fewer cores
  };
  std::sort(cands.begin(), cands.end(), better);
  const MatmulPlan& c = cands[0];
  auto split_str = [](const MatmulPlan& x) {
    return fmt::format("b{} m{} n{} k{} ({:.0f} cycles: compute {:.0f}, DRAM {:.0f}, reduce {:.0f})", x.sb, x.sm, x.sn,
                       x.sk, x.total, x.compute, x.memory, x.reduce);
  };
  t.decision = fmt::format("best of {} splits: {}", cands.size(), split_str(c));
  if (cands.size() > 1) t.decision += "; runner-up " + split_str(cands[1]);
  t.dims = {{"b", mm.batch, c.sb, c.bs, c.tb, 1, false},
            {"m", mm.m, c.sm, c.ms, c.tm, mu, false},
            {"n", mm.n, c.sn, c.ns, c.tn, nu, false},
            {"k", mm.k, c.sk, c.ks, c.tk, ku, true}};
  t.order = c.n_outer ? std::vector<int>{0, 2, 1, 3} : std::vector<int>{0, 1, 2, 3};
  t.cores = static_cast<int>(c.sb * c.sm * c.sn * c.sk);
  const int cp = mp.o.double_buffer ? 2 : 1;
  const int64_t limit = hw.interconnect.broadcast_limit > 0 ? hw.interconnect.broadcast_limit : t.cores;
  auto add = [&](std::string role, const Value* v, bool out, std::vector<int> dims, DType sd, int copies, int64_t bytes,
                 int fanout) { t.operands.push_back(make_operand(mp, std::move(role), v, out, std::move(dims), sd, copies, bytes, fanout)); };
  // Layout rule of the matrix unit: A sticked on K, B on N. An operand read with another innermost
  // stride gets a re-layout copy first (Q·Kᵀ reads K transposed).
  add("a", av, false, {0, 1, 3}, dt, cp, c.tm * c.tk * es, static_cast<int>(std::min(c.sn, limit)));
  if (mm.a_k != 1 && mm.k > 1 && mm.m > 1) t.operands.back().global = relayout(mp, n, av, "a", mm.batch, mm.m, mm.k);
  const Value* bv = n.inputs[static_cast<size_t>(mm.b)];
  add("b", bv, false, {0, 3, 2}, dt, cp, c.tk * c.tn * es, static_cast<int>(std::min(c.sm, limit)));
  if (mm.b_n != 1 && mm.n > 1 && mm.k > 1) t.operands.back().global = relayout(mp, n, bv, "b", mm.batch, mm.k, mm.n);
  for (int i : epi) {
    // an epilogue input indexed like the result, like a row of it (bias), or small and whole
    const Value* v = n.inputs[static_cast<size_t>(i)];
    const int64_t numel = shape_numel(v->type.shape);
    if (numel == mm.batch * mm.m * mm.n) add("epi", v, false, {0, 1, 2}, dt, cp, c.tm * c.tn * es, 1);
    else if (numel == mm.m * mm.n) add("epi", v, false, {1, 2}, dt, cp, c.tm * c.tn * es, 1);
    else if (numel == mm.n) add("epi", v, false, {2}, dt, cp, c.tn * es, 1);
    else add("epi", v, false, {}, dt, 1, std::max<int64_t>(1, numel) * es, 1);
  }
  add("acc", nullptr, false, {0, 1, 2}, DType::f32, 1, c.tm * c.tn * 4, 1);  // fp32, in the scratchpad only
  for (const Value* out : n.outputs) add("c", out, true, {0, 1, 2}, dt, cp, c.tm * c.tn * es, 1);
  t.flops = 2.0 * static_cast<double>(mm.batch * mm.m * mm.n * mm.k) +
            vector_work(hw, k, mm.batch * mm.m, mm.n).ops;
  t.dram_bytes = c.dram_bytes;
  t.estimate_cycles = c.total + vector_work(hw, k, c.bs * c.ms, c.ns).cycles;
  t.vector_ops = vector_work(hw, k, 1, 1).per_point;  // epilogue operations per output element
}

// ---- convolution ----------------------------------------------------------------------------------

// Reduction tiles of a convolution: whole input channels (the stick of channels-last activations)
// times the whole kernel window, halving the channels in whole lane units. The whole reduction comes
// first; tiled reductions are tried only when no plan with it fits (map_conv), so
// every convolution that fitted before keeps its plan. Depthwise and grouped convolutions keep their
// reduction whole: their weights per output tile are small, and the functional simulator's per-tile
// partial convolutions slice the channels of one group only.
std::vector<int64_t> conv_channel_tiles(const ConvSpec& cv, int64_t cg, int64_t unit) {
  std::vector<int64_t> v{cg};
  if (cv.groups != 1) return v;
  for (int64_t tc = round_up(cg / 2, unit); tc < v.back() && v.size() < 10; tc = round_up(tc / 2, unit)) {
    v.push_back(tc);
    if (tc <= unit) break;
  }
  return v;
}

void map_conv(Mapper& mp, const Node& n, const Kernel& k, TileKernel& t) {
  const HwSpec& hw = mp.hw;
  const ConvSpec& cv = k.conv;
  const Value* xv = n.inputs[static_cast<size_t>(cv.x)];
  const DType dt = device_dtype(xv->type.dtype, mp.fdt);
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  const int64_t cg = cv.c / cv.groups, og = cv.oc / cv.groups;
  const int64_t window = cv.kh * cv.kw;
  const int64_t r = cg * window, s = cv.oh * cv.ow;
  const bool depthwise = cv.groups > 1 && cg == 1 && og == 1;
  const int64_t ou = lane_unit(hw, dt);
  struct Cand {
    int64_t sn, so, ss, ns, os, ss_, tn, to, ts, tr;
    double compute, memory, total;
    int64_t dram, spad;
  };
  std::vector<Cand> cands;
  const int cp = mp.o.double_buffer ? 2 : 1;
  int64_t tile_buffers = static_cast<int64_t>(n.outputs.size());  // output-tile-sized operands (below)
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (static_cast<int>(i) != cv.x && static_cast<int>(i) != cv.w && n.inputs[i]) ++tile_buffers;
  // The plan of a candidate: its dims, loop order, cores and operands (the x operand's tile is the
  // im2col rows of ts pixels x tr reduction rows for each group the oc tile touches).
  auto fill = [&](const Cand& c, TileKernel& t) {
    t.dims = {{"n", cv.n, c.sn, c.ns, c.tn, 1, false},
              {"oc", cv.oc, c.so, c.os, c.to, ou, false},
              {"s", s, c.ss, c.ss_, c.ts, 1, false},
              {"r", r, 1, r, c.tr, 1, true}};
    t.order = {0, 1, 2, 3};
    t.cores = static_cast<int>(c.sn * c.so * c.ss);
    t.on_vector_unit = depthwise;
    auto add = [&](std::string role, const Value* v, bool out, std::vector<int> dims, DType sd, int copies, int64_t bytes) {
      t.operands.push_back(make_operand(mp, std::move(role), v, out, std::move(dims), sd, copies, bytes));
    };
    const int64_t gi = std::min(cv.groups, ceil_div(c.to, og) + 1);
    add("x", xv, false, {0, 2, 3}, dt, cp, c.ts * c.tr * gi * es);
    add("w", n.inputs[static_cast<size_t>(cv.w)], false, {1, 3}, dt, cp, c.to * c.tr * es);
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (static_cast<int>(i) != cv.x && static_cast<int>(i) != cv.w && n.inputs[i])
        add("epi", n.inputs[i], false, {0, 1, 2}, dt, cp, c.ts * c.to * es);
    add("acc", nullptr, false, {0, 1, 2}, DType::f32, 1, c.ts * c.to * 4);
    for (const Value* out : n.outputs) add("y", out, true, {0, 1, 2}, dt, cp, c.ts * c.to * es);
  };
  // the globals in the order the mapper has always made them (x, then y, then the others in `fill`)
  mp.global(xv);
  mp.global(n.outputs[0]);
  std::string why_none;
  const std::vector<int64_t> channel_tiles = conv_channel_tiles(cv, cg, ou);
  // The whole reduction when any split fits with it; otherwise every reduction tile, the fastest wins
  // (a smaller reduction tile leaves room for more output pixels per tile).
  for (size_t ci = 0; ci < channel_tiles.size() && !(ci == 1 && !cands.empty()); ++ci)
  for (int64_t sn : split_choices(cv.n, mp.cores_max))
    for (int64_t so : split_choices(ceil_div(cv.oc, ou), mp.cores_max / sn))
      for (int64_t ss : split_choices(s, mp.cores_max / (sn * so))) {
        Cand c{};
        c.sn = sn, c.so = so, c.ss = ss;
        c.ns = ceil_div(cv.n, sn);
        c.os = round_up(ceil_div(cv.oc, so), ou);
        c.ss_ = ceil_div(s, ss);
        c.tn = 1, c.to = c.os, c.ts = c.ss_;
        c.tr = channel_tiles[ci] * window;
        // per tile: im2col rows of the input (ts x tr per group the oc tile touches), the weights of
        // the oc tile's tr reduction rows, the output tile (fp32 accumulator, which holds the partial
        // sums across reduction tiles, and the stored copy)
        auto groups_in = [&](int64_t oct) { return std::min(cv.groups, ceil_div(oct, og) + 1); };
        // every output and epilogue operand (a bias, a residual) gets an output-tile buffer, as the
        // operands added below do; counting only one made AlexNet's biased convs overflow the plan
        auto spad = [&] {
          return cp * c.ts * c.tr * groups_in(c.to) * es + cp * c.to * c.tr * es + c.ts * c.to * 4 +
                 cp * c.ts * c.to * es * tile_buffers;
        };
        while (spad() > mp.p.usable_spad) {
          if (c.ts > 1) c.ts = ceil_div(c.ts, 2);
          else if (c.to > ou) c.to = round_up(c.to / 2, ou);
          else break;
        }
        if (spad() > mp.p.usable_spad) {
          why_none = fmt::format("one output pixel with {} channels and a reduction tile of {} needs {} bytes", c.to,
                                 c.tr, spad());
          continue;
        }
        c.spad = spad();
        const int64_t rt = ceil_div(r, c.tr);  // reduction tiles per output tile
        const int64_t tiles = c.ns * ceil_div(c.os, c.to) * ceil_div(c.ss_, c.ts);
        const int64_t macs_tile = c.ts * c.to * r;
        c.compute = depthwise ? static_cast<double>(tiles) * 2 * dataflow::vector_cycles(hw, VectorOp::mul, macs_tile)
                              : static_cast<double>(tiles * rt) * static_cast<double>(std::min(cv.groups, ceil_div(c.to, og))) *
                                    dataflow::matmul_cycles(hw, c.ts, c.tr, std::min(c.to, og), dt);
        // DRAM: what the timing engine will load and store for this plan (kernel_traffic walks the
        // same tiles: the x operand's im2col tile on every step, the weights while resident)
        TileKernel plan;
        plan.kind = TileKind::conv;
        fill(c, plan);
        const Traffic tr = kernel_traffic(plan);
        c.dram = tr.read + tr.write;
        c.memory = static_cast<double>(tr.read) / hw.dram_read_bytes_per_cycle() +
                   static_cast<double>(tr.write) / hw.dram_write_bytes_per_cycle();
        c.total = dataflow::overlap_cycles(hw, c.compute, c.memory);
        cands.push_back(c);
      }
  if (cands.empty()) map_error(n.name, fmt::format("conv: no split fits the scratchpad: tensor '{}' ({})", xv->name, why_none));
  std::sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
    if (std::abs(a.total - b.total) > 1e-9 * std::max(a.total, b.total)) return a.total < b.total;
    return a.sn * a.so * a.ss < b.sn * b.so * b.ss;
  });
  const Cand& c = cands[0];
  t.decision = fmt::format("best of {} splits: n{} oc{} s{} ({:.0f} cycles: compute {:.0f}{}, DRAM {:.0f})", cands.size(),
                           c.sn, c.so, c.ss, c.total, c.compute, depthwise ? " on the vector unit" : "", c.memory);
  if (c.tr < r)
    t.decision += fmt::format("; reduction in {} tiles of {} channels x {}x{} (no plan with the whole reduction of {} fits)",
                              ceil_div(r, c.tr), c.tr / window, cv.kh, cv.kw, r);
  fill(c, t);
  t.flops = 2.0 * static_cast<double>(cv.n * cv.oc * s * r) + vector_work(hw, k, cv.n * cv.oc, s).ops;
  t.dram_bytes = c.dram;
  t.estimate_cycles = c.total;
  t.vector_ops = vector_work(hw, k, 1, 1).per_point;
  if (depthwise) t.vector_ops[static_cast<size_t>(VectorOp::mul)] += static_cast<double>(r),
                 t.vector_ops[static_cast<size_t>(VectorOp::add)] += static_cast<double>(r);
}

// ---- vector (loop) kernels ------------------------------------------------------------------------

void map_vector(Mapper& mp, const Node& n, const Kernel& k, TileKernel& t) {
  const HwSpec& hw = mp.hw;
  const int64_t P = std::max<int64_t>(1, k.parallel_extent());
  const int64_t total = std::max<int64_t>(1, k.outer_count() * k.inner_count());
  const int64_t e = std::max<int64_t>(1, total / P);
  // Operands: bytes per p-point (those the p dim indexes), or whole per core (broadcast constants).
  struct Opnd {
    const Value* v;
    bool out;
    bool per_point;
    int64_t bytes_per_point, whole;
  };
  std::vector<Opnd> ops;
  DType dt = mp.fdt;
  auto consider = [&](const Value* v, bool out) {
    if (!v) return;
    // bytes as stored: padded to whole sticks or tiles
    const int64_t numel = shape_numel(v->type.shape);
    const int64_t stored = mp.p.globals[static_cast<size_t>(mp.global(v))].bytes();
    const bool per_point = numel >= P;
    ops.push_back({v, out, per_point, per_point ? ceil_div(stored, P) : 0, stored});
    if (out) dt = device_dtype(v->type.dtype, mp.fdt);
  };
  for (const Value* v : n.inputs) consider(v, false);
  for (const Value* v : n.outputs) consider(v, true);
  // When the parallel range is the innermost dim, per-core slices are whole sticks of it.
  const int64_t align = k.splits_inner() ? lane_unit(hw, dt) : row_unit(hw, dt);
  const int cp = mp.o.double_buffer ? 2 : 1;
  struct Cand {
    int64_t split, slice, tile;
    double compute, memory, total;
    int64_t dram, spad;
  };
  std::vector<Cand> cands;
  std::string why_none;
  for (int64_t sp : split_choices(ceil_div(P, align), mp.cores_max)) {
    Cand c{};
    c.split = sp;
    c.slice = round_up(ceil_div(P, sp), align);
    c.tile = c.slice;
    auto spad = [&] {
      int64_t b = 0;
      for (const Opnd& o : ops) b += o.per_point ? cp * c.tile * o.bytes_per_point : o.whole;
      return b;
    };
    while (spad() > mp.p.usable_spad && c.tile > align) c.tile = round_up(c.tile / 2, align);
    if (spad() > mp.p.usable_spad) {
      why_none = fmt::format("{} point(s) need {} bytes", c.tile, spad());
      continue;
    }
    c.spad = spad();
    int64_t reads = 0, writes = 0;
    for (const Opnd& o : ops) {
      const int64_t b = o.per_point ? c.slice * o.bytes_per_point * sp : o.whole * sp;
      (o.out ? writes : reads) += std::min(b, o.per_point ? P * o.bytes_per_point : b);
    }
    c.dram = reads + writes;
    c.compute = vector_work(hw, k, c.slice, e).cycles;
    c.memory = static_cast<double>(reads) / hw.dram_read_bytes_per_cycle() +
               static_cast<double>(writes) / hw.dram_write_bytes_per_cycle();
    c.total = dataflow::overlap_cycles(hw, c.compute, c.memory);
    cands.push_back(c);
  }
  if (cands.empty()) {
    std::string biggest;
    int64_t most = -1;
    for (const Opnd& o : ops)
      if (o.bytes_per_point > most) most = o.bytes_per_point, biggest = o.v->name;
    map_error(n.name, fmt::format("no tile fits the scratchpad ({} usable): tensor '{}' ({})", mp.p.usable_spad, biggest,
                                  why_none));
  }
  std::sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
    if (std::abs(a.total - b.total) > 1e-9 * std::max(a.total, b.total)) return a.total < b.total;
    return a.split < b.split;
  });
  const Cand& c = cands[0];
  t.decision = fmt::format("best of {} splits: p{} ({:.0f} cycles: vector {:.0f}, DRAM {:.0f})", cands.size(), c.split,
                           c.total, c.compute, c.memory);
  t.dims = {{"p", P, c.split, c.slice, c.tile, align, false}, {"e", e, 1, e, e, 1, false}};
  t.order = {0, 1};
  t.cores = static_cast<int>(c.split);
  t.on_vector_unit = true;
  for (const Opnd& o : ops) {
    Operand op;
    op.role = o.out ? "out" : "in";
    op.global = mp.global(o.v);
    op.out = o.out;
    op.dims = o.per_point ? std::vector<int>{0, 1} : std::vector<int>{1};
    op.spad_dtype = device_dtype(o.v->type.dtype, mp.fdt);
    op.copies = o.per_point ? cp : 1;
    op.tile_bytes = o.per_point ? c.tile * o.bytes_per_point : o.whole;
    op.fanout = o.per_point ? 1 : static_cast<int>(std::min<int64_t>(
                                      c.split, hw.interconnect.broadcast_limit > 0 ? hw.interconnect.broadcast_limit : c.split));
    t.operands.push_back(op);
  }
  t.flops = vector_work(hw, k, P, e).ops;
  t.dram_bytes = c.dram;
  t.estimate_cycles = c.total;
  t.vector_ops = vector_work(hw, k, 1, e).per_point;  // per p-point
}

// ---- allocation -----------------------------------------------------------------------------------

// Scratchpad offsets: every tile buffer of a kernel is live for the whole kernel (each kernel starts
// from an empty scratchpad: values cross kernels through DRAM), so they are packed in order, aligned.
void allocate_spad(TileKernel& t, const HwSpec& hw, int64_t usable) {
  const int64_t align = std::max<int64_t>(1, hw.layout.alignment_bytes);
  int64_t at = 0;
  for (Operand& op : t.operands) {
    op.spad_offset = at;
    at = round_up(at + op.copies * op.tile_bytes, align);
  }
  t.spad_peak = at;
  if (at > usable) {
    const Operand* big = &t.operands[0];
    for (const Operand& op : t.operands)
      if (op.copies * op.tile_bytes > big->copies * big->tile_bytes) big = &op;
    map_error(t.node, fmt::format("the tiles need {} bytes of scratchpad per core, {} usable (largest: {} tile of {} "
                                  "bytes x{})",
                                  at, usable, big->role, big->tile_bytes, big->copies));
  }
}

}  // namespace

DType default_float_dtype(const HwSpec& hw) { return hw.supports(DType::f16) ? DType::f16 : DType::bf16; }

// The mapper's state between the stages: the Mapper (the program so far, the global of every value,
// the layout's choices), over its own copies of the HwSpec and options.
struct TileMapping::Impl {
  std::shared_ptr<const HwSpec> hw;
  MapOptions o;
  Mapper mp;
  Impl(const KernelModule& m, const HwSpec& h, const MapOptions& opts, DType fdt)
      : hw(std::make_shared<const HwSpec>(h)), o(opts), mp{m, *hw, o, fdt, {}, {}, {}, 0} {}
};

TileMapping::TileMapping(const KernelModule& m, const HwSpec& hw, const MapOptions& o) {
  const DType fdt = o.float_dtype.value_or(default_float_dtype(hw));
  if (!hw.supports(fdt))
    throw Error(Location{.pass = "tile"}, fmt::format("{} does not store {} (its dtypes: see the hardware file {})", hw.name,
                                                      dtype_name(fdt), hw.origin));
  impl_ = std::make_unique<Impl>(m, hw, o, fdt);
}

TileMapping::~TileMapping() = default;

// The physical dim order of a matmul result the kernel level stores through c strides (attention
// heads written straight into the merged [T, H·D] layout): the result [batch..., M, N] grouped into
// batch, M and N dims, each group dense, its innermost stride the MatmulSpec's; the dims ordered by
// stride, outermost first (a unit dim just inside its left neighbour). Empty when that order is
// row-major or the strides are not a dense permutation of the shape (then the declaration stays
// row-major and the KTIR export's view check names the mismatch).
std::vector<int64_t> result_perm(const Shape& s, const MatmulSpec& mm) {
  const size_t r = s.size();
  if (r == 0 || (mm.c_batch == 0 && mm.c_m == 0 && mm.c_n == 0)) return {};
  std::vector<int64_t> st(r, 0);
  // groups from the innermost dim: N's dims multiply to n, M's to m, then batch; unit dims left over
  // anywhere have no stride that matters
  size_t d = r;
  for (const auto& [extent, inner] : {std::pair{mm.n, mm.c_n}, std::pair{mm.m, mm.c_m}, std::pair{mm.batch, mm.c_batch}}) {
    int64_t prod = 1, stride = inner;
    while (d > 0 && prod < extent) {
      --d;
      st[d] = stride;
      stride *= s[d];
      prod *= s[d];
    }
    if (prod != extent) return {};
  }
  for (size_t i = 0; i < d; ++i)
    if (s[i] != 1) return {};
  std::vector<double> key(r, 0);
  double left = std::numeric_limits<double>::infinity();  // a unit dim stays just inside its left neighbour
  for (size_t i = 0; i < r; ++i) {
    key[i] = s[i] == 1 ? left : static_cast<double>(st[i]);
    left = key[i];
  }
  std::vector<int64_t> perm(r);
  for (size_t i = 0; i < r; ++i) perm[i] = static_cast<int64_t>(i);
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) { return key[static_cast<size_t>(a)] > key[static_cast<size_t>(b)]; });
  // the order must reproduce the strides densely
  int64_t dense = 1;
  for (size_t i = r; i-- > 0;) {
    const size_t q = static_cast<size_t>(perm[i]);
    if (s[q] != 1 && st[q] != dense) return {};
    dense *= s[q];
  }
  for (size_t i = 0; i < r; ++i)
    if (perm[i] != static_cast<int64_t>(i)) return perm;
  return {};
}

const TileProgram& TileMapping::program() const { return impl_->mp.p; }

TileProgram TileMapping::take() { return std::move(impl_->mp.p); }

std::string TileMapping::layout() {
  Mapper& mp = impl_->mp;
  const KernelModule& m = mp.m;
  const HwSpec& hw = mp.hw;
  const MapOptions& o = mp.o;
  // Activations between convolutions are channels-last (the kernel level's choice), so the channels
  // are the stick (torch-spyre's layout rule for convolutions); everything else row-major. The choices
  // apply as each global is created (the inputs here, the rest as the plan stage meets them).
  for (const auto& np : m.graph->nodes()) {
    if (!is_kernel_node(*np)) continue;
    const Kernel& k = m.kernels.at(static_cast<size_t>(np->attr_i("kernel")));
    if (k.kind != KernelKind::conv) continue;
    if (k.conv.x_nhwc) mp.perm_of[np->inputs[static_cast<size_t>(k.conv.x)]] = {0, 2, 3, 1};
    if (k.conv.y_nhwc) mp.perm_of[np->outputs[0]] = {0, 2, 3, 1};
    // weights [OC, C/g, KH, KW] as the matmul's B: the output channels are the stick
    mp.perm_of[np->inputs[static_cast<size_t>(k.conv.w)]] = {1, 2, 3, 0};
  }
  // A matmul result stored through c strides is declared in that order (the KTIR export's memory
  // views and the padding follow the declaration).
  for (const Kernel& k : m.kernels) {
    if (k.kind != KernelKind::matmul || static_cast<size_t>(k.mm.c) >= k.args.size()) continue;
    const Value* cv = m.graph->find_value(k.args[static_cast<size_t>(k.mm.c)].name);
    if (!cv || mp.perm_of.count(cv)) continue;
    std::vector<int64_t> perm = result_perm(cv->type.shape, k.mm);
    if (!perm.empty()) mp.perm_of[cv] = std::move(perm);
  }
  mp.cores_max = static_cast<int>(o.max_cores > 0 ? std::min<int64_t>(o.max_cores, hw.cores) : hw.cores);
  TileProgram& p = mp.p;
  p.name = o.name.empty() ? m.graph->name : o.name;
  p.target = hw.name;
  p.hw = impl_->hw;
  p.float_dtype = mp.fdt;
  p.dl16 = mp.fdt == DType::f16 && hw.f16_format == "dl16";
  p.cores = hw.cores;
  p.usable_spad = hw.usable_scratchpad_bytes();
  for (const Value* v : m.graph->inputs) {
    const int gi = mp.global(v);
    p.globals[static_cast<size_t>(gi)].kind = Global::Kind::input;
    p.inputs.push_back(gi);
  }
  return fmt::format("{} storage{}; {} tensors with a non-row-major layout", dtype_name(mp.fdt), p.dl16 ? " (DL16)" : "",
                     mp.perm_of.size());
}

std::string TileMapping::plan() {
  Mapper& mp = impl_->mp;
  const KernelModule& m = mp.m;
  TileProgram& p = mp.p;
  const Graph& g = *m.graph;
  int host = 0, relayouts = 0;
  for (const auto& np : g.nodes()) {
    const Node& n = *np;
    TileKernel t;
    t.name = fmt::format("t{}", p.kernels.size());
    t.node = n.name;
    if (is_kernel_node(n)) {
      const int ki = static_cast<int>(n.attr_i("kernel"));
      const Kernel& k = m.kernels.at(static_cast<size_t>(ki));
      t.kernel = ki;
      t.sources = k.sources;
      t.bytes_unfused = k.bytes_unfused;
      t.bytes_fused = k.bytes_fused;
      bool static_shapes = true;
      for (const Value* v : n.inputs)
        if (v) static_shapes = static_shapes && shape_known(v->type.shape);
      for (const Value* v : n.outputs) static_shapes = static_shapes && shape_known(v->type.shape);
      if (!static_shapes) {
        t.kind = TileKind::host;
      } else if (k.kind == KernelKind::matmul) {
        t.kind = TileKind::matmul;
        map_matmul(mp, n, k, t);
      } else if (k.kind == KernelKind::conv) {
        t.kind = TileKind::conv;
        map_conv(mp, n, k, t);
      } else {
        t.kind = TileKind::vector;
        map_vector(mp, n, k, t);
      }
    } else {
      t.kind = TileKind::host;
      t.sources = {n.name};
    }
    if (t.kind == TileKind::host) {
      t.dims.clear();
      t.operands.clear();
      t.cores = 1;
      for (const Value* v : n.inputs)
        if (v) t.host_inputs.push_back(mp.global(v));
      for (const Value* v : n.outputs)
        if (v) t.host_outputs.push_back(mp.global(v));
      for (int gi : t.host_inputs) t.dram_bytes += p.globals[static_cast<size_t>(gi)].bytes();
      for (int gi : t.host_outputs) t.dram_bytes += p.globals[static_cast<size_t>(gi)].bytes();
      t.decision = is_kernel_node(n) ? "runs on the host: shapes known only when it runs"
                                     : fmt::format("runs on the host: no tile form for {}", n.op_name());
    }
    host += t.kind == TileKind::host;
    for (TileKernel& b : mp.before) {
      ++relayouts;
      b.name = fmt::format("t{}", p.kernels.size());
      p.kernels.push_back(std::move(b));
    }
    mp.before.clear();
    t.name = fmt::format("t{}", p.kernels.size());
    p.kernels.push_back(std::move(t));
  }
  for (const Value* v : g.outputs) {
    const int gi = mp.global(v);
    if (p.globals[static_cast<size_t>(gi)].kind == Global::Kind::temp) p.globals[static_cast<size_t>(gi)].kind = Global::Kind::output;
    p.outputs.push_back(gi);
  }
  return fmt::format("{} tile kernels ({} host steps, {} re-layout copies)", p.kernels.size(), host, relayouts);
}

std::string TileMapping::allocate() {
  Mapper& mp = impl_->mp;
  TileProgram& p = mp.p;
  for (TileKernel& t : p.kernels)
    if (t.kind != TileKind::host) allocate_spad(t, mp.hw, p.usable_spad);
  // DRAM: constants and inputs first, for the whole program; temps and outputs by liveness.
  const int steps = static_cast<int>(p.kernels.size());
  std::vector<int> first(p.globals.size(), steps), last(p.globals.size(), -1);
  for (int s = 0; s < steps; ++s) {
    const TileKernel& t = p.kernels[static_cast<size_t>(s)];
    auto touch = [&](int gi) {
      if (gi < 0) return;
      first[static_cast<size_t>(gi)] = std::min(first[static_cast<size_t>(gi)], s);
      last[static_cast<size_t>(gi)] = std::max(last[static_cast<size_t>(gi)], s);
    };
    for (const Operand& op : t.operands) touch(op.global);
    for (int gi : t.host_inputs) touch(gi);
    for (int gi : t.host_outputs) touch(gi);
  }
  std::vector<BufferRequest> reqs;
  std::vector<int> req_global;
  for (size_t gi = 0; gi < p.globals.size(); ++gi) {
    const Global& gl = p.globals[gi];
    if (gl.bytes() <= 0) continue;  // dynamic shapes: allocated by the host step when it runs
    BufferRequest r;
    r.bytes = static_cast<size_t>(gl.bytes());
    const bool whole = gl.kind != Global::Kind::temp;
    r.first = whole ? -1 : std::min(first[gi], steps);
    r.last = gl.kind == Global::Kind::constant || gl.kind == Global::Kind::input || gl.kind == Global::Kind::output
                 ? steps
                 : std::max(last[gi], r.first);
    reqs.push_back(r);
    req_global.push_back(static_cast<int>(gi));
  }
  const ArenaPlan plan = plan_arena(reqs, 128);
  for (size_t i = 0; i < reqs.size(); ++i) p.globals[static_cast<size_t>(req_global[i])].offset = static_cast<int64_t>(plan.offsets[i]);
  p.dram_peak = static_cast<int64_t>(plan.size);
  int64_t spad = 0;
  for (const TileKernel& t : p.kernels) spad = std::max(spad, t.spad_peak);
  return fmt::format("scratchpad peak {} bytes per core; DRAM {} bytes", spad, p.dram_peak);
}

TileProgram map_to_tiles(const KernelModule& m, const HwSpec& hw, const MapOptions& o) {
  TileMapping mapping(m, hw, o);
  mapping.layout();
  mapping.plan();
  mapping.allocate();
  TileProgram p = mapping.take();
  verify_tile_program(p);
  return p;
}

}  // namespace tessel::dataflow
