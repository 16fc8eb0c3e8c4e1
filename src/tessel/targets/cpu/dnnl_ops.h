// fp32 matmul and 2-D convolution through oneDNN for the compiled CPU backend: everything that does
// not depend on the data (primitive creation, packing constant weights into oneDNN's blocked
// layout) happens in the constructor; run() only executes.
#pragma once

#include <cstdint>
#include <array>
#include <memory>
#include <optional>
#include <string>

namespace tessel {
class Node;
}

namespace tessel::cpu {

// All objects share one oneDNN engine; each thread executes on a stream of its own. One object's run()
// is not reentrant: call it from one thread at a time (each call spreads its work over the OpenMP
// threads itself, or, for a matmul with MatmulDesc::team, over the thread team as parts).

// Whether oneDNN can run here (a CPU engine can be created); cheap after the first call.
bool dnnl_available();
// "oneDNN 2.6.3 (isa avx512_core, 2 threads)"; without the threads when with_threads is false.
std::string dnnl_version(bool with_threads = true);

// An activation applied to the result (oneDNN eltwise post-op).
enum class Activation { none, relu, clip, gelu_erf, gelu_tanh, sigmoid, tanh, leaky_relu, swish };  // swish: x · sigmoid(x)

// Fused epilogue: y = act(alpha · (x·w + bias) + (accumulate ? y_old : 0)), where y_old is what the
// output buffer holds when run() is called (a residual add in place). clip is min(max(v, lo), hi).
struct Epilogue {
  float alpha = 1;
  bool accumulate = false;
  Activation act = Activation::none;
  float clip_lo = 0, clip_hi = 6;
  float slope = 0;  // leaky_relu: x > 0 ? x : slope · x (slope > 0)
};

// Constant weights packed into oneDNN's preferred (blocked) layout, as a primitive holds them. The
// compile cache stores them and hands them back to a primitive built in another process, which then
// skips the reorder (docs/runtime/compiled-backend.md, "The executable cache").
struct PackedWeights {
  const void* data = nullptr;         // nbytes bytes in the layout below
  size_t nbytes = 0;
  std::string layout;                 // the oneDNN memory descriptor as text: used only when equal
  std::shared_ptr<const void> owner;  // kept alive by the primitive that uses data (may be null)
  bool valid() const { return data != nullptr; }
};

// C[b] = A[b] · B[b] for b in [0, batch): fp32. A is [batch, M, K] and B is [batch, K, N], both
// given by strides in elements (transposed operands are just strides; a batch stride of 0 shares
// the operand across the batch). C is contiguous [batch, M, N] unless c strides are given.
struct MatmulDesc {
  int64_t batch = 1, M = 0, N = 0, K = 0;
  int64_t a_batch = 0, a_m = 0, a_k = 0;  // strides of A in elements
  int64_t b_batch = 0, b_k = 0, b_n = 0;  // strides of B
  int64_t c_batch = 0, c_m = 0, c_n = 0;  // strides of C (all 0 = contiguous)
  // B's data when it is a constant: packed (copied) by the constructor, never read again.
  const float* constant_b = nullptr;
  // B already packed (from the compile cache): used without a reorder when its layout is the one the
  // primitive wants; otherwise constant_b is packed (and an error is thrown when it is null).
  PackedWeights prepacked_b;
  const float* bias = nullptr;  // optional [N] bias, copied by the constructor
  Epilogue epilogue;
  // > 0: run on the thread team of this many threads (support/thread_team.h) as parts, each a
  // single-threaded primitive over a share of the batch, of N or of M that whichever thread is free
  // claims (one part when the product is small); 0: one primitive threaded by oneDNN (OpenMP).
  int team = 0;
};

// A MatmulDesc with contiguous row-major operands: A [batch, M, K], and B [batch, K, N] or, when
// b_shared, one [K, N] for every batch.
MatmulDesc contiguous_matmul(int64_t batch, int64_t M, int64_t N, int64_t K, bool b_shared = false);

// A fp32 dot_general node of the core level as a matmul over contiguous operands: lhs permuted to
// [batch, M, K] (batch dims, free dims, contracting dims) and rhs to [batch, K, N]. b_shared when
// the rhs has no batch dims of size > 1 (a weight): then the batch folds into M. nullopt for other
// dtypes or unknown dims.
std::optional<MatmulDesc> dot_general_matmul(const Node& dot);

// "[12x128x64]·[12x64x128]" (the batch is left out when it is 1).
std::string matmul_str(const MatmulDesc& d);

class Matmul {
 public:
  // Throws tessel::Error naming the shapes on an invalid descriptor or a oneDNN failure. Build it
  // after omp_set_num_threads(T): if run() finds another thread count it rebuilds the primitive.
  explicit Matmul(const MatmulDesc& d);
  ~Matmul();
  Matmul(Matmul&&) noexcept;
  Matmul& operator=(Matmul&&) noexcept;

