// Per-target softmax rules every attention kernel shares (decode, prefill, low-rank), included
// inside their hwy/foreach_target.h pass: the infinities, and which scores make a head's output
// NaN. The include guard toggles per target, as Highway's -inl.h headers do.

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

}  // namespace
}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#endif  // KVSTACK_RUN_SOFTMAX_INL_H_
