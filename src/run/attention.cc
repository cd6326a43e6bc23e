// The SIMD attention kernels behind Attention() (src/run/attention.h): a flash-decoding kernel
// for one query token and a tiled online-softmax kernel for many. Both read keys and values in
// their stored codec through the view, are instantiated per (key codec, value codec) at compile
// time, and are compiled for every Highway target; the best one is picked at run time.
//
// This file is included once per target by hwy/foreach_target.h; everything between
// HWY_BEFORE_NAMESPACE and HWY_AFTER_NAMESPACE is compiled for each of them, the dispatch at
// the bottom (HWY_ONCE) only once.

#include "run/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kvstack/numeric.h"

// SSSE3 machines fall back to the portable EMU128 build; compiling one target fewer keeps the
// 9 codec pairs x 2 kernels affordable to build.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "run/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Order matters: foreach_target.h must come before highway.h.
#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvstack {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Decode: keys per score tile (scores of one tile stay in L1 between the passes) and the
// smallest chunk of keys worth a task of its own.
constexpr int kDecodeTile = 256;
constexpr int kMinDecodeChunk = 256;
constexpr int kDecodeTasksPerThread = 4;
constexpr size_t kPrefetchAhead = 16;  // keys
constexpr size_t kCacheLine = 64;
// Prefill: keys per tile. A multiple of kKeysPerStep.
constexpr int kPrefillKeyTile = 32;
constexpr int kKeysPerStep = 4;

// Scalar decode of element `i` of a stored row.
template <CodecId kCodec>
HWY_INLINE float LoadScalar(const std::byte* row, size_t i) {
  if constexpr (kCodec == CodecId::kF32) {
    float f;
    std::memcpy(&f, row + i * sizeof(float), sizeof(f));
    return f;
  } else {
    uint16_t bits;
    std::memcpy(&bits, row + i * sizeof(uint16_t), sizeof(bits));
    return kCodec == CodecId::kF16 ? F16ToF32(bits) : BF16ToF32(bits);
  }
}

// Loads Lanes(d) elements of a stored row starting at element `i`, converted to f32 in
// registers. One-lane tags take the scalar path: a one-lane 16-bit Highway load may read past
// the element, and the row may end the arena.
template <CodecId kCodec, class D>
HWY_INLINE hn::Vec<D> LoadRow(D d, const std::byte* row, size_t i) {
  if constexpr (hn::MaxLanes(D()) == 1) {
    return hn::Set(d, LoadScalar<kCodec>(row, i));
  } else if constexpr (kCodec == CodecId::kF32) {
    return hn::LoadU(d, reinterpret_cast<const float*>(row) + i);
  } else if constexpr (kCodec == CodecId::kF16) {
    const hn::Rebind<hwy::float16_t, D> d16;
    return hn::PromoteTo(d, hn::LoadU(d16, reinterpret_cast<const hwy::float16_t*>(row) + i));
  } else {
    const hn::Rebind<hwy::bfloat16_t, D> d16;
    return hn::PromoteTo(d, hn::LoadU(d16, reinterpret_cast<const hwy::bfloat16_t*>(row) + i));
  }
}

// Decodes a whole row of head_dim elements into dst, using full vectors, then 4-lane vectors,
// then scalars, so that any head_dim works.
template <CodecId kCodec>
HWY_INLINE void ConvertRow(const std::byte* row, size_t head_dim, float* HWY_RESTRICT dst) {
  const DF df;
  const hn::CappedTag<float, 4> d4;
  const size_t n = hn::Lanes(df);
  size_t i = 0;
  for (; i + n <= head_dim; i += n) hn::StoreU(LoadRow<kCodec>(df, row, i), df, dst + i);
  for (; i + 4 <= head_dim; i += 4) hn::StoreU(LoadRow<kCodec>(d4, row, i), d4, dst + i);
  for (; i < head_dim; ++i) dst[i] = LoadScalar<kCodec>(row, i);
}

// A per-thread scratch that only grows, so the hot path does not allocate once warm.
float* Scratch(size_t num_floats) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < num_floats) buffer.resize(num_floats);
  return buffer.data();
}

// ---------------------------------------------------------------------------------------------
// Decode.

