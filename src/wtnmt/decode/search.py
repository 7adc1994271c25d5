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
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor

from wtnmt.decode.hypotheses import (
    PENALTY_FORMS,
    Hypothesis,
    greedy_hypotheses,
    length_penalty,
    settle,
)
from wtnmt.decode.sampling import Sampling, row_keys, sample_pick, sentence_key, uniforms
from wtnmt.decode.selection import force_tokens, row_argmax, top_extensions
from wtnmt.special import BOS, EOS, PAD


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


def _limits(  # type: ignore[no-untyped-def]
    model,
    src: Tensor,
    max_len_a: float,
    max_len_b: int,
    max_len: int | None,
    prefix: Tensor | None = None,
) -> Tensor:
    """Per sentence, the number of tokens after which EOS is forced: never inside its forced
    ``prefix`` [B, P] (PAD-padded)."""
    cap = model.max_positions - 1
    if max_len is not None:
        limit = torch.full((src.size(0),), min(max_len, cap), dtype=torch.long, device=src.device)
    else:
        limit = max_lengths(src, a=max_len_a, b=max_len_b, pad_id=model.pad_id, cap=cap)
    if prefix is not None:
        limit = torch.maximum(limit, prefix.ne(PAD).sum(1).clamp_max(cap))
    return limit


def _force(lprobs: Tensor, t: int, prefix: Tensor | None, rows: Tensor | None = None) -> None:
    """Step ``t`` of the forced ``prefix`` [B, P] (of the sentences ``rows``), in place."""
    if prefix is not None and t < prefix.size(1):
        want = prefix[:, t] if rows is None else prefix.index_select(0, rows)[:, t]
        force_tokens(lprobs.view(want.size(0), -1, lprobs.size(-1)), want, PAD)


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
    target_prefix: Tensor | None = None,
    sampling: Sampling | None = None,
    keys: Tensor | None = None,
) -> list[Hypothesis]:
    """The most probable next token at every step, for each sentence of ``src`` [B, S],
    after its forced ``target_prefix`` [B, P] (PAD-padded; the prefix is part of the output); with
    ``sampling``, a token drawn at every step instead, with the row ``keys`` [B] (``row_keys``)
    (a hypothesis's score is then its log-probability under the model)."""
    b = src.size(0)
    limit = _limits(model, src, max_len_a, max_len_b, max_len, target_prefix)
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
        _force(lprobs, t, target_prefix)
        if sampling is None:
            token = row_argmax(lprobs)
        else:
            s = sampling
            token = sample_pick(lprobs, uniforms(keys, t), s.temperature, s.top_k, s.top_p)  # type: ignore[arg-type]
        best.append(lprobs.gather(1, token[:, None])[:, 0])
        tokens[:, t + 1] = token.masked_fill_(done, PAD)
        done |= token.eq(EOS)
        if bool(done.all()):
            break
    return greedy_hypotheses(tokens[:, 1 : len(best) + 1], torch.stack(best, dim=1))


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
    target_prefix: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """The ``nbest`` best hypotheses of each sentence of ``src`` [B, S], best first, each
    beginning with the sentence's forced ``target_prefix`` [B, P] (PAD-padded) where given.

    The bookkeeping is batched: per step, a handful of tensor operations over all sentences,
    and Python only for the hypotheses that finish.
    """
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest={nbest} must be between 1 and beam={beam}")
    length_penalty(1, alpha, penalty_form)  # an unknown form fails before the search
    b, device = src.size(0), src.device
    limit = _limits(model, src, max_len_a, max_len_b, max_len, target_prefix)  # [n] active
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
        _force(lprobs, t, target_prefix, active)
        top, origin, token = top_extensions(lprobs, scores, 2 * beam)  # [n, C], best first
        rows, sentences = None, None
        if top.size(1) >= beam and not bool(
            token[:, :beam].eq(EOS).any() | top[:, beam - 1].isneginf().any()
        ):  # the usual step: no EOS among the best K, which all live on
            top, origin, token = top[:, :beam], origin[:, :beam], token[:, :beam]
        else:
            settled = settle(
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
    target_prefix: Tensor | None = None,
    sampling: Sampling | None = None,
) -> list[list[Hypothesis]]:
    """The ``nbest`` best hypotheses of each sentence of ``src``: greedy search when
    beam = nbest = 1, beam search otherwise; with ``sampling``, its ``samples`` samples of each
    sentence instead, in the order drawn (beam and nbest unused). ``target_prefix`` [B, P]: each
    sentence's forced target prefix (PAD-padded), or None. An engine with a search of its own
    (``search``, decode/native) runs it with these settings."""
    limits = {
        "max_len_a": max_len_a,
        "max_len_b": max_len_b,
        "min_len": min_len,
        "max_len": max_len,
        "target_prefix": target_prefix,
    }
    if sampling is not None:
        return _sample(model, src, sampling, limits)
    ranking = {"alpha": alpha, "penalty_form": penalty_form}
    if hasattr(model, "search"):
        return model.search(src, beam=beam, nbest=nbest, **ranking, **limits)  # type: ignore[no-any-return]
    with _torch_threads_beside(model):
        if beam == 1 and nbest == 1:
            return [[h] for h in greedy_search(model, src, **limits)]
        return beam_search(model, src, beam=beam, nbest=nbest, **ranking, **limits)


def sampling_rows(
    src: Tensor, prefix: Tensor | None, sampling: Sampling
) -> tuple[Tensor, Tensor | None, Tensor]:
    """Each sentence's rows repeated ``samples`` times (sentence-major), and each row's key
    (decode/sampling.py): the seed, the sentence's source ids and prefix, the sample."""
    keys = []
    for i, row in enumerate(src.tolist()):
        forced = [] if prefix is None else [t for t in prefix[i].tolist() if t != PAD]
        keys.append(sentence_key(sampling.seed, [t for t in row if t != PAD], forced))
    n = sampling.samples
    rows = row_keys(keys, n, src.device)
    if n == 1:
        return src, prefix, rows
    repeated = None if prefix is None else prefix.repeat_interleave(n, 0)
    return src.repeat_interleave(n, 0), repeated, rows


def _sample(model, src: Tensor, sampling: Sampling, limits: dict) -> list[list[Hypothesis]]:  # type: ignore[no-untyped-def,type-arg]
    """``sampling.samples`` samples of each sentence of ``src``, on ``model``'s engine."""
    src, limits["target_prefix"], keys = sampling_rows(src, limits["target_prefix"], sampling)
    if hasattr(model, "sample"):
        found = model.sample(src, sampling=sampling, keys=keys, **limits)
    else:
        with _torch_threads_beside(model):
            found = greedy_search(model, src, sampling=sampling, keys=keys, **limits)
    n = sampling.samples
    return [found[i : i + n] for i in range(0, len(found), n)]


@contextmanager
def _torch_threads_beside(model) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """One PyTorch thread while another engine runs the network on its own pool: the
    search's small operations gain nothing from more, and PyTorch's threads, which spin for
    a while after each parallel operation, took the cores from the engine's (beam 5 on 2
    cores: 1,760 output tokens/s with both pools at 2 threads, 2,050 with this)."""
    if not hasattr(model, "stepper") or getattr(model, "runs_on_torch", False):
        yield
        return
    if torch.get_num_threads() == 1:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


__all__ = [
    "PENALTY_FORMS",
    "Hypothesis",
    "Sampling",
    "beam_search",
    "greedy_hypotheses",
    "greedy_search",
    "length_penalty",
    "max_lengths",
    "sampling_rows",
    "search_batch",
]
