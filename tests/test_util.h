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

}  // namespace tessel::testenv
