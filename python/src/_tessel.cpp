// tessel._tessel: the pybind11 extension behind the Python package. A graph builder (inputs,
// constants adopted from numpy buffers without copying, nodes by op name with attributes, TorchFallback
// nodes, outputs), the auto-repairs, the partitioner's report, a partitioned executable whose
// break nodes call back into Python, and the CUDA target's executable over device pointers. tessel::Error becomes tessel.TesselError. docs/python.md.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fmt/format.h>

#include "tessel/driver/dataflow.h"
#include "tessel/driver/explain.h"
#include "tessel/driver/html_report.h"
#include "tessel/driver/report.h"
#include "tessel/export/ktir.h"
#include "tessel/frontend/onnx/importer.h"
#include "tessel/hw/hw.h"
#include "tessel/targets/dataflow/functional.h"
#include "tessel/targets/dataflow/sim_engine.h"
#include "tessel/driver/matmul_floor.h"
#include "tessel/driver/optimizer.h"
#include "tessel/driver/train_step.h"
#include "tessel/runtime/compiled_backend.h"
#include "tessel/runtime/cuda_backend.h"
#include "tessel/targets/cuda/toolchain.h"
#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/ir/printer.h"
#include "tessel/ir/verifier.h"
#include "tessel/runtime/graph_backend.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/runtime/partition.h"
#include "tessel/support/error.h"
#include "tessel/support/escape.h"
#include "tessel/support/threads.h"
#include "tessel/support/version.h"

namespace py = pybind11;
using namespace tessel;

namespace {

DType parse_dtype(const std::string& name) {
  auto d = dtype_from_name(name);
  if (!d) throw Error(Location{.pass = "python"}, fmt::format("unknown dtype '{}'", name), true);
  return *d;
}

// The numpy dtype that holds a tessel dtype's bytes (bf16 travels as uint16).
py::dtype numpy_dtype(DType d) {
  switch (d) {
    case DType::f64: return py::dtype::of<double>();
    case DType::f32: return py::dtype::of<float>();
    case DType::f16: return py::dtype("float16");
    case DType::bf16: return py::dtype::of<uint16_t>();
    case DType::i64: return py::dtype::of<int64_t>();
    case DType::i32: return py::dtype::of<int32_t>();
    case DType::i16: return py::dtype::of<int16_t>();
    case DType::i8: return py::dtype::of<int8_t>();
    case DType::u8: return py::dtype::of<uint8_t>();
    case DType::boolean: return py::dtype::of<bool>();
    default:
      throw Error(Location{.pass = "python"}, fmt::format("dtype {} has no numpy form", dtype_name(d)), true);
  }
}

// A tensor over a C-contiguous numpy array's buffer, keeping the array alive (no copy).
Tensor from_array(const py::array& a, const std::string& dtype) {
  DType d = parse_dtype(dtype);
  if (!(a.flags() & py::array::c_style))
    throw Error(Location{.pass = "python"}, "array must be C-contiguous");
  if (a.itemsize() != dtype_size(d))
    throw Error(Location{.pass = "python"},
                fmt::format("array items are {} bytes but {} takes {}", a.itemsize(), dtype_name(d), dtype_size(d)));
  Shape s(a.shape(), a.shape() + a.ndim());
  auto* keep = new py::object(a);
  std::shared_ptr<void> owner(keep, [](void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(p);
  });
  return Tensor::adopt(d, s, owner, static_cast<uint8_t*>(const_cast<void*>(a.data())));
}

// A numpy array over a tensor's storage (shared, no copy) and its dtype name.
py::tuple to_array(const Tensor& t) {
  if (!t.valid() && t.numel() != 0) return py::make_tuple(py::none(), "");
  auto* keep = new Tensor(t);
  py::capsule base(keep, [](void* p) { delete static_cast<Tensor*>(p); });
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t st = dtype_size(t.dtype());
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = st;
    st *= std::max<py::ssize_t>(shape[i], 1);
  }
  void* data = keep->valid() ? static_cast<void*>(keep->bytes()) : nullptr;
  if (!data) {
    // An empty tensor: numpy still wants a pointer; give it a fresh empty array.
    return py::make_tuple(py::array(numpy_dtype(t.dtype()), shape), std::string(dtype_name(t.dtype())));
  }
  return py::make_tuple(py::array(numpy_dtype(t.dtype()), shape, strides, data, base), std::string(dtype_name(t.dtype())));
}

using ArrayArgs = std::vector<std::pair<py::array, std::string>>;

// (array, dtype) pairs from Python as tensors over their memory, and results as (array, dtype) tuples.
std::vector<Tensor> tensors_of(const ArrayArgs& inputs) {
  std::vector<Tensor> ins;
  for (const auto& [a, d] : inputs) ins.push_back(from_array(a, d));
  return ins;
}

py::list arrays_of(const std::vector<Tensor>& ts) {
  py::list result;
  for (const Tensor& t : ts) result.append(to_array(t));
  return result;
}

// A size from Python (docs/dynamic-shapes.md): an int, or a Dim's text form ("s0", "2*s0", "s0+1").
Dim dim_of(const py::handle& h, const std::string& what) {
  if (py::isinstance<py::str>(h)) {
    const std::string text = py::cast<std::string>(h);
    size_t pos = 0;
    std::optional<Dim> d = parse_dim(text, pos);
    if (!d || pos != text.size())
      throw Error(Location{.pass = "python"}, fmt::format("{}: '{}' is not a size (an int, or an expression of size "
                                                          "symbols such as s0, 2*s0, s0+1)", what, text));
    return *d;
  }
  if (py::isinstance<py::bool_>(h) || !py::isinstance<py::int_>(h))
    throw Error(Location{.pass = "python"},
                fmt::format("{}: {} is not a size (an int or a size expression)", what, py::str(py::repr(h)).cast<std::string>()));
  return Dim(py::cast<int64_t>(h));
}

Dims dims_of_list(const py::handle& list, const std::string& what) {
  Dims d;
  size_t i = 0;
  for (const py::handle h : list) d.push_back(dim_of(h, fmt::format("{} entry {}", what, i++)));
  return d;
}

// A size for Python: an int when static, its text when symbolic.
py::object py_dim(const Dim& d) {
  if (d.is_static()) return py::int_(d.constant_term());
  return py::str(d.str());
}

py::list py_dims(const Dims& ds) {
  py::list l;
  for (const Dim& d : ds) l.append(py_dim(d));
  return l;
}

bool has_str(const py::handle& list) {
  if (!py::isinstance<py::list>(list) && !py::isinstance<py::tuple>(list)) return false;
  for (const py::handle h : list)
    if (py::isinstance<py::str>(h)) return true;
  return false;
}

