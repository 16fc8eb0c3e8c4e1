// Measuring the backend ladder on one model (docs/BENCHMARKS.md says how the figures were taken).
#include "tessel/driver/bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <istream>
#include <ostream>
#include <nlohmann/json.hpp>

#include "tessel/driver/compare.h"
#include "tessel/driver/compile_model.h"
#include "tessel/driver/matmul_floor.h"
#include "tessel/driver/model_dir.h"
#include "tessel/frontend/onnx/importer.h"
#include "tessel/runtime/compiled_backend.h"
#include "tessel/support/threads.h"
#include "tessel/runtime/graph_backend.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"
#include "tessel/support/escape.h"
#include "tessel/support/process.h"
#include "tessel/support/progress.h"

namespace tessel {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The q-quantile of sorted samples (nearest rank).
double quantile(const std::vector<double>& sorted, double q) {
  size_t i = static_cast<size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(i, sorted.size() - 1)];
}

// Runs argv (argv[0] a path) and returns its standard output; throws with its standard error's gist
// when it fails.
std::string run_capture(const std::vector<std::string>& argv) {
  const ProcessResult r = run_process(argv);
  if (!r.ok())
    throw Error(Location{.file = argv[0], .pass = "bench"},
                fmt::format("`{} {}` failed: {}", argv[0], argv.size() > 1 ? argv[1] : "", display_text(r.why(600))));
  return r.out;
}

// Times `iters` calls of `call` (after one warm-up) and fills the percentiles.
template <typename F>
void time_calls(BackendBench& b, int iters, F call) {
  call();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    auto t0 = Clock::now();
    call();
    ms.push_back(since(t0) * 1e3);
  }
  std::sort(ms.begin(), ms.end());
  b.median_ms = quantile(ms, 0.5);
  b.p10_ms = quantile(ms, 0.1);
  b.p90_ms = quantile(ms, 0.9);
}

}  // namespace

std::string compiled_backend_unavailable() {
  // The same choice as targets/cpu/toolchain.cpp's (which fails only when a compile starts).
  const char* env = std::getenv("TESSEL_CXX");
  const std::string cxx = env && *env ? env : "c++";
  const std::string by = env && *env ? "$TESSEL_CXX" : "the default";
  if (!find_program(cxx).empty()) return "";
  if (cxx.find('/') != std::string::npos) return fmt::format("no C++ compiler: {} ({}) is not executable", cxx, by);
  return fmt::format("no C++ compiler: '{}' ({}) is not on $PATH (install g++, or set $TESSEL_CXX)", cxx, by);
}

