// Tensor storage and element conversions.
#include "tessel/support/tensor.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <limits>

#include "tessel/support/error.h"
#include "tessel/support/limits.h"

namespace tessel {

namespace {
// Zero-filled storage of `n` bytes; `data` points at it.
std::shared_ptr<void> zeroed_storage(size_t n, uint8_t*& data) {
  auto v = std::make_shared<std::vector<uint8_t>>(n);
  data = v->data();
  return v;
}
}  // namespace

Tensor::Tensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  numel_ = checked_tensor_numel(dtype_, shape_);
  owner_ = zeroed_storage(static_cast<size_t>(numel_) * dtype_size(dtype_), data_);
}

Tensor Tensor::uninitialized(DType dtype, Shape shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.numel_ = checked_tensor_numel(dtype, shape);
  t.shape_ = std::move(shape);
  std::shared_ptr<uint8_t[]> bytes(new uint8_t[std::max<size_t>(1, t.nbytes())]);
  t.data_ = bytes.get();
  t.owner_ = std::move(bytes);
  return t;
}

Tensor Tensor::adopt(DType dtype, Shape shape, std::shared_ptr<void> owner, uint8_t* data) {
  TESSEL_CHECK(owner != nullptr, "adopt: no owner for the bytes");
  Tensor t;
  t.dtype_ = dtype;
  t.numel_ = checked_tensor_numel(dtype, shape);
  t.shape_ = std::move(shape);
  TESSEL_CHECK(reinterpret_cast<uintptr_t>(data) % dtype_size(dtype) == 0 || t.numel_ == 0,
               "adopt: bytes not aligned for {}", dtype_name(dtype));
  t.owner_ = std::move(owner);
  t.data_ = data;
  return t;
}

double Tensor::get_f(int64_t i) const {
  const uint8_t* p = bytes();
  switch (dtype_) {
    case DType::f64: return reinterpret_cast<const double*>(p)[i];
    case DType::f32: return reinterpret_cast<const float*>(p)[i];
    case DType::f16:
    case DType::bf16: return decode_float_bits(dtype_, reinterpret_cast<const uint16_t*>(p)[i]);
    case DType::f8e4m3fn:
    case DType::f8e4m3fnuz:
    case DType::f8e5m2:
    case DType::f8e5m2fnuz:
    case DType::f4e2m1:
    case DType::f8e8m0: return decode_float_bits(dtype_, p[i]);
    case DType::u64: return static_cast<double>(reinterpret_cast<const uint64_t*>(p)[i]);
    default: return static_cast<double>(get_i(i));
  }
}

void Tensor::set_f(int64_t i, double v) {
  uint8_t* p = bytes();
  switch (dtype_) {
    case DType::f64: reinterpret_cast<double*>(p)[i] = v; return;
    case DType::f32: reinterpret_cast<float*>(p)[i] = static_cast<float>(v); return;
    case DType::f16:
    case DType::bf16:
      reinterpret_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(encode_float_bits(dtype_, v));
      return;
    case DType::f8e4m3fn:
    case DType::f8e4m3fnuz:
    case DType::f8e5m2:
    case DType::f8e5m2fnuz:
    case DType::f4e2m1:
    case DType::f8e8m0: p[i] = static_cast<uint8_t>(encode_float_bits(dtype_, v)); return;
    case DType::boolean: p[i] = v != 0; return;
    case DType::u64: {
      // C conversion semantics for in-range values; NaN and out-of-range become 0 / wrap.
      uint64_t u = 0;
      if (std::isfinite(v)) u = v >= 0 ? static_cast<uint64_t>(v) : static_cast<uint64_t>(static_cast<int64_t>(v));
      reinterpret_cast<uint64_t*>(p)[i] = u;
      return;
    }
    default: {
      int64_t iv = 0;
      if (std::isfinite(v)) {
        double t = std::trunc(v);
        if (t >= 9.2233720368547758e18) iv = std::numeric_limits<int64_t>::max();
        else if (t <= -9.2233720368547758e18) iv = std::numeric_limits<int64_t>::min();
        else iv = static_cast<int64_t>(t);
      }
      set_i(i, iv);
    }
  }
}

