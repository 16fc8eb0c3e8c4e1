// The CUDA backend with the toolkit (see cuda_backend.h): the device plan (arena, weights, inputs),
// the steps (generated kernels through cudaLaunchKernel, cuBLASLt matmuls, host steps) and the call
// (one stream, a CUDA graph from the second call on).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>

#include "tessel/ir/bind.h"
#include "tessel/ir/core_ops.h"
#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/kernel/arena_plan.h"
#include "tessel/runtime/core_kernels.h"
#include "tessel/runtime/graph_backend.h"
#include "tessel/runtime/cuda_backend.h"
#include "tessel/support/error.h"
#include "tessel/targets/cuda/libs.h"
#include "tessel/support/escape.h"
#include "tessel/support/limits.h"
#include "tessel/targets/cuda/codegen.h"
#include "tessel/targets/cuda/attention.h"
#include "tessel/targets/cuda/epilogue.h"
#include "tessel/targets/cuda/precision.h"
#include "tessel/targets/cuda/toolchain.h"

namespace tessel {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear a sticky-free error so the next call reports its own
    throw Error(Location{.pass = "cuda"}, fmt::format("{}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e)));
  }
}

void ck(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(Location{.pass = "cuBLASLt"}, fmt::format("{}: status {}", what, static_cast<int>(s)));
}

constexpr size_t kArenaAlign = 256;
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kLtCandidates = 8;  // cuBLASLt algorithms timed per distinct matmul (CudaBackendOptions::time_matmuls, off by default)
constexpr size_t kLtPlans = 1024;  // cuBLASLt plans a symbolic module keeps across bindings
constexpr int64_t kIm2colMaxBytes = int64_t{1} << 30;  // the largest im2col buffer a model gets (1 GiB)

size_t bytes_of(const TensorType& t) { return static_cast<size_t>(shape_numel(t.shape)) * dtype_size(t.dtype); }

// Device memory owned by the executable.
struct DeviceBuffer {
  void* p = nullptr;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n, const char* what) {
    if (n) ck(cudaMalloc(&p, n), what);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p(o.p) { o.p = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p, o.p);
    return *this;
  }
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
};

// Device memory a symbolic module's later bindings reuse while it fits (a static module's is made once):
// made again only when a binding needs more, then with an eighth of room (`room`), so that a length growing
// by one a call (a KV cache) does not reallocate -- a cudaFree synchronises the device.
struct GrowingBuffer {
  DeviceBuffer buf;
  size_t cap = 0;
  void* fit(size_t bytes, bool room, const char* what) {
    if (bytes > cap || !buf.p) {
      buf = DeviceBuffer();  // (the old memory goes first)
      const size_t want = room ? bytes + bytes / 8 : bytes;
      buf = DeviceBuffer(want, what);
      cap = want;
    }
    return buf.p;
  }
};

// The largest power of two (up to 256) dividing every address the operand is read at.
uint64_t alignment_of(const void* p, int64_t batch_stride_bytes) {
  uint64_t a = reinterpret_cast<uintptr_t>(p) | 256;
  if (batch_stride_bytes) a |= static_cast<uint64_t>(batch_stride_bytes);
  return a & (~a + 1);
}

// A cuBLASLt matmul of one MatmulSpec: the row-major C = A . B as the column-major C^T = B^T . A^T.
struct LtMatmul {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t ea = 4, eb = 4, ec = 4;  // element sizes of A, B, C in memory (bf16: 2)
  bool epilogue = false;          // the kernel's epilogue is cuBLASLt's (its generated function is not launched)
  int residual_arg = -1;          // with it: cuBLASLt's C (beta = 1)
  bool per_batch = false;  // a broadcast operand (batch stride 0): one call per batch
  std::string choice;      // how the algorithm was chosen, for the step's report
  ~LtMatmul() {
    if (op) cuda::cublaslt().cublasLtMatmulDescDestroy(op);
    if (la) cuda::cublaslt().cublasLtMatrixLayoutDestroy(la);
    if (lb) cuda::cublaslt().cublasLtMatrixLayoutDestroy(lb);
    if (lc) cuda::cublaslt().cublasLtMatrixLayoutDestroy(lc);
  }
};

struct MatrixShape {
  uint64_t rows, cols;
  int64_t ld;
  bool trans;
};

}  // namespace

class CudaExecutableImpl final : public CudaExecutable {
 public:
  ~CudaExecutableImpl() override;
  std::vector<Tensor> run(const std::vector<Tensor>& inputs) override;
  std::vector<CudaStepTime> profile(const std::vector<Tensor>& inputs, int iters) override;
  double replay_ms(int iters) override;
  bool uses_graph() const override { return exec_ != nullptr; }
  void run_device(const std::vector<uint64_t>& inputs, const std::vector<uint64_t>& outputs, uint64_t stream) override;
  void bind(const std::vector<Shape>& shapes) override;
  bool symbolic() const override { return symbolic_; }
  const std::vector<TensorType>& input_types() const override { return in_types_; }
  const std::vector<TensorType>& output_types() const override { return out_types_; }
  double recapture_ms(int iters) override;
  const CudaCompileStats& stats() const override { return stats_; }
  const std::string& source() const override { return source_; }
  const std::vector<CudaStepInfo>& steps() const override { return infos_; }

  struct Step {
    // node: a core node as a generated function; matmul: a dot_general no kernel covers (cuBLASLt or direct)
    enum class Kind { kernel, node, matmul, attention, host } kind = Kind::kernel;
    dim3 grid{1, 1, 1};                      // attention: its 2-D grid
    const Node* node = nullptr;
    const Kernel* kernel = nullptr;
    size_t kid = 0;
    std::vector<void*> args;                 // device pointer per kernel arg
    std::vector<DType> arg_mem;              // per kernel arg: its element type in memory
    cudaKernel_t fn = nullptr, conv = nullptr, mm = nullptr, im2col = nullptr;  // im2col: a conv run as a matmul
    int gather_flag = -1;                    // node steps of gather and scatter: their out-of-range flag
    cudaKernel_t update = nullptr;           // a scatter's second launch (its updates), after fn's copy
    cuda::LaunchShape update_shape;
    cuda::LaunchShape shape, conv_shape, mm_shape, im2col_shape;
    std::shared_ptr<LtMatmul> lt;            // (shared: a symbolic module's bindings reuse plans, lt_plans_)
    MatmulSpec spec;                         // what lt computes (a matmul kernel's, or a 1x1 convolution's)
    // f32 -> bf16 copies made before the step's library call: a matmul operand stored f32 beside a bf16 one
    struct Convert {
      const void* src = nullptr;
      void* dst = nullptr;
      long long n = 0;
    };
    std::vector<Convert> converts;
    // host steps
    CoreKernel host_kernel;
    std::vector<std::vector<uint8_t>> host_in, host_out;  // staging per input / output value
  };

  void build(KernelModule m, const std::vector<Tensor>& ex, const CudaBackendOptions& o);

 private:
  // build()'s parts, in the order it runs them
  void load_kernels(const KernelModule& m, const CudaBackendOptions& o);
  cudaKernel_t kernel_of(const std::string& sym);  // a kernel of the loaded library by its symbol
  void make_shared_buffers();
  // One binding's part (the whole of it for a static module): every value's device memory, then one step
  // per node of module_ (a symbolic module: rebind() instantiates module_ first).
  void place_values();
  void make_steps(const CudaBackendOptions& o);
  void rebind(const std::vector<int64_t>& values);
  // The module the code was generated from (a symbolic module's, else module_): its nodes and kernels decide
  // how each node runs, so that the decision is the generated source's for every binding.
  const KernelModule& generated() const { return symbolic_ ? sym_module_ : module_; }
  // The device copy of a constant (uploaded once; a symbolic module's bindings share their constants' storage).
  void* constant_on_device(const Value* v);
  void attention_step(const Node& n, size_t ni, const cuda::AttentionMatch& a);
  void kernel_step(const Node& n, const CudaBackendOptions& o);
  void matmul_node_step(const Node& n, size_t ni, const MatmulSpec& spec);
  void device_node_step(const Node& n, size_t ni);
  void host_step(const Node& n);
  // `before_epilogue`: recorded between a library call and the generated epilogue after it (profile)
  void enqueue(Step& s, cudaEvent_t before_epilogue = nullptr);
  void enqueue_all();
  void enqueue_call(cudaStream_t s);
  void launch(cudaKernel_t f, const cuda::LaunchShape& sh, std::vector<void*>& ptrs);
  void run_lt(Step& s);
  // One matmul of `lt` over `args` with `algo` enqueued on `st` (every batch when lt is per batch).
  cublasStatus_t enqueue_lt(const LtMatmul& lt, const MatmulSpec& mm, const std::vector<void*>& args, const cublasLtMatmulAlgo_t& algo, cudaStream_t st);
  // The fastest of the heuristic's candidates for `lt`, timed once per distinct matmul (lt_chosen_).
  void choose_lt_algo(LtMatmul& lt, const MatmulSpec& mm, const std::vector<void*>& args, const cublasLtMatmulHeuristicResult_t* res, int found,
                      const std::string& key);
  // A cuBLASLt plan for `mm` over the step's device pointers, or null when the heuristic has no algorithm.
  std::shared_ptr<LtMatmul> make_lt(const MatmulSpec& mm, const std::vector<void*>& args, const std::vector<DType>& st,
                                    const cuda::LtEpilogue* epi = nullptr);
  void run_host(Step& s);
  // Operand `arg` of matmul step `s` (value `v`) is stored f32 and the other operand bf16: the step reads
  // v's bf16 copy (an extra arg; made by the first step that reads it, autocast's cast) instead. Returns
  // false (the step unchanged) when cuBLASLt then has no plan; `plan` makes it.
  bool read_bf16_copy(Step& s, int& arg, const Value* v, const std::function<bool()>& plan);
  void load_convert();  // the f32 -> bf16 conversion kernel (convert_), compiled when first needed
  void enqueue_converts(const Step& s);
  void copy_inputs(const std::vector<Tensor>& inputs);
  std::vector<Tensor> copy_outputs();
  void capture_graph();
  void check_deferred_flags(bool wait);
  void* dev(const Value* v) const;
  DType mem(const Value* v) const { return vst_[static_cast<size_t>(v->id)]; }  // its element type in memory
  size_t mem_bytes(const Value* v) const { return static_cast<size_t>(shape_numel(v->type.shape)) * dtype_size(mem(v)); }