BenchReport bench_model(const std::string& model, const BenchOptions& requested) {
  BenchOptions opts = requested;
  BenchReport rep;
  rep.load_before = sample_machine_load();
  if (opts.backends.empty()) {  // every backend that applies
    opts.backends = {"eager", "graph"};
    if (const std::string why = compiled_backend_unavailable(); why.empty()) opts.backends.push_back("compiled");
    else rep.skipped.emplace_back("compiled", why);
  }
  if (opts.iters < 1) throw Error(Location{.pass = "bench"}, "--iters must be at least 1");
  for (const std::string& b : opts.backends)
    if (b != "eager" && b != "graph" && b != "compiled")
      throw Error(Location{.pass = "bench"}, fmt::format("unknown backend '{}' (known: eager, graph, compiled)", b));
  ModelPaths mp = resolve_model(model);
  if (mp.data_sets.empty()) throw Error(Location{.file = model}, "bench needs a test_data_set_0 next to the model (its inputs)");
  const std::vector<Tensor> ins = read_data_set(mp.data_sets[0], "input");
  auto import = [&](double& seconds) {
    auto t0 = Clock::now();
    ImportedModel m = import_model_file(model, ins);
    seconds = since(t0);
    return m;
  };

  rep.model = model;
  rep.iters = opts.iters;
  ProgressOptions po;
  if (!opts.progress) po.mode = ProgressMode::quiet;
  po.eta = false;  // backends of very different lengths
  Progress progress("bench " + display_text(std::filesystem::path(model).filename().string()), opts.backends.size(), "backends", po);
  std::optional<ProgressTicker> ticker;  // a compile or a timed call returns to no loop
  if (opts.progress && progress_mode() != ProgressMode::quiet) ticker.emplace(progress);
  for (const std::string& backend : opts.backends) {
    progress.note(backend);
    BackendBench b;
    b.backend = backend;
    ImportedModel m = import(b.import_s);
    if (backend == "eager") {
      b.cold_compile_s = b.import_s;
      RunStats st;
      time_calls(b, opts.iters, [&] { run_eager(*m.graph, ins, &st); });
      b.peak_mem_bytes = st.peak_bytes;
    } else if (backend == "graph") {
      auto t0 = Clock::now();
      auto exe = compile_graph(std::move(m.graph), ins);
      b.compile_only_s = since(t0);
      b.cold_compile_s = b.import_s + b.compile_only_s;
      GraphRunStats st;
      time_calls(b, opts.iters, [&] { exe->run(ins, &st); });
      b.peak_mem_bytes = st.peak_bytes;
    } else {  // compiled: cold with an empty cache of its own, then a warm start from that cache
      namespace fs = std::filesystem;
      std::string tmpl = (fs::temp_directory_path() / "tessel-bench-XXXXXX").string();
      if (!mkdtemp(tmpl.data())) throw Error(Location{.pass = "bench"}, "cannot create a temporary compile cache");
      struct Cleanup {
        std::string dir;
        ~Cleanup() {
          std::error_code ec;
          fs::remove_all(dir, ec);
        }
      } cleanup{tmpl};
      ModelCompileOptions co;
      co.backend.threads = opts.threads;
      co.backend.toolchain.cache_dir = tmpl;
      co.backend.model_name = fs::path(mp.model).parent_path().filename().string();
      ModelCompile cold = compile_model_cpu(mp.model, ins, co, &m);
      b.compile_only_s = cold.seconds;
      b.cold_compile_s = b.import_s + cold.seconds;
      cold.exe.reset();
      if (!opts.tessel_exe.empty()) {
        const nlohmann::json j = nlohmann::json::parse(
            run_capture({opts.tessel_exe, "load", mp.model, "--threads", std::to_string(opts.threads), "--cache-dir", tmpl, "--json"}));
        if (!j.at("entry_hit").get<bool>())
          throw Error(Location{.file = mp.model, .pass = "bench"},
                      fmt::format("the warm start did not hit the executable cache (stored {}, looked for {}{})",
                                  cold.entry_dir.empty() ? "nothing: " + cold.not_stored : cold.entry_dir,
                                  j.at("entry").get<std::string>(), cold.load_error.empty() ? "" : "; " + cold.load_error));
        b.cached_compile_s = j.at("seconds").get<double>();
        b.cached_in_fresh_process = true;
        if (!j.at("first_call_seconds").is_null()) b.first_call_ms = j.at("first_call_seconds").get<double>() * 1e3;
      }
      // The executable a warm start gives (prepacked weights mapped from the cache) is the one timed.
      ModelCompile warm = compile_model_cpu(mp.model, ins, co);
      if (!b.cached_in_fresh_process) b.cached_compile_s = warm.seconds;
      if (!warm.entry_hit && cold.not_stored.empty())
        throw Error(Location{.file = mp.model, .pass = "bench"}, "the second compile did not hit the executable cache");
      auto& exe = warm.exe;
      b.threads = exe->stats().threads;
      GraphRunStats st;
      time_calls(b, opts.iters, [&] { exe->run(ins, &st); });
      b.peak_mem_bytes = st.peak_bytes;
      if (opts.floor) {
        FloorResult fr = measure_model_matmul_floor(model, b.threads, opts.iters);
        rep.floor = FloorBench{fr.matmuls, fr.convolutions, fr.flops, fr.gflops(), fr.median_ms, fr.p10_ms, fr.p90_ms, fr.threads};
      }
    }
    rep.backends.push_back(b);
    progress.advance(1);
  }
  ticker.reset();
  progress.finish();
  // Ratios against eager, measured in this same run (eager is measured even when not listed first).
  const BackendBench* eager = nullptr;
  for (const auto& b : rep.backends)
    if (b.backend == "eager") eager = &b;
  for (auto& b : rep.backends) {
    if (!eager) break;
    b.speedup_vs_eager = eager->median_ms / b.median_ms;
    const double saved_s = (eager->median_ms - b.median_ms) / 1e3;
    if (b.backend != "eager" && saved_s > 0) b.break_even_iters = b.cold_compile_s / saved_s;
  }
  rep.load_after = sample_machine_load();
  const MachineLoad& worse = rep.load_after.others > rep.load_before.others ? rep.load_after : rep.load_before;
  rep.load_warning = load_warning(worse, resolve_threads(opts.threads));
  if (!opts.peers.empty()) {
    // PyTorch eager and ONNX Runtime on the same file, inputs and threads, after tessel's backends.
    int threads = resolve_threads(opts.threads);
    for (const auto& b : rep.backends)
      if (b.backend == "compiled") threads = b.threads;
    PeerOptions po;
    po.peers = opts.peers;
    po.threads = threads;
    po.iters = opts.iters;
    po.tessel_exe = opts.tessel_exe;
    po.progress = opts.progress;
    rep.peers = bench_peers(model, po);
    rep.peer_warnings = peer_warnings(rep.peers.rows, threads);
  }
  return rep;
}