Attr to_attr(const OpDef& op, const std::string& name, const py::handle& v) {
  const AttrSpec* spec = nullptr;
  for (const auto& s : op.attrs)
    if (s.name == name) spec = &s;
  if (!spec) throw Error(Location{.op = op.name, .pass = "python"}, fmt::format("{} has no attribute '{}'", op.name, name));
  switch (spec->kind) {
    case AttrKind::i: return py::cast<int64_t>(v);
    case AttrKind::f: return py::cast<double>(v);
    case AttrKind::s: return py::cast<std::string>(v);
    case AttrKind::ints:
      // A list of sizes with a symbolic entry (a Sizes node's dims): a Dims attribute.
      if (has_str(v)) return dims_attr(dims_of_list(v, fmt::format("{} attribute '{}'", op.name, name)));
      return py::cast<std::vector<int64_t>>(v);
    case AttrKind::floats: return py::cast<std::vector<double>>(v);
    case AttrKind::strings: return py::cast<std::vector<std::string>>(v);
    case AttrKind::tensor: {
      auto t = py::cast<py::tuple>(v);
      return from_array(py::cast<py::array>(t[0]), py::cast<std::string>(t[1])).clone();
    }
    case AttrKind::dims: break;  // never a schema's kind: a symbolic list is given where ints are
  }
  throw Error(Location{}, "unreachable");
}

class Builder {
 public:
  explicit Builder(const std::string& name) : g_(std::make_unique<Graph>()) { g_->name = name; }

  Graph& graph() {
    if (!g_) throw Error(Location{.pass = "python"}, "the builder's graph was already built into an executable");
    return *g_;
  }
  Value* value(const std::string& name) {
    Value* v = graph().find_value(name);
    if (!v) throw Error(Location{.pass = "python"}, fmt::format("no value named '{}'", name));
    return v;
  }
  // dims: ints and size expressions over declared symbols ("s0", "2*s0").
  std::string input(const std::string& name, const std::string& dtype, const py::sequence& shape) {
    Dims dims = dims_of_list(shape, fmt::format("input '{}' shape", name));
    for (const Dim& d : dims)
      for (const std::string& s : d.symbols())
        if (!graph().symbols.find(s))
          throw Error(Location{.pass = "python"}, fmt::format("input '{}' dim {} names size symbol '{}', which is not declared "
                                                              "(declare_symbol first)", name, d.str(), s));
    return graph().add_input(graph().unique_name(name), TensorType::of(parse_dtype(dtype), dims))->name;
  }
  void declare_symbol(const std::string& name, int64_t lo, int64_t hi, int64_t multiple_of) {
    graph().symbols.declare(SymbolInfo{name, lo, hi, multiple_of});
  }
  py::list symbols() { return symbol_list(graph().symbols); }
  static py::list symbol_list(const SymbolTable& t) {
    py::list l;
    for (const auto& [name, s] : t.all()) l.append(py::make_tuple(name, s.lo, s.hi, s.multiple_of));
    return l;
  }
  std::string constant(const std::string& name, const py::array& a, const std::string& dtype) {
    return graph().add_constant(graph().unique_name(name), from_array(a, dtype))->name;
  }
  std::vector<std::string> node(const std::string& opname, const std::string& name,
                                const std::vector<std::optional<std::string>>& inputs, int outputs, const py::dict& attrs) {
    const OpDef* op = OpRegistry::get().find(opname);
    if (!op) throw Error(Location{.node = name, .op = opname, .pass = "python"}, fmt::format("no tessel op named '{}'", opname));
    std::map<std::string, Attr> a;
    for (auto kv : attrs) {
      std::string k = py::cast<std::string>(kv.first);
      try {
        a[k] = to_attr(*op, k, kv.second);
      } catch (const py::cast_error&) {
        throw Error(Location{.node = name, .op = opname, .pass = "python"},
                    fmt::format("attribute '{}' has the wrong kind", k));
      }
    }
    return add(op, name, inputs, outputs, std::move(a));
  }
  std::vector<std::string> fallback(const std::string& name, const std::string& target, const std::string& reason,
                                    const std::vector<std::optional<std::string>>& inputs,
                                    const std::vector<std::pair<std::string, Shape>>& out_types) {
    std::vector<std::string> dtypes;
    std::vector<int64_t> ranks, dims;
    for (const auto& [dt, s] : out_types) {
      parse_dtype(dt);
      dtypes.push_back(dt);
      ranks.push_back(static_cast<int64_t>(s.size()));
      dims.insert(dims.end(), s.begin(), s.end());
    }
    std::map<std::string, Attr> a{{"target", target}, {"out_dtypes", dtypes}, {"out_ranks", ranks}, {"out_shapes", dims}};
    if (!reason.empty()) a["reason"] = reason;
    return add(torch_fallback_op(), name, inputs, static_cast<int>(out_types.size()), std::move(a));
  }
  void set_outputs(const std::vector<std::string>& names) {
    graph().outputs.clear();
    for (const auto& n : names) graph().outputs.push_back(value(n));
  }
  void infer() { infer_graph(graph()); }
  // (dtype, dims): ints for static dims (-1: unknown), strings for symbolic ones ("s0", "64*s0").
  py::tuple type(const std::string& name) {
    const Value* v = value(name);
    return py::make_tuple(std::string(dtype_name(v->type.dtype)), py_dims(v->type.dims()));
  }
  std::optional<py::tuple> known(const std::string& name) {
    const Value* v = value(name);
    if (v->constant) return to_array(*v->constant);
    return std::nullopt;
  }
  std::string text(bool elide) {
    PrintOptions po;
    po.elide_constants = elide;
    return print_graph(graph(), po);
  }
  std::vector<std::tuple<std::string, std::string, std::string>> repair() {
    std::vector<std::tuple<std::string, std::string, std::string>> out;
    for (auto& r : repair_breaks(graph())) out.emplace_back(r.pattern, r.node, r.detail);
    return out;
  }
  std::string explain() {
    PartitionPlan plan = partition_graph(graph());
    return json_dump(explain_json(plan, {}));
  }
  std::unique_ptr<Graph> take() {
    graph();
    return std::move(g_);
  }

 private:
  std::vector<std::string> add(const OpDef* op, const std::string& name, const std::vector<std::optional<std::string>>& inputs,
                               int outputs, std::map<std::string, Attr> attrs) {
    std::vector<Value*> ins;
    for (const auto& i : inputs) ins.push_back(i ? value(*i) : nullptr);
    while (!ins.empty() && !ins.back()) ins.pop_back();
    std::vector<std::string> outs;
    for (int k = 0; k < outputs; ++k) outs.push_back(graph().unique_name(outputs == 1 ? name : fmt::format("{}.{}", name, k)));
    graph().add_node(op, name, std::move(ins), outs, std::move(attrs));
    // Types as the node is added, so that the caller (the aten lowerings) can read them; the values
    // shape rules give (shape arithmetic: static, or symbolic as a Sizes node's) are kept for the
    // nodes after it. fold_limit 0: nothing is evaluated by a kernel here.
    infer_graph_from(graph(), graph().nodes().size() - 1, inferred_, 0);
    return outs;
  }
  std::unique_ptr<Graph> g_;
  InferResult inferred_;   // values inference knew while building (shape arithmetic, static or symbolic)
};

