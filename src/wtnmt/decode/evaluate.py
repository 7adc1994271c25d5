"""Scoring translations with sacreBLEU: BLEU and chrF with their signatures, BLEU as the
Multi30k literature computes it (lowercased, on Moses tokens), and the paired bootstrap test
between two systems (as sacreBLEU computes it)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU, CHRF, TER

from wtnmt.config import ConfigError
from wtnmt.safe_files import atomic_write

# sacreBLEU's tokenizations of BLEU (its --tokenize): 13a, its default, for languages written
# with spaces; zh, ja-mecab, ko-mecab for Chinese, Japanese, Korean targets (the last two need
# `pip install 'sacrebleu[ja]'` or `'sacrebleu[ko]'`); char, intl, flores101/200 (spBLEU)
TOKENIZERS = ("13a", "intl", "zh", "ja-mecab", "ko-mecab", "char", "flores101", "flores200")


def check_tokenizer(tokenize: str) -> None:
    """Refuse, before any decoding, a tokenization that is not one of TOKENIZERS or whose
    packages are missing (a ConfigError naming what to install)."""
    if tokenize not in TOKENIZERS:
        raise ConfigError(f"--tokenize {tokenize}: one of {', '.join(TOKENIZERS)}")
    model = spm_model(tokenize)
    try:
        BLEU(tokenize=tokenize).corpus_score(["a"], [["a"]])
    except SystemExit:  # sacreBLEU's download, failed on an SSL error
        raise ConfigError(_download_failed(tokenize, model, "an SSL error")) from None
    except (RuntimeError, ImportError, OSError) as e:  # sacreBLEU: missing extras
        if model is not None and not model[1].is_file():
            raise ConfigError(_download_failed(tokenize, model, str(e).strip())) from None
        install = next((ln.strip() for ln in str(e).splitlines() if "pip install" in ln), "")
        raise ConfigError(
            f"--tokenize {tokenize}: sacreBLEU cannot tokenize so here"
            + (f" ({install})" if install else f" ({str(e).strip().splitlines()[0]})")
        ) from None


def spm_model(tokenize: str) -> tuple[str, Path] | None:
    """(URL, local file) of the SentencePiece model sacreBLEU's ``tokenize`` (flores101,
    flores200) downloads on its first use, into $SACREBLEU (~/.sacrebleu)/models; None for
    the tokenizations that need no file."""
    try:
        from sacrebleu.tokenizers import tokenizer_spm
    except ImportError:
        return None
    entry = tokenizer_spm.SPM_MODELS.get(tokenize)
    if entry is None:
        return None
    name = os.path.basename(entry["url"])
    return entry["url"], Path(tokenizer_spm.SACREBLEU_DIR) / "models" / name


def _download_failed(tokenize: str, model: tuple[str, Path], reason: str) -> str:
    url, path = model
    return (
        f"--tokenize {tokenize}: needs sacreBLEU's SentencePiece model, downloaded once from "
        f"{url} into {path}, and that download failed ({reason.splitlines()[0]}): connect "
        f"once, or copy the file there from a machine that has it ($SACREBLEU sets the folder)"
    )


def score_corpus(
    hypotheses: Sequence[str],
    references: Sequence[str],
    lang: str | None = None,
    *,
    tokenize: str = "13a",
) -> dict[str, Any]:
    """sacreBLEU's BLEU (tokenized by ``tokenize``), chrF and TER with their signatures; given the
    target language ``lang``, also BLEU as the Multi30k literature computes it
    (``lowercased_bleu``, ``moses_bleu``)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu, chrf, ter = BLEU(tokenize=tokenize), CHRF(), TER()
    b = bleu.corpus_score(list(hypotheses), [list(references)])
    c = chrf.corpus_score(list(hypotheses), [list(references)])
    t = ter.corpus_score(list(hypotheses), [list(references)])
    scores = {
        "bleu": round(b.score, 2),
        "chrf": round(c.score, 2),
        "ter": round(t.score, 2),
        "signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "ter_signature": str(ter.get_signature()),
        "n_sentences": len(hypotheses),
        "tokenize": tokenize,
    }
    if lang is None:
        return scores
    hyps, refs = list(hypotheses), list(references)
    return scores | lowercased_bleu(hyps, refs) | moses_bleu(hyps, refs, lang)


