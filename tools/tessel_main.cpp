// The `tessel` command line: the options of each command, parsed with CLI11, and the call of its
// function in driver/commands.h (where every command's work is). Nothing else is included from tessel.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "tessel/driver/commands.h"

using namespace tessel;

namespace {

// An option given where it cannot have an effect is an error, not a silent no-op (README, "The command
// line"): `opt` was given but `applies` is false; `why` says when it does apply.
void refuse_inapplicable(const CLI::Option* opt, bool applies, const std::string& why) {
  if (opt->count() > 0 && !applies) throw Error(Location{}, fmt::format("{} has no effect here: it {}", opt->get_name(), why));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessel: a compiler for dataflow ML accelerators"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tessel " + version_text());
  // Global options may also follow the subcommand (tessel conformance DIR --quiet).
  app.fallthrough();
  bool quiet = false;
  app.add_flag("-q,--quiet", quiet, "no progress lines on stderr (by default long work shows one: redrawn on a terminal, "
                                    "logged every 10 s otherwise)");
  std::string max_alloc;
  app.add_option("--max-alloc", max_alloc,
                 "largest single allocation a model may cause, in bytes (K/M/G/T suffixes; default: "
                 "$TESSEL_MAX_ALLOC_BYTES, else min(16 GiB, physical memory))");

  auto* run = app.add_subcommand("run", "Run a model (eager interpreter, graph backend or compiled backend)");
  std::string run_model, run_inputs;
  bool run_check = false;
  double run_rel = 1e-4;
  run->add_option("MODEL", run_model, "a .onnx file, a model-zoo folder or a .tsl file")->required();
  run->add_option("--inputs", run_inputs, "folder with input_N.pb (default: the model's test_data_set_0); with --dynamic a comma list of folders, each run by the one compilation");
  run->add_flag("--check", run_check, "compare with output_N.pb; exit 1 on FAIL");
  auto* run_rel_opt = run->add_option("--max-rel", run_rel, "relative error bound for --check (max|out-ref|/max|ref|)");
  std::string run_passes;
  run->add_option("--passes", run_passes, "passes to run before executing: simplify, or a comma list (see `tessel passes`)");
  std::string run_backend = "eager";
  int run_repeat = 1;
  run->add_option("--backend", run_backend, "eager (reference kernels), graph (core ops, precompiled kernels, planned arena) or compiled (fused kernels, generated C++, oneDNN)")
      ->check(CLI::IsMember({"eager", "graph", "compiled"}));
  run->add_option("--repeat", run_repeat, "run this many times and report the best time")->check(CLI::Range(1, 1000000));
  int run_threads = 0;
  auto* run_threads_opt = run->add_option("--threads", run_threads, "threads for the compiled backend (default: all hardware threads)")->check(CLI::Range(0, 4096));
  bool run_dynamic = false;
  auto* run_dynamic_opt = run->add_flag("--dynamic", run_dynamic, "compile once for every input size: the inputs' dims that are not numbers (ONNX dim_param) become size symbols, and the inputs bind them (docs/dynamic-shapes.md)");
  std::string run_json_path;
  auto* run_json_opt = run->add_option("--json", run_json_path, "also write the outputs' types and summaries and the check as JSON to this file");
  std::string run_target = "cpu";
  run->add_option("--target", run_target, "cpu (the --backend chosen) or cuda (the GPU: generated CUDA kernels, cuBLASLt)")
      ->check(CLI::IsMember({"cpu", "cuda"}));

