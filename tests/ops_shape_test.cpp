// Shape-family ops (reshape, slicing, padding, resize, ...) checked against hand-computed values.
#include <gtest/gtest.h>

#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"

using namespace tessel;

namespace {

Tensor f32(Shape s, std::vector<double> v) {
  return Tensor::from_f64(DType::f32, std::move(s), v);
}
Tensor i64(Shape s, std::vector<int64_t> v) {
  return Tensor::from_i64(DType::i64, std::move(s), v);
}
Tensor i64v(std::vector<int64_t> v) {
  return i64({static_cast<int64_t>(v.size())}, v);
}

// Runs one op whose first input is a graph input `x` and the rest are constants.
Tensor run1(const std::string& op, const Tensor& x, std::vector<std::optional<Tensor>> consts = {},
            std::map<std::string, Attr> attrs = {}, Shape* inferred = nullptr) {
  Graph g;
  std::vector<Value*> ins{g.add_input("x", TensorType{x.dtype(), x.shape()})};
  int k = 0;
  for (auto& c : consts) ins.push_back(c ? g.add_constant("c" + std::to_string(k++), *c) : nullptr);
  Node* n = g.add_node(OpRegistry::get().find(op), "n", ins, {"y"}, std::move(attrs));
  g.outputs.push_back(n->outputs[0]);
  infer_graph(g);
  if (inferred) *inferred = n->outputs[0]->type.shape;
  return run_eager(g, {x})[0];
}

std::vector<double> vals(const Tensor& t) {
  return t.to_f64();
}

}  // namespace

TEST(ShapeOps, ReshapeZeroAndMinusOne) {
  Tensor x(DType::f32, {2, 3, 4});
  Shape s;
  Tensor y = run1("Reshape", x, {i64v({0, -1})}, {}, &s);
  EXPECT_EQ(y.shape(), (Shape{2, 12}));
  EXPECT_EQ(s, (Shape{2, 12}));
  EXPECT_THROW(run1("Reshape", x, {i64v({5, -1})}), Error);
  Tensor z(DType::f32, {0, 3});
  EXPECT_EQ(run1("Reshape", z, {i64v({3, 0})}, {{"allowzero", int64_t{1}}}).shape(), (Shape{3, 0}));
}

