// KvBudget: parsing, printing and resolving the token budget of an eviction policy. A budget
// is written the way users think of it — a token count, a share of the context, or bytes — and
// resolved to tokens per kv head only once the context and the codecs' sizes are known.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvstack/kv_config.h"

namespace kvstack {
namespace {

constexpr char kForms[] =
    "allowed: a token count (256), a fraction of the context (50% or 0.5), or bytes per "
    "sequence (4096B, 64KiB, 2MiB)";

absl::Status BadBudget(std::string_view text, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("budget '", std::string(text), "' ", std::string(why), "; ", kForms));
}

// Parses all of `text` as a non-negative decimal number.
bool ParseNumber(std::string_view text, double* value) {
  if (text.empty() || text.front() == '-' || text.front() == '+') return false;
  const char* end = text.data() + text.size();
  const auto [parsed_end, error] = std::from_chars(text.data(), end, *value);
  return error == std::errc() && parsed_end == end && std::isfinite(*value);
}

}  // namespace

absl::StatusOr<KvBudget> ParseKvBudget(std::string_view text) {
  struct Suffix {
    std::string_view text;
    double bytes;
  };
  constexpr Suffix kByteSuffixes[] = {
      {"KiB", 1024.0}, {"MiB", 1024.0 * 1024}, {"GiB", 1 << 30}, {"B", 1.0}};
  double number = 0;
  KvBudget budget;
  if (!text.empty() && text.back() == '%') {
    if (!ParseNumber(text.substr(0, text.size() - 1), &number)) {
      return BadBudget(text, "is not a number");
    }
    budget = {KvBudget::Kind::kFraction, number / 100.0};
  } else if (const auto* suffix = std::find_if(std::begin(kByteSuffixes), std::end(kByteSuffixes),
                                               [&](const Suffix& s) {
                                                 return text.size() > s.text.size() &&
                                                        text.ends_with(s.text);
                                               });
             suffix != std::end(kByteSuffixes)) {
    if (!ParseNumber(text.substr(0, text.size() - suffix->text.size()), &number)) {
      return BadBudget(text, "is not a number");
    }
    budget = {KvBudget::Kind::kBytes, std::floor(number * suffix->bytes)};
  } else {
    if (!ParseNumber(text, &number)) return BadBudget(text, "is not a number");
    if (number < 1.0 && number > 0.0) {
      budget = {KvBudget::Kind::kFraction, number};
    } else if (number != std::floor(number)) {
      return BadBudget(text, "is not a whole token count");
    } else {
      budget = {KvBudget::Kind::kTokens, number};
    }
  }
  if (budget.value <= 0) return BadBudget(text, "is zero");
  if (budget.kind == KvBudget::Kind::kFraction && budget.value > 1.0) {
    return BadBudget(text, "is more than the whole context");
  }
  return budget;
}

int KvBudget::Resolve(int context_tokens, double bytes_per_token) const {
  double tokens = 0;
  switch (kind) {
    case Kind::kNone:
      return context_tokens;
    case Kind::kTokens:
      tokens = value;
      break;
    case Kind::kFraction:
      tokens = std::floor(value * context_tokens);
      break;
    case Kind::kBytes:
      tokens = bytes_per_token > 0 ? std::floor(value / bytes_per_token) : 0;
      break;
  }
  return static_cast<int>(std::clamp(tokens, 1.0, 1e9));
}

std::string KvBudget::ToString() const {
  switch (kind) {
    case Kind::kNone:
      return "";
    case Kind::kTokens:
      return absl::StrFormat("%.0f", value);
    case Kind::kFraction:
      return absl::StrFormat("%g%%", value * 100.0);
    case Kind::kBytes:
      return absl::StrFormat("%.0fB", value);
  }
  return "";
}

}  // namespace kvstack