  KernelModule module_;
  std::string source_;
  CudaCompileStats stats_;
  std::vector<CudaStepInfo> infos_;
  std::vector<Step> steps_;
  std::vector<void*> ptr_;                   // per value id: device memory (roots resolved)
  std::vector<DType> vst_;                   // per value id: element type in memory (cuda::value_storage)
  std::vector<std::vector<uint16_t>> input_bf16_;  // per input stored as bf16: its converted copy
  std::vector<int> root_;
  std::vector<GrowingBuffer> inputs_dev_;
  GrowingBuffer arena_;
  DeviceBuffer workspace_, flags_;
  GrowingBuffer col_;                        // the im2col matrix, shared by the convolutions run as matmuls (one stream)
  std::vector<const Node*> flag_node_;       // per gather flag: its node
  cudaStream_t stream_ = nullptr;
  cudaStream_t cur_ = nullptr;               // the stream steps are enqueued on: stream_, or run_device's caller's
  std::vector<TensorType> in_types_, out_types_;
  std::vector<DeviceBuffer> out_consts_;     // graph outputs that are constants, uploaded for run_device
  cudaEvent_t done_ = nullptr;               // recorded after every call: the next call waits for it on the device
  bool done_recorded_ = false;
  cudaLibrary_t convert_lib_ = nullptr;      // run_device's f32 -> bf16 input conversion (compiled when first needed)
  cudaKernel_t convert_ = nullptr;
  std::map<int, void*> bf16_copy_;           // per value id: the bf16 copy matmuls read (read_bf16_copy), in bf16_pool_
  std::map<int, GrowingBuffer> bf16_pool_;   // the copies' memory, per value of the module the code was generated from
  std::vector<int> twin_id_;                 // a symbolic module's binding: per bound value id, its symbolic value's id
  std::map<std::pair<size_t, size_t>, GrowingBuffer> scratch_;  // per (kernel, arg): its scratch buffer
  int* flags_host_ = nullptr;                // pinned: run_device's gather flags, read by a later call
  cudaEvent_t flags_ev_ = nullptr;
  bool flags_pending_ = false;
  cudaLibrary_t lib_ = nullptr;
  cudaKernel_t hold_ = nullptr;              // the prelude's tsl_hold (profile)
  cublasLtHandle_t lt_ = nullptr;
  bool time_matmuls_ = false;
  std::map<std::string, std::pair<int, std::string>> lt_chosen_;  // per distinct matmul: the candidate kept, why
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  bool use_graph_ = true;
  int calls_ = 0;
  int sms_ = 1;
  // Size symbols (docs/dynamic-shapes.md): the module as generated (symbolic), the binder of a call's input
  // shapes, and the binding the steps are built for, whose values every generated function takes as its
  // last parameters (sym_values_; empty for a static module).
  bool symbolic_ = false;
  bool bound_ = false;
  KernelModule sym_module_;
  std::unique_ptr<SymbolBinder> binder_;
  std::vector<DType> sym_vst_;               // value_storage of the symbolic module, by its value ids
  std::vector<long long> sym_values_;
  CudaBackendOptions opts_;
  std::map<std::pair<const void*, DType>, DeviceBuffer> const_dev_;  // per constant's host bytes and storage type
  std::map<std::string, std::shared_ptr<LtMatmul>> lt_plans_;  // a symbolic module's cuBLASLt plans by what they compute
  std::map<std::string, cudaKernel_t> kernels_;  // the loaded library's functions by symbol
};

CudaExecutableImpl::~CudaExecutableImpl() {
  if (done_recorded_) cudaEventSynchronize(done_);  // a run_device call may still be using the buffers
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
  if (done_) cudaEventDestroy(done_);
  if (flags_ev_) cudaEventDestroy(flags_ev_);
  if (flags_host_) cudaFreeHost(flags_host_);
  if (convert_lib_) cudaLibraryUnload(convert_lib_);
  steps_.clear();  // LtMatmul descriptors before the handle
  lt_plans_.clear();
  if (lt_) cuda::cublaslt().cublasLtDestroy(lt_);
  if (lib_) cudaLibraryUnload(lib_);
  if (stream_) cudaStreamDestroy(stream_);
}

void* CudaExecutableImpl::dev(const Value* v) const { return ptr_[static_cast<size_t>(root_[static_cast<size_t>(v->id)])]; }

namespace {

int64_t loop_flops(const Kernel& k) {
  int64_t ops = 0;
  for (const KInstr& in : k.body)
    if (!in.is(KInstrKind::load) && !in.is(KInstrKind::store) && !in.is(KInstrKind::constant)) ops += in.row ? 0 : 1;
  return ops * k.outer_count() * k.inner_count();
}

// X = B^T as cuBLASLt's A: element (n, k) at k * b_k + n * b_n.
MatrixShape x_shape(const MatmulSpec& m) {
  if (m.b_n == 1 || m.n == 1) return {static_cast<uint64_t>(m.n), static_cast<uint64_t>(m.k), m.b_k, false};
  return {static_cast<uint64_t>(m.k), static_cast<uint64_t>(m.n), m.b_n, true};
}
// Y = A^T as cuBLASLt's B: element (k, m) at m * a_m + k * a_k.
MatrixShape y_shape(const MatmulSpec& m) {
  if (m.a_k == 1 || m.k == 1) return {static_cast<uint64_t>(m.k), static_cast<uint64_t>(m.m), m.a_m, false};
  return {static_cast<uint64_t>(m.m), static_cast<uint64_t>(m.k), m.a_k, true};
}

// A batch whose B is shared (batch stride 0) over an A and a C whose batches follow each other row after
// row is one matmul of batch x M rows: one cuBLASLt call instead of one per batch (a Linear on [B, T, D]).
MatmulSpec fold_shared_batch(MatmulSpec m) {
  const bool dense_c = m.c_batch == 0 && m.c_m == 0 && m.c_n == 0;
  const int64_t cb = dense_c ? m.m * m.n : m.c_batch, cm = dense_c ? m.n : m.c_m, cn = dense_c ? int64_t{1} : int64_t{m.c_n};
  if (m.batch <= 1 || m.b_batch != 0 || m.a_k != 1 || m.a_batch != m.m * m.a_m || cn != 1 || cb != m.m * cm) return m;
  m.m *= m.batch;
  m.batch = 1;
  m.a_batch = 0;
  if (!dense_c) m.c_batch = 0;
  return m;
}

cudaDataType_t lt_type(DType t) { return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

cublasLtMatrixLayout_t make_layout(const MatrixShape& s, int64_t batch, int64_t batch_stride, DType t) {
  cublasLtMatrixLayout_t l = nullptr;
  const int64_t ld = std::max<int64_t>(s.ld, static_cast<int64_t>(s.rows));  // unused when cols == 1
  ck(cuda::cublaslt().cublasLtMatrixLayoutCreate(&l, lt_type(t), s.rows, s.cols, s.cols == 1 ? std::max<int64_t>(ld, 1) : s.ld), "cublasLtMatrixLayoutCreate");
  if (batch > 1) {
    int32_t b = static_cast<int32_t>(batch);
    ck(cuda::cublaslt().cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b), "batch count");
    ck(cuda::cublaslt().cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride, sizeof batch_stride), "batch stride");
  }
  return l;
}

// A convolution runs as im2col + a matmul when its im2col matrix (f32: 4 bytes an element) stays within
// kIm2colMaxBytes; a larger one stays on the direct kernel.
bool im2col_fits(const ConvSpec& c) { return cuda::conv_as_matmul(c) && cuda::im2col_elements(c) <= kIm2colMaxBytes / int64_t{4}; }

}  // namespace

