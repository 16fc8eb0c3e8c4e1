// The cache's size bound (cache_budget.h): least-recently-used entries go after a store, a hit
// keeps an entry, an entry over the whole budget is not stored, entries in use and anything that is
// not a cache entry stay, and an executable loaded from an entry keeps running once it is pruned.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "test_util.h"
#include "tessel/driver/compile_model.h"
#include "tessel/support/error.h"
#include "tessel/targets/cpu/cache_budget.h"

using namespace tessel;
namespace fs = std::filesystem;

namespace {

class CacheBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / fmt::format("tessel-budget-{}-{}", static_cast<long>(getpid()),
                                                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    cache_ = (root_ / "cache").string();
  }
  void TearDown() override { fs::remove_all(root_); }

  // A MatMul + Relu model whose weights depend on `seed`: models of one seed share an entry, all
  // share one compiled kernels entry (the same generated source), and each has packed weights.
  std::string model(int seed) {
    const std::string path = (root_ / fmt::format("m{}.tsl", seed)).string();
    std::ofstream f(path);
    f << "graph @m(%x: f32[4,64]) {\n  const %w: f32[64,256] = [";
    for (int i = 0; i < 64 * 256; ++i) f << (i ? ", " : "") << static_cast<float>((i + seed) % 7 - 3);
    f << "]\n  %y: f32[4,256] = MatMul(%x, %w) loc(\"mm\")\n  %z: f32[4,256] = Relu(%y) loc(\"relu\")\n  return %z\n}\n";
    return path;
  }

  ModelCompile compile(int seed, std::optional<uint64_t> budget = uint64_t{1} << 30) {
    ModelCompileOptions o;
    o.backend.threads = 1;
    o.backend.toolchain.cache_dir = cache_;
    o.backend.toolchain.max_cache_bytes = budget;
    return compile_model_cpu(model(seed), {input()}, o);
  }

  static Tensor input() {
    Tensor x(DType::f32, {4, 64});
    for (int64_t i = 0; i < x.numel(); ++i) x.set_f(i, static_cast<double>(i % 5) - 2);
    return x;
  }

  std::vector<cpu::CacheEntry> entries(cpu::EntryKind kind) const {
    std::vector<cpu::CacheEntry> out;
    for (const cpu::CacheEntry& e : cpu::list_cache(cache_))
      if (e.kind == kind) out.push_back(e);
    return out;
  }

  // Folder mtimes are the recency: steps a clock tick apart so that they differ (no time is measured).
  static void next_tick() { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }

  fs::path root_;
  std::string cache_;
};

}  // namespace

TEST_F(CacheBudgetTest, OldestEntriesGoAndTheMostRecentlyHitOneStays) {
  ModelCompile a = compile(1);
  next_tick();
  ModelCompile b = compile(2);
  next_tick();
  ModelCompile c = compile(3);
  ASSERT_FALSE(a.entry_dir.empty() || b.entry_dir.empty() || c.entry_dir.empty()) << a.not_stored;
  ASSERT_EQ(entries(cpu::EntryKind::executable).size(), 3u);
  ASSERT_EQ(entries(cpu::EntryKind::kernels).size(), 1u);
  next_tick();
  EXPECT_TRUE(compile(1).entry_hit);  // a hit: a is now the most recently used entry
  next_tick();
  // Room for the kernels and two entries and a half: storing a fourth removes b and then c.
  const uint64_t kernels = entries(cpu::EntryKind::kernels)[0].bytes;
  const uint64_t entry = cpu::folder_bytes(a.entry_dir);
  ModelCompile d = compile(4, kernels + 2 * entry + entry / 2);
  ASSERT_FALSE(d.entry_dir.empty()) << d.not_stored;
  EXPECT_TRUE(fs::exists(a.entry_dir));
  EXPECT_FALSE(fs::exists(b.entry_dir));
  EXPECT_FALSE(fs::exists(c.entry_dir));
  EXPECT_TRUE(fs::exists(d.entry_dir));
  EXPECT_EQ(entries(cpu::EntryKind::kernels).size(), 1u) << "the kernels a kept entry uses stay";
  ModelCompile again = compile(1);
  EXPECT_TRUE(again.entry_hit) << again.load_error;
  EXPECT_TRUE(again.load_error.empty()) << again.load_error;
  for (const auto& e : fs::recursive_directory_iterator(cache_))
    EXPECT_EQ(e.path().filename().string().find(".tessel-tmp."), std::string::npos) << e.path();
}

