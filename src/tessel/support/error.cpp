// Rendering of user-facing errors.
#include "tessel/support/error.h"

namespace tessel {

Error::Error(Location loc, std::string reason, bool unsupported)
    : std::runtime_error(render(loc, reason)), loc_(std::move(loc)), reason_(std::move(reason)),
      unsupported_(unsupported) {}

std::string Error::render(const Location& loc, const std::string& reason) {
  std::string out;
  if (!loc.file.empty()) {
    out += loc.file;
    if (loc.line > 0) out += fmt::format(":{}:{}", loc.line, loc.column);
    out += ": ";
  }
  if (!loc.pass.empty()) out += fmt::format("[{}] ", loc.pass);
  if (!loc.node.empty() || !loc.op.empty()) {
    out += "node";
    if (!loc.node.empty()) out += fmt::format(" '{}'", loc.node);
    if (!loc.op.empty()) out += fmt::format(" ({})", loc.op);
    out += ": ";
  }
  return out + reason;
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
