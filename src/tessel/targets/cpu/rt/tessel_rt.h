/* tessel_rt.h: math for generated CPU kernels.
 *
 * Every function is branch-free straight-line code (selects, no tables, no libm calls for float) so
 * that GCC vectorizes `#pragma omp simd` loops that call it. The transcendental ones (exp, log, tanh,
 * erf, sin, cos, atan, pow, fmod) are SIMD functions (see the end of the file); tsl_X_inline is the
 * same function inlined at the call site. Float functions that need more than float precision (sin,
 * cos, atan, pow, fmod) compute internally in double. Compile with -fopenmp-simd (or -fopenmp).
 *
 * Accuracy (float, round-to-nearest mode, checked by tests/rt_math_test.cpp against the correctly
 * rounded double result): at most 4 ulp, denormal results included, for exp, log, tanh, erf, atan, pow
 * and sin/cos with |x| < 2^25 (beyond that the argument reduction loses accuracy; results stay in
 * [-1, 1]). sqrt, floor, round_even, fmod, max, min are exact.
 *
 * Special values follow C99 Annex F: NaN in gives NaN out (except pow(x, ±0) = pow(1, y) = 1);
 * exp overflows to inf and underflows to 0 (gradually); log(±0) = -inf, log(x < 0) = NaN,
 * log(inf) = inf; tanh/erf(±inf) = ±1; sin/cos(±inf) = NaN; atan(±inf) = ±pi/2; fmod(x, 0) and
 * fmod(±inf, y) are NaN, fmod(x, ±inf) = x; pow: all Annex F cases (0 to negative powers gives ±inf,
 * negative base to a non-integer gives NaN, odd integer powers keep the sign, pow(-1, ±inf) = 1,
 * |x| < 1 or > 1 to ±inf gives 0 or inf, inf bases). Signed zeros are kept where C keeps them
 * (f(-0) = -0 for the odd functions). Floating-point exception flags are not meaningful. max/min return NaN when either operand is NaN. *_f64 versions call the compiler's builtins.
 */
#pragma once

#include <stdint.h>

/* Bit casts (vectorize as plain register moves). */
static inline uint32_t tsl_bits_f32(float x) { uint32_t u; __builtin_memcpy(&u, &x, 4); return u; }
static inline float tsl_from_bits_f32(uint32_t u) { float x; __builtin_memcpy(&x, &u, 4); return x; }
static inline uint64_t tsl_bits_f64(double x) { uint64_t u; __builtin_memcpy(&u, &x, 8); return u; }
static inline double tsl_from_bits_f64(uint64_t u) { double x; __builtin_memcpy(&x, &u, 8); return x; }

static inline float tsl_copysign_(float mag, float sign) {
  return tsl_from_bits_f32((tsl_bits_f32(mag) & 0x7fffffffu) | (tsl_bits_f32(sign) & 0x80000000u));
}
static inline float tsl_inf_() { return __builtin_inff(); }
static inline float tsl_nan_() { return __builtin_nanf(""); }

/* ---- exact operations ---- */
static inline float tsl_sqrt(float x) { return __builtin_sqrtf(x); }
static inline float tsl_floor(float x) { return __builtin_floorf(x); }
static inline float tsl_round_even(float x) { return __builtin_rintf(x); } /* ties to even */
static inline float tsl_max(float a, float b) { return a != a ? a : (b != b ? b : (a < b ? b : a)); }
static inline float tsl_min(float a, float b) { return a != a ? a : (b != b ? b : (b < a ? b : a)); }
static inline double tsl_max_f64(double a, double b) { return a != a ? a : (b != b ? b : (a < b ? b : a)); }
static inline double tsl_min_f64(double a, double b) { return a != a ? a : (b != b ? b : (b < a ? b : a)); }

/* ---- store.ftz: a subnormal as zero of its sign, by its bits (no floating-point operation on it,
 * which is what costs: targets/cpu/ftz.h) ---- */
static inline float tsl_ftz(float x) {
  uint32_t u = tsl_bits_f32(x);
  return tsl_from_bits_f32((u & 0x7fffffffu) < 0x00800000u ? (u & 0x80000000u) : u);
}
static inline double tsl_ftz_f64(double x) {
  uint64_t u = tsl_bits_f64(x);
  return tsl_from_bits_f64((u & 0x7fffffffffffffffull) < 0x0010000000000000ull ? (u & 0x8000000000000000ull) : u);
}

/* ---- exp: x = n ln2 + r, |r| <= ln2/2; 2^n applied in two steps so that overflow and gradual
 * underflow round once. ---- */
