// The host CPU's lowering (see cpu.h).
#include "tessel/lower/cpu.h"

#include <chrono>

#include <fmt/format.h>

#include "tessel/lower/lowering.h"
#include "tessel/support/error.h"
#include "tessel/targets/cpu/codegen.h"
#include "tessel/targets/cpu/ftz.h"

namespace tessel::lower {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

CpuLowered lower_cpu(std::unique_ptr<Graph> g, const CpuOptions& opts) {
  CpuLowered out;
  Lowering lw(opts.stages);
  const auto tp = Clock::now();
  if (opts.undecomposed_on_pass_error) {
    std::unique_ptr<Graph> before = g->clone();
    try {
      lw.graph_passes(*g, opts.pipeline);
    } catch (const Error& e) {
      out.pipeline_error = e.what();
      g = std::move(before);
    }
  } else {
    lw.graph_passes(*g, opts.pipeline);
  }
  out.pass_seconds = since(tp);
  const auto tf = Clock::now();
  out.module = lw.fuse(std::move(g), cpu_fuse_options(opts.fuse), opts.elide_dumped_constants);
  out.fuse_seconds = since(tf);
  lw.run(
      "cpu-ftz-library-operands",
      [&] { return fmt::format("{} kernels store.ftz", cpu::mark_ftz_stores(out.module)); },
      [&] { return print_kernel_module(out.module, opts.elide_dumped_constants); }, [&] { return out.module.kernels.size(); },
      [&] { verify_kernel_module(out.module); });
  if (opts.codegen) {
    const auto tc = Clock::now();
    lw.run(
        "cpu-codegen",
        [&] {
          // Epilogues oneDNN applies itself (bias, scale, relu/clip/GELU) get no generated function.
          out.in_library = cpu::library_epilogues(out.module, &out.library);
          out.source = cpu::generate_cpp(out.module, opts.model, out.in_library);
          for (size_t i = 0; i < out.module.kernels.size(); ++i)
            if (cpu::has_generated_function(out.module.kernels[i], out.in_library[i])) out.symbols.push_back(cpu::kernel_symbol(i));
          return fmt::format("{} generated functions", out.symbols.size());
        },
        [&] { return out.source; }, [&] { return out.symbols.size(); });
    out.codegen_seconds = since(tc);
  }
  out.records = lw.records();
  out.printed = lw.printed();
  return out;
}

}  // namespace tessel::lower
