// The analytical cost formulas (documented with their sources in docs/dataflow-cost.md).
#include "tessel/targets/dataflow/cost.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "tessel/support/error.h"

namespace tessel::dataflow {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// ceil(a / b) for a real block size b (k_per_pe may be fractional in a user file); exact for integers.
int64_t ceil_div(int64_t a, double b) {
  const double q = double(a) / b;
  const double r = std::round(q);
  return std::abs(q - r) < 1e-9 ? int64_t(r) : int64_t(std::ceil(q));
}

double k_per_pe(const HwSpec& hw, DType t) {
  auto it = hw.matrix.dtype_rate.find(t);
  if (it == hw.matrix.dtype_rate.end())
    unsupported("{}: the matrix unit has no rate for {} (matrix_unit/dtype_rate)", hw.name, dtype_name(t));
  return hw.matrix.macs_per_pe() * it->second;
}

// One orientation: `streamed` rows go through the arrays, `held` is the weight side.
MatmulCost oriented(const HwSpec& hw, int64_t streamed, int64_t K, int64_t held, double kpe) {
  const MatrixUnitSpec& m = hw.matrix;
  MatmulCost c;
  c.macs = double(streamed) * double(K) * double(held);
  if (streamed <= 0 || K <= 0 || held <= 0) return c;
  const int64_t passes = ceil_div(streamed, m.pass_rows);
  double per_array = 0;
  // Folds of the array over the stationary operand, each fill + T + drain cycles (SCALE-Sim's
  // per-fold demand, derived_fill_cycles): T is what streams past the stationary block.
  switch (m.dataflow) {
    case Dataflow::weight_stationary:  // weights K x held stay; the streamed rows pass (in passes)
      c.folds = ceil_div(K, double(m.rows) * kpe) * ceil_div(held, m.cols);
      per_array = double(ceil_div(c.folds, m.count)) * (m.fill_cycles + double(passes * m.pass_rows) + m.drain_cycles);
      break;
    case Dataflow::output_stationary:  // a streamed x held block of outputs stays; K passes
      c.folds = ceil_div(streamed, m.rows) * ceil_div(held, m.cols);
      per_array = double(ceil_div(c.folds, m.count)) * (m.fill_cycles + double(ceil_div(K, kpe)) + m.drain_cycles);
      break;
    case Dataflow::input_stationary:  // inputs K x streamed stay; the held side's columns pass
      c.folds = ceil_div(K, double(m.rows) * kpe) * ceil_div(streamed, m.cols);
      per_array = double(ceil_div(c.folds, m.count)) *
                  (m.fill_cycles + double(ceil_div(held, m.pass_rows) * m.pass_rows) + m.drain_cycles);
      break;
  }
  c.efficiency = m.sustained_fraction;
  if (m.min_rows_full_efficiency > 0 && streamed < m.min_rows_full_efficiency) {
    const double full_passes = double(m.min_rows_full_efficiency) / double(m.pass_rows);
    c.efficiency *= std::sqrt(std::min(1.0, double(passes) / full_passes));
  }
  c.cycles = per_array / c.efficiency;
  return c;
}

}  // namespace

double systolic_ws_cycles(int64_t R, int64_t C, double fill, double drain, int64_t M, int64_t K, int64_t N,
                          double kpe) {
  if (M <= 0 || K <= 0 || N <= 0) return 0;
  return double(ceil_div(K, double(R) * kpe) * ceil_div(N, C)) * (fill + double(M) + drain);
}

MatmulCost matmul_cost(const HwSpec& hw, int64_t M, int64_t K, int64_t N, DType t, Orientation o) {
  const double kpe = k_per_pe(hw, t);
  MatmulCost c = oriented(hw, M, K, N, kpe);
  if (o == Orientation::best) {
    MatmulCost s = oriented(hw, N, K, M, kpe);
    if (s.cycles < c.cycles) {
      s.swapped = true;
      c = s;
    }
  }
  return c;
}

double vector_cycles(const HwSpec& hw, VectorOp op, int64_t n) {
  if (n <= 0) return 0;
  return hw.vector.latency_cycles + std::ceil(double(n) / hw.vector.rate(op));
}

double dram_bytes_per_cycle(const HwSpec& hw, DmaDir dir, bool mixed) {
  const double bw = dir == DmaDir::read ? hw.dram_read_bytes_per_cycle() : hw.dram_write_bytes_per_cycle();
  return mixed ? bw * hw.dram.mixed_efficiency : bw;
}

double dma_cycles(const HwSpec& hw, int64_t bytes, DmaDir dir, int sharers, bool mixed) {
  if (bytes <= 0) return 0;
  return hw.dram.latency_cycles + double(bytes) * std::max(1, sharers) / dram_bytes_per_cycle(hw, dir, mixed);
}

int hops(const HwSpec& hw, int src, int dst) {
  const InterconnectSpec& ic = hw.interconnect;
  if (src == dst) return 0;
  switch (ic.topology) {
    case Topology::none: return -1;
    case Topology::ring: {
      const int d = std::abs(src - dst);
      return std::min<int>(d, int(hw.cores) - d);
    }
    case Topology::mesh: {
      const int cols = int(ic.mesh_shape.at(1));
      return std::abs(src / cols - dst / cols) + std::abs(src % cols - dst % cols);
    }
  }
  return -1;
}

double transfer_cycles(const HwSpec& hw, int64_t bytes, int h) {
  if (h == 0 || bytes <= 0) return 0;
  if (h < 0 || hw.interconnect.topology == Topology::none)
    return dma_cycles(hw, bytes, DmaDir::write) + dma_cycles(hw, bytes, DmaDir::read);
  return h * hw.interconnect.hop_latency_cycles + double(bytes) / hw.interconnect.bytes_per_cycle;
}

double reduce_step_cycles(const HwSpec& hw, int64_t elements, int elem_bytes, int h) {
  if (elements <= 0 || h == 0) return 0;
  const InterconnectSpec& ic = hw.interconnect;
  if (ic.reduce_path == ReducePath::dram || h < 0) {
    const int64_t bytes = elements * elem_bytes;
    return dma_cycles(hw, bytes, DmaDir::write) + dma_cycles(hw, bytes, DmaDir::read) +
           vector_cycles(hw, VectorOp::add, elements);
  }
  const double c = ic.reduce_cycles_per_element_hop > 0 ? ic.reduce_cycles_per_element_hop
                                                        : double(elem_bytes) / ic.bytes_per_cycle;
  return h * (ic.hop_latency_cycles + double(elements) * c);
}

double reduce_cycles(const HwSpec& hw, int64_t elements, int p, int elem_bytes) {
  if (p <= 1) return 0;
  return (p - 1) * reduce_step_cycles(hw, elements, elem_bytes, 1);
}

double kernel_overhead_cycles(const HwSpec& hw) { return hw.kernel_overhead_ns * hw.clock_ghz; }

double overlap_cycles(const HwSpec& hw, double compute, double memory) {
  return compute + memory - hw.overlap_factor * std::min(compute, memory);
}

Roofline roofline(const HwSpec& hw, double flops, double dram_bytes, DType t) {
  Roofline r;
  if (flops > 0) {
    const double peak = hw.peak_flops(t);
    if (peak <= 0) unsupported("{}: the matrix unit has no rate for {} (matrix_unit/dtype_rate)", hw.name, dtype_name(t));
    r.compute_s = flops / peak;
  }
  r.memory_s = dram_bytes / hw.peak_dram_bytes_per_second();
  r.bound_s = std::max(r.compute_s, r.memory_s);
  return r;
}

}  // namespace tessel::dataflow
