// HwSpec's derived quantities, the embedded presets, target resolution and the readable summary.
#include "tessel/hw/hw.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "tessel/support/error.h"
#include "tessel/support/escape.h"
#include "tessel/support/limits.h"

namespace tessel::hw {

const char* dataflow_name(Dataflow d) {
  switch (d) {
    case Dataflow::weight_stationary: return "weight-stationary";
    case Dataflow::output_stationary: return "output-stationary";
    case Dataflow::input_stationary: return "input-stationary";
  }
  return "?";
}

const char* system_topology_name(SystemTopology t) {
  switch (t) {
    case SystemTopology::ring: return "ring";
    case SystemTopology::mesh: return "mesh";
    case SystemTopology::fully_connected: return "fully_connected";
  }
  return "?";
}

double derived_fill_cycles(int64_t rows, int64_t, Dataflow d) {
  return d == Dataflow::output_stationary ? double(rows - 1) : double(2 * rows - 1);
}

double derived_drain_cycles(int64_t, int64_t cols, Dataflow) { return double(cols - 1); }

namespace {

struct Preset {
  const char* name;
  const char* text;
};
// hw/*.json of the source tree, as raw strings (written by the build: see the hardware-presets block
// of CMakeLists.txt).
constexpr Preset kPresets[] = {
#include "tessel_hw_presets.inc"
};

std::string si(double x, const char* unit) {
  const char* prefixes[] = {"", "k", "M", "G", "T", "P"};
  int i = 0;
  while (std::abs(x) >= 1000 && i < 5) x /= 1000, ++i;
  return fmt::format("{:.4g} {}{}", x, prefixes[i], unit);
}

std::string bytes_text(double b) {
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.4g} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.4g} MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.4g} KiB", b / 1024.0);
  return fmt::format("{} B", b);
}

}  // namespace

const char* vector_op_name(VectorOp op) {
  switch (op) {
    case VectorOp::add: return "add";
    case VectorOp::mul: return "mul";
    case VectorOp::compare: return "compare";
    case VectorOp::convert: return "convert";
    case VectorOp::reduce: return "reduce";
    case VectorOp::divide: return "divide";
    case VectorOp::transcendental: return "transcendental";
  }
  return "?";
}

int64_t LayoutSpec::elements_per_stick(DType t) const {
  const int64_t size = dtype_size(t);
  return kind == LayoutKind::stick ? stick_bytes / size : tile_lanes * std::max<int64_t>(1, word_bytes / size);
}

int64_t LayoutSpec::tile_rows_for(DType t) const {
  return tile_rows * std::max<int64_t>(1, word_bytes / dtype_size(t));
}

int64_t HwSpec::usable_scratchpad_bytes() const {
  const auto usable = int64_t(std::floor(double(scratchpad_bytes) * (1.0 - scratchpad_reserved_fraction)));
  const int64_t a = std::max<int64_t>(1, layout.alignment_bytes);
  return usable / a * a;
}

bool HwSpec::supports(DType t) const { return std::find(dtypes.begin(), dtypes.end(), t) != dtypes.end(); }

double HwSpec::peak_macs_per_second(DType t) const {
  auto it = matrix.dtype_rate.find(t);
  if (it == matrix.dtype_rate.end()) return 0;
  return matrix.macs_per_cycle * it->second * double(cores) * clock_ghz * 1e9;
}

double HwSpec::peak_dram_bytes_per_second() const { return std::max(dram.read_gbps, dram.write_gbps) * 1e9; }

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.emplace_back(p.name);
  return out;
}

std::string preset_text(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return p.text;
  return {};
}

HwSpec load_preset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return parse_hw_json(p.text, "preset:" + name);
  std::string all;
  for (const Preset& p : kPresets) all += (all.empty() ? "" : ", ") + std::string(p.name);
  throw Error(Location{}, fmt::format("unknown hardware preset '{}' (presets: {})", name, all));
}

HwSpec load_hw_file(const std::string& path) {
  // A regular file within the allocation limit: a FIFO or /dev/zero given as --hw is refused, not read forever.
  return parse_hw_json(read_regular_file(path, "hardware file"), path);
}

HwSpec resolve_target(const std::string& target_or_path) {
  if (!preset_text(target_or_path).empty()) return load_preset(target_or_path);
  if (target_or_path.ends_with(".json") || std::filesystem::exists(target_or_path)) return load_hw_file(target_or_path);
  std::string all;
  for (const Preset& p : kPresets) all += (all.empty() ? "" : ", ") + std::string(p.name);
  throw Error(Location{}, fmt::format("unknown target '{}': not a hardware preset ({}) nor a .json file",
                                      target_or_path, all));
}

