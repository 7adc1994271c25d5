"""``train.precision: auto`` on a CPU that computes bf16 natively: which precision trains this
run faster, measured on the run's own first batches rather than assumed. Native bf16 is not
always the faster: on an Intel Sapphire Rapids CPU the demo's small model made 425 updates in
2 minutes in float32 and 240 in bf16, where `weighted-small` was faster in bf16.

The measurement is a forward and backward pass of each batch in each precision (the optimizer
step costs the same in both), once to warm up and then timed; the model's weights, gradients
and the random stream are left as they were.

The choice is made once for a CPU, PyTorch build, thread count, model and batch size, and kept
(``precision.json`` in ``$WTNMT_CACHE_DIR``, else ``~/.cache/wtnmt``, or
``$XDG_CACHE_HOME/wtnmt``): the same config on the
same machine then trains in the same precision every time, without measuring again (a
measurement at a busy moment chose float32 once and bf16 later). bf16 is chosen only where it
is clearly the faster (``MARGIN``), so that noise in a near tie cannot decide. The precision
chosen names itself in the run's log (``precision_label``) and sets the autocast each update
runs under (``autocast_for``)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from wtnmt.special import PAD

LABELS = {"fp32": "float32", "bf16": "bf16 autocast"}
MARGIN = 0.9  # bf16 is chosen where its pass takes at most this fraction of float32's
CACHE_NAME = "precision.json"


def time_precisions(
    model: torch.nn.Module,
    batches: list[Any],
    device: torch.device,
    *,
    precisions: tuple[str, ...] = ("fp32", "bf16"),
    repeats: int = 2,
) -> dict[str, float]:
    """Seconds of a forward and backward pass over ``batches`` (data.Batch) in each of
    ``precisions``, the mean of ``repeats`` timed passes after one untimed."""
    rng = torch.get_rng_state()
    training = model.training
    model.train()
    seconds: dict[str, float] = {}
    try:
        for precision in precisions:
            for timed in range(repeats + 1):
                start = time.perf_counter()
                for batch in batches:
                    autocast = (
                        nullcontext()
                        if precision == "fp32"
                        else torch.autocast(device.type, dtype=torch.bfloat16)
                    )
                    with autocast:
                        logits = model(batch.src.to(device), batch.tgt_in.to(device)).logits
                    loss = F.cross_entropy(
                        logits.float().reshape(-1, logits.size(-1)),
                        batch.tgt_out.to(device).reshape(-1),
                        ignore_index=PAD,
                    )
                    loss.backward()
                if timed:
                    seconds[precision] = seconds.get(precision, 0.0) + time.perf_counter() - start
                model.zero_grad(set_to_none=True)
    finally:
        model.zero_grad(set_to_none=True)
        model.train(training)
        torch.set_rng_state(rng)
    return {p: s / repeats for p, s in seconds.items()}


def precision_label(precision: str, configured: str) -> str:
    """How a run's log names the precision it trains in (``configured``: train.precision)."""
    label = {"fp32": "float32", "bf16": "bf16 autocast", "fp16": "fp16 autocast"}[precision]
    return f"{label} (train.precision=auto)" if configured == "auto" else label


def autocast_for(precision: str, device: torch.device):  # type: ignore[no-untyped-def]
    """The autocast context an update runs under: none in float32."""
    if precision == "fp32":
        return nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def faster(seconds: dict[str, float]) -> tuple[str, str]:
    """The precision ``seconds`` choose (bf16 only where clearly the faster, ``MARGIN``), and
    a line that says what was measured."""
    bf16, fp32 = seconds.get("bf16"), seconds.get("fp32")
    chosen = "bf16" if bf16 is not None and (fp32 is None or bf16 <= MARGIN * fp32) else "fp32"
    measured = ", ".join(f"{LABELS[p]} {s:.2f} s" for p, s in seconds.items())
    return chosen, (
        f"train.precision=auto: a forward and backward pass of this run's first batches took "
        f"{measured}: training in {LABELS[chosen]}"
    )


def choice_key(parts: dict[str, Any]) -> str:
    """The key a choice is kept under: a digest of what decides it (the CPU, the PyTorch
    build, the threads, the model's config, the batch size)."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _cache_file() -> Path:
    from wtnmt.data.corpora import cache_root

    own = os.environ.get("WTNMT_CACHE_DIR")
    return (Path(own) if own else cache_root()) / CACHE_NAME


def remembered(key: str) -> dict[str, Any] | None:
    """The choice kept under ``key``, None where there is none (or the file is unreadable)."""
    try:
        kept = json.loads(_cache_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    entry = kept.get(key) if isinstance(kept, dict) else None
    ok = isinstance(entry, dict) and entry.get("precision") in LABELS
    return entry if ok else None


def remember(key: str, entry: dict[str, Any]) -> str | None:
    """Keep ``entry`` under ``key``; the file written, or None where it cannot be (a read-only
    home): the choice then holds for this run only."""
    from wtnmt.rundir.files import atomic_write

    path = _cache_file()
    try:
        kept = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        kept = kept if isinstance(kept, dict) else {}
    except (OSError, ValueError):
        kept = {}
    kept[key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, (json.dumps(kept, indent=1, sort_keys=True) + "\n").encode())
    except OSError:
        return None
    return str(path)


def choose_precision(
    parts: dict[str, Any],
    measure: Any,  # measure: () -> {precision: seconds}
) -> tuple[str, str]:
    """The precision for a run whose deciding ``parts`` are these: the one kept for them, else
    ``measure()``'s choice, then kept. Returns it and the line that says how it was chosen."""
    key = choice_key(parts)
    entry = remembered(key)
    if entry is not None:
        return entry["precision"], (
            f"train.precision=auto: training in {LABELS[entry['precision']]}, as measured on "
            f"this CPU, PyTorch, thread count, model and batch size on {entry.get('date', '?')} "
            f"({_cache_file()}; delete it to measure again)"
        )
    seconds = measure()
    chosen, said = faster(seconds)
    entry = {
        "precision": chosen,
        "seconds": {p: round(s, 3) for p, s in seconds.items()},
        "date": time.strftime("%Y-%m-%d"),
    }
    where = remember(key, entry)
    kept = f"; kept in {where} for the next run" if where else "; not kept (cache unwritable)"
    return chosen, said + kept


__all__ = [
    "autocast_for",
    "choice_key",
    "choose_precision",
    "faster",
    "precision_label",
    "remember",
    "remembered",
    "time_precisions",
]
