// Hardware files: the presets load, validate and describe themselves; every kind of mistake in a
// file is reported naming the file and the field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tessel/support/error.h"
#include "tessel/hw/hw.h"
#include "limits_util.h"
#include "test_util.h"

using namespace tessel;
using namespace tessel::hw;

namespace {

std::string preset_file(const std::string& name) { return testenv::read_text(testenv::source_dir() + "/hw/" + name + ".json"); }

// The spyre preset with one edit applied (a JSON pointer set to a value, or removed).
std::string edited(const std::string& pointer, const nlohmann::json* value) {
  auto j = nlohmann::json::parse(preset_file("spyre"));
  if (value) j[nlohmann::json::json_pointer(pointer)] = *value;
  else {
    auto p = nlohmann::json::json_pointer(pointer);
    j[p.parent_pointer()].erase(p.back());
  }
  return j.dump(2);
}

// The message of the error parsing `text` as hw/x.json raises ("" when it parses).
std::string error_of(const std::string& text) {
  try {
    parse_hw_json(text, "hw/x.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
std::string error_setting(const std::string& pointer, nlohmann::json value) { return error_of(edited(pointer, &value)); }

}  // namespace

TEST(Hw, PresetsAreTheRepositoryFilesAndLoad) {
  const std::vector<std::string> names = preset_names();
  EXPECT_EQ(names, (std::vector<std::string>{"spyre", "tpu-v4", "tpu-v5e"}));
  for (const std::string& n : names) {
    EXPECT_EQ(preset_text(n), preset_file(n)) << n << ": the embedded copy is stale (re-run cmake)";
    HwSpec hw = load_preset(n);
    EXPECT_EQ(hw.name, n);
    EXPECT_EQ(hw.origin, "preset:" + n);
    EXPECT_FALSE(hw.notes.empty()) << n;
    EXPECT_FALSE(hw.sources.empty()) << n;
    // Same as loading the file through resolve_target's path branch.
    HwSpec f = resolve_target(testenv::source_dir() + "/hw/" + n + ".json");
    EXPECT_EQ(describe(f), describe(hw));
  }
}

// The numbers of HARDWARE.md, as the presets must give them (hand arithmetic from the facts).
TEST(Hw, SpyrePresetMatchesTheFacts) {
  HwSpec hw = resolve_target("spyre");
  EXPECT_EQ(hw.cores, 32);
  EXPECT_DOUBLE_EQ(hw.clock_ghz, 1.0);
  EXPECT_EQ(hw.scratchpad_bytes, 2 * 1024 * 1024);
  // floor(2097152 * 0.8) = 1677721, down to a multiple of 128: 13107 * 128.
  EXPECT_EQ(hw.usable_scratchpad_bytes(), 1677696);
  EXPECT_EQ(hw.layout.kind, LayoutKind::stick);
  EXPECT_EQ(hw.layout.elements_per_stick(DType::f16), 64);
  EXPECT_EQ(hw.layout.elements_per_stick(DType::f32), 32);
  EXPECT_EQ(hw.layout.elements_per_stick(DType::i8), 128);
  // 1536 MAC/ns/core x 32 cores x 2 = 98.3 TFLOP/s.
  EXPECT_NEAR(hw.peak_flops(DType::f16), 98.304e12, 1e6);
  EXPECT_NEAR(hw.matrix.macs_per_pe(), 12.0, 1e-12);
  EXPECT_NEAR(hw.matrix.sustained_fraction * 1536, 1140, 1);
  EXPECT_NEAR(hw.dram.read_gbps * hw.dram.mixed_efficiency, 105, 1e-9);
  EXPECT_EQ(hw.interconnect.topology, Topology::ring);
  EXPECT_EQ(hw.interconnect.reduce_path, ReducePath::separate_reduce_ring);
  EXPECT_DOUBLE_EQ(hw.interconnect.bytes_per_cycle, 128);
  EXPECT_EQ(hw.interconnect.broadcast_limit, 8);
  EXPECT_DOUBLE_EQ(hw.overlap_factor, 0.46);
  EXPECT_EQ(hw.limits.max_dram_span_bytes, 256 << 20);
  EXPECT_EQ(hw.limits.max_loop_iterations, 65535);
  EXPECT_TRUE(hw.supports(DType::f16));
  EXPECT_FALSE(hw.supports(DType::f32));
}

TEST(Hw, TpuPresetsMatchTheFacts) {
  HwSpec v5e = load_preset("tpu-v5e");
  EXPECT_EQ(v5e.cores, 1);
  EXPECT_NEAR(v5e.peak_flops(DType::bf16), 197e12, 0.5e12);
  EXPECT_EQ(v5e.scratchpad_bytes, 128 << 20);
  EXPECT_DOUBLE_EQ(v5e.peak_dram_bytes_per_second(), 819e9);
  EXPECT_EQ(v5e.layout.kind, LayoutKind::tiled);
  EXPECT_EQ(v5e.layout.tile_rows_for(DType::f32), 8);
  EXPECT_EQ(v5e.layout.tile_rows_for(DType::bf16), 16);  // two rows per 32-bit word
  EXPECT_EQ(v5e.layout.elements_per_stick(DType::bf16), 256);
  EXPECT_DOUBLE_EQ(v5e.peak_flops(DType::f32), 0);      // no MXU rate for f32
  HwSpec v4 = load_preset("tpu-v4");
  EXPECT_EQ(v4.cores, 2);
  EXPECT_NEAR(v4.peak_flops(DType::bf16), 275e12, 0.5e12);
  EXPECT_EQ(v4.scratchpad_bytes, 16 << 20);
  EXPECT_DOUBLE_EQ(v4.peak_dram_bytes_per_second(), 1.2e12);
  EXPECT_EQ(v4.interconnect.topology, Topology::none);
}

TEST(Hw, UserFileAndUnknownTarget) {
  const auto dir = std::filesystem::temp_directory_path() / "tessel_hw_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "mine.json").string();
  {
    const nlohmann::json four = 4;
    std::ofstream(path) << edited("/cores", &four);
  }
  HwSpec hw = resolve_target(path);
  EXPECT_EQ(hw.cores, 4);
  EXPECT_EQ(hw.origin, path);
  try {
    resolve_target("spyer");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown target 'spyer'"), std::string::npos) << e.what();
  }
  try {
    load_hw_file((dir / "absent.json").string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("absent.json: cannot read"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(Hw, ErrorsNameFileAndField) {
  EXPECT_EQ(error_setting("/dram/read_gbps", -3), "hw/x.json: /dram/read_gbps: must be a number in [0.001, 1e+07] (got -3)");
  EXPECT_EQ(error_setting("/cores", "32"), "hw/x.json: /cores: must be an integer (got a string)");
  EXPECT_EQ(error_setting("/cores", 2.5), "hw/x.json: /cores: must be an integer (got 2.5)");
  EXPECT_EQ(error_setting("/cores", 0), "hw/x.json: /cores: must be an integer in [1, 65536] (got 0)");
  EXPECT_EQ(error_setting("/scratchpad/reserved_fraction", 1.5),
            "hw/x.json: /scratchpad/reserved_fraction: must be a number in [0, 1) (got 1.5)");
  EXPECT_EQ(error_setting("/interconnect/topology", "rign"),
            "hw/x.json: /interconnect/topology: must be one of 'ring', 'mesh', 'none' (got 'rign') (did you mean 'ring'?)");
  EXPECT_EQ(error_setting("/dram/reed_gbps", 100), "hw/x.json: /dram/reed_gbps: unknown field (did you mean 'read_gbps'?)");
  EXPECT_EQ(error_setting("/colour", "red"), "hw/x.json: /colour: unknown field");
  EXPECT_EQ(error_setting("/vector_unit/elements_per_cycle/exp", 4),
            "hw/x.json: /vector_unit/elements_per_cycle/exp: unknown field");
  EXPECT_EQ(error_setting("/dtypes/0", "fp16"), "hw/x.json: /dtypes/0: unknown dtype 'fp16' (did you mean 'f16'?)");
  EXPECT_EQ(error_setting("/matrix_unit", 3), "hw/x.json: /matrix_unit: must be an object (got a number)");
  EXPECT_EQ(error_setting("/matrix_unit/dtype_rate/f32", 1),
            "hw/x.json: /matrix_unit/dtype_rate/f32: dtype is not listed in /dtypes");
  EXPECT_EQ(error_setting("/matrix_unit/macs_per_cycle", 64),
            "hw/x.json: /matrix_unit/macs_per_cycle: must be at least count x rows x cols = 128 (one MAC per PE per "
            "cycle) (got 64)");
  EXPECT_EQ(error_setting("/interconnect/topology", "none"),
            "hw/x.json: /interconnect/reduce_path: must be 'dram' when topology is 'none' (got 'separate_reduce_ring')");
  EXPECT_EQ(error_setting("/interconnect/topology", "mesh"),
            "hw/x.json: /interconnect/reduce_path: 'separate_reduce_ring' needs topology 'ring'");
  EXPECT_EQ(error_setting("/notes/1", 5), "hw/x.json: /notes/1: must be a string (got a number)");
  EXPECT_EQ(error_of(edited("/dram/read_gbps", nullptr)), "hw/x.json: /dram/read_gbps: missing (required)");
  EXPECT_EQ(error_of(edited("/layout/stick_bytes", nullptr)), "hw/x.json: /layout/stick_bytes: missing (required)");
  EXPECT_EQ(error_setting("/layout/tile_rows", 8), "hw/x.json: /layout/tile_rows: only for layout kind 'tiled'");
  EXPECT_EQ(error_setting("/interconnect/mesh_shape", nlohmann::json::array({4, 8})),
            "hw/x.json: /interconnect/mesh_shape: only for topology 'mesh'");
  {
    auto j = nlohmann::json::parse(preset_file("spyre"));
    j["interconnect"]["topology"] = "none";
    j["interconnect"]["reduce_path"] = "dram";
    EXPECT_EQ(error_of(j.dump()), "hw/x.json: /interconnect/bytes_per_cycle: only for topology 'ring' or 'mesh'");
  }
  EXPECT_EQ(error_of("[1, 2]"), "hw/x.json: /: must be an object (got an array)");
}

TEST(Hw, MeshNeedsAShapeThatCoversTheCores) {
  auto j = nlohmann::json::parse(preset_file("spyre"));
  j["interconnect"]["topology"] = "mesh";
  j["interconnect"]["reduce_path"] = "ring";
  EXPECT_EQ(error_of(j.dump()), "hw/x.json: /interconnect/mesh_shape: missing (required)");
  j["interconnect"]["mesh_shape"] = {4, 4};
  EXPECT_EQ(error_of(j.dump()), "hw/x.json: /interconnect/mesh_shape: rows x cols must equal cores (32) (got 4 x 4)");
  j["interconnect"]["mesh_shape"] = {4, 8};
  EXPECT_EQ(error_of(j.dump()), "");
}

TEST(Hw, BadJsonGivesLineAndColumn) {
  // Line 3 lacks a comma after 32: the parser stops at the end of the next key, `  "clock_ghz"`,
  // whose last character is line 4, column 13.
  const std::string text = "{\n  \"name\": \"x\",\n  \"cores\": 32\n  \"clock_ghz\": 1\n}\n";
  const std::string msg = error_of(text);
  EXPECT_EQ(msg.rfind("hw/x.json:4:13: invalid JSON: ", 0), 0u) << msg;
}

// docs/hw.md's worked example is describe() of the spyre preset, verbatim.
TEST(Hw, DocsWorkedExampleIsDescribeOfSpyre) {
  const std::string md = testenv::read_text(testenv::source_dir() + "/docs/hw.md");
  const std::string fence = "```text describe spyre\n";
  const size_t b = md.find(fence);
  ASSERT_NE(b, std::string::npos) << "docs/hw.md has no " << fence;
  const size_t start = b + fence.size();
  EXPECT_EQ(md.substr(start, md.find("```", start) - start), describe(load_preset("spyre")));
}

// Every field of the schema table in docs/hw.md is a field the loader knows, and the other way round
// (a preset sets it or the table lists it).
TEST(Hw, DocsSchemaTableNamesRealFields) {
  const std::string md = testenv::read_text(testenv::source_dir() + "/docs/hw.md");
  for (const char* field : {"dram.mixed_efficiency", "interconnect.reduce_cycles_per_element_hop", "matrix_unit.dtype_rate",
                            "scratchpad.effective_working_set_bytes", "limits.max_loop_iterations", "kernel_overhead_ns",
                            "overlap_factor", "vector_unit.latency_cycles", "dma.engines_per_core"})
    EXPECT_NE(md.find(std::string("`") + field), std::string::npos) << field;
}

// Numbers far out of range made the event engine loop forever (1e305 cycles, 1e-305 GB/s: time
// became inf) or crashed it (2^32+1 cores: bad_alloc; 2^63 DMA engines: "never became ready"). Every
// number now has a finite range, and a value outside it names the file, the field, the range and
// the value.
TEST(Hw, EveryNumberHasAFiniteRange) {
  EXPECT_EQ(error_setting("/clock_ghz", 1e305), "hw/x.json: /clock_ghz: must be a number in [0.001, 100] (got 1e+305)");
  EXPECT_EQ(error_setting("/clock_ghz", 1e-305), "hw/x.json: /clock_ghz: must be a number in [0.001, 100] (got 1e-305)");
  for (const char* field :
       {"/matrix_unit/fill_cycles", "/matrix_unit/drain_cycles", "/matrix_unit/macs_per_cycle", "/matrix_unit/sustained_fraction",
        "/matrix_unit/dtype_rate/f16", "/vector_unit/latency_cycles", "/vector_unit/elements_per_cycle/add",
        "/dram/read_gbps", "/dram/write_gbps", "/dram/latency_cycles", "/dram/mixed_efficiency", "/dram/capacity_bytes",
        "/kernel_overhead_ns", "/overlap_factor", "/interconnect/bytes_per_cycle", "/interconnect/hop_latency_cycles",
        "/interconnect/reduce_cycles_per_element_hop", "/scratchpad/reserved_fraction"}) {
    for (double v : {1e305, -1e305}) {
      const std::string msg = error_setting(field, v);
      EXPECT_EQ(msg.rfind(fmt::format("hw/x.json: {}: must be a number in ", field), 0), 0u) << msg;
      EXPECT_NE(msg.find(fmt::format("(got {})", nlohmann::json(v).dump())), std::string::npos) << msg;
    }
  }
  // Rates and bandwidths must also stay away from zero (1e-305 is as good as 0 and makes time infinite).
  for (const char* field : {"/dram/read_gbps", "/matrix_unit/sustained_fraction", "/interconnect/reduce_cycles_per_element_hop",
                            "/vector_unit/elements_per_cycle/divide", "/interconnect/bytes_per_cycle"})
    EXPECT_NE(error_setting(field, 1e-305).find("must be a number in"), std::string::npos) << field;
}

TEST(Hw, CountsHaveUpperBounds) {
  EXPECT_EQ(error_setting("/cores", (uint64_t{1} << 32) + 1), "hw/x.json: /cores: must be an integer in [1, 65536] (got 4294967297)");
  EXPECT_EQ(error_setting("/dma/engines_per_core", uint64_t{1} << 63),
            "hw/x.json: /dma/engines_per_core: must be an integer in [1, 64] (got 9223372036854775808)");
  EXPECT_EQ(error_setting("/scratchpad/bytes_per_core", uint64_t{1} << 63),
            "hw/x.json: /scratchpad/bytes_per_core: must be an integer in [1, 17179869184] (got 9223372036854775808)");
  EXPECT_EQ(error_setting("/matrix_unit/rows", 1e300), "hw/x.json: /matrix_unit/rows: must be an integer in [1, 65536] (got 1e+300)");
  EXPECT_EQ(error_setting("/interconnect/broadcast_limit", -5),
            "hw/x.json: /interconnect/broadcast_limit: must be an integer in [1, 65536] (got -5)");
}

// A stick narrower than an element held 0 elements: SIGFPE in the mapper.
TEST(Hw, StickHoldsWholeElements) {
  EXPECT_EQ(error_setting("/layout/stick_bytes", 1),
            "hw/x.json: /layout/stick_bytes: must be a multiple of the size of every dtype in /dtypes (f16 is 2 bytes) "
            "(got 1)");
}

// A number too large for a double gave the JSON library's raw message, without the file.
TEST(Hw, NumberOverflowNamesTheFileAndPlace) {
  const std::string text = "{\n  \"name\": \"x\",\n  \"clock_ghz\": 1e99999\n}\n";
  EXPECT_EQ(error_of(text), "hw/x.json:3:16: invalid JSON: number overflow parsing '1e99999'");
}

// /dev/zero as a hardware file read forever; a FIFO blocked in open().
TEST(Hw, NonRegularFilesAreRefused) {
  const auto o = testenv::bounded([] { load_hw_file("/dev/zero"); });
  EXPECT_TRUE(o.error) << o.message;
  EXPECT_EQ(o.message, "/dev/zero: is a character device; expected a regular hardware file");
  const auto dir = std::filesystem::temp_directory_path() / ("tessel_hw_fifo_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string fifo = (dir / "hw.json").string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const auto f = testenv::bounded([&] { resolve_target(fifo); });
  EXPECT_EQ(f.message, fifo + ": is a FIFO (pipe); expected a regular hardware file");
  std::filesystem::remove_all(dir);
}
