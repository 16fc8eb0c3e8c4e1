// The matmul floor: a model's fp32 dot_general nodes as oneDNN matmuls, timed back to back.
#include "tessel/ir/core_ops.h"
#include "tessel/driver/matmul_floor.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>

#include "tessel/driver/compile_model.h"
#include "tessel/driver/model_dir.h"
#include "tessel/frontend/onnx/importer.h"
#include "tessel/ir/graph.h"
#include "tessel/ir/op_registry.h"
#include "tessel/kernel/kernel.h"
#include "tessel/lower/cpu.h"
#include "tessel/passes/pass.h"
#include "tessel/support/error.h"
#include "tessel/support/threads.h"
#include "tessel/targets/cpu/dnnl_ops.h"
#include "tessel/targets/cpu/library_epilogue.h"

namespace tessel {
namespace {

using Clock = std::chrono::steady_clock;

// A constant reached through views that only relabel or repeat its elements: the backend packs it.
bool is_constant_operand(const Value* v) {
  while (v && !v->constant) {
    const Node* p = v->producer;
    if (!p || !p->has_input(0)) return false;
    const std::optional<CoreOp> op = p->op->core;
    if (op != CoreOp::reshape && op != CoreOp::broadcast_in_dim && op != CoreOp::transpose) return false;
    v = p->inputs[0];
  }
  return v != nullptr;
}

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

double quantile(const std::vector<double>& sorted, double q) {
  size_t i = static_cast<size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(i, sorted.size() - 1)];
}

struct Job {
  std::vector<float> a, b, c;
  std::unique_ptr<cpu::Matmul> mm;
  std::unique_ptr<cpu::Conv2d> conv;  // or a convolution: a = its input, c = its result
};

}  // namespace

FloorResult measure_matmul_floor(const Graph& core_graph, int threads, int iters) {
  const Location loc{.pass = "matmul floor"};
  if (threads < 1) throw Error(loc, fmt::format("threads = {} must be at least 1", threads));
  if (iters < 1) throw Error(loc, fmt::format("iters = {} must be at least 1", iters));
  if (!cpu::dnnl_available()) throw Error(loc, "oneDNN has no usable CPU engine here", true);
  ScopedOmpThreads scope(threads);  // restored on every exit path
  FloorResult r;
  r.threads = threads;
  std::mt19937 rng(1234);
  std::vector<Job> jobs;
  std::map<std::string, int> impls;
  for (const auto& n : core_graph.nodes()) {
    if (!is_core_op(*n, CoreOp::dot_general)) continue;
    std::optional<cpu::MatmulDesc> d = cpu::dot_general_matmul(*n);
    if (!d) continue;  // not fp32, or unknown dims
    Job j;
    const bool shared = d->b_batch == 0;
    j.a = random_floats(static_cast<size_t>(d->batch * d->M * d->K), rng);
    j.b = random_floats(static_cast<size_t>((shared ? 1 : d->batch) * d->K * d->N), rng);
    j.c.assign(static_cast<size_t>(d->batch * d->M * d->N), 0.0f);
    const bool packed = is_constant_operand(n->inputs[1]);
    if (packed) d->constant_b = j.b.data();
    try {
      j.mm = std::make_unique<cpu::Matmul>(*d);
    } catch (const Error& e) {
      throw e.with_context(Location{.node = n->name, .op = "dot_general", .pass = "matmul floor"});
    }
    ++impls[j.mm->impl()];
    r.shapes.push_back(
        fmt::format("{}{}  {}", cpu::matmul_str(*d), packed ? " packed" : "", n->name));
    r.flops += 2.0 * static_cast<double>(d->batch * d->M) * static_cast<double>(d->N * d->K);
    jobs.push_back(std::move(j));
  }
  r.matmuls = static_cast<int>(jobs.size());
  // The convolutions as the compiled backend runs them: the CPU lowering's conv kernels (layouts as
  // fusion decided them), each a cpu::Conv2d over its constant weights, without the epilogue (a convnet's
  // floor is mostly these: issue 37).
  lower::CpuOptions lo;
  lo.pipeline = "";  // (core_graph is past the graph passes)
  lo.codegen = false;
  lo.stages.verify = false;
  const lower::CpuLowered low = lower::lower_cpu(core_graph.clone(), lo);
  for (const auto& n : low.module.graph->nodes()) {
    if (!is_kernel_node(*n)) continue;
    const Kernel& k = low.module.kernels.at(static_cast<size_t>(n->attr_i("kernel")));
    if (k.kind != KernelKind::conv || !k.conv.n.is_static()) continue;
    cpu::ConvDesc d = cpu::conv_desc(k.conv);
    d.weights = n->inputs[static_cast<size_t>(k.conv.w)]->constant->data<float>();
    Job j;
    j.a = random_floats(static_cast<size_t>(d.N * d.C * d.H * d.W), rng);
    j.c.assign(static_cast<size_t>(d.N * d.OC * d.OH * d.OW), 0.0f);
    try {
      j.conv = std::make_unique<cpu::Conv2d>(d);
    } catch (const Error& e) {
      throw e.with_context(Location{.node = n->name, .op = "conv", .pass = "matmul floor"});
    }
    ++impls[j.conv->impl()];
    r.shapes.push_back(fmt::format("{}  {}", cpu::conv_str(d), n->name));
    r.flops += 2.0 * static_cast<double>(d.N * d.OC * d.OH * d.OW) * static_cast<double>((d.C / d.groups) * d.KH * d.KW);
    jobs.push_back(std::move(j));
    ++r.convolutions;
  }
  for (const auto& [name, count] : impls)
    r.impls += fmt::format("{}{} x{}", r.impls.empty() ? "" : ", ", name, count);
  if (jobs.empty()) return r;
  auto pass = [&] {
    for (Job& j : jobs) {
      if (j.conv)
        j.conv->run(j.a.data(), j.c.data());
      else
        j.mm->run(j.a.data(), j.b.data(), j.c.data());
    }
  };
  pass();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    pass();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  r.median_ms = quantile(ms, 0.5);
  r.p10_ms = quantile(ms, 0.1);
  r.p90_ms = quantile(ms, 0.9);
  return r;
}

FloorResult measure_model_matmul_floor(const std::string& model, int threads, int iters) {
  const ModelPaths mp = resolve_model(model);
  ImportedModel m = import_model_file(model, mp.data_sets.empty() ? std::vector<Tensor>{} : read_data_set(mp.data_sets[0], "input"));
  run_pipeline(*m.graph, parse_pipeline("core"), PassOptions{.verify = false});
  return measure_matmul_floor(*m.graph, threads, iters);
}

std::string floor_summary(const FloorResult& r) {
  const std::string convs = r.convolutions ? fmt::format(" and {} convolutions", r.convolutions) : "";
  return fmt::format("{} matmuls{}, {:.3f} GFLOP, median {:.3f} ms (p10 {:.3f}, p90 {:.3f}), ",
                     r.matmuls, convs, r.flops / 1e9, r.median_ms, r.p10_ms, r.p90_ms) +
         fmt::format("{:.0f} GFLOP/s, {} threads", r.gflops(), r.threads);
}

}  // namespace tessel
