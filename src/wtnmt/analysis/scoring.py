"""Scoring a run's weights on a split of its corpus, and the cross-run measures that need the
weights: branch weights replaced at test time (paper Table 3), a checkpoint at a given step,
the paired bootstrap between two runs' translations. Results are cached as JSON under the
run's ``eval/`` so that analyzing again decodes nothing new."""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU

from wtnmt import stored
from wtnmt.analysis.metrics import mean_sd
from wtnmt.analysis.runs import Run
from wtnmt.decode.evaluate import moses_bleu


def split_pairs(run_dir: Path, split: str) -> tuple[list[str], list[str]]:
    """The sources and references of the run's corpus split, as `prepare` split it."""
    from wtnmt.config import load_config
    from wtnmt.data.prepare import raw_split

    pairs = raw_split(load_config(run_dir / "config.yaml").data, split)
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _cached(path: Path, weights: Path, compute) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """The result kept in ``path`` if it was computed from these weights (a resumed run has
    new ones; a clone of committed results has none, and keeps what was computed), else
    ``compute()``, kept there."""
    from wtnmt.data.corpora import sha256_of

    digest = sha256_of(weights) if weights.is_file() else None
    if path.is_file():
        kept = json.loads(path.read_text(encoding="utf-8"))
        if digest is None or kept.get("weights_sha256") == digest:
            return kept
    result = {**compute(), "weights_sha256": digest}
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def score_name(
    *, split: str, beam: int | None, weights: str, branch_weights: str = "learned", seed: int = 0
) -> str:
    """The name of a score's files in the run's ``eval/`` (``.json`` and ``.hyp``)."""
    stem = "" if weights == "model.safetensors" else Path(weights).name.split(".")[0] + "."
    stem += "" if branch_weights == "learned" else f"{branch_weights}{seed}."
    return f"{stem}{split}.beam{beam or 'default'}"


def kept_score(run_dir: Path, **how: Any) -> Path:
    """The file in the run's ``eval/`` that keeps (or will keep) the score ``how`` asks for
    (``score_name``'s arguments), named by the beam it decodes with: the run's own where
    ``how`` names none. One kept under the name such a score had before (``beamdefault``) is
    found too."""
    from wtnmt.config import load_config

    how = {"split": "test", "weights": "model.safetensors", **how}
    own = load_config(run_dir / "config.yaml").decode.beam
    beam = how.get("beam") or own
    path = run_dir / "eval" / f"{score_name(**{**how, 'beam': beam})}.json"
    if not path.is_file() and beam == own:
        before = run_dir / "eval" / f"{score_name(**{**how, 'beam': None})}.json"
        return before if before.is_file() else path
    return path


def has_score(run_dir: Path, **how: Any) -> bool:
    """Whether ``score_run(run_dir, **how)`` can answer: its weights or its kept result."""
    weights = how.get("weights", "model.safetensors")
    return (run_dir / weights).is_file() or kept_score(run_dir, **how).is_file()


def _record(
    scores: dict[str, Any],
    *,
    split: str,
    beam: int,
    weights: str,
    branch_weights: str,
    seed: int,
    hypotheses: str,
    seconds: float,
) -> dict[str, Any]:
    """A kept score: the scores, then what was decoded and how (``score_run``'s arguments;
    the seed only of a random draw), the hypotheses' file and the seconds decoding took."""
    return {
        **scores, "split": split, "beam": beam, "weights": weights,
        "branch_weights": branch_weights, "seed": seed if branch_weights == "random" else None,
        "hypotheses": hypotheses, "decode_seconds": round(seconds, 1),
    }  # fmt: skip


