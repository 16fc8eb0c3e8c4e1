// Small text helpers (strings.h).
#include "tessel/support/strings.h"

#include <fmt/format.h>

#include <algorithm>

namespace tessel {

std::vector<std::string> comma_list(const std::string& s) {
  std::vector<std::string> out;
  for (size_t b = 0; b <= s.size();) {
    const size_t e = std::min(s.find(',', b), s.size());
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

std::string bytes_text(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  for (; v >= 1024 && u < 4; ++u) v /= 1024;
  return u == 0 ? fmt::format("{} B", n) : fmt::format("{:.1f} {}", v, units[u]);
}

}  // namespace tessel