// Stores the sum of the 128-bit blocks of v (4 lanes) to out[0, 4).
// (The one-lane HWY_SCALAR target has no block operations; it never needs them.)
#if HWY_TARGET != HWY_SCALAR
template <class D, class V>
HWY_INLINE void StoreSumOfBlocks(D d, V v, float* HWY_RESTRICT out) {
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    StoreSumOfBlocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)), out);
  } else {
    hn::StoreU(v, d, out);
  }
}
#endif

// out[0..4) = the lane sums of a, b, c, e: four horizontal sums for the price of about one,
// by transposing pairs of lanes within each 128-bit block.
template <class D, class V>
HWY_INLINE void SumOfLanes4(D d, V a, V b, V c, V e, float* HWY_RESTRICT out) {
  if constexpr (hn::MaxLanes(D()) == 1) {
    out[0] = hn::GetLane(a);
    out[1] = hn::GetLane(b);
    out[2] = hn::GetLane(c);
    out[3] = hn::GetLane(e);
  } else {
#if HWY_TARGET != HWY_SCALAR
    // Per block: [a0+a2, b0+b2, a1+a3, b1+b3] and the same for c, e.
    const V ab = hn::Add(hn::InterleaveLower(d, a, b), hn::InterleaveUpper(d, a, b));
    const V ce = hn::Add(hn::InterleaveLower(d, c, e), hn::InterleaveUpper(d, c, e));
    const hn::Repartition<uint64_t, D> du64;
    const auto ab64 = hn::BitCast(du64, ab), ce64 = hn::BitCast(du64, ce);
    const V lo = hn::BitCast(d, hn::InterleaveLower(du64, ab64, ce64));
    const V hi = hn::BitCast(d, hn::InterleaveUpper(du64, ab64, ce64));
    StoreSumOfBlocks(d, hn::Add(lo, hi), out);
#endif
  }
}

// Scores of four key rows against kNumQ query heads: s[j * s_stride + key] = q_j . k_key.
//   q: [kNumQ, head_dim] (already scaled)
template <int kNumQ, CodecId kK, class D>
HWY_INLINE void ScoreFourRows(D d, const std::byte* const* krows, const float* HWY_RESTRICT q,
                              size_t head_dim, float* HWY_RESTRICT s, size_t s_stride) {
  const size_t n = hn::Lanes(d);
  hn::Vec<D> acc[kNumQ][4];
  HWY_UNROLL(8)
  for (int j = 0; j < kNumQ; ++j) {
    HWY_UNROLL(8)
    for (int key = 0; key < 4; ++key) acc[j][key] = hn::Zero(d);
  }
  for (size_t i = 0; i < head_dim; i += n) {
    hn::Vec<D> k[4];
    HWY_UNROLL(8)
    for (int key = 0; key < 4; ++key) k[key] = LoadRow<kK>(d, krows[key], i);
    HWY_UNROLL(8)
    for (int j = 0; j < kNumQ; ++j) {
      const auto qv = hn::LoadU(d, q + j * head_dim + i);
      HWY_UNROLL(8)
      for (int key = 0; key < 4; ++key) acc[j][key] = hn::MulAdd(qv, k[key], acc[j][key]);
    }
  }
  HWY_UNROLL(8)
  for (int j = 0; j < kNumQ; ++j) {
    SumOfLanes4(d, acc[j][0], acc[j][1], acc[j][2], acc[j][3], s + j * s_stride);
  }
}

