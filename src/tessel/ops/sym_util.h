// Shared pieces of the graph-level ops' rules for symbolic sizes (docs/dynamic-shapes.md): marking an
// op as taking them, dims that are unknown (data-dependent) rather than symbolic, dims that must be
// equal, and shape arithmetic over values whose elements are sizes (SymTensor).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tessel/ir/op_registry.h"

namespace tessel {

// `d` marked as taking symbolic sizes (OpDef::symbolic): its shape rule reads dims, and so does its
// decomposition when it has one.
inline OpDef symbolic_op(OpDef d) {
  d.symbolic = true;
  return d;
}

// A data-dependent dim (kUnknownDim), as opposed to a static or a symbolic one.
inline bool dim_unknown(const Dim& d) { return d.is_static() && d.constant_term() < 0; }
inline bool dims_unknown(const Dims& d) {
  for (const Dim& x : d)
    if (dim_unknown(x)) return true;
  return false;
}

// `t` with another dtype and the same dims.
inline TensorType with_dtype(TensorType t, DType dt) {
  t.dtype = dt;
  return t;
}

// The number of elements of `d`, or kUnknownDim when a dim is unknown.
Dim numel_or_unknown(const Dims& d);

// Two dims that must be equal (operands that do not broadcast): the known one when the other is
// unknown, else the common one. A static mismatch fails with the message `what`; a pair the symbols
// do not decide (s0 against 4, s0 against s1) is refused as unsupported, `what` and the pair named.
Dim merge_equal_dims(const Dim& a, const Dim& b, const std::string& what);

// ---- shape arithmetic: values whose elements are sizes -----------------------------------------

// The values of inputs `ins` as sizes (a bool constant reads as 0 and 1) when every one is known and
// at least one is symbolic; nullopt otherwise (static shape arithmetic keeps folding through the
// reference kernels, unchanged).
std::optional<std::vector<SymTensor>> symbolic_operands(const InferCtx& c, const std::vector<int>& ins);

// 0, 1, ..., the node's input count - 1: every operand of a variadic op.
inline std::vector<int> every_input(const InferCtx& c) {
  std::vector<int> all;
  for (int i = 0; i < c.num_inputs(); ++i) all.push_back(i);
  return all;
}

// One element of a result from one element of each operand; nullopt when the symbols do not decide it.
using SymElemFn = std::function<std::optional<Dim>(const std::vector<Dim>&)>;
// f over the numpy broadcast of the operands (static shapes); nullopt when f leaves an element
// undecided.
std::optional<SymTensor> sym_elementwise(const std::vector<SymTensor>& ops, DType dtype, const SymElemFn& f);
// Output 0 as f over inputs `ins` when they are symbolic sizes and f decides every element; otherwise
// the output keeps the type the rule set (its value is then unknown).
void set_sym_elementwise(InferCtx& c, const std::vector<int>& ins, DType dtype, const SymElemFn& f);
// Output 0 takes input 0's symbolic value, elements in order, in the shape the rule set for it
// (Identity, Reshape, Squeeze, Unsqueeze, Flatten, Cast between integer types); dtype: the output's.
void forward_sym_value(InferCtx& c);

// a OP b for sizes when the symbols decide it for every value (a - b provably >= 0, > 0, ...).
enum class SizeCmp { eq, lt, le, gt, ge };
std::optional<bool> compare_sizes(SizeCmp op, const Dim& a, const Dim& b);

// The [start, end) of a rank-r value's dims that Shape node `n` lists (its start and end attributes).
std::pair<int64_t, int64_t> shape_range(const Node& n, int64_t r);
// When `v` is the result of a Shape node: the dims it lists, unknown ones (data-dependent) as
// kUnknownDim. What a Gather of a Shape can read when the dims it picks are known even though the
// whole shape is not (torch.onnx's squeeze of a dim whose size it cannot see: If(Shape(x)[1] == 1)).
std::optional<Dims> listed_dims(const Value* v);

}  // namespace tessel
