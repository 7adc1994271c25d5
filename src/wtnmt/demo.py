"""`wtnmt demo`: the main job in one command, on the real Tatoeba corpus.

Prepares tatoeba-deu-eng English→German (every pair of up to 12 words, about 160,000, in a
seeded split by unique English sentence), trains the `weighted-demo` Weighted Transformer for a
wall-clock budget, evaluates the test split with beam search and sacreBLEU, and shows what the
branches learned.

The weights it evaluates are chosen on the dev split, never the test split: the checkpoint
with the best validation loss, or the average of the last ``AVERAGE`` checkpoints (saved every
``SAVE_EVERY`` updates; fairseq's average_checkpoints, `wtnmt average`), whichever translates
the dev split with the higher BLEU.
"""

from __future__ import annotations

import json
import resource
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from wtnmt.analysis import branch_weight_rows, plot_branch_weights
from wtnmt.config import load_config
from wtnmt.data.corpora import CORPORA
from wtnmt.data.io import decode_lines, read_bytes
from wtnmt.decode.evaluate import score_corpus
from wtnmt.decode.translator import Translator
from wtnmt.errors import CheckpointError
from wtnmt.model import branch_weight_table
from wtnmt.rundir.average import average_run
from wtnmt.runtime import cpu_description, tune_cpu_allocator
from wtnmt.train import Trainer

PRESET = "weighted-demo"  # the literature's small shape: a third of weighted-small's cost
AVERAGE = 5  # checkpoints averaged
SAVE_EVERY = 50  # updates between checkpoints: the average spans the last 250
# the warm-up as a fraction of the updates that fit in the budget, measured as the demo runs:
# from about 1,500 updates in 12 minutes on a slow 2-core CPU to several thousand with native
# bf16; on a slower one the warm-up shrinks with them instead of outlasting the run (a tenth:
# chosen on dev with the rest of the recipe, configs/weighted-demo.yaml)
WARMUP_FRACTION = 0.1
ATTRIBUTION = CORPORA["tatoeba-deu-eng"].attribution


def run_demo(
    minutes: float,
    out: str | Path,
    *,
    resume: bool = False,
    threads: int = 2,
    overrides: list[str] | tuple[str, ...] = (),
) -> dict[str, Any]:
    start = time.perf_counter()
    out = Path(out)
    torch.set_num_threads(threads)
    tune_cpu_allocator()
    config = load_config(
        PRESET,
        [
            f"train.max_time={minutes * 60:g}",
            "train.max_steps=null",
            f"train.threads={threads}",
            f"train.save_every={SAVE_EVERY}",
            f"train.keep_checkpoints={AVERAGE}",
            f"train.warmup_fraction={WARMUP_FRACTION}",
            *overrides,
        ],
    )
    say = lambda text="": print(text, flush=True)  # noqa: E731
    say(
        f"wtnmt demo: {PRESET} on Tatoeba en→de, {minutes:g} minutes of training on "
        f"{threads} thread{'s' if threads != 1 else ''} → {out}"
    )
    say(f"data: {ATTRIBUTION}")
    trainer = Trainer(config, out, resume=resume)
    try:
        state = trainer.run()
    except KeyboardInterrupt:
        say(
            f"\ninterrupted: the run directory {out} holds a checkpoint. Resume with:\n"
            f"  wtnmt demo --out {out} --minutes {minutes:g} --resume"
        )
        raise
    trained = time.perf_counter() - start
    schedule = _schedule(trainer, minutes, say)
    chosen, dev = _choose_weights(out, trainer.data_dir, config.decode.beam, say)
    test = _translate_test(chosen, trainer.data_dir, out, config.decode.beam, say)
    translator = test.pop("translator")
    (out / "ATTRIBUTION.txt").write_text(
        f"{ATTRIBUTION}\nThis model was trained on that data.\n", encoding="utf-8"
    )
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    scores = test["scores"]
    results = {
        "bleu": scores["bleu"],
        "chrf": scores["chrf"],
        "signature": scores["signature"],
        "chrf_signature": scores["chrf_signature"],
        "seconds": round(seconds, 1),
        "train_seconds": round(state.elapsed, 1),
        "steps": state.step,
        "epochs": state.epoch,
        "n_test": len(test["src"]),
        "peak_rss_gib": round(peak, 2),
        "weights": str(chosen),
        "dev_bleu": dev,
        "branch_weights": branch_weight_table(translator.model),
        "preset": PRESET,
        "schedule": schedule,
        "attribution": ATTRIBUTION,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2, ensure_ascii=False))
    _print_results(results, test, out, say)
    say(
        f"\n{state.step} updates in {state.elapsed / 60:.1f} min of training "
        f"({trained / 60:.1f} min with data and validation); {seconds / 60:.1f} min in all; "
        f"peak memory {peak:.2f} GiB"
    )
    say(f"results: {out / 'results.json'}")
    say(f"translate with:\n  echo 'How are you?' | {_command()} translate {chosen}")
    return results


