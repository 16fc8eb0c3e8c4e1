// The kernel level (docs/ir/kernel.md): the core graph after fusion. Every fusion group became one
// `kernel` node (domain tessel.kernel) of the graph; its inputs and outputs are the buffers the
// kernel reads and writes. The node's attribute `kernel` indexes a Kernel of the module, which holds
// the group as a loop nest: loads and stores through affine index maps over the loop space (views
// such as transpose, slice, broadcast and reshape are folded into those maps), scalar instructions,
// and reductions that keep their accumulator in a register. Matmul and convolution kernels are a
// library call (oneDNN) followed by their fused epilogue as a loop nest over the call's result.
// Core nodes that no kernel covers stay in the graph and run as in the graph backend.
//
// Sizes (loop extents, strides, offsets, library dims) are Dims: static numbers, or expressions of the
// module graph's size symbols when the core graph had symbolic shapes (docs/dynamic-shapes.md). The
// generated code then reads the symbols' values at run time; instantiate_kernels() gives the static
// kernels of one binding, which is what the runtime, the library calls and the other targets read.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <string>
#include <vector>

#include "tessel/ir/core_ops.h"
#include "tessel/ir/graph.h"
#include "tessel/ir/printer.h"

namespace tessel {

// An affine index map: loop point (i_0 .. i_{n-1}) of the kernel's loop space (outer dims, then
// inner dims) reads or writes element  offset + sum_d strides[d] * i_d  of buffer `arg`.
struct KAccess {
  int arg = 0;
  Dim offset = 0;
  Dims strides;
};

// One scalar instruction of a loop body, in SSA form (ids are positions in Kernel::body). What it is
// is an enum, never a name (issue 36): `kind`, and for kind core the primitive `core`.
//   load     access            -> the element the access map selects
//   store    access, args[0]   -> writes args[0]; attr "ftz" (floats): a result below the smallest
//                                 normal may be stored as zero of its sign (a permission, which the
//                                 host CPU's code takes: targets/cpu/ftz.h)
//   const    value             -> a scalar of `dtype`
//   core     CoreOp::reduce: attr = sum|max|min|prod, args[0]: accumulates an element value of phase
//            p; the result is a row value, available from phase p + 1 on
//            any other (add, mul, exp, compare, select, convert, ...) with its operands; attr holds
//            compare's direction.
// The text form spells each by its name (KInstr::name, kinstr_named).
// Element instructions run inside the loop of phase `phase`; row instructions (row = true) run
// once per outer point, before the loop of phase `phase` (phase == Kernel::phases: after the last).
enum class KInstrKind : uint8_t { load, store, constant, core };

struct KInstr {
  KInstrKind kind = KInstrKind::core;
  CoreOp core = CoreOp::add;  // the primitive, when kind == core (a reduction is CoreOp::reduce)
  DType dtype = DType::f32;
  std::vector<int> args;
  int access = -1;
  std::string attr;
  double value = 0;
  int phase = 0;
  bool row = false;

  bool is(KInstrKind k) const { return kind == k; }
  bool is(CoreOp op) const { return kind == KInstrKind::core && core == op; }
  // "load", "store", "const" or the primitive's name: the text form's and the messages' spelling.
  std::string_view name() const;
};
// The instruction a text-form name spells; nullopt for a name that is none of them.
std::optional<KInstr> kinstr_named(std::string_view name);

enum class KernelKind { loop, matmul, conv };
std::string_view kernel_kind_name(KernelKind k);

// A buffer the kernel touches: one input or output of its node, or a scratch buffer of its own.
struct KArg {
  std::string name;        // the graph value (inputs and outputs), or "scratchN"
  TensorType type;
  enum class Role { in, out, scratch } role = Role::in;
};

// C[b] = A[b] · B[b] with A [batch, M, K] and B [batch, K, N] read through strides (elements);
// C [batch, M, N] in arg `c`, contiguous unless c strides are set (a result stored in another
// order, e.g. attention heads written straight into the merged [T, H·D] layout).
struct MatmulSpec {
  int a = 0, b = 0, c = 0;
  Dim batch = 1, m = 0, n = 0, k = 0;
  Dim a_offset = 0, a_batch = 0, a_m = 0, a_k = 0;
  Dim b_offset = 0, b_batch = 0, b_k = 0, b_n = 0;
  Dim c_batch = 0, c_m = 0, c_n = 0;  // all 0: contiguous
};

// 2-D convolution of logical NCHW activations, weights [OC, C/groups, KH, KW] (a constant arg), result
// in arg `y`. Each activation buffer is laid out NCHW or NHWC (channels last) in memory.
struct ConvSpec {
  int x = 0, w = 0, y = 0;
  bool x_nhwc = false, y_nhwc = false;
  Dim n = 0;  // the batch: the one dim that may be symbolic
  int64_t c = 0, h = 0, wd = 0, oc = 0, kh = 0, kw = 0, oh = 0, ow = 0;
  int64_t stride_h = 1, stride_w = 1, pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  int64_t dil_h = 1, dil_w = 1, groups = 1;
};

struct Kernel {
  std::string name;                    // k0, k1, ... (the generated function is tsl_<name>)
  KernelKind kind = KernelKind::loop;
  std::vector<std::string> sources;    // provenance: names of the fused core nodes' source nodes
  int fused_nodes = 0;                 // core nodes the kernel covers (views included)
  std::vector<KArg> args;              // node inputs, then node outputs, then scratch buffers
  Dims outer;                          // parallel loop dims (may be empty)
  Dims inner;                          // loop dims every phase iterates (innermost last)
  int phases = 1;
  std::vector<KAccess> accesses;
  std::vector<KInstr> body;            // the loop body; for matmul/conv: the epilogue
  MatmulSpec mm;
  ConvSpec conv;
  // Fusion traffic: bytes read and written from memory if every fused core node ran alone
  // (operands and results of each), and as this kernel runs (its buffers once each).
  Dim bytes_unfused = 0, bytes_fused = 0;

