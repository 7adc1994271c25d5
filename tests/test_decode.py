"""Search: beam and greedy on a scripted model, the two-stage top-k, cached decoding."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from wtnmt.config import ModelConfig
from wtnmt.decode import beam_search, greedy_search, length_penalty
from wtnmt.decode import search as search_module
from wtnmt.decode.selection import row_argmax, top_extensions
from wtnmt.model import build_model
from wtnmt.special import EOS, PAD

# --------------------------------------------------------------------------------------------
# A scripted model: next-token probabilities fixed by the prefix


A, B = 4, 5
SCRIPT = {  # prefix (after BOS) → {token: probability}
    (): {A: 0.6, B: 0.3, EOS: 0.1},
    (A,): {EOS: 0.5, B: 0.4, A: 0.1},
    (B,): {EOS: 0.9, A: 0.05, B: 0.05},
    (A, B): {EOS: 1.0},
}
OTHERWISE = {EOS: 0.7, A: 0.2, B: 0.1}


@dataclass
class _Positions:
    max_positions: int = 64


@dataclass
class _Cache:
    prefixes: list[tuple[int, ...]]
    step: int = 0

    def reorder(self, index, sentences=None):
        return _Cache([self.prefixes[i] for i in index.tolist()], self.step)


class ScriptedModel:
    script = SCRIPT
    pad_id = PAD
    positions = _Positions()
    max_positions = positions.max_positions
    vocab = 6

    def encode(self, src):
        return src

    def init_cache(self, enc, steps=None, hypotheses=1):
        return _Cache([() for _ in range(enc.size(0))])

    def _logits(self, prefix):
        probs = self.script.get(prefix, OTHERWISE)
        row = torch.full((self.vocab,), float("-inf"))
        for token, p in probs.items():
            row[token] = math.log(p)
        return row

    def decode_step(self, tokens, cache):
        if len(cache.prefixes) != len(tokens):  # G hypotheses per sentence, as the real cache
            group = len(tokens) // len(cache.prefixes)
            cache.prefixes = [p for p in cache.prefixes for _ in range(group)]
        if cache.step > 0:
            cache.prefixes = [(*p, int(t)) for p, t in zip(cache.prefixes, tokens, strict=True)]
        cache.step += 1
        return torch.stack([self._logits(p) for p in cache.prefixes])


def lp(length, alpha=0.6):
    return ((5 + length) / 6) ** alpha


def test_beam_search_on_a_scripted_model_matches_the_hand_computation():
    src = torch.tensor([[7, EOS]])
    # beam 2. Step 0: A (log .6) and B (log .3) live; EOS (log .1) ranks 3rd of 4, beyond the
    # beam, so it is not finished. Step 1: A·EOS (log .6·.5) and B·EOS (log .3·.9) rank 1st
    # and 2nd: both finish, the sentence has 2 = beam finished hypotheses and stops, before
    # A·B (log .6·.4), ranked 3rd, is explored.
    hyps = beam_search(ScriptedModel(), src, beam=2, nbest=2, alpha=0.6)[0]
    assert [h.tokens for h in hyps] == [[A], [B]]
    assert hyps[0].log_prob == pytest.approx(math.log(0.6 * 0.5), abs=1e-6)
    assert hyps[0].score == pytest.approx(math.log(0.6 * 0.5) / lp(2), abs=1e-6)
    assert hyps[1].score == pytest.approx(math.log(0.3 * 0.9) / lp(2), abs=1e-6)


def test_beam_three_finishes_the_empty_hypothesis_and_ranks_by_length_penalty():
    src = torch.tensor([[7, EOS]])
    # beam 3: at step 0 EOS ranks 3rd < 3, so "" finishes with log .1 (length 1); only two
    # live hypotheses remain. Step 1: A·EOS and B·EOS finish: 3 finished, done.
    hyps = beam_search(ScriptedModel(), src, beam=3, nbest=3, alpha=0.6)[0]
    assert [h.tokens for h in hyps] == [[A], [B], []]
    assert hyps[2].score == pytest.approx(math.log(0.1) / lp(1), abs=1e-6)
    # a strong length penalty divides longer hypotheses by more: with α = 3 the ranking of
    # A (len 2) over "" (len 1) still holds but the margin follows the formula
    strong = beam_search(ScriptedModel(), src, beam=3, nbest=3, alpha=3.0)[0]
    assert strong[0].score == pytest.approx(math.log(0.3) / lp(2, 3.0), abs=1e-6)


def test_maximum_length_forces_the_end():
    src = torch.tensor([[7, EOS]])
    hyps = beam_search(ScriptedModel(), src, beam=2, nbest=2, max_len=1)[0]
    assert all(len(h.tokens) <= 1 for h in hyps)
    # beam 2 reaches length 3: A·B may only end, so A·A·A (then EOS at the limit) wins
    forced = beam_search(ScriptedModel(), src, beam=2, min_len=3, max_len=3)[0][0]
    assert forced.tokens == [A, A, A]
    # beam 1 walks into A·B, after which nothing but the blocked EOS may follow: the search
    # ends the prefix as it is rather than returning nothing
    dead_end = beam_search(ScriptedModel(), src, beam=1, min_len=3, max_len=3)[0]
    assert [h.tokens for h in dead_end] == [[A, B]]
    assert greedy_search(ScriptedModel(), src)[0].tokens == [A]
    assert length_penalty(1, 0.6) == 1.0


# --------------------------------------------------------------------------------------------
# The two-stage top-k against torch.topk


def plain_top_extensions(lprobs, scores, k):
    n, g, v = lprobs.shape
    top, flat = (scores[:, :, None] + lprobs).view(n, -1).topk(min(k, g * v), dim=1)
    return top, flat // v, flat % v


@given(
    n=st.integers(1, 3),
    g=st.integers(1, 5),
    v=st.sampled_from([6, 512, 513, 700, 1024, 8000]),
    k=st.integers(1, 12),
    dead=st.floats(0.0, 0.999),
    seed=st.integers(0, 2**16),
)
def test_block_top_k_is_top_k(n, g, v, k, dead, seed):
    gen = torch.Generator().manual_seed(seed)
    lprobs = torch.randn(n, g, v, generator=gen).log_softmax(-1)  # continuous: no ties
    lprobs[torch.rand(n, g, v, generator=gen) < dead] = float("-inf")  # ruled-out tokens
    scores = torch.randn(n, g, generator=gen) * 3
    scores[:, 1:][torch.rand(n, g - 1, generator=gen) < 0.3] = float("-inf")  # dead beams
    got, want = top_extensions(lprobs, scores, k), plain_top_extensions(lprobs, scores, k)
    assert torch.equal(got[0], want[0])  # the same values, best first
    finite = want[0].isfinite()  # among -inf extensions any is as good as another
    for a, b in zip(got[1:], want[1:], strict=True):
        assert torch.equal(a[finite], b[finite])


@given(
    n=st.integers(1, 4),
    v=st.sampled_from([6, 512, 513, 700, 1024, 8000]),
    levels=st.integers(2, 1000),
    dead=st.floats(0.0, 0.999),
    seed=st.integers(0, 2**16),
)
def test_block_argmax_is_argmax_first_among_ties(n, v, levels, dead, seed):
    gen = torch.Generator().manual_seed(seed)
    # few distinct values: ties within a block, across blocks and in the short last block
    x = torch.randint(0, levels, (n, v), generator=gen).float()
    x[torch.rand(n, v, generator=gen) < dead] = float("-inf")
    x[0, -1] = x[0].max()  # a maximum in the last column (the clamped columns repeat it)
    assert torch.equal(row_argmax(x), x.argmax(1))
    assert torch.equal(row_argmax(torch.full((n, v), float("-inf"))), torch.zeros(n).long())


def test_search_with_the_block_top_k_equals_search_with_topk(monkeypatch):
    torch.manual_seed(2)
    config = ModelConfig(encoder_layers=1, decoder_layers=2, d_model=32, heads=4, d_ff=64)
    model = build_model(config, vocab_size=1000).eval()  # wide enough for the block path
    src = source_batch()
    fast = beam_search(model, src, beam=5, nbest=5)
    monkeypatch.setattr(search_module, "top_extensions", plain_top_extensions)
    assert beam_search(model, src, beam=5, nbest=5) == fast


# --------------------------------------------------------------------------------------------
# Real (tiny, random) models


def models():
    for overrides in (
        {"attention": "branched"},
        {"attention": "multihead", "norm": "pre"},
        {"attention": "branched", "decoder_self_attention": "weighted"},
    ):
        torch.manual_seed(1)
        config = ModelConfig(
            encoder_layers=2, decoder_layers=2, d_model=32, heads=4, d_ff=64, **overrides
        )
        yield build_model(config, vocab_size=24).eval()


def source_batch():
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, 24, (6, 9), generator=g)
    src[:, -1] = EOS
    src[2, 4:] = PAD
    src[4, 6:] = PAD
    return src


def test_beam_size_one_is_greedy():
    for model in models():
        src = source_batch()
        greedy = greedy_search(model, src)
        beam = beam_search(model, src, beam=1)
        assert [h.tokens for h in greedy] == [b[0].tokens for b in beam]
        for g, b in zip(greedy, beam, strict=True):
            assert b[0].log_prob == pytest.approx(g.log_prob, abs=1e-4)


def test_cached_decoding_gives_the_same_tokens_and_scores_as_recomputing():
    for model in models():
        src = source_batch()
        with_cache = beam_search(model, src, beam=4, nbest=3)
        without = beam_search(model, src, beam=4, nbest=3, use_cache=False)
        for a, b in zip(with_cache, without, strict=True):
            assert [h.tokens for h in a] == [h.tokens for h in b]
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)
        greedy_a = greedy_search(model, src)
        greedy_b = greedy_search(model, src, use_cache=False)
        assert [h.tokens for h in greedy_a] == [h.tokens for h in greedy_b]


def test_long_outputs_match_recomputing():
    # 40 steps, one hypothesis per sentence at step 0 and five afterwards
    model = next(models())
    src = source_batch()[:3]
    cached = beam_search(model, src, beam=5, nbest=5, min_len=40, max_len=40)
    plain = beam_search(model, src, beam=5, nbest=5, min_len=40, max_len=40, use_cache=False)
    for a, b in zip(cached, plain, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)
    assert len(cached[0][0].tokens) == 40


def test_forced_length_for_benchmarks():
    model = next(models())
    hyps = beam_search(model, source_batch(), beam=5, min_len=24, max_len=24)
    assert all(len(h[0].tokens) == 24 for h in hyps)
