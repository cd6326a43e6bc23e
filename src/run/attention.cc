// Attention(): checks its arguments and hands the work to the decode kernel (one query) or the
// prefill kernel (many), each in its own file (attention_decode.cc, attention_prefill.cc) and
// compiled for every SIMD target.

#include "run/attention.h"

#include <atomic>

#include "represent/hadamard.h"
#include "run/attention_kernels.h"
#include "run/lowrank_attention.h"

namespace kvstack {
namespace {
std::atomic<bool> dot_product_readers_disabled{false};
std::atomic<bool> tile_multiplies_disabled{false};
std::atomic<bool> half_readers_disabled{false};
std::atomic<Bf16MultiplyForTest> bf16_multiply{Bf16MultiplyForTest::kMeasured};
std::atomic<ValueWeightsForTest> value_weights{ValueWeightsForTest::kChosen};
}  // namespace

void DisableDotProductReadersForTest(bool disabled) {
  dot_product_readers_disabled.store(disabled, std::memory_order_relaxed);
}
bool DotProductReadersDisabledForTest() {
  return dot_product_readers_disabled.load(std::memory_order_relaxed);
}
void SetBf16MultiplyForTest(Bf16MultiplyForTest how) {
  bf16_multiply.store(how, std::memory_order_relaxed);
}
Bf16MultiplyForTest Bf16MultiplySetForTest() {
  return bf16_multiply.load(std::memory_order_relaxed);
}
void DisableHalfReadersForTest(bool disabled) {
  half_readers_disabled.store(disabled, std::memory_order_relaxed);
}
bool HalfReadersDisabledForTest() { return half_readers_disabled.load(std::memory_order_relaxed); }
void DisableTileMultipliesForTest(bool disabled) {
  tile_multiplies_disabled.store(disabled, std::memory_order_relaxed);
}
bool TileMultipliesDisabledForTest() {
  return tile_multiplies_disabled.load(std::memory_order_relaxed);
}
void SetValueWeightsForTest(ValueWeightsForTest how) {
  value_weights.store(how, std::memory_order_relaxed);
}
ValueWeightsForTest ValueWeightsSetForTest() {
  return value_weights.load(std::memory_order_relaxed);
}

void Attention(const KvLayerView& view, const float* q, int num_queries,
               const AttentionParams& params, float* out, ThreadPool* pool,
               const AttentionScores* scores) {
  KVS_CHECK(view.num_kv_heads > 0 && view.head_dim > 0);
  KVS_CHECK(params.num_heads > 0 && params.num_heads % view.num_kv_heads == 0);
  KVS_CHECK(0 <= num_queries && num_queries <= view.num_tokens);
  KVS_CHECK(!view.keys_rotated || IsPowerOfTwo(view.head_dim));
  KVS_CHECK(!view.mixed_codecs() && "per-head codecs: read each HeadView (AttentionAnyHeads)");
  if (num_queries == 0) return;
  if (LowRankFormApplies(view, scores))
    return LowRankAttention(view, q, num_queries, params, out, pool);
  if (scores != nullptr) {
    KVS_CHECK(scores->out != nullptr && scores->stride >= view.num_tokens);
    KVS_CHECK(0 <= scores->first_query && scores->first_query < num_queries);
  }
  if (num_queries > 1) return PrefillAttention(view, q, num_queries, params, out, pool, scores);
  DecodeAttention(view, q, params, out, pool, scores);
}

}  // namespace kvstack
