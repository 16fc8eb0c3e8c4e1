// Shapes: dims as int64, with kUnknownDim for sizes only known at run time (data-dependent ops).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessel {

using Shape = std::vector<int64_t>;
inline constexpr int64_t kUnknownDim = -1;

int64_t shape_numel(const Shape& s);  // product of dims; -1 if any unknown; saturates on overflow
bool shape_known(const Shape& s);
std::string shape_str(const Shape& s);        // "[1,128,?]"
std::vector<int64_t> strides_of(const Shape& s);  // row-major element strides

// numpy-style broadcast of two or more shapes; throws tessel::Error naming both shapes on mismatch.
Shape broadcast_shapes(const Shape& a, const Shape& b);
// For each element of `out` (row-major), the flat index of the matching element of an input of
// shape `in` broadcast to `out`.
std::vector<int64_t> broadcast_index(const Shape& in, const Shape& out);

// Normalises a possibly negative axis into [0, rank); throws naming the axis and rank (a scalar,
// rank 0, has no axis at all).
int normalize_axis(int64_t axis, int rank);

}  // namespace tessel
