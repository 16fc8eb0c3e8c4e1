// The hardware description of a dataflow target: what a hw/*.json file holds, loaded and validated.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessel/support/dtype.h"

namespace tessel::hw {

// How tensors are laid out in the scratchpad and moved to and from DRAM.
//  stick: the innermost device dim is cut into sticks of `stick_bytes` (Spyre: 128 B); per-core work
//         and every DMA are whole sticks.
//  tiled: 2-D tiles of `tile_rows` x `tile_lanes` words of `word_bytes` (TPU: (8,128) of 32 bits); a
//         type narrower than a word packs word_bytes/size rows per word, so bf16 tiles are (16,128).
enum class LayoutKind { stick, tiled };

struct LayoutSpec {
  LayoutKind kind = LayoutKind::stick;
  int64_t stick_bytes = 0;      // stick layouts only
  int64_t tile_rows = 0;        // tiled layouts only
  int64_t tile_lanes = 0;       // tiled layouts only
  int64_t word_bytes = 0;       // tiled layouts only
  int64_t alignment_bytes = 0;  // every scratchpad buffer offset is a multiple of this

  // Elements of `t` per stick (stick layouts), or per tile row of lanes (tiled layouts).
  int64_t elements_per_stick(DType t) const;
  // Tile shape (rows, lanes) in elements of `t` for tiled layouts: rows * (word_bytes / size).
  int64_t tile_rows_for(DType t) const;
};

// What each PE of a systolic array keeps while the other two operands stream through it
// (docs/hw.md): weights, outputs (partial sums) or inputs.
enum class Dataflow { weight_stationary, output_stationary, input_stationary };
const char* dataflow_name(Dataflow d);

// SCALE-Sim's cycles around one fold of an R x C array, by dataflow (scale-sim-v2's
// systolic_compute_{ws,os,is}.py: the rows of a fold's demand matrix). ws and is: the stationary
// operand loads over R cycles and the streamed one enters skewed over R - 1 more (fill 2R - 1), the
// last results leave over C - 1 (drain); os: inputs enter skewed over R - 1 and results drain over
// C - 1. A fold is then fill + T + drain cycles, T the streamed length (M for ws, K for os, N for is).
double derived_fill_cycles(int64_t rows, int64_t cols, Dataflow d);
double derived_drain_cycles(int64_t rows, int64_t cols, Dataflow d);

// The matrix unit of one core: `count` systolic arrays of rows x cols PEs. Per cycle a core does at
// most `macs_per_cycle` multiply-accumulates in the reference dtype (rate 1.0 in `dtype_rate`).
struct MatrixUnitSpec {
  int64_t rows = 0;           // PE array rows (the K side of the held weight block when weight-stationary)
  int64_t cols = 0;           // PE array columns (the N side)
  int64_t count = 0;          // arrays per core
  double macs_per_cycle = 0;  // peak MACs per cycle per core (all arrays together)
  int64_t pass_rows = 1;      // M is streamed in passes of this many rows (rounded up)
  double fill_cycles = 0;     // per fold, before the first result (derived from rows, cols and the dataflow
  double drain_cycles = 0;    // unless the file gives them); per fold, after the last row enters
  Dataflow dataflow = Dataflow::weight_stationary;
  int64_t min_rows_full_efficiency = 0;  // 0: none; else below it rate x sqrt(passes / (this / pass_rows))
  double sustained_fraction = 1.0;       // measured sustained / peak (fill, drain and stalls not modelled)
  std::map<DType, double> dtype_rate;    // relative MAC rate per dtype; a dtype not here has no matmul

