// Reading a hardware file: JSON -> HwSpec, with every problem reported at its JSON path.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <set>

#include "tessel/support/error.h"
#include "tessel/support/strings.h"
#include "tessel/hw/hw.h"

namespace tessel::hw {

namespace {

using json = nlohmann::json;

// " (did you mean 'x'?)" for a likely typo of one of `options`, else "".
std::string suggestion(const std::string& word, const std::vector<std::string>& options) {
  const std::string best = nearest_name(word, options);
  return best.empty() ? std::string() : fmt::format(" (did you mean '{}'?)", best);
}

std::string shown(const json& j) {
  std::string s = j.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

const char* type_name(const json& j) {
  if (j.is_null()) return "null";
  if (j.is_boolean()) return "a boolean";
  if (j.is_number()) return "a number";
  if (j.is_string()) return "a string";
  if (j.is_array()) return "an array";
  return "an object";
}

// A field's valid range. Every number must also be finite (JSON cannot say inf or NaN, but 1e308 is
// as good as infinite to the timing engine): the upper bounds are physically plausible limits, far
// above any chip, that keep every derived time finite and every count within the arrays the
// mapper and the simulator make per core. docs/hw.md's schema table lists them.
struct Bounds {
  double lo, hi;
  bool lo_open = false;  // (lo, hi] rather than [lo, hi]
  bool hi_open = false;  // [lo, hi) rather than [lo, hi]
  bool contains(double x) const {
    return std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  }
  std::string str() const { return fmt::format("{}{:g}, {:g}{}", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]"); }
};
struct IntBounds {
  int64_t lo, hi;
};

constexpr int64_t kKi = 1024, kMi = kKi * kKi, kGi = kMi * kKi;
constexpr Bounds kClockGhz{0.001, 100};                  // 1 MHz .. 100 GHz
constexpr Bounds kCycles{0, 1e9};                         // fills, drains, latencies: up to 1e9 cycles
constexpr Bounds kNanoseconds{0, 1e9};                    // kernel overhead: up to one second
constexpr Bounds kRate{0.001, 1e9};                       // elements or MACs per cycle per core
constexpr Bounds kRelativeRate{0.001, 1000};              // dtype_rate: relative to the reference dtype
constexpr Bounds kGbps{0.001, 1e7};                       // 1 MB/s .. 10 PB/s
constexpr Bounds kBytesPerCycle{0.001, 1e7};              // per link and direction
constexpr Bounds kCyclesPerElementHop{1e-6, 1e6};
constexpr Bounds kEfficiency{0.001, 1};                   // sustained, mixed: a fraction that is not ~0
constexpr Bounds kFractionOpen{0, 1, false, true};        // [0, 1)
constexpr Bounds kFractionClosed{0, 1};                   // [0, 1]
constexpr Bounds kCapacityBytes{1, 1e18};
constexpr IntBounds kCores{1, 65536};
constexpr IntBounds kScratchpadBytes{1, 16 * kGi};
constexpr IntBounds kLayoutBytes{1, kMi};                 // stick, alignment
constexpr IntBounds kWordBytes{1, 64};
constexpr IntBounds kTileDim{1, 65536};                   // tile rows, lanes; PE array rows, cols
constexpr IntBounds kArrays{1, 1024};
constexpr IntBounds kPassRows{1, kMi};
constexpr IntBounds kRows{1, int64_t{1} << 31};           // min_rows_full_efficiency
constexpr IntBounds kDmaEngines{1, 64};
constexpr IntBounds kBroadcast{1, 65536};
constexpr IntBounds kLimit{1, int64_t{1} << 62};          // limits/*
constexpr IntBounds kChips{1, 1024};                      // system/chips

// One JSON object being read: hands out its fields by name and remembers which were read, so that
// finish() can reject the rest as unknown.
class Obj {
 public:
  Obj(const json& j, std::string path, const std::string& origin) : j_(j), path_(std::move(path)), origin_(origin) {}

  [[noreturn]] void fail_at(const std::string& key, const std::string& reason) const {
    throw Error(Location{.file = origin_}, fmt::format("{}: {}", at(key), reason));
  }
  std::string at(const std::string& key) const { return key.empty() ? (path_.empty() ? "/" : path_) : path_ + "/" + key; }
  bool has(const std::string& key) {
    known_.push_back(key);
    return j_.contains(key);
  }
  const json& get(const std::string& key) {
    if (!has(key)) fail_at(key, "missing (required)");
    return j_.at(key);
  }

  double number(const std::string& key, const Bounds& r) { return check_number(key, get(key), r); }
  double number_or(const std::string& key, const Bounds& r, double dflt) {
    return has(key) ? check_number(key, j_.at(key), r) : dflt;
  }
  int64_t integer(const std::string& key, const IntBounds& r) { return check_integer(key, get(key), r); }
  int64_t integer_or(const std::string& key, const IntBounds& r, int64_t dflt) {
    return has(key) ? check_integer(key, j_.at(key), r) : dflt;
  }
  std::string string(const std::string& key) {
    const json& v = get(key);
    if (!v.is_string()) fail_at(key, fmt::format("must be a string (got {})", type_name(v)));
    return v.get<std::string>();
  }
  std::string string_or(const std::string& key, const std::string& dflt) { return has(key) ? string(key) : dflt; }
  std::string choice(const std::string& key, const std::vector<std::string>& options) {
    const std::string v = string(key);
    if (std::find(options.begin(), options.end(), v) == options.end()) {
      std::string all;
      for (const auto& o : options) all += (all.empty() ? "" : ", ") + fmt::format("'{}'", o);
      fail_at(key, fmt::format("must be one of {} (got '{}'){}", all, v, suggestion(v, options)));
    }
    return v;
  }
  Obj object(const std::string& key) {
    const json& v = get(key);
    if (!v.is_object()) fail_at(key, fmt::format("must be an object (got {})", type_name(v)));
    return Obj(v, at(key), origin_);
  }
  const json& array(const std::string& key) {
    const json& v = get(key);
    if (!v.is_array()) fail_at(key, fmt::format("must be an array (got {})", type_name(v)));
    return v;
  }
  // A field that exists in the schema but does not apply here (e.g. stick_bytes of a tiled layout).
  void forbid(const std::string& key, const std::string& why) {
    if (has(key)) fail_at(key, why);
  }
  // The keys of a free-form map object (e.g. dtype -> rate): all count as read.
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    for (auto it = j_.begin(); it != j_.end(); ++it) out.push_back(it.key());
    return out;
  }
  const json& raw() const { return j_; }
  const std::string& path() const { return path_; }

  // Unknown fields are errors (they are usually typos of known ones).
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (std::find(known_.begin(), known_.end(), it.key()) != known_.end()) continue;
      fail_at(it.key(), fmt::format("unknown field{}", suggestion(it.key(), known_)));
    }
  }

