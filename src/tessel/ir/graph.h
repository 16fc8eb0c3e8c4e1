// The graph level: a Graph of Nodes connected by Values, in topological order.
#pragma once

#include <functional>
#include <map>
#include <unordered_map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "tessel/support/tensor.h"

namespace tessel {

struct OpDef;
class Node;

// An attribute value. The variant index is its kind (see AttrKind in op_registry.h). A list of sizes
// with a symbolic entry (a core op's shape, slice bounds) is Dims; static lists are always ints
// (dims_attr makes the right one).
using Attr = std::variant<int64_t, double, std::string, std::vector<int64_t>, std::vector<double>,
                          std::vector<std::string>, Tensor, Dims>;
Attr dims_attr(const Dims& d);

// An SSA value: a graph input, a constant, or one output of a node.
struct Value {
  int id = 0;
  std::string name;                  // unique within the graph
  TensorType type;
  Node* producer = nullptr;          // null for inputs and constants
  int producer_output = 0;
  std::optional<Tensor> constant;    // set for constants (initializers, folded values)
  bool is_input = false;
};

class Node {
 public:
  const OpDef* op = nullptr;         // never null once inserted in a graph
  std::string name;                  // provenance: the source node's name
  std::vector<Value*> inputs;        // null entries are omitted optional inputs
  std::vector<Value*> outputs;
  std::map<std::string, Attr> attrs;

  const std::string& op_name() const;
  bool has_input(int i) const { return i < static_cast<int>(inputs.size()) && inputs[i] != nullptr; }
  bool has_attr(const std::string& n) const { return attrs.count(n) != 0; }
  // Typed attribute access; the forms without a default throw naming the attribute when missing.
  int64_t attr_i(const std::string& n) const;
  int64_t attr_i(const std::string& n, int64_t dflt) const;
  double attr_f(const std::string& n) const;
  double attr_f(const std::string& n, double dflt) const;
  std::string attr_s(const std::string& n) const;
  std::string attr_s(const std::string& n, const std::string& dflt) const;
  std::vector<int64_t> attr_ints(const std::string& n) const;
  std::vector<int64_t> attr_ints(const std::string& n, const std::vector<int64_t>& dflt) const;
  std::vector<double> attr_floats(const std::string& n) const;
  std::vector<double> attr_floats(const std::string& n, const std::vector<double>& dflt) const;
  std::vector<std::string> attr_strings(const std::string& n) const;
  // A list of sizes, static (ints) or symbolic (Dims). attr_ints of a symbolic list throws naming it.
  Dims attr_dims(const std::string& n) const;
  Dims attr_dims(const std::string& n, const Dims& dflt) const;
  bool has_symbolic_attr() const;
  const Tensor& attr_t(const std::string& n) const;
};

class Graph {
 public:
  std::string name = "main";
  std::vector<Value*> inputs;
  std::vector<Value*> outputs;
  // The size symbols the graph's types and attributes name, with their facts (docs/dynamic-shapes.md).
  SymbolTable symbols;

  Value* add_value(std::string name, TensorType type);
  Value* add_input(std::string name, TensorType type);
  Value* add_constant(std::string name, Tensor t);
  // Appends a node; outputs are new values with the given names (types filled by inference).
  Node* add_node(const OpDef* op, std::string node_name, std::vector<Value*> inputs,
                 const std::vector<std::string>& output_names, std::map<std::string, Attr> attrs = {});
  // Appends a copy of `n` (of another graph) that reads `inputs`: its op, name, attributes (or
  // `attrs` when given), output names and types; `map` gets each of n's outputs' copy.
  Node* add_copy(const Node& n, std::vector<Value*> inputs, std::map<const Value*, Value*>& map,
                 const std::map<std::string, Attr>* attrs = nullptr);
  // A copy of the whole graph: its name, symbols, every value in order (names, types, ids, constants
  // sharing their storage, input flags), nodes, inputs and outputs. The one graph copy of tessel.
  std::unique_ptr<Graph> clone() const;

  const std::vector<std::unique_ptr<Node>>& nodes() const { return nodes_; }
  std::vector<std::unique_ptr<Node>>& mutable_nodes() { return nodes_; }
  const std::vector<std::unique_ptr<Value>>& values() const { return values_; }
  Value* find_value(const std::string& name) const;
  // A value name not yet used in the graph, derived from `base`.
  std::string unique_name(const std::string& base) const;
  // Constants in order of creation.
  std::vector<Value*> constants() const;

  // ---- rewriting (used by passes) ----
  // Gives `v` the name `name`; false (nothing changes) if another value has it.
  bool rename_value(Value* v, const std::string& name);
  // `to` takes `from`'s name and `from` becomes "<name>.replaced" (made unique): the value that now
  // carries a result keeps the name the model gave it. Values are renamed only through the graph,
  // which keeps its name index true (a test scans the sources for in-place renames).
  void hand_name_over(Value* from, Value* to);
  // Empty when the name index answers every value for its name and holds nothing else; else the
  // first disagreement (a value renamed in place, behind the graph's back). For tests: passes keep
  // the index true without rechecking it.
  std::string check_name_index() const;
  // Points every use of `from` (node inputs, graph outputs) at `to`.
  void replace_all_uses(Value* from, Value* to);
  // Number of node inputs and graph outputs that use each value, indexed by Value::id.
  std::vector<int> use_counts() const;
  // The nodes reading each value (a node once per input it reads it at), indexed by Value::id (ids up
  // to the largest in the graph: compact() need not have run).
  std::vector<std::vector<const Node*>> users() const;
  // Whether `v` is one of the graph's outputs.
  bool returns(const Value* v) const;
  // Removes the nodes for which `dead` is true (their outputs must be unused).
  void erase_nodes_if(const std::function<bool(const Node&)>& dead);
  // Drops values nothing defines or uses any more (unused constants, outputs of erased nodes) and
  // renumbers Value::id densely in the surviving order. Graph inputs are always kept.
  void compact();

 private:
  std::vector<std::unique_ptr<Value>> values_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::unordered_map<std::string, Value*> by_name_;
  mutable std::unordered_map<std::string, int> name_hints_;  // unique_name: where probing for a base resumes
};

}  // namespace tessel
