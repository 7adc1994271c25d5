"""A forced target prefix (`translate --prefix FILE`, ``prefixes=`` in the API, ``prefix`` in a
server request): every translation begins with it, greedy search then goes on as a plain
reference decoder does after the same tokens (the prefix's log-probabilities counted), beam
search keeps it in every hypothesis, and the native engine finds what the PyTorch engine
finds; a prefix file of another length is one line."""

from __future__ import annotations

import pytest
import torch

from helpers import one_line, train_tiny
from wtnmt.cli import main as cli
from wtnmt.config import load_config
from wtnmt.decode.search import _Stepper, search_batch
from wtnmt.model import build_model
from wtnmt.special import BOS, EOS, PAD

VOCAB = 40


def _model() -> torch.nn.Module:
    torch.manual_seed(4)
    config = load_config("weighted-tiny", ["model.d_model=32", "model.d_ff=64", "model.heads=4"])
    model = build_model(config.model, vocab_size=VOCAB).eval()
    with torch.no_grad():
        model.embedding.weight.mul_(3.0)  # sharp distributions: few near ties
    return model


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, VOCAB, (3, 6), generator=g)
    src[:, -1] = EOS
    src[1, 4:] = PAD
    src[1, 3] = EOS
    prefix = torch.tensor([[7, 8, 9], [PAD, PAD, PAD], [11, PAD, PAD]])
    return src, prefix


def _reference_greedy(model, src_row, forced: list[int], limit: int) -> tuple[list[int], float]:  # type: ignore[no-untyped-def]
    """Greedy decoding by recomputing the whole prefix at every step: the forced tokens,
    then the most probable allowed token until EOS or ``limit`` tokens; the summed
    log-probability of every token and EOS (an EOS forced at the limit counts 0, as the
    search counts it)."""
    src = src_row[src_row.ne(PAD)][None]
    out, total = [], 0.0
    with torch.no_grad():
        while True:
            lprobs = _Stepper(model, src, use_cache=False, steps=1, group=1)(
                torch.tensor([[BOS, *out]])
            )[0]
            lprobs[PAD] = lprobs[BOS] = float("-inf")
            if len(out) < len(forced):
                token = forced[len(out)]
            elif len(out) >= limit:
                return out, total
            else:
                token = int(lprobs.argmax())
            total += float(lprobs[token])
            if token == EOS:
                return out, total
            out.append(token)


def test_greedy_search_goes_on_after_the_prefix_as_a_reference_decoder_does():
    model = _model()
    src, prefix = _batch()
    found = search_batch(model, src, beam=1, max_len=12, target_prefix=prefix)
    for row, (hyps,) in enumerate(found):
        forced = [t for t in prefix[row].tolist() if t != PAD]
        tokens, log_prob = _reference_greedy(model, src[row], forced, limit=12)
        assert hyps.tokens[: len(forced)] == forced
        assert hyps.tokens == tokens
        assert abs(hyps.log_prob - log_prob) < 1e-4
    # without a prefix: the plain search
    plain = search_batch(model, src, beam=1, max_len=12)
    assert plain[1] == found[1]  # the sentence without one is untouched
    assert [h.tokens for (h,) in plain] != [h.tokens for (h,) in found]


def test_a_prefix_of_the_searchs_own_output_changes_nothing():
    model = _model()
    src, _ = _batch()
    plain = search_batch(model, src, beam=1, max_len=12)
    own = torch.full((3, 2), PAD)
    for row, (h,) in enumerate(plain):
        own[row, : min(2, len(h.tokens))] = torch.tensor(h.tokens[:2])
    again = search_batch(model, src, beam=1, max_len=12, target_prefix=own)
    assert [h.tokens for (h,) in again] == [h.tokens for (h,) in plain]