// The executable in order: the device and its stream, the generated kernels compiled and loaded, the
// buffers steps share, then (for a static module here, for a symbolic one at each new binding, rebind)
// every value's device memory and one step per node (a fused attention, a kernel, a matmul or a
// generated node on the device, else a host step).
void CudaExecutableImpl::build(KernelModule m, const std::vector<Tensor>& ex, const CudaBackendOptions& o) {
  (void)ex;
  opts_ = o;
  symbolic_ = m.graph && !graph_symbols(*m.graph).empty();
  const cuda::DeviceInfo& di = cuda::device_info();
  sms_ = std::max(1, di.sms);
  stats_.device = di.name;
  stats_.precision = cuda::precision_name(o.precision);
  use_graph_ = o.cuda_graph;
  const char* tm = std::getenv("TESSEL_CUDA_TIME_MATMULS");
  time_matmuls_ = tm && (std::string(tm) == "0" || std::string(tm) == "1") ? std::string(tm) == "1" : o.time_matmuls;
  ck(cudaSetDevice(0), "cudaSetDevice");
  ck(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  cur_ = stream_;
  ck(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
  (symbolic_ ? sym_module_ : module_) = std::move(m);
  const KernelModule& gen = generated();
  const Graph& g = *gen.graph;
  (symbolic_ ? sym_vst_ : vst_) = cuda::value_storage(g, gen.kernels, o.precision);
  for (const Value* v : g.inputs) in_types_.push_back(v->type);
  for (const Value* v : g.outputs) out_types_.push_back(v->type);
  load_kernels(gen, o);
  make_shared_buffers();
  if (symbolic_) {  // the steps are made for each binding (rebind)
    binder_ = std::make_unique<SymbolBinder>(g);
    stats_.symbols = binder_->symbols();
    return;
  }
  place_values();
  make_steps(o);
}

// The steps of module_ (one binding of a symbolic module): how each node runs is decided on the module the
// code was generated from (generated()), its sizes and pointers are module_'s.
void CudaExecutableImpl::make_steps(const CudaBackendOptions& o) {
  const auto& nodes = module_.graph->nodes();
  // Fused attention: its QK and softmax steps go, its PV step becomes the fused kernel (not with size symbols:
  // the source has no fused kernel then).
  std::map<size_t, cuda::AttentionMatch> attention_at;
  std::vector<bool> fused_away(nodes.size(), false);
  if (!symbolic_) {
    for (const cuda::AttentionMatch& a : cuda::find_attention(module_, vst_)) {
      stats_.attention.push_back(a.fused && !o.fuse_attention ? "attention not fused: turned off (CudaBackendOptions::fuse_attention; " + a.why + ")" : a.why);
      if (!a.fused || !o.fuse_attention) continue;
      attention_at[a.pv] = a;
      fused_away[a.qk] = fused_away[a.softmax] = true;
      stats_.fused_attention++;
    }
  }
  // One im2col buffer for every convolution run as a matmul, as large as the largest (f32: 4 bytes an element);
  // a convolution whose im2col matrix would pass kIm2colMaxBytes stays on the direct kernel.
  int64_t col_elems = 0;
  for (const Kernel& k : module_.kernels)
    if (k.kind == KernelKind::conv && im2col_fits(k.conv)) col_elems = std::max(col_elems, cuda::im2col_elements(k.conv));
  const size_t col_bytes = static_cast<size_t>(col_elems) * sizeof(float);
  col_.fit(col_bytes, symbolic_, "the im2col buffer");
  stats_.im2col_bytes = col_bytes;
  for (size_t ni = 0; ni < nodes.size(); ++ni) {
    const Node& n = *nodes[ni];
    const Node& gen = *generated().graph->nodes()[ni];
    if (is_core_op(n, CoreOp::reshape) || fused_away[ni]) continue;  // an alias, or inside a fused attention
    if (const auto at = attention_at.find(ni); at != attention_at.end()) attention_step(n, ni, at->second);
    else if (is_kernel_node(n)) kernel_step(n, o);
    else if (cuda::device_matmul_spec(gen)) {
      const std::optional<MatmulSpec> mm = cuda::device_matmul_spec(n);
      if (!mm) fail("node '{}': the device matmul of its generated code does not take this binding", display_text(n.name));
      matmul_node_step(n, ni, *mm);
    } else if (cuda::device_node_supported(gen)) {
      device_node_step(n, ni);
    } else {
      host_step(n);
    }
  }
  for (size_t i = 0; i < steps_.size(); ++i)
    if (steps_[i].lt && !steps_[i].lt->choice.empty()) infos_[i].how += " (" + steps_[i].lt->choice + ")";
  for (const Kernel& k : module_.kernels) {
    stats_.kernels++;
    stats_.loop_kernels += k.kind == KernelKind::loop;
    stats_.matmul_kernels += k.kind == KernelKind::matmul;
    stats_.conv_kernels += k.kind == KernelKind::conv;
  }
  if (stats_.host_steps) use_graph_ = false;
}

// A new binding of a symbolic module's sizes: module_ is the module instantiated for it, and its values and
// steps are made again (constants stay on the device; the arena and input buffers grow when they must; the
// CUDA graph of the previous binding goes, and the binding's second call captures its own).
void CudaExecutableImpl::rebind(const std::vector<int64_t>& values) {
  const std::vector<long long> v(values.begin(), values.end());
  if (bound_ && v == sym_values_) return;
  const auto t0 = Clock::now();
  // The previous call may still run on the device with the steps' buffers and descriptors.
  if (done_recorded_) ck(cudaEventSynchronize(done_), "waiting for the previous call");
  check_deferred_flags(true);
  if (exec_) cudaGraphExecDestroy(exec_), exec_ = nullptr;
  if (graph_) cudaGraphDestroy(graph_), graph_ = nullptr;
  steps_.clear();
  infos_.clear();
  bf16_copy_.clear();
  flag_node_.clear();
  out_consts_.clear();
  input_bf16_.clear();
  calls_ = 0;
  bound_ = false;
  use_graph_ = opts_.cuda_graph;
  // the counts of one binding's steps (compile-time figures stay)
  stats_.kernels = stats_.loop_kernels = stats_.matmul_kernels = stats_.conv_kernels = 0;
  stats_.cublaslt_matmuls = stats_.direct_matmuls = stats_.im2col_convs = stats_.host_steps = 0;
  stats_.host_ops.clear();
  const Bindings b = binder_->bindings(values);
  module_.graph = instantiate_graph(*sym_module_.graph, b);
  module_.kernels = instantiate_kernels(sym_module_.kernels, b);
  // value_storage as decided for the generated code: the bound graph's values by their symbolic twins
  // (the same nodes in the same order; ids are renumbered)
  const Graph& bg = *module_.graph;
  const Graph& sg = *sym_module_.graph;
  size_t nv = 0;
  for (const auto& x : bg.values()) nv = std::max(nv, static_cast<size_t>(x->id) + 1);
  vst_.assign(nv, DType::f32);
  for (const auto& x : bg.values()) vst_[static_cast<size_t>(x->id)] = x->type.dtype;
  twin_id_.assign(nv, -1);
  auto twin = [&](const Value* bv, const Value* sv) {
    if (!bv || !sv) return;
    twin_id_[static_cast<size_t>(bv->id)] = sv->id;
    if (static_cast<size_t>(sv->id) < sym_vst_.size()) vst_[static_cast<size_t>(bv->id)] = sym_vst_[static_cast<size_t>(sv->id)];
  };
  if (bg.nodes().size() != sg.nodes().size() || bg.inputs.size() != sg.inputs.size() || bg.outputs.size() != sg.outputs.size())
    fail("the instantiated module differs from its symbolic one in its nodes");
  for (size_t i = 0; i < bg.inputs.size(); ++i) twin(bg.inputs[i], sg.inputs[i]);
  for (size_t ni = 0; ni < bg.nodes().size(); ++ni) {
    const Node& bn = *bg.nodes()[ni];
    const Node& sn = *sg.nodes()[ni];
    if (bn.inputs.size() != sn.inputs.size() || bn.outputs.size() != sn.outputs.size()) fail("node '{}' differs from its symbolic twin", display_text(bn.name));
    for (size_t k = 0; k < bn.inputs.size(); ++k) twin(bn.inputs[k], sn.inputs[k]);
    for (size_t k = 0; k < bn.outputs.size(); ++k) twin(bn.outputs[k], sn.outputs[k]);
  }
  in_types_.clear();
  out_types_.clear();
  for (const Value* x : bg.inputs) in_types_.push_back(x->type);
  for (const Value* x : bg.outputs) out_types_.push_back(x->type);
  sym_values_ = v;
  place_values();
  make_steps(opts_);
  bound_ = true;
  stats_.rebinds++;
  stats_.rebind_seconds += seconds_since(t0);
}

void CudaExecutableImpl::bind(const std::vector<Shape>& shapes) {
  if (!symbolic_) {
    if (shapes.size() != in_types_.size())
      throw Error(Location{.pass = "guard"}, fmt::format("the model takes {} inputs but {} shapes were given", in_types_.size(), shapes.size()));
    for (size_t i = 0; i < shapes.size(); ++i)
      if (shapes[i] != in_types_[i].shape)
        throw GuardFailure(Location{.pass = "guard"}, fmt::format("input '{}' must be {} (compiled for it) but got {}", display_text(module_.graph->inputs[i]->name),
                                                           in_types_[i].str(), shape_str(shapes[i])));
    return;
  }
  std::vector<int64_t> values;
  if (std::string why = binder_->bind(shapes, values); !why.empty()) throw GuardFailure(Location{.pass = "guard"}, why);
  rebind(values);
}

cudaKernel_t CudaExecutableImpl::kernel_of(const std::string& sym) {
  // (looked up once: a symbolic module's steps are made again at every binding)
  if (auto it = kernels_.find(sym); it != kernels_.end()) return it->second;
  cudaKernel_t k = nullptr;
  ck(cudaLibraryGetKernel(&k, lib_, sym.c_str()), "cudaLibraryGetKernel");
  kernels_.emplace(sym, k);
  return k;
}

// Generated source -> NVRTC (or its cache) -> the loaded library.
void CudaExecutableImpl::load_kernels(const KernelModule& m, const CudaBackendOptions& o) {
  auto tc = Clock::now();
  source_ = cuda::generate_cuda(m, o.model_name, o.precision, o.fuse_attention);
  stats_.codegen_seconds = seconds_since(tc);
  cuda::NvrtcOptions no;
  no.arch = cuda::device_arch();
  no.cache_dir = o.cache_dir;
  const cuda::NvrtcResult nr = cuda::compile_cuda_source(source_, o.model_name, no);
  stats_.nvrtc_seconds = nr.seconds;
  stats_.cache_hit = nr.cache_hit;
  stats_.cache_key = nr.key;
  stats_.arch = nr.arch;
  auto tl = Clock::now();
  ck(cudaLibraryLoadData(&lib_, nr.cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0), "loading the compiled kernels");
  stats_.load_seconds = seconds_since(tl);
  ck(cudaLibraryGetKernel(&hold_, lib_, "tsl_hold"), "cudaLibraryGetKernel");
}

// Memory homes: inputs, constants (stored as the precision says), constant outputs, and the arena
// roots of every computed value (a reshape aliases its operand).
void CudaExecutableImpl::place_values() {
  const Graph& g = *module_.graph;
  size_t nv = 0;
  for (const auto& v : g.values()) nv = std::max(nv, static_cast<size_t>(v->id) + 1);
  ptr_.assign(nv, nullptr);
  root_.resize(nv);
  std::iota(root_.begin(), root_.end(), 0);
  std::vector<const Value*> value_of(nv, nullptr);
  for (const auto& v : g.values()) value_of[static_cast<size_t>(v->id)] = v.get();
  inputs_dev_.resize(g.inputs.size());
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const Value* v = g.inputs[i];
    if (!shape_known(v->type.shape)) throw Error(Location{.pass = "cuda"}, fmt::format("input '{}' has a dynamic shape {}", display_text(v->name), v->type.str()));
    input_bf16_.emplace_back(mem(v) == DType::bf16 && v->type.dtype == DType::f32 ? static_cast<size_t>(shape_numel(v->type.shape)) : 0);
    ptr_[static_cast<size_t>(v->id)] = inputs_dev_[i].fit(mem_bytes(v), symbolic_, "input buffer");
  }
  std::vector<bool> used(nv, false);
  for (const auto& n : g.nodes())
    for (const Value* in : n->inputs)
      if (in) used[static_cast<size_t>(in->id)] = true;
  for (const auto& v : g.values())
    if (v->constant && used[static_cast<size_t>(v->id)]) ptr_[static_cast<size_t>(v->id)] = constant_on_device(v.get());
  for (const Value* v : g.outputs) {
    out_consts_.emplace_back();
    if (!v->constant || !v->constant->nbytes()) continue;
    out_consts_.back() = DeviceBuffer(v->constant->nbytes(), "a constant output");
    ck(cudaMemcpy(out_consts_.back().p, v->constant->bytes(), v->constant->nbytes(), cudaMemcpyHostToDevice), "uploading a constant output");
  }
  const auto& nodes = g.nodes();
  std::vector<int> def(nv, -1), last(nv, -1);
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = *nodes[k];
    for (const Value* v : n.outputs) {
      if (!v) continue;
      if (!shape_known(v->type.shape))
        throw Error(Location{.node = n.name, .op = n.op->name, .pass = "cuda"}, fmt::format("result '{}' has a dynamic shape {}; the CUDA target needs static shapes", display_text(v->name), v->type.str()));
      def[static_cast<size_t>(v->id)] = static_cast<int>(k);
    }
    if (is_core_op(n, CoreOp::reshape) && n.inputs[0] && n.outputs[0])
      root_[static_cast<size_t>(n.outputs[0]->id)] = root_[static_cast<size_t>(n.inputs[0]->id)];
    for (const Value* v : n.inputs)
      if (v) last[static_cast<size_t>(root_[static_cast<size_t>(v->id)])] = static_cast<int>(k);
  }
  for (const Value* v : g.outputs) last[static_cast<size_t>(root_[static_cast<size_t>(v->id)])] = static_cast<int>(nodes.size());
  std::vector<BufferRequest> reqs;
  std::vector<int> req_value;
  for (size_t id = 0; id < nv; ++id) {
    const Value* v = value_of[id];
    if (!v || root_[id] != static_cast<int>(id) || v->constant || v->is_input || def[id] < 0) continue;
    reqs.push_back(BufferRequest{mem_bytes(v), def[id], std::max(def[id], last[id])});
    req_value.push_back(static_cast<int>(id));
  }
  const ArenaPlan plan = plan_arena(reqs, kArenaAlign);
  uint8_t* arena = static_cast<uint8_t*>(arena_.fit(plan.size, symbolic_, "the device arena"));
  stats_.arena_bytes = plan.size;
  for (size_t r = 0; r < reqs.size(); ++r) ptr_[static_cast<size_t>(req_value[r])] = arena + plan.offsets[r];
}

