// The analytical cost formulas of a dataflow target, in cycles of its clock. One place: the mapper
// (work division, tiling) and the event-driven engine (sim_engine.h) both call these.
// Every formula and its source is in docs/dataflow-cost.md.
#pragma once

#include <cstdint>

#include "tessel/hw/hw.h"

namespace tessel::dataflow {

// The chip description (hw/) by its own names.
using namespace tessel::hw;

// ---- matrix unit ---------------------------------------------------------------------------------

// SCALE-Sim's closed form for ONE weight-stationary R x C systolic array (1 MAC per PE per cycle,
// k_per_pe > 1 when each PE reduces several K elements per cycle): an [M,K] x [K,N] product takes
//   ceil(K / (R * k_per_pe)) * ceil(N / C) weight folds of (fill + M + drain) cycles each.
// With fill = 2S - 1, drain = S - 1 and R = C = S this is (2S + S + M - 2) * ceil(N/S) * ceil(K/S).
double systolic_ws_cycles(int64_t R, int64_t C, double fill, double drain, int64_t M, int64_t K, int64_t N,
                          double k_per_pe = 1);

enum class Orientation { as_given, best };

struct MatmulCost {
  double cycles = 0;      // on one core's matrix unit, all arrays, efficiency applied
  int64_t folds = 0;      // folds of the stationary operand: weights (ws), outputs (os) or inputs (is)
  double efficiency = 1;  // sustained_fraction x small-M derate
  bool swapped = false;   // computed as (B^T A^T)^T: N streamed, M held (Orientation::best only)
  double macs = 0;        // M * K * N
};

// An [M,K] x [K,N] tile on one core's matrix unit in dtype `t`:
//  weight-stationary: M rounded up to whole passes (pass_rows) streams through each fold; the folds
//    ceil(K / (rows * k_per_pe)) * ceil(N / cols) are spread over the core's `count` arrays;
//  output-stationary: ceil(M / rows) * ceil(N / cols) output blocks, each streaming ceil(K / k_per_pe);
//  input-stationary: ceil(K / (rows * k_per_pe)) * ceil(M / cols) input blocks, each streaming N;
//  each fold costs fill + streamed + drain cycles (derived_fill_cycles: SCALE-Sim's per-fold demand);
//  then divided by the efficiency: sustained_fraction, times sqrt(passes / (min_rows / pass_rows)) when
//    the streamed rows are fewer than min_rows_full_efficiency.
// k_per_pe = macs_per_pe() * dtype_rate[t]. Throws an unsupported Error when the matrix unit lacks t.
MatmulCost matmul_cost(const HwSpec& hw, int64_t M, int64_t K, int64_t N, DType t,
                       Orientation o = Orientation::best);
inline double matmul_cycles(const HwSpec& hw, int64_t M, int64_t K, int64_t N, DType t,
                            Orientation o = Orientation::best) {
  return matmul_cost(hw, M, K, N, t, o).cycles;
}

// ---- vector unit ---------------------------------------------------------------------------------

// n elements through the vector unit: latency + ceil(n / elements_per_cycle[op]). 0 for n = 0.
double vector_cycles(const HwSpec& hw, VectorOp op, int64_t n);

// ---- DRAM <-> scratchpad ---------------------------------------------------------------------------

enum class DmaDir { read, write };  // read: DRAM -> scratchpad (load); write: scratchpad -> DRAM (store)

// DRAM bytes per cycle available to all transfers together: read or write bandwidth / clock, times
// mixed_efficiency when reads and writes are in flight at the same time.
double dram_bytes_per_cycle(const HwSpec& hw, DmaDir dir, bool mixed);
// One transfer of `bytes` sharing DRAM with `sharers` - 1 others (equal shares):
//   latency + bytes * sharers / dram_bytes_per_cycle(dir, mixed).
double dma_cycles(const HwSpec& hw, int64_t bytes, DmaDir dir, int sharers = 1, bool mixed = false);

// ---- interconnect -----------------------------------------------------------------------------------

// Hops between two cores: ring (bidirectional, shortest way) min(|s-d|, cores-|s-d|); mesh Manhattan
// distance on mesh_shape (row-major core numbering); 0 for the same core; -1 for topology none.
int hops(const HwSpec& hw, int src, int dst);
// `bytes` from core src to core dst over `h` hops, cut-through: h * hop_latency + bytes / link bytes
// per cycle. Topology none (h < 0): through DRAM, a store then a load (2 latencies + write + read).
double transfer_cycles(const HwSpec& hw, int64_t bytes, int h);
// Cycles to add `elements` partial sums of `elem_bytes` each into a neighbour `h` hops away on the
// reduce path (one step of a K-split reduction):
//   ring paths: h * (hop_latency + elements * c), c = reduce_cycles_per_element_hop, or
//               elem_bytes / bytes_per_cycle when the file gives none;
//   dram:       2 * latency + bytes / write bw + bytes / read bw + vector add of `elements`.
double reduce_step_cycles(const HwSpec& hw, int64_t elements, int elem_bytes, int h);
// A K-split over p cores (K-neighbours adjacent): the p partial sums of `elements` each are reduced
// as a chain of p - 1 one-hop steps, (p - 1) * reduce_step_cycles(elements, elem_bytes, 1) — on the
// dram path all p - 1 partials share DRAM bandwidth, which gives the same sum. 0 when p <= 1.
double reduce_cycles(const HwSpec& hw, int64_t elements, int p, int elem_bytes);

// ---- whole kernels ---------------------------------------------------------------------------------

double kernel_overhead_cycles(const HwSpec& hw);
// The overlap model: T = C + M - overlap_factor * min(C, M) (1 = perfect overlap: max(C, M)).
double overlap_cycles(const HwSpec& hw, double compute, double memory);

struct Roofline {
  double compute_s = 0;  // flops / peak FLOP/s of the whole chip in t
  double memory_s = 0;   // dram bytes / max(read, write) bandwidth
  double bound_s = 0;    // max of the two: no schedule on this hardware is faster
  bool memory_bound() const { return memory_s > compute_s; }
};
// Throws an unsupported Error when flops > 0 and the matrix unit lacks t.
Roofline roofline(const HwSpec& hw, double flops, double dram_bytes, DType t);

}  // namespace tessel::dataflow