  auto* comp = app.add_subcommand("compile", "Import and lower a model, printing one IR level");
  std::string comp_model, comp_emit = "graph", comp_out;
  bool comp_elide = false;
  comp->add_option("MODEL", comp_model, "a .onnx file, a model-zoo folder or a .tsl file")->required();
  comp->add_option("--emit", comp_emit, "what to print: graph (the graph level, or core after --passes core), kernel (the kernel level after fusion), cpp (the generated C++), cuda (the generated CUDA C++, with --target cuda), fusion (per kernel: fused nodes and DRAM traffic unfused vs fused); with a dataflow --target: tile (default), kernel, ktir (ktdp MLIR of the kernels KTIR can express) or none")->check(CLI::IsMember({"graph", "kernel", "cpp", "cuda", "fusion", "tile", "ktir", "none"}));
  comp->add_option("-o,--output", comp_out, "write the text here instead of stdout");
  auto* comp_elide_opt = comp->add_flag("--elide-constants", comp_elide, "print large constants as a size, not their data (not parseable)");
  std::string comp_passes, comp_dump, comp_print_after;
  bool comp_time = false;
  auto* comp_passes_opt = comp->add_option("--passes", comp_passes, "passes to run: simplify, or a comma list (see `tessel passes`)");
  comp->add_option("--dump-ir", comp_dump, "write every stage as NN-<stage>.tsl (graph), .kernel (after fuse) or .tile (dataflow targets) into this folder");
  comp->add_option("--print-after", comp_print_after, "print the IR after this stage (and nothing else): a graph pass, fuse, or with a dataflow --target a tile-* stage (see `tessel passes`)");
  comp->add_flag("--time-passes", comp_time, "print each pass's wall time and note to stderr");
  bool comp_dynamic = false;
  auto* comp_dynamic_opt = comp->add_flag("--dynamic", comp_dynamic, "the inputs' dims that are not numbers (ONNX dim_param) become size symbols: every level prints symbolic sizes (docs/dynamic-shapes.md)");
  bool comp_ktir_values = false;
  std::string comp_ktir_storage;
  auto* comp_ktir_storage_opt = comp->add_option("--ktir-storage", comp_ktir_storage, "with --emit ktir: f32 stores every float tensor as f32 on the same schedule (a check of the kernels' logic, not of the f16 format; docs/ktir.md)")->check(CLI::IsMember({"f32"}));
  comp->add_flag("--ktir-values", comp_ktir_values, "with --emit ktir -o FOLDER: also write tessel's functional-simulation values of every intermediate (test_data_set_0) as .npy");
  bool comp_train = false;
  std::string comp_wrt, comp_grad_of;
  comp->add_flag("--train", comp_train, "print the joint forward + backward core graph (reverse-mode autodiff) and a summary line");
  comp->add_option("--wrt", comp_wrt, "with --train: comma list of inputs/constants to differentiate (default: every float constant with more than one element)");
  comp->add_option("--grad-of", comp_grad_of, "with --train: the output to differentiate (default: the only output; a non-scalar one gets a seed input)");
  std::string comp_target = "cpu", comp_report, comp_dtype;
  comp->add_option("--target", comp_target, "cpu, cuda (--emit cuda: the generated CUDA C++; kernel), a dataflow preset (spyre, tpu-v5e, tpu-v4) or a hardware file (.json); "
                                            "dataflow targets: --emit tile (the tile level) or kernel");
  std::string comp_json;
  auto* comp_json_opt = comp->add_option("--json", comp_json, "host CPU target: write what the compilation ran and made here (its stages with their times and node counts; the graph's ops, or the kernels by kind with their fusion traffic)");
  auto* comp_report_opt = comp->add_option("--report", comp_report, "dataflow targets: write the per-kernel report (JSON) here and print its table");
  auto* comp_dtype_opt = comp->add_option("--dtype", comp_dtype, "dataflow targets: storage of float tensors on the device (f16, bf16, f32 where the target has it; default: f16 where the target stores it, else bf16)");