TEST_F(CacheBudgetTest, AnEntryOverTheWholeBudgetIsNotStored) {
  ModelCompile probe = compile(1);
  ASSERT_FALSE(probe.entry_dir.empty());
  const uint64_t entry = cpu::folder_bytes(probe.entry_dir);
  const uint64_t kernels = entries(cpu::EntryKind::kernels)[0].bytes;
  ASSERT_GT(entry, kernels);
  ::testing::internal::CaptureStderr();
  ModelCompile big = compile(2, entry / 2);  // the kernels fit, the entry does not
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(big.entry_dir.empty());
  EXPECT_NE(big.not_stored.find("over the cache budget"), std::string::npos) << big.not_stored;
  EXPECT_NE(err.find("tessel: cache: "), std::string::npos) << err;
  ASSERT_TRUE(big.exe);
  EXPECT_EQ(big.exe->run({input()}).size(), 1u);  // compiled and runnable all the same
  for (const cpu::CacheEntry& e : entries(cpu::EntryKind::executable)) EXPECT_EQ(e.path, probe.entry_dir);
}

TEST_F(CacheBudgetTest, ABudgetOfZeroStoresNothing) {
  ModelCompile m = compile(1, 0);
  EXPECT_TRUE(m.entry_dir.empty());
  EXPECT_NE(m.not_stored.find("budget is 0"), std::string::npos) << m.not_stored;
  EXPECT_TRUE(cpu::list_cache(cache_).empty());
  ASSERT_TRUE(m.exe);
  EXPECT_EQ(m.exe->run({input()}).size(), 1u);
}

// The constants and packed weights are mapped, the kernels loaded from a sealed copy: removing the
// entry's files (and its kernels) under a loaded executable changes nothing for it.
TEST_F(CacheBudgetTest, ALoadedExecutableRunsAfterItsEntryIsPruned) {
  ModelCompile cold = compile(1);
  const std::vector<Tensor> want = cold.exe->run({input()});
  ModelCompile warm = compile(1);
  ASSERT_TRUE(warm.entry_hit) << warm.load_error;
  EXPECT_GT(warm.exe->stats().prepacked, 0);
  const cpu::PruneResult r = cpu::prune_cache(cache_, 0);
  EXPECT_EQ(r.removed, 2u);
  EXPECT_EQ(r.kept_bytes, 0u);
  EXPECT_FALSE(fs::exists(warm.entry_dir));
  const std::vector<Tensor> got = warm.exe->run({input()});
  ASSERT_EQ(got.size(), 1u);
  for (int64_t i = 0; i < want[0].numel(); ++i) ASSERT_EQ(got[0].get_f(i), want[0].get_f(i)) << i;
  EXPECT_FALSE(compile(1).entry_hit);  // pruned: compiled and stored again
  EXPECT_TRUE(compile(1).entry_hit);
}

TEST_F(CacheBudgetTest, EntriesInUseAreNotPruned) {
  ModelCompile m = compile(1);
  {
    const cpu::EntryUse use(m.entry_dir);
    ASSERT_TRUE(use.held());
    const cpu::PruneResult r = cpu::prune_cache(cache_, 0);
    EXPECT_EQ(r.busy, 2u);  // the entry, and the kernels it needs
    EXPECT_TRUE(fs::exists(m.entry_dir));
    EXPECT_TRUE(fs::exists(m.exe->stats().so_path));
  }
  EXPECT_EQ(cpu::prune_cache(cache_, 0).removed, 2u);
  EXPECT_FALSE(fs::exists(m.entry_dir));
  EXPECT_FALSE(cpu::EntryUse(m.entry_dir).held());  // gone
}

