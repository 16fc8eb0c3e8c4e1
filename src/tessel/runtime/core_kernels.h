// Precompiled kernels for the core ops (the graph backend's "op by op with precompiled kernels"):
// for one core node with static shapes, everything that does not depend on the data (strides,
// copy plans, attribute parsing, packed constant weights) is worked out once, and the result is a
// closure that reads and writes raw memory.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "tessel/ir/graph.h"

namespace tessel {

// The memory of every value while an executable runs, indexed by Value::id.
struct KernelEnv {
  std::vector<uint8_t*> ptr;
};

using CoreKernel = std::function<void(KernelEnv&)>;

// A value that is never materialised: a broadcast_in_dim result read straight from its operand's
// memory. Element i (a multi-index over the value's shape) is at src[sum_d i_d * strides[d]].
struct StridedView {
  int src_id = 0;
  std::vector<int64_t> strides;   // in elements, one per dim of the viewed value (0: broadcast)
};
using ViewMap = std::map<int, StridedView>;  // by Value::id of the viewed value

// The view that stands for the result of broadcast_in_dim node `n`.
StridedView broadcast_view(const Node& n);
// Whether the typed kernels of `n` read operands through views (elementwise binary, compare, select,
// gather).
bool reads_views(const Node& n);
// Copies a view of a value of `shape` (elements of `elem_bytes`) into contiguous memory.
void materialize_view(const StridedView& v, const uint8_t* src, const Shape& shape, int elem_bytes, uint8_t* dst);

// For an elementwise unary node whose operand is a view: the kernel that applies the op to the
// view's source only (unary ops commute with broadcasting), writing `count` elements to the
// memory of the node's result, which then stands for a view with the operand's strides.
CoreKernel make_unary_on_source(const Node& n, const StridedView& operand, int64_t count);
bool is_elementwise_unary(const Node& n);

// A typed kernel for `n` (a tessel.core node whose operands and results have static shapes), or an
// empty function when there is none for this op and dtype (the caller then runs the reference
// kernel). Operands listed in `views` are read through their views (only where reads_views(n)).
// Errors that only the data can reveal (an index out of range, integer division by zero) are thrown
// as tessel::Error when the kernel runs.
CoreKernel make_core_kernel(const Node& n, const ViewMap& views = {});

// The kernel of a node marked layout = "nhwc" (runs_channels_last, kernel/kernel.h): a pooling or a
// channel concatenation whose operands and result are stored channels-last. Empty when `n` is not
// marked; a marked node that cannot run channels-last is an error naming it.
CoreKernel make_channels_last_kernel(const Node& n);

// Whether result 0 of `n` may be written over operand `input` (same bytes per element and element
// count, each element read before the same position is written), once that operand is dead.
bool can_run_in_place(const Node& n, int input);

}  // namespace tessel
