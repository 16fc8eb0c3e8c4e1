// CoreBuilder: what a decomposition hook uses to emit core ops in place of a graph-level node. Every
// emitted node carries the original node's name (provenance) and is type-checked as it is emitted.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessel/ir/core_ops.h"
#include "tessel/ir/graph.h"

namespace tessel {

class CoreBuilder {
 public:
  CoreBuilder(Graph& g, const Node& origin) : g_(g), origin_(origin) {}

  // Emits primitive `op` (its tessel.core registry entry) and returns its first output. The op is the
  // enum, not its name: a misspelt primitive does not compile.
  Value* emit(CoreOp op, std::vector<Value*> inputs, std::map<std::string, Attr> attrs = {});
  // Like emit, for ops with several outputs.
  std::vector<Value*> emit_multi(CoreOp op, std::vector<Value*> inputs, int num_outputs,
                                 std::map<std::string, Attr> attrs = {});
  Value* constant(Tensor t);
  Value* scalar(DType t, double v);  // a constant of shape [] and dtype t
  // Sizes are Dims (static or symbolic, docs/dynamic-shapes.md); a Shape or a braced list converts.
  // numpy broadcasting made explicit: `v` unchanged if it already has `shape`, else broadcast_in_dim.
  Value* broadcast_to(Value* v, const DimList& shape);
  // `v` unchanged if it already has dtype `t`, else convert.
  Value* convert(Value* v, DType t);
  // A constant of dtype t and `shape` filled with v (a scalar constant broadcast_in_dim'ed).
  Value* full(DType t, const DimList& shape, double v);
  // A size as a value of shape [] and dtype t: a constant, or for a symbolic size the sum of that many
  // ones (exact in integers), so that arithmetic on data can use sizes known only at run time.
  Value* size_value(const Dim& d, DType t);

  // ---- sugar over emit (operands are numpy-broadcast to their common shape first) ----
  Value* unary(CoreOp op, Value* v) { return emit(op, {v}); }
  Value* binary(CoreOp op, Value* a, Value* b);
  Value* add(Value* a, Value* b) { return binary(CoreOp::add, a, b); }
  Value* sub(Value* a, Value* b);  // a + (-b)
  Value* mul(Value* a, Value* b) { return binary(CoreOp::mul, a, b); }
  Value* div(Value* a, Value* b) { return binary(CoreOp::div, a, b); }
  Value* max(Value* a, Value* b) { return binary(CoreOp::max, a, b); }
  Value* min(Value* a, Value* b) { return binary(CoreOp::min, a, b); }
  Value* compare(const std::string& direction, Value* a, Value* b);  // eq ne lt le gt ge -> bool
  Value* select(Value* pred, Value* on_true, Value* on_false);
  Value* reshape(Value* v, const DimList& shape);                     // v unchanged if same shape
  Value* transpose(Value* v, const std::vector<int64_t>& perm);       // v unchanged if identity
  // reduce {kind} over `axes` (any order, negative allowed); keepdims adds a reshape back to rank.
  Value* reduce(Value* v, const std::string& kind, std::vector<int64_t> axes, bool keepdims);
  Value* slice(Value* v, const DimList& starts, const DimList& stops, std::vector<int64_t> strides = {});
  Value* concat(std::vector<Value*> vs, int64_t axis);
  Value* iota(DType t, const DimList& shape, int64_t axis);

  // The value of input `i` of the origin node when it is known at compile time (a constant or a
  // folded value), else nullopt. need_constant throws an "unsupported" error naming the input
  // (`what`) when it is not known: the static-shape core level cannot express it.
  std::optional<Tensor> known(int i) const;
  const Tensor& need_constant(int i, const std::string& what) const;
  // Input `i` as a list of sizes when it is known at compile time: an integer constant (static sizes)
  // or the output of a `Sizes` node (sizes that may be symbolic: docs/dynamic-shapes.md), flattened;
  // else nullopt. need_sizes throws "unsupported" naming the input like need_constant.
  std::optional<Dims> known_sizes(int i) const;
  Dims need_sizes(int i, const std::string& what) const;

  Graph& graph() { return g_; }
  const Node& origin() const { return origin_; }

 private:
  Graph& g_;
  const Node& origin_;
};

}  // namespace tessel
