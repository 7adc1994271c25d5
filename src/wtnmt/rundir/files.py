"""Files of a run directory, written so that nothing is ever half-written or silently wrong.

Every file is written to a temporary file in the same directory, fsynced, then moved into
place with ``os.replace``. Weights carry a sha256 of their tensors in the safetensors header
(so the checksum lands with them, atomically), and loading recomputes and compares it: a
damaged tensor payload is reported instead of loaded.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from wtnmt.errors import CheckpointError
from wtnmt.safe_files import atomic_write

CHECKSUM_KEY = "wtnmt_tensors_sha256"
# the vocabularies the weights were trained with (``vocabularies_sha256`` of the run: source
# then target), so that a run's SentencePiece models swapped or replaced are found at load
VOCABULARY_KEY = "wtnmt_vocabulary_sha256"


def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def weights_metadata(
    tensors: dict[str, torch.Tensor], vocabulary: str | None = None
) -> dict[str, str]:
    """The header a weights file of ``tensors`` carries: their checksum, and the hash of the
    vocabularies they were trained with where it is known."""
    metadata = {CHECKSUM_KEY: tensors_sha256(tensors)}
    if vocabulary is not None:
        metadata[VOCABULARY_KEY] = vocabulary
    return metadata


def weights_bytes(model: nn.Module, *, vocabulary: str | None = None) -> bytes:
    """The model's tensors as safetensors bytes with their checksum (and the hash of their
    vocabularies, ``vocabulary``) in the header."""
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "w.safetensors")
        save_file(tensors, path, metadata=weights_metadata(tensors, vocabulary))
        return Path(path).read_bytes()


def save_weights(model: nn.Module, path: Path, *, vocabulary: str | None = None) -> str:
    """Write the weights atomically; returns the sha256 of the file."""
    data = weights_bytes(model, vocabulary=vocabulary)
    atomic_write(path, data)
    return hashlib.sha256(data).hexdigest()


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, checked against the checksum its header records
    (files written before checksums were recorded load unchecked). Never unpickles."""
    try:
        with safe_open(str(path), framework="pt") as f:
            recorded = (f.metadata() or {}).get(CHECKSUM_KEY)
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None
    if recorded is not None and tensors_sha256(tensors) != recorded:
        raise CheckpointError(
            f"{path}: the weights are damaged (their sha256 differs from the one recorded when "
            f"they were written)"
        )
    return tensors


def recorded_vocabulary(path: Path) -> str | None:
    """The hash of the vocabularies ``path``'s weights were trained with, where recorded."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return (f.metadata() or {}).get(VOCABULARY_KEY)
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None


def load_weights(model: nn.Module, path: Path) -> None:
    """Load checked weights into ``model``; a file of another shape is named, not a traceback."""
    tensors = read_weights(path)
    own = model.state_dict()
    missing = [k for k in own if k not in tensors]
    unexpected = [k for k in tensors if k not in own]
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not fit this model (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}): was it trained with another config?"
        )
    for name, tensor in tensors.items():
        if tensor.shape != own[name].shape:
            raise CheckpointError(
                f"{path}: {name} has shape {list(tensor.shape)} there but "
                f"{list(own[name].shape)} in the model its config describes: the config and "
                f"the weights are from different models"
            )
    model.load_state_dict(tensors)


__all__ = [
    "VOCABULARY_KEY",
    "atomic_write",
    "load_weights",
    "read_weights",
    "recorded_vocabulary",
    "save_weights",
    "tensors_sha256",
    "weights_bytes",
    "weights_metadata",
]
