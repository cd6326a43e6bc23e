// Tests for the attention kernels (src/run/attention.h): every kernel path (decode and prefill,
// every codec as key and as value, vector widths from scalar to full, one thread and two) is
// compared with AttentionReference on the hand-built views of attention_test_util.h.

#include "run/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "kvstack/codec.h"
#include "represent/fp8.h"
#include "represent/hadamard.h"
#include "run/attention_kernels.h"

namespace kvstack::attention_test {
namespace {

// Runs Attention on `layout` and checks it against AttentionReference; returns the output.
std::vector<float> RunAndCompare(const Case& c, const Layout& layout, ThreadPool* pool,
                                 float tolerance = kTolerance) {
  const TestInputs in = MakeInputs(c, layout);
  std::vector<float> expected(in.q.size()), actual(in.q.size(), -12345.0f);
  AttentionReference(in.cache.view, in.q.data(), c.num_queries, in.params, expected.data());
  Attention(in.cache.view, in.q.data(), c.num_queries, in.params, actual.data(), pool);
  SCOPED_TRACE(Describe(c, layout, pool == nullptr ? 1 : pool->num_threads()));
  ExpectClose(actual, expected, std::max(tolerance, ToleranceFor(c)), "output");
  return actual;
}

TEST(AttentionTest, ReferenceMatchesHandComputedTwoTokens) {
  // One kv head, head_dim 2, F32: q = (1, 0), keys (0, 0) and (ln 3, 0), values (1, 0) and
  // (0, 1), scale 1. Weights 1/4 and 3/4.
  const std::vector<float> k = {0.0f, 0.0f, std::log(3.0f), 0.0f};
  const std::vector<float> v = {1.0f, 0.0f, 0.0f, 1.0f};
  Case c;
  c.num_tokens = 2;
  c.num_kv_heads = 1;
  c.head_dim = 2;
  c.k_codec = c.v_codec = "f32";
  const TestCache cache = BuildCache(k, v, c, kPaged16);
  const float q[2] = {1.0f, 0.0f};
  float out[2];
  AttentionReference(cache.view, q, 1, {1, 1.0f}, out);
  EXPECT_NEAR(out[0], 0.25f, 1e-6f);
  EXPECT_NEAR(out[1], 0.75f, 1e-6f);
  // As a prefill of both tokens the first query only sees key 0.
  const float q2[4] = {1.0f, 0.0f, 1.0f, 0.0f};
  float out2[4];
  AttentionReference(cache.view, q2, 2, {1, 1.0f}, out2);
  EXPECT_FLOAT_EQ(out2[0], 1.0f);
  EXPECT_FLOAT_EQ(out2[1], 0.0f);
  EXPECT_NEAR(out2[2], 0.25f, 1e-6f);
  Attention(cache.view, q2, 2, {1, 1.0f}, out2, nullptr);
  EXPECT_NEAR(out2[0], 1.0f, 1e-6f);
  EXPECT_NEAR(out2[3], 0.75f, 1e-6f);
}

TEST(AttentionTest, AllCodecPairsDecodeAndPrefill) {
  ThreadPool pool(2);
  for (const char* k_codec : {"f32", "f16", "bf16"}) {
    for (const char* v_codec : {"f32", "f16", "bf16"}) {
      for (int num_queries : {1, 7}) {
        Case c;
        c.group = 2;
        c.k_codec = k_codec;
        c.v_codec = v_codec;
        c.num_queries = num_queries;
        RunAndCompare(c, kPaged16, nullptr);
        RunAndCompare(c, kPaged16, &pool);
      }
    }
  }
}

TEST(AttentionTest, ShapesGroupsAndHeadDims) {
  ThreadPool pool(2);
  // head_dim 5 takes the one-lane path, 8 and 12 the 4-lane path on wide machines.
  for (int head_dim : {5, 8, 12, 64, 128}) {
    for (int group : {1, 2, 4}) {
      for (int num_tokens : {1, 5, 300, 2000}) {
        for (int num_queries : {1, 7, 64}) {
          if (num_queries > num_tokens) continue;
          if (num_tokens == 2000 && num_queries == 64 && head_dim != 64) continue;  // time
          Case c;
          c.head_dim = head_dim;
          c.group = group;
          c.num_tokens = num_tokens;
          c.num_queries = num_queries;
          c.k_codec = head_dim % 2 == 0 ? "f16" : "bf16";
          c.v_codec = group == 2 ? "f32" : "f16";
          RunAndCompare(c, kPaged16, num_tokens >= 300 ? &pool : nullptr);
        }
      }
    }
  }
}

TEST(AttentionTest, EveryLayoutGivesTheSameOutput) {
  const Layout layouts[] = {{LayoutKind::kContiguous, 0},
                            {LayoutKind::kPaged, 1},
                            {LayoutKind::kPaged, 3},
                            {LayoutKind::kPaged, 16},
                            {LayoutKind::kRing, 0}};
  ThreadPool pool(2);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    for (int num_queries : {1, 7, 64}) {
      Case c;
      c.num_tokens = 700;
      c.group = 4;
      c.num_queries = num_queries;
      c.k_codec = "bf16";
      const std::vector<float> first = RunAndCompare(c, layouts[0], p);
      for (const Layout& layout : layouts) {
        // Tiles follow logical positions, so the arithmetic is the same in every layout.
        EXPECT_EQ(RunAndCompare(c, layout, p), first) << layout.Name();
      }
    }
  }
}

TEST(AttentionTest, DecodeSplitAcrossManyChunksMerges) {
  // One kv head and many keys: the decode splits the keys into several chunks even on one
  // thread, and more on two; the merge must weigh them by their own maxima.
  ThreadPool pool(2);
  Case c;
  c.num_tokens = 5000;
  c.num_kv_heads = 1;
  c.group = 4;
  c.k_codec = "f32";
  c.v_codec = "f32";
  RunAndCompare(c, kPaged16, nullptr);
  RunAndCompare(c, kPaged16, &pool);
}

TEST(AttentionTest, LargeScoresStayFinite) {
  // Scores in the hundreds: exp would overflow without subtracting the running max. Float
  // rounding of such scores (~1e-4 absolute) shifts the weights by as much, hence the looser
  // tolerance.
  ThreadPool pool(2);
  for (int num_queries : {1, 40}) {
    Case c;
    c.num_tokens = 600;
    c.num_queries = num_queries;
    c.query_magnitude = 200.0f;
    c.k_codec = "f32";
    RunAndCompare(c, kPaged16, &pool, 1e-3f);
  }
}

TEST(AttentionTest, EverySimdTargetMatchesReference) {
  // The other tests run the best target of this machine; this one forces each target the
  // machine supports in turn (e.g. AVX-512, AVX2, SSE4 and the portable EMU128), whose vector
  // widths take different head_dim paths.
  ThreadPool pool(2);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (int head_dim : {8, 12, 64}) {
      for (int num_queries : {1, 19}) {
        Case c;
        c.head_dim = head_dim;
        c.group = 2;
        c.num_queries = num_queries;
        c.v_codec = "bf16";
        RunAndCompare(c, kPaged16, &pool);
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);  // back to the machine's own
}

// Runs `c` over the codec matrix, on one thread and two.
void RunMatrix(const Case& c, ThreadPool* pool) {
  ForEachMatrixCase(c, [&](const Case& m, const Layout& layout) {
    RunAndCompare(m, layout, nullptr);
    RunAndCompare(m, layout, pool);
  });
}

TEST(AttentionTest, EveryCodecAsKeyWithF16Values) {
  ThreadPool pool(2);
  for (const CodecCase& codec : kEveryCodec) {
    RunMatrix(CodecOnSide(codec, CodecSide::kKeys, 2), &pool);
  }
}

TEST(AttentionTest, EveryCodecAsValueWithF16Keys) {
  ThreadPool pool(2);
  for (const CodecCase& codec : kEveryCodec) {
    RunMatrix(CodecOnSide(codec, CodecSide::kValues, 2), &pool);
  }
}

TEST(AttentionTest, FastCodecPairsTogether) {
  // The pairs the engine uses (and mixed ones): both sides on their fast readers at once,
  // GQA group 4, long enough for several split-K chunks.
  ThreadPool pool(2);
  const struct {
    const char* k;
    const char* v;
    int head_dim;
  } pairs[] = {
      {"int8", "int8", 64},         {"int4", "int4", 64},          {"int2", "int2", 64},
      {"kivi4", "kivi4", 64},       {"kivi2", "kivi2", 64},        {"int4-g64", "int4-g64", 8},
      {"int2-g64", "int2-g64", 8},  {"kivi4", "int8", 64},         {"int8", "int4-g8", 64},
      {"kivi2-g64", "bf16", 128},   {"int4-g16", "kivi2-g16", 32}, {"int4-t16", "int4-t16", 128},
      {"int2-t16", "int4-t16", 64}, {"int4-t16", "int8", 64},      {"f16", "int4-g16-t16", 64}};
  for (const auto& pair : pairs) {
    Case c;
    c.num_tokens = 2000;
    c.group = 4;
    c.head_dim = pair.head_dim;
    c.k_codec = pair.k;
    c.v_codec = pair.v;
    c.num_sinks = 4;
    for (int num_queries : {1, 5}) {
      c.num_queries = num_queries;
      RunAndCompare(c, {LayoutKind::kPaged, 64}, &pool);
    }
  }
}

TEST(AttentionTest, QuantisedCodecsAtEveryHeadDim) {
  // head_dim 12 and 20 take the 4-lane readers on wide machines, 5 the generic path.
  for (int head_dim : {5, 8, 12, 16, 20, 128}) {
    for (const char* name : {"int8", "int4", "int2", "kivi4", "kivi2", "fp8_e4m3", "q4_absmax"}) {
      std::string codec = name;
      // Groups must divide head_dim: the whole row for the integer and KIVI value groups.
      if (codec == "int4" || codec == "int2" || codec == "kivi4" || codec == "kivi2") {
        codec += "-g" + std::to_string(head_dim);
      }
      if (codec == "q4_absmax" && head_dim > 32 && head_dim % 32 != 0) continue;
      if (!CreateCodec(codec, head_dim, CodecRole::kKey).ok()) continue;  // e.g. int2 on 5
      Case c;
      c.num_tokens = 150;
      c.group = 2;
      c.head_dim = head_dim;
      c.k_codec = codec;
      c.v_codec = codec;
      for (int num_queries : {1, 3}) {
        c.num_queries = num_queries;
        RunAndCompare(c, {LayoutKind::kPaged, 16 * head_dim}, nullptr);
      }
    }
  }
}

// A case for the fast readers' shapes: several tiles (with a 64-token block), 3 sinks and 2
// pending tokens beside the arena.
Case ReadersCase(int num_tokens, int num_kv_heads, int group, int head_dim, const std::string& k,
                 const std::string& v) {
  Case c;
  c.num_tokens = num_tokens;
  c.num_kv_heads = num_kv_heads;
  c.group = group;
  c.head_dim = head_dim;
  c.k_codec = k;
  c.v_codec = v;
  c.num_sinks = 3;
  c.extra_pending = 2;
  return c;
}

TEST(AttentionTest, IntegerCodecsAtEveryGroupAndWidth) {
  // The integer readers' shapes (the VNNI ones on CPUs that have it, vpmaddubsw's on AVX2): query
  // heads per kv head in steps of 4, 2 and 1 (3, 5, 8), head_dim with 2 or 4 blocks of 16 per
  // pass and rows of one or two 64-byte halves (32 .. 256), groups of 16, 32, 64 and the whole
  // row, groups spanning two tokens at head_dim 128, KIVI keys (1 to 64 blocks of 32 query
  // elements per unit), -t16 tiles (in groups of 16 and 32 and the whole row at head_dim 128),
  // several tiles, sinks and pending tokens.
  // Four times: with the tile multiplies and the integer dot-product readers (where the CPU has
  // them), with the integer readers alone, with the float readers, and on the AVX2 target with
  // its integer readers (attention_madd-inl.h), where the CPU has AVX2 (on CPUs with AVX-512 the
  // best target does not run them).
  ThreadPool pool(2);
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  const bool has_avx2 = std::find(targets.begin(), targets.end(), HWY_AVX2) != targets.end();
  for (const int readers : {0, 1, 2, 3}) {
    if (readers == 3 && !has_avx2) continue;
    hwy::SetSupportedTargetsForTest(readers == 3 ? HWY_AVX2 : 0);
    DisableTileMultipliesForTest(readers >= 1);
    DisableDotProductReadersForTest(readers == 2);
    SCOPED_TRACE(readers == 0   ? "tile multiplies and integer readers where the CPU has them"
                 : readers == 1 ? "integer readers where the CPU has them"
                 : readers == 2 ? "float readers"
                                : "AVX2 and its integer readers");
    for (int head_dim : {32, 96, 128, 256}) {
      for (const char* name :
           {"int8", "int4", "int2", "int4-g16", "int4-g64", "int4-g256", "q4_absmax", "kivi2",
            "kivi4", "int4-t16", "int2-t16", "int4-g16-t16", "int4-g128-t16"}) {
        std::string codec = name;
        if (codec == "int4-g16" && head_dim == 96) codec = "int4-g32";
        if ((codec == "int4-g256" || codec == "int4-g128-t16") && head_dim != 128) continue;
        if (!CreateCodec(codec, head_dim, CodecRole::kKey).ok()) continue;
        for (int group : {1, 3, 4, 5, 8}) {
          // The VNNI readers' 4- and 2-bit values in u8 weights, then in int16 (the others take
          // int16 and hold the strict tolerance).
          for (const bool u8 : {true, false}) {
            if (u8 && readers >= 2) continue;
            SetValueWeightsForTest(u8 ? ValueWeightsForTest::kU8 : ValueWeightsForTest::kInt16);
            Case c = ReadersCase(700, 1, group, head_dim, codec, codec);
            c.u8_value_weights = u8;
            RunAndCompare(c, {LayoutKind::kPaged, 64}, group % 2 == 0 ? &pool : nullptr);
          }
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);  // back to the machine's own
  DisableTileMultipliesForTest(false);
  DisableDotProductReadersForTest(false);
  SetValueWeightsForTest(ValueWeightsForTest::kChosen);
}

// RMS distance between two outputs.
double Rms(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += (a[i] - b[i]) * double{a[i] - b[i]};
  return std::sqrt(sum / static_cast<double>(a.size()));
}

// Keys and values for one kv head (head_dim 128) where, in every tile of 256 keys, key 0 takes
// most of the weight and the other 255 take `ratio` of it each; their values sit at the same end
// of their groups' range in every element (the dominant key's at the other), varied from key to
// key unless `same_values`.
struct DominantKeyCase {
  static constexpr int kTokens = 1024, kHeadDim = 128;
  std::vector<float> k, v, q;
  AttentionParams params{1, 1.0f / std::sqrt(static_cast<float>(kHeadDim))};

  DominantKeyCase(float ratio, bool same_values)
      : k(kTokens * kHeadDim, 0.0f), v(kTokens * kHeadDim), q(kHeadDim, 0.0f) {
    q[0] = 1.0f;
    for (int t = 0; t < kTokens; ++t) {
      const bool dominant = t % 256 == 0;
      k[t * kHeadDim] = dominant ? 0.0f : std::log(ratio) / params.scale;
      for (int e = 0; e < kHeadDim; ++e) {
        const float high = e % 32 == 0 ? -1.0f : 1.0f;  // one low element per group of 32
        const int step = same_values ? e % 13 : (t * 7 + e) % 13;
        v[t * kHeadDim + e] = dominant ? -high : high * (0.5f + 0.5f * step / 13.0f);
      }
    }
  }

  // The RMS distances to attention over the unquantised values of the reference and of the
  // kernel, with `codec` values, and the kernel's output.
  struct Distances {
    double reference, kernel;
    std::vector<float> out;
  };
  Distances Measure(const char* codec) const {
    Case c;
    c.num_tokens = kTokens;
    c.num_kv_heads = 1;
    c.head_dim = kHeadDim;
    c.k_codec = c.v_codec = "f32";
    const Layout layout{LayoutKind::kPaged, 64};
    const TestCache exact = BuildCache(k, v, c, layout);
    std::vector<float> want(kHeadDim), reference(kHeadDim), kernel(kHeadDim);
    AttentionReference(exact.view, q.data(), 1, params, want.data());
    c.v_codec = codec;
    const TestCache cache = BuildCache(k, v, c, layout);
    AttentionReference(cache.view, q.data(), 1, params, reference.data());
    Attention(cache.view, q.data(), 1, params, kernel.data(), nullptr);
    return {Rms(reference, want), Rms(kernel, want), kernel};
  }
};

// Dominant-key tiles with the small keys at 1e-3, 3e-3 and 1e-2 of the dominant one's weight, for
// int4, int4-t16, int2 and kivi2 values: the kernel within 1.5x of the codec's own distance to
// attention over unquantised values.
void ExpectWithinTheCodecsError(bool same_values) {
  for (const float ratio : {1e-3f, 3e-3f, 1e-2f}) {
    const DominantKeyCase data(ratio, same_values);
    for (const char* codec : {"int4", "int4-t16", "int2", "kivi2"}) {
      const auto d = data.Measure(codec);
      SCOPED_TRACE(std::string(codec) + " ratio " + std::to_string(ratio));
      EXPECT_LE(d.kernel, 1.5 * d.reference);
    }
  }
}

TEST(AttentionTest, ManySmallWeightsKeepTheirMass) {
  // The case that rules out weighing values in u8 everywhere: one dominant key and 255 at 1e-3
  // to 1e-2 of it, a quarter to 2.5 steps of weights rounded to u8 against the tile's largest.
  // Rounded each alone, those weights moved the output by 0.13-0.15 RMS against the codec's own
  // 0.0007-0.0023 (twenty-fourth round in docs/representation-speed.md); with their errors
  // carried (QuantiseQuadSlice) the tile keeps its mass but each key's weight still moves by up
  // to 1.5 steps: 2.4-4.4x the codec's own at 1e-3 and 3e-3. Such tiles keep int16 weights
  // (TakesQuadWeights), which hold the kernel within 1.5x of the codec's own distance to
  // attention over unquantised values.
  ExpectWithinTheCodecsError(/*same_values=*/false);
}

TEST(AttentionTest, U8ValueWeightsKeepATilesMass) {
  // u8 weights forced where they are not chosen, on the tiles above with every small key's values
  // the same: what each weight's rounding moves then cancels only where the tile keeps its
  // mass. With the errors carried along the keys the kernel stays within 1.5x of the codec's own
  // distance to attention over unquantised values; rounded each alone it was up to 20x.
  SetValueWeightsForTest(ValueWeightsForTest::kU8);
  ExpectWithinTheCodecsError(/*same_values=*/true);
  SetValueWeightsForTest(ValueWeightsForTest::kChosen);
}

TEST(AttentionTest, U8ValueWeightsKeepEachGroupsMass) {
  // u8 weights forced on one tile of 256 keys whose value rows are all the same: attention over
  // them is that row whatever the softmax, and the kernel's distance to it is what each head and
  // group's u8 weights miss of their exact sum. With x = 254 p / max p (every scale the same),
  // out - row = (row - middle) (sum q - sum x) max p / (254 sum p), middle the group's middle
  // value. The carries keep |sum q - sum x| within half a step (QuantiseQuadSlice; plus about
  // 1/128 of a step per key's rounded product where QuantiseQuadRows16 runs): asserted at 0.6
  // from what the kernel returns, for every head, group and element at least 1.5 codes from the
  // middle. A spread softmax (every x above a step), so that no last-row weight is clipped.
  if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512vbmi")) {
    GTEST_SKIP() << "no AVX-512 VNNI and VBMI: the value weights are not rounded";
  }
  constexpr int kTokens = 256, kHeadDim = 128, kHeads = 4;
  const AttentionParams params{kHeads, 1.0f / std::sqrt(static_cast<float>(kHeadDim))};
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> k(kTokens * kHeadDim), v(kTokens * kHeadDim), q(kHeads * kHeadDim);
  for (float& x : k) x = normal(rng);
  for (float& x : q) x = 0.5f * normal(rng);
  for (int t = 0; t < kTokens; ++t) {
    for (int e = 0; e < kHeadDim; ++e) {  // a ramp within every 16 elements, its own per 16
      v[t * kHeadDim + e] =
          static_cast<float>(e / 16) + (1.0f + 0.1f * (e / 16)) * (e % 16) / 15.0f;
    }
  }
  // Per head, sum p / max p over the keys, in double (f32 keys: the kernel's scores agree).
  std::vector<double> p_sum(kHeads);
  for (int j = 0; j < kHeads; ++j) {
    std::vector<double> score(kTokens);
    for (int t = 0; t < kTokens; ++t) {
      double dot = 0.0;
      for (int e = 0; e < kHeadDim; ++e) dot += double{q[j * kHeadDim + e]} * k[t * kHeadDim + e];
      score[t] = dot * params.scale;
    }
    const double top = *std::max_element(score.begin(), score.end());  // (max p = 1)
    for (const double x : score) p_sum[j] += std::exp(x - top);
  }
  Case c;
  c.num_tokens = kTokens;
  c.num_kv_heads = 1;
  c.head_dim = kHeadDim;
  c.k_codec = "f32";
  const Layout layout{LayoutKind::kPaged, 64};
  SetValueWeightsForTest(ValueWeightsForTest::kU8);
  for (const char* codec : {"int4", "int4-g16", "int4-t16", "int2"}) {
    c.v_codec = codec;
    const TestCache cache = BuildCache(k, v, c, layout);
    std::vector<float> row(q.size()), out(q.size());
    AttentionReference(cache.view, q.data(), 1, params, row.data());
    Attention(cache.view, q.data(), 1, params, out.data(), nullptr);
    const int group_elems = std::string(codec) == "int4-g16" ? 16 : 32;
    const int levels = std::string(codec) == "int2" ? 3 : 15;
    double worst = 0.0;
    for (int j = 0; j < kHeads; ++j) {
      for (int g0 = 0; g0 < kHeadDim; g0 += group_elems) {
        const float* r = row.data() + j * kHeadDim + g0;
        const auto [lo, hi] = std::minmax_element(r, r + group_elems);
        const double middle = (double{*lo} + *hi) / 2.0, step = (double{*hi} - *lo) / levels;
        for (int e = g0; e < g0 + group_elems; ++e) {
          const double from_middle = row[j * kHeadDim + e] - middle;
          if (std::abs(from_middle) < 1.4 * step) continue;
          const double missed = (double{out[j * kHeadDim + e]} - row[j * kHeadDim + e]) /
                                (from_middle / (254.0 * p_sum[j]));
          worst = std::max(worst, std::abs(missed));
        }
      }
    }
    SCOPED_TRACE(codec);
    EXPECT_LE(worst, 0.6);
    // u8 weights did run: int16 ones give another output.
    SetValueWeightsForTest(ValueWeightsForTest::kInt16);
    std::vector<float> int16_out(q.size());
    Attention(cache.view, q.data(), 1, params, int16_out.data(), nullptr);
    SetValueWeightsForTest(ValueWeightsForTest::kU8);
    EXPECT_NE(out, int16_out);
  }
  SetValueWeightsForTest(ValueWeightsForTest::kChosen);
}

TEST(AttentionTest, ValueWeightsFollowHowTheWeightsSpread) {
  // Where the VNNI readers run: a tile with one dominant key takes int16 weights (the output is
  // the one int16 weights give), one where the softmax spreads takes u8 (the output is u8's,
  // and differs from int16's: the two ways are not the same code).
  if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512vbmi")) {
    GTEST_SKIP() << "no AVX-512 VNNI and VBMI: the value weights are not rounded";
  }
  const auto run = [](const DominantKeyCase& data, ValueWeightsForTest how) {
    SetValueWeightsForTest(how);
    std::vector<float> out = data.Measure("int4").out;
    SetValueWeightsForTest(ValueWeightsForTest::kChosen);
    return out;
  };
  const DominantKeyCase peaked(1e-3f, false), spread(0.3f, false);
  EXPECT_EQ(run(peaked, ValueWeightsForTest::kChosen), run(peaked, ValueWeightsForTest::kInt16));
  const std::vector<float> chosen = run(spread, ValueWeightsForTest::kChosen);
  EXPECT_EQ(chosen, run(spread, ValueWeightsForTest::kU8));
  EXPECT_NE(chosen, run(spread, ValueWeightsForTest::kInt16));
}

TEST(AttentionTest, ValueWeightsAddLittleToTheCodecsError) {
  // What 4- and 2-bit values cost in accuracy as the VNNI readers weigh them (u8 where a tile's
  // weights spread, int16 elsewhere; the other readers keep int16 weights and pass trivially):
  // the RMS distance of the kernel's output to attention over the unquantised values stays
  // within 5 % of the reference's own (the same stored codes, summed in double precision).
  // Softmaxes from flat to sharp (query magnitude 1 to 6), 150 to 4096 keys. At most 1.3 % here;
  // u8 forced on every tile, up to 5.4 % where the softmax is sharp.
  const Layout layout{LayoutKind::kPaged, 64};
  for (const char* codec : {"int4", "int4-g128", "int4-t16", "int2", "kivi2"}) {
    for (const int tokens : {150, 1000, 4096}) {
      for (const float magnitude : {1.0f, 3.0f, 6.0f}) {
        Case c;
        c.num_tokens = tokens;
        c.group = 4;
        c.head_dim = 128;
        c.k_codec = "f32";
        c.v_codec = codec;
        c.query_magnitude = magnitude;
        Case unquantised = c;
        unquantised.v_codec = "f32";
        const TestInputs in = MakeInputs(c, layout);
        const TestInputs exact = MakeInputs(unquantised, layout);
        std::vector<float> reference(in.q.size()), kernel(in.q.size()), want(in.q.size());
        AttentionReference(in.cache.view, in.q.data(), 1, in.params, reference.data());
        Attention(in.cache.view, in.q.data(), 1, in.params, kernel.data(), nullptr);
        AttentionReference(exact.cache.view, exact.q.data(), 1, exact.params, want.data());
        SCOPED_TRACE(Describe(c, layout, 1));
        EXPECT_LE(Rms(kernel, want), 1.05 * Rms(reference, want));
      }
    }
  }
}

TEST(AttentionTest, Bf16CodecsAtEveryGroupAndWidth) {
  // The BF16 dot-product readers' shapes (on CPUs with AVX512_BF16): query heads in steps of 4,
  // 2 and 1, head_dim in slices of 1 to 8 chunks of 32 (48 takes the float readers: not whole
  // chunks), an odd number of keys in the last tile (value rows go in pairs), BF16 on one side
  // or both, FP8 (the same readers), sinks and pending tokens. Three times: the BF16 readers by
  // vdpbf16ps, the same widened to F32 FMAs, the float readers (FP8 rows, which take FP16 on
  // CPUs with AVX512-FP16, also through the BF16 readers both ways; FP8 beside BF16, so that
  // one side in FP16 meets the other in the BF16 readers). Where the CPU has them, the
  // first and the last must also differ where the query is rounded (the queries lie on a grid of
  // powers of two times 1/sqrt(head_dim), BF16 values at head_dim 64 and 256): equal outputs would
  // mean the dot-product readers never ran.
#if defined(__x86_64__)
  const bool cpu_has_bf16 = __builtin_cpu_supports("avx512bf16");
#else
  const bool cpu_has_bf16 = false;
#endif
  // The widened readers (F32 FMAs, nothing rounded) must match the reference as the float
  // readers do.
  ThreadPool pool(2);
  for (int head_dim : {32, 48, 64, 96, 128, 256}) {
    for (const auto& [k, v] : {std::pair{"bf16", "bf16"},
                               {"bf16", "f32"},
                               {"f16", "bf16"},
                               {"fp8_e4m3", "fp8_e5m2"},
                               {"fp8_e5m2", "fp8_e4m3"},
                               {"fp8_e5m2", "bf16"},
                               {"bf16", "fp8_e4m3"}}) {
      for (int group : {1, 3, 4, 5, 8}) {
        const Case c = ReadersCase(701, 2, group, head_dim, k, v);
        ThreadPool* threads = group % 2 == 0 ? &pool : nullptr;
        SetBf16MultiplyForTest(Bf16MultiplyForTest::kDot);
        const std::vector<float> dot = RunAndCompare(c, {LayoutKind::kPaged, 64}, threads);
        SetBf16MultiplyForTest(Bf16MultiplyForTest::kWiden);
        RunAndCompare(c, {LayoutKind::kPaged, 64}, threads);
        const auto fp8 = [](const char* codec) { return std::string(codec).starts_with("fp8"); };
        if (fp8(k) || fp8(v)) {  // (above in FP16 where the CPU has AVX512-FP16)
          DisableHalfReadersForTest(true);
          RunAndCompare(c, {LayoutKind::kPaged, 64}, threads);
          SetBf16MultiplyForTest(Bf16MultiplyForTest::kDot);
          RunAndCompare(c, {LayoutKind::kPaged, 64}, threads);
          DisableHalfReadersForTest(false);
        }
        SetBf16MultiplyForTest(Bf16MultiplyForTest::kMeasured);
        DisableDotProductReadersForTest(true);
        const std::vector<float> by_floats = RunAndCompare(c, {LayoutKind::kPaged, 64}, threads);
        DisableDotProductReadersForTest(false);
        if (cpu_has_bf16 && (head_dim == 32 || head_dim == 96 || head_dim == 128)) {
          EXPECT_NE(dot, by_floats) << k << "/" << v << " head_dim " << head_dim;
        }
      }
    }
  }
}

TEST(AttentionTest, RotatedKeysGiveTheUnrotatedAttention) {
  // Storing H k with keys_rotated set must give attention over k (H is orthonormal): this
  // checks the rotation against the unrotated computation, not against the reference.
  Case c;
  c.head_dim = 16;
  c.group = 2;
  c.k_codec = c.v_codec = "f32";
  const size_t kv_size = static_cast<size_t>(c.num_tokens) * c.num_kv_heads * c.head_dim;
  const std::vector<float> k = RandomVector(kv_size, 1.0f, 1);
  const std::vector<float> v = RandomVector(kv_size, 1.0f, 2);
  std::vector<float> rotated = k;
  for (size_t i = 0; i < kv_size; i += c.head_dim) HadamardRotate({&rotated[i], 16});
  const TestCache plain = BuildCache(k, v, c, kPaged16);
  c.keys_rotated = true;
  const TestCache stored_rotated = BuildCache(rotated, v, c, kPaged16);
  const int num_heads = c.num_kv_heads * c.group;
  const AttentionParams params{num_heads, 0.25f};
  for (int num_queries : {1, 6}) {
    const std::vector<float> q = RandomVector(num_queries * num_heads * 16, 3.0f, 3);
    std::vector<float> expected(q.size()), actual(q.size());
    Attention(plain.view, q.data(), num_queries, params, expected.data(), nullptr);
    Attention(stored_rotated.view, q.data(), num_queries, params, actual.data(), nullptr);
    for (size_t i = 0; i < q.size(); ++i) EXPECT_NEAR(actual[i], expected[i], 1e-5f) << i;
  }
}

TEST(AttentionTest, SegmentsOnlyAndTinyArenas) {
  // Edge splits of the three sources: all tokens in sinks (empty arena), an arena of one
  // token, a single KIVI unit whose first tokens are sinks and whose last are pending.
  ThreadPool pool(2);
  Case c;
  c.num_tokens = 6;
  c.group = 2;
  c.num_sinks = 6;
  for (int num_queries : {1, 6}) {
    c.num_queries = num_queries;
    RunAndCompare(c, kPaged16, &pool);
  }
  c.num_sinks = 5;
  RunAndCompare(c, kPaged16, &pool);
  c.k_codec = "kivi4-g8";
  c.v_codec = "int4";
  c.num_tokens = 14;
  c.num_sinks = 3;
  for (int num_queries : {1, 14}) {
    c.num_queries = num_queries;
    RunAndCompare(c, kPaged16, &pool);
  }
}

TEST(AttentionTest, QuantisedReadersOnEverySimdTarget) {
  // Every target, and the best one again without the integer dot-product readers (on CPUs with
  // AVX-512 VNNI they replace the float readers that the other targets and CPUs use).
  ThreadPool pool(2);
  std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  targets.push_back(0);  // the machine's own, without the integer readers
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    DisableDotProductReadersForTest(target == 0);
    SCOPED_TRACE(target == 0 ? std::string("best target, float readers") : hwy::TargetName(target));
    for (const char* k : {"int8", "int4", "int2", "kivi4", "kivi2", "int4-g64", "fp8_e4m3",
                          "fp8_e5m2", "q4_absmax"}) {
      Case c;
      c.head_dim = std::string(k) == "int4-g64" ? 8 : 64;
      c.group = 2;
      c.k_codec = k;
      c.v_codec = std::string(k).starts_with("kivi") ? "int4" : k;
      c.num_sinks = 3;
      RunAndCompare(c, {LayoutKind::kPaged, 64}, &pool);
    }
  }
  hwy::SetSupportedTargetsForTest(0);  // back to the machine's own
  DisableDotProductReadersForTest(false);
}

// Expects `actual` to be NaN exactly where `expected` is, infinite and equal where it is
// infinite, and within `tolerance` (relative, from 1 on) elsewhere, reporting the first 5
// differences. Returns how many NaNs `expected` holds.
int ExpectSameNaNsAndClose(const std::vector<float>& actual, const std::vector<float>& expected,
                           float tolerance) {
  int num_nans = 0, num_bad = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const float e = expected[i], a = actual[i];
    const bool ok = std::isnan(e)   ? std::isnan(a)
                    : std::isinf(e) ? a == e
                                    : std::abs(a - e) <= tolerance * std::max(1.0f, std::abs(e));
    num_nans += std::isnan(e) ? 1 : 0;
    if (!ok && ++num_bad <= 5) {
      ADD_FAILURE() << "element " << i << ": got " << a << ", reference " << e;
    }
  }
  return num_nans;
}

// Runs one decode step of `cache` on every SIMD target this build has and expects the scalar
// reference's output there (ExpectSameNaNsAndClose, within 1e-6). Returns how many NaN outputs
// the reference has.
int ExpectReferenceOnEveryTarget(const TestCache& cache, const std::vector<float>& q,
                                 const AttentionParams& params, const std::string& what) {
  std::vector<float> expected(q.size());
  AttentionReference(cache.view, q.data(), 1, params, expected.data());
  int num_nans = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(what + " on " + hwy::TargetName(target));
    std::vector<float> out(q.size(), -12345.0f);
    Attention(cache.view, q.data(), 1, params, out.data(), nullptr);
    num_nans = ExpectSameNaNsAndClose(out, expected, 1e-6f);
  }
  hwy::SetSupportedTargetsForTest(0);  // back to the machine's own
  return num_nans;
}

