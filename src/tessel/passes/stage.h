// The pass manager across IR levels: a stage reads one level (graph, kernel, tile) and produces one,
// and the StageRunner runs any sequence of them the same way — timing each, running the produced
// level's verifier after it, dumping NN-<stage>.<ext> and printing the one --print-after names. It
// sees no IR type: a stage brings closures over the pipeline's IR (run, verify, print), so the
// concrete cross-level pipeline is assembled where every level is visible (lower/lowering.h).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tessel/passes/pass.h"

namespace tessel {

enum class IrLevel { graph, kernel, tile, source };  // source: a target's generated code (cpu-codegen)
const char* level_name(IrLevel l);       // "graph", "kernel", "tile", "source"
const char* level_extension(IrLevel l);  // dump file extension: "tsl", "kernel", "tile", "cpp"

// What `tessel passes` lists: a stage's name (as --print-after and dump files use it), its one-line
// summary and its level arrow.
struct StageInfo {
  std::string name;
  std::string summary;
  IrLevel from = IrLevel::graph, to = IrLevel::graph;
};

// One stage bound to the IR it runs on.
struct Stage {
  StageInfo info;
  std::function<std::string()> run;     // does the work; a one-line note ("folded 3 nodes")
  std::function<void()> verify;         // the `to` level's verifier
  std::function<std::string()> print;   // the `to` level's text form
  std::function<size_t()> size;         // nodes (graph) or kernels (kernel, tile) after it
};

// A graph pass as a stage on `g`: verify_graph, print_graph.
Stage graph_stage(Graph& g, const Pass& p);

class StageRunner {
 public:
  // opts.print_after is not checked here (the assembler knows every stage name); opts.verify off
  // skips the verifiers.
  explicit StageRunner(PassOptions opts) : opts_(std::move(opts)) {}
  // The pipeline's input, dumped as 00-input.<ext>; called once, before the first run (later calls
  // do nothing, so a pipeline assembled in parts may call it at the start of each part).
  void begin(IrLevel level, const std::function<std::string()>& print);
  // Runs `s`: an Error from it gets the stage's name as its pass, one from the verifier
  // "verify after <stage>"; then dumps NN-<stage>.<ext> and prints it when it is opts.print_after.
  void run(const Stage& s);
  const std::vector<PassRecord>& records() const { return records_; }
  // Whether the stage --print-after names has run (and printed).
  bool printed() const { return printed_; }

 private:
  void dump(const std::string& text, const std::string& stage, IrLevel level);
  PassOptions opts_;
  int index_ = 0;  // the next dump's number; 0 until the input is dumped
  bool printed_ = false;
  std::vector<PassRecord> records_;
};

}  // namespace tessel
