// Names never become code (issue 12): hostile bytes planted in every name a model carries — node
// names, value names of inputs, initializers, intermediates and outputs, the graph name, the model's
// folder name, .tsl %"..." names and loc("...") — must leave the generated C++ compiling, the
// compiled backend equal to the eager interpreter, KTIR / JSON / text outputs free of raw payload,
// errors on one line, and the marker file that an injected constructor would create absent.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "corpus_util.h"
#include "tessel/driver/compile_model.h"
#include "tessel/frontend/onnx/importer.h"
#include "tessel/ir/printer.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"
#include "test_util.h"

extern char** environ;

using namespace tessel;
namespace fs = std::filesystem;

namespace {

const char kMarker[] = "tessel_pwned_marker";

// The full attack: ends the `//` comment, includes stdlib and defines a constructor that runs at
// every dlopen; the `#define` swallows whatever the comment line held after the name. Function and
// macro carry the position so that several planted copies would not collide (a collision would fail
// to compile and hide the hole). No '/' in it: it is planted in a folder name too.
std::string attack(const std::string& pos) {
  return "\n#include <stdlib.h>\n__attribute__((constructor)) static void p_" + pos + "(){system(\"touch " +
         std::string(kMarker) + "\");}\n#define TAIL_" + pos + " ";
}

struct Payload {
  const char* what;
  std::string text;  // "@" is replaced by the position's tag (attack payloads only)
};

std::vector<Payload> payloads() {
  return {{"newline", "a\nb"},
          {"comment close", "*/ x /*"},
          {"backslash-newline", "a\\\nb"},
          {"trailing backslash", "a\\"},
          {"preprocessor", "\n#error planted\n#include </nonexistent>\n"},
          {"quotes", "\"'`\\\""},
          {"nul", std::string("a\0b", 3)},
          {"invalid utf8", "\xff\xfe\xc0\x80\xed\xa0\x80"},
          {"trigraph", "?\?/\n?\?="},
          {"attack", "@"}};
}

std::string name_of(const Payload& p, const std::string& pos) { return p.text == "@" ? pos + attack(pos) : pos + p.text; }

// x [2,3] · w [3,4] + b [4] -> t; softmax(t) -> y: a library matmul with its bias epilogue, then a
// loop kernel reading the intermediate t, so every kind of name reaches a kernel's args or sources.
onnx::ModelProto hostile_model(const Payload& p) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name(name_of(p, "graph"));
  auto value_info = [&](onnx::ValueInfoProto* v, const std::string& name, std::vector<int64_t> dims) {
    v->set_name(name);
    auto* tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
  };
  value_info(g->add_input(), name_of(p, "x"), {2, 3});
  value_info(g->add_output(), name_of(p, "y"), {2, 4});
  auto init = [&](const std::string& name, std::vector<int64_t> dims) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    int64_t n = 1;
    for (int64_t d : dims) t->add_dims(d), n *= d;
    for (int64_t i = 0; i < n; ++i) t->add_float_data(0.25f * static_cast<float>(i % 7) - 0.5f);
  };
  init(name_of(p, "w"), {3, 4});
  init(name_of(p, "b"), {4});
  auto node = [&](const char* op, const std::string& name, std::vector<std::string> ins, std::string out) {
    auto* n = g->add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (auto& i : ins) n->add_input(i);
    n->add_output(out);
    return n;
  };
  node("MatMul", name_of(p, "mm"), {name_of(p, "x"), name_of(p, "w")}, name_of(p, "m"));
  node("Add", name_of(p, "add"), {name_of(p, "m"), name_of(p, "b")}, name_of(p, "t"));
  node("Softmax", name_of(p, "softmax"), {name_of(p, "t")}, name_of(p, "y"));
  return m;
}

Tensor input() { return Tensor::from_f64(DType::f32, {2, 3}, std::vector<double>{0.5, -1, 2, 0.25, 3, -0.75}); }

// The child's stdout and stderr, without a shell: arguments may hold any byte but NUL.
struct CliRun {
  int code = -1;
  std::string out;
};

CliRun run_tessel(const std::vector<std::string>& args, const fs::path& dir) {
  std::vector<std::string> argv_s = {testenv::tessel_binary()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log = (dir / "cli.log").string();
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  CliRun r;
  if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) == 0) {
    int st = 0;
    waitpid(pid, &st, 0);
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  posix_spawn_file_actions_destroy(&fa);
  r.out = testenv::read_text(log);
  return r;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size() || (n == 2 && c < 0xc2)) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    i += n;
  }
  return true;
}

bool c_str_has_prefix(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

// Text a tool reads line by line (C++, MLIR, reports): only newlines as control characters, valid
// UTF-8, and no line that a planted payload began: a directive, an attribute, a constructor.
void expect_no_raw_payload(const std::string& text, const std::string& what) {
  EXPECT_TRUE(valid_utf8(text)) << what;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    for (unsigned char c : line) ASSERT_FALSE(c < 0x20 && c != '\t') << what << ": control character in line: " << line;
    ASSERT_FALSE(c_str_has_prefix(line, "#error") || c_str_has_prefix(line, "#include </") ||
                 c_str_has_prefix(line, "#include <stdlib") || c_str_has_prefix(line, "__attribute__") ||
                 c_str_has_prefix(line, "?\?="))
        << what << ": planted line: " << line;
  }
}

