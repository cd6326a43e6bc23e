// Intel AMX (Advanced Matrix Extensions): whether this process may use the tile registers and
// their int8 multiplies. Linux leaves the 8 KiB of tile data out of a thread's saved state until
// the process asks for it (arch_prctl ARCH_REQ_XCOMP_PERM); an instruction on the tiles before
// that kills the process with SIGILL, so kernels must ask here first.
#pragma once

#include <cstdint>

namespace kvstack {

// The 64-byte tile configuration (palette 1) as `ldtilecfg` (_tile_loadconfig) reads it: rows
// and bytes per row of each of the 16 tile slots (8 exist on current CPUs; unused ones stay 0).
struct alignas(64) AmxTileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of tile i
  uint8_t rows[16] = {};
};
static_assert(sizeof(AmxTileConfig) == 64);

// True when the CPU reports AMX-TILE and AMX-INT8 and the kernel granted this process the tile
// data. The first call (thread-safe) makes the request; later calls return its answer. False on
// other CPUs and operating systems.
bool AmxInt8Usable();

}  // namespace kvstack
