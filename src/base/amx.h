// Intel AMX (Advanced Matrix Extensions): whether this process may use the tile registers and
// their int8 multiplies. Linux leaves the 8 KiB of tile data out of a thread's saved state until
// the process asks for it (arch_prctl ARCH_REQ_XCOMP_PERM); an instruction on the tiles before
// that kills the process with SIGILL, so kernels must ask here first.
#pragma once

namespace kvstack {

// True when the CPU reports AMX-TILE and AMX-INT8 and the kernel granted this process the tile
// data. The first call (thread-safe) makes the request; later calls return its answer. False on
// other CPUs and operating systems.
bool AmxInt8Usable();

}  // namespace kvstack
