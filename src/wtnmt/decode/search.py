"""Greedy and beam search over the model's ``encode`` / ``decode_step`` interface.

Search is a policy over a model, so it lives outside it (STYLE.md). Both searches are batched
over sentences and use the key/value cache; ``use_cache=False`` re-runs the decoder over the
whole prefix at every step instead (the reference the cache is tested and timed against).

Beam search, per sentence, keeps ``beam`` live hypotheses ranked by their summed
log-probability. At each step the 2·beam best extensions are considered in order: one that
ends with EOS while ranked among the first ``beam`` is finished, scored with the length
penalty of Wu et al. (2016), lp(y) = ((5 + |y|) / 6)^α, and the best ``beam`` others live on.
A sentence is done once it has ``beam`` finished hypotheses (or reached its maximum length,
where EOS is forced); the search stops as soon as every sentence is done.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from wtnmt.special import BOS, EOS, PAD


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # log-probability / length penalty (what beam search ranks finished ones by)
    log_prob: float  # summed log-probability of tokens + EOS


def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """((5 + length) / 6) ** alpha (Wu et al., 2016); length counts EOS."""
    return ((5 + length) / 6) ** alpha


def max_lengths(src: Tensor, *, a: float, b: int, pad_id: int, cap: int) -> Tensor:
    """Per-sentence limit on output tokens before EOS, a·|src| + b (|src| without padding),
    at most ``cap``."""
    src_len = src.ne(pad_id).sum(dim=1)
    return (a * src_len.float() + b).long().clamp(1, cap)


class _Stepper:
    """Next-token log-probabilities, with the cache or by recomputing the prefix.

    ``group`` hypotheses per source sentence (the beam). The cache keeps the source side once
    per sentence; the recomputing reference expands it to every hypothesis.
    """

    def __init__(self, model, src: Tensor, use_cache: bool, group: int = 1) -> None:  # type: ignore[no-untyped-def]
        self.model, self.use_cache = model, use_cache
        self.enc = model.encode(src)
        self.cache = model.init_cache(self.enc) if use_cache else None
        if not use_cache and group > 1:
            self._select(torch.arange(src.size(0), device=src.device).repeat_interleave(group))

    def _select(self, rows: Tensor) -> None:
        self.enc = replace(
            self.enc,
            memories=[m.index_select(0, rows) for m in self.enc.memories],
            src_pad=self.enc.src_pad.index_select(0, rows),
        )

    def reorder(self, index: Tensor, sentences: Tensor | None) -> None:
        """Keep hypotheses ``index``; ``sentences``: the source sentences still searched."""
        if self.cache is not None:
            self.cache = self.cache.reorder(index, sentences)
        else:
            self._select(index)

    def __call__(self, prefix: Tensor) -> Tensor:
        """prefix [N, t] (BOS first) → log-probabilities of the next token [N, V]."""
        if self.cache is not None:
            logits = self.model.decode_step(prefix[:, -1], self.cache)
        else:
            states, _, _ = self.model.decode(prefix, self.enc)
            logits = self.model.embedding.logits(states[:, -1])
        return F.log_softmax(logits.float(), dim=-1)


@torch.no_grad()
def greedy_search(
    model,
    src: Tensor,
    *,
    max_len_a: float = 1.5,
    max_len_b: int = 10,  # type: ignore[no-untyped-def]
    min_len: int = 0,
    max_len: int | None = None,
    use_cache: bool = True,
) -> list[Hypothesis]:
    """The most probable next token at every step, for each sentence of ``src`` [B, S]."""
    b = src.size(0)
    cap = model.positions.max_positions - 1
    limit = (
        torch.full((b,), max_len, dtype=torch.long)
        if max_len is not None
        else max_lengths(src, a=max_len_a, b=max_len_b, pad_id=model.pad_id, cap=cap)
    )
    limit = limit.clamp(max=cap).to(src.device)
    stepper = _Stepper(model, src, use_cache)
    prefix = torch.full((b, 1), BOS, dtype=torch.long, device=src.device)
    done = torch.zeros(b, dtype=torch.bool, device=src.device)
    log_prob = torch.zeros(b, device=src.device)
    lengths = torch.zeros(b, dtype=torch.long, device=src.device)
    for t in range(int(limit.max()) + 1):  # step t = limit forces EOS
        lprobs = stepper(prefix)  # [B, V]
        lprobs[:, [PAD, BOS]] = float("-inf")  # never generated
        if t < min_len:
            lprobs[:, EOS] = float("-inf")
        forced = t >= limit  # at the limit the only choice is EOS
        lprobs[forced] = float("-inf")
        lprobs[forced, EOS] = 0.0
        best, token = lprobs.max(dim=-1)
        token = torch.where(done, torch.full_like(token, PAD), token)
        log_prob += torch.where(done, torch.zeros_like(best), best)
        lengths += (~done).long()
        done |= token.eq(EOS)
        prefix = torch.cat([prefix, token[:, None]], dim=1)
        if bool(done.all()):
            break
    out = []
    for i in range(b):
        toks = prefix[i, 1 : 1 + int(lengths[i])].tolist()
        if toks and toks[-1] == EOS:
            toks = toks[:-1]
        out.append(Hypothesis(toks, float(log_prob[i]), float(log_prob[i])))
    return out


@torch.no_grad()
def beam_search(
    model,
    src: Tensor,
    *,
    beam: int = 4,
    nbest: int = 1,
    alpha: float = 0.6,  # type: ignore[no-untyped-def]
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    min_len: int = 0,
    max_len: int | None = None,
    use_cache: bool = True,
) -> list[list[Hypothesis]]:
    """The ``nbest`` best hypotheses of each sentence of ``src`` [B, S], best first."""
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest={nbest} must be between 1 and beam={beam}")
    b, device = src.size(0), src.device
    cap = model.positions.max_positions - 1
    limit = (
        torch.full((b,), max_len, dtype=torch.long)
        if max_len is not None
        else max_lengths(src, a=max_len_a, b=max_len_b, pad_id=model.pad_id, cap=cap)
    )
    limit = limit.clamp(max=cap).tolist()
    stepper = _Stepper(model, src, use_cache, group=beam)
    prefix = torch.full((b * beam, 1), BOS, dtype=torch.long, device=device)
    scores = torch.full((b, beam), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start as one hypothesis
    finished: list[list[Hypothesis]] = [[] for _ in range(b)]
    active = list(range(b))  # sentences still searching, in the order of the batch rows
    for t in range(max(limit) + 1):  # step t = limit forces EOS
        n = len(active)
        lprobs = stepper(prefix).view(n, beam, -1)  # [n, K, V]
        lprobs[:, :, [PAD, BOS]] = float("-inf")  # never generated
        if t < min_len:
            lprobs[:, :, EOS] = float("-inf")
        for row, sent in enumerate(active):
            if t >= limit[sent]:  # at the limit the only choice is EOS
                lprobs[row] = float("-inf")
                lprobs[row, :, EOS] = 0.0
        vocab = lprobs.size(-1)
        cand = (scores[:, :, None] + lprobs).view(n, -1)  # [n, K·V]
        top, flat = cand.topk(2 * beam, dim=1)  # [n, 2K], best first
        origin, token = flat // vocab, flat % vocab
        keep_rows, keep_origin, keep_token, keep_score, still = [], [], [], [], []
        top_l, origin_l, token_l = top.tolist(), origin.tolist(), token.tolist()
        for row, sent in enumerate(active):
            live: list[tuple[int, int, float]] = []
            for rank in range(2 * beam):
                score, o, tok = top_l[row][rank], origin_l[row][rank], token_l[row][rank]
                if score == float("-inf"):
                    break
                if tok == EOS:
                    if rank < beam and len(finished[sent]) < beam:
                        toks = prefix[row * beam + o, 1:].tolist()
                        finished[sent].append(
                            Hypothesis(toks, score / length_penalty(len(toks) + 1, alpha), score)
                        )
                elif len(live) < beam:
                    live.append((o, tok, score))
            if not live and not finished[sent]:  # nothing may follow (e.g. min_len): end
                best = float(scores[row, 0])  # the best live prefix as it is
                toks = prefix[row * beam, 1:].tolist()
                finished[sent].append(
                    Hypothesis(toks, best / length_penalty(len(toks) + 1, alpha), best)
                )
            if len(finished[sent]) >= beam or not live:
                continue  # this sentence is done
            while len(live) < beam:  # too few live extensions: pad with dead ones
                live.append((live[0][0], live[0][1], float("-inf")))
            still.append(sent)
            keep_rows.append(row)
            for o, tok, score in live:
                keep_origin.append(row * beam + o)
                keep_token.append(tok)
                keep_score.append(score)
        if not still:
            break
        index = torch.tensor(keep_origin, device=device)
        prefix = torch.cat(
            [prefix.index_select(0, index), torch.tensor(keep_token, device=device)[:, None]], dim=1
        )
        scores = torch.tensor(keep_score, device=device).view(len(still), beam)
        # the source side changes only when some sentences are done
        sentences = None if len(still) == n else torch.tensor(keep_rows, device=device)
        stepper.reorder(index, sentences)
        active = still
    return [sorted(hyps, key=lambda h: -h.score)[:nbest] for hyps in finished]
