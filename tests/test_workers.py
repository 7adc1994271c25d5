"""Decoding on worker processes (`translate --workers N`, Translator.start_workers): the same
translations, in the same order, as decoding in this process."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path

import pytest
import torch

from helpers import sentence, tiny_run_config
from wtnmt import Translator
from wtnmt.cli import main as cli
from wtnmt.decode.native import unavailable_reason
from wtnmt.decode.workers import SearchWorkers, _worker_engine
from wtnmt.errors import DecodingError
from wtnmt.model.packed import int8_available
from wtnmt.train import Trainer

SENTENCES = [sentence(50_000 + i, 2 + i % 7) for i in range(30)] + ["", sentence(7, 3)]

pytestmark = pytest.mark.slow  # worker processes: seconds to start each


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("workers")
    config = tiny_run_config(
        tmp,
        n_train=400,
        train={"max_steps": 200, "valid_every": 1000, "max_tokens": 600, "lr_scale": 2.0},
        model={"d_model": 64, "d_ff": 128},
    )
    Trainer(config, tmp / "run", log_to_stderr=False).run()
    return tmp / "run"


def _translate(translator: Translator) -> list[list[tuple[str, float]]]:
    """Greedy and beam 4 (2 best) over small batches, so that every worker gets several."""
    ids = translator.encode(SENTENCES)
    out = []
    for beam, nbest in ((1, 1), (4, 2)):
        found = translator.translate_ids(ids, beam=beam, nbest=nbest, batch_tokens=40)
        out += [[(t.text, t.score) for t in options] for options in found]
    return out


def _same(got: list[list[tuple[str, float]]], expected: list[list[tuple[str, float]]]) -> None:
    """The same texts, and scores equal up to float32 rounding: computed in another process,
    a score once differed in its fourth decimal (-21.7147 against -21.7146)."""
    assert [[t for t, _ in o] for o in got] == [[t for t, _ in o] for o in expected]
    scores = [s for o in got for _, s in o]
    assert scores == pytest.approx([s for o in expected for _, s in o], rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("engine", ["pytorch", "native"])
@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_workers_translate_as_this_process_does(run_dir, quantize, engine):
    if quantize == "int8" and not int8_available():
        pytest.skip("this PyTorch build has no FBGEMM int8 linear")
    if engine == "native" and unavailable_reason() is not None:
        pytest.skip(f"the native engine cannot be built here: {unavailable_reason()}")
    translator = Translator.load(run_dir, quantize=quantize, engine=engine)
    assert (translator.quantize, translator.engine) == (quantize, engine)  # what workers rebuild
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker decodes
    try:
        expected = _translate(translator)
    finally:
        torch.set_num_threads(threads)
    translator.start_workers(2)
    try:
        assert translator._workers is not None
        for _ in range(4):  # (any worker may answer: each was built the same way)
            assert translator._workers._pool.submit(_worker_engine).result() == engine
        _same(_translate(translator), expected)
        assert len({t for options in expected for t, _ in options}) > 10  # they differ
    finally:
        translator.close()
    _same(_translate(translator), expected)  # closed: decoding goes on in this process


def test_replacing_branch_weights_stops_the_workers_that_hold_the_learned_ones(run_dir):
    translator = Translator.load(run_dir)
    translator.start_workers(1)
    translator.set_branch_weights("uniform")
    assert translator._workers is None
    uniform = Translator.load(run_dir)
    uniform.set_branch_weights("uniform")
    assert translator.translate(SENTENCES) == uniform.translate(SENTENCES)


def test_translate_with_workers_from_the_command_line(run_dir, tmp_path, capsys):
    source = tmp_path / "src.txt"
    source.write_text("".join(s + "\n" for s in SENTENCES))
    args = ["translate", str(run_dir), "--input", str(source), "--threads", "2"]
    assert cli([*args, "--output", str(tmp_path / "one.txt")]) == 0
    assert cli([*args, "--workers", "2", "--output", str(tmp_path / "two.txt")]) == 0
    assert (tmp_path / "two.txt").read_text() == (tmp_path / "one.txt").read_text()
    pytorch = ["--engine", "pytorch", "--workers", "2", "--output", str(tmp_path / "py.txt")]
    assert cli([*args, *pytorch]) == 0  # (the default above: auto, native where it builds)
    assert (tmp_path / "py.txt").read_text() == (tmp_path / "one.txt").read_text()
    capsys.readouterr()
    assert cli([*args, "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "wtnmt translate: error: --workers 0: must be at least 1\n"
    assert cli([*args, "--workers", "2", "--device", "cuda"]) == 2  # CPU only, or no CUDA
    assert capsys.readouterr().err.count("\n") == 1


def _kill_workers(workers: SearchWorkers) -> None:
    for process in list(workers._pool._processes.values()):  # (started by a first search)
        os.kill(process.pid, signal.SIGKILL)  # as the OOM killer would
        process.join()


def test_a_killed_worker_ends_the_translation_in_one_line_and_writes_nothing(
    run_dir, tmp_path, capsys, monkeypatch
):
    translator = Translator.load(run_dir)
    translator.start_workers(2)
    try:
        translator.translate(SENTENCES[:4])  # the workers are up
        assert translator._workers is not None
        _kill_workers(translator._workers)
        with pytest.raises(DecodingError, match="a decoding worker died"):
            translator.translate(SENTENCES)
    finally:
        translator.close()
    search = SearchWorkers.search

    def dying(self, sources, per_batch=None, **options):  # type: ignore[no-untyped-def]
        first = None if per_batch is None else per_batch[:1]
        list(search(self, sources[:1], first, **options))  # the workers are up: kill them
        _kill_workers(self)
        yield from search(self, sources, per_batch, **options)

    monkeypatch.setattr(SearchWorkers, "search", dying)
    source, out = tmp_path / "src.txt", tmp_path / "out.txt"
    source.write_text("".join(s + "\n" for s in SENTENCES))
    capsys.readouterr()
    argv = ["translate", str(run_dir), "-i", str(source), "-o", str(out), "--workers", "2"]
    assert cli([*argv, "--threads", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a decoding worker died" in err, err
    assert not out.exists() and not list(tmp_path.glob(".out.txt*"))


def test_a_worker_that_cannot_start_says_why_in_one_line(run_dir, capfd):
    translator = Translator.load(run_dir)
    wrong = dataclasses.replace(translator.config.model, d_ff=96)  # not the weights' shape
    ids = translator.encode(SENTENCES[:4])
    sources = [torch.tensor([row]) for row in ids]
    with SearchWorkers(translator.model, model_config=wrong, int8=False, workers=2) as workers:
        with pytest.raises(DecodingError) as raised:
            list(workers.search(sources, beam=1))
    message = str(raised.value)
    assert message.startswith("a decoding worker could not start: RuntimeError: Error(s) in")
    assert "size mismatch" in message and "\n" not in message and len(message) < 400, message
    assert "Traceback" not in capfd.readouterr().err  # nothing from the workers themselves
