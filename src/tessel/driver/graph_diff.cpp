// Differential testing of random graphs (see graph_diff.h): backends, the comparison policy, batching
// several graphs into one compiled module, and the minimiser.
#include "tessel/ir/core_ops.h"
#include "tessel/driver/graph_diff.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <set>

#include "tessel/hw/hw.h"
#include "tessel/ir/bind.h"
#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/ir/printer.h"
#include "tessel/kernel/kernel.h"
#include "tessel/passes/pass.h"
#include "tessel/runtime/compiled_backend.h"
#include "tessel/runtime/graph_backend.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"
#include "tessel/targets/dataflow/functional.h"
#include "tessel/targets/dataflow/map.h"
#include "tessel/tile/tile.h"

namespace tessel::randgraph {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool is_sim(const std::string& backend) { return backend != "graph" && backend != "compiled" && backend != "symbolic"; }

// Copies src's inputs, constants, nodes and outputs into dst with names prefixed; returns dst's
// values for src's outputs.
std::vector<Value*> append_graph(Graph& dst, const Graph& src, const std::string& prefix) {
  std::map<const Value*, Value*> map;
  for (const auto& [name, info] : src.symbols.all()) dst.symbols.declare(info);
  for (const Value* v : src.inputs) map[v] = dst.add_input(prefix + v->name, v->type);
  for (const Value* v : src.constants()) map[v] = dst.add_constant(prefix + v->name, *v->constant);
  for (const auto& n : src.nodes()) {
    std::vector<Value*> ins;
    for (const Value* v : n->inputs) ins.push_back(v ? map.at(v) : nullptr);
    std::vector<std::string> names;
    for (const Value* v : n->outputs) names.push_back(v ? prefix + v->name : "");
    Node* c = dst.add_node(n->op, prefix + n->name, ins, names, n->attrs);
    for (size_t i = 0; i < n->outputs.size(); ++i) {
      if (!n->outputs[i]) continue;
      c->outputs[i]->type = n->outputs[i]->type;
      map[n->outputs[i]] = c->outputs[i];
    }
  }
  std::vector<Value*> outs;
  for (const Value* v : src.outputs) outs.push_back(map.at(v));
  return outs;
}

// ---- comparison ------------------------------------------------------------------------------

std::string fmt_value(double v) { return std::isnan(v) ? "nan" : fmt::format("{:.9g}", v); }

}  // namespace

std::string compare_output(const Tensor& ref, const Tensor& got, const Policy& p) {
  if (ref.dtype() != got.dtype() || ref.shape() != got.shape())
    return fmt::format("type {}{} vs eager {}{}", dtype_name(got.dtype()), shape_str(got.shape()), dtype_name(ref.dtype()),
                       shape_str(ref.shape()));
  if (!is_float(ref.dtype())) {
    for (int64_t i = 0; i < ref.numel(); ++i)
      if (ref.get_i(i) != got.get_i(i)) return fmt::format("element {}: {} vs eager {}", i, got.get_i(i), ref.get_i(i));
    return "";
  }
  double m = 0;
  for (int64_t i = 0; i < ref.numel(); ++i)
    if (std::isfinite(ref.get_f(i))) m = std::max(m, std::fabs(ref.get_f(i)));
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double r = ref.get_f(i), x = got.get_f(i);
    bool ok;
    if (std::isnan(r) || std::isnan(x)) ok = std::isnan(r) && std::isnan(x);
    else if (std::isinf(r) || std::isinf(x)) ok = r == x;
    else ok = std::fabs(x - r) <= p.rtol * std::fabs(r) + p.atol * m;
    if (!ok) return fmt::format("element {}: {} vs eager {} (max |eager| {})", i, fmt_value(x), fmt_value(r), fmt_value(m));
  }
  return "";
}