def test_every_beam_hypothesis_begins_with_the_prefix_and_is_scored_whole():
    model = _model()
    src, prefix = _batch()
    found = search_batch(model, src, beam=4, nbest=3, target_prefix=prefix, max_len=10)
    for row, hyps in enumerate(found):
        forced = [t for t in prefix[row].tolist() if t != PAD]
        assert len(hyps) == 3
        for h in hyps:
            assert h.tokens[: len(forced)] == forced
            # the log-probability of the whole output, the prefix's pieces included
            src_row = src[row][src[row].ne(PAD)][None]
            tgt = torch.tensor([[BOS, *h.tokens]])
            with torch.no_grad():
                lprobs = torch.log_softmax(model(src_row, tgt).logits.float(), -1)[0]
            picked = lprobs.gather(1, torch.tensor([*h.tokens, EOS])[:, None])[:, 0]
            if len(h.tokens) == 10:  # an EOS forced at the limit counts 0, as ever
                picked = picked[:-1]
            picked = picked.sum()
            assert abs(float(picked) - h.log_prob) < 1e-3


@pytest.mark.parametrize("fused", [False, True], ids=["pytorch-operators", "fused"])
def test_the_native_engine_forces_the_prefix_as_the_pytorch_engine_does(fused):
    from wtnmt.decode.native import unavailable_reason

    if unavailable_reason() is not None:  # pragma: no cover - machines without a compiler
        pytest.skip(f"the native engine cannot be built here: {unavailable_reason()}")
    from wtnmt.decode.native.network import NativeEngine

    model = _model()
    native = NativeEngine(model, fused=fused)
    src, prefix = _batch()
    for beam, nbest in ((1, 1), (4, 2)):
        want = search_batch(model, src, beam=beam, nbest=nbest, target_prefix=prefix)
        got = search_batch(native, src, beam=beam, nbest=nbest, target_prefix=prefix)
        assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]
        for mine, theirs in zip(want, got, strict=True):
            for a, b in zip(mine, theirs, strict=True):
                assert abs(a.score - b.score) < 1e-4
                assert fused or (a.score, a.log_prob) == (b.score, b.log_prob)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):  # type: ignore[no-untyped-def]
    return train_tiny(tmp_path_factory.mktemp("prefix"))


def test_translate_prefix_file(run_dir, tmp_path):
    from wtnmt import Translator

    text, prefixes = tmp_path / "in.txt", tmp_path / "prefix.txt"
    text.write_text("alpha beta\ngamma\n\ndelta\n")
    prefixes.write_text("AHPLA ATEB\n\n\nATLED\n")
    out = tmp_path / "out.txt"
    for engine in ("pytorch", "native"):
        assert cli(["translate", str(run_dir), "-i", str(text), "--prefix", str(prefixes),
                    "-o", str(out), "--engine", engine, "--beam", "2"]) == 0  # fmt: skip
        lines = out.read_text().splitlines()
        assert lines[0].startswith("AHPLA ATEB") and lines[3].startswith("ATLED")
        assert lines[2] == ""
    t = Translator.load(run_dir)
    api = t.translate(["alpha beta", "gamma", "", "delta"], beam=2,
                      prefixes=["AHPLA ATEB", "", "", "ATLED"])  # fmt: skip
    assert api == lines


@pytest.mark.parametrize(
    ("prefix_text", "message"),
    [
        ("A\n", "--prefix {}: 1 lines, fewer than the input's"),
        ("A\nB\nC\n", "--prefix {}: more lines than the input's 2"),
    ],
)
def test_a_prefix_file_of_another_length_is_one_line(
    run_dir, tmp_path, capsys, prefix_text, message
):
    text, prefixes = tmp_path / "in.txt", tmp_path / "prefix.txt"
    text.write_text("alpha\nbeta\n")
    prefixes.write_text(prefix_text)
    out = tmp_path / "out.txt"
    args = ["translate", str(run_dir), "-i", str(text), "--prefix", str(prefixes), "-o", str(out)]
    assert cli(args) == 2
    one_line(capsys, "translate", message.format(prefixes))
    assert not out.exists()  # nothing half written