// The BreakRunner of tessel.compile's breaks: runner(node_name, op, inputs) -> list of (array, dtype) or
// None (PyTorch eager, python/tessel/_compile.py); none when runner is None.
BreakRunner break_runner(const py::object& runner) {
  if (runner.is_none()) return {};
  return [&runner](const Node& n, const std::vector<Tensor>& args) -> std::vector<Tensor> {
    py::gil_scoped_acquire gil;
    py::object r = runner(n.name, n.op_name(), arrays_of(args));
    if (r.is_none()) return {};
    std::vector<Tensor> outs;
    for (auto item : r) {
      auto t = py::cast<py::tuple>(item);
      outs.push_back(from_array(py::cast<py::array>(t[0]), py::cast<std::string>(t[1])));
    }
    return outs;
  };
}

class Executable {
 public:
  // aliases: per graph output, the graph input it may be written into (-1: none): a mutated input's new
  // value, written in place where the backend can (alias_counts says how many were).
  Executable(Builder& b, const std::string& backend, int threads, const std::vector<int>& aliases) {
    // Building and running set OpenMP's thread count only for their own duration (ScopedOmpThreads in
    // support/threads.h), so torch.get_num_threads(), which shares libgomp's count, comes back unchanged.
    PartitionedOptions po;
    po.backend = backend;
    po.threads = threads;
    po.output_aliases = aliases;
    std::unique_ptr<Graph> g = b.take();
    py::gil_scoped_release nogil;
    exe_ = PartitionedExecutable::build(std::move(g), po);
  }
  // inputs: (array, dtype) pairs; runner(node_name, op, inputs) -> list of (array, dtype) or None.
  py::list run(const std::vector<std::pair<py::array, std::string>>& inputs, const py::object& runner) {
    std::vector<Tensor> ins = tensors_of(inputs);
    const BreakRunner br = break_runner(runner);
    std::vector<Tensor> outs;
    {
      py::gil_scoped_release nogil;
      outs = exe_->run(ins, br);
    }
    return arrays_of(outs);
  }
  std::string explain() const { return json_dump(explain_json(exe_->plan(), {})); }
  double compile_seconds() const { return exe_->compile_seconds(); }
  py::dict alias_counts() const {
    const PartitionedExecutable::AliasCounts a = exe_->alias_counts();
    py::dict d;
    d["outputs_in_place"] = a.in_place;
    d["outputs_copied_back"] = a.copied_back;
    d["aliases_dropped"] = a.dropped;
    return d;
  }
  py::list symbols() const { return Builder::symbol_list(exe_->graph().symbols); }
  std::string text(bool elide) const {
    PrintOptions po;
    po.elide_constants = elide;
    return print_graph(exe_->graph(), po);
  }

 private:
  std::unique_ptr<PartitionedExecutable> exe_;
};

// A whole graph as one executable, not partitioned: tessel.compile's symbolic compilations (docs/python.md,
// "Dynamic shapes"), which have no graph break. The compiled backend compiles it once and instantiates
// it per binding of the size symbols; the eager interpreter binds them per call. A call whose shapes
// break the symbols' facts raises GuardFailure with the reason, on either backend.
class WholeExecutable {
 public:
  WholeExecutable(Builder& b, const std::string& backend, int threads, const std::vector<int>& aliases) {
    if (backend != "compiled" && backend != "eager")
      throw Error(Location{.pass = "python"},
                  fmt::format("backend '{}' does not take a whole symbolic graph (compiled or eager)", backend));
    std::unique_ptr<Graph> g = b.take();
    nodes_ = static_cast<int>(g->nodes().size());
    if (!g->nodes().empty()) {
      first_ = g->nodes().front()->name;
      last_ = g->nodes().back()->name;
    }
    if (backend == "eager") {
      graph_ = std::move(g);
      return;
    }
    CompiledBackendOptions co;
    co.threads = threads;
    co.model_name = g->name;
    // TESSEL_REBIND=0: an instance per binding instead of one executable rebound (docs/dynamic-shapes.md;
    // bench/decode_step.py compares the two)
    if (const char* r = std::getenv("TESSEL_REBIND"); r && std::string(r) == "0") co.rebind = false;
    co.output_aliases = aliases;
    co.optional_aliases = true;
    py::gil_scoped_release nogil;
    compiled_ = compile_cpu(std::move(g), {}, co);
  }
  py::list run(const std::vector<std::pair<py::array, std::string>>& inputs, const py::object&) {
    std::vector<Tensor> ins = tensors_of(inputs);
    std::vector<Tensor> outs;
    {
      py::gil_scoped_release nogil;
      // Either one raises GuardFailure for shapes outside the symbols' facts.
      outs = compiled_ ? compiled_->run(ins) : run_eager(*graph_, ins);
    }
    return arrays_of(outs);
  }
  const Graph& graph() const { return compiled_ ? compiled_->graph() : *graph_; }
  // The partitioner's report of one graph without breaks (what Explanation reads).
  std::string explain() const {
    const Graph& g = graph();
    nlohmann::json part{{"first", first_}, {"last", last_}, {"nodes", nodes_},
                        {"inputs", static_cast<int>(g.inputs.size())}, {"outputs", static_cast<int>(g.outputs.size())}};
    return json_dump(nlohmann::json{{"graphs", nlohmann::json::array({part})}, {"breaks", nlohmann::json::array()}});
  }
  py::dict stats() const {
    py::dict d;
    if (compiled_) {
      const CompiledCompileStats& s = compiled_->stats();
      d["symbols"] = s.symbols;
      d["instances"] = s.instances;
      d["instance_seconds"] = s.instance_seconds;
      d["dump_dir"] = s.dump_dir;
      d["rebinding"] = s.rebinding;
      d["rebind_refused"] = s.rebind_refused;
      d["rebinds"] = s.rebinds;
      d["rebind_seconds"] = s.rebind_seconds;
      d["kernels"] = s.kernels;
      d["compile_seconds"] = s.compile_seconds;
      d["outputs_in_place"] = s.graph.outputs_in_place;
      d["outputs_copied_back"] = s.graph.outputs_copied_back;
      d["aliases_dropped"] = s.graph.aliases_dropped;
    }
    return d;
  }
  py::list symbols() const { return Builder::symbol_list(graph().symbols); }

 private:
  std::unique_ptr<CompiledExecutable> compiled_;
  std::unique_ptr<Graph> graph_;
  int nodes_ = 0;
  std::string first_, last_;
};

