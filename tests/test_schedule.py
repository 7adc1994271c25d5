"""Learning-rate schedules: the paper's values, κ/α's own schedule, linear decay, and the
warm-up a time-bounded run fits to the updates that fit."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest

from helpers import tiny_run_config
from wtnmt.config import ConfigError, load_config
from wtnmt.train import Trainer, branch_lr, inverse_sqrt
from wtnmt.train.schedule import linear_decay, run_progress

QUIET = {"log_to_stderr": False}


def _logged(run) -> list[dict]:  # type: ignore[no-untyped-def, type-arg]
    return [e for e in map(json.loads, (run / "metrics.jsonl").open()) if "lr" in e]


def test_schedules_give_the_paper_values():
    # lr = D^-0.5 · min(step^-0.5, step · warmup^-1.5), D = 512, warm-up 4000
    assert inverse_sqrt(1, d_model=512, warmup=4000) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert inverse_sqrt(4000, d_model=512, warmup=4000) == pytest.approx(6.98771242e-4)
    assert inverse_sqrt(16000, d_model=512, warmup=4000) == pytest.approx(3.49385621e-4)
    assert inverse_sqrt(0, d_model=512, warmup=4000) == inverse_sqrt(1, d_model=512, warmup=4000)
    # κ, α: (D/N)^-0.5 · min(step^-0.5, step · 400^-1.5), D = 512, N = 6
    assert branch_lr(400, d_model=512, layers=6, warmup=400) == pytest.approx(5.41265877e-3)
    assert branch_lr(100, d_model=512, layers=6, warmup=400) == pytest.approx(
        (512 / 6) ** -0.5 * 100 * 400**-1.5
    )
    peak = max(inverse_sqrt(s, d_model=512, warmup=4000) for s in range(1, 10_000))
    assert peak == inverse_sqrt(4000, d_model=512, warmup=4000)


def test_a_shared_schedule_gives_kappa_alpha_the_learning_rate_of_the_rest(tmp_path):
    from wtnmt.train.schedule import learning_rates

    config = tiny_run_config(tmp_path, train={"branch_schedule": "shared", "max_steps": 6})
    m, tc = config.model, config.train
    for step in (1, 3, 6):
        lr, lr_b = learning_rates(step, m, tc, frozen=False)
        expected = inverse_sqrt(step, d_model=m.d_model, warmup=tc.warmup, scale=tc.lr_scale)
        assert lr_b == lr == expected
    own = dataclasses.replace(tc, branch_schedule="own")
    assert learning_rates(3, m, own, frozen=False)[1] == branch_lr(
        3, d_model=m.d_model, layers=m.encoder_layers, warmup=tc.branch_warmup, scale=tc.lr_scale
    )
    assert learning_rates(3, m, tc, frozen=True)[1] == 0.0
    Trainer(config, tmp_path / "run", log_to_stderr=False).run()
    from wtnmt.analysis import read_metrics

    logged = [e for e in read_metrics(tmp_path / "run" / "metrics.jsonl") if "lr" in e]
    assert logged and all(e["lr_branch"] == e["lr"] for e in logged)


def _on_a_fake_clock(tmp_path, monkeypatch, seconds_an_update, **train):  # type: ignore[no-untyped-def]
    """A tiny time-bounded run whose training loop reads a clock that moves
    ``seconds_an_update`` at each reading (one an update), with train.warmup_fraction 0.3 and a
    config warm-up of 4,000 that a fixed schedule would never reach."""
    import types

    from wtnmt.train import loop

    ticks = itertools.count()
    fake = types.SimpleNamespace(perf_counter=lambda: next(ticks) * seconds_an_update)
    monkeypatch.setattr(loop, "time", fake)
    return tiny_run_config(
        tmp_path,
        train={
            "max_steps": None,
            "warmup": 4000,
            "warmup_fraction": 0.3,
            "valid_every": 10_000,
            "save_every": 10_000,
            **train,
        },
    )


def test_a_time_bounded_run_fits_its_warmup_to_the_updates_that_fit(tmp_path, monkeypatch):
    """train.warmup_fraction: the warm-up is a fraction of the updates predicted from the
    first updates' rate, so that a slow machine still ends warm-up (and κ/α's freeze window
    opens) inside the run. A clock of 0.05 s an update makes the run ~100 updates long."""
    config = _on_a_fake_clock(
        tmp_path, monkeypatch, 0.05, max_time=5.0, freeze_branch_weights=0, log_every=5
    )
    trainer = Trainer(config, tmp_path / "run", **QUIET)
    state = trainer.run()
    assert 95 <= state.step <= 105
    assert 95 <= state.predicted_steps <= 105
    assert state.warmup == round(0.3 * state.predicted_steps) and state.warmup < state.step
    assert state.branch_warmup == round(state.warmup / 10)
    log = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    steps = [e for e in log if "lr" in e]
    peak = max(steps, key=lambda e: e["lr"])["step"]
    assert abs(peak - state.warmup) <= 5  # the learning rate peaked at the fitted warm-up
    frozen = [e["step"] for e in steps if e["lr_branch"] == 0.0]
    assert frozen and min(frozen) > state.warmup  # κ/α frozen at the end, after warm-up
    assert "schedule:" in (tmp_path / "run" / "train.log").read_text()


def test_the_fit_follows_the_rate_after_a_slow_start(tmp_path, monkeypatch):
    """The first updates are slow (allocations, kernels chosen): fitted on them alone, the
    schedule would predict a third of the updates and a warm-up a third as long. Fitted again
    at 10, 20, 40 … updates from the rate since the last fit, it predicts the run's length."""
    import types

    from wtnmt.train import loop

    readings = itertools.count()  # two a training update: 0.1 s each for the first 5, then 0.02
    clock = {"now": 0.0}

    def perf_counter() -> float:
        i = next(readings)
        if i % 2:  # the reading that ends an update
            clock["now"] += 0.1 if i < 10 else 0.02
        return clock["now"]

    config = _on_a_fake_clock(tmp_path, monkeypatch, 0.0, max_time=4.0)
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(perf_counter=perf_counter))
    state = Trainer(config, tmp_path / "run", **QUIET).run()
    assert state.step == 5 + 175  # 0.5 s, then 3.5 s at 0.02 s an update
    assert abs(state.predicted_steps - state.step) <= 2
    assert state.warmup == round(0.3 * state.predicted_steps)
    logged = (tmp_path / "run" / "train.log").read_text()
    # the first 5 updates alone predicted 5 + 3.5 / 0.1 = 40
    assert "about 40 updates" in logged and "fitted again after 10 updates" in logged


