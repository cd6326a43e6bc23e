// The scaled codecs' scale search (contract in scale_search.h): the scalar reference, and a
// Highway version compiled per target with runtime dispatch that scores every candidate in
// one pass over the row.
//
// Why lanes hold candidates, not elements: the reference sums each candidate's error in
// eight partial sums (partial l takes elements c = l mod 8, in order, then partials 0..7 are
// added). With one candidate per lane and eight accumulators, each lane repeats exactly that
// order whatever the vector width, so the errors, and hence the pick, are the reference's
// bit for bit, on every target.
//
// Bit-exactness also needs each element's error to come out of the same roundings:
// y = x / s, q = Round(y) (fp8.h, quant.h), t = q * s, e = t - x, e * e. What the Highway
// version does differently, and why it is still exact:
// - x / s was most of the time (a vector division per 16 candidates is ~10 cycles). On FMA
//   targets it is q0 = x * r, r = 1 / s, then one correction q0 + (x - q0 * s) * r, both
//   fused: that equals x / s, correctly rounded, for every F32 x and every F16 s (checked
//   exhaustively, all 2^23 x significands against all 2^10 F16 significands; exponents only
//   shift both) as long as nothing underflows, so rows with an element below 2^-64 divide.
// - t - x is one fused multiply-subtract: q * s is exact (q has at most 8 significant bits,
//   s 11), so rounding it first changes nothing. That needs |x / s| within the grid, so a
//   row whose scale F16 cannot hold (absmax above 65504 * FMAX) divides too.
// - The fp8 rounding drops the sign of a zero result: q enters only as q * s - x, whose
//   square does not depend on it.
// This file is compiled without floating-point contraction (CMakeLists.txt): GCC would
// otherwise fuse other multiplies and adds on FMA targets, which the reference cannot.
#include "represent/scale_search.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "kvstack/check.h"
#include "kvstack/numeric.h"
#include "represent/fp8.h"