bool at_f32_range_edge(const Graph& g, const std::vector<Tensor>& inputs) {
  auto extreme = [](const Tensor& t) {
    if (!is_float(t.dtype())) return false;
    for (int64_t i = 0; i < t.numel(); ++i)
      if (std::isfinite(t.get_f(i)) && std::fabs(t.get_f(i)) >= 0x1p60) return true;
    return false;
  };
  for (const Tensor& t : inputs)
    if (extreme(t)) return true;
  for (const Value* v : g.constants())
    if (extreme(*v->constant)) return true;
  // A product's partial results leave f32's range (then 0 * inf = NaN) where eager's double ones do
  // not, though the final product is in range: when the factors' exponents could sum past f32's in
  // some order (conservatively over the whole operand).
  auto product_range = [](const Tensor& t) {
    double up = 0, down = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double a = std::fabs(t.get_f(i));
      if (!std::isfinite(a) || a == 0) continue;
      (a > 1 ? up : down) += std::log2(a);
    }
    return up > 120 || down < -120;
  };
  // every intermediate, as eager computes it
  auto all = g.clone();
  all->outputs.clear();
  // Ops that square their operand inside one node (eager squares in double, the core forms in f32): a
  // magnitude below 2^-60 squares to 0 in f32 (ReduceL2 of 1e-30 is 0, not 1e-30).
  auto tiny = [](const Tensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double a = std::fabs(t.get_f(i));
      if (a != 0 && a < 0x1p-60) return true;
    }
    return false;
  };
  static const std::set<std::string> squaring = {"ReduceL2", "ReduceSumSquare", "LayerNormalization"};
  enum class Check { value, product, square };
  std::vector<Check> check;
  for (const auto& n : all->nodes()) {
    const bool prod = n->op_name() == "ReduceProd" || (is_core_op(*n, CoreOp::reduce) && n->attr_s("kind", "") == "prod");
    for (Value* v : n->outputs)
      if (v) all->outputs.push_back(v), check.push_back(Check::value);
    if (!n->inputs.empty() && n->inputs[0] && (prod || squaring.count(n->op_name())))
      all->outputs.push_back(n->inputs[0]), check.push_back(prod ? Check::product : Check::square);
  }
  const std::vector<Tensor> vals = run_eager(*all, inputs);
  for (size_t i = 0; i < vals.size(); ++i) {
    if (extreme(vals[i])) return true;
    if (!is_float(vals[i].dtype())) continue;
    if (check[i] == Check::product && product_range(vals[i])) return true;
    if (check[i] == Check::square && tiny(vals[i])) return true;
  }
  return false;
}

