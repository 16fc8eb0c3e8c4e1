// The ONNX backend conformance data (../shared/onnx-tests): the number of passing tests must not
// drop below the committed baseline (tests/conformance_baseline.json), nothing may crash or hang,
// and every test that does not pass carries a reason.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tessel/driver/conformance.h"
#include "test_util.h"

using namespace tessel;

namespace {

class ConformanceSuite : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(ConformanceSuite, PassCountAtLeastBaseline) {
  const std::string root = testenv::shared_dir() + "/onnx-tests/" + GetParam();
  if (!std::filesystem::exists(root)) GTEST_SKIP() << "needs " << root;
  auto baseline = nlohmann::json::parse(testenv::read_text(testenv::source_dir() + "/tests/conformance_baseline.json"));
  const int want = baseline.at("eager").at(GetParam()).get<int>();
  ConformanceOptions o;
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
  std::printf("%s: %zu tests, %d passed, %d failed, %d unsupported (baseline %d)\n", GetParam().c_str(),
              r.tests.size(), passed, r.count("failed"), r.count("unsupported"), want);
  EXPECT_GE(passed, want) << "conformance regressed below the baseline for " << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Onnx, ConformanceSuite, ::testing::Values("node", "simple", "pytorch-operator"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });
