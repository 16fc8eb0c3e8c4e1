// The graph backend: specialisation with guards, the "core" pipeline, kernel selection, arena
// planning by liveness, and the executor that runs the steps over the arena (graph_backend.h).
#include "tessel/ir/core_ops.h"
#include "tessel/runtime/graph_backend.h"

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <set>

#include "tessel/ir/bind.h"
#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/passes/pass.h"
#include "tessel/runtime/core_kernels.h"
#include "tessel/support/escape.h"
#include "tessel/support/limits.h"
#include "tessel/support/pages.h"

namespace tessel {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool is_static(const Value* v) { return v && shape_known(v->type.shape); }

// ---- specialisation --------------------------------------------------------------------------------

int unknown_dims(const Graph& g) {
  int n = 0;
  for (const auto& v : g.values())
    for (int64_t d : v->type.shape) n += d < 0;
  return n;
}

// Whether fixing the inputs `which` to their example values makes some unknown dim known: together
// their values decide a shape.
bool decide_shapes(const Graph& g, const std::vector<size_t>& which, const std::vector<Tensor>& ex) {
  if (which.empty()) return false;
  auto c = g.clone();
  for (size_t i : which) c->inputs[i]->constant = ex[i];
  infer_graph(*c);
  return unknown_dims(*c) < unknown_dims(g);
}

}  // namespace

// Integer inputs of a few elements (axes, pads, k, a shape, a limit) are always baked, since
// decompositions need them as constants; float and bool inputs (Resize scales, Range bounds, a
// training flag) only when their value decides a result's shape.
std::vector<Guard> specialise_inputs(Graph& g, const std::vector<Tensor>& ex, int64_t max_baked_elements) {
  if (ex.empty()) return {};
  bind_input_shapes(g, ex);
  infer_graph(g);
  // Which inputs to bake: small integer ones always; small float/bool ones whose value decides a
  // shape alone (Resize scales), or together with the other such inputs (Range's start, limit, delta).
  std::vector<bool> bake(g.inputs.size(), false);
  std::vector<size_t> rest;
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    if (ex[i].rank() > 1 || ex[i].numel() > max_baked_elements) continue;
    if (is_int(g.inputs[i]->type.dtype) || decide_shapes(g, {i}, ex)) bake[i] = true;
    else rest.push_back(i);
  }
  if (decide_shapes(g, rest, ex))
    for (size_t i : rest) bake[i] = true;
  std::vector<Guard> guards;
  std::vector<Value*> kept;
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    Value* v = g.inputs[i];
    if (bake[i]) {
      guards.push_back(Guard{i, v->name, ex[i].clone()});
      v->constant = ex[i].clone();
      v->is_input = false;
    } else {
      kept.push_back(v);
    }
  }
  if (!guards.empty()) {
    g.inputs = kept;
    infer_graph(g);
  }
  return guards;
}

namespace {

// Runs the pipeline. When a pass fails (typically a decomposition that needs a value or a shape only
// known at run time), the model runs undecomposed instead: every node through the reference kernels
// (a graph break of the whole model), with the reason kept in the stats and printed by the CLI.
void run_core_pipeline(std::unique_ptr<Graph>& g, const std::string& pipeline, const std::string& dump_dir, GraphCompileStats& st) {
  if (pipeline.empty()) return;
  std::unique_ptr<Graph> backup = g->clone();
  try {
    PassOptions po;
    po.dump_dir = dump_dir;
    run_pipeline(*g, parse_pipeline(pipeline), po);
  } catch (const Error& e) {
    st.pipeline_error = e.what();
    g = std::move(backup);
  }
}

// ---- steps ---------------------------------------------------------------------------------------

enum class StepKind { typed, alias, fallback, dynamic };

struct Step {
  const Node* node = nullptr;
  StepKind kind = StepKind::typed;
  CoreKernel kernel;
  std::vector<int> release;  // heap values (roots) whose last use is this step
};

std::string dtype_label(const Node& n) {
  const Value* v = !n.outputs.empty() && n.outputs[0] ? n.outputs[0] : nullptr;
  return v ? std::string(dtype_name(v->type.dtype)) : "?";
}

}  // namespace

int GraphCompileStats::fallback_count() const {
  int n = 0;
  for (const auto& [op, c] : fallback) n += c;
  return n;
}
int GraphCompileStats::dynamic_count() const {
  int n = 0;
  for (const auto& [op, c] : dynamic) n += c;
  return n;
}

// Where each value lives while the executable runs.
// output: a graph output in a buffer of its own, recycled from run to run (recycled_outputs).
enum class Home { none, input, constant, arena, heap, output };

std::shared_ptr<uint8_t> ArenaPool::take(size_t need) {
  if (!block || bytes < need) {
    const size_t n = std::max(need, bytes + bytes / 2);
    block = std::shared_ptr<uint8_t>(allocate_pages(n));
    bytes = n;
  }
  return block;
}