static inline float tsl_exp_inline(float x) {
  float xc = x > 89.0f ? 89.0f : (x < -104.0f ? -104.0f : x);
  xc = x != x ? 0.0f : xc;
  float n = __builtin_rintf(xc * 1.44269502f);
  float r = (xc - n * 0.693145751953125f) - n * 1.42860677e-06f; /* ln2 in two parts, the first exact */
  float p = 0.00138146104f;
  p = p * r + 0.00836871006f;
  p = p * r + 0.041668389f;
  p = p * r + 0.166665211f;
  p = p * r + 0.49999994f;
  p = 1.0f + (r + (r * r) * p);
  int32_t ni = (int32_t)n;
  int32_t n1 = ni >> 1;
  float s1 = tsl_from_bits_f32((uint32_t)(n1 + 127) << 23);
  float s2 = tsl_from_bits_f32((uint32_t)(ni - n1 + 127) << 23);
  float y = (p * s1) * s2;
  return x != x ? x : y;
}

/* ---- log: x = 2^e m, m in [sqrt(1/2), sqrt(2)); log(m) = f - s (f - T(s^2)) with f = m - 1,
 * s = f / (2 + f). ---- */
static inline float tsl_log_inline(float x) {
  int sub = x < 1.17549435e-38f; /* denormals (and the invalid inputs) are scaled by 2^23 first */
  uint32_t u = tsl_bits_f32(sub ? x * 8388608.0f : x);
  int32_t e = (int32_t)((u >> 23) & 0xffu) - (sub ? 150 : 127);
  uint32_t mu = (u & 0x007fffffu) | 0x3f800000u;
  int big = mu > 0x3fb504f3u;
  mu = big ? mu - 0x00800000u : mu;
  e = big ? e + 1 : e;
  float f = tsl_from_bits_f32(mu) - 1.0f;
  float s = f / (2.0f + f);
  float z = s * s;
  float t = z * (0.666667759f + z * (0.399775594f + z * 0.298713654f));
  float l1p = f - s * (f - t);
  float ef = (float)e;
  float y = ef * 0.693145751953125f + (l1p + ef * 1.42860677e-06f);
  y = x == 0.0f ? -tsl_inf_() : y;
  y = x < 0.0f ? tsl_nan_() : y;
  y = x == tsl_inf_() ? x : y;
  return x != x ? x : y;
}

/* ---- tanh: odd polynomial below 0.5493 (where tanh = 0.5), else 1 - 2 / (exp(2|x|) + 1). ---- */
static inline float tsl_tanh_inline(float x) {
  float a = __builtin_fabsf(x);
  float z = x * x;
  float p = -0.00627875701f;
  p = p * z + 0.0210746787f;
  p = p * z - 0.0538529865f;
  p = p * z + 0.133325920f;
  p = p * z - 0.333333164f;
  float small = a + (a * z) * p;
  float big = 1.0f - 2.0f / (tsl_exp_inline(2.0f * a) + 1.0f);
  return tsl_copysign_(a < 0.5493f ? small : big, x);
}

/* ---- erf: x P(x^2) below 1; else 1 - exp(-x^2) R(x - 2.5) (R fits erfc(x) exp(x^2) on [1, 3.93];
 * erf rounds to 1 above). ---- */
static inline float tsl_erf_inline(float x) {
  float a = __builtin_fabsf(x);
  float z = x * x;
  float p = 7.85385782e-05f;
  p = p * z - 0.000801019254f;
  p = p * z + 0.00518832775f;
  p = p * z - 0.0268538110f;
  p = p * z + 0.112835854f;
  p = p * z - 0.376126260f;
  p = p * z + 1.12837911f;
  float small = x * p;
  float ac = a < 1.0f ? 1.0f : (a > 3.93f ? 3.93f : a);
  float u = ac - 2.5f;
  float q = 7.11720440e-06f;
  q = q * u + 1.40907377e-05f;
  q = q * u + 3.18162529e-05f;
  q = q * u - 7.28124796e-05f;
  q = q * u + 0.000177319263f;
  q = q * u - 0.000749878644f;
  q = q * u + 0.00247273175f;
  q = q * u - 0.00799459592f;
  q = q * u + 0.0249393918f;
  q = q * u - 0.0743475258f;
  q = q * u + 0.210806325f;
  float big = 1.0f - tsl_exp_inline(-(ac * ac)) * q;
  return a < 1.0f ? small : tsl_copysign_(big, x);
}

/* ---- sin, cos: x = n pi/2 + r in double (pi/2 in three parts, the first two exact times n for
 * |n| < 2^25), then polynomials for sin r and cos r on |r| <= pi/4. ---- */
