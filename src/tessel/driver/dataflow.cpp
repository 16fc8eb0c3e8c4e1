// Models on dataflow targets (see dataflow.h).
#include "tessel/driver/dataflow.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "tessel/driver/compile_model.h"
#include "tessel/lower/lowering.h"
#include "tessel/passes/pass.h"
#include "tessel/support/error.h"
#include "tessel/support/escape.h"
#include "tessel/support/strings.h"
#include "tessel/targets/dataflow/cost.h"
#include "tessel/targets/dataflow/sim_engine.h"

namespace tessel {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

DataflowCompile compile_dataflow(KernelModule module, const hw::HwSpec& hw, const dataflow::MapOptions& opts,
                                 const PassOptions& passes) {
  DataflowCompile dc;
  dc.module = std::move(module);
  lower::Lowering lowering(passes);
  const auto t0 = Clock::now();
  dc.program = lowering.map_to_tiles(dc.module, hw, opts);
  dc.map_seconds = since(t0);
  dc.stages = lowering.records();
  return dc;
}

namespace {

// import (timed by the caller) -> core pipeline -> fusion -> map_to_tiles, named `name`.
DataflowCompile lower_graph(std::unique_ptr<Graph> graph, Clock::time_point t0, const hw::HwSpec& hw,
                            const dataflow::MapOptions& opts, const PassOptions& passes) {
  lower::Lowering lowering(passes);
  lowering.graph_passes(*graph, "core");
  DataflowCompile dc;
  dc.module = lowering.fuse(std::move(graph));
  dc.lower_seconds = since(t0);
  const auto t1 = Clock::now();
  dc.program = lowering.map_to_tiles(dc.module, hw, opts);
  dc.map_seconds = since(t1);
  dc.stages = lowering.records();
  return dc;
}

}  // namespace

DataflowCompile compile_dataflow(const std::string& model, const std::vector<Tensor>& inputs, const hw::HwSpec& hw,
                                 const dataflow::MapOptions& opts, const PassOptions& passes) {
  const auto t0 = Clock::now();
  ImportedModel m = import_model_file(model, inputs);
  // the program is named as the user calls the model: its folder (model zoo), else the file's stem
  std::filesystem::path mp(model);
  while (!mp.empty() && !mp.has_filename()) mp = mp.parent_path();
  dataflow::MapOptions named = opts;
  named.name = std::filesystem::is_directory(mp) ? mp.filename().string()
               : mp.stem() == "model"             ? mp.parent_path().filename().string()
                                                  : mp.stem().string();
  return lower_graph(std::move(m.graph), t0, hw, named, passes);
}

DataflowCompile compile_dataflow(std::unique_ptr<Graph> graph, const hw::HwSpec& hw, const dataflow::MapOptions& opts,
                                 const PassOptions& passes) {
  dataflow::MapOptions named = opts;
  if (named.name.empty()) named.name = graph->name;
  return lower_graph(std::move(graph), Clock::now(), hw, named, passes);
}

DataflowReport dataflow_report(const DataflowCompile& dc, const dataflow::SimulatedProgram& sp) {
  const tile::TileProgram& p = dc.program;
  const hw::HwSpec& hw = p.hw_spec();
  DataflowReport r;
  r.model = p.name;
  r.target = p.target;
  r.cores = p.cores;
  r.sim_us = sp.result.seconds * 1e6;
  r.analytical_us = dataflow::estimate(sp.timeline.graph, hw).seconds * 1e6;
  r.dram_peak = p.dram_peak;
  for (const tile::Global& g : p.globals) {
    r.padded_bytes += g.bytes();
    r.logical_bytes += g.logical_bytes();
  }
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    const tile::TileKernel& t = p.kernels[i];
    const dataflow::KernelTime& kt = sp.kernels[i];
    KernelReport k;
    k.name = t.name;
    k.kind = std::string(tile::tile_kind_name(t.kind));
    k.node = t.node;
    k.sources = t.sources;
    k.decision = t.decision;
    k.cores = t.cores;
    for (const tile::Dim& d : t.dims)
      if (d.split > 1) k.split += fmt::format("{}{}{}", k.split.empty() ? "" : " ", d.name, d.split);
    if (k.split.empty()) k.split = t.kind == tile::TileKind::host ? "host" : "1 core";
    k.flops = t.flops;
    k.dram_bytes = static_cast<double>(t.dram_bytes);
    k.min_dram_bytes = kt.min_dram_bytes;
    k.intensity = kt.min_dram_bytes > 0 ? t.flops / kt.min_dram_bytes : 0;
    k.achieved_intensity = k.dram_bytes > 0 ? t.flops / k.dram_bytes : 0;
    k.bound_us = kt.bound_seconds * 1e6;
    k.sim_us = kt.seconds * 1e6;
    k.pct_of_bound = 100 * kt.fraction_of_bound;
    k.fusion_unfused = t.bytes_unfused;
    k.fusion_fused = t.bytes_fused;
    k.fusion_saved = t.bytes_unfused - t.bytes_fused;
    k.spad_peak = t.spad_peak;
    for (int gi : tile::kernel_globals(t)) {
      k.logical_bytes += p.globals[static_cast<size_t>(gi)].logical_bytes();
      k.padded_bytes += p.globals[static_cast<size_t>(gi)].bytes();
    }
    k.padding_waste = k.padded_bytes - k.logical_bytes;
    for (const tile::Operand& op : t.operands) {
      TensorSlice s;
      s.tensor = op.global >= 0 ? p.globals[static_cast<size_t>(op.global)].name : op.role;
      s.tile_bytes = op.tile_bytes;
      s.copies = op.copies;
      // one core's slice: the tile scaled up by the steps of the dims that index the operand
      double slice = static_cast<double>(op.tile_bytes);
      for (int d : op.dims) {
        const tile::Dim& dm = t.dims[static_cast<size_t>(d)];
        slice *= static_cast<double>(dm.slice) / static_cast<double>(dm.tile);
        s.dims.push_back(dm.name);
        s.slice_shape.push_back(dm.slice);
        s.tile_shape.push_back(dm.tile);
      }
      s.slice_bytes = static_cast<int64_t>(slice);
      k.slices.push_back(s);
    }
    r.flops += k.flops;
    r.dram_bytes += k.dram_bytes;
    r.bound_us += k.bound_us;
    r.spad_peak = std::max(r.spad_peak, k.spad_peak);
    r.fusion_saved += k.fusion_saved;
    r.host_steps += t.kind == tile::TileKind::host;
    r.kernels.push_back(std::move(k));
  }
  r.padding_waste = r.padded_bytes - r.logical_bytes;
  r.pct_of_bound = r.sim_us > 0 ? 100 * r.bound_us / r.sim_us : 0;
  const double peak = hw.peak_flops(p.float_dtype);
  r.utilisation = peak > 0 && sp.result.seconds > 0 ? r.flops / (sp.result.seconds * peak) : 0;
  const int lanes = dataflow::lanes_per_core(hw);
  r.lanes = static_cast<int64_t>(lanes) * hw.cores;
  for (int c = 0; c < hw.cores; ++c) r.core_busy.push_back(sp.result.core_busy_fraction(c));
  for (int c = 0; c < hw.cores; ++c)
    for (int l = 0; l < lanes; ++l) {
      const dataflow::LaneStats& s = sp.result.lanes[static_cast<size_t>(c * lanes + l)];
      r.stall_compute += hw.seconds(s.wait_compute) * 1e6;
      r.stall_dma += hw.seconds(s.wait_dma) * 1e6;
      r.stall_interconnect += hw.seconds(s.wait_interconnect) * 1e6;
      r.stall_dependency += hw.seconds(s.wait_dependency) * 1e6;
    }
  r.compile_seconds = dc.lower_seconds + dc.map_seconds;
  return r;
}