struct GraphExecutable::Impl {
  std::vector<Step> steps;
  std::vector<Guard> guards;
  size_t num_inputs = 0;                // inputs of the model as given (baked ones included)
  std::vector<int> input_slot;          // per given input: index into the graph's inputs, -1 if baked
  std::vector<const Value*> value_of;   // per value id
  std::vector<Home> home;               // per value id (meaningful for roots)
  std::vector<int> root;                // per value id: the value whose memory it uses
  std::vector<uint8_t*> fixed_ptr;      // per value id: constants and arena values
  std::shared_ptr<uint8_t> arena;       // pages, materialised by the first run (or an ArenaPool's)
  KernelEnv env;
  std::vector<Tensor> heap;             // per root id: dynamic-region tensors
  std::vector<const Tensor*> given;     // per value id: the caller's input tensors, during a run
  ViewMap views;                        // broadcast results read in place by their consumers
  std::vector<std::pair<int, int>> over_input;  // (value id, input value id): results written over an input
  std::vector<int> copy_back;           // per graph output: the input value id it is copied over, or -1
  std::vector<int> alias_input;         // per graph output: the input value id it is written into, or -1
  std::vector<int> recycled;            // value ids with Home::output
  std::vector<Tensor> pool;             // per value id: the buffer of a Home::output value

  // GraphBackendOptions::symbolic: what rebind() redoes, each with the symbols (indices into
  // symbol_names) whose change makes it stale.
  bool symbolic = false;
  std::vector<std::string> symbol_names;
  std::vector<int64_t> bound;           // the current binding in symbol_names' order; empty: none
  struct SymType {                      // a value whose type names symbols: the symbolic type kept
    Value* v;
    TensorType type;
    std::vector<int> syms;
  };
  std::vector<SymType> sym_types;
  struct SymAttr {                      // a size attribute naming symbols
    Node* n;
    std::string key;
    Dims dims;
    std::vector<int> syms;
  };
  std::vector<SymAttr> sym_attrs;
  struct SymStep {                      // a core step whose kernel (or view) is built per binding
    size_t step;
    std::vector<int> syms;
    bool view;
  };
  std::vector<SymStep> sym_steps;
  std::vector<Dim> request_bytes;       // per arena request: its bytes, an expression of the symbols
  KernelNodeRunner* kernel_nodes = nullptr;  // GraphBackendOptions::kernel_nodes
  // GraphBackendOptions' arena pool (symbolic: one of its own when none is given, so that a binding
  // that needs more memory grows it) and alignment.
  std::shared_ptr<ArenaPool> arena_pool;
  size_t align = 64;

  Tensor tensor_of(const Value* v) const;
  void store_result(const Value* v, Tensor t, size_t& live);
  void run_step(const Step& s, size_t& live, size_t& peak);
  void plan_outputs(const Graph& g, const GraphBackendOptions& opts, GraphCompileStats& st,
                    const std::vector<int>& group_last, const std::map<int, size_t>& bytes_override);
};

GraphExecutable::GraphExecutable() : impl_(std::make_unique<Impl>()) {}
GraphExecutable::~GraphExecutable() = default;

// The value as a Tensor for the reference kernels and the results: storage shared with inputs,
// constants and heap tensors; a copy of arena memory.
Tensor GraphExecutable::Impl::tensor_of(const Value* v) const {
  const int r = root[v->id];
  if (auto it = views.find(v->id); it != views.end()) {
    Tensor t = Tensor::uninitialized(v->type.dtype, v->type.shape);
    materialize_view(it->second, env.ptr[it->second.src_id], v->type.shape, dtype_size(v->type.dtype), t.bytes());
    return t;
  }
  auto view = [&](const Tensor& t) { return r == v->id ? t : t.reshaped(v->type.shape); };
  switch (home[r]) {
    case Home::constant: return view(*value_of[r]->constant);
    case Home::input: return view(*given[r]);
    case Home::heap: return view(heap[r]);
    case Home::output: return view(pool[r]);
    case Home::arena: {
      Tensor t = Tensor::uninitialized(v->type.dtype, v->type.shape);
      if (t.nbytes()) std::memcpy(t.bytes(), env.ptr[v->id], t.nbytes());
      return t;
    }
    case Home::none: break;
  }
  throw Error(Location{.pass = "run"}, fmt::format("value '{}' has no memory", v->name));
}

void GraphExecutable::Impl::store_result(const Value* v, Tensor t, size_t& live) {
  const int id = v->id;
  if (home[root[id]] == Home::arena) {
    const size_t want = static_cast<size_t>(shape_numel(v->type.shape)) * dtype_size(v->type.dtype);
    if (t.nbytes() != want)
      fail("result '{}' has {} bytes, {} were planned", v->name, t.nbytes(), want);
    if (want) std::memcpy(env.ptr[id], t.bytes(), want);
    return;
  }
  live += t.nbytes();
  heap[id] = std::move(t);
  env.ptr[id] = heap[id].bytes();
}