// One decode step over values v stored with c.v_codec (random keys) on every target: each
// stored value must come back as itself. Returns the NaN outputs per query head.
int ExpectStoredValuesOnEveryTarget(const Case& c, const std::vector<float>& v) {
  const std::vector<float> k = RandomVector(v.size(), 1.0f, 1);
  const TestCache cache = BuildCache(k, v, c, kPaged16);
  const std::vector<float> q = RandomVector(v.size() * c.group, 1.0f, 3);
  const AttentionParams params{c.num_kv_heads * c.group, 0.1f};
  return ExpectReferenceOnEveryTarget(cache, q, params, c.v_codec) / c.group;
}

// The ways FP8 rows are read where the CPU has them: in FP16 (AVX512-FP16), by the BF16
// readers through vdpbf16ps or widened, by the float readers. Runs `fn(name)` under each.
template <class Fn>
void ForEachFp8Path(Fn&& fn) {
  fn("FP16");
  DisableHalfReadersForTest(true);
  SetBf16MultiplyForTest(Bf16MultiplyForTest::kDot);
  fn("vdpbf16ps");
  SetBf16MultiplyForTest(Bf16MultiplyForTest::kWiden);
  fn("widened");
  SetBf16MultiplyForTest(Bf16MultiplyForTest::kMeasured);
  DisableHalfReadersForTest(false);
  DisableDotProductReadersForTest(true);
  fn("float readers");
  DisableDotProductReadersForTest(false);
}

