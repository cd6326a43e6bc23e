// Memory read bandwidth of this machine, measured in-process: the reference that attention
// benchmarks report their cache-read rate against (DESIGN.md: speed is a ratio to a reference
// measured in the same run). Plus the number of bytes a decode step reads from a view.
#pragma once

#include <cstddef>

#include "base/thread_pool.h"
#include "kvstack/kv_view.h"

namespace kvstack {

// Reads a buffer of `bytes` (allocated and written once, before timing) with a vectorised sum,
// split into one contiguous range per thread of `pool` (null: the calling thread alone), and
// returns the best rate of `repetitions` passes in bytes per second. Use a buffer much larger
// than the last-level cache (callers default to 1 GiB); small sizes measure the caches.
// Requires bytes >= 64 and repetitions >= 1 (checked). Allocates `bytes` for the call.
double MeasureReadBandwidth(size_t bytes, int repetitions, ThreadPool* pool);

// Reads the arena units one decode step over `view` reads, in the decode kernel's order and
// without its arithmetic: one task per kv head (spread over `pool`; null: the calling thread),
// tiles of 256 tokens, each tile's key units then its value units, each block's run of units as
// one range. Returns the best rate of `repetitions` passes in bytes per second: what the memory
// system allows for this layout (blocks, two arenas), a limit to set the kernels' cache-read
// rates against beside MeasureReadBandwidth's one sequential range. Arena tokens only (F32 sinks
// and pending rows are not read); requires a view without per-head token counts and
// repetitions >= 1 (checked).
double MeasureDecodeReadRate(const KvLayerView& view, int repetitions, ThreadPool* pool);

// Bytes of cache one decode step over `view` reads, over every kv head: the key and value
// units covering the arena range [arena_begin, arena_end) (whole units, also where the range
// starts or ends inside one) plus the F32 key and value rows of the sink and pending segments.
size_t DecodeBytesRead(const KvLayerView& view);

}  // namespace kvstack
