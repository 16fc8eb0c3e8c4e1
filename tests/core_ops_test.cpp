// The core-op table (src/tessel/ir/core_ops.def) against the registry, the reference kernels and the
// consumers: every row is a registered primitive, and every column a consumer reads is filled in or the
// row is named here as one the consumer does not handle. A new primitive fails here until it is decided.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <map>
#include <set>
#include <string>

#include "tessel/ir/core_ops.h"
#include "tessel/ir/op_registry.h"
#include "tessel/runtime/core_kernels.h"
#include "tessel/hw/hw.h"
#include "op_test_util.h"

using namespace tessel;
using namespace tessel::testenv;

namespace {

std::set<std::string> names_of(std::initializer_list<const char*> l) { return {l.begin(), l.end()}; }

// The primitives no fused loop contains: they run as library calls, reference kernels or
// dedicated kernels. The CPU generator and KTIR have no element-level spelling for them.
const std::set<std::string> kNotInLoops =
    names_of({"bitcast_convert", "reduce_window", "dot_general", "convolution", "broadcast_in_dim", "reshape", "transpose",
              "slice", "pad", "concatenate", "gather", "scatter", "iota", "sort"});

}  // namespace

TEST(CoreOps, EveryRowIsARegisteredPrimitiveAndBack) {
  std::set<std::string> rows;
  for (const CoreOpInfo& i : kCoreOps) {
    rows.insert(std::string(i.name));
    const OpDef* d = OpRegistry::get().find(std::string(i.name));
    ASSERT_NE(d, nullptr) << i.name;
    EXPECT_EQ(d->domain, "tessel.core") << i.name;
    if (i.arity < 0) {
      EXPECT_EQ(d->max_inputs, -1) << i.name;
      EXPECT_EQ(d->min_inputs, 1) << i.name;
    } else {
      EXPECT_EQ(d->min_inputs, i.arity) << i.name;
      EXPECT_EQ(d->max_inputs, i.arity) << i.name;
    }
    // The table's kind agrees with the fusion kind the registry gives the op.
    if (i.elementwise()) {
      EXPECT_EQ(d->fusion, FusionKind::pointwise) << i.name;
    }
    if (i.kind == CoreKind::reduce || i.kind == CoreKind::window) {
      EXPECT_EQ(d->fusion, FusionKind::reduction) << i.name;
    }
    if (i.kind == CoreKind::contraction) {
      EXPECT_EQ(d->fusion, FusionKind::matmul) << i.name;
    }
  }
  EXPECT_EQ(rows.size(), kNumCoreOps) << "a name is in the table twice";
  EXPECT_EQ(kNumCoreOps, 38u);
  for (const OpDef* d : OpRegistry::get().all())
    if (d->domain == "tessel.core") {
      EXPECT_TRUE(rows.count(d->name)) << d->name << " is registered but not in core_ops.def";
    }
}

TEST(CoreOps, NamesRoundTrip) {
  for (const CoreOpInfo& i : kCoreOps) {
    EXPECT_EQ(core_op_named(i.name), i.op) << i.name;
    EXPECT_EQ(&core_op_info(i.op), &i);
  }
  // Not primitives: the kernel instructions around them, graph-level names, and the names the old
  // dataflow cost table priced (docs/decisions.md, "One core-op table").
  for (const char* n : {"load", "store", "const", "Add", "sub", "abs", "not", "ceil", "round", "sign", "clamp", ""})
    EXPECT_FALSE(core_op_named(n).has_value()) << n;  // A node answers by its domain: the graph-level Add is no primitive.
  std::vector<Tensor> feeds;
  const Tensor x = f32({2}, {1, 2});
  EXPECT_EQ(core_op_of(*one_node_graph("add", {x, x}, {}, 1, {}, feeds).nodes().front()), CoreOp::add);
  EXPECT_FALSE(core_op_of(*one_node_graph("Add", {x, x}, {}, 1, {}, feeds).nodes().front()).has_value());
}