// Generated C++: plain ASCII, and no line ends with a backslash (which would splice the next line
// into a comment); no `*/`, no `??`.
void expect_safe_cpp(const std::string& src, const std::string& what) {
  expect_no_raw_payload(src, what);
  for (unsigned char c : src) ASSERT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f)) << what << ": byte " << int(c);
  EXPECT_EQ(src.find("\\\n"), std::string::npos) << what;
  EXPECT_EQ(src.find("*/"), std::string::npos) << what;
  EXPECT_EQ(src.find("??"), std::string::npos) << what;
}

void expect_one_line_error(const CliRun& r, const std::string& what) {
  EXPECT_EQ(r.code, 2) << what << ": " << r.out;
  ASSERT_FALSE(r.out.empty()) << what;
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << what << ": " << r.out;
  expect_no_raw_payload(r.out, what);
}

class NameInjection : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("tessel_name_injection_{}_{}", getpid(), GetParam());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    old_cwd_ = fs::current_path();
    fs::current_path(dir_);  // where the planted `touch` would write its marker
    setenv("TESSEL_CACHE_DIR", (dir_ / "cache").c_str(), 1);
  }
  void TearDown() override {
    EXPECT_FALSE(fs::exists(dir_ / kMarker)) << "a planted constructor ran";
    unsetenv("TESSEL_CACHE_DIR");
    fs::current_path(old_cwd_);
    fs::remove_all(dir_);
  }
  fs::path dir_, old_cwd_;
};

// The model folder: named after the payload too (a folder name holds any byte but '/' and NUL).
fs::path write_model_folder(const fs::path& dir, const Payload& p, const Tensor& x, const Tensor& y) {
  std::string folder = name_of(p, "folder");
  std::erase(folder, '/');
  std::erase(folder, '\0');
  const fs::path d = dir / folder;
  fs::create_directories(d / "test_data_set_0");
  std::ofstream f(d / "model.onnx", std::ios::binary);
  hostile_model(p).SerializeToOstream(&f);
  f.close();
  write_tensor_pb(x, "x", (d / "test_data_set_0" / "input_0.pb").string());
  if (y.valid()) write_tensor_pb(y, "y", (d / "test_data_set_0" / "output_0.pb").string());
  return d;
}

}  // namespace

// In process: import, the eager interpreter, the compiled backend (cold, then warm from the
// executable cache whose kernel-module text carries every name), and the .tsl round trip.
TEST_P(NameInjection, CompiledBackendMatchesEagerAndNamesRoundTrip) {
  const Payload p = payloads()[static_cast<size_t>(GetParam())];
  SCOPED_TRACE(p.what);
  const fs::path model = write_model_folder(dir_, p, input(), Tensor());
  ImportedModel im = import_model_file(model.string());
  EXPECT_EQ(im.graph->name, name_of(p, "graph"));
  const std::vector<Tensor> want = run_eager(*im.graph, {input()});

  ModelCompileOptions o;
  o.backend.threads = 1;
  o.backend.toolchain.cache_dir = (dir_ / "cache").string();
  o.backend.model_name = model.filename().string();
  ModelCompile cold = compile_model_cpu(model.string(), {input()}, o);
  expect_safe_cpp(cold.exe->source(), "generated C++");
  EXPECT_NE(cold.exe->source().find("softmax"), std::string::npos) << "the names are still there, escaped";
  testenv::expect_matches_reference(cold.exe->run({input()}), want, "compiled (cold)", 1e-5);
  ModelCompile warm = compile_model_cpu(model.string(), {input()}, o);
  EXPECT_TRUE(warm.entry_hit) << warm.load_error;
  testenv::expect_matches_reference(warm.exe->run({input()}), want, "compiled (executable cache)", 1e-5);

  // .tsl: every name, the graph's and the loc(...) strings included, survives print -> parse.
  const std::string text = print_graph(*im.graph);
  expect_no_raw_payload(text, ".tsl text");
  std::unique_ptr<Graph> back = parse_graph(text, "names.tsl");
  EXPECT_EQ(print_graph(*back), text);
  EXPECT_EQ(back->name, im.graph->name);
  ASSERT_EQ(back->nodes().size(), im.graph->nodes().size());
  for (size_t i = 0; i < back->nodes().size(); ++i) EXPECT_EQ(back->nodes()[i]->name, im.graph->nodes()[i]->name);
  std::ofstream(dir_ / "names.tsl") << text;
  ModelCompile from_text = compile_model_cpu((dir_ / "names.tsl").string(), {input()}, o);
  testenv::expect_matches_reference(from_text.exe->run({input()}), want, "compiled from .tsl", 1e-5);
}

