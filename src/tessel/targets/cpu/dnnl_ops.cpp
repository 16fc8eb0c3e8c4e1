// oneDNN matmul and convolution primitives: descriptors checked and primitives built once, run()
// executes.
#include "tessel/ir/core_ops.h"
#include "tessel/targets/cpu/dnnl_ops.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "tessel/ir/graph.h"
#include "tessel/support/error.h"
#include "tessel/support/pages.h"
#include "tessel/support/thread_team.h"
#include "tessel/support/threads.h"

namespace tessel::cpu {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
constexpr memory::data_type kF32 = memory::data_type::f32;

// One engine and stream for the process (oneDNN's CPU engine is cheap to share).
struct Runtime {
  dnnl::engine eng;
  dnnl::stream strm;
};

Runtime& runtime() {
  static Runtime rt = [] {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    return Runtime{eng, dnnl::stream(eng)};
  }();
  return rt;
}

// The calling thread's stream: parts of a matmul run on the thread team's threads at once.
dnnl::stream& thread_stream() {
  thread_local dnnl::stream strm(runtime().eng);
  return strm;
}

dnnl::algorithm eltwise_alg(Activation a) {
  switch (a) {
    case Activation::relu:
      return dnnl::algorithm::eltwise_relu;
    case Activation::clip:
      return dnnl::algorithm::eltwise_clip;
    case Activation::gelu_erf:
      return dnnl::algorithm::eltwise_gelu_erf;
    case Activation::gelu_tanh:
      return dnnl::algorithm::eltwise_gelu_tanh;
    case Activation::sigmoid:
      return dnnl::algorithm::eltwise_logistic;
    case Activation::tanh:
      return dnnl::algorithm::eltwise_tanh;
    case Activation::leaky_relu:
      return dnnl::algorithm::eltwise_relu;
    case Activation::swish:
      return dnnl::algorithm::eltwise_swish;
    case Activation::none:
      break;
  }
  return dnnl::algorithm::undef;
}

// alpha as oneDNN's output scale (applied to product + bias), then sum (accumulate), then the
// activation.
dnnl::primitive_attr make_attr(const Epilogue& e) {
  dnnl::primitive_attr attr;
  if (e.alpha != 1.0f) attr.set_output_scales(0, {e.alpha});
  dnnl::post_ops po;
  if (e.accumulate) po.append_sum(1.0f);
  if (e.act != Activation::none) {
    // eltwise alpha: clip's lower bound, swish's β (x · sigmoid(β·x)), or leaky_relu's slope (oneDNN's relu with a slope is a compare
    // and blend: NaN gives slope · NaN = NaN, as ONNX's LeakyRelu)
    const bool clip = e.act == Activation::clip;
    const float alpha = clip ? e.clip_lo : e.act == Activation::leaky_relu ? e.slope : e.act == Activation::swish ? 1.0f : 0.0f;
    po.append_eltwise(1.0f, eltwise_alg(e.act), alpha, clip ? e.clip_hi : 0.0f);
  }
  attr.set_post_ops(po);
  return attr;
}

int threads_now() {
  return omp_get_max_threads();
}

// Binds `m` to a caller's buffer (oneDNN takes non-const handles; inputs are only read).
void bind(const memory& m, const float* p) {
  m.set_data_handle(const_cast<float*>(p));
}

void reorder_now(const memory& from, const memory& to) {
  Runtime& rt = runtime();
  dnnl::reorder(from, to).execute(rt.strm, const_cast<memory&>(from), const_cast<memory&>(to));
  rt.strm.wait();
}

// Memory for packed weights: fresh pages (huge pages for large buffers, so packing tblock_bert's
// 28 MB of weights is bound by the copy, not by page faults).
using PackedBuffer = Pages;

PackedBuffer allocate_packed(size_t bytes) {
  return allocate_pages(bytes);
}

// A blocked memory descriptor as text: everything that decides where each element's bytes are.
// Empty for other format kinds (those weights are not stored).
std::string layout_text(const memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.format_kind != dnnl_blocked) return {};
  auto list = [](const dnnl_dim_t* v, int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s;
  };
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  return fmt::format("dt{} dims[{}] padded[{}] offsets[{}] off{} strides[{}] blocks[{}] idxs[{}] extra{},{},{} size{}",
                     static_cast<int>(d.data_type), list(d.dims, d.ndims), list(d.padded_dims, d.ndims),
                     list(d.padded_offsets, d.ndims), d.offset0, list(b.strides, d.ndims),
                     list(b.inner_blks, b.inner_nblks), list(b.inner_idxs, b.inner_nblks),
                     static_cast<unsigned>(d.extra.flags), d.extra.compensation_mask, d.extra.scale_adjust,
                     md.get_size());
}

// The weights memory of a primitive that wants `want`: the caller's prepacked bytes when their layout
// is `want`, else `from` (plain or an earlier packing) reordered into fresh huge-page memory.
struct WeightsMemory {
  memory mem;
  std::shared_ptr<const void> owner;  // owns a fresh packing, or keeps the prepacked bytes alive
  bool prepacked = false;
};

WeightsMemory weights_memory(const memory::desc& want, const PackedWeights& pre, const memory& from,
                             const std::string& what) {
  const dnnl::engine& eng = runtime().eng;
  WeightsMemory w;
  if (pre.valid() && pre.nbytes == want.get_size() && pre.layout == layout_text(want) && !pre.layout.empty()) {
    w.mem = memory(want, eng, const_cast<void*>(pre.data));  // only read by the primitive
    w.owner = pre.owner;
    w.prepacked = true;
    return w;
  }
  if (!from)
    fail("{}: the stored packed weights do not fit this primitive (layout '{}', stored '{}') and the plain "
         "weights were not given",
         what, layout_text(want), pre.layout);
  auto storage = std::make_shared<PackedBuffer>(allocate_packed(want.get_size()));
  w.mem = memory(want, eng, storage->get());
  w.owner = std::shared_ptr<const void>(storage, storage->get());
  reorder_now(from, w.mem);
  return w;
}

// A convolution's activations: the caller's (x, y, in the layouts it gives, bound to its buffers per
// call) and the primitive's (src, dst): the same memory where the primitive takes that layout, else a
// buffer of its own, reordered into before the primitive and out of after it. The 2-d and 3-d
// convolutions share it.
struct ConvActivations {
  memory x, y, src, dst;
  dnnl::reorder to_src, from_dst, to_dst;
  bool reorder_src = false, reorder_dst = false;

