// From a model file to a compiled CPU executable, through the executable cache: a warm start maps
// what an earlier compile stored (kernel module, constants, oneDNN's packed weights, the shared
// object) instead of importing, lowering, fusing and packing again. The entry is keyed by the model
// file's content, the example inputs' types, the options, the CPU and this build of tessel.
// docs/runtime/compiled-backend.md, "The executable cache".
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessel/frontend/onnx/importer.h"
#include "tessel/runtime/compiled_backend.h"

namespace tessel {

// A .tsl text file, a .onnx file or a model-zoo folder; `inputs` (optional) give shapes for symbolic
// dims. The graph is verified; errors name the file.
// symbolic_inputs: the inputs' dims that are not numbers become size symbols (ImportOptions), and
// `inputs` are not applied (docs/dynamic-shapes.md).
ImportedModel import_model_file(const std::string& path, const std::vector<Tensor>& inputs = {}, bool symbolic_inputs = false);

// The first data set next to `model` (its test_data_set_0), for a command run without --inputs. Without
// one, the model is imported first, so that a file that is not a model is refused as such (naming the
// file), not as a model missing its data; a model that imports gets "no --inputs given and no
// test_data_set_0 next to the model".
std::string default_data_set(const std::string& model);

struct ModelCompileOptions {
  CompiledBackendOptions backend;
  bool executable_cache = true;  // false: always import and compile (the kernel cache still applies)
  // Reuse the model file's content hash while its identity (inode, size, mtime, ctime) is unchanged;
  // false: hash the file's bytes on every call.
  bool trust_file_stat = true;
  // A progress line on stderr while it works (support/progress.h: shown after a second, on a terminal
  // redrawn in place, otherwise logged; nothing under `tessel --quiet`).
  bool progress = false;
};

struct ModelCompile {
  std::unique_ptr<CompiledExecutable> exe;
  bool entry_hit = false;          // loaded from the executable cache
  std::string entry_dir;           // the entry loaded or written (empty: none)
  std::string not_stored;          // why no entry was written on a miss (empty: written or hit)
  std::string load_error;          // an entry that existed but was damaged (reported on stderr, recompiled)
  double key_seconds = 0;          // hashing the model file
  double import_seconds = 0;       // 0 on a hit
  double seconds = 0;              // everything, file to callable
};

// `imported`: the model already imported from `path` by the caller (used on a miss instead of
// importing again; left alone on a hit).
ModelCompile compile_model_cpu(const std::string& path, const std::vector<Tensor>& example_inputs = {},
                               const ModelCompileOptions& opts = {}, ImportedModel* imported = nullptr);

}  // namespace tessel