// Through the command line: every output a user asks for, with the payload in the folder name too.
TEST_P(NameInjection, CommandLineOutputsCarryNoRawPayload) {
  const Payload p = payloads()[static_cast<size_t>(GetParam())];
  SCOPED_TRACE(p.what);
  const fs::path probe = write_model_folder(dir_ / "probe", p, input(), Tensor());
  const std::vector<Tensor> ref = run_eager(*import_model_file(probe.string()).graph, {input()});
  const fs::path model = write_model_folder(dir_, p, input(), ref[0]);
  const std::string m = model.string();

  CliRun r = run_tessel({"compile", m, "--emit", "cpp", "-o", (dir_ / "kernels.cpp").string()}, dir_);
  ASSERT_EQ(r.code, 0) << r.out;
  expect_safe_cpp(read_bytes(dir_ / "kernels.cpp"), "tessel compile --emit cpp");

  r = run_tessel({"run", m, "--backend", "compiled", "--check"}, dir_);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("PASS"), std::string::npos) << r.out;
  expect_no_raw_payload(r.out, "tessel run");

  r = run_tessel({"compile", m, "--emit", "kernel", "-o", (dir_ / "module.tkl").string()}, dir_);
  ASSERT_EQ(r.code, 0) << r.out;
  expect_no_raw_payload(read_bytes(dir_ / "module.tkl"), "kernel level text");

  r = run_tessel({"compile", m, "--target", "spyre", "--emit", "ktir", "-o", (dir_ / "k.mlir").string(), "--report",
                  (dir_ / "report.json").string()},
                 dir_);
  ASSERT_EQ(r.code, 0) << r.out;
  expect_no_raw_payload(r.out, "dataflow report table");
  expect_no_raw_payload(read_bytes(dir_ / "k.mlir"), "KTIR");
  EXPECT_TRUE(nlohmann::json::accept(read_bytes(dir_ / "report.json"))) << "report JSON";

  r = run_tessel({"sim", m, "--hw", "spyre", "--trace", (dir_ / "trace.json").string(), "--json",
                  (dir_ / "sim.json").string()},
                 dir_);
  ASSERT_EQ(r.code, 0) << r.out;
  expect_no_raw_payload(r.out, "tessel sim");
  for (const char* f : {"trace.json", "sim.json"}) {
    const std::string j = read_bytes(dir_ / f);
    expect_no_raw_payload(j, f);
    EXPECT_TRUE(nlohmann::json::accept(j)) << f;
  }

  // The HTML report: names are text (html_text), never markup, never a raw line break.
  r = run_tessel({"report", m, "--hw", "spyre", "-o", (dir_ / "report.html").string()}, dir_);
  ASSERT_EQ(r.code, 0) << r.out;
  {
    const std::string html = read_bytes(dir_ / "report.html");
    expect_no_raw_payload(html, "tessel report");
    EXPECT_EQ(html.find("<script"), std::string::npos);
    EXPECT_EQ(html.find("<stdlib"), std::string::npos);
  }

  r = run_tessel({"explain", m, "--json"}, dir_);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(nlohmann::json::accept(r.out)) << r.out;
  r = run_tessel({"explain", m}, dir_);
  ASSERT_EQ(r.code, 0) << r.out;
  expect_no_raw_payload(r.out, "tessel explain");

  // The graph level printed by the CLI reads back and runs.
  r = run_tessel({"compile", m, "--emit", "graph", "-o", (dir_ / "g.tsl").string()}, dir_);
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_tessel({"run", (dir_ / "g.tsl").string(), "--backend", "compiled", "--inputs", (model / "test_data_set_0").string(),
                  "--check"},
                 dir_);
  EXPECT_EQ(r.code, 0) << r.out;

  // Errors that name the payload stay on one line.
  expect_one_line_error(run_tessel({"run", (model / "missing").string()}, dir_), "missing file");
  std::ofstream(dir_ / "bad.tsl") << "graph @g(%x: f32[2]) {\n  return " << format_value_name(name_of(p, "undefined"))
                                   << "\n}\n";
  r = run_tessel({"compile", (dir_ / "bad.tsl").string(), "--emit", "graph"}, dir_);
  expect_one_line_error(r, "undefined .tsl value");
  EXPECT_NE(r.out.find("bad.tsl:2:"), std::string::npos) << r.out;
  onnx::ModelProto broken = hostile_model(p);
  broken.mutable_graph()->mutable_output(0)->set_name(name_of(p, "dangling"));
  std::ofstream f(dir_ / "broken.onnx", std::ios::binary);
  broken.SerializeToOstream(&f);
  f.close();
  expect_one_line_error(run_tessel({"run", (dir_ / "broken.onnx").string()}, dir_), "dangling output");
}

INSTANTIATE_TEST_SUITE_P(Payloads, NameInjection, ::testing::Range(0, static_cast<int>(payloads().size())),
                         [](const ::testing::TestParamInfo<int>& i) {
                           std::string n = payloads()[static_cast<size_t>(i.param)].what;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });
