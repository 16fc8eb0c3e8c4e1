// The pass manager across levels (passes/stage.h, lower/lowering.h): `tessel passes` lists fusion and
// the dataflow stages; --print-after prints each level's text; --dump-ir writes one file per stage and
// the last tile dump parses back to the program; a failing verifier names its stage; and
// docs/passes/manager.md's worked example is what the manager does.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <sstream>

#include "tessel/driver/dataflow.h"
#include "tessel/lower/lowering.h"
#include "tessel/hw/hw.h"
#include "tessel/ir/printer.h"
#include "tessel/passes/stage.h"
#include "tessel/support/error.h"
#include "test_util.h"

using namespace tessel;
namespace fs = std::filesystem;

namespace {

std::string example() { return testenv::source_dir() + "/examples/tblock_s"; }

// compile_dataflow of the bundled example on spyre with --print-after `stage`; returns what it printed.
std::string printed_after(const std::string& stage, DataflowCompile* out = nullptr) {
  std::string text;
  PassOptions po;
  po.print_after = stage;
  po.print = [&text](const std::string& t) { text += t; };
  DataflowCompile dc = compile_dataflow(example(), {}, hw::load_preset("spyre"), {}, po);
  if (out) *out = std::move(dc);
  return text;
}

// The dump files of a folder, sorted.
std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST(StageManager, ListsFusionAndTheDataflowStages) {
  auto arrow = [](const std::string& name) {
    const StageInfo* s = lower::find_stage(name);
    return s ? std::string(level_name(s->from)) + "->" + level_name(s->to) : std::string("missing");
  };
  EXPECT_EQ(arrow("fuse"), "graph->kernel");
  EXPECT_EQ(arrow("tile-layout"), "kernel->tile");
  EXPECT_EQ(arrow("tile-plan"), "kernel->tile");
  EXPECT_EQ(arrow("tile-allocate"), "kernel->tile");
  EXPECT_EQ(arrow("cpu-codegen"), "kernel->source");
  EXPECT_EQ(arrow("cuda-orient-transposes"), "kernel->kernel");
  EXPECT_EQ(arrow("cpu-ftz-library-operands"), "kernel->kernel");
  for (const Pass& p : all_passes()) EXPECT_EQ(arrow(p.name), "graph->graph") << p.name;
  EXPECT_EQ(lower::all_stages().size(), all_passes().size() + 7);
  EXPECT_EQ(lower::find_stage("frobnicate"), nullptr);
}

TEST(StageManager, PrintAfterPrintsEachLevel) {
  DataflowCompile dc;
  // kernel level: fusion's output, the printer `tessel compile --emit kernel` uses
  const std::string kernel = printed_after("fuse", &dc);
  EXPECT_EQ(kernel, print_kernel_module(dc.module));
  EXPECT_EQ(kernel.rfind("# tessel kernel level", 0), 0u) << kernel.substr(0, 80);
  // tile level after planning: every kernel planned, no DRAM offsets yet; the text parses back
  const std::string plan = printed_after("tile-plan");
  EXPECT_EQ(plan.rfind("# tessel tile level", 0), 0u) << plan.substr(0, 80);
  const tile::TileProgram planned = tile::parse_tile_program(plan, "plan.tile", dc.program.hw);
  EXPECT_EQ(tile::print_tile_program(planned), plan);
  EXPECT_EQ(planned.kernels.size(), dc.program.kernels.size());
  for (const tile::Global& g : planned.globals) EXPECT_EQ(g.offset, -1) << g.name;
  EXPECT_NO_THROW(tile::verify_tile_program(planned, /*allocated=*/false));
  // after allocation it is the program
  EXPECT_EQ(printed_after("tile-allocate"), tile::print_tile_program(dc.program));
  // an unknown name is an error that lists the stages
  try {
    printed_after("frobnicate");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tile-plan"), std::string::npos) << e.what();
  }
}

TEST(StageManager, DumpIrWritesEveryStageAndTheLastTileDumpParsesBack) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("tessel_stages_{}", getpid());
  fs::remove_all(dir);
  PassOptions po;
  po.dump_dir = dir.string();
  const DataflowCompile dc = compile_dataflow(example(), {}, hw::load_preset("spyre"), {}, po);
  const std::vector<std::string> files = listing(dir);
  ASSERT_EQ(files.size(), dc.stages.size() + 1);
  EXPECT_EQ(files.front(), "00-input.tsl");
  for (size_t i = 0; i < dc.stages.size(); ++i) {
    const StageInfo* s = lower::find_stage(dc.stages[i].pass);
    ASSERT_NE(s, nullptr) << dc.stages[i].pass;
    EXPECT_EQ(files[i + 1], fmt::format("{:02d}-{}.{}", i + 1, s->name, level_extension(s->to)));
  }
  EXPECT_EQ(dc.stages[dc.stages.size() - 4].pass, "fuse");
  // every dump parses back with its level's parser: graph, then the kernel level fusion wrote
  for (size_t i = 0; i + 3 < files.size(); ++i) {
    const std::string path = (dir / files[i]).string();
    if (files[i].ends_with(".tsl")) {
      EXPECT_NO_THROW(parse_graph(testenv::read_text(path), path)) << path;
    }
  }
  const std::string kernel_dump = (dir / files[files.size() - 4]).string();
  EXPECT_EQ(print_kernel_module(parse_kernel_module(testenv::read_text(kernel_dump), kernel_dump)), print_kernel_module(dc.module));
  const fs::path last = dir / files.back();
  EXPECT_EQ(files.back(), fmt::format("{:02d}-tile-allocate.tile", dc.stages.size()));
  const tile::TileProgram back = tile::parse_tile_program(testenv::read_text(last.string()), last.string(), dc.program.hw);
  EXPECT_EQ(tile::print_tile_program(back), tile::print_tile_program(dc.program));
  EXPECT_NO_THROW(tile::verify_tile_program(back));
  fs::remove_all(dir);
}

