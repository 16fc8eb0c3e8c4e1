// The pass registry, pipelines, and running them with timing, verification and IR dumps (the
// StageRunner of stage.h, for any level; run_pipeline is the graph-only use of it).
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "tessel/ir/printer.h"
#include "tessel/ir/verifier.h"
#include "tessel/passes/pass.h"
#include "tessel/passes/stage.h"
#include "tessel/support/error.h"

namespace tessel {
namespace fs = std::filesystem;

const std::vector<Pass>& all_passes() {
  static const std::vector<Pass> passes = {
      {"decompose", "replace graph-level ops by core primitives (ops without a decomposition stay, listed)",
       decompose},
      {"fold-constants", "evaluate nodes whose inputs are all known (shape arithmetic included) into constants",
       fold_constants},
      {"algebraic", "rewrite core ops by identities that never change a result (x*1, x+0, transpose∘transpose, ...)",
       simplify_algebra},
      {"canonicalize", "put core ops in the canonical forms later passes match (splats, operand order, unit dims)",
       canonicalize},
      {"cse", "merge nodes that compute the same op on the same inputs, and identical constants",
       eliminate_common_subexpressions},
      {"dce", "remove nodes and constants nothing uses", eliminate_dead_code},
  };
  return passes;
}

const Pass* find_pass(const std::string& name) {
  for (const auto& p : all_passes())
    if (p.name == name) return &p;
  return nullptr;
}

std::vector<const Pass*> parse_pipeline(const std::string& spec) {
  std::vector<const Pass*> out;
  if (spec.empty()) return out;
  const std::vector<const Pass*> simplify = {find_pass("fold-constants"), find_pass("algebraic"),
                                             find_pass("canonicalize"), find_pass("fold-constants"),
                                             find_pass("cse"), find_pass("dce")};
  if (spec == "simplify") return simplify;
  if (spec == "core") {
    // Folding first: operands a decomposition needs as constants (Pad's pads, Slice's starts) are
    // often shape arithmetic that only folding turns into constants.
    std::vector<const Pass*> core = {find_pass("fold-constants"), find_pass("decompose")};
    core.insert(core.end(), simplify.begin(), simplify.end());
    return core;
  }
  size_t b = 0;
  while (b <= spec.size()) {
    size_t e = spec.find(',', b);
    if (e == std::string::npos) e = spec.size();
    std::string name = spec.substr(b, e - b);
    const Pass* p = find_pass(name);
    if (!p) {
      std::string known;
      for (const auto& q : all_passes()) known += (known.empty() ? "" : ", ") + q.name;
      throw Error(Location{.pass = "pipeline"}, fmt::format("unknown pass '{}' (known: simplify, core, {})", name, known));
    }
    out.push_back(p);
    b = e + 1;
  }
  return out;
}

const char* level_name(IrLevel l) {
  switch (l) {
    case IrLevel::graph: return "graph";
    case IrLevel::kernel: return "kernel";
    case IrLevel::tile: return "tile";
    case IrLevel::source: return "source";
  }
  return "?";
}

const char* level_extension(IrLevel l) {
  return l == IrLevel::graph ? "tsl" : l == IrLevel::source ? "cpp" : level_name(l);
}

Stage graph_stage(Graph& g, const Pass& p) {
  Stage s;
  s.info = {p.name, p.summary, IrLevel::graph, IrLevel::graph};
  s.run = [&g, &p] {
    const ScopedSymbolFacts facts(&g.symbols);  // a pass's size decisions within the graph's ranges
    return p.run(g);
  };
  s.verify = [&g] { verify_graph(g); };
  s.print = [&g] { return print_graph(g); };
  s.size = [&g] { return g.nodes().size(); };
  return s;
}

void StageRunner::dump(const std::string& text, const std::string& stage, IrLevel level) {
  std::error_code ec;
  fs::create_directories(opts_.dump_dir, ec);
  if (ec) throw Error(Location{.file = opts_.dump_dir}, "cannot make the IR dump folder: " + ec.message());
  fs::path p = fs::path(opts_.dump_dir) / fmt::format("{:02d}-{}.{}", index_, stage, level_extension(level));
  std::ofstream f(p);
  f << text;
  f.close();  // (a full disk shows at the last flush)
  if (!f) throw Error(Location{.file = p.string()}, "cannot write IR dump");
}

void StageRunner::begin(IrLevel level, const std::function<std::string()>& print) {
  if (index_ > 0) return;
  if (!opts_.dump_dir.empty()) dump(print(), "input", level);
  index_ = 1;
}

void StageRunner::run(const Stage& s) {
  if (index_ == 0) throw Error(Location{.pass = s.info.name}, "StageRunner::begin was not called before the first stage");
  auto t0 = std::chrono::steady_clock::now();
  std::string note;
  try {
    note = s.run();
  } catch (const Error& e) {
    throw e.with_context(Location{.pass = s.info.name});
  }
  if (opts_.verify && s.verify) {
    try {
      s.verify();
    } catch (const Error& e) {
      Location l = e.location();
      l.pass = "verify after " + s.info.name;
      throw Error(l, e.reason(), e.is_unsupported());
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  records_.push_back({s.info.name, note, secs, s.size ? s.size() : 0});
  if (!opts_.dump_dir.empty()) dump(s.print(), s.info.name, s.info.to);
  if (opts_.print_after == s.info.name && opts_.print) {
    opts_.print(s.print());
    printed_ = true;
  }
  ++index_;
}

std::vector<PassRecord> run_pipeline(Graph& g, const std::vector<const Pass*>& pipeline, const PassOptions& opts) {
  if (!opts.print_after.empty() && !find_pass(opts.print_after))
    throw Error(Location{.pass = "pipeline"}, fmt::format("--print-after names unknown pass '{}'", opts.print_after));
  StageRunner runner(opts);
  runner.begin(IrLevel::graph, [&g] { return print_graph(g); });
  for (const Pass* p : pipeline) runner.run(graph_stage(g, *p));
  return runner.records();
}

}  // namespace tessel
