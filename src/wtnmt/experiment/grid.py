"""Experiment grid files: ``experiments/*.yaml``, each a set of runs (presets with ``--set``
overrides) × seeds under one budget, and what to do with them once trained.

A grid file::

    out: experiments/multi30k          # where the run directories go (one per run × seed)
    base: {data.corpus: multi30k}      # overrides of every run
    budget: {max_time: 900}            # or {max_steps: N}: train.max_time / train.max_steps
    threads: 1                         # threads of each run
    parallel: 2                        # runs at once
    seeds: [1, 2, 3]
    evaluate: {split: test}            # or false: the finished run's test scores; with
                                       # average: N, of the mean of its last N checkpoints
    analyze: {out: experiments/multi30k/report-en-de}   # or false
    runs:
      - {name: transformer, preset: transformer-small, set: {train.lr_scale: 0.5}}
      - {name: weighted, preset: weighted-small}

Every key is checked: an unknown one, a missing one or a value of the wrong kind is a
ConfigError naming the file and the key. Each run resolves to the full config it will train
with, so a run directory is matched against exactly what the grid asks of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from wtnmt.config import ConfigError, RunConfig, config_to_dict, load_config
from wtnmt.config.loading import read_yaml_file

GRID_KEYS = {"out", "base", "budget", "threads", "parallel", "seeds", "evaluate", "analyze", "runs"}
RUN_KEYS = {"name", "preset", "set", "seeds"}
BUDGET_KEYS = {"max_time", "max_steps"}
EVALUATE_KEYS = {"split", "beam", "average"}
ANALYZE_KEYS = {
    "out",
    "target_bleu",
    "smooth",
    "random_seeds",
    "attention_sentence",
    "decode",
    "pairs",
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


@dataclass(frozen=True)
class RunSpec:
    """One run of a grid: a named config at one seed, and where it trains."""

    name: str  # "<run name>-s<seed>", the run directory's name
    label: str  # the run's name in the grid (the same for every seed)
    preset: str
    overrides: tuple[str, ...]  # --set texts, in the order they apply
    seed: int
    run_dir: Path  # where it trains: checkpoints, weights, logs
    # where its small results go when it finishes, when it trains elsewhere (in_work_dir)
    results_dir: Path | None = None

    def config(self) -> RunConfig:
        return load_config(self.preset, list(self.overrides))

    def config_dict(self) -> dict[str, Any]:
        """The run's full config as plain values, as its config.yaml holds them."""
        return config_to_dict(self.config())


@dataclass(frozen=True)
class Grid:
    path: Path
    out: Path
    runs: tuple[RunSpec, ...]
    threads: int
    parallel: int
    evaluate: dict[str, Any] | None  # {"split": ..., "beam": ...} or None
    analyze: dict[str, Any] | None
    work_dir: Path | None = None  # where the runs train, when not in out (in_work_dir)

    @property
    def again(self) -> str:
        """The command that goes on with this grid."""
        extra = f" --work-dir {self.work_dir}" if self.work_dir is not None else ""
        return f"wtnmt experiment {self.path}{extra}"

    def configs(self) -> dict[str, dict[str, Any]]:
        """Every run's full config as plain values (checked once, before anything trains)."""
        return {spec.name: spec.config_dict() for spec in self.runs}


def _fail(path: Path, key: str, what: str) -> ConfigError:
    return ConfigError(f"{path}: {key}: {what}")


def _mapping(path: Path, key: str, value: Any, allowed: set[str] | None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, key, f"expected a mapping, got {type(value).__name__}")
    if allowed is not None:
        unknown = sorted(set(map(str, value)) - allowed)
        if unknown:
            raise _fail(
                path, key, f"unknown key {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}"
            )
    return value


