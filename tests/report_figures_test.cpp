// One definition per figure (issue 38): every kernel's arithmetic intensity, achieved intensity, fusion
// traffic saved, padding waste and scratchpad peak, and the model's totals, recomputed here from the tile
// IR by the formulas of docs/sim.md ("The report table's columns"), are what the sim table, the JSON, the
// HTML report and the landscape row show. Models: examples/tblock_s and ../shared's mobilenet_v2 (a
// convnet) on spyre and tpu-v5e, and any model folders in TESSEL_FIGURES_MODELS (comma separated;
// tests/python/test_report_figures.py passes a torchvision resnet18 it exports).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tessel/driver/dataflow.h"
#include "tessel/driver/html_report.h"
#include "tessel/driver/report.h"
#include "tessel/hw/hw.h"
#include "tessel/support/strings.h"
#include "test_util.h"

using namespace tessel;

namespace {

struct Figures {
  double intensity = 0, achieved = 0;
  int64_t saved = 0, waste = 0, spad = 0;
};

int64_t round_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// The oracle: the formulas applied to the tile IR, without the report's code.
Figures recompute(const tile::TileProgram& p, const tile::TileKernel& t) {
  Figures f;
  double min_bytes = 0;
  std::map<int, double> view;  // global -> the largest part of it one operand's dims index
  for (const tile::Operand& op : t.operands) {
    if (op.global < 0) continue;
    const tile::Global& g = p.globals[static_cast<size_t>(op.global)];
    double elems = 1;
    for (int d : op.dims) elems *= static_cast<double>(t.dims[static_cast<size_t>(d)].size);
    view[op.global] = std::max(view.count(op.global) ? view[op.global] : 0.0, elems * static_cast<double>(dtype_size(g.dtype)));
  }
  for (int gi : tile::kernel_globals(t)) {
    const tile::Global& g = p.globals[static_cast<size_t>(gi)];
    const double whole = static_cast<double>(g.logical_bytes());
    min_bytes += view.count(gi) ? std::min(whole, view[gi]) : whole;
    f.waste += g.bytes() - g.logical_bytes();
  }
  f.intensity = min_bytes > 0 ? t.flops / min_bytes : 0;
  f.achieved = t.dram_bytes > 0 ? t.flops / static_cast<double>(t.dram_bytes) : 0;
  f.saved = t.bytes_unfused - t.bytes_fused;
  const int64_t align = std::max<int64_t>(1, p.hw_spec().layout.alignment_bytes);
  for (const tile::Operand& op : t.operands) f.spad = round_up(f.spad + op.copies * op.tile_bytes, align);
  return f;
}

// The page's size rule (html_report.cpp): decimal units.
std::string bytes_text(double b) {
  if (b < 1e3) return fmt::format("{:.0f} B", b);
  if (b < 1e6) return fmt::format("{:.1f} KB", b / 1e3);
  if (b < 1e9) return fmt::format("{:.2f} MB", b / 1e6);
  return fmt::format("{:.2f} GB", b / 1e9);
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> w;
  for (std::string s; in >> s;) w.push_back(s);
  return w;
}

// The kernel table's rows of the page: kernel name -> its cells (16 per row). (By hand, not std::regex:
// libstdc++'s recursion overflows the stack on a page of megabytes.)
std::map<std::string, std::vector<std::string>> html_kernel_rows(const std::string& html) {
  std::map<std::string, std::vector<std::string>> rows;
  for (size_t at = html.find("<tr>"); at != std::string::npos; at = html.find("<tr>", at + 4)) {
    const size_t end = html.find("</tr>", at);
    if (end == std::string::npos) break;
    std::vector<std::string> cells;
    for (size_t c = html.find("<td", at); c != std::string::npos && c < end; c = html.find("<td", c + 3)) {
      const size_t open = html.find('>', c), close = html.find("</td>", c);
      if (open == std::string::npos || close == std::string::npos || close > end) break;
      cells.push_back(html.substr(open + 1, close - open - 1));
    }
    if (cells.size() == 16) rows[cells[0]] = cells;
  }
  return rows;
}

// The FLOP/B a roofline point's title gives for kernel `name` of `kind` ("<title>k3 matmul — node: 12.34
// FLOP/B, ..."); "" when no point has it (the timeline's bands have titles with the same label, no FLOP/B).
std::string point_intensity(const std::string& html, const std::string& name, const std::string& kind) {
  const std::string key = "<title>" + name + " " + kind;
  for (size_t at = html.find(key); at != std::string::npos; at = html.find(key, at + 1)) {
    const std::string title = html.substr(at, html.find("</title>", at) - at);
    const size_t unit = title.find(" FLOP/B, ");
    if (unit == std::string::npos) continue;
    const size_t colon = title.rfind(": ", unit);
    return title.substr(colon + 2, unit - colon - 2);
  }
  return "";
}

void check_model(const std::string& model, const std::string& target) {
  SCOPED_TRACE(model + " on " + target);
  DataflowRun run = simulate_dataflow(compile_dataflow(model, {}, hw::resolve_target(target)));
  const tile::TileProgram& p = run.compile.program;
  const DataflowReport& r = run.report;
  const nlohmann::json j = report_json(r);
  const std::string table = report_table(r);
  HtmlReportInput in;
  in.model = model;
  in.targets.push_back(html_target_report(target, run));
  const nlohmann::json land = landscape_row(target, run.compile, r);
  in.landscape.push_back(land);
  const std::string html = render_html_report(in);
  const auto html_rows = html_kernel_rows(html);

  // the table's kernel rows: the line after the header up to "totals:"; the last nine words are the numbers
  std::vector<std::vector<std::string>> table_rows;
  {
    std::istringstream lines(table);
    std::string line;
    std::getline(lines, line), std::getline(lines, line);  // title, header
    while (std::getline(lines, line) && line.rfind("totals:", 0) != 0) {
      std::vector<std::string> w = words(line);
      ASSERT_GE(w.size(), 9u) << line;
      table_rows.emplace_back(w.end() - 9, w.end());
    }
  }
  ASSERT_EQ(table_rows.size(), p.kernels.size());
  ASSERT_EQ(j["kernels"].size(), p.kernels.size());
  ASSERT_EQ(html_rows.size(), p.kernels.size());

  int64_t saved = 0, spad = 0, waste = 0;
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    const tile::TileKernel& t = p.kernels[i];
    SCOPED_TRACE(t.name + " (" + t.node + ")");
    const Figures f = recompute(p, t);
    saved += f.saved, spad = std::max(spad, f.spad);
    // the report's fields
    const KernelReport& k = r.kernels[i];
    EXPECT_DOUBLE_EQ(k.intensity, f.intensity);
    EXPECT_DOUBLE_EQ(k.achieved_intensity, f.achieved);
    EXPECT_EQ(k.fusion_saved, f.saved);
    EXPECT_EQ(k.padding_waste, f.waste);
    EXPECT_EQ(k.spad_peak, f.spad);
    // the JSON
    const nlohmann::json& e = j["kernels"][i];
    EXPECT_DOUBLE_EQ(e["arithmetic_intensity"].get<double>(), f.intensity);
    EXPECT_DOUBLE_EQ(e["achieved_intensity"].get<double>(), f.achieved);
    EXPECT_EQ(e["fusion_traffic_saved_bytes"].get<int64_t>(), f.saved);
    EXPECT_EQ(e["padding_waste_bytes"].get<int64_t>(), f.waste);
    EXPECT_EQ(e["scratchpad_peak_bytes"].get<int64_t>(), f.spad);
    // each slice with its shape: one core's slice is the tile scaled by the steps along the dims indexing it
    ASSERT_EQ(e["slices"].size(), t.operands.size());
    for (size_t o = 0; o < t.operands.size(); ++o) {
      const nlohmann::json& sl = e["slices"][o];
      const tile::Operand& op = t.operands[o];
      ASSERT_EQ(sl["dims"].size(), op.dims.size());
      double bytes = static_cast<double>(op.tile_bytes);
      for (size_t d = 0; d < op.dims.size(); ++d) {
        const tile::Dim& dm = t.dims[static_cast<size_t>(op.dims[d])];
        EXPECT_EQ(sl["dims"][d].get<std::string>(), dm.name);
        EXPECT_EQ(sl["slice_shape"][d].get<int64_t>(), dm.slice);
        EXPECT_EQ(sl["tile_shape"][d].get<int64_t>(), dm.tile);
        bytes *= static_cast<double>(dm.slice) / static_cast<double>(dm.tile);
      }
      EXPECT_EQ(sl["slice_bytes"].get<int64_t>(), static_cast<int64_t>(bytes));
    }
    // the sim table (MFLOP, DRAM KB, FLOP/B, bound, sim, % bnd, saved KB, pad KB, spad KB)
    const std::vector<std::string>& row = table_rows[i];
    EXPECT_EQ(row[2], fmt::format("{:.1f}", f.intensity));
    EXPECT_EQ(row[6], fmt::format("{:.1f}", static_cast<double>(f.saved) / 1e3));
    EXPECT_EQ(row[7], fmt::format("{:.1f}", static_cast<double>(f.waste) / 1e3));
    EXPECT_EQ(row[8], fmt::format("{:.1f}", static_cast<double>(f.spad) / 1e3));
    // the HTML kernel table (FLOP/B, fusion saved, padding waste, scratchpad) and the roofline point
    ASSERT_TRUE(html_rows.count(t.name)) << "no row for " << t.name;
    const std::vector<std::string>& cells = html_rows.at(t.name);
    EXPECT_EQ(cells[7], fmt::format("{:.2f}", f.intensity));
    EXPECT_EQ(cells[12], bytes_text(static_cast<double>(f.saved)));
    EXPECT_EQ(cells[13], f.waste > 0 ? bytes_text(static_cast<double>(f.waste)) : "—");
    EXPECT_EQ(cells[14], bytes_text(static_cast<double>(f.spad)));
    if (t.flops > 0 && f.achieved > 0 && r.kernels[i].sim_us > 0) {
      EXPECT_EQ(point_intensity(html, t.name, std::string(tile::tile_kind_name(t.kind))), fmt::format("{:.2f}", f.achieved))
          << "the roofline point";
    }
  }
  // the model's totals: every DRAM buffer of the program once
  for (const tile::Global& g : p.globals) waste += g.bytes() - g.logical_bytes();
  EXPECT_EQ(r.fusion_saved, saved);
  EXPECT_EQ(r.padding_waste, waste);
  EXPECT_EQ(r.spad_peak, spad);
  EXPECT_EQ(j["fusion_traffic_saved_bytes"].get<int64_t>(), saved);
  EXPECT_EQ(j["padding_waste_bytes"].get<int64_t>(), waste);
  EXPECT_EQ(j["scratchpad_peak_bytes"].get<int64_t>(), spad);
  EXPECT_NE(table.find(fmt::format("fusion saved {:.2f} MB, padding waste {:.2f} MB", saved / 1e6, waste / 1e6)), std::string::npos)
      << table;
  EXPECT_NE(table.find(fmt::format("scratchpad peak {:.1f} KB per core", spad / 1e3)), std::string::npos);
  EXPECT_DOUBLE_EQ(land["padding_mb"].get<double>(), static_cast<double>(waste) / 1e6);
  EXPECT_DOUBLE_EQ(land["scratchpad_peak_kb"].get<double>(), static_cast<double>(spad) / 1e3);
  double bound = 0;
  for (const KernelReport& k : r.kernels) bound += k.bound_us;
  EXPECT_DOUBLE_EQ(land["pct_of_roofline"].get<double>(), 100 * bound / r.sim_us);
  EXPECT_DOUBLE_EQ(j["pct_of_roofline"].get<double>(), 100 * bound / r.sim_us);
  if (waste > 0) {
    EXPECT_NE(html.find("adds " + bytes_text(static_cast<double>(waste))), std::string::npos);
  }
  EXPECT_NE(html.find("kept " + bytes_text(static_cast<double>(saved)) + " of intermediate traffic"), std::string::npos);
}