def score_run(
    run_dir: str | Path,
    *,
    split: str = "test",
    beam: int | None = None,
    weights: str = "model.safetensors",
    branch_weights: str = "learned",
    seed: int = 0,
) -> dict[str, Any]:
    """Translate the split with ``weights`` (κ, α ``learned`` or replaced by ``uniform`` or
    ``random`` ones of ``seed``) and score it: sacreBLEU BLEU and chrF, lowercased BLEU, and
    BLEU on lowercased Moses tokens (``moses_bleu``).
    The hypotheses and scores are kept in ``eval/`` and read back the next time."""
    from wtnmt.decode.evaluate import score_corpus
    from wtnmt.decode.translator import Translator
    from wtnmt.model import branch_weights_overridden

    run_dir = Path(run_dir)
    path = kept_score(
        run_dir, split=split, beam=beam, weights=weights, branch_weights=branch_weights, seed=seed
    )
    name = path.name.removesuffix(".json")

    def compute() -> dict[str, Any]:
        translator = Translator.load(run_dir, weights=weights)
        src, refs = split_pairs(run_dir, split)
        how = "" if branch_weights == "learned" else f", κ, α {branch_weights}"
        print(
            f"decoding {run_dir}'s {split} split ({len(src):,} sentences, beam "
            f"{beam or translator.config.decode.beam}, {weights}{how})",
            file=sys.stderr,
            flush=True,
        )
        start = time.perf_counter()
        with branch_weights_overridden(translator.model, branch_weights, seed=seed):  # type: ignore[arg-type]
            hyps = translator.translate(src, beam=beam)
        seconds = time.perf_counter() - start
        print(
            f"  decoded in {seconds:.0f} s ({len(src) / max(seconds, 1e-9):.1f} sentences/s)",
            file=sys.stderr,
            flush=True,
        )
        (run_dir / "eval").mkdir(exist_ok=True)
        (run_dir / "eval" / f"{name}.hyp").write_text(
            "".join(h + "\n" for h in hyps), encoding="utf-8"
        )
        return _record(
            score_corpus(hyps, refs, translator.config.data.tgt_lang),
            split=split, beam=beam or translator.config.decode.beam, weights=weights,
            branch_weights=branch_weights, seed=seed, hypotheses=f"eval/{name}.hyp",
            seconds=seconds,
        )  # fmt: skip

    result = _cached(path, run_dir / weights, compute)
    if "bleu_moses" not in result and stored.exists(run_dir / result["hypotheses"]):
        # kept from before this score existed: its hypotheses are scored again, not decoded
        from wtnmt.config import load_config

        lang = load_config(run_dir / "config.yaml").data.tgt_lang
        refs = split_pairs(run_dir, split)[1]
        result = {**result, **moses_bleu(read_hypotheses(run_dir, result), refs, lang)}
        path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return as_asked(run_dir, result)  # type: ignore[return-value]


def keep_decoding(
    run_dir: Path,
    scores: dict[str, Any],
    *,
    split: str,
    beam: int,
    weights: str,
    branch_weights: str,
    seed: int,
    hypotheses: str,
    seconds: float,
) -> Path:
    """Keep a decoding of the run's ``split`` made elsewhere (`wtnmt evaluate`'s, decoded as
    ``score_run`` decodes) as the score ``score_run`` reads back for these weights, so that
    analyzing after evaluating decodes it no more. ``scores``: ``score_corpus``'s, given the
    target language; ``hypotheses``: their file in the run."""
    from wtnmt.data.corpora import sha256_of
    from wtnmt.safe_files import atomic_write

    how = {"split": split, "beam": beam, "weights": weights}
    how |= {"branch_weights": branch_weights, "seed": seed}
    path = kept_score(run_dir, **how)
    record = _record(scores, **how, hypotheses=hypotheses, seconds=seconds)
    record["weights_sha256"] = sha256_of(run_dir / weights)
    atomic_write(path, (json.dumps(record, indent=2) + "\n").encode())
    return path


_TOKENIZE: ContextVar[str] = ContextVar("tokenize", default="13a")


@contextmanager
def scored_with(tokenize: str) -> Iterator[None]:
    """Within it, every BLEU this module gives is of sacreBLEU's ``tokenize`` (analyze
    --tokenize): the kept hypotheses scored again where they were scored otherwise."""
    token = _TOKENIZE.set(tokenize)
    try:
        yield
    finally:
        _TOKENIZE.reset(token)


def current_tokenize() -> str:
    return _TOKENIZE.get()


def as_asked(run_dir: Path, scores: dict[str, Any] | None) -> dict[str, Any] | None:
    """``scores`` with BLEU of the tokenization asked for (``scored_with``), from the
    hypotheses they keep and the run's own references."""
    tokenize = _TOKENIZE.get()
    if scores is None or scores.get("tokenize", "13a") == tokenize or "hypotheses" not in scores:
        return scores
    hyps = read_hypotheses(run_dir, scores)
    refs = _references(run_dir.resolve(), scores.get("split", "test"))
    bleu = BLEU(tokenize=tokenize)
    score = bleu.corpus_score(hyps, [refs])
    return {
        **scores,
        "bleu": round(score.score, 2),
        "signature": str(bleu.get_signature()),
        "tokenize": tokenize,
    }


