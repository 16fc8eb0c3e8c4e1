// The compiled training step: the joint graph, its remat partition, the split halves compiled.
#include "tessel/driver/train_step.h"

#include <unordered_map>

#include <fmt/format.h>

#include "tessel/passes/remat_partition.h"
#include "tessel/runtime/compiled_backend.h"
#include "tessel/runtime/graph_backend.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

struct Executables {
  std::unique_ptr<CompiledExecutable> cf, cb;
  std::unique_ptr<GraphExecutable> gf, gb;
  std::unique_ptr<Graph> ef, eb;  // eager: the graphs themselves
};

void check_inputs(const char* what, const std::vector<Tensor>& ins, const std::vector<std::string>& names) {
  if (ins.size() != names.size())
    fail("training step {}: {} inputs given, the model takes {} ({}...)", what, ins.size(), names.size(),
         names.empty() ? "" : names[0]);
}

}  // namespace

TrainStep::~TrainStep() = default;

std::unique_ptr<TrainStep> TrainStep::build(std::unique_ptr<Graph> g, const TrainStepOptions& o) {
  if (o.backend != "compiled" && o.backend != "graph" && o.backend != "eager")
    fail("training step: backend '{}' is not one of compiled, graph, eager", o.backend);
  std::unique_ptr<TrainStep> s(new TrainStep());
  TrainOptions to = o.train;
  to.seed = true;
  const size_t num_forward = g->outputs.size();
  if (num_forward == 0) fail("training step: graph '{}' has no outputs", g->name);
  // Several outputs: the first (or TrainOptions::output) is differentiated; the others are returned by
  // the forward undifferentiated (the value guards of a PyTorch module that reads tensor values).
  if (num_forward > 1 && to.output.empty()) to.output = g->outputs[0]->name;
  s->info_ = build_train_graph(*g, to);
  s->num_outputs_ = num_forward;
  const std::string seed = s->info_.autodiff.seed_input;
  for (const Value* v : g->inputs)
    if (v->name != seed) s->inputs_.push_back(v->name);
  SplitGraphs kept = split_by_partition(*g, num_forward, s->info_.partition);
  SplitGraphs run = split_by_partition(*g, num_forward, s->info_.partition);
  // The backward's inputs: the saved values first, then the joint graph's inputs it reads.
  std::unordered_map<std::string, int> pos;
  for (size_t i = 0; i < s->inputs_.size(); ++i) pos[s->inputs_[i]] = static_cast<int>(i);
  const size_t nsaved = s->info_.partition.saved.size();
  for (size_t i = nsaved; i < kept.backward->inputs.size(); ++i) {
    const std::string& n = kept.backward->inputs[i]->name;
    s->bwd_feeds_.push_back(n == seed ? -1 : pos.at(n));
  }
  std::vector<int> fwd_feeds;
  for (const Value* v : kept.forward->inputs) fwd_feeds.push_back(pos.at(v->name));
  s->fwd_graph_ = std::move(kept.forward);
  s->bwd_graph_ = std::move(kept.backward);

  auto ex = std::make_shared<Executables>();
  if (o.backend == "compiled") {
    CompiledBackendOptions co;
    co.threads = o.threads;
    // Outputs, saved tensors and gradients are written by their kernels into buffers handed over
    // without a copy, reused by the next step once the caller dropped them (docs/training.md).
    co.recycled_outputs = true;
    co.model_name = g->name + "_forward";
    ex->cf = compile_cpu(std::move(run.forward), {}, co);
    co.model_name = g->name + "_backward";
    ex->cb = compile_cpu(std::move(run.backward), {}, co);
    s->run_fwd_ = [e = ex.get()](const std::vector<Tensor>& in) { return e->cf->run(in); };
    s->run_bwd_ = [e = ex.get()](const std::vector<Tensor>& in) { return e->cb->run(in); };
  } else if (o.backend == "graph") {
    GraphBackendOptions go;
    go.recycled_outputs = true;
    ex->gf = compile_graph(std::move(run.forward), {}, go);
    ex->gb = compile_graph(std::move(run.backward), {}, go);
    s->run_fwd_ = [e = ex.get()](const std::vector<Tensor>& in) { return e->gf->run(in); };
    s->run_bwd_ = [e = ex.get()](const std::vector<Tensor>& in) { return e->gb->run(in); };
  } else {
    ex->ef = std::move(run.forward);
    ex->eb = std::move(run.backward);
    s->run_fwd_ = [e = ex.get()](const std::vector<Tensor>& in) { return run_eager(*e->ef, in); };
    s->run_bwd_ = [e = ex.get()](const std::vector<Tensor>& in) { return run_eager(*e->eb, in); };
  }
  // The forward graph reads the inputs it needs, in joint order: select them per call.
  s->run_fwd_ = [inner = s->run_fwd_, fwd_feeds](const std::vector<Tensor>& in) {
    std::vector<Tensor> sel;
    sel.reserve(fwd_feeds.size());
    for (int f : fwd_feeds) sel.push_back(in[static_cast<size_t>(f)]);
    return inner(sel);
  };
  s->keep_ = ex;
  s->joint_ = std::move(g);
  return s;
}

std::vector<Tensor> TrainStep::forward(const std::vector<Tensor>& inputs, std::vector<Tensor>& saved) {
  check_inputs("forward", inputs, inputs_);
  std::vector<Tensor> outs = run_fwd_(inputs);
  saved.assign(outs.begin() + static_cast<long>(num_outputs_), outs.end());
  outs.resize(num_outputs_);
  return outs;
}

std::vector<Tensor> TrainStep::backward(const std::vector<Tensor>& saved, const std::vector<Tensor>& inputs,
                                        const Tensor& seed) {
  check_inputs("backward", inputs, inputs_);
  if (saved.size() != info_.partition.saved.size())
    fail("training step backward: {} saved tensors given, the forward saves {}", saved.size(),
         info_.partition.saved.size());
  std::vector<Tensor> in = saved;
  for (int f : bwd_feeds_) in.push_back(f < 0 ? seed : inputs[static_cast<size_t>(f)]);
  return run_bwd_(in);
}

}  // namespace tessel