// Only key-named folders are entries: whatever else is in the directory (it may be one the user
// named in $TESSEL_CACHE_DIR) is neither counted nor removed, and links are not followed.
TEST_F(CacheBudgetTest, NothingButCacheEntriesIsRemoved) {
  const fs::path outside = root_ / "outside";
  fs::create_directories(outside);
  std::ofstream(outside / "precious.txt") << "the user's";
  fs::create_directories(fs::path(cache_) / "exe");
  fs::create_directories(fs::path(cache_) / "notes");
  std::ofstream(fs::path(cache_) / "notes" / "n.txt") << "mine";
  const std::string key(32, 'a');
  fs::create_directory_symlink(outside, fs::path(cache_) / key);
  fs::create_directory_symlink(outside, fs::path(cache_) / "exe" / std::string(32, 'b'));
  fs::create_directories(fs::path(cache_) / std::string(32, 'c'));  // no kernels.so yet: a compile under way
  std::ofstream(fs::path(cache_) / std::string(32, 'c') / "kernels.cpp") << "//";
  const cpu::PruneResult r = cpu::prune_cache(cache_, 0);
  EXPECT_EQ(r.removed, 0u);
  EXPECT_TRUE(fs::exists(outside / "precious.txt"));
  EXPECT_TRUE(fs::exists(fs::path(cache_) / "notes" / "n.txt"));
  EXPECT_TRUE(fs::is_symlink(fs::path(cache_) / key));
  EXPECT_TRUE(fs::exists(fs::path(cache_) / std::string(32, 'c') / "kernels.cpp"));
  ASSERT_EQ(cpu::list_cache(cache_).size(), 1u);
  EXPECT_FALSE(cpu::list_cache(cache_)[0].complete);
}

TEST_F(CacheBudgetTest, TheBudgetComesFromTheOptionsTheEnvironmentOrTheDefault) {
  testenv::ScopedEnv env("TESSEL_CACHE_MAX_BYTES", "3M");
  cpu::ToolchainOptions o;
  o.cache_dir = cache_;
  EXPECT_EQ(cpu::cache_budget(o, 0).bytes, uint64_t{3} << 20);
  env.set("three");
  try {
    cpu::cache_budget(o, 0);
    ADD_FAILURE() << "a malformed budget was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TESSEL_CACHE_MAX_BYTES='three'"), std::string::npos) << e.what();
  }
  o.max_cache_bytes = 5;
  EXPECT_EQ(cpu::cache_budget(o, 0).bytes, 5u);  // the option wins over the variable
  o.max_cache_bytes.reset();
  env.set(nullptr);
  const uint64_t def = cpu::cache_budget(o, 0).bytes;
  EXPECT_GT(def, 0u);
  EXPECT_LE(def, uint64_t{10} << 30);
}

