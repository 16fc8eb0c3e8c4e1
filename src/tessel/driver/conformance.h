// The ONNX conformance runner: every test folder under a directory, each in its own process so a
// crash or hang in one test is reported instead of ending the run.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tessel/driver/compare.h"

namespace tessel {

struct ConformanceOptions {
  int jobs = 2;
  double timeout_s = 120;
  std::string filter;   // substring a test name must contain (empty: all)
  Tolerance tol;
  std::string passes;        // pipeline run on each model before it executes (empty: none)
  bool require_core = false; // after the passes, a node outside tessel.core fails the test
  std::string backend = "eager";  // eager | graph | compiled (compiled per model; recompiled when a guard fails)
  bool progress = false;  // a progress line on stderr (support/progress.h: terminal, log lines or quiet)
  bool verbose = false;   // a line per finished test on stderr
};

struct TestResult {
  std::string name;     // folder path relative to the root
  std::string status;   // passed | failed | unsupported | crashed | timeout
  std::string reason;   // for every status but passed
  std::string cause;    // the reason without its particulars (names, numbers): failures group by it
  double max_abs = 0, rel = 0;
  double seconds = 0;
};

struct ConformanceReport {
  std::vector<TestResult> tests;
  int count(const std::string& status) const;
};

// One test folder (model.onnx + test_data_set_N), in this process.
TestResult run_conformance_test(const std::string& dir, const ConformanceOptions& opts);
// Every folder under `root` that holds a model.onnx, sorted by path.
std::vector<std::string> find_test_dirs(const std::string& root);
ConformanceReport run_conformance(const std::string& root, const ConformanceOptions& opts);
nlohmann::json report_json(const ConformanceReport& r);

// The tests that did not pass, grouped by cause, largest group first: "  26  unsupported: ...  e.g. a, b, c".
std::string failures_by_cause(const ConformanceReport& r);

}  // namespace tessel
