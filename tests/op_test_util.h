// Helpers for the op-family tests: run one node eagerly, build small tensors, compare values.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"

namespace tessel::testenv {

// A graph holding one `op` node with outputs y0.. (all graph outputs). An invalid Tensor in `ins` is
// an omitted optional input; input i is a graph constant when constant[i] is set, otherwise a graph
// input whose value is appended to `feeds`.
inline Graph one_node_graph(const std::string& op, const std::vector<Tensor>& ins, const std::vector<bool>& constant,
                            int num_outs, std::map<std::string, Attr> attrs, std::vector<Tensor>& feeds) {
  const OpDef* def = OpRegistry::get().find(op);
  if (!def) fail("no op {}", op);
  Graph g;
  std::vector<Value*> vs;
  feeds.clear();
  for (size_t i = 0; i < ins.size(); ++i) {
    const std::string name = "x" + std::to_string(i);
    if (!ins[i].valid()) {
      vs.push_back(nullptr);
    } else if (i < constant.size() && constant[i]) {
      vs.push_back(g.add_constant(name, ins[i]));
    } else {
      vs.push_back(g.add_input(name, TensorType{ins[i].dtype(), ins[i].shape()}));
      feeds.push_back(ins[i]);
    }
  }
  std::vector<std::string> outs;
  for (int i = 0; i < num_outs; ++i) outs.push_back("y" + std::to_string(i));
  Node* n = g.add_node(def, "n", vs, outs, std::move(attrs));
  for (Value* v : n->outputs) g.outputs.push_back(v);
  infer_graph(g);
  return g;
}

// One input of a node under test: a graph input (known only at run time) or, with constant set, a
// graph constant; an invalid Tensor is an omitted optional input.
struct NodeInput {
  Tensor t;
  bool constant = false;
};

inline Graph one_node_graph(const std::string& op, const std::vector<NodeInput>& ins, int num_outs,
                            std::map<std::string, Attr> attrs, std::vector<Tensor>& feeds) {
  std::vector<Tensor> ts;
  std::vector<bool> constant;
  for (const NodeInput& in : ins) ts.push_back(in.t), constant.push_back(in.constant);
  return one_node_graph(op, ts, constant, num_outs, std::move(attrs), feeds);
}

// Runs one `op` node whose inputs are graph inputs (an invalid Tensor is an omitted optional
// input) and returns its `num_outs` outputs.
inline std::vector<Tensor> run_op(const std::string& op, const std::vector<Tensor>& ins, int num_outs = 1,
                                  std::map<std::string, Attr> attrs = {}) {
  std::vector<Tensor> feeds;
  Graph g = one_node_graph(op, ins, {}, num_outs, std::move(attrs), feeds);
  return run_eager(g, feeds);
}

inline Tensor f32(Shape s, std::vector<double> v) { return Tensor::from_f64(DType::f32, std::move(s), v); }
inline Tensor i64(Shape s, std::vector<int64_t> v) { return Tensor::from_i64(DType::i64, std::move(s), v); }
inline Tensor ints(DType t, Shape s, std::vector<int64_t> v) { return Tensor::from_i64(t, std::move(s), v); }

inline void expect_near(const Tensor& t, const std::vector<double>& want, double tol = 1e-5) {
  std::vector<double> got = t.to_f64();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

// Same dtype and shape; ints and bool exact; floats within rtol (NaN matches NaN, inf matches inf).
inline void expect_same(const Tensor& got, const Tensor& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (!is_float(want.dtype())) {
      EXPECT_EQ(got.get_i(i), want.get_i(i)) << what << " element " << i;
      continue;
    }
    const double g = got.get_f(i), w = want.get_f(i);
    if (std::isnan(w) || std::isinf(w)) {
      EXPECT_TRUE(std::isnan(w) ? std::isnan(g) : g == w)
          << what << " element " << i << ": " << g << " vs " << w;
    } else {
      EXPECT_NEAR(g, w, 1e-7 + rtol * std::fabs(w)) << what << " element " << i;
    }
  }
}

}  // namespace tessel::testenv
