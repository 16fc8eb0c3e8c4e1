// A model on several dataflow chips (issue 40, docs/multichip.md): the graph sharded over the chips
// (passes/shard.h, tensor parallel), each rank's program cut into compute stages at its collectives,
// every stage compiled and timed on one chip by the single-chip pipeline, and the stages and collectives
// timed together on the system's links (targets/dataflow/multichip.h). The sharding is checked by
// running every rank's graph in lockstep (runtime/spmd.h) against the eager interpreter on the whole
// graph.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tessel/hw/hw.h"
#include "tessel/passes/shard.h"
#include "tessel/targets/dataflow/multichip.h"

namespace tessel {

// What `--shard` asks for: tp=N, dp=N, or auto (each kind at the system's chip count, the faster kept).
struct ShardSpec {
  ShardKind kind = ShardKind::tensor;
  int ranks = 0;
  bool automatic = false;
};

struct MultiChipOptions {
  ShardSpec shard;                     // ranks must equal the system's chips
  std::optional<DType> float_dtype;    // device storage (as `sim --dtype`)
  bool functional = true;              // run the ranks' graphs against eager
  // The whole model's time on one chip when the caller has simulated it already (tessel report); else
  // run_multichip compiles and simulates it.
  std::optional<double> one_chip_seconds;
};

struct MultiChipStage {
  std::string name;       // "stage 2"
  int nodes = 0;          // graph nodes of rank 0's program in it
  int kernels = 0;        // kernels after fusion on one chip
  double seconds = 0;     // its simulated time on one chip
};

struct MultiChipRun {
  std::string model, target;
  int chips = 1;
  ShardedProgram sharded;
  // With --shard auto: every kind tried, "tp=4: 103.20 us" or "dp=4: not possible (...)", the kept one first.
  std::vector<std::string> alternatives;
  std::vector<MultiChipStage> stages;
  std::vector<dataflow::SystemOp> ops;   // the system program: stages and collectives, deps by data
  dataflow::SystemSimResult system;
  double one_chip_seconds = 0;           // the whole model on one chip, the same pipeline
  // functional: max over the outputs and the ranks of max|out - ref| / max|ref| against eager (-1: not run)
  double max_rel = -1;
};

// "tp=4", "dp=2", "auto"; anything else is an Error naming the option.
ShardSpec parse_shard(const std::string& spec);

MultiChipRun run_multichip(const std::string& model, const std::vector<Tensor>& inputs, const hw::HwSpec& hw,
                           const MultiChipOptions& options);
std::string multichip_text(const MultiChipRun& r);
nlohmann::json multichip_json(const MultiChipRun& r);

}  // namespace tessel
