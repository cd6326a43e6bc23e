// Scalar Q8_0 dequantisation, run once per tensor at model load (not in the forward pass).
#include "model/q8_0.h"

#include <cstring>

#include "kvstack/check.h"
#include "kvstack/numeric.h"

namespace kvstack {

void DequantizeQ8_0(std::span<const std::byte> src, std::span<float> dst) {
  KVS_CHECK(dst.size() % kQ8_0BlockSize == 0);
  const size_t num_blocks = dst.size() / kQ8_0BlockSize;
  KVS_CHECK(src.size() == num_blocks * kQ8_0BlockBytes);
  for (size_t b = 0; b < num_blocks; ++b) {
    const std::byte* block = src.data() + b * kQ8_0BlockBytes;
    uint16_t d_bits;
    std::memcpy(&d_bits, block, sizeof(d_bits));
    const float d = F16ToF32(d_bits);
    float* out = dst.data() + b * kQ8_0BlockSize;
    for (int64_t i = 0; i < kQ8_0BlockSize; ++i) {
      out[i] = d * static_cast<float>(static_cast<int8_t>(block[2 + i]));
    }
  }
}

}  // namespace kvstack
