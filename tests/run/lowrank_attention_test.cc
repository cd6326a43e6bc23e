// Tests for the low-rank form of attention (src/run/lowrank_attention.h): decode and prefill
// against AttentionReference, which rebuilds every key and value with the codec's own Decode,
// on views of a real KvCache in every layout — contiguous, paged and a wrapped ring — with F32
// sinks, a pending recent window and Hadamard-rotated keys, for low-rank keys, values or both
// (F16 and 4-bit coordinates, next to any other codec on the other side), latent layers whose
// keys and values share one set of coordinates, GQA groups, one and two threads, and one-head
// views of a later kv head (first_kv_head picks that head's basis).

#include "run/lowrank_attention.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "kvstack/kv_cache.h"
#include "kvstack/kv_profile.h"
#include "represent/lowrank_codec.h"
#include "support/scratch_dir.h"

namespace kvstack {
namespace {

constexpr int kNumKvHeads = 2;
constexpr int kHeadDim = 16;  // a power of two, for the Hadamard cases
constexpr uint64_t kModelHash = 0x10e4a4c;

// Outputs against the double-precision reference on the same stored bytes. Both compute the
// same sums in another order: the reference rebuilds each key (mean + sum_j c_j b_j, float)
// and takes q.k in double, the kernel takes q.mean + (B q).c in float, so scores (of magnitude
// up to ~10) differ by a few float ulps of their terms, and outputs — weighted averages of
// values of magnitude ~1 — by a few ulps too: at most 4e-7 over these cases. 1e-5 leaves room
// for other rounding while any misread key, value, basis or segment shows as 1e-2 or more.
constexpr float kTolerance = 1e-5f;

// Rows whose channels are correlated (a random mixing of decaying variances) plus a mean, so
// that a profile's bases differ per head and from the axes.
std::vector<float> StructuredRows(int num_tokens, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> mix(kNumKvHeads * kHeadDim * kHeadDim);
  for (float& x : mix) x = normal(rng) / std::sqrt(float(kHeadDim));
  std::vector<float> rows;
  std::vector<float> z(kHeadDim);
  for (int t = 0; t < num_tokens; ++t) {
    for (int h = 0; h < kNumKvHeads; ++h) {
      for (int i = 0; i < kHeadDim; ++i) z[i] = normal(rng) * 2.0f / (1.0f + i);
      for (int i = 0; i < kHeadDim; ++i) {
        float x = 0.3f * (i % 3) - 0.2f * h;
        for (int j = 0; j < kHeadDim; ++j) x += mix[(h * kHeadDim + i) * kHeadDim + j] * z[j];
        rows.push_back(x);
      }
    }
  }
  return rows;
}

// One profile for the whole suite, saved where caches load it.
const std::string& ProfilePath() {
  static const std::string path = [] {
    std::mt19937 rng(11);
    KvProfile profile(kModelHash, 1, kNumKvHeads, kHeadDim);
    const std::vector<float> k = StructuredRows(3000, rng);
    std::vector<float> v = StructuredRows(3000, rng);
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * v[i] + 0.25f * k[i];  // correlated
    profile.Accumulate(0, k, v);
    KVS_CHECK(profile.Finalize().ok());
    const std::string p = testing_support::ScratchDir() + "/lowrank_attention_test.kvsprof";
    KVS_CHECK(profile.Save(p).ok());
    return p;
  }();
  return path;
}

struct Case {
  std::string k_codec = "lowrank-r4";
  std::string v_codec = "lowrank-r4";
  LayoutKind layout = LayoutKind::kContiguous;
  int num_tokens = 150;  // appended (a ring keeps the last capacity of them)
  int num_queries = 1;
  int group = 1;
  int sinks = 0;
  int recent = 0;
  bool hadamard = false;
  int threads = 1;
  int nan_key_token = -1;  // >= 0: that token's key for kv head 0 holds a NaN