// A dataflow target over a builder's graph (docs/python.md, "Dataflow targets"): the graph lowered, fused
// and mapped to tiles for a preset or hardware file, simulated in time once (the report, the trace, the
// HTML page, the KTIR export), and every call run by the functional simulator, so the outputs hold what
// the device's storage precision holds. A graph with breaks runs partitioned (below).
class DataflowExecutable {
 public:
  // A graph with breaks (ops the frontend could not lower, run by PyTorch) is partitioned as the CPU
  // target does: each partition is mapped, simulated and run on the chip; the breaks run between them
  // as host steps, listed in the report (docs/python.md, "Dataflow targets").
  DataflowExecutable(Builder& b, const std::string& target, const std::string& dtype, int threads)
      : target_(target), threads_(threads) {
    dataflow::MapOptions mo;
    if (!dtype.empty()) {
      auto t = dtype_from_name(dtype);
      if (!t || (*t != DType::f16 && *t != DType::bf16 && *t != DType::f32))
        throw Error(Location{.pass = "python"}, fmt::format("dataflow storage dtype must be f16, bf16 or f32, not '{}'",
                                                            display_text(dtype)));
      mo.float_dtype = *t;
    }
    const hw::HwSpec hw = hw::resolve_target(target);
    std::unique_ptr<Graph> g = b.take();
    py::gil_scoped_release nogil;
    dataflow::SimOptions so;
    so.record_dram_samples = true;  // (the trace's DRAM track)
    bool breaks = false;
    for (const auto& n : g->nodes()) breaks = breaks || break_reason(*n).has_value();
    if (!breaks) {
      runs_.push_back(std::make_unique<DataflowRun>(simulate_dataflow(compile_dataflow(std::move(g), hw, mo), so)));
      kernels_.push_back(std::make_shared<dataflow::FunctionalKernels>());
      return;
    }
    graph_ = std::move(g);
    plan_ = partition_graph(*graph_);
    for (size_t k = 0; k < plan_.partitions.size(); ++k) {
      Partition& p = plan_.partitions[k];
      const Location at{.node = p.nodes.front()->name, .op = p.nodes.front()->op_name(),
                        .pass = fmt::format("map partition {}", k)};
      for (const Value* v : p.graph->inputs)
        if (!v->type.dims_defined())
          throw Error(at, fmt::format("input '{}' of this partition is {}, known only at run time (after a data-dependent "
                                      "graph break); a dataflow target maps static shapes",
                                      display_text(v->name), v->type.str()));
      try {
        runs_.push_back(std::make_unique<DataflowRun>(simulate_dataflow(compile_dataflow(std::move(p.graph), hw, mo), so)));
      } catch (const Error& e) {
        throw e.with_context(at);
      }
      kernels_.push_back(std::make_shared<dataflow::FunctionalKernels>());
    }
  }
  py::list run(const std::vector<std::pair<py::array, std::string>>& inputs, const py::object& runner) {
    std::vector<Tensor> ins = tensors_of(inputs);
    dataflow::FunctionalResult total;
    std::vector<Tensor> outs;
    {
      py::gil_scoped_release nogil;
      auto run_part = [&](size_t k, const std::vector<Tensor>& part_ins) {
        dataflow::FunctionalOptions fo;
        fo.threads = threads_;
        fo.kernels = kernels_[k];  // (generated and loaded by the first call only)
        dataflow::FunctionalResult fr = dataflow::run_functional(runs_[k]->compile.program, runs_[k]->compile.module, part_ins, fo);
        total.tiles_executed += fr.tiles_executed;
        total.host_steps += fr.host_steps;
        total.seconds += fr.seconds;
        total.flushed += fr.flushed + fr.entry_flushed;
        total.overflowed += fr.overflowed + fr.entry_overflowed;
        if (total.first_flush.empty()) total.first_flush = fr.first_flush;
        if (total.first_overflow.empty()) total.first_overflow = fr.first_overflow;
        return std::move(fr.outputs);
      };
      if (!graph_) outs = run_part(0, ins);
      else outs = run_partition_plan(*graph_, plan_, ins, run_part, break_runner(runner));
    }
    last_ = py::dict();
    last_["tiles"] = total.tiles_executed;
    last_["host_steps"] = total.host_steps + static_cast<int64_t>(plan_.breaks.size());
    last_["seconds"] = total.seconds;
    last_["flushed"] = total.flushed;
    last_["overflowed"] = total.overflowed;
    last_["first_flush"] = total.first_flush;
    last_["first_overflow"] = total.first_overflow;
    return arrays_of(outs);
  }
  // One partition: its report as `tessel sim --json` gives it. With breaks: the partitions' sums
  // (times, traffic, FLOPs, padding) at the top, every kernel (with its partition), each partition's
  // own report, and the breaks as host steps run by PyTorch (untimed).
  std::string report_json_text() const {
    if (!graph_) return json_dump(report_json(runs_[0]->report));
    nlohmann::json j = {{"target", target_}, {"partitions", nlohmann::json::array()}, {"kernels", nlohmann::json::array()},
                        {"breaks", nlohmann::json::array()}};
    std::vector<const DataflowReport*> parts;
    for (size_t k = 0; k < runs_.size(); ++k) {
      nlohmann::json pj = report_json(runs_[k]->report);
      for (nlohmann::json kj : pj["kernels"]) {
        kj["partition"] = k;
        j["kernels"].push_back(std::move(kj));
      }
      j["partitions"].push_back(std::move(pj));
      parts.push_back(&runs_[k]->report);
    }
    for (const GraphBreak& b : plan_.breaks)
      j["breaks"].push_back({{"node", b.location}, {"op", b.op}, {"reason", b.reason}, {"kind", break_kind_name(b.kind)},
                             {"after_partition", b.after_partition}, {"runs_on", "host (PyTorch)"}});
    // The whole model's figures, summed by sum_reports (report_json's names; the kernels above carry
    // their partition).
    nlohmann::json whole = report_json(sum_reports(parts));
    whole.erase("kernels"), whole.erase("target");
    whole["host_steps"] = whole["host_steps"].get<int64_t>() + static_cast<int64_t>(plan_.breaks.size());
    j.update(whole);
    return json_dump(j);
  }
  std::string table() const {
    if (!graph_) return report_table(runs_[0]->report);
    std::string s;
    for (const PartitionStep& st : plan_.steps) {
      if (st.is_break) {
        const GraphBreak& b = plan_.breaks[static_cast<size_t>(st.index)];
        s += fmt::format("host step (PyTorch, not timed): {} {} ({})\n\n", display_text(b.location), display_text(b.op), display_text(b.reason));
      } else {
        s += fmt::format("partition {} of {}, on the chip:\n", st.index, runs_.size());
        s += report_table(runs_[static_cast<size_t>(st.index)]->report) + "\n";
      }
    }
    return s;
  }
  std::string landscape() const {
    const DataflowRun& r = *whole("the landscape row");
    return json_dump(landscape_row(target_, r.compile, r.report));
  }
  // The Perfetto trace. With breaks: the partitions one after the other on one timeline (each one's
  // events shifted by the simulated time of those before it, tagged with their partition, their kernel
  // numbered as in report_json_text's kernel list: the partitions' kernels in partition order), and each
  // break an instant event on a "host" track where it runs (PyTorch, not timed: it takes no time here).
  std::string trace_json() const {
    if (!graph_) {
      const DataflowRun& r = *runs_[0];
      return dataflow::chrome_trace_json(r.sim.timeline.graph, r.compile.program.hw_spec(), r.sim.result);
    }
    const hw::HwSpec& hw = runs_[0]->compile.program.hw_spec();
    const int host_pid = static_cast<int>(hw.cores) + 2;  // (after the cores, DRAM and sync tracks)
    nlohmann::json events = nlohmann::json::array();
    nlohmann::json parts = nlohmann::json::array();
    std::set<std::string> meta;  // track names, once each
    std::vector<size_t> first_kernel(runs_.size() + 1, 0);  // per partition: its kernel 0 in the report's list
    for (size_t k = 0; k < runs_.size(); ++k) first_kernel[k + 1] = first_kernel[k] + runs_[k]->report.kernels.size();
    double at_us = 0, cycles = 0;
    for (const PartitionStep& st : plan_.steps) {
      if (st.is_break) {
        const GraphBreak& b = plan_.breaks[static_cast<size_t>(st.index)];
        events.push_back({{"name", "host step: " + b.op}, {"cat", "host"}, {"ph", "i"}, {"s", "p"}, {"pid", host_pid}, {"tid", 0},
                          {"ts", at_us},
                          {"args", {{"node", b.location}, {"reason", b.reason}, {"runs_on", "host (PyTorch), not timed"}}}});
        continue;
      }
      const DataflowRun& r = *runs_[static_cast<size_t>(st.index)];
      const nlohmann::json t = nlohmann::json::parse(dataflow::chrome_trace_json(r.sim.timeline.graph, hw, r.sim.result));
      for (nlohmann::json e : t.at("traceEvents")) {
        if (e.value("ph", "") == "M") {
          if (!meta.insert(e.dump()).second) continue;
        } else {
          if (e.contains("ts")) e["ts"] = e["ts"].get<double>() + at_us;
          if (e.value("ph", "") == "X") {
            e["args"]["partition"] = st.index;
            if (auto k = e["args"].find("kernel"); k != e["args"].end() && k->is_number_integer())
              *k = first_kernel[static_cast<size_t>(st.index)] + k->get<size_t>();
          }
        }
        events.push_back(std::move(e));
      }
      const double us = r.sim.result.cycles / (hw.clock_ghz * 1000.0);
      parts.push_back({{"partition", st.index}, {"start_us", at_us}, {"us", us}});
      at_us += us;
      cycles += r.sim.result.cycles;
    }
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", host_pid}, {"args", {{"name", "host (graph breaks, PyTorch)"}}}});
    return json_dump({{"displayTimeUnit", "ns"},
                      {"otherData", {{"hw", hw.name}, {"cycles", cycles}, {"clock_ghz", hw.clock_ghz}, {"partitions", parts}}},
                      {"traceEvents", events}});
  }
  // The HTML report. With breaks: the partitions' report (report_json_text) and trace (trace_json) as
  // one target; there is no landscape row (landscape_row describes one mapped graph).
  std::string html(const std::string& model) const {
    HtmlReportInput in;
    in.model = model;
    in.generator = "Generated by tessel " + version_text();
    if (!graph_) {
      const DataflowRun& r = *runs_[0];
      in.targets.push_back(html_target_report(target_, r));
      in.landscape.push_back(landscape_row(target_, r.compile, r.report));
      return render_html_report(in);
    }
    HtmlTargetReport tr = html_target_report(target_, *runs_[0]);  // (the chip's peaks)
    tr.report = nlohmann::json::parse(report_json_text());
    tr.trace = nlohmann::json::parse(trace_json());
    in.targets.push_back(std::move(tr));
    return render_html_report(in);
  }
  // The KTIR export into `folder` (docs/ktir.md, "The folder"): its manifest as JSON text.
  std::string ktir(const std::string& folder) const {
    const DataflowRun& r = *whole(".ktir()");
    const ktir::KtirExport e = ktir::export_ktir_kernels(r.compile.program, r.compile.module);
    return json_dump(ktir::write_ktir_folder(folder, r.compile.program, r.compile.module, e));
  }
  std::string storage() const {
    const tile::TileProgram& p = runs_[0]->compile.program;
    return fmt::format("{}{}", dtype_name(p.float_dtype), p.dl16 ? " (DL16)" : "");
  }
  std::string kernel_text() const {
    std::string s;
    for (size_t k = 0; k < runs_.size(); ++k) {
      if (graph_) s += fmt::format("# partition {} of {}\n", k, runs_.size());
      s += print_kernel_module(runs_[k]->compile.module, true);
    }
    return s;
  }
  py::dict last_run() const { return last_; }