void* CudaExecutableImpl::constant_on_device(const Value* v) {
  const DType st = mem(v);
  auto [it, fresh] = const_dev_.try_emplace(std::make_pair(static_cast<const void*>(v->constant->bytes()), st));
  if (!fresh) return it->second.p;
  if (st == DType::bf16 && v->constant->dtype() == DType::f32) {
    // weights stored as bf16 are converted once, here
    std::vector<uint16_t> h(static_cast<size_t>(v->constant->numel()));
    cuda::f32_to_bf16(v->constant->data<float>(), h.data(), v->constant->numel());
    it->second = DeviceBuffer(h.size() * 2, "weights");
    if (!h.empty()) ck(cudaMemcpy(it->second.p, h.data(), h.size() * 2, cudaMemcpyHostToDevice), "uploading weights");
    stats_.weight_bytes += h.size() * 2;
  } else {
    it->second = DeviceBuffer(v->constant->nbytes(), "weights");
    if (v->constant->nbytes()) ck(cudaMemcpy(it->second.p, v->constant->bytes(), v->constant->nbytes(), cudaMemcpyHostToDevice), "uploading weights");
    stats_.weight_bytes += v->constant->nbytes();
  }
  return it->second.p;
}

// What steps share: cuBLASLt's handle and workspace, the gathers' out-of-range flags (decided on the
// generated module's nodes, the same for every binding).
void CudaExecutableImpl::make_shared_buffers() {
  const auto& nodes = generated().graph->nodes();
  ck(cuda::cublaslt().cublasLtCreate(&lt_), "cublasLtCreate");
  workspace_ = DeviceBuffer(kWorkspaceBytes, "the cuBLASLt workspace");
  int gathers = 0;
  for (const auto& np : nodes)
    if (!is_kernel_node(*np) && cuda::device_node_supported(*np) && (is_core_op(*np, CoreOp::gather) || is_core_op(*np, CoreOp::scatter)))
      ++gathers;
  flags_ = DeviceBuffer(static_cast<size_t>(gathers) * sizeof(int), "gather flags");
  if (gathers) {
    ck(cudaMemset(flags_.p, 0, static_cast<size_t>(gathers) * sizeof(int)), "cudaMemset");
    ck(cudaMallocHost(reinterpret_cast<void**>(&flags_host_), static_cast<size_t>(gathers) * sizeof(int)), "cudaMallocHost");
    std::fill(flags_host_, flags_host_ + gathers, 0);
    ck(cudaEventCreateWithFlags(&flags_ev_, cudaEventDisableTiming), "cudaEventCreate");
  }
}

// A fused attention (targets/cuda/attention.h): the PV node becomes the flash kernel reading Q, K, V (and the mask).
void CudaExecutableImpl::attention_step(const Node& n, size_t ni, const cuda::AttentionMatch& a) {
  const auto& nodes = module_.graph->nodes();
  const Node& qk = *nodes[a.qk];
  const Node& sm = *nodes[a.softmax];
  Step s;
  s.node = &n;
  s.kind = Step::Kind::attention;
  s.args = {dev(qk.inputs[0]), dev(qk.inputs[1]), dev(n.inputs[1])};
  if (a.mask_arg >= 0) s.args.push_back(dev(sm.inputs[static_cast<size_t>(a.mask_arg)]));
  s.args.push_back(dev(n.outputs[0]));
  s.fn = kernel_of(cuda::attention_symbol(ni));
  const cuda::AttentionLaunch al = cuda::attention_launch(a);
  s.grid = dim3(static_cast<unsigned>(al.grid_x), static_cast<unsigned>(al.grid_y));
  s.shape.threads = al.threads;
  CudaStepInfo info;
  info.name = display_text(n.name);
  info.kind = "attention";
  info.how = "fused attention (flash, mma.sync bf16)";
  info.flops = 2 * a.s.batch * a.s.m * a.s.n * a.s.k + 2 * a.o.batch * a.o.m * a.o.n * a.o.k;
  info.tensor_cores = true;
  for (const Value* v : {qk.inputs[0], qk.inputs[1], n.inputs[1], n.outputs[0]}) info.bytes += static_cast<int64_t>(mem_bytes(v));
  if (a.mask_arg >= 0) info.bytes += static_cast<int64_t>(mem_bytes(sm.inputs[static_cast<size_t>(a.mask_arg)]));
  steps_.push_back(std::move(s));
  infos_.push_back(std::move(info));
}

// A kernel of the kernel level: a generated loop kernel, or a matmul or convolution (cuBLASLt, im2col +
// cuBLASLt, or the generated direct kernel) with its generated epilogue.
void CudaExecutableImpl::kernel_step(const Node& n, const CudaBackendOptions& o) {
  Step s;
  s.node = &n;
  CudaStepInfo info;
  s.kid = static_cast<size_t>(n.attr_i("kernel"));
  const Kernel& k = module_.kernels.at(s.kid);
  s.kernel = &k;
  size_t in = 0, out = 0;
  s.arg_mem = cuda::kernel_arg_storage(n, k, vst_, o.precision);
  for (size_t ai = 0; ai < k.args.size(); ++ai) {
    const KArg& a = k.args[ai];
    info.bytes += shape_numel(a.type.shape) * dtype_size(s.arg_mem[ai]);
    if (a.role == KArg::Role::scratch) {
      const size_t bytes = static_cast<size_t>(shape_numel(a.type.shape)) * dtype_size(s.arg_mem[ai]);
      s.args.push_back(scratch_[std::make_pair(s.kid, ai)].fit(bytes, symbolic_, "scratch buffer"));
    } else {
      const Value* v = a.role == KArg::Role::in ? n.inputs.at(in++) : n.outputs.at(out++);
      s.args.push_back(dev(v));
    }
  }
  info.name = display_text(k.name);
  info.kind = std::string(kernel_kind_name(k.kind));
  // Bytes: each buffer once at its element size in memory (as Kernel::bytes_fused counts them in f32).
  if (o.precision == cuda::Precision::f32) info.bytes = k.bytes_fused;
  if (cuda::has_generated_function(k)) {
    s.fn = kernel_of(cuda::kernel_symbol(s.kid));
    s.shape = cuda::launch_shape(generated().kernels.at(s.kid), k, sms_, s.arg_mem);
  }
  const std::string epi = s.fn ? fmt::format(" + generated epilogue") : "";
  if (k.kind == KernelKind::matmul) {
    const MatmulSpec& mm = k.mm;
    if (k.args[static_cast<size_t>(mm.a)].type.dtype != DType::f32 || k.args[static_cast<size_t>(mm.b)].type.dtype != DType::f32)
      throw Error(Location{.node = n.name, .pass = "cuda"}, "the CUDA target's matmuls take f32 operands");
    DType ta = s.arg_mem[static_cast<size_t>(mm.a)], tb = s.arg_mem[static_cast<size_t>(mm.b)];
    const DType tcc = s.arg_mem[static_cast<size_t>(mm.c)];
    s.mm = kernel_of(cuda::matmul_symbol(s.kid));
    s.mm_shape = cuda::matmul_launch_shape(k, sms_);
    info.flops = 2 * mm.batch * mm.m * mm.n * mm.k;
    s.spec = fold_shared_batch(mm);
    const cuda::LtEpilogue lte = cuda::match_lt_epilogue(k);
    info.epilogue = lte.why;
    auto input_of = [&](int arg) {  // the node input kernel arg `arg` (an input) reads
      int in = 0;
      for (int ai = 0; ai < arg; ++ai) in += k.args[static_cast<size_t>(ai)].role == KArg::Role::in;
      return n.inputs.at(static_cast<size_t>(in));
    };
    auto plan = [&]() {
      // The epilogue folded into the call: D is where the epilogue stored (C's layout), the residual
      // (cuBLASLt's C) must have D's type; cuBLASLt may still decline (no algorithm): then it is generated.
      const bool same_types = !lte.residual || s.arg_mem[static_cast<size_t>(lte.residual_arg)] == s.arg_mem[static_cast<size_t>(lte.out_arg)];
      if (lte.fold && !same_types) info.epilogue = "generated epilogue: the residual is stored as another type than the result (" + lte.why + ")";
      if (lte.fold && same_types) {
        MatmulSpec d = s.spec;
        d.c = lte.out_arg;
        if (auto lt = make_lt(d, s.args, s.arg_mem, &lte)) {
          s.lt = std::move(lt);
          s.spec = d;
        }
      }
      if (!s.lt) s.lt = make_lt(s.spec, s.args, s.arg_mem);
      if (s.lt && !s.lt->epilogue && lte.fold) info.epilogue = "generated epilogue: cuBLASLt declined " + lte.why.substr(std::string("cuBLASLt epilogue: ").size());
      return s.lt != nullptr;
    };
    // cuBLASLt's pairs with f32 compute: bf16 x bf16 -> bf16 or f32, f32 x f32 -> f32; one f32 operand
    // beside a bf16 one is read as its bf16 copy; others run direct.
    bool copied = false;
    if (ta != tb && cuda::fits_cublaslt(s.spec)) {
      const bool a_wide = ta == DType::f32;
      int& arg = a_wide ? s.spec.a : s.spec.b;
      if (read_bf16_copy(s, arg, input_of(a_wide ? mm.a : mm.b), plan)) ta = tb = DType::bf16, copied = true;
    }
    const bool lt_types = ta == tb && (ta == DType::bf16 || tcc == DType::f32);
    if (!s.lt && lt_types && cuda::fits_cublaslt(s.spec)) plan();
    if (s.lt && s.lt->epilogue) s.fn = nullptr;
    info.tensor_cores = s.lt && ta == DType::bf16;
    info.how = (s.lt ? std::string(s.lt->per_batch ? "cuBLASLt per batch" : "cuBLASLt") : std::string("direct matmul")) +
               (ta == DType::bf16 ? " bf16" : "") + (copied ? " (an f32 operand read as its bf16 copy)" : "") + (s.lt && s.lt->epilogue ? " with its epilogue" : epi);
    (s.lt ? stats_.cublaslt_matmuls : stats_.direct_matmuls)++;
  } else if (k.kind == KernelKind::conv) {
    const ConvSpec& c = k.conv;
    if (k.args[static_cast<size_t>(c.x)].type.dtype != DType::f32)
      throw Error(Location{.node = n.name, .pass = "cuda"}, "the CUDA target's convolutions take f32 operands");
    s.conv = kernel_of(cuda::conv_symbol(s.kid));
    s.conv_shape = cuda::conv_launch_shape(k, sms_);
    info.flops = 2 * c.n * c.oc * c.oh * c.ow * (c.c / std::max<int64_t>(1, c.groups)) * c.kh * c.kw;
    // A pointwise (1x1) convolution between channels-last buffers is the matmul
    // y[N*H*W, OC] = x[N*H*W, C] . w^T[C, OC]: cuBLASLt instead of the direct kernel.
    if (cuda::conv_is_channels_last_matmul(c)) {
      MatmulSpec mm;
      mm.a = c.x, mm.b = c.w, mm.c = c.y;
      mm.m = c.n * c.h * c.wd, mm.n = c.oc, mm.k = c.c;
      mm.a_m = c.c, mm.a_k = 1, mm.b_k = 1, mm.b_n = c.c;
      s.spec = mm;
      const DType tx = s.arg_mem[static_cast<size_t>(c.x)], tw = s.arg_mem[static_cast<size_t>(c.w)], ty = s.arg_mem[static_cast<size_t>(c.y)];
      if (tx == tw && (tx == DType::bf16 || ty == DType::f32) && cuda::fits_cublaslt(mm)) s.lt = make_lt(mm, s.args, s.arg_mem);
      info.tensor_cores = s.lt && tx == DType::bf16;
    } else if (im2col_fits(c) && col_.buf.p) {
      // im2col then y[N*OH*OW, OC] = col[N*OH*OW, C*KH*KW] . w^T, the OIHW weight's rows being B^T's; col is
      // an extra arg of the step (after the kernel's own, which the epilogue's launch alone reads).
      const DType tx = s.arg_mem[static_cast<size_t>(c.x)], tw = s.arg_mem[static_cast<size_t>(c.w)], ty = s.arg_mem[static_cast<size_t>(c.y)];
      MatmulSpec mm;
      const int col = static_cast<int>(s.args.size());
      mm.k = c.c * c.kh * c.kw;
      if (c.y_nhwc) {  // y[N*OH*OW, OC] = col . w^T
        mm.a = col, mm.b = c.w, mm.c = c.y;
        mm.m = c.n * c.oh * c.ow, mm.n = c.oc;
        mm.a_m = mm.k, mm.a_k = 1, mm.b_k = 1, mm.b_n = mm.k;
      } else {  // per image: y[OC, OH*OW] = w . col^T (the weight shared by the batch)
        mm.a = c.w, mm.b = col, mm.c = c.y;
        mm.batch = c.n, mm.m = c.oc, mm.n = c.oh * c.ow;
        mm.a_m = mm.k, mm.a_k = 1, mm.a_batch = 0;
        mm.b_k = 1, mm.b_n = mm.k, mm.b_batch = c.oh * c.ow * mm.k;
      }
      s.args.push_back(col_.buf.p);
      s.arg_mem.push_back(tx);
      if (tx == tw && (tx == DType::bf16 || ty == DType::f32) && cuda::fits_cublaslt(mm)) s.lt = make_lt(mm, s.args, s.arg_mem);
      if (s.lt) {
        s.spec = mm;
        s.im2col = kernel_of(cuda::im2col_symbol(s.kid));
        s.im2col_shape = cuda::im2col_launch_shape(k, sms_);
        info.tensor_cores = tx == DType::bf16;
        stats_.im2col_convs++;
      } else {
        s.args.pop_back();
        s.arg_mem.pop_back();
      }
    }
    info.how = (s.lt ? (s.im2col ? "im2col + cuBLASLt" : "cuBLASLt (1x1 conv as a matmul)") : "direct conv") + epi;
  } else {
    info.flops = loop_flops(k);
    info.how = fmt::format("generated {} {}x{}", s.shape.form == cuda::LaunchForm::pointwise ? "pointwise" : "rows", s.shape.blocks, s.shape.threads);
  }
  steps_.push_back(std::move(s));
  infos_.push_back(std::move(info));
}

