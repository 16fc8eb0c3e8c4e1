// `tessel report`'s page (driver/html_report, driver/report) against the reports it is rendered from:
// every section present, every trace event and kernel accounted for, model names never markup.
// tests/html_report_browser.py loads the page in headless Chromium.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>
#include <string>

#include "tessel/driver/html_report.h"
#include "tessel/driver/report.h"
#include "test_util.h"

using namespace tessel;
using nlohmann::json;

namespace {

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

std::string between(const std::string& s, const std::string& from, const std::string& to) {
  const size_t a = s.find(from);
  if (a == std::string::npos) return "";
  const size_t b = s.find(to, a);
  return s.substr(a, b == std::string::npos ? std::string::npos : b - a);
}

}  // namespace

// The bundled transformer block on two dataflow targets and the CPU ladder.
TEST(HtmlReport, EverySectionRendersWhatTheReportsSay) {
  ReportOptions o;
  o.targets = "spyre,tpu-v5e,cpu";
  o.iters = 2;
  o.threads = 2;
  const std::string model = testenv::source_dir() + "/examples/tblock_s";
  const HtmlReportInput in = gather_report(model, o);
  ASSERT_EQ(in.targets.size(), 2u);
  ASSERT_TRUE(in.cpu_bench.is_object());
  const std::string page = render_html_report(in);

  for (const char* id : {"landscape", "t-spyre", "t-tpu-v5e", "host", "cpu"})
    EXPECT_NE(page.find(std::string("<section id=\"") + id + "\""), std::string::npos) << id;
  for (const char* tag : {"section", "svg", "table", "details", "div", "tr"})
    EXPECT_EQ(count(page, std::string("<") + tag + ">") + count(page, std::string("<") + tag + " "),
              count(page, std::string("</") + tag + ">"))
        << tag;
  // Self-contained and inert: no script, no external resource.
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(page.find("http://"), std::string::npos);
  EXPECT_EQ(page.find("https://"), std::string::npos);
  EXPECT_NE(page.find("Content-Security-Policy"), std::string::npos);

  for (const HtmlTargetReport& t : in.targets) {
    SCOPED_TRACE(t.name);
    const std::string sec = between(page, "<section id=\"t-" + t.name + "\"", "</section>");
    ASSERT_FALSE(sec.empty());
    // Every complete trace event is drawn (merged bars say how many they stand for).
    size_t events = 0;
    for (const auto& e : t.trace["traceEvents"]) events += e.value("ph", "") == "X";
    EXPECT_NE(sec.find(fmt::format("{} trace events drawn as", events)), std::string::npos) << events;
    // One roofline point per kernel that does arithmetic; one table row per kernel.
    size_t arithmetic = 0;
    for (const auto& k : t.report["kernels"]) {
      arithmetic += k["flops"].get<double>() > 0 && k["simulated_us"].get<double>() > 0 && k["dram_bytes"].get<double>() > 0;
      EXPECT_NE(sec.find("<tr><td class=\"l\">" + k["name"].get<std::string>() + "</td>"), std::string::npos) << k["name"];
    }
    EXPECT_GT(arithmetic, 0u);
    const std::string roofline = between(sec, "aria-label=\"roofline\"", "</svg>");
    EXPECT_EQ(count(roofline, "<circle"), arithmetic);
    // The points of the kernels with 5 % or more of the arithmetic kernels' time carry their names.
    double total = 0;
    for (const auto& k : t.report["kernels"])
      if (k["flops"].get<double>() > 0 && k["dram_bytes"].get<double>() > 0) total += k["simulated_us"].get<double>();
    int named = 0;
    for (const auto& k : t.report["kernels"])
      if (k["flops"].get<double>() > 0 && k["dram_bytes"].get<double>() > 0 && k["simulated_us"].get<double>() >= 0.05 * total) {
        EXPECT_NE(roofline.find(">" + k["name"].get<std::string>() + "</text>"), std::string::npos) << k["name"];
        ++named;
      }
    EXPECT_GT(named, 0);
    EXPECT_EQ(count(roofline, "class=\"point\""), named);
    EXPECT_EQ(count(between(sec, "<div class=\"scratchpad\">", "</div>"), "<details>"), t.report["kernels"].size());
  }
  // The landscape: one row per target, the simulated times as the reports give them.
  ASSERT_EQ(in.landscape.size(), 3u);
  for (size_t i = 0; i < 2; ++i)
    EXPECT_DOUBLE_EQ(in.landscape[i]["time_us"].get<double>(), in.targets[i].report["simulated_us"].get<double>());
  // The CPU ladder: each backend's row.
  for (const char* b : {"eager", "graph", "compiled"})
    EXPECT_NE(between(page, "<section id=\"cpu\"", "</section>").find(std::string("<td class=\"l\">") + b + "</td>"),
              std::string::npos)
        << b;
}