// acc_j[:head_dim] += sum over keys of p[j * p_stride + key] * v_key, for kNumQ query heads.
// The accumulators stay in registers for a slice of dimensions while all the tile's keys go
// by; each slice of a value row is converted once for all kNumQ heads.
//   acc: [kNumQ][acc_stride]
template <int kNumQ, CodecId kV, class D>
HWY_INLINE void AccumulateRows(D d, const std::byte* const* vrows, size_t num_keys,
                               const float* HWY_RESTRICT p, size_t p_stride, size_t head_dim,
                               float* HWY_RESTRICT acc, size_t acc_stride) {
  constexpr size_t kMaxVecs = 8 / kNumQ;  // accumulators in registers: at most 8
  const size_t n = hn::Lanes(d);
  for (size_t i0 = 0; i0 < head_dim; i0 += kMaxVecs * n) {
    const size_t num_vecs = std::min(kMaxVecs, (head_dim - i0) / n);
    hn::Vec<D> a[kNumQ][kMaxVecs];
    HWY_UNROLL(8)
    for (int j = 0; j < kNumQ; ++j) {
      HWY_UNROLL(8)
      for (size_t v = 0; v < kMaxVecs; ++v) {
        a[j][v] = v < num_vecs ? hn::LoadU(d, acc + j * acc_stride + i0 + v * n) : hn::Zero(d);
      }
    }
    for (size_t key = 0; key < num_keys; ++key) {
      hn::Vec<D> w[kNumQ];
      HWY_UNROLL(8)
      for (int j = 0; j < kNumQ; ++j) w[j] = hn::Set(d, p[j * p_stride + key]);
      HWY_UNROLL(8)
      for (size_t v = 0; v < kMaxVecs; ++v) {
        if (v < num_vecs) {
          const auto x = LoadRow<kV>(d, vrows[key], i0 + v * n);
          HWY_UNROLL(8)
          for (int j = 0; j < kNumQ; ++j) a[j][v] = hn::MulAdd(w[j], x, a[j][v]);
        }
      }
    }
    HWY_UNROLL(8)
    for (int j = 0; j < kNumQ; ++j) {
      for (size_t v = 0; v < num_vecs; ++v)
        hn::StoreU(a[j][v], d, acc + j * acc_stride + i0 + v * n);
    }
  }
}

// Runs fn(j, num_q) over the query heads of a group in steps of kMaxStep (4 or 2), 2 and 1,
// so that each key or value element is converted once per step of heads.
template <int kMaxStep, class Fn>
HWY_INLINE void ForEachHeadStep(int group, Fn&& fn) {
  int j = 0;
  if constexpr (kMaxStep == 4) {
    for (; j + 4 <= group; j += 4) fn(j, std::integral_constant<int, 4>());
  }
  for (; j + 2 <= group; j += 2) fn(j, std::integral_constant<int, 2>());
  for (; j < group; ++j) fn(j, std::integral_constant<int, 1>());
}

