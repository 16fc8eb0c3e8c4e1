// The CPU toolchain: compiling generated C++ to a shared object, the disk cache and dlopen.
#include "tessel/targets/cpu/toolchain.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>


#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "tessel/support/error.h"
#include "test_util.h"

namespace tessel::cpu {
namespace {

namespace fs = std::filesystem;

// A fresh cache directory per test, removed afterwards.
class ToolchainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "tessel-tc-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    opts_.cache_dir = root_ + "/cache";
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(root_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(root_, ec);
  }
  // A compiler wrapper that appends one line to `log` per compile and then runs c++; --version is
  // answered without logging so only real compiles count.
  std::string counting_compiler(const std::string& log) {
    std::string path = root_ + "/cxx-wrapper";
    std::ofstream(path) << "#!/bin/sh\nif [ \"$1\" = --version ]; then exec c++ --version; fi\n"
                        << "echo compile >> '" << log << "'\nexec c++ \"$@\"\n";
    chmod(path.c_str(), 0755);
    return path;
  }
  static int count_lines(const std::string& path) {
    std::ifstream f(path);
    int n = 0;
    for (std::string line; std::getline(f, line);) ++n;
    return n;
  }
  std::string root_;
  ToolchainOptions opts_;
};

const char* kAxpy = R"(#include "tessel_rt.h"
extern "C" void axpy(float a, const float* x, float* y, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) y[i] = a * x[i] + y[i];
}
)";

TEST_F(ToolchainTest, CompilesLoadsAndCallsASymbol) {
  BuildResult r = build_shared_object(kAxpy, "axpy", opts_);
  EXPECT_FALSE(r.cache_hit);
  EXPECT_GT(r.compile_seconds, 0);
  EXPECT_EQ(r.key.size(), 32u);
  EXPECT_TRUE(fs::exists(r.so_path));
  EXPECT_EQ(testenv::read_text(r.source_path), kAxpy);
  EXPECT_TRUE(fs::exists(fs::path(r.source_path).parent_path() / "tessel_rt.h"));
  auto* axpy = r.so->function<void(float, const float*, float*, int)>("axpy");
  std::vector<float> x(37), y(37), want(37);
  for (int i = 0; i < 37; ++i) {
    x[i] = 0.25f * i - 3;
    y[i] = 1.5f - i;
    want[i] = static_cast<float>(2.0 * x[i] + y[i]);
  }
  axpy(2.0f, x.data(), y.data(), 37);
  EXPECT_EQ(y, want);
}

TEST_F(ToolchainTest, SecondBuildIsACacheHitWithoutStartingTheCompiler) {
  const std::string log = root_ + "/compiles.log";
  opts_.cxx = counting_compiler(log);
  BuildResult first = build_shared_object(kAxpy, "axpy", opts_);
  EXPECT_FALSE(first.cache_hit);
  EXPECT_EQ(count_lines(log), 1);
  BuildResult second = build_shared_object(kAxpy, "axpy", opts_);
  EXPECT_TRUE(second.cache_hit);
  EXPECT_EQ(second.compile_seconds, 0);
  EXPECT_EQ(second.key, first.key);
  EXPECT_EQ(second.so_path, first.so_path);
  EXPECT_EQ(count_lines(log), 1);  // the compiler was not started again
  EXPECT_NE(second.so->symbol("axpy"), nullptr);

  // use_cache = false compiles again into the same entry.
  opts_.use_cache = false;
  BuildResult third = build_shared_object(kAxpy, "axpy", opts_);
  EXPECT_FALSE(third.cache_hit);
  EXPECT_EQ(third.key, first.key);
  EXPECT_EQ(count_lines(log), 2);
}

