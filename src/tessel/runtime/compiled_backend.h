// The `compiled` backend (the top rung of eager / graph / compiled, like PyTorch's inductor): the
// core graph is fused into the kernel level, every loop kernel becomes a generated C++ function,
// the translation unit is compiled by the system compiler into a shared object (cached on disk by
// content hash) and loaded with dlopen; matmuls and convolutions run through oneDNN with their
// epilogues fused. Everything else (memory planned into one arena, graph breaks in a dynamic
// region, guards on inputs) is the graph backend's. docs/runtime/compiled-backend.md.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/kernel/kernel.h"
#include "tessel/runtime/graph_backend.h"
#include "tessel/targets/cpu/library_epilogue.h"
#include "tessel/targets/cpu/toolchain.h"

namespace tessel {

struct CompiledBackendOptions {
  int threads = 0;                     // 0: the machine's hardware threads
  std::string pipeline = "core";
  FuseOptions fuse;
  cpu::ToolchainOptions toolchain;
  std::string model_name = "model";    // for the banner of the generated file
  bool keep_module = false;            // keep what save() needs (the kernel module's text and constants)
  // GraphBackendOptions::output_aliases and recycled_outputs: outputs written into the caller's
  // inputs (a loop kernel writes over its input when each element is read before its position is
  // written: loop_writes_over_input), outputs handed over without a copy out of the arena.
  std::vector<int> output_aliases;
  bool optional_aliases = false;
  bool recycled_outputs = false;
  // A graph with size symbols (docs/dynamic-shapes.md) compiles once. With `rebind` (the default), one
  // executable serves every binding: a call with new sizes rebinds it (the types, arena plan, library
  // calls and typed kernels of what the changed symbols size: an LLM's decoded token redoes only its
  // attention). Where that executable cannot be made (rebind_refused says why), or without `rebind`,
  // each binding gets an instance (the static kernels, arena plan and library primitives of those
  // sizes, over the one shared object), of which `instance_limit` are kept, least recently used first out.
  bool rebind = true;
  int instance_limit = 16;
  // Every stage of the compilation written into a folder of its own under this one (default: the
  // TESSEL_DUMP_DIR environment variable; empty: none): NNN-<model>/00-input.tsl, one .tsl per graph
  // pass, NN-fuse.kernel (the kernel level) and NN-cpu-codegen.cpp (the generated source). The folder
  // of a compilation is CompiledCompileStats::dump_dir.
  std::string dump_dir;
};

struct CompiledCompileStats {
  GraphCompileStats graph;             // passes, arena, dynamic region (of the kernel-level graph)
  double compile_seconds = 0;          // everything: passes, fusion, codegen, compiler/cache, library setup
  double fuse_seconds = 0;
  double codegen_seconds = 0;
  double cxx_seconds = 0;              // the C++ compiler (0 on a cache hit)
  double load_seconds = 0;             // dlopen (reading and checking the shared object included)
  double entry_seconds = 0;            // load_cpu: reading and checking the entry's files
  double library_seconds = 0;          // oneDNN primitives and packed weights
  bool cache_hit = false;
  std::string cache_key, source_path, so_path;
  std::string model;                   // CompiledBackendOptions::model_name
  // Loaded from an executable-cache entry (load_cpu): no import, passes, fusion or packing ran.
  bool loaded = false;
  int prepacked = 0;                   // library kernels whose packed weights came from the entry
  int shared_packings = 0;             // library kernels reusing another kernel's packing of the same weights
  int kernels = 0, loop_kernels = 0, matmul_kernels = 0, conv_kernels = 0;
  int core_nodes_left = 0;             // core nodes not covered by a kernel (run by typed kernels)
  int library_epilogues = 0;           // matmul/conv epilogues oneDNN applies itself (no generated pass)
  int64_t bytes_unfused = 0, bytes_fused = 0;
  int threads = 1;
  // Symbolic compilations (docs/dynamic-shapes.md): the size symbols the generated code reads, and the
  // instances built for the bindings calls brought (each: the static kernels, arena plan and library
  // primitives of one binding), with the time they took; bytes_* are then those of the last instance.
  std::vector<std::string> symbols;
  int instances = 0;
  double instance_seconds = 0;
  std::string dump_dir;                // where this compilation's stages were written ("" when not)
  bool rebinding = false;              // one executable rebound per binding (CompiledBackendOptions::rebind)
  std::string rebind_refused;          // why not, when rebind was asked for
  int rebinds = 0;                     // calls whose binding differed from the one before
  double rebind_seconds = 0;
  int library_reused = 0;              // library calls an instance took from an earlier one (same sizes)
};

// Whether loop kernel `k` may write its output `out` over the buffers of its inputs `ins` (node
// positions): one phase, the output stored once through the row-major map of the loop space, every
// load of those inputs through the same map and before that store in the body. Then each loop point
// reads its elements of the inputs before writing the same element, and no point touches another's.
bool loop_writes_over_input(const Kernel& k, const std::vector<int>& ins, int out);

class CompiledExecutable;
struct BlobToStore;    // exe_entry.h
struct PackedToStore;

// Compiles `g` (as imported; example inputs as for compile_graph). Errors are tessel::Error naming
// the node, kernel or stage; a C++ compiler failure names the kept source file.
std::unique_ptr<CompiledExecutable> compile_cpu(std::unique_ptr<Graph> g, const std::vector<Tensor>& example_inputs = {},
                                                const CompiledBackendOptions& opts = {});

// Builds the executable an executable-cache entry (CompiledExecutable::save) describes: the kernel
// module is parsed from its text with the constants mapped from the entry's file, the shared object
// is loaded from the path the entry names and oneDNN's weights come prepacked. `example_inputs` as
// for compile_cpu (shapes only: entries are not written for models specialised on input values).
// Throws tessel::Error naming the entry's file on anything missing or damaged; the caller then
// compiles from the model instead.
// `key` (non-empty): the manifest must name it (an entry copied under another key is refused). The
// shared object is loaded only when its bytes match the checksum the manifest records.
std::unique_ptr<CompiledExecutable> load_cpu(const std::string& entry_dir, const std::vector<Tensor>& example_inputs = {},
                                             const CompiledBackendOptions& opts = {}, const std::string& key = {});

// The part of load_cpu that reads an entry's bytes: read_entry (checksums verified unless
// `verify_checksums` is false), the kernel module parsed from module.tkl and verified, its constants
// bound to constants.bin, the packed weights checked against the module's kernels. Loads no shared
// object and builds no primitive. Total over arbitrary bytes: returns the module's kernel count or
// throws tessel::Error, never crashes. The cache-entry fuzzer's entry point (with checksums off, so
// mutations reach the parsers behind them).
size_t check_cpu_entry(const std::string& entry_dir, bool verify_checksums = true);

class CompiledExecutable {
 public:
  ~CompiledExecutable();
  // Writes an executable-cache entry into the existing empty folder `dir`: the kernel module's text
  // (module.tkl), its larger constants (constants.bin), oneDNN's packed weights (packed.bin) and a
  // manifest.json naming the shared object. Needs CompiledBackendOptions::keep_module. Throws when
  // the executable cannot be stored (specialised on input values, a graph break of the whole model)
  // or a file cannot be written. docs/runtime/compiled-backend.md, "The executable cache".
  // `key` is recorded in the manifest (load_cpu's `key`).
  void save(const std::string& dir, const std::string& key = {}) const;
  // Why save() would refuse, or empty when it can store this executable.
  std::string unsaveable_reason() const;
  // The bytes save() would write, without alignment padding and the manifest (a few KB): checked
  // against the cache's budget before anything is written.
  uint64_t saved_bytes() const;
  // A symbolic executable first binds the symbols from the inputs' shapes (a shape the compilation
  // does not cover throws GuardFailure with the reason) and runs the instance of that binding.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs, GraphRunStats* stats = nullptr);
  const CompiledCompileStats& stats() const { return stats_; }
  // The kernels (symbolic ones for a symbolic executable) and the kernel-level graph.
  const std::vector<Kernel>& kernels() const { return kernels_; }
  const Graph& graph() const;
  bool symbolic() const { return sym_ != nullptr; }
  const std::string& source() const { return source_; }

