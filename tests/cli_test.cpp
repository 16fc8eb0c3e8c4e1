// The `tessel` command line: help, exit codes, one-line errors naming the place, and --check.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tessel/driver/bench_peers.h"
#include "tessel/frontend/onnx/importer.h"
#include "tessel/ir/op_registry.h"
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

// A refusal of the command line: exit 2 and one line, "tessel: error: ..." holding `says`.
void expect_refused(const std::string& args, const std::string& says) {
  Result r = run(args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
  EXPECT_EQ(r.out.rfind("tessel: error: ", 0), 0u) << args << "\n" << r.out;
  EXPECT_NE(r.out.find(says), std::string::npos) << args << "\n" << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << args << "\n" << r.out;
}

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

// `run --json`: the outputs' types and summaries against the reference outputs read independently, and
// the check's verdict as printed; a file that cannot be written is a one-line error.
TEST(Cli, RunJsonHoldsTheOutputsAndTheCheck) {
  const fs::path out = tmp() / "run.json";
  Result r = run("run " + kModel + " --check --json " + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream f(out);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["backend"], "eager");
  ASSERT_EQ(j["outputs"].size(), 1u);
  const Tensor ref = read_tensor_pb(kModel + "/test_data_set_0/output_0.pb");
  EXPECT_EQ(j["outputs"][0]["shape"].get<Shape>(), ref.shape());
  double lo = ref.get_f(0), hi = ref.get_f(0);
  for (int64_t k = 0; k < ref.numel(); ++k) lo = std::min(lo, ref.get_f(k)), hi = std::max(hi, ref.get_f(k));
  EXPECT_NEAR(j["outputs"][0]["min"].get<double>(), lo, 1e-4 * (std::abs(hi) + std::abs(lo)));
  EXPECT_NEAR(j["outputs"][0]["max"].get<double>(), hi, 1e-4 * (std::abs(hi) + std::abs(lo)));
  EXPECT_EQ(j["check"]["pass"], true);
  EXPECT_EQ(j["check"]["outputs"][0]["match"], true);
  Result plain = run("run " + kModel + " --json " + out.string());
  ASSERT_EQ(plain.code, 0) << plain.out;
  std::ifstream g(out);
  EXPECT_TRUE(nlohmann::json::parse(g)["check"].is_null());
  if (fs::exists("/dev/full")) {
    Result full = run("run " + kModel + " --json /dev/full");
    EXPECT_EQ(full.code, 2) << full.out;
    EXPECT_NE(full.out.find("/dev/full: cannot write output file"), std::string::npos) << full.out;
  }
  expect_refused("run " + kModel + " --target cuda --json " + out.string(), "--json has no effect here");
}

// `compile --json`: the graph's ops as the importer gives them, and after lowering the kernels the
// printed kernel level holds, with the fusion report's totals.
TEST(Cli, CompileJsonSaysWhatItRanAndMade) {
  const fs::path out = tmp() / "compile.json", text = tmp() / "compile.txt";
  Result g = run("compile " + kModel + " -o " + text.string() + " --json " + out.string());
  ASSERT_EQ(g.code, 0) << g.out;
  nlohmann::json j = nlohmann::json::parse(std::ifstream(out));
  ImportedModel m = import_onnx(kModel + "/model.onnx");
  EXPECT_EQ(j["graph"]["nodes"].get<size_t>(), m.graph->nodes().size());
  int matmuls = 0;
  for (const auto& n : m.graph->nodes()) matmuls += n->op->name == "MatMul";
  EXPECT_EQ(j["graph"]["ops"]["MatMul"].get<int>(), matmuls);
  EXPECT_EQ(j["output"], text.string());
  EXPECT_TRUE(j["stages"].empty());  // --emit graph without --passes runs no pass
  Result k = run("compile " + kModel + " --emit kernel -o " + text.string() + " --json " + out.string());
  ASSERT_EQ(k.code, 0) << k.out;
  j = nlohmann::json::parse(std::ifstream(out));
  const std::string kernels = testenv::read_text(text.string());
  size_t printed = 0;
  for (size_t at = kernels.find("\nkernel k"); at != std::string::npos; at = kernels.find("\nkernel k", at + 1)) ++printed;
  EXPECT_EQ(j["kernels"]["count"].get<size_t>(), printed);
  int by_kind = 0;
  for (const auto& [kind, n] : j["kernels"]["by_kind"].items()) by_kind += n.get<int>();
  EXPECT_EQ(static_cast<size_t>(by_kind), printed);
  ASSERT_FALSE(j["stages"].empty());
  EXPECT_EQ(j["stages"].back()["stage"], "cpu-ftz-library-operands");  // the host CPU's stage after fuse
  Result fusion = run("compile " + kModel + " --emit fusion");
  ASSERT_EQ(fusion.code, 0) << fusion.out;
  EXPECT_NE(fusion.out.find(std::to_string(j["kernels"]["bytes_unfused"].get<int64_t>())), std::string::npos) << fusion.out;
  EXPECT_NE(fusion.out.find(std::to_string(j["kernels"]["bytes_fused"].get<int64_t>())), std::string::npos) << fusion.out;
  expect_refused("compile " + kModel + " --target spyre --json " + out.string(), "--json has no effect here");
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
// By default every backend that applies runs: compiled too (a C++ compiler is here).
TEST(Cli, BenchWritesEveryFigurePerBackend) {
  fs::path json = tmp() / "bench.json";
  Result r = run("bench " + kModel + " --iters 2 --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("median ms"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\ncompiled "), std::string::npos) << "the compiled row\n" << r.out;
  for (const char* b : {"eager", "graph", "compiled"}) EXPECT_EQ(r.out.find(std::string("skipped ") + b), std::string::npos) << r.out;
  auto j = nlohmann::json::parse(testenv::read_text(json.string()));
  ASSERT_EQ(j.at("backends").size(), 3u);
  // --peers defaults to auto: both peers, each a row or a skipped line with its reason
  EXPECT_EQ(j.at("peers").size() + j.at("peers_skipped").size(), 2u) << r.out;
  EXPECT_EQ(j["backends"][2]["backend"], "compiled");
  EXPECT_TRUE(j["backends"][2]["cached_compile_s"].is_number());
  EXPECT_TRUE(j.at("skipped").empty());
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

// `tessel bench`'s peers (issue 37): PyTorch eager runs the same model file in its own process after
// tessel's backends, its row beside them with the compiled/peer ratio; the reference-BLAS warning fires
// exactly when the peer's process mapped Debian's netlib libblas (what its JSON lists). ONNX Runtime is
// a row where onnxruntime-node is installed, else a skipped line with the reason -- never a failure.
TEST(Cli, BenchAddsPeerRowsAndTheirWarnings) {
  fs::path json = tmp() / "bench_peers.json";
  Result r = run("bench " + kModel + " --iters 2 --backends compiled --threads 2 --peers torch,ort --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(testenv::read_text(json.string()));
  ASSERT_EQ(j.at("peers").size() + j.at("peers_skipped").size(), 2u) << r.out;
  bool torch_row = false;
  for (const auto& p : j.at("peers")) {
    EXPECT_GT(p.at("median_ms").get<double>(), 0.0) << p.dump();
    EXPECT_TRUE(p.at("compiled_over_peer").is_number()) << p.dump();
    ASSERT_TRUE(p.at("max_abs_err").is_number()) << p.dump();
    EXPECT_LT(p.at("max_abs_err").get<double>(), 1e-3) << "the peer computed the model's outputs\n" << p.dump();
    EXPECT_NE(r.out.find("\n" + p.at("peer").get<std::string>() + " "), std::string::npos) << r.out;
    if (p.at("peer") != "pytorch-eager") continue;
    torch_row = true;
    EXPECT_EQ(p.at("threads"), 2) << p.dump();
    bool netlib = false;
    for (const auto& l : p.at("blas")) {
      const std::string path = l.get<std::string>();
      netlib = netlib || (path.find("/blas/libblas.so") != std::string::npos && path.find("openblas") == std::string::npos);
    }
    bool warned = false;
    for (const auto& w : j.at("peer_warnings")) warned = warned || w.get<std::string>().find("reference (netlib) BLAS") != std::string::npos;
    EXPECT_EQ(warned, netlib) << j.dump(1);
    EXPECT_EQ(netlib, r.out.find("warning: pytorch-eager uses the reference (netlib) BLAS") != std::string::npos) << r.out;
  }
  EXPECT_TRUE(torch_row) << "python3 with torch and onnx is a dev package (./dev)\n" << r.out;
  for (const auto& s : j.at("peers_skipped")) {
    EXPECT_EQ(s.at("peer"), "onnxruntime") << s.dump();
    EXPECT_EQ(s.at("reason").get<std::string>().find('\n'), std::string::npos) << s.dump();
  }
  Result none = run("bench " + kModel + " --iters 1 --backends eager --peers none");
  ASSERT_EQ(none.code, 0) << none.out;
  EXPECT_EQ(none.out.find("peers"), std::string::npos) << none.out;
  Result bad = run("bench " + kModel + " --peers torch,tf");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--peers: unknown peer 'tf'"), std::string::npos) << bad.out;
  Result serve = run("bench " + kModel + " --serve --peers torch < /dev/null");
  EXPECT_EQ(serve.code, 2) << serve.out;
  EXPECT_NE(serve.out.find("--peers has no effect here"), std::string::npos) << serve.out;
}

// The warnings on synthetic rows: the reference BLAS by its Debian path (not OpenBLAS's libblas.so.3, which
// Debian installs under openblas-pthread/), and fewer peer threads than tessel's.
TEST(Cli, PeerWarningsNameTheReferenceBlasAndFewerThreads) {
  PeerBench torch_row;
  torch_row.peer = "pytorch-eager";
  torch_row.threads = 2;
  torch_row.blas = {"/usr/lib/x86_64-linux-gnu/blas/libblas.so.3.11.0", "/usr/lib/x86_64-linux-gnu/lapack/liblapack.so.3.11.0"};
  std::vector<std::string> w = peer_warnings({torch_row}, 2);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("reference (netlib) BLAS"), std::string::npos) << w[0];
  torch_row.blas = {"/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"};
  EXPECT_TRUE(peer_warnings({torch_row}, 2).empty());
  torch_row.threads = 1;
  w = peer_warnings({torch_row}, 2);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("pytorch-eager ran on 1 thread, tessel's compiled backend on 2"), std::string::npos) << w[0];
  EXPECT_EQ(parse_peers("auto"), (std::vector<std::string>{"torch", "ort"}));
  EXPECT_TRUE(parse_peers("none").empty());
  EXPECT_EQ(parse_peers("ort,torch,ort"), (std::vector<std::string>{"ort", "torch"}));
}

// `tessel bench --serve`: one ready line (checked against the data set's outputs), then one JSON line of N
// call times per line N on stdin; a bad line gets an error line and the server goes on (bench/paired.py).
TEST(Cli, BenchServeAnswersEachCountWithThatManyTimes) {
  fs::path in = tmp() / "serve_in.txt";
  std::ofstream(in) << "3\nthree\n0\n1\n";
  Result r = run("bench " + kModel + " --serve --threads 1 < " + in.string());
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<nlohmann::json> lines;
  size_t b = 0;
  for (size_t e; (e = r.out.find('\n', b)) != std::string::npos; b = e + 1) lines.push_back(nlohmann::json::parse(r.out.substr(b, e - b)));
  ASSERT_EQ(lines.size(), 5u) << r.out;
  EXPECT_TRUE(lines[0].at("ready").get<bool>());
  EXPECT_EQ(lines[0].at("threads"), 1);
  EXPECT_LT(lines[0].at("max_rel_err").get<double>(), 1e-4);
  EXPECT_EQ(lines[1].at("ms").size(), 3u);
  EXPECT_GT(lines[1]["ms"][0].get<double>(), 0.0);
  EXPECT_NE(lines[2].at("error").get<std::string>().find("got 'three'"), std::string::npos);
  EXPECT_TRUE(lines[3].contains("error"));
  EXPECT_EQ(lines[4].at("ms").size(), 1u);
  Result bad = run("bench " + kModel + " --serve --iters 3 < /dev/null");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--iters has no effect here"), std::string::npos) << bad.out;
}

// Without a C++ compiler the default run skips the compiled backend and says why; named, it is an error.
TEST(Cli, BenchSaysWhatItSkippedAndWhy) {
  Result r = run("bench " + kModel + " --iters 1 --backends eager,graph");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("\ncompiled "), std::string::npos) << r.out;
  {
    testenv::ScopedEnv no_compiler("TESSEL_CXX", "/nonexistent/c++");
    r = run("bench " + kModel + " --iters 1");
  }
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("skipped compiled: no C++ compiler: /nonexistent/c++ ($TESSEL_CXX) is not executable"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("\ncompiled "), std::string::npos) << r.out;
}

