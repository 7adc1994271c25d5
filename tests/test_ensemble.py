"""Ensembles (`translate --ensemble`, ``Translator.ensemble``): a Weighted Transformer and a
Transformer decoding together, each step's distribution the weighted mean of theirs — greedy
search against a reference that averages the models' step distributions by hand, beam search's
scores against the same mean by teacher forcing; the native engine's C++ search of an
ensemble the PyTorch engine's, bit for bit with its fused kernels off; runs of other
vocabularies refused in one line."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import one_line, tiny_run_config
from wtnmt import Translator
from wtnmt.cli import main as cli
from wtnmt.config import load_config
from wtnmt.decode.ensemble import Ensemble
from wtnmt.decode.search import _Stepper, search_batch
from wtnmt.model import build_model
from wtnmt.special import BOS, EOS, PAD
from wtnmt.train import Trainer

VOCAB = 50


def _models() -> list[torch.nn.Module]:
    """A Weighted Transformer and a Transformer, random weights, sharp distributions."""
    out = []
    for seed, preset in ((1, "weighted-tiny"), (2, "transformer-tiny")):
        torch.manual_seed(seed)
        config = load_config(preset, ["model.d_model=32", "model.d_ff=64", "model.heads=4"])
        model = build_model(config.model, vocab_size=VOCAB).eval()
        with torch.no_grad():
            model.embedding.weight.mul_(3.0)
        out.append(model)
    return out


def _source() -> torch.Tensor:
    src = torch.tensor([[5, 9, 11, 7, 20, EOS], [8, 30, EOS, PAD, PAD, PAD]])
    return src


def _mean_lprobs(models, weights, src_row, prefix: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """log Σ w P_m(next | prefix), each model's distribution computed without a cache."""
    src = src_row[src_row.ne(PAD)][None]
    probs = torch.zeros(VOCAB, dtype=torch.float64)
    with torch.no_grad():
        for model, w in zip(models, weights, strict=True):
            step = _Stepper(model, src, use_cache=False, steps=1, group=1)
            probs += w * step(torch.tensor([[BOS, *prefix]]))[0].double().exp()
    return probs.log()


@pytest.mark.parametrize("weights", [None, [0.8, 0.2]])
def test_greedy_search_of_an_ensemble_follows_the_mean_distribution(weights):
    models, src = _models(), _source()
    w = [0.5, 0.5] if weights is None else weights
    found = search_batch(Ensemble(models, weights), src, beam=1, max_len=8)
    for row, (hyp,) in enumerate(found):
        out, total = [], 0.0
        while True:
            lprobs = _mean_lprobs(models, w, src[row], out)
            lprobs[PAD] = lprobs[BOS] = -math.inf
            if len(out) == 8:
                break
            token = int(lprobs.argmax())
            total += float(lprobs[token])
            if token == EOS:
                break
            out.append(token)
        assert hyp.tokens == out
        assert abs(hyp.log_prob - total) < 1e-4
    # not what either model finds alone
    alone = [search_batch(m, src, beam=1, max_len=8) for m in models]
    assert any([h.tokens for (h,) in a] != [h.tokens for (h,) in found] for a in alone)


def test_beam_search_of_an_ensemble_scores_by_the_mean_distribution():
    models, src = _models(), _source()
    found = search_batch(Ensemble(models, [0.3, 0.7]), src, beam=4, nbest=3, max_len=8)
    for row, hyps in enumerate(found):
        assert len(hyps) == 3
        for h in hyps:
            total = 0.0
            for t, token in enumerate([*h.tokens, EOS]):
                if t == 8:  # EOS forced at the limit counts 0
                    break
                total += float(_mean_lprobs(models, [0.3, 0.7], src[row], h.tokens[:t])[token])
            assert abs(h.log_prob - total) < 1e-4


def test_an_ensemble_of_a_model_with_itself_is_the_model():
    model, src = _models()[0], _source()
    want = search_batch(model, src, beam=3, nbest=2)
    got = search_batch(Ensemble([model, model]), src, beam=3, nbest=2)
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]


def test_bad_ensembles_are_refused():
    models = _models()
    with pytest.raises(ValueError, match="at least 2 models"):
        Ensemble(models[:1])
    with pytest.raises(ValueError, match="each must be above 0"):
        Ensemble(models, [1.0, 0.0])
    torch.manual_seed(0)
    other = build_model(load_config("transformer-tiny").model, vocab_size=VOCAB + 1).eval()
    with pytest.raises(ValueError, match="target vocabularies of"):
        Ensemble([models[0], other])


