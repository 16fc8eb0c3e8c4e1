// tessel_rt.h, the math of generated CPU kernels: ulp bounds against <cmath> in double, special
// values as C gives them, and the same results from loops vectorized by the CPU toolchain.
#include "tessel/targets/cpu/rt/tessel_rt.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tessel/targets/cpu/toolchain.h"

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kMax = std::numeric_limits<float>::max();
constexpr float kMinNormal = std::numeric_limits<float>::min();
constexpr float kDenormMin = std::numeric_limits<float>::denorm_min();

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Error of `got` in units of the last place of the float nearest to the exact value `want`
// (denormal spacing below the normal range; inf counts as 2^128).
double ulp_error(float got, double want) {
  if (std::isnan(want)) return std::isnan(got) ? 0 : 1e30;
  if (std::isnan(got)) return 1e30;
  const double top = std::ldexp(1.0, 128);
  double g = std::isinf(got) ? std::copysign(top, got) : got;
  double w = std::isinf(want) ? std::copysign(top, want) : std::fmax(std::fmin(want, top), -top);
  int e = 0;
  std::frexp(std::fabs(w) > 0 ? static_cast<float>(std::fmin(std::fabs(w), kMax)) : kDenormMin, &e);
  double ulp = std::ldexp(1.0, std::max(e - 24, -149));
  return std::fabs(g - w) / ulp;
}

// Every `stride`-th float bit pattern between lo and hi (both of one sign), plus the end points.
std::vector<float> float_range(float lo, float hi, uint32_t count) {
  std::vector<float> out;
  auto add_span = [&](uint32_t a, uint32_t b, uint32_t sign) {  // a <= b, magnitudes
    uint32_t stride = std::max<uint32_t>(1, (b - a) / count);
    for (uint64_t u = a; u <= b; u += stride) out.push_back(from_bits(static_cast<uint32_t>(u) | sign));
    out.push_back(from_bits(b | sign));
  };
  if (lo < 0) add_span(hi < 0 ? bits(-hi) : 0, bits(-lo), 0x80000000u);
  if (hi >= 0) add_span(lo > 0 ? bits(lo) : 0, bits(hi), 0);
  return out;
}

// Uniform samples in [lo, hi] (linear, unlike float_range which is dense near zero).
std::vector<float> uniform(float lo, float hi, int count, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> out(count);
  for (float& v : out) v = d(gen);
  return out;
}

struct Worst {
  double ulp = 0;
  float x = 0, y = 0;
  float got = 0;
  double want = 0;
};

template <typename F, typename R>
Worst worst_unary(const std::vector<float>& xs, F f, R ref) {
  Worst w;
  for (float x : xs) {
    float got = f(x);
    double want = ref(static_cast<double>(x));
    double e = ulp_error(got, want);
    if (e > w.ulp) w = {e, x, 0, got, want};
  }
  return w;
}

std::string describe(const Worst& w) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "worst %.3f ulp at x=%.9g y=%.9g: got %.9g want %.17g", w.ulp, w.x, w.y, w.got,
                w.want);
  return buf;
}

