// Attention over a layer whose kv heads use different codecs (KvConfig::head_codecs): a real
// KvCache holds bf16, int8, int4 and KIVI-2 heads side by side, all different or in runs of
// two alike. Decode and prefill, with scores, go through AttentionAnyHeads (one kernel call
// per run); each head's query group must match AttentionReference on the same view, and what
// a cache of that head's codecs alone gives for the same tokens (the same bytes, read by the
// same kernel); after evictions, the reference over each head's own view.

#include <array>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "base/thread_pool.h"
#include "gtest/gtest.h"
#include "kvstack/kv_cache.h"
#include "run/attention.h"
#include "run/attention_heads.h"

namespace kvstack::attention_test {
namespace {

constexpr int kKvHeads = 4;
constexpr int kGroup = 2;
constexpr int kDim = 64;
// A multiple of every head's unit (KIVI-2's 32 tokens): nothing is pending, so every head of
// the mixed cache and of a uniform one holds its tokens as the same bytes.
constexpr int kTokens = 320;

// The codecs of each head, [k, v]: four different ones, or runs of two that read alike
// (AttentionAnyHeads reads such a run in one call).
using HeadCodecs = std::array<std::array<std::string, 2>, kKvHeads>;
const HeadCodecs kAllDifferent = {
    {{"bf16", "bf16"}, {"int8", "int8"}, {"int4-g32", "int4-g32"}, {"kivi2-g32", "kivi2-g32"}}};
const HeadCodecs kRunsOfTwo = {{{"int8", "int4-g32"},
                                {"int8", "int4-g32"},
                                {"kivi2-g32", "kivi2-g32"},
                                {"kivi2-g32", "kivi2-g32"}}};

// A cache whose heads have `codecs` (mixed), or whose every head has head `uniform_head`'s.
std::unique_ptr<KvCache> MakeCache(::kvstack::LayoutKind layout, const HeadCodecs& codecs,
                                   bool mixed, int uniform_head = 0) {
  KvCacheOptions options;
  options.num_layers = 1;
  options.num_kv_heads = kKvHeads;
  options.head_dim = kDim;
  options.config.layout = layout;
  options.config.capacity = kTokens;
  options.config.block_size = layout == ::kvstack::LayoutKind::kPaged ? 32 : 0;
  if (mixed) {
    options.config.k_codec = options.config.v_codec = "f16";  // every head overrides it
    for (int h = 0; h < kKvHeads; ++h) {
      options.config.head_codecs.push_back(
          {.layer_idx = 0, .kv_head = h, .k_codec = codecs[h][0], .v_codec = codecs[h][1]});
    }
  } else {
    options.config.k_codec = codecs[uniform_head][0];
    options.config.v_codec = codecs[uniform_head][1];
  }
  auto cache = KvCache::Create(options);
  KVS_CHECK(cache.ok());
  return std::move(*cache);
}

// Appends the same kTokens random tokens to a new sequence of `cache`.
SeqId Fill(KvCache& cache) {
  auto seq = cache.AddSequence();
  KVS_CHECK(seq.ok());
  auto plan = cache.PlanAppend(*seq, kTokens);
  KVS_CHECK(plan.ok() && plan->fits && cache.CommitAppend(*plan).ok());
  const size_t size = static_cast<size_t>(kTokens) * kKvHeads * kDim;
  cache.Write(*seq, 0, 0, RandomVector(size, 1.0f, 1), RandomVector(size, 1.0f, 2));
  return *seq;
}

// The part of `rows` ([num_queries][num_heads][kDim]) that belongs to kv head h's group.
std::vector<float> GroupOf(const std::vector<float>& rows, int num_queries, int h) {
  std::vector<float> out;
  const size_t group_floats = static_cast<size_t>(kGroup) * kDim;
  for (int j = 0; j < num_queries; ++j) {
    const auto begin = rows.begin() + (static_cast<size_t>(j) * kKvHeads + h) * group_floats;
    out.insert(out.end(), begin, begin + group_floats);
  }
  return out;
}

class AttentionHeadCodecsTest
    : public ::testing::TestWithParam<std::tuple<::kvstack::LayoutKind, int, bool>> {};

TEST_P(AttentionHeadCodecsTest, EachHeadReadsItsOwnCodec) {
  const auto [layout, num_queries, runs_of_two] = GetParam();
  const HeadCodecs& codecs = runs_of_two ? kRunsOfTwo : kAllDifferent;
  ThreadPool pool(2);
  std::unique_ptr<KvCache> mixed = MakeCache(layout, codecs, true);
  const KvLayerView view = mixed->View(Fill(*mixed), 0);
  ASSERT_TRUE(view.mixed_codecs());
  EXPECT_EQ(view.SameHeads(0, 1), runs_of_two);
  const AttentionParams params{kKvHeads * kGroup, 1.0f / std::sqrt(static_cast<float>(kDim))};
  const std::vector<float> q =
      GridQueries(static_cast<size_t>(num_queries) * params.num_heads * kDim, 3.0f, 3);
  const int stride = kTokens + 3;
  std::vector<float> got(q.size()), want(q.size());
  std::vector<float> got_scores(static_cast<size_t>(kKvHeads) * stride, 0.0f);
  std::vector<float> want_scores = got_scores;
  const AttentionScores got_spec{got_scores.data(), stride, 0, ScoreAggregation::kMax};
  const AttentionScores want_spec{want_scores.data(), stride, 0, ScoreAggregation::kMax};
  AttentionAnyHeads(view, q.data(), num_queries, params, got.data(), &pool, &got_spec);
  AttentionReference(view, q.data(), num_queries, params, want.data(), &want_spec);

  for (int h = 0; h < kKvHeads; ++h) {
    SCOPED_TRACE("kv head " + std::to_string(h) + " (" + codecs[h][0] + ")");
    const Case c{.num_queries = num_queries, .k_codec = codecs[h][0], .v_codec = codecs[h][1]};
    ExpectClose(GroupOf(got, num_queries, h), GroupOf(want, num_queries, h), ToleranceFor(c),
                "output against the reference");
    const std::vector<float> head_scores(got_scores.begin() + h * stride,
                                         got_scores.begin() + (h + 1) * stride);
    const std::vector<float> want_head(want_scores.begin() + h * stride,
                                       want_scores.begin() + (h + 1) * stride);
    ExpectClose(head_scores, want_head, ToleranceFor(c), "scores against the reference");

    // A cache of head h's codecs for every head, holding the same tokens.
    std::unique_ptr<KvCache> uniform = MakeCache(layout, codecs, false, h);
    const KvLayerView uniform_view = uniform->View(Fill(*uniform), 0);
    std::vector<float> alone(q.size());
    Attention(uniform_view, q.data(), num_queries, params, alone.data(), &pool);
    ExpectClose(GroupOf(got, num_queries, h), GroupOf(alone, num_queries, h), 1e-5f,
                "output against a cache of this head's codecs");
  }
}

INSTANTIATE_TEST_SUITE_P(LayoutsAndQueries, AttentionHeadCodecsTest,
                         ::testing::Combine(::testing::Values(::kvstack::LayoutKind::kPaged,
                                                              ::kvstack::LayoutKind::kContiguous),
                                            ::testing::Values(1, 7), ::testing::Bool()),
                         [](const auto& info) {
                           const bool paged =
                               std::get<0>(info.param) == ::kvstack::LayoutKind::kPaged;
                           return std::string(paged ? "paged" : "contiguous") +
                                  (std::get<1>(info.param) == 1 ? "_decode" : "_prefill") +
                                  (std::get<2>(info.param) ? "_runs_of_two" : "_all_different");
                         });

// After evictions heads hold different numbers of tokens too: runs split where either differs,
// and each head's group matches the reference over that head's own view.
TEST(AttentionHeadCodecsEvictedTest, RunsSplitWhereTokenCountsDiffer) {
  ThreadPool pool(2);
  std::unique_ptr<KvCache> mixed = MakeCache(::kvstack::LayoutKind::kPaged, kRunsOfTwo, true);
  const SeqId seq = Fill(*mixed);
  // Head 0 drops the last two 32-token units (the layer's period), head 3 every other unit.
  std::vector<int> head0, head3;
  for (int t = 0; t < kTokens; ++t) {
    if (t < 256) head0.push_back(t);
    if ((t / 32) % 2 == 0) head3.push_back(t);
  }
  ASSERT_TRUE(mixed->RetainTokens(seq, 0, 0, head0).ok());
  ASSERT_TRUE(mixed->RetainTokens(seq, 0, 3, head3).ok());
  const KvLayerView view = mixed->View(seq, 0);
  EXPECT_FALSE(view.SameHeads(0, 1));  // the same codecs, different counts
  EXPECT_FALSE(view.SameHeads(2, 3));
  const AttentionParams params{kKvHeads * kGroup, 1.0f / std::sqrt(static_cast<float>(kDim))};
  for (const int num_queries : {1, 5}) {
    const std::vector<float> q =
        GridQueries(static_cast<size_t>(num_queries) * params.num_heads * kDim, 3.0f, 4);
    std::vector<float> got(q.size());
    AttentionAnyHeads(view, q.data(), num_queries, params, got.data(), &pool, nullptr);
    for (int h = 0; h < kKvHeads; ++h) {
      SCOPED_TRACE("kv head " + std::to_string(h) + ", " + std::to_string(num_queries) +
                   " queries");
      const std::vector<float> q_head = GroupOf(q, num_queries, h);
      std::vector<float> want(q_head.size());
      AttentionReference(view.HeadView(h), q_head.data(), num_queries, {kGroup, params.scale},
                         want.data(), nullptr);
      const Case c{
          .num_queries = num_queries, .k_codec = kRunsOfTwo[h][0], .v_codec = kRunsOfTwo[h][1]};
      ExpectClose(GroupOf(got, num_queries, h), want, ToleranceFor(c), "output");
    }
  }
}

TEST(AttentionHeadCodecsDeathTest, AttentionRefusesAMixedView) {
  std::unique_ptr<KvCache> mixed = MakeCache(::kvstack::LayoutKind::kPaged, kAllDifferent, true);
  const KvLayerView view = mixed->View(Fill(*mixed), 0);
  const AttentionParams params{kKvHeads * kGroup, 0.125f};
  std::vector<float> q(static_cast<size_t>(params.num_heads) * kDim, 0.5f), out(q.size());
  EXPECT_DEATH(Attention(view, q.data(), 1, params, out.data(), nullptr), "AttentionAnyHeads");
}

}  // namespace
}  // namespace kvstack::attention_test
