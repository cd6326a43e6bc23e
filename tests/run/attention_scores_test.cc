// Tests for the attention scores that Attention() adds for selection policies
// (AttentionScores in src/run/attention.h): decode and prefill, both aggregations, first_query
// > 0, GQA groups 1, 2 and 4, every codec and layout of the attention suite, every SIMD target,
// "+=" into a pre-filled buffer, against AttentionReference's scores; and the attention output
// itself is the same bits with and without scores.

#include <cmath>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "run/attention.h"

namespace kvstack::attention_test {
namespace {

// Scores are sums over the scored queries of probabilities in [0, 1]. The kernel's logits
// differ from the double reference's by float rounding (about 1e-6 of a logit of magnitude
// up to ~10 here), which moves a probability by as much relative to itself; each scored query
// adds one such error, so 3e-5 (of max(1, |score|)) covers the 7 queries of a prefill with a
// margin.
constexpr float kScoreTolerance = 3e-5f;

// A scores buffer pre-filled with distinct values, so that "+=" is checked too.
std::vector<float> PrefilledScores(const Case& c, int stride) {
  std::vector<float> out(static_cast<size_t>(c.num_kv_heads) * stride);
  for (size_t i = 0; i < out.size(); ++i) out[i] = 0.25f * static_cast<float>(i % 7);
  return out;
}

// Runs Attention with scores on `layout` and checks output and scores against
// AttentionReference, and the output against the same call without scores (same bits).
void RunScoresAndCompare(const Case& c, const Layout& layout, ThreadPool* pool,
                         ScoreAggregation aggregation, int first_query) {
  const TestInputs in = MakeInputs(c, layout);
  const int stride = c.num_tokens + 5;  // not the token count: the stride is honoured
  std::vector<float> expected_scores = PrefilledScores(c, stride);
  std::vector<float> actual_scores = expected_scores;
  AttentionScores expected_spec{expected_scores.data(), stride, first_query, aggregation};
  AttentionScores actual_spec{actual_scores.data(), stride, first_query, aggregation};

  std::vector<float> expected(in.q.size()), actual(in.q.size()), plain(in.q.size());
  AttentionReference(in.cache.view, in.q.data(), c.num_queries, in.params, expected.data(),
                     &expected_spec);
  Attention(in.cache.view, in.q.data(), c.num_queries, in.params, actual.data(), pool,
            &actual_spec);
  Attention(in.cache.view, in.q.data(), c.num_queries, in.params, plain.data(), pool);

  SCOPED_TRACE(Describe(c, layout, pool == nullptr ? 1 : pool->num_threads()) +
               " aggregation=" + (aggregation == ScoreAggregation::kMax ? "max" : "mean") +
               " first_query=" + std::to_string(first_query));
  ExpectClose(actual, expected, ToleranceFor(c), "output");
  ExpectClose(actual_scores, expected_scores, std::max(kScoreTolerance, ToleranceFor(c)), "score");
  EXPECT_EQ(actual, plain) << "scores changed the attention output";
}

TEST(AttentionScoresTest, ReferenceScoresByHand) {
  // One kv head with a group of two query heads, head_dim 2, F32, scale 1: keys (0, 0) and
  // (ln 3, 0). Head 0's query (1, 0) weighs the keys 1/4 and 3/4, head 1's query (0, 1)
  // 1/2 and 1/2.
  const std::vector<float> k = {0.0f, 0.0f, std::log(3.0f), 0.0f};
  const std::vector<float> v = {1.0f, 0.0f, 0.0f, 1.0f};
  Case c;
  c.num_tokens = 2;
  c.num_kv_heads = 1;
  c.group = 2;
  c.head_dim = 2;
  c.k_codec = c.v_codec = "f32";
  const TestCache cache = BuildCache(k, v, c, kPaged16);
  const AttentionParams params{2, 1.0f};
  const float q[4] = {1.0f, 0.0f, 0.0f, 1.0f};
  float out[4];
  for (const bool kernel : {false, true}) {
    SCOPED_TRACE(kernel ? "kernel" : "reference");
    auto run = [&](const float* queries, int num_queries, AttentionScores* scores) {
      if (kernel) {
        Attention(cache.view, queries, num_queries, params, out, nullptr, scores);
      } else {
        AttentionReference(cache.view, queries, num_queries, params, out, scores);
      }
    };
    float max_scores[2] = {1.0f, 2.0f};  // added to
    AttentionScores max_spec{max_scores, 2, 0, ScoreAggregation::kMax};
    run(q, 1, &max_spec);
    EXPECT_NEAR(max_scores[0], 1.5f, 1e-6f);
    EXPECT_NEAR(max_scores[1], 2.75f, 1e-6f);
    float mean_scores[2] = {0.0f, 0.0f};
    AttentionScores mean_spec{mean_scores, 2, 0, ScoreAggregation::kMean};
    run(q, 1, &mean_spec);
    EXPECT_NEAR(mean_scores[0], 0.375f, 1e-6f);
    EXPECT_NEAR(mean_scores[1], 0.625f, 1e-6f);
    // A prefill of both tokens: query 0 sees only key 0 (weight 1 in both heads); query 1 as
    // above. first_query 1 leaves query 0 out.
    const float q2[8] = {1.0f, 0.0f, 0.0f, 1.0f, 1.0f, 0.0f, 0.0f, 1.0f};
    float all[2] = {0.0f, 0.0f};
    AttentionScores all_spec{all, 2, 0, ScoreAggregation::kMean};
    float out2[8];
    if (kernel) {
      Attention(cache.view, q2, 2, params, out2, nullptr, &all_spec);
    } else {
      AttentionReference(cache.view, q2, 2, params, out2, &all_spec);
    }
    EXPECT_NEAR(all[0], 1.375f, 1e-6f);
    EXPECT_NEAR(all[1], 0.625f, 1e-6f);
    float last[2] = {0.0f, 0.0f};
    AttentionScores last_spec{last, 2, 1, ScoreAggregation::kMax};
    if (kernel) {
      Attention(cache.view, q2, 2, params, out2, nullptr, &last_spec);
    } else {
      AttentionReference(cache.view, q2, 2, params, out2, &last_spec);
    }
    EXPECT_NEAR(last[0], 0.5f, 1e-6f);
    EXPECT_NEAR(last[1], 0.75f, 1e-6f);
  }
}

TEST(AttentionScoresTest, GroupsHeadDimsAndLengths) {
  // Groups 1 (MHA), 2 and 4; head_dim 5 (one lane), 12 (4 lanes), 64 and 128; lengths from one
  // token to several split-K chunks; decode and prefill.
  ThreadPool pool(2);
  for (int head_dim : {5, 12, 64, 128}) {
    for (int group : {1, 2, 4}) {
      for (int num_tokens : {1, 5, 300, 2000}) {
        for (int num_queries : {1, 7, 40}) {
          if (num_queries > num_tokens) continue;
          Case c;
          c.head_dim = head_dim;
          c.group = group;
          c.num_tokens = num_tokens;
          c.num_queries = num_queries;
          c.k_codec = head_dim % 2 == 0 ? "f16" : "bf16";
          ThreadPool* p = num_tokens >= 300 ? &pool : nullptr;
          for (ScoreAggregation aggregation : {ScoreAggregation::kMax, ScoreAggregation::kMean}) {
            RunScoresAndCompare(c, kPaged16, p, aggregation, 0);
            if (num_queries > 1) {
              RunScoresAndCompare(c, kPaged16, p, aggregation, num_queries - 1);
              RunScoresAndCompare(c, kPaged16, p, aggregation, num_queries / 2);
            }
          }
        }
      }
    }
  }
}

// Runs `c` over the codec matrix: each case with kMax from query 0 and with kMean from query
// num_queries - 3 (prefill), on one thread and two in turn.
void RunScoresMatrix(const Case& c, ThreadPool* pool) {
  int case_idx = 0;
  ForEachMatrixCase(c, [&](const Case& m, const Layout& layout) {
    ThreadPool* p = case_idx++ % 2 == 0 ? nullptr : pool;
    RunScoresAndCompare(m, layout, p, ScoreAggregation::kMax, 0);
    RunScoresAndCompare(m, layout, p, ScoreAggregation::kMean,
                        m.num_queries > 1 ? m.num_queries - 3 : 0);
  });
}

TEST(AttentionScoresTest, EveryCodecAsKey) {
  ThreadPool pool(2);
  for (const CodecCase& codec : kEveryCodec) {
    RunScoresMatrix(CodecOnSide(codec, CodecSide::kKeys, 4), &pool);
  }
}

TEST(AttentionScoresTest, EveryCodecAsValue) {
  // Scores depend on the keys only, but the value readers share the tiles and tasks.
  ThreadPool pool(2);
  for (const CodecCase& codec : kEveryCodec) {
    RunScoresMatrix(CodecOnSide(codec, CodecSide::kValues, 1), &pool);
  }
}

TEST(AttentionScoresTest, FastCodecPairsAcrossManyChunks) {
  ThreadPool pool(2);
  const struct {
    const char* k;
    const char* v;
  } pairs[] = {{"int8", "int8"}, {"int4", "int4"}, {"kivi2", "kivi2"}, {"bf16", "int4"}};
  for (const auto& pair : pairs) {
    Case c;
    c.num_tokens = 5000;
    c.num_kv_heads = 2;
    c.group = 4;
    c.k_codec = pair.k;
    c.v_codec = pair.v;
    c.num_sinks = 4;
    for (int num_queries : {1, 33}) {
      c.num_queries = num_queries;
      RunScoresAndCompare(c, {LayoutKind::kPaged, 64}, &pool, ScoreAggregation::kMax,
                          num_queries - 1);
      RunScoresAndCompare(c, {LayoutKind::kPaged, 64}, nullptr, ScoreAggregation::kMean, 0);
    }
  }
}

// With as many kv heads as the threads' tasks, each kv head is one split-K part whose task adds
// its own scores, scoring its tiles in place in the probability rows: several tiles, the last
// one partial (tokens not a multiple of the vector), one thread and two, every codec as key.
TEST(AttentionScoresTest, OnePartPerKvHeadAcrossTiles) {
  ThreadPool pool(2);
  for (const CodecCase& codec : kEveryCodec) {
    Case c;
    c.num_tokens = 1000;
    c.num_kv_heads = 8;
    c.group = 2;
    c.head_dim = codec.head_dim;
    c.k_codec = codec.name;
    c.v_codec = codec.head_dim % 32 == 0 ? "int4" : "f16";
    SCOPED_TRACE(codec.name);
    RunScoresAndCompare(c, {LayoutKind::kPaged, 64}, nullptr, ScoreAggregation::kMax, 0);
    RunScoresAndCompare(c, {LayoutKind::kContiguous, 0}, &pool, ScoreAggregation::kMean, 0);
  }
}

TEST(AttentionScoresTest, EverySimdTarget) {
  ThreadPool pool(2);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (const char* k : {"bf16", "int8", "int4", "kivi2"}) {
      for (int num_queries : {1, 19}) {
        Case c;
        c.group = 4;
        c.k_codec = k;
        c.v_codec = "int4";
        c.num_sinks = 3;
        c.num_queries = num_queries;
        RunScoresAndCompare(c, {LayoutKind::kPaged, 64}, &pool, ScoreAggregation::kMean, 0);
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);  // back to the machine's own
}

}  // namespace
}  // namespace kvstack::attention_test