  // accumulate: the primitive adds to what y holds (a sum post-op), so y is reordered in as well.
  void plan(const memory::desc& x_md, const memory::desc& y_md, const memory::desc& src_md, const memory::desc& dst_md,
            bool accumulate) {
    const dnnl::engine& eng = runtime().eng;
    x = memory(x_md, eng, DNNL_MEMORY_NONE);
    y = memory(y_md, eng, DNNL_MEMORY_NONE);
    reorder_src = src_md != x_md;
    reorder_dst = dst_md != y_md;
    src = reorder_src ? memory(src_md, eng) : x;
    dst = reorder_dst ? memory(dst_md, eng) : y;
    if (reorder_src) to_src = dnnl::reorder(x, src);
    if (reorder_dst) from_dst = dnnl::reorder(dst, y);
    if (reorder_dst && accumulate) to_dst = dnnl::reorder(y, dst);
  }
  // Binds the caller's buffers and reorders what the primitive reads into its layouts.
  void enter(Runtime& rt, const float* xp, float* yp, bool accumulate) {
    bind(x, xp);
    bind(y, yp);
    if (reorder_src) to_src.execute(rt.strm, x, src);
    if (reorder_dst && accumulate) to_dst.execute(rt.strm, y, dst);
  }
  // Reorders the result into the caller's layout and waits for the stream.
  void leave(Runtime& rt) {
    if (reorder_dst) from_dst.execute(rt.strm, dst, y);
    rt.strm.wait();
  }
};

// The packed weights of `m`, with `owner` keeping them alive for whoever holds the view (another
// primitive sharing the packing, or the cache writer).
PackedWeights packed_view(const memory& m, std::shared_ptr<const void> owner) {
  PackedWeights p;
  if (!m) return p;
  p.layout = layout_text(m.get_desc());
  if (p.layout.empty()) return p;
  p.data = m.get_data_handle();
  p.nbytes = m.get_desc().get_size();
  p.owner = std::move(owner);
  return p;
}

std::string dims_str(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  for (int64_t d : dims) s += (s.size() > 1 ? "x" : "") + std::to_string(d);
  return s + "]";
}

// A row-major [rows, cols] view: a dim of size 1 gets the stride that keeps the view plain (oneDNN
// then recognises it as a row-major or transposed matrix instead of an arbitrary strided one).
void normalize_2d(int64_t rows, int64_t cols, int64_t& s_rows, int64_t& s_cols) {
  if (rows == 1 && cols == 1) {
    s_rows = s_cols = 1;
  } else if (rows == 1) {
    s_rows = s_cols == 1 ? cols : 1;
  } else if (cols == 1) {
    s_cols = s_rows == 1 ? rows : 1;
  }
}

// The oneDNN memory descriptors of a matmul after folding a shared-B batch into M.
struct MatmulPlan {
  memory::desc a, b, c, bias;
  bool folded = false;  // batch folded into M (a 2-D problem)
};

MatmulPlan plan_matmul(MatmulDesc& d) {
  const std::string name = matmul_str(d);
  if (d.batch <= 0 || d.M <= 0 || d.N <= 0 || d.K <= 0)
    fail("matmul {}: dims must be positive (batch {}, M {}, N {}, K {})", name, d.batch, d.M, d.N,
         d.K);
  if (d.c_batch == 0 && d.c_m == 0 && d.c_n == 0) {
    d.c_batch = d.M * d.N;
    d.c_m = d.N;
    d.c_n = 1;
  }
  for (int64_t s : {d.a_batch, d.a_m, d.a_k, d.b_batch, d.b_k, d.b_n, d.c_batch, d.c_m, d.c_n})
    if (s < 0) fail("matmul {}: negative strides are not supported", name);
  normalize_2d(d.M, d.K, d.a_m, d.a_k);
  normalize_2d(d.K, d.N, d.b_k, d.b_n);
  normalize_2d(d.M, d.N, d.c_m, d.c_n);
  if (d.a_m == 0 || d.a_k == 0 || d.b_k == 0 || d.b_n == 0 || d.c_m == 0 || d.c_n == 0)
    unsupported(
        "matmul {}: a zero stride inside a matrix (a broadcast row or column) is not supported",
        name);
  if (d.batch > 1 && d.c_batch == 0)
    fail("matmul {}: C's batch stride is 0, so the batch results overlap", name);
  if (d.batch == 1) d.a_batch = d.b_batch = d.c_batch = 0;

  MatmulPlan p;
  const bool b_shared = d.batch == 1 || d.b_batch == 0;
  auto merges = [&](int64_t s_batch, int64_t s_m) {
    return d.batch == 1 || d.M == 1 || s_batch == d.M * s_m;
  };
  int64_t M = d.M, a_m = d.a_m, c_m = d.c_m;
  if (b_shared && merges(d.a_batch, d.a_m) && merges(d.c_batch, d.c_m)) {
    p.folded = true;
    M = d.batch * d.M;
    // A merged [batch*M] dim of size M*batch whose single stride is a_m (or a_batch when M == 1).
    if (d.M == 1 && d.batch > 1) a_m = d.a_batch, c_m = d.c_batch;
    normalize_2d(M, d.K, a_m, d.a_k);
  }
  if (p.folded) {
    p.a = memory::desc({M, d.K}, kF32, memory::dims{a_m, d.a_k});
    p.b = memory::desc({d.K, d.N}, kF32, memory::dims{d.b_k, d.b_n});
    p.c = memory::desc({M, d.N}, kF32, memory::dims{c_m, d.c_n});
    p.bias = memory::desc({1, d.N}, kF32, Tag::ab);
  } else {
    // A dim of size 1 broadcasts over the batch; its stride is then irrelevant but must be
    // positive.
    const int64_t ab = d.a_batch == 0 ? 1 : d.batch, bb = d.b_batch == 0 ? 1 : d.batch;
    p.a = memory::desc({ab, d.M, d.K}, kF32,
                       memory::dims{d.a_batch == 0 ? d.M * d.K : d.a_batch, d.a_m, d.a_k});
    p.b = memory::desc({bb, d.K, d.N}, kF32,
                       memory::dims{d.b_batch == 0 ? d.K * d.N : d.b_batch, d.b_k, d.b_n});
    p.c = memory::desc({d.batch, d.M, d.N}, kF32, memory::dims{d.c_batch, d.c_m, d.c_n});
    p.bias = memory::desc({1, 1, d.N}, kF32, Tag::abc);
  }
  return p;
}