std::vector<float> concat(std::vector<std::vector<float>> parts) {
  std::vector<float> out;
  for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

constexpr double kBound = 4.0;

TEST(RtMath, ExpWithinFourUlp) {
  auto xs = concat({float_range(-104, 89, 2000000), uniform(-104, 89, 200000, 1)});
  Worst w = worst_unary(xs, tsl_exp, [](double x) { return std::exp(x); });
  EXPECT_LE(w.ulp, kBound) << describe(w);
}

TEST(RtMath, LogWithinFourUlpOnAllPositiveFloats) {
  auto xs = concat({float_range(kDenormMin, kMax, 4000000), uniform(0.5f, 2.0f, 200000, 2)});
  Worst w = worst_unary(xs, tsl_log, [](double x) { return std::log(x); });
  EXPECT_LE(w.ulp, kBound) << describe(w);
}

TEST(RtMath, TanhWithinFourUlp) {
  auto xs = concat({float_range(-kMax, kMax, 3000000), uniform(-10, 10, 200000, 3)});
  Worst w = worst_unary(xs, tsl_tanh, [](double x) { return std::tanh(x); });
  EXPECT_LE(w.ulp, kBound) << describe(w);
}

TEST(RtMath, ErfWithinFourUlp) {
  auto xs = concat({float_range(-kMax, kMax, 3000000), uniform(-5, 5, 200000, 4)});
  Worst w = worst_unary(xs, tsl_erf, [](double x) { return std::erf(x); });
  EXPECT_LE(w.ulp, kBound) << describe(w);
}

TEST(RtMath, SinCosWithinFourUlpBelowTwoToThe25) {
  const float lim = 33554432.0f;  // 2^25
  auto xs = concat({float_range(-lim, lim, 3000000), uniform(-1e4f, 1e4f, 300000, 5), uniform(-lim, lim, 300000, 6)});
  Worst s = worst_unary(xs, tsl_sin, [](double x) { return std::sin(x); });
  EXPECT_LE(s.ulp, kBound) << "sin " << describe(s);
  Worst c = worst_unary(xs, tsl_cos, [](double x) { return std::cos(x); });
  EXPECT_LE(c.ulp, kBound) << "cos " << describe(c);
  // Beyond 2^25 the results stay in [-1, 1].
  for (float x : float_range(lim, kMax, 100000)) {
    ASSERT_LE(std::fabs(tsl_sin(x)), 1.0f) << x;
    ASSERT_LE(std::fabs(tsl_cos(-x)), 1.0f) << x;
  }
}

TEST(RtMath, AtanWithinFourUlp) {
  auto xs = concat({float_range(-kMax, kMax, 3000000), uniform(-4, 4, 200000, 7)});
  Worst w = worst_unary(xs, tsl_atan, [](double x) { return std::atan(x); });
  EXPECT_LE(w.ulp, kBound) << describe(w);
}

TEST(RtMath, PowWithinFourUlp) {
  Worst w;
  auto check = [&](float x, float y) {
    double e = ulp_error(tsl_pow(x, y), std::pow(static_cast<double>(x), static_cast<double>(y)));
    if (e > w.ulp) w = {e, x, y, tsl_pow(x, y), std::pow(static_cast<double>(x), static_cast<double>(y))};
  };
  std::mt19937 gen(8);
  std::uniform_real_distribution<float> ys(-40, 40);
  for (float x : float_range(kDenormMin, kMax, 300000)) {
    for (int k = 0; k < 4; ++k) check(x, ys(gen));
  }
  for (float x : uniform(0.25f, 4.0f, 200000, 9)) check(x, ys(gen) * 8);
  for (float x : uniform(-30, 30, 100000, 10)) check(x, std::round(ys(gen)));  // negative bases, integer powers
  for (float y : float_range(-300, 300, 200000)) check(1.0001f, y), check(0.9999f, y), check(2.0f, y);
  EXPECT_LE(w.ulp, kBound) << describe(w);
}

TEST(RtMath, FmodIsExact) {
  auto xs = concat({float_range(-kMax, kMax, 2000), uniform(-100, 100, 1000, 11)});
  auto ys = concat({float_range(-kMax, kMax, 500), uniform(-10, 10, 300, 12)});
  for (float x : xs) {
    for (float y : ys) {
      float got = tsl_fmod(x, y);
      float want = static_cast<float>(std::fmod(static_cast<double>(x), static_cast<double>(y)));
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got)) << x << " " << y;
      } else {
        ASSERT_EQ(bits(got), bits(want)) << "fmod(" << x << ", " << y << ") = " << got << ", want " << want;
      }
    }
  }
}

TEST(RtMath, ExactOperations) {
  for (float x : concat({float_range(-kMax, kMax, 200000), uniform(-10, 10, 10000, 13),
                         {0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 8388607.5f, -0.0f, kInf, -kInf}})) {
    ASSERT_EQ(bits(tsl_floor(x)), bits(std::floor(x))) << x;
    ASSERT_EQ(bits(tsl_round_even(x)), bits(std::nearbyint(x))) << x;
    if (x >= 0) {
      ASSERT_EQ(bits(tsl_sqrt(x)), bits(static_cast<float>(std::sqrt(static_cast<double>(x))))) << x;
    }
  }
  EXPECT_TRUE(std::isnan(tsl_sqrt(-1.0f)));
  EXPECT_EQ(tsl_round_even(2.5f), 2.0f);
  EXPECT_EQ(tsl_round_even(-3.5f), -4.0f);
}

TEST(RtMath, MaxMinPropagateNaN) {
  const float vals[] = {-kInf, -2.5f, -0.0f, 0.0f, 1.0f, kInf, kNaN};
  for (float a : vals) {
    for (float b : vals) {
      if (std::isnan(a) || std::isnan(b)) {
        EXPECT_TRUE(std::isnan(tsl_max(a, b)) && std::isnan(tsl_min(a, b))) << a << " " << b;
        EXPECT_TRUE(std::isnan(tsl_max_f64(a, b)) && std::isnan(tsl_min_f64(a, b))) << a << " " << b;
      } else {
        EXPECT_EQ(tsl_max(a, b), std::max(a, b));
        EXPECT_EQ(tsl_min(a, b), std::min(a, b));
        EXPECT_EQ(tsl_max_f64(a, b), std::max<double>(a, b));
        EXPECT_EQ(tsl_min_f64(a, b), std::min<double>(a, b));
      }
    }
  }
}

