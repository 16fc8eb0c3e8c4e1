// Renders `tessel report`'s page from the JSON of the simulation, trace, landscape and bench reports.
#include "tessel/driver/html_report.h"

#include "tessel/support/escape.h"
#include "tessel/support/strings.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <tuple>

namespace tessel {
namespace {

using nlohmann::json;

double num(const json& j, const char* key, double fallback = 0) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

std::string str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string esc(const std::string& s) { return html_text(s); }

// "1.23 MB", "512 B": sizes for people (decimal units, as the sim report prints them).
std::string bytes_text(double b) {
  if (b < 1e3) return fmt::format("{:.0f} B", b);
  if (b < 1e6) return fmt::format("{:.1f} KB", b / 1e3);
  if (b < 1e9) return fmt::format("{:.2f} MB", b / 1e6);
  return fmt::format("{:.2f} GB", b / 1e9);
}

std::string flops_text(double f) {
  if (f < 1e6) return fmt::format("{:.0f}", f);
  if (f < 1e9) return fmt::format("{:.1f} M", f / 1e6);
  return fmt::format("{:.2f} G", f / 1e9);
}

std::string us_text(double us) {
  if (us < 1e3) return fmt::format("{:.1f} µs", us);
  return fmt::format("{:.2f} ms", us / 1e3);
}

const char* kCss = R"(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
main{max-width:1320px;margin:0 auto;padding:12px 24px 48px}
h1{font-size:22px;margin:16px 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #d5d9e0;padding-bottom:4px}
h3{font-size:15px;margin:20px 0 6px}
section{background:#fff;border:1px solid #e1e4ea;border-radius:6px;padding:8px 16px 14px;margin:14px 0}
p.lead{margin:6px 0 10px}.muted{color:#687085}
table{border-collapse:collapse;font-size:12.5px;margin:6px 0}
th,td{padding:3px 8px;border-bottom:1px solid #eceef2;text-align:right;white-space:nowrap}
th{background:#f0f2f5;position:sticky;top:0}
td.l,th.l{text-align:left}td.name{max-width:320px;overflow:hidden;text-overflow:ellipsis}
table.kernels{font-size:12px}table.kernels th{white-space:normal;vertical-align:bottom}
table.kernels td,table.kernels th{padding:3px 5px}
table.kernels td.name{white-space:normal;overflow-wrap:anywhere;min-width:80px;max-width:190px}
.scroll{overflow-x:auto;max-width:100%}
.tablewrap{max-height:520px;overflow:auto;border:1px solid #eceef2}
svg{display:block;max-width:100%;height:auto;background:#fff}
svg text{font:10px system-ui,sans-serif;fill:#3a4152}svg text.band{font-size:9px;fill:#1d2330}svg text.point{font-size:9px;fill:#1d2330}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px;border-radius:2px}
details{margin:4px 0}summary{cursor:pointer}
nav a{margin-right:14px}
.bar{display:inline-block;height:9px;background:#4e79a7;vertical-align:middle}
.warn{color:#a0401c}
footer{margin-top:30px;font-size:12px;color:#687085}
)";

struct Category {
  const char* name;
  const char* color;
};
const Category kCategories[] = {{"matmul", "#4e79a7"},   {"vector", "#59a14f"}, {"reduce", "#b07aa1"},
                                {"dma_load", "#f28e2b"}, {"dma_store", "#e15759"}, {"interconnect", "#76b7b2"},
                                {"barrier", "#bab0ac"}};

const char* category_color(const std::string& cat) {
  for (const auto& c : kCategories)
    if (cat == c.name) return c.color;
  return "#9c755f";
}

std::string legend() {
  std::string s = "<div class=\"legend\">";
  for (const auto& c : kCategories) s += fmt::format("<span><i style=\"background:{}\"></i>{}</span>", c.color, c.name);
  return s + "</div>";
}

// The kernels of a report, by index (the trace's args.kernel).
std::vector<const json*> kernels_of(const json& report) {
  std::vector<const json*> out;
  auto it = report.find("kernels");
  if (it != report.end() && it->is_array())
    for (const auto& k : *it) out.push_back(&k);
  return out;
}

std::string kernel_label(const std::vector<const json*>& ks, int64_t i) {
  if (i < 0 || i >= static_cast<int64_t>(ks.size())) return fmt::format("kernel {}", i);
  const json& k = *ks[static_cast<size_t>(i)];
  std::string node = str(k, "node");
  return str(k, "name") + " " + str(k, "kind") + (node.empty() ? "" : " — " + node);
}

// ---- timeline -------------------------------------------------------------------------------------

struct Lane {
  int64_t pid = 0, tid = 0;
  std::string process, engine;
};

struct Rect {
  double t0, t1;
  std::string cat;
  int64_t kernel;
  int count;
};

std::string timeline_svg(const HtmlTargetReport& t) {
  const json& trace = t.trace;
  auto evs = trace.find("traceEvents");
  if (evs == trace.end() || !evs->is_array()) return "<p class=\"muted\">No trace.</p>";
  std::map<int64_t, std::string> process;
  std::map<std::pair<int64_t, int64_t>, std::string> thread;
  std::map<std::pair<int64_t, int64_t>, std::vector<Rect>> lanes;
  std::vector<std::pair<double, double>> dram;  // (ts, GB/s read + write)
  double end = 0;
  for (const auto& e : *evs) {
    if (!e.is_object()) continue;
    const std::string ph = str(e, "ph");
    const int64_t pid = static_cast<int64_t>(num(e, "pid")), tid = static_cast<int64_t>(num(e, "tid"));
    if (ph == "M") {
      auto a = e.find("args");
      if (a == e.end() || !a->is_object()) continue;
      if (str(e, "name") == "process_name") process[pid] = str(*a, "name");
      if (str(e, "name") == "thread_name") thread[{pid, tid}] = str(*a, "name");
    } else if (ph == "X") {
      const double ts = num(e, "ts"), dur = std::max(0.0, num(e, "dur"));
      if (!std::isfinite(ts) || !std::isfinite(dur)) continue;
      int64_t kernel = -1;
      auto a = e.find("args");
      if (a != e.end() && a->is_object()) kernel = static_cast<int64_t>(num(*a, "kernel", -1));
      lanes[{pid, tid}].push_back(Rect{ts, ts + dur, str(e, "cat"), kernel, 1});
      end = std::max(end, ts + dur);
    } else if (ph == "C") {
      auto a = e.find("args");
      if (a != e.end() && a->is_object()) dram.emplace_back(num(e, "ts"), num(*a, "read") + num(*a, "write"));
    }
  }
  if (lanes.empty() || end <= 0) return "<p class=\"muted\">The trace has no events.</p>";
  const std::vector<const json*> ks = kernels_of(t.report);
  // Kernel spans: first start to last end of the events that name each kernel.
  std::map<int64_t, std::pair<double, double>> span;
  for (const auto& [key, rs] : lanes)
    for (const Rect& r : rs) {
      if (r.kernel < 0) continue;
      auto it = span.find(r.kernel);
      if (it == span.end()) span[r.kernel] = {r.t0, r.t1};
      else it->second = {std::min(it->second.first, r.t0), std::max(it->second.second, r.t1)};
    }
  const double label_w = 96, plot_w = 1180, lane_h = 5, top = 34;
  const double scale = plot_w / end;
  // Cores first (by pid), engines in their tid order; the sync lane last.
  std::vector<std::pair<int64_t, int64_t>> order;
  for (const auto& [key, rs] : lanes) order.push_back(key);
  std::stable_sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    const bool sa = process[a.first].rfind("core", 0) == 0, sb = process[b.first].rfind("core", 0) == 0;
    return std::tie(sb, a.first, a.second) < std::tie(sa, b.first, b.second);
  });
  const double lanes_h = lane_h * static_cast<double>(order.size()) + 8;
  const bool has_dram = !dram.empty();
  const double dram_h = has_dram ? 60 : 0;
  const double height = top + lanes_h + dram_h + 34;
  std::string s = fmt::format(
      "<svg role=\"img\" aria-label=\"timeline\" viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\">",
      label_w + plot_w + 10, height);
  // Kernel bands: alternating shades along the top, each kernel's name on hover, and written in the
  // band where it fits (a printout names the large kernels).
  int parity = 0;
  for (const auto& [k, se] : span) {
    const double x0 = label_w + se.first * scale, w = std::max(0.5, (se.second - se.first) * scale);
    s += fmt::format("<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"12\" fill=\"{}\"><title>{} ({})</title></rect>",
                     x0, 14, w, parity++ % 2 ? "#c9d3e3" : "#9fb2cf", esc(kernel_label(ks, k)), us_text(se.second - se.first));
    const std::string name = k >= 0 && k < static_cast<int64_t>(ks.size()) ? str(*ks[static_cast<size_t>(k)], "name") : "";
    if (!name.empty() && w >= 7.0 * static_cast<double>(name.size()) + 4)
      s += fmt::format("<text class=\"band\" x=\"{:.1f}\" y=\"24\">{}</text>", x0 + 2, esc(name));
  }
  s += fmt::format("<text x=\"4\" y=\"24\">kernels</text>");
  double y = top;
  int64_t last_pid = -1;
  double last_label = -1e9;
  int merged_total = 0, rect_total = 0;
  for (const auto& key : order) {
    std::vector<Rect> rs = lanes[key];
    std::sort(rs.begin(), rs.end(), [](const Rect& a, const Rect& b) { return a.t0 < b.t0; });
    // Events closer than half a pixel merge (same category): a big model's thousands of DMAs stay
    // a readable, small picture.
    std::vector<Rect> out;
    for (const Rect& r : rs) {
      if (!out.empty() && out.back().cat == r.cat && (r.t0 - out.back().t1) * scale < 0.5) {
        out.back().t1 = std::max(out.back().t1, r.t1);
        out.back().count += r.count;
        if (out.back().kernel != r.kernel) out.back().kernel = -1;
        continue;
      }
      out.push_back(r);
    }
    if (key.first != last_pid) {
      s += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e3e6ec\"/>", label_w, label_w + plot_w, y, y);
      // Cores with one lane each would stack their labels 5 px apart: every label keeps its line.
      if (y - last_label >= 10) {
        s += fmt::format("<text x=\"4\" y=\"{:.1f}\">{}</text>", y + 7, esc(process[key.first]));
        last_label = y;
      }
      last_pid = key.first;
    }
    for (const Rect& r : out) {
      const double x = label_w + r.t0 * scale, w = std::max(0.4, (r.t1 - r.t0) * scale);
      std::string what = r.count > 1 ? fmt::format("{} × {}", r.count, r.cat) : r.cat;
      if (r.kernel >= 0) what += " — " + kernel_label(ks, r.kernel);
      s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\"><title>{} {} @ {}</title></rect>", x, y,
                       w, lane_h - 1, category_color(r.cat), esc(thread[key]), esc(what), us_text(r.t0));
      ++rect_total;
      merged_total += r.count;
    }
    y += lane_h;
  }
  // Time axis.
  const double axis_y = top + lanes_h;
  s += fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#8a91a3\"/>", label_w, label_w + plot_w, axis_y);
  for (int i = 0; i <= 10; ++i) {
    const double x = label_w + plot_w * i / 10.0;
    s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#8a91a3\"/>"
                     "<text x=\"{0:.1f}\" y=\"{3:.1f}\" text-anchor=\"middle\">{4}</text>",
                     x, axis_y, axis_y + 4, axis_y + 14, us_text(end * i / 10.0));
  }
  if (has_dram) {
    // DRAM traffic (read + write GB/s) as a step line under the lanes.
    double peak = 0;
    for (const auto& d : dram) peak = std::max(peak, d.second);
    const double base = axis_y + 24 + dram_h - 10;
    std::string path = fmt::format("M{:.1f},{:.1f}", label_w, base);
    double last = 0;
    std::sort(dram.begin(), dram.end());
    for (const auto& [ts, gbps] : dram) {
      const double x = label_w + std::min(ts, end) * scale;
      const double yv = base - (peak > 0 ? gbps / peak : 0) * (dram_h - 16);
      path += fmt::format(" L{:.1f},{:.1f} L{:.1f},{:.1f}", x, base - (peak > 0 ? last / peak : 0) * (dram_h - 16), x, yv);
      last = gbps;
    }
    s += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"#e15759\" stroke-width=\"1\"/>", path);
    s += fmt::format("<text x=\"4\" y=\"{:.1f}\">DRAM GB/s</text><text x=\"4\" y=\"{:.1f}\">peak {:.0f}</text>", base - 30, base - 18, peak);
  }
  s += "</svg>";
  return legend() + "<div class=\"scroll\">" + s + "</div>" +
         fmt::format("<p class=\"muted\">{} engine lanes; {} trace events drawn as {} bars (events less than half a pixel "
                     "apart merged). Hover a bar or a kernel band for what it is.</p>",
                     order.size(), merged_total, rect_total);
}

// ---- roofline -------------------------------------------------------------------------------------

std::string roofline_svg(const HtmlTargetReport& t) {
  const std::vector<const json*> ks = kernels_of(t.report);
  struct Point {
    double x, y;
    std::string label, kind, name;
    double us;
  };
  std::vector<Point> pts;
  int no_flops = 0;
  for (size_t i = 0; i < ks.size(); ++i) {
    const json& k = *ks[i];
    const double flops = num(k, "flops"), us = num(k, "simulated_us"), x = num(k, "achieved_intensity");
    if (flops <= 0 || us <= 0 || x <= 0) {
      ++no_flops;
      continue;
    }
    pts.push_back({x, flops / (us * 1e-6), kernel_label(ks, static_cast<int64_t>(i)), str(k, "kind"), str(k, "name"), us});
  }
  if (pts.empty()) return "<p class=\"muted\">No kernel does arithmetic (every one moves data).</p>";
  const double peak = t.peak_matrix_flops, vpeak = t.peak_vector_flops, bw = t.peak_dram_bytes;
  double xmin = 1e30, xmax = 0, ymin = 1e30, ymax = std::max(peak, vpeak);
  for (const Point& p : pts) {
    xmin = std::min(xmin, p.x);
    xmax = std::max(xmax, p.x);
    ymin = std::min(ymin, p.y);
    ymax = std::max(ymax, p.y);
  }
  if (bw > 0 && peak > 0) xmax = std::max(xmax, 4 * peak / bw);  // the ridge in view
  const double lx0 = std::floor(std::log10(xmin / 2)), lx1 = std::ceil(std::log10(xmax * 2));
  const double ly0 = std::floor(std::log10(ymin / 2)), ly1 = std::ceil(std::log10(ymax * 2));
  const double W = 620, H = 360, L = 64, B = 40, T = 10;
  auto X = [&](double v) { return L + (std::log10(v) - lx0) / (lx1 - lx0) * (W - L - 10); };
  auto Y = [&](double v) { return T + (ly1 - std::log10(v)) / (ly1 - ly0) * (H - T - B); };
  std::string s = fmt::format("<svg role=\"img\" aria-label=\"roofline\" viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\">", W, H);
  for (double e = lx0; e <= lx1; ++e)
    s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#eceef2\"/><text x=\"{0:.1f}\" y=\"{3}\" "
                     "text-anchor=\"middle\">1e{4:.0f}</text>",
                     X(std::pow(10, e)), T, H - B, H - B + 14, e);
  for (double e = ly0; e <= ly1; ++e)
    s += fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#eceef2\"/><text x=\"{3}\" y=\"{4:.1f}\" "
                     "text-anchor=\"end\">1e{5:.0f}</text>",
                     L, W - 10, Y(std::pow(10, e)), L - 4, Y(std::pow(10, e)) + 3, e);
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">achieved intensity (FLOP per DRAM byte moved)</text>", (L + W) / 2, H - 8);
  s += fmt::format("<text x=\"12\" y=\"{0}\" transform=\"rotate(-90 12 {0})\" text-anchor=\"middle\">achieved FLOP/s</text>", (T + H - B) / 2);
  const double xa = std::pow(10, lx0), xb = std::pow(10, lx1);
  auto roof = [&](double p, const char* color, const char* name) {
    if (p <= 0) return;
    if (bw > 0) {
      const double ridge = p / bw;
      const double x0 = std::max(xa, std::pow(10, ly0) / bw);
      s += fmt::format("<polyline points=\"{:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"/>",
                       X(x0), Y(bw * x0), X(std::min(std::max(ridge, xa), xb)), Y(std::min(p, bw * std::min(std::max(ridge, xa), xb))), X(xb), Y(p), color);
    } else {
      s += fmt::format("<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\"/>", X(xa), X(xb), Y(p), Y(p), color);
    }
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{} {:.3g} TFLOP/s</text>", X(xb) - 4, Y(p) - 4, name, p / 1e12);
  };
  roof(peak, "#4e79a7", "matrix peak");
  if (vpeak > 0 && vpeak < peak * 0.9) roof(vpeak, "#59a14f", "vector peak");
  for (const Point& p : pts)
    s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"{}\" fill-opacity=\"0.75\" stroke=\"#1d2330\" stroke-width=\"0.4\">"
                     "<title>{}: {:.2f} FLOP/B, {:.3g} GFLOP/s</title></circle>",
                     X(p.x), Y(p.y), p.kind == "matmul" ? "#4e79a7" : p.kind == "conv" ? "#76b7b2" : "#59a14f", esc(p.label), p.x,
                     p.y / 1e9);
  // The kernels with 5 % or more of the time are named beside their points (without hovering).
  double total_us = 0;
  for (const Point& p : pts) total_us += p.us;
  for (const Point& p : pts)
    if (total_us > 0 && p.us >= 0.05 * total_us && !p.name.empty())
      s += fmt::format("<text class=\"point\" x=\"{:.1f}\" y=\"{:.1f}\">{}</text>", X(p.x) + 6, Y(p.y) - 5, esc(p.name));
  s += "</svg>";
  std::string note = fmt::format("<p class=\"muted\">One point per kernel that does arithmetic ({} of {}; {} only move data), at "
                                 "its achieved intensity, its FLOPs over the DRAM bytes it moves (the table's FLOP/B, its arithmetic "
                                 "intensity, is over the minimum bytes: docs/sim.md); "
                                 "those with 5 % of the time or more are named. "
                                 "Lines: the DRAM roof ({:.0f} GB/s) up to each compute peak. A point far below its roof "
                                 "lost time to something the roofline ignores: the table's decision column says what.</p>",
                                 pts.size(), ks.size(), no_flops, bw / 1e9);
  return "<div class=\"scroll\">" + s + "</div>" + note;
}

// ---- tables ---------------------------------------------------------------------------------------

std::string kernel_table(const HtmlTargetReport& t) {
  const std::vector<const json*> ks = kernels_of(t.report);
  double total = 0;
  for (const json* k : ks) total += num(*k, "simulated_us");
  std::string s =
      "<div class=\"tablewrap\"><table class=\"kernels\"><thead><tr><th class=\"l\">kernel</th><th class=\"l\">from</th><th class=\"l\">kind</th>"
      "<th class=\"l\">split</th><th>cores</th><th>FLOPs</th><th>DRAM</th><th>FLOP/B</th><th>roofline</th><th>simulated</th>"
      "<th>share</th><th>% of roof</th><th>fusion saved</th><th>padding waste</th><th>scratchpad</th><th class=\"l\">decision</th>"
      "</tr></thead><tbody>";
  for (const json* kp : ks) {
    const json& k = *kp;
    const double sim = num(k, "simulated_us");
    const double share = total > 0 ? sim / total : 0;
    const double saved = num(k, "fusion_traffic_saved_bytes");
    const double waste = num(k, "padding_waste_bytes");
    s += fmt::format(
        "<tr><td class=\"l\">{}</td><td class=\"l name\" title=\"{}\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td>{:.2f}</td><td>{}</td><td>{}</td><td><span class=\"bar\" style=\"width:{:.0f}px\"></span> "
        "{:.1f}%</td><td>{:.0f}%</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l name\" title=\"{}\">{}</td></tr>",
        esc(str(k, "name")), esc(str(k, "node")), esc(str(k, "node")), esc(str(k, "kind")), esc(str(k, "split")), num(k, "cores"),
        flops_text(num(k, "flops")), bytes_text(num(k, "dram_bytes")), num(k, "arithmetic_intensity"), us_text(num(k, "roofline_us")),
        us_text(sim), 60 * share, 100 * share, num(k, "pct_of_roofline"), bytes_text(saved), waste > 0 ? bytes_text(waste) : "—",
        bytes_text(num(k, "scratchpad_peak_bytes")), esc(str(k, "decision")), esc(str(k, "decision")));
  }
  return s + "</tbody></table></div>";
}

// A slice's or tile's extent along the kernel dims that index it, "m 64 × k 128 — " (empty without dims).
std::string shape_text(const json& slice, const char* key) {
  auto d = slice.find("dims");
  auto e = slice.find(key);
  if (d == slice.end() || e == slice.end() || !d->is_array() || !e->is_array() || d->size() != e->size() || d->empty()) return "";
  std::string s;
  for (size_t i = 0; i < d->size(); ++i) {
    if (!(*d)[i].is_string() || !(*e)[i].is_number()) return "";
    s += fmt::format("{}{} {}", i ? " × " : "", esc((*d)[i].get<std::string>()), (*e)[i].get<int64_t>());
  }
  return s + " — ";
}

std::string scratchpad_section(const HtmlTargetReport& t) {
  const std::vector<const json*> ks = kernels_of(t.report);
  const double usable = static_cast<double>(t.usable_scratchpad);
  double peak = 0;
  for (const json* k : ks) peak = std::max(peak, num(*k, "scratchpad_peak_bytes"));
  const double full = std::max(usable, peak);
  std::string s = fmt::format("<p>Each core's scratchpad holds {} usable; the fullest kernel uses {} ({:.0f}%). Per kernel: "
                              "its peak, and the slices of each tensor one core holds (open a row).</p>",
                              bytes_text(usable), bytes_text(peak), usable > 0 ? 100 * peak / usable : 0);
  for (const json* kp : ks) {
    const json& k = *kp;
    const double p = num(k, "scratchpad_peak_bytes");
    s += fmt::format("<details><summary><code>{}</code> <span class=\"bar\" style=\"width:{:.0f}px\"></span> {} — {}</summary>",
                     esc(str(k, "name")), full > 0 ? 300 * p / full : 0, bytes_text(p), esc(str(k, "node")));
    auto sl = k.find("slices");
    if (sl != k.end() && sl->is_array() && !sl->empty()) {
      s += "<table><tr><th class=\"l\">tensor</th><th>one core's slice</th><th>tile buffer</th><th>copies</th></tr>";
      for (const auto& x : *sl)
        s += fmt::format("<tr><td class=\"l\">{}</td><td>{}{}</td><td>{}{}</td><td>{}</td></tr>", esc(str(x, "tensor")),
                         shape_text(x, "slice_shape"), bytes_text(num(x, "slice_bytes")), shape_text(x, "tile_shape"),
                         bytes_text(num(x, "tile_bytes")), num(x, "copies"));
      s += "</table>";
    } else {
      s += "<p class=\"muted\">No scratchpad slices (a host step or a kernel without tiles).</p>";
    }
    s += "</details>";
  }
  return s;
}

// Where the time goes, in sentences: the share of the biggest kernels and what bounds them, and what
// the engines waited on.
std::string narrative(const HtmlTargetReport& t) {
  const json& r = t.report;
  const std::vector<const json*> ks = kernels_of(r);
  std::vector<const json*> by_time = ks;
  std::sort(by_time.begin(), by_time.end(),
            [](const json* a, const json* b) { return num(*a, "simulated_us") > num(*b, "simulated_us"); });
  double total = 0;
  for (const json* k : ks) total += num(*k, "simulated_us");
  const double sim = num(r, "simulated_us"), roof = num(r, "roofline_us");
  std::string s = fmt::format("<p class=\"lead\">Simulated <b>{}</b> on {} against a roofline bound of {} "
                              "(<b>{:.0f}%</b> of the roof; matrix utilisation {:.1f}%).",
                              us_text(sim), count_text(static_cast<int64_t>(num(r, "cores")), "core"), us_text(roof), sim > 0 ? 100 * roof / sim : 0, 100 * num(r, "utilisation"));
  if (!by_time.empty() && total > 0) {
    s += " The largest kernels: ";
    for (size_t i = 0; i < std::min<size_t>(3, by_time.size()); ++i) {
      const json& k = *by_time[i];
      // The chosen plan only (the decision goes on to list the runners-up).
      std::string decision = str(k, "decision");
      decision = decision.substr(0, decision.find("; "));
      s += fmt::format("{}<code>{}</code> {} ({:.0f}% of kernel time, {:.0f}% of its roof; {})", i ? "; " : "", esc(str(k, "name")),
                       esc(str(k, "node")), 100 * num(k, "simulated_us") / total, num(k, "pct_of_roofline"), esc(decision));
    }
    s += ".";
  }
  auto st = r.find("stalls_us");
  if (st != r.end() && st->is_object()) {
    std::vector<std::pair<double, std::string>> stalls;
    for (const auto& [name, v] : st->items())
      if (v.is_number()) stalls.emplace_back(v.get<double>(), name);
    std::sort(stalls.rbegin(), stalls.rend());
    double sum = 0;
    for (const auto& x : stalls) sum += x.first;
    if (sum > 0) {
      s += " Engines waited (summed over all lanes) on ";
      for (size_t i = 0; i < stalls.size(); ++i)
        s += fmt::format("{}{} {:.0f}%", i ? ", " : "", esc(stalls[i].second), 100 * stalls[i].first / sum);
      s += ".";
    }
  }
  const double pad = num(r, "padding_waste_bytes");
  if (pad > 0)
    s += fmt::format(" Padding to the target's layout adds {} ({:.1f}% of the logical bytes).", bytes_text(pad),
                     100 * pad / std::max(1.0, num(r, "logical_bytes")));
  s += fmt::format(" Fusion kept {} of intermediate traffic out of DRAM.", bytes_text(num(r, "fusion_traffic_saved_bytes")));
  return s + "</p>";
}

std::string host_section(const std::vector<HtmlTargetReport>& targets) {
  std::string rows;
  for (const auto& t : targets)
    for (const json* k : kernels_of(t.report))
      if (str(*k, "kind") == "host" || str(*k, "split") == "host")
        rows += fmt::format("<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td class=\"l\">{}</td></tr>",
                            esc(t.name), esc(str(*k, "name")), esc(str(*k, "node")), us_text(num(*k, "simulated_us")),
                            esc(str(*k, "decision")));
  // A model partitioned at its graph breaks (tessel.compile onto a chip): each break runs on the host
  // between two partitions, in PyTorch, untimed.
  for (const auto& t : targets)
    if (const auto b = t.report.find("breaks"); b != t.report.end() && b->is_array())
      for (const json& k : *b)
        rows += fmt::format("<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>not timed</td>"
                            "<td class=\"l\">{} (after partition {:.0f}; runs in PyTorch)</td></tr>",
                            esc(t.name), esc(str(k, "op")), esc(str(k, "node")), esc(str(k, "reason")), num(k, "after_partition"));
  if (rows.empty())
    return "<p>Every kernel runs on the chip: no host steps (nothing leaves the device between kernels).</p>";
  return "<p>Steps the chip cannot run: the graph breaks there, the data goes to the host and back.</p><table><tr><th "
         "class=\"l\">target</th><th class=\"l\">step</th><th class=\"l\">from</th><th>time</th><th class=\"l\">why</th></tr>" +
         rows + "</table>";
}

// One bar per landscape row: its time, the bar's length against the slowest, labelled with the time and
// its ratio to the fastest (a printout reads it without the table).
std::string landscape_svg(const json& rows, double best) {
  double worst = 0;
  for (const auto& r : rows) worst = std::max(worst, num(r, "time_us"));
  if (worst <= 0) return "";
  const double L = 110, W = 620, bar_h = 18, gap = 8, T = 8;
  const double plot = W - L - 150, H = T + static_cast<double>(rows.size()) * (bar_h + gap) + 6;
  std::string s = fmt::format("<svg role=\"img\" aria-label=\"landscape\" viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\">", W, H);
  double y = T;
  for (const auto& r : rows) {
    const double us = num(r, "time_us"), w = std::max(1.0, plot * us / worst);
    const bool cpu = str(r, "target") == "cpu";
    s += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>", L - 6, y + 12.5, esc(str(r, "target")));
    s += fmt::format("<rect x=\"{:.0f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"><title>{}: {}</title></rect>", L, y, w,
                     bar_h, cpu ? "#f28e2b" : "#4e79a7", esc(str(r, "target")), us_text(us));
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{} ({:.2f}×{})</text>", L + w + 6, y + 12.5, us_text(us), best > 0 ? us / best : 0,
                     cpu ? ", measured" : ", simulated");
    y += bar_h + gap;
  }
  return "<div class=\"scroll\">" + s + "</svg></div>";
}

std::string landscape_section(const json& rows) {
  if (!rows.is_array() || rows.empty()) return "<p class=\"muted\">No landscape rows.</p>";
  double best = 1e300;
  for (const auto& r : rows) best = std::min(best, num(r, "time_us", 1e300));
  std::string s = "<table><tr><th class=\"l\">target</th><th>time</th><th>vs fastest</th><th>utilisation</th><th>DRAM</th>"
                  "<th>padding</th><th>scratchpad peak</th><th>roofline</th><th>compile</th><th class=\"l\">notes</th></tr>";
  for (const auto& r : rows) {
    const std::string t = str(r, "target");
    const bool cpu = t == "cpu";
    std::string notes = cpu ? fmt::format("{}, measured{}", count_text(static_cast<int64_t>(num(r, "threads")), "thread"),
                                          r.value("executable_cache_hit", false) ? " (compile from the executable cache)" : "")
                            : fmt::format("{}, {}, simulated", count_text(static_cast<int64_t>(num(r, "cores")), "core"), esc(str(r, "dtype")));
    s += fmt::format("<tr><td class=\"l\">{}</td><td>{}</td><td>{:.2f}×</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                     "<td>{:.0f} ms</td><td class=\"l\">{}</td></tr>",
                     esc(t), us_text(num(r, "time_us")), best > 0 ? num(r, "time_us") / best : 0,
                     cpu ? "—" : fmt::format("{:.1f}%", 100 * num(r, "utilisation")),
                     r.contains("dram_mb") ? bytes_text(num(r, "dram_mb") * 1e6) : "—",
                     cpu ? "—" : bytes_text(num(r, "padding_mb") * 1e6), cpu ? "—" : bytes_text(num(r, "scratchpad_peak_kb") * 1e3),
                     cpu ? "—" : us_text(num(r, "roofline_us")), num(r, "compile_ms"), notes);
  }
  return landscape_svg(rows, best) + s + "</table>";
}

// The CPU ladder's cost of n calls, compile included (cold compile + n x median; eager compiles
// nothing), for n up to a few times the largest break-even: where a line crosses eager's, compiling
// has paid for itself.
std::string ladder_svg(const json& backends) {
  struct Line {
    std::string name;
    double compile_ms, call_ms, break_even;
  };
  std::vector<Line> lines;
  double be_max = 0;
  for (const auto& x : backends) {
    if (num(x, "median_ms") <= 0) continue;
    const bool eager = str(x, "backend") == "eager";
    auto be = x.find("break_even_iters");
    const double b = be != x.end() && be->is_number() ? be->get<double>() : -1;
    lines.push_back({str(x, "backend"), eager ? 0 : num(x, "cold_compile_s") * 1e3, num(x, "median_ms"), b});
    if (b > 0) be_max = std::max(be_max, b);
  }
  if (lines.size() < 2) return "";
  const double n_max = std::max(10.0, std::ceil(3 * be_max));
  double y_max = 0;
  for (const Line& l : lines) y_max = std::max(y_max, l.compile_ms + n_max * l.call_ms);
  if (y_max <= 0) return "";
  const double W = 620, H = 260, L = 64, R = 110, T = 10, B = 40;
  auto X = [&](double n) { return L + n / n_max * (W - L - R); };
  auto Y = [&](double ms) { return T + (1 - ms / y_max) * (H - T - B); };
  std::string s = fmt::format("<svg role=\"img\" aria-label=\"break-even\" viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\">", W, H);
  for (int i = 0; i <= 5; ++i) {
    const double n = n_max * i / 5, ms = y_max * i / 5;
    s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#eceef2\"/><text x=\"{0:.1f}\" y=\"{3}\" "
                     "text-anchor=\"middle\">{4:.0f}</text>",
                     X(n), T, H - B, H - B + 14, n);
    s += fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#eceef2\"/><text x=\"{3}\" y=\"{4:.1f}\" "
                     "text-anchor=\"end\">{5:.3g}</text>",
                     L, W - R, Y(ms), L - 4, Y(ms) + 3, ms);
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">calls</text>", (L + W - R) / 2, H - 8);
  s += fmt::format("<text x=\"12\" y=\"{0}\" transform=\"rotate(-90 12 {0})\" text-anchor=\"middle\">ms in all, compile included</text>",
                   (T + H - B) / 2);
  const char* colors[] = {"#9c755f", "#59a14f", "#4e79a7", "#e15759", "#76b7b2"};
  for (size_t i = 0; i < lines.size(); ++i) {
    const Line& l = lines[i];
    const char* c = colors[i % 5];
    const double end = l.compile_ms + n_max * l.call_ms;
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-width=\"2\"/>", X(0), Y(l.compile_ms),
                     X(n_max), Y(end), c);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"{}\">{}</text>", X(n_max) + 4, Y(end) + 3 + 10.0 * static_cast<double>(i % 2), c,
                     esc(l.name));
    if (l.break_even > 0 && l.break_even <= n_max) {
      const double at = l.compile_ms + l.break_even * l.call_ms;
      s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"><title>{} pays off after {:.1f} calls</title></circle>",
                       X(l.break_even), Y(at), c, esc(l.name), l.break_even);
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"{}\">{:.1f} calls</text>", X(l.break_even) + 5, Y(at) - 5, c, l.break_even);
    }
  }
  return "<div class=\"scroll\">" + s + "</svg></div>";
}