// Shared by the reference and every target, so once (foreach_target.h includes this file
// again per target).
#ifndef KVS_REPRESENT_SCALE_SEARCH_ONCE_
#define KVS_REPRESENT_SCALE_SEARCH_ONCE_
namespace kvstack::scale_search_internal {

// A grid: the largest code (the plain scale maps the absmax there), the smallest scale the
// target is halved to reach (fp8 scales stay F16 normals, see scaled_codec.cc), and
// Round(y) == Decode(Encode(y)) for finite |y| <= kMax.
struct Int8Grid {
  static constexpr float kMax = 127.0f;
  static constexpr float kMinScale = 0.0f;
  static float Round(float y) { return quant::RoundHalfEven(y); }
};

template <typename Format>
struct Fp8Grid {
  using Fp8 = Format;
  static constexpr float kMax = Format::kMaxFinite;
  static constexpr float kMinScale = 0x1p-14f;  // F16's smallest normal
  static float Round(float y) { return Format::RoundInRange(y); }
};

using E4M3Grid = Fp8Grid<fp8_internal::E4M3>;
using E5M2Grid = Fp8Grid<fp8_internal::E5M2>;

inline constexpr int kMaxHeadDim = 4096;  // ResolveCodecFormat's bound

// 2^(j / K), j < K: the candidates' factors over the plain scale.
inline const std::array<float, kScaleCandidates>& Steps() {
  static const std::array<float, kScaleCandidates> steps = [] {
    std::array<float, kScaleCandidates> s;
    for (int j = 0; j < kScaleCandidates; ++j) {
      s[j] = std::exp2(static_cast<float>(j) / kScaleCandidates);
    }
    return s;
  }();
  return steps;
}

// absmax / target: the plain scale before its F16 rounding.
template <class Grid>
float PlainFloor(float absmax) {
  float target = Grid::kMax;
  while (target > 1.0f && absmax / target < Grid::kMinScale) target *= 0.5f;
  return absmax / target;
}

// c rounded to F16 as stored, raised to the next F16 value where rounding took it below
// `floor` (absmax / target), so that the token's absmax does not saturate. Only F16's
// largest finite value cannot be raised: a token beyond 65504 * target saturates anyway.
inline quant::F16Value ScaleAtLeast(float c, float floor) {
  constexpr uint16_t kF16MaxBits = 0x7BFF;
  quant::F16Value scale = quant::RoundToF16(c);
  if (scale.value < floor && scale.bits < kF16MaxBits) {
    scale.bits = static_cast<uint16_t>(scale.bits + 1);
    scale.value = F16ToF32(scale.bits);
  }
  return scale;
}

// Every candidate, ScaleAtLeast(floor * 2^(j / K), floor) for j < K. ScaleAtLeast's F16
// conversions were a quarter of a short row's search; where every candidate is an F16
// normal (the usual case) the rounding is done on the F32 bits instead, as F32ToF16 does
// it: the mantissa rounded to 10 bits, ties to even, and one F16 step more (a carry is the
// next binade's first value) where that fell below floor.
inline void Candidates(float floor, quant::F16Value* candidates) {
  const std::array<float, kScaleCandidates>& steps = Steps();
  if (!(floor >= 0x1p-14f && floor < 32752.0f)) {  // F16 subnormals, or 65504 in reach
    for (int j = 0; j < kScaleCandidates; ++j) {
      candidates[j] = ScaleAtLeast(floor * steps[j], floor);
    }
    return;
  }
  for (int j = 0; j < kScaleCandidates; ++j) {
    const uint32_t bits = std::bit_cast<uint32_t>(floor * steps[j]);
    uint32_t rounded = (bits + 0xFFFu + ((bits >> 13) & 1u)) & ~0x1FFFu;
    if (std::bit_cast<float>(rounded) < floor) rounded += 0x2000u;
    candidates[j].bits = static_cast<uint16_t>((rounded >> 13) - (112u << 10));
    candidates[j].value = std::bit_cast<float>(rounded);
  }
}

}  // namespace kvstack::scale_search_internal
#endif  // KVS_REPRESENT_SCALE_SEARCH_ONCE_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "represent/scale_search.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Order matters: foreach_target.h must come before highway.h.
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvstack {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using namespace scale_search_internal;  // NOLINT: the shared helpers, in every target

// x86 targets from AVX2 have FMA (Highway's MulAdd elsewhere may be two roundings).
constexpr bool kHasFma = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2;

// Grid::Round on every lane (fp8: but for the sign of a zero result, see the top).
template <class Grid, class D>
HWY_INLINE hn::Vec<D> RoundToGrid(D d, hn::Vec<D> y) {
  if constexpr (std::is_same_v<Grid, Int8Grid>) {
    const auto magic = hn::Set(d, 0x1.8p23f);  // quant::RoundHalfEven's
    return hn::Sub(hn::Add(y, magic), magic);
  } else {
    using Fp8 = typename Grid::Fp8;
    const hn::RebindToUnsigned<D> du;
    const auto exp_bits = hn::Max(hn::And(hn::BitCast(du, y), hn::Set(du, Fp8::kExpMask)),
                                  hn::Set(du, Fp8::kMinNormalExpBits));
    const auto magic = hn::BitCast(d, hn::Add(exp_bits, hn::Set(du, Fp8::kMagicOffset)));
    return hn::Sub(hn::Add(y, magic), magic);
  }
}

// errors[j] = the reference's squared error of the row under scales[j]. row: [padded_dim]
// finite floats, padded_dim a multiple of 8 (zeros pad: their error is +0 under every scale,
// so they change no sum). scales, errors: [kScaleCandidates], scales > 0 and not saturating
// any element. kFmaQuotient: no element is nonzero and below 2^-64, and no scale is below
// floor (see the top).
template <class Grid, bool kFmaQuotient>
void CandidateErrors(const float* HWY_RESTRICT row, size_t padded_dim,
                     const float* HWY_RESTRICT scales, float* HWY_RESTRICT errors) {
  const hn::CappedTag<float, kScaleCandidates> d;
  using V = hn::Vec<decltype(d)>;
  const size_t lanes = hn::Lanes(d);
  for (size_t j = 0; j < static_cast<size_t>(kScaleCandidates); j += lanes) {
    const V s = hn::LoadU(d, scales + j);
    const V r = hn::Div(hn::Set(d, 1.0f), s);
    auto error = [&](float x) HWY_ATTR {
      const V vx = hn::Set(d, x);
      if constexpr (kFmaQuotient) {
        const V q0 = hn::Mul(vx, r);
        const V y = hn::MulAdd(hn::NegMulAdd(q0, s, vx), r, q0);
        const V e = hn::MulSub(RoundToGrid<Grid>(d, y), s, vx);
        return hn::Mul(e, e);
      } else {
        const V e = hn::Sub(hn::Mul(RoundToGrid<Grid>(d, hn::Div(vx, s)), s), vx);
        return hn::Mul(e, e);
      }
    };
    V p0 = hn::Zero(d), p1 = hn::Zero(d), p2 = hn::Zero(d), p3 = hn::Zero(d);
    V p4 = hn::Zero(d), p5 = hn::Zero(d), p6 = hn::Zero(d), p7 = hn::Zero(d);
    for (size_t c = 0; c < padded_dim; c += 8) {
      p0 = hn::Add(p0, error(row[c + 0]));
      p1 = hn::Add(p1, error(row[c + 1]));
      p2 = hn::Add(p2, error(row[c + 2]));
      p3 = hn::Add(p3, error(row[c + 3]));
      p4 = hn::Add(p4, error(row[c + 4]));
      p5 = hn::Add(p5, error(row[c + 5]));
      p6 = hn::Add(p6, error(row[c + 6]));
      p7 = hn::Add(p7, error(row[c + 7]));
    }
    // Partials added 0..7 from the left, as the reference does.
    V sum = hn::Add(p0, p1);
    sum = hn::Add(sum, p2);
    sum = hn::Add(sum, p3);
    sum = hn::Add(sum, p4);
    sum = hn::Add(sum, p5);
    sum = hn::Add(sum, p6);
    sum = hn::Add(sum, p7);
    hn::StoreU(sum, d, errors + j);
  }
}

// Copies row[0, n) to padded[0, roundup(n, 8)) with non-finite elements and the padding 0;
// returns the finite absmax and whether some element is nonzero and below 2^-64.
HWY_INLINE float PadRow(const float* HWY_RESTRICT row, size_t n, float* HWY_RESTRICT padded,
                        bool* has_tiny) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const auto kFinite = hn::Set(d, FLT_MAX), kTiny = hn::Set(d, 0x1p-64f);
  auto absmax = hn::Zero(d);
  auto tiny = hn::FirstN(d, 0);
  size_t c = 0;
  for (; c + lanes <= n; c += lanes) {
    const auto x = hn::LoadU(d, row + c);
    const auto finite = hn::IfThenElseZero(hn::Le(hn::Abs(x), kFinite), x);  // NaN: false
    const auto mag = hn::Abs(finite);
    absmax = hn::Max(absmax, mag);
    tiny = hn::Or(tiny, hn::And(hn::Lt(mag, kTiny), hn::Gt(mag, hn::Zero(d))));
    hn::StoreU(finite, d, padded + c);
  }
  float result = hn::GetLane(hn::MaxOfLanes(d, absmax));
  bool any_tiny = !hn::AllFalse(d, tiny);
  for (; c < n; ++c) {
    const float finite = std::fabs(row[c]) <= FLT_MAX ? row[c] : 0.0f;
    const float mag = std::fabs(finite);
    result = std::max(result, mag);
    any_tiny |= mag < 0x1p-64f && mag > 0.0f;
    padded[c] = finite;
  }
  for (; c % 8 != 0; ++c) padded[c] = 0.0f;
  *has_tiny = any_tiny;
  return result;
}