static inline float tsl_sincos_(float x, int32_t quarter_turns) {
  double xd = x - x == 0.0f ? (double)x : 0.0; /* inf and NaN: result replaced below */
  double n = __builtin_rint(xd * 0.6366197723675814);
  double r = ((xd - n * 1.570796325802803) - n * 9.920935739593517e-10) - n * 5.721188726109832e-18;
  r = r > 0.7853981634 ? 0.7853981634 : (r < -0.7853981634 ? -0.7853981634 : r); /* only for |x| >= 2^25 */
  double z = r * r;
  double sp = -2.476055871230773e-08;
  sp = sp * z + 2.755534109258242e-06;
  sp = sp * z - 0.00019841263735392856;
  sp = sp * z + 0.008333333325090016;
  sp = sp * z - 0.16666666666630464;
  double sn = xd == 0.0 ? xd : r + (r * z) * sp; /* keeps sin(-0) = -0 */
  double cp = -2.7205754415737327e-07;
  cp = cp * z + 2.4799460154946635e-05;
  cp = cp * z - 0.0013888883500065782;
  cp = cp * z + 0.04166666661949099;
  double cs = 1.0 - 0.5 * z + (z * z) * cp;
  int32_t q = ((int32_t)(n - 4.0 * __builtin_floor(n * 0.25)) + quarter_turns) & 3;
  double y = (q & 1) ? cs : sn;
  y = (q & 2) ? -y : y;
  return x - x == 0.0f ? (float)y : tsl_nan_();
}
static inline float tsl_sin_inline(float x) { return tsl_sincos_(x, 0); }
static inline float tsl_cos_inline(float x) { return tsl_sincos_(x, 1); }

/* ---- atan in double: |x| reduced to |t| <= tan(pi/8) by one division, atan(|x|) = off + atan(t). ---- */
static inline float tsl_atan_inline(float x) {
  double a = __builtin_fabs((double)x);
  int mid = a > 0.41421356237309503, high = a > 2.414213562373095;
  double num = high ? -1.0 : (mid ? a - 1.0 : a);
  double den = high ? a : (mid ? a + 1.0 : 1.0);
  double off = high ? 1.5707963267948966 : (mid ? 0.7853981633974483 : 0.0);
  double t = num / den;
  double z = t * t;
  double p = 0.04743976269340399;
  p = p * z - 0.08476234873881204;
  p = p * z + 0.1104468556220146;
  p = p * z - 0.14282007276033898;
  p = p * z + 0.19999903891377713;
  p = p * z - 0.33333332498941454;
  float y = (float)(off + (t + (t * z) * p));
  return tsl_copysign_(y, x);
}

/* ---- pow = 2^(y log2|x|) in double, then the sign and the Annex F special cases. ---- */
static inline double tsl_log2_pos_(double a) { /* a > 0, finite, normal in double */
  uint64_t u = tsl_bits_f64(a);
  int32_t e = (int32_t)(u >> 52) - 1023;
  uint64_t mu = (u & 0x000fffffffffffffull) | 0x3ff0000000000000ull;
  int big = mu > 0x3ff6a09e667f3bccull;
  mu = big ? mu - 0x0010000000000000ull : mu;
  e = big ? e + 1 : e;
  double f = tsl_from_bits_f64(mu) - 1.0;
  double s = f / (2.0 + f);
  double z = s * s;
  double t = z * (0.6666666564731721 + z * (0.4000033486191561 + z * (0.2853732463637458 + z * 0.2358192282803917)));
  return (double)e + (f - s * (f - t)) * 1.4426950408889634;
}
static inline double tsl_exp2_(double t) { /* |t| <= 400 */
  double n = __builtin_rint(t);
  double r = t - n;
  double p = 1.3258319652052156e-06;
  p = p * r + 1.5252991902503163e-05;
  p = p * r + 0.00015403440950165301;
  p = p * r + 0.0013333557622800703;
  p = p * r + 0.009618129181082864;
  p = p * r + 0.05550410866842845;
  p = p * r + 0.2402265069572306;
  p = p * r + 0.6931471805598834;
  p = 1.0 + r * p;
  return p * tsl_from_bits_f64((uint64_t)((int64_t)(int32_t)n + 1023) << 52);
}
static inline float tsl_pow_inline(float x, float y) {
  float ax = __builtin_fabsf(x), ay = __builtin_fabsf(y);
  int y_int = __builtin_floorf(y) == y; /* true for ±inf too */
  int y_odd = y_int && ay < 16777216.0f && ((int32_t)(ay < 16777216.0f ? y : 0.0f) & 1);
  double l = (ax > 0.0f && ax < tsl_inf_()) ? tsl_log2_pos_((double)ax) : 0.0;
  l = ax == 0.0f ? -(double)tsl_inf_() : (ax == tsl_inf_() ? (double)tsl_inf_() : l);
  l = ax != ax ? (double)ax : l;
  double t = (double)y * l;
  int t_nan = t != t;
  double tc = t > 400.0 ? 400.0 : (t < -400.0 ? -400.0 : t);
  double m = tsl_exp2_(t_nan ? 0.0 : tc);
  float r = (float)m;
  r = t_nan ? tsl_nan_() : r;
  r = (y_odd && (tsl_bits_f32(x) >> 31)) ? -r : r;
  r = (x < 0.0f && x > -tsl_inf_() && !y_int) ? tsl_nan_() : r; /* negative base, non-integer power */
  r = (ax == 1.0f && ay == tsl_inf_()) ? 1.0f : r;                  /* pow(-1, ±inf) */
  r = (y == 0.0f || x == 1.0f) ? 1.0f : r;
  return r;
}

