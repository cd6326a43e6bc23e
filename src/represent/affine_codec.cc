// The asymmetric integer codecs: int4/int2 (groups along a token's row, or one group spanning
// several tokens) and kivi4/kivi2 (keys: one group per channel over the unit's tokens;
// values: the int per-token layout). All of them are "a unit of group_tokens x head_dim
// elements, split into groups, each with an F16 (scale, min) pair, then the b-bit codes of
// the whole unit token-major" — they differ only in which elements form a group, which
// CodecFormat describes. So one class implements all four, and the format is in one place.
// Tiles (-t16) are 16 rows of the per-token layout with their bytes reordered (codec_name.h).
#include <cstring>
#include <vector>

#include "represent/codec_impl.h"
#include "represent/quant.h"

namespace kvstack {
namespace {

class AffineCodec final : public QuantCodec {
 public:
  explicit AffineCodec(const CodecFormat& format) : QuantCodec(format) {
    // Element e_k of group g is first(g) + k * stride: consecutive elements for row and
    // token-spanning groups, every head_dim-th for kivi key channels.
    group_first_step_ = format.channel_groups ? 1 : format.group_size;
    element_stride_ = format.channel_groups ? format.head_dim : 1;
    // What EncodeGroups and DecodeGroups handle at once: a whole unit, or one row of a tile.
    group_unit_elems_ =
        static_cast<size_t>(format.tile_tokens > 0 ? 1 : format.group_tokens) * format.head_dim;
    if (format.tile_tokens > 0) {
      const size_t row_bytes = format.unit_bytes / format.tile_tokens;
      tile_ = {static_cast<size_t>(format.num_groups), kTileTokens * format.header_bytes,
               row_bytes - format.header_bytes};
    }
  }

 private:
  void EncodeUnit(const float* src, std::byte* dst) const override {
    const int tile = format().tile_tokens;
    if (tile == 0) return EncodeGroups(src, dst);
    std::byte row[kMaxRowBytes];
    for (int t = 0; t < tile; ++t) {
      EncodeGroups(src + static_cast<size_t>(t) * format().head_dim, row);
      tile_.ForEachRowPiece(keys(), static_cast<size_t>(t),
                            [&](size_t in_row, size_t in_tile, size_t n) {
                              std::memcpy(dst + in_tile, row + in_row, n);
                            });
    }
  }

  void DecodeUnit(const std::byte* src, float* dst) const override {
    const int tile = format().tile_tokens;
    if (tile == 0) return DecodeGroups(src, dst);
    std::byte row[kMaxRowBytes];
    for (int t = 0; t < tile; ++t) {
      tile_.ForEachRowPiece(keys(), static_cast<size_t>(t),
                            [&](size_t in_row, size_t in_tile, size_t n) {
                              std::memcpy(row + in_row, src + in_tile, n);
                            });
      DecodeGroups(row, dst + static_cast<size_t>(t) * format().head_dim);
    }
  }

  // The groups of one untiled unit (or one row of a tile): src [group_unit_elems_] floats,
  // dst the untiled layout's bytes.
  void EncodeGroups(const float* src, std::byte* dst) const {
    const CodecFormat& f = format();
    const int bits = f.name.bits;
    thread_local std::vector<uint8_t> q;  // one code per element, packed at the end
    q.resize(group_unit_elems_);
    for (int g = 0; g < f.num_groups; ++g) {
      const size_t first = static_cast<size_t>(g) * group_first_step_;
      const quant::Affine affine =
          quant::MakeAffine(src + first, f.group_size, element_stride_, bits);
      quant::StoreF16(dst + 4 * g, affine.scale.bits);
      quant::StoreF16(dst + 4 * g + 2, affine.min.bits);
      for (int k = 0; k < f.group_size; ++k) {
        const size_t e = first + static_cast<size_t>(k) * element_stride_;
        q[e] = static_cast<uint8_t>(affine.Code(src[e]));
      }
    }
    quant::PackCodes(q.data(), q.size(), bits, dst + f.header_bytes);
  }

  void DecodeGroups(const std::byte* src, float* dst) const {
    const CodecFormat& f = format();
    const int bits = f.name.bits;
    const std::byte* codes = src + f.header_bytes;
    for (int g = 0; g < f.num_groups; ++g) {
      const size_t first = static_cast<size_t>(g) * group_first_step_;
      const float scale = quant::LoadF16(src + 4 * g);
      const float min = quant::LoadF16(src + 4 * g + 2);
      for (int k = 0; k < f.group_size; ++k) {
        const size_t e = first + static_cast<size_t>(k) * element_stride_;
        dst[e] = quant::AffineValue(quant::GetCode(codes, e, bits), scale, min);
      }
    }
  }

  bool keys() const { return format().role == CodecRole::kKey; }

  // Bytes of one row of a tile: (scale, min) pairs of 2-element groups at most, plus the codes.
  static constexpr size_t kMaxRowBytes = 4 * 4096 / 2 + 4096 / 2;

  size_t group_first_step_ = 0;
  size_t element_stride_ = 1;
  size_t group_unit_elems_ = 0;
  TileGeometry tile_;  // tiles: where each row's pieces lie (codec_name.h)
};

}  // namespace

std::unique_ptr<Codec> MakeAffineCodec(const CodecFormat& format) {
  KVS_CHECK(format.name.bits == 4 || format.name.bits == 2);
  KVS_CHECK(format.num_groups * format.group_size ==
            (format.tile_tokens > 0 ? 1 : format.group_tokens) * format.head_dim);
  return std::make_unique<AffineCodec>(format);
}

}  // namespace kvstack
