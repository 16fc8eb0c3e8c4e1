// `tessel bench`: each backend of the ladder (eager, graph, compiled) on one model, measured in one
// process: compile latency (cold: an empty compile cache; cached: a warm one), call time percentiles,
// speedup over eager, the number of calls after which compiling pays off, and peak intermediate memory.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <iosfwd>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessel/driver/bench_peers.h"
#include "tessel/support/machine_load.h"

namespace tessel {

struct BenchOptions {
  // Empty: every backend that applies (eager, graph, compiled); the report says which were skipped and
  // why. Named: exactly these, and one that cannot run is an error.
  std::vector<std::string> backends;
  int iters = 10;   // timed calls per backend (after one warm-up call)
  int threads = 0;  // compiled backend threads (0: all hardware threads); eager and graph use one
  bool floor = true; // with the compiled backend: also measure the matmul floor
  bool progress = false;  // a progress line on stderr, backend by backend (support/progress.h)
  // The tessel executable, to measure the cached compile in a fresh process (`tessel load`): in the
  // measuring process oneDNN's primitive cache and the loaded shared object would make it look
  // cheaper than a user's warm start. Empty: measured in this process (and marked so).
  std::string tessel_exe;
  // Peers measured after tessel's backends, each in its own process (bench_peers.h): "torch", "ort".
  std::vector<std::string> peers;
};

struct BackendBench {
  std::string backend;
  double import_s = 0;                     // reading the model (the same work for every backend)
  double cold_compile_s = 0;               // import → callable, compile cache empty (eager: import only)
  std::optional<double> cached_compile_s;  // file → callable with a warm cache (compiled only): the executable cache
  bool cached_in_fresh_process = false;    // cached_compile_s was measured by a fresh `tessel load`
  std::optional<double> first_call_ms;     // the first call after that warm start (fresh process only)
  double compile_only_s = 0;               // the cold compile without the import
  int threads = 1;
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
  double speedup_vs_eager = 0;             // eager median / this median
  std::optional<double> break_even_iters;  // compile time / time saved per call (when it saves time)
  size_t peak_mem_bytes = 0;               // peak bytes of live intermediates in one call
};

// The model's matmuls alone through oneDNN at the compiled backend's threads (bench/matmul_floor.md):
// what the compiled backend cannot beat without faster matmuls.
struct FloorBench {
  int matmuls = 0;
  int convolutions = 0;
  double flops = 0, gflops = 0;
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
  int threads = 0;
};

struct BenchReport {
  std::string model;
  int iters = 0;
  std::vector<BackendBench> backends;
  std::optional<FloorBench> floor;           // measured with the compiled backend (opts.floor)
  std::vector<std::pair<std::string, std::string>> skipped;  // backend, why (only when none were named)
  // Other runnable tasks sampled before and after the timings (support/machine_load.h), and the warning
  // when they left fewer free cores than the compiled backend's threads ("" when not).
  MachineLoad load_before, load_after;
  std::string load_warning;
  PeerResults peers;                          // PyTorch eager and ONNX Runtime rows (opts.peers)
  std::vector<std::string> peer_warnings;     // a peer's row not like-for-like (its BLAS, its threads)
};

// Why the compiled backend cannot run here (no C++ compiler: $TESSEL_CXX, else c++ on $PATH), or "".
std::string compiled_backend_unavailable();

// MODEL: a model-zoo folder or .onnx file with a test_data_set_0 next to it (its inputs are used).
BenchReport bench_model(const std::string& model, const BenchOptions& opts);
nlohmann::json bench_json(const BenchReport& r);

// `tessel bench MODEL --serve`: the compiled backend loaded once (through the compile cache), warmed up,
// then driven by lines on `in`, so that a harness can alternate it call by call with a peer in another
// process (bench/paired.py): each line is a count N (1..100000) of timed calls, answered by one JSON line
// {"ms": [...]} on `out`; a bad line is answered {"error": "..."}; end of input ends it. The first line
// written is {"ready": true, "threads": T, "compile_s": S, "max_rel_err": E} (E: against the data set's
// outputs, null when it has none).
void serve_compiled(const std::string& model, int threads, std::istream& in, std::ostream& out);
std::string bench_table(const BenchReport& r);

}  // namespace tessel
