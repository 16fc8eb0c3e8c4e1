// `tessel bench`'s peer rows: PyTorch eager and ONNX Runtime, each in its own process (bench_peers.h).
#include "tessel/driver/bench_peers.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tessel/driver/model_dir.h"
#include "tessel/support/error.h"
#include "tessel/support/escape.h"
#include "tessel/support/process.h"
#include "tessel/support/progress.h"
#include "tessel/support/strings.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

std::string env_or(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// The last JSON object line of a peer's standard output, or null.
nlohmann::json last_json_line(const std::string& out) {
  std::istringstream in(out);
  nlohmann::json found;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line.front() == '{') {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object()) found = std::move(j);
    }
  return found;
}

std::string scripts_dir(const PeerOptions& o) {
  if (!o.scripts_dir.empty()) return o.scripts_dir;
  if (std::string d = env_or("TESSEL_BENCH_DIR"); !d.empty()) return d;
  if (!o.tessel_exe.empty()) {
    const fs::path bin = fs::path(o.tessel_exe).parent_path();
    for (const fs::path& d : {bin.parent_path() / "bench", bin.parent_path() / "share" / "tessel" / "bench"})
      if (fs::exists(d / "onnx_torch.py")) return d.string();
  }
  return "";
}

double num(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}

std::optional<double> opt_num(const nlohmann::json& j, const char* key) {
  if (j.contains(key) && j[key].is_number()) return j[key].get<double>();
  return std::nullopt;
}

}  // namespace

std::vector<std::string> parse_peers(const std::string& spec) {
  if (spec == "auto") return {"torch", "ort"};
  if (spec == "none" || spec.empty()) return {};
  std::vector<std::string> out;
  for (const std::string& p : comma_list(spec)) {
    if (p != "torch" && p != "ort")
      throw Error(Location{.pass = "bench"}, fmt::format("--peers: unknown peer '{}' (known: torch, ort; or auto, none)", display_text(p)));
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  return out;
}

PeerResults bench_peers(const std::string& model, const PeerOptions& o) {
  PeerResults r;
  if (o.peers.empty()) return r;
  const ModelPaths mp = resolve_model(model);
  const std::string name_of[] = {"pytorch-eager", "onnxruntime"};
  auto skip_all = [&](const std::string& why) {
    for (const std::string& p : o.peers) r.skipped.emplace_back(p == "torch" ? name_of[0] : name_of[1], why);
    return r;
  };
  if (fs::path(mp.model).extension() != ".onnx")
    return skip_all("the peers read ONNX files, and this model is tessel text (.tsl)");
  const std::string dir = scripts_dir(o);
  if (dir.empty())
    return skip_all("bench/onnx_torch.py and bench/ort_bench.js were not found beside the tessel executable "
                    "(set $TESSEL_BENCH_DIR to the source tree's bench/)");
  const std::string threads = std::to_string(o.threads), iters = std::to_string(o.iters);
  for (const std::string& p : o.peers) {
    const std::string peer = p == "torch" ? name_of[0] : name_of[1];
    if (o.progress && progress_mode() != ProgressMode::quiet) fmt::print(stderr, "bench: {} (a peer, in its own process)\n", peer);
    std::vector<std::string> argv, env;
    if (p == "torch") {
      std::string py = env_or("TESSEL_PYTHON");
      if (py.empty()) py = find_program("/usr/bin/python3");
      if (py.empty()) py = find_program("python3");
      if (py.empty()) {
        r.skipped.emplace_back(peer, "no Python: python3 is not on $PATH (set $TESSEL_PYTHON to one that has torch)");
        continue;
      }
      argv = {py, (fs::path(dir) / "onnx_torch.py").string(), model, "--threads", threads, "--iters", iters,
              "--warmup", "3", "--no-native", "--json"};
    } else {
      const std::string node = find_program("node");
      if (node.empty()) {
        r.skipped.emplace_back(peer, "no node on $PATH (ONNX Runtime runs as onnxruntime-node)");
        continue;
      }
      argv = {node, (fs::path(dir) / "ort_bench.js").string(), model, "--threads", threads, "--iters", iters, "--warmup", "3"};
      if (std::string ort = env_or("TESSEL_ORT_DIR"); !ort.empty()) env.push_back("NODE_PATH=" + (fs::path(ort) / "node_modules").string());
    }
    const ProcessResult c = run_process(argv, env, o.timeout_s);
    const nlohmann::json j = last_json_line(c.out);
    if (!c.ok() || !j.is_object() || j.contains("error")) {
      std::string why = j.is_object() && j.contains("error") && j["error"].is_string() ? j["error"].get<std::string>()
                        : c.ok() ? "printed no JSON result"
                                 : c.why(o.timeout_s);
      why = display_text(why.substr(0, why.find('\n')));   // (node's require stack follows the first line)
      if (p == "ort" && why.starts_with("onnxruntime-node not found"))
        why = "onnxruntime-node is not installed where node looks (set $TESSEL_ORT_DIR to a folder holding "
              "node_modules/onnxruntime-node; `npm install onnxruntime-node` there, or bench/peers.py --ort-dir, installs it)";
      if (why.size() > 300) why = why.substr(0, 300) + "...";
      r.skipped.emplace_back(peer, why);
      continue;
    }
    PeerBench b;
    b.peer = peer;
    if (p == "torch") {
      const nlohmann::json e = j.value("onnx_eager", nlohmann::json::object());
      b.version = "torch " + j.value("torch_version", std::string("?"));
      b.threads = j.value("threads", 0);
      b.median_ms = num(e, "median_ms"), b.p10_ms = num(e, "p10_ms"), b.p90_ms = num(e, "p90_ms");
      b.max_abs_err = opt_num(e, "max_abs_err");
      if (j.contains("blas_libs") && j["blas_libs"].is_array())
        for (const auto& l : j["blas_libs"])
          if (l.is_string()) b.blas.push_back(l.get<std::string>());
    } else {
      b.version = "onnxruntime " + (j.contains("ort_version") && j["ort_version"].is_string() ? j["ort_version"].get<std::string>() : "?");
      b.threads = j.value("threads", 0);
      b.median_ms = num(j, "median_ms"), b.p10_ms = num(j, "p10_ms"), b.p90_ms = num(j, "p90_ms");
      b.max_abs_err = opt_num(j, "max_abs_err");
    }
    r.rows.push_back(std::move(b));
  }
  return r;
}

std::vector<std::string> peer_warnings(const std::vector<PeerBench>& rows, int tessel_threads) {
  std::vector<std::string> out;
  for (const PeerBench& b : rows) {
    if (b.threads > 0 && b.threads < tessel_threads)
      out.push_back(fmt::format("{} ran on {} thread{}, tessel's compiled backend on {}: its row is not a like-for-like figure",
                                b.peer, b.threads, b.threads == 1 ? "" : "s", tessel_threads));
    for (const std::string& l : b.blas) {
      // Debian's reference BLAS (netlib) is /usr/lib/<triplet>/blas/libblas.so.3; OpenBLAS lives under openblas-*/
      const std::string base = fs::path(l).filename().string();
      if (base.starts_with("libblas.so") && l.find("/blas/") != std::string::npos && l.find("openblas") == std::string::npos) {
        out.push_back(fmt::format("{} uses the reference (netlib) BLAS ({}): its matrix products are several times slower "
                                  "than an optimized BLAS's (install libopenblas0-openmp, or see bench/peers.py --torch-blas)",
                                  b.peer, display_text(l)));
        break;
      }
    }
  }
  return out;
}

}  // namespace tessel
