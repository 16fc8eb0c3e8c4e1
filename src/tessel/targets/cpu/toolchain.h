// The CPU target's toolchain: compiles generated C++ to a shared object, caches it on disk by content
// hash with a checksum, and loads it with dlopen from a verified private copy.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/support/checksum.h"
#include "tessel/support/error.h"

namespace tessel::cpu {

struct ToolchainOptions {
  std::string cxx;        // compiler; empty: $TESSEL_CXX, else "c++"
  std::string cache_dir;  // empty: $TESSEL_CACHE_DIR, else $XDG_CACHE_HOME/tessel, else $HOME/.cache/tessel
  bool native = true;     // -march=native (+ 512-bit vectors when the CPU has avx512f); false: portable
  std::string opt = "-O2";
  bool use_cache = true;  // false: always compile (the files are still written)
  // The cache directory's size bound (cache_budget.h): unset: $TESSEL_CACHE_MAX_BYTES, else the
  // default; 0: store nothing.
  std::optional<uint64_t> max_cache_bytes;
};

// A loaded shared object; dlclose'd when the last reference goes, so keep it alive as long as any
// function pointer taken from it is used. Never loaded unverified: the bytes are read once, checked,
// copied into a sealed memfd and dlopen'ed from there (/proc/self/fd/N), so what runs is exactly
// what was checked, whatever happens to the file afterwards (docs/decisions.md, issue 12).
class SharedObject {
 public:
  // Reads `path` (a regular file), checks its size and XXH3-128 against `expected` and loads those
  // bytes (RTLD_NOW | RTLD_LOCAL). Throws tessel::Error naming the file and what was wrong.
  static std::shared_ptr<SharedObject> open_verified(const std::string& path, const Checksum& expected);
  // Loads `bytes` (already checked: a fresh compile's output); `path` names them in errors.
  static std::shared_ptr<SharedObject> load_bytes(const std::string& bytes, const std::string& path);
  ~SharedObject();
  SharedObject(const SharedObject&) = delete;
  SharedObject& operator=(const SharedObject&) = delete;

  // The address of an extern "C" symbol; throws tessel::Error naming the symbol and the file.
  void* symbol(const std::string& name) const;
  template <typename Fn>
  Fn* function(const std::string& name) const {
    return reinterpret_cast<Fn*>(symbol(name));
  }
  const std::string& path() const { return path_; }
  const Checksum& checksum() const { return checksum_; }

 private:
  SharedObject(void* handle, int fd, std::string path, Checksum sum)
      : handle_(handle), fd_(fd), path_(std::move(path)), checksum_(std::move(sum)) {}
  void* handle_;
  int fd_;  // the sealed copy; closed only once the object is unloaded, so its name is never reused
  std::string path_;
  Checksum checksum_;
};

struct BuildResult {
  std::shared_ptr<SharedObject> so;
  bool cache_hit = false;        // true: the compiler was not started
  double compile_seconds = 0;    // compiler wall time (0 on a hit)
  double load_seconds = 0;       // dlopen wall time
  std::string key;               // hex content hash of header + source + compiler identity + flags
  std::string source_path, so_path;
};

// Compiles `source` (which may #include "tessel_rt.h") unless `<cache>/<key>/kernels.so` exists with
// the checksum recorded in `kernels.so.sum` and every symbol of `required_symbols`, then loads it
// (SharedObject::open_verified). A damaged entry (missing checksum, other size or bytes, not
// loadable, a required symbol missing) is reported once on stderr (report_cache_problem) and
// compiled again. `name_hint` names the build in error messages. Safe to call from parallel
// processes: files are written under temporary names and renamed into place; stale temporaries of
// dead processes are swept on every write. Throws tessel::Error when the cache directory cannot be
// written, the compiler cannot be run or fails, a fresh build lacks a required symbol, or dlopen fails.
BuildResult build_shared_object(const std::string& source, const std::string& name_hint,
                                const ToolchainOptions& options = {}, const std::vector<std::string>& required_symbols = {});

// The compiler flags a build with these options uses (without source, output and libraries).
std::string compile_flags(const ToolchainOptions& options);

// The cache directory these options choose (ToolchainOptions::cache_dir, $TESSEL_CACHE_DIR,
// $XDG_CACHE_HOME/tessel, $HOME/.cache/tessel); throws when none can be chosen.
std::string cache_directory(const ToolchainOptions& options);

// One line on stderr ("tessel: cache: <error>; <action>") for a damaged cache file that is being
// rebuilt; once per file and process (a damaged kernels.so found by the executable cache is not
// reported again when the compile cache finds it).
void report_cache_problem(const Error& e, const std::string& action);

// Removes stale temporaries (`NAME.tessel-tmp.<pid>` or `NAME.tessel-tmp.<pid>.<n>`, files or folders this
// user owns, never symbolic links) from the cache root, its entry folders (named by their hex key) and
// exe/, exe/files/: those of processes that no longer exist once a minute old (a process of another PID
// namespace sharing the cache gets that grace), and any older than a day (pids are reused). Nothing else
// in the cache root is touched: it may be a folder of the user's. Best effort: errors are ignored.
void sweep_stale_temporaries(const std::string& cache_root);

// "<name>.tessel-tmp.<pid>.<n>": a temporary name unique to this process and call.
std::string temporary_name(const std::string& name);

// Why tessel must not load code from `path` (a cache folder or file), or empty when it may: it must be
// this user's (owner = effective uid) and writable by no one else (no group or other write bit). An
// absent path is fine (tessel makes it, private). A symbolic link is followed (a cache may be a link).
std::string untrusted_reason(const std::string& path);

// mkdir -p with mode 0700 for the folders it makes (umask aside): cache folders only their user writes.
void create_private_directories(const std::string& path, std::error_code& ec);

// Hex XXH3-128 of the parts (each length-prefixed, so ("ab","c") and ("a","bc") differ).
std::string content_key(const std::vector<std::string_view>& parts);

// The host CPU's vector features, e.g. "avx512f avx512bw avx512vl avx2 fma" (for reports).
std::string cpu_features();

}  // namespace tessel::cpu