TEST_F(ToolchainTest, KeyDependsOnSourceAndFlags) {
  BuildResult a = build_shared_object(kAxpy, "axpy", opts_);
  std::string other = std::string(kAxpy) + "extern \"C\" int answer() { return 42; }\n";
  BuildResult b = build_shared_object(other, "axpy2", opts_);
  EXPECT_NE(a.key, b.key);
  EXPECT_FALSE(b.cache_hit);
  EXPECT_EQ(b.so->function<int()>("answer")(), 42);
  opts_.native = false;
  BuildResult c = build_shared_object(kAxpy, "axpy", opts_);
  EXPECT_NE(c.key, a.key);
  EXPECT_EQ(compile_flags(opts_).find("-march=native"), std::string::npos);
  opts_.native = true;
  opts_.opt = "-O1";
  EXPECT_NE(build_shared_object(kAxpy, "axpy", opts_).key, a.key);
}

TEST_F(ToolchainTest, MissingSymbolNamesSymbolAndFile) {
  BuildResult r = build_shared_object(kAxpy, "axpy", opts_);
  try {
    r.so->symbol("no_such_kernel");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_kernel"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(r.so_path), std::string::npos) << e.what();
  }
}

TEST_F(ToolchainTest, CompilerErrorKeepsSourceAndQuotesDiagnostics) {
  const std::string broken = "extern \"C\" int f() { return undeclared_name_xyz; }\n";
  try {
    build_shared_object(broken, "broken_model", opts_);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("compiler failed"), std::string::npos) << msg;
    EXPECT_NE(msg.find("broken_model"), std::string::npos) << msg;
    EXPECT_NE(msg.find("undeclared_name_xyz"), std::string::npos) << msg;
    auto pos = msg.find(opts_.cache_dir);
    ASSERT_NE(pos, std::string::npos) << msg;
    std::string path = msg.substr(pos, msg.find("kernels.cpp", pos) + 11 - pos);
    EXPECT_EQ(testenv::read_text(path), broken);
  }
  // Nothing was cached: a second attempt fails the same way rather than loading something.
  EXPECT_THROW(build_shared_object(broken, "broken_model", opts_), Error);
}

TEST_F(ToolchainTest, WarningsAreErrors) {
  EXPECT_THROW(build_shared_object("extern \"C\" int f(int x) { int unused; return x; }\n", "w", opts_), Error);
}

TEST_F(ToolchainTest, UnwritableCacheDirIsAnError) {
  if (geteuid() == 0) {
    // root ignores permission bits: use a path below a regular file instead.
    std::ofstream(root_ + "/file") << "x";
    opts_.cache_dir = root_ + "/file/cache";
  } else {
    fs::create_directories(root_ + "/ro");
    fs::permissions(root_ + "/ro", fs::perms::owner_read | fs::perms::owner_exec);
    opts_.cache_dir = root_ + "/ro/cache";
  }
  try {
    build_shared_object(kAxpy, "axpy", opts_);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(opts_.cache_dir), std::string::npos) << msg;
    EXPECT_NE(msg.find("ToolchainOptions::cache_dir"), std::string::npos) << msg;
  }
}

TEST_F(ToolchainTest, CacheDirFromEnvironmentIsNamedInErrors) {
  std::ofstream(root_ + "/file") << "x";
  const char* old = std::getenv("TESSEL_CACHE_DIR");
  std::string saved = old ? old : "";
  setenv("TESSEL_CACHE_DIR", (root_ + "/file/sub").c_str(), 1);
  opts_.cache_dir.clear();
  try {
    build_shared_object(kAxpy, "axpy", opts_);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("$TESSEL_CACHE_DIR"), std::string::npos) << e.what();
  }
  if (old) setenv("TESSEL_CACHE_DIR", saved.c_str(), 1); else unsetenv("TESSEL_CACHE_DIR");
}

TEST_F(ToolchainTest, MissingCompilerIsAnError) {
  opts_.cxx = root_ + "/no-such-compiler";
  try {
    build_shared_object(kAxpy, "axpy", opts_);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-compiler"), std::string::npos) << e.what();
  }
}

