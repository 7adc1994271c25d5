// The native engine's search operations (engine.cpp): decode/search.py's and
// decode/selection.py's, in ATen.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

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
