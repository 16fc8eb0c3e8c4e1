// Checksums of cached files and bounded whole-file reads (see checksum.h).
#include "tessel/support/checksum.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
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

[[noreturn]] void file_error(const std::string& path, const std::string& msg) { throw Error(Location{.file = path}, msg); }

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

std::string read_regular_file(const std::string& path, uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) file_error(path, fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat sb {};
  if (::fstat(fd, &sb) != 0) {
    const int e = errno;
    ::close(fd);
    file_error(path, fmt::format("cannot stat: {}", std::strerror(e)));
  }
  if (!S_ISREG(sb.st_mode)) {
    ::close(fd);
    file_error(path, "not a regular file");
  }
  const auto size = static_cast<uint64_t>(sb.st_size);
  if (size > max_bytes) {
    ::close(fd);
    file_error(path, fmt::format("{} bytes, more than the {} this file may have", size, max_bytes));
  }
  std::string out(size, '\0');
  size_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, out.data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      if (n == 0) file_error(path, fmt::format("changed while read: {} of {} bytes", got, size));
      file_error(path, fmt::format("cannot read: {}", std::strerror(e)));
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  return out;
}

}  // namespace tessel
