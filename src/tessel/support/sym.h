// Symbolic sizes (docs/dynamic-shapes.md): a Dim is a known int64 or a polynomial with int64
// coefficients over named size symbols (s0, batch, seq); a SymbolTable holds each symbol's range and
// divisibility fact; Bindings give the symbols values when a model runs.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "tessel/support/dtype.h"
#include "tessel/support/shape.h"

namespace tessel {

// One symbol's value per name: what a call's input shapes give.
using Bindings = std::map<std::string, int64_t>;

// A size. Static Dims behave as the int64 they hold (the conversion is implicit so that code written
// for static sizes reads them unchanged); converting a symbolic Dim to int64 throws tessel::Error naming
// the expression, so a symbolic size reaching code that needs a number is a one-line error, never a
// silently wrong value. Every symbol is assumed >= 1 (sizes 0 are never symbolic), which is what the
// provers below use. Arithmetic that overflows int64 throws.
class Dim {
 public:
  // One term: coef * the product of the named symbols (sorted; a repeated name is a power).
  struct Term {
    int64_t coef = 0;
    std::vector<std::string> syms;
    bool operator==(const Term&) const = default;
  };

  Dim() = default;
  Dim(int64_t v) : c_(v) {}  // NOLINT: implicit, a static size
  template <typename I, std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool> && !std::is_same_v<I, int64_t>, int> = 0>
  Dim(I v) : c_(static_cast<int64_t>(v)) {}  // NOLINT
  static Dim symbol(const std::string& name);
  // c + the terms, canonicalised (equal monomials merged, zero coefficients dropped).
  static Dim from_terms(int64_t c, std::vector<Term> terms);

  bool is_static() const { return !t_ || t_->empty(); }
  bool is_symbolic() const { return !is_static(); }
  // The value of a static Dim; throws naming the expression for a symbolic one.
  int64_t value() const;
  operator int64_t() const { return value(); }  // NOLINT: see the class comment
  std::optional<int64_t> static_value() const { return is_static() ? std::optional<int64_t>(c_) : std::nullopt; }

  int64_t constant_term() const { return c_; }
  const std::vector<Term>& terms() const;  // the non-constant terms, canonical order
  std::vector<std::string> symbols() const;  // every symbol named, sorted, once each

  // The value under `b`; throws naming the symbol when one is unbound, and on overflow.
  int64_t eval(const Bindings& b) const;
  // The Dim with the bound symbols replaced by their values (others kept).
  Dim substitute(const Bindings& b) const;

  std::string str() const;  // "s0", "64*s0*s1", "s0+1", "7"

  friend bool operator==(const Dim& a, const Dim& b);
  template <typename I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  friend bool operator==(const Dim& a, I b) { return a.is_static() && a.c_ == static_cast<int64_t>(b); }

  friend Dim operator+(const Dim& a, const Dim& b);
  friend Dim operator-(const Dim& a, const Dim& b);
  friend Dim operator*(const Dim& a, const Dim& b);
  friend Dim operator-(const Dim& a);
  Dim& operator+=(const Dim& b) { return *this = *this + b; }
  Dim& operator-=(const Dim& b) { return *this = *this - b; }
  Dim& operator*=(const Dim& b) { return *this = *this * b; }

 private:
  int64_t c_ = 0;                                  // the constant term
  std::shared_ptr<const std::vector<Term>> t_;     // null or empty: static
  static Dim make(int64_t c, std::vector<Term> terms);
};

// Mixed forms with integers: exact matches, so `d * 2` is Dim arithmetic and not ambiguous with the
// built-in operator through the implicit conversion.
#define TESSEL_DIM_MIXED(OP)                                                                        \
  template <typename I, std::enable_if_t<std::is_integral_v<I>, int> = 0>                          \
  inline Dim operator OP(const Dim& a, I b) { return a OP Dim(static_cast<int64_t>(b)); }         \
  template <typename I, std::enable_if_t<std::is_integral_v<I>, int> = 0>                          \
  inline Dim operator OP(I a, const Dim& b) { return Dim(static_cast<int64_t>(a)) OP b; }
TESSEL_DIM_MIXED(+)
TESSEL_DIM_MIXED(-)
TESSEL_DIM_MIXED(*)
#undef TESSEL_DIM_MIXED

using Dims = std::vector<Dim>;
// A list of sizes equal to static numbers (found by argument-dependent lookup through Dim).
inline bool operator==(const Dims& a, const Shape& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i])) return false;
  return true;
}
std::ostream& operator<<(std::ostream& os, const Dim& d);  // its str()

// a / b when it is exact for every value of the symbols: b a non-zero constant dividing every
// coefficient, b a term dividing every term of a, or a == k * b; nullopt otherwise.
std::optional<Dim> exact_div(const Dim& a, const Dim& b);
// Whether a >= 0 holds for every assignment of the symbols >= 1, or, while a table of facts is active
// (ScopedSymbolFacts), for every assignment within its ranges (interval arithmetic). Sound, not complete.
bool provably_nonneg(const Dim& a);
inline bool provably_ge(const Dim& a, const Dim& b) { return provably_nonneg(a - b); }
inline bool provably_positive(const Dim& a) { return provably_nonneg(a - 1); }