TEST(AttentionTest, Fp8ReadersDecodeEveryCodeOnEverySimdTarget) {
  // Row h holds the codes 64 h .. 64 h + 63 (subnormals, both zeros and the NaN codes among
  // them), then the format's largest finite value, which pins the row's scale at 1, so every
  // code is stored as itself. E5M2's infinities cannot be stored (encoding saturates them).
  struct Format {
    const char* codec;
    float (*decode)(uint8_t);
    float max_finite;
    int nan_codes;
  };
  // Every way FP8 rows are read (where the CPU has them), one query head and four.
  for (int group : {1, 4}) {
    ForEachFp8Path([&](const char* path) {
      SCOPED_TRACE(path);
      for (const Format& f : {Format{"fp8_e4m3", &Fp8E4M3ToF32, 448.0f, 2},
                              Format{"fp8_e5m2", &Fp8E5M2ToF32, 57344.0f, 6}}) {
        Case c;
        c.num_tokens = 1;
        c.num_kv_heads = 4;
        c.head_dim = 128;
        c.v_codec = f.codec;
        std::vector<float> v(static_cast<size_t>(c.num_kv_heads) * c.head_dim, 0.0f);
        for (int h = 0; h < c.num_kv_heads; ++h) {
          for (int e = 0; e < 64; ++e) {
            const float x = f.decode(static_cast<uint8_t>(64 * h + e));
            v[h * c.head_dim + e] = std::isinf(x) ? 0.0f : x;
          }
          v[h * c.head_dim + 64] = f.max_finite;
        }
        c.group = group;
        EXPECT_EQ(ExpectStoredValuesOnEveryTarget(c, v), f.nan_codes) << f.codec;
      }
    });
  }
}

