// Rendering of user-facing errors.
#include "tessel/support/error.h"

#include "tessel/support/escape.h"

namespace tessel {

Error::Error(Location loc, std::string reason, bool unsupported)
    : std::runtime_error(render(loc, reason)), loc_(std::move(loc)), reason_(std::move(reason)),
      unsupported_(unsupported) {}

// Every field may hold model-controlled text (a node named "a\nb", a file name with a tab): each is
// escaped so that an error is always one line and never carries raw control characters.
std::string Error::render(const Location& loc, const std::string& reason) {
  std::string out;
  if (!loc.file.empty()) {
    out += display_text(loc.file);
    if (loc.line > 0) out += fmt::format(":{}:{}", loc.line, loc.column);
    out += ": ";
  }
  if (!loc.pass.empty()) out += fmt::format("[{}] ", display_text(loc.pass));
  if (!loc.node.empty() || !loc.op.empty()) {
    out += "node";
    if (!loc.node.empty()) out += fmt::format(" '{}'", display_text(loc.node));
    if (!loc.op.empty()) out += fmt::format(" ({})", display_text(loc.op));
    out += ": ";
  }
  return out + display_text(reason);
}

Error Error::with_context(const Location& outer) const {
  Location l = loc_;
  if (l.file.empty()) l.file = outer.file;
  if (l.node.empty()) l.node = outer.node;
  if (l.op.empty()) l.op = outer.op;
  if (l.pass.empty()) l.pass = outer.pass;
  if (l.line == 0) {
    l.line = outer.line;
    l.column = outer.column;
  }
  return Error(l, reason_, unsupported_);
}

}  // namespace tessel
