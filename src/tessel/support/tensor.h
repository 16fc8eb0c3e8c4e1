// Tensor: a dense row-major array of one dtype, with value semantics for contents (kernels never
// write into their inputs), plus element access helpers that kernels use.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessel/support/dtype.h"
#include "tessel/support/shape.h"
#include "tessel/support/sym.h"

namespace tessel {

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape);  // zero-filled; every dim must be known

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  bool valid() const { return owner_ != nullptr; }
  // How many tensors (and other holders of the owner) share this storage: 1 when this is the last.
  long storage_use_count() const { return owner_.use_count(); }

  template <typename T> T* data() { return reinterpret_cast<T*>(bytes()); }
  template <typename T> const T* data() const { return reinterpret_cast<const T*>(bytes()); }
  uint8_t* bytes() { return owner_ ? data_ : nullptr; }
  const uint8_t* bytes() const { return owner_ ? data_ : nullptr; }

  // A tensor over nbytes() bytes at `data` that already hold its contents (no copy, no zero fill),
  // kept alive by `owner` (shared by every tensor that shares the bytes): e.g. a window of one
  // buffer holding all of a model's weights. `data` must be aligned for the dtype.
  static Tensor adopt(DType dtype, Shape shape, std::shared_ptr<void> owner, uint8_t* data);
  // Storage whose bytes are not initialised, for a caller that writes every byte before anything reads
  // them (a result copied out of an arena): no zero-filling pass over bytes that are overwritten anyway.
  static Tensor uninitialized(DType dtype, Shape shape);

  // Element access converting through double (floats) or int64 (ints, bool). Stores round
  // correctly for f16/bf16/f8 and wrap for integers.
  double get_f(int64_t i) const;
  void set_f(int64_t i, double v);
  int64_t get_i(int64_t i) const;
  void set_i(int64_t i, int64_t v);

  // Whole-tensor conversions, the convenient form for reference kernels.
  std::vector<double> to_f64() const;
  std::vector<int64_t> to_i64() const;
  static Tensor from_f64(DType dtype, Shape shape, std::span<const double> values);
  static Tensor from_i64(DType dtype, Shape shape, std::span<const int64_t> values);
  static Tensor scalar_f(DType dtype, double v);
  static Tensor scalar_i(DType dtype, int64_t v);

  // Same contents, new shape of equal element count (shares storage).
  Tensor reshaped(Shape shape) const;

  // A deep copy (storage not shared).
  Tensor clone() const;

  // Exact equality of dtype, shape and bytes.
  bool same_as(const Tensor& other) const;

 private:
  DType dtype_ = DType::f32;
  Shape shape_;
  int64_t numel_ = 0;
  std::shared_ptr<void> owner_;  // keeps data_ alive; null for an empty (invalid) tensor
  uint8_t* data_ = nullptr;
};

// A tensor's static type: dtype and shape. A dim may be unknown (kUnknownDim: data-dependent) or
// symbolic (docs/dynamic-shapes.md): then `sym` holds every dim as a Dim and `shape` has kUnknownDim in
// the symbolic places, so code that only handles static shapes sees an unknown dim and keeps away.
struct TensorType {
  DType dtype = DType::f32;
  Shape shape;
  Dims sym;  // empty unless some dim is symbolic
  bool operator==(const TensorType&) const = default;
  std::string str() const;  // "f32[1,128,256]", "f32[s0,128]"
  bool symbolic() const { return !sym.empty(); }
  // Every dim as a Dim: sym, or the static dims (an unknown one stays kUnknownDim).
  Dims dims() const { return symbolic() ? sym : dims_of(shape); }
  // Static dims, and symbolic or unknown ones, but none unknown: what symbolic code can compute with.
  bool dims_defined() const;
  // The type with these dims (sym stays empty when all are static).
  static TensorType of(DType dtype, const Dims& dims);
  void set_dims(const Dims& dims) { *this = of(dtype, dims); }
};

}  // namespace tessel
