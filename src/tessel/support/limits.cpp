// The allocation limit, overflow-safe tensor sizes and bounded file reads (see limits.h).
#include "tessel/support/limits.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "tessel/support/error.h"

namespace tessel {

namespace {

std::atomic<uint64_t> g_override{0};

uint64_t physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

// min(16 GiB, physical memory), or $TESSEL_MAX_ALLOC_BYTES; read once (the environment does not change
// under a running process, and this is asked for every tensor made).
uint64_t default_limit() {
  static const uint64_t limit = [] {
    if (const char* env = std::getenv("TESSEL_MAX_ALLOC_BYTES"); env && *env) {
      if (auto v = parse_byte_size(env); v && *v > 0) return *v;
      throw Error(Location{}, fmt::format("TESSEL_MAX_ALLOC_BYTES='{}' is not a byte count (e.g. 4G, 512M, 1000000)", env));
    }
    const uint64_t cap = uint64_t{16} << 30;
    const uint64_t phys = physical_memory();
    return phys > 0 && phys < cap ? phys : cap;
  }();
  return limit;
}

}  // namespace

std::optional<uint64_t> parse_byte_size(std::string_view text) {
  if (text.empty()) return std::nullopt;
  uint64_t v = 0;
  size_t i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i)
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, uint64_t(text[i] - '0'), &v)) return std::nullopt;
  if (i == 0) return std::nullopt;
  int shift = 0;
  if (i < text.size()) {
    switch (text[i]) {
      case 'k': case 'K': shift = 10; break;
      case 'm': case 'M': shift = 20; break;
      case 'g': case 'G': shift = 30; break;
      case 't': case 'T': shift = 40; break;
      default: return std::nullopt;
    }
    ++i;
    if (i < text.size() && (text[i] == 'i' || text[i] == 'I')) ++i;  // "GiB"
    if (i < text.size() && (text[i] == 'b' || text[i] == 'B')) ++i;
  }
  if (i != text.size()) return std::nullopt;
  if (shift && v > (UINT64_MAX >> shift)) return std::nullopt;
  return v << shift;
}

uint64_t max_alloc_bytes() {
  const uint64_t o = g_override.load(std::memory_order_relaxed);
  return o ? o : default_limit();
}

void set_max_alloc_bytes(uint64_t bytes) { g_override.store(bytes, std::memory_order_relaxed); }

void check_alloc(uint64_t bytes, std::string_view what) {
  const uint64_t limit = max_alloc_bytes();
  if (bytes > limit)
    fail("{} needs {} bytes, over the allocation limit of {} bytes (set TESSEL_MAX_ALLOC_BYTES or --max-alloc to change it)",
         what, bytes, limit);
}

std::optional<uint64_t> tensor_bytes(DType dtype, const Shape& shape) {
  uint64_t n = 1;
  bool overflow = false;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d == 0) return 0;  // empty, whatever the other dims
    overflow = overflow || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n);
  }
  if (overflow || __builtin_mul_overflow(n, static_cast<uint64_t>(dtype_size(dtype)), &n)) return std::nullopt;
  return n;
}

int64_t checked_tensor_numel(DType dtype, const Shape& shape, std::string_view what) {
  if (!shape_known(shape)) fail("cannot allocate {} of unknown shape {}", what, shape_str(shape));
  const auto bytes = tensor_bytes(dtype, shape);
  if (!bytes || *bytes > uint64_t(INT64_MAX))
    fail("{} of shape {} and dtype {} has more bytes than 64-bit arithmetic can count", what, shape_str(shape), dtype_name(dtype));
  if (*bytes > max_alloc_bytes())
    check_alloc(*bytes, fmt::format("{} of shape {} and dtype {}", what, shape_str(shape), dtype_name(dtype)));
  return shape_numel(shape);
}

bool tensor_within_limits(DType dtype, const Shape& shape) {
  if (!shape_known(shape)) return false;
  const auto bytes = tensor_bytes(dtype, shape);
  return bytes && *bytes <= uint64_t(INT64_MAX) && *bytes <= max_alloc_bytes();
}

std::string file_kind(unsigned mode) {
  const auto m = static_cast<mode_t>(mode);
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

uint64_t check_regular_file(const std::string& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw Error(Location{.file = path}, fmt::format("cannot read the {}: {}", what, std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    throw Error(Location{.file = path}, fmt::format("is {}; expected a regular {}", file_kind(st.st_mode), what));
  return static_cast<uint64_t>(st.st_size);
}

std::string read_regular_file(const std::string& path, std::string_view what, uint64_t max_bytes) {
  // Opened first, then checked through the descriptor: a path swapped for a FIFO between a stat()
  // and an open() cannot make the read unbounded. O_NONBLOCK: opening a FIFO does not wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(Location{.file = path}, fmt::format("cannot read the {}: {}", what, std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Error(Location{.file = path}, fmt::format("cannot open the {}: {}", what, std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    throw Error(Location{.file = path}, fmt::format("is {}; expected a regular {}", file_kind(st.st_mode), what));
  const auto size = static_cast<uint64_t>(st.st_size);
  if (max_bytes != 0 && size > max_bytes)
    throw Error(Location{.file = path}, fmt::format("{} bytes, more than the {} a {} may have", size, max_bytes, what));
  try {
    check_alloc(size, fmt::format("reading the {}", what));
  } catch (const Error& e) {
    throw e.with_context(Location{.file = path});
  }
  std::string out(static_cast<size_t>(size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t r = ::read(fd, out.data() + done, out.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw Error(Location{.file = path}, fmt::format("cannot read the {}: {}", what, std::strerror(errno)));
    if (r == 0) break;  // shrank while read: what is there
    done += static_cast<size_t>(r);
  }
  out.resize(done);
  return out;
}

}  // namespace tessel
