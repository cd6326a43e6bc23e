// HeadProfile storage and head classes. The file is text on purpose: it is small (one number
// per kv head), people read and diff it to see which heads a model uses for retrieval, and a
// strict line-by-line reader still rejects anything that is not exactly what Save writes.
#include "kvstack/head_profile.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "kvstack/check.h"

namespace kvstack {
namespace {

constexpr char kMagic[] = "kvstack-head-profile";

// The significant lines of a profile file, each split into words, with their line numbers.
struct Line {
  int number;
  std::vector<std::string> words;
};

std::vector<Line> SignificantLines(const std::string& text) {
  std::vector<Line> lines;
  int number = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++number;
    const absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line.front() == '#') continue;
    lines.push_back({number, absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty())});
  }
  return lines;
}

}  // namespace

HeadProfile::HeadProfile(uint64_t model_hash, int num_layers, int num_kv_heads)
    : model_hash_(model_hash), num_layers_(num_layers), num_kv_heads_(num_kv_heads) {
  KVS_CHECK(num_layers >= 1 && num_layers <= kMaxLayers && num_kv_heads >= 1 &&
            num_kv_heads <= kMaxKvHeads);
  scores_.assign(static_cast<size_t>(num_layers) * num_kv_heads, 0.0);
}

size_t HeadProfile::Index(int layer, int head) const {
  KVS_CHECK(0 <= layer && layer < num_layers_ && 0 <= head && head < num_kv_heads_);
  return static_cast<size_t>(layer) * num_kv_heads_ + head;
}

double HeadProfile::score(int layer, int head) const { return scores_[Index(layer, head)]; }

void HeadProfile::set_score(int layer, int head, double score) {
  KVS_CHECK(score >= 0.0 && score <= 1.0);
  scores_[Index(layer, head)] = score;
}

absl::Status HeadProfile::Save(const std::string& path) const {
  std::ofstream out(path, std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrFormat("cannot write '%s'", path));
  out << absl::StrFormat(
      "%s %d\n# DuoAttention head classes: per (layer, kv head), the fraction of attention mass\n"
      "# outside the sinks and the recent window; the highest are retrieval heads.\n"
      "model_hash %016x\nnum_layers %d\nnum_kv_heads %d\n",
      kMagic, kVersion, model_hash_, num_layers_, num_kv_heads_);
  for (int l = 0; l < num_layers_; ++l) {
    out << "layer " << l;
    // %.17g reads back as the same double.
    for (int h = 0; h < num_kv_heads_; ++h) out << absl::StrFormat(" %.17g", score(l, h));
    out << '\n';
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrFormat("writing '%s' failed", path));
  return absl::OkStatus();
}

