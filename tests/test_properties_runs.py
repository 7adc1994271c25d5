"""Property-based tests over what a run's user hands the toolkit: grid files, damaged
metrics logs for `analyze`, and any files to `evaluate`. Each is accepted or refused with the
toolkit's own error in one line; never a traceback."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import train_tiny
from wtnmt.analysis.metrics import read_metrics
from wtnmt.cli import main as cli
from wtnmt.config import ConfigError
from wtnmt.experiment import load_grid
from wtnmt.experiment.grid import ANALYZE_KEYS, BUDGET_KEYS, EVALUATE_KEYS, GRID_KEYS

SLOW_FIXTURE = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-5, 10**6)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return train_tiny(tmp_path_factory.mktemp("props"), valid_every=2, log_every=1)


def _one_line_or_nothing(run) -> int:  # type: ignore[no-untyped-def]
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = run()
        except SystemExit as e:  # argparse's own refusals
            code = e.code
    text = err.getvalue()
    assert "Traceback" not in text, text
    if code == 2:
        errors = [line for line in text.splitlines() if ": error: " in line]
        assert len(errors) == 1, text
    return code


grid_parts = st.fixed_dictionaries(
    {},
    optional={
        "out": VALUES,
        "base": st.dictionaries(
            st.sampled_from(["train.seed", "model.dropout", "x"]), SCALARS, max_size=2
        ),
        "budget": st.dictionaries(
            st.sampled_from([*sorted(BUDGET_KEYS), "x"]), SCALARS, max_size=2
        ),
        "threads": SCALARS,
        "parallel": SCALARS,
        "seeds": VALUES,
        "evaluate": st.booleans()
        | st.dictionaries(st.sampled_from(sorted(EVALUATE_KEYS)), SCALARS, max_size=3),
        "analyze": st.booleans()
        | st.dictionaries(st.sampled_from(sorted(ANALYZE_KEYS)), SCALARS, max_size=3),
        "runs": VALUES
        | st.lists(
            st.fixed_dictionaries({"name": SCALARS, "preset": st.just("weighted-tiny")}), max_size=2
        ),
        "other": SCALARS,
    },
)


@settings(max_examples=100, deadline=None, suppress_health_check=SLOW_FIXTURE)
@given(values=grid_parts)
def test_any_grid_file_is_loaded_or_refused_by_name(tmp_path, values):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(values, allow_unicode=True))
    try:
        grid = load_grid(path)
    except ConfigError as e:
        assert str(e).startswith(f"{path}:") and "\n" not in str(e)
        return
    assert set(values) <= GRID_KEYS and grid.runs  # accepted: it is a grid


LINES = st.lists(
    st.one_of(
        st.binary(max_size=40),
        st.builds(
            lambda d: json.dumps(d).encode(),
            st.dictionaries(
                st.sampled_from(
                    ["step", "loss", "elapsed", "valid_loss", "valid_bleu", "nll", "x"]
                ),
                SCALARS,
                max_size=4,
            ),
        ),
    ),
    max_size=6,
)


@pytest.mark.slow
@settings(max_examples=10, deadline=None, suppress_health_check=SLOW_FIXTURE)
@given(lines=LINES, where=st.integers(0, 30))
def test_analyze_reads_any_damaged_log_without_a_traceback(run_dir, tmp_path_factory, lines, where):
    import shutil

    tmp = tmp_path_factory.mktemp("damaged")
    run = tmp / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("checkpoints", "*.safetensors"))
    good = (run / "metrics.jsonl").read_bytes().splitlines()
    where = min(where, len(good))
    damaged = good[:where] + [line.replace(b"\n", b" ") for line in lines] + good[where:]
    (run / "metrics.jsonl").write_bytes(b"\n".join(damaged) + b"\n")
    entries = read_metrics(run / "metrics.jsonl")
    assert all(isinstance(e["step"], int) for e in entries)
    code = _one_line_or_nothing(
        lambda: cli(["analyze", str(run), "--out", str(tmp / "report"), "--no-decode"])
    )
    assert code in (0, 2)


@settings(max_examples=10, deadline=None, suppress_health_check=SLOW_FIXTURE)
@given(src=st.binary(max_size=80), ref=st.binary(max_size=80), beam=st.integers(-2, 3))
def test_evaluate_answers_any_files_or_refuses_them_in_one_line(
    run_dir, tmp_path_factory, src, ref, beam
):
    tmp = tmp_path_factory.mktemp("evaluate")
    (tmp / "src").write_bytes(src)
    (tmp / "ref").write_bytes(ref)
    code = _one_line_or_nothing(
        lambda: cli(
            [
                "evaluate",
                str(run_dir),
                "--src",
                str(tmp / "src"),
                "--ref",
                str(tmp / "ref"),
                "--beam",
                str(beam),
            ]
        )
    )
    assert code in (0, 2)