// A dot_general no kernel covers: cuBLASLt, or the generated direct matmul.
void CudaExecutableImpl::matmul_node_step(const Node& n, size_t ni, const MatmulSpec& spec) {
  Step s;
  s.node = &n;
  CudaStepInfo info;
  s.kind = Step::Kind::matmul;
  s.args = {dev(n.inputs[0]), dev(n.inputs[1]), dev(n.outputs[0])};
  s.arg_mem = {mem(n.inputs[0]), mem(n.inputs[1]), mem(n.outputs[0])};
  s.spec = spec;
  DType ta = s.arg_mem[0], tb = s.arg_mem[1];
  const DType tcc = s.arg_mem[2];
  auto plan = [&]() { return (s.lt = make_lt(s.spec, s.args, s.arg_mem)) != nullptr; };
  bool copied = false;
  if (ta != tb && cuda::fits_cublaslt(spec)) {  // as a matmul kernel's: one f32 operand beside a bf16 one
    const bool a_wide = ta == DType::f32;
    if (read_bf16_copy(s, a_wide ? s.spec.a : s.spec.b, n.inputs[a_wide ? 0 : 1], plan)) ta = tb = DType::bf16, copied = true;
  }
  if (!s.lt && ta == tb && (ta == DType::bf16 || tcc == DType::f32) && cuda::fits_cublaslt(spec)) plan();
  s.mm = kernel_of(cuda::node_matmul_symbol(ni));
  s.mm_shape = cuda::node_launch_shape(n, sms_);
  info.name = display_text(n.name);
  info.kind = "matmul";
  info.flops = 2 * spec.batch * spec.m * spec.n * spec.k;
  info.tensor_cores = s.lt && ta == DType::bf16;
  info.how = (s.lt ? std::string(s.lt->per_batch ? "cuBLASLt per batch" : "cuBLASLt") : std::string("direct matmul")) + (ta == DType::bf16 ? " bf16" : "") +
             (copied ? " (an f32 operand read as its bf16 copy)" : "") + " (dot_general outside a kernel)";
  for (const Value* v : n.inputs) info.bytes += static_cast<int64_t>(mem_bytes(v));
  info.bytes += static_cast<int64_t>(mem_bytes(n.outputs[0]));
  (s.lt ? stats_.cublaslt_matmuls : stats_.direct_matmuls)++;
  steps_.push_back(std::move(s));
  infos_.push_back(std::move(info));
}

// A core node as a generated device function (gathers report out-of-range indices through their flag).
void CudaExecutableImpl::device_node_step(const Node& n, size_t ni) {
  Step s;
  s.node = &n;
  CudaStepInfo info;
  s.kind = Step::Kind::node;
  for (const Value* v : n.inputs) s.args.push_back(dev(v));
  s.args.push_back(dev(n.outputs[0]));
  const bool scatter = is_core_op(n, CoreOp::scatter);
  if (is_core_op(n, CoreOp::gather) || scatter) {
    s.gather_flag = static_cast<int>(flag_node_.size());
    s.args.push_back(static_cast<int*>(flags_.p) + s.gather_flag);
    flag_node_.push_back(&n);
  }
  s.fn = kernel_of(cuda::node_symbol(ni));
  s.shape = cuda::node_launch_shape(n, sms_, vst_);
  if (scatter) {
    s.update = kernel_of(cuda::scatter_update_symbol(ni));
    s.update_shape = cuda::scatter_update_launch_shape(n, sms_);
  }
  info.name = display_text(n.name);
  info.kind = "node";
  info.how = "generated " + n.op->name;
  for (const Value* v : n.inputs) info.bytes += static_cast<int64_t>(mem_bytes(v));
  info.bytes += static_cast<int64_t>(mem_bytes(n.outputs[0]));
  steps_.push_back(std::move(s));
  infos_.push_back(std::move(info));
}

void CudaExecutableImpl::host_step(const Node& n) {
  Step s;
  s.node = &n;
  CudaStepInfo info;
  // A core node no kernel covers: the graph backend's typed kernel (or the reference kernel) on host copies.
  s.kind = Step::Kind::host;
  if (n.op->core.has_value()) s.host_kernel = make_core_kernel(n);
  for (const Value* v : n.inputs) s.host_in.emplace_back(v && !v->constant ? mem_bytes(v) : 0);
  for (const Value* v : n.outputs) s.host_out.emplace_back(v ? mem_bytes(v) : 0);
  info.name = display_text(n.name);
  info.kind = "host";
  info.how = "host: " + n.op->name + (s.host_kernel ? "" : " (reference kernel)");
  for (const Value* v : n.inputs) info.bytes += v ? static_cast<int64_t>(bytes_of(v->type)) : 0;
  for (const Value* v : n.outputs) info.bytes += v ? static_cast<int64_t>(bytes_of(v->type)) : 0;
  stats_.host_steps++;
  stats_.host_ops.push_back(n.op->name);
  steps_.push_back(std::move(s));
  infos_.push_back(std::move(info));
}