TEST(AttentionTest, Fp8KeysScoreEveryCodeExactlyOnEveryPath) {
  // Kv head h has two tokens: the first's key holds code h at element 0 and the format's largest
  // finite value (which pins the row's scale at 1) at element 1, the second's key is zeros;
  // values are ones and zeros. A query of 2^-6 at element 0 gives the first token the score
  // value(h) / 64, exact in every reader (a power of two times a 3- or 4-bit value), so the
  // output is its logistic function: a code read as any other value shows there. NaN codes
  // score NaN, which makes their heads NaN, as in the reference (E5M2's infinities are stored
  // as its largest finite value: the codec saturates them). Rows of whole vectors, of a vector
  // and a rest, and shorter than a vector (the special-code check takes 32 codes at a time on
  // AVX2).
  struct Format {
    const char* codec;
    float (*decode)(uint8_t);
    float max_finite;
    int nan_heads;  // codes whose head comes out NaN
  };
  for (const Format& f : {Format{"fp8_e4m3", &Fp8E4M3ToF32, 448.0f, 2},
                          Format{"fp8_e5m2", &Fp8E5M2ToF32, 57344.0f, 6}}) {
    for (int head_dim : {32, 40, 8}) {
      Case c{.num_tokens = 2,
             .num_kv_heads = 256,
             .head_dim = head_dim,
             .k_codec = f.codec,
             .v_codec = "f32"};
      const size_t row = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
      std::vector<float> k(2 * row, 0.0f), v(2 * row, 0.0f);
      for (int h = 0; h < c.num_kv_heads; ++h) {
        k[h * c.head_dim] = f.decode(static_cast<uint8_t>(h));
        k[h * c.head_dim + 1] = f.max_finite;
        std::fill_n(v.begin() + h * c.head_dim, c.head_dim, 1.0f);
      }
      const TestCache cache = BuildCache(k, v, c, kPaged16);
      for (int group : {1, 4}) {
        c.group = group;
        std::vector<float> q(row * group, 0.0f);
        for (size_t head = 0; head < static_cast<size_t>(c.num_kv_heads) * group; ++head) {
          q[head * c.head_dim] = 0x1p-6f;
        }
        const AttentionParams params{c.num_kv_heads * group, 1.0f};
        ForEachFp8Path([&](const char* path) {
          const std::string what = std::string(f.codec) + ", head_dim " + std::to_string(head_dim) +
                                   ", group " + std::to_string(group) + ", " + path;
          EXPECT_EQ(ExpectReferenceOnEveryTarget(cache, q, params, what),
                    f.nan_heads * group * c.head_dim)
              << what;
        });
      }
    }
  }
}