// An option that cannot have an effect is refused (exit 2, one line), not silently ignored.
TEST(Cli, InapplicableOptionsAreErrors) {
  struct Case {
    std::string args, says;
  };
  for (const Case& c : std::vector<Case>{
           {"bench " + kModel + " --backends eager,graph --threads 2", "--threads has no effect here: it sets the compiled backend's threads, and --backends does not list compiled"},
           {"run " + kModel + " --threads 2", "--threads has no effect here: it sets the compiled backend's threads, and the backend is not compiled"},
           {"run " + kModel + " --max-rel 0.1", "--max-rel has no effect here: it is the bound of --check, which is not given"},
           {"explain " + kModel + " --backend graph", "--backend has no effect here"},
           {"landscape " + kModel + " --targets spyre --threads 2", "--threads has no effect here"},
           {"compile " + kModel + " --dtype f16", "--dtype has no effect here"},
           {"compile " + kModel + " --target spyre --passes simplify", "--passes has no effect here"},
           {"compile " + kModel + " --target spyre --elide-constants", "--elide-constants has no effect here"},
           {"sim " + kModel + " --hw spyre --no-functional --threads 2", "--threads has no effect here: it sets the threads of the functional simulation"}})
    expect_refused(c.args, c.says);
  Result ok = run("bench " + kModel + " --backends compiled --threads 1 --iters 1");
  EXPECT_EQ(ok.code, 0) << ok.out;
}

