// Op family: misc (see docs/ops.md).
#include "tessel/ir/op_registry.h"

namespace tessel {

void register_misc_ops(OpRegistry& r) { (void)r; }

}  // namespace tessel
