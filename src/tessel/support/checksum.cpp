// Checksums of cached files (see checksum.h).
#include "tessel/support/checksum.h"

#include <xxhash.h>

#include <new>

#include "tessel/support/error.h"

namespace tessel {

namespace {

std::string hex(const XXH128_hash_t& h) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char b : c.digest) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

}  // namespace

std::string Checksum::str() const { return fmt::format("{} bytes, xxh3 {}", size, xxh3.empty() ? "(none)" : xxh3); }

Checksum checksum_bytes(const void* data, size_t n) { return {n, hex(XXH3_128bits(data, n))}; }

ChecksumBuilder::ChecksumBuilder() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_));
}

ChecksumBuilder::~ChecksumBuilder() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void ChecksumBuilder::update(const void* data, size_t n) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data, n);
  size_ += n;
}

Checksum ChecksumBuilder::finish() const { return {size_, hex(XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_)))}; }

std::string checksum_mismatch(const Checksum& got, const Checksum& want) {
  if (got.size != want.size) return fmt::format("size {} bytes, expected {}", got.size, want.size);
  if (got.xxh3 != want.xxh3) return fmt::format("checksum {}, expected {}", got.xxh3, want.xxh3.empty() ? "(none)" : want.xxh3);
  return {};
}

}  // namespace tessel
