"""CTranslate2 loaded, run and checked as benchmarks/decode_vs_ctranslate2.py times it fairly
(see its docstring); the conversion itself is the toolkit's (``wtnmt export ctranslate2``).
Import ``ctranslate2`` before ``torch``: the caller does.
"""

from __future__ import annotations

import time
from pathlib import Path

import ctranslate2
import torch

from decode_speed import LENGTH
from wtnmt.decode import greedy_search
from wtnmt.export.ctranslate2 import _in_helper_thread, convert
from wtnmt.export.plain import SPECIALS
from wtnmt.special import EOS

# wtnmt's search never outputs padding or BOS: CTranslate2 is told the same
NEVER = [["<pad>"], ["<s>"]]
BATCH = 32  # sentences a batch (CTranslate2's max_batch_size with several workers)


def load_translator(path: Path, threads: int, workers: int = 1):  # type: ignore[no-untyped-def]
    """``workers`` > 1: that many batches decoded at once, on threads/workers threads each."""
    return _in_helper_thread(
        lambda: ctranslate2.Translator(
            str(path), device="cpu", inter_threads=workers, intra_threads=threads // workers
        )
    )


def as_tokens(inputs: list[torch.Tensor], tokens: list[str]) -> list[list[list[str]]]:
    """The same batches as piece strings, without the EOS that ends wtnmt's: the export's
    config has CTranslate2 add it (``add_source_eos``), as it would to a user's pieces."""
    out = []
    for src in inputs:
        rows = []
        for row in src.tolist():
            ids = row[: row.index(EOS)]
            rows.append([tokens[i] for i in ids])
        out.append(rows)
    return out


def run_ct2(translator, inputs: list[list[list[str]]], beam: int) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """Batch by batch; with several workers (inter_threads), all batches in one call, which
    CTranslate2 cuts into batches of 32 again and shares among its workers."""
    start, n = time.perf_counter(), 0
    if translator.num_translators > 1:
        inputs = [[row for rows in inputs for row in rows]]
    for rows in inputs:
        results = translator.translate_batch(
            rows,
            beam_size=beam,
            min_decoding_length=LENGTH,
            max_decoding_length=LENGTH,
            max_batch_size=BATCH,
            suppress_sequences=NEVER,
        )
        n += sum(len(r.hypotheses[0]) for r in results)
    return time.perf_counter() - start, n


def check_greedy_agrees(model, translator, inputs, tokens, limit: int) -> int:  # type: ignore[no-untyped-def]
    """Greedy outputs, unforced (up to 24 tokens), of both engines: identical or an error."""
    checked = 0
    for src, rows in zip(inputs, as_tokens(inputs, tokens), strict=True):
        ours = greedy_search(model, src, max_len=LENGTH)
        theirs = translator.translate_batch(
            rows, beam_size=1, max_decoding_length=LENGTH + 1, suppress_sequences=NEVER
        )
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            mine = [tokens[t] for t in a.tokens]
            other = [t for t in b.hypotheses[0] if t != "</s>"]
            if mine != other[: len(mine)] or len(other) > len(mine) + 1:
                raise SystemExit(
                    f"greedy outputs differ on sentence {checked + i}:\n  wtnmt {mine}\n"
                    f"  ct2   {other}"
                )
        checked += len(rows)
        if checked >= limit:
            break
    return checked


__all__ = [
    "BATCH",
    "SPECIALS",
    "as_tokens",
    "check_greedy_agrees",
    "convert",
    "load_translator",
    "run_ct2",
]
