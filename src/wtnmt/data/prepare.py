"""`wtnmt prepare`: raw parallel text → a prepared-data directory.

The directory holds::

    spm.model, spm.vocab                 shared sentencepiece vocabulary (data.joint_vocab;
                                         else spm.src.*, spm.tgt.*: one a language)
    {train,valid,test}.{src,tgt}.npy     token ids (+ .idx.npy offsets), memory-mappable
    valid.<lang>, test.<lang>            the raw text of dev and test, for scoring
    summary.json                         what was read, kept and dropped, per split
    manifest.json                        inputs' sha256, options, vocabulary hash (last written)

``prepare`` fingerprints its inputs (sha256 of every source file) and options first: when the
manifest says the directory was made from exactly those, it returns at once; any changed byte
or option rebuilds it. A build goes to a temporary directory that replaces the old one only
when complete, so an interrupted run never leaves a half-written directory behind.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wtnmt.config import DataConfig
from wtnmt.data.clean import drop_empty_and_duplicates
from wtnmt.data.corpora import locate_corpus, sha256_of
from wtnmt.data.dataset import write_ids
from wtnmt.data.io import DataError, no_such_file, read_parallel
from wtnmt.data.prepared_dir import (
    SPLITS,
    check_output_directory,
    finish_interrupted_move,
    is_current,
    move_into_place,
    remove_stale_builds,
)
from wtnmt.data.split import keep_short, split_by_pivot
from wtnmt.data.spool import spooled
from wtnmt.data.stream import PairList, ParallelFiles, TsvFile
from wtnmt.data.summary import (
    StepClock,
    corpus_counts,
    describe_filters,
    dropped_reasons,
    filters_applied,
    split_stats,
)
from wtnmt.data.train_split import Selection, encode, kept_pairs, select, train_vocabularies
from wtnmt.data.vocab import given_vocabularies, vocabularies_from, vocabularies_sha256

FORMAT_VERSION = 2  # 2: dev/test ids cut to max_tokens_per_side
Pair = tuple[str, str]

# options that do not change what is built
_NOT_OPTIONS = {"prepared_dir", "corpus_dir"}
# options added since directories were first prepared, at the value that builds what was built
# before them: left out of the fingerprint there, so that those directories stay current
_SINCE = {"joint_vocab": True, "vocab_from": None}


@dataclasses.dataclass(frozen=True)
class _Source:
    files: list[Path]  # what the fingerprint hashes
    read: Callable[[], dict[str, Any]]  # raw pairs by split; train's as a PairStream
    attribution: str
    pivot: int | None  # no standard split: split by unique sentences of this side (0 src, 1 tgt)


def _source(config: DataConfig) -> _Source:
    """Where the raw pairs of ``config`` come from."""
    c = config
    if c.corpus is not None:
        corpus, directory = locate_corpus(c.corpus, c.src_lang, c.tgt_lang, explicit=c.corpus_dir)
        pivot = None if corpus.has_standard_split else int(corpus.pivot != c.src_lang)
        return _Source(
            files=[directory / f.name for f in corpus.files],
            read=lambda: corpus.read(directory, c.src_lang, c.tgt_lang),
            attribution=corpus.attribution,
            pivot=pivot,
        )
    files: list[Path] = []
    readers: dict[str, Callable[[], Any]] = {}
    if c.train_tsv is not None:
        files.append(Path(c.train_tsv))
        readers["train"] = lambda: TsvFile(c.train_tsv)  # type: ignore[arg-type]
    for split in SPLITS:
        src, tgt = getattr(c, f"{split}_src"), getattr(c, f"{split}_tgt")
        if src is not None:
            files += [Path(src), Path(tgt)]
            read = ParallelFiles if split == "train" else read_parallel
            readers[split] = lambda s=src, t=tgt, read=read: read(s, t)

    for path in files:
        if not path.is_file():
            raise no_such_file(path)
    # dev or test files not given: that split is held out of train by unique source sentence
    missing = "valid" not in readers or "test" not in readers
    return _Source(
        files=files,
        read=lambda: {split: reader() for split, reader in readers.items()},
        attribution="your own parallel data",
        pivot=0 if missing else None,
    )


def fingerprint(config: DataConfig, files: list[Path]) -> tuple[str, dict[str, Any]]:
    options = {
        k: v
        for k, v in dataclasses.asdict(config).items()
        if k not in _NOT_OPTIONS and _SINCE.get(k, object()) != v
    }
    inputs = [{"name": p.name, "path": str(p), "sha256": sha256_of(p)} for p in files]
    key = json.dumps(
        {
            "version": FORMAT_VERSION,
            "options": options,
            "inputs": [(i["name"], i["sha256"]) for i in inputs],
        },
        sort_keys=True,
    )
    manifest = {"version": FORMAT_VERSION, "options": options, "inputs": inputs}
    return hashlib.sha256(key.encode()).hexdigest(), manifest


def make_splits(
    config: DataConfig, raw: dict[str, Any], pivot: int | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Raw pairs → train/valid/test: the source's own splits where it has them, a seeded
    split by unique ``pivot`` sentence for what it lacks (``pivot`` None: it lacks nothing).

    With the source's own splits, the training pairs stay a stream: ``max_words`` and
    ``train_size`` are applied as it is read (``train_split.select``). A seeded split needs
    every pivot sentence at once: the training pairs are read into memory, ``max_words`` and
    ``train_size`` applied here, and what is kept for training is a PairList.

    Returns the splits and what happened before splitting (for the summary; filled in by
    ``select`` for a stream).
    """
    c = config
    if pivot is None:  # dev and test are the source's own, scored as given
        return raw, {}
    pairs = raw["train"].pairs()
    level: dict[str, Any] = {"pairs_read": len(pairs)}
    dropped: Counter[str] = Counter()
    if c.max_words is not None:
        pairs, dropped["over_max_words"] = keep_short(pairs, c.max_words)
    given = [split for split in ("valid", "test") if split in raw]
    splits, split_drops = split_by_pivot(
        pairs,
        pivot=pivot,
        seed=c.split_seed,
        valid_size=0 if "valid" in given else c.valid_size,
        test_size=0 if "test" in given else c.test_size,
        train_size=c.train_size,
    )
    splits.update({split: raw[split] for split in given})
    splits["train"] = PairList(splits["train"])
    dropped.update(split_drops)
    side = "source" if pivot == 0 else "target"
    held = " and ".join(s for s in ("valid", "test") if s not in given)
    level["split"] = (
        f"{held} held out of training, seeded (seed {c.split_seed}) by unique {side} sentence"
    )
    if given:
        level["split"] += f"; {' and '.join(given)} from the files given"
    level["dropped"] = dict(sorted((k, v) for k, v in dropped.items() if v))
    return splits, level


