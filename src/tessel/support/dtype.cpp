// Element type tables and the generic small-float encoder/decoder.
#include "tessel/support/dtype.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

namespace tessel {
namespace {

struct DTypeInfo {
  DType t;
  std::string_view name;
  int size;
  int bits;
};

constexpr std::array<DTypeInfo, kNumDTypes> kInfo = {{
    {DType::f64, "f64", 8, 64},           {DType::f32, "f32", 4, 32},
    {DType::f16, "f16", 2, 16},           {DType::bf16, "bf16", 2, 16},
    {DType::f8e4m3fn, "f8e4m3fn", 1, 8},  {DType::f8e4m3fnuz, "f8e4m3fnuz", 1, 8},
    {DType::f8e5m2, "f8e5m2", 1, 8},      {DType::f8e5m2fnuz, "f8e5m2fnuz", 1, 8},
    {DType::f4e2m1, "f4e2m1", 1, 4},      {DType::f8e8m0, "f8e8m0", 1, 8},
    {DType::i64, "i64", 8, 64},
    {DType::i32, "i32", 4, 32},           {DType::i16, "i16", 2, 16},
    {DType::i8, "i8", 1, 8},              {DType::u64, "u64", 8, 64},
    {DType::u32, "u32", 4, 32},           {DType::u16, "u16", 2, 16},
    {DType::u8, "u8", 1, 8},              {DType::i4, "i4", 1, 4},
    {DType::u4, "u4", 1, 4},              {DType::i2, "i2", 1, 2},
    {DType::u2, "u2", 1, 2},              {DType::boolean, "bool", 1, 8},
}};

// A binary floating format: exponent and mantissa widths, bias, and how it spells inf and NaN.
struct FloatFormat {
  int ebits, mbits, bias;
  enum Kind { ieee, fn, fnuz, finite_only } kind;  // fn: no inf, NaN = all ones; fnuz: NaN = 0x80
};

FloatFormat format_of(DType t) {
  switch (t) {
    case DType::f16: return {5, 10, 15, FloatFormat::ieee};
    case DType::bf16: return {8, 7, 127, FloatFormat::ieee};
    case DType::f8e4m3fn: return {4, 3, 7, FloatFormat::fn};
    case DType::f8e4m3fnuz: return {4, 3, 8, FloatFormat::fnuz};
    case DType::f8e5m2: return {5, 2, 15, FloatFormat::ieee};
    case DType::f8e5m2fnuz: return {5, 2, 16, FloatFormat::fnuz};
    case DType::f4e2m1: return {2, 1, 1, FloatFormat::finite_only};
    default: return {0, 0, 0, FloatFormat::ieee};
  }
}

int total_bits(const FloatFormat& f) { return 1 + f.ebits + f.mbits; }

uint32_t nan_bits(const FloatFormat& f) {
  switch (f.kind) {
    case FloatFormat::ieee: return ((1u << f.ebits) - 1) << f.mbits | (1u << (f.mbits - 1));
    case FloatFormat::fn: return (1u << (f.ebits + f.mbits)) - 1;
    case FloatFormat::fnuz: return 1u << (f.ebits + f.mbits);
    case FloatFormat::finite_only: return 0;  // no NaN: callers map NaN elsewhere
  }
  return 0;
}

double max_finite_of(const FloatFormat& f) {
  int emax_field = (1 << f.ebits) - 1;
  double mant_max = 2.0 - std::ldexp(1.0, -f.mbits);
  switch (f.kind) {
    case FloatFormat::ieee: return std::ldexp(mant_max, emax_field - 1 - f.bias);
    case FloatFormat::fn: return std::ldexp(mant_max - std::ldexp(1.0, -f.mbits), emax_field - f.bias);
    case FloatFormat::fnuz:
    case FloatFormat::finite_only: return std::ldexp(mant_max, emax_field - f.bias);
  }
  return 0;
}

// ONNX TensorProto.DataType numbers of the dtypes tessel holds (onnx.proto).
constexpr std::pair<int, DType> kOnnxCodes[] = {
    {1, DType::f32},         {2, DType::u8},        {3, DType::i8},          {4, DType::u16},
    {5, DType::i16},         {6, DType::i32},       {7, DType::i64},         {9, DType::boolean},
    {10, DType::f16},        {11, DType::f64},      {12, DType::u32},        {13, DType::u64},
    {16, DType::bf16},       {17, DType::f8e4m3fn}, {18, DType::f8e4m3fnuz}, {19, DType::f8e5m2},
    {20, DType::f8e5m2fnuz}, {21, DType::u4},       {22, DType::i4},         {23, DType::f4e2m1},
    {24, DType::f8e8m0},     {25, DType::u2},       {26, DType::i2},
};

}  // namespace

std::optional<DType> dtype_from_onnx(int t) {
  for (const auto& [code, dt] : kOnnxCodes)
    if (code == t) return dt;
  return std::nullopt;
}

int dtype_to_onnx(DType t) {
  for (const auto& [code, dt] : kOnnxCodes)
    if (dt == t) return code;
  return 0;
}

std::string_view onnx_dtype_name(int t) {
  switch (t) {
    case 8: return "string";
    case 14: return "complex64";
    case 15: return "complex128";
    default:
      if (auto d = dtype_from_onnx(t)) return dtype_name(*d);
      return "unknown";
  }
}

std::string_view dtype_name(DType t) { return kInfo[static_cast<int>(t)].name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& i : kInfo)
    if (i.name == name) return i.t;
  return std::nullopt;
}

