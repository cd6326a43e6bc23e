// The codec name grammar and the unit sizes each name implies (see codec_name.h). The table
// below is the one place a codec base name is listed.
#include "represent/codec_name.h"

#include <array>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kvstack/check.h"

namespace kvstack {
namespace {

constexpr int kMaxHeadDim = 4096;
constexpr int kMaxGroup = 4096;

enum class GroupKind : uint8_t { kNone, kElements, kTokens };

struct BaseEntry {
  std::string_view name;
  CodecId id;
  int bits;
  GroupKind group;
};

// Registry order is the stable order CodecNames() reports; append only.
constexpr std::array<BaseEntry, 11> kBases = {{
    {"f32", CodecId::kF32, 32, GroupKind::kNone},
    {"f16", CodecId::kF16, 16, GroupKind::kNone},
    {"bf16", CodecId::kBF16, 16, GroupKind::kNone},
    {"fp8_e4m3", CodecId::kFp8E4M3, 8, GroupKind::kNone},
    {"fp8_e5m2", CodecId::kFp8E5M2, 8, GroupKind::kNone},
    {"int8", CodecId::kInt8, 8, GroupKind::kNone},
    {"int4", CodecId::kInt4, 4, GroupKind::kElements},
    {"int2", CodecId::kInt2, 2, GroupKind::kElements},
    {"q4_absmax", CodecId::kQ4Absmax, 4, GroupKind::kNone},
    {"kivi4", CodecId::kKivi4, 4, GroupKind::kTokens},
    {"kivi2", CodecId::kKivi2, 2, GroupKind::kTokens},
}};

// This absl predates std::string_view interop, hence the std::string copies in StrCat calls.
absl::Status Invalid(std::string_view name, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("codec '", std::string(name), "': ", what));
}

// Bits of `num_elements` codes fill whole bytes.
bool WholeBytes(int num_elements, int bits) { return (num_elements * bits) % 8 == 0; }

}  // namespace

std::string CodecName::canonical() const {
  return absl::StrCat(base, group > 0 ? absl::StrCat("-g", group) : "", tiled ? "-t16" : "");
}

std::vector<std::string> CodecBaseNames() {
  std::vector<std::string> names;
  for (const BaseEntry& entry : kBases) names.emplace_back(entry.name);
  return names;
}

absl::StatusOr<CodecName> ParseCodecName(std::string_view name) {
  const size_t dash = name.find('-');
  const std::string_view base = name.substr(0, dash);
  const BaseEntry* entry = nullptr;
  for (const BaseEntry& candidate : kBases) {
    if (candidate.name == base) entry = &candidate;
  }
  if (entry == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown codec '", std::string(name), "'; allowed: ", absl::StrJoin(CodecBaseNames(), ", "),
        ", lowrank-r<rank>[-int4], lowrank-e<percent>[-int4], latent-r<rank>[-int4]"));
  }
  CodecName parsed{.id = entry->id, .base = std::string(base), .bits = entry->bits};
  if (entry->group == GroupKind::kNone) {
    if (dash != std::string_view::npos) {
      return Invalid(name, absl::StrCat(std::string(base), " takes no options"));
    }
    return parsed;
  }
  parsed.group = kDefaultCodecGroup;
  if (dash == std::string_view::npos) return parsed;

  // Options, each at most once, -g before -t16: -g<N>, and -t16 for integer groups.
  const bool takes_tiles = entry->group == GroupKind::kElements;
  const std::string allowed =
      absl::StrCat(takes_tiles ? "-g<N>, -t16" : "-g<N>", " (e.g. '", std::string(base), "-g64",
                   takes_tiles ? "-t16" : "", "')");
  std::string_view rest = name.substr(dash + 1);
  bool seen_group = false;
  while (true) {
    const size_t next = rest.find('-');
    const std::string_view option = rest.substr(0, next);
    const auto bad = [&] {
      return Invalid(name,
                     absl::StrCat("bad option '-", std::string(option), "'; allowed: ", allowed));
    };
    if (option == "t16" && takes_tiles && !parsed.tiled) {
      parsed.tiled = true;
    } else {
      const std::string_view digits = option.substr(std::min<size_t>(1, option.size()));
      const bool well_formed = !seen_group && !parsed.tiled && option.size() >= 2 &&
                               option.size() <= 10 && option[0] == 'g' && digits[0] != '0' &&
                               digits.find_first_not_of("0123456789") == std::string_view::npos;
      int group = 0;
      if (!well_formed ||
          !absl::SimpleAtoi(absl::string_view(digits.data(), digits.size()), &group)) {
        return bad();
      }
      const int min_group = entry->group == GroupKind::kTokens ? 1 : 2;
      if (group < min_group || group > kMaxGroup) {
        return Invalid(
            name,
            absl::StrCat("group ", group, " is out of range; allowed: ", min_group, "..", kMaxGroup,
                         entry->group == GroupKind::kTokens ? " tokens" : " elements"));
      }
      parsed.group = group;
      seen_group = true;
    }
    if (next == std::string_view::npos) return parsed;
    rest = rest.substr(next + 1);
  }
}

