"""Greedy and beam search over the model's ``encode`` / ``decode_step`` interface (or over
another engine's network with a stepper of its own: decode/onnx_engine.py).

Search is a policy over a model, so it lives outside it (STYLE.md). Both searches are batched
over sentences and use the key/value cache; ``use_cache=False`` re-runs the decoder over the
whole prefix at every step instead (the reference the cache is tested and timed against).

Beam search, per sentence, keeps ``beam`` live hypotheses ranked by their summed
log-probability. At each step the 2·beam best extensions are considered in order: one that
ends with EOS while ranked among the first ``beam`` is finished, scored as its log-probability
divided by a length penalty lp(y), and the best ``beam`` others live on. Two forms of lp
(``form``), |y| counting EOS: Wu et al.'s (2016) "gnmt", ((5 + |y|) / 6)^α, and fairseq's
"fairseq", |y|^α (its ``--lenpen``; α = 1, its default, is the mean log-probability a
token). α = 0 is no normalization in either form.
A sentence is done once it has ``beam`` finished hypotheses (or reached its maximum length,
where EOS is forced); the search stops as soon as every sentence is done.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from wtnmt.decode.selection import row_argmax, top_extensions
from wtnmt.special import BOS, EOS, PAD


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


def max_lengths(src: Tensor, *, a: float, b: int, pad_id: int, cap: int) -> Tensor:
    """Per-sentence limit on output tokens before EOS, a·|src| + b (|src| without padding),
    at most ``cap``."""
    src_len = src.ne(pad_id).sum(dim=1)
    return (a * src_len.float() + b).long().clamp(1, cap)


class _Stepper:
    """Next-token log-probabilities, with the cache or by recomputing the prefix.

    Hypotheses are numbered in sentence order (G per sentence); ``reorder`` keeps, reorders or
    multiplies them. The cache holds the source side once per sentence; the recomputing
    reference expands it to every hypothesis.
    """

    def __init__(self, model, src: Tensor, use_cache: bool, steps: int, group: int) -> None:  # type: ignore[no-untyped-def]
        self.model = model
        self.enc = model.encode(src)
        self.cache = None
        if use_cache:  # room for ``steps`` steps of ``group`` hypotheses per sentence
            self.cache = model.init_cache(self.enc, steps=steps, hypotheses=group)

    def reorder(self, index: Tensor, sentences: Tensor | None) -> None:
        """Keep hypotheses ``index``; ``sentences``: the source sentences still searched."""
        if self.cache is not None:
            self.cache = self.cache.reorder(index, sentences)
        else:
            self.enc = replace(
                self.enc,
                memories=[m.index_select(0, index) for m in self.enc.memories],
                src_pad=self.enc.src_pad.index_select(0, index),
            )

    def __call__(self, prefix: Tensor) -> Tensor:
        """prefix [N, t] (BOS first) → log-probabilities of the next token [N, V]."""
        if self.cache is not None:
            logits = self.model.decode_step(prefix[:, -1], self.cache)
        else:
            states, _, _ = self.model.decode(prefix, self.enc)
            logits = self.model.embedding.logits(states[:, -1])
        return F.log_softmax(logits.float(), dim=-1)


def _start(model, src: Tensor, *, use_cache: bool, steps: int, group: int):  # type: ignore[no-untyped-def]
    """The stepper of ``model``: a PyTorch model's (above), or the one another engine's
    network makes (``stepper(src, steps=, group=)``, e.g. decode/onnx_engine.py)."""
    if hasattr(model, "stepper"):
        return model.stepper(src, steps=steps, group=group)
    return _Stepper(model, src, use_cache, steps=steps, group=group)


def _constrain(lprobs: Tensor, t: int, min_len: int, forced: Tensor | None) -> Tensor:
    """Rule out what may not come next, in place: PAD and BOS never, EOS before ``min_len``;
    rows ``forced`` [N] (True: at the length limit) may only end. lprobs [N, ..., V]."""
    # a column view filled in place: one operation, where indexed assignment of a Python
    # float costs three or four (the scalar becomes a tensor, then index_put)
    for token in (PAD, BOS) if t >= min_len else (PAD, BOS, EOS):
        lprobs.narrow(-1, token, 1).fill_(float("-inf"))
    if forced is not None:
        lprobs[forced] = float("-inf")
        lprobs[forced, ..., EOS] = 0.0
    return lprobs


def _limits(model, src: Tensor, max_len_a: float, max_len_b: int, max_len: int | None) -> Tensor:  # type: ignore[no-untyped-def]
    """Per sentence, the number of tokens after which EOS is forced."""
    cap = model.max_positions - 1
    if max_len is not None:
        return torch.full((src.size(0),), min(max_len, cap), dtype=torch.long, device=src.device)
    return max_lengths(src, a=max_len_a, b=max_len_b, pad_id=model.pad_id, cap=cap)


@torch.inference_mode()
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
    limit = _limits(model, src, max_len_a, max_len_b, max_len)
    first_forced, steps = int(limit.min()), int(limit.max()) + 1  # step t = limit forces EOS
    stepper = _start(model, src, use_cache=use_cache, steps=steps, group=1)
    # BOS, then one column a step, written in place (PAD once a sentence has ended)
    tokens = torch.full((b, steps + 1), PAD, dtype=torch.long, device=src.device)
    tokens[:, 0] = BOS
    done = torch.zeros(b, dtype=torch.bool, device=src.device)
    best = []  # [B] a step: the log-probability of the token chosen
    for t in range(steps):
        forced = limit.le(t) if t >= first_forced else None
        lprobs = _constrain(stepper(tokens[:, : t + 1]), t, min_len, forced)  # [B, V]
        token = row_argmax(lprobs)
        best.append(lprobs.gather(1, token[:, None])[:, 0])
        tokens[:, t + 1] = token.masked_fill_(done, PAD)
        done |= token.eq(EOS)
        if bool(done.all()):
            break
    return greedy_hypotheses(tokens[:, 1 : len(best) + 1], torch.stack(best, dim=1))


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


def _settle(
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


@torch.inference_mode()
def beam_search(
    model,
    src: Tensor,
    *,
    beam: int = 4,
    nbest: int = 1,
    alpha: float = 0.6,  # type: ignore[no-untyped-def]
    penalty_form: str = "gnmt",
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    min_len: int = 0,
    max_len: int | None = None,
    use_cache: bool = True,
) -> list[list[Hypothesis]]:
    """The ``nbest`` best hypotheses of each sentence of ``src`` [B, S], best first.

    The bookkeeping is batched: per step, a handful of tensor operations over all sentences,
    and Python only for the hypotheses that finish.
    """
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest={nbest} must be between 1 and beam={beam}")
    length_penalty(1, alpha, penalty_form)  # an unknown form fails before the search
    b, device = src.size(0), src.device
    limit = _limits(model, src, max_len_a, max_len_b, max_len)  # [n] of the active sentences
    first_forced = int(limit.min())
    stepper = _start(model, src, use_cache=use_cache, steps=int(limit.max()) + 1, group=beam)
    # step 0 has a single hypothesis per sentence (the empty prefix); K from step 1 on
    prefix = torch.full((b, 1), BOS, dtype=torch.long, device=device)
    scores = torch.zeros(b, 1, device=device)  # [n, G] summed log-probabilities
    finished: list[list[Hypothesis]] = [[] for _ in range(b)]
    active = torch.arange(b, device=device)  # batch rows of the sentences still searching
    for t in range(int(limit.max()) + 1):  # step t = limit forces EOS
        n, group = scores.shape
        forced = limit.le(t) if t >= first_forced else None
        lprobs = stepper(prefix).view(n, group, -1)  # [n, G, V]
        _constrain(lprobs, t, min_len, forced)
        top, origin, token = top_extensions(lprobs, scores, 2 * beam)  # [n, C], best first
        rows, sentences = None, None
        if top.size(1) >= beam and not bool(
            token[:, :beam].eq(EOS).any() | top[:, beam - 1].isneginf().any()
        ):  # the usual step: no EOS among the best K, which all live on
            top, origin, token = top[:, :beam], origin[:, :beam], token[:, :beam]
        else:
            settled = _settle(
                top, origin, token, scores, prefix, active, finished, beam, alpha, penalty_form
            )
            if settled is None:
                break
            top, origin, token, rows = settled
            if rows is not None:  # some sentences are done: the source side shrinks
                sentences, active, limit = rows, active[rows], limit[rows]
        if rows is None:
            rows = torch.arange(n, device=device)
        index = (rows[:, None] * group + origin).view(-1)  # [n'·K]
        prefix = torch.cat([prefix.index_select(0, index), token.reshape(-1, 1)], dim=1)
        scores = top
        stepper.reorder(index, sentences)
    return [sorted(hyps, key=lambda h: -h.score)[:nbest] for hyps in finished]


def search_batch(
    model,  # type: ignore[no-untyped-def]
    src: Tensor,
    *,
    beam: int,
    nbest: int = 1,
    alpha: float = 0.6,
    penalty_form: str = "gnmt",
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    min_len: int = 0,
    max_len: int | None = None,
) -> list[list[Hypothesis]]:
    """The ``nbest`` best hypotheses of each sentence of ``src``: greedy search when
    beam = nbest = 1, beam search otherwise. An engine with a search of its own (``search``,
    decode/native) runs it with these settings."""
    limits = {
        "max_len_a": max_len_a,
        "max_len_b": max_len_b,
        "min_len": min_len,
        "max_len": max_len,
    }
    ranking = {"alpha": alpha, "penalty_form": penalty_form}
    if hasattr(model, "search"):
        return model.search(src, beam=beam, nbest=nbest, **ranking, **limits)  # type: ignore[no-any-return]
    with _torch_threads_beside(model):
        if beam == 1 and nbest == 1:
            return [[h] for h in greedy_search(model, src, **limits)]
        return beam_search(model, src, beam=beam, nbest=nbest, **ranking, **limits)


@contextmanager
def _torch_threads_beside(model) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """One PyTorch thread while another engine runs the network on its own pool: the
    search's small operations gain nothing from more, and PyTorch's threads, which spin for
    a while after each parallel operation, took the cores from the engine's (beam 5 on 2
    cores: 1,760 output tokens/s with both pools at 2 threads, 2,050 with this)."""
    if not hasattr(model, "stepper") or torch.get_num_threads() == 1:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
