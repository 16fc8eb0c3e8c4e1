// The embedded text of rt/tessel_rt.h (the build writes it into tessel_rt_header.inc as a raw string).
#include "tessel/targets/cpu/rt_header.h"

namespace tessel::cpu {

namespace {
constexpr char kText[] =
#include "tessel_rt_header.inc"
    ;
}  // namespace

std::string_view rt_header_text() { return {kText, sizeof(kText) - 1}; }

}  // namespace tessel::cpu