// Damaged compile-cache entries (issue 12): each is reported once on stderr (one line naming
// kernels.so) and rebuilt, and the kernels then compute the right thing. The load runs in a child
// process ("threadsafe" death-test style: the child re-runs the test up to the statement), because
// before integrity checks a damaged kernels.so killed the process with SIGBUS or SIGSEGV.
bool axpy_works(const SharedObject& so) {
  auto* axpy = so.function<void(float, const float*, float*, int)>("axpy");
  std::vector<float> x(37), y(37), want(37);
  for (int i = 0; i < 37; ++i) {
    x[i] = 0.25f * static_cast<float>(i) - 3;
    y[i] = 1.5f - static_cast<float>(i);
    want[i] = static_cast<float>(2.0 * x[i] + y[i]);
  }
  axpy(2.0f, x.data(), y.data(), 37);
  return y == want;
}

// The body of a child process: its return value is the exit status (an exception: 4); the child
// removes its own copy of the test's directory (it re-ran SetUp) before exiting.
[[noreturn]] void child_exit(const std::function<int()>& body, const std::string& root) {
  int rc = 0;
  try {
    rc = body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected error: %s\n", e.what());
    rc = 4;
  }
  std::error_code ec;
  fs::remove_all(root, ec);
  std::fflush(stderr);
  std::_Exit(rc);
}

// Exactly one line on stderr, naming kernels.so.
constexpr const char* kOneReportLine = "^[^\n]*kernels\\.so[^\n]*\n$";

// In a child: the next build is a miss (exit 2 on a hit) that computes the right thing (else 3).
#define EXPECT_REBUILT_IN_CHILD(opts, root)                                                         \
  do {                                                                                             \
    GTEST_FLAG_SET(death_test_style, "threadsafe");                                                \
    EXPECT_EXIT(child_exit(                                                                        \
                    [&] {                                                                          \
                      BuildResult again = build_shared_object(kAxpy, "axpy", opts);                \
                      return again.cache_hit ? 2 : axpy_works(*again.so) ? 0 : 3;                  \
                    },                                                                             \
                    root),                                                                         \
                ::testing::ExitedWithCode(0), kOneReportLine);                                     \
  } while (0)

TEST_F(ToolchainTest, TruncatedSharedObjectIsReportedAndRebuilt) {
  BuildResult r = build_shared_object(kAxpy, "axpy", opts_);
  r.so.reset();
  fs::resize_file(r.so_path, fs::file_size(r.so_path) * 6 / 10);  // a disk that filled up, a killed copy
  EXPECT_REBUILT_IN_CHILD(opts_, root_);
}

