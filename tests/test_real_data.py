"""The real corpora in $WTNMT_DATA (skipped, with the reason, where they are absent)."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
from pathlib import Path

import pytest

from wtnmt.config import load_config
from wtnmt.data import ParallelData, prepare
from wtnmt.data.corpora import CORPORA, locate

DATA = os.environ.get("WTNMT_DATA")


def have(corpus: str) -> bool:
    if not DATA:
        return False
    directory = Path(DATA) / CORPORA[corpus].directory
    return all((directory / f.name).is_file() for f in CORPORA[corpus].files)


needs_tatoeba = pytest.mark.skipif(
    not have("tatoeba-deu-eng"),
    reason="set WTNMT_DATA to a folder with tatoeba-deu-eng/deu-eng.zip to run this test",
)
needs_multi30k = pytest.mark.skipif(
    not have("multi30k"), reason="set WTNMT_DATA to a folder with multi30k/*.gz to run this test"
)


def split_digest(directory: Path, split: str, langs: tuple[str, str]) -> str:
    digest = hashlib.sha256()
    for lang in langs:
        digest.update((directory / f"{split}.{lang}").read_bytes())
    return digest.hexdigest()


@needs_tatoeba
def test_tatoeba_split_is_disjoint_sized_and_stable(tmp_path):
    config = dataclasses.replace(load_config("weighted-small").data, vocab_size=2000)
    a = prepare(config, tmp_path / "a", log=lambda _: None)
    b = prepare(config, tmp_path / "b", log=lambda _: None)
    for split, size in (("train", 30_000), ("valid", 1_000), ("test", 1_000)):
        stats = a["splits"][split]
        assert stats["pairs_read"] == size
        assert stats["pairs_kept"] == size - sum(stats["dropped"].values())
    assert a["splits"]["test"]["pairs_kept"] == 1_000
    timings = {"seconds": a["seconds"], "seconds_by_step": a["seconds_by_step"]}
    assert a == {**b, **timings}  # the same counts, run after run
    for split in ("valid", "test"):
        assert split_digest(tmp_path / "a", split, ("en", "de")) == split_digest(
            tmp_path / "b", split, ("en", "de")
        )
    # no English sentence of dev or test has any translation in train: check on the raw zip
    held = set((tmp_path / "a" / "valid.en").read_text().splitlines())
    held |= set((tmp_path / "a" / "test.en").read_text().splitlines())
    assert len(held) == 2_000
    train = ParallelData(tmp_path / "a", "train")
    from wtnmt.data import Vocabulary

    vocab = Vocabulary(tmp_path / "a" / "spm.model")
    train_en = {vocab.decode(train.src[i].tolist()) for i in range(len(train))}
    assert not held & train_en


@needs_tatoeba
def test_tatoeba_reverse_direction_uses_the_same_english_pivot(tmp_path):
    config = dataclasses.replace(load_config("weighted-small").data, vocab_size=2000)
    prepare(config, tmp_path / "ende", log=lambda _: None)
    reverse = dataclasses.replace(config, src_lang="de", tgt_lang="en")
    prepare(reverse, tmp_path / "deen", log=lambda _: None)
    for split in ("valid", "test"):
        assert (tmp_path / "ende" / f"{split}.en").read_text() == (
            tmp_path / "deen" / f"{split}.en"
        ).read_text()


@needs_multi30k
@pytest.mark.parametrize("src, tgt", [("en", "de"), ("fr", "en")])
def test_multi30k_has_the_published_line_counts(tmp_path, src, tgt):
    config = dataclasses.replace(
        load_config("weighted-small").data,
        corpus="multi30k",
        src_lang=src,
        tgt_lang=tgt,
        vocab_size=4000,
        max_words=None,
    )
    summary = prepare(config, tmp_path / "m", log=lambda _: None)
    reads = {s: summary["splits"][s]["pairs_read"] for s in ("train", "valid", "test")}
    assert reads == {"train": 29_000, "valid": 1_014, "test": 1_000}
    assert summary["splits"]["test"]["pairs_kept"] == 1_000  # test is never filtered
    assert len((tmp_path / "m" / f"test.{tgt}").read_text().splitlines()) == 1_000


@needs_multi30k
def test_shared_files_pass_their_pinned_checksums():
    assert locate(CORPORA["multi30k"]) == Path(DATA) / "multi30k"


@needs_multi30k
def test_moses_pipeline_gives_the_data_sets_own_tokenized_references():
    """multi30k's README counts 12,103 words in its tokenized test_2016_flickr.de (lowercase,
    normalize-punctuation, tokenizer.perl): the reflen of the published 41.02 BLEU."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    from wtnmt.decode.evaluate import moses_bleu

    directory = locate(CORPORA["multi30k"])
    for split, lang, words in (("test_2016_flickr", "de", 12_103), ("val", "en", 13_308)):
        with gzip.open(directory / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()
        normalize, tokenize = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
        tokens = [tokenize.tokenize(normalize.normalize(s.lower())) for s in lines]
        assert sum(map(len, tokens)) == words
        assert moses_bleu(lines, lines, lang)["bleu_moses"] == 100.0