std::shared_ptr<LtMatmul> CudaExecutableImpl::make_lt(const MatmulSpec& mm, const std::vector<void*>& args, const std::vector<DType>& st,
                                                      const cuda::LtEpilogue* epi) {
  const DType da = st[static_cast<size_t>(mm.a)], db = st[static_cast<size_t>(mm.b)], dc = st[static_cast<size_t>(mm.c)];
  const int64_t ea = dtype_size(da), eb = dtype_size(db), ec = dtype_size(dc);
  const bool dense_c = mm.c_batch == 0 && mm.c_m == 0 && mm.c_n == 0;
  const int64_t cb = dense_c ? int64_t{mm.m * mm.n} : int64_t{mm.c_batch}, cm = dense_c ? int64_t{mm.n} : int64_t{mm.c_m};
  const char* A = static_cast<const char*>(args[static_cast<size_t>(mm.a)]) + mm.a_offset * ea;
  const char* B = static_cast<const char*>(args[static_cast<size_t>(mm.b)]) + mm.b_offset * eb;
  // cuBLASLt's A is B^T here and its B is A^T (C^T = B^T . A^T)
  const uint32_t al_a = static_cast<uint32_t>(alignment_of(B, mm.b_batch * eb));
  const uint32_t al_b = static_cast<uint32_t>(alignment_of(A, mm.a_batch * ea));
  const uint32_t al_c = static_cast<uint32_t>(alignment_of(args[static_cast<size_t>(mm.c)], cb * ec));
  const bool fold = epi && epi->fold;
  // A symbolic module makes its steps again at every binding: a plan whose sizes, layouts, types, epilogue
  // (with its bias pointer: a weight's, the same in every binding) and operand alignments are those of one
  // made before is that plan (the heuristic's query is most of a step's making).
  std::string plan_key;
  if (symbolic_) {
    plan_key = fmt::format("{} {} {} {} | {} {} {} {} {} {} | {} {} {} | {} {} {} | {} {} {} {} | {} {} {}", int64_t{mm.batch}, int64_t{mm.m}, int64_t{mm.n},
                           int64_t{mm.k}, int64_t{mm.a_m}, int64_t{mm.a_k}, int64_t{mm.a_batch}, int64_t{mm.b_k}, int64_t{mm.b_n}, int64_t{mm.b_batch},
                           int64_t{mm.c_batch}, int64_t{mm.c_m}, int64_t{mm.c_n}, ea, eb, ec, fold ? static_cast<int>(epi->act) : -1,
                           fold && epi->bias ? args[static_cast<size_t>(epi->bias_arg)] : nullptr,
                           fold && epi->bias ? static_cast<int>(st[static_cast<size_t>(epi->bias_arg)]) : -1, fold && epi->residual ? epi->residual_arg : -1,
                           al_a, al_b, al_c);
    if (auto it = lt_plans_.find(plan_key); it != lt_plans_.end()) return it->second;
  }
  auto lt = std::make_shared<LtMatmul>();
  lt->ea = static_cast<size_t>(ea), lt->eb = static_cast<size_t>(eb), lt->ec = static_cast<size_t>(ec);
  lt->per_batch = mm.batch > 1 && (mm.a_batch == 0 || mm.b_batch == 0 || cb == 0);
  const int64_t lb = lt->per_batch ? int64_t{1} : int64_t{mm.batch};
  const MatrixShape xs = x_shape(mm), ys = y_shape(mm);
  ck(cuda::cublaslt().cublasLtMatmulDescCreate(&lt->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t ta = xs.trans ? CUBLAS_OP_T : CUBLAS_OP_N, tb = ys.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  ck(cuda::cublaslt().cublasLtMatmulDescSetAttribute(lt->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "transa");
  ck(cuda::cublaslt().cublasLtMatmulDescSetAttribute(lt->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "transb");
  if (epi && epi->fold) {
    using Act = cuda::LtEpilogue::Act;
    cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_DEFAULT;
    if (epi->act == Act::gelu_tanh) e = epi->bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    else if (epi->act == Act::relu) e = epi->bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    else if (epi->bias) e = CUBLASLT_EPILOGUE_BIAS;
    ck(cuda::cublaslt().cublasLtMatmulDescSetAttribute(lt->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e), "epilogue");
    if (epi->bias) {
      const void* bias = args[static_cast<size_t>(epi->bias_arg)];
      const cudaDataType_t bt = lt_type(st[static_cast<size_t>(epi->bias_arg)]);
      ck(cuda::cublaslt().cublasLtMatmulDescSetAttribute(lt->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), "bias pointer");
      ck(cuda::cublaslt().cublasLtMatmulDescSetAttribute(lt->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt), "bias type");
    }
    lt->epilogue = true;
    lt->residual_arg = epi->residual ? epi->residual_arg : -1;
  }
  lt->la = make_layout(xs, lb, mm.b_batch, db);
  lt->lb = make_layout(ys, lb, mm.a_batch, da);
  lt->lc = make_layout(MatrixShape{static_cast<uint64_t>(mm.n), static_cast<uint64_t>(mm.m), mm.m == 1 ? std::max<int64_t>(cm, mm.n) : cm, false}, lb, cb, dc);
  cublasLtMatmulPreference_t pref = nullptr;
  ck(cuda::cublaslt().cublasLtMatmulPreferenceCreate(&pref), "preference");
  const uint64_t ws = kWorkspaceBytes;
  cuda::cublaslt().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  cuda::cublaslt().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a);
  cuda::cublaslt().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b);
  cuda::cublaslt().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c);
  cuda::cublaslt().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c);
  cublasLtMatmulHeuristicResult_t res[kLtCandidates]{};
  int found = 0;
  const cublasStatus_t hs = cuda::cublaslt().cublasLtMatmulAlgoGetHeuristic(lt_, lt->op, lt->la, lt->lb, lt->lc, lt->lc, pref,
                                                                             time_matmuls_ ? kLtCandidates : 1, res, &found);
  cuda::cublaslt().cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) return nullptr;
  lt->algo = res[0].algo;
  if (found > 1) {
    const std::string key = fmt::format("{} {} {} {} | {} {} {} {} | {} {} {} {} | {} {} {} | {} {} {} {} {} {} {} {}", mm.batch, mm.m, mm.n, mm.k, mm.a_m,
                                        mm.a_k, mm.a_batch, mm.b_k, mm.b_n, mm.b_batch, mm.c_batch, mm.c_m, mm.c_n, lt->ea, lt->eb, lt->ec,
                                        epi && epi->fold ? static_cast<int>(epi->act) : -1, epi && epi->fold && epi->bias,
                                        lt->residual_arg >= 0, lt->per_batch, al_a, al_b, al_c, found);
    choose_lt_algo(*lt, mm, args, res, found, key);
  }
  if (symbolic_) {
    if (lt_plans_.size() >= kLtPlans) lt_plans_.clear();  // (bounded: a long generation's every length is new)
    lt_plans_.emplace(plan_key, lt);
  }
  return lt;
}

bool CudaExecutableImpl::read_bf16_copy(Step& s, int& arg, const Value* v, const std::function<bool()>& plan) {
  const int before = arg;
  const long long n = shape_numel(v->type.shape);
  auto [it, fresh] = bf16_copy_.try_emplace(v->id);
  if (fresh) {
    const int key = symbolic_ && static_cast<size_t>(v->id) < twin_id_.size() && twin_id_[static_cast<size_t>(v->id)] >= 0 ? twin_id_[static_cast<size_t>(v->id)] : v->id;
    it->second = bf16_pool_[key].fit(static_cast<size_t>(n) * dtype_size(DType::bf16), symbolic_, "a matmul operand's bf16 copy");
  }
  arg = static_cast<int>(s.args.size());
  s.args.push_back(it->second);
  s.arg_mem.push_back(DType::bf16);
  if (plan()) {
    if (fresh) s.converts.push_back(Step::Convert{dev(v), it->second, n});
    load_convert();
    return true;
  }
  arg = before;
  s.args.pop_back();
  s.arg_mem.pop_back();
  if (fresh) {
    bf16_copy_.erase(it);
    if (!symbolic_) bf16_pool_.erase(v->id);  // (a static module's copy no step reads)
  }
  return false;
}

void CudaExecutableImpl::enqueue_converts(const Step& s) {
  for (const Step::Convert& c : s.converts) {
    const void* src = c.src;
    void* dst = c.dst;
    long long n = c.n;
    void* params[] = {&src, &dst, &n};
    const unsigned blocks = static_cast<unsigned>(std::clamp<long long>((n + 255) / 256, 1, 8LL * sms_));
    ck(cudaLaunchKernel(reinterpret_cast<const void*>(convert_), dim3(blocks), dim3(256), params, 0, cur_), "converting a matmul operand to bf16");
  }
}

void CudaExecutableImpl::launch(cudaKernel_t f, const cuda::LaunchShape& sh, std::vector<void*>& ptrs) {
  // the pointers, then the binding's size symbols (every generated function of a symbolic module takes them last)
  std::vector<void*> params(ptrs.size() + sym_values_.size());
  for (size_t i = 0; i < ptrs.size(); ++i) params[i] = &ptrs[i];
  for (size_t j = 0; j < sym_values_.size(); ++j) params[ptrs.size() + j] = &sym_values_[j];
  ck(cudaLaunchKernel(reinterpret_cast<const void*>(f), dim3(static_cast<unsigned>(sh.blocks)), dim3(static_cast<unsigned>(sh.threads)),
                      params.data(), 0, cur_),
     "launching a generated kernel");
}

cublasStatus_t CudaExecutableImpl::enqueue_lt(const LtMatmul& lt, const MatmulSpec& mm, const std::vector<void*>& args,
                                              const cublasLtMatmulAlgo_t& algo, cudaStream_t st) {
  const float alpha = 1.0f, beta = lt.residual_arg >= 0 ? 1.0f : 0.0f;
  const int64_t ea = static_cast<int64_t>(lt.ea), eb = static_cast<int64_t>(lt.eb), ec = static_cast<int64_t>(lt.ec);
  const char* A = static_cast<const char*>(args[static_cast<size_t>(mm.a)]) + mm.a_offset * ea;
  const char* B = static_cast<const char*>(args[static_cast<size_t>(mm.b)]) + mm.b_offset * eb;
  char* C = static_cast<char*>(args[static_cast<size_t>(mm.c)]);
  const bool dense_c = mm.c_batch == 0 && mm.c_m == 0 && mm.c_n == 0;
  const int64_t cb = dense_c ? mm.m * mm.n : mm.c_batch;
  const int64_t calls = lt.per_batch ? int64_t{mm.batch} : int64_t{1};
  for (int64_t b = 0; b < calls; ++b) {
    const char* x = B + b * mm.b_batch * eb;
    const char* y = A + b * mm.a_batch * ea;
    char* c = C + b * cb * ec;
    // with a folded residual, cuBLASLt's C is the residual (same layout and type as D), else D itself
    const char* cin = lt.residual_arg >= 0 ? static_cast<const char*>(args[static_cast<size_t>(lt.residual_arg)]) + b * cb * ec : c;
    const cublasStatus_t st_b = cuda::cublaslt().cublasLtMatmul(lt_, lt.op, &alpha, x, lt.la, y, lt.lb, &beta, cin, lt.lc, c, lt.lc, &algo,
                                                                workspace_.p, kWorkspaceBytes, st);
    if (st_b != CUBLAS_STATUS_SUCCESS) return st_b;
  }
  return CUBLAS_STATUS_SUCCESS;
}

void CudaExecutableImpl::run_lt(Step& s) { ck(enqueue_lt(*s.lt, s.spec, s.args, s.lt->algo, cur_), "cublasLtMatmul"); }