TEST_F(CacheBudgetTest, TheCacheCommandListsPrunesAndClears) {
  compile(1);
  const std::string out = (root_ / "out.txt").string();
  auto tessel = [&](const std::string& args) {
    const std::string cmd = fmt::format("'{}' cache --cache-dir '{}' {} > '{}' 2>&1", testenv::tessel_binary(), cache_, args, out);
    EXPECT_EQ(std::system(cmd.c_str()), 0) << args << ":\n" << testenv::read_text(out);
    return testenv::read_text(out);
  };
  const std::string listing = tessel("");
  EXPECT_NE(listing.find("2 entries"), std::string::npos) << listing;
  EXPECT_NE(listing.find("executable"), std::string::npos) << listing;
  EXPECT_NE(tessel("--prune 1G").find("removed 0 entries"), std::string::npos);
  EXPECT_NE(tessel("--clear").find("removed 2 entries"), std::string::npos);
  EXPECT_TRUE(cpu::list_cache(cache_).empty());
  const std::string bad = fmt::format("'{}' cache --cache-dir '{}' --prune lots > /dev/null 2>&1", testenv::tessel_binary(), cache_);
  EXPECT_NE(std::system(bad.c_str()), 0);
  const std::string bad_env = fmt::format("TESSEL_CACHE_MAX_BYTES=lots '{}' cache --cache-dir '{}' > '{}' 2>&1",
                                          testenv::tessel_binary(), cache_, out);
  EXPECT_NE(std::system(bad_env.c_str()), 0);
  EXPECT_NE(testenv::read_text(out).find("TESSEL_CACHE_MAX_BYTES='lots' is not a byte count"), std::string::npos)
      << testenv::read_text(out);
}

// Kernels older than an entry that needs them (an entry written before the budget existed) are not
// removed from under it: the entry would be a damaged one on its next hit.
TEST_F(CacheBudgetTest, KernelsAKeptEntryNeedsStay) {
  ModelCompile m = compile(1);
  const fs::path kernels = fs::path(m.exe->stats().so_path).parent_path();
  fs::last_write_time(kernels, fs::last_write_time(kernels) - std::chrono::hours(1));
  ASSERT_EQ(cpu::list_cache(cache_).front().path, kernels.string());
  const uint64_t entry = cpu::folder_bytes(m.entry_dir);
  const cpu::PruneResult r = cpu::prune_cache(cache_, entry + cpu::folder_bytes(kernels.string()) - 1);
  EXPECT_EQ(r.removed, 1u);
  EXPECT_FALSE(fs::exists(m.entry_dir));
  EXPECT_TRUE(fs::exists(m.exe->stats().so_path));
  ModelCompile again = compile(1);
  EXPECT_TRUE(again.load_error.empty()) << again.load_error;
}

// Processes storing, hitting and pruning one small cache at once: every run computes the right
// outputs, and none finds a damaged entry (a reader never sees an entry half removed, and the pruner
// never removes one being read or written).
TEST_F(CacheBudgetTest, ConcurrentProcessesPruningOneCacheAllSucceed) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  const std::string models = testenv::shared_dir() + "/models/";
  // tblock_s' entry is 6 MB and attn_s' 8 MB: each store of one removes the other.
  const std::string run = fmt::format("TESSEL_CACHE_DIR='{}' TESSEL_CACHE_MAX_BYTES=10M '{}' run", cache_, testenv::tessel_binary());
  std::string script;
  for (int p = 0; p < 3; ++p) {
    std::string loop;
    for (const char* m : {"tblock_s", "attn_s", "tblock_s", "attn_s"})
      loop += fmt::format("{} '{}{}' --backend compiled --check --threads 1 || echo FAILED; ", run, models, m);
    script += fmt::format("({}) > '{}/p{}.log' 2>&1 & ", loop, root_.string(), p);
  }
  ASSERT_EQ(std::system((script + "wait").c_str()), 0);
  for (int p = 0; p < 3; ++p) {
    const std::string log = testenv::read_text(fmt::format("{}/p{}.log", root_.string(), p));
    EXPECT_EQ(log.find("FAILED"), std::string::npos) << log;
    EXPECT_EQ(log.find("again"), std::string::npos) << "a damaged entry was found:\n" << log;
    size_t passes = 0;
    for (size_t at = log.find("-> PASS"); at != std::string::npos; at = log.find("-> PASS", at + 1)) ++passes;
    EXPECT_EQ(passes, 4u) << log;
  }
  EXPECT_LE(cpu::total_bytes(cpu::list_cache(cache_)), uint64_t{10} << 20);
}
