// Graph construction and attribute access.
#include "tessel/ir/graph.h"

#include <algorithm>

#include "tessel/ir/op_registry.h"
#include "tessel/support/error.h"

namespace tessel {

const std::string& Node::op_name() const { return op->name; }

namespace {
template <typename T>
const T& get_attr(const Node& n, const std::string& name, std::string_view kind) {
  auto it = n.attrs.find(name);
  if (it == n.attrs.end()) fail("missing required attribute '{}'", name);
  const T* v = std::get_if<T>(&it->second);
  if (!v) fail("attribute '{}' must be {}", name, kind);
  return *v;
}
template <typename T>
T get_attr_or(const Node& n, const std::string& name, const T& dflt, std::string_view kind) {
  return n.has_attr(name) ? get_attr<T>(n, name, kind) : dflt;
}
}  // namespace

int64_t Node::attr_i(const std::string& n) const { return get_attr<int64_t>(*this, n, "an int"); }
int64_t Node::attr_i(const std::string& n, int64_t d) const { return get_attr_or<int64_t>(*this, n, d, "an int"); }
double Node::attr_f(const std::string& n) const { return get_attr<double>(*this, n, "a float"); }
double Node::attr_f(const std::string& n, double d) const { return get_attr_or<double>(*this, n, d, "a float"); }
std::string Node::attr_s(const std::string& n) const { return get_attr<std::string>(*this, n, "a string"); }
std::string Node::attr_s(const std::string& n, const std::string& d) const {
  return get_attr_or<std::string>(*this, n, d, "a string");
}
namespace {
[[noreturn]] void symbolic_attr(const Node& n, const std::string& name) {
  fail("attribute '{}' holds symbolic sizes {} where static ones are needed", name, dims_str(std::get<Dims>(n.attrs.at(name))));
}
}  // namespace

Attr dims_attr(const Dims& d) {
  if (dims_static(d)) return std::vector<int64_t>(d.begin(), d.end());
  return d;
}

std::vector<int64_t> Node::attr_ints(const std::string& n) const {
  auto it = attrs.find(n);
  if (it != attrs.end() && std::holds_alternative<Dims>(it->second)) symbolic_attr(*this, n);
  return get_attr<std::vector<int64_t>>(*this, n, "a list of ints");
}
std::vector<int64_t> Node::attr_ints(const std::string& n, const std::vector<int64_t>& d) const {
  auto it = attrs.find(n);
  if (it != attrs.end() && std::holds_alternative<Dims>(it->second)) symbolic_attr(*this, n);
  return get_attr_or<std::vector<int64_t>>(*this, n, d, "a list of ints");
}
Dims Node::attr_dims(const std::string& n) const {
  auto it = attrs.find(n);
  if (it != attrs.end() && std::holds_alternative<Dims>(it->second)) return std::get<Dims>(it->second);
  return dims_of(get_attr<std::vector<int64_t>>(*this, n, "a list of ints"));
}
Dims Node::attr_dims(const std::string& n, const Dims& d) const { return has_attr(n) ? attr_dims(n) : d; }
bool Node::has_symbolic_attr() const {
  for (const auto& [k, a] : attrs)
    if (std::holds_alternative<Dims>(a)) return true;
  return false;
}
std::vector<double> Node::attr_floats(const std::string& n) const {
  return get_attr<std::vector<double>>(*this, n, "a list of floats");
}
std::vector<double> Node::attr_floats(const std::string& n, const std::vector<double>& d) const {
  return get_attr_or<std::vector<double>>(*this, n, d, "a list of floats");
}
std::vector<std::string> Node::attr_strings(const std::string& n) const {
  return get_attr<std::vector<std::string>>(*this, n, "a list of strings");
}
const Tensor& Node::attr_t(const std::string& n) const { return get_attr<Tensor>(*this, n, "a tensor"); }

Value* Graph::add_value(std::string name, TensorType type) {
  auto v = std::make_unique<Value>();
  Value* p = v.get();
  // One lookup when the name is free (the common case): the entry is made, then its key is the name.
  const bool fresh = !name.empty() && by_name_.try_emplace(name, p).second;
  if (!fresh) {
    name = unique_name(name.empty() ? "v" : name);
    by_name_.emplace(name, p);
  }
  v->id = static_cast<int>(values_.size());
  v->name = std::move(name);
  v->type = std::move(type);
  values_.push_back(std::move(v));
  return p;
}

Value* Graph::add_input(std::string name, TensorType type) {
  Value* v = add_value(std::move(name), std::move(type));
  v->is_input = true;
  inputs.push_back(v);
  return v;
}

Value* Graph::add_constant(std::string name, Tensor t) {
  Value* v = add_value(std::move(name), TensorType{t.dtype(), t.shape()});
  v->constant = std::move(t);
  return v;
}

Node* Graph::add_node(const OpDef* op, std::string node_name, std::vector<Value*> ins,
                      const std::vector<std::string>& output_names, std::map<std::string, Attr> attrs) {
  auto n = std::make_unique<Node>();
  n->op = op;
  n->name = std::move(node_name);
  n->inputs = std::move(ins);
  n->attrs = std::move(attrs);
  for (size_t i = 0; i < output_names.size(); ++i) {
    if (output_names[i].empty()) {
      n->outputs.push_back(nullptr);  // omitted optional output
      continue;
    }
    Value* v = add_value(output_names[i], TensorType{});
    v->producer = n.get();
    v->producer_output = static_cast<int>(i);
    n->outputs.push_back(v);
  }
  Node* p = n.get();
  nodes_.push_back(std::move(n));
  return p;
}

Node* Graph::add_copy(const Node& n, std::vector<Value*> inputs, std::map<const Value*, Value*>& map,
                      const std::map<std::string, Attr>* attrs) {
  std::vector<std::string> names;
  for (const Value* v : n.outputs) names.push_back(v ? v->name : std::string());
  Node* c = add_node(n.op, n.name, std::move(inputs), names, attrs ? *attrs : n.attrs);
  for (size_t i = 0; i < n.outputs.size(); ++i)
    if (n.outputs[i]) {
      c->outputs[i]->type = n.outputs[i]->type;
      map[n.outputs[i]] = c->outputs[i];
    }
  return c;
}

std::unique_ptr<Graph> Graph::clone() const {
  auto c = std::make_unique<Graph>();
  c->name = name;
  c->symbols = symbols;
  std::map<const Value*, Value*> map;
  for (const auto& v : values_) {
    Value* nv = c->add_value(v->name, v->type);
    nv->constant = v->constant;
    nv->is_input = v->is_input;
    map[v.get()] = nv;
  }
  auto mapped = [&](Value* v) { return v ? map.at(v) : nullptr; };
  for (const auto& n : nodes_) {
    auto nn = std::make_unique<Node>();
    nn->op = n->op;
    nn->name = n->name;
    nn->attrs = n->attrs;
    for (Value* v : n->inputs) nn->inputs.push_back(mapped(v));
    for (size_t i = 0; i < n->outputs.size(); ++i) {
      Value* v = mapped(n->outputs[i]);
      nn->outputs.push_back(v);
      if (v) {
        v->producer = nn.get();
        v->producer_output = static_cast<int>(i);
      }
    }
    c->nodes_.push_back(std::move(nn));
  }
  for (Value* v : inputs) c->inputs.push_back(mapped(v));
  for (Value* v : outputs) c->outputs.push_back(mapped(v));
  return c;
}

Value* Graph::find_value(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::string Graph::unique_name(const std::string& base) const {
  if (!by_name_.count(base)) return base;
  // Probing resumes where the last call for this base stopped: every base_j below it was taken, and names
  // only leave the graph through rename_value and compact, which forget the hints (issue 41: probing from
  // 1 made importing a Scan of 8192 steps quadratic). The answer is the one probing from 1 gives.
  int& next = name_hints_[base];
  for (int i = std::max(next, 1);; ++i) {
    std::string c = base + "_" + std::to_string(i);
    if (!by_name_.count(c)) {
      next = i;
      return c;
    }
  }
}

std::vector<Value*> Graph::constants() const {
  std::vector<Value*> out;
  for (const auto& v : values_)
    if (v->constant) out.push_back(v.get());
  return out;
}

bool Graph::rename_value(Value* v, const std::string& name) {
  auto it = by_name_.find(name);
  if (it != by_name_.end()) return it->second == v;
  by_name_.erase(v->name);
  name_hints_.clear();
  v->name = name;
  by_name_[name] = v;
  return true;
}

void Graph::hand_name_over(Value* from, Value* to) {
  if (from == to) return;
  std::string name = from->name;
  by_name_.erase(name);
  by_name_.erase(to->name);
  name_hints_.clear();
  from->name.clear();
  to->name = name;
  by_name_[name] = to;
  from->name = unique_name(name + ".replaced");
  by_name_[from->name] = from;
}

std::string Graph::check_name_index() const {
  for (const auto& v : values_) {
    auto it = by_name_.find(v->name);
    if (it == by_name_.end()) return fmt::format("value '{}' is not in the name index", v->name);
    if (it->second != v.get()) return fmt::format("the name index gives another value for '{}'", v->name);
  }
  if (by_name_.size() != values_.size())
    return fmt::format("the name index holds {} names for {} values", by_name_.size(), values_.size());
  return "";
}

void Graph::replace_all_uses(Value* from, Value* to) {
  for (auto& n : nodes_)
    for (auto& v : n->inputs)
      if (v == from) v = to;
  for (auto& v : outputs)
    if (v == from) v = to;
}

std::vector<int> Graph::use_counts() const {
  std::vector<int> uses(values_.size(), 0);
  for (const auto& n : nodes_)
    for (const Value* v : n->inputs)
      if (v) uses[v->id]++;
  for (const Value* v : outputs) uses[v->id]++;
  return uses;
}

std::vector<std::vector<const Node*>> Graph::users() const {
  size_t nv = 0;
  for (const auto& v : values_) nv = std::max(nv, static_cast<size_t>(v->id) + 1);
  std::vector<std::vector<const Node*>> u(nv);
  for (const auto& n : nodes_)
    for (const Value* v : n->inputs)
      if (v) u[static_cast<size_t>(v->id)].push_back(n.get());
  return u;
}

bool Graph::returns(const Value* v) const { return std::find(outputs.begin(), outputs.end(), v) != outputs.end(); }

void Graph::erase_nodes_if(const std::function<bool(const Node&)>& dead) {
  std::erase_if(nodes_, [&](const std::unique_ptr<Node>& n) {
    if (!dead(*n)) return false;
    for (Value* v : n->outputs)
      if (v) v->producer = nullptr;  // now undefined; compact() drops it
    return true;
  });
}

void Graph::compact() {
  std::vector<int> uses = use_counts();
  std::vector<std::unique_ptr<Value>> kept;
  kept.reserve(values_.size());
  name_hints_.clear();
  // The name index is kept true by every naming path (add_value, rename_value, hand_name_over), so
  // compacting only forgets the dropped values (rebuilding it, a hash insert per value with its string
  // copy, was a third of the core pipeline on a long chain of issue 41).
  for (auto& v : values_) {
    // A value still used but no longer defined is kept, so the verifier reports it (not a crash).
    bool keep = v->is_input || v->producer != nullptr || uses[v->id] > 0;
    if (!keep) {
      auto it = by_name_.find(v->name);
      if (it != by_name_.end() && it->second == v.get()) by_name_.erase(it);
      continue;
    }
    v->id = static_cast<int>(kept.size());
    kept.push_back(std::move(v));
  }
  values_ = std::move(kept);
}

}  // namespace tessel
