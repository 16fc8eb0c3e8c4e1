// Small text helpers shared by the command line and the drivers.
#pragma once

#include <string>
#include <vector>

namespace tessel {

// "spyre,tpu-v5e,,cpu" -> {"spyre", "tpu-v5e", "cpu"}: the items of a comma list, empty ones dropped.
std::vector<std::string> comma_list(const std::string& s);

}  // namespace tessel
