// The element-wise dense kernels of the forward pass (RMSNorm, RoPE, SwiGLU, embedding lookup)
// and their scalar references; MatMul lives in matmul.cc. Compiled once per SIMD target by
// Highway and chosen at run time. Tails shorter than a vector run the scalar formula: masked
// loads on pre-AVX2 targets read the whole vector, which could fault at the end of a buffer.
#include "run/dense_ops.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kvstack/check.h"
#include "kvstack/numeric.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "run/dense_ops.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Highway needs the order foreach_target, highway, contrib; these comments keep clang-format
// from sorting the three includes.
#include "hwy/highway.h"
// For Exp:
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvstack::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// silu(g) * u for one element; the vector loop's tail.
inline float SwiGluScalar(float g, float u) { return g / (1.0f + std::exp(-g)) * u; }

// x, weight, out: [dim].
void RmsNormImpl(const float* HWY_RESTRICT x, const float* HWY_RESTRICT weight, int dim, float eps,
                 float* out) {
  const DF df;
  const int num_lanes = static_cast<int>(hn::Lanes(df));
  // Two accumulators: the loop is latency-bound on the FMA chain otherwise.
  VF sum0 = hn::Zero(df);
  VF sum1 = hn::Zero(df);
  int i = 0;
  for (; i + 2 * num_lanes <= dim; i += 2 * num_lanes) {
    const VF x0 = hn::LoadU(df, x + i);
    const VF x1 = hn::LoadU(df, x + i + num_lanes);
    sum0 = hn::MulAdd(x0, x0, sum0);
    sum1 = hn::MulAdd(x1, x1, sum1);
  }
  for (; i + num_lanes <= dim; i += num_lanes) {
    const VF x0 = hn::LoadU(df, x + i);
    sum0 = hn::MulAdd(x0, x0, sum0);
  }
  float sum_squares = hn::GetLane(hn::SumOfLanes(df, hn::Add(sum0, sum1)));
  for (; i < dim; ++i) sum_squares += x[i] * x[i];

  const float scale = 1.0f / std::sqrt(sum_squares / static_cast<float>(dim) + eps);
  const VF vscale = hn::Set(df, scale);
  // out may alias x: each element is read before it is written.
  i = 0;
  for (; i + num_lanes <= dim; i += num_lanes) {
    hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(df, x + i), vscale), hn::LoadU(df, weight + i)), df,
               out + i);
  }
  for (; i < dim; ++i) out[i] = x[i] * scale * weight[i];
}

// x: [num_heads, head_dim]. Rotates dims [0, rope_dim) of every head with precomputed factors
// (see Rope below).
// kNormal: x'[j] = x[j] * cos_table[j] + swap_pairs(x)[j] * sin_table[j], tables of rope_dim.
// kNeox:   pairs (x[i], x[i + half]) with cos_table[i], sin_table[i], tables of rope_dim / 2.
void RopeImpl(float* HWY_RESTRICT x, int num_heads, int head_dim, int rope_dim,
              const float* HWY_RESTRICT cos_table, const float* HWY_RESTRICT sin_table,
              RopeStyle style) {
  const DF df;
  const int num_lanes = static_cast<int>(hn::Lanes(df));
  for (int head = 0; head < num_heads; ++head) {
    float* HWY_RESTRICT xh = x + int64_t{head} * head_dim;
    if (style == RopeStyle::kNormal) {
      int j = 0;
      // Vectors start at even j, so lane pairs (0,1), (2,3), ... are rotation pairs. The
      // single-lane HWY_SCALAR target has no pairs inside a vector and takes the scalar loop.
#if HWY_TARGET != HWY_SCALAR
      for (; j + num_lanes <= rope_dim; j += num_lanes) {
        const VF v = hn::LoadU(df, xh + j);
        const VF rotated = hn::MulAdd(hn::Shuffle2301(v), hn::LoadU(df, sin_table + j),
                                      hn::Mul(v, hn::LoadU(df, cos_table + j)));
        hn::StoreU(rotated, df, xh + j);
      }
#endif
      for (; j < rope_dim; j += 2) {
        const float x0 = xh[j];
        const float x1 = xh[j + 1];
        xh[j] = x0 * cos_table[j] + x1 * sin_table[j];
        xh[j + 1] = x1 * cos_table[j + 1] + x0 * sin_table[j + 1];
      }
    } else {
      const int half = rope_dim / 2;
      int i = 0;
      for (; i + num_lanes <= half; i += num_lanes) {
        const VF x0 = hn::LoadU(df, xh + i);
        const VF x1 = hn::LoadU(df, xh + half + i);
        const VF c = hn::LoadU(df, cos_table + i);
        const VF s = hn::LoadU(df, sin_table + i);
        hn::StoreU(hn::NegMulAdd(x1, s, hn::Mul(x0, c)), df, xh + i);
        hn::StoreU(hn::MulAdd(x0, s, hn::Mul(x1, c)), df, xh + half + i);
      }
      for (; i < half; ++i) {
        const float x0 = xh[i];
        const float x1 = xh[half + i];
        xh[i] = x0 * cos_table[i] - x1 * sin_table[i];
        xh[half + i] = x0 * sin_table[i] + x1 * cos_table[i];
      }
    }
  }
}

