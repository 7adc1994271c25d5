"""Validation during training: dev loss and perplexity, and BLEU of greedy decoding."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import torch
from torch import nn

from wtnmt.config import DecodeConfig
from wtnmt.data import Batch, ParallelData, Vocabulary, plan_batches
from wtnmt.data.io import decode_lines, read_bytes
from wtnmt.loss import label_smoothed_cross_entropy
from wtnmt.train.update import teacher_forced


def valid_references(path: Path, *, expected: int) -> list[str] | None:
    """The dev set's raw target text, if there is one line per dev pair (split on "\\n" only,
    as the readers do: ``str.splitlines`` would also split inside a sentence)."""
    if not path.is_file():
        return None
    lines = decode_lines(read_bytes(path), str(path))
    return lines if len(lines) == expected else None


def _greedy(
    model: nn.Module, batch: Batch, vocab: Vocabulary, decode: DecodeConfig, device
) -> list[str]:  # type: ignore[no-untyped-def]
    from wtnmt.decode.search import greedy_search

    hyps = greedy_search(
        model, batch.src.to(device), max_len_a=decode.max_len_a, max_len_b=decode.max_len_b
    )
    return [vocab.decode(h.tokens) for h in hyps]


@torch.no_grad()
def validate(
    model: nn.Module,
    data: ParallelData,
    *,
    vocab: Vocabulary | None,
    references: list[str] | None,
    decode: DecodeConfig,
    max_tokens: int,
    label_smoothing: float,
    device: torch.device,
    autocast: Callable[[], AbstractContextManager],
) -> dict[str, float]:
    """valid_loss, valid_nll, valid_ppl, and valid_bleu when ``references`` are given."""
    model.eval()
    plan = plan_batches(
        data.src_lengths, data.tgt_lengths, max_tokens=max_tokens, seed=0, epoch=0, shuffle=False
    )
    loss_sum = nll_sum = 0.0
    tokens = 0
    want_bleu = references is not None and vocab is not None
    hyps = [""] * len(data)
    for indices in plan.batches:
        b = data.collate(indices)
        inputs, target = teacher_forced(b, device)
        with autocast():
            logits = model(**inputs).logits
        loss, nll = label_smoothed_cross_entropy(logits, target, epsilon=label_smoothing)
        loss_sum, nll_sum = loss_sum + float(loss.sum()), nll_sum + float(nll.sum())
        tokens += b.target_tokens
        if want_bleu:
            for i, hyp in zip(indices, _greedy(model, b, vocab, decode, device), strict=True):  # type: ignore[arg-type]
                hyps[int(i)] = hyp
    model.train()
    nll = nll_sum / max(tokens, 1)
    scores = {
        "valid_loss": loss_sum / max(tokens, 1),
        "valid_nll": nll,
        "valid_ppl": math.exp(min(nll, 50)),
    }
    if want_bleu:
        from wtnmt.decode.evaluate import score_corpus

        scores["valid_bleu"] = score_corpus(hyps, references)["bleu"]  # type: ignore[arg-type]
    return scores


__all__ = ["valid_references", "validate"]
