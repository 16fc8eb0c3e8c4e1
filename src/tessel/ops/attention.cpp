// Op family: attention (see docs/ops.md).
#include "tessel/ir/op_registry.h"

namespace tessel {

void register_attention_ops(OpRegistry& r) { (void)r; }

}  // namespace tessel