def test_warmup_fraction_needs_a_time_bound():
    with pytest.raises(ConfigError, match="warmup_fraction sets the warm-up of a run bounded"):
        load_config("weighted-tiny", ["train.warmup_fraction=0.3", "train.max_steps=100"])
    with pytest.raises(ConfigError, match=r"train\.warmup_fraction=1\.5 must be in \(0, 1\)"):
        load_config(
            "weighted-tiny",
            ["train.warmup_fraction=1.5", "train.max_steps=null", "train.max_time=60"],
        )


def test_a_run_of_fewer_updates_than_the_calibration_still_ends_its_warmup(tmp_path, monkeypatch):
    """A machine so slow that only 3 updates fit: the warm-up fitted after each of them
    still ends inside the run (the config's 4,000 would never end)."""
    config = _on_a_fake_clock(tmp_path, monkeypatch, 2.0, max_time=6.0)
    state = Trainer(config, tmp_path / "run", **QUIET).run()
    assert state.step == 3 and state.predicted_steps == 3 and state.warmup == 1


def test_a_fitted_warmup_keeps_the_configured_peak_learning_rate(tmp_path, monkeypatch):
    """train.peak_lr with train.warmup_fraction: the schedule peaks at peak_lr at the fitted
    warm-up (its scale follows the warm-up in use, not the config's 4,000)."""
    config = _on_a_fake_clock(tmp_path, monkeypatch, 0.05, max_time=5.0, peak_lr=0.002, log_every=1)
    state = Trainer(config, tmp_path / "run", **QUIET).run()
    log = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    top = max((e for e in log if "lr" in e), key=lambda e: e["lr"])
    assert top["lr"] == pytest.approx(0.002, rel=1e-3)
    assert abs(top["step"] - state.warmup) <= 1


