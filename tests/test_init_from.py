"""Fine-tuning (`train.init_from`): a run starts from another run's weights, with a fresh
optimizer and schedule, on new data encoded with that run's vocabulary; weights that do not fit
(other vocabularies, other shapes) are refused in one line naming what differs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from helpers import one_line, sentence, tiny_run_config, write_pairs
from wtnmt.cli import main as cli
from wtnmt.config import config_to_dict
from wtnmt.data.vocab import vocabulary_sha256
from wtnmt.errors import TrainingError
from wtnmt.rundir import load_run
from wtnmt.rundir.files import read_weights, tensors_sha256
from wtnmt.train import Trainer

QUIET = {"log_to_stderr": False}


@pytest.fixture(scope="module")
def parent(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("parent")
    config = tiny_run_config(tmp, train={"max_steps": 6, "valid_every": 3})
    Trainer(config, tmp / "run", **QUIET).run()
    return tmp / "run"


def domain_config(tmp: Path, parent: Path | None, **sections):  # type: ignore[no-untyped-def]
    """A run on another 'domain' (other sentences, a vocabulary size the parent does not
    have) starting from ``parent``'s weights."""
    config = tiny_run_config(tmp, n_train=50, **sections)
    values = config_to_dict(config)
    own = write_pairs(tmp, "domain", [sentence(50_000 + i, 4 + i % 3) for i in range(50)])
    values["data"].update(
        train_src=str(own[0]), train_tgt=str(own[1]), vocab_size=45, **sections.get("data", {})
    )
    values["train"].update(init_from=None if parent is None else str(parent))
    values["train"].update(sections.get("train", {}))
    from wtnmt.config import config_from_dict

    return config_from_dict(values)


def test_a_fine_tune_starts_from_the_runs_weights_with_its_vocabulary_and_a_fresh_optimizer(
    parent, tmp_path
):
    config = domain_config(tmp_path, parent, train={"max_steps": 4, "valid_every": 2})
    assert config.data.vocab_from == str(parent)  # set by train.init_from
    trainer = Trainer(config, tmp_path / "tuned", **QUIET)
    weights = read_weights(parent / "model.safetensors")
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
    assert trainer.state.step == 0 and not trainer.optimizer.state  # nothing carried over
    # the parent's vocabulary, not one trained on the new data (whose size would be 45)
    tuned, parents = tmp_path / "tuned" / "spm.model", parent / "spm.model"
    assert vocabulary_sha256(tuned) == vocabulary_sha256(parents)
    state = trainer.run()
    assert state.step == 4
    record = json.loads((tmp_path / "tuned" / "init_from.json").read_text())
    assert record["weights_sha256"] == tensors_sha256(weights)
    assert record["init_from"] == str(parent)
    saved = yaml.safe_load((tmp_path / "tuned" / "config.yaml").read_text())
    assert saved["train"]["init_from"] == str(parent)
    assert saved["data"]["vocab_from"] == str(parent)
    load_run(tmp_path / "tuned")  # its weights bound to the vocabulary it holds


def test_a_fine_tune_resumed_is_the_fine_tune_never_stopped(parent, tmp_path):
    """Its weights are taken once, at the start: a resume continues from the checkpoint."""
    train = {"valid_every": 100, "save_every": 100}
    straight = domain_config(tmp_path, parent, train={"max_steps": 6, **train})
    Trainer(straight, tmp_path / "a", **QUIET).run()
    first = domain_config(tmp_path, parent, train={"max_steps": 3, **train})
    Trainer(first, tmp_path / "b", **QUIET).run()
    Trainer(straight, tmp_path / "b", resume=True, **QUIET).run()
    a = read_weights(sorted((tmp_path / "a" / "checkpoints").glob("*.safetensors"))[-1])
    b = read_weights(sorted((tmp_path / "b" / "checkpoints").glob("*.safetensors"))[-1])
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_a_weights_file_of_a_run_can_be_named(parent, tmp_path):
    checkpoint = sorted((parent / "checkpoints").glob("step_*.safetensors"))[0]
    config = domain_config(tmp_path, checkpoint, train={"max_steps": 1})
    assert config.data.vocab_from == str(parent)  # the run the checkpoint is of
    trainer = Trainer(config, tmp_path / "tuned", **QUIET)
    weights = read_weights(checkpoint)
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name


def test_other_shapes_are_refused_naming_the_setting(parent, tmp_path):
    config = domain_config(tmp_path, parent, model={"d_ff": 48})
    with pytest.raises(TrainingError) as e:
        Trainer(config, tmp_path / "tuned", **QUIET)
    message = str(e.value)
    assert "train.init_from=" in message and "model.d_ff (" in message, message
    assert "there" in message and "here" in message, message
    assert not (tmp_path / "tuned" / "checkpoints").exists()


def test_other_vocabularies_are_refused(parent, tmp_path):
    """data.vocab_from naming a vocabulary other than the weights' own."""
    other = tmp_path / "other"
    other.mkdir()
    config = tiny_run_config(other, train={"max_steps": 1}, data={"vocab_size": 50})
    Trainer(config, other / "run", **QUIET).run()
    config = domain_config(tmp_path, parent, data={"vocab_from": str(other / "run")})
    with pytest.raises(TrainingError, match=r"trained with other vocabularies .*vocabulary hash"):
        Trainer(config, tmp_path / "tuned", **QUIET)


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("nowhere", "no such run directory"),
        ("nowhere/model.safetensors", "no such weights file"),
        ("empty", "no model.safetensors there"),
    ],
)
def test_a_missing_start_is_one_line(tmp_path, capsys, where, message):
    (tmp_path / "empty").mkdir()
    config = domain_config(tmp_path, tmp_path / where, train={"max_steps": 1})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config_to_dict(config)))
    assert cli(["train", str(path), "--out", str(tmp_path / "run")]) == 2
    err = one_line(capsys, "train", message)
    assert "Traceback" not in err


def test_a_vocabulary_folder_without_the_asked_models_is_one_line(parent, tmp_path, capsys):
    config = domain_config(tmp_path, None, data={"vocab_from": str(parent), "joint_vocab": False})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config_to_dict(config)))
    assert cli(["train", str(path), "--out", str(tmp_path / "run")]) == 2
    one_line(capsys, "train", "data.vocab_from=", "holds spm.model", "data.joint_vocab: true")