  auto* sim = app.add_subcommand("sim", "Map MODEL onto a dataflow target and simulate it: time, per-kernel roofline, stalls");
  std::string sim_model, sim_hw, sim_trace, sim_json, sim_dtype;
  sim->add_option("MODEL", sim_model, "a .onnx file, a model-zoo folder or a .tsl file")->required();
  sim->add_option("--hw", sim_hw, "a preset (spyre, tpu-v5e, tpu-v4) or a hardware file (.json)")->required();
  sim->add_option("--trace", sim_trace, "write a Chrome/Perfetto trace (JSON) here");
  sim->add_option("--json", sim_json, "write the report as JSON here");
  bool sim_no_functional = false;
  int sim_threads = 1;
  sim->add_flag("--no-functional", sim_no_functional, "only the timed simulation (no run with real values)");
  auto* sim_threads_opt = sim->add_option("--threads", sim_threads, "host threads for the functional simulation's library calls (default 1; 0: all hardware threads)")->check(CLI::Range(0, 4096));
  std::string sim_dump, sim_print_after;
  sim->add_option("--dump-ir", sim_dump, "write every stage (graph passes, fuse, tile-*) as NN-<stage>.tsl/.kernel/.tile into this folder");
  sim->add_option("--print-after", sim_print_after, "print the IR after this stage (see `tessel passes`) and stop");
  sim->add_option("--dtype", sim_dtype, "storage of float tensors on the device (f16, bf16, f32 where the target has it; default: f16 where the target stores it, else bf16)");
  double sim_max_rel = 0;
  auto* sim_rel_opt = sim->add_option("--max-rel", sim_max_rel, "relative error bound of the functional simulation's check against the eager interpreter (max|out-ref|/max|ref|; default: 1e-4 with f32 storage, 2e-2 f16, 5e-2 bf16)")->check(CLI::PositiveNumber);
  bool sim_train = false;
  sim->add_flag("--train", sim_train, "simulate a training step: the forward, the backward (remat partition) and an AdamW step over the parameters");
  std::string sim_shard;
  sim->add_option("--shard", sim_shard, "tp=N: shard the model tensor-parallel over the N chips of --hw's \"system\" section, time its stages and collectives on the chip links, and check every rank against eager (docs/multichip.md)");
  std::string sim_buckets, sim_bucket_symbol, sim_inputs;
  sim->add_option("--buckets", sim_buckets, "a comma list of sizes: the model's size symbol (its inputs' dims that are not numbers) is padded to the smallest that holds each data set's value, with masks where padding would change a result; one compilation per bucket (docs/dynamic-shapes.md, \"Buckets\")");
  sim->add_option("--bucket-symbol", sim_bucket_symbol, "with --buckets: the symbol to pad when the model has several");
  bool sim_bucket_cpu = false;
  sim->add_flag("--cpu", sim_bucket_cpu, "with --buckets: also time the trade-off on the host CPU: one symbolic compilation at each length vs a static compilation of each bucket");
  sim->add_option("--inputs", sim_inputs, "with --buckets: a comma list of data-set folders (input_N.pb, output_N.pb; default: the model's test_data_set_0)");

  auto* cmpc = app.add_subcommand("compare", "MODEL on two dataflow targets side by side: per kernel the fusion, layout, work "
                                             "division, tile sizes and scheduling on each, and the hardware facts behind each difference");
  std::string cmp_model, cmp_hw = "tpu-v5e,spyre", cmp_json, cmp_dtype;
  cmpc->add_option("MODEL", cmp_model, "a .onnx file, a model folder or a .tsl file")->required();
  cmpc->add_option("--hw", cmp_hw, "two targets: presets or hardware files (.json), comma-separated");
  cmpc->add_option("--json", cmp_json, "write the comparison as JSON here");
  cmpc->add_option("--dtype", cmp_dtype, "storage of float tensors on both (as tessel sim --dtype; default: each target's own)");
  auto* land = app.add_subcommand("landscape", "One row per target for MODEL: time, utilisation, DRAM traffic, padding waste, scratchpad peak, compile time (the Accelerator Landscape Map)");
  std::string land_model, land_targets = "spyre,tpu-v5e,cpu", land_json;
  int land_threads = 0;
  land->add_option("MODEL", land_model, "a .onnx file or a model-zoo folder (cpu runs its test_data_set_0)")->required();
  land->add_option("--targets", land_targets, "comma list: dataflow presets or hardware files, and cpu (measured on this machine)");
  auto* land_threads_opt = land->add_option("--threads", land_threads, "threads for the cpu row (default: all hardware threads)")->check(CLI::Range(0, 4096));
  land->add_option("--json", land_json, "write the rows as JSON here");

