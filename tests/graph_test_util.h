// Helpers for tests that build graphs by hand and run them on the compiled backend: deterministic
// varied tensors, one-output nodes by op name, and the compiled backend's test options.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "test_util.h"
#include "tessel/ir/graph.h"
#include "tessel/ir/op_registry.h"
#include "tessel/runtime/compiled_backend.h"

namespace tessel::testenv {

// Deterministic f32 values in [-1, 1) (an LCG: the tests need variety, not statistics).
inline Tensor varied_f32(Shape s, uint32_t seed) {
  std::vector<double> v(static_cast<size_t>(shape_numel(s)));
  uint32_t st = seed * 2654435761u + 1;
  for (auto& x : v) {
    st = st * 1664525u + 1013904223u;
    x = static_cast<double>(st >> 8) / static_cast<double>(1u << 24) * 2.0 - 1.0;
  }
  return Tensor::from_f64(DType::f32, std::move(s), v);
}

// Adds node `name` running `op` and returns its (only) output, named `name` + "_out".
inline Value* op_node(Graph& g, const char* op, const std::string& name, std::vector<Value*> ins,
                      std::map<std::string, Attr> attrs = {}) {
  return g.add_node(OpRegistry::get().find(op), name, std::move(ins), {name + "_out"}, std::move(attrs))->outputs[0];
}

// Two threads and the build tree's test compile cache.
inline CompiledBackendOptions compiled_test_options() {
  CompiledBackendOptions o;
  o.threads = 2;
  o.toolchain.cache_dir = (std::filesystem::path(tessel_binary()).parent_path() / "test-compile-cache").string();
  return o;
}

}  // namespace tessel::testenv