void GraphExecutable::Impl::run_step(const Step& s, size_t& live, size_t& peak) {
  const Node& n = *s.node;
  switch (s.kind) {
    case StepKind::typed:
      for (const Value* v : n.outputs)  // results on the heap (models with a dynamic region)
        if (v && home[root[v->id]] == Home::heap && root[v->id] == v->id) {
          heap[v->id] = Tensor(v->type.dtype, v->type.shape);
          env.ptr[v->id] = heap[v->id].bytes();
          live += heap[v->id].nbytes();
        }
      s.kernel(env);
      break;
    case StepKind::alias: env.ptr[n.outputs[0]->id] = env.ptr[n.inputs[0]->id]; break;
    case StepKind::fallback:
    case StepKind::dynamic: {
      std::vector<Tensor> ins;
      ins.reserve(n.inputs.size());
      for (const Value* v : n.inputs) ins.push_back(v ? tensor_of(v) : Tensor());
      std::vector<const Tensor*> ptrs;
      for (size_t i = 0; i < ins.size(); ++i) ptrs.push_back(n.inputs[i] ? &ins[i] : nullptr);
      std::vector<Tensor> outs = run_node(n, ptrs);
      for (size_t i = 0; i < outs.size() && i < n.outputs.size(); ++i)
        if (n.outputs[i]) store_result(n.outputs[i], std::move(outs[i]), live);
      break;
    }
  }
  peak = std::max(peak, live);
  for (int r : s.release) {
    live -= heap[r].nbytes();
    heap[r] = Tensor();
  }
}

namespace {

// Liveness facts per value id: defining step, last use (graph outputs: past the last step).
struct Liveness {
  std::vector<int> def, last;
};

Liveness liveness(const Graph& g, size_t nv) {
  Liveness l;
  l.def.assign(nv, -1);
  l.last.assign(nv, -1);
  const auto& nodes = g.nodes();
  for (size_t k = 0; k < nodes.size(); ++k) {
    for (const Value* v : nodes[k]->inputs)
      if (v) l.last[v->id] = static_cast<int>(k);
    for (const Value* v : nodes[k]->outputs)
      if (v) l.def[v->id] = static_cast<int>(k);
  }
  for (const Value* v : g.outputs) l.last[v->id] = static_cast<int>(nodes.size());
  for (size_t i = 0; i < nv; ++i) l.last[i] = std::max(l.last[i], l.def[i]);
  return l;
}

bool core_with_shapes(const Node& n, bool symbolic);

// A broadcast_in_dim whose result is only read by kernels that take strided operands is not
// materialised: its consumers read the operand through a view.
bool can_be_view(const Node& n, const Graph& g, const std::vector<std::vector<const Node*>>& consumers, bool symbolic) {
  const Value* out = n.outputs[0];
  if (std::find(g.outputs.begin(), g.outputs.end(), out) != g.outputs.end()) return false;
  for (const Node* c : consumers[out->id]) {
    if (!core_with_shapes(*c, symbolic)) return false;
    // an elementwise unary consumer is computed on the view's source and is a view itself
    const bool ok = reads_views(*c) || (is_elementwise_unary(*c) && can_be_view(*c, g, consumers, symbolic));
    if (!ok) return false;
  }
  return !consumers[out->id].empty();
}

// A value whose sizes are known when the step runs: static, or (symbolic: the executable is rebound
// per binding) sizes of the symbols, but never a size only the data decides.
bool shaped(const Value* v, bool symbolic) { return v && (symbolic ? v->type.dims_defined() : is_static(v)); }

// A core or kernel node whose operands and results all have such sizes.
bool core_with_shapes(const Node& n, bool symbolic) {
  if (!n.op->core && n.op->domain != "tessel.kernel") return false;
  for (const Value* v : n.inputs)
    if (v && !shaped(v, symbolic)) return false;
  for (const Value* v : n.outputs)
    if (v && !shaped(v, symbolic)) return false;
  return true;
}

// Adds the symbols `ds` names, as indices into `names` (sorted, holding every one).
void add_symbols(std::set<int>& out, const Dims& ds, const std::vector<std::string>& names) {
  for (const Dim& d : ds)
    for (const std::string& s : d.symbols())
      out.insert(static_cast<int>(std::lower_bound(names.begin(), names.end(), s) - names.begin()));
}
std::vector<int> symbols_in(const Dims& ds, const std::vector<std::string>& names) {
  std::set<int> out;
  add_symbols(out, ds, names);
  return {out.begin(), out.end()};
}

// The symbols that the types of n's values and its size attributes name.
std::vector<int> node_symbols(const Node& n, const std::vector<std::string>& names) {
  std::set<int> out;
  for (const Value* v : n.inputs)
    if (v) add_symbols(out, v->type.sym, names);
  for (const Value* v : n.outputs)
    if (v) add_symbols(out, v->type.sym, names);
  for (const auto& [k, a] : n.attrs)
    if (const Dims* d = std::get_if<Dims>(&a)) add_symbols(out, *d, names);
  return {out.begin(), out.end()};
}

}  // namespace