 private:
  // The one mapped graph; a model with graph breaks has one per partition, which these views do not combine.
  const DataflowRun* whole(const char* what) const {
    if (graph_)
      throw Error(Location{.pass = "python"},
                  fmt::format("{} covers one graph mapped whole, and this model has {} graph break(s) run on the host between "
                              "{} partitions; .report and .report_table() cover them all",
                              what, plan_.breaks.size(), runs_.size()));
    return runs_[0].get();
  }
  std::string target_;
  int threads_ = 1;
  std::unique_ptr<Graph> graph_;       // with breaks: the graph the plan points into
  PartitionPlan plan_;
  std::vector<std::unique_ptr<DataflowRun>> runs_;   // one per partition (one: no break)
  std::vector<std::shared_ptr<dataflow::FunctionalKernels>> kernels_;
  py::dict last_;
};

// The CUDA target over a builder's graph (runtime/cuda_backend.h): run() takes the device addresses of the
// inputs and outputs (torch's data_ptr()) and the caller's stream (torch's cuda_stream) and returns without
// synchronising; run_host() is the host-tensor call (copies both ways, one synchronise). docs/python.md.
class PyCudaExecutable {
 public:
  PyCudaExecutable(Builder& b, const std::string& precision, bool cuda_graph) {
    CudaBackendOptions o;
    o.precision = cuda::parse_precision(precision);
    o.cuda_graph = cuda_graph;
    std::unique_ptr<Graph> g = b.take();
    o.model_name = g->name;
    py::gil_scoped_release nogil;
    exe_ = compile_cuda(std::move(g), {}, o);
  }
  void run(const std::vector<uint64_t>& inputs, const std::vector<uint64_t>& outputs, uint64_t stream) {
    py::gil_scoped_release nogil;
    exe_->run_device(inputs, outputs, stream);
  }
  py::list run_host(const std::vector<std::pair<py::array, std::string>>& inputs) {
    std::vector<Tensor> ins = tensors_of(inputs);
    std::vector<Tensor> outs;
    {
      py::gil_scoped_release nogil;
      outs = exe_->run(ins);
    }
    return arrays_of(outs);
  }
  static py::list types(const std::vector<TensorType>& ts) {
    py::list l;
    for (const TensorType& t : ts) l.append(py::make_tuple(std::string(dtype_name(t.dtype)), t.shape));
    return l;
  }
  py::list input_types() const { return types(exe_->input_types()); }
  py::list output_types() const { return types(exe_->output_types()); }
  // A symbolic module (docs/dynamic-shapes.md): binds the next run's input shapes (its steps made for them
  // when the binding is new) and returns that binding's output types, what the caller allocates.
  py::list bind(const std::vector<std::vector<int64_t>>& shapes) {
    {
      py::gil_scoped_release nogil;
      exe_->bind(shapes);
    }
    return output_types();
  }
  bool symbolic() const { return exe_->symbolic(); }
  py::dict stats() const {
    const CudaCompileStats& s = exe_->stats();
    py::dict d;
    d["compile_seconds"] = s.compile_seconds;
    d["nvrtc_seconds"] = s.nvrtc_seconds;
    d["cache_hit"] = s.cache_hit;
    d["device"] = s.device;
    d["arch"] = s.arch;
    d["precision"] = s.precision;
    d["kernels"] = s.kernels;
    d["cublaslt_matmuls"] = s.cublaslt_matmuls;
    d["direct_matmuls"] = s.direct_matmuls;
    d["im2col_convs"] = s.im2col_convs;
    d["timed_matmuls"] = s.timed_matmuls;
    d["retimed_algos"] = s.retimed_algos;
    d["matmul_timing_seconds"] = s.matmul_timing_seconds;
    d["host_steps"] = s.host_steps;
    d["host_ops"] = s.host_ops;
    d["arena_bytes"] = s.arena_bytes;
    d["weight_bytes"] = s.weight_bytes;
    d["uses_graph"] = exe_->uses_graph();
    d["symbols"] = s.symbols;
    d["rebinds"] = s.rebinds;
    d["rebind_seconds"] = s.rebind_seconds;
    return d;
  }
  double replay_ms(int iters) {
    py::gil_scoped_release nogil;
    return exe_->replay_ms(iters);
  }
  double recapture_ms(int iters) {
    py::gil_scoped_release nogil;
    return exe_->recapture_ms(iters);
  }
  const std::string& source() const { return exe_->source(); }
  py::list steps() const {
    py::list l;
    for (const CudaStepInfo& i : exe_->steps()) {
      py::dict d;
      d["name"] = i.name;
      d["kind"] = i.kind;
      d["how"] = i.how;
      d["bytes"] = i.bytes;
      d["flops"] = i.flops;
      d["epilogue"] = i.epilogue;
      l.append(d);
    }
    return l;
  }