/* ---- fmod: exact. |x| is reduced by |y| 2^s with |x| / (|y| 2^s) < 2^29 in double, each step
 * exact; ten steps cover every exponent gap of float. ---- */
static inline double tsl_fmod_step_(double r, double ay, int32_t ey) {
  int32_t er = (int32_t)(tsl_bits_f64(r) >> 52);
  int32_t s = er - ey - 28;
  s = s > 0 ? s : 0;
  double d = ay * tsl_from_bits_f64((uint64_t)(s + 1023) << 52);
  double q = (double)(int32_t)(r / d);
  double t = r - q * d;
  t = t < 0.0 ? t + d : t;
  return t >= d ? t - d : t;
}
static inline float tsl_fmod_inline(float x, float y) {
  double ax = __builtin_fabs((double)x), ay = __builtin_fabs((double)y);
  int nan = !(ay > 0.0) || !(ax <= 3.4028234663852886e38) || y != y;
  int y_inf = ay > 3.4028234663852886e38;
  ax = (nan || y_inf) ? 0.0 : ax;
  ay = (nan || y_inf) ? 1.0 : ay;
  int32_t ey = (int32_t)(tsl_bits_f64(ay) >> 52);
  double r = ax;
  r = tsl_fmod_step_(r, ay, ey); r = tsl_fmod_step_(r, ay, ey);
  r = tsl_fmod_step_(r, ay, ey); r = tsl_fmod_step_(r, ay, ey);
  r = tsl_fmod_step_(r, ay, ey); r = tsl_fmod_step_(r, ay, ey);
  r = tsl_fmod_step_(r, ay, ey); r = tsl_fmod_step_(r, ay, ey);
  r = tsl_fmod_step_(r, ay, ey); r = tsl_fmod_step_(r, ay, ey);
  float res = tsl_copysign_((float)r, x);
  res = y_inf ? x : res;
  return nan ? tsl_nan_() : res;
}

/* ---- The functions above as SIMD functions: one vector body per translation unit (an
 * `omp declare simd` clone, needs -fopenmp-simd or -fopenmp) that vectorized loops call, instead of a
 * copy inlined at every call site: compile time grows with the functions used, not the calls. ---- */
#define TSL_SIMD_FN_ _Pragma("omp declare simd notinbranch") __attribute__((noinline, unused)) static
TSL_SIMD_FN_ float tsl_exp(float x) { return tsl_exp_inline(x); }
TSL_SIMD_FN_ float tsl_log(float x) { return tsl_log_inline(x); }
TSL_SIMD_FN_ float tsl_tanh(float x) { return tsl_tanh_inline(x); }
TSL_SIMD_FN_ float tsl_erf(float x) { return tsl_erf_inline(x); }
TSL_SIMD_FN_ float tsl_sin(float x) { return tsl_sin_inline(x); }
TSL_SIMD_FN_ float tsl_cos(float x) { return tsl_cos_inline(x); }
TSL_SIMD_FN_ float tsl_atan(float x) { return tsl_atan_inline(x); }
TSL_SIMD_FN_ float tsl_pow(float x, float y) { return tsl_pow_inline(x, y); }
TSL_SIMD_FN_ float tsl_fmod(float x, float y) { return tsl_fmod_inline(x, y); }
#undef TSL_SIMD_FN_

/* ---- double versions: the compiler's builtins (scalar libm calls where it has no inline form). ---- */
static inline double tsl_exp_f64(double x) { return __builtin_exp(x); }
static inline double tsl_log_f64(double x) { return __builtin_log(x); }
static inline double tsl_tanh_f64(double x) { return __builtin_tanh(x); }
static inline double tsl_erf_f64(double x) { return __builtin_erf(x); }
static inline double tsl_sin_f64(double x) { return __builtin_sin(x); }
static inline double tsl_cos_f64(double x) { return __builtin_cos(x); }
static inline double tsl_atan_f64(double x) { return __builtin_atan(x); }
static inline double tsl_pow_f64(double x, double y) { return __builtin_pow(x, y); }
static inline double tsl_sqrt_f64(double x) { return __builtin_sqrt(x); }
static inline double tsl_floor_f64(double x) { return __builtin_floor(x); }
static inline double tsl_round_even_f64(double x) { return __builtin_rint(x); }
static inline double tsl_fmod_f64(double x, double y) { return __builtin_fmod(x, y); }
