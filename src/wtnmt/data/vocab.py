"""The shared subword vocabulary: one sentencepiece model for both languages (paper §4.1).

Special ids are fixed for every model (see ``wtnmt.special``): 0 <pad>, 1 <s>, 2 </s>,
3 <unk>. BPE by default, as the paper; ``unigram`` as an option.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TextIO

import sentencepiece as spm

from wtnmt.data.io import DataError
from wtnmt.special import BOS, EOS, PAD, UNK


def train_sentencepiece(
    sentences: Iterable[str],
    model_prefix: Path,
    *,
    vocab_size: int,
    model_type: str,
    character_coverage: float,
    seed: int,
    max_sentences: int,
    threads: int = 2,
    verbose: bool = False,
) -> Path:
    """Train on ``sentences`` (the training side of both languages, or of one) →
    ``<prefix>.model``: on a seeded sample of ``max_sentences`` of them where there are more
    (SentencePiece's reservoir sampling, which holds the sample, never the whole stream).
    ``verbose``: SentencePiece logs its steps on stderr (``stderr_lines`` reads them)."""
    spm.set_random_generator_seed(seed)  # the sentence sample below is drawn from it
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_prefix=str(model_prefix),
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            pad_id=PAD,
            bos_id=BOS,
            eos_id=EOS,
            unk_id=UNK,
            pad_piece="<pad>",
            bos_piece="<s>",
            eos_piece="</s>",
            unk_piece="<unk>",
            input_sentence_size=max_sentences,
            shuffle_input_sentence=True,
            num_threads=threads,
            minloglevel=0 if verbose else 2,
        )
    except RuntimeError as e:
        raise DataError(
            f"sentencepiece could not build a vocabulary of {vocab_size} pieces from the "
            f"training data ({e}); lower data.vocab_size (--vocab-size)"
        ) from None
    return model_prefix.with_name(model_prefix.name + ".model")


@contextlib.contextmanager
def stderr_lines(on_line: Callable[[bytes], None]) -> Iterator[TextIO]:
    """File descriptor 2, where SentencePiece's C++ code logs, read line by line into
    ``on_line`` by a thread; yields a file on what fd 2 was before (the terminal), for what
    should still reach it meanwhile (progress bars)."""
    sys.stderr.flush()
    saved = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def forward() -> None:
        with os.fdopen(read_end, "rb") as lines:
            for line in lines:
                on_line(line)

    reader = threading.Thread(target=forward, daemon=True)
    reader.start()
    terminal = os.fdopen(os.dup(saved), "w")
    try:
        yield terminal
    finally:
        os.dup2(saved, 2)  # the pipe's last writer closed: the reader reaches its end
        os.close(saved)
        reader.join()
        terminal.close()


def vocabulary_sha256(path: str | Path) -> str:
    """sha256 of what decides the ids of a sentencepiece model: every piece with its score
    and kind, in id order. Unlike the file's bytes it does not change with the paths the
    trainer recorded (a rebuild of the same data in another temporary directory gives
    another file but the same vocabulary)."""
    try:
        sp = spm.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as e:
        raise DataError(f"{path}: not a readable sentencepiece model ({e})") from None
    digest = hashlib.sha256()
    for i in range(sp.get_piece_size()):
        kind = "".join(
            "1" if test(i) else "0"
            for test in (sp.is_control, sp.is_unknown, sp.is_unused, sp.is_byte)
        )
        digest.update(f"{sp.id_to_piece(i)}\t{sp.get_score(i)!r}\t{kind}\n".encode())
    return digest.hexdigest()


class Vocabulary:
    """A trained sentencepiece model: text ↔ ids, with the fixed special ids."""

    def __init__(self, model_file: str | Path) -> None:
        self.path = Path(model_file)
        if not self.path.is_file():
            raise DataError(f"{self.path}: no sentencepiece model there")
        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(self.path))
        except (RuntimeError, OSError) as e:  # sentencepiece's word for a damaged file
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise DataError(f"{self.path}: not a readable sentencepiece model ({reason})") from None
        specials = (self.sp.pad_id(), self.sp.bos_id(), self.sp.eos_id(), self.sp.unk_id())
        if specials != (PAD, BOS, EOS, UNK):
            raise DataError(
                f"{self.path}: special ids (pad, bos, eos, unk) are {specials}, wtnmt needs "
                f"{(PAD, BOS, EOS, UNK)}"
            )

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, sentences: Sequence[str]) -> list[list[int]]:
        """Sentences → piece ids, without BOS/EOS (added when batching)."""
        return self.sp.encode(list(sentences), out_type=int, num_threads=2)

    def decode(self, ids: Sequence[int]) -> str:
        """Piece ids → detokenised text; special ids are skipped."""
        return self.sp.decode([i for i in ids if i > UNK or i == UNK])


# ------------------------------------------------------------------------ one or two of them
def vocabulary_files(joint: bool) -> tuple[str, ...]:
    """The sentencepiece models of a prepared directory or a run: one shared by both
    languages (``data.joint_vocab``, the paper's), or the source's and the target's."""
    return ("spm.model",) if joint else ("spm.src.model", "spm.tgt.model")


# every vocabulary file a run or a prepared directory may hold
ALL_VOCABULARY_FILES = (*vocabulary_files(True), *vocabulary_files(False))


def holds_joint(directory: Path) -> bool:
    """Whether ``directory`` holds one vocabulary for both languages (else one a language):
    what a run has, where its config is not at hand."""
    return not (directory / vocabulary_files(False)[0]).is_file()


def vocabularies_sha256(directory: Path, joint: bool, *, pieces: bool = True) -> str:
    """The hash a run records of its vocabularies: ``vocabulary_sha256`` of the pieces (or
    with ``pieces=False`` the files' bytes) of the one shared model, as ever; of two, one
    hash over both, source first."""
    from wtnmt.data.corpora import sha256_of

    digest = vocabulary_sha256 if pieces else sha256_of
    hashes = [digest(directory / name) for name in vocabulary_files(joint)]
    if joint:
        return hashes[0]
    return hashlib.sha256("\n".join(hashes).encode()).hexdigest()


def given_vocabularies(directory: str | Path, joint: bool) -> list[Path]:
    """The SentencePiece model(s) of ``data.vocab_from`` (a run or a prepared folder) that
    ``data.joint_vocab`` asks for; a DataError naming the folder and what it holds otherwise."""
    folder = Path(directory)
    if not folder.is_dir():
        raise DataError(f"data.vocab_from={str(directory)!r}: no such directory")
    names = vocabulary_files(joint)
    if all((folder / name).is_file() for name in names):
        return [folder / name for name in names]
    other = vocabulary_files(not joint)
    if all((folder / name).is_file() for name in other):
        raise DataError(
            f"data.vocab_from={str(directory)!r} holds {' and '.join(other)} (data.joint_vocab: "
            f"{str(not joint).lower()}), this config asks for {' and '.join(names)}: set "
            f"data.joint_vocab: {str(not joint).lower()}"
        )
    raise DataError(
        f"data.vocab_from={str(directory)!r}: no {' and '.join(names)} there (a wtnmt run or "
        f"prepared data folder holds them)"
    )


def vocabularies_from(directory: str | Path, out: Path, joint: bool) -> Vocabularies:
    """``given_vocabularies`` of ``directory`` copied into ``out``, loaded."""
    import shutil

    for path in given_vocabularies(directory, joint):
        shutil.copyfile(path, out / path.name)
    return Vocabularies.load(out, joint)


class Vocabularies:
    """The source's and the target's vocabulary: the same object where they are shared."""

    def __init__(self, source: Vocabulary, target: Vocabulary) -> None:
        self.source, self.target = source, target
        self.directory = target.path.parent

    @property
    def joint(self) -> bool:
        return self.source is self.target

    @property
    def source_size(self) -> int | None:
        """The source's pieces where it has a vocabulary (and embedding) of its own."""
        return None if self.joint else len(self.source)

    @classmethod
    def load(cls, directory: Path, joint: bool) -> Vocabularies:
        """The vocabularies ``vocabulary_files`` names in ``directory``."""
        found = [Vocabulary(directory / name) for name in vocabulary_files(joint)]
        return cls(found[0], found[-1])

    @classmethod
    def found(cls, directory: Path, joint: bool) -> Vocabularies | None:
        """``load``, or None where ``directory`` lacks one of the files (pre-tokenised data)."""
        names = vocabulary_files(joint)
        return cls.load(directory, joint) if all((directory / n).is_file() for n in names) else None


def vocabulary_hashes(vocab: Vocabularies | None) -> dict[str, str | None]:
    """What a checkpoint records of the vocabularies (None: trained without one): the
    sha256 of the files' bytes, and of their pieces (what a resume checks)."""
    if vocab is None:
        return {"vocab_sha256": None, "vocabulary_sha256": None}
    return {
        "vocab_sha256": vocabularies_sha256(vocab.directory, vocab.joint, pieces=False),
        "vocabulary_sha256": vocabularies_sha256(vocab.directory, vocab.joint),
    }
