// The orthonormal Hadamard rotation of a vector (fast Walsh–Hadamard transform scaled by
// 1/sqrt(n)). Rotating keys before quantisation spreads a few large outlier channels over the
// whole group, so a shared scale wastes fewer levels; since H is orthonormal and symmetric,
// q.k == (Hq).(Hk) and attention only needs the query rotated the same way.
#pragma once

#include <cmath>
#include <span>

#include "kvstack/check.h"

namespace kvstack {

inline bool IsPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

// x <- H x, in place. x.size() must be a power of two. Applying it twice is the identity.
inline void HadamardRotate(std::span<float> x) {
  const int n = static_cast<int>(x.size());
  KVS_CHECK(IsPowerOfTwo(n));
  for (int len = 1; len < n; len <<= 1) {
    for (int i = 0; i < n; i += 2 * len) {
      for (int j = i; j < i + len; ++j) {
        const float a = x[j];
        const float b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  for (float& v : x) v *= scale;
}

}  // namespace kvstack
