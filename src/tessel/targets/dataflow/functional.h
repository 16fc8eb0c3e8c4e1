// The functional simulator of the tile level (docs/sim.md, "Functional simulation"): runs a
// TileProgram with real values the way the target computes them. Every global holds values its
// device dtype can represent (inputs and constants are rounded to it on entry, every kernel's results
// when they are stored: round to nearest even into f16/bf16, kept in fp32 shadow arrays so the CPU
// kernels compute on them); compute and accumulation are fp32. Kernels run in program order, inside
// a kernel core by core and tile by tile along the kernel's loop order: vector kernels call the
// generated function on each tile's range of p, matmul kernels accumulate every (b, m, n) tile over
// its k tiles and the K-split cores in fp32 (oneDNN on sub-blocks), then run the epilogue; conv
// kernels run as one oneDNN convolution per kernel (their tiles are checked, not executed one by
// one). Host steps run the node's reference kernel on the host. Before a kernel runs, its tiles are
// checked to cover its iteration space exactly once: a point covered twice or never is an Error
// naming the kernel.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/kernel/kernel.h"
#include "tessel/targets/cpu/toolchain.h"
#include "tessel/tile/tile.h"

namespace tessel::dataflow {

// The chip description (hw/) by its own names, and the tile level (tile/) it maps to (`Dim` is the tile level's).
using namespace tessel::hw;
using namespace tessel::tile;
using tile::Dim;

// The generated kernels of one (program, module) pair once built: a caller that runs the same program
// many times (tessel.compile's dataflow targets, every call) keeps one and passes it back, so a call does
// not generate, hash and load the kernels' C++ again.
struct FunctionalKernels {
  std::shared_ptr<cpu::SharedObject> so;
  std::vector<void*> fns;  // per kernel-level kernel: its generated function, or null
  bool built = false;
};

struct FunctionalOptions {
  int threads = 1;                  // OpenMP threads for the library calls (tiles run one by one)
  cpu::ToolchainOptions toolchain;  // how the generated kernels are compiled (cached on disk)
  bool keep_values = false;         // FunctionalResult::values: every value a kernel or host step produced
  // When set: the kernels built for this same program by an earlier call (filled by the first).
  std::shared_ptr<FunctionalKernels> kernels;
};

struct FunctionalResult {
  std::vector<Tensor> outputs;   // one per graph output, in the model's dtype (values the device dtype holds)
  int64_t tiles_executed = 0;    // vector and matmul tiles run (a conv kernel counts its tiles as checked)
  int64_t host_steps = 0;
  int64_t relayouts = 0;         // re-layout copies (no change to the logical values)
  double seconds = 0;            // run_functional's wall time, compiling the generated kernels included
  double compile_seconds = 0;    // of which: generating and building (or loading) the kernels' shared object
  // Range of the device dtype: non-zero values that rounding flushed to zero, finite values that
  // became inf; for inputs and constants on entry, and for the results stored by kernels and host
  // steps (with the first tile kernel whose results did, as "t3 (kernel k2, node ...)").
  int64_t entry_flushed = 0, entry_overflowed = 0;
  int64_t flushed = 0, overflowed = 0;
  std::string first_flush, first_overflow;
  // With keep_values: (value name, its buffer) for every value a tile kernel or host step produced, in
  // the graph's value order; a buffer holds the kernel level's elements (dense, in the value's
  // physical order: a result stored transposed is in its stored order). The KTIR check compares with them.
  std::vector<std::pair<std::string, Tensor>> values;
};

// Runs `p` (mapped from `m`) on `inputs` (one per graph input of m.graph, in order). Throws
// tessel::Error naming the tile kernel (and its kernel-level kernel or node) on a coverage error, a
// dim that does not match its kernel, a value nothing produced, or a failing host step.
FunctionalResult run_functional(const TileProgram& p, const KernelModule& m, const std::vector<Tensor>& inputs,
                                const FunctionalOptions& o = {});

// Round to nearest even to `t` (f16 or bf16; any other type returns x), as a float. Overflow gives
// inf, NaN stays NaN, subnormals are kept.
float round_to_dtype(float x, DType t);

// The same over an array in place.
void round_to_dtype(float* data, int64_t n, DType t);

// Round to nearest even to IBM's DLFloat16 (1 sign, 6 exponent bits with bias 31, 9 fraction bits,
// no subnormals): values below 2^-30 go to 0 or 2^-30 (whichever is nearer), values past the largest
// finite one, (2 - 2^-8) * 2^32, become inf; NaN stays NaN.
float round_to_dl16(float x);

// The iteration space of one tile kernel as its cores and tiles divide it: for dim d and the core
// coordinate c along d, the tiles [lo, hi) that core steps through. Throws tessel::Error naming the
// kernel when a dim's split, slice or tile is invalid or when the tiles do not cover every point of
// the dim exactly once (which, as every core runs every combination of its per-dim tiles, is exactly
// when the whole space is covered once).
struct TileRange {
  int64_t lo = 0, hi = 0;
};
std::vector<std::vector<std::vector<TileRange>>> tile_ranges(const TileKernel& k);

}  // namespace tessel::dataflow