// One decode task: keys [begin, end) of kv head `kv_head` against the `group` query heads
// that share it. Leaves the unnormalised partial result in `state`:
//   q:     [group, head_dim] (already scaled)
//   state: [group, head_dim + 2]: acc[head_dim], running max, running sum
template <CodecId kK, CodecId kV, class D>
void DecodeChunk(D d, const KvLayerView& view, int kv_head, int begin, int end,
                 const float* HWY_RESTRICT q, int group, float* HWY_RESTRICT state) {
  const DF df;
  const size_t nf = hn::Lanes(df);
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  const size_t state_stride = head_dim + 2;
  // Scores padded to whole vectors with -inf, so that max/exp/sum need no scalar tail.
  const size_t s_stride = (kDecodeTile + nf - 1) / nf * nf;
  float* s = Scratch(static_cast<size_t>(group) * s_stride);  // [group, s_stride]
  const std::byte* krows[kDecodeTile];
  const std::byte* vrows[kDecodeTile];
  for (int j = 0; j < group; ++j) {
    float* st = state + j * state_stride;
    std::fill(st, st + head_dim, 0.0f);
    st[head_dim] = kNegInf;   // running max
    st[head_dim + 1] = 0.0f;  // running sum
  }

  for (int t0 = begin; t0 < end; t0 += kDecodeTile) {
    const int t1 = std::min(end, t0 + kDecodeTile);
    const size_t num_keys = static_cast<size_t>(t1 - t0);
    // Row addresses of the tile's keys and values, padded to a multiple of 4 with the last
    // key (the padding's scores are overwritten with -inf below).
    view.ForEachRun(t0, t1, [&](int logical, int count, int32_t block_id, int row) {
      const std::byte* krow = view.k.Row(block_id, row, kv_head);
      const std::byte* vrow = view.v.Row(block_id, row, kv_head);
      for (int r = 0; r < count; ++r) {
        krows[logical - t0 + r] = krow + r * view.k.unit_bytes;
        vrows[logical - t0 + r] = vrow + r * view.v.unit_bytes;
      }
    });
    const size_t num_keys4 = (num_keys + 3) / 4 * 4;
    for (size_t i = num_keys; i < num_keys4; ++i) krows[i] = krows[num_keys - 1];
    // Pass 1: scores. Blocks of a paged cache are a few KiB apart from the next block of the
    // same head, which stops the hardware prefetchers at every block; so the rows kPrefetchAhead
    // keys ahead (keys and values both: the value pass then reads from L2) are requested here.
    for (size_t key = 0; key < num_keys4; key += 4) {
      for (size_t ahead = key + kPrefetchAhead;
           ahead < std::min(num_keys, key + kPrefetchAhead + 4); ++ahead) {
        for (size_t line = 0; line < view.k.unit_bytes; line += kCacheLine) {
          hwy::Prefetch(krows[ahead] + line);
        }
        for (size_t line = 0; line < view.v.unit_bytes; line += kCacheLine) {
          hwy::Prefetch(vrows[ahead] + line);
        }
      }
      ForEachHeadStep<2>(group, [&](int j, auto num_q) {
        ScoreFourRows<decltype(num_q)::value, kK>(d, krows + key, q + j * head_dim, head_dim,
                                                  s + j * s_stride + key, s_stride);
      });
    }
    // Softmax of the tile, folded into the running state.
    const size_t padded = (num_keys + nf - 1) / nf * nf;
    for (int j = 0; j < group; ++j) {
      float* sj = s + j * s_stride;
      float* st = state + j * state_stride;
      for (size_t i = num_keys; i < padded; ++i) sj[i] = kNegInf;
      auto vmax = hn::Set(df, kNegInf);
      for (size_t i = 0; i < padded; i += nf) vmax = hn::Max(vmax, hn::LoadU(df, sj + i));
      const float tile_max = hn::GetLane(hn::MaxOfLanes(df, vmax));
      const float new_max = std::max(st[head_dim], tile_max);
      const auto vnew_max = hn::Set(df, new_max);
      auto vsum = hn::Zero(df);
      for (size_t i = 0; i < padded; i += nf) {
        const auto p = hn::Exp(df, hn::Sub(hn::LoadU(df, sj + i), vnew_max));
        hn::StoreU(p, df, sj + i);
        vsum = hn::Add(vsum, p);
      }
      // exp(-inf) == 0 on the first tile, where the accumulator is still empty.
      const float alpha = std::exp(st[head_dim] - new_max);
      if (alpha != 1.0f) {
        for (size_t i = 0; i < head_dim; ++i) st[i] *= alpha;
      }
      st[head_dim + 1] = st[head_dim + 1] * alpha + hn::GetLane(hn::SumOfLanes(df, vsum));
      st[head_dim] = new_max;
    }
    // Pass 2: weighted sum of the values.
    ForEachHeadStep<4>(group, [&](int j, auto num_q) {
      AccumulateRows<decltype(num_q)::value, kV>(d, vrows, num_keys, s + j * s_stride, s_stride,
                                                 head_dim, state + j * state_stride, state_stride);
    });
  }
}

