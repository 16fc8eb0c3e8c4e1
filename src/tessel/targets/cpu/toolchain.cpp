// Compiling generated C++ to a shared object, the content-hash disk cache with its checksums, and
// dlopen from a verified sealed copy.
#include "tessel/targets/cpu/toolchain.h"

#if defined(__x86_64__) && defined(__clang__)
#include <cpuid.h>
#endif
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <sstream>
#include <vector>

#include "tessel/support/error.h"
#include "tessel/support/limits.h"
#include "tessel/support/process.h"
#include "tessel/targets/cpu/cache_budget.h"
#include "tessel/targets/cpu/rt_header.h"

extern char** environ;

namespace tessel::cpu {

namespace fs = std::filesystem;

namespace {

// Bump when the cache layout or the meaning of a key changes. 2: kernels.so.sum holds its checksum.
constexpr const char* kCacheFormat = "tessel-cpu-cache-2";
constexpr const char* kSumFormat = "tessel-so-checksum-1";
// Generated kernels are tens to hundreds of KB; anything near this is not ours.
constexpr uint64_t kMaxSharedObjectBytes = uint64_t{1} << 30;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// A unique suffix for temporary files of this process (other processes differ in the pid).
// ".tessel-tmp.<pid>.<n>": the marker says tessel wrote it, so the sweep never takes a user's own
// "<name>.tmp.<pid>" for one of its temporaries (issue 41: the sweep once deleted such user files).
constexpr std::string_view kTempMarker = ".tessel-tmp.";

std::string temp_suffix() {
  static std::atomic<unsigned> counter{0};
  return std::string(kTempMarker) + std::to_string(getpid()) + "." + std::to_string(counter++);
}

// The checksum file's text: format, size, hash.
std::string sum_text(const Checksum& c) { return fmt::format("{} {} {}\n", kSumFormat, c.size, c.xxh3); }

Checksum read_sum(const std::string& path) {
  std::string text;
  try {
    text = read_regular_file(path, "checksum file", 256);
  } catch (const Error&) {
    throw Error(Location{.file = path}, "no checksum for kernels.so (a killed compile or a damaged entry)");
  }
  // Parsed without streams (no locale: a host program may set a global C++ locale), and the reason
  // names the field, so a damaged entry says how it is damaged.
  std::vector<std::string_view> fields;
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find_first_of(" \n", at);
    if (end != at) fields.push_back(std::string_view(text).substr(at, end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  auto damaged = [&](std::string_view why) {
    return Error(Location{.file = path}, fmt::format("damaged checksum file: {}", why));
  };
  if (fields.size() != 3) throw damaged(fmt::format("{} fields, expected 3", fields.size()));
  if (fields[0] != kSumFormat) throw damaged(fmt::format("format '{}', expected '{}'", fields[0], kSumFormat));
  Checksum c;
  const auto [end, ec] = std::from_chars(fields[1].data(), fields[1].data() + fields[1].size(), c.size);
  if (ec != std::errc() || end != fields[1].data() + fields[1].size()) throw damaged(fmt::format("size '{}'", fields[1]));
  c.xxh3 = std::string(fields[2]);
  if (c.xxh3.size() != 32 || c.xxh3.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw damaged(fmt::format("checksum '{}' is not 32 hex digits", fields[2]));
  return c;
}

// `pid` names no process (ESRCH; EPERM means it exists under another user).
bool process_gone(long pid) { return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

// The pid of a temporary's name `<anything>.tessel-tmp.<pid>[.<n>]` (pid: 1-9 digits, n: digits), or -1.
// Plain string matching: std::regex here once crashed when a program built by another g++ (the
// torch 2 Python extension on the GPU box) mixed its own instantiations of <regex> with these.
long temporary_pid(const std::string& name) {
  auto digits = [](std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  for (size_t at = name.rfind(kTempMarker); at != std::string::npos;
       at = at ? name.rfind(kTempMarker, at - 1) : std::string::npos) {
    std::string_view rest = std::string_view(name).substr(at + kTempMarker.size());
    const size_t dot = rest.find('.');
    const std::string_view pid = rest.substr(0, dot);
    if (pid.size() > 9 || !digits(pid)) continue;
    if (dot != std::string_view::npos && !digits(rest.substr(dot + 1))) continue;
    return std::stol(std::string(pid));
  }
  return -1;
}

// A folder or file tessel made itself: this user's, and not a symbolic link (never followed).
bool own_entry(const fs::path& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0 && !S_ISLNK(st.st_mode) && st.st_uid == ::geteuid();
}

void sweep_dir(const fs::path& dir) {
  if (!own_entry(dir)) return;
  const auto now = fs::file_time_type::clock::now();
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const long pid = temporary_pid(it->path().filename().string());
    if (pid < 0 || !own_entry(it->path())) continue;
    std::error_code tec;
    const auto mtime = fs::last_write_time(it->path(), tec);
    if (tec) continue;  // gone meanwhile (another process swept it)
    const auto age = now - mtime;
    const bool stale = age > std::chrono::hours(24) || (age > std::chrono::minutes(1) && process_gone(pid));
    if (stale) fs::remove_all(it->path(), tec);  // another process may sweep it at the same time
  }
}

struct CacheDir {
  std::string path;
  std::string chosen_by;  // what chose it, for error messages
};

CacheDir choose_cache_dir(const ToolchainOptions& o) {
  if (!o.cache_dir.empty()) return {o.cache_dir, "ToolchainOptions::cache_dir"};
  if (auto v = env("TESSEL_CACHE_DIR"); !v.empty()) return {v, "$TESSEL_CACHE_DIR"};
  if (auto v = env("XDG_CACHE_HOME"); !v.empty()) return {v + "/tessel", "$XDG_CACHE_HOME"};
  if (auto v = env("HOME"); !v.empty()) return {v + "/.cache/tessel", "$HOME"};
  fail("no cache directory for compiled kernels: set $TESSEL_CACHE_DIR (none of $TESSEL_CACHE_DIR, "
       "$XDG_CACHE_HOME, $HOME is set)");
}

// The cache folder, refused when someone else could write into it: tessel loads and runs the compiled
// code it finds there, and a checksum only detects damage (whoever swaps a kernels.so can rewrite its
// checksum too).
CacheDir resolve_cache_dir(const ToolchainOptions& o) {
  CacheDir c = choose_cache_dir(o);
  if (const std::string why = untrusted_reason(c.path); !why.empty())
    throw Error(Location{.file = c.path},
                fmt::format("the compile cache folder (chosen by {}) {}: tessel runs the code it finds there; use a folder "
                            "only you can write (chmod go-w, or another --cache-dir / $TESSEL_CACHE_DIR)",
                            c.chosen_by, why));
  return c;
}

std::string resolve_cxx(const ToolchainOptions& o) {
  if (!o.cxx.empty()) return o.cxx;
  if (auto v = env("TESSEL_CXX"); !v.empty()) return v;
  return "c++";
}

// Runs argv without a shell, stdin from /dev/null, stdout+stderr to `out_fd`; returns the wait status.
int run_program(const std::vector<std::string>& argv, int out_fd) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_fd, 1);
  posix_spawn_file_actions_adddup2(&actions, out_fd, 2);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) fail("cannot start the compiler '{}': {}", argv[0], std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) fail("waiting for the compiler '{}': {}", argv[0], std::strerror(errno));
  }
  return status;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

// The compiler's resolved path, size and modification time: enough to tell compilers and compiler
// upgrades apart without starting it (a cache hit never runs the compiler, not even --version).
std::string compiler_identity(const std::string& cxx, const std::string& chosen_by) {
  std::string path = find_program(cxx);
  if (path.empty()) fail("C++ compiler '{}' (from {}) not found or not executable", cxx, chosen_by);
  std::error_code ec;
  fs::path canonical = fs::canonical(path, ec);
  const std::string real = ec ? path : canonical.string();
  struct stat st {};
  if (::stat(real.c_str(), &st) != 0) fail("C++ compiler '{}' (from {}): {}", real, chosen_by, std::strerror(errno));
  return fmt::format("{}\n{} bytes, modified {}.{:09d}", real, static_cast<long long>(st.st_size),
                     static_cast<long long>(st.st_mtim.tv_sec), static_cast<long>(st.st_mtim.tv_nsec));
}

std::vector<std::string> flag_list(const ToolchainOptions& o) {
  std::vector<std::string> f = {"-std=c++17", "-fPIC", "-shared", "-fopenmp-simd", "-fno-math-errno",
                                "-fno-trapping-math", "-Wall", "-Wextra", "-Werror"};
  if (!o.opt.empty()) f.push_back(o.opt);
  if (o.native) {
    f.push_back("-march=native");
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) f.push_back("-mprefer-vector-width=512");
#endif
  }
  return f;
}

std::string hex_key(const std::vector<std::string_view>& parts) {
  ChecksumBuilder h;
  for (std::string_view p : parts) {
    const uint64_t n = p.size();  // length-prefixed so part boundaries cannot shift
    h.update(&n, sizeof n);
    h.update(p.data(), p.size());
  }
  return h.finish().xxh3;
}

// Writes `text` to `path` through a temporary file and rename(), so readers never see a partial file.
void write_atomically(const fs::path& path, std::string_view text, const CacheDir& cache) {
  std::string tmp = path.string() + temp_suffix();
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    f.close();
    if (!f) {
      std::remove(tmp.c_str());
      fail("cannot write '{}' in the kernel cache directory '{}' (chosen by {})", path.string(), cache.path,
           cache.chosen_by);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    std::remove(tmp.c_str());
    fail("cannot rename '{}' to '{}': {}", tmp, path.string(), std::strerror(e));
  }
}

std::string first_lines(const std::string& path, int n) {
  std::ifstream f(path);
  std::string out, line;
  int count = 0;
  while (std::getline(f, line)) {
    if (count++ == n) {
      out += "  ...\n";
      break;
    }
    out += "  " + line + "\n";
  }
  return out;
}

}  // namespace

namespace {

#ifndef MFD_EXEC
#define MFD_EXEC 0x0010U  // Linux 6.3: an executable memfd even where vm.memfd_noexec asks otherwise
#endif

// A sealed (unwritable, fixed-size) in-memory copy of `bytes`; returns its fd.
int sealed_copy(const std::string& bytes, const std::string& path) {
  int fd = ::memfd_create("tessel-kernels", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_EXEC);
  if (fd < 0 && errno == EINVAL) fd = ::memfd_create("tessel-kernels", MFD_CLOEXEC | MFD_ALLOW_SEALING);  // before 6.3
  if (fd < 0) fail("cannot load compiled kernels '{}': memfd_create: {}", path, std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      fail("cannot load compiled kernels '{}': copying into memory: {}", path, std::strerror(e));
    }
    done += static_cast<size_t>(n);
  }
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int e = errno;
    ::close(fd);
    fail("cannot load compiled kernels '{}': sealing the copy: {}", path, std::strerror(e));
  }
  return fd;
}

}  // namespace

