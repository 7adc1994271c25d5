"""Corpora known by name: where their files are, how to fetch them, how to read them.

Where a named corpus's files come from, in order (SPEC §5):
  1. an explicit directory (``data.corpus_dir`` / ``--corpus-dir``),
  2. ``$WTNMT_DATA/<corpus directory>``,
  3. the user cache, ``$XDG_CACHE_HOME/wtnmt/<corpus directory>`` (``~/.cache/wtnmt``),
  4. the download address, into the user cache; ``$WTNMT_MIRROR`` replaces the addresses
     with ``$WTNMT_MIRROR/<corpus directory>/<file>`` (an internal mirror, or file:// in tests).
Files whose sha256 is pinned are checked wherever they are found; a mismatch is refused.
"""

from __future__ import annotations

import hashlib
import html
import os
import re
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wtnmt.data.io import (
    DataError,
    decode_lines,
    read_parallel,
    read_zip_member,
    split_tsv,
)
from wtnmt.data.stream import ArchivePairs, PairList, ParallelFiles

Pair = tuple[str, str]


@dataclass(frozen=True)
class RemoteFile:
    name: str  # file name inside the corpus directory
    url: str
    sha256: str | None = None  # pinned where the address serves one fixed file


@dataclass(frozen=True)
class Corpus:
    name: str
    directory: str
    files: tuple[RemoteFile, ...]
    languages: tuple[str, ...]
    attribution: str
    # (directory, src_lang, tgt_lang) → {"train"|"valid"|"test": raw pairs}; the training
    # pairs as a stream (data/stream.py), read again on each pass rather than held
    read: Callable[[Path, str, str], dict[str, Any]]
    has_standard_split: bool = True
    pivot: str | None = None  # language whose unique sentences define a seeded split


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "wtnmt"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check(path: Path, file: RemoteFile) -> None:
    if file.sha256 is not None:
        actual = sha256_of(path)
        if actual != file.sha256:
            raise DataError(
                f"{path}: sha256 {actual} does not match the pinned {file.sha256}: the file "
                "is damaged or another release; remove it and provide the right one"
            )


