// Model-zoo folder layout.
#include "tessel/driver/model_dir.h"

#include <algorithm>
#include <filesystem>

#include "tessel/frontend/onnx/importer.h"
#include "tessel/support/error.h"

namespace tessel {
namespace fs = std::filesystem;

bool is_text_model(const std::string& path) {
  if (fs::path(path).extension() == ".tsl") return true;
  std::error_code ec;
  return fs::is_directory(path, ec) && !fs::exists(fs::path(path) / "model.onnx", ec) &&
         fs::exists(fs::path(path) / "model.tsl", ec);
}

std::vector<Tensor> model_inputs(const std::string& path) {
  const ModelPaths mp = resolve_model(path);
  return mp.data_sets.empty() ? std::vector<Tensor>{} : read_data_set(mp.data_sets[0], "input");
}

ModelPaths resolve_model(const std::string& path) {
  ModelPaths p;
  fs::path dir;
  if (fs::is_directory(path)) {
    dir = path;
    p.model = (dir / "model.onnx").string();
    if (!fs::exists(p.model)) p.model = (dir / "model.tsl").string();
    if (!fs::exists(p.model)) throw Error(Location{.file = path}, "folder has no model.onnx or model.tsl");
  } else if (fs::exists(path)) {
    p.model = path;
    dir = fs::path(path).parent_path();
    if (dir.empty()) dir = ".";
  } else {
    throw Error(Location{.file = path}, "no such file or folder");
  }
  std::vector<std::pair<int, std::string>> sets;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("test_data_set_", 0) == 0) {
      try {
        sets.emplace_back(std::stoi(n.substr(14)), e.path().string());
      } catch (const std::exception&) {
      }
    }
  }
  std::sort(sets.begin(), sets.end());
  for (auto& [_, s] : sets) p.data_sets.push_back(s);
  return p;
}

std::vector<Tensor> read_data_set(const std::string& dir, const std::string& prefix) {
  std::vector<Tensor> out;
  for (int i = 0;; ++i) {
    fs::path f = fs::path(dir) / (prefix + "_" + std::to_string(i) + ".pb");
    if (!fs::exists(f)) break;
    out.push_back(read_tensor_pb(f.string()));
  }
  return out;
}

}  // namespace tessel
