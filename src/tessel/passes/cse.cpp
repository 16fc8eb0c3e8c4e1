// cse: a node that computes the same op, with the same attributes, on the same inputs as an earlier
// node is replaced by it; constants with identical dtype, shape and bytes are merged.
#include <fmt/format.h>

#include <map>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "tessel/ir/op_registry.h"
#include "tessel/passes/pass.h"

namespace tessel {
namespace {

// A byte string that is equal for equal attribute values (tensors by dtype, shape and bytes).
std::string attr_key(const Attr& a) {
  std::string k = std::to_string(a.index()) + ":";
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double>) {
          k.append(reinterpret_cast<const char*>(&v), sizeof v);
        } else if constexpr (std::is_same_v<T, std::string>) {
          k += std::to_string(v.size()) + ":" + v;
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          for (const auto& s : v) k += std::to_string(s.size()) + ":" + s;
        } else if constexpr (std::is_same_v<T, Tensor>) {
          k += TensorType{v.dtype(), v.shape()}.str();
          k.append(reinterpret_cast<const char*>(v.bytes()), v.nbytes());
        } else {
          k.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(v[0]));
        }
      },
      a);
  return k;
}

std::string constant_key(const Tensor& t) {
  return TensorType{t.dtype(), t.shape()}.str() + std::string(reinterpret_cast<const char*>(t.bytes()), t.nbytes());
}

}  // namespace

std::string eliminate_common_subexpressions(Graph& g) {
  int merged_constants = 0, merged_nodes = 0;
  // Replacements are recorded and applied to each node as the walk reaches it (nodes are in
  // topological order, and a replacement's target is never itself replaced): one pass over the
  // graph, where Graph::replace_all_uses per merge made CSE quadratic in the node count.
  std::unordered_map<const Value*, Value*> replaced;
  auto resolve = [&](Value* v) {
    auto it = replaced.find(v);
    return it == replaced.end() ? v : it->second;
  };
  std::map<std::string, Value*> constants;
  for (Value* c : g.constants()) {
    if (c->constant->nbytes() > (1 << 20)) continue;  // weights are never duplicated in practice
    auto [it, fresh] = constants.emplace(constant_key(*c->constant), c);
    if (!fresh && !c->is_input) {
      replaced[c] = it->second;
      ++merged_constants;
    }
  }
  std::map<std::string, Node*> seen;
  std::unordered_set<const Node*> dead;
  for (const auto& np : g.nodes()) {
    Node& n = *np;
    for (Value*& v : n.inputs)
      if (v) v = resolve(v);
    if (!n.op->deterministic) continue;
    std::string key = n.op->name + "(";
    for (const Value* v : n.inputs) key += (v ? std::to_string(v->id) : "_") + ",";
    key += ")" + std::to_string(n.outputs.size()) + "{";
    for (const auto& [name, a] : n.attrs) key += name + "=" + attr_key(a) + ";";
    auto [it, fresh] = seen.emplace(key, &n);
    if (fresh) continue;
    Node& first = *it->second;
    bool same_outputs = true;
    for (size_t i = 0; i < n.outputs.size(); ++i)
      if (n.outputs[i] && !first.outputs[i]) same_outputs = false;  // the earlier node omitted it
    if (!same_outputs) continue;
    for (size_t i = 0; i < n.outputs.size(); ++i)
      if (n.outputs[i]) replaced[n.outputs[i]] = first.outputs[i];
    dead.insert(&n);
    ++merged_nodes;
  }
  for (Value*& v : g.outputs) v = resolve(v);
  g.erase_nodes_if([&](const Node& n) { return dead.count(&n) > 0; });
  g.compact();
  return fmt::format("merged {} nodes and {} constants", merged_nodes, merged_constants);
}

}  // namespace tessel
