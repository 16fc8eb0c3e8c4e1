// Op family: conv_pool (see docs/ops.md).
#include "tessel/ir/op_registry.h"

namespace tessel {

void register_conv_pool_ops(OpRegistry& r) { (void)r; }

}  // namespace tessel