std::string cpu_section(const json& b) {
  if (!b.is_object()) return "<p class=\"muted\">Not measured (no CPU in --hw).</p>";
  auto bs = b.find("backends");
  if (bs == b.end() || !bs->is_array()) return "<p class=\"muted\">No backends measured.</p>";
  std::string s = fmt::format("<p>Each backend of the ladder measured in one process ({:.0f} timed calls after a warm-up): "
                              "what compiling costs and after how many calls it pays off. The eager row is tessel's "
                              "reference interpreter.</p>",
                              num(b, "iters"));
  // tessel bench's busy-machine warning (support/machine_load.h), where it gave one
  if (auto m = b.find("machine"); m != b.end() && m->is_object())
    if (auto w = m->find("warning"); w != m->end() && w->is_string())
      s += "<p class=\"warn\">Warning: " + esc(w->get<std::string>()) + "</p>";
  s += "<table><tr><th class=\"l\">backend</th><th>threads</th><th>median</th><th>p10</th><th>p90</th><th>× eager</th>"
       "<th>cold compile</th><th>warm start</th><th>break-even calls</th><th>peak intermediates</th></tr>";
  for (const auto& x : *bs) {
    auto be = x.find("break_even_iters");
    auto cached = x.find("cached_compile_s");
    s += fmt::format("<tr><td class=\"l\">{}</td><td>{:.0f}</td><td>{:.3f} ms</td><td>{:.3f}</td><td>{:.3f}</td><td>{:.2f}</td>"
                     "<td>{:.3f} s</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                     esc(str(x, "backend")), num(x, "threads"), num(x, "median_ms"), num(x, "p10_ms"), num(x, "p90_ms"),
                     num(x, "speedup_vs_eager"), num(x, "cold_compile_s"),
                     cached != x.end() && cached->is_number() ? fmt::format("{:.1f} ms", cached->get<double>() * 1e3) : "—",
                     be != x.end() && be->is_number() ? fmt::format("{:.1f}", be->get<double>()) : "—", bytes_text(num(x, "peak_mem_bytes")));
  }
  s += "</table>" + ladder_svg(*bs);
  auto fl = b.find("matmul_floor");
  if (fl != b.end() && fl->is_object())
    s += fmt::format("<p class=\"muted\">The model's {:.0f} matmuls alone through oneDNN take {:.3f} ms ({:.1f} GFLOP/s): what the "
                     "compiled backend cannot beat without faster matmuls.</p>",
                     num(*fl, "matmuls"), num(*fl, "median_ms"), num(*fl, "gflops"));
  return s;
}