  // True when the descriptor is valid and oneDNN has an optimised (not reference) kernel for its
  // strides; otherwise the caller should copy operands into a plain layout first.
  static bool supported(const MatmulDesc& d);

  // b is ignored when the descriptor had constant_b. Not reentrant: one call at a time per object.
  void run(const float* a, const float* b, float* c) const;

  const MatmulDesc& desc() const;
  bool packed_b() const;     // B was pre-packed into oneDNN's preferred layout
  // The packed B, its owner keeping the bytes alive (another primitive of the same constant takes it
  // as its prepacked_b: one packing however many kernels read the weights), or an invalid one when B
  // is not packed or its layout cannot be described (then it is not worth storing or sharing).
  PackedWeights packed_weights() const;
  bool used_prepacked() const;  // the constructor took MatmulDesc::prepacked_b
  // oneDNN's implementation name ("brg:avx512_core", "gemm:jit", ...), "inner product gemm:jit" for the gemv path
  std::string impl() const;
  int parts() const;         // primitives run on the thread team (MatmulDesc::team), 0 when not

 private:
  struct Impl;
  struct Part;
  struct PartTag {};
  Matmul(const MatmulDesc& d, PartTag);  // one part: single-threaded, its own scratchpad
  void construct();
  std::unique_ptr<Impl> impl_;
};

// How Conv2d keeps activations: plain NCHW, or oneDNN's preferred blocked layout with reorders from
// and to NCHW inside run(). automatic is blocked, ten times faster on mobilenet_v2's layers
// (bench/matmul_floor.md).
enum class ConvLayout { automatic, nchw, blocked };

// 2-D convolution, NCHW fp32: grouped and depthwise (groups == C == OC), strides, pads, dilations.
struct ConvDesc {
  int64_t N = 0, C = 0, H = 0, W = 0, OC = 0, KH = 0, KW = 0, OH = 0, OW = 0;
  int64_t stride_h = 1, stride_w = 1, pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  int64_t dil_h = 1, dil_w = 1, groups = 1;
  const float* weights = nullptr;  // [OC, C/groups, KH, KW], packed (copied) by the constructor
  PackedWeights prepacked;         // as MatmulDesc::prepacked_b
  const float* bias = nullptr;     // [OC] or null, copied by the constructor
  Epilogue epilogue;
  ConvLayout layout = ConvLayout::automatic;
  // Physical layout of the activations in memory: NCHW (default) or NHWC (channels last, which the
  // compiled backend's layout decision keeps between convolutions). With either in NHWC, the
  // primitive works on the caller's buffers directly (no reorders).
  bool src_nhwc = false, dst_nhwc = false;
};

// "[1x32x112x112]*[32x1x3x3] s1 p1,1,1,1 g32".
std::string conv_str(const ConvDesc& d);

class Conv2d {
 public:
  // Throws tessel::Error naming the shapes on an invalid descriptor (including OH/OW that do not
  // follow from the others) or a oneDNN failure.
  explicit Conv2d(const ConvDesc& d);
  ~Conv2d();
  Conv2d(Conv2d&&) noexcept;
  Conv2d& operator=(Conv2d&&) noexcept;

  // x [N, C, H, W] -> y [N, OC, OH, OW], both NCHW. Not reentrant.
  void run(const float* x, float* y) const;

  const ConvDesc& desc() const;
  bool blocked() const;  // activations go through oneDNN's blocked layout
  PackedWeights packed_weights() const;  // as Matmul::packed_weights
  bool used_prepacked() const;
  std::string impl() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// 3-D convolution, NCDHW fp32 activations in and out (video models' Conv3d): grouped, strides, pads,
// dilations (1 = dense), no bias or epilogue (the core convolution has none). oneDNN chooses the
// layouts it computes in; the activations are reordered in and out around the primitive where they
// differ, the weights once at construction.
struct Conv3dDesc {
  int64_t N = 0, C = 0, D = 0, H = 0, W = 0, OC = 0, KD = 0, KH = 0, KW = 0, OD = 0, OH = 0, OW = 0;
  std::array<int64_t, 3> stride{1, 1, 1}, dilation{1, 1, 1}, pad_lo{0, 0, 0}, pad_hi{0, 0, 0};
  int64_t groups = 1;
  const float* weights = nullptr;  // [OC, C/groups, KD, KH, KW], packed (copied) by the constructor
};

class Conv3d {
 public:
  // Throws tessel::Error naming the shapes on an invalid descriptor or a oneDNN failure.
  explicit Conv3d(const Conv3dDesc& d);
  ~Conv3d();
  Conv3d(Conv3d&&) noexcept;
  Conv3d& operator=(Conv3d&&) noexcept;
  // x [N, C, D, H, W] -> y [N, OC, OD, OH, OW]. Not reentrant.
  void run(const float* x, float* y) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessel::cpu
