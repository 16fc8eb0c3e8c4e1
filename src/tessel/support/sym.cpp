// Symbolic sizes: polynomial arithmetic, provers, text form and symbol facts (see sym.h).
#include "tessel/support/sym.h"

#include <algorithm>
#include <limits>
#include <ostream>

#include "tessel/support/error.h"

namespace tessel {
namespace {

int64_t checked_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail("size arithmetic overflows int64 ({} + {})", a, b);
  return r;
}

int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail("size arithmetic overflows int64 ({} * {})", a, b);
  return r;
}

// Canonical order: higher degree first, then by the names.
bool term_before(const Dim::Term& a, const Dim::Term& b) {
  if (a.syms.size() != b.syms.size()) return a.syms.size() > b.syms.size();
  return a.syms < b.syms;
}

// Adds term t into the sorted list (merging an equal monomial, dropping a zero coefficient).
void add_term(std::vector<Dim::Term>& ts, Dim::Term t) {
  auto it = std::lower_bound(ts.begin(), ts.end(), t, term_before);
  if (it != ts.end() && it->syms == t.syms) {
    it->coef = checked_add(it->coef, t.coef);
    if (it->coef == 0) ts.erase(it);
    return;
  }
  if (t.coef != 0) ts.insert(it, std::move(t));
}

const std::vector<Dim::Term> kNoTerms;

}  // namespace

Dim Dim::make(int64_t c, std::vector<Term> terms) {
  Dim d(c);
  if (!terms.empty()) d.t_ = std::make_shared<const std::vector<Term>>(std::move(terms));
  return d;
}

Dim Dim::from_terms(int64_t c, std::vector<Term> terms) {
  std::vector<Term> ts;
  for (Term& t : terms) {
    std::sort(t.syms.begin(), t.syms.end());
    for (const std::string& s : t.syms)
      if (!valid_symbol_name(s)) fail("'{}' is not a valid size symbol name", s);
    if (t.syms.empty()) c = checked_add(c, t.coef);
    else add_term(ts, std::move(t));
  }
  return make(c, std::move(ts));
}

Dim Dim::symbol(const std::string& name) {
  if (!valid_symbol_name(name)) fail("'{}' is not a valid size symbol name", name);
  return make(0, {Term{1, {name}}});
}

int64_t Dim::value() const {
  if (is_symbolic()) fail("the size {} is symbolic where a static size is needed", str());
  return c_;
}

const std::vector<Dim::Term>& Dim::terms() const { return t_ ? *t_ : kNoTerms; }

std::vector<std::string> Dim::symbols() const {
  std::vector<std::string> out;
  for (const Term& t : terms())
    for (const std::string& s : t.syms)
      if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  std::sort(out.begin(), out.end());
  return out;
}

int64_t Dim::eval(const Bindings& b) const {
  int64_t r = c_;
  for (const Term& t : terms()) {
    int64_t p = t.coef;
    for (const std::string& s : t.syms) {
      auto it = b.find(s);
      if (it == b.end()) fail("the size symbol '{}' has no value", s);
      p = checked_mul(p, it->second);
    }
    r = checked_add(r, p);
  }
  return r;
}

Dim Dim::substitute(const Bindings& b) const {
  if (is_static()) return *this;
  int64_t c = c_;
  std::vector<Term> ts;
  for (const Term& t : terms()) {
    Term n{t.coef, {}};
    for (const std::string& s : t.syms) {
      auto it = b.find(s);
      if (it == b.end()) n.syms.push_back(s);
      else n.coef = checked_mul(n.coef, it->second);
    }
    if (n.syms.empty()) c = checked_add(c, n.coef);
    else add_term(ts, std::move(n));
  }
  return make(c, std::move(ts));
}

std::string Dim::str() const {
  std::string s;
  for (const Term& t : terms()) {
    int64_t c = t.coef;
    if (!s.empty()) {
      s += c < 0 ? "-" : "+";
      if (c < 0) c = -c;  // coefficients are never INT64_MIN: products are checked
    } else if (c < 0) {
      s += "-";
      c = -c;
    }
    if (c != 1) s += std::to_string(c) + "*";
    for (size_t i = 0; i < t.syms.size(); ++i) s += (i ? "*" : "") + t.syms[i];
  }
  if (s.empty()) return std::to_string(c_);
  if (c_ > 0) s += "+" + std::to_string(c_);
  if (c_ < 0) s += std::to_string(c_);
  return s;
}

std::ostream& operator<<(std::ostream& os, const Dim& d) { return os << d.str(); }

bool operator==(const Dim& a, const Dim& b) { return a.c_ == b.c_ && a.terms() == b.terms(); }

