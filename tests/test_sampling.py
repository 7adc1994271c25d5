"""Sampling (`translate --sampling`, ``Sampling`` in the API, ``sampling`` in a server request):
tokens drawn with their frequencies within binomial bounds of the model's probabilities as an
independent float64 oracle filters them (temperature, top-k, top-p); the same seed gives the
same samples, on every engine, in any batch and on any number of workers; every option is
checked in one line."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import one_line, train_tiny
from wtnmt.cli import main as cli
from wtnmt.config import load_config
from wtnmt.decode.sampling import Sampling, mix32, mix32_tensor
from wtnmt.decode.search import _Stepper, search_batch
from wtnmt.model import build_model
from wtnmt.special import BOS, EOS, PAD

VOCAB = 24


def _model(seed: int = 3, vocab: int = VOCAB) -> torch.nn.Module:
    """A tiny random Weighted Transformer whose first-token distribution is spread: many
    tokens with a fair share of the probability."""
    torch.manual_seed(seed)
    config = load_config("weighted-tiny", ["model.d_model=32", "model.d_ff=64", "model.heads=4"])
    return build_model(config.model, vocab_size=vocab).eval()


def _source() -> torch.Tensor:
    return torch.tensor([[5, 9, 11, 7, EOS]])


def _first_step_probabilities(model, src, temperature, top_k, top_p) -> list[float]:  # type: ignore[no-untyped-def]
    """The oracle: the model's first-step distribution (PAD and BOS ruled out), sharpened by
    the temperature and cut to top-k, then top-p, in float64 and plain Python."""
    with torch.no_grad():
        lprobs = _Stepper(model, src, use_cache=False, steps=1, group=1)(torch.tensor([[BOS]]))[
            0
        ].double()
    vocab = lprobs.size(0)
    scores = {i: float(lprobs[i]) / temperature for i in range(vocab) if i not in (PAD, BOS)}
    ranked = sorted(scores, key=lambda i: (-scores[i], i))
    if top_k:
        ranked = ranked[:top_k]
    top = max(scores[i] for i in ranked)
    weights = {i: math.exp(scores[i] - top) for i in ranked}
    total = sum(weights.values())
    probs = {i: w / total for i, w in weights.items()}
    if top_p < 1.0:
        kept, held = [], 0.0
        for i in ranked:
            if held >= top_p:
                break
            kept.append(i)
            held += probs[i]
        probs = {i: probs[i] / held for i in kept}
    return [probs.get(i, 0.0) for i in range(vocab)]


def _first_tokens(engine, src, sampling: dict, draws: int) -> list[int]:  # type: ignore[no-untyped-def]
    """The first token of ``draws`` samples (EOS for an empty one), over seeds of 1,000."""
    found = []
    for seed in range(draws // 1000):
        drawn = Sampling(samples=1000, seed=seed, **sampling)
        for hyp in search_batch(engine, src, beam=1, max_len=1, sampling=drawn)[0]:
            found.append(hyp.tokens[0] if hyp.tokens else EOS)
    return found


SETTINGS = [
    {},
    {"temperature": 0.6},
    {"temperature": 1.7, "top_k": 6},
    {"top_p": 0.7},
    {"temperature": 0.8, "top_k": 10, "top_p": 0.85},
]


# a vocabulary of 600 whose distribution is nearly flat: top-p 0.2 finds its tokens among
# the 256 most probable, 0.9 among all of them (decode/sampling.py's NUCLEUS_FIRST)
WIDE = [{"top_p": 0.2}, {"top_p": 0.9}, {"temperature": 3.0, "top_k": 300, "top_p": 0.5}]


@pytest.mark.parametrize(
    ("sampling", "vocab"),
    [(s, VOCAB) for s in SETTINGS] + [(s, 600) for s in WIDE],
    ids=lambda s: str(s) or "plain",
)
def test_drawn_tokens_follow_the_models_filtered_distribution(sampling, vocab):
    model, src, draws = _model(vocab=vocab), _source(), 4000
    want = _first_step_probabilities(
        model, src, sampling.get("temperature", 1.0), sampling.get("top_k", 0),
        sampling.get("top_p", 1.0),
    )  # fmt: skip
    assert sum(p > 0.5 / len(want) for p in want) >= 3  # a distribution worth testing
    counts = [0] * vocab
    for token in _first_tokens(model, src, sampling, draws):
        counts[token] += 1
    for token, (count, p) in enumerate(zip(counts, want, strict=True)):
        if p == 0.0:
            assert count == 0, (token, count)  # filtered out: never drawn
            continue
        # 5 standard deviations: a false alarm once in ~3 million tokens tested
        bound = 5 * math.sqrt(draws * p * (1 - p)) + 1
        assert abs(count - draws * p) <= bound, (token, count, draws * p)


def test_the_hash_behind_the_draws_is_the_same_on_tensors_and_integers():
    values = [0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 123456789, 0xDEADBEEF]
    tensor = mix32_tensor(torch.tensor(values, dtype=torch.long)).tolist()
    assert tensor == [mix32(v) for v in values]
    assert mix32(1) != mix32(2) and len({mix32(v) for v in values}) == len(values)


def test_the_same_seed_gives_the_same_samples_in_any_batch():
    model = _model()
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, VOCAB, (4, 6), generator=g)
    src[:, -1] = EOS
    src[2, 3:] = PAD
    src[2, 2] = EOS
    drawn = Sampling(samples=3, seed=11, top_k=8)
    batch = search_batch(model, src, beam=1, sampling=drawn)
    assert search_batch(model, src, beam=1, sampling=drawn) == batch  # again: the same
    alone = search_batch(model, src[2:3, :3], beam=1, sampling=drawn)  # no padding, alone
    assert [h.tokens for h in alone[0]] == [h.tokens for h in batch[2]]
    reordered = search_batch(model, src.flip(0), beam=1, sampling=drawn)
    assert [[h.tokens for h in s] for s in reordered[::-1]] == [
        [h.tokens for h in s] for s in batch
    ]
    other = search_batch(model, src, beam=1, sampling=Sampling(samples=3, seed=12, top_k=8))
    assert [[h.tokens for h in s] for s in other] != [[h.tokens for h in s] for s in batch]
    # the samples of a sentence differ from each other, and each is scored by the model
    assert len({tuple(h.tokens) for s in batch for h in s}) > 6
    for hyps in batch:
        for h in hyps:
            assert h.score == h.log_prob < 0


def test_the_native_engine_draws_what_the_pytorch_engine_draws():
    from wtnmt.decode.native import unavailable_reason

    if unavailable_reason() is not None:  # pragma: no cover - machines without a compiler
        pytest.skip(f"the native engine cannot be built here: {unavailable_reason()}")
    from wtnmt.decode.native.network import NativeEngine

    for vocab, settings in ((VOCAB, SETTINGS), (600, WIDE)):
        model = _model(5, vocab)
        native = NativeEngine(model, fused=False)  # PyTorch's operators: the same numbers
        _same_draws(model, native, settings, vocab)


def _same_draws(model, native, settings, vocab: int) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(2)
    src = torch.randint(4, vocab, (3, 7), generator=g)
    src[:, -1] = EOS
    prefix = torch.tensor([[8, 9], [PAD, PAD], [10, PAD]])
    for sampling in settings:
        drawn = Sampling(samples=4, seed=7, **sampling)
        for forced in (None, prefix):
            want = search_batch(model, src, beam=1, sampling=drawn, target_prefix=forced)
            got = search_batch(native, src, beam=1, sampling=drawn, target_prefix=forced)
            assert got == want


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):  # type: ignore[no-untyped-def]
    return train_tiny(tmp_path_factory.mktemp("sampling"))


def test_translate_samples_the_same_on_workers_and_engines(run_dir, tmp_path, capsys):
    text = tmp_path / "in.txt"
    text.write_text("alpha beta\n\ngamma delta epsilon\nzeta\n")
    outputs = []
    for extra in (
        ["--engine", "pytorch"],
        ["--engine", "pytorch", "--workers", "2"],
        ["--engine", "native"],
    ):
        out = tmp_path / f"out{len(outputs)}"
        args = ["translate", str(run_dir), "-i", str(text), "-o", str(out), "--sampling"]
        args += ["--nbest", "3", "--top-k", "20", "--temperature", "1.5", "--seed", "4"]
        assert cli([*args, *extra]) == 0
        outputs.append(out.read_text())
    assert outputs[0] == outputs[1]
    assert outputs[0].count("\n") == 12  # N lines a sentence
    lines = [line.split(" ||| ") for line in outputs[0].splitlines()]
    assert [int(i) for i, _, _ in lines] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    # the native engine draws from the same distributions (its fused kernels' last bits
    # aside, which may move a draw that falls on a boundary): the same line count and format
    assert outputs[2].count("\n") == 12


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--top-k", "3"], "--top-k draws tokens: add --sampling"),
        (["--seed", "3"], "--seed draws tokens: add --sampling"),
        (["--sampling", "--temperature", "0"], "--temperature 0.0: allowed above 0 up to 100"),
        (["--sampling", "--temperature", "nan"], "--temperature nan: allowed above 0"),
        (["--sampling", "--top-p", "1.5"], "--top-p 1.5: allowed above 0 up to 1"),
        (["--sampling", "--top-k", "-1"], "--top-k -1: allowed 0"),
        (["--sampling", "--seed", "-1"], "--seed -1: allowed 0 to 4294967295"),
        (["--sampling", "--nbest", "2000"], "--nbest 2000: allowed 1 to 1024"),
        (["--sampling", "--beam", "4"], "--sampling draws each token, --beam 4 searches"),
    ],
)
def test_sampling_options_are_checked_in_one_line(run_dir, tmp_path, capsys, args, message):
    text = tmp_path / "in.txt"
    text.write_text("alpha\n")
    assert cli(["translate", str(run_dir), "-i", str(text), *args]) == 2
    one_line(capsys, "translate", message)


def test_the_api_samples(run_dir):
    from wtnmt import Translator

    t = Translator.load(run_dir)
    drawn = Sampling(samples=2, seed=1)
    found = t.translate_nbest(["alpha beta", "gamma"], sampling=drawn)
    assert [len(s) for s in found] == [2, 2]
    assert t.translate_nbest(["alpha beta", "gamma"], sampling=drawn) == found
    assert t.translate(["alpha beta"], sampling=drawn) == [found[0][0].text]
    with pytest.raises(ValueError, match="top_p=0"):
        Sampling(top_p=0)