  double check_number(const std::string& key, const json& v, const Bounds& r) const {
    if (!v.is_number()) fail_at(key, fmt::format("must be a number (got {})", type_name(v)));
    const double x = v.get<double>();
    if (!r.contains(x)) fail_at(key, fmt::format("must be a number in {} (got {})", r.str(), shown(v)));
    return x;
  }
  int64_t check_integer(const std::string& key, const json& v, const IntBounds& r) const {
    if (!v.is_number()) fail_at(key, fmt::format("must be an integer (got {})", type_name(v)));
    int64_t x = 0;
    if (v.is_number_unsigned()) {
      x = int64_t(std::min<uint64_t>(v.get<uint64_t>(), uint64_t(INT64_MAX)));
    } else if (v.is_number_integer()) {
      x = v.get<int64_t>();
    } else {
      const double d = v.get<double>();
      if (d != std::floor(d)) fail_at(key, fmt::format("must be an integer (got {})", shown(v)));
      x = std::abs(d) > 9e18 ? (d < 0 ? INT64_MIN : INT64_MAX) : int64_t(d);
    }
    if (x < r.lo || x > r.hi) fail_at(key, fmt::format("must be an integer in [{}, {}] (got {})", r.lo, r.hi, shown(v)));
    return x;
  }

 private:
  const json& j_;
  std::string path_;
  const std::string& origin_;
  std::vector<std::string> known_;
};


std::vector<std::string> dtype_names() {
  std::vector<std::string> out;
  for (int i = 0; i < kNumDTypes; ++i) out.emplace_back(dtype_name(DType(i)));
  return out;
}

DType read_dtype(const Obj& o, const std::string& key, const json& v) {
  if (!v.is_string()) o.fail_at(key, fmt::format("must be a dtype name (got {})", type_name(v)));
  const std::string s = v.get<std::string>();
  auto t = dtype_from_name(s);
  if (!t) o.fail_at(key, fmt::format("unknown dtype '{}'{}", s, suggestion(s, dtype_names())));
  return *t;
}

void read_scratchpad(Obj o, HwSpec& hw) {
  hw.scratchpad_bytes = o.integer("bytes_per_core", kScratchpadBytes);
  hw.scratchpad_reserved_fraction = o.number("reserved_fraction", kFractionOpen);
  hw.effective_working_set_bytes = o.integer_or("effective_working_set_bytes", kScratchpadBytes, 0);
  if (hw.effective_working_set_bytes > hw.scratchpad_bytes)
    o.fail_at("effective_working_set_bytes", fmt::format("must not exceed bytes_per_core ({}) (got {})",
                                                          hw.scratchpad_bytes, hw.effective_working_set_bytes));
  o.finish();
}

void read_layout(Obj o, HwSpec& hw) {
  LayoutSpec& l = hw.layout;
  const std::string kind = o.choice("kind", {"stick", "tiled"});
  l.alignment_bytes = o.integer("alignment_bytes", kLayoutBytes);
  if (kind == "stick") {
    l.kind = LayoutKind::stick;
    l.stick_bytes = o.integer("stick_bytes", kLayoutBytes);
    for (const char* k : {"tile_rows", "tile_lanes", "word_bytes"}) o.forbid(k, "only for layout kind 'tiled'");
  } else {
    o.forbid("stick_bytes", "only for layout kind 'stick'");
    l.kind = LayoutKind::tiled;
    l.tile_rows = o.integer("tile_rows", kTileDim);
    l.tile_lanes = o.integer("tile_lanes", kTileDim);
    l.word_bytes = o.integer("word_bytes", kWordBytes);
  }
  o.finish();
}

void read_matrix(Obj o, HwSpec& hw) {
  MatrixUnitSpec& m = hw.matrix;
  m.rows = o.integer("rows", kTileDim);
  m.cols = o.integer("cols", kTileDim);
  m.count = o.integer("count", kArrays);
  m.macs_per_cycle = o.number("macs_per_cycle", kRate);
  m.pass_rows = o.integer("pass_rows", kPassRows);
  const std::string df = o.choice("dataflow", {"weight_stationary", "output_stationary", "input_stationary"});
  m.dataflow = df == "weight_stationary"   ? Dataflow::weight_stationary
               : df == "output_stationary" ? Dataflow::output_stationary
                                           : Dataflow::input_stationary;
  // Fill and drain follow from the array and its dataflow (derived_fill_cycles); a file gives them
  // only to override that (spyre: 0, folded into its measured sustained rate).
  m.fill_cycles = o.number_or("fill_cycles", kCycles, derived_fill_cycles(m.rows, m.cols, m.dataflow));
  m.drain_cycles = o.number_or("drain_cycles", kCycles, derived_drain_cycles(m.rows, m.cols, m.dataflow));
  m.min_rows_full_efficiency = o.integer_or("min_rows_full_efficiency", kRows, 0);
  m.sustained_fraction = o.number_or("sustained_fraction", kEfficiency, 1.0);
  Obj rates = o.object("dtype_rate");
  for (const std::string& k : rates.keys()) {
    const DType t = read_dtype(rates, k, json(k));
    m.dtype_rate[t] = rates.check_number(k, rates.raw().at(k), kRelativeRate);
  }
  if (m.dtype_rate.empty()) o.fail_at("dtype_rate", "must name at least one dtype");
  if (m.macs_per_cycle < double(m.rows * m.cols * m.count))
    o.fail_at("macs_per_cycle", fmt::format("must be at least count x rows x cols = {} (one MAC per PE per cycle) (got {})",
                                            m.rows * m.cols * m.count, m.macs_per_cycle));
  o.finish();
}

void read_vector(Obj o, HwSpec& hw) {
  Obj rates = o.object("elements_per_cycle");
  for (int i = 0; i < kNumVectorOps; ++i)
    hw.vector.elements_per_cycle[i] = rates.number(vector_op_name(VectorOp(i)), kRate);
  rates.finish();
  hw.vector.latency_cycles = o.number_or("latency_cycles", kCycles, 0);
  o.finish();
}

void read_dram(Obj o, HwSpec& hw) {
  DramSpec& d = hw.dram;
  d.read_gbps = o.number("read_gbps", kGbps);
  d.write_gbps = o.number("write_gbps", kGbps);
  d.mixed_efficiency = o.number("mixed_efficiency", kEfficiency);
  d.latency_cycles = o.number("latency_cycles", kCycles);
  d.capacity_bytes = o.number_or("capacity_bytes", kCapacityBytes, 0);
  d.datasheet_gbps = o.number_or("datasheet_gbps", kGbps, 0);
  o.finish();
}

// "mesh_shape": [rows, cols], each within `bound`, rows x cols equal to the `count` of `what` it lays out.
std::vector<int64_t> read_mesh_shape(Obj& o, const IntBounds& bound, int64_t count, const char* what) {
  const json& shape = o.array("mesh_shape");
  if (shape.size() != 2) o.fail_at("mesh_shape", fmt::format("must be [rows, cols] (got {})", shown(shape)));
  std::vector<int64_t> rc;
  for (size_t i = 0; i < 2; ++i) rc.push_back(o.check_integer("mesh_shape/" + std::to_string(i), shape[i], bound));
  if (rc[0] * rc[1] != count)
    o.fail_at("mesh_shape", fmt::format("rows x cols must equal {} ({}) (got {} x {})", what, count, rc[0], rc[1]));
  return rc;
}

void read_interconnect(Obj o, HwSpec& hw) {
  InterconnectSpec& ic = hw.interconnect;
  const std::string topo = o.choice("topology", {"ring", "mesh", "none"});
  ic.topology = topo == "ring" ? Topology::ring : topo == "mesh" ? Topology::mesh : Topology::none;
  const std::string path = o.choice("reduce_path", {"ring", "separate_reduce_ring", "dram"});
  ic.reduce_path = path == "ring" ? ReducePath::ring : path == "dram" ? ReducePath::dram : ReducePath::separate_reduce_ring;
  ic.broadcast_limit = o.integer_or("broadcast_limit", kBroadcast, 0);
  if (ic.topology == Topology::none) {
    if (ic.reduce_path != ReducePath::dram)
      o.fail_at("reduce_path", fmt::format("must be 'dram' when topology is 'none' (got '{}')", path));
    for (const char* k : {"bytes_per_cycle", "hop_latency_cycles", "reduce_cycles_per_element_hop"})
      o.forbid(k, "only for topology 'ring' or 'mesh'");
  } else {
    ic.bytes_per_cycle = o.number("bytes_per_cycle", kBytesPerCycle);
    ic.hop_latency_cycles = o.number("hop_latency_cycles", kCycles);
    ic.reduce_cycles_per_element_hop = o.number_or("reduce_cycles_per_element_hop", kCyclesPerElementHop, 0);
    if (ic.reduce_path == ReducePath::separate_reduce_ring && ic.topology != Topology::ring)
      o.fail_at("reduce_path", "'separate_reduce_ring' needs topology 'ring'");
  }
  if (ic.topology != Topology::mesh) o.forbid("mesh_shape", "only for topology 'mesh'");
  if (ic.topology == Topology::mesh) ic.mesh_shape = read_mesh_shape(o, kCores, hw.cores, "cores");
  o.finish();
}

// The optional "system" section: several copies of this chip joined by chip-to-chip links.
void read_system(Obj o, HwSpec& hw) {
  SystemSpec& sys = hw.system;
  sys.chips = o.integer("chips", kChips);
  const std::string topo = o.choice("topology", {"ring", "mesh", "fully_connected"});
  sys.topology = topo == "ring" ? SystemTopology::ring : topo == "mesh" ? SystemTopology::mesh : SystemTopology::fully_connected;
  sys.link_gbps = o.number("link_gbps", kGbps);
  sys.link_latency_ns = o.number("link_latency_ns", kNanoseconds);
  if (sys.topology != SystemTopology::mesh) o.forbid("mesh_shape", "only for topology 'mesh'");
  if (sys.topology == SystemTopology::mesh) sys.mesh_shape = read_mesh_shape(o, kChips, sys.chips, "chips");
  o.finish();
}

void read_limits(Obj o, HwSpec& hw) {
  hw.limits.max_dram_span_bytes = o.integer_or("max_dram_span_bytes", kLimit, 0);
  hw.limits.max_loop_iterations = o.integer_or("max_loop_iterations", kLimit, 0);
  o.finish();
}

void read_strings(Obj& o, const std::string& key, std::vector<std::string>& out) {
  const json& a = o.array(key);
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_string()) o.fail_at(fmt::format("{}/{}", key, i), fmt::format("must be a string (got {})", type_name(a[i])));
    out.push_back(a[i].get<std::string>());
  }
}

}  // namespace

