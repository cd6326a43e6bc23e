// Dense kernels of the Llama forward pass: matrix multiply against F32/F16 weights, RMSNorm,
// RoPE, SwiGLU, embedding lookup. SIMD through Highway with runtime dispatch (the machine that
// runs the code may not be the one that built it). Each kernel has a plain scalar reference
// (*Reference) that its test compares against.
#pragma once

#include "base/thread_pool.h"
#include "kvstack/model.h"

namespace kvstack::ops {

// y[t, r] = sum_c w[r, c] * x[t, c].  x: [num_tokens, w.cols]; y: [num_tokens, w.rows].
// Parallel over rows (and token tiles) when pool is non-null and the work is large enough.
void MatMul(const WeightMatrix& w, const float* x, int num_tokens, float* y, ThreadPool* pool);
void MatMulReference(const WeightMatrix& w, const float* x, int num_tokens, float* y);

// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i], for one row of `dim`. out may alias x.
void RmsNorm(const float* x, const float* weight, int dim, float eps, float* out);
void RmsNormReference(const float* x, const float* weight, int dim, float eps, float* out);

// Rotates the first rope_dim dims of each head of x: [num_heads, head_dim], in place, for
// position pos: theta_i = pos * freq_base^(-2i/rope_dim), pairs chosen by style.
void Rope(float* x, int num_heads, int head_dim, int rope_dim, int pos, float freq_base,
          RopeStyle style);
void RopeReference(float* x, int num_heads, int head_dim, int rope_dim, int pos, float freq_base,
                   RopeStyle style);

// gate[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + exp(-x)).
void SwiGlu(float* gate, const float* up, int n);
void SwiGluReference(float* gate, const float* up, int n);

// out: [emb.cols] = row `token` of emb, converted to F32.
void EmbeddingRow(const WeightMatrix& emb, int token, float* out);

}  // namespace kvstack::ops
