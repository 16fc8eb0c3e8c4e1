// CoreBuilder: what a decomposition hook uses to emit core ops in place of a graph-level node. Every
// emitted node carries the original node's name (provenance) and is type-checked as it is emitted.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tessel/ir/graph.h"

namespace tessel {

class CoreBuilder {
 public:
  CoreBuilder(Graph& g, const Node& origin) : g_(g), origin_(origin) {}

  // Emits core op `op` (a tessel.core registry entry) and returns its first output.
  Value* emit(const std::string& op, std::vector<Value*> inputs, std::map<std::string, Attr> attrs = {});
  // Like emit, for ops with several outputs.
  std::vector<Value*> emit_multi(const std::string& op, std::vector<Value*> inputs, int num_outputs,
                                 std::map<std::string, Attr> attrs = {});
  Value* constant(Tensor t);
  Value* scalar(DType t, double v);  // a constant of shape [] and dtype t
  // numpy broadcasting made explicit: `v` unchanged if it already has `shape`, else broadcast_in_dim.
  Value* broadcast_to(Value* v, const Shape& shape);
  // `v` unchanged if it already has dtype `t`, else convert.
  Value* convert(Value* v, DType t);
  const Node& origin() const { return origin_; }

 private:
  Graph& g_;
  const Node& origin_;
};

}  // namespace tessel
