// Bucketed runs on a dataflow target (see buckets.h).
#include "tessel/driver/buckets.h"

#include "tessel/support/threads.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "tessel/driver/compare.h"
#include "tessel/driver/compile_model.h"
#include "tessel/lower/lowering.h"
#include "tessel/ir/bind.h"
#include "tessel/ir/op_registry.h"
#include "tessel/passes/bucket.h"
#include "tessel/runtime/compiled_backend.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"
#include "tessel/support/escape.h"
#include "tessel/targets/dataflow/functional.h"

namespace tessel {
namespace {

// The leading block of `from` copied into the leading block of `to` (row-major, same rank): padding
// (to larger) or cutting (to smaller) along every dim at once.
void copy_block(const Tensor& from, Tensor& to) {
  const Shape& a = from.shape();
  const Shape& b = to.shape();
  Shape n(a.size());
  for (size_t d = 0; d < a.size(); ++d) n[d] = std::min(a[d], b[d]);
  if (a.empty()) {
    std::memcpy(to.bytes(), from.bytes(), static_cast<size_t>(dtype_size(from.dtype())));
    return;
  }
  if (shape_numel(n) == 0) return;
  const size_t es = static_cast<size_t>(dtype_size(from.dtype()));
  const std::vector<int64_t> sa = strides_of(a), sb = strides_of(b);
  std::vector<int64_t> idx(a.size() - 1, 0);
  const size_t row = static_cast<size_t>(n.back()) * es;
  while (true) {
    int64_t oa = 0, ob = 0;
    for (size_t d = 0; d + 1 < a.size(); ++d) oa += idx[d] * sa[d], ob += idx[d] * sb[d];
    std::memcpy(to.bytes() + ob * static_cast<int64_t>(es), from.bytes() + oa * static_cast<int64_t>(es), row);
    size_t d = idx.size();
    while (d > 0 && ++idx[d - 1] == n[d - 1]) idx[--d] = 0;
    if (d == 0) break;
  }
}

Tensor resized(const Tensor& t, const Shape& s) {
  Tensor out(t.dtype(), s);  // zero-filled
  copy_block(t, out);
  return out;
}

double graph_flops(const Graph& g) {
  double f = 0;
  for (const auto& n : g.nodes()) f += op_cost(*n).flops;
  return f;
}

}  // namespace

BucketReport run_buckets(const std::string& model, const hw::HwSpec& hw, const std::vector<std::vector<Tensor>>& inputs,
                         const std::vector<std::string>& names, const BucketOptions& opts) {
  if (opts.buckets.empty()) throw Error(Location{.file = model, .pass = "bucket"}, "no buckets given");
  ImportedModel imported = import_model_file(model, {}, true);
  const std::unique_ptr<Graph> source = instantiate_graph(*imported.graph, {});  // the eager oracle's graph
  lower::Lowering lowering(PassOptions{});
  lowering.graph_passes(*imported.graph, "core");
  const Graph& core = *imported.graph;
  BucketReport r;
  r.model = model;
  r.target = hw.name;
  r.buckets = opts.buckets;
  r.symbol = opts.symbol;
  const std::vector<std::string> syms = graph_symbols(core);
  if (r.symbol.empty()) {
    if (syms.size() != 1)
      throw Error(Location{.file = model, .pass = "bucket"},
                  fmt::format("the model has {} size symbols ({}): name the one to pad", syms.size(), fmt::join(syms, ", ")));
    r.symbol = syms[0];
  } else if (std::find(syms.begin(), syms.end(), r.symbol) == syms.end()) {
    throw Error(Location{.file = model, .pass = "bucket"},
                fmt::format("the model has no size symbol '{}' (it has: {})", display_text(r.symbol), fmt::join(syms, ", ")));
  }
  // One compilation per bucket and binding of the other symbols.
  struct Compiled {
    BucketedGraph bucketed;
    DataflowRun run;
    double flops = 0;
    std::unique_ptr<CompiledExecutable> cpu;  // the padded graph on the host (BucketOptions::cpu)
  };
  CompiledBackendOptions co;
  co.threads = std::max(1, opts.threads);
  std::unique_ptr<CompiledExecutable> cpu_symbolic;
  if (opts.cpu) {
    const auto t0 = std::chrono::steady_clock::now();
    cpu_symbolic = compile_cpu(instantiate_graph(*source, {}), {}, co);
    r.cpu_symbolic_compile_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Best of `repeat` calls, in ms.
  auto best_ms = [&](CompiledExecutable& exe, const std::vector<Tensor>& ins) {
    double best = 1e300;
    for (int i = 0; i < std::max(1, opts.cpu_repeat); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      exe.run(ins);
      best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  std::map<std::pair<int64_t, Bindings>, Compiled> compiled;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const std::vector<Tensor>& ins = inputs[k];
    std::vector<Shape> shapes;
    for (const Tensor& t : ins) shapes.push_back(t.shape());
    Bindings b;
    if (std::string why = bind_symbols(core, shapes, b); !why.empty())
      throw Error(Location{.file = names[k], .pass = "guard"}, why);
    BucketRow row;
    row.data_set = names[k];
    row.binding = binding_str(b);
    row.length = b.at(r.symbol);
    row.bucket = choose_bucket(opts.buckets, row.length);
    Bindings others = b;
    others.erase(r.symbol);
    auto key = std::make_pair(row.bucket, others);
    auto it = compiled.find(key);
    if (it == compiled.end()) {
      Compiled c;
      c.bucketed = pad_to_bucket(core, r.symbol, row.bucket, others);
      c.flops = graph_flops(*c.bucketed.graph);
      std::unique_ptr<Graph> g = instantiate_graph(*c.bucketed.graph, {});
      KernelModule km = lower::Lowering(PassOptions{}).fuse(std::move(g));
      c.run = simulate_dataflow(compile_dataflow(std::move(km), hw, opts.map));
      if (opts.cpu) c.cpu = compile_cpu(instantiate_graph(*c.bucketed.graph, {}), {}, co);
      it = compiled.emplace(key, std::move(c)).first;
      ++r.compilations;
    }
    const Compiled& c = it->second;
    row.masks = c.bucketed.masks;
    row.sim_us = c.run.report.sim_us;
    row.pad_fraction = static_cast<double>(row.bucket - row.length) / static_cast<double>(row.bucket);
    row.flops_padded = c.flops;
    row.flops = graph_flops(*instantiate_graph(core, b));
    // Inputs zero-padded to the bucket along the symbol's dims, the mask last.
    std::vector<Tensor> padded;
    for (size_t i = 0; i < ins.size(); ++i) padded.push_back(resized(ins[i], c.bucketed.graph->inputs[i]->type.shape));
    Tensor valid(DType::boolean, {row.bucket});
    for (int64_t p = 0; p < row.length; ++p) valid.set_i(p, 1);
    padded.push_back(valid);
    // Outputs (padded ones cut back to the length) within max_rel of eager's on the unpadded inputs.
    std::vector<Tensor> want;
    auto agrees = [&](const std::vector<Tensor>& got, double max_rel, double* worst) {
      if (want.empty()) want = run_eager(*source, ins);
      Tolerance tol;
      tol.max_rel = max_rel;
      bool ok = want.size() == got.size();
      for (size_t i = 0; ok && i < want.size(); ++i) {
        const Comparison cmp = compare_tensors(resized(got[i], want[i].shape()), want[i], tol);
        ok = cmp.match;
        if (worst) *worst = std::max(*worst, cmp.rel);
      }
      return ok;
    };
    if (opts.cpu) {
      row.cpu_symbolic_ms = best_ms(*cpu_symbolic, ins);
      row.cpu_bucket_ms = best_ms(*c.cpu, padded);
      row.ok = agrees(cpu_symbolic->run(ins), 1e-4, nullptr) && agrees(c.cpu->run(padded), 1e-4, nullptr);
    }
    if (opts.functional) {
      dataflow::FunctionalOptions fo;
      fo.threads = resolve_threads(opts.threads);
      dataflow::FunctionalResult fr = dataflow::run_functional(c.run.compile.program, c.run.compile.module, padded, fo);
      const DType st = c.run.compile.program.float_dtype;
      row.tolerance = st == DType::bf16 ? 5e-2 : st == DType::f32 ? 1e-4 : 2e-2;
      row.rel_err = 0;
      row.ok = agrees(fr.outputs, row.tolerance, &row.rel_err) && row.ok;
    }
    r.rows.push_back(row);
  }
  return r;
}

std::string bucket_table(const BucketReport& r) {
  std::string t = fmt::format("{} on {}: symbol {} padded to buckets {} ({} compilation{})\n", display_text(r.model), r.target,
                              r.symbol, fmt::join(r.buckets, ","), r.compilations, r.compilations == 1 ? "" : "s");
  t += fmt::format("{:<28} {:<22} {:>7} {:>7} {:>8} {:>10} {:>11} {:>6} {:>10}  {}\n", "data set", "binding", "length", "bucket",
                   "padding", "FLOPs +", "sim us", "masks", "rel err", "check");
  bool cpu = false;
  for (const BucketRow& w : r.rows)
    t += fmt::format("{:<28} {:<22} {:>7} {:>7} {:>7.1f}% {:>9.1f}% {:>11.2f} {:>6} {:>10} {}\n", display_text(w.data_set),
                     w.binding, w.length, w.bucket, 100 * w.pad_fraction,
                     w.flops > 0 ? 100 * (w.flops_padded / w.flops - 1) : 0.0, w.sim_us, w.masks,
                     w.rel_err < 0 ? std::string("-") : fmt::format("{:.2e}", w.rel_err),
                     w.rel_err < 0 ? "not run" : w.ok ? "PASS" : fmt::format("FAIL (tolerance {:.0e})", w.tolerance));
  for (const BucketRow& w : r.rows) cpu = cpu || w.cpu_symbolic_ms >= 0;
  if (!cpu) return t;
  t += fmt::format("host CPU: one symbolic compilation ({:.2f} s) at each length vs a static compilation of each bucket\n",
                   r.cpu_symbolic_compile_s);
  t += fmt::format("{:<28} {:>7} {:>7} {:>13} {:>13} {:>9}\n", "data set", "length", "bucket", "symbolic ms", "bucket ms", "bucket/sym");
  for (const BucketRow& w : r.rows)
    t += fmt::format("{:<28} {:>7} {:>7} {:>13.3f} {:>13.3f} {:>9.2f}\n", display_text(w.data_set), w.length, w.bucket,
                     w.cpu_symbolic_ms, w.cpu_bucket_ms, w.cpu_bucket_ms / w.cpu_symbolic_ms);
  return t;
}

nlohmann::json bucket_json(const BucketReport& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const BucketRow& w : r.rows)
    rows.push_back({{"data_set", w.data_set}, {"binding", w.binding}, {"length", w.length}, {"bucket", w.bucket},
                    {"pad_fraction", w.pad_fraction}, {"flops", w.flops}, {"flops_padded", w.flops_padded},
                    {"sim_us", w.sim_us}, {"masks", w.masks}, {"rel_err", w.rel_err}, {"tolerance", w.tolerance}, {"ok", w.ok},
                    {"cpu_symbolic_ms", w.cpu_symbolic_ms}, {"cpu_bucket_ms", w.cpu_bucket_ms}});
  return {{"model", r.model}, {"target", r.target}, {"symbol", r.symbol}, {"buckets", r.buckets},
          {"compilations", r.compilations}, {"cpu_symbolic_compile_s", r.cpu_symbolic_compile_s}, {"rows", rows}};
}

}  // namespace tessel
