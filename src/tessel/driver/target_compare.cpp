// One model on two dataflow targets, decision by decision (target_compare.h).
#include "tessel/driver/target_compare.h"

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "tessel/support/error.h"
#include "tessel/support/escape.h"
#include "tessel/support/strings.h"

namespace tessel {
namespace {

const char* topology_text(hw::Topology t) {
  switch (t) {
    case hw::Topology::ring: return "ring";
    case hw::Topology::mesh: return "mesh";
    default: return "none";
  }
}

const char* reduce_text(hw::ReducePath r) {
  switch (r) {
    case hw::ReducePath::ring: return "partial sums over the ring";
    case hw::ReducePath::separate_reduce_ring: return "partial sums over a separate reduce ring";
    default: return "partial sums through DRAM";
  }
}

// The facts of one target that the mapping's decisions depend on, by name (the rows of the facts table).
std::map<std::string, std::string> facts_of(const tile::TileProgram& p) {
  const hw::HwSpec& hw = p.hw_spec();
  const hw::MatrixUnitSpec& m = hw.matrix;
  std::map<std::string, std::string> f;
  f["cores"] = fmt::format("{}", hw.cores);
  f["matrix unit"] = fmt::format("{} x {}x{} arrays, {:g} MAC/cycle/core", m.count, m.rows, m.cols, m.macs_per_cycle);
  f["scratchpad"] = fmt::format("{} usable per core", bytes_text(static_cast<uint64_t>(hw.usable_scratchpad_bytes())));
  f["layout"] = hw.layout.kind == hw::LayoutKind::stick
                    ? fmt::format("sticks of {} B", hw.layout.stick_bytes)
                    : fmt::format("tiles of {}x{} ({}-byte words)", hw.layout.tile_rows, hw.layout.tile_lanes, hw.layout.word_bytes);
  f["storage"] = fmt::format("{}{}", dtype_name(p.float_dtype), p.dl16 ? " (DL16)" : "");
  f["interconnect"] = hw.interconnect.topology == hw::Topology::none
                          ? "none"
                          : fmt::format("{}, {}", topology_text(hw.interconnect.topology), reduce_text(hw.interconnect.reduce_path));
  f["DMA engines"] = fmt::format("{} per core", hw.dma_engines);
  f["DRAM"] = fmt::format("{:g} GB/s read", hw.dram.read_gbps);
  return f;
}

// Which facts can explain a difference in each aspect of a kernel, in the order they are said: the
// matrix unit only for matrix work, the interconnect only where a reduction is split over cores.
std::vector<std::string> explaining(const std::string& aspect, const tile::TileKernel& a, const tile::TileKernel& b) {
  const bool matrix = !a.on_vector_unit && (a.kind == tile::TileKind::matmul || a.kind == tile::TileKind::conv);
  auto reduction_split = [](const tile::TileKernel& t) {
    for (const tile::Dim& d : t.dims)
      if (d.reduction && d.split > 1) return true;
    return false;
  };
  if (aspect == "work division") {
    std::vector<std::string> f{"cores"};
    if (matrix) f.push_back("matrix unit");
    if (reduction_split(a) || reduction_split(b)) f.push_back("interconnect");
    return f;
  }
  if (aspect == "tile sizes") return matrix ? std::vector<std::string>{"scratchpad", "matrix unit", "layout"}
                                            : std::vector<std::string>{"scratchpad", "layout"};
  if (aspect == "scheduling") return {"DMA engines", "scratchpad"};
  return {};
}

std::string split_text(const tile::TileKernel& t) {
  std::string s;
  for (const tile::Dim& d : t.dims)
    if (d.split > 1) s += fmt::format("{}{}{}", s.empty() ? "" : " ", d.name, d.split);
  return s.empty() ? "1 core" : s;
}

std::string tiles_text(const tile::TileKernel& t) {
  std::string s;
  for (const tile::Dim& d : t.dims)
    s += fmt::format("{}{} {}{}", s.empty() ? "" : " ", d.name, d.tile, d.tile < d.slice ? fmt::format("/{}", d.slice) : "");
  return s;
}

std::string schedule_text(const tile::TileKernel& t) {
  std::string order, dbl;
  for (int i : t.order) order += fmt::format("{}{}", order.empty() ? "" : ",", t.dims[static_cast<size_t>(i)].name);
  for (const tile::Operand& o : t.operands)
    if (o.copies > 1) dbl += fmt::format("{}{}", dbl.empty() ? "" : ",", o.role);
  return fmt::format("loops {}; double-buffered: {}", order.empty() ? "-" : order, dbl.empty() ? "none" : dbl);
}

std::string layout_text(const tile::TileProgram& p, const tile::TileKernel& t, bool with_dtype = true) {
  std::string s;
  for (const tile::Operand& o : t.operands) {
    if (o.role == "acc") continue;  // (an accumulator lives in the scratchpad only)
    const tile::Global& g = p.globals[static_cast<size_t>(o.global)];
    std::string padded;
    for (size_t i = 0; i < g.padded.size(); ++i) padded += fmt::format("{}{}", i ? "," : "", g.padded[i]);
    std::string perm;
    if (!g.perm.empty()) {
      for (size_t i = 0; i < g.perm.size(); ++i) perm += fmt::format("{}{}", i ? "" : " perm ", g.perm[i]);
    }
    s += fmt::format("{}{} {}[{}]{}", s.empty() ? "" : "; ", o.role, with_dtype ? dtype_name(g.dtype) : "", padded, perm);
  }
  return s;
}

std::string fusion_text(const tile::TileKernel& t) {
  if (t.sources.empty()) return "-";
  return t.sources.size() == 1 ? fmt::format("1 graph node ({})", t.sources.front())
                               : fmt::format("{} graph nodes ({} .. {})", t.sources.size(), t.sources.front(), t.sources.back());
}

// The main tile kernel of each kernel-level kernel (relayout copies and host steps aside).
std::map<int, const tile::TileKernel*> main_kernels(const tile::TileProgram& p) {
  std::map<int, const tile::TileKernel*> m;
  for (const tile::TileKernel& t : p.kernels)
    if (t.kernel >= 0 && t.kind != tile::TileKind::relayout && t.kind != tile::TileKind::host) m.emplace(t.kernel, &t);
  return m;
}

std::string listed(const tile::TileProgram& p, tile::TileKind kind) {
  std::string names;
  int n = 0;
  for (const tile::TileKernel& t : p.kernels)
    if (t.kind == kind) {
      ++n;
      if (n <= 6) names += fmt::format("{}{}", names.empty() ? "" : ", ", t.name);
    }
  return n == 0 ? "none" : fmt::format("{} ({}{})", n, names, n > 6 ? ", ..." : "");
}

}  // namespace

TargetComparison compare_targets(const DataflowCompile& da, const DataflowCompile& db) {
  const tile::TileProgram &pa = da.program, &pb = db.program;
  TargetComparison c;
  c.model = pa.name;
  c.target_a = pa.target;
  c.target_b = pb.target;
  const auto fa = facts_of(pa), fb = facts_of(pb);
  for (const auto& [name, va] : fa) c.facts.push_back({name, {va, fb.at(name)}});
  auto explain = [&](const std::vector<std::string>& facts) {
    std::string s;
    for (const std::string& f : facts)
      if (fa.at(f) != fb.at(f)) s += fmt::format("{}{}: {} vs {}", s.empty() ? "" : "; ", f, fa.at(f), fb.at(f));
    return s.empty() ? std::string("no hardware fact differs: the cost model's estimates on each chip") : s;
  };
  auto row = [&](const std::string& kernel, const std::string& node, const std::string& aspect, std::string a, std::string b,
                 const std::vector<std::string>& facts) {
    DecisionRow r{kernel, node, aspect, std::move(a), std::move(b), false, ""};
    r.same = r.a == r.b;
    if (!r.same) r.fact = aspect == "fusion" ? "the kernel level differs (the two compilations fused differently)" : explain(facts);
    c.rows.push_back(std::move(r));
  };
  row("program", "", "layout", "relayout copies: " + listed(pa, tile::TileKind::relayout),
      "relayout copies: " + listed(pb, tile::TileKind::relayout), {"layout"});
  row("program", "", "work division", "host steps: " + listed(pa, tile::TileKind::host),
      "host steps: " + listed(pb, tile::TileKind::host), {});
  if (!c.rows.back().same) c.rows.back().fact = "ops one target's tile kernels cannot run (its vector unit and layout)";
  const auto ka = main_kernels(pa), kb = main_kernels(pb);
  std::set<int> ids;
  for (const auto& [i, _] : ka) ids.insert(i);
  for (const auto& [i, _] : kb) ids.insert(i);
  for (int id : ids) {
    const auto ia = ka.find(id), ib = kb.find(id);
    if (ia == ka.end() || ib == kb.end()) {
      const tile::TileKernel* t = ia != ka.end() ? ia->second : ib->second;
      row(fmt::format("k{} {}", id, tile::tile_kind_name(t->kind)), t->node, "work division",
          ia != ka.end() ? "tile kernel " + ia->second->name : "host step",
          ib != kb.end() ? "tile kernel " + ib->second->name : "host step", {});
      c.rows.back().fact = "ops one target's tile kernels cannot run (its vector unit and layout)";
      continue;
    }
    const tile::TileKernel &a = *ia->second, &b = *ib->second;
    const std::string k = fmt::format("k{} {}", id, tile::tile_kind_name(a.kind));
    row(k, a.node, "fusion", fusion_text(a), fusion_text(b), {});
    // layout: the storage dtype where the dtypes differ, the layout rule where the padded shapes do
    std::vector<std::string> layout_facts;
    if (layout_text(pa, a, false) != layout_text(pb, b, false)) layout_facts.push_back("layout");
    if (fa.at("storage") != fb.at("storage")) layout_facts.push_back("storage");
    row(k, a.node, "layout", layout_text(pa, a), layout_text(pb, b), layout_facts);
    row(k, a.node, "work division", split_text(a), split_text(b), explaining("work division", a, b));
    row(k, a.node, "tile sizes", tiles_text(a), tiles_text(b), explaining("tile sizes", a, b));
    row(k, a.node, "scheduling", schedule_text(a), schedule_text(b), explaining("scheduling", a, b));
  }
  return c;
}

std::string comparison_text(const TargetComparison& c) {
  std::string out = fmt::format("{} on {} | {}\n\nhardware facts\n", display_text(c.model), display_text(c.target_a),
                                display_text(c.target_b));
  for (const auto& [name, v] : c.facts)
    out += fmt::format("  {:<14} {}{}{}\n", name, display_text(v.first), v.first == v.second ? "  (same)" : " | ",
                       v.first == v.second ? "" : display_text(v.second));
  std::string last;
  int same = 0, differ = 0;
  for (const DecisionRow& r : c.rows) {
    if (r.kernel != last) {
      out += fmt::format("\n{}{}\n", display_text(r.kernel), r.node.empty() ? "" : "  " + display_text(r.node));
      last = r.kernel;
    }
    (r.same ? same : differ) += 1;
    if (r.same) {
      out += fmt::format("  {:<14} same     {}\n", r.aspect, display_text(r.a));
    } else {
      out += fmt::format("  {:<14} differs  {} | {}\n", r.aspect, display_text(r.a), display_text(r.b));
      out += fmt::format("  {:<14}          because {}\n", "", display_text(r.fact));
    }
  }
  out += fmt::format("\n{} decisions the same, {} different\n", same, differ);
  return out;
}

nlohmann::json comparison_json(const TargetComparison& c) {
  nlohmann::json facts = nlohmann::json::object();
  for (const auto& [name, v] : c.facts) facts[name] = {{"a", v.first}, {"b", v.second}};
  nlohmann::json rows = nlohmann::json::array();
  for (const DecisionRow& r : c.rows)
    rows.push_back({{"kernel", r.kernel}, {"node", r.node}, {"aspect", r.aspect}, {"a", r.a}, {"b", r.b},
                    {"same", r.same}, {"because", r.fact}});
  return {{"model", c.model}, {"targets", {c.target_a, c.target_b}}, {"facts", facts}, {"decisions", rows}};
}

}  // namespace tessel