 private:
  friend std::unique_ptr<CompiledExecutable> compile_cpu(std::unique_ptr<Graph>, const std::vector<Tensor>&,
                                                         const CompiledBackendOptions&);
  friend std::unique_ptr<CompiledExecutable> load_cpu(const std::string&, const std::vector<Tensor>&,
                                                      const CompiledBackendOptions&, const std::string&);
  struct Launch;
  struct Builder;
  // What save() writes besides the module text: the module's blobs and each kernel's packed weights.
  void stored_pieces(std::vector<BlobToStore>& blobs, std::vector<PackedToStore>& packed) const;
  struct Symbolic;
  // compile_cpu of a graph with size symbols.
  static std::unique_ptr<CompiledExecutable> compile_symbolic(std::unique_ptr<Graph> g, const std::vector<Tensor>& ex,
                                                              const CompiledBackendOptions& opts);
  CompiledExecutable();
  std::unique_ptr<GraphExecutable> exe_;
  std::unique_ptr<Symbolic> sym_;                 // a symbolic compilation: its module and instances
  std::vector<long> sym_values_;                  // an instance's binding, in the generated code's order
  std::vector<Kernel> kernels_;
  std::vector<std::unique_ptr<Launch>> launches_;
  std::vector<bool> in_library_;                  // per kernel: its epilogue runs inside oneDNN
  std::vector<cpu::LibraryEpilogue> library_;     // per kernel: that epilogue
  std::shared_ptr<cpu::SharedObject> so_;
  std::string source_;
  std::string module_text_;                       // with keep_module: the kernel module, blobs external
  std::vector<Tensor> module_blobs_;              // its blob<N> constants
  CompiledCompileStats stats_;
};

}  // namespace tessel