TEST(StageManager, AFailingVerifierNamesItsStage) {
  StageRunner runner(PassOptions{});
  runner.begin(IrLevel::kernel, [] { return std::string(); });
  Stage s;
  s.info = {"breaker", "breaks the tile level", IrLevel::kernel, IrLevel::tile};
  s.run = [] { return std::string("broke it"); };
  s.verify = [] { throw Error(Location{.node = "t3"}, "scratchpad buffers overlap"); };
  s.print = [] { return std::string(); };
  try {
    runner.run(s);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[verify after breaker]"), std::string::npos) << e.what();
  }
  // a real one: the tile verifier after tile-plan, on a program whose padding no target layout gives
  lower::Lowering lowering(PassOptions{});
  auto g = parse_graph("graph @g(%x: f32[4,8]) {\n  %y: f32[4,8] = Relu(%x) loc(\"r\")\n  return %y\n}\n");
  lowering.graph_passes(*g, "core");
  KernelModule km = lowering.fuse(std::move(g));
  dataflow::TileMapping mapping(km, hw::load_preset("spyre"));
  mapping.layout();
  tile::TileProgram p = mapping.take();
  p.globals[0].padded = {4, 9};
  StageRunner r2(PassOptions{});
  r2.begin(IrLevel::tile, [] { return std::string(); });
  Stage v;
  v.info = *lower::find_stage("tile-plan");
  v.run = [] { return std::string(); };
  v.verify = [&p] { tile::verify_tile_program(p, false); };
  v.print = [] { return std::string(); };
  try {
    r2.run(v);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[verify after tile-plan]"), std::string::npos) << e.what();
  }
}

// docs/passes/manager.md: its `tessel passes` lines are all_stages(), and its dump listing is what
// --dump-ir writes for the bundled example on spyre.
TEST(StageManager, DocExampleMatches) {
  const std::string doc = testenv::read_text(testenv::source_dir() + "/docs/passes/manager.md");
  ASSERT_FALSE(doc.empty());
  for (const StageInfo& s : lower::all_stages()) {
    const std::string line = fmt::format("  {:<16} {:<15} {}", s.name, fmt::format("{} → {}", level_name(s.from), level_name(s.to)), s.summary);
    EXPECT_NE(doc.find(line), std::string::npos) << "docs/passes/manager.md lacks: " << line;
  }
  std::vector<std::string> documented;
  std::istringstream in(doc);
  const std::regex dump_line(R"(^[0-9][0-9]-[a-z-]+\.(tsl|kernel|tile)$)");
  for (std::string l; std::getline(in, l);)
    if (std::regex_match(l, dump_line)) documented.push_back(l);
  const fs::path dir = fs::temp_directory_path() / fmt::format("tessel_stages_doc_{}", getpid());
  fs::remove_all(dir);
  PassOptions po;
  po.dump_dir = dir.string();
  compile_dataflow(example(), {}, hw::load_preset("spyre"), {}, po);
  EXPECT_EQ(documented, listing(dir));
  fs::remove_all(dir);
}