def lowercased_bleu(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    """BLEU on lowercased, 13a-tokenised text: how the Multi30k literature reports BLEU
    (multi-bleu.perl over tokenised, lowercased text), up to the tokenisers' differences."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU(lowercase=True)
    score = bleu.corpus_score(list(hypotheses), [list(references)])
    return {"bleu_lc": round(score.score, 2), "bleu_lc_signature": str(bleu.get_signature())}


def moses_bleu(hypotheses: list[str], references: list[str], lang: str) -> dict[str, Any]:
    """BLEU as the Multi30k literature computes it (the published 41.02 on test_2016_flickr,
    Wu et al. 2021): both sides lowercased, punctuation normalized and tokenized by Moses'
    scripts (multi30k's task1-tokenize.sh, through sacremoses), then BLEU-4 over those tokens
    (fairseq-generate's scorer, multi-bleu.perl). On the references this gives the data set's
    own tokenized files: 12,103 words in test_2016_flickr.de, as its README counts."""
    from sacrebleu.metrics import BLEU
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)

    def moses(lines: list[str]) -> list[str]:
        return [
            tokenizer.tokenize(normalizer.normalize(line.lower()), escape=True, return_str=True)
            for line in lines
        ]

    bleu = BLEU(tokenize="none", force=True)
    score = bleu.corpus_score(moses(list(hypotheses)), [moses(list(references))])
    return {
        "bleu_moses": round(score.score, 2),
        "bleu_moses_signature": f"lc+moses-norm+moses-tok:{lang}|{bleu.get_signature()}",
    }


def paired_bootstrap(
    references: Sequence[str],
    system: Sequence[str],
    baseline: Sequence[str],
    *,
    samples: int = 1000,
    tokenize: str = "13a",
) -> dict[str, Any]:
    """sacreBLEU's paired bootstrap resampling (Koehn, 2004) of ``system`` against
    ``baseline``: BLEU of each with its 95% interval, and the p-value of the difference."""
    from sacrebleu.significance import PairedTest

    test = PairedTest(
        [("baseline", list(baseline)), ("system", list(system))],
        {"BLEU": BLEU(references=[list(references)], tokenize=tokenize)},
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


HISTORY = "history.jsonl"


def write_hypotheses(eval_dir: Path, name: str, hypotheses: list[str]) -> Path | None:
    """``name``.hyp written whole or not at all; an earlier one with other hypotheses (other
    weights, other settings) kept as ``name``.hyp.~N~ rather than lost: returns its path."""
    eval_dir.mkdir(parents=True, exist_ok=True)
    data = "".join(h + "\n" for h in hypotheses).encode("utf-8")
    hyp, kept = eval_dir / f"{name}.hyp", None
    if hyp.is_file() and hyp.read_bytes() != data:
        n = 1
        while (eval_dir / f"{name}.hyp.~{n}~").exists():
            n += 1
        kept = eval_dir / f"{name}.hyp.~{n}~"
        hyp.rename(kept)
    atomic_write(hyp, data)
    return kept


def record_scores(eval_dir: Path, name: str, scores: dict) -> None:
    """``name``.scores.json written whole, and a line appended to ``history.jsonl`` (when,
    the scores, the hypotheses' sha256), so that no evaluation's scores are lost to the next."""
    import datetime
    import hashlib

    atomic_write(eval_dir / f"{name}.scores.json", json.dumps(scores, indent=2).encode())
    entry = {
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "name": name,
        "hypotheses_sha256": hashlib.sha256((eval_dir / f"{name}.hyp").read_bytes()).hexdigest(),
        "scores": scores,
    }
    with open(eval_dir / HISTORY, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, ensure_ascii=False) + "\n")


def update_scores(path: Path, scores: dict) -> None:
    """The latest evaluation's keys into the run's scores.json, keeping the keys of others
    (`wtnmt experiment` keeps its test scores there under "test"); what an earlier
    evaluation wrote and this one does not (a "compare" or "ensemble" block) goes with it."""
    kept = {}
    if path.is_file():
        try:
            kept = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            kept = {}
    kept = kept if isinstance(kept, dict) else {}
    for key in ("compare", "ensemble"):
        if key not in scores:
            kept.pop(key, None)
    merged = {**kept, **scores}
    atomic_write(path, json.dumps(merged, indent=2, ensure_ascii=False).encode())