std::string anchor(const std::string& target) {
  std::string a = "t-";
  for (char c : target) a += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
  return a;
}

}  // namespace

// A system of several chips (docs/multichip.md): the sharding, the collectives beside the ring formula,
// and where each chip's time went as a bar (compute, communication alone, idle).
std::string multichip_section(const json& m) {
  std::string s = fmt::format(
      "<p>{} on {:.0f} chips: {:.1f} us simulated against {:.1f} us on one chip ({:.2f}x). Every rank's outputs against "
      "eager on the whole graph: max relative error {}.</p>",
      esc(str(m, "shard")), num(m, "chips"), num(m, "sim_us"), num(m, "one_chip_us"), num(m, "speedup"),
      m.contains("functional_max_rel") ? fmt::format("{:.2g}", num(m, "functional_max_rel")) : std::string("not checked"));
  if (const auto a = m.find("alternatives"); a != m.end() && a->is_array()) {
    s += "<p class=\"muted\">--shard auto tried:";
    for (const json& x : *a) s += " " + esc(x.is_string() ? x.get<std::string>() : std::string()) + ";";
    s += "</p>";
  }
  const json sh = m.contains("sharding") ? m["sharding"] : json::object();
  s += fmt::format("<h3>Sharding</h3><p>{:.0f} all-reduces, {:.0f} all-gathers; weights {:.2f} MB whole, {:.2f} MB per chip.</p>",
                   num(sh, "all_reduces"), num(sh, "all_gathers"), num(sh, "weight_bytes") / 1e6, num(sh, "weight_bytes_per_chip") / 1e6);
  if (const auto d = sh.find("decisions"); d != sh.end() && d->is_array() && !d->empty()) {
    s += "<table><tr><th class=\"l\">node</th><th class=\"l\">op</th><th class=\"l\">rule</th></tr>";
    for (const json& x : *d)
      s += fmt::format("<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>", esc(str(x, "node")),
                       esc(str(x, "op")), esc(str(x, "rule")));
    s += "</table>";
  }
  if (const auto c = m.find("collectives"); c != m.end() && c->is_array() && !c->empty()) {
    s += "<h3>Collectives on the links</h3><table><tr><th class=\"l\">collective</th><th class=\"l\">kind</th><th>bytes</th>"
         "<th>simulated</th><th>ring formula</th><th>sim / ring</th></tr>";
    for (const json& x : *c) {
      const double f = num(x, "ring_formula_us");
      s += fmt::format("<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{:.0f}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                       esc(str(x, "name")), esc(str(x, "kind")), num(x, "bytes"), us_text(num(x, "sim_us")), us_text(f),
                       f > 0 ? fmt::format("{:.3f}", num(x, "sim_us") / f) : std::string("-"));
    }
    s += "</table>";
  }
  if (const auto c = m.find("chips_time"); c != m.end() && c->is_array()) {
    const double total = std::max(num(m, "sim_us"), 1e-9);
    s += "<h3>Per chip</h3><table><tr><th class=\"l\">chip</th><th>compute</th><th>communication</th><th>overlap</th>"
         "<th>idle</th><th class=\"l\">the run (compute, communication alone, idle)</th></tr>";
    int i = 0;
    for (const json& x : *c) {
      const double cu = num(x, "compute_us"), co = num(x, "comm_us"), ov = num(x, "overlap_us"), id = num(x, "idle_us");
      auto w = [&](double us) { return fmt::format("{:.2f}", std::clamp(100 * us / total, 0.0, 100.0)); };
      s += fmt::format(
          "<tr class=\"chip\"><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\"><div "
          "style=\"display:flex;width:24em\"><div style=\"width:{}%;background:#4a78c2;height:0.9em\"></div><div "
          "style=\"width:{}%;background:#e0a030;height:0.9em\"></div><div style=\"width:{}%;background:#ddd;height:0.9em\"></div>"
          "</div></td></tr>",
          i++, us_text(cu), us_text(co), us_text(ov), us_text(id), w(cu), w(std::max(0.0, co - ov)), w(id));
    }
    s += "</table>";
  }
  return s;
}

