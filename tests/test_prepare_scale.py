"""Preparing at scale: the streamed training split writes exactly what a plain in-memory
pipeline makes, on any number of workers, from any kind of source; an interrupted prepare is
never used; memory does not grow with the corpus."""

from __future__ import annotations

import gzip
import importlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from helpers import WORDS, sentence, translate
from wtnmt.config import DataConfig
from wtnmt.data import Vocabulary, prepare
from wtnmt.data.clean import length_filter
from wtnmt.data.vocab import train_sentencepiece, vocabulary_sha256

QUIET = {"log": lambda _: None}
LONG = " ".join(WORDS * 30)


def corpus_pairs(n: int) -> list[tuple[str, str]]:
    """Pairs with something for every cleaning step: repeats, empty sides, over-long pairs,
    pairs over the length ratio, and words that max_words counts."""
    pairs = []
    for i in range(n):
        s = sentence(i, 2 + i % 9)
        pairs.append((s, translate(s)))
        if i % 17 == 0:
            pairs.append(pairs[i // 2])  # an earlier pair again
        if i % 29 == 0:
            pairs.append(("", "LEER") if i % 2 else (s, " "))
        if i % 41 == 0:
            pairs.append((LONG, translate(LONG)) if i % 2 else ("alpha", translate(LONG[:80])))
    return pairs


def write(directory: Path, pairs: list[tuple[str, str]], *, gz: bool = False) -> dict[str, str]:
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for side, name in ((0, "train_src"), (1, "train_tgt")):
        path = directory / f"train.{side}{'.gz' if gz else ''}"
        data = "".join(p[side] + "\n" for p in pairs).encode()
        path.write_bytes(gzip.compress(data) if gz else data)
        files[name] = str(path)
    for split, start in (("valid", 5000), ("test", 6000)):
        held = [sentence(start + i, 4) for i in range(6)]
        for side, f in (("src", lambda s: s), ("tgt", translate)):
            path = directory / f"{split}.{side}"
            path.write_text("".join(f(s) + "\n" for s in held), encoding="utf-8")
            files[f"{split}_{side}"] = str(path)
    return files


def config(files: dict[str, str], **changes) -> DataConfig:
    base = dict(
        corpus=None,
        vocab_size=60,
        src_lang="xx",
        tgt_lang="yy",
        max_tokens_per_side=120,
        max_length_ratio=2.5,
        spm_max_sentences=300,  # a sample of the sentences, as at WMT scale
    )
    return DataConfig(**{**base, **files, **changes})


def plain_pipeline(pairs, c: DataConfig, tmp: Path):  # type: ignore[no-untyped-def]
    """The in-memory preparation, step by step: what the stream must write."""
    if c.max_words is not None:
        pairs = [p for p in pairs if max(len(p[0].split()), len(p[1].split())) <= c.max_words]
    if c.train_size is not None and len(pairs) > c.train_size:
        keep = sorted(random.Random(c.split_seed).sample(range(len(pairs)), c.train_size))
        pairs = [pairs[i] for i in keep]
    kept, seen, dropped = [], set(), Counter()
    for pair in pairs:
        if not pair[0].strip() or not pair[1].strip():
            dropped["empty"] += 1
        elif c.drop_duplicates and pair in seen:
            dropped["duplicate"] += 1
        else:
            seen.add(pair)
            kept.append(pair)
    model = train_sentencepiece(
        (s for pair in kept for s in pair),
        tmp / "plain",
        vocab_size=c.vocab_size,
        model_type=c.spm_model_type,
        character_coverage=c.character_coverage,
        seed=c.spm_seed,
        max_sentences=c.spm_max_sentences,
    )
    vocab = Vocabulary(model)
    src, tgt = vocab.encode([p[0] for p in kept]), vocab.encode([p[1] for p in kept])
    keep, long = length_filter(
        list(map(len, src)),
        list(map(len, tgt)),
        max_tokens=c.max_tokens_per_side,
        max_ratio=c.max_length_ratio,
    )
    return model, [src[i] for i in keep], [tgt[i] for i in keep], dropped + long


def written(directory: Path, side: str) -> list[list[int]]:
    flat = np.load(directory / f"train.{side}.npy")
    offsets = np.load(directory / f"train.{side}.idx.npy")
    return [flat[a:b].tolist() for a, b in itertools.pairwise(offsets)]


@pytest.mark.parametrize(
    "changes", [{}, {"max_words": 6, "train_size": 150}, {"drop_duplicates": False}]
)
def test_streamed_training_ids_are_the_plain_pipelines(tmp_path, changes):
    pairs = corpus_pairs(400)
    c = config(write(tmp_path / "raw", pairs), **changes)
    summary = prepare(c, tmp_path / "out", **QUIET, workers=1)
    model, src, tgt, dropped = plain_pipeline(pairs, c, tmp_path)
    assert vocabulary_sha256(tmp_path / "out" / "spm.model") == vocabulary_sha256(model)
    assert written(tmp_path / "out", "src") == src
    assert written(tmp_path / "out", "tgt") == tgt
    train = summary["splits"]["train"]
    assert train["pairs_kept"] == len(src)
    assert train["tokens_src"] == sum(map(len, src))
    assert train["dropped"] == dict(sorted(dropped.items()))
    assert train["pairs_read"] - sum(dropped.values()) == train["pairs_kept"]
    if not changes:  # every cleaning step had something to do
        assert set(dropped) == {"empty", "duplicate", "too_long", "length_ratio"}


def test_workers_and_kinds_of_source_change_nothing_written(tmp_path):
    pairs = corpus_pairs(300)
    files = write(tmp_path / "raw", pairs)
    one = prepare(config(files), tmp_path / "one", **QUIET, workers=1)
    outputs = {"one": one}
    outputs["two"] = prepare(config(files), tmp_path / "two", **QUIET, workers=2)
    gz = write(tmp_path / "gz", pairs, gz=True)
    outputs["gz"] = prepare(config(gz), tmp_path / "gz-out", **QUIET, workers=2)
    tsv = tmp_path / "train.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    tsv_files = {k: v for k, v in files.items() if not k.startswith("train")}
    tsv_config = config({**tsv_files, "train_tsv": str(tsv)})
    outputs["tsv"] = prepare(tsv_config, tmp_path / "tsv", **QUIET)
    for name, summary in outputs.items():
        directory = tmp_path / {"one": "one", "two": "two", "gz": "gz-out", "tsv": "tsv"}[name]
        assert summary["splits"] == one["splits"], name
        for side in ("src", "tgt"):
            assert written(directory, side) == written(tmp_path / "one", side), name
        assert vocabulary_sha256(directory / "spm.model") == vocabulary_sha256(
            tmp_path / "one" / "spm.model"
        )


def test_an_interrupted_build_is_never_taken_for_the_directory(tmp_path, monkeypatch):
    module = importlib.import_module("wtnmt.data.prepare")  # wtnmt.data.prepare: the function

    files = write(tmp_path / "raw", corpus_pairs(200))
    out = tmp_path / "out"
    prepare(config(files), out, **QUIET, workers=1)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    changed = config(files, vocab_size=70)

    def stopped(*args, **kwargs):  # Ctrl-C while the training ids are being written
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "encode", stopped)
    with pytest.raises(KeyboardInterrupt):
        prepare(changed, out, **QUIET, workers=1)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the old build, whole
    assert not list(tmp_path.glob(".out.tmp-*"))
    said: list[str] = []
    prepare(config(files), out, log=said.append, workers=1)
    assert "up to date" in said[0]  # still the old options' build, complete
    monkeypatch.undo()
    assert prepare(changed, out, **QUIET, workers=1)["vocab_size"] == 70


def test_a_move_cut_short_by_a_kill_is_finished_by_the_next_prepare(tmp_path, monkeypatch):
    """Killed while it moves a rebuild in: the directory has some new files, the old others,
    no manifest, and the build beside it. It stays ours (never refused as a user's folder, never
    trained on) and the next prepare finishes the move, or, the build gone, builds again."""
    import shutil

    from wtnmt.data import prepared_dir

    files = write(tmp_path / "raw", corpus_pairs(200))
    out, clean = tmp_path / "out", tmp_path / "clean"
    changed = config(files, vocab_size=70)
    prepare(changed, clean, **QUIET, workers=1)

    def contents(directory: Path) -> dict[str, object]:  # (spm.model and the manifest name
        # the paths they were built at)
        return {
            p.name: vocabulary_sha256(p) if p.name == "spm.model" else p.read_bytes()
            for p in directory.iterdir()
            if p.name not in ("summary.json", "manifest.json")
        }

    expected = contents(clean)
    for attempt in ("finished", "rebuilt"):
        shutil.rmtree(out, ignore_errors=True)
        prepare(config(files), out, **QUIET, workers=1)
        replace, calls = os.replace, []

        def killed(a, b, calls=calls, replace=replace):  # type: ignore[no-untyped-def]
            calls.append(a)
            if len(calls) == 2:  # one new file moved in: SIGKILL, nothing cleaned up
                raise KeyboardInterrupt
            replace(a, b)

        monkeypatch.setattr(prepared_dir.os, "replace", killed)
        monkeypatch.setattr(shutil, "rmtree", lambda *a, **k: None)
        with pytest.raises(KeyboardInterrupt):
            prepare(changed, out, **QUIET, workers=1)
        monkeypatch.undo()
        assert not (out / "manifest.json").exists() and (out / prepared_dir.MOVING).is_file()
        builds = list(tmp_path.glob(".out.tmp-*"))
        assert len(builds) == 1
        if attempt == "rebuilt":
            shutil.rmtree(builds[0])
        said: list[str] = []
        prepare(changed, out, log=said.append, workers=1)
        assert contents(out) == expected, attempt
        assert (out / "manifest.json").is_file() and not (out / prepared_dir.MOVING).exists()
        assert ("finished moving" in said[0]) == (attempt == "finished")
        assert not list(tmp_path.glob(".out.tmp-*"))


@pytest.mark.slow
def test_a_killed_encoding_worker_ends_the_prepare_in_one_line(tmp_path):
    """kill -9 of a worker (as the OOM killer would): a multiprocessing.Pool waited forever
    for the chunk it took with it; the prepare must end, exit 2, one line, nothing kept."""
    files = write(tmp_path / "raw", corpus_pairs(6_000))
    flag = tmp_path / "killed"
    program = (
        "import os, signal, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import wtnmt.data.train_split as split\n"
        "encode = split.encode_chunk\n"
        "def dying(chunk):\n"
        "    try:\n"
        f"        os.close(os.open({str(flag)!r}, os.O_CREAT | os.O_EXCL))\n"
        "    except FileExistsError:\n"
        "        return encode(chunk)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "split.encode_chunk = dying\n"
        "from wtnmt.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    command = [
        sys.executable, "-c", program, "prepare", "--src", files["train_src"],
        "--tgt", files["train_tgt"], "--valid-src", files["valid_src"],
        "--valid-tgt", files["valid_tgt"], "--test-src", files["test_src"],
        "--test-tgt", files["test_tgt"], "--src-lang", "xx", "--tgt-lang", "yy",
        "--vocab-size", "60", "--workers", "2", "--out", str(tmp_path / "out"),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert flag.exists()  # a worker was killed
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "an encoding worker died" in last and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))


