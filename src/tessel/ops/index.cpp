// Op family: index (see docs/ops.md).
#include "tessel/ir/op_registry.h"

namespace tessel {

void register_index_ops(OpRegistry& r) { (void)r; }

}  // namespace tessel
