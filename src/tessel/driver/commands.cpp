// The `tessel` command line's commands: each reads its model, runs the driver and prints what the
// command line promises (README, "The command line"). tools/tessel_main.cpp parses the options and calls
// one of these (driver/commands.h); nothing below the driver is reached from there.
#include "tessel/driver/commands.h"

#include <fmt/format.h>

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <nlohmann/json.hpp>

#include "tessel/driver/bench.h"
#include "tessel/driver/buckets.h"
#include "tessel/driver/compile_model.h"
#include "tessel/driver/cuda_cli.h"
#include "tessel/driver/train.h"
#include "tessel/driver/train_sim.h"
#include "tessel/driver/dataflow.h"
#include "tessel/driver/multichip.h"
#include "tessel/targets/dataflow/cost.h"
#include "tessel/lower/cpu.h"
#include "tessel/lower/lowering.h"
#include "tessel/targets/dataflow/functional.h"
#include "tessel/export/ktir.h"
#include "tessel/driver/compare.h"
#include "tessel/driver/conformance.h"
#include "tessel/driver/explain.h"
#include "tessel/driver/graph_diff.h"
#include "tessel/driver/model_dir.h"
#include "tessel/support/threads.h"
#include "tessel/driver/op_table.h"
#include "tessel/driver/report.h"
#include "tessel/driver/target_compare.h"
#include "tessel/frontend/onnx/importer.h"
#include "tessel/ir/bind.h"
#include "tessel/ir/op_registry.h"
#include "tessel/ir/printer.h"
#include "tessel/ir/verifier.h"
#include "tessel/passes/pass.h"
#include "tessel/runtime/graph_backend.h"
#include "tessel/runtime/compiled_backend.h"
#include "tessel/targets/cpu/exe_entry.h"
#include "tessel/kernel/kernel.h"
#include "tessel/targets/cpu/cache_budget.h"
#include "tessel/targets/cpu/codegen.h"
#include "tessel/targets/cpu/library_epilogue.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"
#include "tessel/support/escape.h"
#include "tessel/support/limits.h"
#include "tessel/support/progress.h"
#include "tessel/support/machine_load.h"
#include "tessel/support/strings.h"
#include "tessel/support/version.h"

namespace fs = std::filesystem;

