// The native engine's search operations (engine.cpp): decode/search.py's and
// decode/selection.py's, in ATen.
#pragma once

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "vectors.h"

namespace wtnmt_native {

using at::Tensor;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr int64_t kBlock = 128;  // decode/selection.py's _BLOCK

// decode/search.py's _constrain, in place
inline Tensor constrain(Tensor lprobs, int64_t t, int64_t min_len,
                        const std::optional<Tensor>& forced, int64_t pad, int64_t bos,
                        int64_t eos) {
  std::vector<int64_t> ruled = {pad, bos};
  if (t < min_len) ruled.push_back(eos);
  for (int64_t token : ruled) lprobs.narrow(-1, token, 1).fill_(kNegInf);
  if (forced) {
    lprobs.index_put_({*forced}, kNegInf);
    lprobs.index_put_({*forced, at::indexing::Ellipsis, eos}, 0.0);
  }
  return lprobs;
}

// decode/selection.py's force_tokens: where want[r] is not ``free``, every hypothesis of
// sentence r (lprobs [n, G, V]) may only take that token, at its log-probability; in place
inline void force_tokens(Tensor lprobs, const Tensor& want, int64_t free) {
  Tensor rows = want.ne(free).view({-1, 1, 1});
  Tensor index = want.clamp_min(0).view({-1, 1, 1}).expand({lprobs.size(0), lprobs.size(1), 1});
  Tensor kept = lprobs.gather(-1, index);
  Tensor only = at::full_like(lprobs, kNegInf).scatter_(-1, index, kept);
  lprobs.copy_(at::where(rows, only, lprobs));
}

// decode/sampling.py's mix32 (Wellons' lowbias32)
inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// decode/sampling.py's uniforms: [N] float32 in [0, 1), step ``step``'s draw of each row
inline Tensor uniforms(const Tensor& keys, int64_t step) {
  const int64_t n = keys.size(0);
  Tensor u = at::empty({n}, keys.options().dtype(at::kFloat));
  const int64_t* k = keys.data_ptr<int64_t>();
  float* out = u.data_ptr<float>();
  const uint32_t salt = mix32(static_cast<uint32_t>(step + 0x165667B1));
  for (int64_t r = 0; r < n; ++r) {
    const uint32_t h = mix32(static_cast<uint32_t>(k[r]) ^ salt);
    out[r] = static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
  }
  return u;
}

// decode/sampling.py's sample_pick (and _nucleus_candidates), the same operators in the
// same order
inline Tensor sample_pick(const Tensor& lprobs, const Tensor& u, double temperature,
                          int64_t top_k, double top_p) {
  Tensor scores = temperature != 1.0 ? lprobs / temperature : lprobs;
  const int64_t v = scores.size(-1);
  std::optional<Tensor> index;
  Tensor probs;
  if (top_k > 0 && top_k < v) {
    auto [values, idx] = scores.topk(top_k, -1, true, true);
    index = idx;
    probs = at::softmax(values, -1);
  } else if (top_p < 1.0) {
    Tensor total = scores.logsumexp({-1}, true);
    const int64_t first = std::min<int64_t>(256, v);  // NUCLEUS_FIRST
    auto [values, idx] = scores.topk(first, -1, true, true);
    probs = (values - total).exp();
    index = idx;
    if (first < v && !probs.sum(-1).ge(top_p).all().item<bool>()) {
      auto [all_values, all_idx] = scores.sort(true, -1, true);
      probs = (all_values - total).exp();
      index = all_idx;
    }
  } else {
    probs = at::softmax(scores, -1);
  }
  if (top_p < 1.0) probs = probs.masked_fill((probs.cumsum(-1) - probs).ge(top_p), 0.0);
  Tensor cdf = probs.cumsum(-1);
  Tensor target = (u * cdf.select(1, cdf.size(1) - 1)).unsqueeze(1);
  Tensor j = at::searchsorted(cdf, target, false, true).select(1, 0);
  j = at::minimum(j, probs.gt(0).cumsum(-1).argmax(-1));
  return index ? index->gather(1, j.unsqueeze(1)).select(1, 0) : j;
}

// decode/selection.py's row_argmax
inline Tensor row_argmax(const Tensor& x) {
  const int64_t n = x.size(0), v = x.size(1);
  if (v <= 4 * kBlock) return x.argmax(1);
  const int64_t full = v / kBlock * kBlock;
  Tensor maxima = x.narrow(1, 0, full).reshape({n, -1, kBlock}).amax(-1);
  if (full < v) maxima = at::cat({maxima, x.narrow(1, full, v - full).amax(-1, true)}, -1);
  Tensor start = maxima.argmax(1, true) * kBlock;
  Tensor cols = (start + at::arange(kBlock, x.options().dtype(at::kLong))).clamp_max_(v - 1);
  return cols.gather(1, x.gather(1, cols).argmax(1, true)).select(1, 0);
}

// The first index of the largest of x[0..v) (as argmax), its value in ``top``: one pass, each
// lane keeping its own first maximum.
template <int W>
WTNMT_INLINE int64_t first_max_impl(const float* x, int64_t v, float* top) {
  constexpr int64_t kLanes = W;
  float best[kLanes];
  int32_t at[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) {
    best[l] = -std::numeric_limits<float>::infinity();
    at[l] = static_cast<int32_t>(l);
  }
  int64_t j = 0;
  for (; j + kLanes <= v; j += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) {
      const bool more = x[j + l] > best[l];
      best[l] = more ? x[j + l] : best[l];
      at[l] = more ? static_cast<int32_t>(j + l) : at[l];
    }
  float value = best[0];
  int64_t index = at[0];
  for (int64_t l = 1; l < kLanes; ++l)
    if (best[l] > value || (best[l] == value && at[l] < index)) {
      value = best[l];
      index = at[l];
    }
  for (; j < v; ++j)
    if (x[j] > value) {
      value = x[j];
      index = j;
    }
  *top = value;
  return index;
}

WTNMT_KERNEL(int64_t, first_max, (const float* x, int64_t v, float* top), (x, v, top))

// exp(a) on W lanes for a ≤ 0: Cephes' expf (a = n·ln 2 + r, |r| ≤ ln 2 / 2, a degree-6
// polynomial in r, 2ⁿ added to the exponent), within 2 units in the last place of std::exp;
// below −87.3 (past float32's normal range) it gives 2⁻¹²⁶·exp(r), ~1e-38, where exp gives
// less (nothing a sum of exp(x − max) over a vocabulary can see).
template <int W>
WTNMT_INLINE typename Vec<W>::T exp_nonpositive(typename Vec<W>::T a) {
  using V = typename Vec<W>::T;
  typedef int32_t I __attribute__((vector_size(W * sizeof(int32_t))));
  const V lowest = V{} - 87.3f, magic = V{} + 12582912.0f;  // (1.5·2²³: rounds to an integer)
  a = a < lowest ? lowest : a;
  const V n = (a * 1.44269504088896341f + magic) - magic;
  const V r = (a - n * 0.693359375f) - n * -2.12194440e-4f;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const I e = (__builtin_convertvector(n, I) + 127) << 23;  // 2ⁿ's bits
  return p * reinterpret_cast<const V&>(e);
}

// Σ exp(x[j] − top) over x[0..v) (top ≥ every x[j]): a log-softmax's denominator
template <int W>
WTNMT_INLINE float exp_sum_impl(const float* x, int64_t v, float top) {
  using V = typename Vec<W>::T;
  const V shift = V{} + top;
  V acc = V{};
  int64_t j = 0;
  for (; j + W <= v; j += W) acc += exp_nonpositive<W>(load<W>(x + j) - shift);
  float sum = lane_sum<W>(acc);
  for (; j < v; ++j) sum += std::exp(x[j] - top);
  return sum;
}

WTNMT_KERNEL(float, exp_sum, (const float* x, int64_t v, float top), (x, v, top))

// A step of greedy search from the logits (``fused`` engines): the log-softmax, decode/search.py's
// _constrain, row_argmax and bookkeeping in two passes over logits [N, V] (the first index of
// the largest, and the log-softmax's denominator; a third where the largest is a token ruled
// out, which is then written −inf): at::log_softmax's numbers up to the order of its sum and
// its exp's last bits. Row r's token goes to tokens[r] (PAD once its sentence is done), its
// log-probability to best[r]; forced rows (limit ≤ t) take EOS at 0. Returns whether every
// sentence is done (``done`` [N] updated).
inline bool greedy_pick(Tensor& logits, int64_t t, int64_t min_len, const Tensor& limit,
                        Tensor& done, Tensor tokens, Tensor best, int64_t pad, int64_t bos,
                        int64_t eos) {
  const int64_t n = logits.size(0), v = logits.size(1);
  float* lp = logits.data_ptr<float>();
  const int64_t* lim = limit.data_ptr<int64_t>();
  bool* fin = done.data_ptr<bool>();
  int64_t* tok = tokens.data_ptr<int64_t>();
  const int64_t tok_stride = tokens.stride(0);
  float* out = best.data_ptr<float>();
  const int64_t best_stride = best.stride(0);
  const float ninf = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, n, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = lp + r * v;
      int64_t token = eos;
      float value = 0.0f;
      if (lim[r] > t) {
        float top;
        token = first_max(row, v, &top);
        const float lse = top + std::log(exp_sum(row, v, top));
        value = top;
        if (token == pad || token == bos || (t < min_len && token == eos)) {
          row[pad] = ninf;
          row[bos] = ninf;
          if (t < min_len) row[eos] = ninf;
          token = first_max(row, v, &value);
        }
        value -= lse;
      }
      out[r * best_stride] = value;
      tok[r * tok_stride] = fin[r] ? pad : token;
      fin[r] = fin[r] || token == eos;
    }
  });
  for (int64_t r = 0; r < n; ++r)
    if (!fin[r]) return false;
  return true;
}

