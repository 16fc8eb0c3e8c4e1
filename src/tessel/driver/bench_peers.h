// `tessel bench`'s peer rows (issue 37): PyTorch eager and ONNX Runtime on the same model file, inputs and
// threads, each in its own process right after tessel's backends, so that one run of one command shows
// tessel beside what a user would otherwise run. The peers are the scripts bench/peers.py uses:
// bench/onnx_torch.py (the ONNX graph executed op by op with torch, under a Python that has torch) and
// bench/ort_bench.js (onnxruntime-node under node). A peer that cannot run (no interpreter, no torch, no
// onnxruntime-node, a model that is not ONNX, a failure or a timeout) is a skipped row with its reason.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tessel {

struct PeerBench {
  std::string peer;       // "pytorch-eager" or "onnxruntime"
  std::string version;    // torch's or onnxruntime-node's
  int threads = 0;        // intra-op threads the peer reported
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
  std::optional<double> max_abs_err;  // against the data set's outputs
  std::vector<std::string> blas;      // PyTorch: the BLAS/LAPACK/oneDNN libraries mapped into its process
};

struct PeerOptions {
  std::vector<std::string> peers;  // "torch", "ort"
  int threads = 1;                 // the compiled backend's threads: each peer gets as many
  int iters = 10;
  double timeout_s = 600;          // per peer process
  // Where onnx_torch.py and ort_bench.js are. Empty: $TESSEL_BENCH_DIR, else bench/ or share/tessel/bench/
  // beside the tessel executable's folder.
  std::string scripts_dir;
  std::string tessel_exe;          // locates the scripts when scripts_dir is empty
  bool progress = false;           // a line on stderr as each peer starts
};

struct PeerResults {
  std::vector<PeerBench> rows;
  std::vector<std::pair<std::string, std::string>> skipped;  // peer, why
};

// The peer names of a --peers value: "auto" (both), "none", or a comma list of torch and ort. Throws
// naming an unknown peer.
std::vector<std::string> parse_peers(const std::string& spec);

// Runs each peer of o.peers on MODEL (a model folder or .onnx file with test_data_set_0), one after the other.
PeerResults bench_peers(const std::string& model, const PeerOptions& o);

// What makes a peer's row unfair to read as the peer's speed: PyTorch on the reference (netlib) BLAS, or on
// fewer threads than tessel's compiled backend (`tessel_threads`). One line each.
std::vector<std::string> peer_warnings(const std::vector<PeerBench>& rows, int tessel_threads);

}  // namespace tessel
