// Subnormal results flushed where only library products read them (docs/runtime/compiled-backend.md, "Subnormals").
//
// A generated kernel whose result is read only as an operand of oneDNN matmuls and convolutions may
// store results below f32's (f64's) smallest normal as zero of their sign: its stores get attr "ftz"
// (`store.ftz` in the kernel text). oneDNN's kernels run 10-30x slower on subnormal operands on this
// machine (swin_t's shifted-window attention: softmax over scores masked with -100 gives probabilities
// near 1e-44, and the product with V took 3.6 ms instead of 0.12), while what the flush changes in a
// product is below K x 1.2e-38 x max|other operand|. Values the model returns, or that anything but a
// library product reads (a log, a division, an output), keep their subnormals: flushing those could
// change a result by more than its rounding (log(0) is -inf, log(1e-44) is -101).
#pragma once

#include "tessel/kernel/kernel.h"

namespace tessel::cpu {

// Marks the stores of loop kernels whose every reader (through reshapes) is a matmul or convolution
// kernel, and that the graph does not return; returns how many kernels it marked.
int mark_ftz_stores(KernelModule& m);

}  // namespace tessel::cpu