template <CodecId kK, CodecId kV, class D>
void DecodeImpl(D d, const KvLayerView& view, const float* q, const AttentionParams& params,
                float* out, ThreadPool* pool) {
  const int num_threads = pool == nullptr ? 1 : pool->num_threads();
  const int num_kv_heads = view.num_kv_heads;
  const int group = params.num_heads / num_kv_heads;
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  const int num_tokens = view.num_tokens;

  // Enough tasks to keep every thread busy, each large enough to amortise its merge.
  const int wanted_chunks = (kDecodeTasksPerThread * num_threads + num_kv_heads - 1) / num_kv_heads;
  const int max_chunks = (num_tokens + kMinDecodeChunk - 1) / kMinDecodeChunk;
  const int num_chunks = std::max(1, std::min(wanted_chunks, max_chunks));
  const int chunk_len = (num_tokens + num_chunks - 1) / num_chunks;
  const int num_tasks = num_kv_heads * num_chunks;

  // Scaled queries and per-task partial states live in the caller's scratch; tasks use their
  // own thread's scratch.
  const size_t state_stride = head_dim + 2;
  const size_t q_floats = static_cast<size_t>(params.num_heads) * head_dim;
  thread_local std::vector<float> call_scratch;
  call_scratch.resize(q_floats + static_cast<size_t>(num_tasks) * group * state_stride);
  float* q_scaled = call_scratch.data();
  float* states = q_scaled + q_floats;
  for (size_t i = 0; i < q_floats; ++i) q_scaled[i] = q[i] * params.scale;

  auto task = [&](int64_t task_idx, int /*thread_idx*/) {
    const int kv_head = static_cast<int>(task_idx / num_chunks);
    const int chunk = static_cast<int>(task_idx % num_chunks);
    const int begin = chunk * chunk_len;
    const int end = std::min(num_tokens, begin + chunk_len);
    float* state = states + static_cast<size_t>(task_idx) * group * state_stride;
    // An empty trailing chunk leaves max -inf, sum 0: it drops out of the merge.
    DecodeChunk<kK, kV>(d, view, kv_head, begin, end,
                        q_scaled + static_cast<size_t>(kv_head) * group * head_dim, group, state);
  };
  if (pool == nullptr || num_tasks == 1) {
    for (int t = 0; t < num_tasks; ++t) task(t, 0);
  } else {
    pool->Run(num_tasks, task);
  }

  // Merge the chunks of each query head: rescale each to the common max.
  for (int kv_head = 0; kv_head < num_kv_heads; ++kv_head) {
    for (int j = 0; j < group; ++j) {
      const float* first =
          states + (static_cast<size_t>(kv_head) * num_chunks * group + j) * state_stride;
      const size_t chunk_stride = static_cast<size_t>(group) * state_stride;
      float global_max = kNegInf;
      for (int c = 0; c < num_chunks; ++c) {
        global_max = std::max(global_max, first[c * chunk_stride + head_dim]);
      }
      float* o = out + (static_cast<size_t>(kv_head) * group + j) * head_dim;
      std::fill(o, o + head_dim, 0.0f);
      float denom = 0.0f;
      for (int c = 0; c < num_chunks; ++c) {
        const float* st = first + c * chunk_stride;
        const float w = std::exp(st[head_dim] - global_max);
        if (w == 0.0f) continue;
        denom += w * st[head_dim + 1];
        for (size_t i = 0; i < head_dim; ++i) o[i] += w * st[i];
      }
      const float inv = 1.0f / denom;
      for (size_t i = 0; i < head_dim; ++i) o[i] *= inv;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Prefill.
//
// A task owns one kv head and a tile of consecutive queries; its rows are (query, head of the
// group) pairs, r = query_in_tile * group + j, padded to whole pairs of vectors. Everything is
// kept transposed — queries, scores and outputs as [head_dim or key][row] — so that one vector
// holds the same quantity for many rows: the softmax needs no horizontal reductions, and each
// key or value element is broadcast once and reused by a whole vector of rows. Keys and values
// are decoded one small tile at a time into per-thread scratch (like SRAM tiles on a GPU),
// amortised over every row of the query tile.

// St[k][rows] = Qt[:, rows] . Kf[k] for kKeysPerStep keys and two row vectors.
//   qt: [head_dim][row_stride], kf: [kKeysPerStep][head_dim], st: [kKeysPerStep][row_stride]
HWY_INLINE void ScoreStep(const float* HWY_RESTRICT qt, const float* HWY_RESTRICT kf,
                          size_t head_dim, size_t row_stride, float* HWY_RESTRICT st) {
  const DF df;
  const size_t n = hn::Lanes(df);
  auto a00 = hn::Zero(df), a01 = hn::Zero(df), a10 = hn::Zero(df), a11 = hn::Zero(df);
  auto a20 = hn::Zero(df), a21 = hn::Zero(df), a30 = hn::Zero(df), a31 = hn::Zero(df);
  for (size_t i = 0; i < head_dim; ++i) {
    const auto q0 = hn::LoadU(df, qt + i * row_stride);
    const auto q1 = hn::LoadU(df, qt + i * row_stride + n);
    const auto k0 = hn::Set(df, kf[i]);
    const auto k1 = hn::Set(df, kf[head_dim + i]);
    const auto k2 = hn::Set(df, kf[2 * head_dim + i]);
    const auto k3 = hn::Set(df, kf[3 * head_dim + i]);
    a00 = hn::MulAdd(q0, k0, a00);
    a01 = hn::MulAdd(q1, k0, a01);
    a10 = hn::MulAdd(q0, k1, a10);
    a11 = hn::MulAdd(q1, k1, a11);
    a20 = hn::MulAdd(q0, k2, a20);
    a21 = hn::MulAdd(q1, k2, a21);
    a30 = hn::MulAdd(q0, k3, a30);
    a31 = hn::MulAdd(q1, k3, a31);
  }
  hn::StoreU(a00, df, st);
  hn::StoreU(a01, df, st + n);
  hn::StoreU(a10, df, st + row_stride);
  hn::StoreU(a11, df, st + row_stride + n);
  hn::StoreU(a20, df, st + 2 * row_stride);
  hn::StoreU(a21, df, st + 2 * row_stride + n);
  hn::StoreU(a30, df, st + 3 * row_stride);
  hn::StoreU(a31, df, st + 3 * row_stride + n);
}

// Ot[i][rows] = Ot[i][rows] * alpha[rows] + sum_k P[k][rows] * Vf[k][i] for kDims dims i and
// two row vectors.
//   ot: [head_dim][row_stride], p: [num_keys][row_stride], vf: [num_keys][head_dim]
template <int kDims>
HWY_INLINE void AccumulateStep(const float* HWY_RESTRICT p, const float* HWY_RESTRICT vf,
                               size_t num_keys, size_t head_dim, size_t row_stride,
                               const float* HWY_RESTRICT alpha, float* HWY_RESTRICT ot) {
  const DF df;
  const size_t n = hn::Lanes(df);
  const auto alpha0 = hn::LoadU(df, alpha), alpha1 = hn::LoadU(df, alpha + n);
  hn::Vec<DF> a0[kDims], a1[kDims];
  for (int i = 0; i < kDims; ++i) {
    a0[i] = hn::Mul(hn::LoadU(df, ot + i * row_stride), alpha0);
    a1[i] = hn::Mul(hn::LoadU(df, ot + i * row_stride + n), alpha1);
  }
  for (size_t k = 0; k < num_keys; ++k) {
    const auto p0 = hn::LoadU(df, p + k * row_stride);
    const auto p1 = hn::LoadU(df, p + k * row_stride + n);
    for (int i = 0; i < kDims; ++i) {
      const auto v = hn::Set(df, vf[k * head_dim + i]);
      a0[i] = hn::MulAdd(p0, v, a0[i]);
      a1[i] = hn::MulAdd(p1, v, a1[i]);
    }
  }
  for (int i = 0; i < kDims; ++i) {
    hn::StoreU(a0[i], df, ot + i * row_stride);
    hn::StoreU(a1[i], df, ot + i * row_stride + n);
  }
}

// Decodes the keys [t0, t1) of one arena into [kPrefillKeyTile][head_dim] rows, zero-padding
// to a whole number of kKeysPerStep.
template <CodecId kCodec>
void LoadTile(const KvLayerView& view, const KvArenaView& arena, int kv_head, int t0, int t1,
              float* HWY_RESTRICT tile) {
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  view.ForEachRun(t0, t1, [&](int logical, int count, int32_t block_id, int row) {
    const std::byte* src = arena.Row(block_id, row, kv_head);
    float* dst = tile + static_cast<size_t>(logical - t0) * head_dim;
    for (int r = 0; r < count; ++r, src += arena.unit_bytes, dst += head_dim) {
      ConvertRow<kCodec>(src, head_dim, dst);
    }
  });
  const int padded = (t1 - t0 + kKeysPerStep - 1) / kKeysPerStep * kKeysPerStep;
  std::fill(tile + static_cast<size_t>(t1 - t0) * head_dim,
            tile + static_cast<size_t>(padded) * head_dim, 0.0f);
}

template <CodecId kK, CodecId kV>
void PrefillImpl(const KvLayerView& view, const float* q, int num_queries,
                 const AttentionParams& params, float* out, ThreadPool* pool) {
  const DF df;
  const size_t n = hn::Lanes(df);
  const int group = params.num_heads / view.num_kv_heads;
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  const int first_query_pos = view.num_tokens - num_queries;
  // About four row vectors' worth of rows per tile, but at least one query.
  const int queries_per_tile = std::max(1, static_cast<int>(4 * n) / group);
  const int num_tiles = (num_queries + queries_per_tile - 1) / queries_per_tile;
  const size_t row_block = 2 * n;
  const size_t row_stride =
      (static_cast<size_t>(queries_per_tile) * group + row_block - 1) / row_block * row_block;

  auto task = [&](int64_t task_idx, int /*thread_idx*/) {
    // Latest query tiles attend to the most keys: hand them out first.
    const int tile_idx = num_tiles - 1 - static_cast<int>(task_idx % num_tiles);
    const int kv_head = static_cast<int>(task_idx / num_tiles);
    const int q0 = tile_idx * queries_per_tile;
    const int q1 = std::min(num_queries, q0 + queries_per_tile);
    const int num_rows = (q1 - q0) * group;

    float* qt =
        Scratch(row_stride * (2 * head_dim + kPrefillKeyTile + 4) + 2 * kPrefillKeyTile * head_dim);
    float* ot = qt + head_dim * row_stride;              // [head_dim][row_stride]
    float* st = ot + head_dim * row_stride;              // [kPrefillKeyTile][row_stride]
    float* row_max = st + kPrefillKeyTile * row_stride;  // [row_stride]
    float* row_sum = row_max + row_stride;               // [row_stride]
    float* alpha = row_sum + row_stride;                 // [row_stride]
    float* row_limit = alpha + row_stride;               // [row_stride] last allowed key
    float* kf = row_limit + row_stride;                  // [kPrefillKeyTile][head_dim]
    float* vf = kf + kPrefillKeyTile * head_dim;         // [kPrefillKeyTile][head_dim]

    for (size_t r = 0; r < row_stride; ++r) {
      // Padding rows repeat the tile's last query so that their softmax stays finite.
      const int qi = std::min(static_cast<int>(r) / group, q1 - q0 - 1);
      const int j = static_cast<int>(r) % group;
      const bool real = static_cast<int>(r) < num_rows;
      const float* qrow =
          q + (static_cast<size_t>(q0 + qi) * params.num_heads + kv_head * group + j) * head_dim;
      for (size_t i = 0; i < head_dim; ++i) {
        qt[i * row_stride + r] = real ? qrow[i] * params.scale : 0.0f;
        ot[i * row_stride + r] = 0.0f;
      }
      row_max[r] = kNegInf;
      row_sum[r] = 0.0f;
      row_limit[r] = static_cast<float>(first_query_pos + q0 + qi);
    }
    const int min_limit = first_query_pos + q0;
    const int num_keys_total = first_query_pos + q1;  // the tile's last query sees these

    for (int t0 = 0; t0 < num_keys_total; t0 += kPrefillKeyTile) {
      const int t1 = std::min(num_keys_total, t0 + kPrefillKeyTile);
      const size_t num_keys = static_cast<size_t>(t1 - t0);
      const size_t num_steps = (num_keys + kKeysPerStep - 1) / kKeysPerStep;
      LoadTile<kK>(view, view.k, kv_head, t0, t1, kf);
      LoadTile<kV>(view, view.v, kv_head, t0, t1, vf);
      // Only the diagonal tiles hold keys past some row's causal limit. (The zero-padded keys
      // of a short last tile are scored but never read.)
      const bool masked = t1 - 1 > min_limit;
      for (size_t rb = 0; rb < row_stride; rb += row_block) {
        for (size_t step = 0; step < num_steps; ++step) {
          ScoreStep(qt + rb, kf + step * kKeysPerStep * head_dim, head_dim, row_stride,
                    st + step * kKeysPerStep * row_stride + rb);
        }
        for (size_t h = 0; h < row_block; h += n) {
          const size_t r = rb + h;
          if (masked) {
            const auto limit = hn::LoadU(df, row_limit + r);
            for (size_t k = 0; k < num_keys; ++k) {
              float* s = st + k * row_stride + r;
              const auto pos = hn::Set(df, static_cast<float>(t0 + static_cast<int>(k)));
              hn::StoreU(hn::IfThenElse(hn::Gt(pos, limit), hn::Set(df, kNegInf), hn::LoadU(df, s)),
                         df, s);
            }
          }
          auto vmax = hn::LoadU(df, row_max + r);
          const auto old_max = vmax;
          for (size_t k = 0; k < num_keys; ++k) {
            vmax = hn::Max(vmax, hn::LoadU(df, st + k * row_stride + r));
          }
          auto vsum = hn::Zero(df);
          for (size_t k = 0; k < num_keys; ++k) {
            float* s = st + k * row_stride + r;
            const auto p = hn::Exp(df, hn::Sub(hn::LoadU(df, s), vmax));
            hn::StoreU(p, df, s);
            vsum = hn::Add(vsum, p);
          }
          // Exp(-inf) == 0: the first tile starts the accumulator from nothing.
          const auto va = hn::Exp(df, hn::Sub(old_max, vmax));
          hn::StoreU(va, df, alpha + r);
          hn::StoreU(hn::MulAdd(hn::LoadU(df, row_sum + r), va, vsum), df, row_sum + r);
          hn::StoreU(vmax, df, row_max + r);
        }
        size_t i = 0;
        for (; i + 4 <= head_dim; i += 4) {
          AccumulateStep<4>(st + rb, vf + i, num_keys, head_dim, row_stride, alpha + rb,
                            ot + i * row_stride + rb);
        }
        for (; i < head_dim; ++i) {
          AccumulateStep<1>(st + rb, vf + i, num_keys, head_dim, row_stride, alpha + rb,
                            ot + i * row_stride + rb);
        }
      }
    }

    for (int r = 0; r < num_rows; ++r) {
      const int qi = r / group;
      const int j = r % group;
      float* orow =
          out + (static_cast<size_t>(q0 + qi) * params.num_heads + kv_head * group + j) * head_dim;
      const float inv = 1.0f / row_sum[r];
      for (size_t i = 0; i < head_dim; ++i) orow[i] = ot[i * row_stride + r] * inv;
    }
  };

  const int64_t num_tasks = static_cast<int64_t>(view.num_kv_heads) * num_tiles;
  if (pool == nullptr || num_tasks == 1) {
    for (int64_t t = 0; t < num_tasks; ++t) task(t, 0);
  } else {
    pool->Run(num_tasks, task);
  }
}

// ---------------------------------------------------------------------------------------------
// Entry: the one runtime switch over the codec pair (and, for decode, the vector width).

template <CodecId kK, CodecId kV>
void AttentionFor(const KvLayerView& view, const float* q, int num_queries,
                  const AttentionParams& params, float* out, ThreadPool* pool) {
  if (num_queries > 1) return PrefillImpl<kK, kV>(view, q, num_queries, params, out, pool);
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  const DF df;
  if (head_dim % hn::Lanes(df) == 0) return DecodeImpl<kK, kV>(df, view, q, params, out, pool);
  if (head_dim % 4 == 0) {
    return DecodeImpl<kK, kV>(hn::CappedTag<float, 4>(), view, q, params, out, pool);
  }
  DecodeImpl<kK, kV>(hn::CappedTag<float, 1>(), view, q, params, out, pool);
}

template <CodecId kK>
void AttentionForKey(const KvLayerView& view, const float* q, int num_queries,
                     const AttentionParams& params, float* out, ThreadPool* pool) {
  switch (view.v.codec) {
    case CodecId::kF32:
      return AttentionFor<kK, CodecId::kF32>(view, q, num_queries, params, out, pool);
    case CodecId::kF16:
      return AttentionFor<kK, CodecId::kF16>(view, q, num_queries, params, out, pool);
    case CodecId::kBF16:
      return AttentionFor<kK, CodecId::kBF16>(view, q, num_queries, params, out, pool);
  }
  KVS_CHECK(false && "unknown value codec");
}

}  // namespace

void AttentionKernel(const KvLayerView& view, const float* q, int num_queries,
                     const AttentionParams& params, float* out, ThreadPool* pool) {
  switch (view.k.codec) {
    case CodecId::kF32:
      return AttentionForKey<CodecId::kF32>(view, q, num_queries, params, out, pool);
    case CodecId::kF16:
      return AttentionForKey<CodecId::kF16>(view, q, num_queries, params, out, pool);
    case CodecId::kBF16:
      return AttentionForKey<CodecId::kBF16>(view, q, num_queries, params, out, pool);
  }
  KVS_CHECK(false && "unknown key codec");
}

}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvstack {

HWY_EXPORT(AttentionKernel);

void Attention(const KvLayerView& view, const float* q, int num_queries,
               const AttentionParams& params, float* out, ThreadPool* pool) {
  KVS_CHECK(view.num_kv_heads > 0 && view.head_dim > 0);
  KVS_CHECK(params.num_heads > 0 && params.num_heads % view.num_kv_heads == 0);
  KVS_CHECK(0 <= num_queries && num_queries <= view.num_tokens);
  if (num_queries == 0) return;
  HWY_DYNAMIC_DISPATCH(AttentionKernel)(view, q, num_queries, params, out, pool);
}

}  // namespace kvstack
#endif  // HWY_ONCE