// Outputs in the caller's memory (GraphBackendOptions::output_aliases) and outputs in recycled
// buffers (recycled_outputs), decided after the steps' own homes and in-place choices.
void GraphExecutable::Impl::plan_outputs(const Graph& g, const GraphBackendOptions& opts, GraphCompileStats& st,
                                         const std::vector<int>& group_last, const std::map<int, size_t>& bytes_override) {
  const size_t nout = g.outputs.size();
  copy_back.assign(nout, -1);
  alias_input.assign(nout, -1);
  std::map<const Node*, int> step_of;
  for (size_t k = 0; k < steps.size(); ++k) step_of[steps[k].node] = static_cast<int>(k);
  // A result a typed step writes into memory of its own (not a view, not over another value).
  auto own_result = [&](const Value* v) {
    return v->producer && root[v->id] == v->id && home[v->id] == Home::arena && !views.count(v->id) &&
           !bytes_override.count(v->id) && steps[static_cast<size_t>(step_of.at(v->producer))].kind == StepKind::typed;
  };
  if (!opts.output_aliases.empty()) {
    if (opts.output_aliases.size() != nout)
      fail("output_aliases names {} outputs; graph '{}' has {}", opts.output_aliases.size(), g.name, nout);
    std::set<int> taken;
    for (size_t k = 0; k < nout; ++k) {
      const int i = opts.output_aliases[k];
      if (i < 0) continue;
      const Value* out = g.outputs[k];
      // why this alias cannot be taken: an error, or with optional_aliases the output returned as its own
      auto why_not = [&]() -> std::string {
        if (static_cast<size_t>(i) >= num_inputs || input_slot[static_cast<size_t>(i)] < 0)
          return fmt::format("output {} ('{}') aliases input {}, which the graph does not take (it has {} inputs{})", k,
                             out->name, i, num_inputs,
                             static_cast<size_t>(i) < num_inputs ? "; that one was specialised into a constant" : "");
        const Value* in = g.inputs[static_cast<size_t>(input_slot[static_cast<size_t>(i)])];
        if (in->type != out->type)
          return fmt::format("output {} ('{}', {}) cannot be written into input '{}' ({})", k, out->name, out->type.str(),
                             in->name, in->type.str());
        if (taken.count(in->id)) return fmt::format("input '{}' is aliased by two outputs", in->name);
        for (size_t j = 0; j < nout; ++j)
          if (root[g.outputs[j]->id] == in->id)
            return fmt::format("input '{}' is also returned as output {}; it cannot be overwritten by output {}", in->name,
                               j, k);
        return {};
      };
      if (const std::string why = why_not(); !why.empty()) {
        if (!opts.optional_aliases) fail("{}", why);
        st.aliases_dropped++;
        continue;
      }
      const Value* in = g.inputs[static_cast<size_t>(input_slot[static_cast<size_t>(i)])];
      taken.insert(in->id);
      alias_input[k] = in->id;
      // Written straight over the input: nothing after the producing step reads the input, and the
      // producer reads every element of it before writing the same position (or not at all).
      bool over = own_result(out);
      if (over) {
        const int d = step_of.at(out->producer);
        const Node& n = *out->producer;
        std::vector<int> ins;
        for (size_t p = 0; p < n.inputs.size(); ++p)
          if (n.inputs[p] && root[n.inputs[p]->id] == in->id) {
            ins.push_back(static_cast<int>(p));
            over = over && !views.count(n.inputs[p]->id);
          }
        const int outpos = out->producer_output;
        if (group_last[in->id] > d) over = false;
        else if (over && !ins.empty()) {
          if (n.op->core.has_value()) {
            for (int p : ins) over = over && can_run_in_place(n, p);
          } else {
            over = opts.kernel_nodes && opts.kernel_nodes->writes_over_input(n, ins, outpos);
          }
        }
      }
      if (over) {
        root[out->id] = in->id;
        home[out->id] = Home::input;
        over_input.push_back({out->id, in->id});
        st.outputs_in_place++;
      } else {
        copy_back[k] = in->id;
        st.outputs_copied_back++;
      }
    }
  }
  if (!opts.recycled_outputs) return;
  for (size_t k = 0; k < nout; ++k) {
    const Value* v = g.outputs[k];
    if (alias_input[k] >= 0 || home[v->id] != Home::arena || !own_result(v)) continue;
    home[v->id] = Home::output;
    recycled.push_back(v->id);
    st.outputs_recycled++;
  }
}

