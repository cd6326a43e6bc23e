// ExpOfScores: run/softmax-inl.h's ExpOfScore over an array, per target with runtime dispatch.

#include "run/softmax.h"

#include <algorithm>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "run/softmax.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Order matters: foreach_target.h must come before highway.h.
#include "hwy/highway.h"
#include "run/softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvstack {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

void ExpOfScoresImpl(const float* x, size_t n, float* out) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(ExpOfScore(d, hn::LoadU(d, x + i)), d, out + i);
  if (i < n) {  // the tail through a padded vector, so that it takes the same lanes' path
    HWY_ALIGN float tail[hn::MaxLanes(d)] = {};
    std::copy(x + i, x + n, tail);
    hn::Store(ExpOfScore(d, hn::Load(d, tail)), d, tail);
    std::copy(tail, tail + (n - i), out + i);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvstack {

HWY_EXPORT(ExpOfScoresImpl);

void ExpOfScores(const float* x, size_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(ExpOfScoresImpl)(x, n, out);
}

}  // namespace kvstack
#endif  // HWY_ONCE
