// The worked examples in docs/ are checked: each ```tsl block parses, verifies, prints back unchanged,
// and runs to the output the page states.
#include <gtest/gtest.h>

#include <regex>

#include "tessel/driver/multichip.h"
#include "tessel/driver/op_table.h"
#include "tessel/hw/hw.h"
#include "tessel/driver/target_compare.h"
#include "tessel/ir/op_registry.h"
#include "tessel/ir/printer.h"
#include "tessel/ir/verifier.h"
#include "tessel/passes/pass.h"
#include "tessel/runtime/interpreter.h"
#include "corpus_util.h"
#include "tessel/kernel/kernel.h"
#include "tessel/targets/cpu/codegen.h"
#include "test_util.h"

using namespace tessel;

namespace {

// The text of every fenced block of `md` that opens with the line `fence` (e.g. "```tsl before").
std::vector<std::string> fenced_blocks(const std::string& md, const std::string& fence) {
  std::vector<std::string> out;
  for (size_t b = md.find(fence + "\n"); b != std::string::npos; b = md.find(fence + "\n", b)) {
    b += fence.size() + 1;
    out.push_back(md.substr(b, md.find("```", b) - b));
  }
  return out;
}
std::string fenced_block(const std::string& md, const std::string& fence) {
  std::vector<std::string> all = fenced_blocks(md, fence);
  return all.empty() ? std::string() : all.front();
}

std::string tsl_block(const std::string& md) { return fenced_block(md, "```tsl"); }

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

// docs/ir/core.md, "The core-op table": the example row is a row of src/tessel/ir/core_ops.def as written
// there, so the page shows the table's real columns.
TEST(Docs, CoreOpTableRowIsInTheTable) {
  const std::string md = testenv::read_text(testenv::source_dir() + "/docs/ir/core.md");
  const std::string def = testenv::read_text(testenv::source_dir() + "/src/tessel/ir/core_ops.def");
  const std::string row = fenced_block(md, "```def");
  ASSERT_FALSE(row.empty()) << "docs/ir/core.md needs a ```def block with a row of core_ops.def";
  EXPECT_NE(def.find(row), std::string::npos) << row;
}

// docs/ir/core.md: the graph-level example, through the core pipeline, prints as the page's after block,
// and both graphs compute the numbers the page states.
TEST(Docs, CoreLevelWorkedExample) {
  std::string md = testenv::read_text(testenv::source_dir() + "/docs/ir/core.md");
  auto block = [&](const std::string& fence) { return fenced_block(md, fence); };
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

// docs/ir/kernel.md: the kernel-level graph of tblock_s and the kernels the page shows are exactly what
// fusion prints for it.
TEST(Docs, KernelLevelWorkedExample) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  std::string md = testenv::read_text(testenv::source_dir() + "/docs/ir/kernel.md");
  auto blocks = [&](const std::string& fence) { return fenced_blocks(md, fence); };
  testenv::CorpusCase c = testenv::load_corpus_model("tblock_s");
  run_pipeline(*c.model.graph, parse_pipeline("core"), PassOptions{});
  KernelModule m = fuse(std::move(c.model.graph));
  PrintOptions po;
  po.elide_constants = true;
  std::string graph;
  std::istringstream lines(print_graph(*m.graph, po));
  bool in_graph = false;
  for (std::string l; std::getline(lines, l);) {
    if (l.rfind("graph ", 0) == 0) in_graph = true;
    if (in_graph && l.rfind("  const ", 0) != 0) graph += l + "\n";
    if (l == "}") in_graph = false;
  }
  std::vector<std::string> g = blocks("```tsl kernel-graph");
  ASSERT_EQ(g.size(), 1u) << "docs/ir/kernel.md needs one ```tsl kernel-graph block";
  EXPECT_EQ(g[0], graph);
  std::vector<std::string> ks = blocks("```kernel");
  ASSERT_GE(ks.size(), 2u);
  for (const std::string& block : ks) {
    bool found = false;
    for (const Kernel& k : m.kernels) found = found || print_kernel(k) == block;
    EXPECT_TRUE(found) << "no kernel of tblock_s prints as\n" << block;
  }
}

// docs/dynamic-shapes.md: the symbolic core graph, fused with the CPU's options, prints as the page's
// kernel module, and the softmax kernel's generated function is the page's.
TEST(Docs, DynamicShapesWorkedExample) {
  std::string md = testenv::read_text(testenv::source_dir() + "/docs/dynamic-shapes.md");
  const std::string tsl = fenced_block(md, "```tsl symbolic"), km = fenced_block(md, "```kernel-module symbolic"),
                    fn = fenced_block(md, "```cpp symbolic");
  ASSERT_FALSE(tsl.empty() || km.empty() || fn.empty());
  KernelModule m = fuse(parse_graph(tsl, "docs/dynamic-shapes.md"), cpu_fuse_options());
  verify_kernel_module(m);
  EXPECT_EQ(print_kernel_module(m), km);
  ASSERT_EQ(m.kernels.size(), 1u);
  const std::string got = cpu::generate_kernel(m.kernels[0], 0, cpu::module_symbols(m));
  EXPECT_EQ(got.substr(got.find("extern")), fn);
}

// docs/passes/fuse.md: the ```tsl before block, fused, prints as the ```kernel-module after block.
TEST(Docs, FuseWorkedExample) {
  std::string md = testenv::read_text(testenv::source_dir() + "/docs/passes/fuse.md");
  auto block = [&](const std::string& fence) { return fenced_block(md, fence); };
  std::string before = block("```tsl before"), after = block("```kernel-module after");
  ASSERT_FALSE(before.empty() || after.empty());
  KernelModule m = fuse(parse_graph(before, "docs/passes/fuse.md"));
  verify_kernel_module(m);
  EXPECT_EQ(print_kernel_module(m), after);
}

// docs/sim.md, "Two targets side by side": the ```tsl compare attention mapped for tpu-v5e and spyre prints as
// the ```text compare block (the text `tessel compare attention.tsl --hw tpu-v5e,spyre` prints).
TEST(Docs, CompareWorkedExample) {
  const std::string md = testenv::read_text(testenv::source_dir() + "/docs/sim.md");
  const std::string tsl = fenced_block(md, "```tsl compare"), want = fenced_block(md, "```text compare");
  ASSERT_FALSE(tsl.empty() || want.empty());
  auto map = [&](const char* target) {
    dataflow::MapOptions o;
    o.name = "attention";
    return compile_dataflow(parse_graph(tsl, "docs/sim.md"), hw::resolve_target(target), o);
  };
  EXPECT_EQ(comparison_text(compare_targets(map("tpu-v5e"), map("spyre"))), want);
}

// docs/multichip.md: the worked example's sharding and collective blocks are what the run prints.
TEST(Docs, MultiChipWorkedExample) {
  const std::string md = testenv::read_text(testenv::source_dir() + "/docs/multichip.md");
  const std::string model = testenv::shared_dir() + "/models/tblock_bert";
  MultiChipOptions o;
  o.shard = parse_shard("tp=4");
  o.functional = true;
  const MultiChipRun r = run_multichip(model, model_inputs(model), hw::load_hw_file(testenv::source_dir() + "/examples/multichip/spyre_ring4.json"), o);
  const std::string text = multichip_text(r);
  auto block = [&](const std::string& first, const std::string& last) {
    const size_t a = text.find(first), b = text.find(last, a);
    EXPECT_NE(a, std::string::npos) << text;
    EXPECT_NE(b, std::string::npos) << text;
    return text.substr(a, b + last.size() - a);
  };
  const std::string sharding = block("sharding: ", "'/fc2/MatMul_output_0'\n");
  EXPECT_NE(md.find(sharding), std::string::npos) << "docs/multichip.md's sharding block is not:\n" << sharding;
  const std::string coll = block("collective ", "\n\nchip ");  // the header and both all-reduces
  const std::string rows = coll.substr(0, coll.size() - 6);
  EXPECT_NE(md.find(rows), std::string::npos) << "docs/multichip.md's collective block is not:\n" << rows;
  EXPECT_LT(r.max_rel, 1e-7);
}