 private:
  std::unique_ptr<CudaExecutable> exe_;
};

// What a training step's forward saved for its backward: tessel tensors kept on the C++ side (no copy
// into Python and back).
struct Saved {
  std::vector<Tensor> tensors;
};

// A compiled training step (driver/train_step.h) over a builder's graph: forward returns the outputs
// and the saved tensors, backward the gradients of the named inputs. docs/training.md.
class PyTrainStep {
 public:
  PyTrainStep(Builder& b, const std::vector<std::string>& wrt, const std::string& backend, int threads) {
    TrainStepOptions o;
    o.train.wrt = wrt;
    o.backend = backend;
    o.threads = threads;
    std::unique_ptr<Graph> g = b.take();
    py::gil_scoped_release nogil;
    step_ = TrainStep::build(std::move(g), o);
  }
  py::tuple forward(const std::vector<std::pair<py::array, std::string>>& inputs) {
    std::vector<Tensor> ins = tensors_of(inputs);
    auto saved = std::make_shared<Saved>();
    std::vector<Tensor> outs;
    {
      py::gil_scoped_release nogil;
      outs = step_->forward(ins, saved->tensors);
    }
    return py::make_tuple(arrays_of(outs), saved);
  }
  py::list backward(const Saved& saved, const std::vector<std::pair<py::array, std::string>>& inputs,
                    const std::pair<py::array, std::string>& seed) {
    std::vector<Tensor> ins = tensors_of(inputs);
    Tensor sd = from_array(seed.first, seed.second);
    std::vector<Tensor> grads;
    {
      py::gil_scoped_release nogil;
      grads = step_->backward(saved.tensors, ins, sd);
    }
    return arrays_of(grads);
  }
  std::vector<std::string> input_names() const { return step_->input_names(); }
  std::vector<std::string> parameters() const { return step_->info().parameters; }
  std::string summary() const { return train_summary(step_->info()); }
  int64_t saved_bytes() const { return step_->info().partition.saved_bytes; }
  // The matmul floor of one half (driver/matmul_floor.h): its fp32 matmuls alone through oneDNN.
  py::dict matmul_floor(const std::string& which, int threads, int iters) const {
    const Graph& g = which == "forward" ? step_->forward_graph() : step_->backward_graph();
    if (which != "forward" && which != "backward")
      throw Error(Location{.pass = "python"}, fmt::format("no '{}' half: forward or backward", which));
    FloorResult r;
    {
      py::gil_scoped_release nogil;
      r = measure_matmul_floor(g, threads, iters);
    }
    py::dict d;
    d["matmuls"] = r.matmuls;
    d["gflop"] = r.flops / 1e9;
    d["median_ms"] = r.median_ms;
    d["p10_ms"] = r.p10_ms;
    d["p90_ms"] = r.p90_ms;
    d["shapes"] = r.shapes;
    d["impls"] = r.impls;
    d["summary"] = floor_summary(r);
    return d;
  }
  std::string text(const std::string& which) const {
    PrintOptions po;
    po.elide_constants = true;
    if (which == "forward") return print_graph(step_->forward_graph(), po);
    if (which == "backward") return print_graph(step_->backward_graph(), po);
    if (which == "joint") return print_graph(step_->joint_graph(), po);
    throw Error(Location{.pass = "python"}, fmt::format("no '{}' graph: forward, backward or joint", which));
  }

 private:
  static std::vector<Tensor> tensors(const std::vector<std::pair<py::array, std::string>>& inputs) {
    std::vector<Tensor> ins = tensors_of(inputs);
    return ins;
  }
  std::unique_ptr<TrainStep> step_;
};

