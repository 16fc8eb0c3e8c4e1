// The KTIR folder form (docs/ktir.md): one module per exported kernel, the constants as .npy files and
// manifest.json naming, in program order, every step (exported kernel, or host step / kernel not
// exported, with the reason), every global's declaration and the files of the constants' values.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cctype>
#include <filesystem>
#include <fstream>

#include "tessel/export/ktir.h"
#include "tessel/export/npy.h"
#include "tessel/ir/graph.h"
#include "tessel/support/error.h"

namespace tessel::ktir {
namespace {

void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
  f.close();  // (a full disk shows at the last flush)
  if (!f) throw Error(Location{.file = path.string(), .pass = "ktir"}, "cannot write the file");
}

// A file name from a value name: letters, digits, '.', '-', '_' kept, the rest '_'.
std::string file_safe(const std::string& s) {
  std::string r;
  for (char c : s) r += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') ? c : '_';
  return r.substr(0, 80);
}

}  // namespace

std::string ktir_constant_file(size_t global, const Global& g) { return fmt::format("constants/{:03d}-{}.npy", global, file_safe(g.name)); }

nlohmann::json write_ktir_folder(const std::string& dir, const TileProgram& p, const KernelModule& m, const KtirExport& e,
                                 const std::vector<std::pair<std::string, Tensor>>* values) {
  namespace fs = std::filesystem;
  auto make_dir = [](const fs::path& d) {
    std::error_code ec;
    fs::create_directories(d, ec);
    if (ec) throw Error(Location{.file = d.string(), .pass = "ktir"}, "cannot create the folder: " + ec.message());
  };
  make_dir(fs::path(dir) / "constants");
  for (size_t i = 0; i < e.kernels.size(); ++i) write_file(fs::path(dir) / ktir_file_name(i, e.kernels[i]), e.kernels[i].module);
  nlohmann::json man = ktir_manifest(p, e);
  for (size_t gi = 0; gi < p.globals.size(); ++gi) {
    const Global& g = p.globals[gi];
    if (g.kind != Global::Kind::constant) continue;
    const Value* v = m.graph ? m.graph->find_value(g.name) : nullptr;
    if (!v || !v->constant)
      throw Error(Location{.node = g.name, .pass = "ktir"}, fmt::format("constant global '{}' has no value in the kernel module", g.name));
    const std::string file = ktir_constant_file(gi, g);
    write_file(fs::path(dir) / file, npy_bytes(*v->constant));
    man["globals"][gi]["file"] = file;
  }
  if (values) {
    make_dir(fs::path(dir) / "values");
    man["values"] = nlohmann::json::object();
    for (size_t i = 0; i < values->size(); ++i) {
      const auto& [name, t] = (*values)[i];
      const std::string file = fmt::format("values/{:03d}-{}.npy", i, file_safe(name));
      write_file(fs::path(dir) / file, npy_bytes(t));
      man["values"][name] = file;
    }
  }
  write_file(fs::path(dir) / "manifest.json", man.dump(1) + "\n");
  return man;
}

}  // namespace tessel::ktir
