#include "base/large_buffer.h"

#include <sys/mman.h>

#include <algorithm>

#include "kvstack/check.h"

namespace kvstack {

void* AllocateLargeBuffer(size_t bytes, size_t alignment, size_t* rounded_bytes) {
  KVS_CHECK(alignment >= 64 && (alignment & (alignment - 1)) == 0);
  const bool huge = bytes >= kHugePageBytes;
  if (huge) alignment = std::max(alignment, kHugePageBytes);
  const size_t rounded = std::max<size_t>(1, (bytes + alignment - 1) / alignment) * alignment;
  void* p = std::aligned_alloc(alignment, rounded);
  if (p != nullptr && huge) {
    // Only a hint: without huge pages to give (THP "never", or none free) the pages stay 4 KiB.
    ::madvise(p, rounded, MADV_HUGEPAGE);
  }
  if (rounded_bytes != nullptr) *rounded_bytes = rounded;
  return p;
}

}  // namespace kvstack