namespace {

// ---- the backends ------------------------------------------------------------------------------

struct SimRun {
  std::vector<Tensor> outputs;
  int64_t range_events = 0;   // results flushed to zero or overflowed to inf by the storage, inputs overflowed
  DType storage = DType::f32;
  bool dl16 = false;
};

SimRun run_sim(const Graph& g, const std::vector<Tensor>& inputs, const std::string& target, const DiffOptions& o) {
  auto core = g.clone();
  run_pipeline(*core, parse_pipeline("core"), PassOptions{});
  KernelModule km = fuse(std::move(core));
  const hw::HwSpec hw = hw::load_preset(target);
  const tile::TileProgram p = dataflow::map_to_tiles(km, hw);
  dataflow::FunctionalOptions fo;
  fo.toolchain = o.toolchain;
  dataflow::FunctionalResult fr = dataflow::run_functional(p, km, inputs, fo);
  // overflow on entry too: a constant folded on the host (in f32) may be beyond the storage range
  return {std::move(fr.outputs), fr.flushed + fr.overflowed + fr.entry_overflowed, p.float_dtype, p.dl16};
}

std::string judge(const Graph& g, uint64_t seed, const std::string& backend, std::vector<Tensor> inputs,
                  const std::vector<Tensor>& got, const SimRun& sim, CampaignStats* stats);

// The symbolic mode: `g` (symbolize's graph, its symbols at their lowest values in `inputs`) compiled
// once and run at those values, and again with every symbol 3 more (fresh inputs): that second run is
// judged here, a difference thrown as an error; a third run at the first values must give the first
// run's bits; the first run's outputs are returned to be judged.
std::vector<Tensor> run_symbolic(const Graph& g, const std::vector<Tensor>& inputs, const DiffOptions& o) {
  CompiledBackendOptions co;
  co.threads = 1;
  co.toolchain = o.toolchain;
  auto exe = compile_cpu(g.clone(), {}, co);
  std::vector<Tensor> first = exe->run(inputs);
  Bindings other;
  for (const auto& [name, info] : g.symbols.all()) other[name] = info.lo + 3;
  const auto bound = instantiate_graph(g, other);
  const uint64_t seed = 0x5eed + inputs.size();
  const std::vector<Tensor> again = random_inputs(*bound, seed, o.gen.special_values);
  const std::string d = judge(*bound, seed, "compiled", again, exe->run(again), SimRun{}, nullptr);
  if (!d.empty()) throw Error(Location{.pass = "symbolic"}, fmt::format("with every symbol 3 more: {}", d));
  // back to the first binding (the rebound executable redoes what the symbols size): the same bits
  const std::vector<Tensor> back = exe->run(inputs);
  for (size_t i = 0; i < first.size() && i < back.size(); ++i)
    if (!back[i].same_as(first[i]))
      throw Error(Location{.pass = "symbolic"}, fmt::format("output {} differs when the first sizes come back", i));
  return first;
}

std::vector<Tensor> run_backend(const Graph& g, const std::vector<Tensor>& inputs, const std::string& backend,
                                const DiffOptions& o, SimRun* sim = nullptr) {
  if (backend == "graph") return compile_graph(g.clone(), inputs)->run(inputs);
  if (backend == "compiled") {
    CompiledBackendOptions co;
    co.threads = 1;
    co.toolchain = o.toolchain;
    return compile_cpu(g.clone(), inputs, co)->run(inputs);
  }
  if (backend == "symbolic") return run_symbolic(g, inputs, o);
  SimRun r = run_sim(g, inputs, backend, o);
  if (sim) *sim = r;
  return r.outputs;
}

// f32 values as the device stores them.
Tensor round_storage(const Tensor& t, DType storage, bool dl16) {
  if (t.dtype() != DType::f32) return t;
  Tensor c = t.clone();
  float* d = c.data<float>();
  for (int64_t i = 0; i < c.numel(); ++i) d[i] = dl16 && storage == DType::f16 ? dataflow::round_to_dl16(d[i]) : dataflow::round_to_dtype(d[i], storage);
  return c;
}

// The graph with its f32 constants rounded to the storage (what the simulator computes with).
std::unique_ptr<Graph> rounded_constants(const Graph& g, DType storage, bool dl16) {
  auto c = g.clone();
  for (Value* v : c->constants()) v->constant = round_storage(*v->constant, storage, dl16);
  return c;
}

// The f32 values of `t` scaled by (1 + k eps), k in {-1, 0, 1} per element.
Tensor perturbed(const Tensor& t, double eps, Rng& r) {
  Tensor c = t.clone();
  if (c.dtype() == DType::f32) {
    float* d = c.data<float>();
    for (int64_t i = 0; i < c.numel(); ++i) d[i] = static_cast<float>(d[i] * (1 + eps * static_cast<double>(r.uniform(-1, 1))));
  }
  return c;
}

// Eager with every input, constant and node result perturbed by one rounding at `eps` (node by node):
// a probe of the graph's conditioning at the precision a backend stores its intermediates in.
std::vector<Tensor> eager_probe(const Graph& g, const std::vector<Tensor>& in, double eps, uint64_t salt) {
  Rng r(salt);
  std::map<const Value*, Tensor> val;
  for (size_t i = 0; i < g.inputs.size(); ++i) val[g.inputs[i]] = perturbed(in[i], eps, r);
  for (const Value* v : g.constants()) val[v] = perturbed(*v->constant, eps, r);
  for (const auto& n : g.nodes()) {
    std::vector<const Tensor*> ins;
    for (const Value* v : n->inputs) ins.push_back(v ? &val.at(v) : nullptr);
    std::vector<Tensor> outs = run_node(*n, ins);
    for (size_t i = 0; i < n->outputs.size(); ++i)
      if (n->outputs[i]) val[n->outputs[i]] = perturbed(outs[i], eps, r);
  }
  std::vector<Tensor> out;
  for (const Value* v : g.outputs) out.push_back(val.at(v));
  return out;
}

// The first real difference between a backend's outputs `got` for `g` and eager's, or empty: NaN/inf
// placement and values under the backend's policy, outputs that are ill-conditioned at its precision or
// at f32's range edge excepted (and counted in `stats`). For a simulator, the reference is eager on the
// inputs and constants rounded to its storage.
std::string judge(const Graph& g, uint64_t seed, const std::string& backend, std::vector<Tensor> inputs,
                  const std::vector<Tensor>& got, const SimRun& sim, CampaignStats* stats) {
  const Policy p = policy_for(backend);
  const Graph* ref_graph = &g;
  std::unique_ptr<Graph> rounded;
  const std::vector<Tensor> given = inputs;
  if (is_sim(backend)) {
    for (Tensor& t : inputs) t = round_storage(t, sim.storage, sim.dl16);
    rounded = rounded_constants(g, sim.storage, sim.dl16);
    ref_graph = rounded.get();
  }
  std::vector<Tensor> ref = run_eager(*ref_graph, inputs);
  if (got.size() != ref.size()) return fmt::format("{} outputs vs eager {}", got.size(), ref.size());
  // The simulator's outputs are what its storage holds (subnormals, DL16's flush): so are the references.
  auto stored = [&](std::vector<Tensor> v) {
    if (rounded)
      for (Tensor& t : v) t = round_storage(t, sim.storage, sim.dl16);
    return v;
  };
  ref = stored(std::move(ref));
  std::optional<bool> edge;
  std::vector<std::vector<Tensor>> probes, host_folded;
  for (size_t i = 0; i < ref.size(); ++i) {
    const std::string d = compare_output(ref[i], got[i], p);
    if (d.empty()) continue;
    if (rounded) {
      // The core pipeline may fold a computation on constants on the host, in f32, before the device
      // rounds anything: eager with the constants as given is a reference too.
      if (host_folded.empty()) host_folded.push_back(stored(run_eager(g, inputs)));
      if (compare_output(host_folded[0][i], got[i], p).empty()) continue;
    }
    // (the simulator's kernels keep scalar constants and fused intermediates in fp32: the graph as given
    // counts too, before its storage turned 1e30 into inf)
    if (!edge) edge = at_f32_range_edge(*ref_graph, inputs) || (rounded && at_f32_range_edge(g, given));
    // An output whose every value lies below f32's normal range (eager's double gives Softplus(-96) =
    // 2.3e-42; f32 arithmetic gives 0, log(1 + 2.3e-42) being log 1): at the range edge too.
    auto subnormal = [](const Tensor& t) {
      if (t.dtype() != DType::f32) return false;
      for (int64_t k = 0; k < t.numel(); ++k)
        if (!std::isfinite(t.get_f(k)) || std::fabs(t.get_f(k)) >= 0x1p-126) return false;
      return true;
    };
    if ((*edge || subnormal(ref[i])) && ref[i].dtype() == got[i].dtype() && ref[i].shape() == got[i].shape()) {  // types only
      if (stats) stats->f32_range[backend]++;
      continue;
    }
    // Is output i itself sensitive to rounding at this precision? Then the difference is not a bug.
    if (probes.empty())
      for (uint64_t k = 1; k <= 2; ++k) probes.push_back(stored(eager_probe(*ref_graph, inputs, p.eps, seed * 31 + k)));
    bool ill = false;
    for (const auto& pr : probes) ill = ill || !compare_output(ref[i], pr[i], p).empty();
    if (ill) {
      if (stats) stats->ill_conditioned[backend]++;
      continue;
    }
    return fmt::format("output {} ({}): {}", i, g.outputs[i]->name, d);
  }
  return "";
}

// One backend on one graph, alone: the finding, or nothing when it agrees with eager (judge).
std::optional<Finding> check_one(const Graph& g, uint64_t seed, const std::string& backend, const DiffOptions& o,
                                 CampaignStats* stats) {
  const std::vector<Tensor> inputs = random_inputs(g, seed, o.gen.special_values);
  Finding f{seed, backend, "", ""};
  std::vector<Tensor> got;
  SimRun sim;
  try {
    got = run_backend(g, inputs, backend, o, &sim);
  } catch (const std::exception& e) {
    f.detail = fmt::format("error: {}", e.what());
  }
  if (f.detail.empty()) {
    if (is_sim(backend) && sim.range_events > 0) {  // values the storage cannot hold: only "it ran" is checked
      if (stats) stats->out_of_range[backend]++;
      return std::nullopt;
    }
    f.detail = judge(g, seed, backend, inputs, got, sim, stats);
  }
  if (f.detail.empty()) return std::nullopt;
  f.tsl = finding_text(g, seed, backend + ": " + f.detail);
  return f;
}

struct Case {
  uint64_t seed;
  std::unique_ptr<Graph> graph;
  std::vector<Tensor> inputs, eager;
};

// One backend over a batch: one union graph (one compilation), every graph's outputs compared; a
// graph that differs, or a batch that fails as a whole, is checked again alone (check_one).
void run_batch(std::vector<Case>& cases, const std::string& backend, const DiffOptions& o, CampaignStats& st,
               const std::function<void(const Finding&)>& on_finding) {
  std::vector<size_t> suspects;
  if (backend == "graph" || cases.size() == 1) {
    for (size_t i = 0; i < cases.size(); ++i) suspects.push_back(i);  // cheap: each alone
  } else {
    Graph u;
    u.name = "batch";
    std::vector<Tensor> inputs;
    std::vector<size_t> first_output;
    for (size_t i = 0; i < cases.size(); ++i) {
      first_output.push_back(u.outputs.size());
      for (Value* v : append_graph(u, *cases[i].graph, fmt::format("g{}_", i))) u.outputs.push_back(v);
      inputs.insert(inputs.end(), cases[i].inputs.begin(), cases[i].inputs.end());
    }
    first_output.push_back(u.outputs.size());
    try {
      SimRun sim;
      std::vector<Tensor> got = run_backend(u, inputs, backend, o, &sim);
      ++st.compilations;
      for (size_t i = 0; i < cases.size(); ++i) {
        std::vector<Tensor> mine(got.begin() + static_cast<int64_t>(first_output[i]),
                                 got.begin() + static_cast<int64_t>(first_output[i + 1]));
        // A graph that differs is run again alone (the batch's storage range events are not known per
        // graph, and a finding must not depend on its batch); the others' exceptions are counted here.
        CampaignStats counts;
        if (judge(*cases[i].graph, cases[i].seed, backend, cases[i].inputs, mine, sim, &counts).empty()) {
          for (const auto& [b, n] : counts.f32_range) st.f32_range[b] += n;
          for (const auto& [b, n] : counts.ill_conditioned) st.ill_conditioned[b] += n;
        } else {
          suspects.push_back(i);
        }
      }
    } catch (const std::exception&) {
      for (size_t i = 0; i < cases.size(); ++i) suspects.push_back(i);
    }
  }
  for (size_t i : suspects) {
    if (auto f = check_one(*cases[i].graph, cases[i].seed, backend, o, &st)) {
      st.findings.push_back(*f);
      if (on_finding) on_finding(*f);
    }
  }
  st.compared[backend] += static_cast<int>(cases.size());
}

}  // namespace