TEST_F(ToolchainTest, BitFlippedSharedObjectIsReportedAndRebuilt) {
  BuildResult r = build_shared_object(kAxpy, "axpy", opts_);
  r.so.reset();
  {
    std::fstream f(r.so_path, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(fs::file_size(r.so_path) / 2);
    f.seekg(at);
    char c = 0;
    f.get(c);
    f.seekp(at);
    f.put(static_cast<char>(c ^ 0x10));
  }
  EXPECT_REBUILT_IN_CHILD(opts_, root_);
}

// Another build's kernels.so (and its checksum, when there is one) in this entry's place: the
// checksum matches, but a symbol the caller needs is missing. Before: "symbol not found" forever.
TEST_F(ToolchainTest, SharedObjectMissingARequiredSymbolIsRebuilt) {
  BuildResult good = build_shared_object(kAxpy, "axpy", opts_);
  BuildResult other = build_shared_object("extern \"C\" int answer() { return 42; }\n", "other", opts_);
  good.so.reset();
  other.so.reset();
  for (const char* f : {"kernels.so", "kernels.so.sum"}) {
    std::error_code ec;
    fs::copy_file(fs::path(other.so_path).parent_path() / f, fs::path(good.so_path).parent_path() / f,
                  fs::copy_options::overwrite_existing, ec);
  }
  testing::internal::CaptureStderr();
  BuildResult again = build_shared_object(kAxpy, "axpy", opts_, {"axpy"});
  const std::string report = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(again.cache_hit);
  EXPECT_TRUE(axpy_works(*again.so));
  EXPECT_NE(report.find("axpy"), std::string::npos) << report;
  EXPECT_EQ(std::count(report.begin(), report.end(), '\n'), 1) << report;
  EXPECT_TRUE(build_shared_object(kAxpy, "axpy", opts_, {"axpy"}).cache_hit);
}

// A kernels.so changed after its checksum was checked is never what runs: the bytes loaded are the
// bytes hashed (a private sealed copy). Rewriting the file while loaded does not change the code.
TEST_F(ToolchainTest, LoadedBytesAreTheCheckedBytes) {
  BuildResult r = build_shared_object(kAxpy, "axpy", opts_);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(child_exit(
                  [&] {
                    BuildResult hit = build_shared_object(kAxpy, "axpy", opts_);
                    if (!hit.cache_hit) return 2;
                    {
                      std::ofstream f(r.so_path, std::ios::binary | std::ios::trunc);  // in place, same inode
                      f << "garbage";
                    }
                    return axpy_works(*hit.so) && axpy_works(*r.so) ? 0 : 3;
                  },
                  root_),
              ::testing::ExitedWithCode(0), "^$");
}

// Killed compiles leave `*.tessel-tmp.<pid>[.<n>]` behind; the next write into the cache sweeps those of
// dead processes (after a minute's grace) and any older than a day, and keeps a live one's.
TEST_F(ToolchainTest, StaleTemporaryFilesAreSwept) {
  BuildResult r = build_shared_object(kAxpy, "axpy", opts_);
  const fs::path dir = fs::path(r.so_path).parent_path();
  const pid_t dead = [] {
    const pid_t p = fork();
    if (p == 0) std::_Exit(0);
    waitpid(p, nullptr, 0);
    return p;
  }();
  auto make = [&](const std::string& name, std::chrono::minutes age) {
    const fs::path p = dir / name;
    std::ofstream(p) << "partial";
    fs::last_write_time(p, fs::file_time_type::clock::now() - age);
    return p;
  };
  const fs::path dead_old = make(fmt::format("kernels.so.tessel-tmp.{}.0", dead), std::chrono::minutes(5));
  const fs::path dead_log = make(fmt::format("compile.log.tessel-tmp.{}.3", dead), std::chrono::minutes(5));
  const fs::path live_fresh = make(fmt::format("kernels.so.tessel-tmp.{}.7", getpid()), std::chrono::minutes(5));
  const fs::path live_ancient = make(fmt::format("kernels.cpp.tessel-tmp.{}.8", getpid()), std::chrono::hours(25));
  const fs::path not_tmp = make("notes.tmp.txt", std::chrono::hours(25));
  build_shared_object("extern \"C\" int answer() { return 42; }\n", "other", opts_);  // a miss: writes
  EXPECT_FALSE(fs::exists(dead_old));
  EXPECT_FALSE(fs::exists(dead_log));
  EXPECT_TRUE(fs::exists(live_fresh));
  EXPECT_FALSE(fs::exists(live_ancient));
  EXPECT_TRUE(fs::exists(not_tmp));
}

// issue 41: the sweep never touches what is not tessel's -- a user's own `NAME.tmp.PID` files and folders
// in a cache root that is also their folder, a folder one level down that is not an entry, and what a
// symbolic link in the cache points at -- however old, whoever's pid.
TEST_F(ToolchainTest, TheSweepTouchesOnlyTesselsTemporaries) {
  const pid_t dead = [] {
    const pid_t p = fork();
    if (p == 0) std::_Exit(0);
    waitpid(p, nullptr, 0);
    return p;
  }();
  const fs::path cache(opts_.cache_dir);
  fs::create_directories(cache);
  const auto old = fs::file_time_type::clock::now() - std::chrono::hours(48);
  auto make_file = [&](const fs::path& p) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << "the user's";
    fs::last_write_time(p, old);
    return p;
  };
  const fs::path user_file = make_file(cache / fmt::format("thesis.tmp.{}", dead));
  const fs::path user_dir = cache / fmt::format("photos.tmp.{}", dead);
  make_file(user_dir / "a.jpg");
  fs::last_write_time(user_dir, old);
  const fs::path nested = make_file(cache / "projects" / fmt::format("draft.tessel-tmp.{}.0", dead));
  const fs::path elsewhere = fs::path(root_) / "elsewhere";
  const fs::path linked = make_file(elsewhere / fmt::format("notes.tessel-tmp.{}.1", dead));
  fs::create_directory_symlink(elsewhere, cache / "0123456789abcdef");   // a link named like an entry
  fs::create_symlink(elsewhere, cache / fmt::format("link.tessel-tmp.{}.2", dead));
  build_shared_object("extern \"C\" int answer() { return 42; }\n", "other", opts_);  // a miss: writes, sweeps
  EXPECT_TRUE(fs::exists(user_file));
  EXPECT_TRUE(fs::exists(user_dir / "a.jpg"));
  EXPECT_TRUE(fs::exists(nested));
  EXPECT_TRUE(fs::exists(linked));
  EXPECT_TRUE(fs::is_symlink(cache / fmt::format("link.tessel-tmp.{}.2", dead)));
}