// Fills candidates and errors[j] (their squared errors) for row[0, n); false (and nothing
// scored) when the plain scale is 0.
template <class Grid>
bool ScoreCandidates(const float* HWY_RESTRICT row, size_t n, quant::F16Value* candidates,
                     float* HWY_RESTRICT errors) {
  alignas(64) float padded[kMaxHeadDim];
  bool has_tiny;
  const float absmax = PadRow(row, n, padded, &has_tiny);
  const float floor = PlainFloor<Grid>(absmax);
  Candidates(floor, candidates);
  if (!(candidates[0].value > 0.0f)) return false;
  alignas(64) float scales[kScaleCandidates];
  for (int j = 0; j < kScaleCandidates; ++j) scales[j] = candidates[j].value;
  const size_t padded_dim = (n + 7) / 8 * 8;
  // Fused only where it is exact (see the top): no tiny element, and no scale that F16 had
  // to clamp below floor (then x / s exceeds the grid and q * s is not exact).
  if (kHasFma && !has_tiny && candidates[0].value >= floor) {
    CandidateErrors<Grid, kHasFma>(padded, padded_dim, scales, errors);
  } else {
    CandidateErrors<Grid, false>(padded, padded_dim, scales, errors);
  }
  return true;
}

template <class Grid>
quant::F16Value SearchFor(const float* HWY_RESTRICT row, size_t n) {
  quant::F16Value candidates[kScaleCandidates];
  alignas(64) float errors[kScaleCandidates];
  if (!ScoreCandidates<Grid>(row, n, candidates, errors)) return candidates[0];
  // The reference's pick: the first least error (repeated candidates score the same, so
  // scoring them changes nothing; nor does going on past an exact fit: no error is below 0).
  int best = 0;
  for (int j = 1; j < kScaleCandidates; ++j) {
    if (errors[j] < errors[best]) best = j;
  }
  return candidates[best];
}

}  // namespace

