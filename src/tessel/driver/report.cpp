// Runs the simulations and the CPU ladder `tessel report` shows, and collects their JSON.
#include "tessel/driver/report.h"

#include <chrono>
#include <filesystem>
#include <optional>

#include "tessel/driver/bench.h"
#include "tessel/driver/model_dir.h"
#include "tessel/driver/multichip.h"
#include "tessel/support/error.h"
#include "tessel/support/escape.h"
#include "tessel/support/progress.h"
#include "tessel/support/strings.h"
#include "tessel/hw/hw.h"
#include "tessel/targets/dataflow/sim_engine.h"
#include "tessel/targets/dataflow/timing.h"

namespace tessel {

nlohmann::json landscape_row(const std::string& target, const DataflowCompile& dc, const DataflowReport& r) {
  const double pad = static_cast<double>(r.padding_waste) / 1e6;
  return {{"target", target}, {"time_us", r.sim_us}, {"utilisation", r.utilisation}, {"dram_mb", r.dram_bytes / 1e6},
          {"padding_mb", pad}, {"scratchpad_peak_kb", static_cast<double>(r.spad_peak) / 1e3},
          {"compile_ms", r.compile_seconds * 1e3}, {"roofline_us", r.bound_us}, {"pct_of_roofline", r.pct_of_bound}, {"cores", r.cores},
          {"dtype", std::string(dtype_name(dc.program.float_dtype))}};
}

HtmlTargetReport html_target_report(const std::string& target, const DataflowRun& run) {
  const hw::HwSpec& hw = run.compile.program.hw_spec();
  HtmlTargetReport tr;
  tr.name = target;
  tr.report = report_json(run.report);
  tr.trace = nlohmann::json::parse(dataflow::chrome_trace_json(run.sim.timeline.graph, hw, run.sim.result));
  tr.peak_matrix_flops = hw.peak_flops(run.compile.program.float_dtype);
  tr.peak_vector_flops = hw.vector.rate(hw::VectorOp::add) * static_cast<double>(hw.cores) * hw.clock_ghz * 1e9;
  tr.peak_dram_bytes = hw.peak_dram_bytes_per_second();
  tr.usable_scratchpad = hw.usable_scratchpad_bytes();
  return tr;
}

HtmlReportInput gather_report(const std::string& model, const ReportOptions& opts) {
  HtmlReportInput in;
  in.model = model;
  const std::vector<Tensor> ins = model_inputs(model);
  // Every target is checked before any work, then each is a step of the progress line on stderr (a
  // resnet18 report takes seconds per target: it said nothing while it worked).
  bool cpu = false;
  std::vector<std::pair<std::string, hw::HwSpec>> chips;
  for (const std::string& t : comma_list(opts.targets)) {
    if (t == "cpu") cpu = true;
    else chips.emplace_back(t, hw::resolve_target(t));
  }
  if (cpu && ins.empty()) throw Error(Location{.file = model}, "report's cpu ladder runs the model: it needs test_data_set_0 inputs");
  ProgressOptions po;
  po.eta = false;  // steps of very different lengths
  Progress progress("report " + display_text(std::filesystem::path(model).filename().string()), chips.size() + (cpu ? 1 : 0),
                    "targets", po);
  std::optional<ProgressTicker> ticker;
  if (progress_mode() != ProgressMode::quiet) ticker.emplace(progress);
  for (const auto& [t, hw] : chips) {
    progress.note(t + ": compile, map, simulate");
    dataflow::SimOptions so;
    so.record_dram_samples = true;
    const DataflowRun run = simulate_dataflow(compile_dataflow(model, ins, hw, opts.map), so);
    in.landscape.push_back(landscape_row(t, run.compile, run.report));
    in.targets.push_back(html_target_report(t, run));
    if (hw.system.chips > 1 && !ins.empty()) {  // a system: the model sharded over its chips as well
      progress.note(t + ": sharded over " + std::to_string(hw.system.chips) + " chips");
      MultiChipOptions mo;
      mo.shard.automatic = true;
      mo.float_dtype = opts.map.float_dtype;
      mo.one_chip_seconds = run.report.sim_us * 1e-6;  // the section above simulated it
      nlohmann::json j = multichip_json(run_multichip(model, ins, hw, mo));
      j["name"] = t;
      in.multichip.push_back(std::move(j));
    }
    progress.advance(1);
  }
  if (cpu) {
    progress.note("cpu: the eager, graph and compiled ladder");
    BenchOptions bo;
    bo.backends = {"eager", "graph", "compiled"};
    bo.iters = opts.iters;
    bo.threads = opts.threads;
    bo.tessel_exe = opts.tessel_exe;
    BenchReport br = bench_model(model, bo);
    in.cpu_bench = bench_json(br);
    for (const BackendBench& x : br.backends)
      if (x.backend == "compiled")
        in.landscape.push_back({{"target", "cpu"}, {"time_us", x.median_ms * 1e3}, {"compile_ms", x.cold_compile_s * 1e3},
                                {"threads", x.threads}});
    progress.advance(1);
  }
  ticker.reset();
  progress.finish();
  return in;
}

}  // namespace tessel