int dtype_size(DType t) { return kInfo[static_cast<int>(t)].size; }
int dtype_bits(DType t) { return kInfo[static_cast<int>(t)].bits; }

bool is_float(DType t) { return t <= DType::f8e8m0; }
bool is_small_float(DType t) { return t >= DType::f16 && t <= DType::f8e8m0; }
bool is_signed_int(DType t) {
  return t == DType::i64 || t == DType::i32 || t == DType::i16 || t == DType::i8 || t == DType::i4 ||
         t == DType::i2;
}
bool is_unsigned_int(DType t) {
  return t == DType::u64 || t == DType::u32 || t == DType::u16 || t == DType::u8 || t == DType::u4 ||
         t == DType::u2;
}

double max_finite(DType t) {
  if (t == DType::f64) return std::numeric_limits<double>::max();
  if (t == DType::f32) return std::numeric_limits<float>::max();
  if (t == DType::f8e8m0) return std::ldexp(1.0, 127);
  return max_finite_of(format_of(t));
}

uint8_t encode_e8m0(double x, bool saturate, E8M0Round mode) {
  const float f = static_cast<float>(x);  // ONNX converts to float32 first
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  const uint32_t exp = (b >> 23) & 0xFF;
  const uint32_t mant = b & 0x7FFFFF;
  if (exp == 0xFF) return 0xFF;  // NaN, +-inf
  bool round_up = false;
  switch (mode) {
    case E8M0Round::up: round_up = mant != 0; break;
    case E8M0Round::down: break;
    case E8M0Round::nearest:
      // At or past the midpoint 1.5 * 2^e. For exponent field 0 (code 0 = 2^-127, while the float32
      // value is 0.m * 2^-126) the exact midpoint 2^-127 itself stays down.
      round_up = (mant & 0x400000) && (exp != 0 || (mant & 0x3FFFFF));
      break;
  }
  uint32_t code = exp + (round_up ? 1 : 0);
  if (code == 0xFF && saturate) code = 0xFE;
  return static_cast<uint8_t>(code);
}

