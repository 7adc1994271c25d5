"""Token-id arrays of a prepared split, memory-mapped, and their collation into batches.

On disk, per split and side: ``{split}.{side}.npy`` (all ids concatenated, uint16 when the
vocabulary fits, else int32) and ``{split}.{side}.idx.npy`` (int64 offsets, n + 1 entries).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from wtnmt.data.io import DataError
from wtnmt.special import BOS, EOS, PAD

if TYPE_CHECKING:  # torch is imported where batches are made: `wtnmt prepare` needs none of it
    from torch import Tensor


def flatten(sequences: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Id sequences → all ids concatenated (int32) and each sequence's length."""
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    flat = np.fromiter(chain.from_iterable(sequences), dtype=np.int32, count=int(lengths.sum()))
    return flat, lengths


def write_ids(path_stem: Path, sequences: list[list[int]], vocab_size: int) -> None:
    with IdWriter(path_stem, vocab_size) as out:
        out.append(*flatten(sequences))


class _NpyStream:
    """A one-dimensional .npy file written piece by piece: its header, whose shape is only
    known at the end, is written then into the room reserved for it at the start."""

    HEADER = 128  # bytes: magic, version, length and the padded header text

    def __init__(self, path: str, dtype: np.dtype) -> None:
        self.path, self.dtype, self.count = path, np.dtype(dtype), 0
        self.file = open(path, "wb")
        self.file.write(b"\0" * self.HEADER)

    def write(self, values: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(values, dtype=self.dtype).tobytes())
        self.count += len(values)

    def close(self) -> None:
        text = repr({"descr": self.dtype.str, "fortran_order": False, "shape": (self.count,)})
        room = self.HEADER - 10  # after the magic string, the version and the length
        header = text.encode("latin1").ljust(room - 1) + b"\n"
        self.file.seek(0)
        self.file.write(b"\x93NUMPY\x01\x00" + room.to_bytes(2, "little") + header)
        self.file.close()


class IdWriter:
    """``write_ids``'s two files, appended to chunk by chunk (``append(flat, lengths)``), so
    that a split of any size is written without being held; complete once closed."""

    def __init__(self, path_stem: Path, vocab_size: int) -> None:
        dtype = np.uint16 if vocab_size <= np.iinfo(np.uint16).max else np.int32
        self.ids = _NpyStream(f"{path_stem}.npy", dtype)
        self.offsets = _NpyStream(f"{path_stem}.idx.npy", np.int64)
        self.offsets.write(np.zeros(1, dtype=np.int64))
        self.total = 0

    def append(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        self.ids.write(flat)
        self.offsets.write(self.total + np.cumsum(lengths, dtype=np.int64))
        self.total += int(lengths.sum())

    def __enter__(self) -> IdWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.ids.close()
        self.offsets.close()


class TokenArray:
    """Variable-length id sequences read from disk without loading them (np.load mmap)."""

    def __init__(self, path_stem: Path) -> None:
        try:
            self.flat = np.load(f"{path_stem}.npy", mmap_mode="r")
            self.offsets = np.load(f"{path_stem}.idx.npy")
        except (OSError, ValueError) as e:
            raise DataError(
                f"{path_stem}: cannot read prepared token ids ({e}); run `wtnmt prepare` again"
            ) from None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.flat[self.offsets[i] : self.offsets[i + 1]]


@dataclass(frozen=True)
class _Tokens:
    """The ids of some sequences, each with its row (which sequence) and column (position)."""

    ids: np.ndarray
    row: np.ndarray
    col: np.ndarray


def _gather(array: TokenArray, rows: np.ndarray) -> tuple[_Tokens, np.ndarray]:
    """Every id of the sequences ``rows`` of ``array`` in one gather, and their lengths."""
    starts, ends = array.offsets[rows], array.offsets[rows + 1]
    lengths = ends - starts
    row = np.repeat(np.arange(len(rows)), lengths)
    first = np.cumsum(lengths) - lengths  # where each sequence begins among the gathered
    col = np.arange(int(lengths.sum())) - first[row]
    return _Tokens(np.asarray(array.flat[starts[row] + col]), row, col), lengths


@dataclass(frozen=True)
class Batch:
    src: Tensor  # [B, S] ids + EOS, right-padded
    tgt_in: Tensor  # [B, T] BOS + ids
    tgt_out: Tensor  # [B, T] ids + EOS
    indices: np.ndarray  # [B] example indices in the split

    @property
    def target_tokens(self) -> int:
        return int((self.tgt_out != PAD).sum())


class ParallelData:
    """One prepared split: source and target ids, lengths as the model sees them."""

    def __init__(self, directory: str | Path, split: str) -> None:
        directory = Path(directory)
        self.src = TokenArray(directory / f"{split}.src")
        self.tgt = TokenArray(directory / f"{split}.tgt")
        if len(self.src) != len(self.tgt):
            raise DataError(
                f"{directory}: {split} has {len(self.src)} source and "
                f"{len(self.tgt)} target sentences; run `wtnmt prepare` again"
            )

    def __len__(self) -> int:
        return len(self.src)

    @property
    def src_lengths(self) -> np.ndarray:
        return self.src.lengths + 1  # + EOS

    @property
    def tgt_lengths(self) -> np.ndarray:
        return self.tgt.lengths + 1  # + BOS (input) or EOS (output)

    def collate(self, indices: np.ndarray) -> Batch:
        """The pairs at ``indices`` as one right-padded batch: source ids + EOS, BOS + target
        ids, target ids + EOS. Built with whole-array gathers and scatters, not a loop over
        the rows: a batch is made on the host at every update, and on a GPU a small model's
        update is paced by the host (`benchmarks/collate_speed.py`)."""
        import torch

        rows = np.asarray(indices, dtype=np.int64)
        src, src_len = _gather(self.src, rows)
        tgt, tgt_len = _gather(self.tgt, rows)
        n = len(rows)
        each = np.arange(n)
        src_ids = np.full((n, int(src_len.max(initial=0)) + 1), PAD, dtype=np.int64)
        tgt_in = np.full((n, int(tgt_len.max(initial=0)) + 1), PAD, dtype=np.int64)
        tgt_out = np.full_like(tgt_in, PAD)
        src_ids[src.row, src.col] = src.ids
        src_ids[each, src_len] = EOS
        tgt_in[:, 0] = BOS
        tgt_in[tgt.row, tgt.col + 1] = tgt.ids
        tgt_out[tgt.row, tgt.col] = tgt.ids
        tgt_out[each, tgt_len] = EOS
        return Batch(
            torch.from_numpy(src_ids),
            torch.from_numpy(tgt_in),
            torch.from_numpy(tgt_out),
            rows,
        )
