// Tensor storage (support/tensor.h) beyond element conversions (dtype_test.cpp) and size limits
// (limits_test.cpp): uninitialised storage for results that are written whole.
#include <gtest/gtest.h>

#include <vector>

#include "tessel/support/error.h"
#include "tessel/support/limits.h"
#include "tessel/support/tensor.h"

namespace tessel {
namespace {

// Tensor::uninitialized (results copied out of the graph backend's arena): the shape and bytes asked
// for, every element as written, copies sharing the storage, an empty tensor, and the same size checks
// as a zero-filled tensor (a negative or overflowing shape is an error, not an allocation).
TEST(Tensor, UninitializedHoldsWhatIsWritten) {
  Tensor t = Tensor::uninitialized(DType::f32, {3, 5});
  EXPECT_EQ(t.shape(), (Shape{3, 5}));
  EXPECT_EQ(t.nbytes(), 60u);
  float* p = reinterpret_cast<float*>(t.bytes());
  for (int i = 0; i < 15; ++i) p[i] = static_cast<float>(i) * 0.5f - 2;
  const std::vector<double> got = t.to_f64();
  for (int i = 0; i < 15; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], i * 0.5 - 2);
  const Tensor shared = t;
  EXPECT_EQ(t.storage_use_count(), 2);
  EXPECT_EQ(shared.bytes(), t.bytes());
  const Tensor empty = Tensor::uninitialized(DType::i64, {0, 4});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.nbytes(), 0u);
  EXPECT_THROW(Tensor::uninitialized(DType::f32, {-1, 2}), Error);
  EXPECT_THROW(Tensor::uninitialized(DType::f32, {int64_t{1} << 40, int64_t{1} << 40}), Error);
}

// The allocation limit that caps a zero-filled tensor caps an uninitialised one, by the same message.
TEST(Tensor, UninitializedObeysTheAllocationLimit) {
  set_max_alloc_bytes(1 << 20);
  std::string zeroed, raw;
  try {
    Tensor t(DType::f32, {1 << 18, 2});
  } catch (const Error& e) {
    zeroed = e.what();
  }
  try {
    Tensor t = Tensor::uninitialized(DType::f32, {1 << 18, 2});
  } catch (const Error& e) {
    raw = e.what();
  }
  set_max_alloc_bytes(0);
  EXPECT_FALSE(raw.empty());
  EXPECT_EQ(raw, zeroed);
}

}  // namespace
}  // namespace tessel
