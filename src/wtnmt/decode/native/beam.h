// The native engine's beam bookkeeping (engine.cpp): decode/search.py's _settle.
#pragma once

#include <torch/extension.h>

#include <optional>
#include <tuple>
#include <vector>

#include "search_ops.h"

namespace wtnmt_native {

using Hyp = std::tuple<std::vector<int64_t>, double, double>;  // tokens, score, log-prob

// decode/search.py's _settle. Returns false when every sentence is done; otherwise
// top/origin/token become the K that live on and ``rows`` the sentences still searched
// (unset: all of them).
inline bool settle(Tensor& top, Tensor& origin, Tensor& token, const Tensor& scores,
                   const Tensor& prefix, const Tensor& active,
                   std::vector<std::vector<Hyp>>& finished, int64_t beam, double alpha,
                   bool fairseq, int64_t eos, std::optional<Tensor>& rows) {
  const int64_t n = scores.size(0), group = scores.size(1);
  Tensor alive = top.gt(kNegInf);
  Tensor is_eos = token.eq(eos);
  Tensor ends =
      is_eos.bitwise_and(alive).bitwise_and(at::arange(top.size(1), active.options()).lt(beam));
  Tensor live = is_eos.logical_not().bitwise_and(alive);
  Tensor live_rank = live.cumsum(1) - 1;
  live.bitwise_and_(live_rank.lt(beam));
  Tensor n_live = live.sum(1);
  Tensor ending = ends.nonzero();
  auto sents = active.accessor<int64_t, 1>();
  auto prefix_row = [&](int64_t r) {
    Tensor row = prefix.select(0, r).narrow(0, 1, prefix.size(1) - 1).contiguous();
    const int64_t* p = row.data_ptr<int64_t>();
    return std::vector<int64_t>(p, p + row.numel());
  };
  if (ending.size(0) > 0) {
    auto e = ending.accessor<int64_t, 2>();
    Tensor top_d = top.to(at::kDouble);
    auto top_a = top_d.accessor<double, 2>();
    auto origin_a = origin.accessor<int64_t, 2>();
    for (int64_t j = 0; j < ending.size(0); ++j) {
      const int64_t row = e[j][0], r = e[j][1];
      auto& hyps = finished[sents[row]];
      if (static_cast<int64_t>(hyps.size()) < beam) {
        std::vector<int64_t> toks = prefix_row(row * group + origin_a[row][r]);
        const double score = top_a[row][r];
        const double lp = penalty(static_cast<int64_t>(toks.size()) + 1, alpha, fairseq);
        hyps.emplace_back(std::move(toks), score / lp, score);
      }
    }
  }
  Tensor none_live = n_live.eq(0).nonzero().select(1, 0);
  auto none_a = none_live.accessor<int64_t, 1>();
  for (int64_t j = 0; j < none_live.size(0); ++j) {
    const int64_t row = none_a[j];
    auto& hyps = finished[sents[row]];
    if (hyps.empty()) {  // nothing may follow (e.g. min_len): end the best prefix
      const double best = scores[row].max().item<double>();
      const int64_t which = scores[row].argmax().item<int64_t>();
      std::vector<int64_t> toks = prefix_row(row * group + which);
      const double lp = penalty(static_cast<int64_t>(toks.size()) + 1, alpha, fairseq);
      hyps.emplace_back(std::move(toks), best / lp, best);
    }
  }
  std::vector<int64_t> counts;
  for (int64_t row = 0; row < n; ++row)
    counts.push_back(static_cast<int64_t>(finished[sents[row]].size()));
  Tensor n_done = at::tensor(counts, active.options());
  Tensor still = n_done.lt(beam).bitwise_and(n_live.gt(0));
  if (!still.any().item<bool>()) return false;
  Tensor slot = at::where(live, live_rank, beam);
  Tensor new_score = at::full({n, beam + 1}, kNegInf, top.options());
  Tensor new_origin = at::zeros({n, beam + 1}, origin.options());
  Tensor new_token = at::full({n, beam + 1}, eos, token.options());
  new_score.scatter_(1, slot, top.masked_fill(live.logical_not(), kNegInf));
  new_origin.scatter_(1, slot, origin);
  new_token.scatter_(1, slot, token);
  if (still.all().item<bool>()) {
    top = new_score.narrow(1, 0, beam);
    origin = new_origin.narrow(1, 0, beam);
    token = new_token.narrow(1, 0, beam);
    return true;
  }
  Tensor kept = still.nonzero().select(1, 0);
  top = new_score.index_select(0, kept).narrow(1, 0, beam);
  origin = new_origin.index_select(0, kept).narrow(1, 0, beam);
  token = new_token.index_select(0, kept).narrow(1, 0, beam);
  rows = kept;
  return true;
}

}  // namespace wtnmt_native
