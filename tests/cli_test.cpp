// The `tessel` command line: help, exit codes, one-line errors naming the place, and --check.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "tessel/frontend/onnx/importer.h"
#include "test_util.h"

using namespace tessel;
namespace fs = std::filesystem;

namespace {

struct Result {
  int code;
  std::string out;
};

Result run(const std::string& args) {
  std::string cmd = testenv::tessel_binary() + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

fs::path tmp() {
  fs::path d = fs::temp_directory_path() / ("tessel_cli_test_" + std::to_string(getpid()));
  fs::create_directories(d);
  return d;
}

const std::string kModel = testenv::source_dir() + "/examples/tblock_s";

}  // namespace

TEST(Cli, HelpOnEverySubcommand) {
  for (const char* sub : {"", "run", "compile", "conformance", "bench"}) {
    Result r = run(std::string(sub) + " --help");
    EXPECT_EQ(r.code, 0) << sub;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << r.out;
  }
}

TEST(Cli, RunCheckPasses) {
  Result r = run("run " + kModel + " --check");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("relative error"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("PASS"), std::string::npos) << r.out;
}

TEST(Cli, CheckFailsAgainstAWrongReference) {
  fs::path d = tmp() / "wrong_ref";
  fs::create_directories(d);
  fs::copy_file(kModel + "/test_data_set_0/input_0.pb", d / "input_0.pb", fs::copy_options::overwrite_existing);
  Tensor ref = read_tensor_pb(kModel + "/test_data_set_0/output_0.pb").clone();
  ref.set_f(5, ref.get_f(5) + 1.0);
  write_tensor_pb(ref, "out", (d / "output_0.pb").string());
  Result r = run("run " + kModel + " --inputs " + d.string() + " --check");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("FAIL"), std::string::npos) << r.out;
}

TEST(Cli, WrongInputShapeAndDtypeNameTheInput) {
  fs::path d = tmp() / "bad_shape";
  fs::create_directories(d);
  write_tensor_pb(Tensor(DType::f32, {1, 64, 256}), "x", (d / "input_0.pb").string());
  Result r = run("run " + kModel + "/model.onnx --inputs " + d.string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("graph input 'x' is declared f32[1,128,256] but was given shape [1,64,256]"), std::string::npos)
      << r.out;
  write_tensor_pb(Tensor(DType::f64, {1, 128, 256}), "x", (d / "input_0.pb").string());
  r = run("run " + kModel + "/model.onnx --inputs " + d.string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("input 'x' must be f32[1,128,256] but got f64[1,128,256]"), std::string::npos) << r.out;
}

TEST(Cli, ErrorsAreOneLineNamingTheFile) {
  Result r = run("run /nonexistent/model.onnx");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "tessel: error: /nonexistent/model.onnx: no such file or folder\n");
  r = run("compile " + kModel + " --emit tile");
  EXPECT_NE(r.code, 0);
}

TEST(Cli, CompiledTextRunsLikeTheModel) {
  fs::path t = tmp() / "tblock_s.tsl";
  Result r = run("compile " + kModel + " --emit graph -o " + t.string());
  ASSERT_EQ(r.code, 0) << r.out;
  Result again = run("compile " + t.string() + " --emit graph");
  EXPECT_EQ(again.code, 0);
  EXPECT_EQ(again.out, testenv::read_text(t.string()));
  r = run("run " + t.string() + " --inputs " + kModel + "/test_data_set_0 --check");
  EXPECT_EQ(r.code, 0) << r.out;
}

// `tessel bench` measures each backend in one run and writes the figures as JSON; the memory figures
// are the same accounting as `tessel run` (graph ≤ eager on the bundled model). No timing assertions.
TEST(Cli, BenchWritesEveryFigurePerBackend) {
  fs::path json = tmp() / "bench.json";
  Result r = run("bench " + kModel + " --iters 2 --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("median ms"), std::string::npos) << r.out;
  auto j = nlohmann::json::parse(testenv::read_text(json.string()));
  ASSERT_EQ(j.at("backends").size(), 2u);
  for (const auto& b : j.at("backends"))
    for (const char* k : {"cold_compile_s", "cached_compile_s", "median_ms", "p10_ms", "p90_ms", "speedup_vs_eager",
                          "break_even_iters", "peak_mem_bytes"})
      EXPECT_TRUE(b.contains(k)) << k;
  const auto& eager = j["backends"][0];
  const auto& graph = j["backends"][1];
  EXPECT_EQ(eager["backend"], "eager");
  EXPECT_EQ(graph["backend"], "graph");
  EXPECT_DOUBLE_EQ(eager["speedup_vs_eager"].get<double>(), 1.0);
  EXPECT_GT(graph["cold_compile_s"].get<double>(), 0.0);
  EXPECT_LE(graph["p10_ms"].get<double>(), graph["p90_ms"].get<double>());
  EXPECT_LE(graph["peak_mem_bytes"].get<size_t>(), eager["peak_mem_bytes"].get<size_t>());
  Result bad = run("bench " + kModel + " --backends eager,warp");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("unknown backend 'warp'"), std::string::npos) << bad.out;
}

// f32 storage, where a hardware file has it, makes the functional simulation an exact check of the
// mapping (bench/tv_onnx.py's PRESET:f32 columns); a target without f32 refuses it by name.
TEST(Cli, SimWithF32StorageIsCheckedAtF32Tolerance) {
  nlohmann::json hw = nlohmann::json::parse(testenv::read_text(testenv::source_dir() + "/hw/spyre.json"));
  hw["dtypes"].push_back("f32");
  hw["matrix_unit"]["dtype_rate"]["f32"] = 0.25;
  const fs::path f = tmp() / "spyre_f32.json";
  {
    std::ofstream o(f);
    o << hw.dump(1);
  }
  Result r = run("sim " + kModel + " --hw " + f.string() + " --dtype f32");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("functional simulation (f32 storage"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(tolerance 1e-04) -> PASS"), std::string::npos) << r.out;
  Result no = run("sim " + kModel + " --hw spyre --dtype f32");
  EXPECT_NE(no.code, 0) << no.out;
  EXPECT_NE(no.out.find("f32"), std::string::npos) << no.out;
}

// `compile --train` (docs/passes/autodiff.md): the joint graph with one gradient output per parameter and
// the summary line; a name that is no value is a one-line error.
TEST(Cli, CompileTrainPrintsTheJointGraphAndItsSummary) {
  Result r = run("compile " + kModel + " --train --elide-constants");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("train: 10 parameters (789248 elements), 10 gradient outputs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("min-cut partition: saves"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(".grad"), std::string::npos);
  r = run("compile " + kModel + " --train --wrt nope");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("'nope' is not a value"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}
