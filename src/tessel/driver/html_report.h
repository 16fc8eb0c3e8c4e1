// `tessel report`: one self-contained HTML page (inline CSS and SVG, no script, no network) with what
// the course asks people to look at for one model: where the simulated time goes on each dataflow
// target (a timeline of engines x cores, a roofline per kernel, the kernel table with fusion traffic
// saved and padding waste, scratchpad slices per core), the host steps, the landscape across targets,
// and on the CPU the eager / graph / compiled ladder. Rendered from the reports' JSON, so the page
// shows exactly what `tessel sim --json`, `--trace`, `tessel landscape --json` and `tessel bench --json`
// write. Every text from the model (node, kernel and tensor names) is HTML-escaped.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessel {

struct HtmlTargetReport {
  std::string name;            // "spyre"
  nlohmann::json report;       // report_json(DataflowReport)
  nlohmann::json trace;        // dataflow::chrome_trace_json(...), parsed
  double peak_matrix_flops = 0;  // whole chip, the program's float dtype (FLOP/s)
  double peak_vector_flops = 0;  // whole chip, vector adds (element ops/s)
  double peak_dram_bytes = 0;    // bytes/s
  int64_t usable_scratchpad = 0; // bytes per core
};

struct HtmlReportInput {
  std::string model;
  std::string generator;                    // "tessel 0.x (build ...)", shown in the footer
  std::vector<HtmlTargetReport> targets;    // dataflow targets
  nlohmann::json landscape = nlohmann::json::array();  // `tessel landscape --json` rows
  nlohmann::json cpu_bench;                 // bench_json(...) of the CPU ladder, or null
  // One multichip_json (driver/multichip.h) per system target (a hardware file with several chips),
  // its "name" the target as given: the sharded run, a section per system with a row per chip.
  nlohmann::json multichip = nlohmann::json::array();
};

// Every text from the inputs enters the page through html_text (support/escape.h).
std::string render_html_report(const HtmlReportInput& in);

}  // namespace tessel