  auto* rep = app.add_subcommand("report", "Write one self-contained HTML page for MODEL: per dataflow target the timeline, "
                                            "roofline, kernels, scratchpad slices; the landscape; host steps; the CPU ladder");
  std::string rep_model, rep_hw = "spyre,tpu-v5e,cpu", rep_out, rep_dtype;
  ReportOptions rep_opts;
  rep->add_option("MODEL", rep_model, "a .onnx file or a model-zoo folder (cpu runs its test_data_set_0)")->required();
  rep->add_option("--hw", rep_hw, "comma list: dataflow presets or hardware files, and cpu (measured on this machine)");
  rep->add_option("-o,--output", rep_out, "the HTML file to write")->required();
  rep->add_option("--threads", rep_opts.threads, "threads for the cpu ladder's compiled backend (default: all hardware threads)")->check(CLI::Range(0, 4096));
  rep->add_option("--iters", rep_opts.iters, "timed calls per cpu backend")->check(CLI::Range(1, 100000));
  rep->add_option("--dtype", rep_dtype, "dataflow storage of float tensors (as tessel sim --dtype)");

  auto* hwc = app.add_subcommand("hw", "List the hardware presets, or describe one (or a hardware file)");
  std::string hw_what;
  hwc->add_option("TARGET", hw_what, "a preset name or a .json hardware file");
  std::string hw_matmul;
  hwc->add_option("--matmul", hw_matmul, "M,K,N: the cycles of one [M,K]x[K,N] on one core's matrix unit (JSON line)");

  auto* passes = app.add_subcommand("passes", "List the passes and pipelines");

  auto* conf = app.add_subcommand("conformance", "Run the ONNX backend test folders under DIR");
  std::string conf_dir, conf_json, conf_filter;
  int conf_jobs = 2;
  double conf_timeout = 120;
  bool conf_verbose = false;
  conf->add_option("DIR", conf_dir, "folder of test folders (model.onnx + test_data_set_N)")->required();
  conf->add_option("--json", conf_json, "write per-test results and totals to this file");
  conf->add_option("-j,--jobs", conf_jobs, "tests run at once");
  conf->add_option("--timeout", conf_timeout, "seconds per test before it counts as a hang");
  conf->add_option("--filter", conf_filter, "only tests whose path contains this");
  conf->add_flag("-v,--verbose", conf_verbose, "a line per finished test (stderr) and each failure's reason");
  std::optional<int> conf_min_pass;
  conf->add_option("--min-pass", conf_min_pass, "exit 0 when at least N tests pass (default: exit 1 unless every test "
                                                "passes); a crash or hang fails the run either way")
      ->check(CLI::Range(0, 100000000));
  std::string conf_passes;
  bool conf_require_core = false;
  conf->add_option("--passes", conf_passes, "passes to run on each model before it executes: simplify, core, or a comma list");
  conf->add_flag("--require-core", conf_require_core, "fail a test whose graph still holds a non-core op after the passes");
  std::string conf_backend = "eager";
  conf->add_option("--backend", conf_backend, "eager, graph (the \"core\" pipeline and the graph backend) or compiled (fused, generated C++)")
      ->check(CLI::IsMember({"eager", "graph", "compiled"}));

