// The matmul floor of a model: the time of its fp32 matmuls alone through oneDNN, at a given thread
// count (the bar of the compiled backend: "≤ 1.15 × the floor"). bench/matmul_floor.md.
#pragma once

#include <string>
#include <vector>

namespace tessel {

class Graph;

struct FloorResult {
  int matmuls = 0;
  int convolutions = 0;  // 2-D fp32 convolutions, timed after the matmuls in the same pass
  double flops = 0;  // 2·batch·M·N·K summed over the matmuls, 2·N·OC·OH·OW·(C/groups)·KH·KW over the convolutions
  // One sample per pass of all matmuls back to back.
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
  std::vector<std::string> shapes;  // one per matmul: "[128x768]·[768x2304] packed  /qkv/MatMul"
  int threads = 0;
  std::string impls;  // oneDNN implementations used, e.g. "brg:avx512_core x6"
  double gflops() const { return median_ms > 0 ? flops / median_ms / 1e6 : 0; }
};

// Finds every fp32 dot_general node of `core_graph` (a graph after the "core" pipeline), builds one
// cpu::Matmul per node over contiguous operands of its shapes (dot_general_matmul; a constant rhs,
// also through reshape/broadcast_in_dim, is pre-packed as the backend packs it), and one cpu::Conv2d
// per conv kernel the CPU lowering makes of it (its layouts and weights, no epilogue), and times running
// all of them back to back with `threads` OpenMP threads: one warm-up pass, then `iters` passes.
// The thread count in effect before the call is restored.
FloorResult measure_matmul_floor(const Graph& core_graph, int threads, int iters);

// The same for a model (folder or .onnx file; test_data_set_0's inputs fix symbolic dims): imports
// it and runs the "core" pipeline first.
FloorResult measure_model_matmul_floor(const std::string& model, int threads, int iters);

// One line: "6 matmuls, 2.72 GFLOP, median 4.61 ms (p10 4.58, p90 4.70), 590 GFLOP/s, 2 threads".
std::string floor_summary(const FloorResult& r);

}  // namespace tessel