  std::string Name() const {
    std::string name = k_codec + "__" + v_codec + "__" + std::string(LayoutName(layout)) + "__q" +
                       std::to_string(num_queries) + "_g" + std::to_string(group) + "_s" +
                       std::to_string(sinks) + "_r" + std::to_string(recent) +
                       (hadamard ? "_rot" : "") + "_t" + std::to_string(threads);
    for (char& c : name) c = (c == '-') ? '_' : c;
    return name;
  }
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.Name(); }

struct Built {
  std::unique_ptr<KvCache> cache;
  SeqId seq = -1;
  KvLayerView view;
};

Built Build(const Case& c) {
  KvCacheOptions options;
  options.num_layers = 1;
  options.num_kv_heads = kNumKvHeads;
  options.head_dim = kHeadDim;
  options.model_hash = kModelHash;
  KvConfig& config = options.config;
  config.layout = c.layout;
  config.block_size = 16;
  config.k_codec = c.k_codec;
  config.v_codec = c.v_codec;
  // A ring shorter than the tokens appended wraps; the others hold them all.
  config.capacity = c.layout == LayoutKind::kRing ? 96 : 256;
  config.sink_tokens = c.sinks;
  config.recent_tokens = c.recent;
  // The cache refuses rotated keys for key codecs built from a profile (their basis is of
  // unrotated keys); for those the view below is marked rotated by hand, which the kernel and
  // the reference must then both honour by rotating the queries.
  config.hadamard_keys = c.hadamard && !IsLowRankCodecName(c.k_codec);
  config.profile = ProfilePath();
  auto cache = KvCache::Create(options);
  KVS_CHECK(cache.ok());
  Built built;
  built.cache = std::move(*cache);
  built.seq = *built.cache->AddSequence();
  std::mt19937 rng(5);
  std::vector<float> k = StructuredRows(c.num_tokens, rng);
  const std::vector<float> v = StructuredRows(c.num_tokens, rng);
  const size_t token_floats = kNumKvHeads * kHeadDim;
  if (c.nan_key_token >= 0) k[c.nan_key_token * token_floats + 3] = std::nanf("");
  // Appended in uneven steps, as prefill chunks and decode steps would.
  for (int done = 0; done < c.num_tokens;) {
    const int n = std::min(c.num_tokens - done, 1 + (done * 7) % 23);
    auto plan = built.cache->PlanAppend(built.seq, n);
    KVS_CHECK(plan.ok() && plan->fits);
    KVS_CHECK(built.cache->CommitAppend(*plan).ok());
    const int begin = built.cache->NumTokens(built.seq) - n;
    built.cache->Write(built.seq, 0, begin,
                       std::span(k).subspan(done * token_floats, n * token_floats),
                       std::span(v).subspan(done * token_floats, n * token_floats));
    done += n;
  }
  built.view = built.cache->View(built.seq, 0);
  built.view.keys_rotated = c.hadamard;
  return built;
}

std::vector<float> Queries(int num_queries, int num_heads, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> q(static_cast<size_t>(num_queries) * num_heads * kHeadDim);
  for (float& x : q) x = 1.5f * normal(rng);
  return q;
}

float MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float worst = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) {
    const float d = std::fabs(a[i] - b[i]);
    if (std::isnan(d)) return INFINITY;
    worst = std::max(worst, d);
  }
  return worst;
}

class LowRankAttentionTest : public testing::TestWithParam<Case> {};

