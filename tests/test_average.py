"""`wtnmt average`: the mean of a run's last checkpoints, as a run every command decodes with."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import tiny_run_config
from wtnmt.cli import main
from wtnmt.decode.translator import Translator
from wtnmt.model import branch_weight_table
from wtnmt.rundir import list_checkpoints, read_weights
from wtnmt.train import Trainer


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("average")
    config = tiny_run_config(
        tmp, train={"max_steps": 8, "valid_every": 2, "log_every": 2, "keep_checkpoints": 4}
    )
    Trainer(config, tmp / "run", log_to_stderr=False).run()
    return tmp / "run"


def test_averaging_equals_the_mean_of_the_checkpoint_tensors(run, tmp_path, capsys):
    assert main(["average", str(run), "--last", "3", "--out", str(tmp_path / "avg")]) == 0
    states = list_checkpoints(run / "checkpoints")[-3:]
    inputs = [
        read_weights(s.with_name(s.name.replace(".state.pt", ".safetensors"))) for s in states
    ]
    averaged = read_weights(tmp_path / "avg" / "model.safetensors")  # its checksum holds
    assert set(averaged) == set(inputs[0])
    for name, tensor in averaged.items():
        mean = sum(t[name].double() for t in inputs) / 3
        assert torch.allclose(tensor.double(), mean, atol=1e-7), name
    assert any(not torch.equal(inputs[0][n], inputs[2][n]) for n in inputs[0])  # they differ
    record = json.loads((tmp_path / "avg" / "averaged.json").read_text())
    assert record["checkpoints"] == [f"step_000000{s}.safetensors" for s in (4, 6, 8)]
    # a run like any other: it translates, and its κ, α are still on the simplex
    translator = Translator.load(tmp_path / "avg")
    assert len(translator.translate(["alpha beta"])) == 1
    for weights in branch_weight_table(translator.model).values():
        assert sum(weights["kappa"]) == pytest.approx(1.0) and min(weights["kappa"]) >= 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--last", "9"], "4 checkpoints there, fewer than --last 9"),
        (["--last", "0"], "--last 0: average at least 1 checkpoint"),
    ],
)
def test_average_answers_mistakes_in_one_line(run, tmp_path, capsys, args, message):
    assert main(["average", str(run), *args, "--out", str(tmp_path / "avg")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "avg").exists()


def test_average_never_writes_into_a_directory_with_files(run, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["average", str(run), "--last", "2", "--out", str(out)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
