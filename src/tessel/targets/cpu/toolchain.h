// The CPU target's toolchain: compiles generated C++ to a shared object, caches it on disk by content
// hash and loads it with dlopen.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tessel::cpu {

struct ToolchainOptions {
  std::string cxx;        // compiler; empty: $TESSEL_CXX, else "c++"
  std::string cache_dir;  // empty: $TESSEL_CACHE_DIR, else $XDG_CACHE_HOME/tessel, else $HOME/.cache/tessel
  bool native = true;     // -march=native (+ 512-bit vectors when the CPU has avx512f); false: portable
  std::string opt = "-O2";
  bool use_cache = true;  // false: always compile (the files are still written)
};

// A loaded shared object; dlclose'd when the last reference goes, so keep it alive as long as any
// function pointer taken from it is used.
class SharedObject {
 public:
  static std::shared_ptr<SharedObject> open(const std::string& path);  // dlopen(RTLD_NOW | RTLD_LOCAL)
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

 private:
  SharedObject(void* handle, std::string path) : handle_(handle), path_(std::move(path)) {}
  void* handle_;
  std::string path_;
};

struct BuildResult {
  std::shared_ptr<SharedObject> so;
  bool cache_hit = false;        // true: the compiler was not started
  double compile_seconds = 0;    // compiler wall time (0 on a hit)
  double load_seconds = 0;       // dlopen wall time
  std::string key;               // hex content hash of header + source + compiler identity + flags
  std::string source_path, so_path;
};

// Compiles `source` (which may #include "tessel_rt.h") unless `<cache>/<key>/kernels.so` exists, then
// loads it. `name_hint` names the build in error messages. Safe to call from parallel processes: files
// are written under temporary names and renamed into place. Throws tessel::Error when the cache
// directory cannot be written, the compiler cannot be run or fails, or dlopen fails.
BuildResult build_shared_object(const std::string& source, const std::string& name_hint,
                                const ToolchainOptions& options = {});

// The compiler flags a build with these options uses (without source, output and libraries).
std::string compile_flags(const ToolchainOptions& options);

// The cache directory these options choose (ToolchainOptions::cache_dir, $TESSEL_CACHE_DIR,
// $XDG_CACHE_HOME/tessel, $HOME/.cache/tessel); throws when none can be chosen.
std::string cache_directory(const ToolchainOptions& options);

// Hex XXH3-128 of the parts (each length-prefixed, so ("ab","c") and ("a","bc") differ).
std::string content_key(const std::vector<std::string_view>& parts);

// The host CPU's vector features, e.g. "avx512f avx512bw avx512vl avx2 fma" (for reports).
std::string cpu_features();

}  // namespace tessel::cpu
