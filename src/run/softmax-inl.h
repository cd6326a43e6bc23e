// Per-target softmax rules every attention kernel shares (decode, prefill, low-rank), included
// inside their hwy/foreach_target.h pass: the infinities, which scores make a head's output NaN,
// and a row's largest score. The include guard toggles per target, as Highway's -inl.h headers
// do.

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

}  // namespace
}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#endif  // KVSTACK_RUN_SOFTMAX_INL_H_
