// The cross-level stage list and pipeline (see lowering.h).
#include "tessel/lower/lowering.h"

#include <fmt/format.h>

#include "tessel/ir/printer.h"
#include "tessel/support/error.h"

namespace tessel::lower {

const std::vector<StageInfo>& all_stages() {
  static const std::vector<StageInfo> stages = [] {
    std::vector<StageInfo> s;
    for (const Pass& p : all_passes()) s.push_back({p.name, p.summary, IrLevel::graph, IrLevel::graph});
    s.push_back({"fuse", "group core nodes into kernels: loop nests over index maps, matmul/conv with fused epilogues",
                 IrLevel::graph, IrLevel::kernel});
    s.push_back({"cpu-ftz-library-operands", "host CPU: values only oneDNN products read are stored with subnormals as zero (store.ftz)",
                 IrLevel::kernel, IrLevel::kernel});
    s.push_back({"cpu-codegen", "host CPU: the epilogues oneDNN applies itself, then one C++ translation unit of the kernels",
                 IrLevel::kernel, IrLevel::source});
    s.push_back({"cuda-orient-transposes", "CUDA: a transpose feeding a device matmul keeps its operand's row order (the matmul reads it transposed)",
                 IrLevel::kernel, IrLevel::kernel});
    s.push_back({"tile-layout", "dataflow targets: device dtypes, channels-last around convolutions, inputs padded to sticks/tiles",
                 IrLevel::kernel, IrLevel::tile});
    s.push_back({"tile-plan", "dataflow targets: per kernel, work division over the cores, tiling for the scratchpad, loop order",
                 IrLevel::kernel, IrLevel::tile});
    s.push_back({"tile-allocate", "dataflow targets: scratchpad offsets per kernel, DRAM offsets by liveness",
                 IrLevel::kernel, IrLevel::tile});
    return s;
  }();
  return stages;
}

const StageInfo* find_stage(const std::string& name) {
  for (const StageInfo& s : all_stages())
    if (s.name == name) return &s;
  return nullptr;
}

namespace {

const PassOptions& checked(const PassOptions& opts) {
  if (!opts.print_after.empty() && !find_stage(opts.print_after)) {
    std::string known;
    for (const StageInfo& s : all_stages()) known += (known.empty() ? "" : ", ") + s.name;
    throw Error(Location{.pass = "pipeline"},
                fmt::format("--print-after names unknown pass '{}' (known: {})", opts.print_after, known));
  }
  return opts;
}

Stage stage(const std::string& name) {
  Stage s;
  s.info = *find_stage(name);
  return s;
}

}  // namespace

Lowering::Lowering(const PassOptions& opts) : runner_(checked(opts)), verify_(opts.verify) {}

void Lowering::graph_passes(Graph& g, const std::string& spec) {
  const std::vector<const Pass*> pipeline = parse_pipeline(spec);
  runner_.begin(IrLevel::graph, [&g] { return print_graph(g); });
  for (const Pass* p : pipeline) runner_.run(graph_stage(g, *p));
}

KernelModule Lowering::fuse(std::unique_ptr<Graph> g, const FuseOptions& fo, bool elide_constants) {
  runner_.begin(IrLevel::graph, [&g] { return print_graph(*g); });
  KernelModule km;
  Stage s = stage("fuse");
  s.run = [&] {
    km = ::tessel::fuse(std::move(g), fo);
    return fmt::format("{} kernels", km.kernels.size());
  };
  s.verify = [&km] { verify_kernel_module(km); };
  s.print = [&km, elide_constants] { return print_kernel_module(km, elide_constants); };
  s.size = [&km] { return km.kernels.size(); };
  runner_.run(s);
  return km;
}

void Lowering::run(const std::string& name, std::function<std::string()> run, std::function<std::string()> print,
                   std::function<size_t()> size, std::function<void()> verify) {
  Stage s = stage(name);
  s.run = std::move(run);
  s.verify = std::move(verify);
  s.print = std::move(print);
  s.size = std::move(size);
  runner_.run(s);
}

tile::TileProgram Lowering::map_to_tiles(const KernelModule& km, const hw::HwSpec& hw, const dataflow::MapOptions& mo) {
  runner_.begin(IrLevel::kernel, [&km] { return print_kernel_module(km); });
  dataflow::TileMapping mapping(km, hw, mo);
  // the three stages print and verify the program as far as it is built; offsets exist after allocate
  auto run = [&](const std::string& name, std::string (dataflow::TileMapping::*step)(), bool allocated) {
    Stage s = stage(name);
    s.run = [&mapping, step] { return (mapping.*step)(); };
    s.verify = [&mapping, allocated] { tile::verify_tile_program(mapping.program(), allocated); };
    s.print = [&mapping] { return tile::print_tile_program(mapping.program()); };
    s.size = [&mapping] { return mapping.program().kernels.size(); };
    runner_.run(s);
  };
  run("tile-layout", &dataflow::TileMapping::layout, false);
  run("tile-plan", &dataflow::TileMapping::plan, false);
  run("tile-allocate", &dataflow::TileMapping::allocate, true);
  tile::TileProgram p = mapping.take();
  // with the stage verifiers off (PassOptions::verify), still the check dataflow::map_to_tiles always makes
  if (!verify_) tile::verify_tile_program(p);
  return p;
}

}  // namespace tessel::lower
