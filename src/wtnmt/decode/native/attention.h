// The native engine's fused single-query attention (engine.cpp).
#pragma once

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "vectors.h"

namespace wtnmt_native {

using at::Tensor;

// Single-query attention, fused (``fused`` engines): per hypothesis and head, softmax(q·Kᵀ +
// bias)·V over the rows of K and V it may see, in one pass that writes its head straight into
// the layout the next product reads. The ATen path (``fused`` off) is the PyTorch engine's:
// batched products over every slot of a sentence's buffers, the slots of other hypotheses
// masked by a −inf bias (a hypothesis sees t + 1 of (t + 1)·W), two copies for the layouts.
// Here a hypothesis scores only the t + 1 slots on its path. The arithmetic is the same up to
// the order of float32 sums (the engines then agree within ~1e-6, not to the bit).

// The kernels below take their (hypothesis, head) items head by head, so that consecutive items
// read consecutive blocks of the key and value buffers, and ask for the next sentence's blocks
// ahead (prefetch): in the engine, between the products, those blocks had left the cache, and
// the kernels' loads waited on memory (1 thread, int8 greedy: self-attention 0.38 → 0.13 ms a
// step, cross-attention with the branches' FFN 0.61 → 0.27 ms; the head order alone changed
// nothing measurable).
constexpr int64_t kRows = 4;   // keys scored at once (independent chains of products)
constexpr int64_t kChunk = 4;  // vectors of the values' weighted sum kept in registers

// softmax(q·k_jᵀ + bias_j)·v_j over rows j < m (row j at k + rows[j]·dk, or j·dk when rows is
// null; bias null: none) → out [dk]. ``scores``: room for m floats.
template <int W>
WTNMT_INLINE void attend_rows_impl(const float* q, const float* k, const float* v,
                                   const int64_t* rows, int64_t m, int64_t dk, const float* bias,
                                   float* scores, float* out) {
  using Lanes = typename Vec<W>::T;
  constexpr int64_t kLanes = W;
  float top = -std::numeric_limits<float>::infinity();
  const int64_t whole = dk / kLanes * kLanes;
  for (int64_t j = 0; j < m; j += kRows) {
    const int64_t count = std::min(kRows, m - j);
    const float* kr[kRows];
    for (int64_t u = 0; u < kRows; ++u) {  // (past m: the last row again, its score unused)
      const int64_t row = j + std::min(u, count - 1);
      kr[u] = k + (rows ? rows[row] : row) * dk;
    }
    Lanes acc[kRows] = {};
    for (int64_t d = 0; d < whole; d += kLanes) {
      const Lanes qd = load<W>(q + d);
      for (int64_t u = 0; u < kRows; ++u) acc[u] += qd * load<W>(kr[u] + d);
    }
    for (int64_t u = 0; u < count; ++u) {
      float dot = lane_sum<W>(acc[u]);
      for (int64_t e = whole; e < dk; ++e) dot += q[e] * kr[u][e];
      if (bias) dot += bias[j + u];
      scores[j + u] = dot;
      top = std::max(top, dot);
    }
  }
  for (int64_t d = 0; d < dk; ++d) out[d] = 0;
  if (top == -std::numeric_limits<float>::infinity()) return;  // nothing to attend to
  float sum = 0;
  for (int64_t j = 0; j < m; ++j) {
    scores[j] = std::exp(scores[j] - top);
    sum += scores[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < m; ++j) scores[j] *= inv;
  // Σ_j p_j v_j, kChunk vectors of columns at a time in registers
  int64_t d0 = 0;
  for (; d0 + kChunk * kLanes <= dk; d0 += kChunk * kLanes) {
    Lanes acc[kChunk] = {};
    for (int64_t j = 0; j < m; ++j) {
      const float* vr = v + (rows ? rows[j] : j) * dk + d0;
      for (int64_t c = 0; c < kChunk; ++c) acc[c] += scores[j] * load<W>(vr + c * kLanes);
    }
    for (int64_t c = 0; c < kChunk; ++c) store<W>(out + d0 + c * kLanes, acc[c]);
  }
  for (; d0 < dk; ++d0)
    for (int64_t j = 0; j < m; ++j) out[d0] += scores[j] * v[(rows ? rows[j] : j) * dk + d0];
}

WTNMT_KERNEL(void, attend_rows,
             (const float* q, const float* k, const float* v, const int64_t* rows, int64_t m,
              int64_t dk, const float* bias, float* scores, float* out),
             (q, k, v, rows, m, dk, bias, scores, out))

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
      const int64_t h = i / n, r = i % n, s = r / group;
      const int64_t block = ((h * b + s) * steps) * width * dk;  // this head and sentence
      const float* q = x + r * 3 * heads * dk + h * dk;
      const float* kn = q + heads * dk;
      const float* vn = kn + heads * dk;
      const int64_t slot = (t * width + r % group) * dk;
      if (i + 1 < end && (r + 1) % group == 0) {  // the next sentence's keys and values
        const int64_t next = block + steps * width * dk;
        prefetch(kb + next, seen * width * dk);
        prefetch(vb + next, seen * width * dk);
      }
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
      const int64_t h = i / n, r = i % n, sent = r / group;
      const int64_t block = (h * b + sent) * s;
      if (i + 1 < end && (r + 1) % group == 0) {  // the next item's keys and values
        const int64_t next = (h * b + sent + 1) * s;
        prefetch(k + next * dk, s * dk);
        prefetch(v + next * dk, s * dk);
      }
      float* dst = head_major ? o + (h * n + r) * dk : o + r * heads * dk + h * dk;
      attend_rows(x + r * heads * dk + h * dk, k + block * dk, v + block * dk, nullptr, s, dk,
                  pad ? pad + block : nullptr, scores.data(), dst);
    }
  });
}

