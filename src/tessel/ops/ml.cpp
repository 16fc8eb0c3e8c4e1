// Op family: classic machine-learning ops of the ai.onnx.ml domain (TreeEnsemble).
#include <cfloat>
#include <cmath>

#include "tessel/ir/op_registry.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

// ---- TreeEnsemble (ai.onnx.ml 5) -----------------------------------------------------------------
//
// Every row of X walks each tree from its root to a leaf; the leaf adds its weight to its target
// (or takes the min / max), then an optional post-transform runs per row. Data-dependent control
// flow with no tensor form: the op has no decomposition and runs as a graph break through this
// kernel on the graph and compiled backends.

enum class Branch { leq = 0, lt = 1, gte = 2, gt = 3, eq = 4, neq = 5, member = 6 };

// The ensemble's node and leaf tables, read from the attributes and checked once.
struct Forest {
  std::vector<int64_t> roots, feature, true_id, false_id, true_leaf, false_leaf, tracks_true, leaf_target;
  std::vector<Branch> mode;
  std::vector<double> split, leaf_weight;
  std::vector<std::vector<double>> member_sets;  // per node; empty unless the mode is member
  int64_t targets = 0;
  int aggregate = 1;  // 0 average, 1 sum, 2 min, 3 max
  int post = 0;       // 0 none, 1 softmax, 2 logistic, 3 softmax_zero
};

template <class T>
void same_length(const std::vector<T>& v, size_t n, const char* what) {
  if (v.size() != n) fail("TreeEnsemble attribute {} has {} entries; nodes_featureids has {}", what, v.size(), n);
}

Forest read_forest(const Node& n) {
  Forest f;
  f.roots = n.attr_ints("tree_roots");
  f.feature = n.attr_ints("nodes_featureids");
  f.true_id = n.attr_ints("nodes_truenodeids");
  f.false_id = n.attr_ints("nodes_falsenodeids");
  f.true_leaf = n.attr_ints("nodes_trueleafs");
  f.false_leaf = n.attr_ints("nodes_falseleafs");
  f.leaf_target = n.attr_ints("leaf_targetids");
  f.split = n.attr_t("nodes_splits").to_f64();
  f.leaf_weight = n.attr_t("leaf_weights").to_f64();
  const Tensor modes = n.attr_t("nodes_modes");
  f.targets = n.attr_i("n_targets", 1);
  f.aggregate = static_cast<int>(n.attr_i("aggregate_function", 1));
  f.post = static_cast<int>(n.attr_i("post_transform", 0));
  const size_t nodes = f.feature.size();
  f.tracks_true = n.attr_ints("nodes_missing_value_tracks_true", std::vector<int64_t>(nodes, 0));
  same_length(f.true_id, nodes, "nodes_truenodeids");
  same_length(f.false_id, nodes, "nodes_falsenodeids");
  same_length(f.true_leaf, nodes, "nodes_trueleafs");
  same_length(f.false_leaf, nodes, "nodes_falseleafs");
  same_length(f.split, nodes, "nodes_splits");
  same_length(f.tracks_true, nodes, "nodes_missing_value_tracks_true");
  if (modes.numel() != static_cast<int64_t>(nodes)) fail("TreeEnsemble nodes_modes has {} entries; expected {}", modes.numel(), nodes);
  if (f.leaf_weight.size() != f.leaf_target.size())
    fail("TreeEnsemble has {} leaf weights but {} leaf targets", f.leaf_weight.size(), f.leaf_target.size());
  if (f.targets < 1) fail("TreeEnsemble n_targets must be positive, is {}", f.targets);
  if (f.aggregate < 0 || f.aggregate > 3) fail("TreeEnsemble aggregate_function {} is not 0..3", f.aggregate);
  if (f.post == 4) unsupported("TreeEnsemble post_transform PROBIT");
  if (f.post < 0 || f.post > 4) fail("TreeEnsemble post_transform {} is not 0..4", f.post);
  // membership_values lists one set per member node, in node order, each ended by a NaN.
  std::vector<double> members = n.has_attr("membership_values") ? n.attr_t("membership_values").to_f64() : std::vector<double>{};
  size_t pos = 0;
  f.member_sets.resize(nodes);
  for (size_t i = 0; i < nodes; ++i) {
    const int64_t m = modes.get_i(static_cast<int64_t>(i));
    if (m < 0 || m > 6) fail("TreeEnsemble node {} has mode {}; modes are 0..6", i, m);
    f.mode.push_back(static_cast<Branch>(m));
    if (f.mode.back() != Branch::member) continue;
    if (pos >= members.size()) fail("TreeEnsemble membership_values has no set for member node {}", i);
    while (pos < members.size() && !std::isnan(members[pos])) f.member_sets[i].push_back(members[pos++]);
    ++pos;  // the NaN separator (or the end)
  }
  auto check_child = [&](int64_t id, int64_t leaf, size_t i) {
    const size_t limit = leaf ? f.leaf_weight.size() : nodes;
    if (id < 0 || static_cast<size_t>(id) >= limit)
      fail("TreeEnsemble node {} points at {} {}, out of range", i, leaf ? "leaf" : "node", id);
  };
  for (size_t i = 0; i < nodes; ++i) {
    check_child(f.true_id[i], f.true_leaf[i], i);
    check_child(f.false_id[i], f.false_leaf[i], i);
  }
  for (int64_t r : f.roots)
    if (r < 0 || static_cast<size_t>(r) >= nodes) fail("TreeEnsemble tree root {} is out of range", r);
  for (int64_t t : f.leaf_target)
    if (t < 0 || t >= f.targets) fail("TreeEnsemble leaf target {} is not below n_targets {}", t, f.targets);
  return f;
}

