// Bucketed runs on a dataflow target (docs/dynamic-shapes.md, "Buckets"): a model whose inputs have
// size symbols is compiled for the target once per bucket (the symbol padded to the bucket, masks
// where padding would change a result: passes/bucket.h); each data set runs on the smallest bucket
// that holds its length, functionally against the eager interpreter on the unpadded inputs, and
// timed, with the padding waste of each run.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tessel/driver/dataflow.h"

namespace tessel {

struct BucketOptions {
  std::string symbol;              // the symbol padded; empty: the model's only symbol, else an error
  std::vector<int64_t> buckets;    // sizes it is padded to
  dataflow::MapOptions map;
  int threads = 1;                 // the functional run's library threads (and the CPU's, with cpu)
  bool functional = true;
  // The trade-off on the host CPU: each data set also run by one symbolic CPU compilation at its own
  // size, and by a static CPU compilation of its bucket's padded graph (best of cpu_repeat calls each).
  bool cpu = false;
  int cpu_repeat = 20;
};

struct BucketRow {
  std::string data_set;            // the folder (or "length N" for drawn inputs)
  std::string binding;             // "batch = 1, seq = 50"
  int64_t length = 0, bucket = 0;
  double pad_fraction = 0;         // (bucket - length) / bucket: positions computed for nothing
  double flops = 0, flops_padded = 0;  // the model's FLOPs at the length and at the bucket (op costs)
  double sim_us = 0;               // the bucket's simulated time
  double rel_err = -1, tolerance = 0;  // functional run vs eager (-1: not run)
  bool ok = true;
  int masks = 0;                   // operands read through a mask in the bucket's graph
  double cpu_symbolic_ms = -1, cpu_bucket_ms = -1;  // BucketOptions::cpu (-1: not run)
};

struct BucketReport {
  std::string model, target, symbol;
  std::vector<int64_t> buckets;
  int compilations = 0;            // one per bucket (and binding of the other symbols) used
  double cpu_symbolic_compile_s = 0;  // BucketOptions::cpu: the one symbolic CPU compilation
  std::vector<BucketRow> rows;
};

// `inputs`: one tensor list per data set (`names`: how each is shown). Throws tessel::Error naming the
// model, the node that cannot be padded or the data set no bucket holds.
BucketReport run_buckets(const std::string& model, const hw::HwSpec& hw, const std::vector<std::vector<Tensor>>& inputs,
                         const std::vector<std::string>& names, const BucketOptions& opts);

std::string bucket_table(const BucketReport& r);
nlohmann::json bucket_json(const BucketReport& r);

}  // namespace tessel
