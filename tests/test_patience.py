"""When patience stops a run: counted on the metric that picks the best weights, or on dev loss
and dev BLEU together (``train.patience_on: loss_or_bleu``); a run resumed under another rule
goes on as if it had been trained under that one, and a grid continues a run finished under
another rule instead of refusing it."""

from __future__ import annotations

import json

import pytest
import yaml
from safetensors.torch import load_file

from helpers import tiny_run_config
from test_experiment import write_grid
from wtnmt.config import config_from_dict, config_to_dict, load_config
from wtnmt.experiment import load_grid, plan_task, run_grid
from wtnmt.train import Trainer
from wtnmt.train.report import recorded_validations
from wtnmt.train.schedule import replay_patience, stop_reason
from wtnmt.train.state import TrainState

QUIET = {"log_to_stderr": False}
# (dev loss, dev BLEU) of six validations: the loss improves at 1, 2 and 6, BLEU at 1 and 3
VALIDATIONS = [(3.0, 10.0), (2.9, 9.0), (2.95, 11.0), (2.97, 10.5), (2.96, 10.8), (2.85, 10.9)]


def _train_config(**train):  # type: ignore[no-untyped-def]
    values = config_to_dict(load_config("weighted-tiny"))
    values["train"].update(train)
    return config_from_dict(values).train


@pytest.mark.parametrize(
    ("best_metric", "patience_on", "counts"),
    [
        ("bleu", "best_metric", [0, 1, 0, 1, 2, 3]),  # BLEU alone: the loss at 6 does not count
        ("loss", "best_metric", [0, 0, 1, 2, 3, 0]),
        ("bleu", "loss_or_bleu", [0, 0, 0, 1, 2, 0]),
        ("loss", "loss_or_bleu", [0, 0, 0, 1, 2, 0]),
    ],
)
def test_patience_counts_validations_without_improving_what_it_watches(
    best_metric, patience_on, counts
):
    config = _train_config(best_metric=best_metric, patience_on=patience_on, patience=3)
    state = TrainState()
    for n, count in enumerate(counts, start=1):
        replay_patience(state, config, VALIDATIONS[:n])
        assert state.bad_validations == count, n
    assert (state.best_loss, state.best_bleu) == (2.85, 11.0)
    stopped = [
        replay_patience(state, config, VALIDATIONS[:n]) or stop_reason(state, config) is not None
        for n in range(1, 7)
    ]
    assert stopped == [count >= 3 for count in counts]


def test_a_run_stopped_on_bleu_and_resumed_on_loss_or_bleu_ends_as_one_trained_so(tmp_path):
    """The tiny model's dev BLEU stays flat while its dev loss falls: patience on BLEU stops
    it early, patience on either lets it go on; the resumed run is, bit for bit, the run
    trained under the second rule from the start."""
    rule = {"max_steps": 14, "valid_every": 2, "save_every": 2, "patience": 2}
    rule["best_metric"] = "bleu"
    on_bleu = tiny_run_config(tmp_path, train=rule)
    either = tiny_run_config(tmp_path, train={**rule, "patience_on": "loss_or_bleu"})
    stopped = Trainer(on_bleu, tmp_path / "resumed", **QUIET).run()
    assert stopped.finished is not None and "patience" in stopped.finished  # the premise
    assert stopped.step < 14

    resumed = Trainer(either, tmp_path / "resumed", resume=True, **QUIET).run()
    straight = Trainer(either, tmp_path / "straight", **QUIET).run()
    assert resumed.step > stopped.step
    assert (resumed.step, resumed.finished) == (straight.step, straight.finished)
    assert (resumed.bad_validations, resumed.best_loss) == (
        straight.bad_validations,
        straight.best_loss,
    )
    log = (tmp_path / "resumed" / "train.log").read_text()
    assert "train.patience_on=loss_or_bleu (trained with best_metric): 0 of the run's" in log
    a, b = (load_file(tmp_path / run / "model.safetensors") for run in ("resumed", "straight"))
    assert all((a[k] == b[k]).all() for k in a)
    assert recorded_validations(tmp_path / "straight", straight.step) == recorded_validations(
        tmp_path / "resumed", resumed.step
    )


def test_a_grid_continues_a_run_finished_under_another_stopping_rule(tmp_path):
    """Not refused: the rule is part of the budget. Where the run is done under the new rule
    too, it stops at once and keeps its scores with what `wtnmt evaluate` added to them."""
    path = write_grid(tmp_path, seeds=[1], analyze=False)
    grid = load_grid(path)
    assert run_grid(grid, say=lambda _: None) == {"weighted-s1": "finished"}
    run = grid.runs[0].run_dir
    scores = json.loads((run / "scores.json").read_text())
    scores["test_uniform"] = {"bleu": 1.0}  # as `wtnmt evaluate --branch-weights` adds
    (run / "scores.json").write_text(json.dumps(scores))

    base = {"train.log_every": 2, "train.valid_every": 3, "train.patience_on": "loss_or_bleu"}
    other = load_grid(write_grid(tmp_path, seeds=[1], analyze=False, base=base))
    assert plan_task(other.runs[0], other).what == "resume"
    assert run_grid(other, say=lambda _: None) == {"weighted-s1": "finished"}
    assert json.loads((run / "scores.json").read_text())["test_uniform"] == {"bleu": 1.0}
    recorded = yaml.safe_load((run / "config.yaml").read_text().split("\n", 1)[1])
    assert recorded["train"]["patience_on"] == "loss_or_bleu"
    assert plan_task(other.runs[0], other) is None
