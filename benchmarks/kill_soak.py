"""Kill `wtnmt train` with SIGKILL at random moments and resume it, many times over.

Every resume must succeed, and the weights the run ends with must equal those of a run that
was never interrupted, bit for bit. A tiny Weighted Transformer (dropout on, so that the
random state matters) trains on a synthetic corpus made here, with a checkpoint at every
step and a validation every 3 steps, so that kills land during updates, while checkpoints
are written and during validation. Then the same under `torchrun --nproc_per_node 2` (gloo),
killing the whole process group.

    .venv/bin/python benchmarks/kill_soak.py                         # 30 kills, 5 under DDP
    .venv/bin/python benchmarks/kill_soak.py --kills 5 --ddp-kills 1  # a quick look

Prints what each life did and the counts; exits 1 if a resume failed or the weights differ.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def write_corpus(directory: Path) -> dict[str, str]:
    """Train/dev/test files whose 'translation' is a fixed function of the source."""
    rng = random.Random(0)
    files = {}
    for split, n in (("train", 400), ("valid", 8), ("test", 8)):
        src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7))) for _ in range(n)]
        tgt = [" ".join(w.upper()[::-1] for w in s.split()) for s in src]
        for side, lines in (("src", src), ("tgt", tgt)):
            path = directory / f"{split}.{side}"
            path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
            files[f"{split}_{side}"] = str(path)
    return files


def write_config(directory: Path, files: dict[str, str], steps: int) -> Path:
    from wtnmt.config import config_to_dict, load_config

    values = config_to_dict(load_config("weighted-tiny"))
    values["data"].update(
        corpus=None, src_lang="xx", tgt_lang="yy", vocab_size=60, max_words=None,
        train_size=None, prepared_dir=str(directory / "prepared"), **files,
    )  # fmt: skip
    values["model"].update(dropout=0.1)
    values["train"].update(
        max_steps=steps, max_time=None, max_epochs=None, save_every=1, valid_every=VALID_EVERY,
        log_every=1, keep_checkpoints=3, threads=1, max_tokens=300, freeze_branch_weights=5,
    )  # fmt: skip
    path = directory / f"soak-{steps}.yaml"
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def command(config: Path, out: Path, ddp: bool, resume: bool) -> list[str]:
    train = ["-m", "wtnmt.cli", "train", str(config), "--out", str(out)]
    if resume:
        train.append("--resume")
    if ddp:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2", *train]  # fmt: skip
    return [sys.executable, *train]


def has_checkpoint(run: Path) -> bool:
    return any((run / "checkpoints").glob("*.state.pt"))


def training_started(run: Path, lives: int) -> bool:
    """Whether this life has logged an update (one 'step' line more than lives before)."""
    log = run / "train.log"
    return log.is_file() and log.read_text().count("] step ") >= lives


def soak(config: Path, run: Path, *, kills: int, ddp: bool, window: float) -> dict[str, int]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = {"kills": 0, "resumes": 0, "failed": 0, "lives": 0}
    relaunches = 2
    while True:
        resume = has_checkpoint(run)
        done["resumes"] += resume
        done["lives"] += 1
        steps_before = (
            (run / "train.log").read_text().count("] step ") if (run / "train.log").is_file() else 0
        )
        proc = subprocess.Popen(
            command(config, run, ddp, resume), env=env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        if done["kills"] < kills:
            deadline = time.monotonic() + 120
            while not training_started(run, steps_before + 1) and proc.poll() is None:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            time.sleep(random.uniform(0.0, window))
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                done["kills"] += 1
                moment = kill_moment(run)
                done[moment] = done.get(moment, 0) + 1
                print(f"  life {done['lives']}: killed {moment} (step {latest_step(run)})")
                continue
        _, err = proc.communicate()
        launch = launch_failure(err) if proc.returncode != 0 and ddp else None
        if launch and relaunches and not training_started(run, steps_before + 1):
            relaunches -= 1  # the launcher's, before the toolkit ran a step: not a resume's
            print(f"  life {done['lives']}: torchrun could not start ({launch}); launched again",
                  flush=True)  # fmt: skip
            done["lives"] -= 1
            done["resumes"] -= resume
            continue
        if proc.returncode != 0:
            done["failed"] += 1
            print(f"  life {done['lives']}: FAILED with exit code {proc.returncode}:", flush=True)
            print(textwrap.indent(error_lines(err), "    "), flush=True)
            return done
        print(f"  life {done['lives']}: finished (step {latest_step(run)})", flush=True)
        return done


def error_lines(err: str, keep: int = 25) -> str:
    """The lines of a failed life's stderr worth reading: torchrun frames the error of a
    worker between rules of '=' and repeats it, so the rules go and the tail is kept."""
    lines = [line for line in err.splitlines() if line.strip() and set(line.strip()) != {"="}]
    return "\n".join(lines[-keep:]) or "(nothing on stderr)"


# What torchrun's rendezvous prints when a port it picked was taken in between, or a
# connection to its store broke: the machine's, not a failed resume (a worker that did start
# training and then failed is always counted).
LAUNCH_ERRORS = ("Address already in use", "EADDRINUSE", "RendezvousConnectionError",
                 "RendezvousTimeoutError", "Connection reset by peer")  # fmt: skip


def launch_failure(err: str) -> str | None:
    return next((e for e in LAUNCH_ERRORS if e in err), None)


VALID_EVERY = 3
MOMENTS = ("during an update", "while writing a checkpoint", "during validation")


def kill_moment(run: Path) -> str:
    """Where a kill landed: a checkpoint half-written (its temporary file is left), a
    validation under way (the last log line is the step it validates at, and its result is
    not logged yet), or else an update (or the start-up around it)."""
    checkpoints = run / "checkpoints"
    if checkpoints.is_dir() and any(checkpoints.glob(".*.tmp")):
        return MOMENTS[1]
    lines = (run / "train.log").read_text().splitlines() if (run / "train.log").is_file() else []
    last = lines[-1] if lines else ""
    if "] step " in last and int(last.split("] step ")[1].split()[0]) % VALID_EVERY == 0:
        return MOMENTS[2]
    return MOMENTS[0]


def moments(done: dict[str, int]) -> str:
    return ", ".join(f"{done.get(m, 0)} {m}" for m in MOMENTS)


def latest_step(run: Path) -> int:
    states = (
        sorted((run / "checkpoints").glob("step_*.state.pt"))
        if (run / "checkpoints").is_dir()
        else []
    )
    return int(states[-1].name[5:12]) if states else 0


def final_weights(run: Path, steps: int) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"step_{steps:07d}.safetensors"))


def compare(a: Path, b: Path, steps: int) -> bool:
    x, y = final_weights(a, steps), final_weights(b, steps)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--ddp-kills", type=int, default=5)
    parser.add_argument("--steps", type=int, default=400, help="updates of the single run")
    parser.add_argument("--ddp-steps", type=int, default=120)
    parser.add_argument("--window", type=float, default=0.8, help="seconds after training starts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, help="default: a temporary directory")
    args = parser.parse_args()
    random.seed(args.seed)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="wtnmt-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    files = write_corpus(work)
    ok = True
    for ddp, kills, steps in (
        (False, args.kills, args.steps),
        (True, args.ddp_kills, args.ddp_steps),
    ):
        if kills == 0:
            continue
        name = "torchrun, 2 processes (gloo)" if ddp else "1 process"
        config = write_config(work, files, steps)
        print(f"{name}: {steps} updates, {kills} kills", flush=True)
        tag = "ddp" if ddp else "single"
        start = time.monotonic()
        done = soak(config, work / f"{tag}-killed", kills=kills, ddp=ddp, window=args.window)
        reference = soak(config, work / f"{tag}-straight", kills=0, ddp=ddp, window=0)
        same = (
            not done["failed"]
            and not reference["failed"]
            and compare(work / f"{tag}-killed", work / f"{tag}-straight", steps)
        )
        ok = ok and same
        print(
            f"{name}: {done['kills']} kills ({moments(done)}), {done['resumes']} resumes, "
            f"{done['failed']} failed; final weights "
            f"{'EQUAL' if same else 'DIFFERENT'} to the uninterrupted run's, bit for bit "
            f"({time.monotonic() - start:.0f} s)",
            flush=True,
        )
    print(f"work directory: {work}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
