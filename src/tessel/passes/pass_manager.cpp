// The pass registry, pipelines, and running them with timing, verification and IR dumps.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "tessel/ir/printer.h"
#include "tessel/ir/verifier.h"
#include "tessel/passes/pass.h"
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

namespace {
void dump(const Graph& g, const std::string& dir, int index, const std::string& stage) {
  fs::create_directories(dir);
  fs::path p = fs::path(dir) / fmt::format("{:02d}-{}.tsl", index, stage);
  std::ofstream f(p);
  f << print_graph(g);
  if (!f) throw Error(Location{.file = p.string()}, "cannot write IR dump");
}
}  // namespace

std::vector<PassRecord> run_pipeline(Graph& g, const std::vector<const Pass*>& pipeline, const PassOptions& opts) {
  std::vector<PassRecord> records;
  if (!opts.dump_dir.empty()) dump(g, opts.dump_dir, 0, "input");
  if (!opts.print_after.empty() && !find_pass(opts.print_after))
    throw Error(Location{.pass = "pipeline"}, fmt::format("--print-after names unknown pass '{}'", opts.print_after));
  int index = 1;
  for (const Pass* p : pipeline) {
    auto t0 = std::chrono::steady_clock::now();
    std::string note;
    try {
      note = p->run(g);
    } catch (const Error& e) {
      throw e.with_context(Location{.pass = p->name});
    }
    if (opts.verify) {
      try {
        verify_graph(g);
      } catch (const Error& e) {
        Location l = e.location();
        l.pass = "verify after " + p->name;
        throw Error(l, e.reason(), e.is_unsupported());
      }
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    records.push_back({p->name, note, s, g.nodes().size()});
    if (!opts.dump_dir.empty()) dump(g, opts.dump_dir, index, p->name);
    if (opts.print_after == p->name && opts.print) opts.print(print_graph(g));
    ++index;
  }
  return records;
}

}  // namespace tessel
