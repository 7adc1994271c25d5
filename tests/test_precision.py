"""train.precision: auto picks bf16 where the CPU multiplies bf16 in hardware, float32
elsewhere; bf16 asked of a CPU that emulates it trains as asked, with a warning from the
trainer and from the experiment runner."""

from __future__ import annotations

import torch
import yaml

from helpers import tiny_run_config
from wtnmt.config import config_to_dict
from wtnmt.experiment import load_grid, run_grid
from wtnmt.train import Trainer

QUIET = {"log_to_stderr": False}


def test_precision_auto_is_bf16_where_the_hardware_has_it_and_the_log_says_which(
    tmp_path, monkeypatch
):
    from wtnmt import runtime

    cpu = torch.device("cpu")
    for native, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda native=native: native)
        assert runtime.resolve_precision("auto", cpu) == expected
        assert runtime.resolve_precision("fp32", cpu) == "fp32"  # a stated precision stands
        assert runtime.resolve_precision("bf16", cpu) == "bf16"
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: True)
    config = tiny_run_config(tmp_path, train={"precision": "auto", "max_steps": 2})
    trainer = Trainer(config, tmp_path / "run", **QUIET)
    assert trainer.precision == "bf16"
    trainer.run()
    log = (tmp_path / "run" / "train.log").read_text()
    assert "in bf16 autocast (train.precision=auto)" in log


def test_bf16_asked_of_a_cpu_that_emulates_it_is_warned_of(tmp_path, monkeypatch):
    from wtnmt import runtime

    for native, warned in ((False, True), (True, False)):
        monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda native=native: native)
        run = tmp_path / f"run-{native}"
        config = tiny_run_config(tmp_path, train={"precision": "bf16", "max_steps": 1})
        Trainer(config, run, **QUIET).run()
        log = (run / "train.log").read_text()
        assert "in bf16 autocast," in log  # as asked: a stated precision stands
        assert ("bf16 instructions" in log and "emulated" in log) == warned


def test_a_grid_asking_bf16_of_a_cpu_that_emulates_it_is_warned_of(tmp_path, monkeypatch):
    from wtnmt import runtime

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    preset = tmp_path / "tiny.yaml"
    preset.write_text(yaml.safe_dump(config_to_dict(tiny_run_config(tmp_path))))
    grid = {
        "out": str(tmp_path / "runs"),
        "budget": {"max_steps": 2},
        "seeds": [1],
        "runs": [
            {"name": "plain", "preset": str(preset), "set": {"train.precision": "fp32"}},
            {"name": "half", "preset": str(preset), "set": {"train.precision": "bf16"}},
        ],
    }
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid, sort_keys=False))
    for native in (False, True):
        monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda native=native: native)
        said: list[str] = []
        run_grid(load_grid(path), dry_run=True, say=said.append)
        warnings = [line for line in said if "emulated" in line]
        if native:
            assert warnings == []
        else:
            assert len(warnings) == 1 and warnings[0].endswith("(half-s1)")
            assert warnings[0].startswith(f"{path}: warning: train.precision bf16")