dnnl::matmul::primitive_desc matmul_pd(const MatmulPlan& p, bool pack_b, bool bias,
                                       const dnnl::primitive_attr& attr) {
  const memory::desc b = pack_b ? memory::desc(p.b.dims(), kF32, Tag::any) : p.b;
  const dnnl::matmul::desc md =
      bias ? dnnl::matmul::desc(p.a, b, p.bias, p.c) : dnnl::matmul::desc(p.a, b, p.c);
  return dnnl::matmul::primitive_desc(md, attr, runtime().eng);
}

}  // namespace

bool dnnl_available() {
  static const bool ok = [] {
    try {
      runtime();
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

std::string dnnl_version(bool with_threads) {
  const dnnl_version_t* v = dnnl::version();
  static const std::pair<dnnl::cpu_isa, const char*> names[] = {
      {dnnl::cpu_isa::sse41, "sse41"},
      {dnnl::cpu_isa::avx, "avx"},
      {dnnl::cpu_isa::avx2, "avx2"},
      {dnnl::cpu_isa::avx2_vnni, "avx2_vnni"},
      {dnnl::cpu_isa::avx512_core, "avx512_core"},
      {dnnl::cpu_isa::avx512_core_vnni, "avx512_core_vnni"},
      {dnnl::cpu_isa::avx512_core_bf16, "avx512_core_bf16"},
      {dnnl::cpu_isa::avx512_core_amx, "avx512_core_amx"},
  };
  std::string isa = "other";
  for (const auto& [code, name] : names)
    if (dnnl::get_effective_cpu_isa() == code) isa = name;
  if (!with_threads) return fmt::format("oneDNN {}.{}.{} (isa {})", v->major, v->minor, v->patch, isa);
  return fmt::format("oneDNN {}.{}.{} (isa {}, {} threads)", v->major, v->minor, v->patch, isa, threads_now());
}

MatmulDesc contiguous_matmul(int64_t batch, int64_t M, int64_t N, int64_t K, bool b_shared) {
  MatmulDesc d;
  d.batch = batch, d.M = M, d.N = N, d.K = K;
  d.a_batch = M * K, d.a_m = K, d.a_k = 1;
  d.b_batch = b_shared ? 0 : K * N, d.b_k = N, d.b_n = 1;
  return d;
}

std::optional<MatmulDesc> dot_general_matmul(const Node& dot) {
  if (!is_core_op(dot, CoreOp::dot_general) || dot.inputs.size() != 2 || !dot.inputs[0] || !dot.inputs[1])
    return std::nullopt;
  const TensorType& a = dot.inputs[0]->type;
  const TensorType& b = dot.inputs[1]->type;
  if (a.dtype != DType::f32 || b.dtype != DType::f32) return std::nullopt;
  for (const Shape* s : {&a.shape, &b.shape})
    for (int64_t x : *s)
      if (x < 0) return std::nullopt;
  const std::vector<int64_t> lb = dot.attr_ints("lhs_batch", {}),
                             lc = dot.attr_ints("lhs_contract");
  const std::vector<int64_t> rb = dot.attr_ints("rhs_batch", {}),
                             rc = dot.attr_ints("rhs_contract");
  auto product = [](const Shape& s, const std::vector<int64_t>& dims) {
    int64_t p = 1;
    for (int64_t d : dims) p *= s.at(static_cast<size_t>(d));
    return p;
  };
  const int64_t batch = product(a.shape, lb), K = product(a.shape, lc);
  const int64_t M = shape_numel(a.shape) / std::max<int64_t>(1, batch * K);
  const int64_t N = shape_numel(b.shape) / std::max<int64_t>(1, product(b.shape, rb) * K);
  // The rhs is the same for every batch when it is broadcast along all batch dims of size > 1.
  bool shared = batch == 1;
  const Node* p = dot.inputs[1]->producer;
  if (!shared && p && is_core_op(*p, CoreOp::broadcast_in_dim) && p->has_input(0)) {
    const std::vector<int64_t> dims = p->attr_ints("dims", {});
    const Shape& src = p->inputs[0]->type.shape;
    shared = true;
    for (int64_t d : rb) {
      if (b.shape[static_cast<size_t>(d)] == 1) continue;
      auto it = std::find(dims.begin(), dims.end(), d);
      if (it != dims.end() && src[static_cast<size_t>(it - dims.begin())] != 1) shared = false;
    }
  }
  return contiguous_matmul(batch, M, N, K, shared);
}

std::string matmul_str(const MatmulDesc& d) {
  if (d.batch == 1) return dims_str({d.M, d.K}) + "·" + dims_str({d.K, d.N});
  return dims_str({d.batch, d.M, d.K}) + "·" +
         (d.b_batch == 0 && !d.constant_b ? dims_str({d.K, d.N}) : dims_str({d.batch, d.K, d.N}));
}

// ---- Matmul -------------------------------------------------------------------------------------

// An operand read through a zero stride inside its matrix (a broadcast row or column, e.g. a [1, K]
// value broadcast to [M, K]): oneDNN takes no such matrix, so it is copied dense before each run.
struct DenseCopy {
  bool on = false;
  int64_t batch = 1, rows = 0, cols = 0;
  int64_t s_batch = 0, s_rows = 0, s_cols = 0;  // the operand's own strides
  std::vector<float> buf;

  // Whether strides (s_rows, s_cols) of a [rows, cols] matrix need the copy; if so, takes them and
  // rewrites them (and the batch stride) to a contiguous [batch, rows, cols] layout.
  // expand_batch: also when the operand is shared across a batch (batch stride 0), which oneDNN takes
  // for B (weights) but not for A.
  bool take(int64_t nbatch, int64_t r, int64_t c, int64_t& sb, int64_t& sr, int64_t& sc, bool expand_batch = false) {
    int64_t nr = sr, nc = sc;
    normalize_2d(r, c, nr, nc);
    const bool shared = expand_batch && nbatch > 1 && sb == 0;
    if (nr != 0 && nc != 0 && !shared) return false;
    on = true;
    batch = sb == 0 && !shared ? 1 : nbatch;
    rows = r, cols = c, s_batch = sb, s_rows = sr, s_cols = sc;
    sb = batch == 1 ? 0 : r * c;
    sr = c;
    sc = 1;
    buf.assign(static_cast<size_t>(batch * rows * cols), 0.0f);
    return true;
  }
  const float* copy(const float* src) {
    if (!on || !src) return src;
    float* d = buf.data();
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) *d++ = src[b * s_batch + i * s_rows + j * s_cols];
    return buf.data();
  }
};

// Whether plan_matmul folds the batch into M (B shared, A's and C's batch strides continuing M): then
// A's batch stride is part of one 2-D problem, and a shared A needs no copy.
bool b_foldable(const MatmulDesc& d) {
  auto merges = [&](int64_t s_batch, int64_t s_m) { return d.batch == 1 || d.M == 1 || s_batch == d.M * s_m; };
  const bool b_shared = d.batch == 1 || d.b_batch == 0;
  return b_shared && merges(d.a_batch, d.a_m) && merges(d.c_batch == 0 && d.c_m == 0 ? d.M * d.N : d.c_batch, d.c_m == 0 ? d.N : d.c_m);
}

// A matrix-vector product (one row of A after folding) with constant weights too large to stay in
// cache between calls is bound by reading the weights once. oneDNN's matmul reads them in its packed
// layout through brgemm; its inner product over plain row-major [N, K] weights runs its gemv kernel,
// which streams them faster (2 threads, one call, weights from memory: vgg11's 25088x4096 classifier
// 21.7 -> 14.5 ms, 4096x4096 2.9 -> 2.2 ms; ONNX Runtime 14.5 and 2.2). Below ~4 MB the packed layout
// wins or ties (efficientnet's 1280x1000: equal).
constexpr int64_t kGemvWeightBytes = int64_t{4} << 20;

bool gemv_wins(const MatmulDesc& d, const MatmulPlan& p, bool constant_b) {
  return constant_b && p.folded && p.a.dims()[0] == 1 && d.K * d.N * 4 >= kGemvWeightBytes;
}

// One part of a matmul run on the thread team: its primitive and where its operands start.
struct Matmul::Part {
  Matmul mm;
  int64_t a = 0, b = 0, c = 0;  // element offsets into the whole product's A, B and C
};

// A part's least multiply-adds: smaller products run as one part (each part is a primitive call).
constexpr double kPartMacs = 1 << 17;

struct Matmul::Impl {
  MatmulDesc d;
  bool part = false;          // a part of a team matmul: its own scratchpad (oneDNN's shared one is per thread)
  std::vector<Part> parts;    // a team matmul's parts (then no primitive of its own)
  char split_dim = 0;         // 'b', 'n' or 'm'
  memory scratch;
  DenseCopy dense_a, dense_b;
  std::string name;
  MatmulPlan plan;
  dnnl::primitive_attr attr;
  bool pack = false;
  bool gemv = false;  // an inner product over plain [N, K] weights (gemv_wins)
  dnnl::matmul::primitive_desc pd;
  dnnl::inner_product_forward::primitive_desc ip_pd;
  dnnl::primitive prim;
  int threads = 0;
  memory a, b, c, bias;
  std::vector<float> bias_data;
  std::shared_ptr<const void> packed_owner;  // owns the packed weights (or keeps prepacked bytes alive)
  PackedWeights prepacked;                   // from the descriptor, until the first build
  bool used_prepacked = false;
  std::vector<dnnl_exec_arg_t> args;

  // The inner product of gemv_wins: src [1, K], weights [N, K] row-major (`oi`), dst [1, N], the
  // matmul's bias and post-ops.
  void build_gemv() {
    const memory::desc src({1, d.K}, kF32, Tag::nc), dst({1, d.N}, kF32, Tag::nc);
    const memory::desc w({d.N, d.K}, kF32, Tag::oi), bias({d.N}, kF32, Tag::x);
    const auto fwd = dnnl::prop_kind::forward_inference;
    const dnnl::inner_product_forward::desc ipd = bias_data.empty()
                                                      ? dnnl::inner_product_forward::desc(fwd, src, w, dst)
                                                      : dnnl::inner_product_forward::desc(fwd, src, w, bias, dst);
    ip_pd = dnnl::inner_product_forward::primitive_desc(ipd, attr, runtime().eng);
    prim = dnnl::inner_product_forward(ip_pd);
  }

  // The weights as the primitive reads them: [N, K] for the inner product (plan.b read transposed).
  memory plain_b(const dnnl::engine& eng) const {
    if (!d.constant_b) return memory();
    if (!gemv) return memory(plan.b, eng, const_cast<float*>(d.constant_b));
    return memory(memory::desc({d.N, d.K}, kF32, memory::dims{d.b_n, d.b_k}), eng, const_cast<float*>(d.constant_b));
  }

  void build() {
    threads = threads_now();
    memory::desc src_md, dst_md, w_md;
    if (gemv) {
      try {
        build_gemv();
      } catch (const dnnl::error&) {
        gemv = false;  // an epilogue the inner product does not take (its output scale with a sum)
      }
    }
    if (gemv) {
      src_md = ip_pd.src_desc(), dst_md = ip_pd.dst_desc(), w_md = ip_pd.weights_desc();
    } else {
      pd = matmul_pd(plan, pack, !bias_data.empty(), attr);  // d.bias is cleared after construction
      prim = dnnl::matmul(pd);
      src_md = pd.src_desc(), dst_md = pd.dst_desc(), w_md = pd.weights_desc();
    }
    const dnnl::engine& eng = runtime().eng;
    a = memory(src_md, eng, DNNL_MEMORY_NONE);
    c = memory(dst_md, eng, DNNL_MEMORY_NONE);
    if (!pack) {
      b = memory(w_md, eng, DNNL_MEMORY_NONE);
    } else if (!b || b.get_desc() != w_md) {
      const memory from = b ? b : plain_b(eng);
      WeightsMemory w = weights_memory(w_md, b ? PackedWeights{} : prepacked, from, "matmul " + name);
      b = w.mem;
      used_prepacked = used_prepacked || w.prepacked;
      packed_owner = std::move(w.owner);  // after the reorder: it may have read the previous packing
    }
    args = {{DNNL_ARG_SRC, a.get()}, {DNNL_ARG_WEIGHTS, b.get()}, {DNNL_ARG_DST, c.get()}};
    if (!bias_data.empty()) {
      bias = memory(gemv ? ip_pd.bias_desc() : plan.bias, eng, bias_data.data());
      args.push_back({DNNL_ARG_BIAS, bias.get()});
    }
    if (part) {
      scratch = memory(gemv ? ip_pd.scratchpad_desc() : pd.scratchpad_desc(), eng);
      args.push_back({DNNL_ARG_SCRATCHPAD, scratch.get()});
    }
  }

  // The parts of a team matmul: the batch when it has enough entries, else N (blocks of 16 columns,
  // each part packing its own columns of a constant B), else M.
  void split() {
    MatmulDesc w = d;
    if (w.c_batch == 0 && w.c_m == 0 && w.c_n == 0) w.c_batch = w.M * w.N, w.c_m = w.N, w.c_n = 1;
    const int64_t T = d.team;
    const double macs = static_cast<double>(w.batch) * static_cast<double>(w.M) * static_cast<double>(w.N) *
                        static_cast<double>(w.K);
    const int64_t want = std::clamp<int64_t>(static_cast<int64_t>(macs / kPartMacs), 1, 4 * T);
    int64_t extent = w.M, align = 1;
    split_dim = 'm';
    if (want > 1 && w.batch >= std::min<int64_t>(want, 2 * T)) extent = w.batch, split_dim = 'b';
    else if (want > 1 && w.N >= 64) extent = w.N, align = 16, split_dim = 'n';
    int64_t block = (extent + want - 1) / want;
    block = (block + align - 1) / align * align;
    ScopedOmpThreads one(1);
    for (int64_t lo = 0; lo < extent; lo += block) {
      const int64_t n = std::min(block, extent - lo);
      MatmulDesc q = w;
      q.team = 0;
      q.prepacked_b = {};
      int64_t ao = 0, bo = 0, co = 0;
      if (split_dim == 'b') q.batch = n, ao = lo * w.a_batch, bo = lo * w.b_batch, co = lo * w.c_batch;
      if (split_dim == 'n') q.N = n, bo = lo * w.b_n, co = lo * w.c_n, q.bias = w.bias ? w.bias + lo : nullptr;
      if (split_dim == 'm') q.M = n, ao = lo * w.a_m, co = lo * w.c_m;
      q.constant_b = w.constant_b ? w.constant_b + bo : nullptr;
      // Parts over M read the same constant B: the first part's packing serves the others (taken only
      // where oneDNN wants the same layout).
      if (split_dim == 'm' && !parts.empty()) q.prepacked_b = parts.front().mm.packed_weights();
      parts.push_back(Part{Matmul(q, PartTag{}), ao, bo, co});
    }
  }
};

Matmul::Matmul(const MatmulDesc& desc) : impl_(std::make_unique<Impl>()) {
  impl_->d = desc;
  construct();
}

Matmul::Matmul(const MatmulDesc& desc, PartTag) : impl_(std::make_unique<Impl>()) {
  impl_->d = desc;
  impl_->part = true;
  construct();
}

void Matmul::construct() {
  Impl& m = *impl_;
  m.name = matmul_str(m.d);
  // A team matmul is its parts; B given only prepacked (no plain bytes to slice) keeps one primitive.
  if (m.d.team > 0 && m.d.batch > 0 && m.d.M > 0 && m.d.N > 0 && m.d.K > 0 &&
      (m.d.constant_b || !m.d.prepacked_b.valid())) {
    m.pack = m.d.constant_b != nullptr;
    m.split();
    m.d.constant_b = nullptr;
    m.d.bias = nullptr;
    m.d.prepacked_b = {};
    return;
  }
  m.d.team = 0;
  try {
    if (m.d.batch > 0 && m.d.M > 0 && m.d.N > 0 && m.d.K > 0) {
      m.dense_a.take(m.d.batch, m.d.M, m.d.K, m.d.a_batch, m.d.a_m, m.d.a_k, !b_foldable(m.d));
      if (m.dense_b.take(m.d.batch, m.d.K, m.d.N, m.d.b_batch, m.d.b_k, m.d.b_n) && m.d.constant_b) {
        m.d.constant_b = m.dense_b.copy(m.d.constant_b);  // packed once below, the copy not needed again
        m.dense_b.on = false;
      }
    }
    m.plan = plan_matmul(m.d);
    m.attr = make_attr(m.d.epilogue);
    if (m.part) m.attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    m.pack = m.d.constant_b != nullptr || m.d.prepacked_b.valid();
    m.gemv = gemv_wins(m.d, m.plan, m.pack);
    m.prepacked = m.d.prepacked_b;
    if (m.d.bias) m.bias_data.assign(m.d.bias, m.d.bias + m.d.N);
    m.build();
  } catch (const dnnl::error& e) {
    fail("matmul {}: oneDNN: {}", m.name, e.what());
  }
  m.d.constant_b = nullptr;  // the caller's buffers are not kept
  m.d.bias = nullptr;
  m.d.prepacked_b = {};
  m.prepacked = {};
}

Matmul::~Matmul() = default;
Matmul::Matmul(Matmul&&) noexcept = default;
Matmul& Matmul::operator=(Matmul&&) noexcept = default;

bool Matmul::supported(const MatmulDesc& desc) {
  try {
    MatmulDesc d = desc;
    if (d.batch > 0 && d.M > 0 && d.N > 0 && d.K > 0) {  // broadcast operands are copied dense (DenseCopy)
      DenseCopy a, b;
      a.take(d.batch, d.M, d.K, d.a_batch, d.a_m, d.a_k, !b_foldable(d));
      b.take(d.batch, d.K, d.N, d.b_batch, d.b_k, d.b_n);
    }
    const MatmulPlan p = plan_matmul(d);
    const std::string impl = matmul_pd(p, false, false, dnnl::primitive_attr()).impl_info_str();
    return impl.rfind("ref", 0) != 0;
  } catch (const Error&) {
    return false;
  } catch (const dnnl::error&) {
    return false;
  }
}

void Matmul::run(const float* a, const float* b, float* c) const {
  Impl& m = *impl_;
  if (!a || !c || (!m.pack && !b)) fail("matmul {}: an operand pointer is null", m.name);
  if (!m.parts.empty()) {
    ThreadTeam::shared(m.d.team).run(static_cast<int64_t>(m.parts.size()), [&](int64_t i) {
      const Part& p = m.parts[static_cast<size_t>(i)];
      p.mm.run(a + p.a, m.pack ? nullptr : b + p.b, c + p.c);
    });
    return;
  }
  a = m.dense_a.copy(a);
  if (!m.pack) b = m.dense_b.copy(b);
  try {
    if (m.threads != threads_now()) m.build();
    bind(m.a, a);
    if (!m.pack) bind(m.b, b);
    bind(m.c, c);
    dnnl::stream& strm = thread_stream();
    dnnl::error::wrap_c_api(dnnl_primitive_execute(m.prim.get(), strm.get(),
                                                   static_cast<int>(m.args.size()), m.args.data()),
                            "could not execute");
    strm.wait();
  } catch (const dnnl::error& e) {
    fail("matmul {}: oneDNN: {}", m.name, e.what());
  }
}

const MatmulDesc& Matmul::desc() const {
  return impl_->d;
}
bool Matmul::packed_b() const {
  return impl_->pack;
}
PackedWeights Matmul::packed_weights() const {
  return impl_->pack && impl_->parts.empty() ? packed_view(impl_->b, impl_->packed_owner) : PackedWeights{};
}
int Matmul::parts() const {
  return static_cast<int>(impl_->parts.size());
}
bool Matmul::used_prepacked() const {
  return impl_->used_prepacked;
}
std::string Matmul::impl() const {
  const Impl& m = *impl_;
  if (!m.parts.empty())
    return fmt::format("{} parts over {} on {} threads: {}", m.parts.size(),
                       m.split_dim == 'b' ? "batch" : m.split_dim == 'n' ? "N" : "M", m.d.team, m.parts.front().mm.impl());
  return m.gemv ? std::string("inner product ") + m.ip_pd.impl_info_str() : m.pd.impl_info_str();
}

// ---- Conv2d -------------------------------------------------------------------------------------

std::string conv_str(const ConvDesc& d) {
  std::string s = dims_str({d.N, d.C, d.H, d.W}) + "*" +
                  dims_str({d.OC, d.groups > 0 ? d.C / d.groups : d.C, d.KH, d.KW});
  s += fmt::format(" s{}", d.stride_h == d.stride_w ? std::to_string(d.stride_h)
                                                    : fmt::format("{},{}", d.stride_h, d.stride_w));
  if (d.pad_top || d.pad_left || d.pad_bottom || d.pad_right)
    s += fmt::format(" p{},{},{},{}", d.pad_top, d.pad_left, d.pad_bottom, d.pad_right);
  if (d.dil_h != 1 || d.dil_w != 1) s += fmt::format(" d{},{}", d.dil_h, d.dil_w);
  if (d.groups != 1) s += fmt::format(" g{}", d.groups);
  return s;
}

namespace {

void check_conv(const ConvDesc& d, const std::string& name) {
  for (int64_t v : {d.N, d.C, d.H, d.W, d.OC, d.KH, d.KW, d.OH, d.OW})
    if (v <= 0) fail("conv2d {}: dims must be positive", name);
  if (d.stride_h < 1 || d.stride_w < 1) fail("conv2d {}: strides must be >= 1", name);
  if (d.dil_h < 1 || d.dil_w < 1) fail("conv2d {}: dilations must be >= 1", name);
  if (d.pad_top < 0 || d.pad_left < 0 || d.pad_bottom < 0 || d.pad_right < 0)
    fail("conv2d {}: pads must be >= 0", name);
  if (d.groups < 1 || d.C % d.groups || d.OC % d.groups)
    fail("conv2d {}: groups = {} must divide C = {} and OC = {}", name, d.groups, d.C, d.OC);
  if (!d.weights && !d.prepacked.valid()) fail("conv2d {}: the weights are required (a constant)", name);
  const int64_t oh = (d.H + d.pad_top + d.pad_bottom - (d.KH - 1) * d.dil_h - 1) / d.stride_h + 1;
  const int64_t ow = (d.W + d.pad_left + d.pad_right - (d.KW - 1) * d.dil_w - 1) / d.stride_w + 1;
  if (oh != d.OH || ow != d.OW)
    fail("conv2d {}: the output is {}x{} but the shapes give {}x{}", name, d.OH, d.OW, oh, ow);
}

// Whether a convolution tries oneDNN's Winograd kernel (Conv2d::Impl::build says when it wins).
bool winograd_wanted(const ConvDesc& d) {
  static const bool off = [] {
    const char* v = std::getenv("TESSEL_CONV_WINOGRAD");
    return v && std::string_view(v) == "0";
  }();
  return !off && d.KH == 3 && d.KW == 3 && d.stride_h == 1 && d.stride_w == 1 && d.dil_h == 1 && d.dil_w == 1 &&
         d.groups == 1 && d.C >= 64 && d.OC >= 64 && d.OH >= 14 && d.OW >= 14 && !d.epilogue.accumulate;
}

}  // namespace

struct Conv2d::Impl {
  ConvDesc d;
  std::string name;
  bool blocked = false;
  dnnl::primitive_attr attr;
  memory::desc x_md, y_md, w_md, bias_md;  // NCHW activations, [G,] OIHW weights
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  ConvActivations io;
  int threads = 0;
  memory w, bias;
  std::vector<float> bias_data;
  std::shared_ptr<const void> packed_owner;  // owns the packed weights (or keeps prepacked bytes alive)
  PackedWeights prepacked;                   // from the descriptor, until the first build
  bool used_prepacked = false;
  std::vector<dnnl_exec_arg_t> args;

  void build() {
    threads = threads_now();
    const dnnl::engine& eng = runtime().eng;
    // Mixed layouts have only slow kernels in oneDNN 2.6: an NCHW model input into channels-last
    // activations a reference one, channels-last into an NCHW result (a convolution feeding a core
    // node that reads NCHW, e.g. squeezenet's concatenation) its im2col gemm. Let the primitive choose
    // the input layout, and for an NCHW result its own as well, and reorder (squeezenet1_1's expand
    // convolutions: 2.9 ms in the gemm, a tenth of that in brgconv plus the reorder).
    const bool mixed = d.src_nhwc != d.dst_nhwc;
    // An NCHW input with a few channels (a model's first layer) stays NCHW, its result in the layout
    // oneDNN picks (nChw16c, reordered after): oneDNN has a direct kernel for that, where `any` for the
    // input picks brgconv over an NHWC copy whose reorder (C = 3) is slow (squeezenet1_1's first conv:
    // 1.5 ms of reorder around a 0.2 ms convolution), and a forced NHWC result has only its reference
    // kernel.
    const bool first_layer = !d.src_nhwc && d.C < 8 && d.groups == 1;
    const memory::desc act_x = (blocked || mixed) && !first_layer ? memory::desc(x_md.dims(), kF32, Tag::any) : x_md;
    const memory::desc act_y = blocked || first_layer || (mixed && !d.dst_nhwc) ? memory::desc(y_md.dims(), kF32, Tag::any) : y_md;
    const memory::desc wany(w_md.dims(), kF32, Tag::any);
    const memory::dims strides{d.stride_h, d.stride_w}, dil{d.dil_h - 1, d.dil_w - 1};
    const memory::dims pl{d.pad_top, d.pad_left}, pr{d.pad_bottom, d.pad_right};
    const auto fwd = dnnl::prop_kind::forward_inference;
    auto make_pd = [&](const memory::desc& src, const memory::desc& dst,
                       dnnl::algorithm alg = dnnl::algorithm::convolution_direct) {
      const dnnl::convolution_forward::desc cd =
          !bias_data.empty()  // d.bias is cleared after construction
              ? dnnl::convolution_forward::desc(fwd, alg, src, wany, bias_md, dst, strides, dil, pl, pr)
              : dnnl::convolution_forward::desc(fwd, alg, src, wany, dst, strides, dil, pl, pr);
      return dnnl::convolution_forward::primitive_desc(cd, attr, eng);
    };
    const memory::desc any_x(x_md.dims(), kF32, Tag::any), any_y(y_md.dims(), kF32, Tag::any);
    pd = make_pd(act_x, act_y);
    // A 3x3, stride-1, undilated convolution over at least 64 channels in and out on a map of at least
    // 14x14 takes oneDNN's Winograd kernel where it has one (AVX-512 only in oneDNN 2.6): F(4x4, 3x3)
    // does a quarter of the multiplications. FCN's classifier (2048 -> 512 at 28x28) 77.4 -> 35.9 ms a
    // call, ResNet's 64-channel 3x3 at 56x56 1.01 -> 0.66 ms (Zen 4, 2 threads). Its transforms round
    // differently from the direct kernel (resnet18/50, vgg11, googlenet and fcn_resnet50 stayed as close to
    // torch's outputs; docs/runtime/compiled-backend.md); TESSEL_CONV_WINOGRAD=0 keeps every convolution direct.
    if (winograd_wanted(d)) {
      try {
        pd = make_pd(any_x, any_y, dnnl::algorithm::convolution_winograd);
      } catch (const dnnl::error&) {
        // no Winograd kernel for this machine or epilogue: the direct one chosen above stays
      }
    }
    // Where the layouts above leave oneDNN only its reference kernel, let it choose both activation
    // layouts (reordered in and out). Without AVX-512, oneDNN 2.6 has no brgemm convolution, and an
    // NCHW input into a channels-last result (DeepLabV3's ASPP projection after its concatenation) found
    // only `ref:any`: 278 ms a call on an AVX2 machine, against 1.8 ms through nChw8c and two reorders.
    if (std::string_view(pd.impl_info_str()).starts_with("ref")) {
      dnnl::convolution_forward::primitive_desc chosen = make_pd(any_x, any_y);
      if (!std::string_view(chosen.impl_info_str()).starts_with("ref")) pd = chosen;
    }
    prim = dnnl::convolution_forward(pd);
    io.plan(x_md, y_md, pd.src_desc(), pd.dst_desc(), d.epilogue.accumulate);
    if (!w || w.get_desc() != pd.weights_desc()) {
      const memory from = w ? w : d.weights ? memory(w_md, eng, const_cast<float*>(d.weights)) : memory();
      WeightsMemory wm = weights_memory(pd.weights_desc(), w ? PackedWeights{} : prepacked, from, "conv2d " + name);
      w = wm.mem;
      used_prepacked = used_prepacked || wm.prepacked;
      packed_owner = std::move(wm.owner);
    }
    args = {{DNNL_ARG_SRC, io.src.get()}, {DNNL_ARG_WEIGHTS, w.get()}, {DNNL_ARG_DST, io.dst.get()}};
    if (!bias_data.empty()) {
      bias = memory(bias_md, eng, bias_data.data());
      args.push_back({DNNL_ARG_BIAS, bias.get()});
    }
  }
};

Conv2d::Conv2d(const ConvDesc& desc) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.d = desc;
  m.name = conv_str(desc);
  check_conv(m.d, m.name);
  // Blocked won on every mobilenet_v2 layer, reorders included (bench/matmul_floor.md): with NCHW
  // activations oneDNN 2.6 has only its im2col gemm convolution.
  // A depthwise convolution goes blocked even between channels-last activations: with NHWC on either
  // side oneDNN 2.6 picks its im2col gemm for it (convnext's 7x7: 60 % of the model's time).
  const bool depthwise = m.d.groups > 1 && m.d.groups == m.d.C && m.d.groups == m.d.OC;
  m.blocked = m.d.layout != ConvLayout::nchw && ((!m.d.src_nhwc && !m.d.dst_nhwc) || depthwise);
  try {
    m.attr = make_attr(m.d.epilogue);
    m.x_md = memory::desc({m.d.N, m.d.C, m.d.H, m.d.W}, kF32, m.d.src_nhwc ? Tag::nhwc : Tag::nchw);
    m.y_md = memory::desc({m.d.N, m.d.OC, m.d.OH, m.d.OW}, kF32, m.d.dst_nhwc ? Tag::nhwc : Tag::nchw);
    const int64_t g = m.d.groups;
    m.w_md = g == 1 ? memory::desc({m.d.OC, m.d.C, m.d.KH, m.d.KW}, kF32, Tag::oihw)
                    : memory::desc({g, m.d.OC / g, m.d.C / g, m.d.KH, m.d.KW}, kF32, Tag::goihw);
    m.bias_md = memory::desc({m.d.OC}, kF32, Tag::x);
    m.prepacked = m.d.prepacked;
    if (m.d.bias) m.bias_data.assign(m.d.bias, m.d.bias + m.d.OC);
    m.build();
  } catch (const dnnl::error& e) {
    fail("conv2d {}: oneDNN: {}", m.name, e.what());
  }
  m.d.weights = nullptr;  // the caller's buffers are not kept
  m.d.bias = nullptr;
  m.d.prepacked = {};
  m.prepacked = {};
}

Conv2d::~Conv2d() = default;
Conv2d::Conv2d(Conv2d&&) noexcept = default;
Conv2d& Conv2d::operator=(Conv2d&&) noexcept = default;

struct Conv3d::Impl {
  Conv3dDesc d;
  std::string name;
  int threads = 0;
  memory::desc x_md, y_md, w_md;
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  ConvActivations io;
  memory w;
  std::shared_ptr<const void> packed_owner;  // owns the packed weights

  void build() {
    threads = threads_now();
    const dnnl::engine& eng = runtime().eng;
    const memory::desc any_x(x_md.dims(), kF32, Tag::any), any_y(y_md.dims(), kF32, Tag::any), any_w(w_md.dims(), kF32, Tag::any);
    const memory::dims strides{d.stride[0], d.stride[1], d.stride[2]};
    const memory::dims dil{d.dilation[0] - 1, d.dilation[1] - 1, d.dilation[2] - 1};
    const memory::dims pl{d.pad_lo[0], d.pad_lo[1], d.pad_lo[2]}, pr{d.pad_hi[0], d.pad_hi[1], d.pad_hi[2]};
    const dnnl::convolution_forward::desc cd(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, any_x,
                                             any_w, any_y, strides, dil, pl, pr);
    pd = dnnl::convolution_forward::primitive_desc(cd, eng);
    prim = dnnl::convolution_forward(pd);
    io.plan(x_md, y_md, pd.src_desc(), pd.dst_desc(), false);
    if (!w || w.get_desc() != pd.weights_desc()) {
      // the caller's weights at construction, the last packing when the thread count changes
      const memory from = w ? w : memory(w_md, eng, const_cast<float*>(d.weights));
      WeightsMemory wm = weights_memory(pd.weights_desc(), PackedWeights{}, from, "conv3d " + name);
      w = wm.mem;
      packed_owner = std::move(wm.owner);
    }
    d.weights = nullptr;  // read only by the first build
  }
};

Conv3d::Conv3d(const Conv3dDesc& desc) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.d = desc;
  const Conv3dDesc& d = m.d;
  m.name = fmt::format("[{}x{}x{}x{}x{}]*[{}x{}x{}x{}x{}] g{}", d.N, d.C, d.D, d.H, d.W, d.OC, d.groups > 0 ? d.C / d.groups : 0, d.KD,
                       d.KH, d.KW, d.groups);
  auto out = [](int64_t in, int64_t k, int64_t s, int64_t dl, int64_t lo, int64_t hi) {
    return s > 0 ? (in + lo + hi - (dl * (k - 1) + 1)) / s + 1 : -1;
  };
  const bool ok = d.N > 0 && d.C > 0 && d.OC > 0 && d.groups > 0 && d.C % d.groups == 0 && d.OC % d.groups == 0 && d.weights &&
                  d.KD > 0 && d.KH > 0 && d.KW > 0 && d.OD > 0 && d.OH > 0 && d.OW > 0 &&
                  d.OD == out(d.D, d.KD, d.stride[0], d.dilation[0], d.pad_lo[0], d.pad_hi[0]) &&
                  d.OH == out(d.H, d.KH, d.stride[1], d.dilation[1], d.pad_lo[1], d.pad_hi[1]) &&
                  d.OW == out(d.W, d.KW, d.stride[2], d.dilation[2], d.pad_lo[2], d.pad_hi[2]);
  if (!ok) fail("conv3d {}: invalid descriptor (output [{}x{}x{}])", m.name, d.OD, d.OH, d.OW);
  m.x_md = memory::desc({d.N, d.C, d.D, d.H, d.W}, kF32, Tag::ncdhw);
  m.y_md = memory::desc({d.N, d.OC, d.OD, d.OH, d.OW}, kF32, Tag::ncdhw);
  m.w_md = d.groups > 1 ? memory::desc({d.groups, d.OC / d.groups, d.C / d.groups, d.KD, d.KH, d.KW}, kF32, Tag::goidhw)
                        : memory::desc({d.OC, d.C, d.KD, d.KH, d.KW}, kF32, Tag::oidhw);
  try {
    m.build();
  } catch (const dnnl::error& e) {
    fail("conv3d {}: oneDNN: {}", m.name, e.what());
  }
}

