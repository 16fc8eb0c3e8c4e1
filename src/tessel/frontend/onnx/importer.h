// ONNX frontend: model files (libonnx protobuf) into the graph level, and TensorProto files into
// tensors.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tessel/ir/graph.h"

namespace tessel {

struct ImportOptions {
  // Shapes for the graph inputs, used where the model leaves dims symbolic (dim_param) and checked
  // against the model where it fixes them. Empty: keep the model's declared shapes.
  std::vector<std::optional<Shape>> input_shapes;
  // Compile once for every size (docs/dynamic-shapes.md): each dim_param of a graph input becomes a
  // size symbol of that name (made a valid symbol name: other characters become '_'), a dim with
  // neither value nor param a fresh one (`<input>_d<k>`); input_shapes are then not applied.
  bool symbolic_inputs = false;
};

struct ImportedModel {
  std::unique_ptr<Graph> graph;
  int opset = 0;                 // default-domain opset
  std::string producer;          // producer_name + version
  // How the importer read something the file leaves open, one line each with the node's name (printed
  // under the model's summary): e.g. a RoiAlign that torchvision wrote in its opset-10 form.
  std::vector<std::string> notes;
};

// Throws tessel::Error naming the file (and node) on any problem: unreadable or corrupt file,
// unsupported ops (all of them listed with their node names), unsupported dtypes, bad attributes.
ImportedModel import_onnx(const std::string& path, const ImportOptions& opts = {});

// Reads a serialized onnx TensorProto (the model zoo's input_N.pb / output_N.pb).
Tensor read_tensor_pb(const std::string& path);
// Writes a tensor as a serialized onnx TensorProto.
void write_tensor_pb(const Tensor& t, const std::string& name, const std::string& path);


}  // namespace tessel