Policy policy_for(const std::string& backend) {
  // graph: core ops compute in double and round once, like eager, but decompositions reorder the
  // arithmetic (mean = sum * 1/n, softmax via max/exp/sum): a few f32 ulps. compiled: f32 arithmetic
  // in generated code (tessel_rt's math functions, <= 4 ulp), oneDNN's own summation order.
  if (backend == "graph") return {"graph", 1e-5, 1e-6, 0x1p-23};
  if (backend == "compiled" || backend == "symbolic") return {backend, 1e-4, 1e-5, 0x1p-23};
  // The simulator stores every kernel's results in f16 (DL16 on spyre: 9 fraction bits) or bf16 (7)
  // and computes in fp32: a few roundings of the storage's unit roundoff along a chain.
  if (backend == "tpu-v5e") return {backend, 0x1p-8 * 8, 0x1p-8 * 8, 0x1p-8};
  return {backend, 0x1p-10 * 16, 0x1p-10 * 16, 0x1p-10};
}

std::string finding_text(const Graph& g, uint64_t seed, const std::string& note) {
  std::string n = note;
  for (char& ch : n)
    if (ch == '\n' || ch == '\r') ch = ' ';
  PrintOptions po;
  po.inline_limit = 1 << 20;
  return fmt::format("# randgraph seed={}\n# {}\n{}", seed, n, print_graph(g, po));
}