TEST(CoreOps, EveryRowHasACppSpellingOrIsNotGenerated) {
  for (const CoreOpInfo& i : kCoreOps) {
    const bool listed = kNotInLoops.count(std::string(i.name)) > 0;
    EXPECT_EQ(i.c_form == CForm::none, listed) << i.name << ": give it a C++ form or list it in kNotInLoops";
    EXPECT_EQ(i.loop == LoopTypes::none, listed) << i.name << ": the fuser generates it only where codegen can";
    if (listed) continue;
    if (i.c_form == CForm::bitwise) {
      EXPECT_FALSE(i.c_int.empty()) << i.name;
      EXPECT_FALSE(i.c_bool.empty()) << i.name;
    } else {
      EXPECT_FALSE(i.c.empty()) << i.name;
    }
    if (i.c_form == CForm::min_max) {
      EXPECT_TRUE(!i.c_int.empty() && !i.c_bool.empty()) << i.name;
    }
    // What the fuser lets through, codegen must spell for that dtype class.
    if (i.loop == LoopTypes::ints_bools) {
      EXPECT_EQ(i.c_form, CForm::bitwise) << i.name;
    }
  }
}

TEST(CoreOps, EveryRowHasAKtirSpellingOrIsUnsupported) {
  for (const CoreOpInfo& i : kCoreOps) {
    const bool none = i.ktir_f.empty() && i.ktir_i.empty() && i.ktir_b.empty();
    EXPECT_EQ(none, kNotInLoops.count(std::string(i.name)) > 0) << i.name << ": give it a KTIR spelling or list it";
    // Whatever dtypes the fuser puts in a loop, KTIR has a form for (or says it cannot, by dtype).
    if (i.loop == LoopTypes::floats || i.loop == LoopTypes::numeric || i.loop == LoopTypes::all) {
      EXPECT_FALSE(i.ktir_f.empty()) << i.name;
    }
    if (i.loop == LoopTypes::ints_bools) {
      EXPECT_TRUE(!i.ktir_i.empty() && !i.ktir_b.empty()) << i.name;
    }
  }
}

TEST(CoreOps, EveryCostClassIsAVectorClassOfTheDataflowModel) {
  for (const CoreOpInfo& i : kCoreOps) {
    if (i.loop == LoopTypes::none) {
      EXPECT_EQ(i.cost, VectorCost::none) << i.name;
      continue;
    }
    ASSERT_NE(i.cost, VectorCost::none) << i.name << " sits in loop bodies: it needs a vector cost";
    // VectorCost mirrors hw::VectorOp member for member (targets/dataflow/map.cpp casts one into the other).
    const auto v = static_cast<hw::VectorOp>(static_cast<int>(i.cost));
    EXPECT_EQ(std::string(hw::vector_op_name(v)), std::string(vector_cost_name(i.cost))) << i.name;
  }
  EXPECT_EQ(static_cast<int>(VectorCost::none), hw::kNumVectorOps);
}

// The prices the dataflow cost model gave each primitive before the table (targets/dataflow/map.cpp's string
// table; names it had that are not primitives are gone): the figures of `tessel sim` depend on them.
TEST(CoreOps, VectorCostsKeepThePricesOfTheOldTable) {
  const std::map<std::string, VectorCost> before = {
      {"add", VectorCost::add},          {"neg", VectorCost::add},          {"mul", VectorCost::mul},
      {"div", VectorCost::divide},       {"rem", VectorCost::divide},       {"max", VectorCost::compare},
      {"min", VectorCost::compare},      {"compare", VectorCost::compare},  {"select", VectorCost::compare},
      {"and", VectorCost::compare},      {"or", VectorCost::compare},       {"xor", VectorCost::compare},
      {"convert", VectorCost::convert},  {"floor", VectorCost::convert},    {"reduce", VectorCost::reduce},
      {"exp", VectorCost::transcendental}, {"log", VectorCost::transcendental}, {"sqrt", VectorCost::transcendental},
      {"sin", VectorCost::transcendental}, {"atan", VectorCost::transcendental}, {"erf", VectorCost::transcendental},
      {"tanh", VectorCost::transcendental}, {"pow", VectorCost::transcendental},
      {"round_even", VectorCost::transcendental},  // missing from the old table: priced by its fallback
  };
  for (const CoreOpInfo& i : kCoreOps) {
    auto it = before.find(std::string(i.name));
    if (it == before.end()) {
      EXPECT_EQ(i.loop, LoopTypes::none) << i.name;
      continue;
    }
    EXPECT_EQ(i.cost, it->second) << i.name;
  }
}