def download(url: str, dest: Path, *, sha256: str | None = None) -> Path:
    """Fetch ``url`` (http, https or file) to ``dest`` atomically, checking sha256 if pinned."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            for block in iter(lambda: response.read(1 << 20), b""):
                digest.update(block)
                out.write(block)
        if sha256 is not None and digest.hexdigest() != sha256:
            raise DataError(
                f"{url}: downloaded file has sha256 {digest.hexdigest()}, expected the pinned "
                f"{sha256}; refusing it"
            )
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def locate(corpus: Corpus, *, explicit: str | Path | None = None) -> Path:
    """The directory holding every file of ``corpus``, downloading into the cache if needed."""
    candidates: list[tuple[str, Path]] = []
    if explicit is not None:
        candidates.append(("the explicit corpus directory", Path(explicit)))
    if os.environ.get("WTNMT_DATA"):
        candidates.append(("$WTNMT_DATA", Path(os.environ["WTNMT_DATA"]) / corpus.directory))
    cache = cache_root() / corpus.directory
    candidates.append(("the user cache", cache))
    for _, directory in candidates:
        if all((directory / f.name).is_file() for f in corpus.files):
            for f in corpus.files:
                _check(directory / f.name, f)
            return directory
    mirror = os.environ.get("WTNMT_MIRROR")
    try:
        for f in corpus.files:
            target = cache / f.name
            if target.is_file():
                _check(target, f)
                continue
            url = f"{mirror.rstrip('/')}/{corpus.directory}/{f.name}" if mirror else f.url
            download(url, target, sha256=f.sha256)
    except (urllib.error.URLError, OSError) as e:
        looked = "; ".join(f"{what} {path}" for what, path in candidates)
        names = ", ".join(f.name for f in corpus.files)
        raise DataError(  # one line, as every error the command line reports
            f"corpus {corpus.name!r}: its files ({names}) are not on this machine and the "
            f"download failed ({str(e).strip()}); looked in {looked}. Provide the files in "
            f"one of those directories (set WTNMT_DATA to a folder holding "
            f"{corpus.directory}/), or pass the directory explicitly, or set WTNMT_MIRROR to "
            f"a mirror's address"
        ) from None
    return cache


# --------------------------------------------------------------------------------------------
# Readers


def _orient(pairs: list[Pair], first: str, src: str, tgt: str) -> list[Pair]:
    """Pairs stored as (first, other) → (src, tgt)."""
    return pairs if src == first else [(b, a) for a, b in pairs]


def _read_tatoeba(directory: Path, src: str, tgt: str) -> dict[str, Any]:
    """deu-eng.zip as manythings.org serves it: ``deu.txt`` with English<TAB>German, and in
    newer releases a third column of attribution. Everything is 'train': no standard split."""
    path = directory / "deu-eng.zip"
    rows = split_tsv(
        decode_lines(read_zip_member(path, "deu.txt"), f"{path}:deu.txt"),
        f"{path}:deu.txt",
        columns=(2, 3),
    )
    return {"train": PairList(_orient([(r[0], r[1]) for r in rows], "en", src, tgt))}


def _read_multi30k(directory: Path, src: str, tgt: str) -> dict[str, Any]:
    splits: dict[str, Any] = {
        ours: read_parallel(directory / f"{theirs}.{src}.gz", directory / f"{theirs}.{tgt}.gz")
        for ours, theirs in (("valid", "val"), ("test", "test_2016_flickr"))
    }
    return {
        "train": ParallelFiles(directory / f"train.{src}.gz", directory / f"train.{tgt}.gz"),
        **splits,
    }


_SEG = re.compile(r"<seg[^>]*>(.*)</seg>\s*$")


def _sgm_lines(data: bytes, name: str) -> list[str]:
    """The sentences of an SGML test set (``<seg id=...>text</seg>``), entities decoded."""
    return [
        html.unescape(m.group(1).strip())
        for line in decode_lines(data, name)
        if (m := _SEG.search(line))
    ]


def _archive_member(archive: Path, member: str) -> bytes:
    try:
        with tarfile.open(archive) as tar:
            handle = tar.extractfile(member)
            if handle is None:
                raise KeyError(member)
            data = handle.read()
    except KeyError:
        raise DataError(f"{archive}: the archive has no member {member!r}") from None
    except (tarfile.TarError, OSError) as e:
        raise DataError(f"{archive}: not a readable tar archive ({e})") from None
    if member.endswith(".gz"):
        import gzip

        data = gzip.decompress(data)
    return data


def _wmt14_reader(other: str, train: tuple[tuple[str, str], ...]):  # type: ignore[no-untyped-def]
    """WMT14 en-{other}: the parallel training corpora, newstest2013 (valid), newstest2014."""

    def read(directory: Path, src: str, tgt: str) -> dict[str, Any]:
        members = [
            (directory / archive, stem.format(lang=src), stem.format(lang=tgt))
            for archive, stem in train
        ]
        dev = directory / "dev.tgz"
        valid = list(
            zip(
                decode_lines(_archive_member(dev, "dev/newstest2013.en"), "newstest2013.en"),
                decode_lines(
                    _archive_member(dev, f"dev/newstest2013.{other}"), f"newstest2013.{other}"
                ),
                strict=True,
            )
        )
        test_archive = directory / "test-full.tgz"
        code = f"{other}en"
        test_src = _archive_member(test_archive, f"test-full/newstest2014-{code}-src.en.sgm")
        test_ref = _archive_member(test_archive, f"test-full/newstest2014-{code}-ref.{other}.sgm")
        test = list(
            zip(
                _sgm_lines(test_src, "newstest2014 en"),
                _sgm_lines(test_ref, f"newstest2014 {other}"),
                strict=True,
            )
        )
        return {
            "train": ArchivePairs(members),
            **{name: _orient(p, "en", src, tgt) for name, p in (("valid", valid), ("test", test))},
        }

    return read


_MULTI30K_URL = (
    "https://raw.githubusercontent.com/multi30k/dataset/"
    "a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw/{}"
)
_MULTI30K_SHA = {
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}
_WMT = "http://statmt.org/{}"


def _wmt14(other: str, language: str, extra: tuple[tuple[str, str, str], ...] = ()) -> Corpus:
    """WMT14 English-{other}: Europarl v7, Common Crawl and News Commentary v9 (+ ``extra``:
    archive, statmt.org folder, member pattern), newstest2013 as dev, newstest2014 as test."""
    train = (
        ("training-parallel-europarl-v7.tgz", "wmt13", f"training/europarl-v7.{other}-en.{{lang}}"),
        ("training-parallel-commoncrawl.tgz", "wmt13", f"commoncrawl.{other}-en.{{lang}}"),
        (
            "training-parallel-nc-v9.tgz",
            "wmt14",
            f"training/news-commentary-v9.{other}-en.{{lang}}",
        ),
        *extra,
    )
    archives = [(name, folder) for name, folder, _ in train]
    archives += [("dev.tgz", "wmt14"), ("test-full.tgz", "wmt14")]
    return Corpus(
        name=f"wmt14-en-{other}",
        directory=f"wmt14-en-{other}",
        files=tuple(RemoteFile(name, _WMT.format(f"{folder}/{name}")) for name, folder in archives),
        languages=("en", other),
        attribution=f"WMT14 English-{language} (statmt.org/wmt14); see each corpus's terms.",
        read=_wmt14_reader(other, tuple((name, member) for name, _, member in train)),
    )


CORPORA: dict[str, Corpus] = {
    "tatoeba-deu-eng": Corpus(
        name="tatoeba-deu-eng",
        directory="tatoeba-deu-eng",
        # not pinned: manythings.org replaces the file with each release
        files=(RemoteFile("deu-eng.zip", "http://www.manythings.org/anki/deu-eng.zip"),),
        languages=("en", "de"),
        attribution=(
            "Tatoeba English-German sentence pairs, CC-BY 2.0. Attribution: "
            "www.manythings.org/anki and tatoeba.org."
        ),
        read=_read_tatoeba,
        has_standard_split=False,
        pivot="en",
    ),
    "multi30k": Corpus(
        name="multi30k",
        directory="multi30k",
        files=tuple(
            RemoteFile(n, _MULTI30K_URL.format(n), sha) for n, sha in _MULTI30K_SHA.items()
        ),
        languages=("en", "de", "fr"),
        attribution=(
            "Multi30k task 1 (Elliott et al., 2016), github.com/multi30k/dataset; "
            "for research and education."
        ),
        read=_read_multi30k,
    ),
    "wmt14-en-de": _wmt14("de", "German"),
    "wmt14-en-fr": _wmt14(
        "fr",
        "French",
        extra=(  # the two large corpora of the English-French task
            ("training-parallel-un.tgz", "wmt13", "un/undoc.2000.fr-en.{lang}"),
            ("training-giga-fren.tar", "wmt10", "giga-fren.release2.fixed.{lang}.gz"),
        ),
    ),
}


def get_corpus(name: str) -> Corpus:
    if name not in CORPORA:
        raise DataError(f"unknown corpus {name!r}: known corpora are {', '.join(CORPORA)}")
    return CORPORA[name]


def locate_corpus(
    name: str, src: str, tgt: str, *, explicit: str | Path | None = None
) -> tuple[Corpus, Path]:
    """Check the language pair and find (or fetch) the corpus's directory."""
    corpus = get_corpus(name)
    for lang in (src, tgt):
        if lang not in corpus.languages:
            raise DataError(
                f"corpus {name!r} has languages {', '.join(corpus.languages)}, not {lang!r}"
            )
    if src == tgt:
        raise DataError(f"source and target language are both {src!r}")
    return corpus, locate(corpus, explicit=explicit)


__all__ = ["CORPORA", "Corpus", "RemoteFile", "download", "get_corpus", "locate", "locate_corpus"]