TEST(ShapeOps, TransposeMovesBytes) {
  Tensor x = Tensor::from_i64(DType::i8, {2, 3}, std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  Tensor y = run1("Transpose", x);
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  EXPECT_EQ(y.to_i64(), (std::vector<int64_t>{1, 4, 2, 5, 3, 6}));
}

TEST(ShapeOps, SliceNegativeStepAndClamp) {
  Tensor x = f32({5}, {0, 1, 2, 3, 4});
  // starts=-1 (4), ends=INT64_MIN (clamped to -1): the whole axis reversed, every other element.
  Tensor y = run1("Slice", x, {i64v({-1}), i64v({INT64_MIN}), i64v({0}), i64v({-2})});
  EXPECT_EQ(vals(y), (std::vector<double>{4, 2, 0}));
  Tensor z = run1("Slice", x, {i64v({1}), i64v({1000})});
  EXPECT_EQ(vals(z), (std::vector<double>{1, 2, 3, 4}));
}

TEST(ShapeOps, PadModes) {
  Tensor x = f32({3}, {1, 2, 3});
  auto pad = [&](const char* mode) {
    return vals(run1("Pad", x, {i64v({2, 2})}, {{"mode", std::string(mode)}}));
  };
  EXPECT_EQ(pad("constant"), (std::vector<double>{0, 0, 1, 2, 3, 0, 0}));
  EXPECT_EQ(pad("edge"), (std::vector<double>{1, 1, 1, 2, 3, 3, 3}));
  EXPECT_EQ(pad("reflect"), (std::vector<double>{3, 2, 1, 2, 3, 2, 1}));
  EXPECT_EQ(pad("wrap"), (std::vector<double>{2, 3, 1, 2, 3, 1, 2}));
  EXPECT_EQ(vals(run1("Pad", x, {i64v({-1, 1}), f32({}, {9})})), (std::vector<double>{2, 3, 9}));
}

TEST(ShapeOps, ShapeIsFoldedStatically) {
  Graph g;
  Value* x = g.add_input("x", TensorType{DType::f32, {2, 5, 7}});
  Node* n = g.add_node(OpRegistry::get().find("Shape"), "s", {x}, {"y"}, {{"start", int64_t{1}}});
  g.outputs.push_back(n->outputs[0]);
  InferResult r = infer_graph(g);
  ASSERT_TRUE(r.folded.count(n->outputs[0]));
  EXPECT_EQ(r.folded[n->outputs[0]].to_i64(), (std::vector<int64_t>{5, 7}));
}

TEST(ShapeOps, SplitNumOutputsUneven) {
  Graph g;
  Value* x = g.add_input("x", TensorType{DType::f32, {5}});
  Node* n = g.add_node(OpRegistry::get().find("Split"), "s", {x}, {"a", "b"},
                       {{"num_outputs", int64_t{2}}});
  g.outputs = {n->outputs[0], n->outputs[1]};
  infer_graph(g);
  auto out = run_eager(g, {f32({5}, {1, 2, 3, 4, 5})});
  EXPECT_EQ(vals(out[0]), (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(vals(out[1]), (std::vector<double>{4, 5}));
}

TEST(ShapeOps, RangeAndTrilu) {
  Graph g;
  Value* a = g.add_constant("a", Tensor::scalar_i(DType::i32, 10));
  Value* b = g.add_constant("b", Tensor::scalar_i(DType::i32, 4));
  Value* d = g.add_constant("d", Tensor::scalar_i(DType::i32, -3));
  Value* dummy = g.add_input("x", TensorType{DType::f32, {1}});
  (void)dummy;
  Node* n = g.add_node(OpRegistry::get().find("Range"), "r", {a, b, d}, {"y"});
  g.outputs.push_back(n->outputs[0]);
  infer_graph(g);
  EXPECT_EQ(n->outputs[0]->type.shape, (Shape{2}));
  EXPECT_EQ(run_eager(g, {Tensor(DType::f32, {1})})[0].to_i64(), (std::vector<int64_t>{10, 7}));

  Tensor m = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(vals(run1("Trilu", m, {}, {{"upper", int64_t{0}}})),
            (std::vector<double>{1, 0, 0, 4, 5, 0}));
  EXPECT_EQ(vals(run1("Trilu", m, {i64({}, {1})})), (std::vector<double>{0, 2, 3, 0, 0, 6}));
}

TEST(ShapeOps, DepthToSpaceDcrAndCrd) {
  // C=4, H=W=1, blocksize 2: DCR puts channel (i*2+j) at (i, j); CRD does the same for 1 output
  // channel.
  Tensor x = f32({1, 4, 1, 1}, {1, 2, 3, 4});
  EXPECT_EQ(vals(run1("DepthToSpace", x, {}, {{"blocksize", int64_t{2}}})),
            (std::vector<double>{1, 2, 3, 4}));
  Tensor x2 = f32({1, 8, 1, 1}, {0, 1, 2, 3, 4, 5, 6, 7});
  // DCR: out[c, i, j] = in[(i*2+j)*2 + c] -> c=0: 0,2,4,6; c=1: 1,3,5,7.
  EXPECT_EQ(vals(run1("DepthToSpace", x2, {}, {{"blocksize", int64_t{2}}})),
            (std::vector<double>{0, 2, 4, 6, 1, 3, 5, 7}));
  EXPECT_EQ(
      vals(run1("DepthToSpace", x2, {}, {{"blocksize", int64_t{2}}, {"mode", std::string("CRD")}})),
      (std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(ShapeOps, ResizeLinearAndNearest) {
  Tensor x = f32({1, 2}, {0, 10});
  // Upsample x2 with half_pixel: output coords map to -0.25, 0.25, 0.75, 1.25 -> 0, 2.5, 7.5, 10.
  Tensor y = run1("Resize", x, {std::nullopt, f32({2}, {1, 2})}, {{"mode", std::string("linear")}});
  EXPECT_EQ(vals(y), (std::vector<double>{0, 2.5, 7.5, 10}));
  // Nearest asymmetric floor via Upsample.
  Tensor z = run1("Upsample", x, {f32({2}, {1, 2})});
  EXPECT_EQ(vals(z), (std::vector<double>{0, 0, 10, 10}));
}

TEST(ShapeOps, ConcatAndTile) {
  Graph g;
  Value* a = g.add_input("a", TensorType{DType::f32, {1, 2}});
  Value* b = g.add_input("b", TensorType{DType::f32, {1, 1}});
  Node* n =
      g.add_node(OpRegistry::get().find("Concat"), "c", {a, b}, {"y"}, {{"axis", int64_t{-1}}});
  g.outputs.push_back(n->outputs[0]);
  infer_graph(g);
  EXPECT_EQ(vals(run_eager(g, {f32({1, 2}, {1, 2}), f32({1, 1}, {3})})[0]),
            (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(vals(run1("Tile", f32({2}, {1, 2}), {i64v({2})})), (std::vector<double>{1, 2, 1, 2}));
}

TEST(ShapeOps, LegacyAttrFormsUpgrade) {
  // Slice-9 keeps starts/ends/axes as attributes; upgrade() moves them into inputs.
  Graph g;
  Value* x = g.add_input("x", TensorType{DType::f32, {2, 4}});
  const OpDef* slice = OpRegistry::get().find("Slice");
  Node* n = g.add_node(slice, "s", {x}, {"y"},
                       {{"starts", std::vector<int64_t>{1}},
                        {"ends", std::vector<int64_t>{-1}},
                        {"axes", std::vector<int64_t>{1}}});
  slice->upgrade(g, *n, 9);
  EXPECT_FALSE(n->has_attr("starts"));
  ASSERT_EQ(n->inputs.size(), 4u);
  // Pad-10: pads and value attributes.
  const OpDef* pad = OpRegistry::get().find("Pad");
  Node* p = g.add_node(pad, "p", {n->outputs[0]}, {"z"},
                       {{"pads", std::vector<int64_t>{0, 1, 0, 0}}, {"value", 7.0}});
  pad->upgrade(g, *p, 10);
  g.outputs.push_back(p->outputs[0]);
  infer_graph(g);
  EXPECT_EQ(p->outputs[0]->type.shape, (Shape{2, 3}));
  Tensor out = run_eager(g, {f32({2, 4}, {0, 1, 2, 3, 4, 5, 6, 7})})[0];
  EXPECT_EQ(vals(out), (std::vector<double>{7, 1, 2, 7, 5, 6}));
}

TEST(ShapeOps, SqueezeUnsqueeze) {
  Tensor x(DType::f32, {1, 3, 1});
  EXPECT_EQ(run1("Squeeze", x).shape(), (Shape{3}));
  EXPECT_EQ(run1("Squeeze", x, {i64v({-1})}).shape(), (Shape{1, 3}));
  EXPECT_EQ(run1("Unsqueeze", x, {i64v({0, 4})}).shape(), (Shape{1, 1, 3, 1, 1}));
  EXPECT_THROW(run1("Squeeze", x, {i64v({1})}), Error);
}
