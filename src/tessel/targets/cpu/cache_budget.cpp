// The cache directory's size bound: listing entries, LRU pruning and the entry lock (see cache_budget.h).
#include "tessel/targets/cpu/cache_budget.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <map>
#include <set>

#include "tessel/support/error.h"
#include "tessel/support/escape.h"
#include "tessel/targets/cpu/exe_entry.h"
#include "tessel/support/limits.h"

namespace tessel::cpu {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kDefaultMaxBytes = uint64_t{10} << 30;
// A compile holds its folder's lock; this only covers the moment between creating the folder and
// locking it, and compiles killed before they wrote anything.
constexpr int64_t kIncompleteGraceNs = int64_t{3600} * 1000000000;

// Keys are hex XXH3-128 (content_key): 32 lowercase hex digits.
bool is_key(const std::string& name) {
  return name.size() == 32 && name.find_first_not_of("0123456789abcdef") == std::string::npos;
}

int64_t mtime_ns(const struct stat& sb) {
  return static_cast<int64_t>(sb.st_mtim.tv_sec) * 1000000000 + sb.st_mtim.tv_nsec;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Adds the key-named folders directly under `dir` (lstat: a link named like a key is not an entry).
void add_entries(const fs::path& dir, EntryKind kind, const char* marker, std::vector<CacheEntry>& out) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    struct stat sb {};
    if (!is_key(name) || ::lstat(it->path().c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
    CacheEntry e;
    e.path = it->path().string();
    e.kind = kind;
    e.bytes = folder_bytes(e.path);
    e.last_used_ns = mtime_ns(sb);
    struct stat mb {};
    e.complete = ::lstat((it->path() / marker).c_str(), &mb) == 0 && S_ISREG(mb.st_mode);
    out.push_back(std::move(e));
  }
}

// Same device and inode: `fd` still is the folder at `path`.
bool still_at(int fd, const std::string& path) {
  struct stat a {}, b {};
  return ::fstat(fd, &a) == 0 && ::lstat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

int open_folder(const std::string& path) { return ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC); }

// flock without waiting; false only when another open file holds a conflicting lock. A file system
// without flock (some network ones: ENOLCK, EINVAL) gets the unlocked behaviour rather than a cache
// that never hits or is never pruned.
bool try_flock(int fd, int op) {
  if (::flock(fd, op | LOCK_NB) == 0) return true;
  return errno != EWOULDBLOCK && errno != EINTR;
}

// Removes an entry unless another process holds it: locked exclusively, renamed to a temporary name
// (readers looking it up now miss; sweep_stale_temporaries finishes a removal this process does not),
// then deleted. Returns whether it was removed.
bool remove_entry(const CacheEntry& e) {
  const int fd = open_folder(e.path);
  if (fd < 0) return false;
  bool removed = false;
  if (try_flock(fd, LOCK_EX) && still_at(fd, e.path)) {
    const std::string doomed = temporary_name(e.path);
    if (::rename(e.path.c_str(), doomed.c_str()) == 0) {
      std::error_code ec;
      fs::remove_all(doomed, ec);
      removed = true;
    }
  }
  ::close(fd);
  return removed;
}

}  // namespace

CacheBudget cache_budget(const ToolchainOptions& o, uint64_t held_bytes) {
  if (o.max_cache_bytes) return {*o.max_cache_bytes, "ToolchainOptions::max_cache_bytes"};
  if (const char* v = std::getenv("TESSEL_CACHE_MAX_BYTES"); v && *v) {
    const auto bytes = parse_byte_size(v);
    if (!bytes)
      throw Error(Location{.pass = "cache"},
                  fmt::format("TESSEL_CACHE_MAX_BYTES='{}' is not a byte count (e.g. 10G, 512M; 0 stores nothing)", v));
    return {*bytes, "$TESSEL_CACHE_MAX_BYTES"};
  }
  // Half of the space the cache could grow into: a full disk breaks more than a cold compile does.
  struct statvfs vs {};
  const std::string root = cache_directory(o);
  if (::statvfs(root.c_str(), &vs) == 0) {
    const uint64_t half = (static_cast<uint64_t>(vs.f_bavail) * vs.f_frsize + held_bytes) / 2;
    if (half < kDefaultMaxBytes) return {half, "the default: half of the free disk space and the cache"};
  }
  return {kDefaultMaxBytes, "the default"};
}

uint64_t folder_bytes(const std::string& dir) {
  uint64_t n = 0;
  std::error_code ec;
  // The default options follow no directory links; a link itself is neither regular nor followed.
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code sec;
    if (it->symlink_status(sec).type() == fs::file_type::regular) {
      const auto size = it->file_size(sec);
      if (!sec) n += size;
    }
  }
  return n;
}

