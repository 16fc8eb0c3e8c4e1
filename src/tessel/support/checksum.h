// Checksums of cached files (XXH3-128 with the byte count): what the compile cache and the
// executable cache verify before they use a file.
// docs/runtime/compiled-backend.md, "Integrity".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessel {

struct Checksum {
  uint64_t size = 0;
  std::string xxh3;  // XXH3-128 of the bytes, 32 lowercase hex digits; empty: none recorded
  bool operator==(const Checksum&) const = default;
  bool empty() const { return xxh3.empty(); }
  std::string str() const;  // "N bytes, xxh3 HEX", for messages
};

Checksum checksum_bytes(const void* data, size_t n);

// Checksum of pieces hashed one after the other (equal to checksum_bytes of their concatenation).
class ChecksumBuilder {
 public:
  ChecksumBuilder();
  ~ChecksumBuilder();
  ChecksumBuilder(const ChecksumBuilder&) = delete;
  ChecksumBuilder& operator=(const ChecksumBuilder&) = delete;
  void update(const void* data, size_t n);
  Checksum finish() const;

 private:
  void* state_;
  uint64_t size_ = 0;
};

// Why `got` is not `want` ("size 100, expected 200" or "checksum ... expected ..."); empty when equal.
std::string checksum_mismatch(const Checksum& got, const Checksum& want);


}  // namespace tessel