absl::StatusOr<HeadProfile> HeadProfile::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot open head profile '%s'", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::vector<Line> lines = SignificantLines(buffer.str());

  auto bad = [&](int line, const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrFormat("head profile '%s' line %d: %s", path, line, what));
  };
  if (lines.empty() || lines[0].words.empty() || lines[0].words[0] != kMagic) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s' is not a kvstack head profile (it must start with '%s %d')", path, kMagic, kVersion));
  }
  int version = 0;
  if (lines[0].words.size() != 2 || !absl::SimpleAtoi(lines[0].words[1], &version) ||
      version != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrFormat("head profile '%s' has version '%s'; this kvstack reads version %d", path,
                        lines[0].words.size() > 1 ? lines[0].words[1] : "", kVersion));
  }
  if (lines.size() < 4) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "head profile '%s' is truncated (needs model_hash, num_layers, num_kv_heads)", path));
  }
  // "<key> <value>" header lines, in this order.
  auto field = [&](const Line& line, const char* key) -> absl::StatusOr<std::string> {
    if (line.words.size() != 2 || line.words[0] != key) {
      return bad(line.number, absl::StrFormat("expected '%s <value>'", key));
    }
    return line.words[1];
  };
  uint64_t hash = 0;
  int num_layers = 0;
  int num_kv_heads = 0;
  KVS_ASSIGN_OR_RETURN(const std::string hash_text, field(lines[1], "model_hash"));
  if (hash_text.size() != 16 || !absl::SimpleHexAtoi(hash_text, &hash)) {
    return bad(lines[1].number, "model_hash must be 16 hex digits");
  }
  KVS_ASSIGN_OR_RETURN(const std::string layers_text, field(lines[2], "num_layers"));
  if (!absl::SimpleAtoi(layers_text, &num_layers) || num_layers < 1 || num_layers > kMaxLayers) {
    return bad(lines[2].number, absl::StrFormat("num_layers must be in [1, %d]", kMaxLayers));
  }
  KVS_ASSIGN_OR_RETURN(const std::string heads_text, field(lines[3], "num_kv_heads"));
  if (!absl::SimpleAtoi(heads_text, &num_kv_heads) || num_kv_heads < 1 ||
      num_kv_heads > kMaxKvHeads) {
    return bad(lines[3].number, absl::StrFormat("num_kv_heads must be in [1, %d]", kMaxKvHeads));
  }

  HeadProfile profile(hash, num_layers, num_kv_heads);
  profile.path_ = path;
  const size_t num_layer_lines = lines.size() - 4;
  if (num_layer_lines < static_cast<size_t>(num_layers)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "head profile '%s' is truncated: %d of %d layer lines", path, num_layer_lines, num_layers));
  }
  if (num_layer_lines > static_cast<size_t>(num_layers)) {
    return bad(lines[4 + num_layers].number,
               absl::StrFormat("unexpected line after the %d layer lines", num_layers));
  }
  for (int l = 0; l < num_layers; ++l) {
    const Line& line = lines[4 + l];
    int layer = -1;
    if (line.words.size() < 2 || line.words[0] != "layer" ||
        !absl::SimpleAtoi(line.words[1], &layer) || layer != l) {
      return bad(line.number,
                 absl::StrFormat("expected 'layer %d' and %d scores", l, num_kv_heads));
    }
    if (line.words.size() != static_cast<size_t>(num_kv_heads) + 2) {
      return bad(line.number, absl::StrFormat("layer %d has %d scores; expected %d", l,
                                              line.words.size() - 2, num_kv_heads));
    }
    for (int h = 0; h < num_kv_heads; ++h) {
      double score = 0;
      const std::string& text = line.words[h + 2];
      if (!absl::SimpleAtod(text, &score) || !(score >= 0.0 && score <= 1.0)) {
        return bad(line.number,
                   absl::StrFormat("score '%s' of kv head %d is not a number in [0, 1]", text, h));
      }
      profile.set_score(l, h, score);
    }
  }
  return profile;
}

absl::Status HeadProfile::CheckMatches(uint64_t model_hash, int num_layers,
                                       int num_kv_heads) const {
  const std::string name = path_.empty() ? "(in memory)" : absl::StrFormat("'%s'", path_);
  if (model_hash != model_hash_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "head profile %s was measured on another model (hash %016x; this model %016x)", name,
        model_hash_, model_hash));
  }
  if (num_layers != num_layers_ || num_kv_heads != num_kv_heads_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("head profile %s has %d layers x %d kv heads; the model has %d x %d", name,
                        num_layers_, num_kv_heads_, num_layers, num_kv_heads));
  }
  return absl::OkStatus();
}

std::vector<bool> HeadProfile::RetrievalHeads(double fraction) const {
  KVS_CHECK(fraction >= 0.0 && fraction <= 1.0);
  const size_t total = scores_.size();
  const size_t count = static_cast<size_t>(std::llround(fraction * static_cast<double>(total)));
  std::vector<size_t> order(total);
  std::iota(order.begin(), order.end(), size_t{0});
  // Stable: equal scores keep index order, i.e. the lower layer, then the lower head.
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return scores_[a] > scores_[b]; });
  std::vector<bool> retrieval(total, false);
  for (size_t i = 0; i < count; ++i) retrieval[order[i]] = true;
  return retrieval;
}

}  // namespace kvstack
