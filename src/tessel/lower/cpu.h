// The host CPU's lowering, assembled in this one place (docs/passes/manager.md, "The CPU pipeline"):
// the graph passes, fusion with the CPU's options, the epilogues oneDNN applies itself, and one C++
// translation unit of the kernels (cpu-codegen). The compiled backend (runtime/compiled_backend.cpp)
// compiles and loads that source, plans and runs what comes out; `tessel compile --emit kernel|cpp|fusion`
// prints it. Every stage runs through one StageRunner: timed, verified, dumped (NN-<stage>) and printed
// with --print-after.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessel/kernel/kernel.h"
#include "tessel/passes/pass.h"
#include "tessel/targets/cpu/library_epilogue.h"

namespace tessel::lower {

struct CpuOptions {
  std::string pipeline = "core";  // the graph passes (by name; "" none)
  FuseOptions fuse;               // the model's own choices, under cpu_fuse_options
  bool codegen = true;            // the cpu-codegen stage (false: stop at the kernel level)
  std::string model = "model";    // names the generated translation unit
  PassOptions stages;             // verify, dump_dir (NN-<stage>), print_after
  bool elide_dumped_constants = true;  // the kernel level's dump without the weights' values
  // A graph pass that fails (a decomposition that needs a value only known at run time) leaves the
  // model undecomposed, with the reason in pipeline_error, instead of failing the compilation: every
  // node then runs through the reference kernels (the graph backend's whole-model fallback).
  bool undecomposed_on_pass_error = false;
};

struct CpuLowered {
  KernelModule module;                        // its graph: kernel nodes and the core nodes left
  std::vector<bool> in_library;               // per kernel: its epilogue applied by oneDNN
  std::vector<cpu::LibraryEpilogue> library;  // those epilogues
  std::string source;                         // the generated C++ (empty without codegen)
  std::vector<std::string> symbols;           // the functions the source defines (kernel_symbol)
  std::string pipeline_error;                 // undecomposed_on_pass_error: why the passes were undone
  std::vector<PassRecord> records;            // one per stage run
  bool printed = false;                       // the stage stages.print_after names ran and printed
  double pass_seconds = 0, fuse_seconds = 0, codegen_seconds = 0;
};

// Lowers `g` (shapes bound, inputs specialised where they will be) for the host CPU.
CpuLowered lower_cpu(std::unique_ptr<Graph> g, const CpuOptions& opts);

}  // namespace tessel::lower
