// The progress helper (support/progress.h): the plain log lines written when stderr is not a terminal,
// the in-place line of a terminal, quiet mode, and the figures (rate, ETA) — on an injected clock.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessel/support/progress.h"

using namespace tessel;

namespace {

struct Capture {
  double t = 0;
  std::vector<std::string> writes;
  ProgressOptions options(ProgressMode mode) {
    ProgressOptions o;
    o.mode = mode;
    o.clock = [this] { return t; };
    o.write = [this](const std::string& s) { writes.push_back(s); };
    o.width = 200;
    return o;
  }
};

}  // namespace

TEST(Progress, LinesModeLogsEveryFewSecondsWithRateAndEta) {
  Capture c;
  Progress p("conformance node", 100, "tests", c.options(ProgressMode::lines));
  c.t = 1;
  p.advance(5, "test_abs");
  EXPECT_TRUE(c.writes.empty()) << "nothing before log_every_s: short work stays silent";
  c.t = 10;
  p.advance(5, "test_add");
  ASSERT_EQ(c.writes.size(), 1u);
  EXPECT_EQ(c.writes[0], "conformance node: 10/100 tests (10%), 1.0 tests/s, ETA 1 min 30 s, 10 s: test_add\n");
  c.t = 15;
  p.advance(10);
  EXPECT_EQ(c.writes.size(), 1u) << "at most one line per log_every_s";
  c.t = 20;
  p.tick();
  ASSERT_EQ(c.writes.size(), 2u);
  EXPECT_EQ(c.writes[1].find('\r'), std::string::npos) << "no carriage return when not a terminal";
  EXPECT_NE(c.writes[1].find("20/100 tests (20%)"), std::string::npos) << c.writes[1];
  p.log("[21/100] failed test_x");
  EXPECT_EQ(c.writes.back(), "[21/100] failed test_x\n");
  c.t = 25;
  p.advance(80);
  p.finish();
  EXPECT_EQ(c.writes.back(), "conformance node: 100/100 tests (100%), 4.0 tests/s, 25 s (done)\n");
  const size_t n = c.writes.size();
  p.finish();
  EXPECT_EQ(c.writes.size(), n) << "finish twice writes once";
}

TEST(Progress, ShortWorkWritesNothingEvenAtTheEnd) {
  Capture c;
  {
    Progress p("compile m", 4, "steps", c.options(ProgressMode::lines));
    c.t = 2;
    p.advance(4);
  }  // the destructor finishes
  EXPECT_TRUE(c.writes.empty());
}

TEST(Progress, QuietWritesNoProgressButKeepsLogLines) {
  Capture c;
  Progress p("conformance node", 10, "tests", c.options(ProgressMode::quiet));
  for (int i = 1; i <= 10; ++i) {
    c.t = i * 100;
    p.advance(1, "t");
    p.tick();
  }
  p.finish();
  EXPECT_TRUE(c.writes.empty());
  p.log("asked for with -v");
  ASSERT_EQ(c.writes.size(), 1u);
}

TEST(Progress, TerminalRedrawsOneLineInPlaceAndClearsItAtTheEnd) {
  Capture c;
  ProgressOptions o = c.options(ProgressMode::terminal);
  o.eta = false;
  Progress p("compile tblock_bert", 4, "steps", o);
  c.t = 0.5;
  p.advance(1, "importing");
  EXPECT_TRUE(c.writes.empty()) << "nothing in the first delay_s";
  c.t = 1.5;
  p.advance(1, "C++ compiler");
  ASSERT_EQ(c.writes.size(), 1u);
  EXPECT_EQ(c.writes[0], "\rcompile tblock_bert: 2/4 steps (50%), 2 s: C++ compiler\x1b[K");
  c.t = 1.6;
  p.tick();
  EXPECT_EQ(c.writes.size(), 1u) << "redrawn at most every redraw_s";
  c.t = 3;
  p.tick();
  EXPECT_EQ(c.writes.size(), 2u);
  p.finish();
  EXPECT_EQ(c.writes.back(), "\r\x1b[K");
}

TEST(Progress, DurationsReadAsPeopleWriteThem) {
  EXPECT_EQ(duration_text(4.6), "5 s");
  EXPECT_EQ(duration_text(465), "7 min 45 s");
  EXPECT_EQ(duration_text(7500), "2 h 05 min");
}
