// The host CPU's subnormal flush for library operands (src/tessel/targets/cpu/ftz.h,
// docs/runtime/compiled-backend.md "Subnormals").
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "tessel/ir/printer.h"
#include "tessel/ir/verifier.h"
#include "tessel/kernel/kernel.h"
#include "tessel/lower/cpu.h"
#include "tessel/runtime/compiled_backend.h"
#include "tessel/runtime/interpreter.h"
#include "graph_test_util.h"
#include "test_util.h"

using namespace tessel;

namespace {

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(CompiledBackend, SubnormalsFlushOnlyWhereProductsReadThem) {
  const std::string md = testenv::read_text(testenv::source_dir() + "/docs/runtime/compiled-backend.md");
  const std::string text = testenv::md_block(md, "```tsl ftz");
  ASSERT_FALSE(text.empty());
  {
    auto g = parse_graph(text, "compiled-backend.md");
    verify_graph(*g);
    lower::CpuOptions o;
    o.codegen = true;
    lower::CpuLowered l = lower::lower_cpu(std::move(g), o);
    const std::string kernels = print_kernel_module(l.module);
    EXPECT_EQ(count(kernels, "store.ftz"), 1u) << kernels;  // e's store, not z's
    EXPECT_EQ(count(l.source, "tsl_ftz("), 1u) << l.source;
    bool named = false;
    for (const PassRecord& r : l.records) named = named || r.pass == "cpu-ftz-library-operands";
    EXPECT_TRUE(named);
  }
  // x = -100 puts exp's results at 3.7e-44 (subnormal): the product reads zeros, z keeps them bit for bit.
  std::vector<double> xv(32, -100.0), wv(24), vv(32, -100.0);
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = 0.25 * static_cast<double>(i % 7) - 0.5;
  vv[3] = -1.0;
  const std::vector<Tensor> ins = {Tensor::from_f64(DType::f32, {4, 8}, xv), Tensor::from_f64(DType::f32, {8, 3}, wv),
                                   Tensor::from_f64(DType::f32, {4, 8}, vv)};
  auto g = parse_graph(text, "compiled-backend.md");
  const std::vector<Tensor> want = run_eager(*g, ins);
  auto exe = compile_cpu(std::move(g), ins, testenv::compiled_test_options());
  const std::vector<Tensor> got = exe->run(ins);
  ASSERT_EQ(got.size(), 2u);
  const std::vector<double> y = got[0].to_f64(), yw = want[0].to_f64();
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_EQ(y[i], 0.0) << i;             // flushed operands: the product of zeros
    EXPECT_LT(std::fabs(yw[i]), 1e-42) << i;  // eager's, from the subnormals: what the flush changed
  }
  ASSERT_EQ(got[1].nbytes(), want[1].nbytes());
  EXPECT_EQ(std::memcmp(got[1].bytes(), want[1].bytes(), static_cast<size_t>(want[1].nbytes())), 0);
  EXPECT_GT(want[1].to_f64()[0], 0.0);
  EXPECT_LT(want[1].to_f64()[0], 1.2e-38);  // a subnormal, returned as PyTorch computes it
}

// store.ftz is a permission for float stores only; the verifier names anything else.
TEST(CompiledBackend, StoreAttributeIsFtzOnFloatsOnly) {
  const std::string md = testenv::read_text(testenv::source_dir() + "/docs/runtime/compiled-backend.md");
  auto g = parse_graph(testenv::md_block(md, "```tsl ftz"), "compiled-backend.md");
  lower::CpuOptions o;
  o.codegen = false;
  lower::CpuLowered l = lower::lower_cpu(std::move(g), o);
  for (Kernel& k : l.module.kernels)
    for (KInstr& in : k.body)
      if (in.is(KInstrKind::store)) in.attr = "fast";
  try {
    verify_kernel_module(l.module);
    ADD_FAILURE() << "store.fast verified";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a store's attribute is ftz on a float value, not 'fast'"), std::string::npos)
        << e.what();
  }
}
