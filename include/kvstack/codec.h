// Codec: how one head's key or value vectors are stored in the cache (layer 2,
// representation). A codec turns `group_tokens()` consecutive tokens of one head — a unit —
// into a fixed number of bytes and back. Most codecs have units of one token (a row);
// codecs that group along the token axis (KIVI keys per channel, integer groups larger than
// head_dim) encode several tokens together, and the cache keeps the tokens of a unit that is
// not yet full in full precision until it fills.
// The virtual interface is for set-up, tests and generic paths; attention kernels are
// specialised per CodecId at compile time and read the bytes directly.
//
// Names (what users type; `-g<N>` sets a group size, `-r<N>` a rank):
//   f32, f16, bf16          plain floats
//   fp8_e4m3, fp8_e5m2      8-bit floats, one F16 absmax scale per token per head
//   int8                    symmetric, one F16 scale per token per head
//   int4[-g<N>], int2[-g<N>]  asymmetric (F16 scale + F16 minimum) per group of N elements
//                           (default 32). N <= head_dim: groups along the row (N divides
//                           head_dim). N > head_dim: a group is N / head_dim consecutive
//                           tokens of one head (N a multiple of head_dim) — the rule that
//                           lets models with small heads (stories260K: 8) group at all.
//   int4[-g<N>]-t16, int2[-g<N>]-t16  the same codes and bits in units of 16 tokens stored by
//                           column (groups within a row; head_dim x bits a multiple of 32), so
//                           that the AVX-512 VNNI decode readers load 16 tokens per vector (the
//                           AVX2 ones 8) with no transposes (src/represent/codec_name.h has the
//                           layout)
//   q4_absmax               baseline (llama.cpp q4_0's idea): symmetric 4-bit, one F16 absmax
//                           scale per block of min(32, head_dim) elements of a token's row
//   kivi4[-g<G>], kivi2[-g<G>]  KIVI: as keys, per channel over groups of G tokens (default
//                           32); as values, per token in groups of min(G, head_dim) elements
//   lowrank-r<R>, lowrank-e<P>, latent-r<R> (each [-int4])  coordinates in a calibrated basis;
//                           built from a profile (src/represent/lowrank_codec.h), not here
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvstack/check.h"
#include "kvstack/status.h"

namespace kvstack {

// Persisted in file formats and reports: explicit values, append-only.
enum class CodecId : uint16_t {
  kF32 = 0,
  kF16 = 1,   // IEEE binary16
  kBF16 = 2,  // bfloat16
  kFp8E4M3 = 3,
  kFp8E5M2 = 4,
  kInt8 = 5,
  kInt4 = 6,
  kInt2 = 7,
  kQ4Absmax = 8,
  kKivi4 = 9,
  kKivi2 = 10,
  kLowRank = 11,  // rank-r coordinates in a calibrated per-(layer, kv head) PCA basis
  kLatent = 12,   // rank-r coordinates of the joint [k; v] (one unit serves key and value)
};

// Whether a codec stores keys or values (KIVI quantises them along different axes).
enum class CodecRole : uint8_t { kKey = 0, kValue = 1 };

class Codec {
 public:
  virtual ~Codec() = default;

  virtual CodecId id() const = 0;
  // The full name as users type it, options included: "int4-g64".
  virtual std::string_view name() const = 0;
  // Elements per token per head; fixed at creation.
  virtual int head_dim() const = 0;
  // Consecutive tokens of one head encoded together in one unit. Default: 1.
  virtual int group_tokens() const { return 1; }
  // Exact bytes one unit (group_tokens() tokens of one head) occupies in the cache.
  virtual size_t unit_bytes() const = 0;
  // Storage bits per element, scales and metadata included.
  double bits_per_element() const {
    return 8.0 * static_cast<double>(unit_bytes()) / (group_tokens() * head_dim());
  }
  // Whether the codec needs a calibration profile before it can encode. Default: no.
  virtual bool needs_calibration() const { return false; }

  // src: [num_units * group_tokens(), head_dim] floats (token-major);
  // dst: [num_units, unit_bytes()] bytes. Sizes must agree (checked). NaN or Inf inputs must
  // not poison the other elements of their group (they are clamped or stored as themselves).
  // Thread-safe: codecs are immutable after creation.
  virtual void Encode(std::span<const float> src, std::span<std::byte> dst) const = 0;
  // src: [num_units, unit_bytes()] bytes; dst: [num_units * group_tokens(), head_dim] floats.
  virtual void Decode(std::span<const std::byte> src, std::span<float> dst) const = 0;

  // The same for the rows of one kv head, for codecs whose parameters differ per head (the
  // low-rank codec's bases). Callers that know the head use these; the default ignores it.
  virtual void EncodeHead(int kv_head, std::span<const float> src, std::span<std::byte> dst) const {
    Encode(src, dst);
  }
  virtual void DecodeHead(int kv_head, std::span<const std::byte> src, std::span<float> dst) const {
    Decode(src, dst);
  }

  // Joint codecs (latent) encode a token's key and value together into one unit: the key
  // arena's. The layer's value codec then owns no bytes: the cache gives it no arena and its
  // view reads the key arena, decoding values from the same units. A joint codec encodes only
  // through EncodeJointHead (Encode/EncodeHead of one side alone are invariant violations).
  // Default: not joint.
  virtual bool joint() const { return false; }
  // k, v: [num_units * group_tokens(), head_dim] each; dst: [num_units, unit_bytes()].
  virtual void EncodeJointHead(int kv_head, std::span<const float> k, std::span<const float> v,
                               std::span<std::byte> dst) const {
    KVS_CHECK(false && "EncodeJointHead: not a joint codec");
  }
};

// Creates the codec called `name` (see the grammar above) for rows of `head_dim` elements in
// `role`. Errors (InvalidArgument, one line): unknown names (listing the allowed ones), bad
// options (a group that does not divide head_dim or is not a multiple of it), impossible
// combinations.
absl::StatusOr<std::unique_ptr<Codec>> CreateCodec(std::string_view name, int head_dim,
                                                   CodecRole role = CodecRole::kKey);

// Checks a codec name and its options without a head_dim (for validating configurations
// before the model is known); CreateCodec still checks what depends on head_dim.
absl::Status CheckCodecName(std::string_view name);

// Every codec base name CreateCodec accepts, in a stable order (options not shown).
std::vector<std::string> CodecNames();

}  // namespace kvstack
