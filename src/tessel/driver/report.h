// `tessel report MODEL --hw T1,T2,cpu`: runs what the page shows (the mapping and timed simulation on
// each dataflow target with its trace, the CPU ladder through `bench`) and renders it (html_report.h).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tessel/driver/dataflow.h"
#include "tessel/driver/html_report.h"

namespace tessel {

struct ReportOptions {
  std::string targets = "spyre,tpu-v5e,cpu";  // comma list: dataflow presets or hardware files, and cpu
  int threads = 0;          // the CPU ladder's compiled backend (0: all hardware threads)
  int iters = 10;           // timed calls per CPU backend
  std::string tessel_exe;   // for bench's warm start in a fresh process (empty: measured in-process)
  dataflow::MapOptions map;     // dataflow storage dtype and the rest (as tessel sim)
};

HtmlReportInput gather_report(const std::string& model, const ReportOptions& opts);

// One dataflow target's part of the page from its simulated run (recorded with DRAM samples for the trace).
HtmlTargetReport html_target_report(const std::string& target, const DataflowRun& run);

// The landscape's row of one dataflow target (`tessel landscape --json`, the report's table).
nlohmann::json landscape_row(const std::string& target, const DataflowCompile& dc, const DataflowReport& r);

}  // namespace tessel