def _native(ensemble: Ensemble, fused: bool):  # type: ignore[no-untyped-def]
    from wtnmt.decode.native import unavailable_reason

    if unavailable_reason() is not None:  # pragma: no cover - machines without a compiler
        pytest.skip(f"the native engine cannot be built here: {unavailable_reason()}")
    from wtnmt.decode.native.network import NativeEngine

    return NativeEngine(ensemble, fused=fused)


@pytest.mark.parametrize("fused", [False, True], ids=["pytorch-operators", "fused"])
def test_the_native_engine_searches_an_ensemble_as_the_pytorch_engine_does(fused):
    models, src = _models(), _source()
    ensemble = Ensemble(models, [0.3, 0.7])
    native = _native(ensemble, fused)
    prefix = torch.tensor([[7, 7], [9, PAD]])
    for beam, nbest, forced in ((1, 1, None), (4, 3, None), (1, 1, prefix), (3, 2, prefix)):
        want = search_batch(ensemble, src, beam=beam, nbest=nbest, max_len=8, target_prefix=forced)
        got = search_batch(native, src, beam=beam, nbest=nbest, max_len=8, target_prefix=forced)
        assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]
        for mine, theirs in zip(want, got, strict=True):
            for a, b in zip(mine, theirs, strict=True):
                assert abs(a.score - b.score) < 1e-4
                assert fused or (a.score, a.log_prob) == (b.score, b.log_prob)
    # three models, one of them twice: still the mean of their distributions
    three = Ensemble([*models, models[0]], [1.0, 2.0, 1.0])
    want = search_batch(three, src, beam=4, nbest=2, max_len=8)
    got = search_batch(_native(three, fused), src, beam=4, nbest=2, max_len=8)
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]


def test_the_native_engine_samples_an_ensemble_as_the_pytorch_engine_does():
    from wtnmt.decode.sampling import Sampling

    models, src = _models(), _source()
    ensemble = Ensemble(models, [0.6, 0.4])
    native = _native(ensemble, fused=False)
    for drawn in (Sampling(samples=3, seed=4), Sampling(samples=2, seed=1, top_k=5, top_p=0.8)):
        want = search_batch(ensemble, src, beam=1, sampling=drawn, max_len=8)
        assert search_batch(native, src, beam=1, sampling=drawn, max_len=8) == want