const float kSpecial[] = {0.0f, -0.0f, kDenormMin, -kDenormMin, kMinNormal, -kMinNormal, 1e-20f, -1e-20f, 0.5f,
                          -0.5f, 1.0f, -1.0f, 1.5f, -1.5f, 2.0f, -2.0f, 2.5f, -2.5f, 3.0f, -3.0f, 88.72283f,
                          88.72284f, -87.33655f, -103.97208f, -103.97209f, 16777215.0f, 16777216.0f,
                          -16777215.0f, -16777217.0f, 1e10f, -1e10f, kMax, -kMax, kInf, -kInf, kNaN};

// Same class as C: NaN-ness, infinities and the sign of zeros exactly, finite values within 4 ulp.
bool like_c(float got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  float wf = static_cast<float>(want);
  if (wf == 0 || std::isinf(wf)) return bits(got) == bits(wf);
  return ulp_error(got, want) <= kBound;
}
void expect_like_c(float got, double want, const std::string& what) {
  EXPECT_TRUE(like_c(got, want)) << what << ": got " << got << ", want " << want << " ("
                                 << ulp_error(got, want) << " ulp)";
}

TEST(RtMath, SpecialValuesLikeC) {
  for (float x : kSpecial) {
    std::string s = std::to_string(x);
    expect_like_c(tsl_exp(x), std::exp(double(x)), "exp " + s);
    expect_like_c(tsl_log(x), std::log(double(x)), "log " + s);
    expect_like_c(tsl_tanh(x), std::tanh(double(x)), "tanh " + s);
    expect_like_c(tsl_erf(x), std::erf(double(x)), "erf " + s);
    expect_like_c(tsl_atan(x), std::atan(double(x)), "atan " + s);
    if (!(std::fabs(x) > 33554432.0f)) {
      expect_like_c(tsl_sin(x), std::sin(double(x)), "sin " + s);
      expect_like_c(tsl_cos(x), std::cos(double(x)), "cos " + s);
    }
    for (float y : kSpecial) {
      std::string xy = "(" + s + ", " + std::to_string(y) + ")";
      expect_like_c(tsl_pow(x, y), std::pow(double(x), double(y)), "pow" + xy);
      expect_like_c(tsl_fmod(x, y), std::fmod(double(x), double(y)), "fmod" + xy);
    }
  }
  EXPECT_TRUE(std::isnan(tsl_sin(kInf)) && std::isnan(tsl_cos(-kInf)));
  EXPECT_EQ(tsl_pow(kNaN, 0.0f), 1.0f);
  EXPECT_EQ(tsl_pow(1.0f, kNaN), 1.0f);
  EXPECT_EQ(tsl_pow(-1.0f, kInf), 1.0f);
}

TEST(RtMath, DoubleVersionsAreTheLibraryFunctions) {
  for (double x : {-3.7, -0.5, 0.0, 0.3, 1.0, 2.5, 40.0}) {
    EXPECT_EQ(tsl_exp_f64(x), std::exp(x));
    EXPECT_EQ(tsl_tanh_f64(x), std::tanh(x));
    EXPECT_EQ(tsl_erf_f64(x), std::erf(x));
    EXPECT_EQ(tsl_sin_f64(x), std::sin(x));
    EXPECT_EQ(tsl_cos_f64(x), std::cos(x));
    EXPECT_EQ(tsl_atan_f64(x), std::atan(x));
    EXPECT_EQ(tsl_floor_f64(x), std::floor(x));
    EXPECT_EQ(tsl_round_even_f64(x), std::nearbyint(x));
    EXPECT_EQ(tsl_fmod_f64(x, 0.7), std::fmod(x, 0.7));
    EXPECT_EQ(tsl_pow_f64(std::fabs(x), 1.3), std::pow(std::fabs(x), 1.3));
    if (x > 0) {
      EXPECT_EQ(tsl_log_f64(x), std::log(x));
    }
    if (x >= 0) {
      EXPECT_EQ(tsl_sqrt_f64(x), std::sqrt(x));
    }
  }
}

