// The attention kernels behind Attention() (src/run/attention.h), one per shape of work, each
// compiled for every Highway target and dispatched at run time. Internal to src/run: callers
// use Attention(), which checks the arguments these assume.
#pragma once

#include <cstdint>

#include "base/thread_pool.h"
#include "kvstack/kv_view.h"
#include "run/attention.h"

namespace kvstack {

// One query token (the last logical token of the view), split over the keys across threads
// (flash-decoding). attention_decode.cc.
void DecodeAttention(const KvLayerView& view, const float* q, const AttentionParams& params,
                     float* out, ThreadPool* pool, const AttentionScores* scores);

// num_queries > 1 query tokens, tiled over queries and keys. attention_prefill.cc.
void PrefillAttention(const KvLayerView& view, const float* q, int num_queries,
                      const AttentionParams& params, float* out, ThreadPool* pool,
                      const AttentionScores* scores);

// Tests only: whether the dot-product readers (integer: attention_vnni-inl.h; BF16:
// attention_bf16-inl.h) are switched off, so that the float readers they replace on CPUs with
// AVX-512 VNNI or AVX512_BF16 are tested there too. Not thread-safe against running kernels: set
// it between calls.
void DisableDotProductReadersForTest(bool disabled);
bool DotProductReadersDisabledForTest();

// Tests only: how the BF16 readers (attention_bf16-inl.h) multiply where they run: as this CPU's
// instruction costs choose (kMeasured), always by vdpbf16ps (kDot), or always by widening to F32
// and FMAs (kWiden), so that both are tested on every CPU that has them. Same contract as above.
enum class Bf16MultiplyForTest : uint8_t { kMeasured, kDot, kWiden };
void SetBf16MultiplyForTest(Bf16MultiplyForTest how);
Bf16MultiplyForTest Bf16MultiplySetForTest();

// Tests only: whether FP8 keys and values are multiplied in FP16 (attention_bf16-inl.h, on CPUs
// with AVX512-FP16) or, switched off, by the BF16 readers as elsewhere. Same contract as above.
void DisableHalfReadersForTest(bool disabled);
bool HalfReadersDisabledForTest();

// Tests only: whether the AMX tile multiplies (attention_amx-inl.h) are switched off, so that the
// VNNI readers they replace on CPUs with AMX are tested there too. Same contract as above.
void DisableTileMultipliesForTest(bool disabled);
bool TileMultipliesDisabledForTest();

// Tests only: how the VNNI readers weigh 4- and 2-bit affine values (attention_vnni-inl.h): in u8
// where a tile's softmax weights are spread enough and in int16 elsewhere (kChosen), or always
// in one of them, so that each is tested against the reference. Same contract as above.
enum class ValueWeightsForTest : uint8_t { kChosen, kInt16, kU8 };
void SetValueWeightsForTest(ValueWeightsForTest how);
ValueWeightsForTest ValueWeightsSetForTest();

}  // namespace kvstack
