// KTIR export (docs/ir/tile.md, "KTIR export"): the tile level as `ktdp` MLIR text (torch-spyre/RFCs 0682-KtirSpec).
// One func.func per tile kernel the export can express: a `grid` attribute with the kernel's core
// grid (its split dims), `ktdp.get_compute_tile_id` for each core's coordinates, a
// `ktdp.construct_memory_view` per global in its padded device layout plus one per operand index map,
// `ktdp.construct_access_tile` + `ktdp.load`/`ktdp.store` per tile, compute as linalg/arith/math on
// tensors, and the per-core tile loops as scf.for in the kernel's loop order.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tessel/kernel/kernel.h"
#include "tessel/tile/tile.h"

namespace tessel::tile {

// The module text. Kernels it cannot express (host steps, convolutions, K-split matmuls, partial
// tiles, index maps that are not affine over the tile dims, ops without a KTIR form) are listed in a
// comment at the top and, when `skipped` is given, appended to it as "tN: reason".
// Throws tessel::Error naming the kernel when the tile program and the kernel module disagree.
std::string export_ktir(const TileProgram& p, const KernelModule& m, std::vector<std::string>* skipped = nullptr);

// The same kernels one module each, the form ktir-cpu (torch-spyre's reference interpreter) reads:
// it runs one function per module (with several, every function ran the last one's body).
struct KtirKernel {
  std::string tile_kernel;  // t3: also the func.func's name
  std::string node;         // the kernel-level node (provenance)
  std::string func;         // the func.func text
  std::string module;       // a complete module holding it, with a comment naming model and target
  std::vector<int> args;    // the globals of %arg0, %arg1, ... (TileProgram::globals)
};
struct KtirExport {
  std::vector<KtirKernel> kernels;    // in program order
  std::vector<std::string> skipped;   // "tN: reason"
};
KtirExport export_ktir_kernels(const TileProgram& p, const KernelModule& m);
// manifest.json of the folder form: model, target, the program's inputs and outputs, and per kernel
// its file, function and arguments in order (each a global: kind, device and logical dtype, logical
// shape, padded DRAM shape, physical order), and the skipped kernels with their reasons.
nlohmann::json ktir_manifest(const TileProgram& p, const KtirExport& e);
std::string ktir_file_name(size_t index, const KtirKernel& k);  // "03-t4.mlir"

}  // namespace tessel::tile