std::vector<CacheEntry> list_cache(const std::string& root) {
  std::vector<CacheEntry> out;
  add_entries(root, EntryKind::kernels, "kernels.so", out);
  add_entries(fs::path(root) / "exe", EntryKind::executable, "manifest.json", out);
  // An executable entry's hit or store touches its kernels after it (compile_model.cpp), so kernels
  // never go before the entries that use them.
  std::stable_sort(out.begin(), out.end(), [](const CacheEntry& a, const CacheEntry& b) {
    if (a.last_used_ns != b.last_used_ns) return a.last_used_ns < b.last_used_ns;
    return a.kind == EntryKind::executable && b.kind == EntryKind::kernels;
  });
  return out;
}

uint64_t total_bytes(const std::vector<CacheEntry>& entries) {
  uint64_t n = 0;
  for (const CacheEntry& e : entries) n += e.bytes;
  return n;
}

void mark_used(const std::string& entry_dir) {
  ::utimensat(AT_FDCWD, entry_dir.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);  // a read-only cache stays as it is
}

namespace {

// The key of the kernels an executable entry needs (its manifest's shared object's folder), or empty.
std::string kernels_key(const CacheEntry& e) {
  try {
    const std::string so = read_manifest(e.path).so_path;
    return so.empty() ? std::string() : fs::path(so).parent_path().filename().string();
  } catch (const Error&) {
    return {};  // damaged: its next reader reports and replaces it
  }
}

// Kernels are removed only once no kept entry needs them: an entry without its kernels is a damaged
// one. (Hits and stores touch kernels after their entries, so this only holds back kernels of an
// entry in use, or of one written before the budget existed.)
PruneResult prune_entries(const std::vector<CacheEntry>& entries, uint64_t budget) {
  PruneResult r;
  r.kept_bytes = total_bytes(entries);
  if (r.kept_bytes <= budget) return r;
  std::map<std::string, int> users;  // kernels key -> kept executable entries needing them
  std::vector<std::string> needs(entries.size());
  for (size_t i = 0; i < entries.size(); ++i)
    if (entries[i].kind == EntryKind::executable && !(needs[i] = kernels_key(entries[i])).empty()) ++users[needs[i]];
  const int64_t now = now_ns();
  for (size_t i = 0; i < entries.size() && r.kept_bytes > budget; ++i) {
    const CacheEntry& e = entries[i];
    const bool young_incomplete = !e.complete && now - e.last_used_ns < kIncompleteGraceNs;
    const bool needed = e.kind == EntryKind::kernels && users[fs::path(e.path).filename().string()] > 0;
    if (!young_incomplete && !needed && remove_entry(e)) {
      ++r.removed;
      r.removed_bytes += e.bytes;
      r.kept_bytes -= e.bytes;
      if (!needs[i].empty()) --users[needs[i]];
    } else {
      ++r.busy;
    }
  }
  return r;
}

}  // namespace

PruneResult prune_cache(const std::string& root, uint64_t budget) { return prune_entries(list_cache(root), budget); }

bool fits_budget(uint64_t bytes, const CacheBudget& budget, const std::string& what) {
  if (bytes <= budget.bytes) return true;
  static std::mutex mu;
  static std::set<std::string> said;  // once per entry and process, as report_cache_problem does
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    first = said.insert(what).second;
  }
  if (budget.bytes > 0 && first) {
    std::fprintf(stderr, "tessel: cache: %s of %llu bytes is over the cache budget of %llu bytes (chosen by %s); not stored\n",
                 display_text(what).c_str(), static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(budget.bytes),
                 budget.chosen_by.c_str());
    std::fflush(stderr);
  }
  return false;
}

void after_store(const std::string& root, const std::string& entry_dir, const std::string& what,
                 const ToolchainOptions& options) {
  const std::vector<CacheEntry> entries = list_cache(root);
  const uint64_t held = total_bytes(entries);
  const CacheBudget budget = cache_budget(options, held);
  const auto stored = std::find_if(entries.begin(), entries.end(), [&](const CacheEntry& e) { return e.path == entry_dir; });
  if (stored != entries.end() && !fits_budget(stored->bytes, budget, what)) {
    remove_entry(*stored);
    return;
  }
  if (held > budget.bytes) prune_entries(entries, budget.bytes);
}

EntryUse::EntryUse(const std::string& dir) {
  const int fd = open_folder(dir);
  if (fd < 0) return;
  if (!try_flock(fd, LOCK_SH) || !still_at(fd, dir)) {
    ::close(fd);
    busy_ = true;
    return;
  }
  fd_ = fd;
}

EntryUse::~EntryUse() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace tessel::cpu