TEST(AttentionTest, Int8KeysScoreExactlyAgainstAQueryOfOneMagnitude) {
  // Query elements of one magnitude (+-1) are exact in every int8 key reader's quantised query
  // (the AVX2 reader's int16 words are +-32767 times one step per head, the VNNI and AMX readers'
  // hi bytes +-127), so the scores are exact to float rounding and the output must match the
  // reference to 1e-6: a step off by one part in 32767 fails here (the random tests' tolerance
  // lets it through). Several tiles; steps of 4, 2 and 1 query heads; head_dim of 1 to 8 blocks.
  for (int head_dim : {32, 128, 256}) {
    for (int group : {1, 2, 4, 7}) {
      const Case c{.num_tokens = 600,
                   .num_kv_heads = 2,
                   .group = group,
                   .head_dim = head_dim,
                   .k_codec = "int8",
                   .v_codec = "f32"};
      const size_t row = static_cast<size_t>(c.num_kv_heads) * head_dim;
      const std::vector<float> k = RandomVector(c.num_tokens * row, 1.0f, 1);
      const std::vector<float> v = RandomVector(c.num_tokens * row, 1.0f, 2);
      const TestCache cache = BuildCache(k, v, c, kPaged16);
      std::vector<float> q(row * group);
      for (size_t i = 0; i < q.size(); ++i) q[i] = i % 3 == 0 ? -1.0f : 1.0f;
      const AttentionParams params{c.num_kv_heads * group, 0.25f};
      const std::string what =
          "head_dim " + std::to_string(head_dim) + " group " + std::to_string(group);
      EXPECT_EQ(ExpectReferenceOnEveryTarget(cache, q, params, what), 0);
    }
  }
}

