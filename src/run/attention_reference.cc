// AttentionReference: the plain scalar attention every kernel path is tested against. It
// decodes each stored row with the scalar numeric.h conversions and runs a two-pass softmax in
// double precision, so it differs from the kernels only in rounding and summation order.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kvstack/numeric.h"
#include "run/attention.h"

namespace kvstack {
namespace {

// Decodes one stored row of head_dim elements.
void DecodeRow(CodecId codec, const std::byte* row, int head_dim, double* dst) {
  for (int i = 0; i < head_dim; ++i) {
    if (codec == CodecId::kF32) {
      float f;
      std::memcpy(&f, row + i * sizeof(float), sizeof(f));
      dst[i] = f;
    } else {
      uint16_t bits;
      std::memcpy(&bits, row + i * sizeof(uint16_t), sizeof(bits));
      dst[i] = codec == CodecId::kF16 ? F16ToF32(bits) : BF16ToF32(bits);
    }
  }
}

}  // namespace

void AttentionReference(const KvLayerView& view, const float* q, int num_queries,
                        const AttentionParams& params, float* out) {
  KVS_CHECK(view.num_kv_heads > 0 && view.head_dim > 0);
  KVS_CHECK(params.num_heads > 0 && params.num_heads % view.num_kv_heads == 0);
  KVS_CHECK(0 <= num_queries && num_queries <= view.num_tokens);
  const int head_dim = view.head_dim;
  const int group = params.num_heads / view.num_kv_heads;
  const int num_tokens = view.num_tokens;

  // Decode the whole view once: [num_tokens][num_kv_heads][head_dim]. Fine for a reference.
  const size_t row_elems = static_cast<size_t>(view.num_kv_heads) * head_dim;
  std::vector<double> keys(num_tokens * row_elems), values(num_tokens * row_elems);
  view.ForEachRun(0, num_tokens, [&](int logical, int count, int32_t block_id, int row) {
    for (int r = 0; r < count; ++r) {
      for (int h = 0; h < view.num_kv_heads; ++h) {
        const size_t offset = (logical + r) * row_elems + static_cast<size_t>(h) * head_dim;
        DecodeRow(view.k.codec, view.k.Row(block_id, row + r, h), head_dim, &keys[offset]);
        DecodeRow(view.v.codec, view.v.Row(block_id, row + r, h), head_dim, &values[offset]);
      }
    }
  });

  std::vector<double> scores(num_tokens), acc(head_dim);
  for (int qi = 0; qi < num_queries; ++qi) {
    const int last_key = num_tokens - num_queries + qi;  // causal: keys [0, last_key]
    for (int head = 0; head < params.num_heads; ++head) {
      const int kv_head = head / group;
      const float* qrow = q + (static_cast<size_t>(qi) * params.num_heads + head) * head_dim;
      double max_score = -std::numeric_limits<double>::infinity();
      for (int t = 0; t <= last_key; ++t) {
        const double* k = &keys[t * row_elems + static_cast<size_t>(kv_head) * head_dim];
        double dot = 0.0;
        for (int i = 0; i < head_dim; ++i) dot += static_cast<double>(qrow[i]) * k[i];
        scores[t] = dot * params.scale;
        max_score = std::max(max_score, scores[t]);
      }
      double sum = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int t = 0; t <= last_key; ++t) {
        const double p = std::exp(scores[t] - max_score);
        sum += p;
        const double* v = &values[t * row_elems + static_cast<size_t>(kv_head) * head_dim];
        for (int i = 0; i < head_dim; ++i) acc[i] += p * v[i];
      }
      float* orow = out + (static_cast<size_t>(qi) * params.num_heads + head) * head_dim;
      for (int i = 0; i < head_dim; ++i) orow[i] = static_cast<float>(acc[i] / sum);
    }
  }
}

}  // namespace kvstack