std::shared_ptr<SharedObject> SharedObject::load_bytes(const std::string& bytes, const std::string& path) {
  const int fd = sealed_copy(bytes, path);
  const std::string name = "/proc/self/fd/" + std::to_string(fd);
  dlerror();
  void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    ::close(fd);
    fail("cannot load compiled kernels '{}': {}", path, e ? e : "dlopen failed");
  }
  return std::shared_ptr<SharedObject>(new SharedObject(h, fd, path, checksum_bytes(bytes.data(), bytes.size())));
}

std::shared_ptr<SharedObject> SharedObject::open_verified(const std::string& path, const Checksum& expected) {
  // (an entry someone else can write is not trusted, whatever its checksum says)
  for (const std::string& p : {fs::path(path).parent_path().string(), path})
    if (const std::string why = untrusted_reason(p); !why.empty())
      throw Error(Location{.file = p}, "cached code " + why + ": not loaded");
  // Bounded by the size expected: a manifest naming some large file costs no more than the real one.
  const std::string bytes = read_regular_file(path, "cached shared object", std::max<uint64_t>(1, std::min(expected.size, kMaxSharedObjectBytes)));
  const std::string why = checksum_mismatch(checksum_bytes(bytes.data(), bytes.size()), expected);
  if (!why.empty()) throw Error(Location{.file = path}, why);
  return load_bytes(bytes, path);
}

