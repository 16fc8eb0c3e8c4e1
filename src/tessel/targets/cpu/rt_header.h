// The text of rt/tessel_rt.h, embedded in the tessel binary so generated code can include it.
#pragma once

#include <string_view>

namespace tessel::cpu {

std::string_view rt_header_text();

}  // namespace tessel::cpu
