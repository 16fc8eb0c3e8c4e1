// Shape arithmetic and numpy broadcasting.
#include "tessel/support/shape.h"

#include <fmt/format.h>

#include <limits>

#include "tessel/support/error.h"

namespace tessel {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  bool overflow = false;
  for (int64_t d : s) {
    if (d < 0) return kUnknownDim;
    overflow = overflow || __builtin_mul_overflow(n, d, &n);
  }
  // An empty dim makes the product 0 even after an overflow; otherwise overflow saturates, so
  // size checks downstream (Tensor's limit) reject it.
  for (int64_t d : s)
    if (d == 0) return 0;
  return overflow ? std::numeric_limits<int64_t>::max() : n;
}

bool shape_known(const Shape& s) {
  for (int64_t d : s)
    if (d < 0) return false;
  return true;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ",";
    out += s[i] < 0 ? std::string("?") : std::to_string(s[i]);
  }
  return out + "]";
}

std::vector<int64_t> strides_of(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da == db || db == 1) out[i] = da;
    else if (da == 1) out[i] = db;
    else if (da < 0 || db < 0) out[i] = kUnknownDim;
    else fail("shapes {} and {} do not broadcast", shape_str(a), shape_str(b));
  }
  return out;
}

std::vector<int64_t> broadcast_index(const Shape& in, const Shape& out) {
  const int r = static_cast<int>(out.size());
  const int off = r - static_cast<int>(in.size());
  std::vector<int64_t> in_strides(r, 0);
  {
    auto st = strides_of(in);
    for (int i = 0; i < static_cast<int>(in.size()); ++i) in_strides[i + off] = in[i] == 1 ? 0 : st[i];
  }
  int64_t n = shape_numel(out);
  std::vector<int64_t> idx(n);
  std::vector<int64_t> pos(r, 0);
  int64_t cur = 0;
  for (int64_t k = 0; k < n; ++k) {
    idx[k] = cur;
    for (int d = r - 1; d >= 0; --d) {
      ++pos[d];
      cur += in_strides[d];
      if (pos[d] < out[d]) break;
      cur -= in_strides[d] * pos[d];
      pos[d] = 0;
    }
  }
  return idx;
}

int normalize_axis(int64_t axis, int rank) {
  // A scalar has no axes: every per-axis table of a rank-0 value is empty, so no axis is valid.
  if (rank == 0) fail("axis {} is out of range for a scalar (rank 0)", axis);
  if (axis < -rank || axis >= rank) fail("axis {} is out of range for rank {}", axis, rank);
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

}  // namespace tessel