def _positive_int(path: Path, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(path, key, f"expected a positive integer, got {value!r}")
    return value


def _overrides(path: Path, key: str, values: Any) -> list[str]:
    """``{section.key: value}`` → ``["section.key=value"]`` (values written back as YAML, so
    they are read exactly as ``--set`` reads them)."""
    out = []
    for k, v in _mapping(path, key, values or {}, None).items():
        if not isinstance(k, str) or k.count(".") < 1:
            raise _fail(path, f"{key}.{k}", "overrides are section.key: value, e.g. model.dropout")
        text = yaml.safe_dump(v, default_flow_style=True).strip()
        out.append(f"{k}={text.removesuffix('...').strip()}")
    return out


def _seeds(path: Path, key: str, value: Any) -> list[int]:
    if not isinstance(value, list) or not value:
        raise _fail(path, key, f"expected a list of seeds, got {value!r}")
    seeds = [_positive_int(path, key, s) for s in value]
    if len(set(seeds)) != len(seeds):
        raise _fail(path, key, f"a seed is listed twice: {seeds}")
    return seeds


def _out_directory(path: Path, key: str, value: Any) -> Path:
    """A directory to write into: a non-empty path that is not a file."""
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, key, f"expected a directory path, got {value!r}")
    out = Path(value)
    if out.exists() and not out.is_dir():
        raise _fail(path, key, f"{value}: is a file; give a directory")
    return out


def _analyze_options(path: Path, value: Any, models: list[str]) -> dict[str, Any]:
    """The ``analyze:`` mapping, every value checked now (not after hours of training);
    ``models``: the grid's runs' names, which ``pairs`` name."""
    options = dict(_mapping(path, "analyze", value, ANALYZE_KEYS))
    if "out" in options:
        options["out"] = str(_out_directory(path, "analyze.out", options["out"]))
    for key in ("smooth", "random_seeds"):
        if key in options:
            _positive_int(path, f"analyze.{key}", options[key])
    sentence = options.get("attention_sentence", 0)
    if isinstance(sentence, bool) or not isinstance(sentence, int) or sentence < 0:
        raise _fail(
            path, "analyze.attention_sentence", f"expected an integer ≥ 0, got {sentence!r}"
        )
    target = options.get("target_bleu")
    if target is not None and (
        isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 <= target <= 100
    ):
        raise _fail(
            path, "analyze.target_bleu", f"expected a BLEU between 0 and 100, got {target!r}"
        )
    if not isinstance(options.get("decode", True), bool):
        raise _fail(path, "analyze.decode", f"expected true or false, got {options['decode']!r}")
    pairs = options.get("pairs", [])
    if not isinstance(pairs, list):
        raise _fail(path, "analyze.pairs", f"expected a list of MODEL:BASELINE, got {pairs!r}")
    from wtnmt.analysis.tables import model_pairs

    model_pairs(pairs, models, f"{path}: analyze.pairs:")
    return options