def _schedule(trainer: Trainer, minutes: float, say: Callable[[str], None]) -> dict[str, Any]:
    """What the demo chose and why: the CPU, the precision, the updates that fit and the
    warm-ups fitted to them."""
    state, cpu, tc = trainer.state, cpu_description(), trainer.tc
    decay = {"linear": "then linear decay to 0", "inverse_sqrt": "then inverse square root"}
    say(
        f"\nschedule: {cpu['model']} ({', '.join(cpu['flags']) or 'no AVX2'}; ATen "
        f"{cpu['aten_capability']}), {trainer.precision}: about {state.predicted_steps} updates "
        f"fit in {minutes:g} minutes, so warm-up {state.warmup} "
        f"(train.warmup_fraction {tc.warmup_fraction}) {decay[tc.lr_schedule]}, κ/α warm-up "
        f"{state.branch_warmup}; batches of {tc.max_tokens:,} tokens; {state.step} made"
    )
    return {
        "cpu": cpu,
        "precision": trainer.precision,
        "predicted_updates": state.predicted_steps,
        "warmup": state.warmup,
        "lr_schedule": tc.lr_schedule,
        "branch_warmup": state.branch_warmup,
        "max_tokens": tc.max_tokens,
    }


def _translate_test(
    chosen: Path, data_dir: Path, out: Path, beam: int, say: Callable[[str], None]
) -> dict[str, Any]:
    """The test split translated with the chosen weights, and its sacreBLEU scores."""
    translator = Translator.load(chosen)
    # lines end at "\n" only: str.splitlines would also split inside a sentence (U+2028 …)
    src = decode_lines(read_bytes(data_dir / "test.en"), "test.en")
    refs = decode_lines(read_bytes(data_dir / "test.de"), "test.de")
    say(f"\ntranslating the {len(src):,} test sentences with beam {beam} ({chosen}) …")
    hyps = translator.translate(src, beam=beam)
    (out / "test.hyp.de").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    return {
        "translator": translator,
        "src": src,
        "refs": refs,
        "hyps": hyps,
        "scores": score_corpus(hyps, refs),
    }


def _print_results(
    results: dict[str, Any], test: dict[str, Any], out: Path, say: Callable[[str], None]
) -> None:
    """The scores with their signatures, ten sample translations, the learned κ/α and the
    path of their figure."""
    src, refs, hyps, scores = test["src"], test["refs"], test["hyps"], test["scores"]
    say(f"\nsacreBLEU on the Tatoeba en→de test split ({len(src):,} sentences):")
    say(f"  BLEU {scores['bleu']:.1f}   {scores['signature']}")
    say(f"  chrF {scores['chrf']:.1f}   {scores['chrf_signature']}")
    say("\nsample translations (source | reference | wtnmt):")
    for i in range(0, len(src), max(len(src) // 10, 1))[:10]:
        say(f"  {src[i]}\n    ref:   {refs[i]}\n    wtnmt: {hyps[i]}")
    say("\nlearned branch weights (κ concatenation, α addition; on the simplex):")
    for row in branch_weight_rows(results["branch_weights"]):
        say(row)
    figure = plot_branch_weights(out / "metrics.jsonl", out / "branch_weights.png")
    if figure is not None:
        say(f"\nκ/α over training: {figure}")


def _choose_weights(
    out: Path, data_dir: Path, beam: int, say: Callable[[str], None]
) -> tuple[Path, dict[str, float]]:
    """The run's best checkpoint (by validation loss) or the average of its last checkpoints
    (written to ``out/averaged``, a run directory of its own), by BLEU on the dev split."""
    src = decode_lines(read_bytes(data_dir / "valid.en"), "valid.en")
    refs = decode_lines(read_bytes(data_dir / "valid.de"), "valid.de")
    candidates = {"best": out}
    averaged = out / "averaged"
    if (averaged / "averaged.json").is_file():  # made by an earlier demo of this run: redo
        shutil.rmtree(averaged)
    try:
        average_run(out, averaged, last=AVERAGE)  # refuses a folder there that is not ours
        candidates["averaged"] = averaged
    except CheckpointError as error:  # too short a run to have AVERAGE checkpoints
        say(f"\nno average of the last {AVERAGE} checkpoints: {error}")
    dev = {}
    for name, path in candidates.items():
        hyps = Translator.load(path).translate(src, beam=beam)
        dev[name] = score_corpus(hyps, refs)["bleu"]
    best = max(dev, key=lambda name: dev[name])
    say(
        "\ndev BLEU: "
        + ", ".join(f"{name} {bleu:.1f}" for name, bleu in dev.items())
        + f" (best checkpoint by validation loss; average of the last {AVERAGE} checkpoints, "
        f"{SAVE_EVERY} updates apart): the test split is translated with the {best}"
    )
    return candidates[best], dev


def _command() -> str:
    """How the user can run `wtnmt` from here: by name when it is on PATH, else by path."""
    if shutil.which("wtnmt"):
        return "wtnmt"
    script = Path(sys.executable).parent / "wtnmt"
    return str(script) if script.is_file() else f"{sys.executable} -m wtnmt.cli"


def main_demo(args) -> int:  # type: ignore[no-untyped-def]
    try:
        run_demo(
            args.minutes, args.out, resume=args.resume, threads=args.threads, overrides=args.set
        )
    except KeyboardInterrupt:
        return 130
    return 0


__all__ = ["main_demo", "run_demo"]
