// KTIR export (docs/ir/tile.md, "KTIR export"): the tile level as `ktdp` MLIR text (torch-spyre/RFCs 0682-KtirSpec).
// One func.func per tile kernel the export can express: a `grid` attribute with the kernel's core
// grid (its split dims), `ktdp.get_compute_tile_id` for each core's coordinates, a
// `ktdp.construct_memory_view` per global in its padded device layout plus one per operand index map,
// `ktdp.construct_access_tile` + `ktdp.load`/`ktdp.store` per tile, compute as linalg/arith/math on
// tensors, and the per-core tile loops as scf.for in the kernel's loop order.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tessel/kernel/kernel.h"
#include "tessel/support/tensor.h"
#include "tessel/tile/tile.h"

namespace tessel::ktir {

// The export reads the tile level (tessel::tile): its programs, globals and kernels by their own names
// (`Dim` is the tile level's, not the symbolic size of ir/).
using namespace tessel::tile;
using tile::Dim;

// The module text. Kernels it cannot express (host steps, convolutions, K-split matmuls, partial
// tiles, index maps that are not affine over the tile dims, ops without a KTIR form) are listed in a
// comment at the top and, when `skipped` is given, appended to it as "tN: reason".
// Throws tessel::Error naming the kernel when the tile program and the kernel module disagree.
std::string export_ktir(const TileProgram& p, const KernelModule& m, std::vector<std::string>* skipped = nullptr);

// The same kernels one module each, the form ktir-cpu (torch-spyre's reference interpreter) reads:
// it runs one function per module (with several, every function ran the last one's body).
// A memory view the function reads or writes through (recorded for checks: decoded through its
// global's declaration, every element it names must be the element the tile level means).
struct KtirView {
  int global = -1;
  std::string what;                // "matmul A", "matmul C", "access #2 of k3", ...
  bool stored = false;             // a ktdp.store goes through it
  std::vector<std::string> dims;   // the tile dims of its dims (b m n k, p e)
  std::vector<int64_t> sizes, strides;  // extents over those dims; strides in padded elements
  int64_t base = 0;                // padded address of its first element
};
struct KtirKernel {
  std::string tile_kernel;  // t3: also the func.func's name
  std::string node;         // the kernel-level node (provenance)
  std::string func;         // the func.func text
  std::string module;       // a complete module holding it, with a comment naming model and target
  std::vector<int> args;    // the globals of %arg0, %arg1, ... (TileProgram::globals)
  std::vector<KtirView> views;
};
struct KtirExport {
  std::vector<KtirKernel> kernels;    // in program order
  std::vector<std::string> skipped;   // "tN: reason"
  std::string storage = "device";     // the manifest's "storage": "device", or "f32" (ktir_widened_storage)
};
KtirExport export_ktir_kernels(const TileProgram& p, const KernelModule& m);
// manifest.json of the folder form: model, target, the program's inputs and outputs, and per kernel
// its file, function and arguments in order (each a global: kind, device and logical dtype, logical
// shape, padded DRAM shape, physical order), and the skipped kernels with their reasons.
nlohmann::json ktir_manifest(const TileProgram& p, const KtirExport& e);
std::string ktir_file_name(size_t index, const KtirKernel& k);  // "03-t4.mlir"

// The folder form (docs/ktir.md, "The folder"): the modules, every constant's logical values as
// constants/NNN-name.npy (the manifest's globals name the file) and manifest.json; returns the manifest.
// Throws tessel::Error naming the file it cannot write or the constant it cannot find.
// `values` (tessel's own results, named by value) go to values/NNN-name.npy, listed in the manifest's
// "values" (name -> file).
nlohmann::json write_ktir_folder(const std::string& dir, const TileProgram& p, const KernelModule& m, const KtirExport& e,
                                 const std::vector<std::pair<std::string, Tensor>>* values = nullptr);
std::string ktir_constant_file(size_t global, const Global& g);  // "constants/007-w1.npy"

// The check mode's program (ktir_storage.cpp): p with every f16/bf16 global stored as f32 (dl16 off), the
// schedule and layouts (in elements) unchanged. Export it with KtirExport::storage = "f32".
TileProgram ktir_widened_storage(const TileProgram& p);

// The padded DRAM address of logical element `index` (row-major over g.shape) under g's declaration
// (padded shape, physical order perm); and back: the logical row-major index at a padded address, or
// -1 for padding or an address outside the global.
int64_t ktir_address(const Global& g, const std::vector<int64_t>& index);
int64_t ktir_logical_at(const Global& g, int64_t address);

}  // namespace tessel::ktir