SharedObject::~SharedObject() {
  dlclose(handle_);
  // glibc finds loaded objects by name first: while one is still mapped (a library marked NODELETE,
  // e.g. by a GNU-unique symbol), /proc/self/fd/N must keep naming it, so its fd stays open.
  const std::string name = "/proc/self/fd/" + std::to_string(fd_);
  if (void* still = dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
    dlclose(still);
    return;
  }
  ::close(fd_);
}

void* SharedObject::symbol(const std::string& name) const {
  dlerror();
  void* p = dlsym(handle_, name.c_str());
  const char* e = dlerror();
  if (e || !p) fail("symbol '{}' not found in compiled kernels '{}'{}{}", name, path_, e ? ": " : "", e ? e : "");
  return p;
}

void report_cache_problem(const Error& e, const std::string& action) {
  static std::mutex mu;
  static std::set<std::string> reported;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!e.location().file.empty() && !reported.insert(e.location().file).second) return;
  }
  std::string one = fmt::format("tessel: cache: {}; {}", e.what(), action);
  for (char& c : one)
    if (c == '\n' || c == '\r') c = ' ';
  std::fprintf(stderr, "%s\n", one.c_str());
  std::fflush(stderr);
}

void sweep_stale_temporaries(const std::string& cache_root) {
  const fs::path root(cache_root);
  sweep_dir(root);
  std::error_code ec;
  // the entry folders: named by their content key (hex), never a link (a user's folder that sits in a
  // cache root, or a link to one, is not tessel's)
  auto is_key = [](const std::string& n) {
    return n.size() >= 16 && n.size() <= 64 &&
           std::all_of(n.begin(), n.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
  };
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code tec;
    if (it->is_directory(tec) && !it->is_symlink(tec) && is_key(it->path().filename().string())) sweep_dir(it->path());
  }
  sweep_dir(root / "exe");
  sweep_dir(root / "exe" / "files");
}