// The largest of each kBlock floats of x[0..v) (the last block may be shorter) → out
template <int W>
WTNMT_INLINE void block_maxima_impl(const float* x, int64_t v, float* out) {
  using V = typename Vec<W>::T;
  const int64_t full = v / kBlock;
  for (int64_t b = 0; b < full; ++b) {
    const float* p = x + b * kBlock;
    V acc = load<W>(p);
    for (int64_t j = W; j < kBlock; j += W) {
      const V y = load<W>(p + j);
      acc = acc > y ? acc : y;
    }
    float lanes[W];
    store<W>(lanes, acc);
    float m = lanes[0];
    for (int l = 1; l < W; ++l) m = std::max(m, lanes[l]);
    out[b] = m;
  }
  if (full * kBlock < v) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = full * kBlock; j < v; ++j) m = std::max(m, x[j]);
    out[full] = m;
  }
}

WTNMT_KERNEL(void, block_maxima, (const float* x, int64_t v, float* out), (x, v, out))

// A step of beam search from the logits [n·G, V] (``fused`` engines, V > 4·kBlock):
// top_extensions(constrain(log_softmax(logits)), scores, k) without writing the
// log-probabilities. Each row is read twice (its blocks' maxima, then the log-softmax's
// denominator) and the ruled-out tokens written −inf in place; the blocks whose best can be
// among the k best are then read again, log-probabilities (x − max) − log Σ exp(x − max) as
// at::log_softmax makes them, up to the order of its sum and its exp's last bits. A
// forced row (its sentence at its length limit) takes EOS at 0, as constrain gives it.
inline std::tuple<Tensor, Tensor, Tensor> beam_pick(Tensor& logits, const Tensor& scores,
                                                    int64_t t, int64_t min_len,
                                                    const std::optional<Tensor>& forced,
                                                    int64_t pad, int64_t bos, int64_t eos,
                                                    int64_t k) {
  const int64_t n = scores.size(0), g = scores.size(1), v = logits.size(1);
  const int64_t blocks = (v + kBlock - 1) / kBlock;
  k = std::min(k, g * v);
  Tensor maxima = at::empty({n * g, blocks}, logits.options());
  Tensor shift = at::empty({n * g, 2}, logits.options());  // max, log Σ exp(x − max)
  float* lp = logits.data_ptr<float>();
  float* bm = maxima.data_ptr<float>();
  float* sh = shift.data_ptr<float>();
  Tensor forced_rows = forced ? forced->to(at::kBool).contiguous() : Tensor();
  const bool* fr = forced ? forced_rows.data_ptr<bool>() : nullptr;
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<int64_t> ruled = {pad, bos};
  if (t < min_len) ruled.push_back(eos);
  at::parallel_for(0, n * g, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = lp + r * v;
      if (fr && fr[r / g]) {  // EOS at 0, nothing else
        std::fill(row, row + v, ninf);
        row[eos] = 0.0f;
        block_maxima(row, v, bm + r * blocks);
        sh[2 * r] = sh[2 * r + 1] = 0.0f;
        continue;
      }
      float saved[3];
      for (size_t i = 0; i < ruled.size(); ++i) {
        saved[i] = row[ruled[i]];
        row[ruled[i]] = ninf;
      }
      block_maxima(row, v, bm + r * blocks);
      float top = *std::max_element(bm + r * blocks, bm + (r + 1) * blocks);
      for (size_t i = 0; i < ruled.size(); ++i) top = std::max(top, saved[i]);
      float sum = exp_sum(row, v, top);
      for (size_t i = 0; i < ruled.size(); ++i) sum += std::exp(saved[i] - top);
      sh[2 * r] = top;
      sh[2 * r + 1] = std::log(sum);
    }
  });
  // log-probabilities and scores as top_extensions adds them: ((x − max) − log Σ) + score
  auto lift = [&](const Tensor& x, const Tensor& rows) {  // x [n, m], rows [n, m] of n·G
    Tensor s = shift.index_select(0, rows.reshape({-1})).view({rows.size(0), rows.size(1), 2});
    Tensor lprobs = (x - s.select(2, 0)) - s.select(2, 1);
    return lprobs + scores.reshape({-1}).index_select(0, rows.reshape({-1})).view_as(x);
  };
  Tensor base = (at::arange(n, scores.options().dtype(at::kLong)) * g).unsqueeze(1);
  Tensor block_rows = (base.unsqueeze(2) + at::arange(g, base.options()).view({1, g, 1}))
                          .expand({n, g, blocks})
                          .reshape({n, -1});
  Tensor lifted = lift(maxima.view({n, -1}), block_rows);
  Tensor best = std::get<1>(lifted.topk(std::min(k, lifted.size(1)), 1));
  Tensor hyp = at::floor_divide(best, blocks);
  Tensor cols =
      (at::remainder(best, blocks) * kBlock).unsqueeze(2) + at::arange(kBlock, best.options());
  Tensor rows = (base + hyp).unsqueeze(2).expand_as(cols);
  Tensor flat = rows * v + cols.clamp_max(v - 1);
  Tensor values = logits.view({-1}).index_select(0, flat.reshape({-1})).view({n, -1});
  values = lift(values, rows.reshape({n, -1})).masked_fill(cols.ge(v).view({n, -1}), kNegInf);
  auto [top, pos] = values.topk(k, 1);
  Tensor at_hyp = (hyp.unsqueeze(2).expand_as(cols)).reshape({n, -1}).gather(1, pos);
  Tensor at_col = cols.clamp_max(v - 1).reshape({n, -1}).gather(1, pos);
  return {top, at_hyp, at_col};
}

