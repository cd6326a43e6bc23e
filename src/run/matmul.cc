// MatMul: y = x * w^T against row-major F32 or F16 weights, the bulk of the forward pass's time.
// Compiled once per SIMD target by Highway (foreach_target.h re-includes this file) and chosen
// at run time, so a baseline build uses AVX-512 where the CPU has it and AVX2 elsewhere.
//
// Every output is a dot product of a weight row with a token row, computed in a register tile of
// kTokens x kRows accumulators: one weight vector (converted from F16 once) feeds kTokens FMAs and
// one token vector feeds kRows FMAs. Decode (one token) is a GEMV that is bound by reading the
// weights, so its tile is 1 x kGemvRows: several independent rows in flight hide the FMA latency
// and give the prefetcher several streams. Column tails shorter than a vector go through a
// zero-padded copy, so any number of columns takes the same vector path.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvstack/check.h"
#include "kvstack/numeric.h"
#include "run/dense_ops.h"

// Shared by every target's code and the dispatching code below; guarded because
// foreach_target.h includes this file once per target.
#ifndef KVSTACK_RUN_MATMUL_CONSTANTS_
#define KVSTACK_RUN_MATMUL_CONSTANTS_
namespace kvstack::ops::matmul_internal {
// Rows per GEMV tile: 8 independent FMA chains cover the FMA latency on every x86 target.
constexpr int kGemvRows = 8;
}  // namespace kvstack::ops::matmul_internal
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "run/matmul.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvstack::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Register tiles. AVX-512 has 32 vector registers: 4 x 4 accumulators + 4 weights + 1 token
// fit. Narrower targets have 16, where 2 x 4 avoids spilling accumulators.
#if HWY_TARGET <= HWY_AVX3
constexpr int kTileTokens = 4;
#else
constexpr int kTileTokens = 2;
#endif
constexpr int kTileRows = 4;
using matmul_internal::kGemvRows;

// Lanes(DF()) weights from p, as F32.
HWY_INLINE VF LoadAsF32(DF df, const float* HWY_RESTRICT p) { return hn::LoadU(df, p); }
HWY_INLINE VF LoadAsF32(DF df, const hwy::float16_t* HWY_RESTRICT p) {
  return hn::PromoteTo(df, hn::LoadU(hn::Rebind<hwy::float16_t, DF>(), p));
}

// The first n < Lanes(DF()) values from p, the other lanes zero. Reading exactly n values
// matters: the tail of the last row may end at the end of a mapping.
template <typename T>
HWY_INLINE VF LoadTailAsF32(DF df, const T* HWY_RESTRICT p, size_t n) {
  alignas(64) T buf[HWY_MAX_BYTES / sizeof(float)];
  std::memset(buf, 0, sizeof(buf));
  std::memcpy(buf, p, n * sizeof(T));
  return LoadAsF32(df, buf);
}

// y[t * y_stride + r] = dot(w row r, x row t) for t < kT, r < kR. w: [kR, cols] (row stride
// cols), x: [kT, cols], y: [kT, y_stride].
template <int kT, int kR, typename WT>
HWY_INLINE void DotTile(const WT* HWY_RESTRICT w, const float* HWY_RESTRICT x, size_t cols,
                        float* HWY_RESTRICT y, size_t y_stride) {
  const DF df;
  const size_t num_lanes = hn::Lanes(df);
  VF acc[kT][kR];
  for (int t = 0; t < kT; ++t) {
    for (int r = 0; r < kR; ++r) acc[t][r] = hn::Zero(df);
  }
  size_t c = 0;
  for (; c + num_lanes <= cols; c += num_lanes) {
    VF wv[kR];
    for (int r = 0; r < kR; ++r) wv[r] = LoadAsF32(df, w + r * cols + c);
    for (int t = 0; t < kT; ++t) {
      const VF xv = hn::LoadU(df, x + t * cols + c);
      for (int r = 0; r < kR; ++r) acc[t][r] = hn::MulAdd(wv[r], xv, acc[t][r]);
    }
  }
  if (c < cols) {
    const size_t n = cols - c;
    VF wv[kR];
    for (int r = 0; r < kR; ++r) wv[r] = LoadTailAsF32(df, w + r * cols + c, n);
    for (int t = 0; t < kT; ++t) {
      const VF xv = LoadTailAsF32(df, x + t * cols + c, n);
      for (int r = 0; r < kR; ++r) acc[t][r] = hn::MulAdd(wv[r], xv, acc[t][r]);
    }
  }
  for (int t = 0; t < kT; ++t) {
    for (int r = 0; r < kR; ++r) y[t * y_stride + r] = hn::GetLane(hn::SumOfLanes(df, acc[t][r]));
  }
}

// Rows [row_begin, row_end) for kT consecutive tokens, kR rows at a time, then one at a time.
template <int kT, int kR, typename WT>
HWY_INLINE void DotRows(const WT* HWY_RESTRICT w, const float* HWY_RESTRICT x, size_t cols,
                        float* HWY_RESTRICT y, size_t rows, size_t row_begin, size_t row_end) {
  size_t r = row_begin;
  for (; r + kR <= row_end; r += kR) DotTile<kT, kR>(w + r * cols, x, cols, y + r, rows);
  for (; r < row_end; ++r) DotTile<kT, 1>(w + r * cols, x, cols, y + r, rows);
}

