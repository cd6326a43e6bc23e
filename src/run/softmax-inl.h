// Per-target softmax rules every attention kernel shares (decode, prefill, low-rank), included
// inside their hwy/foreach_target.h pass: the infinities, which scores make a head's output NaN,
// a row's largest score, and the weights' exponential. The include guard toggles per target, as
// Highway's -inl.h headers do.

#include <limits>

#if defined(KVSTACK_RUN_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVSTACK_RUN_SOFTMAX_INL_H_
#undef KVSTACK_RUN_SOFTMAX_INL_H_
#else
#define KVSTACK_RUN_SOFTMAX_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvstack {
namespace HWY_NAMESPACE {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Lanes of the scores x that make a softmax NaN, as they make AttentionReference's: NaN, and
// +inf (its exp(score - max) is exp(inf - inf)). A head with such a score has a NaN output:
// the kernels set its running state to (max +inf, sum NaN), which later tiles and the merge
// of the parts keep (exp(inf - inf) is NaN), and give the tile's keys no weight.
template <class D>
HWY_INLINE hwy::HWY_NAMESPACE::Mask<D> PoisonsSoftmax(D d, hwy::HWY_NAMESPACE::Vec<D> x) {
  namespace hn = hwy::HWY_NAMESPACE;
  return hn::Not(hn::Lt(x, hn::Set(d, kInf)));
}

// The largest of the scores x[0, n) (n a multiple of d's lanes) into *max; returns whether any
// of them makes the softmax NaN (PoisonsSoftmax), in which case *max is not meaningful.
template <class D>
HWY_INLINE bool MaxOfScores(D d, const float* HWY_RESTRICT x, size_t n, float* max) {
  namespace hn = hwy::HWY_NAMESPACE;
  auto vmax = hn::Set(d, kNegInf);
  auto poison = hn::FirstN(d, 0);  // (no lanes)
  for (size_t i = 0; i < n; i += hn::Lanes(d)) {
    const auto v = hn::LoadU(d, x + i);
    vmax = hn::Max(vmax, v);
    poison = hn::Or(poison, PoisonsSoftmax(d, v));
  }
  *max = hn::GetLane(hn::MaxOfLanes(d, vmax));
  return !hn::AllFalse(d, poison);
}

// e^x for softmax weights, x a score minus a maximum at least as large (x <= 0; -inf, the
// padding, gives 0), in 17 vector operations on AVX2 where hn::Exp takes 30 (it also handles
// NaN, +inf and x up to 104): x = n ln2 + r with |r| <= ln2 / 2, e^r by Cephes' expf
// polynomial, 2^n added to its exponent. Within 2 ULP of e^x for -87 <= x <= 88 (at most 1
// measured: tests/run/softmax_test.cc); 0 below -87, where e^x < 1.7e-38 (the row's largest
// weight is 1). NaN and +inf give unspecified values: the kernels keep such scores out
// (PoisonsSoftmax) or mask them after.
template <class D>
HWY_INLINE hwy::HWY_NAMESPACE::Vec<D> ExpOfScore(D d, hwy::HWY_NAMESPACE::Vec<D> x) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::RebindToSigned<D> di;
  const auto lowest = hn::Set(d, -87.0f);  // n >= -126 there, and e^r >= 1.4 when n = -126
  const auto xc = hn::Max(x, lowest);
  // Adding 1.5 * 2^23 rounds x log2(e) to the nearest integer n, held in the low bits.
  const auto shifter = hn::Set(d, 12582912.0f);
  const auto t = hn::MulAdd(xc, hn::Set(d, 1.44269504088896341f), shifter);
  const auto n = hn::Sub(t, shifter);
  // r = x - n ln2, with ln2 in two parts (Cody and Waite) so that n ln2 loses no bits.
  auto r = hn::NegMulAdd(n, hn::Set(d, 0.693359375f), xc);
  r = hn::NegMulAdd(n, hn::Set(d, -2.12194440e-4f), r);
  auto p = hn::Set(d, 1.9875691500e-4f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.3981999507e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 8.3334519073e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.1665795894e-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.6666665459e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 5.0000001201e-1f));
  p = hn::Add(hn::MulAdd(p, hn::Mul(r, r), r), hn::Set(d, 1.0f));  // e^r
  // 2^n: n's bits shifted into the exponent field (the shifter's own bits shift out).
  const auto scaled =
      hn::BitCast(d, hn::Add(hn::BitCast(di, p), hn::ShiftLeft<23>(hn::BitCast(di, t))));
  return hn::IfThenZeroElse(hn::Lt(x, lowest), scaled);
}

}  // namespace
}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#endif  // KVSTACK_RUN_SOFTMAX_INL_H_
