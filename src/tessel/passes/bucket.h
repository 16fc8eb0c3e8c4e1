// Buckets for targets that need static shapes (docs/dynamic-shapes.md, "Buckets"): the static graph
// of a symbolic core graph with one size symbol padded to a bucket, and masks where padding would
// change a result. The padded positions hold zeros on entry and whatever the ops make of them; a
// reduction or a contraction over the padded dim reads them through a select with the bucket's
// `valid` input (true for the first `length` positions): the reduction's identity (sum 0, max -inf,
// ...) or 0 for a contraction's operands. What a mask cannot make right is refused, naming the node:
// a reduction, contraction, window, slice, pad, concatenation, gather, scatter or sort over a dim
// that is the symbol times something, or moves positions along the padded dim; the size read as data
// (a `Sizes` node naming it); an output whose dim is not the symbol alone.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessel/ir/graph.h"

namespace tessel {

struct BucketedGraph {
  std::unique_ptr<Graph> graph;    // static: the symbol is `bucket`; its last input is the mask
  std::string valid_input;         // that input's name: bool[bucket]
  int masks = 0;                   // operands read through a mask
  // Per graph input and output (in order): the dims that are the padded symbol (pad inputs there with
  // zeros to the bucket, slice outputs there back to the length).
  std::vector<std::vector<int>> input_padded, output_padded;
};

// `core`: a core-level graph whose sizes name `symbol`; `bucket`: the size it is padded to; `others`:
// values for its other symbols. Throws tessel::Error (unsupported) naming the node that cannot be
// padded, and why.
BucketedGraph pad_to_bucket(const Graph& core, const std::string& symbol, int64_t bucket, const Bindings& others = {});

// The smallest of `buckets` that holds `length`; throws naming the largest when none does.
int64_t choose_bucket(const std::vector<int64_t>& buckets, int64_t length);

}  // namespace tessel