int64_t Tensor::get_i(int64_t i) const {
  const uint8_t* p = bytes();
  switch (dtype_) {
    case DType::i64: return reinterpret_cast<const int64_t*>(p)[i];
    case DType::i32: return reinterpret_cast<const int32_t*>(p)[i];
    case DType::i16: return reinterpret_cast<const int16_t*>(p)[i];
    case DType::i8: return reinterpret_cast<const int8_t*>(p)[i];
    case DType::u64: return static_cast<int64_t>(reinterpret_cast<const uint64_t*>(p)[i]);
    case DType::u32: return reinterpret_cast<const uint32_t*>(p)[i];
    case DType::u16: return reinterpret_cast<const uint16_t*>(p)[i];
    case DType::u8: return p[i];
    case DType::i4:
    case DType::i2: return static_cast<int8_t>(p[i]);
    case DType::u4:
    case DType::u2: return p[i];
    case DType::boolean: return p[i] != 0;
    default: {
      double v = get_f(i);
      if (!std::isfinite(v)) return 0;
      // Saturated: a float beyond int64 (a fuzzed shape tensor held 6.6e180) is UB to convert.
      if (v >= 9223372036854775807.0) return std::numeric_limits<int64_t>::max();
      if (v <= -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
      return static_cast<int64_t>(v);
    }
  }
}

void Tensor::set_i(int64_t i, int64_t v) {
  uint8_t* p = bytes();
  switch (dtype_) {
    case DType::i64: reinterpret_cast<int64_t*>(p)[i] = v; return;
    case DType::i32: reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); return;
    case DType::i16: reinterpret_cast<int16_t*>(p)[i] = static_cast<int16_t>(v); return;
    case DType::i8: reinterpret_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); return;
    case DType::u64: reinterpret_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(v); return;
    case DType::u32: reinterpret_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(v); return;
    case DType::u16: reinterpret_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(v); return;
    case DType::u8: p[i] = static_cast<uint8_t>(v); return;
    case DType::i4:
    case DType::u4:
    case DType::i2:
    case DType::u2: p[i] = static_cast<uint8_t>(wrap_to_int(dtype_, v)); return;
    case DType::boolean: p[i] = v != 0; return;
    default: set_f(i, static_cast<double>(v));
  }
}

std::vector<double> Tensor::to_f64() const {
  std::vector<double> out(numel_);
  if (dtype_ == DType::f32) {
    const float* d = data<float>();
    for (int64_t i = 0; i < numel_; ++i) out[i] = d[i];
  } else {
    for (int64_t i = 0; i < numel_; ++i) out[i] = get_f(i);
  }
  return out;
}

std::vector<int64_t> Tensor::to_i64() const {
  std::vector<int64_t> out(numel_);
  for (int64_t i = 0; i < numel_; ++i) out[i] = get_i(i);
  return out;
}

Tensor Tensor::from_f64(DType dtype, Shape shape, std::span<const double> values) {
  Tensor t(dtype, std::move(shape));
  TESSEL_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "from_f64: {} values for shape {}",
               values.size(), shape_str(t.shape()));
  if (dtype == DType::f32) {
    float* d = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) d[i] = static_cast<float>(values[i]);
  } else {
    for (int64_t i = 0; i < t.numel(); ++i) t.set_f(i, values[i]);
  }
  return t;
}

Tensor Tensor::from_i64(DType dtype, Shape shape, std::span<const int64_t> values) {
  Tensor t(dtype, std::move(shape));
  TESSEL_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "from_i64: {} values for shape {}",
               values.size(), shape_str(t.shape()));
  for (int64_t i = 0; i < t.numel(); ++i) t.set_i(i, values[i]);
  return t;
}

Tensor Tensor::scalar_f(DType dtype, double v) {
  Tensor t(dtype, {});
  t.set_f(0, v);
  return t;
}

Tensor Tensor::scalar_i(DType dtype, int64_t v) {
  Tensor t(dtype, {});
  t.set_i(0, v);
  return t;
}

Tensor Tensor::reshaped(Shape shape) const {
  TESSEL_CHECK(shape_numel(shape) == numel_, "cannot reshape {} elements to {}", numel_, shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = *this;
  if (owner_) {
    auto v = std::make_shared<std::vector<uint8_t>>(data_, data_ + nbytes());
    t.data_ = v->data();
    t.owner_ = std::move(v);
  }
  return t;
}

bool Tensor::same_as(const Tensor& o) const {
  return dtype_ == o.dtype_ && shape_ == o.shape_ &&
         (nbytes() == 0 || std::memcmp(bytes(), o.bytes(), nbytes()) == 0);
}

std::string TensorType::str() const { return std::string(dtype_name(dtype)) + (symbolic() ? dims_str(sym) : shape_str(shape)); }

bool TensorType::dims_defined() const {
  if (!symbolic()) return shape_known(shape);
  for (const Dim& d : sym)
    if (d.is_static() && d.constant_term() < 0) return false;
  return true;
}

TensorType TensorType::of(DType dtype, const Dims& dims) {
  TensorType t{dtype, static_shape(dims), {}};
  if (!dims_static(dims)) t.sym = dims;
  return t;
}

}  // namespace tessel
