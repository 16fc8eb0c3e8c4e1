// The registered op table as Markdown (docs/ops.md is this text; a test keeps the two in step).
#pragma once

#include <string>

namespace tessel {

std::string op_table_markdown();

}  // namespace tessel
