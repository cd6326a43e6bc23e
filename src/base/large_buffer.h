// Large buffers for data that is streamed: KV cache arenas, the read-bandwidth probe.
//
// Why: Linux backs ordinary allocations with 4 KiB pages, so a stream through hundreds of MiB
// (a long context's keys and values, every decode step) needs a page walk every 64 cache lines
// and keeps the TLB full. Where transparent huge pages are set to "madvise" (Debian's default),
// only memory that asks for them gets 2 MiB pages; these buffers ask.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>

namespace kvstack {

// Buffers of at least this many bytes are aligned to it and advised to use huge pages.
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

struct LargeBufferFree {
  void operator()(void* p) const { std::free(p); }
};

// `bytes` rounded up to a multiple of `alignment` (a power of two, at least 64; one multiple for
// 0 bytes), aligned to it; from kHugePageBytes on, rounded and aligned to kHugePageBytes and
// advised MADV_HUGEPAGE (a hint: where the kernel has none to give, the pages stay 4 KiB). Not
// zeroed; released with std::free (LargeBufferFree). Null when the memory is not there.
//   rounded_bytes: if not null, receives the size allocated.
void* AllocateLargeBuffer(size_t bytes, size_t alignment, size_t* rounded_bytes = nullptr);

}  // namespace kvstack
