// Private to kernel/fuse*.cpp: what the phases of fusion (kernel/fuse.cpp) share across their files.
// Everything else a phase uses stays in an anonymous namespace of its own file.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "tessel/ir/core_ops.h"
#include "tessel/ir/graph.h"
#include "tessel/ir/op_registry.h"
#include "tessel/kernel/kernel.h"

namespace tessel::fuse_detail {

// ---- shared by every phase ----------------------------------------------------------------------

inline bool is_core(const Node& n) { return n.op->core.has_value(); }

// Every size known (static, or symbolic: docs/dynamic-shapes.md; not a data-dependent `?`) and
// non-empty: kernels are not generated for values without elements.
inline bool sized_value(const Value* v) {
  if (!v || !v->type.dims_defined()) return false;
  return provably_positive(dims_numel(v->type.dims()));
}
inline Dims dims(const Value* v) { return v->type.dims(); }

inline bool sized_node(const Node& n) {
  for (const Value* v : n.inputs)
    if (v && !sized_value(v)) return false;
  for (const Value* v : n.outputs)
    if (!v || !sized_value(v)) return false;
  return !n.outputs.empty();
}

// Orders nodes so every value is defined before use, keeping the original order where possible
// (fuse.cpp).
void topo_sort(Graph& g);

// ---- views (fuse_views.cpp) ---------------------------------------------------------------------

struct View {
  const Value* root = nullptr;
  Dim offset = 0;
  Dims strides;  // per dim of the viewed value
};

bool is_view_op(std::optional<CoreOp> op);
// The view of n's result, given the view `src` of its operand; nullopt when n is no view op or its
// result is no strided view of src's root (a reshape merging dims that are not contiguous).
std::optional<View> view_of(const Node& n, const View& src);
// How a convolution reads an input of shape s through view v (NCHW: false, NHWC: true, or nullopt).
std::optional<bool> conv_read_layout(const View& v, const Dims& s);

// Rewrites before grouping (fuse() runs them when FuseOptions::matmul, densify_conv_inputs also when
// FuseOptions::conv_input_views): a matmul or convolution constant operand read through zero strides
// becomes a dense constant; a convolution input oneDNN cannot read as a view gets a copy, and a
// model's first convolution a channels-last copy of its input.
void densify_library_constants(Graph& g);
void densify_conv_inputs(Graph& g);

// ---- groups (fuse_groups.cpp) --------------------------------------------------------------------

enum class GKind { loop, matmul, conv };

struct Group {
  GKind kind = GKind::loop;
  Dims F;                        // the iteration space
  std::vector<bool> R;           // reduced dims of F (loop groups)
  bool reduces = false;
  const Node* anchor = nullptr;  // matmul / conv node
  std::vector<const Node*> nodes;
};

enum class Level { elem, row };

struct Fuser {
  Graph& g;
  const FuseOptions& opts;
  std::vector<View> views;                 // per value id: its view (root = itself when not a view)
  std::vector<bool> is_view;               // per value id: produced by a folded view node
  std::vector<int> group_of_value;         // per value id: the group computing it (-1)
  std::vector<Level> level;                // per value id: level inside its group
  std::vector<std::set<int>> deps;         // per value id: groups it depends on
  std::vector<Group> groups;
  std::map<const Node*, int> node_group;
  // Values decide_layouts must leave row-major: an earlier run stored them in another layout that a
  // node outside every kernel would have read or written (layout_violations).
  std::set<int> row_major_only;

  Fuser(Graph& graph, const FuseOptions& o, std::set<int> row_major = {})
      : g(graph), opts(o), row_major_only(std::move(row_major)) {}

  size_t nv() const;

  // Layout: 4-D activations between convolutions are stored channels-last (NHWC) when every
  // reader is a kernel that reads through index maps (pointwise, reduce, a convolution's input).
  std::vector<bool> nhwc;  // per value id
  // A matmul result read only through one transpose (attention heads merged back) is stored in the
  // transpose's order, so the transpose and the reshape after it become views: physical dim i holds
  // logical dim order[i]. Empty: row-major.
  std::vector<std::vector<int64_t>> order;  // per value id

  Dims physical_strides(const Value* v) const;

  // The strides of a dot_general result's [batch, M, N] if its layout lets each group collapse.
  std::optional<std::array<Dim, 3>> matmul_result_strides(const Node& dot, const Dims& st) const;