DataflowRun simulate_dataflow(DataflowCompile dc, const dataflow::SimOptions& options) {
  DataflowRun run;
  run.compile = std::move(dc);
  const auto t0 = Clock::now();
  run.sim = dataflow::simulate_program(run.compile.program, options);
  run.report = dataflow_report(run.compile, run.sim);
  run.report.sim_seconds = since(t0);
  return run;
}

DataflowReport sum_reports(const std::vector<const DataflowReport*>& parts) {
  DataflowReport s;
  if (parts.empty()) return s;
  s.model = parts[0]->model, s.target = parts[0]->target, s.cores = parts[0]->cores;
  double peak_flops_seconds = 0;  // (time x peak) summed, for the utilisation of the whole
  for (const DataflowReport* r : parts) {
    s.sim_us += r->sim_us, s.bound_us += r->bound_us, s.analytical_us += r->analytical_us;
    s.flops += r->flops, s.dram_bytes += r->dram_bytes;
    if (r->utilisation > 0) peak_flops_seconds += r->flops / r->utilisation;
    s.padded_bytes += r->padded_bytes, s.logical_bytes += r->logical_bytes, s.padding_waste += r->padding_waste;
    s.spad_peak = std::max(s.spad_peak, r->spad_peak), s.dram_peak = std::max(s.dram_peak, r->dram_peak);
    s.fusion_saved += r->fusion_saved, s.host_steps += r->host_steps;
    s.compile_seconds += r->compile_seconds, s.sim_seconds += r->sim_seconds;
    s.stall_compute += r->stall_compute, s.stall_dma += r->stall_dma;
    s.stall_interconnect += r->stall_interconnect, s.stall_dependency += r->stall_dependency;
    s.lanes = std::max(s.lanes, r->lanes);
    s.core_busy.resize(std::max(s.core_busy.size(), r->core_busy.size()), 0.0);
    for (size_t c = 0; c < r->core_busy.size(); ++c) s.core_busy[c] += r->core_busy[c] * r->sim_us;  // weighted by time
    s.kernels.insert(s.kernels.end(), r->kernels.begin(), r->kernels.end());
  }
  for (double& b : s.core_busy) b = s.sim_us > 0 ? b / s.sim_us : 0;
  s.pct_of_bound = s.sim_us > 0 ? 100 * s.bound_us / s.sim_us : 0;
  s.utilisation = peak_flops_seconds > 0 ? s.flops / peak_flops_seconds : 0;
  return s;
}