uint64_t seed_of_text(const std::string& text) {
  const std::string key = "# randgraph seed=";
  const size_t at = text.find(key);
  if (at == std::string::npos) return 0;
  return std::strtoull(text.c_str() + at + key.size(), nullptr, 10);
}

std::vector<Finding> check_graph(const Graph& g, uint64_t seed, const DiffOptions& opts) {
  std::vector<Finding> out;
  for (const std::string& b : opts.backends)
    if (auto f = check_one(g, seed, b, opts, nullptr)) out.push_back(*f);
  return out;
}

CampaignStats run_campaign(uint64_t first_seed, int count, const DiffOptions& opts,
                           const std::function<void(const Finding&)>& on_finding) {
  CampaignStats st;
  const auto t0 = Clock::now();
  const int batch = std::max(1, opts.batch);
  for (int start = 0; start < count; start += batch) {
    std::vector<Case> cases;
    const auto te = Clock::now();
    for (int i = start; i < std::min(count, start + batch); ++i) {
      Case c;
      c.seed = first_seed + static_cast<uint64_t>(i);
      c.graph = random_graph(c.seed, opts.gen);
      c.inputs = random_inputs(*c.graph, c.seed, opts.gen.special_values);
      ++st.graphs;
      try {
        c.eager = run_eager(*c.graph, c.inputs);
      } catch (const std::exception& e) {
        ++st.eager_errors;
        Finding f{c.seed, "eager", fmt::format("error: {}", e.what()), ""};
        f.tsl = finding_text(*c.graph, c.seed, "eager: " + f.detail);
        st.findings.push_back(f);
        if (on_finding) on_finding(f);
        continue;
      }
      cases.push_back(std::move(c));
    }
    st.seconds["eager"] += since(te);
    for (const std::string& b : opts.backends) {
      const auto tb = Clock::now();
      if (b == "symbolic") {
        // The graphs that hold for other sizes, each with a symbol of its own (the batch binds them all).
        std::vector<Case> sym;
        for (const Case& c : cases)
          if (auto g = symbolize(*c.graph, fmt::format("s{}", c.seed))) sym.push_back({c.seed, std::move(g), c.inputs, c.eager});
        st.not_symbolic += static_cast<int>(cases.size() - sym.size());
        run_batch(sym, b, opts, st, on_finding);
      } else {
        run_batch(cases, b, opts, st, on_finding);
      }
      st.seconds[b] += since(tb);
    }
  }
  st.seconds_total = since(t0);
  return st;
}

