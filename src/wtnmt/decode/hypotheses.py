"""Finished hypotheses: what a search returns (``Hypothesis``), the length penalty that ranks
them, greedy search's hypotheses from its chosen tokens, and beam search's bookkeeping at a
step where some end (``settle``; decode/search.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from wtnmt.special import EOS


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # log-probability / length penalty (what beam search ranks finished ones by)
    log_prob: float  # summed log-probability of tokens + EOS


PENALTY_FORMS = ("gnmt", "fairseq")


def length_penalty(length: int | Tensor, alpha: float, form: str = "gnmt") -> float | Tensor:
    """((5 + length) / 6) ** alpha (Wu et al., 2016; ``form="gnmt"``) or length ** alpha
    (fairseq's, ``form="fairseq"``); length counts EOS."""
    if form == "fairseq":
        return length**alpha
    if form == "gnmt":
        return ((5 + length) / 6) ** alpha
    raise ValueError(f"length penalty form {form!r} is not one of {', '.join(PENALTY_FORMS)}")


def greedy_hypotheses(out: Tensor, best: Tensor) -> list[Hypothesis]:
    """Greedy search's hypotheses from the tokens it chose [B, T] (PAD after a sentence's
    EOS) and their log-probabilities [B, T]: a sentence's tokens up to its EOS count, the
    steps after it were only padded."""
    ended = out.eq(EOS)
    counted = (ended.cumsum(1) - ended.long()).eq(0)  # no EOS before
    lengths = counted.sum(1)
    log_prob = torch.where(counted, best, 0.0).sum(1)
    hyps = []
    for row, n, lp in zip(out.tolist(), lengths.tolist(), log_prob.tolist(), strict=True):
        toks = row[:n]
        if toks and toks[-1] == EOS:
            toks = toks[:-1]
        hyps.append(Hypothesis(toks, lp, lp))
    return hyps


def settle(
    top: Tensor,
    origin: Tensor,
    token: Tensor,
    scores: Tensor,
    prefix: Tensor,
    active: Tensor,
    finished: list[list[Hypothesis]],
    beam: int,
    alpha: float,
    form: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None] | None:
    """A step where some hypotheses end (or cannot go on): record them in ``finished``.

    top/origin/token [n, C]: the ranked extensions. An EOS ranked among the first K ends a
    hypothesis; the best K others live on (too few: padded with dead ones, score -inf).
    Returns their scores, origins and tokens [n', K] and the rows of the sentences still
    searching (None: all of them), or None when every sentence is done.
    """
    n, group = scores.shape
    alive = top.gt(float("-inf"))
    is_eos = token.eq(EOS)
    ends = is_eos & alive & torch.arange(top.size(1), device=top.device).lt(beam)
    live = ~is_eos & alive
    live_rank = live.cumsum(1) - 1
    live &= live_rank.lt(beam)
    n_live = live.sum(1)
    ending = ends.nonzero().tolist()
    if ending:  # to Python once: the last step ends every hypothesis
        sents, top_l, origin_l = active.tolist(), top.tolist(), origin.tolist()
        prefixes = prefix[:, 1:].tolist()
    for row, r in ending:
        sent = sents[row]
        if len(finished[sent]) < beam:
            toks = prefixes[row * group + origin_l[row][r]]
            score = top_l[row][r]
            finished[sent].append(
                Hypothesis(toks, score / length_penalty(len(toks) + 1, alpha, form), score)
            )
    for row in n_live.eq(0).nonzero()[:, 0].tolist():
        sent = int(active[row])
        if not finished[sent]:  # nothing may follow (e.g. min_len): end the best prefix
            best = float(scores[row].max())
            toks = prefix[row * group + int(scores[row].argmax()), 1:].tolist()
            finished[sent].append(
                Hypothesis(toks, best / length_penalty(len(toks) + 1, alpha, form), best)
            )
    n_done = torch.tensor([len(finished[s]) for s in active.tolist()], device=top.device)
    still = n_done.lt(beam) & n_live.gt(0)  # [n]
    if not bool(still.any()):
        return None
    slot = torch.where(live, live_rank, beam)  # [n, C], beam = discarded
    new_score = top.new_full((n, beam + 1), float("-inf"))
    new_origin = origin.new_zeros(n, beam + 1)
    new_token = token.new_full((n, beam + 1), EOS)
    new_score.scatter_(1, slot, top.masked_fill(~live, float("-inf")))
    new_origin.scatter_(1, slot, origin)
    new_token.scatter_(1, slot, token)
    if bool(still.all()):
        return new_score[:, :beam], new_origin[:, :beam], new_token[:, :beam], None
    rows = still.nonzero()[:, 0]
    return new_score[rows, :beam], new_origin[rows, :beam], new_token[rows, :beam], rows