std::unique_ptr<GraphExecutable> compile_graph(std::unique_ptr<Graph> g, const std::vector<Tensor>& ex,
                                               const GraphBackendOptions& opts) {
  const auto t0 = Clock::now();
  const bool sym = opts.symbolic;
  if (sym && !ex.empty()) fail("a graph compiled for every binding of its size symbols takes no example inputs");
  if (ex.empty() && !sym && !graph_symbols(*g).empty())
    throw Error(Location{.pass = "compile"},
                "the graph backend plans static shapes: a model with size symbols runs on the compiled backend or the eager "
                "interpreter (docs/dynamic-shapes.md)",
                true);
  std::unique_ptr<GraphExecutable> exe(new GraphExecutable());
  GraphExecutable::Impl& im = *exe->impl_;
  GraphCompileStats& st = exe->stats_;
  const GraphBackendOptions::Prelowered* low = opts.lowered ? &*opts.lowered : nullptr;
  im.num_inputs = low ? low->num_inputs : g->inputs.size();

  im.guards = low ? low->guards : specialise_inputs(*g, ex, opts.max_baked_elements);
  for (size_t i = 0, slot = 0; i < im.num_inputs; ++i) {
    const bool baked = std::any_of(im.guards.begin(), im.guards.end(), [&](const Guard& gd) { return gd.input_index == i; });
    im.input_slot.push_back(baked ? -1 : static_cast<int>(slot++));
  }
  for (const Guard& gd : im.guards) st.baked_inputs.push_back(gd.name);

  if (low) {
    st.pass_seconds = low->pass_seconds;
    st.pipeline_error = low->pipeline_error;
  } else {
    const auto tp = Clock::now();
    run_core_pipeline(g, opts.pipeline, opts.dump_dir, st);
    st.pass_seconds = seconds_since(tp);
  }

  // Homes, aliases and in-place decisions, node by node.
  size_t nv = 0;
  for (const auto& v : g->values()) nv = std::max(nv, static_cast<size_t>(v->id) + 1);
  im.value_of.assign(nv, nullptr);
  im.home.assign(nv, Home::none);
  im.root.resize(nv);
  for (size_t i = 0; i < nv; ++i) im.root[i] = static_cast<int>(i);
  im.fixed_ptr.assign(nv, nullptr);
  im.pool.assign(nv, Tensor());
  for (const auto& v : g->values()) {
    im.value_of[v->id] = v.get();
    if (v->constant) {
      im.home[v->id] = Home::constant;
      im.fixed_ptr[v->id] = const_cast<uint8_t*>(v->constant->bytes());
    } else if (v->is_input) {
      im.home[v->id] = Home::input;
    }
  }
  const Liveness lv = liveness(*g, nv);
  const auto consumers = g->users();  // (sized nv)
  std::map<int, size_t> bytes_override;  // results that hold fewer elements than their type (views)
  std::vector<int> group_last = lv.last;  // per root: last use of any value sharing its memory
  const auto& nodes = g->nodes();
  st.nodes = static_cast<int>(nodes.size());
  // With a dynamic region, every result lives on the heap (allocated by its step, freed after its
  // last use, like eager) instead of splitting the memory between an arena and the heap.
  bool has_dynamic = false;
  for (const auto& v : g->values()) has_dynamic = has_dynamic || (v->producer && !shaped(v.get(), sym));
  im.arena_pool = opts.arena_pool;
  im.align = opts.align;
  if (sym) {
    im.symbolic = true;
    im.symbol_names = graph_symbols(*g);  // sorted
    im.kernel_nodes = opts.kernel_nodes;
    if (!im.arena_pool) im.arena_pool = std::make_shared<ArenaPool>();
    for (const auto& v : g->values()) {
      if (v->producer && !shaped(v.get(), true))
        throw Error(Location{.node = v->producer->name, .op = v->producer->op->name, .pass = "compile"},
                    fmt::format("'{}' has a size only known when it runs ({}): one executable for every binding "
                                "needs sizes of the symbols", display_text(v->name), v->type.str()),
                    true);
      if (v->type.symbolic()) im.sym_types.push_back({v.get(), v->type, symbols_in(v->type.sym, im.symbol_names)});
    }
    for (const auto& n : nodes)
      for (const auto& [key, a] : n->attrs)
        if (const Dims* d = std::get_if<Dims>(&a); d && !dims_static(*d))
          im.sym_attrs.push_back({n.get(), key, *d, symbols_in(*d, im.symbol_names)});
  }
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = *nodes[k];
    Step s;
    s.node = &n;
    // symbolic: a core step whose sizes name symbols gets its kernel (or view) per binding
    const std::vector<int> syms = sym ? node_symbols(n, im.symbol_names) : std::vector<int>{};
    const bool per_binding = !syms.empty() && n.op->core.has_value();
    if (sym && !core_with_shapes(n, true))
      throw Error(Location{.node = n.name, .op = n.op->name, .pass = "compile"},
                  "no typed step runs this node for every binding of the size symbols (it runs on the reference "
                  "kernels with one binding's shapes)",
                  true);
    if (!core_with_shapes(n, sym)) {
      s.kind = StepKind::dynamic;
      st.dynamic[n.op->name]++;
      // Results with a static shape still get arena memory, unless the model runs undecomposed
      // (then it is the eager graph, and heap tensors freed after their last use are as good).
      for (const Value* v : n.outputs)
        if (v) im.home[v->id] = is_static(v) && st.pipeline_error.empty() && !has_dynamic ? Home::arena : Home::heap;
      im.steps.push_back(std::move(s));
      continue;
    }
    if (is_core_op(n, CoreOp::reshape)) {
      s.kind = StepKind::alias;
      const int r = im.root[n.inputs[0]->id], out = n.outputs[0]->id;
      im.root[out] = r;
      group_last[r] = std::max(group_last[r], lv.last[out]);
      st.aliased++;
      im.steps.push_back(std::move(s));
      continue;
    }
    if (is_core_op(n, CoreOp::broadcast_in_dim) && can_be_view(n, *g, consumers, sym)) {
      s.kind = StepKind::alias;
      const int r = im.root[n.inputs[0]->id], out = n.outputs[0]->id;
      if (per_binding) {
        im.views[out] = StridedView{n.inputs[0]->id, {}};  // its strides: rebind
        im.sym_steps.push_back({im.steps.size(), syms, true});
      } else {
        im.views[out] = broadcast_view(n);
      }
      im.root[out] = r;
      group_last[r] = std::max(group_last[r], lv.last[out]);
      st.views++;
      im.steps.push_back(std::move(s));
      continue;
    }
    if (!has_dynamic && !per_binding && is_elementwise_unary(n) && im.views.count(n.inputs[0]->id) &&
        can_be_view(n, *g, consumers, sym)) {
      // op(broadcast(s)) = broadcast(op(s)): computed on the source's elements, read as a view.
      const StridedView src = im.views.at(n.inputs[0]->id);
      const Value* sv = im.value_of[src.src_id];
      const int out = n.outputs[0]->id;
      s.kernel = make_unary_on_source(n, src, shape_numel(sv->type.shape));
      if (s.kernel) {
        s.kind = StepKind::typed;
        st.typed++;
        st.views++;
        im.home[out] = Home::arena;
        im.views[out] = StridedView{out, src.strides};
        bytes_override[out] = static_cast<size_t>(shape_numel(sv->type.shape)) * dtype_size(sv->type.dtype);
        im.steps.push_back(std::move(s));
        continue;
      }
    }
    if (per_binding) {
      im.sym_steps.push_back({im.steps.size(), syms, false});  // typed unless the binding's kernel is not
    } else {
      if (opts.kernel_nodes) s.kernel = opts.kernel_nodes->kernel(n);
      if (!s.kernel && n.op->core.has_value()) s.kernel = make_core_kernel(n, im.views);
    }
    if (s.kernel || per_binding) {
      s.kind = StepKind::typed;
      st.typed++;
    } else {
      s.kind = StepKind::fallback;
      st.fallback[n.op->name + " " + dtype_label(n)]++;
    }
    for (const Value* v : n.outputs)
      if (v) im.home[v->id] = has_dynamic ? Home::heap : Home::arena;
    if (s.kind == StepKind::typed && n.outputs.size() == 1 && n.outputs[0]) {
      for (int i = 0; i < static_cast<int>(n.inputs.size()); ++i) {
        if (!can_run_in_place(n, i) || im.views.count(n.inputs[i]->id)) continue;
        const int r = im.root[n.inputs[i]->id];
        if (im.home[r] != Home::arena || group_last[r] != static_cast<int>(k)) continue;
        // A view of the same memory is read at other positions than the one being written.
        bool clash = false;
        for (const Value* o : n.inputs) clash = clash || (o && im.views.count(o->id) && im.root[o->id] == r);
        if (clash) continue;
        const int out = n.outputs[0]->id;
        im.root[out] = r;
        group_last[r] = std::max(group_last[r], lv.last[out]);
        st.in_place++;
        break;
      }
    }
    im.steps.push_back(std::move(s));
  }

  im.plan_outputs(*g, opts, st, group_last, bytes_override);

  // One buffer per arena root; heap roots are released after their group's last use.
  for (size_t id = 0; id < nv; ++id) {
    if (im.root[id] != static_cast<int>(id) || !im.value_of[id]) continue;
    if (im.home[id] == Home::arena) {
      const Value* v = im.value_of[id];
      auto over = bytes_override.find(static_cast<int>(id));
      if (sym)
        im.request_bytes.push_back(over != bytes_override.end()
                                       ? Dim(static_cast<int64_t>(over->second))
                                       : dims_numel(v->type.dims()) * static_cast<int64_t>(dtype_size(v->type.dtype)));
      const size_t bytes = sym ? 0
                           : over != bytes_override.end()
                               ? over->second
                               : static_cast<size_t>(shape_numel(v->type.shape)) * dtype_size(v->type.dtype);
      exe->requests_.push_back(BufferRequest{bytes, lv.def[id], group_last[id]});
      exe->buffer_values_.push_back(v);
    } else if (im.home[id] == Home::heap && group_last[id] < static_cast<int>(nodes.size())) {
      im.steps[static_cast<size_t>(std::max(group_last[id], lv.def[id]))].release.push_back(static_cast<int>(id));
    }
  }
  if (sym) {  // steps' kernels, views and the arena plan wait for rebind
    exe->graph_ = std::move(g);
    st.compile_seconds = seconds_since(t0);
    return exe;
  }
  exe->place_arena();
  exe->graph_ = std::move(g);
  st.compile_seconds = seconds_since(t0);
  return exe;
}