// decode/selection.py's top_extensions
inline std::tuple<Tensor, Tensor, Tensor> top_extensions(const Tensor& lprobs, const Tensor& scores,
                                                         int64_t k) {
  const int64_t n = lprobs.size(0), g = lprobs.size(1), v = lprobs.size(2);
  k = std::min(k, g * v);
  if (v <= 4 * kBlock) {
    auto [top, flat] = (scores.unsqueeze(2) + lprobs).view({n, -1}).topk(k, 1);
    return {top, at::floor_divide(flat, v), at::remainder(flat, v)};
  }
  const int64_t full = v / kBlock * kBlock;
  Tensor maxima = lprobs.narrow(2, 0, full).reshape({n, g, -1, kBlock}).amax(-1);
  if (full < v) maxima = at::cat({maxima, lprobs.narrow(2, full, v - full).amax(-1, true)}, -1);
  const int64_t per_hyp = maxima.size(-1);
  maxima = (maxima + scores.unsqueeze(2)).view({n, -1});
  Tensor best = std::get<1>(maxima.topk(std::min(k, maxima.size(1)), 1));
  Tensor hyp = at::floor_divide(best, per_hyp);
  Tensor cols =
      (at::remainder(best, per_hyp) * kBlock).unsqueeze(2) + at::arange(kBlock, best.options());
  Tensor flat = hyp.unsqueeze(2) * v + cols.clamp_max(v - 1);
  Tensor values = lprobs.view({n, -1}).gather(1, flat.view({n, -1})).view_as(flat);
  values = (values + scores.gather(1, hyp).unsqueeze(2)).masked_fill(cols.ge(v), kNegInf);
  auto [top, pos] = values.view({n, -1}).topk(k, 1);
  flat = flat.view({n, -1}).gather(1, pos);
  return {top, at::floor_divide(flat, v), at::remainder(flat, v)};
}

// decode/search.py's length_penalty: fairseq's |y|^α, or Wu et al.'s ((5 + |y|) / 6)^α
inline double penalty(int64_t length, double alpha, bool fairseq) {
  return fairseq ? std::pow(static_cast<double>(length), alpha)
                 : std::pow((5.0 + static_cast<double>(length)) / 6.0, alpha);
}

}  // namespace wtnmt_native