// w: [rows, cols]; x: [num_tokens, cols]; y: [num_tokens, rows].
template <typename WT>
void MatMulBlockT(const WT* HWY_RESTRICT w, size_t rows, size_t cols, const float* HWY_RESTRICT x,
                  float* HWY_RESTRICT y, size_t row_begin, size_t row_end, size_t token_begin,
                  size_t token_end) {
  const size_t num_tokens = token_end - token_begin;
  if (num_tokens == 1) {
    DotRows<1, kGemvRows>(w, x + token_begin * cols, cols, y + token_begin * rows, rows, row_begin,
                          row_end);
    return;
  }
  // Row tiles outside, token tiles inside: a tile's weight rows stay in L1 while every token of
  // the block passes over them.
  for (size_t r = row_begin; r < row_end; r += kTileRows) {
    const size_t r_end = std::min(r + kTileRows, row_end);
    size_t t = token_begin;
    for (; t + kTileTokens <= token_end; t += kTileTokens) {
      DotRows<kTileTokens, kTileRows>(w, x + t * cols, cols, y + t * rows, rows, r, r_end);
    }
    for (; t < token_end; ++t) {
      DotRows<1, kTileRows>(w, x + t * cols, cols, y + t * rows, rows, r, r_end);
    }
  }
}

// The per-target entry point: y[token_begin:token_end, row_begin:row_end] of MatMul.
// x: [num_tokens, w.cols]; y: [num_tokens, w.rows].
void MatMulBlock(const WeightMatrix& w, const float* x, float* y, int64_t row_begin,
                 int64_t row_end, int64_t token_begin, int64_t token_end) {
  if (w.type == WeightType::kF16) {
    MatMulBlockT(static_cast<const hwy::float16_t*>(w.data), w.rows, w.cols, x, y, row_begin,
                 row_end, token_begin, token_end);
  } else {
    MatMulBlockT(static_cast<const float*>(w.data), w.rows, w.cols, x, y, row_begin, row_end,
                 token_begin, token_end);
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace kvstack::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvstack::ops {
namespace {

HWY_EXPORT(MatMulBlock);

// Below this many multiply-adds a call runs on the caller alone. One parallel loop costs
// 0.2-0.7 us while workers spin (BM_PoolRunOverhead) and tens of us once they sleep; 128k
// multiply-adds take 2-4 us on one core, so below that splitting gains less than it risks.
constexpr int64_t kMinParallelMacs = int64_t{1} << 17;
// Parallel split granularity. Prefill: blocks of rows x tokens, small enough that two threads
// balance and a block's token rows stay in L2. Decode: row ranges of whole GEMV tiles.
constexpr int64_t kBlockRows = 32;
constexpr int64_t kBlockTokens = 16;
constexpr int64_t kGemvTasksPerThread = 4;

float WeightAt(const WeightMatrix& w, int64_t idx) {
  return w.type == WeightType::kF16 ? F16ToF32(static_cast<const uint16_t*>(w.data)[idx])
                                    : static_cast<const float*>(w.data)[idx];
}

}  // namespace

void MatMul(const WeightMatrix& w, const float* x, int num_tokens, float* y, ThreadPool* pool) {
  KVS_CHECK(w.rows >= 0 && w.cols >= 0 && num_tokens >= 0);
  KVS_CHECK(w.type == WeightType::kF32 || w.type == WeightType::kF16);
  if (num_tokens == 0 || w.rows == 0) return;
  auto* block = &HWY_DYNAMIC_DISPATCH(MatMulBlock);
  const int64_t rows = w.rows;
  const int64_t macs = rows * w.cols * num_tokens;
  if (pool == nullptr || pool->num_threads() == 1 || macs < kMinParallelMacs) {
    block(w, x, y, 0, rows, 0, num_tokens);
    return;
  }
  if (num_tokens == 1) {
    // Row ranges in whole GEMV tiles; a few per thread so a descheduled thread's share is
    // picked up by the others.
    constexpr int64_t kUnit = matmul_internal::kGemvRows;
    const int64_t num_units = (rows + kUnit - 1) / kUnit;
    const int64_t num_tasks = std::min(num_units, pool->num_threads() * kGemvTasksPerThread);
    pool->Run(num_tasks, [&](int64_t task_idx, int) {
      const int64_t begin = std::min(rows, num_units * task_idx / num_tasks * kUnit);
      const int64_t end = std::min(rows, num_units * (task_idx + 1) / num_tasks * kUnit);
      block(w, x, y, begin, end, 0, 1);
    });
    return;
  }
  const int64_t num_row_blocks = (rows + kBlockRows - 1) / kBlockRows;
  const int64_t num_token_blocks = (num_tokens + kBlockTokens - 1) / kBlockTokens;
  pool->Run(num_row_blocks * num_token_blocks, [&](int64_t task_idx, int) {
    const int64_t row_block = task_idx % num_row_blocks;
    const int64_t token_block = task_idx / num_row_blocks;
    block(w, x, y, row_block * kBlockRows, std::min(rows, (row_block + 1) * kBlockRows),
          token_block * kBlockTokens,
          std::min<int64_t>(num_tokens, (token_block + 1) * kBlockTokens));
  });
}

void MatMulReference(const WeightMatrix& w, const float* x, int num_tokens, float* y) {
  for (int t = 0; t < num_tokens; ++t) {
    for (int r = 0; r < w.rows; ++r) {
      double sum = 0.0;
      for (int c = 0; c < w.cols; ++c) {
        sum +=
            static_cast<double>(WeightAt(w, int64_t{r} * w.cols + c)) * x[int64_t{t} * w.cols + c];
      }
      y[int64_t{t} * w.rows + r] = static_cast<float>(sum);
    }
  }
}

}  // namespace kvstack::ops
#endif  // HWY_ONCE