  auto* bench = app.add_subcommand("bench", "Time each backend on MODEL: compile latency, call time, speedup, memory");
  std::string bench_model_path, bench_backends, bench_json_path;
  int bench_iters = 10;
  bench->add_option("MODEL", bench_model_path, "a model-zoo folder or .onnx file with a test_data_set_0 (its inputs)")->required();
  bench->add_option("--backends", bench_backends, "comma list of backends: eager, graph, compiled (default: every one "
                                                  "that can run here; the report names any skipped and why)");
  int bench_threads = 0;
  auto* bench_threads_opt = bench->add_option("--threads", bench_threads, "threads for the compiled backend (default: all hardware threads)")->check(CLI::Range(0, 4096));
  auto* bench_iters_opt = bench->add_option("--iters", bench_iters, "timed calls per backend (after one warm-up call)");
  auto* bench_json_opt = bench->add_option("--json", bench_json_path, "also write the figures as JSON to this file");
  bool bench_serve = false;
  auto* bench_serve_opt = bench->add_flag("--serve", bench_serve, "load the compiled backend once, then time N calls for each line N on "
                                                                  "stdin, a JSON line each on stdout (bench/paired.py alternates it with a peer)");
  std::string bench_peers = "auto";
  auto* bench_peers_opt = bench->add_option("--peers", bench_peers, "after tessel's backends, the same model in PyTorch eager (torch: "
                                                                    "bench/onnx_torch.py) and ONNX Runtime (ort: onnxruntime-node), each in its own "
                                                                    "process: auto (both where they run; default), none, or a comma list");
  std::string bench_target = "cpu";
  bench->add_option("--target", bench_target, "cpu (the --backends) or cuda (the GPU: per-kernel CUDA-event times against their roofline)")
      ->check(CLI::IsMember({"cpu", "cuda"}));

  // --precision of --target cuda: one option, one variable, on run, compile and bench.
  std::string cuda_precision = "f32";
  auto add_precision = [&](CLI::App* sub) {
    return sub->add_option("--precision", cuda_precision, "with --target cuda: f32 (default) or bf16 (weights and matmul activations stored as bf16, the rest f32 as autocast; "
                                                          "f32 accumulation; outputs f32; --check and bench compare at 2e-2)")
        ->check(CLI::IsMember({"f32", "bf16"}));
  };
  auto* run_prec_opt = add_precision(run);
  auto* comp_prec_opt = add_precision(comp);
  auto* bench_prec_opt = add_precision(bench);

  auto* ops = app.add_subcommand("ops", "List the registered ops (the text of docs/ops.md)");

  // explain: graph breaks, their reasons and repairs (src/tessel/driver/explain.cpp).
  auto* explain = app.add_subcommand("explain", "Report graph breaks: partitions, each break's op, reason, location and a repair");
  std::string explain_model;
  ExplainOptions explain_opts;
  explain->add_option("MODEL", explain_model, "a .onnx file or a model-zoo folder")->required();
  explain->add_flag("--json", explain_opts.json, "print the report as JSON");
  explain->add_flag("--repair", explain_opts.repair, "apply the auto-repairs first (docs/graph-breaks.md)");
  explain->add_flag("--check", explain_opts.check, "run partitioned on test_data_set_0 and compare with its outputs; exit 1 on FAIL");
  auto* explain_backend_opt = explain->add_option("--backend", explain_opts.backend, "backend of the compiled partitions for --check")
      ->check(CLI::IsMember({"eager", "graph", "compiled"}));
  auto* explain_threads_opt = explain->add_option("--threads", explain_opts.threads, "threads for the compiled backend of --check (default: all hardware threads)")->check(CLI::Range(0, 4096));
  auto* explain_rel_opt = explain->add_option("--max-rel", explain_opts.max_rel, "relative error bound for --check");

  auto* load = app.add_subcommand("load", "Load MODEL for the compiled backend through the executable cache: time to a callable and of the first call");
  std::string load_model_path, load_cache;
  int load_threads = 0;
  bool load_json = false;
  load->add_option("MODEL", load_model_path, "a .onnx file, a model-zoo folder or a .tsl file")->required();
  load->add_option("--threads", load_threads, "threads (default: all hardware threads)")->check(CLI::Range(0, 4096));
  load->add_option("--cache-dir", load_cache, "the compile cache (default: $TESSEL_CACHE_DIR, else ~/.cache/tessel)");
  load->add_flag("--json", load_json, "print one line of JSON");

