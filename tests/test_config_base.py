"""Config inheritance (``base:``: a preset or a file, itself with a base) and a preset's corpus
filters kept off one's own files; what a prepare filtered, each filter with its count, in its
log and summary.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from helpers import one_line, prepare_args
from test_data import write_corpus
from wtnmt.cli import main as cli
from wtnmt.config import ConfigError, config_to_dict, load_config


def write(path: Path, values: dict) -> Path:  # type: ignore[type-arg]
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path


def test_a_file_with_a_base_states_only_what_differs(tmp_path):
    child = write(tmp_path / "mine.yaml", {"base": "weighted-m30k", "train": {"max_steps": 5}})
    assert load_config(child) == load_config("weighted-m30k", ["train.max_steps=5"])
    # a base named relative to the file that names it, and a base of a base
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub" / "parent.yaml", {"base": "../mine.yaml", "model": {"dropout": 0.2}})
    grandchild = write(tmp_path / "sub" / "child.yaml", {"base": "parent.yaml"})
    expected = load_config("weighted-m30k", ["train.max_steps=5", "model.dropout=0.2"])
    assert load_config(grandchild) == expected
    assert config_to_dict(load_config(grandchild, ["model.dropout=0.3"]))["model"]["dropout"] == 0.3


def test_bases_in_a_circle_and_bad_bases_are_one_line(tmp_path, capsys):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    write(a, {"base": "b.yaml"})
    write(b, {"base": "a.yaml"})
    with pytest.raises(ConfigError, match="name each other in a circle"):
        load_config(a)
    for base, words in [(3, "give a preset name"), ("no-such-preset", "no-such-preset")]:
        bad = write(tmp_path / "bad.yaml", {"base": base})
        capsys.readouterr()
        assert cli(["train", str(bad), "--out", str(tmp_path / "run")]) == 2
        one_line(capsys, "train", str(bad), words)
        assert not (tmp_path / "run").exists()


def test_a_presets_corpus_filters_are_not_applied_to_ones_own_files(tmp_path):
    demo = load_config("weighted-demo")
    assert demo.data.max_words == 12  # the preset's filter for its corpus
    src, tgt = write_corpus(tmp_path, 20)
    own = {"train_src": str(src), "train_tgt": str(tgt)}
    mine = write(tmp_path / "mine.yaml", {"base": "weighted-demo", "data": own})
    assert load_config(mine).data.corpus is None and load_config(mine).data.max_words is None
    sets = [f"data.train_src={src}", f"data.train_tgt={tgt}"]
    assert load_config("weighted-demo", sets).data.max_words is None
    # stated by the user: applied
    assert load_config("weighted-demo", [*sets, "data.max_words=12"]).data.max_words == 12
    stated = write(
        tmp_path / "stated.yaml", {"base": "weighted-demo", "data": {**own, "max_words": 4}}
    )
    assert load_config(stated).data.max_words == 4


def test_prepare_says_every_filter_and_its_count_in_its_log_and_summary(tmp_path, capsys):
    long = " ".join(["alpha"] * 9)
    src, tgt = write_corpus(tmp_path, 60, extra=[(long, long.upper())] * 3)
    out = tmp_path / "prepared"
    capsys.readouterr()
    sets = ["--set", "data.max_words=8", "--set", "data.valid_size=5", "--set", "data.test_size=5"]
    assert cli(prepare_args(src, tgt, out, *sets)) == 0
    said = capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    filters = {row["filter"]: row for row in summary["filters"]}
    dropped_long = filters["data.max_words"]["dropped"]
    assert filters["data.max_words"]["setting"] == 8 and dropped_long >= 3
    assert {"data.drop_duplicates", "data.max_tokens_per_side", "data.max_length_ratio"} <= set(
        filters
    )
    # every pair read is accounted for: dropped by a filter named, held out, or kept
    splits = summary["splits"]
    dropped = sum(row["dropped"] for row in filters.values())
    held_out = splits["valid"]["pairs_kept"] + splits["test"]["pairs_kept"]
    assert (
        summary["corpus"]["pairs_read"] == 63 == dropped + held_out + splits["train"]["pairs_kept"]
    )
    log = said.out + said.err
    assert f"{dropped_long:,} by data.max_words=8" in log
