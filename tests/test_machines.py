"""A run records the machine each start or resume of its training ran on (machines.jsonl), and
`wtnmt analyze` says so beside the seconds it compares: runs trained on different machines
compare machines as well as models."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from helpers import tiny_run_config
from wtnmt.analysis.runs import Run, machines_of
from wtnmt.analysis.tables import machines_note, runs_table, steps_to_bleu_table
from wtnmt.runtime import KERNEL_LIMITS, MACHINES, machine_description
from wtnmt.train import Trainer

QUIET = {"log_to_stderr": False}


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """A tiny run trained to 4 updates, then resumed to 6."""
    tmp = tmp_path_factory.mktemp("machines")
    for steps, resume in ((4, False), (6, True)):
        config = tiny_run_config(tmp, train={"max_steps": steps, "valid_every": 2})
        Trainer(config, tmp / "run", resume=resume, **QUIET).run()
    return tmp / "run"


def test_each_start_of_training_records_the_machine(resumed_run):
    entries = [json.loads(line) for line in (resumed_run / MACHINES).read_text().splitlines()]
    assert [e["step"] for e in entries] == [0, 4]  # the start, then the resume
    for entry in entries:
        assert entry["machine"] == machine_description("cpu")
        assert (entry["threads"], entry["processes"]) == (1, 1)  # the tiny config's one thread
    log = (resumed_run / "train.log").read_text()
    assert log.count(f"machine: {machine_description('cpu')}, 1 thread, torch ") == 2
    assert machines_of(resumed_run) == (machine_description("cpu"),)  # one machine, once


def test_machines_of_reads_each_machine_once_in_order(tmp_path):
    lines = [
        json.dumps({"step": 0, "machine": "A"}),
        json.dumps({"step": 900, "machine": "B"}),
        json.dumps({"step": 1800, "machine": "A"}),
        '{"step": 2700, "mach',  # cut short by a kill
    ]
    (tmp_path / MACHINES).write_text("\n".join(lines))
    assert machines_of(tmp_path) == ("A", "B")
    assert machines_of(tmp_path / "elsewhere") == ()  # a run trained before runs recorded it


def named(run: Run, name: str, machines: tuple[str, ...]) -> Run:
    return dataclasses.replace(run, label=name, machines=machines)


def test_analyze_says_when_seconds_compare_machines(resumed_run):
    run = Run.load(resumed_run)
    here = machine_description("cpu")
    same = [named(run, "a-s1", (here,)), named(run, "b-s1", (here,))]
    assert machines_note(same) == f"trained on {here}"
    other = [named(run, "a-s1", (here,)), named(run, "b-s1", ("X (avx2; ATen AVX2), 2 cores",))]
    note = machines_note(other)
    assert note == (
        f"seconds compare machines as well as models: a-s1 on {here}; "
        "b-s1 on X (avx2; ATen AVX2), 2 cores"
    )
    assert runs_table(other).note.endswith(note)
    assert steps_to_bleu_table(other, 0.0)[0].note.endswith(note)
    partly = [named(run, "a-s1", (here,)), named(run, "b-s1", ())]
    assert machines_note(partly) == (
        f"seconds may compare machines as well as models: a-s1 on {here}; b-s1: not recorded"
    )
    unrecorded = [named(run, "a-s1", ()), named(run, "b-s1", ())]
    assert machines_note(unrecorded) == ""
    assert "machine" not in runs_table(unrecorded).note


def test_the_machine_names_the_libraries_held_below_the_cpu(monkeypatch):
    """A figure measured with oneDNN's or FBGEMM's kernels held below the CPU's own (as the
    instruction-set ladder and an emulated older CPU do) says so beside it."""
    for name in KERNEL_LIMITS:
        monkeypatch.delenv(name, raising=False)
    plain = machine_description("cpu")
    assert "ONEDNN" not in plain and "FBGEMM" not in plain
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", "AVX2")
    held = machine_description("cpu")
    assert "; ONEDNN_MAX_CPU_ISA=AVX2; FBGEMM_ENABLE_INSTRUCTIONS=AVX2)" in held
    assert held.replace("; ONEDNN_MAX_CPU_ISA=AVX2; FBGEMM_ENABLE_INSTRUCTIONS=AVX2", "") == plain