nlohmann::json report_json(const DataflowReport& r) {
  nlohmann::json j = {{"model", r.model},
                      {"target", r.target},
                      {"cores", r.cores},
                      {"simulated_us", r.sim_us},
                      {"analytical_us", r.analytical_us},
                      {"roofline_us", r.bound_us},
                      {"pct_of_roofline", r.pct_of_bound},
                      {"flops", r.flops},
                      {"dram_bytes", r.dram_bytes},
                      {"utilisation", r.utilisation},
                      {"padded_bytes", r.padded_bytes},
                      {"logical_bytes", r.logical_bytes},
                      {"padding_waste_bytes", r.padding_waste},
                      {"fusion_traffic_saved_bytes", r.fusion_saved},
                      {"scratchpad_peak_bytes", r.spad_peak},
                      {"dram_peak_bytes", r.dram_peak},
                      {"host_steps", r.host_steps},
                      {"compile_seconds", r.compile_seconds},
                      {"sim_seconds", r.sim_seconds},
                      {"core_busy", r.core_busy},
                      {"stalls_us",
                       {{"compute", r.stall_compute},
                        {"dma", r.stall_dma},
                        {"interconnect", r.stall_interconnect},
                        {"dependency", r.stall_dependency}}},
                      {"engine_lanes", r.lanes}};
  j["kernels"] = nlohmann::json::array();
  for (const KernelReport& k : r.kernels) {
    nlohmann::json e = {{"name", k.name},
                        {"kind", k.kind},
                        {"node", k.node},
                        {"sources", k.sources},
                        {"split", k.split},
                        {"cores", k.cores},
                        {"decision", k.decision},
                        {"flops", k.flops},
                        {"dram_bytes", k.dram_bytes},
                        {"min_dram_bytes", k.min_dram_bytes},
                        {"arithmetic_intensity", k.intensity},
                        {"achieved_intensity", k.achieved_intensity},
                        {"roofline_us", k.bound_us},
                        {"simulated_us", k.sim_us},
                        {"pct_of_roofline", k.pct_of_bound},
                        {"fusion_bytes_unfused", k.fusion_unfused},
                        {"fusion_bytes_fused", k.fusion_fused},
                        {"fusion_traffic_saved_bytes", k.fusion_saved},
                        {"logical_bytes", k.logical_bytes},
                        {"padded_bytes", k.padded_bytes},
                        {"padding_waste_bytes", k.padding_waste},
                        {"scratchpad_peak_bytes", k.spad_peak}};
    e["slices"] = nlohmann::json::array();
    for (const TensorSlice& s : k.slices)
      e["slices"].push_back({{"tensor", s.tensor}, {"slice_bytes", s.slice_bytes}, {"tile_bytes", s.tile_bytes}, {"copies", s.copies},
                             {"dims", s.dims}, {"slice_shape", s.slice_shape}, {"tile_shape", s.tile_shape}});
    j["kernels"].push_back(e);
  }
  return j;
}

