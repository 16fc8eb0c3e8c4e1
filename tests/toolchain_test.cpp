// The CPU toolchain: compiling generated C++ to a shared object, the disk cache and dlopen.
#include "tessel/targets/cpu/toolchain.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
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

TEST(CpuFeatures, ListsVectorExtensions) {
#if defined(__x86_64__)
  EXPECT_NE(cpu_features().find("avx2"), std::string::npos) << cpu_features();
#endif
}

}  // namespace
}  // namespace tessel::cpu
