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

// Appends a byte string that is equal for equal attribute values (tensors by dtype, shape and bytes,
// symbolic sizes by their text).
void append_attr_key(const Attr& a, std::string& k) {
  k += static_cast<char>(a.index());
  auto add_size = [&](size_t n) { k.append(reinterpret_cast<const char*>(&n), sizeof n); };
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double>) {
          k.append(reinterpret_cast<const char*>(&v), sizeof v);
        } else if constexpr (std::is_same_v<T, std::string>) {
          add_size(v.size());
          k += v;
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          add_size(v.size());
          for (const auto& s : v) {
            add_size(s.size());
            k += s;
          }
        } else if constexpr (std::is_same_v<T, Tensor>) {
          const std::string type = TensorType{v.dtype(), v.shape()}.str();
          add_size(type.size());
          k += type;
          add_size(v.nbytes());
          k.append(reinterpret_cast<const char*>(v.bytes()), v.nbytes());
        } else if constexpr (std::is_same_v<T, Dims>) {
          const std::string text = dims_str(v);
          add_size(text.size());
          k += text;
        } else {
          add_size(v.size());
          k.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(v[0]));
        }
      },
      a);
}

// The node's identity for CSE, into `k` (reused: no allocation per node): op, operands by id, the
// number of outputs, attributes by name and value.
void node_key(const Node& n, std::string& k) {
  k.clear();
  k.append(reinterpret_cast<const char*>(&n.op), sizeof n.op);
  const size_t nin = n.inputs.size(), nout = n.outputs.size();
  k.append(reinterpret_cast<const char*>(&nin), sizeof nin);
  for (const Value* v : n.inputs) {
    const int id = v ? v->id : -1;
    k.append(reinterpret_cast<const char*>(&id), sizeof id);
  }
  k.append(reinterpret_cast<const char*>(&nout), sizeof nout);
  for (const auto& [name, a] : n.attrs) {
    const size_t len = name.size();
    k.append(reinterpret_cast<const char*>(&len), sizeof len);
    k += name;
    append_attr_key(a, k);
  }
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
  // Nodes by the hash of their key; a hit is confirmed by comparing the keys themselves (a string
  // key per node in a map was most of the pass on a long chain).
  std::unordered_map<size_t, std::vector<Node*>> seen;
  seen.reserve(g.nodes().size());
  std::unordered_set<const Node*> dead;
  std::string key, other;
  const std::hash<std::string_view> hash;
  for (const auto& np : g.nodes()) {
    Node& n = *np;
    for (Value*& v : n.inputs)
      if (v) v = resolve(v);
    if (!n.op->deterministic) continue;
    node_key(n, key);
    std::vector<Node*>& bucket = seen[hash(key)];
    Node* match = nullptr;
    for (Node* c : bucket) {
      node_key(*c, other);
      if (other == key) {
        match = c;
        break;
      }
    }
    if (!match) {
      bucket.push_back(&n);
      continue;
    }
    Node& first = *match;
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
