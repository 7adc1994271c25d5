"""Named corpora: Tatoeba's zips, where a corpus is looked for, downloads against pinned
checksums, and the WMT14 recipe from a mirror of its archives."""

from __future__ import annotations

import gzip
import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from helpers import sentence, translate
from wtnmt.config import DataConfig
from wtnmt.data import DataError, prepare
from wtnmt.data.corpora import CORPORA, download, locate, sha256_of


def tatoeba_zip(path: Path, rows: list[str]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("deu.txt", "".join(r + "\n" for r in rows))
        z.writestr("_about.txt", "about")


@pytest.mark.parametrize("columns", [2, 3])
def test_tatoeba_zip_with_two_or_three_columns(tmp_path, monkeypatch, columns):
    rows = []
    for i in range(120):
        en = sentence(i, 2 + i % 5)
        for k in range(1 + i % 3):  # several translations of one English sentence
            row = f"{en}\t{translate(en)} {k}"
            rows.append(
                row + ("\tCC-BY 2.0 (France) Attribution: tatoeba.org #1" if columns == 3 else "")
            )
    corpus_dir = tmp_path / "tatoeba-deu-eng"
    corpus_dir.mkdir()
    tatoeba_zip(corpus_dir / "deu-eng.zip", rows)
    monkeypatch.setenv("WTNMT_DATA", str(tmp_path))
    config = DataConfig(
        corpus="tatoeba-deu-eng",
        src_lang="de",
        tgt_lang="en",
        valid_size=5,
        test_size=5,
        vocab_size=60,
    )
    summary = prepare(config, tmp_path / "out", log=lambda _: None)
    assert summary["splits"]["valid"]["pairs_kept"] == 5
    test_en = (tmp_path / "out" / "test.en").read_text().splitlines()
    test_de = (tmp_path / "out" / "test.de").read_text().splitlines()
    assert all(d.startswith(translate(e)) for e, d in zip(test_en, test_de, strict=True))


def test_a_bad_tatoeba_line_is_named(tmp_path, monkeypatch):
    (tmp_path / "tatoeba-deu-eng").mkdir()
    tatoeba_zip(tmp_path / "tatoeba-deu-eng" / "deu-eng.zip", ["a\tb", "c\td", "no tab here"])
    monkeypatch.setenv("WTNMT_DATA", str(tmp_path))
    with pytest.raises(DataError, match=r"deu\.txt: line 3 has 1 tab-separated columns"):
        prepare(DataConfig(), tmp_path / "out", log=lambda _: None)


def test_missing_corpus_error_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("WTNMT_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("WTNMT_MIRROR", (tmp_path / "nowhere").as_uri())
    with pytest.raises(DataError) as e:
        locate(CORPORA["multi30k"])
    message = str(e.value)
    assert "$WTNMT_DATA" in message and str(tmp_path / "data" / "multi30k") in message
    assert str(tmp_path / "cache" / "wtnmt" / "multi30k") in message
    assert "set WTNMT_DATA" in message


def test_file_url_download_and_checksum(tmp_path):
    source = tmp_path / "served.bin"
    source.write_bytes(b"payload")
    digest = sha256_of(source)
    got = download(source.as_uri(), tmp_path / "dl" / "file.bin", sha256=digest)
    assert got.read_bytes() == b"payload"
    with pytest.raises(DataError, match="refusing it"):
        download(source.as_uri(), tmp_path / "dl" / "other.bin", sha256="0" * 64)
    assert not (tmp_path / "dl" / "other.bin").exists()
    assert list((tmp_path / "dl").iterdir()) == [got]  # no partial file left


def test_pinned_checksum_refuses_a_wrong_multi30k_file(tmp_path, monkeypatch):
    mirror = tmp_path / "mirror" / "multi30k"
    mirror.mkdir(parents=True)
    for f in CORPORA["multi30k"].files:
        (mirror / f.name).write_bytes(gzip.compress(b"not the real file\n"))
    monkeypatch.delenv("WTNMT_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("WTNMT_MIRROR", (tmp_path / "mirror").as_uri())
    with pytest.raises(DataError, match="expected the pinned"):
        locate(CORPORA["multi30k"])


def _tgz(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_wmt14_recipe_from_a_file_mirror(tmp_path, monkeypatch):
    """The download and reading of WMT14 en-de, against a local file:// mirror of the
    archives' layout (the real archives cannot be fetched on this project's machines)."""
    mirror = tmp_path / "mirror" / "wmt14-en-de"
    mirror.mkdir(parents=True)
    pair = {"en": b"a house\nthe cat\n", "de": b"ein Haus\ndie Katze\n"}
    _tgz(
        mirror / "training-parallel-europarl-v7.tgz",
        {f"training/europarl-v7.de-en.{k}": v for k, v in pair.items()},
    )
    _tgz(
        mirror / "training-parallel-commoncrawl.tgz",
        {f"commoncrawl.de-en.{k}": v for k, v in pair.items()},
    )
    _tgz(
        mirror / "training-parallel-nc-v9.tgz",
        {f"training/news-commentary-v9.de-en.{k}": v for k, v in pair.items()},
    )
    _tgz(mirror / "dev.tgz", {f"dev/newstest2013.{k}": v for k, v in pair.items()})
    sgm = '<srcset>\n<doc>\n<seg id="1">A &amp; B</seg>\n<seg id="2">C</seg>\n</doc>\n'
    _tgz(
        mirror / "test-full.tgz",
        {
            "test-full/newstest2014-deen-src.en.sgm": sgm.encode(),
            "test-full/newstest2014-deen-ref.de.sgm": sgm.replace("B", "Bé").encode(),
        },
    )
    monkeypatch.delenv("WTNMT_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("WTNMT_MIRROR", (tmp_path / "mirror").as_uri())
    corpus = CORPORA["wmt14-en-de"]
    directory = locate(corpus)
    assert directory == tmp_path / "cache" / "wtnmt" / "wmt14-en-de"
    raw = corpus.read(directory, "de", "en")
    assert raw["train"].pairs() == [("ein Haus", "a house"), ("die Katze", "the cat")] * 3
    assert raw["test"] == [("A & Bé", "A & B"), ("C", "C")]
    assert locate(corpus) == directory  # found in the cache the second time