// An optimizer step (driver/optimizer.h) compiled by the compiled backend: run(scalars, tensors) takes
// the step's scalars and per parameter (p, g, state...), writes the new p and state over the arrays
// given for them (optimizer_output_aliases) and returns them.
class PyOptimizer {
 public:
  PyOptimizer(const std::string& kind, const std::vector<Shape>& shapes, const py::dict& hyper, int threads) {
    spec_.kind = kind;
    spec_.shapes = shapes;
    for (auto kv : hyper) {
      const std::string k = py::cast<std::string>(kv.first);
      if (k == "beta1") spec_.beta1 = py::cast<double>(kv.second);
      else if (k == "beta2") spec_.beta2 = py::cast<double>(kv.second);
      else if (k == "eps") spec_.eps = py::cast<double>(kv.second);
      else if (k == "momentum") spec_.momentum = py::cast<double>(kv.second);
      else if (k == "dampening") spec_.dampening = py::cast<double>(kv.second);
      else if (k == "nesterov") spec_.nesterov = py::cast<bool>(kv.second);
      else if (k == "weight_decay") spec_.weight_decay = py::cast<double>(kv.second);
      else throw Error(Location{.pass = "python"}, fmt::format("optimizer {}: no hyperparameter '{}'", kind, k));
    }
    std::unique_ptr<Graph> g = build_optimizer_graph(spec_);
    text_ = print_graph(*g);
    CompiledBackendOptions co;
    co.threads = threads;
    co.model_name = g->name;
    co.output_aliases = optimizer_output_aliases(spec_);  // p and the state updated in place
    py::gil_scoped_release nogil;
    exe_ = compile_cpu(std::move(g), {}, co);
  }
  py::list run(const std::vector<double>& scalars, const std::vector<std::pair<py::array, std::string>>& tensors) {
    std::vector<Tensor> ins;
    for (double v : scalars) ins.push_back(Tensor::from_f64(DType::f32, {}, std::vector<double>{v}));
    for (Tensor& t : tensors_of(tensors)) ins.push_back(std::move(t));
    std::vector<Tensor> outs;
    {
      py::gil_scoped_release nogil;
      outs = exe_->run(ins);
    }
    return arrays_of(outs);
  }
  std::vector<double> scalars(double lr, int64_t t) const { return optimizer_scalar_values(spec_, lr, t); }
  int kernels() const { return exe_->stats().kernels; }
  int loop_kernels() const { return exe_->stats().loop_kernels; }
  int outputs_in_place() const { return exe_->stats().graph.outputs_in_place; }
  int state_count() const { return optimizer_state_count(spec_); }
  const std::string& text() const { return text_; }

 private:
  OptimizerSpec spec_;
  std::string text_;  // the step's core graph as built (before the backend's passes)
  std::unique_ptr<CompiledExecutable> exe_;
};

}  // namespace