void serve_compiled(const std::string& model, int threads, std::istream& in, std::ostream& out) {
  ModelPaths mp = resolve_model(model);
  if (mp.data_sets.empty()) throw Error(Location{.file = model}, "bench --serve needs a test_data_set_0 next to the model (its inputs)");
  const std::vector<Tensor> ins = read_data_set(mp.data_sets[0], "input");
  ModelCompileOptions co;
  co.backend.threads = threads;
  co.backend.model_name = std::filesystem::path(mp.model).parent_path().filename().string();
  ModelCompile mc = compile_model_cpu(mp.model, ins, co);
  auto& exe = mc.exe;
  GraphRunStats st;
  std::vector<Tensor> got = exe->run(ins, &st);
  nlohmann::json ready = {{"ready", true}, {"threads", exe->stats().threads}, {"compile_s", mc.seconds}, {"max_rel_err", nullptr}};
  if (const std::vector<Tensor> want = read_data_set(mp.data_sets[0], "output"); !want.empty()) {
    double worst = 0;
    for (size_t i = 0; i < want.size() && i < got.size(); ++i) worst = std::max(worst, compare_tensors(got[i], want[i], Tolerance{}).rel);
    ready["max_rel_err"] = got.size() == want.size() ? nlohmann::json(worst) : nlohmann::json("output count differs");
  }
  for (int i = 0; i < 3; ++i) exe->run(ins, &st);  // warm-up
  out << ready.dump() << std::endl;
  for (std::string line; std::getline(in, line);) {
    long long n = 0;
    const char* p = line.c_str();
    char* end = nullptr;
    errno = 0;
    n = std::strtoll(p, &end, 10);
    if (end == p || *end != '\0' || errno != 0 || n < 1 || n > 100000) {
      out << nlohmann::json{{"error", "expected a count of calls in 1..100000, got '" + display_text(line.substr(0, 40)) + "'"}}.dump()
          << std::endl;
      continue;
    }
    std::vector<double> ms;
    for (long long i = 0; i < n; ++i) {
      auto t0 = Clock::now();
      exe->run(ins, &st);
      ms.push_back(since(t0) * 1e3);
    }
    out << nlohmann::json{{"ms", ms}}.dump() << std::endl;
  }
}

