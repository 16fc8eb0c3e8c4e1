// The CLI's CUDA target (see cuda_cli.h).
#include "tessel/driver/cuda_cli.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "tessel/driver/compare.h"
#include "tessel/driver/compile_model.h"
#include "tessel/driver/model_dir.h"
#include "tessel/runtime/cuda_backend.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"
#include "tessel/support/escape.h"
#include "tessel/support/strings.h"
#include "tessel/targets/cuda/codegen.h"
#include "tessel/targets/cuda/toolchain.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// The ceilings of the roofline: the H200's measured copy bandwidth (device README's KINDS.md) and the
// datasheet's plain-f32 rate (f32 matmuls with TF32 off run on the FMA units, not the tensor cores).
constexpr double kBytesPerSecond = 4.3e12;
constexpr double kF32FlopsPerSecond = 67e12;
// bf16 matmuls through cuBLASLt run on the tensor cores: the bf16 dense rate measured on the H200 (KINDS.md).
constexpr double kBf16FlopsPerSecond = 790e12;

std::string model_name(const std::string& model) { return fs::path(model).filename().string(); }

std::vector<Tensor> inputs_of(const std::string& model, std::string inputs_dir) {
  if (inputs_dir.empty()) inputs_dir = default_data_set(model);
  if (!fs::is_directory(inputs_dir)) throw Error(Location{.file = inputs_dir}, "inputs folder does not exist");
  return read_data_set(inputs_dir, "input");
}

std::unique_ptr<CudaExecutable> compile(const std::string& model, const std::vector<Tensor>& ins, const std::string& cache_dir,
                                        cuda::Precision precision, bool fuse_attention = CudaBackendOptions{}.fuse_attention) {
  // The device first: without one the answer is one line, before any import work.
  if (!cuda::device_info().usable) throw Error(Location{.pass = "cuda"}, cuda::device_info().why);
  ImportedModel m = import_model_file(model, ins);
  CudaBackendOptions o;
  o.model_name = model_name(model);
  o.cache_dir = cache_dir;
  o.precision = precision;
  o.fuse_attention = fuse_attention;
  return compile_cuda(std::move(m.graph), ins, o);
}

// The outputs of a run against data set `dir`'s, each compared at `tol` and printed; whether all match.
bool check_against(const std::vector<Tensor>& outs, const std::string& dir, const Tolerance& tol) {
  const std::vector<Tensor> refs = read_data_set(dir, "output");
  if (refs.size() != outs.size())
    throw Error(Location{.file = dir}, fmt::format("{} reference outputs for {} model outputs", refs.size(), outs.size()));
  bool ok = true;
  for (size_t i = 0; i < outs.size(); ++i) {
    const Comparison c = compare_tensors(outs[i], refs[i], tol);
    fmt::print("check output {}: max abs error {:.3g}, relative error {:.3g} -> {}{}\n", i, c.max_abs, c.rel, c.match ? "PASS" : "FAIL",
               c.match ? "" : " (" + c.mismatch + ")");
    ok = ok && c.match;
  }
  return ok;
}

Tolerance cuda_tolerance(double max_rel, cuda::Precision precision) {
  Tolerance tol;
  tol.max_rel = max_rel > 0 ? max_rel : cuda::precision_tolerance(precision);
  return tol;
}

}  // namespace

