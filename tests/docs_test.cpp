// The worked examples in docs/ are checked: each ```tsl block parses, verifies, prints back unchanged,
// and runs to the output the page states.
#include <gtest/gtest.h>

#include <regex>

#include "tessel/driver/op_table.h"
#include "tessel/ir/op_registry.h"
#include "tessel/ir/printer.h"
#include "tessel/ir/verifier.h"
#include "tessel/passes/pass.h"
#include "tessel/runtime/interpreter.h"
#include "test_util.h"

using namespace tessel;

namespace {

std::string tsl_block(const std::string& md) {
  auto b = md.find("```tsl\n");
  if (b == std::string::npos) return "";
  b += 7;
  return md.substr(b, md.find("```", b) - b);
}

std::vector<double> numbers_after(const std::string& md, const std::string& marker) {
  auto p = md.find(marker);
  std::vector<double> out;
  if (p == std::string::npos) return out;
  const size_t b = p + marker.size();
  std::string rest = md.substr(b, md.find('`', b) - b);
  std::regex num("-?[0-9.]+");
  for (std::sregex_iterator it(rest.begin(), rest.end(), num), end; it != end; ++it) out.push_back(std::stod(it->str()));
  return out;
}

}  // namespace

TEST(Docs, GraphLevelWorkedExample) {
  std::string md = testenv::read_text(testenv::source_dir() + "/docs/ir/graph.md");
  std::string text = tsl_block(md);
  ASSERT_FALSE(text.empty()) << "docs/ir/graph.md has no ```tsl block";
  auto g = parse_graph(text, "docs/ir/graph.md");
  verify_graph(*g);
  EXPECT_EQ(print_graph(*g), text);
  std::vector<double> x = numbers_after(md, "With input `x = ");
  ASSERT_EQ(x.size(), 6u);
  auto out = run_eager(*g, {Tensor::from_f64(DType::f32, {2, 3}, x)});
  EXPECT_EQ(out[0].to_f64(), numbers_after(md, "expected output: `y = "));
}

TEST(Docs, OpTableMatchesRegistry) {
  std::string md = testenv::read_text(testenv::source_dir() + "/docs/ops.md");
  EXPECT_TRUE(md == op_table_markdown()) << "docs/ops.md is out of date: regenerate it with `tessel ops > docs/ops.md`";
}

// docs/passes/<pass>.md: the ```tsl before block, run through the pass, prints as the ```tsl after block.
// The after block's fence may name a pipeline instead ("```tsl after algebraic,dce").
TEST(Docs, PassWorkedExamples) {
  for (const char* pass : {"decompose", "fold-constants", "cse", "dce", "algebraic", "canonicalize"}) {
    std::string md = testenv::read_text(testenv::source_dir() + "/docs/passes/" + pass + ".md");
    std::string pipeline = pass;
    auto block = [&](const std::string& tag) {
      auto b = md.find("```tsl " + tag);
      if (b == std::string::npos) return std::string();
      b += 7 + tag.size();
      const auto eol = md.find('\n', b);
      if (tag == "after" && eol > b + 1) pipeline = md.substr(b + 1, eol - b - 1);
      return md.substr(eol + 1, md.find("```", eol) - eol - 1);
    };
    std::string before = block("before"), after = block("after");
    ASSERT_FALSE(before.empty() || after.empty()) << pass;
    auto g = parse_graph(before, std::string("docs/passes/") + pass + ".md");
    verify_graph(*g);
    run_pipeline(*g, parse_pipeline(pipeline), PassOptions{});
    EXPECT_EQ(print_graph(*g), after) << pass << " (pipeline " << pipeline << ")";
  }
}

// docs/ir/core.md: the graph-level example, through the core pipeline, prints as the page's after block,
// and both graphs compute the numbers the page states.
TEST(Docs, CoreLevelWorkedExample) {
  std::string md = testenv::read_text(testenv::source_dir() + "/docs/ir/core.md");
  auto block = [&](const std::string& fence) {
    auto b = md.find(fence + "\n");
    if (b == std::string::npos) return std::string();
    b += fence.size() + 1;
    return md.substr(b, md.find("```", b) - b);
  };
  std::string before = block("```tsl before"), after = block("```tsl after");
  ASSERT_FALSE(before.empty() || after.empty()) << "docs/ir/core.md needs ```tsl before and after blocks";
  auto g = parse_graph(before, "docs/ir/core.md");
  auto reference = parse_graph(before, "docs/ir/core.md");
  run_pipeline(*g, parse_pipeline("core"), PassOptions{});
  EXPECT_EQ(print_graph(*g), after);
  for (const auto& n : g->nodes()) EXPECT_EQ(n->op->domain, "tessel.core") << n->name;
  std::vector<double> x = numbers_after(md, "With input\n`x = ");
  ASSERT_EQ(x.size(), 8u);
  std::vector<double> want = numbers_after(md, "`y = ");
  ASSERT_EQ(want.size(), 8u);
  Tensor in = Tensor::from_f64(DType::f32, {2, 4}, x);
  for (const Graph* graph : {reference.get(), g.get()}) {
    std::vector<double> got = run_eager(*graph, {in})[0].to_f64();
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 5e-5) << i;
  }
}