def load_grid(path: str | Path) -> Grid:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such grid file")
    values = _mapping(path, "the file", read_yaml_file(path), GRID_KEYS)
    for required in ("out", "runs"):
        if required not in values:
            raise _fail(path, required, "missing; a grid names its out directory and its runs")
    out = _out_directory(path, "out", values["out"])
    base = _overrides(path, "base", values.get("base"))
    budget = _mapping(path, "budget", values.get("budget") or {}, BUDGET_KEYS)
    if len(budget) != 1:
        raise _fail(path, "budget", "give exactly one of max_time (seconds) or max_steps")
    ((kind, amount),) = budget.items()
    if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount <= 0:
        raise _fail(path, f"budget.{kind}", f"expected a positive number, got {amount!r}")
    other = "max_steps" if kind == "max_time" else "max_time"
    budget_sets = [f"train.{kind}={amount}", f"train.{other}=null", "train.max_epochs=null"]
    threads = _positive_int(path, "threads", values.get("threads", 1))
    parallel = _positive_int(path, "parallel", values.get("parallel", 1))
    seeds = _seeds(path, "seeds", values.get("seeds", [1]))
    evaluate = values.get("evaluate", {"split": "test"})
    if evaluate is not False:
        evaluate = {"split": "test", **_mapping(path, "evaluate", evaluate, EVALUATE_KEYS)}
        if evaluate["split"] not in ("valid", "test"):
            raise _fail(path, "evaluate.split", f"{evaluate['split']!r}; allowed: valid, test")
        for key in ("beam", "average"):
            if key in evaluate:
                _positive_int(path, f"evaluate.{key}", evaluate[key])
    runs_value = values["runs"]
    if not isinstance(runs_value, list) or not runs_value:
        raise _fail(path, "runs", "expected a non-empty list of runs")
    specs: list[RunSpec] = []
    for i, run in enumerate(runs_value):
        key = f"runs[{i}]"
        run = _mapping(path, key, run, RUN_KEYS)
        name, preset = run.get("name"), run.get("preset")
        if not isinstance(name, str) or not _NAME.match(name):
            raise _fail(path, f"{key}.name", f"{name!r}: letters, digits, '_.+-' only")
        if not isinstance(preset, str):
            raise _fail(path, f"{key}.preset", "missing: a preset name or a config file")
        run_seeds = _seeds(path, f"{key}.seeds", run["seeds"]) if "seeds" in run else seeds
        for seed in run_seeds:
            overrides = (
                *base,
                *_overrides(path, f"{key}.set", run.get("set")),
                *budget_sets,
                f"train.threads={threads}",
                f"train.seed={seed}",
            )
            specs.append(
                RunSpec(
                    name=f"{name}-s{seed}",
                    label=name,
                    preset=preset,
                    overrides=overrides,
                    seed=seed,
                    run_dir=out / f"{name}-s{seed}",
                )
            )
    # seed-major: the runs that go side by side are the models of one seed, so that each
    # model shares the machine with the same company
    specs.sort(key=lambda s: s.seed)
    analyze = values.get("analyze", {})
    models = list(dict.fromkeys(s.label for s in specs))
    analyze = None if analyze is False else _analyze_options(path, analyze or {}, models)
    names = [s.name for s in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise _fail(path, "runs", f"two runs share the name {twice[0]!r}")
    grid = Grid(path, out, tuple(specs), threads, parallel, evaluate or None, analyze)
    for spec in specs:  # every run's config is valid before anything starts
        try:
            config = spec.config()
        except ConfigError as e:
            raise ConfigError(f"{path}: run {spec.name}: {e}") from None
        last = (evaluate or {}).get("average")
        if last and config.train.keep_checkpoints < last:
            raise _fail(
                path,
                "evaluate.average",
                f"{last} checkpoints, but run {spec.name} keeps {config.train.keep_checkpoints} "
                f"(train.keep_checkpoints)",
            )
    return grid


def only_runs(grid: Grid, patterns: list[str]) -> Grid:
    """The grid with only the runs whose name matches one of ``patterns`` (shell-style); a
    pattern that matches none is a ConfigError naming the runs there are."""
    import dataclasses
    import fnmatch

    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(s.name, pattern) for s in grid.runs):
            names = ", ".join(s.name for s in grid.runs)
            raise ConfigError(f"--only {pattern!r}: no run of {grid.path} is named so ({names})")
    kept = tuple(s for s in grid.runs if any(fnmatch.fnmatchcase(s.name, p) for p in patterns))
    return dataclasses.replace(grid, runs=kept)


def in_work_dir(grid: Grid, work_dir: Path) -> Grid:
    """The grid with its runs trained under ``work_dir`` (the grid's ``out`` path below it, so
    that grids never share a run directory), each run's small results going to where the grid
    file puts the run: checkpoints kept on a disk that outlives the work tree, the results
    where they are committed."""
    import dataclasses

    if work_dir.exists() and not work_dir.is_dir():
        raise ConfigError(f"--work-dir {work_dir}: is a file; give a directory")
    below = work_dir / str(grid.out).lstrip("/")
    if below.resolve() == grid.out.resolve():
        raise ConfigError(f"--work-dir {work_dir}: puts the runs where the grid's out is")
    runs = tuple(
        dataclasses.replace(s, run_dir=below / s.name, results_dir=s.run_dir) for s in grid.runs
    )
    return dataclasses.replace(grid, runs=runs, work_dir=work_dir)


__all__ = ["Grid", "RunSpec", "in_work_dir", "load_grid", "only_runs"]
