// Element types: names, sizes, classes, and correctly rounded conversions for the small float formats.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tessel {

enum class DType : uint8_t {
  f64, f32, f16, bf16,
  f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz, f4e2m1, f8e8m0,
  i64, i32, i16, i8, u64, u32, u16, u8, i4, u4, i2, u2,
  boolean,
};
inline constexpr int kNumDTypes = 23;

std::string_view dtype_name(DType t);              // "f32", "bf16", "bool", ...
std::optional<DType> dtype_from_name(std::string_view name);
// Bytes one element occupies in a tessel Tensor (int4/uint4/f4/int2/uint2 take one byte each,
// unpacked).
int dtype_size(DType t);
bool is_float(DType t);       // every floating format, f8, f8e8m0 and f4 included
bool is_small_float(DType t); // f16, bf16, f8*, f4: stored as bits, computed in f32 or wider
bool is_signed_int(DType t);
bool is_unsigned_int(DType t);
inline bool is_int(DType t) { return is_signed_int(t) || is_unsigned_int(t); }
inline bool is_bool(DType t) { return t == DType::boolean; }
int dtype_bits(DType t);      // logical bit width (4 for int4, 2 for int2)

// Small float formats: round-to-nearest-even encoding from double, exact decoding to double.
// saturate: out-of-range finite values (and, for the f8 formats, infinities) clamp to the largest
// finite value instead of becoming inf/NaN (ONNX Cast's `saturate` attribute).
// f8e8m0 (exponent only, no sign, no zero) goes through encode_e8m0 with round_mode "nearest".
uint32_t encode_float_bits(DType t, double x, bool saturate = false);
double decode_float_bits(DType t, uint32_t bits);
double max_finite(DType t);

// float8e8m0: the value 2^(bits - 127), 0xFF = NaN; no sign and no zero. Encoding follows ONNX Cast
// (opset 25) on the value first rounded to float32: the code is float32's biased exponent of |x|,
// adjusted by the rounding mode: `up` moves to the next power of two whenever the mantissa is non-zero,
// `down` truncates, `nearest` moves up from 1.5 * 2^e on (ties up). NaN and +-inf give 0xFF; a value
// that rounds past 2^127 gives 0xFF, or 0xFE (2^127) with saturate. Zero and float32 subnormals have
// exponent field 0 (code 0 = 2^-127), rounded like the rest.
enum class E8M0Round { up, down, nearest };
uint8_t encode_e8m0(double x, bool saturate = true, E8M0Round mode = E8M0Round::up);

// ONNX TensorProto.DataType numbers <-> dtypes (the numbers are also used by op attributes such as
// Cast's `to`); onnx_dtype_name names the codes tessel does not hold, for error messages.
std::optional<DType> dtype_from_onnx(int onnx_type);
int dtype_to_onnx(DType t);
std::string_view onnx_dtype_name(int onnx_type);

// Integer range helpers for casts (wrap-around like C for out-of-range integers).
int64_t wrap_to_int(DType t, int64_t v);

}  // namespace tessel