void SwiGluImpl(float* HWY_RESTRICT gate, const float* HWY_RESTRICT up, int n) {
  const DF df;
  const int num_lanes = static_cast<int>(hn::Lanes(df));
  const VF one = hn::Set(df, 1.0f);
  // hn::Exp is valid up to +104; exp(88) already makes silu(g) = g / (1 + exp(-g)) round to a
  // denormal, so clamping -g there changes nothing that float can represent usefully.
  const VF max_exponent = hn::Set(df, 88.0f);
  int i = 0;
  for (; i + num_lanes <= n; i += num_lanes) {
    const VF g = hn::LoadU(df, gate + i);
    const VF e = hn::Exp(df, hn::Min(hn::Neg(g), max_exponent));
    const VF silu = hn::Div(g, hn::Add(one, e));
    hn::StoreU(hn::Mul(silu, hn::LoadU(df, up + i)), df, gate + i);
  }
  for (; i < n; ++i) gate[i] = SwiGluScalar(gate[i], up[i]);
}

// in: [n] IEEE half bits; out: [n].
void F16RowToF32(const uint16_t* HWY_RESTRICT in, int n, float* HWY_RESTRICT out) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> df16;
  const int num_lanes = static_cast<int>(hn::Lanes(df));
  const auto* in16 = reinterpret_cast<const hwy::float16_t*>(in);
  int i = 0;
  for (; i + num_lanes <= n; i += num_lanes) {
    hn::StoreU(hn::PromoteTo(df, hn::LoadU(df16, in16 + i)), df, out + i);
  }
  for (; i < n; ++i) out[i] = F16ToF32(in[i]);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace kvstack::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvstack::ops {
namespace {

HWY_EXPORT(RmsNormImpl);
HWY_EXPORT(RopeImpl);
HWY_EXPORT(SwiGluImpl);
HWY_EXPORT(F16RowToF32);

// Rope keeps its per-dim factors on the stack; real models rotate at most a few hundred dims.
constexpr int kMaxRopeDim = 1024;

void CheckRopeArgs(int num_heads, int head_dim, int rope_dim) {
  KVS_CHECK(num_heads >= 0 && head_dim >= 0);
  KVS_CHECK(rope_dim >= 0 && rope_dim % 2 == 0 && rope_dim <= head_dim);
}

// theta_i = pos * freq_base^(-2i/rope_dim), computed in double. llama.cpp computes it in float
// as theta_scale^i * pos with theta_scale = powf(freq_base, -2/n_dims), accumulating the power
// by repeated multiplication; at pos 16k+ its angles are off by ~1e-3 rad and more. Ours are
// exact to double rounding, so both match at short positions and ours is closer to the model's
// training-time (exact) rotation at long ones.
double RopeAngle(int pos, float freq_base, int pair_idx, int rope_dim) {
  return pos * std::pow(static_cast<double>(freq_base), -2.0 * pair_idx / rope_dim);
}

}  // namespace

void RmsNorm(const float* x, const float* weight, int dim, float eps, float* out) {
  KVS_CHECK(dim > 0);
  HWY_DYNAMIC_DISPATCH(RmsNormImpl)(x, weight, dim, eps, out);
}

void RmsNormReference(const float* x, const float* weight, int dim, float eps, float* out) {
  double sum_squares = 0.0;
  for (int i = 0; i < dim; ++i) sum_squares += static_cast<double>(x[i]) * x[i];
  const double scale = 1.0 / std::sqrt(sum_squares / dim + eps);
  for (int i = 0; i < dim; ++i) out[i] = static_cast<float>(x[i] * scale * weight[i]);
}

void Rope(float* x, int num_heads, int head_dim, int rope_dim, int pos, float freq_base,
          RopeStyle style) {
  CheckRopeArgs(num_heads, head_dim, rope_dim);
  KVS_CHECK(rope_dim <= kMaxRopeDim);
  if (rope_dim == 0 || num_heads == 0) return;
  // The angles depend only on the dim, not on the head: compute them once per call.
  alignas(64) float cos_table[kMaxRopeDim];
  alignas(64) float sin_table[kMaxRopeDim];
  const int half = rope_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double theta = RopeAngle(pos, freq_base, i, rope_dim);
    const float c = static_cast<float>(std::cos(theta));
    const float s = static_cast<float>(std::sin(theta));
    if (style == RopeStyle::kNormal) {
      // Per dim, laid out for x'[j] = x[j] * cos[j] + x[j ^ 1] * sin[j].
      cos_table[2 * i] = c;
      cos_table[2 * i + 1] = c;
      sin_table[2 * i] = -s;
      sin_table[2 * i + 1] = s;
    } else {
      cos_table[i] = c;
      sin_table[i] = s;
    }
  }
  HWY_DYNAMIC_DISPATCH(RopeImpl)(x, num_heads, head_dim, rope_dim, cos_table, sin_table, style);
}

