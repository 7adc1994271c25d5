"""`wtnmt analyze`'s figures of the neighbouring papers: Bapna et al.'s r_t and transparent
weights, and Li et al.'s disagreement per layer averaged over a model's seeds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers import tiny_run_config
from wtnmt.analysis.metrics import RunMetrics
from wtnmt.analysis.report import analyze
from wtnmt.train import Trainer


@pytest.fixture(scope="module")
def deep_run(tmp_path_factory) -> Path:
    """A tiny Transformer with transparent attention that logs r_t."""
    tmp = tmp_path_factory.mktemp("deep")
    config = tiny_run_config(
        tmp,
        model={"attention": "multihead", "encoder_combination": "transparent"},
        train={"max_steps": 8, "log_every": 2, "valid_every": 4, "grad_ratio": True},
    )
    Trainer(config, tmp / "deep-s1", log_to_stderr=False).run()
    return tmp / "deep-s1"


def test_r_t_and_transparent_weights_drawn_are_the_recorded_ones(deep_run, tmp_path):
    result = analyze([deep_run], tmp_path, say=lambda _: None)
    recorded = [e for e in RunMetrics.load(deep_run).train if "grad_ratio" in e]
    assert len(recorded) >= 3
    drawn = result["data"]["grad_ratio.png"]["deep-s1"]
    assert drawn["steps"] == [e["step"] for e in recorded]
    assert drawn["grad_ratio"] == [e["grad_ratio"] for e in recorded]
    transparent = result["data"]["transparent-deep-s1.png"]
    assert transparent["steps"][-1] == 8
    assert transparent["last"] == recorded[-1]["transparent_weights"]
    last = torch.tensor(transparent["last"])  # [N+1 encoder states, decoder layers]
    assert torch.allclose(last.sum(0), torch.ones(last.size(1)))
    for name in ("grad_ratio.png", "transparent-deep-s1.png"):
        assert (tmp_path / name).stat().st_size > 1000


def test_disagreement_figure_averages_the_seeds_of_a_model(tmp_path):
    from wtnmt.analysis.deep import plot_disagreement

    def scores(x: float) -> dict[str, dict[str, list[float]]]:
        return {"encoder_self": {"subspace": [x, 2 * x], "position": [-x, 0.0]}}

    path, drawn = plot_disagreement(
        {"a-s1": scores(-0.1), "a-s2": scores(-0.3), "b-s1": scores(-0.5)}, tmp_path / "d.png"
    )
    assert drawn["a"]["encoder_self"]["subspace"] == pytest.approx([-0.2, -0.4])
    assert drawn["a"]["encoder_self"]["position"] == pytest.approx([0.2, 0.0])
    assert drawn["b"] == scores(-0.5)
    assert path.stat().st_size > 1000
