// The compiled backend: every corpus model matches its reference outputs (computed by PyTorch), the
// compile cache is hit without starting the compiler, thread counts agree and leave the caller's count
// as it was, and broken kernels or a failing compiler give clear errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <filesystem>
#include <fstream>

#include "corpus_util.h"
#include "tessel/runtime/compiled_backend.h"
#include "tessel/support/threads.h"
#include "tessel/targets/cpu/codegen.h"

using namespace tessel;
namespace fs = std::filesystem;

namespace {

// One cache for the test binary: models compiled by several tests are compiled once.
std::string test_cache() { return (fs::path(testenv::tessel_binary()).parent_path() / "test-compile-cache").string(); }

std::string fresh_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / fmt::format("tessel-{}-{}", name, static_cast<long>(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

CompiledBackendOptions options(int threads = 2) {
  CompiledBackendOptions o;
  o.threads = threads;
  o.toolchain.cache_dir = test_cache();
  return o;
}

class CorpusCompiled : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(CorpusCompiled, MatchesReference) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  testenv::CorpusCase c = testenv::load_corpus_model(GetParam());
  auto exe = compile_cpu(std::move(c.model.graph), c.inputs, options());
  EXPECT_GT(exe->stats().kernels, 0);
  std::vector<Tensor> outs = exe->run(c.inputs);
  testenv::expect_matches_reference(outs, c.refs, GetParam() + " compiled");
  // a second call on the same executable gives the same result
  std::vector<Tensor> again = exe->run(c.inputs);
  for (size_t i = 0; i < outs.size(); ++i) EXPECT_TRUE(outs[i].same_as(again[i])) << "output " << i;
}

INSTANTIATE_TEST_SUITE_P(Models, CorpusCompiled,
                         ::testing::Values("tblock_s", "tblock_s_dynamo", "tblock_bert", "ffn_s", "attn_s", "bert_tiny",
                                           "gpt2_tiny", "mobilenet_v2", "nonzero_break"));

// Each row of a reduction is computed by one thread whatever the split: results agree bit for bit.
TEST(CompiledBackend, ThreadCountsAgree) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  testenv::CorpusCase a = testenv::load_corpus_model("tblock_s");
  testenv::CorpusCase b = testenv::load_corpus_model("tblock_s");
  auto one = compile_cpu(std::move(a.model.graph), a.inputs, options(1));
  auto two = compile_cpu(std::move(b.model.graph), b.inputs, options(2));
  EXPECT_EQ(one->stats().threads, 1);
  EXPECT_EQ(two->stats().threads, 2);
  std::vector<Tensor> x = one->run(a.inputs), y = two->run(a.inputs);
  ASSERT_EQ(x.size(), y.size());
  testenv::expect_matches_reference(x, y, "1 vs 2 threads", 1e-6);
}

// tessel applies its thread count only while it compiles and runs: a caller's OpenMP count (here 3)
// is the same afterwards, and a run under another caller count still matches the reference.
TEST(CompiledBackend, LeavesTheCallersThreadCount) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  testenv::CorpusCase c = testenv::load_corpus_model("tblock_s");
  ScopedOmpThreads caller(3);
  auto exe = compile_cpu(std::move(c.model.graph), c.inputs, options(1));
  EXPECT_EQ(omp_get_max_threads(), 3) << "after compile";
  std::vector<Tensor> outs = exe->run(c.inputs);
  EXPECT_EQ(omp_get_max_threads(), 3) << "after run";
  testenv::expect_matches_reference(outs, c.refs, "tblock_s compiled, 1 thread under a caller's 3");
  ScopedOmpThreads other(2);
  std::vector<Tensor> again = exe->run(c.inputs);
  EXPECT_EQ(omp_get_max_threads(), 2) << "after a run under another caller count";
  for (size_t i = 0; i < outs.size(); ++i) EXPECT_TRUE(outs[i].same_as(again[i])) << "output " << i;
}

// A cache hit loads the shared object without starting the compiler: the compiler here is a
// wrapper that logs every start, and the second compile of the same model adds no line.
TEST(CompiledBackend, CacheHitNeverStartsTheCompiler) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  const std::string dir = fresh_dir("cache-hit");
  const std::string log = dir + "/starts.log", wrapper = dir + "/cxx-wrapper";
  {
    std::ofstream w(wrapper);
    w << "#!/bin/sh\necho started >> '" << log << "'\nexec c++ \"$@\"\n";
  }
  fs::permissions(wrapper, fs::perms::owner_all);
  auto starts = [&] {
    std::ifstream f(log);
    int n = 0;
    for (std::string l; std::getline(f, l);) ++n;
    return n;
  };
  CompiledBackendOptions o = options();
  o.toolchain.cache_dir = dir + "/cache";
  o.toolchain.cxx = wrapper;
  testenv::CorpusCase c = testenv::load_corpus_model("tblock_s");
  auto cold = compile_cpu(std::move(c.model.graph), c.inputs, o);
  EXPECT_FALSE(cold->stats().cache_hit);
  EXPECT_GT(cold->stats().cxx_seconds, 0);
  EXPECT_TRUE(fs::exists(cold->stats().so_path));
  EXPECT_EQ(starts(), 1);
  testenv::CorpusCase d = testenv::load_corpus_model("tblock_s");
  auto warm = compile_cpu(std::move(d.model.graph), d.inputs, o);
  EXPECT_TRUE(warm->stats().cache_hit);
  EXPECT_EQ(warm->stats().cxx_seconds, 0);
  EXPECT_EQ(warm->stats().cache_key, cold->stats().cache_key);
  EXPECT_EQ(starts(), 1) << "the compiler was started on a cache hit";
  testenv::expect_matches_reference(warm->run(d.inputs), d.refs, "tblock_s from the cache");
  fs::remove_all(dir);
}

// A failing compiler: the error says so and names the generated file, which is kept.
TEST(CompiledBackend, CompilerFailureKeepsTheSource) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  const std::string dir = fresh_dir("cxx-fails");
  CompiledBackendOptions o = options();
  o.toolchain.cache_dir = dir;
  o.toolchain.cxx = "/bin/false";
  testenv::CorpusCase c = testenv::load_corpus_model("nonzero_break");
  try {
    compile_cpu(std::move(c.model.graph), c.inputs, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("kernels.cpp"), std::string::npos) << msg;
    bool kept = false;
    for (const auto& f : fs::recursive_directory_iterator(dir)) kept = kept || f.path().filename() == "kernels.cpp";
    EXPECT_TRUE(kept);
  }
  fs::remove_all(dir);
}

// A kernel the C++ generator cannot express (a primitive with no scalar form in a loop body; a name that
// is no primitive no longer compiles): the error names the kernel and the instruction.
TEST(CompiledBackend, BrokenKernelIsNamed) {
  Kernel k;
  k.name = "k7";
  k.outer = {4};
  k.inner = {8};
  k.args = {KArg{"x", TensorType{DType::f32, {4, 8}}, KArg::Role::in}, KArg{"y", TensorType{DType::f32, {4, 8}}, KArg::Role::out}};
  k.accesses = {KAccess{0, 0, {8, 1}}, KAccess{1, 0, {8, 1}}};
  k.body = {KInstr{.kind = KInstrKind::load, .access = 0}, KInstr{.core = CoreOp::reduce_window, .args = {0}},
            KInstr{.kind = KInstrKind::store, .args = {1}, .access = 1}};
  try {
    cpu::generate_kernel(k, 7);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("k7"), std::string::npos) << msg;
    EXPECT_NE(msg.find("reduce_window"), std::string::npos) << msg;
  }
}