nlohmann::json bench_json(const BenchReport& r) {
  nlohmann::json j = {{"model", r.model}, {"iters", r.iters}, {"backends", nlohmann::json::array()}};
  for (const auto& b : r.backends) {
    nlohmann::json e = {{"backend", b.backend},       {"import_s", b.import_s},   {"cold_compile_s", b.cold_compile_s},
                        {"median_ms", b.median_ms},   {"p10_ms", b.p10_ms},       {"p90_ms", b.p90_ms},
                        {"peak_mem_bytes", b.peak_mem_bytes}, {"compile_only_s", b.compile_only_s},
                        {"threads", b.threads}};
    e["cached_compile_s"] = b.cached_compile_s ? nlohmann::json(*b.cached_compile_s) : nlohmann::json(nullptr);
    if (b.backend == "compiled") {
      e["cached_in_fresh_process"] = b.cached_in_fresh_process;
      e["first_call_ms"] = b.first_call_ms ? nlohmann::json(*b.first_call_ms) : nlohmann::json(nullptr);
    }
    e["speedup_vs_eager"] = b.speedup_vs_eager > 0 ? nlohmann::json(b.speedup_vs_eager) : nlohmann::json(nullptr);
    e["break_even_iters"] = b.break_even_iters ? nlohmann::json(*b.break_even_iters) : nlohmann::json(nullptr);
    if (b.backend == "compiled" && r.floor && r.floor->median_ms > 0) e["vs_matmul_floor"] = b.median_ms / r.floor->median_ms;
    j["backends"].push_back(e);
  }
  j["skipped"] = nlohmann::json::array();
  for (const auto& [b, why] : r.skipped) j["skipped"].push_back({{"backend", b}, {"reason", why}});
  const BackendBench* compiled = nullptr;
  for (const auto& b : r.backends)
    if (b.backend == "compiled") compiled = &b;
  j["peers"] = nlohmann::json::array();
  for (const PeerBench& p : r.peers.rows) {
    nlohmann::json e = {{"peer", p.peer}, {"version", p.version}, {"threads", p.threads}, {"median_ms", p.median_ms},
                        {"p10_ms", p.p10_ms}, {"p90_ms", p.p90_ms}, {"blas", p.blas}};
    e["max_abs_err"] = p.max_abs_err ? nlohmann::json(*p.max_abs_err) : nlohmann::json(nullptr);
    // tessel's compiled median over the peer's, in this run: below 1 is tessel faster
    e["compiled_over_peer"] = compiled && p.median_ms > 0 ? nlohmann::json(compiled->median_ms / p.median_ms) : nlohmann::json(nullptr);
    j["peers"].push_back(e);
  }
  j["peers_skipped"] = nlohmann::json::array();
  for (const auto& [p, why] : r.peers.skipped) j["peers_skipped"].push_back({{"peer", p}, {"reason", why}});
  j["peer_warnings"] = r.peer_warnings;
  auto load = [](const MachineLoad& m) {
    return nlohmann::json{{"cores", m.cores}, {"other_runnable", m.samples ? nlohmann::json(m.others) : nlohmann::json(nullptr)}};
  };
  j["machine"] = {{"before", load(r.load_before)}, {"after", load(r.load_after)},
                  {"warning", r.load_warning.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.load_warning)}};
  if (r.floor)
    j["matmul_floor"] = {{"matmuls", r.floor->matmuls}, {"convolutions", r.floor->convolutions}, {"flops", r.floor->flops},     {"gflops", r.floor->gflops},
                         {"median_ms", r.floor->median_ms}, {"p10_ms", r.floor->p10_ms}, {"p90_ms", r.floor->p90_ms},
                         {"threads", r.floor->threads}};
  return j;
}

