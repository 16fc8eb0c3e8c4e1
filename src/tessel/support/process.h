// Child processes: a program found on $PATH, and one run with its output captured and a time limit
// (tessel bench's `tessel load` and its peers; the CPU target's compiler has its own runner, which writes
// to the build log).
#pragma once

#include <string>
#include <vector>

namespace tessel {

// The file a command name runs: itself when it contains '/', else the first match on $PATH; "" when none
// is executable.
std::string find_program(const std::string& name);

struct ProcessResult {
  int status = -1;        // waitpid status; -1: not started (err says why)
  bool timed_out = false; // killed at the deadline (with its process group)
  std::string out, err;   // standard output (at most 16 MiB); the last 4 KiB of standard error
  bool ok() const;        // exited with status 0, not timed out
  // Why it failed, one line: "did not finish within ... s", else standard error's last non-empty line,
  // else the exit status or signal (for a result that is not ok()).
  std::string why(double timeout_s) const;
};

// Runs argv[0] (a path) without a shell, standard input from /dev/null, with `env_add` (NAME=value) over
// this process's environment, in its own process group, which is killed after timeout_s. Throws only when no pipe or temporary file can
// be made; a program that cannot start is a result with status -1.
ProcessResult run_process(const std::vector<std::string>& argv, const std::vector<std::string>& env_add = {},
                          double timeout_s = 600);

}  // namespace tessel
