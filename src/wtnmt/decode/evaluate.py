"""Scoring translations with sacreBLEU: BLEU and chrF with their signatures, and the paired
bootstrap test between two systems (both as sacreBLEU computes them)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU, CHRF

from wtnmt.safe_files import atomic_write


def score_corpus(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(list(hypotheses), [list(references)])
    c = chrf.corpus_score(list(hypotheses), [list(references)])
    return {
        "bleu": round(b.score, 2),
        "chrf": round(c.score, 2),
        "signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "n_sentences": len(hypotheses),
    }


def paired_bootstrap(
    references: Sequence[str],
    system: Sequence[str],
    baseline: Sequence[str],
    *,
    samples: int = 1000,
) -> dict[str, Any]:
    """sacreBLEU's paired bootstrap resampling (Koehn, 2004) of ``system`` against
    ``baseline``: BLEU of each with its 95% interval, and the p-value of the difference."""
    from sacrebleu.significance import PairedTest

    test = PairedTest(
        [("baseline", list(baseline)), ("system", list(system))],
        {"BLEU": BLEU(references=[list(references)])},
        None,
        test_type="bs",
        n_samples=samples,
    )
    signatures, results = test()
    base, ours = results["BLEU"]
    return {
        "baseline_bleu": round(base.score, 2),
        "bleu": round(ours.score, 2),
        "baseline_ci95": round(base.ci, 2),
        "ci95": round(ours.ci, 2),
        "p_value": ours.p_value,
        "signature": str(signatures["BLEU"]),
    }


def update_scores(path: Path, scores: dict) -> None:
    """The latest evaluation's keys into the run's scores.json, keeping the keys of others
    (`wtnmt experiment` keeps its test scores there under "test"); what an earlier
    evaluation wrote and this one does not (a "compare" block) goes with it."""
    kept = {}
    if path.is_file():
        try:
            kept = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            kept = {}
    kept = kept if isinstance(kept, dict) else {}
    for key in ("compare",):
        if key not in scores:
            kept.pop(key, None)
    merged = {**kept, **scores}
    atomic_write(path, json.dumps(merged, indent=2, ensure_ascii=False).encode())
