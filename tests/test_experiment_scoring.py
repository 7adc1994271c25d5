"""`wtnmt experiment` scores its runs: the mean of the last checkpoints where the grid asks for
it, paper Table 3 of its Weighted Transformers on the weights it scored, and a run stopped
before its scores were whole scored again."""

from __future__ import annotations

import json
import re

import pytest
import torch
import yaml

from test_experiment import write_grid
from wtnmt.config import ConfigError
from wtnmt.experiment import load_grid, plan_task, run_grid


def test_a_grid_scores_the_mean_of_the_last_checkpoints_when_asked(tmp_path):
    from safetensors.torch import load_file

    path = write_grid(
        tmp_path, seeds=[1], evaluate={"split": "test", "beam": 2, "average": 2}, analyze=False
    )
    grid = load_grid(path)
    assert run_grid(grid, say=lambda _: None) == {"weighted-s1": "finished"}
    run = grid.runs[0].run_dir
    scores = json.loads((run / "scores.json").read_text())
    averaged, best = scores["test"], scores["test_best"]
    assert averaged["average"] == 2 and averaged["weights"] == "average-last2.safetensors"
    assert averaged["checkpoints"] == ["step_0000003.safetensors", "step_0000006.safetensors"]
    assert best["weights"] == "model.safetensors" and {"bleu", "bleu_lc"} <= set(best)
    # the oracle: the element-wise mean of the two checkpoints' tensors
    a, b = (load_file(run / "checkpoints" / name) for name in averaged["checkpoints"])
    mean = load_file(run / "average-last2.safetensors")
    assert set(mean) == set(a)
    for name, value in mean.items():
        torch.testing.assert_close(value, (a[name] + b[name]) / 2, rtol=0, atol=1e-7)
    assert plan_task(grid.runs[0], grid) is None  # scored as asked: nothing left
    other = load_grid(write_grid(tmp_path, seeds=[1], evaluate={"split": "test", "beam": 2}))
    assert plan_task(other.runs[0], other).what == "score"  # not the scores asked for


def test_a_grid_scores_paper_table_3_of_its_weighted_runs_on_the_weights_it_scored(tmp_path):
    from wtnmt.data.corpora import sha256_of

    fixed = {"name": "fixed", "preset": str(tmp_path / "tiny.yaml"),
             "set": {"model.branch_weights": "fixed"}}  # fmt: skip
    path = write_grid(
        tmp_path, seeds=[1], evaluate={"split": "test", "beam": 2, "average": 2},
        analyze={"out": str(tmp_path / "report"), "random_seeds": 2},
    )  # fmt: skip
    grid = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**grid, "runs": [*grid["runs"], fixed]}, sort_keys=False))
    assert run_grid(load_grid(path), say=lambda _: None) == {
        "weighted-s1": "finished",
        "fixed-s1": "finished",
    }
    run = tmp_path / "runs" / "weighted-s1"
    digest = sha256_of(run / "average-last2.safetensors")
    for name, how, seed in [("uniform0", "uniform", None), ("random1", "random", 1),
                            ("random2", "random", 2)]:  # fmt: skip
        kept = json.loads((run / "eval" / f"average-last2.{name}.test.beam2.json").read_text())
        assert (kept["weights"], kept["branch_weights"], kept["seed"]) == (
            "average-last2.safetensors",
            how,
            seed,
        )
        assert kept["weights_sha256"] == digest and (run / kept["hypotheses"]).is_file()
    # κ = α = 1/M throughout: uniform is what it has, and the grid asks nothing more of it
    assert not list((tmp_path / "runs" / "fixed-s1" / "eval").glob("*uniform*"))


def test_a_run_stopped_before_its_table_3_is_whole_is_scored_again(tmp_path, monkeypatch):
    """--stop-after or a signal can stop a run's process between its test scores and the
    last of its Table 3 decodings: the grid must not take it as scored, its weights may be
    gone at the next call."""
    from wtnmt.experiment import job
    from wtnmt.experiment.runner import job_payload

    path = write_grid(
        tmp_path, seeds=[1], evaluate={"split": "test", "beam": 2, "average": 2},
        analyze={"out": str(tmp_path / "report"), "random_seeds": 2},
    )  # fmt: skip
    grid = load_grid(path)
    spec = grid.runs[0]

    def stopped(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt  # as the runner's stop reaches a run while it decodes

    monkeypatch.setattr(job, "branch_weight_ablation", stopped)
    with pytest.raises(KeyboardInterrupt):
        job.main([json.dumps(job_payload(plan_task(spec, grid), grid))])
    assert (spec.run_dir / "finished.json").is_file()
    assert not (spec.run_dir / "scores.json").exists()
    assert plan_task(spec, grid).what == "score"
    monkeypatch.undo()
    assert run_grid(grid, say=lambda _: None) == {"weighted-s1": "finished"}
    assert plan_task(spec, grid) is None
    kept = sorted(p.name for p in (spec.run_dir / "eval").glob("average-last2.*.json"))
    assert kept == [
        "average-last2.random1.test.beam2.json",
        "average-last2.random2.test.beam2.json",
        "average-last2.test.beam2.json",
        "average-last2.uniform0.test.beam2.json",
    ]


@pytest.mark.parametrize(
    ("average", "message"),
    [
        (0, "evaluate.average: expected a positive integer, got 0"),
        (50, "but run weighted-s1 keeps"),
    ],
)
def test_averaging_more_checkpoints_than_kept_is_refused(tmp_path, average, message):
    path = write_grid(tmp_path, evaluate={"split": "test", "average": average})
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_grid(path)


def test_a_run_with_fewer_checkpoints_than_asked_averages_what_it_has(tmp_path):
    path = write_grid(
        tmp_path,
        seeds=[1],
        budget={"max_steps": 3},
        evaluate={"split": "test", "beam": 2, "average": 2},
        analyze=False,
    )
    grid = load_grid(path)
    assert run_grid(grid, say=lambda _: None) == {"weighted-s1": "finished"}
    scores = json.loads((grid.runs[0].run_dir / "scores.json").read_text())
    assert scores["test"]["average"] == 2  # as asked
    assert scores["test"]["checkpoints"] == ["step_0000003.safetensors"]  # what there was
