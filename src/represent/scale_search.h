// How the int8 and fp8 codecs (scaled_codec.cc) choose each token's F16 scale. The plain
// scale is absmax / target (target = the grid's largest code, for fp8 halved until the scale
// is an F16 normal), rounded UP to F16 so that the absmax never saturates. The search tries
// kScaleCandidates scales over one octave from there, plain * 2^(j / K) rounded likewise,
// and keeps the first whose decoded row has the least squared error (where the row falls
// between the codes depends on the scale; see scaled_codec.cc for what it buys).
//
// The search has two implementations: a scalar one, candidate by candidate (the reference),
// and a Highway one that scores every candidate in one pass over the row (lanes hold
// candidates) with runtime dispatch, which the codecs use. The Highway one computes each
// candidate's error with the same float operations in the same order, so it picks bit for
// bit the scale the reference picks (scale_search_test.cc).
#pragma once

#include <memory>
#include <span>
#include <string_view>

#include "kvstack/codec.h"
#include "kvstack/status.h"
#include "represent/quant.h"

namespace kvstack {

// The code grids of the scaled codecs: the integers -127..127, and the two fp8 formats.
enum class ScaledGrid { kInt8, kFp8E4M3, kFp8E5M2 };

// How a token's scale is chosen.
enum class ScaleSearch {
  kPlain,   // the plain scale, no search: the reference cost in benchmarks
  kScalar,  // the search, one candidate at a time: the reference kSimd is tested against
  kSimd,    // the search, all candidates per pass (Highway): what CreateCodec's codecs use
};

// Candidate scales per token. The ΔPPL of E4M3 keys and values (stories260K, ctx 512) against
// K: 1: +1.95 %, 8: +1.28 %, 16: +0.97 %, 32: +0.80 %, 64: +0.75 %; int8's mean KL falls
// from 1.5e-3 to 1.0e-3 at 32. 32 leaves E4M3 a margin under the 1 % target; 64 would double
// the cost for little more. A multiple of every vector's float lanes (up to 16).
inline constexpr int kScaleCandidates = 32;

// The F16 scale a scaled codec stores for one token. row: [head_dim] floats, any values
// (non-finite elements are ignored; head_dim 1..4096). Returns scale 0 (bits 0) when the
// row's finite absmax is 0 or too small for F16. Never below the plain scale, so the absmax
// does not saturate unless F16 cannot hold the scale it needs (above 65504). Thread-safe.
quant::F16Value ChooseScale(ScaledGrid grid, std::span<const float> row, ScaleSearch search);

// Every candidate's squared error as `search` (kScalar or kSimd) computes it; all 0 where
// the plain scale is 0. For tests: kSimd's must equal kScalar's bit for bit, the stronger
// check (a pick rarely depends on an error's last bits). row: as ChooseScale's.
void ScaleCandidateErrors(ScaledGrid grid, std::span<const float> row, ScaleSearch search,
                          std::span<float, kScaleCandidates> errors);

// A scaled codec (int8, fp8_e4m3, fp8_e5m2) whose encoder chooses scales by `search`;
// CreateCodec's are kSimd. For tests and benchmarks that compare the three. InvalidArgument
// (one line) for the names CreateCodec rejects and for every other codec.
absl::StatusOr<std::unique_ptr<Codec>> CreateScaledCodec(std::string_view name, int head_dim,
                                                         ScaleSearch search);

}  // namespace kvstack
