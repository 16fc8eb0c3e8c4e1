// The CUDA backend (docs/runtime/cuda-backend.md): the core graph is fused into the kernel level (as for
// the compiled backend), every kernel becomes generated CUDA C++ compiled by NVRTC, matmuls run through
// cuBLASLt (f32 with TF32 off, or bf16 operands with f32 compute under Precision::bf16; bias, tanh GELU,
// ReLU and residual epilogues folded into the call where they fit) and convolutions through a generated
// direct kernel, each followed by what is left of its fused epilogue. Intermediates live in one device
// arena planned by liveness (kernel/arena_plan.h); weights are uploaded once; inputs and outputs are
// copied per call (from the host by run(), device to device on the caller's stream by run_device());
// everything runs on one stream, and from the second call on the whole call is one CUDA
// graph replay. Core nodes no kernel covers run on the host through the graph backend's typed kernels
// (host steps: the stream is synchronised around them, and a model with host steps is not captured in a
// graph).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/ir/graph.h"
#include "tessel/kernel/kernel.h"
#include "tessel/lower/cuda.h"
#include "tessel/targets/cuda/precision.h"

namespace tessel {

struct CudaBackendOptions {
  std::string pipeline = "core";
  FuseOptions fuse;             // conv1d and conv_input_views are turned on (the direct conv reads any layout)
  std::string model_name = "model";
  std::string cache_dir;        // NVRTC's cubin cache (empty: the compile cache's default, folder cuda/)
  bool cuda_graph = true;       // capture the call after the first run and replay it
  // Storage of f32 values in device memory (targets/cuda/precision.h): bf16 keeps weights and matmul and
  // convolution operands and results as bf16, the residual stream and normalizations' results f32 (as
  // autocast; outputs stay f32), computing in f32.
  cuda::Precision precision = cuda::Precision::f32;
  // Attention patterns (targets/cuda/attention.h) with bf16 Q, K, V run as one fused kernel. Off by
  // default: on the H200 the fused kernel ties the unfused steps (BERT block B=4 T=512: 0.195 against
  // 0.194 ms per call) and adds NVRTC time (docs/decisions.md); `tessel bench` measures both.
  bool fuse_attention = false;
  // Each distinct cuBLASLt matmul (shape, layouts, types, epilogue) times the heuristic's first
  // kLtCandidates algorithms on the device at build time and keeps the fastest. Off by default: on the
  // H200 it did not beat the heuristic's first on GPT-2 or BERT (docs/decisions.md). The environment
  // variable TESSEL_CUDA_TIME_MATMULS=1 (or 0) overrides this field.
  bool time_matmuls = false;
};

// One step of a call, as the bench reports it.
struct CudaStepInfo {
  std::string name;             // the kernel (k3) or the host node's name (escaped for display)
  std::string kind;             // loop, matmul, conv, host
  std::string how;              // "generated rows 128x256", "cuBLASLt", "direct", "host: gather"
  int64_t bytes = 0;            // bytes the step reads and writes once each (Kernel::bytes_fused)
  int64_t flops = 0;            // multiply-adds count two
  std::string epilogue;         // matmul kernels: the cuBLASLt epilogue decision (targets/cuda/epilogue.h)
  bool tensor_cores = false;    // a bf16 cuBLASLt matmul: its ceiling is the bf16 matrix rate, not the f32 FMA rate
};

struct CudaStepTime {
  CudaStepInfo info;
  double ms = 0;                // median over the profiled calls, from CUDA events around the step
  // A library call (cuBLASLt, a convolution) followed by a generated epilogue: the epilogue's part of `ms`
  // (an event between the two; median). -1: the step has no such split.
  double epilogue_ms = -1;
};

struct CudaCompileStats {
  double compile_seconds = 0, pass_seconds = 0, fuse_seconds = 0, codegen_seconds = 0, nvrtc_seconds = 0, load_seconds = 0;
  bool cache_hit = false;       // the cubin came from the cache
  std::string cache_key, arch, device;
  std::string precision = "f32";
  int kernels = 0, loop_kernels = 0, matmul_kernels = 0, conv_kernels = 0;
  int cublaslt_matmuls = 0, direct_matmuls = 0;
  int timed_matmuls = 0;        // distinct cuBLASLt matmuls whose algorithm was chosen by timing candidates
  int retimed_algos = 0;        // ... of which the fastest was not the heuristic's first
  double matmul_timing_seconds = 0;
  int im2col_convs = 0;         // convolutions run as im2col + a cuBLASLt matmul
  uint64_t im2col_bytes = 0;    // their shared im2col buffer
  int fused_attention = 0;      // attention patterns run as one fused kernel
  std::vector<std::string> attention;  // the decision of every attention pattern
  int host_steps = 0;           // core nodes run on the host
  std::vector<std::string> host_ops;  // their ops
  uint64_t arena_bytes = 0, weight_bytes = 0;
  std::string pipeline_error;   // the core pipeline failed: the model runs undecomposed (all host steps)
  std::vector<std::string> symbols;  // a symbolic module's size symbols (the kernel parameters S0, S1, ...)
  int rebinds = 0;              // bindings its steps were made for
  double rebind_seconds = 0;    // host time spent making them
};

class CudaExecutable {
 public:
  virtual ~CudaExecutable() = default;
  // One call: inputs copied to the device, the steps (or the captured graph), outputs copied back.
  virtual std::vector<Tensor> run(const std::vector<Tensor>& inputs) = 0;
  // `iters` calls with a CUDA event pair around every step (no graph): each step's median time.
  virtual std::vector<CudaStepTime> profile(const std::vector<Tensor>& inputs, int iters) = 0;
  // The device time of one call without the copies: `iters` replays of the captured graph timed with
  // events (the steady state), or of the steps when there is no graph. Needs a run() first.
  virtual double replay_ms(int iters) = 0;
  virtual bool uses_graph() const = 0;
  // The device-pointer call (docs/runtime/cuda-backend.md, "Device pointers"): `inputs[i]` is the device
  // address of input i in its own dtype (an f32 input stored as bf16 is converted on the device),
  // `outputs[j]` the device address output j is written to (output_types()[j], dense row-major), `stream`
  // the caller's cudaStream_t as an integer (0: the legacy default stream). Everything is enqueued on that
  // stream -- one device-to-device copy (or conversion) into each input's fixed buffer, the steps (the
  // CUDA graph from the second call on), one copy out of each output's buffer -- and the call returns
  // without synchronising the host (a model with host steps is the exception: they synchronise). A call
  // waits on the device for the previous call (any stream) before it overwrites the buffers. A gather
  // index out of range is reported by the next call that finds the earlier one finished (or by run()).
  virtual void run_device(const std::vector<uint64_t>& inputs, const std::vector<uint64_t>& outputs, uint64_t stream) = 0;
  // Size symbols (docs/dynamic-shapes.md): a module compiled with symbolic sizes generates its code once,
  // every function taking the symbols' values as parameters; each new binding of the input shapes
  // instantiates the module's steps for it (launch shapes, cuBLASLt plans, the arena; the CUDA graph from
  // that binding's second call) without compiling again. bind() binds the shapes of a run_device call
  // (run() and profile() bind their tensors' shapes themselves); input_types()/output_types() are then the
  // binding's. A shape outside the symbols' facts is a one-line guard error. For a static module bind()
  // checks the shapes are the compiled ones.
  virtual void bind(const std::vector<Shape>& shapes) = 0;
  virtual bool symbolic() const = 0;
  virtual const std::vector<TensorType>& input_types() const = 0;   // what run_device's inputs hold
  virtual const std::vector<TensorType>& output_types() const = 0;  // what run_device writes
  // For the decision above (docs/decisions.md): host milliseconds to capture the call again and update the
  // instantiated graph with cudaGraphExecUpdate, what pointer-changing calls would pay instead of the
  // copies (median of `iters`; 0 without a graph).
  virtual double recapture_ms(int iters) = 0;
  virtual const CudaCompileStats& stats() const = 0;
  virtual const std::string& source() const = 0;
  virtual const std::vector<CudaStepInfo>& steps() const = 0;
};

// Compiles `g` (as imported; example inputs bind shapes as for compile_graph) for device 0. Throws
// tessel::Error: a one-line reason when there is no usable device or the build has no CUDA, NVRTC's
// log when generated source does not compile, the node when a shape is dynamic.
std::unique_ptr<CudaExecutable> compile_cuda(std::unique_ptr<Graph> g, const std::vector<Tensor>& example_inputs = {},
                                             const CudaBackendOptions& opts = {});

// The kernel module compile_cuda runs, without a device: lower::lower_cuda (lower/cuda.h) with the
// backend's pipeline and fusion options. What `tessel compile --target cuda --emit cuda|kernel` prints
// and what the NVRTC tests compile.
inline KernelModule lower_for_cuda(std::unique_ptr<Graph> g, const std::vector<Tensor>& example_inputs = {},
                                   const CudaBackendOptions& opts = {}) {
  lower::CudaOptions lo;
  lo.pipeline = opts.pipeline;
  lo.fuse = opts.fuse;
  return lower::lower_cuda(std::move(g), example_inputs, lo);
}

}  // namespace tessel