std::vector<std::string> models() {
  std::vector<std::string> m = {testenv::source_dir() + "/examples/tblock_s"};
  if (testenv::have_shared()) m.push_back(testenv::shared_dir() + "/models/mobilenet_v2");
  if (const char* extra = std::getenv("TESSEL_FIGURES_MODELS"))
    for (const std::string& e : comma_list(extra)) m.push_back(e);
  return m;
}

}  // namespace

TEST(ReportFigures, EveryViewShowsTheFiguresTheTileIrGives) {
  for (const std::string& model : models())
    for (const char* target : {"spyre", "tpu-v5e"}) check_model(model, target);
}

// A partitioned model's whole: sum_reports adds the parts and works the ratios out again.
TEST(ReportFigures, PartsSumToTheWhole) {
  DataflowRun a = simulate_dataflow(compile_dataflow(testenv::source_dir() + "/examples/tblock_s", {}, hw::resolve_target("spyre")));
  DataflowRun b = simulate_dataflow(compile_dataflow(testenv::source_dir() + "/examples/conv_kinds", {}, hw::resolve_target("spyre")));
  const DataflowReport s = sum_reports({&a.report, &b.report});
  EXPECT_DOUBLE_EQ(s.sim_us, a.report.sim_us + b.report.sim_us);
  EXPECT_DOUBLE_EQ(s.flops, a.report.flops + b.report.flops);
  EXPECT_EQ(s.padding_waste, a.report.padding_waste + b.report.padding_waste);
  EXPECT_EQ(s.fusion_saved, a.report.fusion_saved + b.report.fusion_saved);
  EXPECT_EQ(s.spad_peak, std::max(a.report.spad_peak, b.report.spad_peak));
  EXPECT_EQ(s.kernels.size(), a.report.kernels.size() + b.report.kernels.size());
  EXPECT_DOUBLE_EQ(s.pct_of_bound, 100 * (a.report.bound_us + b.report.bound_us) / (a.report.sim_us + b.report.sim_us));
  // utilisation: FLOPs over (time x peak) of the whole (both parts have the same peak)
  const double peak = a.report.flops / (a.report.sim_us * 1e-6 * a.report.utilisation);
  EXPECT_NEAR(s.utilisation, s.flops / (s.sim_us * 1e-6 * peak), 1e-12);
  EXPECT_EQ(sum_reports({}).kernels.size(), 0u);
}
