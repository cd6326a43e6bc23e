// AmxInt8Usable(): CPUID leaf 7 for the features (clang 14's __builtin_cpu_supports knows no AMX
// names), arch_prctl for the permission.

#include "base/amx.h"

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace kvstack {

bool AmxInt8Usable() {
#if defined(__x86_64__) && defined(__linux__)
  static const bool usable = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    constexpr unsigned kAmxTile = 1u << 24, kAmxInt8 = 1u << 25;  // CPUID.(7, 0):EDX
    if ((edx & kAmxTile) == 0 || (edx & kAmxInt8) == 0) return false;
    // From Linux's arch/x86/include/uapi/asm/prctl.h and its xstate numbering.
    constexpr int kArchReqXcompPerm = 0x1023;
    constexpr int kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return usable;
#else
  return false;
#endif
}

}  // namespace kvstack