// The command line's own mistakes are one line and exit 2 like every other refusal (CLI11's form was two
// lines and exit 105-109): an option out of range, an unknown option, an unknown command (with the
// nearest one when it is close) (issue 38).
TEST(Cli, ParseErrorsAreOneLine) {
  struct Case {
    std::string args, says;
  };
  for (const Case& c : std::vector<Case>{
           {"run " + kModel + " --repeat 0", "--repeat: Value 0 not in range 1"},
           {"run " + kModel + " --repeat -1", "--repeat"},
           {"run " + kModel + " --bogus", "--bogus"},
           {"run " + kModel + " --threads -1", "--threads: Value -1 not in range 0 to 4096"},
           {"sim " + kModel + " --hw spyre --threads -2", "--threads: Value -2 not in range 0 to 4096"},
           {"bnech " + kModel, "unknown command 'bnech'; did you mean 'bench'?"},
           {"frobnicate", "unknown command 'frobnicate' (commands: run, compile,"},
           // a bad landscape target last in the list: refused before any row is printed (one line)
           {"landscape " + kModel + " --targets spyre,gpu", "unknown target 'gpu'"}})
    expect_refused(c.args, c.says);
  Result help = run("run --help");
  EXPECT_EQ(help.code, 0) << help.out;
  EXPECT_NE(help.out.find("--repeat"), std::string::npos) << help.out;
}