// Build time, before any call: the step's buffers hold nothing yet, so the candidates may write its result
// (and, with a folded residual, read whatever its C holds). Each candidate runs once to warm up, then
// kTimed times between two events; one that fails is skipped. The heuristic's first stays unless another
// is faster by more than 3 % (the noise of one short measurement).
void CudaExecutableImpl::choose_lt_algo(LtMatmul& lt, const MatmulSpec& mm, const std::vector<void*>& args,
                                        const cublasLtMatmulHeuristicResult_t* res, int found, const std::string& key) {
  if (auto it = lt_chosen_.find(key); it != lt_chosen_.end()) {
    lt.algo = res[it->second.first].algo;
    lt.choice = it->second.second;
    return;
  }
  constexpr int kTimed = 5;
  const auto t0 = Clock::now();
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  ck(cudaEventCreate(&e0), "cudaEventCreate");
  ck(cudaEventCreate(&e1), "cudaEventCreate");
  std::vector<float> ms(static_cast<size_t>(found), -1.0f);
  for (int i = 0; i < found; ++i) {
    if (enqueue_lt(lt, mm, args, res[i].algo, stream_) != CUBLAS_STATUS_SUCCESS) continue;
    ck(cudaEventRecord(e0, stream_), "cudaEventRecord");
    bool ok = true;
    for (int r = 0; r < kTimed && ok; ++r) ok = enqueue_lt(lt, mm, args, res[i].algo, stream_) == CUBLAS_STATUS_SUCCESS;
    ck(cudaEventRecord(e1, stream_), "cudaEventRecord");
    ck(cudaEventSynchronize(e1), "timing cuBLASLt candidates");
    float t = 0;
    if (ok && cudaEventElapsedTime(&t, e0, e1) == cudaSuccess) ms[static_cast<size_t>(i)] = t / kTimed;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  int best = 0;
  for (int i = 1; i < found; ++i)
    if (ms[static_cast<size_t>(i)] >= 0 && (ms[static_cast<size_t>(best)] < 0 || ms[static_cast<size_t>(i)] < ms[static_cast<size_t>(best)] * 0.97f)) best = i;
  lt.algo = res[best].algo;
  lt.choice = ms[0] < 0 || best == 0
                  ? fmt::format("timed {} candidates: the heuristic's first kept ({:.1f} us)", found, 1000.0 * std::max(0.0f, ms[0]))
                  : fmt::format("timed {} candidates: #{} {:.1f} us against the heuristic's first {:.1f} us", found, best + 1,
                                1000.0 * ms[static_cast<size_t>(best)], 1000.0 * ms[0]);
  lt_chosen_.emplace(key, std::make_pair(best, lt.choice));
  stats_.timed_matmuls++;
  stats_.retimed_algos += best != 0;
  stats_.matmul_timing_seconds += seconds_since(t0);
}

void CudaExecutableImpl::run_host(Step& s) {
  const Node& n = *s.node;
  ck(cudaStreamSynchronize(cur_), "synchronising before a host step");
  std::vector<Tensor> ins(n.inputs.size());
  std::vector<const Tensor*> ptrs(n.inputs.size(), nullptr);
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const Value* v = n.inputs[i];
    if (!v) continue;
    if (v->constant) {
      ins[i] = v->constant->reshaped(v->type.shape);
    } else {
      ins[i] = Tensor(v->type.dtype, v->type.shape);
      if (mem(v) == DType::bf16 && v->type.dtype == DType::f32) {
        std::vector<uint16_t> h(static_cast<size_t>(ins[i].numel()));
        if (!h.empty()) ck(cudaMemcpy(h.data(), dev(v), h.size() * 2, cudaMemcpyDeviceToHost), "copying a host step's operand");
        cuda::bf16_to_f32(h.data(), ins[i].data<float>(), ins[i].numel());
      } else if (ins[i].nbytes()) {
        ck(cudaMemcpy(ins[i].bytes(), dev(v), ins[i].nbytes(), cudaMemcpyDeviceToHost), "copying a host step's operand");
      }
    }
    ptrs[i] = &ins[i];
  }
  std::vector<Tensor> outs;
  if (s.host_kernel) {
    KernelEnv env;
    size_t nv = ptr_.size();
    env.ptr.assign(nv, nullptr);
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (n.inputs[i]) env.ptr[static_cast<size_t>(n.inputs[i]->id)] = const_cast<uint8_t*>(ins[i].bytes());
    for (const Value* v : n.outputs) {
      outs.emplace_back(v ? Tensor(v->type.dtype, v->type.shape) : Tensor());
      if (v) env.ptr[static_cast<size_t>(v->id)] = outs.back().bytes();
    }
    s.host_kernel(env);
  } else {
    outs = run_node(n, ptrs);
  }
  for (size_t i = 0; i < n.outputs.size() && i < outs.size(); ++i) {
    const Value* v = n.outputs[i];
    if (!v || !outs[i].nbytes()) continue;
    if (outs[i].nbytes() != bytes_of(v->type)) fail("host step result '{}' has {} bytes, {} were planned", display_text(v->name), outs[i].nbytes(), bytes_of(v->type));
    if (mem(v) == DType::bf16 && outs[i].dtype() == DType::f32) {
      std::vector<uint16_t> h(static_cast<size_t>(outs[i].numel()));
      cuda::f32_to_bf16(outs[i].data<float>(), h.data(), outs[i].numel());
      ck(cudaMemcpy(dev(v), h.data(), h.size() * 2, cudaMemcpyHostToDevice), "copying a host step's result");
    } else {
      ck(cudaMemcpy(dev(v), outs[i].bytes(), outs[i].nbytes(), cudaMemcpyHostToDevice), "copying a host step's result");
    }
  }
}

void CudaExecutableImpl::enqueue(Step& s, cudaEvent_t before_epilogue) {
  if (s.kind == Step::Kind::host) {
    run_host(s);
    return;
  }
  if (s.kind == Step::Kind::node) {
    launch(s.fn, s.shape, s.args);
    if (s.update) launch(s.update, s.update_shape, s.args);
    return;
  }
  enqueue_converts(s);
  if (s.kind == Step::Kind::matmul) {
    if (s.lt) run_lt(s);
    else launch(s.mm, s.mm_shape, s.args);
    return;
  }
  if (s.kind == Step::Kind::attention) {
    std::vector<void*> params(s.args.size());
    for (size_t i = 0; i < s.args.size(); ++i) params[i] = &s.args[i];
    ck(cudaLaunchKernel(reinterpret_cast<const void*>(s.fn), s.grid, dim3(static_cast<unsigned>(s.shape.threads)), params.data(), 0, cur_),
       "launching the fused attention kernel");
    return;
  }
  const Kernel& k = *s.kernel;
  if (k.kind == KernelKind::matmul) {
    if (s.lt) run_lt(s);
    else {
      std::vector<void*> p = {static_cast<float*>(s.args[static_cast<size_t>(k.mm.a)]), static_cast<float*>(s.args[static_cast<size_t>(k.mm.b)]),
                              s.args[static_cast<size_t>(k.mm.c)]};
      launch(s.mm, s.mm_shape, p);
    }
  } else if (k.kind == KernelKind::conv && s.lt) {
    if (s.im2col) {
      std::vector<void*> p = {s.args[static_cast<size_t>(k.conv.x)], col_.buf.p};
      launch(s.im2col, s.im2col_shape, p);
    }
    run_lt(s);
  } else if (k.kind == KernelKind::conv) {
    std::vector<void*> p = {s.args[static_cast<size_t>(k.conv.x)], s.args[static_cast<size_t>(k.conv.w)], s.args[static_cast<size_t>(k.conv.y)]};
    launch(s.conv, s.conv_shape, p);
  }
  if (s.fn && before_epilogue) ck(cudaEventRecord(before_epilogue, cur_), "cudaEventRecord");
  if (s.fn) launch(s.fn, s.shape, s.args);
}

void CudaExecutableImpl::enqueue_all() {
  for (size_t i = 0; i < steps_.size(); ++i) {
    try {
      enqueue(steps_[i]);
    } catch (const Error& e) {
      const Node& n = *steps_[i].node;
      throw e.with_context(Location{.node = n.name, .op = n.op->name, .pass = "cuda run"});
    }
  }
}

void CudaExecutableImpl::copy_inputs(const std::vector<Tensor>& inputs) {
  const Graph& g = *module_.graph;
  if (inputs.size() != g.inputs.size())
    throw Error(Location{.pass = "run"}, fmt::format("the model takes {} inputs but {} were given", g.inputs.size(), inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value* v = g.inputs[i];
    const Tensor& t = inputs[i];
    if (t.dtype() != v->type.dtype || t.shape() != v->type.shape)
      throw Error(Location{.pass = "guard"}, fmt::format("input '{}' must be {} (compiled for it) but got {}", display_text(v->name), v->type.str(),
                                                         TensorType{t.dtype(), t.shape()}.str()));
    std::vector<uint16_t>& h = input_bf16_[i];
    if (!h.empty()) {
      // stored as bf16: converted here (a pageable source: the copy has read it when the call returns)
      cuda::f32_to_bf16(t.data<float>(), h.data(), t.numel());
      ck(cudaMemcpyAsync(inputs_dev_[i].buf.p, h.data(), h.size() * 2, cudaMemcpyHostToDevice, stream_), "copying an input");
    } else if (t.nbytes()) {
      ck(cudaMemcpyAsync(inputs_dev_[i].buf.p, t.bytes(), t.nbytes(), cudaMemcpyHostToDevice, stream_), "copying an input");
    }
  }
}

std::vector<Tensor> CudaExecutableImpl::copy_outputs() {
  std::vector<Tensor> outs;
  for (const Value* v : module_.graph->outputs) {
    if (v->constant) {
      outs.push_back(v->constant->clone());
      continue;
    }
    if (mem(v) != v->type.dtype) fail("output '{}' is not stored as {}", display_text(v->name), dtype_name(v->type.dtype));  // value_storage keeps outputs
    Tensor t(v->type.dtype, v->type.shape);
    if (t.nbytes()) ck(cudaMemcpyAsync(t.bytes(), dev(v), t.nbytes(), cudaMemcpyDeviceToHost, stream_), "copying an output");
    outs.push_back(std::move(t));
  }
  std::vector<int> flags(flag_node_.size(), 0);
  if (!flags.empty()) ck(cudaMemcpyAsync(flags.data(), flags_.p, flags.size() * sizeof(int), cudaMemcpyDeviceToHost, stream_), "reading the gather flags");
  ck(cudaStreamSynchronize(stream_), "finishing the call");
  for (size_t i = 0; i < flags.size(); ++i)
    if (flags[i]) {
      ck(cudaMemset(flags_.p, 0, flags.size() * sizeof(int)), "cudaMemset");
      throw Error(Location{.node = flag_node_[i]->name, .op = flag_node_[i]->op->name, .pass = "cuda run"}, fmt::format("a {} index is out of range for its axis", flag_node_[i]->op->name));
    }
  return outs;
}

// One call's steps on stream `s`: the captured graph launched, or the steps enqueued one by one. The second
// call is captured (the first one ran every launch once, eagerly: lazy module loading and cuBLASLt's
// first-use work happen outside the graph) and every later call replays it.
void CudaExecutableImpl::enqueue_call(cudaStream_t s) {
  if (!exec_ && use_graph_ && calls_ >= 1) capture_graph();
  if (exec_) {
    ck(cudaGraphLaunch(exec_, s), "cudaGraphLaunch");
    return;
  }
  cur_ = s;
  try {
    enqueue_all();
  } catch (...) {
    cur_ = stream_;
    throw;
  }
  cur_ = stream_;
}

// The call's steps captured on the executable's own stream (nothing runs while capturing) and
// instantiated; launched by the caller on whichever stream the call uses.
void CudaExecutableImpl::capture_graph() {
  cur_ = stream_;
  ck(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  try {
    enqueue_all();
  } catch (...) {
    cudaGraph_t dropped = nullptr;
    cudaStreamEndCapture(stream_, &dropped);
    if (dropped) cudaGraphDestroy(dropped);
    throw;
  }
  ck(cudaStreamEndCapture(stream_, &graph_), "cudaStreamEndCapture");
  ck(cudaGraphInstantiate(&exec_, graph_, 0), "cudaGraphInstantiate");
}

std::vector<Tensor> CudaExecutableImpl::run(const std::vector<Tensor>& inputs) {
  if (symbolic_) {
    std::vector<Shape> shapes;
    for (const Tensor& t : inputs) shapes.push_back(t.shape());
    bind(shapes);
  }
  check_deferred_flags(true);
  if (done_recorded_) ck(cudaStreamWaitEvent(stream_, done_, 0), "waiting for the previous call");
  cur_ = stream_;
  copy_inputs(inputs);
  enqueue_call(stream_);
  ++calls_;
  return copy_outputs();
}

// run_device's gather flags: copied to pinned memory after each call and read here by a later call once
// that copy has finished (`wait`: wait for it), so that a call never synchronises the host.
void CudaExecutableImpl::check_deferred_flags(bool wait) {
  if (!flags_pending_) return;
  if (wait) ck(cudaEventSynchronize(flags_ev_), "waiting for the gather flags");
  else {
    const cudaError_t q = cudaEventQuery(flags_ev_);
    if (q == cudaErrorNotReady) return;
    ck(q, "reading the gather flags");
  }
  flags_pending_ = false;
  for (size_t i = 0; i < flag_node_.size(); ++i)
    if (flags_host_[i]) {
      std::fill(flags_host_, flags_host_ + flag_node_.size(), 0);
      ck(cudaMemset(flags_.p, 0, flag_node_.size() * sizeof(int)), "cudaMemset");
      throw Error(Location{.node = flag_node_[i]->name, .op = flag_node_[i]->op->name, .pass = "cuda run"},
                  is_core_op(*flag_node_[i], CoreOp::scatter)
                      ? "a scatter index was out of range for its axis in an earlier call (that update was not written)"
                      : "a gather index was out of range for its axis in an earlier call (its outputs read 0 there)");
    }
}

namespace {

// f32 -> bf16 on the device for run_device's inputs stored as bf16 and for the bf16 copies of matmul operands
// stored f32 (read_bf16_copy): round to nearest even, NaN stays a quiet NaN, a finite value beyond bf16's
// range saturates to the largest bf16 (cuda::f32_to_bf16's rules).
const char* kConvertSource = R"(// tessel: f32 -> bf16 conversion (inputs, matmul operands)
extern "C" __global__ void tsl_f32_to_bf16(const float* __restrict__ x, unsigned short* __restrict__ y, long long n) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const unsigned u = __float_as_uint(x[i]);
    unsigned short h;
    if ((u & 0x7fffffffu) > 0x7f800000u) h = (unsigned short)((u >> 16) | 0x40u);
    else {
      h = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      if ((u & 0x7fffffffu) != 0x7f800000u && (h & 0x7fffu) == 0x7f80u) h = (unsigned short)((h & 0x8000u) | 0x7f7fu);
    }
    y[i] = h;
  }
}
)";

}  // namespace

