// Codec names and the byte layout they imply. ParseCodecName turns what a user typed
// ("int4", "kivi2-g64") into {CodecId, bits, group}; ResolveCodecFormat adds head_dim and
// role and gives every number a kernel needs to walk one unit's bytes (the byte-format
// contract in one place). CreateCodec, CheckCodecName and the SIMD kernels all use these,
// so the name grammar and the unit sizes have exactly one implementation.
//
// Grammar: <base>[-g<N>][-t16], N a decimal number without sign or leading zeros. Only int4,
// int2, kivi4 and kivi2 take -g (default 32); only int4 and int2 take -t16 (tiles, below);
// every other codec takes no option.
//
// Unit layout of the quantising codecs (all fields little-endian, scales and minimums F16):
//   fp8_*, int8       [f16 scale][head_dim x 8-bit code]
//   q4_absmax         [num_groups x f16 d][codes, 4 bits]
//   int<b>, kivi<b>   [num_groups x (f16 scale, f16 min)][codes, b bits]
// Codes: element e of the unit (token-major, e = t * head_dim + c) sits in byte e * b / 8 at
// bit offset (e * b) % 8, low bits first; the code block is padded to whole bytes.
//
// Tiles (-t16, int4 and int2 with groups within a row): a unit is 16 consecutive tokens, each
// quantised exactly as the untiled codec quantises a row ([num_groups x (scale, min)][codes]),
// with the 16 rows' 32-bit words stored by column, so that a SIMD lane per token reads them
// with plain vector loads (src/run/attention_vnni-inl.h):
//   [num_groups x 16 tokens x (f16 scale, f16 min)]       header pairs, group-major
//   keys:   [row code words x 16 tokens x 4 code bytes]   word w of every token, then w + 1
//   values: [4 quads x row code bytes x 4 tokens]         byte b of the quad's 4 tokens, then b + 1
// A value quad is 4 consecutive tokens (0-3, 4-7, ...): each 32-bit word holds one code byte of
// all four, which is what a dot product over four tokens per 32-bit lane (vpdpbusd) multiplies.
// The row's code bytes must be whole 32-bit words (head_dim * b a multiple of 32). Same bits
// per element and the same rounding as the untiled codec: only the byte order differs.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "kvstack/codec.h"
#include "kvstack/status.h"

namespace kvstack {

// Default group for the codecs that take -g<N>.
inline constexpr int kDefaultCodecGroup = 32;

struct CodecName {
  CodecId id = CodecId::kF32;
  std::string base;    // "int4"
  int bits = 32;       // bits per stored element code: 32, 16, 8, 4 or 2
  int group = 0;       // the -g value (default applied); 0 for codecs that take no option
  bool tiled = false;  // -t16
  // The canonical full name: base, plus "-g<group>" for codecs that take a group, plus "-t16"
  // for tiles.
  std::string canonical() const;
};

// Parses a name; InvalidArgument (one line) for unknown base names (listing the allowed
// ones), malformed or repeated options, options on codecs that take none, and groups out of
// range (int: 2..4096 elements; kivi: 1..4096 tokens).
absl::StatusOr<CodecName> ParseCodecName(std::string_view name);

// Every base name, in the stable registry order CodecNames() reports.
std::vector<std::string> CodecBaseNames();

// Everything about a codec's unit that depends on head_dim and role.
struct CodecFormat {
  CodecName name;
  int head_dim = 0;
  CodecRole role = CodecRole::kKey;
  int group_tokens = 1;  // tokens per unit (T)
  // Scale groups per unit and elements per scale group. 0 groups: plain floats.
  //   fp8/int8: 1 group of head_dim; q4_absmax: head_dim / B groups of B = min(32, head_dim);
  //   int per token and kivi values: head_dim / N groups of N consecutive elements;
  //   int spanning tokens (N > head_dim): 1 group of N = T * head_dim elements;
  //   kivi keys: head_dim groups (one per channel c) of T elements c, c + head_dim, ...
  int num_groups = 0;
  int group_size = 0;
  bool channel_groups = false;  // true for kivi keys: group c holds channel c of every token
  size_t header_bytes = 0;      // bytes of scales (and minimums) before the codes
  size_t unit_bytes = 0;        // header_bytes + the padded code block
  // Tiles (-t16): tokens per unit, stored by column (above); 0: not tiled. num_groups,
  // group_size and header_bytes then describe one row of the tile, unit_bytes the whole tile.
  int tile_tokens = 0;
};

// Tokens per tile of the -t16 layout.
inline constexpr int kTileTokens = 16;

// Tokens per value quad of the -t16 layout.
inline constexpr int kQuadTokens = 4;

// Where token t's bytes lie in a -t16 tile (the layout above), as offsets from the tile: header
// pair g, key code word w, a value quad and a value code byte b. The codec (encode, decode) and
// the decode readers (src/run) both take the layout from here.
struct TileGeometry {
  size_t num_groups = 0;
  size_t code_offset = 0;  // bytes of the header pairs: kTileTokens * 4 * num_groups
  size_t row_code_bytes = 0;
  size_t HeaderPair(size_t g, size_t t) const { return 4 * (kTileTokens * g + t); }
  size_t KeyWord(size_t w, size_t t) const { return code_offset + 4 * (kTileTokens * w + t); }
  // Where token t's quad starts: quad q = t / 4 takes the bytes rows 4 q .. 4 q + 3 take in the
  // untiled order, so that a quad's first row pointer (FillRows) points at the quad.
  size_t ValueQuad(size_t t) const {
    return code_offset + t / kQuadTokens * kQuadTokens * row_code_bytes;
  }
  size_t ValueByte(size_t b, size_t t) const {
    return ValueQuad(t) + kQuadTokens * b + t % kQuadTokens;
  }
  // fn(offset in the untiled row, offset in the tile, bytes) for each piece of token t's row
  // ([num_groups x (scale, min)][codes]): keys word by word, values byte by byte.
  template <typename Fn>
  void ForEachRowPiece(bool keys, size_t t, Fn&& fn) const {
    for (size_t g = 0; g < num_groups; ++g) fn(4 * g, HeaderPair(g, t), size_t{4});
    const size_t codes = 4 * num_groups;
    if (keys) {
      for (size_t w = 0; w < row_code_bytes / 4; ++w) fn(codes + 4 * w, KeyWord(w, t), size_t{4});
      return;
    }
    for (size_t b = 0; b < row_code_bytes; ++b) fn(codes + b, ValueByte(b, t), size_t{1});
  }
};

// Resolves `name` for rows of `head_dim` elements (1..4096) in `role`. InvalidArgument when
// the group does not fit head_dim: an int group that neither divides head_dim nor is a
// multiple of it, a kivi value group min(G, head_dim) or a q4_absmax block min(32, head_dim)
// that does not divide head_dim, or a layout where a unit holds several groups or tokens
// whose codes would not start on a byte boundary (e.g. int2-g2 on head_dim 8); tiles whose
// groups span tokens or whose rows' codes are not whole 32-bit words.
absl::StatusOr<CodecFormat> ResolveCodecFormat(std::string_view name, int head_dim, CodecRole role);

}  // namespace kvstack