std::string untrusted_reason(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return {};  // absent: made by tessel, privately, when needed
  if (st.st_uid != ::geteuid()) return fmt::format("is owned by uid {}, not by this user (uid {})", st.st_uid, ::geteuid());
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return fmt::format("is writable by {} (mode {:o})", (st.st_mode & S_IWOTH) ? "every user" : "its group", st.st_mode & 07777);
  return {};
}

void create_private_directories(const std::string& path, std::error_code& ec) {
  ec.clear();
  fs::path at;
  for (const fs::path& part : fs::path(path)) {
    at /= part;
    if (::mkdir(at.c_str(), 0700) != 0 && errno != EEXIST) {
      ec = std::error_code(errno, std::generic_category());
      return;
    }
  }
}

std::string temporary_name(const std::string& name) { return name + temp_suffix(); }

std::string cache_directory(const ToolchainOptions& options) {
  return resolve_cache_dir(options).path;
}

std::string content_key(const std::vector<std::string_view>& parts) {
  return hex_key(parts);
}

std::string compile_flags(const ToolchainOptions& options) {
  std::string out;
  for (const auto& f : flag_list(options)) out += (out.empty() ? "" : " ") + f;
  return out;
}

std::string cpu_features() {
  std::string out;
#if defined(__x86_64__)
  __builtin_cpu_init();
#define TESSEL_FEATURE(name) \
  if (__builtin_cpu_supports(name)) out += (out.empty() ? "" : " ") + std::string(name);
  TESSEL_FEATURE("avx512f")
  TESSEL_FEATURE("avx512bw")
  TESSEL_FEATURE("avx512dq")
  TESSEL_FEATURE("avx512vl")
  TESSEL_FEATURE("avx512vnni")
  TESSEL_FEATURE("avx512bf16")
#if defined(__clang__)
  // clang 14's __builtin_cpu_supports knows neither avx512fp16 nor f16c (the sanitized build): their
  // CPUID bits, leaf 7 EDX 23 and leaf 1 ECX 29.
  unsigned a = 0, b = 0, c = 0, d = 0;
#define TESSEL_CPUID_FEATURE(name, leaf, reg, bit)                   \
  if (__get_cpuid_count(leaf, 0, &a, &b, &c, &d) && ((reg) >> (bit) & 1u)) \
    out += (out.empty() ? "" : " ") + std::string(name);
  TESSEL_CPUID_FEATURE("avx512fp16", 7, d, 23)
  TESSEL_FEATURE("avx2")
  TESSEL_FEATURE("fma")
  TESSEL_CPUID_FEATURE("f16c", 1, c, 29)
#undef TESSEL_CPUID_FEATURE
#else
  TESSEL_FEATURE("avx512fp16")
  TESSEL_FEATURE("avx2")
  TESSEL_FEATURE("fma")
  TESSEL_FEATURE("f16c")
#endif
  TESSEL_FEATURE("sse4.2")
#undef TESSEL_FEATURE
#endif
  return out;
}

