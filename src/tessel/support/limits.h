// Limits on what untrusted input (a model, a tensor file, a .tsl text) may make tessel allocate or
// read: one cap on any single allocation, sizes computed without overflow, and file reads that refuse
// what is not a regular file. docs/security.md ("Sizes, allocation and files") and docs/decisions.md say why these values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "tessel/support/dtype.h"
#include "tessel/support/shape.h"

namespace tessel {

// The largest single allocation input may ask for, in bytes: $TESSEL_MAX_ALLOC_BYTES (a byte count,
// optionally with a K/M/G/T suffix, powers of 1024) when set, else min(16 GiB, physical memory).
uint64_t max_alloc_bytes();
// Overrides the limit for this process (the CLI's --max-alloc; tests). 0 restores the default.
void set_max_alloc_bytes(uint64_t bytes);
// Parses "123", "64M", "16G" ... as bytes; nullopt when malformed or out of range.
std::optional<uint64_t> parse_byte_size(std::string_view text);

// Throws tessel::Error when `bytes` exceeds max_alloc_bytes(): "<what> needs N bytes, over the
// allocation limit of M bytes (TESSEL_MAX_ALLOC_BYTES)".
void check_alloc(uint64_t bytes, std::string_view what);

// Bytes of a tensor of `shape` and `dtype` (one byte per element for sub-byte types, as Tensor
// stores them); nullopt when a dim is unknown or negative or the product overflows 64 bits.
std::optional<uint64_t> tensor_bytes(DType dtype, const Shape& shape);
// tensor_bytes, checked: an unknown shape, an overflow or a size over the limit is an Error naming
// the shape, the dtype and `what`. Returns the element count.
int64_t checked_tensor_numel(DType dtype, const Shape& shape, std::string_view what = "a tensor");
// Whether checked_tensor_numel would accept the shape: no message is built, for the hot paths that
// name the tensor only when it fails (shape inference checks every output of every node).
bool tensor_within_limits(DType dtype, const Shape& shape);

// The whole of a regular file, read with a bound: a directory, FIFO, device (/dev/zero) or socket is
// refused, and so is a file larger than max_alloc_bytes(), before anything is read. Errors name
// `path` and `what` ("model file", "hardware file"). A nonzero `max_bytes` is a tighter bound of the
// caller's (a cache file whose size is known in advance).
std::string read_regular_file(const std::string& path, std::string_view what, uint64_t max_bytes = 0);
// The most dims a tensor may have. Real models stay under 10; without a bound a hostile model of rank
// 100 000 made fusion (quadratic in the rank) run for minutes (issue 41). Exceeding it is an error
// naming the value.
constexpr size_t kMaxRank = 64;

// What a file of st_mode `mode` is, for messages: "a directory", "a FIFO (pipe)", "a character device" ...
std::string file_kind(unsigned mode);
// Throws unless `path` is a regular file; returns its size. No size limit: a file of external data
// may hold many tensors, each read (and checked) on its own.
uint64_t check_regular_file(const std::string& path, std::string_view what);

}  // namespace tessel