Dim operator+(const Dim& a, const Dim& b) {
  if (a.is_static() && b.is_static()) return Dim(checked_add(a.c_, b.c_));
  std::vector<Dim::Term> ts = a.terms();
  for (const Dim::Term& t : b.terms()) add_term(ts, t);
  return Dim::make(checked_add(a.c_, b.c_), std::move(ts));
}

Dim operator-(const Dim& a) {
  std::vector<Dim::Term> ts = a.terms();
  for (Dim::Term& t : ts) t.coef = checked_mul(t.coef, -1);
  return Dim::make(checked_mul(a.c_, -1), std::move(ts));
}

Dim operator-(const Dim& a, const Dim& b) { return a + (-b); }

Dim operator*(const Dim& a, const Dim& b) {
  if (a.is_static() && b.is_static()) return Dim(checked_mul(a.c_, b.c_));
  // (ca + sum ta) * (cb + sum tb)
  std::vector<Dim::Term> ts;
  auto with_const = [&](const std::vector<Dim::Term>& terms, int64_t c) {
    if (c == 0) return;
    for (const Dim::Term& t : terms) add_term(ts, Dim::Term{checked_mul(t.coef, c), t.syms});
  };
  with_const(a.terms(), b.c_);
  with_const(b.terms(), a.c_);
  for (const Dim::Term& x : a.terms())
    for (const Dim::Term& y : b.terms()) {
      Dim::Term t{checked_mul(x.coef, y.coef), x.syms};
      t.syms.insert(t.syms.end(), y.syms.begin(), y.syms.end());
      std::sort(t.syms.begin(), t.syms.end());
      add_term(ts, std::move(t));
    }
  return Dim::make(checked_mul(a.c_, b.c_), std::move(ts));
}

std::optional<Dim> exact_div(const Dim& a, const Dim& b) {
  if (b.is_static()) {
    const int64_t d = b.constant_term();
    if (d == 0) return std::nullopt;
    if (a.constant_term() % d != 0) return std::nullopt;
    for (const Dim::Term& t : a.terms())
      if (t.coef % d != 0) return std::nullopt;
    if (a.is_static()) return Dim(a.constant_term() / d);
    std::vector<Dim::Term> ts;
    for (const Dim::Term& t : a.terms()) ts.push_back(Dim::Term{t.coef / d, t.syms});
    return Dim::from_terms(a.constant_term() / d, std::move(ts));
  }
  if (a == b) return Dim(1);
  // b a single term: divide every term of a (a constant term of a cannot be divided by a symbol)
  if (b.terms().size() == 1 && b.constant_term() == 0 && a.constant_term() == 0) {
    const Dim::Term& bt = b.terms()[0];
    Dim r;
    for (const Dim::Term& t : a.terms()) {
      if (t.coef % bt.coef != 0) return std::nullopt;
      std::vector<std::string> rest = t.syms;
      for (const std::string& s : bt.syms) {
        auto it = std::find(rest.begin(), rest.end(), s);
        if (it == rest.end()) return std::nullopt;
        rest.erase(it);
      }
      Dim m(t.coef / bt.coef);
      for (const std::string& s : rest) m = m * Dim::symbol(s);
      r = r + m;
    }
    return r;
  }
  // a = k * b for a constant k: compare the leading terms, then check
  const Dim::Term& lb = b.terms()[0];
  if (a.terms().empty() || a.terms()[0].syms != lb.syms || a.terms()[0].coef % lb.coef != 0) return std::nullopt;
  const int64_t k = a.terms()[0].coef / lb.coef;
  if (b * k == a) return Dim(k);
  return std::nullopt;
}

namespace {
thread_local const SymbolTable* t_active_facts = nullptr;

bool nonneg_for_symbols_from_one(const Dim& a);
}  // namespace

const SymbolTable* active_symbol_facts() { return t_active_facts; }
ScopedSymbolFacts::ScopedSymbolFacts(const SymbolTable* t) : saved_(t_active_facts) { t_active_facts = t; }
ScopedSymbolFacts::~ScopedSymbolFacts() { t_active_facts = saved_; }

bool provably_nonneg(const Dim& a) {
  if (nonneg_for_symbols_from_one(a)) return true;
  const SymbolTable* facts = t_active_facts;
  if (!facts || facts->empty() || a.is_static()) return false;
  for (const std::string& s : a.symbols())
    if (!facts->find(s)) return false;  // a symbol the table does not declare: no decision
  return facts->lower_bound(a) >= 0;
}

