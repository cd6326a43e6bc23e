// Codec: how one head's key or value vector is stored in the cache (layer 2, representation).
// A codec turns rows of `head_dim` floats into a fixed number of bytes per row and back.
// The virtual interface is for set-up, tests and slow paths; attention kernels are specialised
// per CodecId at compile time and read the bytes directly.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvstack/status.h"

namespace kvstack {

// Persisted in file formats and reports: explicit values, append-only.
enum class CodecId : uint16_t {
  kF32 = 0,
  kF16 = 1,   // IEEE binary16
  kBF16 = 2,  // bfloat16
};

class Codec {
 public:
  virtual ~Codec() = default;

  virtual CodecId id() const = 0;
  // The name users type: "f32", "f16", "bf16".
  virtual std::string_view name() const = 0;
  // Elements per row; fixed at creation.
  virtual int head_dim() const = 0;
  // Exact bytes one row (one token, one head) occupies in the cache.
  virtual size_t row_bytes() const = 0;
  // Storage bits per element, scales and metadata included.
  double bits_per_element() const { return 8.0 * row_bytes() / head_dim(); }
  // Whether the codec needs a calibration profile before it can encode. Default: no.
  virtual bool needs_calibration() const { return false; }

  // src: [num_rows, head_dim] floats; dst: [num_rows, row_bytes()] bytes.
  // Sizes must agree (checked). Thread-safe: codecs are immutable after creation.
  virtual void Encode(std::span<const float> src, std::span<std::byte> dst) const = 0;
  // src: [num_rows, row_bytes()] bytes; dst: [num_rows, head_dim] floats.
  virtual void Decode(std::span<const std::byte> src, std::span<float> dst) const = 0;
};

// Creates the codec called `name` for rows of `head_dim` elements. Unknown names get an
// InvalidArgument error that lists the allowed names.
absl::StatusOr<std::unique_ptr<Codec>> CreateCodec(std::string_view name, int head_dim);

// Every codec name CreateCodec accepts, in a stable order.
std::vector<std::string> CodecNames();

}  // namespace kvstack
