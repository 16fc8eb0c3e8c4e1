// Child processes (support/process.h): what tessel bench's `tessel load` and its peers run through.
#include "tessel/support/process.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>

using namespace tessel;

namespace {

const std::string kSh = find_program("sh");

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

TEST(Process, FindsProgramsOnThePathAndByPath) {
  ASSERT_FALSE(kSh.empty());
  EXPECT_EQ(find_program(kSh), kSh);
  EXPECT_EQ(find_program("/nonexistent/tessel-no-such-program"), "");
  EXPECT_EQ(find_program("tessel-no-such-program-on-path"), "");
}

TEST(Process, CapturesOutputStatusAndTheLastLineOfErrors) {
  const ProcessResult ok = run_process({kSh, "-c", "echo one; echo two"});
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.out, "one\ntwo\n");
  const ProcessResult bad = run_process({kSh, "-c", "echo first >&2; echo 'the reason' >&2; echo; exit 3"});
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.why(10), "the reason");
  const ProcessResult quiet = run_process({kSh, "-c", "exit 4"});
  EXPECT_EQ(quiet.why(10), "exit status 4");
  const ProcessResult none = run_process({"/nonexistent/tessel-no-such-program"});
  EXPECT_EQ(none.status, -1);
  EXPECT_NE(none.why(10).find("cannot start"), std::string::npos) << none.why(10);
}

// The child's standard input is /dev/null, not this process's: here this process's is a pipe nobody
// writes or closes, which a child reading it would wait on until the deadline.
TEST(Process, AddsToTheEnvironmentAndGivesNoInput) {
  int never[2];
  ASSERT_EQ(::pipe(never), 0);
  const int saved = ::dup(0);
  ::dup2(never[0], 0);
  const ProcessResult r = run_process({kSh, "-c", "echo \"$TESSEL_PROCESS_TEST\"; cat; echo done"}, {"TESSEL_PROCESS_TEST=a b"}, 3);
  ::dup2(saved, 0);
  ::close(saved);
  ::close(never[0]);
  ::close(never[1]);
  EXPECT_TRUE(r.ok()) << r.why(3);
  EXPECT_EQ(r.out, "a b\ndone\n");
}

// A child that does not finish, and one whose background child keeps the output pipe open after the
// parent exits: both are killed with their process group at the deadline, and the call returns then.
TEST(Process, KillsTheProcessGroupAtTheDeadline) {
  for (const char* script : {"sleep 30", "sleep 30 & echo started", "(sleep 30 >/dev/null 2>&1 &) ; sleep 30 & exit 0"}) {
    SCOPED_TRACE(script);
    const auto t0 = std::chrono::steady_clock::now();
    const ProcessResult r = run_process({kSh, "-c", script}, {}, 0.5);
    EXPECT_LT(seconds_since(t0), 5.0);
    EXPECT_FALSE(r.ok());
  }
  const ProcessResult r = run_process({kSh, "-c", "sleep 30"}, {}, 1.0);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.why(1.0), "did not finish within 1 s");
}
