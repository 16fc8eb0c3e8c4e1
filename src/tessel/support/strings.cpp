// Small text helpers (strings.h).
#include "tessel/support/strings.h"

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

}  // namespace tessel