// `run` of a file that is not a model, with no data set beside it, says the file is not a model (it said
// the test data was missing); a model without data sets still says that (issue 38).
TEST(Cli, RunOfAFileThatIsNotAModelSaysSo) {
  const fs::path dir = tmp() / "notamodel";
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "text.onnx");
    f << "hello, this is text\n";
  }
  expect_refused("run " + (dir / "text.onnx").string(), "text.onnx: [import] not a valid ONNX model");
  fs::copy_file(kModel + "/model.onnx", dir / "m.onnx", fs::copy_options::overwrite_existing);
  expect_refused("run " + (dir / "m.onnx").string(), "no --inputs given and no test_data_set_0 next to the model");
}

// `tessel conformance` is a gate: exit 1 when a test does not pass (the failures listed by cause),
// unless --min-pass N is met. A folder of two tests: the bundled model with its reference, and the same
// model with one reference element changed.
TEST(Cli, ConformanceExitsOneOnAFailingTest) {
  const fs::path root = tmp() / "conformance";
  fs::remove_all(root);
  for (const char* name : {"test_good", "test_wrong"}) {
    fs::create_directories(root / name / "test_data_set_0");
    fs::copy_file(kModel + "/model.onnx", root / name / "model.onnx");
    fs::copy_file(kModel + "/test_data_set_0/input_0.pb", root / name / "test_data_set_0/input_0.pb");
  }
  fs::copy_file(kModel + "/test_data_set_0/output_0.pb", root / "test_good/test_data_set_0/output_0.pb");
  Tensor ref = read_tensor_pb(kModel + "/test_data_set_0/output_0.pb").clone();
  ref.set_f(5, ref.get_f(5) + 1.0);
  write_tensor_pb(ref, "out", (root / "test_wrong/test_data_set_0/output_0.pb").string());

  Result r = run("conformance " + root.string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("not passed, by cause:\n      1  failed: outputs differ from the reference\n         e.g. test_wrong\n"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 tests, 1 passed, 1 failed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FAIL: 1 of 2 tests did not pass"), std::string::npos) << r.out;
  r = run("conformance " + root.string() + " --min-pass 1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("PASS: 1 passed, --min-pass 1"), std::string::npos) << r.out;
  r = run("conformance " + root.string() + " --min-pass 2");
  EXPECT_EQ(r.code, 1) << r.out;
  r = run("conformance " + root.string() + " --filter good");
  EXPECT_EQ(r.code, 0) << r.out;
  // --json output stays JSON: progress goes to stderr, and --quiet silences it.
  const fs::path json = root.parent_path() / "conformance.json";
  r = run("conformance " + root.string() + " --json " + json.string() + " --quiet 2>/dev/null");
  EXPECT_EQ(r.code, 1);
  auto j = nlohmann::json::parse(testenv::read_text(json.string()));
  EXPECT_EQ(j.at("totals").at("failed"), 1);
  EXPECT_EQ(j.at("tests").at(1).at("cause"), "outputs differ from the reference");
  fs::remove_all(root);
  fs::remove(json);
}

// --version names the release and the build, the same text as Python's tessel.__version__.
TEST(Cli, VersionNamesTheBuild) {
  Result r = run("--version");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.rfind("tessel 0.", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("+"), std::string::npos) << "a build label (git describe)\n" << r.out;
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

// `sim` reports the analytical mode's time beside the event-driven one (docs/sim.md): the JSON's
// analytical_us is the printed figure, the printed ratio is simulated/analytical, and the estimate is a
// time of the same program (within the bounds of queueing: not above twice the event-driven time).
TEST(Cli, SimPrintsTheAnalyticalEstimateBesideTheEventDrivenTime) {
  const fs::path json = fs::temp_directory_path() / "tessel_cli_sim_estimate.json";
  for (const char* hw : {"spyre", "tpu-v5e"}) {
    Result r = run("sim " + kModel + " --hw " + hw + " --no-functional --json " + json.string());
    ASSERT_EQ(r.code, 0) << r.out;
    const size_t at = r.out.find("analytical estimate ");
    ASSERT_NE(at, std::string::npos) << r.out;
    const double printed = std::stod(r.out.substr(at + 20));
    const size_t ratio_at = r.out.find("the event-driven time is ", at);
    ASSERT_NE(ratio_at, std::string::npos) << r.out;
    const double ratio = std::stod(r.out.substr(ratio_at + 25));
    const nlohmann::json j = nlohmann::json::parse(testenv::read_text(json.string()));
    const double est = j["analytical_us"].get<double>(), sim = j["simulated_us"].get<double>();
    EXPECT_GT(est, 0) << hw;
    EXPECT_NEAR(printed, est, 0.051) << hw;
    EXPECT_NEAR(ratio, sim / est, 0.0051) << hw;
    EXPECT_LE(est, 2 * sim) << hw;
  }
  fs::remove(json);
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

// `sim --train` (docs/training.md): the partition's decision, the activation memory against the
// scratchpads, one line per phase and the step's total, which is the phases' sum; the JSON agrees.
TEST(Cli, SimTrainSimulatesForwardBackwardAndAdamW) {
  const fs::path json = fs::temp_directory_path() / "tessel_cli_sim_train.json";
  Result r = run("sim " + kModel + " --train --hw spyre --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"train: 10 parameters (789248 elements)", "partition: saves ", "partition: recomputes ",
                        "memory on spyre: saved activations ", "of the scratchpads", "\nforward ", "\nbackward ",
                        "\nadamw ", "training step on spyre: "})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  const nlohmann::json j = nlohmann::json::parse(testenv::read_text(json.string()));
  const double sum = j["forward"]["simulated_us"].get<double>() + j["backward"]["simulated_us"].get<double>() +
                     j["adamw"]["simulated_us"].get<double>();
  EXPECT_NEAR(j["total_us"].get<double>(), sum, 1e-6 * sum);
  EXPECT_GT(j["forward"]["simulated_us"].get<double>(), 0);
  EXPECT_GT(j["backward"]["simulated_us"].get<double>(), 0);
  // The JSON lists the tensors the printed decision counts ("partition: saves N tensors").
  const size_t at = r.out.find("partition: saves ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(j["saved"].size(), std::stoul(r.out.substr(at + 17))) << r.out;
  EXPECT_GT(j["saved"].size(), 0u);
  fs::remove(json);
  r = run("sim " + kModel + " --train --hw spyre --trace t.json");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("sim --train takes"), std::string::npos) << r.out;
}

// compile --emit ktir -o FOLDER: the folder form with the constants and, with --ktir-values, tessel's values;
// a folder that cannot be made and a model without test data are one-line errors.
TEST(Cli, KtirFolderWithConstantsAndValues) {
  const std::string dir = testing::TempDir() + "/tessel_cli_ktir";
  std::filesystem::remove_all(dir);
  Result r = run("compile " + kModel + " --target spyre --emit ktir -o " + dir + " --ktir-values");
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream mf(dir + "/manifest.json");
  const nlohmann::json m = nlohmann::json::parse(mf);
  int constants = 0;
  for (const auto& g : m["globals"])
    if (g["kind"] == "constant") {
      ++constants;
      EXPECT_TRUE(std::filesystem::exists(dir + "/" + g["file"].get<std::string>())) << g["global"];
    }
  EXPECT_GT(constants, 0);
  EXPECT_EQ(m["steps"].size(), m["tile_kernels"].get<size_t>());
  ASSERT_TRUE(m.contains("values"));
  EXPECT_FALSE(m["values"].empty());
  for (auto it = m["values"].begin(); it != m["values"].end(); ++it)
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + it.value().get<std::string>())) << it.key();
  r = run("compile " + kModel + " --target spyre --emit ktir -o /proc/no/such/folder");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("cannot create the folder"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  const std::string bare = testing::TempDir() + "/tessel_cli_ktir_bare";
  std::filesystem::create_directories(bare);
  std::filesystem::copy_file(kModel + "/model.onnx", bare + "/model.onnx", std::filesystem::copy_options::overwrite_existing);
  r = run("compile " + bare + "/model.onnx --target spyre --emit ktir -o " + bare + "/out --ktir-values");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--ktir-values needs the model's test_data_set_0 inputs"), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(bare);
}

// issue 41: a write the disk refuses is an error naming the file, also when the whole text fits the
// stream's buffer (checked after close, not before): /dev/full takes nothing.
TEST(Cli, OutputFilesAreCheckedAfterClose) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  for (const std::string& args : {"compile " + kModel + " --emit fusion -o /dev/full",
                                 "landscape " + kModel + " --targets spyre --json /dev/full",
                                 "compare " + kModel + " --hw spyre,tpu-v5e --json /dev/full"}) {
    Result r = run("--quiet " + args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find("/dev/full: cannot write output file"), std::string::npos) << args << "\n" << r.out;
  }
}

// issue 41: --dump-ir at a file or a place no folder can be made is a one-line error (exit 2), not an
// internal error.
TEST(Cli, DumpIrWhereNoFolderCanBeIsAnError) {
  const fs::path file = tmp() / "a-file";
  std::ofstream(file) << "x";
  for (const std::string& where : {std::string("/dev/full"), file.string(), (file / "below").string()}) {
    Result r = run("--quiet compile " + kModel + " --dump-ir " + where);
    EXPECT_EQ(r.code, 2) << where << "\n" << r.out;
    EXPECT_NE(r.out.find("cannot make the IR dump folder"), std::string::npos) << r.out;
  }
}

// `sim --shard tp=N` on a system file (docs/multichip.md): the sharding, the collectives beside the ring
// formula, per chip time, and the ranks against eager; a JSON of the same figures.
TEST(Cli, SimShardTimesTheChipsAndChecksTheRanks) {
  const std::string hw = testenv::source_dir() + "/examples/multichip/spyre_ring4.json";
  const fs::path j = tmp() / "mc.json";
  Result r = run("sim " + testenv::shared_dir() + "/models/tblock_bert --hw " + hw + " --shard tp=4 --json " + j.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("sharding: 2 all-reduces, 0 all-gathers"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("functional: every rank's outputs within"), std::string::npos) << r.out;
  nlohmann::json js = nlohmann::json::parse(testenv::read_text(j.string()));
  ASSERT_EQ(js["collectives"].size(), 2u);
  for (const auto& c : js["collectives"]) {
    // f16 storage of a 1x128x768 tensor; the ring formula by hand: 2(N-1)/N B/bw + 2(N-1) lat
    EXPECT_EQ(c["bytes"], 128 * 768 * 2);
    EXPECT_NEAR(c["ring_formula_us"].get<double>(), 1.5 * 196608 / 100e9 * 1e6 + 6 * 0.5, 1e-9);
    EXPECT_NEAR(c["sim_us"].get<double>() / c["ring_formula_us"].get<double>(), 1.0, 0.05);
  }
  EXPECT_EQ(js["chips_time"].size(), 4u);
  EXPECT_LT(js["functional_max_rel"].get<double>(), 1e-5);
  EXPECT_GT(js["speedup"].get<double>(), 1.0);
}

TEST(Cli, SimShardRefusesAMismatchedSystem) {
  const std::string hw = testenv::source_dir() + "/examples/multichip/spyre_ring4.json";
  for (const char* bad : {"tp=2", "tp=0", "dp=4", "tp=x", "tp=99999"}) {
    Result r = run("sim " + kModel + " --hw " + hw + " --shard " + bad);
    EXPECT_NE(r.code, 0) << bad << "\n" << r.out;
    EXPECT_EQ(r.out.rfind("tessel: error: ", 0), 0u) << bad << "\n" << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << bad << "\n" << r.out;
  }
  Result one = run("sim " + kModel + " --hw spyre --shard tp=4");
  EXPECT_NE(one.out.find("system.chips: the hardware has 1 chip but the shard asks for tp=4"), std::string::npos) << one.out;
  expect_refused("sim " + kModel + " --hw " + hw + " --shard tp=4 --train", "sim --shard takes");
  // the ranks' check holds every rank's values in one process: bounded by the allocation limit
  Result big = run("--max-alloc 40M sim " + testenv::shared_dir() + "/models/tblock_bert --hw " + hw + " --shard tp=4");
  EXPECT_NE(big.code, 0) << big.out;
  EXPECT_NE(big.out.find("the functional check of 4 ranks"), std::string::npos) << big.out;
  EXPECT_EQ(std::count(big.out.begin(), big.out.end(), '\n'), 1) << big.out;
}