bool dims_static(const Dims& d);
Dims dims_of(const Shape& s);
// The static shape of `d`; kUnknownDim where a dim is symbolic.
Shape static_shape(const Dims& d);
// The numbers of `d`; throws naming the first symbolic dim (for code that needs static sizes).
Shape require_static(const Dims& d);
Dim dims_numel(const Dims& d);
Dims dims_strides(const Dims& d);   // row-major element strides
std::string dims_str(const Dims& d);  // "[s0,128]"
inline std::string shape_str(const Dims& d) { return dims_str(d); }  // for code over either kind of shape
Shape eval_dims(const Dims& d, const Bindings& b);
Dims substitute_dims(const Dims& d, const Bindings& b);  // each Dim's substitute(b)
// numpy broadcasting of two shapes of sizes: equal dims stay, a 1 takes the other; an unknown dim
// (kUnknownDim) gives an unknown one. A symbolic dim against a different size (that is not 1) cannot be
// decided for every value of the symbols: an "unsupported" error naming both shapes.
Dims broadcast_dims(const Dims& a, const Dims& b);

// A list of sizes as a parameter: from a Dims, a static Shape or a braced list of either.
struct DimList {
  Dims d;
  DimList() = default;
  DimList(Dims v) : d(std::move(v)) {}                        // NOLINT
  DimList(const Shape& v) : d(v.begin(), v.end()) {}           // NOLINT
  DimList(std::initializer_list<Dim> v) : d(v) {}              // NOLINT
  operator const Dims&() const { return d; }                   // NOLINT
};

// Parses the text form of a Dim (str()'s output: terms of an optional integer coefficient and
// symbol names joined by '*', joined by '+' or '-') from s starting at `pos`; advances pos past it.
// nullopt (pos unchanged) when no Dim starts there; throws tessel::Error on a malformed or
// overflowing one.
std::optional<Dim> parse_dim(std::string_view s, size_t& pos);
bool valid_symbol_name(std::string_view n);  // [A-Za-z_][A-Za-z0-9_]*, at most 64 characters

// An integer tensor of a static (small) shape whose elements are sizes, some symbolic: what shape
// arithmetic computes from symbolic shapes (ONNX's Shape -> Gather -> Concat, a PyTorch view's size list).
struct SymTensor {
  DType dtype = DType::i64;
  Shape shape;           // static, numel == elems.size()
  Dims elems;            // row-major
  bool operator==(const SymTensor&) const = default;
  bool all_static() const { return dims_static(elems); }
  std::string str() const;  // "dims[s0, 128]" (shape [2])
};

// A symbol's facts: its range [lo, hi] and a divisor every value has. A compilation covers exactly
// the values that satisfy them; the guard checks each call's values against them.
struct SymbolInfo {
  std::string name;
  int64_t lo = 1, hi = int64_t{1} << 31;
  int64_t multiple_of = 1;
  bool operator==(const SymbolInfo&) const = default;
  std::string str() const;  // "s0 in [1, 512] multiple_of 8"
  // Why value v breaks these facts (one line), or empty.
  std::string violation(int64_t v) const;
};

class SymbolTable {
 public:
  // Adds or replaces a symbol; throws on an invalid name or facts (lo < 1, hi < lo, multiple_of < 1).
  void declare(SymbolInfo s);
  const SymbolInfo* find(const std::string& name) const;
  bool empty() const { return syms_.empty(); }
  const std::map<std::string, SymbolInfo>& all() const { return syms_; }
  // Checks b against every fact; the reason it fails (one line) or empty.
  std::string violation(const Bindings& b) const;
  // The largest value d takes over the table's ranges (interval arithmetic, so an upper bound);
  // throws when a symbol is not declared, saturates at INT64_MAX.
  int64_t upper_bound(const Dim& d) const;
  int64_t lower_bound(const Dim& d) const;
  bool operator==(const SymbolTable&) const = default;

 private:
  std::map<std::string, SymbolInfo> syms_;
};

// The facts of the graph whose sizes are being decided: shape inference over a graph (infer_graph,
// CoreBuilder), every graph pass the pass manager runs, fusion and the kernel-level verifier make its
// symbol table active while they work, so a rule's provably_* decisions use the
// ranges a compilation covers -- a slice of a 383-long mask up to s27 in [2, 383] takes s27 as is, where
// s27 >= 1 alone decides nothing. The guard checks every call against the same facts. Per thread;
// nested scopes restore the outer table.
const SymbolTable* active_symbol_facts();
class ScopedSymbolFacts {
 public:
  explicit ScopedSymbolFacts(const SymbolTable* t);
  ~ScopedSymbolFacts();
  ScopedSymbolFacts(const ScopedSymbolFacts&) = delete;
  ScopedSymbolFacts& operator=(const ScopedSymbolFacts&) = delete;

 private:
  const SymbolTable* saved_;
};

}  // namespace tessel

template <>
struct fmt::formatter<tessel::Dim> : fmt::formatter<std::string> {
  template <typename Ctx>
  auto format(const tessel::Dim& d, Ctx& ctx) const {
    return fmt::formatter<std::string>::format(d.str(), ctx);
  }
};
