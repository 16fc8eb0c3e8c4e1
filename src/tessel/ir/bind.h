// Binding a symbolic graph's size symbols (docs/dynamic-shapes.md): the values a call's input shapes
// give each symbol, the guard that checks them against the graph's facts, and the static graph of one
// binding (the oracle the symbolic compilation is tested against, and what a bucket runs).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessel/ir/graph.h"

namespace tessel {

// The symbols' values from the shapes of the graph's inputs (one shape per input, in order). A dim
// that is a bare symbol binds it; a static dim must equal the shape's; a dim that is an expression
// (2*s0) is checked once its symbols are bound. Then every fact of the graph's symbol table is
// checked (range, multiple_of). On any mismatch, returns the reason in one line ("input 'ids' dim 1
// is 600, outside s1 in [1, 512]") and leaves `out` unspecified; empty on success.
std::string bind_symbols(const Graph& g, const std::vector<Shape>& input_shapes, Bindings& out);

// A copy of `g` with every symbol replaced by its value in `b`: value types and size attributes
// become static (an attribute whose sizes are all known becomes a plain list of ints), the symbol
// table keeps only the symbols `b` leaves unbound. Constants share their storage with `g`'s. Values
// keep their names and nodes their order (ids are renumbered). Throws tessel::Error when a size
// evaluates negative or overflows.
std::unique_ptr<Graph> instantiate_graph(const Graph& g, const Bindings& b);

// "batch = 2, seq = 50": a binding as messages and reports show it.
std::string binding_str(const Bindings& b);

// Every symbol the graph's types and attributes name, sorted (those declared in g.symbols included).
std::vector<std::string> graph_symbols(const Graph& g);

// bind_symbols for a graph called many times: what each input dim is (a number, a symbol alone, an
// expression) is worked out once, and a call's binding is a vector of values in graph_symbols' order
// (no strings, no walk of the graph).
class SymbolBinder {
 public:
  explicit SymbolBinder(const Graph& g);
  const std::vector<std::string>& symbols() const { return symbols_; }
  // The values of symbols() from the inputs' shapes; the reason in one line when a dim or a fact does
  // not hold (bind_symbols' reasons), else empty.
  std::string bind(const std::vector<Shape>& shapes, std::vector<int64_t>& values) const;
  Bindings bindings(const std::vector<int64_t>& values) const;

 private:
  struct DimRule {
    size_t input, dim;
    int64_t number = -1;  // a static dim (-1: not one)
    int symbol = -1;      // a symbol alone: its position
    Dim expr;             // otherwise
  };
  std::vector<std::string> symbols_, input_names_;
  std::vector<size_t> ranks_;
  std::vector<DimRule> rules_;
  std::vector<SymbolInfo> facts_;  // per symbol (defaults where undeclared)
  std::vector<bool> bound_;        // per symbol: some input dim is it alone
};

}  // namespace tessel