  // MACs each PE does per cycle: macs_per_cycle / (count * rows * cols) (1 for a plain systolic array).
  double macs_per_pe() const { return macs_per_cycle / double(count * rows * cols); }
};

// Vector-unit operation classes. Every class is rated in elements per cycle per core.
enum class VectorOp { add, mul, compare, convert, reduce, divide, transcendental };
inline constexpr int kNumVectorOps = 7;
const char* vector_op_name(VectorOp op);

struct VectorUnitSpec {
  double elements_per_cycle[kNumVectorOps] = {};  // indexed by VectorOp
  double latency_cycles = 0;                      // pipeline latency added once per vector op
  double rate(VectorOp op) const { return elements_per_cycle[int(op)]; }
};

struct DramSpec {
  double read_gbps = 0;          // sustained read bandwidth, GB/s (1e9 bytes/s), whole chip
  double write_gbps = 0;         // sustained write bandwidth, GB/s
  double mixed_efficiency = 1;   // with reads and writes in flight together: capacity = this x read_gbps
  double latency_cycles = 0;     // added once per transfer
  double capacity_bytes = 0;     // DRAM size (informational: checks of total footprint)
  double datasheet_gbps = 0;     // 0: not given; informational only (roofline uses read/write_gbps)
};

enum class Topology { ring, mesh, none };
enum class ReducePath { ring, separate_reduce_ring, dram };

struct InterconnectSpec {
  Topology topology = Topology::none;
  std::vector<int64_t> mesh_shape;          // mesh only: {rows, cols}, rows * cols == cores
  double bytes_per_cycle = 0;               // per link per direction (0 for none)
  double hop_latency_cycles = 0;            // per hop
  ReducePath reduce_path = ReducePath::dram;
  double reduce_cycles_per_element_hop = 0; // 0: derived from bytes_per_cycle and the element size
  int64_t broadcast_limit = 0;              // cores that can share one broadcast operand; 0: no limit known
};

// Several chips joined by chip-to-chip links (the optional "system" section of a hardware file; docs/hw.md).
// Every chip is the one the rest of the file describes. chips == 1 (the default, no section): one chip.
enum class SystemTopology { ring, mesh, fully_connected };
const char* system_topology_name(SystemTopology t);

struct SystemSpec {
  int64_t chips = 1;
  SystemTopology topology = SystemTopology::ring;
  std::vector<int64_t> mesh_shape;  // mesh only: {rows, cols}, rows * cols == chips, row-major chip numbers
  double link_gbps = 0;             // per link and direction, GB/s (1e9 B/s)
  double link_latency_ns = 0;       // per hop
};

struct LimitsSpec {
  int64_t max_dram_span_bytes = 0;  // 0: none; contiguous DRAM span one core may address per tensor
  int64_t max_loop_iterations = 0;  // 0: none; trip count limit of a generated loop
};

struct HwSpec {
  std::string name;           // "spyre", "tpu-v5e", ... (from the file)
  std::string origin;         // the file (or "preset:<name>") it was read from, for messages
  std::string description;
  double clock_ghz = 0;       // cycles per ns
  int64_t cores = 0;
  int64_t scratchpad_bytes = 0;        // per core
  double scratchpad_reserved_fraction = 0;
  int64_t effective_working_set_bytes = 0;  // 0: none; performance derates past this (informational)
  LayoutSpec layout;
  MatrixUnitSpec matrix;
  VectorUnitSpec vector;
  int64_t dma_engines = 0;    // per core
  DramSpec dram;
  InterconnectSpec interconnect;
  std::vector<DType> dtypes;  // storage dtypes the target supports
  // How 16-bit floats named f16 are stored: "ieee" (binary16) or "dl16" (IBM's DLFloat16: 1 sign, 6
  // exponent and 9 fraction bits, no subnormals: range 2^-30 .. ~2^33, Spyre's device format).
  std::string f16_format = "ieee";
  double kernel_overhead_ns = 0;     // fixed cost per kernel launch
  double overlap_factor = 1;         // T = C + M - overlap_factor * min(C, M); 1 = perfect overlap
  LimitsSpec limits;
  SystemSpec system;                 // chips = 1 when the file has no "system" section
  std::vector<std::string> notes;    // free text
  std::map<std::string, std::string> sources;  // field path -> where its value comes from

  // Bytes of one core's scratchpad a plan may use: floor(bytes * (1 - reserved)), rounded down to
  // the alignment.
  int64_t usable_scratchpad_bytes() const;
  bool supports(DType t) const;
  // Derived rates.
  double dram_read_bytes_per_cycle() const { return dram.read_gbps / clock_ghz; }
  double dram_write_bytes_per_cycle() const { return dram.write_gbps / clock_ghz; }
  double peak_macs_per_second(DType t) const;   // whole chip; 0 when the matrix unit lacks t
  double peak_flops(DType t) const { return 2 * peak_macs_per_second(t); }
  double peak_dram_bytes_per_second() const;    // max(read, write)
  double seconds(double cycles) const { return cycles / (clock_ghz * 1e9); }
  double cycles(double seconds) const { return seconds * clock_ghz * 1e9; }
};

// Parse and validate a hardware description. `origin` names the text in errors. Every error is a
// tessel::Error whose message is "<origin>: <JSON path>: <reason>", or "<origin>:<line>:<col>: ..."
// for malformed JSON.
HwSpec parse_hw_json(const std::string& text, const std::string& origin);
HwSpec load_hw_file(const std::string& path);
// The presets embedded at build time (the files hw/<name>.json of the source tree).
std::vector<std::string> preset_names();
HwSpec load_preset(const std::string& name);
// The embedded text of a preset (empty when there is no such preset).
std::string preset_text(const std::string& name);
// A preset name, or a path to a .json file.
HwSpec resolve_target(const std::string& target_or_path);

// A readable multi-line summary: peaks, bandwidths, scratchpad, ridge points.
std::string describe(const HwSpec& hw);

}  // namespace tessel::hw
