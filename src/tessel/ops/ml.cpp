// Op family: classic machine-learning and text-featurization ops (TreeEnsemble of ai.onnx.ml,
// TfIdfVectorizer over integer tokens).
#include <cfloat>
#include <cmath>
#include <map>

#include "tessel/ir/op_registry.h"
#include "tessel/support/error.h"
#include "tessel/support/limits.h"

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
  // n_targets comes from the model: the buffer is checked against the allocation limit first
  std::vector<double> y(static_cast<size_t>(checked_tensor_numel(DType::f64, {rows, f.targets}, "the TreeEnsemble result")), start);
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

// ---- TfIdfVectorizer (opset 9), integer tokens ----------------------------------------------------
//
// Counts, per row, the pool's n-grams in the input: n tokens taken `skip + 1` apart for every skip up
// to max_skip_count (unigrams once, whatever the skip), then scales the counts by mode. Output length
// max(ngram_indexes) + 1. The counts depend on token values, so the op has no tensor form (a graph
// break on the graph and compiled backends). String tokens need a string dtype tessel does not have.

struct NgramPool {
  std::map<std::vector<int64_t>, int64_t> index;  // n-gram -> output index
  int64_t min_n = 1, max_n = 1, max_skip = 0, out_size = 0;
  std::string mode;
  std::vector<double> weights;  // per output index; empty: all 1
};

NgramPool read_pool(const Node& n) {
  NgramPool p;
  p.min_n = n.attr_i("min_gram_length");
  p.max_n = n.attr_i("max_gram_length");
  p.max_skip = n.attr_i("max_skip_count");
  p.mode = n.attr_s("mode");
  if (p.mode != "TF" && p.mode != "IDF" && p.mode != "TFIDF") fail("TfIdfVectorizer mode must be TF, IDF or TFIDF, is '{}'", p.mode);
  if (p.min_n < 1 || p.max_n < p.min_n) fail("TfIdfVectorizer gram lengths {}..{} are not 1 <= min <= max", p.min_n, p.max_n);
  if (p.max_skip < 0) fail("TfIdfVectorizer max_skip_count must be >= 0, is {}", p.max_skip);
  if (n.has_attr("pool_strings")) unsupported("TfIdfVectorizer over strings (tessel has no string dtype)");
  const std::vector<int64_t> pool = n.attr_ints("pool_int64s", {});
  const std::vector<int64_t> counts = n.attr_ints("ngram_counts");
  const std::vector<int64_t> out_idx = n.attr_ints("ngram_indexes");
  size_t j = 0;  // the n-gram's position in the pool, all sizes in order
  for (size_t k = 0; k < counts.size(); ++k) {
    const int64_t size = static_cast<int64_t>(k) + 1;
    const int64_t begin = counts[k], end = k + 1 < counts.size() ? counts[k + 1] : static_cast<int64_t>(pool.size());
    if (begin < 0 || end < begin || end > static_cast<int64_t>(pool.size()) || (end - begin) % size != 0)
      fail("TfIdfVectorizer ngram_counts {} does not split the pool of {} into {}-grams", k, pool.size(), size);
    for (int64_t at = begin; at < end; at += size, ++j) {
      if (j >= out_idx.size()) fail("TfIdfVectorizer ngram_indexes has {} entries, fewer than the pool's n-grams", out_idx.size());
      if (out_idx[j] < 0) fail("TfIdfVectorizer ngram_indexes[{}] is negative", j);
      p.index[std::vector<int64_t>(pool.begin() + at, pool.begin() + at + size)] = out_idx[j];
      p.out_size = std::max(p.out_size, out_idx[j] + 1);
    }
  }
  if (j != out_idx.size()) fail("TfIdfVectorizer ngram_indexes has {} entries for {} pool n-grams", out_idx.size(), j);
  if (n.has_attr("weights")) {
    p.weights = n.attr_floats("weights");
    if (static_cast<int64_t>(p.weights.size()) < p.out_size)
      fail("TfIdfVectorizer has {} weights for {} outputs", p.weights.size(), p.out_size);
  }
  return p;
}

