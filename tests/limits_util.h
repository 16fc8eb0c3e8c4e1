// Runs a hostile case in a child process bounded in memory and time, so that a regression (an
// unbounded allocation, an endless loop) fails the test instead of swapping or hanging the suite.
#pragma once

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <string>

#include "tessel/support/error.h"

#if defined(__SANITIZE_ADDRESS__)
#define TESSEL_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TESSEL_TEST_UNDER_ASAN 1
#endif
#endif

namespace tessel::testenv {

struct Outcome {
  bool error = false;   // the child caught a tessel::Error
  std::string message;  // its text; "no error"; "exception: ..."; or how the child ended
};

// The bytes of address space this process has mapped now.
inline uint64_t mapped_bytes() {
  unsigned long long pages = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%llu", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  return pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// Runs `fn` in a forked child with at most 1 GiB of address space beyond what is mapped now and
// `seconds` of wall time (SIGALRM ends it). The child does not return into the test.
inline Outcome bounded(const std::function<void()>& fn, unsigned seconds = 20) {
  int fds[2];
  if (pipe(fds) != 0) return {false, "pipe failed"};
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return {false, "fork failed"};
  if (pid == 0) {
    close(fds[0]);
#ifndef TESSEL_TEST_UNDER_ASAN
    // (Not under ASan: its allocator reserves address space of its own as it goes.)
    const rlim_t cap = mapped_bytes() + (rlim_t{1} << 30);
    const rlimit rl{cap, cap};
    setrlimit(RLIMIT_AS, &rl);
#endif
    alarm(seconds);
    std::string msg;
    char kind = 'n';
    try {
      fn();
      msg = "no error";
    } catch (const Error& e) {
      kind = 'e';
      msg = e.what();
    } catch (const std::exception& e) {
      msg = std::string("exception: ") + e.what();
    }
    const std::string out = kind + msg;
    if (write(fds[1], out.data(), out.size()) < 0) _exit(2);
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n = 0;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  if (WIFSIGNALED(st))
    return {false, std::string("killed by signal ") + strsignal(WTERMSIG(st)) +
                       (WTERMSIG(st) == SIGALRM ? " (ran past the time bound)" : "")};
  if (out.empty()) return {false, "the child reported nothing"};
  return {out[0] == 'e', out.substr(1)};
}

}  // namespace tessel::testenv