def _wait_for(path: Path, text: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.is_file() and text in path.read_text():
            return
        time.sleep(0.02)
    raise AssertionError(f"{text!r} never appeared in {path}: {path.read_text()}")


@pytest.mark.parametrize("how", ["stdin", "script without a main guard"])
def test_workers_spawned_beside_torch_do_not_run_the_main_program_again(tmp_path, how):
    """With torch loaded the encoding workers are spawned, and spawn runs the main module
    again in each: a program read from stdin cannot be, so the workers died at start and the
    pool started them forever (a hang); a script without a main guard prepared again in each
    worker. The workers are told no main module."""
    files = write(tmp_path / "raw", corpus_pairs(300))
    program = (
        "import sys, torch\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_prepare_scale import config\n"
        "from wtnmt.data import prepare\n"
        f"prepare(config({files!r}), {str(tmp_path / 'out')!r}, log=print, workers=2)\n"
        "print('prepared once')\n"
    )
    script = tmp_path / "prepare_script.py"
    script.write_text(program, encoding="utf-8")
    command = [sys.executable, "-"] if how == "stdin" else [sys.executable, str(script)]
    done = subprocess.run(
        command,
        input=program if how == "stdin" else None,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("prepared once") == 1 and done.stdout.count("reading") == 1
    assert (tmp_path / "out" / "summary.json").is_file()


@pytest.mark.slow
def test_a_killed_prepare_leaves_nothing_used_and_the_next_one_finishes(tmp_path):
    files = write(tmp_path / "raw", corpus_pairs(30_000))
    out, log = tmp_path / "out", tmp_path / "prepare.log"
    command = [
        sys.executable, "-m", "wtnmt.cli", "prepare", "--src", files["train_src"],
        "--tgt", files["train_tgt"], "--valid-src", files["valid_src"],
        "--valid-tgt", files["valid_tgt"], "--test-src", files["test_src"],
        "--test-tgt", files["test_tgt"], "--src-lang", "xx", "--tgt-lang", "yy",
        "--vocab-size", "60", "--workers", "2", "--out", str(out),
    ]  # fmt: skip
    with open(log, "w") as err:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
    _wait_for(log, "encoding")
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not out.exists()  # the build was in a directory of its own, never moved here
    assert list(tmp_path.glob(".out.tmp-*"))  # ... which a kill leaves behind
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    assert "prepared data" in done.stdout
    assert not list(tmp_path.glob(".out.tmp-*"))  # the next prepare removed it
    summary = json.loads((out / "summary.json").read_text())
    assert summary["splits"]["train"]["pairs_kept"] > 20_000


def _peak_rss_gb(command: list[str]) -> float:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = process.stderr.read().decode() if process.stderr else ""
    _, status, usage = os.wait4(process.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, err
    return usage.ru_maxrss / 2**20


@pytest.mark.slow
def test_memory_of_prepare_does_not_grow_with_the_corpus(tmp_path):
    """4× the pairs, about the same peak: the vocabulary's sample is fixed (--vocab-sample),
    and all else streams. Holding every pair and its ids, as before, cost about 3 kB a pair
    of this length: 450 MB more at 200,000 pairs than at 50,000."""
    held = write(tmp_path / "held", [])  # dev and test files: training pairs stream
    given = [f"--{k.replace('_', '-')}={v}" for k, v in held.items() if not k.startswith("train")]
    peaks = {}
    for n in (50_000, 200_000):
        directory = tmp_path / str(n)
        directory.mkdir()
        src, tgt = directory / "train.src", directory / "train.tgt"
        with open(src, "w") as s, open(tgt, "w") as t:
            for i in range(n):
                line = sentence(i, 20 + i % 13)
                s.write(line + "\n")
                t.write(translate(line) + "\n")
        command = [
            sys.executable, "-m", "wtnmt.cli", "prepare", "--src", str(src), "--tgt", str(tgt),
            "--src-lang", "xx", "--tgt-lang", "yy", "--vocab-size", "60",
            "--vocab-sample", "20000", "--workers", "1", "--out", str(directory / "out"), *given,
        ]  # fmt: skip
        peaks[n] = _peak_rss_gb(command)
    assert peaks[200_000] - peaks[50_000] < 0.05, peaks
