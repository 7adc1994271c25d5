"""Reading, cleaning and preparing data: every bad input is caught or counted, nothing misaligns."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from helpers import WORDS, prepare_args, sentence, translate
from wtnmt.cli import main as cli
from wtnmt.config import ConfigError, DataConfig
from wtnmt.data import DataError, ParallelData, Vocabulary, prepare
from wtnmt.data.dataset import write_ids
from wtnmt.data.io import read_lines, read_parallel, read_tsv
from wtnmt.data.split import split_by_pivot
from wtnmt.special import BOS, EOS, PAD


def write_corpus(
    tmp: Path, n: int = 300, *, extra: list[tuple[str, str]] = ()
) -> tuple[Path, Path]:
    pairs = [(sentence(i, 2 + i % 9), "") for i in range(n)]
    pairs = [(s, translate(s)) for s, _ in pairs] + list(extra)
    src, tgt = tmp / "train.src", tmp / "train.tgt"
    src.write_text("".join(p[0] + "\n" for p in pairs), encoding="utf-8")
    tgt.write_text("".join(p[1] + "\n" for p in pairs), encoding="utf-8")
    return src, tgt


def small_config(src: Path, tgt: Path, **changes) -> DataConfig:
    base = dict(
        corpus=None,
        train_src=str(src),
        train_tgt=str(tgt),
        valid_size=10,
        test_size=10,
        vocab_size=60,
        src_lang="xx",
        tgt_lang="yy",
    )
    return DataConfig(**{**base, **changes})


# --------------------------------------------------------------------------------------------
# Reading


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path):
    (tmp_path / "a").write_text("one\ntwo\nthree\n")
    (tmp_path / "b").write_text("eins\nzwei\n")
    with pytest.raises(DataError, match=r"a has 3 lines and .*b has 2"):
        read_parallel(tmp_path / "a", tmp_path / "b")


def test_invalid_utf8_names_file_line_and_byte_offset(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"good line\nsecond \xff line\n")
    with pytest.raises(DataError, match=r"bad\.txt: invalid UTF-8 on line 2 at byte offset 17"):
        read_lines(path)


def test_lines_split_on_newline_only(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes("one\u2028still one\x0cand\x85more\r\ntwo\n".encode())
    assert read_lines(path) == ["one\u2028still one\x0cand\x85more", "two"]
    gz = tmp_path / "t.txt.gz"
    gz.write_bytes(gzip.compress("a\u2028b\nc".encode()))
    assert read_lines(gz) == ["a\u2028b", "c"]


def test_tsv_line_with_wrong_columns_is_named(tmp_path):
    path = tmp_path / "c.tsv"
    path.write_text("a\tb\nc\td\te\nf\tg\n")
    with pytest.raises(DataError, match=r"c\.tsv: line 2 has 3 tab-separated columns"):
        read_tsv(path)
    path.write_text("a\tb\n")
    assert read_tsv(path) == [("a", "b")]


# --------------------------------------------------------------------------------------------
# Cleaning and alignment


def test_cleaning_drops_pairs_together_counts_them_and_never_misaligns(tmp_path):
    long = " ".join(WORDS * 30)
    extra = [
        ("", "LEER"),
        ("nur quelle", "  "),
        ("alpha beta", translate("alpha beta")),
        ("alpha beta", translate("alpha beta")),
        (long, translate(long)),
        ("alpha", translate(" ".join(WORDS * 2))),
    ]
    src, tgt = write_corpus(tmp_path, extra=extra)
    held = {}
    for split in ("valid", "test"):  # given dev and test: every pair above stays in train
        for side, f in (("src", lambda s: s), ("tgt", translate)):
            held[f"{split}_{side}"] = tmp_path / f"{split}.{side}"
            held[f"{split}_{side}"].write_text(
                "".join(f(sentence(i, 3)) + "\n" for i in range(500, 505))
            )
    config = small_config(
        src,
        tgt,
        max_tokens_per_side=300,
        max_length_ratio=3.0,
        **{k: str(v) for k, v in held.items()},
    )
    summary = prepare(config, tmp_path / "out", log=lambda _: None)
    train = summary["splits"]["train"]
    assert train["dropped"]["empty"] == 2
    assert train["dropped"]["duplicate"] >= 1
    assert train["dropped"]["too_long"] == 1
    assert train["dropped"]["length_ratio"] == 1
    assert train["pairs_read"] - sum(train["dropped"].values()) == train["pairs_kept"]
    vocab = Vocabulary(tmp_path / "out" / "spm.model")
    for split in ("train", "valid", "test"):
        data = ParallelData(tmp_path / "out", split)
        assert len(data) == summary["splits"][split]["pairs_kept"]
        for i in range(len(data)):  # alignment by content
            s, t = vocab.decode(data.src[i].tolist()), vocab.decode(data.tgt[i].tolist())
            assert t == translate(s), (split, i)
    batch = ParallelData(tmp_path / "out", "train").collate([0, 1])
    assert (batch.tgt_in[:, 0] == BOS).all()
    assert (batch.src == EOS).sum() == 2 and (batch.tgt_out == EOS).sum() == 2


def test_collate_pads_and_marks_each_pair_as_written(tmp_path):
    src = [[5, 6, 7], [8], [], [9, 10]]
    tgt = [[11], [12, 13, 14], [15, 16], []]
    write_ids(tmp_path / "train.src", src, vocab_size=100)
    write_ids(tmp_path / "train.tgt", tgt, vocab_size=100)
    batch = ParallelData(tmp_path, "train").collate([3, 0, 2, 0])  # a repeat, empty sides
    P, B, E = PAD, BOS, EOS
    assert batch.src.tolist() == [[9, 10, E, P], [5, 6, 7, E], [E, P, P, P], [5, 6, 7, E]]
    assert batch.tgt_in.tolist() == [[B, P, P], [B, 11, P], [B, 15, 16], [B, 11, P]]
    assert batch.tgt_out.tolist() == [[E, P, P], [11, E, P], [15, 16, E], [11, E, P]]
    assert batch.indices.tolist() == [3, 0, 2, 0] and batch.target_tokens == 8
    assert batch.src.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.int64


def test_held_out_splits_share_no_source_sentence_with_train(tmp_path):
    src, tgt = write_corpus(tmp_path)
    prepare(small_config(src, tgt), tmp_path / "out", log=lambda _: None)
    texts = {
        s: set((tmp_path / "out" / f"{s}.xx").read_text().splitlines()) for s in ("valid", "test")
    }
    vocab = Vocabulary(tmp_path / "out" / "spm.model")
    train = ParallelData(tmp_path / "out", "train")
    train_src = {vocab.decode(train.src[i].tolist()) for i in range(len(train))}
    assert len(texts["valid"]) == 10 and len(texts["test"]) == 10
    assert not (texts["valid"] | texts["test"]) & train_src
    assert not texts["valid"] & texts["test"]


def test_split_by_pivot_keeps_every_translation_of_a_held_out_sentence_out_of_train():
    pairs = [(f"s{i % 40}", f"t{i}") for i in range(200)]  # 40 sources, 5 translations each
    splits, dropped = split_by_pivot(pairs, pivot=0, seed=3, valid_size=5, test_size=5)
    held = {p[0] for p in splits["valid"] + splits["test"]}
    assert len(splits["valid"]) == 5 and len(splits["test"]) == 5
    assert not held & {p[0] for p in splits["train"]}
    assert dropped["other_translation_of_held_out"] == 10 * 4
    assert len(splits["train"]) == 200 - 50
    with pytest.raises(ValueError, match="only 40 unique sentences"):
        split_by_pivot(pairs, pivot=0, seed=3, valid_size=30, test_size=10)


# --------------------------------------------------------------------------------------------
# The prepared directory as a cache


def test_cache_reused_when_nothing_changed_and_rebuilt_on_any_change(tmp_path):
    src, tgt = write_corpus(tmp_path)
    out = tmp_path / "out"
    logs: list[str] = []
    prepare(small_config(src, tgt), out, log=logs.append)
    built = (out / "manifest.json").stat().st_mtime_ns
    logs.clear()
    prepare(small_config(src, tgt), out, log=logs.append)
    assert any("up to date" in line for line in logs)
    assert (out / "manifest.json").stat().st_mtime_ns == built
    # one changed input byte
    data = bytearray(src.read_bytes())
    data[0:5] = b"ALPHA"
    src.write_bytes(bytes(data))
    logs.clear()
    prepare(small_config(src, tgt), out, log=logs.append)
    assert not any("up to date" in line for line in logs)
    first = json.loads((out / "manifest.json").read_text())
    # one changed option
    logs.clear()
    prepare(small_config(src, tgt, vocab_size=70), out, log=logs.append)
    assert not any("up to date" in line for line in logs)
    assert json.loads((out / "manifest.json").read_text())["fingerprint"] != first["fingerprint"]
    # a damaged vocabulary is noticed
    (out / "spm.model").write_bytes(b"junk")
    logs.clear()
    prepare(small_config(src, tgt, vocab_size=70), out, log=logs.append)
    assert not any("up to date" in line for line in logs)
    assert not list(tmp_path.glob(".out.*"))  # no temporary directories left behind


def test_prepare_cli_prints_the_summary_and_writes_summary_json(tmp_path, capsys):
    src, tgt = write_corpus(tmp_path)
    rc = cli(
        prepare_args(
            src, tgt, tmp_path / "o", "--set", "data.valid_size=10", "--set", "data.test_size=10"
        )
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "train" in printed and "vocabulary: 60 shared pieces" in printed
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert set(summary["splits"]["train"]) >= {
        "pairs_read",
        "pairs_kept",
        "dropped",
        "tokens_src",
        "tokens_tgt",
    }
    assert (
        cli(
            [
                "prepare",
                "--src",
                str(tmp_path / "missing"),
                "--tgt",
                str(tgt),
                "--out",
                str(tmp_path / "p"),
            ]
        )
        == 2
    )
    assert "missing: no such file" in capsys.readouterr().err
    assert (
        cli(
            [
                "prepare",
                "--src",
                str(src),
                "--tgt",
                str(tgt),
                "--out",
                str(tmp_path / "q"),
                "--vocab-size",
                "100000",
                "--set",
                "data.valid_size=10",
                "--set",
                "data.test_size=10",
            ]
        )
        == 2
    )
    assert "lower data.vocab_size" in capsys.readouterr().err


def test_config_wants_exactly_one_data_source():
    with pytest.raises(ConfigError, match="set exactly one source of training data"):
        DataConfig(corpus="multi30k", train_tsv="x.tsv")
    with pytest.raises(ConfigError, match="set exactly one source"):
        DataConfig(corpus=None)
    with pytest.raises(ConfigError, match=r"data\.valid_src and data\.valid_tgt go together"):
        DataConfig(valid_src="a")


# --------------------------------------------------------------------------------------------
# Dev and test files a user gives


def _pair_files(tmp: Path, name: str, sources: list[str]) -> tuple[str, str]:
    src, tgt = tmp / f"{name}.src", tmp / f"{name}.tgt"
    src.write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    tgt.write_text("".join(translate(s) + "\n" for s in sources), encoding="utf-8")
    return str(src), str(tgt)


@pytest.mark.parametrize("given", ["valid", "test"])
def test_given_dev_or_test_files_are_used_and_only_the_missing_split_held_out(tmp_path, given):
    src, tgt = write_corpus(tmp_path)
    files = _pair_files(tmp_path, given, [f"omega {sentence(900 + i, 3)}" for i in range(7)])
    config = small_config(src, tgt, **{f"{given}_src": files[0], f"{given}_tgt": files[1]})
    said: list[str] = []
    summary = prepare(config, tmp_path / "out", log=said.append)
    other = "test" if given == "valid" else "valid"
    assert summary["splits"][given]["pairs_kept"] == 7  # the files given, all of them
    assert summary["splits"][other]["pairs_kept"] == 10  # held out: valid_size = test_size = 10
    held = (tmp_path / "out" / f"{other}.xx").read_text().split("\n")[:-1]
    train = {p[0] for p in prepared_pairs(tmp_path / "out", "train")}
    assert not train & set(held)  # the held-out split's sentences are out of training
    assert any(f"{other} held out of training" in line and given in line for line in said)
    assert (tmp_path / "out" / f"{given}.xx").read_text().startswith("omega ")


def prepared_pairs(directory: Path, split: str) -> list[tuple[str, str]]:
    """A prepared split read back as text."""
    vocab = Vocabulary(directory / "spm.model")
    data = ParallelData(directory, split)
    return [
        (vocab.decode(data.src[i].tolist()), vocab.decode(data.tgt[i].tolist()))
        for i in range(len(data))
    ]


def test_max_words_and_train_size_apply_to_a_source_with_its_own_splits(tmp_path):
    src, tgt = write_corpus(tmp_path)
    valid = _pair_files(tmp_path, "valid", [sentence(800 + i, 3) for i in range(5)])
    test = _pair_files(tmp_path, "test", [sentence(850 + i, 12) for i in range(5)])
    config = small_config(
        src, tgt, valid_src=valid[0], valid_tgt=valid[1], test_src=test[0], test_tgt=test[1],
        max_words=4, train_size=40,
    )  # fmt: skip
    summary = prepare(config, tmp_path / "out", log=lambda m: None)
    short = sum(2 + i % 9 <= 4 for i in range(300))  # write_corpus: pair i has 2 + i % 9 words
    assert summary["corpus"]["dropped"] == {
        "over_max_words": 300 - short,
        "over_train_size": short - 40,
    }
    assert summary["splits"]["train"]["pairs_read"] == 40
    pairs = prepared_pairs(tmp_path / "out", "train")
    assert all(len(s.split()) <= 4 for s, _ in pairs)
    assert summary["splits"]["test"]["pairs_kept"] == 5  # dev and test as given, long or not


def test_the_same_language_on_both_sides_is_refused_with_a_reason(tmp_path):
    src, tgt = write_corpus(tmp_path)
    with pytest.raises(ConfigError, match=r"data\.src_lang and data\.tgt_lang are both 'en'"):
        small_config(src, tgt, src_lang="en", tgt_lang="en")


def test_no_training_pair_left_names_the_cause_not_the_vocabulary(tmp_path):
    src, tgt = tmp_path / "a.src", tmp_path / "a.tgt"
    src.write_text("alpha\n\nbeta\n" * 20)
    tgt.write_text("\nGAMMA\n\n" * 20)  # every pair has an empty side
    valid = _pair_files(tmp_path, "valid", ["alpha"])
    test = _pair_files(tmp_path, "test", ["beta"])
    config = small_config(
        src, tgt, valid_src=valid[0], valid_tgt=valid[1], test_src=test[0], test_tgt=test[1]
    )
    with pytest.raises(DataError, match=r"no training pairs left: 60 read, all dropped \(60 empty"):
        prepare(config, tmp_path / "out", log=lambda m: None)
