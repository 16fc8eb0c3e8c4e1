// The tile level (docs/ir/tile.md): the kernel level mapped onto one dataflow target. For every kernel
// it records what the target's compiler decides before execution and a GPU leaves to caches and
// runtime: the device layout of every tensor in DRAM (padded to whole sticks or tiles) and its DRAM
// offset, how the kernel's iteration space is divided over the cores (which core computes which
// slice, K-splits included), the tile each core brings into its scratchpad per step, the scratchpad
// offset of every tile buffer (double-buffered where loads overlap compute), and the loop order.
// What it no longer records: the global iteration space as one loop (each core sees its slice).
// Nodes the target cannot run (data-dependent shapes, ops without a tile form) are host steps.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/kernel/kernel.h"
#include "tessel/hw/hw.h"

namespace tessel::tile {

// A tensor in device DRAM, in the target's layout: the innermost dim padded to whole sticks (stick
// layouts) or the two innermost dims padded to whole (rows, lanes) tiles (tiled layouts).
struct Global {
  enum class Kind { input, output, constant, temp };
  std::string name;     // the kernel-level value
  Kind kind = Kind::temp;
  DType dtype = DType::f16;       // device storage type
  DType logical = DType::f32;     // the model's type
  Shape shape;                    // logical dims
  Shape padded;                   // dims in DRAM (in logical order; the physically innermost is padded)
  std::vector<int64_t> perm;      // physical dim order, outermost first (empty: row-major); NHWC activations: 0 2 3 1
  int64_t offset = -1;            // DRAM offset (planned by liveness; constants and inputs too)
  int64_t bytes() const;          // padded
  int64_t logical_bytes() const;  // shape's elements in the device dtype
};

// One dim of a kernel's iteration space: its extent, how many cores it is split over, the slice each
// core gets (whole alignment units: sticks, matrix passes) and the tile a core brings in per step.
struct Dim {
  std::string name;      // matmul: b m n k; conv: n oc s r (s = output pixels, r = C/g·KH·KW); vector: p (outer points), e (inner elements)
  int64_t size = 0;
  int64_t split = 1;     // cores along this dim
  int64_t slice = 0;     // per-core extent: ceil(size / split) rounded up to `align`
  int64_t tile = 0;      // per-step extent (the last step of a slice may be partial)
  int64_t align = 1;
  bool reduction = false;
  int64_t steps() const { return tile > 0 ? (slice + tile - 1) / tile : 0; }
};

// A buffer a kernel reads or writes: its Global, the dims that index it, and its tile buffer in each
// core's scratchpad.
struct Operand {
  std::string role;            // matmul: a b c; conv: x w y; vector: in/out; epilogue inputs: "epi"
  int global = -1;             // index into TileProgram::globals
  bool out = false;
  std::vector<int> dims;       // indices into the kernel's dims that index this operand
  DType spad_dtype = DType::f16;  // f32 for accumulators
  int copies = 1;              // 2: double-buffered (the next tile loads while this one computes)
  int64_t tile_bytes = 0;      // one copy
  int64_t spad_offset = 0;     // in every core's scratchpad
  int fanout = 1;              // cores that load the same tile at once (one DRAM read, broadcast)
};

// relayout: a copy that re-lays a tensor out for a consumer whose layout rule its producer's layout
// breaks (torch-spyre's "restickify": matmul's B must be sticked on N, A on K); values unchanged.
enum class TileKind { matmul, conv, vector, relayout, host };
std::string_view tile_kind_name(TileKind k);

struct TileKernel {
  std::string name;              // t0, t1, ...
  TileKind kind = TileKind::vector;
  int kernel = -1;               // the kernel-level kernel (-1 for host steps)
  std::string node;              // the kernel-level node (provenance; host steps: the core node)
  std::vector<std::string> sources;
  std::vector<Dim> dims;
  std::vector<int> order;        // tile loop order on each core, outermost first (indices into dims)
  std::vector<Operand> operands;
  std::vector<int> host_inputs, host_outputs;  // host steps: globals read and written
  int cores = 1;                 // product of the splits
  bool on_vector_unit = false;   // the main work runs on the vector unit (vector kernels, depthwise convolutions)
  int64_t spad_peak = 0;         // bytes of each core's scratchpad the kernel uses
  double flops = 0;              // 2 per MAC plus one per vector element operation
  int64_t dram_bytes = 0;        // DRAM traffic of the plan (a broadcast tile counted once)
  int64_t bytes_unfused = 0, bytes_fused = 0;  // the kernel level's fusion traffic (logical dtype)
  double estimate_cycles = 0;    // the mapper's analytical estimate
  // Vector-unit element operations per point by class (hw::VectorOp order): per p-point for
  // vector kernels, per output element for matmul and conv epilogues (conv: depthwise MACs too).
  std::vector<double> vector_ops;
  std::string decision;          // why this split: the chosen candidate and the runner-up
};

struct TileProgram {
  std::string name;              // the model
  std::string target;            // HwSpec::name
  // The target it is mapped for: verify_tile_program, the simulators and the reports read it from here
  // (shared: copies of a program, and programs mapped for one target, share one description). Not part
  // of the text form, which names the target only: parse_tile_program takes it as an argument.
  std::shared_ptr<const hw::HwSpec> hw;
  DType float_dtype = DType::f16;  // device storage of float tensors
  bool dl16 = false;             // f16 is the target's DLFloat16 (HwSpec::f16_format), not IEEE binary16
  int64_t cores = 0;
  int64_t usable_spad = 0;       // HwSpec::usable_scratchpad_bytes
  std::vector<Global> globals;
  std::vector<TileKernel> kernels;
  std::vector<int> inputs, outputs;  // globals of the model's inputs and outputs
  int64_t dram_peak = 0;         // DRAM bytes planned (constants + inputs + outputs + temp peak)
  int find_global(const std::string& name) const;  // -1 when absent
  // *hw; throws tessel::Error naming the program when it carries none (parsed without one).
  const hw::HwSpec& hw_spec() const;
};

// The globals a kernel reads or writes (its operands', then a host step's inputs and outputs), each
// once, in that order.
std::vector<int> kernel_globals(const TileKernel& t);

// The re-layout copy that writes global `g`, or null when g is no re-layout's result.
const TileKernel* relayout_writing(const TileProgram& p, int g);

// Text form (docs/ir/tile.md). parse_tile_program(print_tile_program(p)) prints back identically.
// The text names the target; `hw`, when given, becomes the program's HwSpec (its name must be that
// target), else the parsed program carries none (printing it works; verifying or simulating it does not).
std::string print_tile_program(const TileProgram& p);
TileProgram parse_tile_program(const std::string& text, const std::string& file = "<text>",
                               std::shared_ptr<const hw::HwSpec> hw = nullptr);

// Checks the invariants every mapping keeps; throws tessel::Error naming the kernel: splits multiply
// to the cores used and fit the target; slices are whole alignment units and cover their dims;
// tiles fit their slices; operand dims exist; scratchpad buffers are aligned, inside the usable
// scratchpad and do not overlap; every global is padded to whole sticks or tiles (for the program's HwSpec).
// `allocated` false: a program before its allocation stage (targets/dataflow/map.h), whose scratchpad
// offsets are not chosen yet; those checks are left out.
void verify_tile_program(const TileProgram& p, bool allocated = true);

// Padded shape of `shape` stored as `t` in hw's layout, with the physical dim order `perm` (empty:
// row-major): the innermost physical dim to whole sticks (or lanes), and for tiled layouts the one
// before it to whole tile rows.
Shape padded_shape(const Shape& shape, DType t, const hw::HwSpec& hw, const std::vector<int64_t>& perm = {});

}  // namespace tessel::tile