@functools.lru_cache(maxsize=32)
def _references(run_dir: Path, split: str) -> list[str]:
    """A run's references of ``split``, read once (every score of the run rescored with
    another tokenization needs them; reading them means reading its corpus)."""
    return split_pairs(run_dir, split)[1]


def kept_or_decoded(run_dir: Path, decode: bool, **how: Any) -> dict[str, Any] | None:
    """The score ``how`` asks for (``score_run``'s arguments): decoded (or read back) where
    ``decode`` and the weights are here, else the one kept in ``eval/``, else None."""
    if decode and (run_dir / how.get("weights", "model.safetensors")).is_file():
        return score_run(run_dir, **how)
    kept = kept_score(run_dir, **how)
    return (
        as_asked(run_dir, json.loads(kept.read_text(encoding="utf-8"))) if kept.is_file() else None
    )


def with_test_score(run: Run, decode: bool) -> Run:
    """The run with its test scores: its own (a grid's, under ``"test"`` in its
    scores.json), or, for a run trained by hand, its best weights scored on its test split
    now (``decode``) or kept in ``eval/`` by an earlier analysis; the run as it is where
    neither can be had. Its scores.json is not written."""
    import dataclasses

    if (run.scores or {}).get("test") is not None:
        test = as_asked(run.path, run.scores["test"])  # type: ignore[index]
        return dataclasses.replace(run, scores={**run.scores, "test": test})  # type: ignore[dict-item]
    found = kept_or_decoded(run.path, decode, split="test", weights="model.safetensors")
    if found is None:
        return run
    return dataclasses.replace(run, scores={**(run.scores or {}), "test": found})


def branch_weight_ablation(
    run_dir: str | Path,
    *,
    split: str = "test",
    random_seeds: int = 3,
    beam: int | None = None,
    weights: str = "model.safetensors",
) -> dict[str, Any]:
    """Paper Table 3: the split's scores of ``weights`` with the learned κ, α, with uniform
    ones and with random ones (``random_seeds`` draws, mean ± sd)."""
    learned = score_run(run_dir, split=split, beam=beam, weights=weights)
    uniform = score_run(run_dir, split=split, beam=beam, weights=weights, branch_weights="uniform")
    randoms = [
        score_run(run_dir, split=split, beam=beam, weights=weights, branch_weights="random", seed=s)
        for s in range(1, random_seeds + 1)
    ]
    row: dict[str, Any] = {"learned": learned, "uniform": uniform, "random": randoms}
    for key in ("bleu", "chrf"):
        mean, sd = mean_sd([r[key] for r in randoms])
        row[f"random_{key}_mean"], row[f"random_{key}_sd"] = round(mean, 2), round(sd, 2)
    return row


def read_hypotheses(run_dir: Path, scores: dict[str, Any]) -> list[str]:
    """The hypotheses a score kept (from their ``.gz`` where only that is kept)."""
    text = stored.read_text(run_dir / scores["hypotheses"])
    return text.split("\n")[:-1]


def bootstrap(
    run_dir: Path, baseline_dir: Path, *, split: str = "test", samples: int = 1000
) -> dict[str, Any]:
    """sacreBLEU's paired bootstrap of one run's split translations against another's."""
    from wtnmt.decode.evaluate import paired_bootstrap

    ours, theirs = score_run(run_dir, split=split), score_run(baseline_dir, split=split)
    _, refs = split_pairs(run_dir, split)
    result = paired_bootstrap(
        refs,
        read_hypotheses(run_dir, ours),
        read_hypotheses(baseline_dir, theirs),
        samples=samples,
    )
    return {"run": run_dir.name, "baseline": baseline_dir.name, "samples": samples, **result}


__all__ = [
    "as_asked",
    "bootstrap",
    "branch_weight_ablation",
    "current_tokenize",
    "has_score",
    "keep_decoding",
    "kept_or_decoded",
    "kept_score",
    "read_hypotheses",
    "score_name",
    "score_run",
    "scored_with",
    "split_pairs",
    "with_test_score",
]
