// Large zeroed buffers straight from the kernel (anonymous mmap). Buffers of 2 MiB and more start on
// a 2 MiB boundary and ask for transparent huge pages: on the virtual machines tessel runs on, a
// fresh 4 KiB page costs a fault of ~25 us when first touched, so filling 28 MB of weights or a
// model's arena one small page at a time costs more than the copy itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace tessel {

struct PagesDeleter {
  size_t bytes = 0;
  void operator()(void* p) const;
};
using Pages = std::unique_ptr<uint8_t, PagesDeleter>;

// `bytes` zeroed bytes (pages are only materialised when touched), 64-byte aligned at least; null
// for 0 bytes. Throws tessel::Error when the memory cannot be mapped.
Pages allocate_pages(size_t bytes);

}  // namespace tessel
