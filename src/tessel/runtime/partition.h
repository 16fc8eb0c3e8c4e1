// Graph breaks: the partitioner splits a graph-level Graph into compiled partitions and break nodes
// (ops with no core form, ops whose output shapes depend on the data, and ops the PyTorch frontend
// could not lower, marked TorchFallback), reports each break with its op, reason, location and a
// repair suggestion, and runs the result: partitions compiled by a tessel backend, break nodes by a
// caller-supplied runner (PyTorch eager from Python) or tessel's reference kernels.
// docs/graph-breaks.md.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/ir/graph.h"

namespace tessel {

class CompiledExecutable;
class GraphExecutable;
struct OpDef;

// The op of nodes the PyTorch frontend has no lowering for ("TorchFallback", domain "tessel.torch").
// Attributes: `target` (the aten op), `reason`, and the output types recorded at capture time:
// `out_dtypes` (dtype names) and `out_shapes` (dims of every output concatenated, -1 for a dim only
// known at run time) with `out_ranks`. Its reference kernel throws: only the caller can run it.
// It is not in the op registry (it never appears in a model file; `tessel ops` does not list it).
const OpDef* torch_fallback_op();

enum class BreakKind { data_dependent, no_core_form, torch_fallback };
std::string_view break_kind_name(BreakKind k);

struct GraphBreak {
  const Node* node = nullptr;   // in the partitioned graph
  BreakKind kind = BreakKind::no_core_form;
  std::string op;               // tessel op, or the aten op for TorchFallback
  std::string reason;
  std::string location;         // the node's name: ONNX node name or torch module path + source line
  std::string repair;           // a suggested rewrite (empty when no known pattern applies)
  int after_partition = -1;     // runs after this partition (-1: before the first)
};

struct Partition {
  std::unique_ptr<Graph> graph;              // a self-contained graph (inputs, constants, nodes, outputs)
  std::vector<const Value*> inputs;          // values of the source graph bound to graph->inputs, in order
  std::vector<const Value*> outputs;         // values of the source graph given by graph->outputs, in order
  std::vector<const Node*> nodes;            // the source nodes it holds
};

struct PartitionStep {
  bool is_break = false;
  int index = 0;                             // into partitions or breaks
};

struct PartitionPlan {
  std::vector<Partition> partitions;
  std::vector<GraphBreak> breaks;
  std::vector<PartitionStep> steps;          // execution order
  std::map<const Value*, Tensor> folded;     // values inference knows statically (bound as constants)
};

// Whether `n` is a graph break and why (nullopt: it can be compiled). The graph must be inferred.
std::optional<std::pair<BreakKind, std::string>> break_reason(const Node& n);
// A repair suggestion for the break at `n` from the table of known patterns, or "".
std::string suggest_repair(const Graph& g, const Node& n);

// Partitions `g` (inferred by the call). A compiled node goes in partition k where k is the number of
// breaks on its longest path from the inputs; a break runs after the partition of its inputs, so
// independent work shares a partition. The plan points into `g`, which must outlive it.
PartitionPlan partition_graph(Graph& g);

// ---- repairs -----------------------------------------------------------------------------------

struct RepairRecord {
  std::string pattern;   // "nonzero-gather-reduce", "compress-reduce"
  std::string node;      // the break node it removed
  std::string detail;    // what it became
};
// Rewrites known break patterns into fixed-shape forms with the same result (docs/graph-breaks.md):
//   NonZero(m) -> index chain -> Gather(x, idx, axis 0) -> row-wise ops -> ReduceSum over axis 0
//     => the row-wise ops on all of x -> Where(m, ., 0) -> ReduceSum
//   Compress(x, c[, axis]) -> ReduceSum over the compressed axis
//     => Where(c, x, 0) -> ReduceSum
// The graph is re-inferred and dead nodes removed. Returns what was rewritten.
std::vector<RepairRecord> repair_breaks(Graph& g);

// ---- running -----------------------------------------------------------------------------------

// Runs one break node on its inputs (one per node input; absent inputs are invalid tensors). An empty
// result means "not handled": the reference kernel runs it instead.
using BreakRunner = std::function<std::vector<Tensor>(const Node&, const std::vector<Tensor>&)>;

// Runs a partition plan over `g` (the graph the plan was made from): partition k by
// run_partition(k, its inputs) -> its outputs, each break by `runner` (or, when it gives nothing,
// tessel's reference kernels), the breaks' results checked against the types the graph expects.
using PartitionRunner = std::function<std::vector<Tensor>(size_t, const std::vector<Tensor>&)>;
std::vector<Tensor> run_partition_plan(const Graph& g, const PartitionPlan& plan, const std::vector<Tensor>& inputs,
                                       const PartitionRunner& run_partition, const BreakRunner& runner);

struct PartitionedOptions {
  std::string backend = "compiled";          // eager | graph | compiled
  int threads = 0;                           // compiled backend; 0: the machine's hardware threads
  // Per graph output (empty: none), a graph input whose memory the output may be written into (the
  // compiled backend's optional_aliases: a mutated input's new value, as tessel.compile's functionalized
  // graphs return it). Taken only where the whole graph is one compiled partition; otherwise, and where
  // the backend cannot take one, the output comes back as a tensor of its own.
  std::vector<int> output_aliases;
};

class PartitionedExecutable {
 public:
  // Partitions `g` and compiles every partition. Errors name the partition's first node.
  static std::unique_ptr<PartitionedExecutable> build(std::unique_ptr<Graph> g, const PartitionedOptions& opts = {});
  ~PartitionedExecutable();
  std::vector<Tensor> run(const std::vector<Tensor>& inputs, const BreakRunner& runner = {});
  const Graph& graph() const { return *graph_; }
  const PartitionPlan& plan() const { return plan_; }
  double compile_seconds() const { return compile_seconds_; }
  // Over the compiled partitions: output aliases written straight over their input, copied over it
  // after the last step, and dropped (PartitionedOptions::output_aliases).
  struct AliasCounts {
    int in_place = 0, copied_back = 0, dropped = 0;
  };
  AliasCounts alias_counts() const;

 private:
  PartitionedExecutable();
  struct Compiled;
  std::unique_ptr<Graph> graph_;
  PartitionPlan plan_;
  std::vector<std::unique_ptr<Compiled>> compiled_;
  double compile_seconds_ = 0;
};

}  // namespace tessel