bool branch_true(const Forest& f, size_t i, double x) {
  if (std::isnan(x) && f.tracks_true[i]) return true;
  const double s = f.split[i];
  switch (f.mode[i]) {
    case Branch::leq: return x <= s;
    case Branch::lt: return x < s;
    case Branch::gte: return x >= s;
    case Branch::gt: return x > s;
    case Branch::eq: return x == s;
    case Branch::neq: return x != s;
    case Branch::member:
      for (double m : f.member_sets[i])
        if (x == m) return true;
      return false;
  }
  return false;
}

// The leaf a row reaches from `root`; a path longer than the node count is a cycle.
size_t reach_leaf(const Forest& f, int64_t root, const double* row, int64_t features) {
  size_t node = static_cast<size_t>(root);
  for (size_t steps = 0; steps <= f.feature.size(); ++steps) {
    const int64_t feat = f.feature[node];
    if (feat < 0 || feat >= features) fail("TreeEnsemble node {} reads feature {} of {}", node, feat, features);
    const bool t = branch_true(f, node, row[feat]);
    const int64_t next = t ? f.true_id[node] : f.false_id[node];
    if (t ? f.true_leaf[node] : f.false_leaf[node]) return static_cast<size_t>(next);
    node = static_cast<size_t>(next);
  }
  fail("TreeEnsemble tree from root {} has a cycle", root);
}

void post_transform(const Forest& f, double* y) {
  const int64_t n = f.targets;
  if (f.post == 2) {
    for (int64_t j = 0; j < n; ++j) y[j] = 1.0 / (1.0 + std::exp(-y[j]));
    return;
  }
  if (f.post != 1 && f.post != 3) return;
  // Softmax over the row; SOFTMAX_ZERO leaves zeros at zero and normalises the rest.
  const bool skip_zero = f.post == 3;
  double mx = -INFINITY, sum = 0;
  for (int64_t j = 0; j < n; ++j)
    if (!(skip_zero && y[j] == 0)) mx = std::max(mx, y[j]);
  for (int64_t j = 0; j < n; ++j) {
    if (skip_zero && y[j] == 0) continue;
    y[j] = std::exp(y[j] - mx);
    sum += y[j];
  }
  for (int64_t j = 0; j < n; ++j)
    if (!(skip_zero && y[j] == 0)) y[j] /= sum;
}

void tree_ensemble_kernel(KernelCtx& c) {
  const Forest f = read_forest(c.node());
  const Tensor& x = c.in(0);
  if (x.rank() != 2) fail("TreeEnsemble X must be 2-D, is {}", shape_str(x.shape()));
  const int64_t rows = x.dim(0), features = x.dim(1);
  const std::vector<double> xv = x.to_f64();
  const double big = x.dtype() == DType::f64 ? DBL_MAX : x.dtype() == DType::f16 ? 65504.0 : FLT_MAX;
  const double start = f.aggregate == 2 ? big : f.aggregate == 3 ? -big : 0.0;
  std::vector<double> y(static_cast<size_t>(rows * f.targets), start);
  for (int64_t r = 0; r < rows; ++r) {
    double* yr = y.data() + r * f.targets;
    for (int64_t root : f.roots) {
      const size_t leaf = reach_leaf(f, root, xv.data() + r * features, features);
      double& slot = yr[f.leaf_target[leaf]];
      const double w = f.leaf_weight[leaf];
      slot = f.aggregate == 2 ? std::min(slot, w) : f.aggregate == 3 ? std::max(slot, w) : slot + w;
    }
    if (f.aggregate == 0 && !f.roots.empty())
      for (int64_t j = 0; j < f.targets; ++j) yr[j] /= static_cast<double>(f.roots.size());
    post_transform(f, yr);
  }
  c.set_out(0, Tensor::from_f64(x.dtype(), {rows, f.targets}, y));
}

void tree_ensemble_infer(InferCtx& c) {
  const TensorType& x = c.in(0);
  if (x.dtype != DType::f32 && x.dtype != DType::f64 && x.dtype != DType::f16)
    fail("TreeEnsemble X must be f16, f32 or f64, is {}", x.str());
  if (x.shape.size() != 2) fail("TreeEnsemble X must be 2-D, is {}", x.str());
  const Forest f = read_forest(c.node());
  c.set_out(0, {x.dtype, {x.shape[0], f.targets}});
}

OpDef tree_ensemble_def() {
  using A = AttrSpec;
  const auto I = AttrKind::i, IS = AttrKind::ints, T = AttrKind::tensor;
  OpDef d = make_op("TreeEnsemble", 5, 1, 1,
                    {A{"aggregate_function", I}, A{"leaf_targetids", IS, true}, A{"leaf_weights", T, true},
                     A{"membership_values", T}, A{"n_targets", I}, A{"nodes_falseleafs", IS, true},
                     A{"nodes_falsenodeids", IS, true}, A{"nodes_featureids", IS, true}, A{"nodes_hitrates", T},
                     A{"nodes_missing_value_tracks_true", IS}, A{"nodes_modes", T, true}, A{"nodes_splits", T, true},
                     A{"nodes_trueleafs", IS, true}, A{"nodes_truenodeids", IS, true}, A{"post_transform", I},
                     A{"tree_roots", IS, true}},
                    tree_ensemble_infer, tree_ensemble_kernel);
  d.domain = "ai.onnx.ml";
  return d;
}

}  // namespace

void register_ml_ops(OpRegistry& r) { r.add(tree_ensemble_def()); }

}  // namespace tessel