uint32_t encode_float_bits(DType t, double x, bool saturate) {
  if (t == DType::f8e8m0) return encode_e8m0(x, saturate, E8M0Round::nearest);
  const FloatFormat f = format_of(t);
  const uint32_t sign = std::signbit(x) ? 1u << (f.ebits + f.mbits) : 0u;
  if (std::isnan(x)) return f.kind == FloatFormat::finite_only ? sign | ((1u << (f.ebits + f.mbits)) - 1) : nan_bits(f);
  const double maxv = max_finite_of(f);
  double a = std::fabs(x);
  auto overflow = [&]() -> uint32_t {
    if (saturate || f.kind == FloatFormat::finite_only) return sign | encode_float_bits(t, maxv) ;
    if (f.kind == FloatFormat::ieee) return sign | (((1u << f.ebits) - 1) << f.mbits);
    return nan_bits(f) | (f.kind == FloatFormat::fn ? sign : 0);
  };
  if (std::isinf(a)) return overflow();
  if (a == 0) return f.kind == FloatFormat::fnuz ? 0 : sign;
  const int emin = 1 - f.bias;  // smallest normal exponent
  int e;
  std::frexp(a, &e);            // a = m * 2^e, m in [0.5, 1)
  int u = e - 1;                // a = (2m) * 2^u
  double quantum = std::ldexp(1.0, (u < emin ? emin : u) - f.mbits);
  double r = std::nearbyint(a / quantum);  // round half to even (default rounding mode)
  double v = r * quantum;
  if (v > maxv) {
    // Values that round past the top of the range overflow (IEEE: to inf).
    return overflow();
  }
  if (v == 0) return f.kind == FloatFormat::fnuz ? 0 : sign;
  uint32_t bits;
  if (v < std::ldexp(1.0, emin)) {
    bits = static_cast<uint32_t>(std::ldexp(v, f.mbits - emin));
  } else {
    std::frexp(v, &e);
    u = e - 1;
    uint32_t mant = static_cast<uint32_t>((std::ldexp(v, -u) - 1.0) * (1u << f.mbits));
    bits = static_cast<uint32_t>(u + f.bias) << f.mbits | mant;
  }
  return sign | bits;
}

double decode_float_bits(DType t, uint32_t bits) {
  if (t == DType::f8e8m0) {
    bits &= 0xFF;
    if (bits == 0xFF) return std::numeric_limits<double>::quiet_NaN();
    return std::ldexp(1.0, static_cast<int>(bits) - 127);
  }
  const FloatFormat f = format_of(t);
  const int nb = total_bits(f);
  bits &= (1u << nb) - 1;
  const bool neg = bits >> (nb - 1);
  const uint32_t ef = (bits >> f.mbits) & ((1u << f.ebits) - 1);
  const uint32_t mf = bits & ((1u << f.mbits) - 1);
  switch (f.kind) {
    case FloatFormat::ieee:
      if (ef == (1u << f.ebits) - 1) {
        if (mf != 0) return std::numeric_limits<double>::quiet_NaN();
        return neg ? -INFINITY : INFINITY;
      }
      break;
    case FloatFormat::fn:
      if (ef == (1u << f.ebits) - 1 && mf == (1u << f.mbits) - 1)
        return std::numeric_limits<double>::quiet_NaN();
      break;
    case FloatFormat::fnuz:
      if (bits == 1u << (nb - 1)) return std::numeric_limits<double>::quiet_NaN();
      break;
    case FloatFormat::finite_only: break;
  }
  double v = ef == 0 ? std::ldexp(static_cast<double>(mf), 1 - f.bias - f.mbits)
                     : std::ldexp(1.0 + std::ldexp(static_cast<double>(mf), -f.mbits),
                                  static_cast<int>(ef) - f.bias);
  return neg ? -v : v;
}

int64_t wrap_to_int(DType t, int64_t v) {
  switch (t) {
    case DType::i64: return v;
    case DType::i32: return static_cast<int32_t>(v);
    case DType::i16: return static_cast<int16_t>(v);
    case DType::i8: return static_cast<int8_t>(v);
    case DType::u64: return v;
    case DType::u32: return static_cast<uint32_t>(v);
    case DType::u16: return static_cast<uint16_t>(v);
    case DType::u8: return static_cast<uint8_t>(v);
    case DType::i4: return static_cast<int64_t>(static_cast<uint64_t>(v) << 60) >> 60;
    case DType::u4: return v & 0xF;
    case DType::i2: return static_cast<int64_t>(static_cast<uint64_t>(v) << 62) >> 62;
    case DType::u2: return v & 0x3;
    case DType::boolean: return v != 0;
    default: return v;
  }
}

}  // namespace tessel
