// Import-time expansion of ONNX ops that tessel does not keep as graph ops: control flow with a
// statically resolvable shape (If, Scan), the recurrent ops (RNN, GRU, LSTM), the training optimizers
// (Adagrad, Adam, Momentum) and the tensor forms of the optional ops are rewritten, while the model is
// imported, into graph ops that every backend already runs (docs/decisions.md says why).
#pragma once

#include <onnx/onnx_pb.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tessel/ir/graph.h"
#include "tessel/ir/infer.h"

namespace tessel {

// One op the importer expands: its domain, name and the graph ops it becomes (for the op table).
struct ExpandedOp {
  std::string domain, op, form;
};
const std::vector<ExpandedOp>& expanded_ops();

// Whether the node is expanded at import.
bool is_expanded_op(const onnx::NodeProto& np);

// The subgraph attributes of a node (an expanded op's subgraphs must be importable too).
std::vector<const onnx::GraphProto*> expanded_op_subgraphs(const onnx::NodeProto& np);

struct ExpandCtx {
  Graph& g;
  std::string node_name;                     // provenance of every node the expansion adds
  std::map<std::string, Attr> attrs;         // the node's non-graph attributes, converted
  std::vector<Value*> inputs;                // null for omitted optional inputs
  int num_outputs = 0;                       // the node's outputs (trailing omitted ones dropped)
  // Types (and folded values) of everything imported so far, inferred incrementally.
  std::function<const InferResult&()> infer;
  // Imports a subgraph: its formal inputs bound to `args` in order, names of the enclosing scopes
  // visible; returns its outputs in order.
  std::function<std::vector<Value*>(const onnx::GraphProto&, const std::vector<Value*>& args)> import_body;
};

// Emits the expansion of `np` into ctx.g and returns one value per output of the node (null where
// the op leaves an output undefined). Throws tessel::Error (unsupported) for forms it cannot express.
std::vector<Value*> expand_node(ExpandCtx& ctx, const onnx::NodeProto& np, int opset);

}  // namespace tessel
