// Q8_0, ggml's 8-bit block quantisation: blocks of 32 elements, each stored as an F16 scale d
// followed by 32 int8 quants q, element = d * q (34 bytes per block). The GGUF reader and
// writer size tensors with these constants; the model loader dequantises with DequantizeQ8_0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvstack {

inline constexpr int64_t kQ8_0BlockSize = 32;    // elements per block
inline constexpr uint64_t kQ8_0BlockBytes = 34;  // f16 scale + 32 int8

// src: [dst.size() / 32 blocks of 34 bytes]; dst.size() must be a multiple of 32.
void DequantizeQ8_0(std::span<const std::byte> src, std::span<float> dst);

}  // namespace kvstack
