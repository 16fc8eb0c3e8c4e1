// The version text, from generated/tessel_version.inc (cmake/version.cmake writes it at every build).
#include "tessel/support/version.h"

#include "tessel_version.inc"

namespace tessel {

const char* version_number() { return TESSEL_VERSION; }
const char* build_name() { return TESSEL_BUILD[0] ? TESSEL_BUILD : "unknown"; }
std::string version_text() {
  const std::string label = TESSEL_BUILD_LABEL;
  return label.empty() ? std::string(TESSEL_VERSION) : std::string(TESSEL_VERSION) + "+" + label;
}

}  // namespace tessel
