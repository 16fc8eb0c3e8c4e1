// The text form of the graph level (.tsl): printing and parsing. print(parse(print(g))) == print(g).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tessel/ir/graph.h"

namespace tessel {

struct PrintOptions {
  int64_t inline_limit = 8;       // constants with at most this many elements are printed inline
  bool elide_constants = false;   // larger constants printed as their size only (not parseable)
  // When set, larger constants are appended here (blob<N> is their index) instead of being printed
  // in a base64 `blobs` section: the caller stores their bytes elsewhere (the compile cache) and
  // hands them back to parse_graph through a BlobSource.
  std::vector<const Tensor*>* external_blobs = nullptr;
};

std::string print_graph(const Graph& g, const PrintOptions& opts = {});

// The data of blob<index> of type `type` for a text printed with external blobs; an empty Tensor when
// it has none (a parse error then names the blob).
using BlobSource = std::function<Tensor(int index, const TensorType& type)>;

// Parses .tsl text. Errors carry file, line and column. `file` is only used in messages. Blobs the
// text does not define in a `blobs` section come from `blobs` when given.
std::unique_ptr<Graph> parse_graph(const std::string& text, const std::string& file = "<text>",
                                   const BlobSource& blobs = {});

// Pieces shared by the printer and the parser.
std::string format_value_name(const std::string& name);   // %x or %"needs quotes"
std::string quote_string(const std::string& s);            // "..." with escapes
// The inverse of quote_string for every text parser (graph, kernel and tile levels): reads the
// literal starting at text[pos] (a '"') and moves pos past it. Escapes: \n \" \\ \xHH. On a malformed
// literal throws tessel::Error with the reason only, pos at the offending character; the caller adds
// file:line:col.
std::string unquote_string(std::string_view text, size_t& pos);

}  // namespace tessel