// issue 41: a cache folder another user can write is refused (tessel would run the code it finds there),
// as is one owned by someone else; tessel makes its own folders private (0700) whatever the umask.
TEST_F(ToolchainTest, ACacheOthersCanWriteIsRefused) {
  fs::create_directories(opts_.cache_dir);
  ::chmod(opts_.cache_dir.c_str(), 01777);
  try {
    build_shared_object(kAxpy, "axpy", opts_);
    FAIL() << "a world-writable cache was used";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("writable by every user (mode 1777)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(opts_.cache_dir), std::string::npos) << e.what();
  }
  ::chmod(opts_.cache_dir.c_str(), 0775);
  EXPECT_THROW(build_shared_object(kAxpy, "axpy", opts_), Error);
  if (::geteuid() == 0) {
    ::chmod(opts_.cache_dir.c_str(), 0755);
    ASSERT_EQ(::chown(opts_.cache_dir.c_str(), 65534, 65534), 0);
    try {
      build_shared_object(kAxpy, "axpy", opts_);
      FAIL() << "a cache owned by another user was used";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is owned by uid 65534"), std::string::npos) << e.what();
    }
    ASSERT_EQ(::chown(opts_.cache_dir.c_str(), 0, 0), 0);
  }
  const mode_t was = ::umask(0);
  opts_.cache_dir = root_ + "/fresh/cache";
  BuildResult r = build_shared_object(kAxpy, "axpy", opts_);
  ::umask(was);
  struct stat st;
  for (const fs::path& p : {fs::path(root_) / "fresh" / "cache", fs::path(r.so_path).parent_path()}) {
    ASSERT_EQ(::stat(p.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u) << p;
  }
}

// issue 41: an entry someone else could have swapped (group-writable kernels.so) is not loaded, whatever
// its checksum says: it is compiled again.
TEST_F(ToolchainTest, AnEntryOthersCanWriteIsNotLoaded) {
  BuildResult r = build_shared_object(kAxpy, "axpy", opts_);
  ::chmod(r.so_path.c_str(), 0664);
  testing::internal::CaptureStderr();
  BuildResult again = build_shared_object(kAxpy, "axpy", opts_);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(again.cache_hit);
  EXPECT_NE(err.find("writable by its group"), std::string::npos) << err;
}

TEST(CpuFeatures, ListsVectorExtensions) {
#if defined(__x86_64__)
  EXPECT_NE(cpu_features().find("avx2"), std::string::npos) << cpu_features();
#endif
}

}  // namespace
}  // namespace tessel::cpu
