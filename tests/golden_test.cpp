// Golden text tests, one folder per pass: tests/golden/<pass>/<case>.in.tsl is parsed, the pass runs
// on it alone (with the verifier after it), and the printed result must equal <case>.out.tsl byte for
// byte. The expected files are reviewed like code; after an intended change, regenerate them with
// TESSEL_UPDATE_GOLDEN=1 and read the diff.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tessel/ir/printer.h"
#include "tessel/passes/pass.h"
#include "test_util.h"

using namespace tessel;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> golden_cases() {
  std::vector<std::string> cases;
  for (const auto& e : fs::recursive_directory_iterator(testenv::source_dir() + "/tests/golden")) {
    const std::string p = e.path().string();
    if (p.size() > 7 && p.substr(p.size() - 7) == ".in.tsl") cases.push_back(p);
  }
  std::sort(cases.begin(), cases.end());
  return cases;
}

class Golden : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST(GoldenSuite, EveryPassHasCases) {
  for (const auto& p : all_passes()) {
    bool found = false;
    for (const auto& c : golden_cases()) found = found || fs::path(c).parent_path().filename() == p.name;
    EXPECT_TRUE(found) << "no golden case under tests/golden/" << p.name;
  }
}

TEST_P(Golden, PassOutputMatches) {
  const std::string in_path = GetParam();
  const std::string pass = fs::path(in_path).parent_path().filename();
  const std::string out_path = in_path.substr(0, in_path.size() - 7) + ".out.tsl";
  auto g = parse_graph(testenv::read_text(in_path), in_path);
  run_pipeline(*g, parse_pipeline(pass), PassOptions{});
  const std::string got = print_graph(*g);
  if (std::getenv("TESSEL_UPDATE_GOLDEN")) {
    std::ofstream(out_path) << got;
    GTEST_SKIP() << "wrote " << out_path;
  }
  ASSERT_TRUE(fs::exists(out_path)) << "missing " << out_path << " (run with TESSEL_UPDATE_GOLDEN=1)";
  EXPECT_EQ(got, testenv::read_text(out_path)) << "pass " << pass << " on " << in_path;
  // The expected text is itself a valid graph.
  EXPECT_NO_THROW(parse_graph(testenv::read_text(out_path), out_path));
}

INSTANTIATE_TEST_SUITE_P(Passes, Golden, ::testing::ValuesIn(golden_cases()), [](const auto& info) {
  fs::path p(info.param);
  std::string n = p.parent_path().filename().string() + "_" + p.filename().string();
  n = n.substr(0, n.size() - 7);
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
});