// ChooseScale(grid, row[0, n), ScaleSearch::kSimd); n <= kMaxHeadDim.
quant::F16Value SearchScale(ScaledGrid grid, const float* HWY_RESTRICT row, size_t n) {
  switch (grid) {
    case ScaledGrid::kInt8:
      return SearchFor<Int8Grid>(row, n);
    case ScaledGrid::kFp8E4M3:
      return SearchFor<E4M3Grid>(row, n);
    case ScaledGrid::kFp8E5M2:
      return SearchFor<E5M2Grid>(row, n);
  }
  return {};
}

// ScaleCandidateErrors(grid, row[0, n), kSimd, errors).
void CandidateErrorsOf(ScaledGrid grid, const float* HWY_RESTRICT row, size_t n,
                       float* HWY_RESTRICT errors) {
  quant::F16Value candidates[kScaleCandidates];
  bool scored = false;
  switch (grid) {
    case ScaledGrid::kInt8:
      scored = ScoreCandidates<Int8Grid>(row, n, candidates, errors);
      break;
    case ScaledGrid::kFp8E4M3:
      scored = ScoreCandidates<E4M3Grid>(row, n, candidates, errors);
      break;
    case ScaledGrid::kFp8E5M2:
      scored = ScoreCandidates<E5M2Grid>(row, n, candidates, errors);
      break;
  }
  if (!scored) std::fill(errors, errors + kScaleCandidates, 0.0f);
}

}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvstack {

HWY_EXPORT(SearchScale);
HWY_EXPORT(CandidateErrorsOf);

namespace {

using namespace scale_search_internal;  // NOLINT: the shared helpers

// The reference's per-element error. Non-finite elements count as 0, whose error is 0 under
// every scale.
template <class Grid>
float ElementError(float x, float scale) {
  const float finite = std::fabs(x) <= FLT_MAX ? x : 0.0f;  // NaN compares false
  const float d = Grid::Round(finite / scale) * scale - finite;
  return d * d;
}

// Sum of (decoded - x)^2 over the row's finite elements under a stored scale > 0 that does
// not saturate them (so Round is Decode(Encode)). Eight partial sums let the compiler
// vectorise the loop without reassociating one float sum; partial l takes the elements
// c = l mod 8 (the order the Highway version reproduces per lane).
template <class Grid>
float SquaredError(std::span<const float> row, float scale) {
  constexpr size_t kLanes = 8;
  std::array<float, kLanes> partial{};
  size_t c = 0;
  for (; c + kLanes <= row.size(); c += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) partial[l] += ElementError<Grid>(row[c + l], scale);
  }
  for (size_t l = 0; c < row.size(); ++c, ++l) partial[l] += ElementError<Grid>(row[c], scale);
  float error = 0.0f;
  for (const float p : partial) error += p;
  return error;
}

// The reference: candidate by candidate, keeping the first with the least error, and
// stopping at an exact fit.
template <class Grid>
quant::F16Value SearchScalar(std::span<const float> row) {
  const float floor = PlainFloor<Grid>(quant::FiniteAbsMax(row.data(), row.size()));
  quant::F16Value scale = ScaleAtLeast(floor, floor);
  if (!(scale.value > 0.0f)) return scale;
  float best_error = SquaredError<Grid>(row, scale.value);
  for (int j = 1; j < kScaleCandidates && best_error > 0.0f; ++j) {
    const quant::F16Value candidate = ScaleAtLeast(floor * Steps()[j], floor);
    // Tiny or huge scales collapse to the same F16 value; F16 saturates at 65504.
    if (candidate.bits == scale.bits) continue;
    const float error = SquaredError<Grid>(row, candidate.value);
    if (error < best_error) {
      best_error = error;
      scale = candidate;
    }
  }
  return scale;
}

template <class Grid>
quant::F16Value ChooseScaleFor(ScaledGrid grid, std::span<const float> row, ScaleSearch search) {
  switch (search) {
    case ScaleSearch::kPlain: {
      const float floor = PlainFloor<Grid>(quant::FiniteAbsMax(row.data(), row.size()));
      return ScaleAtLeast(floor, floor);
    }
    case ScaleSearch::kScalar:
      return SearchScalar<Grid>(row);
    case ScaleSearch::kSimd:
      KVS_CHECK(row.size() <= static_cast<size_t>(kMaxHeadDim));
      return HWY_DYNAMIC_DISPATCH(SearchScale)(grid, row.data(), row.size());
  }
  KVS_CHECK(false && "ChooseScale: unknown ScaleSearch");
  return {};
}

// The reference's errors of every candidate, none skipped.
template <class Grid>
void ScalarCandidateErrors(std::span<const float> row, std::span<float, kScaleCandidates> errors) {
  const float floor = PlainFloor<Grid>(quant::FiniteAbsMax(row.data(), row.size()));
  std::fill(errors.begin(), errors.end(), 0.0f);
  if (!(ScaleAtLeast(floor, floor).value > 0.0f)) return;
  for (int j = 0; j < kScaleCandidates; ++j) {
    errors[j] = SquaredError<Grid>(row, ScaleAtLeast(floor * Steps()[j], floor).value);
  }
}

}  // namespace

