// Shared pieces of the libFuzzer harnesses: a private scratch folder per process and the rule that
// tessel::Error is the only acceptable way to refuse an input (anything else escaping is a finding).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "tessel/support/error.h"

namespace tessel::fuzz {

// A folder under $TMPDIR (or /tmp) for this process's input files, removed when the process exits
// normally (a crash leaves it: the crashing input is kept by libFuzzer anyway).
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/tessel-fuzz-XXXXXX";
    if (!::mkdtemp(templ.data())) std::abort();
    std::atexit([] { std::error_code ec; std::filesystem::remove_all(scratch_dir(), ec); });
    return std::filesystem::path(templ);
  }();
  return dir;
}

// Writes `bytes` to scratch_dir()/name and returns the path.
inline std::string write_scratch(const std::string& name, std::string_view bytes) {
  const std::filesystem::path p = scratch_dir() / name;
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) std::abort();  // the harness's own failure, not a finding in tessel
  return p.string();
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs `body`; a tessel::Error is the expected refusal of a bad input and is swallowed. Every other
// exception propagates, and libFuzzer reports it (std::terminate) as a crash.
template <class F>
void refusing_is_fine(F&& body) {
  try {
    body();
  } catch (const Error&) {
  }
}

}  // namespace tessel::fuzz