// Names from the model (kernels, nodes, tensors, engines, targets) are text, never markup.
TEST(HtmlReport, ModelNamesAreNeverMarkup) {
  const std::string evil = "<script>alert(1)</script>\"><img src=x onerror=alert(2)>'\n#x";
  HtmlReportInput in;
  in.model = evil;
  in.generator = evil;
  HtmlTargetReport t;
  t.name = evil;
  t.peak_matrix_flops = 1e12;
  t.peak_dram_bytes = 1e11;
  t.usable_scratchpad = 1 << 20;
  t.report = {{"simulated_us", 10.0}, {"roofline_us", 5.0}, {"cores", 2}, {"utilisation", 0.1},
              {"stalls_us", {{evil, 1.0}}},
              {"kernels", json::array({{{"name", evil}, {"node", evil}, {"kind", evil}, {"split", evil}, {"decision", evil},
                                        {"flops", 1e6}, {"dram_bytes", 1e4}, {"simulated_us", 10.0}, {"cores", 2},
                                        {"slices", json::array({{{"tensor", evil}, {"slice_bytes", 64}}})}}})}};
  t.trace = {{"traceEvents",
              json::array({{{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"args", {{"name", evil}}}},
                           {{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", 0}, {"args", {{"name", evil}}}},
                           {{"name", evil}, {"cat", evil}, {"ph", "X"}, {"pid", 0}, {"tid", 0}, {"ts", 0.0}, {"dur", 5.0},
                            {"args", {{"kernel", 0}}}}})}};
  in.targets.push_back(t);
  in.landscape = json::array({{{"target", evil}, {"time_us", 10.0}, {"dtype", evil}}});
  in.cpu_bench = {{"iters", 1}, {"backends", json::array({{{"backend", evil}, {"median_ms", 1.0}}})}};
  const std::string page = render_html_report(in);
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(page.find("<img"), std::string::npos);
  EXPECT_EQ(page.find("'\n"), std::string::npos);
  EXPECT_NE(page.find("&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img src=x onerror=alert(2)&gt;&#39;\\n#x"),
            std::string::npos);
}

// Missing or malformed parts of the reports render as "not measured", not as a crash.
TEST(HtmlReport, EmptyReportsRenderPlaceholders) {
  HtmlReportInput in;
  in.model = "m";
  HtmlTargetReport t;
  t.name = "x";
  t.report = json::object();
  t.trace = json::array();
  in.targets.push_back(t);
  const std::string page = render_html_report(in);
  EXPECT_NE(page.find("No trace."), std::string::npos);
  EXPECT_NE(page.find("No kernel does arithmetic"), std::string::npos);
  EXPECT_NE(page.find("No landscape rows."), std::string::npos);
}

// The CPU ladder shows tessel bench's busy-machine warning, escaped, and nothing when there is none.
TEST(HtmlReport, CpuLadderShowsTheBusyMachineWarning) {
  HtmlReportInput in;
  in.model = "m";
  in.cpu_bench = {{"iters", 3}, {"backends", json::array({{{"backend", "eager"}, {"threads", 1}, {"median_ms", 1.0}}})},
                  {"machine", {{"warning", "the machine is busy: <1 other>"}}}};
  const std::string page = render_html_report(in);
  EXPECT_NE(page.find("<p class=\"warn\">Warning: the machine is busy: &lt;1 other&gt;</p>"), std::string::npos);
  in.cpu_bench["machine"]["warning"] = nullptr;
  EXPECT_EQ(render_html_report(in).find("the machine is busy"), std::string::npos);
}

// The landscape as bars (length against the slowest, each labelled with its time and ratio to the
// fastest) and the CPU ladder as cost-of-n-calls lines with each break-even marked where it is.
TEST(HtmlReport, LandscapeBarsAndBreakEvenPlot) {
  HtmlReportInput in;
  in.model = "m";
  in.landscape = json::array({{{"target", "spyre"}, {"time_us", 50.0}, {"cores", 32}, {"dtype", "f16"}},
                              {{"target", "tpu-v5e"}, {"time_us", 25.0}, {"cores", 1}, {"dtype", "bf16"}},
                              {{"target", "cpu"}, {"time_us", 100.0}, {"threads", 2}}});
  // compiled: 10 ms to compile, 1 ms a call against eager's 5 ms: pays off after 2.5 calls
  in.cpu_bench = {{"iters", 3},
                  {"backends", json::array({{{"backend", "eager"}, {"threads", 1}, {"median_ms", 5.0}, {"cold_compile_s", 0.0}},
                                            {{"backend", "compiled"}, {"threads", 2}, {"median_ms", 1.0}, {"cold_compile_s", 0.010},
                                             {"break_even_iters", 2.5}}})}};
  const std::string page = render_html_report(in);
  const std::string bars = between(page, "aria-label=\"landscape\"", "</svg>");
  ASSERT_FALSE(bars.empty());
  EXPECT_EQ(count(bars, "<rect"), 3u);
  EXPECT_NE(bars.find("50.0 µs (2.00×, simulated)"), std::string::npos) << bars;
  EXPECT_NE(bars.find("25.0 µs (1.00×, simulated)"), std::string::npos);
  EXPECT_NE(bars.find("100.0 µs (4.00×, measured)"), std::string::npos);
  // the slowest bar is the full length (plot 360 px from x 110), the others in proportion
  EXPECT_NE(bars.find("width=\"360.0\""), std::string::npos);
  EXPECT_NE(bars.find("width=\"180.0\""), std::string::npos);
  EXPECT_NE(bars.find("width=\"90.0\""), std::string::npos);
  const std::string plot = between(page, "aria-label=\"break-even\"", "</svg>");
  ASSERT_FALSE(plot.empty());
  EXPECT_EQ(count(plot, "<circle"), 1u);
  EXPECT_NE(plot.find("compiled pays off after 2.5 calls"), std::string::npos);
  EXPECT_NE(plot.find(">2.5 calls<"), std::string::npos);
  // one backend measured: nothing to compare, no plot
  in.cpu_bench["backends"].erase(1);
  EXPECT_EQ(render_html_report(in).find("aria-label=\"break-even\""), std::string::npos);
}

// A hardware file with several chips: the report adds the sharded run, a row per chip, its figures
// those of the run's JSON (the same multichip_json the CLI writes).
TEST(HtmlReport, ASystemTargetGetsItsChipsSection) {
  ReportOptions o;
  o.targets = testenv::source_dir() + "/examples/multichip/spyre_ring4.json";
  const std::string model = testenv::shared_dir() + "/models/tblock_bert";
  const HtmlReportInput in = gather_report(model, o);
  ASSERT_EQ(in.multichip.size(), 1u);
  const nlohmann::json& m = in.multichip[0];
  EXPECT_EQ(m["shard"], "tp=4");
  const std::string page = render_html_report(in);
  EXPECT_NE(page.find("-chips\"><h2>"), std::string::npos);
  EXPECT_EQ(count(page, "<tr class=\"chip\">"), 4);
  EXPECT_NE(page.find("column-parallel: &#39;onnx::MatMul_95&#39;"), std::string::npos) << "names escaped, rules shown";
  for (const char* tag : {"section", "table", "div", "tr"})
    EXPECT_EQ(count(page, std::string("<") + tag + ">") + count(page, std::string("<") + tag + " "),
              count(page, std::string("</") + tag + ">"))
        << tag;
  EXPECT_NE(page.find(fmt::format("{:.1f} us simulated", m["sim_us"].get<double>())), std::string::npos);
}