Conv3d::~Conv3d() = default;
Conv3d::Conv3d(Conv3d&&) noexcept = default;
Conv3d& Conv3d::operator=(Conv3d&&) noexcept = default;

void Conv3d::run(const float* x, float* y) const {
  Impl& m = *impl_;
  if (!x || !y) fail("conv3d {}: an operand pointer is null", m.name);
  try {
    if (m.threads != threads_now()) m.build();
    Runtime& rt = runtime();
    m.io.enter(rt, x, y, false);
    m.prim.execute(rt.strm, {{DNNL_ARG_SRC, m.io.src}, {DNNL_ARG_WEIGHTS, m.w}, {DNNL_ARG_DST, m.io.dst}});
    m.io.leave(rt);
  } catch (const dnnl::error& e) {
    fail("conv3d {}: oneDNN: {}", m.name, e.what());
  }
}

void Conv2d::run(const float* x, float* y) const {
  Impl& m = *impl_;
  if (!x || !y) fail("conv2d {}: an operand pointer is null", m.name);
  try {
    if (m.threads != threads_now()) m.build();
    Runtime& rt = runtime();
    m.io.enter(rt, x, y, m.d.epilogue.accumulate);
    dnnl::error::wrap_c_api(dnnl_primitive_execute(m.prim.get(), rt.strm.get(),
                                                   static_cast<int>(m.args.size()), m.args.data()),
                            "could not execute");
    m.io.leave(rt);
  } catch (const dnnl::error& e) {
    fail("conv2d {}: oneDNN: {}", m.name, e.what());
  }
}

const ConvDesc& Conv2d::desc() const {
  return impl_->d;
}
PackedWeights Conv2d::packed_weights() const {
  return packed_view(impl_->w, impl_->packed_owner);
}
bool Conv2d::used_prepacked() const {
  return impl_->used_prepacked;
}
bool Conv2d::blocked() const {
  return impl_->io.reorder_src || impl_->io.reorder_dst;
}
std::string Conv2d::impl() const {
  return impl_->pd.impl_info_str();
}

}  // namespace tessel::cpu