namespace {
bool nonneg_for_symbols_from_one(const Dim& a) {
  // With every symbol s = 1 + t (t >= 0), a polynomial whose coefficients in t are all >= 0 is >= 0.
  // Expanding (1 + t)^k term by term: every subset of a term's symbols (as a multiset) contributes.
  std::map<std::vector<std::string>, int64_t> coef;
  try {
    coef[{}] = a.constant_term();
    for (const Dim::Term& t : a.terms()) {
      const size_t n = t.syms.size();
      if (n > 16) return false;
      for (uint32_t mask = 0; mask < (1u << n); ++mask) {
        std::vector<std::string> m;
        for (size_t i = 0; i < n; ++i)
          if (mask & (1u << i)) m.push_back(t.syms[i]);
        coef[m] = checked_add(coef[m], t.coef);
      }
    }
  } catch (const Error&) {
    return false;
  }
  for (const auto& [m, c] : coef)
    if (c < 0) return false;
  return true;
}
}  // namespace

bool dims_static(const Dims& d) {
  for (const Dim& x : d)
    if (x.is_symbolic()) return false;
  return true;
}

Dims dims_of(const Shape& s) { return Dims(s.begin(), s.end()); }

Shape static_shape(const Dims& d) {
  Shape s;
  s.reserve(d.size());
  for (const Dim& x : d) s.push_back(x.is_static() ? x.constant_term() : kUnknownDim);
  return s;
}

Shape require_static(const Dims& d) {
  Shape s;
  s.reserve(d.size());
  for (const Dim& x : d) s.push_back(x.value());
  return s;
}

Dim dims_numel(const Dims& d) {
  Dim n(1);
  for (const Dim& x : d) n = n * x;
  return n;
}

Dims dims_strides(const Dims& d) {
  Dims st(d.size(), Dim(1));
  for (int i = static_cast<int>(d.size()) - 2; i >= 0; --i) st[static_cast<size_t>(i)] = st[static_cast<size_t>(i) + 1] * d[static_cast<size_t>(i) + 1];
  return st;
}

std::string dims_str(const Dims& d) {
  std::string out = "[";
  for (size_t i = 0; i < d.size(); ++i) {
    if (i) out += ",";
    out += d[i].is_static() && d[i].constant_term() < 0 ? std::string("?") : d[i].str();
  }
  return out + "]";
}

Dims substitute_dims(const Dims& d, const Bindings& b) {
  Dims out;
  out.reserve(d.size());
  for (const Dim& x : d) out.push_back(x.substitute(b));
  return out;
}

Shape eval_dims(const Dims& d, const Bindings& b) {
  Shape s;
  s.reserve(d.size());
  for (const Dim& x : d) s.push_back(x.eval(b));
  return s;
}

Dims broadcast_dims(const Dims& a, const Dims& b) {
  const size_t r = std::max(a.size(), b.size());
  Dims out(r);
  for (size_t i = 0; i < r; ++i) {
    const Dim da = i < r - a.size() ? Dim(1) : a[i - (r - a.size())];
    const Dim db = i < r - b.size() ? Dim(1) : b[i - (r - b.size())];
    if (da == db || db == 1) out[i] = da;
    else if (da == 1) out[i] = db;
    else if ((da.is_static() && da.constant_term() < 0) || (db.is_static() && db.constant_term() < 0)) out[i] = kUnknownDim;
    else if (da.is_symbolic() || db.is_symbolic())
      unsupported("shapes {} and {} broadcast only if {} equals {} (or either is 1), which the symbols do not decide",
                  dims_str(a), dims_str(b), da.str(), db.str());
    else fail("shapes {} and {} do not broadcast", dims_str(a), dims_str(b));
  }
  return out;
}

bool valid_symbol_name(std::string_view n) {
  if (n.empty() || n.size() > 64) return false;
  auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (!alpha(n[0])) return false;
  for (char c : n)
    if (!alpha(c) && !(c >= '0' && c <= '9')) return false;
  return true;
}

