// Symbolic sizes (support/sym.h): arithmetic against int64 evaluation, the provers, the text form and
// the symbol facts.
#include <gtest/gtest.h>

#include <random>

#include "tessel/support/error.h"
#include "tessel/support/sym.h"

namespace tessel {
namespace {

Dim S(const char* n) { return Dim::symbol(n); }

Dim parse(const std::string& s) {
  size_t pos = 0;
  auto d = parse_dim(s, pos);
  if (!d || pos != s.size()) throw Error(Location{}, "did not parse all of " + s);
  return *d;
}

TEST(Sym, ArithmeticIsPolynomial) {
  const Dim a = S("s0"), b = S("s1");
  EXPECT_EQ((a * 64 + 1).str(), "64*s0+1");
  EXPECT_EQ((a * b * 4).str(), "4*s0*s1");
  EXPECT_EQ((a + b - a).str(), "s1");
  EXPECT_EQ(((a + 1) * (a - 1)).str(), "s0*s0-1");
  EXPECT_TRUE((a - a).is_static());
  EXPECT_EQ((a - a).value(), 0);
  EXPECT_EQ(a * 2, 2 * a);
  EXPECT_NE(a, b);
  EXPECT_EQ(Dim(7) * 6, 42);
  EXPECT_EQ((-a).str(), "-s0");
}

// Random polynomials: evaluating the Dim equals evaluating the same arithmetic on int64.
TEST(Sym, EvaluationMatchesIntegerArithmetic) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> op(0, 3), small(-5, 9);
  for (int round = 0; round < 200; ++round) {
    const Bindings b{{"s0", 1 + round % 13}, {"s1", 2 + round % 5}};
    Dim d = S("s0");
    int64_t v = b.at("s0");
    for (int step = 0; step < 6; ++step) {
      const int k = small(rng);
      const bool sym = op(rng) == 0;
      const Dim x = sym ? S("s1") : Dim(k);
      const int64_t xv = sym ? b.at("s1") : k;
      switch (op(rng)) {
        case 0: d = d + x, v += xv; break;
        case 1: d = d - x, v -= xv; break;
        default: d = d * x, v *= xv; break;
      }
    }
    EXPECT_EQ(d.eval(b), v) << d.str();
    EXPECT_EQ(parse(d.str()), d) << d.str();
    EXPECT_EQ(d.substitute(b), Dim(v));
  }
}

TEST(Sym, SymbolicToIntegerThrows) {
  const Dim a = S("s0");
  EXPECT_THROW((void)static_cast<int64_t>(a), Error);
  EXPECT_EQ(static_cast<int64_t>(Dim(5)), 5);
  try {
    (void)a.value();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("s0"), std::string::npos);
  }
}

TEST(Sym, OverflowThrows) {
  const Dim big(int64_t{1} << 62);
  EXPECT_THROW((void)(big * 4), Error);
  EXPECT_THROW((void)(S("s0") * big * 4), Error);
  EXPECT_THROW((void)(S("s0") * big).eval({{"s0", 8}}), Error);
  EXPECT_THROW(parse("99999999999999999999"), Error);
}

TEST(Sym, ExactDivision) {
  const Dim a = S("s0"), b = S("s1");
  EXPECT_EQ(*exact_div(a * b * 64, a * 4), b * 16);
  EXPECT_EQ(*exact_div(a * 64 + 128, Dim(64)), a + 2);
  EXPECT_FALSE(exact_div(a * 64 + 1, Dim(64)).has_value());
  EXPECT_FALSE(exact_div(a * 6, b).has_value());
  EXPECT_EQ(*exact_div((a + 1) * 6, a + 1), Dim(6));
  EXPECT_FALSE(exact_div(a, Dim(0)).has_value());
}

TEST(Sym, ProversAreSound) {
  const Dim a = S("s0"), b = S("s1");
  EXPECT_TRUE(provably_nonneg(a - 1));
  EXPECT_TRUE(provably_ge(a * b, a));
  EXPECT_TRUE(provably_ge(a * a, a));
  EXPECT_FALSE(provably_ge(a, b));
  EXPECT_FALSE(provably_nonneg(a - 2));
  EXPECT_TRUE(provably_positive(a * 128 - 127));
  // whatever the prover says, it holds on every assignment tried
  std::mt19937 rng(3);
  for (int i = 0; i < 300; ++i) {
    const Dim d = a * (static_cast<int>(rng() % 5) - 2) + b * (static_cast<int>(rng() % 5) - 1) + (static_cast<int>(rng() % 7) - 3);
    if (!provably_nonneg(d)) continue;
    for (int64_t x = 1; x < 6; ++x)
      for (int64_t y = 1; y < 6; ++y) EXPECT_GE(d.eval({{"s0", x}, {"s1", y}}), 0) << d.str();
  }
}

TEST(Sym, TextForm) {
  EXPECT_EQ(parse("2*s0*s1+3"), S("s0") * S("s1") * 2 + 3);
  EXPECT_EQ(parse("s0-1").str(), "s0-1");
  EXPECT_EQ(parse("-4*seq+batch").str(), "batch-4*seq");
  size_t pos = 0;
  EXPECT_FALSE(parse_dim("?", pos).has_value());
  EXPECT_EQ(pos, 0u);
  EXPECT_THROW(parse("s0*"), Error);
  EXPECT_FALSE(valid_symbol_name("1x"));
  EXPECT_FALSE(valid_symbol_name(std::string(65, 'a')));
  EXPECT_THROW(Dim::symbol("a b"), Error);
}

TEST(Sym, SymbolTableFactsAndGuards) {
  SymbolTable t;
  t.declare({"s0", 1, 512, 1});
  t.declare({"s1", 8, 64, 8});
  EXPECT_EQ(t.violation({{"s0", 3}, {"s1", 16}}), "");
  EXPECT_NE(t.violation({{"s0", 513}, {"s1", 16}}).find("outside the compiled range [1, 512]"), std::string::npos);
  EXPECT_NE(t.violation({{"s0", 3}, {"s1", 12}}).find("not a multiple of 8"), std::string::npos);
  EXPECT_NE(t.violation({{"s1", 16}}).find("no value"), std::string::npos);
  EXPECT_EQ(t.upper_bound(S("s0") * S("s1") * 4), 512 * 64 * 4);
  EXPECT_EQ(t.lower_bound(S("s0") - S("s1")), 1 - 64);
  EXPECT_THROW(t.upper_bound(S("s9")), Error);
  EXPECT_THROW(t.declare({"s2", 0, 5, 1}), Error);
  EXPECT_THROW(t.declare({"s2", 5, 4, 1}), Error);
  EXPECT_THROW(t.declare({"s2", 3, 5, 8}), Error);
  EXPECT_EQ((SymbolInfo{"s1", 8, 64, 8}.str()), "s1 in [8, 64] multiple_of 8");
}

TEST(Sym, BroadcastDims) {
  const Dim a = S("s0");
  EXPECT_EQ(dims_str(broadcast_dims({a, 1}, {1, 128})), "[s0,128]");
  EXPECT_EQ(dims_str(broadcast_dims({a, 128}, {128})), "[s0,128]");
  EXPECT_THROW(broadcast_dims({a}, {128}), Error);
  EXPECT_THROW(broadcast_dims({a}, {S("s1")}), Error);
  EXPECT_THROW(broadcast_dims({Dim(3)}, {Dim(4)}), Error);
}

}  // namespace
}  // namespace tessel
