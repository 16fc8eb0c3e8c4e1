// Precompiled kernels for the core ops (the graph backend's "op by op with precompiled kernels"):
// for one core node with static shapes, everything that does not depend on the data (strides,
// copy plans, attribute parsing, packed constant weights) is worked out once, and the result is a
// closure that reads and writes raw memory.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tessel/ir/graph.h"

namespace tessel {

// The memory of every value while an executable runs, indexed by Value::id.
struct KernelEnv {
  std::vector<uint8_t*> ptr;
};

using CoreKernel = std::function<void(KernelEnv&)>;

// A typed kernel for `n` (a tessel.core node whose operands and results have static shapes), or an
// empty function when there is none for this op and dtype (the caller then runs the reference
// kernel). Errors that only the data can reveal (an index out of range, integer division by zero)
// are thrown as tessel::Error when the kernel runs.
CoreKernel make_core_kernel(const Node& n);

// Whether result 0 of `n` may be written over operand `input` (same bytes per element and element
// count, each element read before the same position is written), once that operand is dead.
bool can_run_in_place(const Node& n, int input);

}  // namespace tessel
