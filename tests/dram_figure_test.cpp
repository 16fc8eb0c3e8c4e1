// One DRAM figure: kernel_traffic (the mapper's candidate cost and the reported dram_bytes) against the
// loads and stores the timing engine's tasks move, kernel by kernel (docs/sim.md "What a kernel's DRAM figure is").
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "corpus_util.h"
#include "tessel/driver/dataflow.h"
#include "tessel/targets/dataflow/timing.h"
#include "tessel/targets/dataflow/tile_traffic.h"

using namespace tessel;

namespace {

struct Moved {
  int64_t loaded = 0, stored = 0;
};

// The engine's own count: the bytes of the kernel's dma_load and dma_store tasks (what the simulation's
// dram_read_bytes / dram_write_bytes add up).
std::vector<Moved> engine_bytes(const dataflow::SimulatedProgram& sp, size_t kernels) {
  std::vector<Moved> m(kernels);
  for (size_t id = 0; id < sp.timeline.graph.size(); ++id) {
    const dataflow::Task& task = sp.timeline.graph.task(static_cast<dataflow::TaskId>(id));
    if (task.kernel < 0) continue;
    if (task.kind == dataflow::TaskKind::dma_load) m[static_cast<size_t>(task.kernel)].loaded += task.bytes;
    if (task.kind == dataflow::TaskKind::dma_store) m[static_cast<size_t>(task.kernel)].stored += task.bytes;
  }
  return m;
}

void check_model(const std::string& model, const std::string& target, int* convs) {
  SCOPED_TRACE(model + " on " + target);
  ModelPaths mp = resolve_model(model);
  DataflowCompile dc = compile_dataflow(mp.model, {}, hw::load_preset(target));
  const tile::TileProgram& p = dc.program;
  const dataflow::SimulatedProgram sp = dataflow::simulate_program(p);
  const std::vector<Moved> m = engine_bytes(sp, p.kernels.size());
  int64_t read = 0, written = 0;
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    const tile::TileKernel& t = p.kernels[i];
    if (t.kind == tile::TileKind::host) continue;
    const dataflow::Traffic tr = dataflow::kernel_traffic(t);
    EXPECT_EQ(tr.read, m[i].loaded) << t.name << " (" << t.node << ")";
    EXPECT_EQ(tr.write, m[i].stored) << t.name << " (" << t.node << ")";
    read += tr.read, written += tr.write;
    if (t.kind == tile::TileKind::conv) {
      ++*convs;
      // the reported figure is what the engine moves: its read part the engine's loads
      EXPECT_EQ(t.dram_bytes, m[i].loaded + m[i].stored) << t.name << " (" << t.node << ") reports another figure than it loads";
    }
  }
  // the simulation's totals (no partial sums go through DRAM on these targets: they have links)
  EXPECT_EQ(read, sp.result.dram_read_bytes);
  EXPECT_EQ(written, sp.result.dram_write_bytes);
}

}  // namespace

TEST(DramFigure, ConvolutionsReportWhatTheEngineLoads) {
  int convs = 0;
  check_model(testenv::source_dir() + "/examples/conv_kinds", "spyre", &convs);
  EXPECT_GE(convs, 4);
  if (!testenv::have_shared()) GTEST_SKIP() << "mobilenet_v2 needs ../shared";
  convs = 0;
  check_model(testenv::shared_dir() + "/models/mobilenet_v2", "spyre", &convs);
  EXPECT_EQ(convs, 52);
  convs = 0;
  check_model(testenv::shared_dir() + "/models/mobilenet_v2", "tpu-v5e", &convs);
  EXPECT_GT(convs, 0);
}

// kernel_traffic on a plan small enough to count by hand: a 2-core matmul-shaped kernel (b m n k), m split
// in two with a partial last tile, B broadcast to both cores, k the innermost loop.
TEST(DramFigure, HandCountedPlan) {
  tile::TileKernel t;
  t.kind = tile::TileKind::matmul;
  t.dims = {{"b", 1, 1, 1, 1, 1, false}, {"m", 10, 2, 5, 4, 1, false}, {"n", 8, 1, 8, 8, 1, false}, {"k", 6, 1, 6, 3, 1, true}};
  t.order = {0, 1, 2, 3};
  t.cores = 2;
  auto op = [](std::string role, int global, bool out, std::vector<int> dims, int64_t bytes, int fanout) {
    tile::Operand o;
    o.role = std::move(role), o.global = global, o.out = out, o.dims = std::move(dims), o.tile_bytes = bytes, o.fanout = fanout;
    o.copies = 2;
    return o;
  };
  t.operands = {op("a", 0, false, {0, 1, 3}, 4 * 3 * 2, 1), op("b", 1, false, {0, 3, 2}, 3 * 8 * 2, 2),
                op("acc", -1, false, {0, 1, 2}, 4 * 8 * 4, 1), op("c", 2, true, {0, 1, 2}, 4 * 8 * 2, 1)};
  // Each core: m tiles of 4 and 1 rows (slice 5), k tiles 3 + 3: 4 steps.
  //  a: reloaded every step (k innermost): (4+1 rows) x (3+3) k x 2 bytes = 60 per core, 120 in all.
  //  b: k changes every step, so 4 loads of 48 bytes by core 0, broadcast to core 1: 192.
  //  c: one store per m tile: (4+1) x 8 x 2 = 80 per core, 160 in all.
  const dataflow::Traffic tr = dataflow::kernel_traffic(t);
  EXPECT_EQ(tr.read, 120 + 192);
  EXPECT_EQ(tr.write, 160);
  // k in one tile: b is resident after the first step (one load per core pair), a loads once per m tile
  t.dims[3].tile = 6;
  t.operands[0].tile_bytes = 4 * 6 * 2, t.operands[1].tile_bytes = 6 * 8 * 2;
  const dataflow::Traffic one = dataflow::kernel_traffic(t);
  EXPECT_EQ(one.read, 2 * (4 + 1) * 6 * 2 + 96);
  EXPECT_EQ(one.write, 160);
}