// ---- minimiser ---------------------------------------------------------------------------------

namespace {

// Removes nodes nothing uses and inputs and constants nothing reads.
void prune(Graph& g) {
  for (bool changed = true; changed;) {
    std::vector<int> uses = g.use_counts();
    const size_t before = g.nodes().size();
    g.erase_nodes_if([&](const Node& n) {
      for (const Value* v : n.outputs)
        if (v && uses[static_cast<size_t>(v->id)] > 0) return false;
      return true;
    });
    changed = g.nodes().size() != before;
    g.compact();
  }
  std::vector<int> uses = g.use_counts();
  std::vector<Value*> kept;
  for (Value* v : g.inputs) {
    if (uses[static_cast<size_t>(v->id)] > 0) kept.push_back(v);
    else v->is_input = false;
  }
  g.inputs = kept;
  g.compact();
}

bool still_fails(const Graph& g, uint64_t seed, const std::string& backend, const DiffOptions& o) {
  if (g.outputs.empty()) return false;
  try {
    run_eager(g, random_inputs(g, seed, o.gen.special_values));
  } catch (const std::exception&) {
    return false;  // a candidate the reference refuses is not a smaller failure
  }
  return check_one(g, seed, backend, o, nullptr).has_value();
}

// Candidate: `g` with output k dropped.
std::unique_ptr<Graph> drop_output(const Graph& g, size_t k) {
  auto c = g.clone();
  c->outputs.erase(c->outputs.begin() + static_cast<int64_t>(k));
  prune(*c);
  return c;
}

// Candidate: `g` with node k's output 0 replaced by a new input of its type (cutting off what
// computed it).
std::unique_ptr<Graph> cut_node(const Graph& g, size_t k) {
  auto c = g.clone();
  const Node& n = *c->nodes()[k];
  Value* v = n.outputs[0];
  if (!v || v->type.dtype != DType::f32) return nullptr;
  Value* in = c->add_input(c->unique_name(v->name + "_cut"), v->type);
  c->replace_all_uses(v, in);
  prune(*c);
  return c;
}

}  // namespace

std::unique_ptr<Graph> minimise(const Graph& g, uint64_t seed, const std::string& backend, const DiffOptions& opts) {
  auto best = g.clone();
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t k = 0; k < best->outputs.size() && best->outputs.size() > 1; ++k) {
      auto c = drop_output(*best, k);
      if (still_fails(*c, seed, backend, opts)) {
        best = std::move(c);
        progress = true;
        --k;
      }
    }
    for (size_t k = 0; k < best->nodes().size(); ++k) {
      auto c = cut_node(*best, k);
      if (c && c->nodes().size() < best->nodes().size() && still_fails(*c, seed, backend, opts)) {
        best = std::move(c);
        progress = true;
        k = static_cast<size_t>(-1);
      }
    }
  }
  return best;
}

}  // namespace tessel::randgraph
