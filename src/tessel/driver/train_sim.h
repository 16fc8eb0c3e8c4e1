// A training step on a dataflow target (`tessel sim MODEL --train --hw H`): the joint graph cut by the
// remat partition, then the forward, the backward and an AdamW step over the parameters, each mapped
// to tiles and simulated in sequence, with the partition's decision and the activation memory it
// saves against the scratchpads and DRAM. docs/training.md, "Simulating a training step".
#pragma once

#include <string>
#include <vector>

#include "tessel/driver/dataflow.h"
#include "tessel/driver/train.h"

namespace tessel {

struct TrainSimReport {
  std::string model, target;
  std::string summary;                  // train_summary of the joint graph and its partition
  TrainGraph train;                     // the summary (partition pointers are not kept: see saved_*)
  std::vector<std::string> saved_names; // the partition's saved tensors
  int64_t saved_bytes = 0;              // their bytes (f32, the joint graph's types)
  std::vector<std::string> recomputed;  // the forward nodes the backward runs again ("name (op)")
  int64_t parameter_bytes = 0, optimizer_state_bytes = 0;
  int64_t scratchpad_total = 0;         // cores x usable scratchpad
  double dram_capacity = 0;
  DataflowReport forward, backward, optimizer;  // one report per phase
  double total_us() const { return forward.sim_us + backward.sim_us + optimizer.sim_us; }
};

// `model` as for `tessel sim`; `opts` for every phase (dtype). Errors are one-line tessel::Errors.
TrainSimReport simulate_training(const std::string& model, const hw::HwSpec& hw, const dataflow::MapOptions& opts = {});

// The text `tessel sim --train` prints: the partition's decision, memory, one line per phase and the
// step's total.
std::string train_sim_text(const TrainSimReport& r);
nlohmann::json train_sim_json(const TrainSimReport& r);

}  // namespace tessel
