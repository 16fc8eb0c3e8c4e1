// The KTIR export's check mode with f32 storage (docs/ktir.md, "What is compared"): the same tile program —
// its splits, tiles, loop order and padded layouts, every view and stride in elements — with every float
// global stored as f32 instead of the device's f16/bf16. It checks the kernels' logic on tessel's schedule,
// not the device format: a model whose values lie below f16's range (mobilenet_v2's outputs, ~1e-9) can
// be compared at all. Scratchpad bytes are not re-planned: the program is exported and run functionally,
// never simulated for time.
#include "tessel/export/ktir.h"

namespace tessel::ktir {

TileProgram ktir_widened_storage(const TileProgram& p) {
  TileProgram w = p;
  for (Global& g : w.globals)
    if (g.dtype == DType::f16 || g.dtype == DType::bf16) g.dtype = DType::f32;
  w.float_dtype = DType::f32;
  w.dl16 = false;  // DLFloat16 is a format of f16 storage
  return w;
}

}  // namespace tessel::ktir
