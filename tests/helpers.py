"""Tiny synthetic corpora and configs for tests that train."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from pathlib import Path

from wtnmt.config import config_from_dict, config_to_dict, load_config

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def sentence(i: int, n: int) -> str:
    rng = random.Random(i)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def translate(text: str) -> str:
    """The corpus's 'translation': a fixed function of the source (checkable by content)."""
    return " ".join(w.upper()[::-1] for w in text.split())


def write_pairs(directory: Path, name: str, sources: list[str]) -> tuple[Path, Path]:
    src, tgt = directory / f"{name}.src", directory / f"{name}.tgt"
    src.write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    tgt.write_text("".join(translate(s) + "\n" for s in sources), encoding="utf-8")
    return src, tgt


def prepare_args(src: object, tgt: object, out: Path, *more: str) -> list[str]:
    """`wtnmt prepare` of the xx→yy corpus ``src``/``tgt`` into ``out`` with 60 pieces,
    then ``more`` options."""
    return [
        "prepare",
        "--src", str(src), "--tgt", str(tgt),
        "--src-lang", "xx", "--tgt-lang", "yy",
        "--vocab-size", "60",
        "--out", str(out),
        *more,
    ]  # fmt: skip


def tiny_run_config(tmp: Path, *, n_train: int = 200, **sections):  # type: ignore[no-untyped-def]
    """A weighted-tiny run on a synthetic corpus in ``tmp``; ``sections`` override keys, e.g.
    ``train={"max_steps": 5}``."""
    train = write_pairs(tmp, "train", [sentence(i, 2 + i % 5) for i in range(n_train)])
    valid = write_pairs(tmp, "valid", [sentence(10_000 + i, 3) for i in range(8)])
    test = write_pairs(tmp, "test", [sentence(20_000 + i, 3) for i in range(8)])
    values = config_to_dict(load_config("weighted-tiny"))
    values["data"].update(
        corpus=None,
        train_src=str(train[0]),
        train_tgt=str(train[1]),
        valid_src=str(valid[0]),
        valid_tgt=str(valid[1]),
        test_src=str(test[0]),
        test_tgt=str(test[1]),
        src_lang="xx",
        tgt_lang="yy",
        vocab_size=60,
        prepared_dir=str(tmp / "prepared"),
        max_words=None,
        train_size=None,
    )
    values["model"].update(dropout=0.0, attention_dropout=0.0)
    values["train"].update(
        max_steps=6, log_every=2, valid_every=3, max_tokens=300, freeze_branch_weights=0, threads=1
    )
    # float32 unless a test asks: "auto" would pick bf16 on some CPUs and not on others
    values["train"].update(precision="fp32")
    for section, changes in sections.items():
        values[section].update(changes)
    return config_from_dict(values)


def overfit_run_config(tmp: Path, n_train: int, **train):  # type: ignore[no-untyped-def]
    """A tiny Weighted Transformer (D=64) given 200 updates on ``n_train`` pairs: enough to
    learn them by heart. ``train`` overrides keys of the train section."""
    return tiny_run_config(
        tmp,
        n_train=n_train,
        model={"d_model": 64, "d_ff": 256, "heads": 4},
        train={
            "max_steps": 200,
            "warmup": 40,
            "branch_warmup": 10,
            "label_smoothing": 0.0,
            "max_tokens": 2000,
            "valid_every": 1000,
            "save_every": 1000,
            "log_every": 50,
            "lr_scale": 0.5,
            **train,
        },
    )


def train_tiny(tmp: Path, **train) -> Path:  # type: ignore[no-untyped-def]
    """A weighted-tiny run of a few steps in ``tmp/run`` (``train`` overrides keys of the
    train section), for tests that need any trained run."""
    from wtnmt.train import Trainer

    config = tiny_run_config(tmp, train={"max_steps": 4, "valid_every": 4, **train})
    Trainer(config, tmp / "run", log_to_stderr=False).run()
    return tmp / "run"


def translate_job(tmp: Path) -> tuple[list[str], Path]:
    """A tiny trained run (train_tiny) and a one-sentence input: ``wtnmt translate``'s
    arguments for it, and the output file they name."""
    run = train_tiny(tmp)
    source, out = tmp / "in.txt", tmp / "out.txt"
    source.write_text(sentence(1, 4) + "\n")
    return ["translate", str(run), "-i", str(source), "-o", str(out)], out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_processes(code: str, *, timeout: float = 240) -> None:
    """Run ``code`` as ranks 0 and 1 of a gloo process group on this machine; both are
    killed if they outlast ``timeout`` seconds (a rank left waiting for the other)."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env={
                **os.environ,
                "RANK": str(r),
                "WORLD_SIZE": "2",
                "LOCAL_RANK": str(r),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            },
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    try:
        for p in procs:
            _, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, err[-2000:]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise AssertionError(f"the two ranks did not finish in {timeout:g} s") from None


def scored_tiny_runs(tmp: Path) -> list[Path]:
    """Two tiny runs in ``tmp``: a Weighted Transformer and a Transformer, each scored on its
    test split as the experiment runner scores it (in its scores.json and eval/)."""
    import json

    from wtnmt.analysis.scoring import score_run
    from wtnmt.experiment.job import training_summary
    from wtnmt.train import Trainer

    out = []
    for name, attention in (("weighted-s1", "branched"), ("transformer-s1", "multihead")):
        config = tiny_run_config(
            tmp,
            model={"attention": attention},
            train={"max_steps": 12, "valid_every": 4, "log_every": 2, "freeze_branch_weights": 4},
        )
        Trainer(config, tmp / name, log_to_stderr=False).run()
        out.append(tmp / name)
    for run in out:
        scores = {"run": run.name, **training_summary(run), "test": score_run(run)}
        (run / "scores.json").write_text(json.dumps(scores))
    return out


def one_line(capsys, command: str, *parts: str) -> str:  # type: ignore[no-untyped-def]
    """What ``wtnmt COMMAND`` wrote on stderr: one line, an error naming every one of ``parts``."""
    err = capsys.readouterr().err
    assert err.startswith(f"wtnmt {command}: error: ") and err.count("\n") == 1, err
    assert all(part in err for part in parts), err
    return err
