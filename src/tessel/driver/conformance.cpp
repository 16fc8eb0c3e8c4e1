// Conformance runs: fork per test, a time limit per test, results gathered over pipes as JSON.
#include "tessel/driver/conformance.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "tessel/driver/model_dir.h"
#include "tessel/frontend/onnx/importer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/passes/pass.h"
#include "tessel/runtime/compiled_backend.h"
#include "tessel/runtime/graph_backend.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"
#include "tessel/support/escape.h"
#include "tessel/support/progress.h"

namespace tessel {
namespace fs = std::filesystem;

int ConformanceReport::count(const std::string& status) const {
  int n = 0;
  for (const auto& t : tests) n += t.status == status;
  return n;
}

namespace {

// The reason without what varies from test to test: quoted names become '…' and numbers N, so that
// "unsupported op 'StringSplit'" and a mismatch of 0.25 at element 3 group with their kind.
std::string generic_reason(const std::string& reason) {
  std::string out;
  for (size_t i = 0; i < reason.size(); ++i) {
    const char c = reason[i];
    if (c == '\'' || c == '"') {
      const size_t e = reason.find(c, i + 1);
      if (e != std::string::npos) {
        out += c;
        out += "…";
        out += c;
        i = e;
        continue;
      }
    }
    const bool in_word = !out.empty() && (std::isalnum(static_cast<unsigned char>(out.back())) || out.back() == '_');
    if (std::isdigit(static_cast<unsigned char>(c)) && !in_word) {  // not the 32 of f32
      while (i + 1 < reason.size() && (std::isalnum(static_cast<unsigned char>(reason[i + 1])) || reason[i + 1] == '.' ||
                                       reason[i + 1] == '-' || reason[i + 1] == '+'))
        ++i;
      out += 'N';
      continue;
    }
    out += c;
  }
  return out.size() > 160 ? out.substr(0, 157) + "..." : out;
}

}  // namespace

TestResult run_conformance_test(const std::string& dir, const ConformanceOptions& opts) {
  const Tolerance& tol = opts.tol;
  TestResult r;
  r.name = dir;
  auto t0 = std::chrono::steady_clock::now();
  try {
    ModelPaths mp = resolve_model(dir);
    if (mp.data_sets.empty()) throw Error(Location{.file = dir}, "no test_data_set_N folder");
    std::vector<Tensor> first;
    try {
      first = read_data_set(mp.data_sets[0], "input");
    } catch (const Error&) {
      // Inputs that are not tensors (sequences, optionals) fail to read; importing the model says
      // why in its own terms (an unsupported input type) before the read error is reported.
      import_onnx(mp.model);
      throw;
    }
    ImportOptions io;
    for (const auto& t : first) io.input_shapes.push_back(t.shape());
    ImportedModel m = import_onnx(mp.model, io);
    if (!opts.passes.empty()) run_pipeline(*m.graph, parse_pipeline(opts.passes), PassOptions{});
    if (opts.require_core) {
      std::set<std::string> left;
      for (const auto& n : m.graph->nodes())
        if (!n->op->core) left.insert(n->op->name);
      if (!left.empty()) {
        std::string names;
        for (const auto& o : left) names += (names.empty() ? "" : ", ") + o;
        throw Error(Location{.file = mp.model, .pass = "require-core"}, "not decomposed to core ops: " + names);
      }
    }
    if (opts.backend != "eager" && opts.backend != "graph" && opts.backend != "compiled")
      throw Error(Location{.pass = "conformance"}, fmt::format("unknown backend '{}'", opts.backend));
    std::vector<std::string> out_names;
    for (const Value* v : m.graph->outputs) out_names.push_back(v->name);
    // The graph and compiled backends compile on the first data set's inputs and recompile (from a
    // fresh import) when a later data set fails a guard: other shapes, or another value of a baked input.
    using Callable = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
    Callable exe;
    auto compile = [&](std::unique_ptr<Graph> g, const std::vector<Tensor>& ins) -> Callable {
      if (opts.backend == "graph") {
        std::shared_ptr<GraphExecutable> e = compile_graph(std::move(g), ins);
        return [e](const std::vector<Tensor>& x) { return e->run(x); };
      }
      CompiledBackendOptions co;
      co.threads = 1;  // tests run in parallel processes
      std::shared_ptr<CompiledExecutable> e = compile_cpu(std::move(g), ins, co);
      return [e](const std::vector<Tensor>& x) { return e->run(x); };
    };
    auto compile_for = [&](const std::vector<Tensor>& ins) {
      ImportOptions iso;
      for (const auto& t : ins) iso.input_shapes.push_back(t.shape());
      ImportedModel fresh = import_onnx(mp.model, iso);
      if (!opts.passes.empty()) run_pipeline(*fresh.graph, parse_pipeline(opts.passes), PassOptions{});
      exe = compile(std::move(fresh.graph), ins);
    };
    auto run_model = [&](const std::vector<Tensor>& ins) {
      if (opts.backend == "eager") return run_eager(*m.graph, ins);
      if (!exe && m.graph) exe = compile(std::move(m.graph), ins);  // imported for these inputs
      if (!exe) compile_for(ins);
      try {
        return exe(ins);
      } catch (const GuardFailure&) {
        compile_for(ins);
        return exe(ins);
      }
    };
    for (const auto& ds : mp.data_sets) {
      std::vector<Tensor> ins = read_data_set(ds, "input");
      std::vector<Tensor> refs = read_data_set(ds, "output");
      std::vector<Tensor> outs = run_model(ins);
      if (outs.size() != refs.size())
        throw Error(Location{.file = ds}, fmt::format("model has {} outputs but the data set has {}", outs.size(), refs.size()));
      for (size_t i = 0; i < outs.size(); ++i) {
        Comparison c = compare_tensors(outs[i], refs[i], tol);
        r.max_abs = std::max(r.max_abs, c.max_abs);
        r.rel = std::max(r.rel, c.rel);
        if (!c.match && r.reason.empty()) {
          r.cause = "outputs differ from the reference";
          r.reason = fmt::format("{}: output {} ('{}'): {}", fs::path(ds).filename().string(), i,
                                 out_names[i], c.mismatch);
        }
      }
    }
    r.status = r.reason.empty() ? "passed" : "failed";
  } catch (const Error& e) {
    r.status = e.is_unsupported() ? "unsupported" : "failed";
    r.reason = e.what();
    // The op and the reason, not the file and node: those differ in every test.
    r.cause = (e.location().op.empty() ? "" : e.location().op + ": ") + generic_reason(e.reason());
  } catch (const std::exception& e) {
    r.status = "failed";
    r.reason = std::string("internal error: ") + e.what();
    r.cause = "internal error: " + generic_reason(e.what());
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (r.reason.size() > 1500) r.reason = r.reason.substr(0, 1500) + "...";
  return r;
}

std::vector<std::string> find_test_dirs(const std::string& root) {
  std::vector<std::string> dirs;
  if (fs::exists(fs::path(root) / "model.onnx")) return {root};
  if (!fs::is_directory(root)) throw Error(Location{.file = root}, "not a folder");
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file() && e.path().filename() == "model.onnx") dirs.push_back(e.path().parent_path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

namespace {

nlohmann::json result_json(const TestResult& t) {
  nlohmann::json j = {{"name", t.name}, {"status", t.status}, {"seconds", t.seconds}};
  if (!t.reason.empty()) j["reason"] = t.reason;
  if (!t.cause.empty()) j["cause"] = t.cause;
  if (t.status == "passed" || t.status == "failed") {
    j["max_abs_error"] = t.max_abs;
    j["rel_error"] = t.rel;
  }
  return j;
}

struct Child {
  pid_t pid;
  int fd;
  std::string dir;
  std::string buf;
  std::chrono::steady_clock::time_point start;
  size_t index;
};

}  // namespace

ConformanceReport run_conformance(const std::string& root, const ConformanceOptions& opts) {
  std::vector<std::string> dirs;
  for (auto& d : find_test_dirs(root))
    if (opts.filter.empty() || d.find(opts.filter) != std::string::npos) dirs.push_back(d);
  // Shown from this loop (it polls every 100 ms), not from a ticker thread: the tests are fork()ed.
  ProgressOptions po;
  if (!opts.progress) po.mode = ProgressMode::quiet;
  Progress progress(fmt::format("conformance {} ({})", display_text(fs::path(root).filename().string()), opts.backend),
                    dirs.size(), "tests", po);
  ConformanceReport rep;
  rep.tests.resize(dirs.size());
  std::vector<Child> running;
  size_t next = 0, done = 0;
  auto rel_name = [&](const std::string& d) {
    std::string r = fs::relative(d, root).string();
    return r == "." ? fs::path(d).filename().string() : r;
  };
  while (done < dirs.size()) {
    while (running.size() < static_cast<size_t>(std::max(1, opts.jobs)) && next < dirs.size()) {
      int p[2];
      if (pipe(p) != 0) throw Error(Location{.pass = "conformance"}, "pipe() failed");
      fflush(nullptr);
      pid_t pid = fork();
      if (pid == 0) {
        close(p[0]);
        TestResult r = run_conformance_test(dirs[next], opts);
        std::string s = json_dump(result_json(r));
        const char* q = s.data();
        size_t left = s.size();
        while (left > 0) {
          ssize_t w = write(p[1], q, left);
          if (w <= 0) break;
          q += w;
          left -= static_cast<size_t>(w);
        }
        _exit(0);
      }
      close(p[1]);
      running.push_back(Child{pid, p[0], dirs[next], "", std::chrono::steady_clock::now(), next});
      ++next;
    }
    std::vector<pollfd> fds;
    for (auto& c : running) fds.push_back(pollfd{c.fd, POLLIN, 0});
    poll(fds.data(), fds.size(), 100);
    progress.tick();
    for (size_t k = 0; k < running.size();) {
      Child& c = running[k];
      char b[4096];
      bool eof = false;
      if (fds.size() > k && (fds[k].revents & (POLLIN | POLLHUP))) {
        ssize_t n = read(c.fd, b, sizeof b);
        if (n > 0) c.buf.append(b, static_cast<size_t>(n));
        else eof = true;
      }
      double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - c.start).count();
      bool timed_out = !eof && el > opts.timeout_s;
      if (!eof && !timed_out) {
        ++k;
        continue;
      }
      if (timed_out) kill(c.pid, SIGKILL);
      int st = 0;
      waitpid(c.pid, &st, 0);
      close(c.fd);
      TestResult r;
      r.name = rel_name(c.dir);
      r.seconds = el;
      if (timed_out) {
        r.status = "timeout";
        r.reason = fmt::format("no result after {:.0f} s", opts.timeout_s);
      } else if (WIFSIGNALED(st) || c.buf.empty()) {
        r.status = "crashed";
        r.reason = WIFSIGNALED(st) ? fmt::format("killed by signal {} ({})", WTERMSIG(st), strsignal(WTERMSIG(st)))
                                   : "the test process produced no result";
      } else {
        auto j = nlohmann::json::parse(c.buf, nullptr, false);
        if (j.is_discarded()) {
          r.status = "crashed";
          r.reason = "unreadable result";
        } else {
          r.status = j.value("status", "");
          r.reason = j.value("reason", "");
          r.seconds = j.value("seconds", 0.0);
          r.max_abs = j.value("max_abs_error", 0.0);
          r.rel = j.value("rel_error", 0.0);
          r.cause = j.value("cause", "");
        }
      }
      if (r.cause.empty() && r.status != "passed") r.cause = r.status == "timeout" ? "timed out" : generic_reason(r.reason);
      if (opts.verbose) progress.log(fmt::format("[{}/{}] {} {}", done + 1, dirs.size(), r.status, display_text(r.name)));
      progress.advance(1, display_text(r.name));
      rep.tests[c.index] = std::move(r);
      ++done;
      running.erase(running.begin() + static_cast<long>(k));
      fds.erase(fds.begin() + static_cast<long>(k));
    }
  }
  return rep;
}

std::string failures_by_cause(const ConformanceReport& r) {
  std::map<std::string, std::vector<const TestResult*>> groups;  // "status: cause" -> tests
  for (const auto& t : r.tests)
    if (t.status != "passed") groups[t.status + ": " + t.cause].push_back(&t);
  std::vector<std::pair<std::string, std::vector<const TestResult*>>> sorted(groups.begin(), groups.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  std::string s;
  for (const auto& [cause, tests] : sorted) {
    std::string names;
    for (size_t i = 0; i < std::min<size_t>(3, tests.size()); ++i) names += (i ? ", " : "") + display_text(tests[i]->name);
    if (tests.size() > 3) names += fmt::format(" (+{})", tests.size() - 3);
    s += fmt::format("  {:>5}  {}\n         e.g. {}\n", tests.size(), display_text(cause), names);
  }
  return s;
}

nlohmann::json report_json(const ConformanceReport& r) {
  nlohmann::json tests = nlohmann::json::array();
  for (const auto& t : r.tests) tests.push_back(result_json(t));
  return {{"totals",
           {{"tests", r.tests.size()},
            {"passed", r.count("passed")},
            {"failed", r.count("failed")},
            {"unsupported", r.count("unsupported")},
            {"crashed", r.count("crashed")},
            {"timeout", r.count("timeout")}}},
          {"tests", tests}};
}

}  // namespace tessel