  // A node that may run channels-last outside every kernel (can_run_channels_last), and one that will:
  // its operands and result all chose NHWC.
  bool layout_step(const Node& n) const;
  bool nhwc_step(const Node& n) const;

  void decide_layouts();

  void init();

  // The row value a view chain starts from, when `v` is a chain of reshapes of a row value of
  // group `gi`, optionally ending in a broadcast_in_dim that maps the row dims onto the non-reduced
  // dims of the group's space in order (a row value read at every element).
  bool row_root(const Value* v, int gi, const Value** root) const;

  Dims row_shape(const Group& gr) const;
  bool is_row_shape(const Group& gr, const Dims& s) const;

  // How operand `u` of a node placed in group gi at `lv` is read: inline (a member value at a
  // compatible level) or from memory. Returns false if it cannot be read there at all.
  bool operand_ok(const Value* u, int gi, Level lv, bool* inline_read) const;

  // Groups each group reads from (directly, through values computed outside it), kept up to date
  // as groups grow.
  std::vector<std::set<int>> gdeps;

  // Whether a group of `from` (other than `skip`) is target or depends on it, through gdeps.
  bool reaches(const std::set<int>& from, int target, int skip = -1) const;

  // Each node's position in the graph, and each group's first and last member's: a group whose last
  // node comes before target's first cannot depend on target (dependencies follow graph order), so
  // reaches() does not walk above it.
  std::map<const Node*, int> node_pos;
  std::vector<int> gfirst, glast;
  void span_group(int gi, const Node& n);
  void span_merge(int into, int from);

  void add_group_deps(const Node& n, int gi);

  // Whether node n may join group gi; sets the level it would have.
  bool can_join(const Node& n, int gi, Level* lv_out) const;

  // Groups that produce the operands of n (directly or through a row view), in operand order.
  std::vector<int> candidate_groups(const Node& n) const;

  void assign(const Node& n, int gi, Level lv);

  void propagate_deps(const Node& n);

  // decide_layouts runs before the groups exist, so it can pick channels-last or a transposed order
  // for a value whose producer or reader then stays a core node (a convolution whose input turned out
  // to be a view conv_spec refuses, a dot_general matmul_spec refuses, a reduce over unit axes): such
  // a node reads and writes row-major, and the kernels on the other side would read the buffer in the
  // wrong order (ConvNeXt's downsample). The values with a non-row-major layout whose producer, or a
  // reader (directly or through folded views), is in no group and no channels-last step, or that reach
  // a graph output. (A step with one operand left row-major makes its other operands and its result
  // violations: the next round leaves them row-major too.)
  std::vector<int> layout_violations() const;

  std::optional<MatmulSpec> matmul_spec(const Node& n) const;
  std::optional<ConvSpec> conv_spec(const Node& n) const;
  // How a convolution reads its input x straight from the memory of x's root: as NCHW (false) or
  // NHWC (true, e.g. convnext's LayerNorm2d result permuted back to NCHW, a view of an [N, H, W, C]
  // buffer); nullopt when neither.
  std::optional<bool> conv_input_layout(const Value* x) const;

  void run();

  // Vertical merging of elementwise loop groups: joining node by node puts a node with two producer
  // groups into one of them only, so a chain of updates whose operations start from inputs alone
  // (AdamW's p·decay, β1·m, β2·v) stays several loops. A plain elementwise loop group b that the plain
  // elementwise loop group a over the same space depends on joins a when no third group lies between
  // them and a's nodes read b's values directly (element i reads element i: no view), so the merged
  // loop computes b's values before a's in the same iteration.
  int vertical_merged = 0;
  void merge_vertical();

  // Sibling (horizontal) fusion: loop kernels over the same iteration space that read a common
  // buffer and do not depend on each other become one kernel, so the buffer is read once.
  int siblings_merged = 0;
  void merge_siblings();

  void start_group(const Node& n, GKind kind, Dims F, std::vector<bool> R, Level lv = Level::elem);
};

// ---- lowering (fuse_lower.cpp) ------------------------------------------------------------------

// Group gi of fz as a Kernel (loops collapsed, bytes_fused counted; its name is the caller's): *ins
// gets the root values the kernel reads, *outs the member values it stores (its node's inputs and
// outputs).
Kernel lower_group(Fuser& fz, int gi, std::vector<const Value*>* ins, std::vector<const Value*>* outs);

}  // namespace tessel::fuse_detail