std::string report_table(const DataflowReport& r) {
  std::string s = fmt::format("{} on {} ({}): {:.1f} us simulated, roofline {:.1f} us ({:.0f} %), utilisation {:.1f} %\n",
                              display_text(r.model), display_text(r.target), count_text(r.cores, "core"), r.sim_us, r.bound_us, r.pct_of_bound,
                              100 * r.utilisation);
  s += fmt::format("{:<5} {:<7} {:<26} {:<14} {:>10} {:>10} {:>6} {:>9} {:>9} {:>6} {:>10} {:>9} {:>9}\n", "kern", "kind",
                   "node", "split", "MFLOP", "DRAM KB", "FLOP/B", "bound us", "sim us", "% bnd", "saved KB", "pad KB",
                   "spad KB");
  for (const KernelReport& k : r.kernels) {
    const std::string shown = display_text(k.node);
    std::string node = shown.size() > 26 ? shown.substr(shown.size() - 26) : shown;
    s += fmt::format("{:<5} {:<7} {:<26} {:<14} {:>10.3f} {:>10.1f} {:>6.1f} {:>9.2f} {:>9.2f} {:>6.0f} {:>10.1f} {:>9.1f} {:>9.1f}\n",
                     display_text(k.name), k.kind, node, display_text(k.split), k.flops / 1e6, k.dram_bytes / 1e3, k.intensity, k.bound_us, k.sim_us,
                     k.pct_of_bound, static_cast<double>(k.fusion_saved) / 1e3, static_cast<double>(k.padding_waste) / 1e3,
                     static_cast<double>(k.spad_peak) / 1e3);
  }
  s += fmt::format("totals: {:.3f} GFLOP, {:.2f} MB DRAM traffic, fusion saved {:.2f} MB, padding waste {:.2f} MB of {:.2f} MB, "
                   "scratchpad peak {:.1f} KB per core, DRAM planned {:.2f} MB, {} host steps\n",
                   r.flops / 1e9, r.dram_bytes / 1e6, static_cast<double>(r.fusion_saved) / 1e6,
                   static_cast<double>(r.padding_waste) / 1e6, static_cast<double>(r.padded_bytes) / 1e6,
                   static_cast<double>(r.spad_peak) / 1e3, static_cast<double>(r.dram_peak) / 1e6, r.host_steps);
  double busy = 0;
  for (double b : r.core_busy) busy += b;
  const double lanes = static_cast<double>(std::max<int64_t>(1, r.lanes));
  s += fmt::format("cores busy {:.0f} % on average; waits of the average engine lane ({} in all): compute {:.2f} us, DMA {:.2f} us, "
                   "interconnect {:.2f} us, dependency {:.2f} us\n",
                   r.core_busy.empty() ? 0.0 : 100 * busy / static_cast<double>(r.core_busy.size()), count_text(r.lanes, "lane"),
                   r.stall_compute / lanes, r.stall_dma / lanes, r.stall_interconnect / lanes, r.stall_dependency / lanes);
  s += fmt::format("analytical estimate {:.1f} us (solo task times, no queueing or sharing: docs/sim.md); the event-driven "
                   "time is {:.2f}x it\n",
                   r.analytical_us, r.analytical_us > 0 ? r.sim_us / r.analytical_us : 0.0);
  return s;
}

}  // namespace tessel