// The branched sublayer's cross-attention with its branches' first FFN products (split FFNs),
// fused: per hypothesis r and branch h, head = attention as fused_cross computes it, then
// hid[r, h·F' + f] = ReLU(Σ_d head[d]·W[h, d, f] + b1[h, f]) for W = ``fused`` [M, Dk, F']
// (κ_i W^{O_i} W1_i) and b1 [M, F'] → out [N, M·F'], the concatenation the tail multiplies.
// The PyTorch engine's baddbmm, ReLU and concatenation (a copy), in one pass; the same sums in
// another order. The product takes kProductRows hypotheses at a time, so that each vector of W
// read serves several (one at a time, it read all of W from cache for every hypothesis).
constexpr int64_t kProductRows = 4;

// ReLU(head · W + b1) for the heads [kProductRows, Dk] (only the first ``rows`` written, at
// ``out`` + u·``stride``)
template <int W>
WTNMT_INLINE void branch_first_product_impl(const float* head, int64_t rows, const float* w,
                                            const float* b1, int64_t dk, int64_t width, float* out,
                                            int64_t stride) {
  using Lanes = typename Vec<W>::T;
  constexpr int64_t kLanes = W;
  constexpr int64_t kChunk = W == 16 ? 4 : 2;  // (AVX2 and SSE have 16 registers, not 32)
  int64_t f0 = 0;
  for (; f0 + kChunk * kLanes <= width; f0 += kChunk * kLanes) {
    Lanes acc[kProductRows][kChunk] = {};
    for (int64_t d = 0; d < dk; ++d) {
      Lanes wr[kChunk];
      for (int64_t c = 0; c < kChunk; ++c) wr[c] = load<W>(w + d * width + f0 + c * kLanes);
      for (int64_t u = 0; u < kProductRows; ++u) {
        const float hd = head[u * dk + d];
        for (int64_t c = 0; c < kChunk; ++c) acc[u][c] += hd * wr[c];
      }
    }
    for (int64_t u = 0; u < rows; ++u)
      for (int64_t c = 0; c < kChunk; ++c) {
        const Lanes hid = acc[u][c] + load<W>(b1 + f0 + c * kLanes);
        store<W>(out + u * stride + f0 + c * kLanes, hid > 0 ? hid : 0);  // (ReLU)
      }
  }
  for (; f0 < width; ++f0)
    for (int64_t u = 0; u < rows; ++u) {
      float sum = 0;
      for (int64_t d = 0; d < dk; ++d) sum += head[u * dk + d] * w[d * width + f0];
      out[u * stride + f0] = std::max(sum + b1[f0], 0.0f);
    }
}

WTNMT_KERNEL(void, branch_first_product,
             (const float* head, int64_t rows, const float* w, const float* b1, int64_t dk,
              int64_t width, float* out, int64_t stride),
             (head, rows, w, b1, dk, width, out, stride))

static void fused_cross_branched(const Tensor& q, const Tensor& keys, const Tensor& values,
                                 const std::optional<Tensor>& bias, int64_t heads, int64_t dk,
                                 const Tensor& fused, const Tensor& b1, Tensor& out) {
  const int64_t n = q.size(0), b = keys.size(1), s = keys.size(2), group = n / b;
  const int64_t width = fused.size(2), blocks = (n + kProductRows - 1) / kProductRows;
  const float* x = q.data_ptr<float>();
  const float* k = keys.data_ptr<float>();
  const float* v = values.data_ptr<float>();
  const float* w = fused.data_ptr<float>();
  const float* bias1 = b1.data_ptr<float>();
  const float* pad = bias ? bias->data_ptr<float>() : nullptr;
  float* o = out.data_ptr<float>();
  at::parallel_for(0, blocks * heads, 2, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(s), head(kProductRows * dk, 0.0f);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t h = i / blocks, first = i % blocks * kProductRows;
      const int64_t rows = std::min(kProductRows, n - first);
      for (int64_t u = 0; u < rows; ++u) {
        const int64_t r = first + u, block = (h * b + r / group) * s;
        if ((r + 1) % group == 0 && r + 1 < n) {  // the next sentence's keys and values
          prefetch(k + (block + s) * dk, s * dk);
          prefetch(v + (block + s) * dk, s * dk);
        }
        attend_rows(x + r * heads * dk + h * dk, k + block * dk, v + block * dk, nullptr, s, dk,
                    pad ? pad + block : nullptr, scores.data(), head.data() + u * dk);
      }
      branch_first_product(head.data(), rows, w + h * dk * width, bias1 + h * width, dk, width,
                           o + (first * heads + h) * width, heads * width);
    }
  });
}

}  // namespace wtnmt_native