  auto* cache = app.add_subcommand("cache", "Show the compile cache (entries, size, budget), or clear or prune it");
  std::string cache_dir, cache_prune;
  bool cache_clear = false;
  cache->add_option("--cache-dir", cache_dir, "the cache (default: $TESSEL_CACHE_DIR, else ~/.cache/tessel)");
  cache->add_flag("--clear", cache_clear, "remove every entry (those other processes are using stay)")
      ->excludes(cache->add_option("--prune", cache_prune,
                                   "remove the least recently used entries until the rest fits in BYTES (K/M/G suffixes)"));

  auto* fuzz = app.add_subcommand("fuzz-graphs", "Random graphs on eager vs graph vs compiled vs the functional simulator (docs/random-graphs.md)");
  cli::FuzzGraphsArgs fz;
  fuzz->add_option("--seed", fz.seed, "first seed (graphs use seed, seed+1, ...)");
  fuzz->add_option("--count", fz.count, "number of graphs");
  fuzz->add_option("--backends", fz.backends, "comma list: graph, compiled, spyre, tpu-v5e, symbolic (compiled once with a size symbol, run at two of its values)");
  fuzz->add_option("--batch", fz.batch, "graphs per compiled module / simulated program");
  fuzz->add_option("--max-nodes", fz.max_nodes, "ops per graph (at most)");
  fuzz->add_flag("--minimise", fz.minimise, "minimise each mismatch and print the small .tsl");
  fuzz->add_option("--out", fz.out_dir, "with --minimise: write each minimised graph to DIR/seedN_BACKEND.tsl");
  fuzz->add_flag("--no-special", fz.no_special, "ordinary values only (no NaN/inf/-0/denormals/extremes)");
  fuzz->add_option("--replay", fz.replay, "check one .tsl (a tests/randgraph file) instead of drawing graphs");

