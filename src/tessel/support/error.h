// User-facing errors: a location (file, node, op, pass) and a one-line reason.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace tessel {

// Where an error happened. Every field is optional; what() prints the ones that are set.
struct Location {
  std::string file;   // model or text file
  std::string node;   // node name (provenance)
  std::string op;     // op type
  std::string pass;   // pass or stage (import, parse, verify, run, ...)
  int line = 0;       // for text input
  int column = 0;
};

class Error : public std::runtime_error {
 public:
  Error(Location loc, std::string reason, bool unsupported = false);
  // True when the input is valid but uses something tessel does not implement (an op, a dtype,
  // an attribute value); false when the input itself is wrong.
  bool is_unsupported() const { return unsupported_; }
  const Location& location() const { return loc_; }
  const std::string& reason() const { return reason_; }
  // A copy of this error with fields of `outer` filled in where this one has none.
  Error with_context(const Location& outer) const;

 private:
  static std::string render(const Location& loc, const std::string& reason);
  Location loc_;
  std::string reason_;
  bool unsupported_ = false;
};

// Throws an Error with only a reason; callers up the stack add file/node/op via with_context.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(Location{}, fmt::format(f, std::forward<Args>(args)...));
}

// Throws an Error marking a valid input that tessel does not support.
template <typename... Args>
[[noreturn]] void unsupported(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(Location{}, fmt::format(f, std::forward<Args>(args)...), true);
}

#define TESSEL_CHECK(cond, ...)       \
  do {                                \
    if (!(cond)) ::tessel::fail(__VA_ARGS__); \
  } while (0)

}  // namespace tessel