namespace tessel::cli {

namespace {

std::string type_list(const std::vector<Value*>& vs) {
  std::string s;
  for (const Value* v : vs) s += fmt::format("{}{}: {}", s.empty() ? "" : ", ", display_text(v->name), v->type.str());
  return s;
}

void print_summary(const Graph& g, const ImportedModel& m) {
  std::map<std::string, int> ops;
  for (const auto& n : g.nodes()) ops[n->op_name()]++;
  size_t weight_bytes = 0;
  int nconst = 0;
  for (const Value* v : g.constants()) {
    weight_bytes += v->constant->nbytes();
    ++nconst;
  }
  fmt::print("graph '{}' (opset {}, from {})\n", display_text(g.name), m.opset,
             m.producer.empty() ? "unknown" : display_text(m.producer));
  fmt::print("  inputs:  {}\n  outputs: {}\n", type_list(g.inputs), type_list(g.outputs));
  fmt::print("  {} nodes, {} constants ({:.2f} MB)\n  ops:", g.nodes().size(), nconst, weight_bytes / 1e6);
  for (const auto& [op, n] : ops) fmt::print(" {}×{}", op, n);
  fmt::print("\n");
  for (const std::string& note : m.notes) fmt::print("  note: {}\n", note);
}

// The pass manager's options for --dump-ir / --print-after (printing to stdout).
PassOptions stage_options(const std::string& dump_dir, const std::string& print_after) {
  PassOptions po;
  po.dump_dir = dump_dir;
  po.print_after = print_after;
  po.print = [](const std::string& text) { fmt::print("{}", text); };
  return po;
}

// Runs the passes named by `spec` (`run --passes`; none when empty) on the model.
void apply_passes(Graph& g, const std::string& spec) {
  const auto pipeline = parse_pipeline(spec);
  if (!pipeline.empty()) run_pipeline(g, pipeline, stage_options("", ""));
}

// --time-passes: every stage's time, the size of its level after it and its note, to stderr.
void print_stage_times(const std::vector<PassRecord>& records) {
  for (const auto& r : records) {
    const StageInfo* s = lower::find_stage(r.pass);
    fmt::print(stderr, "pass {:<16} {:8.2f} ms  {:5} {} after  {}\n", r.pass, r.seconds * 1e3, r.nodes_after,
               s && s->to != IrLevel::graph ? "kernels" : "nodes", r.note);
  }
}

std::string op_counts(const std::map<std::string, int>& m) {
  std::string s;
  for (const auto& [op, n] : m) s += fmt::format("{}{}×{}", s.empty() ? "" : ", ", op, n);
  return s;
}

std::vector<std::string> names_of(const std::vector<Value*>& vs) {
  std::vector<std::string> names;
  for (const Value* v : vs) names.push_back(v->name);
  return names;
}

void print_outputs(const std::vector<Tensor>& outs, const std::vector<std::string>& names) {
  for (size_t i = 0; i < outs.size(); ++i) {
    const Tensor& t = outs[i];
    fmt::print("  output {} '{}': {}", i, i < names.size() ? display_text(names[i]) : "?", TensorType{t.dtype(), t.shape()}.str());
    if (t.numel() > 0) {
      fmt::print(" [");
      for (int64_t k = 0; k < std::min<int64_t>(t.numel(), 4); ++k)
        fmt::print("{}{:.6g}", k ? ", " : "", t.get_f(k));
      fmt::print("{}]", t.numel() > 4 ? ", ..." : "");
    }
    fmt::print("\n");
  }
}

// Runs the model `repeat` times with the eager interpreter; returns the outputs of the last run.
std::vector<Tensor> run_with_eager(const Graph& g, const std::vector<Tensor>& ins, int repeat) {
  std::vector<Tensor> outs;
  double best = 1e300;
  RunStats stats;
  for (int r = 0; r < repeat; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    outs = run_eager(g, ins, &stats);
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  fmt::print("ran eager in {:.1f} ms{} (peak intermediate memory {:.2f} MB = {} bytes)\n", best,
             repeat > 1 ? " (best of runs)" : "", stats.peak_bytes / 1e6, stats.peak_bytes);
  return outs;
}

// Runs an executable `repeat` times; the outputs of the last run, the stats and best time (ms) of all.
template <typename Exe>
std::vector<Tensor> run_repeatedly(Exe& exe, const std::vector<Tensor>& ins, int repeat, GraphRunStats& rs, double& best_ms) {
  std::vector<Tensor> outs;
  best_ms = 1e300;
  for (int r = 0; r < repeat; ++r) {
    outs = exe.run(ins, &rs);
    best_ms = std::min(best_ms, rs.seconds * 1e3);
  }
  return outs;
}

// Compiles the model for the graph backend and runs it `repeat` times, printing what compiling
// decided (kernels, fallbacks, dynamic region) and the memory of a run.
std::vector<Tensor> run_with_graph(std::unique_ptr<Graph> g, const std::vector<Tensor>& ins, int repeat,
                                   std::vector<std::string>& out_names) {
  auto exe = compile_graph(std::move(g), ins);
  const GraphCompileStats& cs = exe->stats();
  fmt::print("compiled for the graph backend in {:.1f} ms (passes {:.1f} ms): {} core-pipeline nodes, {} typed kernels, "
             "{} aliased reshapes, {} broadcast views, {} in place\n",
             cs.compile_seconds * 1e3, cs.pass_seconds * 1e3, cs.nodes, cs.typed, cs.aliased, cs.views, cs.in_place);
  fmt::print("  reference fallbacks (core ops without a typed kernel): {}{}\n", cs.fallback_count(),
             cs.fallback.empty() ? "" : " (" + op_counts(cs.fallback) + ")");
  fmt::print("  dynamic region (not core ops or dynamic shapes): {}{}\n", cs.dynamic_count(),
             cs.dynamic.empty() ? "" : " (" + op_counts(cs.dynamic) + ")");
  if (!cs.pipeline_error.empty())
    fmt::print("  graph break: the core pipeline could not lower the model, so it runs undecomposed ({})\n",
               cs.pipeline_error);
  if (!cs.baked_inputs.empty()) {
    std::string names;
    for (const auto& n : cs.baked_inputs) names += (names.empty() ? "" : ", ") + display_text(n);
    fmt::print("  specialised on the values of: {} (guarded)\n", names);
  }
  GraphRunStats rs;
  double best = 0;
  std::vector<Tensor> outs = run_repeatedly(*exe, ins, repeat, rs, best);
  fmt::print("ran graph in {:.1f} ms{} (arena {:.2f} MB, dynamic-region peak {:.2f} MB, peak intermediate memory {:.2f} MB = {} bytes)\n",
             best, repeat > 1 ? " (best of runs)" : "", rs.arena_bytes / 1e6, rs.heap_peak_bytes / 1e6, rs.peak_bytes / 1e6,
             rs.peak_bytes);
  fmt::print("  arena plan: {} buffers, {} bytes (most bytes alive at one step: {})\n", exe->buffer_requests().size(),
             cs.arena_bytes, cs.arena_lower_bound);
  out_names = names_of(exe->graph().outputs);
  return outs;
}

// The compile line of `run` and `load`: where the time went, or that the executable cache had it.
void print_compile(const ModelCompile& mc) {
  const CompiledCompileStats& cs = mc.exe->stats();
  if (mc.entry_hit) {
    fmt::print("compiled for the CPU in {:.1f} ms: executable cache hit (model hash {:.1f}, entry files {:.1f}, shared object "
               "{:.1f}, oneDNN setup {:.1f} ms, {} of {} weights prepacked), {} threads\n",
               mc.seconds * 1e3, mc.key_seconds * 1e3, cs.entry_seconds * 1e3, cs.load_seconds * 1e3, cs.library_seconds * 1e3, cs.prepacked,
               cs.matmul_kernels + cs.conv_kernels, cs.threads);
  } else {
    fmt::print("compiled for the CPU in {:.1f} ms (passes {:.1f}, fusion {:.1f}, codegen {:.1f}, C++ compiler {:.1f}{}, "
               "load {:.1f}, oneDNN setup {:.1f} ms), {} threads\n",
               cs.compile_seconds * 1e3, cs.graph.pass_seconds * 1e3, cs.fuse_seconds * 1e3, cs.codegen_seconds * 1e3,
               cs.cxx_seconds * 1e3, cs.cache_hit ? " (cache hit)" : "", cs.load_seconds * 1e3, cs.library_seconds * 1e3,
               cs.threads);
  }
  fmt::print("  {} kernels ({} loop, {} matmul, {} conv; {} epilogues inside oneDNN), {} core nodes outside kernels, "
             "fusion traffic {} -> {} bytes\n",
             cs.kernels, cs.loop_kernels, cs.matmul_kernels, cs.conv_kernels, cs.library_epilogues, cs.core_nodes_left,
             cs.bytes_unfused, cs.bytes_fused);
  if (!cs.source_path.empty()) fmt::print("  generated C++: {}\n", cs.source_path);
  if (mc.entry_hit) fmt::print("  executable cache entry: {}\n", mc.entry_dir);
  else if (!mc.entry_dir.empty()) fmt::print("  stored in the executable cache: {}\n", mc.entry_dir);
  else if (!mc.not_stored.empty()) fmt::print("  not stored in the executable cache: {}\n", mc.not_stored);
}

// Compiles the model for the compiled backend (through the executable cache unless passes were
// applied to the imported graph) and runs it `repeat` times.
std::vector<Tensor> run_with_compiled(ImportedModel& m, bool passes_applied, const std::vector<Tensor>& ins, int repeat,
                                      int threads, const std::string& model, std::vector<std::string>& out_names) {
  ModelCompileOptions o;
  o.backend.threads = threads;
  o.backend.model_name = fs::path(model).filename().string();
  o.executable_cache = !passes_applied;  // the entry is keyed by the file, not by what --passes did to it
  o.progress = true;
  ModelCompile mc = compile_model_cpu(model, ins, o, &m);
  print_compile(mc);
  CompiledExecutable& exe = *mc.exe;
  GraphRunStats rs;
  double best = 0;
  std::vector<Tensor> outs = run_repeatedly(exe, ins, repeat, rs, best);
  fmt::print("ran compiled in {:.2f} ms{} (arena {:.2f} MB, peak intermediate memory {:.2f} MB = {} bytes)\n", best,
             repeat > 1 ? " (best of runs)" : "", rs.arena_bytes / 1e6, rs.peak_bytes / 1e6, rs.peak_bytes);
  out_names = names_of(exe.graph().outputs);
  return outs;
}

// `tessel load`: a warm start as a user's program sees it (file to callable, then the first call).

// TEXT to PATH ("" or "-": stdout), checked after close (below).
void write_text(const std::string& path, const std::string& text);

}  // namespace

int cmd_fuzz_graphs(const FuzzGraphsArgs& a) {
  randgraph::DiffOptions o;
  o.backends.clear();
  o.backends = comma_list(a.backends);
  for (const std::string& b : o.backends)
    if (b != "graph" && b != "compiled" && b != "spyre" && b != "tpu-v5e" && b != "symbolic")
      throw Error(Location{.pass = "fuzz-graphs"}, fmt::format("unknown backend '{}' (graph, compiled, spyre, tpu-v5e, symbolic)", b));
  o.batch = a.batch;
  o.gen.max_nodes = a.max_nodes;
  o.gen.special_values = !a.no_special;
  if (!a.replay.empty()) {  // one .tsl (tests/randgraph/*.tsl): its header names the seed of its inputs
    std::ifstream in(a.replay);
    if (!in) throw Error(Location{.file = a.replay}, "cannot read the file");
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    auto g = parse_graph(text, a.replay);
    const auto findings = randgraph::check_graph(*g, randgraph::seed_of_text(text), o);
    for (const auto& f : findings) fmt::print("MISMATCH {}: {}\n", f.backend, f.detail);
    fmt::print("{}: {}\n", a.replay, findings.empty() ? "all backends agree with eager" : "FAIL");
    return findings.empty() ? 0 : 1;
  }
  int written = 0;
  auto report = [&](const randgraph::Finding& f) {
    fmt::print("MISMATCH seed={} backend={}: {}\n{}\n", f.seed, f.backend, f.detail, f.tsl);
    std::fflush(stdout);  // long campaigns: each finding shows as it is found
    if (!a.minimise || f.backend == "eager") return;
    auto g = randgraph::random_graph(f.seed, o.gen);
    auto m = randgraph::minimise(*g, f.seed, f.backend, o);
    const std::string text = randgraph::finding_text(*m, f.seed, f.backend + ": " + f.detail);
    fmt::print("minimised ({} nodes):\n{}\n", m->nodes().size(), text);
    if (!a.out_dir.empty()) {
      std::error_code ec;
      fs::create_directories(a.out_dir, ec);
      if (ec) throw Error(Location{.file = a.out_dir}, "cannot make the --out folder: " + ec.message());
      const std::string path = fmt::format("{}/seed{}_{}.tsl", a.out_dir, f.seed, f.backend);
      write_text(path, text);
      ++written;
    }
  };
  const randgraph::CampaignStats st = randgraph::run_campaign(a.seed, a.count, o, report);
  std::string per;
  for (const auto& [b, n] : st.compared)
    per += fmt::format(" {}={} ({:.1f} s, {} ill-conditioned outputs, {} at f32's range edge{})", b, n,
                       st.seconds.count(b) ? st.seconds.at(b) : 0.0,
                       st.ill_conditioned.count(b) ? st.ill_conditioned.at(b) : 0,
                       st.f32_range.count(b) ? st.f32_range.at(b) : 0,
                       st.out_of_range.count(b) ? fmt::format(", {} out of storage range", st.out_of_range.at(b)) : "");
  fmt::print("fuzz-graphs: seeds {}..{}: {} graphs, {} mismatches, {} eager errors, {} compilations, {:.1f} s; compared:{}\n",
             a.seed, a.seed + static_cast<uint64_t>(a.count) - 1, st.graphs, st.findings.size(), st.eager_errors,
             st.compilations, st.seconds_total, per);
  if (written) fmt::print("{} minimised graphs written to {}\n", written, a.out_dir);
  return st.findings.empty() ? 0 : 1;
}

int cmd_load(const std::string& model, int threads, const std::string& cache_dir, bool json) {
  const std::vector<Tensor> ins = model_inputs(model);
  ModelCompileOptions o;
  o.backend.threads = threads;
  o.backend.toolchain.cache_dir = cache_dir;
  o.backend.model_name = fs::path(model).filename().string();
  o.progress = true;
  ModelCompile mc = compile_model_cpu(model, ins, o);
  double first_call = -1;
  if (!ins.empty()) {
    GraphRunStats rs;
    auto t0 = std::chrono::steady_clock::now();
    mc.exe->run(ins, &rs);
    first_call = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (json) {
    nlohmann::json j = {{"model", model}, {"seconds", mc.seconds}, {"entry_hit", mc.entry_hit}, {"entry", mc.entry_dir},
                        {"key_seconds", mc.key_seconds}, {"import_seconds", mc.import_seconds},
                        {"entry_seconds", mc.exe->stats().entry_seconds}, {"so_load_seconds", mc.exe->stats().load_seconds},
                        {"threads", mc.exe->stats().threads}, {"prepacked", mc.exe->stats().prepacked},
                        {"first_call_seconds", first_call >= 0 ? nlohmann::json(first_call) : nlohmann::json(nullptr)}};
    fmt::print("{}\n", json_dump(j));
    return 0;
  }
  print_compile(mc);
  if (first_call >= 0) fmt::print("first call: {:.2f} ms\n", first_call * 1e3);
  return 0;
}

namespace {

// Compares outs with the data set's output_N.pb, a line per output; whether all match.
bool check_outputs(const std::vector<Tensor>& outs, const std::string& dir, double max_rel, nlohmann::json* json = nullptr) {
  std::vector<Tensor> refs = read_data_set(dir, "output");
  if (refs.size() != outs.size())
    throw Error(Location{.file = dir}, fmt::format("{} reference outputs for {} model outputs", refs.size(), outs.size()));
  bool ok = true;
  Tolerance tol;
  tol.max_rel = max_rel;
  for (size_t i = 0; i < outs.size(); ++i) {
    Comparison c = compare_tensors(outs[i], refs[i], tol);
    fmt::print("check output {}: max abs error {:.3g}, relative error {:.3g} -> {}{}\n", i, c.max_abs, c.rel,
               c.match ? "PASS" : "FAIL", c.match ? "" : " (" + c.mismatch + ")");
    if (json) (*json).push_back({{"output", i}, {"max_abs", c.max_abs}, {"rel", c.rel}, {"match", c.match}, {"mismatch", c.mismatch}});
    ok = ok && c.match;
  }
  return ok;
}

// `tessel run --json`: what the run printed, for a machine: the model, backend, inputs, each output's
// type and summary, and the check (null without --check). Times are `tessel bench --json`'s.
nlohmann::json run_json(const std::string& model, const std::string& backend, const std::string& inputs_dir,
                        const std::vector<Tensor>& outs, const std::vector<std::string>& names) {
  nlohmann::json j = {{"model", model}, {"backend", backend}, {"inputs", inputs_dir}, {"outputs", nlohmann::json::array()},
                      {"check", nullptr}};
  for (size_t i = 0; i < outs.size(); ++i) {
    const Tensor& t = outs[i];
    nlohmann::json o = {{"name", i < names.size() ? names[i] : ""}, {"dtype", dtype_name(t.dtype())}, {"shape", t.shape()}};
    double lo = 0, hi = 0, sum = 0;
    int64_t nonfinite = 0;
    for (int64_t k = 0; k < t.numel(); ++k) {
      const double v = t.get_f(k);
      if (!std::isfinite(v)) {
        ++nonfinite;
        continue;
      }
      const bool first = k == nonfinite;  // (the first finite element)
      lo = first ? v : std::min(lo, v), hi = first ? v : std::max(hi, v), sum += v;
    }
    const int64_t finite = t.numel() - nonfinite;
    o["min"] = finite ? nlohmann::json(lo) : nlohmann::json(nullptr);
    o["max"] = finite ? nlohmann::json(hi) : nlohmann::json(nullptr);
    o["mean"] = finite ? nlohmann::json(sum / static_cast<double>(finite)) : nlohmann::json(nullptr);
    o["nonfinite"] = nonfinite;
    j["outputs"].push_back(std::move(o));
  }
  return j;
}

}  // namespace

// `tessel run --dynamic`: one symbolic compilation (docs/dynamic-shapes.md) run on every data set of
// `inputs_dirs` (a comma list; default test_data_set_0), each binding printed and, with --check, its
// outputs compared. The compiled backend compiles once; eager runs the symbolic graph as it is.
int cmd_run_dynamic(const std::string& model, const std::string& inputs_dirs, bool check, double max_rel,
                    const std::string& passes, const std::string& backend, int repeat, int threads) {
  std::vector<std::string> dirs = comma_list(inputs_dirs);
  if (dirs.empty()) dirs.push_back(default_data_set(model));
  if (backend == "graph")
    throw Error(Location{.file = model}, "--dynamic runs on the compiled backend or the eager interpreter (the graph backend plans static shapes)");
  ImportedModel m = import_model_file(model, {}, true);
  apply_passes(*m.graph, passes);
  print_summary(*m.graph, m);
  std::vector<std::string> out_names = names_of(m.graph->outputs);
  std::unique_ptr<CompiledExecutable> exe;
  if (backend == "compiled") {
    CompiledBackendOptions o;
    o.threads = threads;
    o.model_name = fs::path(model).filename().string();
    exe = compile_cpu(std::move(m.graph), {}, o);
    const CompiledCompileStats& st = exe->stats();
    fmt::print("compiled once for every size in {:.2f} s: {} kernels, symbols {}\n", st.compile_seconds, st.kernels,
               st.symbols.empty() ? std::string("none") : fmt::format("{}", fmt::join(st.symbols, ", ")));
    out_names = names_of(exe->graph().outputs);
  }
  const Graph& g = exe ? exe->graph() : *m.graph;
  bool ok = true;
  for (const std::string& dir : dirs) {
    if (!fs::is_directory(dir)) throw Error(Location{.file = dir}, "inputs folder does not exist");
    std::vector<Tensor> ins = read_data_set(dir, "input");
    std::vector<Shape> shapes;
    for (const Tensor& t : ins) shapes.push_back(t.shape());
    Bindings b;
    if (std::string why = bind_symbols(g, shapes, b); !why.empty()) throw Error(Location{.file = dir, .pass = "guard"}, why);
    fmt::print("{}: {}\n", dir, b.empty() ? "no symbols" : binding_str(b));
    std::vector<Tensor> outs;
    if (exe) {
      const CompiledCompileStats before = exe->stats();
      GraphRunStats rs;
      double best = 0;
      outs = run_repeatedly(*exe, ins, std::max(1, repeat), rs, best);
      const CompiledCompileStats& after = exe->stats();
      std::string how;
      if (after.rebinding)
        how = after.rebinds > before.rebinds
                  ? fmt::format("executable rebound in {:.3f} ms", (after.rebind_seconds - before.rebind_seconds) * 1e3)
                  : std::string("executable already bound to it");
      else
        how = after.instance_seconds > before.instance_seconds
                  ? fmt::format("instance built in {:.1f} ms", (after.instance_seconds - before.instance_seconds) * 1e3)
                  : std::string("instance reused");
      fmt::print("ran compiled in {:.2f} ms{} (this binding: {}; arena {:.2f} MB)\n", best, repeat > 1 ? " (best of runs)" : "",
                 how, rs.arena_bytes / 1e6);
    } else {
      outs = run_with_eager(g, ins, std::max(1, repeat));
    }
    print_outputs(outs, out_names);
    if (check) ok = check_outputs(outs, dir, max_rel) && ok;
  }
  if (exe && exe->stats().rebinding)
    fmt::print("compilations: 1; one executable for every binding, rebound {} times ({:.3f} ms in all)\n", exe->stats().rebinds,
               exe->stats().rebind_seconds * 1e3);
  else if (exe)
    fmt::print("compilations: 1; instances built: {} ({:.1f} ms in all){}\n", exe->stats().instances, exe->stats().instance_seconds * 1e3,
               exe->stats().rebind_refused.empty() ? "" : "; one executable for every binding was refused: " + exe->stats().rebind_refused);
  if (!check) return 0;
  fmt::print("{}\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

int cmd_run(const std::string& model, std::string inputs_dir, bool check, double max_rel, bool summary,
            const std::string& passes, const std::string& backend, int repeat, int threads, const std::string& json_path) {
  if (inputs_dir.empty()) inputs_dir = default_data_set(model);
  if (!fs::is_directory(inputs_dir)) throw Error(Location{.file = inputs_dir}, "inputs folder does not exist");
  std::vector<Tensor> ins = read_data_set(inputs_dir, "input");
  ImportedModel m = import_model_file(model, ins);
  apply_passes(*m.graph, passes);
  if (summary) print_summary(*m.graph, m);
  std::vector<Tensor> outs;
  std::vector<std::string> out_names = names_of(m.graph->outputs);
  if (backend == "graph") outs = run_with_graph(std::move(m.graph), ins, std::max(1, repeat), out_names);
  else if (backend == "compiled") outs = run_with_compiled(m, !passes.empty(), ins, std::max(1, repeat), threads, model, out_names);
  else outs = run_with_eager(*m.graph, ins, std::max(1, repeat));
  print_outputs(outs, out_names);
  nlohmann::json j = run_json(model, backend, inputs_dir, outs, out_names);
  bool ok = true;
  if (check) {
    nlohmann::json per = nlohmann::json::array();
    ok = check_outputs(outs, inputs_dir, max_rel, &per);
    j["check"] = {{"pass", ok}, {"max_rel", max_rel}, {"outputs", per}};
    fmt::print("{}\n", ok ? "PASS" : "FAIL");
  }
  if (!json_path.empty()) write_text(json_path, json_dump(j, 1) + "\n");
  return ok ? 0 : 1;
}

namespace {

// Per kernel: what it fuses and the bytes its nodes would move alone vs as one kernel.
std::string fusion_report(const KernelModule& km) {
  std::string t = fmt::format("{:<6} {:<7} {:>6} {:>13} {:>13} {:>13}  {}\n", "kernel", "kind", "nodes", "unfused B",
                              "fused B", "saved B", "from");
  Dim u = 0, f = 0;  // symbolic sizes give symbolic byte counts
  for (const Kernel& k : km.kernels) {
    t += fmt::format("{:<6} {:<7} {:>6} {:>13} {:>13} {:>13}  {}{}\n", display_text(k.name), kernel_kind_name(k.kind), k.fused_nodes,
                     k.bytes_unfused.str(), k.bytes_fused.str(), (k.bytes_unfused - k.bytes_fused).str(), k.sources.empty() ? "" : display_text(k.sources[0]),
                     k.sources.size() > 1 ? fmt::format(" (+{})", k.sources.size() - 1) : "");
    u += k.bytes_unfused;
    f += k.bytes_fused;
  }
  t += fmt::format("{:<6} {:<7} {:>6} {:>13} {:>13} {:>13}\n", "total", "", "", u.str(), f.str(), (u - f).str());
  return t;
}

// TEXT to PATH ("" or "-": stdout); a file that cannot be written is an error naming it.
void write_text(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-") {
    fmt::print("{}", text);
    return;
  }
  std::ofstream f(path, std::ios::binary);
  f << text;
  f.close();  // checked after close: a full disk shows only when the last buffer is flushed (issue 41)
  if (!f) throw Error(Location{.file = path}, "cannot write output file (full disk, or not writable)");
}

}  // namespace

namespace {

// `compile --json`: what the compilation ran and made, for scripts (the text goes to -o or stdout).
nlohmann::json compile_json(const std::string& model, const std::string& emit, const std::string& out,
                            const std::vector<PassRecord>& records) {
  nlohmann::json j = {{"model", model}, {"target", "cpu"}, {"emit", emit}, {"output", out.empty() ? nlohmann::json() : nlohmann::json(out)}};
  j["stages"] = nlohmann::json::array();
  for (const PassRecord& r : records)
    j["stages"].push_back({{"stage", r.pass}, {"seconds", r.seconds}, {"nodes_after", r.nodes_after}, {"note", r.note}});
  return j;
}

nlohmann::json size_json(const Dim& d) {
  if (auto v = d.static_value()) return *v;
  return d.str();
}

}  // namespace

int cmd_compile(const std::string& model, const std::string& emit, const std::string& out, bool elide,
                const std::string& passes, const std::string& dump_dir, const std::string& print_after,
                bool time_passes, bool dynamic, const std::string& json_path) {
  ImportedModel m = import_model_file(model, {}, dynamic);
  nlohmann::json j;
  const bool lower = emit == "kernel" || emit == "cpp" || emit == "fusion";
  const StageInfo* shown = print_after.empty() ? nullptr : lower::find_stage(print_after);
  if (shown && shown->to == IrLevel::tile)
    throw Error(Location{.pass = "compile"}, fmt::format("--print-after {} is a dataflow stage: add --target spyre (or another dataflow target)", print_after));
  const bool to_kernel = lower || (shown && shown->to != IrLevel::graph);
  std::string text;
  if (to_kernel) {
    // The host CPU's lowering, the one `--backend compiled` runs (lower/cpu.h), so the printed kernels
    // and C++ are the real ones: the graph passes (core unless --passes), fusion, and cpu-codegen.
    lower::CpuOptions lo;
    lo.pipeline = passes.empty() ? "core" : passes;
    lo.codegen = emit == "cpp" || (shown && shown->name == "cpu-codegen");
    lo.model = fs::path(model).lexically_normal().filename().string();  // (a folder given as "dir/" too)
    if (lo.model.empty()) lo.model = fs::path(model).lexically_normal().parent_path().filename().string();
    lo.stages = stage_options(dump_dir, print_after);
    lo.elide_dumped_constants = false;
    lower::CpuLowered low = lower::lower_cpu(std::move(m.graph), lo);
    if (time_passes) print_stage_times(low.records);
    if (!print_after.empty()) return 0;
    if (emit == "kernel") text = print_kernel_module(low.module, elide);
    else if (emit == "cpp") text = low.source;
    else text = fusion_report(low.module);
    if (!json_path.empty()) {
      j = compile_json(model, emit, out, low.records);
      std::map<std::string, int> kinds;
      Dim unfused = 0, fused = 0;
      for (const Kernel& k : low.module.kernels) {
        kinds[std::string(kernel_kind_name(k.kind))]++;
        unfused = unfused + k.bytes_unfused, fused = fused + k.bytes_fused;
      }
      j["kernels"] = {{"count", low.module.kernels.size()}, {"by_kind", kinds}, {"bytes_unfused", size_json(unfused)},
                      {"bytes_fused", size_json(fused)}};
      j["pipeline_error"] = low.pipeline_error.empty() ? nlohmann::json() : nlohmann::json(low.pipeline_error);
    }
  } else {
    lower::Lowering lowering(stage_options(dump_dir, print_after));
    lowering.graph_passes(*m.graph, passes);
    if (time_passes) print_stage_times(lowering.records());
    if (!print_after.empty()) return 0;
    if (emit != "graph") throw Error(Location{.pass = "compile"}, fmt::format("unknown --emit level '{}'", emit));
    PrintOptions po;
    po.elide_constants = elide;
    text = print_graph(*m.graph, po);
    if (!json_path.empty()) {
      j = compile_json(model, emit, out, lowering.records());
      std::map<std::string, int> ops;
      for (const auto& n : m.graph->nodes()) ops[n->op->name]++;
      j["graph"] = nlohmann::json{{"nodes", m.graph->nodes().size()}, {"ops", ops}, {"symbols", graph_symbols(*m.graph)}};
    }
  }
  write_text(out, text);
  if (!json_path.empty()) write_text(json_path, json_dump(j, 1) + "\n");
  return 0;
}

// `compile MODEL --train`: the joint forward + backward core graph and its one-line summary.
int cmd_compile_train(const std::string& model, const std::string& out, bool elide, const std::string& wrt,
                      const std::string& of) {
  ImportedModel m = import_model_file(model, {});
  TrainOptions o;
  o.output = of;
  o.wrt = comma_list(wrt);
  TrainGraph t = build_train_graph(*m.graph, o);
  PrintOptions po;
  po.elide_constants = elide;
  const std::string text = print_graph(*m.graph, po);
  write_text(out, text);
  fmt::print("{}\n", train_summary(t));
  return 0;
}

// Exit 1 when a test did not pass, or, with --min-pass N, when fewer than N passed; crashes and hangs
// always fail the run.
int cmd_conformance(const std::string& dir, const std::string& json_path, int jobs, double timeout,
                    const std::string& filter, bool verbose, const std::string& passes, bool require_core,
                    const std::string& backend, std::optional<int> min_pass) {
  ConformanceOptions o;
  o.backend = backend;
  o.passes = passes;
  o.require_core = require_core;
  o.jobs = jobs;
  o.timeout_s = timeout;
  o.filter = filter;
  o.progress = true;
  o.verbose = verbose;
  auto t0 = std::chrono::steady_clock::now();
  ConformanceReport r = run_conformance(dir, o);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!json_path.empty()) {
    write_text(json_path, json_dump(report_json(r), 1) + "\n");
  }
  for (const auto& t : r.tests)
    if (t.status == "failed" || t.status == "crashed" || t.status == "timeout")
      if (verbose) fmt::print("{}: {}: {}\n", t.status, display_text(t.name), display_text(t.reason));
  const int passed = r.count("passed"), not_passed = static_cast<int>(r.tests.size()) - passed;
  if (not_passed > 0) fmt::print("not passed, by cause:\n{}", failures_by_cause(r));
  fmt::print("conformance {} ({} backend): {} tests, {} passed, {} failed, {} unsupported, {} crashed, {} timed out ({:.0f} s)\n",
             display_text(dir), backend, r.tests.size(), passed, r.count("failed"), r.count("unsupported"),
             r.count("crashed"), r.count("timeout"), s);
  if (r.count("crashed") + r.count("timeout") > 0) {
    fmt::print("FAIL: {} tests crashed or hung\n", r.count("crashed") + r.count("timeout"));
    return 1;
  }
  if (min_pass) {
    const bool ok = passed >= *min_pass;
    fmt::print("{}: {} passed, --min-pass {}\n", ok ? "PASS" : "FAIL", passed, *min_pass);
    return ok ? 0 : 1;
  }
  if (not_passed > 0) fmt::print("FAIL: {} of {} tests did not pass (--min-pass N accepts a run where N pass)\n", not_passed,
                                 r.tests.size());
  return not_passed > 0 ? 1 : 0;
}

namespace {

// Models on dataflow targets: `compile --target T` (tile level, report), `sim`, `hw`.
dataflow::MapOptions map_options(const std::string& dtype) {
  dataflow::MapOptions o;
  if (dtype.empty()) return o;  // the target's default
  auto t = dtype_from_name(dtype);
  // f32 storage (where the target has it, e.g. the TPU presets) makes the functional simulation an
  // exact check of the mapping, apart from the order of fp32 sums.
  if (!t || (*t != DType::f16 && *t != DType::bf16 && *t != DType::f32))
    throw Error(Location{.pass = "tile"}, fmt::format("--dtype must be f16, bf16 or f32, not '{}'", dtype));
  o.float_dtype = *t;
  return o;
}

}  // namespace

int cmd_compile_dataflow(const std::string& model, const std::string& target, const std::string& emit,
                         const std::string& out, const std::string& report, const std::string& dtype,
                         const std::string& dump_dir, const std::string& print_after, bool time_passes,
                         bool ktir_values, const std::string& ktir_storage) {
  DataflowCompile dc = compile_dataflow(model, model_inputs(model), hw::resolve_target(target), map_options(dtype),
                                        stage_options(dump_dir, print_after));
  // --ktir-storage f32: the same schedule with float globals stored as f32 (a check of the kernels' logic)
  if (ktir_storage == "f32") dc.program = ktir::ktir_widened_storage(dc.program);
  if (time_passes) print_stage_times(dc.stages);
  if (!print_after.empty()) return 0;
  if (emit == "tile") write_text(out, tile::print_tile_program(dc.program));
  else if (emit == "kernel") write_text(out, print_kernel_module(dc.module, true));
  else if (emit == "ktir" && (out.empty() || out == "-" || fs::path(out).extension() == ".mlir"))
    write_text(out, ktir::export_ktir(dc.program, dc.module));
  else if (emit == "ktir") {
    // -o names a folder: one module per kernel and manifest.json, what ktir-cpu reads (docs/ktir.md).
    ktir::KtirExport e = ktir::export_ktir_kernels(dc.program, dc.module);
    if (ktir_storage == "f32") e.storage = "f32";
    // --ktir-values: tessel's own values beside them (the functional simulation on test_data_set_0), the
    // oracle bench/ktir_check.py compares every kernel's results with and takes host steps' results from
    std::vector<std::pair<std::string, Tensor>> values;
    if (ktir_values) {
      const std::vector<Tensor> ins = model_inputs(model);
      if (ins.empty()) throw Error(Location{.file = model, .pass = "ktir"}, "--ktir-values needs the model's test_data_set_0 inputs");
      dataflow::FunctionalOptions fo;
      fo.keep_values = true;
      values = dataflow::run_functional(dc.program, dc.module, ins, fo).values;
    }
    ktir::write_ktir_folder(out, dc.program, dc.module, e, ktir_values ? &values : nullptr);
    fmt::print("ktir: {} of {} tile kernels in {} (one module each, manifest.json){}\n", e.kernels.size(), dc.program.kernels.size(),
               display_text(out), e.skipped.empty() ? "" : fmt::format("; {} skipped (listed in the manifest)", e.skipped.size()));
  }
  else if (emit != "none") throw Error(Location{.pass = "compile"}, fmt::format("--emit {} is not available for --target {} (tile, kernel, ktir)", emit, target));
  if (!report.empty()) {
    const DataflowReport r = simulate_dataflow(std::move(dc)).report;
    write_text(report, json_dump(report_json(r), 1) + "\n");
    fmt::print(stderr, "{}", report_table(r));
  }
  return 0;
}

namespace {

// Runs the tile program with real values and compares with the eager interpreter on the same inputs:
// within 2e-2 (f16 storage), 5e-2 (bf16) or 1e-4 (f32) of max|ref| (docs/sim.md), or max_rel when it is
// given (sim --max-rel). Returns whether it matched.
bool check_functional(const std::string& model, const DataflowCompile& dc, const std::vector<Tensor>& ins, int threads,
                      double max_rel = 0) {
  dataflow::FunctionalOptions fo;
  fo.threads = resolve_threads(threads);
  dataflow::FunctionalResult fr = dataflow::run_functional(dc.program, dc.module, ins, fo);
  ImportedModel ref = import_model_file(model, ins);
  std::vector<Tensor> want = run_eager(*ref.graph, ins);
  Tolerance tol;
  tol.max_rel = max_rel > 0                               ? max_rel
                : dc.program.float_dtype == DType::bf16 ? 5e-2
                : dc.program.float_dtype == DType::f32  ? 1e-4
                                                        : 2e-2;
  bool ok = want.size() == fr.outputs.size();
  double worst = 0;
  for (size_t i = 0; ok && i < want.size(); ++i) {
    Comparison c = compare_tensors(fr.outputs[i], want[i], tol);
    ok = ok && c.match;
    worst = std::max(worst, c.rel);
  }
  const std::string storage = fmt::format("{}{}", dtype_name(dc.program.float_dtype), dc.program.dl16 ? " (DL16)" : "");
  fmt::print("functional simulation ({} storage, fp32 accumulation): {} tiles, {} host steps in {:.1f} ms (kernels built "
             "{:.1f} ms); vs eager: relative error {:.2e} (tolerance {:.0e}) -> {}\n",
             storage, fr.tiles_executed, fr.host_steps, fr.seconds * 1e3, fr.compile_seconds * 1e3,
             worst, tol.max_rel, ok ? "PASS" : "FAIL");
  if (fr.flushed + fr.entry_flushed > 0)
    fmt::print("  {} values fell below {}'s range and became 0 (first: {}){}\n", fr.flushed + fr.entry_flushed, storage,
               fr.first_flush.empty() ? "on entry" : display_text(fr.first_flush),
               ok ? "" : "; bf16 storage keeps f32's range: --dtype bf16");
  if (fr.overflowed + fr.entry_overflowed > 0)
    fmt::print("  {} values overflowed {} to inf (first: {})\n", fr.overflowed + fr.entry_overflowed, storage,
               fr.first_overflow.empty() ? "on entry" : display_text(fr.first_overflow));
  return ok;
}

}  // namespace

// `sim MODEL --hw H --buckets 64,128,256`: one compilation per bucket, each data set on the smallest
// bucket that holds it, functionally checked and timed, with its padding waste (driver/buckets.h).
int cmd_sim_buckets(const std::string& model, const std::string& target, const std::string& buckets, const std::string& symbol,
                    const std::string& inputs, const std::string& json, const std::string& dtype, bool functional, int threads,
                    bool cpu) {
  BucketOptions o;
  o.cpu = cpu;
  for (const std::string& b : comma_list(buckets)) {
    int64_t v = 0;
    const auto [p, ec] = std::from_chars(b.data(), b.data() + b.size(), v);
    if (ec != std::errc() || p != b.data() + b.size() || v < 1)
      throw Error(Location{.pass = "bucket"}, fmt::format("--buckets: '{}' is not a size (a positive integer)", display_text(b)));
    o.buckets.push_back(v);
  }
  o.symbol = symbol;
  o.map = map_options(dtype);
  o.threads = threads;
  o.functional = functional;
  std::vector<std::string> dirs = comma_list(inputs);
  if (dirs.empty()) dirs.push_back(default_data_set(model));
  std::vector<std::vector<Tensor>> sets;
  for (const std::string& d : dirs) {
    if (!fs::is_directory(d)) throw Error(Location{.file = d}, "inputs folder does not exist");
    sets.push_back(read_data_set(d, "input"));
  }
  const BucketReport r = run_buckets(model, hw::resolve_target(target), sets, dirs, o);
  fmt::print("{}", bucket_table(r));
  if (!json.empty()) write_text(json, json_dump(bucket_json(r), 1) + "\n");
  for (const BucketRow& w : r.rows)
    if (!w.ok) return 1;
  return 0;
}

// `sim MODEL --train --hw H`: forward, backward and AdamW simulated in sequence (driver/train_sim.h).
int cmd_sim_train(const std::string& model, const std::string& target, const std::string& json, const std::string& dtype) {
  const TrainSimReport r = simulate_training(model, hw::resolve_target(target), map_options(dtype));
  fmt::print("{}", train_sim_text(r));
  if (!json.empty()) write_text(json, json_dump(train_sim_json(r), 1) + "\n");
  return 0;
}

int cmd_sim_sharded(const std::string& model, const std::string& target, const std::string& shard, const std::string& trace,
                    const std::string& json, const std::string& dtype, bool functional, double max_rel) {
  MultiChipOptions o;
  o.shard = parse_shard(shard);
  o.float_dtype = map_options(dtype).float_dtype;
  o.functional = functional;
  const hw::HwSpec hw = hw::resolve_target(target);
  const MultiChipRun r = run_multichip(model, model_inputs(model), hw, o);
  fmt::print("{}", multichip_text(r));
  if (!trace.empty()) {
    write_text(trace, r.system.trace_json);
    fmt::print("trace: {} (the system: one process per chip; open in ui.perfetto.dev)\n", trace);
  }
  if (!json.empty()) write_text(json, json_dump(multichip_json(r), 1) + "\n");
  const double bound = max_rel > 0 ? max_rel : 1e-4;
  if (r.max_rel > bound) {
    fmt::print("functional check FAILED: {:.3g} > {:.3g}\n", r.max_rel, bound);
    return 1;
  }
  return 0;
}

int cmd_sim(const std::string& model, const std::string& target, const std::string& trace, const std::string& json,
            const std::string& dtype, bool functional, int threads, const std::string& dump_dir,
            const std::string& print_after, double max_rel) {
  const std::vector<Tensor> ins = model_inputs(model);
  dataflow::SimOptions so;
  so.record_dram_samples = !trace.empty();
  // compile, timed simulation (and the functional run below): a large model's each take seconds.
  ProgressOptions po;
  po.eta = false;  // steps of very different lengths
  std::optional<Progress> progress(std::in_place, "sim " + display_text(fs::path(model).filename().string()),
                                   functional ? 3 : 2, "steps", po);
  std::optional<ProgressTicker> ticker;
  if (progress_mode() != ProgressMode::quiet) ticker.emplace(*progress);
  progress->note("compile and map to tiles");
  DataflowCompile compiled = compile_dataflow(model, ins, hw::resolve_target(target), map_options(dtype),
                                              stage_options(dump_dir, print_after));
  if (!print_after.empty()) return 0;
  progress->advance(1, "timed simulation");
  const DataflowRun run = simulate_dataflow(std::move(compiled), so);
  progress->advance(1, functional ? "functional simulation" : "");
  // The report goes to stdout after the progress line is gone (the functional run prints its own).
  ticker.reset();
  progress->finish();
  progress.reset();
  const DataflowCompile& dc = run.compile;
  const dataflow::SimulatedProgram& sp = run.sim;
  const DataflowReport& r = run.report;
  fmt::print("{}", report_table(r));
  fmt::print("compiled in {:.1f} ms (import, core pipeline, fusion {:.1f}; tile mapping {:.1f}); timed simulation of {} tasks "
             "in {:.1f} ms\n",
             r.compile_seconds * 1e3, dc.lower_seconds * 1e3, dc.map_seconds * 1e3, sp.timeline.graph.size(),
             r.sim_seconds * 1e3);
  if (!trace.empty()) {
    write_text(trace, dataflow::chrome_trace_json(sp.timeline.graph, dc.program.hw_spec(), sp.result));
    fmt::print("trace: {} (open in ui.perfetto.dev or chrome://tracing)\n", trace);
  }
  if (!json.empty()) write_text(json, json_dump(report_json(r), 1) + "\n");
  if (functional && !ins.empty()) return check_functional(model, dc, ins, threads, max_rel) ? 0 : 1;
  if (functional) fmt::print("functional simulation skipped: the model has no test_data_set_0 inputs\n");
  return 0;
}

// `tessel compare MODEL --hw A,B` (driver/target_compare.h).
int cmd_compare(const std::string& model, const std::string& targets, const std::string& json, const std::string& dtype) {
  const std::vector<std::string> t = comma_list(targets);
  if (t.size() != 2)
    throw Error(Location{.pass = "compare"}, fmt::format("--hw takes two targets, comma-separated, not '{}'", display_text(targets)));
  const std::vector<Tensor> ins = model_inputs(model);
  const DataflowCompile a = compile_dataflow(model, ins, hw::resolve_target(t[0]), map_options(dtype));
  const DataflowCompile b = compile_dataflow(model, ins, hw::resolve_target(t[1]), map_options(dtype));
  const TargetComparison c = compare_targets(a, b);
  fmt::print("{}", comparison_text(c));
  if (!json.empty()) write_text(json, json_dump(comparison_json(c), 1) + "\n");
  return 0;
}

// The Accelerator Landscape Map: one row per target for one model.
int cmd_landscape(const std::string& model, const std::string& targets, int threads, const std::string& json) {
  const std::vector<Tensor> ins = model_inputs(model);
  // Every target is checked before the first row (a bad one last in the list printed rows, then failed).
  std::map<std::string, hw::HwSpec> hw;
  for (const std::string& t : comma_list(targets)) {
    if (t == "cpu") {
      if (ins.empty()) throw Error(Location{.file = model}, "landscape's cpu row runs the model: it needs test_data_set_0 inputs");
      continue;
    }
    hw.emplace(t, hw::resolve_target(t));
  }
  nlohmann::json rows = nlohmann::json::array();
  fmt::print("{:<10} {:>11} {:>8} {:>11} {:>11} {:>11} {:>11} {:>10}\n", "target", "time us", "util %", "DRAM MB",
             "padding MB", "spad KB", "compile ms", "of roof %");
  for (const std::string& t : comma_list(targets)) {
    if (t == "cpu") {
      ModelCompileOptions o;
      o.backend.threads = threads;
      o.progress = true;
      auto t0 = std::chrono::steady_clock::now();
      ModelCompile mc = compile_model_cpu(model, ins, o);
      const double compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::vector<double> ms;
      const MachineLoad before = sample_machine_load();
      for (int i = 0; i < 21; ++i) {
        GraphRunStats rs;
        mc.exe->run(ins, &rs);
        if (i > 0) ms.push_back(rs.seconds * 1e3);
      }
      const MachineLoad after = sample_machine_load();
      const std::string busy = load_warning(after.others > before.others ? after : before, mc.exe->stats().threads);
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2];
      const double dram = static_cast<double>(mc.exe->stats().bytes_fused) / 1e6;
      fmt::print("{:<10} {:>11.1f} {:>8} {:>11.2f} {:>11} {:>11} {:>11.1f} {:>10}   ({}; DRAM: the fused kernels' "
                 "buffers; compile {})\n",
                 "cpu", med * 1e3, "-", dram, "0", "-", compile_ms, "-", count_text(mc.exe->stats().threads, "thread"),
                 mc.entry_hit ? "from the executable cache" : "cold");
      if (!busy.empty()) fmt::print(stderr, "tessel: warning: cpu row: {}\n", busy);
      rows.push_back({{"target", "cpu"}, {"time_us", med * 1e3}, {"dram_mb", dram}, {"compile_ms", compile_ms},
                      {"threads", mc.exe->stats().threads}, {"executable_cache_hit", mc.entry_hit},
                      {"load_warning", busy.empty() ? nlohmann::json(nullptr) : nlohmann::json(busy)}});
      continue;
    }
    const DataflowRun run = simulate_dataflow(compile_dataflow(model, ins, hw.at(t), dataflow::MapOptions{}));
    const DataflowCompile& dc = run.compile;
    const DataflowReport& r = run.report;
    const nlohmann::json row = landscape_row(t, dc, r);  // the printed row is the JSON's (one definition per figure)
    fmt::print("{:<10} {:>11.1f} {:>8.1f} {:>11.2f} {:>11.2f} {:>11.1f} {:>11.1f} {:>10.0f}   ({}, {})\n", t,
               row["time_us"].get<double>(), 100 * row["utilisation"].get<double>(), row["dram_mb"].get<double>(),
               row["padding_mb"].get<double>(), row["scratchpad_peak_kb"].get<double>(), row["compile_ms"].get<double>(),
               row["pct_of_roofline"].get<double>(), count_text(r.cores, "core"),
               fmt::format("{}{}", dtype_name(dc.program.float_dtype), dc.program.dl16 ? " DL16" : ""));
    rows.push_back(row);
  }
  if (!json.empty()) write_text(json, json_dump(rows, 1) + "\n");
  return 0;
}

namespace {

// The model an executable-cache entry was stored for (its manifest's), or "?" for a damaged one.
std::string entry_model(const std::string& entry) {
  try {
    return display_text(read_manifest(entry).model);
  } catch (const Error&) {
    return "?";
  }
}

}  // namespace

// `tessel cache`: the cache directory's entries (most recently used first), total and budget;
// --clear removes every entry no process is using, --prune BYTES the least recently used until the
// rest fits in BYTES.
int cmd_cache(const std::string& cache_dir, bool clear, const std::string& prune) {
  cpu::ToolchainOptions o;
  o.cache_dir = cache_dir;
  const std::string root = cpu::cache_directory(o);
  if (clear || !prune.empty()) {
    const auto keep = clear ? std::optional<uint64_t>(0) : parse_byte_size(prune);
    if (!keep) throw Error(Location{}, fmt::format("--prune '{}' is not a byte count (e.g. 2G, 512M)", prune));
    const cpu::PruneResult r = cpu::prune_cache(root, *keep);
    fmt::print("{}: removed {} entries ({}); {} kept{}\n", root, r.removed, bytes_text(r.removed_bytes),
               bytes_text(r.kept_bytes), r.busy ? fmt::format(" ({} in use by other processes)", r.busy) : "");
    return 0;
  }
  const std::vector<cpu::CacheEntry> entries = cpu::list_cache(root);
  const uint64_t held = cpu::total_bytes(entries);
  const cpu::CacheBudget budget = cpu::cache_budget(o, held);
  fmt::print("cache: {}\n", root);
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    const bool exe = it->kind == cpu::EntryKind::executable;
    const std::time_t t = static_cast<std::time_t>(it->last_used_ns / 1000000000);
    char when[32];
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M", std::localtime(&t));
    fmt::print("  {:<10} {:>10}  {}  {}{}{}\n", exe ? "executable" : "kernels", bytes_text(it->bytes), when,
               fs::path(it->path).filename().string(), exe ? "  " + entry_model(it->path) : "",
               it->complete ? "" : "  (incomplete)");
  }
  fmt::print("{} entries, {} of a budget of {} ({}{})\n", entries.size(), bytes_text(held), bytes_text(budget.bytes),
             budget.chosen_by, budget.chosen_by.starts_with("the default") ? "; TESSEL_CACHE_MAX_BYTES sets another" : "");
  return 0;
}

int cmd_hw(const std::string& what, const std::string& matmul) {
  if (!matmul.empty()) {
    // One GEMM on one core's matrix unit by the cost model (docs/dataflow-cost.md), as given: what
    // bench/scalesim_compare.py sets against SCALE-Sim.
    if (what.empty()) throw Error(Location{.pass = "hw"}, "--matmul needs a TARGET (a preset or a hardware file)");
    int64_t d[3] = {0, 0, 0};
    size_t at = 0;
    for (int i = 0; i < 3; ++i) {
      const size_t end = i < 2 ? matmul.find(',', at) : matmul.size();
      const std::string part = end == std::string::npos ? "" : matmul.substr(at, end - at);
      const auto r = std::from_chars(part.data(), part.data() + part.size(), d[i]);
      if (part.empty() || r.ec != std::errc() || r.ptr != part.data() + part.size() || d[i] <= 0 || d[i] > (int64_t{1} << 40))
        throw Error(Location{.pass = "hw"}, fmt::format("--matmul takes M,K,N (positive integers), not '{}'", display_text(matmul)));
      at = end + 1;
    }
    const hw::HwSpec hw = hw::resolve_target(what);
    const DType t = hw.matrix.dtype_rate.begin()->first;
    const dataflow::MatmulCost c = dataflow::matmul_cost(hw, d[0], d[1], d[2], t, dataflow::Orientation::as_given);
    const nlohmann::json j = {{"M", d[0]}, {"K", d[1]}, {"N", d[2]}, {"rows", hw.matrix.rows}, {"cols", hw.matrix.cols},
                              {"arrays", hw.matrix.count}, {"dataflow", hw::dataflow_name(hw.matrix.dataflow)},
                              {"dtype", std::string(dtype_name(t))}, {"fill", hw.matrix.fill_cycles},
                              {"drain", hw.matrix.drain_cycles}, {"folds", c.folds}, {"cycles", c.cycles}};
    fmt::print("{}\n", json_dump(j));
    return 0;
  }
  if (what.empty()) {
    fmt::print("presets:");
    for (const std::string& n : hw::preset_names()) fmt::print(" {}", n);
    fmt::print("\n(tessel hw NAME or tessel hw FILE.json describes one; docs/hw.md has the schema)\n");
    return 0;
  }
  fmt::print("{}", hw::describe(hw::resolve_target(what)));
  return 0;
}

// ---- commands whose options main() gathers into their structs ----------------------------------

int cmd_report(const std::string& model, const std::string& targets, const std::string& out, const std::string& dtype,
               ReportOptions opts) {
  opts.targets = targets;
  opts.map = map_options(dtype);
  opts.tessel_exe = fs::read_symlink("/proc/self/exe").string();
  HtmlReportInput in = gather_report(model, opts);
  in.generator = "Generated by tessel " + version_text();
  write_text(out, render_html_report(in));
  fmt::print("report: {} ({} dataflow targets{})\n", out, in.targets.size(), in.cpu_bench.is_object() ? ", cpu ladder" : "");
  return 0;
}

int cmd_run_cuda(const std::string& model, const std::string& inputs_dir, bool check, double max_rel, int repeat,
                 const std::string& precision, bool dynamic) {
  if (dynamic) return tessel::cmd_run_cuda_dynamic(model, inputs_dir, check, max_rel, repeat, cuda::parse_precision(precision));
  return tessel::cmd_run_cuda(model, inputs_dir, check, max_rel, repeat, cuda::parse_precision(precision));
}

int cmd_explain(const std::string& model, const ExplainOptions& opts) { return tessel::cmd_explain(model, opts); }

int cmd_passes() {
  fmt::print("pipelines:\n");
  for (const char* name : {"simplify", "core"}) {
    std::string list;
    for (const Pass* p : parse_pipeline(name)) list += (list.empty() ? "" : ",") + p->name;
    fmt::print("  {:<8} = {}\n", name, list);
  }
  fmt::print("passes (every stage, in pipeline order, with the levels it reads and writes):\n");
  for (const StageInfo& p : lower::all_stages())
    fmt::print("  {:<16} {:<15} {}\n", p.name, fmt::format("{} → {}", level_name(p.from), level_name(p.to)), p.summary);
  return 0;
}

int cmd_ops() {
  fmt::print("{}", op_table_markdown());
  return 0;
}

int cmd_compile_cuda(const std::string& model, const std::string& emit, const std::string& out, const std::string& precision,
                     bool dynamic) {
  write_text(out, emit_cuda(model, emit, cuda::parse_precision(precision), dynamic));
  return 0;
}

int cmd_bench_cuda(const std::string& model, int iters, const std::string& precision, const std::string& json_path) {
  CudaBenchOptions co;
  co.iters = iters;
  co.precision = cuda::parse_precision(precision);
  const nlohmann::json j = bench_cuda(model, co);
  if (!json_path.empty()) write_text(json_path, json_dump(j, 1) + "\n");
  return j.value("match", false) ? 0 : 1;
}

int cmd_bench(const std::string& model, BenchOptions o, const std::string& json_path) {
  o.tessel_exe = fs::read_symlink("/proc/self/exe").string();
  o.progress = true;
  BenchReport r = bench_model(model, o);
  fmt::print("{}", bench_table(r));
  if (!json_path.empty()) write_text(json_path, json_dump(bench_json(r), 1) + "\n");
  return 0;
}

int cmd_serve(const std::string& model, int threads) {
  serve_compiled(model, threads, std::cin, std::cout);
  return 0;
}

void apply_global_options(bool quiet, const std::string& max_alloc) {
  if (quiet) set_progress_mode(ProgressMode::quiet);
  if (!max_alloc.empty()) {
    const auto bytes = parse_byte_size(max_alloc);
    if (!bytes || *bytes == 0) throw Error(Location{}, fmt::format("--max-alloc '{}' is not a byte count (e.g. 4G, 512M)", max_alloc));
    set_max_alloc_bytes(*bytes);
  }
  max_alloc_bytes();  // a malformed $TESSEL_MAX_ALLOC_BYTES is reported here, before any work
  if (const char* v = std::getenv("TESSEL_CACHE_MAX_BYTES"); v && *v) cpu::cache_budget({}, 0);  // and the cache's budget
}


}  // namespace tessel::cli
