// TESSEL_DUMP_DIR / CompiledBackendOptions::dump_dir (issue 36): a compilation on the compiled CPU backend
// writes every stage into a folder of its own: the graph before and after each pass, the kernel level and
// the generated source, each the text the compilation itself used.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tessel/ir/printer.h"
#include "tessel/passes/pass.h"
#include "tessel/runtime/compiled_backend.h"
#include "graph_test_util.h"
#include "test_util.h"

using namespace tessel;
namespace fs = std::filesystem;

namespace {

std::string read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

const char* kGraph = R"(graph @mlp(%x: f32[s0,8], %w: f32[8,4]) symbols(s0 in [1, 64]) {
  %h: f32[s0,4] = dot_general(%x, %w) {lhs_batch = ints[], lhs_contract = [1], rhs_batch = ints[], rhs_contract = [0]} loc("mm")
  %y: f32[s0,4] = tanh(%h) loc("act")
  return %y
}
)";

}  // namespace

TEST(StageDumps, EveryStageOfACompilationInAFolderOfItsOwn) {
  const fs::path root = fs::temp_directory_path() / ("tessel_dumps_" + std::to_string(getpid()));
  fs::remove_all(root);
  for (const bool symbolic : {false, true}) {
    CompiledBackendOptions o = testenv::compiled_test_options();
    o.dump_dir = root.string();
    o.model_name = symbolic ? "mlp sym/../x" : "mlp";
    std::string text = kGraph;
    if (!symbolic) text = R"(graph @mlp(%x: f32[3,8], %w: f32[8,4]) {
  %h: f32[3,4] = dot_general(%x, %w) {lhs_batch = ints[], lhs_contract = [1], rhs_batch = ints[], rhs_contract = [0]} loc("mm")
  %y: f32[3,4] = tanh(%h) loc("act")
  return %y
}
)";
    auto exe = compile_cpu(parse_graph(text, "mlp.tsl"), {}, o);
    const fs::path dir = exe->stats().dump_dir;
    ASSERT_FALSE(dir.empty());
    EXPECT_EQ(dir.parent_path(), root) << "a folder of its own under the one asked for, whatever the model's name";
    const size_t passes = parse_pipeline(o.pipeline).size();
    ASSERT_TRUE(fs::exists(dir / "00-input.tsl")) << dir;
    // the input dump is the graph as given; each pass's dump parses back (a graph-level text)
    EXPECT_EQ(print_graph(*parse_graph(read(dir / "00-input.tsl"), "in.tsl")), print_graph(*parse_graph(text, "mlp.tsl")));
    int graphs = 0;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".tsl") {
        EXPECT_NO_THROW(parse_graph(read(e.path()), e.path().string())) << e.path();
        ++graphs;
      }
    EXPECT_EQ(graphs, static_cast<int>(passes) + 1);
    EXPECT_TRUE(fs::exists(dir / fmt::format("{:02d}-fuse.kernel", passes + 1)));
    EXPECT_TRUE(fs::exists(dir / fmt::format("{:02d}-cpu-ftz-library-operands.kernel", passes + 2)));
    EXPECT_EQ(read(dir / fmt::format("{:02d}-cpu-codegen.cpp", passes + 1 + 2)), exe->source())
        << "the generated source dumped is the one compiled";
  }
  size_t folders = 0;
  for (const auto& e : fs::directory_iterator(root)) folders += e.is_directory();
  EXPECT_EQ(folders, 2u);
  fs::remove_all(root);
}

// Issue 36: the host CPU's pipeline is assembled in one place, lower::lower_cpu (lower/cpu.h). The
// compiled backend, the graph backend, the CLI and the Python module call it; none of them calls
// fusion with the CPU's options or the C++ generator itself, and the graph backend's hook that let the
// compiled backend run them inside its compile_graph (after_pipeline) is gone. Kernel nodes run through
// one typed object (KernelNodeRunner), not callback hooks (custom_kernel, writes_over_input as a
// std::function) on the options.
TEST(StageDumps, CompiledBackendHasNoPipelineHook) {
  const fs::path root = testenv::source_dir();
  std::vector<fs::path> files;
  for (const char* dir : {"src/tessel/runtime", "src/tessel/driver", "tools", "python/src"})
    for (const auto& e : fs::recursive_directory_iterator(root / dir))
      if (e.path().extension() == ".cpp" || e.path().extension() == ".h") files.push_back(e.path());
  ASSERT_GT(files.size(), 20u);
  for (const fs::path& f : files) {
    const std::string text = read(f);
    for (const char* word : {"after_pipeline", "custom_kernel", "cpu_fuse_options(", "generate_cpp(",
                             "std::function<CoreKernel", "std::function<bool(const Node"})
      EXPECT_EQ(text.find(word), std::string::npos) << f << " uses " << word << ": the CPU pipeline belongs to lower_cpu";
  }
  EXPECT_NE(read(root / "src/tessel/lower/cpu.cpp").find("cpu_fuse_options("), std::string::npos);
}