// Counts of one row of `len` tokens into y[0, out_size).
void count_ngrams(const NgramPool& p, const int64_t* x, int64_t len, double* y) {
  int64_t first_n = p.min_n;
  std::vector<int64_t> gram;
  for (int64_t skip = 1; skip <= p.max_skip + 1; ++skip) {
    for (int64_t start = 0; start + skip * (first_n - 1) < len; ++start) {
      gram.clear();
      for (int64_t k = 0; k < first_n - 1; ++k) gram.push_back(x[start + k * skip]);
      for (int64_t n = first_n; n <= p.max_n && start + skip * (n - 1) < len; ++n) {
        gram.push_back(x[start + skip * (n - 1)]);
        auto it = p.index.find(gram);
        if (it != p.index.end()) y[it->second] += 1;
      }
    }
    // Unigrams do not depend on the skip: count them on the first pass only.
    if (first_n == 1 && ++first_n > p.max_n) break;
  }
}

void tfidf_kernel(KernelCtx& c) {
  const NgramPool p = read_pool(c.node());
  const Tensor& x = c.in(0);
  if (x.rank() != 1 && x.rank() != 2) fail("TfIdfVectorizer X must be 1-D or 2-D, is {}", shape_str(x.shape()));
  const int64_t rows = x.rank() == 2 ? x.dim(0) : 1, len = x.dim(x.rank() - 1);
  std::vector<int64_t> tokens(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) tokens[i] = x.get_i(i);
  // out_size comes from the model's pool indices: checked against the allocation limit first
  std::vector<double> y(static_cast<size_t>(checked_tensor_numel(DType::f64, {rows, p.out_size}, "the TfIdfVectorizer result")), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double* yr = y.data() + r * p.out_size;
    count_ngrams(p, tokens.data() + r * len, len, yr);
    for (int64_t i = 0; i < p.out_size; ++i) {
      const double w = p.weights.empty() ? 1.0 : p.weights[i];
      if (p.mode == "IDF") yr[i] = yr[i] > 0 ? w : 0.0;
      else if (p.mode == "TFIDF") yr[i] *= w;
    }
  }
  Shape s = x.rank() == 2 ? Shape{rows, p.out_size} : Shape{p.out_size};
  c.set_out(0, Tensor::from_f64(DType::f32, s, y));
}

void tfidf_infer(InferCtx& c) {
  const TensorType& x = c.in(0);
  if (x.dtype != DType::i32 && x.dtype != DType::i64) fail("TfIdfVectorizer X must be int32 or int64, is {}", x.str());
  if (x.shape.size() != 1 && x.shape.size() != 2) fail("TfIdfVectorizer X must be 1-D or 2-D, is {}", x.str());
  const NgramPool p = read_pool(c.node());
  c.set_out(0, {DType::f32, x.shape.size() == 2 ? Shape{x.shape[0], p.out_size} : Shape{p.out_size}});
}

OpDef tfidf_def() {
  using A = AttrSpec;
  const auto I = AttrKind::i, IS = AttrKind::ints;
  return make_op("TfIdfVectorizer", 9, 1, 1,
                 {A{"max_gram_length", I, true}, A{"max_skip_count", I, true}, A{"min_gram_length", I, true},
                  A{"mode", AttrKind::s, true}, A{"ngram_counts", IS, true}, A{"ngram_indexes", IS, true},
                  A{"pool_int64s", IS}, A{"pool_strings", AttrKind::strings}, A{"weights", AttrKind::floats}},
                 tfidf_infer, tfidf_kernel);
}

}  // namespace

void register_ml_ops(OpRegistry& r) {
  r.add(tree_ensemble_def());
  r.add(tfidf_def());
}

}  // namespace tessel
