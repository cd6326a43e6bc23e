// Tests of AmxInt8Usable(): one answer for every thread, and where it says yes, the tile
// registers really are granted: a tile multiply runs (without the permission it would kill the
// process) and matches the scalar dot products.
#include "base/amx.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvstack {
namespace {

TEST(AmxTest, EveryThreadGetsTheSameAnswer) {
  std::vector<int> answers(4, -1);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&answers, i] { answers[i] = AmxInt8Usable() ? 1 : 0; });
  }
  for (std::thread& t : threads) t.join();
  for (int answer : answers) EXPECT_EQ(answer, AmxInt8Usable() ? 1 : 0);
}

#if defined(__x86_64__)
// C (16 x 16 int32) = A (16 x 64 s8) times B (16 rows of 16 columns x 4 s8) by tdpbssd.
__attribute__((target("amx-tile,amx-int8"))) void TileMultiply(const int8_t* a, const int8_t* b,
                                                               int32_t* c) {
  AmxTileConfig config;
  for (int t = 0; t < 3; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  _tile_loadconfig(&config);
  _tile_loadd(1, a, 64);
  _tile_loadd(2, b, 64);
  _tile_zero(0);
  _tile_dpbssd(0, 1, 2);
  _tile_stored(0, c, 64);
  _tile_release();
}

TEST(AmxTest, GrantedTilesMultiplyAsTheScalarDotProducts) {
  if (!AmxInt8Usable()) GTEST_SKIP() << "no AMX-INT8 on this CPU, or the tile data not granted";
  std::vector<int8_t> a(16 * 64), b(16 * 64);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<int8_t>((i * 37 + 11) % 255 - 127);
    b[i] = static_cast<int8_t>((i * 53 + 5) % 255 - 127);
  }
  std::vector<int32_t> c(16 * 16);
  TileMultiply(a.data(), b.data(), c.data());
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 16; ++n) {
      int32_t expected = 0;
      for (int k = 0; k < 64; ++k) expected += a[m * 64 + k] * b[(k / 4) * 64 + 4 * n + k % 4];
      EXPECT_EQ(c[m * 16 + n], expected) << m << ", " << n;
    }
  }
}
#endif

}  // namespace
}  // namespace kvstack
