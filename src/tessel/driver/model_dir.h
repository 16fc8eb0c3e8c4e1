// Model locations: a .onnx file or a model-zoo folder (model.onnx + test_data_set_N/).
#pragma once

#include <string>
#include <vector>

#include "tessel/support/tensor.h"

namespace tessel {

struct ModelPaths {
  std::string model;                   // path of the .onnx file
  std::vector<std::string> data_sets;  // test_data_set_N folders next to it, in order
};

// Throws naming the path if it is neither an .onnx file nor a folder holding model.onnx.
ModelPaths resolve_model(const std::string& path);

// A model given as .tsl text (no data sets next to it) rather than an .onnx file or model-zoo folder.
bool is_text_model(const std::string& path);

// The inputs of the model's test_data_set_0, or none (a .tsl model, or no data set).
std::vector<Tensor> model_inputs(const std::string& path);

// input_N.pb (or output_N.pb) files of a data set folder, in order of N.
std::vector<Tensor> read_data_set(const std::string& dir, const std::string& prefix);

}  // namespace tessel