// Each reduce kind names its combining primitive and identity; checked against the reference
// kernels: the identity is what an empty reduction gives and what the combiner leaves unchanged.
TEST(CoreOps, ReductionIdentitiesMatchTheReferenceKernels) {
  int kinds = 0;
  for (const CoreOpInfo& i : kCoreOps) {
    if (i.reduce_kind.empty()) {
      EXPECT_TRUE(std::isnan(i.identity)) << i.name;
      continue;
    }
    ++kinds;
    EXPECT_EQ(i.kind, CoreKind::binary) << i.name;
    EXPECT_EQ(reduction_combiner(i.reduce_kind), i.op) << i.name;
    const std::string kind(i.reduce_kind);
    auto empty = run_op("reduce", {f32({2, 0}, {})}, 1, {{"kind", Attr(kind)}, {"axes", std::vector<int64_t>{1}}});
    EXPECT_EQ(empty[0].get_f(0), i.identity) << kind;
    auto same = run_op(std::string(i.name), {f32({3}, {-2.5, 0, 7}), f32({3}, {i.identity, i.identity, i.identity})});
    EXPECT_EQ(same[0].to_f64(), (std::vector<double>{-2.5, 0, 7})) << i.name;
  }
  EXPECT_EQ(kinds, 4);  // sum prod max min (docs/ir/core.md)
  EXPECT_FALSE(reduction_combiner("mean").has_value());
  EXPECT_FALSE(reduction_combiner("").has_value());
}

// runtime/core_kernels.cpp computes every unary and binary row with a typed kernel (the graph and
// compiled backends run the rest through their reference kernels or dedicated kernels): a new
// elementwise row without one is named here. Floats for the float rows, i32 for the integer-only ones.
TEST(CoreOps, EveryElementwiseRowHasATypedKernel) {
  for (const CoreOpInfo& i : kCoreOps) {
    if (i.kind != CoreKind::unary && i.kind != CoreKind::binary) continue;
    const bool ints_only = i.loop == LoopTypes::ints_bools;
    const Tensor x = ints_only ? ints(DType::i32, {4}, {1, 2, 3, 4}) : f32({4}, {0.5, 1, 1.5, 2});
    std::vector<Tensor> feeds;
    const std::vector<Tensor> ins(static_cast<size_t>(i.arity), x);
    Graph g = one_node_graph(std::string(i.name), ins, {}, 1, {}, feeds);
    EXPECT_TRUE(static_cast<bool>(make_core_kernel(*g.nodes().front()))) << i.name << " has no typed kernel";
  }
}

// The table is the only place a primitive is named in a comparison: code asks `is_core_op(n, CoreOp::x)`
// or `n.op->core == CoreOp::x`, never `n.op->name == "x"` (issue 14's bar; kernel instructions hold the
// enum, so their comparisons are typed). Scans src/ for an
// op name, kernel-instruction op or op variable compared with a primitive's name; the table's own files
// are the exception. ONNX attribute values that happen to spell a primitive (ScatterElements'
// reduction "add", RoiAlign's mode "max") are compared as what they are and do not match this form.
TEST(CoreOps, NoPrimitiveNameIsComparedOutsideTheTable) {
  namespace fs = std::filesystem;
  std::string names;
  for (const CoreOpInfo& i : kCoreOps) names += (names.empty() ? "" : "|") + std::string(i.name);
  const std::regex compare(R"re((op->name|op_name\(\)|\bop)\s*(==|!=)\s*"()re" + names + R"re()")re");
  std::vector<std::string> found;
  for (const auto& e : fs::recursive_directory_iterator(std::string(TESSEL_SOURCE_DIR) + "/src")) {
    const std::string p = e.path().string();
    if (!e.is_regular_file() || p.find("/ir/core_ops.") != std::string::npos) continue;
    if (e.path().extension() != ".cpp" && e.path().extension() != ".h") continue;
    std::ifstream f(p);
    std::string line;
    for (int no = 1; std::getline(f, line); ++no)
      if (std::regex_search(line, compare)) found.push_back(p.substr(p.find("/src/") + 1) + ":" + std::to_string(no) + ": " + line);
  }
  std::string list;
  for (const std::string& s : found) list += "\n  " + s;
  EXPECT_TRUE(found.empty()) << "compare through the core-op table (is_core_op / OpDef::core):" << list;
}
