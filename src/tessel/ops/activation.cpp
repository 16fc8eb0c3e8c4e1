// Op family: activation (see docs/ops.md).
#include "tessel/ir/op_registry.h"

namespace tessel {

void register_activation_ops(OpRegistry& r) { (void)r; }

}  // namespace tessel