void GraphExecutable::place_arena() {
  Impl& im = *impl_;
  plan_ = plan_arena(requests_, im.align);
  const size_t need = plan_.size + im.align;
  check_alloc(need, "the graph backend's arena");
  im.arena = im.arena_pool ? im.arena_pool->take(need) : std::shared_ptr<uint8_t>(allocate_pages(need));
  const uintptr_t raw = reinterpret_cast<uintptr_t>(im.arena.get());
  uint8_t* base = im.arena.get() + ((im.align - raw % im.align) % im.align);
  for (size_t r = 0; r < requests_.size(); ++r) im.fixed_ptr[buffer_values_[r]->id] = base + plan_.offsets[r];
  for (size_t id = 0; id < im.fixed_ptr.size(); ++id)
    if (im.home[im.root[id]] == Home::arena) im.fixed_ptr[id] = im.fixed_ptr[im.root[id]];
  stats_.arena_bytes = plan_.size;
  stats_.arena_lower_bound = plan_.lower_bound;
}

void GraphExecutable::rebind(const Bindings& b) {
  Impl& im = *impl_;
  if (!im.symbolic) fail("rebind: the executable was compiled for static sizes");
  const size_t ns = im.symbol_names.size();
  std::vector<int64_t> vals(ns);
  for (size_t i = 0; i < ns; ++i) {
    auto it = b.find(im.symbol_names[i]);
    if (it == b.end())
      throw Error(Location{.pass = "rebind"}, fmt::format("size symbol '{}' has no value", display_text(im.symbol_names[i])));
    vals[i] = it->second;
  }
  std::vector<char> changed(ns, 0);
  bool any = false;
  for (size_t i = 0; i < ns; ++i) any |= changed[i] = im.bound.empty() || im.bound[i] != vals[i];
  if (!any) return;
  auto stale = [&](const std::vector<int>& syms) {
    for (int i : syms)
      if (changed[static_cast<size_t>(i)]) return true;
    return false;
  };
  const std::vector<int64_t> was = std::move(im.bound);
  im.bound.clear();  // unbound until every piece below has this binding
  for (Impl::SymType& t : im.sym_types) {
    if (!was.empty() && !stale(t.syms)) continue;
    Dims d = substitute_dims(t.type.sym, b);
    for (const Dim& x : d)
      if (x.is_symbolic() || x.constant_term() < 0)
        throw Error(Location{.pass = "rebind"}, fmt::format("value '{}' has size {} for these sizes ({})", display_text(t.v->name),
                                                            x.str(), binding_str(b)));
    t.v->type = TensorType::of(t.type.dtype, d);
  }
  for (Impl::SymAttr& a : im.sym_attrs)
    if (was.empty() || stale(a.syms)) a.n->attrs[a.key] = dims_attr(substitute_dims(a.dims, b));
  for (const Impl::SymStep& ss : im.sym_steps) {
    if (!was.empty() && !stale(ss.syms)) continue;
    Step& s = im.steps[ss.step];
    const Node& n = *s.node;
    try {
      if (ss.view) {
        im.views[n.outputs[0]->id] = broadcast_view(n);
        continue;
      }
      CoreKernel k = im.kernel_nodes ? im.kernel_nodes->kernel(n) : CoreKernel{};
      if (!k) k = make_core_kernel(n, im.views);
      s.kind = k ? StepKind::typed : StepKind::fallback;  // (a fallback writes the arena memory planned for it)
      s.kernel = std::move(k);
    } catch (const Error& e) {
      throw e.with_context(Location{.node = n.name, .op = n.op->name, .pass = "rebind"});
    }
  }
  // The arena: the plan stays while every request's bytes for this binding fit the bytes it was planned
  // with (a decoded token's KV length grows by one; a decode after a prefill shrinks). When one outgrows
  // its slot, every symbolic request is planned again with an eighth more than it needs now, so a length
  // that grows step by step replans about once per eighth of its size instead of at every step.
  auto bytes_for = [&](size_t r) {
    const int64_t bytes = im.request_bytes[r].eval(b);
    if (bytes < 0) fail("value '{}' has {} bytes for these sizes", display_text(buffer_values_[r]->name), bytes);
    return static_cast<size_t>(bytes);
  };
  bool replan = was.empty();
  for (size_t r = 0; r < requests_.size() && !replan; ++r)
    replan = !im.request_bytes[r].is_static() && bytes_for(r) > requests_[r].bytes;
  if (replan) {
    for (size_t r = 0; r < requests_.size(); ++r) {
      const size_t need = bytes_for(r), room = im.request_bytes[r].is_static() ? 0 : need / 8;
      check_alloc(need + room, "the graph backend's arena");
      requests_[r].bytes = need + room;
    }
    place_arena();  // (the pool's block grows when this binding needs more)
  }
  im.bound = std::move(vals);
}