TEST_P(LowRankAttentionTest, MatchesTheReference) {
  const Case& c = GetParam();
  const Built built = Build(c);
  const KvLayerView& view = built.view;
  ASSERT_TRUE(LowRankFormApplies(view, nullptr));
  if (c.sinks > 0) {
    ASSERT_GT(view.sinks.end, 0);
  }
  if (c.recent > 0) {
    ASSERT_LT(view.arena_end(), view.num_tokens);
  }
  const AttentionParams params{.num_heads = kNumKvHeads * c.group,
                               .scale = 1.0f / std::sqrt(float(kHeadDim))};
  const std::vector<float> q = Queries(c.num_queries, params.num_heads, 17);
  std::vector<float> expected(q.size()), got(q.size()), dispatched(q.size());
  AttentionReference(view, q.data(), c.num_queries, params, expected.data());
  std::unique_ptr<ThreadPool> pool =
      c.threads > 1 ? std::make_unique<ThreadPool>(c.threads) : nullptr;
  LowRankAttention(view, q.data(), c.num_queries, params, got.data(), pool.get());
  EXPECT_LT(MaxDiff(got, expected), kTolerance);
  // Attention() takes this path for such views: the same result, bit for bit.
  Attention(view, q.data(), c.num_queries, params, dispatched.data(), pool.get());
  EXPECT_EQ(MaxDiff(dispatched, got), 0.0f);

  // A one-head view of kv head 1 reads head 1's basis (first_kv_head), with that head's queries.
  const KvLayerView one = view.HeadView(1);
  const AttentionParams one_params{.num_heads = c.group, .scale = params.scale};
  std::vector<float> q1(static_cast<size_t>(c.num_queries) * c.group * kHeadDim);
  for (int j = 0; j < c.num_queries; ++j) {
    std::copy_n(&q[(static_cast<size_t>(j) * params.num_heads + c.group) * kHeadDim],
                c.group * kHeadDim, &q1[static_cast<size_t>(j) * c.group * kHeadDim]);
  }
  std::vector<float> one_expected(q1.size()), one_got(q1.size());
  AttentionReference(one, q1.data(), c.num_queries, one_params, one_expected.data());
  LowRankAttention(one, q1.data(), c.num_queries, one_params, one_got.data(), pool.get());
  EXPECT_LT(MaxDiff(one_got, one_expected), kTolerance);
  for (int j = 0; j < c.num_queries; ++j) {  // and agrees with the full view's head 1
    for (int i = 0; i < c.group * kHeadDim; ++i) {
      EXPECT_NEAR(one_got[static_cast<size_t>(j) * c.group * kHeadDim + i],
                  got[(static_cast<size_t>(j) * params.num_heads + c.group) * kHeadDim + i],
                  kTolerance);
    }
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"lowrank-r4", "lowrank-r4"}, {"lowrank-r5-int4", "lowrank-r3-int4"},
      {"lowrank-r16", "f16"},       {"f16", "lowrank-r6"},
      {"int8", "lowrank-r2-int4"},  {"lowrank-r7-int4", "bf16"},
      {"latent-r6", "latent-r6"},   {"latent-r20-int4", "latent-r20-int4"}};
  for (const auto& [k, v] : pairs) {
    for (LayoutKind layout : {LayoutKind::kContiguous, LayoutKind::kPaged, LayoutKind::kRing}) {
      for (int num_queries : {1, 9}) {
        Case c;
        c.k_codec = k;
        c.v_codec = v;
        c.layout = layout;
        c.num_queries = num_queries;
        c.group = num_queries == 1 ? 4 : 2;
        cases.push_back(c);
        c.sinks = 3;  // F32 sinks (and, off the ring, a pending recent window)
        c.recent = layout == LayoutKind::kRing ? 0 : 5;
        c.hadamard = true;
        c.threads = 2;
        c.group = 1;
        cases.push_back(c);
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, LowRankAttentionTest, testing::ValuesIn(Cases()),
                         [](const testing::TestParamInfo<Case>& info) {
                           return info.param.Name();
                         });

// Long decode: enough keys for several split-K chunks per kv head over four threads.
TEST(LowRankAttentionSplit, ManyChunksMatchTheReference) {
  Case c;
  c.layout = LayoutKind::kPaged;
  c.num_tokens = 250;
  c.k_codec = c.v_codec = "latent-r9";
  c.group = 4;
  c.threads = 4;
  const Built built = Build(c);
  const AttentionParams params{.num_heads = kNumKvHeads * c.group, .scale = 0.25f};
  const std::vector<float> q = Queries(1, params.num_heads, 3);
  std::vector<float> expected(q.size()), got(q.size());
  AttentionReference(built.view, q.data(), 1, params, expected.data());
  ThreadPool pool(4);
  LowRankAttention(built.view, q.data(), 1, params, got.data(), &pool);
  EXPECT_LT(MaxDiff(got, expected), kTolerance);
}

// Every SIMD target this build has (scalar, SSE4, AVX2, AVX-512 where the machine runs them):
// vector widths from 1 to 16 lanes against ranks that fill them exactly (16, and 32 4-bit
// codes) or leave tails (13, 30).
TEST(LowRankAttentionTargets, EveryTargetMatchesTheReference) {
  std::vector<Case> cases;
  for (auto [k, v] :
       std::vector<std::pair<std::string, std::string>>{{"lowrank-r16", "lowrank-r13"},
                                                        {"latent-r32-int4", "latent-r32-int4"},
                                                        {"latent-r30-int4", "latent-r30-int4"},
                                                        {"lowrank-r13-int4", "f16"}}) {
    for (int num_queries : {1, 5}) {
      Case c;
      c.k_codec = k;
      c.v_codec = v;
      c.layout = LayoutKind::kPaged;
      c.num_queries = num_queries;
      c.group = 3;  // four rows and leftover rows
      c.sinks = 2;
      cases.push_back(c);
    }
  }
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (const Case& c : cases) {
      SCOPED_TRACE(c.Name());
      const Built built = Build(c);
      const AttentionParams params{.num_heads = kNumKvHeads * c.group, .scale = 0.3f};
      const std::vector<float> q = Queries(c.num_queries, params.num_heads, 23);
      std::vector<float> expected(q.size()), got(q.size());
      AttentionReference(built.view, q.data(), c.num_queries, params, expected.data());
      LowRankAttention(built.view, q.data(), c.num_queries, params, got.data(), nullptr);
      EXPECT_LT(MaxDiff(got, expected), kTolerance);
    }
  }
  hwy::SetSupportedTargetsForTest(0);  // back to the machine's own
}

// A NaN in an F32 key (a sink's, or one in the pending recent window that only the last
// queries see) makes the heads that see it NaN, as in the reference, and leaves the rest as
// they were; never a key that silently gets no weight.
TEST(LowRankAttentionNonFinite, NaNKeyMakesItsHeadsNaNAsInTheReference) {
  for (const int nan_key_token : {1, 147}) {
    for (const int num_queries : {1, 5}) {
      for (const int threads : {1, 2}) {
        Case c;
        c.k_codec = c.v_codec = "latent-r6";
        c.layout = LayoutKind::kPaged;
        c.num_queries = num_queries;
        c.group = 2;
        c.sinks = 3;
        c.recent = 5;
        c.threads = threads;
        c.nan_key_token = nan_key_token;
        SCOPED_TRACE(c.Name() + " NaN key at " + std::to_string(nan_key_token));
        const Built built = Build(c);
        ASSERT_TRUE(LowRankFormApplies(built.view, nullptr));
        const AttentionParams params{.num_heads = kNumKvHeads * c.group, .scale = 0.3f};
        const std::vector<float> q = Queries(c.num_queries, params.num_heads, 29);
        std::vector<float> expected(q.size()), got(q.size());
        AttentionReference(built.view, q.data(), c.num_queries, params, expected.data());
        std::unique_ptr<ThreadPool> pool =
            threads > 1 ? std::make_unique<ThreadPool>(threads) : nullptr;
        LowRankAttention(built.view, q.data(), c.num_queries, params, got.data(), pool.get());
        // Queries see keys up to their own position: token 147 of 150 is seen by the last 3.
        const int seeing = nan_key_token == 1 ? num_queries : std::min(num_queries, 3);
        int num_nans = 0;
        for (size_t i = 0; i < q.size(); ++i) {
          num_nans += std::isnan(expected[i]) ? 1 : 0;
          if (std::isnan(expected[i])) {
            EXPECT_TRUE(std::isnan(got[i])) << "element " << i << ": " << got[i];
          } else {
            EXPECT_NEAR(got[i], expected[i], kTolerance) << "element " << i;
          }
        }
        EXPECT_EQ(num_nans, seeing * c.group * kHeadDim);  // kv head 0's heads
      }
    }
  }
}

TEST(LowRankFormApplies, OnlyLowRankViewsWithoutScores) {
  Case c;
  const Built built = Build(c);
  EXPECT_TRUE(LowRankFormApplies(built.view, nullptr));
  std::vector<float> out(kNumKvHeads * 300);
  const AttentionScores scores{.out = out.data(), .stride = 300};
  EXPECT_FALSE(LowRankFormApplies(built.view, &scores));  // the kernels compute scores
  c.k_codec = c.v_codec = "f16";
  EXPECT_FALSE(LowRankFormApplies(Build(c).view, nullptr));
  c.k_codec = "kivi4";  // multi-token key units next to low-rank values
  c.v_codec = "lowrank-r4";
  EXPECT_FALSE(LowRankFormApplies(Build(c).view, nullptr));
}

}  // namespace
}  // namespace kvstack
