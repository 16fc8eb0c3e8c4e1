// Passes over the graph IR and the pass manager that runs a named pipeline of them: timing each,
// verifying after each, and dumping or printing any stage.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tessel/ir/graph.h"

namespace tessel {

struct Pass {
  std::string name;          // as used by --print-after and in dump file names
  std::string summary;       // one line for `tessel passes`
  // Rewrites the graph; returns a one-line note of what it did ("removed 12 nodes").
  std::function<std::string(Graph&)> run;
};

// Every registered pass, in the order the default pipeline runs them.
const std::vector<Pass>& all_passes();
const Pass* find_pass(const std::string& name);

// Named pipelines: "simplify" = fold-constants, algebraic, canonicalize, fold-constants, cse, dce;
// "core" = fold-constants, decompose, then simplify. A comma list of pass names also works.
std::vector<const Pass*> parse_pipeline(const std::string& spec);

struct PassRecord {
  std::string pass;
  std::string note;
  double seconds = 0;
  size_t nodes_after = 0;
};

struct PassOptions {
  bool verify = true;               // run the verifier after every pass (errors name the pass)
  std::string dump_dir;             // write NN-<stage>.tsl for the input and after every pass
  std::string print_after;          // print the graph after this pass to `print`
  std::function<void(const std::string&)> print;
};

// Runs `pipeline` on `g`. Throws tessel::Error (with the pass name) if a pass or the verifier fails.
std::vector<PassRecord> run_pipeline(Graph& g, const std::vector<const Pass*>& pipeline, const PassOptions& opts);

// The passes (one file each in src/tessel/passes/).
std::string decompose(Graph& g);
std::string fold_constants(Graph& g);
std::string eliminate_common_subexpressions(Graph& g);
std::string eliminate_dead_code(Graph& g);
std::string simplify_algebra(Graph& g);
std::string canonicalize(Graph& g);

}  // namespace tessel
