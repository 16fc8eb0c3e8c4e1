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

TEST(DType, Names) {
  for (int i = 0; i < kNumDTypes; ++i) {
    DType t = static_cast<DType>(i);
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
  }
  EXPECT_FALSE(dtype_from_name("f17").has_value());
}