TEST(AttentionTest, KiviKeysOnTheirGridScoreExactly) {
  // KIVI keys whose channels in block b (32 channels) each span the codes 0 .. 2^bits - 1 times
  // d_b = 2^-b over every unit, so that every channel stores scale d_b and min 0, against query
  // elements of one magnitude: the VNNI reader folds them into codes of exactly +-127 with a
  // step of |q| d_b / 127, so its scores are exact to float rounding and the output must match
  // the reference to 1e-6. A fold that takes a block's scale maximum from another block, or a
  // ratio or step off by 1 %, fails here (the random tests' tolerance of 1e-2 lets such slips
  // through). Blocks 3 (padded to 4 in the preparation), 4 and 8; steps of heads 4, 2 and 1.
  for (const char* codec : {"kivi2", "kivi4"}) {
    const int levels = std::string(codec) == "kivi2" ? 4 : 16;
    for (int head_dim : {96, 128, 256}) {
      for (int group : {1, 4, 7}) {
        const Case c{.num_tokens = 64,
                     .num_kv_heads = 2,
                     .group = group,
                     .head_dim = head_dim,
                     .k_codec = codec,
                     .v_codec = "f32"};
        const size_t row = static_cast<size_t>(c.num_kv_heads) * head_dim;
        std::vector<float> k(c.num_tokens * row);
        for (int t = 0; t < c.num_tokens; ++t) {
          for (size_t i = 0; i < row; ++i) {
            const int e = static_cast<int>(i) % head_dim, code = (t + static_cast<int>(i)) % levels;
            k[t * row + i] = std::ldexp(static_cast<float>(code), -(e / 32));
          }
        }
        const std::vector<float> v = RandomVector(k.size(), 1.0f, 2);
        const TestCache cache = BuildCache(k, v, c, {LayoutKind::kPaged, 64});
        std::vector<float> q(row * group);
        for (size_t i = 0; i < q.size(); ++i) q[i] = i % 3 == 0 ? -0.0625f : 0.0625f;
        const AttentionParams params{c.num_kv_heads * group, 0.05f};
        const std::string what = std::string(codec) + " head_dim " + std::to_string(head_dim) +
                                 " group " + std::to_string(group);
        EXPECT_EQ(ExpectReferenceOnEveryTarget(cache, q, params, what), 0);
      }
    }
  }
}

