"""The model's decoding cache against the teacher-forced forward: step by step, reordered by
the beam, shared by a sentence's hypotheses, grown past the room it was given."""

from __future__ import annotations

import pytest
import torch

from test_model import VARIANTS, V, batch, make
from wtnmt.special import BOS


@pytest.mark.parametrize("name", list(VARIANTS))
def test_cached_decoding_equals_the_teacher_forced_forward(name):
    model = make(name)
    src, tgt = batch()
    full = model(src, tgt).logits  # [B, T, V]
    cache = model.init_cache(model.encode(src))
    steps = [model.decode_step(tgt[:, t], cache) for t in range(tgt.size(1))]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, rtol=1e-10, atol=1e-10)
    assert cache.step == tgt.size(1)


def test_cache_reorder_follows_the_selected_rows():
    model = make("weighted")
    src, tgt = batch()
    cache = model.init_cache(model.encode(src))
    for t in range(3):
        model.decode_step(tgt[:, t], cache)
    index = torch.tensor([2, 2, 0])
    reordered = cache.reorder(index, sentences=index)  # one hypothesis per sentence
    step = model.decode_step(tgt[index, 3], reordered)
    full = model(src[index], tgt[index, :4]).logits[:, 3]
    torch.testing.assert_close(step, full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["weighted", "transformer-pre", "transparent-post"])
def test_hypotheses_share_their_sentence_source_side_in_the_cache(name):
    """G hypotheses per sentence decode against one copy of the source keys and values."""
    model = make(name)
    src, tgt = batch()
    g = 2
    rows = torch.arange(3).repeat_interleave(g)  # hypothesis → its sentence
    hyps = tgt[rows].clone()
    hyps[1::2, 2:] = torch.randint(4, V, hyps[1::2, 2:].shape)  # the second one differs
    cache = model.init_cache(model.encode(src))
    assert cache.layers[0].cross_k.size(1) == 3  # per sentence, not per hypothesis
    steps = [model.decode_step(hyps[:, t], cache) for t in range(4)]
    full = model(src[rows], hyps[:, :4]).logits
    torch.testing.assert_close(torch.stack(steps, dim=1), full, rtol=1e-10, atol=1e-10)
    # reorder within sentences (beam search), then drop sentence 1 (it is done)
    index = torch.tensor([1, 1, 5, 4])  # hypotheses of sentences 0, 0, 2, 2
    reordered = cache.reorder(index, sentences=torch.tensor([0, 2]))
    step = model.decode_step(hyps[index, 4], reordered)
    full = model(src[rows[index]], hyps[index, :5]).logits[:, 4]
    torch.testing.assert_close(step, full, rtol=1e-10, atol=1e-10)


def test_the_cache_grows_past_the_room_it_was_given():
    """Buffers sized for 3 steps of 1 hypothesis, used for 20 steps of 2 per sentence."""
    model = make("weighted")
    src, _ = batch()
    g = torch.Generator().manual_seed(5)
    hyps = torch.randint(4, V, (6, 20), generator=g)
    hyps[:, 0] = BOS
    rows = torch.arange(3).repeat_interleave(2)
    cache = model.init_cache(model.encode(src), steps=3, hypotheses=1)
    steps = [model.decode_step(hyps[:, t], cache) for t in range(20)]
    full = model(src[rows], hyps).logits
    torch.testing.assert_close(torch.stack(steps, dim=1), full, rtol=1e-10, atol=1e-10)
    assert cache.layers[0].self_k.shape[2:4] == (24, 2)  # 3 → 6 → 12 → 24 steps, 2 slots
