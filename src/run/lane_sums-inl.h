// Per-target horizontal sums the attention kernels share (decode readers, low-rank scan),
// included inside their hwy/foreach_target.h pass: four vectors' lane sums for the price of
// about one. The include guard toggles per target, as Highway's -inl.h headers do.

#if defined(KVSTACK_RUN_LANE_SUMS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVSTACK_RUN_LANE_SUMS_INL_H_
#undef KVSTACK_RUN_LANE_SUMS_INL_H_
#else
#define KVSTACK_RUN_LANE_SUMS_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvstack {
namespace HWY_NAMESPACE {
namespace {

#if HWY_TARGET != HWY_SCALAR
// Stores the sum of the 128-bit blocks of v (4 lanes each) to out[0, 4).
// (The one-lane HWY_SCALAR target has no block operations; it never needs them.)
template <class D, class V>
HWY_INLINE void StoreSumOfBlocks(D d, V v, float* HWY_RESTRICT out) {
  namespace hn = hwy::HWY_NAMESPACE;
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    StoreSumOfBlocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)), out);
  } else {
    hn::StoreU(v, d, out);
  }
}
#endif

// out[0, 4) = the lane sums of a, b, c, e, by transposing pairs of lanes within each 128-bit
// block and adding the blocks (vectors of fewer than 4 lanes sum each vector alone).
template <class D, class V>
HWY_INLINE void SumOfLanes4(D d, V a, V b, V c, V e, float* HWY_RESTRICT out) {
  namespace hn = hwy::HWY_NAMESPACE;
  if constexpr (hn::MaxLanes(D()) < 4) {
    out[0] = hn::GetLane(hn::SumOfLanes(d, a));
    out[1] = hn::GetLane(hn::SumOfLanes(d, b));
    out[2] = hn::GetLane(hn::SumOfLanes(d, c));
    out[3] = hn::GetLane(hn::SumOfLanes(d, e));
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

}  // namespace
}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#endif  // KVSTACK_RUN_LANE_SUMS_INL_H_