int cmd_run_cuda(const std::string& model, const std::string& inputs_dir, bool check, double max_rel, int repeat, cuda::Precision precision) {
  std::string dir = inputs_dir;
  if (dir.empty()) {
    ModelPaths mp = resolve_model(model);
    if (!mp.data_sets.empty()) dir = mp.data_sets[0];
  }
  const std::vector<Tensor> ins = inputs_of(model, inputs_dir);
  auto exe = compile(model, ins, "", precision);
  const CudaCompileStats& st = exe->stats();
  fmt::print("cuda {}: {} ({}), compiled in {:.1f} ms (NVRTC {:.1f} ms{}), {} kernels ({} matmul via cuBLASLt, {} direct; {} conv, {} as im2col + matmul), "
             "{} host steps, arena {:.2f} MB, weights {:.2f} MB\n",
             st.precision, st.device, st.arch, st.compile_seconds * 1e3, st.nvrtc_seconds * 1e3, st.cache_hit ? ", cache hit" : "", st.kernels,
             st.cublaslt_matmuls, st.direct_matmuls, st.conv_kernels, st.im2col_convs, st.host_steps, st.arena_bytes / 1e6, st.weight_bytes / 1e6);
  std::vector<Tensor> outs;
  double best = 1e300;
  for (int i = 0; i < std::max(1, repeat); ++i) {
    auto t0 = Clock::now();
    outs = exe->run(ins);
    best = std::min(best, ms_since(t0));
  }
  fmt::print("ran cuda in {:.3f} ms{}{}\n", best, repeat > 1 ? " (best of runs)" : "", exe->uses_graph() ? " (CUDA graph replay)" : "");
  for (size_t i = 0; i < outs.size(); ++i) fmt::print("output {}: {}\n", i, TensorType{outs[i].dtype(), outs[i].shape()}.str());
  if (!check) return 0;
  if (dir.empty()) throw Error(Location{.file = model}, "--check needs a data set with outputs");
  const Tolerance tol = cuda_tolerance(max_rel, precision);
  fmt::print("check at {} (max rel {:g})\n", cuda::precision_name(precision), tol.max_rel);
  const bool ok = check_against(outs, dir, tol);
  fmt::print("{}\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

std::string emit_cuda(const std::string& model, const std::string& emit, cuda::Precision precision, bool dynamic) {
  // --dynamic: the inputs' dim_params stay size symbols (no data set binds them), and the code takes them at run time
  const std::vector<Tensor> ins = dynamic ? std::vector<Tensor>{} : model_inputs(model);
  ImportedModel m = import_model_file(model, ins, dynamic);
  KernelModule km = lower_for_cuda(std::move(m.graph), ins);
  if (emit == "kernel") return print_kernel_module(km, true);
  if (emit == "cuda") return cuda::generate_cuda(km, model_name(model), precision);
  throw Error(Location{.pass = "compile"}, fmt::format("--emit {} is not available for --target cuda (cuda, kernel)", emit));
}

// `tessel run MODEL --target cuda --dynamic`: one compilation with the dim_params as size symbols, each data set
// of `inputs_dirs` bound, run and (with --check) compared; the line per data set says whether it made a new
// binding's steps (docs/dynamic-shapes.md, "On CUDA").
int cmd_run_cuda_dynamic(const std::string& model, const std::string& inputs_dirs, bool check, double max_rel, int repeat,
                         cuda::Precision precision) {
  if (!cuda::device_info().usable) throw Error(Location{.pass = "cuda"}, cuda::device_info().why);
  std::vector<std::string> dirs = comma_list(inputs_dirs);
  if (dirs.empty()) dirs.push_back(default_data_set(model));
  ImportedModel m = import_model_file(model, {}, true);
  CudaBackendOptions o;
  o.model_name = model_name(model);
  o.precision = precision;
  auto exe = compile_cuda(std::move(m.graph), {}, o);
  const CudaCompileStats& st = exe->stats();
  fmt::print("cuda {}: {} ({}), compiled once for every size in {:.1f} ms (NVRTC {:.1f} ms{}), symbols {}\n", st.precision, st.device, st.arch,
             st.compile_seconds * 1e3, st.nvrtc_seconds * 1e3, st.cache_hit ? ", cache hit" : "",
             st.symbols.empty() ? std::string("none") : fmt::format("{}", fmt::join(st.symbols, ", ")));
  const Tolerance tol = cuda_tolerance(max_rel, precision);
  bool ok = true;
  for (const std::string& dir : dirs) {
    if (!fs::is_directory(dir)) throw Error(Location{.file = dir}, "inputs folder does not exist");
    const std::vector<Tensor> ins = read_data_set(dir, "input");
    const int before = exe->stats().rebinds;
    const double before_s = exe->stats().rebind_seconds;
    std::vector<Tensor> outs;
    double best = 1e300;
    for (int i = 0; i < std::max(1, repeat); ++i) {
      auto t0 = Clock::now();
      try {
        outs = exe->run(ins);
      } catch (const Error& e) {
        throw e.with_context(Location{.file = dir});
      }
      best = std::min(best, ms_since(t0));
    }
    const bool fresh = exe->stats().rebinds > before;
    fmt::print("{}: ran cuda in {:.3f} ms{} (this binding: {}; {} host steps)\n", dir, best, repeat > 1 ? " (best of runs)" : "",
               fresh ? fmt::format("steps made in {:.3f} ms", (exe->stats().rebind_seconds - before_s) * 1e3) : std::string("steps already made"),
               exe->stats().host_steps);
    for (size_t i = 0; i < outs.size(); ++i) fmt::print("output {}: {}\n", i, TensorType{outs[i].dtype(), outs[i].shape()}.str());
    if (check) ok = check_against(outs, dir, tol) && ok;
  }
  fmt::print("compilations: 1; bindings made: {} ({:.3f} ms in all)\n", exe->stats().rebinds, exe->stats().rebind_seconds * 1e3);
  if (!check) return 0;
  fmt::print("{}\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

nlohmann::json bench_cuda(const std::string& model, const CudaBenchOptions& o) {
  const std::vector<Tensor> ins = inputs_of(model, "");
  auto t0 = Clock::now();
  auto exe = compile(model, ins, o.cache_dir, o.precision);
  const double compile_ms = ms_since(t0);
  const CudaCompileStats& st = exe->stats();
  auto t1 = Clock::now();
  std::vector<Tensor> outs = exe->run(ins);
  const double first_ms = ms_since(t1);
  // The oracle: the data set's outputs where it has them, else the eager interpreter.
  std::vector<Tensor> refs;
  std::string oracle = "test_data_set_0 outputs";
  {
    ModelPaths mp = resolve_model(model);
    if (!mp.data_sets.empty()) refs = read_data_set(mp.data_sets[0], "output");
  }
  if (refs.size() != outs.size()) {
    ImportedModel m = import_model_file(model, ins);
    refs = run_eager(*m.graph, ins);
    oracle = "eager interpreter";
  }
  double max_rel = 0;
  bool match = refs.size() == outs.size();
  Tolerance tol;
  tol.max_rel = cuda::precision_tolerance(o.precision);
  for (size_t i = 0; i < outs.size() && i < refs.size(); ++i) {
    const Comparison c = compare_tensors(outs[i], refs[i], tol);
    max_rel = std::max(max_rel, c.rel);
    match = match && c.match;
  }
  std::vector<double> calls;
  for (int i = 0; i < std::max(1, o.iters); ++i) {
    auto tc = Clock::now();
    exe->run(ins);
    calls.push_back(ms_since(tc));
  }
  std::sort(calls.begin(), calls.end());
  const double call_ms = calls[calls.size() / 2];
  const double replay = exe->replay_ms(std::max(10, o.iters));
  const std::vector<CudaStepTime> prof = exe->profile(ins, std::max(3, std::min(o.iters, 20)));
  // Where an attention pattern can fuse, the fused kernel against the unfused steps, in the same call: the
  // same model compiled the other way (CudaBackendOptions::fuse_attention, off by default).
  nlohmann::json attention = {{"fused", st.fused_attention}, {"decisions", st.attention}};
  const bool fusible = std::any_of(st.attention.begin(), st.attention.end(), [](const std::string& d) {
    return d.rfind("attention fused", 0) == 0 || d.rfind("attention not fused: turned off", 0) == 0;
  });
  if (fusible) {
    const bool other = st.fused_attention == 0;
    auto alt = compile(model, ins, o.cache_dir, o.precision, other);
    const std::vector<Tensor> ao = alt->run(ins);
    alt->run(ins);  // captured
    double rel = 0;
    for (size_t i = 0; i < ao.size() && i < refs.size(); ++i) rel = std::max(rel, compare_tensors(ao[i], refs[i], tol).rel);
    const std::string key = other ? "fused" : "unfused";
    attention[key + "_replay_ms"] = alt->replay_ms(std::max(10, o.iters));
    attention[key + "_max_rel"] = rel;
    attention[key + "_compile_ms"] = alt->stats().compile_seconds * 1e3;
  }
  nlohmann::json kernels = nlohmann::json::array();
  double sum_ms = 0, sum_roof = 0;
  for (const CudaStepTime& s : prof) {
    const double rate = s.info.tensor_cores ? kBf16FlopsPerSecond : kF32FlopsPerSecond;
    const double bytes_ms = s.info.bytes / kBytesPerSecond * 1e3, flops_ms = s.info.flops / rate * 1e3;
    const double roof = std::max(bytes_ms, flops_ms);
    sum_ms += s.ms;
    sum_roof += roof;
    kernels.push_back({{"name", s.info.name}, {"kind", s.info.kind}, {"how", s.info.how}, {"epilogue", s.info.epilogue}, {"ms", s.ms}, {"bytes", s.info.bytes},
                       {"flops", s.info.flops}, {"ceiling", s.info.tensor_cores ? "bf16 tensor cores" : "f32 FMA"}, {"roofline_ms", roof}, {"bytes_bound_ms", bytes_ms}, {"flops_bound_ms", flops_ms},
                       {"of_roofline", s.ms > 0 ? roof / s.ms : 0.0}});
    if (s.epilogue_ms >= 0) kernels.back()["epilogue_ms"] = s.epilogue_ms;
  }
  nlohmann::json j = {{"model", model},
                      {"target", "cuda"},
                      {"device", st.device},
                      {"precision", st.precision},
                      {"tolerance", tol.max_rel},
                      {"arch", st.arch},
                      {"compile_ms", compile_ms},
                      {"nvrtc_ms", st.nvrtc_seconds * 1e3},
                      {"cache_hit", st.cache_hit},
                      {"first_call_ms", first_ms},
                      {"call_ms", call_ms},
                      {"replay_ms", replay},
                      {"cuda_graph", exe->uses_graph()},
                      {"kernels_ms_sum", sum_ms},
                      {"roofline_ms_sum", sum_roof},
                      {"host_steps", st.host_steps},
                      {"host_ops", st.host_ops},
                      {"kernel_count", st.kernels},
                      {"cublaslt_matmuls", st.cublaslt_matmuls},
                      {"direct_matmuls", st.direct_matmuls},
                      {"conv_kernels", st.conv_kernels},
                      {"im2col_convs", st.im2col_convs},
                      {"im2col_bytes", st.im2col_bytes},
                      {"timed_matmuls", st.timed_matmuls},
                      {"retimed_algos", st.retimed_algos},
                      {"matmul_timing_seconds", st.matmul_timing_seconds},
                      {"arena_bytes", st.arena_bytes},
                      {"weight_bytes", st.weight_bytes},
                      {"oracle", oracle},
                      {"max_rel", max_rel},
                      {"match", match},
                      {"iters", o.iters},
                      {"ceilings", {{"bytes_per_s", kBytesPerSecond}, {"f32_flops_per_s", kF32FlopsPerSecond}, {"bf16_flops_per_s", kBf16FlopsPerSecond}}},
                      {"attention", attention},
                      {"kernels", kernels}};
  fmt::print("{} ({}) on {} ({}): compile {:.1f} ms (NVRTC {:.1f} ms{}), first call {:.2f} ms\n", display_text(model_name(model)), st.precision, st.device,
             st.arch, compile_ms, st.nvrtc_seconds * 1e3, st.cache_hit ? ", cubin cached" : "", first_ms);
  fmt::print("  call {:.3f} ms with copies (median of {}), device {:.3f} ms per call ({}), kernels sum {:.3f} ms, roofline {:.3f} ms\n",
             call_ms, calls.size(), replay, exe->uses_graph() ? "CUDA graph replay" : "stream launches", sum_ms, sum_roof);
  fmt::print("  {} kernels ({} cuBLASLt, {} direct matmul, {} conv), {} host steps; vs {}: max rel {:.3g} -> {}\n", st.kernels,
             st.cublaslt_matmuls, st.direct_matmuls, st.conv_kernels, st.host_steps, oracle, max_rel, match ? "PASS" : "FAIL");
  for (const std::string& d : st.attention) fmt::print("  {}\n", d);
  for (const char* v : {"fused", "unfused"})
    if (attention.contains(std::string(v) + "_replay_ms"))
      fmt::print("  {} attention (same call): device {:.3f} ms per call, max rel {:.3g}\n", v, attention[std::string(v) + "_replay_ms"].get<double>(),
                 attention[std::string(v) + "_max_rel"].get<double>());
  std::vector<size_t> order(prof.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return prof[a].ms > prof[b].ms; });
  fmt::print("  {:<8} {:<7} {:>9} {:>9} {:>7}  {}\n", "step", "kind", "ms", "roof ms", "of roof", "how");
  for (size_t r = 0; r < order.size() && r < 12; ++r) {
    const nlohmann::json& k = kernels[order[r]];
    fmt::print("  {:<8} {:<7} {:>9.4f} {:>9.4f} {:>6.0f}%  {}\n", k["name"].get<std::string>(), k["kind"].get<std::string>(),
               k["ms"].get<double>(), k["roofline_ms"].get<double>(), 100 * k["of_roofline"].get<double>(),
               k["how"].get<std::string>() + (k.contains("epilogue_ms") ? fmt::format(" (epilogue {:.4f} ms)", k["epilogue_ms"].get<double>()) : ""));
  }
  return j;
}

}  // namespace tessel