std::string describe(const HwSpec& hw) {
  std::string out = fmt::format("{}{}\n", display_text(hw.name), hw.description.empty() ? "" : ": " + display_text(hw.description));
  auto line = [&](const char* key, const std::string& value) { out += fmt::format("  {:<16} {}\n", key, value); };
  const MatrixUnitSpec& m = hw.matrix;
  line("clock", fmt::format("{:g} GHz", hw.clock_ghz));
  line("cores", fmt::format("{}", hw.cores));
  line("matrix unit",
       fmt::format("{} x {}x{} arrays per core, {}, {:g} MAC/cycle/core peak ({:g} per PE)", m.count, m.rows, m.cols,
                   dataflow_name(m.dataflow),
                   m.macs_per_cycle, m.macs_per_pe()));
  line("", fmt::format("M in passes of {} rows; fill {:g} + drain {:g} cycles per fold", m.pass_rows, m.fill_cycles,
                       m.drain_cycles));
  if (m.sustained_fraction < 1 || m.min_rows_full_efficiency > 0)
    line("", fmt::format("sustained {:.1f} % of peak{}", 100 * m.sustained_fraction,
                         m.min_rows_full_efficiency > 0
                             ? fmt::format("; full rate needs >= {} rows per core", m.min_rows_full_efficiency)
                             : ""));
  for (const auto& [t, rate] : m.dtype_rate)
    line(fmt::format("peak {}", dtype_name(t)).c_str(),
         fmt::format("{}, {}", si(hw.peak_macs_per_second(t), "MAC/s"), si(hw.peak_flops(t), "FLOP/s")));
  std::string vec;
  for (int i = 0; i < kNumVectorOps; ++i)
    vec += fmt::format("{}{} {:g}", i ? ", " : "", vector_op_name(VectorOp(i)), hw.vector.elements_per_cycle[i]);
  line("vector unit", vec + " elements/cycle/core");
  line("scratchpad", fmt::format("{} per core, {:g} % reserved, {} usable ({} B)", bytes_text(double(hw.scratchpad_bytes)),
                                 100 * hw.scratchpad_reserved_fraction,
                                 bytes_text(double(hw.usable_scratchpad_bytes())), hw.usable_scratchpad_bytes()));
  if (hw.layout.kind == LayoutKind::stick)
    line("layout", fmt::format("sticks of {} B, {}-byte alignment", hw.layout.stick_bytes, hw.layout.alignment_bytes));
  else
    line("layout", fmt::format("({},{}) tiles of {}-byte words, {}-byte alignment", hw.layout.tile_rows,
                               hw.layout.tile_lanes, hw.layout.word_bytes, hw.layout.alignment_bytes));
  line("DMA", fmt::format("{} engines per core", hw.dma_engines));
  line("DRAM", fmt::format("read {:g} GB/s, write {:g} GB/s, mixed {:g} GB/s, latency {:g} cycles", hw.dram.read_gbps,
                           hw.dram.write_gbps, hw.dram.read_gbps * hw.dram.mixed_efficiency, hw.dram.latency_cycles));
  const InterconnectSpec& ic = hw.interconnect;
  const char* reduce = ic.reduce_path == ReducePath::ring                   ? "on the data ring"
                       : ic.reduce_path == ReducePath::separate_reduce_ring ? "on a separate reduce ring"
                                                                            : "through DRAM";
  if (ic.topology == Topology::none)
    line("interconnect", fmt::format("none; partial sums reduced {}", reduce));
  else
    line("interconnect", fmt::format("{}, {:g} B/cycle per link and direction, {:g} cycles per hop; partial sums reduced {}",
                                     ic.topology == Topology::ring ? "ring" : "mesh", ic.bytes_per_cycle,
                                     ic.hop_latency_cycles, reduce));
  for (const auto& [t, rate] : m.dtype_rate)
    line(fmt::format("ridge {}", dtype_name(t)).c_str(),
         fmt::format("{:.1f} FLOP/byte", hw.peak_flops(t) / hw.peak_dram_bytes_per_second()));
  line("kernel overhead", fmt::format("{:g} ns", hw.kernel_overhead_ns));
  line("overlap", fmt::format("T = C + M - {:g} * min(C, M)", hw.overlap_factor));
  std::string types;
  for (DType t : hw.dtypes) types += (types.empty() ? "" : ", ") + std::string(dtype_name(t));
  line("dtypes", types);
  if (hw.system.chips > 1) {
    const SystemSpec& sys = hw.system;
    const std::string topo = sys.topology == SystemTopology::mesh
                                 ? fmt::format("mesh {}x{}", sys.mesh_shape.at(0), sys.mesh_shape.at(1))
                                 : std::string(system_topology_name(sys.topology));
    line("system", fmt::format("{} chips, {}, {:g} GB/s per link and direction, {:g} ns per hop", sys.chips, topo,
                               sys.link_gbps, sys.link_latency_ns));
  }
  return out;
}

}  // namespace tessel::hw
