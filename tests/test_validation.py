"""Validation during training against the plain computation: the teacher-forced loss of each
dev batch, and greedy decoding of its sources on their own (``greedy_search(model, src)``)."""

from __future__ import annotations

import dataclasses
import math
from contextlib import nullcontext

import pytest
import torch

from helpers import sentence, tiny_run_config, write_pairs
from wtnmt.data import ParallelData, Vocabulary, plan_batches
from wtnmt.data.prepare import prepare
from wtnmt.decode import evaluate
from wtnmt.decode.evaluate import score_corpus
from wtnmt.decode.search import greedy_search
from wtnmt.loss import label_smoothed_cross_entropy
from wtnmt.model import build_model
from wtnmt.train.update import teacher_forced
from wtnmt.train.validation import validate

MAX_TOKENS = 60  # several dev batches, some with padded sources


@pytest.fixture(scope="module")
def setup(tmp_path_factory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("validation")
    config = tiny_run_config(tmp)
    # dev sources of 2 to 6 words, so that batches of mixed lengths pad
    write_pairs(tmp, "valid", [sentence(10_000 + i, 2 + i % 5) for i in range(12)])
    prepare(config.data, tmp / "prepared", log=lambda _: None)
    vocab = Vocabulary(tmp / "prepared" / "spm.model")
    torch.manual_seed(0)
    model = build_model(config.model, vocab_size=len(vocab)).eval()
    return config, model, ParallelData(tmp / "prepared", "valid"), vocab


def dev_batches(data):  # type: ignore[no-untyped-def]
    """The dev batches in validate's order."""
    lengths = data.src_lengths, data.tgt_lengths
    return plan_batches(*lengths, max_tokens=MAX_TOKENS, seed=0, epoch=0, shuffle=False).batches


def plainly(config, model, data, vocab):  # type: ignore[no-untyped-def]
    """Each batch's loss and nll sums, the target tokens and the greedy decodings."""
    batches = dev_batches(data)
    loss_sum = nll_sum = 0.0
    tokens, hyps = 0, [""] * len(data)
    with torch.no_grad():
        for indices in batches:
            batch = data.collate(indices)
            inputs, target = teacher_forced(batch, torch.device("cpu"))
            logits = model(**inputs).logits
            loss, nll = label_smoothed_cross_entropy(logits, target, epsilon=0.1)
            loss_sum, nll_sum = loss_sum + float(loss.sum()), nll_sum + float(nll.sum())
            tokens += batch.target_tokens
            found = greedy_search(model, batch.src, max_len_a=config.decode.max_len_a, max_len_b=3)
            for i, h in zip(indices, found, strict=True):
                hyps[int(i)] = vocab.decode(h.tokens)
    assert len(batches) > 1
    return loss_sum / tokens, nll_sum / tokens, hyps


def validated(config, model, data, vocab, references, autocast=nullcontext):  # type: ignore[no-untyped-def]
    """validate's scores, and the decodings it scored."""
    decode = dataclasses.replace(config.decode, max_len_b=3)
    scored = []

    def score(hyps, refs):  # type: ignore[no-untyped-def]
        scored.append(hyps)
        return score_corpus(hyps, refs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluate, "score_corpus", score)
        scores = validate(
            model,
            data,
            vocab=vocab,
            references=references,
            decode=decode,
            max_tokens=MAX_TOKENS,
            label_smoothing=0.1,
            device=torch.device("cpu"),
            autocast=autocast,
        )
    return scores, (scored[0] if scored else None)


def test_float32_validation_is_the_plain_loss_and_greedy_decoding(setup):
    config, model, data, vocab = setup
    model.eval()
    loss, nll, hyps = plainly(config, model, data, vocab)
    assert len(set(hyps)) > len(hyps) // 2  # decodings that differ, to compare
    scores, decoded = validated(config, model, data, vocab, references=hyps)
    assert decoded == hyps
    assert scores["valid_loss"] == loss
    assert scores["valid_nll"] == nll
    assert scores["valid_ppl"] == math.exp(nll)
    assert scores["valid_bleu"] == score_corpus(hyps, hyps)["bleu"]


def test_under_autocast_greedy_decoding_stays_float32(setup):
    """bf16 autocast changes the loss, not the decodings: the greedy search runs in float32
    (on any CPU, native bf16 or emulated)."""
    config, model, data, vocab = setup
    model.eval()
    loss, _, hyps = plainly(config, model, data, vocab)
    scores, decoded = validated(
        config,
        model,
        data,
        vocab,
        references=hyps,
        autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    )
    assert decoded == hyps
    assert scores["valid_loss"] != loss  # the loss was bf16's
    assert scores["valid_loss"] == pytest.approx(loss, rel=0.05)