def _select(config: DataConfig, train: Any, streamed: bool, *, duplicates: bool) -> Selection:
    """``train_split.select`` with the options that apply: ``max_words`` and ``train_size``
    only where the training pairs are still a stream (make_splits applied them otherwise)."""
    c = config
    return select(
        train,
        max_words=c.max_words if streamed else None,
        train_size=c.train_size if streamed else None,
        seed=c.split_seed,
        duplicates=duplicates,
    )


def raw_split(config: DataConfig, split: str) -> list[Pair]:
    """The pairs of one split exactly as ``prepare`` makes them, empty pairs dropped (what
    `wtnmt evaluate --corpus` scores), without building a vocabulary. Dev and test of a
    source that has its own are read without reading the training pairs."""
    source = _source(config)
    splits, _ = make_splits(config, source.read(), source.pivot)
    if split not in splits:
        raise DataError(f"no split {split!r}: the splits are {', '.join(SPLITS)}")
    if split == "train":
        chosen = _select(config, splits[split], source.pivot is None, duplicates=False)
        return [pair for chunk in kept_pairs(splits[split], chosen.keep) for pair in chunk]
    kept, _ = drop_empty_and_duplicates(splits[split], duplicates=False)
    return kept


_LENGTH_FILTERS = ("data.max_tokens_per_side", "data.max_length_ratio")  # applied as encoded