void ScaleCandidateErrors(ScaledGrid grid, std::span<const float> row, ScaleSearch search,
                          std::span<float, kScaleCandidates> errors) {
  KVS_CHECK(search != ScaleSearch::kPlain && row.size() <= static_cast<size_t>(kMaxHeadDim));
  if (search == ScaleSearch::kSimd) {
    HWY_DYNAMIC_DISPATCH(CandidateErrorsOf)(grid, row.data(), row.size(), errors.data());
    return;
  }
  switch (grid) {
    case ScaledGrid::kInt8:
      return ScalarCandidateErrors<Int8Grid>(row, errors);
    case ScaledGrid::kFp8E4M3:
      return ScalarCandidateErrors<E4M3Grid>(row, errors);
    case ScaledGrid::kFp8E5M2:
      return ScalarCandidateErrors<E5M2Grid>(row, errors);
  }
}

quant::F16Value ChooseScale(ScaledGrid grid, std::span<const float> row, ScaleSearch search) {
  switch (grid) {
    case ScaledGrid::kInt8:
      return ChooseScaleFor<Int8Grid>(grid, row, search);
    case ScaledGrid::kFp8E4M3:
      return ChooseScaleFor<E4M3Grid>(grid, row, search);
    case ScaledGrid::kFp8E5M2:
      return ChooseScaleFor<E5M2Grid>(grid, row, search);
  }
  KVS_CHECK(false && "ChooseScale: unknown ScaledGrid");
  return {};
}

}  // namespace kvstack
#endif  // HWY_ONCE
