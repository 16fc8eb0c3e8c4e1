// Small text helpers shared by the command line and the drivers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessel {

// "spyre,tpu-v5e,,cpu" -> {"spyre", "tpu-v5e", "cpu"}: the items of a comma list, empty ones dropped.
std::vector<std::string> comma_list(const std::string& s);

// "1.2 GiB", "512 B": a byte count for people (powers of 1024).
std::string bytes_text(uint64_t n);

}  // namespace tessel
