"""What a run is about to train and what its budget takes, said before the hours go: the
plan line before the first update, the estimate after a few timed updates, a warning where
the budget takes more than a day (a config with only `data:` trains the paper's base model
for 100,000 updates)."""

from __future__ import annotations

import pytest

from helpers import tiny_run_config
from wtnmt.config import ModelConfig, RunConfig, load_config
from wtnmt.train import Trainer
from wtnmt.train.plan import DAY, describe, duration, estimate


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(0, "0 s"), (40.4, "40 s"), (61, "1 min"), (3 * 3600 + 20 * 60, "3 h 20 min"),
     (86_400, "1 day 0 h"), (3 * 86_400 + 4 * 3600 + 59, "3 days 4 h")],
)  # fmt: skip
def test_duration_says_two_units_at_most(seconds, said):
    assert duration(seconds) == said


def test_a_config_of_defaults_is_named_the_papers_base_model_with_its_budget():
    config = RunConfig()
    assert config.model == ModelConfig() and config.train.max_steps == 100_000
    line = describe(config, 48_000_000, config.train.max_steps)
    assert "the Weighted Transformer of wtnmt's defaults (the paper's base model)" in line
    assert "6+6 layers, d_model 512, d_ff 2048, 8 branches: 48,000,000 parameters" in line
    assert "at most 100,000 updates" in line
    small = load_config("transformer-tiny")
    line = describe(small, 1_000, 50)
    assert "defaults" not in line and "the Transformer, " in line and "heads" in line


def test_the_estimate_warns_where_the_budget_takes_more_than_a_day():
    days = estimate(4.0, 10, 100_000, None, 40.0)  # the base model on a small CPU
    assert days.startswith("warning: at 4 s an update on this machine: the 99,990 updates")
    assert "in about 4 days 15 h" in days and "`wtnmt presets`" in days
    hours = estimate(0.5, 10, 8_000, None, 5.0)
    assert not hours.startswith("warning") and "in about 1 h 6 min" in hours
    capped = estimate(4.0, 10, 100_000, 3600.0, 40.0)  # max_time ends it first
    assert "train.max_time ends the run in about 59 min" in capped
    assert not capped.startswith("warning") and 4.0 * 99_990 > DAY
    assert "no step or time budget" in estimate(1.0, 10, None, None, 10.0)


def test_a_run_logs_its_plan_before_training_and_its_estimate_after_timed_updates(tmp_path):
    config = tiny_run_config(tmp_path, train={"max_steps": 8})
    Trainer(config, tmp_path / "run", log_to_stderr=False).run()
    log = (tmp_path / "run" / "train.log").read_text().splitlines()
    plan = next(i for i, line in enumerate(log) if "] plan: the Weighted Transformer" in line)
    first = next(i for i, line in enumerate(log) if "] step " in line)
    estimate_at = next(i for i, line in enumerate(log) if "s an update on this machine" in line)
    assert plan < first < estimate_at
    assert "at most 8 updates" in log[plan] and "the 2 updates left of 8" in log[estimate_at]