def _build(
    config: DataConfig,
    raw: dict[str, Any],
    pivot: int | None,
    out: Path,
    log: Callable[[str], None],
    workers: int,
) -> dict[str, Any]:
    c = config
    clock = StepClock()
    splits, corpus_level = make_splits(config, raw, pivot)
    if "split" in corpus_level:
        log(f"splits: {corpus_level['split']}")
    train = splits["train"]
    selection = _select(config, train, pivot is None, duplicates=c.drop_duplicates)
    if pivot is None:
        corpus_level = corpus_counts(selection)
    first = Counter(corpus_level.get("dropped", {})) + selection.dropped
    rows = [r for r in filters_applied(c, first) if r["filter"] not in _LENGTH_FILTERS]
    log(
        f"read {corpus_level.get('pairs_read', selection.read):,} training pairs, "
        f"{selection.kept:,} kept: dropped {describe_filters(rows)} ({clock.lap('read')} s)"
    )
    read = {"train": selection.split}
    kept: dict[str, list[Pair]] = {}
    dropped: dict[str, Counter[str]] = {"train": selection.dropped}
    for split in ("valid", "test"):  # dev and test are scored as given: no duplicates dropped
        read[split] = len(splits[split])
        kept[split], dropped[split] = drop_empty_and_duplicates(splits[split], duplicates=False)
    if not selection.kept:
        raise DataError(
            f"no training pairs left: {read['train']:,} read, all dropped "
            f"({dropped_reasons(dropped['train'], corpus_level)}); check the training files"
        )
    if c.vocab_from is None:
        vocab, made = train_vocabularies(train, selection, out, c, threads=workers, log=log), ""
    else:
        vocab, made = vocabularies_from(c.vocab_from, out, c.joint_vocab), f" {c.vocab_from}"
    log(
        f"vocabulary {'from' + made + ' (data.vocab_from)' if made else 'trained'} "
        f"({clock.lap('vocabulary')} s); encoding {selection.kept:,} "
        f"training pairs on {workers} worker{'s' if workers > 1 else ''}"
    )
    encoded = encode(
        train,
        selection,
        out,
        models=(vocab.source.path, vocab.target.path),
        vocab_sizes=(len(vocab.source), len(vocab.target)),
        max_tokens=c.max_tokens_per_side,
        max_ratio=c.max_length_ratio,
        workers=workers,
    )
    dropped["train"].update(encoded["dropped"])
    filters = filters_applied(c, Counter(corpus_level.get("dropped", {})) + dropped["train"])
    lengths = [r for r in filters if r["filter"] in _LENGTH_FILTERS]
    log(
        f"encoded ({clock.lap('encode')} s): {encoded['kept']:,} training pairs kept, "
        f"dropped {describe_filters(lengths)}"
    )
    if not encoded["kept"]:
        raise DataError(
            f"no training pairs left: {read['train']:,} read, all dropped "
            f"({dropped_reasons(dropped['train'], corpus_level)}); see data.max_tokens_per_side "
            f"and data.max_length_ratio"
        )
    stats = {
        "train": split_stats(
            read["train"],
            encoded["kept"],
            dropped["train"],
            encoded["tokens_src"],
            encoded["tokens_tgt"],
        )
    }
    for split in ("valid", "test"):
        # dev and test are kept whole as text (scored as given); their ids are cut to
        # max_tokens_per_side, as `wtnmt translate` cuts an over-long line, so that
        # validation never needs more positions than the model has
        pairs = kept[split]
        src_ids = vocab.source.encode([p[0] for p in pairs])
        tgt_ids = vocab.target.encode([p[1] for p in pairs])
        cap = c.max_tokens_per_side
        long = sum(len(s) > cap or len(t) > cap for s, t in zip(src_ids, tgt_ids, strict=True))
        if long:
            log(f"{split}: {long} pairs over {cap} pieces a side, their ids cut to {cap}")
        src_ids, tgt_ids = [s[:cap] for s in src_ids], [t[:cap] for t in tgt_ids]
        write_ids(out / f"{split}.src", src_ids, len(vocab.source))
        write_ids(out / f"{split}.tgt", tgt_ids, len(vocab.target))
        for lang, side in ((c.src_lang, 0), (c.tgt_lang, 1)):
            text = "".join(p[side] + "\n" for p in pairs)
            (out / f"{split}.{lang}").write_text(text, encoding="utf-8")
        tokens = (sum(map(len, src_ids)), sum(map(len, tgt_ids)))
        stats[split] = split_stats(read[split], len(pairs), dropped[split], *tokens)
        if long:
            stats[split]["ids_truncated"] = long
    clock.lap("dev_test")
    log(f"training pairs: {encoded['kept']:,} kept; dropped {describe_filters(filters)}")
    return {
        "corpus": corpus_level,
        "filters": filters,  # every filter the training pairs went through, and its count
        "vocab_size": len(vocab.target),  # the target's where each language has its own
        **({} if vocab.joint else {"src_vocab_size": len(vocab.source)}),
        "splits": stats,
        "seconds_by_step": clock.laps,
    }


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def prepare(
    config: DataConfig,
    out: str | Path,
    *,
    log: Callable[[str], None] = print,
    force: bool = False,
    workers: int | None = None,
) -> dict[str, Any]:
    """Build (or reuse) the prepared directory ``out`` for ``config``; returns the summary.
    ``workers``: processes that encode the training pairs (default: one a core); the output
    is the same for any number."""
    workers = workers or default_workers()
    out = Path(out).resolve()  # `--out .` names the working directory, not an empty name
    check_output_directory(out)
    finish_interrupted_move(out, log)
    spool = out.parent / f".{out.name}.spool.tmp-{os.getpid()}"
    try:
        return _prepare(spooled(config, spool, log), out, log=log, force=force, workers=workers)
    finally:
        shutil.rmtree(spool, ignore_errors=True)


def _prepare(
    config: DataConfig,
    out: Path,
    *,
    log: Callable[[str], None],
    force: bool,
    workers: int,
) -> dict[str, Any]:
    start = time.perf_counter()
    source = _source(config)
    given = (
        []
        if config.vocab_from is None
        else given_vocabularies(config.vocab_from, config.joint_vocab)
    )
    key, manifest = fingerprint(config, source.files + given)
    if not force and is_current(out, key):
        log(f"{out}: up to date with its inputs and options, nothing to do")
        return json.loads((out / "summary.json").read_text())
    log(f"reading {', '.join(str(f) for f in source.files)}")
    raw = source.read()
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_builds(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        summary = _build(config, raw, source.pivot, tmp, log, workers)
        summary.update(
            {
                "source": config.corpus or "files",
                "src_lang": config.src_lang,
                "tgt_lang": config.tgt_lang,
                "attribution": source.attribution,
                "seconds": round(time.perf_counter() - start, 2),
            }
        )
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False))
        files = [*sorted(f.name for f in tmp.iterdir()), "manifest.json"]
        manifest.update(
            {
                "fingerprint": key,
                "vocab_sha256": vocabularies_sha256(tmp, config.joint_vocab, pieces=False),
                "files": files,
            }
        )
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
        move_into_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return summary
