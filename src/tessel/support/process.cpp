// Child processes (see process.h).
#include "tessel/support/process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "tessel/support/error.h"

extern char** environ;

namespace tessel {

std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string p = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

bool ProcessResult::ok() const { return !timed_out && status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

std::string ProcessResult::why(double timeout_s) const {
  if (timed_out) return fmt::format("did not finish within {:.0f} s", timeout_s);
  std::string last;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  if (!last.empty()) return last.size() > 300 ? last.substr(0, 300) + "..." : last;
  if (status >= 0 && WIFEXITED(status)) return fmt::format("exit status {}", WEXITSTATUS(status));
  if (status >= 0 && WIFSIGNALED(status)) return fmt::format("signal {}", WTERMSIG(status));
  return "did not start";
}

ProcessResult run_process(const std::vector<std::string>& argv, const std::vector<std::string>& env_add, double timeout_s) {
  ProcessResult c;
  const char* tmp = std::getenv("TMPDIR");
  std::string err_path = std::string(tmp && *tmp ? tmp : "/tmp") + "/tessel-process-XXXXXX";
  const int err_fd = ::mkstemp(err_path.data());
  if (err_fd < 0) throw Error(Location{.file = err_path}, fmt::format("cannot create a temporary file for {}'s errors", argv[0]));
  ::unlink(err_path.c_str());
  int out[2];
  if (::pipe(out) != 0) {
    ::close(err_fd);
    throw Error(Location{}, "cannot create a pipe");
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);  // (a child that reads stdin gets EOF)
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  std::vector<std::string> env_text;
  for (char** e = environ; *e; ++e) env_text.emplace_back(*e);
  for (const std::string& kv : env_add) {
    const std::string key = kv.substr(0, kv.find('=') + 1);
    std::erase_if(env_text, [&](const std::string& e) { return e.starts_with(key); });
    env_text.push_back(kv);
  }
  std::vector<char*> args, envp;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const std::string& e : env_text) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0].c_str(), &fa, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(out[1]);
  if (rc != 0) {
    ::close(out[0]);
    ::close(err_fd);
    c.err = fmt::format("cannot start {}: {}", argv[0], std::strerror(rc));
    return c;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[4096];
  for (;;) {
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      c.timed_out = true;
      ::kill(-pid, SIGKILL);
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min(left * 1e3 + 1, 1000.0)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    const ssize_t got = ::read(out[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    if (c.out.size() < (16u << 20)) c.out.append(buf, static_cast<size_t>(got));  // (a peer prints one line)
  }
  ::close(out[0]);
  // (a child that closed its output but does not exit is killed at the same deadline)
  for (;;) {
    const pid_t w = ::waitpid(pid, &c.status, WNOHANG);
    if (w == pid || (w < 0 && errno != EINTR)) break;
    if (!c.timed_out && std::chrono::steady_clock::now() >= deadline) {
      c.timed_out = true;
      ::kill(-pid, SIGKILL);
    }
    if (c.timed_out) {
      while (::waitpid(pid, &c.status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
    ::usleep(10000);
  }
  const off_t size = ::lseek(err_fd, 0, SEEK_END);
  const off_t from = size > 4096 ? size - 4096 : 0;
  ::lseek(err_fd, from, SEEK_SET);
  for (ssize_t n; (n = ::read(err_fd, buf, sizeof buf)) > 0;) c.err.append(buf, static_cast<size_t>(n));
  ::close(err_fd);
  return c;
}

}  // namespace tessel