void CudaExecutableImpl::load_convert() {
  if (convert_) return;
  cuda::NvrtcOptions no;
  no.arch = cuda::device_arch();
  const cuda::NvrtcResult nr = cuda::compile_cuda_source(kConvertSource, "tsl_convert", no);
  ck(cudaLibraryLoadData(&convert_lib_, nr.cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0), "loading the f32 -> bf16 conversion");
  ck(cudaLibraryGetKernel(&convert_, convert_lib_, "tsl_f32_to_bf16"), "cudaLibraryGetKernel");
}

void CudaExecutableImpl::run_device(const std::vector<uint64_t>& inputs, const std::vector<uint64_t>& outputs, uint64_t stream) {
  if (symbolic_ && !bound_)
    throw Error(Location{.pass = "run"}, "the model has size symbols: bind() the call's input shapes before run_device (its output_types are then that binding's)");
  const Graph& g = *module_.graph;
  if (inputs.size() != g.inputs.size())
    throw Error(Location{.pass = "run"}, fmt::format("the model takes {} inputs but {} device pointers were given", g.inputs.size(), inputs.size()));
  if (outputs.size() != g.outputs.size())
    throw Error(Location{.pass = "run"}, fmt::format("the model has {} outputs but {} device pointers were given", g.outputs.size(), outputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i] && bytes_of(g.inputs[i]->type)) throw Error(Location{.pass = "run"}, fmt::format("input {} is a null device pointer", i));
  for (size_t j = 0; j < outputs.size(); ++j)
    if (!outputs[j] && bytes_of(g.outputs[j]->type)) throw Error(Location{.pass = "run"}, fmt::format("output {} is a null device pointer", j));
  check_deferred_flags(false);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream));
  // The buffers are shared by every call: wait (on the device) for the previous one, whatever its stream.
  if (done_recorded_) ck(cudaStreamWaitEvent(s, done_, 0), "waiting for the previous call");
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value* v = g.inputs[i];
    const void* src = reinterpret_cast<const void*>(static_cast<uintptr_t>(inputs[i]));
    if (!input_bf16_[i].empty()) {
      load_convert();
      long long n = shape_numel(v->type.shape);
      void* dst = inputs_dev_[i].buf.p;
      void* params[] = {&src, &dst, &n};
      const unsigned blocks = static_cast<unsigned>(std::clamp<long long>((n + 255) / 256, 1, 8LL * sms_));
      ck(cudaLaunchKernel(reinterpret_cast<const void*>(convert_), dim3(blocks), dim3(256), params, 0, s), "converting an input to bf16");
    } else if (const size_t nb = bytes_of(v->type)) {
      ck(cudaMemcpyAsync(inputs_dev_[i].buf.p, src, nb, cudaMemcpyDeviceToDevice, s), "copying an input");
    }
  }
  enqueue_call(s);
  for (size_t j = 0; j < outputs.size(); ++j) {
    const Value* v = g.outputs[j];
    const size_t nb = bytes_of(v->type);
    if (!nb) continue;
    if (!v->constant && mem(v) != v->type.dtype) fail("output '{}' is not stored as {}", display_text(v->name), dtype_name(v->type.dtype));
    const void* from = v->constant ? out_consts_[j].p : dev(v);
    ck(cudaMemcpyAsync(reinterpret_cast<void*>(static_cast<uintptr_t>(outputs[j])), from, nb, cudaMemcpyDeviceToDevice, s), "copying an output");
  }
  if (!flag_node_.empty()) {
    ck(cudaMemcpyAsync(flags_host_, flags_.p, flag_node_.size() * sizeof(int), cudaMemcpyDeviceToHost, s), "reading the gather flags");
    ck(cudaEventRecord(flags_ev_, s), "cudaEventRecord");
    flags_pending_ = true;
  }
  ck(cudaEventRecord(done_, s), "cudaEventRecord");
  done_recorded_ = true;
  ++calls_;
}

double CudaExecutableImpl::recapture_ms(int iters) {
  if (!exec_) return 0;
  std::vector<double> t;
  for (int i = 0; i < std::max(1, iters); ++i) {
    const auto t0 = Clock::now();
    cudaGraph_t gr = nullptr;
    cur_ = stream_;
    ck(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    try {
      enqueue_all();
    } catch (...) {
      cudaStreamEndCapture(stream_, &gr);
      if (gr) cudaGraphDestroy(gr);
      throw;
    }
    ck(cudaStreamEndCapture(stream_, &gr), "cudaStreamEndCapture");
    cudaGraphExecUpdateResultInfo info{};
    const cudaError_t e = cudaGraphExecUpdate(exec_, gr, &info);
    cudaGraphDestroy(gr);
    ck(e, "cudaGraphExecUpdate");
    t.push_back(seconds_since(t0) * 1e3);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double CudaExecutableImpl::replay_ms(int iters) {
  if (symbolic_ && !bound_) throw Error(Location{.pass = "run"}, "the model has size symbols and no call has bound them yet");
  cudaEvent_t a = nullptr, b = nullptr;
  ck(cudaEventCreate(&a), "cudaEventCreate");
  ck(cudaEventCreate(&b), "cudaEventCreate");
  float ms = 0;
  cur_ = stream_;
  try {
    if (done_recorded_) ck(cudaStreamWaitEvent(stream_, done_, 0), "waiting for the previous call");
    ck(cudaEventRecord(a, stream_), "cudaEventRecord");
    for (int i = 0; i < iters; ++i) {
      if (exec_) ck(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch");
      else enqueue_all();
    }
    ck(cudaEventRecord(b, stream_), "cudaEventRecord");
    ck(cudaEventSynchronize(b), "cudaEventSynchronize");
    ck(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  } catch (...) {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    throw;
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / std::max(1, iters);
}

std::vector<CudaStepTime> CudaExecutableImpl::profile(const std::vector<Tensor>& inputs, int iters) {
  if (symbolic_) {
    std::vector<Shape> shapes;
    for (const Tensor& t : inputs) shapes.push_back(t.shape());
    bind(shapes);
  }
  cur_ = stream_;
  if (done_recorded_) ck(cudaStreamWaitEvent(stream_, done_, 0), "waiting for the previous call");
  copy_inputs(inputs);
  const size_t n = steps_.size();
  // ev[i]..ev[i+1] around step i; mid[i] between a kernel step's library call and its generated epilogue
  std::vector<cudaEvent_t> ev(n + 1, nullptr), mid(n, nullptr);
  std::vector<bool> split(n, false);
  for (size_t i = 0; i < n; ++i) {
    const Step& s = steps_[i];
    split[i] = s.kind == Step::Kind::kernel && s.fn && (s.kernel->kind == KernelKind::matmul || s.kernel->kind == KernelKind::conv);
  }
  auto destroy = [&] {
    for (auto& e : ev) cudaEventDestroy(e);
    for (auto& e : mid)
      if (e) cudaEventDestroy(e);
  };
  std::vector<std::vector<float>> times(n), epilogue(n);
  try {
    for (auto& e : ev) ck(cudaEventCreate(&e), "cudaEventCreate");
    for (size_t i = 0; i < n; ++i)
      if (split[i]) ck(cudaEventCreate(&mid[i]), "cudaEventCreate");
    // Each call's steps queue behind tsl_hold, which waits (on the device) longer than the host took to
    // enqueue the previous call's steps: without it, steps shorter than their launch measured the host.
    double hold_ms = 0.2 + 0.02 * static_cast<double>(n);
    for (int it = 0; it < std::max(1, iters); ++it) {
      unsigned long long ns = static_cast<unsigned long long>(hold_ms * 1e6);
      void* hp[] = {&ns};
      ck(cudaLaunchKernel(reinterpret_cast<const void*>(hold_), dim3(1), dim3(32), hp, 0, stream_), "launching tsl_hold");
      const auto te = Clock::now();
      ck(cudaEventRecord(ev[0], stream_), "cudaEventRecord");
      for (size_t i = 0; i < n; ++i) {
        enqueue(steps_[i], mid[i]);
        ck(cudaEventRecord(ev[i + 1], stream_), "cudaEventRecord");
      }
      hold_ms = std::min(50.0, std::max(hold_ms, 1.5 * seconds_since(te) * 1e3 + 0.05));
      ck(cudaEventSynchronize(ev[n]), "cudaEventSynchronize");
      for (size_t i = 0; i < n; ++i) {
        float ms = 0;
        ck(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]), "cudaEventElapsedTime");
        times[i].push_back(ms);
        if (!split[i]) continue;
        ck(cudaEventElapsedTime(&ms, mid[i], ev[i + 1]), "cudaEventElapsedTime");
        epilogue[i].push_back(ms);
      }
    }
  } catch (...) {
    destroy();
    throw;
  }
  destroy();
  auto median = [](std::vector<float>& t) {
    std::sort(t.begin(), t.end());
    return t.empty() ? 0.0 : double(t[t.size() / 2]);
  };
  std::vector<CudaStepTime> r;
  for (size_t i = 0; i < n; ++i) r.push_back(CudaStepTime{infos_[i], median(times[i]), split[i] ? median(epilogue[i]) : -1.0});
  return r;
}

std::unique_ptr<CudaExecutable> compile_cuda(std::unique_ptr<Graph> g, const std::vector<Tensor>& ex, const CudaBackendOptions& o) {
  const auto t0 = Clock::now();
  const cuda::DeviceInfo& di = cuda::device_info();
  if (!di.usable) throw Error(Location{.pass = "cuda"}, di.why);
  auto tp = Clock::now();
  KernelModule m = lower_for_cuda(std::move(g), ex, o);
  const double lower = seconds_since(tp);
  auto exe = std::make_unique<CudaExecutableImpl>();
  exe->build(std::move(m), ex, o);
  auto& st = const_cast<CudaCompileStats&>(exe->stats());
  st.pass_seconds = lower;
  st.compile_seconds = seconds_since(t0);
  return exe;
}

}  // namespace tessel