std::optional<Dim> parse_dim(std::string_view s, size_t& pos) {
  size_t p = pos;
  auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  auto is_name_start = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  auto is_name = [&](char c) { return is_name_start(c) || is_digit(c); };
  auto at = [&](size_t i) { return i < s.size() ? s[i] : '\0'; };
  // factor := INT | NAME
  auto factor = [&]() -> std::optional<Dim> {
    if (is_digit(at(p))) {
      const size_t b = p;
      int64_t v = 0;
      bool overflow = false;
      while (is_digit(at(p))) {
        overflow = overflow || __builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, at(p) - '0', &v);
        ++p;
      }
      if (overflow) fail("integer {} is out of range for int64", std::string(s.substr(b, p - b)));
      return Dim(v);
    }
    if (is_name_start(at(p))) {
      const size_t b = p;
      while (is_name(at(p))) ++p;
      const std::string name(s.substr(b, p - b));
      if (!valid_symbol_name(name)) fail("'{}' is not a valid size symbol name", name);
      return Dim::symbol(name);
    }
    return std::nullopt;
  };
  auto term = [&]() -> std::optional<Dim> {
    auto f = factor();
    if (!f) return std::nullopt;
    Dim r = *f;
    while (at(p) == '*') {
      ++p;
      auto g = factor();
      if (!g) fail("a size is missing a factor after '*'");
      r = r * *g;
    }
    return r;
  };
  bool neg = false;
  if (at(p) == '-' && (is_digit(at(p + 1)) || is_name_start(at(p + 1)))) neg = true, ++p;
  auto t = term();
  if (!t) {
    return std::nullopt;
  }
  Dim r = neg ? -*t : *t;
  while ((at(p) == '+' || at(p) == '-') && (is_digit(at(p + 1)) || is_name_start(at(p + 1)))) {
    const bool minus = at(p) == '-';
    ++p;
    auto u = term();
    if (!u) fail("a size is missing a term");
    r = minus ? r - *u : r + *u;
  }
  pos = p;
  return r;
}

std::string SymTensor::str() const { return fmt::format("dims[{}]", fmt::join(elems, ", ")); }

std::string SymbolInfo::str() const {
  std::string s = fmt::format("{} in [{}, {}]", name, lo, hi);
  if (multiple_of != 1) s += fmt::format(" multiple_of {}", multiple_of);
  return s;
}

void SymbolTable::declare(SymbolInfo s) {
  if (!valid_symbol_name(s.name)) fail("'{}' is not a valid size symbol name", s.name);
  if (s.lo < 1) fail("size symbol {}: the range starts at {}, below 1", s.name, s.lo);
  if (s.hi < s.lo) fail("size symbol {}: the range [{}, {}] is empty", s.name, s.lo, s.hi);
  if (s.multiple_of < 1) fail("size symbol {}: multiple_of {} is not positive", s.name, s.multiple_of);
  if (s.hi / s.multiple_of * s.multiple_of < s.lo)
    fail("size symbol {}: no multiple of {} lies in [{}, {}]", s.name, s.multiple_of, s.lo, s.hi);
  syms_[s.name] = std::move(s);
}

const SymbolInfo* SymbolTable::find(const std::string& name) const {
  auto it = syms_.find(name);
  return it == syms_.end() ? nullptr : &it->second;
}

std::string SymbolInfo::violation(int64_t v) const {
  if (v < lo || v > hi) return fmt::format("{} = {} is outside the compiled range [{}, {}]", name, v, lo, hi);
  if (v % multiple_of != 0) return fmt::format("{} = {} is not a multiple of {}", name, v, multiple_of);
  return {};
}

std::string SymbolTable::violation(const Bindings& b) const {
  for (const auto& [name, s] : syms_) {
    auto it = b.find(name);
    if (it == b.end()) return fmt::format("size symbol {} has no value", name);
    if (std::string why = s.violation(it->second); !why.empty()) return why;
  }
  return {};
}

namespace {

// [lo, hi] of d by interval arithmetic over the table's ranges, saturating.
std::pair<int64_t, int64_t> interval(const SymbolTable& st, const Dim& d) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  auto sat_mul = [&](int64_t a, int64_t b) {
    int64_t r;
    if (!__builtin_mul_overflow(a, b, &r)) return r;
    return (a < 0) != (b < 0) ? kMin : kMax;
  };
  auto sat_add = [&](int64_t a, int64_t b) {
    int64_t r;
    if (!__builtin_add_overflow(a, b, &r)) return r;
    return a < 0 ? kMin : kMax;
  };
  int64_t lo = d.constant_term(), hi = d.constant_term();
  for (const Dim::Term& t : d.terms()) {
    int64_t plo = 1, phi = 1;  // the product of the symbols: all ranges positive
    for (const std::string& s : t.syms) {
      const SymbolInfo* info = st.find(s);
      if (!info) fail("size symbol '{}' is not declared", s);
      plo = sat_mul(plo, info->lo);
      phi = sat_mul(phi, info->hi);
    }
    int64_t a = sat_mul(t.coef, plo), b = sat_mul(t.coef, phi);
    if (a > b) std::swap(a, b);
    lo = sat_add(lo, a);
    hi = sat_add(hi, b);
  }
  return {lo, hi};
}

}  // namespace

int64_t SymbolTable::upper_bound(const Dim& d) const { return interval(*this, d).second; }
int64_t SymbolTable::lower_bound(const Dim& d) const { return interval(*this, d).first; }

}  // namespace tessel