BuildResult build_shared_object(const std::string& source, const std::string& name_hint,
                                const ToolchainOptions& options, const std::vector<std::string>& required_symbols) {
  const CacheDir cache = resolve_cache_dir(options);
  const std::string cxx = resolve_cxx(options);
  const std::string identity =
      compiler_identity(cxx, options.cxx.empty() && !env("TESSEL_CXX").empty() ? "$TESSEL_CXX" : "ToolchainOptions::cxx");
  const std::vector<std::string> flags = flag_list(options);
  const std::string flags_text = compile_flags(options);
  // The CPU's features are part of the key: -march=native code must not be loaded on another CPU
  // that shares the cache directory.
  const std::string cpu = options.native ? cpu_features() : "";
  const std::string_view header = rt_header_text();

  BuildResult r;
  r.key = hex_key({kCacheFormat, identity, flags_text, cpu, header, source});
  const fs::path dir = fs::path(cache.path) / r.key;
  const fs::path src = dir / "kernels.cpp";
  const fs::path so = dir / "kernels.so";
  r.source_path = src.string();
  r.so_path = so.string();

  const fs::path sum = dir / "kernels.so.sum";
  // Read under the entry's lock (the pruner skips it); busy: the pruner is removing it, a miss.
  if (const EntryUse use(dir.string()); options.use_cache && !use.busy() && access(so.c_str(), F_OK) == 0) {
    auto t0 = std::chrono::steady_clock::now();
    try {
      r.so = SharedObject::open_verified(r.so_path, read_sum(sum.string()));
      for (const std::string& s : required_symbols) r.so->symbol(s);
      r.load_seconds = seconds_since(t0);
      r.cache_hit = true;
      mark_used(dir.string());
      return r;
    } catch (const Error& e) {
      r.so.reset();
      report_cache_problem(e, "compiling it again");
    }
  }

  sweep_stale_temporaries(cache.path);
  std::error_code ec;
  // Compiled under the entry's lock, so the pruner leaves the folder alone; a folder it is removing
  // at this moment is made again.
  std::optional<EntryUse> writing;
  for (int attempt = 0; attempt < 3 && !(writing && writing->held()); ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    create_private_directories(dir.string(), ec);
    writing.emplace(dir.string());
  }
  if (ec || access(dir.c_str(), W_OK) != 0) {
    fail("cannot create or write the kernel cache directory '{}' (chosen by {}): {}", dir.string(),
         cache.chosen_by, ec ? ec.message() : std::strerror(errno));
  }
  write_atomically(dir / "tessel_rt.h", header, cache);
  write_atomically(src, source, cache);

  const std::string tmp_so = r.so_path + temp_suffix();
  const std::string log = (dir / "compile.log").string() + temp_suffix();
  std::vector<std::string> argv = {find_program(cxx)};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), {"-o", tmp_so, r.source_path, "-lm"});

  int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) fail("cannot write '{}' (kernel cache chosen by {}): {}", log, cache.chosen_by, std::strerror(errno));
  auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  try {
    status = run_program(argv, log_fd);
  } catch (...) {
    ::close(log_fd);
    std::remove(log.c_str());
    throw;
  }
  ::close(log_fd);
  r.compile_seconds = seconds_since(t0);
  const std::string final_log = (dir / "compile.log").string();
  std::rename(log.c_str(), final_log.c_str());

  if (status != 0) {
    std::remove(tmp_so.c_str());
    fail("the C++ compiler failed ({}) on the kernels of '{}'; source kept at {}\n  command: {} {} -o {} {} -lm\n"
         "  diagnostics ({}):\n{}",
         describe_status(status), name_hint, r.source_path, argv[0], flags_text, so.string(), r.source_path,
         final_log, first_lines(final_log, 20));
  }
  // Loaded from the bytes just read, so what runs is what the checksum describes. The checksum is
  // renamed into place before the shared object: a reader never finds a new kernels.so with no
  // checksum (which it would report as damage); one that finds the new checksum with the old file
  // reports a mismatch, as it would have to anyway.
  std::string bytes;
  try {
    bytes = read_regular_file(tmp_so, "compiled shared object", kMaxSharedObjectBytes);
    t0 = std::chrono::steady_clock::now();
    r.so = SharedObject::load_bytes(bytes, r.so_path);
    r.load_seconds = seconds_since(t0);
    for (const std::string& s : required_symbols) r.so->symbol(s);
    write_atomically(sum, sum_text(r.so->checksum()), cache);
  } catch (...) {
    std::remove(tmp_so.c_str());
    throw;
  }
  if (std::rename(tmp_so.c_str(), r.so_path.c_str()) != 0) {
    int e = errno;
    std::remove(tmp_so.c_str());
    fail("cannot rename '{}' to '{}': {}", tmp_so, r.so_path, std::strerror(e));
  }
  writing.reset();
  after_store(cache.path, dir.string(), fmt::format("the compiled kernels of '{}' ({})", name_hint, dir.string()), options);
  return r;
}

}  // namespace tessel::cpu