std::vector<Tensor> GraphExecutable::run(const std::vector<Tensor>& inputs, GraphRunStats* stats) {
  const auto t0 = Clock::now();
  Impl& im = *impl_;
  if (im.symbolic && im.bound.empty())
    throw Error(Location{.pass = "run"}, "the executable has no binding of its size symbols (rebind before run)");
  if (inputs.size() != im.num_inputs)
    throw Error(Location{.pass = "run"}, fmt::format("the model takes {} inputs but {} were given", im.num_inputs, inputs.size()));
  for (const Guard& gd : im.guards)
    if (!inputs[gd.input_index].same_as(gd.value))
      throw GuardFailure(Location{.pass = "guard"},
                         fmt::format("input '{}' was specialised to the value it had when the model was compiled "
                                     "(it determines shapes) and this call passes a different value; recompile with "
                                     "these inputs", gd.name));
  im.env.ptr = im.fixed_ptr;
  im.given.assign(im.value_of.size(), nullptr);
  im.heap.assign(im.value_of.size(), Tensor());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (im.input_slot[i] < 0) continue;
    const Value* v = graph_->inputs[static_cast<size_t>(im.input_slot[i])];
    const Tensor& t = inputs[i];
    bool ok = t.dtype() == v->type.dtype && t.rank() == static_cast<int>(v->type.shape.size());
    for (int d = 0; ok && d < t.rank(); ++d) ok = v->type.shape[d] < 0 || v->type.shape[d] == t.dim(d);
    if (!ok)
      throw GuardFailure(Location{.pass = "guard"}, fmt::format("input '{}' must be {} (compiled for it) but got {}",
                                                                v->name, v->type.str(), TensorType{t.dtype(), t.shape()}.str()));
    im.given[v->id] = &t;
    im.env.ptr[v->id] = const_cast<uint8_t*>(t.bytes());
  }
  for (const auto& [id, in] : im.over_input) im.env.ptr[static_cast<size_t>(id)] = im.env.ptr[static_cast<size_t>(in)];
  for (int id : im.recycled) {
    Tensor& b = im.pool[static_cast<size_t>(id)];
    const Value* v = im.value_of[static_cast<size_t>(id)];
    // the caller still holds the last run's buffer, or (rebound) the sizes changed
    if (!b.valid() || b.storage_use_count() != 1 || b.shape() != v->type.shape) b = Tensor(v->type.dtype, v->type.shape);
    im.env.ptr[static_cast<size_t>(id)] = b.bytes();
  }
  size_t live = 0, peak = 0;
  static const bool profile = std::getenv("TESSEL_PROFILE") != nullptr;
  for (const Step& s : im.steps) {
    const auto ts = Clock::now();
    try {
      im.run_step(s, live, peak);
    } catch (const Error& e) {
      throw e.with_context(Location{.node = s.node->name, .op = s.node->op->name, .pass = "run"});
    }
    if (profile) fmt::print(stderr, "profile {:>9.3f} ms  {} {}\n", seconds_since(ts) * 1e3, s.node->op->name, display_text(s.node->name));
  }
  // Outputs copied over their input: every source is read before any input is written (a source
  // may itself live in an input another output is copied over).
  std::vector<Tensor> back(graph_->outputs.size());
  for (size_t k = 0; k < back.size(); ++k)
    if (im.copy_back[k] >= 0) {
      const Value* v = graph_->outputs[k];
      back[k] = im.tensor_of(v);
      if (im.home[im.root[v->id]] == Home::input) back[k] = back[k].clone();
    }
  for (size_t k = 0; k < back.size(); ++k)
    if (back[k].valid() && back[k].nbytes())
      std::memcpy(const_cast<uint8_t*>(im.given[static_cast<size_t>(im.copy_back[k])]->bytes()), back[k].bytes(),
                  back[k].nbytes());
  std::vector<Tensor> outs;
  std::set<int> handed;  // recycled buffers already returned: a second output of the same memory is a copy
  for (size_t k = 0; k < graph_->outputs.size(); ++k) {
    const Value* v = graph_->outputs[k];
    if (im.alias_input[k] >= 0) {
      outs.push_back(*im.given[static_cast<size_t>(im.alias_input[k])]);
      continue;
    }
    outs.push_back(im.tensor_of(v));
    // Two outputs sharing one buffer (a value returned twice: equal gradients of two parameters) would
    // let the caller's in-place update of one (`.grad +=`) change the other.
    const int r = im.root[v->id];
    if (im.home[r] == Home::output && !handed.insert(r).second) outs.back() = outs.back().clone();
  }
  im.heap.assign(im.value_of.size(), Tensor());
  if (stats) {
    stats->seconds = seconds_since(t0);
    stats->arena_bytes = stats_.arena_bytes;
    stats->heap_peak_bytes = peak;
    stats->peak_bytes = stats_.arena_bytes + peak;
  }
  return outs;
}

}  // namespace tessel

namespace tessel {

std::string describe_plan(const GraphExecutable& exe) {
  const auto& reqs = exe.buffer_requests();
  const auto& vals = exe.buffer_values();
  std::vector<size_t> order(reqs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (exe.plan().offsets[a] != exe.plan().offsets[b]) return exe.plan().offsets[a] < exe.plan().offsets[b];
    return reqs[a].first < reqs[b].first;
  });
  std::string s = "| value | type | bytes | live steps | offset |\n|---|---|---|---|---|\n";
  for (size_t i : order)
    s += fmt::format("| %{} | {} | {} | {}-{} | {} |\n", vals[i]->name, vals[i]->type.str(), reqs[i].bytes, reqs[i].first,
                     reqs[i].last, exe.plan().offsets[i]);
  s += fmt::format("\narena: {} bytes (most bytes alive at one step, aligned: {})\n", exe.plan().size,
                   exe.plan().lower_bound);
  return s;
}

}  // namespace tessel
