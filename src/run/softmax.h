// The attention kernels' softmax exponential (ExpOfScore in run/softmax-inl.h) as a function
// with runtime dispatch, so that its test can hold every SIMD target to its error bound.
#pragma once

#include <cstddef>

namespace kvstack {

// out[i] = e^x[i] for i < n, as the decode, prefill and low-rank kernels compute their softmax
// weights, at the best target of this CPU (hwy::SetSupportedTargetsForTest picks another).
// Contract (ExpOfScore): within 2 ULP of e^x for -87 <= x <= 88, 0 below -87 and for -inf; NaN
// and +inf give unspecified values. out may alias x.
void ExpOfScores(const float* x, size_t n, float* out);

}  // namespace kvstack