namespace {

// The line and column of byte `offset` of `text` (1-based).
Location text_location(const std::string& text, size_t offset, const std::string& origin) {
  Location loc{.file = origin, .line = 1, .column = 1};
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') ++loc.line, loc.column = 1;
    else ++loc.column;
  }
  return loc;
}

// The library's message without its "[json.exception.x.n] " prefix.
std::string json_reason(const json::exception& e) {
  std::string why = e.what();
  if (auto p = why.find("] "); p != std::string::npos && why.starts_with("[json.exception")) why = why.substr(p + 2);
  return why;
}

json parse_json(const std::string& text, const std::string& origin) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    // nlohmann reports the byte count read when it stopped: the line:column of the last character of the
    // offending token.
    std::string why = json_reason(e);
    if (auto p = why.find(": "); p != std::string::npos) why = why.substr(p + 2);
    throw Error(text_location(text, e.byte > 0 ? e.byte - 1 : 0, origin), "invalid JSON: " + why);
  } catch (const json::exception& e) {
    // A number too large for a double ("number overflow parsing '1e99999'") comes without a byte offset:
    // the quoted token's first occurrence locates it.
    const std::string why = json_reason(e);
    Location loc{.file = origin};
    if (auto q = why.find('\''), r = why.rfind('\''); q != std::string::npos && r > q + 1)
      if (auto at = text.find(why.substr(q + 1, r - q - 1)); at != std::string::npos) loc = text_location(text, at, origin);
    throw Error(loc, "invalid JSON: " + why);
  }
}

}  // namespace

