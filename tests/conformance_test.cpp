// The ONNX backend conformance data (../shared/onnx-tests): for each backend (eager; graph: the
// "core" pipeline and the graph backend; compiled: fused kernels as generated C++), the number of
// passing tests must not drop below the committed baseline (tests/conformance_baseline.json),
// nothing may crash or hang, and every test that does not pass carries a reason.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tessel/driver/conformance.h"
#include "test_util.h"

using namespace tessel;

namespace {

// (backend, suite)
class ConformanceSuite : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

}  // namespace

TEST_P(ConformanceSuite, PassCountAtLeastBaseline) {
  const auto& [backend, suite] = GetParam();
  const std::string root = testenv::shared_dir() + "/onnx-tests/" + suite;
  if (!std::filesystem::exists(root)) GTEST_SKIP() << "needs " << root;
  auto baseline = nlohmann::json::parse(testenv::read_text(testenv::source_dir() + "/tests/conformance_baseline.json"));
  const int want = baseline.at(backend).at(suite).get<int>();
  // The compiled backend's shared objects go to a cache in the build tree, not the user's.
  const std::string cache = (std::filesystem::path(testenv::tessel_binary()).parent_path() / "test-compile-cache").string();
  setenv("TESSEL_CACHE_DIR", cache.c_str(), 1);
  ConformanceOptions o;
  o.backend = backend;
  o.jobs = 2;
  o.timeout_s = 300;
  ConformanceReport r = run_conformance(root, o);
  int passed = r.count("passed");
  std::string bad;
  for (const auto& t : r.tests) {
    if (t.status == "crashed" || t.status == "timeout") bad += "\n  " + t.status + ": " + t.name + ": " + t.reason;
    if (t.status != "passed" && t.reason.empty()) bad += "\n  no reason: " + t.name;
  }
  EXPECT_TRUE(bad.empty()) << bad;
  std::printf("%s (%s): %zu tests, %d passed, %d failed, %d unsupported (baseline %d)\n", suite.c_str(), backend.c_str(),
              r.tests.size(), passed, r.count("failed"), r.count("unsupported"), want);
  EXPECT_GE(passed, want) << "conformance regressed below the baseline for " << suite << " with " << backend;
}

INSTANTIATE_TEST_SUITE_P(Onnx, ConformanceSuite,
                         ::testing::Combine(::testing::Values("eager", "graph", "compiled"),
                                            ::testing::Values("node", "simple", "pytorch-operator")),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param) + "_" + std::get<1>(info.param);
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });
