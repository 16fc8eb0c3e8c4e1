// The text form of the graph level (.tsl): printing and parsing. print(parse(print(g))) == print(g).
#pragma once

#include <string>

#include "tessel/ir/graph.h"

namespace tessel {

struct PrintOptions {
  int64_t inline_limit = 8;       // constants with at most this many elements are printed inline
  bool elide_constants = false;   // larger constants printed as their size only (not parseable)
};

std::string print_graph(const Graph& g, const PrintOptions& opts = {});

// Parses .tsl text. Errors carry file, line and column. `file` is only used in messages.
std::unique_ptr<Graph> parse_graph(const std::string& text, const std::string& file = "<text>");

// Pieces shared by the printer and the parser.
std::string format_value_name(const std::string& name);   // %x or %"needs quotes"
std::string quote_string(const std::string& s);            // "..." with escapes

}  // namespace tessel