def test_linear_decay_rises_to_its_peak_and_falls_to_zero_at_the_end():
    # warm-up 10 of a 100-step run: 0.1·peak at step 1, the peak at 10, half of it when half
    # of the decay is done (progress 0.55), 0 at the end and never below
    lr = lambda step, progress: linear_decay(  # noqa: E731
        step, progress, peak=2.0, warmup=10, warmup_progress=0.1
    )
    assert lr(1, 0.0) == pytest.approx(0.2)
    assert lr(10, 0.09) == pytest.approx(2.0)
    assert lr(11, 0.10) == pytest.approx(2.0)
    assert lr(56, 0.55) == pytest.approx(1.0)
    assert lr(100, 1.0) == 0.0
    assert run_progress(25, 10.0, max_steps=100, max_time=None) == 0.25
    assert run_progress(25, 30.0, max_steps=100, max_time=60.0) == 0.5  # the nearer end
    assert run_progress(25, 90.0, max_steps=None, max_time=60.0) == 1.0


def test_a_step_bounded_run_follows_the_linear_schedule_exactly(tmp_path):
    """lr at update k of N with warm-up w: the inverse square root's peak (scale · D^-0.5 ·
    w^-0.5) times min(k / w, (1 − (k − 1) / N) / (1 − w / N))."""
    n, w = 12, 4
    config = tiny_run_config(
        tmp_path,
        train={"max_steps": n, "warmup": w, "lr_schedule": "linear", "log_every": 1},
    )
    Trainer(config, tmp_path / "run", **QUIET).run()
    m, tc = config.model, config.train
    peak = tc.lr_scale * m.d_model**-0.5 * w**-0.5
    expected = [peak * min(k / w, (1 - (k - 1) / n) / (1 - w / n)) for k in range(1, n + 1)]
    logged = _logged(tmp_path / "run")
    assert [e["step"] for e in logged] == list(range(1, n + 1))
    assert [e["lr"] for e in logged] == pytest.approx(expected, rel=1e-6)


def test_a_time_bounded_linear_run_peaks_at_its_fitted_warmup_and_ends_near_zero(
    tmp_path, monkeypatch
):
    config = _on_a_fake_clock(
        tmp_path, monkeypatch, 0.05, max_time=5.0, lr_schedule="linear", log_every=1
    )
    state = Trainer(config, tmp_path / "run", **QUIET).run()
    lrs = [e["lr"] for e in _logged(tmp_path / "run")]
    top = max(range(len(lrs)), key=lrs.__getitem__)
    assert abs(top + 1 - state.warmup) <= 1
    after = lrs[top:]
    assert all(a >= b for a, b in itertools.pairwise(after))  # falls from the peak
    assert lrs[-1] < 0.03 * lrs[top]


def test_an_unknown_schedule_is_refused():
    with pytest.raises(ConfigError, match="lr_schedule"):
        load_config("weighted-tiny", ["train.lr_schedule=cosine"])


DDP_CLOCK_WORKER = """
import itertools, json, os, sys, types
sys.path.insert(0, {tests!r})
from pathlib import Path
import torch
from helpers import tiny_run_config
from wtnmt.train import Trainer, loop
torch.set_num_threads(1)
rank = int(os.environ["RANK"])
ticks = itertools.count()  # rank 1's clock runs three times as fast as rank 0's
loop.time = types.SimpleNamespace(perf_counter=lambda: next(ticks) * (0.05, 0.15)[rank])
config = tiny_run_config(Path({tmp!r}), n_train=300, train={{"max_steps": None,
    "max_time": 1.0, "warmup": 4000, "warmup_fraction": 0.3, "valid_every": 10_000,
    "save_every": 10_000, "max_tokens": 200}})
s = Trainer(config, Path({run!r}), log_to_stderr=False).run()
Path({out!r} + str(rank)).write_text(json.dumps([s.step, s.warmup, s.predicted_steps]))
"""


@pytest.mark.slow
def test_ddp_ranks_share_rank_0s_clock_in_a_time_bounded_run(tmp_path):
    """Each rank on its own clock would fit its own warm-up and stop at its own update: rank
    1 (three times as fast a clock here) after 7 updates, leaving rank 0 waiting for it."""
    from helpers import two_processes
    from wtnmt.data import prepare

    config = tiny_run_config(tmp_path, n_train=300)
    prepare(config.data, config.data.prepared_path(), log=lambda m: None)  # no race to build it
    out = str(tmp_path / "state")
    code = DDP_CLOCK_WORKER.format(
        tests=str(Path(__file__).parent), tmp=str(tmp_path), run=str(tmp_path / "ddp"), out=out
    )
    two_processes(code, timeout=120)
    ranks = [json.loads(Path(out + str(r)).read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1]
    assert ranks[0][0] == 20  # 1 s of rank 0's clock at 0.05 s an update
    assert ranks[0][1] == round(0.3 * ranks[0][2])
