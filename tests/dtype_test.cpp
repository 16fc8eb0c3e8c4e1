// Small-float rounding and dtype tables, checked against hand-computed bit patterns.
#include <gtest/gtest.h>

#include <cmath>

#include "tessel/support/dtype.h"

using namespace tessel;

TEST(DType, Float16RoundsToNearestEven) {
  EXPECT_EQ(encode_float_bits(DType::f16, 1.0), 0x3C00u);
  EXPECT_EQ(encode_float_bits(DType::f16, -2.0), 0xC000u);
  EXPECT_EQ(encode_float_bits(DType::f16, 65504.0), 0x7BFFu);
  EXPECT_EQ(encode_float_bits(DType::f16, 65520.0), 0x7C00u);  // halfway past max rounds to inf
  EXPECT_EQ(encode_float_bits(DType::f16, 65519.0), 0x7BFFu);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
  EXPECT_EQ(encode_float_bits(DType::f16, 1.0 + std::ldexp(1.0, -11)), 0x3C00u);
  // 1 + 3*2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9 (even): rounds up.
  EXPECT_EQ(encode_float_bits(DType::f16, 1.0 + 3 * std::ldexp(1.0, -11)), 0x3C02u);
  EXPECT_EQ(encode_float_bits(DType::f16, std::ldexp(1.0, -24)), 0x0001u);  // smallest subnormal
  EXPECT_EQ(encode_float_bits(DType::f16, std::ldexp(1.0, -26)), 0x0000u);  // rounds to zero
  EXPECT_DOUBLE_EQ(decode_float_bits(DType::f16, 0x3555), 0.333251953125);
  EXPECT_TRUE(std::isnan(decode_float_bits(DType::f16, 0x7E00)));
}

TEST(DType, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(encode_float_bits(DType::bf16, 1.0), 0x3F80u);
  EXPECT_EQ(encode_float_bits(DType::bf16, 1.0 + std::ldexp(1.0, -8)), 0x3F80u);   // tie -> even
  EXPECT_EQ(encode_float_bits(DType::bf16, 1.0 + 3 * std::ldexp(1.0, -8)), 0x3F82u);
  EXPECT_EQ(encode_float_bits(DType::bf16, 3.140625), 0x4049u);
  EXPECT_DOUBLE_EQ(decode_float_bits(DType::bf16, 0x4049), 3.140625);
}

TEST(DType, Float8Formats) {
  EXPECT_DOUBLE_EQ(max_finite(DType::f8e4m3fn), 448.0);
  EXPECT_DOUBLE_EQ(max_finite(DType::f8e5m2), 57344.0);
  EXPECT_DOUBLE_EQ(max_finite(DType::f8e4m3fnuz), 240.0);
  EXPECT_DOUBLE_EQ(max_finite(DType::f8e5m2fnuz), 57344.0);
  EXPECT_EQ(encode_float_bits(DType::f8e4m3fn, 448.0), 0x7Eu);
  EXPECT_EQ(encode_float_bits(DType::f8e4m3fn, 1000.0), 0x7Fu);         // NaN without saturation
  EXPECT_EQ(encode_float_bits(DType::f8e4m3fn, 1000.0, true), 0x7Eu);   // saturates to 448
  EXPECT_EQ(encode_float_bits(DType::f8e4m3fnuz, std::nan("")), 0x80u);
  EXPECT_EQ(encode_float_bits(DType::f8e5m2, INFINITY), 0x7Cu);
  EXPECT_DOUBLE_EQ(decode_float_bits(DType::f4e2m1, 0x7), 6.0);
  EXPECT_DOUBLE_EQ(decode_float_bits(DType::f4e2m1, 0x1), 0.5);
}