TEST(AttentionTest, F16ReaderKeepsInfinitiesAndNaNsOnEverySimdTarget) {
  Case c;
  c.num_tokens = 1;
  c.num_kv_heads = 1;
  c.head_dim = 16;
  c.v_codec = "f16";
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> v = {inf,       -inf, std::nanf(""), 65504.0f, -65504.0f, 0x1p-24f,
                                -0x1p-14f, 1.0f, 0.0f,          -0.0f,    0.5f,      3.0f,
                                -2.0f,     1e4f, 7.0f,          0.25f};
  EXPECT_EQ(ExpectStoredValuesOnEveryTarget(c, v), 1);
}

TEST(AttentionTest, NonFiniteKeysMakeTheirHeadsNaNAsInTheReference) {
  // A key holding a NaN scores NaN, one holding an infinity scores +-inf (or NaN against a zero
  // query element). In the reference's softmax a NaN or +inf score makes the head's output NaN
  // (inf - inf), a -inf one gets no weight; every kernel must do the same and never give a NaN
  // score's token no weight and go on. Kv head 0: a NaN in a sink's key (every query sees it);
  // kv head 1: +inf in a pending key near the end (only the last queries see it; which heads it
  // turns NaN depends on the sign of their query element); kv head 2: -inf in an arena key of a
  // later tile; kv head 3: finite.
  ThreadPool pool(2);
  const float inf = std::numeric_limits<float>::infinity();
  for (const char* codec : {"f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"}) {
    for (const int num_queries : {1, 5}) {
      for (const int group : {1, 4}) {
        Case c;
        c.num_tokens = 700;
        c.num_queries = num_queries;
        c.num_kv_heads = 4;
        c.group = group;
        c.head_dim = 64;
        c.k_codec = codec;
        c.num_sinks = 4;
        c.extra_pending = 3;
        const size_t row = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
        std::vector<float> k = RandomVector(c.num_tokens * row, 1.0f, 1);
        const std::vector<float> v = RandomVector(c.num_tokens * row, 1.0f, 2);
        k[2 * row + 0 * c.head_dim + 5] = std::nanf("");
        k[698 * row + 1 * c.head_dim + 7] = inf;
        k[400 * row + 2 * c.head_dim + 3] = -inf;
        const int num_heads = c.num_kv_heads * group;
        const std::vector<float> q =
            GridQueries(static_cast<size_t>(num_queries) * num_heads * c.head_dim, 3.0f, 3);
        const AttentionParams params{num_heads, 0.125f};
        for (const Layout& layout : {kPaged16, Layout{LayoutKind::kContiguous, 0}}) {
          const TestCache cache = BuildCache(k, v, c, layout);
          std::vector<float> expected(q.size());
          AttentionReference(cache.view, q.data(), num_queries, params, expected.data());
          for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
            hwy::SetSupportedTargetsForTest(target);
            for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
              SCOPED_TRACE(Describe(c, layout, p == nullptr ? 1 : 2) + " on " +
                           hwy::TargetName(target));
              std::vector<float> out(q.size(), -12345.0f);
              Attention(cache.view, q.data(), num_queries, params, out.data(), p);
              const int nans = ExpectSameNaNsAndClose(out, expected, ToleranceFor(c));
              // Kv head 0's heads are NaN for every query (FP8 saturates the infinities).
              EXPECT_GE(nans, num_queries * group * c.head_dim);
            }
          }
          hwy::SetSupportedTargetsForTest(0);  // back to the machine's own
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvstack::attention_test
