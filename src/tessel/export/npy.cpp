// NumPy .npy writer (see npy.h): the header is a Python dict literal padded with spaces so the data
// starts at a multiple of 64 bytes, as the format asks; data little-endian (every host tessel builds on).
#include "tessel/export/npy.h"

#include <fmt/format.h>

#include <cstring>

namespace tessel {
namespace {

// NumPy's descr for t, or "" when it has none (then the values go out as f32).
const char* descr(DType t) {
  switch (t) {
    case DType::f64: return "<f8";
    case DType::f32: return "<f4";
    case DType::f16: return "<f2";
    case DType::i64: return "<i8";
    case DType::i32: return "<i4";
    case DType::i16: return "<i2";
    case DType::i8: return "|i1";
    case DType::u64: return "<u8";
    case DType::u32: return "<u4";
    case DType::u16: return "<u2";
    case DType::u8: return "|u1";
    case DType::boolean: return "|b1";
    default: return "";
  }
}

}  // namespace

std::string npy_bytes(const Tensor& t) {
  const char* d = descr(t.dtype());
  const bool as_f32 = *d == '\0';
  std::string shape;
  for (int i = 0; i < t.rank(); ++i) shape += fmt::format("{},", t.dim(i));
  if (t.rank() > 1) shape.pop_back();  // (3,) for one dim, (2,3) for more, () for a scalar
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", as_f32 ? "<f4" : d, shape);
  const size_t prefix = 10;  // magic (6), version (2), header length (2)
  const size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;
  header.append(total - prefix - header.size() - 1, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>((header.size() >> 8) & 0xff);
  out += header;
  if (as_f32) {
    const std::vector<double> v = t.to_f64();
    for (double x : v) {
      const float f = static_cast<float>(x);
      char b[4];
      std::memcpy(b, &f, 4);
      out.append(b, 4);
    }
  } else {
    out.append(reinterpret_cast<const char*>(t.bytes()), t.nbytes());
  }
  return out;
}

}  // namespace tessel