  int num_inputs() const;
  int num_outputs() const;
  Dim outer_count() const;
  Dim inner_count() const;
  // The range a call of the generated function splits across threads: the outer points, or for a
  // kernel without outer dims (pointwise) the innermost dim.
  Dim parallel_extent() const;
  // Whether a size of the kernel names a size symbol.
  bool symbolic() const;
  // The size symbols its sizes name, sorted, once each.
  std::vector<std::string> symbols() const;
  // Whether the parallel range is the innermost dim (a single-phase pointwise kernel without
  // outer dims) rather than the outer points.
  bool splits_inner() const;
  int loop_rank() const { return static_cast<int>(outer.size() + inner.size()); }
};

struct KernelModule {
  std::unique_ptr<Graph> graph;        // core ops and kernel nodes
  std::vector<Kernel> kernels;
};

// The kernels with the symbols bound to `b` (every size static), each verified again with its
// numbers: the bounds every access keeps are checked for this binding too.
std::vector<Kernel> instantiate_kernels(const std::vector<Kernel>& ks, const Bindings& b);
// verify = false: not verified again, for a kernel the verifier proved for every value of its symbols
// that satisfies their facts, bound by a binding that was checked against them (an executable
// rebound per decoded token: docs/dynamic-shapes.md).
Kernel instantiate_kernel(const Kernel& k, const Bindings& b, bool verify = true);

// The op of kernel nodes: attribute `kernel` = index into KernelModule::kernels.
const OpDef& kernel_op();
bool is_kernel_node(const Node& n);

// Channels-last steps. A core node that no kernel covers reads and writes row-major buffers, except a
// pooling (reduce_window over H and W of an f32 [N, C, H, W] value) or a channel concatenation
// (concatenate along dim 1 of f32 [N, C, H, W] values) that the fuser marks with the attribute
// layout = "nhwc" (FuseOptions::layout_steps): then every operand and the result are stored
// channels-last ([N, H, W, C] memory), as the kernels around it store them. The values are the same;
// only the compiled backend's buffers differ.
bool can_run_channels_last(const Node& n);  // op, dtype, rank and window fit
bool runs_channels_last(const Node& n);     // marked layout = "nhwc" (can_run_channels_last is checked where it runs)

// Text form (docs/ir/kernel.md): the graph in the graph level's text form followed by one block per
// kernel. parse_kernel_module(print_kernel_module(m)) prints back identically.
std::string print_kernel(const Kernel& k);
std::string print_kernel_module(const KernelModule& m, bool elide_constants = false);
KernelModule parse_kernel_module(const std::string& text, const std::string& file = "<text>");
// The same with larger constants kept outside the text (PrintOptions::external_blobs): the form the
// compile cache stores, with the constants' bytes in a file of their own.
std::string print_kernel_module(const KernelModule& m, std::vector<const Tensor*>* external_blobs);
KernelModule parse_kernel_module(const std::string& text, const std::string& file, const BlobSource& blobs);

// Checks every kernel against its node and itself: arg types equal the node's values, accesses stay
// inside their buffers, instructions are well typed and only use values available where they run.
// Throws tessel::Error naming the kernel.
void verify_kernel_module(const KernelModule& m);
void verify_kernel(const Kernel& k);

// ---- fusion (core -> kernel) -------------------------------------------------------------------

struct FuseOptions {
  bool matmul = true;                  // matmul/conv kernels through the library with fused epilogues
  bool fuse = true;                    // false: one kernel per core node (the fusion ablation)
  // 1-D convolutions as conv kernels with H = 1 (compile_cpu sets it; the tile mapper takes 2-D only).
  bool conv1d = false;
  // A convolution may read its input through a view whose strides are those of NCHW or NHWC memory
  // (convnext's permute back from [N, H, W, C]); otherwise only from a root of the same shape.
  // compile_cpu sets it; the tile mapper assumes the input arg has the convolution's NCHW shape.
  bool conv_input_views = false;
  // Poolings and channel concatenations between channels-last kernels run channels-last themselves
  // (layout = "nhwc", runs_channels_last) instead of forcing row-major buffers around them, which cost
  // a reorder in every convolution next to them. compile_cpu sets it; the tile mapper runs them
  // row-major.
  bool layout_steps = false;
  // A product of two computed operands with a symbolic dim (attention's Q·Kᵀ and P·V over the KV
  // length) goes through the library too. Off by default: a library primitive is built per binding of
  // the sizes, and the KV length is new at every decoded token; the product stays a core dot_general,
  // which the graph backend's precompiled kernel runs with each binding's sizes. Products with a
  // constant operand (a layer's weights, whose rows change only with the batch or prompt) stay library
  // calls; static graphs are not affected.
  bool symbolic_activation_matmuls = false;
};

// The options compile_cpu fuses with: `base` with conv1d, conv_input_views and layout_steps on.
inline FuseOptions cpu_fuse_options(FuseOptions base = {}) {
  base.conv1d = base.conv_input_views = base.layout_steps = true;
  return base;
}


// Rewrites a core graph (after the "core" pipeline) into a kernel module. Nodes it cannot lower
// (non-core ops, dynamic shapes, dtypes or ops the code generators do not handle) stay as they are.
// What fused and the traffic each kernel saves are in the kernels (sources, fused_nodes, bytes_*).
KernelModule fuse(std::unique_ptr<Graph> core, const FuseOptions& opts = {});

}  // namespace tessel
