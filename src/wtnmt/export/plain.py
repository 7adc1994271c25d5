"""What the exports to fixed architectures (CTranslate2's Transformer spec, Hugging Face's
Marian) share: the plain Transformer they map, the run's vocabulary as pieces under wtnmt's
special names, and the new or empty folder they write into."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from wtnmt.errors import CheckpointError

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]  # wtnmt's ids 0-3 (wtnmt.special)


def departures(model_config) -> list[str]:  # type: ignore[no-untyped-def]
    """The settings in which a run's model differs from the plain post-norm Transformer with
    sinusoidal positions and top-layer encoder output (``[]``: it is one); a Weighted
    Transformer's branched layers first."""
    m = model_config
    found = {
        "model.attention: branched": m.attention != "multihead",
        "model.norm: pre": m.norm != "post",
        "model.positions: learned": m.positions != "sinusoidal",
        "model.encoder_combination: transparent": m.encoder_combination != "top",
        "model.decoder_self_attention: weighted": m.decoder_self_attention != "multihead",
    }
    return [name for name, present in found.items() if present]


def pieces(vocab) -> list[str]:  # type: ignore[no-untyped-def]
    """A vocabulary's pieces by id, its first four named as wtnmt's specials."""
    out = [vocab.sp.id_to_piece(i) for i in range(len(vocab))]
    out[: len(SPECIALS)] = SPECIALS
    return out


def check_new_or_empty(out: Path) -> None:
    """An export writes only into a new or empty folder: a CheckpointError otherwise."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"--out {out}: exists and is not an empty directory")


@contextlib.contextmanager
def written_whole(out: Path) -> Iterator[Path]:
    """A work folder beside ``out`` (new or empty: ``check_new_or_empty``) that becomes ``out``
    when the block ends, and is removed if it fails: ``out`` is written whole or not at all."""
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.{os.getpid()}.", dir=out.parent))
    try:
        yield work
        if out.is_dir():
            out.rmdir()  # (empty: checked before)
        work.rename(out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


__all__ = ["SPECIALS", "check_new_or_empty", "departures", "pieces", "written_whole"]
