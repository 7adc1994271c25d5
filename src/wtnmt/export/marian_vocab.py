"""A Marian folder's vocabularies in wtnmt's id space (`wtnmt import hf`).

Marian's tokenizer segments with a SentencePiece model (``source.spm``, ``target.spm``) and
then looks each piece up in ``vocab.json`` (and ``target_vocab.json`` where the vocabularies
are separate): Marian's ids are the JSON's, ``</s>`` usually 0, ``<unk>`` 1, ``<pad>`` last,
and a piece the JSON lacks reads as ``<unk>``. wtnmt's ids are the SentencePiece model's own,
with its specials fixed at 0-3 (wtnmt.special). So the import writes each SentencePiece model
anew, its pieces reordered (their scores and kinds unchanged, so the segmentation is the same)
to give every piece the id the vocabulary's order gives it:

    0 <pad>   Marian's padding             1 <s>     the decoder's start (Marian's start token)
    2 </s>    Marian's end of sentence     3 <unk>   Marian's unknown
    4 …       the JSON's other pieces, in Marian's order
    then      the pieces the source's SentencePiece model has and the JSON lacks (``extras``)

A piece of the JSON that a side's model lacks is ``UNUSED`` in that model (never produced
by its segmentation, as in Marian, and decoded to its text). An extra keeps its place in the
source's segmentation, as in Marian; the weights (hf_import.py) read it as ``<unk>`` and never
generate it, nor ``<s>``, which Marian's vocabulary does not have. The target's model never
makes a piece its vocabulary lacks (it is left out, or ``UNUSED``): a fine-tune's targets are
then pieces the model can generate, where Marian's tokenizer gives ``<unk>``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from wtnmt.errors import CheckpointError
from wtnmt.special import BOS, EOS, PAD, UNK

NAMES = {PAD: "<pad>", BOS: "<s>", EOS: "</s>", UNK: "<unk>"}


@dataclass(frozen=True)
class MarianVocabulary:
    """One side's id space: ``rows[w]`` is the Marian id whose embedding row and output bias
    wtnmt's id ``w`` takes (``None``: no Marian row, an extra or ``<s>``); ``pieces[w]`` its
    piece."""

    pieces: list[str]
    rows: list[int | None]
    start: int  # Marian's decoder start id (wtnmt's <s> takes its embedding row)
    unk: int  # Marian's <unk> id (what an extra reads as)

    def __len__(self) -> int:
        return len(self.pieces)

    @property
    def extras(self) -> frozenset[str]:
        """The pieces Marian reads as <unk> (a source model's, its vocabulary lacks)."""
        start = len(NAMES)
        return frozenset(
            p for p, row in zip(self.pieces[start:], self.rows[start:], strict=True) if row is None
        )


def read_json_vocab(path: Path) -> dict[str, int]:
    """A Marian ``vocab.json``: piece → id, the ids 0 … n−1 each once."""
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable vocabulary ({e})") from None
    if not isinstance(table, dict) or sorted(table.values()) != list(range(len(table))):
        raise CheckpointError(f"{path}: the ids of a vocabulary are 0 … n−1, each once")
    return table


def spm_pieces(model: bytes) -> dict[str, tuple[float, int]]:
    """The pieces a SentencePiece model segments into: piece → (score, kind), its
    specials (control, unknown) left out."""
    proto = _proto(model)
    kinds = type(proto.pieces[0])
    skip = (kinds.CONTROL, kinds.UNKNOWN)
    return {p.piece: (p.score, p.type) for p in proto.pieces if p.type not in skip}


def id_space(
    table: dict[str, int],
    source_pieces: dict[str, tuple[float, int]],
    *,
    pad: int,
    eos: int,
    start: int,
    where: str,
) -> MarianVocabulary:
    """wtnmt's ids of the Marian ``table`` (a vocab.json), with the pieces of the source's
    SentencePiece model (``source_pieces``, ``spm_pieces``'s; {} for a target's own table)
    that it lacks as extras: the order of the module docstring."""
    by_id = sorted(table, key=table.__getitem__)
    unk = table.get("<unk>")
    if unk is None:
        raise CheckpointError(f"{where}: no <unk> in the vocabulary")
    fixed = {pad: PAD, eos: EOS, unk: UNK}
    if len(fixed) < 3:
        raise CheckpointError(f"{where}: <pad>, </s> and <unk> are not three different ids")
    pieces, rows = [NAMES[i] for i in range(len(NAMES))], [pad, None, eos, unk]
    for marian_id, piece in enumerate(by_id):
        if marian_id in fixed:
            continue
        if piece in NAMES.values():
            raise CheckpointError(
                f"{where}: the vocabulary's piece {piece!r} (id {marian_id}) is not Marian's "
                f"padding, end or unknown: wtnmt keeps that name for its own special"
            )
        pieces.append(piece)
        rows.append(marian_id)
    known = set(pieces)
    for piece in source_pieces:
        if piece not in known:
            pieces.append(piece)
            rows.append(None)
    return MarianVocabulary(pieces=pieces, rows=rows, start=start, unk=unk)


def rewritten_spm(model: bytes, pieces: list[str], unused: frozenset[str] = frozenset()) -> bytes:
    """The SentencePiece ``model`` with its pieces in the order ``pieces`` gives (wtnmt's
    specials at 0-3, each piece's score and kind kept; a piece it lacks, or of ``unused``,
    ``UNUSED``)."""
    proto = _proto(model)
    kinds = type(proto.pieces[0])
    own = {p.piece: (p.score, p.type) for p in proto.pieces}
    specials = {"<pad>": kinds.CONTROL, "<s>": kinds.CONTROL, "</s>": kinds.CONTROL}
    del proto.pieces[:]
    for i, piece in enumerate(pieces):
        entry = proto.pieces.add()
        entry.piece = piece
        if i < len(NAMES):
            entry.score, entry.type = 0.0, specials.get(piece, kinds.UNKNOWN)
        elif (
            piece in own
            and piece not in unused
            and own[piece][1]
            not in (
                kinds.CONTROL,
                kinds.UNKNOWN,
            )
        ):
            entry.score, entry.type = own[piece]
        else:
            entry.score, entry.type = 0.0, kinds.UNUSED
    spec = proto.trainer_spec
    spec.vocab_size = len(pieces)
    spec.pad_id, spec.bos_id, spec.eos_id, spec.unk_id = PAD, BOS, EOS, UNK
    spec.pad_piece, spec.bos_piece, spec.eos_piece, spec.unk_piece = (
        NAMES[PAD],
        NAMES[BOS],
        NAMES[EOS],
        NAMES[UNK],
    )
    return bytes(proto.SerializeToString())


def _proto(model: bytes):  # type: ignore[no-untyped-def]
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError as e:  # (it needs protobuf)
        raise CheckpointError(f"import hf needs protobuf: pip install 'wtnmt[hf]' ({e})") from None
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(model)
    except Exception as e:  # protobuf's DecodeError
        raise CheckpointError(f"not a SentencePiece model ({e})") from None
    if not proto.pieces:
        raise CheckpointError("not a SentencePiece model (no pieces)")
    return proto


__all__ = ["MarianVocabulary", "id_space", "read_json_vocab", "rewritten_spm", "spm_pieces"]
