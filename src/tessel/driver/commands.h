// The `tessel` command line's commands (driver/commands.cpp), one function per command: the options
// parsed by tools/tessel_main.cpp go in, the exit status comes out (0 ok, 1 a check failed). A refusal
// throws tessel::Error (one line naming the file, node, op or pass), which main prints with exit 2.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tessel/driver/bench.h"
#include "tessel/driver/cuda_cli.h"
#include "tessel/driver/explain.h"
#include "tessel/driver/report.h"
// (and the support pieces the command line itself uses: Error, display_text, comma_list, nearest_name,
// version_text)
#include "tessel/support/error.h"
#include "tessel/support/escape.h"
#include "tessel/support/strings.h"
#include "tessel/support/version.h"

namespace tessel::cli {

// fuzz-graphs: random graphs on eager vs graph vs compiled vs the functional simulator
// (docs/random-graphs.md). Exit 1 when any backend disagrees with eager.
struct FuzzGraphsArgs {
  uint64_t seed = 1;
  int count = 100;
  std::string backends = "graph,compiled,spyre,tpu-v5e";
  int batch = 20;
  int max_nodes = 6;
  bool minimise = false;
  bool no_special = false;
  std::string out_dir, replay;
};

int cmd_fuzz_graphs(const FuzzGraphsArgs& a);

int cmd_load(const std::string& model, int threads, const std::string& cache_dir, bool json);

// `tessel run --dynamic`: one symbolic compilation (docs/dynamic-shapes.md) run on every data set of
// `inputs_dirs` (a comma list; default test_data_set_0), each binding printed and, with --check, its
// outputs compared. The compiled backend compiles once; eager runs the symbolic graph as it is.
int cmd_run_dynamic(const std::string& model, const std::string& inputs_dirs, bool check, double max_rel,
                    const std::string& passes, const std::string& backend, int repeat, int threads);

int cmd_run(const std::string& model, std::string inputs_dir, bool check, double max_rel, bool summary,
            const std::string& passes, const std::string& backend, int repeat, int threads, const std::string& json_path);

int cmd_compile(const std::string& model, const std::string& emit, const std::string& out, bool elide,
                const std::string& passes, const std::string& dump_dir, const std::string& print_after,
                bool time_passes, bool dynamic, const std::string& json_path = {});

// `compile MODEL --train`: the joint forward + backward core graph and its one-line summary.
int cmd_compile_train(const std::string& model, const std::string& out, bool elide, const std::string& wrt,
                      const std::string& of);

// Exit 1 when a test did not pass, or, with --min-pass N, when fewer than N passed; crashes and hangs
// always fail the run.
int cmd_conformance(const std::string& dir, const std::string& json_path, int jobs, double timeout,
                    const std::string& filter, bool verbose, const std::string& passes, bool require_core,
                    const std::string& backend, std::optional<int> min_pass);

int cmd_compile_dataflow(const std::string& model, const std::string& target, const std::string& emit,
                         const std::string& out, const std::string& report, const std::string& dtype,
                         const std::string& dump_dir, const std::string& print_after, bool time_passes,
                         bool ktir_values = false, const std::string& ktir_storage = "");

// `sim MODEL --hw H --buckets 64,128,256`: one compilation per bucket, each data set on the smallest
// bucket that holds it, functionally checked and timed, with its padding waste (driver/buckets.h).
int cmd_sim_buckets(const std::string& model, const std::string& target, const std::string& buckets, const std::string& symbol,
                    const std::string& inputs, const std::string& json, const std::string& dtype, bool functional, int threads,
                    bool cpu);

// `sim MODEL --train --hw H`: forward, backward and AdamW simulated in sequence (driver/train_sim.h).
int cmd_sim_train(const std::string& model, const std::string& target, const std::string& json, const std::string& dtype);

// `sim MODEL --hw SYSTEM.json --shard tp=N`: the model sharded over the system's N chips, its stages and
// collectives timed on the links, the ranks' graphs checked against eager (driver/multichip.h). max_rel:
// the check's bound (0: 1e-4).
int cmd_sim_sharded(const std::string& model, const std::string& target, const std::string& shard, const std::string& trace,
                    const std::string& json, const std::string& dtype, bool functional, double max_rel);

// max_rel: the functional check's bound (0: the storage's, check_functional).
int cmd_sim(const std::string& model, const std::string& target, const std::string& trace, const std::string& json,
            const std::string& dtype, bool functional, int threads, const std::string& dump_dir,
            const std::string& print_after, double max_rel = 0);

// `tessel compare MODEL --hw A,B` (driver/target_compare.h).
int cmd_compare(const std::string& model, const std::string& targets, const std::string& json, const std::string& dtype);

// The Accelerator Landscape Map: one row per target for one model.
int cmd_landscape(const std::string& model, const std::string& targets, int threads, const std::string& json);

// `tessel cache`: the cache directory's entries (most recently used first), total and budget;
// --clear removes every entry no process is using, --prune BYTES the least recently used until the
// rest fits in BYTES.
int cmd_cache(const std::string& cache_dir, bool clear, const std::string& prune);

int cmd_hw(const std::string& what, const std::string& matmul);


// `report MODEL --hw T,... -o PAGE`: the HTML report (driver/html_report.h).
int cmd_report(const std::string& model, const std::string& targets, const std::string& out, const std::string& dtype,
               ReportOptions opts);
// `run MODEL --target cuda`: the model on the GPU (driver/cuda_cli.h), precision f32 or bf16; `dynamic`:
// one symbolic compilation run on every data set of the comma list `inputs_dir`.
int cmd_run_cuda(const std::string& model, const std::string& inputs_dir, bool check, double max_rel, int repeat,
                 const std::string& precision, bool dynamic = false);
// `explain MODEL`: graph breaks, their reasons and repairs (driver/explain.h).
int cmd_explain(const std::string& model, const ExplainOptions& opts);
// `passes`: the pipelines and every stage of every target, with the levels each reads and writes.
int cmd_passes();
// `ops`: the registered ops (the text of docs/ops.md).
int cmd_ops();
// `compile MODEL --target cuda --emit E`: the generated CUDA C++ (or its kernel level).
int cmd_compile_cuda(const std::string& model, const std::string& emit, const std::string& out, const std::string& precision,
                     bool dynamic = false);
// `bench MODEL --target cuda`: per-kernel CUDA-event times against their roofline; exit 1 when outputs differ.
int cmd_bench_cuda(const std::string& model, int iters, const std::string& precision, const std::string& json_path);
// `bench MODEL`: each CPU backend timed (driver/bench.h); `bench --serve`: the compiled backend answering stdin.
int cmd_bench(const std::string& model, BenchOptions o, const std::string& json_path);
int cmd_serve(const std::string& model, int threads);

// The options every command takes (--quiet, --max-alloc), and the environment's limits checked before any work.
void apply_global_options(bool quiet, const std::string& max_alloc);

}  // namespace tessel::cli
