"""`wtnmt prepare`: raw parallel text → a prepared-data directory.

The directory holds::

    spm.model, spm.vocab                 shared sentencepiece vocabulary
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
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wtnmt.config import DataConfig
from wtnmt.data.clean import drop_empty_and_duplicates, length_filter
from wtnmt.data.corpora import locate_corpus, sha256_of
from wtnmt.data.dataset import write_ids
from wtnmt.data.io import DataError, read_parallel, read_tsv
from wtnmt.data.prepared_dir import (
    check_output_directory,
    move_into_place,
    remove_stale_builds,
)
from wtnmt.data.split import keep_short, split_by_pivot
from wtnmt.data.vocab import Vocabulary, train_sentencepiece

FORMAT_VERSION = 2  # 2: dev/test ids cut to max_tokens_per_side
SPLITS = ("train", "valid", "test")
Pair = tuple[str, str]

# options that do not change what is built
_NOT_OPTIONS = {"prepared_dir", "corpus_dir"}


@dataclasses.dataclass(frozen=True)
class _Source:
    files: list[Path]  # what the fingerprint hashes
    read: Callable[[], dict[str, list[Pair]]]  # raw pairs by split
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
    readers: dict[str, Callable[[], list[Pair]]] = {}
    if c.train_tsv is not None:
        files.append(Path(c.train_tsv))
        readers["train"] = lambda: read_tsv(c.train_tsv)  # type: ignore[arg-type]
    for split in SPLITS:
        src, tgt = getattr(c, f"{split}_src"), getattr(c, f"{split}_tgt")
        if src is not None:
            files += [Path(src), Path(tgt)]
            readers[split] = lambda s=src, t=tgt: read_parallel(s, t)

    for path in files:
        if not path.is_file():
            raise DataError(f"{path}: no such file")
    # dev or test files not given: that split is held out of train by unique source sentence
    missing = "valid" not in readers or "test" not in readers
    return _Source(
        files=files,
        read=lambda: {split: reader() for split, reader in readers.items()},
        attribution="your own parallel data",
        pivot=0 if missing else None,
    )


def fingerprint(config: DataConfig, files: list[Path]) -> tuple[str, dict[str, Any]]:
    options = {k: v for k, v in dataclasses.asdict(config).items() if k not in _NOT_OPTIONS}
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


def is_current(directory: Path, key: str) -> bool:
    manifest_path = directory / "manifest.json"
    if not manifest_path.is_file():
        return False
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError:
        return False
    if manifest.get("fingerprint") != key:
        return False
    model = directory / "spm.model"
    needed = [model, directory / "summary.json"] + [
        directory / f"{split}.{side}{ext}"
        for split in SPLITS
        for side in ("src", "tgt")
        for ext in (".npy", ".idx.npy")
    ]
    return all(p.is_file() for p in needed) and sha256_of(model) == manifest.get("vocab_sha256")


def _split_stats(
    pairs: list[Pair],
    ids: tuple[list[list[int]], list[list[int]]],
    read: int,
    dropped: Counter[str],
) -> dict[str, Any]:
    src_tokens = sum(map(len, ids[0]))
    tgt_tokens = sum(map(len, ids[1]))
    n = max(len(pairs), 1)
    return {
        "pairs_read": read,
        "pairs_kept": len(pairs),
        "dropped": dict(sorted(dropped.items())),
        "tokens_src": src_tokens,
        "tokens_tgt": tgt_tokens,
        "avg_len_src": round(src_tokens / n, 2),
        "avg_len_tgt": round(tgt_tokens / n, 2),
    }


def make_splits(
    config: DataConfig, raw: dict[str, list[Pair]], pivot: int | None
) -> tuple[dict[str, list[Pair]], dict[str, Any]]:
    """Raw pairs → train/valid/test: the source's own splits where it has them, a seeded
    split by unique ``pivot`` sentence for what it lacks (``pivot`` None: it lacks nothing).
    ``max_words`` and ``train_size`` apply to training data either way.

    Returns the splits and what happened before splitting (for the summary).
    """
    c = config
    pairs = raw["train"]
    level: dict[str, Any] = {"pairs_read": len(pairs)}
    dropped: Counter[str] = Counter()
    if c.max_words is not None:
        pairs, dropped["over_max_words"] = keep_short(pairs, c.max_words)
    given = [split for split in ("valid", "test") if split in raw]
    if pivot is None:  # dev and test are the source's own, scored as given
        splits = {**raw, "train": pairs}
        if c.train_size is not None and len(pairs) > c.train_size:
            keep = sorted(random.Random(c.split_seed).sample(range(len(pairs)), c.train_size))
            dropped["over_train_size"] = len(pairs) - c.train_size
            splits["train"] = [pairs[i] for i in keep]
        if not dropped:
            return splits, {}
    else:
        splits, split_drops = split_by_pivot(
            pairs,
            pivot=pivot,
            seed=c.split_seed,
            valid_size=0 if "valid" in given else c.valid_size,
            test_size=0 if "test" in given else c.test_size,
            train_size=c.train_size,
        )
        splits.update({split: raw[split] for split in given})
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


def raw_split(config: DataConfig, split: str) -> list[Pair]:
    """The pairs of one split exactly as ``prepare`` makes them, empty pairs dropped (what
    `wtnmt evaluate --corpus` scores), without building a vocabulary."""
    source = _source(config)
    splits, _ = make_splits(config, source.read(), source.pivot)
    if split not in splits:
        raise DataError(f"no split {split!r}: the splits are {', '.join(SPLITS)}")
    kept, _ = drop_empty_and_duplicates(splits[split], duplicates=False)
    return kept


def _reasons(dropped: Counter[str], corpus_level: dict[str, Any]) -> str:
    counts = Counter(corpus_level.get("dropped", {})) + dropped
    return ", ".join(f"{n:,} {reason.replace('_', ' ')}" for reason, n in counts.items() if n)


def _build(
    config: DataConfig,
    raw: dict[str, list[Pair]],
    pivot: int | None,
    out: Path,
    log: Callable[[str], None],
) -> dict[str, Any]:
    c = config
    raw, corpus_level = make_splits(config, raw, pivot)
    if "split" in corpus_level:
        log(f"splits: {corpus_level['split']}")
    read = {split: len(raw[split]) for split in SPLITS}
    kept: dict[str, list[Pair]] = {}
    dropped: dict[str, Counter[str]] = {}
    for split in SPLITS:  # duplicates only matter in train; dev and test are scored as given
        kept[split], dropped[split] = drop_empty_and_duplicates(
            raw[split], duplicates=c.drop_duplicates and split == "train"
        )
    if not kept["train"]:
        raise DataError(
            f"no training pairs left: {read['train']:,} read, all dropped "
            f"({_reasons(dropped['train'], corpus_level)}); check the training files"
        )
    log(
        f"training the shared {c.spm_model_type} vocabulary ({c.vocab_size} pieces) on "
        f"{len(kept['train']):,} pairs"
    )
    train_sentencepiece(
        (s for pair in kept["train"] for s in pair),
        out / "spm",
        vocab_size=c.vocab_size,
        model_type=c.spm_model_type,
        character_coverage=c.character_coverage,
        seed=c.spm_seed,
        max_sentences=c.spm_max_sentences,
    )
    vocab = Vocabulary(out / "spm.model")
    splits: dict[str, Any] = {}
    truncated: dict[str, int] = {}
    for split in SPLITS:
        pairs = kept[split]
        src_ids = vocab.encode([p[0] for p in pairs])
        tgt_ids = vocab.encode([p[1] for p in pairs])
        if split == "train":
            keep, long_drops = length_filter(
                [len(s) for s in src_ids],
                [len(t) for t in tgt_ids],
                max_tokens=c.max_tokens_per_side,
                max_ratio=c.max_length_ratio,
            )
            dropped[split].update(long_drops)
            if not keep:
                raise DataError(
                    f"no training pairs left: {read['train']:,} read, all dropped "
                    f"({_reasons(dropped['train'], corpus_level)}); see data.max_tokens_per_side "
                    f"and data.max_length_ratio"
                )
            pairs = [pairs[i] for i in keep]
            src_ids, tgt_ids = [src_ids[i] for i in keep], [tgt_ids[i] for i in keep]
        else:  # dev and test are kept whole as text (scored as given); their ids are cut to
            # max_tokens_per_side, as `wtnmt translate` cuts an over-long line, so that
            # validation never needs more positions than the model has
            cap = c.max_tokens_per_side
            long = sum(len(s) > cap or len(t) > cap for s, t in zip(src_ids, tgt_ids, strict=True))
            if long:
                truncated[split] = long
                log(f"{split}: {long} pairs over {cap} pieces a side, their ids cut to {cap}")
            src_ids, tgt_ids = [s[:cap] for s in src_ids], [t[:cap] for t in tgt_ids]
        write_ids(out / f"{split}.src", src_ids, len(vocab))
        write_ids(out / f"{split}.tgt", tgt_ids, len(vocab))
        if split != "train":
            for lang, side in ((c.src_lang, 0), (c.tgt_lang, 1)):
                text = "".join(p[side] + "\n" for p in pairs)
                (out / f"{split}.{lang}").write_text(text, encoding="utf-8")
        splits[split] = _split_stats(pairs, (src_ids, tgt_ids), read[split], dropped[split])
        if split in truncated:
            splits[split]["ids_truncated"] = truncated[split]
    return {"corpus": corpus_level, "vocab_size": len(vocab), "splits": splits}


def prepare(
    config: DataConfig,
    out: str | Path,
    *,
    log: Callable[[str], None] = print,
    force: bool = False,
) -> dict[str, Any]:
    """Build (or reuse) the prepared directory ``out`` for ``config``; returns the summary."""
    out = Path(out).resolve()  # `--out .` names the working directory, not an empty name
    check_output_directory(out)
    start = time.perf_counter()
    source = _source(config)
    key, manifest = fingerprint(config, source.files)
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
        summary = _build(config, raw, source.pivot, tmp, log)
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
            {"fingerprint": key, "vocab_sha256": sha256_of(tmp / "spm.model"), "files": files}
        )
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
        move_into_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as the table `wtnmt prepare` prints."""
    reasons = sorted({r for s in summary["splits"].values() for r in s["dropped"]})
    head = ["split", "read", "kept", *reasons, "src tokens", "tgt tokens", "avg src", "avg tgt"]
    rows = [head]
    for name, s in summary["splits"].items():
        rows.append(
            [
                name,
                f"{s['pairs_read']:,}",
                f"{s['pairs_kept']:,}",
                *(f"{s['dropped'].get(r, 0):,}" for r in reasons),
                f"{s['tokens_src']:,}",
                f"{s['tokens_tgt']:,}",
                f"{s['avg_len_src']:.1f}",
                f"{s['avg_len_tgt']:.1f}",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [
        "  ".join(
            cell.rjust(w) if i else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    corpus = summary.get("corpus") or {}
    out = []
    if corpus:
        drops = ", ".join(f"{k} {v:,}" for k, v in corpus.get("dropped", {}).items())
        out.append(
            f"corpus: {corpus['pairs_read']:,} pairs read; {corpus['split']}"
            + (f"; dropped before splitting: {drops}" if drops else "")
        )
    out += lines
    out.append(
        f"vocabulary: {summary['vocab_size']:,} shared pieces   "
        f"({summary['src_lang']}→{summary['tgt_lang']}, {summary['seconds']} s)"
    )
    out.append(f"data: {summary['attribution']}")
    return "\n".join(out)