std::string render_html_report(const HtmlReportInput& in) {
  std::string s = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">";
  s += fmt::format("<title>tessel report: {}</title><meta name=\"viewport\" content=\"width=device-width\">", esc(in.model));
  // No script, no network: the page is the same offline, and a model's names cannot run as code.
  s += "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">";
  s += "<style>" + std::string(kCss) + "</style></head><body><main>";
  s += fmt::format("<h1>{}</h1><p class=\"muted\">tessel report", esc(in.model));
  std::vector<std::string> names;
  for (const auto& t : in.targets) names.push_back(t.name);
  if (in.cpu_bench.is_object()) names.push_back("cpu");
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : ": ") + esc(names[i]);
  s += "</p><nav><a href=\"#landscape\">landscape</a>";
  for (const auto& t : in.targets) s += fmt::format("<a href=\"#{}\">{}</a>", anchor(t.name), esc(t.name));
  for (const auto& m : in.multichip) s += fmt::format("<a href=\"#{}-chips\">{} (chips)</a>", anchor(str(m, "name")), esc(str(m, "name")));
  s += "<a href=\"#host\">host steps</a>";
  if (in.cpu_bench.is_object()) s += "<a href=\"#cpu\">cpu ladder</a>";
  s += "</nav>";

  s += "<section id=\"landscape\"><h2>Across targets</h2>" + landscape_section(in.landscape) + "</section>";
  for (const auto& t : in.targets) {
    s += fmt::format("<section id=\"{}\" class=\"target\"><h2>{}</h2>", anchor(t.name), esc(t.name));
    s += narrative(t);
    s += "<h3>Timeline</h3><div class=\"timeline\">" + timeline_svg(t) + "</div>";
    s += "<h3>Roofline</h3><div class=\"roofline\">" + roofline_svg(t) + "</div>";
    s += "<h3>Kernels</h3><div class=\"kernels\">" + kernel_table(t) + "</div>";
    s += "<h3>Scratchpad</h3><div class=\"scratchpad\">" + scratchpad_section(t) + "</div>";
    s += "</section>";
  }
  for (const auto& m : in.multichip)
    s += fmt::format("<section id=\"{}-chips\"><h2>{}: several chips</h2>", anchor(str(m, "name")), esc(str(m, "name"))) +
         multichip_section(m) + "</section>";
  s += "<section id=\"host\"><h2>Host steps (graph breaks on the chip)</h2>" + host_section(in.targets) + "</section>";
  if (in.cpu_bench.is_object()) s += "<section id=\"cpu\"><h2>Host CPU: eager, graph, compiled</h2>" + cpu_section(in.cpu_bench) + "</section>";
  s += "<footer>" + esc(in.generator) +
       ". Simulated times come from tessel's timed simulator and the target's hardware file (docs/sim.md); CPU times are "
       "measured on this machine.</footer></main></body></html>\n";
  return s;
}

}  // namespace tessel