absl::StatusOr<CodecFormat> ResolveCodecFormat(std::string_view name, int head_dim,
                                               CodecRole role) {
  KVS_ASSIGN_OR_RETURN(CodecName parsed, ParseCodecName(name));
  if (head_dim < 1 || head_dim > kMaxHeadDim) {
    return Invalid(
        name, absl::StrCat("head_dim ", head_dim, " is out of range; allowed: 1..", kMaxHeadDim));
  }
  CodecFormat format{.name = parsed, .head_dim = head_dim, .role = role};
  const int bits = parsed.bits;
  const auto code_bytes = [&](int num_elements) {
    return (static_cast<size_t>(num_elements) * bits + 7) / 8;
  };
  // Per-token groups of `size` consecutive elements with an F16 (scale, min) pair each: the
  // int<b> per-token layout, shared by kivi values.
  const auto row_groups = [&](int size, const char* what) -> absl::Status {
    format.num_groups = head_dim / size;
    format.group_size = size;
    if (format.num_groups > 1 && !WholeBytes(size, bits)) {
      return Invalid(name, absl::StrCat(what, " of ", size, " ", bits, "-bit codes is ",
                                        size * bits, " bits, not whole bytes, and head_dim ",
                                        head_dim, " holds ", format.num_groups,
                                        " of them; use a group whose codes fill whole bytes"));
    }
    format.header_bytes = 4 * static_cast<size_t>(format.num_groups);
    format.unit_bytes = format.header_bytes + code_bytes(head_dim);
    return absl::OkStatus();
  };
  const auto token_rows_fill_bytes = [&]() -> absl::Status {
    if (format.group_tokens > 1 && !WholeBytes(head_dim, bits)) {
      return Invalid(
          name, absl::StrCat("a token's ", head_dim, " ", bits, "-bit codes are ", head_dim * bits,
                             " bits, not whole bytes, and a unit holds ", format.group_tokens,
                             " tokens"));
    }
    return absl::OkStatus();
  };

  switch (parsed.id) {
    case CodecId::kF32:
    case CodecId::kF16:
    case CodecId::kBF16:
      format.unit_bytes = code_bytes(head_dim);
      break;
    case CodecId::kFp8E4M3:
    case CodecId::kFp8E5M2:
    case CodecId::kInt8:
      format.num_groups = 1;
      format.group_size = head_dim;
      format.header_bytes = 2;
      format.unit_bytes = 2 + code_bytes(head_dim);
      break;
    case CodecId::kQ4Absmax: {
      const int block = std::min(32, head_dim);
      if (head_dim % block != 0) {
        return Invalid(name, absl::StrCat("block min(32, head_dim ", head_dim, ") = ", block,
                                          " must divide head_dim ", head_dim));
      }
      format.num_groups = head_dim / block;
      format.group_size = block;
      format.header_bytes = 2 * static_cast<size_t>(format.num_groups);
      format.unit_bytes = format.header_bytes + code_bytes(head_dim);
      break;
    }
    case CodecId::kInt4:
    case CodecId::kInt2: {
      const int group = parsed.group;
      if (group <= head_dim) {
        if (head_dim % group != 0) {
          return Invalid(name, absl::StrCat("group ", group, " must divide head_dim ", head_dim,
                                            " or be a multiple of it"));
        }
        KVS_RETURN_IF_ERROR(row_groups(group, "a group"));
        if (parsed.tiled) {
          if (head_dim * bits % 32 != 0) {
            return Invalid(name,
                           absl::StrCat("tiles (-t16) store a token's codes as 32-bit words, "
                                        "and head_dim ",
                                        head_dim, " of ", bits, "-bit codes is ", head_dim * bits,
                                        " bits; allowed: head_dim a multiple of ", 32 / bits));
          }
          format.tile_tokens = kTileTokens;
          format.group_tokens = kTileTokens;
          format.unit_bytes *= kTileTokens;
        }
      } else if (parsed.tiled) {
        return Invalid(name, absl::StrCat("tiles (-t16) need groups within a token's row; group ",
                                          group, " is larger than head_dim ", head_dim,
                                          " (allowed: a group dividing head_dim)"));
      } else {
        if (group % head_dim != 0) {
          return Invalid(name, absl::StrCat("group ", group, " must divide head_dim ", head_dim,
                                            " or be a multiple of it"));
        }
        format.group_tokens = group / head_dim;
        KVS_RETURN_IF_ERROR(token_rows_fill_bytes());
        format.num_groups = 1;
        format.group_size = group;
        format.header_bytes = 4;
        format.unit_bytes = 4 + code_bytes(group);
      }
      break;
    }
    case CodecId::kLowRank:  // never parsed here: they need a profile (lowrank_codec.h)
    case CodecId::kLatent:
      KVS_CHECK(false && "ResolveCodecFormat: lowrank and latent are not in the name table");
      break;
    case CodecId::kKivi4:
    case CodecId::kKivi2: {
      const int group = parsed.group;
      if (role == CodecRole::kKey) {
        format.group_tokens = group;
        KVS_RETURN_IF_ERROR(token_rows_fill_bytes());
        format.num_groups = head_dim;
        format.group_size = group;
        format.channel_groups = true;
        format.header_bytes = 4 * static_cast<size_t>(head_dim);
        format.unit_bytes = format.header_bytes + code_bytes(group * head_dim);
      } else {
        const int value_group = std::min(group, head_dim);
        if (head_dim % value_group != 0) {
          return Invalid(name,
                         absl::StrCat("value group min(", group, ", head_dim ", head_dim,
                                      ") = ", value_group, " must divide head_dim ", head_dim));
        }
        KVS_RETURN_IF_ERROR(row_groups(value_group, "a value group"));
      }
      break;
    }
  }
  return format;
}

}  // namespace kvstack
