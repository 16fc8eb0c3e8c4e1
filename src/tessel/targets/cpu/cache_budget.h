// The size bound of tessel's cache directory: its entries (compiled kernels `<key>/` and
// executable-cache entries `exe/<key>/`) with their sizes and last use, least-recently-used pruning
// after a store, and the lock that keeps the pruner off entries other processes are using.
// docs/runtime/compiled-backend.md ("The executable cache") and docs/decisions.md say why.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/targets/cpu/toolchain.h"

namespace tessel::cpu {

struct CacheBudget {
  uint64_t bytes = 0;
  std::string chosen_by;  // for messages: "ToolchainOptions::max_cache_bytes", "$TESSEL_CACHE_MAX_BYTES", "the default ..."
};

// ToolchainOptions::max_cache_bytes when set, else $TESSEL_CACHE_MAX_BYTES (a byte count with an
// optional K/M/G/T suffix; 0: store nothing), else min(10 GiB, half of what the cache's file system
// has free plus what the cache already holds, `held_bytes`). Throws tessel::Error when the variable
// is not a byte count.
CacheBudget cache_budget(const ToolchainOptions& options, uint64_t held_bytes);

enum class EntryKind { kernels, executable };

struct CacheEntry {
  std::string path;
  EntryKind kind = EntryKind::kernels;
  uint64_t bytes = 0;         // regular files inside (links are neither followed nor counted)
  int64_t last_used_ns = 0;   // the folder's mtime: every store writes in it and every hit touches it
  bool complete = false;      // kernels.so / manifest.json is there (else a compile failed or is under way)
};

// The entries under `root`, least recently used first (on a tie, executable entries before the
// kernels they use). Only folders named like a key (32 hex digits) are entries: nothing else in a
// directory someone pointed $TESSEL_CACHE_DIR at is ever counted or removed. Best effort: what
// cannot be read is left out.
std::vector<CacheEntry> list_cache(const std::string& root);

uint64_t total_bytes(const std::vector<CacheEntry>& entries);

// Marks an entry recently used (its folder's mtime; atime is not reliable). Best effort.
void mark_used(const std::string& entry_dir);

struct PruneResult {
  size_t removed = 0;
  uint64_t removed_bytes = 0;
  uint64_t kept_bytes = 0;
  size_t busy = 0;  // over the budget but kept: in use by another process, a compile under way, or
                    // kernels a kept entry needs
};

// Removes least-recently-used entries until what is kept fits in `budget` bytes. An entry another
// process holds (EntryUse) is skipped, and so is an incomplete one less than an hour old (a compile
// creating it), and so are kernels a kept executable entry needs. A removed entry is first renamed
// to a temporary name, so no reader finds half of one; a process that has its files mapped or
// loaded keeps running.
PruneResult prune_cache(const std::string& root, uint64_t budget);

// Whether an entry of `bytes` fits in `budget`; when not (and the budget is not 0, which asks for
// no cache), says so on stderr, once per `what` and process: "tessel: cache: <what> of N bytes is
// over the cache budget of M bytes (chosen by ...); not stored".
bool fits_budget(uint64_t bytes, const CacheBudget& budget, const std::string& what);

// After a store of `entry_dir` (`what` names it in the message) under `root`: removes it when it
// alone is over the options' budget (fits_budget), else removes least-recently-used others until
// the cache fits. Best effort: a failure to list or remove is not the caller's error (a malformed
// $TESSEL_CACHE_MAX_BYTES is).
void after_store(const std::string& root, const std::string& entry_dir, const std::string& what,
                 const ToolchainOptions& options);

// The size of one folder's regular files (not following links).
uint64_t folder_bytes(const std::string& dir);

// A shared advisory lock (flock) on an entry's folder while this process reads it or compiles into
// it; prune_cache skips entries so held. Taken without waiting. busy(): the folder is being removed
// (the pruner holds it) or was replaced since it was opened: use the entry as a miss. Neither held
// nor busy: nothing lockable is there (no entry, or not a folder: what the entry's reader reports).
class EntryUse {
 public:
  explicit EntryUse(const std::string& dir);
  ~EntryUse();
  EntryUse(const EntryUse&) = delete;
  EntryUse& operator=(const EntryUse&) = delete;
  bool held() const { return fd_ >= 0; }
  bool busy() const { return busy_; }

 private:
  int fd_ = -1;
  bool busy_ = false;
};

}  // namespace tessel::cpu
