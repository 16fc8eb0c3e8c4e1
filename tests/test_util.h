// Shared helpers for the tests: paths to the repository and to ../shared, and small graph builders.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace tessel::testenv {

inline std::string source_dir() { return TESSEL_SOURCE_DIR; }
// ../shared next to the checkout (CI lays it there); TESSEL_SHARED overrides.
inline std::string shared_dir() {
  if (const char* e = std::getenv("TESSEL_SHARED")) return e;
  return TESSEL_SHARED_DIR;
}
inline bool have_shared() { return std::filesystem::exists(shared_dir() + "/models"); }
inline std::string tessel_binary() { return TESSEL_BINARY; }

inline std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The text of the first fenced block of a markdown page that opens with `fence` (e.g. "```tsl before"),
// up to its closing fence; "" when the page has none (the caller's comparison then fails and names it).
inline std::string md_block(const std::string& md, const std::string& fence) {
  auto b = md.find(fence + "\n");
  if (b == std::string::npos) return "";
  b += fence.size() + 1;
  return md.substr(b, md.find("```", b) - b);
}

// Sets (or, with nullptr, clears) an environment variable for one scope and puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      old_ = old;
      had_ = true;
    }
    set(value);
  }
  ~ScopedEnv() { set(had_ ? old_.c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  void set(const char* value) {
    if (value) {
      setenv(name_.c_str(), value, 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

}  // namespace tessel::testenv