void RopeReference(float* x, int num_heads, int head_dim, int rope_dim, int pos, float freq_base,
                   RopeStyle style) {
  CheckRopeArgs(num_heads, head_dim, rope_dim);
  const int half = rope_dim / 2;
  for (int head = 0; head < num_heads; ++head) {
    float* xh = x + int64_t{head} * head_dim;
    for (int i = 0; i < half; ++i) {
      const double theta = RopeAngle(pos, freq_base, i, rope_dim);
      const int idx0 = style == RopeStyle::kNormal ? 2 * i : i;
      const int idx1 = style == RopeStyle::kNormal ? 2 * i + 1 : i + half;
      const double x0 = xh[idx0];
      const double x1 = xh[idx1];
      xh[idx0] = static_cast<float>(x0 * std::cos(theta) - x1 * std::sin(theta));
      xh[idx1] = static_cast<float>(x0 * std::sin(theta) + x1 * std::cos(theta));
    }
  }
}

void SwiGlu(float* gate, const float* up, int n) {
  KVS_CHECK(n >= 0);
  HWY_DYNAMIC_DISPATCH(SwiGluImpl)(gate, up, n);
}

void SwiGluReference(float* gate, const float* up, int n) {
  for (int i = 0; i < n; ++i) {
    const double g = gate[i];
    gate[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void EmbeddingRow(const WeightMatrix& emb, int token, float* out) {
  KVS_CHECK(token >= 0 && token < emb.rows);
  const int64_t offset = int64_t{token} * emb.cols;
  if (emb.type == WeightType::kF16) {
    HWY_DYNAMIC_DISPATCH(F16RowToF32)
    (static_cast<const uint16_t*>(emb.data) + offset, emb.cols, out);
  } else {
    KVS_CHECK(emb.type == WeightType::kF32);
    std::memcpy(out, static_cast<const float*>(emb.data) + offset, sizeof(float) * emb.cols);
  }
}

}  // namespace kvstack::ops
#endif  // HWY_ONCE
