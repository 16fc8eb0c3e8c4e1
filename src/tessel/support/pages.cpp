// Large zeroed buffers (see pages.h).
#include "tessel/support/pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tessel/support/error.h"

namespace tessel {

void PagesDeleter::operator()(void* p) const {
  if (p) ::munmap(p, bytes);
}

Pages allocate_pages(size_t bytes) {
  if (bytes == 0) return Pages(nullptr, PagesDeleter{0});
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t keep = (bytes + page - 1) / page * page;
  const bool huge = bytes >= kHuge;
  // Over-map by one huge page and trim both ends so the buffer starts on a huge-page boundary.
  const size_t map_len = huge ? keep + kHuge : keep;
  void* m = ::mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) fail("cannot map {} bytes of memory: {}", bytes, std::strerror(errno));
  uintptr_t a = reinterpret_cast<uintptr_t>(m);
  if (huge) {
    const uintptr_t b = a;
    a = (b + kHuge - 1) & ~(uintptr_t{kHuge} - 1);
    if (a > b) ::munmap(m, a - b);
    if (b + map_len > a + keep) ::munmap(reinterpret_cast<void*>(a + keep), b + map_len - (a + keep));
#ifdef MADV_HUGEPAGE
    ::madvise(reinterpret_cast<void*>(a), keep, MADV_HUGEPAGE);
#endif
  }
  return Pages(reinterpret_cast<uint8_t*>(a), PagesDeleter{keep});
}

}  // namespace tessel