  if (argc > 1 && argv[1][0] != '-') {
    // an unknown command: the commands there are, and the nearest one
    const std::string cmd = argv[1];
    std::vector<std::string> names;
    for (const CLI::App* sc : app.get_subcommands({})) names.push_back(sc->get_name());
    if (std::find(names.begin(), names.end(), cmd) == names.end()) {
      const std::string nearest = nearest_name(cmd, names);
      std::string list;
      for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
      fmt::print(stderr, "tessel: error: unknown command '{}'{} (commands: {})\n", display_text(cmd),
                 nearest.empty() ? "" : fmt::format("; did you mean '{}'?", nearest), list);
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version print as CLI11 prints them (exit 0); a parse error is one line and exit 2,
    // as every other refusal of the command line (CLI11's own form is two lines, exit 105-109)
    if (e.get_exit_code() == 0) return app.exit(e);
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    // (the message quotes the arguments as given: escaped like every other name from the user)
    fmt::print(stderr, "tessel: error: {} (see tessel --help, or tessel COMMAND --help)\n", display_text(what));
    return 2;
  }
  try {
    refuse_inapplicable(run_threads_opt, run_backend == "compiled", "sets the compiled backend's threads, and the backend is not compiled");
    refuse_inapplicable(run_dynamic_opt, run_target == "cpu" || run_target == "cuda", "compiles once for every input size on the CPU or CUDA, and --target is neither");
    refuse_inapplicable(run_json_opt, run_target == "cpu" && !run_dynamic, "writes a CPU run's JSON; --target cuda and --dynamic print theirs");
    refuse_inapplicable(run_rel_opt, run_check, "is the bound of --check, which is not given");
    refuse_inapplicable(run_prec_opt, run_target == "cuda", "chooses the CUDA target's precision, and --target is not cuda");
    refuse_inapplicable(comp_prec_opt, comp_target == "cuda", "chooses the CUDA target's precision, and --target is not cuda");
    refuse_inapplicable(comp_dynamic_opt, comp_target == "cpu" || comp_target == "cuda",
                        "keeps sizes symbolic for the CPU and CUDA targets' levels, and --target is neither (dataflow targets run static buckets)");
    refuse_inapplicable(bench_prec_opt, bench_target == "cuda", "chooses the CUDA target's precision, and --target is not cuda");
    refuse_inapplicable(explain_backend_opt, explain_opts.check, "chooses the backend of --check, which is not given");
    refuse_inapplicable(explain_rel_opt, explain_opts.check, "is the bound of --check, which is not given");
    refuse_inapplicable(explain_threads_opt, explain_opts.check && explain_opts.backend == "compiled",
                        "sets the compiled backend's threads for --check (with --backend compiled, the default)");
    refuse_inapplicable(land_threads_opt, ("," + land_targets + ",").find(",cpu,") != std::string::npos,
                        "sets the threads of the cpu row, and --targets has no cpu");
    refuse_inapplicable(comp_json_opt, comp_target == "cpu" && !comp_train && comp_print_after.empty(),
                        "writes the host CPU compilation's summary (not with --train or --print-after); a dataflow --target writes its report with --report");
    refuse_inapplicable(comp_report_opt, comp_target != "cpu", "is the per-kernel report of a dataflow --target, and the target is cpu");
    refuse_inapplicable(comp_ktir_storage_opt, comp_emit == "ktir", "sets the storage of the KTIR export, and --emit is not ktir");
    refuse_inapplicable(comp_dtype_opt, comp_target != "cpu", "sets the device storage of a dataflow --target, and the target is cpu");
    refuse_inapplicable(comp_passes_opt, comp_target == "cpu", "chooses the graph passes of --target cpu; a dataflow target runs the core pipeline");
    refuse_inapplicable(comp_elide_opt, comp_target == "cpu", "elides constants of --emit graph/kernel on --target cpu; a dataflow target's texts always elide them");
    refuse_inapplicable(sim_threads_opt, !sim_no_functional, "sets the threads of the functional simulation, and --no-functional skips it");
    refuse_inapplicable(sim_rel_opt, !sim_no_functional && !sim_train && sim_buckets.empty(),
                        "bounds the functional simulation's check, which --no-functional skips (--train and --buckets keep their own)");
    cli::apply_global_options(quiet, max_alloc);
    if (*explain) return cli::cmd_explain(explain_model, explain_opts);
    if (*run && run_target == "cuda") return cli::cmd_run_cuda(run_model, run_inputs, run_check, run_rel_opt->count() ? run_rel : 0.0, run_repeat,
                                                                cuda_precision, run_dynamic);
    if (*run && run_dynamic) return cli::cmd_run_dynamic(run_model, run_inputs, run_check, run_rel, run_passes, run_backend, run_repeat, run_threads);
    if (*run) return cli::cmd_run(run_model, run_inputs, run_check, run_rel, true, run_passes, run_backend, run_repeat, run_threads, run_json_path);
    if (*sim && !sim_shard.empty()) {
      if (sim_train || !sim_buckets.empty() || !sim_dump.empty() || !sim_print_after.empty())
        throw Error(Location{}, "sim --shard takes --hw, --trace, --json, --dtype, --max-rel and --no-functional");
      return cli::cmd_sim_sharded(sim_model, sim_hw, sim_shard, sim_trace, sim_json, sim_dtype, !sim_no_functional, sim_max_rel);
    }
    if (*sim && sim_train) {
      if (!sim_trace.empty() || !sim_dump.empty() || !sim_print_after.empty())
        throw Error(Location{}, "sim --train takes --hw, --json and --dtype (not --trace, --dump-ir or --print-after)");
      return cli::cmd_sim_train(sim_model, sim_hw, sim_json, sim_dtype);
    }
    if (*sim && !sim_buckets.empty()) {
      if (!sim_trace.empty() || !sim_dump.empty() || !sim_print_after.empty())
        throw Error(Location{}, "sim --buckets takes --hw, --inputs, --bucket-symbol, --json, --dtype and --threads");
      return cli::cmd_sim_buckets(sim_model, sim_hw, sim_buckets, sim_bucket_symbol, sim_inputs, sim_json, sim_dtype, !sim_no_functional,
                             sim_threads, sim_bucket_cpu);
    }
    if (*sim) return cli::cmd_sim(sim_model, sim_hw, sim_trace, sim_json, sim_dtype, !sim_no_functional, sim_threads, sim_dump,
                            sim_print_after, sim_max_rel);
    if (*rep) return cli::cmd_report(rep_model, rep_hw, rep_out, rep_dtype, rep_opts);
    if (*hwc) return cli::cmd_hw(hw_what, hw_matmul);
    if (*land) return cli::cmd_landscape(land_model, land_targets, land_threads, land_json);
    if (*cmpc) return cli::cmd_compare(cmp_model, cmp_hw, cmp_json, cmp_dtype);
    if (*comp && comp_target == "cuda")
      return cli::cmd_compile_cuda(comp_model, comp_emit == "graph" ? "cuda" : comp_emit, comp_out, cuda_precision, comp_dynamic);
    if (*comp && comp_target != "cpu")
      return cli::cmd_compile_dataflow(comp_model, comp_target, comp_emit == "graph" ? "tile" : comp_emit, comp_out, comp_report,
                                  comp_dtype, comp_dump, comp_print_after, comp_time, comp_ktir_values,
                                  comp_ktir_storage);
    if (*comp && comp_train) return cli::cmd_compile_train(comp_model, comp_out, comp_elide, comp_wrt, comp_grad_of);
    if (*comp)
      return cli::cmd_compile(comp_model, comp_emit, comp_out, comp_elide, comp_passes, comp_dump, comp_print_after,
                         comp_time, comp_dynamic, comp_json);
    if (*passes) return cli::cmd_passes();
    if (*ops) return cli::cmd_ops();
    if (*fuzz) return cli::cmd_fuzz_graphs(fz);
    if (*cache) return cli::cmd_cache(cache_dir, cache_clear, cache_prune);
    if (*load) return cli::cmd_load(load_model_path, load_threads, load_cache, load_json);
    if (*bench && bench_target == "cuda") {
      refuse_inapplicable(bench_threads_opt, false, "sets the CPU's compiled backend threads, and --target is cuda");
      refuse_inapplicable(bench_peers_opt, false, "adds CPU peers to the CPU's ladder, and --target is cuda");
      refuse_inapplicable(bench_serve_opt, false, "serves the CPU's compiled backend, and --target is cuda");
      if (!bench_backends.empty())
        throw Error(Location{}, "--backends has no effect here: it picks the CPU backends, and --target is cuda");
      return cli::cmd_bench_cuda(bench_model_path, bench_iters, cuda_precision, bench_json_path);
    }
    if (*bench) {
      BenchOptions bo;
      bo.iters = bench_iters;
      bo.threads = bench_threads;
      bo.backends = comma_list(bench_backends);
      if (bench_serve) {
        refuse_inapplicable(bench_serve_opt, bo.backends.empty() || bo.backends == std::vector<std::string>{"compiled"},
                            "serves the compiled backend alone, and --backends names another");
        refuse_inapplicable(bench_iters_opt, false, "sets the calls of a measuring run; --serve takes each count from stdin");
        refuse_inapplicable(bench_json_opt, false, "writes a measuring run's report; --serve answers each line on stdout");
        refuse_inapplicable(bench_peers_opt, false, "adds peers to a measuring run; --serve times tessel alone");
        return cli::cmd_serve(bench_model_path, bench_threads);
      }
      refuse_inapplicable(bench_threads_opt,
                          bo.backends.empty() || std::find(bo.backends.begin(), bo.backends.end(), "compiled") != bo.backends.end(),
                          "sets the compiled backend's threads, and --backends does not list compiled");
      bo.peers = parse_peers(bench_peers);
      return cli::cmd_bench(bench_model_path, bo, bench_json_path);
    }
    if (*conf) return cli::cmd_conformance(conf_dir, conf_json, conf_jobs, conf_timeout, conf_filter, conf_verbose,
                                      conf_passes, conf_require_core, conf_backend, conf_min_pass);
  } catch (const Error& e) {
    fmt::print(stderr, "tessel: error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "tessel: internal error: {}\n", display_text(e.what()));
    return 3;
  }
  return 0;
}