std::string bench_table(const BenchReport& r) {
  std::string s = fmt::format("{} ({} timed calls per backend, after one warm-up)\n", display_text(r.model), r.iters);
  if (!r.load_warning.empty()) s += "warning: " + r.load_warning + "\n";
  s += "compile s: import -> callable with an empty compile cache; cached s: model file -> callable with a warm cache\n";
  s += "eager: tessel's reference interpreter (not PyTorch eager); graph, compiled: tessel's backends\n";
  s += fmt::format("{:<9} {:>3} {:>9} {:>10} {:>9} {:>10} {:>9} {:>9} {:>9} {:>11} {:>9}\n", "backend", "thr", "import s",
                   "compile s", "cached s", "median ms", "p10 ms", "p90 ms", "speedup", "break-even", "peak MB");
  for (const auto& b : r.backends)
    s += fmt::format("{:<9} {:>3} {:>9.3f} {:>10.3f} {:>9} {:>10.3f} {:>9.3f} {:>9.3f} {:>9} {:>11} {:>9.2f}\n", b.backend,
                     b.threads, b.import_s, b.cold_compile_s,
                     b.cached_compile_s ? fmt::format("{:.3f}", *b.cached_compile_s) : "-", b.median_ms, b.p10_ms, b.p90_ms,
                     b.speedup_vs_eager > 0 ? fmt::format("{:.2f}x", b.speedup_vs_eager) : "-",
                     b.break_even_iters ? fmt::format("{:.1f}", *b.break_even_iters) : "-", b.peak_mem_bytes / 1e6);
  for (const auto& b : r.backends)
    if (b.backend == "compiled" && b.cached_compile_s)
      s += fmt::format("compiled cached s: {} (executable cache){}\n",
                       b.cached_in_fresh_process ? "a fresh `tessel load` process" : "measured in this process (no tessel executable given)",
                       b.first_call_ms ? fmt::format("; its first call took {:.2f} ms", *b.first_call_ms) : "");
  for (const auto& [b, why] : r.skipped) s += fmt::format("skipped {}: {}\n", b, why);
  if (!r.peers.rows.empty() || !r.peers.skipped.empty()) {
    // The peers, measured after tessel's backends in this run, each in its own process.
    const BackendBench* compiled = nullptr;
    for (const auto& b : r.backends)
      if (b.backend == "compiled") compiled = &b;
    s += "peers (same model file, inputs and threads, each in its own process after tessel's backends):\n";
    for (const PeerBench& p : r.peers.rows)
      s += fmt::format("{:<14} {:>3} {:>10.3f} {:>9.3f} {:>9.3f}  {}{}{}\n", p.peer, p.threads, p.median_ms, p.p10_ms, p.p90_ms,
                       display_text(p.version), p.max_abs_err ? fmt::format(", max abs err {:.1e}", *p.max_abs_err) : "",
                       compiled && p.median_ms > 0 ? fmt::format("; compiled / {} = {:.2f}", p.peer, compiled->median_ms / p.median_ms) : "");
    for (const auto& [p, why] : r.peers.skipped) s += fmt::format("skipped {}: {}\n", p, why);
    for (const std::string& w : r.peer_warnings) s += "warning: " + w + "\n";
  }
  if (r.floor && r.floor->matmuls + r.floor->convolutions > 0) {
    s += fmt::format("matmul floor: {} matmuls{} alone through oneDNN, {} threads: {:.3f} ms median ({:.0f} GFLOP/s)", r.floor->matmuls,
                     r.floor->convolutions ? fmt::format(" and {} convolutions", r.floor->convolutions) : "", r.floor->threads,
                     r.floor->median_ms, r.floor->gflops);
    for (const auto& b : r.backends)
      if (b.backend == "compiled") s += fmt::format("; compiled / floor = {:.2f}", b.median_ms / r.floor->median_ms);
    s += "\n";
  }
  return s;
}

}  // namespace tessel