TEST(DType, Float8E8M0) {
  // Code c is 2^(c - 127); 0xFF is NaN; no sign and no zero.
  EXPECT_DOUBLE_EQ(decode_float_bits(DType::f8e8m0, 0x7F), 1.0);
  EXPECT_DOUBLE_EQ(decode_float_bits(DType::f8e8m0, 0x80), 2.0);
  EXPECT_DOUBLE_EQ(decode_float_bits(DType::f8e8m0, 0x7C), 0.125);
  EXPECT_DOUBLE_EQ(decode_float_bits(DType::f8e8m0, 0x00), std::ldexp(1.0, -127));
  EXPECT_DOUBLE_EQ(decode_float_bits(DType::f8e8m0, 0xFE), std::ldexp(1.0, 127));
  EXPECT_TRUE(std::isnan(decode_float_bits(DType::f8e8m0, 0xFF)));
  EXPECT_DOUBLE_EQ(max_finite(DType::f8e8m0), std::ldexp(1.0, 127));
  using R = E8M0Round;
  // Powers of two are exact in every mode.
  for (R m : {R::up, R::down, R::nearest}) {
    EXPECT_EQ(encode_e8m0(1.0, true, m), 0x7Fu);
    EXPECT_EQ(encode_e8m0(0.25, true, m), 0x7Du);
    EXPECT_EQ(encode_e8m0(-4.0, true, m), 0x81u);  // the sign is dropped
  }
  // 3 = 1.5 * 2^1, the midpoint of 2 and 4: up -> 4, down -> 2, nearest (ties up) -> 4.
  EXPECT_EQ(encode_e8m0(3.0, true, R::up), 0x81u);
  EXPECT_EQ(encode_e8m0(3.0, true, R::down), 0x80u);
  EXPECT_EQ(encode_e8m0(3.0, true, R::nearest), 0x81u);
  // 2.5 = 1.25 * 2^1: below the midpoint.
  EXPECT_EQ(encode_e8m0(2.5, true, R::up), 0x81u);
  EXPECT_EQ(encode_e8m0(2.5, true, R::down), 0x80u);
  EXPECT_EQ(encode_e8m0(2.5, true, R::nearest), 0x80u);
  // 0.124 (float32 0x3DFDF3B6 = 1.984 * 2^-4) rounds up to 2^-3 = 0x7C (ONNX test data).
  EXPECT_EQ(encode_e8m0(0.124, true, R::up), 0x7Cu);
  // Zero has exponent field 0: code 0 (2^-127), the closest the format gets.
  EXPECT_EQ(encode_e8m0(0.0, true, R::up), 0x00u);
  // NaN and inf become NaN; saturate does not change that.
  EXPECT_EQ(encode_e8m0(std::nan(""), true, R::up), 0xFFu);
  EXPECT_EQ(encode_e8m0(INFINITY, true, R::up), 0xFFu);
  EXPECT_EQ(encode_e8m0(-INFINITY, false, R::down), 0xFFu);
  // Rounding past 2^127: NaN, or 2^127 with saturate.
  const double big = std::ldexp(1.5, 127);
  EXPECT_EQ(encode_e8m0(big, false, R::up), 0xFFu);
  EXPECT_EQ(encode_e8m0(big, true, R::up), 0xFEu);
  EXPECT_EQ(encode_e8m0(big, false, R::down), 0xFEu);
  // The generic encoder uses round to nearest.
  EXPECT_EQ(encode_float_bits(DType::f8e8m0, 3.0), 0x81u);
  EXPECT_EQ(encode_float_bits(DType::f8e8m0, 2.9), 0x80u);
}

TEST(DType, TwoBitIntegers) {
  EXPECT_EQ(dtype_size(DType::i2), 1);
  EXPECT_EQ(dtype_bits(DType::u2), 2);
  EXPECT_TRUE(is_signed_int(DType::i2));
  EXPECT_TRUE(is_unsigned_int(DType::u2));
  EXPECT_TRUE(is_float(DType::f8e8m0));
  EXPECT_FALSE(is_float(DType::i2));
  // int2 holds -2..1 and wraps like two's complement; uint2 holds 0..3.
  EXPECT_EQ(wrap_to_int(DType::i2, 1), 1);
  EXPECT_EQ(wrap_to_int(DType::i2, 2), -2);
  EXPECT_EQ(wrap_to_int(DType::i2, 3), -1);
  EXPECT_EQ(wrap_to_int(DType::i2, -3), 1);
  EXPECT_EQ(wrap_to_int(DType::u2, 5), 1);
  EXPECT_EQ(wrap_to_int(DType::u2, -1), 3);
  EXPECT_EQ(dtype_from_onnx(24), DType::f8e8m0);
  EXPECT_EQ(dtype_from_onnx(25), DType::u2);
  EXPECT_EQ(dtype_from_onnx(26), DType::i2);
  EXPECT_EQ(dtype_to_onnx(DType::i2), 26);
  EXPECT_EQ(dtype_name(DType::f8e8m0), "f8e8m0");
  EXPECT_EQ(dtype_name(DType::u2), "u2");
}

TEST(DType, Names) {
  for (int i = 0; i < kNumDTypes; ++i) {
    DType t = static_cast<DType>(i);
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
  }
  EXPECT_FALSE(dtype_from_name("f17").has_value());
}
