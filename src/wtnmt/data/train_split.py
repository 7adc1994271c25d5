"""The training split prepared as a stream, in three passes over its pairs, so that memory does
not grow with the corpus but by a few bytes a pair:

1. **select**: what stays, by a mask over the pairs read: at most ``max_words`` words a side,
   a seeded sample of ``train_size``, no empty side, no repeat of an earlier pair. Repeats
   are found from a 64-bit hash of each pair (8 bytes a pair, sorted once at the end: no set
   of the sentences themselves); two different pairs share a hash with probability about
   n² / 2⁶⁵ (4e-7 for 4 M pairs), and the second of them would be counted a duplicate.
2. **vocabulary**: the kept sentences stream into SentencePiece, which trains on a seeded
   sample of ``spm_max_sentences`` of them (its reservoir sampling: memory bounded by the
   sample, not the corpus).
3. **encode**: the kept pairs, encoded on ``workers`` processes chunk by chunk, cut by the
   length filter, their ids appended to the arrays on disk as they come, in corpus order.

The result is exactly what the in-memory preparation wrote (the same kept pairs in the same
order, the same vocabulary sample, the same ids): tests/test_prepare_scale.py checks it.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import sys
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from wtnmt.config import DataConfig
from wtnmt.data.clean import length_filter
from wtnmt.data.dataset import IdWriter, flatten
from wtnmt.data.io import DataError
from wtnmt.data.stream import Pair, PairStream
from wtnmt.data.vocab import Vocabularies, stderr_lines, train_sentencepiece
from wtnmt.lifeline import end_with_parent


def progress(total: int | None, unit: str, desc: str, file: TextIO | None = None):  # type: ignore[no-untyped-def]
    """A tqdm bar with rate and time left, on stderr (or ``file``); silent where stderr is no
    terminal."""
    from tqdm import tqdm

    scale = unit == "B"
    return tqdm(
        total=total,
        unit=unit,
        desc=desc,
        unit_scale=scale,
        unit_divisor=1024 if scale else 1000,
        dynamic_ncols=True,
        disable=not (file or sys.stderr).isatty(),
        leave=False,
        file=file,
    )


@dataclass
class Selection:
    keep: np.ndarray  # bool, one per pair read: goes on to the vocabulary and the ids
    read: int  # pairs read from the source
    split: int  # pairs in the training split (after max_words and train_size), before cleaning
    dropped: Counter[str] = field(default_factory=Counter)  # empty, duplicate
    corpus_dropped: Counter[str] | None = None  # over_max_words, over_train_size (None: not set)

    @property
    def kept(self) -> int:
        return int(self.keep.sum())


def _masks(chunk: list[Pair], max_words: int | None, duplicates: bool) -> tuple[Any, Any, Any]:
    short = None
    if max_words is not None:
        short = [len(s.split()) <= max_words and len(t.split()) <= max_words for s, t in chunk]
    empty = [not s.strip() or not t.strip() for s, t in chunk]
    hashes = [hash(pair) for pair in chunk] if duplicates else None
    return short, empty, hashes


def select(
    stream: PairStream,
    *,
    max_words: int | None,
    train_size: int | None,
    seed: int,
    duplicates: bool,
) -> Selection:
    """Pass 1: the mask of the pairs that stay, and what was dropped for what."""
    shorts, empties, hashes = [], [], []
    with progress(stream.total, stream.unit, "reading, cleaning") as bar:
        for chunk in stream.chunks():
            short, empty, hashed = _masks(chunk, max_words, duplicates)
            if short is not None:
                shorts.append(np.array(short, dtype=bool))
            empties.append(np.array(empty, dtype=bool))
            if hashed is not None:
                hashes.append(np.array(hashed, dtype=np.int64))
            bar.update(stream.position() - bar.n)
    empty = np.concatenate(empties) if empties else np.zeros(0, dtype=bool)
    n = len(empty)
    in_split = np.concatenate(shorts) if shorts else np.ones(n, dtype=bool)
    corpus_dropped = None if max_words is None else Counter(over_max_words=n - int(in_split.sum()))
    eligible = int(in_split.sum())
    if train_size is not None and eligible > train_size:
        # the sample the in-memory split drew: positions among the pairs max_words kept
        sample = sorted(random.Random(seed).sample(range(eligible), train_size))
        chosen = np.zeros(eligible, dtype=bool)
        chosen[sample] = True
        del sample
        in_split[in_split] = chosen
        corpus_dropped = (corpus_dropped or Counter()) + Counter(
            over_train_size=eligible - train_size
        )
    candidates = in_split & ~empty
    keep = candidates.copy()
    dropped = Counter(empty=int((in_split & empty).sum()))
    if duplicates:
        chosen_hashes = np.concatenate(hashes)[candidates] if hashes else np.zeros(0, np.int64)
        del hashes
        first = np.unique(chosen_hashes, return_index=True)[1]  # each value's first place
        unique = np.zeros(len(chosen_hashes), dtype=bool)
        unique[first] = True
        keep[candidates] = unique
        dropped["duplicate"] = int(candidates.sum()) - int(unique.sum())
    return Selection(keep, n, int(in_split.sum()), +dropped, corpus_dropped)


def kept_pairs(stream: PairStream, keep: np.ndarray) -> Iterator[list[Pair]]:
    """The chunks of ``stream`` with only the pairs ``keep`` marks (pass 2 and 3)."""
    start = 0
    for chunk in stream.chunks():
        mask = keep[start : start + len(chunk)]
        start += len(chunk)
        if mask.all():
            yield chunk
        else:
            yield [pair for pair, k in zip(chunk, mask.tolist(), strict=True) if k]


def kept_sentences(  # type: ignore[no-untyped-def]
    stream: PairStream, selection: Selection, bar, sides: tuple[int, ...] = (0, 1)
) -> Iterator[str]:
    """Pass 2's input to SentencePiece: source, target, source, … of every kept pair (or
    the ``sides`` asked of each)."""
    with bar:
        for chunk in kept_pairs(stream, selection.keep):
            for pair in chunk:
                for side in sides:
                    yield pair[side]
            bar.update(len(chunk))


# SentencePiece's steps, by the log line that starts each (its normalization, the longest,
# reports nothing until it ends: the bar counts steps and their time)
_STEPS = (
    (b"Normalizing sentences", "normalizing"),
    (b"Tokenizing input sentences", "splitting words"),
    (b"bpe_model_trainer", "merging"),
    (b"unigram_model_trainer", "pruning"),
    (b"Saving model", "saving"),
)


def train_vocabulary(
    stream: PairStream,
    selection: Selection,
    prefix: Path,
    config: DataConfig,
    threads: int,
    sides: tuple[int, ...] = (0, 1),
) -> Path:
    """Pass 2: a vocabulary from a sample of the kept sentences of ``sides`` (0 source, 1
    target; both: the shared one). On a terminal, two bars: the sentences fed to
    SentencePiece, then its steps (read from its log)."""
    c = config
    options = {
        "vocab_size": c.vocab_size,
        "model_type": c.spm_model_type,
        "character_coverage": c.character_coverage,
        "seed": c.spm_seed,
        "max_sentences": c.spm_max_sentences,
        "threads": threads,
    }
    if not sys.stderr.isatty():
        feed = progress(selection.kept, "pair", "vocabulary sample")
        sentences = kept_sentences(stream, selection, feed, sides)
        return train_sentencepiece(sentences, prefix, **options)
    steps = None
    seen: set[str] = set()

    def on_line(line: bytes) -> None:
        for marker, name in _STEPS:
            if marker in line and name not in seen and steps is not None:
                seen.add(name)
                steps.set_description_str(f"vocabulary: {name}")
                steps.update(1)

    with stderr_lines(on_line) as terminal:
        feed = progress(selection.kept, "pair", "vocabulary sample", file=terminal)
        steps = progress(4, "step", "vocabulary", file=terminal)
        with steps:
            sentences = kept_sentences(stream, selection, feed, sides)
            return train_sentencepiece(sentences, prefix, **options, verbose=True)


def train_vocabularies(  # type: ignore[no-untyped-def]
    stream: PairStream, selection: Selection, out: Path, config: DataConfig, threads: int, log
) -> Vocabularies:
    """Pass 2 for each vocabulary ``data.joint_vocab`` asks: the shared one (``spm.model``)
    or one a language (``spm.src.model``, ``spm.tgt.model``)."""
    c = config
    sides = (
        [("shared", "spm", (0, 1))]
        if c.joint_vocab
        else [
            (c.src_lang, "spm.src", (0,)),
            (c.tgt_lang, "spm.tgt", (1,)),
        ]
    )
    for name, prefix, of in sides:
        sentences = len(of) * selection.kept
        log(
            f"training the {name} {c.spm_model_type} vocabulary ({c.vocab_size} pieces) on "
            f"{selection.kept:,} pairs: a sample of {min(sentences, c.spm_max_sentences):,} of "
            f"their {sentences:,} sentences (data.spm_max_sentences)"
        )
        train_vocabulary(stream, selection, out / prefix, c, threads=threads, sides=of)
    return Vocabularies.load(out, c.joint_vocab)


# --------------------------------------------------------------------------------------------
# Pass 3: ids, on worker processes


_sp: tuple[Any, Any] | None = None  # a worker's sentencepiece processors: source, target
_filter: dict[str, Any] = {}


def _start_worker(src_model: str, tgt_model: str, max_tokens: int, max_ratio: float) -> None:
    import sentencepiece as spm

    global _sp, _filter
    source = spm.SentencePieceProcessor(model_file=src_model)
    shared = src_model == tgt_model
    _sp = (source, source if shared else spm.SentencePieceProcessor(model_file=tgt_model))
    _filter = {"max_tokens": max_tokens, "max_ratio": max_ratio}


def _start_pool_worker(parent: int, *init: Any) -> None:
    """A pool worker's start: it ends with ``parent`` however that ends (killed, or ended by
    a signal), then loads the vocabularies."""
    end_with_parent(parent)
    _start_worker(*init)


def encode_chunk(
    pairs: list[Pair],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Counter[str]]:
    """One chunk → source ids and lengths, target ids and lengths of the pairs the length
    filter keeps, and what it dropped (on a worker, after ``_start_worker``)."""
    assert _sp is not None
    # one thread: a worker is a core (sentencepiece's default takes every core, each worker)
    src = _sp[0].encode([p[0] for p in pairs], out_type=int, num_threads=1)
    tgt = _sp[1].encode([p[1] for p in pairs], out_type=int, num_threads=1)
    keep, dropped = length_filter(list(map(len, src)), list(map(len, tgt)), **_filter)
    if len(keep) < len(pairs):
        src, tgt = [src[i] for i in keep], [tgt[i] for i in keep]
    return (*flatten(src), *flatten(tgt), dropped)


@contextmanager
def _main_hidden(hide: bool) -> Iterator[None]:
    """While spawned workers start, the main module is not named to them: spawn would run it
    again in each (a script without an ``if __name__ == "__main__"`` guard would prepare
    again inside its workers, and a program read from stdin cannot be run again at all: the
    workers would die at start and the pool start them forever). They need only wtnmt.data."""
    main = sys.modules["__main__"]
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if hide and k in main.__dict__}
    for key in saved:
        setattr(main, key, None) if key == "__spec__" else delattr(main, key)
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(main, key, value)


def _encoded(
    chunks: Iterator[list[Pair]], init: tuple[str, str, int, float], workers: int
) -> Iterator[tuple[int, tuple[Any, ...]]]:
    """(pairs in, encode_chunk's result) of each chunk, in order: in this process for one
    worker, else on ``workers`` processes with at most two chunks each in flight."""
    if workers == 1:
        _start_worker(*init)
        for chunk in chunks:
            yield len(chunk), encode_chunk(chunk)
        return
    # fork where torch is not loaded (`wtnmt prepare`): workers start at once, whatever the
    # main module; spawn where it is (`wtnmt train` prepares in a process whose torch thread
    # pools a fork would copy mid-flight): the workers import only wtnmt.data
    fork = "torch" not in sys.modules and "fork" in multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if fork else "spawn")
    # an executor, not multiprocessing.Pool: a worker that dies (the OOM killer, kill -9)
    # breaks it, and every chunk in flight says so; a Pool replaces the worker and waits
    # forever for the chunk it took with it
    with (
        _main_hidden(not fork),
        ProcessPoolExecutor(
            workers,
            mp_context=context,
            initializer=_start_pool_worker,
            initargs=(os.getpid(), *init),
        ) as pool,
    ):
        pending: list[tuple[int, Future]] = []
        try:
            for chunk in chunks:
                pending.append((len(chunk), pool.submit(encode_chunk, chunk)))
                if len(pending) >= 2 * workers:
                    n, result = pending.pop(0)
                    yield n, result.result()
            for n, result in pending:
                yield n, result.result()
        except BrokenProcessPool:
            raise DataError(
                "an encoding worker died (killed, or out of memory: try fewer --workers); "
                "nothing of this prepare was kept"
            ) from None


def encode(
    stream: PairStream,
    selection: Selection,
    out: Path,
    *,
    models: tuple[Path, Path],
    vocab_sizes: tuple[int, int],
    max_tokens: int,
    max_ratio: float,
    workers: int,
) -> dict[str, Any]:
    """Pass 3: ``out``/train.{src,tgt}(.idx).npy of the kept pairs, each side with its
    vocabulary (``models``: source, target; the same file where shared); returns the counts."""
    init = (str(models[0]), str(models[1]), max_tokens, max_ratio)
    dropped: Counter[str] = Counter()
    kept = tokens_src = tokens_tgt = 0
    with (
        IdWriter(out / "train.src", vocab_sizes[0]) as src_out,
        IdWriter(out / "train.tgt", vocab_sizes[1]) as tgt_out,
        progress(selection.kept, "pair", "encoding") as bar,
    ):
        for n, (src, src_len, tgt, tgt_len, drops) in _encoded(
            kept_pairs(stream, selection.keep), init, workers
        ):
            src_out.append(src, src_len)
            tgt_out.append(tgt, tgt_len)
            dropped.update(drops)
            kept += len(src_len)
            tokens_src += int(src_len.sum())
            tokens_tgt += int(tgt_len.sum())
            bar.update(n)
    return {"kept": kept, "dropped": dropped, "tokens_src": tokens_src, "tokens_tgt": tokens_tgt}


__all__ = [
    "Selection",
    "encode",
    "encode_chunk",
    "kept_pairs",
    "progress",
    "select",
    "train_vocabularies",
    "train_vocabulary",
]
