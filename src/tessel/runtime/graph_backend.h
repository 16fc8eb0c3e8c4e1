// The `graph` backend (the middle rung of eager / graph / compiled, like PyTorch's aot_eager): a
// model is decomposed to core ops and simplified by the "core" pipeline, every core node gets a
// precompiled typed kernel, and every intermediate with a static shape gets an offset in one arena
// planned by liveness. Nodes that are not core ops, or whose shapes are only known when they run,
// run through the reference kernels on heap tensors (the dynamic region). docs/runtime/graph-backend.md.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/ir/graph.h"
#include "tessel/kernel/arena_plan.h"
#include "tessel/runtime/core_kernels.h"
#include "tessel/support/error.h"

namespace tessel {

// A graph input whose value was baked into a constant at compile time: every call checks it.
struct Guard {
  size_t input_index;
  std::string name;
  Tensor value;
};

// Binds the example inputs' shapes and bakes the small inputs that decide shapes into constants
// (taking them out of g.inputs); returns their guards. Rank-0/1 inputs of up to max_baked_elements.
std::vector<Guard> specialise_inputs(Graph& g, const std::vector<Tensor>& ex, int64_t max_baked_elements);

// Arena memory the executables of one symbolic compilation share (docs/dynamic-shapes.md): they run
// one at a time, so each new one takes its arena from here instead of mapping (and faulting in) its
// own, and the memory grows when a plan needs more (executables planned earlier keep the smaller
// block they were planned in, until they are dropped).
struct ArenaPool {
  std::shared_ptr<uint8_t> block;
  size_t bytes = 0;
  std::shared_ptr<uint8_t> take(size_t need);
};

// How a backend's own nodes run (the kernel level's tessel.kernel nodes, what lower/ produced for the
// host CPU): the backend that lowered the graph gives each such node its kernel and says whether it may
// write over an input; the graph backend plans and runs every other node with its typed kernels.
// (docs/runtime/graph-backend.md, "Kernel nodes")
class KernelNodeRunner {
 public:
  virtual ~KernelNodeRunner() = default;
  // The kernel of node `n`; empty for a node this backend does not run. Called when the step is
  // chosen and, in a symbolic executable, again for each binding that changes the node's sizes.
  virtual CoreKernel kernel(const Node& n) = 0;
  // Whether `n` may write its output `out` over the memory its inputs at positions `ins` read.
  virtual bool writes_over_input(const Node& n, const std::vector<int>& ins, int out) const = 0;
};

struct GraphBackendOptions {
  std::string pipeline = "core";  // the pass pipeline run before planning (by name)
  std::string dump_dir;           // the pipeline's stages written here (NN-<stage>.tsl), when set
  size_t align = 64;              // arena offsets are multiples of this
  int64_t max_baked_elements = 16;  // rank-0/1 inputs up to this size may be specialised (baked)
  // The runner of the graph's kernel nodes (null: the graph has none); not owned. compile_graph asks
  // it for each kernel node's step; a symbolic executable asks again at each rebind, so there it must
  // live as long as the executable.
  KernelNodeRunner* kernel_nodes = nullptr;
  // In-place outputs (docs/runtime/graph-backend.md, "Outputs in the caller's memory"). Per graph
  // output (empty: none), the index of a graph input whose storage run() writes the output into:
  // the caller's tensor, updated in place (an optimizer step's parameters and state) and returned.
  // The planner lets the output's kernel write straight over the input when that is safe (the input
  // is read by no later step, and the kernel reads each element before writing the same position:
  // KernelNodeRunner::writes_over_input); otherwise the output is computed in the arena and copied over the input
  // after the last step. Either way no step sees the input change. An input is aliased at most once,
  // must have the output's type and must not itself be a graph output.
  std::vector<int> output_aliases;
  // With optional_aliases an alias the graph cannot take (its input specialised into a constant or
  // returned as an output too, another type, an input named twice) is dropped instead of an error: that
  // output comes back as a tensor of its own (aliases_dropped counts them). tessel.compile's mutated
  // inputs use it; the caller compares addresses to know which were written in place.
  bool optional_aliases = false;
  // Graph outputs (not aliased) computed by a kernel are written straight into buffers of their own,
  // returned without a copy out of the arena; a later run reuses a buffer once the caller has
  // dropped every tensor sharing it (no allocation, no page faults), else allocates a new one.
  bool recycled_outputs = false;
  // Where the arena comes from when it is shared (ArenaPool); null: an arena of its own.
  std::shared_ptr<ArenaPool> arena_pool;
  // The graph keeps its size symbols (docs/dynamic-shapes.md, "One executable for every binding"):
  // steps, homes, aliases, views and in-place choices are decided once, on the symbolic sizes, and
  // GraphExecutable::rebind gives the executable a binding before run: the types, the views and typed
  // kernels of the core steps the changed symbols size, and the arena plan. Kernel nodes
  // (kernel_nodes) read the sizes themselves. A graph with a step that can only be chosen on one
  // binding's shapes (a node the typed kernels do not take, a size known only at run time) is
  // refused with an "unsupported" error naming it.
  bool symbolic = false;
  // The graph was lowered before it came here (lower/: the compiled backend's passes, fusion and code
  // generation): no specialisation and no pipeline run here (`pipeline` is not read); what they
  // decided comes with it.
  struct Prelowered {
    size_t num_inputs = 0;       // the model's inputs, before specialise_inputs took some
    std::vector<Guard> guards;   // what specialise_inputs returned
    std::string pipeline_error;  // the passes were undone: the model runs undecomposed
    double pass_seconds = 0;
  };
  std::optional<Prelowered> lowered;
};

// What compiling found and decided.
struct GraphCompileStats {
  double compile_seconds = 0;     // passes + kernel selection + planning
  double pass_seconds = 0;
  size_t arena_bytes = 0;         // the planned arena (peak intermediate bytes of the arena region)
  size_t arena_lower_bound = 0;   // most bytes alive at one step: what a perfect packing would need
  int nodes = 0;                  // nodes after the pipeline
  int typed = 0;                  // core nodes with a precompiled typed kernel
  int aliased = 0;                // reshapes that alias their operand (no copy)
  int views = 0;                  // broadcasts read through strides by their consumers (no copy)
  int in_place = 0;               // elementwise results written over a dead operand
  std::map<std::string, int> fallback;  // "op dtype" -> core nodes run by the reference kernel in the arena
  std::map<std::string, int> dynamic;   // op -> nodes in the dynamic region (not core, or dynamic shapes)
  std::vector<std::string> baked_inputs;  // inputs specialised into constants (guarded)
  int outputs_in_place = 0;       // output_aliases written straight over their input
  int outputs_copied_back = 0;    // output_aliases computed in the arena and copied over their input
  int aliases_dropped = 0;        // output_aliases not taken (optional_aliases)
  int outputs_recycled = 0;       // outputs in buffers of their own (recycled_outputs)
  std::string pipeline_error;     // set when the pipeline could not lower the model (it then runs undecomposed)
  int fallback_count() const;
  int dynamic_count() const;
};

struct GraphRunStats {
  double seconds = 0;
  size_t arena_bytes = 0;
  size_t heap_peak_bytes = 0;     // peak bytes of live dynamic-region tensors
  size_t peak_bytes = 0;          // arena + heap peak: comparable with eager's RunStats::peak_bytes
};

// A call whose input differs from what the executable was specialised on (a baked input's value,
// or an input's dtype or shape). The caller may recompile with those inputs.
class GuardFailure : public Error {
 public:
  using Error::Error;
};

class GraphExecutable;

// Takes the graph, runs the pipeline and builds the executable. `example_inputs` (optional, one per
// graph input) bind unknown input dims and allow small integer inputs that determine shapes to be
// baked in as constants. Errors are tessel::Error naming the node, op or pass.
std::unique_ptr<GraphExecutable> compile_graph(std::unique_ptr<Graph> g, const std::vector<Tensor>& example_inputs = {},
                                               const GraphBackendOptions& opts = {});

class GraphExecutable {
 public:
  ~GraphExecutable();
  // Runs the model; one tensor per graph output. Not reentrant (one arena per executable).
  std::vector<Tensor> run(const std::vector<Tensor>& inputs, GraphRunStats* stats = nullptr);
  // An executable compiled with GraphBackendOptions::symbolic: every size symbol's value for the calls
  // that follow (what SymbolBinder gives from their input shapes, facts checked). Only what the symbols
  // that changed since the last binding size is redone. Errors (a size below 0, an arena too large)
  // leave it unbound: run refuses until a rebind succeeds.
  void rebind(const Bindings& b);
  const GraphCompileStats& stats() const { return stats_; }
  const Graph& graph() const { return *graph_; }
  // The arena plan: one request per planned buffer, with the value it holds.
  const std::vector<BufferRequest>& buffer_requests() const { return requests_; }
  const std::vector<const Value*>& buffer_values() const { return buffer_values_; }
  const ArenaPlan& plan() const { return plan_; }

 private:
  friend std::unique_ptr<GraphExecutable> compile_graph(std::unique_ptr<Graph>, const std::vector<Tensor>&,
                                                        const GraphBackendOptions&);
  struct Impl;
  GraphExecutable();
  // Plans requests_ into plan_ and points every arena value at its place in the arena (the pool's block
  // when the executable has one, else pages of its own).
  void place_arena();
  std::unique_ptr<Graph> graph_;
  GraphCompileStats stats_;
  std::vector<BufferRequest> requests_;
  std::vector<const Value*> buffer_values_;
  ArenaPlan plan_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessel

namespace tessel {

// The arena plan as a markdown table (value, type, bytes, live steps, offset; by offset) followed by
// the arena size: the form docs/runtime/graph-backend.md shows for its worked example.
std::string describe_plan(const GraphExecutable& exe);

}  // namespace tessel
