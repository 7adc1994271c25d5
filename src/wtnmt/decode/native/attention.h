// The native engine's fused single-query attention (engine.cpp).
#pragma once

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

namespace wtnmt_native {

using at::Tensor;

// Single-query attention, fused (``fused`` engines): per hypothesis and head, softmax(q·Kᵀ +
// bias)·V over the rows of K and V it may see, in one pass that writes its head straight into
// the layout the next product reads. The ATen path (``fused`` off) is the PyTorch engine's:
// batched products over every slot of a sentence's buffers, the slots of other hypotheses
// masked by a −inf bias (a hypothesis sees t + 1 of (t + 1)·W), two copies for the layouts.
// Here a hypothesis scores only the t + 1 slots on its path. The arithmetic is the same up to
// the order of float32 sums (the engines then agree within ~1e-6, not to the bit).

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
// one build for every x86-64 CPU: the loader picks the widest vectors the CPU has
#define WTNMT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define WTNMT_CLONES
#endif

constexpr int64_t kLanes = 16;  // partial sums of a dot product

// softmax(q·k_jᵀ + bias_j)·v_j over rows j < m (row j at k + rows[j]·dk, or j·dk when rows is
// null; bias null: none) → out [dk]. ``scores``: room for m floats.
WTNMT_CLONES
static void attend_rows(const float* q, const float* k, const float* v, const int64_t* rows,
                        int64_t m, int64_t dk, const float* bias, float* scores, float* out) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < m; ++j) {
    const float* kr = k + (rows ? rows[j] : j) * dk;
    float acc[kLanes] = {0};  // lanes summed independently: vectorised without reassociation
    int64_t d = 0;
    for (; d + kLanes <= dk; d += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) acc[l] += q[d + l] * kr[d + l];
    float dot = 0;
    for (int64_t l = 0; l < kLanes; ++l) dot += acc[l];
    for (; d < dk; ++d) dot += q[d] * kr[d];
    if (bias) dot += bias[j];
    scores[j] = dot;
    top = std::max(top, dot);
  }
  for (int64_t d = 0; d < dk; ++d) out[d] = 0;
  if (top == -std::numeric_limits<float>::infinity()) return;  // nothing to attend to
  float sum = 0;
  for (int64_t j = 0; j < m; ++j) {
    scores[j] = std::exp(scores[j] - top);
    sum += scores[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < m; ++j) {
    const float p = scores[j] * inv;
    const float* vr = v + (rows ? rows[j] : j) * dk;
    for (int64_t d = 0; d < dk; ++d) out[d] += p * vr[d];
  }
}

// Self-attention of N = B·G hypotheses at step t, qkv [N, 3·H·Dk] (this step's projections):
// each hypothesis' key (×1/√Dk) and value written into its slot of the buffers [H, B, steps,
// W, Dk], then its query attends to the slots on its path (``path`` [N, t+1]; null: slot 0,
// greedy). → out [N, H·Dk].
static void fused_self(const Tensor& qkv, Tensor& keys, Tensor& values, const Tensor* path,
                       int64_t t, int64_t heads, int64_t dk, Tensor& out) {
  const int64_t n = qkv.size(0), b = keys.size(1), steps = keys.size(2), width = keys.size(3);
  const int64_t group = n / b, seen = t + 1;
  const float scale = static_cast<float>(std::pow(static_cast<double>(dk), -0.5));
  const float* x = qkv.data_ptr<float>();
  float* kb = keys.data_ptr<float>();
  float* vb = values.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const int64_t* p = path ? path->data_ptr<int64_t>() : nullptr;
  at::parallel_for(0, n * heads, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(seen);
    std::vector<int64_t> rows(seen);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = i / heads, h = i % heads, s = r / group;
      const int64_t block = ((h * b + s) * steps) * width * dk;  // this head and sentence
      const float* q = x + r * 3 * heads * dk + h * dk;
      const float* kn = q + heads * dk;
      const float* vn = kn + heads * dk;
      const int64_t slot = (t * width + r % group) * dk;
      for (int64_t d = 0; d < dk; ++d) {
        kb[block + slot + d] = kn[d] * scale;
        vb[block + slot + d] = vn[d];
      }
      for (int64_t tau = 0; tau < seen; ++tau)
        rows[tau] = tau * width + (p ? p[r * seen + tau] : 0);
      attend_rows(q, kb + block, vb + block, rows.data(), seen, dk, nullptr, scores.data(),
                  o + r * heads * dk + h * dk);
    }
  });
}

// Cross-attention of N = B·G hypotheses, q [N, H·Dk], over keys (×1/√Dk) and values [H, B, S,
// Dk] with the padding bias [H·B, 1, S] (or none) → out [N, H·Dk] (``head_major``: [H, N, Dk],
// as the branched sublayer multiplies its heads).
static void fused_cross(const Tensor& q, const Tensor& keys, const Tensor& values,
                        const std::optional<Tensor>& bias, int64_t heads, int64_t dk,
                        bool head_major, Tensor& out) {
  const int64_t n = q.size(0), b = keys.size(1), s = keys.size(2), group = n / b;
  const float* x = q.data_ptr<float>();
  const float* k = keys.data_ptr<float>();
  const float* v = values.data_ptr<float>();
  const float* pad = bias ? bias->data_ptr<float>() : nullptr;
  float* o = out.data_ptr<float>();
  at::parallel_for(0, n * heads, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(s);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = i / heads, h = i % heads, sent = r / group;
      const int64_t block = (h * b + sent) * s;
      float* dst = head_major ? o + (h * n + r) * dk : o + r * heads * dk + h * dk;
      attend_rows(x + r * heads * dk + h * dk, k + block * dk, v + block * dk, nullptr, s, dk,
                  pad ? pad + block : nullptr, scores.data(), dst);
    }
  });
}

}  // namespace wtnmt_native
