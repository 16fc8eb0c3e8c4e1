// Model locations: a .onnx or .tsl file, or a model-zoo folder (model.onnx or model.tsl, the form
// tessel.export writes, + test_data_set_N/).
#pragma once

#include <string>
#include <vector>

#include "tessel/support/tensor.h"

namespace tessel {

struct ModelPaths {
  std::string model;                   // path of the .onnx or .tsl file
  std::vector<std::string> data_sets;  // test_data_set_N folders next to it, in order
};

// Throws naming the path if it is neither a model file nor a folder holding model.onnx or model.tsl.
ModelPaths resolve_model(const std::string& path);

// A model given as .tsl text (a .tsl file, or a folder holding model.tsl and no model.onnx) rather than
// ONNX.
bool is_text_model(const std::string& path);

// The inputs of the model's test_data_set_0 (next to the file, or in the folder), or none.
std::vector<Tensor> model_inputs(const std::string& path);

// input_N.pb (or output_N.pb) files of a data set folder, in order of N.
std::vector<Tensor> read_data_set(const std::string& dir, const std::string& prefix);

}  // namespace tessel