// Loops over the functions compiled by the toolchain (-O2 -march=native, vectorized, and with
// GCC's default fp-contract=fast, so rounding may differ from the scalar build above) keep the same
// bounds: 4 ulp, special values like C, exact operations exact.
TEST(RtMath, VectorizedLoopsKeepTheBounds) {
  std::string src = "#include \"tessel_rt.h\"\n";
  const char* unary[] = {"exp",        "log",        "tanh",        "erf",        "sin",        "cos",
                         "atan",       "sqrt",       "floor",       "round_even", "exp_inline", "log_inline",
                         "tanh_inline", "erf_inline", "sin_inline", "cos_inline", "atan_inline"};
  const char* binary[] = {"pow", "fmod", "max", "min", "pow_inline", "fmod_inline"};
  for (const char* f : unary) {
    src += std::string("extern \"C\" void v_") + f + "(const float* x, float* y, int n) {\n#pragma omp simd\n" +
           "  for (int i = 0; i < n; ++i) y[i] = tsl_" + f + "(x[i]);\n}\n";
  }
  for (const char* f : binary) {
    src += std::string("extern \"C\" void v_") + f +
           "(const float* a, const float* b, float* y, int n) {\n#pragma omp simd\n" +
           "  for (int i = 0; i < n; ++i) y[i] = tsl_" + f + "(a[i], b[i]);\n}\n";
  }
  std::string dir = (std::filesystem::temp_directory_path() / "tessel-rt-XXXXXX").string();
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  tessel::cpu::ToolchainOptions opts;
  opts.cache_dir = dir;
  auto built = tessel::cpu::build_shared_object(src, "rt_math_test", opts);

  const float lim = 33554432.0f;  // sin/cos bound holds below 2^25
  auto xs = concat({float_range(-lim, lim, 300000), uniform(-20, 20, 100000, 14),
                    std::vector<float>(std::begin(kSpecial), std::end(kSpecial))});
  auto ys = uniform(-8, 8, static_cast<int>(xs.size()), 15);
  for (size_t i = 0; i < std::size(kSpecial); ++i) ys[i * 7 % ys.size()] = kSpecial[i];
  const int n = static_cast<int>(xs.size());
  std::vector<float> got(xs.size());
  double (*ref_unary[])(double) = {std::exp, std::log,   std::tanh,  std::erf,       std::sin, std::cos,
                                   std::atan, std::sqrt, std::floor, std::nearbyint, std::exp, std::log,
                                   std::tanh, std::erf,  std::sin,   std::cos,       std::atan};
  for (size_t k = 0; k < std::size(unary); ++k) {
    built.so->function<void(const float*, float*, int)>(std::string("v_") + unary[k])(xs.data(), got.data(), n);
    const bool exact = k >= 7 && k <= 9;
    const std::string name = unary[k];
    const bool trig = name.rfind("sin", 0) == 0 || name.rfind("cos", 0) == 0;
    for (int i = 0; i < n; ++i) {
      double want = ref_unary[k](xs[i]);
      auto what = [&] { return name + "(" + std::to_string(xs[i]) + ")"; };
      if (trig && !(std::fabs(xs[i]) < lim)) {
        ASSERT_TRUE(std::isnan(got[i]) || std::fabs(got[i]) <= 1.0f) << what();
        continue;
      }
      if (exact && !std::isnan(want)) {
        ASSERT_EQ(bits(got[i]), bits(static_cast<float>(want))) << what();
      } else {
        ASSERT_TRUE(like_c(got[i], want)) << what() << ": got " << got[i] << ", want " << want;
      }
    }
  }
  auto pow_ref = [](double a, double b) { return std::pow(a, b); };
  auto fmod_ref = [](double a, double b) { return std::fmod(a, b); };
  double (*ref_binary[])(double, double) = {
      pow_ref, fmod_ref, [](double a, double b) { return std::isnan(a) || std::isnan(b) ? a + b : std::max(a, b); },
      [](double a, double b) { return std::isnan(a) || std::isnan(b) ? a + b : std::min(a, b); }, pow_ref, fmod_ref};
  for (size_t k = 0; k < std::size(binary); ++k) {
    built.so->function<void(const float*, const float*, float*, int)>(std::string("v_") + binary[k])(
        xs.data(), ys.data(), got.data(), n);
    for (int i = 0; i < n; ++i) {
      double want = ref_binary[k](xs[i], ys[i]);
      auto what = [&] {
        return std::string(binary[k]) + "(" + std::to_string(xs[i]) + ", " + std::to_string(ys[i]) + ")";
      };
      if (k != 0 && k != 4 && !std::isnan(want)) {  // all but pow are exact
        ASSERT_EQ(bits(got[i]), bits(static_cast<float>(want))) << what();
      } else {
        ASSERT_TRUE(like_c(got[i], want)) << what() << ": got " << got[i] << ", want " << want;
      }
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