HwSpec parse_hw_json(const std::string& text, const std::string& origin) {
  const json root = parse_json(text, origin);
  if (!root.is_object()) throw Error(Location{.file = origin}, fmt::format("/: must be an object (got {})", type_name(root)));

  HwSpec hw;
  hw.origin = origin;
  Obj o(root, "", origin);
  o.has("$schema");  // allowed, ignored
  hw.name = o.string("name");
  hw.description = o.string_or("description", "");
  hw.clock_ghz = o.number("clock_ghz", kClockGhz);
  hw.cores = o.integer("cores", kCores);
  read_scratchpad(o.object("scratchpad"), hw);
  read_layout(o.object("layout"), hw);
  read_matrix(o.object("matrix_unit"), hw);
  read_vector(o.object("vector_unit"), hw);
  {
    Obj dma = o.object("dma");
    hw.dma_engines = dma.integer("engines_per_core", kDmaEngines);
    dma.finish();
  }
  read_dram(o.object("dram"), hw);
  read_interconnect(o.object("interconnect"), hw);
  {
    const json& a = o.array("dtypes");
    if (a.empty()) o.fail_at("dtypes", "must name at least one dtype");
    for (size_t i = 0; i < a.size(); ++i) hw.dtypes.push_back(read_dtype(o, fmt::format("dtypes/{}", i), a[i]));
  }
  // Whole elements per stick: a stick narrower than an element, or not a multiple of it, has none.
  for (DType t : hw.dtypes)
    if (hw.layout.kind == LayoutKind::stick && hw.layout.stick_bytes % dtype_size(t) != 0)
      o.fail_at("layout/stick_bytes", fmt::format("must be a multiple of the size of every dtype in /dtypes ({} is {} "
                                                  "bytes) (got {})", dtype_name(t), dtype_size(t), hw.layout.stick_bytes));
  if (o.has("f16_format")) hw.f16_format = o.choice("f16_format", {"ieee", "dl16"});
  for (const auto& [t, rate] : hw.matrix.dtype_rate)
    if (!hw.supports(t))
      o.fail_at(fmt::format("matrix_unit/dtype_rate/{}", dtype_name(t)), "dtype is not listed in /dtypes");
  hw.kernel_overhead_ns = o.number("kernel_overhead_ns", kNanoseconds);
  hw.overlap_factor = o.number("overlap_factor", kFractionClosed);
  if (o.has("limits")) read_limits(o.object("limits"), hw);
  if (o.has("system")) read_system(o.object("system"), hw);
  if (o.has("notes")) read_strings(o, "notes", hw.notes);
  if (o.has("sources")) {
    Obj s = o.object("sources");
    for (const std::string& k : s.keys()) {
      const json& v = s.raw().at(k);
      if (!v.is_string()) s.fail_at(k, fmt::format("must be a string (got {})", type_name(v)));
      hw.sources[k] = v.get<std::string>();
    }
  }
  o.finish();
  return hw;
}

}  // namespace tessel::hw
