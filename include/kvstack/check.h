// Invariant checks for kvstack's own code (never for user input, which gets a Status).
// KVS_CHECK is always on; KVS_DCHECK compiles away in NDEBUG builds and is for hot loops.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace kvstack::internal {
[[noreturn]] inline void CheckFailed(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "kvstack: invariant violated: %s at %s:%d\n", expr, file, line);
  std::abort();
}
}  // namespace kvstack::internal

#define KVS_CHECK(cond) \
  ((cond) ? (void)0 : ::kvstack::internal::CheckFailed(#cond, __FILE__, __LINE__))

#ifdef NDEBUG
#define KVS_DCHECK(cond) ((void)0)
#else
#define KVS_DCHECK(cond) KVS_CHECK(cond)
#endif