@pytest.fixture(scope="module")
def runs(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A Weighted Transformer and a Transformer trained on the same prepared data."""
    tmp = tmp_path_factory.mktemp("ensemble")
    out = []
    for name, attention in (("weighted", "branched"), ("transformer", "multihead")):
        config = tiny_run_config(
            tmp, model={"attention": attention}, train={"max_steps": 8, "valid_every": 8}
        )
        Trainer(config, tmp / name, log_to_stderr=False).run()
        out.append(tmp / name)
    return out


def test_translate_with_an_ensemble_of_runs(runs, tmp_path, capsys):
    text = tmp_path / "in.txt"
    text.write_text("alpha beta\n\ngamma delta epsilon\n")
    out = tmp_path / "out.txt"
    args = ["translate", str(runs[0]), "-i", str(text), "-o", str(out), "--beam", "3"]
    args += ["--engine", "pytorch"]  # (the API's engine: the same arithmetic on every CPU)
    assert cli([*args, "--ensemble", str(runs[1]), "--ensemble-weights", "0.6,0.4"]) == 0
    t = Translator.load(runs[0])
    t.ensemble([runs[1]], weights=[0.6, 0.4])
    want = t.translate(["alpha beta", "", "gamma delta epsilon"], beam=3)
    assert out.read_text().splitlines() == want
    # by hand: the two models' mean, searched
    a, b = Translator.load(runs[0]), Translator.load(runs[1])
    ids = a.encode(["gamma delta epsilon"])
    src = torch.tensor([[*ids[0], EOS]])
    by_hand = search_batch(Ensemble([a.model, b.model], [0.6, 0.4]), src, beam=3)[0][0]
    assert a.vocab.target.decode(by_hand.tokens) == want[2]


def test_translate_an_ensemble_on_the_native_engine(runs, tmp_path):
    from wtnmt.decode.native import unavailable_reason

    if unavailable_reason() is not None:  # pragma: no cover - machines without a compiler
        pytest.skip(f"the native engine cannot be built here: {unavailable_reason()}")
    text = tmp_path / "in.txt"
    text.write_text("alpha beta\ngamma delta epsilon\n")
    out = tmp_path / "out.txt"
    args = ["translate", str(runs[0]), "-i", str(text), "-o", str(out), "--engine", "native"]
    assert cli([*args, "--beam", "3", "--ensemble", str(runs[1])]) == 0
    t = Translator.load(runs[0], engine="native")
    t.ensemble([runs[1]])
    assert t.engine == "native" and len(t.network.members) == 2
    assert out.read_text().splitlines() == t.translate(text.read_text().splitlines(), beam=3)
    with pytest.raises(ValueError, match="an ensemble decodes in this process"):
        t.start_workers(2)


def test_ensemble_mistakes_are_one_line(runs, tmp_path, capsys):
    text = tmp_path / "in.txt"
    text.write_text("alpha\n")
    base = ["translate", str(runs[0]), "-i", str(text)]
    cases = [
        (["--ensemble-weights", "1,2"], "--ensemble-weights weighs an --ensemble's models"),
        (["--ensemble", str(runs[1]), "--ensemble-weights", "1"], "2 numbers above 0"),
        (["--ensemble", str(runs[1]), "--ensemble-weights", "1,-1"], "2 numbers above 0"),
        (["--ensemble", str(runs[1]), "--engine", "onnxruntime"], "native or pytorch, not onnx"),
        (["--ensemble", str(runs[1]), "--workers", "2"], "not on --workers 2"),
    ]
    for extra, message in cases:
        assert cli([*base, *extra]) == 2
        one_line(capsys, "translate", message)
    config = tiny_run_config(tmp_path, train={"max_steps": 2}, data={"vocab_size": 50})
    Trainer(config, tmp_path / "foreign", log_to_stderr=False).run()
    assert cli([*base, "--ensemble", str(tmp_path / "foreign")]) == 2
    one_line(capsys, "translate", "its source vocabulary is not the first run's")


def test_evaluate_an_ensemble_into_files_of_its_own(runs, capsys):
    import json

    assert cli(["evaluate", str(runs[0]), "--beam", "2"]) == 0
    assert cli(["evaluate", str(runs[0]), "--beam", "2", "--ensemble", str(runs[1])]) == 0
    scores = json.loads((runs[0] / "scores.json").read_text())
    assert scores["ensemble"] == {"runs": [str(runs[1])], "weights": [0.5, 0.5]}
    names = sorted(p.name for p in (runs[0] / "eval").glob("*.hyp"))
    assert len(names) == 2 and any(".ensemble-" in n for n in names), names
    t = Translator.load(runs[0])
    t.ensemble([runs[1]])
    hyp = next(p for p in (runs[0] / "eval").glob("*.ensemble-*.hyp"))
    src = [line for line in (runs[0].parent / "test.src").read_text().splitlines()]
    assert hyp.read_text().splitlines() == t.translate(src, beam=2)
    assert cli(["evaluate", str(runs[0]), "--beam", "2"]) == 0  # alone again: no ensemble kept
    assert "ensemble" not in json.loads((runs[0] / "scores.json").read_text())
    capsys.readouterr()
    assert cli(["evaluate", str(runs[0]), "--hyp", str(hyp), "--ensemble", str(runs[1])]) == 2
    one_line(capsys, "evaluate", "--ensemble decides how to make one")


@pytest.mark.parametrize("engine", ["pytorch", "native"])
def test_a_server_of_an_ensemble_answers_as_the_translator(runs, engine):
    from fastapi.testclient import TestClient

    from wtnmt.decode.native import unavailable_reason
    from wtnmt.serve.app import create_app
    from wtnmt.serve.settings import ServeSettings

    if engine == "native" and unavailable_reason() is not None:  # pragma: no cover
        pytest.skip(f"the native engine cannot be built here: {unavailable_reason()}")
    served = Translator.load(runs[0], engine=engine)
    served.ensemble([runs[1]], weights=[0.7, 0.3])
    assert served.engine == engine
    t = Translator.load(runs[0], engine=engine)
    t.ensemble([runs[1]], weights=[0.7, 0.3])
    lines = ["alpha beta", "gamma delta epsilon"]
    with TestClient(create_app(served, ServeSettings())) as client:
        got = client.post("/v1/translate", json={"text": lines, "beam": 3}).json()
    assert got["translations"] == t.translate(lines, beam=3)