PYBIND11_MODULE(_tessel, m) {
  m.doc() = "tessel's C++ core: graph builder, partitioner, repairs and partitioned executables";
  m.attr("__version__") = version_text();  // the same text as `tessel --version` (support/version.h)
  static py::exception<Error> tessel_error(m, "TesselError", PyExc_RuntimeError);
  static py::exception<GuardFailure> guard_error(m, "GuardFailure", tessel_error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const GuardFailure& e) {  // (PyErr_SetString: exception::operator() is deprecated in pybind11 2.12)
      PyErr_SetString(guard_error.ptr(), e.what());
    } catch (const Error& e) {
      PyErr_SetString(tessel_error.ptr(), e.what());
    }
  });

  py::class_<Builder>(m, "GraphBuilder")
      .def(py::init<const std::string&>(), py::arg("name") = "main")
      .def("input", &Builder::input, py::arg("name"), py::arg("dtype"), py::arg("shape"),
           "a graph input; shape entries are ints or size expressions over declared symbols ('s0', '2*s0')")
      .def("declare_symbol", &Builder::declare_symbol, py::arg("name"), py::arg("lo") = 1,
           py::arg("hi") = int64_t{1} << 31, py::arg("multiple_of") = 1,
           "declares a size symbol with its facts: every value in [lo, hi] and a multiple of multiple_of")
      .def("symbols", &Builder::symbols, "the declared size symbols: (name, lo, hi, multiple_of)")
      .def("constant", &Builder::constant, py::arg("name"), py::arg("array"), py::arg("dtype"),
           "a constant over the array's buffer (kept alive, not copied)")
      .def("node", &Builder::node, py::arg("op"), py::arg("name"), py::arg("inputs"), py::arg("outputs") = 1,
           py::arg("attrs") = py::dict())
      .def("fallback", &Builder::fallback, py::arg("name"), py::arg("target"), py::arg("reason"), py::arg("inputs"),
           py::arg("out_types"))
      .def("set_outputs", &Builder::set_outputs)
      .def("infer", &Builder::infer)
      .def("type", &Builder::type)
      .def("known", &Builder::known, "the value's contents when it is a constant, else None")
      .def("text", &Builder::text, py::arg("elide_constants") = true)
      .def("repair", &Builder::repair)
      .def("explain", &Builder::explain);

  py::class_<Executable>(m, "Executable")
      .def(py::init<Builder&, const std::string&, int, const std::vector<int>&>(), py::arg("builder"),
           py::arg("backend") = "compiled", py::arg("threads") = 0, py::arg("aliases") = std::vector<int>{})
      .def_property_readonly("alias_counts", &Executable::alias_counts,
                             "output aliases written in place, copied back over their input, dropped")
      .def("run", &Executable::run, py::arg("inputs"), py::arg("runner") = py::none())
      .def("explain", &Executable::explain)
      .def("text", &Executable::text, py::arg("elide_constants") = true)
      .def_property_readonly("compile_seconds", &Executable::compile_seconds)
      .def_property_readonly("symbols", &Executable::symbols, "the graph's size symbols: (name, lo, hi, multiple_of)");

  py::class_<DataflowExecutable>(m, "DataflowExecutable")
      .def(py::init<Builder&, const std::string&, const std::string&, int>(), py::arg("builder"), py::arg("target"),
           py::arg("dtype") = "", py::arg("threads") = 1)
      .def("run", &DataflowExecutable::run, py::arg("inputs"), py::arg("runner") = py::none())
      .def("report_json", &DataflowExecutable::report_json_text, "the timed simulation's report (tessel sim --json)")
      .def("table", &DataflowExecutable::table, "the report as tessel sim prints it")
      .def("landscape_row", &DataflowExecutable::landscape, "this target's row of tessel landscape --json")
      .def("trace_json", &DataflowExecutable::trace_json, "the Perfetto / chrome://tracing trace of the timed simulation")
      .def("html", &DataflowExecutable::html, py::arg("model"), "the HTML report page (tessel report) of this target")
      .def("ktir", &DataflowExecutable::ktir, py::arg("folder"), "writes the KTIR export; returns its manifest (JSON)")
      .def("kernel_text", &DataflowExecutable::kernel_text)
      .def_property_readonly("storage", &DataflowExecutable::storage)
      .def_property_readonly("last_run", &DataflowExecutable::last_run, "the last call's functional-simulation figures");
  py::class_<WholeExecutable>(m, "WholeExecutable")
      .def(py::init<Builder&, const std::string&, int, const std::vector<int>&>(), py::arg("builder"),
           py::arg("backend") = "compiled", py::arg("threads") = 0, py::arg("aliases") = std::vector<int>{})
      .def("run", &WholeExecutable::run, py::arg("inputs"), py::arg("runner") = py::none())
      .def("explain", &WholeExecutable::explain)
      .def_property_readonly("stats", &WholeExecutable::stats,
                             "compiled backend: symbols, instances (bindings instantiated), instance_seconds, rebinding (one executable "
                             "rebound per binding), rebind_refused, rebinds, rebind_seconds, kernels, "
                             "compile_seconds")
      .def_property_readonly("symbols", &WholeExecutable::symbols, "the graph's size symbols: (name, lo, hi, multiple_of)");

  py::class_<PyCudaExecutable>(m, "CudaExecutable")
      .def(py::init<Builder&, const std::string&, bool>(), py::arg("builder"), py::arg("precision") = "f32",
           py::arg("cuda_graph") = true)
      .def("run", &PyCudaExecutable::run, py::arg("inputs"), py::arg("outputs"), py::arg("stream"),
           "device addresses of the inputs and outputs, the caller's cudaStream_t as an integer; no host synchronisation")
      .def("run_host", &PyCudaExecutable::run_host, py::arg("inputs"))
      .def("replay_ms", &PyCudaExecutable::replay_ms, py::arg("iters") = 20)
      .def("recapture_ms", &PyCudaExecutable::recapture_ms, py::arg("iters") = 5)
      .def_property_readonly("input_types", &PyCudaExecutable::input_types)
      .def_property_readonly("output_types", &PyCudaExecutable::output_types)
      .def("bind", &PyCudaExecutable::bind, py::arg("shapes"),
           "a model with size symbols: binds the next run's input shapes and returns that binding's output types")
      .def_property_readonly("symbolic", &PyCudaExecutable::symbolic)
      .def_property_readonly("stats", &PyCudaExecutable::stats)
      .def_property_readonly("source", &PyCudaExecutable::source)
      .def_property_readonly("steps", &PyCudaExecutable::steps, "per step, as `tessel bench --target cuda` lists them: name, kind, how, bytes, flops, epilogue");
  m.def("cuda_device", [] {
    const cuda::DeviceInfo& d = cuda::device_info();
    return py::make_tuple(d.usable, d.usable ? d.name : d.why);
  }, "(usable, the device's name or why not) of CUDA device 0; a build without CUDA says so");

  py::class_<Saved, std::shared_ptr<Saved>>(m, "SavedTensors")
      .def("__len__", [](const Saved& s) { return s.tensors.size(); })
      .def_property_readonly("nbytes", [](const Saved& s) {
        int64_t n = 0;
        for (const Tensor& t : s.tensors) n += t.numel() * static_cast<int64_t>(dtype_size(t.dtype()));
        return n;
      });

  py::class_<PyTrainStep>(m, "TrainStep")
      .def(py::init<Builder&, const std::vector<std::string>&, const std::string&, int>(), py::arg("builder"),
           py::arg("wrt"), py::arg("backend") = "compiled", py::arg("threads") = 0)
      .def("forward", &PyTrainStep::forward, py::arg("inputs"))
      .def("backward", &PyTrainStep::backward, py::arg("saved"), py::arg("inputs"), py::arg("seed"))
      .def("text", &PyTrainStep::text, py::arg("which") = "joint")
      .def("matmul_floor", &PyTrainStep::matmul_floor, py::arg("which"), py::arg("threads") = 2, py::arg("iters") = 20)
      .def_property_readonly("input_names", &PyTrainStep::input_names)
      .def_property_readonly("parameters", &PyTrainStep::parameters)
      .def_property_readonly("summary", &PyTrainStep::summary)
      .def_property_readonly("saved_bytes", &PyTrainStep::saved_bytes);

  py::class_<PyOptimizer>(m, "OptimizerStep")
      .def(py::init<const std::string&, const std::vector<Shape>&, const py::dict&, int>(), py::arg("kind"),
           py::arg("shapes"), py::arg("hyper") = py::dict(), py::arg("threads") = 0)
      .def("run", &PyOptimizer::run, py::arg("scalars"), py::arg("tensors"))
      .def("scalars", &PyOptimizer::scalars, py::arg("lr"), py::arg("step"))
      .def_property_readonly("kernels", &PyOptimizer::kernels)
      .def_property_readonly("loop_kernels", &PyOptimizer::loop_kernels)
      .def_property_readonly("outputs_in_place", &PyOptimizer::outputs_in_place,
                             "outputs written straight over the parameters and state (the rest are copied over them)")
      .def_property_readonly("state_count", &PyOptimizer::state_count)
      .def("text", &PyOptimizer::text, "the step's core graph (tessel text) as built");

  m.def("ops", [] {
    std::vector<std::string> names;
    for (const OpDef* d : OpRegistry::get().all()) names.push_back(d->name);
    return names;
  });
  m.def("hardware_threads", [] { return resolve_threads(0); });
  m.def("hw_presets", [] { return hw::preset_names(); }, "the dataflow hardware presets' names");
  m.def("write_tensor_pb", [](const py::array& a, const std::string& dtype, const std::string& name, const std::string& path) {
        write_tensor_pb(from_array(a, dtype), name, path);
      }, py::arg("array"), py::arg("dtype"), py::arg("name"), py::arg("path"),
      "an ONNX TensorProto file (a model-zoo data set's input_N.pb / output_N.pb)");

  // Size arithmetic for the converter (support/sym.h): sizes are ints or Dim texts ("s0", "64*s0").
  m.def("dim_binary", [](const std::string& op, const py::object& a, const py::object& b) -> py::object {
    const Dim x = dim_of(a, "size"), y = dim_of(b, "size");
    if (op == "add") return py_dim(x + y);
    if (op == "sub") return py_dim(x - y);
    if (op == "mul") return py_dim(x * y);
    if (op == "div") {
      std::optional<Dim> q = exact_div(x, y);
      return q ? py_dim(*q) : py::object(py::none());
    }
    throw Error(Location{.pass = "python"}, fmt::format("no size operation '{}' (add, sub, mul, div)", op));
  }, py::arg("op"), py::arg("a"), py::arg("b"),
        "a op b over sizes (ints or size expressions); div is exact division for every value of the symbols, "
        "else None");
  m.def("dim_nonneg", [](const py::object& a) { return provably_nonneg(dim_of(a, "size")); }, py::arg("a"),
        "whether the size expression is >= 0 for every value of its symbols (>= 1 each); sound, not complete");
  m.def("dim_eval", [](const py::object& a, const std::map<std::string, int64_t>& b) {
    return dim_of(a, "size").eval(b);
  }, py::arg("a"), py::arg("bindings"));
  m.def("dim_symbols", [](const py::object& a) { return dim_of(a, "size").symbols(); }, py::arg("a"));
}
